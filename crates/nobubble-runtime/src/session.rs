//! A training run from a schedule *name*: plan, start the pipeline, measure memory and
//! pass times, re-plan automatic schedules on the measurements, step, evaluate. The
//! `nobubble train` command is a thin loop over this.

use crate::error::RuntimeError;
use crate::pipeline::{Compute, Pipeline, RunConfig, StepRecord};
use nobubble_nn::ByteCorpus;
use nobubble_schedule::validate::peak_memory;
use nobubble_schedule::{
    generate, simulate, CostModel, CostSpec, Kind, RankCost, Request, Schedule, ScheduleKind,
};

/// What to run.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// Model, training and runtime settings (`compute` decides real vs emulated).
    pub run: RunConfig,
    /// Schedule family.
    pub kind: ScheduleKind,
    /// Pipeline ranks.
    pub ranks: usize,
    /// Chunks per rank for interleaved schedules.
    pub chunks: usize,
    /// Activation memory limit per rank, in bytes (real compute) or in M_B (emulated).
    pub mem_limit: Option<f64>,
    /// Emulated compute: pass times per rank share in milliseconds and link latency
    /// (`run.compute` is then derived from the plan). `None`: real compute.
    pub emulated: Option<CostSpec>,
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

/// A running training session.
pub struct Session {
    /// The pipeline.
    pub pipeline: Pipeline,
    /// The current plan.
    pub plan: Plan,
    options: SessionOptions,
    /// Measured (M_B, M_W) bytes per stage (real compute).
    pub stage_bytes: Vec<(usize, usize)>,
}

fn plan_with(
    opts: &SessionOptions,
    spec: &CostSpec,
    x: Option<f64>,
    source: &'static str,
) -> Result<Plan, RuntimeError> {
    let req = Request {
        mem_limit: x,
        chunks: opts.chunks,
        ..Request::new(opts.kind, opts.ranks, opts.run.train.microbatches)
    };
    let schedule = generate(&req, spec).map_err(|e| RuntimeError::Config(e.to_string()))?;
    let costs = CostModel::for_schedule(spec, &schedule)
        .map_err(|e| RuntimeError::Config(e.to_string()))?;
    let sim = simulate(&schedule, &costs).map_err(|e| RuntimeError::Config(e.to_string()))?;
    Ok(Plan {
        predicted_peak: peak_memory(&schedule, &costs),
        simulated_makespan: sim.metrics.makespan,
        simulated_bubble_fraction: sim.metrics.bubble_fraction,
        schedule,
        costs,
        source,
    })
}

impl Session {
    /// Plans with provisional costs, starts the workers, measures memory and, for real
    /// compute, re-plans with the measured bytes under the memory limit (failing before any
    /// training if the schedule cannot fit).
    pub fn start(
        opts: SessionOptions,
        corpus: ByteCorpus,
        eval: ByteCorpus,
    ) -> Result<Session, RuntimeError> {
        let provisional = opts
            .emulated
            .clone()
            .unwrap_or_else(|| CostSpec::uniform(RankCost::default(), 0.0));
        let emulated_x = opts.emulated.as_ref().and(opts.mem_limit);
        let plan = plan_with(&opts, &provisional, emulated_x, "given costs")?;
        if let Some(x) = emulated_x {
            // Emulated memory is the cost model's: refuse a schedule over the limit, as
            // real runs do, before any pass runs.
            nobubble_schedule::check_memory(&plan.schedule, &plan.costs, x)
                .map_err(|e| RuntimeError::Config(e.to_string()))?;
        }
        let mut opts = opts;
        opts.run.compute = match opts.emulated {
            Some(_) => Compute::Emulated {
                costs: plan.costs.clone(),
            },
            None => Compute::Real,
        };
        let pipeline = Pipeline::start_with_eval(opts.run.clone(), &plan.schedule, corpus, eval)?;
        let stage_bytes = pipeline.measure_memory()?;
        let real = opts.emulated.is_none();
        let mut session = Session {
            pipeline,
            plan: plan.clone(),
            options: opts,
            stage_bytes,
        };
        if real {
            // Unit times until we have measured some; real bytes from now on.
            let times: Vec<(f64, f64, f64)> = vec![(1.0, 1.0, 1.0); plan.schedule.stages];
            session.plan = session.replan_with(&times, 0.0, "unit pass times, measured memory")?;
        }
        Ok(session)
    }

