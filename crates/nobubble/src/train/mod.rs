//! `nobubble train`: train a GPT on text under any schedule. Parses the flags (checked into
//! a job by [`job`]), starts the ranks — threads of this process, or this process as one rank of an MPI job
//! (`mpirun -np N nobubble train …`) — runs [`nobubble_runtime::training::run`] on each, and
//! prints rank 0's progress and report.

pub mod data;
mod job;
pub mod report;
mod trace;
pub mod watch;

use crate::output::tell;
use crate::train::watch::{Watch, WatchOptions};
use clap::Args;
use nobubble_nn::config::Arch;
use nobubble_runtime::launch::{self, RankContext};
use nobubble_runtime::metrics::{model_flops_per_step, Metrics, MetricsServer};
#[cfg(feature = "mpi")]
use nobubble_runtime::training::Observer;
use nobubble_runtime::training::{self, TrainJob};
use nobubble_runtime::RuntimeError;
use nobubble_schedule::{MemLimit, OwnLayout};
#[cfg(feature = "mpi")]
use std::io::Write;
use std::path::PathBuf;

/// `--cost` under `--compute emulated` when not given: F, I and W of 2 ms each.
pub(crate) const DEFAULT_EMULATED_COST: &str = "2,2,2";

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
    /// Model chunks per rank (interleaved schedules) [default: 2].
    #[arg(long)]
    pub chunks: Option<usize>,
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
    /// Base θ of the rotary position angles (llama) [default: 10000].
    #[arg(long)]
    pub rope_theta: Option<f32>,
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
    /// Emulated pass times F,I,W of one rank's share, in milliseconds, and B where a fused
    /// backward is not I + W [default: 2,2,2].
    #[arg(long, allow_hyphen_values = true)]
    pub cost: Option<String>,
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
    /// training (e.g. 127.0.0.1:9464; `:9464` listens on every interface, a bare `9464` on
    /// this machine only; port 0 picks a free one).
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
    /// Allow --save to replace a checkpoint of another model, or to save into a directory
    /// holding another run's checkpoints (they stay, but for those at this run's steps, and
    /// --keep-last may delete the older ones).
    #[arg(long)]
    pub overwrite: bool,
    /// Also save every N steps (0 = only at the end).
    #[arg(long, default_value_t = 0)]
    pub save_every: u64,
    /// Keep only the newest K checkpoints in the --save directory (0 = keep all), and the
    /// newest one a later step trained on to a finite loss.
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

/// A runtime error as the CLI prints it: the planner's settings named by their flags.
fn runtime_error(e: RuntimeError) -> String {
    match e {
        RuntimeError::Plan(e) => crate::costs::cli_error(e),
        e => e.to_string(),
    }
}

/// The passes of the schedule an emulated run will plan (F, I and W of every microbatch on
/// every stage; zb-auto plans V only on small pipelines, which fit anyway).
fn emulated_passes(s: &nobubble_runtime::session::SessionOptions) -> usize {
    if let Some(file) = &s.file {
        return file.orders.iter().map(Vec::len).sum();
    }
    let stages = match s.kind.own_layout() {
        OwnLayout::V => 2 * s.ranks,
        OwnLayout::Looped => s.chunks * s.ranks,
        OwnLayout::Linear | OwnLayout::Either => s.ranks,
    };
    3 * stages * s.run.train.microbatches
}

/// Locks the `--save` directory for this run (creating it: an unwritable one fails now, not
/// after the training); held until the run ends.
fn lock_save(a: &TrainArgs) -> Result<Option<nobubble_runtime::checkpoint_fs::RunLock>, String> {
    a.save
        .as_deref()
        .map(nobubble_runtime::checkpoint_fs::lock_run)
        .transpose()
        .map_err(|e| format!("--save: {e}"))
}

/// Runs `train`; returns the exit status (0, or 128 + the signal that stopped the run; a
/// closed output counts as SIGPIPE's, even when it closed only after the last step, since
/// lines were lost).
pub fn run(a: &TrainArgs) -> Result<u8, String> {
    let status = run_job(a)?;
    let (stdout, stderr) = crate::output::closed();
    if status != 0 || !(stdout || stderr) {
        return Ok(status);
    }
    if stdout {
        tell!(
            "error: cannot write {}: some lines of the run's report were not printed \
             (--report FILE keeps the summary)",
            crate::output::failure().unwrap_or("standard output")
        );
    }
    Ok(128 + crate::signals::OUTPUT_CLOSED as u8)
}

