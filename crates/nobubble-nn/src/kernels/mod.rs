//! Elementwise and row-wise CPU kernels on slices, compiled three times: for the
//! baseline target, with AVX2 and with AVX-512 enabled, picked at run time ([`Simd`]).
//!
//! Why several builds: these loops (GELU, softmax, LayerNorm) are a tenth of a block's
//! time and vectorize 2× (AVX2) or 4× (AVX-512) wider than the baseline. Why this is still
//! deterministic: every build performs the same IEEE operations per element in the same
//! order, and Rust never contracts `a*b + c` into an FMA on its own; the only fused
//! operations are explicit `mul_add`s, which are exactly rounded everywhere (a `vfmadd` in
//! the AVX2 and AVX-512 builds, libm's `fmaf` in the baseline one), so they produce
//! identical bits. Reductions (row sums, dot products) are written with
//! [`LANES`] partial sums combined in a fixed order (the squared gradient norm: eight f64
//! ones; column sums add whole rows in order, each column on its own): that order is part of
//! the kernel, not of the instruction set, so the compiler may map the partial sums onto
//! vector registers of any width without changing a bit.

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

/// `max xs` (order-independent, so any grouping gives the same value); −∞ if empty. The
/// partial maxima combine as a tree, not a chain of 16 dependent steps: a twentieth of a
/// short causal row's softmax.
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
    // No partial maximum is NaN (a NaN never compares greater), so this is `f32::max`.
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            acc[l] = if acc[l + width] > acc[l] {
                acc[l + width]
            } else {
                acc[l]
            };
        }
    }
    acc[0]
}

const GELU_C: f32 = 0.797_884_6; // sqrt(2/pi)
const GELU_A: f32 = 0.044_715;

/// `e^x` to about 1 ulp, branch-free so loops over it vectorize (libm's `exp`/`tanh`
/// calls were a third of a block's forward time). The polynomial is evaluated with
/// `mul_add`: exactly rounded on every machine, so the bits are the same at every SIMD
/// level, and half the operations of the unfused form (measured 2× faster GELU on an
/// AVX-512 Xeon, where the unfused form's ~35 dependent operations per element bound it).
/// The baseline build (no FMA instructions) pays a libm call per `mul_add` instead.
#[inline(always)]
pub(crate) fn fast_exp(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5·2^23: adding it rounds to an integer
    let x = x.clamp(-87.0, 88.0);
    let shifted = x.mul_add(std::f32::consts::LOG2_E, ROUND);
    let n = shifted - ROUND;
    // Cody–Waite: ln 2 split in two parts so r = x − n·ln2 stays exact.
    let r = (-n).mul_add(1.428_606_8e-6, (-n).mul_add(0.693_145_75, x));
    let mut p: f32 = 1.0 / 720.0;
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = p.mul_add(r, c);
    }
    let exponent = (shifted.to_bits() as i32 - ROUND.to_bits() as i32 + 127) << 23;
    p * f32::from_bits(exponent as u32)
}

/// `2^t` to about 2 ulp, for GELU's sigmoid, where it is half the kernel's work: base 2
/// needs no Cody–Waite split (`t − round(t)` is exact) and the caller folds `log₂e` into
/// its own constants, so it is four operations fewer than [`fast_exp`]. The degree-5
/// polynomial is a minimax fit of `2^r` on `[−½, ½]` (relative error 1.7e-7; its
/// constant term is 1, so powers of two come out exact), one term fewer than Taylor needs
/// for the same accuracy. Measured 0.70 → 0.56 ms for GELU's
/// forward on a million elements (AVX2, Zen 3).
#[inline(always)]
#[allow(clippy::approx_constant)] // 0.693147 is the fit's coefficient, 3 ulp from ln 2
pub(crate) fn fast_exp2(t: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5·2^23: adding it rounds to an integer
    let t = t.clamp(-126.0, 127.0);
    let shifted = t + ROUND;
    let r = t - (shifted - ROUND);
    let mut p: f32 = 1.326_471e-3;
    for c in [9.671_507e-3, 5.550_733_6e-2, 0.240_222_42, 0.693_147, 1.0] {
        p = p.mul_add(r, c);
    }
    let exponent = (shifted.to_bits() as i32 - ROUND.to_bits() as i32 + 127) << 23;
    p * f32::from_bits(exponent as u32)
}

