//! `train`'s data flags: `--data` (a text file, a directory of files, JSON lines with a `text`
//! field; default the built-in excerpt), `--tokenizer` / `--train-tokenizer` (BPE; default the
//! bytes), and the tokenizer a resumed checkpoint or an `--init-from` directory brings along.

use super::TrainArgs;
use crate::output::tell;
use nobubble_nn::data::sources::{pack, Format};
use nobubble_nn::{Corpus, GptConfig};
use std::path::{Path, PathBuf};

/// The corpora a job trains and validates on, and how they were made.
pub struct TrainingData {
    /// Training tokens (the first nine tenths).
    pub corpus: Corpus,
    /// Held-out tokens (the last tenth), for the validation loss.
    pub eval: Corpus,
    /// The `tokenizer.json` text, if the ids are a tokenizer's.
    pub tokenizer: Option<String>,
    /// One line for the start-up message.
    pub description: String,
}

/// Where a tokenizer comes from.
#[cfg_attr(not(feature = "tokenizers"), allow(dead_code))]
enum TokenizerSource {
    /// Bytes are the ids.
    Bytes,
    /// `tokenizer.json` text (from --tokenizer, a checkpoint or a model directory).
    Json(String, String),
    /// Trained at start with this vocabulary size.
    Train(usize),
}

fn tokenizer_source(a: &TrainArgs) -> Result<TokenizerSource, String> {
    let given = match &a.tokenizer {
        Some(path) => Some(crate::input::read_text(
            path,
            "--tokenizer",
            crate::input::TOKENIZER_BYTES,
        )?),
        None => None,
    };
    if let Some(dir) = &a.resume {
        if a.train_tokenizer.is_some() {
            return Err(
                "--train-tokenizer with --resume: a resumed run keeps its checkpoint's tokenizer"
                    .into(),
            );
        }
        let saved = nobubble_runtime::checkpoint_fs::peek_tokenizer(dir);
        if given.is_some() && given != saved {
            return Err(format!(
                "--tokenizer differs from the tokenizer {} was trained with: the ids would mean \
                 other text; drop --tokenizer (a resumed run keeps its checkpoint's)",
                dir.display()
            ));
        }
        if let Some(json) = saved {
            let from = format!("{} (the checkpoint's)", dir.display());
            return Ok(TokenizerSource::Json(json, from));
        }
    }
    if let (Some(json), Some(path)) = (given, &a.tokenizer) {
        return Ok(TokenizerSource::Json(json, path.display().to_string()));
    }
    if let Some(vocab) = a.train_tokenizer {
        return Ok(TokenizerSource::Train(vocab));
    }
    if let Some(dir) = &a.init_from {
        let path = dir.join("tokenizer.json");
        if path.is_file() {
            let json = crate::input::read_text(&path, "tokenizer", crate::input::TOKENIZER_BYTES)?;
            return Ok(TokenizerSource::Json(json, path.display().to_string()));
        }
    }
    Ok(TokenizerSource::Bytes)
}

/// The built-in excerpt as a file, for the paths that read documents from one; removed when
/// dropped, whatever happens in between.
struct BuiltinFile(PathBuf);

impl BuiltinFile {
    fn write() -> Result<Self, String> {
        let name = format!("nobubble-builtin-{}.txt", std::process::id());
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, nobubble_nn::data::BUILTIN_CORPUS)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok(BuiltinFile(path))
    }
}

