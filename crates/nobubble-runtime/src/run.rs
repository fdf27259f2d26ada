//! The types of a pipelined run, shared by every way of running one (the step-driven
//! [`crate::Pipeline`], the free-running [`crate::training`] loop, benches): what to run
//! ([`RunConfig`], [`Compute`]) and what a step did ([`StepRecord`]). Kept apart from the
//! test driver so the training loop does not depend on it.

use crate::worker::{CommStats, Fault, MeasuredSlot, RankStep, Rollback, StepSummary};
use nobubble_nn::{GptConfig, StageLayout, TrainConfig};
use nobubble_schedule::{timing, CostModel};
use serde::Serialize;
use std::time::Duration;
/// Real compute on the model, or emulated passes that sleep for their cost.
#[derive(Clone, Debug)]
pub enum Compute {
    /// Train the GPT for real.
    Real,
    /// Sleep for each pass's cost in milliseconds (per schedule stage); messages are
    /// delayed by `comm_ms`.
    Emulated {
        /// Per-stage pass costs, in milliseconds.
        costs: CostModel,
        /// Emulated latency of collective traffic (gradient reduction, step statistics), ms.
        collective_ms: f64,
    },
}

/// Everything a pipelined run needs besides the schedule.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The model.
    pub model: GptConfig,
    /// Seeds, microbatches, optimizer, clipping (`microbatches` must match the schedule).
    pub train: TrainConfig,
    /// How the model's blocks are spread over the schedule's stages.
    pub layout: StageLayout,
    /// Real or emulated compute.
    pub compute: Compute,
    /// How long a receive may wait before the run fails.
    pub recv_timeout: Duration,
    /// A fault to inject (tests).
    pub fault: Option<Fault>,
    /// Post-validated optimizer steps (optimistic step, later validation, rollback) instead
    /// of synchronous ones; `None` = synchronous.
    pub post_validate: Option<Rollback>,
    /// Data-parallel replicas of the pipeline (1 = none): the world is ranks × replicas.
    pub data_parallel: usize,
}

/// What one pipelined step did, measured.
#[derive(Clone, Debug, Serialize)]
pub struct StepRecord {
    /// Step index.
    pub step: u64,
    /// Mean microbatch loss (summed in microbatch order, like the reference trainer).
    pub loss: f32,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Clip factor applied (1 = none; 0 when skipped).
    pub clip_scale: f32,
    /// Learning rate used.
    pub lr: f32,
    /// True when the gradients were non-finite and the update was skipped.
    pub skipped: bool,
    /// Measured actions per rank, seconds since the step started.
    pub timeline: Vec<Vec<MeasuredSlot>>,
    /// End of the last action.
    pub makespan: f64,
    /// Compute time per rank.
    pub busy: Vec<f64>,
    /// 1 − Σ busy / (ranks · makespan).
    pub bubble_fraction: f64,
    /// 1 − max busy / max span.
    pub bubble_rate: f64,
    /// Peak activation bytes per rank.
    pub peak_bytes: Vec<usize>,
    /// Wall time of the whole step, optimizer included.
    pub wall: f64,
    /// Communication per rank during the step.
    pub comm: Vec<CommStats>,
}

impl StepRecord {
    /// A step's record from every rank's report (in rank order) and its summary: timelines
    /// shifted so the step's first pass starts at 0.
    pub fn assemble(summary: &StepSummary, reports: &[RankStep], wall: f64) -> StepRecord {
        let origin = reports
            .iter()
            .filter_map(|r| r.timeline.first().map(|s| s.start))
            .fold(f64::INFINITY, f64::min);
        let origin = if origin.is_finite() { origin } else { 0.0 };
        let timeline: Vec<Vec<MeasuredSlot>> = reports
            .iter()
            .map(|r| {
                r.timeline
                    .iter()
                    .map(|s| MeasuredSlot {
                        start: s.start - origin,
                        end: s.end - origin,
                        ..*s
                    })
                    .collect()
            })
            .collect();
        let t = timing(&timeline, |s| (s.start, s.end));
        StepRecord {
            step: summary.step,
            loss: summary.loss,
            grad_norm: summary.norm_sq.sqrt(),
            clip_scale: summary.scale.unwrap_or(0.0),
            lr: summary.lr,
            skipped: summary.scale.is_none(),
            bubble_fraction: t.bubble_fraction,
            bubble_rate: t.bubble_rate,
            peak_bytes: reports.iter().map(|r| r.peak_bytes).collect(),
            busy: t.busy,
            makespan: t.makespan,
            timeline,
            wall,
            comm: reports.iter().map(|r| r.comm).collect(),
        }
    }
}
