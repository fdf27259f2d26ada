//! Matrix products too small for `gemm`'s packing to pay: the attention core's per-head
//! blocks (a 16-row block of queries against up to `s` keys, `d` = 64 deep at h 256). `gemm`
//! runs them at about half its speed on large products, because each call packs its
//! operands and dispatches for a few microseconds of arithmetic; this kernel runs register
//! tiles over operands the caller packed once per head ([`pack`]).
//!
//! At the portable level on x86-64 each `mul_add` is a libm call (no FMA instruction in the
//! baseline target): correct, slow, and only run when forced (`NOBUBBLE_SIMD=portable`).
//!
//! Every output element is `acc = Σ_k a[i,k]·b[k,j]` summed in order of `k` with fused
//! multiply-adds from 0, then `scale·acc`, then added to `dst` when accumulating. That is
//! the same per element whatever the tile it falls in, and the same at every SIMD level
//! (`mul_add` is exactly rounded everywhere), so any split of a product into row or column
//! blocks — a decoded token's single row, a causal block, threads — gives the same bits.

use crate::simd::Simd;
use crate::tensor::{check_product_shapes, MatMut, MatRef};

/// Columns of an AVX2 (and portable) tile: two AVX2 vectors. The AVX-512 tile is larger
/// (`x86::product_avx512`).
const NR: usize = 16;
/// Rows of an AVX2 tile: 4 × 2 AVX2 accumulators plus the loads fit in 16 registers.
const MR: usize = 4;

/// `dst = (accumulate ? dst : 0) + scale · a·b`, with `b`'s and `dst`'s rows contiguous
/// (unit column stride); `a` may have any strides (a transposed view reads in place).
pub(crate) fn small_matmul(
    simd: Simd,
    dst: MatMut<'_>,
    a: MatRef<'_>,
    b: MatRef<'_>,
    scale: f32,
    accumulate: bool,
) {
    check_product_shapes(&dst, &a, &b);
    assert!(
        b.col_stride == 1 && dst.col_stride == 1,
        "small_matmul reads b's rows and writes dst's rows contiguously"
    );
    let p = Product {
        m: dst.rows,
        n: dst.cols,
        k: a.cols,
        dst_rs: dst.row_stride as usize,
        a_rs: a.row_stride as usize,
        a_cs: a.col_stride as usize,
        b_rs: b.row_stride as usize,
        scale,
        accumulate,
    };
    if p.m == 0 || p.n == 0 {
        return;
    }
    let dst = &mut dst.data[dst.offset..];
    // An empty operand's view may start at its slice's end.
    let a = a.data.get(a.offset..).unwrap_or_default();
    let b = b.data.get(b.offset..).unwrap_or_default();
    #[cfg(target_arch = "x86_64")]
    if simd != Simd::Portable && simd.is_supported() && p.k > 0 {
        p.check_bounds(dst.len(), a.len(), b.len());
        // SAFETY: both non-portable levels include AVX2 and FMA, the AVX-512 one also
        // AVX-512F, and this one is supported by this CPU (checked); with k > 0 every element
        // the kernels address lies inside the slices (checked just above).
        return unsafe {
            if simd == Simd::Avx512 {
                x86::product_avx512(dst, a, b, &p)
            } else {
                x86::product(dst, a, b, &p)
            }
        };
    }
    let _ = simd;
    product(dst, a, b, &p)
}

