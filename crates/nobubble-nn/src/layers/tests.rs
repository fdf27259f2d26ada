//! Layer checks: every layer's F/I/W against an independent naive f64
//! implementation of the combined backward (split = unsplit), against finite
//! differences, pass-order errors and memory hand counts.

use super::*;
use crate::backend::CpuBackend;
use crate::config::GptConfig;
use crate::testutil::*;

pub(super) type NaiveOut = (Vec<f64>, Vec<f64>, Vec<Vec<f64>>);
/// Naive combined forward+backward: (param values, x, dy) → (y, dx, param grads).
pub(super) type NaiveFn<'a> = &'a dyn Fn(&[Vec<f64>], &[f64], &[f64]) -> NaiveOut;

fn zeros(n: usize) -> Vec<f64> {
    vec![0.0; n]
}

fn naive_linear(p: &[Vec<f64>], x: &[f64], dy: &[f64], n: usize) -> NaiveOut {
    let o = p[1].len();
    let i = p[0].len() / o;
    let y = linear_fwd(x, &p[0], Some(&p[1]), n, i, o);
    let (dx, dw, db) = linear_bwd(x, &p[0], dy, n, i, o);
    (y, dx, vec![dw, db])
}

fn naive_ln(p: &[Vec<f64>], x: &[f64], dy: &[f64]) -> NaiveOut {
    let h = p[0].len();
    let y = ln_fwd(x, &p[0], &p[1], h, 1e-5);
    let (dx, dg, db) = ln_bwd(x, &p[0], dy, h, 1e-5);
    (y, dx, vec![dg, db])
}

fn naive_attn(p: &[Vec<f64>], x: &[f64], dy: &[f64], n: usize, heads: usize, s: usize) -> NaiveOut {
    let h = p[3].len();
    let (qkv, _, _) = naive_linear(&p[0..2], x, &zeros(n * 3 * h), n);
    let (ctx, _) = attn_core_fwd(&qkv, n, h, heads, s);
    let (y, dctx, gp) = naive_linear(&p[2..4], &ctx, dy, n);
    let dqkv = attn_core_bwd(&qkv, &dctx, n, h, heads, s);
    let (_, dx, gq) = naive_linear(&p[0..2], x, &dqkv, n);
    (y, dx, [gq, gp].concat())
}

fn naive_mlp(p: &[Vec<f64>], x: &[f64], dy: &[f64], n: usize) -> NaiveOut {
    let h = p[3].len();
    let (u, _, _) = naive_linear(&p[0..2], x, &zeros(n * 4 * h), n);
    let g: Vec<f64> = u.iter().map(|&v| gelu(v)).collect();
    let (y, dg, g2) = naive_linear(&p[2..4], &g, dy, n);
    let du: Vec<f64> = dg.iter().zip(&u).map(|(d, &v)| d * gelu_grad(v)).collect();
    let (_, dx, g1) = naive_linear(&p[0..2], x, &du, n);
    (y, dx, [g1, g2].concat())
}

fn naive_block(
    p: &[Vec<f64>],
    x: &[f64],
    dy: &[f64],
    n: usize,
    heads: usize,
    s: usize,
) -> NaiveOut {
    let z = zeros(x.len());
    let (a1, _, _) = naive_ln(&p[0..2], x, &z);
    let (ao, _, _) = naive_attn(&p[2..6], &a1, &z, n, heads, s);
    let h1: Vec<f64> = x.iter().zip(&ao).map(|(a, b)| a + b).collect();
    let (a2, _, _) = naive_ln(&p[6..8], &h1, &z);
    let (mo, da2, gm) = naive_mlp(&p[8..12], &a2, dy, n);
    let (_, dh1_ln, gl2) = naive_ln(&p[6..8], &h1, &da2);
    let dh1: Vec<f64> = dy.iter().zip(&dh1_ln).map(|(a, b)| a + b).collect();
    let (_, da1, ga) = naive_attn(&p[2..6], &a1, &dh1, n, heads, s);
    let (_, dx_ln, gl1) = naive_ln(&p[0..2], x, &da1);
    let dx = dh1.iter().zip(&dx_ln).map(|(a, b)| a + b).collect();
    let y = h1.iter().zip(&mo).map(|(a, b)| a + b).collect();
    (y, dx, [gl1, ga, gl2, gm].concat())
}

