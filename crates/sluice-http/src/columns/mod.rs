//! Field columns: for each index, the values of the fields its counts and
//! aggregations have named, one entry per document, held in memory beside
//! the store (Elasticsearch's doc values, built when a query first needs
//! them and kept current by every document write after that).
//!
//! A count or aggregation whose fields all have columns reads no document.
//! Each leaf of the query's predicate is evaluated once per distinct value
//! of its field, by the same [`FieldPredicate`] the scan runs, on that value
//! alone. That marks the documents holding a matching value (the union of
//! the matching values' bitmaps, for a field of at most 64 values; else a
//! pass over the per-document entries); the marks combine by AND, OR and
//! NOT. An aggregation then counts the distinct
//! combinations of values among the matched documents and hands each one
//! once, with its count, to [`aggregate_rows`]. Answers equal the scan's
//! because the same code judges the same bytes; a property test checks it.
//!
//! Columns are derived data: nothing is persisted and nothing is lost when
//! they are dropped. The first query naming a field without a column
//! builds one, with the columns already held, in one scan of the index at
//! a snapshot. Writes committed meanwhile are queued and applied after, so
//! the new columns miss none; other queries scan meanwhile. Memory is
//! bounded by a budget all indices share ([`ColumnBudget`]). A build that
//! would exceed it is dropped, writes that would push the columns past it
//! drop them, and queries scan again.

mod table;

use crate::dsl::Query;
use sluice_ndp::aggregate::{Aggregate, GroupRow};
use sluice_ndp::expr::{Path, Step};
use sluice_ndp::scan::ScanError;
use sluice_store::Store;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use table::{columnable, extract, popcount, query_paths, Change, Extracted, Table};

/// Memory all indices' columns may hold, unless set otherwise.
pub const DEFAULT_BUDGET_BYTES: u64 = 1 << 30;
/// Most fields with a column per index.
pub const MAX_COLUMNS: usize = 64;
/// Most bytes of writes queued while a build runs; past it the build is
/// dropped (the next query tries again).
const MAX_PENDING_BYTES: usize = 64 << 20;
/// After a build over the budget, queries scan this long before another.
const RETRY_AFTER_REFUSAL: Duration = Duration::from_secs(60);

/// The memory budget of every index's columns.
#[derive(Debug)]
pub struct ColumnBudget {
    limit_bytes: AtomicU64,
    used_bytes: AtomicU64,
}

impl ColumnBudget {
    /// A budget of `limit_bytes` (0: no columns at all).
    pub fn new(limit_bytes: u64) -> ColumnBudget {
        ColumnBudget {
            limit_bytes: AtomicU64::new(limit_bytes),
            used_bytes: AtomicU64::new(0),
        }
    }

    /// Sets the limit; columns already held stay until a write or build
    /// finds them over it.
    pub fn set_limit_bytes(&self, limit_bytes: u64) {
        self.limit_bytes.store(limit_bytes, Ordering::Relaxed);
    }

    /// The limit.
    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes.load(Ordering::Relaxed)
    }

    /// What every index's columns hold now (an estimate).
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::Relaxed)
    }

    fn adjust(&self, before_bytes: u64, after_bytes: u64) {
        if after_bytes >= before_bytes {
            self.used_bytes
                .fetch_add(after_bytes - before_bytes, Ordering::Relaxed);
        } else {
            self.used_bytes
                .fetch_sub(before_bytes - after_bytes, Ordering::Relaxed);
        }
    }
}

impl Default for ColumnBudget {
    fn default() -> Self {
        ColumnBudget::new(DEFAULT_BUDGET_BYTES)
    }
}

/// What one index's columns hold and have done.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ColumnStats {
    /// Fields with a column.
    pub fields: usize,
    /// Documents the columns hold.
    pub docs: u64,
    /// Memory held (an estimate).
    pub bytes: u64,
    /// Builds finished.
    pub builds: u64,
    /// Counts and aggregations answered from the columns.
    pub answers: u64,
}

