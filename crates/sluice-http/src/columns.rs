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

use crate::dsl::Query;
use hashbrown::HashMap;
use sluice_ndp::aggregate::{aggregate_rows, Aggregate, GroupRow, ValueRow};
use sluice_ndp::expr::{Path, Predicate, Step};
use sluice_ndp::format::field_text;
use sluice_ndp::scan::ScanError;
use sluice_ndp::FieldPredicate;
use sluice_store::Store;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Memory all indices' columns may hold, unless set otherwise.
pub const DEFAULT_BUDGET_BYTES: u64 = 1 << 30;
/// Most fields with a column per index.
pub const MAX_COLUMNS: usize = 64;
/// Most bytes of writes queued while a build runs; past it the build is
/// dropped (the next query tries again).
const MAX_PENDING_BYTES: usize = 64 << 20;
/// After a build over the budget, queries scan this long before another.
const RETRY_AFTER_REFUSAL: Duration = Duration::from_secs(60);
/// Combinations of values counted in an array rather than a hash map.
const MAX_DENSE_COMBINATIONS: u128 = 1 << 16;
/// Bytes counted per document beside its id (its map entry and allocation).
const DOC_OVERHEAD_BYTES: u64 = 64;
/// Bytes counted per distinct value beside its text (held twice).
const VALUE_OVERHEAD_BYTES: u64 = 64;
/// Most distinct values of a column that keeps a bitmap of documents per
/// value (beyond it, a leaf reads the per-document entries instead).
const MAX_POSTED_VALUES: usize = 64;
/// Deepest array position a column's path may name.
const MAX_PATH_INDEX: usize = 64;

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

/// A field's value as a document holds it: its JSON text, absent, or not
/// readable (the document is not JSON where the field was looked for).
type Extracted<T> = Result<Option<T>, ()>;

/// A document id and its values now (None: deleted).
type Change = (Box<[u8]>, Option<Vec<Extracted<Box<[u8]>>>>);

struct Pending {
    paths: Vec<Path>,
    changes: Vec<Change>,
    bytes: usize,
    overflowed: bool,
}

struct Table {
    numbers: HashMap<Box<[u8]>, u32>,
    /// One bit per document number in use.
    live: Vec<u64>,
    free: Vec<u32>,
    slots: u32,
    columns: Vec<Column>,
    bytes: u64,
}

struct Column {
    path: Path,
    /// Distinct values' JSON texts; entry 0 is "absent".
    values: Vec<Box<[u8]>>,
    lookup: HashMap<Box<[u8]>, u32>,
    /// Per document number, its value's entry.
    ords: Vec<u32>,
    /// Per entry, the document numbers holding it, one bit each (entry 0
    /// holds the free numbers too); dropped once the column has more than
    /// [`MAX_POSTED_VALUES`] values.
    postings: Option<Vec<Bits>>,
    /// A document was not JSON where this field was looked for: the scan
    /// reports that, so queries on this field scan.
    damaged: bool,
}

impl Column {
    fn new(path: Path) -> Column {
        Column {
            path,
            values: vec![Box::from(&b""[..])],
            lookup: HashMap::new(),
            ords: Vec::new(),
            postings: Some(vec![Vec::new()]),
            damaged: false,
        }
    }

    /// The entry of `raw`, added if new; the bytes it added (or, negative,
    /// freed: the bitmaps go when there are too many values).
    fn intern(&mut self, raw: &[u8], words: usize) -> (u32, i64) {
        if let Some(&ord) = self.lookup.get(raw) {
            return (ord, 0);
        }
        #[expect(
            clippy::expect_used,
            reason = "a column has at most one value per document, and documents are counted in u32"
        )]
        let ord = u32::try_from(self.values.len()).expect("fewer values than documents");
        self.values.push(Box::from(raw));
        self.lookup.insert(Box::from(raw), ord);
        let mut added = 2 * raw.len() as i64 + VALUE_OVERHEAD_BYTES as i64;
        if self.values.len() > MAX_POSTED_VALUES {
            if let Some(p) = self.postings.take() {
                added -= (p.len() * words * 8) as i64;
            }
        } else if let Some(p) = &mut self.postings {
            p.push(vec![0; words]);
            added += (words * 8) as i64;
        }
        (ord, added)
    }

    /// Document `n` now holds entry `ord`.
    fn set(&mut self, n: usize, ord: u32) {
        let old = std::mem::replace(&mut self.ords[n], ord);
        if let (Some(p), true) = (&mut self.postings, old != ord) {
            p[old as usize][n / 64] &= !(1 << (n % 64));
            p[ord as usize][n / 64] |= 1 << (n % 64);
        }
    }

    /// A new document number `n`, holding entry 0; `new_word`: its bit
    /// opens a new word of the bitmaps. The bytes added.
    fn grow(&mut self, n: usize, new_word: bool) -> u64 {
        self.ords.push(0);
        let mut added = 4;
        if let Some(p) = &mut self.postings {
            if new_word {
                p.iter_mut().for_each(|b| b.push(0));
                added += 8 * p.len() as u64;
            }
            p[0][n / 64] |= 1 << (n % 64);
        }
        added
    }
}

