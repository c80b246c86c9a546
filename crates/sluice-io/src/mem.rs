//! Page-aligned owned memory: the raw material of every I/O buffer.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;
use std::sync::Mutex;

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

/// A page-aligned allocation that owns its bytes: zeroed when new
/// ([`AlignedMem::for_pinning`] says when not).
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
    /// folios. Registration then pins few, physically contiguous folios and
    /// a large I/O is one DMA segment. (Scattered 4 KiB pages put a 1 MiB
    /// request at the virtio queue's 254-segment limit: the queue fills and
    /// the block layer requeues, about a fifth of the throughput lost.)
    ///
    /// From 2 MiB up its bytes are stale, not zeroed, when the mapping is
    /// one an earlier allocation of this process gave back (see
    /// [`MAX_RECYCLED_BYTES`]); below 2 MiB they are zeroed.
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
        if let Some(ptr) = recycled_take(len) {
            return Some(AlignedMem {
                ptr,
                len,
                backing: Backing::Mapped,
            });
        }
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

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: power-of-two alignment"
    )]
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
        // SAFETY: ptr is valid for len initialised bytes (zeroed, or stale
        // bytes of a recycled mapping) for our lifetime.
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
            Backing::Mapped => {
                if !recycled_keep(self.ptr, self.len) {
                    // SAFETY: ptr..ptr+len is the mapping kept by `mapped_huge`.
                    unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
                }
            }
        }
    }
}

impl std::fmt::Debug for AlignedMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedMem({:p}, {} bytes)", self.ptr, self.len)
    }
}

/// Most bytes of huge-page mappings a process keeps after the memory that
/// used them is dropped, for the next allocation of the same size: pool
/// chunks of an engine closed and one opened next (a read task after
/// another, a Python call after another). Memory first touched costs the
/// kernel a zeroed page, and on a virtual machine that hands freed memory
/// back to its host, a fault there too: `perf` put 44% of a short
/// `sluice read` in `clear_page_erms` right after another process had freed
/// its memory. Kept mappings are advised `MADV_FREE`, so the kernel may
/// still take their pages under memory pressure (they then fault in zeroed).
pub const MAX_RECYCLED_BYTES: usize = 128 << 20;

struct Recycled {
    /// (address, length) of each kept mapping.
    maps: Vec<(usize, usize)>,
    bytes: usize,
}

static RECYCLED: Mutex<Recycled> = Mutex::new(Recycled {
    maps: Vec::new(),
    bytes: 0,
});

fn recycled_take(len: usize) -> Option<NonNull<u8>> {
    let mut r = RECYCLED.lock().unwrap_or_else(|e| e.into_inner());
    let at = r.maps.iter().position(|&(_, l)| l == len)?;
    let (addr, _) = r.maps.swap_remove(at);
    r.bytes -= len;
    NonNull::new(addr as *mut u8)
}

/// Keeps the mapping at `ptr` for reuse if there is room; false if not (the
/// caller unmaps it).
fn recycled_keep(ptr: NonNull<u8>, len: usize) -> bool {
    let mut r = RECYCLED.lock().unwrap_or_else(|e| e.into_inner());
    if r.bytes + len > MAX_RECYCLED_BYTES {
        return false;
    }
    // SAFETY: ptr..ptr+len is a mapping of ours that nothing uses any more;
    // MADV_FREE only lets the kernel drop its contents.
    unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_FREE) };
    r.maps.push((ptr.as_ptr() as usize, len));
    r.bytes += len;
    true
}

/// Bytes of mappings kept for reuse now (at most [`MAX_RECYCLED_BYTES`]).
pub fn recycled_bytes() -> usize {
    RECYCLED.lock().unwrap_or_else(|e| e.into_inner()).bytes
}

/// Asks the CPU to bring the cache line holding `bytes[at]` in for a read
/// soon; nothing when `at` is past the end. A hint, never a fault: a walk
/// that jumps over most of each record (a scan reading a few fields of
/// each value, say) asks for the next record while it works on this one,
/// where the hardware prefetcher, which follows strides within a page,
/// would not.
#[inline]
pub fn prefetch_read(bytes: &[u8], at: usize) {
    if let Some(line) = bytes.get(at) {
        prefetch(line);
    }
}

