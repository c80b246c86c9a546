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
use crate::memtable::{Memtable, RunStep, RunVisitor};
use crate::sst::{
    internal_cmp, CursorSpec, Entry, EntryKind, RangeTombstone, TableCursor, TableReader,
};
use crate::version::{tombstone_seq, Levels, Version};
use std::cell::RefCell;
use std::cmp::Ordering;
use std::sync::{Arc, RwLock};

/// Versions a memtable source copies out under one read lock: the first
/// chunk is small (a short scan copies little) unless the caller said how
/// many pairs it expects to take, later ones double. Each chunk searches
/// every sorted run of the memtable again for where it starts.
const MEMTABLE_FIRST_CHUNK_ENTRIES: usize = 8;
const MEMTABLE_MAX_CHUNK_ENTRIES: usize = 256;

/// Keys a direct run (see [`StoreIter::for_each_ref`]) reads under one
/// hold of a memtable's read lock: a writer waits for no more.
#[cfg(not(test))]
const DIRECT_RUN_KEYS_MAX: usize = 1024;
#[cfg(test)]
const DIRECT_RUN_KEYS_MAX: usize = 3;

/// Slot vectors a thread keeps from finished memtable sources, and the
/// bytes their buffers may hold in all: a short scan (LRANGE 0 99, a
/// hash's fields) then copies into buffers the last one grew instead of
/// allocating one key and one value per entry.
const SPARE_SLOT_VECS_MAX: usize = 2;
const SPARE_SLOT_BYTES_MAX: usize = 512 * 1024;

thread_local! {
    static SPARE_SLOTS: RefCell<Vec<Vec<Entry>>> = const { RefCell::new(Vec::new()) };
}

