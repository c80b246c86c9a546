//! Streaming iteration: a merge of memtable and table sources in internal
//! order (or its reverse), and [`StoreIter`], which turns that merge into
//! the live pairs a snapshot sees.
//!
//! Every source reads lazily: a memtable source copies a bounded chunk of
//! versions per read lock, a table cursor reads blocks with a read-ahead
//! that doubles up to 256 KiB, and a level opens its tables one at a time.
//! Memory is therefore bounded by the number of sources, whatever the
//! range's size.

use crate::blocks::BlockDevice;
use crate::error::Result;
use crate::memtable::Memtable;
use crate::sst::{internal_cmp, CursorSpec, Entry, EntryKind, RangeTombstone, TableCursor, TableReader};
use crate::version::{tombstone_seq, Version};
use std::cmp::Ordering;
use std::collections::VecDeque;
use std::sync::{Arc, RwLock};

/// Versions a memtable source copies out under one read lock.
const MEMTABLE_CHUNK_ENTRIES: usize = 256;

/// A memtable walked in chunks, so writers are never blocked for the
/// length of a scan. Versions written after the iterator was made have
/// sequences above its snapshot and are skipped by the caller.
pub struct MemSource {
    mem: Arc<RwLock<Memtable>>,
    keyspace: u32,
    spec: CursorSpec,
    buf: VecDeque<Entry>,
    after: Option<(Vec<u8>, u64)>,
    exhausted: bool,
}

impl MemSource {
    fn next(&mut self) -> Option<Entry> {
        if self.buf.is_empty() && !self.exhausted {
            let m = self.mem.read().unwrap_or_else(|p| p.into_inner());
            let n = m.chunk(
                self.keyspace,
                &self.spec.start,
                self.spec.end.as_deref(),
                self.spec.reverse,
                self.after.as_ref().map(|(k, s)| (k.as_slice(), *s)),
                MEMTABLE_CHUNK_ENTRIES,
                &mut self.buf,
            );
            drop(m);
            self.exhausted = n < MEMTABLE_CHUNK_ENTRIES;
            self.after = self.buf.back().map(|e| (e.key.clone(), e.seq));
        }
        self.buf.pop_front()
    }
}

/// A level ≥ 1: disjoint tables in walk order, opened one at a time.
pub struct LevelSource {
    tables: Vec<Arc<TableReader>>,
    next: usize,
    cursor: Option<TableCursor>,
    dev: BlockDevice,
    spec: CursorSpec,
}

impl LevelSource {
    /// `tables` in walk order (descending keys for a reverse spec). The
    /// first is opened at once so that its first read can join a batch.
    pub fn new(tables: Vec<Arc<TableReader>>, dev: &BlockDevice, spec: CursorSpec) -> Self {
        let cursor = tables.first().map(|t| t.cursor(dev, spec.clone()));
        LevelSource {
            tables,
            next: 1,
            cursor,
            dev: dev.clone(),
            spec,
        }
    }

    fn next(&mut self) -> Result<Option<Entry>> {
        loop {
            if let Some(c) = &mut self.cursor {
                if let Some(e) = c.next_entry()? {
                    return Ok(Some(e));
                }
            }
            let Some(t) = self.tables.get(self.next) else {
                self.cursor = None;
                return Ok(None);
            };
            self.next += 1;
            self.cursor = Some(t.cursor(&self.dev, self.spec.clone()));
        }
    }
}

/// One input of a merge.
pub enum Source {
    Mem(MemSource),
    Table(TableCursor),
    Level(LevelSource),
}

impl Source {
    fn next(&mut self) -> Result<Option<Entry>> {
        match self {
            Source::Mem(m) => Ok(m.next()),
            Source::Table(c) => c.next_entry(),
            Source::Level(l) => l.next(),
        }
    }

    fn first_cursor(&mut self) -> Option<&mut TableCursor> {
        match self {
            Source::Mem(_) => None,
            Source::Table(c) => Some(c),
            Source::Level(l) => l.cursor.as_mut(),
        }
    }
}

/// Every version from every source, in internal order (key ascending,
/// sequence descending) or, reversed, key descending and sequence
/// ascending.
pub struct MergeIter {
    dev: BlockDevice,
    sources: Vec<Source>,
    heads: Vec<Option<Entry>>,
    reverse: bool,
    primed: bool,
}

impl MergeIter {
    pub fn new(dev: &BlockDevice, sources: Vec<Source>, reverse: bool) -> Self {
        MergeIter {
            dev: dev.clone(),
            heads: Vec::with_capacity(sources.len()),
            sources,
            reverse,
            primed: false,
        }
    }

    /// Sends every table source's first read to the device in one batch,
    /// then takes each source's first entry.
    fn prime(&mut self) -> Result<()> {
        let wanted: Vec<(usize, (u64, usize))> = self
            .sources
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| s.first_cursor()?.first_read().map(|r| (i, r)))
            .collect();
        if wanted.len() > 1 {
            let runs: Vec<(u64, usize)> = wanted.iter().map(|(_, r)| *r).collect();
            let bytes = self.dev.read_runs(&runs)?;
            for ((i, _), b) in wanted.iter().zip(bytes) {
                self.sources[*i]
                    .first_cursor()
                    .expect("a table source")
                    .seed(&b)?;
            }
        }
        for s in &mut self.sources {
            self.heads.push(s.next()?);
        }
        self.primed = true;
        Ok(())
    }

    pub fn next_entry(&mut self) -> Result<Option<Entry>> {
        if !self.primed {
            self.prime()?;
        }
        let mut best: Option<usize> = None;
        for (i, head) in self.heads.iter().enumerate() {
            let Some(e) = head else { continue };
            let better = best.is_none_or(|b| {
                let h = self.heads[b].as_ref().expect("a head");
                let order = internal_cmp(&e.key, e.seq, &h.key, h.seq);
                order == if self.reverse { Ordering::Greater } else { Ordering::Less }
            });
            if better {
                best = Some(i);
            }
        }
        let Some(i) = best else { return Ok(None) };
        let next = self.sources[i].next()?;
        Ok(std::mem::replace(&mut self.heads[i], next))
    }
}

