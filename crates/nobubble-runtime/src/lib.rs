//! The pipeline runtime: one SPMD program that every rank runs — threads of one process
//! ([`launch::threads`], [`Pipeline`]) or processes of an MPI job (feature `mpi`) — executing
//! any [`nobubble_schedule::Schedule`] for real on a GPT built by [`nobubble_nn`], data
//! parallel × pipeline parallel.
//!
//! Each rank ([`Rank`]) runs its actions in order — F, I, W or B, on any placement — and
//! exchanges activations and gradients through a [`Transport`]. Everything that concerns the
//! whole world (the data-parallel gradient sum, the step's loss, norm and clip factor, measured
//! memory, checkpoints) is a collective with one fixed summation order, so a pipelined run is
//! bit-identical to unpipelined training over the global batch, and there is no coordinator.
//! Emulated compute (passes sleep for their cost) measures the runtime's own overhead against
//! the simulator on more ranks than this machine has cores.

pub mod checkpoint;
pub mod error;
pub mod launch;
pub mod machine;
pub mod metrics;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod pipeline;
pub mod rank;
pub mod run;
pub mod session;
pub mod training;
pub mod transport;
pub mod worker;

/// The optimizer step, part of the worker since it reads the worker's state; at its old path.
pub use worker::optimizer_step;

/// Checkpoints on disk, at the path they had before `checkpoint/` was a folder.
pub use checkpoint::fs as checkpoint_fs;
pub use checkpoint::{Checkpoint, CheckpointMeta, TrainingState};
pub use error::RuntimeError;
pub use pipeline::Pipeline;
pub use rank::{check_world, Rank};
pub use run::{Compute, RunConfig, StepRecord};
pub use session::{median_pass_ms, Plan, Session, SessionOptions};
pub use transport::{InProcess, Message, Tag, Transport};
pub use worker::{CommStats, Fault, MeasuredSlot, RankStep, StepSummary};
