//! COUNT / SUM / MIN / MAX / AVG, optionally GROUP BY a field, run in the
//! engine over JSON documents: each pair is examined where the store's
//! iterator holds it, only the named fields are decoded, and only one row
//! per group leaves.
//!
//! `count(*)` counts rows; `count(f)` rows where `f` is present and not
//! null; `sum`, `avg`, `min`, `max` take the numeric values of `f` and
//! ignore rows where it is missing or not a number (an aggregate over no
//! numbers is null). Sums of integers are exact (i128); once a float is
//! seen they are f64. Groups are keyed by the group field's JSON text
//! (`"VLDB"`, `2010`); rows without the field form the group `null`.

use crate::expr::{parse, ParseError, Path, Predicate};
use crate::format::{Access, Layout, Val};
use crate::predicate::{FieldPredicate, MalformedValue};
use crate::scan::{key_parts, part_range, KeyPart, ScanError, ScanStats};
use sluice_store::{Snapshot, Store};
use sonic_rs::JsonValueTrait;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Bound;

/// Most groups one aggregation may hold in memory.
pub const MAX_GROUPS: usize = 1 << 20;
/// Most aggregates one query may compute.
pub const MAX_AGGREGATES: usize = 64;

/// An aggregate function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    /// Rows (`count(*)`) or present values of a field.
    Count,
    /// Sum of a numeric field.
    Sum,
    /// Smallest value of a numeric field.
    Min,
    /// Largest value of a numeric field.
    Max,
    /// Mean of a numeric field.
    Avg,
}

/// One aggregate: a function over a field (None: `count(*)`).
#[derive(Debug, Clone, PartialEq)]
pub struct Aggregate {
    /// The function.
    pub func: Func,
    /// The field it reads (None: `count(*)`).
    pub path: Option<Path>,
}

impl fmt::Display for Aggregate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.func {
            Func::Count => "count",
            Func::Sum => "sum",
            Func::Min => "min",
            Func::Max => "max",
            Func::Avg => "avg",
        };
        match &self.path {
            Some(p) => write!(f, "{name}({p})"),
            None => write!(f, "{name}(*)"),
        }
    }
}

fn path_of(text: &str, whole: &str, offset: usize) -> Result<Path, ParseError> {
    match parse(&format!("EXISTS {text}")) {
        Ok(Predicate::Exists(p)) => Ok(p),
        _ => Err(ParseError {
            text: whole.to_string(),
            column: whole[..offset].chars().count() + 1,
            message: format!("{text:?} is not a field path"),
        }),
    }
}

/// Parses `count(*), avg(year), max(meta.pages)`.
pub fn parse_aggregates(text: &str) -> Result<Vec<Aggregate>, ParseError> {
    let error = |offset: usize, message: String| ParseError {
        text: text.to_string(),
        column: text[..offset].chars().count() + 1,
        message,
    };
    let mut out = Vec::new();
    let mut offset = 0;
    for part in text.split(',') {
        let lead = part.len() - part.trim_start().len();
        let at = offset + lead;
        let item = part.trim();
        let Some((name, rest)) = item.split_once('(') else {
            return Err(error(at, format!("expected name(field), found {item:?}")));
        };
        let Some(inner) = rest.strip_suffix(')') else {
            return Err(error(at + item.len(), "expected \")\"".into()));
        };
        let func = match name.trim().to_ascii_lowercase().as_str() {
            "count" => Func::Count,
            "sum" => Func::Sum,
            "min" => Func::Min,
            "max" => Func::Max,
            "avg" => Func::Avg,
            other => {
                return Err(error(
                    at,
                    format!("unknown aggregate {other:?}: use count, sum, min, max or avg"),
                ))
            }
        };
        let inner_at = at + name.len() + 1;
        let path = match inner.trim() {
            "*" if func == Func::Count => None,
            "*" => return Err(error(inner_at, "only count takes *".into())),
            field => Some(path_of(field, text, inner_at)?),
        };
        out.push(Aggregate { func, path });
        if out.len() > MAX_AGGREGATES {
            return Err(error(at, format!("more than {MAX_AGGREGATES} aggregates")));
        }
        offset += part.len() + 1;
    }
    Ok(out)
}

/// A running sum that stays exact while only integers come.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sum {
    Int(i128),
    Float(f64),
}

impl Sum {
    fn merge(self, other: Sum) -> Sum {
        match (self, other) {
            (Sum::Int(a), Sum::Int(b)) => Sum::Int(a + b),
            (a, b) => Sum::Float(a.as_f64() + b.as_f64()),
        }
    }

