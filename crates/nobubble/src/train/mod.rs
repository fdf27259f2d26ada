//! `nobubble train`: train a GPT on text under any schedule. Parses and checks the flags,
//! starts the ranks — threads of this process, or this process as one rank of an MPI job
//! (`mpirun -np N nobubble train …`) — runs [`nobubble_runtime::training::run`] on each, and
//! prints rank 0's progress and report.

pub mod data;
pub mod report;
pub mod watch;

use crate::train::watch::{Watch, WatchOptions};
use clap::Args;
use nobubble_nn::config::Arch;
use nobubble_nn::{AdamWConfig, GptConfig, StageLayout, TrainConfig};
use nobubble_runtime::launch::{self, RankContext};
use nobubble_runtime::metrics::{model_flops_per_step, Metrics, MetricsServer};
#[cfg(feature = "mpi")]
use nobubble_runtime::training::Observer;
use nobubble_runtime::training::{self, TrainJob};
use nobubble_runtime::worker::Rollback;
use nobubble_runtime::Fault;
use nobubble_runtime::{Compute, RunConfig, RuntimeError, SessionOptions};
use nobubble_schedule::export::csv;
use nobubble_schedule::{CostSpec, MemLimit, Objective, RankCost, Schedule, ScheduleKind};
#[cfg(feature = "mpi")]
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `train`.
#[derive(Args, Debug)]
pub struct TrainArgs {
    /// Schedule: a name (see `nobubble plan --help`; PyTorch's class names such as
    /// Schedule1F1B work too), or a schedule file in PyTorch's compute-only CSV format
    /// (`nobubble plan -f csv` writes one), whose rows set the ranks, placement and
    /// microbatches. Automatic schedules are re-planned on measured costs.
    #[arg(
        long,
        short = 's',
        visible_alias = "pipeline-schedule",
        default_value = "zb-auto"
    )]
    pub schedule: String,
    /// Pipeline ranks, a thread each, or a process each under mpirun [default: 2, or the
    /// --schedule file's rows].
    #[arg(long, short = 'p')]
    pub stages: Option<usize>,
    /// Data-parallel replicas of the pipeline: the job has stages × data-parallel ranks, and
    /// each step takes data-parallel × microbatches microbatches.
    #[arg(long, default_value_t = 1)]
    pub data_parallel: usize,
    /// Microbatches per step [default: 8, or the --schedule file's].
    #[arg(long, short = 'm')]
    pub microbatches: Option<usize>,
    /// Model chunks per rank (interleaved schedules).
    #[arg(long, default_value_t = 2)]
    pub chunks: usize,
    /// Model preset: micro, tiny, small, medium.
    #[arg(long, default_value = "tiny")]
    pub model: String,
    /// Block family: gpt (LayerNorm, learned positions, GELU, biases) or llama (RMSNorm,
    /// rotary positions, SwiGLU, grouped-query attention, no biases).
    #[arg(long, default_value = "gpt", value_parser = ["gpt", "llama"])]
    pub arch: String,
    /// Key/value heads of grouped-query attention (llama; a divisor of --heads)
    /// [default: half the heads when even].
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// Width of the MLP's hidden layer [default: 4 × hidden for gpt, 8/3 × hidden rounded
    /// up to a multiple of 32 for llama].
    #[arg(long)]
    pub ffn_hidden: Option<usize>,
    /// Base θ of the rotary position angles (llama).
    #[arg(long, default_value_t = 10_000.0)]
    pub rope_theta: f32,
    /// Share the token embedding with the LM head (the last stage holds a copy; the two
    /// copies' gradients are summed before every optimizer step).
    #[arg(long)]
    pub tie_embeddings: bool,
    #[command(flatten)]
    pub shape: crate::costs::ModelShapeArgs,
    /// Training data: a text file, a directory of files, or JSON lines with a "text" field
    /// (.jsonl); documents are tokenized, each ended by an end-of-text token, and packed into
    /// windows; the last tenth is held out [default: the built-in King James Bible excerpt].
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// BPE tokenizer: a tokenizer.json (Hugging Face's format) [default: bytes are the ids;
    /// on --resume the checkpoint's; with --init-from DIR, DIR/tokenizer.json if present].
    #[arg(long, conflicts_with = "train_tokenizer")]
    pub tokenizer: Option<PathBuf>,
    /// Train a byte-level BPE tokenizer of this many ids on the training data at start (saved
    /// with the checkpoints).
    #[arg(long)]
    pub train_tokenizer: Option<usize>,
    /// Optimizer steps.
    #[arg(long, default_value_t = 150)]
    pub steps: u64,
    /// Peak learning rate (AdamW).
    #[arg(long, default_value_t = 3e-3)]
    pub lr: f32,
    /// Linear warm-up steps.
    #[arg(long, default_value_t = 20)]
    pub warmup: u64,
    /// Global gradient-norm clipping threshold (0 = off).
    #[arg(long, default_value_t = 1.0)]
    pub max_grad_norm: f32,
    /// Seed of the initial weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Activation memory limit per rank: a size (64MiB, 1048576B), one size per rank
    /// (64MiB,48MiB), or a bare number, always a multiple of each rank's measured M_B (8).
    /// With --compute emulated only a multiple.
    #[arg(long, allow_hyphen_values = true, value_parser = crate::costs::parse_mem_limit)]
    pub mem_limit: Option<MemLimit>,
    /// real: train the model; emulated: passes sleep for --cost milliseconds.
    #[arg(long, value_parser = ["real", "emulated"], default_value = "real")]
    pub compute: String,
    /// Emulated pass times F,I,W of one rank's share, in milliseconds.
    #[arg(long, default_value = "2,2,2", allow_hyphen_values = true)]
    pub cost: String,
    /// Emulated link latency in milliseconds.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub comm: f64,
    /// Emulated latency of collective traffic (gradient all-reduce, the step's norm and loss
    /// reduction) in milliseconds.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub collective_latency: f64,
    /// Seconds a rank may wait for a message before the run fails.
    #[arg(long, default_value_t = 60.0)]
    pub recv_timeout: f64,
    /// Cores each rank computes on: its matrix products, row-wise kernels and attention
    /// sequences split over them (results do not change) [default: the machine's cores ÷
    /// the ranks on it, at least 1; under mpirun the ranks on this node]
    #[arg(long)]
    pub threads_per_rank: Option<usize>,
    /// Steps to measure before re-planning an automatic schedule (0 = never).
    #[arg(long, default_value_t = 2)]
    pub replan_after: u64,
    /// Held-out microbatch sets for the validation loss.
    #[arg(long, default_value_t = 2)]
    pub eval_sets: u64,
    /// Write the measured timeline as a Chrome/Perfetto trace.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Write one JSON line per step.
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Write the final report as JSON (tokens/s, step time and bubble measured and
    /// simulated, MFU, memory per rank measured and predicted, losses, the schedule used).
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Draw the last step's measured timeline above the simulator's plan for the same step
    /// (same scale and colours as `plan -f svg`), as SVG.
    #[arg(long)]
    pub timeline_svg: Option<PathBuf>,
    /// Serve live metrics in the Prometheus format at http://HOST:PORT/metrics while
    /// training (e.g. 127.0.0.1:9464; port 0 picks a free one).
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// Peak FLOP/s of all ranks together, the denominator of MFU [default: a GEMM probe of
    /// one core at start × the cores the ranks use].
    #[arg(long)]
    pub peak_flops: Option<f64>,
    /// Stop with an error after this many steps in a row with a non-finite loss (0 = never).
    #[arg(long, default_value_t = 3)]
    pub max_nan_steps: u64,
    /// Save checkpoints (weights, optimizer state, step, configuration) into this run
    /// directory, one `step-NNNNNN/` per save and `latest` naming the newest, at the end and
    /// every --save-every steps; written atomically.
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Allow --save to replace a checkpoint of another model.
    #[arg(long)]
    pub overwrite: bool,
    /// Also save every N steps (0 = only at the end).
    #[arg(long, default_value_t = 0)]
    pub save_every: u64,
    /// Keep only the newest K checkpoints in the --save directory (0 = keep all).
    #[arg(long, default_value_t = 0)]
    pub keep_last: usize,
    /// Continue from a checkpoint up to --steps steps in total (any schedule or stage
    /// count; the model flags and --microbatches must match the checkpoint's).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Start from the weights of a Hugging Face Llama model directory (`config.json` and
    /// `model.safetensors`, as `save_pretrained` or `nobubble export --format hf` write them):
    /// fine-tuning. The model comes from its config.json (--seq-len defaults to its
    /// max_position_embeddings); the optimizer starts fresh at step 0.
    #[arg(long, conflicts_with = "resume")]
    pub init_from: Option<PathBuf>,
    /// Post-validated optimizer steps: each rank steps at once with what it knows and the
    /// full gradient-norm check undoes the step afterwards if needed (copy: exact rollback
    /// from a saved copy; analytic: invert AdamW).
    #[arg(long, value_parser = ["copy", "analytic"], num_args = 0..=1, default_missing_value = "copy")]
    pub post_validate: Option<String>,
    /// Testing only: inject a fault (`panic-at:1F2`, `exit-at:1F2`, `lose-input-of:1F2`,
    /// `nan-grad-at:STEP`) to check that the run stops cleanly or post-validation recovers.
    #[arg(long, hide = true)]
    pub inject_fault: Option<String>,
}

