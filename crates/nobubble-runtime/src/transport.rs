//! Moving tensors and small control records between ranks.
//!
//! The executor only sees [`Transport`]: `send` never waits for the receiver (a rank that has
//! sent its input gradient goes straight on to its next pass) and `recv_timeout` hands over
//! whatever arrives next, from any rank. Matching a message to the pass or collective that
//! needs it is the executor's job (its mailbox, keyed by [`Message::key`]), so a transport is
//! only a pipe: [`InProcess`] connects ranks that are threads of one process through channels,
//! `MpiTransport` (feature `mpi`) ranks that are processes, over MPI.
//!
//! Messages are self-describing so that they can cross a process boundary: [`Message::encode`]
//! writes a small header (tag, sender, stage, index, shape, lengths, send time) followed by the
//! contiguous f32 data and any control bytes.

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

/// What a message is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tag {
    /// A forward activation, for the F of the receiving stage.
    Activation = 0,
    /// An output gradient, for the I (or B) of the receiving stage.
    Gradient = 1,
    /// A replica's summed gradient of one stage, to the stage's first replica (data parallel).
    GradShare = 2,
    /// The gradient of one stage summed over all replicas, back to each replica.
    GradSum = 3,
    /// A rank's share of a step's losses, norms and non-finite flags (all-gathered).
    Stats = 4,
    /// A contribution to a gather, all-gather or broadcast of control bytes.
    Collective = 5,
    /// Rank 0's stop decision after a step: the launcher's bookkeeping, not the model's
    /// traffic, so emulated latency does not apply to it.
    Decision = 6,
    /// A tied embedding's step gradient, between the first and the last stage's ranks.
    TiedGrad = 7,
}

impl Tag {
    fn from_u8(v: u8) -> Option<Tag> {
        Some(match v {
            0 => Tag::Activation,
            1 => Tag::Gradient,
            2 => Tag::GradShare,
            3 => Tag::GradSum,
            4 => Tag::Stats,
            5 => Tag::Collective,
            6 => Tag::Decision,
            7 => Tag::TiedGrad,
            _ => return None,
        })
    }

    /// True for the pipeline's own traffic (activations and gradients between stages).
    pub fn is_pipeline(self) -> bool {
        matches!(self, Tag::Activation | Tag::Gradient)
    }
}

/// The mailbox key of a message: what it is, for which stage, which microbatch or step or
/// collective round, from which rank.
pub type Key = (Tag, usize, u64, usize);

/// One message in flight.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// What it is for.
    pub tag: Tag,
    /// The sending rank (global).
    pub from: usize,
    /// The stage it concerns (pipeline and gradient messages), else 0.
    pub stage: usize,
    /// Microbatch (pipeline messages), step (stats, gradients) or collective round.
    pub index: u64,
    /// Shape of `data` (empty for control messages).
    pub shape: Vec<usize>,
    /// Tensor data.
    pub data: Vec<f32>,
    /// Control payload.
    pub bytes: Vec<u8>,
    /// The sender's clock when sent (seconds since the run's common origin): emulated link
    /// latency is counted from here.
    pub sent_at: f64,
}

/// Header: tag u8, 7 spare bytes, from u64, stage u64, index u64, sent_at f64, rank of the
/// shape u64, data length u64, bytes length u64; then the shape (u64 each), the data (f32 LE)
/// and the bytes.
const HEADER: usize = 8 * 8;

/// The most dimensions a decoded shape may have (a corrupt header is refused, not allocated).
const MAX_RANK: usize = 8;

impl Message {
    /// The mailbox key.
    pub fn key(&self) -> Key {
        (self.tag, self.stage, self.index, self.from)
    }

    /// Bytes on the wire.
    pub fn wire_len(&self) -> usize {
        HEADER + 8 * self.shape.len() + 4 * self.data.len() + self.bytes.len()
    }

