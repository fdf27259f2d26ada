//! One rank of the SPMD executor: every rank — a thread of one process or a process of an MPI
//! job — runs this same program. A step is: run the rank's actions on real stages (or sleep
//! for their cost, emulated), exchanging tensors through its [`Transport`]; reduce each
//! stage's gradients over the data-parallel replicas after that stage's last W; all-gather
//! the losses, partial gradient norms and non-finite flags; step the optimizer — synchronously
//! after the all-gather, or optimistically at once with the verdict applied at the start of
//! the next step (post-validation, [`crate::optimizer_step`]).
//!
//! Nothing is decided by a coordinator: every rank computes the same loss, norm and clip
//! factor from the same all-gathered numbers summed in the same fixed order.
//!
//! Receives wait in short slices so a failure elsewhere (the abort flag, for threads) or a
//! deadline stops the wait; time spent waiting is recorded as idle. Sends never wait, so W
//! can fill the gap behind an input gradient that has just left.

use crate::error::RuntimeError;
use crate::transport::{Key, Message, Tag, Transport};
use nobubble_nn::optim::{AdamW, AdamWSnapshot};
use nobubble_nn::{ByteCorpus, GptConfig, Stage, StageInput, StageOutput, Tensor, TrainConfig};
use nobubble_schedule::{Action, CostModel, Kind};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::optimizer_step::{Rollback, StepSummary, Verdict};

/// One action as it ran: times in seconds since the run's common origin.
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

/// Messages and bytes this rank sent and received, and how long it spent sending and waiting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CommStats {
    /// Messages sent.
    pub sent: u64,
    /// Bytes sent (wire size).
    pub sent_bytes: u64,
    /// Seconds spent inside send calls (serializing and posting).
    pub send_seconds: f64,
    /// Messages received.
    pub received: u64,
    /// Bytes received.
    pub received_bytes: u64,
    /// Seconds spent waiting for messages (pipeline and collectives).
    pub wait_seconds: f64,
    /// Seconds of that spent in the data-parallel gradient reduction.
    pub reduce_seconds: f64,
    /// Sum of the pipeline messages' measured latency (receipt − send), seconds.
    pub latency_sum: f64,
    /// Pipeline messages whose latency was measured.
    pub latency_count: u64,
}

impl CommStats {
    /// `self − earlier`, field by field.
    pub fn since(&self, earlier: &CommStats) -> CommStats {
        CommStats {
            sent: self.sent - earlier.sent,
            sent_bytes: self.sent_bytes - earlier.sent_bytes,
            send_seconds: self.send_seconds - earlier.send_seconds,
            received: self.received - earlier.received,
            received_bytes: self.received_bytes - earlier.received_bytes,
            wait_seconds: self.wait_seconds - earlier.wait_seconds,
            reduce_seconds: self.reduce_seconds - earlier.reduce_seconds,
            latency_sum: self.latency_sum - earlier.latency_sum,
            latency_count: self.latency_count - earlier.latency_count,
        }
    }

    /// Mean measured latency of a pipeline message, in milliseconds (0 without any).
    pub fn mean_latency_ms(&self) -> f64 {
        if self.latency_count == 0 {
            0.0
        } else {
            1e3 * self.latency_sum / self.latency_count as f64
        }
    }
}

/// What a rank reports after a step.
#[derive(Clone, Debug)]
pub struct RankStep {
    /// The rank's measured actions.
    pub timeline: Vec<MeasuredSlot>,
    /// Peak activation bytes held by the rank's stages during the step.
    pub peak_bytes: usize,
    /// This step's outcome, when known at its end (synchronous and evaluation steps).
    pub summary: Option<StepSummary>,
    /// Post-validation: the outcomes of earlier steps settled since the last step (by this
    /// one, or in between by an export).
    pub settled: Vec<StepSummary>,
    /// Communication during the step.
    pub comm: CommStats,
}

