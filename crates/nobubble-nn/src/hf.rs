//! Hugging Face interchange for Llama models: the `config.json` of `LlamaForCausalLM` and its
//! tensor names and layouts, to and from nobubble's parameters. No I/O here (the runtime reads
//! and writes the files); what lives here is what only the engine knows: how its fused and
//! `[in, out]` weights map onto transformers' separate `[out, in]` ones.
//!
//! | nobubble                       | transformers (`LlamaForCausalLM`)                  |
//! |--------------------------------|----------------------------------------------------|
//! | `embed.tokens` `[V, h]`        | `model.embed_tokens.weight` `[V, h]`               |
//! | `blocks.i.ln1.gamma`           | `model.layers.i.input_layernorm.weight`            |
//! | `blocks.i.attn.qkv.weight` `[h, (a+2kv)d]` | `q_proj`, `k_proj`, `v_proj` `[·, h]`, transposed |
//! | `blocks.i.attn.proj.weight`    | `model.layers.i.self_attn.o_proj.weight`, transposed |
//! | `blocks.i.ln2.gamma`           | `model.layers.i.post_attention_layernorm.weight`   |
//! | `blocks.i.mlp.fc1.weight` `[h, 2f]` | `gate_proj`, `up_proj` `[f, h]`, transposed   |
//! | `blocks.i.mlp.fc2.weight` `[f, h]`  | `down_proj` `[h, f]`, transposed              |
//! | `final_ln.gamma`               | `model.norm.weight`                                |
//! | `lm_head.weight` `[h, V]`      | `lm_head.weight` `[V, h]`                          |
//!
//! With tied embeddings (`tie_word_embeddings`) there is no `lm_head.weight`: both sides
//! use the embedding. Heads need no permutation: nobubble rotates pairs `(j, j + d/2)` of each head, as
//! transformers' `rotate_half` does.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::config::{Arch, GptConfig};
use crate::error::{NnError, Result};
use crate::tensor::Tensor;

/// The `config.json` transformers builds `LlamaForCausalLM` from, for a Llama model.
pub fn config_json(config: &GptConfig) -> Result<Value> {
    require_llama(config)?;
    config.validate()?;
    let theta = config.rope_theta as f64;
    Ok(json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab,
        "hidden_size": config.hidden,
        "intermediate_size": config.ffn_hidden(),
        "num_hidden_layers": config.layers,
        "num_attention_heads": config.heads,
        "num_key_value_heads": config.kv_heads(),
        "head_dim": config.head_dim(),
        "max_position_embeddings": config.seq_len,
        "rms_norm_eps": config.ln_eps as f64,
        "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "hidden_act": "silu",
        "attention_bias": false,
        "mlp_bias": false,
        "tie_word_embeddings": config.tie_embeddings,
        "initializer_range": 0.02,
        "bos_token_id": null,
        "eos_token_id": null,
        "pad_token_id": null,
        "dtype": "float32",
        "torch_dtype": "float32",
    }))
}

fn require_llama(config: &GptConfig) -> Result<()> {
    if config.arch != Arch::Llama {
        return Err(NnError::Config(
            "Hugging Face export is for Llama models (train with --arch llama); this \
             checkpoint has GPT blocks"
                .into(),
        ));
    }
    Ok(())
}

