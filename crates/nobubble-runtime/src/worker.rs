//! One pipeline rank: executes its list of actions for a step on real stages (or sleeps
//! for their cost, in emulated mode), exchanging tensors through its [`Transport`].
//!
//! Receives wait in short slices so a failure elsewhere (the shared abort flag) or a
//! deadline stops the wait; time spent waiting is recorded as idle. Sends are enqueued and
//! never wait, so W can fill the gap behind an input gradient that has just left.

use crate::error::RuntimeError;
use crate::transport::{Message, Payload, Transport};
use nobubble_nn::optim::{AdamW, AdamWSnapshot};
use nobubble_nn::{ByteCorpus, GptConfig, Stage, StageInput, StageOutput, Tensor};
use nobubble_schedule::{Action, CostModel, Kind};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One action as it ran: times in seconds since the step's common epoch.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MeasuredSlot {
    /// What ran.
    pub action: Action,
    /// Compute start.
    pub start: f64,
    /// Compute end.
    pub end: f64,
    /// Time spent waiting for its input before `start`.
    pub waited: f64,
}

/// What a rank reports after a step.
#[derive(Clone, Debug)]
pub(crate) struct RankStep {
    /// Loss of each microbatch whose last stage is here.
    pub losses: Vec<(usize, f32)>,
    /// Partial squared gradient norm of each stage here.
    pub norm_sq: Vec<(usize, f64)>,
    /// The rank's measured actions.
    pub timeline: Vec<MeasuredSlot>,
    /// Peak activation bytes held by the rank's stages during the step.
    pub peak_bytes: usize,
}

/// Faults a test can inject to check that the run stops cleanly.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Panic when about to run this action (on the rank holding its stage).
    PanicAt(Action),
    /// Drop the message the sender of this action's input would send.
    LoseInputOf(Action),
    /// Put a NaN into stage 0's first gradient at this step (tests post-validation paths).
    NanGradAt(u64),
}

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

/// Where the compute comes from.
pub(crate) enum Engine {
    /// Real stages with their optimizers, by stage index.
    Real {
        stages: BTreeMap<usize, Stage>,
        optimizers: BTreeMap<usize, AdamW>,
    },
    /// Sleep for each pass's cost (milliseconds per stage).
    Emulated(CostModel),
}

pub(crate) struct Worker {
    pub rank: usize,
    pub placement: Vec<usize>,
    pub engine: Engine,
    pub transport: Box<dyn Transport>,
    pub mailbox: HashMap<(Payload, usize, usize), Message>,
    pub abort: Arc<AtomicBool>,
    pub recv_timeout: Duration,
    pub corpus: Arc<ByteCorpus>,
    /// Held-out text for evaluation steps.
    pub eval_corpus: Arc<ByteCorpus>,
    pub model: GptConfig,
    pub data_seed: u64,
    pub fault: Option<Fault>,
    /// The action being run, so a panic can be reported with it.
    pub current: Option<Action>,
    /// Post-validation: how to undo optimistic steps (`None`: synchronous steps).
    pub post_validate: Option<Rollback>,
    /// Per stage here: the snapshot taken before the optimistic step (copy mode) and
    /// whether the stage stepped.
    pub optimistic: BTreeMap<usize, (Option<AdamWSnapshot>, bool)>,
    /// Learning rate of the optimistic step (a redo must use it, not the restored one).
    pub optimistic_lr: f32,
}

/// How long a receive polls before it blocks.
const SPIN: Duration = Duration::from_micros(1000);

impl Worker {
    fn stages_total(&self) -> usize {
        self.placement.len()
    }

