//! Elementwise and row-wise CPU kernels on slices, compiled three times: for the
//! baseline target, with AVX2 and with AVX-512 enabled, picked at run time ([`Simd`]).
//!
//! Why several builds: these loops (GELU, softmax, LayerNorm) are a tenth of a block's
//! time and vectorize 2× (AVX2) or 4× (AVX-512) wider than the baseline. Why this is still
//! deterministic: every build performs the same IEEE operations per element in the same
//! order, and nothing is fused (Rust never contracts `a*b + c` into an FMA), so they
//! produce identical bits. Reductions (row sums, dot products) are written with
//! [`LANES`] partial sums combined in a fixed order: that order is part of the kernel, not
//! of the instruction set, so the compiler may map the partial sums onto vector registers
//! of any width without changing a bit.

// Index loops read closer to the math in these kernels.
#![allow(clippy::needless_range_loop)]
// The `wide!` wrappers forward many slice arguments.
#![allow(clippy::too_many_arguments)]

use crate::simd::Simd;

/// Partial sums per reduction: as many as the widest vector has f32 lanes.
pub(crate) const LANES: usize = 16;

/// `Σ xs` as [`LANES`] interleaved partial sums (element `j` into sum `j mod LANES`),
/// combined pairwise in a fixed order; the tail after the last full group goes into the
/// first partial sums in order.
#[inline(always)]
pub(crate) fn lane_sum(xs: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut groups = xs.chunks_exact(LANES);
    for g in &mut groups {
        for (a, &x) in acc.iter_mut().zip(g) {
            *a += x;
        }
    }
    for (a, &x) in acc.iter_mut().zip(groups.remainder()) {
        *a += x;
    }
    combine_lanes(acc)
}

/// `Σ a[j]·b[j]` with [`lane_sum`]'s order (over the shorter length).
#[inline(always)]
pub(crate) fn lane_dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; LANES];
    let (mut ga, mut gb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    for (x, y) in (&mut ga).zip(&mut gb) {
        for ((s, &x), &y) in acc.iter_mut().zip(x).zip(y) {
            *s += x * y;
        }
    }
    for ((s, &x), &y) in acc.iter_mut().zip(ga.remainder()).zip(gb.remainder()) {
        *s += x * y;
    }
    combine_lanes(acc)
}

/// The partial sums added pairwise, halves first: a fixed tree.
#[inline(always)]
fn combine_lanes(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            acc[l] += acc[l + width];
        }
    }
    acc[0]
}

/// `max xs` (order-independent, so any grouping gives the same value); −∞ if empty.
#[inline(always)]
pub(crate) fn lane_max(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = if x > *a { x } else { *a };
        }
    }
    for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
        *a = if x > *a { x } else { *a };
    }
    acc.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

const GELU_C: f32 = 0.797_884_6; // sqrt(2/pi)
const GELU_A: f32 = 0.044_715;

/// `e^x` to about 1 ulp, branch-free so loops over it vectorize (libm's `exp`/`tanh`
/// calls were a third of a block's forward time). Pure f32 arithmetic without fused
/// operations: the result is the same on every x86-64 machine.
#[inline(always)]
pub(crate) fn fast_exp(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5·2^23: adding it rounds to an integer
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    // Cody–Waite: ln 2 split in two parts so r = x − n·ln2 stays exact.
    let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let exponent = (shifted.to_bits() as i32 - ROUND.to_bits() as i32 + 127) << 23;
    p * f32::from_bits(exponent as u32)
}

/// `tanh` via [`fast_exp`]: `1 − 2/(e^{2y} + 1)`; saturates cleanly at ±1.
#[inline(always)]
pub(crate) fn fast_tanh(y: f32) -> f32 {
    1.0 - 2.0 / (fast_exp(2.0 * y) + 1.0)
}

/// Defines `pub(crate) fn $name(simd, args)` that runs `portable::$name` compiled for the
/// requested [`Simd`] level (AVX-512, AVX2, or the baseline build). Callers pass a level the
/// CPU supports ([`Simd`] only hands out supported ones).
macro_rules! wide {
    ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?);)*) => {$(
        pub(crate) fn $name(simd: Simd, $($arg: $ty),*) {
            debug_assert!(simd.is_supported(), "{simd} kernels on a CPU without them");
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
                unsafe fn avx512($($arg: $ty),*) {
                    portable::$name($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) {
                    portable::$name($($arg),*)
                }
                match simd {
                    // SAFETY: a `Simd` level other than `Portable` is only constructed
                    // after checking that the CPU supports it.
                    Simd::Avx512 => return unsafe { avx512($($arg),*) },
                    Simd::Avx2 => return unsafe { avx2($($arg),*) },
                    Simd::Portable => {}
                }
            }
            let _ = simd;
            portable::$name($($arg),*)
        }
    )*};
}