/// Slots for a new memtable source: a finished source's, if this thread
/// kept one.
fn take_spare_slots() -> Vec<Entry> {
    SPARE_SLOTS
        .try_with(|spare| spare.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Keeps `slots` for this thread's next memtable source, as many of them
/// as fit in [`SPARE_SLOT_BYTES_MAX`].
fn keep_spare_slots(mut slots: Vec<Entry>) {
    let mut held_bytes = 0usize;
    let keep = slots
        .iter()
        .take_while(|e| {
            held_bytes += e.held_bytes();
            held_bytes <= SPARE_SLOT_BYTES_MAX
        })
        .count();
    slots.truncate(keep);
    if slots.is_empty() {
        return;
    }
    for e in &mut slots {
        e.release_block();
    }
    // At thread exit the pool is gone: the slots are dropped.
    let _ = SPARE_SLOTS.try_with(|spare| {
        let mut spare = spare.borrow_mut();
        if spare.len() < SPARE_SLOT_VECS_MAX {
            spare.push(slots);
        }
    });
}

/// A memtable walked in chunks, so writers are never blocked for the
/// length of a scan. Versions written after the iterator was made have
/// sequences above its snapshot and are skipped by the caller. Chunks are
/// copied into slots whose buffers are reused.
pub struct MemSource {
    mem: Arc<RwLock<Memtable>>,
    keyspace: u32,
    spec: CursorSpec,
    slots: Vec<Entry>,
    /// Slots filled by the last chunk, and the next one to give.
    filled: usize,
    given: usize,
    /// The last version copied (where the next chunk starts after).
    after_key: Vec<u8>,
    after_seq: u64,
    started: bool,
    exhausted: bool,
    chunk_entries: usize,
}

impl MemSource {
    fn new(mem: Arc<RwLock<Memtable>>, keyspace: u32, spec: CursorSpec) -> Self {
        MemSource {
            mem,
            keyspace,
            slots: take_spare_slots(),
            filled: 0,
            given: 0,
            after_key: Vec::new(),
            after_seq: 0,
            started: false,
            exhausted: false,
            // One more than expected: the chunk that reaches the range's
            // end then holds every pair the caller takes.
            chunk_entries: (spec.expected_entries.saturating_add(1))
                .clamp(MEMTABLE_FIRST_CHUNK_ENTRIES, MEMTABLE_MAX_CHUNK_ENTRIES),
            spec,
        }
    }

    fn refill(&mut self) {
        let m = self.mem.read().unwrap_or_else(|p| p.into_inner());
        let after = self
            .started
            .then_some((self.after_key.as_slice(), self.after_seq));
        let slots = &mut self.slots;
        let mut filled = 0;
        let n = m.chunk(
            self.keyspace,
            &self.spec.start,
            self.spec.end.as_deref(),
            self.spec.reverse,
            after,
            self.chunk_entries,
            &mut |key, seq, kind, value| {
                if filled == slots.len() {
                    slots.push(Entry::empty());
                }
                let e = &mut slots[filled];
                e.key.clear();
                e.key.extend_from_slice(key);
                e.set_value(value);
                (e.seq, e.kind) = (seq, kind);
                filled += 1;
            },
        );
        drop(m);
        (self.filled, self.given) = (filled, 0);
        self.exhausted = n < self.chunk_entries;
        self.chunk_entries = (self.chunk_entries * 2).min(MEMTABLE_MAX_CHUNK_ENTRIES);
        if let Some(last) = self.slots[..filled].last() {
            self.after_key.clone_from(&last.key);
            self.after_seq = last.seq;
            self.started = true;
        }
    }

    fn next_into(&mut self, out: &mut Entry) -> bool {
        if self.given == self.filled && !self.exhausted {
            self.refill();
        }
        if self.given == self.filled {
            return false;
        }
        // The caller's old buffers go into the slot for the next chunk.
        std::mem::swap(out, &mut self.slots[self.given]);
        self.given += 1;
        true
    }
}

impl MemSource {
    /// The key of the next version it gives, where a chunk holds it.
    fn next_key(&self) -> Option<&[u8]> {
        self.slots[..self.filled]
            .get(self.given)
            .map(|e| e.key.as_slice())
    }

    /// [`Memtable::visible_run`] over the keys after `after`, before `bound`
    /// and the source's own end, under one hold of the read lock: how many
    /// keys it looked at, and whether it went to the source's own end
    /// (its end was the run's, nothing refused, nothing left for a next
    /// hold).
    fn visible_run(
        &self,
        after: &[u8],
        bound: Option<&[u8]>,
        snapshot: u64,
        last_key: &mut Vec<u8>,
        visit: &mut RunVisitor<'_>,
    ) -> (usize, bool) {
        let own_end = self.spec.end.as_deref();
        let ends_own = match (own_end, bound) {
            (_, None) => true,
            (Some(own), Some(bound)) => own <= bound,
            (None, Some(_)) => false,
        };
        let end = if ends_own { own_end } else { bound };
        let mut refused = false;
        let m = self.mem.read().unwrap_or_else(|p| p.into_inner());
        let looked = m.visible_run(
            self.keyspace,
            after,
            end,
            snapshot,
            DIRECT_RUN_KEYS_MAX,
            last_key,
            &mut |key, seq, kind, value| {
                let step = visit(key, seq, kind, value);
                refused |= step == RunStep::Refused;
                step
            },
        );
        (looked, ends_own && !refused && looked < DIRECT_RUN_KEYS_MAX)
    }

    /// Ends the source: a direct run read the rest of it.
    fn finish(&mut self) {
        (self.filled, self.given) = (0, 0);
        self.exhausted = true;
    }

    /// Goes on past every version of `key` (read outside the source): its
    /// next chunk starts there, one version long, as a direct run is
    /// likely to read on from it.
    fn resume_past(&mut self, key: &[u8]) {
        self.after_key.clear();
        self.after_key.extend_from_slice(key);
        // Nothing of `key` comes after sequence 0 in internal order.
        self.after_seq = 0;
        self.started = true;
        (self.filled, self.given) = (0, 0);
        self.exhausted = false;
        self.chunk_entries = 1;
    }
}

impl Drop for MemSource {
    fn drop(&mut self) {
        keep_spare_slots(std::mem::take(&mut self.slots));
    }
}

/// The tables a level source walks, in walk order.
pub enum TableList {
    /// Tables `lo..hi` of one level of a version (walked from `hi - 1`
    /// down when reversed): nothing is copied per scan.
    Level {
        /// The version holding the tables.
        version: Arc<Version>,
        /// The keyspace.
        keyspace: u32,
        /// The level.
        level: usize,
        /// First table index.
        lo: usize,
        /// One past the last table index.
        hi: usize,
        /// Walked from the last down.
        reverse: bool,
    },
    /// Tables given as a list (walked in its order).
    Owned(Vec<Arc<TableReader>>),
}

impl TableList {
    fn get(&self, k: usize) -> Option<&Arc<TableReader>> {
        match self {
            TableList::Level {
                version,
                keyspace,
                level,
                lo,
                hi,
                reverse,
            } => {
                if k >= hi - lo {
                    return None;
                }
                let i = if *reverse { hi - 1 - k } else { lo + k };
                let tables = version.levels(*keyspace)?.level(*level);
                tables.get(i).map(|t| &t.reader)
            }
            TableList::Owned(v) => v.get(k),
        }
    }
}

/// A level ≥ 1: disjoint tables in walk order, opened one at a time.
pub struct LevelSource {
    tables: TableList,
    next: usize,
    cursor: Option<TableCursor>,
    dev: BlockDevice,
    spec: CursorSpec,
}

impl LevelSource {
    /// The first table is opened at once so that its first read can join
    /// a batch.
    pub fn new(tables: TableList, dev: &BlockDevice, spec: CursorSpec) -> Result<Self> {
        let cursor = tables
            .get(0)
            .map(|t| t.cursor(dev, spec.clone()))
            .transpose()?;
        Ok(LevelSource {
            tables,
            next: 1,
            cursor,
            dev: dev.clone(),
            spec,
        })
    }

    fn next_into(&mut self, out: &mut Entry) -> Result<bool> {
        loop {
            if let Some(c) = &mut self.cursor {
                if c.next_into(out)? {
                    return Ok(true);
                }
            }
            let Some(t) = self.tables.get(self.next) else {
                self.cursor = None;
                return Ok(false);
            };
            self.next += 1;
            // Later tables start without a size hint: the range has
            // already run longer than expected.
            let spec = CursorSpec {
                expected_entries: 0,
                ..self.spec.clone()
            };
            self.cursor = Some(t.cursor(&self.dev, spec)?);
        }
    }
}

/// One input of a merge.
pub enum Source {
    /// A memtable.
    Mem(MemSource),
    /// One table.
    Table(TableCursor),
    /// The tables of one level, opened one at a time.
    Level(LevelSource),
}

impl Source {
    /// Decodes the source's next entry into `out`; false at its end.
    fn next_into(&mut self, out: &mut Entry) -> Result<bool> {
        match self {
            Source::Mem(m) => Ok(m.next_into(out)),
            Source::Table(c) => c.next_into(out),
            Source::Level(l) => l.next_into(out),
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
/// ascending. Each source decodes into its own head entry, whose buffers
/// are reused: walking allocates nothing once they have grown.
///
/// The sources with a head are kept in a binary heap by it: a step
/// compares about 2·log2(sources) heads, and two while one source's
/// entries come before every other's (a range written since the last
/// flush, all in the newest memtable).
pub struct MergeIter {
    dev: BlockDevice,
    sources: Vec<Source>,
    heads: Vec<Entry>,
    /// The sources with a head, in heap order: each one's head comes
    /// before its children's (at 2i+1, 2i+2); the first is the next.
    heap: Vec<usize>,
    /// The source whose head was handed out last (the heap's first):
    /// advanced first.
    current: Option<usize>,
    reverse: bool,
    primed: bool,
}

impl MergeIter {
    /// A merging iterator over `sources` (newest first where keys tie).
    pub fn new(dev: &BlockDevice, sources: Vec<Source>, reverse: bool) -> Self {
        MergeIter {
            dev: dev.clone(),
            heads: (0..sources.len()).map(|_| Entry::empty()).collect(),
            heap: Vec::with_capacity(sources.len()),
            sources,
            current: None,
            reverse,
            primed: false,
        }
    }

    /// Sends every table source's first read to the device in one batch,
    /// then takes each source's first entry.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a table source"
    )]
    fn prime(&mut self) -> Result<()> {
        let wanted: Vec<(usize, (u64, usize))> = self
            .sources
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| {
                let cursor = s.first_cursor()?;
                if cursor.first_from_cache() {
                    return None;
                }
                cursor.first_read().map(|r| (i, r))
            })
            .collect();
        if wanted.len() > 1 {
            let runs: Vec<(u64, usize)> = wanted.iter().map(|(_, r)| *r).collect();
            let sources = &mut self.sources;
            self.dev.visit_runs(&runs, &mut |run, bytes| {
                sources[wanted[run].0]
                    .first_cursor()
                    .expect("a table source")
                    .seed(bytes)
            })?;
        }
        for (i, s) in self.sources.iter_mut().enumerate() {
            if s.next_into(&mut self.heads[i])? {
                self.heap.push(i);
            }
        }
        for at in (0..self.heap.len() / 2).rev() {
            self.sift_down(at);
        }
        self.primed = true;
        Ok(())
    }

    /// Whether source `a`'s head comes before source `b`'s.
    fn comes_first(&self, a: usize, b: usize) -> bool {
        head_first(&self.heads, self.reverse, a, b)
    }

    /// Moves the source at heap place `at` down to where its head comes
    /// before its children's.
    fn sift_down(&mut self, at: usize) {
        let MergeIter {
            heap,
            heads,
            reverse,
            ..
        } = self;
        crate::heap::sift_down(heap, at, |a, b| head_first(heads, *reverse, a, b));
    }

    /// The version the last `next_entry` returned.
    pub fn current(&self) -> Option<&Entry> {
        self.current.map(|i| &self.heads[i])
    }

    /// The next version in merge order; valid until the next call.
    pub fn next_entry(&mut self) -> Result<Option<&Entry>> {
        if !self.primed {
            self.prime()?;
        } else {
            self.advance_current()?;
        }
        self.current = self.heap.first().copied();
        Ok(self.current.map(|i| &self.heads[i]))
    }

    /// Takes the next head of the source whose head was handed out last.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: the heap holds the source"
    )]
    fn advance_current(&mut self) -> Result<()> {
        let Some(i) = self.current.take() else {
            return Ok(());
        };
        debug_assert_eq!(self.heap.first(), Some(&i));
        if !self.sources[i].next_into(&mut self.heads[i])? {
            // Its end: the heap's last takes its place.
            let last = self.heap.pop().expect("the heap holds the source");
            if let Some(first) = self.heap.first_mut() {
                *first = last;
            }
        }
        self.sift_down(0);
        Ok(())
    }

    /// The source whose head comes next after the first's: the first's
    /// child that comes first.
    fn runner_up(&self) -> Option<usize> {
        match (self.heap.get(1), self.heap.get(2)) {
            (Some(&a), Some(&b)) if self.comes_first(b, a) => Some(b),
            (Some(&a), _) => Some(a),
            _ => None,
        }
    }

    /// Has every memtable source read one version in its first chunk, not
    /// as many as the caller expects: a direct run reads on in place.
    fn first_chunks_of_one(&mut self) {
        if self.primed {
            return;
        }
        for source in &mut self.sources {
            if let Source::Mem(m) = source {
                m.chunk_entries = 1;
            }
        }
    }
}

