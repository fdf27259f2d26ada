//! The model `sample` and `score` run: a checkpoint of `train --save`, or a Hugging Face
//! model directory — with its tokenizer (the checkpoint's, or the directory's
//! `tokenizer.json`; bytes if it has none).

use nobubble_nn::data::Codec;
use nobubble_nn::Stage;
use nobubble_runtime::checkpoint::hf;
use nobubble_runtime::checkpoint_fs::load_resolved_weights;
use std::path::Path;

/// A model ready to run, its codec and a line saying what it is.
pub struct Model {
    /// The whole model as one stage.
    pub stage: Stage,
    /// Text ↔ ids.
    pub codec: Codec,
    /// "checkpoint at step N" or "Hugging Face model".
    pub origin: String,
}

/// Longest default context for a Hugging Face directory: `score` (and sampling past the
/// window) runs the whole window, whose attention holds `heads × s²` floats per layer.
pub const DEFAULT_HF_CONTEXT: usize = 1024;

/// Opens `--checkpoint DIR`; `seq_len` only applies to Hugging Face directories (default:
/// their `max_position_embeddings`, at most [`DEFAULT_HF_CONTEXT`]).
pub fn open(dir: &Path, seq_len: Option<usize>) -> Result<Model, String> {
    let (stage, tokenizer, origin) = if hf::is_model_dir(dir) {
        let mut config =
            hf::read_config(dir, seq_len, 1).map_err(|e| format!("--checkpoint: {e}"))?;
        if seq_len.is_none() {
            config.seq_len = config.seq_len.min(DEFAULT_HF_CONTEXT);
        }
        let stage = hf::build_model(dir, &config).map_err(|e| format!("--checkpoint: {e}"))?;
        let tokenizer = hf::read_tokenizer(dir).map_err(|e| e.to_string())?;
        (stage, tokenizer, "Hugging Face model".to_string())
    } else {
        if seq_len.is_some() {
            return Err("--seq-len is for Hugging Face models; a checkpoint has its own".into());
        }
        let (_, ckpt) = load_resolved_weights(dir).map_err(|e| format!("--checkpoint: {e}"))?;
        let stage = ckpt.build_model().map_err(|e| e.to_string())?;
        let origin = format!("checkpoint at step {}", ckpt.meta.step);
        (stage, ckpt.meta.tokenizer, origin)
    };
    let codec = Codec::new(tokenizer.as_deref()).map_err(|e| e.message())?;
    Ok(Model {
        stage,
        codec,
        origin,
    })
}
