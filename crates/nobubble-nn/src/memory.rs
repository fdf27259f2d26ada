//! Per-microbatch bookkeeping of saved activations, and the byte counts derived from it.
//!
//! Every layer keeps two maps keyed by microbatch: what F saved for I, and what I left
//! for W. Because state is keyed (not a FIFO), any interleaving of microbatches that
//! respects F → I → W per microbatch is legal, and out-of-order passes are detected
//! and reported instead of popping the wrong entry. Byte counts are measured from the
//! tensors actually held, so the planner's M_B / M_W come from the real layers.

use std::collections::BTreeMap;

use crate::error::{MicrobatchId, NnError, Result};
use crate::tensor::Tensor;

/// Something a layer keeps between passes; reports the bytes it occupies.
pub trait Saved {
    /// Bytes of activation storage held by this value.
    fn saved_bytes(&self) -> usize;
}

impl Saved for Tensor {
    fn saved_bytes(&self) -> usize {
        self.size_bytes()
    }
}

impl Saved for Vec<f32> {
    fn saved_bytes(&self) -> usize {
        self.len() * 4
    }
}

impl Saved for Vec<u32> {
    fn saved_bytes(&self) -> usize {
        self.len() * 4
    }
}

impl<A: Saved, B: Saved> Saved for (A, B) {
    fn saved_bytes(&self) -> usize {
        self.0.saved_bytes() + self.1.saved_bytes()
    }
}

impl Saved for () {
    fn saved_bytes(&self) -> usize {
        0
    }
}

/// The F→I and I→W stashes of one layer, keyed by microbatch.
#[derive(Debug)]
pub struct PassState<F, W> {
    layer: String,
    for_input_grad: BTreeMap<MicrobatchId, F>,
    for_weight_grad: BTreeMap<MicrobatchId, W>,
}

impl<F: Saved, W: Saved> PassState<F, W> {
    /// Empty state for the layer with the given global name (used in error messages).
    pub fn new(layer: impl Into<String>) -> Self {
        PassState {
            layer: layer.into(),
            for_input_grad: BTreeMap::new(),
            for_weight_grad: BTreeMap::new(),
        }
    }

    /// The layer's global name.
    pub fn layer(&self) -> &str {
        &self.layer
    }

    /// Errors if F may not run for `mb` now (its previous F→I→W cycle is unfinished).
    pub fn check_forward(&self, mb: MicrobatchId) -> Result<()> {
        if self.for_input_grad.contains_key(&mb) {
            return Err(NnError::pass(
                &self.layer,
                mb,
                "forward ran twice: its input-gradient pass (I) has not run yet",
            ));
        }
        if self.for_weight_grad.contains_key(&mb) {
            return Err(NnError::pass(
                &self.layer,
                mb,
                "forward ran again before the weight-gradient pass (W) of the previous one",
            ));
        }
        Ok(())
    }

    /// Stores what F saved for I.
    pub fn save_forward(&mut self, mb: MicrobatchId, saved: F) -> Result<()> {
        self.check_forward(mb)?;
        self.for_input_grad.insert(mb, saved);
        Ok(())
    }

    /// Errors if I may not run for `mb` now.
    pub fn check_input_grad(&self, mb: MicrobatchId) -> Result<()> {
        if self.for_input_grad.contains_key(&mb) {
            Ok(())
        } else if self.for_weight_grad.contains_key(&mb) {
            Err(NnError::pass(
                &self.layer,
                mb,
                "input-gradient pass (I) ran twice",
            ))
        } else {
            Err(NnError::pass(
                &self.layer,
                mb,
                "input-gradient pass (I) without a forward (F)",
            ))
        }
    }

    /// What F saved for `mb`, without consuming it (to validate an I's input first).
    pub fn peek_forward(&self, mb: MicrobatchId) -> Option<&F> {
        self.for_input_grad.get(&mb)
    }

    /// Removes and returns what F saved (I consumes it).
    pub fn take_forward(&mut self, mb: MicrobatchId) -> Result<F> {
        self.check_input_grad(mb)?;
        Ok(self.for_input_grad.remove(&mb).expect("checked above"))
    }