    /// Waits for a message, checking the abort flag and the deadline every 20 ms.
    fn wait(
        &mut self,
        payload: Payload,
        stage: usize,
        mb: usize,
        action: Action,
        epoch: Instant,
    ) -> Result<Tensor, RuntimeError> {
        let key = (payload, stage, mb);
        let started = Instant::now();
        let since = started.saturating_duration_since(epoch).as_secs_f64();
        let deadline = started + self.recv_timeout;
        loop {
            let now = Instant::now();
            let delayed_until = match self.mailbox.get(&key).map(|m| m.ready_at) {
                Some(Some(t)) if t > now => Some(t),
                Some(_) => return Ok(self.mailbox.remove(&key).expect("present").tensor),
                None => None,
            };
            if self.abort.load(Ordering::Relaxed) {
                return Err(RuntimeError::Aborted { rank: self.rank });
            }
            if now >= deadline {
                if delayed_until.is_some() {
                    return Err(RuntimeError::Timeout {
                        rank: self.rank,
                        action,
                        waiting_for: format!(
                            "the message for stage {stage}, microbatch {mb}, which arrived but is held back \
                             by the emulated link latency: --comm is longer than --recv-timeout"
                        ),
                        seconds: started.elapsed().as_secs_f64(),
                        since,
                    });
                }
                let (what, from) = match payload {
                    Payload::Activation => ("activation", stage - 1),
                    Payload::Gradient => ("output gradient", stage + 1),
                };
                return Err(RuntimeError::Timeout {
                    rank: self.rank,
                    action,
                    waiting_for: format!(
                        "the {what} of stage {stage}, microbatch {mb}, from stage {from} on rank {}; \
                         the sender failed, hung, or the message was lost (raise --recv-timeout if \
                         passes are really this slow)",
                        self.placement[from]
                    ),
                    seconds: started.elapsed().as_secs_f64(),
                    since,
                });
            }
            if let Some(t) = delayed_until {
                // Arrived but still "on the wire" (emulated latency): wait for it, but
                // never past the deadline or an abort.
                std::thread::sleep((t - now).min(deadline - now).min(Duration::from_millis(20)));
                continue;
            }
            // Poll briefly before blocking: a message that is about to arrive is picked
            // up without paying a thread wake-up on the critical path.
            let slice = if now - started < SPIN {
                std::thread::yield_now();
                Duration::ZERO
            } else {
                (deadline - now).min(Duration::from_millis(20))
            };
            match self.transport.recv_timeout(slice) {
                Ok(Some(m)) => {
                    self.mailbox.insert((m.payload, m.stage, m.microbatch), m);
                }
                Ok(None) => {}
                Err(e) => {
                    return Err(RuntimeError::Pass {
                        rank: self.rank,
                        action,
                        cause: format!("transport failed: {e}"),
                    })
                }
            }
        }
    }

    /// Delivers to the rank holding `stage` (this one: straight into the mailbox).
    fn deliver(
        &mut self,
        payload: Payload,
        stage: usize,
        mb: usize,
        tensor: Tensor,
        action: Action,
    ) -> Result<(), RuntimeError> {
        let lost = matches!(&self.fault, Some(Fault::LoseInputOf(a))
            if a.stage == stage && a.microbatch == mb
               && (a.kind == Kind::F) == (payload == Payload::Activation));
        if lost {
            return Ok(());
        }
        let msg = Message {
            payload,
            stage,
            microbatch: mb,
            tensor,
            ready_at: None,
        };
        let to = self.placement[stage];
        if to == self.rank {
            self.mailbox.insert((payload, stage, mb), msg);
            Ok(())
        } else {
            self.transport
                .send(to, msg)
                .map_err(|cause| RuntimeError::Pass {
                    rank: self.rank,
                    action,
                    cause,
                })
        }
    }

