//! CPU implementation of [`Backend`]: `gemm` for matrix products, loops with a fixed
//! order (compiled per [`Simd`] level) for everything else.

use crate::backend::{Backend, NormBackward, NormForward, NormGradExtras, Task, SUM_ROWS};
use crate::error::Result;
use crate::kernels;
use crate::lending::{CoreLender, Loan};
use crate::sgemm::sgemm;
use crate::simd::Simd;
use crate::small_gemm;
use crate::tensor::{check_product_shapes, MatMut, MatRef, Tensor};
use rayon::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A norm backward's kernel on one block of rows: `(dy, xhat, rstd, residual, dx, dgamma,
/// dbeta, dx_sums)` (`residual`, `dbeta` and `dx_sums` empty when not wanted).
type NormBackwardKernel<'k> = dyn Fn(&[f32], &[f32], &[f32], &[f32], &mut [f32], &mut [f32], &mut [f32], &mut [f32])
    + Sync
    + 'k;

/// `work` on the threads of `loan`'s lent core and this one, or here without a loan.
fn on_loan<R: Send>(loan: &Option<Loan<'_>>, work: impl FnOnce() -> R + Send) -> R {
    match loan {
        Some(loan) => loan.run(work),
        None => work(),
    }
}

/// CPU backend. `threads` is the thread count per operation: a pipeline stage that owns
/// one core uses `threads = 1`; a stage (or an unpipelined run) with more cores uses more.
/// `simd` is the vector level of every kernel ([`Simd::selected`] unless set).
/// Only results computed with the same SIMD level are promised to be bit-identical.
#[derive(Clone)]
pub struct CpuBackend {
    threads: usize,
    simd: Simd,
    /// The threads of a multi-threaded backend (`None` with one thread, or if the pool could
    /// not be made: then rayon's global pool is used).
    pool: Option<Arc<rayon::ThreadPool>>,
    /// Cores that waiting ranks lend to this one's large products, large row-wise kernels and
    /// attention cores (single-threaded only).
    lender: Option<Arc<CoreLender>>,
    /// What ran on a lent core so far (shared by this backend's clones).
    borrowed: Arc<Borrowed>,
}

