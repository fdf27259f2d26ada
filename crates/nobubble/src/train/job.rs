//! The training job the flags of `train` describe: the model, the data, the schedule and the
//! runtime's settings, with every flag checked before anything starts (a typo found after an
//! hour of training loses the hour).

use super::{data, TrainArgs};
use crate::output::tell;
use nobubble_nn::config::Arch;
use nobubble_nn::{AdamWConfig, GptConfig, StageLayout, TrainConfig};
use nobubble_runtime::launch;
use nobubble_runtime::training::TrainJob;
use nobubble_runtime::worker::Rollback;
use nobubble_runtime::Fault;
use nobubble_runtime::{Compute, RunConfig, SessionOptions};
use nobubble_schedule::export::csv;
use nobubble_schedule::{CostSpec, MemLimit, Objective, RankCost, Schedule, ScheduleKind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The job the flags describe, checked before anything starts.
pub(super) fn job(a: &TrainArgs) -> Result<TrainJob, String> {
    let (kind, file) = schedule_choice(a)?;
    let (stages, microbatches) = pipeline_shape(a, file.as_ref())?;
    let mut model = model_config(a)?;
    // The flags' own checks first: a typo is reported before a large corpus is read.
    let emulated = emulated_costs(a)?;
    check_emulation(a, emulated.is_some())?;
    check_run_flags(a, emulated.is_some())?;
    let mem_limit = mem_limit(a, emulated.is_some())?;
    check_numbers(a)?;
    let data = data::load(a, &mut model)?;
    let model = checked_size(model)?;
    tell!("{}", data.description);
    check_outputs(a, &model)?;
    let per_set = (microbatches * a.data_parallel * model.microbatch_size * model.seq_len) as u64;
    let held_out = data.eval.len() as u64;
    if emulated.is_none() && a.eval_sets > 1 && a.eval_sets.saturating_mul(per_set) > 2 * held_out {
        tell!(
            "warning: --eval-sets {} reads {} tokens per validation, {:.0}× the {held_out} \
             held-out tokens: the sets repeat the same text; {} or fewer cover it",
            a.eval_sets,
            a.eval_sets.saturating_mul(per_set),
            (a.eval_sets.saturating_mul(per_set)) as f64 / held_out.max(1) as f64,
            held_out.div_ceil(per_set).max(1)
        );
    }
    let run = RunConfig {
        model,
        train: train_config(a, microbatches, stages * a.data_parallel)?,
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
    };
    Ok(TrainJob {
        session: SessionOptions {
            run,
            kind,
            file,
            ranks: stages,
            chunks: chunks(a, kind)?,
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
            plans: Default::default(),
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

/// Ranks and microbatches: the flags', or the schedule file's.
fn pipeline_shape(a: &TrainArgs, file: Option<&Schedule>) -> Result<(usize, usize), String> {
    let stages = file.map_or(a.stages.unwrap_or(2), |s| s.ranks);
    let microbatches = file.map_or(a.microbatches.unwrap_or(8), |s| s.microbatches);
    if stages == 0 || microbatches == 0 || a.steps == 0 || a.data_parallel == 0 {
        return Err(
            "--stages, --data-parallel, --microbatches and --steps must be at least 1".into(),
        );
    }
    let most = nobubble_schedule::schedule::MAX_RANKS;
    if stages.saturating_mul(a.data_parallel) > most {
        return Err(format!(
            "--stages {} × --data-parallel {} is more ranks than this runtime supports ({most})",
            stages, a.data_parallel
        ));
    }
    Ok((stages, microbatches))
}

/// With `--compute emulated`, the passes' times from `--cost` (the ranks only sleep).
fn emulated_costs(a: &TrainArgs) -> Result<Option<CostSpec>, String> {
    if a.compute != "emulated" {
        if a.cost.is_some() {
            return Err(
                "--cost sets the emulated passes' times and needs --compute emulated; real runs \
                 measure theirs"
                    .into(),
            );
        }
        return Ok(None);
    }
    let text = a.cost.as_deref().unwrap_or(super::DEFAULT_EMULATED_COST);
    let t = crate::costs::numbers("--cost", text, 3..=4, "2,2,2")?;
    if t.iter().any(|v| !(v.is_finite() && *v > 0.0 && *v <= 1e6)) {
        return Err(format!(
            "--cost takes positive milliseconds F,I,W (up to 1e6), and B for a fused backward              that is not I + W, e.g. --cost 2,2,2 or 2,2,2,3; got `{text}`"
        ));
    }
    let cost = RankCost {
        f: t[0],
        i: t[1],
        w: t[2],
        mem_b: 1.0,
        mem_w: 0.5,
        b: t.get(3).copied(),
    };
    Ok(Some(CostSpec::uniform(cost, a.comm)))
}

/// Flags that only emulated runs take, and those they cannot take.
fn check_emulation(a: &TrainArgs, emulated: bool) -> Result<(), String> {
    for (flag, v) in [
        ("--comm", a.comm),
        ("--collective-latency", a.collective_latency),
    ] {
        if !(v.is_finite() && (0.0..=1e6).contains(&v)) {
            return Err(format!(
                "{flag} must be between 0 and 1e6 milliseconds, got {v}"
            ));
        }
        if v > 0.0 && !emulated {
            return Err(format!(
                "{flag} emulates a link's latency and needs --compute emulated; real runs measure theirs"
            ));
        }
    }
    if emulated && (a.save.is_some() || a.resume.is_some()) {
        return Err(
            "--save and --resume need real compute: emulated passes have no weights".into(),
        );
    }
    Ok(())
}

/// Problems with where the results go, found now rather than after the training.
fn check_outputs(a: &TrainArgs, model: &GptConfig) -> Result<(), String> {
    if let Some(dir) = &a.save {
        use nobubble_runtime::checkpoint_fs as fs;
        // Every step a save may write: the end, and each --save-every multiple before it.
        let every = a.save_every;
        let first = a.resume.as_deref().and_then(fs::peek_step).unwrap_or(0);
        let (last, overwrite) = (a.steps, a.overwrite);
        let saves = move |k: u64| {
            k > first && k <= last && (k == last || (every > 0 && k.is_multiple_of(every)))
        };
        let resumes_here = a.resume.as_deref().is_some_and(|r| same_run(r, dir));
        fs::check_run_target(dir)
            .and_then(|_| match fs::resolve(dir) {
                Ok(latest) => fs::check_save_model(&latest, model, a.overwrite),
                Err(_) => Ok(()),
            })
            .and_then(|_| match overwrite {
                true => Ok(()),
                false => fs::check_other_run(dir, resumes_here),
            })
            .and_then(|_| fs::check_run_steps(dir, saves, overwrite))
            .map_err(|e| format!("--save: {e}"))?;
    }
    let outputs = [
        ("--trace", &a.trace),
        ("--report", &a.report),
        ("--timeline-svg", &a.timeline_svg),
        ("--log", &a.log),
    ];
    // One file for two outputs: the second would silently replace the first.
    let files: Vec<(&str, PathBuf)> = outputs
        .iter()
        .filter_map(|(flag, path)| Some((*flag, same_file_key(path.as_deref()?)?)))
        .collect();
    for (i, (flag, key)) in files.iter().enumerate() {
        if let Some((other, _)) = files[..i].iter().find(|(_, k)| k == key) {
            return Err(format!(
                "{other} and {flag} name the same file {}: give each its own",
                key.display()
            ));
        }
    }
    // `--save run --log run/log.jsonl`: the run directory the save makes anyway, made now.
    if let Some(dir) = a.save.as_deref().filter(|d| !d.exists()) {
        let folder_of = |p: &Option<PathBuf>| p.as_deref().and_then(Path::parent) == Some(dir);
        if outputs.iter().any(|(_, p)| folder_of(p)) {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("--save: cannot create {}: {e}", dir.display()))?;
        }
    }
    for (flag, path) in outputs {
        let Some(path) = path else { continue };
        if path.is_dir() {
            return Err(format!(
                "cannot write {flag} {}: it is a directory; give a file name",
                path.display()
            ));
        }
        // Written at the end: find out now whether it can be.
        crate::output::check_folder(path)
            .and_then(|_| crate::output::check_writable(path))
            .map_err(|e| format!("{flag}: {e}"))?;
    }
    Ok(())
}

/// What identifies the file `path` names, to find two outputs given one file: an existing
/// file's device and inode, a new one's folder resolved (links, `..`) and name; `None` for
/// what takes any number of writers (`-`, devices, FIFOs, terminals).
fn same_file_key(path: &Path) -> Option<PathBuf> {
    // /dev/null by name too: in some containers it is a regular (empty) file.
    if crate::output::written_through(path) || path == Path::new("/dev/null") {
        return None;
    }
    if let Ok(meta) = std::fs::metadata(path) {
        use std::os::unix::fs::MetadataExt;
        return meta
            .is_file()
            .then(|| PathBuf::from(format!("{}:{}", meta.dev(), meta.ino())));
    }
    let name = path.file_name()?;
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let folder = folder
        .canonicalize()
        .unwrap_or_else(|_| folder.to_path_buf());
    Some(folder.join(name))
}

/// `--chunks`: only the interleaved schedules take it (default 2); refused elsewhere rather
/// than ignored.
fn chunks(a: &TrainArgs, kind: ScheduleKind) -> Result<usize, String> {
    let interleaved = kind.own_layout() == nobubble_schedule::OwnLayout::Looped;
    match a.chunks {
        Some(_) if !interleaved => Err(format!(
            "--chunks is for interleaved-1f1b and interleaved-zb; {} sets its own (leave it out)",
            kind.name()
        )),
        Some(c) => Ok(c),
        None => Ok(2),
    }
}

/// Whether `resume` is the run directory `run` or one of its step directories.
fn same_run(resume: &std::path::Path, run: &std::path::Path) -> bool {
    let Ok(d) = run.canonicalize() else {
        return false;
    };
    // The step directory's own path is not resolved: it may be a link to elsewhere.
    resume.canonicalize().is_ok_and(|r| r == d)
        || run_of_step(resume)
            .and_then(|p| p.canonicalize().ok())
            .is_some_and(|p| p == d)
}

/// The run directory holding `dir` when `dir` is a step directory (`…/step-NNNNNN`).
pub(super) fn run_of_step(dir: &Path) -> Option<&Path> {
    let is_step = dir
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("step-"));
    let parent = dir.parent().map(|p| match p.as_os_str().is_empty() {
        true => Path::new("."),
        false => p,
    });
    parent.filter(|_| is_step)
}

/// `--peak-flops`, and the checkpoint flags that need `--save`.
fn check_run_flags(a: &TrainArgs, emulated: bool) -> Result<(), String> {
    if let Some(f) = a.peak_flops {
        if emulated {
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
    Ok(())
}

/// `--mem-limit`. Emulated passes hold no tensors: their memory is counted in M_B, so the
/// limit is a multiple of it, as for `plan`.
fn mem_limit(a: &TrainArgs, emulated: bool) -> Result<MemLimit, String> {
    let mem_limit = a.mem_limit.clone().unwrap_or_default();
    let below_one = mem_limit.as_multiple().is_some_and(|x| x < 1.0);
    if emulated && (!mem_limit.budgets().is_empty() || below_one) {
        return Err(format!(
            "with --compute emulated, --mem-limit is a multiple of a rank's M_B (a bare number \
             ≥ 1, e.g. 8), got `{mem_limit}`"
        ));
    }
    Ok(mem_limit)
}

/// The optimizer's numbers and the receive deadline.
fn check_numbers(a: &TrainArgs) -> Result<(), String> {
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
    Ok(())
}

/// What every rank's trainer runs with; `world` ranks share this machine's cores.
fn train_config(a: &TrainArgs, microbatches: usize, world: usize) -> Result<TrainConfig, String> {
    Ok(TrainConfig {
        seed: a.seed,
        data_seed: a.seed.wrapping_add(1),
        microbatches,
        optimizer: AdamWConfig {
            lr: a.lr,
            ..AdamWConfig::default()
        },
        warmup_steps: a.warmup,
        max_grad_norm: (a.max_grad_norm > 0.0).then_some(a.max_grad_norm),
        threads: threads_per_rank(a, world)?,
    })
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
        ("--rope-theta", a.rope_theta.is_some()),
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
    if let Some(theta) = a.rope_theta {
        if arch != Arch::Llama {
            return Err(
                "--rope-theta needs --arch llama (GPT blocks learn their positions)".into(),
            );
        }
        m.rope_theta = theta;
    }
    m.ffn_hidden = a.ffn_hidden;
    m.tie_embeddings = a.tie_embeddings;
    m.validate().map_err(|e| e.to_string())?;
    checked_size(m)
}

/// [`GptConfig::check_size`], as the CLI reports it.
fn checked_size(m: GptConfig) -> Result<GptConfig, String> {
    m.check_size().map_err(|e| e.to_string())?;
    Ok(m)
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
    let text = crate::input::read_text(path, "--schedule", crate::input::SCHEDULE_BYTES)?;
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
    if let (Some(t), "real") = (a.threads_per_rank, a.compute.as_str()) {
        nobubble_runtime::machine::check_threads("--threads-per-rank", t).map_err(|e| {
            format!("{e} (or leave it out: the cores are shared among the ranks on the machine)")
        })?;
    }
    match a.threads_per_rank {
        Some(0) => Err("--threads-per-rank must be at least 1".into()),
        Some(t) if t * local > cores && a.compute == "real" => {
            tell!(
                "warning: --threads-per-rank {t} × {local} ranks on this machine is more than its {cores} cores: the ranks will slow each other down; use --threads-per-rank {}",
                (cores / local.max(1)).max(1)
            );
            Ok(t)
        }
        Some(t) => Ok(t),
        None => Ok((cores / local.max(1)).max(1)),
    }
}
