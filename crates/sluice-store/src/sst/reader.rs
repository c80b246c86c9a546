//! An open table: point reads, block reads through the cache, and the
//! budget of index memory pinned across a store's tables.

use super::block::{open_region, BlockBytes, PointHit, RawBlock};
use super::index::{decode_ranges, decode_table_index, TableIndex};
use super::{internal_cmp, Entry, RangeTombstone, FOOTER_MAGIC};
use crate::blocks::{BlockDevice, Extent, PendingBlocks, STORE_BLOCK_BYTES};
use crate::codec::{u32_at, u64_at};
use crate::error::{Result, StoreError};
use crate::found::Found;
use sluice_io::mem::AlignedMem;
use std::cmp::Ordering;
use std::sync::Arc;

/// What a point read that may not wait found in no cache
/// ([`TableReader::get_or_miss`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissAt {
    /// The table's index and filter (an unpinned table's, evicted).
    Index,
    /// Data block `i`.
    Block(usize),
}

/// How a block read goes through the block cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CacheUse {
    /// Cached blocks are taken from the cache, new ones added.
    LookUpAndFill,
    /// Cached blocks are taken from the cache; none is added.
    LookUpOnly,
    /// The caller has looked already: only add.
    FillOnly,
    /// Only add, for a point read that missed and will look again
    /// ([`TableReader::fill_miss`]): that look is no hit.
    FillForRetry,
    Bypass,
}

impl CacheUse {
    fn looks_up(self) -> bool {
        matches!(self, CacheUse::LookUpAndFill | CacheUse::LookUpOnly)
    }

    fn fills(self) -> bool {
        matches!(
            self,
            CacheUse::LookUpAndFill | CacheUse::FillOnly | CacheUse::FillForRetry
        )
    }
}

/// The bytes of a run of blocks handed to `parse_run`.
#[derive(Clone, Copy)]
pub(super) enum RunBytes<'a> {
    /// Borrowed: blocks copy out what they keep.
    Borrowed(&'a [u8]),
    /// Owned by the caller and shareable by the blocks.
    Shared(&'a Arc<BlockBytes>),
}

impl RunBytes<'_> {
    fn as_slice(&self) -> &[u8] {
        match self {
            RunBytes::Borrowed(b) => b,
            RunBytes::Shared(run) => run.as_slice(),
        }
    }
}

/// The bound on pinned index and filter memory, shared by a store's tables.
#[derive(Debug)]
pub struct PinBudget {
    limit_bytes: usize,
    used_bytes: std::sync::atomic::AtomicUsize,
}

