//! A GPT- or Llama-style model cut into pipeline stages (or V-placement chunks).
//!
//! A [`Stage`] owns a contiguous slice of blocks, plus the embedding if it is the
//! first stage and the final LayerNorm + LM head + loss if it is the last. It is the
//! unit a pipeline runtime drives: `forward`, `backward_input`, `backward_weight` per
//! microbatch, in any order that respects F → I → W for each microbatch.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::accumulate::TreeSum;
use crate::backend::{on_backend, Backend, CpuBackend};
use crate::config::{block_counts, Arch, GptConfig, StageLayout, TIED_ALIAS};
use crate::error::{MicrobatchId, NnError, Result};
use crate::layers::{Block, Embedding, LmHead, SplitLayer};
use crate::memory::MemoryFootprint;
use crate::param::Param;
use crate::tensor::Tensor;

/// What flows into a stage's forward.
#[derive(Debug)]
pub enum StageInput<'a> {
    /// Token ids, for the first stage (a whole number of sequences).
    Tokens(&'a [u32]),
    /// Activations `[tokens, hidden]` from the previous stage.
    Activations(Tensor),
}

/// What a stage's forward produces.
#[derive(Debug)]
pub enum StageOutput {
    /// Activations for the next stage.
    Activations(Tensor),
    /// Mean cross-entropy of the microbatch (last stage).
    Loss(f32),
}

impl StageOutput {
    /// The activations, or an error if this was the last stage.
    pub fn into_activations(self) -> Result<Tensor> {
        match self {
            StageOutput::Activations(t) => Ok(t),
            StageOutput::Loss(_) => Err(NnError::BadInput(
                "the last stage returns a loss, not activations".into(),
            )),
        }
    }

    /// The loss, or an error if this was not the last stage.
    pub fn loss(&self) -> Result<f32> {
        match self {
            StageOutput::Loss(l) => Ok(*l),
            StageOutput::Activations(_) => Err(NnError::BadInput(
                "only the last stage returns a loss".into(),
            )),
        }
    }
}

/// One pipeline stage (or chunk).
pub struct Stage {
    index: usize,
    num_stages: usize,
    first_block: usize,
    config: GptConfig,
    /// Token and position embedding (first stage only).
    pub embedding: Option<Embedding>,
    /// This stage's blocks, in model order.
    pub blocks: Vec<Block>,
    /// Final LayerNorm, LM head and loss (last stage only).
    pub head: Option<LmHead>,
    backend: Arc<dyn Backend>,
    /// Microbatches between F and W, and whether their I has run.
    in_flight: BTreeMap<MicrobatchId, bool>,
    /// The canonical summation of microbatch gradients ([`crate::accumulate`]); `None`:
    /// every W accumulates straight into the gradients.
    pub(crate) grad_tree: Option<TreeSum>,
}

impl std::fmt::Debug for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stage")
            .field("index", &self.index)
            .field("num_stages", &self.num_stages)
            .field("blocks", &self.block_range())
            .field("backend", &self.backend.describe())
            .finish()
    }
}

/// Builds the whole model as `counts.len()` stages with `counts[i]` blocks each.
/// Parameters are initialized from `seed` and their global names, so any split of
/// the same config and seed holds the same weights. Stages use a single-thread CPU
/// backend (see [`Stage::set_backend`]).
pub fn build_stages(config: &GptConfig, seed: u64, counts: &[usize]) -> Result<Vec<Stage>> {
    Ok(build_stages_where(config, seed, counts, |_| true)?
        .into_iter()
        .map(|(_, s)| s)
        .collect())
}

/// As [`build_stages`], building (and initializing) only the stages `keep` selects: a rank
/// of a pipeline holds a few stages of a model that need never fit in its memory whole.
/// Returns them with their indices; their weights are those of the whole model's build.
pub fn build_stages_where(
    config: &GptConfig,
    seed: u64,
    counts: &[usize],
    keep: impl Fn(usize) -> bool,
) -> Result<Vec<(usize, Stage)>> {
    config.validate()?;
    let counts = block_counts(
        config.layers,
        counts.len(),
        &StageLayout::Explicit(counts.to_vec()),
    )?;
    let p = counts.len();
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::single_thread());
    let mut stages = Vec::new();
    for (index, &count) in counts.iter().enumerate().filter(|(i, _)| keep(*i)) {
        let first_block: usize = counts[..index].iter().sum();
        let c = config;
        let blocks = (first_block..first_block + count)
            .map(|i| Block::new(i, c, seed))
            .collect();
        let learned_positions = c.arch == Arch::Gpt;
        stages.push((
            index,
            Stage {
                index,
                num_stages: p,
                first_block,
                config: config.clone(),
                embedding: (index == 0)
                    .then(|| Embedding::new(c.vocab, c.seq_len, c.hidden, learned_positions, seed)),
                blocks,
                head: (index == p - 1).then(|| LmHead::new(c, seed)),
                backend: backend.clone(),
                in_flight: BTreeMap::new(),
                grad_tree: None,
            },
        ));
    }
    Ok(stages)
}

