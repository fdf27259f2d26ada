//! Training data: a corpus of token ids — the bytes of a text (ids 0..=255), or documents
//! tokenized into a file of ids ([`sources`], [`tokenizer`]) — and microbatches drawn at
//! positions that are a pure function of (seed, step, microbatch, sequence), so the reference
//! trainer and a pipelined runtime see exactly the same data.
//!
//! A corpus is a window of shared, read-only storage: the text itself, or a token file mapped
//! into memory, so a corpus larger than memory trains (pages are read as windows need them),
//! and the held-out split is another window of the same storage, not a copy.

pub mod sources;
#[cfg(feature = "tokenizers")]
pub mod tokenizer;

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use crate::error::{NnError, Result};
use crate::param::SplitMix64;

/// The built-in corpus: the first ~1 MB of the King James Bible (public domain; from
/// Debian's `bible-kjv` package, see `data/README.md`).
pub static BUILTIN_CORPUS: &[u8] = include_bytes!("../../data/kjv-excerpt.txt");

/// Text ↔ ids for sampling and scoring: the bytes themselves, or a BPE tokenizer.
#[derive(Debug)]
pub enum Codec {
    /// Each byte is its id (ids of 256 and above, such as an end-of-text id, decode to
    /// nothing).
    Bytes,
    /// A `tokenizer.json`'s BPE.
    #[cfg(feature = "tokenizers")]
    Bpe(Box<tokenizer::TextTokenizer>),
}

impl Codec {
    /// The codec of a `tokenizer.json` text, or bytes for `None`.
    pub fn new(tokenizer_json: Option<&str>) -> Result<Self> {
        match tokenizer_json {
            None => Ok(Codec::Bytes),
            #[cfg(feature = "tokenizers")]
            Some(json) => Ok(Codec::Bpe(Box::new(tokenizer::TextTokenizer::from_json(
                json,
            )?))),
            #[cfg(not(feature = "tokenizers"))]
            Some(_) => Err(NnError::Config(
                "this model's ids are a BPE tokenizer's, and this build has no tokenizers \
                 (rebuild with the default features)"
                    .into(),
            )),
        }
    }

    /// The ids of `text`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            Codec::Bytes => Ok(text.bytes().map(u32::from).collect()),
            #[cfg(feature = "tokenizers")]
            Codec::Bpe(t) => t.encode(text),
        }
    }

    /// The text of `ids` (invalid UTF-8 becomes U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match self {
            Codec::Bytes => {
                let bytes: Vec<u8> = ids.iter().filter(|&&i| i < 256).map(|&i| i as u8).collect();
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
            #[cfg(feature = "tokenizers")]
            Codec::Bpe(t) => t.decode(ids),
        }
    }

    /// True for bytes (each id one byte).
    pub fn is_bytes(&self) -> bool {
        matches!(self, Codec::Bytes)
    }
}

/// One microbatch: `targets[i]` is the token following `tokens[i]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Microbatch {
    /// Input token ids, `sequences × seq_len`, sequence-major.
    pub tokens: Vec<u32>,
    /// Next-token targets, same layout.
    pub targets: Vec<u32>,
}

/// Where a corpus's ids live.
enum Storage {
    /// Bytes in memory, each one token.
    Bytes(Vec<u8>),
    /// A text file mapped into memory, each byte one token.
    MappedBytes(memmap2::Mmap),
    /// Little-endian u32 ids in memory, or a token file mapped into memory.
    Ids(Ids),
}

enum Ids {
    Owned(Vec<u32>),
    Mapped(memmap2::Mmap),
}

impl Storage {
    fn len(&self) -> usize {
        match self {
            Storage::Bytes(b) => b.len(),
            Storage::MappedBytes(m) => m.len(),
            Storage::Ids(Ids::Owned(v)) => v.len(),
            Storage::Ids(Ids::Mapped(m)) => m.len() / 4,
        }
    }

    fn bytes(&self) -> Option<&[u8]> {
        match self {
            Storage::Bytes(b) => Some(b),
            Storage::MappedBytes(m) => Some(m),
            Storage::Ids(_) => None,
        }
    }