/// Whether source `a`'s head comes before source `b`'s: in merge order,
/// and where they tie, the newer source (the lower index).
#[inline]
fn head_first(heads: &[Entry], reverse: bool, a: usize, b: usize) -> bool {
    let (x, y) = (&heads[a], &heads[b]);
    match internal_cmp(&x.key, x.seq, &y.key, y.seq) {
        Ordering::Equal => a < b,
        Ordering::Less => !reverse,
        Ordering::Greater => reverse,
    }
}

/// The sources of `keyspace` over the spec's range: memtables newest
/// first, then level 0, then one source per deeper level. Also the range
/// tombstones of every source.
pub fn sources(
    dev: &BlockDevice,
    memtables: &[Arc<RwLock<Memtable>>],
    version: &Arc<Version>,
    keyspace: u32,
    spec: &CursorSpec,
) -> Result<(Vec<Source>, Vec<RangeTombstone>)> {
    let mut tombstones = Vec::new();
    let mut out = Vec::new();
    for m in memtables {
        tombstones.extend(
            m.read()
                .unwrap_or_else(|p| p.into_inner())
                .range_tombstones(keyspace),
        );
        out.push(Source::Mem(MemSource::new(
            m.clone(),
            keyspace,
            spec.clone(),
        )));
    }
    let Some(levels) = version.levels(keyspace) else {
        return Ok((out, tombstones));
    };
    let (start, end) = (spec.start.as_slice(), spec.end.as_deref());
    for t in levels.all() {
        tombstones.extend(t.reader.range_tombstones.iter().cloned());
    }
    // A limited scan takes from each source about its share of the data;
    // half as much again covers uneven spread.
    let total_entries: u64 = levels.all().map(|t| t.reader.entries).sum::<u64>().max(1);
    let fill_cache = spec.fill_cache && !floods_cache(levels, start, end, spec);
    let share = |entries: u64| CursorSpec {
        fill_cache,
        expected_entries: match spec.expected_entries {
            0 => 0,
            n => (n as u64).saturating_mul(entries).saturating_mul(3) / (2 * total_entries) + 1,
        } as usize,
        ..spec.clone()
    };
    for t in levels.level(0).iter().filter(|t| t.overlaps(start, end)) {
        out.push(Source::Table(
            t.reader.cursor(dev, share(t.reader.entries))?,
        ));
    }
    for (level, tables) in levels.levels.iter().enumerate().skip(1) {
        let lo = tables.partition_point(|t| t.meta.largest.as_slice() < start);
        let hi = end.map_or(tables.len(), |end| {
            tables.partition_point(|t| t.meta.smallest.as_slice() < end)
        });
        if lo >= hi {
            continue;
        }
        let level_entries = tables.iter().map(|t| t.reader.entries).sum();
        let walk = TableList::Level {
            version: version.clone(),
            keyspace,
            level,
            lo,
            hi,
            reverse: spec.reverse,
        };
        out.push(Source::Level(LevelSource::new(
            walk,
            dev,
            share(level_entries),
        )?));
    }
    Ok((out, tombstones))
}

