//! Periodic schedules by modulo scheduling: plan one microbatch's passes once, as a
//! template, and start microbatch j exactly `j · period` later.
//!
//! The template places one microbatch's passes in dependency order — forwards down the
//! pipeline, input gradients back up, then each W — each at the earliest time its input is
//! ready *and* its rank is free modulo the period, i.e. free of the passes that every other
//! microbatch places on that rank at the same offset. Every rank then runs one microbatch's
//! work per period with no collision, so with the period equal to the busiest rank's work
//! per microbatch the steady state has no bubble at all, and each microbatch's activations
//! live as briefly as the dependency chain allows. A longer period holds fewer microbatches in
//! flight (memory ≈ lifetime / period), trading bubble for memory smoothly — which is how the
//! V-Min and V-Half building blocks of Qi et al. work, found here by construction instead of
//! by brute force over offsets. With F = I = W and no communication the period can equal a
//! rank's load within the V-Min memory; with communication a microbatch lives longer, so the
//! same memory needs a longer period, i.e. a steady-state bubble.
//!
//! Each rank's order is its passes sorted by template time; the simulator then runs that
//! order as early as dependencies allow, so fill and drain are compressed.

use crate::action::{Action, Kind};
use crate::cost::CostModel;
use crate::error::Error;
use crate::schedule::Schedule;
use crate::sim::dependency;

/// Periods tried: multiples of the busiest rank's work per microbatch, from 1 to 3.
const STRETCH_STEPS: usize = 100;
const STRETCH_MAX: f64 = 3.0;

/// A one-microbatch template: every pass of microbatch 0 with its start time.
type Template = Vec<(Action, f64)>;

/// Periodic schedules over a range of periods, one per distinct memory need: for each
/// amount of memory, the shortest period (least bubble) that needs no more. The memory a
/// period needs is found on a short run of the pattern (it repeats once the pipeline is
/// full), so only the kept periods are built in full.
pub(crate) fn candidates(
    name: &str,
    placement: &[usize],
    ranks: usize,
    m: usize,
    costs: &CostModel,
) -> Vec<Schedule> {
    let load = (0..ranks)
        .map(|r| {
            (0..placement.len())
                .filter(|&s| placement[s] == r)
                .map(|s| costs.stages[s].f + costs.stages[s].i + costs.stages[s].w)
                .sum::<f64>()
        })
        .fold(0.0, f64::max);
    if load <= 0.0 || m == 0 {
        return Vec::new();
    }
    let mut kept: Vec<(f64, Template, f64)> = Vec::new(); // (need, template, period)
    for k in 0..=STRETCH_STEPS {
        let period = load * (1.0 + (STRETCH_MAX - 1.0) * k as f64 / STRETCH_STEPS as f64);
        let Some(t) = template(placement, ranks, costs, period) else {
            continue;
        };
        let span = t.iter().map(|x| x.1).fold(0.0, f64::max);
        let short = (span / period).ceil() as usize + 2;
        let Ok(probe) = expand(name, placement, ranks, m.min(short), &t, period) else {
            continue;
        };
        let need = super::search::needed_limit(&probe, costs);
        if kept.iter().all(|(n, _, _)| need < n - 1e-9) {
            kept.push((need, t, period));
        }
    }
    kept.into_iter()
        .filter_map(|(_, t, period)| expand(name, placement, ranks, m, &t, period).ok())
        .collect()
}

/// Places one microbatch's passes in dependency order — forwards down, input gradients
/// up, then each W after its I — each at the earliest time its input is ready and its rank
/// is free modulo `period`. `None` if some pass finds no room (the period is below a
/// rank's load, or its free time is too fragmented).
fn template(placement: &[usize], ranks: usize, costs: &CostModel, period: f64) -> Option<Template> {
    let n = placement.len();
    let mut busy: Vec<Vec<(f64, f64)>> = vec![Vec::new(); ranks];
    let mut out: Template = Vec::with_capacity(3 * n);
    let mut end = vec![[0.0f64; 2]; n]; // [F end, I end] per stage
    let mut place = |a: Action, busy: &mut Vec<Vec<(f64, f64)>>, end: &mut Vec<[f64; 2]>| {
        let r = placement[a.stage];
        let ready = match dependency(a, n) {
            None => 0.0,
            Some(d) => {
                let e = end[d.stage][if d.kind == Kind::F { 0 } else { 1 }];
                e + if placement[d.stage] != r {
                    costs.comm
                } else {
                    0.0
                }
            }
        };
        let dur = costs.time(a.stage, a.kind);
        let t = earliest_free(&busy[r], ready, dur, period)?;
        if dur > 0.0 {
            busy[r].push((t.rem_euclid(period), dur));
        }
        match a.kind {
            Kind::F => end[a.stage][0] = t + dur,
            Kind::I => end[a.stage][1] = t + dur,
            _ => {}
        }
        out.push((a, t));
        Some(())
    };
    for s in 0..n {
        place(Action::new(s, Kind::F, 0), &mut busy, &mut end)?;
    }
    for s in (0..n).rev() {
        place(Action::new(s, Kind::I, 0), &mut busy, &mut end)?;
    }
    // W's in the order their I's ended, each as soon after it as the rank has room.
    let mut by_i: Vec<usize> = (0..n).collect();
    by_i.sort_by(|&a, &b| end[a][1].total_cmp(&end[b][1]));
    for s in by_i {
        place(Action::new(s, Kind::W, 0), &mut busy, &mut end)?;
    }
    Some(out)
}

