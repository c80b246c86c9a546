//! The store: keyspaces, durable writes through the WAL into the memtable,
//! flushes of the memtable into level-0 tables, leveled compaction in a
//! background thread at low kernel I/O priority, and reads at a snapshot
//! that merge the memtables with the tables.

use crate::batch::WriteBatch;
use crate::blocks::{with_io_priority, BlockDevice, Extent, STORE_BLOCK_BYTES};
use crate::cache::{BlockCache, IndexCache};
use crate::compaction::{self, CompactionConfig};
use crate::error::{Result, StoreError};
use crate::iter::StoreIter;
use crate::manifest::{Edit, KeyspaceDef, Manifest, TableMeta, ValueFormat, WalPlace};
use crate::memtable::Memtable;
use crate::seqgate::SeqGate;
use crate::sst::{
    write_table, write_table_parts, BuiltTable, CursorSpec, PinBudget, TableBuilder, TablePlace,
    TableReader,
};
use crate::version::{self, Levels, Table, Version};
use crate::wal::{self, Wal, WalLayout, WalRecovery};
use rand::Rng;
use sluice_io::Device;
use sluice_io::Priority;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;

/// The keyspace every store has.
pub const DEFAULT_KEYSPACE: &str = "default";
/// Most keyspaces one store holds.
pub const MAX_KEYSPACES: usize = 1024;

#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Size of the WAL ring in 4 KiB blocks (format time only).
    pub wal_blocks: u32,
    /// The memtable is flushed to a table once it holds this many bytes.
    pub write_buffer_bytes: usize,
    pub compaction: CompactionConfig,
    /// Run compactions in a background thread (off: only `compact()`).
    pub background_compaction: bool,
    /// Decoded data blocks kept in memory (there is no page cache below).
    pub block_cache_bytes: usize,
    /// Bound on index and filter memory pinned for the life of their
    /// tables. Tables opened once it is spent keep theirs in the index
    /// cache instead, and a read may then cost one more device read.
    pub pinned_index_bytes: usize,
    /// Indexes and filters of unpinned tables kept in memory.
    pub index_cache_bytes: usize,
    /// What open does when the WAL is damaged before its end (default:
    /// refuse, naming the blocks).
    pub wal_recovery: WalRecovery,
    /// SQPOLL for the log's two engines, with this idle time before their
    /// kernel threads sleep: a synced commit then makes no system call
    /// while they are awake, at the cost of a core each while busy. Off by
    /// default (measured: docs/BENCHMARKS.md).
    pub wal_sqpoll_idle_ms: Option<u32>,
}

/// Blocks the first device keeps for tables at the least when a store is
/// formatted (their indexes live there even on a device set).
const MIN_TABLE_BLOCKS: u64 = 256;

impl StoreConfig {
    /// A WAL ring for a first device of `device_blocks` store blocks: an
    /// eighth of it, between 64 blocks and the default 16384 (64 MiB).
    pub fn wal_blocks_for(device_blocks: u64) -> u32 {
        (device_blocks / 8).clamp(64, StoreConfig::default().wal_blocks as u64) as u32
    }
}

/// Refuses, before anything is written, a format whose parts do not fit
/// the first device, naming each part and what changes it.
fn check_format_fits(
    device: &Arc<dyn Device>,
    device_blocks: u64,
    config: &StoreConfig,
) -> Result<()> {
    let fixed =
        crate::superblock::SUPERBLOCK_BLOCKS + crate::manifest::MANIFEST_EXTENT_BLOCKS as u64;
    let needed = fixed + config.wal_blocks as u64 + MIN_TABLE_BLOCKS;
    if needed <= device_blocks {
        return Ok(());
    }
    let mib = |blocks: u64| blocks as f64 * STORE_BLOCK_BYTES as f64 / (1 << 20) as f64;
    let room_for_wal = device_blocks.saturating_sub(fixed + MIN_TABLE_BLOCKS);
    let advice = if room_for_wal >= 64 {
        format!(
            "format with a smaller WAL (--wal-blocks {}, StoreConfig::wal_blocks) or a larger device",
            StoreConfig::wal_blocks_for(device_blocks).min(room_for_wal as u32)
        )
    } else {
        format!(
            "use a device of at least {:.1} MiB",
            mib(fixed + 64 + MIN_TABLE_BLOCKS)
        )
    };
    Err(StoreError::BadDevice(format!(
        "{} holds {device_blocks} store blocks ({:.1} MiB); a store on it needs {needed} ({:.1} MiB): \
         {fixed} for the superblock and manifest, {} for the WAL ring and at least {MIN_TABLE_BLOCKS} \
         for tables. Nothing was written; {advice}",
        device.describe(),
        mib(device_blocks),
        mib(needed),
        config.wal_blocks
    )))
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            wal_blocks: 16384,
            write_buffer_bytes: 64 << 20,
            compaction: CompactionConfig::default(),
            background_compaction: true,
            block_cache_bytes: 64 << 20,
            // About 1.3% of the data at 16-byte keys and 200-byte values:
            // enough for 20 GB of such data.
            pinned_index_bytes: 256 << 20,
            index_cache_bytes: 32 << 20,
            wal_recovery: WalRecovery::Strict,
            wal_sqpoll_idle_ms: None,
        }
    }
}

/// How a write is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOptions {
    /// Return only once the write is durable (the default).
    pub sync: bool,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions { sync: true }
    }
}

#[derive(Debug, Default)]
struct SnapshotRegistry {
    live: Mutex<BTreeMap<u64, usize>>,
}

/// A point in the store's history; reads through it see exactly the writes
/// acknowledged before it was taken, whatever flushes and compactions do
/// meanwhile. Dropping it lets compaction discard what only it could see.
#[derive(Debug)]
pub struct Snapshot {
    seq: u64,
    registry: Arc<SnapshotRegistry>,
}

