//! Ranks as processes of an MPI job (feature `mpi`: the `mpi` crate over the system's MPI,
//! e.g. Open MPI): `mpirun -np N nobubble train …` or `srun nobubble train …`.
//!
//! A message is one MPI message of bytes ([`Message::encode`]). Sends are non-blocking
//! (`MPI_Isend`): the encoded buffer is kept alive by this transport until the request
//! completes, which is tested on every later call, so a rank runs its next pass (a W) while
//! its input gradient is in flight. Receives probe for any message from anyone
//! (`MPI_Improbe` + `MPI_Mrecv`), so no receive is posted for a pass that may never come and
//! the executor's deadline and abort checks stay in charge of every wait.

use crate::error::RuntimeError;
use crate::launch::RankContext;
use crate::transport::{Message, Transport};
use mpi::point_to_point::MatchedReceiveVec;
use mpi::request::{Request, StaticScope};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One send in flight: the request and the buffer it reads, freed once it completes.
struct InFlight {
    request: Option<Request<'static, [u8], StaticScope>>,
    buffer: *mut [u8],
}

/// This process's link to the other ranks of the MPI job.
pub struct MpiTransport {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    in_flight: Vec<InFlight>,
    version: String,
}

/// MPI itself, initialized for this process: dropping it finalizes MPI. Kept apart from the
/// transport so that a failed run can still `MPI_Abort` after its transport is gone.
pub struct MpiEnvironment {
    _universe: mpi::environment::Universe,
}

// SAFETY: MPI is initialized with `Threading::Funneled` and the transport is only ever used by
// the thread that created it (the process's main thread runs the rank); `Send` is needed only
// because the executor stores every transport as `Box<dyn Transport + Send>`. The raw buffer
// pointers are owned by the transport alone.
unsafe impl Send for MpiTransport {}

impl MpiTransport {
    /// Initializes MPI (once per process). Errors if this process is not an MPI rank or MPI
    /// was already initialized.
    pub fn init() -> Result<(MpiTransport, MpiEnvironment), String> {
        // A peer that dies closes its sockets; Open MPI's TCP transport then writes into a
        // closed one. With SIGPIPE at its default (the CLI restores it for `… | head`) that
        // write would end this rank silently, before its receive deadline can name the lost
        // rank — and mpirun, told to keep going, would then wait forever. Ignored (from
        // before MPI starts, whose start-up talks over sockets too), the write fails inside
        // MPI and the deadline reports it. A closed standard output then fails a print
        // instead, which the CLI reports as an error.
        // SAFETY: only changes a signal disposition; no handler runs Rust code.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        }
        let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled)
            .ok_or("MPI was already initialized in this process")?;
        let world = universe.world();
        // Receives poll (see `recv_timeout`): let the short sleeps between polls be short, not
        // rounded up by the default 50 µs timer slack, or every message would arrive late.
        // SAFETY: sets this thread's timer slack; no memory is involved.
        unsafe {
            libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64);
        }
        let version = mpi::environment::library_version()
            .ok()
            .and_then(|v| v.split([',', '\n']).next().map(|l| l.trim().to_string()))
            .unwrap_or_else(|| "unknown MPI".into());
        Ok((
            MpiTransport {
                rank: world.rank() as usize,
                size: world.size() as usize,
                world,
                in_flight: Vec::new(),
                version,
            },
            MpiEnvironment {
                _universe: universe,
            },
        ))
    }

    /// Waits for every rank to arrive (`MPI_Barrier`): used once, to start the common clock.
    pub fn barrier(&self) {
        self.world.barrier();
    }

    /// Frees the buffers of completed sends.
    fn progress(&mut self) {
        self.in_flight.retain_mut(|f| {
            let req = f.request.take().expect("a request until completed");
            match req.test() {
                Ok(_) => {
                    // SAFETY: the request that read the buffer has completed; the pointer came
                    // from `Box::into_raw` and is freed exactly once, here.
                    drop(unsafe { Box::from_raw(f.buffer) });
                    false
                }
                Err(req) => {
                    f.request = Some(req);
                    true
                }
            }
        });
    }
}

