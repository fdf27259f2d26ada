//! Schedule generators, all deterministic, behind one name-based registry so the CLI,
//! `compare` and tests see the same list.

mod classic;
mod zero_bubble;

pub use classic::{gpipe, interleaved_1f1b, one_f_one_b};
pub use zero_bubble::{zb_h1, zb_h2};

use crate::error::Error;
use crate::schedule::Schedule;

/// A schedule family the planner can generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleKind {
    /// All forwards, then all backwards.
    GPipe,
    /// One forward, one backward.
    OneFOneB,
    /// 1F1B over `v` chunks per rank in loop placement.
    Interleaved1F1B,
    /// Handcrafted zero bubble at 1F1B's memory.
    ZbH1,
    /// Handcrafted zero bubble at (2p−1)·M_B.
    ZbH2,
}

impl ScheduleKind {
    /// Every kind, in the order `compare` lists them.
    pub const ALL: [ScheduleKind; 5] = [
        ScheduleKind::GPipe,
        ScheduleKind::OneFOneB,
        ScheduleKind::Interleaved1F1B,
        ScheduleKind::ZbH1,
        ScheduleKind::ZbH2,
    ];

    /// The CLI name, stable for scripts.
    pub fn name(self) -> &'static str {
        match self {
            ScheduleKind::GPipe => "gpipe",
            ScheduleKind::OneFOneB => "1f1b",
            ScheduleKind::Interleaved1F1B => "interleaved-1f1b",
            ScheduleKind::ZbH1 => "zb-h1",
            ScheduleKind::ZbH2 => "zb-h2",
        }
    }

    /// One line for help texts and the `compare` table.
    pub fn summary(self) -> &'static str {
        match self {
            ScheduleKind::GPipe => "all forwards then all backwards; memory m·M_B",
            ScheduleKind::OneFOneB => "one forward one backward; bubble (p−1)(F+I+W), memory p·M_B",
            ScheduleKind::Interleaved1F1B => {
                "1F1B over v chunks per rank; bubble ÷ v, v× messages, m a multiple of p"
            }
            ScheduleKind::ZbH1 => "zero-bubble handcrafted; bubble (p−1)(F+I−W), memory p·M_B",
            ScheduleKind::ZbH2 => {
                "zero-bubble handcrafted; bubble (p−1)(F+I−2W), memory (2p−1)·M_B"
            }
        }
    }

    /// Looks a name up; the error lists every valid name.
    pub fn from_name(name: &str) -> Result<ScheduleKind, Error> {
        let key = name.trim().to_ascii_lowercase().replace('_', "-");
        let alias = match key.as_str() {
            "interleaved" | "1f1b-interleaved" | "1f1b-i" => "interleaved-1f1b",
            "zbh1" => "zb-h1",
            "zbh2" => "zb-h2",
            other => other,
        };
        ScheduleKind::ALL
            .into_iter()
            .find(|k| k.name() == alias)
            .ok_or_else(|| {
                Error::Input(format!(
                    "unknown schedule `{name}`; valid schedules: {}",
                    ScheduleKind::ALL.map(|k| k.name()).join(", ")
                ))
            })
    }
}

/// What to generate: the CLI's `--schedule`, `--stages`, `--microbatches`, `--chunks`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Schedule family.
    pub kind: ScheduleKind,
    /// Pipeline ranks (devices); the CLI calls this `--stages`.
    pub ranks: usize,
    /// Microbatches per iteration.
    pub microbatches: usize,
    /// Chunks per rank for interleaved schedules (ignored by the others).
    pub chunks: usize,
}

/// Generates the schedule described by `req`, or says why it cannot exist.
pub fn generate(req: &Request) -> Result<Schedule, Error> {
    let (p, m) = (req.ranks, req.microbatches);
    if p == 0 {
        return Err(Error::Input(
            "--stages must be at least 1 (the number of pipeline ranks)".into(),
        ));
    }
    if m == 0 {
        return Err(Error::Input(
            "--microbatches must be at least 1; pipelines want m ≥ stages to keep every rank busy"
                .into(),
        ));
    }
    match req.kind {
        ScheduleKind::GPipe => gpipe(p, m),
        ScheduleKind::OneFOneB => one_f_one_b(p, m),
        ScheduleKind::Interleaved1F1B => interleaved_1f1b(p, m, req.chunks),
        ScheduleKind::ZbH1 => zb_h1(p, m),
        ScheduleKind::ZbH2 => zb_h2(p, m),
    }
}