/// Builds `stages` stages with the given layout (see [`StageLayout`]).
pub fn split_model(
    config: &GptConfig,
    seed: u64,
    stages: usize,
    layout: &StageLayout,
) -> Result<Vec<Stage>> {
    config.validate()?;
    let counts = block_counts(config.layers, stages, layout)?;
    build_stages(config, seed, &counts)
}

/// Builds `2·devices` chunks for V placement; chunk `c` runs on device
/// [`crate::config::v_placement_device`]`(c, devices)`.
pub fn split_model_v(
    config: &GptConfig,
    seed: u64,
    devices: usize,
    layout: &StageLayout,
) -> Result<Vec<Stage>> {
    split_model(config, seed, 2 * devices, layout)
}

impl Stage {
    /// Position of this stage in the model (0 = holds the embedding).
    pub fn index(&self) -> usize {
        self.index
    }

    /// Total number of stages the model was split into.
    pub fn num_stages(&self) -> usize {
        self.num_stages
    }

    /// Global indices of the blocks held here.
    pub fn block_range(&self) -> std::ops::Range<usize> {
        self.first_block..self.first_block + self.blocks.len()
    }

    /// True if this stage takes tokens.
    pub fn is_first(&self) -> bool {
        self.embedding.is_some()
    }

    /// True if this stage computes the loss.
    pub fn is_last(&self) -> bool {
        self.head.is_some()
    }

    /// The model configuration.
    pub fn config(&self) -> &GptConfig {
        &self.config
    }

    /// Replaces the compute backend (e.g. more threads, another SIMD level). Results are
    /// bit-identical between backends of the same SIMD level, whatever their threads.
    pub fn set_backend(&mut self, backend: Arc<dyn Backend>) {
        self.backend = backend;
    }

    /// Scales the loss gradient (e.g. `1/m` for `m` microbatches per step). No effect
    /// on stages without the head.
    pub fn set_loss_grad_scale(&mut self, scale: f32) {
        if let Some(h) = &mut self.head {
            h.loss_grad_scale = scale;
        }
    }

    fn check_forward(&self, mb: MicrobatchId) -> Result<()> {
        if let Some(e) = &self.embedding {
            e.check_forward(mb)?;
        }
        for b in &self.blocks {
            b.check_forward(mb)?;
        }
        if let Some(h) = &self.head {
            h.check_forward(mb)?;
        }
        Ok(())
    }

    /// F for microbatch `mb`. The first stage takes tokens; the last needs `targets`
    /// (one per token) and returns the loss. All pass-order checks run before any
    /// state changes, so an error leaves the stage untouched.
    pub fn forward(
        &mut self,
        mb: MicrobatchId,
        input: StageInput<'_>,
        targets: Option<&[u32]>,
    ) -> Result<StageOutput> {
        let be = self.backend.clone();
        on_backend(be.as_ref(), || self.forward_here(mb, input, targets))
    }

