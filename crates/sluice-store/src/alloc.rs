//! The extent allocator: free runs of store blocks, first fit, merged on
//! free. Its state is persisted through the manifest (docs/FORMAT.md); this
//! type is the in-memory map that replay rebuilds.

use crate::blocks::Extent;
use crate::error::{Result, StoreError};
use std::collections::BTreeMap;

/// Largest extent handed out (u32 block count).
pub const MAX_EXTENT_BLOCKS: u64 = u32::MAX as u64;

/// Free extents of a device set as a map of runs, merged on release; allocations stay within one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtentAllocator {
    /// start block -> length in blocks. Never two adjacent runs.
    free: BTreeMap<u64, u64>,
    first_block: u64,
    end_block: u64,
}

impl ExtentAllocator {
    /// All of `[first_block, end_block)` free.
    pub fn new(first_block: u64, end_block: u64) -> Self {
        assert!(first_block <= end_block);
        let mut free = BTreeMap::new();
        if end_block > first_block {
            free.insert(first_block, end_block - first_block);
        }
        ExtentAllocator {
            free,
            first_block,
            end_block,
        }
    }

    /// Rebuilds an allocator from a persisted list of free extents.
    pub fn from_free_list(first_block: u64, end_block: u64, free: &[Extent]) -> Result<Self> {
        let mut a = ExtentAllocator {
            free: BTreeMap::new(),
            first_block,
            end_block,
        };
        for e in free {
            a.release(*e)?;
        }
        Ok(a)
    }

    /// First fit: the lowest free run of at least `blocks`.
    pub fn allocate(&mut self, blocks: u64) -> Result<Extent> {
        self.allocate_within(blocks, 0, u64::MAX)
    }

    /// First fit inside blocks `[lo, hi)` (one device of a set).
    pub fn allocate_within(&mut self, blocks: u64, lo: u64, hi: u64) -> Result<Extent> {
        if blocks == 0 || blocks > MAX_EXTENT_BLOCKS {
            return Err(StoreError::BadExtent {
                start_block: 0,
                block_count: blocks.min(MAX_EXTENT_BLOCKS) as u32,
                problem: "has a length of zero or beyond the largest extent",
            });
        }
        // Each free run clipped to the range.
        let clipped = |(&s, &l): (&u64, &u64)| {
            let (a, b) = (s.max(lo), (s + l).min(hi));
            (b > a).then(|| (a, b - a))
        };
        let found = self
            .free
            .range(..hi)
            .filter_map(clipped)
            .find(|&(_, len)| len >= blocks);
        let Some((start, _)) = found else {
            let runs = || self.free.range(..hi).filter_map(clipped).map(|(_, l)| l);
            return Err(StoreError::DeviceFull {
                needed_blocks: blocks,
                largest_free_blocks: runs().max().unwrap_or(0),
                free_blocks: runs().sum(),
            });
        };
        let e = Extent {
            start_block: start,
            block_count: blocks as u32,
        };
        self.reserve(e)?;
        Ok(e)
    }

    /// Marks `e` as in use (replaying an allocation). It must be free.
    pub fn reserve(&mut self, e: Extent) -> Result<()> {
        self.check_bounds(e)?;
        let (&start, &len) = self
            .free
            .range(..=e.start_block)
            .next_back()
            .filter(|(&s, &l)| s + l >= e.end_block())
            .ok_or(StoreError::BadExtent {
                start_block: e.start_block,
                block_count: e.block_count,
                problem: "is not free and cannot be reserved",
            })?;
        self.free.remove(&start);
        if e.start_block > start {
            self.free.insert(start, e.start_block - start);
        }
        if start + len > e.end_block() {
            self.free.insert(e.end_block(), start + len - e.end_block());
        }
        Ok(())
    }

    /// Returns `e` to the free map, merging with free neighbours. Freeing
    /// blocks that are already free is refused.
    pub fn release(&mut self, e: Extent) -> Result<()> {
        self.check_bounds(e)?;
        let overlaps = |s: u64, l: u64| s < e.end_block() && e.start_block < s + l;
        let before = self
            .free
            .range(..e.end_block())
            .next_back()
            .map(|(&s, &l)| (s, l));
        if before.is_some_and(|(s, l)| overlaps(s, l)) {
            return Err(StoreError::BadExtent {
                start_block: e.start_block,
                block_count: e.block_count,
                problem: "is already free (double free)",
            });
        }
        let mut start = e.start_block;
        let mut len = e.block_count as u64;
        if let Some((s, l)) = before.filter(|(s, l)| s + l == e.start_block) {
            self.free.remove(&s);
            start = s;
            len += l;
        }
        if let Some(l) = self.free.remove(&e.end_block()) {
            len += l;
        }
        self.free.insert(start, len);
        Ok(())
    }

    fn check_bounds(&self, e: Extent) -> Result<()> {
        if e.block_count == 0 || e.start_block < self.first_block || e.end_block() > self.end_block
        {
            return Err(StoreError::BadExtent {
                start_block: e.start_block,
                block_count: e.block_count,
                problem: "lies outside the allocatable blocks",
            });
        }
        Ok(())
    }

    /// Free store blocks in all.
    pub fn free_blocks(&self) -> u64 {
        self.free.values().sum()
    }

    /// Blocks of the largest free run.
    pub fn largest_free(&self) -> u64 {
        self.free.values().copied().max().unwrap_or(0)
    }

    /// Blocks of the largest free run inside `[lo, hi)` (one device of a
    /// set): the largest extent [`ExtentAllocator::allocate_within`] can
    /// hand out there now.
    pub fn largest_free_within(&self, lo: u64, hi: u64) -> u64 {
        self.free
            .range(..hi)
            .map(|(&s, &l)| (s + l).min(hi).saturating_sub(s.max(lo)))
            .max()
            .unwrap_or(0)
            .min(MAX_EXTENT_BLOCKS)
    }

    /// The free map as extents, for a manifest checkpoint.
    pub fn free_list(&self) -> Vec<Extent> {
        self.free
            .iter()
            .flat_map(|(&start, &len)| split(start, len))
            .collect()
    }

    /// Whether `block` is free.
    pub fn is_free(&self, block: u64) -> bool {
        self.free
            .range(..=block)
            .next_back()
            .is_some_and(|(&s, &l)| block < s + l)
    }
}

/// A run as extents of at most MAX_EXTENT_BLOCKS.
fn split(mut start: u64, mut len: u64) -> impl Iterator<Item = Extent> {
    std::iter::from_fn(move || {
        if len == 0 {
            return None;
        }
        let take = len.min(MAX_EXTENT_BLOCKS);
        let e = Extent {
            start_block: start,
            block_count: take as u32,
        };
        start += take;
        len -= take;
        Some(e)
    })
}
