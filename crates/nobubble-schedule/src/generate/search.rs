//! What every planner search shares: the objective's score, the memory ladder, candidate
//! picking under a limit, per-rank byte budgets, the W-move local search and the list
//! scheduler's runs along the ladder. `zb_auto` ([`super::auto`]) and `v_auto`
//! ([`super::v_shape`]) are built from these.

use super::greedy::{list_schedule_bound, Policy};
use crate::cost::{CostModel, CostSpec, Objective};
use crate::error::Error;
use crate::schedule::Schedule;
use crate::sim::{simulate, span_and_makespan};
use crate::validate::check_memory;
use std::cell::Cell;

/// What the searches minimize, primary first: (longest rank span, makespan), or the other
/// way round under [`Objective::Makespan`].
pub(crate) type Score = (f64, f64);

/// (span, makespan) in the order `objective` ranks them.
pub(crate) fn ranked(s: (f64, f64), objective: Objective) -> Score {
    match objective {
        Objective::Span => s,
        Objective::Makespan => (s.1, s.0),
    }
}

/// Objective of a simulated schedule (`costs.objective`); smaller is better.
pub(crate) fn score(schedule: &Schedule, costs: &CostModel) -> Result<Score, Error> {
    match span_and_makespan(schedule, costs) {
        Some(s) => Ok(ranked(s, costs.objective)),
        // Let the full simulator explain the failure.
        None => Err(simulate(schedule, costs)
            .err()
            .unwrap_or_else(|| Error::Input("schedule could not be scored".into()))),
    }
}

pub(crate) fn better(a: Score, b: Score) -> bool {
    const EPS: f64 = 1e-9;
    a.0 < b.0 - EPS * b.0.abs().max(1.0)
        || ((a.0 - b.0).abs() <= EPS * b.0.abs().max(1.0) && a.1 < b.1 - EPS * b.1.abs().max(1.0))
}

/// The best of `s` and its drain-phase repairs (see [`super::drain`]) that fit `x`.
pub(crate) fn repair_drain(s: (Schedule, Score), costs: &CostModel, x: f64) -> (Schedule, Score) {
    let mut best = s;
    // Every variant fits `x` (see `drain::variants`), so only its timing needs checking.
    for v in super::drain::variants(&best.0, costs, x) {
        // A reshaped order can deadlock when ranks disagree on where their last forwards
        // go (no score): such a variant is dropped.
        if let Some(sc) = span_and_makespan(&v, costs) {
            let sc = ranked(sc, costs.objective);
            if better(sc, best.1) {
                best = (v, sc);
            }
        }
    }
    best
}

/// `better` as an ordering, for `min_by` over scored candidates.
pub(crate) fn by_score(a: Score, b: Score) -> std::cmp::Ordering {
    if better(a, b) {
        std::cmp::Ordering::Less
    } else {
        std::cmp::Ordering::Greater
    }
}

/// `challenger` if it scores strictly better than `incumbent` under `objective` on `spec`
/// (each scored on its own layout), else `incumbent`.
pub(crate) fn better_of(
    incumbent: Schedule,
    challenger: Schedule,
    spec: &CostSpec,
    objective: Objective,
) -> Result<Schedule, Error> {
    let ranked = |s: &Schedule| -> Result<Score, Error> {
        score(
            s,
            &CostModel::for_schedule(spec, s)?.with_objective(objective),
        )
    };
    Ok(if better(ranked(&challenger)?, ranked(&incumbent)?) {
        challenger
    } else {
        incumbent
    })
}