    fn forward_here(
        &mut self,
        mb: MicrobatchId,
        input: StageInput<'_>,
        targets: Option<&[u32]>,
    ) -> Result<StageOutput> {
        self.check_forward(mb)?;
        if self.is_last() {
            let rows = match &input {
                StageInput::Tokens(t) => t.len(),
                StageInput::Activations(x) => x.rows(),
            };
            let vocab = self.config.vocab;
            match targets {
                None => {
                    return Err(NnError::BadInput(format!(
                        "stage {} is last and needs targets",
                        self.index
                    )))
                }
                Some(t) if t.len() != rows => {
                    return Err(NnError::BadInput(format!(
                        "{} targets for {rows} tokens",
                        t.len()
                    )))
                }
                Some(t) if t.iter().any(|&v| v as usize >= vocab) => {
                    return Err(NnError::BadInput(format!(
                        "a target id is outside the vocabulary of {vocab}"
                    )))
                }
                Some(_) => {}
            }
        }
        let h = self.config.hidden;
        let be = self.backend.clone();
        let mut x = match (input, &mut self.embedding) {
            (StageInput::Tokens(t), Some(e)) => e.forward(be.as_ref(), mb, t)?,
            (StageInput::Activations(x), None) => {
                if x.cols() != h || x.rows() == 0 || x.rows() % self.config.seq_len != 0 {
                    return Err(NnError::BadInput(format!(
                        "stage {} expects activations [k·{}, {h}], got {:?}",
                        self.index,
                        self.config.seq_len,
                        x.shape()
                    )));
                }
                x
            }
            (StageInput::Tokens(_), None) => {
                return Err(NnError::BadInput(format!(
                    "stage {} takes activations, not tokens",
                    self.index
                )))
            }
            (StageInput::Activations(_), Some(_)) => {
                return Err(NnError::BadInput(
                    "the first stage takes tokens, not activations".into(),
                ))
            }
        };
        for b in &mut self.blocks {
            x = b.forward(be.as_ref(), mb, x)?;
        }
        let out = match &mut self.head {
            Some(head) => {
                StageOutput::Loss(head.forward(be.as_ref(), mb, x, targets.unwrap_or(&[]))?)
            }
            None => StageOutput::Activations(x),
        };
        self.in_flight.insert(mb, false);
        Ok(out)
    }

    /// I for microbatch `mb`: takes the gradient of the stage output (None on the last
    /// stage, which starts from the loss) and returns the gradient of its input (None
    /// on the first stage: tokens have no gradient).
    pub fn backward_input(
        &mut self,
        mb: MicrobatchId,
        grad_output: Option<Tensor>,
    ) -> Result<Option<Tensor>> {
        let be = self.backend.clone();
        on_backend(be.as_ref(), || self.backward_input_here(mb, grad_output))
    }

    fn backward_input_here(
        &mut self,
        mb: MicrobatchId,
        grad_output: Option<Tensor>,
    ) -> Result<Option<Tensor>> {
        if let Some(h) = &self.head {
            h.check_input_grad(mb)?;
        }
        for b in &self.blocks {
            b.check_input_grad(mb)?;
        }
        if let Some(e) = &self.embedding {
            e.check_input_grad(mb)?;
        }
        let be = self.backend.clone();
        let mut dy = match (&mut self.head, grad_output) {
            (Some(head), None) => head.backward_input(be.as_ref(), mb)?,
            (None, Some(g)) => g,
            (Some(_), Some(_)) => {
                return Err(NnError::BadInput(
                    "the last stage starts its backward from the loss; pass no gradient".into(),
                ))
            }
            (None, None) => {
                return Err(NnError::BadInput(format!(
                    "stage {} needs the gradient of its output",
                    self.index
                )))
            }
        };
        for b in self.blocks.iter_mut().rev() {
            dy = b.backward_input(be.as_ref(), mb, dy)?;
        }
        let grad_input = match &mut self.embedding {
            Some(e) => {
                e.backward_input(mb, dy)?;
                None
            }
            None => Some(dy),
        };
        self.in_flight.insert(mb, true);
        Ok(grad_input)
    }

    /// W for microbatch `mb`: accumulates every parameter gradient of this stage and
    /// frees what I kept. Errors (without changing anything) if nothing is queued.
    pub fn backward_weight(&mut self, mb: MicrobatchId) -> Result<()> {
        let be = self.backend.clone();
        on_backend(be.as_ref(), || self.backward_weight_here(mb))
    }

    fn backward_weight_here(&mut self, mb: MicrobatchId) -> Result<()> {
        if let Some(e) = &self.embedding {
            e.check_weight_grad(mb)?;
        }
        for b in &self.blocks {
            b.check_weight_grad(mb)?;
        }
        if let Some(h) = &self.head {
            h.check_weight_grad(mb)?;
        }
        let be = self.backend.clone();
        if let Some(e) = &mut self.embedding {
            e.backward_weight(be.as_ref(), mb)?;
        }
        for b in &mut self.blocks {
            b.backward_weight(be.as_ref(), mb)?;
        }
        if let Some(h) = &mut self.head {
            h.backward_weight(be.as_ref(), mb)?;
        }
        self.in_flight.remove(&mb);
        if let Some(mut tree) = self.grad_tree.take() {
            // This microbatch's gradient is a leaf of the tree; the gradients start from
            // zero again for the next one, and receive the total after the last.
            let leaf: Vec<Tensor> = self
                .params_mut()
                .into_iter()
                .map(|p| {
                    let zero = Tensor::zeros(p.grad.shape());
                    std::mem::replace(&mut p.grad, zero)
                })
                .collect();
            if let Some(total) = tree.push(leaf) {
                for (p, g) in self.params_mut().into_iter().zip(total) {
                    p.grad = g;
                }
            }
            self.grad_tree = Some(tree);
        }
        Ok(())
    }