impl Drop for BuiltinFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Reads, tokenizes and splits the data the flags name; sets the model's vocabulary to the
/// tokenizer's (or checks that an `--init-from` model's covers it).
pub fn load(a: &TrainArgs, model: &mut GptConfig) -> Result<TrainingData, String> {
    let source = tokenizer_source(a)?;
    let data_name = a
        .data
        .as_ref()
        .map_or("the built-in KJV excerpt".to_string(), |p| {
            p.display().to_string()
        });
    let format = a.data.as_deref().map_or(Format::Text, Format::of);
    if let Some(path) = &a.data {
        if !path.exists() {
            return Err(format!(
                "cannot read --data {}: no such file or directory",
                path.display()
            ));
        }
    }
    let (corpus, tokenizer, how) = match source {
        TokenizerSource::Bytes => bytes_corpus(a.data.as_deref(), format)?,
        other => tokenized(a.data.as_deref(), other)?,
    };
    if a.init_from.is_some() {
        if corpus.vocab() > model.vocab {
            return Err(format!(
                "the tokenizer has {} ids but the --init-from model a vocabulary of {}; pass \
                 the model's own tokenizer with --tokenizer",
                corpus.vocab(),
                model.vocab
            ));
        }
        if tokenizer.is_none() && model.vocab > 257 {
            tell!(
                "warning: --init-from: the model has a vocabulary of {} but no tokenizer.json \
                 was found or given: it trains on bytes as ids 0–255",
                model.vocab
            );
        }
    } else {
        model.vocab = corpus.vocab();
    }
    let min = 10 * (model.seq_len + 1);
    if corpus.len() < min {
        return Err(format!(
            "the training data has {} tokens; with --seq-len {} it needs at least {min}",
            corpus.len(),
            model.seq_len
        ));
    }
    let (train, eval) = corpus.split_held_out(10).map_err(|e| e.to_string())?;
    Ok(TrainingData {
        description: format!(
            "data: {data_name} ({}), {how}: {} training tokens, {} held out, vocabulary {}",
            format.name(),
            train.len(),
            eval.len(),
            model.vocab
        ),
        corpus: train,
        eval,
        tokenizer,
    })
}

type Made = (Corpus, Option<String>, String);

/// Bytes as ids: one text file as it is (mapped, not read); documents of a directory or JSON
/// lines packed with id 256 after each (a vocabulary of 257).
fn bytes_corpus(data: Option<&Path>, format: Format) -> Result<Made, String> {
    match (data, format) {
        (None, _) => Ok((Corpus::builtin(), None, "bytes".into())),
        (Some(path), Format::Text) => {
            let c = Corpus::from_file(path).map_err(|e| format!("--data: {}", e.message()))?;
            Ok((c, None, "bytes".into()))
        }
        (Some(path), _) => {
            let mut bytes = |d: &nobubble_nn::data::sources::Document<'_>| {
                Ok(d.text.iter().map(|&b| b as u32).collect())
            };
            let packed =
                pack(path, &mut bytes, 256, 257).map_err(|e| format!("--data: {}", e.message()))?;
            let how = format!("bytes, {} documents ended by id 256", packed.documents);
            Ok((packed.corpus, None, how))
        }
    }
}

#[cfg(feature = "tokenizers")]
fn tokenized(data: Option<&Path>, source: TokenizerSource) -> Result<Made, String> {
    use nobubble_nn::data::tokenizer::TextTokenizer;
    let name = data.map_or("the built-in excerpt".to_string(), |p| {
        p.display().to_string()
    });
    let builtin;
    let path = match data {
        Some(p) => p,
        None => {
            builtin = BuiltinFile::write()?;
            builtin.0.as_path()
        }
    };
    let (tk, how) = match source {
        TokenizerSource::Json(json, from) => {
            let tk = TextTokenizer::from_json(&json)
                .map_err(|e| format!("tokenizer {from}: {}", e.message()))?;
            (tk, format!("tokenizer {from}"))
        }
        TokenizerSource::Train(vocab) => {
            let started = std::time::Instant::now();
            tell!("training a byte-level BPE tokenizer of {vocab} ids on {name} …");
            let tk = TextTokenizer::train(path, vocab).map_err(|e| e.message())?;
            let took = started.elapsed().as_secs_f64();
            let ids = tk.vocab_size();
            (
                tk,
                format!("byte-level BPE of {ids} ids trained in {took:.1} s"),
            )
        }
        TokenizerSource::Bytes => unreachable!("bytes are handled by bytes_corpus"),
    };
    let packed = tk
        .pack(path)
        .map_err(|e| format!("--data: {}", e.message()))?;
    let json = tk.to_json().map_err(|e| e.to_string())?;
    let how = format!("{how}, {} documents", packed.documents);
    Ok((packed.corpus, Some(json), how))
}

#[cfg(not(feature = "tokenizers"))]
fn tokenized(_: Option<&Path>, _: TokenizerSource) -> Result<Made, String> {
    let _ = BuiltinFile::write;
    Err(
        "this nobubble was built without BPE tokenizers; rebuild with the default features \
         (cargo build --release), or train on bytes (no --tokenizer / --train-tokenizer)"
            .into(),
    )
}
