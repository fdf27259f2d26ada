//! One error type for everything a caller can get wrong.
//!
//! Pass-ordering mistakes (I without F, W without I, a second W) are the errors a
//! pipeline runtime is most likely to make; they carry the layer name and microbatch
//! so a bad schedule can be traced to the exact pass.

use std::fmt;

/// Microbatch identifier. Deferred work is keyed by it, so any interleaving of passes
/// for different microbatches is legal as long as each microbatch sees F → I → W.
pub type MicrobatchId = usize;

/// Errors reported by the engine. Internal invariant violations (e.g. mismatched
/// shapes between two of our own kernels) are asserts, not errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NnError {
    /// A pass ran out of order for a microbatch (I without F, W with nothing queued,
    /// a second F before the first was consumed, ...).
    PassOrder {
        /// Global name of the layer that detected the problem.
        layer: String,
        /// The microbatch the pass was issued for.
        microbatch: MicrobatchId,
        /// What went wrong, in words.
        message: String,
    },
    /// Input data of the wrong shape or out of range (e.g. token id ≥ vocabulary).
    BadInput(String),
    /// An invalid model, split, optimizer or benchmark configuration.
    Config(String),
}

impl NnError {
    /// The message alone, without the kind's prefix (for front ends that add their own
    /// context, e.g. `--data: FILE:3: not valid JSON`).
    pub fn message(&self) -> String {
        match self {
            NnError::BadInput(m) | NnError::Config(m) => m.clone(),
            other => other.to_string(),
        }
    }

    pub(crate) fn pass(layer: &str, microbatch: MicrobatchId, message: impl Into<String>) -> Self {
        NnError::PassOrder {
            layer: layer.to_string(),
            microbatch,
            message: message.into(),
        }
    }
}

impl fmt::Display for NnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NnError::PassOrder {
                layer,
                microbatch,
                message,
            } => write!(f, "layer `{layer}`, microbatch {microbatch}: {message}"),
            NnError::BadInput(m) => write!(f, "bad input: {m}"),
            NnError::Config(m) => write!(f, "invalid configuration: {m}"),
        }
    }
}

impl std::error::Error for NnError {}

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, NnError>;
