//! Writing what the user asked for without losing what they have.
//!
//! `-o FILE` and `--trace FILE` may name anything: a new file, a file to replace, a device
//! (`/dev/null`, `/dev/stdout`), a FIFO, a symlink, `-` for standard output. Regular files are
//! replaced atomically — written to a temporary file of our own, with a name no one else
//! uses, in the same directory, then renamed over the target — and that temporary file is
//! removed on every failure path. Anything that is not a regular file is written *through*
//! (opened and written, never replaced), and a symlink is followed to its target, never
//! replaced itself.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Whether a line could not be written to standard output (`[0]`) or error (`[1]`): a
/// `| head` or `| tee` that ended. Later lines to that stream are dropped.
static CLOSED: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];

/// Writes one line to standard output (`to_stderr` false) or error, for long jobs: a closed
/// stream must not end a run that has training to save. The first failure asks the run to
/// stop cleanly after its step, as Ctrl-C does (`train` then saves and says so), instead of
/// the crash or the silent death a print into a closed pipe would be.
pub fn line(to_stderr: bool, args: std::fmt::Arguments) {
    let closed = &CLOSED[usize::from(to_stderr)];
    if closed.load(Ordering::Relaxed) {
        return;
    }
    let written = if to_stderr {
        writeln!(std::io::stderr().lock(), "{args}")
    } else {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{args}").and_then(|()| out.flush())
    };
    if let Err(e) = written {
        if !closed.swap(true, Ordering::Relaxed) {
            let name = if to_stderr {
                "standard error"
            } else {
                "standard output"
            };
            stop_for_output(name, &e);
        }
    }
}

/// The first output a long job could not write, and why ("standard output: Broken pipe").
static FAILURE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Notes that `what` could not be written (`e`) and asks the run to stop cleanly after its
/// step, as Ctrl-C does: a closed pipe or a full disk must not cost the training.
pub fn stop_for_output(what: &str, e: &std::io::Error) {
    let _ = FAILURE.set(format!("{what}: {e}"));
    crate::signals::request_stop(crate::signals::OUTPUT_CLOSED);
}

/// What [`stop_for_output`] noted first, if anything.
pub fn failure() -> Option<&'static str> {
    FAILURE.get().map(String::as_str)
}

/// Whether some line of [`line`] could not be written to standard output, and to error.
pub fn closed() -> (bool, bool) {
    (
        CLOSED[0].load(Ordering::Relaxed),
        CLOSED[1].load(Ordering::Relaxed),
    )
}

/// `println!` for long jobs: see [`line`].
macro_rules! say {
    () => { $crate::output::line(false, format_args!("")) };
    ($($arg:tt)*) => { $crate::output::line(false, format_args!($($arg)*)) };
}

/// `eprintln!` for long jobs: see [`line`].
macro_rules! tell {
    () => { $crate::output::line(true, format_args!("")) };
    ($($arg:tt)*) => { $crate::output::line(true, format_args!($($arg)*)) };
}
pub(crate) use {say, tell};

/// Writes `content` to standard output, turning a failure into a message.
pub fn stdout(content: &[u8]) -> Result<(), String> {
    write_all(&mut std::io::stdout().lock(), content)
        .map_err(|e| format!("cannot write to stdout: {e}"))
}

fn write_all(w: &mut dyn Write, content: &[u8]) -> std::io::Result<()> {
    w.write_all(content)?;
    w.flush()
}

/// Writes `content` to `path` (see the module documentation); `-` is standard output.
pub fn write(path: &Path, content: &[u8]) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    let text = path.to_string_lossy();
    if text == "-" || text == "/dev/stdout" {
        return stdout(content);
    }
    if text == "/dev/stderr" {
        return write_all(&mut std::io::stderr().lock(), content).map_err(fail);
    }
    // A path naming an open descriptor: write through it, after what is there (following it to
    // the file behind, and replacing that, would lose what the shell appended so far).
    if text.starts_with("/dev/fd/") || (text.starts_with("/proc/") && text.contains("/fd/")) {
        let mut f = OpenOptions::new().append(true).open(path).map_err(fail)?;
        return write_all(&mut f, content).map_err(fail);
    }
    // Follow symlinks to what they name: the link stays, its target gets the content.
    let target = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(path).map_err(|e| {
            format!(
                "cannot write {}: it is a symlink whose target cannot be resolved ({e}); \
                 give the target's path",
                path.display()
            )
        })?,
        _ => path.to_path_buf(),
    };
    match std::fs::metadata(&target) {
        Ok(m) if m.is_dir() => Err(format!(
            "cannot write {}: it is a directory; give a file name",
            path.display()
        )),
        Ok(m) if !m.is_file() => {
            // A device, FIFO or socket: write through it.
            let mut f = OpenOptions::new().write(true).open(&target).map_err(fail)?;
            write_all(&mut f, content).map_err(fail)
        }
        _ => {
            check_folder(&target)?;
            replace_atomically(&target, content).map_err(fail)
        }
    }
}

