//! CPU implementation of [`Backend`]: `gemm` for matrix products, plain loops with a
//! fixed order for everything else.

// Index loops read closer to the math in these kernels.
#![allow(clippy::needless_range_loop)]

use crate::backend::{Backend, LayerNormBackward, LayerNormForward};
use crate::tensor::{MatMut, MatRef, Tensor};

/// CPU backend. `threads` is the gemm thread count per matrix product: a pipeline
/// stage owns one core, so stages use `threads = 1`; an unpipelined run may use more.
/// Only results computed with the same thread count are promised to be bit-identical.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuBackend {
    threads: usize,
}

impl CpuBackend {
    /// One thread per matrix product: the configuration of a pipeline stage and the
    /// default of the reference trainer (so their results can match bit for bit).
    pub fn single_thread() -> Self {
        CpuBackend { threads: 1 }
    }

    /// `threads` gemm threads per product (0 is treated as 1).
    pub fn with_threads(threads: usize) -> Self {
        CpuBackend {
            threads: threads.max(1),
        }
    }

    /// The configured thread count.
    pub fn threads(&self) -> usize {
        self.threads
    }

    fn parallelism(&self) -> gemm::Parallelism {
        if self.threads <= 1 {
            gemm::Parallelism::None
        } else {
            gemm::Parallelism::Rayon(self.threads)
        }
    }
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
fn fast_tanh(y: f32) -> f32 {
    1.0 - 2.0 / (fast_exp(2.0 * y) + 1.0)
}

impl Backend for CpuBackend {
    fn describe(&self) -> String {
        format!("cpu(threads={})", self.threads)
    }