/// The columns of one index.
pub struct Columns {
    inner: RwLock<Inner>,
    /// One build at a time.
    building: Mutex<()>,
    budget: Arc<ColumnBudget>,
    builds: AtomicU64,
    answers: AtomicU64,
}

#[derive(Default)]
struct Inner {
    table: Option<Table>,
    /// Writes committed while a build scans.
    pending: Option<Pending>,
    /// When a build last went over the budget.
    refused_at: Option<Instant>,
}

struct Pending {
    paths: Vec<Path>,
    changes: Vec<Change>,
    bytes: usize,
    overflowed: bool,
}

impl Columns {
    /// No columns yet, held within `budget`.
    pub fn new(budget: Arc<ColumnBudget>) -> Columns {
        Columns {
            inner: RwLock::new(Inner::default()),
            building: Mutex::new(()),
            budget,
            builds: AtomicU64::new(0),
            answers: AtomicU64::new(0),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// What the columns hold and have done.
    pub fn stats(&self) -> ColumnStats {
        let inner = self.read();
        let (fields, docs, bytes) = inner
            .table
            .as_ref()
            .map_or((0, 0, 0), |t| (t.columns.len(), t.docs(), t.bytes));
        ColumnStats {
            fields,
            docs,
            bytes,
            builds: self.builds.load(Ordering::Relaxed),
            answers: self.answers.load(Ordering::Relaxed),
        }
    }

    /// The number of documents of keyspace `docs` matching `query`, or None
    /// when the columns cannot answer (the caller scans).
    pub fn count(&self, store: &Store, docs: u32, query: &Query) -> Option<u64> {
        let mut paths = Vec::new();
        query_paths(query, &mut paths);
        if !self.prepare(store, docs, &paths) {
            return None;
        }
        let inner = self.read();
        let table = inner.table.as_ref().filter(|t| t.serves(&paths))?;
        let n = popcount(&table.matched(query)?);
        self.answers.fetch_add(1, Ordering::Relaxed);
        Some(n)
    }

    /// [`sluice_ndp::aggregate::aggregate`] of the documents matching
    /// `query` (multi-valued, as the HTTP API aggregates), or None when the
    /// columns cannot answer (the caller scans).
    pub fn aggregate(
        &self,
        store: &Store,
        docs: u32,
        query: &Query,
        aggregates: &[Aggregate],
        group_by: Option<&Path>,
    ) -> Option<Result<Vec<GroupRow>, ScanError>> {
        let mut paths = Vec::new();
        query_paths(query, &mut paths);
        for p in aggregates
            .iter()
            .filter_map(|a| a.path.as_ref())
            .chain(group_by)
        {
            if !paths.contains(p) {
                paths.push(p.clone());
            }
        }
        if !self.prepare(store, docs, &paths) {
            return None;
        }
        let inner = self.read();
        let table = inner.table.as_ref().filter(|t| t.serves(&paths))?;
        let bits = table.matched(query)?;
        let rows = table.aggregate(&bits, aggregates, group_by)?;
        self.answers.fetch_add(1, Ordering::Relaxed);
        Some(rows)
    }

    /// Documents written (`Some(source)`) or deleted (`None`), once the
    /// write is committed; called in commit order for each id.
    pub fn record<'a>(&self, changes: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>) {
        // Most writes meet an index without columns: no exclusive lock then.
        {
            let inner = self.read();
            if inner.table.is_none() && inner.pending.is_none() {
                return;
            }
        }
        let mut inner = self.write();
        if inner.table.is_none() && inner.pending.is_none() {
            return;
        }
        let changes: Vec<_> = changes.into_iter().collect();
        let Inner {
            table,
            pending,
            refused_at,
        } = &mut *inner;
        if let Some(p) = pending.as_mut().filter(|p| !p.overflowed) {
            for &(id, source) in &changes {
                let values: Option<Vec<Extracted<Box<[u8]>>>> = source.map(|s| {
                    extract(&p.paths, s)
                        .into_iter()
                        .map(|v| v.map(|v| v.map(Box::from)))
                        .collect()
                });
                let value_bytes: usize = values
                    .iter()
                    .flatten()
                    .map(|v| match v {
                        Ok(Some(b)) => b.len(),
                        _ => 0,
                    })
                    .sum();
                p.bytes += id.len() + value_bytes;
                p.changes.push((Box::from(id), values));
            }
            if p.bytes > MAX_PENDING_BYTES {
                p.overflowed = true;
                p.changes = Vec::new();
            }
        }
        let Some(t) = table.as_mut() else {
            return;
        };
        let before = t.bytes;
        let paths = t.paths();
        for (id, source) in changes {
            match source {
                Some(s) => t.put(id, &extract(&paths, s)),
                None => t.remove(id),
            }
        }
        let after = t.bytes;
        self.budget.adjust(before, after);
        if self.budget.used_bytes() > self.budget.limit_bytes() {
            log::warn!(
                "field columns dropped: they would hold {} MiB, over the budget of {} MiB; counts and aggregations scan",
                self.budget.used_bytes() >> 20,
                self.budget.limit_bytes() >> 20
            );
            self.budget.adjust(after, 0);
            *table = None;
            *refused_at = Some(Instant::now());
        }
    }

    /// A write failed after it may have reached the store: the columns may
    /// no longer match it, so they go (the next query builds them again).
    pub fn forget(&self) {
        let mut inner = self.write();
        if let Some(t) = inner.table.take() {
            self.budget.adjust(t.bytes, 0);
        }
        if let Some(p) = inner.pending.as_mut() {
            p.overflowed = true;
            p.changes = Vec::new();
        }
    }

    /// The fields with a column, as dotted names (what the catalog
    /// remembers, so that a restart builds them again before they are asked
    /// for).
    pub fn field_names(&self) -> Vec<String> {
        let inner = self.read();
        let Some(t) = &inner.table else {
            return Vec::new();
        };
        t.columns
            .iter()
            .filter(|c| c.path.steps.iter().all(|s| matches!(s, Step::Key(_))))
            .map(|c| c.path.to_string())
            .collect()
    }

    /// Builds columns of the dotted `fields` now (waiting for a build under
    /// way), unless `stop` is set meanwhile; whether they are held after.
    pub fn warm(&self, store: &Store, docs: u32, fields: &[String], stop: &AtomicBool) -> bool {
        let paths: Vec<Path> = fields
            .iter()
            .map(|f| Path {
                steps: f.split('.').map(|k| Step::Key(k.to_string())).collect(),
            })
            .collect();
        self.prepare_with(store, docs, &paths, Some(stop))
    }

    /// Whether the columns hold `paths`, building them if they do not and
    /// no other build runs.
    fn prepare(&self, store: &Store, docs: u32, paths: &[Path]) -> bool {
        self.prepare_with(store, docs, paths, None)
    }

    /// [`Columns::prepare`]; with `stop`, waits for a build under way
    /// instead of giving up, and gives up when `stop` is set.
    fn prepare_with(
        &self,
        store: &Store,
        docs: u32,
        paths: &[Path],
        stop: Option<&AtomicBool>,
    ) -> bool {
        if !paths.iter().all(columnable)
            || paths.len() > MAX_COLUMNS
            || self.budget.limit_bytes() == 0
        {
            return false;
        }
        {
            let inner = self.read();
            if inner.table.as_ref().is_some_and(|t| t.serves(paths)) {
                return true;
            }
            if inner
                .refused_at
                .is_some_and(|at| at.elapsed() < RETRY_AFTER_REFUSAL)
            {
                return false;
            }
        }
        let _one_build = match (self.building.try_lock(), stop) {
            (Ok(g), _) => g,
            (Err(std::sync::TryLockError::WouldBlock), Some(_)) => {
                self.building.lock().unwrap_or_else(|p| p.into_inner())
            }
            (Err(std::sync::TryLockError::Poisoned(p)), _) => p.into_inner(),
            (Err(std::sync::TryLockError::WouldBlock), None) => return false,
        };
        let mut wanted = match &self.read().table {
            Some(t) if t.serves(paths) => return true,
            Some(t) => t.paths(),
            None => Vec::new(),
        };
        for p in paths {
            if !wanted.contains(p) {
                wanted.push(p.clone());
            }
        }
        if wanted.len() > MAX_COLUMNS {
            wanted = paths.to_vec();
        }
        self.build(store, docs, wanted, stop)
    }

    fn build(&self, store: &Store, docs: u32, paths: Vec<Path>, stop: Option<&AtomicBool>) -> bool {
        let started = Instant::now();
        let held_bytes = self.read().table.as_ref().map_or(0, |t| t.bytes);
        let room_bytes = self
            .budget
            .limit_bytes()
            .saturating_sub(self.budget.used_bytes().saturating_sub(held_bytes));
        self.write().pending = Some(Pending {
            paths: paths.clone(),
            changes: Vec::new(),
            bytes: 0,
            overflowed: false,
        });
        let scanned = scan(store, docs, &paths, room_bytes, stop);
        let mut inner = self.write();
        #[expect(
            clippy::expect_used,
            reason = "a build is started with its queue and takes it only here, once"
        )]
        let pending = inner.pending.take().expect("the build's queue");
        let mut table = match scanned {
            Ok(t) => t,
            Err(Refused::OverBudget) => {
                log::warn!(
                    "field columns of {} fields not built: over the budget of {} MiB; counts and aggregations scan",
                    paths.len(),
                    self.budget.limit_bytes() >> 20
                );
                inner.refused_at = Some(Instant::now());
                return false;
            }
            Err(Refused::Store(why)) => {
                log::warn!("field columns not built: {why}");
                return false;
            }
            Err(Refused::Stopped) => return false,
        };
        if pending.overflowed {
            return false;
        }
        for (id, values) in pending.changes {
            match values {
                Some(v) => table.put(&id, &v),
                None => table.remove(&id),
            }
        }
        let old_bytes = inner.table.as_ref().map_or(0, |t| t.bytes);
        self.budget.adjust(old_bytes, table.bytes);
        log::info!(
            "field columns built: {} fields of {} documents, {} MiB, in {} ms",
            table.columns.len(),
            table.docs(),
            table.bytes >> 20,
            started.elapsed().as_millis()
        );
        inner.table = Some(table);
        self.builds.fetch_add(1, Ordering::Relaxed);
        true
    }
}

