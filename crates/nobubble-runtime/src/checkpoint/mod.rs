//! Training state that outlives a run: weights and AdamW state keyed by *global*
//! parameter names, plus the step counter.
//!
//! Names, not stage indices, are the key because the model's weights and every
//! per-parameter optimizer moment do not depend on how the model is split: a state
//! exported from 4 stages imports into 2 (or into one unpipelined [`Stage`] for
//! sampling). The step counter is the rest of the training state — the data of a step
//! is a pure function of (data seed, step, microbatch) and the learning rate of
//! (step, warm-up) — so importing it continues the run exactly where it stopped.
//!
//! On disk ([`fs`], also at its old path `crate::checkpoint_fs`) this becomes a directory
//! with `checkpoint.json`, `model.safetensors` and `optimizer.safetensors`; run directories
//! of them are [`runs`]. What moves state between a rank's stages and a [`TrainingState`]
//! is `state.rs`; its form on the wire between ranks, `wire.rs`.

pub mod fs;
pub mod hf;
pub mod lock;
pub mod runs;
mod state;
mod wire;

pub(crate) use state::{assemble, export_engine, extra_params, import_engine, load_params};
pub(crate) use wire::{decode_parts, decode_state, encode_parts, encode_state};

use crate::error::RuntimeError;
use nobubble_nn::{AdamWConfig, AdamWState, Corpus, GptConfig, Stage, Tensor, TrainConfig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Weights, optimizer state and step of a whole model, independent of its split.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainingState {
    /// Steps completed: the next step to run (drives the data and the warm-up).
    pub step: u64,
    /// Every parameter's value by global name (`blocks.3.attn.qkv.weight`).
    pub params: BTreeMap<String, Tensor>,
    /// AdamW state: step count and last step's (lr, scale), shared by all stages (they
    /// step together), and every parameter's moments by name.
    pub optimizer: AdamWState,
}

/// What one stage contributes to a [`TrainingState`].
#[derive(Debug)]
pub(crate) struct StageState {
    pub stage: usize,
    pub params: Vec<(String, Tensor)>,
    pub optimizer: AdamWState,
}

/// Everything about the run a checkpoint came from that resuming or sampling needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// Always [`FORMAT`]; tells a checkpoint from any other JSON file.
    pub format: String,
    /// Layout version ([`VERSION`]); a newer one is refused instead of misread.
    pub version: u32,
    /// Steps completed when it was written.
    pub step: u64,
    /// The model; resuming requires the same, sampling rebuilds it from this.
    pub model: GptConfig,
    /// The training settings (microbatches — of the global step, all data-parallel replicas
    /// together — must match on resume; the others are
    /// reported if they change, since then the run no longer matches an uninterrupted
    /// one).
    pub train: TrainConfig,
    /// AdamW steps taken (lower than `step` when steps were skipped on inf/NaN).
    pub optimizer_steps: u64,
    /// AdamW's record of the last step: (lr, gradient scale).
    pub optimizer_last: Option<(f32, f32)>,
    /// AdamW's hyper-parameters as last used (`lr` is the last step's learning rate).
    pub optimizer_config: AdamWConfig,
    /// Number of parameter tensors, a cross-check against `model.safetensors`.
    pub parameters: usize,
    /// How the run that wrote it was pipelined (informational: any split can resume).
    pub saved_from: String,
    /// Fingerprint of the training text ([`corpus_fingerprint`]), if the writer gave
    /// one: resuming on other text is allowed (fine-tuning) but is not a continuation.
    #[serde(default)]
    pub data: Option<String>,
    /// Size and SHA-256 of every other file of the checkpoint, verified on load (absent in
    /// checkpoints written before nobubble recorded them: those load unverified).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, FileSum>,
    /// The `tokenizer.json` the run's data was tokenized with (`None`: bytes are the ids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    /// In a run directory: the SHA-256 of the `checkpoint.json` of the checkpoint `latest`
    /// named when this one was saved. A save killed after its step directory was in place but before
    /// `latest` moved is thereby known as the successor of `latest`, and is resumed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follows: Option<String>,
}

/// A file's size and SHA-256, hex.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSum {
    /// Bytes.
    pub bytes: u64,
    /// SHA-256 of the contents, lower-case hex.
    pub sha256: String,
}

