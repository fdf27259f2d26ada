//! The coordinator: builds the stages, starts one worker thread per rank, runs training
//! steps under a schedule, and performs the synchronous optimizer step (global grad-norm
//! summed in stage order, clip, AdamW) exactly as the reference trainer does — which is
//! what makes pipelined training bit-identical to unpipelined training.

use crate::checkpoint::{self, StageState, TrainingState};
use crate::error::{nearest_cause, RuntimeError};
use crate::transport::InProcess;
use crate::worker::{Engine, Fault, MeasuredSlot, RankStep, Rollback, Verdict, Worker};
use nobubble_nn::config::block_counts;
use nobubble_nn::optim::{clip_scale, AdamW};
use nobubble_nn::{build_stages, ByteCorpus, GptConfig, StageLayout, TrainConfig};
use nobubble_schedule::{check_structure, check_weight_order, timing, Action, CostModel, Schedule};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Real compute on the model, or emulated passes that sleep for their cost.
#[derive(Clone, Debug)]
pub enum Compute {
    /// Train the GPT for real.
    Real,
    /// Sleep for each pass's cost in milliseconds (per schedule stage); messages are
    /// delayed by `comm_ms`.
    Emulated {
        /// Per-stage pass costs, in milliseconds.
        costs: CostModel,
    },
}

/// Everything a pipelined run needs besides the schedule.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The model.
    pub model: GptConfig,
    /// Seeds, microbatches, optimizer, clipping (`microbatches` must match the schedule).
    pub train: TrainConfig,
    /// How the model's blocks are spread over the schedule's stages.
    pub layout: StageLayout,
    /// Real or emulated compute.
    pub compute: Compute,
    /// How long a receive may wait before the run fails.
    pub recv_timeout: Duration,
    /// A fault to inject (tests).
    pub fault: Option<Fault>,
    /// Post-validated optimizer steps (optimistic step, later validation, rollback) instead
    /// of synchronous ones; `None` = synchronous.
    pub post_validate: Option<Rollback>,
}

/// What one pipelined step did, measured.
#[derive(Clone, Debug, Serialize)]
pub struct StepRecord {
    /// Step index.
    pub step: u64,
    /// Mean microbatch loss (summed in microbatch order, like the reference trainer).
    pub loss: f32,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Clip factor applied (1 = none; 0 when skipped).
    pub clip_scale: f32,
    /// Learning rate used.
    pub lr: f32,
    /// True when the gradients were non-finite and the update was skipped.
    pub skipped: bool,
    /// Measured actions per rank, seconds since the step started.
    pub timeline: Vec<Vec<MeasuredSlot>>,
    /// End of the last action.
    pub makespan: f64,
    /// Compute time per rank.
    pub busy: Vec<f64>,
    /// 1 − Σ busy / (ranks · makespan).
    pub bubble_fraction: f64,
    /// 1 − max busy / max span.
    pub bubble_rate: f64,
    /// Peak activation bytes per rank.
    pub peak_bytes: Vec<usize>,
    /// Wall time of the whole step, optimizer included.
    pub wall: f64,
}

enum Command {
    Step {
        step: u64,
        order: Arc<Vec<Action>>,
        epoch: Instant,
        eval: bool,
        lr: Option<f32>,
    },
    Validate(Verdict),
    Apply {
        scale: Option<f32>,
        lr: f32,
    },
    Params,
    Memory,
    ExportState,
    ImportState(Arc<TrainingState>),
    Stop,
}

enum Reply {
    Stepped(Result<RankStep, RuntimeError>),
    Applied(Result<(), RuntimeError>),
    Params(Vec<(usize, String, Vec<f32>)>),
    Memory(Result<Vec<(usize, usize, usize)>, RuntimeError>),
    Exported(Result<Vec<StageState>, RuntimeError>),
    Imported(Result<BTreeSet<String>, RuntimeError>),
}

/// A running pipeline: one worker thread per rank.
pub struct Pipeline {
    config: RunConfig,
    placement: Vec<usize>,
    commands: Vec<Sender<Command>>,
    replies: Receiver<(usize, Reply)>,
    handles: Vec<JoinHandle<()>>,
    abort: Arc<AtomicBool>,
    step: u64,
    failed: bool,
}

