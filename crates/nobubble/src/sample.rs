//! `nobubble sample`: load a checkpoint written by `nobubble train --save` and continue a
//! prompt byte by byte.

use clap::Args;
use nobubble_nn::generate::generate;
use nobubble_nn::CpuBackend;
use nobubble_runtime::checkpoint_fs::load_resolved;
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `sample`.
#[derive(Args, Debug)]
pub struct SampleArgs {
    /// Checkpoint directory written by `nobubble train --save DIR`.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Text to continue; only its last seq-len bytes are the model's context.
    #[arg(long)]
    pub prompt: String,
    /// Bytes to generate.
    #[arg(long, default_value_t = 200)]
    pub tokens: usize,
    /// Sampling temperature; 0 picks the most likely byte every time (greedy).
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Seed of the sampler: the same checkpoint, prompt, temperature and seed give the
    /// same text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Runs `sample`.
pub fn run(a: &SampleArgs) -> Result<(), String> {
    if a.prompt.is_empty() {
        return Err(
            "--prompt must not be empty: the model needs at least one byte of context".into(),
        );
    }
    if !(a.temperature.is_finite() && a.temperature >= 0.0) {
        return Err(format!(
            "--temperature must be 0 (greedy) or positive, got {}",
            a.temperature
        ));
    }
    let (_, ckpt) = load_resolved(&a.checkpoint).map_err(|e| format!("--checkpoint: {e}"))?;
    let stage = ckpt.build_model().map_err(|e| e.to_string())?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let m = &ckpt.meta.model;
    eprintln!(
        "nobubble sample: checkpoint at step {} ({} layers, h {}, context {} bytes), temperature {}, seed {}",
        ckpt.meta.step, m.layers, m.hidden, m.seq_len, a.temperature, a.seed
    );
    let prompt: Vec<u32> = a.prompt.bytes().map(u32::from).collect();
    let be = CpuBackend::with_threads(threads);
    let out = generate(
        std::slice::from_ref(&stage),
        &be,
        &prompt,
        a.tokens,
        a.temperature,
        a.seed,
    )
    .map_err(|e| e.to_string())?;
    let bytes: Vec<u8> = a
        .prompt
        .bytes()
        .chain(out.iter().map(|&t| t as u8))
        .collect();
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", String::from_utf8_lossy(&bytes))
        .and_then(|_| stdout.flush())
        .map_err(|e| format!("cannot write the sample: {e}"))
}