fn run_job(a: &TrainArgs) -> Result<u8, String> {
    let launched = launch::launched_world_size();
    let mut job = job::job(a)?;
    job.stop = Some(crate::signals::install()?);
    match launched {
        Some(n) if cfg!(feature = "mpi") || n > 1 => run_mpi(a, &job, n),
        // One process under a launcher, without MPI built in: the ranks are threads.
        _ => {
            let _lock = lock_save(a)?;
            let world = job.session.ranks * a.data_parallel;
            if job.session.emulated.is_none() {
                nobubble_runtime::machine::check_weights(&job.session.run.model, a.data_parallel)?;
            } else {
                nobubble_runtime::machine::check_emulated(world, emulated_passes(&job.session))?;
            }
            let threads = job.session.run.train.threads;
            let lender = launch::lender_for(world, threads, job.session.emulated.is_none());
            header(a, &job, "threads", lender.is_some());
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let (mut watch, _server) = watch(a, &job, (world * threads).min(cores))?;
            // Planning and building many ranks takes a while: say so until the plan is in use.
            let (setup_done, setup) = std::sync::mpsc::channel();
            watch.setup_done = Some(setup_done);
            let label = format!("setting up {world} ranks: planning, building the stages");
            let _shown = crate::progress::show_until(&label, setup);
            let slot = std::sync::Mutex::new(Some(watch));
            let results = launch::threads(world, lender, |ctx: RankContext| {
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
        None if real => Some(nobubble_nn::bench::gemm_peak_flops(0.2) * cores as f64),
        None => None,
    };
    let metrics = a.metrics_addr.as_ref().map(|_| Metrics::new());
    let server = match (&a.metrics_addr, &metrics) {
        (Some(addr), Some(m)) => {
            let server = MetricsServer::start(addr, m.clone())?;
            tell!("serving metrics at http://{}/metrics", server.addr());
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
        append_log: a.resume.is_some(),
        trace: a.trace.as_deref(),
        emulated: !real,
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
        let _lock = lock_save(a).unwrap_or_else(|e| fail(e));
        // MPI ranks are processes: none lends its core to another.
        header(a, job, &transport, false);
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

/// The run's first line; `lent`: the ranks share a lender ([`launch::lender_for`]).
fn header(a: &TrainArgs, job: &TrainJob, transport: &str, lent: bool) {
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
    let threads = job.session.run.train.threads;
    let lent = if lent {
        ", cores lent while waiting"
    } else {
        ""
    };
    tell!(
        "nobubble train: {schedule} on {} rank{}{dp} ({transport}, {} thread{} each{lent}, {} kernels), {} microbatches of {}×{} tokens, model {} {} ({} layers, h {}, {heads}, {:.2} M parameters), {}",
        job.session.ranks,
        if job.session.ranks == 1 { "" } else { "s" },
        threads,
        if threads == 1 { "" } else { "s" },
        nobubble_nn::Simd::selected(),
        job.session.run.train.microbatches,
        model.microbatch_size,
        model.seq_len,
        model.arch.name(),
        // The preset names no model that came from --init-from's config.json.
        match &a.init_from {
            Some(dir) => format!("from {}", dir.display()),
            None => a.model.clone(),
        },
        model.layers,
        model.hidden,
        model.parameter_count() as f64 / 1e6,
        if job.session.emulated.is_none() { "real compute".to_string() } else { format!("emulated compute ({} ms, comm {} ms)", a.cost.as_deref().unwrap_or(DEFAULT_EMULATED_COST), a.comm) }
    );
    // Resuming an earlier step into the run that holds later ones: its saves become
    // `latest`, which a later plain --resume of that directory continues.
    if let (Some(from), Some(save)) = (&a.resume, &a.save) {
        use nobubble_runtime::checkpoint_fs as fs;
        let step = fs::peek_step(from).unwrap_or(0);
        let later: Vec<String> = fs::saved_steps(save)
            .into_iter()
            .filter(|&s| s > step)
            .map(|s| s.to_string())
            .collect();
        if !later.is_empty() && a.steps > step {
            tell!(
                "note: resuming step {step} into {}, which holds later steps ({}): this run's \
                 checkpoints become its `latest` (the later ones stay, and are replaced where \
                 this run saves the same step)",
                save.display(),
                later.join(", ")
            );
        }
    }
    // Megatron's and torchtitan's users save where they load from; here --save is separate.
    if let (Some(dir), None) = (&a.resume, &a.save) {
        // A step directory's run directory is the one to continue.
        let dir = job::run_of_step(dir).unwrap_or(dir);
        tell!(
            "note: resuming without --save: this run's checkpoints are not saved (add --save {} \
             to continue that run directory)",
            dir.display()
        );
    }
}
