//! BPE tokenizers through Hugging Face's `tokenizers`: a `tokenizer.json` as transformers and
//! every model hub repository have it, or a byte-level BPE trained on the training data at
//! start (what GPT-2 and Llama 3 use: no unknown tokens, any text round-trips).

use std::path::Path;

use super::sources::{for_each_document, pack, Packed};
use crate::error::{NnError, Result};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    Tokenizer, TokenizerBuilder,
};

/// The end-of-text token a trained tokenizer gets, and the first name looked for in a given one.
pub const END_OF_TEXT: &str = "<|endoftext|>";
/// Other names of the end-of-text token, looked for in this order.
const OTHER_END_NAMES: [&str; 4] = ["<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>"];

/// Text in at most this many bytes of documents trains a tokenizer (the first ones): enough for
/// the merges, and bounded memory for any corpus.
pub const TRAINING_TEXT_LIMIT: usize = 64 << 20;

fn err(what: impl std::fmt::Display) -> NnError {
    NnError::BadInput(what.to_string())
}

/// A BPE tokenizer and its end-of-text id (needed only to pack documents).
pub struct TextTokenizer {
    inner: Tokenizer,
    eot: Option<u32>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab", &self.vocab_size())
            .field("eot", &self.eot)
            .finish()
    }
}

