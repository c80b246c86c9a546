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

/// Size of a transparent huge page on x86-64 and arm64 with 4 KiB pages.
pub const HUGE_PAGE_SIZE_BYTES: usize = 2 << 20;

/// A zeroed, page-aligned allocation that owns its bytes.
pub struct AlignedMem {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

#[derive(Debug, Clone, Copy)]
enum Backing {
    /// From the global allocator with this alignment.
    Heap { align: usize },
    /// An anonymous mapping of its own, huge-page aligned.
    Mapped,
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
        Self::with_alignment(len, PAGE_SIZE_BYTES)
    }

    /// Allocates memory meant to be pinned for long: from 2 MiB up it is an
    /// anonymous mapping of its own, huge-page aligned and advised as huge
    /// pages before any page is touched, so that its pages fault in as 2 MiB
    /// folios. Registration then pins few, physically contiguous folios and a
    /// large I/O is one DMA segment. (Scattered 4 KiB pages put a 1 MiB
    /// request at the virtio queue's 254-segment limit: the queue fills and
    /// the block layer requeues, about a fifth of the throughput lost.)
    pub fn for_pinning(len: usize) -> Self {
        let size = Self::pinning_size(len);
        if size < HUGE_PAGE_SIZE_BYTES {
            return Self::new(size);
        }
        Self::mapped_huge(size).unwrap_or_else(|| Self::with_alignment(size, HUGE_PAGE_SIZE_BYTES))
    }

    /// Maps `len` bytes (a multiple of the huge page size) at a huge-page
    /// boundary and advises huge pages. None if the kernel refuses the map.
    fn mapped_huge(len: usize) -> Option<Self> {
        debug_assert!(len.is_multiple_of(HUGE_PAGE_SIZE_BYTES));
        let span = len + HUGE_PAGE_SIZE_BYTES;
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        let start = raw as usize;
        let aligned = round_up(start, HUGE_PAGE_SIZE_BYTES);
        let head = aligned - start;
        let tail = span - head - len;
        // SAFETY: head and tail lie inside the mapping just made and outside
        // the aligned part we keep; madvise only advises the kept part.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
            libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        Some(AlignedMem {
            ptr: NonNull::new(aligned as *mut u8)?,
            len,
            backing: Backing::Mapped,
        })
    }

    /// The bytes `for_pinning(len)` allocates: pages, or whole huge pages
    /// from 2 MiB up.
    pub fn pinning_size(len: usize) -> usize {
        if len < HUGE_PAGE_SIZE_BYTES {
            round_up(len.max(1), PAGE_SIZE_BYTES)
        } else {
            round_up(len, HUGE_PAGE_SIZE_BYTES)
        }
    }

    fn with_alignment(len: usize, align: usize) -> Self {
        let len = round_up(len.max(1), PAGE_SIZE_BYTES);
        let layout = Self::layout(len, align);
        // SAFETY: layout has non-zero size and a power-of-two alignment.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedMem {
            ptr,
            len,
            backing: Backing::Heap { align },
        }
    }

    fn layout(len: usize, align: usize) -> Layout {
        Layout::from_size_align(len, align).expect("power-of-two alignment")
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte (for I/O submission).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised (zeroed) bytes for our lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable.
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
        match self.backing {
            // SAFETY: ptr was allocated in `with_alignment` with exactly this layout.
            Backing::Heap { align } => unsafe {
                dealloc(self.ptr.as_ptr(), Self::layout(self.len, align))
            },
            // SAFETY: ptr..ptr+len is the mapping kept by `mapped_huge`.
            Backing::Mapped => unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), self.len);
            },
        }
    }
}

impl std::fmt::Debug for AlignedMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedMem({:p}, {} bytes)", self.ptr, self.len)
    }
}