    /// Ids `range` appended to `out`.
    fn extend(&self, range: Range<usize>, out: &mut Vec<u32>) {
        match self {
            Storage::Ids(Ids::Owned(v)) => out.extend_from_slice(&v[range]),
            Storage::Ids(Ids::Mapped(m)) => out.extend(
                m[range.start * 4..range.end * 4]
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            ),
            bytes => out.extend(
                bytes.bytes().expect("byte storage")[range]
                    .iter()
                    .map(|&b| b as u32),
            ),
        }
    }
}

/// A corpus of token ids to sample training windows from: a window `[start, end)` of shared
/// storage.
#[derive(Clone)]
pub struct Corpus {
    storage: Arc<Storage>,
    range: Range<usize>,
    /// Ids are below this (256 for bytes).
    vocab: usize,
    /// [`Corpus::content_hash`], computed once (a pass over the data) and shared by clones.
    hash: Arc<std::sync::OnceLock<u64>>,
}

impl std::fmt::Debug for Corpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Corpus")
            .field("tokens", &self.len())
            .field("vocab", &self.vocab)
            .finish()
    }
}

impl Corpus {
    fn whole(storage: Storage, vocab: usize) -> Result<Self> {
        let len = storage.len();
        if len < 2 {
            return Err(NnError::BadInput(format!(
                "the corpus has {len} token{}: training needs many more (an empty file?)",
                if len == 1 { "" } else { "s" }
            )));
        }
        Ok(Corpus {
            storage: Arc::new(storage),
            range: 0..len,
            vocab,
            hash: Arc::default(),
        })
    }

    /// The built-in KJV excerpt.
    pub fn builtin() -> Self {
        Self::from_bytes(BUILTIN_CORPUS.to_vec()).expect("the built-in corpus is not empty")
    }

