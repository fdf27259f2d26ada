//! Multi-head causal self-attention: fused QKV projection, per-head
//! `softmax(QKᵀ/√d + causal mask)·V`, output projection. For Llama blocks also rotary
//! positions on Q and K and grouped-query attention (several query heads share one K/V
//! head), without biases.
//!
//! F saves the fused QKV activations (rotated, without the QKV bias, which the core's packs
//! add) and the attention probabilities (the
//! `5·a·s` per-token term of the paper's M_B). The score/softmax core and the rotation have
//! no weights, so I frees both at once; only the two linears queue anything for W.

use super::{broadcast_bias, Linear, SplitLayer, INIT_STD};
use crate::backend::{Backend, Task, SUM_ROWS};
use crate::config::{Arch, GptConfig};
use crate::error::{MicrobatchId, NnError, Result};
use crate::memory::PassState;
use crate::param::Param;
use crate::tensor::{MatMut, MatRef, Tensor};
use std::iter;

/// Row-block size of the causal attention products: blocks strictly above the
/// diagonal are skipped (they are masked out anyway), which removes
/// (1 − (k+1)/(2k)) of the score and context work for k = ⌈s/16⌉ blocks.
const CAUSAL_BLOCK: usize = 16;

/// Row blocks `[r0, r1)` of a sequence of length `s`.
fn causal_blocks(s: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..s)
        .step_by(CAUSAL_BLOCK)
        .map(move |r0| (r0, (r0 + CAUSAL_BLOCK).min(s)))
}

/// The share of the full `s × s` score and context products that the causal blocks compute
/// (row block `[r0, r1)` against columns `[0, r1)`): what the kernels execute of the
/// paper's attention FLOPs, which count the whole square. 9/16 at s 128.
pub(crate) fn causal_work_fraction(s: usize) -> f64 {
    let done: usize = causal_blocks(s).map(|(r0, r1)| (r1 - r0) * r1).sum();
    done as f64 / (s * s).max(1) as f64
}

/// Rotary position tables: `cos` and `sin` of `pos · θ^(−2j/d)` for every position and
/// `j < d/2`, `[seq_len, d/2]`, computed in f32 as Hugging Face's Llama computes them.
#[derive(Debug)]
struct Rope {
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rope {
    fn new(theta: f32, head_dim: usize, seq_len: usize) -> Self {
        let half = head_dim / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|j| 1.0 / theta.powf((2 * j) as f32 / head_dim as f32))
            .collect();
        let angles = (0..seq_len).flat_map(|pos| inv_freq.iter().map(move |f| pos as f32 * f));
        let (cos, sin) = angles.map(|a| (a.cos(), a.sin())).unzip();
        Rope { cos, sin }
    }
}

/// One attention layer's keys and values of the positions decoded so far, rows of
/// `[kv_heads · d]` (rotated, for rotary positions): what incremental decoding keeps so that
/// each new token costs one row's work instead of the whole window's.
#[derive(Debug, Default, Clone)]
pub(crate) struct KvRows {
    keys: Vec<f32>,
    values: Vec<f32>,
}

/// Causal multi-head self-attention over sequences of a fixed length.
#[derive(Debug)]
pub struct CausalSelfAttention {
    /// Fused Q, K, V projection `[h, (a + 2·kv)·d]` (columns: all heads' Q, then the K/V
    /// heads' K, then their V).
    pub qkv: Linear,
    /// Output projection `[h, h]`.
    pub proj: Linear,
    heads: usize,
    kv_heads: usize,
    seq_len: usize,
    rope: Option<Rope>,
    /// Saved by F for I: (QKV activations `[n, (a + 2·kv)·d]` without the QKV bias,
    /// probabilities `[b, a, s, s]`).
    core: PassState<(Tensor, Tensor), ()>,
}

