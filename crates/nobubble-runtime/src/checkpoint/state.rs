//! A rank's stages ↔ training state by global parameter name: exporting and importing an
//! engine's stages, and assembling the gathered parts into one [`TrainingState`].

use super::{StageState, TrainingState};
use crate::error::RuntimeError;
use crate::worker::Engine;
use nobubble_nn::config::{TIED_ALIAS, TIED_EMBEDDING};
use nobubble_nn::{AdamWState, Stage, Tensor};
use std::collections::{BTreeMap, BTreeSet};
/// Error naming parameters in a checkpoint that the model does not have.
pub(crate) fn extra_params(
    params: &BTreeMap<String, Tensor>,
    loaded: &BTreeSet<String>,
) -> RuntimeError {
    let extra: Vec<&str> = params
        .keys()
        .filter(|n| !loaded.contains(*n))
        .take(3)
        .map(String::as_str)
        .collect();
    RuntimeError::Config(format!(
        "the checkpoint has {} parameters the model does not (e.g. {}); it was written for \
         another model",
        params.len() - loaded.len(),
        extra.join(", ")
    ))
}

/// Copies the values stored under each of `stage`'s parameter names into it, after
/// checking all of them exist with the right shape (so an error changes nothing).
/// Returns the names loaded.
pub(crate) fn load_params(
    stage: &mut Stage,
    params: &BTreeMap<String, Tensor>,
) -> Result<BTreeSet<String>, RuntimeError> {
    let tied = stage.config().tie_embeddings;
    for p in stage.params() {
        match params.get(saved_name(tied, &p.name)) {
            None => {
                return Err(RuntimeError::Config(format!(
                    "the checkpoint has no parameter `{}`; it was written for another model",
                    p.name
                )))
            }
            Some(t) if t.shape() != p.value.shape() => {
                return Err(RuntimeError::Config(format!(
                    "parameter `{}` has shape {:?} in the checkpoint, the model needs {:?}",
                    p.name,
                    t.shape(),
                    p.value.shape()
                )))
            }
            Some(_) => {}
        }
    }
    let mut names = BTreeSet::new();
    for p in stage.params_mut() {
        let saved = saved_name(tied, &p.name);
        p.value.data_mut().copy_from_slice(params[saved].data());
        names.insert(saved.to_string());
    }
    Ok(names)
}

/// The name a parameter is saved under: a tied LM head's copy is the embedding, saved once.
fn saved_name(tied: bool, name: &str) -> &str {
    if tied && name == TIED_ALIAS {
        TIED_EMBEDDING
    } else {
        name
    }
}

/// `state` as the optimizer of a tied LM head's stage reads it: the copy's moments are the
/// embedding's (the two always take the same steps).
fn with_tied_moments(state: &AdamWState) -> AdamWState {
    let mut state = state.clone();
    if let Some(m) = state.moments.get(TIED_EMBEDDING).cloned() {
        state.moments.insert(TIED_ALIAS.to_string(), m);
    }
    state
}

/// A rank's stages and optimizers, for [`crate::Pipeline::export_state`].
pub(crate) fn export_engine(engine: &Engine) -> Result<Vec<StageState>, RuntimeError> {
    match engine {
        Engine::Real {
            stages, optimizers, ..
        } => stages
            .iter()
            .map(|(&s, st)| {
                let opt = optimizers.get(&s).ok_or_else(|| {
                    RuntimeError::Fault(format!("internal: stage {s} has no optimizer"))
                })?;
                // A tied LM head's copy of the embedding is not saved: the embedding is.
                let tied = st.config().tie_embeddings;
                let mut optimizer = opt.export_state();
                if tied {
                    optimizer.moments.remove(TIED_ALIAS);
                }
                Ok(StageState {
                    stage: s,
                    params: st
                        .params()
                        .into_iter()
                        .filter(|p| !(tied && p.name == TIED_ALIAS))
                        .map(|p| (p.name.clone(), p.value.clone()))
                        .collect(),
                    optimizer,
                })
            })
            .collect(),
        Engine::Emulated(_) => Err(RuntimeError::Config(
            "emulated compute has no weights to checkpoint; use real compute".into(),
        )),
    }
}