/// Counts of the work that ran on cores other ranks lent.
#[derive(Debug, Default)]
struct Borrowed {
    products: AtomicU64,
    /// Row-wise kernels and independent tasks (attention cores).
    row_work: AtomicU64,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl CpuBackend {
    /// One thread per operation: the configuration of a pipeline stage on one core and the
    /// default of the reference trainer (so their results can match bit for bit).
    pub fn single_thread() -> Self {
        CpuBackend::with_threads(1)
    }

    /// `threads` threads per operation (0 is treated as 1), at the selected SIMD level.
    pub fn with_threads(threads: usize) -> Self {
        let threads = threads.max(1);
        let pool = (threads > 1)
            .then(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("nobubble-cpu-{i}"))
                    .build()
                    .ok()
            })
            .flatten()
            .map(Arc::new);
        CpuBackend {
            threads,
            simd: Simd::selected(),
            pool,
            lender: None,
            borrowed: Arc::default(),
        }
    }

    /// The same backend, borrowing `lender`'s cores for its large products, large row-wise
    /// kernels and attention cores while it has one thread.
    pub fn with_lender(self, lender: Option<Arc<CoreLender>>) -> Self {
        CpuBackend { lender, ..self }
    }

    /// The same backend at another SIMD level; an error if this CPU lacks it.
    pub fn with_simd(self, simd: Simd) -> Result<Self> {
        Ok(CpuBackend {
            simd: simd.require()?,
            ..self
        })
    }

    /// Products that ran on a core another rank lent ([`CpuBackend::with_lender`]) so far.
    pub fn borrowed_products(&self) -> u64 {
        self.borrowed.products.load(Ordering::Relaxed)
    }

    /// Row-wise kernels and attention cores that ran on a lent core so far.
    pub fn borrowed_row_work(&self) -> u64 {
        self.borrowed.row_work.load(Ordering::Relaxed)
    }

    /// The configured thread count.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The SIMD level of every kernel this backend runs.
    pub fn simd(&self) -> Simd {
        self.simd
    }

    /// A row-wise norm's forward, `kernel(x, y, xhat, rstd)` on all rows or, with several
    /// threads, on row groups in parallel (rows are independent: the same bits).
    fn norm_forward_rows(
        &self,
        x: &Tensor,
        kernel: impl Fn(&[f32], &mut [f32], &mut [f32], &mut [f32]) + Sync,
    ) -> NormForward {
        let mut y = Tensor::for_overwrite(x.shape());
        let mut xhat = Tensor::for_overwrite(x.shape());
        let mut rstd = vec![0.0f32; x.rows()];
        let h = x.cols();
        let (rows, loan) = self.row_groups(x.rows(), h);
        if rows >= x.rows() {
            kernel(x.data(), y.data_mut(), xhat.data_mut(), &mut rstd);
            return NormForward { y, xhat, rstd };
        }
        on_loan(&loan, || {
            (y.data_mut().par_chunks_mut(rows * h))
                .zip(xhat.data_mut().par_chunks_mut(rows * h))
                .zip(rstd.par_chunks_mut(rows))
                .zip(x.data().par_chunks(rows * h))
                .for_each(|(((y, xhat), rstd), x)| kernel(x, y, xhat, rstd))
        });
        NormForward { y, xhat, rstd }
    }

    /// [`Self::norm_forward_rows`] of a residual stream `x` that the kernel also writes
    /// (`kernel(x, y, xhat, rstd)`, adding a bias to it).
    fn norm_forward_rows_mut(
        &self,
        x: &mut Tensor,
        bias: &[f32],
        kernel: impl Fn(&mut [f32], &mut [f32], &mut [f32], &mut [f32]) + Sync,
    ) -> NormForward {
        let h = x.cols();
        assert!(
            bias.is_empty() || bias.len() == h,
            "one bias value per column"
        );
        let mut y = Tensor::for_overwrite(x.shape());
        let mut xhat = Tensor::for_overwrite(x.shape());
        let mut rstd = vec![0.0f32; x.rows()];
        let (rows, loan) = self.row_groups(x.rows(), h);
        if rows >= x.rows() {
            kernel(x.data_mut(), y.data_mut(), xhat.data_mut(), &mut rstd);
            return NormForward { y, xhat, rstd };
        }
        on_loan(&loan, || {
            (y.data_mut().par_chunks_mut(rows * h))
                .zip(xhat.data_mut().par_chunks_mut(rows * h))
                .zip(rstd.par_chunks_mut(rows))
                .zip(x.data_mut().par_chunks_mut(rows * h))
                .for_each(|(((y, xhat), rstd), x)| kernel(x, y, xhat, rstd))
        });
        NormForward { y, xhat, rstd }
    }

    /// A row-wise norm's backward, `kernel(rows, dx, dgamma, dbeta, dx_sums)` (`dbeta` empty
    /// without β, `dx_sums` empty unless `extras` asks for them), over
    /// [`Self::row_block_sums`]' blocks: each block writes its rows of `dx` and its partial
    /// sums.
    fn norm_backward_rows(
        &self,
        dy: &Tensor,
        xhat: &Tensor,
        rstd: &[f32],
        with_beta: bool,
        extras: NormGradExtras<'_>,
        kernel: &NormBackwardKernel<'_>,
    ) -> NormBackward {
        assert_eq!(dy.shape(), xhat.shape());
        assert_eq!(rstd.len(), dy.rows());
        let residual = extras.residual.map_or(&[][..], |r| {
            assert_eq!(
                r.shape(),
                dy.shape(),
                "the residual gradient has dy's shape"
            );
            r.data()
        });
        let (n, h) = (dy.rows(), dy.cols());
        let beta_len = if with_beta { h } else { 0 };
        let sums_len = if extras.column_sums { h } else { 0 };
        let mut dx = Tensor::for_overwrite(dy.shape());
        let dx_blocks = dx.data_mut().chunks_mut(SUM_ROWS * h.max(1)).collect();
        // Partial sums per block: [dγ | dβ | Σ dx].
        let mut sums = vec![0.0f32; h + beta_len + sums_len];
        self.row_block_sums(n, h, &mut sums, dx_blocks, |rows, dx, part| {
            let span = rows.start * h..rows.end * h;
            let (g, rest) = part.split_at_mut(h);
            let (b, dx_sums) = rest.split_at_mut(beta_len);
            let (dy, xhat) = (&dy.data()[span.clone()], &xhat.data()[span.clone()]);
            let residual = residual.get(span).unwrap_or_default();
            kernel(dy, xhat, &rstd[rows], residual, dx, g, b, dx_sums);
        });
        let dx_column_sums = sums.split_off(h + beta_len);
        let dbeta = sums.split_off(h);
        NormBackward {
            dx,
            dgamma: sums,
            dbeta,
            dx_column_sums,
        }
    }

    /// A sum over the `rows` rows of a `rows × cols` tensor, in fixed blocks of [`SUM_ROWS`]
    /// rows: `block(rows, out, partial)` writes block `rows`' partial sums (`sums.len()`
    /// floats, from zero) and whatever else it computes into `out` (one item per block);
    /// then the partials are added into `sums` in block order. The blocks are fixed, not the
    /// threads', so the sums have the same bits on any thread count; with several threads the
    /// blocks run in parallel, in one pass over the data. Nothing runs without rows or sums.
    fn row_block_sums<T: Send>(
        &self,
        rows: usize,
        cols: usize,
        sums: &mut [f32],
        outs: Vec<T>,
        block: impl Fn(std::ops::Range<usize>, T, &mut [f32]) + Sync,
    ) {
        if rows == 0 || sums.is_empty() {
            return;
        }
        let blocks = rows.div_ceil(SUM_ROWS);
        assert_eq!(outs.len(), blocks, "one item per block of rows");
        let width = sums.len();
        let mut partials = vec![0.0f32; blocks * width];
        let run = |(r, (out, part)): (usize, (T, &mut [f32]))| {
            block(r * SUM_ROWS..(r * SUM_ROWS + SUM_ROWS).min(rows), out, part)
        };
        let parts = partials.chunks_mut(width);
        let (group, loan) = self.row_groups(rows, cols);
        if group >= rows {
            outs.into_iter().zip(parts).enumerate().for_each(run);
        } else {
            let threads = if loan.is_some() { 2 } else { self.threads };
            let parts: Vec<&mut [f32]> = parts.collect();
            on_loan(&loan, || {
                (outs.into_par_iter().zip(parts))
                    .enumerate()
                    .with_min_len(blocks.div_ceil(threads))
                    .for_each(run)
            });
        }
        for part in partials.chunks_exact(width) {
            kernels::add(self.simd, sums, part);
        }
    }

    /// `kernel(src rows, dst rows)` over `src` and `dst` in groups of whole rows, in parallel
    /// with several threads (`bias`: one value per column, or empty). `dst`'s rows lie
    /// `stride` apart: `src.cols()`, or more for padded rows ([`Tensor::row_stride`]), which
    /// the kernel then gets one at a time, without their padding.
    fn by_row_groups(
        &self,
        src: &Tensor,
        bias: &[f32],
        dst: &mut [f32],
        stride: usize,
        kernel: impl Fn(&[f32], &mut [f32]) + Sync,
    ) {
        let (rows, cols) = (src.rows(), src.cols());
        assert!(
            bias.is_empty() || bias.len() == cols,
            "one bias value per column"
        );
        assert_eq!(dst.len(), rows * stride, "dst holds src's rows");
        if src.is_empty() {
            return;
        }
        let run = |dst: &mut [f32], src: &[f32]| {
            if stride == cols {
                return kernel(src, dst);
            }
            for (d, s) in dst.chunks_mut(stride).zip(src.chunks_exact(cols)) {
                kernel(s, &mut d[..cols]);
            }
        };
        let (group, loan) = self.row_groups(rows, cols);
        if group >= rows {
            return run(dst, src.data());
        }
        on_loan(&loan, || {
            (dst.par_chunks_mut(group * stride))
                .zip(src.data().par_chunks(group * cols))
                .for_each(|(d, s)| run(d, s))
        });
    }

    /// A borrowed core for a product of `mnk` multiply-adds, if it is large enough to gain
    /// from a second thread and a waiting rank offers one.
    fn large_product_loan(&self, mnk: usize) -> Option<Loan<'_>> {
        self.loan(mnk >= 1 << 25, &self.borrowed.products)
    }

    /// Rows per group of row-wise work over `rows × cols`, and the core a waiting rank lends
    /// for it: two groups on a lent core if the work is large enough for two threads to gain
    /// (a quarter of a million floats: a few hundred microseconds), else
    /// [`Self::rows_per_group`]'s. Rows are independent, so the bits do not change.
    fn row_groups(&self, rows: usize, cols: usize) -> (usize, Option<Loan<'_>>) {
        let loan = (rows > 1)
            .then(|| self.loan(rows * cols >= 1 << 18, &self.borrowed.row_work))
            .flatten();
        match loan {
            Some(_) => (rows.div_ceil(2), loan),
            None => (self.rows_per_group(rows, cols), None),
        }
    }

    /// A core a waiting rank offers, for `large` enough work on a single-threaded backend,
    /// counted in `count`.
    fn loan(&self, large: bool, count: &AtomicU64) -> Option<Loan<'_>> {
        if self.threads > 1 || !large {
            return None;
        }
        let loan = self.lender.as_ref()?.borrow()?;
        count.fetch_add(1, Ordering::Relaxed);
        Some(loan)
    }

    /// Rows per thread for a row-wise kernel over `rows × cols`: all rows (one group, on
    /// the caller's thread) when single-threaded or too small to be worth a split.
    fn rows_per_group(&self, rows: usize, cols: usize) -> usize {
        const MIN_ELEMENTS: usize = 32 * 1024;
        let elements = rows * cols;
        if self.threads <= 1 || elements < 2 * MIN_ELEMENTS {
            return rows.max(1);
        }
        rows.div_ceil((elements / MIN_ELEMENTS).clamp(1, self.threads))
    }
}