impl CausalSelfAttention {
    /// New attention layer named `name` for `config`'s blocks; `config.layers` scales the
    /// output projection's init (GPT-2's 1/√(2·layers) residual scaling).
    pub fn new(name: &str, config: &GptConfig, seed: u64) -> Self {
        let (hidden, heads, kv_heads) = (config.hidden, config.heads, config.kv_heads());
        assert!(
            heads > 0 && hidden.is_multiple_of(heads) && heads.is_multiple_of(kv_heads),
            "hidden must be divisible by heads, heads by kv_heads"
        );
        let d = hidden / heads;
        let llama = config.arch == Arch::Llama;
        let proj_std = INIT_STD / ((2 * config.layers.max(1)) as f32).sqrt();
        let qkv_width = (heads + 2 * kv_heads) * d;
        CausalSelfAttention {
            qkv: Linear::new(
                &format!("{name}.qkv"),
                hidden,
                qkv_width,
                !llama,
                INIT_STD,
                seed,
            ),
            proj: Linear::new(
                &format!("{name}.proj"),
                hidden,
                hidden,
                !llama,
                proj_std,
                seed,
            ),
            heads,
            kv_heads,
            seq_len: config.seq_len,
            rope: llama.then(|| Rope::new(config.rope_theta, d, config.seq_len)),
            core: PassState::new(format!("{name}.core")),
        }
    }

    fn hidden(&self) -> usize {
        self.proj.in_features()
    }

    fn head_dim(&self) -> usize {
        self.hidden() / self.heads
    }

    /// Width of a QKV row: the query heads, then K and V of the K/V heads.
    fn qkv_width(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim()
    }

    /// Column where Q, K or V (`which` = 0, 1, 2) of query head `head` starts in a QKV row.
    fn column(&self, head: usize, which: usize) -> usize {
        let d = self.head_dim();
        let kv_head = head / (self.heads / self.kv_heads);
        match which {
            0 => head * d,
            1 => (self.heads + kv_head) * d,
            _ => (self.heads + self.kv_heads + kv_head) * d,
        }
    }

