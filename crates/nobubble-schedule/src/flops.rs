//! The paper's FLOP and activation model of a transformer (REFERENCE §1), in one place: the
//! forecast, the layer-split estimates of a real run, the MFU figure and the paper's table
//! all price a block with these formulas, so they can never disagree.

/// FLOPs of one transformer block's F, I and W passes on a microbatch of `microbatch_size`
/// sequences of `seq_len` tokens: F = sbh(24h + 4s), I = sbh(24h + 8s), W = 24sbh² (the
/// matrix products, plus attention's scores in F and I).
pub fn block_pass_flops(hidden: usize, seq_len: usize, microbatch_size: usize) -> [f64; 3] {
    let (h, s, b) = (hidden as f64, seq_len as f64, microbatch_size as f64);
    [
        s * b * h * (24.0 * h + 4.0 * s),
        s * b * h * (24.0 * h + 8.0 * s),
        24.0 * s * b * h * h,
    ]
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
}