fn parse_fault(text: &str) -> Result<Fault, String> {
    let bad = || {
        format!(
            "--inject-fault: `{text}` is not panic-at:ACTION, exit-at:ACTION, lose-input-of:ACTION or nan-grad-at:STEP"
        )
    };
    let (kind, arg) = text.split_once(':').ok_or_else(bad)?;
    let action = || arg.parse::<nobubble_schedule::Action>().map_err(|_| bad());
    Ok(match kind {
        "panic-at" => Fault::PanicAt(action()?),
        "exit-at" => Fault::ExitAt(action()?),
        "lose-input-of" => Fault::LoseInputOf(action()?),
        "nan-grad-at" => Fault::NanGradAt(arg.parse().map_err(|_| bad())?),
        _ => return Err(bad()),
    })
}

/// A runtime error as the CLI prints it: the planner's settings named by their flags.
fn runtime_error(e: RuntimeError) -> String {
    match e {
        RuntimeError::Plan(e) => crate::costs::cli_error(e),
        e => e.to_string(),
    }
}

/// The model of `--init-from DIR`: its config.json, with this run's sequence shape. Flags
/// that would describe another model are refused rather than ignored.
fn init_from_config(a: &TrainArgs, dir: &Path) -> Result<GptConfig, String> {
    let s = &a.shape;
    let set = [
        ("--layers", s.layers.is_some()),
        ("--hidden", s.hidden.is_some()),
        ("--heads", s.heads.is_some()),
        ("--kv-heads", a.kv_heads.is_some()),
        ("--ffn-hidden", a.ffn_hidden.is_some()),
        ("--arch llama", a.arch != "gpt"),
        ("--rope-theta", a.rope_theta != 10_000.0),
        ("--tie-embeddings", a.tie_embeddings),
    ];
    if let Some((flag, _)) = set.iter().find(|(_, given)| *given) {
        return Err(format!(
            "--init-from takes the model from {}; drop {flag}",
            dir.join("config.json").display()
        ));
    }
    let preset = GptConfig::preset(&a.model).map_err(|e| e.to_string())?;
    let b = s.microbatch_size.unwrap_or(preset.microbatch_size);
    nobubble_runtime::checkpoint::hf::read_config(dir, s.seq_len, b)
        .map_err(|e| format!("--init-from: {e}"))
}

