//! V-shaped schedules: rank d holds stage d (chunk 0) and stage 2p−1−d (chunk 1), so a
//! microbatch goes down the ranks and comes back up, and the turn on the last rank is local.
//! Each chunk costs half of a rank's share (the one-rank's-share convention of
//! [`crate::cost`]).

use super::search::{
    apply_budget, better, capped_policies, fits, improve, ladder, needed_limit, on_floor,
    pick_best, policies, record, score, unlimited_floor, within_budgets, Climbed, LadderRuns,
    Levels, Score,
};
use super::Goal;
use crate::action::{Action, Kind};
use crate::cost::CostModel;
use crate::error::Error;
use crate::schedule::Schedule;

/// Stage → rank for the V: stages 0..p go down the ranks, p..2p come back up.
pub fn v_placement(p: usize) -> Vec<usize> {
    (0..2 * p)
        .map(|s| if s < p { s } else { 2 * p - 1 - s })
        .collect()
}

/// Builds one rank's list from phases over its two chunks, tracking the next microbatch of
/// each (chunk, pass) and queueing weight gradients in the order their I ran.
struct VBuilder {
    stages: [usize; 2],
    m: usize,
    next: [[usize; 3]; 2], // [chunk][F, I/B, W]
    pending_w: std::collections::VecDeque<usize>,
    order: Vec<Action>,
}

impl VBuilder {
    fn new(p: usize, rank: usize, m: usize) -> VBuilder {
        VBuilder {
            stages: [rank, 2 * p - 1 - rank],
            m,
            next: [[0; 3]; 2],
            pending_w: Default::default(),
            order: Vec::new(),
        }
    }
    /// Forward of the next microbatch on `chunk`; a no-op once all `m` ran (so the fixed
    /// phase counts work for small m without padding).
    fn f(&mut self, chunk: usize) {
        let j = self.next[chunk][0];
        if j < self.m {
            self.order.push(Action::new(self.stages[chunk], Kind::F, j));
            self.next[chunk][0] += 1;
        }
    }
    /// Input gradient (queueing its W) or, with `fused`, a full backward.
    fn b(&mut self, chunk: usize, fused: bool) {
        let j = self.next[chunk][1];
        if j < self.m && j < self.next[chunk][0] {
            let kind = if fused { Kind::B } else { Kind::I };
            self.order.push(Action::new(self.stages[chunk], kind, j));
            self.next[chunk][1] += 1;
            if fused {
                self.next[chunk][2] += 1;
            } else {
                self.pending_w.push_back(chunk);
            }
        }
    }
    /// The oldest pending weight gradient, if any.
    fn w(&mut self) {
        if let Some(chunk) = self.pending_w.pop_front() {
            let j = self.next[chunk][2];
            self.order.push(Action::new(self.stages[chunk], Kind::W, j));
            self.next[chunk][2] += 1;
        }
    }
    /// Whatever is left, in dependency-safe order: backwards (chunk 1 first), then W's.
    fn finish(mut self) -> Vec<Action> {
        while self.next[1][1] < self.m || self.next[0][1] < self.m {
            self.b(1, false);
            self.b(0, false);
        }
        while !self.pending_w.is_empty() {
            self.w();
        }
        self.order
    }
}

/// ZB-V as a fixed pattern (the shape PyTorch ships as ScheduleZBVZeroBubble): rank r warms
/// up with 2(p−r)−1 chunk-0 forwards, then r pairs of chunk-1/chunk-0 forwards, then p−r
/// rounds of F1 I1 W1; the steady state runs F0 I0 W0 F1 I1 W1; the cool-down drains
/// input gradients first and weight gradients last. Zero bubble when F = I = W, at 1F1B's
/// peak memory.
pub fn zb_v_pattern(p: usize, m: usize) -> Result<Schedule, Error> {
    let orders = (0..p)
        .map(|r| {
            let mut v = VBuilder::new(p, r, m);
            for _ in 0..2 * (p - r) - 1 {
                v.f(0);
            }
            for _ in 0..r {
                v.f(1);
                v.f(0);
            }
            for _ in 0..p - r {
                v.f(1);
                v.b(1, false);
                v.w();
            }
            while v.next[1][0] < m || v.next[0][0] < m {
                v.f(0);
                v.b(0, false);
                v.w();
                v.f(1);
                v.b(1, false);
                v.w();
            }
            for _ in 0..r {
                v.b(0, false);
                v.b(1, false);
            }
            for _ in 0..p - r {
                v.b(0, false);
                v.w();
            }
            v.finish()
        })
        .collect();
    Schedule::new("zb-v", 2 * p, p, m, v_placement(p), orders)
}

