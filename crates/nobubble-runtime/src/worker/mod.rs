//! One rank of the SPMD executor: every rank — a thread of one process or a process of an MPI
//! job — runs this same program. A step is: run the rank's actions on real stages (or sleep
//! for their cost, emulated), exchanging tensors through its [`Transport`]; reduce each
//! stage's gradients over the data-parallel replicas after that stage's last W; all-gather
//! the losses, partial gradient norms and non-finite flags; step the optimizer — synchronously
//! after the all-gather, or optimistically at once with the verdict applied at the start of
//! the next step (post-validation, [`optimizer_step`]).
//!
//! Nothing is decided by a coordinator: every rank computes the same loss, norm and clip
//! factor from the same all-gathered numbers summed in the same fixed order.
//!
//! Receives wait in short slices so a failure elsewhere (the abort flag, for threads) or a
//! deadline stops the wait; time spent waiting is recorded as idle. Sends never wait, so W
//! can fill the gap behind an input gradient that has just left.

use crate::checkpoint::{self, StageState, TrainingState};
use crate::error::RuntimeError;
use crate::launch::RankContext;
use crate::run::RunConfig;
use crate::transport::{Key, Message, Transport};
use nobubble_nn::lending::CoreLender;
use nobubble_nn::optim::{AdamW, AdamWSnapshot};
use nobubble_nn::{Corpus, CpuBackend, GptConfig, Stage, TrainConfig};
use nobubble_schedule::{Action, CostModel};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod collective;
mod mailbox;
pub mod optimizer_step;
mod passes;

pub use optimizer_step::{Rollback, StepSummary, Verdict};

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
    /// Matrix products that ran on a core a waiting rank lent (in-process ranks): compute,
    /// not traffic, but the other side of the waits counted here.
    #[serde(default)]
    pub borrowed_products: u64,
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
            borrowed_products: self.borrowed_products - earlier.borrowed_products,
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
        /// The backend all of them share (for its counters).
        backend: Arc<CpuBackend>,
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

/// One rank's executor state. Private to this module and its parts (`mailbox.rs`: sending
/// and waiting; `passes.rs`: running a step's actions; `collective.rs`; `optimizer_step.rs`),
/// so what the rest of the crate may do with a rank goes through [`crate::Rank`]'s methods.
pub(crate) struct Worker {
    rank: usize,
    replica: usize,
    layout: Layout,
    engine: Engine,
    transport: Box<dyn Transport>,
    /// Messages received (or posted to itself) and not yet taken, by key.
    mailbox: HashMap<Key, Message>,
    /// Set when another in-process rank failed: every wait gives up.
    abort: Arc<AtomicBool>,
    recv_timeout: Duration,
    corpus: Arc<Corpus>,
    /// Held-out text for evaluation steps.
    eval_corpus: Arc<Corpus>,
    model: GptConfig,
    train: TrainConfig,
    fault: Option<Fault>,
    /// Post-validation: how to undo optimistic steps (`None`: synchronous steps).
    post_validate: Option<Rollback>,
    /// Per stage here: the snapshot taken before the optimistic step (copy mode) and
    /// whether the stage stepped.
    optimistic: BTreeMap<usize, (Option<AdamWSnapshot>, bool)>,
    /// The post-validated step whose verdict is still to come.
    pending: Option<u64>,
    /// Summaries of post-validated steps settled since last taken (whoever settled them:
    /// the next step, a checkpoint export, the end of the run).
    settled: Vec<StepSummary>,
    /// The clock all timelines and send times use.
    origin: Instant,
    latency: Latency,
    /// Where this rank offers its core while it waits.
    lender: Option<Arc<CoreLender>>,
    comm: CommStats,
    /// Collective rounds so far (every rank counts the same rounds: SPMD).
    round: u64,
}

/// What a worker is built from besides its engine: the run's settings and the rank's
/// connection to the world.
pub(crate) struct WorkerSetup<'a> {
    pub config: &'a RunConfig,
    pub layout: Layout,
    pub latency: Latency,
    pub ctx: RankContext,
    pub corpus: Arc<Corpus>,
    pub eval_corpus: Arc<Corpus>,
}

impl Worker {
    /// A rank's executor over `engine`; its rank is the transport's.
    pub(crate) fn new(setup: WorkerSetup<'_>, engine: Engine) -> Worker {
        let WorkerSetup {
            config,
            layout,
            latency,
            ctx,
            corpus,
            eval_corpus,
        } = setup;
        let rank = ctx.transport.rank();
        Worker {
            rank,
            replica: rank / layout.pipeline_ranks,
            layout,
            engine,
            transport: ctx.transport,
            mailbox: HashMap::new(),
            abort: ctx.abort,
            recv_timeout: config.recv_timeout,
            corpus,
            eval_corpus,
            model: config.model.clone(),
            train: config.train.clone(),
            fault: config.fault.clone(),
            post_validate: config.post_validate,
            optimistic: BTreeMap::new(),
            pending: None,
            settled: Vec::new(),
            origin: ctx.origin,
            latency,
            lender: ctx.lender,
            comm: CommStats::default(),
            round: 0,
        }
    }

    /// Stages of the whole pipeline.
    fn stages_total(&self) -> usize {
        self.layout.placement.len()
    }

    /// This rank (global).
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    /// This rank's data-parallel replica.
    pub(crate) fn replica(&self) -> usize {
        self.replica
    }

    /// Microbatches per replica per step.
    pub(crate) fn microbatches(&self) -> usize {
        self.layout.microbatches
    }

    /// Turns the shared lender on or off (no lender: nothing to do).
    pub(crate) fn set_lending(&self, on: bool) {
        if let Some(l) = &self.lender {
            l.set_enabled(on);
        }
    }

    /// Communication so far.
    pub(crate) fn comm(&self) -> CommStats {
        let borrowed_products = match &self.engine {
            Engine::Real { backend, .. } => backend.borrowed_products(),
            Engine::Emulated(_) => 0,
        };
        CommStats {
            borrowed_products,
            ..self.comm
        }
    }

    /// The transport's description.
    pub(crate) fn transport(&self) -> String {
        self.transport.describe()
    }

    /// Completes every send in flight.
    pub(crate) fn flush(&mut self) -> Result<(), String> {
        self.transport.flush()
    }

    /// Summaries of the post-validated steps settled since the last call.
    pub(crate) fn take_settled(&mut self) -> Vec<StepSummary> {
        std::mem::take(&mut self.settled)
    }

    /// This rank's part of the training state (its stages' weights and AdamW state).
    pub(crate) fn export_stages(&self) -> Result<Vec<StageState>, RuntimeError> {
        checkpoint::export_engine(&self.engine)
    }

    /// Loads this rank's stages from `state` by name; returns the names used.
    pub(crate) fn import_stages(
        &mut self,
        state: &TrainingState,
    ) -> Result<BTreeSet<String>, RuntimeError> {
        checkpoint::import_engine(&mut self.engine, state)
    }
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

thread_local! {
    /// The action this thread's rank is running, for reporting a panic that unwinds past the
    /// rank (threads and MPI processes catch it outside, where the worker is gone).
    static RUNNING: std::cell::Cell<Option<Action>> = const { std::cell::Cell::new(None) };
}

/// The action this thread's rank was running when it stopped (a panic), if any.
pub fn running_action() -> Option<Action> {
    RUNNING.with(|r| r.get())
}

impl Worker {
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
                        .map_err(|e| RuntimeError::Fault(format!("stage {s}: {e}")))?;
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
