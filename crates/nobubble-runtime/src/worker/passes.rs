//! Running a step's actions: each pass on the engine (or slept for its cost), its input
//! waited for and its output delivered, with the post-validation retry of a step whose
//! speculative forwards were rolled back; then the step's reduction, statistics and optimizer.

use super::{
    pipe_index, pipe_round, round_of, Engine, Fault, MeasuredSlot, RankStep, Verdict, Worker,
    RUNNING,
};
use crate::error::RuntimeError;
use crate::transport::{Message, Tag};
use nobubble_nn::{StageInput, StageOutput, Tensor};
use nobubble_schedule::{Action, Kind};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What running a step's actions came to.
enum Ran {
    /// Every action ran: losses by global microbatch, timeline, peak activation bytes.
    Done(Vec<(usize, f32)>, Vec<MeasuredSlot>, usize),
    /// Post-validation rolled the previous step back after some of this step's forwards ran
    /// speculatively on its optimistic weights: these (stage, microbatch) are thrown away and
    /// the step runs again. Their time shows as idle; they stay out of the pass-time medians.
    Again(Vec<(usize, usize)>),
}

/// A pass's output: (tag, destination stage, tensor).
type Output = (Tag, usize, Tensor);

/// What a step's passes have produced so far.
#[derive(Default)]
struct Tally {
    /// Forwards run, (stage, microbatch): thrown away if the attempt is.
    forwards: Vec<(usize, usize)>,
    /// Losses by global microbatch.
    losses: Vec<(usize, f32)>,
    timeline: Vec<MeasuredSlot>,
    /// Peak of the activation bytes held, over the step.
    peak: usize,
    /// Bytes held per (stage, microbatch) and their sum.
    held: HashMap<(usize, usize), usize>,
    total_held: usize,
    /// Weight-gradient passes run per stage.
    weight_passes: BTreeMap<usize, usize>,
}

impl Tally {
    /// Records that (stage `s`, microbatch `j`) now holds `bytes`.
    fn hold(&mut self, s: usize, j: usize, bytes: usize) {
        let before = self.held.insert((s, j), bytes).unwrap_or(0);
        self.total_held = self.total_held + bytes - before;
        self.peak = self.peak.max(self.total_held);
    }
}

impl Worker {
    /// Waits for the pipeline input of `action` (an activation or an output gradient).
    /// With `settle_first`, the wait gives way to the pending verdict as soon as every rank's
    /// statistics are in (`Ok(None)`): a rank must not wait on a speculative forward's input
    /// that a rolled-back sender will never send.
    fn wait_input(
        &mut self,
        tag: Tag,
        action: Action,
        round: u64,
        settle_first: Option<u64>,
    ) -> Result<Option<Tensor>, RuntimeError> {
        let (s, j) = (action.stage, action.microbatch);
        let from_stage = if tag == Tag::Activation { s - 1 } else { s + 1 };
        let from = self.layout.rank_of(self.replica, from_stage);
        let what = move || {
            let kind = if tag == Tag::Activation {
                "activation"
            } else {
                "output gradient"
            };
            format!(
                "the {kind} of stage {s}, microbatch {j}, from stage {from_stage} on rank {from}"
            )
        };
        let key = (tag, s, pipe_index(round, j), from);
        let m = match settle_first {
            Some(step) => {
                match self.wait_or(key, Some(action), &what, Some(&|w| w.stats_ready(step)))? {
                    Some(m) => m,
                    None => return Ok(None),
                }
            }
            None => self.wait_for(key, Some(action), &what)?,
        };
        Tensor::from_vec(&m.shape, m.data)
            .map(Some)
            .map_err(|e| RuntimeError::Pass {
                rank: self.rank,
                action,
                cause: format!("a damaged message: {e}"),
            })
    }

