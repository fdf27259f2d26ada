//! A [`Backend`] that times every operation of another one, by kind: where a pass's time
//! goes (`nobubble bench engine --profile`).
//!
//! Why a wrapper and not a sampling profiler: layers call nothing but the backend for
//! arithmetic, so timing at this seam splits a pass into matrix products, each elementwise
//! kernel, and the rest (copies, allocation, bookkeeping: the pass time minus the
//! backend's), on any machine and without tools.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::backend::{Backend, NormBackward, NormForward, NormGradExtras, Task};
use crate::tensor::{MatMut, MatRef, Tensor};

/// Wraps `inner`, adding each call's time to its operation kind.
pub struct TimingBackend<'a> {
    inner: &'a dyn Backend,
    seconds: Mutex<BTreeMap<&'static str, f64>>,
    /// Inside [`Backend::run_tasks`] (the attention core): its products count apart.
    in_tasks: AtomicBool,
}

impl<'a> TimingBackend<'a> {
    /// Times the operations of `inner`.
    pub fn new(inner: &'a dyn Backend) -> Self {
        TimingBackend {
            inner,
            seconds: Mutex::new(BTreeMap::new()),
            in_tasks: AtomicBool::new(false),
        }
    }

    /// Seconds per operation kind since the last call, and resets them.
    pub fn take(&self) -> BTreeMap<&'static str, f64> {
        std::mem::take(&mut *self.seconds.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn time<T>(&self, kind: &'static str, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        let dt = start.elapsed().as_secs_f64();
        *self
            .seconds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(kind)
            .or_default() += dt;
        out
    }
}

impl Backend for TimingBackend<'_> {
    fn describe(&self) -> String {
        format!("timed {}", self.inner.describe())
    }

    fn threads(&self) -> usize {
        self.inner.threads()
    }

    fn as_dyn(&self) -> &dyn Backend {
        self
    }

    fn install(&self, work: &mut (dyn FnMut() + Send)) {
        self.inner.install(work)
    }

    /// On one thread the tasks run here, so their operations are timed by kind; on more,
    /// they run on the inner backend's threads and count as `parallel tasks`.
    fn run_tasks(&self, tasks: Vec<Task<'_>>) {
        if self.inner.threads() <= 1 {
            self.in_tasks.store(true, Ordering::Relaxed);
            for task in tasks {
                task(self);
            }
            self.in_tasks.store(false, Ordering::Relaxed);
        } else {
            self.time("parallel tasks", || self.inner.run_tasks(tasks))
        }
    }

    fn matmul(&self, dst: MatMut<'_>, a: MatRef<'_>, b: MatRef<'_>, scale: f32, accumulate: bool) {
        let kind = if self.in_tasks.load(Ordering::Relaxed) {
            "matmul (attention)"
        } else {
            "matmul"
        };
        self.time(kind, || self.inner.matmul(dst, a, b, scale, accumulate))
    }

    fn small_matmul(
        &self,
        dst: MatMut<'_>,
        a: MatRef<'_>,
        b: MatRef<'_>,
        scale: f32,
        accumulate: bool,
    ) {
        self.time("matmul (attention)", || {
            self.inner.small_matmul(dst, a, b, scale, accumulate)
        })
    }

    fn pack(&self, src: MatRef<'_>, bias: &[f32], dst: &mut [f32], transpose: bool) {
        self.time("pack", || self.inner.pack(src, bias, dst, transpose))
    }

    fn add_row_vector(&self, x: &mut [f32], v: &[f32]) {
        self.time("bias", || self.inner.add_row_vector(x, v))
    }

    fn broadcast_rows(&self, v: &[f32], rows: usize) -> Tensor {
        self.time("bias", || self.inner.broadcast_rows(v, rows))
    }

    fn accumulate_column_sums(&self, dst: &mut [f32], x: &Tensor) {
        self.time("bias grad", || self.inner.accumulate_column_sums(dst, x))
    }

    fn column_sums_block(&self, dst: &mut [f32], x: &[f32]) {
        self.time("bias grad", || self.inner.column_sums_block(dst, x))
    }

    fn add_assign(&self, dst: &mut [f32], src: &[f32]) {
        self.time("add", || self.inner.add_assign(dst, src))
    }

    fn layernorm_forward(&self, x: &Tensor, gamma: &[f32], beta: &[f32], eps: f32) -> NormForward {
        self.time("layernorm", || {
            self.inner.layernorm_forward(x, gamma, beta, eps)
        })
    }

    fn layernorm_backward(
        &self,
        dy: &Tensor,
        xhat: &Tensor,
        rstd: &[f32],
        gamma: &[f32],
        extras: NormGradExtras<'_>,
    ) -> NormBackward {
        self.time("layernorm", || {
            self.inner.layernorm_backward(dy, xhat, rstd, gamma, extras)
        })
    }