/// `−2z·log₂e` for GELU's tanh approximation, `z = √(2/π)·(x + 0.044715·x³)`: GELU is
/// computed as `x·σ(2z) = x / (1 + 2^(−2z·log₂e))`, the same function as `½x(1 + tanh z)`
/// with one division and no `1 − t` cancellation.
#[inline(always)]
fn gelu_exponent(x: f32) -> f32 {
    const K: f32 = -2.0 * GELU_C * std::f32::consts::LOG2_E;
    (x * x).mul_add(K * GELU_A, K) * x
}

/// Defines `pub(crate) fn $name(simd, args)` that runs `portable::$name` compiled for the
/// requested [`Simd`] level (AVX-512, AVX2, or the baseline build). Callers pass a level the
/// CPU supports ([`Simd`] only hands out supported ones).
macro_rules! wide {
    ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {$(
        pub(crate) fn $name(simd: Simd, $($arg: $ty),*) $(-> $ret)? {
            debug_assert!(simd.is_supported(), "{simd} kernels on a CPU without them");
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    portable::$name($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
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
    fn gelu_forward(u: &[f32], bias: &[f32], y: &mut [f32]);
    fn gelu_backward(u: &[f32], bias: &[f32], dy: &mut [f32]);
    fn add_with_bias(dst: &mut [f32], src: &[f32], bias: &[f32]);
    fn causal_softmax(scores: &mut [f32], n: usize, first: usize);
    fn causal_softmax_backward(p: &[f32], dp: &mut [f32], n: usize);
    fn softmax_rows(x: &mut [f32], cols: usize, maxes: &mut [f32], sums: &mut [f32]);
    fn layernorm_forward(x: &[f32], gamma: &[f32], beta: &[f32], eps: f32, y: &mut [f32], xhat: &mut [f32], rstd: &mut [f32]);
    fn layernorm_forward_then_bias(x: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32, bias: &[f32], y: &mut [f32], xhat: &mut [f32], rstd: &mut [f32]);
    fn layernorm_backward(dy: &[f32], xhat: &[f32], rstd: &[f32], gamma: &[f32], residual: &[f32], dx: &mut [f32], dgamma: &mut [f32], dbeta: &mut [f32], dx_sums: &mut [f32]);
    fn rmsnorm_forward(x: &[f32], gamma: &[f32], eps: f32, y: &mut [f32], xhat: &mut [f32], rstd: &mut [f32]);
    fn rmsnorm_forward_then_bias(x: &mut [f32], gamma: &[f32], eps: f32, bias: &[f32], y: &mut [f32], xhat: &mut [f32], rstd: &mut [f32]);
    fn rmsnorm_backward(dy: &[f32], xhat: &[f32], rstd: &[f32], gamma: &[f32], residual: &[f32], dx: &mut [f32], dgamma: &mut [f32], dx_sums: &mut [f32]);
    fn swiglu_forward(u: &[f32], f: usize, y: &mut [f32]);
    fn swiglu_backward(u: &[f32], f: usize, dy: &[f32], du: &mut [f32]);
    fn rope(x: &mut [f32], cols: usize, first_row: usize, rope: RopeShape, cos: &[f32], sin: &[f32], inverse: bool);
    fn adamw(value: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], c: AdamWStep);
    fn sum_of_squares(x: &[f32]) -> f64;
    fn column_sums(dst: &mut [f32], x: &[f32]);
}

/// `dst += src` elementwise at `simd`'s width (the same bits at every level).
pub(crate) fn add(simd: Simd, dst: &mut [f32], src: &[f32]) {
    assert_eq!(dst.len(), src.len());
    add_with_bias(simd, dst, src, &[]);
}

/// The scalars of one AdamW update of one parameter ([`adamw`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct AdamWStep {
    pub beta1: f32,
    pub beta2: f32,
    /// Bias corrections `1 − β1^t`, `1 − β2^t`.
    pub bc1: f32,
    pub bc2: f32,
    pub eps: f32,
    pub lr: f32,
    /// `lr·λ` for decayed parameters, else 0.
    pub decay: f32,
    /// The clip factor the gradients are multiplied by.
    pub grad_scale: f32,
}

/// Where rotary positions apply in a row-major `[rows, cols]` tensor: the first `heads`
/// heads of `head_dim` columns, row `r` at position `r mod seq_len`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RopeShape {
    pub heads: usize,
    pub head_dim: usize,
    pub seq_len: usize,
}

/// The kernel bodies, always inlined into the baseline, AVX2 and AVX-512 builds.
mod portable {
    use super::{
        fast_exp, fast_exp2, gelu_exponent, lane_dot, lane_max, lane_sum, AdamWStep, RopeShape,
        GELU_A, GELU_C, LANES,
    };

    /// `m ← β1·m + (1−β1)·g`, `v ← β2·v + (1−β2)·g²`, `θ ← θ·(1 − lr·λ) − lr·m̂/(√v̂ + ε)`
    /// with `g` the scaled gradient: per element, unfused, so every build gives the same bits.
    #[inline(always)]
    pub fn adamw(value: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], c: AdamWStep) {
        let n = value.len();
        assert!(grad.len() == n && m.len() == n && v.len() == n);
        let lanes = value
            .iter_mut()
            .zip(grad)
            .zip(m.iter_mut())
            .zip(v.iter_mut());
        for (((value, &grad), m), v) in lanes {
            let g = grad * c.grad_scale;
            *m = c.beta1 * *m + (1.0 - c.beta1) * g;
            *v = c.beta2 * *v + (1.0 - c.beta2) * g * g;
            let update = (*m / c.bc1) / ((*v / c.bc2).sqrt() + c.eps);
            *value = *value * (1.0 - c.decay) - c.lr * update;
        }
    }

    /// `dst[j] += Σ_r x[r, j]` over rows of `dst.len()` columns, rows added in order (each
    /// column's order is the same at any vector width).
    #[inline(always)]
    pub fn column_sums(dst: &mut [f32], x: &[f32]) {
        for row in x.chunks_exact(dst.len().max(1)) {
            for (d, v) in dst.iter_mut().zip(row) {
                *d += v;
            }
        }
    }

    /// `Σ x²` in f64 as eight interleaved partial sums (element `j` into sum `j mod 8`)
    /// added pairwise in a fixed order: a vector's throughput instead of one dependent f64
    /// addition per element, and the same bits at every level.
    #[inline(always)]
    pub fn sum_of_squares(x: &[f32]) -> f64 {
        let mut acc = [0.0f64; 8];
        let mut groups = x.chunks_exact(8);
        for g in &mut groups {
            for (a, &v) in acc.iter_mut().zip(g) {
                *a += v as f64 * v as f64;
            }
        }
        for (a, &v) in acc.iter_mut().zip(groups.remainder()) {
            *a += v as f64 * v as f64;
        }
        let [a0, a1, a2, a3, a4, a5, a6, a7] = acc;
        ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))
    }

    /// The logistic function `1 / (1 + e^{−x})`.
    #[inline(always)]
    fn sigmoid(x: f32) -> f32 {
        1.0 / (1.0 + fast_exp(-x))
    }

    /// `f(u[r, j] + bias[j], out[r, j])` over rows of `bias.len()` columns (`bias` empty:
    /// `f(u, out)` elementwise): the bias a linear layer left to the kernel consuming its
    /// output, added where the element is loaded anyway.
    #[inline(always)]
    fn biased(u: &[f32], bias: &[f32], out: &mut [f32], f: impl Fn(f32, &mut f32)) {
        assert_eq!(u.len(), out.len());
        if bias.is_empty() {
            // Two vectors per step: two independent dependency chains for the scheduler.
            let mut outs = out.chunks_exact_mut(2 * LANES);
            let mut ins = u.chunks_exact(2 * LANES);
            for (o, x) in (&mut outs).zip(&mut ins) {
                for (o, &x) in o.iter_mut().zip(x) {
                    f(x, o);
                }
            }
            for (o, &x) in outs.into_remainder().iter_mut().zip(ins.remainder()) {
                f(x, o);
            }
            return;
        }
        assert!(
            u.len().is_multiple_of(bias.len()),
            "bias length must divide the data"
        );
        let rows = out
            .chunks_exact_mut(bias.len())
            .zip(u.chunks_exact(bias.len()));
        for (out, u) in rows {
            let mut outs = out.chunks_exact_mut(2 * LANES);
            let mut ins = u.chunks_exact(2 * LANES);
            let mut biases = bias.chunks_exact(2 * LANES);
            for ((o, x), b) in (&mut outs).zip(&mut ins).zip(&mut biases) {
                for ((o, &x), &b) in o.iter_mut().zip(x).zip(b) {
                    f(x + b, o);
                }
            }
            let tail = outs.into_remainder().iter_mut().zip(ins.remainder());
            for ((o, &x), &b) in tail.zip(biases.remainder()) {
                f(x + b, o);
            }
        }
    }

    #[inline(always)]
    pub fn gelu_forward(u: &[f32], bias: &[f32], y: &mut [f32]) {
        biased(u, bias, y, |x, o| {
            *o = x / (1.0 + fast_exp2(gelu_exponent(x)))
        });
    }

    /// `d/dx x·σ(2z) = σ + x·σ(1 − σ)·2z'`, with `2z' = 2c(1 + 3a·x²)`.
    #[inline(always)]
    pub fn gelu_backward(u: &[f32], bias: &[f32], dy: &mut [f32]) {
        biased(u, bias, dy, |x, d| {
            let s = 1.0 / (1.0 + fast_exp2(gelu_exponent(x)));
            let two_dz = (x * x).mul_add(6.0 * GELU_C * GELU_A, 2.0 * GELU_C);
            *d *= (x * s * (1.0 - s)).mul_add(two_dz, s);
        });
    }

    /// `dst[r, j] += src[r, j] + bias[j]` (`bias` empty: `dst += src`, what [`super::add`]
    /// runs).
    #[inline(always)]
    pub fn add_with_bias(dst: &mut [f32], src: &[f32], bias: &[f32]) {
        biased(src, bias, dst, |x, d| *d += x);
    }

    #[inline(always)]
    pub fn causal_softmax(scores: &mut [f32], n: usize, first: usize) {
        assert!(scores.len().is_multiple_of(n.max(1)) && first + scores.len() / n.max(1) <= n);
        for (r, row) in scores.chunks_exact_mut(n).enumerate() {
            let valid = first + r + 1;
            // Every step runs over whole groups of LANES, the last one padded past the
            // diagonal: vector work instead of a scalar tail of up to 15 elements, three
            // times per row. The padding is −∞ for the max and 0 after the exponentials, so
            // the max, and the sum (lane for lane, adding zeros), have the valid part's bits.
            let groups = valid.next_multiple_of(LANES).min(n);
            let padded = &mut row[..groups];
            padded[valid..].fill(f32::NEG_INFINITY);
            let max = lane_max(padded);
            for v in padded.iter_mut() {
                *v = fast_exp(*v - max);
            }
            padded[valid..].fill(0.0);
            let inv = 1.0 / lane_sum(padded);
            for v in padded.iter_mut() {
                *v *= inv;
            }
            // Past the diagonal exactly 0, the padding too (a non-finite sum made it NaN).
            row[valid..].fill(0.0);
        }
    }

    #[inline(always)]
    pub fn causal_softmax_backward(p: &[f32], dp: &mut [f32], n: usize) {
        assert!(p.len() == n * n && dp.len() == n * n);
        for (i, (pr, dr)) in p.chunks_exact(n).zip(dp.chunks_exact_mut(n)).enumerate() {
            // Whole groups of LANES, as in the forward: P is 0 past the diagonal, and so is
            // dP's padding once zeroed, so the dot product has the valid part's bits.
            let valid = i + 1;
            let groups = valid.next_multiple_of(LANES).min(n);
            dr[valid..groups].fill(0.0);
            let (row, pv) = (&mut dr[..groups], &pr[..groups]);
            let dot = lane_dot(pv, row);
            for (d, &p) in row.iter_mut().zip(pv) {
                *d = p * (*d - dot);
            }
            dr[valid..].fill(0.0);
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

    /// [`layernorm_forward`] row by row, each row of `x` then getting `bias` (empty: none)
    /// added in place while it is in L1 — see [`then_bias`].
    #[inline(always)]
    pub fn layernorm_forward_then_bias(
        x: &mut [f32],
        gamma: &[f32],
        beta: &[f32],
        eps: f32,
        bias: &[f32],
        y: &mut [f32],
        xhat: &mut [f32],
        rstd: &mut [f32],
    ) {
        then_bias(x, gamma.len(), bias, |r, row| {
            let span = r * row.len()..(r + 1) * row.len();
            let (y, xhat) = (&mut y[span.clone()], &mut xhat[span]);
            layernorm_forward(row, gamma, beta, eps, y, xhat, &mut rstd[r..r + 1]);
        });
    }

    /// `norm(r, row)` on each row of `x` (`h` wide), then `bias` added to the row: a
    /// pre-norm block's residual stream gets the next branch's output bias in the pass that
    /// normalizes it (the branch's last product then accumulates onto the stream), not in a
    /// pass of its own.
    #[inline(always)]
    fn then_bias(x: &mut [f32], h: usize, bias: &[f32], mut norm: impl FnMut(usize, &[f32])) {
        for (r, row) in x.chunks_exact_mut(h.max(1)).enumerate() {
            norm(r, row);
            for (v, &b) in row.iter_mut().zip(bias) {
                *v += b;
            }
        }
    }

    #[inline(always)]
    /// The input gradient of LayerNorm, plus `residual` (empty: none) and its column sums
    /// into `dx_sums` (empty: none) — see [`finish_row`].
    pub fn layernorm_backward(
        dy: &[f32],
        xhat: &[f32],
        rstd: &[f32],
        gamma: &[f32],
        residual: &[f32],
        dx: &mut [f32],
        dgamma: &mut [f32],
        dbeta: &mut [f32],
        dx_sums: &mut [f32],
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
            finish_row(out, residual.get(r * h..(r + 1) * h), dx_sums);
        }
    }

    /// A norm's input-gradient row, while it is in L1: a pre-norm block's residual gradient
    /// added (`out + res`: the bits of the separate add it replaces, IEEE addition being
    /// commutative), then the row added into `sums` if wanted (the bits of
    /// [`column_sums`] over the same rows) — two passes over the `[n, h]` gradient less.
    #[inline(always)]
    fn finish_row(out: &mut [f32], residual: Option<&[f32]>, sums: &mut [f32]) {
        if let Some(res) = residual {
            for (o, &r) in out.iter_mut().zip(res) {
                *o += r;
            }
        }
        if !sums.is_empty() {
            for (s, &o) in sums.iter_mut().zip(out.iter()) {
                *s += o;
            }
        }
    }

    #[inline(always)]
    pub fn rmsnorm_forward(
        x: &[f32],
        gamma: &[f32],
        eps: f32,
        y: &mut [f32],
        xhat: &mut [f32],
        rstd: &mut [f32],
    ) {
        let h = gamma.len();
        for r in 0..rstd.len() {
            let xr = &x[r * h..(r + 1) * h];
            let rs = 1.0 / (lane_dot(xr, xr) / h as f32 + eps).sqrt();
            rstd[r] = rs;
            let xh = &mut xhat[r * h..(r + 1) * h];
            let yr = &mut y[r * h..(r + 1) * h];
            for j in 0..h {
                xh[j] = xr[j] * rs;
                yr[j] = xh[j] * gamma[j];
            }
        }
    }

    /// [`rmsnorm_forward`] with [`then_bias`].
    #[inline(always)]
    pub fn rmsnorm_forward_then_bias(
        x: &mut [f32],
        gamma: &[f32],
        eps: f32,
        bias: &[f32],
        y: &mut [f32],
        xhat: &mut [f32],
        rstd: &mut [f32],
    ) {
        then_bias(x, gamma.len(), bias, |r, row| {
            let span = r * row.len()..(r + 1) * row.len();
            let (y, xhat) = (&mut y[span.clone()], &mut xhat[span]);
            rmsnorm_forward(row, gamma, eps, y, xhat, &mut rstd[r..r + 1]);
        });
    }

    #[inline(always)]
    pub fn rmsnorm_backward(
        dy: &[f32],
        xhat: &[f32],
        rstd: &[f32],
        gamma: &[f32],
        residual: &[f32],
        dx: &mut [f32],
        dgamma: &mut [f32],
        dx_sums: &mut [f32],
    ) {
        let h = gamma.len();
        for r in 0..rstd.len() {
            let dyr = &dy[r * h..(r + 1) * h];
            let xr = &xhat[r * h..(r + 1) * h];
            let out = &mut dx[r * h..(r + 1) * h];
            for j in 0..h {
                dgamma[j] += dyr[j] * xr[j];
                out[j] = dyr[j] * gamma[j];
            }
            let mean_dx = lane_dot(out, xr) / h as f32;
            for j in 0..h {
                out[j] = rstd[r] * (out[j] - xr[j] * mean_dx);
            }
            finish_row(out, residual.get(r * h..(r + 1) * h), dx_sums);
        }
    }

    /// Rows of `u` are `[gate | up]` (`2f` wide), rows of `y` are `f` wide.
    #[inline(always)]
    pub fn swiglu_forward(u: &[f32], f: usize, y: &mut [f32]) {
        assert_eq!(u.len(), 2 * y.len());
        for (ur, yr) in u.chunks_exact(2 * f).zip(y.chunks_exact_mut(f)) {
            let (gate, up) = ur.split_at(f);
            for j in 0..f {
                let g = gate[j];
                yr[j] = g * sigmoid(g) * up[j];
            }
        }
    }

    /// `d gate = dy·up·σ(g)·(1 + g·(1 − σ(g)))`, `d up = dy·g·σ(g)`.
    #[inline(always)]
    pub fn swiglu_backward(u: &[f32], f: usize, dy: &[f32], du: &mut [f32]) {
        assert!(u.len() == du.len() && u.len() == 2 * dy.len());
        let rows = u.chunks_exact(2 * f).zip(du.chunks_exact_mut(2 * f));
        for ((ur, dur), dyr) in rows.zip(dy.chunks_exact(f)) {
            let (gate, up) = ur.split_at(f);
            let (dgate, dup) = dur.split_at_mut(f);
            for j in 0..f {
                let (g, s) = (gate[j], sigmoid(gate[j]));
                dgate[j] = dyr[j] * up[j] * (s * (1.0 + g * (1.0 - s)));
                dup[j] = dyr[j] * (g * s);
            }
        }
    }

    #[inline(always)]
    pub fn rope(
        x: &mut [f32],
        cols: usize,
        first_row: usize,
        rope: RopeShape,
        cos: &[f32],
        sin: &[f32],
        inverse: bool,
    ) {
        let (d, half) = (rope.head_dim, rope.head_dim / 2);
        // The backward rotates by the opposite angle: the same formula with −sin.
        let sign = if inverse { -1.0 } else { 1.0 };
        for (r, row) in x.chunks_exact_mut(cols).enumerate() {
            let pos = (first_row + r) % rope.seq_len;
            let (c, s) = (&cos[pos * half..][..half], &sin[pos * half..][..half]);
            for head in row[..rope.heads * d].chunks_exact_mut(d) {
                let (lo, hi) = head.split_at_mut(half);
                for j in 0..half {
                    let (a, b) = (lo[j], hi[j]);
                    let sj = sign * s[j];
                    lo[j] = a * c[j] - b * sj;
                    hi[j] = b * c[j] + a * sj;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