    /// Runs this rank's actions for `step`, all times relative to `epoch`.
    /// With `eval`, data comes from the held-out corpus (the caller then discards the
    /// gradients instead of stepping).
    pub fn run_step(
        &mut self,
        step: u64,
        order: &[Action],
        epoch: Instant,
        eval: bool,
        lr: Option<f32>,
    ) -> Result<RankStep, RuntimeError> {
        let mut out = RankStep {
            losses: Vec::new(),
            norm_sq: Vec::new(),
            timeline: Vec::with_capacity(order.len()),
            peak_bytes: 0,
        };
        let mut held: HashMap<(usize, usize), usize> = HashMap::new();
        let mut total_held = 0usize;
        let last = self.stages_total() - 1;
        for &a in order {
            if self.abort.load(Ordering::Relaxed) {
                return Err(RuntimeError::Aborted { rank: self.rank });
            }
            self.current = Some(a);
            if self.fault.as_ref() == Some(&Fault::PanicAt(a)) {
                panic!("injected fault at {a}");
            }
            let (s, j) = (a.stage, a.microbatch);
            let t_ready = Instant::now();
            // Inputs first (waiting is idle time), then compute.
            let input = match a.kind {
                Kind::F if s > 0 => Some(self.wait(Payload::Activation, s, j, a, epoch)?),
                Kind::I | Kind::B if s < last => {
                    Some(self.wait(Payload::Gradient, s, j, a, epoch)?)
                }
                _ => None,
            };
            let start = Instant::now();
            let err = |cause: String| RuntimeError::Pass {
                rank: self.rank,
                action: a,
                cause,
            };
            let mut send: Option<(Payload, usize, Tensor)> = None;
            match &mut self.engine {
                Engine::Emulated(costs) => {
                    let ms = costs.time(s, a.kind);
                    if !spin_sleep(Duration::from_secs_f64(ms / 1000.0), &self.abort) {
                        return Err(RuntimeError::Aborted { rank: self.rank });
                    }
                    match a.kind {
                        Kind::F if s < last => {
                            send = Some((Payload::Activation, s + 1, Tensor::zeros(&[0])))
                        }
                        Kind::I | Kind::B if s > 0 => {
                            send = Some((Payload::Gradient, s - 1, Tensor::zeros(&[0])))
                        }
                        _ => {}
                    }
                }
                Engine::Real { stages, .. } => {
                    let stage = stages
                        .get_mut(&s)
                        .ok_or_else(|| err(format!("stage {s} is not on this rank")))?;
                    match a.kind {
                        Kind::F => {
                            let need_data = s == 0 || s == last;
                            let data = if need_data {
                                let corpus = if eval {
                                    &self.eval_corpus
                                } else {
                                    &self.corpus
                                };
                                Some(
                                    corpus
                                        .microbatch(
                                            self.data_seed,
                                            step,
                                            j,
                                            self.model.microbatch_size,
                                            self.model.seq_len,
                                        )
                                        .map_err(|e| err(e.to_string()))?,
                                )
                            } else {
                                None
                            };
                            let stage_in = match input {
                                Some(x) => StageInput::Activations(x),
                                None => StageInput::Tokens(
                                    &data.as_ref().expect("first stage has data").tokens,
                                ),
                            };
                            let targets = (s == last)
                                .then(|| &data.as_ref().expect("last stage has data").targets[..]);
                            match stage
                                .forward(j, stage_in, targets)
                                .map_err(|e| err(e.to_string()))?
                            {
                                StageOutput::Loss(l) => out.losses.push((j, l)),
                                StageOutput::Activations(t) => {
                                    send = Some((Payload::Activation, s + 1, t))
                                }
                            }
                        }
                        Kind::I | Kind::B => {
                            let g = stage
                                .backward_input(j, input)
                                .map_err(|e| err(e.to_string()))?;
                            if let Some(mut g) = g {
                                if self.fault == Some(Fault::NanGradAt(step)) && s == 1 && j == 0 {
                                    g.data_mut()[0] = f32::NAN;
                                }
                                send = Some((Payload::Gradient, s - 1, g));
                            }
                            if a.kind == Kind::B {
                                stage.backward_weight(j).map_err(|e| err(e.to_string()))?;
                            }
                        }
                        Kind::W => stage.backward_weight(j).map_err(|e| err(e.to_string()))?,
                    }
                    let now_held = stage.held_bytes(j);
                    let before = held.insert((s, j), now_held).unwrap_or(0);
                    total_held = total_held + now_held - before;
                    out.peak_bytes = out.peak_bytes.max(total_held);
                }
            }
            let end = Instant::now();
            if let Some((payload, to_stage, t)) = send {
                self.deliver(payload, to_stage, j, t, a)?;
            }
            out.timeline.push(MeasuredSlot {
                action: a,
                start: (start - epoch).as_secs_f64(),
                end: (end - epoch).as_secs_f64(),
                waited: (start - t_ready).as_secs_f64(),
            });
        }
        self.current = None;
        if let Engine::Real { stages, .. } = &self.engine {
            out.norm_sq = stages
                .iter()
                .map(|(&s, st)| (s, nobubble_nn::optim::grad_norm_sq(&st.params())))
                .collect();
        }
        if let (Some(mode), Some(lr)) = (self.post_validate, lr) {
            self.optimistic_step(mode, lr, &out.norm_sq)?;
        }
        Ok(out)
    }

