//! Pre-norm transformer block: `x + attn(ln1(x))`, then `h + mlp(ln2(h))` — LayerNorm
//! and GELU for GPT, RMSNorm and SwiGLU for Llama.
//!
//! The residual adds need nothing saved; the block's F/I/W are its sub-layers' passes. They
//! have no passes of their own either: in F each branch's last product accumulates onto the
//! stream (the norm before it added the branch's output bias), in I each norm's backward adds
//! the residual gradient.

use super::{Activation, CausalSelfAttention, Mlp, Norm, SplitLayer};
use crate::backend::{Backend, NormGradExtras};
use crate::config::{Arch, GptConfig};
use crate::error::{MicrobatchId, NnError, Result};
use crate::param::Param;
use crate::tensor::Tensor;

/// One transformer block.
#[derive(Debug)]
pub struct Block {
    /// Norm before attention.
    pub ln1: Norm,
    /// Causal self-attention.
    pub attn: CausalSelfAttention,
    /// Norm before the MLP.
    pub ln2: Norm,
    /// Feed-forward network.
    pub mlp: Mlp,
}

impl Block {
    /// Block number `index` of `config`'s model; parameter names are `blocks.{index}.…`,
    /// independent of which stage holds the block.
    pub fn new(index: usize, config: &GptConfig, seed: u64) -> Self {
        let name = format!("blocks.{index}");
        let (h, eps) = (config.hidden, config.ln_eps);
        let activation = match config.arch {
            Arch::Gpt => Activation::Gelu,
            Arch::Llama => Activation::SwiGlu,
        };
        let norm =
            |part: &str| Norm::for_arch(config.arch, &format!("{name}.{part}"), h, eps, seed);
        Block {
            ln1: norm("ln1"),
            attn: CausalSelfAttention::new(&format!("{name}.attn"), config, seed),
            ln2: norm("ln2"),
            mlp: Mlp::new(
                &format!("{name}.mlp"),
                h,
                config.ffn_hidden(),
                activation,
                config.layers,
                seed,
            ),
        }
    }

    /// The output alone (inference: nothing saved).
    pub(crate) fn apply(&self, be: &dyn Backend, x: Tensor) -> Tensor {
        self.around(be, x, |n, x| self.attn.apply_onto(be, n, x))
    }

    /// One token at position `pos` (`x`: its `[1, h]` input) through the block, extending
    /// `cache` with its keys and values (see [`CausalSelfAttention::decode_onto`]).
    pub(crate) fn decode(
        &self,
        be: &dyn Backend,
        x: Tensor,
        pos: usize,
        cache: &mut super::KvRows,
    ) -> Tensor {
        self.around(be, x, |n, x| self.attn.decode_onto(be, n, pos, cache, x))
    }

    /// The pre-norm residual block around `attention(normed, stream)`, which adds its output
    /// without its bias onto the residual stream (the norm before added the bias): the
    /// forward's operations, in its order.
    fn around(
        &self,
        be: &dyn Backend,
        mut x: Tensor,
        attention: impl FnOnce(&Tensor, &mut Tensor),
    ) -> Tensor {
        let n = self
            .ln1
            .apply_then_bias(be, &mut x, self.attn.output_bias());
        attention(&n, &mut x);
        let n = self.ln2.apply_then_bias(be, &mut x, self.mlp.output_bias());
        self.mlp.apply_onto(be, &n, &mut x);
        x
    }

    /// Hidden size.
    pub fn hidden(&self) -> usize {
        self.ln1.gamma.value.len()
    }
}