    /// Adds a number: `exact` when it is an integer, `x` its f64 value.
    fn add(self, exact: Option<i64>, x: f64) -> Sum {
        match (self, exact) {
            (Sum::Int(s), Some(i)) => Sum::Int(s + i as i128),
            (Sum::Int(s), None) => Sum::Float(s as f64 + x),
            (Sum::Float(s), _) => Sum::Float(s + x),
        }
    }

    fn as_f64(self) -> f64 {
        match self {
            Sum::Int(i) => i as f64,
            Sum::Float(x) => x,
        }
    }
}

/// The state of one aggregate in one group.
#[derive(Debug, Clone, PartialEq)]
struct Acc {
    count: u64,
    sum: Sum,
    min: Option<f64>,
    max: Option<f64>,
}

impl Acc {
    fn merge(&mut self, other: &Acc) {
        self.count += other.count;
        self.sum = self.sum.merge(other.sum);
        let pick = |a: Option<f64>, b: Option<f64>, f: fn(f64, f64) -> f64| match (a, b) {
            (Some(x), Some(y)) => Some(f(x, y)),
            (x, y) => x.or(y),
        };
        self.min = pick(self.min, other.min, f64::min);
        self.max = pick(self.max, other.max, f64::max);
    }

    /// Counts one value of a field (a null counts for nothing; `count`
    /// of a field counts any other value, the rest only numbers).
    fn add(&mut self, func: Func, v: &Val<'_>) {
        if v.is_null() {
            return;
        }
        if func == Func::Count {
            self.count += 1;
            return;
        }
        let Some(x) = v.as_f64() else { return };
        self.count += 1;
        self.sum = self.sum.add(v.as_i64(), x);
        self.min = Some(self.min.map_or(x, |m| m.min(x)));
        self.max = Some(self.max.map_or(x, |m| m.max(x)));
    }

    /// This share, counted for `n` documents.
    fn times(self, n: u64) -> Acc {
        if n == 1 {
            return self;
        }
        Acc {
            count: self.count * n,
            sum: match self.sum {
                Sum::Int(i) => Sum::Int(i * i128::from(n)),
                Sum::Float(x) => Sum::Float(x * n as f64),
            },
            ..self
        }
    }

    fn new() -> Self {
        Acc {
            count: 0,
            sum: Sum::Int(0),
            min: None,
            max: None,
        }
    }
}

/// A finished aggregate value.
#[derive(Debug, Clone, PartialEq)]
pub enum AggValue {
    /// An integer (counts, sums of integers, their min and max).
    Int(i128),
    /// A float (averages, anything over floats).
    Float(f64),
    /// No value (min, max or avg over no rows).
    Null,
}

impl fmt::Display for AggValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AggValue::Int(i) => write!(f, "{i}"),
            AggValue::Float(x) => write!(f, "{x}"),
            AggValue::Null => f.write_str("null"),
        }
    }
}

/// One output row: the group's key (JSON text; None without GROUP BY) and
/// one value per aggregate.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupRow {
    /// The group's key as JSON text (None without GROUP BY).
    pub group: Option<String>,
    /// One value per aggregate, in order.
    pub values: Vec<AggValue>,
}

/// One aggregation over a key range of a JSON or record keyspace.
pub struct AggregateSpec<'a> {
    /// The keyspace aggregated.
    pub keyspace: u32,
    /// The keyspace's value format; fields are checked against it first.
    pub layout: &'a Layout,
    /// The key range aggregated.
    pub range: (Bound<&'a [u8]>, Bound<&'a [u8]>),
    /// Rows must match it (None: every row).
    pub predicate: Option<&'a FieldPredicate>,
    /// The aggregates computed.
    pub aggregates: &'a [Aggregate],
    /// One group per value of this field (None: one group).
    pub group_by: Option<&'a Path>,
    /// Worker threads, each over a disjoint part of the key range (cut at
    /// table boundaries); their groups are merged at the end.
    pub threads: usize,
    /// Arrays hold several values, as Elasticsearch reads them: a document
    /// whose group field is an array falls in one group per distinct
    /// element, and an aggregate over an array takes each element. Off, an
    /// array is one value (its JSON text as a group; no number).
    pub multi_valued: bool,
}

type Groups = BTreeMap<Option<String>, Vec<Acc>>;