fn extract<'s>(paths: &[Path], source: &'s [u8]) -> Vec<Extracted<&'s [u8]>> {
    paths
        .iter()
        .map(|p| field_text(source, p).map_err(|_| ()))
        .collect()
}

impl Table {
    fn new(paths: &[Path]) -> Table {
        Table {
            numbers: HashMap::new(),
            live: Vec::new(),
            free: Vec::new(),
            slots: 0,
            columns: paths.iter().cloned().map(Column::new).collect(),
            bytes: 0,
        }
    }

    fn paths(&self) -> Vec<Path> {
        self.columns.iter().map(|c| c.path.clone()).collect()
    }

    fn column(&self, path: &Path) -> Option<&Column> {
        self.columns.iter().find(|c| &c.path == path)
    }

    fn serves(&self, paths: &[Path]) -> bool {
        paths
            .iter()
            .all(|p| self.column(p).is_some_and(|c| !c.damaged))
    }

    fn number(&mut self, id: &[u8]) -> u32 {
        if let Some(&n) = self.numbers.get(id) {
            return n;
        }
        let n = match self.free.pop() {
            Some(n) => n,
            None => {
                let n = self.slots;
                #[expect(
                    clippy::expect_used,
                    reason = "an index holds fewer than 2^32 documents (the catalog's limit)"
                )]
                let next = n.checked_add(1).expect("fewer than 2^32 documents");
                self.slots = next;
                let new_word = n as usize / 64 >= self.live.len();
                if new_word {
                    self.live.push(0);
                    self.bytes += 8;
                }
                for c in &mut self.columns {
                    self.bytes += c.grow(n as usize, new_word);
                }
                n
            }
        };
        self.live[n as usize / 64] |= 1 << (n % 64);
        self.numbers.insert(Box::from(id), n);
        self.bytes += id.len() as u64 + DOC_OVERHEAD_BYTES;
        n
    }

    /// The document `id` now holds these values, one per column.
    fn put<T: AsRef<[u8]>>(&mut self, id: &[u8], values: &[Extracted<T>]) {
        debug_assert_eq!(values.len(), self.columns.len());
        let n = self.number(id) as usize;
        let words = self.live.len();
        for (c, v) in self.columns.iter_mut().zip(values) {
            let ord = match v {
                Ok(Some(raw)) => {
                    let (ord, added) = c.intern(raw.as_ref(), words);
                    self.bytes = self.bytes.saturating_add_signed(added);
                    ord
                }
                Ok(None) => 0,
                Err(()) => {
                    c.damaged = true;
                    0
                }
            };
            c.set(n, ord);
        }
    }

    fn remove(&mut self, id: &[u8]) {
        let Some(n) = self.numbers.remove(id) else {
            return;
        };
        self.live[n as usize / 64] &= !(1 << (n % 64));
        for c in &mut self.columns {
            c.set(n as usize, 0);
        }
        self.free.push(n);
        self.bytes -= id.len() as u64 + DOC_OVERHEAD_BYTES;
    }

    fn docs(&self) -> u64 {
        self.numbers.len() as u64
    }
}

/// Whether a path can have a column: keys the leaf documents can name
/// without escapes, and short array positions.
fn columnable(path: &Path) -> bool {
    !path.steps.is_empty()
        && path.steps.iter().all(|s| match s {
            Step::Key(k) => !k.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20),
            Step::Index(i) => *i <= MAX_PATH_INDEX,
        })
}

