//! AdamW with decoupled weight decay and global-norm clipping, structured for
//! pipelines: each stage owns its optimizer, computes its *partial* squared gradient
//! norm, and the runtime sums the partials (in stage order) into the global norm.
//! Steps can be undone, exactly (snapshot/restore) or analytically (inverting the
//! update), which is what optimizer post-validation (REFERENCE §7) needs: step
//! optimistically, roll back if the global norm later shows inf/NaN or clipping.

use serde::{Deserialize, Serialize};

use crate::error::{NnError, Result};
use crate::kernels::{self, AdamWStep};
use crate::param::Param;
use crate::simd::Simd;

/// AdamW hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    /// Learning rate (the trainer may change it between steps; the value used by the
    /// last step is remembered for rollback).
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator guard.
    pub eps: f32,
    /// Decoupled weight decay λ, applied only to parameters with `decay = true`.
    pub weight_decay: f32,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        }
    }
}

/// Sum of squared gradient entries of `params`, in f64 and in the given order.
/// Non-finite gradients make the result non-finite, which doubles as the inf/NaN
/// check. Per stage this is the partial the runtime chains across stages.
pub fn grad_norm_sq(params: &[&Param]) -> f64 {
    // The process's level, not a backend's: the kernel gives the same bits at every level.
    let simd = Simd::selected();
    params
        .iter()
        .map(|p| kernels::sum_of_squares(simd, p.grad.data()))
        .sum()
}

/// Gradient multiplier for global-norm clipping: `min(1, max_norm / (norm + 1e-6))`.
/// Returns 1 without clipping (`max_norm = None`); errors if the norm is not finite
/// (the step must then be skipped, not taken with a NaN scale).
pub fn clip_scale(total_norm_sq: f64, max_norm: Option<f32>) -> Result<f32> {
    if !total_norm_sq.is_finite() {
        return Err(NnError::BadInput(format!(
            "gradient norm² is {total_norm_sq}: skip this step"
        )));
    }
    Ok(match max_norm {
        None => 1.0,
        Some(max) => {
            let norm = total_norm_sq.sqrt();
            (max as f64 / (norm + 1e-6)).min(1.0) as f32
        }
    })
}

#[derive(Clone, Debug, PartialEq)]
struct Moments {
    name: String,
    m: Vec<f32>,
    v: Vec<f32>,
}

/// AdamW state for one stage's parameters (matched by name and size on every call).
#[derive(Clone, Debug)]
pub struct AdamW {
    /// Hyper-parameters; `lr` may be changed between steps.
    pub config: AdamWConfig,
    steps: u64,
    last: Option<(f32, f32)>,
    moments: Vec<Moments>,
}

/// An exact copy of parameters and optimizer state, for bit-exact rollback.
#[derive(Clone, Debug)]
pub struct AdamWSnapshot {
    values: Vec<Vec<f32>>,
    optimizer: AdamW,
}

/// One parameter's AdamW moments, keyed by the parameter's global name in
/// [`AdamWState::moments`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParamMoments {
    /// First moment m.
    pub m: Vec<f32>,
    /// Second moment v.
    pub v: Vec<f32>,
}

/// Everything an [`AdamW`] needs to continue bit for bit, keyed by parameter name so it
/// can be saved from one split of the model and loaded into another (a checkpoint taken
/// on 4 stages resumes on 2: each new stage picks its parameters' moments by name).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdamWState {
    /// Hyper-parameters in force (`lr` is the one used by the last step).
    pub config: AdamWConfig,
    /// Steps taken: t in the bias correction.
    pub steps: u64,
    /// (lr, grad scale) of the last step, which [`AdamW::rollback`] needs.
    pub last: Option<(f32, f32)>,
    /// Moments by parameter name.
    pub moments: std::collections::BTreeMap<String, ParamMoments>,
}

impl AdamW {
    /// Zero-initialized state for `params`.
    pub fn new(config: AdamWConfig, params: &[&Param]) -> Self {
        AdamW {
            config,
            steps: 0,
            last: None,
            moments: params
                .iter()
                .map(|p| Moments {
                    name: p.name.clone(),
                    m: vec![0.0; p.value.len()],
                    v: vec![0.0; p.value.len()],
                })
                .collect(),
        }
    }

