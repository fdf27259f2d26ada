//! The unpipelined reference trainer: ground truth for the pipelined runtime.
//!
//! It holds the model already split into the runtime's stages and runs, for each
//! microbatch in order, F through all stages, I back through all stages, then W on
//! all stages. Then: global grad-norm² = Σ over stages (in stage order) of each
//! stage's partial (exactly the chain order of post-validation), clip factor, one
//! AdamW step per stage.
//!
//! Bit-identity contract: a pipelined runtime using the same config, seed, data seed,
//! split and backend thread count, whose W passes on each stage run in microbatch
//! order and which sums partial norms in stage order, produces bit-identical losses,
//! gradients and weights. (The order of F and I across microbatches does not matter:
//! every gradient accumulation happens in W.)

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::backend::CpuBackend;
use crate::config::GptConfig;
use crate::data::{Corpus, Microbatch};
use crate::error::{NnError, Result};
use crate::model::sum_tied_gradients;
use crate::model::{build_stages, Stage, StageInput};
use crate::optim::{clip_scale, grad_norm_sq, AdamW, AdamWConfig};

/// Training hyper-parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Seed for the initial weights.
    pub seed: u64,
    /// Seed for the data positions.
    pub data_seed: u64,
    /// Microbatches per step (gradient accumulation count m).
    pub microbatches: usize,
    /// AdamW hyper-parameters (`lr` is the peak learning rate).
    pub optimizer: AdamWConfig,
    /// Linear warm-up length in steps (0 = none).
    pub warmup_steps: u64,
    /// Global-norm clipping threshold (None = no clipping).
    pub max_grad_norm: Option<f32>,
    /// Threads per operation (matrix products, row-wise kernels, attention sequences).
    /// Results do not depend on it: every split keeps each output's arithmetic order.
    pub threads: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            seed: 0,
            data_seed: 1,
            microbatches: 4,
            optimizer: AdamWConfig {
                lr: 3e-3,
                ..AdamWConfig::default()
            },
            warmup_steps: 20,
            max_grad_norm: Some(1.0),
            threads: 1,
        }
    }
}

impl TrainConfig {
    /// Learning rate at `step`: linear warm-up to the peak, then constant. One definition,
    /// shared by the reference trainer and the runtime, so their steps stay bit-identical.
    pub fn lr_at(&self, step: u64) -> f32 {
        let peak = self.optimizer.lr;
        if step < self.warmup_steps {
            peak * (step + 1) as f32 / self.warmup_steps as f32
        } else {
            peak
        }
    }
}

/// What one optimizer step did.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct StepReport {
    /// Step index (0-based).
    pub step: u64,
    /// Mean of the microbatch losses, before the update.
    pub loss: f32,
    /// Global gradient norm, before clipping.
    pub grad_norm: f64,
    /// Factor the gradients were multiplied by (1 = not clipped).
    pub clip_scale: f32,
    /// Learning rate used.
    pub lr: f32,
    /// True if the gradients contained inf/NaN and the update was skipped (the
    /// gradients are discarded and the step counter still advances, as in the
    /// paper's post-validation).
    pub skipped: bool,
}

/// Plain training over a split model, one pass after another.
#[derive(Debug)]
pub struct ReferenceTrainer {
    stages: Vec<Stage>,
    optimizers: Vec<AdamW>,
    corpus: Corpus,
    model: GptConfig,
    train: TrainConfig,
    step: u64,
}

impl ReferenceTrainer {
    /// Builds the model with `stage_blocks[i]` blocks on stage `i` (use `&[layers]`
    /// for an unsplit model) and one AdamW per stage.
    pub fn new(
        model: &GptConfig,
        train: &TrainConfig,
        corpus: Corpus,
        stage_blocks: &[usize],
    ) -> Result<Self> {
        if train.microbatches == 0 {
            return Err(NnError::Config("microbatches must be positive".into()));
        }
        let mut stages = build_stages(model, train.seed, stage_blocks)?;
        let backend = Arc::new(CpuBackend::with_threads(train.threads));
        for s in &mut stages {
            s.set_backend(backend.clone());
            s.set_loss_grad_scale(1.0 / train.microbatches as f32);
            s.set_microbatches(train.microbatches);
        }
        let optimizers = stages
            .iter()
            .map(|s| AdamW::new(train.optimizer, &s.params()))
            .collect();
        Ok(ReferenceTrainer {
            stages,
            optimizers,
            corpus,
            model: model.clone(),
            train: train.clone(),
            step: 0,
        })
    }

