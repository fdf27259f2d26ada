//! The in-process runtime driven step by step: one thread per rank, each running the SPMD
//! [`Rank`] program over channels. The driver only hands every thread the next step and
//! collects what they measured — losses, clip factors and the optimizer step are decided by
//! the ranks among themselves, exactly as in an MPI job. (Free-running training, where no
//! thread waits for a driver between steps, is [`crate::launch`].)

use crate::checkpoint::TrainingState;
use crate::error::{nearest_cause, RuntimeError};
use crate::rank::Rank;
use crate::transport::InProcess;
use crate::worker::{RankStep, StepSummary};
use nobubble_nn::Corpus;
use nobubble_schedule::Schedule;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The run types were defined here; their old paths still work.
pub use crate::run::{Compute, RunConfig, StepRecord};

enum Command {
    Step {
        step: u64,
        schedule: Arc<Schedule>,
        eval: bool,
    },
    Settle,
    Params,
    Memory,
    Export(u64),
    Import(Option<Arc<TrainingState>>),
    Stop,
}

enum Reply {
    Stepped(Result<RankStep, RuntimeError>),
    Settled(Result<Option<StepSummary>, RuntimeError>),
    Params(Result<Vec<(usize, String, Vec<f32>)>, RuntimeError>),
    Memory(Result<Vec<(usize, usize)>, RuntimeError>),
    Exported(Result<Option<TrainingState>, RuntimeError>),
    Imported(Result<u64, RuntimeError>),
}

/// A running in-process pipeline: one thread per rank (ranks × data-parallel replicas).
pub struct Pipeline {
    config: RunConfig,
    commands: Vec<Sender<Command>>,
    replies: Receiver<(usize, Reply)>,
    handles: Vec<JoinHandle<()>>,
    abort: Arc<AtomicBool>,
    step: u64,
    failed: bool,
}

/// Runs `f` on `rank` under [`crate::launch::guard`].
fn guarded<T>(
    rank: &mut Rank,
    abort: &AtomicBool,
    f: impl FnOnce(&mut Rank) -> Result<T, RuntimeError>,
) -> Result<T, RuntimeError> {
    let id = rank.rank();
    crate::launch::guard(id, abort, || f(rank))
}

impl Pipeline {
    /// Builds the stages for `schedule`'s placement and starts the ranks, training on
    /// `corpus` (evaluation steps use the same text; see [`Pipeline::start_with_eval`]).
    pub fn start(
        config: RunConfig,
        schedule: &Schedule,
        corpus: Corpus,
    ) -> Result<Pipeline, RuntimeError> {
        let eval = corpus.clone();
        Self::start_with_eval(config, schedule, corpus, eval)
    }

