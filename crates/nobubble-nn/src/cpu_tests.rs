//! CPU backend checks: products against a naive f64 product at every SIMD level and thread
//! count, softmax masking, cross-entropy.

use super::*;
use crate::testutil::random_tensor;

fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0f64;
            for p in 0..k {
                s += a[i * k + p] as f64 * b[p * n + j] as f64;
            }
            c[i * n + j] = s as f32;
        }
    }
    c
}

#[test]
fn matmul_matches_naive_including_transposed_views_and_accumulate() {
    let be = CpuBackend::single_thread();
    let (m, k, n) = (7, 5, 3);
    let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
    let at = Tensor::from_vec(&[m, k], a.clone()).unwrap();
    let bt = Tensor::from_vec(&[k, n], b.clone()).unwrap();
    let mut c = Tensor::zeros(&[m, n]);
    be.matmul(c.mat_mut(), at.mat(), bt.mat(), 1.0, false);
    let want = naive(&a, &b, m, k, n);
    for (x, y) in c.data().iter().zip(&want) {
        assert!((x - y).abs() < 1e-5);
    }
    // accumulate: c += 2·a·b  → 3·want
    be.matmul(c.mat_mut(), at.mat(), bt.mat(), 2.0, true);
    for (x, y) in c.data().iter().zip(&want) {
        assert!((x - 3.0 * y).abs() < 1e-4);
    }
    // (bᵀ aᵀ) = (a b)ᵀ
    let mut ct = Tensor::zeros(&[n, m]);
    be.matmul(ct.mat_mut(), bt.mat().t(), at.mat().t(), 1.0, false);
    for i in 0..m {
        for j in 0..n {
            assert!((ct.data()[j * m + i] - want[i * n + j]).abs() < 1e-5);
        }
    }
}

#[test]
fn every_simd_level_multiplies_correctly_and_threads_do_not_change_bits() {
    // Odd sizes exercise every edge micro-kernel; a strided (transposed) operand too.
    let (m, k, n) = (131, 257, 97); // above gemm's threading threshold
    let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
    let at = Tensor::from_vec(&[m, k], a.clone()).unwrap();
    let bt = Tensor::from_vec(
        &[n, k],
        (0..n * k).map(|i| b[(i % k) * n + i / k]).collect(),
    )
    .unwrap();
    let want = naive(&a, &b, m, k, n);
    let mut levels = 0;
    for simd in Simd::ALL.into_iter().filter(|s| s.is_supported()) {
        let mut one = Tensor::zeros(&[m, n]);
        let be = CpuBackend::single_thread().with_simd(simd).unwrap();
        assert!(be.describe().contains(simd.name()));
        be.matmul(one.mat_mut(), at.mat(), bt.mat().t(), 1.0, false);
        for (x, y) in one.data().iter().zip(&want) {
            assert!((x - y).abs() < 2e-4, "{simd}: {x} vs {y}");
        }
        let mut two = Tensor::zeros(&[m, n]);
        let be2 = CpuBackend::with_threads(2).with_simd(simd).unwrap();
        be2.matmul(two.mat_mut(), at.mat(), bt.mat().t(), 1.0, false);
        assert_eq!(one.data(), two.data(), "{simd}: 2 threads changed the bits");
        levels += 1;
    }
    assert!(levels >= 1);
    if !Simd::Avx512.is_supported() {
        assert!(CpuBackend::single_thread().with_simd(Simd::Avx512).is_err());
    }
}

#[test]
fn causal_softmax_masks_and_normalizes() {
    let be = CpuBackend::single_thread();
    let mut s = vec![1.0, 2.0, 3.0, 0.5, -1.0, 7.0, 0.0, 0.0, 0.0];
    be.causal_softmax(&mut s, 3, 0);
    assert_eq!(&s[..3], &[1.0, 0.0, 0.0]);
    assert_eq!(s[5], 0.0);
    let e = (0.5f32).exp() / ((0.5f32).exp() + (-1.0f32).exp());
    assert!((s[3] - e).abs() < 1e-6);
    assert!((s[6..].iter().sum::<f32>() - 1.0).abs() < 1e-6);
}

#[test]
fn cross_entropy_of_uniform_logits_is_ln_vocab() {
    let be = CpuBackend::single_thread();
    let logits = Tensor::zeros(&[4, 256]);
    let (loss, probs) = be.cross_entropy_forward(&logits, &[0, 1, 2, 255]);
    assert!((loss - (256f32).ln()).abs() < 1e-5);
    assert!((probs.data()[0] - 1.0 / 256.0).abs() < 1e-7);
}