/// The sources of `keyspace` over the spec's range: memtables newest
/// first, then level 0, then one source per deeper level. Also the range
/// tombstones of every source.
pub fn sources(
    dev: &BlockDevice,
    memtables: &[Arc<RwLock<Memtable>>],
    version: &Version,
    keyspace: u32,
    spec: &CursorSpec,
) -> (Vec<Source>, Vec<RangeTombstone>) {
    let mut tombstones = Vec::new();
    let mut out = Vec::new();
    for m in memtables {
        tombstones.extend(m.read().unwrap_or_else(|p| p.into_inner()).range_tombstones(keyspace));
        out.push(Source::Mem(MemSource {
            mem: m.clone(),
            keyspace,
            spec: spec.clone(),
            buf: VecDeque::new(),
            after: None,
            exhausted: false,
        }));
    }
    let Some(levels) = version.levels(keyspace) else {
        return (out, tombstones);
    };
    let (start, end) = (spec.start.as_slice(), spec.end.as_deref());
    for t in levels.all() {
        tombstones.extend(t.reader.range_tombstones.iter().cloned());
    }
    for t in levels.level(0).iter().filter(|t| t.overlaps(start, end)) {
        out.push(Source::Table(t.reader.cursor(dev, spec.clone())));
    }
    for tables in levels.levels.iter().skip(1) {
        let first = tables.partition_point(|t| t.meta.largest.as_slice() < start);
        let last = end.map_or(tables.len(), |end| {
            tables.partition_point(|t| t.meta.smallest.as_slice() < end)
        });
        if first >= last {
            continue;
        }
        let mut walk: Vec<Arc<TableReader>> =
            tables[first..last].iter().map(|t| t.reader.clone()).collect();
        if spec.reverse {
            walk.reverse();
        }
        out.push(Source::Level(LevelSource::new(walk, dev, spec.clone())));
    }
    (out, tombstones)
}

/// Live pairs of one keyspace at one snapshot, in key order or reversed.
///
/// The iterator holds the version it started from: tables a compaction
/// replaces meanwhile keep their extents until it is dropped. An error
/// (a corrupt block, a failed read) is yielded once, then the iterator
/// ends.
pub struct StoreIter {
    merge: MergeIter,
    tombstones: Vec<RangeTombstone>,
    snapshot: u64,
    reverse: bool,
    /// Forward: the last key decided (its newest visible version was seen).
    decided: Vec<u8>,
    has_decided: bool,
    /// Reverse: the first version of the next key, read while finishing
    /// the previous key's versions.
    pending: Option<Entry>,
    _version: Arc<Version>,
    done: bool,
}

impl StoreIter {
    pub fn new(
        dev: &BlockDevice,
        memtables: &[Arc<RwLock<Memtable>>],
        version: Arc<Version>,
        keyspace: u32,
        spec: CursorSpec,
        snapshot: u64,
    ) -> Self {
        let empty = spec
            .end
            .as_deref()
            .is_some_and(|end| end <= spec.start.as_slice());
        let (sources, mut tombstones) = if empty {
            (Vec::new(), Vec::new())
        } else {
            sources(dev, memtables, &version, keyspace, &spec)
        };
        tombstones.retain(|t| t.seq <= snapshot);
        StoreIter {
            merge: MergeIter::new(dev, sources, spec.reverse),
            tombstones,
            snapshot,
            reverse: spec.reverse,
            decided: Vec::new(),
            has_decided: false,
            pending: None,
            _version: version,
            done: empty,
        }
    }

    fn live(&self, e: &Entry) -> bool {
        e.kind == EntryKind::Put && e.seq > tombstone_seq(&self.tombstones, &e.key, self.snapshot)
    }

    fn next_forward(&mut self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        while let Some(e) = self.merge.next_entry()? {
            if e.seq > self.snapshot || (self.has_decided && self.decided == e.key) {
                continue;
            }
            // Reuses the buffer: no allocation per key.
            self.decided.clone_from(&e.key);
            self.has_decided = true;
            if self.live(&e) {
                return Ok(Some((e.key, e.value)));
            }
        }
        Ok(None)
    }

    /// Reversed, a key's versions come oldest first: the visible one is the
    /// last at or below the snapshot before the key changes.
    fn next_reverse(&mut self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        loop {
            let first = match self.pending.take() {
                Some(e) => e,
                None => match self.merge.next_entry()? {
                    Some(e) => e,
                    None => return Ok(None),
                },
            };
            let mut visible = first.seq <= self.snapshot;
            let mut group = first;
            while let Some(e) = self.merge.next_entry()? {
                if e.key != group.key {
                    self.pending = Some(e);
                    break;
                }
                if e.seq <= self.snapshot || !visible {
                    visible = e.seq <= self.snapshot;
                    group = e;
                }
            }
            if visible && self.live(&group) {
                return Ok(Some((group.key, group.value)));
            }
        }
    }
}

impl Iterator for StoreIter {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let step = if self.reverse {
            self.next_reverse()
        } else {
            self.next_forward()
        };
        match step {
            Ok(Some(pair)) => Some(Ok(pair)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}