    /// A corpus of bytes; at least 2.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::whole(Storage::Bytes(bytes), 256)
    }

    /// A corpus of ids, each below `vocab`; at least 2.
    pub fn from_ids(ids: Vec<u32>, vocab: usize) -> Result<Self> {
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(NnError::BadInput(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        Self::whole(Storage::Ids(Ids::Owned(ids)), vocab)
    }

    /// The bytes of a file, mapped into memory (a file larger than memory works).
    pub fn from_file(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| {
            NnError::BadInput(format!("cannot read corpus {}: {e}", path.display()))
        })?;
        if file.metadata().is_ok_and(|m| !m.is_file()) {
            return Err(NnError::BadInput(format!(
                "corpus {} is not a regular file (a device or a pipe is read through a map, \
                 which needs a file): give a text file",
                path.display()
            )));
        }
        // SAFETY: the map is read-only; a file changed under a running job changes its data,
        // as reading it piecewise would (the job's fingerprint was taken at start).
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| NnError::BadInput(format!("cannot map corpus {}: {e}", path.display())))?;
        Self::whole(Storage::MappedBytes(map), 256)
    }

    /// A token file: little-endian u32 ids, each below `vocab` (checked once, here).
    pub fn from_token_file(file: &std::fs::File, vocab: usize) -> Result<Self> {
        // SAFETY: as in `from_file`; token files are written once, before training.
        let map = unsafe { memmap2::Mmap::map(file) }
            .map_err(|e| NnError::BadInput(format!("cannot map a token file: {e}")))?;
        if !map.len().is_multiple_of(4) {
            return Err(NnError::BadInput(
                "a token file of u32 ids has a length that is not a multiple of 4".into(),
            ));
        }
        let ids = Ids::Mapped(map);
        if let Ids::Mapped(m) = &ids {
            let bad = m
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .find(|&t| t as usize >= vocab);
            if let Some(bad) = bad {
                return Err(NnError::BadInput(format!(
                    "token id {bad} is outside the vocabulary of {vocab}"
                )));
            }
        }
        Self::whole(Storage::Ids(ids), vocab)
    }

    /// Corpus length in tokens.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// True if empty (never, by construction).
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// Ids are below this: 256 for bytes, the tokenizer's vocabulary size for token files.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The raw bytes, for a corpus of bytes (`None` for token ids).
    pub fn bytes(&self) -> Option<&[u8]> {
        self.storage.bytes().map(|b| &b[self.range.clone()])
    }

    /// FNV-1a of the corpus's bytes (for a corpus of bytes) or of its ids' little-endian
    /// bytes: a cheap fingerprint to notice that a resumed run reads other data.
    pub fn content_hash(&self) -> u64 {
        *self.hash.get_or_init(|| self.compute_hash())
    }

    fn compute_hash(&self) -> u64 {
        if let Some(bytes) = self.bytes() {
            return crate::param::fnv1a(bytes);
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        const CHUNK: usize = 1 << 16;
        for start in (0..self.len()).step_by(CHUNK) {
            for id in self.ids(start..(start + CHUNK).min(self.len())) {
                for b in id.to_le_bytes() {
                    h ^= b as u64;
                    h = h.wrapping_mul(0x0000_0100_0000_01b3);
                }
            }
        }
        h
    }

    /// Ids `range` of this corpus.
    pub fn ids(&self, range: Range<usize>) -> Vec<u32> {
        let mut out = Vec::with_capacity(range.len());
        let start = self.range.start + range.start;
        self.storage.extend(start..start + range.len(), &mut out);
        out
    }

    /// The first `tokens` tokens of the corpus (e.g. a small training slice in tests).
    pub fn prefix(&self, tokens: usize) -> Result<Self> {
        self.window(0..tokens.min(self.len()))
    }

    /// The tokens `range` of this corpus, sharing its storage; at least 2.
    pub fn window(&self, range: Range<usize>) -> Result<Self> {
        if range.len() < 2 || range.end > self.len() {
            return Err(NnError::BadInput(format!(
                "a corpus window of {range:?} in {} tokens",
                self.len()
            )));
        }
        Ok(Corpus {
            storage: self.storage.clone(),
            range: self.range.start + range.start..self.range.start + range.end,
            vocab: self.vocab,
            hash: Arc::default(),
        })
    }

    /// Splits off the last `1/parts` for validation: (training, held out).
    pub fn split_held_out(&self, parts: usize) -> Result<(Self, Self)> {
        let cut = self.len() - self.len() / parts.max(1);
        Ok((self.window(0..cut)?, self.window(cut..self.len())?))
    }

    /// Microbatch `microbatch` of step `step`: `sequences` windows of `seq_len + 1`
    /// tokens whose start positions depend only on (seed, step, microbatch, index).
    pub fn microbatch(
        &self,
        seed: u64,
        step: u64,
        microbatch: usize,
        sequences: usize,
        seq_len: usize,
    ) -> Result<Microbatch> {
        if seq_len + 1 > self.len() {
            return Err(NnError::BadInput(format!(
                "corpus of {} tokens is shorter than a window of {} tokens",
                self.len(),
                seq_len + 1
            )));
        }
        let positions = (self.len() - seq_len) as u64;
        let mut tokens = Vec::with_capacity(sequences * seq_len);
        let mut targets = Vec::with_capacity(sequences * seq_len);
        for k in 0..sequences {
            let key = mix(mix(mix(mix(seed) ^ step) ^ microbatch as u64) ^ k as u64);
            let start = SplitMix64::new(key).next_below(positions) as usize;
            let window = self.ids(start..start + seq_len + 1);
            tokens.extend_from_slice(&window[..seq_len]);
            targets.extend_from_slice(&window[1..]);
        }
        Ok(Microbatch { tokens, targets })
    }
}

fn mix(x: u64) -> u64 {
    SplitMix64::new(x).next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn microbatches_are_deterministic_shifted_windows() {
        let c = Corpus::builtin();
        assert!(c.len() > 900_000 && c.len() <= 1_000_000);
        assert!(BUILTIN_CORPUS.starts_with(b"In the beginning God created"));
        let a = c.microbatch(1, 5, 2, 3, 16).unwrap();
        assert_eq!(a, c.microbatch(1, 5, 2, 3, 16).unwrap());
        assert_ne!(a, c.microbatch(1, 6, 2, 3, 16).unwrap());
        assert_ne!(a, c.microbatch(1, 5, 3, 3, 16).unwrap());
        assert_eq!(a.tokens.len(), 48);
        for s in 0..3 {
            assert_eq!(
                &a.tokens[s * 16 + 1..(s + 1) * 16],
                &a.targets[s * 16..(s + 1) * 16 - 1]
            );
        }
        let small = Corpus::from_bytes(b"abcd".to_vec()).unwrap();
        assert!(small.microbatch(0, 0, 0, 1, 4).is_err());
        let m = small.microbatch(0, 0, 0, 2, 3).unwrap();
        assert_eq!(m.tokens, vec![97, 98, 99, 97, 98, 99]);
        assert!(Corpus::from_file(std::path::Path::new("/nonexistent/file")).is_err());
    }
}
