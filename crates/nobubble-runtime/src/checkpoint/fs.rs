//! Checkpoints on disk, written atomically.
//!
//! A checkpoint is a directory:
//!
//! - `checkpoint.json` — [`CheckpointMeta`]: format, version, step, model and training
//!   configuration, optimizer step count;
//! - `model.safetensors` — every parameter, f32, by global name;
//! - `optimizer.safetensors` — AdamW moments, `m/<name>` and `v/<name>`.
//!
//! Why this dance: a crash (or a full disk) during a save must never cost the previous
//! checkpoint. [`save`] writes everything into a staging directory next to the target
//! (`.<name>.tmp`), fsyncs the files and the directory, and only then renames it into
//! place. Linux cannot atomically rename a directory over a non-empty one, so an
//! existing checkpoint is first renamed aside to `.<name>.old` and removed only after
//! the new one is in place; [`load`] falls back to `.<name>.old` when the target is
//! missing, which is exactly the state a crash between those two renames leaves.
//!
//! Nothing a user has is deleted: a directory is only ever replaced or removed when it holds
//! nothing but a checkpoint's own three files ([`is_ours`]); anything else in it — notes,
//! plots, another program's files — makes the save refuse, naming what is there. A symlinked
//! target is refused (saving would replace the link with a directory). `checkpoint.json`
//! records the size and SHA-256 of the two tensor files, checked on load, and a load refuses
//! non-finite weights or moments.

use super::{Checkpoint, CheckpointMeta, FileSum, TrainingState, FORMAT, VERSION};
use crate::error::RuntimeError;
use nobubble_nn::{AdamWState, ParamMoments, Tensor};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Run directories lived here; their functions keep this path.
pub use super::lock::{lock_run, RunLock};
pub use super::runs::*;

pub(super) const META: &str = "checkpoint.json";
const MODEL: &str = "model.safetensors";
const OPTIMIZER: &str = "optimizer.safetensors";

fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "checkpoint".into());
    dir.with_file_name(format!(".{name}.{suffix}"))
}

/// Where [`save`] stages a new checkpoint before renaming it to `dir`. A directory left
/// here means a save was interrupted; the next save replaces it, loads ignore it.
pub fn staging_dir(dir: &Path) -> PathBuf {
    sibling(dir, "tmp")
}

/// Where [`save`] keeps the previous checkpoint while renaming the new one into place;
/// [`load`] reads it if `dir` itself is missing.
pub fn previous_dir(dir: &Path) -> PathBuf {
    sibling(dir, "old")
}

pub(super) fn io_err(what: &str, path: &Path, e: std::io::Error) -> RuntimeError {
    RuntimeError::io(path, format!("cannot {what} {}: {e}", path.display()))
}

pub(super) fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), RuntimeError> {
    let mut f = File::create(path).map_err(|e| io_err("create", path, e))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| io_err("write", path, e))
}

pub(super) fn sync_dir(path: &Path) -> Result<(), RuntimeError> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err("sync directory", path, e))
}

