//! A per-thread cache of large f32 buffers, so tensors of the shapes that repeat every
//! microbatch reuse memory instead of going back to the operating system.
//!
//! Why: glibc serves large allocations with fresh `mmap`ed pages and unmaps them on
//! free, so every activation of every pass page-faulted its memory in again. Measured
//! on one block (h 512, s 256, b 1, one thread) that cost ~20% of the forward pass.
//! The cache is bounded; a buffer's contents never leak into results (callers fill
//! what they take), so it cannot affect determinism.

use std::cell::RefCell;
use std::collections::HashMap;

/// Buffers smaller than this go straight to the allocator (it handles them well).
const MIN_POOLED: usize = 16 * 1024 / 4;
/// Most bytes one thread keeps cached. This memory is free (not counted as held
/// activations) but stays in the process: RSS may exceed the activation accounting by
/// up to this much per thread that drops tensors.
const MAX_CACHED_BYTES: usize = 256 << 20;

#[derive(Default)]
struct Pool {
    by_len: HashMap<usize, Vec<Vec<f32>>>,
    bytes: usize,
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool::default());
}

/// A buffer of exactly `len` zeros, reused from the cache when one of that length is
/// available.
pub(crate) fn zeroed(len: usize) -> Vec<f32> {
    match take(len) {
        Some(mut v) => {
            v.fill(0.0);
            v
        }
        None => vec![0.0; len],
    }
}

/// A buffer of `len` values that the caller overwrites completely before reading any:
/// a reused buffer is not cleared (that pass over memory is what this saves). In debug
/// builds (the tests) it is filled with NaN instead, so an element a kernel forgets to
/// write poisons the results and fails the equivalence tests rather than going unseen.
pub(crate) fn for_overwrite(len: usize) -> Vec<f32> {
    match take(len) {
        Some(mut v) => {
            if cfg!(debug_assertions) {
                v.fill(f32::NAN);
            }
            v
        }
        None if cfg!(debug_assertions) => vec![f32::NAN; len],
        None => vec![0.0; len],
    }
}

/// A copy of `src`, in a reused buffer when possible.
pub(crate) fn copy_of(src: &[f32]) -> Vec<f32> {
    match take(src.len()) {
        Some(mut v) => {
            v.copy_from_slice(src);
            v
        }
        None => src.to_vec(),
    }
}

fn take(len: usize) -> Option<Vec<f32>> {
    if len < MIN_POOLED {
        return None;
    }
    POOL.try_with(|p| {
        let mut p = p.borrow_mut();
        let v = p.by_len.get_mut(&len)?.pop()?;
        p.bytes -= v.capacity() * 4;
        Some(v)
    })
    .ok()
    .flatten()
}

/// Returns a buffer to this thread's cache (or frees it if the cache is full).
pub(crate) fn give(v: Vec<f32>) {
    if v.len() < MIN_POOLED || v.len() != v.capacity() {
        return;
    }
    let _ = POOL.try_with(|p| {
        let mut p = p.borrow_mut();
        let bytes = v.capacity() * 4;
        if p.bytes + bytes <= MAX_CACHED_BYTES {
            p.bytes += bytes;
            p.by_len.entry(v.len()).or_default().push(v);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_and_come_back_clean() {
        let len = MIN_POOLED + 7;
        let mut v = zeroed(len);
        v.fill(3.0);
        let ptr = v.as_ptr();
        give(v);
        let w = zeroed(len);
        assert_eq!(w.as_ptr(), ptr, "reused");
        assert!(w.iter().all(|&x| x == 0.0), "zeroed on reuse");
        give(w);
        let c = copy_of(&vec![1.5; len]);
        assert_eq!(c.as_ptr(), ptr);
        assert!(c.iter().all(|&x| x == 1.5));
        let small = zeroed(4);
        assert_eq!(small, vec![0.0; 4]);
    }
}
