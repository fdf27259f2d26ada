//! [`Rank`]: one rank of the SPMD program, over any [`crate::Transport`]. A thread of the
//! in-process runtime ([`crate::Pipeline`], [`crate::launch::threads`]) and a process of an MPI
//! job run exactly this; there is no coordinator. Everything that needs the whole world —
//! the step's loss and clip factor, measured memory, re-planning inputs, checkpoints — is a
//! collective among the ranks.

use crate::checkpoint::{self, StageState, TrainingState};
use crate::error::RuntimeError;
use crate::launch::RankContext;
use crate::run::{Compute, RunConfig};
use crate::worker::{
    CommStats, Engine, Latency, Layout, RankStep, StepSummary, Worker, WorkerSetup,
};
use nobubble_nn::config::block_counts;
use nobubble_nn::lending::CoreLender;
use nobubble_nn::optim::AdamW;
use nobubble_nn::{build_stages_where, Corpus, CpuBackend};
use nobubble_schedule::{check_structure, check_weight_order, Action, CostModel, Schedule};
use std::collections::{BTreeMap, BTreeSet};

use std::sync::Arc;
use std::time::Duration;

/// What the runtime needs of any schedule it runs: valid structure, weight gradients
/// accumulated in microbatch order (bit-identity), and the training's microbatch count.
pub(crate) fn check_runnable(schedule: &Schedule, microbatches: usize) -> Result<(), RuntimeError> {
    check_structure(schedule)
        .and_then(|_| check_weight_order(schedule))
        .map_err(|e| RuntimeError::Config(format!("cannot run this schedule: {e}")))?;
    if schedule.microbatches != microbatches {
        return Err(RuntimeError::Config(format!(
            "the schedule has {} microbatches but training uses {}",
            schedule.microbatches, microbatches
        )));
    }
    Ok(())
}

/// The world size a configuration needs, with the error every rank prints when it differs.
pub fn check_world(
    size: usize,
    pipeline_ranks: usize,
    replicas: usize,
) -> Result<(), RuntimeError> {
    if size != pipeline_ranks * replicas {
        return Err(RuntimeError::Config(format!(
            "the job has {size} ranks, but --stages {pipeline_ranks} × --data-parallel {replicas} \
             needs {}; launch with `mpirun -np {}` or change --stages / --data-parallel",
            pipeline_ranks * replicas,
            pipeline_ranks * replicas
        )));
    }
    Ok(())
}

/// Pipeline rank `prank`'s stages of `schedule`, built from the seed (every split holds the
/// same weights), each with its optimizer.
fn real_engine(
    config: &RunConfig,
    schedule: &Schedule,
    prank: usize,
    lender: Option<Arc<CoreLender>>,
) -> Result<Engine, RuntimeError> {
    let n = schedule.stages;
    let m = config.train.microbatches;
    let replicas = config.data_parallel.max(1);
    let counts = block_counts(config.model.layers, n, &config.layout).map_err(|e| {
        RuntimeError::Config(format!(
            "cannot split {} layers into {n} stages: {e} (use more --layers or fewer stages)",
            config.model.layers
        ))
    })?;
    let mine = build_stages_where(&config.model, config.train.seed, &counts, |s| {
        schedule.placement[s] == prank
    })
    .map_err(|e| RuntimeError::Config(e.to_string()))?;
    let mut stages = BTreeMap::new();
    // The rank's cores: one backend (one thread pool, one buffer cache per worker) shared by
    // all its stages.
    let backend = Arc::new(CpuBackend::with_threads(config.train.threads).with_lender(lender));
    for (s, mut st) in mine {
        // Each microbatch's loss counts 1/(D·m) of the global batch's.
        st.set_loss_grad_scale(1.0 / (m * replicas) as f32);
        st.set_microbatches(m);
        st.set_backend(backend.clone());
        stages.insert(s, st);
    }
    let optimizers = stages
        .iter()
        .map(|(&s, st)| (s, AdamW::new(config.train.optimizer, &st.params())))
        .collect();
    Ok(Engine::Real {
        stages,
        optimizers,
        backend,
    })
}

/// Passes that sleep for `costs` (ms per stage), and the emulated latencies of messages.
fn emulated_engine(
    costs: &CostModel,
    collective_ms: f64,
    stages: usize,
) -> Result<(Engine, Latency), RuntimeError> {
    if costs.stages.len() != stages {
        return Err(RuntimeError::Config(format!(
            "emulated costs cover {} stages, the schedule has {stages}",
            costs.stages.len()
        )));
    }
    let latency = Latency {
        pipeline: Duration::from_secs_f64(costs.comm / 1000.0),
        collective: Duration::from_secs_f64(collective_ms / 1000.0),
    };
    Ok((Engine::Emulated(costs.clone()), latency))
}

