//! Walking one table's range forward or in reverse, reading data blocks
//! ahead in runs that double while the walk goes on.

use super::block::RawBlock;
use super::index::TableIndex;
use super::reader::{CacheUse, RunAhead, RunBytes, TableReader};
use super::Entry;
use crate::blocks::BlockDevice;
use crate::blocks::STORE_BLOCK_BYTES;
use crate::error::Result;
use std::sync::Arc;

/// Most data blocks one read-ahead fetches (256 KiB of 4 KiB blocks).
const READAHEAD_MAX_BLOCKS: usize = 64;
/// Blocks the first read of a cursor fetches; each later read doubles it.
const READAHEAD_FIRST_BLOCKS: usize = 2;

/// What a cursor walks: keys in `[start, end)` (end None: unbounded),
/// forward (internal order) or reverse (key descending, sequence
/// ascending).
#[derive(Debug, Clone)]
pub struct CursorSpec {
    /// First key walked.
    pub start: Vec<u8>,
    /// Key the walk stops before (None: the end).
    pub end: Option<Vec<u8>>,
    /// Walk from the end down.
    pub reverse: bool,
    /// Blocks read are looked up in the block cache. A compaction reads
    /// without it, so it does not evict what readers use.
    pub use_cache: bool,
    /// With `use_cache`: blocks read are added to the cache. A scan of more
    /// than the cache holds would only evict what it added itself (and
    /// what point reads use), so it looks up without filling.
    pub fill_cache: bool,
    /// Entries the caller expects to take from this cursor (0: unknown).
    /// The first read is sized to cover them, so a scan with a limit
    /// usually costs one round of reads; later reads double as usual.
    pub expected_entries: usize,
}

impl Default for CursorSpec {
    fn default() -> Self {
        CursorSpec {
            start: Vec::new(),
            end: None,
            reverse: false,
            use_cache: true,
            fill_cache: true,
            expected_entries: 0,
        }
    }
}

/// Position of a cursor in one table; the table and device are passed in,
/// so the same state serves borrowed and owning cursors.
pub(super) struct CursorState {
    ix: Arc<TableIndex>,
    spec: CursorSpec,
    /// Data blocks not yet read: `lo..hi`. Forward reads from `lo` up,
    /// reverse from `hi` down.
    lo: usize,
    hi: usize,
    /// Blocks read ahead, in the order they will be walked, and how many
    /// the next read takes: doubling while the cursor keeps going.
    prefetched: std::collections::VecDeque<RawBlock>,
    readahead: usize,
    /// Forward: the block being walked, the byte offset of its next entry
    /// and the key before it.
    block: Option<RawBlock>,
    pos: usize,
    last_key: Vec<u8>,
    /// Forward: a key at or past the start was seen, so every later one is
    /// too (keys only grow) and needs no comparison with the start.
    past_start: bool,
    /// Forward: the index of the first block walked, how many were taken,
    /// and whether the block walked now ends before the range's end (its
    /// last key, in the index, is below it): then no entry of it needs a
    /// comparison with the end.
    first_block: usize,
    blocks_taken: usize,
    block_before_end: bool,
    /// Reverse: the current block's entries still to give, last first.
    decoded: Vec<Entry>,
    /// Runs taken so far, and the next run being read while the blocks
    /// before it are walked: (first block index, count, the read).
    runs_taken: usize,
    ahead: Option<(usize, usize, RunAhead)>,
    /// Blocks this cursor may still add to the block cache: a long walk
    /// stops filling it once it has added its share.
    pub(super) fill_left_blocks: usize,
}

impl CursorState {
    pub(super) fn new(ix: Arc<TableIndex>, entries: u64, spec: CursorSpec) -> Self {
        let blocks = ix.index.len();
        let before = |k: &[u8]| ix.index.partition_point(|e| e.last_key < k);
        let lo = before(&spec.start);
        // The first block whose last key reaches `end` may still hold keys
        // below it.
        let hi = spec
            .end
            .as_deref()
            .map_or(blocks, |end| (before(end) + 1).min(blocks));
        let readahead = match spec.expected_entries {
            0 => READAHEAD_FIRST_BLOCKS,
            n => {
                let data_bytes = ix.index.last().map_or(0, |e| {
                    (e.offset_blocks + e.len_blocks) as usize * STORE_BLOCK_BYTES
                });
                let per_entry = data_bytes / entries.max(1) as usize;
                // One more block: the range rarely starts at a block's start.
                (n.saturating_mul(per_entry).div_ceil(STORE_BLOCK_BYTES) + 1)
                    .clamp(READAHEAD_FIRST_BLOCKS, READAHEAD_MAX_BLOCKS)
            }
        };
        CursorState {
            ix,
            spec,
            lo,
            hi: hi.max(lo),
            prefetched: std::collections::VecDeque::new(),
            readahead,
            block: None,
            pos: 0,
            last_key: Vec::new(),
            past_start: false,
            first_block: lo,
            blocks_taken: 0,
            block_before_end: false,
            decoded: Vec::new(),
            runs_taken: 0,
            ahead: None,
            fill_left_blocks: usize::MAX,
        }
    }