    /// Sums the gradients of each run of `microbatches` W passes in the canonical halving
    /// tree ([`crate::accumulate`]) instead of one after the other: what makes data-parallel
    /// replicas reproduce a single replica's bits. The trainers and the runtime all set it.
    pub fn set_microbatches(&mut self, microbatches: usize) {
        self.grad_tree = Some(TreeSum::new(microbatches));
    }

    /// W passes of the current step still to come before the gradients hold the step's
    /// total (0 when complete or without a tree).
    pub fn weight_grads_to_go(&self) -> usize {
        self.grad_tree.as_ref().map_or(0, |t| {
            if t.seen() == 0 {
                0
            } else {
                t.leaves() - t.seen()
            }
        })
    }

    /// Forgets microbatch `mb` entirely — what its F (and I) saved — as if it never ran:
    /// a runtime throwing away speculative passes run with weights that were then rolled
    /// back. Gradients already accumulated are not touched.
    pub fn discard(&mut self, mb: MicrobatchId) {
        if let Some(e) = &mut self.embedding {
            e.discard(mb);
        }
        for b in &mut self.blocks {
            b.discard(mb);
        }
        if let Some(h) = &mut self.head {
            h.discard(mb);
        }
        self.in_flight.remove(&mb);
    }

    /// Microbatches whose F ran but not yet their I, in increasing order.
    pub fn pending_input_grads(&self) -> Vec<MicrobatchId> {
        self.in_flight
            .iter()
            .filter(|(_, &i)| !i)
            .map(|(&mb, _)| mb)
            .collect()
    }

    /// Microbatches whose I ran but not yet their W, in increasing order (what a
    /// runtime must still flush before the optimizer step).
    pub fn pending_weight_grads(&self) -> Vec<MicrobatchId> {
        self.in_flight
            .iter()
            .filter(|(_, &i)| i)
            .map(|(&mb, _)| mb)
            .collect()
    }

    /// Parameters in a fixed order (embedding, blocks, head).
    pub fn params(&self) -> Vec<&Param> {
        let mut p: Vec<&Param> = self.embedding.iter().flat_map(|e| e.params()).collect();
        for b in &self.blocks {
            p.extend(b.params());
        }
        if let Some(h) = &self.head {
            p.extend(h.params());
        }
        p
    }

