//! The end of the model on the last stage: final LayerNorm, LM head (no bias) and
//! softmax cross-entropy.
//!
//! The loss saves the probabilities and targets in F; its I turns them into the logit
//! gradient and frees them. The LM head is a [`Linear`], so its weight gradient is
//! deferred to W like every other linear.

use super::{Linear, Norm, SplitLayer, INIT_STD};
use crate::backend::Backend;
use crate::config::{GptConfig, TIED_ALIAS, TIED_EMBEDDING};
use crate::error::{MicrobatchId, NnError, Result};
use crate::memory::PassState;
use crate::param::{Init, Param};
use crate::tensor::Tensor;

/// Final norm, vocabulary projection and loss.
#[derive(Debug)]
pub struct LmHead {
    /// Final norm (`final_ln`): LayerNorm for GPT, RMSNorm for Llama.
    pub final_ln: Norm,
    /// Projection to the vocabulary `[h, vocab]` (`lm_head.weight`), or with tied embeddings
    /// a copy of the `[vocab, h]` embedding used transposed.
    pub lm_head: Linear,
    /// Scale applied to the loss gradient. 1.0 gives the gradient of this
    /// microbatch's mean loss; the trainer sets `1/m` so that `m` accumulated
    /// microbatches give the gradient of the mean over the step.
    pub loss_grad_scale: f32,
    loss: PassState<(Tensor, Vec<u32>), ()>,
}

impl LmHead {
    /// New head for `config`'s model.
    pub fn new(config: &GptConfig, seed: u64) -> Self {
        let (hidden, eps) = (config.hidden, config.ln_eps);
        let lm_head = if config.tie_embeddings {
            // The embedding's own init (its name seeds it), under the alias's name.
            let mut weight = Param::new(
                TIED_EMBEDDING,
                &[config.vocab, hidden],
                Init::Normal(INIT_STD),
                false,
                seed,
            );
            weight.name = TIED_ALIAS.to_string();
            Linear::transposed("lm_head", weight)
        } else {
            Linear::new("lm_head", hidden, config.vocab, false, INIT_STD, seed)
        };
        LmHead {
            final_ln: Norm::for_arch(config.arch, "final_ln", hidden, eps, seed),
            lm_head,
            loss_grad_scale: 1.0,
            loss: PassState::new("loss"),
        }
    }

    /// F: mean cross-entropy of predicting `targets` (one per row of `x`).
    pub fn forward(
        &mut self,
        be: &dyn Backend,
        mb: MicrobatchId,
        x: Tensor,
        targets: &[u32],
    ) -> Result<f32> {
        let vocab = self.lm_head.out_features();
        if targets.len() != x.rows() {
            return Err(NnError::BadInput(format!(
                "{} targets for {} token rows",
                targets.len(),
                x.rows()
            )));
        }
        if let Some(bad) = targets.iter().find(|&&t| t as usize >= vocab) {
            return Err(NnError::BadInput(format!(
                "target id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        self.loss.check_forward(mb)?;
        self.lm_head.check_forward(mb)?;
        let y = self.final_ln.forward_ref(be, mb, &x)?;
        drop(x);
        let logits = self.lm_head.forward(be, mb, y)?;
        let (loss, probs) = be.cross_entropy_forward(&logits, targets);
        self.loss.save_forward(mb, (probs, targets.to_vec()))?;
        Ok(loss)
    }

    /// I: gradient of `loss_grad_scale × mean loss` w.r.t. the head's input.
    pub fn backward_input(&mut self, be: &dyn Backend, mb: MicrobatchId) -> Result<Tensor> {
        self.loss.check_input_grad(mb)?;
        self.lm_head.check_input_grad(mb)?;
        let (probs, targets) = self.loss.take_forward(mb)?;
        let scale = self.loss_grad_scale / targets.len() as f32;
        let dlogits = be.cross_entropy_backward(probs, &targets, scale);
        let dy = self.lm_head.backward_input(be, mb, dlogits)?;
        self.final_ln.backward_input(be, mb, dy)
    }

    /// W: LM head and final LayerNorm weight gradients.
    pub fn backward_weight(&mut self, be: &dyn Backend, mb: MicrobatchId) -> Result<()> {
        self.final_ln.check_weight_grad(mb)?;
        self.lm_head.backward_weight(be, mb)?;
        self.final_ln.backward_weight(be, mb)
    }

    /// Logits of `x` alone (inference: nothing saved).
    pub(crate) fn logits(&self, be: &dyn Backend, x: &Tensor) -> Tensor {
        self.lm_head.apply(be, &self.final_ln.apply(be, x))
    }

    /// Errors if F may not run for `mb` now.
    pub fn check_forward(&self, mb: MicrobatchId) -> Result<()> {
        self.final_ln.check_forward(mb)
    }

    /// Errors if I may not run for `mb` now.
    pub fn check_input_grad(&self, mb: MicrobatchId) -> Result<()> {
        self.loss.check_input_grad(mb)
    }

    /// Errors if W may not run for `mb` now.
    pub fn check_weight_grad(&self, mb: MicrobatchId) -> Result<()> {
        self.lm_head.check_weight_grad(mb)
    }

    /// Activation bytes held for `mb`.
    pub fn held_bytes(&self, mb: MicrobatchId) -> usize {
        self.final_ln.held_bytes(mb) + self.lm_head.held_bytes(mb) + self.loss.held_bytes(mb)
    }

    /// Forgets everything held for `mb`.
    pub fn discard(&mut self, mb: MicrobatchId) {
        self.final_ln.discard(mb);
        self.lm_head.discard(mb);
        self.loss.discard(mb);
    }

    /// Parameters: final norm γ (and β), LM head weight.
    pub fn params(&self) -> Vec<&Param> {
        let mut p = self.final_ln.params();
        p.extend(self.lm_head.params());
        p
    }

    /// Mutable parameters, same order.
    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p = self.final_ln.params_mut();
        p.extend(self.lm_head.params_mut());
        p
    }
}
