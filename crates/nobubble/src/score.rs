//! `nobubble score`: the loss (and perplexity) of a text under a model — a checkpoint of
//! `train --save` or a Hugging Face Llama directory — and, on request, its logits, to compare
//! with another implementation of the same model.

use clap::Args;
use nobubble_nn::data::Codec;
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
    /// Window length for a Hugging Face model [default: its max_position_embeddings, at most
    /// 1024].
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
    let text = String::from_utf8_lossy(&bytes);
    let encode = |codec: &Codec| -> Result<Vec<u32>, String> {
        Ok(if codec.is_bytes() {
            bytes.iter().map(|&b| b as u32).collect()
        } else {
            codec.encode(&text).map_err(|e| e.message())?
        })
    };
    let model = crate::model_source::open(&a.checkpoint, a.seq_len, |c| Ok(encode(c)?.len()))?;
    let stage = model.stage;
    let ids = encode(&model.codec)?;
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
    let keep = a.logits.is_some();
    if keep && inputs.len() * vocab * 4 > 1 << 30 {
        return Err(format!(
            "--logits: {} tokens × {vocab} ids is more than 1 GiB of logits; score a shorter text",
            inputs.len()
        ));
    }
    let (loss, logits) = score_windows(&stage, inputs, targets, keep)?;
    if !loss.is_finite() {
        // As `sample` says: a loss of NaN printed with status 0 would pass for a result.
        return Err(format!(
            "the model produced non-finite logits on this text (loss {loss}): is the checkpoint \
             damaged, or did its training diverge? Score an earlier step"
        ));
    }
    if let (Some(path), Some(logits)) = (&a.logits, logits) {
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

/// The mean cross-entropy of `targets` after `tokens`, window by window of the model's
/// sequence length (each window its own context, as in training; the last one padded on the
/// right, which causal attention keeps from reaching the rows kept), and all logits if `keep`.
fn score_windows(
    stage: &Stage,
    tokens: &[u32],
    targets: &[u32],
    keep: bool,
) -> Result<(f64, Option<Tensor>), String> {
    let s = stage.config().seq_len;
    let be = CpuBackend::with_threads(std::thread::available_parallelism().map_or(1, |n| n.get()));
    let (mut total, mut kept) = (0.0, Vec::new());
    let mut vocab = 0;
    for (window, want) in tokens.chunks(s).zip(targets.chunks(s)) {
        let mut padded = window.to_vec();
        padded.resize(s, 0);
        let all =
            forward_logits(std::slice::from_ref(stage), &be, &padded).map_err(|e| e.to_string())?;
        vocab = all.cols();
        let rows = &all.data()[..window.len() * vocab];
        total += cross_entropy_sum(rows, vocab, want);
        if keep {
            kept.extend_from_slice(rows);
        }
    }
    let logits = keep
        .then(|| Tensor::from_vec(&[tokens.len(), vocab], kept))
        .transpose()
        .map_err(|e| e.to_string())?;
    Ok((total / targets.len() as f64, logits))
}

/// Sum over rows of `−log softmax(row)[target]`, in f64.
fn cross_entropy_sum(logits: &[f32], vocab: usize, targets: &[u32]) -> f64 {
    logits
        .chunks_exact(vocab)
        .zip(targets)
        .map(|(row, &t)| {
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
            let z: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
            z.ln() + max - row[t as usize] as f64
        })
        .sum()
}
