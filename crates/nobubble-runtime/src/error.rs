//! Runtime errors: every one names the rank, and where it applies the stage, action and
//! what was waited for, so a failed run says where to look.

use nobubble_schedule::{Action, Kind};
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
        /// When the wait began, in seconds since the step started: when several ranks time
        /// out, the earliest wait is the one closest to the cause.
        since: f64,
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
                ..
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

/// Whether `a` is nearer the cause than `b` when several ranks fail in one step. A failed
/// pass or a panic is a cause; a timeout is usually a consequence of one; an abort never is
/// the cause. Between two timeouts on the same microbatch, the wait earlier in its data flow
/// is the cause (a forward's input before any gradient; forwards down the stages, gradients
/// up); otherwise the wait that began first.
pub(crate) fn more_causal(a: &RuntimeError, b: &RuntimeError) -> bool {
    let class = |e: &RuntimeError| match e {
        RuntimeError::Pass { .. } | RuntimeError::Panic { .. } | RuntimeError::Config(_) => 0,
        RuntimeError::Timeout { .. } => 1,
        RuntimeError::Aborted { .. } => 2,
    };
    match (a, b) {
        (
            RuntimeError::Timeout {
                action: x,
                since: sx,
                ..
            },
            RuntimeError::Timeout {
                action: y,
                since: sy,
                ..
            },
        ) => {
            if x.microbatch == y.microbatch {
                let flow = |a: &Action| match a.kind {
                    Kind::F => (0, a.stage as i64),
                    _ => (1, -(a.stage as i64)),
                };
                flow(x) < flow(y)
            } else {
                sx < sy
            }
        }
        _ => class(a) < class(b),
    }
}

#[cfg(test)]
mod blame_tests {
    use super::*;

    fn timeout(rank: usize, action: Action, since: f64) -> RuntimeError {
        RuntimeError::Timeout {
            rank,
            action,
            waiting_for: String::new(),
            seconds: 0.8,
            since,
        }
    }

    #[test]
    fn the_wait_nearest_the_cause_is_reported() {
        // Rank 1's forward input was lost; rank 0 then waits for that microbatch's gradient,
        // even if the OS let rank 0 start waiting first.
        let lost_input = timeout(1, Action::new(1, Kind::F, 1), 0.020);
        let consequence = timeout(0, Action::new(0, Kind::B, 1), 0.010);
        assert!(more_causal(&lost_input, &consequence));
        assert!(!more_causal(&consequence, &lost_input));
        // Gradients flow up: the deeper stage's wait comes first.
        assert!(more_causal(
            &timeout(2, Action::new(2, Kind::I, 3), 0.5),
            &timeout(1, Action::new(1, Kind::I, 3), 0.1)
        ));
        // Different microbatches: the earlier wait.
        assert!(more_causal(
            &timeout(0, Action::new(0, Kind::I, 0), 0.1),
            &timeout(1, Action::new(1, Kind::F, 2), 0.2)
        ));
        let panic = RuntimeError::Panic {
            rank: 1,
            action: None,
            cause: "x".into(),
        };
        assert!(more_causal(&panic, &consequence));
        assert!(more_causal(
            &consequence,
            &RuntimeError::Aborted { rank: 0 }
        ));
    }
}
