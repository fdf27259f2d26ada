//! The training loop every rank runs (`nobubble train`): start a [`Session`], optionally resume,
//! measure the validation loss, train, re-plan once on measured pass times, save checkpoints,
//! and report. It is SPMD: all ranks make the same calls in the same order, and only rank 0
//! talks to the user (through an [`Observer`]) and writes files.
//!
//! Nothing waits for a barrier between steps. Rank 0 builds each step's record (every rank's
//! timeline, memory and traffic) one step late from reports the others posted without
//! waiting, and under post-validation a step's loss and clip factor are only known when the
//! next step settles it — so consecutive iterations overlap.

use crate::checkpoint::{corpus_fingerprint, fs as checkpoint_fs, Checkpoint};
use crate::error::RuntimeError;
use crate::launch::RankContext;
use crate::run::StepRecord;
use crate::session::{median_pass_ms, Plan, Session, SessionOptions};
use crate::worker::{CommStats, MeasuredSlot, RankStep, StepSummary};
use nobubble_nn::config::StageLayout;
use nobubble_nn::ByteCorpus;
use nobubble_schedule::{Action, CostModel, Kind, RankCost};
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
    /// Training text.
    pub corpus: Arc<ByteCorpus>,
    /// Held-out text.
    pub eval: Arc<ByteCorpus>,
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

/// One rank's share of a step's record, posted to rank 0.
#[derive(Serialize, Deserialize)]
struct Report {
    timeline: Vec<(usize, char, usize, f64, f64, f64)>,
    peak_bytes: usize,
    comm: CommStats,
    /// The signal this rank was asked to stop by (0: none), for rank 0 to act on.
    stop: i32,
}

impl Report {
    fn of(r: &RankStep, stop: i32) -> Report {
        Report {
            stop,
            timeline: r
                .timeline
                .iter()
                .map(|s| {
                    (
                        s.action.stage,
                        s.action.kind.letter(),
                        s.action.microbatch,
                        s.start,
                        s.end,
                        s.waited,
                    )
                })
                .collect(),
            peak_bytes: r.peak_bytes,
            comm: r.comm,
        }
    }

    fn into_rank_step(self) -> Result<RankStep, RuntimeError> {
        let timeline = self
            .timeline
            .into_iter()
            .map(|(stage, k, mb, start, end, waited)| {
                let kind = Kind::from_letter(k).ok_or_else(|| {
                    RuntimeError::Config(format!("damaged step report: pass kind {k}"))
                })?;
                Ok(MeasuredSlot {
                    action: Action::new(stage, kind, mb),
                    start,
                    end,
                    waited,
                })
            })
            .collect::<Result<_, RuntimeError>>()?;
        Ok(RankStep {
            timeline,
            peak_bytes: self.peak_bytes,
            summary: None,
            settled: Vec::new(),
            comm: self.comm,
        })
    }
}

fn fail(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Config(e.to_string())
}