impl Transport for MpiTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn send(&mut self, to: usize, msg: Message) -> Result<(), String> {
        if to >= self.size {
            return Err(format!("there is no rank {to} in a job of {}", self.size));
        }
        self.progress();
        if msg.wire_len() > i32::MAX as usize {
            return Err(format!(
                "a message of {} bytes is larger than one MPI message may be (2 GiB); use more \
                 stages so that each holds less",
                msg.wire_len()
            ));
        }
        let buffer: *mut [u8] = Box::into_raw(msg.encode().into_boxed_slice());
        // SAFETY: the buffer stays allocated, and is not touched, until the request completes
        // (see `progress` and `flush`), which is what `StaticScope` requires of it.
        let data: &'static [u8] = unsafe { &*buffer };
        let request = self
            .world
            .process_at_rank(to as i32)
            .immediate_send(StaticScope, data);
        self.in_flight.push(InFlight {
            request: Some(request),
            buffer,
        });
        Ok(())
    }

    fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<Message>, String> {
        let until = Instant::now() + timeout;
        let mut spins = 0u32;
        loop {
            self.progress();
            if let Some(matched) = self.world.any_process().immediate_matched_probe() {
                let (buf, _) = matched.matched_receive_vec::<u8>();
                return Message::decode(&buf).map(Some);
            }
            if Instant::now() >= until {
                return Ok(None);
            }
            // Spin briefly (a message about to arrive is on the critical path), then poll
            // gently: with more ranks than cores, spinning ranks would slow the others.
            spins += 1;
            if spins < 16 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(POLL_US));
            }
        }
    }

    fn flush(&mut self) -> Result<(), String> {
        // Bounded: a receiver that died would otherwise keep this rank waiting forever.
        let until = Instant::now() + FLUSH_LIMIT;
        while !self.in_flight.is_empty() {
            self.progress();
            if Instant::now() >= until {
                return Err(format!(
                    "{} messages were still not received after {} s; a rank has stopped",
                    self.in_flight.len(),
                    FLUSH_LIMIT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("MPI ({})", self.version)
    }
}

/// Microseconds between polls for a message, once a short spin found none.
const POLL_US: u64 = 20;

/// How long [`Transport::flush`] waits for the last sends to be received.
const FLUSH_LIMIT: Duration = Duration::from_secs(30);

impl Drop for MpiTransport {
    fn drop(&mut self) {
        // Never wait here: a transport is dropped on the way out of a failed run, when the
        // receiver may be gone. Completed sends are freed; the rest are left to the process's
        // end (the job is being aborted), since freeing a buffer MPI may still read, or
        // dropping a pending request, is not allowed.
        self.progress();
        for f in self.in_flight.drain(..) {
            std::mem::forget(f.request);
        }
    }
}

/// This process as one rank of the MPI job: the transport, the common clock origin, and an
/// abort flag (unused across processes: a failed rank ends the job with [`abort_world`]).
/// Keep the environment until the end: dropping it finalizes MPI.
///
/// The origin is rank 0's wall-clock time, broadcast after a barrier and mapped onto each
/// process's monotonic clock: processes on one machine then read the very same clock (both
/// clocks are system-wide), so send times and emulated latencies compare exactly; across
/// machines the skew is the wall clocks' (NTP), which only shifts timelines.
pub fn rank_context() -> Result<(RankContext, MpiEnvironment), RuntimeError> {
    let (t, env) =
        MpiTransport::init().map_err(|cause| RuntimeError::Transport { rank: None, cause })?;
    t.barrier();
    let wall_ns = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    };
    let mut origin_ns = wall_ns();
    t.world.process_at_rank(0).broadcast_into(&mut origin_ns);
    let (now, wall) = (Instant::now(), wall_ns());
    let since = Duration::from_nanos(wall.saturating_sub(origin_ns));
    let origin = now.checked_sub(since).unwrap_or(now);
    Ok((
        RankContext {
            transport: Box::new(t),
            origin,
            abort: Arc::new(AtomicBool::new(false)),
            lender: None,
        },
        env,
    ))
}

/// Ends the whole MPI job from this process (`MPI_Abort` on the world communicator): a rank
/// that failed must not leave the others waiting.
pub fn abort_world(code: i32) -> ! {
    mpi::topology::SimpleCommunicator::world().abort(code)
}