/// Whether an unlimited scan of `[start, end)` reads more than half of
/// what the block cache holds: filling the cache with it would evict its
/// own blocks (and the blocks point reads use) before any is read again.
fn floods_cache(levels: &Levels, start: &[u8], end: Option<&[u8]>, spec: &CursorSpec) -> bool {
    if spec.expected_entries != 0 {
        return false;
    }
    let Some(capacity) = levels.all().next().map(|t| t.reader.cache_capacity_bytes()) else {
        return false;
    };
    let range_bytes: u64 = levels
        .all()
        .filter(|t| t.overlaps(start, end))
        .map(|t| t.data_bytes())
        .sum();
    range_bytes > capacity as u64 / 2
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
    /// the previous key's versions, and the key being decided.
    pending: Entry,
    has_pending: bool,
    group: Entry,
    /// The value of the last pair when it lies in a blob file.
    blob_value: bytes::Bytes,
    version: Arc<Version>,
    failed: Option<crate::error::StoreError>,
    done: bool,
}

impl StoreIter {
    /// A source walking `tables` over a key range.
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
        // A table whose index cannot be read fails the first step.
        let (sources, mut tombstones, failed) = if empty {
            (Vec::new(), Vec::new(), None)
        } else {
            match sources(dev, memtables, &version, keyspace, &spec) {
                Ok((s, t)) => (s, t, None),
                Err(e) => (Vec::new(), Vec::new(), Some(e)),
            }
        };
        tombstones.retain(|t| t.seq <= snapshot);
        StoreIter {
            merge: MergeIter::new(dev, sources, spec.reverse),
            tombstones,
            snapshot,
            reverse: spec.reverse,
            decided: Vec::new(),
            has_decided: false,
            pending: Entry::empty(),
            has_pending: false,
            group: Entry::empty(),
            blob_value: bytes::Bytes::new(),
            version,
            failed,
            done: empty,
        }
    }

    /// Advances to the next live pair, left in the merge's current head.
    fn advance_forward(&mut self) -> Result<bool> {
        while let Some(e) = self.merge.next_entry()? {
            if e.seq > self.snapshot || (self.has_decided && same_key(&self.decided, &e.key)) {
                continue;
            }
            // Reuses the buffer: no allocation per key.
            self.decided.clone_from(&e.key);
            self.has_decided = true;
            if live(&self.tombstones, self.snapshot, e) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Reversed, a key's versions come oldest first: the visible one is the
    /// last at or below the snapshot before the key changes.
    /// Advances to the next live pair, left in `self.group`.
    fn advance_reverse(&mut self) -> Result<bool> {
        loop {
            if !self.has_pending {
                match self.merge.next_entry()? {
                    Some(e) => self.pending.clone_from(e),
                    None => return Ok(false),
                }
            }
            self.has_pending = false;
            let mut visible = self.pending.seq <= self.snapshot;
            self.group.clone_from(&self.pending);
            while let Some(e) = self.merge.next_entry()? {
                if e.key != self.group.key {
                    self.pending.clone_from(e);
                    self.has_pending = true;
                    break;
                }
                if e.seq <= self.snapshot || !visible {
                    visible = e.seq <= self.snapshot;
                    self.group.clone_from(e);
                }
            }
            if visible && live(&self.tombstones, self.snapshot, &self.group) {
                return Ok(true);
            }
        }
    }
}

/// Whether two keys are equal, their last bytes looked at first: the keys
/// of one collection's members mostly differ there (a list's item index),
/// and most versions a walk meets are of another key than the last.
#[inline]
fn same_key(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.last() == b.last() && a == b
}

/// Whether a version is a put no range tombstone visible at `snapshot` hides.
fn live(tombstones: &[RangeTombstone], snapshot: u64, e: &Entry) -> bool {
    e.kind.is_value() && e.seq > tombstone_seq(tombstones, &e.key, snapshot)
}

impl StoreIter {
    /// The next live pair, borrowed from the iterator's own buffers (valid
    /// until the next call): no allocation or copy per pair, for operators
    /// that look at every pair and keep few. An error is returned once,
    /// then the iterator ends.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a live pair in the current head"
    )]
    pub fn next_ref(&mut self) -> Result<Option<(&[u8], &[u8])>> {
        if let Some(e) = self.failed.take() {
            self.done = true;
            return Err(e);
        }
        if self.done {
            return Ok(None);
        }
        let step = if self.reverse {
            self.advance_reverse()
        } else {
            self.advance_forward()
        };
        match step {
            Ok(true) => {}
            Ok(false) => {
                self.done = true;
                return Ok(None);
            }
            Err(e) => {
                self.done = true;
                return Err(e);
            }
        }
        let e = if self.reverse {
            &self.group
        } else {
            self.merge
                .current()
                .expect("a live pair in the current head")
        };
        if e.kind == EntryKind::Blob {
            let read = self
                .version
                .blob(e.value())
                .and_then(|(file, r)| file.read_value(&self.merge.dev, &r));
            match read {
                Ok(value) => self.blob_value = value,
                Err(err) => {
                    self.done = true;
                    return Err(err);
                }
            }
            return Ok(Some((&e.key, &self.blob_value)));
        }
        Ok(Some((&e.key, e.value())))
    }
}

