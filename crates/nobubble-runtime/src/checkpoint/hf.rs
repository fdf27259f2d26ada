//! Hugging Face model directories (`config.json` + `model.safetensors`, as transformers'
//! `save_pretrained` writes them): exporting a checkpoint's weights so that
//! `AutoModelForCausalLM.from_pretrained` loads them, and reading such a directory to start
//! training from it (`train --init-from`) or to score text. The name and layout mapping is the
//! engine's (`nobubble_nn::hf`); this module does the files.

use super::fs::{io_err, le_bytes, serialize, sync_dir, write_synced};
use super::Checkpoint;
use crate::error::RuntimeError;
use nobubble_nn::{hf, GptConfig, Stage, Tensor};
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const CONFIG: &str = "config.json";
const WEIGHTS: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";
const TOKENIZER: &str = "tokenizer.json";

/// Whether `dir` looks like a Hugging Face model directory (a `config.json`, and no
/// nobubble `checkpoint.json`).
pub fn is_model_dir(dir: &Path) -> bool {
    dir.join(CONFIG).is_file() && !dir.join("checkpoint.json").exists()
}

fn bad(path: &Path, why: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::io(path, format!("{}: {why}", path.display()))
}

/// The model `dir/config.json` describes, with sequences of `seq_len` tokens (default: its
/// `max_position_embeddings`) and `microbatch_size` sequences per microbatch.
pub fn read_config(
    dir: &Path,
    seq_len: Option<usize>,
    microbatch_size: usize,
) -> Result<GptConfig, RuntimeError> {
    let path = dir.join(CONFIG);
    let bytes = std::fs::read(&path).map_err(|e| io_err("read", &path, e))?;
    let json: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(&path, format!("not JSON: {e}")))?;
    let mut config = hf::config_from_json(&json, seq_len).map_err(|e| bad(&path, e))?;
    config.microbatch_size = microbatch_size;
    config
        .validate()
        .map_err(|e| RuntimeError::Config(e.to_string()))?;
    Ok(config)
}

/// `value` of a safetensors tensor as f32 (F32 as is; F16 and BF16 widened exactly).
fn to_f32(path: &Path, name: &str, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>, RuntimeError> {
    let halves = || {
        bytes
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
    };
    Ok(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::BF16 => halves().map(|h| f32::from_bits((h as u32) << 16)).collect(),
        Dtype::F16 => halves().map(f16_to_f32).collect(),
        other => {
            return Err(bad(
                path,
                format!("tensor `{name}` is {other:?}; only F32, BF16 and F16 can be read"),
            ))
        }
    })
}

/// IEEE half to single precision, exactly (subnormals, infinities and NaN included).
fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let frac = (h & 0x3ff) as u32;
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, f) => {
            // Subnormal: f · 2^−24, exact in f32.
            let v = f as f32 * 2f32.powi(-24);
            return if sign != 0 { -v } else { v };
        }
        (0x1f, f) => sign | 0x7f80_0000 | (f << 13),
        (e, f) => sign | ((e + 112) << 23) | (f << 13),
    };
    f32::from_bits(bits)
}

/// Every tensor of the weight files of `dir`: `model.safetensors`, or the shards its
/// `model.safetensors.index.json` names.
fn read_weights(dir: &Path) -> Result<BTreeMap<String, Tensor>, RuntimeError> {
    let files: Vec<PathBuf> = if dir.join(WEIGHTS).is_file() {
        vec![dir.join(WEIGHTS)]
    } else if dir.join(INDEX).is_file() {
        let path = dir.join(INDEX);
        let bytes = std::fs::read(&path).map_err(|e| io_err("read", &path, e))?;
        let index: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| bad(&path, format!("not JSON: {e}")))?;
        let map = index["weight_map"]
            .as_object()
            .ok_or_else(|| bad(&path, "has no `weight_map`"))?;
        let mut shards = Vec::new();
        for shard in map.values() {
            let name = shard.as_str().unwrap_or("");
            if name.is_empty() || name.contains('/') || name.contains('\\') || name == ".." {
                return Err(bad(
                    &path,
                    format!("names the shard {shard}, not a file beside it"),
                ));
            }
            shards.push(dir.join(name));
        }
        shards.sort();
        shards.dedup();
        shards
    } else {
        return Err(RuntimeError::io(
            dir,
            format!(
                "{} has neither {WEIGHTS} nor {INDEX}: not a Hugging Face model directory",
                dir.display()
            ),
        ));
    };
    let mut out = BTreeMap::new();
    for path in files {
        let bytes = std::fs::read(&path).map_err(|e| io_err("read", &path, e))?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| bad(&path, e))?;
        for (name, view) in st.iter() {
            let data = to_f32(&path, name, view.dtype(), view.data())?;
            if let Some(i) = data.iter().position(|x| !x.is_finite()) {
                return Err(bad(
                    &path,
                    format!("tensor `{name}` holds {} at index {i}", data[i]),
                ));
            }
            let t = Tensor::from_vec(view.shape(), data).map_err(|e| bad(&path, e))?;
            if out.insert(name.to_string(), t).is_some() {
                return Err(bad(&path, format!("tensor `{name}` is in two shards")));
            }
        }
    }
    Ok(out)
}

