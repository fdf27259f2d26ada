//! `zb-auto`: the best schedule we can find under a memory limit, with real costs.
//!
//! Candidates come from the list scheduler ([`super::greedy`]) under every combination of
//! its policies, and from the handcrafted schedules that fit the limit; the best by the
//! simulator is then improved by local search (moving weight gradients). The objective is
//! the costs' [`Objective`]: the paper's longest per-rank span then the makespan, or the
//! other way round.

use super::greedy::{list_schedule_bound, Policy};
use super::paper_heuristic;
pub use super::search::apply_budget;
use super::search::{
    better, by_score, fits, improve, ladder, needed_limit, on_floor, pick_best, policies, record,
    repair_drain, score, unlimited_floor, within_budgets, Climbed, LadderRuns, Levels, Score,
};
use super::Goal;
use crate::cost::CostModel;
use crate::error::Error;
use crate::schedule::Schedule;
use crate::validate::check_memory;
use std::cell::Cell;

/// How many whole levels below the free point's memory the search cuts it down to fit.
const FIT_LEVELS: f64 = 6.0;

/// `zb-auto` on a linear placement (stage s on rank s) with memory limit `x` × M_B.
///
/// Climbs the memory [`ladder`], running the same steps at every level — so the result at a
/// whole-number limit never depends on the limit asked for, and more memory never gives a
/// worse schedule: the handcrafted schedules and (on small pipelines) the list scheduler
/// under three policies at that level; the best point of a fixed grid over the ZB-H family
/// that fits; coordinate descent from the best parameters so far; near the memory the best
/// unconstrained points need, those points cut down to fit; and a local search over
/// weight-gradient positions. Each new best also gets the drain-phase repair
/// ([`super::drain`]). Pipelines over [`LADDER_MAX_ACTIONS`] passes skip the ladder and plan
/// at the limit only (the paper's greedy and the handcrafted schedules, repaired).
pub fn zb_auto(goal: &Goal) -> Result<Schedule, Error> {
    zb_auto_climbed(goal, false).map(|c| c.plan)
}

/// Largest pipeline (passes per iteration) the memory ladder searches. Above it the ladder's
/// extra candidates have not beaten the paper's greedy on any pipeline we measured (p = 32,
/// m = 256; p = 64, m = 512: the same schedule), while costing seconds to minutes, so large
/// pipelines plan at the limit only (see [`zb_auto`]).
pub const LADDER_MAX_ACTIONS: usize = 20_000;

/// [`zb_auto`]'s plan with its climb: each level's best too when `record` (pipelines that
/// skip the ladder give the plan at the limit only).
pub(crate) fn zb_auto_climbed(goal: &Goal, record: bool) -> Result<Climbed, Error> {
    let (p, m) = (goal.ranks, goal.microbatches);
    let placement: Vec<usize> = (0..p).collect();
    let mut costs = goal.resolve(p)?;
    let x = apply_budget(&mut costs, &placement, m, goal.budget, goal.limit)?;
    let mut levels = Levels::new();
    let plan = within_budgets(
        &costs,
        x,
        || zb_auto_within(p, m, &costs, x, goal.name, record.then_some(&mut levels)),
        |tight| zb_auto(&goal.at(tight)),
    )?;
    Ok(Climbed::new(plan, x, levels, record, &costs, &placement, p))
}

/// [`zb_auto`] with the costs resolved (objective and rank shares set); each level's best
/// recorded in `levels` when given.
fn zb_auto_within(
    p: usize,
    m: usize,
    costs: &CostModel,
    x: f64,
    name: &str,
    mut levels: Option<&mut Levels>,
) -> Result<Schedule, Error> {
    if 3 * p * m > LADDER_MAX_ACTIONS {
        return at_the_limit(p, m, costs, x, name);
    }
    let mut climb = Climb::new(p, m, costs, name)?;
    for level in ladder(x) {
        let stop = climb.step(level)?;
        record(&mut levels, level, climb.best.as_ref().map(|b| &b.0), name);
        if stop {
            break;
        }
    }
    let (mut best, _) = climb.best.ok_or_else(|| no_fit(x))?;
    best.name = name.to_string();
    Ok(best)
}