impl Snapshot {
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        let mut live = self.registry.live.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = live.get_mut(&self.seq) {
            *n -= 1;
            if *n == 0 {
                live.remove(&self.seq);
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct StoreStats {
    pub last_sequence: u64,
    pub memtable_entries: usize,
    pub memtable_bytes: usize,
    pub wal_written_below: u64,
    pub wal_durable_below: u64,
    pub wal_flushes: u64,
    pub free_blocks: u64,
    pub device_blocks: u64,
    /// Free store blocks on each device of the set, in order.
    pub device_free_blocks: Vec<u64>,
    pub keyspaces: Vec<String>,
    /// Tables per level, summed over keyspaces.
    pub tables_per_level: Vec<usize>,
    /// Bytes of data blocks in all live tables (what the pinned index
    /// and filter serve), and the entries (versions) they hold.
    pub table_data_bytes: u64,
    pub table_entries: u64,
    /// Index + filter memory pinned by open tables, and its bound.
    pub pinned_index_bytes: usize,
    pub pinned_index_limit_bytes: usize,
    /// Tables whose index and filter are not pinned (read through the
    /// index cache), and that cache's use.
    pub unpinned_tables: usize,
    pub index_cache_used_bytes: usize,
    pub flushes: u64,
    pub compactions: u64,
    pub block_cache_used_bytes: usize,
    pub block_cache_hits: u64,
    pub block_cache_misses: u64,
}

/// Where one table lies on the device set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TablePlacement {
    pub keyspace: u32,
    pub level: u8,
    pub file_no: u64,
    /// Device (index into the set) of its data blocks and of its index.
    pub data_device: usize,
    pub index_device: usize,
    pub data_blocks: u32,
}

/// Writes in the memtable not yet visible to reads.
struct Visible {
    /// `first -> (last, log position it needs durable)` of each: a write
    /// becomes visible once every earlier one has and, if synced, its log
    /// position is durable.
    pending: BTreeMap<u64, (u64, Option<wal::LogPosition>)>,
    failed: Option<String>,
}

struct Memtables {
    active: Arc<RwLock<Memtable>>,
    /// Being flushed: still read until its tables are installed.
    frozen: Option<Arc<RwLock<Memtable>>>,
}

/// A table written to its extents, not yet logged.
struct Placed {
    keyspace: u32,
    extent: Extent,
    /// Index, filter, tombstones and footer, when not inside `extent`.
    meta: Option<Extent>,
    file_no: u64,
    index_offset_blocks: u32,
    entries: u64,
    smallest: Vec<u8>,
    largest: Vec<u8>,
}

impl Placed {
    fn extents(&self) -> impl Iterator<Item = Extent> {
        std::iter::once(self.extent).chain(self.meta)
    }
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
    version: RwLock<Arc<Version>>,
    /// Sequence assignment and WAL append order.
    writer: Mutex<u64>,
    visible: Mutex<Visible>,
    /// Every write up to this sequence is visible to reads; writers wait on
    /// it for their own write to become visible.
    visible_seq: SeqGate,
    /// Set with `visible.failed`, read by waiters without the lock.
    write_failed: AtomicBool,
    snapshots: Arc<SnapshotRegistry>,
    /// Extents of replaced tables whose last reader is gone.
    released: Arc<Mutex<Vec<Extent>>>,
    /// One flush at a time; one compaction at a time.
    flush_lock: Mutex<()>,
    compaction_lock: Mutex<()>,
    compaction_cursor: AtomicU64,
    /// Which data device the next table's data blocks go to.
    next_data_device: AtomicU64,
    next_file: AtomicU64,
    flushes: AtomicU64,
    compactions: AtomicU64,
    shutdown: AtomicBool,
    flush_requested: AtomicBool,
    wake: Condvar,
    wake_lock: Mutex<bool>,
}

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

impl Store {
    /// Formats `device` as a new store (everything on it is overwritten).
    pub fn create(device: Arc<dyn Device>, config: &StoreConfig) -> Result<Self> {
        Self::create_on(vec![device], config)
    }

    /// Formats a store over several devices (everything on them is
    /// overwritten). The first holds the superblock, manifest, WAL and
    /// every table's index and filter; table data blocks are striped over
    /// the others, one table per device in turn. With one device,
    /// everything shares it.
    pub fn create_on(devices: Vec<Arc<dyn Device>>, config: &StoreConfig) -> Result<Self> {
        let sized = devices
            .iter()
            .map(|d| Ok((d.clone(), crate::blocks::device_store_blocks(d)?)))
            .collect::<Result<Vec<_>>>()?;
        check_format_fits(&sized[0].0, sized[0].1, config)?;
        let dev = BlockDevice::set(sized)?;
        let mut rng = rand::thread_rng();
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut manifest = Manifest::create(dev.clone(), rng.gen(), now_ms)?;
        let ring = manifest.allocate(config.wal_blocks as u64)?;
        let layout = WalLayout {
            ring: vec![ring],
            epoch: rng.gen(),
        };
        layout.format(&dev)?;
        manifest.log(&[
            Edit::Alloc(ring),
            Edit::Wal(WalPlace {
                epoch: layout.epoch,
                tail_seq: 0,
                ring: layout.ring.clone(),
            }),
            Edit::AddKeyspace(KeyspaceDef {
                id: 0,
                name: DEFAULT_KEYSPACE.into(),
                format: ValueFormat::Raw,
                schema: String::new(),
            }),
        ])?;
        drop(manifest);
        Self::open_on(devices, config)
    }

    /// Opens the store on `device`: manifest, tables, WAL replay.
    pub fn open(device: Arc<dyn Device>, config: &StoreConfig) -> Result<Self> {
        Self::open_on(vec![device], config)
    }

    /// Opens a store formatted over `devices`, given in the order they
    /// were formatted; each device's label is checked first.
    pub fn open_on(devices: Vec<Arc<dyn Device>>, config: &StoreConfig) -> Result<Self> {
        let dev = open_device_set(devices)?;
        let mut manifest = Manifest::open(dev.clone())?;
        let state = manifest.state().clone();
        let place = state.wal.clone().ok_or_else(|| StoreError::Corrupt {
            what: "manifest",
            block: manifest.superblock().manifest.start_block,
            lba: dev.lba_of(manifest.superblock().manifest.start_block),
            reason: "no write-ahead log recorded".into(),
        })?;
        // Everything up to here only reads: a store that cannot be
        // recovered as asked is left as it was.
        let layout = WalLayout {
            ring: place.ring.clone(),
            epoch: place.epoch,
        };
        let recovered = wal::recover(&dev, &layout, place.tail_seq, config.wal_recovery)?;
        report_wal_recovery(&recovered, config.wal_recovery);
        let mut memtable = Memtable::default();
        let mut last_seq = state.last_sequence;
        for (pos, record) in &recovered.records {
            let (first, batch) = WriteBatch::decode(record).ok_or_else(|| {
                let block = layout.block_of(pos.end_seq);
                StoreError::Corrupt {
                    what: "WAL record",
                    block,
                    lba: dev.lba_of(block),
                    reason: "a record with valid checksums does not decode as a write batch".into(),
                }
            })?;
            // Records older than the last flush are already in tables.
            if first > state.last_sequence {
                memtable.apply(first, &batch);
            }
            last_seq = last_seq.max(first + batch.len() as u64 - 1);
        }
        manifest.begin_writing()?;
        recovered.seal(&dev, &layout)?;
        reclaim_unreferenced(&mut manifest)?;
        let released = Arc::new(Mutex::new(Vec::new()));
        let cache = Arc::new(BlockCache::new(config.block_cache_bytes));
        let pin_budget = Arc::new(PinBudget::new(config.pinned_index_bytes));
        let index_cache = Arc::new(IndexCache::new(config.index_cache_bytes));
        let mut version = Version::default();
        // Shallow levels are read most: they take the pin budget first.
        let mut metas: Vec<&TableMeta> = state.tables.values().collect();
        metas.sort_by_key(|m| (m.level, std::cmp::Reverse(m.file_no)));
        for meta in metas {
            let name = state
                .keyspaces
                .get(&meta.keyspace)
                .map_or("?", |k| k.name.as_str());
            let reader = TableReader::open_parts(
                &dev,
                meta.data,
                Some(meta.index),
                TablePlace {
                    keyspace: name,
                    file_no: meta.file_no,
                },
            )?
            .with_cache(cache.clone())
            .with_index_memory(pin_budget.clone(), index_cache.clone());
            version
                .keyspaces
                .entry(meta.keyspace)
                .or_default()
                .insert(Arc::new(Table::new(meta.clone(), reader, released.clone())));
        }
        let keyspaces = state
            .keyspaces
            .values()
            .map(|k| (k.name.clone(), k.clone()))
            .collect();
        let wal = Wal::open(
            dev.clone(),
            layout,
            place.tail_seq,
            recovered.next_seq,
            config.wal_sqpoll_idle_ms,
        )?;
        let inner = Arc::new(Inner {
            dev,
            cache,
            pin_budget,
            index_cache,
            config: config.clone(),
            manifest: Mutex::new(manifest),
            keyspaces: RwLock::new(keyspaces),
            wal,
            memtables: RwLock::new(Memtables {
                active: Arc::new(RwLock::new(memtable)),
                frozen: None,
            }),
            version: RwLock::new(Arc::new(version)),
            writer: Mutex::new(last_seq + 1),
            visible: Mutex::new(Visible {
                pending: BTreeMap::new(),
                failed: None,
            }),
            visible_seq: SeqGate::new(last_seq),
            write_failed: AtomicBool::new(false),
            snapshots: Arc::new(SnapshotRegistry::default()),
            released,
            flush_lock: Mutex::new(()),
            compaction_lock: Mutex::new(()),
            compaction_cursor: AtomicU64::new(0),
            next_data_device: AtomicU64::new(0),
            next_file: AtomicU64::new(state.next_file),
            flushes: AtomicU64::new(0),
            compactions: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
            flush_requested: AtomicBool::new(false),
            wake: Condvar::new(),
            wake_lock: Mutex::new(false),
        });
        let background = config
            .background_compaction
            .then(|| {
                let inner = inner.clone();
                std::thread::Builder::new()
                    .name("sluice-compaction".into())
                    .spawn(move || background_loop(&inner))
            })
            .transpose()
            .map_err(|e| {
                StoreError::BadDevice(format!("cannot start the compaction thread: {e}"))
            })?;
        Ok(Store { inner, background })
    }

    /// The id of keyspace `name`.
    pub fn keyspace(&self, name: &str) -> Result<u32> {
        let ks = read(&self.inner.keyspaces);
        ks.get(name)
            .map(|k| k.id)
            .ok_or_else(|| StoreError::UnknownKeyspace {
                name: name.into(),
                known: ks.keys().cloned().collect::<Vec<_>>().join(", "),
            })
    }

    pub fn keyspace_def(&self, name: &str) -> Result<KeyspaceDef> {
        let ks = read(&self.inner.keyspaces);
        ks.get(name)
            .cloned()
            .ok_or_else(|| StoreError::UnknownKeyspace {
                name: name.into(),
                known: ks.keys().cloned().collect::<Vec<_>>().join(", "),
            })
    }

    /// Creates keyspace `name` with a declared value format; returns its id.
    pub fn create_keyspace(&self, name: &str, format: ValueFormat, schema: &str) -> Result<u32> {
        if name.is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
            return Err(StoreError::BadInput(format!(
                "keyspace name {name:?} must be 1 to 255 printable characters"
            )));
        }
        let mut manifest = lock(&self.inner.manifest);
        let mut ks = write(&self.inner.keyspaces);
        if ks.contains_key(name) {
            return Err(StoreError::BadInput(format!(
                "keyspace {name:?} exists already"
            )));
        }
        if ks.len() >= MAX_KEYSPACES {
            return Err(StoreError::BadInput(format!(
                "a store holds at most {MAX_KEYSPACES} keyspaces"
            )));
        }
        let id = ks.values().map(|k| k.id).max().map_or(0, |m| m + 1);
        let def = KeyspaceDef {
            id,
            name: name.into(),
            format,
            schema: schema.into(),
        };
        manifest.log(&[Edit::AddKeyspace(def.clone())])?;
        ks.insert(name.into(), def);
        Ok(id)
    }

    fn check_keyspaces(&self, batch: &WriteBatch) -> Result<()> {
        let ks = read(&self.inner.keyspaces);
        for op in &batch.ops {
            if !ks.values().any(|k| k.id == op.keyspace) {
                return Err(StoreError::UnknownKeyspace {
                    name: format!("#{}", op.keyspace),
                    known: ks.keys().cloned().collect::<Vec<_>>().join(", "),
                });
            }
        }
        Ok(())
    }

    /// Applies `batch` atomically and durably; returns the sequence number
    /// of its last operation. Returns only once the batch survives a crash.
    pub fn write(&self, batch: &WriteBatch) -> Result<u64> {
        self.write_with(batch, WriteOptions::default())
    }

    /// [`Store::write`] with options: `sync: false` returns once the batch
    /// is in the WAL's open block and the memtable, before it is durable
    /// (as RocksDB's default); a crash — of the machine, or of the process,
    /// unlike RocksDB, whose unsynced writes wait in the page cache — may
    /// lose it, never part of it. Its block is written once it fills (full
    /// blocks go out eight at a time while no commit is made:
    /// `wal::EARLY_WRITES_PER_SUBMIT`), or with the next synced write or
    /// close.
    pub fn write_with(&self, batch: &WriteBatch, options: WriteOptions) -> Result<u64> {
        self.write_inner(batch, options, false)
    }

    fn write_inner(&self, batch: &WriteBatch, options: WriteOptions, retried: bool) -> Result<u64> {
        if batch.is_empty() {
            return Ok(self.inner.visible_seq.get());
        }
        self.check_keyspaces(batch)?;
        self.check_failed()?;
        let inner = &self.inner;
        let buffered = self.active_bytes();
        let budget = inner.config.write_buffer_bytes;
        if buffered >= budget {
            if inner.config.background_compaction && buffered < 2 * budget {
                // The background thread flushes; writes go on meanwhile.
                inner.flush_requested.store(true, Ordering::Release);
                inner.wake_background();
            } else {
                // No background thread, or it is behind: the writer flushes
                // (waiting for a flush under way first).
                inner.flush()?;
            }
            // Write stall: past three times the trigger, level 0 is compacted
            // by the writer itself, bounding read cost and space.
            while inner.l0_tables() >= 3 * inner.config.compaction.l0_trigger {
                if !inner.compact_once(false)? {
                    break;
                }
            }
        }
        let (first, pos) = {
            let mut next = lock(&inner.writer);
            let first = *next;
            let pos = match inner.wal.append(&batch.encode(first)) {
                Err(StoreError::WalFull { .. }) if !retried => {
                    drop(next);
                    inner.flush()?;
                    return self.write_inner(batch, options, true);
                }
                other => other?,
            };
            *next += batch.len() as u64;
            write(&read(&inner.memtables).active).apply(first, batch);
            (first, pos)
        };
        let last = first + batch.len() as u64 - 1;
        self.finish_write(first, last, options.sync.then_some(pos))?;
        Ok(last)
    }

    fn active_bytes(&self) -> usize {
        let mem = read(&self.inner.memtables);
        let bytes = read(&mem.active).approximate_bytes();
        bytes
    }

    /// Returns once `first..=last` is visible (and, with `durable_at`,
    /// durable). A write waits once: on the visible mark. Whoever finds its
    /// record in no commit group yet and a committer's slot free leads one
    /// (the WAL's group commit, up to `wal::MAX_COMMIT_LEADERS` groups in
    /// flight); the leader then makes every write now durable visible at
    /// once and wakes exactly their writers, plus one whose record no group
    /// holds, to lead the next.
    fn finish_write(
        &self,
        first: u64,
        last: u64,
        durable_at: Option<wal::LogPosition>,
    ) -> Result<()> {
        let inner = &self.inner;
        self.advance_visible(Some((first, last, durable_at)), false);
        let failed = || inner.write_failed.load(Ordering::Acquire);
        loop {
            if inner.visible_seq.get() >= last {
                return Ok(());
            }
            if failed() {
                return self.check_failed();
            }
            if durable_at.is_some_and(|p| inner.wal.can_lead(p)) {
                match inner.wal.try_lead_commit(inner.visible_seq.has_parked()) {
                    Some(Ok(_)) => {
                        self.advance_visible(None, true);
                        continue;
                    }
                    Some(Err(e)) => {
                        self.fail(e.to_string());
                        return Err(e);
                    }
                    None => {}
                }
            }
            let key = durable_at.map_or(0, |p| p.end_seq);
            inner.visible_seq.wait(last, key, || {
                failed() || durable_at.is_some_and(|p| inner.wal.can_lead(p))
            });
        }
    }

    /// Adds `finished` (first, last, log position it needs durable) to the
    /// pending writes, then makes visible every pending write whose
    /// predecessors are visible and whose log position is durable; with
    /// `wake_next_leader`, also wakes one writer whose record no commit
    /// group holds yet.
    fn advance_visible(
        &self,
        finished: Option<(u64, u64, Option<wal::LogPosition>)>,
        wake_next_leader: bool,
    ) {
        let inner = &self.inner;
        let mut v = lock(&inner.visible);
        if let Some((first, last, need)) = finished {
            v.pending.insert(first, (last, need));
        }
        // Read under the lock, after the insert: a commit that made this
        // write durable either shows here or advances after we let go.
        let durable = inner.wal.last_durable();
        let mut seq = inner.visible_seq.get();
        while let Some(&(end, need)) = v.pending.get(&(seq + 1)) {
            if need.is_some_and(|p| p.end_seq >= durable) {
                break;
            }
            v.pending.remove(&(seq + 1));
            seq = end;
        }
        inner
            .visible_seq
            .advance(seq, wake_next_leader.then(|| inner.wal.staged_below()));
    }

    /// The store takes no more writes; every waiting writer is told.
    fn fail(&self, why: String) {
        lock(&self.inner.visible).failed.get_or_insert(why);
        self.inner.write_failed.store(true, Ordering::Release);
        self.inner.visible_seq.wake_all();
    }

    fn check_failed(&self) -> Result<()> {
        match &lock(&self.inner.visible).failed {
            Some(why) => Err(StoreError::BadDevice(format!(
                "the store failed and takes no writes: {why}; reopen it to recover"
            ))),
            None => Ok(()),
        }
    }

    pub fn put(&self, keyspace: u32, key: &[u8], value: &[u8]) -> Result<u64> {
        let mut b = WriteBatch::new();
        b.put(keyspace, key, value)?;
        self.write(&b)
    }

    pub fn delete(&self, keyspace: u32, key: &[u8]) -> Result<u64> {
        let mut b = WriteBatch::new();
        b.delete(keyspace, key)?;
        self.write(&b)
    }

    pub fn delete_range(&self, keyspace: u32, start: &[u8], end: &[u8]) -> Result<u64> {
        let mut b = WriteBatch::new();
        b.delete_range(keyspace, start, end)?;
        self.write(&b)
    }

    pub fn snapshot(&self) -> Snapshot {
        let seq = self.inner.visible_seq.get();
        *lock(&self.inner.snapshots.live).entry(seq).or_insert(0) += 1;
        Snapshot {
            seq,
            registry: self.inner.snapshots.clone(),
        }
    }

    /// The memtables and tables a read sees, taken consistently: the
    /// frozen memtable stays until its tables are in the version.
    fn read_view(&self) -> (Vec<Arc<RwLock<Memtable>>>, Arc<Version>) {
        let mem = read(&self.inner.memtables);
        let version = read(&self.inner.version).clone();
        let mut mems = vec![mem.active.clone()];
        mems.extend(mem.frozen.clone());
        (mems, version)
    }

    pub fn get(&self, keyspace: u32, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.get_at(keyspace, key, &self.snapshot())
    }

    pub fn get_at(
        &self,
        keyspace: u32,
        key: &[u8],
        snapshot: &Snapshot,
    ) -> Result<Option<Vec<u8>>> {
        let (mems, version) = self.read_view();
        let guards: Vec<_> = mems.iter().map(|m| read(m)).collect();
        let refs: Vec<&Memtable> = guards.iter().map(|g| &**g).collect();
        version::get(
            &self.inner.dev,
            &refs,
            &version,
            keyspace,
            key,
            snapshot.seq,
        )
    }

    /// A streaming iterator over the live pairs of a keyspace in a key
    /// range at `snapshot`, in key order or (`reverse`) descending. It reads
    /// blocks only as far as it is driven, holds a bounded amount of memory,
    /// and does not block writers; see [`StoreIter`].
    pub fn iter(
        &self,
        keyspace: u32,
        range: (Bound<&[u8]>, Bound<&[u8]>),
        snapshot: &Snapshot,
        reverse: bool,
    ) -> StoreIter {
        self.iter_expecting(keyspace, range, snapshot, reverse, 0)
    }

    /// [`Store::iter`] for a caller that expects to take about
    /// `expected_entries` pairs: the first reads are sized for them.
    pub fn iter_expecting(
        &self,
        keyspace: u32,
        range: (Bound<&[u8]>, Bound<&[u8]>),
        snapshot: &Snapshot,
        reverse: bool,
        expected_entries: usize,
    ) -> StoreIter {
        let (start, end) = half_open(range);
        let spec = CursorSpec {
            start,
            end,
            reverse,
            use_cache: true,
            expected_entries,
        };
        let (mems, version) = self.read_view();
        StoreIter::new(
            &self.inner.dev,
            &mems,
            version,
            keyspace,
            spec,
            snapshot.seq,
        )
    }

    /// [`Store::iter`] over the keys starting with `prefix`.
    pub fn iter_prefix(
        &self,
        keyspace: u32,
        prefix: &[u8],
        snapshot: &Snapshot,
        reverse: bool,
    ) -> StoreIter {
        let end = prefix_end(prefix);
        let upper = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        self.iter(
            keyspace,
            (Bound::Included(prefix), upper),
            snapshot,
            reverse,
        )
    }

    /// The first `limit` pairs of [`Store::iter`], collected; the first
    /// reads are sized for `limit`.
    pub fn scan(
        &self,
        keyspace: u32,
        range: (Bound<&[u8]>, Bound<&[u8]>),
        snapshot: &Snapshot,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.iter_expecting(keyspace, range, snapshot, reverse, limit)
            .take(limit)
            .collect()
    }

    /// Keys starting with `prefix`, in order, at `snapshot`, at most `limit`.
    pub fn scan_prefix(
        &self,
        keyspace: u32,
        prefix: &[u8],
        snapshot: &Snapshot,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let end = prefix_end(prefix);
        let upper = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        self.scan(
            keyspace,
            (Bound::Included(prefix), upper),
            snapshot,
            false,
            limit,
        )
    }

    /// Writes the memtable out as level-0 tables and releases its WAL blocks.
    pub fn flush(&self) -> Result<()> {
        self.inner.flush()
    }

    /// Flushes the memtable and compacts until every keyspace's data sits
    /// in one level.
    pub fn compact(&self) -> Result<()> {
        self.flush()?;
        while self.inner.compact_once(true)? {}
        // Log the frees of tables nobody reads any more.
        let frees = self.inner.take_released();
        if !frees.is_empty() {
            lock(&self.inner.manifest).log(&frees)?;
        }
        Ok(())
    }

    /// Up to `parts - 1` keys that cut a keyspace into parts of similar
    /// size, in order (from its tables' first keys): boundaries for
    /// operators that scan disjoint ranges on several threads.
    pub fn split_keys(&self, keyspace: u32, parts: usize) -> Vec<Vec<u8>> {
        let version = read(&self.inner.version).clone();
        let Some(levels) = version.levels(keyspace) else {
            return Vec::new();
        };
        let mut firsts: Vec<&Vec<u8>> = levels.all().map(|t| &t.meta.smallest).collect();
        firsts.sort();
        firsts.dedup();
        let n = firsts.len();
        if parts < 2 || n < 2 {
            return Vec::new();
        }
        let mut keys: Vec<Vec<u8>> = (1..parts)
            .map(|i| firsts[(i * n / parts).clamp(1, n - 1)].clone())
            .collect();
        keys.dedup();
        keys
    }

    /// Where every live table lies, shallowest level first.
    pub fn table_placement(&self) -> Vec<TablePlacement> {
        let version = read(&self.inner.version).clone();
        let dev = &self.inner.dev;
        version
            .keyspaces
            .iter()
            .flat_map(|(ks, levels)| levels.all().map(move |t| (*ks, t)))
            .map(|(keyspace, t)| TablePlacement {
                keyspace,
                level: t.meta.level,
                file_no: t.meta.file_no,
                data_device: dev.member_of(t.meta.data.start_block),
                index_device: dev.member_of(t.meta.index.start_block),
                data_blocks: t.meta.data.block_count,
            })
            .collect()
    }

    pub fn stats(&self) -> StoreStats {
        let inner = &self.inner;
        let manifest = lock(&inner.manifest);
        let (mems, version) = self.read_view();
        let (entries, bytes) = mems.iter().fold((0, 0), |(e, b), m| {
            let m = read(m);
            (e + m.entry_count(), b + m.approximate_bytes())
        });
        let mut per_level = vec![0usize; version::MAX_LEVELS];
        let (mut pinned, mut unpinned, mut data_bytes, mut table_entries) =
            (0usize, 0usize, 0u64, 0u64);
        for levels in version.keyspaces.values() {
            for (l, tables) in levels.levels.iter().enumerate() {
                per_level[l] += tables.len();
                for t in tables {
                    data_bytes += t.data_bytes();
                    table_entries += t.reader.entries;
                    pinned += t.reader.pinned_bytes();
                    unpinned += usize::from(!t.reader.is_pinned());
                }
            }
        }
        StoreStats {
            last_sequence: inner.visible_seq.get(),
            memtable_entries: entries,
            memtable_bytes: bytes,
            wal_written_below: inner.wal.last_written(),
            wal_durable_below: inner.wal.last_durable(),
            wal_flushes: inner.wal.flush_count(),
            free_blocks: manifest.state().allocator.free_blocks(),
            device_free_blocks: (0..inner.dev.device_count())
                .map(|k| manifest.free_blocks_on(k))
                .collect(),
            device_blocks: manifest.superblock().device_blocks,
            keyspaces: read(&inner.keyspaces).keys().cloned().collect(),
            tables_per_level: per_level,
            table_data_bytes: data_bytes,
            table_entries,
            pinned_index_bytes: pinned,
            pinned_index_limit_bytes: inner.pin_budget.limit_bytes(),
            unpinned_tables: unpinned,
            index_cache_used_bytes: inner.index_cache.used_bytes(),
            flushes: inner.flushes.load(Ordering::Relaxed),
            compactions: inner.compactions.load(Ordering::Relaxed),
            block_cache_used_bytes: inner.cache.used_bytes(),
            block_cache_hits: inner.cache.hits(),
            block_cache_misses: inner.cache.misses(),
        }
    }
}

impl Inner {
    /// Writes the memtable out as level-0 tables and releases its WAL
    /// blocks; the tables and the manifest at low I/O priority, the log's
    /// last block at high.
    pub fn flush(&self) -> Result<()> {
        with_io_priority(Priority::Low, || self.flush_memtable())
    }

