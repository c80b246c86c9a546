//! The set of live tables per keyspace and level, and reads that merge the
//! memtables with them: newest source first, range tombstones applied.

use crate::blob::{BlobFile, BlobRef};
use crate::blocks::{BlockDevice, Extent};
use crate::error::{Result, StoreError};
use crate::found::Found;
use crate::manifest::TableMeta;
use crate::memtable::Memtable;
use crate::sst::{EntryKind, RangeTombstone, TableReader};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Levels a keyspace may have.
pub const MAX_LEVELS: usize = 7;

/// A live table. Once a compaction has replaced it, its extent is freed
/// when the last reader lets go of it.
#[derive(Debug)]
pub struct Table {
    /// What the manifest records of the table.
    pub meta: TableMeta,
    /// The open table.
    pub reader: Arc<TableReader>,
    obsolete: AtomicBool,
    released: Arc<Mutex<Vec<Extent>>>,
}

impl Table {
    /// A live table; its extents go to `released` once it is obsolete and its last reader is gone.
    pub fn new(meta: TableMeta, reader: TableReader, released: Arc<Mutex<Vec<Extent>>>) -> Self {
        Table {
            meta,
            reader: Arc::new(reader),
            obsolete: AtomicBool::new(false),
            released,
        }
    }

    /// The same table one level deeper (a trivial move): same extents and
    /// reader; dropping `self` afterwards frees nothing.
    pub fn moved_to(&self, level: u8) -> Table {
        Table {
            meta: TableMeta {
                level,
                ..self.meta.clone()
            },
            reader: self.reader.clone(),
            obsolete: AtomicBool::new(false),
            released: self.released.clone(),
        }
    }

    /// Marks it replaced: its extents are released with its last reference.
    pub fn mark_obsolete(&self) {
        self.obsolete.store(true, Ordering::Release);
    }

    /// Bytes of its data blocks.
    pub fn size_bytes(&self) -> u64 {
        self.meta.data.block_count as u64 * crate::blocks::STORE_BLOCK_BYTES as u64
    }

    /// Whether the index extent is the tail of the data extent (one
    /// device) rather than an extent of its own (a device set).
    fn index_inside_data(&self) -> bool {
        let (data, index) = (self.meta.data, self.meta.index);
        index.start_block >= data.start_block && index.end_block() <= data.end_block()
    }

    /// Bytes of the table's data blocks (its index, filter and footer not
    /// counted).
    pub fn data_bytes(&self) -> u64 {
        let (data, index) = (self.meta.data, self.meta.index);
        let blocks = data.block_count
            - if self.index_inside_data() {
                index.block_count
            } else {
                0
            };
        blocks as u64 * crate::blocks::STORE_BLOCK_BYTES as u64
    }

    fn covers(&self, key: &[u8]) -> bool {
        self.meta.smallest.as_slice() <= key && key <= self.meta.largest.as_slice()
    }

    pub(crate) fn overlaps(&self, start: &[u8], end: Option<&[u8]>) -> bool {
        self.meta.largest.as_slice() >= start
            && end.is_none_or(|e| self.meta.smallest.as_slice() < e)
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        if self.obsolete.load(Ordering::Acquire) {
            let mut released = self.released.lock().unwrap_or_else(|p| p.into_inner());
            released.push(self.meta.data);
            // On a device set the index lies in its own extent.
            if !self.index_inside_data() {
                released.push(self.meta.index);
            }
        }
    }
}

/// Tables of one keyspace: level 0 newest first (may overlap), deeper
/// levels sorted by key and disjoint.
#[derive(Debug, Clone, Default)]
pub struct Levels {
    /// Tables of each level.
    pub levels: Vec<Vec<Arc<Table>>>,
}

impl Levels {
    /// Tables of level `l` (empty past the deepest).
    pub fn level(&self, l: usize) -> &[Arc<Table>] {
        self.levels.get(l).map_or(&[], Vec::as_slice)
    }

