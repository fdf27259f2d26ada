//! Random cost models for the property tests.

use nobubble_schedule::{CostSpec, RankCost};
use proptest::prelude::*;
use std::ops::Range;

/// Per-rank F, I, W drawn from `time` (W from `w`), M_W/M_B from `mem_w`, comm from `comm`.
pub fn costs_strategy(
    p: usize,
    time: Range<f64>,
    w: Range<f64>,
    mem_w: Range<f64>,
    comm: Range<f64>,
) -> impl Strategy<Value = CostSpec> {
    (
        prop::collection::vec((time.clone(), time, w, mem_w), p),
        comm,
    )
        .prop_map(|(stages, comm)| CostSpec {
            comm,
            stages: stages
                .into_iter()
                .map(|(f, i, w, frac)| RankCost {
                    f,
                    i,
                    w,
                    mem_b: 1.0,
                    mem_w: frac,
                    b: None,
                })
                .collect(),
        })
}