    /// Post-validation: step at once with what this rank knows (its own partial norms;
    /// unclipped), keeping what a rollback needs. The verdict comes later ([`Worker::validate`]).
    fn optimistic_step(
        &mut self,
        mode: Rollback,
        lr: f32,
        norms: &[(usize, f64)],
    ) -> Result<(), RuntimeError> {
        self.optimistic.clear();
        self.optimistic_lr = lr;
        if let Engine::Real { stages, optimizers } = &mut self.engine {
            for (s, stage) in stages.iter_mut() {
                let opt = optimizers.get_mut(s).expect("one optimizer per stage");
                let finite = norms.iter().any(|&(k, n)| k == *s && n.is_finite());
                let snapshot =
                    (mode == Rollback::Copy && finite).then(|| opt.snapshot(&stage.params()));
                if finite {
                    opt.config.lr = lr;
                    opt.step(&mut stage.params_mut(), 1.0)
                        .map_err(|e| RuntimeError::Config(format!("stage {s}: {e}")))?;
                }
                self.optimistic.insert(*s, (snapshot, finite));
            }
        }
        Ok(())
    }

    /// Applies the validation verdict to the optimistic step, then zeroes the gradients.
    pub fn validate(&mut self, verdict: Verdict) -> Result<(), RuntimeError> {
        let mode = self.post_validate.unwrap_or(Rollback::Copy);
        if let Engine::Real { stages, optimizers } = &mut self.engine {
            for (s, stage) in stages.iter_mut() {
                let opt = optimizers.get_mut(s).expect("one optimizer per stage");
                let (snapshot, stepped) = self.optimistic.remove(s).unwrap_or((None, false));
                let fail = |e: nobubble_nn::NnError| {
                    RuntimeError::Config(format!("stage {s}: rollback failed: {e}"))
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
                    opt.config.lr = self.optimistic_lr;
                    opt.step(&mut stage.params_mut(), scale).map_err(fail)?;
                }
                stage.zero_grads();
            }
        }
        Ok(())
    }

    /// The synchronous optimizer step: AdamW with the global clip factor (or skip on a
    /// non-finite norm), then zero the gradients.
    pub fn apply(&mut self, scale: Option<f32>, lr: f32) -> Result<(), RuntimeError> {
        if let Engine::Real { stages, optimizers } = &mut self.engine {
            for (s, stage) in stages.iter_mut() {
                if let Some(scale) = scale {
                    let opt = optimizers.get_mut(s).expect("one optimizer per stage");
                    opt.config.lr = lr;
                    opt.step(&mut stage.params_mut(), scale)
                        .map_err(|e| RuntimeError::Config(e.to_string()))?;
                }
                stage.zero_grads();
            }
        }
        Ok(())
    }

    /// M_B and M_W in bytes of each stage here, measured by the engine on a probe
    /// microbatch (gradients restored afterwards).
    pub fn measure_memory(&mut self) -> Result<Vec<(usize, usize, usize)>, RuntimeError> {
        match &mut self.engine {
            Engine::Real { stages, .. } => stages
                .iter_mut()
                .map(|(&s, st)| {
                    let m = st
                        .measure_memory()
                        .map_err(|e| RuntimeError::Config(format!("stage {s}: {e}")))?;
                    Ok((s, m.total.after_forward, m.total.after_input_grad))
                })
                .collect(),
            Engine::Emulated(_) => Ok(Vec::new()),
        }
    }

    /// Every parameter of this rank's stages: (stage, name, values).
    pub fn params(&self) -> Vec<(usize, String, Vec<f32>)> {
        match &self.engine {
            Engine::Real { stages, .. } => stages
                .iter()
                .flat_map(|(&s, st)| {
                    st.params()
                        .into_iter()
                        .map(move |p| (s, p.name.clone(), p.value.data().to_vec()))
                })
                .collect(),
            Engine::Emulated(_) => Vec::new(),
        }
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