/// Pipelines (passes) up to which the list scheduler joins the candidates at every level:
/// on linear placements it rarely beats the family search, and is worth its time only on
/// small pipelines.
const LIST_MAX_ACTIONS: usize = 1500;

/// `candidate` replaces `best` if it scores better (or `best` is empty).
fn offer(best: &mut Option<(Schedule, Score)>, candidate: Schedule, sc: Score) {
    if best.as_ref().is_none_or(|b| better(sc, b.1)) {
        *best = Some((candidate, sc));
    }
}

/// The ladder climb of [`zb_auto_within`]: what carries from one memory level to the next.
struct Climb<'a> {
    p: usize,
    /// Stage s on rank s.
    placement: Vec<usize>,
    m: usize,
    costs: &'a CostModel,
    name: &'a str,
    search: TemplateSearch<'a>,
    /// The family grid: parameters, score, memory needed, whether the warm-up overshoots.
    grid: Vec<(TemplateParams, Score, f64, bool)>,
    /// The best family points when memory is no object, with the memory they need.
    frees: Vec<(TemplateParams, f64)>,
    /// ZB-H1 and ZB-H2 (they do not depend on the limit), scored once.
    handcrafted: Vec<(Schedule, Score, f64)>,
    descent_budget: usize,
    fit_budget: usize,
    improve_budget: usize,
    best: Option<(Schedule, Score)>,
    /// The family parameters the descent goes on from.
    params: Option<(TemplateParams, Score)>,
    /// The paper's scheduler's result once memory stopped binding it.
    paper_free: Option<(Schedule, Score)>,
    unbound: LadderRuns,
    /// [`linear_tight_policies`] on pipelines too large for `unbound`.
    capped: LadderRuns,
    /// Nothing can beat a schedule on both unlimited lower bounds.
    floor: Score,
    /// Above this, every fixed candidate (handcrafted, family grid, cut-down points) fits.
    static_need: f64,
}

impl<'a> Climb<'a> {
    fn new(p: usize, m: usize, costs: &'a CostModel, name: &'a str) -> Result<Self, Error> {
        let actions = 3 * p * m;
        let search = TemplateSearch {
            p,
            m,
            costs,
            name,
            rejected: Cell::new(false),
        };
        let grid = search.grid();
        let descent_budget = (100_000 / actions).clamp(4, 300);
        // The best family point when memory is no object (one from each natural warm-up),
        // polished once; every level also tries it cut down to fit (the same steps at every
        // level, so the ladder stays monotone).
        let frees: Vec<(TemplateParams, f64)> = [false, true]
            .into_iter()
            .filter_map(|overshot| {
                let (t, sc, _, _) = grid
                    .iter()
                    .filter(|g| g.3 == overshot)
                    .min_by(|a, b| by_score(a.1, b.1))?;
                let t = search
                    .descend(t.clone(), *sc, m as f64, 4 * descent_budget)
                    .0;
                let need = needed_limit(&search.build(&t).ok()?, costs);
                Some((t, need))
            })
            .collect();
        let improve_budget = (30_000 / actions).clamp(2, 100);
        let mut handcrafted = Vec::new();
        for s in [super::zb_h1(p, m)?, super::zb_h2(p, m)?] {
            let need = needed_limit(&s, costs);
            let sc = score(&s, costs)?;
            handcrafted.push((s, sc, need));
        }
        let placement: Vec<usize> = (0..p).collect();
        let static_need = (handcrafted.iter().map(|h| h.2))
            .chain(grid.iter().map(|g| g.2))
            .chain(frees.iter().map(|f| f.1))
            .fold(0.0, f64::max);
        Ok(Climb {
            p,
            floor: unlimited_floor(&placement, m, costs),
            placement,
            m,
            costs,
            name,
            search,
            grid,
            frees,
            handcrafted,
            descent_budget,
            fit_budget: (1_000_000 / actions).clamp(20, 150),
            improve_budget: if actions <= 6000 { improve_budget } else { 0 },
            best: None,
            params: None,
            paper_free: None,
            unbound: LadderRuns::new(policies()),
            capped: LadderRuns::new(linear_tight_policies(p)),
            static_need,
        })
    }

