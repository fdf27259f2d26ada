//! `nobubble train`: train a GPT on text under any schedule, one worker thread per rank.

use clap::Args;
use nobubble_nn::{AdamWConfig, ByteCorpus, GptConfig, StageLayout, TrainConfig};
use nobubble_runtime::worker::Rollback;
use nobubble_runtime::{median_pass_ms, Compute, RunConfig, Session, SessionOptions, StepRecord};
use nobubble_schedule::{CostModel, CostSpec, RankCost, ScheduleKind};
use serde_json::json;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Arguments of `train`.
#[derive(Args, Debug)]
pub struct TrainArgs {
    /// Schedule (see `nobubble plan --help`); automatic ones are re-planned on measured costs.
    #[arg(long, short = 's', default_value = "zb-auto")]
    pub schedule: String,
    /// Pipeline ranks (one worker thread each).
    #[arg(long, short = 'p', default_value_t = 2)]
    pub stages: usize,
    /// Microbatches per step.
    #[arg(long, short = 'm', default_value_t = 8)]
    pub microbatches: usize,
    /// Model chunks per rank (interleaved schedules).
    #[arg(long, default_value_t = 2)]
    pub chunks: usize,
    /// Model preset: micro, tiny, small, medium.
    #[arg(long, default_value = "tiny")]
    pub model: String,
    /// Transformer blocks (overrides the preset).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Hidden size (overrides the preset).
    #[arg(long)]
    pub hidden: Option<usize>,
    /// Attention heads (overrides the preset).
    #[arg(long)]
    pub heads: Option<usize>,
    /// Sequence length in bytes (overrides the preset).
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Sequences per microbatch (overrides the preset).
    #[arg(long)]
    pub microbatch_size: Option<usize>,
    /// Training text (any UTF-8 file); default: the built-in King James Bible excerpt.
    #[arg(long)]
    pub data: Option<PathBuf>,
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
    /// Activation memory limit per rank: bytes, or with a KiB/MiB/GiB suffix (e.g. 64MiB).
    #[arg(long)]
    pub mem_limit: Option<String>,
    /// real: train the model; emulated: passes sleep for --cost milliseconds.
    #[arg(long, value_parser = ["real", "emulated"], default_value = "real")]
    pub compute: String,
    /// Emulated pass times F,I,W of one rank's share, in milliseconds.
    #[arg(long, default_value = "2,2,2")]
    pub cost: String,
    /// Emulated link latency in milliseconds.
    #[arg(long, default_value_t = 0.0)]
    pub comm: f64,
    /// Seconds a rank may wait for a message before the run fails.
    #[arg(long, default_value_t = 60.0)]
    pub recv_timeout: f64,
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
    /// Save a checkpoint (weights, optimizer state, step, configuration) to this
    /// directory at the end, and every --save-every steps; written atomically.
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Also save every N steps (0 = only at the end).
    #[arg(long, default_value_t = 0)]
    pub save_every: u64,
    /// Continue from a checkpoint up to --steps steps in total (any schedule or stage
    /// count; the model flags and --microbatches must match the checkpoint's).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Post-validated optimizer steps: each rank steps at once with what it knows and the
    /// full gradient-norm check undoes the step afterwards if needed (copy: exact rollback
    /// from a saved copy; analytic: invert AdamW).
    #[arg(long, value_parser = ["copy", "analytic"], num_args = 0..=1, default_missing_value = "copy")]
    pub post_validate: Option<String>,
}

fn parse_bytes(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let (num, mult) = [
        ("GiB", 1u64 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("GB", 1_000_000_000),
        ("MB", 1_000_000),
        ("KB", 1000),
        ("B", 1),
    ]
    .iter()
    .find_map(|(suf, m)| t.strip_suffix(suf).map(|n| (n.trim(), *m as f64)))
    .unwrap_or((t, 1.0));
    let v: f64 = num.parse().map_err(|_| {
        format!("--mem-limit: `{text}` is not a size; write e.g. 268435456, 256MiB or 1GiB")
    })?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("--mem-limit must be positive, got `{text}`"));
    }
    Ok(v * mult)
}

