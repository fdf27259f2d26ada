//! Fused backward passes, for runtimes where splitting the backward costs extra.
//!
//! Zero-bubble schedules split each backward into I and W so that W can fill idle time. That
//! is free when `B = I + W`; in PyTorch's pipelining the split re-walks the autograd graph, and
//! on small stages a fused B can cost much less than I + W (measured 17.2 ms against 23.7 on
//! CPU). When a cost model says so (`b` below `i + w`), `zb-auto` also weighs plans that fuse
//! backward passes: its own plan with every W that directly follows its I fused, the same
//! plan with every backward fused, and on a linear placement 1F1B. None may need more memory
//! on any rank than the limit allows (under byte budgets: than the split plan); the split
//! plans at lower whole-number limits are weighed too, so more memory never plans worse.

use super::classic::one_f_one_b;
use super::search::{better, score};
use super::Goal;
use crate::action::{Action, Kind};
use crate::cost::{CostModel, CostSpec, Objective, RankCost};
use crate::error::Error;
use crate::schedule::Schedule;
use crate::sim::simulate;

/// Pipelines (passes, V layout) up to which fused plans are also built from the split plans
/// at every lower whole-number limit.
pub(crate) const LADDER_MAX_ACTIONS: usize = 3000;

/// Whether some stage's fused backward is cheaper than its split one.
pub(crate) fn cheaper_somewhere(spec: &CostSpec) -> bool {
    spec.stages.iter().any(RankCost::fusing_saves)
}

/// What each rank may hold under `goal`'s multiple of M_B: of the linear layout's M_B, or of
/// the V layout's own (`v_layout`). `None` under byte budgets: there a fused plan may hold no
/// more than the split plan it came from.
pub(crate) fn room(goal: &Goal, v_layout: bool) -> Result<Option<Vec<f64>>, Error> {
    if !goal.budget.is_empty() {
        return Ok(None);
    }
    let p = goal.ranks;
    let per_rank = if v_layout {
        let costs = CostModel::for_layout(goal.costs, 2 * p, p)?;
        let placement = super::v_placement(p);
        (0..p).map(|r| costs.placed_mem_b(&placement, r)).collect()
    } else {
        let costs = CostModel::for_layout(goal.costs, p, p)?;
        costs.stages.iter().map(|c| c.mem_b).collect::<Vec<_>>()
    };
    Ok(Some(per_rank.iter().map(|b| goal.limit * b).collect()))
}

/// The best under `objective` on `spec` of the split plans `bases` (the first is the plan at
/// the limit itself) and their fused variants that fit: within `room` per rank, or without
/// it within the first base's peak. Every base has the same placement.
pub(crate) fn best_with_fused(
    bases: Vec<Schedule>,
    room: Option<&[f64]>,
    spec: &CostSpec,
    objective: Objective,
) -> Result<Schedule, Error> {
    let split = bases[0].clone();
    let costs = CostModel::for_schedule(spec, &split)?.with_objective(objective);
    let peak = simulate(&split, &costs)?.metrics.peak_memory;
    let allowed: Vec<f64> = match room {
        Some(room) => room.iter().zip(&peak).map(|(a, b)| a.max(*b)).collect(),
        None => peak,
    };
    // The first base is the incumbent; the others compete as they are and fused.
    let mut candidates: Vec<Schedule> = bases[1..].to_vec();
    for base in &bases {
        candidates.extend([fuse_where_adjacent(base), fuse_all(base)]);
    }
    if split.stages == split.ranks {
        let mut classic = one_f_one_b(split.ranks, split.microbatches)?;
        classic.placement = split.placement.clone();
        candidates.push(classic);
    }
    let name = split.name.clone();
    let mut best = (score(&split, &costs)?, split);
    for mut candidate in candidates {
        let Ok(sim) = simulate(&candidate, &costs) else {
            continue;
        };
        let fits = sim
            .metrics
            .peak_memory
            .iter()
            .zip(&allowed)
            .all(|(new, room)| *new <= room + 1e-9 * room.abs().max(1.0));
        let sc = score(&candidate, &costs)?;
        if fits && better(sc, best.0) {
            candidate.name = name.clone();
            best = (sc, candidate);
        }
    }
    Ok(best.1)
}

