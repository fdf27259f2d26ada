//! A training run from a schedule *name*, on one rank of the SPMD program: plan, build the
//! rank, measure memory and pass times, re-plan automatic schedules on the measurements, step,
//! evaluate. Every rank plans alike — the planner is deterministic and its inputs (measured
//! memory and pass times) are all-gathered — so all ranks always run the same schedule.
//! Ranks in one process (the threads transport) share each plan ([`SharedPlans`]).
//! [`crate::training`] is the loop over this.

use crate::error::RuntimeError;
use crate::launch::RankContext;
use crate::machine;
use crate::rank::Rank;
use crate::run::{Compute, RunConfig, StepRecord};
use crate::worker::{MeasuredSlot, RankStep};
use nobubble_nn::config::StageLayout;
use nobubble_nn::{Corpus, GptConfig};
use nobubble_schedule::flops;
use nobubble_schedule::split::LayerCosts;
use nobubble_schedule::{
    planner, CostModel, CostSpec, Kind, MemLimit, Objective, Placement, PlanCosts, PlanRequest,
    RankCost, Schedule, ScheduleKind,
};
use std::sync::{Arc, Mutex, OnceLock};

mod memory;

/// What to run.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// Model, training and runtime settings (`compute` decides real vs emulated).
    pub run: RunConfig,
    /// Schedule family.
    pub kind: ScheduleKind,
    /// A user's schedule (`train --schedule FILE.csv`): run as given, never re-planned;
    /// `kind` is then ignored.
    pub file: Option<Schedule>,
    /// Pipeline ranks.
    pub ranks: usize,
    /// Chunks per rank for interleaved schedules.
    pub chunks: usize,
    /// Activation memory limit per rank: a multiple of each rank's M_B (measured, for real
    /// compute), or bytes (real compute only; emulated passes hold no tensors).
    pub mem_limit: MemLimit,
    /// Emulated compute: pass times per rank share in milliseconds and link latency
    /// (`run.compute` is then derived from the plan). `None`: real compute.
    pub emulated: Option<CostSpec>,
    /// Emulated latency of collective traffic (gradient reduction, step statistics), ms.
    pub collective_ms: f64,
    /// What automatic schedules minimize: the makespan under a synchronous optimizer step
    /// (every iteration waits for the slowest rank), the longest rank span under
    /// post-validation (iterations tile).
    pub objective: Objective,
    /// The plans of this process's ranks (clones of the options share it).
    pub plans: Arc<SharedPlans>,
}

/// Plans shared by the ranks of one process. With the threads transport every rank asks
/// the planner the same request at the same moment (the first plan, each re-plan): one of
/// them plans and the others wait for it and take a copy, instead of p planners at once
/// (p times the time and the planner's memory: p = 256 emulated ranks took 4.3 GB).
#[derive(Debug, Default)]
pub struct SharedPlans {
    plans: Mutex<Vec<(PlanRequest, PlanCell)>>,
}

type PlanCell = Arc<OnceLock<Result<planner::Planned, nobubble_schedule::Error>>>;

impl SharedPlans {
    /// The plan of `req`, planned once per process; without the simulated timeline and
    /// critical path (a session reads only the simulation's figures), which are most of a
    /// plan's size and would be copied to every rank.
    pub fn plan(&self, req: &PlanRequest) -> Result<planner::Planned, nobubble_schedule::Error> {
        let cell = {
            // A rank that panicked while holding the lock left the list whole.
            let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
            match plans.iter().find(|(r, _)| r == req) {
                Some((_, cell)) => cell.clone(),
                None => {
                    let cell = PlanCell::default();
                    plans.push((req.clone(), cell.clone()));
                    cell
                }
            }
        };
        let planned = cell.get_or_init(|| {
            planner::plan(req).map(|mut p| {
                p.sim.timeline = Vec::new();
                p.sim.critical_path = Vec::new();
                p
            })
        });
        planned.clone()
    }
}

