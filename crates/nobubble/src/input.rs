//! Reading the text files a user names (schedules, cost files, tokenizers), bounded: a path
//! such as `/dev/zero` or a mistyped multi-gigabyte file must give an error, not fill memory.

use std::io::Read;
use std::path::Path;

/// The largest schedule file `check` and `--schedule` read: a plan at the planner's own cap
/// of 20 M passes is a few hundred megabytes of CSV.
pub const SCHEDULE_BYTES: u64 = 1 << 30;
/// The largest `--costs` / `--layer-costs` file: thousands of entries are a few megabytes.
pub const COSTS_BYTES: u64 = 64 << 20;
/// The largest `tokenizer.json`: real ones are a few to a few tens of megabytes.
pub const TOKENIZER_BYTES: u64 = 512 << 20;
/// The most read from something that is not a regular file (a pipe, `-`, a device), whose
/// size is not known before reading: a schedule or a tokenizer that large is a file.
pub const STREAM_BYTES: u64 = 64 << 20;

/// The text of `path` (`-`: standard input), at most `limit` bytes; `what` names it in
/// errors ("--costs").
pub fn read_text(path: &Path, what: &str, limit: u64) -> Result<String, String> {
    let fail = |e: std::io::Error| format!("cannot read {what} {}: {e}", path.display());
    let too_large = |limit: u64| {
        format!(
            "{what} {} is larger than {} MiB, more than any such file needs; check the path",
            path.display(),
            limit >> 20
        )
    };
    // A regular file's size is known: refuse it before reading. Anything else is read up to
    // a smaller bound (`/dev/zero` never ends).
    let (source, limit): (Box<dyn Read>, u64) = if path == Path::new("-") {
        (Box::new(std::io::stdin()), limit.min(STREAM_BYTES))
    } else {
        let file = std::fs::File::open(path).map_err(fail)?;
        match file.metadata() {
            Ok(m) if m.is_file() && m.len() > limit => return Err(too_large(limit)),
            Ok(m) if m.is_file() => (Box::new(file), limit),
            _ => (Box::new(file), limit.min(STREAM_BYTES)),
        }
    };
    let mut bytes = Vec::new();
    (source.take(limit + 1).read_to_end(&mut bytes)).map_err(fail)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(limit));
    }
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "cannot read {what} {}: not UTF-8 text (byte {} is invalid)",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endless_or_binary_file_is_an_error() {
        let e = read_text(Path::new("/dev/zero"), "--costs", 1 << 20).unwrap_err();
        assert!(
            e.contains("larger than 1 MiB") && e.contains("/dev/zero"),
            "{e}"
        );
        let dir = std::env::temp_dir().join(format!("nobubble-input-{}", std::process::id()));
        std::fs::write(&dir, [b'a', 0xff, b'b']).unwrap();
        let e = read_text(&dir, "check", 1 << 20).unwrap_err();
        assert!(e.contains("not UTF-8") && e.contains("byte 1"), "{e}");
        std::fs::write(&dir, "stages").unwrap();
        assert_eq!(read_text(&dir, "check", 6).unwrap(), "stages");
        assert!(read_text(&dir, "check", 5).is_err());
        let _ = std::fs::remove_file(&dir);
    }
}
