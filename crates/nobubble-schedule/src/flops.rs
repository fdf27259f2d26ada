//! The paper's FLOP and activation model of a transformer (REFERENCE §1), in one place: the
//! forecast, the layer-split estimates of a real run, the MFU figure and the paper's table
//! all price a block with these formulas, so they can never disagree.

/// FLOPs of one transformer block's F, I and W passes on a microbatch of `microbatch_size`
/// sequences of `seq_len` tokens: F = sbh(24h + 4s), I = sbh(24h + 8s), W = 24sbh² (the
/// matrix products, plus attention's scores in F and I).
pub fn block_pass_flops(hidden: usize, seq_len: usize, microbatch_size: usize) -> [f64; 3] {
    BlockShape::gpt(hidden, seq_len, microbatch_size).pass_flops()
}

/// What the FLOP count of a block depends on, for GPT blocks (4h GELU MLP, a K/V per head)
/// and Llama blocks (grouped-query attention, a gated SwiGLU MLP) alike.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockShape {
    /// Hidden size h.
    pub hidden: usize,
    /// Query heads a.
    pub heads: usize,
    /// Key/value heads (`heads` without grouped-query attention).
    pub kv_heads: usize,
    /// Width f of the MLP's hidden layer.
    pub ffn_hidden: usize,
    /// A gated MLP (SwiGLU: three h×f products instead of two).
    pub gated: bool,
    /// Sequence length s.
    pub seq_len: usize,
    /// Sequences per microbatch b.
    pub microbatch_size: usize,
}

impl BlockShape {
    /// A GPT block: `heads` does not change its FLOPs, so one is assumed.
    pub fn gpt(hidden: usize, seq_len: usize, microbatch_size: usize) -> Self {
        BlockShape {
            hidden,
            heads: 1,
            kv_heads: 1,
            ffn_hidden: 4 * hidden,
            gated: false,
            seq_len,
            microbatch_size,
        }
    }

    /// F, I, W FLOPs: each pass does the block's matrix products once (F: y = x·W, I:
    /// dx = dy·Wᵀ, W: dW = xᵀ·dy), F adds attention's two s×s products, I their four.
    pub fn pass_flops(&self) -> [f64; 3] {
        let (h, s, b) = (
            self.hidden as f64,
            self.seq_len as f64,
            self.microbatch_size as f64,
        );
        let d = h / self.heads.max(1) as f64;
        let (a, kv, f) = (
            self.heads as f64,
            self.kv_heads as f64,
            self.ffn_hidden as f64,
        );
        let mlp = if self.gated { 6.0 * h * f } else { 4.0 * h * f };
        // Per token: QKV, output projection, MLP.
        let products = s * b * (2.0 * h * (a + 2.0 * kv) * d + 2.0 * h * a * d + mlp);
        let [af, ai, aw] = self.attention_pass_flops();
        [products + af, products + ai, products + aw]
    }

    /// The part of [`Self::pass_flops`] in attention's `s × s` products (scores and context):
    /// F's two, I's four, none in W, each over the whole square (a causal kernel that skips
    /// the blocks above the diagonal executes less).
    pub fn attention_pass_flops(&self) -> [f64; 3] {
        let (s, b) = (self.seq_len as f64, self.microbatch_size as f64);
        // a·d = h for every head layout.
        let square = s * b * s * self.hidden as f64;
        [4.0 * square, 8.0 * square, 0.0]
    }
}

/// Activation memory one block holds per microbatch after F (M_B) and from I until W (M_W),
/// in bytes with `bytes_per_value` bytes per stored number: the paper's 34h + 5as and 32h
/// bytes per token are for 16-bit values.
pub fn block_activation_bytes(
    hidden: usize,
    heads: usize,
    seq_len: usize,
    microbatch_size: usize,
    bytes_per_value: f64,
) -> (f64, f64) {
    let (h, a, s) = (hidden as f64, heads as f64, seq_len as f64);
    let tokens = s * microbatch_size as f64;
    let scale = bytes_per_value / 2.0;
    (
        scale * tokens * (34.0 * h + 5.0 * a * s),
        scale * tokens * 32.0 * h,
    )
}

/// FLOPs of one pass (F, I or W alike) of the LM head's projection onto `vocab` tokens.
pub fn head_pass_flops(hidden: usize, vocab: usize, seq_len: usize, microbatch_size: usize) -> f64 {
    2.0 * (seq_len * microbatch_size) as f64 * hidden as f64 * vocab as f64
}

/// Activation memory the LM head and its loss hold per microbatch after F (M_B) and from I
/// until W (M_W): the final LayerNorm's input and output (`bytes_per_value` each per hidden
/// value) and the softmax the cross-entropy's backward reads (fp32, 4 bytes per vocabulary
/// entry); after I only the projection's input is left for its weight gradient.
pub fn head_activation_bytes(
    hidden: usize,
    vocab: usize,
    seq_len: usize,
    microbatch_size: usize,
    bytes_per_value: f64,
) -> (f64, f64) {
    let tokens = (seq_len * microbatch_size) as f64;
    let h = hidden as f64 * bytes_per_value;
    (tokens * (2.0 * h + 4.0 * vocab as f64), tokens * h)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// F + I + W of a block is 72sbh² + 12s²bh: three times the forward's matrix products
    /// (24sbh²) and attention's scores, as the paper counts them.
    #[test]
    fn a_blocks_passes_add_up_to_the_papers_total() {
        let (h, s, b) = (1024usize, 2048usize, 2usize);
        let [f, i, w] = block_pass_flops(h, s, b);
        let (hf, sf, bf) = (h as f64, s as f64, b as f64);
        assert_eq!(
            f + i + w,
            72.0 * sf * bf * hf * hf + 12.0 * sf * sf * bf * hf
        );
        let (mb, mw) = block_activation_bytes(h, 16, s, b, 2.0);
        assert_eq!(mb, sf * bf * (34.0 * hf + 5.0 * 16.0 * sf));
        assert_eq!(mw, sf * bf * 32.0 * hf);
        assert_eq!(block_activation_bytes(h, 16, s, b, 4.0).0, 2.0 * mb);
    }

    /// A Llama block with a per-head K/V and a SwiGLU of width f = 8h/3 does what a GPT
    /// block does (three h×f products = two h×4h ones); fewer K/V heads take 2h·d per token
    /// and pass off the QKV product for each one dropped.
    #[test]
    fn a_llama_block_counts_its_gated_mlp_and_shared_kv_heads() {
        let (h, s, b) = (768usize, 512usize, 2usize);
        let gpt = BlockShape::gpt(h, s, b).pass_flops();
        let llama = BlockShape {
            heads: 12,
            kv_heads: 12,
            ffn_hidden: 8 * h / 3,
            gated: true,
            ..BlockShape::gpt(h, s, b)
        };
        assert_eq!(llama.pass_flops(), gpt);
        let gqa = BlockShape {
            kv_heads: 4,
            ..llama
        }
        .pass_flops();
        let saved = (s * b) as f64 * 2.0 * h as f64 * 2.0 * 8.0 * 64.0;
        for (full, fewer) in llama.pass_flops().iter().zip(gqa) {
            assert_eq!(full - fewer, saved);
        }
    }
}