impl SessionOptions {
    /// The schedule's name for messages: the family, or the user's file.
    pub fn schedule_name(&self) -> String {
        match &self.file {
            Some(s) => s.name.clone(),
            None => self.kind.name().to_string(),
        }
    }
}

/// Why and how the schedule was last planned.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The schedule in use.
    pub schedule: Schedule,
    /// The costs it was planned with (ms and bytes per stage for real runs).
    pub costs: CostModel,
    /// Simulated step time under those costs (same unit as the costs' times).
    pub simulated_makespan: f64,
    /// Simulated bubble fraction.
    pub simulated_bubble_fraction: f64,
    /// Predicted peak activation memory per rank (bytes for real runs).
    pub predicted_peak: Vec<f64>,
    /// Where the pass times came from.
    pub source: &'static str,
}

/// A running training session on one rank.
pub struct Session {
    /// This rank.
    pub rank: Rank,
    /// The current plan.
    pub plan: Plan,
    options: SessionOptions,
    /// Measured (M_B, M_W) bytes per stage (real compute).
    pub stage_bytes: Vec<(usize, usize)>,
    /// The next step to run.
    pub step: u64,
    /// Every rank's memory reading right after the measurement, in rank order (real
    /// compute; empty for emulated runs).
    free_after_measuring: Vec<machine::Reading>,
    /// The activation bytes per rank the plan was fitted into because the schedule's own plan
    /// would not fit in the free memory and the user gave no limit ([`Session::free_memory_limit`]).
    fitted_to_free: Option<Vec<f64>>,
}

/// The planner's request for this session on `spec`, keeping `keep`'s placement (a re-plan:
/// the ranks have built their stages for it; only zb-auto chooses one, the others have theirs).
fn request(opts: &SessionOptions, costs: PlanCosts, keep: Option<&Schedule>) -> PlanRequest {
    PlanRequest {
        schedule: opts.kind,
        ranks: opts.ranks,
        microbatches: opts.run.train.microbatches,
        chunks: opts.chunks,
        costs,
        mem_limit: opts.mem_limit.clone(),
        placement: keep
            .filter(|_| opts.kind == ScheduleKind::ZbAuto)
            .and_then(Placement::of),
        objective: opts.objective,
    }
}

/// Plans (or takes the user's file) and simulates.
fn plan_with(
    opts: &SessionOptions,
    spec: &CostSpec,
    keep: Option<&Schedule>,
    source: &'static str,
) -> Result<Plan, RuntimeError> {
    let planned = match &opts.file {
        Some(s) => planner::evaluate(s.clone(), spec, &opts.mem_limit, opts.objective),
        None => opts
            .plans
            .plan(&request(opts, PlanCosts::Stages(spec.clone()), keep)),
    }
    .map_err(RuntimeError::Plan)?;
    Ok(plan_of(planned, source))
}

/// The session's view of a planned schedule.
fn plan_of(planned: planner::Planned, source: &'static str) -> Plan {
    Plan {
        predicted_peak: planned.peak_memory().to_vec(),
        simulated_makespan: planned.sim.metrics.makespan,
        simulated_bubble_fraction: planned.sim.metrics.bubble_fraction,
        schedule: planned.schedule,
        costs: planned.costs,
        source,
    }
}

/// The layer split (and with it the placement) for a real run, chosen before any stage is
/// built on the model's FLOP and activation estimates; `None` keeps the even split. The
/// estimates' memory is not the measured one: if no split fits the limit by them, choose on
/// time alone (the measured re-plan enforces the limit).
fn planned_split(opts: &SessionOptions) -> Option<(Vec<usize>, Schedule)> {
    let layers = PlanCosts::Layers(estimated_layer_costs(&opts.run.model));
    let req = request(opts, layers, None);
    opts.plans
        .plan(&req)
        .or_else(|_| {
            opts.plans.plan(&PlanRequest {
                mem_limit: MemLimit::None,
                ..req.clone()
            })
        })
        .ok()
        .and_then(|p| Some((p.split?.counts, p.schedule)))
}

