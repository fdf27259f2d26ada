//! The pipeline runtime: stage workers that execute any [`nobubble_schedule::Schedule`]
//! for real, training a GPT built by [`nobubble_nn`].
//!
//! One worker per rank (a thread today) runs its rank's actions in order — F, I, W or B, on
//! any placement — and exchanges activations and gradients through a [`Transport`]. The
//! coordinator ([`Pipeline`]) then performs the synchronous optimizer step exactly as the
//! reference trainer does, so a pipelined run is bit-identical to unpipelined training.
//! Emulated compute (passes sleep for their cost) measures the runtime's own overhead
//! against the simulator on more stages than this machine has cores.

pub mod checkpoint;
pub mod checkpoint_fs;
pub mod collective;
pub mod error;
pub mod launch;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod optimizer_step;
pub mod pipeline;
pub mod rank;
pub mod session;
pub mod training;
pub mod transport;
pub mod worker;

pub use checkpoint::{Checkpoint, CheckpointMeta, TrainingState};
pub use error::RuntimeError;
pub use pipeline::{Compute, Pipeline, RunConfig, StepRecord};
pub use rank::{check_world, Rank};
pub use session::{median_pass_ms, Plan, Session, SessionOptions};
pub use transport::{InProcess, Message, Tag, Transport};
pub use worker::{CommStats, Fault, MeasuredSlot, RankStep, StepSummary};
