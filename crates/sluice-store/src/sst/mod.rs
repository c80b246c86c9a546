//! Sorted string tables: one extent holding data blocks, an index, a bloom
//! filter, range tombstones and a footer. Layout in docs/FORMAT.md ("SST").
//!
//! Entries are ordered by (user key ascending, sequence descending). The
//! index, filter and range tombstones are read once at open and kept in
//! memory, so a point read costs at most one data-block read.
//!
//! - [`block`]: a data block's encoder and decoder, and the framing of the
//!   table's other regions;
//! - [`bloom`]: the filter;
//! - [`builder`]: a whole table built in memory, and writing it;
//! - [`index`]: the block index in memory and its decoding;
//! - [`reader`]: an open table (point reads, pinned index budget);
//! - [`cursor`]: walking a range of one table with read-ahead.

mod block;
mod bloom;
mod builder;
mod cursor;
mod index;
mod reader;

pub use block::{PointHit, RawBlock};
pub use bloom::Bloom;
pub use builder::{write_table, write_table_parts, BuiltTable, TableBuffers, TableBuilder};
pub use cursor::{CursorSpec, TableCursor};
pub use index::TableIndex;
pub use reader::{MissAt, PinBudget, TablePlace, TableReader};

use crate::blocks::STORE_BLOCK_BYTES;
use std::cmp::Ordering;

pub(super) const FOOTER_MAGIC: &[u8; 8] = b"SLSTFOOT";

/// Data blocks are cut once they reach this size (a block holding one large
/// value is as many store blocks as it needs).
pub const TARGET_BLOCK_BYTES: usize = STORE_BLOCK_BYTES;

/// What a version of a key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A value.
    Put = 1,
    /// A delete.
    Delete = 2,
    /// A value kept in a blob file; the entry's value is its reference
    /// (docs/FORMAT.md, "Blob files").
    Blob = 3,
}

impl EntryKind {
    /// Whether it gives the key a value (a put or a blob).
    pub fn is_value(self) -> bool {
        self != EntryKind::Delete
    }
}

/// One version of one key.
///
/// Its value is either owned or a range of the data block a table cursor
/// decoded it from: a scan walks values where the block holds them, with
/// no copy per entry (the block stays alive while an entry shows it).
pub struct Entry {
    /// The user key.
    pub key: Vec<u8>,
    /// Its sequence.
    pub seq: u64,
    /// Put or delete.
    pub kind: EntryKind,
    /// The value's bytes when owned (kept as a reusable buffer otherwise).
    owned: Vec<u8>,
    /// The block holding the value, and where it lies in the block's bytes.
    in_block: Option<(RawBlock, usize, usize)>,
}

impl Entry {
    /// An entry to decode into.
    pub fn empty() -> Self {
        Entry::new(Vec::new(), 0, EntryKind::Put, Vec::new())
    }

    /// An entry owning its value (empty for a delete).
    pub fn new(key: Vec<u8>, seq: u64, kind: EntryKind, value: Vec<u8>) -> Self {
        Entry {
            key,
            seq,
            kind,
            owned: value,
            in_block: None,
        }
    }

    /// The value (empty for a delete).
    pub fn value(&self) -> &[u8] {
        match &self.in_block {
            Some((block, at, len)) => &block.bytes()[*at..*at + *len],
            None => &self.owned,
        }
    }

    /// Sets the value to a copy of `value`, reusing the owned buffer.
    pub fn set_value(&mut self, value: &[u8]) {
        self.in_block = None;
        self.owned.clear();
        self.owned.extend_from_slice(value);
    }

    /// Sets the value to `len` bytes at `at` of `block`'s bytes, without
    /// copying them; the block is only cloned when it changes.
    pub(crate) fn set_value_in(&mut self, block: &RawBlock, at: usize, len: usize) {
        debug_assert!(at + len <= block.bytes().len());
        match &mut self.in_block {
            Some((held, held_at, held_len)) if held.is_same(block) => {
                (*held_at, *held_len) = (at, len);
            }
            slot => *slot = Some((block.clone(), at, len)),
        }
    }

    /// Bytes its own buffers hold (not a block it points into).
    pub(crate) fn held_bytes(&self) -> usize {
        self.key.capacity() + self.owned.capacity()
    }

    /// Lets go of the block it points into, keeping its own buffers.
    pub(crate) fn release_block(&mut self) {
        self.in_block = None;
    }

    /// The value, owned (copied out of its block where it lies in one).
    pub fn into_value(self) -> Vec<u8> {
        match self.in_block {
            Some(_) => self.value().to_vec(),
            None => self.owned,
        }
    }
}

impl Clone for Entry {
    fn clone(&self) -> Self {
        Entry {
            key: self.key.clone(),
            seq: self.seq,
            kind: self.kind,
            owned: self.owned.clone(),
            in_block: self.in_block.clone(),
        }
    }

    /// Reuses `self`'s buffers (the derived one would allocate anew); a
    /// value in a block is shared, not copied.
    fn clone_from(&mut self, source: &Self) {
        self.key.clone_from(&source.key);
        match &source.in_block {
            Some((block, at, len)) => self.set_value_in(block, *at, *len),
            None => self.set_value(&source.owned),
        }
        self.seq = source.seq;
        self.kind = source.kind;
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
            && self.seq == other.seq
            && self.kind == other.kind
            && self.value() == other.value()
    }
}

impl Eq for Entry {}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("key", &self.key)
            .field("seq", &self.seq)
            .field("kind", &self.kind)
            .field("value", &self.value())
            .finish()
    }
}

/// (user key asc, sequence desc).
pub fn internal_cmp(a_key: &[u8], a_seq: u64, b_key: &[u8], b_seq: u64) -> Ordering {
    a_key.cmp(b_key).then(b_seq.cmp(&a_seq))
}

/// Deletes every key in `[start, end)` written before `seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeTombstone {
    /// First key covered.
    pub start: Vec<u8>,
    /// First key not covered.
    pub end: Vec<u8>,
    /// Its sequence.
    pub seq: u64,
}