fn model_config(a: &TrainArgs) -> Result<GptConfig, String> {
    let arch = Arch::parse(&a.arch).map_err(|e| e.to_string())?;
    let mut m = match &a.init_from {
        Some(dir) => init_from_config(a, dir)?,
        None => GptConfig::preset(&a.model).map_err(|e| e.to_string())?,
    };
    if a.init_from.is_some() {
        return checked_size(m);
    }
    if let Some(v) = a.shape.layers {
        m.layers = v;
    }
    if let Some(v) = a.shape.hidden {
        m.hidden = v;
    }
    if let Some(v) = a.shape.heads {
        m.heads = v;
    }
    if let Some(v) = a.shape.seq_len {
        m.seq_len = v;
    }
    if let Some(v) = a.shape.microbatch_size {
        m.microbatch_size = v;
    }
    let mut m = m.with_arch(arch);
    if a.kv_heads.is_some() {
        if arch != Arch::Llama {
            return Err("--kv-heads needs --arch llama (GPT blocks have a K/V per head)".into());
        }
        m.kv_heads = a.kv_heads;
    }
    m.ffn_hidden = a.ffn_hidden;
    m.rope_theta = a.rope_theta;
    m.tie_embeddings = a.tie_embeddings;
    m.validate().map_err(|e| e.to_string())?;
    checked_size(m)
}