impl Backend for CpuBackend {
    fn describe(&self) -> String {
        format!("cpu(threads={}, simd={})", self.threads, self.simd)
    }

    fn threads(&self) -> usize {
        self.threads
    }

    fn as_dyn(&self) -> &dyn Backend {
        self
    }

    fn install(&self, work: &mut (dyn FnMut() + Send)) {
        match &self.pool {
            Some(pool) => pool.install(work),
            None => work(),
        }
    }

    /// With one thread, on two when a waiting rank lends a core (the attention core's
    /// sequences: a tenth of a block's passes).
    fn run_tasks(&self, tasks: Vec<Task<'_>>) {
        // No size threshold: the tasks are a pass's whole attention core (milliseconds at
        // the sizes pipelines train; a tiny model's loan costs a lock and a wake-up).
        let loan = (self.threads <= 1 && tasks.len() > 1)
            .then(|| self.loan(true, &self.borrowed.row_work))
            .flatten();
        if (self.threads <= 1 && loan.is_none()) || tasks.len() <= 1 {
            for task in tasks {
                task(self);
            }
            return;
        }
        // At most one contiguous group per thread; inside a task everything is
        // single-threaded.
        let single = CpuBackend {
            threads: 1,
            simd: self.simd,
            pool: None,
            lender: None,
            borrowed: self.borrowed.clone(),
        };
        let threads = if loan.is_some() { 2 } else { self.threads };
        let per_group = tasks.len().div_ceil(threads);
        on_loan(&loan, || {
            tasks
                .into_par_iter()
                .with_min_len(per_group)
                .for_each(|task| task(&single))
        });
    }

