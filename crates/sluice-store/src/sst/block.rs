//! A data block: entries with shared key prefixes and restart points,
//! encoded by [`BlockBuilder`] and searched in place by [`RawBlock`]; and
//! the framing (length + CRC32C) of a table's other regions.

use super::{internal_cmp, Entry, EntryKind};
use crate::blocks::{trailing_crc_ok, STORE_BLOCK_BYTES};
use crate::codec::{u32_at, u64_at, Reader};
use sluice_io::mem::{prefetch_read, round_up};
use std::cmp::Ordering;
use std::sync::Arc;

/// A restart point (full key) every this many entries in a data block.
const RESTART_INTERVAL: usize = 16;

/// A point read asks for every restart key of a block at once when the
/// block has at most this many (a 4 KiB block of 100-byte values has 3).
const PREFETCHED_RESTARTS_MAX: usize = 8;

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

/// Builds one data block at the end of its table's bytes: entries are
/// encoded straight into the table, not into a block of their own that is
/// then copied there.
pub(super) struct BlockBuilder {
    /// Where the block starts in the table's bytes.
    start: usize,
    /// Offsets of the restart points, from `start`.
    restarts: Vec<u32>,
    last_key: Vec<u8>,
    pub(super) count: usize,
}

impl BlockBuilder {
    /// A block starting at `start` in the table's bytes.
    pub(super) fn new(start: usize) -> Self {
        BlockBuilder {
            start,
            restarts: Vec::new(),
            last_key: Vec::new(),
            count: 0,
        }
    }

    /// Where the block starts in the table's bytes.
    pub(super) fn start(&self) -> usize {
        self.start
    }

    /// Appends one entry to `out`, the table's bytes this block ends.
    pub(super) fn add(
        &mut self,
        out: &mut Vec<u8>,
        key: &[u8],
        seq: u64,
        kind: EntryKind,
        value: &[u8],
    ) {
        debug_assert!(out.len() >= self.start);
        let shared = if self.count.is_multiple_of(RESTART_INTERVAL) {
            self.restarts.push((out.len() - self.start) as u32);
            0
        } else {
            self.last_key
                .iter()
                .zip(key)
                .take_while(|(a, b)| a == b)
                .count()
        };
        put_varint(out, shared as u64);
        put_varint(out, (key.len() - shared) as u64);
        put_varint(out, value.len() as u64);
        out.extend_from_slice(&((seq << 8) | kind as u64).to_le_bytes());
        out.extend_from_slice(&key[shared..]);
        out.extend_from_slice(value);
        self.last_key.clear();
        self.last_key.extend_from_slice(key);
        self.count += 1;
    }

    /// The most an entry can add to a block: whole key, a restart offset.
    pub(super) fn max_growth(key_len: usize, value_len: usize) -> usize {
        let varint_len = |v: usize| (usize::BITS - v.max(1).leading_zeros()).div_ceil(7) as usize;
        varint_len(0) + varint_len(key_len) + varint_len(value_len) + 8 + key_len + value_len + 4
    }

    /// The block's size once finished, before padding, with `out` the
    /// table's bytes it ends.
    pub(super) fn size_estimate(&self, out: &[u8]) -> usize {
        out.len() - self.start + 4 * self.restarts.len() + 12
    }

    /// Ends the block in `out`, padded to whole store blocks: entries,
    /// restart offsets, zero padding, then in the last 12 bytes `u32
    /// restart count`, `u32 entries length`, `u32 CRC32C` of everything
    /// before it (from the block's start). Returns the block's length;
    /// the builder is then empty, for the next block at the end of `out`.
    pub(super) fn finish(&mut self, out: &mut Vec<u8>) -> usize {
        let entries_len = (out.len() - self.start) as u32;
        for r in &self.restarts {
            out.extend_from_slice(&r.to_le_bytes());
        }
        let padded = round_up(out.len() - self.start + 12, STORE_BLOCK_BYTES);
        let end = self.start + padded;
        out.resize(end, 0);
        out[end - 12..end - 8].copy_from_slice(&(self.restarts.len() as u32).to_le_bytes());
        out[end - 8..end - 4].copy_from_slice(&entries_len.to_le_bytes());
        let crc = crc32c::crc32c(&out[self.start..end - 4]);
        out[end - 4..end].copy_from_slice(&crc.to_le_bytes());
        self.start = end;
        self.restarts.clear();
        self.last_key.clear();
        self.count = 0;
        padded
    }
}

