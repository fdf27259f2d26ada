//! Fused backward passes, for runtimes where splitting the backward costs extra.
//!
//! Zero-bubble schedules split each backward into I and W so that W can fill idle time. That
//! is free when `B = I + W`; in PyTorch's pipelining the split re-walks the autograd graph, and
//! on small stages a fused B can cost much less than I + W (measured 17.2 ms against 23.7 on
//! CPU). When a cost model says so (`b` below `i + w`), `zb-auto` weighs, per placement:
//! - its split plan, with every W that directly follows its I fused, and with all fused;
//! - the same search run on costs where I is the fused backward ([`fused_as_input`]), fused:
//!   a plan ordered for B from the start; on small pipelines also with its last microbatches'
//!   backwards split again, their Ws in the idle time of the drain ([`split_tail`]);
//! - the placement's fixed pattern (1F1B, DualPipeV), which mixes the two;
//!
//! then splits single backwards where a W fills idle time ([`split_where_idle`]), starting
//! from the best few plans overall, the best few of the limit's own and the best of each
//! carried plan's. None may need more memory on any rank than the limit (or the rank's byte
//! budget) allows, and every stage's weight gradients stay in microbatch order (the bits of
//! 1F1B). On small pipelines the best two plans of each lower whole-number limit
//! are carried up the ladder, so more memory never plans worse ([`fused_plan`]).

use super::classic::one_f_one_b;
use super::search::{self, better, score, Climbed, Levels, Score};
use super::v_shape::dualpipe_v;
use super::Goal;
use crate::action::{Action, Kind};
use crate::cost::{CostModel, CostSpec, Objective, RankCost};
use crate::error::Error;
use crate::schedule::Schedule;
use crate::sim::simulate;

/// Pipelines (passes, V layout) up to which the fused plans of every lower whole-number
/// limit are carried up the ladder, and the drain's backwards are split again.
pub(crate) const LADDER_MAX_ACTIONS: usize = 1200;

/// Whether some stage's fused backward is cheaper than its split one.
pub(crate) fn cheaper_somewhere(spec: &CostSpec) -> bool {
    spec.stages.iter().any(RankCost::fusing_saves)
}

/// One placement's best plan when some fused backward is cheaper (see the module), from its
/// split plan `split` (with each level's best when `ladder`) and the same search on
/// [`fused_as_input`] costs, `climb` (`record` each level or not). With `ladder`, the best
/// two fused plans of each whole level are carried up to the next, so more memory never
/// plans worse (and a runner-up that more room improves most is not lost); else the plan is
/// made at the limit only.
pub(crate) fn fused_plan(
    goal: &Goal,
    split: Climbed,
    ladder: bool,
    climb: impl Fn(&Goal, bool) -> Result<Climbed, Error>,
) -> Result<Schedule, Error> {
    let as_input = fused_as_input(goal.costs);
    let on_fused_costs = Goal {
        costs: &as_input,
        ..*goal
    };
    let best = |level: f64, bases: Vec<Schedule>, carried, fused_first: Vec<Schedule>| {
        best_with_fused(
            bases,
            carried,
            fused_first,
            &split.room(level),
            goal.costs,
            goal.objective,
        )
    };
    if !ladder {
        let fused_first = climb(&on_fused_costs, false).ok().map(|c| c.plan);
        let found = best(
            split.limit,
            vec![split.plan.clone()],
            Vec::new(),
            fused_first.into_iter().collect(),
        )?;
        return Ok(found
            .into_iter()
            .next()
            .unwrap_or_else(|| split.plan.clone()));
    }
    // The same climb on fused-as-input costs: plans ordered for B from the start.
    let fused_climb = climb(&on_fused_costs, true).ok();
    let no_levels = Levels::new();
    let fused_levels = fused_climb.as_ref().map_or(&no_levels, |c| &c.levels);
    let top = split.limit;
    let mut carried: Vec<Schedule> = Vec::new();
    for level in search::ladder(top) {
        let Some(s) = search::plan_at(&split.levels, level) else {
            continue;
        };
        let f = search::plan_at(fused_levels, level);
        // At the limit, each climb's plan too: under budgets it may come from the tightest
        // share's climb, not the levels'.
        let at_top = |c: &Climbed, level_plan: Option<&Schedule>| {
            (level >= top - 1e-9 && level_plan != Some(&c.plan)).then(|| c.plan.clone())
        };
        let own = at_top(&split, Some(s));
        let own_fused = fused_climb.as_ref().and_then(|c| at_top(c, f));
        // Every level is searched, even where the climbs' plans are those of the level below:
        // more room may let more backwards split, and skipping a level here but not in a
        // call whose limit it is would make the plans path dependent.
        let bases = std::iter::once(s.clone()).chain(own).collect();
        let fused_first = f.cloned().into_iter().chain(own_fused).collect();
        carried = best(level, bases, carried, fused_first)?;
    }
    Ok(carried
        .into_iter()
        .next()
        .unwrap_or_else(|| split.plan.clone()))
}

