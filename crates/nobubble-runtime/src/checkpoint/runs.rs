//! Run directories: one checkpoint directory per save (`step-NNNNNN/`), the `latest` file
//! naming the newest, `--keep-last`, and resolving a run or step directory to a checkpoint.
//! Re-exported from [`super::fs`], its old home, so `checkpoint_fs::save_run` still works.

use super::fs::{
    check_save_target, io_err, is_ours, load, meta_json, meta_sha, previous_dir, save_following,
    sync_dir, META,
};
use super::Checkpoint;
use crate::error::RuntimeError;
use std::io::Write;
use std::path::{Path, PathBuf};
/// The file in a run directory naming its newest checkpoint.
const LATEST: &str = "latest";

/// The directory name of the checkpoint at `step` in a run directory.
pub fn step_dir_name(step: u64) -> String {
    format!("step-{step:06}")
}

/// The step a name written by [`step_dir_name`] stands for — that exact spelling only.
fn step_of(name: &str) -> Option<u64> {
    let step: u64 = name.strip_prefix("step-")?.parse().ok()?;
    (step_dir_name(step) == name).then_some(step)
}

/// A run directory (`--save DIR`) holds one checkpoint per saved step, `step-000150/`, and
/// `latest`, naming the newest. Refuses a target that is a file, or a checkpoint in the
/// single-directory layout of earlier nobubble versions (saving there would mix layouts).
/// Anything else in DIR is the user's and is never touched.
pub fn check_run_target(run: &Path) -> Result<(), RuntimeError> {
    if run.exists() && !run.is_dir() {
        return Err(RuntimeError::Config(format!(
            "{} exists and is not a directory; --save takes a run directory",
            run.display()
        )));
    }
    if run.join(META).is_file() {
        return Err(RuntimeError::Config(format!(
            "{} is a single checkpoint (the layout before run directories), not a run \
             directory; save to a new directory (this one still resumes: --resume {})",
            run.display(),
            run.display()
        )));
    }
    let holds_weights = || {
        std::fs::read_dir(run).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        })
    };
    // A run directory's own `config.json` (a user's notes) is no model: only a directory
    // with weights beside it and no run in it yet.
    if super::hf::is_model_dir(run) && holds_weights() && latest_step(run)?.is_none() {
        // `sample` and `score` would read the Hugging Face model, `export` the run: one
        // directory, two models.
        return Err(RuntimeError::Config(format!(
            "{} is a Hugging Face model directory (a config.json and its weights); a run saved there \
             would make it two models: save to another directory (to fine-tune this model: \
             --init-from {})",
            run.display(),
            run.display()
        )));
    }
    latest_step(run).map(|_| ())
}

/// The step `run/latest` names, if it exists; an error if `latest` is not nobubble's (a
/// symlink, a directory, or a file that does not name a step directory), which a save would
/// otherwise replace.
pub fn latest_step(run: &Path) -> Result<Option<u64>, RuntimeError> {
    let latest = run.join(LATEST);
    let meta = match std::fs::symlink_metadata(&latest) {
        Err(_) => return Ok(None),
        Ok(m) => m,
    };
    let foreign = |why: &str| {
        Err(RuntimeError::Config(format!(
            "{} is {why}, not the pointer nobubble writes; saving would replace it: move it out \
             of the way or choose another --save directory",
            latest.display()
        )))
    };
    if !meta.is_file() {
        return foreign("a symlink or a directory");
    }
    let text = std::fs::read_to_string(&latest).unwrap_or_default();
    match step_of(text.trim()) {
        Some(step) if text.len() < 64 => Ok(Some(step)),
        _ => foreign("a file that does not name a step-NNNNNN directory"),
    }
}