    fn flush_memtable(&self) -> Result<()> {
        let inner = self;
        let _one = lock(&inner.flush_lock);
        // Freeze: new writes go to a fresh memtable; the WAL closes its open
        // block so the frozen records end at a block boundary.
        let (frozen, tail_seq, last_seq) = {
            let next = lock(&inner.writer);
            let mut mem = write(&inner.memtables);
            if read(&mem.active).is_empty() {
                return Ok(());
            }
            let tail = with_io_priority(Priority::High, || inner.wal.close_block())?;
            let frozen =
                std::mem::replace(&mut mem.active, Arc::new(RwLock::new(Memtable::default())));
            mem.frozen = Some(frozen.clone());
            (frozen, tail, *next - 1)
        };
        // Every frozen write must be visible (committed) before it is flushed.
        inner
            .visible_seq
            .wait(last_seq, 0, || inner.write_failed.load(Ordering::Acquire));
        let frozen_guard = read(&frozen);
        let names: BTreeMap<u32, String> = read(&inner.keyspaces)
            .values()
            .map(|k| (k.id, k.name.clone()))
            .collect();
        let mut placed = Vec::new();
        for ks in frozen_guard.keyspaces() {
            let mut b = TableBuilder::new();
            for e in frozen_guard.iter_from(ks, &[]) {
                b.add(&e);
            }
            for t in frozen_guard.range_tombstones(ks) {
                b.add_range_tombstone(t);
            }
            match self.place(ks, b.finish()) {
                Ok(p) => placed.push(p),
                Err(e) => {
                    self.unplace(&placed.iter().flat_map(Placed::extents).collect::<Vec<_>>());
                    return Err(e);
                }
            }
        }
        drop(frozen_guard);
        let mut extra = vec![
            Edit::Wal(WalPlace {
                epoch: inner.wal_epoch(),
                tail_seq,
                ring: inner.wal_ring(),
            }),
            Edit::LastSequence(last_seq),
        ];
        extra.extend(self.take_released());
        let tables = self.install(placed, 0, &names, &[], extra)?;
        inner.wal.release_before(tail_seq);
        {
            let mut mem = write(&inner.memtables);
            let mut v = write(&inner.version);
            let mut next = (**v).clone();
            for t in tables {
                next.keyspaces.entry(t.meta.keyspace).or_default().insert(t);
            }
            *v = Arc::new(next);
            mem.frozen = None;
        }
        inner.flushes.fetch_add(1, Ordering::Relaxed);
        self.wake_background();
        Ok(())
    }