/// Guards against typos that would try to allocate the machine away.
fn checked_size(m: GptConfig) -> Result<GptConfig, String> {
    let activation = m.tokens_per_microbatch() as f64 * m.hidden as f64 * 4.0;
    // Attention's probabilities, kept per layer from F to I: b · a · s² floats.
    let s = m.seq_len as f64;
    let scores = m.microbatch_size as f64 * m.heads as f64 * s * s * 4.0;
    let largest = activation.max(scores);
    if largest > (1u64 << 32) as f64 || m.parameter_count() > 1 << 31 {
        return Err(format!(
            "this model is too large for this trainer: {} parameters, {:.1} GiB per activation \
             tensor; reduce --hidden, --seq-len, --microbatch-size or --layers",
            m.parameter_count(),
            largest / (1u64 << 30) as f64
        ));
    }
    Ok(m)
}

/// The job the flags describe, checked before anything starts.
fn job(a: &TrainArgs) -> Result<TrainJob, String> {
    let (kind, file) = schedule_choice(a)?;
    let stages = file.as_ref().map_or(a.stages.unwrap_or(2), |s| s.ranks);
    let microbatches = file
        .as_ref()
        .map_or(a.microbatches.unwrap_or(8), |s| s.microbatches);
    if stages == 0 || microbatches == 0 || a.steps == 0 || a.data_parallel == 0 {
        return Err(
            "--stages, --data-parallel, --microbatches and --steps must be at least 1".into(),
        );
    }
    if stages * a.data_parallel > 4096 {
        return Err(format!(
            "--stages {} × --data-parallel {} is more ranks than this runtime supports (4096)",
            stages, a.data_parallel
        ));
    }
    let mut model = model_config(a)?;
    let data = data::load(a, &mut model)?;
    let model = checked_size(model)?;
    eprintln!("{}", data.description);
    let emulated = match a.compute.as_str() {
        "emulated" => {
            let t: Vec<f64> = a
                .cost
                .split(',')
                .map(|x| {
                    x.trim()
                        .parse::<f64>()
                        .map_err(|_| format!("--cost: `{x}` is not a number"))
                })
                .collect::<Result<_, _>>()?;
            if t.len() != 3 || t.iter().any(|v| !(v.is_finite() && *v > 0.0 && *v <= 1e6)) {
                return Err(
                    "--cost takes three positive milliseconds F,I,W (up to 1e6), e.g. --cost 2,2,2"
                        .into(),
                );
            }
            Some(CostSpec::uniform(
                RankCost {
                    f: t[0],
                    i: t[1],
                    w: t[2],
                    mem_b: 1.0,
                    mem_w: 0.5,
                },
                a.comm,
            ))
        }
        _ => None,
    };
    for (flag, v) in [
        ("--comm", a.comm),
        ("--collective-latency", a.collective_latency),
    ] {
        if !(v.is_finite() && (0.0..=1e6).contains(&v)) {
            return Err(format!(
                "{flag} must be between 0 and 1e6 milliseconds, got {v}"
            ));
        }
        if v > 0.0 && emulated.is_none() {
            return Err(format!(
                "{flag} emulates a link's latency and needs --compute emulated; real runs measure theirs"
            ));
        }
    }
    if emulated.is_some() && (a.save.is_some() || a.resume.is_some()) {
        return Err(
            "--save and --resume need real compute: emulated passes have no weights".into(),
        );
    }
    // Problems with where the results go are found now, not after the training.
    if let Some(dir) = &a.save {
        use nobubble_runtime::checkpoint_fs as fs;
        // Every step a save may write: the end, and each --save-every multiple before it.
        let every = a.save_every;
        let first = a.resume.as_deref().and_then(fs::peek_step).unwrap_or(0);
        let (last, overwrite) = (a.steps, a.overwrite);
        let saves = move |k: u64| {
            k > first && k <= last && (k == last || (every > 0 && k.is_multiple_of(every)))
        };
        fs::check_run_target(dir)
            .and_then(|_| match fs::resolve(dir) {
                Ok(latest) => fs::check_save_model(&latest, &model, a.overwrite),
                Err(_) => Ok(()),
            })
            .and_then(|_| fs::check_run_steps(dir, saves, overwrite))
            .map_err(|e| format!("--save: {e}"))?;
    }
    for (flag, path) in [
        ("--trace", &a.trace),
        ("--report", &a.report),
        ("--timeline-svg", &a.timeline_svg),
        ("--log", &a.log),
    ] {
        let Some(path) = path else { continue };
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        if parent.is_some_and(|p| !p.is_dir()) || path.is_dir() {
            return Err(format!(
                "cannot write {flag} {}: its directory does not exist or it is a directory",
                path.display()
            ));
        }
    }
    if let Some(f) = a.peak_flops {
        if emulated.is_some() {
            return Err(
                "--peak-flops sets MFU's peak, and emulated passes (they only sleep) have no MFU: \
                 leave --peak-flops out, or train with --compute real"
                    .into(),
            );
        }
        if !(f.is_finite() && f > 0.0) {
            return Err(format!(
                "--peak-flops must be a positive FLOP/s figure (e.g. 2e11), got {f}"
            ));
        }
    }
    if (a.save_every > 0 || a.keep_last > 0 || a.overwrite) && a.save.is_none() {
        return Err(
            "--save-every, --keep-last and --overwrite need --save DIR (where to write the checkpoints)"
                .into(),
        );
    }
    // Emulated passes hold no tensors: their memory is counted in M_B, so the limit is a
    // multiple of it, as for `plan`.
    let mem_limit = a.mem_limit.clone().unwrap_or_default();
    let below_one = mem_limit.as_multiple().is_some_and(|x| x < 1.0);
    if emulated.is_some() && (!mem_limit.budgets().is_empty() || below_one) {
        return Err(format!(
            "with --compute emulated, --mem-limit is a multiple of a rank's M_B (a bare number \
             ≥ 1, e.g. 8), got `{mem_limit}`"
        ));
    }
    if !(a.lr.is_finite() && a.lr > 0.0) {
        return Err(format!("--lr must be a positive number, got {}", a.lr));
    }
    if !(a.max_grad_norm.is_finite() && a.max_grad_norm >= 0.0) {
        return Err(format!(
            "--max-grad-norm must be zero (off) or positive, got {}",
            a.max_grad_norm
        ));
    }
    if !(a.recv_timeout.is_finite() && (0.001..=1e6).contains(&a.recv_timeout)) {
        return Err(format!(
            "--recv-timeout must be between 0.001 and 1e6 seconds, got {}",
            a.recv_timeout
        ));
    }
    let train = TrainConfig {
        seed: a.seed,
        data_seed: a.seed.wrapping_add(1),
        microbatches,
        optimizer: AdamWConfig {
            lr: a.lr,
            ..AdamWConfig::default()
        },
        warmup_steps: a.warmup,
        max_grad_norm: (a.max_grad_norm > 0.0).then_some(a.max_grad_norm),
        threads: threads_per_rank(a, stages * a.data_parallel)?,
    };
    Ok(TrainJob {
        session: SessionOptions {
            run: RunConfig {
                model,
                train,
                layout: StageLayout::Even,
                compute: Compute::Real,
                recv_timeout: Duration::from_secs_f64(a.recv_timeout),
                fault: a.inject_fault.as_deref().map(parse_fault).transpose()?,
                post_validate: match a.post_validate.as_deref() {
                    None => None,
                    Some("copy") => Some(Rollback::Copy),
                    Some(_) => Some(Rollback::Analytic),
                },
                data_parallel: a.data_parallel,
            },
            kind,
            file,
            ranks: stages,
            chunks: a.chunks,
            mem_limit,
            emulated,
            collective_ms: a.collective_latency,
            // Under a synchronous optimizer step every iteration waits for the slowest
            // rank (the makespan); post-validated steps let iterations tile (the span).
            objective: if a.post_validate.is_some() {
                Objective::Span
            } else {
                Objective::Makespan
            },
        },
        steps: a.steps,
        replan_after: a.replan_after,
        eval_sets: a.eval_sets,
        save: a.save.clone(),
        save_every: a.save_every,
        keep_last: a.keep_last,
        resume: a.resume.clone(),
        init_from: a.init_from.clone(),
        corpus: Arc::new(data.corpus),
        eval: Arc::new(data.eval),
        tokenizer: data.tokenizer,
        stop: None,
        max_nan_steps: a.max_nan_steps,
        overwrite: a.overwrite,
    })
}