/// Faults a test can inject to check that the run stops cleanly.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Panic when about to run this action (on the rank holding its stage, in replica 0).
    PanicAt(Action),
    /// Drop the message the sender of this action's input would send (replica 0).
    LoseInputOf(Action),
    /// Put a NaN into stage 0's first gradient at this step (tests post-validation paths).
    NanGradAt(u64),
    /// End the process when about to run this action (replica 0), after its sends so far
    /// were received: a rank that dies.
    ExitAt(Action),
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

/// How the world's ranks are arranged: `replicas` pipelines of `pipeline_ranks` ranks each;
/// global rank = replica · pipeline_ranks + pipeline rank.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    /// Stage → pipeline rank (the schedule's placement).
    pub placement: Vec<usize>,
    /// Ranks of one pipeline.
    pub pipeline_ranks: usize,
    /// Data-parallel replicas.
    pub replicas: usize,
    /// Microbatches per replica per step.
    pub microbatches: usize,
}

impl Layout {
    /// The global rank holding `stage` in `replica`.
    pub fn rank_of(&self, replica: usize, stage: usize) -> usize {
        replica * self.pipeline_ranks + self.placement[stage]
    }

    /// Ranks in the world.
    pub fn world(&self) -> usize {
        self.replicas * self.pipeline_ranks
    }
}

/// Emulated latencies (zero for real runs).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Latency {
    /// Added to activations and gradients between stages.
    pub pipeline: Duration,
    /// Added to collective traffic: gradient reduction, step statistics (an all-reduce's
    /// latency).
    pub collective: Duration,
}

pub(crate) struct Worker {
    pub rank: usize,
    pub replica: usize,
    pub layout: Layout,
    pub engine: Engine,
    pub transport: Box<dyn Transport>,
    pub mailbox: HashMap<Key, Message>,
    pub abort: Arc<AtomicBool>,
    pub recv_timeout: Duration,
    pub corpus: Arc<ByteCorpus>,
    /// Held-out text for evaluation steps.
    pub eval_corpus: Arc<ByteCorpus>,
    pub model: GptConfig,
    pub train: TrainConfig,
    pub fault: Option<Fault>,
    /// Post-validation: how to undo optimistic steps (`None`: synchronous steps).
    pub post_validate: Option<Rollback>,
    /// Per stage here: the snapshot taken before the optimistic step (copy mode) and
    /// whether the stage stepped.
    pub optimistic: BTreeMap<usize, (Option<AdamWSnapshot>, bool)>,
    /// The post-validated step whose verdict is still to come.
    pub pending: Option<u64>,
    /// Summaries of post-validated steps settled since last taken (whoever settled them:
    /// the next step, a checkpoint export, the end of the run).
    pub settled: Vec<StepSummary>,
    /// The clock all timelines and send times use.
    pub origin: Instant,
    pub latency: Latency,
    pub comm: CommStats,
    /// Collective rounds so far (every rank counts the same rounds: SPMD).
    pub round: u64,
}

/// The round of a pipeline message: its step, whether an evaluation step, and which attempt at
/// the step (a post-validated step whose predecessor was rolled back is run again). Messages of
/// a discarded attempt can then never be mistaken for the rerun's. Rounds increase with time.
fn pipe_round(step: u64, eval: bool, attempt: u64) -> u64 {
    debug_assert!(attempt <= 1);
    ((step << 1) | eval as u64) << 1 | attempt
}

/// The mailbox index of a pipeline message: its round and microbatch.
fn pipe_index(round: u64, mb: usize) -> u64 {
    debug_assert!(mb < 1 << 24);
    (round << 24) | mb as u64
}

/// The round a pipeline message index belongs to.
fn round_of(index: u64) -> u64 {
    index >> 24
}

/// What running a step's actions came to.
enum Ran {
    /// Every action ran: losses by global microbatch, timeline, peak activation bytes.
    Done(Vec<(usize, f32)>, Vec<MeasuredSlot>, usize),
    /// Post-validation rolled the previous step back after some of this step's forwards ran
    /// speculatively on its optimistic weights: these (stage, microbatch) are thrown away and
    /// the step runs again. Their time shows as idle; they stay out of the pass-time medians.
    Again(Vec<(usize, usize)>),
}

