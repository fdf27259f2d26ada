//! The kernels against their formulas, and every SIMD build against the portable one.

use super::*;

#[test]
fn fast_exps_and_gelu_are_accurate() {
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
    let mut worst2 = 0.0f64;
    for i in -12_500..=12_600 {
        let t = i as f32 * 0.01 + 0.003;
        let want = (t as f64).exp2();
        worst2 = worst2.max(((fast_exp2(t) as f64 - want) / want).abs());
    }
    assert!(worst2 < 3e-7, "fast_exp2 worst relative error {worst2}");
    assert_eq!(fast_exp2(0.0), 1.0);
    assert_eq!(fast_exp2(-3.0), 0.125);
    assert!(fast_exp2(-1000.0) >= 0.0 && fast_exp2(-1000.0) < 1e-37);
    assert!(fast_exp2(1000.0).is_finite());
    // GELU (tanh form) and its derivative against f64, including the saturated tails.
    let xs: Vec<f32> = (-3000..=3000).map(|i| i as f32 * 0.005).collect();
    let mut y = vec![0.0; xs.len()];
    portable::gelu_forward(&xs, &[], &mut y);
    let mut dy = vec![1.0; xs.len()];
    portable::gelu_backward(&xs, &[], &mut dy);
    let (c, a) = (GELU_C as f64, GELU_A as f64);
    for ((&x, &y), &d) in xs.iter().zip(&y).zip(&dy) {
        let x = x as f64;
        let t = (c * (x + a * x * x * x)).tanh();
        let want = 0.5 * x * (1.0 + t);
        let dwant = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * a * x * x);
        assert!(
            (y as f64 - want).abs() < 1e-6 * (1.0 + want.abs()),
            "gelu({x})"
        );
        assert!(
            (d as f64 - dwant).abs() < 2e-6 * (1.0 + dwant.abs()),
            "gelu'({x})"
        );
    }
    let mut big = [0.0f32; 2];
    portable::gelu_forward(&[-60.0, 60.0], &[], &mut big);
    assert_eq!(big[1], 60.0);
    assert!(big[0] <= 0.0 && big[0] > -1e-30);
}

/// The tree of partial maxima gives `f32::max` folded over the elements, NaN skipped.
#[test]
fn lane_max_is_the_maximum_of_every_length() {
    assert_eq!(lane_max(&[]), f32::NEG_INFINITY);
    for len in 1..70 {
        let mut xs: Vec<f32> = (0..len).map(|i| ((i * 37 % 23) as f32).sin()).collect();
        xs[len / 2] = f32::NAN;
        let want = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(lane_max(&xs).to_bits(), want.to_bits(), "length {len}");
    }
}

/// The attention core runs the softmax on blocks of rows: each block, told its first
/// row, gives the bits of the whole matrix's rows.
#[test]
fn blocks_of_rows_give_the_whole_softmax_bits() {
    let n = 37;
    let scores: Vec<f32> = (0..n * n)
        .map(|i| ((i as f32) * 0.41).cos() * 4.0)
        .collect();
    for simd in Simd::ALL.into_iter().filter(|s| s.is_supported()) {
        let mut whole = scores.clone();
        causal_softmax(simd, &mut whole, n, 0);
        let mut blocks = scores.clone();
        for (r0, r1) in [(0, 5), (5, 16), (16, 37)] {
            causal_softmax(simd, &mut blocks[r0 * n..r1 * n], n, r0);
        }
        assert_eq!(blocks, whole, "{simd}");
        assert!(
            whole[n + 1] > 0.0 && whole[n + 2] == 0.0,
            "row 1 keeps columns 0..=1"
        );
    }
}

#[test]
fn whatever_lies_past_the_diagonal_never_reaches_the_softmax() {
    // The kernel computes exponentials past the diagonal up to the end of a lane group;
    // a reused buffer may hold anything there (NaN in debug builds, by design).
    let n = 37;
    let scores: Vec<f32> = (0..n * n)
        .map(|i| ((i as f32) * 0.173).sin() * 5.0)
        .collect();
    let masked = |fill: f32| {
        let mut s = scores.clone();
        for i in 0..n {
            s[i * n + i + 1..(i + 1) * n].fill(fill);
        }
        s
    };
    for simd in Simd::ALL.into_iter().filter(|s| s.is_supported()) {
        let mut want = masked(0.0);
        causal_softmax(simd, &mut want, n, 0);
        for fill in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, -0.0] {
            let mut got = masked(fill);
            causal_softmax(simd, &mut got, n, 0);
            assert_eq!(got, want, "{simd}, {fill} past the diagonal");
        }
    }
}