/// What the runtime needs of any schedule it runs: valid structure, weight gradients
/// accumulated in microbatch order (bit-identity), and the training's microbatch count.
fn check_runnable(schedule: &Schedule, microbatches: usize) -> Result<(), RuntimeError> {
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

/// Runs `f`, turning a panic into an error naming the rank, so the coordinator hears of it
/// at once instead of waiting out its guard.
fn guard<T>(rank: usize, f: impl FnOnce() -> Result<T, RuntimeError>) -> Result<T, RuntimeError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(RuntimeError::Panic {
            rank,
            action: None,
            cause: panic_message(&p),
        })
    })
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

impl Pipeline {
    /// Builds the stages for `schedule`'s placement and starts the workers, training on
    /// `corpus` (evaluation steps use the same text; see [`Pipeline::start_with_eval`]).
    pub fn start(
        config: RunConfig,
        schedule: &Schedule,
        corpus: ByteCorpus,
    ) -> Result<Pipeline, RuntimeError> {
        let eval = corpus.clone();
        Self::start_with_eval(config, schedule, corpus, eval)
    }

    /// As [`Pipeline::start`], with held-out text for [`Pipeline::eval_step`].
    pub fn start_with_eval(
        config: RunConfig,
        schedule: &Schedule,
        corpus: ByteCorpus,
        eval: ByteCorpus,
    ) -> Result<Pipeline, RuntimeError> {
        check_runnable(schedule, config.train.microbatches)?;
        let n = schedule.stages;
        let ranks = schedule.ranks;
        let mut engines: Vec<Engine> = Vec::with_capacity(ranks);
        let mut latency = Duration::ZERO;
        match &config.compute {
            Compute::Real => {
                let counts = block_counts(config.model.layers, n, &config.layout).map_err(|e| {
                    RuntimeError::Config(format!(
                        "cannot split {} layers into {n} stages: {e} (use more --layers or fewer stages)",
                        config.model.layers
                    ))
                })?;
                let mut stages = build_stages(&config.model, config.train.seed, &counts)
                    .map_err(|e| RuntimeError::Config(e.to_string()))?;
                let mut per_rank: Vec<BTreeMap<usize, _>> =
                    (0..ranks).map(|_| BTreeMap::new()).collect();
                for (s, mut st) in stages.drain(..).enumerate() {
                    st.set_loss_grad_scale(1.0 / config.train.microbatches as f32);
                    per_rank[schedule.placement[s]].insert(s, st);
                }
                for stages in per_rank {
                    let optimizers = stages
                        .iter()
                        .map(|(&s, st)| (s, AdamW::new(config.train.optimizer, &st.params())))
                        .collect();
                    engines.push(Engine::Real { stages, optimizers });
                }
            }
            Compute::Emulated { costs } => {
                if costs.stages.len() != n {
                    return Err(RuntimeError::Config(format!(
                        "emulated costs cover {} stages, the schedule has {n}",
                        costs.stages.len()
                    )));
                }
                latency = Duration::from_secs_f64(costs.comm / 1000.0);
                engines = (0..ranks)
                    .map(|_| Engine::Emulated(costs.clone()))
                    .collect();
            }
        }
        Self::spawn(
            config,
            schedule,
            engines,
            latency,
            Arc::new(corpus),
            Arc::new(eval),
        )
    }

