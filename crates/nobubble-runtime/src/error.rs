//! Runtime errors: every one names the rank, and where it applies the stage, action and
//! what was waited for, so a failed run says where to look.

use nobubble_schedule::{Action, Kind};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};

/// Why a pipelined run stopped. The variant says what kind of failure it was (what to fix,
/// whether to retry); the message says where. Serializable, so that an outcome decided at
/// rank 0 (a save, a resume check) reaches every rank as the same error.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// A rank panicked (a thread, or an MPI process).
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
        /// The action that needed the message (`None`: a collective between passes).
        action: Option<Action>,
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
    /// Bad configuration or input, found before training starts: flags, a schedule that
    /// cannot run, a checkpoint that does not fit the model, an unusable `--save` or
    /// `--resume` directory.
    Config(String),
    /// The planner refused the request (a setting it names, a schedule over the memory
    /// limit): kept typed so that each front end names the setting its own way. Found by
    /// every rank alike (planning is deterministic), so it is never sent between ranks.
    #[serde(skip)]
    Plan(nobubble_schedule::Error),
    /// A message, link or launch failure: a send, receive or flush that failed, MPI that did
    /// not start, a rank's thread that could not be spawned.
    Transport {
        /// The rank whose transport failed, when one did.
        rank: Option<usize>,
        /// What failed.
        cause: String,
    },
    /// A rank's fault mid-run: damaged data from another rank, a protocol violation, an
    /// engine or optimizer operation that failed, ranks that stopped answering, or the
    /// runtime's own inconsistency (`internal: …`).
    Fault(String),
    /// A file that could not be read, written or trusted (checkpoint files, run directories).
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The whole message, naming the path.
        message: String,
    },
    /// The training diverged: non-finite values that must not become the newest checkpoint.
    Diverged(String),
    /// Rank 0's observer failed (e.g. the `--log` file cannot be written).
    Observer(String),
}

impl RuntimeError {
    /// An [`RuntimeError::Io`] about `path`.
    pub fn io(path: &Path, message: String) -> RuntimeError {
        RuntimeError::Io {
            path: path.to_path_buf(),
            message,
        }
    }

    /// The same failure with `prefix: ` before its message (e.g. the flag it concerns).
    /// Errors with structured fields become a [`RuntimeError::Fault`] with the prefixed text.
    pub fn prefixed(self, prefix: &str) -> RuntimeError {
        let with = |m: String| format!("{prefix}: {m}");
        match self {
            RuntimeError::Config(m) => RuntimeError::Config(with(m)),
            RuntimeError::Fault(m) => RuntimeError::Fault(with(m)),
            RuntimeError::Diverged(m) => RuntimeError::Diverged(with(m)),
            RuntimeError::Observer(m) => RuntimeError::Observer(with(m)),
            RuntimeError::Io { path, message } => RuntimeError::Io {
                path,
                message: with(message),
            },
            other => RuntimeError::Fault(with(other.to_string())),
        }
    }
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
                action: Some(action),
                waiting_for,
                seconds,
                ..
            } => write!(
                f,
                "rank {rank}, stage {}, action {action}: waited {seconds:.1} s for {waiting_for}",
                action.stage
            ),
            RuntimeError::Timeout {
                rank,
                action: None,
                waiting_for,
                seconds,
                ..
            } => write!(f, "rank {rank}: waited {seconds:.1} s for {waiting_for}"),
            RuntimeError::Aborted { rank } => {
                write!(f, "rank {rank} stopped because another rank failed")
            }
            RuntimeError::Plan(e) => write!(f, "{e}"),
            RuntimeError::Transport {
                rank: Some(rank),
                cause,
            } => write!(f, "rank {rank}: {cause}"),
            RuntimeError::Transport { rank: None, cause } => write!(f, "{cause}"),
            RuntimeError::Config(msg)
            | RuntimeError::Fault(msg)
            | RuntimeError::Diverged(msg)
            | RuntimeError::Observer(msg)
            | RuntimeError::Io { message: msg, .. } => write!(f, "{msg}"),
        }
    }
}

impl std::error::Error for RuntimeError {}

/// The error to report among several ranks' errors in one step. A failed pass, a panic or
/// any other failure found by a rank itself is a cause; a timeout usually a consequence of
/// one; an abort never the cause. Among
/// timeouts: for each microbatch, the wait earliest in its data flow (a forward's input before
/// any gradient, forwards down the stages, gradients up), since the others on that
/// microbatch follow from it; then, of those, the wait that began first. Ties go to the
/// first error given (replies come sorted by rank), so the choice never depends on which
/// rank answered first.
pub(crate) fn nearest_cause(errors: Vec<RuntimeError>) -> Option<RuntimeError> {
    if let Some(i) = errors.iter().position(|e| {
        !matches!(
            e,
            RuntimeError::Timeout { .. } | RuntimeError::Aborted { .. }
        )
    }) {
        return errors.into_iter().nth(i);
    }
    let flow = |a: &Action| match a.kind {
        Kind::F => (0, a.stage as i64),
        _ => (1, -(a.stage as i64)),
    };
    // (index, microbatch, flow, since) of every timeout.
    let waits: Vec<(usize, usize, (i32, i64), f64)> = errors
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            RuntimeError::Timeout {
                action: Some(action),
                since,
                ..
            } => Some((i, action.microbatch, flow(action), *since)),
            // A collective wait comes after every pass of its step: last in the data flow.
            RuntimeError::Timeout {
                action: None,
                since,
                ..
            } => Some((i, usize::MAX, (2, 0), *since)),
            _ => None,
        })
        .collect();
    let representative = |w: &(usize, usize, (i32, i64), f64)| {
        waits
            .iter()
            .filter(|o| o.1 == w.1)
            .all(|o| o.0 == w.0 || o.2 > w.2 || (o.2 == w.2 && o.0 > w.0))
    };
    let chosen = waits
        .iter()
        .filter(|w| representative(w))
        .min_by(|a, b| a.3.total_cmp(&b.3).then(a.0.cmp(&b.0)))
        .map(|w| w.0);
    let i = chosen.unwrap_or(0);
    errors.into_iter().nth(i)
}