/// The kernels pad a row to whole vectors; a row's bits must still be those of its
/// valid part alone: the decoding softmax over the prefix, and for the backward the
/// formula over the prefix (whatever `dp` held past the diagonal).
#[test]
fn padded_rows_have_the_bits_of_their_valid_part() {
    for n in [37, 48] {
        let scores: Vec<f32> = (0..n * n)
            .map(|i| ((i as f32) * 0.29).sin() * 6.0)
            .collect();
        let grads: Vec<f32> = (0..n * n).map(|i| ((i as f32) * 0.61).cos()).collect();
        for simd in Simd::ALL.into_iter().filter(|s| s.is_supported()) {
            let mut p = scores.clone();
            causal_softmax(simd, &mut p, n, 0);
            let mut dp = grads.clone();
            for i in 0..n {
                dp[i * n + i + 1..(i + 1) * n].fill(f32::NAN);
            }
            causal_softmax_backward(simd, &p, &mut dp, n);
            for i in 0..n {
                let mut prefix = scores[i * n..][..=i].to_vec();
                softmax_rows(simd, &mut prefix, i + 1, &mut [0.0], &mut [0.0]);
                assert_eq!(&p[i * n..][..=i], &prefix[..], "{simd}, n {n}, row {i}");
                let (pv, gv) = (&prefix[..], &grads[i * n..][..=i]);
                let dot = lane_dot(pv, gv);
                let want: Vec<f32> = pv.iter().zip(gv).map(|(&p, &g)| p * (g - dot)).collect();
                assert_eq!(&dp[i * n..][..=i], &want[..], "{simd}, n {n}, row {i}");
                assert!(dp[i * n + i + 1..(i + 1) * n].iter().all(|&v| v == 0.0));
            }
        }
    }
}

#[test]
fn sum_of_squares_matches_a_sequential_f64_sum() {
    for n in [0, 1, 7, 8, 9, 1000, 4099] {
        let x: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin() * 3.0).collect();
        let want: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
        let got = portable::sum_of_squares(&x);
        assert!(
            (got - want).abs() <= 1e-12 * want.max(1.0),
            "{n}: {got} vs {want}"
        );
    }
    assert!(!portable::sum_of_squares(&[1.0, f32::NAN]).is_finite());
    assert!(!portable::sum_of_squares(&[f32::INFINITY, 0.0]).is_finite());
}

#[test]
fn a_bias_inside_the_kernel_is_the_bias_added_first() {
    let (rows, cols) = (7, 5);
    let u: Vec<f32> = (0..rows * cols)
        .map(|i| (i as f32 * 0.61).cos() * 3.0)
        .collect();
    let bias: Vec<f32> = (0..cols).map(|j| j as f32 * 0.3 - 0.7).collect();
    let shifted: Vec<f32> = (u.chunks(cols))
        .flat_map(|r| r.iter().zip(&bias).map(|(x, b)| x + b))
        .collect();
    let (mut a, mut b) = (vec![0.0; u.len()], vec![0.0; u.len()]);
    portable::gelu_forward(&u, &bias, &mut a);
    portable::gelu_forward(&shifted, &[], &mut b);
    assert_eq!(a, b);
    let (mut da, mut db) = (u.clone(), u.clone());
    portable::gelu_backward(&u, &bias, &mut da);
    portable::gelu_backward(&shifted, &[], &mut db);
    assert_eq!(da, db);
    let mut r = vec![1.0; u.len()];
    portable::add_with_bias(&mut r, &u, &bias);
    let want: Vec<f32> = shifted.iter().map(|x| 1.0 + x).collect();
    assert_eq!(r, want);
}

#[test]
fn lane_reductions_match_f64_sums_and_handle_tails() {
    for n in [0, 1, 15, 16, 17, 100, 1037] {
        let x: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin()).collect();
        let want: f64 = x.iter().map(|&v| v as f64).sum();
        assert!((lane_sum(&x) as f64 - want).abs() < 1e-4, "sum of {n}");
        let dot: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
        assert!((lane_dot(&x, &x) as f64 - dot).abs() < 1e-4, "dot of {n}");
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(lane_max(&x), max, "max of {n}");
    }
}