/// One rank of a pipelined (and data-parallel) run.
pub struct Rank {
    worker: Worker,
    placement: Vec<usize>,
    failed: bool,
}

impl Rank {
    /// Builds this rank's stages (or emulated engine) for `schedule` and connects it through
    /// `ctx` (its transport, the clock all timelines use, the abort flag in-process ranks share).
    pub fn new(
        config: &RunConfig,
        schedule: &Schedule,
        ctx: RankContext,
        corpus: Arc<Corpus>,
        eval: Arc<Corpus>,
    ) -> Result<Rank, RuntimeError> {
        check_runnable(schedule, config.train.microbatches)?;
        if config.train.microbatches >= 1 << 24 {
            return Err(RuntimeError::Config(format!(
                "{} microbatches per step is more than the runtime addresses (2^24); use fewer",
                config.train.microbatches
            )));
        }
        let replicas = config.data_parallel.max(1);
        check_world(ctx.transport.size(), schedule.ranks, replicas)?;
        let rank = ctx.transport.rank();
        let (engine, latency) = match &config.compute {
            Compute::Real => (
                real_engine(config, schedule, rank % schedule.ranks, ctx.lender.clone())?,
                Latency::default(),
            ),
            Compute::Emulated {
                costs,
                collective_ms,
            } => emulated_engine(costs, *collective_ms, schedule.stages)?,
        };
        let setup = WorkerSetup {
            config,
            layout: Layout {
                placement: schedule.placement.clone(),
                pipeline_ranks: schedule.ranks,
                replicas,
                microbatches: config.train.microbatches,
            },
            latency,
            ctx,
            corpus,
            eval_corpus: eval,
        };
        let worker = Worker::new(setup, engine);
        Ok(Rank {
            worker,
            placement: schedule.placement.clone(),
            failed: false,
        })
    }

    /// This rank (global).
    pub fn rank(&self) -> usize {
        self.worker.rank()
    }

    /// This rank's data-parallel replica.
    pub fn replica(&self) -> usize {
        self.worker.replica()
    }

    /// Communication so far.
    pub fn comm(&self) -> CommStats {
        self.worker.comm()
    }

    /// The transport's description.
    pub fn transport(&self) -> String {
        self.worker.transport()
    }