    fn spawn(
        config: RunConfig,
        schedule: &Schedule,
        engines: Vec<Engine>,
        latency: Duration,
        corpus: Arc<ByteCorpus>,
        eval_corpus: Arc<ByteCorpus>,
    ) -> Result<Pipeline, RuntimeError> {
        let ranks = schedule.ranks;
        let transports = InProcess::connect(ranks, latency);
        let abort = Arc::new(AtomicBool::new(false));
        let (reply_tx, replies) = channel();
        let mut commands = Vec::with_capacity(ranks);
        let mut handles = Vec::with_capacity(ranks);
        for (rank, (engine, transport)) in engines.into_iter().zip(transports).enumerate() {
            let (tx, rx) = channel::<Command>();
            commands.push(tx);
            let mut worker = Worker {
                rank,
                placement: schedule.placement.clone(),
                engine,
                transport: Box::new(transport),
                mailbox: HashMap::new(),
                abort: abort.clone(),
                recv_timeout: config.recv_timeout,
                corpus: corpus.clone(),
                eval_corpus: eval_corpus.clone(),
                model: config.model.clone(),
                data_seed: config.train.data_seed,
                fault: config.fault.clone(),
                current: None,
                post_validate: config.post_validate,
                optimistic: BTreeMap::new(),
                optimistic_lr: 0.0,
            };
            let reply_tx: Sender<(usize, Reply)> = reply_tx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("rank-{rank}"))
                .spawn(move || {
                    while let Ok(cmd) = rx.recv() {
                        let reply = match cmd {
                            Command::Step {
                                step,
                                order,
                                epoch,
                                eval,
                                lr,
                            } => {
                                let r = catch_unwind(AssertUnwindSafe(|| {
                                    worker.run_step(step, &order, epoch, eval, lr)
                                }));
                                let r = r.unwrap_or_else(|p| {
                                    Err(RuntimeError::Panic {
                                        rank,
                                        action: worker.current.take(),
                                        cause: panic_message(&p),
                                    })
                                });
                                if let Err(e) = &r {
                                    if matches!(e, RuntimeError::Timeout { .. })
                                        && !worker.abort.load(Ordering::Relaxed)
                                    {
                                        // Let ranks waiting on the same missing message reach
                                        // their own deadlines first, so the report can name
                                        // the wait nearest the cause, not whichever thread the
                                        // OS happened to run first.
                                        std::thread::sleep(TIMEOUT_GRACE.min(worker.recv_timeout));
                                    }
                                    if !matches!(e, RuntimeError::Aborted { .. }) {
                                        worker.abort.store(true, Ordering::Relaxed);
                                    }
                                }
                                Reply::Stepped(r)
                            }
                            Command::Apply { scale, lr } => {
                                Reply::Applied(guard(rank, || worker.apply(scale, lr)))
                            }
                            Command::Validate(v) => {
                                Reply::Applied(guard(rank, || worker.validate(v)))
                            }
                            Command::Params => Reply::Params(worker.params()),
                            Command::Memory => Reply::Memory(worker.measure_memory()),
                            Command::ExportState => {
                                Reply::Exported(checkpoint::export_engine(&worker.engine))
                            }
                            Command::ImportState(state) => Reply::Imported(
                                checkpoint::import_engine(&mut worker.engine, &state),
                            ),
                            Command::Stop => break,
                        };
                        if reply_tx.send((rank, reply)).is_err() {
                            break;
                        }
                    }
                })
                .map_err(|e| RuntimeError::Config(format!("cannot start worker thread: {e}")))?;
            handles.push(handle);
        }
        Ok(Pipeline {
            placement: schedule.placement.clone(),
            config,
            commands,
            replies,
            handles,
            abort,
            step: 0,
            failed: false,
        })
    }

    /// Steps taken so far.
    pub fn steps_taken(&self) -> u64 {
        self.step
    }

    /// Learning rate at `step`: the reference trainer's schedule.
    pub fn lr_at(&self, step: u64) -> f32 {
        self.config.train.lr_at(step)
    }

    fn collect(&self, expect: usize) -> Result<Vec<(usize, Reply)>, RuntimeError> {
        // Workers bound their own waits; this only guards against a dead thread.
        let guard = self.config.recv_timeout * 2 + Duration::from_secs(30);
        let mut out = Vec::with_capacity(expect);
        while out.len() < expect {
            match self.replies.recv_timeout(guard) {
                Ok(r) => out.push(r),
                Err(_) => {
                    return Err(RuntimeError::Config(format!(
                        "{} of {expect} ranks did not answer within {:.0} s",
                        expect - out.len(),
                        guard.as_secs_f64()
                    )))
                }
            }
        }
        out.sort_by_key(|(r, _)| *r);
        Ok(out)
    }

    /// Runs one training step under `schedule` (same placement as at start).
    pub fn train_step(&mut self, schedule: &Schedule) -> Result<StepRecord, RuntimeError> {
        self.run(schedule, false)
    }

    /// Mean loss on held-out microbatch set `index` (data seed as in training, step index
    /// `index`), without changing the weights.
    pub fn eval_step(&mut self, schedule: &Schedule, index: u64) -> Result<f32, RuntimeError> {
        let saved = self.step;
        self.step = index;
        let r = self.run(schedule, true);
        self.step = saved;
        Ok(r?.loss)
    }

    fn run(&mut self, schedule: &Schedule, eval: bool) -> Result<StepRecord, RuntimeError> {
        if self.failed {
            return Err(RuntimeError::Config("this pipeline stopped after an earlier error; start a new run (a checkpoint saved before the error can be resumed)".into()));
        }
        if schedule.placement != self.placement {
            return Err(RuntimeError::Config(
                "a new schedule must keep the stage placement the pipeline was started with".into(),
            ));
        }
        check_runnable(schedule, self.config.train.microbatches)?;
        let wall = Instant::now();
        let step = self.step;
        let epoch = Instant::now();
        let post_validate = self.config.post_validate.is_some()
            && !eval
            && matches!(self.config.compute, Compute::Real);
        let optimistic_lr = post_validate.then(|| self.lr_at(step));
        for (r, tx) in self.commands.iter().enumerate() {
            let order = Arc::new(schedule.orders[r].clone());
            tx.send(Command::Step {
                step,
                order,
                epoch,
                eval,
                lr: optimistic_lr,
            })
            .map_err(|_| RuntimeError::Panic {
                rank: r,
                action: None,
                cause: "worker thread is gone".into(),
            })?;
        }
        let replies = self.collect(self.commands.len())?;
        let mut results = Vec::with_capacity(replies.len());
        let mut errors: Vec<RuntimeError> = Vec::new();
        for (_, reply) in replies {
            match reply {
                Reply::Stepped(Ok(r)) => results.push(r),
                Reply::Stepped(Err(e)) => errors.push(e),
                _ => {
                    return Err(RuntimeError::Config(
                        "internal: unexpected worker reply".into(),
                    ))
                }
            }
        }
        if let Some(e) = nearest_cause(errors) {
            self.failed = true;
            self.abort.store(true, Ordering::Relaxed);
            return Err(e);
        }
        // Loss: microbatch order; norm: stage order — as the reference trainer.
        let mut losses: Vec<(usize, f32)> = results
            .iter()
            .flat_map(|r| r.losses.iter().copied())
            .collect();
        losses.sort_by_key(|(j, _)| *j);
        let m = self.config.train.microbatches;
        let loss = (losses.iter().map(|&(_, l)| l as f64).sum::<f64>() / m as f64) as f32;
        let mut norms: Vec<(usize, f64)> = results
            .iter()
            .flat_map(|r| r.norm_sq.iter().copied())
            .collect();
        norms.sort_by_key(|(s, _)| *s);
        let norm_sq: f64 = norms.iter().map(|&(_, n)| n).sum();
        let lr = self.lr_at(step);
        let scale = match self.config.compute {
            _ if eval => None,
            Compute::Real => clip_scale(norm_sq, self.config.train.max_grad_norm).ok(),
            Compute::Emulated { .. } => Some(1.0),
        };
        for tx in &self.commands {
            let cmd = if post_validate {
                // The ranks already stepped optimistically; the full reduction decides.
                Command::Validate(match scale {
                    None => Verdict::Skip,
                    Some(x) if x < 1.0 => Verdict::Redo(x),
                    Some(_) => Verdict::Keep,
                })
            } else {
                Command::Apply { scale, lr }
            };
            let _ = tx.send(cmd);
        }
        for (rank, reply) in self.collect(self.commands.len())? {
            if let Reply::Applied(Err(e)) = reply {
                self.failed = true;
                return Err(RuntimeError::Config(format!(
                    "rank {rank}: optimizer step failed: {e}"
                )));
            }
        }
        if !eval {
            self.step += 1;
        }
        let timeline: Vec<Vec<MeasuredSlot>> = results.iter().map(|r| r.timeline.clone()).collect();
        let t = timing(&timeline, |s| (s.start, s.end));
        Ok(StepRecord {
            step,
            loss,
            grad_norm: norm_sq.sqrt(),
            clip_scale: scale.unwrap_or(0.0),
            lr,
            skipped: scale.is_none(),
            bubble_fraction: t.bubble_fraction,
            bubble_rate: t.bubble_rate,
            peak_bytes: results.iter().map(|r| r.peak_bytes).collect(),
            busy: t.busy,
            makespan: t.makespan,
            timeline,
            wall: wall.elapsed().as_secs_f64(),
        })
    }

    /// Measured M_B and M_W (bytes) of every stage, in stage order: `(after F, after I)`.
    /// Empty in emulated mode.
    pub fn measure_memory(&self) -> Result<Vec<(usize, usize)>, RuntimeError> {
        for tx in &self.commands {
            let _ = tx.send(Command::Memory);
        }
        let mut all = Vec::new();
        for (_, reply) in self.collect(self.commands.len())? {
            if let Reply::Memory(m) = reply {
                all.extend(m?);
            }
        }
        all.sort_by_key(|(s, _, _)| *s);
        Ok(all.into_iter().map(|(_, f, i)| (f, i)).collect())
    }

    /// All parameters, in stage order then each stage's own order: (name, values).
    pub fn params(&self) -> Result<Vec<(String, Vec<f32>)>, RuntimeError> {
        for tx in &self.commands {
            let _ = tx.send(Command::Params);
        }
        let mut all: Vec<(usize, String, Vec<f32>)> = Vec::new();
        for (_, reply) in self.collect(self.commands.len())? {
            if let Reply::Params(p) = reply {
                all.extend(p);
            }
        }
        all.sort_by_key(|(s, _, _)| *s);
        Ok(all.into_iter().map(|(_, n, v)| (n, v)).collect())
    }
}

