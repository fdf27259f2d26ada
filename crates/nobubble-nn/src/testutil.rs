//! Test-only helpers: an independent, naive f64 implementation of every layer's
//! forward and *combined* backward (written from the textbook formulas, sharing no
//! code with the engine), random data, and finite differences.

use crate::param::{Param, SplitMix64};
use crate::tensor::Tensor;

/// Deterministic random tensor with entries Normal(0, std²).
pub fn random_tensor(shape: &[usize], std: f32, seed: u64) -> Tensor {
    let mut r = SplitMix64::new(seed);
    let n = shape.iter().product();
    Tensor::from_vec(
        shape,
        (0..n).map(|_| r.next_normal() as f32 * std).collect(),
    )
    .unwrap()
}

/// Overwrites all parameters with random values (γ around 1) so biases and norms
/// are exercised by the checks.
pub fn randomize(params: Vec<&mut Param>, seed: u64) {
    for (i, p) in params.into_iter().enumerate() {
        let mut r = SplitMix64::new(seed * 1000 + i as u64);
        let gamma = p.name.ends_with("gamma");
        for x in p.value.data_mut() {
            let v = r.next_normal() as f32 * 0.3;
            *x = if gamma { 1.0 + v } else { v };
        }
    }
}

/// f32 → f64 copy.
pub fn f64s(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// Asserts `got` (f32) matches `want` (f64) to a tolerance relative to the largest
/// magnitude in `want`.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], rel: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1e-6f64, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (*g as f64 - w).abs();
        assert!(
            err <= rel * scale,
            "{what}[{i}]: got {g}, want {w} (scale {scale})"
        );
    }
}

/// `a[m,k] · b[k,n]`.
pub fn mm(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            for j in 0..n {
                c[i * n + j] += a[i * k + p] * b[p * n + j];
            }
        }
    }
    c
}

/// Transpose of `a[m,n]`.
pub fn tr(a: &[f64], m: usize, n: usize) -> Vec<f64> {
    let mut t = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            t[j * m + i] = a[i * n + j];
        }
    }
    t
}

/// Naive linear: returns y and a closure-free backward via [`linear_bwd`].
pub fn linear_fwd(
    x: &[f64],
    w: &[f64],
    b: Option<&[f64]>,
    n: usize,
    i: usize,
    o: usize,
) -> Vec<f64> {
    let mut y = mm(x, w, n, i, o);
    if let Some(b) = b {
        for r in 0..n {
            for j in 0..o {
                y[r * o + j] += b[j];
            }
        }
    }
    y
}

/// Combined linear backward: (dx, dW, db).
pub fn linear_bwd(
    x: &[f64],
    w: &[f64],
    dy: &[f64],
    n: usize,
    i: usize,
    o: usize,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let dx = mm(dy, &tr(w, i, o), n, o, i);
    let dw = mm(&tr(x, n, i), dy, i, n, o);
    let mut db = vec![0.0; o];
    for r in 0..n {
        for j in 0..o {
            db[j] += dy[r * o + j];
        }
    }
    (dx, dw, db)
}

/// Naive LayerNorm forward.
pub fn ln_fwd(x: &[f64], g: &[f64], b: &[f64], h: usize, eps: f64) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for (r, row) in x.chunks(h).enumerate() {
        let mu = row.iter().sum::<f64>() / h as f64;
        let var = row.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / h as f64;
        for j in 0..h {
            y[r * h + j] = (row[j] - mu) / (var + eps).sqrt() * g[j] + b[j];
        }
    }
    y
}

/// Textbook LayerNorm backward through mean and variance: (dx, dγ, dβ).
pub fn ln_bwd(
    x: &[f64],
    g: &[f64],
    dy: &[f64],
    h: usize,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut dx = vec![0.0; x.len()];
    let (mut dg, mut db) = (vec![0.0; h], vec![0.0; h]);
    for (r, row) in x.chunks(h).enumerate() {
        let nf = h as f64;
        let mu = row.iter().sum::<f64>() / nf;
        let var = row.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / nf;
        let sd = (var + eps).sqrt();
        let d = &dy[r * h..(r + 1) * h];
        let dxhat: Vec<f64> = (0..h).map(|j| d[j] * g[j]).collect();
        let dvar: f64 = (0..h)
            .map(|j| dxhat[j] * (row[j] - mu) * -0.5 * sd.powi(-3))
            .sum();
        let dmu: f64 = (0..h).map(|j| -dxhat[j] / sd).sum::<f64>()
            + dvar * (0..h).map(|j| -2.0 * (row[j] - mu)).sum::<f64>() / nf;
        for j in 0..h {
            dx[r * h + j] = dxhat[j] / sd + dvar * 2.0 * (row[j] - mu) / nf + dmu / nf;
            dg[j] += d[j] * (row[j] - mu) / sd;
            db[j] += d[j];
        }
    }
    (dx, dg, db)
}