/// Runs the aggregation; rows come ordered by group key text.
#[expect(
    clippy::expect_used,
    reason = "a worker that panicked ends the aggregation: it has no sound result"
)]
pub fn aggregate(
    store: &Store,
    spec: &AggregateSpec<'_>,
) -> Result<(Vec<GroupRow>, ScanStats), ScanError> {
    // Fields are checked against the declared format before any work.
    for a in spec.aggregates {
        if let (Some(p), true) = (&a.path, a.func != Func::Count) {
            spec.layout.check_numeric(p, &a.to_string())?;
        } else if let Some(p) = &a.path {
            spec.layout.check_path(p)?;
        }
    }
    if let Some(g) = spec.group_by {
        spec.layout.check_path(g)?;
    }
    let parts = key_parts(store, spec.keyspace, spec.range, spec.threads)?;
    // One snapshot for every worker: the parts add up to one consistent
    // view.
    let snapshot = store.snapshot();
    let snapshot = &snapshot;
    let results: Vec<Result<(Groups, ScanStats), ScanError>> = if parts.len() == 1 {
        vec![aggregate_part(store, snapshot, spec, &parts[0])]
    } else {
        std::thread::scope(|scope| {
            let handles: Vec<_> = parts
                .iter()
                .map(|part| scope.spawn(move || aggregate_part(store, snapshot, spec, part)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("an aggregation worker panicked"))
                .collect()
        })
    };
    let mut groups = Groups::new();
    let mut stats = ScanStats::default();
    for r in results {
        let (g, s) = r?;
        stats.rows_examined += s.rows_examined;
        stats.bytes_examined += s.bytes_examined;
        stats.rows_returned += s.rows_returned;
        for (key, accs) in g {
            match groups.get_mut(&key) {
                Some(mine) => mine.iter_mut().zip(&accs).for_each(|(m, a)| m.merge(a)),
                None => {
                    groups.insert(key, accs);
                }
            }
        }
        if groups.len() > MAX_GROUPS {
            return Err(too_many_groups());
        }
    }
    let rows = groups
        .into_iter()
        .map(|(group, accs)| GroupRow {
            group,
            values: spec
                .aggregates
                .iter()
                .zip(accs)
                .map(|(a, acc)| finish(a.func, &acc))
                .collect(),
        })
        .collect();
    Ok((rows, stats))
}

fn too_many_groups() -> ScanError {
    ScanError::Sink(format!(
        "more than {MAX_GROUPS} groups: group by a field with fewer values"
    ))
}

/// One worker: the groups of the keys in `[part.0, part.1)`.
fn aggregate_part(
    store: &Store,
    snapshot: &Snapshot,
    spec: &AggregateSpec<'_>,
    part: &KeyPart,
) -> Result<(Groups, ScanStats), ScanError> {
    let range = part_range(part);
    let layout = spec.layout;
    let accesses: Vec<Option<Access>> = spec
        .aggregates
        .iter()
        .map(|a| a.path.as_ref().map(|p| layout.access(p)))
        .collect();
    let group_access = spec.group_by.map(|p| layout.access(p));
    let mut groups = Groups::new();
    let mut work = RowWork::default();
    let mut iter = store.iter(spec.keyspace, range, snapshot, false);
    let mut stats = ScanStats::default();
    while let Some((key, value)) = iter.next_ref()? {
        stats.rows_examined += 1;
        stats.bytes_examined += (key.len() + value.len()) as u64;
        let malformed = |error: MalformedValue| ScanError::Malformed {
            key: crate::scan::key_text(key),
            error,
        };
        let lookup = |a: &Access| layout.get(value, a).map_err(malformed);
        if let Some(p) = spec.predicate {
            if !p.matches(value).map_err(malformed)? {
                continue;
            }
        }
        let group = match &group_access {
            Some(a) => lookup(a)?,
            None => None,
        };
        let mut field = |i: usize| match &accesses[i] {
            Some(a) => lookup(a),
            None => Ok(None),
        };
        let row = DocRow {
            group,
            field: &mut field,
            weight: 1,
        };
        add_row(
            &mut groups,
            spec.aggregates,
            row,
            spec.multi_valued,
            &mut work,
        )?;
        stats.rows_returned += 1;
    }
    Ok((groups, stats))
}

/// The fields one document (or a set of documents with equal fields)
/// brings to an aggregation.
struct DocRow<'v, 'd> {
    /// The group field's value.
    group: Option<Val<'d>>,
    /// The value of the field of aggregate `i` (None for `count(*)`),
    /// looked up when it is added.
    field: &'v mut dyn FnMut(usize) -> Result<Option<Val<'d>>, ScanError>,
    /// How many documents hold these values.
    weight: u64,
}

/// Buffers reused from row to row.
#[derive(Default)]
struct RowWork {
    groups: Vec<Option<String>>,
    accs: Vec<Acc>,
}

/// Adds a row's share of each aggregate to each group it is in.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: JSON text is UTF-8"
)]
fn add_row(
    groups: &mut Groups,
    aggregates: &[Aggregate],
    row: DocRow<'_, '_>,
    multi_valued: bool,
    work: &mut RowWork,
) -> Result<(), ScanError> {
    work.groups.clear();
    if let Some(v) = &row.group {
        each_value(v, multi_valued, &mut |v| {
            let mut text = Vec::new();
            v.write_json(&mut text);
            work.groups
                .push(Some(String::from_utf8(text).expect("JSON text is UTF-8")));
        });
        work.groups.sort_unstable();
        work.groups.dedup();
    }
    if work.groups.is_empty() {
        work.groups.push(None);
    }
    work.accs.clear();
    for (i, agg) in aggregates.iter().enumerate() {
        let mut acc = Acc::new();
        match &agg.path {
            None => acc.count = 1,
            Some(_) => {
                if let Some(v) = (row.field)(i)? {
                    each_value(&v, multi_valued, &mut |v| acc.add(agg.func, v));
                }
            }
        }
        work.accs.push(acc.times(row.weight));
    }
    for group in work.groups.drain(..) {
        if !groups.contains_key(&group) && groups.len() >= MAX_GROUPS {
            return Err(too_many_groups());
        }
        let accs = groups
            .entry(group)
            .or_insert_with(|| vec![Acc::new(); aggregates.len()]);
        accs.iter_mut()
            .zip(&work.accs)
            .for_each(|(a, d)| a.merge(d));
    }
    Ok(())
}

