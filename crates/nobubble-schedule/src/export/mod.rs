//! Ways out of (and into) the planner: PyTorch's schedule CSV, Chrome/Perfetto traces,
//! SVG pictures and terminal timelines.

pub mod chrome;
pub mod csv;
pub mod svg;
pub mod text;

use crate::schedule::Schedule;

/// Index of `stage` among the stages its rank holds (0 for one-stage-per-rank schedules);
/// pictures shade chunks differently so a V or interleaved schedule stays readable.
pub(crate) fn chunk_index(schedule: &Schedule, stage: usize) -> usize {
    let rank = schedule.placement[stage];
    (0..stage)
        .filter(|&s| schedule.placement[s] == rank)
        .count()
}