/// `--schedule`: a family by name, or a schedule file (validated, and checked to be
/// trainable) whose name is its file stem.
fn schedule_choice(a: &TrainArgs) -> Result<(ScheduleKind, Option<Schedule>), String> {
    let path = Path::new(&a.schedule);
    // A schedule's name wins over a file of that name in the current directory.
    let looks_like_file = a.schedule.ends_with(".csv") || a.schedule.contains('/');
    let named = ScheduleKind::from_name(&a.schedule);
    if !looks_like_file && (named.is_ok() || !path.is_file()) {
        return Ok((
            named.map_err(|e| {
                format!("{e}; or give a schedule file in PyTorch's compute-only CSV format")
            })?,
            None,
        ));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--schedule: cannot read {}: {e}", path.display()))?;
    let name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("custom")
        .to_string();
    let invalid = |e: String| format!("--schedule {}: invalid schedule: {e}", path.display());
    let schedule = csv::read(&text, &name).map_err(|e| invalid(e.to_string()))?;
    nobubble_schedule::check_structure(&schedule)
        .and_then(|_| nobubble_schedule::check_weight_order(&schedule))
        .map_err(|e| invalid(e.to_string()))?;
    for (flag, given, from_file) in [
        ("--stages", a.stages, schedule.ranks),
        ("--microbatches", a.microbatches, schedule.microbatches),
    ] {
        if given.is_some_and(|g| g != from_file) {
            return Err(format!(
                "{flag} {} disagrees with --schedule {}, which has {from_file}; leave {flag} out \
                 (the file sets it)",
                given.unwrap_or(0),
                path.display()
            ));
        }
    }
    // The kind only names what is never consulted for a file (no re-planning).
    Ok((ScheduleKind::OneFOneB, Some(schedule)))
}

/// `--threads-per-rank`, or its default: this machine's cores shared by the ranks on it
/// (the job's ranks as threads; under mpirun, the node's ranks as Open MPI counts them).
fn threads_per_rank(a: &TrainArgs, world: usize) -> Result<usize, String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let local = match launch::launched_world_size() {
        Some(_) => std::env::var("OMPI_COMM_WORLD_LOCAL_SIZE")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(cores),
        None => world,
    };
    match a.threads_per_rank {
        Some(0) => Err("--threads-per-rank must be at least 1".into()),
        Some(t) if t * local > cores && a.compute == "real" => {
            eprintln!(
                "warning: --threads-per-rank {t} × {local} ranks on this machine is more than its {cores} cores: the ranks will slow each other down; use --threads-per-rank {}",
                (cores / local.max(1)).max(1)
            );
            Ok(t)
        }
        Some(t) => Ok(t),
        None => Ok((cores / local.max(1)).max(1)),
    }
}