/// Refuses a limit with the wrong number of budgets, or in bytes for emulated passes.
fn check_limit_form(opts: &SessionOptions) -> Result<(), RuntimeError> {
    opts.mem_limit
        .check(opts.ranks)
        .map_err(RuntimeError::Plan)?;
    if opts.emulated.is_some() && !opts.mem_limit.budgets().is_empty() {
        return Err(RuntimeError::Plan(nobubble_schedule::Error::setting(
            "mem_limit",
            "emulated passes hold no tensors, so their memory is counted in M_B: give a \
             multiple of it (e.g. 8), not an amount of memory",
        )));
    }
    Ok(())
}

/// The plan the stages are built for, on provisional costs (the emulated ones, else unit
/// times). Real compute: the layer split is part of the plan, chosen before any stage is
/// built (the placement with it; the measured costs later re-plan the order, never the
/// split), and written into `opts`; the limit is checked later, on the measured bytes.
/// Emulated: a schedule over the limit is refused, as real runs do, before any pass runs.
fn first_plan(opts: &mut SessionOptions) -> Result<Plan, RuntimeError> {
    let provisional = opts
        .emulated
        .clone()
        .unwrap_or_else(|| CostSpec::uniform(RankCost::default(), 0.0));
    let split =
        (opts.emulated.is_none() && opts.file.is_none() && opts.run.layout == StageLayout::Even)
            .then(|| planned_split(opts))
            .flatten();
    // The split search planned the schedule already; otherwise plan it now.
    let plan = match split {
        Some((counts, schedule)) => {
            opts.run.layout = StageLayout::Explicit(counts);
            let planned =
                planner::evaluate(schedule, &provisional, &MemLimit::None, opts.objective)
                    .map_err(RuntimeError::Plan)?;
            plan_of(planned, "given costs")
        }
        None => {
            let mut first = opts.clone();
            if first.emulated.is_none() {
                first.mem_limit = MemLimit::None;
            }
            plan_with(&first, &provisional, None, "given costs")?
        }
    };
    if opts.emulated.is_some() {
        opts.mem_limit
            .check_schedule(&plan.schedule, &plan.costs)
            .map_err(RuntimeError::Plan)?;
    }
    Ok(plan)
}

impl Session {
    /// Plans with provisional costs, builds this rank, measures memory (all ranks') and, for
    /// real compute, re-plans with the measured bytes under the memory limit (failing before
    /// any training if the schedule cannot fit). A collective: every rank of the job calls it.
    pub fn start(
        opts: SessionOptions,
        ctx: RankContext,
        corpus: Arc<Corpus>,
        eval: Arc<Corpus>,
    ) -> Result<Session, RuntimeError> {
        check_limit_form(&opts)?;
        let mut opts = opts;
        let plan = first_plan(&mut opts)?;
        opts.run.compute = match opts.emulated {
            Some(_) => Compute::Emulated {
                costs: plan.costs.clone(),
                collective_ms: opts.collective_ms,
            },
            None => Compute::Real,
        };
        let mut rank = Rank::new(&opts.run, &plan.schedule, ctx, corpus, eval)?;
        let real = opts.emulated.is_none();
        if real {
            let (activations, state) =
                machine::measurement_bytes(&opts, &plan.schedule, rank.rank());
            let readings = machine::gather(&mut rank, activations, state)?;
            let what = "measuring the stages' memory";
            machine::check_fits(&readings, what, machine::Remedy::Smaller)
                .map_err(|e| RuntimeError::Plan(nobubble_schedule::Error::Input(e)))?;
        }
        let stage_bytes = rank.measure_memory()?;
        // The free memory the plans are judged against, read once, after the measurement:
        // what the measurement left resident (its freed buffers, cached per thread) is not
        // given back, and training does not reuse most of it (measured: a run judged against
        // the reading before the measurement was killed by its container's limit). Later
        // readings would count training's own cached buffers, which it does reuse.
        let free_after_measuring = if real {
            machine::gather(&mut rank, 0.0, 0.0)?
        } else {
            Vec::new()
        };
        let mut session = Session {
            rank,
            plan: plan.clone(),
            options: opts,
            stage_bytes,
            step: 0,
            free_after_measuring,
            fitted_to_free: None,
        };
        if real {
            // Unit times until we have measured some; real bytes from now on.
            let times: Vec<(f64, f64, f64)> = vec![(1.0, 1.0, 1.0); plan.schedule.stages];
            let source = "unit pass times, measured memory";
            session.plan = session.replan_with(&times, 0.0, source)?;
            session.fit_machine_memory(&times, 0.0, source)?;
        }
        Ok(session)
    }

