//! A minimal dense f32 tensor: a shape and row-major storage, contiguous except for a few
//! activations whose rows are padded (see [`Tensor::for_overwrite_padded`]).
//!
//! Why not a full tensor library: the engine needs only a handful of ops, and owning
//! the type keeps every byte of saved activation visible to the memory accounting.
//! Storage is host memory today; all arithmetic goes through [`crate::backend::Backend`],
//! so a device backend changes the storage, not the layers.

/// Dense row-major f32 tensor. Matrices are 2-D `[rows, cols]`; activations are
/// `[tokens, features]` with `tokens = microbatch_size × seq_len`.
///
/// A few activations are stored with padded rows ([`Tensor::for_overwrite_padded`]); they
/// are read through [`Tensor::mat`] only, and [`Tensor::data`] refuses them.
#[derive(Debug)]
pub struct Tensor {
    shape: Vec<usize>,
    data: Vec<f32>,
    /// Elements after each row's last, never read ([`Tensor::for_overwrite_padded`]).
    row_pad: usize,
}

/// Rows whose starts lie a multiple of this many bytes apart fall into the same few L1
/// sets, and `gemm` packs a strided operand from such rows several times slower.
const ALIASING_ROW_BYTES: usize = 2048;
/// What a padded row gets: one cache line.
const ROW_PAD: usize = 16;

/// The row stride [`Tensor::for_overwrite_padded`] gives rows of `cols` elements.
pub(crate) fn padded_row_len(cols: usize) -> usize {
    let bytes = cols * std::mem::size_of::<f32>();
    if cols > 0 && bytes.is_multiple_of(ALIASING_ROW_BYTES) {
        cols + ROW_PAD
    } else {
        cols
    }
}

impl Tensor {
    /// All-zero tensor of the given shape (used for gradient accumulators and outputs).
    pub fn zeros(shape: &[usize]) -> Self {
        Tensor {
            shape: shape.to_vec(),
            data: crate::pool::zeroed(shape.iter().product()),
            row_pad: 0,
        }
    }

    /// A tensor whose every element the caller writes before reading any (outputs of
    /// matrix products and of elementwise kernels): skips the zero-fill of [`Tensor::zeros`].
    /// Its initial contents are unspecified (NaN in debug builds).
    pub(crate) fn for_overwrite(shape: &[usize]) -> Self {
        Tensor {
            shape: shape.to_vec(),
            data: crate::pool::for_overwrite(shape.iter().product()),
            row_pad: 0,
        }
    }

    /// [`Tensor::for_overwrite`] `[rows, cols]`, with each row padded by a cache line when
    /// rows would otherwise start a multiple of 2 KiB apart. For a layer input a weight
    /// gradient reads as `gemm`'s right operand: fc2's at `4h = 1024` ran at 84 GFLOP/s
    /// unpadded and 91 padded (`BENCHMARKS.md`). The padding is never read and is counted
    /// in [`Tensor::size_bytes`], as it is held.
    pub(crate) fn for_overwrite_padded(rows: usize, cols: usize) -> Self {
        let row_stride = padded_row_len(cols);
        Tensor {
            shape: vec![rows, cols],
            data: crate::pool::for_overwrite(rows * row_stride),
            row_pad: row_stride - cols,
        }
    }

    /// Elements from one row's start to the next's (`cols` unless padded).
    pub(crate) fn row_stride(&self) -> usize {
        self.cols() + self.row_pad
    }

    /// Write access to the storage, padding included (rows [`Tensor::row_stride`] apart).
    pub(crate) fn storage_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    fn assert_unpadded(&self) {
        assert!(
            self.row_pad == 0,
            "a tensor with padded rows ({} columns and {} of padding) is read through `mat` only",
            self.cols(),
            self.row_pad
        );
    }

    /// Wraps existing data; fails if `data.len()` does not match the shape, since a
    /// silently reshaped buffer would corrupt every later computation.
    pub fn from_vec(shape: &[usize], data: Vec<f32>) -> crate::Result<Self> {
        let expected: usize = shape.iter().product();
        if expected != data.len() {
            return Err(crate::NnError::BadInput(format!(
                "tensor of shape {shape:?} needs {expected} values, got {}",
                data.len()
            )));
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            data,
            row_pad: 0,
        })
    }

    /// The shape, outermost dimension first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Read access to the contiguous storage.
    pub fn data(&self) -> &[f32] {
        self.assert_unpadded();
        &self.data
    }

    /// Write access to the contiguous storage.
    pub fn data_mut(&mut self) -> &mut [f32] {
        self.assert_unpadded();
        &mut self.data
    }

    /// Consumes the tensor, returning its storage.
    pub fn into_vec(mut self) -> Vec<f32> {
        self.assert_unpadded();
        std::mem::take(&mut self.data)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True for a tensor with no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of storage (padding included); this is what the memory accounting sums.
    pub fn size_bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<f32>()
    }

    /// Rows when viewed as a matrix: product of all but the last dimension.
    pub fn rows(&self) -> usize {
        match self.shape.len() {
            0 => 1,
            n => self.shape[..n - 1].iter().product(),
        }
    }

    /// Columns when viewed as a matrix: the last dimension.
    pub fn cols(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Read-only matrix view `[rows, cols]` for the backend's matrix product.
    pub fn mat(&self) -> MatRef<'_> {
        MatRef::new(
            &self.data,
            0,
            self.rows(),
            self.cols(),
            self.row_stride() as isize,
            1,
        )
    }

    /// Writable matrix view `[rows, cols]`.
    pub fn mat_mut(&mut self) -> MatMut<'_> {
        let (r, c, stride) = (self.rows(), self.cols(), self.row_stride());
        MatMut::new(&mut self.data, 0, r, c, stride as isize, 1)
    }
}

