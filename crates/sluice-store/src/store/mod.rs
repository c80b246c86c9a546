//! The store: keyspaces, durable writes through the WAL into the memtable,
//! flushes of the memtable into level-0 tables, leveled compaction in a
//! background thread at low kernel I/O priority, and reads at a snapshot
//! that merge the memtables with the tables.
//!
//! - [`config`]: what a store is created and opened with;
//! - `files`: [`StoreFiles`], create-or-open on device files, the one way
//!   the CLI, the server, Python and the benchmarks open a store;
//! - `open`: formatting and opening a device set, WAL recovery, reclaiming
//!   what a crash left allocated;
//! - `keyspaces`: creating and naming keyspaces;
//! - `write`: the write path (sequence, WAL append, memtable, visibility);
//! - [`read`]: snapshots, point reads, iterators and scans;
//! - `fill`: the reads of point reads that do not wait ([`FillQueue`]);
//! - `flush`: memtable → level-0 tables, their placement on the devices;
//! - `background`: the compaction driver and the background thread;
//! - [`stats`]: what the store reports about itself.

mod background;
mod blobs;
pub mod config;
mod files;
mod fill;
mod flush;
#[cfg(test)]
mod fragmented_tests;
mod keyspaces;
mod open;
pub mod read;
mod recent;
pub mod stats;
pub mod write;

pub use config::{StoreConfig, WriteOptions, DEFAULT_KEYSPACE, MAX_KEYSPACES};
pub use files::StoreFiles;
pub use fill::{FillQueue, FILL_QUEUE_DEPTH, MAX_JOINED_PER_READ};
pub use read::{half_open, prefix_end, ReadCache, Snapshot};
pub use stats::{StoreStats, TablePlacement};
pub use write::{LogMarks, Logged};

use crate::batch::{OpKind, WriteBatch};
use crate::blob::{self, BlobFile};
use read::SnapshotRegistry;

use crate::blocks::{with_io_priority, BlockDevice, Extent, STORE_BLOCK_BYTES};

use crate::cache::{BlockCache, IndexCache};

use crate::compaction::{self, CompactionConfig};

use crate::error::{Result, StoreError, WritesRefused};
use crate::found::Found;

use crate::iter::StoreIter;

use crate::manifest::{Edit, KeyspaceDef, Manifest, TableMeta, ValueFormat, WalPlace};

use crate::memtable::Memtable;

use crate::seqgate::SeqGate;

use crate::sst::{
    write_table, write_table_parts, BuiltTable, CursorSpec, PinBudget, TableBuffers, TableBuilder,
    TablePlace, TableReader,
};

use crate::version::{self, CacheMiss, Levels, Table, Version};

use crate::wal::{self, Wal, WalLayout, WalRecovery};

use rand::Rng;

use sluice_io::Device;

use sluice_io::Priority;

use std::collections::{BTreeMap, BTreeSet};

use std::ops::Bound;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};

use std::thread::JoinHandle;

/// Writes in the memtable not yet visible to reads.
struct Visible {
    /// `first -> (last, log position it needs durable)` of each: a write
    /// becomes visible once every earlier one has and, if synced, its log
    /// position is durable.
    pending: BTreeMap<u64, (u64, Option<wal::LogPosition>)>,
    /// The highest sequence found visible under this lock: the mark is
    /// raised to it after the lock is let go (with the wake-ups that
    /// costs), so the next holder starts from here, not from a mark that
    /// may not have caught up yet.
    ready_upto: u64,
    failed: Option<String>,
}

/// What a write holds while it takes its place: one lock for its
/// sequence numbers, its log record and its memtable, so the write path
/// takes no lock of `memtables` or `keyspaces` (each a pair of locked
/// instructions per write).
struct Writer {
    /// The sequence number of the next write's first operation.
    next_seq: u64,
    /// `memtables.active`, replaced under this lock and that one.
    active: Arc<RwLock<Memtable>>,
    /// The ids of the keyspaces that take writes (a copy of `keyspaces`'
    /// ids, changed under this lock and that one).
    keyspace_ids: Vec<u32>,
}

impl Writer {
    /// The first keyspace of `batch` no write may go to, if any.
    fn unknown_keyspace(&self, batch: &WriteBatch) -> Option<u32> {
        let mut last_known = None;
        for op in batch.ops() {
            if last_known != Some(op.keyspace) {
                if !self.keyspace_ids.contains(&op.keyspace) {
                    return Some(op.keyspace);
                }
                last_known = Some(op.keyspace);
            }
        }
        None
    }
}

struct Memtables {
    active: Arc<RwLock<Memtable>>,
    /// Being flushed: still read until its tables are installed.
    frozen: Option<Arc<RwLock<Memtable>>>,
}

/// A frozen memtable and the log marks its flush releases the log at.
struct Frozen {
    mem: Arc<RwLock<Memtable>>,
    /// The log sequence its records end before.
    tail_seq: u64,
    /// The sequence of its last write.
    last_seq: u64,
}

