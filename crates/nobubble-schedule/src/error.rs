//! One error type for the planner, whose messages name the rank, action and fix.

use crate::action::Action;
use std::fmt;

/// Everything that can go wrong when building, reading or checking a schedule.
///
/// Each variant carries enough context for the message alone to tell a user what to change.
#[derive(Clone, Debug, PartialEq)]
pub enum Error {
    /// A request or file that cannot describe a schedule (bad costs, a malformed file, ...).
    Input(String),
    /// A request setting whose value cannot work. `setting` is the request's field name
    /// (snake_case: `mem_limit`, `microbatches`), so that each front end names it its own
    /// way ([`Error::naming`]): the CLI as a flag, the Python bindings as a keyword.
    Setting {
        /// The field of the request.
        setting: &'static str,
        /// What is wrong and what to do, in the library's words.
        message: String,
    },
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
            Error::Setting { setting, message } => write!(f, "{setting}: {message}"),
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
                 (raise the memory limit, or plan with zb-auto, which plans within any limit of at \
                 least 1 × M_B)",
                fmt_num(*used),
                fmt_num(*limit),
                fmt_num(*units),
                fmt_num(used - limit)
            ),
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// An error in the request's `setting` (its field name).
    pub fn setting(setting: &'static str, message: impl Into<String>) -> Error {
        Error::Setting {
            setting,
            message: message.into(),
        }
    }

    /// The message with a [`Error::Setting`]'s field named by `name` (a CLI flag, a Python
    /// keyword); other errors as displayed.
    pub fn naming(&self, name: impl Fn(&str) -> String) -> String {
        match self {
            Error::Setting { setting, message } => format!("{}: {message}", name(setting)),
            e => e.to_string(),
        }
    }
}

/// `n` and its noun, plural unless one: "1 rank", "2 ranks", "3 microbatches".
pub fn count(n: usize, noun: &str) -> String {
    match n {
        1 => format!("1 {noun}"),
        _ if noun.ends_with("ch") || noun.ends_with('s') => format!("{n} {noun}es"),
        _ => format!("{n} {noun}s"),
    }
}

/// Prints a number without float noise (`3` rather than `3.0000000001`).
pub fn fmt_num(x: f64) -> String {
    let r = (x * 1e6).round() / 1e6;
    if r == r.trunc() && r.abs() < 1e15 {
        format!("{}", r as i64)
    } else {
        format!("{r}")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_read_as_english() {
        let c = super::count;
        assert_eq!(c(1, "rank"), "1 rank");
        assert_eq!(c(0, "stage"), "0 stages");
        assert_eq!(c(3, "microbatch"), "3 microbatches");
        assert_eq!(c(1, "microbatch"), "1 microbatch");
    }
}