    fn actions(&self) -> usize {
        3 * self.p * self.m
    }

    /// One level of the climb; true when the climb can stop (a fixed point, or optimal).
    fn step(&mut self, level: f64) -> Result<bool, Error> {
        self.search.rejected.set(false);
        let params_before = self.params.clone();
        let paper_was_free = self.paper_free.is_some();
        let mut level_best = self.list_candidates(level)?;
        self.offer_fixed(level, &mut level_best)?;
        self.offer_family(level, &mut level_best)?;
        let mut settled = true;
        if let Some((s, sc)) = level_best {
            let improved = if self.improve_budget > 0 {
                let rejected = &self.search.rejected;
                improve(s, sc, self.costs, level, self.improve_budget, rejected)?
            } else {
                (s, sc)
            };
            if self.best.as_ref().is_none_or(|b| better(improved.1, b.1)) {
                // A new best: try reshaping its drain phase (see `drain`).
                self.best = Some(repair_drain(improved, self.costs, level));
                settled = false;
            }
        }
        // A level where nothing turned on the limit and nothing changed is a fixed point:
        // every larger level would compute exactly the same, so the ladder can stop here
        // with the very result it would reach at the top.
        let settled = settled
            && !self.search.rejected.get()
            && self.params == params_before
            && level >= self.static_need
            && (self.actions() > LIST_MAX_ACTIONS || self.unbound.all_cached())
            && paper_was_free;
        Ok(settled || on_floor(&self.best, self.floor))
    }

    /// The list scheduler's best at `level`: under every policy on small pipelines, and on
    /// large ones under [`linear_tight_policies`] at limits under p (where the handcrafted
    /// schedules do not fit and the paper's greedy is short of warm-up) or where no fixed
    /// candidate fits.
    fn list_candidates(&mut self, level: f64) -> Result<Option<(Schedule, Score)>, Error> {
        let (p, m, costs, name) = (self.p, self.m, self.costs, self.name);
        let placement = &self.placement;
        let runs = if self.actions() <= LIST_MAX_ACTIONS {
            self.unbound.run(name, placement, p, m, costs, level)
        } else if level < p as f64 || self.nothing_fixed_fits(level) {
            self.capped.run(name, placement, p, m, costs, level)
        } else {
            Vec::new()
        };
        pick_best(runs, costs, level)
    }

    /// Whether no handcrafted schedule and no family point fits `level`.
    fn nothing_fixed_fits(&self, level: f64) -> bool {
        self.handcrafted
            .iter()
            .all(|(_, _, need)| !fits(*need, level))
            && self.grid.iter().all(|g| !fits(g.2, level))
    }

    /// The handcrafted schedules that fit, and the paper's own scheduler at this level (so
    /// zb-auto is never worse than it; once memory stops binding it, every larger level
    /// gives the same schedule).
    fn offer_fixed(
        &mut self,
        level: f64,
        best: &mut Option<(Schedule, Score)>,
    ) -> Result<(), Error> {
        for (s, sc, need) in &self.handcrafted {
            if fits(*need, level) {
                offer(best, s.clone(), *sc);
            }
        }
        if let Some((s, sc)) = &self.paper_free {
            offer(best, s.clone(), *sc);
        } else if let Ok((s, bound)) =
            paper_heuristic::zb_paper(self.p, self.m, self.costs, level, self.name)
        {
            let sc = score(&s, self.costs)?;
            if !bound {
                self.paper_free = Some((s.clone(), sc));
            }
            offer(best, s, sc);
        }
        Ok(())
    }

