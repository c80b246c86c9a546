//! A table's block index as it lives in memory (one column per field), and
//! the decoding of the index, filter and range-tombstone regions.

use super::block::open_region;
use super::bloom::Bloom;
use super::RangeTombstone;
use crate::blocks::STORE_BLOCK_BYTES;
use crate::codec::Reader;

#[derive(Debug, Clone)]
pub(super) struct IndexEntry {
    pub(super) last_key: Vec<u8>,
    pub(super) last_seq: u64,
    /// Offset from the extent start and length, in store blocks.
    pub(super) offset_blocks: u32,
    pub(super) len_blocks: u32,
}

/// A table's index and bloom filter.
#[derive(Debug)]
pub struct TableIndex {
    pub(super) index: BlockIndex,
    pub(super) bloom: Bloom,
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
pub(super) struct BlockIndex {
    keys: Vec<u8>,
    /// End of each block's last key in `keys`.
    key_ends: Vec<u32>,
    last_seqs: Vec<u64>,
    offsets_blocks: Vec<u32>,
    lens_blocks: Vec<u32>,
}

/// One entry of a [`BlockIndex`].
#[derive(Debug, Clone, Copy)]
pub(super) struct IndexView<'a> {
    pub(super) last_key: &'a [u8],
    pub(super) last_seq: u64,
    pub(super) offset_blocks: u32,
    pub(super) len_blocks: u32,
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

    pub(super) fn len(&self) -> usize {
        self.key_ends.len()
    }

    pub(super) fn get(&self, i: usize) -> IndexView<'_> {
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

    pub(super) fn last(&self) -> Option<IndexView<'_>> {
        self.len().checked_sub(1).map(|i| self.get(i))
    }

    /// The first entry for which `before` is false (`before` must hold
    /// for a prefix of the entries).
    pub(super) fn partition_point(&self, before: impl Fn(IndexView<'_>) -> bool) -> usize {
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

/// The index and filter from the bytes of their two regions (read
/// together), or the offset of the bad region and what is wrong with it.
pub(super) fn decode_table_index(
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

pub(super) fn decode_ranges(b: &[u8]) -> Option<Vec<RangeTombstone>> {
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