    /// Queues what W will need for `mb`.
    pub fn queue_weight_grad(&mut self, mb: MicrobatchId, kept: W) {
        let previous = self.for_weight_grad.insert(mb, kept);
        assert!(
            previous.is_none(),
            "I queued W work twice for one microbatch"
        );
    }

    /// Errors if W may not run for `mb` now.
    pub fn check_weight_grad(&self, mb: MicrobatchId) -> Result<()> {
        if self.for_weight_grad.contains_key(&mb) {
            Ok(())
        } else if self.for_input_grad.contains_key(&mb) {
            Err(NnError::pass(
                &self.layer,
                mb,
                "weight-gradient pass (W) before the input-gradient pass (I)",
            ))
        } else {
            Err(NnError::pass(
                &self.layer,
                mb,
                "weight-gradient pass (W) with nothing queued (W already ran for this microbatch, or I never ran)",
            ))
        }
    }

    /// What I queued for `mb`, without consuming it.
    pub fn peek_weight_grad(&self, mb: MicrobatchId) -> Option<&W> {
        self.for_weight_grad.get(&mb)
    }

    /// Removes and returns what I kept (W consumes it; it is freed when W returns).
    pub fn take_weight_grad(&mut self, mb: MicrobatchId) -> Result<W> {
        self.check_weight_grad(mb)?;
        Ok(self.for_weight_grad.remove(&mb).expect("checked above"))
    }

    /// Forgets whatever is held for `mb` (a speculative pass being thrown away).
    pub fn discard(&mut self, mb: MicrobatchId) {
        self.for_input_grad.remove(&mb);
        self.for_weight_grad.remove(&mb);
    }

    /// Bytes currently held for `mb` (whichever stash it is in).
    pub fn held_bytes(&self, mb: MicrobatchId) -> usize {
        self.for_input_grad.get(&mb).map_or(0, Saved::saved_bytes)
            + self.for_weight_grad.get(&mb).map_or(0, Saved::saved_bytes)
    }

    /// Bytes currently held for all microbatches.
    pub fn total_held_bytes(&self) -> usize {
        self.for_input_grad
            .values()
            .map(Saved::saved_bytes)
            .sum::<usize>()
            + self
                .for_weight_grad
                .values()
                .map(Saved::saved_bytes)
                .sum::<usize>()
    }

    /// Microbatches with W work queued, in increasing order.
    pub fn pending_weight_grads(&self) -> Vec<MicrobatchId> {
        self.for_weight_grad.keys().copied().collect()
    }
}

/// Measured activation memory of one microbatch in a layer or stage, in bytes.
/// `after_forward` is the planner's M_B (held from F until I); `after_input_grad` is
/// M_W (held from I until W); after W nothing is held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryFootprint {
    /// Bytes held between F and I.
    pub after_forward: usize,
    /// Bytes held between I and W.
    pub after_input_grad: usize,
    /// Bytes held after W (always 0 for a correct layer; measured, not assumed).
    pub after_weight_grad: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_order_errors_are_reported() {
        let mut s: PassState<Tensor, Tensor> = PassState::new("x");
        assert!(s.take_forward(0).is_err(), "I without F");
        assert!(s.take_weight_grad(0).is_err(), "W with nothing queued");
        s.save_forward(0, Tensor::zeros(&[2])).unwrap();
        assert!(s.save_forward(0, Tensor::zeros(&[2])).is_err(), "double F");
        assert!(s.take_weight_grad(0).is_err(), "W before I");
        assert_eq!(s.held_bytes(0), 8);
        let t = s.take_forward(0).unwrap();
        s.queue_weight_grad(0, t);
        assert!(s.take_forward(0).is_err(), "double I");
        s.take_weight_grad(0).unwrap();
        let err = s.take_weight_grad(0).unwrap_err();
        assert!(err.to_string().contains("nothing queued"), "{err}");
        assert_eq!(s.total_held_bytes(), 0);
    }
}
