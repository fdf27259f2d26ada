//! `nobubble sample`: load a checkpoint written by `nobubble train --save` and continue a
//! prompt byte by byte. Also the train command's checkpoint glue (`--save`, `--resume`),
//! so the two share one notion of which flags a checkpoint fixes.

use clap::Args;
use nobubble_nn::generate::generate;
use nobubble_nn::{ByteCorpus, CpuBackend, GptConfig, TrainConfig};
use nobubble_runtime::checkpoint::corpus_fingerprint;
use nobubble_runtime::checkpoint_fs::{load, save};
use nobubble_runtime::{Checkpoint, CheckpointMeta, Session};
use std::io::Write;
use std::path::{Path, PathBuf};

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
    let ckpt = load(&a.checkpoint).map_err(|e| format!("--checkpoint: {e}"))?;
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

/// The `train` flags that reproduce a checkpoint's model and step shape, for messages.
fn flags(meta: &CheckpointMeta) -> String {
    let m = &meta.model;
    format!(
        "--layers {} --hidden {} --heads {} --seq-len {} --microbatch-size {} --microbatches {}",
        m.layers, m.hidden, m.heads, m.seq_len, m.microbatch_size, meta.train.microbatches
    )
}

/// Loads `dir` into the session's pipeline (any schedule or stage count) and returns
/// the step to continue from. Refuses a checkpoint of another model or microbatch count,
/// or one already at `steps`, naming the flags that fix it.
pub fn resume(
    session: &mut Session,
    dir: &Path,
    model: &GptConfig,
    train: &TrainConfig,
    corpus: &ByteCorpus,
    steps: u64,
) -> Result<u64, String> {
    let ckpt = load(dir).map_err(|e| format!("--resume: {e}"))?;
    let mut warnings = ckpt.check_resume(model, train).map_err(|e| {
        format!(
            "--resume {}: {e}; resume with the checkpoint's settings ({}) or train from scratch \
             without --resume",
            dir.display(),
            flags(&ckpt.meta)
        )
    })?;
    let data = corpus_fingerprint(corpus);
    if let Some(saved) = ckpt.meta.data.as_ref().filter(|d| **d != data) {
        warnings.push(format!(
            "the training text ({data}) is not the checkpoint's ({saved})"
        ));
    }
    for w in warnings {
        eprintln!("warning: --resume: {w}; the continuation will not match an uninterrupted run");
    }
    let step = ckpt.meta.step;
    if step >= steps {
        return Err(format!(
            "--resume {}: the checkpoint is already at step {step}, and --steps is {steps}; \
             raise --steps to train further",
            dir.display()
        ));
    }
    session
        .pipeline
        .import_state(ckpt.state)
        .map_err(|e| format!("--resume {}: {e}", dir.display()))?;
    eprintln!(
        "resumed from {} at step {step} (saved from {})",
        dir.display(),
        ckpt.meta.saved_from
    );
    Ok(step)
}

/// Writes the session's current state to `dir` atomically.
pub fn save_to(
    session: &Session,
    dir: &Path,
    model: &GptConfig,
    train: &TrainConfig,
    corpus: &ByteCorpus,
) -> Result<(), String> {
    let state = session
        .pipeline
        .export_state()
        .map_err(|e| format!("--save: {e}"))?;
    let schedule = &session.plan.schedule;
    let from = format!(
        "{} on {} ranks, {} stages",
        schedule.name, schedule.ranks, schedule.stages
    );
    let step = state.step;
    save(
        dir,
        &Checkpoint::new(state, model, train, &from).with_data(corpus),
    )
    .map_err(|e| format!("--save: {e}"))?;
    eprintln!("saved checkpoint at step {step} to {}", dir.display());
    Ok(())
}
