//! `nobubble score`: the loss (and perplexity) of a text under a model — a checkpoint of
//! `train --save` or a Hugging Face Llama directory — and, on request, its logits, to compare
//! with another implementation of the same model.

use clap::Args;
use nobubble_nn::generate::forward_logits;
use nobubble_nn::{CpuBackend, Stage, Tensor};
use nobubble_runtime::checkpoint::hf;
use nobubble_runtime::checkpoint_fs::load_resolved;
use std::path::PathBuf;

/// Arguments of `score`.
#[derive(Args, Debug)]
pub struct ScoreArgs {
    /// A checkpoint directory of `train --save`, or a Hugging Face model directory
    /// (`config.json` + `model.safetensors`).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The text to score (its bytes are the token ids).
    #[arg(long, conflicts_with = "file", required_unless_present = "file")]
    pub text: Option<String>,
    /// A file whose bytes to score.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Window length for a Hugging Face model [default: its max_position_embeddings].
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Write the logits `[tokens − 1, vocab]` (row r predicts byte r + 1) to this
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
    if bytes.len() < 2 {
        return Err("the text needs at least 2 bytes: one to predict from, one to predict".into());
    }
    let stage = if hf::is_model_dir(&a.checkpoint) {
        hf::build_model(&a.checkpoint, a.seq_len)
            .map_err(|e| format!("--checkpoint: {e}"))?
            .1
    } else {
        if a.seq_len.is_some() {
            return Err("--seq-len is for Hugging Face models; a checkpoint has its own".into());
        }
        let (_, ckpt) = load_resolved(&a.checkpoint).map_err(|e| format!("--checkpoint: {e}"))?;
        ckpt.build_model().map_err(|e| e.to_string())?
    };
    let vocab = stage.config().vocab;
    if let Some(b) = bytes.iter().find(|&&b| b as usize >= vocab) {
        return Err(format!(
            "the text holds byte {b}, outside the model's vocabulary of {vocab} ids"
        ));
    }
    let inputs: Vec<u32> = bytes[..bytes.len() - 1].iter().map(|&b| b as u32).collect();
    let targets: Vec<u32> = bytes[1..].iter().map(|&b| b as u32).collect();
    let logits = window_logits(&stage, &inputs)?;
    let loss = mean_cross_entropy(&logits, &targets);
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
            "{} tokens: loss {loss:.4} nats/byte, perplexity {:.3}",
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
