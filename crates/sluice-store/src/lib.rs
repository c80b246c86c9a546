//! # sluice-store
//!
//! Sluice's key/value engine: an LSM tree that owns its physical layout on
//! the device — no filesystem in the data path, every block checksummed, no
//! page cache. The on-disk format is written down in docs/FORMAT.md.
//!
//! Built so far: store blocks and extents ([`blocks`]), the two-copy
//! superblock ([`superblock`]), the extent allocator ([`alloc`]) and the
//! write-ahead log with group commit and torn-tail recovery ([`wal`]).
//! The manifest, memtable, SSTs and compaction come next (issue 4).

pub mod alloc;
pub mod blocks;
pub mod error;
pub mod manifest;
pub mod superblock;
pub mod wal;

pub use error::{Result, StoreError};
