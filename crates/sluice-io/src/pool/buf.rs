//! `IoBuf`: an owned I/O buffer, one or more pinned segments.

use super::region::Region;
use super::small::ListId;
use super::Shared;
use crate::mem::AlignedMem;
use std::sync::Arc;

/// One contiguous piece of a buffer.
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    ptr: *mut u8,
    len_bytes: usize,
    buf_index: Option<u16>,
}

impl Segment {
    pub(crate) fn new(ptr: *mut u8, len_bytes: usize, buf_index: Option<u16>) -> Self {
        Segment {
            ptr,
            len_bytes,
            buf_index,
        }
    }

    /// The run's first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The run's length.
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// Index in the ring's fixed-buffer table, if the memory is registered.
    pub fn buf_index(&self) -> Option<u16> {
        self.buf_index
    }
}

/// Which tier served a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// A static pinned block of the small tier.
    Small,
    /// A contiguous run of a registered medium chunk.
    Medium,
    /// Medium, served as a scatter/gather list of discontiguous runs.
    Scattered,
    /// Memory pinned for this one request.
    Big,
    /// Plain aligned memory, not from a pool and not pinned.
    Unpooled,
}

#[derive(Debug)]
pub(crate) enum Origin {
    Small {
        list: ListId,
        index: u32,
    },
    Medium {
        regions: Vec<Region>,
    },
    Big {
        mem: AlignedMem,
        slot: Option<u16>,
    },
    /// Holds the memory until the buffer is dropped.
    Unpooled(#[allow(dead_code)] AlignedMem),
}

/// An I/O buffer that owns its memory. Pooled buffers go back to their pool
/// when dropped. `len` is the I/O length; `capacity` what the segments hold.
#[derive(Debug)]
pub struct IoBuf {
    len_bytes: usize,
    capacity_bytes: usize,
    segments: Vec<Segment>,
    origin: Option<Origin>,
    pool: Option<Arc<Shared>>,
}

// SAFETY: an IoBuf is the only owner of the memory its segments point to
// (the pool hands each region to one buffer at a time), so moving it to
// another thread moves exclusive access, as with a Vec<u8>.
unsafe impl Send for IoBuf {}
// SAFETY: &IoBuf gives out only shared byte slices.
unsafe impl Sync for IoBuf {}

impl IoBuf {
    pub(crate) fn pooled(
        len_bytes: usize,
        segments: Vec<Segment>,
        origin: Origin,
        pool: Arc<Shared>,
    ) -> Self {
        let capacity_bytes = segments.iter().map(|s| s.len_bytes).sum();
        assert!(capacity_bytes >= len_bytes);
        IoBuf {
            len_bytes,
            capacity_bytes,
            segments,
            origin: Some(origin),
            pool: Some(pool),
        }
    }

    /// A page-aligned buffer outside any pool: not pinned, not registered.
    pub fn unpooled(len_bytes: usize) -> Self {
        let mem = AlignedMem::new(len_bytes);
        let seg = Segment::new(mem.as_ptr(), mem.len(), None);
        IoBuf {
            len_bytes,
            capacity_bytes: mem.len(),
            segments: vec![seg],
            origin: Some(Origin::Unpooled(mem)),
            pool: None,
        }
    }

    /// Whether `pool` handed it out (an unpooled buffer belongs to none).
    pub fn is_from(&self, pool: &super::BufferPool) -> bool {
        self.pool
            .as_ref()
            .is_some_and(|own| Arc::ptr_eq(own, &pool.shared))
    }

    /// Length of the I/O it carries.
    pub fn len(&self) -> usize {
        self.len_bytes
    }

    /// Whether that length is zero.
    pub fn is_empty(&self) -> bool {
        self.len_bytes == 0
    }

    /// Bytes it can hold (its length is set up to this).
    pub fn capacity(&self) -> usize {
        self.capacity_bytes
    }

