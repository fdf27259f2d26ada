//! A proven lower bound on the makespan of *any* valid schedule for a placement, microbatch
//! count, cost model and memory limit — so every plan can say how far from optimal it is
//! (`gap` = makespan / bound − 1).
//!
//! With `h(s)` the earliest start of F(s,·) (the forward chain plus hops), and `c(s)` the
//! hop into stage `s` (comm if it crosses ranks, else 0), the bound is the largest of:
//!
//! 1. **Work**: a rank cannot start before the earliest of its stages' `h(s)`, then must
//!    run `m·Σ(F+I+W)` of its stages' passes, one at a time.
//! 2. **Last forward**: the last stage runs its m forwards in sequence from `h(L)`; after
//!    the last one, that microbatch still needs I(L) and the backward chain to stage 0 and
//!    its W: `post(s) = max(W_s, c(s) + I_{s−1} + post(s−1))`, `post(0) = W_0`.
//! 3. **First backward**: no I(s,·) ends before one microbatch's round trip reaches it; after
//!    that, stage `s` still owes `m−1` input gradients and `m` weight gradients.
//! 4. **Memory** (with a limit): stage 0 can hold at most `k = ⌊limit / M_B(0)⌋`
//!    microbatches between their F and I. Sorting F starts `a_i` and I ends `b_i`:
//!    `b_i ≥ a_i + R` (the round trip), `a_i ≥ a_{i−1} + F_0`, and `a_i ≥ b_{i−k}` (the
//!    i-th forward needs one of the first i−k input gradients done to have room). The
//!    recursion gives the earliest possible `b_m`; the last W follows it.
//!
//! Each term is a necessary condition on every valid schedule, so their maximum is a valid
//! bound. It is tight for 1F1B-like regimes (term 1 equals ZB-H2's makespan when F = I = W
//! and there is no communication).

use crate::cost::CostModel;

/// Lower bound on the longest per-rank span (first pass start to last pass end), the
/// quantity the paper's bubble rate is made of: `1 − max(busy)/bound` bounds the bubble
/// rate of every valid schedule from below.
///
/// Every rank's span is at least its work. A rank that holds a single stage `s` can also be
/// shown to idle: from its first pass (a forward: nothing else is ready) until its first
/// input gradient, at least one round trip `R_s` passes — the forward down to the last
/// stage and the input gradients back — and in that time it can only run forwards, at most
/// `k = ⌊limit / M_B(s)⌋` of them (each holds its activations until its I), and at most m.
/// So its span is at least `m·(F+I+W) + max(0, R_s − min(k, m)·F_s)`. Memory makes this
/// bite: at 2p·M_B on the paper's 28.3B model, stage 0 can fill only 64 of the 65.3
/// forwards' worth of its start-up wait.
pub fn span_lower_bound(placement: &[usize], m: usize, costs: &CostModel, x: Option<f64>) -> f64 {
    let n = placement.len();
    if n == 0 || m == 0 {
        return 0.0;
    }
    let st = &costs.stages;
    let hop = |a: usize, b: usize| {
        if placement[a] != placement[b] {
            costs.comm
        } else {
            0.0
        }
    };
    // Round trip from F(s, j) start to the earliest start of I(s, j).
    let mut down = vec![0.0; n]; // F(s) start to F(last) end
    down[n - 1] = st[n - 1].f;
    for s in (0..n - 1).rev() {
        down[s] = st[s].f + hop(s, s + 1) + down[s + 1];
    }
    let mut up = vec![0.0; n]; // I(last) start to I(s) start
    for s in (0..n - 1).rev() {
        up[s] = up[s + 1] + st[s + 1].i + hop(s + 1, s);
    }
    let ranks = placement.iter().copied().max().unwrap_or(0) + 1;
    let mf = m as f64;
    let mut bound: f64 = 0.0;
    for r in 0..ranks {
        let mine: Vec<usize> = (0..n).filter(|&s| placement[s] == r).collect();
        let work: f64 = mine
            .iter()
            .map(|&s| mf * (st[s].f + st[s].i + st[s].w))
            .sum();
        let mut span = work;
        if let [s] = mine[..] {
            let round_trip = down[s] + up[s];
            let room = match x {
                // The same tolerance as `check_memory`: a peak may exceed the limit by 1e-9.
                Some(x) if st[s].mem_b > 0.0 => {
                    ((x * costs.share(r) * (1.0 + 1e-9)).floor().max(1.0) as usize).min(m)
                }
                _ => m,
            };
            span += (round_trip - room as f64 * st[s].f).max(0.0);
        }
        bound = bound.max(span);
    }
    bound
}