/// Asks the CPU to bring the first cache line of `value` in for a read
/// soon (see [`prefetch_read`]): for a walk that follows references to
/// records scattered over memory, asking for several before reading any
/// has their misses overlap instead of taking them one after another.
#[inline]
pub fn prefetch<T: ?Sized>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 only hints the cache (it never faults and changes
    // no memory state visible to the program), the pointer comes from a
    // live reference, and SSE, which the instruction needs, is part of
    // every x86-64 CPU.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (value as *const T).cast::<i8>(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// Maps `len` bytes of `fd` from its start, shared and populated (the
/// shared-memory rings and kept memory): the caller unmaps it with
/// `munmap` once, and keeps `len` within the file.
pub(crate) fn map_shared(
    fd: std::os::fd::BorrowedFd<'_>,
    len: usize,
) -> std::io::Result<NonNull<u8>> {
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh shared mapping of a descriptor the caller holds open;
    // the result is checked.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    NonNull::new(ptr.cast()).ok_or_else(|| std::io::Error::other("mmap returned null"))
}

/// How long freed memory stays with a process before its allocator gives it
/// back: a memtable or table buffer freed now is reused within seconds
/// under a steady load. At mimalloc's default (1 s here) the memory went
/// back between flushes, and the kernel zeroed every fresh 2 MiB page of
/// the next memtable and table again (up to half the background thread's
/// time; SETs at P 50 +5–35%, docs/BENCHMARKS.md).
pub const FREED_MEMORY_KEPT_MS: i64 = 10_000;

/// Below this memory limit of its control group, a process gives freed
/// memory back at once instead: kept for [`FREED_MEMORY_KEPT_MS`] under a
/// steady load, freed memtables and table buffers added up to more than
/// the limit, and `sluice serve` in a 256 MiB group was killed by the
/// kernel's OOM killer (docs/BENCHMARKS.md, "A data set four times the
/// memory").
pub const KEEP_FREED_MEMORY_MIN_LIMIT_BYTES: u64 = 4 << 30;

/// How long a process under `memory_limit_bytes` (its control group's,
/// [`crate::probe::cgroup_memory_limit_bytes`]; none: no limit) keeps freed
/// memory before giving it back, in ms: the allocator's purge delay.
pub fn freed_memory_kept_ms(memory_limit_bytes: Option<u64>) -> i64 {
    match memory_limit_bytes {
        Some(limit) if limit < KEEP_FREED_MEMORY_MIN_LIMIT_BYTES => 0,
        _ => FREED_MEMORY_KEPT_MS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Freed memory is kept for reuse only where the control group lets the
    /// process use at least 4 GiB.
    #[test]
    fn freed_memory_goes_back_at_once_under_a_tight_memory_limit() {
        assert_eq!(freed_memory_kept_ms(None), FREED_MEMORY_KEPT_MS);
        assert_eq!(freed_memory_kept_ms(Some(8 << 30)), FREED_MEMORY_KEPT_MS);
        assert_eq!(freed_memory_kept_ms(Some(256 << 20)), 0);
        assert_eq!(freed_memory_kept_ms(Some((4 << 30) - 1)), 0);
    }

    #[test]
    fn a_dropped_mapping_is_the_next_one_of_its_size() {
        // A size no other test of this process allocates.
        let len = 14 << 20;
        let mut first = AlignedMem::for_pinning(len);
        first.as_mut_slice()[len - 1] = 7;
        let at = first.as_ptr();
        drop(first);
        let second = AlignedMem::for_pinning(len);
        assert_eq!(second.as_ptr(), at, "the kept mapping came back");
        assert_eq!(second.len(), len);
        assert!(recycled_bytes() <= MAX_RECYCLED_BYTES);
        // Small allocations are the heap's and zeroed.
        assert!(AlignedMem::for_pinning(64 << 10)
            .as_slice()
            .iter()
            .all(|&b| b == 0));
    }

    #[test]
    fn kept_mappings_stay_under_the_cap() {
        let len = 34 << 20;
        let many: Vec<AlignedMem> = (0..5).map(|_| AlignedMem::for_pinning(len)).collect();
        drop(many);
        assert!(recycled_bytes() <= MAX_RECYCLED_BYTES);
        let again: Vec<AlignedMem> = (0..5).map(|_| AlignedMem::for_pinning(len)).collect();
        assert!(again.iter().all(|m| m.len() == len));
    }
}