impl std::fmt::Debug for Columns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Columns").field(&self.stats()).finish()
    }
}

impl Drop for Columns {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = inner.table.take() {
            self.budget.adjust(t.bytes, 0);
        }
    }
}

enum Refused {
    OverBudget,
    Store(String),
    Stopped,
}

/// Documents a scan worker hands over at a time.
const SCAN_BATCH_DOCS: usize = 4096;
/// Batches in flight from the scan workers.
const SCAN_BATCHES_QUEUED: usize = 8;
/// Most scan workers.
const MAX_SCAN_WORKERS: usize = 8;

/// Documents of a part of the index, their ids and values of the paths.
type ScanBatch = Vec<(Box<[u8]>, Vec<Extracted<Box<[u8]>>>)>;

/// Every document of keyspace `docs` at a snapshot, its values of `paths`
/// taken into a new table. Workers (one per core, each over a part of the
/// keys cut at table boundaries) read and take the values out; this thread
/// numbers the documents and fills the columns.
fn scan(
    store: &Store,
    docs: u32,
    paths: &[Path],
    room_bytes: u64,
    stop: Option<&AtomicBool>,
) -> Result<Table, Refused> {
    let snapshot = store.snapshot();
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_SCAN_WORKERS));
    let cuts = store.split_keys(docs, workers);
    let mut bounds: Vec<Bound<&[u8]>> = vec![Bound::Unbounded];
    bounds.extend(cuts.iter().map(|c| Bound::Included(&c[..])));
    bounds.push(Bound::Unbounded);
    let quit = AtomicBool::new(false);
    let (tx, rx) = std::sync::mpsc::sync_channel::<Result<ScanBatch, String>>(SCAN_BATCHES_QUEUED);
    std::thread::scope(|scope| {
        for part in bounds.windows(2) {
            let (tx, quit, snapshot) = (tx.clone(), &quit, &snapshot);
            let upper = match part[1] {
                Bound::Included(k) => Bound::Excluded(k),
                other => other,
            };
            let range = (part[0], upper);
            scope.spawn(move || {
                let mut iter = store.iter(docs, range, snapshot, false);
                let mut batch: ScanBatch = Vec::with_capacity(SCAN_BATCH_DOCS);
                loop {
                    let next = match iter.next_ref() {
                        Ok(n) => n,
                        Err(e) => {
                            let _ = tx.send(Err(e.to_string()));
                            return;
                        }
                    };
                    let Some((id, source)) = next else { break };
                    let values = extract(paths, source)
                        .into_iter()
                        .map(|v| v.map(|v| v.map(Box::from)))
                        .collect();
                    batch.push((Box::from(id), values));
                    if batch.len() == SCAN_BATCH_DOCS {
                        let full =
                            std::mem::replace(&mut batch, Vec::with_capacity(SCAN_BATCH_DOCS));
                        if quit.load(Ordering::Relaxed) || tx.send(Ok(full)).is_err() {
                            return;
                        }
                    }
                }
                if !batch.is_empty() {
                    let _ = tx.send(Ok(batch));
                }
            });
        }
        drop(tx);
        let filled = fill(paths, &rx, room_bytes, stop);
        if filled.is_err() {
            quit.store(true, Ordering::Relaxed);
            // Unblocks workers waiting to send.
            while rx.recv().is_ok() {}
        }
        filled
    })
}