/// The GELU backward that also sums the bias gradient gives the bits of the kernel followed
/// by `accumulate_column_sums`, on one thread and two, with rows that do not fill the last
/// block of 64 and a bias gradient that already holds a value.
#[test]
fn gelu_backward_sums_the_bias_gradient_as_the_column_sums_do() {
    // Enough elements (over 64 Ki) that two threads split the blocks.
    let (rows, cols) = (300, 256);
    let values = |seed: f32| -> Vec<f32> {
        (0..rows * cols)
            .map(|i| ((i as f32 + seed) * 0.173).sin() * 3.0)
            .collect()
    };
    let u = Tensor::from_vec(&[rows, cols], values(1.0)).unwrap();
    let dy = Tensor::from_vec(&[rows, cols], values(2.0)).unwrap();
    let bias: Vec<f32> = (0..cols).map(|j| j as f32 * 0.01 - 0.2).collect();
    let start: Vec<f32> = (0..cols).map(|j| j as f32 * 0.5).collect();
    for be in [CpuBackend::single_thread(), CpuBackend::with_threads(2)] {
        let mut want = dy.clone();
        be.gelu_backward(&u, &bias, &mut want, &mut []);
        let mut want_sums = start.clone();
        be.accumulate_column_sums(&mut want_sums, &want);
        let mut got = dy.clone();
        let mut got_sums = start.clone();
        be.gelu_backward(&u, &bias, &mut got, &mut got_sums);
        assert_eq!(got.data(), want.data(), "{be:?}");
        assert_eq!(got_sums, want_sums, "{be:?}");
        assert_ne!(got_sums, start, "the sums were added");
    }
}

/// At a width whose rows would start 2 KiB apart, GELU's output is stored with padded rows:
/// each row has the bits of the kernel on that row alone, on one thread and two, the
/// padding is counted in the bytes held, and the rows read back through `mat`.
#[test]
fn gelu_output_rows_are_padded_where_they_would_alias_and_keep_their_bits() {
    for (rows, cols, padded) in [(300, 512, true), (300, 1024, true), (70, 256, false)] {
        let u: Vec<f32> = (0..rows * cols)
            .map(|i| ((i as f32) * 0.173).sin() * 3.0)
            .collect();
        let bias: Vec<f32> = (0..cols).map(|j| j as f32 * 0.01 - 0.2).collect();
        let u = Tensor::from_vec(&[rows, cols], u).unwrap();
        for be in [CpuBackend::single_thread(), CpuBackend::with_threads(2)] {
            let y = be.gelu_forward(&u, &bias);
            let stride = if padded { cols + 16 } else { cols };
            assert_eq!(y.size_bytes(), 4 * rows * stride, "{be:?}, {cols} columns");
            assert_eq!((y.rows(), y.cols(), y.len()), (rows, cols, rows * cols));
            let mut out = Tensor::zeros(&[rows, cols]);
            // Reading through `mat`, as the products do: an identity product copies it.
            let mut eye = Tensor::zeros(&[cols, cols]);
            (0..cols).for_each(|j| eye.data_mut()[j * cols + j] = 1.0);
            be.matmul(out.mat_mut(), y.mat(), eye.mat(), 1.0, false);
            for r in [0, 1, rows / 2, rows - 1] {
                let mut want = vec![0.0; cols];
                crate::kernels::gelu_forward(
                    be.simd(),
                    &u.data()[r * cols..][..cols],
                    &bias,
                    &mut want,
                );
                assert_eq!(
                    &out.data()[r * cols..][..cols],
                    &want[..],
                    "{be:?}, row {r}"
                );
            }
            // The backward into a padded gradient (fc2's input gradient is one): the bits
            // of the unpadded backward, row for row, and the same bias-gradient sums.
            let dy: Vec<f32> = (0..rows * cols)
                .map(|i| ((i as f32) * 0.31).cos())
                .collect();
            let mut flat = Tensor::from_vec(&[rows, cols], dy.clone()).unwrap();
            let mut flat_sums = vec![0.5; cols];
            be.gelu_backward(&u, &bias, &mut flat, &mut flat_sums);
            let mut pad = Tensor::for_overwrite_padded(rows, cols);
            let stride = pad.row_stride();
            for (d, s) in pad.storage_mut().chunks_mut(stride).zip(dy.chunks(cols)) {
                d[..cols].copy_from_slice(s);
            }
            let mut pad_no_sums = pad.clone();
            let mut pad_sums = vec![0.5; cols];
            be.gelu_backward(&u, &bias, &mut pad, &mut pad_sums);
            be.gelu_backward(&u, &bias, &mut pad_no_sums, &mut []);
            assert_eq!(pad_sums, flat_sums, "{be:?}, {cols} columns");
            for t in [&pad, &pad_no_sums] {
                be.matmul(out.mat_mut(), t.mat(), eye.mat(), 1.0, false);
                assert_eq!(out.data(), flat.data(), "{be:?}, {cols} columns");
            }
        }
    }
}