    fn replan_with(
        &mut self,
        times: &[(f64, f64, f64)],
        comm: f64,
        source: &'static str,
    ) -> Result<Plan, RuntimeError> {
        let spec = CostSpec {
            comm,
            stages: times
                .iter()
                .zip(&self.stage_bytes)
                .map(|(&(f, i, w), &(b, bw))| RankCost {
                    f,
                    i,
                    w,
                    mem_b: b as f64,
                    mem_w: (bw as f64).min(b as f64),
                    b: None,
                })
                .collect(),
        };
        let current = &self.plan.schedule;
        self.check_one_microbatch_fits(&spec)?;
        let mut plan = plan_with(&self.options, &spec, Some(current), source)?;
        // The planner's model has a microbatch hold no more after I than after F; a stage
        // can hold more (M_W > M_B, e.g. a wide layer's saved input for W). The schedule is
        // planned on the clamped figure, but the prediction — and the limit check below —
        // use what the stages really hold.
        let mut real = plan.costs.clone();
        for (c, &(_, bw)) in real.stages.iter_mut().zip(&self.stage_bytes) {
            c.mem_w = bw as f64;
        }
        if self.stage_bytes.iter().any(|&(b, bw)| bw > b) {
            plan = self.fit_real_memory(plan, &spec, &real, source);
        }
        self.check_limit(&plan, &real)?;
        if plan.schedule.placement != self.plan.schedule.placement {
            return Err(RuntimeError::Fault(
                "internal: re-planning changed the placement".into(),
            ));
        }
        Ok(plan)
    }

    /// Whether [`Session::replan_on_measurements`] re-plans: an automatic schedule (not a
    /// file) on real compute.
    pub fn replans_on_measurements(&self) -> bool {
        self.options.file.is_none()
            && self.options.kind.uses_costs()
            && self.options.emulated.is_none()
    }

    /// Re-plans an automatic schedule on the median pass times this rank measured in
    /// `steps` (milliseconds), all-gathered with the other ranks' (a collective), keeping the
    /// measured memory and using the measured mean message latency as the link cost. Returns
    /// the new plan, or `None` for a fixed schedule (nothing to re-plan).
    pub fn replan_on_measurements(
        &mut self,
        steps: &[RankStep],
    ) -> Result<Option<Plan>, RuntimeError> {
        if !self.replans_on_measurements() || steps.is_empty() {
            return Ok(None);
        }
        let n = self.plan.schedule.stages;
        let mine = local_medians(steps, n);
        let comm: (f64, u64) = steps.iter().fold((0.0, 0), |(s, c), r| {
            (s + r.comm.latency_sum, c + r.comm.latency_count)
        });
        let bytes = serde_json::to_vec(&(mine, comm)).expect("serializes");
        let mut medians: Vec<[Option<f64>; 4]> = vec![[None; 4]; n];
        let (mut lat_sum, mut lat_count) = (0.0, 0u64);
        for part in self.rank.all_gather(bytes)? {
            #[allow(clippy::type_complexity)]
            let (theirs, (s, c)): (Vec<(usize, [Option<f64>; 4])>, (f64, u64)) =
                serde_json::from_slice(&part)
                    .map_err(|e| RuntimeError::Fault(format!("damaged pass times: {e}")))?;
            for (stage, m) in theirs {
                if stage < n && medians[stage] == [None; 4] {
                    medians[stage] = m;
                }
            }
            lat_sum += s;
            lat_count += c;
        }
        let latency_ms = if lat_count == 0 {
            0.0
        } else {
            1e3 * lat_sum / lat_count as f64
        };
        let times: Vec<(f64, f64, f64)> = medians
            .into_iter()
            .map(|[f, i, w, _]| {
                let t = |x: Option<f64>| x.map_or(1.0, |v| v.max(1e-6));
                (t(f), t(i), t(w))
            })
            .collect();
        let source = "measured pass times, message latency and memory";
        self.plan = self.replan_with(&times, latency_ms, source)?;
        self.fit_machine_memory(&times, latency_ms, source)?;
        Ok(Some(self.plan.clone()))
    }