/// Runs the job on this rank. Rank 0 returns the report; the others `None`.
pub fn run(
    job: &TrainJob,
    ctx: RankContext,
    mut observer: Option<&mut dyn Observer>,
) -> Result<Option<TrainReport>, RuntimeError> {
    let mut session = Session::start(
        job.session.clone(),
        ctx,
        job.corpus.clone(),
        job.eval.clone(),
    )?;
    let root = session.rank.rank() == 0;
    let real = job.session.emulated.is_none();
    let note = |o: &mut Option<&mut dyn Observer>, text: String| {
        if let Some(o) = o.as_deref_mut() {
            o.note(&text);
        }
    };
    let first_step = match &job.resume {
        Some(dir) => resume(&mut session, job, dir, &mut observer)?,
        None => 0,
    };
    session.step = first_step;
    if real && root {
        let bytes: Vec<String> = session
            .stage_bytes
            .iter()
            .map(|(f, i)| format!("{}/{}", mib(*f as f64), mib(*i as f64)))
            .collect();
        note(
            &mut observer,
            format!(
                "measured activation memory per stage (after F / after I): {}",
                bytes.join(", ")
            ),
        );
        if let StageLayout::Explicit(counts) = session.layout() {
            let counts: Vec<String> = counts.iter().map(|c| c.to_string()).collect();
            note(
                &mut observer,
                format!(
                    "layer split (blocks per stage, planned on the model's FLOPs): {}",
                    counts.join(",")
                ),
            );
        }
    }
    if let Some(o) = observer.as_deref_mut() {
        o.planned(&session.plan);
    }
    let val_before = if real && job.eval_sets > 0 {
        Some(validation(&mut session, job.eval_sets, &mut observer)?)
    } else {
        None
    };
    let replicas = job.session.run.data_parallel.max(1);
    let model = &job.session.run.model;
    let tokens_per_step =
        (job.session.run.train.microbatches * replicas * model.microbatch_size * model.seq_len)
            as f64;
    let mut local: Vec<RankStep> = Vec::new();
    // Rank 0: steps run but not yet recorded: (step, wall seconds, schedule name).
    let mut unrecorded: Vec<(u64, f64, String)> = Vec::new();
    let mut summaries: BTreeMap<u64, StepSummary> = BTreeMap::new();
    let mut records: Vec<StepRecord> = Vec::new();
    let mut replanned = false;
    let mut plan_first_step = first_step;
    let started = Instant::now();
    let mut stopped = None;
    let mut saved_at = None;
    let mut remote_stop = 0;
    // The plan the steps before a re-plan ran under, for a report with none after it.
    let mut previous_plan: Option<Plan> = None;
    for step in first_step..job.steps {
        if let Some(reason) = stop_before(&mut session, job, step, first_step, &summaries)? {
            stopped = Some(reason);
            break;
        }
        let t0 = Instant::now();
        let rs = session.step()?;
        let wall = t0.elapsed().as_secs_f64();
        for s in rs.summary.iter().chain(&rs.settled) {
            if root && !s.loss.is_finite() {
                note(
                    &mut observer,
                    format!(
                        "warning: step {}: the training loss is {}{}",
                        s.step + 1,
                        s.loss,
                        if job.max_nan_steps > 0 {
                            format!(
                                " (the run stops after {} such steps in a row: --max-nan-steps)",
                                job.max_nan_steps
                            )
                        } else {
                            String::new()
                        }
                    ),
                );
            }
            summaries.insert(s.step, *s);
        }
        let report = Report::of(&rs, job.stop_requested());
        session
            .rank
            .post_report(step, serde_json::to_vec(&report).map_err(fail)?)?;
        unrecorded.push((step, wall, session.plan.schedule.name.clone()));
        if !replanned && job.replan_after > 0 {
            // Kept only until the one re-plan that reads them.
            local.push(rs);
        }
        if root {
            // Record what is complete, one step late: the others posted their reports
            // without waiting; this only reads them.
            record_ready(
                &mut session,
                &mut unrecorded,
                &summaries,
                &mut records,
                step.saturating_sub(1),
                &mut observer,
                &mut remote_stop,
            )?;
        }
        let last = step + 1 == job.steps;
        if let Some(dir) = &job.save {
            if last || (job.save_every > 0 && (step + 1) % job.save_every == 0) {
                // Every rank knows the step's loss (post-validation: once settled), so all
                // refuse alike to save a diverged state as the newest checkpoint.
                settle_into(&mut session, &mut summaries)?;
                if let Some(s) = summaries.get(&step).filter(|s| !s.loss.is_finite()) {
                    return Err(RuntimeError::Config(format!(
                        "not saving step {}: the training loss is {} (the run diverged; lower \
                         --lr or keep --max-grad-norm); the checkpoints already saved are kept",
                        step + 1,
                        s.loss
                    )));
                }
                save(&mut session, job, dir, &mut observer)?;
                saved_at = Some(step + 1);
            }
        }
        let measured = step + 1 - first_step;
        if !replanned && !last && job.replan_after > 0 && measured == job.replan_after {
            replanned = true;
            let before = session.plan.schedule.orders.clone();
            let old = session.plan.clone();
            let plan = session.replan_on_measurements(&local)?;
            local = Vec::new();
            if let Some(plan) = plan {
                let times: Vec<String> = plan
                    .costs
                    .stages
                    .iter()
                    .map(|c| format!("{:.2}/{:.2}/{:.2}", c.f, c.i, c.w))
                    .collect();
                let same = plan.schedule.orders == before;
                note(
                    &mut observer,
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
                    ),
                );
                if !same {
                    plan_first_step = step + 1;
                    previous_plan = Some(old);
                }
                if let Some(o) = observer.as_deref_mut() {
                    o.planned(&plan);
                }
            }
        }
        if job.stop.is_some() && root && !last {
            // Last in the step (after its collectives, so that an error in them is every
            // rank's): rank 0 asks every rank to stop after this step if it, or any rank
            // whose report it has read, was asked to.
            let sig = job.stop_requested().max(remote_stop);
            session
                .rank
                .post_decision(step, sig.to_le_bytes().to_vec())?;
        }
    }
    // The last post-validated step is settled here (unless a checkpoint already did), and
    // rank 0 records every step, reading the last step's reports too.
    settle_into(&mut session, &mut summaries)?;
    let elapsed = started.elapsed().as_secs_f64();
    if root {
        record_ready(
            &mut session,
            &mut unrecorded,
            &summaries,
            &mut records,
            u64::MAX,
            &mut observer,
            &mut remote_stop,
        )?;
    }
    if stopped.is_none() && job.stop.is_some() && session.step > first_step {
        // A stop asked for during the last step (of rank 0, or of any rank: every report is
        // read now): nothing is left to skip but the final validation, and the exit status
        // says the run was interrupted.
        if root {
            let sig = job.stop_requested().max(remote_stop);
            session
                .rank
                .post_decision(session.step - 1, sig.to_le_bytes().to_vec())?;
        }
        let sig = decision(session.rank.read_decision(session.step - 1)?)?;
        if sig != 0 {
            stopped = Some(Stop::Signal(sig));
        }
    }
    if let Some(reason) = stopped {
        if root {
            let why = match reason {
                Stop::Signal(sig) => format!("signal {sig}"),
                Stop::NonFinite { steps, .. } => format!("{steps} non-finite losses in a row"),
            };
            note(
                &mut observer,
                format!("stopping after step {} ({why})", session.step),
            );
        }
        // An interrupted run keeps what it trained: saved like a last step (a diverged one
        // is not saved; the checkpoints already there are kept).
        if let (Stop::Signal(_), Some(dir)) = (reason, &job.save) {
            let done = session.step;
            let diverged = summaries
                .get(&done.wrapping_sub(1))
                .is_some_and(|s| !s.loss.is_finite());
            if done > first_step && saved_at != Some(done) {
                // The step was not known when the flags were checked: check it now, at
                // rank 0, and tell every rank.
                let mut refusal = String::new();
                if root {
                    if diverged {
                        refusal = format!(
                            "not saving step {done}: its training loss is not finite (the \
                             checkpoints already saved are kept)"
                        );
                    } else if let Err(e) =
                        checkpoint_fs::check_run_steps(dir, |k| k == done, job.overwrite)
                    {
                        refusal = format!("not saving step {done}: --save: {e}");
                    }
                }
                let refusal = session.rank.broadcast(0, refusal.into_bytes())?;
                if refusal.is_empty() {
                    save(&mut session, job, dir, &mut observer)?;
                    saved_at = Some(done);
                } else {
                    note(&mut observer, String::from_utf8_lossy(&refusal).into());
                }
            }
        }
    }
    // A stopped run ends promptly: no second validation pass.
    let val_after = if real && job.eval_sets > 0 && stopped.is_none() {
        Some(validation(&mut session, job.eval_sets, &mut observer)?)
    } else {
        None
    };
    let totals = session
        .rank
        .all_gather(serde_json::to_vec(&session.rank.comm()).map_err(fail)?)?;
    session.rank.flush()?;
    if !root {
        return Ok(None);
    }
    let comm: Vec<CommStats> = totals
        .iter()
        .map(|b| serde_json::from_slice(b).map_err(fail))
        .collect::<Result<_, _>>()?;
    let plan_since = records
        .iter()
        .position(|r| r.step >= plan_first_step)
        .unwrap_or(records.len());
    // The first step of a job is warm-up (allocation, caches) when there are others.
    let skip = plan_since.max(1).min(records.len().saturating_sub(1));
    let tail = records[skip..].to_vec();
    // Stopped right after a re-plan, no step ran under the new plan: report the one that ran.
    let plan = match previous_plan {
        Some(p) if plan_since == records.len() => p,
        _ => session.plan.clone(),
    };
    let costs = measured_costs(&tail, &plan.costs);
    let simulated = nobubble_schedule::simulate(&plan.schedule, &costs).map_err(fail)?;
    let wall_per_step = tail.iter().map(|r| r.wall).sum::<f64>() / tail.len().max(1) as f64;
    Ok(Some(TrainReport {
        first_step,
        trained: session.step - first_step,
        elapsed,
        tokens_per_step,
        final_loss: records.last().map_or(f32::NAN, |r| r.loss),
        validation_before: val_before,
        validation_after: val_after,
        plan,
        saved_at,
        simulated,
        comm,
        wall_per_step,
        transport: session.rank.transport(),
        replicas,
        tail,
        stopped,
    }))
}