/// A region (index, filter, range tombstones): payload, padded, with
/// `u32 payload length` and `u32 CRC32C` in its last 8 bytes.
pub(super) fn seal_region(mut payload: Vec<u8>) -> Vec<u8> {
    let len = payload.len() as u32;
    let padded = round_up(payload.len() + 8, STORE_BLOCK_BYTES);
    payload.resize(padded, 0);
    payload[padded - 8..padded - 4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c(&payload[..padded - 4]);
    payload[padded - 4..].copy_from_slice(&crc.to_le_bytes());
    payload
}

pub(super) fn open_region(region: &[u8]) -> Option<&[u8]> {
    let n = region.len();
    if n < 8 || !trailing_crc_ok(region) {
        return None;
    }
    let len = u32_at(region, n - 8)? as usize;
    region.get(..len)
}

/// The bytes blocks are parsed from: one block's own copy, or a run of
/// blocks read together (the I/O buffer itself, where it could be kept).
#[derive(Debug)]
pub enum BlockBytes {
    /// Copied out for this block alone (a block the cache keeps).
    Own(Vec<u8>),
    /// A run as read, shared by its blocks.
    Read(sluice_io::ReadBytes),
}

impl BlockBytes {
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        match self {
            BlockBytes::Own(v) => v,
            BlockBytes::Read(r) => r.as_slice(),
        }
    }
}

/// A data block whose checksum has been verified, searched in place. Its
/// bytes are its own, or a slice of a run of blocks read together that
/// none of them copies out (see [`RawBlock::parse_shared`]).
#[derive(Clone)]
pub struct RawBlock {
    data: Arc<BlockBytes>,
    /// Where the block's entries start in `data`; the restart offsets
    /// follow them.
    start: usize,
    pub(super) entries_len: usize,
    restart_count: usize,
}

impl std::fmt::Debug for RawBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RawBlock({} entry bytes, {} restarts)",
            self.entries_len, self.restart_count
        )
    }
}

/// Where the parts of one encoded entry lie in a block.
#[derive(Debug, Clone, Copy)]
pub(super) struct EntryAt {
    pub(super) shared: usize,
    /// The unshared key bytes and the value, as byte ranges of the block.
    pub(super) key_at: usize,
    pub(super) unshared: usize,
    pub(super) value_at: usize,
    pub(super) value_len: usize,
    pub(super) seq: u64,
    pub(super) kind: EntryKind,
    pub(super) next: usize,
}

impl RawBlock {
    /// Verifies the checksum and the trailer, and that every entry decodes,
    /// without building any entry; the block keeps a copy of `b`.
    pub fn parse(b: &[u8]) -> Option<Self> {
        Self::parse_shared(&Arc::new(BlockBytes::Own(b.to_vec())), 0, b.len())
    }

    /// [`RawBlock::parse`] of the `len` bytes at `start` of `data`, which
    /// the block shares (a run read together: no block copies itself out).
    pub fn parse_shared(data: &Arc<BlockBytes>, start: usize, len: usize) -> Option<Self> {
        let b = data.as_slice().get(start..start.checked_add(len)?)?;
        let n = b.len();
        if n < 12 || !trailing_crc_ok(b) {
            return None;
        }
        let mut trailer = Reader::at(b, n - 12);
        let count = trailer.u32()? as usize;
        let entries_len = trailer.u32()? as usize;
        let restarts_end = entries_len.checked_add(count.checked_mul(4)?)?;
        if restarts_end > n - 12 {
            return None;
        }
        let block = RawBlock {
            data: data.clone(),
            start,
            entries_len,
            restart_count: count,
        };
        let restarts_ascend = (1..count).all(|r| block.restart(r - 1) < block.restart(r));
        if (count > 0 && block.restart(0) != 0) || !restarts_ascend {
            return None;
        }
        let (mut at, mut last_key_len, mut next_restart) = (0, 0, 0);
        while at < entries_len {
            let e = block.entry_at(at)?;
            // A restart point stores its key whole.
            if next_restart < count && block.restart(next_restart) as usize == at {
                next_restart += 1;
                if e.shared != 0 {
                    return None;
                }
            }
            if e.shared > last_key_len {
                return None;
            }
            last_key_len = e.shared + e.unshared;
            at = e.next;
        }
        (next_restart == count && at == entries_len).then_some(block)
    }