/// A document holding only `raw` at `path` (`{}` for absent): what a
/// predicate on that one field sees of any document with that value.
fn leaf_document(path: &Path, raw: Option<&[u8]>) -> Vec<u8> {
    let Some(raw) = raw else {
        return b"{}".to_vec();
    };
    let mut out = Vec::with_capacity(raw.len() + 16);
    for step in &path.steps {
        match step {
            Step::Key(k) => {
                out.extend_from_slice(b"{\"");
                out.extend_from_slice(k.as_bytes());
                out.extend_from_slice(b"\":");
            }
            Step::Index(i) => {
                out.push(b'[');
                for _ in 0..*i {
                    out.extend_from_slice(b"null,");
                }
            }
        }
    }
    out.extend_from_slice(raw);
    for step in path.steps.iter().rev() {
        out.push(match step {
            Step::Key(_) => b'}',
            Step::Index(_) => b']',
        });
    }
    out
}

/// The paths a query reads.
fn query_paths(query: &Query, out: &mut Vec<Path>) {
    match query {
        Query::All | Query::None | Query::Ids(_) => {}
        Query::Pred(_, p) => {
            for path in p.paths() {
                if !out.contains(path) {
                    out.push(path.clone());
                }
            }
        }
        Query::And(qs) | Query::AtLeast(_, qs) => qs.iter().for_each(|q| query_paths(q, out)),
        Query::Not(q) => query_paths(q, out),
    }
}

type Bits = Vec<u64>;

fn and(a: &mut Bits, b: &Bits) {
    a.iter_mut().zip(b).for_each(|(x, y)| *x &= y);
}

fn or(a: &mut Bits, b: &Bits) {
    a.iter_mut().zip(b).for_each(|(x, y)| *x |= y);
}

fn not(a: &mut Bits, live: &Bits) {
    a.iter_mut().zip(live).for_each(|(x, l)| *x = !*x & l);
}

impl Table {
    /// The documents matching `query` (a subset of the live ones); None
    /// where a leaf cannot be judged here.
    fn matched(&self, query: &Query) -> Option<Bits> {
        Some(match query {
            Query::All => self.live.clone(),
            Query::None => vec![0; self.live.len()],
            Query::Pred(_, p) => {
                let mut bits = self.predicate(p)?;
                and(&mut bits, &self.live);
                bits
            }
            Query::Ids(ids) => {
                let mut bits = vec![0; self.live.len()];
                for id in ids {
                    if let Some(&n) = self.numbers.get(id.as_bytes()) {
                        bits[n as usize / 64] |= 1 << (n % 64);
                    }
                }
                bits
            }
            Query::And(qs) => {
                let mut bits = self.live.clone();
                for q in qs {
                    and(&mut bits, &self.matched(q)?);
                }
                bits
            }
            Query::AtLeast(min, qs) => self.at_least(*min, qs)?,
            Query::Not(q) => {
                let mut bits = self.matched(q)?;
                not(&mut bits, &self.live);
                bits
            }
        })
    }

    fn at_least(&self, min: usize, qs: &[Query]) -> Option<Bits> {
        if min == 0 {
            return Some(self.live.clone());
        }
        let parts: Vec<Bits> = qs.iter().map(|q| self.matched(q)).collect::<Option<_>>()?;
        let mut bits = vec![0u64; self.live.len()];
        if min == 1 {
            parts.iter().for_each(|p| or(&mut bits, p));
            return Some(bits);
        }
        for (w, word) in bits.iter_mut().enumerate() {
            for bit in 0..64 {
                let held = parts.iter().filter(|p| p[w] >> bit & 1 == 1).count();
                if held >= min {
                    *word |= 1 << bit;
                }
            }
        }
        Some(bits)
    }

    /// Documents for which `p` holds (not masked by the live ones).
    fn predicate(&self, p: &Predicate) -> Option<Bits> {
        Some(match p {
            Predicate::And(ps) => {
                let mut bits = self.live.clone();
                for q in ps {
                    and(&mut bits, &self.predicate(q)?);
                }
                bits
            }
            Predicate::Or(ps) => {
                let mut bits = vec![0; self.live.len()];
                for q in ps {
                    or(&mut bits, &self.predicate(q)?);
                }
                bits
            }
            Predicate::Not(q) => {
                let mut bits = self.predicate(q)?;
                not(&mut bits, &self.live);
                bits
            }
            leaf => self.leaf(leaf)?,
        })
    }

