//! Bookkeeping of the medium tier: which regions of which chunks are free.
//!
//! Pure logic, no memory: the pool maps chunk ids to pinned memory. This is
//! Algorithm 1 (first-fit over the chunk list, scatter/gather over
//! discontiguous regions, a new chunk only when nothing fits) and Algorithm 2
//! (free merges with free neighbours; a chunk free for longer than the idle
//! time is released) of the uDMA design.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Index of a medium chunk.
pub type ChunkId = u32;

/// A run of bytes inside one chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// The chunk.
    pub chunk: ChunkId,
    /// Offset of the run in the chunk.
    pub offset_bytes: usize,
    /// Length of the run.
    pub len_bytes: usize,
}

#[derive(Debug)]
struct Chunk {
    /// Free runs: offset -> length. Never two adjacent runs (merged on free).
    free: BTreeMap<usize, usize>,
    free_bytes: usize,
    /// When the chunk last became completely free.
    idle_since: Option<Instant>,
}

/// A free that does not match an allocation (a bug in the caller).
#[derive(Debug, PartialEq, Eq)]
pub enum FreeError {
    /// No chunk of this id.
    UnknownChunk(ChunkId),
    /// The run reaches past the chunk's end.
    OutOfChunk,
    /// The run is (partly) free already.
    NotAllocated,
}

/// Free-space map of the medium tier.
#[derive(Debug)]
pub struct RegionAllocator {
    chunk_size_bytes: usize,
    unit_bytes: usize,
    chunks: BTreeMap<ChunkId, Chunk>,
    next_chunk_id: ChunkId,
}

impl RegionAllocator {
    /// `unit_bytes` is the allocation granule (a page); chunk size a multiple of it.
    pub fn new(chunk_size_bytes: usize, unit_bytes: usize) -> Self {
        assert!(unit_bytes.is_power_of_two());
        assert!(chunk_size_bytes >= unit_bytes && chunk_size_bytes.is_multiple_of(unit_bytes));
        RegionAllocator {
            chunk_size_bytes,
            unit_bytes,
            chunks: BTreeMap::new(),
            next_chunk_id: 0,
        }
    }

    /// Size of each chunk.
    pub fn chunk_size_bytes(&self) -> usize {
        self.chunk_size_bytes
    }

    /// Chunks held.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// `len_bytes` rounded up to the allocation unit.
    pub fn round(&self, len_bytes: usize) -> usize {
        crate::mem::round_up(len_bytes, self.unit_bytes)
    }

