//! The store: keyspaces, durable writes through the WAL, reads at a snapshot
//! sequence. Tables (SSTs), flush and compaction are the next step; until
//! then the memtable holds everything since format, and the WAL ring bounds
//! how much that can be (a full ring is a clear error, nothing is lost).

use crate::batch::{show, WriteBatch};
use crate::blocks::BlockDevice;
use crate::error::{Result, StoreError};
use crate::manifest::{Edit, KeyspaceDef, Manifest, ValueFormat, WalPlace};
use crate::memtable::Memtable;
use crate::wal::{self, Wal, WalLayout};
use rand::Rng;
use sluice_io::Device;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};

/// The keyspace every store has.
pub const DEFAULT_KEYSPACE: &str = "default";
/// Most keyspaces one store holds.
pub const MAX_KEYSPACES: usize = 1024;

#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Size of the WAL ring in 4 KiB blocks (format time only).
    pub wal_blocks: u32,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig { wal_blocks: 16384 }
    }
}

/// A point in the store's history; reads through it see exactly the writes
/// acknowledged before it was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Snapshot(pub u64);

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
    pub keyspaces: Vec<String>,
}

struct WriteState {
    next_seq: u64,
}

struct Visible {
    seq: u64,
    failed: Option<String>,
}

pub struct Store {
    manifest: Mutex<Manifest>,
    keyspaces: RwLock<BTreeMap<String, KeyspaceDef>>,
    wal: Wal,
    memtable: RwLock<Memtable>,
    writer: Mutex<WriteState>,
    visible: Mutex<Visible>,
    published: Condvar,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("wal", &self.wal).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Store {
    /// Formats `device` as a new store (everything on it is overwritten).
    pub fn create(device: Arc<dyn Device>, config: &StoreConfig) -> Result<Self> {
        let dev = BlockDevice::new(device)?;
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
        Self::open(dev.device().clone())
    }

    /// Opens the store on `device`, replaying the WAL into the memtable.
    pub fn open(device: Arc<dyn Device>) -> Result<Self> {
        let dev = BlockDevice::new(device)?;
        let manifest = Manifest::open(dev.clone())?;
        let state = manifest.state();
        let place = state.wal.clone().ok_or_else(|| StoreError::Corrupt {
            what: "manifest",
            block: manifest.superblock().manifest.start_block,
            lba: dev.lba_of(manifest.superblock().manifest.start_block),
            reason: "no write-ahead log recorded".into(),
        })?;
        let layout = WalLayout {
            ring: place.ring.clone(),
            epoch: place.epoch,
        };
        let recovered = wal::recover(&dev, &layout, place.tail_seq)?;
        let mut memtable = Memtable::default();
        let mut last_seq = state.last_sequence;
        for (pos, record) in &recovered.records {
            let (first, batch) = WriteBatch::decode(record).ok_or_else(|| StoreError::Corrupt {
                what: "WAL record",
                block: pos.end_seq,
                lba: 0,
                reason: "a record with valid checksums does not decode as a write batch".into(),
            })?;
            memtable.apply(first, &batch);
            last_seq = last_seq.max(first + batch.len() as u64 - 1);
        }
        let keyspaces = state
            .keyspaces
            .values()
            .map(|k| (k.name.clone(), k.clone()))
            .collect();
        let wal = Wal::open(dev, layout, place.tail_seq, recovered.next_seq)?;
        Ok(Store {
            manifest: Mutex::new(manifest),
            keyspaces: RwLock::new(keyspaces),
            wal,
            memtable: RwLock::new(memtable),
            writer: Mutex::new(WriteState {
                next_seq: last_seq + 1,
            }),
            visible: Mutex::new(Visible {
                seq: last_seq,
                failed: None,
            }),
            published: Condvar::new(),
        })
    }

    /// The id of keyspace `name`.
    pub fn keyspace(&self, name: &str) -> Result<u32> {
        let ks = self.keyspaces.read().unwrap_or_else(|p| p.into_inner());
        ks.get(name)
            .map(|k| k.id)
            .ok_or_else(|| StoreError::UnknownKeyspace {
                name: name.into(),
                known: ks.keys().cloned().collect::<Vec<_>>().join(", "),
            })
    }

    pub fn keyspace_def(&self, name: &str) -> Result<KeyspaceDef> {
        let id = self.keyspace(name)?;
        let ks = self.keyspaces.read().unwrap_or_else(|p| p.into_inner());
        Ok(ks
            .values()
            .find(|k| k.id == id)
            .expect("known keyspace")
            .clone())
    }

    /// Creates keyspace `name` with a declared value format; returns its id.
    pub fn create_keyspace(&self, name: &str, format: ValueFormat, schema: &str) -> Result<u32> {
        if name.is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
            return Err(StoreError::BadInput(format!(
                "keyspace name {name:?} must be 1 to 255 printable characters"
            )));
        }
        let mut manifest = lock(&self.manifest);
        let mut ks = self.keyspaces.write().unwrap_or_else(|p| p.into_inner());
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
        let ks = self.keyspaces.read().unwrap_or_else(|p| p.into_inner());
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
        if batch.is_empty() {
            return Ok(self.snapshot().0);
        }
        self.check_keyspaces(batch)?;
        self.check_failed()?;
        let (first, pos) = {
            let mut w = lock(&self.writer);
            let first = w.next_seq;
            let pos = self.wal.append(&batch.encode(first))?;
            w.next_seq += batch.len() as u64;
            self.memtable
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .apply(first, batch);
            (first, pos)
        };
        let last = first + batch.len() as u64 - 1;
        let committed = self.wal.commit(pos);
        self.publish(first, last, committed.as_ref().err().map(|e| e.to_string()))?;
        committed?;
        Ok(last)
    }