/// Indices to probe: a spread-out sample of at most `k` positions.
pub(super) fn sample(len: usize, k: usize) -> Vec<usize> {
    (0..k.min(len)).map(|i| (i * 7919 + 3) % len).collect()
}

fn assert_fd(what: &str, fd: f64, analytic: f32, scale: f64) {
    let err = (fd - analytic as f64).abs();
    assert!(
        err <= 2e-2 * (analytic as f64).abs() + 2e-3 * scale,
        "{what}: finite difference {fd} vs analytic {analytic} (scale {scale})"
    );
}

/// Runs F, I, W on microbatch 0 and checks outputs and all gradients against the naive
/// combined backward, then checks I (input gradient) and W (every parameter) against
/// central finite differences of `Σ dy·F(x)`.
pub(super) fn check_layer<L: SplitLayer>(layer: &mut L, x: Tensor, naive: NaiveFn<'_>) {
    let (y, dy, dx) = run_passes(layer, &x);
    let values: Vec<Vec<f64>> = layer
        .params()
        .iter()
        .map(|p| f64s(p.value.data()))
        .collect();
    let (y_ref, dx_ref, grads_ref) = naive(&values, &f64s(x.data()), &f64s(dy.data()));
    assert_close("output", y.data(), &y_ref, 1e-4);
    assert_close("input gradient", dx.data(), &dx_ref, 1e-4);
    for (p, g) in layer.params().iter().zip(&grads_ref) {
        assert_close(&p.name, p.grad.data(), g, 1e-4);
    }
    check_finite_differences(layer, &x, &dy, &dx);
}

/// F, I, W on microbatch 0 with a random output gradient: `(y, dy, dx)`.
pub(super) fn run_passes<L: SplitLayer>(layer: &mut L, x: &Tensor) -> (Tensor, Tensor, Tensor) {
    let be = CpuBackend::single_thread();
    let y = layer.forward(&be, 0, x.clone()).unwrap();
    let dy = random_tensor(y.shape(), 1.0, 99);
    let dx = layer.backward_input(&be, 0, dy.clone()).unwrap();
    layer.backward_weight(&be, 0).unwrap();
    assert_eq!(layer.held_bytes(0), 0, "W must free everything");
    (y, dy, dx)
}

/// I's input gradient `dx` and W's parameter gradients (accumulated by [`run_passes`])
/// against central finite differences of `Σ dy·F(x)`.
pub(super) fn check_finite_differences<L: SplitLayer>(
    layer: &mut L,
    x: &Tensor,
    dy: &Tensor,
    dx: &Tensor,
) {
    let be = CpuBackend::single_thread();
    let mut mb = 1;
    let eps = 1e-2;
    let dx_scale = dx.data().iter().fold(0.0f64, |m, v| m.max(v.abs() as f64));
    for idx in sample(x.len(), 8) {
        let fd = central_difference(
            |v| {
                let mut xp = x.clone();
                xp.data_mut()[idx] = v;
                mb += 1;
                project(layer.forward(&be, mb, xp).unwrap().data(), dy.data())
            },
            x.data()[idx],
            eps,
        );
        assert_fd(&format!("input[{idx}]"), fd, dx.data()[idx], dx_scale);
    }
    let grads: Vec<Tensor> = layer.params().iter().map(|p| p.grad.clone()).collect();
    for (pi, g) in grads.iter().enumerate() {
        let scale = g.data().iter().fold(0.0f64, |m, v| m.max(v.abs() as f64));
        for idx in sample(g.len(), 5) {
            let x0 = layer.params()[pi].value.data()[idx];
            let fd = central_difference(
                |v| {
                    layer.params_mut()[pi].value.data_mut()[idx] = v;
                    mb += 1;
                    project(layer.forward(&be, mb, x.clone()).unwrap().data(), dy.data())
                },
                x0,
                eps,
            );
            layer.params_mut()[pi].value.data_mut()[idx] = x0;
            let name = layer.params()[pi].name.clone();
            assert_fd(&format!("{name}[{idx}]"), fd, g.data()[idx], scale);
        }
    }
}

pub(super) const N: usize = 8; // 2 sequences of 4 tokens
pub(super) const H: usize = 8;
pub(super) const HEADS: usize = 2;
pub(super) const S: usize = 4;