    fn matmul(&self, dst: MatMut<'_>, a: MatRef<'_>, b: MatRef<'_>, scale: f32, accumulate: bool) {
        check_product_shapes(&dst, &a, &b);
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
        let loan = self.large_product_loan(m * n * k);
        let threads = if loan.is_some() { 2 } else { self.threads };
        // SAFETY: the views were bounds-checked at construction (every addressed
        // element lies inside its slice), strides are non-negative, and `dst` is a
        // unique borrow, so gemm writes only to memory we own exclusively.
        let mut product = move || unsafe {
            sgemm(
                self.simd,
                threads,
                (m, n, k),
                (
                    dst.data.as_mut_ptr().add(dst.offset),
                    dst.col_stride,
                    dst.row_stride,
                ),
                accumulate,
                (a.data.as_ptr().add(a.offset), a.col_stride, a.row_stride),
                (b.data.as_ptr().add(b.offset), b.col_stride, b.row_stride),
                scale,
            );
        };
        match &loan {
            Some(loan) => loan.run(product),
            None => product(),
        }
    }

    fn small_matmul(
        &self,
        dst: MatMut<'_>,
        a: MatRef<'_>,
        b: MatRef<'_>,
        scale: f32,
        accumulate: bool,
    ) {
        small_gemm::small_matmul(self.simd, dst, a, b, scale, accumulate);
    }

