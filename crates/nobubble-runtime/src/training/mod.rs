//! The training loop every rank runs (`nobubble train`): start a [`Session`], optionally resume,
//! measure the validation loss, train, re-plan once on measured pass times, save checkpoints,
//! and report. It is SPMD: all ranks make the same calls in the same order, and only rank 0
//! talks to the user (through an [`Observer`]) and writes files.
//!
//! Nothing waits for a barrier between steps. Rank 0 builds each step's record (every rank's
//! timeline, memory and traffic) one step late from reports the others posted without
//! waiting (a step about to be saved at once: its log line comes before its checkpoint), and
//! under post-validation a step's loss and clip factor are only known when the next step
//! settles it — so consecutive iterations overlap.
//!
//! A running job is a `TrainingRun` (private) with one method per phase, so each phase reads
//! on its own and the order of the collectives is the order of the calls in [`run`]: start
//! and calibrate (`start`), the steps (`train`: step, checkpoint, re-plan, stop decision),
//! stop (`stop`), validate and report (`finish`). Records are `records.rs`, checkpoints `checkpoints.rs`, the stop
//! decision `stopping.rs`.

mod checkpoints;
mod records;
mod stopping;

pub use records::{measured_costs, mib};

use crate::error::RuntimeError;
use crate::launch::RankContext;
use crate::run::StepRecord;
use crate::session::{Plan, Session, SessionOptions};
use crate::worker::{CommStats, RankStep, StepSummary};
use nobubble_nn::config::StageLayout;
use nobubble_nn::Corpus;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A whole training job.
#[derive(Clone, Debug)]
pub struct TrainJob {
    /// Schedule, ranks, model, optimizer, compute.
    pub session: SessionOptions,
    /// Train up to this many steps in total.
    pub steps: u64,
    /// Re-plan automatic schedules after this many measured steps (0 = never).
    pub replan_after: u64,
    /// Held-out microbatch sets for the validation loss (0 = no validation loss).
    pub eval_sets: u64,
    /// Save a checkpoint here at the end (and every `save_every` steps).
    pub save: Option<PathBuf>,
    /// Save every N steps too (0 = only at the end).
    pub save_every: u64,
    /// Keep only the newest K step checkpoints of the run directory (0 = all).
    pub keep_last: usize,
    /// Continue from this checkpoint.
    pub resume: Option<PathBuf>,
    /// Start from the weights of this Hugging Face model directory (step 0, fresh optimizer
    /// state; the model config must be the directory's, see `checkpoint::hf::read_config`).
    pub init_from: Option<PathBuf>,
    /// Training data.
    pub corpus: Arc<Corpus>,
    /// The `tokenizer.json` the data was tokenized with (saved with every checkpoint);
    /// `None`: bytes are the token ids.
    pub tokenizer: Option<String>,
    /// Held-out text.
    pub eval: Arc<Corpus>,
    /// Set (to the signal's number) to ask the job to stop: rank 0's value is read between
    /// steps and agreed by every rank, so all stop after the same step. `None`: never asked.
    pub stop: Option<Arc<AtomicUsize>>,
    /// Stop after this many steps in a row with a non-finite loss (0 = never).
    pub max_nan_steps: u64,
    /// Let a save replace a checkpoint already in the run directory (`--overwrite`); checked
    /// again for the save of an interrupted run, whose step was not known in advance.
    pub overwrite: bool,
}

impl TrainJob {
    /// The signal this process was asked to stop by (0: none).
    pub fn stop_requested(&self) -> i32 {
        self.stop.as_ref().map_or(0, |f| {
            i32::try_from(f.load(Ordering::SeqCst)).unwrap_or(i32::MAX)
        })
    }
}

/// Why a job ended before `--steps`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stop {
    /// Asked to stop by this signal (SIGINT 2, SIGTERM 15).
    Signal(i32),
    /// The loss was not finite for this many steps in a row, ending at `last` (0-based).
    NonFinite {
        /// Consecutive non-finite steps.
        steps: u64,
        /// The last of them.
        last: u64,
    },
}