/// The best [`CARRIED`] distinct plans, best first, under `objective` on `spec` of the plans
/// `bases` (the first is the split plan at this level, the others compete as they
/// are), the plans `carried` from a lower limit, their fused variants, the plans
/// `fused_first` made on [`fused_as_input`] costs, and the placement's fixed pattern, that
/// fit within `room` per rank (or the first base's peak, if larger); the best few then with
/// backwards split where idle. Every plan has the same placement.
pub(crate) fn best_with_fused(
    bases: Vec<Schedule>,
    carried: Vec<Schedule>,
    fused_first: Vec<Schedule>,
    room: &[f64],
    spec: &CostSpec,
    objective: Objective,
) -> Result<Vec<Schedule>, Error> {
    let split = bases[0].clone();
    let costs = CostModel::for_schedule(spec, &split)?.with_objective(objective);
    let peak = simulate(&split, &costs)?.metrics.peak_memory;
    debug_assert_eq!(room.len(), peak.len(), "room for every rank");
    let allowed: Vec<f64> = room.iter().zip(&peak).map(|(a, b)| a.max(*b)).collect();
    let own = own_candidates(&bases, &fused_first, &costs, &allowed);
    let from_below = carried.iter().enumerate().flat_map(|(k, c)| {
        std::iter::once(c.clone())
            .chain(with_fused(c))
            .map(move |s| (Some(k), s))
    });
    let candidates = own.into_iter().map(|s| (None, s)).chain(from_below);
    let name = split.name.clone();
    let mut ranked = vec![Ranked {
        score: score(&split, &costs)?,
        carried: None,
        plan: split,
    }];
    for (carried, plan) in candidates {
        if weight_gradients_in_order(&plan) && fits_room(&plan, &costs, &allowed) {
            if let Ok(score) = score(&plan, &costs) {
                ranked.push(Ranked {
                    score,
                    carried,
                    plan,
                });
            }
        }
    }
    // The incumbent first among equals: a candidate must be strictly better to replace it.
    ranked.sort_by(|a, b| (a.score.0.total_cmp(&b.score.0)).then(a.score.1.total_cmp(&b.score.1)));
    // A plan both carried and this limit's own counts as its own (see the starts).
    ranked.dedup_by(|later, kept| {
        let same = later.plan.orders == kept.plan.orders;
        if same && later.carried.is_none() {
            kept.carried = None;
        }
        same
    });
    let mut found = vec![(ranked[0].score, ranked[0].plan.clone())];
    for start in local_search_starts(ranked, carried.len()) {
        found.push(split_where_idle(
            (start.score, start.plan),
            &costs,
            &allowed,
        ));
    }
    Ok(best_distinct(&found, CARRIED, &name))
}

/// A plan's variants with its backwards fused: where W directly follows I, and all.
fn with_fused(plan: &Schedule) -> [Schedule; 2] {
    [fuse_where_adjacent(plan), fuse_all(plan)]
}