/// Refuses, before training, a run directory in which a save for a step `will_save` accepts
/// would replace something: a step directory holding anything but a checkpoint's own files
/// (always), or an existing checkpoint (unless `overwrite`: it belongs to a run that went
/// further, e.g. one resumed from an earlier step).
pub fn check_run_steps(
    run: &Path,
    will_save: impl Fn(u64) -> bool,
    overwrite: bool,
) -> Result<(), RuntimeError> {
    check_run_target(run)?;
    let Ok(entries) = std::fs::read_dir(run) else {
        return Ok(());
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let bare = name
            .strip_prefix('.')
            .and_then(|n| n.strip_suffix(".tmp").or_else(|| n.strip_suffix(".old")))
            .unwrap_or(&name);
        let Some(step) = step_of(bare).filter(|s| will_save(*s)) else {
            continue;
        };
        let dir = run.join(step_dir_name(step));
        check_save_target(&dir)?;
        if dir.join(META).is_file() && !overwrite {
            return Err(RuntimeError::Config(format!(
                "{} already holds a checkpoint that this run would replace (a run that went \
                 further saved it); resume from the latest, save elsewhere, or pass --overwrite",
                dir.display()
            )));
        }
    }
    Ok(())
}

/// The steps of the checkpoints in run directory `run` (its `step-NNNNNN/` directories
/// holding a checkpoint), in increasing order; empty if there are none or `run` is missing.
pub fn saved_steps(run: &Path) -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir(run) else {
        return Vec::new();
    };
    let mut steps: Vec<u64> = entries
        .flatten()
        .filter_map(|e| step_of(&e.file_name().to_string_lossy()))
        .filter(|&s| run.join(step_dir_name(s)).join(META).is_file())
        .collect();
    steps.sort_unstable();
    steps
}

/// A fresh run (not resumed from `run` itself) refuses to save into a run directory that
/// holds another run's checkpoints: the two runs would mix under one `latest`, and
/// `--keep-last` would delete the older run's. `resumes_here`: the run resumes from `run`
/// or one of its steps, i.e. continues it.
pub fn check_other_run(run: &Path, resumes_here: bool) -> Result<(), RuntimeError> {
    if resumes_here {
        return Ok(());
    }
    let steps = saved_steps(run);
    let Some(&newest) = steps.last() else {
        return Ok(());
    };
    Err(RuntimeError::Config(format!(
        "{} holds another run's checkpoints ({} of them, the newest {}); this run does not \
         resume from it, so saving there would mix the two runs: continue it with --resume {}, \
         save to a new directory, or pass --overwrite to save there anyway (its checkpoints \
         stay; this run's replace those at the same steps)",
        run.display(),
        steps.len(),
        step_dir_name(newest),
        run.display()
    )))
}

/// Writes `ckpt` into the run directory `run` as `step-NNNNNN/` (atomically, see [`save`]),
/// then points `latest` at it (a file replaced atomically), then, with `keep_last` > 0,
/// removes older step directories beyond the newest `keep_last` — only those holding nothing
/// but a checkpoint's own files, and never step `keep_also` (the last one known good).
/// Returns the step directory.
pub fn save_run(
    run: &Path,
    ckpt: &Checkpoint,
    keep_last: usize,
    keep_also: Option<u64>,
) -> Result<PathBuf, RuntimeError> {
    check_run_target(run)?;
    std::fs::create_dir_all(run).map_err(|e| io_err("create", run, e))?;
    let name = step_dir_name(ckpt.meta.step);
    let dir = run.join(&name);
    // What `latest` stands for (itself, or a save killed before it moved).
    let follows = latest_step(run)?
        .and_then(|_| resolve(run).ok())
        .and_then(|at| identity(&at));
    save_following(&dir, ckpt, follows)?;
    // A kill here leaves `latest` one save behind: `resolve` finds the new one by `follows`.
    replace_latest(run, &name)?;
    if keep_last > 0 {
        let mut steps: Vec<(u64, PathBuf)> = std::fs::read_dir(run)
            .map_err(|e| io_err("list", run, e))?
            .flatten()
            .filter_map(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                Some((step_of(&n)?, e.path()))
            })
            .collect();
        // Only checkpoints older than this one count: newer ones are another run's.
        steps.retain(|(s, _)| *s < ckpt.meta.step);
        steps.sort();
        let excess = (steps.len() + 1).saturating_sub(keep_last);
        for (step, old) in steps.into_iter().take(excess) {
            if Some(step) != keep_also && is_ours(&old, false).is_ok() && old.join(META).is_file() {
                // Best effort: the new checkpoint is safe either way.
                let _ = std::fs::remove_dir_all(&old);
            }
        }
    }
    Ok(dir)
}