impl CheckpointMeta {
    /// The `train` flags that reproduce the checkpoint's model and step shape, for messages.
    pub fn flags(&self) -> String {
        let m = &self.model;
        let mut flags = format!(
            "--layers {} --hidden {} --heads {} --seq-len {} --microbatch-size {}",
            m.layers, m.hidden, m.heads, m.seq_len, m.microbatch_size
        );
        // The flags beyond the shape, where the checkpoint's differ from the defaults.
        // Always named: a user who gave --arch llama needs to read --arch gpt here.
        flags += &format!(" --arch {}", m.arch.name());
        if m.arch == nobubble_nn::config::Arch::Llama {
            if let Some(kv) = m.kv_heads {
                flags += &format!(" --kv-heads {kv}");
            }
            if m.rope_theta != 10_000.0 {
                flags += &format!(" --rope-theta {}", m.rope_theta);
            }
        }
        if let Some(f) = m.ffn_hidden {
            flags += &format!(" --ffn-hidden {f}");
        }
        if m.tie_embeddings {
            flags += " --tie-embeddings";
        }
        format!(
            "{flags} and --microbatches × --data-parallel = {}",
            self.train.microbatches
        )
    }
}

/// Length and FNV-1a hash of a corpus: cheap, and enough to notice that a resumed run
/// reads other text than the run it continues.
pub fn corpus_fingerprint(corpus: &Corpus) -> String {
    let unit = if corpus.bytes().is_some() {
        "bytes"
    } else {
        "tokens"
    };
    format!(
        "{} {unit}, fnv1a {:016x}",
        corpus.len(),
        corpus.content_hash()
    )
}

/// Value of [`CheckpointMeta::format`].
pub const FORMAT: &str = "nobubble-checkpoint";
/// Current [`CheckpointMeta::version`].
pub const VERSION: u32 = 1;

/// A checkpoint read into memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// Configuration and step.
    pub meta: CheckpointMeta,
    /// The tensors.
    pub state: TrainingState,
}

impl Checkpoint {
    /// Pairs a state with the run's configuration.
    pub fn new(
        state: TrainingState,
        model: &GptConfig,
        train: &TrainConfig,
        saved_from: &str,
    ) -> Self {
        Checkpoint {
            meta: CheckpointMeta {
                format: FORMAT.into(),
                version: VERSION,
                step: state.step,
                model: model.clone(),
                train: train.clone(),
                optimizer_steps: state.optimizer.steps,
                optimizer_last: state.optimizer.last,
                optimizer_config: state.optimizer.config,
                parameters: state.params.len(),
                saved_from: saved_from.into(),
                data: None,
                tokenizer: None,
                files: BTreeMap::new(),
                follows: None,
            },
            state,
        }
    }

    /// Records the tokenizer's `tokenizer.json` (sampling, scoring and export use it).
    pub fn with_tokenizer(mut self, tokenizer: Option<&str>) -> Self {
        self.meta.tokenizer = tokenizer.map(str::to_string);
        self
    }

    /// Records the training data's fingerprint ([`corpus_fingerprint`]).
    pub fn with_data(mut self, corpus: &Corpus) -> Self {
        self.meta.data = Some(corpus_fingerprint(corpus));
        self
    }

    /// Refuses to resume a run of `model` with `train` from this checkpoint if the model
    /// or the microbatch count differ (the weights would not fit, or the loss scale and
    /// the data per step would change). Returns warnings for settings that may change
    /// but make the continuation differ from an uninterrupted run.
    pub fn check_resume(
        &self,
        model: &GptConfig,
        train: &TrainConfig,
    ) -> Result<Vec<String>, RuntimeError> {
        self.check_same_model(model)?;
        let t = &self.meta.train;
        if t.microbatches != train.microbatches {
            return Err(RuntimeError::Config(format!(
                "the checkpoint was trained with {} microbatches per step, this run uses {} \
                 (the loss scale and the data of each step depend on it)",
                t.microbatches, train.microbatches
            )));
        }
        self.check_optimizer_record()?;
        Ok(self.resume_warnings(train))
    }

    /// Refuses a model whose shape differs from the checkpoint's.
    fn check_same_model(&self, model: &GptConfig) -> Result<(), RuntimeError> {
        let m = &self.meta.model;
        let diffs: Vec<String> = [
            ("layers", m.layers, model.layers),
            ("hidden", m.hidden, model.hidden),
            ("heads", m.heads, model.heads),
            ("seq_len", m.seq_len, model.seq_len),
            ("microbatch_size", m.microbatch_size, model.microbatch_size),
            ("vocab", m.vocab, model.vocab),
            ("kv_heads", m.kv_heads(), model.kv_heads()),
            ("ffn_hidden", m.ffn_hidden(), model.ffn_hidden()),
        ]
        .iter()
        .filter(|(_, a, b)| a != b)
        .map(|(n, a, b)| format!("{n} {b} (checkpoint: {a})"))
        .chain(
            (m.arch != model.arch)
                .then(|| format!("arch {} (checkpoint: {})", model.arch.name(), m.arch.name())),
        )
        .chain(
            (m.arch == nobubble_nn::config::Arch::Llama && m.rope_theta != model.rope_theta).then(
                || {
                    format!(
                        "rope_theta {} (checkpoint: {})",
                        model.rope_theta, m.rope_theta
                    )
                },
            ),
        )
        .chain((m.tie_embeddings != model.tie_embeddings).then(|| {
            let on = |t: bool| if t { "on" } else { "off" };
            format!(
                "tie_embeddings (--tie-embeddings) {} (checkpoint: {})",
                on(model.tie_embeddings),
                on(m.tie_embeddings)
            )
        }))
        .chain(
            (m.ln_eps != model.ln_eps)
                .then(|| format!("ln_eps {} (checkpoint: {})", model.ln_eps, m.ln_eps)),
        )
        .collect();
        if !diffs.is_empty() {
            return Err(RuntimeError::Config(format!(
                "the checkpoint holds a different model: {}",
                diffs.join(", ")
            )));
        }
        Ok(())
    }