/// DualPipeV (DeepSeek): V placement, with a main phase of paired chunk-0 forward + chunk-1
/// backward and chunk-1 forward + chunk-0 backward (DeepSeek overlaps each pair's compute with
/// the other's communication; here a pair is two consecutive passes, costing their sum), and
/// split backwards in the warm-up and the second half of the cool-down. Needs m ≥ 2·ranks.
pub fn dualpipe_v(p: usize, m: usize) -> Result<Schedule, Error> {
    if m < 2 * p {
        return Err(Error::Input(format!(
            "dualpipe-v needs at least 2 × ranks = {} microbatches to fill both directions; got {m}",
            2 * p
        )));
    }
    let orders = (0..p)
        .map(|r| {
            let mut v = VBuilder::new(p, r, m);
            for _ in 0..2 * (p - r - 1) {
                v.f(0);
            }
            for _ in 0..r + 1 {
                v.f(0);
                v.f(1);
            }
            for _ in 0..p - r - 1 {
                v.b(1, false);
                v.w();
                v.f(1);
            }
            for _ in 0..m + r + 1 - 2 * p {
                v.f(0);
                v.b(1, true);
                v.f(1);
                v.b(0, true);
            }
            for _ in 0..p - r - 1 {
                v.b(1, true);
                v.f(1);
                v.b(0, true);
            }
            let half = r.div_ceil(2);
            let mut split = false;
            for i in 0..r + 1 {
                if i == half && r % 2 == 1 {
                    split = true;
                }
                v.b(1, !split);
                if i == half && r % 2 == 0 {
                    split = true;
                }
                v.b(0, !split);
            }
            for _ in 0..p - r - 1 {
                v.w();
                v.b(0, !split);
            }
            for _ in 0..r + 1 {
                v.w();
            }
            v.finish()
        })
        .collect();
    Schedule::new("dualpipe-v", 2 * p, p, m, v_placement(p), orders)
}

/// The best V schedule we find under `x` × M_B per rank (or per-rank byte budgets). Climbs
/// the memory [`ladder`](super::search::ladder) running the same steps at every level (so more
/// memory never gives a worse schedule): the ZB-V pattern when it fits, the authors' ZB-V
/// greedy ([`super::v_greedy`]; on large pipelines from p/2 × M_B up), their V-Half and
/// V-Min building blocks squeezed to the level ([`super::v_blocks`]), the list scheduler
/// under its three policies, the periodic schedules (see [`super::periodic`]) that fit, and
/// a local search over weight-gradient positions. Pipelines over
/// [`super::auto::LADDER_MAX_ACTIONS`] passes plan at the limit only: one policy, no ladder,
/// no local search.
pub fn v_auto(goal: &Goal) -> Result<Schedule, Error> {
    v_auto_climbed(goal, false, false).map(|c| c.plan)
}

