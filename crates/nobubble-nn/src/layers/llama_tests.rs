//! Checks of the Llama blocks' layers: RMSNorm, SwiGLU, rotary positions and grouped-query
//! attention against naive f64 implementations written from the formulas, and against
//! finite differences; pass order and memory as for GPT blocks.

use super::tests::{check_finite_differences, check_layer, run_passes, NaiveOut, H, N, S};
use super::*;
use crate::config::{Arch, GptConfig};
use crate::testutil::*;

fn llama(heads: usize, kv_heads: usize, s: usize) -> GptConfig {
    GptConfig {
        layers: 2,
        hidden: H,
        heads,
        kv_heads: Some(kv_heads),
        ffn_hidden: Some(12),
        seq_len: s,
        arch: Arch::Llama,
        rope_theta: 500.0,
        ..GptConfig::micro()
    }
}

fn rms_fwd(x: &[f64], g: &[f64], eps: f64) -> Vec<f64> {
    let h = g.len();
    x.chunks(h)
        .flat_map(|row| {
            let ms = row.iter().map(|v| v * v).sum::<f64>() / h as f64;
            let r = 1.0 / (ms + eps).sqrt();
            row.iter().zip(g).map(move |(v, g)| v * r * g)
        })
        .collect()
}

/// RMSNorm's backward by the chain rule through the mean square: (dx, dγ).
fn rms_bwd(x: &[f64], g: &[f64], dy: &[f64], eps: f64) -> (Vec<f64>, Vec<f64>) {
    let h = g.len();
    let mut dx = vec![0.0; x.len()];
    let mut dg = vec![0.0; h];
    for (r, row) in x.chunks(h).enumerate() {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / h as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        let d = &dy[r * h..(r + 1) * h];
        // y_j = x_j·inv·g_j; ∂inv/∂x_k = −inv³·x_k/h.
        let s: f64 = (0..h).map(|j| d[j] * g[j] * row[j]).sum();
        for k in 0..h {
            dx[r * h + k] = d[k] * g[k] * inv - s * inv.powi(3) * row[k] / h as f64;
            dg[k] += d[k] * row[k] * inv;
        }
    }
    (dx, dg)
}

fn naive_rms(p: &[Vec<f64>], x: &[f64], dy: &[f64]) -> NaiveOut {
    let y = rms_fwd(x, &p[0], 1e-5);
    let (dx, dg) = rms_bwd(x, &p[0], dy, 1e-5);
    (y, dx, vec![dg])
}

fn silu(g: f64) -> f64 {
    g / (1.0 + (-g).exp())
}

fn naive_swiglu_mlp(p: &[Vec<f64>], x: &[f64], dy: &[f64], n: usize) -> NaiveOut {
    let (h, f) = (x.len() / n, p[1].len() / (x.len() / n));
    let u = linear_fwd(x, &p[0], None, n, h, 2 * f);
    let mut a = vec![0.0; n * f];
    for r in 0..n {
        for j in 0..f {
            a[r * f + j] = silu(u[r * 2 * f + j]) * u[r * 2 * f + f + j];
        }
    }
    let y = linear_fwd(&a, &p[1], None, n, f, h);
    let (da, dw2, _) = linear_bwd(&a, &p[1], dy, n, f, h);
    let mut du = vec![0.0; n * 2 * f];
    for r in 0..n {
        for j in 0..f {
            let (g, up) = (u[r * 2 * f + j], u[r * 2 * f + f + j]);
            let sig = 1.0 / (1.0 + (-g).exp());
            du[r * 2 * f + j] = da[r * f + j] * up * (sig + g * sig * (1.0 - sig));
            du[r * 2 * f + f + j] = da[r * f + j] * silu(g);
        }
    }
    let (dx, dw1, _) = linear_bwd(x, &p[0], &du, n, h, 2 * f);
    (y, dx, vec![dw1, dw2])
}