/// A table from the batches of `rx`, until every worker is done.
fn fill(
    paths: &[Path],
    rx: &std::sync::mpsc::Receiver<Result<ScanBatch, String>>,
    room_bytes: u64,
    stop: Option<&AtomicBool>,
) -> Result<Table, Refused> {
    let mut table = Table::new(paths);
    for batch in rx {
        for (id, values) in batch.map_err(Refused::Store)? {
            table.put(&id, &values);
        }
        if table.bytes > room_bytes {
            return Err(Refused::OverBudget);
        }
        if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            return Err(Refused::Stopped);
        }
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::table::leaf_document;
    use super::*;
    use sluice_ndp::format::field_text;

    fn path(text: &str) -> Path {
        Path {
            steps: text.split('.').map(|s| Step::Key(s.into())).collect(),
        }
    }

    #[test]
    fn a_leaf_document_holds_the_value_where_the_path_finds_it() {
        let p = Path {
            steps: vec![Step::Key("a".into()), Step::Index(2), Step::Key("b".into())],
        };
        let doc = leaf_document(&p, Some(b"[1,\"x\"]"));
        assert_eq!(doc, b"{\"a\":[null,null,{\"b\":[1,\"x\"]}]}".to_vec());
        assert_eq!(field_text(&doc, &p).unwrap(), Some(&b"[1,\"x\"]"[..]));
        assert_eq!(leaf_document(&p, None), b"{}".to_vec());
    }

    #[test]
    fn removed_documents_free_their_numbers_for_the_next() {
        let mut t = Table::new(&[path("v")]);
        t.put(b"a", &[Ok(Some(&b"1"[..]))]);
        t.put(b"b", &[Ok(Some(&b"2"[..]))]);
        t.remove(b"a");
        assert_eq!(t.docs(), 1);
        t.put(b"c", &[Ok(None::<&[u8]>)]);
        assert_eq!(t.slots, 2, "the number of a was taken again");
        assert_eq!(popcount(&t.live), 2);
    }

    #[test]
    fn paths_needing_escapes_get_no_column() {
        assert!(columnable(&path("venue.name")));
        assert!(!columnable(&path("we\"ird")));
        assert!(!columnable(&Path { steps: vec![] }));
    }
}