thread_local! {
    /// The action this thread's rank is running, for reporting a panic that unwinds past the
    /// rank (threads and MPI processes catch it outside, where the worker is gone).
    static RUNNING: std::cell::Cell<Option<Action>> = const { std::cell::Cell::new(None) };
}

/// The action this thread's rank was running when it stopped (a panic), if any.
pub fn running_action() -> Option<Action> {
    RUNNING.with(|r| r.get())
}

/// How long a receive polls before it blocks.
const SPIN: Duration = Duration::from_micros(1000);

impl Worker {
    fn stages_total(&self) -> usize {
        self.layout.placement.len()
    }

    /// Seconds since the common origin.
    pub fn now(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }

    fn latency_of(&self, tag: Tag) -> f64 {
        match tag {
            Tag::Activation | Tag::Gradient => self.latency.pipeline.as_secs_f64(),
            Tag::Decision => 0.0,
            _ => self.latency.collective.as_secs_f64(),
        }
    }

    /// [`Worker::post`] of collective traffic, whose failure names this rank.
    pub(crate) fn post_control(&mut self, to: usize, msg: Message) -> Result<(), RuntimeError> {
        self.post(to, msg)
            .map_err(|e| RuntimeError::Config(format!("rank {}: {e}", self.rank)))
    }

    /// Sends `msg` (already addressed) to `to`, or into the own mailbox.
    pub fn post(&mut self, to: usize, mut msg: Message) -> Result<(), String> {
        msg.from = self.rank;
        msg.sent_at = self.now();
        if to == self.rank {
            self.mailbox.insert(msg.key(), msg);
            return Ok(());
        }
        let t0 = Instant::now();
        self.comm.sent += 1;
        self.comm.sent_bytes += msg.wire_len() as u64;
        let r = self.transport.send(to, msg);
        self.comm.send_seconds += t0.elapsed().as_secs_f64();
        r
    }

    /// Waits for the message with `key`, checking the abort flag and the deadline; the
    /// wait counts as idle time. `what` describes it for the timeout message.
    pub fn wait_for(
        &mut self,
        key: Key,
        action: Option<Action>,
        what: &dyn Fn() -> String,
    ) -> Result<Message, RuntimeError> {
        self.wait_or(key, action, what, None)
            .map(|m| m.expect("no interruption asked for"))
    }

    /// As [`Worker::wait_for`], but gives up (`None`) as soon as `interrupt` holds.
    fn wait_or(
        &mut self,
        key: Key,
        action: Option<Action>,
        what: &dyn Fn() -> String,
        interrupt: Option<&dyn Fn(&Worker) -> bool>,
    ) -> Result<Option<Message>, RuntimeError> {
        let started = Instant::now();
        let since = self.now();
        let deadline = started + self.recv_timeout;
        let r = self.wait_inner(key, action, what, started, since, deadline, interrupt);
        self.comm.wait_seconds += started.elapsed().as_secs_f64();
        r
    }

