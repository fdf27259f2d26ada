//! A worker's messages: sending (never waiting), and waiting for one message by key with a
//! deadline, the abort flag and emulated latency — the only way a rank ever waits.

use super::Worker;
use crate::error::RuntimeError;
use crate::transport::{Key, Message, Tag};
use nobubble_nn::lending::CoreLender;
use nobubble_schedule::Action;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a receive polls before it blocks.
const SPIN: Duration = Duration::from_micros(1000);

impl Worker {
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
        self.post(to, msg).map_err(|cause| RuntimeError::Transport {
            rank: Some(self.rank),
            cause,
        })
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
    pub(super) fn wait_or(
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
        // Offered once the wait blocks (not while it polls), withdrawn when it ends.
        let lender = self.lender.clone();
        let mut offered = None;
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
                let held = held_back.is_some();
                return Err(self.timed_out(held, action, &what(), started, since));
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
                if offered.is_none() {
                    offered = lender.as_deref().map(CoreLender::offer);
                }
                (deadline - now).min(Duration::from_millis(20))
            };
            self.receive(slice, &key, since, action)?;
        }
    }

    /// The error of a wait for `what` that reached its deadline; `held_back`: the message
    /// arrived but its emulated latency had not elapsed.
    fn timed_out(
        &self,
        held_back: bool,
        action: Option<Action>,
        what: &str,
        started: Instant,
        since: f64,
    ) -> RuntimeError {
        let waiting_for = if held_back {
            format!(
                "{what}, which arrived but is held back by the emulated latency: --comm or \
                 --collective-latency is longer than --recv-timeout"
            )
        } else {
            format!(
                "{what}; that rank failed, died, hung, or the message was lost (raise \
                 --recv-timeout if passes are really this slow)"
            )
        };
        RuntimeError::Timeout {
            rank: self.rank,
            action,
            waiting_for,
            seconds: started.elapsed().as_secs_f64(),
            since,
        }
    }

    /// Takes at most one message off the transport within `slice` into the mailbox,
    /// counting it (and, for the awaited `key` waited on since before it was sent, the
    /// link's latency).
    fn receive(
        &mut self,
        slice: Duration,
        key: &Key,
        since: f64,
        action: Option<Action>,
    ) -> Result<(), RuntimeError> {
        match self.transport.recv_timeout(slice) {
            Ok(Some(m)) => {
                self.comm.received += 1;
                self.comm.received_bytes += m.wire_len() as u64;
                if m.tag.is_pipeline() && m.key() == *key && since <= m.sent_at {
                    // Waited for it since before it was sent: receipt − send is the
                    // link's latency (the same clock on one machine).
                    self.comm.latency_sum += (self.now() - m.sent_at).max(0.0);
                    self.comm.latency_count += 1;
                }
                self.mailbox.insert(m.key(), m);
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => {
                let cause = format!("transport failed: {e}");
                Err(match action {
                    Some(action) => RuntimeError::Pass {
                        rank: self.rank,
                        action,
                        cause,
                    },
                    None => RuntimeError::Transport {
                        rank: Some(self.rank),
                        cause,
                    },
                })
            }
        }
    }

    /// Every rank's statistics of `step` are here and usable: the verdict can be settled
    /// without waiting.
    pub(super) fn stats_ready(&self, step: u64) -> bool {
        (0..self.transport.size()).all(|from| {
            from == self.rank
                || self
                    .ready_in(&(Tag::Stats, 0, step, from))
                    .is_some_and(|w| w <= 0.0)
        })
    }
}
