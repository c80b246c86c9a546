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

use crate::expr::{parse, ParseError, Path, Predicate, Step};
use crate::json::{JsonPredicate, MalformedJson};
use crate::scan::{ScanError, ScanStats};
use sluice_store::Store;
use sonic_rs::{JsonNumberTrait, JsonValueTrait, PointerNode};
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Bound;

/// Most groups one aggregation may hold in memory.
pub const MAX_GROUPS: usize = 1 << 20;
/// Most aggregates one query may compute.
pub const MAX_AGGREGATES: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    Count,
    Sum,
    Min,
    Max,
    Avg,
}

/// One aggregate: a function over a field (None: `count(*)`).
#[derive(Debug, Clone, PartialEq)]
pub struct Aggregate {
    pub func: Func,
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
    fn add(self, n: &sonic_rs::Number) -> Sum {
        match (self, n.as_i64()) {
            (Sum::Int(s), Some(i)) => Sum::Int(s + i as i128),
            (Sum::Int(s), None) => Sum::Float(s as f64 + n.as_f64().unwrap_or(0.0)),
            (Sum::Float(s), _) => Sum::Float(s + n.as_f64().unwrap_or(0.0)),
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
    Int(i128),
    Float(f64),
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
    pub group: Option<String>,
    pub values: Vec<AggValue>,
}

fn pointer(p: &Path) -> Vec<PointerNode> {
    p.steps
        .iter()
        .map(|s| match s {
            Step::Key(k) => PointerNode::Key(k.clone().into()),
            Step::Index(i) => PointerNode::Index(*i),
        })
        .collect()
}

/// One aggregation over a key range of a JSON keyspace.
pub struct AggregateSpec<'a> {
    pub keyspace: u32,
    pub range: (Bound<&'a [u8]>, Bound<&'a [u8]>),
    pub predicate: Option<&'a JsonPredicate>,
    pub aggregates: &'a [Aggregate],
    pub group_by: Option<&'a Path>,
}

/// Runs the aggregation; rows come ordered by group key text.
pub fn aggregate(
    store: &Store,
    spec: &AggregateSpec<'_>,
) -> Result<(Vec<GroupRow>, ScanStats), ScanError> {
    let pointers: Vec<Option<Vec<PointerNode>>> = spec
        .aggregates
        .iter()
        .map(|a| a.path.as_ref().map(pointer))
        .collect();
    let group_pointer = spec.group_by.map(pointer);
    let mut groups: BTreeMap<Option<String>, Vec<Acc>> = BTreeMap::new();
    let snapshot = store.snapshot();
    let mut iter = store.iter(spec.keyspace, spec.range, &snapshot, false);
    let mut stats = ScanStats::default();
    while let Some((key, value)) = iter.next_ref()? {
        stats.rows_examined += 1;
        stats.bytes_examined += (key.len() + value.len()) as u64;
        let malformed = |error: MalformedJson| ScanError::Malformed {
            key: crate::scan::key_text(key),
            error,
        };
        let lookup = |p: &Vec<PointerNode>| match sonic_rs::get_from_slice(value, p) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_not_found() || e.is_unmatched_type() => Ok(None),
            Err(e) => Err(malformed(MalformedJson(e.to_string()))),
        };
        if let Some(p) = spec.predicate {
            if !p.matches(value).map_err(malformed)? {
                continue;
            }
        }
        let group = match &group_pointer {
            Some(p) => lookup(p)?
                .filter(|v| !v.is_null())
                .map(|v| v.as_raw_str().to_string()),
            None => None,
        };
        if !groups.contains_key(&group) && groups.len() >= MAX_GROUPS {
            return Err(ScanError::Sink(format!(
                "more than {MAX_GROUPS} groups: group by a field with fewer values"
            )));
        }
        let accs = groups
            .entry(group)
            .or_insert_with(|| vec![Acc::new(); spec.aggregates.len()]);
        for (i, agg) in spec.aggregates.iter().enumerate() {
            let acc = &mut accs[i];
            let Some(p) = &pointers[i] else {
                acc.count += 1;
                continue;
            };
            let Some(v) = lookup(p)? else { continue };
            if agg.func == Func::Count {
                acc.count += u64::from(!v.is_null());
                continue;
            }
            let Some(n) = v.as_number() else { continue };
            let Some(x) = n.as_f64() else { continue };
            acc.count += 1;
            acc.sum = acc.sum.add(&n);
            acc.min = Some(acc.min.map_or(x, |m| m.min(x)));
            acc.max = Some(acc.max.map_or(x, |m| m.max(x)));
        }
        stats.rows_returned += 1;
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