/// A limit's own candidates for [`best_with_fused`]: the `bases` after the first (the
/// incumbent, ranked already), every base fused, the plans `fused_first` fused (and their
/// drains split again within `allowed`), and the placement's fixed pattern, which splits
/// some backwards and fuses the rest.
fn own_candidates(
    bases: &[Schedule],
    fused_first: &[Schedule],
    costs: &CostModel,
    allowed: &[f64],
) -> Vec<Schedule> {
    let mut own: Vec<Schedule> = bases[1..].to_vec();
    own.extend(bases.iter().flat_map(with_fused));
    own.extend(fused_then_split(fused_first, costs, allowed));
    let split = &bases[0];
    let (p, m) = (split.ranks, split.microbatches);
    let classic = if split.stages == p {
        one_f_one_b(p, m).map(|mut s| {
            s.placement = split.placement.clone();
            s
        })
    } else {
        dualpipe_v(p, m)
    };
    own.extend(classic.ok().filter(|s| s.placement == split.placement));
    own
}

/// Which of the `ranked` candidates (best first) the local search starts from: the best
/// [`SPLIT_STARTS`] overall, the best few of the limit's own plans, the best few of those
/// and the best carried plan's (the starts of a ladder that carried only its best plan),
/// and the best of each of the `carried` plans'. A plan carried from a lower limit can
/// score better than all of the limit's own, and its variants would otherwise take starts
/// the limit's own plans need; so carrying plans never makes the result worse than the
/// limit's own plans alone would, nor than a carried plan.
fn local_search_starts(ranked: Vec<Ranked>, carried: usize) -> impl Iterator<Item = Ranked> {
    let (mut own_seen, mut main_seen) = (0, 0);
    let mut carried_seen = vec![false; carried];
    ranked
        .into_iter()
        .enumerate()
        .filter_map(move |(nth, start)| {
            let is_own = start.carried.is_none();
            let is_main = start.carried.is_none_or(|k| k == 0);
            let first_of_carried = start
                .carried
                .is_some_and(|k| !std::mem::replace(&mut carried_seen[k], true));
            let take = nth < SPLIT_STARTS
                || (is_own && own_seen < SPLIT_STARTS)
                || (is_main && main_seen < SPLIT_STARTS)
                || first_of_carried;
            own_seen += usize::from(is_own);
            main_seen += usize::from(is_main);
            take.then_some(start)
        })
}

/// The best `count` distinct plans of `found`, best first, named `name`, picked with
/// `better`: a plan must beat one found before it by more than rounding.
fn best_distinct(found: &[(Score, Schedule)], count: usize, name: &str) -> Vec<Schedule> {
    let mut picked: Vec<Schedule> = Vec::with_capacity(count);
    while picked.len() < count {
        let fresh = found
            .iter()
            .filter(|(_, plan)| picked.iter().all(|p| p.orders != plan.orders));
        let Some((_, plan)) = fresh.reduce(|a, b| if better(b.0, a.0) { b } else { a }) else {
            break;
        };
        let mut plan = plan.clone();
        plan.name = name.to_string();
        picked.push(plan);
    }
    picked
}

/// A candidate of [`best_with_fused`]: its score, which of the plans carried from a lower
/// limit it is or comes from (`None`: the limit's own), and the plan.
struct Ranked {
    score: Score,
    carried: Option<usize>,
    plan: Schedule,
}

/// How many of a level's best plans are carried up to the next.
const CARRIED: usize = 2;

/// How many of the best plans (overall, and of the limit's own) [`split_where_idle`] starts
/// from (see [`local_search_starts`]).
const SPLIT_STARTS: usize = 8;

/// Whether each stage's weight gradients (its Bs and Ws) run in microbatch order, as 1F1B's
/// do: what keeps a fused plan's bits equal to 1F1B's.
pub(crate) fn weight_gradients_in_order(s: &Schedule) -> bool {
    let mut last = vec![None; s.stages];
    s.orders.iter().flatten().all(|a| {
        if !matches!(a.kind, Kind::B | Kind::W) {
            return true;
        }
        let ok = last[a.stage].is_none_or(|l| l < a.microbatch);
        last[a.stage] = Some(a.microbatch);
        ok
    })
}

