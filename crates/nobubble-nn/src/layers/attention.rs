//! Multi-head causal self-attention: fused QKV projection, per-head
//! `softmax(QKᵀ/√d + causal mask)·V`, output projection.
//!
//! F saves the fused QKV activations and the attention probabilities (the
//! `5·a·s` per-token term of the paper's M_B). The score/softmax core has no weights,
//! so I frees both at once; only the two linears queue anything for W.

use super::{Linear, SplitLayer, INIT_STD};
use crate::backend::Backend;
use crate::error::{MicrobatchId, NnError, Result};
use crate::memory::PassState;
use crate::param::Param;
use crate::tensor::{MatMut, MatRef, Tensor};

/// Causal multi-head self-attention over sequences of a fixed length.
#[derive(Debug)]
pub struct CausalSelfAttention {
    /// Fused Q, K, V projection `[h, 3h]` (columns: all heads' Q, then K, then V).
    pub qkv: Linear,
    /// Output projection `[h, h]`.
    pub proj: Linear,
    heads: usize,
    seq_len: usize,
    /// Saved by F for I: (QKV activations `[n, 3h]`, probabilities `[b, heads, s, s]`).
    core: PassState<(Tensor, Tensor), ()>,
}

impl CausalSelfAttention {
    /// New attention layer named `name`; `layers` scales the output projection's
    /// init (GPT-2's 1/√(2·layers) residual scaling).
    pub fn new(
        name: &str,
        hidden: usize,
        heads: usize,
        seq_len: usize,
        layers: usize,
        seed: u64,
    ) -> Self {
        assert!(
            heads > 0 && hidden % heads == 0,
            "hidden must be divisible by heads"
        );
        let proj_std = INIT_STD / ((2 * layers.max(1)) as f32).sqrt();
        CausalSelfAttention {
            qkv: Linear::new(
                &format!("{name}.qkv"),
                hidden,
                3 * hidden,
                true,
                INIT_STD,
                seed,
            ),
            proj: Linear::new(
                &format!("{name}.proj"),
                hidden,
                hidden,
                true,
                proj_std,
                seed,
            ),
            heads,
            seq_len,
            core: PassState::new(format!("{name}.core")),
        }
    }

    fn hidden(&self) -> usize {
        self.proj.in_features()
    }

    /// Views of Q, K or V (`which` = 0, 1, 2) of head `head` in sequence `seq`.
    fn head_view<'a>(&self, qkv: &'a [f32], seq: usize, head: usize, which: usize) -> MatRef<'a> {
        let (h, s) = (self.hidden(), self.seq_len);
        let d = h / self.heads;
        MatRef::new(
            qkv,
            seq * s * 3 * h + which * h + head * d,
            s,
            d,
            (3 * h) as isize,
            1,
        )
    }

    fn core_forward(&self, be: &dyn Backend, qkv: &Tensor) -> (Tensor, Tensor) {
        let (h, s, a) = (self.hidden(), self.seq_len, self.heads);
        let d = h / a;
        let n = qkv.rows();
        let b = n / s;
        let scale = 1.0 / (d as f32).sqrt();
        let mut probs = Tensor::zeros(&[b, a, s, s]);
        let mut ctx = Tensor::zeros(&[n, h]);
        for seq in 0..b {
            for head in 0..a {
                let q = self.head_view(qkv.data(), seq, head, 0);
                let k = self.head_view(qkv.data(), seq, head, 1);
                let v = self.head_view(qkv.data(), seq, head, 2);
                let block = &mut probs.data_mut()[(seq * a + head) * s * s..][..s * s];
                be.matmul(
                    MatMut::new(block, 0, s, s, s as isize, 1),
                    q,
                    k.t(),
                    scale,
                    false,
                );
                be.causal_softmax(block, s);
                let p = MatRef::new(block, 0, s, s, s as isize, 1);
                let out = MatMut::new(ctx.data_mut(), seq * s * h + head * d, s, d, h as isize, 1);
                be.matmul(out, p, v, 1.0, false);
            }
        }
        (ctx, probs)
    }

    fn core_backward(
        &self,
        be: &dyn Backend,
        qkv: &Tensor,
        probs: &Tensor,
        dctx: &Tensor,
    ) -> Tensor {
        let (h, s, a) = (self.hidden(), self.seq_len, self.heads);
        let d = h / a;
        let n = qkv.rows();
        let b = n / s;
        let scale = 1.0 / (d as f32).sqrt();
        let mut dqkv = Tensor::zeros(&[n, 3 * h]);
        let mut dscores = vec![0.0f32; s * s];
        for seq in 0..b {
            for head in 0..a {
                let q = self.head_view(qkv.data(), seq, head, 0);
                let k = self.head_view(qkv.data(), seq, head, 1);
                let v = self.head_view(qkv.data(), seq, head, 2);
                let pdata = &probs.data()[(seq * a + head) * s * s..][..s * s];
                let p = MatRef::new(pdata, 0, s, s, s as isize, 1);
                let dout = MatRef::new(dctx.data(), seq * s * h + head * d, s, d, h as isize, 1);
                let base = seq * s * 3 * h + head * d;
                let rs = (3 * h) as isize;
                // dV = Pᵀ·dO
                be.matmul(
                    MatMut::new(dqkv.data_mut(), base + 2 * h, s, d, rs, 1),
                    p.t(),
                    dout,
                    1.0,
                    false,
                );
                // dP = dO·Vᵀ, then dS = P ⊙ (dP − rowsum(P ⊙ dP))
                be.matmul(
                    MatMut::new(&mut dscores, 0, s, s, s as isize, 1),
                    dout,
                    v.t(),
                    1.0,
                    false,
                );
                be.softmax_backward(pdata, &mut dscores, s);
                let ds = MatRef::new(&dscores, 0, s, s, s as isize, 1);
                // dQ = scale·dS·K, dK = scale·dSᵀ·Q
                be.matmul(
                    MatMut::new(dqkv.data_mut(), base, s, d, rs, 1),
                    ds,
                    k,
                    scale,
                    false,
                );
                be.matmul(
                    MatMut::new(dqkv.data_mut(), base + h, s, d, rs, 1),
                    ds.t(),
                    q,
                    scale,
                    false,
                );
            }
        }
        dqkv
    }
}

impl SplitLayer for CausalSelfAttention {
    fn forward(&mut self, be: &dyn Backend, mb: MicrobatchId, x: Tensor) -> Result<Tensor> {
        if x.rows() % self.seq_len != 0 {
            return Err(NnError::BadInput(format!(
                "attention `{}`: {} token rows are not a whole number of sequences of length {}",
                self.core.layer(),
                x.rows(),
                self.seq_len
            )));
        }
        self.core.check_forward(mb)?;
        self.proj.check_forward(mb)?;
        let qkv = self.qkv.forward(be, mb, x)?;
        let (ctx, probs) = self.core_forward(be, &qkv);
        self.core.save_forward(mb, (qkv, probs))?;
        self.proj.forward(be, mb, ctx)
    }

    fn backward_input(&mut self, be: &dyn Backend, mb: MicrobatchId, dy: Tensor) -> Result<Tensor> {
        self.core.check_input_grad(mb)?;
        self.qkv.check_input_grad(mb)?;
        let dctx = self.proj.backward_input(be, mb, dy)?;
        let (qkv, probs) = self.core.take_forward(mb)?;
        let dqkv = self.core_backward(be, &qkv, &probs, &dctx);
        drop((qkv, probs, dctx));
        self.qkv.backward_input(be, mb, dqkv)
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