/// The model `config.json` describes (`seq_len` from `max_position_embeddings` unless
/// `seq_len` is given; the microbatch shape is the caller's). Refuses what nobubble's Llama
/// blocks do not compute, naming the field, instead of loading a model that would give other
/// outputs.
pub fn config_from_json(cfg: &Value, seq_len: Option<usize>) -> Result<GptConfig> {
    let bad = |field: &str, why: &str| NnError::Config(format!("config.json: `{field}` {why}"));
    let model_type = cfg.get("model_type").and_then(Value::as_str).unwrap_or("");
    if model_type != "llama" {
        return Err(bad(
            "model_type",
            &format!("is {model_type:?}; only Llama models (\"llama\") can be read"),
        ));
    }
    let int = |field: &str| -> Result<usize> {
        cfg.get(field)
            .and_then(Value::as_u64)
            .map(|v| v as usize)
            .ok_or_else(|| bad(field, "is missing or not a whole number"))
    };
    let float = |field: &str| cfg.get(field).and_then(Value::as_f64);
    let flag = |field: &str| cfg.get(field).and_then(Value::as_bool).unwrap_or(false);
    for field in ["attention_bias", "mlp_bias"] {
        if flag(field) {
            return Err(bad(
                field,
                "is true; nobubble's Llama blocks have no biases",
            ));
        }
    }
    if let Some(act) = cfg.get("hidden_act").and_then(Value::as_str) {
        if act != "silu" {
            return Err(bad(
                "hidden_act",
                &format!("is {act:?}; only \"silu\" (SwiGLU)"),
            ));
        }
    }
    let rope = cfg.get("rope_parameters").filter(|v| !v.is_null());
    let rope_type = rope
        .and_then(|r| r.get("rope_type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    if rope_type != "default" || cfg.get("rope_scaling").is_some_and(|v| !v.is_null()) {
        return Err(bad(
            "rope_parameters",
            &format!("asks for {rope_type:?} rotary scaling; only plain rotary positions"),
        ));
    }
    let theta = rope
        .and_then(|r| r.get("rope_theta"))
        .and_then(Value::as_f64)
        .or_else(|| float("rope_theta"))
        .unwrap_or(10_000.0);
    let (hidden, heads) = (int("hidden_size")?, int("num_attention_heads")?);
    if let Some(d) = cfg.get("head_dim").and_then(Value::as_u64) {
        if heads == 0 || d as usize * heads != hidden {
            return Err(bad(
                "head_dim",
                &format!("{d} × {heads} heads is not hidden_size {hidden}"),
            ));
        }
    }
    let config = GptConfig {
        arch: Arch::Llama,
        layers: int("num_hidden_layers")?,
        hidden,
        heads,
        kv_heads: Some(int("num_key_value_heads").unwrap_or(heads)),
        ffn_hidden: Some(int("intermediate_size")?),
        rope_theta: theta as f32,
        seq_len: match seq_len {
            Some(s) => s,
            None => int("max_position_embeddings")?,
        },
        vocab: int("vocab_size")?,
        ln_eps: float("rms_norm_eps").unwrap_or(1e-6) as f32,
        tie_embeddings: flag("tie_word_embeddings"),
        ..GptConfig::micro()
    };
    config.validate()?;
    Ok(config)
}

/// Transposes a row-major `[rows, cols]` block of columns `c0..c1` of `w` into `[c1−c0, rows]`.
fn transposed_columns(w: &Tensor, c0: usize, c1: usize) -> Tensor {
    let (rows, cols) = (w.rows(), w.cols());
    let mut out = Vec::with_capacity(rows * (c1 - c0));
    for c in c0..c1 {
        out.extend((0..rows).map(|r| w.data()[r * cols + c]));
    }
    Tensor::from_vec(&[c1 - c0, rows], out).expect("sizes agree")
}

/// Stacks `[out_i, in]` matrices along `out` and transposes: `[in, Σ out_i]`.
fn joined_transposed(parts: &[&Tensor]) -> Result<Tensor> {
    let inner = parts[0].cols();
    if parts.iter().any(|p| p.cols() != inner) {
        return Err(NnError::BadInput(
            "projections of different input widths".into(),
        ));
    }
    let outs: usize = parts.iter().map(|p| p.rows()).sum();
    let mut data = vec![0.0f32; inner * outs];
    let mut c0 = 0;
    for p in parts {
        for r in 0..p.rows() {
            for i in 0..inner {
                data[i * outs + c0 + r] = p.data()[r * inner + i];
            }
        }
        c0 += p.rows();
    }
    Tensor::from_vec(&[inner, outs], data)
}

/// One HF tensor ↔ where it lives in nobubble: which parameter, and which of its columns
/// (`None`: the whole parameter, same layout).
struct Slot {
    hf: String,
    ours: String,
    columns: Option<(usize, usize)>,
    /// The tensor's shape in transformers.
    shape: Vec<usize>,
}

impl Slot {
    /// A tensor stored whole on both sides.
    fn same(hf: &str, ours: &str, shape: &[usize]) -> Slot {
        Slot {
            hf: hf.into(),
            ours: ours.into(),
            columns: None,
            shape: shape.to_vec(),
        }
    }

    /// Columns `c0..c1` of our `[inputs, ·]` weight: `[c1 − c0, inputs]` in transformers.
    fn cols(hf: String, ours: String, c0: usize, c1: usize, inputs: usize) -> Slot {
        Slot {
            hf,
            ours,
            columns: Some((c0, c1)),
            shape: vec![c1 - c0, inputs],
        }
    }
}

/// Every HF tensor of `config`'s model, in the order transformers lists them.
fn slots(config: &GptConfig) -> Vec<Slot> {
    let h = config.hidden;
    let mut out = vec![Slot::same(
        "model.embed_tokens.weight",
        "embed.tokens",
        &[config.vocab, h],
    )];
    for i in 0..config.layers {
        out.extend(layer_slots(config, i));
    }
    out.push(Slot::same("model.norm.weight", "final_ln.gamma", &[h]));
    if config.tie_embeddings {
        // transformers ties lm_head.weight to the embedding itself.
        return out;
    }
    out.push(Slot::cols(
        "lm_head.weight".into(),
        "lm_head.weight".into(),
        0,
        config.vocab,
        h,
    ));
    out
}

/// The HF tensors of decoder layer `i`: our fused QKV and gate/up weights split by columns.
fn layer_slots(config: &GptConfig, i: usize) -> [Slot; 9] {
    let (a, kv, d, f) = (
        config.heads,
        config.kv_heads(),
        config.head_dim(),
        config.ffn_hidden(),
    );
    let h = config.hidden;
    let (same, cols) = (Slot::same, Slot::cols);
    let (hf, ours) = (format!("model.layers.{i}"), format!("blocks.{i}"));
    let qkv = format!("{ours}.attn.qkv.weight");
    let fc1 = format!("{ours}.mlp.fc1.weight");
    [
        same(
            &format!("{hf}.input_layernorm.weight"),
            &format!("{ours}.ln1.gamma"),
            &[h],
        ),
        cols(
            format!("{hf}.self_attn.q_proj.weight"),
            qkv.clone(),
            0,
            a * d,
            h,
        ),
        cols(
            format!("{hf}.self_attn.k_proj.weight"),
            qkv.clone(),
            a * d,
            (a + kv) * d,
            h,
        ),
        cols(
            format!("{hf}.self_attn.v_proj.weight"),
            qkv,
            (a + kv) * d,
            (a + 2 * kv) * d,
            h,
        ),
        cols(
            format!("{hf}.self_attn.o_proj.weight"),
            format!("{ours}.attn.proj.weight"),
            0,
            h,
            h,
        ),
        same(
            &format!("{hf}.post_attention_layernorm.weight"),
            &format!("{ours}.ln2.gamma"),
            &[h],
        ),
        cols(format!("{hf}.mlp.gate_proj.weight"), fc1.clone(), 0, f, h),
        cols(format!("{hf}.mlp.up_proj.weight"), fc1, f, 2 * f, h),
        cols(
            format!("{hf}.mlp.down_proj.weight"),
            format!("{ours}.mlp.fc2.weight"),
            0,
            h,
            f,
        ),
    ]
}

/// nobubble's parameters (by global name) as transformers' tensors, in its order.
pub fn to_hf(
    config: &GptConfig,
    params: &BTreeMap<String, Tensor>,
) -> Result<Vec<(String, Tensor)>> {
    require_llama(config)?;
    slots(config)
        .into_iter()
        .map(|slot| {
            let p = params.get(&slot.ours).ok_or_else(|| {
                NnError::BadInput(format!("the checkpoint has no parameter `{}`", slot.ours))
            })?;
            let t = match slot.columns {
                None => p.clone(),
                Some((c0, c1)) => transposed_columns(p, c0, c1),
            };
            Ok((slot.hf, t))
        })
        .collect()
}

/// transformers' tensors as nobubble's parameters (by global name). Every tensor the model
/// needs must be present with its shape; unknown ones are an error too (a file of another
/// model), except rotary caches some exporters add.
pub fn from_hf(
    config: &GptConfig,
    tensors: &BTreeMap<String, Tensor>,
) -> Result<BTreeMap<String, Tensor>> {
    require_llama(config)?;
    let slots = slots(config);
    let known: std::collections::BTreeSet<&str> = slots.iter().map(|s| s.hf.as_str()).collect();
    if let Some(extra) = tensors
        .keys()
        .find(|k| !known.contains(k.as_str()) && !k.ends_with("rotary_emb.inv_freq"))
    {
        return Err(NnError::BadInput(format!(
            "model.safetensors holds `{extra}`, which a Llama model of this config.json has not \
             (tied embeddings, biases and other architectures are not supported)"
        )));
    }
    // Each parameter is one HF tensor, or several (Q, K, V; gate, up) side by side.
    let mut parts: BTreeMap<&str, Vec<(&Slot, &Tensor)>> = BTreeMap::new();
    for slot in &slots {
        let t = tensors.get(&slot.hf).ok_or_else(|| {
            NnError::BadInput(format!("model.safetensors has no tensor `{}`", slot.hf))
        })?;
        if t.shape() != slot.shape.as_slice() {
            return Err(NnError::BadInput(format!(
                "model.safetensors: `{}` has shape {:?}, config.json implies {:?}",
                slot.hf,
                t.shape(),
                slot.shape
            )));
        }
        parts.entry(slot.ours.as_str()).or_default().push((slot, t));
    }
    parts
        .into_iter()
        .map(|(ours, parts)| {
            let value = match parts[0].0.columns {
                None => parts[0].1.clone(),
                Some(_) => {
                    let ts: Vec<&Tensor> = parts.iter().map(|(_, t)| *t).collect();
                    joined_transposed(&ts)?
                }
            };
            Ok((ours.to_string(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::build_stages;

    /// Every parameter of `cfg`'s model, freshly initialized, by name.
    fn params_of(cfg: &GptConfig) -> BTreeMap<String, Tensor> {
        let stages = build_stages(cfg, 3, &[cfg.layers]).unwrap();
        stages[0]
            .params()
            .into_iter()
            .map(|p| (p.name.clone(), p.value.clone()))
            .collect()
    }

    fn llama() -> GptConfig {
        GptConfig {
            layers: 2,
            ..GptConfig::micro()
        }
        .with_arch(Arch::Llama)
    }

    #[test]
    fn tensors_round_trip_and_take_transformers_layouts() {
        let cfg = llama();
        let params = params_of(&cfg);
        let hf = to_hf(&cfg, &params).unwrap();
        assert_eq!(hf.len(), 3 + 9 * cfg.layers);
        let (h, d, f) = (cfg.hidden, cfg.head_dim(), cfg.ffn_hidden());
        let shape = |name: &str| {
            hf.iter()
                .find(|(n, _)| n == name)
                .unwrap()
                .1
                .shape()
                .to_vec()
        };
        assert_eq!(shape("model.layers.1.self_attn.q_proj.weight"), [h, h]);
        assert_eq!(
            shape("model.layers.1.self_attn.k_proj.weight"),
            [cfg.kv_heads() * d, h]
        );
        assert_eq!(shape("model.layers.0.mlp.gate_proj.weight"), [f, h]);
        assert_eq!(shape("model.layers.0.mlp.down_proj.weight"), [h, f]);
        assert_eq!(shape("lm_head.weight"), [cfg.vocab, h]);
        // k_proj row r, column c is the qkv weight's input c, output column h + r.
        let qkv = &params["blocks.1.attn.qkv.weight"];
        let k = &hf
            .iter()
            .find(|(n, _)| n == "model.layers.1.self_attn.k_proj.weight")
            .unwrap()
            .1;
        let w = qkv.cols();
        assert_eq!(k.data()[3 * h + 5], qkv.data()[5 * w + h + 3]);
        let back = from_hf(&cfg, &hf.into_iter().collect()).unwrap();
        assert_eq!(back, params);
    }

    #[test]
    fn config_json_round_trips_and_unsupported_fields_are_named() {
        let cfg = llama();
        let json = config_json(&cfg).unwrap();
        let back = config_from_json(&json, None).unwrap();
        let explicit = GptConfig {
            ffn_hidden: Some(cfg.ffn_hidden()),
            ..cfg.clone()
        };
        assert_eq!(back, explicit);
        assert_eq!(config_from_json(&json, Some(8)).unwrap().seq_len, 8);
        for (field, value, says) in [
            ("attention_bias", json!(true), "attention_bias"),
            ("hidden_act", json!("gelu"), "hidden_act"),
            ("model_type", json!("gpt2"), "model_type"),
            ("num_key_value_heads", json!(3), "key/value heads"),
            (
                "rope_parameters",
                json!({"rope_type": "llama3", "rope_theta": 5e5}),
                "rope_parameters",
            ),
        ] {
            let mut j = json.clone();
            j[field] = value;
            let err = config_from_json(&j, None).unwrap_err().to_string();
            assert!(err.contains(says), "{field}: {err}");
        }
        let mut tied = json.clone();
        tied["tie_word_embeddings"] = json!(true);
        assert!(config_from_json(&tied, None).unwrap().tie_embeddings);
        let gpt = GptConfig::micro();
        assert!(config_json(&gpt)
            .unwrap_err()
            .to_string()
            .contains("--arch llama"));
    }

    #[test]
    fn missing_and_foreign_tensors_are_refused() {
        let cfg = llama();
        let params = params_of(&cfg);
        let mut hf: BTreeMap<String, Tensor> = to_hf(&cfg, &params).unwrap().into_iter().collect();
        hf.insert(
            "model.layers.0.self_attn.q_proj.bias".into(),
            Tensor::zeros(&[4]),
        );
        let err = from_hf(&cfg, &hf).unwrap_err().to_string();
        assert!(err.contains("q_proj.bias"), "{err}");
        hf.remove("model.layers.0.self_attn.q_proj.bias");
        hf.remove("model.norm.weight");
        let err = from_hf(&cfg, &hf).unwrap_err().to_string();
        assert!(err.contains("model.norm.weight"), "{err}");
    }
}
