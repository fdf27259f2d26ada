//! Memory cycles: under a tight limit a rank can hold only a few microbatches at once, so
//! each new one waits for an older one's round trip to come back. These terms bound the
//! makespan by chaining those waits over all `m` microbatches, on any placement.
//!
//! **One stage.** Rank `r`'s first stage `a` holds at most `k = ⌊limit / M_B(a)⌋`
//! microbatches between their F and I. Sorting F starts `a_i` and I ends `b_i`:
//! `b_i ≥ a_i + R` (F(a) to the end of I(a) along the chain), `a_i ≥ a_{i−1} + F(a)`, and
//! `a_i ≥ b_{i−k}` (the i-th forward needs one of the first i−k input gradients done to have
//! room). After the last, the backward chain below `a` and its W follow (`post(a)`).
//!
//! **Two stages** (a V rank: `a` and a later stage `b`). When F(b, j) runs, microbatch `j`
//! holds M_B(a) + M_B(b), and every other microbatch whose F(a) ran and whose W(a) has not
//! holds at least `μ = min(M_B(a), M_W(a))`: at most `n_w = ⌊(limit − M_B(a) − M_B(b)) / μ⌋`
//! of them, and at most `n_i = ⌊(limit − M_B(a) − M_B(b)) / M_B(a)⌋` before their I(a).
//! Sort the F(b) starts `t_q` (one rank: start order is program order). The `n_i + 1`
//! microbatches just before `q` all ran F(a) before F(b, j_q), so one of them has finished
//! I(a): `t_q ≥ t_{q−n_i−1} + D`, with `D` the chain from F(b) start to I(a) end; and one
//! has finished W(a): `t_q ≥ t_{q−n_w−1} + D + W(a)`. The last microbatch still needs `D`
//! and `post(a)` after its F(b).
//!
//! **Both stages cleared.** A microbatch that has not finished both W(a) and W(b) holds at
//! least `min(μ, M_W(b))` (one through W(a) is through I(a), hence I(b), and holds M_W(b)
//! until W(b)), so one of the `n_c + 1` just before `q`, `n_c = ⌊room / min(μ, M_W(b))⌋`,
//! has finished both. W(b) starts after I(b) ends; run before I(a) it pushes I(a) back
//! unless it fits in the chain's gap `g` between them (the input gradients of the stages in
//! between, counted as if the rank could overlap them all), run after it adds its own time:
//! either way the microbatch is cleared no earlier than `D + W(a) + max(0, W(b) − g)` after
//! its F(b) — the last one too, so the iteration lasts that long after the last F(b). This
//! binds where `b` follows `a` on the same rank, as on a V's last rank (`g = 0`).

use super::window::Chain;
use super::SLACK;
use crate::cost::CostModel;

/// The largest memory-cycle bound over all ranks; 0 without a limit.
pub(super) fn memory_cycles(
    placement: &[usize],
    m: usize,
    costs: &CostModel,
    x: Option<f64>,
    chain: &Chain,
    post: &[f64],
) -> f64 {
    let Some(x) = x.filter(|x| x.is_finite()) else {
        return 0.0;
    };
    let st = &costs.stages;
    let ranks = placement.iter().copied().max().map_or(0, |r| r + 1);
    let mut bound: f64 = 0.0;
    for r in 0..ranks {
        let mine: Vec<usize> = (0..placement.len())
            .filter(|&s| placement[s] == r)
            .collect();
        let Some(&a) = mine.first() else { continue };
        // More slack than `check_memory` (see [`SLACK`]).
        let limit = costs.placed_limit(placement, r, x) * (1.0 + SLACK);
        let mb_a = st[a].mem_b;
        if mb_a <= 0.0 {
            continue;
        }
        // One stage.
        let k = ((limit / mb_a).floor() as usize).max(1);
        let round_trip = chain.i[a] + st[a].i - chain.f[a];
        let first_i_ends = cycle(m, chain.f[a], st[a].f, &[(k, round_trip)]);
        bound = bound.max(first_i_ends + round_trip + post[a]);
        // Two stages.
        for &b in &mine[1..] {
            let room = limit - mb_a - st[b].mem_b;
            if room < 0.0 {
                continue;
            }
            let d = chain.i[a] + st[a].i - chain.f[b];
            let mu = mb_a.min(st[a].mem_w);
            let mut waits = vec![(lag(room, mb_a, m), d)];
            if mu > 0.0 {
                waits.push((lag(room, mu, m), d + st[a].w));
            }
            // Cleared of both stages: W(b) also done. It cannot run before I(b) ends, and
            // only the chain's gap between I(b) and I(a) hides it. (Shrunk by the slack, so
            // that the gap's rounding never makes it longer than it is.)
            let gap = (chain.i[a] - (chain.i[b] + st[b].i)).max(0.0);
            let hidden = ((st[b].w - gap) * (1.0 - SLACK)).max(0.0);
            // A microbatch through W(a) is through I(a), hence I(b): it holds M_W(b) until
            // W(b).
            let mu_b = st[b].mem_w;
            if mu > 0.0 && mu_b > 0.0 && hidden > 0.0 {
                waits.push((lag(room, mu.min(mu_b), m), d + st[a].w + hidden));
            }
            let last_f_b = cycle(m, chain.f[b], st[b].f, &waits);
            bound = bound.max(last_f_b + d + post[a].max(st[a].w + hidden));
        }
    }
    bound
}

