//! Moving activations and gradients between ranks.
//!
//! The executor only sees [`Transport`]: `send` never waits for the receiver (so a rank
//! that has sent its input gradient goes straight on to its next pass) and `recv_timeout`
//! hands over whatever arrives next. [`InProcess`] connects ranks that are threads of one
//! process through channels; a transport over MPI (ranks as processes on many machines)
//! implements the same two methods.

use nobubble_nn::Tensor;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

/// Which direction a message travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Payload {
    /// A forward activation, for the F of the receiving stage.
    Activation,
    /// An output gradient, for the I (or B) of the receiving stage.
    Gradient,
}

/// One tensor in flight, addressed to a stage and microbatch.
#[derive(Debug)]
pub struct Message {
    /// Activation or gradient.
    pub payload: Payload,
    /// The stage that consumes it.
    pub stage: usize,
    /// Its microbatch.
    pub microbatch: usize,
    /// The data.
    pub tensor: Tensor,
    /// Earliest moment the receiver may use it (emulated link latency); `None` = now.
    pub ready_at: Option<Instant>,
}

/// A rank's connection to the others.
pub trait Transport: Send {
    /// Sends to rank `to` without waiting for it. Fails only if the receiver is gone.
    fn send(&self, to: usize, msg: Message) -> Result<(), String>;
    /// The next message for this rank, or `None` after `timeout`.
    fn recv_timeout(&self, timeout: Duration) -> Result<Option<Message>, String>;
}

/// Ranks as threads of one process, connected by unbounded channels.
pub struct InProcess {
    senders: Vec<Sender<Message>>,
    receiver: Receiver<Message>,
    /// Emulated latency added to every message (zero for real runs).
    latency: Duration,
}

impl InProcess {
    /// One endpoint per rank, fully connected.
    pub fn connect(ranks: usize, latency: Duration) -> Vec<InProcess> {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..ranks).map(|_| channel()).unzip();
        receivers
            .into_iter()
            .map(|receiver| InProcess {
                senders: senders.clone(),
                receiver,
                latency,
            })
            .collect()
    }
}

impl Transport for InProcess {
    fn send(&self, to: usize, mut msg: Message) -> Result<(), String> {
        if !self.latency.is_zero() {
            msg.ready_at = Some(Instant::now() + self.latency);
        }
        self.senders[to]
            .send(msg)
            .map_err(|_| format!("rank {to} is gone"))
    }

    fn recv_timeout(&self, timeout: Duration) -> Result<Option<Message>, String> {
        match self.receiver.recv_timeout(timeout) {
            Ok(m) => Ok(Some(m)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err("all senders are gone".into()),
        }
    }
}
