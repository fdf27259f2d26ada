//! The job's checkpoints: resuming (rank 0 loads and checks, every rank imports), saving at
//! the planned steps and when interrupted (every rank exports, rank 0 writes). Each is a
//! collective, and each tells every rank the outcome, so all go on or fail alike.

use super::{fail, TrainJob, TrainingRun};
use crate::checkpoint::{corpus_fingerprint, fs as checkpoint_fs, Checkpoint};
use crate::error::RuntimeError;
use std::path::Path;

impl TrainingRun<'_, '_> {
    /// Loads `dir` at rank 0, checks it against the job, and imports it on every rank (a
    /// collective). Returns the step to continue from.
    pub(super) fn resume(&mut self, dir: &Path) -> Result<u64, RuntimeError> {
        let mut loaded = None;
        let mut verdict = Ok(());
        if self.root {
            match check_resume(self.job, dir) {
                Ok((ckpt, warnings)) => {
                    for w in warnings {
                        self.note(&format!(
                            "warning: --resume: {w}; the continuation will not match an uninterrupted run"
                        ));
                    }
                    loaded = Some(ckpt);
                }
                Err(e) => verdict = Err(e),
            }
        }
        // Every rank learns whether the checkpoint is usable, so all fail alike.
        self.agree(verdict)?;
        let step = self
            .session
            .rank
            .import_state(0, loaded.as_ref().map(|c| &c.state))
            .map_err(|e| e.prefixed(&format!("--resume {}", dir.display())))?;
        if let Some(c) = &loaded {
            self.note(&format!(
                "resumed from {} at step {step} (saved from {})",
                dir.display(),
                c.meta.saved_from
            ));
        }
        Ok(step)
    }

    /// Every rank must train on the same ids: processes of an MPI job each read and tokenize
    /// the data themselves, so a file that differs between machines, or a tokenizer trained
    /// differently, would otherwise train silently on other data (a collective).
    pub(super) fn check_same_data(&mut self) -> Result<(), RuntimeError> {
        let job = self.job;
        let tokenizer = job
            .tokenizer
            .as_deref()
            .map(|t| format!("{:016x}", nobubble_nn::param::fnv1a(t.as_bytes())));
        let mine = (
            corpus_fingerprint(&job.corpus),
            corpus_fingerprint(&job.eval),
            tokenizer,
        );
        // Real compute: the kernels' level too (its products differ in the last bits).
        let simd = self.real.then(nobubble_nn::Simd::selected);
        let bytes = serde_json::to_vec(&(&mine, simd)).map_err(fail)?;
        let all = self.session.rank.all_gather(bytes)?;
        for (rank, part) in all.iter().enumerate() {
            if *part == all[0] {
                continue;
            }
            type Shared = (serde_json::Value, Option<nobubble_nn::Simd>);
            let theirs: Shared = serde_json::from_slice(part).map_err(fail)?;
            let first: Shared = serde_json::from_slice(&all[0]).map_err(fail)?;
            if theirs.0 != first.0 {
                return Err(RuntimeError::Config(format!(
                    "rank {rank} reads other training data than rank 0 ({} against {}): give \
                     every process the same --data, and a --tokenizer file rather than \
                     --train-tokenizer if they tokenize differently",
                    theirs.0, first.0
                )));
            }
            let (Some(a), Some(b)) = (theirs.1, first.1) else {
                return Err(RuntimeError::Config(format!(
                    "rank {rank} and rank 0 disagree on whether compute is real or emulated: give \
                     every process the same --compute"
                )));
            };
            // Levels are ordered widest first: the narrowest one runs everywhere.
            return Err(RuntimeError::Config(format!(
                "rank {rank} runs the {a} kernels and rank 0 the {b}: their matrix products \
                 differ in the last bits, so the run would not be bit-identical to one process; \
                 set {}={} on every process (the narrower level)",
                nobubble_nn::simd::ENV_VAR,
                a.max(b),
            )));
        }
        Ok(())
    }

