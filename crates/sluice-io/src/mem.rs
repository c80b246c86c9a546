//! Page-aligned owned memory: the raw material of every I/O buffer.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

/// Alignment of every buffer Sluice hands to a device: one page, which covers
/// the logical block size of every device we accept (512 or 4096 bytes).
pub const PAGE_SIZE_BYTES: usize = 4096;

/// Rounds `value` up to a multiple of `multiple` (a power of two).
pub const fn round_up(value: usize, multiple: usize) -> usize {
    debug_assert!(multiple.is_power_of_two());
    (value + multiple - 1) & !(multiple - 1)
}

/// A zeroed, page-aligned heap allocation that owns its bytes.
pub struct AlignedMem {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedMem owns its allocation exclusively; moving it between
// threads moves that ownership, exactly like a Vec<u8>.
unsafe impl Send for AlignedMem {}
// SAFETY: shared references only give out `&[u8]`, which is Sync for u8.
unsafe impl Sync for AlignedMem {}

impl AlignedMem {
    /// Allocates `len` bytes (rounded up to a page), zeroed.
    ///
    /// # Panics
    /// On allocation failure, like `Vec`.
    pub fn new(len: usize) -> Self {
        let len = round_up(len.max(1), PAGE_SIZE_BYTES);
        let layout = Self::layout(len);
        // SAFETY: layout has non-zero size and a power-of-two alignment.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedMem { ptr, len }
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, PAGE_SIZE_BYTES).expect("page-aligned layout")
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised (zeroed) bytes for our lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The iovec describing the whole allocation, for registration.
    pub fn iovec(&self) -> libc::iovec {
        libc::iovec {
            iov_base: self.ptr.as_ptr().cast(),
            iov_len: self.len,
        }
    }
}

impl Drop for AlignedMem {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated in `new` with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

impl std::fmt::Debug for AlignedMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedMem({:p}, {} bytes)", self.ptr, self.len)
    }
}
