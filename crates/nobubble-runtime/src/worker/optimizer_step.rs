//! The optimizer step of the SPMD executor: synchronous, or post-validated (REFERENCE §7).
//!
//! Both start from the same all-gathered statistics: every rank sends every other rank its
//! microbatch losses (by global microbatch index) and, per stage it holds, the partial squared
//! gradient norm (replica 0's count; the replicas hold the same reduced gradients). Each rank
//! then sums the losses in microbatch order and the norms in stage order — the reference
//! trainer's order — and reaches the same loss, norm and clip factor as every other rank.
//!
//! - **Synchronous**: a rank waits for every rank's statistics (the all-reduce's latency on
//!   every rank, its own contribution included), then clips and steps.
//! - **Post-validated**: a rank steps at once, unclipped, with what it knows (a stage whose own
//!   gradients are non-finite does not step), sends its statistics and goes on with the next
//!   step. Before the next step's first pass it settles: the statistics of the others have
//!   come in meanwhile (they finished earlier, or travel during the warm-up), the verdict is
//!   computed locally, and the step is kept, undone and redone clipped, or undone and skipped.
//!   No rank ever waits for a barrier between steps, so consecutive iterations overlap.

use crate::error::RuntimeError;
use crate::transport::{Message, Tag};
use crate::worker::{Engine, Worker};
use nobubble_nn::optim::{clip_scale, grad_norm_sq};
use serde::Serialize;

/// How an optimistic (post-validated) optimizer step is undone when validation rejects it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rollback {
    /// Keep a copy of weights and optimizer state before the step: exact.
    Copy,
    /// Invert the AdamW update from the gradients still held: no copy, exact up to rounding.
    Analytic,
}

/// The validation verdict on an optimistic step, from the full gradient-norm reduction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict {
    /// Finite and no clipping needed: the optimistic step stands.
    Keep,
    /// Clipping was needed: undo, step again with this gradient scale.
    Redo(f32),
    /// Non-finite gradients somewhere: undo and skip the step.
    Skip,
}

impl Verdict {
    /// The verdict of a step with this clip factor (`None`: non-finite gradients).
    pub fn of(scale: Option<f32>) -> Verdict {
        match scale {
            None => Verdict::Skip,
            Some(x) if x < 1.0 => Verdict::Redo(x),
            Some(_) => Verdict::Keep,
        }
    }
}

/// A step's outcome, the same on every rank.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct StepSummary {
    /// Step index.
    pub step: u64,
    /// Mean microbatch loss over the global batch (summed in microbatch order).
    pub loss: f32,
    /// Squared global gradient norm before clipping (summed in stage order).
    pub norm_sq: f64,
    /// Clip factor (1 = none); `None` when the step was skipped on inf/NaN.
    pub scale: Option<f32>,
    /// Learning rate of the step.
    pub lr: f32,
}

fn encode_stats(losses: &[(usize, f32)], norms: &[(usize, f64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + 12 * losses.len() + 16 * norms.len());
    out.extend_from_slice(&(losses.len() as u64).to_le_bytes());
    for &(j, l) in losses {
        out.extend_from_slice(&(j as u64).to_le_bytes());
        out.extend_from_slice(&l.to_le_bytes());
    }
    out.extend_from_slice(&(norms.len() as u64).to_le_bytes());
    for &(s, n) in norms {
        out.extend_from_slice(&(s as u64).to_le_bytes());
        out.extend_from_slice(&n.to_le_bytes());
    }
    out
}

#[allow(clippy::type_complexity)]
fn decode_stats(b: &[u8]) -> Option<(Vec<(usize, f32)>, Vec<(usize, f64)>)> {
    let u64_at = |i: usize| Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?));
    let n = u64_at(0)? as usize;
    if n > b.len() / 12 {
        return None;
    }
    let mut at = 8;
    let mut losses = Vec::with_capacity(n);
    for _ in 0..n {
        let j = u64_at(at)? as usize;
        let l = f32::from_le_bytes(b.get(at + 8..at + 12)?.try_into().ok()?);
        losses.push((j, l));
        at += 12;
    }
    let k = u64_at(at)? as usize;
    if k > b.len() / 16 {
        return None;
    }
    at += 8;
    let mut norms = Vec::with_capacity(k);
    for _ in 0..k {
        let s = u64_at(at)? as usize;
        let v = f64::from_le_bytes(b.get(at + 8..at + 16)?.try_into().ok()?);
        norms.push((s, v));
        at += 16;
    }
    (at == b.len()).then_some((losses, norms))
}

