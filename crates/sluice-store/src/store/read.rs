//! Reads: snapshots, point reads, iterators and scans over the memtables
//! and the tables of one version.

use super::recent;
use super::*;

#[derive(Debug, Default)]
pub(super) struct SnapshotRegistry {
    pub(super) live: Mutex<BTreeMap<u64, usize>>,
}

/// A point in the store's history; reads through it see exactly the writes
/// acknowledged before it was taken, whatever flushes and compactions do
/// meanwhile. Dropping it lets compaction discard what only it could see.
#[derive(Debug)]
pub struct Snapshot {
    seq: u64,
    registry: Arc<SnapshotRegistry>,
}

/// Keys [`Store::get_each_at`] looks up under one hold of the memtables'
/// read locks.
const EACH_KEYS_PER_LOCK: usize = 64;

/// How many keys ahead [`Store::get_each_at`] asks for a memtable slot.
const EACH_PREFETCH_AHEAD: usize = 4;

impl Snapshot {
    /// The sequence of the last write it sees.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

impl Clone for Snapshot {
    /// The same view, registered once more (each copy is released on drop).
    fn clone(&self) -> Self {
        let mut live = lock(&self.registry.live);
        *live.entry(self.seq).or_insert(0) += 1;
        drop(live);
        Snapshot {
            seq: self.seq,
            registry: self.registry.clone(),
        }
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

impl Store {
    /// A snapshot of every write acknowledged so far.
    pub fn snapshot(&self) -> Snapshot {
        // The sequence is read under the registry's lock: a flush or
        // compaction that reads the registry either sees this snapshot or
        // runs before its sequence is read (which then covers everything
        // they keep only the newest of).
        let mut live = lock(&self.inner.snapshots.live);
        let seq = self.inner.visible_seq.get();
        *live.entry(seq).or_insert(0) += 1;
        drop(live);
        Snapshot {
            seq,
            registry: self.inner.snapshots.clone(),
        }
    }

    /// The memtables and tables a read sees, taken consistently: the
    /// frozen memtable stays until its tables are in the version.
    pub(super) fn read_view(&self) -> (Vec<Arc<RwLock<Memtable>>>, Arc<Version>) {
        let mem = read(&self.inner.memtables);
        let version = read(&self.inner.version).clone();
        let mut mems = vec![mem.active.clone()];
        mems.extend(mem.frozen.clone());
        (mems, version)
    }

    /// The key's latest value, or None.
    pub fn get(&self, keyspace: u32, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.get_at(keyspace, key, &self.snapshot())
    }

    /// The key's latest value, read without registering a snapshot: for a
    /// single point read (a server's GET), where the snapshot's bookkeeping
    /// would cost more than the read. The sequence is read between two
    /// reads of the view generation ([`Store::get_latest_cached`] says
    /// why that is enough), and the view holds its tables, which
    /// compaction cannot free meanwhile.
    pub fn get_latest(&self, keyspace: u32, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.get_latest_with(keyspace, key, |v| v.map(|v| v.bytes().to_vec()))
    }

    /// [`Store::get_latest`] with the value borrowed where it lies (the
    /// memtable or the cached block): `f` sees it (None: no live value)
    /// and its result is returned, so a server can copy a value once,
    /// straight into its reply. `f` runs under the memtables' read locks:
    /// it should be short.
    pub fn get_latest_with<R>(
        &self,
        keyspace: u32,
        key: &[u8],
        f: impl FnOnce(Option<Found<'_>>) -> R,
    ) -> Result<R> {
        self.get_latest_cached(&mut ReadCache::default(), keyspace, key, f)
    }

    /// [`Store::get_latest_with`] for a thread that reads often: the
    /// memtables and version it reads from are kept in `cache` and taken
    /// again only when the store changed them, so a read takes no lock but
    /// the memtables' own.
    pub fn get_latest_cached<R>(
        &self,
        cache: &mut ReadCache,
        keyspace: u32,
        key: &[u8],
        f: impl FnOnce(Option<Found<'_>>) -> R,
    ) -> Result<R> {
        let answered = self.get_latest_or_miss(cache, keyspace, key, true, f)?;
        Ok(answered.unwrap_or_else(|_| unreachable!("a read that may wait never misses")))
    }

    /// Asks the memory for what a read of `key` through `cache` will look
    /// at first (its slot in each memtable's index), without waiting: a
    /// server calls it for the reads queued a few requests ahead, so that
    /// their cache misses overlap the work between. A hint only: nothing
    /// is read, and with no view cached yet it does nothing.
    pub fn prefetch_latest(&self, cache: &ReadCache, keyspace: u32, key: &[u8]) {
        let Some(view) = &cache.view else {
            return;
        };
        read(&view.active).prefetch_point(keyspace, key);
        if let Some(frozen) = &view.frozen {
            read(frozen).prefetch_point(keyspace, key);
        }
    }

    /// [`Store::get_latest_cached`] for a thread that must not wait for
    /// the device (a server worker with other clients to serve): with
    /// `wait` false, a read that needs an index or block no cache holds
    /// returns it instead of reading it (`f` is not called). Hand it to a
    /// [`FillQueue`], go on with other work, and ask again once the queue
    /// reports it read.
    pub fn get_latest_or_miss<R>(
        &self,
        cache: &mut ReadCache,
        keyspace: u32,
        key: &[u8],
        wait: bool,
        f: impl FnOnce(Option<Found<'_>>) -> R,
    ) -> Result<std::result::Result<R, CacheMiss>> {
        if let Some(found) = cache.recent.get(self.stamp(), keyspace, key) {
            return Ok(Ok(f(found)));
        }
        loop {
            // The sequence between two reads of the view generation: if
            // both match the cached view's, no memtable was replaced and
            // no table installed while it was read, so (1) every write at
            // or below it went to a memtable the view holds (a replaced
            // memtable bumps the generation before it takes writes, under
            // the lock those writes pass), and (2) the view's tables were
            // installed when everything they hold was visible: the newest
            // version of each key in them, the one a flush or compaction
            // always keeps, is at or below the sequence.
            let before = self.inner.view_generation.load(Ordering::Acquire);
            let seq = self.inner.visible_seq.get();
            let generation = self.inner.view_generation.load(Ordering::Acquire);
            let view = match &cache.view {
                Some(view) if view.generation == generation && before == generation => view,
                _ => {
                    // Taken after the generation was read: at least as new.
                    let mem = read(&self.inner.memtables);
                    cache.view = Some(CachedView {
                        generation,
                        active: mem.active.clone(),
                        frozen: mem.frozen.clone(),
                        version: read(&self.inner.version).clone(),
                    });
                    continue;
                }
            };
            let active_guard = read(&view.active);
            let frozen = view.frozen.as_ref().map(|f| read(f));
            let active: &Memtable = &active_guard;
            let both;
            let one = [active];
            let mems: &[&Memtable] = match &frozen {
                Some(f) => {
                    both = [active, &**f];
                    &both
                }
                None => &one,
            };
            let answered = version::get_or_miss(
                &self.inner.dev,
                mems,
                &view.version,
                keyspace,
                key,
                seq,
                wait,
                f,
            )?;
            drop(frozen);
            drop(active_guard);
            return match answered {
                Ok(r) => Ok(Ok(r)),
                Err(version::Pending::Miss(miss)) => Ok(Err(miss)),
                // Read with no lock held, waiting even for a caller that
                // may not wait: a blob is a value of its own, read whole.
                Err(version::Pending::Blob { file, reference, f }) => {
                    let value = file.read_value(&self.inner.dev, &reference)?;
                    Ok(Ok(f(Some(Found::in_blob(&value)))))
                }
            };
        }
    }

    /// [`Store::get_latest_or_miss`] without waiting, and when the answer
    /// was in memory, remembered in `cache` until the store's next write:
    /// a read of `key` through `cache` before then answers from there. For
    /// a server that checks what a command will read before it queues the
    /// command: the command's own read then costs a lookup.
    pub fn get_latest_remembered<R>(
        &self,
        cache: &mut ReadCache,
        keyspace: u32,
        key: &[u8],
        f: impl FnOnce(Option<Found<'_>>) -> R,
    ) -> Result<std::result::Result<R, CacheMiss>> {
        // Taken before the read: an answer is remembered under a stamp at
        // or before the one it was read at, so a write (or a new view)
        // between the two can only make it forgotten early.
        let stamp = self.stamp();
        let answered = self.get_latest_or_miss(cache, keyspace, key, false, |found| {
            let kept = match found {
                Some(v) if v.bytes().len() > recent::RECENT_VALUE_MAX_BYTES => None,
                Some(v) => Some(Some(v.keep())),
                None => Some(None),
            };
            (kept, f(found))
        })?;
        Ok(answered.map(|(kept, r)| {
            if let Some(value) = kept {
                cache.recent.remember(stamp, keyspace, key, value);
            }
            r
        }))
    }

    /// The store's visible sequence and view generation now.
    fn stamp(&self) -> recent::Stamp {
        let generation = self.inner.view_generation.load(Ordering::Acquire);
        recent::Stamp {
            seq: self.inner.visible_seq.get(),
            generation,
        }
    }

    /// The key's value as of `snapshot`.
    pub fn get_at(
        &self,
        keyspace: u32,
        key: &[u8],
        snapshot: &Snapshot,
    ) -> Result<Option<Vec<u8>>> {
        let (mems, version) = self.read_view();
        let guards: Vec<_> = mems.iter().map(|m| read(m)).collect();
        let refs: Vec<&Memtable> = guards.iter().map(|g| &**g).collect();
        let answered = version::get_or_miss(
            &self.inner.dev,
            &refs,
            &version,
            keyspace,
            key,
            snapshot.seq,
            true,
            |v| v.map(|v| v.bytes().to_vec()),
        )?;
        drop(refs);
        drop(guards);
        match answered {
            Ok(value) => Ok(value),
            Err(version::Pending::Blob {
                file, reference, ..
            }) => {
                let value = file.read_value(&self.inner.dev, &reference)?;
                Ok(Some(Vec::from(value)))
            }
            Err(version::Pending::Miss(_)) => unreachable!("a read that may wait never misses"),
        }
    }

    /// Each of `keys`' values as of `snapshot`, shown to `visit` with the
    /// key's place in `keys` (None: no live value), without copying them
    /// out: one view of the memtables and tables for the run, and each
    /// key's memtable slot asked for a few keys ahead, so that a set's
    /// members checked one after another (SADD's) do not wait for the
    /// memory one by one. The memtables' read locks are let go every
    /// [`EACH_KEYS_PER_LOCK`] keys, and never held across a device read:
    /// a key whose index or block is in no cache, or whose value is in a
    /// blob file, is read after the others of its run, as
    /// [`Store::get_at`] reads it (so in no promised order).
    pub fn get_each_at(
        &self,
        keyspace: u32,
        keys: &[&[u8]],
        snapshot: &Snapshot,
        mut visit: impl FnMut(usize, Option<&[u8]>),
    ) -> Result<()> {
        let (mems, version) = self.read_view();
        for (run_no, run) in keys.chunks(EACH_KEYS_PER_LOCK).enumerate() {
            let guards: Vec<_> = mems.iter().map(|m| read(m)).collect();
            let refs: Vec<&Memtable> = guards.iter().map(|g| &**g).collect();
            let prefetch = |key: &[u8]| {
                for m in &refs {
                    m.prefetch_point(keyspace, key);
                }
            };
            for key in run.iter().take(EACH_PREFETCH_AHEAD) {
                prefetch(key);
            }
            // Blob values, and keys that need a device read, are read
            // once the locks are let go.
            let mut blobs = Vec::new();
            let mut missed = Vec::new();
            for (i, key) in run.iter().enumerate() {
                if let Some(ahead) = run.get(i + EACH_PREFETCH_AHEAD) {
                    prefetch(ahead);
                }
                let at = run_no * EACH_KEYS_PER_LOCK + i;
                let answered = version::get_or_miss(
                    &self.inner.dev,
                    &refs,
                    &version,
                    keyspace,
                    key,
                    snapshot.seq,
                    false,
                    |v| visit(at, v.as_ref().map(|v| v.bytes())),
                )?;
                match answered {
                    Ok(()) => {}
                    Err(version::Pending::Blob {
                        file, reference, ..
                    }) => blobs.push((at, file, reference)),
                    Err(version::Pending::Miss(_)) => missed.push(at),
                }
            }
            drop(refs);
            drop(guards);
            for (at, file, reference) in blobs {
                let value = file.read_value(&self.inner.dev, &reference)?;
                visit(at, Some(&value));
            }
            for at in missed {
                visit(at, self.get_at(keyspace, keys[at], snapshot)?.as_deref());
            }
        }
        Ok(())
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
        self.iter_paging(keyspace, range, snapshot, reverse, expected_entries, false)
    }

    /// [`Store::iter_expecting`] for a caller that pages through the
    /// range (`paging`: a point in time or a scroll read to its end, page
    /// after page): its blocks are looked up in the block cache but never
    /// added, so the walk does not evict what other readers use.
    pub fn iter_paging(
        &self,
        keyspace: u32,
        range: (Bound<&[u8]>, Bound<&[u8]>),
        snapshot: &Snapshot,
        reverse: bool,
        expected_entries: usize,
        paging: bool,
    ) -> StoreIter {
        let (start, end) = half_open(range);
        let spec = CursorSpec {
            start,
            end,
            reverse,
            use_cache: true,
            fill_cache: !paging,
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

    /// Bytes the tables of `keyspace` hold on the device now (what is
    /// still only in the memtable and the log is not counted).
    pub fn keyspace_table_bytes(&self, keyspace: u32) -> u64 {
        let version = read(&self.inner.version).clone();
        version
            .levels(keyspace)
            .map_or(0, |levels| levels.all().map(|t| t.data_bytes()).sum())
    }

    /// Up to `parts - 1` keys that cut a keyspace into parts of similar
    /// size, in order: boundaries for operators that scan disjoint ranges
    /// on several threads. Each cut is a table's first key, where the data
    /// bytes of the tables starting before it reach the next share (a
    /// table's bytes counted at its first key), so a few large tables
    /// weigh what they hold, not one table each.
    pub fn split_keys(&self, keyspace: u32, parts: usize) -> Vec<Vec<u8>> {
        let version = read(&self.inner.version).clone();
        let Some(levels) = version.levels(keyspace) else {
            return Vec::new();
        };
        let mut tables: Vec<(&Vec<u8>, u64)> = levels
            .all()
            .map(|t| (&t.meta.smallest, t.data_bytes().max(1)))
            .collect();
        tables.sort();
        if parts < 2 || tables.len() < 2 {
            return Vec::new();
        }
        let total: u64 = tables.iter().map(|(_, b)| b).sum();
        let mut keys: Vec<Vec<u8>> = Vec::with_capacity(parts - 1);
        let (mut before, mut next) = (0u64, 1u64);
        for (key, bytes) in tables {
            let mut reached = false;
            while next < parts as u64 && before > 0 && before >= next * total / parts as u64 {
                reached = true;
                next += 1;
            }
            if reached && keys.last() != Some(key) {
                keys.push(key.clone());
            }
            before += bytes;
        }
        keys
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

/// What a thread keeps between point reads with
/// [`Store::get_latest_cached`]: the memtables and version it last read,
/// taken again only when the store has changed them. Holding it keeps that
/// version's tables (and a frozen memtable) alive: [`ReadCache::clear`] it
/// when the thread goes idle.
#[derive(Default)]
pub struct ReadCache {
    view: Option<CachedView>,
    /// Answers of [`Store::get_latest_remembered`] until the next write.
    recent: recent::RecentReads,
}

struct CachedView {
    generation: u64,
    active: Arc<RwLock<Memtable>>,
    frozen: Option<Arc<RwLock<Memtable>>>,
    version: Arc<Version>,
}

impl ReadCache {
    /// Lets go of the view (the next read takes it again).
    pub fn clear(&mut self) {
        self.view = None;
        self.recent.clear();
    }
}