    /// How the model's blocks are spread over the stages (the planned split for real runs).
    pub fn layout(&self) -> &StageLayout {
        &self.options.run.layout
    }

    /// One training step under the current plan (a collective).
    pub fn step(&mut self) -> Result<RankStep, RuntimeError> {
        let r = self.rank.step(&self.plan.schedule, self.step, false)?;
        self.step += 1;
        Ok(r)
    }

    /// Mean loss over `sets` held-out sets of microbatches (a collective).
    pub fn validation_loss(&mut self, sets: u64) -> Result<f32, RuntimeError> {
        self.validation_loss_with(sets, &mut |_, _| {})
    }

    /// [`Session::validation_loss`], calling `progress(done, total)` after each set.
    pub fn validation_loss_with(
        &mut self,
        sets: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<f32, RuntimeError> {
        let mut total = 0.0f64;
        for k in 0..sets.max(1) {
            let r = self.rank.step(&self.plan.schedule, k, true)?;
            total += r.summary.map_or(f32::NAN, |s| s.loss) as f64;
            progress(k + 1, sets.max(1));
        }
        Ok((total / sets.max(1) as f64) as f32)
    }
}

/// Per-layer costs of `model` for choosing the layer split before anything is measured:
/// FLOPs per pass (a block's matrix products and attention; the LM head's projection) and
/// the paper's activation bytes per block (f32 here; Llama blocks: the engine's own count), the
/// head holding its logits. Only the split and placement are chosen on these (the plan is
/// made again on measured bytes); the memory checks count the bytes exactly
/// ([`GptConfig::block_bytes`]). Planning on the exact bytes too was tried: it turned the
/// 2-block micro model to a V whose head-only stage left rank 1 twice the work (bubble
/// fraction 33–34% measured against 10–17%): the FLOP times of so small a model are not its
/// real ones.
pub fn estimated_layer_costs(model: &GptConfig) -> LayerCosts {
    let (h, s, b) = (model.hidden, model.seq_len, model.microbatch_size);
    let tokens = (s * b) as f64;
    let gflop = |x: f64| x / 1e9;
    let [f, i, w] = model.block_shape().pass_flops().map(gflop);
    let (mem_b, mem_w) = match model.arch {
        nobubble_nn::config::Arch::Gpt => flops::block_activation_bytes(h, model.heads, s, b, 4.0),
        nobubble_nn::config::Arch::Llama => model.llama_block_bytes(),
    };
    let block = RankCost {
        f,
        i,
        w,
        mem_b,
        mem_w,
        b: None,
    };
    let head_flops = gflop(flops::head_pass_flops(h, model.vocab, s, b));
    let (h, v) = (h as f64, model.vocab as f64);
    let head = RankCost {
        f: head_flops,
        i: head_flops,
        w: head_flops,
        mem_b: 4.0 * tokens * (v + h),
        mem_w: 4.0 * tokens * h,
        b: None,
    };
    // A lookup and an add: next to nothing, but not zero (a stage must take time).
    let embedding = RankCost {
        f: gflop(tokens * h),
        i: gflop(tokens * h),
        w: gflop(tokens * h),
        mem_b: 4.0 * tokens * h,
        mem_w: 0.0,
        b: None,
    };
    LayerCosts {
        comm: 0.0,
        embedding,
        blocks: Vec::new(),
        block: Some(block),
        count: model.layers,
        head,
    }
}

/// The median time (ms) of each pass kind on each stage this rank ran in `steps`:
/// (stage, [F, I, W, B]), for the stages it ran.
pub fn local_medians(steps: &[RankStep], stages: usize) -> Vec<(usize, [Option<f64>; 4])> {
    slot_medians(steps.iter().flat_map(|r| &r.timeline), stages)
        .into_iter()
        .enumerate()
        .filter(|(_, kinds)| kinds.iter().any(Option::is_some))
        .collect()
}

/// The median measured time (ms) of each pass kind on each stage over `records`, as
/// [F, I, W, B]; `None` where that kind never ran. Re-planning on measurements and the
/// measured-against-simulated reports all start from these.
pub fn median_pass_ms(records: &[StepRecord], stages: usize) -> Vec<[Option<f64>; 4]> {
    slot_medians(
        records.iter().flat_map(|r| r.timeline.iter().flatten()),
        stages,
    )
}

fn slot_medians<'a>(
    slots: impl Iterator<Item = &'a MeasuredSlot>,
    stages: usize,
) -> Vec<[Option<f64>; 4]> {
    let mut samples: Vec<[Vec<f64>; 4]> = (0..stages).map(|_| Default::default()).collect();
    for slot in slots {
        let k = match slot.action.kind {
            Kind::F => 0,
            Kind::I => 1,
            Kind::W => 2,
            Kind::B => 3,
        };
        samples[slot.action.stage][k].push((slot.end - slot.start) * 1e3);
    }
    samples
        .into_iter()
        .map(|kinds| {
            kinds.map(|mut v| {
                v.sort_by(f64::total_cmp);
                v.get(v.len() / 2).copied()
            })
        })
        .collect()
}