    /// This rank's actions of `schedule` (same placement as at start).
    fn order<'a>(&self, schedule: &'a Schedule) -> Result<&'a [Action], RuntimeError> {
        if self.failed {
            return Err(RuntimeError::Fault("this pipeline stopped after an earlier error; start a new run (a checkpoint saved before the error can be resumed)".into()));
        }
        if schedule.placement != self.placement {
            return Err(RuntimeError::Config(
                "a new schedule must keep the stage placement the pipeline was started with".into(),
            ));
        }
        check_runnable(schedule, self.worker.microbatches())?;
        Ok(&schedule.orders[self.worker.rank() % schedule.ranks])
    }

    /// One training step (`eval`: on held-out data, weights unchanged).
    pub fn step(
        &mut self,
        schedule: &Schedule,
        step: u64,
        eval: bool,
    ) -> Result<RankStep, RuntimeError> {
        let order = self.order(schedule)?.to_vec();
        let r = self.worker.step(step, &order, eval);
        if r.is_err() {
            self.failed = true;
        }
        r
    }

    /// Post-validation: waits for the pending step's verdict and applies it (nothing to do
    /// for synchronous steps). Returns the settled step's summary.
    pub fn settle(&mut self) -> Result<Option<StepSummary>, RuntimeError> {
        let r = self.worker.settle();
        if r.is_err() {
            self.failed = true;
        }
        r
    }

    /// Summaries of the post-validated steps settled since the last call.
    pub fn take_settled(&mut self) -> Vec<StepSummary> {
        self.worker.take_settled()
    }

    /// Measured (M_B, M_W) bytes of every stage, in stage order, on every rank (all-gathered
    /// from replica 0). Empty in emulated mode.
    pub fn measure_memory(&mut self) -> Result<Vec<(usize, usize)>, RuntimeError> {
        let mine = if self.worker.replica() == 0 {
            self.worker.measure_memory()?
        } else {
            Vec::new()
        };
        let bytes = serde_json::to_vec(&mine).expect("serializes");
        let mut all: Vec<(usize, usize, usize)> = Vec::new();
        for part in self.worker.all_gather(bytes)? {
            let v: Vec<(usize, usize, usize)> = serde_json::from_slice(&part)
                .map_err(|e| RuntimeError::Fault(format!("damaged memory report: {e}")))?;
            all.extend(v);
        }
        all.sort_by_key(|(s, _, _)| *s);
        Ok(all.into_iter().map(|(_, f, i)| (f, i)).collect())
    }

    /// Every rank's `bytes`, in rank order.
    pub fn all_gather(&mut self, bytes: Vec<u8>) -> Result<Vec<Vec<u8>>, RuntimeError> {
        self.worker.all_gather(bytes)
    }

    /// `root`'s bytes on every rank.
    pub fn broadcast(&mut self, root: usize, bytes: Vec<u8>) -> Result<Vec<u8>, RuntimeError> {
        self.worker.broadcast(root, bytes)
    }

    /// Turns lending on or off for all the in-process ranks that share this one's lender
    /// (off while pass times are measured for planning; no lender: nothing to do).
    pub fn set_lending(&self, on: bool) {
        self.worker.set_lending(on);
    }

    /// Posts this rank's report of `step` to rank 0 without waiting.
    pub fn post_report(&mut self, step: u64, bytes: Vec<u8>) -> Result<(), RuntimeError> {
        self.worker.post_report(step, bytes)
    }

    /// Rank 0: posts its decision about the boundary after `step` to every rank.
    pub fn post_decision(&mut self, step: u64, bytes: Vec<u8>) -> Result<(), RuntimeError> {
        self.worker.post_decision(step, bytes)
    }

    /// Rank 0's decision posted for `step`.
    pub fn read_decision(&mut self, step: u64) -> Result<Vec<u8>, RuntimeError> {
        self.worker.read_decision(step)
    }

    /// Rank 0: every rank's report of `step`, in rank order.
    pub fn collect_reports(&mut self, step: u64) -> Result<Vec<Vec<u8>>, RuntimeError> {
        self.worker.collect_reports(step)
    }

    /// This rank's parameters: (stage, name, values).
    pub fn local_params(&mut self) -> Result<Vec<(usize, String, Vec<f32>)>, RuntimeError> {
        self.settle()?;
        Ok(self.worker.params())
    }

    /// This rank's part of the training state (its stages' weights and AdamW state).
    pub(crate) fn export_local(&mut self) -> Result<Vec<StageState>, RuntimeError> {
        self.settle()?;
        self.worker.export_stages()
    }

    /// Loads this rank's stages from `state` by name; returns the names used.
    pub(crate) fn import_local(
        &mut self,
        state: &TrainingState,
    ) -> Result<BTreeSet<String>, RuntimeError> {
        self.settle()?;
        let r = self.worker.import_stages(state);
        if r.is_err() {
            self.failed = true;
        }
        r
    }

    /// The whole training state at `root` (gathered from replica 0), `None` elsewhere.
    /// `step` is the next step to run.
    pub fn export_state(
        &mut self,
        root: usize,
        step: u64,
    ) -> Result<Option<TrainingState>, RuntimeError> {
        let parts = if self.worker.replica() == 0 {
            self.export_local()?
        } else {
            self.settle()?;
            Vec::new()
        };
        let bytes = checkpoint::encode_parts(&parts);
        match self.worker.gather(root, bytes)? {
            None => Ok(None),
            Some(all) => {
                let mut parts = Vec::new();
                for b in all {
                    parts.extend(checkpoint::decode_parts(&b)?);
                }
                checkpoint::assemble(step, parts).map(Some)
            }
        }
    }

    /// Loads `state` (given at `root`; ignored elsewhere) into every rank. Errors name the
    /// missing, extra or misshapen parameter on every rank.
    pub fn import_state(
        &mut self,
        root: usize,
        state: Option<&TrainingState>,
    ) -> Result<u64, RuntimeError> {
        let bytes = match (self.worker.rank() == root, state) {
            (true, Some(s)) => checkpoint::encode_state(s),
            _ => Vec::new(),
        };
        let bytes = self.worker.broadcast(root, bytes)?;
        let state = checkpoint::decode_state(&bytes)?;
        let result = self.import_local(&state);
        // Every rank learns whether every rank succeeded, so none trains alone.
        let report = match &result {
            Ok(names) => serde_json::to_vec(&(names, None::<&RuntimeError>)),
            Err(e) => serde_json::to_vec(&(BTreeSet::<String>::new(), Some(e))),
        }
        .expect("serializes");
        let mut loaded = BTreeSet::new();
        for part in self.worker.all_gather(report)? {
            let (names, err): (BTreeSet<String>, Option<RuntimeError>) =
                serde_json::from_slice(&part)
                    .map_err(|e| RuntimeError::Fault(format!("damaged import report: {e}")))?;
            if let Some(err) = err {
                self.failed = true;
                return Err(err);
            }
            loaded.extend(names);
        }
        if loaded.len() != state.params.len() {
            self.failed = true;
            return Err(checkpoint::extra_params(&state.params, &loaded));
        }
        Ok(state.step)
    }

    /// Completes every send in flight (call before the process exits).
    pub fn flush(&mut self) -> Result<(), RuntimeError> {
        let rank = self.worker.rank();
        self.worker
            .flush()
            .map_err(|cause| RuntimeError::Transport {
                rank: Some(rank),
                cause,
            })
    }
}