    /// Mutable parameters, same order as [`Stage::params`].
    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p: Vec<&mut Param> = self
            .embedding
            .iter_mut()
            .flat_map(|e| e.params_mut())
            .collect();
        for b in &mut self.blocks {
            p.extend(b.params_mut());
        }
        if let Some(h) = &mut self.head {
            p.extend(h.params_mut());
        }
        p
    }

    /// Parameters whose gradients count toward the gradient norm: all but a tied LM head's
    /// copy of the embedding (the shared tensor counts once, on the first stage).
    pub fn norm_params(&self) -> Vec<&Param> {
        self.params()
            .into_iter()
            .filter(|p| !(self.config.tie_embeddings && p.name == TIED_ALIAS))
            .collect()
    }

    /// With tied embeddings, the gradients of the shared tensor's copies this stage holds —
    /// the embedding's (first stage), then the LM head's (last stage) —, for
    /// [`sum_tied_gradients`]; empty otherwise.
    pub fn tied_grads_mut(&mut self) -> Vec<&mut Tensor> {
        if !self.config.tie_embeddings {
            return Vec::new();
        }
        let embedding = self.embedding.iter_mut().map(|e| &mut e.tokens.grad);
        let head = self.head.iter_mut().map(|h| &mut h.lm_head.weight.grad);
        embedding.chain(head).collect()
    }

    /// Clears all gradient accumulators (and any partial tree sum).
    pub fn zero_grads(&mut self) {
        if let Some(t) = &mut self.grad_tree {
            t.reset();
        }
        for p in self.params_mut() {
            p.zero_grad();
        }
    }

    /// Activation bytes held for `mb`, per top-level layer (`embed`, `blocks.i`, `head`).
    pub fn layer_held_bytes(&self, mb: MicrobatchId) -> Vec<(String, usize)> {
        let mut out = Vec::new();
        if let Some(e) = &self.embedding {
            out.push(("embed".to_string(), e.held_bytes(mb)));
        }
        for (i, b) in self.blocks.iter().enumerate() {
            out.push((format!("blocks.{}", self.first_block + i), b.held_bytes(mb)));
        }
        if let Some(h) = &self.head {
            out.push(("head".to_string(), h.held_bytes(mb)));
        }
        out
    }

    /// Activation bytes held for `mb` by the whole stage.
    pub fn held_bytes(&self, mb: MicrobatchId) -> usize {
        self.layer_held_bytes(mb).iter().map(|(_, b)| b).sum()
    }

    /// Measures M_B and M_W of this stage for one microbatch of `config.microbatch_size`
    /// sequences by running F, I and W on synthetic data under a reserved microbatch id.
    /// Gradient accumulators are restored afterwards, so this is safe mid-training.
    pub fn measure_memory(&mut self) -> Result<StageMemory> {
        const PROBE: MicrobatchId = MicrobatchId::MAX;
        let tree = self.grad_tree.take();
        let r = self.measure_memory_untracked(PROBE);
        self.grad_tree = tree;
        r
    }

    fn measure_memory_untracked(&mut self, probe: MicrobatchId) -> Result<StageMemory> {
        let n = self.config.tokens_per_microbatch();
        let saved_grads: Vec<Tensor> = self.params().iter().map(|p| p.grad.clone()).collect();
        let tokens = vec![0u32; n];
        let input = if self.is_first() {
            StageInput::Tokens(&tokens)
        } else {
            StageInput::Activations(Tensor::zeros(&[n, self.config.hidden]))
        };
        self.forward(probe, input, Some(&tokens))?;
        let after_f = self.layer_held_bytes(probe);
        let grad = (!self.is_last()).then(|| Tensor::zeros(&[n, self.config.hidden]));
        self.backward_input(probe, grad)?;
        let after_i = self.layer_held_bytes(probe);
        self.backward_weight(probe)?;
        let after_w = self.layer_held_bytes(probe);
        for (p, g) in self.params_mut().into_iter().zip(saved_grads) {
            p.grad = g;
        }
        let per_layer: Vec<(String, MemoryFootprint)> = after_f
            .iter()
            .zip(&after_i)
            .zip(&after_w)
            .map(|(((name, f), (_, i)), (_, w))| {
                (
                    name.clone(),
                    MemoryFootprint {
                        after_forward: *f,
                        after_input_grad: *i,
                        after_weight_grad: *w,
                    },
                )
            })
            .collect();
        let total = MemoryFootprint {
            after_forward: per_layer.iter().map(|(_, m)| m.after_forward).sum(),
            after_input_grad: per_layer.iter().map(|(_, m)| m.after_input_grad).sum(),
            after_weight_grad: per_layer.iter().map(|(_, m)| m.after_weight_grad).sum(),
        };
        Ok(StageMemory { total, per_layer })
    }
}

/// Sums the step's gradients of a tied embedding's two copies — the embedding's and the LM
/// head's, each complete for the step — into both, so that both copies take the same step as
/// one shared tensor would. (Two addends: the sum is the same bits in either order.)
pub fn sum_tied_gradients(mut grads: Vec<&mut Tensor>) -> Result<()> {
    match grads.as_mut_slice() {
        [] => Ok(()),
        [a, b] if a.shape() == b.shape() => {
            add_tied_gradient(a, b.data())?;
            b.data_mut().copy_from_slice(a.data());
            Ok(())
        }
        other => Err(NnError::Config(format!(
            "tied embeddings: {} copies of the shared tensor's gradient (expected the embedding's \
             and the LM head's, of one shape)",
            other.len()
        ))),
    }
}

/// Adds the other copy's gradient of a tied embedding to this one's: the one sum both
/// [`sum_tied_gradients`] (both copies on one rank) and the runtime (copies on two ranks, each
/// adding the other's) use, so every layout takes the same bits.
pub fn add_tied_gradient(own: &mut Tensor, other: &[f32]) -> Result<()> {
    if own.len() != other.len() {
        return Err(NnError::Config(format!(
            "the other copy's gradient has {} values, this copy has {}",
            other.len(),
            own.len()
        )));
    }
    for (d, s) in own.data_mut().iter_mut().zip(other) {
        *d += s;
    }
    Ok(())
}

/// Measured activation memory of one microbatch on one stage.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StageMemory {
    /// Whole stage: `after_forward` is M_B, `after_input_grad` is M_W.
    pub total: MemoryFootprint,
    /// Per top-level layer (`embed`, `blocks.i`, `head`).
    pub per_layer: Vec<(String, MemoryFootprint)>,
}