    /// The ZB-H family: the best grid point that fits, coordinate descent from the best
    /// parameters so far, and, at levels just below what a free point needs, that point cut
    /// down to fit and polished (a candidate of its own: the main chain goes on unchanged).
    fn offer_family(
        &mut self,
        level: f64,
        best: &mut Option<(Schedule, Score)>,
    ) -> Result<(), Error> {
        let search = &self.search;
        let fitting = (self.grid.iter())
            .filter(|g| fits(g.2, level))
            .min_by(|a, b| by_score(a.1, b.1));
        if let Some((t, sc, _, _)) = fitting {
            if self.params.as_ref().is_none_or(|(_, ps)| better(*sc, *ps)) {
                self.params = Some((t.clone(), *sc));
            }
        }
        if let Some((t, sc)) = self.params.take() {
            let (t, sc) = search.descend(t, sc, level, self.descent_budget);
            if best.as_ref().is_none_or(|b| better(sc, b.1)) {
                *best = Some((search.build(&t)?, sc));
            }
            self.params = Some((t, sc));
        }
        for (f, need) in &self.frees {
            if level >= *need || level + FIT_LEVELS < *need {
                continue;
            }
            let Some(t) = search.fit(f.clone(), level) else {
                continue;
            };
            if let Some(sc) = search.eval(&t, level) {
                let (t, sc) = search.descend(t, sc, level, self.fit_budget);
                if best.as_ref().is_none_or(|b| better(sc, b.1)) {
                    *best = Some((search.build(&t)?, sc));
                }
            }
        }
        Ok(())
    }
}

/// `zb_auto` on a large pipeline: the best of ZB-H1 and ZB-H2 where they fit, the paper's
/// greedy (all its knob settings, the official code's included) and the list scheduler
/// ([`linear_tight_policies`]) at the limit itself, with the drain-phase repair — linear time
/// in p·m per candidate. No ladder: more memory gives a schedule at least as good as the
/// handcrafted ones that fit and the official greedy at that limit, not necessarily one at
/// least as good as at a smaller limit.
fn at_the_limit(
    p: usize,
    m: usize,
    costs: &CostModel,
    x: f64,
    name: &str,
) -> Result<Schedule, Error> {
    let mut candidates = vec![super::zb_h1(p, m)?, super::zb_h2(p, m)?];
    if let Ok((s, _)) = paper_heuristic::zb_paper(p, m, costs, x, name) {
        candidates.push(s);
    }
    let mut found = pick_best(candidates, costs, x)?;
    // Under p (or where nothing above fits: the list scheduler plans within any limit). Above
    // it they do not beat the rest and would cost seconds on the largest pipelines.
    if x < p as f64 || found.is_none() {
        let linear: Vec<usize> = (0..p).collect();
        let runs: Vec<Schedule> = linear_tight_policies(p)
            .iter()
            .filter_map(|pol| list_schedule_bound(name, &linear, p, m, costs, x, pol).ok())
            .map(|(s, _)| s)
            .collect();
        if let Some((s, sc)) = pick_best(runs, costs, x)? {
            offer(&mut found, s, sc);
        }
    }
    let (mut best, _) = found
        .map(|b| repair_drain(b, costs, x))
        .ok_or_else(|| no_fit(x))?;
    best.name = name.to_string();
    Ok(best)
}

/// The list scheduler's policies for large linear pipelines under limits below p, where the
/// handcrafted schedules do not fit and the paper's greedy, starved of warm-up, can run
/// several times its lower bound (p 32, m 256, 20 × M_B: 7982 against a bound of 1012):
/// memory alone deciding the warm-up, and 1F1B's warm-up depth (p − r microbatches in
/// flight on rank r, within the limit). With them zb-auto plans 7.5% above the bound there.
fn linear_tight_policies(p: usize) -> Vec<Policy> {
    vec![
        Policy::default(),
        Policy {
            in_flight_cap: Some(p),
            cap_slope: 2,
            ..Policy::default()
        },
    ]
}