impl Worker {
    /// Partial squared gradient norm of each stage here (replica 0 reports; the others'
    /// gradients are the same after the reduction).
    fn local_norms(&self) -> Vec<(usize, f64)> {
        if self.replica == 0 {
            self.stage_norms()
        } else {
            Vec::new()
        }
    }

    /// Partial squared gradient norm of each stage here (empty when emulated).
    fn stage_norms(&self) -> Vec<(usize, f64)> {
        match &self.engine {
            Engine::Real { stages, .. } => stages
                .iter()
                .map(|(&s, st)| (s, grad_norm_sq(&st.norm_params())))
                .collect(),
            Engine::Emulated(_) => Vec::new(),
        }
    }

    /// Sends this rank's statistics of `step` to every other rank and, when `wait`, gathers
    /// everyone's and returns the summary. `own_delayed`: the own contribution is subject to
    /// the emulated collective latency too (a blocking all-reduce).
    pub(crate) fn exchange_stats(
        &mut self,
        step: u64,
        eval: bool,
        losses: &[(usize, f32)],
        own_delayed: bool,
    ) -> Result<StepSummary, RuntimeError> {
        self.send_stats(step, eval, losses)?;
        self.collect_stats(step, eval, own_delayed)
    }

    fn stats_index(step: u64, eval: bool) -> u64 {
        // Evaluation rounds reuse step indices: keep them apart.
        if eval {
            step | 1 << 63
        } else {
            step
        }
    }

    fn send_stats(
        &mut self,
        step: u64,
        eval: bool,
        losses: &[(usize, f32)],
    ) -> Result<(), RuntimeError> {
        let norms = if eval { Vec::new() } else { self.local_norms() };
        let bytes = encode_stats(losses, &norms);
        let index = Self::stats_index(step, eval);
        for to in 0..self.transport.size() {
            let msg = Message {
                tag: Tag::Stats,
                from: self.rank,
                stage: 0,
                index,
                shape: Vec::new(),
                data: Vec::new(),
                bytes: bytes.clone(),
                sent_at: 0.0,
            };
            self.post_control(to, msg)?;
        }
        Ok(())
    }

    fn collect_stats(
        &mut self,
        step: u64,
        eval: bool,
        own_delayed: bool,
    ) -> Result<StepSummary, RuntimeError> {
        let index = Self::stats_index(step, eval);
        if !own_delayed {
            if let Some(m) = self.mailbox.get_mut(&(Tag::Stats, 0, index, self.rank)) {
                m.sent_at = f64::NEG_INFINITY;
            }
        }
        let mut losses = Vec::new();
        let mut norms = Vec::new();
        for from in 0..self.transport.size() {
            let what = || {
                format!(
                    "the losses and gradient norms of {} {step} from rank {from}",
                    if eval { "evaluation" } else { "step" }
                )
            };
            let m = self.wait_for((Tag::Stats, 0, index, from), None, &what)?;
            let (l, n) = decode_stats(&m.bytes).ok_or_else(|| {
                RuntimeError::Fault(format!(
                    "rank {}: damaged statistics from rank {from}",
                    self.rank
                ))
            })?;
            losses.extend(l);
            norms.extend(n);
        }
        // Loss: microbatch order; norm: stage order — as the reference trainer.
        losses.sort_by_key(|(j, _)| *j);
        norms.sort_by_key(|(s, _)| *s);
        let total = self.layout.microbatches * self.layout.replicas;
        let loss = (losses.iter().map(|&(_, l)| l as f64).sum::<f64>() / total as f64) as f32;
        let norm_sq: f64 = norms.iter().map(|&(_, n)| n).sum();
        let scale = match self.engine {
            _ if eval => None,
            Engine::Real { .. } => clip_scale(norm_sq, self.train.max_grad_norm).ok(),
            Engine::Emulated(_) => Some(1.0),
        };
        Ok(StepSummary {
            step,
            loss,
            norm_sq,
            scale,
            lr: self.train.lr_at(step),
        })
    }

    /// The optimizer step after `step`'s passes and gradient reduction. Synchronous: the
    /// summary. Post-validated: `None` (it comes with the next settle).
    pub(crate) fn optimizer_step(
        &mut self,
        step: u64,
        losses: &[(usize, f32)],
    ) -> Result<Option<StepSummary>, RuntimeError> {
        let lr = self.train.lr_at(step);
        match self.post_validate {
            Some(mode) => {
                let norms = self.stage_norms();
                self.optimistic_step(mode, lr, &norms)?;
                self.send_stats(step, false, losses)?;
                self.pending = Some(step);
                Ok(None)
            }
            _ => {
                let summary = self.exchange_stats(step, false, losses, true)?;
                self.apply(summary.scale, lr)?;
                Ok(Some(summary))
            }
        }
    }

