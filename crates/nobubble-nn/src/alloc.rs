//! A global allocator that starts every large buffer on a cache line.
//!
//! Why: glibc returns large blocks 16 bytes past a page boundary (its chunk header), so a
//! tensor's rows, and every 32-byte vector load along them, straddle cache lines every
//! other load, and where a tensor starts differs from run to run with the heap's state.
//! The kernels' speed then depended on that. Binaries opt in with
//! `#[global_allocator] static ALLOC: CacheLineAligned = CacheLineAligned;`.

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks of at least this many bytes are aligned to [`LINE`].
const LARGE: usize = 4096;
/// A cache line.
const LINE: usize = 64;

/// [`System`], with blocks of 4 KiB and more aligned to 64 bytes.
pub struct CacheLineAligned;

/// The layout a block is really allocated with: a function of the requested layout only,
/// so `dealloc` recomputes the one `alloc` used.
fn widened(layout: Layout) -> Layout {
    if layout.size() >= LARGE && layout.align() < LINE {
        Layout::from_size_align(layout.size(), LINE).unwrap_or(layout)
    } else {
        layout
    }
}

// SAFETY: every block is allocated and freed by `System` with the same widened layout
// (`widened` depends on the layout alone), and a widened layout has the requested size and
// at least the requested alignment, so it satisfies the caller's layout.
unsafe impl GlobalAlloc for CacheLineAligned {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract (non-zero size) carries over to the widened layout.
        unsafe { System.alloc(widened(layout)) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(widened(layout)) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` with this layout, i.e. from `System` with the
        // widened one.
        unsafe { System.dealloc(ptr, widened(layout)) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size` rounded up to `layout.align()` does not
        // overflow, the condition `from_size_align_unchecked` needs.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if widened(layout) == layout && widened(new_layout) == new_layout {
            // SAFETY: neither block is widened: this is `System`'s own realloc.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // SAFETY: the new block is allocated before the old is copied and freed, each with
        // its own layout's rule.
        unsafe {
            let new = self.alloc(new_layout);
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new
        }
    }
}

// The library's own tests run under it too, so every kernel test also checks it.
#[cfg(test)]
#[global_allocator]
static TEST_ALLOC: CacheLineAligned = CacheLineAligned;

#[cfg(test)]
mod tests {
    use super::*;

    fn line_aligned<T>(p: *const T) -> bool {
        (p as usize).is_multiple_of(LINE)
    }

    #[test]
    fn large_blocks_start_on_a_cache_line() {
        let mut kept = Vec::new();
        for floats in [1024, 1025, 4099, 262_144, 1 << 20] {
            let v = vec![1.0f32; floats];
            assert!(line_aligned(v.as_ptr()), "{floats} floats");
            kept.push(v);
        }
        // Larger alignments than a line are kept.
        let layout = Layout::from_size_align(8192, 256).unwrap();
        // SAFETY: a non-zero size; freed with the same layout.
        unsafe {
            let p = CacheLineAligned.alloc(layout);
            assert!(!p.is_null() && (p as usize).is_multiple_of(256));
            CacheLineAligned.dealloc(p, layout);
        }
    }

    #[test]
    fn growing_and_shrinking_across_the_threshold_keeps_the_contents() {
        let mut v: Vec<u32> = Vec::with_capacity(10);
        for i in 0..50_000u32 {
            v.push(i.wrapping_mul(2_654_435_761));
        }
        assert!(line_aligned(v.as_ptr()));
        v.truncate(100);
        v.shrink_to_fit();
        v.push(7);
        let want: Vec<u32> = (0..100u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
        assert_eq!(&v[..100], &want[..]);
        assert_eq!(v[100], 7);
        let mut w = vec![3u8; 5000];
        w.resize(3000, 0);
        w.shrink_to_fit();
        w.resize(9000, 4);
        assert!(line_aligned(w.as_ptr()));
        assert!(w[..3000].iter().all(|&x| x == 3) && w[3000..].iter().all(|&x| x == 4));
    }
}
