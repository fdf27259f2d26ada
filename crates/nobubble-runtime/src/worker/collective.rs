//! Collective operations of the SPMD executor, built from point-to-point messages so that
//! every summation happens in one fixed order on one rank (or identically on every rank).
//!
//! `MPI_Allreduce` is free to sum in any order — a ring, a tree, split by message size — so
//! two runs, or a run and the unpipelined reference, may differ in the last bit. Here:
//! - **gradients** of stage s are sent by each replica to the stage's rank in replica 0
//!   after the stage's last W, summed there in the halving tree of [`nobubble_nn::accumulate`]
//!   in replica order (with D a power of two exactly the single replica's bits), and sent back;
//! - **losses, partial norms and non-finite flags** are all-gathered (a few bytes per rank):
//!   every rank sums the same numbers in the same order (microbatch order, stage order), so all
//!   ranks reach the same loss, norm and clip factor without a coordinator;
//! - **control data** (measured memory, pass times, checkpoint parts) is gathered, all-gathered
//!   or broadcast in rounds that every rank counts alike.

use crate::error::RuntimeError;
use crate::transport::{Message, Tag};
use crate::worker::{Engine, Worker};
use nobubble_nn::accumulate::combine;
use nobubble_nn::Tensor;
use std::time::Instant;

fn control(tag: Tag, stage: usize, index: u64, data: Vec<f32>, bytes: Vec<u8>) -> Message {
    Message {
        tag,
        from: 0,
        stage,
        index,
        shape: vec![data.len()],
        data,
        bytes,
        sent_at: 0.0,
    }
}

impl Worker {
    /// The gradients of stage `s` here, flattened in parameter order (empty when emulated).
    fn flat_gradient(&self, s: usize) -> Vec<f32> {
        match &self.engine {
            Engine::Real { stages, .. } => stages[&s]
                .params()
                .iter()
                .flat_map(|p| p.grad.data().iter().copied())
                .collect(),
            Engine::Emulated(_) => Vec::new(),
        }
    }

    /// Sets stage `s`'s gradients from a flat vector (parameter order).
    fn set_flat_gradient(&mut self, s: usize, flat: &[f32]) -> Result<(), RuntimeError> {
        if let Engine::Real { stages, .. } = &mut self.engine {
            let params = stages.get_mut(&s).expect("a stage here").params_mut();
            let need: usize = params.iter().map(|p| p.grad.len()).sum();
            if need != flat.len() {
                return Err(RuntimeError::Fault(format!(
                    "rank {}: the reduced gradient of stage {s} has {} values, the stage {need}",
                    self.rank,
                    flat.len()
                )));
            }
            let mut at = 0;
            for p in params {
                let n = p.grad.len();
                p.grad.data_mut().copy_from_slice(&flat[at..at + n]);
                at += n;
            }
        }
        Ok(())
    }

    /// After stage `s`'s last W of `step`: a replica other than the first sends its gradient
    /// to the first (non-blocking; the reduction completes in [`Worker::finish_reduction`]).
    pub(crate) fn share_gradient(&mut self, step: u64, s: usize) -> Result<(), RuntimeError> {
        if self.layout.replicas < 2 || self.replica == 0 {
            return Ok(());
        }
        let to = self.layout.rank_of(0, s);
        let msg = control(Tag::GradShare, s, step, self.flat_gradient(s), Vec::new());
        self.post_control(to, msg)
    }