    /// Sends a pass's output to the rank holding `stage` (this one: straight into the mailbox).
    fn deliver(
        &mut self,
        tag: Tag,
        stage: usize,
        mb: usize,
        round: u64,
        tensor: Tensor,
        action: Action,
    ) -> Result<(), RuntimeError> {
        let lost = self.replica == 0
            && matches!(&self.fault, Some(Fault::LoseInputOf(a))
            if a.stage == stage && a.microbatch == mb
               && (a.kind == Kind::F) == (tag == Tag::Activation));
        if lost {
            return Ok(());
        }
        let msg = Message {
            tag,
            from: self.rank,
            stage,
            index: pipe_index(round, mb),
            shape: tensor.shape().to_vec(),
            data: tensor.into_vec(),
            bytes: Vec::new(),
            sent_at: 0.0,
        };
        let to = self.layout.rank_of(self.replica, stage);
        self.post(to, msg).map_err(|cause| RuntimeError::Pass {
            rank: self.rank,
            action,
            cause,
        })
    }

    /// Runs this rank's actions for `step`. With `eval`, data comes from the held-out corpus
    /// and gradients are discarded afterwards. Returns (losses by global microbatch, timeline,
    /// peak activation bytes).
    fn run_actions(
        &mut self,
        step: u64,
        order: &[Action],
        eval: bool,
        attempt: u64,
    ) -> Result<Ran, RuntimeError> {
        let round = pipe_round(step, eval, attempt);
        let mut tally = Tally::default();
        for &a in order {
            if self.abort.load(Ordering::Relaxed) {
                return Err(RuntimeError::Aborted { rank: self.rank });
            }
            RUNNING.with(|r| r.set(Some(a)));
            self.inject_fault(a);
            let t_ready = self.now();
            // Inputs first (waiting is idle time), then compute.
            let Some(input) = self.input_of(a, round)? else {
                return Ok(Ran::Again(tally.forwards));
            };
            if a.kind == Kind::F {
                tally.forwards.push((a.stage, a.microbatch));
            }
            let start = self.now();
            let send = match &self.engine {
                Engine::Emulated(costs) => {
                    let ms = costs.time(a.stage, a.kind);
                    self.emulate(a, ms)?
                }
                Engine::Real { .. } => self.real_pass(a, step, eval, input, &mut tally)?,
            };
            let end = self.now();
            if let Some((tag, to_stage, t)) = send {
                self.deliver(tag, to_stage, a.microbatch, round, t, a)?;
            }
            self.count_weight_pass(a, step, eval, &mut tally.weight_passes)?;
            tally.timeline.push(MeasuredSlot {
                action: a,
                start,
                end,
                waited: start - t_ready,
            });
        }
        RUNNING.with(|r| r.set(None));
        Ok(Ran::Done(tally.losses, tally.timeline, tally.peak))
    }

    /// The faults tests inject when `a` is about to run (replica 0 only).
    fn inject_fault(&self, a: Action) {
        if self.replica != 0 {
            return;
        }
        match &self.fault {
            Some(Fault::PanicAt(f)) if *f == a => panic!("injected fault at {a}"),
            Some(Fault::ExitAt(f)) if *f == a => {
                eprintln!(
                    "rank {}: injected fault: the process exits at {a}",
                    self.rank
                );
                std::process::exit(3);
            }
            _ => {}
        }
    }

    /// The input `a` waits for: an activation (forward past stage 0), an output gradient
    /// (backward before the last stage), or none. `Ok(None)`: post-validation rolled the
    /// previous step back first, and this attempt at the step is thrown away.
    fn input_of(&mut self, a: Action, round: u64) -> Result<Option<Option<Tensor>>, RuntimeError> {
        if a.kind != Kind::F && self.pending.is_some() {
            // Post-validation: forwards so far ran on the previous step's optimistic
            // weights; a backward pass must not. The verdict is due (its statistics
            // travelled during those forwards): keep, or throw this attempt away. Every
            // rank reaches the same verdict and so starts the same attempt.
            if !self.settle_kept()? {
                return Ok(None);
            }
        }
        let last = self.stages_total() - 1;
        Ok(Some(match a.kind {
            Kind::F if a.stage > 0 => {
                match self.wait_input(Tag::Activation, a, round, self.pending)? {
                    Some(x) => Some(x),
                    None => {
                        // The verdict came before the input: settle it now, since the
                        // sender may have started the step again.
                        if !self.settle_kept()? {
                            return Ok(None);
                        }
                        self.wait_input(Tag::Activation, a, round, None)?
                    }
                }
            }
            Kind::I | Kind::B if a.stage < last => {
                self.wait_input(Tag::Gradient, a, round, None)?
            }
            _ => None,
        }))
    }