wide! {
    fn gelu_forward(u: &[f32], y: &mut [f32]);
    fn gelu_backward(u: &[f32], dy: &mut [f32]);
    fn causal_softmax(scores: &mut [f32], n: usize);
    fn causal_softmax_backward(p: &[f32], dp: &mut [f32], n: usize);
    fn softmax_rows(x: &mut [f32], cols: usize, maxes: &mut [f32], sums: &mut [f32]);
    fn layernorm_forward(x: &[f32], gamma: &[f32], beta: &[f32], eps: f32, y: &mut [f32], xhat: &mut [f32], rstd: &mut [f32]);
    fn layernorm_backward(dy: &[f32], xhat: &[f32], rstd: &[f32], gamma: &[f32], dx: &mut [f32], dgamma: &mut [f32], dbeta: &mut [f32]);
}

/// The kernel bodies, always inlined into the baseline, AVX2 and AVX-512 builds.
mod portable {
    use super::{fast_exp, fast_tanh, lane_dot, lane_max, lane_sum, GELU_A, GELU_C};

    #[inline(always)]
    pub fn gelu_forward(u: &[f32], y: &mut [f32]) {
        assert_eq!(u.len(), y.len());
        for (o, &x) in y.iter_mut().zip(u) {
            let t = fast_tanh(GELU_C * (x + GELU_A * x * x * x));
            *o = 0.5 * x * (1.0 + t);
        }
    }

    #[inline(always)]
    pub fn gelu_backward(u: &[f32], dy: &mut [f32]) {
        assert_eq!(u.len(), dy.len());
        for (d, &x) in dy.iter_mut().zip(u) {
            let t = fast_tanh(GELU_C * (x + GELU_A * x * x * x));
            let dt = GELU_C * (1.0 + 3.0 * GELU_A * x * x);
            *d *= 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dt;
        }
    }

    #[inline(always)]
    pub fn causal_softmax(scores: &mut [f32], n: usize) {
        assert_eq!(scores.len(), n * n);
        for (i, row) in scores.chunks_exact_mut(n).enumerate() {
            let (valid, masked) = row.split_at_mut(i + 1);
            let max = lane_max(valid);
            for v in valid.iter_mut() {
                *v = fast_exp(*v - max);
            }
            let inv = 1.0 / lane_sum(valid);
            for v in valid.iter_mut() {
                *v *= inv;
            }
            masked.fill(0.0);
        }
    }

    #[inline(always)]
    pub fn causal_softmax_backward(p: &[f32], dp: &mut [f32], n: usize) {
        assert!(p.len() == n * n && dp.len() == n * n);
        for (i, (pr, dr)) in p.chunks_exact(n).zip(dp.chunks_exact_mut(n)).enumerate() {
            let (valid, masked) = dr.split_at_mut(i + 1);
            let pv = &pr[..=i];
            let dot = lane_dot(pv, valid);
            for (d, &p) in valid.iter_mut().zip(pv) {
                *d = p * (*d - dot);
            }
            masked.fill(0.0);
        }
    }

    /// Row softmax in place; records each row's max and exp-sum (for the loss).
    #[inline(always)]
    pub fn softmax_rows(x: &mut [f32], cols: usize, maxes: &mut [f32], sums: &mut [f32]) {
        for (r, row) in x.chunks_exact_mut(cols).enumerate() {
            let max = lane_max(row);
            for v in row.iter_mut() {
                *v = fast_exp(*v - max);
            }
            let sum = lane_sum(row);
            let inv = 1.0 / sum;
            for v in row.iter_mut() {
                *v *= inv;
            }
            maxes[r] = max;
            sums[r] = sum;
        }
    }

    #[inline(always)]
    pub fn layernorm_forward(
        x: &[f32],
        gamma: &[f32],
        beta: &[f32],
        eps: f32,
        y: &mut [f32],
        xhat: &mut [f32],
        rstd: &mut [f32],
    ) {
        let h = gamma.len();
        for r in 0..rstd.len() {
            let xr = &x[r * h..(r + 1) * h];
            let mean = lane_sum(xr) / h as f32;
            let xh = &mut xhat[r * h..(r + 1) * h];
            for (o, v) in xh.iter_mut().zip(xr) {
                *o = v - mean;
            }
            let var = lane_dot(xh, xh) / h as f32;
            let rs = 1.0 / (var + eps).sqrt();
            rstd[r] = rs;
            for o in xh.iter_mut() {
                *o *= rs;
            }
            let yr = &mut y[r * h..(r + 1) * h];
            for j in 0..h {
                yr[j] = xh[j] * gamma[j] + beta[j];
            }
        }
    }