    fn leaf(&self, leaf: &Predicate) -> Option<Bits> {
        let path = *leaf.paths().first()?;
        let column = self.column(path).filter(|c| !c.damaged)?;
        let test = FieldPredicate::compile_multi_valued(leaf);
        let mut hits = Vec::with_capacity(column.values.len());
        for (ord, raw) in column.values.iter().enumerate() {
            let doc = leaf_document(path, (ord > 0).then_some(&raw[..]));
            hits.push(test.matches(&doc).ok()?);
        }
        let mut bits = vec![0u64; self.live.len()];
        if let Some(postings) = &column.postings {
            for (posting, _) in postings.iter().zip(&hits).filter(|(_, &hit)| hit) {
                or(&mut bits, posting);
            }
            return Some(bits);
        }
        for (word, ords) in bits.iter_mut().zip(column.ords.chunks(64)) {
            let mut w = 0u64;
            for (bit, &ord) in ords.iter().enumerate() {
                w |= u64::from(hits[ord as usize]) << bit;
            }
            *word = w;
        }
        Some(bits)
    }
}

fn each_bit(bits: &Bits, mut f: impl FnMut(usize)) {
    for (w, &word) in bits.iter().enumerate() {
        let mut rest = word;
        while rest != 0 {
            let bit = rest.trailing_zeros() as usize;
            f(w * 64 + bit);
            rest &= rest - 1;
        }
    }
}

fn popcount(bits: &Bits) -> u64 {
    bits.iter().map(|w| u64::from(w.count_ones())).sum()
}

impl Table {
    /// Groups of `aggregates` over the documents in `bits`, computed once
    /// per distinct combination of the fields' values.
    fn aggregate(
        &self,
        bits: &Bits,
        aggregates: &[Aggregate],
        group_by: Option<&Path>,
    ) -> Option<Result<Vec<GroupRow>, ScanError>> {
        // The columns read, each once, and for each role which of them.
        let mut read: Vec<&Column> = Vec::new();
        let mut slot_of = |path: &Path| -> Option<usize> {
            let column = self.column(path).filter(|c| !c.damaged)?;
            Some(match read.iter().position(|c| std::ptr::eq(*c, column)) {
                Some(i) => i,
                None => {
                    read.push(column);
                    read.len() - 1
                }
            })
        };
        let group_slot = match group_by {
            Some(p) => Some(slot_of(p)?),
            None => None,
        };
        let mut field_slots = Vec::with_capacity(aggregates.len());
        for a in aggregates {
            field_slots.push(match &a.path {
                Some(p) => Some(slot_of(p)?),
                None => None,
            });
        }
        let mut strides = Vec::with_capacity(read.len());
        let mut combinations: u128 = 1;
        for c in &read {
            strides.push(combinations);
            combinations = combinations.checked_mul(c.values.len() as u128)?;
        }
        let key_of = |doc: usize| -> u128 {
            read.iter()
                .zip(&strides)
                .map(|(c, s)| u128::from(c.ords[doc]) * s)
                .sum()
        };
        let mut counted: Vec<(u128, u64)> = Vec::new();
        if combinations <= MAX_DENSE_COMBINATIONS {
            let mut dense = vec![0u64; combinations as usize];
            each_bit(bits, |doc| dense[key_of(doc) as usize] += 1);
            counted.extend(
                dense
                    .iter()
                    .enumerate()
                    .filter(|(_, &n)| n > 0)
                    .map(|(k, &n)| (k as u128, n)),
            );
        } else {
            let mut sparse: HashMap<u128, u64> = HashMap::new();
            each_bit(bits, |doc| *sparse.entry(key_of(doc)).or_default() += 1);
            counted.extend(sparse);
        }
        let raw = |slot: usize, key: u128| -> Option<&[u8]> {
            let c = read[slot];
            let ord = (key / strides[slot]) % c.values.len() as u128;
            (ord > 0).then(|| &c.values[ord as usize][..])
        };
        let rows = counted.into_iter().map(|(key, weight)| ValueRow {
            group: group_slot.and_then(|s| raw(s, key)),
            fields: field_slots
                .iter()
                .map(|s| s.and_then(|s| raw(s, key)))
                .collect(),
            weight,
        });
        Some(aggregate_rows(aggregates, true, rows))
    }
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
    use super::*;

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
