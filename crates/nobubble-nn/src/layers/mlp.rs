//! Feed-forward block: `fc2(gelu(fc1(x)))` (GPT, with biases), or SwiGLU
//! `fc2(silu(gate) ⊙ up)` with `[gate | up] = fc1(x)` fused into one product (Llama, no
//! biases).
//!
//! F saves the activation's input (the linears save their own inputs). I frees it at once;
//! W is the two linears' weight gradients.

use super::{add_bias, broadcast_bias, Linear, SplitLayer, INIT_STD};
use crate::backend::Backend;
use crate::error::{MicrobatchId, Result};
use crate::memory::PassState;
use crate::param::Param;
use crate::tensor::Tensor;

/// The nonlinearity between the two linears.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// GELU (tanh approximation) of `fc1`'s `f` outputs.
    Gelu,
    /// `silu(gate) ⊙ up` of `fc1`'s `2f` outputs `[gate | up]`.
    SwiGlu,
}

/// Two linears with an [`Activation`] between them.
#[derive(Debug)]
pub struct Mlp {
    /// Expansion `[h, f]` (GELU) or `[h, 2f]` (SwiGLU: gate columns, then up columns).
    pub fc1: Linear,
    /// Contraction `[f, h]`.
    pub fc2: Linear,
    /// What runs between them.
    pub activation: Activation,
    /// fc1's output (for GELU before its bias: GELU's input is it plus fc1's bias).
    act: PassState<Tensor, ()>,
}

impl Mlp {
    /// New MLP named `name` of width `ffn`; `layers` scales fc2's init (residual scaling).
    /// GELU MLPs have biases, SwiGLU ones none (as in Llama).
    pub fn new(
        name: &str,
        hidden: usize,
        ffn: usize,
        activation: Activation,
        layers: usize,
        seed: u64,
    ) -> Self {
        let fc2_std = INIT_STD / ((2 * layers.max(1)) as f32).sqrt();
        let (fc1_out, bias) = match activation {
            Activation::Gelu => (ffn, true),
            Activation::SwiGlu => (2 * ffn, false),
        };
        Mlp {
            fc1: Linear::new(
                &format!("{name}.fc1"),
                hidden,
                fc1_out,
                bias,
                INIT_STD,
                seed,
            ),
            fc2: Linear::new(&format!("{name}.fc2"), ffn, hidden, bias, fc2_std, seed),
            activation,
            act: PassState::new(format!("{name}.act")),
        }
    }

    /// The activation of fc1's output `u`, computed without fc1's bias: GELU adds the bias as
    /// it loads each element; SwiGLU has no such kernel, so the bias (Llama's MLPs have none)
    /// is added to `u` first. Either way `u` is then what the backward differentiates at.
    fn activate(&self, be: &dyn Backend, u: &mut Tensor) -> Tensor {
        let bias = self.fc1.bias_values();
        match self.activation {
            Activation::Gelu => be.gelu_forward(u, bias),
            Activation::SwiGlu => {
                add_bias(be, u, bias);
                be.swiglu_forward(u)
            }
        }
    }

    /// The output without fc2's bias ([`Self::output_bias`]) added onto `dst` (a block's
    /// residual stream, which has the bias already): inference, nothing saved.
    pub(crate) fn apply_onto(&self, be: &dyn Backend, x: &Tensor, dst: &mut Tensor) {
        let g = self.activate(be, &mut self.fc1.apply_unbiased(be, x));
        self.fc2.apply_onto(be, &g, dst)
    }

    /// F, its output without fc2's bias ([`Self::output_bias`]) added onto `dst`: the block's
    /// ln2 adds the bias to the stream. fc1's bias goes into GELU, so neither costs a pass
    /// of its own.
    pub(crate) fn forward_onto(
        &mut self,
        be: &dyn Backend,
        mb: MicrobatchId,
        x: Tensor,
        dst: &mut Tensor,
    ) -> Result<()> {
        self.act.check_forward(mb)?;
        self.fc2.check_forward(mb)?;
        let mut u = self.fc1.forward_unbiased(be, mb, x)?;
        let g = self.activate(be, &mut u);
        self.act.save_forward(mb, u)?;
        self.fc2.forward_onto(be, mb, g, dst)
    }

    /// fc2's bias, which [`Self::forward_onto`] leaves to the caller (empty: none).
    pub(crate) fn output_bias(&self) -> &[f32] {
        self.fc2.bias_values()
    }
}

impl SplitLayer for Mlp {
    fn forward(&mut self, be: &dyn Backend, mb: MicrobatchId, x: Tensor) -> Result<Tensor> {
        let mut y = broadcast_bias(be, self.output_bias(), x.rows(), self.fc2.out_features());
        self.forward_onto(be, mb, x, &mut y)?;
        Ok(y)
    }

    fn backward_input(&mut self, be: &dyn Backend, mb: MicrobatchId, dy: Tensor) -> Result<Tensor> {
        self.act.check_input_grad(mb)?;
        self.fc1.check_input_grad(mb)?;
        let mut dg = match self.activation {
            // GELU's backward takes padded rows, and fc1's W reads its result.
            Activation::Gelu => self.fc2.backward_input_padded(be, mb, dy)?,
            Activation::SwiGlu => self.fc2.backward_input(be, mb, dy)?,
        };
        let u = self.act.take_forward(mb)?;
        let (du, dbias) = match self.activation {
            Activation::Gelu => {
                // The live bias is the one F added, as the live weights are the ones F
                // multiplied by: parameters change only between steps.
                // fc1's bias gradient is summed inside the kernel (empty: no bias).
                let bias = self.fc1.bias_values();
                let mut dbias = vec![0.0; bias.len()];
                be.gelu_backward(&u, bias, &mut dg, &mut dbias);
                (dg, Some(dbias))
            }
            Activation::SwiGlu => (be.swiglu_backward(&u, &dg), None),
        };
        drop(u);
        self.fc1.backward_input_given(be, mb, du, dbias)
    }

    fn backward_weight(&mut self, be: &dyn Backend, mb: MicrobatchId) -> Result<()> {
        self.fc1.check_weight_grad(mb)?;
        self.fc2.backward_weight(be, mb)?;
        self.fc1.backward_weight(be, mb)
    }

    fn check_forward(&self, mb: MicrobatchId) -> Result<()> {
        self.fc1.check_forward(mb)
    }

    fn check_input_grad(&self, mb: MicrobatchId) -> Result<()> {
        self.fc2.check_input_grad(mb)
    }

    fn check_weight_grad(&self, mb: MicrobatchId) -> Result<()> {
        self.fc2.check_weight_grad(mb)
    }

    fn held_bytes(&self, mb: MicrobatchId) -> usize {
        self.fc1.held_bytes(mb) + self.act.held_bytes(mb) + self.fc2.held_bytes(mb)
    }

    fn discard(&mut self, mb: MicrobatchId) {
        self.fc1.discard(mb);
        self.act.discard(mb);
        self.fc2.discard(mb);
    }

    fn params(&self) -> Vec<&Param> {
        let mut p = self.fc1.params();
        p.extend(self.fc2.params());
        p
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p = self.fc1.params_mut();
        p.extend(self.fc2.params_mut());
        p
    }
}