/// Each I directly followed on its rank by the W of the same stage and microbatch, run as one
/// B: the same order, one pass fewer per pair.
pub(crate) fn fuse_where_adjacent(s: &Schedule) -> Schedule {
    let orders = s
        .orders
        .iter()
        .map(|order| {
            let mut fused = Vec::with_capacity(order.len());
            let mut k = 0;
            while k < order.len() {
                let a = order[k];
                let next_is_w = order
                    .get(k + 1)
                    .is_some_and(|n| *n == Action::new(a.stage, Kind::W, a.microbatch));
                if a.kind == Kind::I && next_is_w {
                    fused.push(Action::new(a.stage, Kind::B, a.microbatch));
                    k += 2;
                } else {
                    fused.push(a);
                    k += 1;
                }
            }
            fused
        })
        .collect();
    Schedule {
        orders,
        ..s.clone()
    }
}

/// Every I run as a B where the I stood, its W dropped: each backward fused. Nothing waits
/// on a W, so no order can deadlock that did not before.
pub(crate) fn fuse_all(s: &Schedule) -> Schedule {
    let orders = s
        .orders
        .iter()
        .map(|order| {
            order
                .iter()
                .filter(|a| a.kind != Kind::W)
                .map(|a| match a.kind {
                    Kind::I => Action::new(a.stage, Kind::B, a.microbatch),
                    _ => *a,
                })
                .collect()
        })
        .collect();
    Schedule {
        orders,
        ..s.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::zb_h1;
    use crate::validate::validate;

    fn spec(b: Option<f64>) -> CostSpec {
        CostSpec::uniform(
            RankCost {
                b,
                ..RankCost::default()
            },
            0.0,
        )
    }

    #[test]
    fn fused_plans_are_valid_and_keep_every_backward() {
        let s = zb_h1(4, 8).unwrap();
        let costs = CostModel::for_schedule(&spec(None), &s).unwrap();
        for fused in [fuse_where_adjacent(&s), fuse_all(&s)] {
            validate(&fused, &costs, None).unwrap();
            let count = |k: Kind| {
                fused
                    .orders
                    .iter()
                    .flatten()
                    .filter(|a| a.kind == k)
                    .count()
            };
            assert_eq!(count(Kind::I) + count(Kind::B), 4 * 8);
            assert_eq!(count(Kind::W), count(Kind::I));
        }
        assert!(fuse_all(&s)
            .orders
            .iter()
            .flatten()
            .all(|a| a.kind != Kind::I));
    }

    /// Without a cheaper B nothing changes; with B at 60% of I + W, 1F1B (all fused) beats
    /// ZB-H1 split, by the closed form: 1F1B's makespan is (m + p − 1)(F + B).
    #[test]
    fn a_cheaper_fused_backward_is_used_only_when_it_wins() {
        let (p, m) = (4, 8);
        let s = zb_h1(p, m).unwrap();
        let same =
            best_with_fused(vec![s.clone()], None, &spec(None), Objective::Makespan).unwrap();
        assert_eq!(same, s);
        let b = 1.2;
        let fused =
            best_with_fused(vec![s.clone()], None, &spec(Some(b)), Objective::Makespan).unwrap();
        assert!(fused.orders.iter().flatten().any(|a| a.kind == Kind::B));
        assert_eq!(fused.name, s.name);
        let costs = CostModel::for_schedule(&spec(Some(b)), &fused).unwrap();
        let makespan = simulate(&fused, &costs).unwrap().metrics.makespan;
        let one_f_one_b = (m + p - 1) as f64 * (1.0 + b);
        assert!(makespan <= one_f_one_b + 1e-9, "{makespan} > {one_f_one_b}");
        let split = simulate(&s, &costs).unwrap().metrics.makespan;
        assert!(makespan < split, "{makespan} ≥ ZB-H1's {split}");
    }
}