    fn rmsnorm_forward(&self, x: &Tensor, gamma: &[f32], eps: f32) -> NormForward {
        self.time("rmsnorm", || self.inner.rmsnorm_forward(x, gamma, eps))
    }

    fn layernorm_forward_then_bias(
        &self,
        x: &mut Tensor,
        gamma: &[f32],
        beta: &[f32],
        eps: f32,
        bias: &[f32],
    ) -> NormForward {
        self.time("layernorm", || {
            self.inner
                .layernorm_forward_then_bias(x, gamma, beta, eps, bias)
        })
    }

    fn rmsnorm_forward_then_bias(
        &self,
        x: &mut Tensor,
        gamma: &[f32],
        eps: f32,
        bias: &[f32],
    ) -> NormForward {
        self.time("rmsnorm", || {
            self.inner.rmsnorm_forward_then_bias(x, gamma, eps, bias)
        })
    }

    fn rmsnorm_backward(
        &self,
        dy: &Tensor,
        xhat: &Tensor,
        rstd: &[f32],
        gamma: &[f32],
        extras: NormGradExtras<'_>,
    ) -> NormBackward {
        self.time("rmsnorm", || {
            self.inner.rmsnorm_backward(dy, xhat, rstd, gamma, extras)
        })
    }

    fn swiglu_forward(&self, u: &Tensor) -> Tensor {
        self.time("swiglu", || self.inner.swiglu_forward(u))
    }

    fn swiglu_backward(&self, u: &Tensor, dy: &Tensor) -> Tensor {
        self.time("swiglu", || self.inner.swiglu_backward(u, dy))
    }

    fn rope(
        &self,
        x: &mut Tensor,
        heads: usize,
        head_dim: usize,
        seq_len: usize,
        cos: &[f32],
        sin: &[f32],
        inverse: bool,
    ) {
        self.time("rope", || {
            self.inner
                .rope(x, heads, head_dim, seq_len, cos, sin, inverse)
        })
    }

    fn gelu_forward(&self, u: &Tensor, bias: &[f32]) -> Tensor {
        self.time("gelu", || self.inner.gelu_forward(u, bias))
    }

    /// Timed as `gelu`, with the bias gradient it sums on the way.
    fn gelu_backward(&self, u: &Tensor, bias: &[f32], dy: &mut Tensor, bias_grad: &mut [f32]) {
        self.time("gelu", || self.inner.gelu_backward(u, bias, dy, bias_grad))
    }

    fn causal_softmax(&self, scores: &mut [f32], n: usize, first: usize) {
        self.time("softmax", || self.inner.causal_softmax(scores, n, first))
    }

    fn causal_softmax_backward(&self, p: &[f32], dp: &mut [f32], n: usize) {
        self.time("softmax", || self.inner.causal_softmax_backward(p, dp, n))
    }

    fn softmax_row(&self, row: &mut [f32]) {
        self.time("softmax", || self.inner.softmax_row(row))
    }

    fn cross_entropy_forward(&self, logits: &Tensor, targets: &[u32]) -> (f32, Tensor) {
        self.time("cross-entropy", || {
            self.inner.cross_entropy_forward(logits, targets)
        })
    }

    fn cross_entropy_backward(&self, probs: Tensor, targets: &[u32], scale: f32) -> Tensor {
        self.time("cross-entropy", || {
            self.inner.cross_entropy_backward(probs, targets, scale)
        })
    }

    fn embedding_forward(
        &self,
        tok: &Tensor,
        pos: Option<&Tensor>,
        tokens: &[u32],
        seq_len: usize,
    ) -> Tensor {
        self.time("embedding", || {
            self.inner.embedding_forward(tok, pos, tokens, seq_len)
        })
    }

    fn embedding_backward(
        &self,
        dtok: &mut Tensor,
        dpos: Option<&mut Tensor>,
        tokens: &[u32],
        dy: &Tensor,
        seq_len: usize,
    ) {
        self.time("embedding", || {
            self.inner
                .embedding_backward(dtok, dpos, tokens, dy, seq_len)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::CpuBackend;

    #[test]
    fn times_each_kind_and_returns_the_inner_results() {
        let cpu = CpuBackend::single_thread();
        let timed = TimingBackend::new(&cpu);
        let a = Tensor::from_vec(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let mut c = Tensor::zeros(&[2, 2]);
        timed.matmul(c.mat_mut(), a.mat(), a.mat(), 1.0, false);
        assert_eq!(c.data(), &[7.0, 10.0, 15.0, 22.0]);
        let g = timed.gelu_forward(&a, &[]);
        assert_eq!(g.data(), cpu.gelu_forward(&a, &[]).data());
        let t = timed.take();
        assert_eq!(t.keys().copied().collect::<Vec<_>>(), ["gelu", "matmul"]);
        assert!(t.values().all(|&s| s >= 0.0));
        assert!(timed.take().is_empty(), "take resets");
    }
}