/// Microbatch j runs the template `j · period` later; each rank's order is its passes
/// sorted by those times (ties by microbatch, then dependency order).
///
/// Each template pass's copies are already in that order (their times grow with j), so a
/// rank's order is a merge of a few sorted lists — one per template pass on the rank —
/// rather than a sort of all `m ×` of them (the sort was a fifth of `v-auto`'s time).
fn expand(
    name: &str,
    placement: &[usize],
    ranks: usize,
    m: usize,
    template: &Template,
    period: f64,
) -> Result<Schedule, Error> {
    // The merge needs each pass's copies in time order, i.e. a period that can be added.
    debug_assert!(period.is_finite() && period >= 0.0, "period {period}");
    let mut on_rank: Vec<Vec<usize>> = vec![Vec::new(); ranks];
    for (k, (a, _)) in template.iter().enumerate() {
        on_rank[placement[a.stage]].push(k);
    }
    let time = |k: usize, j: usize| template[k].1 + j as f64 * period;
    let orders = on_rank
        .iter()
        .map(|lists| {
            // The next microbatch of each list; the smallest (time, j, k) goes next.
            let mut next = vec![0usize; lists.len()];
            let mut order = Vec::with_capacity(lists.len() * m);
            loop {
                let mut pick: Option<(usize, f64)> = None;
                for (l, &k) in lists.iter().enumerate() {
                    let j = next[l];
                    if j == m {
                        continue;
                    }
                    let t = time(k, j);
                    let earlier = pick.is_none_or(|(p, tp)| {
                        let (jp, kp) = (next[p], lists[p]);
                        t.total_cmp(&tp).then(j.cmp(&jp)).then(k.cmp(&kp)).is_lt()
                    });
                    if earlier {
                        pick = Some((l, t));
                    }
                }
                let Some((l, _)) = pick else { break };
                let a = template[lists[l]].0;
                order.push(Action::new(a.stage, a.kind, next[l]));
                next[l] += 1;
            }
            order
        })
        .collect();
    Schedule::new(name, placement.len(), ranks, m, placement.to_vec(), orders)
}

/// The earliest `t ≥ ready` such that `[t, t + dur)` taken modulo `period` misses every
/// `(start, len)` in `busy` (starts already reduced modulo the period).
fn earliest_free(busy: &[(f64, f64)], ready: f64, dur: f64, period: f64) -> Option<f64> {
    const EPS: f64 = 1e-9;
    let used: f64 = busy.iter().map(|b| b.1).sum();
    if used + dur > period * (1.0 + EPS) {
        return None;
    }
    let collides = |t: f64| {
        let s = t.rem_euclid(period);
        busy.iter().any(|&(b, len)| {
            // Overlap of [s, s+dur) with [b, b+len) on a circle of length `period`.
            let d = (b - s).rem_euclid(period);
            let back = (s - b).rem_euclid(period);
            (d < dur - EPS * period) || (back < len - EPS * period)
        })
    };
    // Candidates: `ready` itself, or the end of a busy interval, shifted to at or after
    // `ready`; the first that does not collide is the earliest.
    let mut cands = vec![ready];
    for &(b, len) in busy {
        let e = b + len;
        let k = ((ready - e) / period).ceil();
        cands.push(e + k * period);
    }
    cands.sort_by(f64::total_cmp);
    cands
        .into_iter()
        .find(|&t| t >= ready - EPS * ready.abs().max(period) && !collides(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The merge gives each rank the order of a plain sort by (time, microbatch, template
    /// index), ties included: a V of 2 ranks whose template times collide across microbatches
    /// (period 2: microbatch 1's F(0) at 2 lands on microbatch 0's F(3), I(0) and W(0)).
    #[test]
    fn expansion_orders_each_rank_by_time_then_microbatch() {
        let placement = [0, 1, 1, 0];
        let times = [0.0, 1.0, 1.0, 2.0, 2.0, 2.5, 3.0, 4.0, 2.0, 5.0, 4.0, 5.5];
        let kinds = [Kind::F, Kind::I, Kind::W];
        let template: Template = (0..12)
            .map(|k| (Action::new(k % 4, kinds[k / 4], 0), times[k]))
            .collect();
        let (m, period) = (5, 2.0);
        let s = expand("t", &placement, 2, m, &template, period).unwrap();
        for (r, order) in s.orders.iter().enumerate() {
            let mut want: Vec<(f64, usize, usize)> = (0..m)
                .flat_map(|j| (0..12).map(move |k| (j, k)))
                .filter(|&(_, k)| placement[template[k].0.stage] == r)
                .map(|(j, k)| (template[k].1 + j as f64 * period, j, k))
                .collect();
            want.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
            let want: Vec<Action> = want
                .iter()
                .map(|&(_, j, k)| Action::new(template[k].0.stage, template[k].0.kind, j))
                .collect();
            assert_eq!(order, &want, "rank {r}");
        }
    }

    #[test]
    fn free_time_is_found_modulo_the_period() {
        // Period 6, busy [0,1) and [3,4.5).
        let busy = [(0.0, 1.0), (3.0, 1.5)];
        assert_eq!(earliest_free(&busy, 0.0, 1.0, 6.0), Some(1.0));
        assert_eq!(earliest_free(&busy, 2.5, 1.0, 6.0), Some(4.5));
        // [4.5, 6) is 1.5 long: a 2-long pass wraps onto [0,1) and must wait to 7.
        assert_eq!(earliest_free(&busy, 4.0, 2.0, 6.0), Some(7.0));
        assert_eq!(earliest_free(&busy, 0.0, 4.0, 6.0), None);
    }
}