/// Runs `train`; returns the exit status (0, or 128 + the signal that stopped the run).
pub fn run(a: &TrainArgs) -> Result<u8, String> {
    let launched = launch::launched_world_size();
    let mut job = job(a)?;
    job.stop = Some(crate::signals::install()?);
    match launched {
        Some(n) if cfg!(feature = "mpi") || n > 1 => run_mpi(a, &job, n),
        // One process under a launcher, without MPI built in: the ranks are threads.
        _ => {
            header(a, &job, "threads");
            let world = job.session.ranks * a.data_parallel;
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let threads = job.session.run.train.threads;
            let (watch, _server) = watch(a, &job, (world * threads).min(cores))?;
            let slot = std::sync::Mutex::new(Some(watch));
            let results = launch::threads(world, |ctx: RankContext| {
                if ctx.transport.rank() == 0 {
                    let mut watch = slot
                        .lock()
                        .ok()
                        .and_then(|mut w| w.take())
                        .ok_or_else(|| RuntimeError::Fault("internal: two ranks 0".into()))?;
                    let report = training::run(&job, ctx, Some(&mut watch))?;
                    Ok(report.map(|r| (r, watch)))
                } else {
                    training::run(&job, ctx, None).map(|_| None)
                }
            })
            .map_err(runtime_error)?;
            let (report, watch) = results
                .into_iter()
                .flatten()
                .next()
                .ok_or("internal: rank 0 made no report")?;
            crate::train::report::finish(a, &job, &report, watch)
        }
    }
}