fn model_config(a: &TrainArgs) -> Result<GptConfig, String> {
    let mut m = GptConfig::preset(&a.model).map_err(|e| e.to_string())?;
    if let Some(v) = a.layers {
        m.layers = v;
    }
    if let Some(v) = a.hidden {
        m.hidden = v;
    }
    if let Some(v) = a.heads {
        m.heads = v;
    }
    if let Some(v) = a.seq_len {
        m.seq_len = v;
    }
    if let Some(v) = a.microbatch_size {
        m.microbatch_size = v;
    }
    m.validate().map_err(|e| e.to_string())?;
    // Guard against typos that would try to allocate the machine away.
    let activation = m.tokens_per_microbatch() as f64 * m.hidden as f64 * 4.0;
    if activation > (1u64 << 32) as f64 || m.parameter_count() > 1 << 31 {
        return Err(format!(
            "this model is too large for this trainer: {} parameters, {:.1} GiB per activation tensor; \
             reduce --hidden, --seq-len, --microbatch-size or --layers",
            m.parameter_count(),
            activation / (1u64 << 30) as f64
        ));
    }
    Ok(m)
}

/// Splits the text: the last tenth is held out for the validation loss.
fn corpora(a: &TrainArgs, m: &GptConfig) -> Result<(ByteCorpus, ByteCorpus), String> {
    let bytes = match &a.data {
        Some(path) => std::fs::read(path)
            .map_err(|e| format!("cannot read --data {}: {e}", path.display()))?,
        None => ByteCorpus::builtin().bytes().to_vec(),
    };
    let min = 10 * (m.seq_len + 1);
    if bytes.len() < min {
        return Err(format!(
            "the training text has {} bytes; with --seq-len {} it needs at least {min}",
            bytes.len(),
            m.seq_len
        ));
    }
    let cut = bytes.len() - bytes.len() / 10;
    let train = ByteCorpus::from_bytes(bytes[..cut].to_vec()).map_err(|e| e.to_string())?;
    let eval = ByteCorpus::from_bytes(bytes[cut..].to_vec()).map_err(|e| e.to_string())?;
    Ok((train, eval))
}

fn mib(b: f64) -> String {
    format!("{:.2} MiB", b / 1048576.0)
}