    fn pack(&self, src: MatRef<'_>, bias: &[f32], dst: &mut [f32], transpose: bool) {
        small_gemm::pack(self.simd, src, bias, dst, transpose);
    }

    fn add_row_vector(&self, x: &mut [f32], v: &[f32]) {
        if v.is_empty() {
            return;
        }
        assert!(
            x.len().is_multiple_of(v.len()),
            "whole rows of {} columns",
            v.len()
        );
        for row in x.chunks_exact_mut(v.len()) {
            kernels::add(self.simd, row, v);
        }
    }

    fn broadcast_rows(&self, v: &[f32], rows: usize) -> Tensor {
        let mut t = Tensor::for_overwrite(&[rows, v.len()]);
        let cols = v.len().max(1);
        let fill = |rows: &mut [f32]| {
            for row in rows.chunks_exact_mut(cols) {
                row.copy_from_slice(v);
            }
        };
        let group = self.rows_per_group(rows, cols) * cols;
        if group >= t.len() {
            fill(t.data_mut());
        } else {
            t.data_mut().par_chunks_mut(group).for_each(fill);
        }
        t
    }

    /// Over blocks of 64 rows (`SUM_ROWS`), each summed from zero and then added in block
    /// order: fixed blocks, so the same bits on any thread count, the blocks in parallel on
    /// several.
    fn accumulate_column_sums(&self, dst: &mut [f32], x: &Tensor) {
        let cols = x.cols();
        assert_eq!(cols, dst.len());
        let blocks = x.rows().div_ceil(SUM_ROWS);
        self.row_block_sums(x.rows(), cols, dst, vec![(); blocks], |rows, (), part| {
            let span = rows.start * cols..rows.end * cols;
            kernels::column_sums(self.simd, part, &x.data()[span]);
        });
    }

    fn column_sums_block(&self, dst: &mut [f32], x: &[f32]) {
        kernels::column_sums(self.simd, dst, x);
    }

    fn add_assign(&self, dst: &mut [f32], src: &[f32]) {
        assert_eq!(dst.len(), src.len());
        let add = |dst: &mut [f32], src: &[f32]| kernels::add(self.simd, dst, src);
        let chunk = self.rows_per_group(dst.len(), 1);
        if chunk >= dst.len() {
            return add(dst, src);
        }
        dst.par_chunks_mut(chunk)
            .zip(src.par_chunks(chunk))
            .for_each(|(d, s)| add(d, s));
    }