    /// Completes the data-parallel reduction of every stage here: the first replica sums the
    /// replicas' gradients in the halving tree (replica order) and sends the sum back; the
    /// others wait for it.
    pub(crate) fn finish_reduction(&mut self, step: u64) -> Result<(), RuntimeError> {
        let d = self.layout.replicas;
        if d < 2 {
            return Ok(());
        }
        let started = Instant::now();
        let stages: Vec<usize> = (0..self.layout.placement.len())
            .filter(|&s| self.layout.rank_of(self.replica, s) == self.rank)
            .collect();
        for s in stages {
            if self.replica == 0 {
                let own = self.flat_gradient(s);
                let mut parts = vec![vec![Tensor::from_vec(&[own.len()], own).expect("flat")]];
                for r in 1..d {
                    let from = self.layout.rank_of(r, s);
                    let what = || {
                        format!(
                            "the gradient of stage {s} from replica {r} (rank {from}), step {step}"
                        )
                    };
                    let m = self.wait_for((Tag::GradShare, s, step, from), None, &what)?;
                    parts.push(vec![Tensor::from_vec(&[m.data.len()], m.data)
                        .map_err(|e| RuntimeError::Fault(e.to_string()))?]);
                }
                let total = combine(parts)
                    .expect("at least one replica")
                    .remove(0)
                    .into_vec();
                self.set_flat_gradient(s, &total)?;
                for r in 1..d {
                    let to = self.layout.rank_of(r, s);
                    let msg = control(Tag::GradSum, s, step, total.clone(), Vec::new());
                    self.post_control(to, msg)?;
                }
            } else {
                let from = self.layout.rank_of(0, s);
                let what =
                    || format!("the summed gradient of stage {s} from rank {from}, step {step}");
                let m = self.wait_for((Tag::GradSum, s, step, from), None, &what)?;
                self.set_flat_gradient(s, &m.data)?;
            }
        }
        self.comm.reduce_seconds += started.elapsed().as_secs_f64();
        Ok(())
    }

    /// With tied embeddings, after the step's gradients are complete (and reduced over the
    /// replicas): the rank of the first stage and the rank of the last stage exchange the
    /// shared tensor's gradient — the embedding's and the LM head's copy — and each sets its
    /// copy to their sum ([`nobubble_nn::add_tied_gradient`]; a rank holding both, as under V
    /// placement, sums locally with [`nobubble_nn::sum_tied_gradients`]). Both copies then
    /// take the same optimizer step.
    pub(crate) fn finish_tie(&mut self, step: u64) -> Result<(), RuntimeError> {
        let Engine::Real { stages, .. } = &mut self.engine else {
            return Ok(());
        };
        if !self.model.tie_embeddings {
            return Ok(());
        }
        let last = self.layout.placement.len() - 1;
        let here: Vec<usize> = [0, last]
            .into_iter()
            .filter(|s| stages.contains_key(s))
            .collect();
        let fault = |e: nobubble_nn::NnError| RuntimeError::Fault(format!("tied embeddings: {e}"));
        if here.len() == 2 || here.is_empty() {
            let tied = stages
                .values_mut()
                .flat_map(|s| s.tied_grads_mut())
                .collect();
            return nobubble_nn::sum_tied_gradients(tied).map_err(fault);
        }
        let (mine, other) = if here[0] == 0 { (0, last) } else { (last, 0) };
        let partner = self.layout.rank_of(self.replica, other);
        let own = self.tied_grad(mine)?.data().to_vec();
        let msg = control(Tag::TiedGrad, mine, step, own, Vec::new());
        self.post_control(partner, msg)?;
        let what = || {
            format!(
                "the tied embedding's gradient of stage {other} from rank {partner}, step {step}"
            )
        };
        let theirs = self.wait_for((Tag::TiedGrad, other, step, partner), None, &what)?;
        nobubble_nn::add_tied_gradient(self.tied_grad(mine)?, &theirs.data).map_err(|e| {
            RuntimeError::Fault(format!(
                "tied embeddings: the gradient rank {partner} sent does not fit: {}",
                e.message()
            ))
        })
    }

    /// This rank's copy of the tied embedding's gradient on `stage` (real compute only).
    fn tied_grad(&mut self, stage: usize) -> Result<&mut nobubble_nn::Tensor, RuntimeError> {
        let Engine::Real { stages, .. } = &mut self.engine else {
            return Err(RuntimeError::Fault(
                "internal: tied embeddings under emulated compute".into(),
            ));
        };
        stages
            .get_mut(&stage)
            .and_then(|s| s.tied_grads_mut().pop())
            .ok_or_else(|| {
                RuntimeError::Fault(format!("internal: stage {stage} holds no tied copy"))
            })
    }