/// Rotates pairs `(j, j + d/2)` of every head in the first `heads·d` columns of each row by
/// `sign · pos · θ^(−2j/d)`.
fn rotate(x: &mut [f64], cols: usize, heads: usize, d: usize, s: usize, theta: f64, sign: f64) {
    for (r, row) in x.chunks_mut(cols).enumerate() {
        let pos = (r % s) as f64;
        for head in row[..heads * d].chunks_mut(d) {
            for j in 0..d / 2 {
                let angle = sign * pos * theta.powf(-2.0 * j as f64 / d as f64);
                let (a, b) = (head[j], head[j + d / 2]);
                head[j] = a * angle.cos() - b * angle.sin();
                head[j + d / 2] = b * angle.cos() + a * angle.sin();
            }
        }
    }
}

/// Llama attention written the long way: rotate Q and K, copy each K/V head to every query
/// head of its group (a `[n, 3h]` layout), run the naive core, and sum the copies' gradients.
fn naive_llama_attn(p: &[Vec<f64>], x: &[f64], dy: &[f64], cfg: &GptConfig) -> NaiveOut {
    let (n, h, s) = (x.len() / cfg.hidden, cfg.hidden, cfg.seq_len);
    let (a, kv, d) = (cfg.heads, cfg.kv_heads(), cfg.head_dim());
    let w = (a + 2 * kv) * d;
    let theta = cfg.rope_theta as f64;
    let mut qkv = linear_fwd(x, &p[0], None, n, h, w);
    rotate(&mut qkv, w, a + kv, d, s, theta, 1.0);
    let group = a / kv;
    let source = |c3: usize| -> usize {
        // Column of the [n, 3h] layout → column of the grouped layout.
        let (which, head, e) = (c3 / h, (c3 % h) / d, c3 % d);
        match which {
            0 => head * d + e,
            1 => (a + head / group) * d + e,
            _ => (a + kv + head / group) * d + e,
        }
    };
    let expanded: Vec<f64> = (0..n * 3 * h)
        .map(|i| qkv[(i / (3 * h)) * w + source(i % (3 * h))])
        .collect();
    let (ctx, _) = attn_core_fwd(&expanded, n, h, a, s);
    let y = linear_fwd(&ctx, &p[1], None, n, h, h);
    let (dctx, dproj, _) = linear_bwd(&ctx, &p[1], dy, n, h, h);
    let dexpanded = attn_core_bwd(&expanded, &dctx, n, h, a, s);
    let mut dqkv = vec![0.0; n * w];
    for (i, g) in dexpanded.iter().enumerate() {
        dqkv[(i / (3 * h)) * w + source(i % (3 * h))] += g;
    }
    rotate(&mut dqkv, w, a + kv, d, s, theta, -1.0);
    let (dx, dqkv_w, _) = linear_bwd(x, &p[0], &dqkv, n, h, w);
    (y, dx, vec![dqkv_w, dproj])
}

#[test]
fn rmsnorm_matches_naive_and_finite_differences() {
    let mut l = Norm::rms_norm("ln", H, 1e-5, 1);
    assert!(l.beta.is_none() && l.params().len() == 1);
    randomize(l.params_mut(), 3);
    check_layer(&mut l, random_tensor(&[6, H], 1.0, 4), &naive_rms);
}

#[test]
fn swiglu_mlp_matches_naive_and_finite_differences() {
    let mut l = Mlp::new("mlp", H, 12, Activation::SwiGlu, 2, 1);
    assert!(l.fc1.bias.is_none() && l.fc2.bias.is_none());
    assert_eq!(l.fc1.out_features(), 24);
    randomize(l.params_mut(), 7);
    check_layer(&mut l, random_tensor(&[6, H], 1.0, 8), &|p, x, dy| {
        naive_swiglu_mlp(p, x, dy, 6)
    });
}