    /// Tables of level `l`, to change (levels are added as needed).
    pub fn level_mut(&mut self, l: usize) -> &mut Vec<Arc<Table>> {
        if self.levels.len() <= l {
            self.levels.resize_with(l + 1, Vec::new);
        }
        &mut self.levels[l]
    }

    /// Puts a table in its level, keeping the level's order.
    pub fn insert(&mut self, t: Arc<Table>) {
        let level = t.meta.level as usize;
        let v = self.level_mut(level);
        v.push(t);
        if level == 0 {
            v.sort_by_key(|t| std::cmp::Reverse(t.meta.file_no));
        } else {
            v.sort_by(|a, b| a.meta.smallest.cmp(&b.meta.smallest));
        }
    }

    /// Removes the table with this number, at whatever level.
    pub fn remove(&mut self, file_no: u64) {
        for v in &mut self.levels {
            v.retain(|t| t.meta.file_no != file_no);
        }
    }

    /// Tables that may hold `key`, newest source first.
    fn candidates<'a>(&'a self, key: &'a [u8]) -> impl Iterator<Item = &'a Arc<Table>> + 'a {
        self.levels.iter().enumerate().flat_map(move |(l, tables)| {
            let pick: Vec<&Arc<Table>> = if l == 0 {
                tables.iter().filter(|t| t.covers(key)).collect()
            } else {
                let i = tables.partition_point(|t| t.meta.largest.as_slice() < key);
                tables
                    .get(i)
                    .filter(|t| t.covers(key))
                    .into_iter()
                    .collect()
            };
            pick.into_iter()
        })
    }

    /// Every table, newest source first.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Table>> {
        self.levels.iter().flatten()
    }

    /// Bytes of level `l`'s data blocks.
    pub fn level_bytes(&self, l: usize) -> u64 {
        self.level(l).iter().map(|t| t.size_bytes()).sum()
    }
}

/// The live tables of every keyspace, and the blob files their values
/// (and the memtables') may lie in.
#[derive(Debug, Clone, Default)]
pub struct Version {
    /// Tables of each keyspace.
    pub keyspaces: BTreeMap<u32, Levels>,
    /// Live blob files by number.
    pub blob_files: BTreeMap<u64, Arc<BlobFile>>,
}

impl Version {
    /// The keyspace's tables, if it has any.
    pub fn levels(&self, keyspace: u32) -> Option<&Levels> {
        self.keyspaces.get(&keyspace)
    }

    /// The blob file a reference names, with the reference; an error if
    /// the reference does not decode or names no live file.
    pub fn blob(&self, reference: &[u8]) -> Result<(Arc<BlobFile>, BlobRef)> {
        let r = BlobRef::decode(reference).ok_or_else(|| {
            StoreError::BadInput(format!(
                "a blob reference of {} bytes (expected {})",
                reference.len(),
                crate::blob::REF_BYTES
            ))
        })?;
        let file = self.blob_files.get(&r.file_no).ok_or_else(|| {
            StoreError::BadInput(format!(
                "a value names blob file {}, which the store does not hold",
                r.file_no
            ))
        })?;
        Ok((file.clone(), r))
    }

    /// Blob blocks each blob file's records take that the tables
    /// reference, by file number.
    pub fn referenced_blob_blocks(&self) -> BTreeMap<u64, u64> {
        let mut out = BTreeMap::new();
        for t in self.keyspaces.values().flat_map(|l| l.all()) {
            for &(file_no, blocks) in &t.meta.blob_refs {
                *out.entry(file_no).or_insert(0) += blocks;
            }
        }
        out
    }
}

/// What a point read found that memory could not answer.
pub enum Pending<F> {
    /// A table's index or block no cache holds.
    Miss(CacheMiss),
    /// A value kept in a blob file: read it (with no lock held) and hand
    /// it to `f`.
    Blob {
        /// The file.
        file: Arc<BlobFile>,
        /// Where the value lies.
        reference: BlobRef,
        /// The read's own `f`, not yet called.
        f: F,
    },
}