/// Equal shapes and elements; a padded row's padding is not compared.
impl PartialEq for Tensor {
    fn eq(&self, other: &Self) -> bool {
        fn rows(t: &Tensor) -> impl Iterator<Item = &[f32]> {
            let cols = t.cols();
            (t.data.chunks(t.row_stride().max(1))).map(move |r| &r[..cols.min(r.len())])
        }
        self.shape == other.shape && rows(self).eq(rows(other))
    }
}

impl Clone for Tensor {
    fn clone(&self) -> Self {
        Tensor {
            shape: self.shape.clone(),
            data: crate::pool::copy_of(&self.data),
            row_pad: self.row_pad,
        }
    }
}

/// Large buffers go back to a per-thread cache for reuse (see `pool.rs`).
impl Drop for Tensor {
    fn drop(&mut self) {
        crate::pool::give(std::mem::take(&mut self.data));
    }
}

/// Panics unless `dst = a·b` is a product of matching shapes (internal misuse: the layers
/// check user-facing shapes before any product).
pub(crate) fn check_product_shapes(dst: &MatMut<'_>, a: &MatRef<'_>, b: &MatRef<'_>) {
    assert_eq!(a.cols, b.rows, "matmul inner dimensions differ");
    assert_eq!(
        (dst.rows, dst.cols),
        (a.rows, b.cols),
        "matmul output shape"
    );
}

/// A strided read-only matrix view into a slice. Strides let the attention kernel
/// address one head of a fused QKV buffer, and transposes cost nothing.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) offset: usize,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) row_stride: isize,
    pub(crate) col_stride: isize,
}

fn check_bounds(len: usize, offset: usize, rows: usize, cols: usize, rs: isize, cs: isize) {
    assert!(rs >= 0 && cs >= 0, "negative strides are not supported");
    if rows > 0 && cols > 0 {
        let last = offset + (rows - 1) * rs as usize + (cols - 1) * cs as usize;
        assert!(
            last < len,
            "matrix view out of bounds: last index {last}, len {len}"
        );
    }
}

impl<'a> MatRef<'a> {
    /// Creates a view; panics if any addressed element lies outside `data`
    /// (internal misuse, never reachable from user input).
    pub fn new(
        data: &'a [f32],
        offset: usize,
        rows: usize,
        cols: usize,
        row_stride: isize,
        col_stride: isize,
    ) -> Self {
        check_bounds(data.len(), offset, rows, cols, row_stride, col_stride);
        MatRef {
            data,
            offset,
            rows,
            cols,
            row_stride,
            col_stride,
        }
    }

    /// The transposed view (no copy).
    pub fn t(self) -> Self {
        MatRef {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }
}

/// A strided writable matrix view into a slice.
#[derive(Debug)]
pub struct MatMut<'a> {
    pub(crate) data: &'a mut [f32],
    pub(crate) offset: usize,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) row_stride: isize,
    pub(crate) col_stride: isize,
}

impl<'a> MatMut<'a> {
    /// Creates a writable view; panics if out of bounds (internal misuse).
    pub fn new(
        data: &'a mut [f32],
        offset: usize,
        rows: usize,
        cols: usize,
        row_stride: isize,
        col_stride: isize,
    ) -> Self {
        check_bounds(data.len(), offset, rows, cols, row_stride, col_stride);
        MatMut {
            data,
            offset,
            rows,
            cols,
            row_stride,
            col_stride,
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_vec_rejects_wrong_length() {
        assert!(Tensor::from_vec(&[2, 3], vec![0.0; 5]).is_err());
        let t = Tensor::from_vec(&[2, 3], vec![0.0; 6]).unwrap();
        assert_eq!((t.rows(), t.cols(), t.size_bytes()), (2, 3, 24));
    }

    #[test]
    fn transpose_view_swaps_strides() {
        let t = Tensor::from_vec(&[2, 3], (0..6).map(|x| x as f32).collect()).unwrap();
        let v = t.mat().t();
        assert_eq!(
            (v.rows(), v.cols(), v.row_stride, v.col_stride),
            (3, 2, 1, 3)
        );
    }
}