impl TextTokenizer {
    /// Reads a `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| err(format!("cannot read --tokenizer {}: {e}", path.display())))?;
        Self::from_json(&text).map_err(|e| err(format!("--tokenizer {}: {e}", path.display())))
    }

    /// Parses the JSON of a `tokenizer.json` (as [`TextTokenizer::to_json`] writes it).
    pub fn from_json(json: &str) -> Result<Self> {
        let inner: Tokenizer = json
            .parse()
            .map_err(|e| err(format!("not a tokenizer.json ({e})")))?;
        let eot = [END_OF_TEXT]
            .iter()
            .chain(&OTHER_END_NAMES)
            .find_map(|name| inner.token_to_id(name));
        Ok(TextTokenizer { inner, eot })
    }

    /// A byte-level BPE of `vocab_size` ids (the 256 byte symbols, `<|endoftext|>` and the
    /// merges) trained on the first [`TRAINING_TEXT_LIMIT`] bytes of `data`'s documents.
    pub fn train(data: &Path, vocab_size: usize) -> Result<Self> {
        let alphabet = ByteLevel::alphabet();
        if vocab_size <= alphabet.len() + 1 {
            return Err(err(format!(
                "--train-tokenizer {vocab_size}: a byte-level BPE needs more than {} ids (256 \
                 byte symbols and <|endoftext|>)",
                alphabet.len() + 1
            )));
        }
        let mut docs = Vec::new();
        let mut total = 0;
        // Reading stops at the limit: an error from the callback that only means "enough".
        let enough = || err("enough text for the tokenizer");
        let read = for_each_document(data, &mut |doc| {
            let text = doc.utf8()?;
            let take = text.len().min(TRAINING_TEXT_LIMIT - total);
            let cut = (0..=take)
                .rev()
                .find(|&i| text.is_char_boundary(i))
                .unwrap_or(0);
            docs.push(text[..cut].to_string());
            total += cut;
            if total >= TRAINING_TEXT_LIMIT {
                return Err(enough());
            }
            Ok(())
        });
        match read {
            Err(e) if e == enough() => {}
            other => {
                other?;
            }
        }
        // Every merge joins a pair seen at least twice, so there are at most total / 2 of them:
        // a larger request gives the same tokenizer, but the trainer reserves room for all of
        // it first (a billion ids aborted on 70 GB).
        let reachable = alphabet.len() + 1 + total / 2;
        let mut trainer = BpeTrainerBuilder::new()
            .vocab_size(vocab_size.min(reachable))
            .min_frequency(2)
            .show_progress(false)
            .initial_alphabet(alphabet.into_iter().collect())
            .special_tokens(vec![AddedToken::from(END_OF_TEXT, true)])
            .build();
        let byte_level = ByteLevel::default().add_prefix_space(false);
        let mut builder = TokenizerBuilder::<
            BPE,
            NormalizerWrapper,
            PreTokenizerWrapper,
            PostProcessorWrapper,
            DecoderWrapper,
        >::new()
        .with_model(BPE::default())
        .with_pre_tokenizer(Some(PreTokenizerWrapper::ByteLevel(byte_level)))
        .with_decoder(Some(DecoderWrapper::ByteLevel(byte_level)))
        .build()
        .map_err(|e| err(format!("cannot build a tokenizer: {e}")))?;
        builder
            .train(&mut trainer, docs.iter())
            .map_err(|e| err(format!("training the tokenizer failed: {e}")))?;
        let inner: Tokenizer = builder.into();
        let json = inner
            .to_string(false)
            .map_err(|e| err(format!("cannot write the tokenizer: {e}")))?;
        Self::from_json(&json)
    }

    /// Ids of the model's vocabulary (the model's embedding has this many rows).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The end-of-text id, written after every document, if the tokenizer has one.
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// The ids of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let e = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| err(format!("cannot tokenize: {e}")))?;
        Ok(e.get_ids().to_vec())
    }

    /// The text of `ids` (special tokens dropped).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| err(format!("cannot decode: {e}")))
    }

    /// The `tokenizer.json` text.
    pub fn to_json(&self) -> Result<String> {
        self.inner
            .to_string(false)
            .map_err(|e| err(format!("cannot write the tokenizer: {e}")))
    }

    /// `data`'s documents tokenized and packed, each followed by the end-of-text id.
    pub fn pack(&self, data: &Path) -> Result<Packed> {
        let vocab = self.vocab_size();
        let eot = self.eot.ok_or_else(|| {
            err(format!(
                "the tokenizer has no end-of-text token ({END_OF_TEXT}, {}): documents could \
                 not be told apart; add one to its added_tokens",
                OTHER_END_NAMES.join(", ")
            ))
        })?;
        pack(data, &mut |doc| self.encode(doc.utf8()?), eot, vocab)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trained_tokenizer_has_its_size_round_trips_text_and_packs_documents() {
        let d = std::env::temp_dir().join(format!("nobubble-tokenizer-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("kjv.txt");
        std::fs::write(&f, &crate::data::BUILTIN_CORPUS[..200_000]).unwrap();
        let tk = TextTokenizer::train(&f, 400).unwrap();
        assert_eq!(tk.vocab_size(), 400);
        for text in [
            "In the beginning God created the heaven",
            "naïve ünïcödé ✓ 12345",
            "",
        ] {
            let ids = tk.encode(text).unwrap();
            assert_eq!(tk.decode(&ids).unwrap(), text);
        }
        let ids = tk.encode("And God said, Let there be light").unwrap();
        assert!(ids.len() < 20, "merges learned: {ids:?}");
        // The JSON round trip keeps every id.
        let again = TextTokenizer::from_json(&tk.to_json().unwrap()).unwrap();
        assert_eq!(
            again.encode("and the earth").unwrap(),
            tk.encode("and the earth").unwrap()
        );
        assert_eq!(again.eot(), tk.eot());
        let packed = tk.pack(&f).unwrap();
        assert_eq!(packed.documents, 1);
        let all = packed.corpus.ids(0..packed.corpus.len());
        assert_eq!(Some(*all.last().unwrap()), tk.eot());
        assert_eq!(
            all[..all.len() - 1],
            tk.encode(std::str::from_utf8(&crate::data::BUILTIN_CORPUS[..200_000]).unwrap())
                .unwrap()[..]
        );
        assert!(TextTokenizer::train(&f, 200).is_err());
        // More ids than a text can give: the text's own tokenizer, quickly, whatever the ask.
        let small = d.join("small.txt");
        std::fs::write(&small, &crate::data::BUILTIN_CORPUS[..2_000]).unwrap();
        let fits = TextTokenizer::train(&small, 5_000).unwrap();
        // Below the cap (256 bytes, <|endoftext|>, a merge per two bytes): the trainer ran out
        // of pairs on its own, so the cap cut nothing.
        assert!(fits.vocab_size() < 257 + 2_000 / 2, "{}", fits.vocab_size());
        let huge = TextTokenizer::train(&small, 1_000_000_000).unwrap();
        assert_eq!(huge.to_json().unwrap(), fits.to_json().unwrap());
        assert!(TextTokenizer::from_json("{}").is_err());
        let _ = std::fs::remove_dir_all(&d);
    }
}
