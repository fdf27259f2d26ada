//! Live metrics of a training run, served in the Prometheus text format (`train
//! --metrics-addr HOST:PORT`, path `/metrics`), and the figures they are made of.
//!
//! Rank 0 serves every rank's figures: it already assembles each step's record from all
//! ranks' reports. Names follow the deployment checklist dashboards are built on
//! (`pipeline_bubble_fraction`, `gpu_flop_utilization_mfu`, `active_microbatch_memory_mb`),
//! and everything else is prefixed `nobubble_`. `gpu_flop_utilization_mfu` keeps its name on
//! CPU too: it is model FLOPs per second over the peak of whatever the ranks compute on.
//!
//! The server and its registry (`served.rs`: `prometheus`, `tiny_http`) are behind the
//! default-on feature `metrics`; without it `off.rs` offers the same [`Metrics`] recording
//! nothing, and [`MetricsServer::start`] refuses with what to rebuild, so callers need no
//! `cfg` of their own. The figures themselves (below) are always there: the log and the
//! report use them too.

use crate::run::StepRecord;
use nobubble_nn::GptConfig;

#[cfg(not(feature = "metrics"))]
mod off;
#[cfg(feature = "metrics")]
mod served;

#[cfg(not(feature = "metrics"))]
pub use off::{Metrics, MetricsServer};
#[cfg(feature = "metrics")]
pub use served::{Metrics, MetricsServer};

/// Model FLOPs of one optimizer step (forward and both backward halves, every microbatch of
/// every replica): the paper's per-block counts plus the LM head's three matrix products.
/// The engine recomputes nothing, but the paper counts causal attention's whole `s × s`
/// square and the kernels skip the blocks above the diagonal, so the hardware executes a few
/// percent fewer FLOPs than this (MFU as PaLM and Megatron-LM count it).
pub fn model_flops_per_step(model: &GptConfig, microbatches: usize) -> f64 {
    let (h, s, b) = (model.hidden, model.seq_len, model.microbatch_size);
    let [f, i, w] = model.block_shape().pass_flops();
    let head = 3.0 * nobubble_schedule::flops::head_pass_flops(h, model.vocab, s, b);
    microbatches as f64 * (model.layers as f64 * (f + i + w) + head)
}

/// What one step's record means for the dashboard; computed once so that the log, the
/// report and `/metrics` show the same numbers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepRates {
    /// Tokens per second of wall time (all replicas).
    pub tokens_per_second: f64,
    /// Model FLOPs per second over the peak of all ranks.
    pub mfu: f64,
    /// The step's training loss and gradient norm, as the outputs show them (NaN, "no
    /// value", where the passes compute nothing: emulated compute).
    pub loss: f64,
    pub grad_norm: f64,
}

impl StepRates {
    /// Rates of `rec` for `tokens` and `flops` per step on hardware with `peak` FLOP/s.
    pub fn of(rec: &StepRecord, tokens: f64, flops: f64, peak: f64) -> StepRates {
        let wall = rec.wall.max(f64::MIN_POSITIVE);
        StepRates {
            tokens_per_second: tokens / wall,
            mfu: flops / wall / peak.max(f64::MIN_POSITIVE),
            loss: rec.loss as f64,
            grad_norm: rec.grad_norm,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_flops_are_six_per_parameter_and_token_for_wide_blocks() {
        // Attention terms are small against 24h when s ≪ h: F + I + W ≈ 72·s·b·h² per block
        // = 6 × (12h² weights) per token, the usual 6·N·T.
        let mut m = GptConfig::preset("tiny").unwrap();
        m.hidden = 4096;
        m.seq_len = 8;
        m.microbatch_size = 1;
        m.vocab = 256;
        m.layers = 2;
        let tokens = 8.0;
        let weights = m.layers as f64 * 12.0 * 4096.0 * 4096.0 + 4096.0 * 256.0;
        let ratio = model_flops_per_step(&m, 1) / (6.0 * weights * tokens);
        assert!((ratio - 1.0).abs() < 0.01, "{ratio}");
    }
}
