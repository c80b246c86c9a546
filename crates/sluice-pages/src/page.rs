//! A page's bytes on their way to the device.
//!
//! A slice's fetcher builds each page straight into a pinned buffer of the
//! slice writer's engine ([`PageTarget`]), padded to whole blocks, and the
//! writer hands that buffer to the kernel as it is
//! ([`sluice_io::write_bufs_on`]): the page is put together once and never
//! copied again. Without a target (a page sampled to size the layout, a
//! source that makes its own pages) or when the pool cannot give a buffer
//! the page's size, the page lives in a recycled heap buffer and the writer
//! copies it into pinned buffers as it writes.

use sluice_io::{BufferPool, Direction, IoBuf};

/// Where a slice's pages are built: the pool of the engine that writes them.
#[derive(Debug, Clone)]
pub struct PageTarget {
    pool: BufferPool,
    block_size_bytes: usize,
}

impl PageTarget {
    /// Pages built in `pool`'s buffers, padded to blocks of `block_size_bytes`.
    pub fn new(pool: BufferPool, block_size_bytes: usize) -> Self {
        assert!(block_size_bytes.is_power_of_two() && block_size_bytes >= 512);
        PageTarget {
            pool,
            block_size_bytes,
        }
    }
}

/// The bytes of one page: `[{"_id":…,"_source":…},…]\n`.
#[derive(Debug)]
pub enum PageBytes {
    /// In a pinned buffer of the writer's pool, followed by spaces to the
    /// end of its last block; `len` bytes before the padding.
    Pinned {
        /// The buffer, its length whole blocks.
        buf: IoBuf,
        /// The page's length before padding.
        len: usize,
    },
    /// In a heap buffer (recycled through [`crate::buffers`]).
    Heap(Vec<u8>),
}

impl PageBytes {
    /// Space for a page of exactly `len` bytes, to be filled through
    /// [`PageBytes::as_mut_slice`]: in `target`'s pool when there is one and
    /// it gives a contiguous buffer, else on the heap.
    pub fn with_len(target: Option<&PageTarget>, len: usize) -> PageBytes {
        if let Some(t) = target {
            let padded = len.div_ceil(t.block_size_bytes).max(1) * t.block_size_bytes;
            match t.pool.alloc(padded, Direction::Write) {
                Ok(mut buf) => {
                    if let Some(bytes) = buf.as_mut_slice() {
                        bytes[len..].fill(b' ');
                        return PageBytes::Pinned { buf, len };
                    }
                }
                // The page goes through the copying path instead; nothing
                // is lost but the copy saved.
                Err(e) => log::debug!("page of {len} bytes on the heap: {e}"),
            }
        }
        let mut buf = crate::buffers::take_empty(len);
        buf.resize(len, 0);
        PageBytes::Heap(buf)
    }

    /// The page's bytes, without padding.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: pages are contiguous"
    )]
    pub fn as_slice(&self) -> &[u8] {
        match self {
            PageBytes::Pinned { buf, len } => {
                &buf.as_slice().expect("pages are contiguous")[..*len]
            }
            PageBytes::Heap(v) => v,
        }
    }

    /// The page's bytes to fill, without padding.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: pages are contiguous"
    )]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            PageBytes::Pinned { buf, len } => {
                &mut buf.as_mut_slice().expect("pages are contiguous")[..*len]
            }
            PageBytes::Heap(v) => v,
        }
    }

    /// Whether the page lies in a pinned buffer, ready to be written as is.
    pub fn is_pinned(&self) -> bool {
        matches!(self, PageBytes::Pinned { .. })
    }

    /// Gives the memory back: a heap buffer for reuse, a pinned one to its pool.
    pub fn recycle(self) {
        if let PageBytes::Heap(v) = self {
            crate::buffers::give(v);
        }
    }
}

impl From<Vec<u8>> for PageBytes {
    fn from(v: Vec<u8>) -> Self {
        PageBytes::Heap(v)
    }
}

impl std::ops::Deref for PageBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}