    /// An emulated pass: sleeps `ms`; its output is an empty message to the next stage.
    fn emulate(&self, a: Action, ms: f64) -> Result<Option<Output>, RuntimeError> {
        if !spin_sleep(Duration::from_secs_f64(ms / 1000.0), &self.abort) {
            return Err(RuntimeError::Aborted { rank: self.rank });
        }
        let last = self.stages_total() - 1;
        Ok(match a.kind {
            Kind::F if a.stage < last => Some((Tag::Activation, a.stage + 1, Tensor::zeros(&[0]))),
            Kind::I | Kind::B if a.stage > 0 => {
                Some((Tag::Gradient, a.stage - 1, Tensor::zeros(&[0])))
            }
            _ => None,
        })
    }

    /// A pass on a real stage: its loss (the last stage's forward) and held bytes go into
    /// `tally`; returns its output for the neighbouring stage.
    fn real_pass(
        &mut self,
        a: Action,
        step: u64,
        eval: bool,
        input: Option<Tensor>,
        tally: &mut Tally,
    ) -> Result<Option<Output>, RuntimeError> {
        let (s, j) = (a.stage, a.microbatch);
        let last = self.stages_total() - 1;
        let global_j = self.replica * self.layout.microbatches + j;
        let err = |cause: String| RuntimeError::Pass {
            rank: self.rank,
            action: a,
            cause,
        };
        let Engine::Real { stages, .. } = &mut self.engine else {
            unreachable!("real passes run on real stages")
        };
        let stage = stages
            .get_mut(&s)
            .ok_or_else(|| err(format!("stage {s} is not on this rank")))?;
        let mut send = None;
        match a.kind {
            Kind::F => {
                let data = if s == 0 || s == last {
                    let corpus = if eval {
                        &self.eval_corpus
                    } else {
                        &self.corpus
                    };
                    let (seed, model) = (self.train.data_seed, &self.model);
                    let sequences = model.microbatch_size;
                    Some(
                        corpus
                            .microbatch(seed, step, global_j, sequences, model.seq_len)
                            .map_err(|e| err(e.to_string()))?,
                    )
                } else {
                    None
                };
                let stage_in = match input {
                    Some(x) => StageInput::Activations(x),
                    None => {
                        StageInput::Tokens(&data.as_ref().expect("first stage has data").tokens)
                    }
                };
                let targets =
                    (s == last).then(|| &data.as_ref().expect("last stage has data").targets[..]);
                match stage
                    .forward(j, stage_in, targets)
                    .map_err(|e| err(e.to_string()))?
                {
                    StageOutput::Loss(l) => tally.losses.push((global_j, l)),
                    StageOutput::Activations(t) => send = Some((Tag::Activation, s + 1, t)),
                }
            }
            Kind::I | Kind::B => {
                let g = stage
                    .backward_input(j, input)
                    .map_err(|e| err(e.to_string()))?;
                if let Some(mut g) = g {
                    if self.fault == Some(Fault::NanGradAt(step)) && s == 1 && global_j == 0 {
                        g.data_mut()[0] = f32::NAN;
                    }
                    send = Some((Tag::Gradient, s - 1, g));
                }
                if a.kind == Kind::B {
                    stage.backward_weight(j).map_err(|e| err(e.to_string()))?;
                }
            }
            Kind::W => stage.backward_weight(j).map_err(|e| err(e.to_string()))?,
        }
        tally.hold(s, j, stage.held_bytes(j));
        Ok(send)
    }

    /// Counts a pass that accumulates weight gradients; after a stage's last one its
    /// data-parallel reduction starts, overlapped with the rank's remaining passes.
    fn count_weight_pass(
        &mut self,
        a: Action,
        step: u64,
        eval: bool,
        weight_passes: &mut BTreeMap<usize, usize>,
    ) -> Result<(), RuntimeError> {
        if matches!(a.kind, Kind::W | Kind::B) {
            let done = weight_passes.entry(a.stage).or_insert(0);
            *done += 1;
            if *done == self.layout.microbatches && !eval {
                self.share_gradient(step, a.stage)?;
            }
        }
        Ok(())
    }