/// Rank 0's watcher and, with --metrics-addr, the server showing its metrics (kept alive by
/// the caller until the report is out). `cores` is what the ranks compute on, for MFU.
fn watch(
    a: &TrainArgs,
    job: &TrainJob,
    cores: usize,
) -> Result<(Watch, Option<MetricsServer>), String> {
    let model = &job.session.run.model;
    let global_microbatches = job.session.run.train.microbatches * a.data_parallel;
    let real = job.session.emulated.is_none();
    let peak_flops = match a.peak_flops {
        Some(f) => Some(f),
        None if real => Some(nobubble_nn::bench::gemm_peak_flops(0.05) * cores as f64),
        None => None,
    };
    let metrics = a.metrics_addr.as_ref().map(|_| Metrics::new());
    let server = match (&a.metrics_addr, &metrics) {
        (Some(addr), Some(m)) => {
            let server = MetricsServer::start(addr, m.clone())?;
            eprintln!("serving metrics at http://{}/metrics", server.addr());
            Some(server)
        }
        _ => None,
    };
    let watch = Watch::new(WatchOptions {
        steps: a.steps,
        tokens_per_step: (global_microbatches * model.microbatch_size * model.seq_len) as f64,
        flops_per_step: model_flops_per_step(model, global_microbatches),
        peak_flops,
        log: a.log.as_deref(),
        trace: a.trace.is_some(),
        metrics,
        stop: job.stop.clone(),
    })?;
    Ok((watch, server))
}