    /// Every rank's `bytes`, in rank order (this rank's own included).
    pub fn all_gather(&mut self, bytes: Vec<u8>) -> Result<Vec<Vec<u8>>, RuntimeError> {
        let round = self.round;
        self.round += 1;
        let n = self.transport.size();
        for to in 0..n {
            let msg = control(Tag::Collective, 0, round, Vec::new(), bytes.clone());
            self.post_control(to, msg)?;
        }
        self.receive_from_all(0, round, "part of collective round")
    }

    /// Every rank's control message `(stage, index)`, in rank order.
    fn receive_from_all(
        &mut self,
        stage: usize,
        index: u64,
        what: &str,
    ) -> Result<Vec<Vec<u8>>, RuntimeError> {
        (0..self.transport.size())
            .map(|from| {
                let describe = || format!("rank {from}'s {what} {index}");
                Ok(self
                    .wait_for((Tag::Collective, stage, index, from), None, &describe)?
                    .bytes)
            })
            .collect()
    }

    /// `bytes` of every rank at `root` (in rank order); `None` elsewhere.
    pub fn gather(
        &mut self,
        root: usize,
        bytes: Vec<u8>,
    ) -> Result<Option<Vec<Vec<u8>>>, RuntimeError> {
        let round = self.round;
        self.round += 1;
        let msg = control(Tag::Collective, 0, round, Vec::new(), bytes);
        self.post_control(root, msg)?;
        if self.rank != root {
            return Ok(None);
        }
        self.receive_from_all(0, round, "part of collective round")
            .map(Some)
    }

    /// `root`'s `bytes` on every rank (`bytes` is ignored elsewhere).
    pub fn broadcast(&mut self, root: usize, bytes: Vec<u8>) -> Result<Vec<u8>, RuntimeError> {
        let round = self.round;
        self.round += 1;
        if self.rank == root {
            for to in 0..self.transport.size() {
                let msg = control(Tag::Collective, 0, round, Vec::new(), bytes.clone());
                self.post_control(to, msg)?;
            }
        }
        let what = || format!("rank {root}'s broadcast in collective round {round}");
        Ok(self
            .wait_for((Tag::Collective, 0, round, root), None, &what)?
            .bytes)
    }

    /// Posts this rank's report of `step` to rank 0 without waiting (rank 0 reads it later
    /// with [`Worker::collect_reports`]).
    pub fn post_report(&mut self, step: u64, bytes: Vec<u8>) -> Result<(), RuntimeError> {
        let msg = control(Tag::Collective, 1, step, Vec::new(), bytes);
        self.post_control(0, msg)
    }

    /// Rank 0: every rank's report of `step`, in rank order.
    pub fn collect_reports(&mut self, step: u64) -> Result<Vec<Vec<u8>>, RuntimeError> {
        self.receive_from_all(1, step, "report of step")
    }

    /// Rank 0: posts its decision about the boundary after `step` to every rank (itself
    /// included) without waiting; the others read it with [`Worker::read_decision`] when they
    /// reach that boundary. Posted a step ahead, it never holds a rank back.
    pub fn post_decision(&mut self, step: u64, bytes: Vec<u8>) -> Result<(), RuntimeError> {
        for to in 0..self.transport.size() {
            let msg = control(Tag::Decision, 0, step, Vec::new(), bytes.clone());
            self.post_control(to, msg)?;
        }
        Ok(())
    }

    /// Rank 0's decision posted for `step`.
    pub fn read_decision(&mut self, step: u64) -> Result<Vec<u8>, RuntimeError> {
        let what = || format!("rank 0's decision after step {step}");
        Ok(self
            .wait_for((Tag::Decision, 0, step, 0), None, &what)?
            .bytes)
    }
}