    /// Settles the pending verdict; true if the optimistic step was kept.
    fn settle_kept(&mut self) -> Result<bool, RuntimeError> {
        Ok(!matches!(self.settle()?, Some(s) if Verdict::of(s.scale) != Verdict::Keep))
    }

    /// Throws away a speculative attempt at a step: what its forwards saved, and its
    /// messages (those still on the way are dropped when they arrive, at the next purge).
    fn discard_attempt(&mut self, forwards: &[(usize, usize)], round: u64) {
        if let Engine::Real { stages, .. } = &mut self.engine {
            for &(s, j) in forwards {
                if let Some(st) = stages.get_mut(&s) {
                    st.discard(j);
                }
            }
        }
        self.purge(round + 1);
    }

    /// Drops pipeline messages of every round before `round` (discarded attempts).
    fn purge(&mut self, round: u64) {
        self.mailbox
            .retain(|k, _| !(k.0.is_pipeline() && round_of(k.2) < round));
    }

    /// Runs one training (or evaluation) step of the SPMD program: actions, gradient
    /// reduction, statistics, optimizer. See the module documentation.
    pub fn step(
        &mut self,
        step: u64,
        order: &[Action],
        eval: bool,
    ) -> Result<RankStep, RuntimeError> {
        let before = self.comm();
        // Evaluation reads the weights everywhere: the pending verdict first. Training steps
        // settle it lazily, before their first backward pass.
        if eval {
            self.settle()?;
        }
        self.purge(pipe_round(step, eval, 0));
        let mut attempt = 0;
        let (losses, timeline, peak_bytes) = loop {
            match self.run_actions(step, order, eval, attempt)? {
                Ran::Done(losses, timeline, peak) => break (losses, timeline, peak),
                Ran::Again(forwards) => {
                    self.discard_attempt(&forwards, pipe_round(step, eval, attempt));
                    attempt += 1;
                }
            }
        };
        // A schedule without backward passes here still settles before the next step.
        self.settle()?;
        let summary = if eval {
            let s = self.exchange_stats(step, true, &losses, false)?;
            self.zero_grads();
            Some(s)
        } else {
            self.finish_reduction(step)?;
            self.finish_tie(step)?;
            self.optimizer_step(step, &losses)?
        };
        Ok(RankStep {
            timeline,
            peak_bytes,
            summary,
            settled: std::mem::take(&mut self.settled),
            comm: self.comm().since(&before),
        })
    }
}

/// Sleeps for `d`, precisely on average: the OS wakes a sleeper late by a roughly
/// constant amount, so each thread learns its own lateness (a running mean) and sleeps that
/// much less. No spinning: with many ranks on few cores, spinning threads would delay the
/// others' wake-ups. Long sleeps are cut into slices that watch `abort`; returns false if
/// it was set.
fn spin_sleep(d: Duration, abort: &AtomicBool) -> bool {
    thread_local! {
        static LATE_NS: std::cell::Cell<f64> = const { std::cell::Cell::new(60_000.0) };
    }
    const SLICE: Duration = Duration::from_millis(50);
    let start = Instant::now();
    let until = start + d;
    let late = LATE_NS.with(|l| l.get());
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if abort.load(Ordering::Relaxed) {
            return false;
        }
        if left <= SLICE {
            let ask = left.as_nanos() as f64 - late;
            if ask > 0.0 {
                std::thread::sleep(Duration::from_nanos(ask as u64));
            }
            break;
        }
        std::thread::sleep(SLICE);
    }
    let overshoot = start.elapsed().as_nanos() as f64 - d.as_nanos() as f64;
    // Learn from this sleep: the lateness it showed is what was asked less what happened.
    LATE_NS.with(|l| l.set((0.9 * late + 0.1 * (late + overshoot)).clamp(0.0, 1e6)));
    while Instant::now() < until {
        std::thread::yield_now();
    }
    true
}
