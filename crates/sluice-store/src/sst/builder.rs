//! Builds a whole table in memory from entries in internal order, and
//! writes it to its extent(s).

use super::block::{seal_region, BlockBuilder};
use super::bloom::{bloom_hash, Bloom, HashPair};
use super::index::IndexEntry;
use super::{internal_cmp, Entry, EntryKind, RangeTombstone, FOOTER_MAGIC, TARGET_BLOCK_BYTES};
use crate::blocks::{BlockDevice, Extent, STORE_BLOCK_BYTES};
use crate::error::Result;
use std::cmp::Ordering;

/// What a finished table needs in the manifest.
#[derive(Debug, Clone)]
pub struct BuiltTable {
    /// The whole table: data blocks, then index, filter, tombstones and footer.
    pub bytes: Vec<u8>,
    /// Where the index starts, in store blocks.
    pub index_offset_blocks: u32,
    /// Versions it holds.
    pub entries: u64,
    /// Its first key.
    pub smallest: Vec<u8>,
    /// Its last key.
    pub largest: Vec<u8>,
    /// The blob files its values lie in: (file number, store blocks of
    /// the records it references).
    pub blob_refs: Vec<(u64, u64)>,
}

/// Builds a table in memory from entries in internal order.
pub struct TableBuilder {
    /// The table's bytes so far: finished data blocks, then the open one.
    data: Vec<u8>,
    block: BlockBuilder,
    index: Vec<IndexEntry>,
    hashes: Vec<HashPair>,
    last: Option<(Vec<u8>, u64)>,
    smallest: Option<Vec<u8>>,
    entries: u64,
    range_tombstones: Vec<RangeTombstone>,
    /// Store blocks of blob records referenced, by blob file.
    blob_refs: std::collections::BTreeMap<u64, u64>,
}

impl Default for TableBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl TableBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::with_buffer(Vec::new())
    }

    /// An empty builder that builds in `buffer` (cleared first): one kept
    /// from an earlier table (see [`TableBuffers`]) has its pages in
    /// memory already and the capacity a table needs.
    pub fn with_buffer(mut buffer: Vec<u8>) -> Self {
        buffer.clear();
        TableBuilder {
            data: buffer,
            block: BlockBuilder::new(0),
            index: Vec::new(),
            hashes: Vec::new(),
            last: None,
            smallest: None,
            entries: 0,
            range_tombstones: Vec::new(),
            blob_refs: std::collections::BTreeMap::new(),
        }
    }

    /// Adds an entry; entries must come in strictly increasing internal order.
    pub fn add(&mut self, e: &Entry) {
        self.add_version(&e.key, e.seq, e.kind, e.value());
    }

    /// Adds one version given by its parts; versions must come in strictly
    /// increasing internal order.
    pub fn add_version(&mut self, key: &[u8], seq: u64, kind: EntryKind, value: &[u8]) {
        if let Some((k, s)) = &self.last {
            assert_eq!(
                internal_cmp(k, *s, key, seq),
                Ordering::Less,
                "entries out of order"
            );
            if k.as_slice() != key {
                self.hashes.push(bloom_hash(key));
            }
        } else {
            self.hashes.push(bloom_hash(key));
            self.smallest = Some(key.to_vec());
        }
        // Cut before an entry that would spill the block past one store
        // block: a block is padded to whole store blocks, so one that
        // spilled would be read, cached and stored at twice its size.
        // (An entry too large for a block of its own still gets one.)
        if self.block.count > 0
            && self.block.size_estimate(&self.data)
                + BlockBuilder::max_growth(key.len(), value.len())
                > TARGET_BLOCK_BYTES
        {
            self.cut_block();
        }
        if kind == EntryKind::Blob {
            // A reference that does not decode is kept as it is (reads
            // report it); it names no file to keep.
            if let Some(r) = crate::blob::BlobRef::decode(value) {
                *self.blob_refs.entry(r.file_no).or_insert(0) += r.record_blocks();
            }
        }
        self.block.add(&mut self.data, key, seq, kind, value);
        match &mut self.last {
            Some((k, s)) => {
                k.clear();
                k.extend_from_slice(key);
                *s = seq;
            }
            None => self.last = Some((key.to_vec(), seq)),
        }
        self.entries += 1;
    }

    /// Adds a range tombstone (any order).
    pub fn add_range_tombstone(&mut self, t: RangeTombstone) {
        self.range_tombstones.push(t);
    }

    /// Entries added so far.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Bytes written so far (for splitting compaction output).
    pub fn estimated_bytes(&self) -> usize {
        self.block.start() + self.block.size_estimate(&self.data)
    }

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a last entry"
    )]
    fn cut_block(&mut self) {
        if self.block.count == 0 {
            return;
        }
        let (key, seq) = self.last.clone().expect("a last entry");
        let offset_bytes = self.block.start();
        let len_bytes = self.block.finish(&mut self.data);
        debug_assert_eq!(offset_bytes + len_bytes, self.data.len());
        self.index.push(IndexEntry {
            last_key: key,
            last_seq: seq,
            offset_blocks: (offset_bytes / STORE_BLOCK_BYTES) as u32,
            len_blocks: (len_bytes / STORE_BLOCK_BYTES) as u32,
        });
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
            blob_refs: self.blob_refs.into_iter().collect(),
        }
    }
}

/// A table's buffer kept for the next table, at most one and at most
/// [`TableBuffers::MAX_KEPT_BYTES`]: a table of tens of MiB built in a
/// fresh `Vec` grows by copying and has the kernel fault in and zero every
/// page it touches, which took about a third of the background thread's
/// time under a stream of writes. Given back when the store goes idle.
#[derive(Debug, Default)]
pub struct TableBuffers {
    spare: std::sync::Mutex<Option<Vec<u8>>>,
}

impl TableBuffers {
    /// The largest buffer kept.
    pub const MAX_KEPT_BYTES: usize = 256 << 20;

    /// An empty buffer with room for `capacity_bytes` (capped at
    /// [`Self::MAX_KEPT_BYTES`]): the kept one if it is large enough, else
    /// a new one (growing the kept one would copy all of it).
    pub fn take(&self, capacity_bytes: usize) -> Vec<u8> {
        let wanted = capacity_bytes.min(Self::MAX_KEPT_BYTES);
        match self.lock().take() {
            Some(mut kept) if kept.capacity() >= wanted => {
                kept.clear();
                kept
            }
            _ => Vec::with_capacity(wanted),
        }
    }

    /// Keeps `buffer` for the next table, unless a larger one is kept
    /// already or it is larger than [`Self::MAX_KEPT_BYTES`].
    pub fn give(&self, buffer: Vec<u8>) {
        if buffer.capacity() > Self::MAX_KEPT_BYTES {
            return;
        }
        let mut spare = self.lock();
        if spare
            .as_ref()
            .is_none_or(|s| s.capacity() < buffer.capacity())
        {
            *spare = Some(buffer);
        }
    }

    /// Frees the kept buffer.
    pub fn release(&self) {
        drop(self.lock().take());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Vec<u8>>> {
        self.spare.lock().unwrap_or_else(|p| p.into_inner())
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
