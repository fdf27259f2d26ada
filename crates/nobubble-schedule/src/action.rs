//! The unit of a schedule: one pass of one stage on one microbatch.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Which pass an action runs. Splitting the backward into `I` and `W` is what lets
/// zero-bubble schedules move weight-gradient work into idle time; `B` keeps the
/// classic fused backward so GPipe/1F1B are expressed in the same IR.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Kind {
    /// Forward pass: produces the activation the next stage needs.
    F,
    /// Input gradient: on the critical path, the previous stage waits for it.
    I,
    /// Weight gradient: local, postponable until the optimizer step.
    W,
    /// Full backward, I immediately followed by W, as one pass.
    B,
}

impl Kind {
    /// All kinds, in display order (used for legends and counts).
    pub const ALL: [Kind; 4] = [Kind::F, Kind::I, Kind::W, Kind::B];

    /// The single letter used in PyTorch's CSV format and in our text output.
    pub fn letter(self) -> char {
        match self {
            Kind::F => 'F',
            Kind::I => 'I',
            Kind::W => 'W',
            Kind::B => 'B',
        }
    }

    /// Parses the letter of PyTorch's format; `None` for anything else.
    pub fn from_letter(c: char) -> Option<Kind> {
        match c {
            'F' => Some(Kind::F),
            'I' => Some(Kind::I),
            'W' => Some(Kind::W),
            'B' => Some(Kind::B),
            _ => None,
        }
    }

    /// A human name, for legends and error messages.
    pub fn name(self) -> &'static str {
        match self {
            Kind::F => "forward",
            Kind::I => "input-grad",
            Kind::W => "weight-grad",
            Kind::B => "backward",
        }
    }
}

/// One pass of `stage` on `microbatch`. Ranks are implied by the schedule's placement,
/// so the same action reads the same wherever it is listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Action {
    /// Pipeline stage (a contiguous slice of the model).
    pub stage: usize,
    /// Pass kind.
    pub kind: Kind,
    /// Microbatch index within the iteration.
    pub microbatch: usize,
}

impl Action {
    /// Shorthand constructor; keeps generator code readable.
    pub fn new(stage: usize, kind: Kind, microbatch: usize) -> Action {
        Action {
            stage,
            kind,
            microbatch,
        }
    }
}

/// Formats as PyTorch does: `{stage}{kind}{microbatch}`, e.g. `5I2`.
impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}{}", self.stage, self.kind.letter(), self.microbatch)
    }
}

/// Why a cell could not be read as an action; carries the text so the message can quote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseActionError {
    /// The offending cell, as written.
    pub text: String,
    /// What is wrong with it, phrased as a fix.
    pub reason: String,
}

impl fmt::Display for ParseActionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A cell of a damaged file can be megabytes: quote its start.
        let t = &self.text;
        match t.char_indices().nth(40) {
            Some((end, _)) => write!(
                f,
                "cannot read action `{}…` ({} bytes): {}",
                &t[..end],
                t.len(),
                self.reason
            ),
            None => write!(f, "cannot read action `{t}`: {}", self.reason),
        }
    }
}

impl std::error::Error for ParseActionError {}

impl FromStr for Action {
    type Err = ParseActionError;

    fn from_str(s: &str) -> Result<Action, ParseActionError> {
        let err = |reason: &str| ParseActionError {
            text: s.to_string(),
            reason: reason.to_string(),
        };
        let t = s.trim();
        if t.contains('_') || t.contains("SEND") || t.contains("RECV") || t.contains("REDUCE") {
            return Err(err(
                "communication actions (SEND_F, RECV_B, REDUCE_GRAD, ...) belong to PyTorch's \
                 lowered compute+comms format; export the compute-only schedule instead",
            ));
        }
        let pos = t
            .find(|c: char| !c.is_ascii_digit())
            .ok_or_else(|| err("expected {stage}{F|I|W|B}{microbatch}, e.g. `0F3`"))?;
        if pos == 0 {
            return Err(err("it must start with the stage number, e.g. `0F3`"));
        }
        let stage = t[..pos]
            .parse::<usize>()
            .map_err(|_| err("the stage number is too large"))?;
        let mut rest = t[pos..].chars();
        let letter = rest.next().unwrap_or(' ');
        let kind = Kind::from_letter(letter).ok_or_else(|| {
            err(&format!(
                "`{letter}` is not a pass kind; use F (forward), I (input grad), W (weight grad) or B (full backward)"
            ))
        })?;
        let mb_text = rest.as_str();
        if mb_text.is_empty() || !mb_text.chars().all(|c| c.is_ascii_digit()) {
            return Err(err(
                "the microbatch number after the kind letter is missing or not a number",
            ));
        }
        let microbatch = mb_text
            .parse::<usize>()
            .map_err(|_| err("the microbatch number is too large"))?;
        Ok(Action::new(stage, kind, microbatch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_pytorch_notation() {
        for text in ["0F3", "5I2", "5W2", "3B1", "12F105"] {
            let a: Action = text.parse().unwrap();
            assert_eq!(a.to_string(), text);
        }
        assert_eq!(
            "12I7".parse::<Action>().unwrap(),
            Action::new(12, Kind::I, 7)
        );
    }

    #[test]
    fn rejects_malformed_cells_with_reason() {
        let e = "0X3".parse::<Action>().unwrap_err();
        assert!(e.to_string().contains("`X` is not a pass kind"), "{e}");
        assert!("F3".parse::<Action>().is_err());
        assert!("0F".parse::<Action>().is_err());
        assert!("0F3x".parse::<Action>().is_err());
        let e = "0SEND_F3".parse::<Action>().unwrap_err();
        assert!(e.to_string().contains("compute-only"), "{e}");
        // A megabyte cell is quoted by its start and its size.
        let e = "é"
            .repeat(500_000)
            .parse::<Action>()
            .unwrap_err()
            .to_string();
        assert!(e.len() < 300 && e.contains("(1000000 bytes)"), "{e}");
    }
}