#[cfg(test)]
mod blame_tests {
    use super::*;

    fn timeout(rank: usize, action: Action, since: f64) -> RuntimeError {
        RuntimeError::Timeout {
            rank,
            action: Some(action),
            waiting_for: String::new(),
            seconds: 0.8,
            since,
        }
    }

    fn chosen(errors: &[RuntimeError]) -> RuntimeError {
        nearest_cause(errors.to_vec()).expect("an error")
    }

    #[test]
    fn the_wait_nearest_the_cause_is_reported() {
        // Rank 1's forward input was lost; rank 0 then waits for that microbatch's gradient,
        // even if the OS let rank 0 start waiting first.
        let lost_input = timeout(1, Action::new(1, Kind::F, 1), 0.020);
        let consequence = timeout(0, Action::new(0, Kind::B, 1), 0.010);
        assert_eq!(
            chosen(&[consequence.clone(), lost_input.clone()]),
            lost_input
        );
        assert_eq!(
            chosen(&[lost_input.clone(), consequence.clone()]),
            lost_input
        );
        // Gradients flow up: the deeper stage's wait comes first.
        let deep = timeout(2, Action::new(2, Kind::I, 3), 0.5);
        assert_eq!(
            chosen(&[timeout(1, Action::new(1, Kind::I, 3), 0.1), deep.clone()]),
            deep
        );
        // Different microbatches: the earlier wait.
        let early = timeout(0, Action::new(0, Kind::I, 0), 0.1);
        assert_eq!(
            chosen(&[timeout(1, Action::new(1, Kind::F, 2), 0.2), early.clone()]),
            early
        );
        // A panic is a cause; an abort never is.
        let panic = RuntimeError::Panic {
            rank: 1,
            action: None,
            cause: "x".into(),
        };
        assert_eq!(chosen(&[consequence.clone(), panic.clone()]), panic);
        let aborted = RuntimeError::Aborted { rank: 0 };
        assert_eq!(chosen(&[aborted.clone(), consequence.clone()]), consequence);
        assert_eq!(chosen(std::slice::from_ref(&aborted)), aborted);
    }

    /// The same error is chosen whatever order the ranks answer in, and a wait that follows
    /// from another on the same microbatch is never it.
    #[test]
    fn the_choice_does_not_depend_on_the_order() {
        let other_mb = timeout(0, Action::new(0, Kind::I, 0), 0.20);
        let root = timeout(1, Action::new(1, Kind::F, 1), 0.30);
        let downstream = timeout(2, Action::new(2, Kind::F, 1), 0.10);
        let all = [other_mb.clone(), root, downstream];
        for order in [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ] {
            let errors: Vec<_> = order.iter().map(|&k| all[k].clone()).collect();
            assert_eq!(chosen(&errors), other_mb, "{order:?}");
        }
    }
}

#[cfg(test)]
mod variant_tests {
    use super::*;

    /// The typed variants print the messages `Config` used to carry, and survive the trip
    /// between ranks (a save's or resume's outcome is broadcast from rank 0).
    #[test]
    fn typed_errors_print_their_message_and_cross_the_wire() {
        let io = RuntimeError::io(Path::new("/x/ckpt"), "cannot read /x/ckpt: gone".into());
        let transport = RuntimeError::Transport {
            rank: Some(3),
            cause: "transport failed: closed".into(),
        };
        assert_eq!(transport.to_string(), "rank 3: transport failed: closed");
        assert_eq!(io.to_string(), "cannot read /x/ckpt: gone");
        let saved = io.clone().prefixed("--save");
        assert_eq!(saved.to_string(), "--save: cannot read /x/ckpt: gone");
        assert!(matches!(&saved, RuntimeError::Io { path, .. } if path == Path::new("/x/ckpt")));
        for e in [saved, transport, RuntimeError::Diverged("d".into())] {
            let back: RuntimeError =
                serde_json::from_slice(&serde_json::to_vec(&e).unwrap()).unwrap();
            assert_eq!(back, e);
        }
        // Any failure a rank found itself is a cause, before any timeout.
        let fault = RuntimeError::Fault("damaged stop decision".into());
        let errors = vec![RuntimeError::Aborted { rank: 0 }, fault.clone()];
        assert_eq!(nearest_cause(errors), Some(fault));
    }
}