/// Loads a rank's stages and optimizers from `state` by name; returns the parameter
/// names it used (the ranks check together that they used all of them).
pub(crate) fn import_engine(
    engine: &mut Engine,
    state: &TrainingState,
) -> Result<BTreeSet<String>, RuntimeError> {
    match engine {
        Engine::Real {
            stages, optimizers, ..
        } => {
            let mut names = BTreeSet::new();
            for (s, st) in stages.iter_mut() {
                let opt = optimizers.get_mut(s).ok_or_else(|| {
                    RuntimeError::Fault(format!("internal: stage {s} has no optimizer"))
                })?;
                // Check the weights first: the optimizer import is all-or-nothing, and
                // after it succeeds the (checked) weight copy cannot fail.
                let tied = st.config().tie_embeddings;
                for p in st.params() {
                    let saved = saved_name(tied, &p.name);
                    if state.params.get(saved).map(Tensor::shape) != Some(p.value.shape()) {
                        return Err(RuntimeError::Config(format!(
                            "stage {s}: the checkpoint has no parameter `{}` of shape {:?}; it \
                             was written for another model",
                            p.name,
                            p.value.shape()
                        )));
                    }
                }
                let optimizer = if tied && st.is_last() {
                    with_tied_moments(&state.optimizer)
                } else {
                    state.optimizer.clone()
                };
                opt.import_state(&optimizer)
                    .map_err(|e| RuntimeError::Config(format!("stage {s}: {e}")))?;
                names.extend(load_params(st, &state.params)?);
            }
            Ok(names)
        }
        Engine::Emulated(_) => Err(RuntimeError::Config(
            "emulated compute has no weights to load a checkpoint into; use real compute".into(),
        )),
    }
}

/// Joins the ranks' parts into one state. Every stage's optimizer must agree on the step
/// count (they step together). The last-step record may differ — after an analytic
/// rollback of a skipped post-validated step, stages that had stepped forget it while
/// stages that had not keep theirs — and only ever serves a rollback within the step
/// that made it, so a disagreement is stored as "none".
pub(crate) fn assemble(
    step: u64,
    mut parts: Vec<StageState>,
) -> Result<TrainingState, RuntimeError> {
    parts.sort_by_key(|p| p.stage);
    let first = parts
        .first()
        .ok_or_else(|| RuntimeError::Fault("no stages to export".into()))?;
    let mut optimizer = AdamWState {
        config: first.optimizer.config,
        steps: first.optimizer.steps,
        last: first.optimizer.last,
        moments: BTreeMap::new(),
    };
    let mut params = BTreeMap::new();
    for part in parts {
        if part.optimizer.last != optimizer.last {
            optimizer.last = None;
        }
        if part.optimizer.steps != optimizer.steps {
            return Err(RuntimeError::Fault(format!(
                "internal: stage {}'s optimizer is at step {}, stage 0's at {}",
                part.stage, part.optimizer.steps, optimizer.steps
            )));
        }
        optimizer.moments.extend(part.optimizer.moments);
        for (name, value) in part.params {
            if params.insert(name.clone(), value).is_some() {
                return Err(RuntimeError::Fault(format!(
                    "internal: parameter `{name}` is held by two stages"
                )));
            }
        }
    }
    Ok(TrainingState {
        step,
        params,
        optimizer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nobubble_nn::{AdamWConfig, ParamMoments};

    fn part(stage: usize, steps: u64, last: Option<(f32, f32)>, name: &str) -> StageState {
        StageState {
            stage,
            params: vec![(name.into(), Tensor::zeros(&[2]))],
            optimizer: AdamWState {
                config: AdamWConfig::default(),
                steps,
                last,
                moments: [(
                    name.to_string(),
                    ParamMoments {
                        m: vec![0.0; 2],
                        v: vec![0.0; 2],
                    },
                )]
                .into(),
            },
        }
    }

    #[test]
    fn assemble_merges_by_name_and_checks_step_counts() {
        let s = assemble(
            5,
            vec![
                part(1, 3, Some((0.1, 1.0)), "b"),
                part(0, 3, Some((0.1, 1.0)), "a"),
            ],
        )
        .unwrap();
        assert_eq!(s.step, 5);
        assert_eq!(s.optimizer.last, Some((0.1, 1.0)));
        assert_eq!(s.params.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(s.optimizer.moments.len(), 2);
        let s = assemble(
            5,
            vec![part(0, 3, None, "a"), part(1, 3, Some((0.1, 1.0)), "b")],
        )
        .unwrap();
        assert_eq!(s.optimizer.last, None, "disagreeing last-step records");
        let e = assemble(5, vec![part(0, 3, None, "a"), part(1, 2, None, "b")]).unwrap_err();
        assert!(
            e.to_string().contains("stage 1's optimizer is at step 2"),
            "{e}"
        );
        let e = assemble(5, vec![part(0, 3, None, "a"), part(1, 3, None, "a")]).unwrap_err();
        assert!(e.to_string().contains("held by two stages"), "{e}");
    }
}