#[test]
fn every_simd_build_gives_the_baseline_bits() {
    let u: Vec<f32> = (0..1037)
        .map(|i| ((i as f32) * 0.731).sin() * 4.0)
        .collect();
    let n = 31;
    let h = 29;
    let rows = u.len() / h;
    let g: Vec<f32> = u[..h].iter().map(|v| 1.0 + v * 0.1).collect();
    for simd in Simd::ALL.into_iter().filter(|s| s.is_supported()) {
        assert_eq!(
            sum_of_squares(simd, &u).to_bits(),
            portable::sum_of_squares(&u).to_bits(),
            "{simd}"
        );
        let step = AdamWStep {
            beta1: 0.9,
            beta2: 0.95,
            bc1: 0.1,
            bc2: 0.05,
            eps: 1e-8,
            lr: 1e-3,
            decay: 1e-4,
            grad_scale: 0.7,
        };
        let (mut v1, mut m1, mut s1) = (
            u.clone(),
            g.repeat(36),
            u.iter().map(|x| x * x).collect::<Vec<_>>(),
        );
        m1.truncate(u.len());
        let (mut v2, mut m2, mut s2) = (v1.clone(), m1.clone(), s1.clone());
        adamw(simd, &mut v1, &u, &mut m1, &mut s1, step);
        portable::adamw(&mut v2, &u, &mut m2, &mut s2, step);
        assert_eq!((&v1, &m1, &s1), (&v2, &m2, &s2), "{simd}");
        // Biased (rows of 17, 1037 = 17·61) and plain.
        for bias in [&u[..17], &[][..]] {
            let mut a = vec![0.0; u.len()];
            let mut b = vec![0.0; u.len()];
            gelu_forward(simd, &u, bias, &mut a);
            portable::gelu_forward(&u, bias, &mut b);
            assert_eq!(a, b, "{simd}");
            let mut da = u.clone();
            let mut db = u.clone();
            gelu_backward(simd, &u, bias, &mut da);
            portable::gelu_backward(&u, bias, &mut db);
            assert_eq!(da, db, "{simd}");
            let (mut ra, mut rb) = (da.clone(), da.clone());
            add_with_bias(simd, &mut ra, &u, bias);
            portable::add_with_bias(&mut rb, &u, bias);
            assert_eq!(ra, rb, "{simd}");
        }
        let mut sa: Vec<f32> = u[..n * n].to_vec();
        let mut sb = sa.clone();
        causal_softmax(simd, &mut sa, n, 0);
        portable::causal_softmax(&mut sb, n, 0);
        assert_eq!(sa, sb, "{simd}");
        let mut pa = sa.clone();
        let mut pb = sa.clone();
        causal_softmax_backward(simd, &sb, &mut pa, n);
        portable::causal_softmax_backward(&sb, &mut pb, n);
        assert_eq!(pa, pb, "{simd}");
        let (mut y1, mut x1, mut r1) = (vec![0.0; rows * h], vec![0.0; rows * h], vec![0.0; rows]);
        let (mut y2, mut x2, mut r2) = (y1.clone(), x1.clone(), r1.clone());
        layernorm_forward(
            simd,
            &u[..rows * h],
            &g,
            &g,
            1e-5,
            &mut y1,
            &mut x1,
            &mut r1,
        );
        portable::layernorm_forward(&u[..rows * h], &g, &g, 1e-5, &mut y2, &mut x2, &mut r2);
        assert_eq!((&y1, &x1, &r1), (&y2, &x2, &r2), "{simd}");
        // With and without the residual gradient and the column sums.
        let residual = &u[u.len() - rows * h..];
        for (res, sums) in [(&[][..], 0), (residual, h)] {
            let (mut d1, mut g1, mut b1) = (vec![0.0; rows * h], vec![0.0; h], vec![0.0; h]);
            let mut s1 = vec![0.0; sums];
            let (mut d2, mut g2, mut b2, mut s2) = (d1.clone(), g1.clone(), b1.clone(), s1.clone());
            let dy = &u[..rows * h];
            layernorm_backward(
                simd, dy, &x1, &r1, &g, res, &mut d1, &mut g1, &mut b1, &mut s1,
            );
            portable::layernorm_backward(dy, &x1, &r1, &g, res, &mut d2, &mut g2, &mut b2, &mut s2);
            assert_eq!((d1, g1, b1, s1), (d2, g2, b2, s2), "{simd}");
        }
    }
}