/// `dst = srcᵀ`, row-major `[src.cols, src.rows]`, and `src` copied row by row when `transpose`
/// is false (`[src.rows, src.cols]`): an operand laid out so that [`small_matmul`] reads
/// its rows contiguously, and in few cache sets (a head's rows inside the fused QKV rows lie
/// 3·h apart, a stride that maps them onto a handful of the L1 cache's sets).
///
/// `bias` (one value per column of `src`, or empty) is added to the packed copy while it is
/// in L1: the attention core's Q, K and V get the QKV projection's bias here instead of in a
/// pass over the whole product's output, and each element is `src + bias` rounded once, as
/// that pass gave.
pub(crate) fn pack(simd: Simd, src: MatRef<'_>, bias: &[f32], dst: &mut [f32], transpose: bool) {
    let (rows, cols) = (src.rows, src.cols);
    assert!(dst.len() >= rows * cols, "pack: destination too short");
    assert!(
        bias.is_empty() || bias.len() == cols,
        "pack: a bias of {} values for {cols} columns",
        bias.len()
    );
    if rows == 0 || cols == 0 {
        return;
    }
    copy_or_transpose(simd, src, dst, transpose);
    if bias.is_empty() {
        return;
    }
    if transpose {
        for (out, &b) in dst.chunks_exact_mut(rows).zip(bias) {
            out.iter_mut().for_each(|x| *x += b);
        }
    } else {
        for out in dst.chunks_exact_mut(cols).take(rows) {
            crate::kernels::add(simd, out, bias);
        }
    }
}

/// [`pack`] without the bias.
fn copy_or_transpose(simd: Simd, src: MatRef<'_>, dst: &mut [f32], transpose: bool) {
    let (rows, cols) = (src.rows, src.cols);
    let (rs, cs) = (src.row_stride as usize, src.col_stride as usize);
    let at = |r: usize, c: usize| src.data[src.offset + r * rs + c * cs];
    if !transpose {
        for (r, out) in dst.chunks_exact_mut(cols).take(rows).enumerate() {
            if cs == 1 {
                out.copy_from_slice(&src.data[src.offset + r * rs..][..cols]);
            } else {
                for (c, o) in out.iter_mut().enumerate() {
                    *o = at(r, c);
                }
            }
        }
        return;
    }
    let (full_r, full_c) = (rows - rows % 8, cols - cols % 8);
    #[cfg(target_arch = "x86_64")]
    if simd != Simd::Portable && simd.is_supported() && cs == 1 && full_r > 0 && full_c > 0 {
        assert!(src.offset + (full_r - 1) * rs + full_c <= src.data.len());
        for r0 in (0..full_r).step_by(8) {
            for c0 in (0..full_c).step_by(8) {
                // SAFETY: AVX2 is part of both non-portable levels, and this one is supported
                // (checked above); the block's source rows r0..r0+8, columns c0..c0+8 are inside
                // the view (asserted above), its destination rows c0..c0+8, columns
                // r0..r0+8 inside `dst` (rows·cols long).
                unsafe {
                    let from = src.data.as_ptr().add(src.offset + r0 * rs + c0);
                    x86::transpose8(from, rs, dst.as_mut_ptr().add(c0 * rows + r0), rows);
                }
            }
        }
        for r in 0..rows {
            let start = if r < full_r { full_c } else { 0 };
            for c in start..cols {
                dst[c * rows + r] = at(r, c);
            }
        }
        return;
    }
    let _ = (simd, full_r, full_c);
    for r in 0..rows {
        for c in 0..cols {
            dst[c * rows + r] = at(r, c);
        }
    }
}

/// One product's shape and strides (elements), its operands starting at index 0.
#[derive(Clone, Copy, Debug)]
struct Product {
    m: usize,
    n: usize,
    k: usize,
    dst_rs: usize,
    a_rs: usize,
    a_cs: usize,
    b_rs: usize,
    scale: f32,
    accumulate: bool,
}

impl Product {
    /// Panics unless the last element of `dst`, `a` and `b` the product addresses lies inside
    /// slices of these lengths (the views were checked at construction; this is the kernel's
    /// own guard before it reads through pointers).
    fn check_bounds(&self, dst: usize, a: usize, b: usize) {
        let (m, n, k) = (self.m, self.n, self.k);
        assert!(
            (m - 1) * self.dst_rs + n <= dst,
            "small_matmul: dst too short"
        );
        if k > 0 {
            assert!(
                (m - 1) * self.a_rs + (k - 1) * self.a_cs < a,
                "small_matmul: a too short"
            );
            assert!((k - 1) * self.b_rs + n <= b, "small_matmul: b too short");
        }
    }
}