    /// As [`Pipeline::start`], with held-out text for [`Pipeline::eval_step`].
    pub fn start_with_eval(
        config: RunConfig,
        schedule: &Schedule,
        corpus: Corpus,
        eval: Corpus,
    ) -> Result<Pipeline, RuntimeError> {
        let world = schedule.ranks * config.data_parallel.max(1);
        let (corpus, eval) = (Arc::new(corpus), Arc::new(eval));
        let abort = Arc::new(AtomicBool::new(false));
        let origin = Instant::now();
        let real = matches!(config.compute, crate::run::Compute::Real);
        let lender = crate::launch::lender_for(world, config.train.threads, real);
        let mut ranks = Vec::with_capacity(world);
        for t in InProcess::connect(world) {
            let ctx = crate::launch::RankContext {
                transport: Box::new(t),
                origin,
                abort: abort.clone(),
                lender: lender.clone(),
            };
            ranks.push(Rank::new(
                &config,
                schedule,
                ctx,
                corpus.clone(),
                eval.clone(),
            )?);
        }
        let (reply_tx, replies) = channel();
        let mut commands = Vec::with_capacity(world);
        let mut handles = Vec::with_capacity(world);
        for mut rank in ranks {
            let (tx, rx) = channel::<Command>();
            commands.push(tx);
            let reply_tx: Sender<(usize, Reply)> = reply_tx.clone();
            let abort = abort.clone();
            let id = rank.rank();
            let handle = std::thread::Builder::new()
                .name(format!("rank-{id}"))
                .spawn(move || {
                    while let Ok(cmd) = rx.recv() {
                        let r = &mut rank;
                        let reply = match cmd {
                            Command::Step {
                                step,
                                schedule,
                                eval,
                            } => Reply::Stepped(guarded(r, &abort, |r| {
                                r.step(&schedule, step, eval)
                            })),
                            Command::Settle => Reply::Settled(guarded(r, &abort, Rank::settle)),
                            Command::Params => {
                                Reply::Params(guarded(r, &abort, Rank::local_params))
                            }
                            Command::Memory => {
                                Reply::Memory(guarded(r, &abort, Rank::measure_memory))
                            }
                            Command::Export(step) => {
                                Reply::Exported(guarded(r, &abort, |r| r.export_state(0, step)))
                            }
                            Command::Import(state) => Reply::Imported(guarded(r, &abort, |r| {
                                r.import_state(0, state.as_deref())
                            })),
                            Command::Stop => break,
                        };
                        if reply_tx.send((id, reply)).is_err() {
                            break;
                        }
                    }
                })
                .map_err(|e| RuntimeError::Transport {
                    rank: None,
                    cause: format!("cannot start worker thread: {e}"),
                })?;
            handles.push(handle);
        }
        Ok(Pipeline {
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

    /// Sends `cmd` to every rank and collects the replies in rank order; the first error,
    /// chosen as nearest the cause, fails the pipeline.
    fn all<T>(
        &mut self,
        cmd: impl Fn() -> Command,
        unpack: impl Fn(Reply) -> Option<Result<T, RuntimeError>>,
    ) -> Result<Vec<T>, RuntimeError> {
        if self.failed {
            return Err(RuntimeError::Fault("this pipeline stopped after an earlier error; start a new run (a checkpoint saved before the error can be resumed)".into()));
        }
        for (r, tx) in self.commands.iter().enumerate() {
            tx.send(cmd()).map_err(|_| RuntimeError::Panic {
                rank: r,
                action: None,
                cause: "worker thread is gone".into(),
            })?;
        }
        // Ranks bound their own waits; this only guards against a dead thread.
        let guard = self.config.recv_timeout * 2 + Duration::from_secs(30);
        let n = self.commands.len();
        let mut got: Vec<(usize, Reply)> = Vec::with_capacity(n);
        while got.len() < n {
            match self.replies.recv_timeout(guard) {
                Ok(r) => got.push(r),
                Err(_) => {
                    self.failed = true;
                    return Err(RuntimeError::Fault(format!(
                        "{} of {n} ranks did not answer within {:.0} s",
                        n - got.len(),
                        guard.as_secs_f64()
                    )));
                }
            }
        }
        got.sort_by_key(|(r, _)| *r);
        let mut out = Vec::with_capacity(n);
        let mut errors = Vec::new();
        for (_, reply) in got {
            match unpack(reply) {
                Some(Ok(v)) => out.push(v),
                Some(Err(e)) => errors.push(e),
                None => errors.push(RuntimeError::Fault(
                    "internal: unexpected worker reply".into(),
                )),
            }
        }
        if let Some(e) = nearest_cause(errors) {
            self.failed = true;
            self.abort.store(true, Ordering::Relaxed);
            return Err(e);
        }
        Ok(out)
    }

    /// Runs one training step under `schedule` (same placement as at start). With
    /// post-validation the driver then waits for the verdict (every thread settles), so the
    /// record is complete; free-running ranks ([`crate::launch`]) settle at the next step.
    pub fn train_step(&mut self, schedule: &Schedule) -> Result<StepRecord, RuntimeError> {
        self.run(schedule, false)
    }

    /// Runs `n` training steps without settling post-validated steps in between: each step's
    /// forwards run speculatively on the previous step's optimistic weights, as in a
    /// free-running job, and a rolled-back step's forwards are redone. (Synchronous steps are
    /// unaffected.) The records come in step order once the last step is settled.
    pub fn train_steps_overlapped(
        &mut self,
        schedule: &Schedule,
        n: usize,
    ) -> Result<Vec<StepRecord>, RuntimeError> {
        let shared = Arc::new(schedule.clone());
        let mut runs = Vec::with_capacity(n);
        let mut summaries = std::collections::BTreeMap::new();
        for _ in 0..n {
            let step = self.step;
            let wall = Instant::now();
            let reports = self.all(
                || Command::Step {
                    step,
                    schedule: shared.clone(),
                    eval: false,
                },
                |r| match r {
                    Reply::Stepped(r) => Some(r),
                    _ => None,
                },
            )?;
            summaries.extend(
                reports[0]
                    .summary
                    .iter()
                    .chain(&reports[0].settled)
                    .map(|s| (s.step, *s)),
            );
            runs.push((step, reports, wall.elapsed().as_secs_f64()));
            self.step += 1;
        }
        let last = self.all(
            || Command::Settle,
            |r| match r {
                Reply::Settled(r) => Some(r),
                _ => None,
            },
        )?;
        if let Some(s) = last[0] {
            summaries.insert(s.step, s);
        }
        runs.into_iter()
            .map(|(step, reports, wall)| {
                let s = summaries.get(&step).ok_or_else(|| {
                    RuntimeError::Fault(format!("internal: step {step} was never settled"))
                })?;
                Ok(StepRecord::assemble(s, &reports, wall))
            })
            .collect()
    }

    /// Mean loss on held-out microbatch set `index` (data seed as in training, step index
    /// `index`), without changing the weights.
    pub fn eval_step(&mut self, schedule: &Schedule, index: u64) -> Result<f32, RuntimeError> {
        Ok(self.run_at(schedule, index, true)?.loss)
    }

    fn run(&mut self, schedule: &Schedule, eval: bool) -> Result<StepRecord, RuntimeError> {
        let r = self.run_at(schedule, self.step, eval)?;
        self.step += 1;
        Ok(r)
    }

    fn run_at(
        &mut self,
        schedule: &Schedule,
        step: u64,
        eval: bool,
    ) -> Result<StepRecord, RuntimeError> {
        let wall = Instant::now();
        let shared = Arc::new(schedule.clone());
        let reports = self.all(
            || Command::Step {
                step,
                schedule: shared.clone(),
                eval,
            },
            |r| match r {
                Reply::Stepped(r) => Some(r),
                _ => None,
            },
        )?;
        let summary = match reports[0].summary {
            Some(s) => s,
            None => self
                .all(
                    || Command::Settle,
                    |r| match r {
                        Reply::Settled(r) => Some(r),
                        _ => None,
                    },
                )?
                .remove(0)
                .ok_or_else(|| RuntimeError::Fault("internal: nothing to settle".into()))?,
        };
        Ok(StepRecord::assemble(
            &summary,
            &reports,
            wall.elapsed().as_secs_f64(),
        ))
    }

    /// Measured M_B and M_W (bytes) of every stage, in stage order: `(after F, after I)`.
    /// Empty in emulated mode.
    pub fn measure_memory(&mut self) -> Result<Vec<(usize, usize)>, RuntimeError> {
        Ok(self
            .all(
                || Command::Memory,
                |r| match r {
                    Reply::Memory(m) => Some(m),
                    _ => None,
                },
            )?
            .remove(0))
    }

    /// All parameters of replica 0, in stage order then each stage's own order:
    /// (name, values).
    pub fn params(&mut self) -> Result<Vec<(String, Vec<f32>)>, RuntimeError> {
        let ranks = self.commands.len() / self.config.data_parallel.max(1);
        let mut all: Vec<(usize, String, Vec<f32>)> = self
            .all(
                || Command::Params,
                |r| match r {
                    Reply::Params(p) => Some(p),
                    _ => None,
                },
            )?
            .into_iter()
            .take(ranks)
            .flatten()
            .collect();
        all.sort_by_key(|(s, _, _)| *s);
        Ok(all.into_iter().map(|(_, n, v)| (n, v)).collect())
    }

    /// Weights, AdamW state and step counter of every stage, by global parameter name
    /// (for checkpoints). Call between steps.
    pub fn export_state(&mut self) -> Result<TrainingState, RuntimeError> {
        let step = self.step;
        self.all(
            || Command::Export(step),
            |r| match r {
                Reply::Exported(s) => Some(s),
                _ => None,
            },
        )?
        .remove(0)
        .ok_or_else(|| RuntimeError::Fault("internal: rank 0 exported nothing".into()))
    }

    /// Loads weights and AdamW state by parameter name into every stage (whatever split
    /// the state was exported from) and continues at `state.step`: the next step uses
    /// that step's data and learning rate. Errors name the missing, extra or misshapen
    /// parameter; after an error the pipeline refuses to train.
    pub fn import_state(&mut self, state: TrainingState) -> Result<(), RuntimeError> {
        let step = state.step;
        let shared = Arc::new(state);
        self.all(
            || Command::Import(Some(shared.clone())),
            |r| match r {
                Reply::Imported(s) => Some(s),
                _ => None,
            },
        )?;
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