    /// Steps taken (t in the bias correction).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    fn check(&self, params: &[&mut Param]) -> Result<()> {
        if params.len() != self.moments.len()
            || params
                .iter()
                .zip(&self.moments)
                .any(|(p, m)| p.name != m.name || p.value.len() != m.m.len())
        {
            return Err(NnError::Config(
                "optimizer was built for a different parameter list".into(),
            ));
        }
        Ok(())
    }

    fn bias_corrections(&self, t: u64) -> (f32, f32) {
        let c = &self.config;
        (
            (1.0 - (c.beta1 as f64).powi(t as i32)) as f32,
            (1.0 - (c.beta2 as f64).powi(t as i32)) as f32,
        )
    }

    /// One AdamW step on gradients multiplied by `grad_scale` (the clip factor):
    /// `m ← β1·m + (1−β1)·g`, `v ← β2·v + (1−β2)·g²`,
    /// `θ ← θ·(1 − lr·λ) − lr·m̂/(√v̂ + ε)`. Elementwise and order-fixed, so deterministic.
    pub fn step(&mut self, params: &mut [&mut Param], grad_scale: f32) -> Result<()> {
        self.check(params)?;
        self.steps += 1;
        let c = self.config;
        let (bc1, bc2) = self.bias_corrections(self.steps);
        // The update is elementwise IEEE arithmetic: any SIMD level gives the same bits, so
        // the process's level serves (the optimizer has no backend).
        let simd = Simd::selected();
        for (p, st) in params.iter_mut().zip(&mut self.moments) {
            let step = AdamWStep {
                beta1: c.beta1,
                beta2: c.beta2,
                bc1,
                bc2,
                eps: c.eps,
                lr: c.lr,
                decay: if p.decay { c.lr * c.weight_decay } else { 0.0 },
                grad_scale,
            };
            let Param { value, grad, .. } = &mut **p;
            kernels::adamw(
                simd,
                value.data_mut(),
                grad.data(),
                &mut st.m,
                &mut st.v,
                step,
            );
        }
        self.last = Some((c.lr, grad_scale));
        Ok(())
    }

    /// The complete state, by parameter name (for checkpoints).
    pub fn export_state(&self) -> AdamWState {
        AdamWState {
            config: self.config,
            steps: self.steps,
            last: self.last,
            moments: self
                .moments
                .iter()
                .map(|st| {
                    (
                        st.name.clone(),
                        ParamMoments {
                            m: st.m.clone(),
                            v: st.v.clone(),
                        },
                    )
                })
                .collect(),
        }
    }

    /// Loads `state` into this optimizer: the step count, last-step record and, for each
    /// of *this* optimizer's parameters, the moments stored under its name (`state` may
    /// hold other stages' parameters too; they are ignored). The hyper-parameters stay
    /// as configured here. Errors, changing nothing, if one of this optimizer's
    /// parameters is missing from `state` or has a different size.
    pub fn import_state(&mut self, state: &AdamWState) -> Result<()> {
        for st in &self.moments {
            match state.moments.get(&st.name) {
                None => {
                    return Err(NnError::Config(format!(
                        "optimizer state has no moments for parameter `{}`",
                        st.name
                    )))
                }
                Some(pm) if pm.m.len() != st.m.len() || pm.v.len() != st.v.len() => {
                    return Err(NnError::Config(format!(
                        "optimizer moments of `{}` have {} and {} values, the parameter has {}",
                        st.name,
                        pm.m.len(),
                        pm.v.len(),
                        st.m.len()
                    )))
                }
                Some(_) => {}
            }
        }
        for st in &mut self.moments {
            let pm = &state.moments[&st.name];
            st.m.copy_from_slice(&pm.m);
            st.v.copy_from_slice(&pm.v);
        }
        self.steps = state.steps;
        self.last = state.last;
        Ok(())
    }

    /// Exact copy of `params` and this optimizer, taken before a step.
    pub fn snapshot(&self, params: &[&Param]) -> AdamWSnapshot {
        AdamWSnapshot {
            values: params.iter().map(|p| p.value.data().to_vec()).collect(),
            optimizer: self.clone(),
        }
    }

    /// Restores a snapshot bit for bit.
    pub fn restore(&mut self, snapshot: &AdamWSnapshot, params: &mut [&mut Param]) -> Result<()> {
        snapshot.optimizer.check(params)?;
        for (p, v) in params.iter_mut().zip(&snapshot.values) {
            p.value.data_mut().copy_from_slice(v);
        }
        *self = snapshot.optimizer.clone();
        Ok(())
    }

    /// Undoes the last step analytically, using the gradients still held in `params`
    /// (they must not have been zeroed): `θ ← (θ + lr·m̂/(√v̂+ε)) / (1 − lr·λ)`,
    /// `m ← (m − (1−β1)·g)/β1`, `v ← (v − (1−β2)·g²)/β2`, `t ← t − 1`. Exact up to
    /// float rounding (use [`AdamW::snapshot`] when bits matter). Errors if there is
    /// no step to undo.
    pub fn rollback(&mut self, params: &mut [&mut Param]) -> Result<()> {
        self.check(params)?;
        let (lr, grad_scale) = self
            .last
            .take()
            .ok_or_else(|| NnError::Config("no optimizer step to roll back".into()))?;
        let c = self.config;
        let (bc1, bc2) = self.bias_corrections(self.steps);
        for (p, st) in params.iter_mut().zip(&mut self.moments) {
            let decay = if p.decay { lr * c.weight_decay } else { 0.0 };
            let grad = p.grad.data();
            let value = p.value.data_mut();
            for i in 0..value.len() {
                let update = (st.m[i] / bc1) / ((st.v[i] / bc2).sqrt() + c.eps);
                value[i] = (value[i] + lr * update) / (1.0 - decay);
                let g = grad[i] * grad_scale;
                st.m[i] = (st.m[i] - (1.0 - c.beta1) * g) / c.beta1;
                st.v[i] = ((st.v[i] - (1.0 - c.beta2) * g * g) / c.beta2).max(0.0);
            }
        }
        self.steps -= 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::param::Init;

    fn params() -> Vec<Param> {
        let mut a = Param::new("a", &[3, 2], Init::Normal(1.0), true, 1);
        let mut b = Param::new("b", &[4], Init::Normal(1.0), false, 2);
        a.grad
            .data_mut()
            .copy_from_slice(&[0.1, -0.2, 0.3, 0.0, 1.5, -0.7]);
        b.grad.data_mut().copy_from_slice(&[0.01, 0.02, -0.5, 2.0]);
        vec![a, b]
    }

    #[test]
    fn first_step_matches_hand_computation() {
        let mut ps = params();
        let before: Vec<f32> = ps[0].value.data().to_vec();
        let cfg = AdamWConfig::default();
        let mut opt = AdamW::new(cfg, &ps.iter().collect::<Vec<_>>());
        opt.step(&mut ps.iter_mut().collect::<Vec<_>>(), 1.0)
            .unwrap();
        // t = 1: m̂ = g, v̂ = g², so the update is g/(|g|+ε) = sign(g) (0 for g = 0).
        for (i, g) in [0.1f32, -0.2, 0.3, 0.0, 1.5, -0.7].iter().enumerate() {
            let sign = if *g == 0.0 { 0.0 } else { g.signum() };
            let want = before[i] * (1.0 - cfg.lr * cfg.weight_decay) - cfg.lr * sign;
            assert!((ps[0].value.data()[i] - want).abs() < 1e-6, "{i}");
        }
    }

    #[test]
    fn rollback_exact_and_analytic() {
        let mut ps = params();
        let mut opt = AdamW::new(AdamWConfig::default(), &ps.iter().collect::<Vec<_>>());
        for _ in 0..3 {
            opt.step(&mut ps.iter_mut().collect::<Vec<_>>(), 0.5)
                .unwrap();
        }
        let before: Vec<Vec<f32>> = ps.iter().map(|p| p.value.data().to_vec()).collect();
        let state_before = opt.clone();
        let snap = opt.snapshot(&ps.iter().collect::<Vec<_>>());
        opt.step(&mut ps.iter_mut().collect::<Vec<_>>(), 0.5)
            .unwrap();
        assert_ne!(ps[0].value.data(), &before[0][..]);
        opt.restore(&snap, &mut ps.iter_mut().collect::<Vec<_>>())
            .unwrap();
        for (p, b) in ps.iter().zip(&before) {
            assert_eq!(p.value.data(), &b[..], "exact rollback");
        }
        assert_eq!(opt.moments, state_before.moments);

        opt.step(&mut ps.iter_mut().collect::<Vec<_>>(), 0.5)
            .unwrap();
        opt.rollback(&mut ps.iter_mut().collect::<Vec<_>>())
            .unwrap();
        assert_eq!(opt.steps(), 3);
        for (p, b) in ps.iter().zip(&before) {
            for (x, y) in p.value.data().iter().zip(b) {
                assert!((x - y).abs() < 1e-5, "analytic rollback {x} vs {y}");
            }
        }
        for (m, w) in opt.moments.iter().zip(&state_before.moments) {
            for (x, y) in m.m.iter().zip(&w.m) {
                assert!((x - y).abs() < 1e-6);
            }
        }
        assert!(
            opt.rollback(&mut ps.iter_mut().collect::<Vec<_>>())
                .is_err(),
            "only one step is remembered"
        );
    }

    #[test]
    fn exported_state_continues_bit_for_bit() {
        let mut ps = params();
        let mut opt = AdamW::new(AdamWConfig::default(), &ps.iter().collect::<Vec<_>>());
        for _ in 0..2 {
            opt.step(&mut ps.iter_mut().collect::<Vec<_>>(), 0.7)
                .unwrap();
        }
        let state = opt.export_state();
        let json = serde_json::to_string(&state).unwrap();
        let back: AdamWState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, state);
        // A fresh optimizer over a copy of the parameters, loaded from the state, takes
        // the same next step as the original.
        let mut copy = ps.clone();
        let mut fresh = AdamW::new(AdamWConfig::default(), &copy.iter().collect::<Vec<_>>());
        fresh.import_state(&back).unwrap();
        assert_eq!(fresh.steps(), 2);
        opt.step(&mut ps.iter_mut().collect::<Vec<_>>(), 0.7)
            .unwrap();
        fresh
            .step(&mut copy.iter_mut().collect::<Vec<_>>(), 0.7)
            .unwrap();
        for (a, b) in ps.iter().zip(&copy) {
            assert_eq!(a.value.data(), b.value.data());
        }
        // Only its own parameters are needed; a missing one is named.
        let mut only_a = AdamW::new(AdamWConfig::default(), &[&ps[0]]);
        only_a.import_state(&state).unwrap();
        let mut missing = state.clone();
        missing.moments.remove("b");
        let err = fresh.import_state(&missing).unwrap_err().to_string();
        assert!(err.contains("`b`"), "{err}");
        let mut short = state.clone();
        short.moments.get_mut("a").unwrap().m.pop();
        assert!(fresh.import_state(&short).is_err());
    }

    #[test]
    fn norm_partials_and_clipping() {
        let ps = params();
        let total = grad_norm_sq(&[&ps[0]]) + grad_norm_sq(&[&ps[1]]);
        let want: f64 = [0.1f32, -0.2, 0.3, 0.0, 1.5, -0.7, 0.01, 0.02, -0.5, 2.0]
            .iter()
            .map(|&g| (g as f64).powi(2))
            .sum();
        assert!((total - want).abs() < 1e-12);
        assert_eq!(clip_scale(total, None).unwrap(), 1.0);
        assert_eq!(clip_scale(total, Some(100.0)).unwrap(), 1.0);
        let s = clip_scale(total, Some(1.0)).unwrap();
        assert!((s as f64 - 1.0 / want.sqrt()).abs() < 1e-5);
        assert!(clip_scale(f64::NAN, Some(1.0)).is_err());
        let mut bad = params();
        bad[1].grad.data_mut()[0] = f32::INFINITY;
        assert!(!grad_norm_sq(&[&bad[1]]).is_finite());
        let mut opt = AdamW::new(AdamWConfig::default(), &[&ps[0]]);
        assert!(
            opt.step(&mut bad.iter_mut().collect::<Vec<_>>(), 1.0)
                .is_err(),
            "wrong parameter list"
        );
    }
}