/// Runs `train`.
pub fn run(a: &TrainArgs) -> Result<(), String> {
    let kind = ScheduleKind::from_name(&a.schedule).map_err(|e| e.to_string())?;
    if a.stages == 0 || a.microbatches == 0 || a.steps == 0 {
        return Err("--stages, --microbatches and --steps must be at least 1".into());
    }
    let model = model_config(a)?;
    let (corpus, eval) = corpora(a, &model)?;
    // Kept for the checkpoint's data fingerprint (`Session::start` takes the corpus).
    let train_text = (a.save.is_some() || a.resume.is_some()).then(|| corpus.clone());
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
            if !(a.comm.is_finite() && (0.0..=1e6).contains(&a.comm)) {
                return Err(format!(
                    "--comm must be between 0 and 1e6 milliseconds, got {}",
                    a.comm
                ));
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
    if emulated.is_some() && (a.save.is_some() || a.resume.is_some()) {
        return Err(
            "--save and --resume need real compute: emulated passes have no weights".into(),
        );
    }
    // Problems with where the results go are found now, not after the training.
    if let Some(dir) = &a.save {
        nobubble_runtime::checkpoint_fs::check_save_target(dir)
            .map_err(|e| format!("--save: {e}"))?;
    }
    if let Some(path) = &a.trace {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        if parent.is_some_and(|p| !p.is_dir()) || path.is_dir() {
            return Err(format!(
                "cannot write --trace {}: its directory does not exist or it is a directory",
                path.display()
            ));
        }
    }
    if a.save_every > 0 && a.save.is_none() {
        return Err("--save-every needs --save DIR (where to write the checkpoints)".into());
    }
    // Real compute: a size in bytes. Emulated passes hold no tensors: the limit is in
    // multiples of a rank's M_B, as for `plan`.
    let mem_limit = match (&emulated, a.mem_limit.as_deref()) {
        (_, None) => None,
        (None, Some(text)) => Some(parse_bytes(text)?),
        (Some(_), Some(text)) => Some(text.trim().parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 1.0).ok_or_else(|| {
            format!("with --compute emulated, --mem-limit is in multiples of a rank's M_B (a number ≥ 1, e.g. 8), got `{text}`")
        })?),
    };
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
        microbatches: a.microbatches,
        optimizer: AdamWConfig {
            lr: a.lr,
            ..AdamWConfig::default()
        },
        warmup_steps: a.warmup,
        max_grad_norm: (a.max_grad_norm > 0.0).then_some(a.max_grad_norm),
        threads: 1,
    };
    let train_config = train.clone();
    let opts = SessionOptions {
        run: RunConfig {
            model: model.clone(),
            train,
            layout: StageLayout::Even,
            compute: Compute::Real,
            recv_timeout: Duration::from_secs_f64(a.recv_timeout),
            fault: None,
            post_validate: match a.post_validate.as_deref() {
                None => None,
                Some("copy") => Some(Rollback::Copy),
                Some(_) => Some(Rollback::Analytic),
            },
        },
        kind,
        ranks: a.stages,
        chunks: a.chunks,
        mem_limit,
        emulated: emulated.clone(),
    };
    let real = emulated.is_none();
    eprintln!(
        "nobubble train: {} on {} ranks, {} microbatches of {}×{} bytes, model {} ({} layers, h {}, {} heads, {:.2} M parameters), {}",
        kind.name(),
        a.stages,
        a.microbatches,
        model.microbatch_size,
        model.seq_len,
        a.model,
        model.layers,
        model.hidden,
        model.heads,
        model.parameter_count() as f64 / 1e6,
        if real { "real compute".to_string() } else { format!("emulated compute ({} ms, comm {} ms)", a.cost, a.comm) }
    );
    let mut session = Session::start(opts, corpus, eval).map_err(|e| e.to_string())?;
    let first_step = match &a.resume {
        Some(dir) => crate::sample::resume(
            &mut session,
            dir,
            &model,
            &train_config,
            train_text.as_ref().expect("kept for --resume"),
            a.steps,
        )?,
        None => 0,
    };
    if real {
        let bytes: Vec<String> = session
            .stage_bytes
            .iter()
            .map(|(f, i)| format!("{}/{}", mib(*f as f64), mib(*i as f64)))
            .collect();
        eprintln!(
            "measured activation memory per stage (after F / after I): {}",
            bytes.join(", ")
        );
    }
    let val_before = if real {
        Some(
            session
                .validation_loss(a.eval_sets)
                .map_err(|e| e.to_string())?,
        )
    } else {
        None
    };
    let tokens_per_step = (a.microbatches * model.microbatch_size * model.seq_len) as f64;
    let tty = std::io::stderr().is_terminal();
    let mut log = match &a.log {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p)
                .map_err(|e| format!("cannot create --log {}: {e}", p.display()))?,
        )),
        None => None,
    };
    let mut records: Vec<StepRecord> = Vec::new();
    let mut trace_events = Vec::new();
    let started = Instant::now();
    let mut trace_offset = 0.0;
    let mut replanned = false;
    // Index of the first step run under the current plan.
    let mut plan_since = 0usize;
    for step in first_step..a.steps {
        let rec = session.step().map_err(|e| format!("step {step}: {e}"))?;
        let tps = tokens_per_step / rec.wall;
        let peak = rec.peak_bytes.iter().copied().max().unwrap_or(0);
        if let Some(w) = log.as_mut() {
            let line = json!({"step": rec.step, "loss": rec.loss, "grad_norm": rec.grad_norm, "lr": rec.lr,
                "skipped": rec.skipped, "tokens_per_s": tps, "step_seconds": rec.wall,
                "bubble_fraction": rec.bubble_fraction, "peak_activation_bytes": rec.peak_bytes,
                "schedule": session.plan.schedule.name});
            writeln!(w, "{line}").map_err(|e| format!("cannot write --log: {e}"))?;
        }
        if a.trace.is_some() {
            for (rank, slots) in rec.timeline.iter().enumerate() {
                for s in slots {
                    trace_events.push(json!({"name": format!("{}{}", s.action.kind.letter(), s.action.microbatch),
                        "cat": s.action.kind.letter().to_string(), "ph": "X", "pid": rank, "tid": s.action.stage,
                        "ts": (trace_offset + s.start) * 1e6, "dur": (s.end - s.start) * 1e6,
                        "args": {"step": rec.step, "waited_ms": s.waited * 1e3}}));
                }
            }
            trace_offset += rec.wall;
        }
        let line = format!(
            "step {:>4}/{}  loss {:.4}  {:>8.0} tok/s  bubble {:>5.1}%  peak act {}",
            step + 1,
            a.steps,
            rec.loss,
            tps,
            100.0 * rec.bubble_fraction,
            mib(peak as f64)
        );
        if tty {
            eprint!("\r{line}   ");
        } else if step % 10 == 0 || step + 1 == a.steps {
            eprintln!("{line}");
        }
        records.push(rec);
        if let Some(dir) = &a.save {
            let last = step + 1 == a.steps;
            if last || (a.save_every > 0 && (step + 1) % a.save_every == 0) {
                if tty {
                    eprintln!();
                }
                let text = train_text.as_ref().expect("kept for --save");
                crate::sample::save_to(&session, dir, &model, &train_config, text)?;
            }
        }
        let steps_left = a.steps > first_step + records.len() as u64;
        if !replanned && steps_left && a.replan_after > 0 && records.len() as u64 == a.replan_after
        {
            replanned = true;
            let before = session.plan.schedule.clone();
            if let Some(plan) = session
                .replan_on_measurements(&records)
                .map_err(|e| e.to_string())?
            {
                if tty {
                    eprintln!();
                }
                let t = &plan.costs.stages;
                let times: Vec<String> = t
                    .iter()
                    .map(|c| format!("{:.2}/{:.2}/{:.2}", c.f, c.i, c.w))
                    .collect();
                eprintln!(
                    "re-planned {} on measured pass times (F/I/W ms per stage: {}): simulated step {:.1} ms, bubble {:.1}%{}",
                    kind.name(),
                    times.join(", "),
                    plan.simulated_makespan,
                    100.0 * plan.simulated_bubble_fraction,
                    if plan.schedule.orders == before.orders { " (same order as before)" } else { "" }
                );
                if plan.schedule.orders != before.orders {
                    // The summary compares measurements with the plan that produced them.
                    plan_since = records.len();
                }
            }
        }
    }
    if tty {
        eprintln!();
    }
    let elapsed = started.elapsed().as_secs_f64();
    // Summary over the steps run under the final plan (the first step of a run is warm-up).
    let skip = plan_since.max(1).min(records.len().saturating_sub(1));
    let tail = &records[skip..];
    let mean =
        |f: &dyn Fn(&StepRecord) -> f64| tail.iter().map(f).sum::<f64>() / tail.len().max(1) as f64;
    let step_ms = mean(&|r| r.makespan) * 1e3;
    let bubble = mean(&|r| r.bubble_fraction);
    // Simulated step time with the measured pass times.
    let measured_costs = measured_costs(tail, &session.plan.costs);
    let sim = nobubble_schedule::simulate(&session.plan.schedule, &measured_costs)
        .map_err(|e| e.to_string())?;
    let trained = a.steps - first_step;
    println!(
        "\ntrained {} steps in {:.1} s ({:.0} tokens/s)",
        trained,
        elapsed,
        tokens_per_step * trained as f64 / elapsed
    );
    if real {
        println!(
            "final training loss {:.4}",
            records.last().map(|r| r.loss).unwrap_or(f32::NAN)
        );
    }
    if real {
        let after = session
            .validation_loss(a.eval_sets)
            .map_err(|e| e.to_string())?;
        let when = if first_step > 0 {
            format!("at step {first_step}, where this run resumed")
        } else {
            "before training".to_string()
        };
        println!(
            "validation loss {:.4} ({when} {:.4})",
            after,
            val_before.unwrap_or(f32::NAN)
        );
    }
    println!(
        "step time: measured {:.2} ms, simulated {:.2} ms from the measured pass times ({:+.1}%)",
        step_ms,
        sim.metrics.makespan,
        100.0 * (step_ms / sim.metrics.makespan - 1.0)
    );
    println!(
        "bubble fraction: measured {:.1}%, simulated {:.1}%",
        100.0 * bubble,
        100.0 * sim.metrics.bubble_fraction
    );
    if real {
        let measured: Vec<usize> = (0..session.plan.schedule.ranks)
            .map(|r| tail.iter().map(|x| x.peak_bytes[r]).max().unwrap_or(0))
            .collect();
        for (r, m) in measured.iter().enumerate() {
            println!(
                "rank {r}: peak activation memory {} (planner predicted {})",
                mib(*m as f64),
                mib(session.plan.predicted_peak[r])
            );
        }
    }
    if let Some(w) = log.as_mut() {
        w.flush().map_err(|e| format!("cannot write --log: {e}"))?;
    }
    if let Some(path) = &a.trace {
        let text =
            serde_json::to_string(&json!({"traceEvents": trace_events})).expect("serializes");
        crate::report::emit(Some(path), &text)?;
    }
    Ok(())
}

/// Median measured pass times (ms) per stage, with the plan's memory, for simulating the
/// schedule that ran; a fused B is split in the plan's I:W proportion.
fn measured_costs(records: &[StepRecord], plan: &CostModel) -> CostModel {
    let medians = median_pass_ms(records, plan.stages.len());
    let stages = medians
        .into_iter()
        .zip(&plan.stages)
        .map(|([f, i, w, b], p)| {
            let f = f.unwrap_or(p.f);
            let (i, w) = match (i, w, b) {
                (Some(i), Some(w), _) => (i, w),
                (_, _, Some(b)) => {
                    let share = p.i / (p.i + p.w);
                    (b * share, b * (1.0 - share))
                }
                _ => (p.i, p.w),
            };
            RankCost {
                f,
                i: i.max(1e-6),
                w: w.max(1e-6),
                mem_b: p.mem_b,
                mem_w: p.mem_w,
            }
        })
        .collect();
    CostModel {
        stages,
        comm: plan.comm,
    }
}