/// The AVX2 tile, and the AVX-512 one (twice the lanes per fused multiply-add; on a CPU with
/// two 512-bit FMA units, twice the peak). Both compute each element as the portable tile
/// does, so every level gives the same bits.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{tiled, Product, MR};
    use std::arch::x86_64::*;

    /// Rows of an AVX-512 tile: 8 rows × 2 vectors of 16 columns are 16 accumulators, and
    /// per step of `k` ten loads (two of `b`'s row, eight broadcasts of `a`) feed sixteen
    /// fused multiply-adds, so the FMA units, not the loads, set the pace.
    const MR_512: usize = 8;
    /// Columns of an AVX-512 tile.
    const NR_512: usize = 32;

    /// [`super::product`] in AVX-512 tiles of up to 8 × 32: column panels outer (one panel of
    /// `b` stays in L1 across the row tiles), a panel's last columns masked, the rows past
    /// the last whole 8 one at a time.
    ///
    /// # Safety
    /// The CPU must support AVX-512F, AVX2 and FMA, and [`Product::check_bounds`] must hold
    /// for the slices.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn product_avx512(dst: &mut [f32], a: &[f32], b: &[f32], p: &Product) {
        let full_rows = p.m - p.m % MR_512;
        for j0 in (0..p.n).step_by(NR_512) {
            let cols = NR_512.min(p.n - j0);
            // SAFETY (both loops): every tile lies inside the product (rows i0..i0+R ≤ m,
            // columns j0..j0+cols ≤ n), whose addressed elements the caller checked;
            // AVX-512F as the caller's.
            unsafe {
                for i0 in (0..full_rows).step_by(MR_512) {
                    if cols > 16 {
                        tile_avx512::<MR_512, 2>(dst, a, b, p, i0, j0, cols);
                    } else {
                        tile_avx512::<MR_512, 1>(dst, a, b, p, i0, j0, cols);
                    }
                }
                for i0 in full_rows..p.m {
                    if cols > 16 {
                        tile_avx512::<1, 2>(dst, a, b, p, i0, j0, cols);
                    } else {
                        tile_avx512::<1, 1>(dst, a, b, p, i0, j0, cols);
                    }
                }
            }
        }
    }

    /// Lanes `0..cols` (of 16) as a mask; none when `cols` is 0.
    #[inline(always)]
    fn lanes(cols: usize) -> __mmask16 {
        if cols >= 16 {
            0xffff
        } else {
            ((1u32 << cols) - 1) as __mmask16
        }
    }

    /// Rows `i0..i0+R`, columns `j0..j0+cols` (`cols` ≤ 16·V) in `R × V` AVX-512
    /// accumulators. Masked loads and stores keep to the tile's columns: lanes past them
    /// read nothing (a masked load does not fault) and are never written.
    ///
    /// # Safety
    /// AVX-512F must be supported; the tile must lie inside the product and the product's
    /// addressed elements inside the slices.
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn tile_avx512<const R: usize, const V: usize>(
        dst: &mut [f32],
        a: &[f32],
        b: &[f32],
        p: &Product,
        i0: usize,
        j0: usize,
        cols: usize,
    ) {
        let masks: [__mmask16; V] = std::array::from_fn(|v| lanes(cols.saturating_sub(16 * v)));
        // SAFETY (whole body): the caller guarantees the tile and `k` lie inside the
        // product, whose addressed elements lie inside the slices; the masks keep every
        // access to columns j0..j0+cols.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); V]; R];
            let ap = a.as_ptr().add(i0 * p.a_rs);
            let bp = b.as_ptr().add(j0);
            for kk in 0..p.k {
                let row = bp.add(kk * p.b_rs);
                let bv: [__m512; V] =
                    std::array::from_fn(|v| _mm512_maskz_loadu_ps(masks[v], row.add(16 * v)));
                let col = ap.add(kk * p.a_cs);
                for (r, row_acc) in acc.iter_mut().enumerate() {
                    let x = _mm512_set1_ps(*col.add(r * p.a_rs));
                    for (s, &y) in row_acc.iter_mut().zip(&bv) {
                        *s = _mm512_fmadd_ps(x, y, *s);
                    }
                }
            }
            let scale = _mm512_set1_ps(p.scale);
            for (r, row_acc) in acc.iter().enumerate() {
                let out = dst.as_mut_ptr().add((i0 + r) * p.dst_rs + j0);
                for (v, &sum) in row_acc.iter().enumerate() {
                    let o = out.add(16 * v);
                    let mut y = _mm512_mul_ps(scale, sum);
                    if p.accumulate {
                        y = _mm512_add_ps(_mm512_maskz_loadu_ps(masks[v], o), y);
                    }
                    _mm512_mask_storeu_ps(o, masks[v], y);
                }
            }
        }
    }

    /// [`super::product`] with the full tiles in AVX2 registers.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA, and [`Product::check_bounds`] must hold for the
    /// slices.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn product(dst: &mut [f32], a: &[f32], b: &[f32], p: &Product) {
        tiled(dst, a, b, p, |dst, i0, j0| {
            // SAFETY: `tiled` passes whole tiles only (rows i0..i0+MR ≤ m, columns
            // j0..j0+NR ≤ n), inside the bounds the caller checked; AVX2 as the caller's.
            unsafe { full_tile(dst, a, b, p, i0, j0) }
        });
    }

    /// The 8 × 8 block at `src` (rows `src_rs` apart) transposed to `dst` (rows `dst_rs`
    /// apart), in registers.
    ///
    /// # Safety
    /// AVX2 must be supported; both blocks must lie inside their allocations.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn transpose8(src: *const f32, src_rs: usize, dst: *mut f32, dst_rs: usize) {
        // SAFETY (whole body): the caller guarantees both blocks are in bounds.
        unsafe {
            let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(src.add(i * src_rs)));
            // Pairs of rows interleaved, then pairs of pairs, then the two 128-bit halves.
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            let out = [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ];
            for (i, v) in out.into_iter().enumerate() {
                _mm256_storeu_ps(dst.add(i * dst_rs), v);
            }
        }
    }

    /// Rows `i0..i0+4`, columns `j0..j0+16`: per step of `k`, two loads of `b`'s row,
    /// four broadcasts of `a`, eight fused multiply-adds.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn full_tile(dst: &mut [f32], a: &[f32], b: &[f32], p: &Product, i0: usize, j0: usize) {
        // SAFETY (whole body): the caller guarantees the tile and `k` lie inside the
        // product, whose addressed elements lie inside the slices.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; MR];
            let ap = a.as_ptr().add(i0 * p.a_rs);
            let bp = b.as_ptr().add(j0);
            for kk in 0..p.k {
                let row = bp.add(kk * p.b_rs);
                let (b0, b1) = (_mm256_loadu_ps(row), _mm256_loadu_ps(row.add(8)));
                let col = ap.add(kk * p.a_cs);
                for (r, row_acc) in acc.iter_mut().enumerate() {
                    let x = _mm256_broadcast_ss(&*col.add(r * p.a_rs));
                    row_acc[0] = _mm256_fmadd_ps(x, b0, row_acc[0]);
                    row_acc[1] = _mm256_fmadd_ps(x, b1, row_acc[1]);
                }
            }
            let scale = _mm256_set1_ps(p.scale);
            for (r, row_acc) in acc.iter().enumerate() {
                let out = dst.as_mut_ptr().add((i0 + r) * p.dst_rs + j0);
                for (half, &sum) in row_acc.iter().enumerate() {
                    let o = out.add(8 * half);
                    let mut v = _mm256_mul_ps(scale, sum);
                    if p.accumulate {
                        v = _mm256_add_ps(_mm256_loadu_ps(o), v);
                    }
                    _mm256_storeu_ps(o, v);
                }
            }
        }
    }
}