/// What rank 0 tells the user while a job runs.
pub trait Observer {
    /// A line of information (plans, memory, checkpoints, warnings).
    fn note(&mut self, text: &str);
    /// A finished step, with the schedule it ran under. An error stops the job (e.g. the log
    /// file cannot be written).
    fn step(&mut self, record: &StepRecord, schedule: &str) -> Result<(), String>;
    /// The plan now in use (at the start and after a re-plan).
    fn planned(&mut self, _plan: &Plan) {}
    /// Progress of a phase with a known length (`validation`): `done` of `total`.
    fn progress(&mut self, _phase: &str, _done: u64, _total: u64) {}
}

/// The final report of a job (rank 0).
#[derive(Clone, Debug)]
pub struct TrainReport {
    /// The step the job started at (after a resume) and the steps it trained.
    pub first_step: u64,
    /// Steps trained.
    pub trained: u64,
    /// Seconds from the first step to the end of the last.
    pub elapsed: f64,
    /// Tokens of one global step (all replicas).
    pub tokens_per_step: f64,
    /// Records of the steps run under the final plan (the first step of a job is left out as
    /// warm-up when there are others).
    pub tail: Vec<StepRecord>,
    /// The loss of the last step.
    pub final_loss: f32,
    /// Validation loss before training (or at the resumed step).
    pub validation_before: Option<f32>,
    /// Validation loss after training (not measured when the run was stopped early).
    pub validation_after: Option<f32>,
    /// The final plan.
    pub plan: Plan,
    /// The plan's schedule simulated with the median measured pass times.
    pub simulated: nobubble_schedule::Simulation,
    /// Communication of every rank over the whole job.
    pub comm: Vec<CommStats>,
    /// Mean wall time of a step (throughput view: overlapping iterations count once).
    pub wall_per_step: f64,
    /// The transport the ranks used.
    pub transport: String,
    /// Data-parallel replicas.
    pub replicas: usize,
    /// Why the job ended early, if it did.
    pub stopped: Option<Stop>,
    /// The step of the last checkpoint this job saved, if any.
    pub saved_at: Option<u64>,
}

/// A fault of this rank's own bookkeeping (data that does not encode or decode).
fn fail(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Fault(e.to_string())
}

/// Runs the job on this rank. Rank 0 returns the report; the others `None`.
pub fn run(
    job: &TrainJob,
    ctx: RankContext,
    observer: Option<&mut dyn Observer>,
) -> Result<Option<TrainReport>, RuntimeError> {
    let mut run = TrainingRun::start(job, ctx, observer)?;
    run.train()?;
    run.stop()?;
    run.finish()
}

/// One rank's job while it runs: the session and what its phases hand on to each other.
/// Every rank calls the same phases in the same order, so their collectives match.
struct TrainingRun<'j, 'o> {
    job: &'j TrainJob,
    session: Session,
    /// Rank 0's window to the user (`None` on the other ranks).
    observer: Option<&'o mut dyn Observer>,
    root: bool,
    /// Real compute (emulated runs have no loss to validate and no memory to show).
    real: bool,
    /// The step the job started at (after a resume).
    first_step: u64,
    validation_before: Option<f32>,
    /// Measured steps, kept only until the one re-plan that reads them.
    measured: Vec<RankStep>,
    /// Rank 0: steps run but not yet recorded: (step, wall seconds, schedule name).
    unrecorded: Vec<(u64, f64, String)>,
    summaries: BTreeMap<u64, StepSummary>,
    records: Vec<StepRecord>,
    replanned: bool,
    /// The first step run under the current plan.
    plan_first_step: u64,
    /// The plan the steps before a re-plan ran under, for a report with none after it.
    previous_plan: Option<Plan>,
    started: Instant,
    /// Seconds from the first step to the end of the last (set once the steps are over).
    elapsed: Option<f64>,
    stopped: Option<Stop>,
    saved_at: Option<u64>,
    /// The checkpoints this job resumed from and saved (steps, oldest first): `--keep-last`
    /// never deletes the newest one a later step trained on to a finite loss.
    saved: Vec<u64>,
    /// Rank 0: the largest stop signal in the reports it has read.
    remote_stop: i32,
}

