//! The device seam: every arithmetic operation a layer performs goes through
//! [`Backend`].
//!
//! Why a trait: layers are written once, against these operations only, so a CUDA
//! backend can be added later by implementing this trait (and giving [`Tensor`] a
//! device storage) without touching `layers/`. [`CpuBackend`] is the only
//! implementation today; its matrix products use the `gemm` crate, with the SIMD
//! level and the thread count chosen per backend instance (a rank's `--threads-per-rank`).
//!
//! Determinism contract: for a fixed SIMD level, every operation is a pure function of
//! its inputs with a fixed reduction order — whatever the thread count — so the same
//! passes in the same order give bit-identical results.

pub use crate::cpu::CpuBackend;
use crate::tensor::{MatMut, MatRef, Tensor};

/// Outputs of a LayerNorm or RMSNorm forward: what the next layer consumes (`y`) and what
/// the backward needs (`xhat`, `rstd`).
#[derive(Debug, Clone)]
pub struct NormForward {
    /// Normalized, scaled and shifted output `xhat·γ + β` (RMSNorm: `xhat·γ`).
    pub y: Tensor,
    /// Normalized input `(x − mean)·rstd` (RMSNorm: `x·rstd`), saved for the backward.
    pub xhat: Tensor,
    /// Reciprocal standard deviation per row, saved for the backward.
    pub rstd: Vec<f32>,
}

/// Rows per block of a sum over rows ([`Backend::accumulate_column_sums`], a norm backward's
/// γ/β): each block is summed from zero and the blocks' sums are then added in order, so that
/// threads can take whole blocks without changing a bit.
pub const SUM_ROWS: usize = 64;

/// Outputs of a LayerNorm input-gradient pass: the input gradient plus this
/// microbatch's (small, `2·h` floats) contribution to the γ/β gradients, which the
/// layer keeps until its W pass adds it to the accumulators.
#[derive(Debug, Clone)]
pub struct NormBackward {
    /// Gradient w.r.t. the layer input.
    pub dx: Tensor,
    /// Σ over rows of `dy ⊙ xhat` for this microbatch.
    pub dgamma: Vec<f32>,
    /// Σ over rows of `dy` for this microbatch (empty for RMSNorm, which has no β).
    pub dbeta: Vec<f32>,
    /// Σ over rows of `dx`, if [`NormGradExtras::column_sums`] asked for it (else empty).
    pub dx_column_sums: Vec<f32>,
}

/// What a norm's input-gradient pass also does to its result, row by row while the row is
/// in L1: in a pre-norm block the norm's input gradient is added to the residual branch's,
/// and the sum feeds a linear layer whose bias gradient is its column sums. Done apart,
/// these are two more passes over an `[n, h]` tensor each.
#[derive(Clone, Copy, Debug, Default)]
pub struct NormGradExtras<'a> {
    /// Added to the input gradient (the shape of `dy`).
    pub residual: Option<&'a Tensor>,
    /// Sum the final input gradient's columns into [`NormBackward::dx_column_sums`], with
    /// [`Backend::accumulate_column_sums`]'s bits.
    pub column_sums: bool,
}

/// Independent work a layer hands to [`Backend::run_tasks`]: it computes with the backend
/// it is given (single-threaded, of the same kind) into memory it owns exclusively.
pub type Task<'a> = Box<dyn FnOnce(&dyn Backend) + Send + 'a>;

/// Runs `work` through [`Backend::install`] (on the backend's own threads) and returns
/// its result.
pub fn on_backend<T: Send>(be: &dyn Backend, work: impl FnOnce() -> T + Send) -> T {
    let mut work = Some(work);
    let mut out = None;
    be.install(&mut || out = work.take().map(|w| w()));
    out.expect("Backend::install runs the work it is given")
}

/// The operations layers need. All are deterministic for a given backend instance.
pub trait Backend: Send + Sync {
    /// Human-readable description, e.g. `cpu(threads=1, simd=avx512)`.
    fn describe(&self) -> String;

    /// Threads this backend spreads its work over (1: all on the caller's thread).
    fn threads(&self) -> usize {
        1
    }

    /// Runs independent tasks, on up to [`Backend::threads`] threads (a single-threaded CPU
    /// backend: on two while a waiting rank lends it a core); each task gets a
    /// single-threaded backend of the same kind that borrows nothing. Why: the attention core is many small
    /// products (one per sequence and head), too small to split one by one, but the
    /// sequences are independent. Each task computes exactly what it would sequentially,
    /// so the results do not depend on the thread count.
    fn run_tasks(&self, tasks: Vec<Task<'_>>) {
        for task in tasks {
            task(self.as_dyn());
        }
    }