    /// The stages (weights and accumulated gradients).
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// Mutable stages, for inspection and profiling ([`Stage::measure_memory`],
    /// [`crate::bench::profile_stage`] restore the gradients they touch). Changing
    /// weights here breaks bit-identity with a runtime unless it does the same.
    pub fn stages_mut(&mut self) -> &mut [Stage] {
        &mut self.stages
    }

    /// Steps taken so far.
    pub fn steps_taken(&self) -> u64 {
        self.step
    }

    /// Learning rate at `step` (see [`TrainConfig::lr_at`]).
    pub fn lr_at(&self, step: u64) -> f32 {
        self.train.lr_at(step)
    }

    /// The data of microbatch `mb` of step `step` (what a runtime must feed too).
    pub fn microbatch(&self, step: u64, mb: usize) -> Result<Microbatch> {
        self.corpus.microbatch(
            self.train.data_seed,
            step,
            mb,
            self.model.microbatch_size,
            self.model.seq_len,
        )
    }

    /// F, I, W of every microbatch of `step`, in microbatch order, accumulating into
    /// the (zeroed beforehand by the caller or the last step) gradients. Returns the
    /// mean loss.
    pub fn accumulate_gradients(&mut self, step: u64) -> Result<f32> {
        let mut total = 0.0f64;
        for mb in 0..self.train.microbatches {
            let data = self.microbatch(step, mb)?;
            total += run_microbatch(&mut self.stages, mb, &data)? as f64;
        }
        Ok((total / self.train.microbatches as f64) as f32)
    }

    /// One full training step: accumulate, clip, AdamW on every stage, zero grads.
    /// A non-finite gradient norm skips the update (see [`StepReport::skipped`]).
    pub fn train_step(&mut self) -> Result<StepReport> {
        let step = self.step;
        let loss = self.accumulate_gradients(step)?;
        let tied = self
            .stages
            .iter_mut()
            .flat_map(|s| s.tied_grads_mut())
            .collect();
        sum_tied_gradients(tied)?;
        let norm_sq: f64 = self
            .stages
            .iter()
            .map(|s| grad_norm_sq(&s.norm_params()))
            .sum();
        let lr = self.lr_at(step);
        let scale = clip_scale(norm_sq, self.train.max_grad_norm);
        for (stage, opt) in self.stages.iter_mut().zip(&mut self.optimizers) {
            if let Ok(scale) = scale {
                opt.config.lr = lr;
                opt.step(&mut stage.params_mut(), scale)?;
            }
            stage.zero_grads();
        }
        self.step += 1;
        Ok(StepReport {
            step,
            loss,
            grad_norm: norm_sq.sqrt(),
            clip_scale: scale.as_ref().copied().unwrap_or(0.0),
            lr,
            skipped: scale.is_err(),
        })
    }
}

/// F through all stages, I back through all stages, W on all stages, for one
/// microbatch; returns its loss. Also used by tests as "the model's loss and
/// gradients".
pub fn run_microbatch(stages: &mut [Stage], mb: usize, data: &Microbatch) -> Result<f32> {
    let loss = forward_loss(stages, mb, data)?;
    let mut grad = None;
    for s in stages.iter_mut().rev() {
        grad = s.backward_input(mb, grad)?;
    }
    for s in stages.iter_mut() {
        s.backward_weight(mb)?;
    }
    Ok(loss)
}

/// F through all stages; returns the loss and leaves the stages waiting for I.
pub fn forward_loss(stages: &mut [Stage], mb: usize, data: &Microbatch) -> Result<f32> {
    if stages.is_empty() {
        return Err(NnError::Config("no stages".into()));
    }
    let last = stages.len() - 1;
    let mut act = None;
    for (i, s) in stages.iter_mut().enumerate() {
        let input = match act.take() {
            None => StageInput::Tokens(&data.tokens),
            Some(x) => StageInput::Activations(x),
        };
        let out = s.forward(mb, input, (i == last).then_some(&data.targets[..]))?;
        if i == last {
            return out.loss();
        }
        act = Some(out.into_activations()?);
    }
    unreachable!("the loop returns at the last stage")
}