/// A norm backward's residual add and column sums give the bits of doing them apart: an
/// add of the residual after it, and [`column_sums`] of the result.
#[test]
fn fused_residual_and_column_sums_match_separate_passes() {
    let (rows, h) = (13, 40);
    let u: Vec<f32> = (0..3 * rows * h)
        .map(|i| ((i as f32) * 0.377).sin() * 2.0)
        .collect();
    let (dy, rest) = u.split_at(rows * h);
    let (xhat, residual) = rest.split_at(rows * h);
    let gamma: Vec<f32> = (0..h).map(|j| 0.5 + j as f32 * 0.03).collect();
    let rstd: Vec<f32> = (0..rows).map(|r| 0.7 + r as f32 * 0.1).collect();
    for simd in Simd::ALL.into_iter().filter(|s| s.is_supported()) {
        for rms in [false, true] {
            let run = |res: &[f32], sums: &mut [f32]| {
                let (mut dx, mut dg, mut db) = (vec![0.0; rows * h], vec![0.0; h], vec![0.0; h]);
                if rms {
                    rmsnorm_backward(simd, dy, xhat, &rstd, &gamma, res, &mut dx, &mut dg, sums);
                } else {
                    layernorm_backward(
                        simd, dy, xhat, &rstd, &gamma, res, &mut dx, &mut dg, &mut db, sums,
                    );
                }
                (dx, dg, db)
            };
            let (mut apart, dg, db) = run(&[], &mut []);
            add(simd, &mut apart, residual);
            let mut apart_sums = vec![0.0; h];
            column_sums(simd, &mut apart_sums, &apart);
            let mut sums = vec![0.0; h];
            let fused = run(residual, &mut sums);
            assert_eq!(fused, (apart.clone(), dg, db), "{simd} rms {rms}");
            assert_eq!(sums, apart_sums, "{simd} rms {rms}");
            // The fused sums are not the sums of the gradient without the residual.
            let mut without = vec![0.0; h];
            run(&[], &mut without);
            assert_ne!(without, sums);
        }
    }
}

#[test]
fn every_simd_build_gives_the_baseline_bits_for_llama_kernels() {
    let u: Vec<f32> = (0..1044)
        .map(|i| ((i as f32) * 0.613).sin() * 3.0)
        .collect();
    let (h, f) = (29, 18);
    let rows = u.len() / (2 * f);
    let g: Vec<f32> = u[..h].iter().map(|v| 1.0 + v * 0.1).collect();
    let n = rows * h;
    let rope = RopeShape {
        heads: 3,
        head_dim: 6,
        seq_len: 5,
    };
    let trig: Vec<f32> = (0..15).map(|i| (i as f32 * 0.3).cos()).collect();
    for simd in Simd::ALL.into_iter().filter(|s| s.is_supported()) {
        let (mut y1, mut x1, mut r1) = (vec![0.0; n], vec![0.0; n], vec![0.0; rows]);
        let (mut y2, mut x2, mut r2) = (y1.clone(), x1.clone(), r1.clone());
        rmsnorm_forward(simd, &u[..n], &g, 1e-5, &mut y1, &mut x1, &mut r1);
        portable::rmsnorm_forward(&u[..n], &g, 1e-5, &mut y2, &mut x2, &mut r2);
        assert_eq!((&y1, &x1, &r1), (&y2, &x2, &r2), "{simd}");
        for (res, sums) in [(&[][..], 0), (&u[u.len() - n..], h)] {
            let (mut d1, mut g1, mut s1) = (vec![0.0; n], vec![0.0; h], vec![0.0; sums]);
            let (mut d2, mut g2, mut s2) = (d1.clone(), g1.clone(), s1.clone());
            rmsnorm_backward(simd, &u[..n], &x1, &r1, &g, res, &mut d1, &mut g1, &mut s1);
            portable::rmsnorm_backward(&u[..n], &x1, &r1, &g, res, &mut d2, &mut g2, &mut s2);
            assert_eq!((d1, g1, s1), (d2, g2, s2), "{simd}");
        }
        let (mut a, mut b) = (vec![0.0; rows * f], vec![0.0; rows * f]);
        swiglu_forward(simd, &u, f, &mut a);
        portable::swiglu_forward(&u, f, &mut b);
        assert_eq!(a, b, "{simd}");
        let (mut da, mut db) = (vec![0.0; u.len()], vec![0.0; u.len()]);
        swiglu_backward(simd, &u, f, &a, &mut da);
        portable::swiglu_backward(&u, f, &a, &mut db);
        assert_eq!(da, db, "{simd}");
        for inverse in [false, true] {
            let (mut ra, mut rb) = (u.clone(), u.clone());
            rope_kernel(simd, &mut ra, rope, &trig, inverse);
            portable::rope(&mut rb, 36, 2, rope, &trig, &trig, inverse);
            assert_eq!(ra, rb, "{simd}");
        }
    }
}