    /// The byte offset of restart point `r` (below `restart_count`).
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: restart offsets checked at parse"
    )]
    fn restart(&self, r: usize) -> u32 {
        let at = self.start + self.entries_len + 4 * r;
        u32_at(self.data.as_slice(), at).expect("restart offsets checked at parse")
    }

    /// The layout of the entry at byte `at`, bounds-checked.
    pub(super) fn entry_at(&self, mut at: usize) -> Option<EntryAt> {
        let body = self.bytes();
        let shared = get_varint(body, &mut at)? as usize;
        let unshared = get_varint(body, &mut at)? as usize;
        let value_len = get_varint(body, &mut at)? as usize;
        let trailer = u64_at(body, at)?;
        let key_at = at + 8;
        let value_at = key_at.checked_add(unshared)?;
        let next = value_at.checked_add(value_len)?;
        if next > body.len() {
            return None;
        }
        let kind = match trailer & 0xFF {
            1 => EntryKind::Put,
            2 => EntryKind::Delete,
            3 => EntryKind::Blob,
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
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a verified block decodes"
    )]
    fn decode_into(&self, at: usize, out: &mut Entry) -> usize {
        let e = self.entry_at(at).expect("a verified block decodes");
        out.key.truncate(e.shared);
        out.key
            .extend_from_slice(&self.bytes()[e.key_at..e.key_at + e.unshared]);
        out.set_value(&self.bytes()[e.value_at..e.value_at + e.value_len]);
        out.seq = e.seq;
        out.kind = e.kind;
        e.next
    }

    /// Every entry of the block, in order.
    pub(super) fn decode_all(&self) -> Vec<Entry> {
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
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a verified block decodes"
    )]
    fn restart_key(&self, r: usize) -> (&[u8], u64) {
        let e = self
            .entry_at(self.restart(r) as usize)
            .expect("a verified block decodes");
        (&self.bytes()[e.key_at..e.key_at + e.unshared], e.seq)
    }

    /// Index of the first restart point not before the target, found by
    /// binary search with `before(key, seq)`.
    fn first_restart_not_before(&self, before: impl Fn(&[u8], u64) -> bool) -> usize {
        let (mut lo, mut hi) = (0usize, self.restart_count);
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
    pub(super) fn restart_before(&self, key: &[u8]) -> usize {
        let r = self.first_restart_not_before(|k, _| k < key);
        self.restart_at_or_start(r)
    }

    /// The offset of restart point `r - 1`, or 0 for `r` 0.
    fn restart_at_or_start(&self, r: usize) -> usize {
        match r {
            0 => 0,
            r => self.restart(r - 1) as usize,
        }
    }

    /// [`RawBlock::seek`] for a point read of `key`: the first entry at or
    /// after (key, snapshot) if it is a version of `key` — its sequence,
    /// kind and value borrowed from the block — `Ok(None)` if the next
    /// entry is another key, `Err(())` if the block ends first (the answer
    /// may be in the next block).
    #[allow(clippy::result_unit_err)]
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a verified block decodes"
    )]
    pub fn seek_point(&self, key: &[u8], snapshot: u64) -> Result<Option<PointHit>, ()> {
        // The binary search reads a few restart keys: their misses, too,
        // are taken together.
        let body = self.bytes();
        if self.restart_count <= PREFETCHED_RESTARTS_MAX {
            for r in 0..self.restart_count {
                prefetch_read(body, self.restart(r) as usize);
            }
        }
        let r = self
            .first_restart_not_before(|k, s| internal_cmp(k, s, key, snapshot) == Ordering::Less);
        let mut at = self.restart_at_or_start(r);
        // The entries up to the next restart point are read one after
        // another, each where the last one ended: asked for all at once,
        // their cache misses overlap instead of queueing.
        let interval_end = if r < self.restart_count {
            self.restart(r) as usize
        } else {
            self.entries_len
        };
        let mut line = at & !63;
        while line < interval_end {
            prefetch_read(body, line);
            line += 64;
        }
        // Keys are compared where they lie, not rebuilt: `matched` is how
        // many bytes the last entry read shares with `key` (every entry
        // read so far sorts before it), and an entry's shared prefix with
        // the one before it says most of how it compares.
        let mut matched = 0usize;
        while at < self.entries_len {
            if at == interval_end {
                // The next restart point, whose key is stored whole: its
                // `shared` of 0 says nothing of where it leaves the last
                // entry.
                matched = 0;
            }
            let e = self.entry_at(at).expect("a verified block decodes");
            if e.shared < matched {
                // It leaves the last entry inside the part that matched
                // `key`, upwards: it sorts after `key`.
                return Ok(None);
            }
            if e.shared == matched {
                let suffix = &body[e.key_at..e.key_at + e.unshared];
                let rest = &key[matched..];
                let common = suffix.iter().zip(rest).take_while(|(a, b)| a == b).count();
                matched += common;
                match suffix[common..].cmp(&rest[common..]) {
                    Ordering::Greater => return Ok(None),
                    // The key itself, newest version first.
                    Ordering::Equal if e.seq <= snapshot => {
                        return Ok(Some(PointHit {
                            seq: e.seq,
                            kind: e.kind,
                            value_at: e.value_at,
                            value_len: e.value_len,
                        }))
                    }
                    _ => {}
                }
            }
            // Otherwise it agrees with the last entry past where that one
            // left `key`: it sorts before `key` too.
            at = e.next;
        }
        Err(())
    }
}