/// `⌊room / per⌋ + 1`, the lag of a wait when `per` bounds what each of the others holds;
/// capped past `m` (where no wait applies), so a tiny `per` cannot overflow it.
fn lag(room: f64, per: f64, m: usize) -> usize {
    (room / per).floor().min(m as f64) as usize + 1
}

/// The earliest start of the last of `m` passes that start no earlier than `first`, at least
/// `step` apart, and each at least `wait` after the start of the one `lag` places before it,
/// for every `(lag, wait)`.
fn cycle(m: usize, first: f64, step: f64, waits: &[(usize, f64)]) -> f64 {
    let mut t = vec![first; m];
    for q in 1..m {
        t[q] = t[q - 1] + step;
        for &(lag, wait) in waits {
            if q >= lag && lag <= m {
                t[q] = t[q].max(t[q - lag] + wait);
            }
        }
    }
    t.last().copied().unwrap_or(first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bound::lower_bound;
    use crate::cost::{CostSpec, RankCost};

    /// By hand: p 2, m 2, every chunk F = I = W = 0.5, M_B 0.5, M_W 0.25, limit 1 × the
    /// rank's M_B (1.0). On rank 0 (stages 0 and 3), F(3, j) fills the rank by itself, so
    /// the other microbatch must be through W(0) first: the second F(3) starts at least
    /// D + W(0) = (F3 + I3 + I2 + I1 + I0) + W0 = 3 after the first, which starts at 1.5.
    /// Then D + W(0) more: 1.5 + 3 + 3 = 7.5. On rank 1 (stages 1 and 2, where I(1) follows
    /// I(2) on the same rank, so W(2) hides in no gap) the other microbatch must be through
    /// both W(1) and W(2): the second F(2) starts D + W(1) + W(2) = 2.5 + 1 = 3.5 after the
    /// first (D = F2 + F3 + I3 + I2 + I1), which starts at 1, and the last still needs D and
    /// both weight gradients: 1 + 3.5 + 2.5 + 1 = 8 (the exact optimum is 8.5; the other
    /// terms give 7).
    #[test]
    fn a_full_v_rank_runs_its_microbatches_one_after_another() {
        let spec = CostSpec::uniform(RankCost::default(), 0.0);
        let costs = CostModel::for_layout(&spec, 4, 2).unwrap();
        let placement = [0, 1, 1, 0];
        let bound = lower_bound(&placement, 2, &costs, Some(1.0));
        assert!((bound - 8.0).abs() < 1e-6, "{bound}");
        // Room for a second microbatch's forward: the cycle no longer binds.
        assert!(lower_bound(&placement, 2, &costs, Some(2.0)) < 7.5);
    }

    #[test]
    fn the_cycle_recursion_takes_the_longest_wait() {
        // Steps of 1, and each pass 5 after the one two before it: 0, 1, 5, 6, 10.
        assert_eq!(cycle(5, 0.0, 1.0, &[(2, 5.0)]), 10.0);
        assert_eq!(cycle(5, 2.0, 1.0, &[]), 6.0);
        assert_eq!(cycle(1, 3.0, 1.0, &[(1, 9.0)]), 3.0);
    }
}