#[cfg(feature = "mpi")]
fn run_mpi(a: &TrainArgs, job: &TrainJob, _launched: usize) -> Result<u8, String> {
    let (ctx, mpi) = nobubble_runtime::mpi::rank_context().map_err(|e| e.to_string())?;
    let rank = ctx.transport.rank();
    let size = ctx.transport.size();
    if let Err(e) = nobubble_runtime::check_world(size, job.session.ranks, a.data_parallel) {
        // Every rank says it (each may be read in its own log), and all finalize MPI.
        say(&format!("error: rank {rank}: {e}\n"));
        drop(ctx);
        drop(mpi);
        std::process::exit(1);
    }
    let fail = |msg: String| -> ! {
        if msg.starts_with("rank ") {
            say(&format!("error: {msg}\n"));
        } else {
            say(&format!("error: rank {rank}: {msg}\n"));
        }
        nobubble_runtime::mpi::abort_world(1)
    };
    let transport = ctx.transport.describe();
    // A panic must end the job too, not leave the other ranks waiting for this one.
    let abort = ctx.abort.clone();
    let run = |observer: Option<&mut dyn Observer>| {
        launch::guard(rank, &abort, || training::run(job, ctx, observer))
    };
    if rank == 0 {
        header(a, job, &transport);
        // Each rank of an MPI job computes on a core of its own.
        let (mut watch, server) =
            watch(a, job, size * job.session.run.train.threads).unwrap_or_else(|e| fail(e));
        match run(Some(&mut watch)) {
            Ok(Some(report)) => {
                let code = crate::train::report::finish(a, job, &report, watch)
                    .unwrap_or_else(|e| fail(e));
                drop(server);
                Ok(code)
            }
            Ok(None) => fail("internal: rank 0 made no report".into()),
            Err(e) => fail(runtime_error(e)),
        }
    } else {
        match run(None) {
            Ok(_) => Ok(0),
            Err(e) => fail(runtime_error(e)),
        }
    }
}

/// Writes `line` to stderr in one piece, so that the lines of several processes forwarded by
/// one launcher never interleave.
#[cfg(feature = "mpi")]
fn say(line: &str) {
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_: &TrainArgs, _: &TrainJob, launched: usize) -> Result<u8, String> {
    Err(format!(
        "this nobubble was built without MPI, but an MPI or Slurm launcher started it as one of \
         {launched} processes; rebuild with `cargo build --release --features mpi` (needs \
         libopenmpi-dev and libclang-dev), or run it directly without mpirun (ranks become threads)"
    ))
}

fn header(a: &TrainArgs, job: &TrainJob, transport: &str) {
    let model = &job.session.run.model;
    let dp = if a.data_parallel > 1 {
        format!(" × {} data-parallel replicas", a.data_parallel)
    } else {
        String::new()
    };
    let schedule = match &job.session.file {
        Some(s) => format!("{} (from {}, {} stages)", s.name, a.schedule, s.stages),
        None => job.session.kind.name().to_string(),
    };
    let heads = match model.arch {
        Arch::Llama => format!("{} heads, {} K/V heads", model.heads, model.kv_heads()),
        Arch::Gpt => format!("{} heads", model.heads),
    };
    eprintln!(
        "nobubble train: {schedule} on {} ranks{dp} ({transport}, {} thread{} each, {} kernels), {} microbatches of {}×{} tokens, model {} {} ({} layers, h {}, {heads}, {:.2} M parameters), {}",
        job.session.ranks,
        job.session.run.train.threads,
        if job.session.run.train.threads == 1 { "" } else { "s" },
        nobubble_nn::Simd::selected(),
        job.session.run.train.microbatches,
        model.microbatch_size,
        model.seq_len,
        model.arch.name(),
        a.model,
        model.layers,
        model.hidden,
        model.parameter_count() as f64 / 1e6,
        if job.session.emulated.is_none() { "real compute".to_string() } else { format!("emulated compute ({} ms, comm {} ms)", a.cost, a.comm) }
    );
}