/// [`v_auto`] with its climb (each level's best too when `record`; pipelines that skip the
/// ladder give the plan at the limit only). `at_linear_bytes`: at `goal.limit` × the
/// *linear* layout's M_B per rank, the same bytes a linear plan gets, for comparing the
/// placements; the ladder climbs multiples of the linear M_B (each rank's share is its linear
/// M_B over its V M_B), so more memory still never plans worse. Not with byte budgets.
pub(crate) fn v_auto_climbed(
    goal: &Goal,
    at_linear_bytes: bool,
    record: bool,
) -> Result<Climbed, Error> {
    let (p, m) = (goal.ranks, goal.microbatches);
    let placement = v_placement(p);
    let mut costs = v_costs(goal, at_linear_bytes)?;
    let x = apply_budget(&mut costs, &placement, m, goal.budget, goal.limit)?;
    let mut levels = Levels::new();
    let mut own = || v_auto_within(p, m, &costs, x, goal.name, record.then_some(&mut levels));
    let plan = if at_linear_bytes {
        // No extra plan under the tightest share here: its own ladder would not line up
        // with the multiples of `x`, and monotone in `x` is the promise.
        own()?
    } else {
        within_budgets(&costs, x, own, |tight| v_auto(&goal.at(tight)))?
    };
    Ok(Climbed::new(plan, x, levels, record, &costs, &placement, p))
}

/// The V layout's costs under `goal`; `at_linear_bytes`, with each rank's share set so that
/// a multiple of M_B means the linear layout's bytes.
fn v_costs(goal: &Goal, at_linear_bytes: bool) -> Result<CostModel, Error> {
    let p = goal.ranks;
    let mut costs = goal.resolve(2 * p)?;
    if at_linear_bytes {
        costs.rank_share = costs.shares_of_linear(&v_placement(p), &goal.resolve(p)?);
    }
    Ok(costs)
}

/// Why nothing was planned: no V schedule fits `x` × M_B.
fn no_v_fit(x: f64) -> Error {
    Error::setting(
        "mem_limit",
        format!("no V schedule fits {x} × M_B; the minimum is 1, use a limit of 1 or more"),
    )
}

/// What [`v_auto_within`] draws from: the ZB-V pattern and the periodic schedules, which do
/// not depend on the limit (scored once; each level takes the best that fits, the pattern
/// first so that it wins ties, as the handcrafted schedule should), and the greedy's and
/// the building blocks' ladders, which do.
struct VSources {
    pattern: Schedule,
    pattern_need: f64,
    pattern_score: Score,
    /// Each with its score and the limit it needs.
    periodic: Vec<(Schedule, Score, f64)>,
    greedy: super::v_greedy::GreedyLadder,
    blocks: super::v_blocks::BlockLadder,
}

impl VSources {
    fn new(
        p: usize,
        m: usize,
        costs: &CostModel,
        name: &str,
        placement: &[usize],
    ) -> Result<VSources, Error> {
        let pattern = zb_v_pattern(p, m)?;
        let pattern_need = needed_limit(&pattern, costs);
        let pattern_score = score(&pattern, costs)?;
        let blocks = super::v_blocks::BlockLadder::new(p, m, name, costs.rank_share.clone());
        let mut periodic = Vec::new();
        let fixed = super::periodic::candidates(name, placement, p, m, costs);
        for s in fixed.into_iter().chain(blocks.own()) {
            let need = needed_limit(&s, costs);
            if let Ok(sc) = score(&s, costs) {
                periodic.push((s, sc, need));
            }
        }
        Ok(VSources {
            pattern,
            pattern_need,
            pattern_score,
            periodic,
            greedy: super::v_greedy::GreedyLadder::default(),
            blocks,
        })
    }

    /// Large pipelines: the best of the candidates at the limit itself, no ladder (as
    /// `zb_auto`).
    fn best_at_limit(
        mut self,
        p: usize,
        m: usize,
        costs: &CostModel,
        x: f64,
        name: &str,
    ) -> Result<Schedule, Error> {
        let mut all: Vec<Schedule> = vec![self.pattern];
        all.extend(self.periodic.into_iter().map(|f| f.0));
        all.extend(self.greedy.at(p, m, costs, x));
        all.extend(self.blocks.at(x, name));
        let (mut best, _) = pick_best(all, costs, x)?.ok_or_else(|| no_v_fit(x))?;
        best.name = name.to_string();
        Ok(best)
    }