    /// The next run of blocks to read: (first block index, count).
    fn next_run(&self) -> Option<(usize, usize)> {
        if self.lo >= self.hi {
            return None;
        }
        let count = self.readahead.min(self.hi - self.lo);
        Some(if self.spec.reverse {
            (self.hi - count, count)
        } else {
            (self.lo, count)
        })
    }

    /// Takes the blocks of `next_run`, in ascending order.
    fn take_run(&mut self, run: Vec<RawBlock>) {
        if self.spec.reverse {
            self.hi -= run.len();
            self.prefetched.extend(run.into_iter().rev());
        } else {
            self.lo += run.len();
            self.prefetched.extend(run);
        }
        self.readahead = (self.readahead * 2).min(READAHEAD_MAX_BLOCKS);
    }

    fn finish(&mut self) {
        self.ahead = None;
        self.lo = self.hi;
        self.prefetched.clear();
        self.block = None;
        self.decoded.clear();
    }

    fn cache_use(&self) -> CacheUse {
        match (self.spec.use_cache, self.spec.fill_cache) {
            (false, _) => CacheUse::Bypass,
            (true, true) if self.fill_left_blocks > 0 => CacheUse::LookUpAndFill,
            (true, _) => CacheUse::LookUpOnly,
        }
    }

    /// The next prefetched block, reading a run first if none is left.
    fn next_block(&mut self, table: &TableReader, dev: &BlockDevice) -> Result<Option<RawBlock>> {
        if self.prefetched.is_empty() {
            let use_cache = self.cache_use();
            let run = match self.ahead.take() {
                Some((_, _, RunAhead::Cached(run))) => run,
                Some((first, count, RunAhead::Reading(pending))) => {
                    table.finish_run(dev, &self.ix, first, count, pending, use_cache)?
                }
                None => {
                    let Some((first, count)) = self.next_run() else {
                        return Ok(None);
                    };
                    table.read_run(dev, &self.ix, first, count, use_cache)?
                }
            };
            self.fill_left_blocks = self.fill_left_blocks.saturating_sub(run.len());
            self.take_run(run);
            self.runs_taken += 1;
            // From the second run on the walk is a scan, not a short look:
            // the run after this one is read while this one is walked.
            if self.runs_taken >= 2 {
                if let Some((first, count)) = self.next_run() {
                    let ahead = table.start_run(dev, &self.ix, first, count, use_cache)?;
                    self.ahead = Some((first, count, ahead));
                }
            }
        }
        Ok(self.prefetched.pop_front())
    }

    /// The next entry as an owned value (tests, flush checks).
    pub(super) fn next_entry(
        &mut self,
        table: &TableReader,
        dev: &BlockDevice,
    ) -> Result<Option<Entry>> {
        let mut e = Entry::empty();
        Ok(self.next_into(table, dev, &mut e)?.then_some(e))
    }

    /// Decodes the next entry into `out`, reusing its buffers; false past
    /// the end of the range.
    fn next_into(
        &mut self,
        table: &TableReader,
        dev: &BlockDevice,
        out: &mut Entry,
    ) -> Result<bool> {
        if self.spec.reverse {
            self.next_reverse(table, dev, out)
        } else {
            self.next_forward(table, dev, out)
        }
    }

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a verified block decodes"
    )]
    fn next_forward(
        &mut self,
        table: &TableReader,
        dev: &BlockDevice,
        out: &mut Entry,
    ) -> Result<bool> {
        loop {
            let mut past_end = false;
            if let Some(block) = &self.block {
                if self.pos < block.entries_len {
                    let e = block.entry_at(self.pos).expect("a verified block decodes");
                    self.pos = e.next;
                    // The caller reads this entry's value where it lies,
                    // often only its first bytes: the next entry's header
                    // is fetched meanwhile.
                    sluice_io::mem::prefetch_read(block.bytes(), e.next);
                    // The key first: entries before the start are passed
                    // over without copying their values.
                    self.last_key.truncate(e.shared);
                    self.last_key
                        .extend_from_slice(&block.bytes()[e.key_at..e.key_at + e.unshared]);
                    if !self.past_start {
                        if self.last_key.as_slice() < self.spec.start.as_slice() {
                            continue;
                        }
                        self.past_start = true;
                    }
                    past_end = !self.block_before_end
                        && self
                            .spec
                            .end
                            .as_deref()
                            .is_some_and(|end| self.last_key.as_slice() >= end);
                    debug_assert!(
                        !self.block_before_end
                            || self
                                .spec
                                .end
                                .as_deref()
                                .is_none_or(|end| self.last_key.as_slice() < end),
                        "a block before the end holds no key past it"
                    );
                    if !past_end {
                        out.key.clone_from(&self.last_key);
                        out.set_value_in(block, e.value_at, e.value_len);
                        out.seq = e.seq;
                        out.kind = e.kind;
                        return Ok(true);
                    }
                }
            }
            if past_end {
                self.finish();
                return Ok(false);
            }
            let Some(block) = self.next_block(table, dev)? else {
                self.block = None;
                return Ok(false);
            };
            // Blocks are taken in order from the first: this one's last key
            // tells whether any of its keys can reach the end.
            let index = self.first_block + self.blocks_taken;
            self.blocks_taken += 1;
            self.block_before_end = self
                .spec
                .end
                .as_deref()
                .is_none_or(|end| self.ix.index.get(index).last_key < end);
            // Start at the last restart point before the start key.
            self.pos = if self.past_start {
                0
            } else {
                block.restart_before(&self.spec.start)
            };
            self.last_key.clear();
            self.block = Some(block);
        }
    }

    fn next_reverse(
        &mut self,
        table: &TableReader,
        dev: &BlockDevice,
        out: &mut Entry,
    ) -> Result<bool> {
        loop {
            if let Some(e) = self.decoded.pop() {
                if e.key.as_slice() < self.spec.start.as_slice() {
                    self.finish();
                    return Ok(false);
                }
                *out = e;
                return Ok(true);
            }
            let Some(block) = self.next_block(table, dev)? else {
                return Ok(false);
            };
            let end = self.spec.end.as_deref();
            self.decoded = block
                .decode_all()
                .into_iter()
                .take_while(|e| end.is_none_or(|end| e.key.as_slice() < end))
                .collect();
        }
    }
}