    /// Runs `work` where this backend's threads are: on a multi-threaded CPU backend, on
    /// a worker of its own thread pool, so the caller's thread sleeps instead of competing
    /// with the pool for the cores (a pass's sequential stretches run on a worker, and the
    /// other workers join its parallel ones). Stages run every pass through this.
    fn install(&self, work: &mut (dyn FnMut() + Send)) {
        work()
    }

    /// This backend itself, as a trait object (what a sequential task receives).
    fn as_dyn(&self) -> &dyn Backend;

    /// `dst = (accumulate ? dst : 0) + scale · a·b`. Strided views make transposes and
    /// per-head slices free.
    fn matmul(&self, dst: MatMut<'_>, a: MatRef<'_>, b: MatRef<'_>, scale: f32, accumulate: bool);

    /// [`Backend::matmul`] for products too small for a packing GEMM to pay (the attention
    /// core's per-head blocks), with `b`'s and `dst`'s rows contiguous. `CpuBackend` sums
    /// each element in order of the inner index, so a row or column block of a product has
    /// the same bits as the whole product's; a backend without such a kernel runs `matmul`.
    fn small_matmul(
        &self,
        dst: MatMut<'_>,
        a: MatRef<'_>,
        b: MatRef<'_>,
        scale: f32,
        accumulate: bool,
    ) {
        self.matmul(dst, a, b, scale, accumulate)
    }

    /// `src` copied into `dst` row-major, transposed (`[src.cols, src.rows]`) if asked, with
    /// `bias` (one value per column of `src`; empty: none) added: an operand of
    /// [`Backend::small_matmul`] laid out for it, biased on the way.
    fn pack(&self, src: MatRef<'_>, bias: &[f32], dst: &mut [f32], transpose: bool) {
        crate::small_gemm::pack(crate::simd::Simd::Portable, src, bias, dst, transpose)
    }

    /// Adds `v` to every row of the row-major rows `x` (`v.len()` columns): a bias add.
    fn add_row_vector(&self, x: &mut [f32], v: &[f32]);

    /// A `[rows, v.len()]` tensor whose every row is `v` (a bias to accumulate onto).
    fn broadcast_rows(&self, v: &[f32], rows: usize) -> Tensor;

    /// `dst[j] += Σ_rows x[row, j]` (bias gradients): each block of [`SUM_ROWS`] rows summed
    /// in order from zero, then the blocks' sums added to `dst` in order.
    fn accumulate_column_sums(&self, dst: &mut [f32], x: &Tensor);

    /// `dst[j] += Σ_rows x[row, j]` over the rows of `x` (`dst.len()` columns each), in
    /// order, on this thread: one block of [`Self::accumulate_column_sums`], for work that
    /// has a block's rows at hand (adding such blocks' sums, each from zero, in block order
    /// gives its bits).
    fn column_sums_block(&self, dst: &mut [f32], x: &[f32]);

    /// `dst += src` elementwise (residuals and gradient accumulation).
    fn add_assign(&self, dst: &mut [f32], src: &[f32]);

    /// Row-wise LayerNorm.
    fn layernorm_forward(&self, x: &Tensor, gamma: &[f32], beta: &[f32], eps: f32) -> NormForward;

    /// LayerNorm input gradient (with `extras`) plus the per-microbatch γ/β partial sums.
    fn layernorm_backward(
        &self,
        dy: &Tensor,
        xhat: &Tensor,
        rstd: &[f32],
        gamma: &[f32],
        extras: NormGradExtras<'_>,
    ) -> NormBackward;

    /// Row-wise RMSNorm: `xhat = x / sqrt(mean(x²) + eps)`, `y = xhat·γ`.
    fn rmsnorm_forward(&self, x: &Tensor, gamma: &[f32], eps: f32) -> NormForward;

    /// [`Self::layernorm_forward`] of `x`, then `bias` (one value per column, or empty) added
    /// to every row of `x` in the same pass: a pre-norm block's residual stream gets the next
    /// branch's output bias while its rows are in L1, and the branch's last product then
    /// accumulates onto the stream — no residual-add pass.
    fn layernorm_forward_then_bias(
        &self,
        x: &mut Tensor,
        gamma: &[f32],
        beta: &[f32],
        eps: f32,
        bias: &[f32],
    ) -> NormForward;

    /// [`Self::rmsnorm_forward`] with [`Self::layernorm_forward_then_bias`]'s bias.
    fn rmsnorm_forward_then_bias(
        &self,
        x: &mut Tensor,
        gamma: &[f32],
        eps: f32,
        bias: &[f32],
    ) -> NormForward;

    /// RMSNorm input gradient (with `extras`) plus the per-microbatch γ partial sums
    /// (`dbeta` empty).
    fn rmsnorm_backward(
        &self,
        dy: &Tensor,
        xhat: &Tensor,
        rstd: &[f32],
        gamma: &[f32],
        extras: NormGradExtras<'_>,
    ) -> NormBackward;

    /// SwiGLU of `u = [gate | up]` (`[n, 2f]`): `silu(gate) ⊙ up`, `[n, f]`.
    fn swiglu_forward(&self, u: &Tensor) -> Tensor;

    /// Gradient of [`Backend::swiglu_forward`] w.r.t. `u`, `[n, 2f]`, from `dy` (`[n, f]`).
    fn swiglu_backward(&self, u: &Tensor, dy: &Tensor) -> Tensor;

    /// Rotary positions in place: in the first `heads·d` columns of every row of `x`
    /// (row `r` at position `r mod seq_len`), each head's pair `(j, j + d/2)` is rotated
    /// by the angle whose cosine and sine are `cos[pos·d/2 + j]`, `sin[pos·d/2 + j]`
    /// (Hugging Face's `rotate_half` convention); `inverse` rotates back (the backward).
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: &mut Tensor,
        heads: usize,
        head_dim: usize,
        seq_len: usize,
        cos: &[f32],
        sin: &[f32],
        inverse: bool,
    );

