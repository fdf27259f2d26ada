//! Byte-level data: a text corpus becomes token ids 0..=255, and microbatches are
//! drawn at positions that are a pure function of (seed, step, microbatch, sequence),
//! so the reference trainer and a pipelined runtime see exactly the same data.

use crate::error::{NnError, Result};
use crate::param::SplitMix64;

/// The built-in corpus: the first ~1 MB of the King James Bible (public domain; from
/// Debian's `bible-kjv` package, see `data/README.md`).
pub static BUILTIN_CORPUS: &[u8] = include_bytes!("../data/kjv-excerpt.txt");

/// One microbatch: `targets[i]` is the byte following `tokens[i]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Microbatch {
    /// Input byte ids, `sequences × seq_len`, sequence-major.
    pub tokens: Vec<u32>,
    /// Next-byte targets, same layout.
    pub targets: Vec<u32>,
}

/// A byte corpus to sample training windows from.
#[derive(Clone, Debug)]
pub struct ByteCorpus {
    bytes: Vec<u8>,
}

impl ByteCorpus {
    /// The built-in KJV excerpt.
    pub fn builtin() -> Self {
        ByteCorpus {
            bytes: BUILTIN_CORPUS.to_vec(),
        }
    }

    /// A corpus from raw bytes; must be non-empty.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        if bytes.len() < 2 {
            return Err(NnError::BadInput("corpus needs at least 2 bytes".into()));
        }
        Ok(ByteCorpus { bytes })
    }

    /// Reads a text (or any) file as bytes.
    pub fn from_file(path: &std::path::Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| {
            NnError::BadInput(format!("cannot read corpus {}: {e}", path.display()))
        })?;
        Self::from_bytes(bytes)
    }

    /// Corpus length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// The raw bytes (e.g. to split off a held-out part).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// True if empty (never, by construction).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The first `bytes` bytes of the corpus (e.g. a small training slice in tests).
    pub fn prefix(&self, bytes: usize) -> Result<Self> {
        Self::from_bytes(self.bytes[..bytes.min(self.bytes.len())].to_vec())
    }

    /// Microbatch `microbatch` of step `step`: `sequences` windows of `seq_len + 1`
    /// bytes whose start positions depend only on (seed, step, microbatch, index).
    pub fn microbatch(
        &self,
        seed: u64,
        step: u64,
        microbatch: usize,
        sequences: usize,
        seq_len: usize,
    ) -> Result<Microbatch> {
        if seq_len + 1 > self.bytes.len() {
            return Err(NnError::BadInput(format!(
                "corpus of {} bytes is shorter than a window of {} bytes",
                self.bytes.len(),
                seq_len + 1
            )));
        }
        let positions = (self.bytes.len() - seq_len) as u64;
        let mut tokens = Vec::with_capacity(sequences * seq_len);
        let mut targets = Vec::with_capacity(sequences * seq_len);
        for k in 0..sequences {
            let key = mix(mix(mix(mix(seed) ^ step) ^ microbatch as u64) ^ k as u64);
            let start = SplitMix64::new(key).next_below(positions) as usize;
            let window = &self.bytes[start..start + seq_len + 1];
            tokens.extend(window[..seq_len].iter().map(|&b| b as u32));
            targets.extend(window[1..].iter().map(|&b| b as u32));
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
        let c = ByteCorpus::builtin();
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
        let small = ByteCorpus::from_bytes(b"abcd".to_vec()).unwrap();
        assert!(small.microbatch(0, 0, 0, 1, 4).is_err());
        let m = small.microbatch(0, 0, 0, 2, 3).unwrap();
        assert_eq!(m.tokens, vec![97, 98, 99, 97, 98, 99]);
        assert!(ByteCorpus::from_file(std::path::Path::new("/nonexistent/file")).is_err());
    }
}
