//! The one planning entry point: a [`PlanRequest`] in — schedule family, pipeline shape,
//! costs (per stage, or per layer so that the split is planned too), memory limit,
//! placement, objective — and a [`Planned`] schedule out, with its resolved costs, its
//! simulation, the limit it was planned under and whether it fits it. The CLI's `plan`,
//! `compare`, `forecast` and `train`, the runtime's session and the Python bindings all call
//! [`plan`] (or [`evaluate`], for a schedule they already have), so they can never plan
//! differently.

use crate::bound::{lower_bound, span_lower_bound};
use crate::cost::{CostModel, CostSpec, Objective};
use crate::error::Error;
use crate::generate::{generate, search::apply_budget, Placement, Request, ScheduleKind};
use crate::limit::MemLimit;
use crate::scale::Scale;
use crate::schedule::Schedule;
use crate::sim::{simulate, Simulation};
use crate::split::{even_counts, plan_split, LayerCosts};

/// What a schedule is planned on.
#[derive(Clone, Debug, PartialEq)]
pub enum PlanCosts {
    /// Costs of the stages: one entry for all, one per rank or one per schedule stage (see
    /// [`CostModel::for_schedule`]).
    Stages(CostSpec),
    /// Costs of the model's layers: the planner also chooses how many blocks each stage
    /// holds ([`crate::split`]).
    Layers(LayerCosts),
}

/// Everything a plan is made from.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanRequest {
    /// Schedule family.
    pub schedule: ScheduleKind,
    /// Pipeline ranks (devices).
    pub ranks: usize,
    /// Microbatches per iteration.
    pub microbatches: usize,
    /// Chunks per rank of the interleaved schedules (the others ignore it).
    pub chunks: usize,
    /// What the passes cost.
    pub costs: PlanCosts,
    /// Activation memory each rank may hold.
    pub mem_limit: MemLimit,
    /// `zb-auto`'s placement; `None` plans both and keeps the better.
    pub placement: Option<Placement>,
    /// What the automatic schedules minimize.
    pub objective: Objective,
}

impl PlanRequest {
    /// A request with the defaults every front end shares: 2 chunks, no memory limit, the
    /// placement chosen by the planner, the longest rank span minimized.
    pub fn new(schedule: ScheduleKind, ranks: usize, microbatches: usize, costs: CostSpec) -> Self {
        PlanRequest {
            schedule,
            ranks,
            microbatches,
            chunks: 2,
            costs: PlanCosts::Stages(costs),
            mem_limit: MemLimit::None,
            placement: None,
            objective: Objective::Span,
        }
    }

    /// The generator's part of the request.
    fn generator_request(&self) -> Request {
        Request {
            kind: self.schedule,
            ranks: self.ranks,
            microbatches: self.microbatches,
            chunks: self.chunks,
            mem_limit: self.mem_limit.clone(),
            objective: self.objective,
            placement: self.placement,
        }
    }
}

/// The layer split a [`PlanCosts::Layers`] request chose.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerSplit {
    /// Blocks per stage, in model order.
    pub counts: Vec<usize>,
    /// The even split and its simulation, for comparison (`None` where it does not plan
    /// within the limit).
    pub even: Option<(Vec<usize>, Simulation)>,
}

/// A planned schedule and everything known about it.
#[derive(Clone, Debug)]
pub struct Planned {
    /// The schedule.
    pub schedule: Schedule,
    /// Its per-stage costs, with the objective and (under budgets in memory) each rank's
    /// share of the limit set.
    pub costs: CostModel,
    /// Its simulated timeline and metrics.
    pub sim: Simulation,
    /// The limit in multiples of M_B that it was planned under (automatic kinds) or checked
    /// against; under budgets in memory, the multiple the ranks' shares on `costs` are of.
    pub limit: Option<f64>,
    /// The memory limit as requested.
    pub mem_limit: MemLimit,
    /// The objective, for kinds that plan by costs (`None`: a fixed pattern).
    pub objective: Option<Objective>,
    /// The layer split, for [`PlanCosts::Layers`] requests.
    pub split: Option<LayerSplit>,
    /// Why the schedule does not fit the memory limit (`None`: it fits). Fixed patterns are
    /// planned whatever the limit; this says whether they may run.
    pub over_limit: Option<Error>,
}

impl Planned {
    /// The shares (`CostModel::rank_share`) under which a multiple of M_B on this plan's
    /// layout means the bytes it means on one stage per rank: how `zb-auto` reads a multiple
    /// when it chooses a V plan over the linear one (README).
    fn linear_layout_shares(&self, spec: &CostSpec) -> Result<Vec<f64>, Error> {
        let s = &self.schedule;
        let linear = CostModel::for_layout(spec, s.ranks, s.ranks)?;
        Ok(self.costs.shares_of_linear(&s.placement, &linear))
    }

    /// What `x` × M_B means on each rank when read on one stage per rank, as `zb-auto`
    /// reads it: the budgets in memory under which to re-check a V plan it made.
    pub fn linear_layout_budgets(&self, spec: &CostSpec, x: f64) -> Result<Vec<f64>, Error> {
        let mut costs = self.costs.clone();
        costs.rank_share = self.linear_layout_shares(spec)?;
        Ok((0..self.schedule.ranks)
            .map(|r| costs.rank_limit(&self.schedule, r, x))
            .collect())
    }