/// The weights of the Hugging Face model in `dir`, as nobubble's parameters of `config` (what
/// [`read_config`] read from the same directory).
pub fn load_params(
    dir: &Path,
    config: &GptConfig,
) -> Result<BTreeMap<String, Tensor>, RuntimeError> {
    let tensors = read_weights(dir)?;
    hf::from_hf(config, &tensors)
        .map_err(|e| RuntimeError::io(dir, format!("{}: {e}", dir.display())))
}

/// The Hugging Face model in `dir` as one unpipelined stage (for scoring and sampling), built
/// as `config` (from [`read_config`], the caller free to shorten its context) says.
pub fn build_model(dir: &Path, config: &GptConfig) -> Result<Stage, RuntimeError> {
    let params = load_params(dir, config)?;
    let mut stages = nobubble_nn::build_stages(config, 0, &[config.layers])
        .map_err(|e| RuntimeError::Config(format!("{}: {e}", dir.display())))?;
    let mut stage = stages.pop().expect("one stage");
    super::load_params(&mut stage, &params)?;
    Ok(stage)
}

/// Writes `tensors` (f32) to `path` as one safetensors file, through a temporary name.
pub fn write_tensors(path: &Path, tensors: &[(&str, &Tensor)]) -> Result<(), RuntimeError> {
    let bytes = serialize(
        tensors
            .iter()
            .map(|(n, t)| (n.to_string(), t.shape().to_vec(), le_bytes(t.data())))
            .collect(),
    )?;
    let name = path
        .file_name()
        .map_or("tensors".into(), |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".{name}.partial"));
    write_synced(&tmp, &bytes)?;
    std::fs::rename(&tmp, path).map_err(|e| io_err("rename into", path, e))
}

/// The `tokenizer.json` of the model directory `dir`, if it has one.
pub fn read_tokenizer(dir: &Path) -> Result<Option<String>, RuntimeError> {
    let path = dir.join(TOKENIZER);
    if !path.is_file() {
        return Ok(None);
    }
    std::fs::read_to_string(&path)
        .map(Some)
        .map_err(|e| io_err("read", &path, e))
}

/// What [`export`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct Exported {
    /// The files, `config.json` first.
    pub files: Vec<PathBuf>,
    /// Parameters written.
    pub parameters: usize,
}

/// Writes `ckpt`'s weights to `dir` as a Hugging Face Llama model directory, with its
/// `tokenizer.json` if the checkpoint has one. `dir` may be
/// missing or empty; a directory already holding `config.json` or `model.safetensors` is
/// replaced only with `overwrite`, and one holding anything else is refused (nothing a user
/// has is lost). Each file is written to a temporary name and renamed into place.
pub fn export(ckpt: &Checkpoint, dir: &Path, overwrite: bool) -> Result<Exported, RuntimeError> {
    let config = &ckpt.meta.model;
    let json = hf::config_json(config).map_err(|e| RuntimeError::Config(e.to_string()))?;
    let tensors =
        hf::to_hf(config, &ckpt.state.params).map_err(|e| RuntimeError::Config(e.to_string()))?;
    if dir.exists() {
        let mut ours = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| io_err("read", dir, e))? {
            let name = entry.map_err(|e| io_err("read", dir, e))?.file_name();
            let name = name.to_string_lossy().into_owned();
            let leftover = name.starts_with('.') && name.ends_with(".partial");
            if [CONFIG, WEIGHTS, TOKENIZER].contains(&name.as_str()) {
                ours.push(name);
            } else if !leftover {
                return Err(RuntimeError::io(
                    dir,
                    format!(
                        "{} already holds `{name}`; export into a new or empty directory",
                        dir.display()
                    ),
                ));
            }
        }
        if let (Some(name), false) = (ours.first(), overwrite) {
            return Err(RuntimeError::io(
                dir,
                format!(
                    "{} already holds a model ({name}); pass --overwrite to replace it",
                    dir.display()
                ),
            ));
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| io_err("create", dir, e))?;
    let parameters = tensors.len();
    let weights = serialize(
        tensors
            .into_iter()
            .map(|(n, t)| (n, t.shape().to_vec(), le_bytes(t.data())))
            .collect(),
    )?;
    let text = serde_json::to_vec_pretty(&json).expect("JSON values serialize");
    let mut files = Vec::new();
    let tokenizer = ckpt
        .meta
        .tokenizer
        .as_ref()
        .map(|t| (TOKENIZER, t.as_bytes().to_vec()));
    let stale = tokenizer.is_none().then(|| dir.join(TOKENIZER));
    for (name, bytes) in [(CONFIG, text), (WEIGHTS, weights)]
        .into_iter()
        .chain(tokenizer)
    {
        let tmp = dir.join(format!(".{name}.partial"));
        write_synced(&tmp, &bytes)?;
        let path = dir.join(name);
        std::fs::rename(&tmp, &path).map_err(|e| io_err("rename into", &path, e))?;
        files.push(path);
    }
    // A model exported here before with a tokenizer: this one has none (bytes are its ids).
    if let Some(stale) = stale.filter(|p| p.exists()) {
        std::fs::remove_file(&stale).map_err(|e| io_err("remove", &stale, e))?;
    }
    sync_dir(dir)?;
    Ok(Exported { files, parameters })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_widen_exactly() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x8001), -(2f32.powi(-24)));
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
        assert!(f16_to_f32(0x7c00).is_infinite() && f16_to_f32(0x7e00).is_nan());
        let bf = to_f32(Path::new("x"), "t", Dtype::BF16, &[0x80, 0x3f]).unwrap();
        assert_eq!(bf, [1.0]);
    }
}