/// One distinct combination of values, as JSON text, and how many
/// documents hold it: the input of [`aggregate_rows`].
#[derive(Debug, Clone)]
pub struct ValueRow<'a> {
    /// The group field's value (None: absent).
    pub group: Option<&'a [u8]>,
    /// The value of each aggregate's field, in the order of the
    /// aggregates (None: absent, or the aggregate is `count(*)`).
    pub fields: Vec<Option<&'a [u8]>>,
    /// Documents holding these values.
    pub weight: u64,
}

/// Runs aggregates over rows of values already taken out of their
/// documents (an in-memory column, say) with exactly the semantics of
/// [`aggregate`]: each row counts as `weight` documents holding those
/// values. Rows come ordered by group key text.
pub fn aggregate_rows<'a>(
    aggregates: &[Aggregate],
    multi_valued: bool,
    rows: impl IntoIterator<Item = ValueRow<'a>>,
) -> Result<Vec<GroupRow>, ScanError> {
    let mut groups = Groups::new();
    let mut work = RowWork::default();
    let value = |raw: Option<&'a [u8]>| -> Result<Option<Val<'a>>, ScanError> {
        match raw {
            None => Ok(None),
            Some(raw) => crate::format::json_value(raw).map_err(|error| ScanError::Malformed {
                key: String::from("(column value)"),
                error,
            }),
        }
    };
    for row in rows {
        assert_eq!(
            row.fields.len(),
            aggregates.len(),
            "one field per aggregate"
        );
        let mut field = |i: usize| value(row.fields[i]);
        let doc = DocRow {
            group: value(row.group)?,
            field: &mut field,
            weight: row.weight,
        };
        add_row(&mut groups, aggregates, doc, multi_valued, &mut work)?;
    }
    Ok(groups
        .into_iter()
        .map(|(group, accs)| GroupRow {
            group,
            values: aggregates
                .iter()
                .zip(accs)
                .map(|(a, acc)| finish(a.func, &acc))
                .collect(),
        })
        .collect())
}

/// Calls `f` with the value, or (`multi_valued`) with each element of an
/// array, nested arrays flattened as Elasticsearch does; nulls are passed
/// over.
fn each_value(v: &Val<'_>, multi_valued: bool, f: &mut dyn FnMut(&Val<'_>)) {
    match v {
        Val::Json(j) if multi_valued && j.get_type() == sonic_rs::JsonType::Array => {
            for element in sonic_rs::to_array_iter(j.as_raw_str()).flatten() {
                each_value(&Val::Json(element), true, f);
            }
        }
        v if v.is_null() => {}
        v => f(v),
    }
}

#[expect(
    clippy::expect_used,
    reason = "a group with a count has its min and max"
)]
fn finish(func: Func, acc: &Acc) -> AggValue {
    let exact = |x: f64| {
        if x.fract() == 0.0 && x.abs() < 9.0e15 {
            AggValue::Int(x as i128)
        } else {
            AggValue::Float(x)
        }
    };
    match func {
        Func::Count => AggValue::Int(acc.count as i128),
        _ if acc.count == 0 => AggValue::Null,
        Func::Sum => match acc.sum {
            Sum::Int(i) => AggValue::Int(i),
            Sum::Float(x) => AggValue::Float(x),
        },
        Func::Avg => AggValue::Float(acc.sum.as_f64() / acc.count as f64),
        Func::Min => exact(acc.min.expect("counted")),
        Func::Max => exact(acc.max.expect("counted")),
    }
}