impl<'j, 'o> TrainingRun<'j, 'o> {
    /// Start and calibrate: the session (planned, memory measured, re-planned on it), the
    /// resumed state, what start-up measured (rank 0), and the validation loss before
    /// training.
    fn start(
        job: &'j TrainJob,
        ctx: RankContext,
        observer: Option<&'o mut dyn Observer>,
    ) -> Result<Self, RuntimeError> {
        let session = Session::start(
            job.session.clone(),
            ctx,
            job.corpus.clone(),
            job.eval.clone(),
        )?;
        let mut run = TrainingRun {
            job,
            root: session.rank.rank() == 0,
            real: job.session.emulated.is_none(),
            session,
            observer,
            first_step: 0,
            validation_before: None,
            measured: Vec::new(),
            unrecorded: Vec::new(),
            summaries: BTreeMap::new(),
            records: Vec::new(),
            replanned: false,
            plan_first_step: 0,
            previous_plan: None,
            started: Instant::now(),
            elapsed: None,
            stopped: None,
            saved_at: None,
            saved: Vec::new(),
            remote_stop: 0,
        };
        run.check_same_data()?;
        if let Some(dir) = &job.resume {
            run.first_step = run.resume(dir)?;
            run.saved.push(run.first_step);
        } else if let Some(dir) = &job.init_from {
            run.init_from(dir)?;
        }
        run.session.step = run.first_step;
        run.plan_first_step = run.first_step;
        if run.real && run.root {
            run.note_calibration();
            run.note_free_memory_limit();
        }
        if let Some(o) = run.observer.as_deref_mut() {
            o.planned(&run.session.plan);
        }
        if run.real && job.eval_sets > 0 {
            run.validation_before = Some(run.validate()?);
        }
        run.started = Instant::now();
        Ok(run)
    }

    /// Rank 0: what start-up measured (activation memory) and planned (the layer split).
    fn note_calibration(&mut self) {
        let bytes: Vec<String> = self
            .session
            .stage_bytes
            .iter()
            .map(|(f, i)| format!("{}/{}", mib(*f as f64), mib(*i as f64)))
            .collect();
        self.note(&format!(
            "measured activation memory per stage (after F / after I): {}",
            bytes.join(", ")
        ));
        let split = match self.session.layout() {
            StageLayout::Explicit(counts) => {
                let counts: Vec<String> = counts.iter().map(|c| c.to_string()).collect();
                Some(counts.join(","))
            }
            _ => None,
        };
        if let Some(split) = split {
            self.note(&format!(
                "layer split (blocks per stage, planned on the model's FLOPs): {split}"
            ));
        }
    }

    /// The steps, each ended by rank 0's stop decision, which every rank reads before its
    /// next step. The last step's decision comes after the steps are finished
    /// ([`Self::finish_steps`]), when rank 0 has read every report, so that a stop asked for
    /// during the last step counts too.
    fn train(&mut self) -> Result<(), RuntimeError> {
        for step in self.first_step..self.job.steps {
            if let Some(reason) = self.stop_before(step)? {
                self.stopped = Some(reason);
                break;
            }
            self.step(step)?;
            self.checkpoint(step)?;
            self.replan(step)?;
            if step + 1 == self.job.steps {
                self.finish_steps()?;
            }
            self.post_stop_decision(step)?;
        }
        if self.elapsed.is_none() {
            // Stopped early, or there was no step to run.
            self.finish_steps()?;
        }
        Ok(())
    }

