//! f32 matrix products on the `gemm` crate at a chosen [`Simd`] level.
//!
//! Why not just `gemm::gemm`: it picks its kernel from the CPU alone, and on stable Rust
//! only with its `x86-v4` feature does that include AVX-512 (`gemm` 0.18 needed nightly
//! for it). To measure and test the narrower paths on an AVX-512 machine, the AVX2 and
//! portable levels call `gemm`'s generic driver with that level's micro-kernels directly —
//! the same driver `gemm::gemm` runs, so packing, blocking and threading are identical.
//! The micro-kernel tables are public API of `gemm-f32`/`gemm-common`, pinned to the exact
//! version `gemm` uses.

use crate::simd::Simd;

/// `dst = (read_dst ? dst : 0) + beta · lhs·rhs` over strided f32 views (`gemm`'s argument
/// order: column stride first).
///
/// # Safety
/// As `gemm::gemm`: every addressed element of the three views is in bounds, `dst` does
/// not alias `lhs` or `rhs`, and `simd` is supported by this CPU.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm(
    simd: Simd,
    threads: usize,
    (m, n, k): (usize, usize, usize),
    (dst, dst_cs, dst_rs): (*mut f32, isize, isize),
    read_dst: bool,
    (lhs, lhs_cs, lhs_rs): (*const f32, isize, isize),
    (rhs, rhs_cs, rhs_rs): (*const f32, isize, isize),
    beta: f32,
) {
    // The micro-kernels want a column-oriented destination (as `gemm::gemm` arranges it):
    // a row-major product is computed as its transpose, `dstᵀ = rhsᵀ·lhsᵀ`. (Strides are
    // non-negative here: the views are built that way.)
    let ((m, n), (dst_cs, dst_rs), lhs_view, rhs_view) = if dst_cs.abs() < dst_rs.abs() {
        (
            (n, m),
            (dst_rs, dst_cs),
            (rhs, rhs_rs, rhs_cs),
            (lhs, lhs_rs, lhs_cs),
        )
    } else {
        (
            (m, n),
            (dst_cs, dst_rs),
            (lhs, lhs_cs, lhs_rs),
            (rhs, rhs_cs, rhs_rs),
        )
    };
    let (lhs, lhs_cs, lhs_rs) = lhs_view;
    let (rhs, rhs_cs, rhs_rs) = rhs_view;
    let par = if threads <= 1 {
        gemm::Parallelism::None
    } else {
        gemm::Parallelism::Rayon(threads)
    };
    macro_rules! with_kernels {
        ($simd:expr, $module:ident, $lanes:expr) => {{
            use gemm_f32::microkernel::$module::f32 as ukr;
            gemm_common::gemm::gemm_basic_generic::<
                _,
                f32,
                $lanes,
                { ukr::MR_DIV_N * $lanes },
                { ukr::NR },
                { ukr::MR_DIV_N },
                { ukr::H_M },
                { ukr::H_N },
            >(
                $simd,
                m,
                n,
                k,
                dst,
                dst_cs,
                dst_rs,
                read_dst,
                lhs,
                lhs_cs,
                lhs_rs,
                rhs,
                rhs_cs,
                rhs_rs,
                1.0,
                beta,
                false,
                false,
                false,
                |a, b, c| a * b + c,
                &ukr::UKR,
                &ukr::H_UKR,
                false,
                par,
            )
        }};
    }
    match simd {
        // `gemm::gemm` itself picks its AVX-512 kernels on a CPU with AVX-512F.
        Simd::Avx512 => gemm::gemm(
            m, n, k, dst, dst_cs, dst_rs, read_dst, lhs, lhs_cs, lhs_rs, rhs, rhs_cs, rhs_rs, 1.0,
            beta, false, false, false, par,
        ),
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => {
            use gemm_common::simd::MixedSimd;
            let v3 = <gemm_common::simd::V3 as MixedSimd<f32, f32, f32, f32>>::try_new()
                .expect("Simd::Avx2 is only selected on a CPU with AVX2 and FMA");
            with_kernels!(v3, fma, 8)
        }
        #[cfg(target_arch = "x86_64")]
        Simd::Portable => with_kernels!(gemm_common::simd::Scalar, scalar, 1),
        #[cfg(not(target_arch = "x86_64"))]
        _ => gemm::gemm(
            m, n, k, dst, dst_cs, dst_rs, read_dst, lhs, lhs_cs, lhs_rs, rhs, rhs_cs, rhs_rs, 1.0,
            beta, false, false, false, par,
        ),
    }
}
