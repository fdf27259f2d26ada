//! Starting the SPMD program: as threads of this process ([`threads`]) or, with the `mpi`
//! feature, as this process being one rank of an MPI job ([`crate::mpi`]). Either way each
//! rank gets a [`Transport`], the common clock origin and an abort flag, and runs the same
//! body.

use crate::error::{nearest_cause, RuntimeError};
use crate::transport::{InProcess, Transport};
use nobubble_nn::lending::CoreLender;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a rank that timed out waits before stopping the others, so that ranks waiting
/// on the same lost message reach their own deadlines and the report can name the wait
/// nearest the cause.
const TIMEOUT_GRACE: Duration = Duration::from_millis(250);

/// What a rank's body gets.
pub struct RankContext {
    /// Its link to the others.
    pub transport: Box<dyn Transport>,
    /// The clock all ranks' timelines use.
    pub origin: Instant,
    /// Set when any rank fails (in-process ranks stop on it).
    pub abort: Arc<AtomicBool>,
    /// The cores waiting ranks lend to working ones (in-process ranks that fit on this
    /// machine's cores; `None` elsewhere).
    pub lender: Option<Arc<CoreLender>>,
}

/// Whether `world` in-process ranks of `threads` threads each lend their cores while they
/// wait: with real compute, one thread each (a rank of more already has its cores), when they
/// fit on the cores this process may use (more ranks than cores already share every core)
/// and `NOBUBBLE_LEND_CORES` is not `0`.
fn lends_cores(world: usize, threads: usize, real: bool) -> bool {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let off = std::env::var("NOBUBBLE_LEND_CORES").is_ok_and(|v| v.trim() == "0");
    real && threads == 1 && world > 1 && world <= cores && !off
}

/// The lender such ranks share, if they lend ([`lends_cores`]).
pub fn lender_for(world: usize, threads: usize, real: bool) -> Option<Arc<CoreLender>> {
    lends_cores(world, threads, real)
        .then(|| CoreLender::new(world))
        .flatten()
}

/// Runs `body` on `world` ranks that are threads of this process, connected by channels and
/// sharing `lender` ([`lender_for`]; `None`: no rank lends its core). Returns every rank's
/// result in rank order, or the failure nearest the cause (a panic is caught and reported
/// with its rank; the others stop within a fraction of a second).
pub fn threads<R: Send>(
    world: usize,
    lender: Option<Arc<CoreLender>>,
    body: impl Fn(RankContext) -> Result<R, RuntimeError> + Sync,
) -> Result<Vec<R>, RuntimeError> {
    let abort = Arc::new(AtomicBool::new(false));
    let origin = Instant::now();
    let body = &body;
    let results: Vec<Result<R, RuntimeError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = InProcess::connect(world)
            .into_iter()
            .enumerate()
            .map(|(rank, t)| {
                let abort = abort.clone();
                let lender = lender.clone();
                std::thread::Builder::new()
                    .name(format!("rank-{rank}"))
                    .spawn_scoped(scope, move || {
                        let ctx = RankContext {
                            transport: Box::new(t),
                            origin,
                            abort: abort.clone(),
                            lender,
                        };
                        guard(rank, &abort, || body(ctx))
                    })
                    .expect("spawn a rank thread")
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| {
                h.join().unwrap_or_else(|_| {
                    Err(RuntimeError::Panic {
                        rank,
                        action: None,
                        cause: "the thread died".into(),
                    })
                })
            })
            .collect()
    });
    let mut out = Vec::with_capacity(world);
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(v) => out.push(v),
            Err(e) => errors.push(e),
        }
    }
    match nearest_cause(errors) {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Runs rank `rank`'s `f`, turning a panic into an error naming the rank and the action it
/// was running; on a failure, stops the other in-process ranks through `abort` — after a grace
/// period for a timeout, so that ranks waiting on the same lost message reach their own
/// deadlines and the report can name the wait nearest the cause. Processes use it too (their
/// `abort` reaches no one; a failure ends the job through MPI).
pub fn guard<T>(
    rank: usize,
    abort: &AtomicBool,
    f: impl FnOnce() -> Result<T, RuntimeError>,
) -> Result<T, RuntimeError> {
    let r = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(RuntimeError::Panic {
            rank,
            action: crate::worker::running_action(),
            cause: panic_message(&p),
        })
    });
    if let Err(e) = &r {
        if matches!(e, RuntimeError::Timeout { .. }) && !abort.load(Ordering::Relaxed) {
            std::thread::sleep(TIMEOUT_GRACE);
        }
        if !matches!(e, RuntimeError::Aborted { .. }) {
            abort.store(true, Ordering::Relaxed);
        }
    }
    r
}

/// A panic's message, for reports.
pub fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// The number of ranks an MPI or Slurm launcher started this process among, if any
/// (`mpirun`, `srun`): read from the environment before MPI is initialized, so a binary built
/// without MPI can refuse such a launch instead of running the whole job in every process.
pub fn launched_world_size() -> Option<usize> {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_SIZE",
        "SLURM_STEP_NUM_TASKS",
    ]
    .iter()
    .find_map(|k| std::env::var(k).ok()?.trim().parse().ok())
}