/// Why nothing was planned: no schedule fits `x` × M_B.
fn no_fit(x: f64) -> Error {
    Error::setting(
        "mem_limit",
        format!(
            "no schedule fits {x} × M_B; raise the limit (every rank must hold at least one \
             microbatch's activations)"
        ),
    )
}

/// A point of the ZB-H family (see [`super::zb_template`]).
#[derive(Clone, Debug, PartialEq)]
struct TemplateParams {
    warm: Vec<usize>,
    lag: Vec<usize>,
    delay: usize,
}

struct TemplateSearch<'a> {
    p: usize,
    m: usize,
    costs: &'a CostModel,
    name: &'a str,
    /// Set when a point was turned down for memory: the search then depended on the limit.
    rejected: Cell<bool>,
}

impl TemplateSearch<'_> {
    fn build(&self, t: &TemplateParams) -> Result<Schedule, Error> {
        super::zb_template(self.p, self.m, &t.warm, &t.lag, t.delay, self.name)
    }

    fn eval(&self, t: &TemplateParams, x: f64) -> Option<Score> {
        let s = self.build(t).ok()?;
        if check_memory(&s, self.costs, x).is_err() {
            self.rejected.set(true);
            return None;
        }
        score(&s, self.costs).ok()
    }

    /// The schedule's score and the smallest limit it fits in.
    fn eval_any(&self, t: &TemplateParams) -> Option<(Score, f64)> {
        let s = self.build(t).ok()?;
        let need = needed_limit(&s, self.costs);
        Some((score(&s, self.costs).ok()?, need))
    }

    /// Every point of a grid over a three-parameter shape — warm-up = natural + γ, lag =
    /// α·s + β, for a few lag delays — with its score and the memory it needs. The natural
    /// warm-up comes in two versions: forwards that end before the first input gradient can
    /// arrive, and (the paper's "one forward may overshoot" knob) also one that overruns it
    /// by at most a tenth of a forward. The grid does not depend on the limit, so each level
    /// just picks the best point that fits.
    fn grid(&self) -> Vec<(TemplateParams, Score, f64, bool)> {
        let (p, m) = (self.p, self.m);
        let natural = natural_warmup(p, m, self.costs, 0.0);
        let overshoot = natural_warmup(p, m, self.costs, OVERSHOOT);
        let large = 3 * p * m > 3000;
        let gammas: &[i64] = if large { &[0, -1] } else { &[0, -1, 1, -2] };
        let alphas: Vec<f64> = if large {
            (0..=8).map(|a| a as f64 * 0.5).collect()
        } else {
            (0..=16).map(|a| a as f64 * 0.25).collect()
        };
        let betas: &[f64] = if large {
            &[0.0, 1.0]
        } else {
            &[0.0, 1.0, -1.0, 2.0]
        };
        let delays = [m, 0, p / 2, p, 2 * p];
        // (base warm-up, γ): every γ around the natural warm-up, the overshooting one as is.
        let mut warmups: Vec<(&[usize], i64, bool)> =
            gammas.iter().map(|&g| (&natural[..], g, false)).collect();
        if overshoot != natural {
            warmups.push((&overshoot[..], 0, true));
        }
        let mut out = Vec::new();
        for &delay in &delays {
            for &(base, gamma, overshot) in &warmups {
                for &alpha in &alphas {
                    for &beta in betas {
                        let t = TemplateParams {
                            warm: base
                                .iter()
                                .map(|&w| (w as i64 + gamma).clamp(0, m as i64) as usize)
                                .collect(),
                            lag: (0..p)
                                .map(|s| {
                                    (alpha * s as f64 + beta).round().clamp(0.0, m as f64) as usize
                                })
                                .collect(),
                            delay,
                        };
                        if let Some((sc, need)) = self.eval_any(&t) {
                            out.push((t, sc, need, overshot));
                        }
                    }
                }
            }
        }
        out
    }

    /// Cuts `t` down until it fits `x`: on every rank over the limit, shorten the W lag by
    /// the excess (in units of what a deferred W holds), or once there is no lag, warm up
    /// with one forward less. `None` if nothing is left to cut.
    fn fit(&self, mut t: TemplateParams, x: f64) -> Option<TemplateParams> {
        for _ in 0..4 * self.p + 8 {
            let s = self.build(&t).ok()?;
            let peaks = crate::validate::peak_memory(&s, self.costs);
            let mut fits = true;
            for (r, &peak) in peaks.iter().enumerate() {
                let unit =
                    (self.costs.rank_mem_b(&s, r) * self.costs.share(r)).max(f64::MIN_POSITIVE);
                let excess = peak / unit - x;
                if excess <= 1e-9 {
                    continue;
                }
                fits = false;
                let w_share = (self.costs.stages[r].mem_w / unit).max(1e-3);
                if t.lag[r] > 0 {
                    let cut = ((excess / w_share).ceil() as usize).max(1);
                    t.lag[r] = t.lag[r].saturating_sub(cut);
                } else if t.warm[r] > 0 {
                    t.warm[r] -= 1;
                } else {
                    return None;
                }
            }
            if fits {
                return Some(t);
            }
        }
        None
    }

    /// Coordinate descent on single stages' warm-up and lag, within `max_evals` simulations.
    fn descend(
        &self,
        mut t: TemplateParams,
        mut cur: Score,
        x: f64,
        max_evals: usize,
    ) -> (TemplateParams, Score) {
        let m = self.m as i64;
        let mut evals = 0;
        loop {
            let mut moved = false;
            for s in 0..self.p {
                for (dw, dl) in [(0i64, 1i64), (0, -1), (1, 0), (-1, 0), (1, -1), (-1, 1)] {
                    if evals >= max_evals {
                        return (t, cur);
                    }
                    let nw = t.warm[s] as i64 + dw;
                    let nl = t.lag[s] as i64 + dl;
                    if nw < 0 || nl < 0 || nw > m || nl > m {
                        continue;
                    }
                    let (ow, ol) = (t.warm[s], t.lag[s]);
                    t.warm[s] = nw as usize;
                    t.lag[s] = nl as usize;
                    evals += 1;
                    match self.eval(&t, x) {
                        Some(sc) if better(sc, cur) => {
                            cur = sc;
                            moved = true;
                        }
                        _ => {
                            t.warm[s] = ow;
                            t.lag[s] = ol;
                        }
                    }
                }
            }
            if !moved {
                return (t, cur);
            }
        }
    }
}