    /// Makes `first..=last` visible once everything before it is.
    fn publish(&self, first: u64, last: u64, failure: Option<String>) -> Result<()> {
        let mut v = lock(&self.visible);
        if let Some(why) = failure {
            v.failed.get_or_insert(why);
            self.published.notify_all();
            return Ok(());
        }
        while v.seq + 1 != first {
            if let Some(why) = &v.failed {
                return Err(StoreError::BadDevice(format!(
                    "the store failed and takes no writes: {why}"
                )));
            }
            v = self.published.wait(v).unwrap_or_else(|p| p.into_inner());
        }
        v.seq = last;
        self.published.notify_all();
        Ok(())
    }

    fn check_failed(&self) -> Result<()> {
        match &lock(&self.visible).failed {
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
        Snapshot(lock(&self.visible).seq)
    }

    pub fn get(&self, keyspace: u32, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.get_at(keyspace, key, self.snapshot())
    }

    pub fn get_at(&self, keyspace: u32, key: &[u8], snapshot: Snapshot) -> Result<Option<Vec<u8>>> {
        let mem = self.memtable.read().unwrap_or_else(|p| p.into_inner());
        Ok(mem.get(keyspace, key, snapshot.0).flatten())
    }

    /// Live pairs of a keyspace in a key range at `snapshot`, forward or
    /// reverse, at most `limit`.
    pub fn scan(
        &self,
        keyspace: u32,
        range: (Bound<&[u8]>, Bound<&[u8]>),
        snapshot: Snapshot,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mem = self.memtable.read().unwrap_or_else(|p| p.into_inner());
        let mut all = mem.scan(keyspace, range.0, range.1, snapshot.0);
        if reverse {
            all.reverse();
        }
        all.truncate(limit);
        Ok(all)
    }

    /// Keys starting with `prefix`, in order, at `snapshot`.
    pub fn scan_prefix(
        &self,
        keyspace: u32,
        prefix: &[u8],
        snapshot: Snapshot,
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

    pub fn stats(&self) -> StoreStats {
        let manifest = lock(&self.manifest);
        let mem = self.memtable.read().unwrap_or_else(|p| p.into_inner());
        StoreStats {
            last_sequence: self.snapshot().0,
            memtable_entries: mem.entry_count(),
            memtable_bytes: mem.approximate_bytes(),
            wal_written_below: self.wal.last_written(),
            wal_durable_below: self.wal.last_durable(),
            wal_flushes: self.wal.flush_count(),
            free_blocks: manifest.state().allocator.free_blocks(),
            device_blocks: manifest.superblock().device_blocks,
            keyspaces: self
                .keyspaces
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .keys()
                .cloned()
                .collect(),
        }
    }
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

/// For messages.
pub fn describe_key(key: &[u8]) -> String {
    show(key)
}
