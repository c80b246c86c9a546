//! Sorted string tables: one extent holding data blocks, an index, a bloom
//! filter, range tombstones and a footer. Layout in docs/FORMAT.md ("SST").
//!
//! Entries are ordered by (user key ascending, sequence descending). The
//! index, filter and range tombstones are read once at open and kept in
//! memory, so a point read costs at most one data-block read.

use crate::blocks::{trailing_crc_ok, BlockDevice, Extent, STORE_BLOCK_BYTES};
use crate::codec::Reader;
use crate::error::{Result, StoreError};
use sluice_io::mem::{round_up, AlignedMem};
use std::cmp::Ordering;
use std::sync::Arc;

const FOOTER_MAGIC: &[u8; 8] = b"SLSTFOOT";
/// A restart point (full key) every this many entries in a data block.
const RESTART_INTERVAL: usize = 16;
/// Data blocks are cut once they reach this size (a block holding one large
/// value is as many store blocks as it needs).
pub const TARGET_BLOCK_BYTES: usize = STORE_BLOCK_BYTES;
const BLOOM_BITS_PER_KEY: usize = 10;
const BLOOM_PROBES: u32 = 6;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Put = 1,
    Delete = 2,
}

/// One version of one key.
#[derive(Debug, PartialEq, Eq)]
pub struct Entry {
    pub key: Vec<u8>,
    pub seq: u64,
    pub kind: EntryKind,
    pub value: Vec<u8>,
}

impl Clone for Entry {
    fn clone(&self) -> Self {
        Entry {
            key: self.key.clone(),
            seq: self.seq,
            kind: self.kind,
            value: self.value.clone(),
        }
    }

    /// Reuses `self`'s buffers (the derived one would allocate anew).
    fn clone_from(&mut self, source: &Self) {
        self.key.clone_from(&source.key);
        self.value.clone_from(&source.value);
        self.seq = source.seq;
        self.kind = source.kind;
    }
}

impl Entry {
    /// An entry to decode into.
    pub fn empty() -> Self {
        Entry {
            key: Vec::new(),
            seq: 0,
            kind: EntryKind::Put,
            value: Vec::new(),
        }
    }
}

/// (user key asc, sequence desc).
pub fn internal_cmp(a_key: &[u8], a_seq: u64, b_key: &[u8], b_seq: u64) -> Ordering {
    a_key.cmp(b_key).then(b_seq.cmp(&a_seq))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeTombstone {
    pub start: Vec<u8>,
    pub end: Vec<u8>,
    pub seq: u64,
}

#[derive(Debug, Clone)]
struct IndexEntry {
    last_key: Vec<u8>,
    last_seq: u64,
    /// Offset from the extent start and length, in store blocks.
    offset_blocks: u32,
    len_blocks: u32,
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= ((byte & 0x7F) as u64) << shift;
        if byte < 0x80 {
            return Some(v);
        }
    }
    None
}

/// Builds one data block.
struct BlockBuilder {
    buf: Vec<u8>,
    restarts: Vec<u32>,
    last_key: Vec<u8>,
    count: usize,
}

impl BlockBuilder {
    fn new() -> Self {
        BlockBuilder {
            buf: Vec::new(),
            restarts: Vec::new(),
            last_key: Vec::new(),
            count: 0,
        }
    }

    fn add(&mut self, e: &Entry) {
        let shared = if self.count.is_multiple_of(RESTART_INTERVAL) {
            self.restarts.push(self.buf.len() as u32);
            0
        } else {
            self.last_key
                .iter()
                .zip(&e.key)
                .take_while(|(a, b)| a == b)
                .count()
        };
        put_varint(&mut self.buf, shared as u64);
        put_varint(&mut self.buf, (e.key.len() - shared) as u64);
        put_varint(&mut self.buf, e.value.len() as u64);
        self.buf
            .extend_from_slice(&((e.seq << 8) | e.kind as u64).to_le_bytes());
        self.buf.extend_from_slice(&e.key[shared..]);
        self.buf.extend_from_slice(&e.value);
        self.last_key.clear();
        self.last_key.extend_from_slice(&e.key);
        self.count += 1;
    }

    /// The most an entry can add to a block: whole key, a restart offset.
    fn max_growth(e: &Entry) -> usize {
        let varint_len = |v: usize| (usize::BITS - v.max(1).leading_zeros()).div_ceil(7) as usize;
        varint_len(0)
            + varint_len(e.key.len())
            + varint_len(e.value.len())
            + 8
            + e.key.len()
            + e.value.len()
            + 4
    }

    fn size_estimate(&self) -> usize {
        self.buf.len() + 4 * self.restarts.len() + 12
    }

