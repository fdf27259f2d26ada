//! Layers with a split backward: `forward` (F), `backward_input` (I) and
//! `backward_weight` (W).
//!
//! Contract of every layer, per microbatch id:
//! - F computes the output and saves exactly what I needs.
//! - I computes the input gradient, drops everything W does not need at once, and
//!   queues the rest (for a linear: its input and output gradient).
//! - W adds this microbatch's weight gradients to the accumulators and frees what I
//!   queued. *Every* parameter gradient is accumulated in W — including LayerNorm
//!   and RMSNorm γ/β, biases and embeddings — so with W run in microbatch order the accumulated
//!   gradients are bit-identical to an unsplit backward in microbatch order, whatever
//!   order the I passes ran in. (LayerNorm computes its tiny per-microbatch γ/β
//!   partial sums during I, because they need the large saved `xhat`, and a linear its
//!   bias gradient's, where the output gradient has just been produced; only the addition
//!   into the accumulator waits for W.)
//! - Passes out of order (I without F, W with nothing queued, a second W) are errors.
//! - Parameter values do not change while a microbatch is between its F and its I: I
//!   differentiates with the live weights and biases (the optimizer steps between
//!   iterations, after every microbatch's passes; a discarded attempt reruns its F).

pub mod attention;
pub mod block;
pub mod embedding;
pub mod head;
pub mod linear;
pub mod mlp;
pub mod norm;

pub use attention::CausalSelfAttention;
pub(crate) use attention::KvRows;
pub use block::Block;
pub use embedding::Embedding;
pub use head::LmHead;
pub use linear::Linear;
pub use mlp::{Activation, Mlp};
pub use norm::Norm;

use crate::backend::Backend;
use crate::error::{MicrobatchId, Result};
use crate::param::Param;
use crate::tensor::Tensor;

/// A layer mapping an activation tensor to an activation tensor with split backward.
/// Implemented by [`Linear`], [`Norm`], [`CausalSelfAttention`], [`Mlp`] and
/// [`Block`], so tests and stages can drive them uniformly.
pub trait SplitLayer {
    /// F: computes the output for microbatch `mb` and saves what I needs.
    fn forward(&mut self, be: &dyn Backend, mb: MicrobatchId, x: Tensor) -> Result<Tensor>;
    /// I: input gradient from output gradient; keeps only what W needs.
    fn backward_input(&mut self, be: &dyn Backend, mb: MicrobatchId, dy: Tensor) -> Result<Tensor>;
    /// W: accumulates weight gradients for `mb` and frees what I kept.
    fn backward_weight(&mut self, be: &dyn Backend, mb: MicrobatchId) -> Result<()>;
    /// Errors if F may not run for `mb` now (checked before any state changes).
    fn check_forward(&self, mb: MicrobatchId) -> Result<()>;
    /// Errors if I may not run for `mb` now.
    fn check_input_grad(&self, mb: MicrobatchId) -> Result<()>;
    /// Errors if W may not run for `mb` now.
    fn check_weight_grad(&self, mb: MicrobatchId) -> Result<()>;
    /// Activation bytes currently held for `mb`.
    fn held_bytes(&self, mb: MicrobatchId) -> usize;
    /// Forgets everything held for `mb`, as if its passes never ran (gradients already
    /// accumulated are not touched).
    fn discard(&mut self, mb: MicrobatchId);
    /// Parameters in a fixed order.
    fn params(&self) -> Vec<&Param>;
    /// Mutable parameters, same order as [`SplitLayer::params`].
    fn params_mut(&mut self) -> Vec<&mut Param>;
}

/// `rows` rows of `bias` (zeros without one, `cols` wide): what a sub-layer run on its own
/// adds its `…_onto` output onto, where a block has its residual stream (with the bias
/// added by the norm before, [`Norm::forward_then_bias`]).
pub(crate) fn broadcast_bias(be: &dyn Backend, bias: &[f32], rows: usize, cols: usize) -> Tensor {
    if bias.is_empty() {
        Tensor::zeros(&[rows, cols])
    } else {
        assert_eq!(bias.len(), cols, "one bias value per column");
        be.broadcast_rows(bias, rows)
    }
}

/// Adds a bias left out by an `…_unbiased` pass (nothing if empty).
pub(crate) fn add_bias(be: &dyn Backend, y: &mut Tensor, bias: &[f32]) {
    if !bias.is_empty() {
        assert_eq!(y.cols(), bias.len(), "one bias value per column");
        be.add_row_vector(y.data_mut(), bias);
    }
}

/// GPT-2 style initialization scale for weight matrices.
pub(crate) const INIT_STD: f32 = 0.02;

#[cfg(test)]
mod llama_tests;
#[cfg(test)]
pub(crate) mod tests;