    /// The best at `level` of `found` (the runs of this level) and the fixed candidates that
    /// fit it.
    fn best_at_level(
        &self,
        found: Vec<Schedule>,
        costs: &CostModel,
        level: f64,
    ) -> Result<Option<(Schedule, Score)>, Error> {
        let pattern = (self.pattern.clone(), self.pattern_score);
        let mut level_best = fits(self.pattern_need, level).then_some(pattern);
        if let Some((s, sc)) = pick_best(found, costs, level)? {
            if level_best.as_ref().is_none_or(|b| better(sc, b.1)) {
                level_best = Some((s, sc));
            }
        }
        for (s, sc, need) in &self.periodic {
            if fits(*need, level) && level_best.as_ref().is_none_or(|b| better(*sc, b.1)) {
                level_best = Some((s.clone(), *sc));
            }
        }
        Ok(level_best)
    }
}

/// [`v_auto`] with the costs resolved (objective and rank shares set).
fn v_auto_within(
    p: usize,
    m: usize,
    costs: &CostModel,
    x: f64,
    name: &str,
    mut levels: Option<&mut Levels>,
) -> Result<Schedule, Error> {
    let placement = v_placement(p);
    let actions = 6 * p * m;
    // Large pipelines get one policy and no local search, to plan within a second.
    let (n_policies, improve_budget) = if actions <= 6000 {
        (3, (60_000 / actions).clamp(2, 200))
    } else {
        (1, 0)
    };
    let mut sources = VSources::new(p, m, costs, name, &placement)?;
    if actions > super::auto::LADDER_MAX_ACTIONS {
        return sources.best_at_limit(p, m, costs, x, name);
    }
    let static_need = (sources.periodic.iter().map(|f| f.2)).fold(sources.pattern_need, f64::max);
    let floor = unlimited_floor(&placement, m, costs);
    let mut best: Option<(Schedule, Score)> = None;
    let mut runs = LadderRuns::new(policies().into_iter().take(n_policies).collect());
    // The capped runs matter only under tight memory and cost a run each per level: small
    // pipelines only.
    let mut capped = LadderRuns::new(if actions <= 6000 {
        capped_policies(p)
    } else {
        Vec::new()
    });
    for level in ladder(x) {
        // Capped runs won only up to 3/4 of p·M_B on the grid tried; above, memory alone
        // admits what the caps would.
        let capped_here = level <= 0.75 * p as f64;
        let cached = runs.all_cached()
            && (capped.all_cached() || !capped_here)
            && sources.greedy.settled()
            && sources.blocks.settled();
        let rejected = std::cell::Cell::new(false);
        let mut changed = false;
        let mut found = runs.run(name, &placement, p, m, costs, level);
        if capped_here {
            found.extend(capped.run(name, &placement, p, m, costs, level));
        }
        // The greedy sizes its warm-up for about p·M_B; on large pipelines it is worth
        // its time only from half of that (a fixed set of levels, so the ladder stays
        // monotone).
        if actions <= 6000 || 2.0 * level >= p as f64 {
            found.extend(sources.greedy.at(p, m, costs, level));
        }
        found.extend(sources.blocks.at(level, name));
        if let Some((s, sc)) = sources.best_at_level(found, costs, level)? {
            let improved = if improve_budget > 0 {
                improve(s, sc, costs, level, improve_budget, &rejected)?
            } else {
                (s, sc)
            };
            if best.as_ref().is_none_or(|b| better(improved.1, b.1)) {
                best = Some(improved);
                changed = true;
            }
        }
        record(&mut levels, level, best.as_ref().map(|b| &b.0), name);
        // Stop where the rest of the ladder would change nothing (as in `zb_auto`): a fixed
        // point, or a best that meets both unlimited lower bounds.
        let settled = !changed && cached && !rejected.get() && level >= static_need;
        let optimal = on_floor(&best, floor);
        if settled || optimal {
            break;
        }
    }
    let (mut best, _) = best.ok_or_else(|| no_v_fit(x))?;
    best.name = name.to_string();
    Ok(best)
}