/// A GPT model of the test shape: width [`H`], [`HEADS`] heads, sequences of `s`, 2 blocks.
/// A 2-layer micro model of hidden size `h` with two heads and sequences of `s`.
fn two_heads(h: usize, s: usize) -> GptConfig {
    GptConfig {
        layers: 2,
        hidden: h,
        heads: 2,
        seq_len: s,
        ..GptConfig::micro()
    }
}

pub(super) fn config(s: usize) -> GptConfig {
    GptConfig {
        layers: 2,
        hidden: H,
        heads: HEADS,
        seq_len: s,
        ..GptConfig::micro()
    }
}

#[test]
fn linear_matches_naive_and_finite_differences() {
    let mut l = Linear::new("lin", 5, 7, true, 0.3, 1);
    randomize(l.params_mut(), 1);
    check_layer(&mut l, random_tensor(&[6, 5], 1.0, 2), &|p, x, dy| {
        naive_linear(p, x, dy, 6)
    });
}

#[test]
fn layernorm_matches_naive_and_finite_differences() {
    let mut l = Norm::layer_norm("ln", H, 1e-5, 1);
    randomize(l.params_mut(), 3);
    check_layer(&mut l, random_tensor(&[6, H], 1.0, 4), &naive_ln);
}

#[test]
fn attention_matches_naive_and_finite_differences() {
    let mut l = CausalSelfAttention::new("attn", &config(S), 1);
    randomize(l.params_mut(), 5);
    check_layer(&mut l, random_tensor(&[N, H], 1.0, 6), &|p, x, dy| {
        naive_attn(p, x, dy, N, HEADS, S)
    });
}

#[test]
fn attention_over_several_causal_blocks_matches_naive_and_finite_differences() {
    // s = 70 spans five 16-row blocks (the last one partial), so the skipped
    // upper-triangle blocks and the block edges are exercised.
    let (s, n) = (70, 140);
    let mut l = CausalSelfAttention::new("attn", &config(s), 1);
    randomize(l.params_mut(), 24);
    check_layer(&mut l, random_tensor(&[n, H], 1.0, 25), &|p, x, dy| {
        naive_attn(p, x, dy, n, HEADS, s)
    });
}

#[test]
fn attention_in_whole_register_tiles_matches_naive_and_finite_differences() {
    // d = 32: the small products run whole 4 × 16 tiles (8 × 32 at AVX-512) and the packing
    // whole 8 × 8 transposes; s = 70 adds the row and column tails.
    let (h, s, n) = (64, 70, 140);
    let mut l = CausalSelfAttention::new("attn", &two_heads(h, s), 1);
    randomize(l.params_mut(), 31);
    check_layer(&mut l, random_tensor(&[n, h], 1.0, 32), &|p, x, dy| {
        naive_attn(p, x, dy, n, 2, s)
    });
}

#[test]
fn attention_summing_its_qkv_bias_gradient_per_sequence_matches_naive_and_the_separate_sums() {
    // s = 128: two whole blocks of SUM_ROWS rows per sequence, so the core's tasks sum the
    // QKV bias gradient themselves (shorter sequences leave it to the linear layer).
    let (h, s, n) = (32, 128, 256);
    assert!(s % crate::backend::SUM_ROWS == 0 && s > crate::backend::SUM_ROWS);
    let mut l = CausalSelfAttention::new("attn", &two_heads(h, s), 1);
    randomize(l.params_mut(), 51);
    let x = random_tensor(&[n, h], 1.0, 52);
    check_layer(&mut l, x.clone(), &|p, x, dy| naive_attn(p, x, dy, n, 2, s));
    // The bits of the linear layer's own sums over the same gradient.
    let be = CpuBackend::single_thread();
    l.params_mut().into_iter().for_each(|p| p.zero_grad());
    let y = l.forward(&be, 1, x).unwrap();
    l.backward_input(&be, 1, random_tensor(y.shape(), 1.0, 53))
        .unwrap();
    let dqkv = l.qkv.queued_output_grad(1).unwrap();
    let mut separate = vec![0.0f32; dqkv.cols()];
    be.accumulate_column_sums(&mut separate, dqkv);
    l.backward_weight(&be, 1).unwrap();
    let fused = l.qkv.bias.as_ref().unwrap().grad.data();
    assert_eq!(fused, &separate[..]);
}