    fn layernorm_forward(&self, x: &Tensor, gamma: &[f32], beta: &[f32], eps: f32) -> NormForward {
        assert!(gamma.len() == x.cols() && beta.len() == x.cols());
        self.norm_forward_rows(x, |x, y, xhat, rstd| {
            kernels::layernorm_forward(self.simd, x, gamma, beta, eps, y, xhat, rstd)
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
        assert_eq!(gamma.len(), dy.cols());
        let simd = self.simd;
        self.norm_backward_rows(
            dy,
            xhat,
            rstd,
            true,
            extras,
            &|dy, xhat, rstd, res, dx, dg, db, sums| {
                kernels::layernorm_backward(simd, dy, xhat, rstd, gamma, res, dx, dg, db, sums)
            },
        )
    }

    fn layernorm_forward_then_bias(
        &self,
        x: &mut Tensor,
        gamma: &[f32],
        beta: &[f32],
        eps: f32,
        bias: &[f32],
    ) -> NormForward {
        assert!(gamma.len() == x.cols() && beta.len() == x.cols());
        self.norm_forward_rows_mut(x, bias, |x, y, xhat, rstd| {
            kernels::layernorm_forward_then_bias(
                self.simd, x, gamma, beta, eps, bias, y, xhat, rstd,
            )
        })
    }

    fn rmsnorm_forward_then_bias(
        &self,
        x: &mut Tensor,
        gamma: &[f32],
        eps: f32,
        bias: &[f32],
    ) -> NormForward {
        assert_eq!(gamma.len(), x.cols());
        self.norm_forward_rows_mut(x, bias, |x, y, xhat, rstd| {
            kernels::rmsnorm_forward_then_bias(self.simd, x, gamma, eps, bias, y, xhat, rstd)
        })
    }

    fn rmsnorm_forward(&self, x: &Tensor, gamma: &[f32], eps: f32) -> NormForward {
        assert_eq!(gamma.len(), x.cols());
        self.norm_forward_rows(x, |x, y, xhat, rstd| {
            kernels::rmsnorm_forward(self.simd, x, gamma, eps, y, xhat, rstd)
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
        assert_eq!(gamma.len(), dy.cols());
        let simd = self.simd;
        self.norm_backward_rows(
            dy,
            xhat,
            rstd,
            false,
            extras,
            &|dy, xhat, rstd, res, dx, dg, _, sums| {
                kernels::rmsnorm_backward(simd, dy, xhat, rstd, gamma, res, dx, dg, sums)
            },
        )
    }

    fn swiglu_forward(&self, u: &Tensor) -> Tensor {
        let f = u.cols() / 2;
        assert_eq!(
            u.cols(),
            2 * f,
            "SwiGLU input is [gate | up]: an even width"
        );
        let mut y = Tensor::for_overwrite(&[u.rows(), f]);
        let rows = self.rows_per_group(u.rows(), u.cols());
        if rows >= u.rows() {
            kernels::swiglu_forward(self.simd, u.data(), f, y.data_mut());
            return y;
        }
        (y.data_mut().par_chunks_mut(rows * f))
            .zip(u.data().par_chunks(rows * 2 * f))
            .for_each(|(y, u)| kernels::swiglu_forward(self.simd, u, f, y));
        y
    }

    fn swiglu_backward(&self, u: &Tensor, dy: &Tensor) -> Tensor {
        let f = dy.cols();
        assert_eq!((u.rows(), u.cols()), (dy.rows(), 2 * f));
        let mut du = Tensor::for_overwrite(u.shape());
        let rows = self.rows_per_group(u.rows(), u.cols());
        if rows >= u.rows() {
            kernels::swiglu_backward(self.simd, u.data(), f, dy.data(), du.data_mut());
            return du;
        }
        (du.data_mut().par_chunks_mut(rows * 2 * f))
            .zip(u.data().par_chunks(rows * 2 * f))
            .zip(dy.data().par_chunks(rows * f))
            .for_each(|((du, u), dy)| kernels::swiglu_backward(self.simd, u, f, dy, du));
        du
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
        let shape = kernels::RopeShape {
            heads,
            head_dim,
            seq_len,
        };
        let cols = x.cols();
        assert!(heads * head_dim <= cols && head_dim.is_multiple_of(2));
        assert!(cos.len() >= seq_len * head_dim / 2 && sin.len() == cos.len());
        let rows = self.rows_per_group(x.rows(), heads * head_dim);
        if rows >= x.rows() {
            return kernels::rope(self.simd, x.data_mut(), cols, 0, shape, cos, sin, inverse);
        }
        (x.data_mut().par_chunks_mut(rows * cols))
            .enumerate()
            .for_each(|(g, x)| {
                kernels::rope(self.simd, x, cols, g * rows, shape, cos, sin, inverse)
            });
    }

    /// The output's rows are padded where their length would alias in L1 (fc2's weight
    /// gradient reads it; [`Tensor::for_overwrite_padded`]).
    fn gelu_forward(&self, u: &Tensor, bias: &[f32]) -> Tensor {
        let mut y = Tensor::for_overwrite_padded(u.rows(), u.cols());
        let stride = y.row_stride();
        self.by_row_groups(u, bias, y.storage_mut(), stride, |u, y| {
            kernels::gelu_forward(self.simd, u, bias, y)
        });
        y
    }

    /// With a bias gradient: per block of [`SUM_ROWS`] rows, the kernel and then that
    /// block's column sums, as [`Backend::accumulate_column_sums`] sums them.
    /// `dy` may have padded rows (fc2's input gradient does: fc1's W reads it).
    fn gelu_backward(&self, u: &Tensor, bias: &[f32], dy: &mut Tensor, bias_grad: &mut [f32]) {
        assert_eq!(u.shape(), dy.shape());
        let (rows, cols, stride) = (dy.rows(), dy.cols(), dy.row_stride());
        if bias_grad.is_empty() {
            return self.by_row_groups(u, bias, dy.storage_mut(), stride, |u, dy| {
                kernels::gelu_backward(self.simd, u, bias, dy)
            });
        }
        assert!(
            bias.len() == cols && bias_grad.len() == cols,
            "one bias per column"
        );
        // Row by row, each row's sums right after its kernel: the column sums add rows in
        // order, so this has the bits of the kernel over the block and then its sums.
        let blocks = dy
            .storage_mut()
            .chunks_mut(SUM_ROWS * stride.max(1))
            .collect();
        self.row_block_sums(rows, cols, bias_grad, blocks, |rows, du, part| {
            let u = &u.data()[rows.start * cols..rows.end * cols];
            for (du, u) in du
                .chunks_mut(stride.max(1))
                .zip(u.chunks_exact(cols.max(1)))
            {
                let du = &mut du[..cols];
                kernels::gelu_backward(self.simd, u, bias, du);
                kernels::column_sums(self.simd, part, du);
            }
        });
    }

    fn causal_softmax(&self, scores: &mut [f32], n: usize, first: usize) {
        kernels::causal_softmax(self.simd, scores, n, first);
    }

    fn causal_softmax_backward(&self, p: &[f32], dp: &mut [f32], n: usize) {
        kernels::causal_softmax_backward(self.simd, p, dp, n);
    }

    fn softmax_row(&self, row: &mut [f32]) {
        let cols = row.len();
        kernels::softmax_rows(self.simd, row, cols, &mut [0.0], &mut [0.0]);
    }

    fn cross_entropy_forward(&self, logits: &Tensor, targets: &[u32]) -> (f32, Tensor) {
        let (rows, v) = (logits.rows(), logits.cols());
        assert_eq!(rows, targets.len());
        let mut probs = logits.clone();
        let mut maxes = vec![0.0f32; rows];
        let mut sums = vec![0.0f32; rows];
        let chunk = self.rows_per_group(rows, v);
        if chunk >= rows {
            kernels::softmax_rows(self.simd, probs.data_mut(), v, &mut maxes, &mut sums);
        } else {
            (probs.data_mut().par_chunks_mut(chunk * v))
                .zip(maxes.par_chunks_mut(chunk))
                .zip(sums.par_chunks_mut(chunk))
                .for_each(|((p, m), s)| kernels::softmax_rows(self.simd, p, v, m, s));
        }
        let mut total = 0.0f64;
        for (r, &t) in targets.iter().enumerate() {
            let target_logit = logits.data()[r * v + t as usize];
            total += (sums[r].ln() + maxes[r] - target_logit) as f64;
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
        pos: Option<&Tensor>,
        tokens: &[u32],
        seq_len: usize,
    ) -> Tensor {
        let h = tok.cols();
        let mut x = Tensor::for_overwrite(&[tokens.len(), h]);
        for (r, (row, &t)) in x.data_mut().chunks_exact_mut(h).zip(tokens).enumerate() {
            let te = &tok.data()[t as usize * h..(t as usize + 1) * h];
            match pos {
                Some(pos) => {
                    let p = r % seq_len;
                    let pe = &pos.data()[p * h..(p + 1) * h];
                    for j in 0..h {
                        row[j] = te[j] + pe[j];
                    }
                }
                None => row.copy_from_slice(te),
            }
        }
        x
    }

    fn embedding_backward(
        &self,
        dtok: &mut Tensor,
        mut dpos: Option<&mut Tensor>,
        tokens: &[u32],
        dy: &Tensor,
        seq_len: usize,
    ) {
        let h = dy.cols();
        for (r, (row, &t)) in dy.data().chunks_exact(h).zip(tokens).enumerate() {
            let t = t as usize;
            self.add_assign(&mut dtok.data_mut()[t * h..(t + 1) * h], row);
            if let Some(dpos) = dpos.as_deref_mut() {
                let p = r % seq_len;
                self.add_assign(&mut dpos.data_mut()[p * h..(p + 1) * h], row);
            }
        }
    }
}

#[cfg(test)]
#[path = "cpu_tests.rs"]
mod tests;