    /// Rank 0 reads the weights of the Hugging Face model in `dir` into the freshly built
    /// state (step 0, zero optimizer moments) and every rank imports them (collectives).
    pub(super) fn init_from(&mut self, dir: &Path) -> Result<(), RuntimeError> {
        let fresh = self.session.rank.export_state(0, 0)?;
        let mut state = None;
        let mut verdict = Ok(());
        if let Some(mut fresh) = fresh {
            match crate::checkpoint::hf::load_params(dir, &self.job.session.run.model) {
                Ok(params) => {
                    fresh.params = params;
                    state = Some(fresh);
                }
                Err(e) => verdict = Err(e),
            }
        }
        self.agree(verdict)?;
        self.session
            .rank
            .import_state(0, state.as_ref())
            .map_err(|e| e.prefixed(&format!("--init-from {}", dir.display())))?;
        self.note(&format!("initialized from {}", dir.display()));
        Ok(())
    }

    /// Checkpoint: saves at the last step and every `save_every` steps. Every rank knows the
    /// step's loss (post-validation: once settled), so all refuse alike to save a diverged
    /// state as the newest checkpoint.
    pub(super) fn checkpoint(&mut self, step: u64) -> Result<(), RuntimeError> {
        let job = self.job;
        let Some(dir) = &job.save else {
            return Ok(());
        };
        let last = step + 1 == job.steps;
        let every = job.save_every > 0 && (step + 1).is_multiple_of(job.save_every);
        if !last && !every {
            return Ok(());
        }
        self.settle()?;
        if self.root {
            // The step's log line before its checkpoint (it would otherwise come with the next
            // step): a run killed right after the save then leaves no gap in the log when it
            // is resumed from it, and a step that is not saved (below) is logged too.
            self.record_ready(step)?;
        }
        if let Some(s) = self.summaries.get(&step).filter(|s| !s.loss.is_finite()) {
            return Err(RuntimeError::Diverged(format!(
                "not saving step {}: the training loss is {} (the run diverged; lower \
                 --lr or keep --max-grad-norm); the checkpoints already saved are kept",
                step + 1,
                s.loss
            )));
        }
        self.save(dir)?;
        self.saved_at = Some(step + 1);
        Ok(())
    }

    /// An interrupted run keeps what it trained: saved like a last step (a diverged one is
    /// not saved; the checkpoints already there are kept). The step was not known when the
    /// flags were checked: rank 0 checks it now and tells every rank.
    pub(super) fn save_interrupted(&mut self) -> Result<(), RuntimeError> {
        let job = self.job;
        let Some(dir) = &job.save else {
            return Ok(());
        };
        let done = self.session.step;
        if done <= self.first_step || self.saved_at == Some(done) {
            return Ok(());
        }
        let diverged = self
            .summaries
            .get(&done.wrapping_sub(1))
            .is_some_and(|s| !s.loss.is_finite());
        let mut refusal = String::new();
        if self.root {
            if diverged {
                refusal = format!(
                    "not saving step {done}: its training loss is not finite (the \
                     checkpoints already saved are kept)"
                );
            } else if let Err(e) = checkpoint_fs::check_run_steps(dir, |k| k == done, job.overwrite)
            {
                refusal = format!("not saving step {done}: --save: {e}");
            }
        }
        let refusal = self.session.rank.broadcast(0, refusal.into_bytes())?;
        if refusal.is_empty() {
            self.save(dir)?;
            self.saved_at = Some(done);
        } else {
            self.note(&String::from_utf8_lossy(&refusal));
        }
        Ok(())
    }