/// Whether `s` holds no more than `allowed` on any rank.
fn fits_room(s: &Schedule, costs: &CostModel, allowed: &[f64]) -> bool {
    // Memory follows from each rank's order alone: no timing needed (the candidate's score
    // finds a deadlock).
    crate::validate::peak_memory(s, costs)
        .iter()
        .zip(allowed)
        .all(|(new, room)| *new <= room + 1e-9 * room.abs().max(1.0))
}

/// Simulations [`split_where_idle`] may run: up to 200, fewer on large pipelines (a
/// simulation's time grows with the passes).
fn split_evals(s: &Schedule) -> usize {
    let actions: usize = s.orders.iter().map(Vec::len).sum();
    (200_000 / actions.max(1)).min(200)
}

/// Local search over the fused backwards of `s`: each B split into its I, where the B stood
/// (the gradient leaves sooner), and its W a few passes later, where the rank would
/// otherwise wait; a split is kept when it improves the objective within `allowed`. A W
/// never passes a later backward of its stage, so each stage's weight gradients stay in
/// microbatch order.
fn split_where_idle(
    (mut best_sc, mut best): (Score, Schedule),
    costs: &CostModel,
    allowed: &[f64],
) -> (Score, Schedule) {
    let max_evals = split_evals(&best);
    let mut evals = 0;
    let mut improved = true;
    while improved && evals < max_evals {
        improved = false;
        for r in 0..best.ranks {
            let mut k = 0;
            while k < best.orders[r].len() && evals < max_evals {
                let b = best.orders[r][k];
                if b.kind != Kind::B {
                    k += 1;
                    continue;
                }
                // The W may go up to the next backward of the same stage.
                let order = &best.orders[r];
                let end = order[k + 1..]
                    .iter()
                    .position(|a| a.stage == b.stage && a.kind != Kind::F)
                    .map_or(order.len(), |q| k + 1 + q);
                let mut places = vec![k + 1, k + 2, k + 3, k + 5, k + 8, end];
                places.retain(|&t| t <= end);
                places.dedup();
                for to in places {
                    let mut candidate = best.clone();
                    candidate.orders[r][k] = Action::new(b.stage, Kind::I, b.microbatch);
                    candidate.orders[r].insert(to, Action::new(b.stage, Kind::W, b.microbatch));
                    evals += 1;
                    let Ok(sc) = score(&candidate, costs) else {
                        continue;
                    };
                    if better(sc, best_sc) && fits_room(&candidate, costs, allowed) {
                        (best_sc, best) = (sc, candidate);
                        improved = true;
                        break;
                    }
                }
                k += 1;
            }
        }
    }
    (best_sc, best)
}

/// A W's share of a fused backward when planning on [`fused_as_input`] costs: small enough
/// not to matter, positive as every time must be.
const W_SHARE: f64 = 1e-6;

/// The costs under which a split plan, once [`fuse_saving`] has fused it, runs as planned:
/// where fusing saves, I costs (nearly all of) B and W next to nothing, so the planner's
/// search orders F and B directly and where it put a W does not matter. The memory is
/// unchanged, and fusing only frees it sooner.
pub(crate) fn fused_as_input(spec: &CostSpec) -> CostSpec {
    let stages = spec
        .stages
        .iter()
        .map(|c| {
            if c.fusing_saves() {
                let b = c.fused_backward();
                RankCost {
                    i: b * (1.0 - W_SHARE),
                    w: b * W_SHARE,
                    b: None,
                    ..*c
                }
            } else {
                *c
            }
        })
        .collect();
    CostSpec {
        comm: spec.comm,
        stages,
    }
}