/// Lower bound on the makespan. `x` is the memory limit in multiples of each rank's M_B
/// (`None`: unlimited).
pub fn lower_bound(placement: &[usize], m: usize, costs: &CostModel, x: Option<f64>) -> f64 {
    let n = placement.len();
    if n == 0 || m == 0 {
        return 0.0;
    }
    let st = &costs.stages;
    let hop = |s: usize| {
        if s > 0 && placement[s] != placement[s - 1] {
            costs.comm
        } else {
            0.0
        }
    };
    let mut head = vec![0.0; n];
    for s in 1..n {
        head[s] = head[s - 1] + st[s - 1].f + hop(s);
    }
    let ranks = placement.iter().copied().max().unwrap_or(0) + 1;
    let mf = m as f64;
    // 1. Work per rank.
    let mut bound: f64 = 0.0;
    for r in 0..ranks {
        let mine: Vec<usize> = (0..n).filter(|&s| placement[s] == r).collect();
        if mine.is_empty() {
            continue;
        }
        let start = mine.iter().map(|&s| head[s]).fold(f64::INFINITY, f64::min);
        let work: f64 = mine.iter().map(|&s| st[s].f + st[s].i + st[s].w).sum();
        bound = bound.max(start + mf * work);
    }
    // 2. Last forward on the last stage, then the backward chain.
    let mut post = vec![0.0; n];
    post[0] = st[0].w;
    for s in 1..n {
        post[s] = st[s].w.max(hop(s) + st[s - 1].i + post[s - 1]);
    }
    let last = n - 1;
    bound = bound.max(head[last] + mf * st[last].f + st[last].i + post[last]);
    // 3. First input gradient of each stage, then the rest of its backward work.
    let mut first_i_end = vec![0.0; n];
    first_i_end[last] = head[last] + st[last].f + st[last].i;
    for s in (0..last).rev() {
        first_i_end[s] = first_i_end[s + 1] + hop(s + 1) + st[s].i;
    }
    for s in 0..n {
        bound = bound.max(first_i_end[s] + (mf - 1.0) * st[s].i + mf * st[s].w);
    }
    // 4. Memory on stage 0's rank.
    if let Some(x) = x {
        let r0 = placement[0];
        let limit: f64 = x
            * costs.share(r0)
            * (0..n)
                .filter(|&s| placement[s] == r0)
                .map(|s| st[s].mem_b)
                .sum::<f64>();
        if st[0].mem_b > 0.0 {
            // The same tolerance as `check_memory`: a peak may exceed the limit by 1e-9.
            let k = (limit * (1.0 + 1e-9) / st[0].mem_b).floor().max(1.0) as usize;
            let round_trip = first_i_end[0];
            let mut a = vec![0.0; m];
            let mut b = vec![0.0; m];
            for i in 0..m {
                a[i] = if i > 0 { a[i - 1] + st[0].f } else { 0.0 };
                if i >= k {
                    a[i] = a[i].max(b[i - k]);
                }
                b[i] = a[i] + round_trip;
            }
            bound = bound.max(b[m - 1] + st[0].w);
        }
    }
    bound
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{CostSpec, RankCost};

    /// A limit a hair under a whole number admits as many forwards as `check_memory` does
    /// (it allows a relative 1e-9 over), so neither bound may assume fewer.
    #[test]
    fn memory_terms_use_the_validators_tolerance() {
        let spec = CostSpec::uniform(RankCost::default(), 0.0);
        let costs = CostModel::for_layout(&spec, 4, 4).unwrap();
        let placement = [0, 1, 2, 3];
        for x in [3.0, 2.999_999_998_5] {
            assert_eq!(
                span_lower_bound(&placement, 8, &costs, Some(x)),
                28.0,
                "x = {x}"
            );
            assert_eq!(
                lower_bound(&placement, 8, &costs, Some(x)),
                lower_bound(&placement, 8, &costs, Some(3.0))
            );
        }
        assert_eq!(span_lower_bound(&placement, 8, &costs, Some(2.0)), 29.0);
    }
}