    /// One step: run it, file the summaries it settled, post this rank's report to rank 0
    /// and, at rank 0, record the steps that are complete.
    fn step(&mut self, step: u64) -> Result<(), RuntimeError> {
        // The steps a re-plan measures run without lent cores: their pass times are what
        // each rank does alone, as the planner models them.
        let measuring = self.measuring();
        self.session.rank.set_lending(!measuring);
        let t0 = Instant::now();
        let rs = self.session.step()?;
        let wall = t0.elapsed().as_secs_f64();
        for s in rs.summary.iter().chain(&rs.settled) {
            if self.root && !s.loss.is_finite() {
                self.warn_non_finite(s);
            }
            self.summaries.insert(s.step, *s);
        }
        let report = records::Report::of(&rs, self.job.stop_requested());
        self.session
            .rank
            .post_report(step, serde_json::to_vec(&report).map_err(fail)?)?;
        let schedule = self.session.plan.schedule.name.clone();
        self.unrecorded.push((step, wall, schedule));
        if measuring {
            self.measured.push(rs);
        }
        if self.root {
            // Record what is complete, one step late: the others posted their reports
            // without waiting; this only reads them.
            self.record_ready(step.saturating_sub(1))?;
        }
        Ok(())
    }

    /// Rank 0: a step's training loss is not finite.
    fn warn_non_finite(&mut self, s: &StepSummary) {
        let limit = if self.job.max_nan_steps > 0 {
            format!(
                " (the run stops after {} such steps in a row: --max-nan-steps)",
                self.job.max_nan_steps
            )
        } else {
            String::new()
        };
        self.note(&format!(
            "warning: step {}: the training loss is {}{limit}",
            s.step + 1,
            s.loss
        ));
    }

    /// Whether this step is one a re-plan will use: before the re-plan, of a schedule that is
    /// re-planned, in a run long enough to reach it ([`Self::replan`] skips the last step).
    fn measuring(&self) -> bool {
        !self.replanned
            && self.job.replan_after > 0
            && self.first_step + self.job.replan_after < self.job.steps
            && self.session.replans_on_measurements()
    }

    /// Re-plan: once, after `replan_after` measured steps (never after the last step), on
    /// the measured pass times and latency (a collective inside the session).
    fn replan(&mut self, step: u64) -> Result<(), RuntimeError> {
        let job = self.job;
        let measured = step + 1 - self.first_step;
        let last = step + 1 == job.steps;
        if self.replanned || last || job.replan_after == 0 || measured != job.replan_after {
            return Ok(());
        }
        self.replanned = true;
        let old = self.session.plan.clone();
        let fitted_before = self.session.free_memory_limit().is_some();
        let steps = std::mem::take(&mut self.measured);
        let Some(plan) = self.session.replan_on_measurements(&steps)? else {
            return Ok(());
        };
        let same = plan.schedule.orders == old.schedule.orders;
        self.note(&replan_note(job, &plan, same));
        if !fitted_before {
            self.note_free_memory_limit();
        }
        if !same {
            self.plan_first_step = step + 1;
            self.previous_plan = Some(old);
        }
        if let Some(o) = self.observer.as_deref_mut() {
            o.planned(&plan);
        }
        Ok(())
    }

    /// Validate: the validation loss, with progress shown at rank 0.
    fn validate(&mut self) -> Result<f32, RuntimeError> {
        let observer = &mut self.observer;
        self.session
            .validation_loss_with(self.job.eval_sets, &mut |done, total| {
                if let Some(o) = observer.as_deref_mut() {
                    o.progress("validation", done, total);
                }
            })
    }

    /// The end: the validation loss after training (not for a stopped run, which ends
    /// promptly), every rank's traffic all-gathered, and rank 0's report.
    fn finish(mut self) -> Result<Option<TrainReport>, RuntimeError> {
        let validation_after = if self.real && self.job.eval_sets > 0 && self.stopped.is_none() {
            Some(self.validate()?)
        } else {
            None
        };
        let totals = self
            .session
            .rank
            .all_gather(serde_json::to_vec(&self.session.rank.comm()).map_err(fail)?)?;
        self.session.rank.flush()?;
        if !self.root {
            return Ok(None);
        }
        let comm: Vec<CommStats> = totals
            .iter()
            .map(|b| serde_json::from_slice(b).map_err(fail))
            .collect::<Result<_, _>>()?;
        self.report(comm, validation_after).map(Some)
    }

