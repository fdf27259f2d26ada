//! LayerNorm over the feature dimension.
//!
//! F saves `xhat` and `rstd`. I computes `dx` and, because it has `xhat` and `dy` at
//! hand, this microbatch's γ/β partial sums (2·h floats); it then frees `xhat`/`rstd`
//! immediately and queues only the partial sums. W adds them to the accumulators.
//! This keeps M_W tiny while every accumulation still happens in W (bit-identity).

use super::SplitLayer;
use crate::backend::Backend;
use crate::error::{MicrobatchId, NnError, Result};
use crate::memory::PassState;
use crate::param::{Init, Param};
use crate::tensor::Tensor;

/// F → I: normalized input `xhat` and per-row `rstd`.
type SavedForInput = (Tensor, Vec<f32>);
/// I → W: this microbatch's γ and β gradient partial sums.
type SavedForWeight = (Vec<f32>, Vec<f32>);

/// LayerNorm with learned scale γ and shift β.
#[derive(Debug)]
pub struct LayerNorm {
    /// Scale γ `[h]`, initialized to 1.
    pub gamma: Param,
    /// Shift β `[h]`, initialized to 0.
    pub beta: Param,
    /// Added to the variance for numerical safety.
    pub eps: f32,
    state: PassState<SavedForInput, SavedForWeight>,
}

impl LayerNorm {
    /// New LayerNorm named `name` over `hidden` features.
    pub fn new(name: &str, hidden: usize, eps: f32, seed: u64) -> Self {
        LayerNorm {
            gamma: Param::new(
                format!("{name}.gamma"),
                &[hidden],
                Init::Constant(1.0),
                false,
                seed,
            ),
            beta: Param::new(
                format!("{name}.beta"),
                &[hidden],
                Init::Constant(0.0),
                false,
                seed,
            ),
            eps,
            state: PassState::new(name),
        }
    }

    /// F on a borrowed input (the caller keeps `x`, e.g. for a residual).
    pub fn forward_ref(
        &mut self,
        be: &dyn Backend,
        mb: MicrobatchId,
        x: &Tensor,
    ) -> Result<Tensor> {
        if x.cols() != self.gamma.value.len() {
            return Err(NnError::BadInput(format!(
                "layer `{}` expects {} features, got shape {:?}",
                self.state.layer(),
                self.gamma.value.len(),
                x.shape()
            )));
        }
        self.state.check_forward(mb)?;
        let out =
            be.layernorm_forward(x, self.gamma.value.data(), self.beta.value.data(), self.eps);
        self.state.save_forward(mb, (out.xhat, out.rstd))?;
        Ok(out.y)
    }
}

impl SplitLayer for LayerNorm {
    fn forward(&mut self, be: &dyn Backend, mb: MicrobatchId, x: Tensor) -> Result<Tensor> {
        self.forward_ref(be, mb, &x)
    }

    fn backward_input(&mut self, be: &dyn Backend, mb: MicrobatchId, dy: Tensor) -> Result<Tensor> {
        self.state.check_input_grad(mb)?;
        if dy.cols() != self.gamma.value.len() {
            return Err(NnError::BadInput(format!(
                "layer `{}`: output gradient shape {:?}",
                self.state.layer(),
                dy.shape()
            )));
        }
        let rows = self
            .state
            .peek_forward(mb)
            .map_or(0, |(xhat, _)| xhat.rows());
        if dy.rows() != rows {
            return Err(NnError::BadInput(format!(
                "layer `{}`: output gradient has {} rows, the forward had {rows}",
                self.state.layer(),
                dy.rows()
            )));
        }
        let (xhat, rstd) = self.state.take_forward(mb)?;
        let out = be.layernorm_backward(&dy, &xhat, &rstd, self.gamma.value.data());
        drop((xhat, rstd));
        self.state.queue_weight_grad(mb, (out.dgamma, out.dbeta));
        Ok(out.dx)
    }

    fn backward_weight(&mut self, be: &dyn Backend, mb: MicrobatchId) -> Result<()> {
        let (dgamma, dbeta) = self.state.take_weight_grad(mb)?;
        be.add_assign(self.gamma.grad.data_mut(), &dgamma);
        be.add_assign(self.beta.grad.data_mut(), &dbeta);
        Ok(())
    }

    fn check_forward(&self, mb: MicrobatchId) -> Result<()> {
        self.state.check_forward(mb)
    }

    fn check_input_grad(&self, mb: MicrobatchId) -> Result<()> {
        self.state.check_input_grad(mb)
    }

    fn check_weight_grad(&self, mb: MicrobatchId) -> Result<()> {
        self.state.check_weight_grad(mb)
    }

    fn held_bytes(&self, mb: MicrobatchId) -> usize {
        self.state.held_bytes(mb)
    }

    fn discard(&mut self, mb: MicrobatchId) {
        self.state.discard(mb);
    }

    fn params(&self) -> Vec<&Param> {
        vec![&self.gamma, &self.beta]
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        vec![&mut self.gamma, &mut self.beta]
    }
}