    fn matmul(&self, dst: MatMut<'_>, a: MatRef<'_>, b: MatRef<'_>, scale: f32, accumulate: bool) {
        assert_eq!(a.cols, b.rows, "matmul inner dimensions differ");
        assert_eq!(
            (dst.rows, dst.cols),
            (a.rows, b.cols),
            "matmul output shape"
        );
        let (m, n, k) = (dst.rows, dst.cols, a.cols);
        if m == 0 || n == 0 {
            return;
        }
        if k == 0 {
            if !accumulate {
                for i in 0..m {
                    for j in 0..n {
                        let idx =
                            dst.offset + i * dst.row_stride as usize + j * dst.col_stride as usize;
                        dst.data[idx] = 0.0;
                    }
                }
            }
            return;
        }
        // SAFETY: the views were bounds-checked at construction (every addressed
        // element lies inside its slice), strides are non-negative, and `dst` is a
        // unique borrow, so gemm writes only to memory we own exclusively.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst.data.as_mut_ptr().add(dst.offset),
                dst.col_stride,
                dst.row_stride,
                accumulate,
                a.data.as_ptr().add(a.offset),
                a.col_stride,
                a.row_stride,
                b.data.as_ptr().add(b.offset),
                b.col_stride,
                b.row_stride,
                1.0,
                scale,
                false,
                false,
                false,
                self.parallelism(),
            );
        }
    }

    fn add_row_vector(&self, x: &mut Tensor, v: &[f32]) {
        let cols = x.cols();
        assert_eq!(cols, v.len());
        for row in x.data_mut().chunks_exact_mut(cols) {
            for (o, b) in row.iter_mut().zip(v) {
                *o += b;
            }
        }
    }

    fn accumulate_column_sums(&self, dst: &mut [f32], x: &Tensor) {
        let cols = x.cols();
        assert_eq!(cols, dst.len());
        for row in x.data().chunks_exact(cols) {
            for (d, v) in dst.iter_mut().zip(row) {
                *d += v;
            }
        }
    }

    fn add_assign(&self, dst: &mut [f32], src: &[f32]) {
        assert_eq!(dst.len(), src.len());
        for (d, s) in dst.iter_mut().zip(src) {
            *d += s;
        }
    }

    fn layernorm_forward(
        &self,
        x: &Tensor,
        gamma: &[f32],
        beta: &[f32],
        eps: f32,
    ) -> LayerNormForward {
        let (rows, h) = (x.rows(), x.cols());
        assert!(gamma.len() == h && beta.len() == h);
        let mut y = Tensor::zeros(x.shape());
        let mut xhat = Tensor::zeros(x.shape());
        let mut rstd = vec![0.0f32; rows];
        for r in 0..rows {
            let xr = &x.data()[r * h..(r + 1) * h];
            let mean = xr.iter().sum::<f32>() / h as f32;
            let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / h as f32;
            let rs = 1.0 / (var + eps).sqrt();
            rstd[r] = rs;
            let xh = &mut xhat.data_mut()[r * h..(r + 1) * h];
            for (o, v) in xh.iter_mut().zip(xr) {
                *o = (v - mean) * rs;
            }
            let yr = &mut y.data_mut()[r * h..(r + 1) * h];
            let xh = &xhat.data()[r * h..(r + 1) * h];
            for j in 0..h {
                yr[j] = xh[j] * gamma[j] + beta[j];
            }
        }
        LayerNormForward { y, xhat, rstd }
    }

    fn layernorm_backward(
        &self,
        dy: &Tensor,
        xhat: &Tensor,
        rstd: &[f32],
        gamma: &[f32],
    ) -> LayerNormBackward {
        let (rows, h) = (dy.rows(), dy.cols());
        assert_eq!(dy.shape(), xhat.shape());
        assert!(rstd.len() == rows && gamma.len() == h);
        let mut dx = Tensor::zeros(dy.shape());
        let mut dgamma = vec![0.0f32; h];
        let mut dbeta = vec![0.0f32; h];
        let mut dxhat = vec![0.0f32; h];
        for r in 0..rows {
            let dyr = &dy.data()[r * h..(r + 1) * h];
            let xr = &xhat.data()[r * h..(r + 1) * h];
            let mut sum_d = 0.0f32;
            let mut sum_dx = 0.0f32;
            for j in 0..h {
                dgamma[j] += dyr[j] * xr[j];
                dbeta[j] += dyr[j];
                let d = dyr[j] * gamma[j];
                dxhat[j] = d;
                sum_d += d;
                sum_dx += d * xr[j];
            }
            let mean_d = sum_d / h as f32;
            let mean_dx = sum_dx / h as f32;
            let out = &mut dx.data_mut()[r * h..(r + 1) * h];
            for j in 0..h {
                out[j] = rstd[r] * (dxhat[j] - mean_d - xr[j] * mean_dx);
            }
        }
        LayerNormBackward { dx, dgamma, dbeta }
    }

    fn gelu_forward(&self, u: &Tensor) -> Tensor {
        let mut y = Tensor::zeros(u.shape());
        for (o, &x) in y.data_mut().iter_mut().zip(u.data()) {
            let t = fast_tanh(GELU_C * (x + GELU_A * x * x * x));
            *o = 0.5 * x * (1.0 + t);
        }
        y
    }

    fn gelu_backward(&self, u: &Tensor, dy: &mut Tensor) {
        assert_eq!(u.shape(), dy.shape());
        for (d, &x) in dy.data_mut().iter_mut().zip(u.data()) {
            let t = fast_tanh(GELU_C * (x + GELU_A * x * x * x));
            let dt = GELU_C * (1.0 + 3.0 * GELU_A * x * x);
            *d *= 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dt;
        }
    }

    fn causal_softmax(&self, scores: &mut [f32], n: usize) {
        assert_eq!(scores.len(), n * n);
        for (i, row) in scores.chunks_exact_mut(n).enumerate() {
            let (valid, masked) = row.split_at_mut(i + 1);
            let max = valid.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            for v in valid.iter_mut() {
                *v = fast_exp(*v - max);
            }
            let sum: f32 = valid.iter().sum();
            let inv = 1.0 / sum;
            for v in valid.iter_mut() {
                *v *= inv;
            }
            masked.fill(0.0);
        }
    }

    fn softmax_backward(&self, p: &[f32], dp: &mut [f32], n: usize) {
        assert!(p.len() == n * n && dp.len() == n * n);
        for (pr, dr) in p.chunks_exact(n).zip(dp.chunks_exact_mut(n)) {
            let dot: f32 = pr.iter().zip(dr.iter()).map(|(a, b)| a * b).sum();
            for (d, &pv) in dr.iter_mut().zip(pr) {
                *d = pv * (*d - dot);
            }
        }
    }

    fn cross_entropy_forward(&self, logits: &Tensor, targets: &[u32]) -> (f32, Tensor) {
        let (rows, v) = (logits.rows(), logits.cols());
        assert_eq!(rows, targets.len());
        let mut probs = logits.clone();
        let mut total = 0.0f64;
        for (row, &t) in probs.data_mut().chunks_exact_mut(v).zip(targets) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let target_logit = row[t as usize];
            for x in row.iter_mut() {
                *x = fast_exp(*x - max);
            }
            let sum: f32 = row.iter().sum();
            total += (sum.ln() + max - target_logit) as f64;
            let inv = 1.0 / sum;
            for x in row.iter_mut() {
                *x *= inv;
            }
        }
        ((total / rows.max(1) as f64) as f32, probs)
    }

    fn cross_entropy_backward(&self, mut probs: Tensor, targets: &[u32], scale: f32) -> Tensor {
        let v = probs.cols();
        for (row, &t) in probs.data_mut().chunks_exact_mut(v).zip(targets) {
            row[t as usize] -= 1.0;
            for x in row.iter_mut() {
                *x *= scale;
            }
        }
        probs
    }

    fn embedding_forward(
        &self,
        tok: &Tensor,
        pos: &Tensor,
        tokens: &[u32],
        seq_len: usize,
    ) -> Tensor {
        let h = tok.cols();
        let mut x = Tensor::zeros(&[tokens.len(), h]);
        for (r, (row, &t)) in x.data_mut().chunks_exact_mut(h).zip(tokens).enumerate() {
            let te = &tok.data()[t as usize * h..(t as usize + 1) * h];
            let p = r % seq_len;
            let pe = &pos.data()[p * h..(p + 1) * h];
            for j in 0..h {
                row[j] = te[j] + pe[j];
            }
        }
        x
    }

    fn embedding_backward(
        &self,
        dtok: &mut Tensor,
        dpos: &mut Tensor,
        tokens: &[u32],
        dy: &Tensor,
        seq_len: usize,
    ) {
        let h = dy.cols();
        for (r, (row, &t)) in dy.data().chunks_exact(h).zip(tokens).enumerate() {
            let t = t as usize;
            self.add_assign(&mut dtok.data_mut()[t * h..(t + 1) * h], row);
            let p = r % seq_len;
            self.add_assign(&mut dpos.data_mut()[p * h..(p + 1) * h], row);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0f64;
                for p in 0..k {
                    s += a[i * k + p] as f64 * b[p * n + j] as f64;
                }
                c[i * n + j] = s as f32;
            }
        }
        c
    }

    #[test]
    fn matmul_matches_naive_including_transposed_views_and_accumulate() {
        let be = CpuBackend::single_thread();
        let (m, k, n) = (7, 5, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        let at = Tensor::from_vec(&[m, k], a.clone()).unwrap();
        let bt = Tensor::from_vec(&[k, n], b.clone()).unwrap();
        let mut c = Tensor::zeros(&[m, n]);
        be.matmul(c.mat_mut(), at.mat(), bt.mat(), 1.0, false);
        let want = naive(&a, &b, m, k, n);
        for (x, y) in c.data().iter().zip(&want) {
            assert!((x - y).abs() < 1e-5);
        }
        // accumulate: c += 2·a·b  → 3·want
        be.matmul(c.mat_mut(), at.mat(), bt.mat(), 2.0, true);
        for (x, y) in c.data().iter().zip(&want) {
            assert!((x - 3.0 * y).abs() < 1e-4);
        }
        // (bᵀ aᵀ) = (a b)ᵀ
        let mut ct = Tensor::zeros(&[n, m]);
        be.matmul(ct.mat_mut(), bt.mat().t(), at.mat().t(), 1.0, false);
        for i in 0..m {
            for j in 0..n {
                assert!((ct.data()[j * m + i] - want[i * n + j]).abs() < 1e-5);
            }
        }
    }

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
    fn causal_softmax_masks_and_normalizes() {
        let be = CpuBackend::single_thread();
        let mut s = vec![1.0, 2.0, 3.0, 0.5, -1.0, 7.0, 0.0, 0.0, 0.0];
        be.causal_softmax(&mut s, 3);
        assert_eq!(&s[..3], &[1.0, 0.0, 0.0]);
        assert_eq!(s[5], 0.0);
        let e = (0.5f32).exp() / ((0.5f32).exp() + (-1.0f32).exp());
        assert!((s[3] - e).abs() < 1e-6);
        assert!((s[6..].iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn cross_entropy_of_uniform_logits_is_ln_vocab() {
        let be = CpuBackend::single_thread();
        let logits = Tensor::zeros(&[4, 256]);
        let (loss, probs) = be.cross_entropy_forward(&logits, &[0, 1, 2, 255]);
        assert!((loss - (256f32).ln()).abs() < 1e-5);
        assert!((probs.data()[0] - 1.0 / 256.0).abs() < 1e-7);
    }
}