/// Grouped-query attention with d = 16 (whole register tiles in the small products): the
/// second query head of each group reuses its K/V head's packing and adds its gradient.
#[test]
fn llama_attention_in_whole_register_tiles_matches_naive_and_finite_differences() {
    let cfg = GptConfig {
        hidden: 64,
        ..llama(4, 2, 70)
    };
    let mut l = CausalSelfAttention::new("attn", &cfg, 1);
    randomize(l.params_mut(), 33);
    let n = 2 * cfg.seq_len;
    check_layer(&mut l, random_tensor(&[n, 64], 1.0, 34), &|p, x, dy| {
        naive_llama_attn(p, x, dy, &cfg)
    });
}

#[test]
fn llama_attention_matches_naive_and_finite_differences() {
    // 4 query heads on 2 K/V heads, one K/V head for all 4, and one each; s = 70 spans
    // three causal blocks and rotates by many distinct angles.
    for (heads, kv, s) in [(4, 2, S), (4, 1, S), (2, 2, S), (4, 2, 70)] {
        let cfg = llama(heads, kv, s);
        let mut l = CausalSelfAttention::new("attn", &cfg, 1);
        assert_eq!(l.qkv.out_features(), (heads + 2 * kv) * H / heads);
        assert!(l.qkv.bias.is_none() && l.proj.bias.is_none());
        randomize(l.params_mut(), 5);
        let n = 2 * s;
        check_layer(&mut l, random_tensor(&[n, H], 1.0, 6), &|p, x, dy| {
            naive_llama_attn(p, x, dy, &cfg)
        });
    }
}

#[test]
fn llama_block_matches_finite_differences_and_keeps_the_split_exact() {
    let cfg = llama(4, 2, S);
    let mut b = Block::new(0, &cfg, 1);
    randomize(b.params_mut(), 9);
    let names: Vec<&str> = b.params().iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "blocks.0.ln1.gamma",
            "blocks.0.attn.qkv.weight",
            "blocks.0.attn.proj.weight",
            "blocks.0.ln2.gamma",
            "blocks.0.mlp.fc1.weight",
            "blocks.0.mlp.fc2.weight",
        ]
    );
    let x = random_tensor(&[N, H], 1.0, 10);
    let (y, dy, dx) = run_passes(&mut b, &x);
    // The inference path computes what F computes, bit for bit.
    let be = crate::backend::CpuBackend::single_thread();
    assert_eq!(b.apply(&be, x.clone()).data(), y.data());
    check_finite_differences(&mut b, &x, &dy, &dx);
}

#[test]
fn llama_block_memory_matches_hand_count() {
    let cfg = llama(4, 2, S);
    let (d, f) = (H / 4, 12);
    let w = (4 + 2 * 2) * d;
    let be = crate::backend::CpuBackend::single_thread();
    let mut b = Block::new(0, &cfg, 1);
    b.forward(&be, 0, random_tensor(&[N, H], 1.0, 21)).unwrap();
    // ln1 xhat+rstd, qkv input, rotated qkv + probs, proj input, ln2 xhat+rstd, fc1 input,
    // [gate | up], fc2 input.
    let seqs = N / S;
    let f_floats = (N * H + N)
        + N * H
        + (N * w + seqs * 4 * S * S)
        + N * H
        + (N * H + N)
        + N * H
        + N * 2 * f
        + N * f;
    assert_eq!(b.held_bytes(0), 4 * f_floats);
    let (counted_f, counted_i) = GptConfig {
        microbatch_size: N / S,
        ..cfg.clone()
    }
    .llama_block_bytes();
    assert_eq!(counted_f, (4 * f_floats) as f64);
    b.backward_input(&be, 0, random_tensor(&[N, H], 1.0, 22))
        .unwrap();
    // γ partials h each (no β); each linear keeps (input, output gradient).
    let i_floats =
        H + (N * H + N * w) + (N * H + N * H) + H + (N * H + N * 2 * f) + (N * f + N * H);
    assert_eq!(b.held_bytes(0), 4 * i_floats);
    assert_eq!(counted_i, (4 * i_floats) as f64);
    b.backward_weight(&be, 0).unwrap();
    assert_eq!(b.held_bytes(0), 0);
}
