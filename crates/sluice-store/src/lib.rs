//! # sluice-store
//!
//! Sluice's key/value engine: an LSM tree that owns its physical layout on
//! the device — no filesystem in the data path, every block checksummed, no
//! page cache. The on-disk format is written down in docs/FORMAT.md.
//!
//! Parts, in the order data flows: store blocks and extents ([`blocks`]),
//! the two-copy superblock ([`superblock`]), the extent allocator
//! ([`alloc`]), blob files for large values apart from the tree
//! ([`blob`]), the manifest of version edits and keyspace catalogue
//! ([`manifest`]), the write-ahead log with group commit and torn-tail
//! recovery ([`wal`]) and its mirror in memory that outlives the process
//! ([`wal_mirror`]), one parity block per write group ([`parity`]), the memtable ([`memtable`]), sorted tables
//! ([`sst`]) with a CLOCK block cache ([`cache`]), the live table set
//! ([`version`]), streaming merged iteration ([`iter`]), leveled compaction
//! ([`compaction`]), and the [`Store`] API over them: keyspaces, atomic
//! batches, deletes and range deletes, snapshots, streaming forward and
//! reverse iterators over ranges and prefixes, flush, compact, stats.
#![warn(clippy::expect_used)]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod alloc;
pub mod batch;
pub mod blob;
pub mod blocks;
pub mod cache;
mod codec;
pub mod compaction;
pub mod error;
mod found;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod heap;
pub mod iter;
pub mod manifest;
pub mod memtable;
pub mod parity;
mod seqgate;
pub mod sst;
pub mod store;
pub mod superblock;
pub mod version;
pub mod wal;
pub mod wal_mirror;

pub use batch::{LargePut, WriteBatch};
pub use error::{DamagedBlock, Result, StoreError, WritesRefused};
pub use found::{Found, Kept};
pub use iter::StoreIter;
pub use manifest::{KeyspaceDef, ValueFormat};
pub use store::{
    half_open, FillQueue, LogMarks, Logged, ReadCache, Snapshot, Store, StoreConfig, StoreFiles,
    StoreStats, TablePlacement, WriteOptions, DEFAULT_KEYSPACE,
};
pub use version::CacheMiss;
pub use wal_mirror::LogMirrorConfig;