    /// Gathers the training state at rank 0 and writes it to `dir` (a collective).
    fn save(&mut self, dir: &Path) -> Result<(), RuntimeError> {
        let job = self.job;
        let step = self.session.step;
        let state = self.session.rank.export_state(0, step)?;
        let mut outcome = Ok(());
        if let Some(state) = state {
            let s = &self.session.plan.schedule;
            let mut from = format!("{} on {} ranks, {} stages", s.name, s.ranks, s.stages);
            let d = job.session.run.data_parallel.max(1);
            if d > 1 {
                from.push_str(&format!(", {d} data-parallel replicas"));
            }
            let ckpt = Checkpoint::new(state, &job.session.run.model, &global_train(job), &from)
                .with_data(&job.corpus)
                .with_tokenizer(job.tokenizer.as_deref());
            // The newest earlier checkpoint whose next step had a finite loss: a save of
            // weights that finite losses led to, but that blow up at the next step, must not
            // prune the last good one (`summaries` are by step index: checkpoint j's next
            // step has index j).
            let good = (self.saved.iter().rev().copied()).find(|&j| {
                j < step && (self.summaries.get(&j)).is_some_and(|s| s.loss.is_finite())
            });
            match checkpoint_fs::save_run(dir, &ckpt, job.keep_last, good) {
                Ok(at) => {
                    self.saved.push(step);
                    self.note(&format!(
                        "saved checkpoint at step {step} to {}",
                        at.display()
                    ))
                }
                Err(e) => outcome = Err(e.prefixed("--save")),
            }
        }
        // Every rank learns whether the save worked, so none goes on alone.
        self.agree(outcome)
    }

    /// Rank 0's `outcome` on every rank (a collective; the others' is ignored): `Ok`, or
    /// rank 0's error, the same variant and message everywhere.
    fn agree(&mut self, outcome: Result<(), RuntimeError>) -> Result<(), RuntimeError> {
        let bytes = match &outcome {
            Ok(()) => Vec::new(),
            // The planner's errors are not sent as such (every rank finds them alike).
            Err(RuntimeError::Plan(e)) => {
                serde_json::to_vec(&RuntimeError::Config(e.to_string())).map_err(fail)?
            }
            Err(e) => serde_json::to_vec(e).map_err(fail)?,
        };
        let bytes = self.session.rank.broadcast(0, bytes)?;
        if bytes.is_empty() {
            return Ok(());
        }
        Err(serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| RuntimeError::Fault(format!("damaged outcome from rank 0: {e}"))))
    }
}

/// Rank 0: loads the checkpoint and checks it against the job; warnings for what differs but
/// still resumes (another training text).
fn check_resume(job: &TrainJob, dir: &Path) -> Result<(Checkpoint, Vec<String>), RuntimeError> {
    let (_, ckpt) = checkpoint_fs::load_resolved(dir).map_err(|e| e.prefixed("--resume"))?;
    let model = &job.session.run.model;
    let train = global_train(job);
    let mut warnings = ckpt.check_resume(model, &train).map_err(|e| {
        // The vocabulary is no flag: it comes from the data.
        let vocab = if model.vocab != ckpt.meta.model.vocab {
            " (the vocabulary comes from the data: 256 for bytes, one more for JSON lines, \
             which add an end-of-text id, a tokenizer's own size otherwise: resume on data of \
             the checkpoint's kind)"
        } else {
            ""
        };
        RuntimeError::Config(format!(
            "--resume {}: {e}; resume with the checkpoint's settings ({}){vocab} or train from \
             scratch without --resume",
            dir.display(),
            ckpt.meta.flags()
        ))
    })?;
    let data = corpus_fingerprint(&job.corpus);
    if let Some(saved) = ckpt.meta.data.as_ref().filter(|d| **d != data) {
        warnings.push(format!(
            "the training text ({data}) is not the checkpoint's ({saved})"
        ));
    }
    let step = ckpt.meta.step;
    if step >= job.steps {
        return Err(RuntimeError::Config(format!(
            "--resume {}: the checkpoint is already at step {step}, and --steps is {}; raise \
             --steps to train further",
            dir.display(),
            job.steps
        )));
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
