//! Training text as people have it: one text file, a directory of them, or JSON lines with a
//! `text` field (what dataset tools export) — read as a stream of documents, one at a time,
//! and packed into a token file: each document's ids, then an end-of-text id, so windows may
//! cross documents as in GPT-style pre-training but always see where one ended.

use std::borrow::Cow;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use super::Corpus;
use crate::error::{NnError, Result};

/// How a `--data` path is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One document: the whole file.
    Text,
    /// JSON lines (`.jsonl`, `.ndjson`): one document per line, its `text` field.
    JsonLines,
    /// Every file below the directory, in path order (hidden ones and `.json` metadata files
    /// skipped), each read by its own extension.
    Directory,
}

impl Format {
    /// The format of `path`: a directory, JSON lines by extension, otherwise text.
    pub fn of(path: &Path) -> Self {
        if path.is_dir() {
            return Format::Directory;
        }
        match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl" | "ndjson") => Format::JsonLines,
            _ => Format::Text,
        }
    }

    /// Name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::JsonLines => "JSON lines",
            Format::Directory => "directory",
        }
    }
}

/// One document, or a piece of one (a long text file is read a piece at a time), and where it
/// came from (`FILE` or `FILE:LINE`, for messages).
#[derive(Debug)]
pub struct Document<'a> {
    /// Where it came from.
    pub origin: String,
    /// Its contents (UTF-8 for JSON lines; any bytes for text files).
    pub text: Cow<'a, [u8]>,
    /// Whether this is the document's last piece (the end-of-text id follows it).
    pub ends: bool,
}

/// A text file is read in pieces of about this many bytes, each ending at a line break.
pub const PIECE_BYTES: usize = 1 << 20;

impl Document<'_> {
    /// The text as UTF-8, or an error naming the document and the first bad byte.
    pub fn utf8(&self) -> Result<&str> {
        std::str::from_utf8(&self.text).map_err(|e| {
            NnError::BadInput(format!(
                "{}: not UTF-8 text (bad byte at offset {}); a tokenizer reads text",
                self.origin,
                e.valid_up_to()
            ))
        })
    }
}

fn read_error(path: &Path, e: std::io::Error) -> NnError {
    NnError::BadInput(format!("cannot read {}: {e}", path.display()))
}

