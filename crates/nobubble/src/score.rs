//! `nobubble score`: the loss (and perplexity) of a text under a model — a checkpoint of
//! `train --save` or a Hugging Face Llama directory — and, on request, its logits, to compare
//! with another implementation of the same model.

use clap::Args;
use nobubble_nn::generate::forward_logits;
use nobubble_nn::{CpuBackend, Stage, Tensor};
use nobubble_runtime::checkpoint::hf;
use std::path::PathBuf;

/// Arguments of `score`.
#[derive(Args, Debug)]
pub struct ScoreArgs {
    /// A checkpoint directory of `train --save`, or a Hugging Face model directory
    /// (`config.json` + `model.safetensors`).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The text to score (tokenized by the model's tokenizer; without one its bytes are the
    /// ids).
    #[arg(long, conflicts_with = "file", required_unless_present = "file")]
    pub text: Option<String>,
    /// A file whose bytes to score.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Window length for a Hugging Face model [default: its max_position_embeddings].
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Write the logits `[tokens − 1, vocab]` (row r predicts token r + 1) to this
    /// safetensors file, as tensor `logits`.
    #[arg(long)]
    pub logits: Option<PathBuf>,
    /// Print JSON (tokens, loss, perplexity) instead of a line of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `score`.
pub fn run(a: &ScoreArgs) -> Result<(), String> {
    let bytes = match (&a.text, &a.file) {
        (Some(t), _) => t.as_bytes().to_vec(),
        (None, Some(f)) => {
            std::fs::read(f).map_err(|e| format!("cannot read --file {}: {e}", f.display()))?
        }
        (None, None) => return Err("give --text or --file".into()),
    };
    let model = crate::model_source::open(&a.checkpoint, a.seq_len)?;
    let stage = model.stage;
    let text = String::from_utf8_lossy(&bytes);
    let ids = if model.codec.is_bytes() {
        bytes.iter().map(|&b| b as u32).collect()
    } else {
        model.codec.encode(&text).map_err(|e| e.message())?
    };
    if ids.len() < 2 {
        return Err("the text needs at least 2 tokens: one to predict from, one to predict".into());
    }
    let vocab = stage.config().vocab;
    if let Some(t) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(format!(
            "the text holds id {t}, outside the model's vocabulary of {vocab} ids"
        ));
    }
    let inputs = &ids[..ids.len() - 1];
    let targets = &ids[1..];
    let logits = window_logits(&stage, inputs)?;
    let loss = mean_cross_entropy(&logits, targets);
    if let Some(path) = &a.logits {
        hf::write_tensors(path, &[("logits", &logits)]).map_err(|e| e.to_string())?;
    }
    if a.json {
        let out = serde_json::json!({
            "tokens": targets.len(),
            "loss": loss,
            "perplexity": loss.exp(),
        });
        println!("{out}");
    } else {
        println!(
            "{} tokens: loss {loss:.4} nats/token, perplexity {:.3}",
            targets.len(),
            loss.exp()
        );
    }
    Ok(())
}

/// Logits of `tokens` in windows of the model's sequence length (each window its own
/// context, as in training); the last window is padded on the right, which causal attention
/// keeps from reaching the rows kept.
fn window_logits(stage: &Stage, tokens: &[u32]) -> Result<Tensor, String> {
    let s = stage.config().seq_len;
    let mut padded = tokens.to_vec();
    padded.resize(tokens.len().div_ceil(s) * s, 0);
    let be = CpuBackend::with_threads(std::thread::available_parallelism().map_or(1, |n| n.get()));
    let all =
        forward_logits(std::slice::from_ref(stage), &be, &padded).map_err(|e| e.to_string())?;
    let v = all.cols();
    Tensor::from_vec(&[tokens.len(), v], all.data()[..tokens.len() * v].to_vec())
        .map_err(|e| e.to_string())
}

/// Mean of `−log softmax(row)[target]`, in f64.
fn mean_cross_entropy(logits: &Tensor, targets: &[u32]) -> f64 {
    let v = logits.cols();
    let total: f64 = logits
        .data()
        .chunks_exact(v)
        .zip(targets)
        .map(|(row, &t)| {
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
            let z: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
            z.ln() + max - row[t as usize] as f64
        })
        .sum();
    total / targets.len() as f64
}