    /// The block padded to whole store blocks: entries, restart offsets,
    /// zero padding, then in the last 12 bytes `u32 restart count`,
    /// `u32 entries length`, `u32 CRC32C` of everything before it.
    fn finish(self) -> Vec<u8> {
        let mut b = self.buf;
        let entries_len = b.len() as u32;
        for r in &self.restarts {
            b.extend_from_slice(&r.to_le_bytes());
        }
        let padded = round_up(b.len() + 12, STORE_BLOCK_BYTES);
        b.resize(padded, 0);
        b[padded - 12..padded - 8].copy_from_slice(&(self.restarts.len() as u32).to_le_bytes());
        b[padded - 8..padded - 4].copy_from_slice(&entries_len.to_le_bytes());
        let crc = crc32c::crc32c(&b[..padded - 4]);
        b[padded - 4..].copy_from_slice(&crc.to_le_bytes());
        b
    }
}

/// A region (index, filter, range tombstones): payload, padded, with
/// `u32 payload length` and `u32 CRC32C` in its last 8 bytes.
fn seal_region(mut payload: Vec<u8>) -> Vec<u8> {
    let len = payload.len() as u32;
    let padded = round_up(payload.len() + 8, STORE_BLOCK_BYTES);
    payload.resize(padded, 0);
    payload[padded - 8..padded - 4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c(&payload[..padded - 4]);
    payload[padded - 4..].copy_from_slice(&crc.to_le_bytes());
    payload
}

fn open_region(region: &[u8]) -> Option<&[u8]> {
    let n = region.len();
    if n < 8 || !trailing_crc_ok(region) {
        return None;
    }
    let len = u32::from_le_bytes(region[n - 8..n - 4].try_into().ok()?) as usize;
    region.get(..len)
}

/// A bloom filter with double hashing.
#[derive(Debug, Clone)]
pub struct Bloom {
    bits: Vec<u8>,
}

fn bloom_hash(key: &[u8]) -> (u32, u32) {
    let h = crc32c::crc32c(key);
    let h2 = crc32c::crc32c_append(0x9E37_79B9, key) | 1;
    (h, h2)
}

impl Bloom {
    fn build(keys: &[HashPair]) -> Self {
        let nbits = (keys.len() * BLOOM_BITS_PER_KEY).max(64);
        let mut bits = vec![0u8; nbits.div_ceil(8)];
        let nbits = bits.len() * 8;
        for &(h, d) in keys {
            let mut x = h;
            for _ in 0..BLOOM_PROBES {
                let bit = x as usize % nbits;
                bits[bit / 8] |= 1 << (bit % 8);
                x = x.wrapping_add(d);
            }
        }
        Bloom { bits }
    }

    pub fn may_contain(&self, key: &[u8]) -> bool {
        let nbits = self.bits.len() * 8;
        let (mut x, d) = bloom_hash(key);
        (0..BLOOM_PROBES).all(|_| {
            let bit = x as usize % nbits;
            x = x.wrapping_add(d);
            self.bits[bit / 8] & (1 << (bit % 8)) != 0
        })
    }
}

type HashPair = (u32, u32);

/// What a finished table needs in the manifest.
#[derive(Debug, Clone)]
pub struct BuiltTable {
    pub bytes: Vec<u8>,
    pub index_offset_blocks: u32,
    pub entries: u64,
    pub smallest: Vec<u8>,
    pub largest: Vec<u8>,
}

/// Builds a table in memory from entries in internal order.
pub struct TableBuilder {
    data: Vec<u8>,
    block: BlockBuilder,
    index: Vec<IndexEntry>,
    hashes: Vec<HashPair>,
    last: Option<(Vec<u8>, u64)>,
    smallest: Option<Vec<u8>>,
    entries: u64,
    range_tombstones: Vec<RangeTombstone>,
}

impl Default for TableBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl TableBuilder {
    pub fn new() -> Self {
        TableBuilder {
            data: Vec::new(),
            block: BlockBuilder::new(),
            index: Vec::new(),
            hashes: Vec::new(),
            last: None,
            smallest: None,
            entries: 0,
            range_tombstones: Vec::new(),
        }
    }

    /// Adds an entry; entries must come in strictly increasing internal order.
    pub fn add(&mut self, e: &Entry) {
        if let Some((k, s)) = &self.last {
            assert_eq!(
                internal_cmp(k, *s, &e.key, e.seq),
                Ordering::Less,
                "entries out of order"
            );
            if k != &e.key {
                self.hashes.push(bloom_hash(&e.key));
            }
        } else {
            self.hashes.push(bloom_hash(&e.key));
            self.smallest = Some(e.key.clone());
        }
        // Cut before an entry that would spill the block past one store
        // block: a block is padded to whole store blocks, so one that
        // spilled would be read, cached and stored at twice its size.
        // (An entry too large for a block of its own still gets one.)
        if self.block.count > 0
            && self.block.size_estimate() + BlockBuilder::max_growth(e) > TARGET_BLOCK_BYTES
        {
            self.cut_block();
        }
        self.block.add(e);
        match &mut self.last {
            Some((k, s)) => {
                k.clone_from(&e.key);
                *s = e.seq;
            }
            None => self.last = Some((e.key.clone(), e.seq)),
        }
        self.entries += 1;
    }

    pub fn add_range_tombstone(&mut self, t: RangeTombstone) {
        self.range_tombstones.push(t);
    }

    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Bytes written so far (for splitting compaction output).
    pub fn estimated_bytes(&self) -> usize {
        self.data.len() + self.block.size_estimate()
    }

    fn cut_block(&mut self) {
        if self.block.count == 0 {
            return;
        }
        let (key, seq) = self.last.clone().expect("a last entry");
        let block = std::mem::replace(&mut self.block, BlockBuilder::new()).finish();
        self.index.push(IndexEntry {
            last_key: key,
            last_seq: seq,
            offset_blocks: (self.data.len() / STORE_BLOCK_BYTES) as u32,
            len_blocks: (block.len() / STORE_BLOCK_BYTES) as u32,
        });
        self.data.extend_from_slice(&block);
    }

    /// Data, index, filter, range tombstones, footer.
    pub fn finish(mut self) -> BuiltTable {
        self.cut_block();
        let mut index = Vec::new();
        index.extend_from_slice(&(self.index.len() as u32).to_le_bytes());
        for e in &self.index {
            index.extend_from_slice(&(e.last_key.len() as u32).to_le_bytes());
            index.extend_from_slice(&e.last_key);
            index.extend_from_slice(&e.last_seq.to_le_bytes());
            index.extend_from_slice(&e.offset_blocks.to_le_bytes());
            index.extend_from_slice(&e.len_blocks.to_le_bytes());
        }
        let bloom = Bloom::build(&self.hashes);
        let mut ranges = Vec::new();
        ranges.extend_from_slice(&(self.range_tombstones.len() as u32).to_le_bytes());
        for t in &self.range_tombstones {
            for part in [&t.start, &t.end] {
                ranges.extend_from_slice(&(part.len() as u32).to_le_bytes());
                ranges.extend_from_slice(part);
            }
            ranges.extend_from_slice(&t.seq.to_le_bytes());
        }
        let index_region = seal_region(index);
        let filter_region = seal_region(bloom.bits);
        let range_region = seal_region(ranges);
        let blocks = |n: usize| (n / STORE_BLOCK_BYTES) as u32;
        let index_off = blocks(self.data.len());
        let filter_off = index_off + blocks(index_region.len());
        let range_off = filter_off + blocks(filter_region.len());
        let footer_off = range_off + blocks(range_region.len());
        let mut footer = vec![0u8; STORE_BLOCK_BYTES];
        for (i, v) in [
            index_off,
            blocks(index_region.len()),
            filter_off,
            blocks(filter_region.len()),
            range_off,
            blocks(range_region.len()),
        ]
        .iter()
        .enumerate()
        {
            footer[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        footer[24..32].copy_from_slice(&self.entries.to_le_bytes());
        footer[STORE_BLOCK_BYTES - 12..STORE_BLOCK_BYTES - 4].copy_from_slice(FOOTER_MAGIC);
        let crc = crc32c::crc32c(&footer[..STORE_BLOCK_BYTES - 4]);
        footer[STORE_BLOCK_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
        let mut bytes = self.data;
        bytes.extend_from_slice(&index_region);
        bytes.extend_from_slice(&filter_region);
        bytes.extend_from_slice(&range_region);
        bytes.extend_from_slice(&footer);
        debug_assert_eq!(bytes.len() / STORE_BLOCK_BYTES, footer_off as usize + 1);
        // The key range is that of the point keys; a table holding only
        // range tombstones spans them instead (a deeper level's caller may
        // narrow it to keep the level disjoint).
        let (smallest, largest) = match (self.smallest, self.last) {
            (Some(s), Some((l, _))) => (s, l),
            _ => (
                self.range_tombstones
                    .iter()
                    .map(|t| t.start.clone())
                    .min()
                    .unwrap_or_default(),
                self.range_tombstones
                    .iter()
                    .map(|t| t.end.clone())
                    .max()
                    .unwrap_or_default(),
            ),
        };
        BuiltTable {
            bytes,
            index_offset_blocks: index_off,
            entries: self.entries,
            smallest,
            largest,
        }
    }
}

/// Writes a built table into `extent` (sized to it) and makes it durable.
pub fn write_table(dev: &BlockDevice, extent: Extent, table: &BuiltTable) -> Result<()> {
    let data_blocks = table.index_offset_blocks;
    let meta = Extent {
        start_block: extent.start_block + data_blocks as u64,
        block_count: extent.block_count - data_blocks,
    };
    write_table_parts(dev, extent, meta, table)
}

/// Writes a built table's data blocks from `data.start_block` and its
/// index, filter, range tombstones and footer into `meta` (sized to them),
/// and makes them durable. The two may lie on different devices.
pub fn write_table_parts(
    dev: &BlockDevice,
    data: Extent,
    meta: Extent,
    table: &BuiltTable,
) -> Result<()> {
    let split = table.index_offset_blocks as usize * STORE_BLOCK_BYTES;
    assert_eq!(
        table.bytes.len() - split,
        meta.block_count as usize * STORE_BLOCK_BYTES
    );
    assert!(split <= data.block_count as usize * STORE_BLOCK_BYTES);
    let (data_bytes, meta_bytes) = table.bytes.split_at(split);
    dev.write(data.start_block, data_bytes)?;
    dev.write(meta.start_block, meta_bytes)?;
    dev.flush()
}

/// How a block read goes through the block cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CacheUse {
    /// Cached blocks are taken from the cache, new ones added.
    LookUpAndFill,
    /// The caller has looked already: only add.
    FillOnly,
    Bypass,
}

impl From<bool> for CacheUse {
    fn from(use_cache: bool) -> Self {
        if use_cache {
            CacheUse::LookUpAndFill
        } else {
            CacheUse::Bypass
        }
    }
}

/// A table's index and bloom filter.
#[derive(Debug)]
pub struct TableIndex {
    index: BlockIndex,
    bloom: Bloom,
}

impl TableIndex {
    /// Memory it holds.
    pub fn bytes(&self) -> usize {
        self.index.bytes() + self.bloom.bits.len()
    }
}

/// The index in memory, one column per field and every last key in one
/// buffer: 20 bytes per data block plus its key, with no allocation per
/// entry (it is most of the pinned memory).
#[derive(Debug, Default)]
struct BlockIndex {
    keys: Vec<u8>,
    /// End of each block's last key in `keys`.
    key_ends: Vec<u32>,
    last_seqs: Vec<u64>,
    offsets_blocks: Vec<u32>,
    lens_blocks: Vec<u32>,
}

/// One entry of a [`BlockIndex`].
#[derive(Debug, Clone, Copy)]
struct IndexView<'a> {
    last_key: &'a [u8],
    last_seq: u64,
    offset_blocks: u32,
    len_blocks: u32,
}

impl BlockIndex {
    fn push(&mut self, last_key: &[u8], last_seq: u64, offset_blocks: u32, len_blocks: u32) {
        self.keys.extend_from_slice(last_key);
        self.key_ends.push(self.keys.len() as u32);
        self.last_seqs.push(last_seq);
        self.offsets_blocks.push(offset_blocks);
        self.lens_blocks.push(len_blocks);
    }

    fn shrink(mut self) -> Self {
        self.keys.shrink_to_fit();
        self.key_ends.shrink_to_fit();
        self.last_seqs.shrink_to_fit();
        self.offsets_blocks.shrink_to_fit();
        self.lens_blocks.shrink_to_fit();
        self
    }

    fn len(&self) -> usize {
        self.key_ends.len()
    }

    fn get(&self, i: usize) -> IndexView<'_> {
        let from = if i == 0 {
            0
        } else {
            self.key_ends[i - 1] as usize
        };
        IndexView {
            last_key: &self.keys[from..self.key_ends[i] as usize],
            last_seq: self.last_seqs[i],
            offset_blocks: self.offsets_blocks[i],
            len_blocks: self.lens_blocks[i],
        }
    }

    fn last(&self) -> Option<IndexView<'_>> {
        self.len().checked_sub(1).map(|i| self.get(i))
    }

    /// The first entry for which `before` is false (`before` must hold
    /// for a prefix of the entries).
    fn partition_point(&self, before: impl Fn(IndexView<'_>) -> bool) -> usize {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if before(self.get(mid)) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    fn bytes(&self) -> usize {
        self.keys.capacity()
            + 4 * self.key_ends.capacity()
            + 8 * self.last_seqs.capacity()
            + 4 * self.offsets_blocks.capacity()
            + 4 * self.lens_blocks.capacity()
    }
}

/// The bound on pinned index and filter memory, shared by a store's tables.
#[derive(Debug)]
pub struct PinBudget {
    limit_bytes: usize,
    used_bytes: std::sync::atomic::AtomicUsize,
}

impl PinBudget {
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

    pub fn used_bytes(&self) -> usize {
        self.used_bytes.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn limit_bytes(&self) -> usize {
        self.limit_bytes
    }
}

/// An open table: range tombstones in memory; index and filter pinned in
/// memory while the pin budget lasts, else read on demand through the
/// index cache.
#[derive(Debug)]
pub struct TableReader {
    pub file_no: u64,
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
    pub range_tombstones: Vec<RangeTombstone>,
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
    pub keyspace: &'a str,
    pub file_no: u64,
}

impl TableReader {
    /// Opens a table written whole into one extent.
    pub fn open(dev: &BlockDevice, extent: Extent, place: TablePlace<'_>) -> Result<Self> {
        Self::open_parts(dev, extent, None, place)
    }

    /// Opens a table whose data blocks start at `data.start_block` and
    /// whose index, filter, range tombstones and footer fill `meta` (None:
    /// they follow the data blocks inside `data`).
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
        let crc = u32::from_le_bytes(f[STORE_BLOCK_BYTES - 4..].try_into().expect("4"));
        if &f[STORE_BLOCK_BYTES - 12..STORE_BLOCK_BYTES - 4] != FOOTER_MAGIC
            || crc32c::crc32c(&f[..STORE_BLOCK_BYTES - 4]) != crc
        {
            return Err(corrupt(
                footer_block,
                "footer checksum or magic mismatch".into(),
            ));
        }
        let at = |i: usize| u32::from_le_bytes(f[i * 4..i * 4 + 4].try_into().expect("4"));
        let entries = u64::from_le_bytes(f[24..32].try_into().expect("8"));
        // Index, filter and range tombstones are contiguous: one read.
        let (meta_off, meta_len) = (at(0), at(1) + at(3) + at(5));
        let meta_start = meta.map_or(extent.start_block + meta_off as u64, |m| m.start_block);
        if let Some(m) = meta.filter(|m| m.block_count != meta_len + 1) {
            return Err(corrupt(
                m.start_block,
                format!(
                    "footer describes {} blocks of index, filter and tombstones but their extent has {}",
                    meta_len + 1,
                    m.block_count
                ),
            ));
        }
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

    /// The index and filter: pinned, cached, or read from the device.
    pub fn table_index(&self, dev: &BlockDevice) -> Result<Arc<TableIndex>> {
        if let Some(ix) = &self.pinned {
            return Ok(ix.clone());
        }
        let cache = self
            .index_cache
            .as_ref()
            .expect("an unpinned table has an index cache");
        if let Some(ix) = cache.get((self.file_no, 0)) {
            return Ok(ix);
        }
        let r = &self.regions;
        let first = self.meta_start;
        let mut buf = AlignedMem::new((r[1] + r[3]) as usize * STORE_BLOCK_BYTES);
        dev.read(first, buf.as_mut_slice())?;
        let ix = Arc::new(
            decode_table_index(r, buf.as_slice()).map_err(|(off, what)| {
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
            })?,
        );
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

    fn read_block(&self, dev: &BlockDevice, ix: &TableIndex, i: usize) -> Result<Arc<RawBlock>> {
        if let Some(hit) = self
            .cache
            .as_ref()
            .and_then(|c| c.get((self.file_no, i as u32)))
        {
            return Ok(hit);
        }
        let (block, blocks) = self.run_extent(ix, i, 1);
        let mut buf = AlignedMem::new(blocks * STORE_BLOCK_BYTES);
        dev.read(block, buf.as_mut_slice())?;
        Ok(self
            .parse_run(dev, ix, i, 1, buf.as_slice(), CacheUse::FillOnly)?
            .pop()
            .expect("one block"))
    }

    /// Where blocks `first..first + count` lie: (first store block, blocks).
    fn run_extent(&self, ix: &TableIndex, first: usize, count: usize) -> (u64, usize) {
        let start = ix.index.get(first).offset_blocks;
        let last = ix.index.get(first + count - 1);
        (
            self.extent.start_block + start as u64,
            (last.offset_blocks + last.len_blocks - start) as usize,
        )
    }

    /// Verifies blocks `first..first + count` from `bytes`, read from
    /// `run_extent(first, count)`, going through the cache as `cache_use` says.
    fn parse_run(
        &self,
        dev: &BlockDevice,
        ix: &TableIndex,
        first: usize,
        count: usize,
        bytes: &[u8],
        cache_use: CacheUse,
    ) -> Result<Vec<Arc<RawBlock>>> {
        let start = ix.index.get(first).offset_blocks;
        let cache = self
            .cache
            .as_ref()
            .filter(|_| cache_use != CacheUse::Bypass);
        let look_up = cache.filter(|_| cache_use == CacheUse::LookUpAndFill);
        (first..first + count)
            .map(|i| {
                let key = (self.file_no, i as u32);
                if let Some(hit) = look_up.and_then(|c| c.get(key)) {
                    return Ok(hit);
                }
                let e = ix.index.get(i);
                let from = (e.offset_blocks - start) as usize * STORE_BLOCK_BYTES;
                let len = e.len_blocks as usize * STORE_BLOCK_BYTES;
                let block = self.extent.start_block + e.offset_blocks as u64;
                let raw = Arc::new(RawBlock::parse(&bytes[from..from + len]).ok_or_else(|| {
                    StoreError::Corrupt {
                        what: "SST data block",
                        block,
                        lba: dev.lba_of(block),
                        reason: format!(
                        "keyspace {}, table {}, data block {i}: checksum mismatch or undecodable",
                        self.keyspace_name, self.file_no
                    ),
                    }
                })?);
                if let Some(c) = cache {
                    c.insert(key, raw.clone(), len);
                }
                Ok(raw)
            })
            .collect()
    }

    /// Blocks `first..first + count`, if the cache holds every one.
    fn cached_run(&self, first: usize, count: usize) -> Option<Vec<Arc<RawBlock>>> {
        let cache = self.cache.as_ref()?;
        (first..first + count)
            .map(|i| cache.get((self.file_no, i as u32)))
            .collect()
    }

    /// Blocks `first..first + count` (consecutive in the extent) from the
    /// cache when it holds them all, else in one device read.
    fn read_run(
        &self,
        dev: &BlockDevice,
        ix: &TableIndex,
        first: usize,
        count: usize,
        use_cache: bool,
    ) -> Result<Vec<Arc<RawBlock>>> {
        let count = count.min(ix.index.len() - first);
        if count <= 1 && use_cache {
            return Ok(vec![self.read_block(dev, ix, first)?]);
        }
        if let Some(run) = self.cached_run(first, count).filter(|_| use_cache) {
            return Ok(run);
        }
        let (block, blocks) = self.run_extent(ix, first, count);
        let mut buf = AlignedMem::new(blocks * STORE_BLOCK_BYTES);
        dev.read(block, buf.as_mut_slice())?;
        self.parse_run(
            dev,
            ix,
            first,
            count,
            buf.as_slice(),
            CacheUse::from(use_cache),
        )
    }

    /// The newest version of `key` with sequence ≤ `snapshot`, if this
    /// table has one.
    pub fn get(&self, dev: &BlockDevice, key: &[u8], snapshot: u64) -> Result<Option<Entry>> {
        let ix = self.table_index(dev)?;
        if !ix.bloom.may_contain(key) {
            return Ok(None);
        }
        let first = ix.index.partition_point(|e| {
            internal_cmp(e.last_key, e.last_seq, key, snapshot) == Ordering::Less
        });
        for i in first..ix.index.len() {
            let raw = self.read_block(dev, &ix, i)?;
            match raw.seek(key, snapshot) {
                Some(e) if e.key == key => return Ok(Some(e)),
                Some(_) => return Ok(None),
                None => continue,
            }
        }
        Ok(None)
    }

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
        Ok(TableCursor {
            state: CursorState::new(self.table_index(dev)?, self.entries, spec),
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

/// The index and filter from the bytes of their two regions (read
/// together), or the offset of the bad region and what is wrong with it.
fn decode_table_index(
    regions: &[u32; 6],
    bytes: &[u8],
) -> std::result::Result<TableIndex, (u32, &'static str)> {
    let index_len = regions[1] as usize * STORE_BLOCK_BYTES;
    let filter_len = regions[3] as usize * STORE_BLOCK_BYTES;
    let index_bytes = bytes
        .get(..index_len)
        .and_then(open_region)
        .ok_or((regions[0], "region checksum mismatch"))?;
    let bits = bytes
        .get(index_len..index_len + filter_len)
        .and_then(open_region)
        .ok_or((regions[2], "region checksum mismatch"))?;
    let index = decode_index(index_bytes).ok_or((regions[0], "index does not decode"))?;
    Ok(TableIndex {
        index,
        bloom: Bloom {
            bits: bits.to_vec(),
        },
    })
}

fn decode_index(b: &[u8]) -> Option<BlockIndex> {
    let mut r = Reader::new(b);
    let n = r.u32()?;
    let mut index = BlockIndex::default();
    for _ in 0..n {
        let key = r.bytes()?;
        index.push(&key, r.u64()?, r.u32()?, r.u32()?);
    }
    Some(index.shrink())
}

fn decode_ranges(b: &[u8]) -> Option<Vec<RangeTombstone>> {
    let mut r = Reader::new(b);
    let n = r.u32()?;
    (0..n)
        .map(|_| {
            Some(RangeTombstone {
                start: r.bytes()?,
                end: r.bytes()?,
                seq: r.u64()?,
            })
        })
        .collect()
}

/// Most data blocks one read-ahead fetches (256 KiB of 4 KiB blocks).
const READAHEAD_MAX_BLOCKS: usize = 64;
/// Blocks the first read of a cursor fetches; each later read doubles it.
const READAHEAD_FIRST_BLOCKS: usize = 2;

/// What a cursor walks: keys in `[start, end)` (end None: unbounded),
/// forward (internal order) or reverse (key descending, sequence
/// ascending).
#[derive(Debug, Clone)]
pub struct CursorSpec {
    pub start: Vec<u8>,
    pub end: Option<Vec<u8>>,
    pub reverse: bool,
    /// Blocks read are looked up in and added to the block cache. A
    /// compaction reads without it, so it does not evict what readers use.
    pub use_cache: bool,
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
            expected_entries: 0,
        }
    }
}

/// Position of a cursor in one table; the table and device are passed in,
/// so the same state serves borrowed and owning cursors.
struct CursorState {
    ix: Arc<TableIndex>,
    spec: CursorSpec,
    /// Data blocks not yet read: `lo..hi`. Forward reads from `lo` up,
    /// reverse from `hi` down.
    lo: usize,
    hi: usize,
    /// Blocks read ahead, in the order they will be walked, and how many
    /// the next read takes: doubling while the cursor keeps going.
    prefetched: std::collections::VecDeque<Arc<RawBlock>>,
    readahead: usize,
    /// Forward: the block being walked, the byte offset of its next entry
    /// and the key before it.
    block: Option<Arc<RawBlock>>,
    pos: usize,
    last_key: Vec<u8>,
    /// Forward: a key at or past the start was seen, so every later one is
    /// too (keys only grow) and needs no comparison with the start.
    past_start: bool,
    /// Reverse: the current block's entries still to give, last first.
    decoded: Vec<Entry>,
}

impl CursorState {
    fn new(ix: Arc<TableIndex>, entries: u64, spec: CursorSpec) -> Self {
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
            decoded: Vec::new(),
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
    fn take_run(&mut self, run: Vec<Arc<RawBlock>>) {
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
        self.lo = self.hi;
        self.prefetched.clear();
        self.block = None;
        self.decoded.clear();
    }

    /// The next prefetched block, reading a run first if none is left.
    fn next_block(
        &mut self,
        table: &TableReader,
        dev: &BlockDevice,
    ) -> Result<Option<Arc<RawBlock>>> {
        if self.prefetched.is_empty() {
            let Some((first, count)) = self.next_run() else {
                return Ok(None);
            };
            let run = table.read_run(dev, &self.ix, first, count, self.spec.use_cache)?;
            self.take_run(run);
        }
        Ok(self.prefetched.pop_front())
    }

    /// The next entry as an owned value (tests, flush checks).
    fn next_entry(&mut self, table: &TableReader, dev: &BlockDevice) -> Result<Option<Entry>> {
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
                    // The key first: entries before the start are passed
                    // over without copying their values.
                    self.last_key.truncate(e.shared);
                    self.last_key
                        .extend_from_slice(&block.bytes[e.key_at..e.key_at + e.unshared]);
                    if !self.past_start {
                        if self.last_key.as_slice() < self.spec.start.as_slice() {
                            continue;
                        }
                        self.past_start = true;
                    }
                    past_end = self
                        .spec
                        .end
                        .as_deref()
                        .is_some_and(|end| self.last_key.as_slice() >= end);
                    if !past_end {
                        out.key.clone_from(&self.last_key);
                        out.value.clear();
                        out.value
                            .extend_from_slice(&block.bytes[e.value_at..e.value_at + e.value_len]);
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
    table: Arc<TableReader>,
    dev: BlockDevice,
    state: CursorState,
}

impl TableCursor {
    /// Takes the first run from the block cache if it holds all of it;
    /// then there is no first read to batch.
    pub fn first_from_cache(&mut self) -> bool {
        let s = &mut self.state;
        if !s.spec.use_cache || !s.prefetched.is_empty() || s.block.is_some() {
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
        if !s.prefetched.is_empty() || s.block.is_some() || !s.decoded.is_empty() {
            return None;
        }
        let (first, count) = s.next_run()?;
        Some(self.table.run_extent(&s.ix, first, count))
    }

    /// Hands the cursor the bytes of its `first_read`.
    pub fn seed(&mut self, bytes: &[u8]) -> Result<()> {
        let (first, count) = self.state.next_run().expect("a first read");
        let run = self.table.parse_run(
            &self.dev,
            &self.state.ix,
            first,
            count,
            bytes,
            CacheUse::from(self.state.spec.use_cache),
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

/// A data block whose checksum has been verified, searched in place.
#[derive(Debug)]
pub struct RawBlock {
    bytes: Vec<u8>,
    entries_len: usize,
    restarts: Vec<u32>,
}

/// Where the parts of one encoded entry lie in a block.
#[derive(Debug, Clone, Copy)]
struct EntryAt {
    shared: usize,
    /// The unshared key bytes and the value, as byte ranges of the block.
    key_at: usize,
    unshared: usize,
    value_at: usize,
    value_len: usize,
    seq: u64,
    kind: EntryKind,
    next: usize,
}

impl RawBlock {
    /// Verifies the checksum and the trailer, and that every entry decodes,
    /// without building any entry.
    pub fn parse(b: &[u8]) -> Option<Self> {
        let n = b.len();
        if n < 12 || !trailing_crc_ok(b) {
            return None;
        }
        let count = u32::from_le_bytes(b[n - 12..n - 8].try_into().ok()?) as usize;
        let entries_len = u32::from_le_bytes(b[n - 8..n - 4].try_into().ok()?) as usize;
        let restarts_end = entries_len.checked_add(count.checked_mul(4)?)?;
        if restarts_end > n - 12 {
            return None;
        }
        let restarts: Vec<u32> = b[entries_len..restarts_end]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4")))
            .collect();
        if restarts.first().is_some_and(|&r| r != 0) || restarts.windows(2).any(|w| w[0] >= w[1]) {
            return None;
        }
        let block = RawBlock {
            bytes: b[..entries_len].to_vec(),
            entries_len,
            restarts,
        };
        let (mut at, mut last_key_len) = (0, 0);
        let mut restarts = block.restarts.iter().peekable();
        while at < entries_len {
            let e = block.entry_at(at)?;
            // A restart point stores its key whole.
            if restarts.next_if(|&&r| r as usize == at).is_some() && e.shared != 0 {
                return None;
            }
            if e.shared > last_key_len {
                return None;
            }
            last_key_len = e.shared + e.unshared;
            at = e.next;
        }
        (restarts.next().is_none() && at == entries_len).then_some(block)
    }

    /// The layout of the entry at byte `at`, bounds-checked.
    fn entry_at(&self, mut at: usize) -> Option<EntryAt> {
        let body = &self.bytes;
        let shared = get_varint(body, &mut at)? as usize;
        let unshared = get_varint(body, &mut at)? as usize;
        let value_len = get_varint(body, &mut at)? as usize;
        let trailer = u64::from_le_bytes(body.get(at..at.checked_add(8)?)?.try_into().ok()?);
        let key_at = at + 8;
        let value_at = key_at.checked_add(unshared)?;
        let next = value_at.checked_add(value_len)?;
        if next > body.len() {
            return None;
        }
        let kind = match trailer & 0xFF {
            1 => EntryKind::Put,
            2 => EntryKind::Delete,
            _ => return None,
        };
        Some(EntryAt {
            shared,
            key_at,
            unshared,
            value_at,
            value_len,
            seq: trailer >> 8,
            kind,
            next,
        })
    }

    /// Decodes the entry at byte `at` into `out`, reusing its buffers;
    /// `out.key` must hold the key before it (anything at a restart point).
    /// Returns the next entry's offset.
    fn decode_into(&self, at: usize, out: &mut Entry) -> usize {
        let e = self.entry_at(at).expect("a verified block decodes");
        out.key.truncate(e.shared);
        out.key
            .extend_from_slice(&self.bytes[e.key_at..e.key_at + e.unshared]);
        out.value.clear();
        out.value
            .extend_from_slice(&self.bytes[e.value_at..e.value_at + e.value_len]);
        out.seq = e.seq;
        out.kind = e.kind;
        e.next
    }

    /// Every entry of the block, in order.
    fn decode_all(&self) -> Vec<Entry> {
        let mut out: Vec<Entry> = Vec::new();
        let mut e = Entry::empty();
        let mut at = 0;
        while at < self.entries_len {
            at = self.decode_into(at, &mut e);
            out.push(e.clone());
        }
        out
    }

    /// The key and sequence stored whole at restart point `r`.
    fn restart_key(&self, r: usize) -> (&[u8], u64) {
        let e = self
            .entry_at(self.restarts[r] as usize)
            .expect("a verified block decodes");
        (&self.bytes[e.key_at..e.key_at + e.unshared], e.seq)
    }

    /// Index of the first restart point not before the target, found by
    /// binary search with `before(key, seq)`.
    fn first_restart_not_before(&self, before: impl Fn(&[u8], u64) -> bool) -> usize {
        let (mut lo, mut hi) = (0usize, self.restarts.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            let (k, s) = self.restart_key(mid);
            if before(k, s) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Offset of the last restart point whose key is before `key` (or 0).
    fn restart_before(&self, key: &[u8]) -> usize {
        let r = self.first_restart_not_before(|k, _| k < key);
        self.restarts
            .get(r.saturating_sub(1))
            .map_or(0, |&o| o as usize)
    }

    /// The first entry at or after (key, snapshot) in internal order.
    pub fn seek(&self, key: &[u8], snapshot: u64) -> Option<Entry> {
        let r = self
            .first_restart_not_before(|k, s| internal_cmp(k, s, key, snapshot) == Ordering::Less);
        let mut at = self
            .restarts
            .get(r.saturating_sub(1))
            .map_or(0, |&o| o as usize);
        let mut e = Entry::empty();
        while at < self.entries_len {
            let next = self.entry_at(at).expect("a verified block decodes");
            // Compare before copying the value: most entries passed over
            // are not the answer.
            e.key.truncate(next.shared);
            e.key
                .extend_from_slice(&self.bytes[next.key_at..next.key_at + next.unshared]);
            if internal_cmp(&e.key, next.seq, key, snapshot) != Ordering::Less {
                self.decode_into(at, &mut e);
                return Some(e);
            }
            at = next.next;
        }
        None
    }
}