/// See [`TableReader::cursor`].
pub struct TableCursor {
    pub(super) table: Arc<TableReader>,
    pub(super) dev: BlockDevice,
    pub(super) state: CursorState,
}

impl TableCursor {
    /// Takes the first run from the block cache if it holds all of it;
    /// then there is no first read to batch.
    pub fn first_from_cache(&mut self) -> bool {
        let s = &mut self.state;
        if !s.spec.use_cache || !s.prefetched.is_empty() || s.block.is_some() || s.ahead.is_some() {
            return false;
        }
        let Some((first, count)) = s.next_run() else {
            return false;
        };
        match self.table.cached_run(first, count) {
            Some(run) => {
                s.take_run(run);
                true
            }
            None => false,
        }
    }

    /// The read the cursor will make first, so that a caller can batch the
    /// first reads of many cursors: (first store block, blocks).
    pub fn first_read(&self) -> Option<(u64, usize)> {
        let s = &self.state;
        if !s.prefetched.is_empty()
            || s.block.is_some()
            || !s.decoded.is_empty()
            || s.ahead.is_some()
        {
            return None;
        }
        let (first, count) = s.next_run()?;
        Some(self.table.run_extent(&s.ix, first, count))
    }

    /// Hands the cursor the bytes of its `first_read`.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a first read"
    )]
    pub fn seed(&mut self, bytes: &[u8]) -> Result<()> {
        let (first, count) = self.state.next_run().expect("a first read");
        let run = self.table.parse_run(
            &self.dev,
            &self.state.ix,
            first,
            count,
            RunBytes::Borrowed(bytes),
            self.state.cache_use(),
        )?;
        self.state.take_run(run);
        Ok(())
    }

    /// Decodes the next entry into `out`, reusing its buffers; false past
    /// the end of the range.
    pub fn next_into(&mut self, out: &mut Entry) -> Result<bool> {
        self.state.next_into(&self.table, &self.dev, out)
    }
}

/// A cursor adds at most this fraction (1/n) of the block cache's capacity
/// to it: a walk longer than that goes on without filling the cache, so a
/// scan through a whole index does not evict everything else.
const CURSOR_FILL_SHARE: usize = 8;

/// The reader's ways to walk a table, made here so that the reader does
/// not depend on its cursor.
impl TableReader {
    /// Every entry, in order (flush checks, tests).
    pub fn entries(&self, dev: &BlockDevice) -> Result<Vec<Entry>> {
        let mut out = Vec::with_capacity(self.entries as usize);
        let mut c = CursorState::new(self.table_index(dev)?, self.entries, CursorSpec::default());
        while let Some(e) = c.next_entry(self, dev)? {
            out.push(e);
        }
        Ok(out)
    }

    /// A cursor over the entries whose keys lie in the spec's range, in
    /// internal order or its reverse. It holds the table and the device, so
    /// it can outlive the borrow it was made from.
    pub fn cursor(self: &Arc<Self>, dev: &BlockDevice, spec: CursorSpec) -> Result<TableCursor> {
        let mut state = CursorState::new(self.table_index(dev)?, self.entries, spec);
        state.fill_left_blocks =
            self.cache_capacity_bytes() / CURSOR_FILL_SHARE / STORE_BLOCK_BYTES;
        Ok(TableCursor {
            state,
            table: self.clone(),
            dev: dev.clone(),
        })
    }

    /// Entries whose key lies in `[start, end)` (end None: unbounded), in order.
    pub fn range(&self, dev: &BlockDevice, start: &[u8], end: Option<&[u8]>) -> Result<Vec<Entry>> {
        let spec = CursorSpec {
            start: start.to_vec(),
            end: end.map(<[u8]>::to_vec),
            ..CursorSpec::default()
        };
        let mut out = Vec::new();
        let mut c = CursorState::new(self.table_index(dev)?, self.entries, spec);
        while let Some(e) = c.next_entry(self, dev)? {
            out.push(e);
        }
        Ok(out)
    }
}