/// Turns absolute per-rank memory budgets (one entry: every rank) into the ladder's top
/// multiple of M_B and each rank's share of it, set on `costs`; returns the multiple. With no
/// budget, `x` as given.
pub fn apply_budget(
    costs: &mut CostModel,
    placement: &[usize],
    m: usize,
    budget: &[f64],
    x: f64,
) -> Result<f64, Error> {
    if budget.is_empty() {
        return Ok(x);
    }
    let ranks = placement.iter().copied().max().map_or(0, |r| r + 1);
    if budget.len() != 1 && budget.len() != ranks {
        return Err(Error::setting(
            "mem_limit",
            format!(
                "lists {} budgets for {ranks} ranks: give one for all ranks or one per rank",
                budget.len()
            ),
        ));
    }
    let mut multiples = Vec::with_capacity(ranks);
    for r in 0..ranks {
        let mem_b: f64 = (0..placement.len())
            .filter(|&s| placement[s] == r)
            .map(|s| costs.stages[s].mem_b)
            .sum();
        let bytes = budget[r.min(budget.len() - 1)];
        // A rank never holds more than all m microbatches.
        let k = if mem_b > 0.0 {
            (bytes / mem_b).min(m as f64)
        } else {
            m as f64
        };
        if k < 1.0 - 1e-9 {
            return Err(Error::setting(
                "mem_limit",
                format!(
                    "rank {r}'s budget {} is below one microbatch's activations there ({}); \
                     every rank must hold at least one: raise its budget",
                    crate::limit::show_bytes(bytes.round()),
                    crate::limit::show_bytes(mem_b.round())
                ),
            ));
        }
        multiples.push(k);
    }
    let top = multiples.iter().copied().fold(0.0, f64::max);
    costs.rank_share = multiples.iter().map(|k| k / top).collect();
    Ok(top)
}

/// Whether a schedule needing `need` × M_B fits limit `level` (`check_memory`'s tolerance).
pub(crate) fn fits(need: f64, level: f64) -> bool {
    need <= level * (1.0 + 1e-9)
}

/// The proven bounds with no memory limit, (longest span, makespan): a schedule on both
/// cannot be beaten at any limit, so a memory ladder that reaches one may stop.
pub(crate) fn unlimited_floor(placement: &[usize], m: usize, costs: &CostModel) -> Score {
    (
        crate::bound::span_lower_bound(placement, m, costs, None),
        crate::bound::lower_bound(placement, m, costs, None),
    )
}

/// Whether `best` sits on `floor` (see [`unlimited_floor`]).
pub(crate) fn on_floor(best: &Option<(Schedule, Score)>, floor: Score) -> bool {
    best.as_ref()
        .is_some_and(|b| b.1 .0 <= floor.0 * (1.0 + 1e-12) && b.1 .1 <= floor.1 * (1.0 + 1e-12))
}

/// The list-scheduler policies every ladder level tries: W only in gaps it fits, W in any
/// idle time, and forwards allowed to delay a backward with some W overshoot.
pub(crate) fn policies() -> Vec<Policy> {
    let base = Policy::default();
    vec![
        base,
        Policy {
            w_overshoot: 1e9,
            ..base
        },
        Policy {
            forward_may_delay_backward: true,
            w_overshoot: 0.5,
            ..base
        },
    ]
}

/// [`policies`] with first-stage in-flight caps, for V placements under tight memory: the
/// policies that keep W within its wait, with caps from p/2 to 5p/4 microbatches, flat or falling by half a microbatch per
/// rank. Memory alone admits first-chunk forwards until a rank is full; at limits between
/// the fixed V constructions (V-Min, V-Half) the later chunks then wait for room, and a
/// 1F1B-like warm-up depth keeps the pipeline flowing instead.
pub(crate) fn capped_policies(p: usize) -> Vec<Policy> {
    let mut caps: Vec<usize> = (4..=10).map(|k| (k * p).div_ceil(8).max(1)).collect();
    caps.dedup();
    let mut out = Vec::new();
    // The policy that lets W overshoot any wait won 2 of 72 cells of the grid tried (p 4, 8;
    // m p to 3p; three cost models; four limits): left out to halve the time.
    for base in policies().into_iter().filter(|b| b.w_overshoot < 1.0) {
        for &cap in &caps {
            for cap_slope in [0, 1] {
                out.push(Policy {
                    in_flight_cap: Some(cap),
                    cap_slope,
                    ..base
                });
            }
        }
    }
    out
}

/// Keeps the best of `candidates` that fit the memory limit.
pub(crate) fn pick_best(
    candidates: impl IntoIterator<Item = Schedule>,
    costs: &CostModel,
    x: f64,
) -> Result<Option<(Schedule, Score)>, Error> {
    let mut best: Option<(Schedule, Score)> = None;
    for s in candidates {
        if check_memory(&s, costs, x).is_err() {
            continue;
        }
        // A candidate that cannot run (a generator's bug) costs only itself.
        let Ok(sc) = score(&s, costs) else {
            debug_assert!(false, "candidate {} deadlocks", s.name);
            continue;
        };
        if best.as_ref().is_none_or(|(_, b)| better(sc, *b)) {
            best = Some((s, sc));
        }
    }
    Ok(best)
}