    /// Sets the I/O length.
    ///
    /// # Panics
    /// If `len_bytes` exceeds the capacity.
    pub fn set_len(&mut self, len_bytes: usize) {
        assert!(
            len_bytes <= self.capacity_bytes,
            "length {len_bytes} exceeds buffer capacity {}",
            self.capacity_bytes
        );
        self.len_bytes = len_bytes;
    }

    /// Which tier served it.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: origin present until drop"
    )]
    pub fn tier(&self) -> Tier {
        match self.origin.as_ref().expect("origin present until drop") {
            Origin::Small { .. } => Tier::Small,
            Origin::Medium { regions } if regions.len() > 1 => Tier::Scattered,
            Origin::Medium { .. } => Tier::Medium,
            Origin::Big { .. } => Tier::Big,
            Origin::Unpooled(_) => Tier::Unpooled,
        }
    }

    /// Every segment; together they hold `capacity()` bytes.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The segments trimmed to `len()` bytes, with their byte offset in the buffer.
    pub fn io_segments(&self) -> impl Iterator<Item = (usize, Segment)> + '_ {
        let mut offset = 0usize;
        let len = self.len_bytes;
        self.segments.iter().map_while(move |s| {
            if offset >= len {
                return None;
            }
            let take = s.len_bytes.min(len - offset);
            let at = offset;
            offset += take;
            Some((at, Segment::new(s.ptr, take, s.buf_index)))
        })
    }

    /// The first `len()` bytes, if they are contiguous.
    pub fn as_slice(&self) -> Option<&[u8]> {
        let first = self.segments[0];
        (first.len_bytes >= self.len_bytes).then(|| {
            // SAFETY: the segment is ours and at least len bytes long.
            unsafe { std::slice::from_raw_parts(first.ptr, self.len_bytes) }
        })
    }

    /// The first `len()` bytes, mutable, if they are contiguous.
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        let first = self.segments[0];
        (first.len_bytes >= self.len_bytes).then(|| {
            // SAFETY: as above; &mut self gives exclusive access.
            unsafe { std::slice::from_raw_parts_mut(first.ptr, self.len_bytes) }
        })
    }

    /// Copies `src` into the buffer at byte `offset`, across segments.
    ///
    /// # Panics
    /// If the copy would run past the capacity.
    pub fn write_at(&mut self, offset: usize, src: &[u8]) {
        assert!(
            offset + src.len() <= self.capacity_bytes,
            "write past buffer capacity"
        );
        self.for_each_piece(offset, src.len(), |seg_ptr, at, n| {
            // SAFETY: for_each_piece yields in-bounds pieces of our segments.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(at), seg_ptr, n) }
        });
    }

    /// Copies bytes starting at `offset` into `dst`, across segments.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) {
        assert!(
            offset + dst.len() <= self.capacity_bytes,
            "read past buffer capacity"
        );
        self.for_each_piece(offset, dst.len(), |seg_ptr, at, n| {
            // SAFETY: as in write_at.
            unsafe { std::ptr::copy_nonoverlapping(seg_ptr, dst.as_mut_ptr().add(at), n) }
        });
    }

    /// The first `len()` bytes as a vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len_bytes];
        self.read_at(0, &mut v);
        v
    }

    /// Calls `f(segment pointer at the piece, offset in the range, length)`
    /// for each piece of `[offset, offset + len)` that lies in one segment.
    fn for_each_piece(&self, offset: usize, len: usize, mut f: impl FnMut(*mut u8, usize, usize)) {
        let mut seg_start = 0usize;
        let end = offset + len;
        for s in &self.segments {
            let seg_end = seg_start + s.len_bytes;
            let lo = offset.max(seg_start);
            let hi = end.min(seg_end);
            if lo < hi {
                // SAFETY: lo - seg_start < s.len_bytes, so the pointer stays inside.
                let p = unsafe { s.ptr.add(lo - seg_start) };
                f(p, lo - offset, hi - lo);
            }
            seg_start = seg_end;
            if seg_start >= end {
                break;
            }
        }
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        if let (Some(pool), Some(origin)) = (self.pool.take(), self.origin.take()) {
            pool.give_back(origin);
        }
    }
}