    /// Free edits for tables whose last reader has let go.
    fn take_released(&self) -> Vec<Edit> {
        std::mem::take(&mut *lock(&self.released))
            .into_iter()
            .map(Edit::Free)
            .collect()
    }

    /// Allocates an extent for a built table and writes it there; the
    /// allocation is logged by [`Inner::install`].
    fn place(&self, keyspace: u32, t: BuiltTable) -> Result<Placed> {
        let (extent, meta) = self.allocate_table(&t)?;
        let written = match meta {
            Some(meta) => write_table_parts(&self.dev, extent, meta, &t),
            None => write_table(&self.dev, extent, &t),
        };
        if let Err(e) = written {
            self.unplace(&[extent]);
            self.unplace(meta.as_slice());
            return Err(e);
        }
        let file_no = self.next_file.fetch_add(1, Ordering::Relaxed);
        Ok(Placed {
            keyspace,
            extent,
            meta,
            file_no,
            index_offset_blocks: t.index_offset_blocks,
            entries: t.entries,
            smallest: t.smallest,
            largest: t.largest,
        })
    }

    /// Extents for a built table: one on the first device when the store
    /// has one device (or the table no data blocks); else the data blocks
    /// on the next data device in turn (the others if it is full) and the
    /// rest on the first device.
    fn allocate_table(&self, t: &BuiltTable) -> Result<(Extent, Option<Extent>)> {
        let blocks = (t.bytes.len() / STORE_BLOCK_BYTES) as u64;
        let data_blocks = t.index_offset_blocks as u64;
        let data_devices = self.dev.device_count() - 1;
        let mut manifest = lock(&self.manifest);
        if data_devices == 0 || data_blocks == 0 {
            return Ok((manifest.allocate(blocks)?, None));
        }
        let meta = manifest.allocate(blocks - data_blocks)?;
        let turn = self.next_data_device.fetch_add(1, Ordering::Relaxed) as usize;
        let mut full = None;
        for k in (0..data_devices).map(|i| 1 + (turn + i) % data_devices) {
            match manifest.allocate_on(k, data_blocks) {
                Ok(data) => return Ok((data, Some(meta))),
                Err(e @ StoreError::DeviceFull { .. }) => full = Some(e),
                Err(e) => {
                    let _ = manifest.release_unlogged(meta);
                    return Err(e);
                }
            }
        }
        let _ = manifest.release_unlogged(meta);
        Err(full.expect("at least one data device"))
    }