/// Bytes as B, KiB, MiB or GiB with one decimal, for messages.
pub fn human_bytes(b: f64) -> String {
    const K: f64 = 1024.0;
    if b < K {
        format!("{b:.0} B")
    } else if b < K * K {
        format!("{:.1} KiB", b / K)
    } else if b < K * K * K {
        format!("{:.1} MiB", b / (K * K))
    } else {
        format!("{:.2} GiB", b / (K * K * K))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The planner's even split is the runtime's even layout, so an unchanged split builds
    /// the very stages it always did.
    #[test]
    fn the_planners_even_split_is_the_runtimes() {
        for blocks in 1..20 {
            for stages in 1..=blocks.min(8) {
                let ours = nobubble_schedule::split::even_counts(blocks, stages);
                let theirs =
                    nobubble_nn::config::block_counts(blocks, stages, &StageLayout::Even).unwrap();
                assert_eq!(ours, theirs, "{blocks} blocks on {stages} stages");
            }
        }
    }

    /// The estimates price a block by its matrix products and the head by its vocabulary.
    #[test]
    fn layer_estimates_follow_the_model_shape() {
        let mut m = GptConfig::preset("tiny").unwrap();
        let l = estimated_layer_costs(&m);
        let block = l.block.unwrap();
        let tokens = (m.seq_len * m.microbatch_size) as f64;
        let h = m.hidden as f64;
        assert!((block.w - tokens * 24.0 * h * h / 1e9).abs() < 1e-12);
        assert_eq!(l.count, m.layers);
        m.vocab *= 4;
        assert!((estimated_layer_costs(&m).head.f - 4.0 * l.head.f).abs() < 1e-12);
    }
}
