//! Training state on the wire between ranks (gathering a checkpoint, broadcasting a resumed
//! one): compact f32 data behind a JSON header, instead of the safetensors files.

use super::{StageState, TrainingState};
use crate::error::RuntimeError;
use nobubble_nn::{AdamWConfig, AdamWState, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The wire form of training state between ranks (gathering a checkpoint, broadcasting a
/// resumed one): a JSON header (names, shapes, optimizer scalars) and the f32 data behind it.
#[derive(Serialize, Deserialize)]
struct WirePart {
    stage: usize,
    params: Vec<(String, Vec<usize>)>,
    config: AdamWConfig,
    steps: u64,
    last: Option<(f32, f32)>,
    moments: Vec<(String, usize)>,
}

/// One part to encode: (stage, named weights, optimizer state).
type WireInput<'a> = (usize, Vec<(&'a String, &'a Tensor)>, &'a AdamWState);

fn encode_wire(step: u64, parts: &[WireInput<'_>]) -> Vec<u8> {
    let headers: Vec<WirePart> = parts
        .iter()
        .map(|(stage, params, opt)| WirePart {
            stage: *stage,
            params: params
                .iter()
                .map(|(n, t)| ((*n).clone(), t.shape().to_vec()))
                .collect(),
            config: opt.config,
            steps: opt.steps,
            last: opt.last,
            moments: opt
                .moments
                .iter()
                .map(|(n, m)| (n.clone(), m.m.len()))
                .collect(),
        })
        .collect();
    let head = serde_json::to_vec(&(step, &headers)).expect("serializes");
    let mut out = Vec::new();
    out.extend_from_slice(&(head.len() as u64).to_le_bytes());
    out.extend_from_slice(&head);
    for (_, params, opt) in parts {
        for (_, t) in params {
            for x in t.data() {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        for m in opt.moments.values() {
            for x in m.m.iter().chain(&m.v) {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
    }
    out
}

#[allow(clippy::type_complexity)]
fn decode_wire(b: &[u8]) -> Result<(u64, Vec<StageState>), RuntimeError> {
    let bad =
        |why: &str| RuntimeError::Fault(format!("damaged training state between ranks: {why}"));
    let n = u64::from_le_bytes(
        b.get(..8)
            .ok_or_else(|| bad("short"))?
            .try_into()
            .expect("8"),
    );
    let end = usize::try_from(n)
        .ok()
        .and_then(|n| n.checked_add(8))
        .ok_or_else(|| bad("header length"))?;
    let head = b.get(8..end).ok_or_else(|| bad("short header"))?;
    let (step, headers): (u64, Vec<WirePart>) =
        serde_json::from_slice(head).map_err(|e| bad(&e.to_string()))?;
    let mut at = end;
    let mut take = |len: usize| -> Result<Vec<f32>, RuntimeError> {
        let stop = len
            .checked_mul(4)
            .and_then(|l| l.checked_add(at))
            .ok_or_else(|| bad("data length"))?;
        let bytes = b.get(at..stop).ok_or_else(|| bad("short data"))?;
        at += 4 * len;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
            .collect())
    };
    let mut parts = Vec::new();
    for h in headers {
        let mut params = Vec::new();
        for (name, shape) in h.params {
            let data = take(shape.iter().product())?;
            params.push((
                name,
                Tensor::from_vec(&shape, data).map_err(|e| bad(&e.to_string()))?,
            ));
        }
        let mut moments = BTreeMap::new();
        for (name, len) in h.moments {
            let mv = take(2 * len)?;
            moments.insert(
                name,
                nobubble_nn::ParamMoments {
                    m: mv[..len].to_vec(),
                    v: mv[len..].to_vec(),
                },
            );
        }
        parts.push(StageState {
            stage: h.stage,
            params,
            optimizer: AdamWState {
                config: h.config,
                steps: h.steps,
                last: h.last,
                moments,
            },
        });
    }
    Ok((step, parts))
}

/// A rank's exported stages, for gathering.
pub(crate) fn encode_parts(parts: &[StageState]) -> Vec<u8> {
    let v: Vec<_> = parts
        .iter()
        .map(|p| {
            (
                p.stage,
                p.params.iter().map(|(n, t)| (n, t)).collect(),
                &p.optimizer,
            )
        })
        .collect();
    encode_wire(0, &v)
}

/// [`encode_parts`] read back.
pub(crate) fn decode_parts(b: &[u8]) -> Result<Vec<StageState>, RuntimeError> {
    decode_wire(b).map(|(_, p)| p)
}

/// A whole training state, for broadcasting.
pub(crate) fn encode_state(s: &TrainingState) -> Vec<u8> {
    encode_wire(s.step, &[(0, s.params.iter().collect(), &s.optimizer)])
}

/// [`encode_state`] read back.
pub(crate) fn decode_state(b: &[u8]) -> Result<TrainingState, RuntimeError> {
    let (step, mut parts) = decode_wire(b)?;
    let part = parts
        .pop()
        .ok_or_else(|| RuntimeError::Fault("damaged training state: no part".into()))?;
    Ok(TrainingState {
        step,
        params: part.params.into_iter().collect(),
        optimizer: part.optimizer,
    })
}