pub(crate) fn tombstone_seq(ts: &[RangeTombstone], key: &[u8], snapshot: u64) -> u64 {
    ts.iter()
        .filter(|t| t.seq <= snapshot && t.start.as_slice() <= key && key < t.end.as_slice())
        .map(|t| t.seq)
        .max()
        .unwrap_or(0)
}

/// A table's index or block a point read found in no cache: read it
/// ([`CacheMiss::extent`]), fill it in ([`CacheMiss::fill`]), ask again.
/// Holds the table, so its extent is not reused meanwhile.
#[derive(Debug, Clone)]
pub struct CacheMiss {
    table: Arc<crate::sst::TableReader>,
    at: crate::sst::MissAt,
}

impl CacheMiss {
    /// What is missing.
    pub fn at(&self) -> crate::sst::MissAt {
        self.at
    }

    /// The device run to read: (first store block, blocks).
    pub fn extent(&self, dev: &BlockDevice) -> Result<(u64, usize)> {
        self.table.miss_extent(dev, self.at)
    }

    /// Puts `bytes`, read from [`CacheMiss::extent`], in the cache.
    pub fn fill(&self, dev: &BlockDevice, bytes: &[u8]) -> Result<()> {
        self.table.fill_miss(dev, self.at, bytes)
    }
}

/// The value of `key` at `snapshot`, searching the memtables (newest
/// first) and then the tables, borrowed: `f` sees it (None: no live value) and
/// its result is returned; nothing is copied on the way. With `wait`
/// false, a read that needs an index or block no cache holds returns it
/// instead of reading it (`f` is not called then). A value in a blob file
/// is returned as [`Pending::Blob`] with `f` uncalled: the caller reads
/// it once it has let go of the memtables' locks.
#[allow(clippy::too_many_arguments)]
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: called once; not called yet"
)]
pub fn get_or_miss<R, F: FnOnce(Option<Found<'_>>) -> R>(
    dev: &BlockDevice,
    memtables: &[&Memtable],
    version: &Version,
    keyspace: u32,
    key: &[u8],
    snapshot: u64,
    wait: bool,
    f: F,
) -> Result<std::result::Result<R, Pending<F>>> {
    let mut deleted_at = 0u64;
    for m in memtables {
        deleted_at = deleted_at.max(m.range_deleted_at(keyspace, key, snapshot));
        if let Some((seq, kind, v)) = m.newest_version(keyspace, key, snapshot) {
            let live = seq > deleted_at && kind.is_value();
            if live && kind == EntryKind::Blob {
                let (file, reference) = version.blob(v.bytes())?;
                return Ok(Err(Pending::Blob { file, reference, f }));
            }
            return Ok(Ok(f(live.then_some(v))));
        }
    }
    let Some(levels) = version.levels(keyspace) else {
        return Ok(Ok(f(None)));
    };
    for t in levels.all() {
        deleted_at = deleted_at.max(tombstone_seq(&t.reader.range_tombstones, key, snapshot));
    }
    let mut f = Some(f);
    for t in levels.candidates(key) {
        let answered = t.reader.get_or_miss(dev, key, snapshot, wait, |hit| {
            let (hit, value) = hit?;
            let live = hit.seq > deleted_at && hit.kind.is_value();
            if live && hit.kind == EntryKind::Blob {
                return Some(Err(version.blob(value.bytes())));
            }
            let f = f.take().expect("called once");
            Some(Ok(f(live.then_some(value))))
        })?;
        match answered {
            Ok(Some(Ok(r))) => return Ok(Ok(r)),
            Ok(Some(Err(blob))) => {
                let (file, reference) = blob?;
                let f = f.take().expect("not called yet");
                return Ok(Err(Pending::Blob { file, reference, f }));
            }
            Ok(None) => {}
            Err(at) => {
                return Ok(Err(Pending::Miss(CacheMiss {
                    table: t.reader.clone(),
                    at,
                })))
            }
        }
    }
    Ok(Ok((f.take().expect("not called yet"))(None)))
}
