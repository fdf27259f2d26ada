//! One error type for the planner, whose messages name the rank, action and fix.

use crate::action::Action;
use std::fmt;

/// Everything that can go wrong when building, reading or checking a schedule.
///
/// Each variant carries enough context for the message alone to tell a user what to change.
#[derive(Clone, Debug, PartialEq)]
pub enum Error {
    /// A request or file that cannot describe a schedule (zero stages, bad costs, ...).
    Input(String),
    /// A schedule that breaks a rule at a specific place.
    Invalid {
        /// The rank whose list holds the problem.
        rank: usize,
        /// The offending action, when there is one.
        action: Option<Action>,
        /// What rule it breaks.
        reason: String,
    },
    /// Ranks wait on each other in a cycle; each entry is (rank, action it is stuck at,
    /// action it waits for).
    Deadlock(Vec<(usize, Action, Action)>),
    /// A rank's activation memory goes over the limit.
    MemoryLimit {
        /// The rank that overflows.
        rank: usize,
        /// The action after which it overflows.
        action: Action,
        /// Memory held after that action.
        used: f64,
        /// The limit in force, in the cost model's memory units.
        limit: f64,
        /// The limit as the user gave it, in multiples of the rank's M_B.
        units: f64,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Input(msg) => write!(f, "{msg}"),
            Error::Invalid {
                rank,
                action: Some(a),
                reason,
            } => write!(f, "rank {rank}, action {a}: {reason}"),
            Error::Invalid {
                rank,
                action: None,
                reason,
            } => write!(f, "rank {rank}: {reason}"),
            Error::Deadlock(cycle) => {
                write!(f, "deadlock: ranks wait for each other in a cycle: ")?;
                for (i, (rank, at, waits)) in cycle.iter().enumerate() {
                    if i > 0 {
                        write!(f, "; ")?;
                    }
                    write!(f, "rank {rank} is stuck at {at} waiting for {waits}")?;
                }
                write!(
                    f,
                    " (reorder so that each rank reaches the action the next one waits for)"
                )
            }
            Error::MemoryLimit {
                rank,
                action,
                used,
                limit,
                units,
            } => write!(
                f,
                "rank {rank}, action {action}: activation memory {} exceeds the limit {} ({} × M_B) by {} \
                 (raise --mem-limit, or use zb-auto, which plans within any limit of at least 1 × M_B; \
                 `nobubble compare --mem-limit …` shows what fits)",
                fmt_num(*used),
                fmt_num(*limit),
                fmt_num(*units),
                fmt_num(used - limit)
            ),
        }
    }
}

impl std::error::Error for Error {}

/// Prints a number without float noise (`3` rather than `3.0000000001`).
pub fn fmt_num(x: f64) -> String {
    let r = (x * 1e6).round() / 1e6;
    if r == r.trunc() && r.abs() < 1e15 {
        format!("{}", r as i64)
    } else {
        format!("{r}")
    }
}