/// Local search: move single weight-gradient passes to other positions on their rank,
/// keeping every move that improves the objective and fits the memory limit, until a full
/// sweep finds nothing or `max_evals` simulations have run.
///
/// A W depends only on its own I on the same rank and nothing waits for it, so a move is
/// valid as long as the W stays after its I. Moves past another W of the same stage are
/// skipped: the generators restore each stage's W order afterwards, which would undo them.
pub(crate) fn improve(
    mut best: Schedule,
    mut best_score: Score,
    costs: &CostModel,
    x: f64,
    max_evals: usize,
    rejected: &Cell<bool>,
) -> Result<(Schedule, Score), Error> {
    let mut evals = 0;
    loop {
        let mut improved = false;
        for r in 0..best.ranks {
            let len = best.orders[r].len();
            let mut k = 0;
            while k < len {
                let w = best.orders[r][k];
                if w.kind != crate::Kind::W {
                    k += 1;
                    continue;
                }
                // Try moving this W one or several places later or earlier.
                for delta in [1isize, -1, 2, -2, 4, -4] {
                    let to = k as isize + delta;
                    if to < 0 || to >= len as isize {
                        continue;
                    }
                    let to = to as usize;
                    let passed = if to > k {
                        &best.orders[r][k + 1..=to]
                    } else {
                        &best.orders[r][to..k]
                    };
                    let blocked = passed.iter().any(|a| {
                        a.stage == w.stage
                            && (a.kind == crate::Kind::W
                                || (to < k
                                    && a.kind == crate::Kind::I
                                    && a.microbatch == w.microbatch))
                    });
                    if blocked {
                        continue;
                    }
                    let a = best.orders[r].remove(k);
                    best.orders[r].insert(to, a);
                    let mut kept = false;
                    let fits = check_memory(&best, costs, x).is_ok();
                    rejected.set(rejected.get() || !fits);
                    if fits {
                        evals += 1;
                        if let Ok(sc) = score(&best, costs) {
                            if better(sc, best_score) {
                                best_score = sc;
                                improved = true;
                                kept = true;
                            }
                        }
                    }
                    if kept {
                        break;
                    }
                    let a = best.orders[r].remove(to);
                    best.orders[r].insert(k, a);
                    if evals >= max_evals {
                        return Ok((best, best_score));
                    }
                }
                k += 1;
            }
        }
        if !improved {
            return Ok((best, best_score));
        }
    }
}

/// The list scheduler's runs along a memory ladder, one per policy, remembering each
/// policy's schedule once the limit stopped binding (every larger limit gives the same).
pub(crate) struct LadderRuns {
    policies: Vec<Policy>,
    unbound: Vec<Option<Schedule>>,
}

impl LadderRuns {
    pub(crate) fn new(policies: Vec<Policy>) -> Self {
        LadderRuns {
            unbound: vec![None; policies.len()],
            policies,
        }
    }

    /// Whether every policy's run has stopped depending on the limit.
    pub(crate) fn all_cached(&self) -> bool {
        self.unbound.iter().all(Option::is_some)
    }

    /// Every policy's schedule at `level` (failed runs left out).
    pub(crate) fn run(
        &mut self,
        name: &str,
        placement: &[usize],
        p: usize,
        m: usize,
        costs: &CostModel,
        level: f64,
    ) -> Vec<Schedule> {
        let mut out = Vec::new();
        for (k, pol) in self.policies.iter().enumerate() {
            if let Some(s) = &self.unbound[k] {
                out.push(s.clone());
            } else if let Ok((s, bound)) =
                list_schedule_bound(name, placement, p, m, costs, level, pol)
            {
                if !bound {
                    self.unbound[k] = Some(s.clone());
                }
                out.push(s);
            }
        }
        out
    }
}

/// A ladder climb's best after each of its levels, in climbing order: the plan the same
/// search would return with that level as its limit (a climb that stops early has settled:
/// the levels above it would return its last plan). For callers that need every level's
/// plan, in one climb rather than one per level.
pub(crate) type Levels = Vec<(f64, Schedule)>;