impl Pipeline {
    /// Weights, AdamW state and step counter of every stage, by global parameter name
    /// (for checkpoints). Call between steps.
    pub fn export_state(&self) -> Result<TrainingState, RuntimeError> {
        for tx in &self.commands {
            let _ = tx.send(Command::ExportState);
        }
        let mut parts = Vec::new();
        for (_, reply) in self.collect(self.commands.len())? {
            match reply {
                Reply::Exported(p) => parts.extend(p?),
                _ => {
                    return Err(RuntimeError::Config(
                        "internal: unexpected worker reply".into(),
                    ))
                }
            }
        }
        checkpoint::assemble(self.step, parts)
    }

    /// Loads weights and AdamW state by parameter name into every stage (whatever split
    /// the state was exported from) and continues at `state.step`: the next step uses
    /// that step's data and learning rate. Errors name the missing, extra or misshapen
    /// parameter; after an error the pipeline refuses to train.
    pub fn import_state(&mut self, state: TrainingState) -> Result<(), RuntimeError> {
        let step = state.step;
        let shared = Arc::new(state);
        for tx in &self.commands {
            let _ = tx.send(Command::ImportState(shared.clone()));
        }
        let mut loaded = BTreeSet::new();
        let mut error = None;
        for (_, reply) in self.collect(self.commands.len())? {
            match reply {
                Reply::Imported(Ok(names)) => loaded.extend(names),
                Reply::Imported(Err(e)) => error = error.or(Some(e)),
                _ => {
                    error = error.or(Some(RuntimeError::Config(
                        "internal: unexpected worker reply".into(),
                    )))
                }
            }
        }
        if error.is_none() && loaded.len() != shared.params.len() {
            error = Some(checkpoint::extra_params(&shared.params, &loaded));
        }
        if let Some(e) = error {
            self.failed = true;
            return Err(e);
        }
        self.step = step;
        Ok(())
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.abort.store(true, Ordering::Relaxed);
        for tx in &self.commands {
            let _ = tx.send(Command::Stop);
        }
        // Join the workers that stop; a worker stuck in a pass that cannot be interrupted
        // is left behind rather than hanging the caller (it ends with the process).
        let grace = Instant::now() + Duration::from_secs(2);
        for h in self.handles.drain(..) {
            while !h.is_finished() && Instant::now() < grace {
                std::thread::sleep(Duration::from_millis(5));
            }
            if h.is_finished() {
                let _ = h.join();
            }
        }
    }
}

/// How long a rank that timed out waits before stopping the others.
const TIMEOUT_GRACE: Duration = Duration::from_millis(250);
