//! Idle time a rank cannot avoid at the start and at the end of an iteration, on any
//! placement (linear, V, interleaved) and under any memory limit — the terms that make the
//! bounds bite where memory is tight and where a rank holds several stages.
//!
//! Take rank `r`, its first stage `s0` (every pass on `r` needs an F(s0,·) first), and
//! `R0`, the shortest time from the start of F(s0, j) to the start of I(s0, j): the forward
//! chain down to the last stage and the input gradients back up.
//!
//! **Warm-up.** Let `t0` be the start of `r`'s first pass. No backward of `s0` starts before
//! `t0 + R0`, so every forward of `s0` that starts earlier is held at once: at most
//! `k0 = ⌊limit / M_B(s0)⌋` of them. The `j`-th of them (in start order) starts at
//! `t0 + j·F(s0)` or later, and so does the `j`-th pass of any other stage `s` of `r`
//! shifted by its chain offset (the first `j + 1` passes of `s` belong to `j + 1` distinct
//! microbatches, whose forwards on `s0` cannot all start before `t0 + j·F(s0)`); the `j`-th forward of `s` also finds `j + 1` forwards of
//! `s0` held, so memory caps how many there are. What fits of all those passes in
//! `[t0, t0 + R0)` is all `r` can run there; the rest of the window is idle.
//!
//! **Cool-down.** Let `a` be the start of the last forward of `s0`. Its input gradient
//! starts at `a + R0` or later and its weight gradient follows, so `r` runs until
//! `a + R0 + I(s0) + W(s0)` at least. After `a` it can only run passes of microbatches in
//! flight at `s0` (at most `k0`, each: its backward on `s0` and its passes on `r`'s other
//! stages) and weight gradients deferred earlier, whose memory shares the limit with the
//! microbatches in flight. The rest is idle.
//!
//! With more microbatches than `k0`, the last forward of `s0` starts after the warm-up
//! window, so the two idle times add up; otherwise only the larger one counts.

use crate::cost::CostModel;

/// The idle time rank `r` must have between its first and last pass; `x` is the memory
/// limit in multiples of each rank's M_B (`None`: unlimited).
pub(crate) fn unavoidable_idle(
    placement: &[usize],
    m: usize,
    costs: &CostModel,
    x: Option<f64>,
    r: usize,
) -> f64 {
    let mine: Vec<usize> = (0..placement.len())
        .filter(|&s| placement[s] == r)
        .collect();
    let Some(&s0) = mine.first() else {
        return 0.0;
    };
    if m == 0 {
        return 0.0;
    }
    let chain = Chain::from(placement, costs, s0);
    let st = &costs.stages;
    // More slack than `check_memory` allows (see [`super::SLACK`]); a rank that holds
    // nothing after its forwards (M_B 0) is not limited at all.
    let limit = match x {
        Some(x) if costs.placed_mem_b(placement, r) > 0.0 && x.is_finite() => {
            costs.placed_limit(placement, r, x) * (1.0 + super::SLACK)
        }
        _ => f64::INFINITY,
    };
    let held = |n: usize, extra: f64| n as f64 * st[s0].mem_b + extra <= limit;
    let k0 = (1..=m).take_while(|&n| held(n, 0.0)).count().max(1);
    let warm = chain.round_trip - warm_up_work(&chain, costs, &mine, k0, &held);
    let cool = cool_down_idle(&chain, costs, &mine, k0, limit, m);
    if m > k0 {
        warm.max(0.0) + cool
    } else {
        warm.max(cool)
    }
}

/// Earliest start of each pass of a microbatch, from the start of its forward on `s0`
/// (stages before `s0` stay 0).
pub(super) struct Chain {
    /// F(s) start.
    pub(super) f: Vec<f64>,
    /// I(s) start.
    pub(super) i: Vec<f64>,
    /// From F(s0) start to I(s0) start.
    round_trip: f64,
}

impl Chain {
    pub(super) fn from(placement: &[usize], costs: &CostModel, s0: usize) -> Chain {
        let n = placement.len();
        let st = &costs.stages;
        let hop = |a: usize, b: usize| {
            if placement[a] != placement[b] {
                costs.comm
            } else {
                0.0
            }
        };
        let mut f = vec![0.0; n];
        for s in s0 + 1..n {
            f[s] = f[s - 1] + st[s - 1].f + hop(s - 1, s);
        }
        let mut i = vec![0.0; n];
        i[n - 1] = f[n - 1] + st[n - 1].f;
        for s in (s0..n - 1).rev() {
            i[s] = i[s + 1] + st[s + 1].i + hop(s + 1, s);
        }
        let round_trip = i[s0];
        Chain { f, i, round_trip }
    }
}

/// The most rank `mine` can run in its warm-up window `[t0, t0 + round trip)`: each pass
/// clipped to the window from its earliest start.
fn warm_up_work(
    chain: &Chain,
    costs: &CostModel,
    mine: &[usize],
    k0: usize,
    held: &impl Fn(usize, f64) -> bool,
) -> f64 {
    let st = &costs.stages;
    let s0 = mine[0];
    let end = chain.round_trip;
    let clip = |dur: f64, start: f64| dur.min((end - start).max(0.0));
    let step = st[s0].f;
    let mut work: f64 = (0..k0).map(|j| clip(step, j as f64 * step)).sum();
    for &s in &mine[1..] {
        // The j-th forward of `s` finds j + 1 forwards of `s0` held, and its own.
        let n = (0..k0).take_while(|&j| held(j + 1, st[s].mem_b)).count();
        for j in 0..n {
            let shift = j as f64 * step;
            work += clip(st[s].f, chain.f[s] + shift)
                + clip(st[s].i, chain.i[s] + shift)
                + clip(st[s].w, chain.i[s] + st[s].i + shift);
        }
    }
    work
}

/// The idle time after the last forward of `mine[0]` (see the module's comment).
fn cool_down_idle(
    chain: &Chain,
    costs: &CostModel,
    mine: &[usize],
    k0: usize,
    limit: f64,
    m: usize,
) -> f64 {
    let st = &costs.stages;
    let s0 = mine[0];
    // Weight gradients deferred past the last forward: memory caps them, unless they hold
    // none; there are never more than all of them.
    let all_w: f64 = mine.iter().map(|&s| m as f64 * st[s].w).sum();
    let mut per_byte: f64 = 0.0;
    for &s in mine {
        if st[s].w > 0.0 {
            per_byte = per_byte.max(if st[s].mem_w > 0.0 {
                st[s].w / st[s].mem_w
            } else {
                f64::INFINITY
            });
        }
    }
    let deferred = |room: f64| {
        if per_byte.is_infinite() || room.is_infinite() {
            all_w
        } else {
            (room * per_byte).min(all_w)
        }
    };
    let others: f64 = mine[1..].iter().map(|&s| st[s].f + st[s].i + st[s].w).sum();
    let in_flight = st[s0].i + st[s0].w + others;
    let most = (1..=k0)
        .map(|n| {
            let room = (limit - n as f64 * st[s0].mem_b).max(0.0);
            st[s0].f + n as f64 * in_flight + deferred(room)
        })
        .fold(0.0, f64::max);
    (chain.round_trip + st[s0].i + st[s0].w - most).max(0.0)
}