    /// Refuses a checkpoint whose record of its optimizer is out of range or disagrees with
    /// itself.
    fn check_optimizer_record(&self) -> Result<(), RuntimeError> {
        // The checkpoint's record of its optimizer must make sense and agree with itself: a
        // value out of range means the file was damaged or edited. (The run continues with its
        // own hyper-parameters; a difference is warned about below.)
        let o = &self.meta.optimizer_config;
        let bad = [
            ("lr", o.lr.is_finite() && o.lr >= 0.0),
            ("beta1", (0.0..1.0).contains(&o.beta1)),
            ("beta2", (0.0..1.0).contains(&o.beta2)),
            ("eps", o.eps.is_finite() && o.eps > 0.0),
            (
                "weight_decay",
                o.weight_decay.is_finite() && o.weight_decay >= 0.0,
            ),
        ];
        if let Some((name, _)) = bad.iter().find(|(_, ok)| !ok) {
            return Err(RuntimeError::Config(format!(
                "the checkpoint's optimizer setting `{name}` is out of range ({o:?}); the \
                 checkpoint is damaged or was edited"
            )));
        }
        if self.meta.optimizer_steps > self.meta.step {
            return Err(RuntimeError::Config(format!(
                "the checkpoint's optimizer took {} steps but the run only {}; the checkpoint \
                 is damaged or was edited",
                self.meta.optimizer_steps, self.meta.step
            )));
        }
        Ok(())
    }

    /// The settings `train` may change on a resume that make the continuation differ from an
    /// uninterrupted run.
    fn resume_warnings(&self, train: &TrainConfig) -> Vec<String> {
        let t = &self.meta.train;
        let mut warnings = Vec::new();
        let (saved_opt, r) = (&t.optimizer, &train.optimizer);
        for (name, saved, now) in [
            ("peak learning rate", saved_opt.lr, r.lr),
            ("beta1", saved_opt.beta1, r.beta1),
            ("beta2", saved_opt.beta2, r.beta2),
            ("eps", saved_opt.eps, r.eps),
            ("weight decay", saved_opt.weight_decay, r.weight_decay),
        ] {
            if saved != now {
                warnings.push(format!(
                    "AdamW {name} {now} differs from the checkpoint's {saved}"
                ));
            }
        }
        if t.data_seed != train.data_seed {
            // Named as the user gave it: `train` derives the data seed from --seed.
            warnings.push(if t.seed != train.seed {
                format!(
                    "--seed {} differs from the checkpoint's {} (the data order follows it)",
                    train.seed, t.seed
                )
            } else {
                format!(
                    "data seed {} differs from the checkpoint's {}",
                    train.data_seed, t.data_seed
                )
            });
        }
        if t.warmup_steps != train.warmup_steps {
            warnings.push(format!(
                "warm-up {} differs from the checkpoint's {}",
                train.warmup_steps, t.warmup_steps
            ));
        }
        if t.max_grad_norm != train.max_grad_norm {
            warnings.push("gradient clipping differs from the checkpoint's".into());
        }
        warnings
    }

    /// The whole model as one unpipelined stage holding the checkpoint's weights (for
    /// sampling and evaluation).
    pub fn build_model(&self) -> Result<Stage, RuntimeError> {
        let mut stages = nobubble_nn::build_stages(
            &self.meta.model,
            self.meta.train.seed,
            &[self.meta.model.layers],
        )
        .map_err(|e| RuntimeError::Config(format!("checkpoint model: {e}")))?;
        let mut stage = stages.pop().expect("one stage");
        let loaded = load_params(&mut stage, &self.state.params)?;
        if loaded.len() != self.state.params.len() {
            return Err(extra_params(&self.state.params, &loaded));
        }
        Ok(stage)
    }
}