#[test]
fn mlp_matches_naive_and_finite_differences() {
    let mut l = Mlp::new("mlp", H, 4 * H, Activation::Gelu, 2, 1);
    randomize(l.params_mut(), 7);
    check_layer(&mut l, random_tensor(&[6, H], 1.0, 8), &|p, x, dy| {
        naive_mlp(p, x, dy, 6)
    });
}

#[test]
fn an_mlp_whose_activation_rows_are_padded_matches_naive_and_counts_the_padding() {
    // 4h = 512 floats: rows 2 KiB apart, so GELU's output (fc2's saved input) is padded.
    let (h, n) = (128, 6);
    let mut l = Mlp::new("mlp", h, 4 * h, Activation::Gelu, 2, 1);
    randomize(l.params_mut(), 41);
    check_layer(&mut l, random_tensor(&[n, h], 1.0, 42), &|p, x, dy| {
        naive_mlp(p, x, dy, n)
    });
    let mut mlp = Mlp::new("mlp", h, 4 * h, Activation::Gelu, 2, 1);
    // GELU's output (fc2's input) and fc1's output gradient have rows of 4h + 16 floats.
    let g = n * (4 * h + 16);
    assert_eq!(
        footprint(&mut mlp, random_tensor(&[n, h], 1.0, 43)),
        [
            4 * (n * h + n * 4 * h + g),
            4 * (n * h + g + 4 * h + g + n * h + h),
            0
        ]
    );
}

#[test]
fn block_matches_naive_and_finite_differences() {
    let mut l = Block::new(0, &config(S), 1);
    randomize(l.params_mut(), 9);
    check_layer(&mut l, random_tensor(&[N, H], 1.0, 10), &|p, x, dy| {
        naive_block(p, x, dy, N, HEADS, S)
    });
}

#[test]
fn a_biased_block_applies_what_its_forward_computes_bit_for_bit() {
    // Every bias non-zero: the residual stream gets the output projection's and fc2's biases
    // from the norms before their branches, in the same order in F and in inference.
    let mut l = Block::new(0, &config(S), 1);
    randomize(l.params_mut(), 61);
    assert!(!l.attn.output_bias().is_empty() && !l.mlp.output_bias().is_empty());
    let x = random_tensor(&[N, H], 1.0, 62);
    let be = CpuBackend::single_thread();
    let y = l.forward(&be, 0, x.clone()).unwrap();
    assert_eq!(l.apply(&be, x).data(), y.data());
}

#[test]
fn embedding_matches_naive_and_finite_differences() {
    let be = CpuBackend::single_thread();
    let (vocab, s) = (11, 4);
    let mut e = Embedding::new(vocab, s, H, true, 1);
    let tokens: Vec<u32> = vec![3, 1, 3, 10, 0, 3, 7, 1];
    let x = e.forward(&be, 0, &tokens).unwrap();
    let dy = random_tensor(x.shape(), 1.0, 11);
    e.backward_input(0, dy.clone()).unwrap();
    e.backward_weight(&be, 0).unwrap();
    let (tok, pos) = (
        f64s(e.tokens.value.data()),
        f64s(e.positions.as_ref().unwrap().value.data()),
    );
    let mut dtok = vec![0.0; vocab * H];
    let mut dpos = vec![0.0; s * H];
    for (r, &t) in tokens.iter().enumerate() {
        for j in 0..H {
            let t = t as usize;
            assert_eq!(
                x.data()[r * H + j] as f64,
                (tok[t * H + j] as f32 + pos[(r % s) * H + j] as f32) as f64
            );
            dtok[t * H + j] += dy.data()[r * H + j] as f64;
            dpos[(r % s) * H + j] += dy.data()[r * H + j] as f64;
        }
    }
    assert_close("dtok", e.tokens.grad.data(), &dtok, 1e-6);
    assert_close(
        "dpos",
        e.positions.as_ref().unwrap().grad.data(),
        &dpos,
        1e-6,
    );
    // Finite differences on a used token row, an unused one, and positions.
    let mut mb = 1;
    for (which, idx) in [(0usize, 3 * H + 2), (0, 5 * H), (1, 2 * H + 1)] {
        let x0 = e.params()[which].value.data()[idx];
        let fd = central_difference(
            |v| {
                e.params_mut()[which].value.data_mut()[idx] = v;
                mb += 1;
                project(e.forward(&be, mb, &tokens).unwrap().data(), dy.data())
            },
            x0,
            1e-2,
        );
        e.params_mut()[which].value.data_mut()[idx] = x0;
        assert_fd("embedding", fd, e.params()[which].grad.data()[idx], 1.0);
    }
}