/// The validation loss, with progress shown at rank 0.
fn validation(
    session: &mut Session,
    sets: u64,
    observer: &mut Option<&mut dyn Observer>,
) -> Result<f32, RuntimeError> {
    session.validation_loss_with(sets, &mut |done, total| {
        if let Some(o) = observer.as_deref_mut() {
            o.progress("validation", done, total);
        }
    })
}

fn decision(bytes: Vec<u8>) -> Result<i32, RuntimeError> {
    Ok(i32::from_le_bytes(
        bytes
            .try_into()
            .map_err(|_| fail("damaged stop decision"))?,
    ))
}

/// Whether every rank stops before `step`, decided alike on all ranks.
///
/// A signal reaches the processes of a job at different moments, or only some of them, so
/// rank 0 decides: at the end of each step it posts whether it, or any rank whose step report
/// it has read, was asked to stop, and every rank reads that before its next step. No rank
/// waits for it in practice: its next step's first pass needs rank 0's next forward anyway.
/// Non-finite losses are in every rank's step summaries, so each counts them itself.
fn stop_before(
    session: &mut Session,
    job: &TrainJob,
    step: u64,
    first_step: u64,
    summaries: &BTreeMap<u64, StepSummary>,
) -> Result<Option<Stop>, RuntimeError> {
    if job.max_nan_steps > 0 {
        let mut run = 0;
        let mut last = None;
        for (k, s) in summaries.range(first_step..step).rev() {
            if s.loss.is_finite() {
                break;
            }
            last.get_or_insert(*k);
            run += 1;
        }
        if run >= job.max_nan_steps {
            return Ok(Some(Stop::NonFinite {
                steps: run,
                last: last.unwrap_or(step),
            }));
        }
    }
    if job.stop.is_none() || step == first_step {
        return Ok(None);
    }
    let sig = decision(session.rank.read_decision(step - 1)?)?;
    Ok((sig != 0).then_some(Stop::Signal(sig)))
}