    /// Q, K or V (`which` = 0, 1, 2) of head `head` in sequence `seq`: `[s, d]`, rows 3·h
    /// apart.
    fn head_rows<'a>(&self, qkv: &'a [f32], seq: usize, head: usize, which: usize) -> MatRef<'a> {
        let (w, s) = (self.qkv_width(), self.seq_len);
        let offset = seq * s * w + self.column(head, which);
        MatRef::new(qkv, offset, s, self.head_dim(), w as isize, 1)
    }

    /// The QKV projection's bias on the columns [`Self::head_rows`] views (empty: none).
    fn head_bias(&self, head: usize, which: usize) -> &[f32] {
        let bias = self.qkv.bias_values();
        if bias.is_empty() {
            return bias;
        }
        &bias[self.column(head, which)..][..self.head_dim()]
    }

    /// Rotates Q and K of every row by its position (`inverse`: back, for gradients).
    fn rotate(&self, be: &dyn Backend, qkv: &mut Tensor, inverse: bool) {
        if let Some(rope) = &self.rope {
            let heads = self.heads + self.kv_heads;
            let (d, s) = (self.head_dim(), self.seq_len);
            be.rope(qkv, heads, d, s, &rope.cos, &rope.sin, inverse);
        }
    }

    /// The output without the projection's bias ([`Self::output_bias`]) added onto `dst`
    /// (a block's residual stream, which has the bias already): inference, nothing saved.
    pub(crate) fn apply_onto(&self, be: &dyn Backend, x: &Tensor, dst: &mut Tensor) {
        let mut qkv = self.qkv.apply_unbiased(be, x);
        self.rotate(be, &mut qkv, false);
        let (ctx, _probs) = self.core_forward(be, &qkv);
        self.proj.apply_onto(be, &ctx, dst)
    }

    /// The output projection's bias, which the `…_onto` passes leave to the caller (empty:
    /// none).
    pub(crate) fn output_bias(&self) -> &[f32] {
        self.proj.bias_values()
    }

    /// F, its output without the projection's bias ([`Self::output_bias`]) added onto `dst`.
    pub(crate) fn forward_onto(
        &mut self,
        be: &dyn Backend,
        mb: MicrobatchId,
        x: Tensor,
        dst: &mut Tensor,
    ) -> Result<()> {
        if !x.rows().is_multiple_of(self.seq_len) {
            return Err(NnError::BadInput(format!(
                "attention `{}`: {} token rows are not a whole number of sequences of length {}",
                self.core.layer(),
                x.rows(),
                self.seq_len
            )));
        }
        self.core.check_forward(mb)?;
        self.proj.check_forward(mb)?;
        let mut qkv = self.qkv.forward_unbiased(be, mb, x)?;
        self.rotate(be, &mut qkv, false);
        let (ctx, probs) = self.core_forward(be, &qkv);
        self.core.save_forward(mb, (qkv, probs))?;
        self.proj.forward_onto(be, mb, ctx, dst)
    }

    /// One new token at position `pos` (`x`: its `[1, h]` normed input) against the keys and
    /// values of the earlier positions in `cache`, which it extends: incremental decoding.
    /// The same products and softmax as [`Self::apply_onto`] on one row, so the output
    /// matches the full window's row `pos` up to the rounding of the products' shorter sums;
    /// like it, without the projection's bias and added onto `dst` (the token's residual row).
    pub(crate) fn decode_onto(
        &self,
        be: &dyn Backend,
        x: &Tensor,
        pos: usize,
        cache: &mut KvRows,
        dst: &mut Tensor,
    ) {
        let (a, kv, d) = (self.heads, self.kv_heads, self.head_dim());
        // Biased with the same add as the core's packs of the window's Q, K and V, so cached
        // keys and values are theirs.
        let mut qkv = self.qkv.apply_unbiased(be, x);
        be.add_row_vector(qkv.data_mut(), self.qkv.bias_values());
        if let Some(rope) = &self.rope {
            // The tables' row `pos` as a one-position table: the kernel training runs.
            let half = d / 2;
            let (cos, sin) = (&rope.cos[pos * half..], &rope.sin[pos * half..]);
            be.rope(&mut qkv, a + kv, d, 1, cos, sin, false);
        }
        let row = qkv.data();
        let (k0, v0) = (self.column(0, 1), self.column(0, 2));
        cache.keys.extend_from_slice(&row[k0..v0]);
        cache.values.extend_from_slice(&row[v0..v0 + kv * d]);
        let n = pos + 1;
        debug_assert_eq!(cache.keys.len(), n * kv * d);
        let scale = 1.0 / (d as f32).sqrt();
        let mut ctx = Tensor::for_overwrite(&[1, a * d]);
        let mut scores = vec![0.0f32; n];
        for head in 0..a {
            let kv_head = head / (a / kv);
            // The scores as a column, keys · qᵀ: the window's score products, each summed
            // in the same order.
            let q_t = MatRef::new(row, head * d, d, 1, 1, 1);
            let keys = MatRef::new(&cache.keys, kv_head * d, n, d, (kv * d) as isize, 1);
            let column = MatMut::new(&mut scores, 0, n, 1, 1, 1);
            be.small_matmul(column, keys, q_t, scale, false);
            be.softmax_row(&mut scores);
            let p = MatRef::new(&scores, 0, 1, n, n as isize, 1);
            let values = MatRef::new(&cache.values, kv_head * d, n, d, (kv * d) as isize, 1);
            let out = MatMut::new(ctx.data_mut(), head * d, 1, d, (a * d) as isize, 1);
            be.small_matmul(out, p, values, 1.0, false);
        }
        self.proj.apply_onto(be, &ctx, dst)
    }

    /// Scores, causal softmax and context for the fused `qkv` rows of the projection without
    /// its bias: `(context, probabilities)`. Sequences are independent: one task each, run in
    /// parallel on a multi-threaded backend.
    ///
    /// `qkv` stays without its bias (and is saved so for the backward pass): the packs of a
    /// head's Q, K and V add it ([`Self::head_bias`]) while the packed copy is in L1, rather
    /// than the product accumulating onto a broadcast of it or a pass adding it to the whole
    /// `[n, (a + 2·kv)·d]` output. The bits are the broadcast's while `h` fits in one of
    /// `gemm`'s depth blocks (512 and more; one rounding of `bias + Σ` either way); beyond,
    /// the bias follows the blocks' partial sums instead of preceding them, which moves last
    /// bits (the same in every schedule and in the reference trainer, which run this code).
    /// Adding it after the rotation is right only because rotary models have no QKV bias
    /// (Llama blocks are built without, and Hugging Face models with one are refused).
    fn core_forward(&self, be: &dyn Backend, qkv: &Tensor) -> (Tensor, Tensor) {
        debug_assert!(
            self.qkv.bias_values().is_empty() || self.rope.is_none(),
            "a bias to add before rotating"
        );
        let (h, s, a, w) = (self.hidden(), self.seq_len, self.heads, self.qkv_width());
        let n = qkv.rows();
        let mut probs = Tensor::for_overwrite(&[n / s, a, s, s]);
        let mut ctx = Tensor::for_overwrite(&[n, h]);
        let tasks = probs
            .data_mut()
            .chunks_mut(a * s * s)
            .zip(ctx.data_mut().chunks_mut(s * h))
            .zip(qkv.data().chunks(s * w))
            .map(|((probs, ctx), rows)| -> Task<'_> {
                Box::new(move |be: &dyn Backend| self.sequence_forward(be, rows, probs, ctx))
            })
            .collect();
        be.run_tasks(tasks);
        (ctx, probs)
    }

    /// [`Self::core_forward`] of one sequence's QKV rows `[s, (a + 2·kv)·d]`: its
    /// probabilities `[a, s, s]` and its context rows `[s, h]`.
    fn sequence_forward(&self, be: &dyn Backend, qkv: &[f32], probs: &mut [f32], ctx: &mut [f32]) {
        let (h, s, a) = (self.hidden(), self.seq_len, self.heads);
        let d = h / a;
        let scale = 1.0 / (d as f32).sqrt();
        // A head's Q, Kᵀ and V, packed for the small products.
        let mut packed = Tensor::for_overwrite(&[3, s * d]);
        let (queries, rest) = packed.data_mut().split_at_mut(s * d);
        let (keys_t, values) = rest.split_at_mut(s * d);
        for head in 0..a {
            let block = &mut probs[head * s * s..][..s * s];
            be.pack(
                self.head_rows(qkv, 0, head, 0),
                self.head_bias(head, 0),
                queries,
                false,
            );
            // Query heads sharing a K/V head share its packed K and V.
            if self.first_of_group(head) {
                be.pack(
                    self.head_rows(qkv, 0, head, 1),
                    self.head_bias(head, 1),
                    keys_t,
                    true,
                );
                be.pack(
                    self.head_rows(qkv, 0, head, 2),
                    self.head_bias(head, 2),
                    values,
                    false,
                );
            }
            // Block by block of rows, while the block is in L1: scores only where the mask
            // lets them through (row block [r0, r1) needs columns [0, r1)), their softmax,
            // and the context rows.
            for (r0, r1) in causal_blocks(s) {
                let q_rows = packed_rows(queries, d, r0, r1);
                let k_t = MatRef::new(keys_t, 0, d, r1, s as isize, 1);
                let dst = MatMut::new(block, r0 * s, r1 - r0, r1, s as isize, 1);
                be.small_matmul(dst, q_rows, k_t, scale, false);
                be.causal_softmax(&mut block[r0 * s..r1 * s], s, r0);
                let p = MatRef::new(block, r0 * s, r1 - r0, r1, s as isize, 1);
                let v_rows = packed_rows(values, d, 0, r1);
                let out = MatMut::new(ctx, r0 * h + head * d, r1 - r0, d, h as isize, 1);
                be.small_matmul(out, p, v_rows, 1.0, false);
            }
        }
    }

    /// The QKV gradient of the core, and its column sums (the QKV bias gradient) if they were
    /// taken on the way. They are when the layer has a QKV bias (so no rotation follows) and
    /// sequences are whole blocks of [`SUM_ROWS`] rows: each sequence's task sums its blocks
    /// while its rows are in L2, and the blocks are added in order here — the bits of
    /// [`Backend::accumulate_column_sums`], without its pass over the `[n, (a + 2·kv)·d]`
    /// gradient.
    fn core_backward(
        &self,
        be: &dyn Backend,
        qkv: &Tensor,
        probs: &Tensor,
        dctx: &Tensor,
    ) -> (Tensor, Option<Vec<f32>>) {
        let (w, s) = (self.qkv_width(), self.seq_len);
        let n = qkv.rows();
        let mut dqkv = Tensor::for_overwrite(&[n, w]);
        let sums =
            !self.qkv.bias_values().is_empty() && self.rope.is_none() && s.is_multiple_of(SUM_ROWS);
        let blocks_per_seq = if sums { s / SUM_ROWS } else { 0 };
        // One chunk of block sums per sequence; without sums none, and each task gets an
        // empty one.
        let mut partials = vec![0.0f32; n / s * blocks_per_seq * w];
        let tasks = dqkv
            .data_mut()
            .chunks_mut(s * w)
            .zip(
                partials
                    .chunks_mut((blocks_per_seq * w).max(1))
                    .chain(iter::repeat_with(|| &mut [][..])),
            )
            .enumerate()
            .map(|(seq, (dqkv, partials))| -> Task<'_> {
                Box::new(move |be: &dyn Backend| {
                    self.sequence_backward(be, qkv, probs, dctx, seq, dqkv);
                    for (part, rows) in partials.chunks_mut(w).zip(dqkv.chunks(SUM_ROWS * w)) {
                        be.column_sums_block(part, rows);
                    }
                })
            })
            .collect();
        be.run_tasks(tasks);
        let dbias = sums.then(|| {
            let mut dbias = vec![0.0f32; w];
            for part in partials.chunks_exact(w) {
                be.add_assign(&mut dbias, part);
            }
            dbias
        });
        (dqkv, dbias)
    }

    /// [`Self::core_backward`] of sequence `seq`, into its rows `[s, (a + 2·kv)·d]` of the
    /// QKV gradient. Query heads sharing a K/V head add their dK and dV into it in head order.
    fn sequence_backward(
        &self,
        be: &dyn Backend,
        qkv: &Tensor,
        probs: &Tensor,
        dctx: &Tensor,
        seq: usize,
        dqkv: &mut [f32],
    ) {
        let (h, s, a) = (self.hidden(), self.seq_len, self.heads);
        let d = h / a;
        let scale = 1.0 / (d as f32).sqrt();
        let mut dscores_buf = Tensor::for_overwrite(&[s, s]);
        let dscores = dscores_buf.data_mut();
        // A head's dO, Vᵀ, K and Q, packed for the small products.
        let mut packed = Tensor::for_overwrite(&[4, s * d]);
        let (douts, rest) = packed.data_mut().split_at_mut(s * d);
        let (values_t, rest) = rest.split_at_mut(s * d);
        let (keys, queries) = rest.split_at_mut(s * d);
        let w = self.qkv_width();
        for head in 0..a {
            let pdata = &probs.data()[(seq * a + head) * s * s..][..s * s];
            let dout_rows = MatRef::new(dctx.data(), seq * s * h + head * d, s, d, h as isize, 1);
            be.pack(dout_rows, &[], douts, false);
            let rows = |which| self.head_rows(qkv.data(), seq, head, which);
            be.pack(rows(0), self.head_bias(head, 0), queries, false);
            // The first query head of a group packs the K/V head's K and Vᵀ and writes its
            // gradient; the others reuse the packing and add.
            let first = self.first_of_group(head);
            if first {
                be.pack(rows(2), self.head_bias(head, 2), values_t, true);
                be.pack(rows(1), self.head_bias(head, 1), keys, false);
            }
            let rs = w as isize;
            let dst = |which: usize, r0: usize| r0 * w + self.column(head, which);
            // dP = dO·Vᵀ on the causal part, then dS = P ⊙ (dP − rowsum(P ⊙ dP)).
            for (r0, r1) in causal_blocks(s) {
                let v_t = MatRef::new(values_t, 0, d, r1, s as isize, 1);
                let dp = MatMut::new(dscores, r0 * s, r1 - r0, r1, s as isize, 1);
                be.small_matmul(dp, packed_rows(douts, d, r0, r1), v_t, 1.0, false);
            }
            be.causal_softmax_backward(pdata, dscores, s);
            for (r0, r1) in causal_blocks(s) {
                // dQ[r0..r1] = scale · dS[r0..r1, 0..r1] · K[0..r1]
                let ds = MatRef::new(dscores, r0 * s, r1 - r0, r1, s as isize, 1);
                let k_rows = packed_rows(keys, d, 0, r1);
                let dq = MatMut::new(dqkv, dst(0, r0), r1 - r0, d, rs, 1);
                be.small_matmul(dq, ds, k_rows, scale, false);
                // Column block [r0, r1) of P and dS is non-zero only in rows r0..s.
                let p_cols = MatRef::new(pdata, r0 * s + r0, s - r0, r1 - r0, s as isize, 1);
                let ds_cols = MatRef::new(dscores, r0 * s + r0, s - r0, r1 - r0, s as isize, 1);
                // dV[r0..r1] = P[r0..s, r0..r1]ᵀ · dO[r0..s]
                let dout_rows = packed_rows(douts, d, r0, s);
                let dv = MatMut::new(dqkv, dst(2, r0), r1 - r0, d, rs, 1);
                be.small_matmul(dv, p_cols.t(), dout_rows, 1.0, !first);
                // dK[r0..r1] = scale · dS[r0..s, r0..r1]ᵀ · Q[r0..s]
                let q_rows = packed_rows(queries, d, r0, s);
                let dk = MatMut::new(dqkv, dst(1, r0), r1 - r0, d, rs, 1);
                be.small_matmul(dk, ds_cols.t(), q_rows, scale, !first);
            }
        }
    }

    /// I, with the output projection's bias gradient already summed by the caller (`dbias`,
    /// see [`Linear::backward_input_given`]) or summed here (`None`).
    pub(crate) fn backward_input_given(
        &mut self,
        be: &dyn Backend,
        mb: MicrobatchId,
        dy: Tensor,
        dbias: Option<Vec<f32>>,
    ) -> Result<Tensor> {
        self.core.check_input_grad(mb)?;
        self.qkv.check_input_grad(mb)?;
        let dctx = self.proj.backward_input_given(be, mb, dy, dbias)?;
        let (qkv, probs) = self.core.take_forward(mb)?;
        let (mut dqkv, dbias) = self.core_backward(be, &qkv, &probs, &dctx);
        drop((qkv, probs, dctx));
        self.rotate(be, &mut dqkv, true);
        self.qkv.backward_input_given(be, mb, dqkv, dbias)
    }

    /// Whether query head `head` is the first of the heads sharing its K/V head.
    fn first_of_group(&self, head: usize) -> bool {
        head.is_multiple_of(self.heads / self.kv_heads)
    }
}