fn naive_head(
    p: &[Vec<f64>],
    x: &[f64],
    targets: &[u32],
    vocab: usize,
) -> (f64, Vec<f64>, Vec<Vec<f64>>) {
    let n = targets.len();
    let h = x.len() / n;
    let (a, _, _) = naive_ln(&p[0..2], x, &zeros(x.len()));
    let logits = linear_fwd(&a, &p[2], None, n, h, vocab);
    let mut loss = 0.0;
    let mut dlogits = vec![0.0; n * vocab];
    for r in 0..n {
        let row = &logits[r * vocab..(r + 1) * vocab];
        let mx = row.iter().cloned().fold(f64::MIN, f64::max);
        let z: f64 = row.iter().map(|v| (v - mx).exp()).sum();
        loss += z.ln() + mx - row[targets[r] as usize];
        for j in 0..vocab {
            dlogits[r * vocab + j] = ((row[j] - mx).exp() / z
                - if j == targets[r] as usize { 1.0 } else { 0.0 })
                / n as f64;
        }
    }
    let (da, dw, _) = linear_bwd(&a, &p[2], &dlogits, n, h, vocab);
    let (_, dx, gl) = naive_ln(&p[0..2], x, &da);
    (loss / n as f64, dx, [gl, vec![dw]].concat())
}

#[test]
fn head_matches_naive_and_finite_differences() {
    let be = CpuBackend::single_thread();
    let vocab = 11;
    let mut head = LmHead::new(&GptConfig { vocab, ..config(S) }, 1);
    randomize(head.params_mut(), 12);
    let x = random_tensor(&[6, H], 1.0, 13);
    let targets = vec![0u32, 4, 10, 4, 2, 9];
    let loss = head.forward(&be, 0, x.clone(), &targets).unwrap();
    let dx = head.backward_input(&be, 0).unwrap();
    head.backward_weight(&be, 0).unwrap();
    let values: Vec<Vec<f64>> = head.params().iter().map(|p| f64s(p.value.data())).collect();
    let (loss_ref, dx_ref, grads_ref) = naive_head(&values, &f64s(x.data()), &targets, vocab);
    assert!((loss as f64 - loss_ref).abs() < 1e-5 * loss_ref.abs());
    assert_close("head dx", dx.data(), &dx_ref, 1e-4);
    for (p, g) in head.params().iter().zip(&grads_ref) {
        assert_close(&p.name, p.grad.data(), g, 1e-4);
    }
    let mut mb = 1;
    let dx_scale = dx.data().iter().fold(0.0f64, |m, v| m.max(v.abs() as f64));
    for idx in sample(x.len(), 8) {
        let fd = central_difference(
            |v| {
                let mut xp = x.clone();
                xp.data_mut()[idx] = v;
                mb += 1;
                head.forward(&be, mb, xp, &targets).unwrap() as f64
            },
            x.data()[idx],
            1e-2,
        );
        assert_fd("head input", fd, dx.data()[idx], dx_scale);
    }
    let grads: Vec<Tensor> = head.params().iter().map(|p| p.grad.clone()).collect();
    for (pi, g) in grads.iter().enumerate() {
        let scale = g.data().iter().fold(0.0f64, |m, v| m.max(v.abs() as f64));
        for idx in sample(g.len(), 5) {
            let x0 = head.params()[pi].value.data()[idx];
            let fd = central_difference(
                |v| {
                    head.params_mut()[pi].value.data_mut()[idx] = v;
                    mb += 1;
                    head.forward(&be, mb, x.clone(), &targets).unwrap() as f64
                },
                x0,
                1e-2,
            );
            head.params_mut()[pi].value.data_mut()[idx] = x0;
            assert_fd("head param", fd, g.data()[idx], scale);
        }
    }
}

fn grads_of<L: SplitLayer>(l: &L) -> Vec<Vec<f32>> {
    l.params().iter().map(|p| p.grad.data().to_vec()).collect()
}