/// A version of the key a point read looked for, found in a block.
#[derive(Debug, Clone, Copy)]
pub struct PointHit {
    /// Its sequence.
    pub seq: u64,
    /// Put or delete.
    pub kind: EntryKind,
    /// Where its value lies in the block, and its length (0 for a delete).
    pub value_at: usize,
    /// See `value_at`.
    pub value_len: usize,
}

impl RawBlock {
    /// Whether `other` is this block: the same bytes at the same place.
    pub(crate) fn is_same(&self, other: &RawBlock) -> bool {
        Arc::ptr_eq(&self.data, &other.data) && self.start == other.start
    }

    /// The block's decoded bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.data.as_slice()[self.start..self.start + self.entries_len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A block of `entries` (sorted here into internal order) and the
    /// entries as sorted.
    fn block_of(mut entries: Vec<(Vec<u8>, u64)>) -> (RawBlock, Vec<(Vec<u8>, u64)>) {
        entries.sort_by(|a, b| internal_cmp(&a.0, a.1, &b.0, b.1));
        entries.dedup();
        let mut out = Vec::new();
        let mut b = BlockBuilder::new(0);
        for (key, seq) in &entries {
            b.add(&mut out, key, *seq, EntryKind::Put, &seq.to_le_bytes());
        }
        b.finish(&mut out);
        (
            RawBlock::parse(&out).expect("a block just built parses"),
            entries,
        )
    }

    proptest! {
        /// A point seek finds what a walk over the sorted entries finds:
        /// the first entry not before (key, snapshot), if it is the key.
        #[test]
        fn seek_point_matches_a_walk_of_the_entries(
            entries in prop::collection::vec((prop::collection::vec(0u8..3, 0..6), 1u64..40), 1..90),
            probes in prop::collection::vec((prop::collection::vec(0u8..3, 0..7), 0u64..45), 1..40),
        ) {
            let (block, sorted) = block_of(entries);
            for (key, snapshot) in probes {
                let want = match sorted
                    .iter()
                    .find(|(k, s)| internal_cmp(k, *s, &key, snapshot) != Ordering::Less)
                {
                    None => Err(()),
                    Some((k, s)) if *k == key => Ok(Some(*s)),
                    Some(_) => Ok(None),
                };
                let got = block.seek_point(&key, snapshot).map(|hit| {
                    hit.map(|h| {
                        let value = &block.bytes()[h.value_at..h.value_at + h.value_len];
                        assert_eq!(value, h.seq.to_le_bytes(), "the hit's value is its own");
                        h.seq
                    })
                });
                prop_assert_eq!(got, want, "key {:?} at snapshot {}", key, snapshot);
            }
        }
    }
}