    /// Gives back extents of placed tables that will not be installed.
    fn unplace(&self, extents: &[Extent]) {
        let mut manifest = lock(&self.manifest);
        for e in extents {
            // They were allocated and never logged: releasing cannot fail
            // unless the allocator is broken, and then reopening reclaims.
            let _ = manifest.release_unlogged(*e);
        }
    }

    /// Logs placed tables at `level` (with `removed` and `extra` edits) as
    /// one manifest group, and opens them.
    fn install(
        &self,
        placed: Vec<Placed>,
        level: u8,
        names: &BTreeMap<u32, String>,
        removed: &[(u32, u64)],
        extra: Vec<Edit>,
    ) -> Result<Vec<Arc<Table>>> {
        let inner = self;
        let mut edits = Vec::new();
        let mut metas = Vec::new();
        for p in placed {
            let meta = TableMeta {
                keyspace: p.keyspace,
                level,
                file_no: p.file_no,
                data: p.extent,
                index: p.meta.unwrap_or(Extent {
                    start_block: p.extent.start_block + p.index_offset_blocks as u64,
                    block_count: p.extent.block_count - p.index_offset_blocks,
                }),
                entries: p.entries,
                smallest: p.smallest,
                largest: p.largest,
            };
            edits.extend(std::iter::once(p.extent).chain(p.meta).map(Edit::Alloc));
            edits.push(Edit::AddTable(meta.clone()));
            metas.push(meta);
        }
        for (ks, file_no) in removed {
            edits.push(Edit::RemoveTable {
                keyspace: *ks,
                file_no: *file_no,
            });
        }
        edits.extend(extra);
        edits.push(Edit::NextFile(inner.next_file.load(Ordering::Relaxed)));
        lock(&inner.manifest).log(&edits)?;
        metas
            .into_iter()
            .map(|meta| {
                let name = names.get(&meta.keyspace).map_or("?", String::as_str);
                let reader = TableReader::open_parts(
                    &inner.dev,
                    meta.data,
                    Some(meta.index),
                    TablePlace {
                        keyspace: name,
                        file_no: meta.file_no,
                    },
                )?
                .with_cache(inner.cache.clone())
                .with_index_memory(inner.pin_budget.clone(), inner.index_cache.clone());
                Ok(Arc::new(Table::new(meta, reader, inner.released.clone())))
            })
            .collect()
    }

