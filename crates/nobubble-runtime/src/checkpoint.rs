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
//! On disk ([`crate::checkpoint_fs`]) this becomes a directory with `checkpoint.json`,
//! `model.safetensors` and `optimizer.safetensors`.

use crate::error::RuntimeError;
use crate::worker::Engine;
use nobubble_nn::{AdamWConfig, AdamWState, ByteCorpus, GptConfig, Stage, Tensor, TrainConfig};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

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
        format!(
            "--layers {} --hidden {} --heads {} --seq-len {} --microbatch-size {} and --microbatches × --data-parallel = {}",
            m.layers, m.hidden, m.heads, m.seq_len, m.microbatch_size, self.train.microbatches
        )
    }
}

/// Length and FNV-1a hash of a corpus: cheap, and enough to notice that a resumed run
/// reads other text than the run it continues.
pub fn corpus_fingerprint(corpus: &ByteCorpus) -> String {
    format!(
        "{} bytes, fnv1a {:016x}",
        corpus.len(),
        nobubble_nn::param::fnv1a(corpus.bytes())
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
                files: BTreeMap::new(),
            },
            state,
        }
    }

    /// Records the training text's fingerprint ([`corpus_fingerprint`]).
    pub fn with_data(mut self, corpus: &ByteCorpus) -> Self {
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
        let m = &self.meta.model;
        let diffs: Vec<String> = [
            ("layers", m.layers, model.layers),
            ("hidden", m.hidden, model.hidden),
            ("heads", m.heads, model.heads),
            ("seq_len", m.seq_len, model.seq_len),
            ("microbatch_size", m.microbatch_size, model.microbatch_size),
            ("vocab", m.vocab, model.vocab),
        ]
        .iter()
        .filter(|(_, a, b)| a != b)
        .map(|(n, a, b)| format!("{n} {b} (checkpoint: {a})"))
        .chain(
            (m.ln_eps != model.ln_eps || m.tie_embeddings != model.tie_embeddings)
                .then(|| "ln_eps / tie_embeddings".to_string()),
        )
        .collect();
        if !diffs.is_empty() {
            return Err(RuntimeError::Config(format!(
                "the checkpoint holds a different model: {}",
                diffs.join(", ")
            )));
        }
        let t = &self.meta.train;
        if t.microbatches != train.microbatches {
            return Err(RuntimeError::Config(format!(
                "the checkpoint was trained with {} microbatches per step, this run uses {} \
                 (the loss scale and the data of each step depend on it)",
                t.microbatches, train.microbatches
            )));
        }
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
            warnings.push(format!(
                "data seed {} differs from the checkpoint's {}",
                train.data_seed, t.data_seed
            ));
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
        Ok(warnings)
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

/// Error naming parameters in a checkpoint that the model does not have.
pub(crate) fn extra_params(
    params: &BTreeMap<String, Tensor>,
    loaded: &BTreeSet<String>,
) -> RuntimeError {
    let extra: Vec<&str> = params
        .keys()
        .filter(|n| !loaded.contains(*n))
        .take(3)
        .map(String::as_str)
        .collect();
    RuntimeError::Config(format!(
        "the checkpoint has {} parameters the model does not (e.g. {}); it was written for \
         another model",
        params.len() - loaded.len(),
        extra.join(", ")
    ))
}

/// Copies the values stored under each of `stage`'s parameter names into it, after
/// checking all of them exist with the right shape (so an error changes nothing).
/// Returns the names loaded.
pub(crate) fn load_params(
    stage: &mut Stage,
    params: &BTreeMap<String, Tensor>,
) -> Result<BTreeSet<String>, RuntimeError> {
    for p in stage.params() {
        match params.get(&p.name) {
            None => {
                return Err(RuntimeError::Config(format!(
                    "the checkpoint has no parameter `{}`; it was written for another model",
                    p.name
                )))
            }
            Some(t) if t.shape() != p.value.shape() => {
                return Err(RuntimeError::Config(format!(
                    "parameter `{}` has shape {:?} in the checkpoint, the model needs {:?}",
                    p.name,
                    t.shape(),
                    p.value.shape()
                )))
            }
            Some(_) => {}
        }
    }
    let mut names = BTreeSet::new();
    for p in stage.params_mut() {
        p.value.data_mut().copy_from_slice(params[&p.name].data());
        names.insert(p.name.clone());
    }
    Ok(names)
}

/// A rank's stages and optimizers, for [`crate::Pipeline::export_state`].
pub(crate) fn export_engine(engine: &Engine) -> Result<Vec<StageState>, RuntimeError> {
    match engine {
        Engine::Real { stages, optimizers } => stages
            .iter()
            .map(|(&s, st)| {
                let opt = optimizers.get(&s).ok_or_else(|| {
                    RuntimeError::Config(format!("internal: stage {s} has no optimizer"))
                })?;
                Ok(StageState {
                    stage: s,
                    params: st
                        .params()
                        .into_iter()
                        .map(|p| (p.name.clone(), p.value.clone()))
                        .collect(),
                    optimizer: opt.export_state(),
                })
            })
            .collect(),
        Engine::Emulated(_) => Err(RuntimeError::Config(
            "emulated compute has no weights to checkpoint; use real compute".into(),
        )),
    }
}

/// Loads a rank's stages and optimizers from `state` by name; returns the parameter
/// names it used (the ranks check together that they used all of them).
pub(crate) fn import_engine(
    engine: &mut Engine,
    state: &TrainingState,
) -> Result<BTreeSet<String>, RuntimeError> {
    match engine {
        Engine::Real { stages, optimizers } => {
            let mut names = BTreeSet::new();
            for (s, st) in stages.iter_mut() {
                let opt = optimizers.get_mut(s).ok_or_else(|| {
                    RuntimeError::Config(format!("internal: stage {s} has no optimizer"))
                })?;
                // Check the weights first: the optimizer import is all-or-nothing, and
                // after it succeeds the (checked) weight copy cannot fail.
                for p in st.params() {
                    if state.params.get(&p.name).map(Tensor::shape) != Some(p.value.shape()) {
                        return Err(RuntimeError::Config(format!(
                            "stage {s}: the checkpoint has no parameter `{}` of shape {:?}; it \
                             was written for another model",
                            p.name,
                            p.value.shape()
                        )));
                    }
                }
                opt.import_state(&state.optimizer)
                    .map_err(|e| RuntimeError::Config(format!("stage {s}: {e}")))?;
                names.extend(load_params(st, &state.params)?);
            }
            Ok(names)
        }
        Engine::Emulated(_) => Err(RuntimeError::Config(
            "emulated compute has no weights to load a checkpoint into; use real compute".into(),
        )),
    }
}

/// Joins the ranks' parts into one state. Every stage's optimizer must agree on the step
/// count (they step together). The last-step record may differ — after an analytic
/// rollback of a skipped post-validated step, stages that had stepped forget it while
/// stages that had not keep theirs — and only ever serves a rollback within the step
/// that made it, so a disagreement is stored as "none".
pub(crate) fn assemble(
    step: u64,
    mut parts: Vec<StageState>,
) -> Result<TrainingState, RuntimeError> {
    parts.sort_by_key(|p| p.stage);
    let first = parts
        .first()
        .ok_or_else(|| RuntimeError::Config("no stages to export".into()))?;
    let mut optimizer = AdamWState {
        config: first.optimizer.config,
        steps: first.optimizer.steps,
        last: first.optimizer.last,
        moments: BTreeMap::new(),
    };
    let mut params = BTreeMap::new();
    for part in parts {
        if part.optimizer.last != optimizer.last {
            optimizer.last = None;
        }
        if part.optimizer.steps != optimizer.steps {
            return Err(RuntimeError::Config(format!(
                "internal: stage {}'s optimizer is at step {}, stage 0's at {}",
                part.stage, part.optimizer.steps, optimizer.steps
            )));
        }
        optimizer.moments.extend(part.optimizer.moments);
        for (name, value) in part.params {
            if params.insert(name.clone(), value).is_some() {
                return Err(RuntimeError::Config(format!(
                    "internal: parameter `{name}` is held by two stages"
                )));
            }
        }
    }
    Ok(TrainingState {
        step,
        params,
        optimizer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nobubble_nn::{AdamWConfig, ParamMoments};

    fn part(stage: usize, steps: u64, last: Option<(f32, f32)>, name: &str) -> StageState {
        StageState {
            stage,
            params: vec![(name.into(), Tensor::zeros(&[2]))],
            optimizer: AdamWState {
                config: AdamWConfig::default(),
                steps,
                last,
                moments: [(
                    name.to_string(),
                    ParamMoments {
                        m: vec![0.0; 2],
                        v: vec![0.0; 2],
                    },
                )]
                .into(),
            },
        }
    }

    #[test]
    fn assemble_merges_by_name_and_checks_step_counts() {
        let s = assemble(
            5,
            vec![
                part(1, 3, Some((0.1, 1.0)), "b"),
                part(0, 3, Some((0.1, 1.0)), "a"),
            ],
        )
        .unwrap();
        assert_eq!(s.step, 5);
        assert_eq!(s.optimizer.last, Some((0.1, 1.0)));
        assert_eq!(s.params.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(s.optimizer.moments.len(), 2);
        let s = assemble(
            5,
            vec![part(0, 3, None, "a"), part(1, 3, Some((0.1, 1.0)), "b")],
        )
        .unwrap();
        assert_eq!(s.optimizer.last, None, "disagreeing last-step records");
        let e = assemble(5, vec![part(0, 3, None, "a"), part(1, 2, None, "b")]).unwrap_err();
        assert!(
            e.to_string().contains("stage 1's optimizer is at step 2"),
            "{e}"
        );
        let e = assemble(5, vec![part(0, 3, None, "a"), part(1, 3, None, "a")]).unwrap_err();
        assert!(e.to_string().contains("held by two stages"), "{e}");
    }
}

/// The wire form of training state between ranks (gathering a checkpoint, broadcasting a
/// resumed one): a JSON header (names, shapes, optimizer scalars) and the f32 data behind it.
#[derive(Serialize, Deserialize)]
struct WirePart {
    stage: usize,
    params: Vec<(String, Vec<usize>)>,
    config: AdamWConfig,
    steps: u64,
    last: Option<(f32, f32)>,
    moments: Vec<(String, usize)>,
}

/// One part to encode: (stage, named weights, optimizer state).
type WireInput<'a> = (usize, Vec<(&'a String, &'a Tensor)>, &'a AdamWState);

fn encode_wire(step: u64, parts: &[WireInput<'_>]) -> Vec<u8> {
    let headers: Vec<WirePart> = parts
        .iter()
        .map(|(stage, params, opt)| WirePart {
            stage: *stage,
            params: params
                .iter()
                .map(|(n, t)| ((*n).clone(), t.shape().to_vec()))
                .collect(),
            config: opt.config,
            steps: opt.steps,
            last: opt.last,
            moments: opt
                .moments
                .iter()
                .map(|(n, m)| (n.clone(), m.m.len()))
                .collect(),
        })
        .collect();
    let head = serde_json::to_vec(&(step, &headers)).expect("serializes");
    let mut out = Vec::new();
    out.extend_from_slice(&(head.len() as u64).to_le_bytes());
    out.extend_from_slice(&head);
    for (_, params, opt) in parts {
        for (_, t) in params {
            for x in t.data() {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        for m in opt.moments.values() {
            for x in m.m.iter().chain(&m.v) {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
    }
    out
}

#[allow(clippy::type_complexity)]
fn decode_wire(b: &[u8]) -> Result<(u64, Vec<StageState>), RuntimeError> {
    let bad =
        |why: &str| RuntimeError::Config(format!("damaged training state between ranks: {why}"));
    let n = u64::from_le_bytes(
        b.get(..8)
            .ok_or_else(|| bad("short"))?
            .try_into()
            .expect("8"),
    );
    let end = usize::try_from(n)
        .ok()
        .and_then(|n| n.checked_add(8))
        .ok_or_else(|| bad("header length"))?;
    let head = b.get(8..end).ok_or_else(|| bad("short header"))?;
    let (step, headers): (u64, Vec<WirePart>) =
        serde_json::from_slice(head).map_err(|e| bad(&e.to_string()))?;
    let mut at = end;
    let mut take = |len: usize| -> Result<Vec<f32>, RuntimeError> {
        let stop = len
            .checked_mul(4)
            .and_then(|l| l.checked_add(at))
            .ok_or_else(|| bad("data length"))?;
        let bytes = b.get(at..stop).ok_or_else(|| bad("short data"))?;
        at += 4 * len;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
            .collect())
    };
    let mut parts = Vec::new();
    for h in headers {
        let mut params = Vec::new();
        for (name, shape) in h.params {
            let data = take(shape.iter().product())?;
            params.push((
                name,
                Tensor::from_vec(&shape, data).map_err(|e| bad(&e.to_string()))?,
            ));
        }
        let mut moments = BTreeMap::new();
        for (name, len) in h.moments {
            let mv = take(2 * len)?;
            moments.insert(
                name,
                nobubble_nn::ParamMoments {
                    m: mv[..len].to_vec(),
                    v: mv[len..].to_vec(),
                },
            );
        }
        parts.push(StageState {
            stage: h.stage,
            params,
            optimizer: AdamWState {
                config: h.config,
                steps: h.steps,
                last: h.last,
                moments,
            },
        });
    }
    Ok((step, parts))
}

/// A rank's exported stages, for gathering.
pub(crate) fn encode_parts(parts: &[StageState]) -> Vec<u8> {
    let v: Vec<_> = parts
        .iter()
        .map(|p| {
            (
                p.stage,
                p.params.iter().map(|(n, t)| (n, t)).collect(),
                &p.optimizer,
            )
        })
        .collect();
    encode_wire(0, &v)
}

/// [`encode_parts`] read back.
pub(crate) fn decode_parts(b: &[u8]) -> Result<Vec<StageState>, RuntimeError> {
    decode_wire(b).map(|(_, p)| p)
}

/// A whole training state, for broadcasting.
pub(crate) fn encode_state(s: &TrainingState) -> Vec<u8> {
    encode_wire(s.step, &[(0, s.params.iter().collect(), &s.optimizer)])
}

/// [`encode_state`] read back.
pub(crate) fn decode_state(b: &[u8]) -> Result<TrainingState, RuntimeError> {
    let (step, mut parts) = decode_wire(b)?;
    let part = parts
        .pop()
        .ok_or_else(|| RuntimeError::Config("damaged training state: no part".into()))?;
    Ok(TrainingState {
        step,
        params: part.params.into_iter().collect(),
        optimizer: part.optimizer,
    })
}