    /// The wire form (see [`HEADER`]).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.wire_len());
        out.push(self.tag as u8);
        out.extend_from_slice(&[0; 7]);
        for v in [self.from as u64, self.stage as u64, self.index] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.sent_at.to_le_bytes());
        for v in [self.shape.len(), self.data.len(), self.bytes.len()] {
            out.extend_from_slice(&(v as u64).to_le_bytes());
        }
        for &d in &self.shape {
            out.extend_from_slice(&(d as u64).to_le_bytes());
        }
        let at = out.len();
        out.resize(at + 4 * self.data.len(), 0);
        for (dst, x) in out[at..].chunks_exact_mut(4).zip(&self.data) {
            dst.copy_from_slice(&x.to_le_bytes());
        }
        out.extend_from_slice(&self.bytes);
        out
    }

    /// Reads [`Message::encode`]'s form back; every length is checked against the buffer
    /// before anything is allocated.
    pub fn decode(buf: &[u8]) -> Result<Message, String> {
        let u64_at =
            |i: usize| -> u64 { u64::from_le_bytes(buf[i..i + 8].try_into().expect("8 bytes")) };
        if buf.len() < HEADER {
            return Err(format!(
                "a message of {} bytes is shorter than its header",
                buf.len()
            ));
        }
        let tag = Tag::from_u8(buf[0]).ok_or_else(|| format!("unknown message tag {}", buf[0]))?;
        let (rank, data_len, bytes_len) = (u64_at(40), u64_at(48), u64_at(56));
        let need = (rank as u128) * 8 + (data_len as u128) * 4 + bytes_len as u128 + HEADER as u128;
        if rank as usize > MAX_RANK || need != buf.len() as u128 {
            return Err(format!(
                "a damaged message: its header announces {need} bytes, {} arrived",
                buf.len()
            ));
        }
        let mut at = HEADER;
        let shape: Vec<usize> = (0..rank as usize)
            .map(|k| u64_at(HEADER + 8 * k) as usize)
            .collect();
        at += 8 * rank as usize;
        let data: Vec<f32> = buf[at..at + 4 * data_len as usize]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        at += 4 * data_len as usize;
        Ok(Message {
            tag,
            from: u64_at(8) as usize,
            stage: u64_at(16) as usize,
            index: u64_at(24),
            sent_at: f64::from_le_bytes(buf[32..40].try_into().expect("8 bytes")),
            shape,
            data,
            bytes: buf[at..].to_vec(),
        })
    }
}

/// A rank's connection to the others.
pub trait Transport: Send {
    /// This rank (global).
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Sends to rank `to` without waiting for it to receive. Fails only if the link is broken.
    fn send(&mut self, to: usize, msg: Message) -> Result<(), String>;
    /// The next message for this rank from anyone, or `None` after `timeout`.
    fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<Message>, String>;
    /// Completes every send still in flight (before the process may exit).
    fn flush(&mut self) -> Result<(), String> {
        Ok(())
    }
    /// What this transport is, for reports (`threads`, `MPI (Open MPI 4.1.4)`).
    fn describe(&self) -> String;
}

/// Ranks as threads of one process, connected by unbounded channels.
pub struct InProcess {
    rank: usize,
    senders: Vec<Sender<Message>>,
    receiver: Receiver<Message>,
}

impl InProcess {
    /// One endpoint per rank, fully connected.
    pub fn connect(ranks: usize) -> Vec<InProcess> {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..ranks).map(|_| channel()).unzip();
        receivers
            .into_iter()
            .enumerate()
            .map(|(rank, receiver)| InProcess {
                rank,
                senders: senders.clone(),
                receiver,
            })
            .collect()
    }
}

impl Transport for InProcess {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.senders.len()
    }

    fn send(&mut self, to: usize, msg: Message) -> Result<(), String> {
        self.senders
            .get(to)
            .ok_or_else(|| format!("there is no rank {to}"))?
            .send(msg)
            .map_err(|_| format!("rank {to} is gone"))
    }

    fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<Message>, String> {
        match self.receiver.recv_timeout(timeout) {
            Ok(m) => Ok(Some(m)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err("all senders are gone".into()),
        }
    }

    fn describe(&self) -> String {
        "threads".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_survive_the_wire_and_damage_is_refused() {
        let m = Message {
            tag: Tag::Gradient,
            from: 3,
            stage: 7,
            index: 1 << 40,
            shape: vec![2, 3],
            data: vec![1.0, -2.5, f32::NAN, 0.0, -0.0, 1e-30],
            bytes: vec![9, 8, 7],
            sent_at: 12.25,
        };
        let wire = m.encode();
        assert_eq!(wire.len(), m.wire_len());
        let back = Message::decode(&wire).unwrap();
        assert_eq!(back.key(), m.key());
        assert_eq!(back.shape, m.shape);
        assert_eq!(back.bytes, m.bytes);
        assert_eq!(back.sent_at, m.sent_at);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back.data), bits(&m.data));
        assert!(Message::decode(&wire[..wire.len() - 1]).is_err());
        let mut bad = wire.clone();
        bad[48] = 0xff; // data length
        assert!(Message::decode(&bad).unwrap_err().contains("damaged"));
        bad = wire;
        bad[0] = 42;
        assert!(Message::decode(&bad).unwrap_err().contains("tag"));
    }
}
