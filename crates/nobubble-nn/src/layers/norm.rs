//! Normalization over the feature dimension: LayerNorm (GPT) or RMSNorm (Llama).
//!
//! F saves `xhat` and `rstd`. I computes `dx` and, because it has `xhat` and `dy` at
//! hand, this microbatch's γ (and β) partial sums (h floats each); it then frees
//! `xhat`/`rstd` immediately and queues only the partial sums. W adds them to the
//! accumulators. This keeps M_W tiny while every accumulation still happens in W
//! (bit-identity).

use super::SplitLayer;
use crate::backend::{Backend, NormBackward, NormForward, NormGradExtras};
use crate::config::Arch;
use crate::error::{MicrobatchId, NnError, Result};
use crate::memory::PassState;
use crate::param::{Init, Param};
use crate::tensor::Tensor;

/// F → I: normalized input `xhat` and per-row `rstd`.
type SavedForInput = (Tensor, Vec<f32>);
/// I → W: this microbatch's γ and β gradient partial sums (β's empty for RMSNorm).
type SavedForWeight = (Vec<f32>, Vec<f32>);

/// LayerNorm (`(x − mean)·rstd·γ + β`) or RMSNorm (`x·rstd·γ`, no mean, no β).
#[derive(Debug)]
pub struct Norm {
    /// Scale γ `[h]`, initialized to 1.
    pub gamma: Param,
    /// Shift β `[h]`, initialized to 0; `None` for RMSNorm.
    pub beta: Option<Param>,
    /// Added to the variance (or mean square) for numerical safety.
    pub eps: f32,
    state: PassState<SavedForInput, SavedForWeight>,
}

impl Norm {
    /// The norm of `arch`'s blocks: LayerNorm for GPT, RMSNorm for Llama.
    pub fn for_arch(arch: Arch, name: &str, hidden: usize, eps: f32, seed: u64) -> Self {
        match arch {
            Arch::Gpt => Self::layer_norm(name, hidden, eps, seed),
            Arch::Llama => Self::rms_norm(name, hidden, eps, seed),
        }
    }

    /// New LayerNorm named `name` over `hidden` features.
    pub fn layer_norm(name: &str, hidden: usize, eps: f32, seed: u64) -> Self {
        let mut norm = Self::rms_norm(name, hidden, eps, seed);
        norm.beta = Some(Param::new(
            format!("{name}.beta"),
            &[hidden],
            Init::Constant(0.0),
            false,
            seed,
        ));
        norm
    }

    /// New RMSNorm named `name` over `hidden` features.
    pub fn rms_norm(name: &str, hidden: usize, eps: f32, seed: u64) -> Self {
        Norm {
            gamma: Param::new(
                format!("{name}.gamma"),
                &[hidden],
                Init::Constant(1.0),
                false,
                seed,
            ),
            beta: None,
            eps,
            state: PassState::new(name),
        }
    }

    /// The normalized output alone (inference: nothing saved).
    pub(crate) fn apply(&self, be: &dyn Backend, x: &Tensor) -> Tensor {
        self.normalize(be, x).y
    }

    fn normalize(&self, be: &dyn Backend, x: &Tensor) -> NormForward {
        let gamma = self.gamma.value.data();
        match &self.beta {
            Some(beta) => be.layernorm_forward(x, gamma, beta.value.data(), self.eps),
            None => be.rmsnorm_forward(x, gamma, self.eps),
        }
    }

    /// F on a borrowed input (the caller keeps `x`, e.g. for a residual).
    pub fn forward_ref(
        &mut self,
        be: &dyn Backend,
        mb: MicrobatchId,
        x: &Tensor,
    ) -> Result<Tensor> {
        self.check_input(mb, x)?;
        let out = self.normalize(be, x);
        self.state.save_forward(mb, (out.xhat, out.rstd))?;
        Ok(out.y)
    }

    /// F on a pre-norm block's residual stream `x`, which then gets `then_bias` (the next
    /// branch's output bias; empty: none) added in the same pass
    /// ([`Backend::layernorm_forward_then_bias`]).
    pub(crate) fn forward_then_bias(
        &mut self,
        be: &dyn Backend,
        mb: MicrobatchId,
        x: &mut Tensor,
        then_bias: &[f32],
    ) -> Result<Tensor> {
        self.check_input(mb, x)?;
        let out = self.normalize_then_bias(be, x, then_bias);
        self.state.save_forward(mb, (out.xhat, out.rstd))?;
        Ok(out.y)
    }

    /// [`Self::forward_then_bias`]'s output alone (inference: nothing saved).
    pub(crate) fn apply_then_bias(
        &self,
        be: &dyn Backend,
        x: &mut Tensor,
        then_bias: &[f32],
    ) -> Tensor {
        self.normalize_then_bias(be, x, then_bias).y
    }

    fn normalize_then_bias(
        &self,
        be: &dyn Backend,
        x: &mut Tensor,
        then_bias: &[f32],
    ) -> NormForward {
        let gamma = self.gamma.value.data();
        match &self.beta {
            Some(beta) => {
                be.layernorm_forward_then_bias(x, gamma, beta.value.data(), self.eps, then_bias)
            }
            None => be.rmsnorm_forward_then_bias(x, gamma, self.eps, then_bias),
        }
    }

    fn check_input(&self, mb: MicrobatchId, x: &Tensor) -> Result<()> {
        if x.cols() != self.gamma.value.len() {
            return Err(NnError::BadInput(format!(
                "layer `{}` expects {} features, got shape {:?}",
                self.state.layer(),
                self.gamma.value.len(),
                x.shape()
            )));
        }
        self.state.check_forward(mb)
    }

    /// I, doing `extras` on the way (a pre-norm block's residual gradient and the next
    /// linear's bias gradient): the input gradient, and its column sums if asked (else
    /// empty).
    pub(crate) fn backward_input_with(
        &mut self,
        be: &dyn Backend,
        mb: MicrobatchId,
        dy: Tensor,
        extras: NormGradExtras<'_>,
    ) -> Result<(Tensor, Vec<f32>)> {
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
        let gamma = self.gamma.value.data();
        let out = match self.beta {
            Some(_) => be.layernorm_backward(&dy, &xhat, &rstd, gamma, extras),
            None => be.rmsnorm_backward(&dy, &xhat, &rstd, gamma, extras),
        };
        drop((xhat, rstd));
        let NormBackward {
            dx,
            dgamma,
            dbeta,
            dx_column_sums,
        } = out;
        self.state.queue_weight_grad(mb, (dgamma, dbeta));
        Ok((dx, dx_column_sums))
    }
}

impl SplitLayer for Norm {
    fn forward(&mut self, be: &dyn Backend, mb: MicrobatchId, x: Tensor) -> Result<Tensor> {
        self.forward_ref(be, mb, &x)
    }

    fn backward_input(&mut self, be: &dyn Backend, mb: MicrobatchId, dy: Tensor) -> Result<Tensor> {
        Ok(self
            .backward_input_with(be, mb, dy, NormGradExtras::default())?
            .0)
    }

    fn backward_weight(&mut self, be: &dyn Backend, mb: MicrobatchId) -> Result<()> {
        let (dgamma, dbeta) = self.state.take_weight_grad(mb)?;
        be.add_assign(self.gamma.grad.data_mut(), &dgamma);
        if let Some(beta) = &mut self.beta {
            be.add_assign(beta.grad.data_mut(), &dbeta);
        }
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
        std::iter::once(&self.gamma)
            .chain(self.beta.as_ref())
            .collect()
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        std::iter::once(&mut self.gamma)
            .chain(self.beta.as_mut())
            .collect()
    }
}