/// How far (× F) the last warm-up forward of the overshooting natural warm-up may run past
/// the first input gradient's arrival.
const OVERSHOOT: f64 = 0.1;

/// How many forwards stage `s` can finish, beyond its first, before the input gradient of
/// microbatch 0 can arrive (or at most `overshoot` × F after): the warm-up that fills the
/// start-up wait, from costs.
fn natural_warmup(p: usize, m: usize, costs: &CostModel, overshoot: f64) -> Vec<usize> {
    let c = costs.comm;
    let st = &costs.stages;
    let f_total: f64 = st.iter().map(|x| x.f).sum();
    // Earliest end of F(s, j) if every stage runs forwards back to back.
    let mut ends = vec![vec![0.0; m]; p];
    for s in 0..p {
        for j in 0..m {
            let own = if j > 0 { ends[s][j - 1] } else { 0.0 };
            let up = if s > 0 { ends[s - 1][j] + c } else { 0.0 };
            ends[s][j] = own.max(up) + st[s].f;
        }
    }
    (0..p)
        .map(|s| {
            let arrival = f_total
                + (p - 1) as f64 * c
                + st[s + 1..].iter().map(|x| x.i).sum::<f64>()
                + (p - 1 - s) as f64 * c;
            let until = arrival + overshoot * st[s].f + 1e-9;
            (1..m).take_while(|&j| ends[s][j] <= until).count()
        })
        .collect()
}