    /// Rank 0's report: the steps under the final plan, simulated on their measured times.
    fn report(
        self,
        comm: Vec<CommStats>,
        validation_after: Option<f32>,
    ) -> Result<TrainReport, RuntimeError> {
        let records = &self.records;
        let plan_since = records
            .iter()
            .position(|r| r.step >= self.plan_first_step)
            .unwrap_or(records.len());
        // The first step of a job is warm-up (allocation, caches) when there are others.
        let skip = plan_since.max(1).min(records.len().saturating_sub(1));
        let tail = records[skip..].to_vec();
        // Stopped right after a re-plan, no step ran under the new plan: report the one that ran.
        let plan = match self.previous_plan {
            Some(p) if plan_since == records.len() => p,
            _ => self.session.plan.clone(),
        };
        let costs = measured_costs(&tail, &plan.costs);
        let simulated = nobubble_schedule::simulate(&plan.schedule, &costs).map_err(fail)?;
        let wall_per_step = tail.iter().map(|r| r.wall).sum::<f64>() / tail.len().max(1) as f64;
        let run = &self.job.session.run;
        let replicas = run.data_parallel.max(1);
        let model = &run.model;
        let tokens_per_step =
            (run.train.microbatches * replicas * model.microbatch_size * model.seq_len) as f64;
        Ok(TrainReport {
            first_step: self.first_step,
            trained: self.session.step - self.first_step,
            elapsed: self.elapsed.unwrap_or(0.0),
            tokens_per_step,
            final_loss: records.last().map_or(f32::NAN, |r| r.loss),
            validation_before: self.validation_before,
            validation_after,
            plan,
            saved_at: self.saved_at,
            simulated,
            comm,
            wall_per_step,
            transport: self.session.rank.transport(),
            replicas,
            tail,
            stopped: self.stopped,
        })
    }

    /// Rank 0: that the plan was fitted into the free memory, if it was (the user gave no
    /// limit and the schedule's own plan would not have fit).
    fn note_free_memory_limit(&mut self) {
        let Some(budgets) = self.session.free_memory_limit() else {
            return;
        };
        let all: Vec<String> = budgets.iter().map(|&b| mib(b)).collect();
        let each = if all.iter().all(|b| *b == all[0]) {
            format!("{} of activations per rank", all[0])
        } else {
            format!(
                "{} of activations on ranks 0 to {}",
                all.join(", "),
                budgets.len() - 1
            )
        };
        self.note(&format!(
            "the schedule's own plan would not fit in the memory free after measuring: \
             planned within {each} (four fifths of each rank's share, after \
             the optimizer state); --mem-limit sets a limit of your own"
        ));
    }

    /// A line for the user (rank 0; nothing elsewhere).
    fn note(&mut self, text: &str) {
        if let Some(o) = self.observer.as_deref_mut() {
            o.note(text);
        }
    }
}

/// What a re-plan found, for the user.
fn replan_note(job: &TrainJob, plan: &Plan, same: bool) -> String {
    let times: Vec<String> = plan
        .costs
        .stages
        .iter()
        .map(|c| format!("{:.2}/{:.2}/{:.2}", c.f, c.i, c.w))
        .collect();
    format!(
        "re-planned {} ({} placement, for the {}) on measured pass times (F/I/W ms per stage: {}; message latency {:.3} ms): simulated step {:.1} ms, bubble {:.1}%{}",
        job.session.kind.name(),
        match nobubble_schedule::Placement::of(&plan.schedule) {
            Some(nobubble_schedule::Placement::V) => "V",
            Some(nobubble_schedule::Placement::Linear) => "linear",
            None => "custom",
        },
        plan.costs.objective.name(),
        times.join(", "),
        plan.costs.comm,
        plan.simulated_makespan,
        100.0 * plan.simulated_bubble_fraction,
        if same { " (same order as before)" } else { "" }
    )
}