#[test]
fn interleaved_microbatches_give_bit_identical_gradients() {
    let be = CpuBackend::single_thread();
    let make = || {
        let mut b = Block::new(0, &config(S), 1);
        randomize(b.params_mut(), 14);
        b
    };
    let xs = [
        random_tensor(&[N, H], 1.0, 15),
        random_tensor(&[N, H], 1.0, 16),
    ];
    let dys = [
        random_tensor(&[N, H], 1.0, 17),
        random_tensor(&[N, H], 1.0, 18),
    ];

    let mut in_order = make();
    let mut dx_in_order = Vec::new();
    for mb in 0..2 {
        in_order.forward(&be, mb, xs[mb].clone()).unwrap();
        dx_in_order.push(in_order.backward_input(&be, mb, dys[mb].clone()).unwrap());
        in_order.backward_weight(&be, mb).unwrap();
    }

    // F(0) F(1) I(1) I(0) W(0) W(1)
    let mut inter = make();
    inter.forward(&be, 0, xs[0].clone()).unwrap();
    inter.forward(&be, 1, xs[1].clone()).unwrap();
    let dx1 = inter.backward_input(&be, 1, dys[1].clone()).unwrap();
    let dx0 = inter.backward_input(&be, 0, dys[0].clone()).unwrap();
    inter.backward_weight(&be, 0).unwrap();
    inter.backward_weight(&be, 1).unwrap();
    assert_eq!(dx0, dx_in_order[0]);
    assert_eq!(dx1, dx_in_order[1]);
    assert_eq!(
        grads_of(&inter),
        grads_of(&in_order),
        "W in microbatch order must be bit-identical"
    );

    // W in reverse order: same gradients up to float reassociation.
    let mut reversed = make();
    reversed.forward(&be, 0, xs[0].clone()).unwrap();
    reversed.forward(&be, 1, xs[1].clone()).unwrap();
    reversed.backward_input(&be, 1, dys[1].clone()).unwrap();
    reversed.backward_input(&be, 0, dys[0].clone()).unwrap();
    reversed.backward_weight(&be, 1).unwrap();
    reversed.backward_weight(&be, 0).unwrap();
    for (a, b) in grads_of(&reversed).iter().zip(grads_of(&in_order)) {
        let want = f64s(&b);
        assert_close("reversed W", a, &want, 1e-5);
    }
}

#[test]
fn pass_order_errors() {
    let be = CpuBackend::single_thread();
    let mut b = Block::new(0, &config(S), 1);
    let x = random_tensor(&[N, H], 1.0, 19);
    let err = b.backward_input(&be, 0, x.clone()).unwrap_err();
    assert!(err.to_string().contains("without a forward"), "{err}");
    let err = b.backward_weight(&be, 0).unwrap_err();
    assert!(err.to_string().contains("nothing queued"), "{err}");
    b.forward(&be, 0, x.clone()).unwrap();
    assert!(
        b.forward(&be, 0, x.clone()).is_err(),
        "second F for the same microbatch"
    );
    assert!(b.backward_weight(&be, 0).is_err(), "W before I");
    b.backward_input(&be, 0, x.clone()).unwrap();
    assert!(b.backward_input(&be, 0, x.clone()).is_err(), "second I");
    b.backward_weight(&be, 0).unwrap();
    let err = b.backward_weight(&be, 0).unwrap_err();
    assert!(
        err.to_string().contains("nothing queued"),
        "double W: {err}"
    );
    assert!(matches!(
        err,
        crate::NnError::PassOrder { microbatch: 0, .. }
    ));
    let bad = random_tensor(&[N, H + 1], 1.0, 20);
    assert!(matches!(
        b.forward(&be, 1, bad),
        Err(crate::NnError::BadInput(_))
    ));
    assert_eq!(b.held_bytes(1), 0, "a rejected F holds nothing");
}

