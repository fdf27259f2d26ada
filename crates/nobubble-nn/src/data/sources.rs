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
    /// JSON lines (`.jsonl`, `.ndjson`, `.json`): one document per line, its `text` field.
    JsonLines,
    /// Every file below the directory, in path order (hidden ones skipped), each read by its
    /// own extension.
    Directory,
}

impl Format {
    /// The format of `path`: a directory, JSON lines by extension, otherwise text.
    pub fn of(path: &Path) -> Self {
        if path.is_dir() {
            return Format::Directory;
        }
        match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl" | "ndjson" | "json") => Format::JsonLines,
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

/// One document and where it came from (`FILE` or `FILE:LINE`, for messages).
#[derive(Debug)]
pub struct Document<'a> {
    /// Where it came from.
    pub origin: String,
    /// Its contents (UTF-8 for JSON lines; any bytes for text files).
    pub text: Cow<'a, [u8]>,
}

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

/// Every file below `dir`, sorted by path, hidden files and directories skipped.
fn files_below(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).map_err(|e| read_error(&d, e))? {
            let path = entry.map_err(|e| read_error(&d, e))?.path();
            let hidden = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('.'));
            if hidden {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else {
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
        Format::Text => {
            let text = std::fs::read(path).map_err(|e| read_error(path, e))?;
            each(&Document {
                origin: path.display().to_string(),
                text: Cow::Owned(text),
            })?;
            Ok(1)
        }
        Format::JsonLines => json_lines(path, each),
        Format::Directory => {
            let files = files_below(path)?;
            if files.is_empty() {
                return Err(NnError::BadInput(format!(
                    "--data {}: the directory holds no files",
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
    let (file, written) = temporary_token_file()?;
    let mut out = std::io::BufWriter::new(file);
    let write_failed =
        |e: std::io::Error| NnError::BadInput(format!("cannot write the token file: {e}"));
    let documents = for_each_document(path, &mut |doc| {
        for id in encode(doc)?.into_iter().chain([eot]) {
            out.write_all(&id.to_le_bytes()).map_err(write_failed)?;
        }
        Ok(())
    })?;
    let file = out.into_inner().map_err(|e| write_failed(e.into_error()))?;
    drop(written);
    Ok(Packed {
        corpus: Corpus::from_token_file(&file, vocab)?,
        documents,
    })
}

/// Removes the named file when dropped (the open file and its map stay valid on Unix).
struct Unlink(PathBuf);

impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A new file in the temporary directory, open for reading and writing, named only until the
/// returned guard drops.
fn temporary_token_file() -> Result<(std::fs::File, Unlink)> {
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
    Ok((file, Unlink(path)))
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
        };
        assert!(doc.utf8().unwrap_err().to_string().contains("x.txt"));
    }
}
