//! `nobubble export`: a checkpoint's weights in another program's format — today Hugging
//! Face's (`config.json` + `model.safetensors` of `LlamaForCausalLM`), which transformers'
//! `AutoModelForCausalLM.from_pretrained` loads.

use clap::Args;
use nobubble_runtime::checkpoint::hf;
use nobubble_runtime::checkpoint_fs::load_resolved_weights;
use std::path::PathBuf;

/// Arguments of `export`.
#[derive(Args, Debug)]
pub struct ExportArgs {
    /// Checkpoint: a run directory of `train --save` (its latest step) or one step of it.
    pub checkpoint: PathBuf,
    /// Directory to write (created; it must be new or empty unless --overwrite).
    pub out: PathBuf,
    /// Format to write.
    #[arg(long, value_parser = ["hf"], default_value = "hf")]
    pub format: String,
    /// Replace a model this command exported into OUT before.
    #[arg(long)]
    pub overwrite: bool,
}

/// Runs `export`.
pub fn run(a: &ExportArgs) -> Result<(), String> {
    if a.out.exists() && !a.out.is_dir() {
        return Err(format!(
            "OUT {} is a file; the export writes a directory (config.json, model.safetensors): \
             give a new or existing directory",
            a.out.display()
        ));
    }
    let (dir, ckpt) =
        load_resolved_weights(&a.checkpoint).map_err(|e| format!("CHECKPOINT: {e}"))?;
    let done = hf::export(&ckpt, &a.out, a.overwrite).map_err(|e| e.to_string())?;
    let m = &ckpt.meta.model;
    eprintln!(
        "exported {} (step {}, {} {} layers, h {}, {} heads, {} K/V heads) as {} tensors:",
        dir.display(),
        ckpt.meta.step,
        m.arch.name(),
        m.layers,
        m.hidden,
        m.heads,
        m.kv_heads(),
        done.parameters
    );
    for f in &done.files {
        println!("{}", f.display());
    }
    let ids = if ckpt.meta.tokenizer.is_some() {
        "its tokenizer.json: PreTrainedTokenizerFast(tokenizer_file=…)"
    } else {
        "token ids are bytes: 0–255"
    };
    eprintln!(
        "load it with: AutoModelForCausalLM.from_pretrained(\"{}\") ({ids})",
        a.out.display()
    );
    Ok(())
}