/// Settles a pending post-validated step and files every summary settled since the last step
/// (a checkpoint export settles too).
fn settle_into(
    session: &mut Session,
    summaries: &mut BTreeMap<u64, StepSummary>,
) -> Result<(), RuntimeError> {
    session.rank.settle()?;
    summaries.extend(session.rank.take_settled().into_iter().map(|s| (s.step, s)));
    Ok(())
}

/// Rank 0: turns every step up to `upto` whose summary is known into a record (gathering the
/// ranks' posted reports) and shows it.
fn record_ready(
    session: &mut Session,
    unrecorded: &mut Vec<(u64, f64, String)>,
    summaries: &BTreeMap<u64, StepSummary>,
    records: &mut Vec<StepRecord>,
    upto: u64,
    observer: &mut Option<&mut dyn Observer>,
    remote_stop: &mut i32,
) -> Result<(), RuntimeError> {
    while let Some((step, wall, schedule)) = unrecorded.first().cloned() {
        if step > upto {
            break;
        }
        let Some(summary) = summaries.get(&step) else {
            break;
        };
        let reports = session
            .rank
            .collect_reports(step)?
            .into_iter()
            .map(|b| {
                let r = serde_json::from_slice::<Report>(&b).map_err(fail)?;
                *remote_stop = (*remote_stop).max(r.stop);
                r.into_rank_step()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let rec = StepRecord::assemble(summary, &reports, wall);
        if let Some(o) = observer.as_deref_mut() {
            o.step(&rec, &schedule).map_err(RuntimeError::Config)?;
        }
        records.push(rec);
        unrecorded.remove(0);
    }
    Ok(())
}

/// Loads `dir` at rank 0, checks it against the job, and imports it on every rank (a
/// collective). Returns the step to continue from.
fn resume(
    session: &mut Session,
    job: &TrainJob,
    dir: &std::path::Path,
    observer: &mut Option<&mut dyn Observer>,
) -> Result<u64, RuntimeError> {
    let root = session.rank.rank() == 0;
    let mut loaded = None;
    let mut verdict = String::new();
    if root {
        match check_resume(job, dir) {
            Ok((ckpt, warnings)) => {
                if let Some(o) = observer.as_deref_mut() {
                    for w in warnings {
                        o.note(&format!(
                            "warning: --resume: {w}; the continuation will not match an uninterrupted run"
                        ));
                    }
                }
                loaded = Some(ckpt);
            }
            Err(e) => verdict = e,
        }
    }
    // Every rank learns whether the checkpoint is usable, so all fail alike.
    let verdict = session.rank.broadcast(0, verdict.into_bytes())?;
    if !verdict.is_empty() {
        return Err(RuntimeError::Config(
            String::from_utf8_lossy(&verdict).into(),
        ));
    }
    let step = session
        .rank
        .import_state(0, loaded.as_ref().map(|c| &c.state))
        .map_err(|e| RuntimeError::Config(format!("--resume {}: {e}", dir.display())))?;
    if let (Some(o), Some(c)) = (observer.as_deref_mut(), &loaded) {
        o.note(&format!(
            "resumed from {} at step {step} (saved from {})",
            dir.display(),
            c.meta.saved_from
        ));
    }
    Ok(step)
}

#[allow(clippy::type_complexity)]
fn check_resume(
    job: &TrainJob,
    dir: &std::path::Path,
) -> Result<(Checkpoint, Vec<String>), String> {
    let (_, ckpt) = checkpoint_fs::load_resolved(dir).map_err(|e| format!("--resume: {e}"))?;
    let model = &job.session.run.model;
    let train = global_train(job);
    let mut warnings = ckpt.check_resume(model, &train).map_err(|e| {
        format!(
            "--resume {}: {e}; resume with the checkpoint's settings ({}) or train from scratch \
             without --resume",
            dir.display(),
            ckpt.meta.flags()
        )
    })?;
    let data = corpus_fingerprint(&job.corpus);
    if let Some(saved) = ckpt.meta.data.as_ref().filter(|d| **d != data) {
        warnings.push(format!(
            "the training text ({data}) is not the checkpoint's ({saved})"
        ));
    }
    let step = ckpt.meta.step;
    if step >= job.steps {
        return Err(format!(
            "--resume {}: the checkpoint is already at step {step}, and --steps is {}; raise \
             --steps to train further",
            dir.display(),
            job.steps
        ));
    }
    Ok((ckpt, warnings))
}

/// The training settings as a checkpoint records them: microbatches of the *global* step
/// (all replicas), so that a checkpoint resumes under any pipeline × data-parallel shape with
/// the same global batch.
fn global_train(job: &TrainJob) -> nobubble_nn::TrainConfig {
    let mut t = job.session.run.train.clone();
    t.microbatches *= job.session.run.data_parallel.max(1);
    t
}

/// Gathers the training state at rank 0 and writes it to `dir` (a collective).
fn save(
    session: &mut Session,
    job: &TrainJob,
    dir: &std::path::Path,
    observer: &mut Option<&mut dyn Observer>,
) -> Result<(), RuntimeError> {
    let step = session.step;
    let state = session.rank.export_state(0, step)?;
    let mut outcome = String::new();
    if let Some(state) = state {
        let s = &session.plan.schedule;
        let mut from = format!("{} on {} ranks, {} stages", s.name, s.ranks, s.stages);
        let d = job.session.run.data_parallel.max(1);
        if d > 1 {
            from.push_str(&format!(", {d} data-parallel replicas"));
        }
        let ckpt = Checkpoint::new(state, &job.session.run.model, &global_train(job), &from)
            .with_data(&job.corpus);
        match checkpoint_fs::save_run(dir, &ckpt, job.keep_last) {
            Ok(at) => {
                if let Some(o) = observer.as_deref_mut() {
                    o.note(&format!(
                        "saved checkpoint at step {step} to {}",
                        at.display()
                    ));
                }
            }
            Err(e) => outcome = format!("--save: {e}"),
        }
    }
    // Every rank learns whether the save worked, so none goes on alone.
    let outcome = session.rank.broadcast(0, outcome.into_bytes())?;
    if outcome.is_empty() {
        Ok(())
    } else {
        Err(RuntimeError::Config(
            String::from_utf8_lossy(&outcome).into(),
        ))
    }
}

/// Median measured pass times (ms) per stage, with the plan's memory, for simulating the
/// schedule that ran; a fused B is split in the plan's I:W proportion.
pub fn measured_costs(records: &[StepRecord], plan: &CostModel) -> CostModel {
    let medians = median_pass_ms(records, plan.stages.len());
    let stages = medians
        .into_iter()
        .zip(&plan.stages)
        .map(|([f, i, w, b], p)| {
            let f = f.unwrap_or(p.f);
            let (i, w) = match (i, w, b) {
                (Some(i), Some(w), _) => (i, w),
                (_, _, Some(b)) => {
                    let share = p.i / (p.i + p.w);
                    (b * share, b * (1.0 - share))
                }
                _ => (p.i, p.w),
            };
            RankCost {
                f,
                i: i.max(1e-6),
                w: w.max(1e-6),
                mem_b: p.mem_b,
                mem_w: p.mem_w,
            }
        })
        .collect();
    CostModel {
        stages,
        comm: plan.comm,
        objective: plan.objective,
        rank_share: plan.rank_share.clone(),
    }
}

/// Bytes as MiB with two decimals.
pub fn mib(b: f64) -> String {
    format!("{:.2} MiB", b / 1048576.0)
}