    /// Runs one due compaction, if any (or, with `force`, one that pushes
    /// data down). Returns whether it did anything.
    fn compact_once(&self, force: bool) -> Result<bool> {
        with_io_priority(Priority::Low, || self.compact_one(force))
    }

    fn compact_one(&self, force: bool) -> Result<bool> {
        let inner = self;
        let _one = lock(&inner.compaction_lock);
        let version = read(&inner.version).clone();
        let cursor = inner.compaction_cursor.fetch_add(1, Ordering::Relaxed) as usize;
        let Some(job) = version.keyspaces.iter().find_map(|(ks, levels)| {
            compaction::pick(&inner.config.compaction, *ks, levels, cursor, force)
        }) else {
            return Ok(false);
        };
        if compaction::is_trivial_move(&job) {
            self.move_down(&job)?;
            inner.compactions.fetch_add(1, Ordering::Relaxed);
            return Ok(true);
        }
        let snapshots: Vec<u64> = lock(&inner.snapshots.live).keys().copied().collect();
        let mut placed = Vec::new();
        let ran = compaction::run(
            &inner.dev,
            &job,
            &snapshots,
            inner.config.compaction.target_file_bytes,
            &mut |t| {
                placed.push(self.place(job.keyspace, t)?);
                Ok(())
            },
        );
        if let Err(e) = ran {
            self.unplace(&placed.iter().flat_map(Placed::extents).collect::<Vec<_>>());
            return Err(e);
        }
        let names: BTreeMap<u32, String> = read(&inner.keyspaces)
            .values()
            .map(|k| (k.id, k.name.clone()))
            .collect();
        let removed: Vec<(u32, u64)> = job
            .inputs
            .iter()
            .chain(&job.next_inputs)
            .map(|t| (job.keyspace, t.meta.file_no))
            .collect();
        let released = self.take_released();
        let tables = self.install(placed, (job.level + 1) as u8, &names, &removed, released)?;
        {
            let mut v = write(&inner.version);
            let mut next = (**v).clone();
            let levels: &mut Levels = next.keyspaces.entry(job.keyspace).or_default();
            for (_, file_no) in &removed {
                levels.remove(*file_no);
            }
            for t in tables {
                levels.insert(t);
            }
            *v = Arc::new(next);
        }
        for t in job.inputs.iter().chain(&job.next_inputs) {
            t.mark_obsolete();
        }
        drop(job);
        drop(version);
        inner.compactions.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Moves the job's tables one level down without rewriting them: one
    /// manifest group re-adds each at its new level.
    fn move_down(&self, job: &compaction::Job) -> Result<()> {
        let level = (job.level + 1) as u8;
        let moved: Vec<Arc<Table>> = job
            .inputs
            .iter()
            .map(|t| Arc::new(t.moved_to(level)))
            .collect();
        let mut edits: Vec<Edit> = moved
            .iter()
            .map(|t| Edit::AddTable(t.meta.clone()))
            .collect();
        edits.extend(self.take_released());
        lock(&self.manifest).log(&edits)?;
        let mut v = write(&self.version);
        let mut next = (**v).clone();
        let levels: &mut Levels = next.keyspaces.entry(job.keyspace).or_default();
        for t in moved {
            levels.remove(t.meta.file_no);
            levels.insert(t);
        }
        *v = Arc::new(next);
        Ok(())
    }

    fn wake_background(&self) {
        *lock(&self.wake_lock) = true;
        self.wake.notify_all();
    }
}

impl Inner {
    /// The most level-0 tables any keyspace has.
    fn l0_tables(&self) -> usize {
        read(&self.version)
            .keyspaces
            .values()
            .map(|l| l.level(0).len())
            .max()
            .unwrap_or(0)
    }

