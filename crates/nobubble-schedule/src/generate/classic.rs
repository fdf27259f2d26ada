//! Schedules with a fused backward: GPipe, 1F1B and interleaved 1F1B.

use crate::action::{Action, Kind};
use crate::error::Error;
use crate::schedule::Schedule;

/// One stage per rank, stage `s` on rank `s`.
pub(crate) fn linear_placement(p: usize) -> Vec<usize> {
    (0..p).collect()
}

/// GPipe: every forward, then every backward (in microbatch order, so gradients accumulate
/// as in unpipelined training). Peak memory m·M_B.
pub fn gpipe(p: usize, m: usize) -> Result<Schedule, Error> {
    let orders = (0..p)
        .map(|s| {
            let fwd = (0..m).map(|j| Action::new(s, Kind::F, j));
            let bwd = (0..m).map(|j| Action::new(s, Kind::B, j));
            fwd.chain(bwd).collect()
        })
        .collect();
    Schedule::new("gpipe", p, p, m, linear_placement(p), orders)
}

/// The forward/backward order of 1F1B on stage `s`: `warmup` forwards, then alternate one
/// forward and one backward, then the remaining backwards. `bwd` is the backward kind.
pub(crate) fn one_f_one_b_order(s: usize, m: usize, warmup: usize, bwd: Kind) -> Vec<Action> {
    let w = warmup.min(m);
    let mut order: Vec<Action> = (0..w).map(|j| Action::new(s, Kind::F, j)).collect();
    let (mut next_f, mut next_b) = (w, 0);
    while next_b < m {
        if next_f < m {
            order.push(Action::new(s, Kind::F, next_f));
            next_f += 1;
        }
        order.push(Action::new(s, bwd, next_b));
        next_b += 1;
    }
    order
}

/// 1F1B (PipeDream-flush): stage `s` warms up with `p−1−s` forwards, so at most `p−s`
/// microbatches are in flight: peak memory p·M_B on stage 0.
pub fn one_f_one_b(p: usize, m: usize) -> Result<Schedule, Error> {
    let orders = (0..p)
        .map(|s| one_f_one_b_order(s, m, p - 1 - s, Kind::B))
        .collect();
    Schedule::new("1f1b", p, p, m, linear_placement(p), orders)
}

/// Interleaved 1F1B (Megatron-LM's virtual pipeline): `v` chunks per rank in loop
/// placement (stage `c·p + r` on rank `r`), so the start-up bubble shrinks by `v` at the
/// price of `v×` the messages. Microbatches go through the chunks in groups of `p`, which
/// is why `m` must be a multiple of `p`.
pub fn interleaved_1f1b(p: usize, m: usize, v: usize) -> Result<Schedule, Error> {
    let orders = interleaved_orders(p, m, v, 2, Kind::B)?;
    Schedule::new(
        "interleaved-1f1b",
        p * v,
        p,
        m,
        loop_placement(p, v),
        orders,
    )
}

/// Stage `c·p + r` on rank `r`.
pub(crate) fn loop_placement(p: usize, v: usize) -> Vec<usize> {
    (0..p * v).map(|s| s % p).collect()
}

/// The interleaved order of forwards and backwards (`bwd` = B or I) on every rank, with
/// `(v−1)·p + factor·(p−1−r)` warm-up forwards on rank `r`.
pub(crate) fn interleaved_orders(
    p: usize,
    m: usize,
    v: usize,
    factor: usize,
    bwd: Kind,
) -> Result<Vec<Vec<Action>>, Error> {
    if v == 0 {
        return Err(Error::setting(
            "chunks",
            "must be at least 1 (1 gives plain 1F1B)",
        ));
    }
    if !m.is_multiple_of(p) {
        let lo = (m / p).max(1) * p;
        return Err(Error::setting(
            "microbatches",
            format!(
                "must be a multiple of the {p} ranks for an interleaved schedule (it runs \
                 microbatches through the chunks in groups of one per rank); got {m}, try {lo} \
                 or {}",
                lo + p
            ),
        ));
    }
    let total = m * v;
    // k-th forward (or backward) of a rank: which chunk and microbatch it is.
    let unit = |k: usize, backward: bool| {
        let group = k / p % v;
        let chunk = if backward { v - 1 - group } else { group };
        let mb = k / (p * v) * p + k % p;
        (chunk, mb)
    };
    Ok((0..p)
        .map(|r| {
            let warmup = if m == p {
                total
            } else {
                ((p - r - 1) * factor + (v - 1) * p).min(total)
            };
            let f = |k: usize| {
                let (c, j) = unit(k, false);
                Action::new(c * p + r, Kind::F, j)
            };
            let b = |k: usize| {
                let (c, j) = unit(k, true);
                Action::new(c * p + r, bwd, j)
            };
            let mut order: Vec<Action> = (0..warmup).map(f).collect();
            for k in 0..total - warmup {
                order.push(f(warmup + k));
                order.push(b(k));
            }
            order.extend((total - warmup..total).map(b));
            order
        })
        .collect())
}