struct Inner {
    dev: BlockDevice,
    cache: Arc<BlockCache>,
    pin_budget: Arc<PinBudget>,
    index_cache: Arc<IndexCache>,
    config: StoreConfig,
    manifest: Mutex<Manifest>,
    keyspaces: RwLock<BTreeMap<String, KeyspaceDef>>,
    wal: Wal,
    memtables: RwLock<Memtables>,
    /// The active memtable's `approximate_bytes` and whether a frozen one
    /// is being flushed, as the write path last left them: every write
    /// asks, and looking them up (with the level-0 count) under their locks
    /// took a server's writer about a tenth of its time
    /// (docs/BENCHMARKS.md, "Log blocks gathered into one write").
    active_bytes: AtomicUsize,
    flushing: AtomicBool,
    version: RwLock<Arc<Version>>,
    /// The most level-0 tables of any keyspace, and the view generation
    /// it was counted at (`generation << 16 | count`).
    l0_counted: AtomicU64,
    /// Bumped, under the lock that makes the change, whenever the active
    /// memtable is replaced, the frozen one goes, or the version changes:
    /// a [`ReadCache`] taken at an older generation is taken again.
    view_generation: AtomicU64,
    /// Sequence assignment and WAL append order.
    writer: Mutex<Writer>,
    visible: Mutex<Visible>,
    /// Every write up to this sequence is visible to reads; writers wait on
    /// it for their own write to become visible.
    visible_seq: SeqGate,
    /// Set with `visible.failed`, read by waiters without the lock.
    write_failed: AtomicBool,
    snapshots: Arc<SnapshotRegistry>,
    /// Extents of replaced tables whose last reader is gone.
    released: Arc<Mutex<Vec<Extent>>>,
    /// Store blocks kept free for flushes and compactions
    /// ([`StoreConfig::space_reserve_bytes`]).
    reserve_blocks: u64,
    /// Whether free space went below `reserve_blocks` and has not yet come
    /// back above half as much again (`flush::resume_blocks`), as the last
    /// table allocation or manifest group left it: writes that add data are
    /// refused while it holds.
    space_low: AtomicBool,
    /// Free store blocks as the last table allocation or manifest group
    /// left them.
    free_blocks_hint: AtomicU64,
    /// Why the last flush failed, until one succeeds (the background
    /// thread retries each second); `flush_failing` says so without it.
    flush_failure: Mutex<Option<String>>,
    flush_failing: AtomicBool,
    /// A frozen memtable whose flush failed, with its log marks: the next
    /// flush writes it first, and the log keeps its records until then.
    unflushed: Mutex<Option<Frozen>>,
    /// One flush at a time; one compaction at a time.
    flush_lock: Mutex<()>,
    compaction_lock: Mutex<()>,
    compaction_cursor: AtomicU64,
    /// Which data device the next table's data blocks go to.
    next_data_device: AtomicU64,
    next_file: AtomicU64,
    flushes: AtomicU64,
    compactions: AtomicU64,
    /// Writes that flushed or compacted on their own thread, and the µs
    /// they spent at it.
    write_stalls: AtomicU64,
    write_stall_us: AtomicU64,
    shutdown: AtomicBool,
    flush_requested: AtomicBool,
    /// Flushed memtables readers may still hold (a server worker's cached
    /// view): kept here so the last reference, and freeing a whole write
    /// buffer of entries, is dropped by the flushing side
    /// ([`Inner::free_retired_memtables`]), not by a reader in the middle
    /// of serving requests.
    retired_memtables: Mutex<Vec<Arc<RwLock<Memtable>>>>,
    /// The last table's buffer, for the next flush or compaction output.
    table_buffers: TableBuffers,
    /// The blob file large values are appended to.
    blob_appender: Mutex<blob::Appender>,
    /// Every write up to this sequence is in the version's tables (raised
    /// by a flush once its tables are in the version).
    tables_hold_upto: AtomicU64,
    /// Values compactions moved out of mostly-empty blob files.
    blob_relocations: AtomicU64,
    wake: Condvar,
    wake_lock: Mutex<bool>,
}

/// A key/value store over one device or a device set. Cheap to share between threads by reference; every method takes `&self`.
pub struct Store {
    inner: Arc<Inner>,
    background: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("wal", &self.inner.wal)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|p| p.into_inner())
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Some(handle) = self.background.take() {
            self.inner.shutdown.store(true, Ordering::Release);
            self.inner.wake_background();
            let _ = handle.join();
        }
        // Tables whose last reader let go since the last flush or
        // compaction: log their frees now rather than reclaim them at open.
        let frees = self.inner.take_released();
        if !frees.is_empty() {
            if let Err(e) = self.inner.log_group(&frees) {
                log::warn!(
                    "closing the store: freed tables not logged (reclaimed at next open): {e}"
                );
            }
        }
        // A clean close makes unsynced writes durable too.
        let closed = self
            .inner
            .wal
            .close_block()
            .and_then(|_| self.inner.dev.flush());
        match closed {
            // Every record is durable: the mirror holds nothing needed.
            Ok(()) => self.inner.wal.discard_mirror(),
            Err(e) => log::error!("closing the store: unsynced writes may be lost: {e}"),
        }
    }
}