#[test]
fn block_memory_matches_hand_count() {
    let be = CpuBackend::single_thread();
    let mut b = Block::new(0, &config(S), 1);
    b.forward(&be, 0, random_tensor(&[N, H], 1.0, 21)).unwrap();
    let after_f = b.held_bytes(0);
    // ln1 xhat+rstd, qkv input, qkv+probs, proj input, ln2 xhat+rstd, fc1 input,
    // gelu pre-activation, fc2 input.
    let seqs = N / S;
    let f_floats = (N * H + N)
        + N * H
        + (N * 3 * H + seqs * HEADS * S * S)
        + N * H
        + (N * H + N)
        + N * H
        + N * 4 * H
        + N * 4 * H;
    assert_eq!(after_f, 4 * f_floats);
    b.backward_input(&be, 0, random_tensor(&[N, H], 1.0, 22))
        .unwrap();
    let after_i = b.held_bytes(0);
    // ln partials 2h each; each linear keeps (input, output gradient, bias partial).
    let i_floats = 2 * H
        + (N * H + N * 3 * H + 3 * H)
        + (N * H + N * H + H)
        + 2 * H
        + (N * H + N * 4 * H + 4 * H)
        + (N * 4 * H + N * H + H);
    assert_eq!(after_i, 4 * i_floats);
    b.backward_weight(&be, 0).unwrap();
    assert_eq!(b.held_bytes(0), 0);
    // (At this size, 8 rows of 8, the 13h floats of norm and bias partials outweigh what I
    // frees; `stage_memory_matches_hand_count_and_shrinks_after_i` checks the drop.)
    assert!(after_i > 0);
}

/// Bytes after F, after I and after W for one microbatch.
fn footprint<L: SplitLayer>(layer: &mut L, x: Tensor) -> [usize; 3] {
    let be = CpuBackend::single_thread();
    let y = layer.forward(&be, 0, x).unwrap();
    let f = layer.held_bytes(0);
    layer
        .backward_input(&be, 0, Tensor::zeros(y.shape()))
        .unwrap();
    let i = layer.held_bytes(0);
    layer.backward_weight(&be, 0).unwrap();
    [f, i, layer.held_bytes(0)]
}

#[test]
fn sublayer_memory_matches_hand_counts() {
    let x = || random_tensor(&[N, H], 1.0, 23);
    let fl = |floats: usize| 4 * floats;
    // Linear keeps its input for I, then input + output gradient (+ the bias gradient's
    // partial sum) for W: it holds *more* after I — the saving of a split backward comes
    // from the layers around it.
    let mut lin = Linear::new("lin", H, 3 * H, true, 0.02, 1);
    assert_eq!(
        footprint(&mut lin, x()),
        [fl(N * H), fl(N * H + N * 3 * H + 3 * H), 0]
    );
    let mut ln = Norm::layer_norm("ln", H, 1e-5, 1);
    assert_eq!(footprint(&mut ln, x()), [fl(N * H + N), fl(2 * H), 0]);
    let seqs = N / S;
    let mut attn = CausalSelfAttention::new("attn", &config(S), 1);
    assert_eq!(
        footprint(&mut attn, x()),
        [
            fl(N * H + N * 3 * H + seqs * HEADS * S * S + N * H),
            fl(N * H + N * 3 * H + 3 * H + 2 * N * H + H),
            0
        ]
    );
    let mut mlp = Mlp::new("mlp", H, 4 * H, Activation::Gelu, 2, 1);
    assert_eq!(
        footprint(&mut mlp, x()),
        [
            fl(N * H + 2 * N * 4 * H),
            fl(N * H + N * 4 * H + 4 * H + N * 4 * H + N * H + H),
            0
        ]
    );
}

#[test]
fn a_swiglu_mlp_with_an_fc1_bias_adds_it_before_the_activation() {
    // Llama's MLPs have no biases, but the fields are public: one set by hand must still
    // count (fc1 adds it itself: only GELU folds it into its kernel).
    let be = CpuBackend::single_thread();
    let mut mlp = Mlp::new("mlp", H, 2 * H, Activation::SwiGlu, 2, 1);
    let init = crate::param::Init::Constant(0.0);
    let mut bias = crate::param::Param::new("mlp.fc1.bias", &[4 * H], init, false, 1);
    for (j, b) in bias.value.data_mut().iter_mut().enumerate() {
        *b = j as f32 * 0.01 - 0.1;
    }
    mlp.fc1.bias = Some(bias);
    let x = random_tensor(&[N, H], 1.0, 31);
    let u = mlp.fc1.apply(&be, &x);
    let want = mlp.fc2.apply(&be, &be.swiglu_forward(&u));
    let got = mlp.forward(&be, 0, x).unwrap();
    assert_eq!(got.data(), want.data());
    let unbiased_u = mlp
        .fc1
        .apply_unbiased(&be, &random_tensor(&[N, H], 1.0, 31));
    assert_ne!(unbiased_u.data(), u.data(), "the bias is not zero");
}