impl StoreIter {
    /// Hands `visit` each live pair [`StoreIter::next_ref`] would give,
    /// until it returns false or the range ends; the iterator ends there.
    ///
    /// Forward, where the range's next stretch lies in one memtable alone
    /// (every other source's next key is further), its pairs are visited
    /// where the memtable holds them, under its read lock, up to
    /// 1,024 keys at a time: no copy of each out of the
    /// memtable and no merge step (a list's items pushed since the last
    /// flush, read by LRANGE). `visit` may then run under that read lock:
    /// it must not read or write the store (a second read lock of one
    /// thread can wait behind a writer that waits for the first).
    pub fn for_each_ref(&mut self, mut visit: impl FnMut(&[u8], &[u8]) -> bool) -> Result<()> {
        if !self.reverse {
            self.merge.first_chunks_of_one();
        }
        loop {
            let Some((key, value)) = self.next_ref()? else {
                return Ok(());
            };
            if !visit(key, value) || (!self.reverse && !self.direct_runs(&mut visit)) {
                self.done = true;
                return Ok(());
            }
        }
    }

    /// Direct runs from the memtable whose version was handed out last,
    /// while it holds the next keys alone; false if `visit` said to stop.
    fn direct_runs(&mut self, visit: &mut impl FnMut(&[u8], &[u8]) -> bool) -> bool {
        let StoreIter {
            merge,
            tombstones,
            snapshot,
            decided,
            ..
        } = self;
        let Some(i) = merge.current else {
            return true;
        };
        let rival = merge.runner_up();
        let MergeIter { sources, heads, .. } = merge;
        let Source::Mem(m) = &mut sources[i] else {
            return true;
        };
        if m.given == m.filled && m.exhausted {
            return true;
        }
        let rival_key = rival.map(|r| heads[r].key.as_slice());
        if let (Some(next), Some(rival_key)) = (m.next_key(), rival_key) {
            if next >= rival_key {
                // The merge takes the rival's next: no run here.
                return true;
            }
        }
        // Every version of the key handed out last is done with: the
        // newest visible one was given, the others are older.
        debug_assert!(*decided == heads[i].key);
        let mut stopped = false;
        let (looked, to_its_end) = m.visible_run(
            &heads[i].key,
            rival_key,
            *snapshot,
            decided,
            &mut |key, seq, kind, value| {
                if kind == EntryKind::Blob {
                    return RunStep::Refused;
                }
                if seq <= tombstone_seq(tombstones, key, *snapshot) {
                    return RunStep::Passed;
                }
                if visit(key, value) {
                    RunStep::Taken
                } else {
                    stopped = true;
                    RunStep::TakenLast
                }
            },
        );
        if stopped {
            return false;
        }
        if to_its_end {
            // No refill to learn it has nothing more.
            m.finish();
        } else if looked > 0 {
            // The memtable goes on past the last key the run looked at
            // (left in `decided`); the merge's next step takes its next
            // version there, as the source is still the one handed out.
            m.resume_past(decided);
        }
        true
    }
}