/// Rows `r0..r1` of a head's operand packed `[s, d]`.
fn packed_rows(data: &[f32], d: usize, r0: usize, r1: usize) -> MatRef<'_> {
    MatRef::new(data, r0 * d, r1 - r0, d, d as isize, 1)
}

impl SplitLayer for CausalSelfAttention {
    fn forward(&mut self, be: &dyn Backend, mb: MicrobatchId, x: Tensor) -> Result<Tensor> {
        let mut y = broadcast_bias(be, self.output_bias(), x.rows(), self.hidden());
        self.forward_onto(be, mb, x, &mut y)?;
        Ok(y)
    }

    fn backward_input(&mut self, be: &dyn Backend, mb: MicrobatchId, dy: Tensor) -> Result<Tensor> {
        self.backward_input_given(be, mb, dy, None)
    }

    fn backward_weight(&mut self, be: &dyn Backend, mb: MicrobatchId) -> Result<()> {
        self.qkv.check_weight_grad(mb)?;
        self.proj.backward_weight(be, mb)?;
        self.qkv.backward_weight(be, mb)
    }

    fn check_forward(&self, mb: MicrobatchId) -> Result<()> {
        self.qkv.check_forward(mb)
    }

    fn check_input_grad(&self, mb: MicrobatchId) -> Result<()> {
        self.proj.check_input_grad(mb)
    }

    fn check_weight_grad(&self, mb: MicrobatchId) -> Result<()> {
        self.proj.check_weight_grad(mb)
    }

    fn held_bytes(&self, mb: MicrobatchId) -> usize {
        self.qkv.held_bytes(mb) + self.core.held_bytes(mb) + self.proj.held_bytes(mb)
    }

    fn discard(&mut self, mb: MicrobatchId) {
        self.qkv.discard(mb);
        self.core.discard(mb);
        self.proj.discard(mb);
    }

    fn params(&self) -> Vec<&Param> {
        let mut p = self.qkv.params();
        p.extend(self.proj.params());
        p
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut p = self.qkv.params_mut();
        p.extend(self.proj.params_mut());
        p
    }
}