/// A placement's plan with what its climb saw, for searches that build on every level (the
/// fused-backward search in [`super::fuse`]).
pub(crate) struct Climbed {
    /// The plan at the limit (under budgets the better of the shares' and the tightest
    /// share's plan, as [`within_budgets`] picks).
    pub plan: Schedule,
    /// The top of the ladder: the limit, or under budgets the largest rank's multiple.
    pub limit: f64,
    /// Each level's best, when asked for; else empty.
    pub levels: Levels,
    /// What one level (1 × M_B) means on each rank, its share applied: a plan at `level`
    /// may hold `level` × this.
    pub level_bytes: Vec<f64>,
}

impl Climbed {
    /// A climb's result on `placement` under `costs`; with `record`, a climb that skipped
    /// the ladder gives its plan as the only level.
    pub fn new(
        plan: Schedule,
        limit: f64,
        mut levels: Levels,
        record: bool,
        costs: &CostModel,
        placement: &[usize],
        ranks: usize,
    ) -> Self {
        if record && levels.is_empty() {
            levels.push((limit, plan.clone()));
        }
        Climbed {
            plan,
            limit,
            levels,
            level_bytes: (0..ranks)
                .map(|r| costs.placed_limit(placement, r, 1.0))
                .collect(),
        }
    }

    /// What each rank may hold at `level`.
    pub fn room(&self, level: f64) -> Vec<f64> {
        self.level_bytes.iter().map(|b| level * b).collect()
    }
}

/// The climb's plan at `level`: its best after the highest climbed level not above it.
pub(crate) fn plan_at(levels: &Levels, level: f64) -> Option<&Schedule> {
    levels
        .iter()
        .rev()
        .find(|(l, _)| *l <= level * (1.0 + 1e-12))
        .map(|(_, s)| s)
}

/// Records `best` (named `name`) as the climb's plan at `level`, when the caller asked.
pub(crate) fn record(
    levels: &mut Option<&mut Levels>,
    level: f64,
    best: Option<&Schedule>,
    name: &str,
) {
    if let (Some(levels), Some(best)) = (levels.as_deref_mut(), best) {
        let mut s = best.clone();
        s.name = name.to_string();
        levels.push((level, s));
    }
}

/// The smallest limit (× each rank's M_B) a schedule fits in.
pub(crate) fn needed_limit(s: &Schedule, costs: &CostModel) -> f64 {
    let peaks = crate::validate::peak_memory(s, costs);
    (0..s.ranks)
        .map(|r| peaks[r] / (costs.rank_mem_b(s, r) * costs.share(r)).max(f64::MIN_POSITIVE))
        .fold(0.0, f64::max)
}

/// The memory levels a ladder search visits: every whole multiple of M_B up to `x`, then
/// `x`. Keeping the best schedule found at any level makes the result non-increasing in
/// the limit (over whole-number limits), because a schedule that fits a smaller limit fits
/// every larger one.
pub(crate) fn ladder(x: f64) -> Vec<f64> {
    let mut levels: Vec<f64> = (1..=(x + 1e-9).floor() as usize)
        .map(|k| k as f64)
        .collect();
    if levels.last().is_none_or(|&l| (l - x).abs() > 1e-9) {
        levels.push(x);
    }
    levels
}

/// A search under per-rank budgets (`costs.rank_share` set by [`apply_budget`], top
/// multiple `x`): `own` plans with the shares; when a share is below 1, `shared(tight)` also
/// plans every rank at the tightest rank's multiple (which fits every budget, since
/// [`apply_budget`] refuses a rank below one microbatch), and the better is kept (`own` on
/// a tie), so budgets never plan worse than one multiple for all.
pub(crate) fn within_budgets(
    costs: &CostModel,
    x: f64,
    own: impl FnOnce() -> Result<Schedule, Error>,
    shared: impl FnOnce(f64) -> Result<Schedule, Error>,
) -> Result<Schedule, Error> {
    let tightest = costs.rank_share.iter().copied().fold(1.0, f64::min);
    if tightest >= 1.0 - 1e-12 {
        return own();
    }
    let (a, b) = (own()?, shared(x * tightest)?);
    Ok(match (score(&a, costs), score(&b, costs)) {
        (Ok(sa), Ok(sb)) if better(sb, sa) => b,
        (Err(_), Ok(_)) => b,
        _ => a,
    })
}