    /// GELU (tanh approximation) of `u + bias`, elementwise (`bias`: one value per column,
    /// or empty). Why the bias here: a linear layer feeding GELU leaves its bias to this
    /// kernel, which loads every element anyway, instead of a pass of its own. The output is
    /// `[rows, cols]` and may have padded rows (`CpuBackend`'s does where rows would alias in
    /// L1): callers read it through [`Tensor::mat`].
    fn gelu_forward(&self, u: &Tensor, bias: &[f32]) -> Tensor;

    /// Turns `dy` into `du = dy ⊙ gelu'(u + bias)` in place; with a non-empty `bias_grad`
    /// (`bias.len()` long) also adds `du`'s column sums to it, with the bits of
    /// [`Backend::accumulate_column_sums`], while each block of rows is in cache: the bias
    /// gradient of the linear that produced `u`, without a pass of its own. `dy` may have
    /// padded rows (the MLP's does: fc2's input gradient, which fc1's W reads).
    fn gelu_backward(&self, u: &Tensor, bias: &[f32], dy: &mut Tensor, bias_grad: &mut [f32]);

    /// In-place causal softmax of rows `first..` of an `n×n` row-major score block (`scores`
    /// holds whole rows of `n`): row `i` keeps columns `0..=i`, later columns become exactly 0.
    /// Rows are independent, so a block of rows gives the bits of the whole.
    fn causal_softmax(&self, scores: &mut [f32], n: usize, first: usize);

    /// In-place softmax of one row: the arithmetic of each row of
    /// [`Backend::causal_softmax`] over its unmasked columns (incremental decoding's last
    /// row).
    fn softmax_row(&self, row: &mut [f32]);

    /// In-place backward of [`Backend::causal_softmax`] on an `n×n` block: for
    /// `j ≤ i`, `dp[i,j]` becomes `p[i,j]·(dp[i,j] − Σ_{k≤i} p[i,k]·dp[i,k])`; entries
    /// of `dp` above the diagonal are ignored on input (they may hold anything) and set to
    /// 0. `p` is [`Backend::causal_softmax`]'s output, 0 above the diagonal (the kernel
    /// reads a few of those zeros to stay in whole vectors).
    fn causal_softmax_backward(&self, p: &[f32], dp: &mut [f32], n: usize);

    /// Mean softmax cross-entropy over rows and the probabilities the backward needs.
    /// The loss sum is accumulated in f64, in row order.
    fn cross_entropy_forward(&self, logits: &Tensor, targets: &[u32]) -> (f32, Tensor);

    /// `(probs − onehot(targets)) · scale`, reusing the probabilities' storage.
    fn cross_entropy_backward(&self, probs: Tensor, targets: &[u32], scale: f32) -> Tensor;

    /// `x[r] = tok[tokens[r]] + pos[r mod seq_len]` (without `pos`: the token rows alone).
    fn embedding_forward(
        &self,
        tok: &Tensor,
        pos: Option<&Tensor>,
        tokens: &[u32],
        seq_len: usize,
    ) -> Tensor;

    /// Scatter-adds `dy` rows into the token and (if any) position gradient tables, in row
    /// order.
    fn embedding_backward(
        &self,
        dtok: &mut Tensor,
        dpos: Option<&mut Tensor>,
        tokens: &[u32],
        dy: &Tensor,
        seq_len: usize,
    );
}