const C: f64 = 0.797_884_560_802_865_4;

/// Naive GELU (tanh approximation).
pub fn gelu(u: f64) -> f64 {
    0.5 * u * (1.0 + (C * (u + 0.044715 * u.powi(3))).tanh())
}

/// Derivative of [`gelu`].
pub fn gelu_grad(u: f64) -> f64 {
    let t = (C * (u + 0.044715 * u.powi(3))).tanh();
    0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * C * (1.0 + 3.0 * 0.044715 * u * u)
}

/// Naive causal attention core on fused `qkv[n, 3h]`: returns (ctx, probs per (seq, head)).
pub fn attn_core_fwd(
    qkv: &[f64],
    n: usize,
    h: usize,
    heads: usize,
    s: usize,
) -> (Vec<f64>, Vec<Vec<f64>>) {
    let d = h / heads;
    let at = |r: usize, c: usize| qkv[r * 3 * h + c];
    let mut ctx = vec![0.0; n * h];
    let mut probs = Vec::new();
    for b in 0..n / s {
        for a in 0..heads {
            let mut p = vec![0.0; s * s];
            for i in 0..s {
                let scores: Vec<f64> = (0..=i)
                    .map(|j| {
                        (0..d)
                            .map(|e| at(b * s + i, a * d + e) * at(b * s + j, h + a * d + e))
                            .sum::<f64>()
                            / (d as f64).sqrt()
                    })
                    .collect();
                let mx = scores.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = scores.iter().map(|v| (v - mx).exp()).sum();
                for j in 0..=i {
                    p[i * s + j] = (scores[j] - mx).exp() / z;
                    for e in 0..d {
                        ctx[(b * s + i) * h + a * d + e] +=
                            p[i * s + j] * at(b * s + j, 2 * h + a * d + e);
                    }
                }
            }
            probs.push(p);
        }
    }
    (ctx, probs)
}

/// Naive attention core backward: dqkv from dctx.
pub fn attn_core_bwd(
    qkv: &[f64],
    dctx: &[f64],
    n: usize,
    h: usize,
    heads: usize,
    s: usize,
) -> Vec<f64> {
    let d = h / heads;
    let (_, probs) = attn_core_fwd(qkv, n, h, heads, s);
    let at = |r: usize, c: usize| qkv[r * 3 * h + c];
    let mut dqkv = vec![0.0; n * 3 * h];
    let sc = 1.0 / (d as f64).sqrt();
    for b in 0..n / s {
        for a in 0..heads {
            let p = &probs[b * heads + a];
            for i in 0..s {
                let dp: Vec<f64> = (0..s)
                    .map(|j| {
                        (0..d)
                            .map(|e| {
                                dctx[(b * s + i) * h + a * d + e] * at(b * s + j, 2 * h + a * d + e)
                            })
                            .sum()
                    })
                    .collect();
                let dot: f64 = (0..s).map(|j| p[i * s + j] * dp[j]).sum();
                for j in 0..s {
                    let ds = p[i * s + j] * (dp[j] - dot);
                    for e in 0..d {
                        dqkv[(b * s + j) * 3 * h + 2 * h + a * d + e] +=
                            p[i * s + j] * dctx[(b * s + i) * h + a * d + e];
                        dqkv[(b * s + i) * 3 * h + a * d + e] +=
                            ds * at(b * s + j, h + a * d + e) * sc;
                        dqkv[(b * s + j) * 3 * h + h + a * d + e] +=
                            ds * at(b * s + i, a * d + e) * sc;
                    }
                }
            }
        }
    }
    dqkv
}

/// Central finite difference of `loss` at `value[idx]` with step `eps`, in f64.
pub fn central_difference(mut loss: impl FnMut(f32) -> f64, x0: f32, eps: f32) -> f64 {
    let up = loss(x0 + eps);
    let down = loss(x0 - eps);
    let h = ((x0 + eps) as f64) - ((x0 - eps) as f64);
    (up - down) / h
}

/// `Σ r·y` in f64: turns a tensor output into a scalar whose gradient w.r.t. `y` is `r`.
pub fn project(y: &[f32], r: &[f32]) -> f64 {
    y.iter().zip(r).map(|(a, b)| *a as f64 * *b as f64).sum()
}