    /// Adds a completely free chunk and returns its id.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: chunk ids exhausted"
    )]
    pub fn add_chunk(&mut self, now: Instant) -> ChunkId {
        let id = self.next_chunk_id;
        self.next_chunk_id = self
            .next_chunk_id
            .checked_add(1)
            .expect("chunk ids exhausted");
        let mut free = BTreeMap::new();
        free.insert(0, self.chunk_size_bytes);
        self.chunks.insert(
            id,
            Chunk {
                free,
                free_bytes: self.chunk_size_bytes,
                idle_since: Some(now),
            },
        );
        id
    }

    /// First fit: the first chunk, in chunk order, with a free run of at
    /// least `len_bytes`; the lowest such run in it.
    pub fn alloc_contiguous(&mut self, len_bytes: usize) -> Option<Region> {
        let len = self.round(len_bytes);
        let (&chunk_id, offset) = self.chunks.iter().find_map(|(id, c)| {
            if c.free_bytes < len {
                return None;
            }
            c.free
                .iter()
                .find(|(_, &run)| run >= len)
                .map(|(&off, _)| (id, off))
        })?;
        let region = Region {
            chunk: chunk_id,
            offset_bytes: offset,
            len_bytes: len,
        };
        self.take(region);
        Some(region)
    }

    /// Scatter/gather: strings free runs of the existing chunks together, in
    /// first-fit order, until `len_bytes` are covered, using at most
    /// `max_segments` runs. Takes nothing if it cannot cover the request.
    pub fn alloc_scattered(
        &mut self,
        len_bytes: usize,
        max_segments: usize,
    ) -> Option<Vec<Region>> {
        let len = self.round(len_bytes);
        if self.free_bytes() < len {
            return None;
        }
        let mut picked = Vec::new();
        let mut covered = 0usize;
        'outer: for (&chunk, c) in &self.chunks {
            for (&offset, &run) in &c.free {
                if picked.len() == max_segments {
                    return None;
                }
                let take = run.min(len - covered);
                picked.push(Region {
                    chunk,
                    offset_bytes: offset,
                    len_bytes: take,
                });
                covered += take;
                if covered == len {
                    break 'outer;
                }
            }
        }
        if covered < len {
            return None;
        }
        for r in &picked {
            self.take(*r);
        }
        Some(picked)
    }

    /// Removes `region` from the free run that starts at its offset.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: chunk exists; region starts a free run"
    )]
    fn take(&mut self, region: Region) {
        let chunk = self.chunks.get_mut(&region.chunk).expect("chunk exists");
        let run = chunk
            .free
            .remove(&region.offset_bytes)
            .expect("region starts a free run");
        assert!(
            run >= region.len_bytes,
            "free run shorter than the region taken"
        );
        if run > region.len_bytes {
            chunk.free.insert(
                region.offset_bytes + region.len_bytes,
                run - region.len_bytes,
            );
        }
        chunk.free_bytes -= region.len_bytes;
        chunk.idle_since = None;
    }

    /// Returns `region` to its chunk, merging with free neighbours.
    pub fn free(&mut self, region: Region, now: Instant) -> Result<(), FreeError> {
        let chunk_size = self.chunk_size_bytes;
        let chunk = self
            .chunks
            .get_mut(&region.chunk)
            .ok_or(FreeError::UnknownChunk(region.chunk))?;
        let start = region.offset_bytes;
        let end = start + region.len_bytes;
        if region.len_bytes == 0 || end > chunk_size {
            return Err(FreeError::OutOfChunk);
        }
        // The region must not overlap any free run.
        if let Some((&off, &run)) = chunk.free.range(..end).next_back() {
            if off + run > start {
                return Err(FreeError::NotAllocated);
            }
        }
        let mut new_start = start;
        let mut new_len = region.len_bytes;
        if let Some((&prev_off, &prev_len)) = chunk.free.range(..start).next_back() {
            if prev_off + prev_len == start {
                chunk.free.remove(&prev_off);
                new_start = prev_off;
                new_len += prev_len;
            }
        }
        if let Some(next_len) = chunk.free.remove(&end) {
            new_len += next_len;
        }
        chunk.free.insert(new_start, new_len);
        chunk.free_bytes += region.len_bytes;
        if chunk.free_bytes == chunk_size {
            chunk.idle_since = Some(now);
        }
        Ok(())
    }

    /// Chunks completely free for longer than `idle`.
    pub fn idle_chunks(&self, now: Instant, idle: Duration) -> Vec<ChunkId> {
        self.chunks
            .iter()
            .filter(|(_, c)| {
                c.idle_since
                    .is_some_and(|t| now.saturating_duration_since(t) >= idle)
            })
            .map(|(&id, _)| id)
            .collect()
    }

    /// Forgets a completely free chunk.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: chunk exists"
    )]
    pub fn remove_chunk(&mut self, id: ChunkId) {
        let chunk = self.chunks.remove(&id).expect("chunk exists");
        assert_eq!(
            chunk.free_bytes, self.chunk_size_bytes,
            "removing a chunk in use"
        );
    }

    /// Free bytes over all chunks.
    pub fn free_bytes(&self) -> usize {
        self.chunks.values().map(|c| c.free_bytes).sum()
    }

    /// Bytes of all chunks.
    pub fn total_bytes(&self) -> usize {
        self.chunks.len() * self.chunk_size_bytes
    }

    /// 1 - largest free run / all free bytes: 0 when free space is one run.
    pub fn fragmentation(&self) -> f64 {
        let free = self.free_bytes();
        if free == 0 {
            return 0.0;
        }
        let largest = self
            .chunks
            .values()
            .flat_map(|c| c.free.values())
            .copied()
            .max()
            .unwrap_or(0);
        1.0 - largest as f64 / free as f64
    }

    /// Free runs of one chunk, for invariant checks.
    pub fn free_runs(&self, id: ChunkId) -> Vec<(usize, usize)> {
        self.chunks
            .get(&id)
            .map(|c| c.free.iter().map(|(&o, &l)| (o, l)).collect())
            .unwrap_or_default()
    }

    /// The ids of the chunks held, ascending.
    pub fn chunk_ids(&self) -> Vec<ChunkId> {
        self.chunks.keys().copied().collect()
    }
}