/// Every regular file below `dir`, sorted by path, hidden files and directories skipped.
/// Pipes, sockets and devices are skipped too: reading a pipe nobody writes to would wait
/// forever (a named pipe given as `--data` itself is read: that is a stream on purpose).
fn files_below(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).map_err(|e| read_error(&d, e))? {
            let path = entry.map_err(|e| read_error(&d, e))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            // Hidden files, and the `.json` metadata dataset tools write beside their data.
            if name.starts_with('.') || (path.is_file() && name.ends_with(".json")) {
                continue;
            }
            // A link that leads nowhere stays in, for reading to say so.
            let special = std::fs::metadata(&path).is_ok_and(|m| !m.is_file() && !m.is_dir());
            if path.is_dir() {
                stack.push(path);
            } else if !special {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Calls `each` on every document of `path` in a fixed order, reading one at a time (a JSON
/// line at a time, a file at a time). Returns the number of documents. A malformed JSON line
/// is an error naming its file and line, before anything of it reaches `each`.
pub fn for_each_document(
    path: &Path,
    each: &mut dyn FnMut(&Document<'_>) -> Result<()>,
) -> Result<usize> {
    match Format::of(path) {
        Format::Text if path.extension().is_some_and(|e| e == "json") => {
            Err(NnError::BadInput(format!(
                "{}: a .json file is not read as data; give JSON lines (.jsonl, one object \
                 with a \"text\" field per line) or text",
                path.display()
            )))
        }
        Format::Text => text_pieces(path, each),
        Format::JsonLines => json_lines(path, each),
        Format::Directory => {
            let files = files_below(path)?;
            if files.is_empty() {
                return Err(NnError::BadInput(format!(
                    "{} is a directory that holds no files; give a text file, a JSON-lines file or a directory of them",
                    path.display()
                )));
            }
            let mut docs = 0;
            for f in files {
                docs += for_each_document(&f, each)?;
            }
            Ok(docs)
        }
    }
}

/// A text file as one document, in pieces of about [`PIECE_BYTES`] ending at line breaks, so
/// a file larger than memory is never read whole.
fn text_pieces(path: &Path, each: &mut dyn FnMut(&Document<'_>) -> Result<()>) -> Result<usize> {
    let file = std::fs::File::open(path).map_err(|e| read_error(path, e))?;
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let origin = path.display().to_string();
    let mut piece = Vec::with_capacity(PIECE_BYTES + 1024);
    loop {
        let n = reader
            .read_until(b'\n', &mut piece)
            .map_err(|e| read_error(path, e))?;
        let end = n == 0;
        if piece.len() >= PIECE_BYTES || end {
            let text = Cow::Owned(std::mem::take(&mut piece));
            each(&Document {
                origin: origin.clone(),
                text,
                ends: end,
            })?;
            if end {
                return Ok(1);
            }
        }
    }
}

fn json_lines(path: &Path, each: &mut dyn FnMut(&Document<'_>) -> Result<()>) -> Result<usize> {
    let file = std::fs::File::open(path).map_err(|e| read_error(path, e))?;
    let mut docs = 0;
    for (n, line) in BufReader::new(file).lines().enumerate() {
        let origin = format!("{}:{}", path.display(), n + 1);
        let line = line.map_err(|e| NnError::BadInput(format!("{origin}: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| NnError::BadInput(format!("{origin}: not valid JSON ({e})")))?;
        let text = value.get("text").and_then(|t| t.as_str()).ok_or_else(|| {
            NnError::BadInput(format!(
                "{origin}: a JSON line needs a \"text\" field holding a string"
            ))
        })?;
        each(&Document {
            origin,
            text: Cow::Borrowed(text.as_bytes()),
            ends: true,
        })?;
        docs += 1;
    }
    if docs == 0 {
        return Err(NnError::BadInput(format!(
            "{}: no JSON lines with text",
            path.display()
        )));
    }
    Ok(docs)
}

/// What [`pack`] made: the corpus and how many documents went into it.
#[derive(Debug)]
pub struct Packed {
    /// Every document's ids followed by the end-of-text id, in document order.
    pub corpus: Corpus,
    /// Documents read.
    pub documents: usize,
}

/// Streams the documents of `path` through `encode` into a token file (an unnamed temporary
/// file, mapped into memory: the ids never need to fit in memory at once), each followed by
/// `eot`. Ids must be below `vocab`.
pub fn pack(
    path: &Path,
    encode: &mut dyn FnMut(&Document<'_>) -> Result<Vec<u32>>,
    eot: u32,
    vocab: usize,
) -> Result<Packed> {
    let file = temporary_token_file()?;
    let mut out = std::io::BufWriter::new(file);
    let write_failed =
        |e: std::io::Error| NnError::BadInput(format!("cannot write the token file: {e}"));
    let documents = for_each_document(path, &mut |doc| {
        let end = doc.ends.then_some(eot);
        for id in encode(doc)?.into_iter().chain(end) {
            out.write_all(&id.to_le_bytes()).map_err(write_failed)?;
        }
        Ok(())
    })?;
    let file = out.into_inner().map_err(|e| write_failed(e.into_error()))?;
    Ok(Packed {
        corpus: Corpus::from_token_file(&file, vocab)?,
        documents,
    })
}

/// A new file in the temporary directory (`$TMPDIR`, else `/tmp`), open for reading and
/// writing and already unlinked: it has no name a stopped run could leave behind, and its space
/// is freed when the job's map of it goes.
fn temporary_token_file() -> Result<std::fs::File> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "nobubble-tokens-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let path = std::env::temp_dir().join(name);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| NnError::BadInput(format!("cannot create {}: {e}", path.display())))?;
    std::fs::remove_file(&path)
        .map_err(|e| NnError::BadInput(format!("cannot unlink {}: {e}", path.display())))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("nobubble-sources-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn bytes_of(doc: &Document<'_>) -> Result<Vec<u32>> {
        Ok(doc.text.iter().map(|&b| b as u32).collect())
    }

    #[test]
    fn each_format_packs_its_documents_in_order_with_end_of_text() {
        let d = dir("formats");
        std::fs::write(d.join("b.txt"), "bb").unwrap();
        std::fs::write(
            d.join("a.jsonl"),
            "{\"text\": \"a1\"}\n\n{\"text\": \"a2\", \"id\": 7}\n",
        )
        .unwrap();
        std::fs::create_dir(d.join("c")).unwrap();
        std::fs::write(d.join("c").join("x.txt"), "c").unwrap();
        std::fs::write(d.join(".hidden"), "never").unwrap();
        std::fs::write(d.join("dataset_info.json"), "{\"meta\": 1}").unwrap();
        let packed = pack(&d, &mut bytes_of, 256, 257).unwrap();
        assert_eq!(packed.documents, 4);
        let ids = packed.corpus.ids(0..packed.corpus.len());
        let want: Vec<u32> = "a1|a2|bb|c|"
            .bytes()
            .map(|b| if b == b'|' { 256 } else { b as u32 })
            .collect();
        assert_eq!(ids, want);
        assert_eq!(packed.corpus.vocab(), 257);
        assert_eq!(Format::of(&d.join("a.jsonl")), Format::JsonLines);
        assert_eq!(Format::of(&d.join("b.txt")), Format::Text);
        let err = pack(&d.join("dataset_info.json"), &mut bytes_of, 256, 257).unwrap_err();
        assert!(err.to_string().contains(".jsonl"), "{err}");
    }

    #[test]
    fn a_directory_s_pipes_are_skipped_not_waited_on() {
        let d = dir("pipes");
        std::fs::write(d.join("a.txt"), "a").unwrap();
        // A named pipe nobody writes to, as Open MPI leaves in /tmp: reading it never ends.
        let made = std::process::Command::new("mkfifo")
            .arg(d.join("fifo"))
            .status()
            .unwrap();
        assert!(made.success());
        let (tx, rx) = std::sync::mpsc::channel();
        let path = d.clone();
        std::thread::spawn(move || {
            let packed = pack(&path, &mut bytes_of, 256, 257).map(|p| p.documents);
            let _ = tx.send(packed);
        });
        let packed = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("reading the directory waited on its pipe");
        assert_eq!(packed.unwrap(), 1);
    }

    #[test]
    fn a_long_text_file_is_read_in_pieces_at_line_breaks_ending_once() {
        let d = dir("pieces");
        let f = d.join("long.txt");
        let line = "x".repeat(999) + "\n";
        let text = line.repeat(3 * PIECE_BYTES / 1000 + 7);
        std::fs::write(&f, &text).unwrap();
        let mut pieces = Vec::new();
        for_each_document(&f, &mut |doc| {
            pieces.push((doc.text.len(), doc.ends, doc.text.last().copied()));
            Ok(())
        })
        .unwrap();
        assert!(pieces.len() >= 3, "{}", pieces.len());
        assert!(pieces[..pieces.len() - 1]
            .iter()
            .all(|&(n, e, last)| n >= PIECE_BYTES && !e && last == Some(b'\n')));
        assert!(pieces.last().unwrap().1);
        assert_eq!(pieces.iter().map(|p| p.0).sum::<usize>(), text.len());
        let packed = pack(&f, &mut bytes_of, 256, 257).unwrap();
        assert_eq!(
            packed.corpus.len(),
            text.len() + 1,
            "one end-of-text for the one document"
        );
    }

    #[test]
    fn a_malformed_json_line_is_named_and_nothing_is_packed() {
        let d = dir("malformed");
        let f = d.join("data.jsonl");
        std::fs::write(&f, "{\"text\": \"fine\"}\n{\"text\": \"cut off\n").unwrap();
        let mut seen = Vec::new();
        let err = for_each_document(&f, &mut |doc| {
            seen.push(doc.origin.clone());
            Ok(())
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("data.jsonl:2") && err.contains("not valid JSON"),
            "{err}"
        );
        assert_eq!(seen.len(), 1, "only the good line before it was read");
        std::fs::write(&f, "{\"text\": 5}\n").unwrap();
        let err = pack(&f, &mut bytes_of, 256, 257).unwrap_err().to_string();
        assert!(
            err.contains("data.jsonl:1") && err.contains("\"text\""),
            "{err}"
        );
        std::fs::write(&f, "\n\n").unwrap();
        assert!(pack(&f, &mut bytes_of, 256, 257).is_err());
        let empty = dir("empty");
        let err = pack(&empty, &mut bytes_of, 256, 257)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no files"), "{err}");
    }

    #[test]
    fn ids_outside_the_vocabulary_are_refused() {
        let d = dir("vocab");
        let f = d.join("t.txt");
        std::fs::write(&f, "abc").unwrap();
        let err = pack(&f, &mut bytes_of, 300, 257).unwrap_err().to_string();
        assert!(err.contains("outside the vocabulary"), "{err}");
        let doc = Document {
            origin: "x.txt".into(),
            text: Cow::Borrowed(&[0x61, 0xff]),
            ends: true,
        };
        assert!(doc.utf8().unwrap_err().to_string().contains("x.txt"));
    }
}