/// Every backward of the stages where fusing saves (under `costs`) run as a B where its I
/// stood, its W dropped; other stages keep theirs split.
pub(crate) fn fuse_saving(s: &Schedule, costs: &CostModel) -> Schedule {
    fuse_stages(s, |stage| costs.stages[stage].fusing_saves())
}

/// Every backward of the stages `fuse` picks run as a B where its I stood, its W dropped.
/// Nothing waits on a W, so no order can deadlock that did not before.
fn fuse_stages(s: &Schedule, fuse: impl Fn(usize) -> bool) -> Schedule {
    let orders = s
        .orders
        .iter()
        .map(|order| {
            order
                .iter()
                .filter(|a| !(a.kind == Kind::W && fuse(a.stage)))
                .map(|a| match a.kind {
                    Kind::I if fuse(a.stage) => Action::new(a.stage, Kind::B, a.microbatch),
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

/// From plans made on [`fused_as_input`] costs: each fused and, on pipelines of up to
/// [`LADDER_MAX_ACTIONS`] passes, also with the backwards of its last 1 to p + 1 microbatches
/// split again ([`split_tail`]), their Ws moved into idle time ([`fill_idle`]) within
/// `allowed` per rank.
fn fused_then_split(plans: &[Schedule], costs: &CostModel, allowed: &[f64]) -> Vec<Schedule> {
    let mut out = Vec::new();
    for plan in plans {
        let fused = fuse_saving(plan, costs);
        if 6 * plan.ranks * plan.microbatches <= LADDER_MAX_ACTIONS {
            for k in 1..=plan.microbatches.min(plan.ranks + 1) {
                out.extend(fill_idle(split_tail(&fused, k), costs, allowed));
            }
        }
        out.push(fused);
    }
    out
}

/// The fused plan `s` with the backwards of its last `k` microbatches split again, as in the
/// cooldown of a zero-bubble schedule: each I where the B stood (the gradient reaches the
/// rank before it sooner), the Ws at the end of the rank's order in the same order, for
/// [`fill_idle`] to move. Each stage's B and W stay in microbatch order.
fn split_tail(s: &Schedule, k: usize) -> Schedule {
    let first = s.microbatches.saturating_sub(k);
    let orders = s
        .orders
        .iter()
        .map(|order| {
            let mut out = Vec::with_capacity(order.len() + k);
            let mut tail = Vec::new();
            for a in order {
                if a.kind == Kind::B && a.microbatch >= first {
                    out.push(Action::new(a.stage, Kind::I, a.microbatch));
                    tail.push(Action::new(a.stage, Kind::W, a.microbatch));
                } else {
                    out.push(*a);
                }
            }
            out.extend(tail);
            out
        })
        .collect();
    Schedule {
        orders,
        ..s.clone()
    }
}

/// Moves each W that [`split_tail`] put at the end of its rank's order to the first point
/// after its I where the rank idles, keeping each move that does not worsen the objective
/// and fits `allowed` per rank. `None` when the schedule does not simulate.
fn fill_idle(mut s: Schedule, costs: &CostModel, allowed: &[f64]) -> Option<Schedule> {
    let mut best = score(&s, costs).ok()?;
    for r in 0..s.ranks {
        let Some(first_w) = s.orders[r].iter().position(|a| a.kind == Kind::W) else {
            continue;
        };
        for next_w in first_w..s.orders[r].len() {
            let w = s.orders[r][next_w];
            if w.kind != Kind::W {
                continue; // a pass after a split stage's own early W
            }
            let own_i = Action::new(w.stage, Kind::I, w.microbatch);
            let Some(own_i) = s.orders[r].iter().position(|a| *a == own_i) else {
                continue;
            };
            let sim = simulate(&s, costs).ok()?;
            // Not before the stage's previous weight gradient (microbatch order).
            let previous = s.orders[r][..next_w]
                .iter()
                .rposition(|a| a.stage == w.stage && a.kind == Kind::W)
                .unwrap_or(0);
            let slots = &sim.timeline[r];
            let from = own_i.max(previous) + 1;
            let idle = (from..next_w).find(|&q| slots[q].start > slots[q - 1].end + 1e-12);
            let Some(q) = idle else { continue };
            let mut moved = s.clone();
            let a = moved.orders[r].remove(next_w);
            moved.orders[r].insert(q, a);
            if let Ok(sc) = score(&moved, costs) {
                if !better(best, sc) && fits_room(&moved, costs, allowed) {
                    (s, best) = (moved, sc);
                }
            }
        }
    }
    Some(s)
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
    fuse_stages(s, |_| true)
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

    /// The search at `level` on `spec`, with or without `carried`, as the ladder runs it.
    fn search_at(goal: &Goal, level: f64, carried: Vec<Schedule>) -> Option<Vec<Schedule>> {
        use crate::generate::auto::zb_auto_climbed;
        let split = zb_auto_climbed(&goal.at(level), false).ok()?;
        let as_input = fused_as_input(goal.costs);
        let on_fused = Goal {
            costs: &as_input,
            ..goal.at(level)
        };
        let fused_first = zb_auto_climbed(&on_fused, false).ok()?.plan;
        let room = split.room(level);
        let (spec, objective) = (goal.costs, goal.objective);
        best_with_fused(
            vec![split.plan],
            carried,
            vec![fused_first],
            &room,
            spec,
            objective,
        )
        .ok()
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(64))]
        /// Carrying the plan of the limit below never makes a limit's plan worse than its own
        /// plans alone give, nor worse than the carried plan: the carried plan's variants
        /// compete but cannot take the local search's starts from the limit's own plans.
        #[test]
        fn a_carried_plan_never_makes_a_level_worse(
            p in 2usize..=5,
            extra in 0usize..8,
            stages in proptest::collection::vec(
                (0.5f64..2.0, 0.5f64..2.0, 0.5f64..2.0, 0.4f64..0.95, 0.5f64..1.5), 5),
            above in 1usize..=4,
            span in proptest::bool::ANY,
        ) {
            // Uneven stages, in time and memory: where carried plans crowd the starts most.
            let stages = stages[..p]
                .iter()
                .map(|&(f, i, w, share, mem_b)| RankCost {
                    f,
                    i,
                    w,
                    b: Some((i + w) * share),
                    mem_b,
                    mem_w: mem_b / 2.0,
                })
                .collect();
            let spec = CostSpec { comm: 0.0, stages };
            let objective = if span { Objective::Span } else { Objective::Makespan };
            let goal = Goal {
                ranks: p,
                microbatches: p + extra,
                costs: &spec,
                limit: 1.0,
                budget: &[],
                objective,
                name: "zb-auto",
            };
            let level = (1 + above.min(p)) as f64;
            let Some(carried) = search_at(&goal, level - 1.0, Vec::new()) else {
                return Ok(());
            };
            let with = search_at(&goal, level, carried.clone()).unwrap().remove(0);
            let without = search_at(&goal, level, Vec::new()).unwrap().remove(0);
            let scored = |s: &Schedule| {
                let costs = CostModel::for_schedule(&spec, s).unwrap().with_objective(objective);
                score(s, &costs).unwrap()
            };
            let (with, without) = (scored(&with), scored(&without));
            proptest::prop_assert!(!better(without, with), "{with:?} worse than {without:?} alone");
            for carried in carried.iter().map(scored) {
                proptest::prop_assert!(!better(carried, with), "{with:?} worse than carried {carried:?}");
            }
        }
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
        // Room 0 on every rank: no more than the split plan's own peak.
        let same = best_with_fused(
            vec![s.clone()],
            Vec::new(),
            Vec::new(),
            &[0.0; 4],
            &spec(None),
            Objective::Makespan,
        )
        .unwrap()
        .remove(0);
        assert_eq!(same, s);
        let b = 1.2;
        let fused = best_with_fused(
            vec![s.clone()],
            Vec::new(),
            Vec::new(),
            &[0.0; 4],
            &spec(Some(b)),
            Objective::Makespan,
        )
        .unwrap()
        .remove(0);
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