impl Iterator for StoreIter {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_ref() {
            Ok(Some((k, v))) => Some(Ok((k.to_vec(), v.to_vec()))),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Store, StoreConfig};
    use sluice_io::{Device, MemoryDevice};
    use std::ops::Bound;
    use std::sync::Arc;

    fn key(i: u32) -> Vec<u8> {
        format!("k{i:04}").into_bytes()
    }

    /// Direct runs of a few keys at a time (three under test), each
    /// resumed after the last: every pair `for_each_ref` visits is the
    /// scan's, at an old snapshot and the latest, stopped anywhere, over
    /// a memtable interleaved with a table, overwrites and deletions.
    #[test]
    fn visits_in_short_direct_runs_match_the_scan() {
        let mem = Arc::new(MemoryDevice::new(4096, 16384));
        let config = StoreConfig {
            wal_blocks: 2048,
            ..StoreConfig::default()
        };
        let store = Store::create(mem as Arc<dyn Device>, &config).unwrap();
        let ks = store.keyspace("default").unwrap();
        for i in (0..120).step_by(3) {
            store.put(ks, &key(i), b"table").unwrap();
        }
        store.flush().unwrap();
        for i in 0..120 {
            store.put(ks, &key(i), format!("v{i}").as_bytes()).unwrap();
        }
        let old = store.snapshot();
        for i in (0..120).step_by(7) {
            store.delete(ks, &key(i)).unwrap();
        }
        store.delete_range(ks, &key(50), &key(60)).unwrap();
        for i in 200..260 {
            store.put(ks, &key(i), b"late").unwrap();
        }
        for snapshot in [old, store.snapshot()] {
            for (lo, hi) in [(0, 300), (1, 119), (40, 70), (100, 230)] {
                let range = (Bound::Included(&key(lo)[..]), Bound::Excluded(&key(hi)[..]));
                let want = store.scan(ks, range, &snapshot, false, usize::MAX).unwrap();
                for stop in [1, 2, 5, 17, usize::MAX] {
                    let mut got = Vec::new();
                    let mut it = store.iter_expecting(ks, range, &snapshot, false, 0);
                    it.for_each_ref(|k, v| {
                        got.push((k.to_vec(), v.to_vec()));
                        got.len() < stop
                    })
                    .unwrap();
                    assert_eq!(got, want[..want.len().min(stop)], "{lo}..{hi} stop {stop}");
                }
            }
        }
    }
}