/// Refuses a path whose folder does not exist. A missing folder is an error rather than
/// made: a typo would otherwise write the output somewhere the user does not look.
pub fn check_folder(path: &Path) -> Result<(), String> {
    match path
        .parent()
        .filter(|p| !p.as_os_str().is_empty() && !p.is_dir())
    {
        Some(parent) if parent.exists() => Err(format!(
            "cannot write {}: {} is a file, not a folder",
            path.display(),
            parent.display()
        )),
        Some(parent) => Err(format!(
            "cannot write {}: the folder {} does not exist; create it first",
            path.display(),
            parent.display()
        )),
        None => Ok(()),
    }
}

/// Whether [`write`] could write `path` now: a file is created beside it (where [`write`]
/// would put its temporary) and removed. For outputs written at the end of long work, so
/// that a path that cannot be written fails before the work, not after it.
pub fn check_writable(path: &Path) -> Result<(), String> {
    if written_through(path) {
        return Ok(());
    }
    let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    if std::fs::metadata(&target).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
        return Ok(()); // a device or FIFO, written through
    }
    let probe = temporary(&target);
    match OpenOptions::new().write(true).create_new(true).open(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(format!("cannot write {}: {e}", path.display())),
    }
}

/// Whether `path` is written through rather than replaced: stdout, stderr, an open
/// descriptor.
pub(crate) fn written_through(path: &Path) -> bool {
    let text = path.to_string_lossy();
    ["-", "/dev/stdout", "/dev/stderr"].contains(&text.as_ref())
        || text.starts_with("/dev/fd/")
        || (text.starts_with("/proc/") && text.contains("/fd/"))
}

/// Where output for `path` that is written piece by piece waits until [`place`] puts it
/// there: beside the file it replaces (so the rename is atomic), or in the temporary folder
/// for a path written through.
pub fn staging_for(path: &Path) -> PathBuf {
    if written_through(path) {
        return temporary(&std::env::temp_dir().join("nobubble-output"));
    }
    let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    temporary(&target)
}

/// Puts the finished `staged` file (from [`staging_for`]) at `path`: renamed over a file,
/// or copied through stdout or a descriptor. `staged` is left for the caller to remove.
pub fn place(staged: &Path, path: &Path) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    if written_through(path) {
        let content = std::fs::read(staged).map_err(fail)?;
        return write(path, &content);
    }
    let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    std::fs::rename(staged, &target).map_err(fail)
}

/// A temporary file name beside `path` that this process has not used yet.
fn temporary(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "output".into());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.nobubble-{}-{n}.tmp", std::process::id()))
}

fn replace_atomically(path: &Path, content: &[u8]) -> std::io::Result<()> {
    // `create_new` never opens an existing file, so whatever we remove below is ours.
    let mut attempts = 0;
    let (tmp, mut file) = loop {
        let tmp = temporary(path);
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempts < 100 => {
                attempts += 1;
            }
            Err(e) => return Err(e),
        }
    };
    // The replacement keeps the replaced file's permissions (a private file stays private).
    let keep_mode = std::fs::metadata(path)
        .map(|m| m.permissions())
        .ok()
        .map_or(Ok(()), |p| file.set_permissions(p));
    let written = keep_mode
        .and_then(|_| write_all_synced(&mut file, content))
        .and_then(|_| {
            drop(file);
            std::fs::rename(&tmp, path)
        });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn write_all_synced(f: &mut File, content: &[u8]) -> std::io::Result<()> {
    f.write_all(content)?;
    f.sync_all()
}

/// Makes a failed `print!`/`println!` (a full disk, a closed terminal) end the program with a
/// message and exit status 1, instead of a panic: every command's output goes through them.
pub fn install_stdout_failure_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if let Some(cause) = msg.strip_prefix("failed printing to stdout: ") {
            let _ = writeln!(std::io::stderr(), "error: cannot write to stdout: {cause}");
            std::process::exit(1);
        }
        default(info);
    }));
}

/// `--width`: a text timeline's columns. Fewer than 10 cannot show a block's label; more
/// than 100000 would build lines of gigabytes (each rank's line is held in memory).
pub fn timeline_width(s: &str) -> Result<usize, String> {
    let w: usize = (s.trim().parse())
        .map_err(|_| format!("'{s}' is not a whole number of columns (e.g. --width 120)"))?;
    if !(10..=100_000).contains(&w) {
        return Err(format!(
            "{w} columns is outside 10 to 100000 (the default is 100; a terminal's width fits)"
        ));
    }
    Ok(w)
}