/// The product in tiles of `MR × NR` at the portable level.
#[inline(always)]
fn product(dst: &mut [f32], a: &[f32], b: &[f32], p: &Product) {
    tiled(dst, a, b, p, |dst, i0, j0| {
        tile::<MR, NR>(dst, a, b, p, i0, j0)
    });
}

/// The whole `MR × NR` tiles by `whole_tile(dst, i0, j0)`, column panels outer (one panel
/// of `b`, k × 16, stays in L1 across the row tiles); then the column tail in 1-wide tiles
/// and the row tail one row at a time.
#[inline(always)]
fn tiled(
    dst: &mut [f32],
    a: &[f32],
    b: &[f32],
    p: &Product,
    mut whole_tile: impl FnMut(&mut [f32], usize, usize),
) {
    let full_rows = p.m - p.m % MR;
    let full_cols = p.n - p.n % NR;
    for j0 in (0..full_cols).step_by(NR) {
        for i0 in (0..full_rows).step_by(MR) {
            whole_tile(dst, i0, j0);
        }
    }
    for i0 in (0..full_rows).step_by(MR) {
        for j0 in full_cols..p.n {
            tile::<MR, 1>(dst, a, b, p, i0, j0);
        }
    }
    for i0 in full_rows..p.m {
        for j0 in (0..full_cols).step_by(NR) {
            tile::<1, NR>(dst, a, b, p, i0, j0);
        }
        for j0 in full_cols..p.n {
            tile::<1, 1>(dst, a, b, p, i0, j0);
        }
    }
}

