//! The paper's handcrafted zero-bubble schedules, ZB-H1 and ZB-H2.
//!
//! Both keep 1F1B's order of forwards and input gradients and only choose where each
//! weight gradient goes: W(s,j) runs right after I(s, j+lag) (or at the end of the stage).
//! Delaying W keeps the critical chain of I passes moving; the lag is bounded so the number
//! of microbatches in flight (forward done, W not yet) stays within the memory target.

use super::classic::{interleaved_orders, linear_placement, loop_placement, one_f_one_b_order};
use crate::action::{Action, Kind};
use crate::error::Error;
use crate::schedule::Schedule;

/// Inserts `W(j)` after `I(j + lag)`; the last `lag` W's go at the end, in order.
pub(crate) fn place_weight_grads(fi_order: Vec<Action>, m: usize, lag: usize) -> Vec<Action> {
    let mut out = Vec::with_capacity(fi_order.len() + m);
    for a in fi_order {
        out.push(a);
        if a.kind == Kind::I && a.microbatch >= lag {
            out.push(Action::new(a.stage, Kind::W, a.microbatch - lag));
        }
    }
    let stage = out.first().map_or(0, |a| a.stage);
    out.extend((m.saturating_sub(lag)..m).map(|j| Action::new(stage, Kind::W, j)));
    out
}

/// ZB-H1: 1F1B's warm-up (`p−1−s` forwards) and W lag `s` on stage `s`, so every stage has
/// at most `p` microbatches in flight (1F1B's peak, p·M_B) and the bubble drops to
/// (p−1)(F+I−W), a third of 1F1B's when F = I = W. Valid for any m; the closed form holds
/// for m ≥ p.
pub fn zb_h1(p: usize, m: usize) -> Result<Schedule, Error> {
    let orders = (0..p)
        .map(|s| place_weight_grads(one_f_one_b_order(s, m, p - 1 - s, Kind::I), m, s))
        .collect();
    Schedule::new("zb-h1", p, p, m, linear_placement(p), orders)
}

/// ZB-H2: stage `s` warms up with `2(p−1−s)` extra forwards, filling the idle time before
/// the first input gradient arrives, and delays W by `2s` so the tail becomes a
/// parallelogram. At most `2p−1` microbatches in flight ((2p−1)·M_B); the bubble is
/// (p−1)(F+I−2W), zero when F = I = W. Needs m ≥ 2p−1 for that: with fewer microbatches the
/// warm-up cannot fill and the schedule stays valid with a bubble of (2p−1−m) forwards on
/// stage 0.
pub fn zb_h2(p: usize, m: usize) -> Result<Schedule, Error> {
    let orders = (0..p)
        .map(|s| {
            let warmup = 2 * (p - 1 - s);
            place_weight_grads(one_f_one_b_order(s, m, warmup, Kind::I), m, 2 * s)
        })
        .collect();
    Schedule::new("zb-h2", p, p, m, linear_placement(p), orders)
}

/// The family ZB-H1 and ZB-H2 belong to: stage `s` warms up with `warmup[s]` forwards
/// (beyond 1F1B's first) and, from its input gradient number `m − lag[s] − delay` on,
/// delays W by `lag[s]` input gradients (before that, W follows its I at once). A large
/// `delay` lags from the start, as ZB-H1/H2 do; a small one keeps the steady state tight and
/// saves the deferred W's for the tail. `zb-auto` searches this family.
pub fn zb_template(
    p: usize,
    m: usize,
    warmup: &[usize],
    lag: &[usize],
    delay: usize,
    name: &str,
) -> Result<Schedule, Error> {
    let orders = (0..p)
        .map(|s| {
            let start = m.saturating_sub(lag[s] + delay);
            let mut queue = std::collections::VecDeque::new();
            let mut out = Vec::with_capacity(3 * m);
            for a in one_f_one_b_order(s, m, warmup[s], Kind::I) {
                out.push(a);
                if a.kind == Kind::I {
                    queue.push_back(a.microbatch);
                    let target = if a.microbatch >= start { lag[s] } else { 0 };
                    while queue.len() > target {
                        let j = queue.pop_front().expect("non-empty");
                        out.push(Action::new(s, Kind::W, j));
                    }
                }
            }
            out.extend(queue.into_iter().map(|j| Action::new(s, Kind::W, j)));
            out
        })
        .collect();
    Schedule::new(name, p, p, m, linear_placement(p), orders)
}

/// Inserts each W `lag` input gradients after its I, over all stages of a rank (oldest
/// first), then the rest at the end.
fn lag_weight_grads(order: Vec<Action>, lag: usize) -> Vec<Action> {
    let mut queue = std::collections::VecDeque::new();
    let mut out = Vec::with_capacity(order.len() * 3 / 2);
    for a in order {
        out.push(a);
        if a.kind == Kind::I {
            queue.push_back(a);
            if queue.len() > lag {
                let i = queue.pop_front().expect("non-empty");
                out.push(Action::new(i.stage, Kind::W, i.microbatch));
            }
        }
    }
    out.extend(
        queue
            .into_iter()
            .map(|i| Action::new(i.stage, Kind::W, i.microbatch)),
    );
    out
}

/// Interleaved zero bubble (the shape of PyTorch's ScheduleInterleavedZeroBubble): the
/// interleaved order with one warm-up forward per downstream rank instead of two, split
/// backwards, and W delayed by `r` input gradients on rank `r`, as ZB-H1 does for one chunk.
pub fn interleaved_zb(p: usize, m: usize, v: usize) -> Result<Schedule, Error> {
    let orders = interleaved_orders(p, m, v, 1, Kind::I)?
        .into_iter()
        .enumerate()
        .map(|(r, o)| lag_weight_grads(o, r))
        .collect();
    Schedule::new("interleaved-zb", p * v, p, m, loop_placement(p, v), orders)
}