/// Points `run/latest` at `name`: a new file of this process's own (never an existing one,
/// never through a symlink) renamed over the old pointer, which [`latest_step`] checked is
/// nobubble's.
fn replace_latest(run: &Path, name: &str) -> Result<(), RuntimeError> {
    remove_stale_pointers(run)?;
    let mut attempt = 0u32;
    let (tmp, mut f) = loop {
        let tmp = run.join(pointer_name(std::process::id(), attempt));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => {
                attempt += 1
            }
            Err(e) => return Err(io_err("create", &tmp, e)),
        }
    };
    let r = f
        .write_all(format!("{name}\n").as_bytes())
        .and_then(|_| f.sync_all())
        .and_then(|_| std::fs::rename(&tmp, run.join(LATEST)));
    if let Err(e) = r {
        let _ = std::fs::remove_file(&tmp); // created above by this process
        return Err(io_err("update", &run.join(LATEST), e));
    }
    sync_dir(run)
}

/// The name of a new `latest` pointer before its rename: `.latest.<pid>.<attempt>.tmp`.
fn pointer_name(pid: u32, attempt: u32) -> String {
    format!(".{LATEST}.{pid}.{attempt}.tmp")
}

/// Removes the new pointers of saves killed before their rename: only names
/// [`pointer_name`] writes, holding a step name or nothing yet, so nothing of the user's
/// (the saver holds the run's lock, so no other process is writing one).
fn remove_stale_pointers(run: &Path) -> Result<(), RuntimeError> {
    let ids = |n: &str| -> Option<(u32, u32)> {
        let (pid, attempt) = n
            .strip_prefix(&format!(".{LATEST}."))?
            .strip_suffix(".tmp")?
            .split_once('.')?;
        Some((pid.parse().ok()?, attempt.parse().ok()?))
    };
    for e in std::fs::read_dir(run)
        .map_err(|e| io_err("list", run, e))?
        .flatten()
    {
        let n = e.file_name().to_string_lossy().into_owned();
        let ours = ids(&n).is_some_and(|(pid, attempt)| pointer_name(pid, attempt) == n);
        if !ours || !e.metadata().is_ok_and(|m| m.is_file() && m.len() < 64) {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        if text.trim().is_empty() || step_of(text.trim()).is_some() {
            let _ = std::fs::remove_file(e.path());
        }
    }
    Ok(())
}

/// The `tokenizer.json` recorded in the checkpoint at `dir` (a run or step directory), read
/// from its `checkpoint.json` alone; `None` if it has none or cannot be read (the full load
/// reports that).
pub fn peek_tokenizer(dir: &Path) -> Option<String> {
    let meta = super::fs::meta_json(&resolve(dir).ok()?)?;
    meta.get("tokenizer")?.as_str().map(str::to_string)
}

/// The checkpoint directory `dir` names: `dir` itself when it is one (a step directory, or
/// the single-directory layout), else the step `dir/latest` points to — or its successor, a
/// complete checkpoint saved after it whose save was killed before `latest` moved.
pub fn resolve(dir: &Path) -> Result<PathBuf, RuntimeError> {
    if dir.join(META).is_file() || (!dir.exists() && previous_dir(dir).join(META).is_file()) {
        return Ok(dir.to_path_buf());
    }
    let latest = dir.join(LATEST);
    match std::fs::read_to_string(&latest) {
        Ok(text) => {
            let name = text.trim();
            if step_of(name).is_none() || name.contains('/') {
                return Err(RuntimeError::io(
                    &latest,
                    format!(
                        "{} names `{name}`, not a step directory; the run directory is damaged",
                        latest.display()
                    ),
                ));
            }
            let at = dir.join(name);
            if !at.exists() && !previous_dir(&at).join(META).is_file() {
                if let Some(&newest) = saved_steps(dir).last() {
                    return Err(RuntimeError::Config(format!(
                        "{} names {name}, which is gone; the newest checkpoint left is {} \
                         (pass it: {})",
                        latest.display(),
                        step_dir_name(newest),
                        dir.join(step_dir_name(newest)).display()
                    )));
                }
            }
            Ok(newest_successor(dir, at))
        }
        Err(_) if dir.is_dir() => Err(RuntimeError::Config(match saved_steps(dir).last() {
            Some(&newest) => format!(
                "{} has no `{LATEST}` pointer, but holds checkpoints; the newest is {} \
                 (pass it: {})",
                dir.display(),
                step_dir_name(newest),
                dir.join(step_dir_name(newest)).display()
            ),
            None => format!(
                "{} holds no checkpoint: no {META} and no `{LATEST}` (pass a run directory given \
                 to --save, or one of its step-NNNNNN directories)",
                dir.display()
            ),
        })),
        Err(_) => Err(RuntimeError::Config(format!(
            "no checkpoint at {}: the directory does not exist (pass the directory given to \
             --save)",
            dir.display()
        ))),
    }
}

/// [`meta_sha`] of the checkpoint at `at`, or of the previous one kept beside it while a
/// replacing save was cut short (what a load of `at` reads then).
fn identity(at: &Path) -> Option<String> {
    meta_sha(at).or_else(|| meta_sha(&previous_dir(at)))
}

/// The end of the chain of checkpoints in run directory `run` that follow `at` (each saved
/// while `latest` named the one before, see `CheckpointMeta::follows`): `at` itself unless a
/// save was killed between putting its step directory in place and moving `latest`. Where
/// two follow one (a resume that re-saved a step), the later step wins.
fn newest_successor(run: &Path, mut at: PathBuf) -> PathBuf {
    let follows: Vec<(PathBuf, String)> = saved_steps(run)
        .into_iter()
        .map(|s| run.join(step_dir_name(s)))
        .filter_map(|d| {
            let f = meta_json(&d)?.get("follows")?.as_str()?.to_string();
            Some((d, f))
        })
        .collect();
    // Each link is a distinct checkpoint: the chain is at most this long (no cycle can hang).
    for _ in 0..follows.len() {
        let Some(sha) = identity(&at) else { break };
        match follows.iter().rev().find(|(d, f)| *f == sha && *d != at) {
            Some((d, _)) => at = d.clone(),
            None => break,
        }
    }
    at
}

/// The step of the checkpoint `dir` names ([`resolve`]), from its metadata alone.
pub fn peek_step(dir: &Path) -> Option<u64> {
    let at = resolve(dir).ok()?;
    let src = if at.join(META).is_file() {
        at
    } else {
        previous_dir(&at)
    };
    meta_json(&src)?.get("step")?.as_u64()
}

/// [`super::fs::load_weights`] of [`resolve`]`(dir)`: the model without its optimizer state.
pub fn load_resolved_weights(dir: &Path) -> Result<(PathBuf, Checkpoint), RuntimeError> {
    let at = resolve(dir)?;
    super::fs::load_weights(&at).map(|c| (at, c))
}

/// [`load`] of [`resolve`]`(dir)`.
pub fn load_resolved(dir: &Path) -> Result<(PathBuf, Checkpoint), RuntimeError> {
    let at = resolve(dir)?;
    load(&at).map(|c| (at, c))
}
