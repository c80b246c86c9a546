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
pub use builder::{write_table, write_table_parts, BuiltTable, TableBuilder};
pub use cursor::{CursorSpec, TableCursor};
pub use index::TableIndex;
pub use reader::{PinBudget, TablePlace, TableReader};

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
}

/// One version of one key.
#[derive(Debug, PartialEq, Eq)]
pub struct Entry {
    /// The user key.
    pub key: Vec<u8>,
    /// Its sequence.
    pub seq: u64,
    /// Put or delete.
    pub kind: EntryKind,
    /// The value (empty for a delete).
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