impl SplitLayer for Block {
    fn forward(&mut self, be: &dyn Backend, mb: MicrobatchId, mut x: Tensor) -> Result<Tensor> {
        if x.cols() != self.hidden() {
            return Err(NnError::BadInput(format!(
                "block expects {} features, got shape {:?}",
                self.hidden(),
                x.shape()
            )));
        }
        self.ln1.check_forward(mb)?;
        self.attn.check_forward(mb)?;
        self.ln2.check_forward(mb)?;
        self.mlp.check_forward(mb)?;
        // No residual-add passes: each norm adds the next branch's output bias to the
        // stream as it reads it, and the branch's last product accumulates onto the stream.
        let a = self
            .ln1
            .forward_then_bias(be, mb, &mut x, self.attn.output_bias())?;
        self.attn.forward_onto(be, mb, a, &mut x)?;
        let m = self
            .ln2
            .forward_then_bias(be, mb, &mut x, self.mlp.output_bias())?;
        self.mlp.forward_onto(be, mb, m, &mut x)?;
        Ok(x)
    }

    fn backward_input(&mut self, be: &dyn Backend, mb: MicrobatchId, dy: Tensor) -> Result<Tensor> {
        self.mlp.check_input_grad(mb)?;
        self.ln2.check_input_grad(mb)?;
        self.attn.check_input_grad(mb)?;
        self.ln1.check_input_grad(mb)?;
        // Each branch's last linear keeps the gradient it is handed for its W; the residual
        // sum reads it back from there rather than from a copy made before (two copies of
        // the residual gradient less per I). The norms' input-gradient passes add it to
        // their rows while those are in L1, and ln2's also sums the output projection's
        // bias gradient: no passes of their own over `[n, h]`. `a + b` is `b + a` in IEEE
        // arithmetic, so the sums are the bits of a separate add.
        let dm = self.mlp.backward_input(be, mb, dy)?;
        let extras = NormGradExtras {
            residual: Some(self.mlp.fc2.queued_output_grad(mb)?),
            column_sums: !self.attn.output_bias().is_empty(),
        };
        let (dh, dproj_bias) = self.ln2.backward_input_with(be, mb, dm, extras)?;
        let da = self
            .attn
            .backward_input_given(be, mb, dh, Some(dproj_bias))?;
        let extras = NormGradExtras {
            residual: Some(self.attn.proj.queued_output_grad(mb)?),
            column_sums: false,
        };
        Ok(self.ln1.backward_input_with(be, mb, da, extras)?.0)
    }

    fn backward_weight(&mut self, be: &dyn Backend, mb: MicrobatchId) -> Result<()> {
        self.ln1.check_weight_grad(mb)?;
        self.attn.check_weight_grad(mb)?;
        self.ln2.check_weight_grad(mb)?;
        self.mlp.check_weight_grad(mb)?;
        self.ln1.backward_weight(be, mb)?;
        self.attn.backward_weight(be, mb)?;
        self.ln2.backward_weight(be, mb)?;
        self.mlp.backward_weight(be, mb)
    }

    fn check_forward(&self, mb: MicrobatchId) -> Result<()> {
        self.ln1.check_forward(mb)
    }

    fn check_input_grad(&self, mb: MicrobatchId) -> Result<()> {
        self.mlp.check_input_grad(mb)
    }

    fn check_weight_grad(&self, mb: MicrobatchId) -> Result<()> {
        self.ln1.check_weight_grad(mb)
    }

    fn held_bytes(&self, mb: MicrobatchId) -> usize {
        self.ln1.held_bytes(mb)
            + self.attn.held_bytes(mb)
            + self.ln2.held_bytes(mb)
            + self.mlp.held_bytes(mb)
    }

    fn discard(&mut self, mb: MicrobatchId) {
        self.ln1.discard(mb);
        self.attn.discard(mb);
        self.ln2.discard(mb);
        self.mlp.discard(mb);
    }

    fn params(&self) -> Vec<&Param> {
        let mut p = self.ln1.params();
        p.extend(self.attn.params());
        p.extend(self.ln2.params());
        p.extend(self.mlp.params());
        p
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p = self.ln1.params_mut();
        p.extend(self.attn.params_mut());
        p.extend(self.ln2.params_mut());
        p.extend(self.mlp.params_mut());
        p
    }
}