impl PinBudget {
    /// A budget of `limit_bytes`.
    pub fn new(limit_bytes: usize) -> Self {
        PinBudget {
            limit_bytes,
            used_bytes: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn try_take(&self, bytes: usize) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.used_bytes
            .fetch_update(Relaxed, Relaxed, |used| {
                (used + bytes <= self.limit_bytes).then_some(used + bytes)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        self.used_bytes
            .fetch_sub(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Bytes pinned now.
    pub fn used_bytes(&self) -> usize {
        self.used_bytes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The bound.
    pub fn limit_bytes(&self) -> usize {
        self.limit_bytes
    }
}

/// An open table: range tombstones in memory; index and filter pinned in
/// memory while the pin budget lasts, else read on demand through the
/// index cache.
#[derive(Debug)]
pub struct TableReader {
    /// The table's number.
    pub file_no: u64,
    /// Its keyspace's name (for error reports).
    pub keyspace_name: String,
    extent: Extent,
    /// Where the index region starts (the table's metadata may lie on
    /// another device than its data blocks).
    meta_start: u64,
    /// The footer's region offsets (see docs/FORMAT.md), to reload the
    /// index and filter of an unpinned table.
    regions: [u32; 6],
    pinned: Option<Arc<TableIndex>>,
    index_bytes: usize,
    budget: Option<Arc<PinBudget>>,
    index_cache: Option<Arc<crate::cache::IndexCache>>,
    /// Its range tombstones.
    pub range_tombstones: Vec<RangeTombstone>,
    /// Versions it holds.
    pub entries: u64,
    cache: Option<Arc<crate::cache::BlockCache>>,
}

impl Drop for TableReader {
    fn drop(&mut self) {
        if let (Some(budget), Some(_)) = (&self.budget, &self.pinned) {
            budget.give_back(self.index_bytes);
        }
    }
}

/// Which table a corruption report is about.
#[derive(Debug, Clone)]
pub struct TablePlace<'a> {
    /// The keyspace's name.
    pub keyspace: &'a str,
    /// The table's number.
    pub file_no: u64,
}

/// A run of data blocks asked for ahead of the walk.
pub(super) enum RunAhead {
    /// Found whole in the block cache.
    Cached(Vec<RawBlock>),
    /// Being read from the device.
    Reading(PendingBlocks),
}

/// The footer's regions (index, filter, range tombstones: offset and
/// length in blocks each) checked against each other and the table's
/// extents: contiguous, in that order, each at least one block, ending at
/// the footer. Returns the first region's offset and their length.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: a whole block"
)]
fn footer_regions(
    f: &[u8],
    extent: Extent,
    meta: Option<Extent>,
) -> std::result::Result<(u32, u32), String> {
    let at = |i: usize| u64::from(u32_at(f, i * 4).expect("a whole block"));
    let (index_off, index_len) = (at(0), at(1));
    let (filter_off, filter_len) = (at(2), at(3));
    let (range_off, range_len) = (at(4), at(5));
    if index_len == 0 || filter_len == 0 || range_len == 0 {
        return Err("a region of no blocks".into());
    }
    if filter_off != index_off + index_len || range_off != filter_off + filter_len {
        return Err("index, filter and tombstones are not contiguous".into());
    }
    let meta_len = index_len + filter_len + range_len;
    // The data blocks (before the index) lie in the table's extent; the
    // regions and the footer after them fill the rest of it, or its
    // second extent whole.
    let fits = match meta {
        None => index_off + meta_len + 1 == u64::from(extent.block_count),
        Some(m) => {
            index_off <= u64::from(extent.block_count) && meta_len + 1 == u64::from(m.block_count)
        }
    };
    if !fits {
        let room = meta.unwrap_or(extent).block_count;
        return Err(format!(
            "index, filter and tombstones of {meta_len} blocks and the footer after {index_off} data \
             blocks do not fit the table's extents (the last has {room} blocks)"
        ));
    }
    Ok((index_off as u32, meta_len as u32))
}

impl TableReader {
    /// Opens a table written whole into one extent.
    pub fn open(dev: &BlockDevice, extent: Extent, place: TablePlace<'_>) -> Result<Self> {
        Self::open_parts(dev, extent, None, place)
    }

    /// Opens a table whose data blocks start at `data.start_block` and
    /// whose index, filter, range tombstones and footer fill `meta` (None:
    /// they follow the data blocks inside `data`).
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a whole block"
    )]
    pub fn open_parts(
        dev: &BlockDevice,
        extent: Extent,
        meta: Option<Extent>,
        place: TablePlace<'_>,
    ) -> Result<Self> {
        let corrupt = |block: u64, reason: String| StoreError::Corrupt {
            what: "SST",
            block,
            lba: dev.lba_of(block),
            reason: format!(
                "keyspace {}, table {}: {reason}",
                place.keyspace, place.file_no
            ),
        };
        let footer_block = meta.unwrap_or(extent).end_block() - 1;
        let mut footer = AlignedMem::new(STORE_BLOCK_BYTES);
        dev.read(footer_block, footer.as_mut_slice())?;
        let f = footer.as_slice();
        let crc = u32_at(f, STORE_BLOCK_BYTES - 4).expect("a whole block");
        if &f[STORE_BLOCK_BYTES - 12..STORE_BLOCK_BYTES - 4] != FOOTER_MAGIC
            || crc32c::crc32c(&f[..STORE_BLOCK_BYTES - 4]) != crc
        {
            return Err(corrupt(
                footer_block,
                "footer checksum or magic mismatch".into(),
            ));
        }
        let at = |i: usize| u32_at(f, i * 4).expect("a whole block");
        let entries = u64_at(f, 24).expect("a whole block");
        // Checked before any arithmetic or allocation: a footer that
        // passes its checksum can still be wrong (a bug, a forged device).
        let (meta_off, meta_len) = footer_regions(f, extent, meta)
            .map_err(|why| corrupt(footer_block, format!("footer: {why}")))?;
        let meta_start = meta.map_or(extent.start_block + meta_off as u64, |m| m.start_block);
        let meta_block = |off: u32| meta_start + (off - meta_off) as u64;
        let mut buf = AlignedMem::new(meta_len as usize * STORE_BLOCK_BYTES);
        dev.read(meta_start, buf.as_mut_slice())?;
        let m = buf.as_slice();
        let region = |off: u32, len: u32| {
            let from = (off - meta_off) as usize * STORE_BLOCK_BYTES;
            let block = meta_block(off);
            open_region(&m[from..from + len as usize * STORE_BLOCK_BYTES])
                .ok_or_else(|| corrupt(block, "region checksum mismatch".into()))
        };
        let regions = [at(0), at(1), at(2), at(3), at(4), at(5)];
        let ix = decode_table_index(&regions, &m[..(at(1) + at(3)) as usize * STORE_BLOCK_BYTES])
            .map_err(|(off, what)| corrupt(meta_block(off), what.into()))?;
        let ranges = region(at(4), at(5))?;
        let range_tombstones = decode_ranges(ranges)
            .ok_or_else(|| corrupt(meta_block(at(4)), "range tombstones do not decode".into()))?;
        Ok(TableReader {
            file_no: place.file_no,
            keyspace_name: place.keyspace.to_string(),
            extent,
            meta_start,
            regions,
            index_bytes: ix.bytes(),
            pinned: Some(Arc::new(ix)),
            budget: None,
            index_cache: None,
            range_tombstones,
            entries,
            cache: None,
        })
    }

    /// Keeps the index and filter pinned if `budget` has room for them;
    /// otherwise hands them to `index_cache`, from which reads take them
    /// (re-reading them from the device once evicted).
    pub fn with_index_memory(
        mut self,
        budget: Arc<PinBudget>,
        index_cache: Arc<crate::cache::IndexCache>,
    ) -> Self {
        if budget.try_take(self.index_bytes) {
            self.budget = Some(budget);
        } else if let Some(ix) = self.pinned.take() {
            index_cache.insert((self.file_no, 0), ix, self.index_bytes);
        }
        self.index_cache = Some(index_cache);
        self
    }

    /// Whether the index and filter are pinned.
    pub fn is_pinned(&self) -> bool {
        self.pinned.is_some()
    }

    /// The index and filter if they are in memory (pinned or cached).
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: an unpinned table has an index cache"
    )]
    fn index_in_memory(&self) -> Option<Arc<TableIndex>> {
        if let Some(ix) = &self.pinned {
            return Some(ix.clone());
        }
        let cache = self
            .index_cache
            .as_ref()
            .expect("an unpinned table has an index cache");
        cache.get((self.file_no, 0))
    }

    /// The index and filter: pinned, cached, or read from the device.
    pub fn table_index(&self, dev: &BlockDevice) -> Result<Arc<TableIndex>> {
        if let Some(ix) = self.index_in_memory() {
            return Ok(ix);
        }
        let (first, blocks) = self.index_extent();
        let mut buf = AlignedMem::new(blocks * STORE_BLOCK_BYTES);
        dev.read(first, buf.as_mut_slice())?;
        self.cache_index(dev, buf.as_slice())
    }

    /// Where the index and filter lie: (first store block, blocks).
    fn index_extent(&self) -> (u64, usize) {
        let r = &self.regions;
        (self.meta_start, (r[1] + r[3]) as usize)
    }

    /// Decodes the index and filter from `bytes`, read from
    /// [`TableReader::index_extent`], into the index cache.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: an unpinned table has an index cache"
    )]
    fn cache_index(&self, dev: &BlockDevice, bytes: &[u8]) -> Result<Arc<TableIndex>> {
        let r = &self.regions;
        let cache = self
            .index_cache
            .as_ref()
            .expect("an unpinned table has an index cache");
        let ix = Arc::new(decode_table_index(r, bytes).map_err(|(off, what)| {
            let block = self.meta_start + (off - r[0]) as u64;
            StoreError::Corrupt {
                what: "SST",
                block,
                lba: dev.lba_of(block),
                reason: format!(
                    "keyspace {}, table {}: {what}",
                    self.keyspace_name, self.file_no
                ),
            }
        })?);
        cache.insert((self.file_no, 0), ix.clone(), self.index_bytes);
        Ok(ix)
    }

    /// Serves data blocks through `cache`.
    pub fn with_cache(mut self, cache: Arc<crate::cache::BlockCache>) -> Self {
        self.cache = Some(cache);
        self
    }

    /// Index and filter memory pinned for this table (0 when unpinned).
    pub fn pinned_bytes(&self) -> usize {
        if self.pinned.is_some() {
            self.index_bytes
        } else {
            0
        }
    }

    /// Size of the index and filter, pinned or not.
    pub fn index_bytes(&self) -> usize {
        self.index_bytes
    }

    fn read_block(&self, dev: &BlockDevice, ix: &TableIndex, i: usize) -> Result<RawBlock> {
        if let Some(hit) = self
            .cache
            .as_ref()
            .and_then(|c| c.get((self.file_no, i as u32)))
        {
            return Ok(hit);
        }
        self.read_block_from_device(dev, ix, i)
    }

    /// Block `i` read from the device (the cache was looked in already),
    /// and added to the cache.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant in its message"
    )]
    fn read_block_from_device(
        &self,
        dev: &BlockDevice,
        ix: &TableIndex,
        i: usize,
    ) -> Result<RawBlock> {
        let (block, blocks) = self.run_extent(ix, i, 1);
        let mut buf = AlignedMem::new(blocks * STORE_BLOCK_BYTES);
        dev.read(block, buf.as_mut_slice())?;
        Ok(self
            .parse_run(
                dev,
                ix,
                i,
                1,
                RunBytes::Borrowed(buf.as_slice()),
                CacheUse::FillOnly,
            )?
            .pop()
            .expect("one block"))
    }

    /// Where blocks `first..first + count` lie: (first store block, blocks).
    pub(super) fn run_extent(&self, ix: &TableIndex, first: usize, count: usize) -> (u64, usize) {
        let start = ix.index.get(first).offset_blocks;
        let last = ix.index.get(first + count - 1);
        (
            self.extent.start_block + start as u64,
            (last.offset_blocks + last.len_blocks - start) as usize,
        )
    }

    /// Verifies blocks `first..first + count` from `bytes`, read from
    /// `run_extent(first, count)`, going through the cache as `cache_use` says.
    /// Where the caller owns the bytes (`RunBytes::Shared`), blocks not
    /// cached share them instead of a copy.
    pub(super) fn parse_run(
        &self,
        dev: &BlockDevice,
        ix: &TableIndex,
        first: usize,
        count: usize,
        run: RunBytes<'_>,
        cache_use: CacheUse,
    ) -> Result<Vec<RawBlock>> {
        let start = ix.index.get(first).offset_blocks;
        let look_up = self.cache.as_ref().filter(|_| cache_use.looks_up());
        let fill = self.cache.as_ref().filter(|_| cache_use.fills());
        // Blocks kept by the cache own their bytes (a cached block must not
        // hold a whole run); blocks only walked share the run as read.
        let bytes = run.as_slice();
        let shared = fill.is_none().then(|| match run {
            RunBytes::Shared(run) => run.clone(),
            RunBytes::Borrowed(bytes) => Arc::new(BlockBytes::Own(bytes.to_vec())),
        });
        (first..first + count)
            .map(|i| {
                let key = (self.file_no, i as u32);
                if let Some(hit) = look_up.and_then(|c| c.get(key)) {
                    return Ok(hit);
                }
                let e = ix.index.get(i);
                let from = (e.offset_blocks - start) as usize * STORE_BLOCK_BYTES;
                let len = e.len_blocks as usize * STORE_BLOCK_BYTES;
                let parsed = match &shared {
                    Some(run) => RawBlock::parse_shared(run, from, len),
                    None => RawBlock::parse(&bytes[from..from + len]),
                };
                let raw = parsed.ok_or_else(|| self.corrupt_block(dev, ix, i))?;
                match fill {
                    Some(c) if cache_use == CacheUse::FillForRetry => {
                        c.insert_for_retry(key, raw.clone(), len)
                    }
                    Some(c) => c.insert(key, raw.clone(), len),
                    None => {}
                }
                Ok(raw)
            })
            .collect()
    }

    fn corrupt_block(&self, dev: &BlockDevice, ix: &TableIndex, i: usize) -> StoreError {
        let block = self.extent.start_block + ix.index.get(i).offset_blocks as u64;
        StoreError::Corrupt {
            what: "SST data block",
            block,
            lba: dev.lba_of(block),
            reason: format!(
                "keyspace {}, table {}, data block {i}: checksum mismatch or undecodable",
                self.keyspace_name, self.file_no
            ),
        }
    }

    /// Blocks `first..first + count`, if the cache holds every one.
    pub(super) fn cached_run(&self, first: usize, count: usize) -> Option<Vec<RawBlock>> {
        let cache = self.cache.as_ref()?;
        (first..first + count)
            .map(|i| cache.get((self.file_no, i as u32)))
            .collect()
    }

    /// Blocks `first..first + count` (consecutive in the extent) from the
    /// cache when it holds them all, else in one device read.
    pub(super) fn read_run(
        &self,
        dev: &BlockDevice,
        ix: &TableIndex,
        first: usize,
        count: usize,
        cache_use: CacheUse,
    ) -> Result<Vec<RawBlock>> {
        let count = count.min(ix.index.len() - first);
        if count <= 1 && cache_use == CacheUse::LookUpAndFill {
            return Ok(vec![self.read_block(dev, ix, first)?]);
        }
        if let Some(run) = self
            .cached_run(first, count)
            .filter(|_| cache_use.looks_up())
        {
            return Ok(run);
        }
        let (block, blocks) = self.run_extent(ix, first, count);
        let mut buf = AlignedMem::new(blocks * STORE_BLOCK_BYTES);
        dev.read(block, buf.as_mut_slice())?;
        let run = Arc::new(BlockBytes::Read(sluice_io::ReadBytes::Mem(buf)));
        self.parse_run(dev, ix, first, count, RunBytes::Shared(&run), cache_use)
    }

    /// Starts reading data blocks `first..first + count` ahead (see
    /// [`BlockDevice::start_read`]), or takes them from the cache when it
    /// holds them all (looked up once: the run is kept, not looked up again
    /// when its turn comes).
    pub(super) fn start_run(
        &self,
        dev: &BlockDevice,
        ix: &TableIndex,
        first: usize,
        count: usize,
        cache_use: CacheUse,
    ) -> Result<RunAhead> {
        let count = count.min(ix.index.len() - first);
        if let Some(run) = self
            .cached_run(first, count)
            .filter(|_| cache_use.looks_up())
        {
            return Ok(RunAhead::Cached(run));
        }
        let (block, blocks) = self.run_extent(ix, first, count);
        dev.start_read(block, blocks).map(RunAhead::Reading)
    }

    /// The blocks of a [`TableReader::start_run`], once read and verified.
    pub(super) fn finish_run(
        &self,
        dev: &BlockDevice,
        ix: &TableIndex,
        first: usize,
        count: usize,
        pending: PendingBlocks,
        cache_use: CacheUse,
    ) -> Result<Vec<RawBlock>> {
        let count = count.min(ix.index.len() - first);
        let run = Arc::new(BlockBytes::Read(pending.finish_owned()?));
        self.parse_run(dev, ix, first, count, RunBytes::Shared(&run), cache_use)
    }

    /// The bytes the block cache holds at most (0: no cache).
    pub fn cache_capacity_bytes(&self) -> usize {
        self.cache.as_ref().map_or(0, |c| c.capacity_bytes())
    }

    /// Puts every data block into the block cache from `data`, the table's
    /// data blocks as written (checked like blocks read from the device).
    pub fn warm_cache(&self, dev: &BlockDevice, data: &[u8]) -> Result<()> {
        if self.cache.is_none() {
            return Ok(());
        }
        let ix = self.table_index(dev)?;
        let count = ix.index.len();
        if count == 0 {
            return Ok(());
        }
        let (_, blocks) = self.run_extent(&ix, 0, count);
        let len = blocks * STORE_BLOCK_BYTES;
        if ix.index.get(0).offset_blocks != 0 || data.len() < len {
            return Ok(());
        }
        self.parse_run(
            dev,
            &ix,
            0,
            count,
            RunBytes::Borrowed(&data[..len]),
            CacheUse::FillOnly,
        )?;
        Ok(())
    }

    /// The newest version of `key` with sequence ≤ `snapshot`, if this
    /// table has one.
    pub fn get(&self, dev: &BlockDevice, key: &[u8], snapshot: u64) -> Result<Option<Entry>> {
        self.get_with(dev, key, snapshot, |hit| {
            hit.map(|(hit, value)| {
                Entry::new(key.to_vec(), hit.seq, hit.kind, value.bytes().to_vec())
            })
        })
    }

    /// [`TableReader::get`] with the value borrowed from the cached block:
    /// `f` sees the newest version of `key` at or below `snapshot` (None if
    /// the table has none) and its result is returned.
    pub fn get_with<R>(
        &self,
        dev: &BlockDevice,
        key: &[u8],
        snapshot: u64,
        f: impl FnOnce(Option<(PointHit, Found<'_>)>) -> R,
    ) -> Result<R> {
        let answered = self.get_or_miss(dev, key, snapshot, true, f)?;
        Ok(answered.unwrap_or_else(|_| unreachable!("a read that may wait never misses")))
    }

    /// [`TableReader::get_with`], or with `wait` false, when the index or
    /// the block it needs is in no cache, what to read first (`f` is not
    /// called then): a caller that must not block reads it
    /// ([`TableReader::miss_extent`]), puts it in the cache
    /// ([`TableReader::fill_miss`]) and asks again. A table without a
    /// block cache reads its blocks whatever `wait` says.
    pub fn get_or_miss<R>(
        &self,
        dev: &BlockDevice,
        key: &[u8],
        snapshot: u64,
        wait: bool,
        f: impl FnOnce(Option<(PointHit, Found<'_>)>) -> R,
    ) -> Result<std::result::Result<R, MissAt>> {
        let ix = match self.index_in_memory() {
            Some(ix) => ix,
            None if !wait => return Ok(Err(MissAt::Index)),
            None => self.table_index(dev)?,
        };
        if !ix.bloom.may_contain(key) {
            return Ok(Ok(f(None)));
        }
        let first = ix.index.partition_point(|e| {
            internal_cmp(e.last_key, e.last_seq, key, snapshot) == Ordering::Less
        });
        for i in first..ix.index.len() {
            let raw = match self.cache.as_ref().map(|c| c.get((self.file_no, i as u32))) {
                Some(Some(raw)) => raw,
                Some(None) if !wait => return Ok(Err(MissAt::Block(i))),
                Some(None) => self.read_block_from_device(dev, &ix, i)?,
                None => self.read_block(dev, &ix, i)?,
            };
            match raw.seek_point(key, snapshot) {
                Ok(hit) => {
                    return Ok(Ok(f(
                        hit.map(|h| (h, Found::in_block(&raw, h.value_at, h.value_len)))
                    )))
                }
                Err(()) => continue,
            }
        }
        Ok(Ok(f(None)))
    }

    /// The device run a miss of [`TableReader::get_or_miss`] needs read:
    /// (first store block, blocks).
    pub fn miss_extent(&self, dev: &BlockDevice, miss: MissAt) -> Result<(u64, usize)> {
        Ok(match miss {
            MissAt::Index => self.index_extent(),
            MissAt::Block(i) => self.run_extent(&*self.table_index(dev)?, i, 1),
        })
    }

    /// Puts `bytes`, read from [`TableReader::miss_extent`] of `miss`, in
    /// the cache a retried [`TableReader::get_or_miss`] looks in; checked
    /// as any read is (a corrupt block is an error naming it).
    pub fn fill_miss(&self, dev: &BlockDevice, miss: MissAt, bytes: &[u8]) -> Result<()> {
        match miss {
            MissAt::Index => {
                self.cache_index(dev, bytes)?;
            }
            MissAt::Block(i) => {
                let ix = self.table_index(dev)?;
                self.parse_run(
                    dev,
                    &ix,
                    i,
                    1,
                    RunBytes::Borrowed(bytes),
                    CacheUse::FillForRetry,
                )?;
            }
        }
        Ok(())
    }
}