    /// When the message with `key`, if here, may be used (its emulated latency elapsed);
    /// `None` if it has not arrived. Without emulated latency a message is usable on arrival:
    /// send times from another machine's clock are never compared with this one's.
    fn ready_in(&self, key: &Key) -> Option<f64> {
        let m = self.mailbox.get(key)?;
        let latency = self.latency_of(key.0);
        Some(if latency > 0.0 {
            m.sent_at + latency - self.now()
        } else {
            0.0
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn wait_inner(
        &mut self,
        key: Key,
        action: Option<Action>,
        what: &dyn Fn() -> String,
        started: Instant,
        since: f64,
        deadline: Instant,
        interrupt: Option<&dyn Fn(&Worker) -> bool>,
    ) -> Result<Option<Message>, RuntimeError> {
        loop {
            let now = Instant::now();
            let held_back = match self.ready_in(&key) {
                Some(wait) if wait <= 0.0 => {
                    return Ok(Some(self.mailbox.remove(&key).expect("present")));
                }
                Some(wait) => Some(Duration::from_secs_f64(wait)),
                None => None,
            };
            if interrupt.is_some_and(|f| f(self)) {
                return Ok(None);
            }
            if self.abort.load(Ordering::Relaxed) {
                return Err(RuntimeError::Aborted { rank: self.rank });
            }
            if now >= deadline {
                let waiting_for = match held_back {
                    Some(_) => format!(
                        "{}, which arrived but is held back by the emulated latency: --comm or \
                         --collective-latency is longer than --recv-timeout",
                        what()
                    ),
                    None => format!(
                        "{}; that rank failed, died, hung, or the message was lost (raise \
                         --recv-timeout if passes are really this slow)",
                        what()
                    ),
                };
                return Err(RuntimeError::Timeout {
                    rank: self.rank,
                    action,
                    waiting_for,
                    seconds: started.elapsed().as_secs_f64(),
                    since,
                });
            }
            if let Some(d) = held_back {
                // Arrived but still "on the wire" (emulated latency).
                std::thread::sleep(d.min(deadline - now).min(Duration::from_millis(20)));
                continue;
            }
            // Poll briefly before blocking: a message that is about to arrive is picked up
            // without paying a thread wake-up on the critical path.
            let slice = if now - started < SPIN {
                std::thread::yield_now();
                Duration::ZERO
            } else {
                (deadline - now).min(Duration::from_millis(20))
            };
            match self.transport.recv_timeout(slice) {
                Ok(Some(m)) => {
                    self.comm.received += 1;
                    self.comm.received_bytes += m.wire_len() as u64;
                    if m.tag.is_pipeline() && m.key() == key && since <= m.sent_at {
                        // Waited for it since before it was sent: receipt − send is the
                        // link's latency (the same clock on one machine).
                        self.comm.latency_sum += (self.now() - m.sent_at).max(0.0);
                        self.comm.latency_count += 1;
                    }
                    self.mailbox.insert(m.key(), m);
                }
                Ok(None) => {}
                Err(e) => {
                    return Err(match action {
                        Some(action) => RuntimeError::Pass {
                            rank: self.rank,
                            action,
                            cause: format!("transport failed: {e}"),
                        },
                        None => RuntimeError::Config(format!(
                            "rank {}: transport failed: {e}",
                            self.rank
                        )),
                    })
                }
            }
        }
    }

    /// Every rank's statistics of `step` are here and usable: the verdict can be settled
    /// without waiting.
    fn stats_ready(&self, step: u64) -> bool {
        (0..self.transport.size()).all(|from| {
            from == self.rank
                || self
                    .ready_in(&(Tag::Stats, 0, step, from))
                    .is_some_and(|w| w <= 0.0)
        })
    }

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
        let mut forwards: Vec<(usize, usize)> = Vec::new();
        let mut losses = Vec::new();
        let mut timeline = Vec::with_capacity(order.len());
        let mut peak = 0usize;
        let mut held: HashMap<(usize, usize), usize> = HashMap::new();
        let mut total_held = 0usize;
        let mut weight_passes: BTreeMap<usize, usize> = BTreeMap::new();
        let last = self.stages_total() - 1;
        let m = self.layout.microbatches;
        for &a in order {
            if self.abort.load(Ordering::Relaxed) {
                return Err(RuntimeError::Aborted { rank: self.rank });
            }
            RUNNING.with(|r| r.set(Some(a)));
            if self.replica == 0 {
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
            let (s, j) = (a.stage, a.microbatch);
            let t_ready = self.now();
            if a.kind != Kind::F && self.pending.is_some() {
                // Post-validation: forwards so far ran on the previous step's optimistic
                // weights; a backward pass must not. The verdict is due (its statistics
                // travelled during those forwards): keep, or throw this attempt away. Every
                // rank reaches the same verdict and so starts the same attempt.
                if !self.settle_kept()? {
                    return Ok(Ran::Again(forwards));
                }
            }
            // Inputs first (waiting is idle time), then compute.
            let input = match a.kind {
                Kind::F if s > 0 => {
                    match self.wait_input(Tag::Activation, a, round, self.pending)? {
                        Some(x) => Some(x),
                        None => {
                            // The verdict came before the input: settle it now, since the
                            // sender may have started the step again.
                            if !self.settle_kept()? {
                                return Ok(Ran::Again(forwards));
                            }
                            self.wait_input(Tag::Activation, a, round, None)?
                        }
                    }
                }
                Kind::I | Kind::B if s < last => self.wait_input(Tag::Gradient, a, round, None)?,
                _ => None,
            };
            if a.kind == Kind::F {
                forwards.push((s, j));
            }
            let start = self.now();
            let err = |cause: String| RuntimeError::Pass {
                rank: self.rank,
                action: a,
                cause,
            };
            let mut send: Option<(Tag, usize, Tensor)> = None;
            match &mut self.engine {
                Engine::Emulated(costs) => {
                    let ms = costs.time(s, a.kind);
                    if !spin_sleep(Duration::from_secs_f64(ms / 1000.0), &self.abort) {
                        return Err(RuntimeError::Aborted { rank: self.rank });
                    }
                    match a.kind {
                        Kind::F if s < last => {
                            send = Some((Tag::Activation, s + 1, Tensor::zeros(&[0])))
                        }
                        Kind::I | Kind::B if s > 0 => {
                            send = Some((Tag::Gradient, s - 1, Tensor::zeros(&[0])))
                        }
                        _ => {}
                    }
                }
                Engine::Real { stages, .. } => {
                    let stage = stages
                        .get_mut(&s)
                        .ok_or_else(|| err(format!("stage {s} is not on this rank")))?;
                    let global_j = self.replica * m + j;
                    match a.kind {
                        Kind::F => {
                            let data = if s == 0 || s == last {
                                let corpus = if eval {
                                    &self.eval_corpus
                                } else {
                                    &self.corpus
                                };
                                Some(
                                    corpus
                                        .microbatch(
                                            self.train.data_seed,
                                            step,
                                            global_j,
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
                                StageOutput::Loss(l) => losses.push((global_j, l)),
                                StageOutput::Activations(t) => {
                                    send = Some((Tag::Activation, s + 1, t))
                                }
                            }
                        }
                        Kind::I | Kind::B => {
                            let g = stage
                                .backward_input(j, input)
                                .map_err(|e| err(e.to_string()))?;
                            if let Some(mut g) = g {
                                if self.fault == Some(Fault::NanGradAt(step))
                                    && s == 1
                                    && global_j == 0
                                {
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
                    let now_held = stage.held_bytes(j);
                    let before = held.insert((s, j), now_held).unwrap_or(0);
                    total_held = total_held + now_held - before;
                    peak = peak.max(total_held);
                }
            }
            let end = self.now();
            if let Some((tag, to_stage, t)) = send {
                self.deliver(tag, to_stage, j, round, t, a)?;
            }
            if matches!(a.kind, Kind::W | Kind::B) {
                let done = weight_passes.entry(s).or_insert(0);
                *done += 1;
                if *done == m && !eval {
                    // The stage's gradient is complete: start its data-parallel reduction
                    // now, overlapped with the rank's remaining passes.
                    self.share_gradient(step, s)?;
                }
            }
            timeline.push(MeasuredSlot {
                action: a,
                start,
                end,
                waited: start - t_ready,
            });
        }
        RUNNING.with(|r| r.set(None));
        Ok(Ran::Done(losses, timeline, peak))
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
        let before = self.comm;
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
            self.optimizer_step(step, &losses)?
        };
        Ok(RankStep {
            timeline,
            peak_bytes,
            summary,
            settled: std::mem::take(&mut self.settled),
            comm: self.comm.since(&before),
        })
    }

    pub(crate) fn zero_grads(&mut self) {
        if let Engine::Real { stages, .. } = &mut self.engine {
            for st in stages.values_mut() {
                st.zero_grads();
            }
        }
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