fn rope_kernel(simd: Simd, x: &mut [f32], shape: RopeShape, trig: &[f32], inverse: bool) {
    rope(simd, x, 36, 2, shape, trig, trig, inverse);
}

#[test]
fn rotary_positions_rotate_back_and_keep_norms() {
    let rope_shape = RopeShape {
        heads: 2,
        head_dim: 4,
        seq_len: 3,
    };
    let angles: Vec<f32> = (0..6).map(|i| 0.4 * i as f32 + 0.1).collect();
    let (cos, sin): (Vec<f32>, Vec<f32>) = angles.iter().map(|a| (a.cos(), a.sin())).unzip();
    let x: Vec<f32> = (0..60).map(|i| ((i as f32) * 0.77).sin()).collect();
    let mut y = x.clone();
    portable::rope(&mut y, 10, 0, rope_shape, &cos, &sin, false);
    // Columns past the rotated heads are untouched; each pair keeps its length.
    for (r, (xr, yr)) in x.chunks(10).zip(y.chunks(10)).enumerate() {
        assert_eq!(xr[8..], yr[8..]);
        let pos = r % 3;
        for head in 0..2 {
            for j in 0..2 {
                let (a, b) = (xr[head * 4 + j], xr[head * 4 + j + 2]);
                let (c, s) = (cos[pos * 2 + j], sin[pos * 2 + j]);
                assert_eq!(yr[head * 4 + j], a * c - b * s);
                assert_eq!(yr[head * 4 + j + 2], b * c + a * s);
            }
        }
    }
    portable::rope(&mut y, 10, 0, rope_shape, &cos, &sin, true);
    for (a, b) in x.iter().zip(&y) {
        assert!((a - b).abs() < 1e-6);
    }
}

/// A norm that adds a bias to its input rows after normalizing them gives the plain norm's
/// outputs and, in `x`, the bits of a separate add — at every level.
#[test]
fn a_norm_then_bias_matches_the_norm_and_a_separate_add() {
    let (rows, h) = (11, 48);
    let u: Vec<f32> = (0..rows * h + 2 * h)
        .map(|i| ((i as f32) * 0.291).cos() * 3.0)
        .collect();
    let (x, rest) = u.split_at(rows * h);
    let (gamma, bias) = rest.split_at(h);
    for simd in Simd::ALL.into_iter().filter(|s| s.is_supported()) {
        for rms in [false, true] {
            let norm = |x: &[f32]| {
                let (mut y, mut xh, mut r) =
                    (vec![0.0; rows * h], vec![0.0; rows * h], vec![0.0; rows]);
                if rms {
                    rmsnorm_forward(simd, x, gamma, 1e-5, &mut y, &mut xh, &mut r);
                } else {
                    layernorm_forward(simd, x, gamma, bias, 1e-5, &mut y, &mut xh, &mut r);
                }
                (y, xh, r)
            };
            let want = norm(x);
            let mut want_x = x.to_vec();
            add_with_bias(simd, &mut want_x, &vec![0.0; rows * h], bias);
            for portable_too in [false, true] {
                let mut got_x = x.to_vec();
                let (mut y, mut xh, mut r) =
                    (vec![0.0; rows * h], vec![0.0; rows * h], vec![0.0; rows]);
                match (rms, portable_too) {
                    (false, false) => layernorm_forward_then_bias(
                        simd, &mut got_x, gamma, bias, 1e-5, bias, &mut y, &mut xh, &mut r,
                    ),
                    (false, true) => portable::layernorm_forward_then_bias(
                        &mut got_x, gamma, bias, 1e-5, bias, &mut y, &mut xh, &mut r,
                    ),
                    (true, false) => rmsnorm_forward_then_bias(
                        simd, &mut got_x, gamma, 1e-5, bias, &mut y, &mut xh, &mut r,
                    ),
                    (true, true) => portable::rmsnorm_forward_then_bias(
                        &mut got_x, gamma, 1e-5, bias, &mut y, &mut xh, &mut r,
                    ),
                }
                assert_eq!(
                    (&y, &xh, &r),
                    (&want.0, &want.1, &want.2),
                    "{simd} rms {rms}"
                );
                assert_eq!(got_x, want_x, "{simd} rms {rms}");
            }
            // Without a bias the input is left as it was.
            let mut same = x.to_vec();
            let (mut y, mut xh, mut r) =
                (vec![0.0; rows * h], vec![0.0; rows * h], vec![0.0; rows]);
            rmsnorm_forward_then_bias(simd, &mut same, gamma, 1e-5, &[], &mut y, &mut xh, &mut r);
            assert_eq!(same, x);
        }
    }
}
