//! The columns of one index as memory holds them: document numbers, each
//! field's distinct values with per-document entries and (for few values)
//! bitmaps, and what a query and an aggregation compute over them.

use crate::dsl::Query;
use hashbrown::HashMap;
use sluice_ndp::aggregate::{aggregate_rows, Aggregate, GroupRow, ValueRow};
use sluice_ndp::expr::{Path, Predicate, Step};
use sluice_ndp::format::field_text;
use sluice_ndp::scan::ScanError;
use sluice_ndp::FieldPredicate;

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

/// A field's value as a document holds it: its JSON text, absent, or not
/// readable (the document is not JSON where the field was looked for).
pub(super) type Extracted<T> = Result<Option<T>, ()>;

/// A document id and its values now (None: deleted).
pub(super) type Change = (Box<[u8]>, Option<Vec<Extracted<Box<[u8]>>>>);

pub(super) struct Table {
    pub(super) numbers: HashMap<Box<[u8]>, u32>,
    /// One bit per document number in use.
    pub(super) live: Vec<u64>,
    pub(super) free: Vec<u32>,
    pub(super) slots: u32,
    pub(super) columns: Vec<Column>,
    pub(super) bytes: u64,
}

pub(super) struct Column {
    pub(super) path: Path,
    /// Distinct values' JSON texts; entry 0 is "absent".
    pub(super) values: Vec<Box<[u8]>>,
    pub(super) lookup: HashMap<Box<[u8]>, u32>,
    /// Per document number, its value's entry.
    pub(super) ords: Vec<u32>,
    /// Per entry, the document numbers holding it, one bit each (entry 0
    /// holds the free numbers too); dropped once the column has more than
    /// [`MAX_POSTED_VALUES`] values.
    pub(super) postings: Option<Vec<Bits>>,
    /// A document was not JSON where this field was looked for: the scan
    /// reports that, so queries on this field scan.
    pub(super) damaged: bool,
}

impl Column {
    pub(super) fn new(path: Path) -> Column {
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
    pub(super) fn intern(&mut self, raw: &[u8], words: usize) -> (u32, i64) {
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
    pub(super) fn set(&mut self, n: usize, ord: u32) {
        let old = std::mem::replace(&mut self.ords[n], ord);
        if let (Some(p), true) = (&mut self.postings, old != ord) {
            p[old as usize][n / 64] &= !(1 << (n % 64));
            p[ord as usize][n / 64] |= 1 << (n % 64);
        }
    }

    /// A new document number `n`, holding entry 0; `new_word`: its bit
    /// opens a new word of the bitmaps. The bytes added.
    pub(super) fn grow(&mut self, n: usize, new_word: bool) -> u64 {
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

pub(super) fn extract<'s>(paths: &[Path], source: &'s [u8]) -> Vec<Extracted<&'s [u8]>> {
    paths
        .iter()
        .map(|p| field_text(source, p).map_err(|_| ()))
        .collect()
}

impl Table {
    pub(super) fn new(paths: &[Path]) -> Table {
        Table {
            numbers: HashMap::new(),
            live: Vec::new(),
            free: Vec::new(),
            slots: 0,
            columns: paths.iter().cloned().map(Column::new).collect(),
            bytes: 0,
        }
    }

    pub(super) fn paths(&self) -> Vec<Path> {
        self.columns.iter().map(|c| c.path.clone()).collect()
    }

    pub(super) fn column(&self, path: &Path) -> Option<&Column> {
        self.columns.iter().find(|c| &c.path == path)
    }

    pub(super) fn serves(&self, paths: &[Path]) -> bool {
        paths
            .iter()
            .all(|p| self.column(p).is_some_and(|c| !c.damaged))
    }

    pub(super) fn number(&mut self, id: &[u8]) -> u32 {
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
    pub(super) fn put<T: AsRef<[u8]>>(&mut self, id: &[u8], values: &[Extracted<T>]) {
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

    pub(super) fn remove(&mut self, id: &[u8]) {
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

    pub(super) fn docs(&self) -> u64 {
        self.numbers.len() as u64
    }
}

/// Whether a path can have a column: keys the leaf documents can name
/// without escapes, and short array positions.
pub(super) fn columnable(path: &Path) -> bool {
    !path.steps.is_empty()
        && path.steps.iter().all(|s| match s {
            Step::Key(k) => !k.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20),
            Step::Index(i) => *i <= MAX_PATH_INDEX,
        })
}

/// A document holding only `raw` at `path` (`{}` for absent): what a
/// predicate on that one field sees of any document with that value.
pub(super) fn leaf_document(path: &Path, raw: Option<&[u8]>) -> Vec<u8> {
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
pub(super) fn query_paths(query: &Query, out: &mut Vec<Path>) {
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

pub(super) type Bits = Vec<u64>;

pub(super) fn and(a: &mut Bits, b: &Bits) {
    a.iter_mut().zip(b).for_each(|(x, y)| *x &= y);
}

pub(super) fn or(a: &mut Bits, b: &Bits) {
    a.iter_mut().zip(b).for_each(|(x, y)| *x |= y);
}

pub(super) fn not(a: &mut Bits, live: &Bits) {
    a.iter_mut().zip(live).for_each(|(x, l)| *x = !*x & l);
}

impl Table {
    /// The documents matching `query` (a subset of the live ones); None
    /// where a leaf cannot be judged here.
    pub(super) fn matched(&self, query: &Query) -> Option<Bits> {
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

    pub(super) fn at_least(&self, min: usize, qs: &[Query]) -> Option<Bits> {
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
    pub(super) fn predicate(&self, p: &Predicate) -> Option<Bits> {
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

    pub(super) fn leaf(&self, leaf: &Predicate) -> Option<Bits> {
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

pub(super) fn each_bit(bits: &Bits, mut f: impl FnMut(usize)) {
    for (w, &word) in bits.iter().enumerate() {
        let mut rest = word;
        while rest != 0 {
            let bit = rest.trailing_zeros() as usize;
            f(w * 64 + bit);
            rest &= rest - 1;
        }
    }
}

pub(super) fn popcount(bits: &Bits) -> u64 {
    bits.iter().map(|w| u64::from(w.count_ones())).sum()
}

impl Table {
    /// Groups of `aggregates` over the documents in `bits`, computed once
    /// per distinct combination of the fields' values.
    pub(super) fn aggregate(
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
