//! The stop decision. A signal reaches the processes of a job at different moments, or only
//! some of them, so rank 0 decides: at the end of each step it posts whether it, or any rank
//! whose step report it has read, was asked to stop, and every rank reads that before its
//! next step (or, after the last step, before the end). No rank waits for it in practice: its
//! next step's first pass needs rank 0's next forward anyway. Non-finite losses are in every
//! rank's step summaries, so each counts them itself.

use super::{fail, Stop, TrainingRun};
use crate::error::RuntimeError;

impl TrainingRun<'_, '_> {
    /// Whether every rank stops before `step`, decided alike on all ranks.
    pub(super) fn stop_before(&mut self, step: u64) -> Result<Option<Stop>, RuntimeError> {
        let job = self.job;
        if job.max_nan_steps > 0 {
            let mut run = 0;
            let mut last = None;
            for (k, s) in self.summaries.range(self.first_step..step).rev() {
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
        if job.stop.is_none() || step == self.first_step {
            return Ok(None);
        }
        let sig = decision(self.session.rank.read_decision(step - 1)?)?;
        Ok((sig != 0).then_some(Stop::Signal(sig)))
    }

    /// Rank 0 asks every rank to stop after `step` if it, or any rank whose report it has
    /// read, was asked to. The one place the decision is posted: last in the step (after its
    /// collectives, so that an error in them is every rank's).
    pub(super) fn post_stop_decision(&mut self, step: u64) -> Result<(), RuntimeError> {
        if self.job.stop.is_none() || !self.root {
            return Ok(());
        }
        let sig = self.job.stop_requested().max(self.remote_stop);
        self.session
            .rank
            .post_decision(step, sig.to_le_bytes().to_vec())
    }

    /// Stop: reads the last step's decision, says why the job stopped early, and saves an
    /// interrupted run's state.
    pub(super) fn stop(&mut self) -> Result<(), RuntimeError> {
        if self.stopped.is_none() && self.job.stop.is_some() && self.session.step > self.first_step
        {
            // A stop asked for during the last step (of rank 0, or of any rank: every report
            // was read before the decision): nothing is left to skip but the final
            // validation, and the exit status says the run was interrupted.
            let sig = decision(self.session.rank.read_decision(self.session.step - 1)?)?;
            if sig != 0 {
                self.stopped = Some(Stop::Signal(sig));
            }
        }
        let Some(reason) = self.stopped else {
            return Ok(());
        };
        if self.root {
            let why = match reason {
                Stop::Signal(sig) => format!("signal {sig}"),
                Stop::NonFinite { steps, .. } => format!("{steps} non-finite losses in a row"),
            };
            let done = self.session.step;
            self.note(&format!("stopping after step {done} ({why})"));
        }
        if let Stop::Signal(_) = reason {
            self.save_interrupted()?;
        }
        Ok(())
    }
}

fn decision(bytes: Vec<u8>) -> Result<i32, RuntimeError> {
    Ok(i32::from_le_bytes(
        bytes
            .try_into()
            .map_err(|_| fail("damaged stop decision"))?,
    ))
}
