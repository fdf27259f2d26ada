//! Feed-forward block: `fc2(gelu(fc1(x)))` with the usual 4× expansion.
//!
//! F saves the GELU pre-activation (the linears save their own inputs). I frees the
//! pre-activation at once; W is the two linears' weight gradients.

use super::{Linear, SplitLayer, INIT_STD};
use crate::backend::Backend;
use crate::error::{MicrobatchId, Result};
use crate::memory::PassState;
use crate::param::Param;
use crate::tensor::Tensor;

/// Two linears with a GELU (tanh approximation) between them.
#[derive(Debug)]
pub struct Mlp {
    /// Expansion `[h, 4h]`.
    pub fc1: Linear,
    /// Contraction `[4h, h]`.
    pub fc2: Linear,
    gelu: PassState<Tensor, ()>,
}

impl Mlp {
    /// New MLP named `name`; `layers` scales fc2's init (residual scaling).
    pub fn new(name: &str, hidden: usize, layers: usize, seed: u64) -> Self {
        let fc2_std = INIT_STD / ((2 * layers.max(1)) as f32).sqrt();
        Mlp {
            fc1: Linear::new(
                &format!("{name}.fc1"),
                hidden,
                4 * hidden,
                true,
                INIT_STD,
                seed,
            ),
            fc2: Linear::new(
                &format!("{name}.fc2"),
                4 * hidden,
                hidden,
                true,
                fc2_std,
                seed,
            ),
            gelu: PassState::new(format!("{name}.gelu")),
        }
    }
}

impl SplitLayer for Mlp {
    fn forward(&mut self, be: &dyn Backend, mb: MicrobatchId, x: Tensor) -> Result<Tensor> {
        self.gelu.check_forward(mb)?;
        self.fc2.check_forward(mb)?;
        let u = self.fc1.forward(be, mb, x)?;
        let g = be.gelu_forward(&u);
        self.gelu.save_forward(mb, u)?;
        self.fc2.forward(be, mb, g)
    }

    fn backward_input(&mut self, be: &dyn Backend, mb: MicrobatchId, dy: Tensor) -> Result<Tensor> {
        self.gelu.check_input_grad(mb)?;
        self.fc1.check_input_grad(mb)?;
        let mut dg = self.fc2.backward_input(be, mb, dy)?;
        let u = self.gelu.take_forward(mb)?;
        be.gelu_backward(&u, &mut dg);
        drop(u);
        self.fc1.backward_input(be, mb, dg)
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
        self.fc1.held_bytes(mb) + self.gelu.held_bytes(mb) + self.fc2.held_bytes(mb)
    }

    fn discard(&mut self, mb: MicrobatchId) {
        self.fc1.discard(mb);
        self.gelu.discard(mb);
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
