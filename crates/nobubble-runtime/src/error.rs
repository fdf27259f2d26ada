//! Runtime errors: every one names the rank, and where it applies the stage, action and
//! what was waited for, so a failed run says where to look.

use nobubble_schedule::Action;
use std::fmt;

/// Why a pipelined run stopped.
#[derive(Clone, Debug, PartialEq)]
pub enum RuntimeError {
    /// A pass failed inside the engine.
    Pass {
        /// Rank that ran it.
        rank: usize,
        /// The action.
        action: Action,
        /// The engine's message.
        cause: String,
    },
    /// A worker thread panicked.
    Panic {
        /// Rank of the worker.
        rank: usize,
        /// The action it was running, if known.
        action: Option<Action>,
        /// The panic message.
        cause: String,
    },
    /// A receive waited longer than the deadline.
    Timeout {
        /// The waiting rank.
        rank: usize,
        /// The action that needed the message.
        action: Action,
        /// What it waited for, e.g. "the activation of stage 2, microbatch 5 from rank 1".
        waiting_for: String,
        /// Seconds waited.
        seconds: f64,
    },
    /// Stopped because another rank failed (never the root cause).
    Aborted {
        /// The rank that stopped.
        rank: usize,
    },
    /// Bad configuration or input, found before training starts.
    Config(String),
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeError::Pass {
                rank,
                action,
                cause,
            } => write!(
                f,
                "rank {rank}, stage {}, action {action}: {cause}",
                action.stage
            ),
            RuntimeError::Panic {
                rank,
                action: Some(a),
                cause,
            } => write!(
                f,
                "rank {rank}, stage {}, action {a}: the worker panicked: {cause}",
                a.stage
            ),
            RuntimeError::Panic {
                rank,
                action: None,
                cause,
            } => write!(f, "rank {rank}: the worker panicked: {cause}"),
            RuntimeError::Timeout {
                rank,
                action,
                waiting_for,
                seconds,
            } => write!(
                f,
                "rank {rank}, stage {}, action {action}: waited {seconds:.1} s for {waiting_for}",
                action.stage
            ),
            RuntimeError::Aborted { rank } => {
                write!(f, "rank {rank} stopped because another rank failed")
            }
            RuntimeError::Config(msg) => write!(f, "{msg}"),
        }
    }
}

impl std::error::Error for RuntimeError {}