/// Rows `i0..i0+R`, columns `j0..j0+C` of the product, accumulated in registers.
#[inline(always)]
fn tile<const R: usize, const C: usize>(
    dst: &mut [f32],
    a: &[f32],
    b: &[f32],
    p: &Product,
    i0: usize,
    j0: usize,
) {
    let mut acc = [[0.0f32; C]; R];
    for kk in 0..p.k {
        let brow: &[f32; C] = b[kk * p.b_rs + j0..][..C].try_into().expect("C columns");
        for (r, row_acc) in acc.iter_mut().enumerate() {
            let x = a[(i0 + r) * p.a_rs + kk * p.a_cs];
            for (s, &y) in row_acc.iter_mut().zip(brow) {
                *s = x.mul_add(y, *s);
            }
        }
    }
    for (r, row_acc) in acc.iter().enumerate() {
        let out: &mut [f32; C] = (&mut dst[(i0 + r) * p.dst_rs + j0..][..C])
            .try_into()
            .expect("C columns");
        for (o, &s) in out.iter_mut().zip(row_acc) {
            let v = p.scale * s;
            *o = if p.accumulate { *o + v } else { v };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain triple loop in f64: an independent reference.
    fn naive(a: &MatRef<'_>, b: &MatRef<'_>, i: usize, j: usize) -> f64 {
        (0..a.cols)
            .map(|k| {
                let x = a.data[a.offset + i * a.row_stride as usize + k * a.col_stride as usize];
                let y = b.data[b.offset + k * b.row_stride as usize + j];
                x as f64 * y as f64
            })
            .sum()
    }

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
                (x % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// Shapes with row and column tails, a transposed `a`, scaling and accumulation,
    /// against f64 sums; and every SIMD level and every row split give the same bits.
    #[test]
    fn products_match_f64_sums_and_every_split_gives_the_same_bits() {
        let scale = 0.3;
        for (m, n, k) in [
            (1, 1, 1),
            (5, 17, 3),
            (32, 96, 64),
            (7, 33, 70),
            (4, 16, 0),
            (8, 32, 0),
            // The attention core's causal blocks (16 rows, 16·j columns) and the AVX-512
            // tile's tails: 8-row tiles and single rows, whole, masked and half panels.
            (16, 48, 64),
            (17, 112, 9),
            (9, 7, 5),
        ] {
            let av = values(m * k + 3, 1);
            let bv = values(k * (n + 5) + 2, 2);
            for transposed in [false, true] {
                let a = if transposed {
                    MatRef::new(&av, 3, m, k, 1, m as isize)
                } else {
                    MatRef::new(&av, 3, m, k, k as isize, 1)
                };
                let b = MatRef::new(&bv, 2, k, n, (n + 5) as isize, 1);
                for accumulate in [false, true] {
                    let start = values(m * n, 3);
                    // In blocks of `rows` rows and `cols` columns.
                    let run = |simd: Simd, rows: usize, cols: usize| {
                        let mut out = start.clone();
                        for r0 in (0..m).step_by(rows) {
                            let r1 = (r0 + rows).min(m);
                            let ar = MatRef::new(
                                a.data,
                                a.offset + r0 * a.row_stride as usize,
                                r1 - r0,
                                k,
                                a.row_stride,
                                a.col_stride,
                            );
                            for c0 in (0..n).step_by(cols) {
                                let c1 = (c0 + cols).min(n);
                                let bc =
                                    MatRef::new(b.data, b.offset + c0, k, c1 - c0, b.row_stride, 1);
                                let d = MatMut::new(
                                    &mut out,
                                    r0 * n + c0,
                                    r1 - r0,
                                    c1 - c0,
                                    n as isize,
                                    1,
                                );
                                small_matmul(simd, d, ar, bc, scale, accumulate);
                            }
                        }
                        out
                    };
                    let want = run(Simd::Portable, m, n);
                    for i in 0..m {
                        for j in 0..n {
                            let base = if accumulate {
                                start[i * n + j] as f64
                            } else {
                                0.0
                            };
                            let exact = base + scale as f64 * naive(&a, &b, i, j);
                            let got = want[i * n + j] as f64;
                            assert!(
                                (got - exact).abs() <= 1e-5 * (1.0 + k as f64),
                                "{got} {exact}"
                            );
                        }
                    }
                    for simd in Simd::ALL.into_iter().filter(|s| s.is_supported()) {
                        for (rows, cols) in [(1, n), (3, n), (m, n), (m, 1), (4, 16), (m, 20)] {
                            let got = run(simd, rows, cols);
                            let same = got
                                .iter()
                                .zip(&want)
                                .all(|(x, y)| x.to_bits() == y.to_bits());
                            assert!(same, "{simd}, blocks of {rows} × {cols}: other bits");
                        }
                    }
                }
            }
        }
    }

    /// A packed copy and a packed transpose hold the view's elements where `small_matmul`
    /// reads them, plus the bias of their column when there is one, for shapes with and
    /// without whole 8 × 8 blocks, at every level.
    #[test]
    fn pack_copies_and_transposes_any_view() {
        for (rows, cols) in [(70, 4), (13, 19), (16, 64), (1, 9), (0, 5), (5, 0)] {
            let (offset, stride) = (7, cols + 3);
            let data = values(offset + rows * stride + 1, 4);
            let src = MatRef::new(&data, offset, rows, cols, stride as isize, 1);
            let at = |r: usize, c: usize| data[offset + r * stride + c];
            let some_bias = values(cols, 5);
            for bias in [&[][..], &some_bias] {
                let plus = |c: usize| bias.get(c).copied().unwrap_or(0.0);
                for simd in Simd::ALL.into_iter().filter(|s| s.is_supported()) {
                    let mut copy = vec![f32::NAN; rows * cols];
                    pack(simd, src, bias, &mut copy, false);
                    let mut t = vec![f32::NAN; rows * cols];
                    pack(simd, src, bias, &mut t, true);
                    for r in 0..rows {
                        for c in 0..cols {
                            let want = at(r, c) + plus(c);
                            let what = format!("{simd} {rows}×{cols}, bias {}", bias.len());
                            assert_eq!(copy[r * cols + c], want, "{what}: copy");
                            assert_eq!(t[c * rows + r], want, "{what}: transpose");
                        }
                    }
                }
            }
        }
    }
}