#[test]
fn a_product_on_a_lent_core_has_the_same_bits() {
    // Large enough to borrow (`CpuBackend::large_product_loan`).
    let (m, k, n) = (512, 256, 384);
    let (a, b) = (
        random_tensor(&[m, k], 1.0, 1),
        random_tensor(&[k, n], 1.0, 2),
    );
    let lender = crate::lending::CoreLender::new(2).unwrap();
    let alone = CpuBackend::single_thread();
    let lent = CpuBackend::single_thread().with_lender(Some(lender.clone()));
    let mut want = Tensor::zeros(&[m, n]);
    alone.matmul(want.mat_mut(), a.mat(), b.mat(), 0.5, false);
    let mut got = Tensor::zeros(&[m, n]);
    lent.matmul(got.mat_mut(), a.mat(), b.mat(), 0.5, false);
    assert_eq!(
        lent.borrowed_products(),
        0,
        "no rank waits: nothing to borrow"
    );
    let offer = lender.offer();
    lent.matmul(got.mat_mut(), a.mat(), b.mat(), 0.5, false);
    assert_eq!(lent.borrowed_products(), 1);
    assert_eq!(got.data(), want.data(), "a lent core changed the bits");
    // Small products keep to their own core.
    let (sa, sb) = (Tensor::zeros(&[8, k]), Tensor::zeros(&[k, 8]));
    let mut small = Tensor::zeros(&[8, 8]);
    lent.matmul(small.mat_mut(), sa.mat(), sb.mat(), 1.0, false);
    assert_eq!(lent.borrowed_products(), 1);
    // Several depth blocks (gemm's kc), odd sizes, a transposed operand, accumulating: the
    // depth is still summed in one order on a lent core.
    let (m, k, n) = (301, 2500, 263);
    let (a, bt) = (
        random_tensor(&[m, k], 1.0, 3),
        random_tensor(&[n, k], 1.0, 4),
    );
    let start = random_tensor(&[m, n], 1.0, 5);
    let mut want = start.clone();
    alone.matmul(want.mat_mut(), a.mat(), bt.mat().t(), 1.0, true);
    let mut got = start;
    lent.matmul(got.mat_mut(), a.mat(), bt.mat().t(), 1.0, true);
    assert_eq!(lent.borrowed_products(), 2);
    assert_eq!(
        got.data(),
        want.data(),
        "a lent core changed the bits of a deep product"
    );
    drop(offer);
}

#[test]
fn row_wise_kernels_and_tasks_on_a_lent_core_have_the_same_bits() {
    use crate::backend::NormGradExtras;
    let lender = crate::lending::CoreLender::new(2).unwrap();
    let alone = CpuBackend::single_thread();
    let lent = CpuBackend::single_thread().with_lender(Some(lender.clone()));
    // GELU over 517 rows of 1000 (two uneven row groups), with a bias.
    let u = random_tensor(&[517, 1000], 2.0, 11);
    let bias = random_tensor(&[1000], 0.5, 12);
    let want = alone.gelu_forward(&u, bias.data());
    // A norm backward with every extra (its blocks of rows in parallel).
    let (rows, h) = (1100, 256);
    let (dy, xhat, res) = (
        random_tensor(&[rows, h], 1.0, 13),
        random_tensor(&[rows, h], 1.0, 14),
        random_tensor(&[rows, h], 1.0, 15),
    );
    let rstd: Vec<f32> = (0..rows).map(|r| 0.5 + (r % 7) as f32 * 0.1).collect();
    let gamma = random_tensor(&[h], 1.0, 16);
    let extras = NormGradExtras {
        residual: Some(&res),
        column_sums: true,
    };
    let norm = |be: &CpuBackend| be.layernorm_backward(&dy, &xhat, &rstd, gamma.data(), extras);
    let want_norm = norm(&alone);
    // Tasks, each writing its own part.
    fn tasks(out: &mut [usize]) -> Vec<crate::backend::Task<'_>> {
        out.iter_mut()
            .enumerate()
            .map(|(i, o)| -> crate::backend::Task<'_> {
                Box::new(move |be: &dyn Backend| *o = 10 * i + be.threads())
            })
            .collect()
    }
    let offer = lender.offer();
    assert_eq!(lent.gelu_forward(&u, bias.data()).data(), want.data());
    assert_eq!(lent.borrowed_row_work(), 1);
    let got_norm = norm(&lent);
    assert_eq!(lent.borrowed_row_work(), 2);
    assert_eq!(got_norm.dx.data(), want_norm.dx.data());
    assert_eq!(
        (&got_norm.dgamma, &got_norm.dbeta, &got_norm.dx_column_sums),
        (
            &want_norm.dgamma,
            &want_norm.dbeta,
            &want_norm.dx_column_sums
        )
    );
    let mut out = vec![0; 8];
    lent.run_tasks(tasks(&mut out));
    assert_eq!(lent.borrowed_row_work(), 3);
    assert_eq!(
        out,
        (0..8).map(|i| 10 * i + 1).collect::<Vec<_>>(),
        "tasks run single-threaded"
    );
    // Small work keeps to its own core.
    lent.gelu_forward(&random_tensor(&[4, 64], 1.0, 17), &[]);
    assert_eq!(lent.borrowed_row_work(), 3);
    drop(offer);
    // Nothing offered: nothing borrowed.
    lent.run_tasks(tasks(&mut out));
    assert_eq!(lent.borrowed_row_work(), 3);
    assert_eq!(lent.borrowed_products(), 0);
}