    /// Ok when the schedule fits the memory limit, else the error naming the rank and action
    /// over it.
    pub fn check_limit(&self) -> Result<(), Error> {
        self.over_limit.clone().map_or(Ok(()), Err)
    }

    /// The proven lower bound on the makespan under the same costs and limit.
    pub fn lower_bound(&self) -> f64 {
        let s = &self.schedule;
        lower_bound(&s.placement, s.microbatches, &self.costs, self.limit)
    }

    /// The proven lower bound on the longest rank span.
    pub fn span_lower_bound(&self) -> f64 {
        let s = &self.schedule;
        span_lower_bound(&s.placement, s.microbatches, &self.costs, self.limit)
    }

    /// Peak activation memory per rank.
    pub fn peak_memory(&self) -> &[f64] {
        &self.sim.metrics.peak_memory
    }
}

/// Plans `req`: generates the schedule (choosing the layer split when the costs are per
/// layer), resolves its costs, simulates it and checks it against the memory limit.
pub fn plan(req: &PlanRequest) -> Result<Planned, Error> {
    req.mem_limit.check(req.ranks)?;
    let gen = req.generator_request();
    // The limit the plan is judged against: the request's, or for a layer split the bytes
    // per rank the split search held every split to.
    let mut judged = req.mem_limit.clone();
    let (schedule, spec, split) = match &req.costs {
        PlanCosts::Stages(spec) => (generate(&gen, spec)?, spec.clone(), None),
        PlanCosts::Layers(layers) => {
            // The split search compares splits in units near 1 too, as `generate` plans
            // ([`crate::scale`]); the plan is simulated, bounded and reported in the user's.
            let scale = Scale::of_layers(layers);
            let scaled = Request {
                mem_limit: scale.limit(&gen.mem_limit),
                ..gen.clone()
            };
            // An error may quote times or amounts of memory: found again in the user's units.
            let (chosen, scale) = match plan_split(&scaled, &scale.layers(layers)) {
                Ok(chosen) => (chosen, scale),
                Err(_) if !scale.is_identity() => (plan_split(&gen, layers)?, Scale::IDENTITY),
                Err(e) => return Err(e),
            };
            let blocks = layers.blocks()?.len();
            let even = match &chosen.even {
                Some(e) => {
                    let counts = even_counts(blocks, e.stages);
                    let c = CostModel::for_schedule(&layers.spec(&counts)?, e)?;
                    Some((counts, simulate(e, &c)?))
                }
                None => None,
            };
            if !chosen.budget.is_empty() {
                judged = MemLimit::PerRank(scale.memory_back(&chosen.budget));
            }
            let spec = layers.spec(&chosen.counts)?;
            let split = LayerSplit {
                counts: chosen.counts,
                even,
            };
            (chosen.schedule, spec, Some(split))
        }
    };
    let at_linear_bytes = at_linear_bytes(req, &schedule);
    let mut planned = evaluate(schedule, &spec, &judged, req.objective)?;
    if at_linear_bytes {
        // zb-auto planned its V plan at the linear layout's bytes per rank (README: a
        // multiple is read on the linear layout); judge and bound it there too.
        planned.costs.rank_share = planned.linear_layout_shares(&spec)?;
        planned.over_limit = judged
            .check_schedule(&planned.schedule, &planned.costs)
            .err();
    }
    planned.mem_limit = req.mem_limit.clone();
    // The limit it was planned under: under budgets in memory the multiple `evaluate` found;
    // else the kind's own (automatic kinds: the user's multiple or their default), or the
    // user's multiple that a fixed pattern was checked against.
    if judged.budgets().is_empty() {
        let user = req.mem_limit.as_multiple();
        planned.limit = req.schedule.planning_limit(req.ranks, user).or(user);
    }
    planned.objective = req.schedule.uses_costs().then_some(req.objective);
    planned.split = split;
    Ok(planned)
}

/// Whether `schedule` is a `zb-auto` V plan that the planner chose over the linear one at
/// the linear layout's bytes per rank (a multiple of M_B, no placement forced).
fn at_linear_bytes(req: &PlanRequest, schedule: &Schedule) -> bool {
    req.schedule == ScheduleKind::ZbAuto
        && req.placement.is_none()
        && matches!(req.costs, PlanCosts::Stages(_))
        && req.mem_limit.as_multiple().is_some()
        && schedule.stages != schedule.ranks
}

/// The plan of a schedule already made (a file, a re-plan that keeps its schedule): its
/// costs under `spec` with `objective`, simulated, and checked against `mem_limit`.
pub fn evaluate(
    schedule: Schedule,
    spec: &CostSpec,
    mem_limit: &MemLimit,
    objective: Objective,
) -> Result<Planned, Error> {
    mem_limit.check(schedule.ranks)?;
    let mut costs = CostModel::for_schedule(spec, &schedule)?.with_objective(objective);
    // Report and bound against each rank's own budget.
    let budgets = mem_limit.budgets();
    let limit = if budgets.is_empty() {
        mem_limit.as_multiple()
    } else {
        Some(apply_budget(
            &mut costs,
            &schedule.placement,
            schedule.microbatches,
            &budgets,
            1.0,
        )?)
    };
    let sim = simulate(&schedule, &costs)?;
    let over_limit = mem_limit.check_schedule(&schedule, &costs).err();
    Ok(Planned {
        schedule,
        costs,
        sim,
        limit,
        mem_limit: mem_limit.clone(),
        objective: None,
        split: None,
        over_limit,
    })
}
