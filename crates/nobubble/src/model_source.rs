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
    /// The whole model as one stage, its window no longer than the command needs.
    pub stage: Stage,
    /// The context the model reads: its window (`--seq-len` for Hugging Face directories).
    pub context: usize,
    /// Text ↔ ids.
    pub codec: Codec,
    /// "checkpoint at step N" or "Hugging Face model".
    pub origin: String,
}

/// Longest default context for a Hugging Face directory: `score` (and sampling past the
/// window) runs the whole window, whose attention holds `heads × s²` floats per layer.
pub const DEFAULT_HF_CONTEXT: usize = 1024;

/// Opens `--checkpoint DIR`; `seq_len` only applies to Hugging Face directories (default:
/// their `max_position_embeddings`, at most [`DEFAULT_HF_CONTEXT`]). `longest` counts, with
/// the model's codec, the tokens the command will ever hold (text, or prompt and new
/// tokens): a Hugging Face model is built with a window no longer than that — the same
/// results, since a window runs causally from its start — so a long `--seq-len` over a short
/// text costs nothing, and a window whose attention cannot fit in memory is an error, not an
/// abort.
pub fn open(
    dir: &Path,
    seq_len: Option<usize>,
    longest: impl FnOnce(&Codec) -> Result<usize, String>,
) -> Result<Model, String> {
    if seq_len == Some(0) {
        return Err("--seq-len must be at least 1".into());
    }
    if hf::is_model_dir(dir) {
        let mut config =
            hf::read_config(dir, seq_len, 1).map_err(|e| format!("--checkpoint: {e}"))?;
        if seq_len.is_none() {
            config.seq_len = config.seq_len.min(DEFAULT_HF_CONTEXT);
        }
        let tokenizer = hf::read_tokenizer(dir).map_err(|e| e.to_string())?;
        let codec = Codec::new(tokenizer.as_deref()).map_err(|e| e.message())?;
        let context = config.seq_len;
        config.seq_len = context.min(longest(&codec)?.max(2));
        // The attention scores of one layer: heads × s² floats.
        let scores = config.heads as f64 * (config.seq_len as f64).powi(2) * 4.0;
        nobubble_runtime::machine::check_free(
            scores,
            &format!(
                "attention over a window of {} tokens ({} heads × {}² floats)",
                config.seq_len, config.heads, config.seq_len
            ),
            "use a smaller --seq-len (the text is scored window by window)",
        )?;
        let stage = hf::build_model(dir, &config).map_err(|e| format!("--checkpoint: {e}"))?;
        let origin = "Hugging Face model".to_string();
        return Ok(Model {
            stage,
            context,
            codec,
            origin,
        });
    }
    if seq_len.is_some() {
        return Err("--seq-len is for Hugging Face models; a checkpoint has its own".into());
    }
    let (_, ckpt) = load_resolved_weights(dir).map_err(|e| format!("--checkpoint: {e}"))?;
    let stage = ckpt.build_model().map_err(|e| e.to_string())?;
    let origin = format!("checkpoint at step {}", ckpt.meta.step);
    let context = stage.config().seq_len;
    let tokenizer = ckpt.meta.tokenizer;
    let codec = Codec::new(tokenizer.as_deref()).map_err(|e| e.message())?;
    Ok(Model {
        stage,
        context,
        codec,
        origin,
    })
}