    /// The byte limit as the planner's multiple of each rank's M_B (the tightest rank).
    fn limit_x(&self, costs: &CostModel, schedule: &Schedule) -> Option<f64> {
        self.options.mem_limit.map(|bytes| {
            (0..schedule.ranks)
                .map(|r| bytes / costs.rank_mem_b(schedule, r).max(1.0))
                .fold(f64::INFINITY, f64::min)
        })
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
                })
                .collect(),
        };
        let current = &self.plan.schedule;
        let probe = CostModel::for_schedule(&spec, current)
            .map_err(|e| RuntimeError::Config(e.to_string()))?;
        let x = self.limit_x(&probe, current);
        if let Some(x) = x {
            if x < 1.0 {
                let need = (0..current.ranks)
                    .map(|r| probe.rank_mem_b(current, r))
                    .fold(0.0, f64::max);
                return Err(RuntimeError::Config(format!(
                    "--mem-limit {} is below one microbatch's activations on the largest rank ({}); \
                     raise it or use a smaller --microbatch-size or --seq-len",
                    human_bytes(self.options.mem_limit.unwrap_or(0.0)),
                    human_bytes(need)
                )));
            }
        }
        let plan = plan_with(&self.options, &spec, x, source)?;
        if let Some(bytes) = self.options.mem_limit {
            if let Some((r, peak)) = plan
                .predicted_peak
                .iter()
                .enumerate()
                .find(|(_, &p)| p > bytes)
            {
                return Err(RuntimeError::Config(format!(
                    "{} needs {} of activations on rank {r}, over --mem-limit {}; \
                     use --schedule zb-auto (plans within the limit) or 1f1b, or raise the limit",
                    self.options.kind.name(),
                    human_bytes(*peak),
                    human_bytes(bytes)
                )));
            }
        }
        if plan.schedule.placement != self.plan.schedule.placement {
            return Err(RuntimeError::Config(
                "internal: re-planning changed the placement".into(),
            ));
        }
        Ok(plan)
    }

    /// Re-plans an automatic schedule on the median pass times measured in `records`
    /// (milliseconds), keeping the measured memory. Returns the new plan, or `None` for a
    /// fixed schedule (nothing to re-plan).
    pub fn replan_on_measurements(
        &mut self,
        records: &[StepRecord],
    ) -> Result<Option<Plan>, RuntimeError> {
        if !self.options.kind.uses_costs() || records.is_empty() || self.options.emulated.is_some()
        {
            return Ok(None);
        }
        let times: Vec<(f64, f64, f64)> = median_pass_ms(records, self.plan.schedule.stages)
            .into_iter()
            .map(|[f, i, w, _]| {
                let t = |x: Option<f64>| x.map_or(1.0, |v| v.max(1e-6));
                (t(f), t(i), t(w))
            })
            .collect();
        let plan = self.replan_with(&times, 0.0, "measured pass times and memory")?;
        self.plan = plan.clone();
        Ok(Some(plan))
    }

    /// One training step under the current plan.
    pub fn step(&mut self) -> Result<StepRecord, RuntimeError> {
        self.pipeline.train_step(&self.plan.schedule)
    }

    /// Mean loss over `sets` held-out sets of microbatches.
    pub fn validation_loss(&mut self, sets: u64) -> Result<f32, RuntimeError> {
        let mut total = 0.0f64;
        for k in 0..sets.max(1) {
            total += self.pipeline.eval_step(&self.plan.schedule, k)? as f64;
        }
        Ok((total / sets.max(1) as f64) as f32)
    }
}

/// The median measured time (ms) of each pass kind on each stage over `records`, as
/// [F, I, W, B]; `None` where that kind never ran. Re-planning on measurements and the
/// measured-against-simulated reports all start from these.
pub fn median_pass_ms(records: &[StepRecord], stages: usize) -> Vec<[Option<f64>; 4]> {
    let mut samples: Vec<[Vec<f64>; 4]> = (0..stages).map(|_| Default::default()).collect();
    for rec in records {
        for slot in rec.timeline.iter().flatten() {
            let k = match slot.action.kind {
                Kind::F => 0,
                Kind::I => 1,
                Kind::W => 2,
                Kind::B => 3,
            };
            samples[slot.action.stage][k].push((slot.end - slot.start) * 1e3);
        }
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