pub(super) fn le_bytes(t: &[f32]) -> Vec<u8> {
    t.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub(super) fn serialize(
    tensors: Vec<(String, Vec<usize>, Vec<u8>)>,
) -> Result<Vec<u8>, RuntimeError> {
    let views = tensors
        .iter()
        .map(|(n, shape, bytes)| {
            TensorView::new(Dtype::F32, shape.clone(), bytes).map(|v| (n.clone(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| RuntimeError::Fault(format!("internal: tensor view: {e}")))?;
    safetensors::serialize(views, None)
        .map_err(|e| RuntimeError::Fault(format!("cannot serialize tensors: {e}")))
}

/// `dir/checkpoint.json` as JSON, for the checks that need one field of it before (or
/// without) a full [`load`]; `None` if it is missing or not JSON.
pub(super) fn meta_json(dir: &Path) -> Option<serde_json::Value> {
    serde_json::from_slice(&std::fs::read(dir.join(META)).ok()?).ok()
}

/// The SHA-256 of the metadata file of the checkpoint at `dir`: its identity (the metadata
/// holds the step and every other file's SHA-256).
pub(super) fn meta_sha(dir: &Path) -> Option<String> {
    Some(sha256_hex(&std::fs::read(dir.join(META)).ok()?))
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether `dir` holds nothing but a checkpoint's own files (so it may be replaced or
/// removed): `Ok(())`, or the reason it may not, naming what is foreign. A missing directory
/// is fine; so is an empty one. Tensor files without a `checkpoint.json` are someone else's
/// (another tool writes `model.safetensors` too) unless `partial`: an interrupted save leaves
/// exactly that in its staging directory, a cut-short removal in the previous one.
pub fn is_ours(dir: &Path, partial: bool) -> Result<(), String> {
    let meta = match std::fs::symlink_metadata(dir) {
        Err(_) => return Ok(()),
        Ok(m) => m,
    };
    if meta.file_type().is_symlink() {
        return Err(
            "it is a symlink (saving would replace the link); pass the directory it points to"
                .into(),
        );
    }
    if !meta.is_dir() {
        return Err("it exists and is not a directory".into());
    }
    let mut has_meta = false;
    let mut any = false;
    for e in std::fs::read_dir(dir).map_err(|e| format!("cannot list it: {e}"))? {
        let e = e.map_err(|e| format!("cannot list it: {e}"))?;
        any = true;
        let name = e.file_name().to_string_lossy().into_owned();
        let regular = e.file_type().map(|t| t.is_file()).unwrap_or(false);
        if !regular || ![META, MODEL, OPTIMIZER].contains(&name.as_str()) {
            return Err(format!(
                "it holds `{name}`, which is not part of a nobubble checkpoint (nobubble never \
                 deletes what it did not write)"
            ));
        }
        has_meta |= name == META;
    }
    if any && !has_meta && !partial {
        return Err("it holds checkpoint files but no checkpoint.json".into());
    }
    let format = meta_json(dir).and_then(|v| Some(v.get("format")?.as_str()?.to_string()));
    if has_meta && format.as_deref() != Some(FORMAT) && !(partial && cut_short_meta(dir)) {
        return Err(format!("its {META} is not a nobubble checkpoint's"));
    }
    Ok(())
}

/// Whether `dir`'s `checkpoint.json` is one of ours whose writing a kill cut short: what
/// [`write_files`] writes first (it begins with the format), or a beginning of that.
fn cut_short_meta(dir: &Path) -> bool {
    let Ok(bytes) = std::fs::read(dir.join(META)) else {
        return false;
    };
    let head = format!("{{\n  \"format\": \"{FORMAT}\"");
    bytes.starts_with(head.as_bytes()) || head.as_bytes().starts_with(&bytes)
}

/// Refuses a `--save` target that is not ours: an existing file, a symlink, or a directory
/// holding anything but a checkpoint's own files — and the same for the staging and
/// previous directories beside it, which a save replaces. Cheap: run it before training too.
pub fn check_save_target(dir: &Path) -> Result<(), RuntimeError> {
    for (d, what, partial) in [
        (dir.to_path_buf(), "a checkpoint directory", false),
        (
            staging_dir(dir),
            "the staging directory of an interrupted save",
            true,
        ),
        // Left without its checkpoint.json when a removal was cut short: still ours.
        (
            previous_dir(dir),
            "the previous checkpoint kept aside",
            true,
        ),
    ] {
        if let Err(why) = is_ours(&d, partial) {
            return Err(RuntimeError::Config(format!(
                "{} ({what}) cannot be replaced: {why}; choose another --save directory, or move \
                 that out of the way",
                d.display()
            )));
        }
    }
    Ok(())
}

/// Refuses to save over a checkpoint of another model (`overwrite` allows it).
pub fn check_save_model(
    dir: &Path,
    model: &nobubble_nn::GptConfig,
    overwrite: bool,
) -> Result<(), RuntimeError> {
    if overwrite || !dir.join(META).is_file() {
        return Ok(());
    }
    let saved = meta_json(dir).and_then(|v| {
        serde_json::from_value::<nobubble_nn::GptConfig>(v.get("model")?.clone()).ok()
    });
    match saved {
        Some(m) if m == *model => Ok(()),
        _ => Err(RuntimeError::Config(format!(
            "{} holds a checkpoint of another model; saving would replace it: choose another \
             --save directory, resume it with its own model flags, or pass --overwrite",
            dir.display()
        ))),
    }
}

/// Writes `ckpt` to `dir` atomically (see the module docs): either the new checkpoint is
/// complete at `dir`, or the previous one is still loadable.
pub fn save(dir: &Path, ckpt: &Checkpoint) -> Result<(), RuntimeError> {
    save_following(dir, ckpt, ckpt.meta.follows.clone())
}

/// [`save`] with the checkpoint's `follows` set to `follows` (see [`CheckpointMeta`]).
pub(super) fn save_following(
    dir: &Path,
    ckpt: &Checkpoint,
    follows: Option<String>,
) -> Result<(), RuntimeError> {
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| io_err("create", &parent, e))?;
    // Never move aside (and then delete) a directory that is not a checkpoint.
    check_save_target(dir)?;
    // Never save a diverged state over (or as the latest beside) a good one.
    check_finite(&ckpt.state)?;
    let tmp = staging_dir(dir);
    if tmp.exists() {
        // Checked above: only a checkpoint's own files are in it.
        std::fs::remove_dir_all(&tmp).map_err(|e| io_err("remove stale", &tmp, e))?;
    }
    std::fs::create_dir(&tmp).map_err(|e| io_err("create", &tmp, e))?;
    if let Err(e) = write_files(&tmp, ckpt, follows) {
        // A full disk: the partial copy would keep it full (and fail the next save, and a
        // resume, the same way); the previous checkpoints are untouched.
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    swap_in(&tmp, dir, &parent)
}

/// Refuses a state with a non-finite parameter or AdamW moment, naming it.
fn check_finite(s: &TrainingState) -> Result<(), RuntimeError> {
    let bad = s
        .params
        .iter()
        .find(|(_, t)| t.data().iter().any(|x| !x.is_finite()))
        .map(|(n, _)| n.clone())
        .or_else(|| {
            s.optimizer
                .moments
                .iter()
                .find(|(_, m)| m.m.iter().chain(&m.v).any(|x| !x.is_finite()))
                .map(|(n, _)| format!("the AdamW moments of {n}"))
        });
    match bad {
        Some(name) => Err(RuntimeError::Diverged(format!(
            "not saving step {}: `{name}` holds non-finite values (the run diverged; lower --lr \
             or keep --max-grad-norm); the checkpoints already saved are kept",
            s.step
        ))),
        None => Ok(()),
    }
}

/// Writes the weights, the optimizer's moments and, last, the metadata with their sizes and
/// checksums into the staging directory `tmp`: a directory with checkpoint.json is complete.
fn write_files(tmp: &Path, ckpt: &Checkpoint, follows: Option<String>) -> Result<(), RuntimeError> {
    let s = &ckpt.state;
    let model = serialize(
        s.params
            .iter()
            .map(|(n, t)| (n.clone(), t.shape().to_vec(), le_bytes(t.data())))
            .collect(),
    )?;
    let mut moments = Vec::with_capacity(2 * s.optimizer.moments.len());
    for (n, pm) in &s.optimizer.moments {
        let shape = s
            .params
            .get(n)
            .map(|t| t.shape().to_vec())
            .unwrap_or_else(|| vec![pm.m.len()]);
        moments.push((format!("m/{n}"), shape.clone(), le_bytes(&pm.m)));
        moments.push((format!("v/{n}"), shape, le_bytes(&pm.v)));
    }
    let optimizer = serialize(moments)?;
    let mut manifest = ckpt.meta.clone();
    manifest.follows = follows;
    for (name, bytes) in [(MODEL, &model), (OPTIMIZER, &optimizer)] {
        manifest.files.insert(
            name.to_string(),
            FileSum {
                bytes: bytes.len() as u64,
                sha256: sha256_hex(bytes),
            },
        );
    }
    let meta = serde_json::to_vec_pretty(&manifest).expect("metadata serializes");
    write_synced(&tmp.join(MODEL), &model)?;
    write_synced(&tmp.join(OPTIMIZER), &optimizer)?;
    write_synced(&tmp.join(META), &meta)?;
    sync_dir(tmp)
}

/// Puts the complete staging directory `tmp` in place of `dir`, the previous checkpoint
/// moved aside until the rename is durable.
fn swap_in(tmp: &Path, dir: &Path, parent: &Path) -> Result<(), RuntimeError> {
    let old = previous_dir(dir);
    // Checked again right before replacing: a file may have been put there during training.
    check_save_target(dir)?;
    if dir.exists() {
        if old.exists() {
            // `dir` is complete (only ever created by the rename below), so an older
            // leftover is not needed.
            std::fs::remove_dir_all(&old).map_err(|e| io_err("remove", &old, e))?;
        }
        std::fs::rename(dir, &old).map_err(|e| io_err("move aside", dir, e))?;
    }
    std::fs::rename(tmp, dir).map_err(|e| io_err("rename into place", dir, e))?;
    sync_dir(parent)?;
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(|e| io_err("remove", &old, e))?;
    }
    Ok(())
}

fn corrupt(path: &Path, what: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::io(
        path,
        format!(
            "checkpoint file {} is damaged ({what}); use another checkpoint or save a new one",
            path.display()
        ),
    )
}

fn read_tensors(
    path: &Path,
    sums: &BTreeMap<String, FileSum>,
) -> Result<BTreeMap<String, Tensor>, RuntimeError> {
    let bytes = std::fs::read(path).map_err(|e| io_err("read", path, e))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    if let Some(sum) = name.and_then(|n| sums.get(&n)) {
        if bytes.len() as u64 != sum.bytes {
            return Err(corrupt(
                path,
                format!("{} bytes, the manifest says {}", bytes.len(), sum.bytes),
            ));
        }
        if sha256_hex(&bytes) != sum.sha256 {
            return Err(corrupt(
                path,
                "its SHA-256 is not the one in checkpoint.json",
            ));
        }
    }
    let st = SafeTensors::deserialize(&bytes).map_err(|e| corrupt(path, e))?;
    let mut out = BTreeMap::new();
    for (name, view) in st.iter() {
        if view.dtype() != Dtype::F32 {
            return Err(corrupt(
                path,
                format!("tensor `{name}` is {:?}, not F32", view.dtype()),
            ));
        }
        let data: Vec<f32> = view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if let Some(i) = data.iter().position(|x| !x.is_finite()) {
            return Err(corrupt(
                path,
                format!(
                    "tensor `{name}` holds {} at index {i}; resuming would train on it",
                    data[i]
                ),
            ));
        }
        let t = Tensor::from_vec(view.shape(), data).map_err(|e| corrupt(path, e))?;
        out.insert(name.to_string(), t);
    }
    Ok(out)
}

/// Reads the checkpoint at `dir` (or, if `dir` is missing after an interrupted save,
/// the previous one kept beside it), checking format, version and that weights and
/// moments cover the same parameters with the same shapes.
pub fn load(dir: &Path) -> Result<Checkpoint, RuntimeError> {
    load_parts(dir, true)
}

/// [`load`] without the optimizer's moments (left empty), for what only runs the model
/// (`sample`, `score`, `export`): a checkpoint whose optimizer file is gone still loads.
pub fn load_weights(dir: &Path) -> Result<Checkpoint, RuntimeError> {
    load_parts(dir, false)
}

fn load_parts(dir: &Path, with_moments: bool) -> Result<Checkpoint, RuntimeError> {
    let (src, meta) = read_meta(dir)?;
    let meta_path = src.join(META);
    let model_path = src.join(MODEL);
    if meta.files.is_empty() {
        // Not `eprintln!`, which panics when standard error is closed.
        let _ = writeln!(
            std::io::stderr(),
            "warning: {} records no checksums (written by an older nobubble): its files are \
             loaded unverified; saving it again adds them",
            meta_path.display()
        );
    }
    let params = read_tensors(&model_path, &meta.files)?;
    if params.len() != meta.parameters {
        return Err(corrupt(
            &model_path,
            format!(
                "{} tensors, the metadata says {}",
                params.len(),
                meta.parameters
            ),
        ));
    }
    let opt_path = src.join(OPTIMIZER);
    let moments = match with_moments {
        true => moments_by_parameter(&params, read_tensors(&opt_path, &meta.files)?, &opt_path)?,
        false => Default::default(),
    };
    // Verified: the manifest is a storage detail (a save writes a new one).
    let mut meta = meta;
    meta.files.clear();
    let optimizer = AdamWState {
        config: meta.optimizer_config,
        steps: meta.optimizer_steps,
        last: meta.optimizer_last,
        moments,
    };
    Ok(Checkpoint {
        state: TrainingState {
            step: meta.step,
            params,
            optimizer,
        },
        meta,
    })
}

/// The directory to read (`dir`, or the previous checkpoint kept beside it after an
/// interrupted save) and its metadata, checked for format and version.
fn read_meta(dir: &Path) -> Result<(PathBuf, CheckpointMeta), RuntimeError> {
    let src = if !dir.exists() && previous_dir(dir).join(META).is_file() {
        previous_dir(dir)
    } else {
        dir.to_path_buf()
    };
    if !src.is_dir() {
        return Err(RuntimeError::Config(format!(
            "no checkpoint at {}: the directory does not exist (pass the directory given to \
             --save)",
            dir.display()
        )));
    }
    let meta_path = src.join(META);
    if !meta_path.is_file() {
        return Err(RuntimeError::Config(format!(
            "{} is not a nobubble checkpoint: it has no {META} (pass the directory given to \
             --save)",
            dir.display()
        )));
    }
    let text = std::fs::read(&meta_path).map_err(|e| io_err("read", &meta_path, e))?;
    let value: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| corrupt(&meta_path, e))?;
    if value.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
        return Err(corrupt(&meta_path, "not a nobubble checkpoint"));
    }
    let version = value.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
    if version != VERSION as u64 {
        return Err(RuntimeError::Config(format!(
            "{} has checkpoint version {version}; this nobubble reads version {VERSION} (use \
             the nobubble that wrote it)",
            meta_path.display()
        )));
    }
    let meta: CheckpointMeta = serde_json::from_value(value).map_err(|e| corrupt(&meta_path, e))?;
    Ok((src, meta))
}

/// AdamW's moments by parameter name, each pair with its parameter's shape; every moment
/// tensor must belong to a parameter (`opt_path` names the file in errors).
fn moments_by_parameter(
    params: &BTreeMap<String, Tensor>,
    mut moments: BTreeMap<String, Tensor>,
    opt_path: &Path,
) -> Result<BTreeMap<String, ParamMoments>, RuntimeError> {
    let mut by_name = BTreeMap::new();
    for (name, p) in params {
        let (m, v) = match (
            moments.remove(&format!("m/{name}")),
            moments.remove(&format!("v/{name}")),
        ) {
            (Some(m), Some(v)) => (m, v),
            _ => {
                return Err(corrupt(
                    opt_path,
                    format!("no moments for parameter `{name}`"),
                ))
            }
        };
        if m.shape() != p.shape() || v.shape() != p.shape() {
            return Err(corrupt(
                opt_path,
                format!("moments of `{name}` do not have its shape {:?}", p.shape()),
            ));
        }
        by_name.insert(
            name.clone(),
            ParamMoments {
                m: m.into_vec(),
                v: v.into_vec(),
            },
        );
    }
    if let Some(extra) = moments.keys().next() {
        return Err(corrupt(
            opt_path,
            format!("tensor `{extra}` belongs to no parameter"),
        ));
    }
    Ok(by_name)
}