    fn wal_epoch(&self) -> u64 {
        self.wal.layout().epoch
    }

    fn wal_ring(&self) -> Vec<Extent> {
        self.wal.layout().ring.clone()
    }
}

/// Says what WAL recovery, as asked, passed over (recovery itself names
/// each block it rebuilt).
fn report_wal_recovery(recovered: &wal::Recovered, mode: WalRecovery) {
    if !recovered.dropped.is_empty() {
        log::warn!(
            "WAL recovery {mode:?}: {} log block(s) dropped as asked: {:?}",
            recovered.dropped.len(),
            recovered.dropped
        );
    }
}

/// Memtable flushes and compactions, both at low I/O priority (yielding to
/// foreground reads and log writes; see [`Inner::flush`] and
/// [`Inner::compact_once`]).
fn background_loop(inner: &Arc<Inner>) {
    loop {
        {
            let mut woken = lock(&inner.wake_lock);
            while !*woken && !inner.shutdown.load(Ordering::Acquire) {
                woken = inner
                    .wake
                    .wait_timeout(woken, std::time::Duration::from_secs(1))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            *woken = false;
        }
        if inner.shutdown.load(Ordering::Acquire) {
            break;
        }
        if inner.flush_requested.swap(false, Ordering::AcqRel) {
            if let Err(e) = inner.flush() {
                log::error!("background flush failed: {e}");
            }
        }
        loop {
            match inner.compact_once(false) {
                Ok(true) if !inner.shutdown.load(Ordering::Acquire) => continue,
                Ok(_) => break,
                Err(e) => {
                    log::error!("background compaction failed: {e}");
                    break;
                }
            }
        }
    }
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
            if let Err(e) = lock(&self.inner.manifest).log(&frees) {
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
        if let Err(e) = closed {
            log::error!("closing the store: unsynced writes may be lost: {e}");
        }
    }
}

/// Opens the devices of a store as one block device: the superblock on the
/// first says how many there are and how much of each is used; every other
/// device's label must name this store and its place in the set.
fn open_device_set(devices: Vec<Arc<dyn Device>>) -> Result<BlockDevice> {
    let first = devices
        .first()
        .cloned()
        .ok_or_else(|| StoreError::BadDevice("no device given".into()))?;
    let sb = crate::superblock::read(&BlockDevice::new(first)?)?;
    if sb.member_blocks.len() != devices.len() {
        return Err(StoreError::BadDevice(format!(
            "the store on {} spans {} devices but got {}: pass all of them, in the order they were formatted",
            devices[0].describe(),
            sb.member_blocks.len(),
            devices.len()
        )));
    }
    let names: Vec<String> = devices.iter().map(|d| d.describe()).collect();
    let dev = BlockDevice::set(
        devices
            .into_iter()
            .zip(sb.member_blocks.iter().copied())
            .collect(),
    )?;
    for (k, name) in names.iter().enumerate().skip(1) {
        let (_, base, _) = dev.member(k);
        let problem = match crate::superblock::read_label(&dev, base)? {
            Ok(label) if label.store_id == sb.store_id && label.device_index == k as u32 => continue,
            Ok(label) if label.store_id == sb.store_id => format!(
                "it is device {} of this store, not device {k}: pass the devices in the order they were formatted",
                label.device_index
            ),
            Ok(_) => "it belongs to another store".to_string(),
            Err(e) => format!("it holds no valid store label ({e:?})"),
        };
        return Err(StoreError::BadDevice(format!(
            "{name} cannot be device {k} of the store on {}: {problem}",
            names[0]
        )));
    }
    Ok(dev)
}

/// Frees extents the manifest has allocated but nothing refers to: tables
/// removed by a compaction whose frees were not logged before a crash, or
/// tables written by a flush or compaction that crashed before logging
/// them.
fn reclaim_unreferenced(manifest: &mut Manifest) -> Result<()> {
    let member_starts: Vec<u64> = (1..manifest.device().device_count())
        .map(|k| manifest.device().member(k).1)
        .collect();
    let state = manifest.state();
    let mut referenced: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut refer = |e: Extent| {
        referenced.insert((e.start_block, e.end_block()));
    };
    refer(manifest.superblock().manifest);
    for t in state.tables.values() {
        refer(t.data);
        refer(t.index);
    }
    // The labels at the start of every device after the first.
    for &first in &member_starts {
        refer(Extent {
            start_block: first,
            block_count: crate::superblock::SUPERBLOCK_BLOCKS as u32,
        });
    }
    if let Some(w) = &state.wal {
        w.ring.iter().copied().for_each(&mut refer);
    }
    // Walk the allocated runs (the complement of the free map) and free
    // every part no referenced extent covers.
    let free = state.allocator.free_list();
    let end = manifest.superblock().device_blocks;
    let mut allocated = Vec::new();
    let mut at = crate::superblock::SUPERBLOCK_BLOCKS;
    for f in &free {
        if f.start_block > at {
            allocated.push((at, f.start_block));
        }
        at = f.end_block();
    }
    if at < end {
        allocated.push((at, end));
    }
    let mut frees = Vec::new();
    for (mut s, e) in allocated {
        for &(rs, re) in referenced.range((s, 0)..(e, 0)) {
            if rs > s {
                frees.push((s, rs));
            }
            s = s.max(re);
        }
        if s < e {
            frees.push((s, e));
        }
    }
    if frees.is_empty() {
        return Ok(());
    }
    let edits: Vec<Edit> = frees
        .into_iter()
        .map(|(s, e)| {
            log::warn!("reclaiming unreferenced blocks {s}..{e}");
            Edit::Free(Extent {
                start_block: s,
                block_count: (e - s) as u32,
            })
        })
        .collect();
    manifest.log(&edits)
}

/// The smallest key greater than every key with this prefix, if any.
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// A key range as `[start, end)`: the start key included, the end key
/// excluded (None: unbounded). The key right after `k` is `k ++ 0x00`.
pub fn half_open(range: (Bound<&[u8]>, Bound<&[u8]>)) -> (Vec<u8>, Option<Vec<u8>>) {
    let start = match range.0 {
        Bound::Included(k) => k.to_vec(),
        Bound::Excluded(k) => [k, &[0]].concat(),
        Bound::Unbounded => Vec::new(),
    };
    let end = match range.1 {
        Bound::Included(k) => Some([k, &[0]].concat()),
        Bound::Excluded(k) => Some(k.to_vec()),
        Bound::Unbounded => None,
    };
    (start, end)
}