    #[inline(always)]
    pub fn layernorm_backward(
        dy: &[f32],
        xhat: &[f32],
        rstd: &[f32],
        gamma: &[f32],
        dx: &mut [f32],
        dgamma: &mut [f32],
        dbeta: &mut [f32],
    ) {
        let h = gamma.len();
        for r in 0..rstd.len() {
            let dyr = &dy[r * h..(r + 1) * h];
            let xr = &xhat[r * h..(r + 1) * h];
            // dx's row holds dxhat = dy ⊙ γ until it is overwritten with the result.
            let out = &mut dx[r * h..(r + 1) * h];
            for j in 0..h {
                dgamma[j] += dyr[j] * xr[j];
                dbeta[j] += dyr[j];
                out[j] = dyr[j] * gamma[j];
            }
            let mean_d = lane_sum(out) / h as f32;
            let mean_dx = lane_dot(out, xr) / h as f32;
            for j in 0..h {
                out[j] = rstd[r] * (out[j] - mean_d - xr[j] * mean_dx);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_and_tanh_are_accurate() {
        let mut worst = 0.0f64;
        for i in -8690..=8790 {
            let x = i as f32 * 0.01 + 0.003;
            let want = (x as f64).exp();
            let rel = ((fast_exp(x) as f64 - want) / want).abs();
            worst = worst.max(rel);
        }
        assert!(worst < 5e-7, "fast_exp worst relative error {worst}");
        assert_eq!(fast_exp(0.0), 1.0);
        assert!(fast_exp(-1000.0) >= 0.0 && fast_exp(-1000.0) < 1e-37);
        assert!(fast_exp(1000.0).is_finite());
        for i in -2000..=2000 {
            let y = i as f32 * 0.005;
            assert!(
                (fast_tanh(y) as f64 - (y as f64).tanh()).abs() < 3e-7,
                "tanh({y})"
            );
        }
        assert_eq!(fast_tanh(50.0), 1.0);
        assert_eq!(fast_tanh(-50.0), -1.0);
    }

    #[test]
    fn lane_reductions_match_f64_sums_and_handle_tails() {
        for n in [0, 1, 15, 16, 17, 100, 1037] {
            let x: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin()).collect();
            let want: f64 = x.iter().map(|&v| v as f64).sum();
            assert!((lane_sum(&x) as f64 - want).abs() < 1e-4, "sum of {n}");
            let dot: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
            assert!((lane_dot(&x, &x) as f64 - dot).abs() < 1e-4, "dot of {n}");
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(lane_max(&x), max, "max of {n}");
        }
    }

    #[test]
    fn every_simd_build_gives_the_baseline_bits() {
        let u: Vec<f32> = (0..1037)
            .map(|i| ((i as f32) * 0.731).sin() * 4.0)
            .collect();
        let n = 31;
        let h = 29;
        let rows = u.len() / h;
        let g: Vec<f32> = u[..h].iter().map(|v| 1.0 + v * 0.1).collect();
        for simd in Simd::ALL.into_iter().filter(|s| s.is_supported()) {
            let mut a = vec![0.0; u.len()];
            let mut b = vec![0.0; u.len()];
            gelu_forward(simd, &u, &mut a);
            portable::gelu_forward(&u, &mut b);
            assert_eq!(a, b, "{simd}");
            let mut da = u.clone();
            let mut db = u.clone();
            gelu_backward(simd, &u, &mut da);
            portable::gelu_backward(&u, &mut db);
            assert_eq!(da, db, "{simd}");
            let mut sa: Vec<f32> = u[..n * n].to_vec();
            let mut sb = sa.clone();
            causal_softmax(simd, &mut sa, n);
            portable::causal_softmax(&mut sb, n);
            assert_eq!(sa, sb, "{simd}");
            let mut pa = sa.clone();
            let mut pb = sa.clone();
            causal_softmax_backward(simd, &sb, &mut pa, n);
            portable::causal_softmax_backward(&sb, &mut pb, n);
            assert_eq!(pa, pb, "{simd}");
            let (mut y1, mut x1, mut r1) =
                (vec![0.0; rows * h], vec![0.0; rows * h], vec![0.0; rows]);
            let (mut y2, mut x2, mut r2) = (y1.clone(), x1.clone(), r1.clone());
            layernorm_forward(
                simd,
                &u[..rows * h],
                &g,
                &g,
                1e-5,
                &mut y1,
                &mut x1,
                &mut r1,
            );
            portable::layernorm_forward(&u[..rows * h], &g, &g, 1e-5, &mut y2, &mut x2, &mut r2);
            assert_eq!((&y1, &x1, &r1), (&y2, &x2, &r2), "{simd}");
            let (mut d1, mut g1, mut b1) = (vec![0.0; rows * h], vec![0.0; h], vec![0.0; h]);
            let (mut d2, mut g2, mut b2) = (d1.clone(), g1.clone(), b1.clone());
            layernorm_backward(
                simd,
                &u[..rows * h],
                &x1,
                &r1,
                &g,
                &mut d1,
                &mut g1,
                &mut b1,
            );
            portable::layernorm_backward(&u[..rows * h], &x1, &r1, &g, &mut d2, &mut g2, &mut b2);
            assert_eq!((d1, g1, b1), (d2, g2, b2), "{simd}");
        }
    }
}