    /// Post-validation: applies the verdict on the pending optimistic step, if any, once
    /// every rank's statistics are in. Call before anything reads or changes the weights.
    pub fn settle(&mut self) -> Result<Option<StepSummary>, RuntimeError> {
        let Some(step) = self.pending else {
            return Ok(None);
        };
        let summary = self.collect_stats(step, false, false)?;
        self.validate(Verdict::of(summary.scale), summary.lr)?;
        self.pending = None;
        self.settled.push(summary);
        Ok(Some(summary))
    }

    /// Post-validation: step at once with what this rank knows (its own partial norms;
    /// unclipped), keeping what a rollback needs.
    fn optimistic_step(
        &mut self,
        mode: Rollback,
        lr: f32,
        norms: &[(usize, f64)],
    ) -> Result<(), RuntimeError> {
        self.optimistic.clear();
        if let Engine::Real {
            stages, optimizers, ..
        } = &mut self.engine
        {
            for (s, stage) in stages.iter_mut() {
                let opt = optimizers.get_mut(s).expect("one optimizer per stage");
                let finite = norms.iter().any(|&(k, n)| k == *s && n.is_finite());
                let snapshot =
                    (mode == Rollback::Copy && finite).then(|| opt.snapshot(&stage.params()));
                if finite {
                    opt.config.lr = lr;
                    opt.step(&mut stage.params_mut(), 1.0)
                        .map_err(|e| RuntimeError::Fault(format!("stage {s}: {e}")))?;
                }
                self.optimistic.insert(*s, (snapshot, finite));
            }
        }
        Ok(())
    }

    /// Applies the validation verdict to the optimistic step (taken at learning rate `lr`:
    /// a redo must use it, not the one a restore brings back), then zeroes the gradients.
    fn validate(&mut self, verdict: Verdict, lr: f32) -> Result<(), RuntimeError> {
        let mode = self.post_validate.unwrap_or(Rollback::Copy);
        if let Engine::Real {
            stages, optimizers, ..
        } = &mut self.engine
        {
            for (s, stage) in stages.iter_mut() {
                let opt = optimizers.get_mut(s).expect("one optimizer per stage");
                let (snapshot, stepped) = self.optimistic.remove(s).unwrap_or((None, false));
                let fail = |e: nobubble_nn::NnError| {
                    RuntimeError::Fault(format!("stage {s}: rollback failed: {e}"))
                };
                if verdict != Verdict::Keep && stepped {
                    match (mode, &snapshot) {
                        (Rollback::Copy, Some(snap)) => {
                            opt.restore(snap, &mut stage.params_mut()).map_err(fail)?
                        }
                        _ => opt.rollback(&mut stage.params_mut()).map_err(fail)?,
                    }
                }
                if let Verdict::Redo(scale) = verdict {
                    opt.config.lr = lr;
                    opt.step(&mut stage.params_mut(), scale).map_err(fail)?;
                }
                stage.zero_grads();
            }
        }
        Ok(())
    }

    /// The synchronous optimizer step: AdamW with the global clip factor (or skip on a
    /// non-finite norm), then zero the gradients.
    fn apply(&mut self, scale: Option<f32>, lr: f32) -> Result<(), RuntimeError> {
        if let Engine::Real {
            stages, optimizers, ..
        } = &mut self.engine
        {
            for (s, stage) in stages.iter_mut() {
                if let Some(scale) = scale {
                    let opt = optimizers.get_mut(s).expect("one optimizer per stage");
                    opt.config.lr = lr;
                    opt.step(&mut stage.params_mut(), scale)
                        .map_err(|e| RuntimeError::Fault(e.to_string()))?;
                }
                stage.zero_grads();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_round_trip_and_damage_is_refused() {
        let losses = vec![(3, 1.5f32), (0, f32::NAN)];
        let norms = vec![(2, 0.25f64), (0, f64::INFINITY)];
        let b = encode_stats(&losses, &norms);
        let (l, n) = decode_stats(&b).unwrap();
        assert_eq!(l[0], losses[0]);
        assert!(l[1].1.is_nan());
        assert_eq!(n, norms);
        assert!(decode_stats(&b[..b.len() - 1]).is_none());
        let mut huge = b.clone();
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode_stats(&huge).is_none());
    }
}
