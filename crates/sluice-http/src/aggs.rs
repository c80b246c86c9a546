//! Aggregations run by the near-data aggregates ([`sluice_ndp::aggregate`]):
//! the metrics `avg`, `sum`, `min`, `max`, `value_count`, `stats`, and
//! `terms` buckets with metric sub-aggregations. Only the group rows leave
//! the scan. Each metric is computed from count, sum, min and max of its
//! field, which also merge across indices.
//!
//! Differences from Elasticsearch, refused rather than answered wrongly:
//! a query with `ids` or a counted `should` (not one predicate), nested
//! bucket aggregations, and other aggregation types are 400 errors.
//! Arrays are multi-valued as in Elasticsearch: a document falls in the
//! bucket of each distinct element, and metrics take every element.

use crate::catalog::Index;
use crate::dsl::Query;
use crate::error::{ApiError, ApiResult};
use serde_json::{json, Map, Value};
use sluice_ndp::aggregate::{aggregate, AggValue, Aggregate, AggregateSpec, Func, GroupRow};
use sluice_ndp::expr::{Path, Step};
use sluice_ndp::Layout;
use sluice_store::Store;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

/// Most buckets a `terms` aggregation returns.
pub const MAX_TERMS_SIZE: usize = 65_536;

/// A metric aggregation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// `avg`.
    Avg,
    /// `sum`.
    Sum,
    /// `min`.
    Min,
    /// `max`.
    Max,
    /// `value_count`.
    ValueCount,
    /// `stats`.
    Stats,
}

/// One requested aggregation.
#[derive(Debug, Clone)]
pub enum AggRequest {
    /// A metric over a field.
    Metric {
        /// Its name in the response.
        name: String,
        /// Which.
        metric: Metric,
        /// The field.
        field: String,
    },
    /// Buckets by a field's values, with metric sub-aggregations.
    Terms {
        /// Its name in the response.
        name: String,
        /// The field.
        field: String,
        /// Buckets returned.
        size: usize,
        /// Bucket the documents without the field under this key.
        missing: Option<Value>,
        /// Metrics inside each bucket: (name, metric, field).
        subs: Vec<(String, Metric, String)>,
    },
}

fn metric_of(kind: &str) -> Option<Metric> {
    Some(match kind {
        "avg" => Metric::Avg,
        "sum" => Metric::Sum,
        "min" => Metric::Min,
        "max" => Metric::Max,
        "value_count" => Metric::ValueCount,
        "stats" => Metric::Stats,
        _ => return None,
    })
}

fn field_of(body: &Value, name: &str, kind: &str) -> ApiResult<String> {
    if body.get("script").is_some() {
        return Err(ApiError::illegal(format!(
            "[{name}]: scripts are not supported by Sluice's aggregations; name a [field]"
        )));
    }
    body.get("field")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| ApiError::illegal(format!("Required one of fields [field, script], but none were specified. ([{kind}] aggregation [{name}])")))
}

fn one_kind<'a>(name: &str, def: &'a Value) -> ApiResult<(&'a str, &'a Value, Option<&'a Value>)> {
    let obj = def.as_object().ok_or_else(|| {
        ApiError::parsing(format!(
            "Expected [START_OBJECT] under aggregation [{name}]"
        ))
    })?;
    let subs = obj.get("aggs").or_else(|| obj.get("aggregations"));
    let mut kinds = obj
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "aggs" | "aggregations" | "meta"));
    match (kinds.next(), kinds.next()) {
        (Some((k, v)), None) => Ok((k.as_str(), v, subs)),
        (None, _) => Err(ApiError::parsing(format!(
            "Missing definition for aggregation [{name}]"
        ))),
        (Some((a, _)), Some((b, _))) => Err(ApiError::parsing(format!(
            "Found two aggregation type definitions in [{name}]: [{a}] and [{b}]"
        ))),
    }
}

/// Parses the `aggs` (or `aggregations`) object of a search.
pub fn parse(aggs: &Value) -> ApiResult<Vec<AggRequest>> {
    let obj = aggs
        .as_object()
        .ok_or_else(|| ApiError::parsing("[aggs] must be an object"))?;
    let mut out = Vec::new();
    for (name, def) in obj {
        let (kind, body, subs) = one_kind(name, def)?;
        if let Some(metric) = metric_of(kind) {
            if subs.is_some() {
                return Err(ApiError::parsing(format!(
                    "Aggregator [{name}] of type [{kind}] cannot accept sub-aggregations"
                )));
            }
            out.push(AggRequest::Metric {
                name: name.clone(),
                metric,
                field: field_of(body, name, kind)?,
            });
            continue;
        }
        if kind != "terms" {
            return Err(ApiError::parsing(format!(
                "Unknown aggregation type [{kind}] did you mean [terms]? (Sluice serves terms, avg, sum, min, max, value_count and stats)"
            )));
        }
        let size = match body.get("size") {
            None => 10,
            Some(v) => v
                .as_u64()
                .filter(|n| (1..=MAX_TERMS_SIZE as u64).contains(n))
                .ok_or_else(|| {
                    ApiError::illegal(format!(
                        "[size] must be from 1 to {MAX_TERMS_SIZE} in [{name}]"
                    ))
                })? as usize,
        };
        if let Some(k) = body.as_object().and_then(|m| {
            m.keys()
                .find(|k| !matches!(k.as_str(), "field" | "size" | "missing" | "shard_size"))
        }) {
            return Err(ApiError::parsing(format!(
                "[terms] aggregation [{name}] does not support [{k}] in Sluice"
            )));
        }
        let mut sub_metrics = Vec::new();
        if let Some(subs) = subs {
            let m = subs
                .as_object()
                .ok_or_else(|| ApiError::parsing("[aggs] must be an object"))?;
            for (sub_name, sub_def) in m {
                let (sub_kind, sub_body, nested) = one_kind(sub_name, sub_def)?;
                let metric = metric_of(sub_kind).filter(|_| nested.is_none()).ok_or_else(|| {
                    ApiError::illegal(format!(
                        "[{sub_name}] inside [{name}]: Sluice runs metric aggregations (avg, sum, min, max, value_count, stats) inside terms buckets, not [{sub_kind}]"
                    ))
                })?;
                sub_metrics.push((
                    sub_name.clone(),
                    metric,
                    field_of(sub_body, sub_name, sub_kind)?,
                ));
            }
        }
        out.push(AggRequest::Terms {
            name: name.clone(),
            field: field_of(body, name, kind)?,
            size,
            missing: body.get("missing").cloned(),
            subs: sub_metrics,
        });
    }
    Ok(out)
}

fn path(field: &str) -> Path {
    Path {
        steps: field.split('.').map(|s| Step::Key(s.to_string())).collect(),
    }
}

/// count, sum, min, max of one field, merged over indices.
#[derive(Debug, Clone, Default)]
struct Acc {
    count: i128,
    sum: Option<f64>,
    min: Option<f64>,
    max: Option<f64>,
}

fn as_f64(v: &AggValue) -> Option<f64> {
    match v {
        AggValue::Int(i) => Some(*i as f64),
        AggValue::Float(f) => Some(*f),
        AggValue::Null => None,
    }
}

impl Acc {
    fn merge(&mut self, o: &Acc) {
        self.count += o.count;
        if let Some(s) = o.sum {
            self.sum = Some(self.sum.unwrap_or(0.0) + s);
        }
        if let Some(m) = o.min {
            self.min = Some(self.min.map_or(m, |x| x.min(m)));
        }
        if let Some(m) = o.max {
            self.max = Some(self.max.map_or(m, |x| x.max(m)));
        }
    }

    fn add(&mut self, values: &[AggValue]) {
        if let AggValue::Int(c) = values[0] {
            self.count += c;
        }
        if let Some(s) = as_f64(&values[1]) {
            self.sum = Some(self.sum.unwrap_or(0.0) + s);
        }
        if let Some(m) = as_f64(&values[2]) {
            self.min = Some(self.min.map_or(m, |x| x.min(m)));
        }
        if let Some(m) = as_f64(&values[3]) {
            self.max = Some(self.max.map_or(m, |x| x.max(m)));
        }
    }

    fn render(&self, metric: Metric) -> Value {
        let avg = if self.count > 0 {
            self.sum.map(|s| s / self.count as f64)
        } else {
            None
        };
        match metric {
            Metric::Avg => json!({ "value": avg }),
            Metric::Sum => json!({ "value": self.sum.unwrap_or(0.0) }),
            Metric::Min => json!({ "value": self.min }),
            Metric::Max => json!({ "value": self.max }),
            Metric::ValueCount => json!({ "value": self.count }),
            Metric::Stats => json!({
                "count": self.count,
                "min": self.min,
                "max": self.max,
                "avg": avg,
                "sum": self.sum.unwrap_or(0.0),
            }),
        }
    }
}

fn four(field: &str) -> [Aggregate; 4] {
    let p = Some(path(field));
    [
        Aggregate {
            func: Func::Count,
            path: p.clone(),
        },
        Aggregate {
            func: Func::Sum,
            path: p.clone(),
        },
        Aggregate {
            func: Func::Min,
            path: p.clone(),
        },
        Aggregate {
            func: Func::Max,
            path: p,
        },
    ]
}

fn run_ndp(
    store: &Store,
    index: &Index,
    query: &Query,
    aggregates: &[Aggregate],
    group_by: Option<&Path>,
) -> ApiResult<Vec<GroupRow>> {
    let predicate = match query {
        Query::All => None,
        Query::Pred(p, _) => Some(&**p),
        _ => {
            return Err(ApiError::illegal(
                "aggregations run as one near-data predicate: a query with [ids] or a [minimum_should_match] above 1 cannot be aggregated in Sluice; express it with term/terms/range/bool",
            ))
        }
    };
    if let Some(rows) = index
        .columns
        .aggregate(store, index.docs, query, aggregates, group_by)
    {
        return rows.map_err(ApiError::store);
    }
    let layout = Layout::json_undeclared();
    let spec = AggregateSpec {
        keyspace: index.docs,
        layout: &layout,
        range: (Bound::Unbounded, Bound::Unbounded),
        predicate,
        aggregates,
        group_by,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        multi_valued: true,
    };
    aggregate(store, &spec)
        .map(|(rows, _)| rows)
        .map_err(ApiError::store)
}

fn bucket_key(group: &str) -> Value {
    serde_json::from_str(group).unwrap_or_else(|_| Value::String(group.to_string()))
}

fn key_order(a: &Value, b: &Value) -> std::cmp::Ordering {
    crate::search::compare_values(a, b)
}

/// One scan: grouped by a field (or not), computing `count(*)` then count,
/// sum, min and max of each field of `fields`.
struct Scan {
    group: Option<String>,
    fields: Vec<String>,
    /// Group key text (None: no group or no value) → (rows, one Acc per field).
    groups: BTreeMap<Option<String>, (i128, Vec<Acc>)>,
}

impl Scan {
    fn run(&mut self, store: &Store, indices: &[Arc<Index>], query: &Query) -> ApiResult<()> {
        let mut aggregates = vec![Aggregate {
            func: Func::Count,
            path: None,
        }];
        for f in &self.fields {
            aggregates.extend(four(f));
        }
        let group = self.group.as_deref().map(path);
        for index in indices {
            for row in run_ndp(store, index, query, &aggregates, group.as_ref())? {
                let key = row.group.clone().filter(|g| g != "null");
                let n = self.fields.len();
                let entry = self
                    .groups
                    .entry(key)
                    .or_insert_with(|| (0, vec![Acc::default(); n]));
                if let AggValue::Int(c) = row.values[0] {
                    entry.0 += c;
                }
                for (i, acc) in entry.1.iter_mut().enumerate() {
                    acc.add(&row.values[1 + 4 * i..5 + 4 * i]);
                }
            }
        }
        Ok(())
    }

    /// Every group merged: the whole matched set.
    fn merged(&self, field: &str) -> Acc {
        let i = self.fields.iter().position(|f| f == field).unwrap_or(0);
        let mut acc = Acc::default();
        for (_, accs) in self.groups.values() {
            acc.merge(&accs[i]);
        }
        acc
    }

    fn total(&self) -> u64 {
        self.groups
            .values()
            .map(|(c, _)| u64::try_from(*c).unwrap_or(0))
            .sum()
    }
}

/// The aggregations' results, and the number of documents the query
/// matched (one scan answers both).
pub struct Aggregated {
    /// The `aggregations` object.
    pub aggregations: Value,
    /// Documents matched.
    pub total: u64,
}

/// Runs the aggregations over `indices` for the documents `query` matches:
/// one near-data scan per distinct `terms` field (the first also computing
/// the top-level metrics, merged over its groups), or one ungrouped scan.
pub fn run(
    store: &Store,
    indices: &[Arc<Index>],
    query: &Query,
    requests: &[AggRequest],
) -> ApiResult<Aggregated> {
    let mut metric_fields: Vec<String> = Vec::new();
    for r in requests {
        if let AggRequest::Metric { field, .. } = r {
            if !metric_fields.contains(field) {
                metric_fields.push(field.clone());
            }
        }
    }
    let mut scans: Vec<Scan> = Vec::new();
    for r in requests {
        if let AggRequest::Terms { field, subs, .. } = r {
            let scan = match scans
                .iter_mut()
                .position(|s| s.group.as_deref() == Some(field))
            {
                Some(i) => &mut scans[i],
                None => {
                    scans.push(Scan {
                        group: Some(field.clone()),
                        fields: Vec::new(),
                        groups: BTreeMap::new(),
                    });
                    let last = scans.len() - 1;
                    &mut scans[last]
                }
            };
            for (_, _, f) in subs {
                if !scan.fields.contains(f) {
                    scan.fields.push(f.clone());
                }
            }
        }
    }
    if scans.is_empty() {
        scans.push(Scan {
            group: None,
            fields: Vec::new(),
            groups: BTreeMap::new(),
        });
    }
    for f in &metric_fields {
        if !scans[0].fields.contains(f) {
            scans[0].fields.push(f.clone());
        }
    }
    for scan in &mut scans {
        scan.run(store, indices, query)?;
    }
    let mut out = Map::new();
    for r in requests {
        match r {
            AggRequest::Metric {
                name,
                metric,
                field,
            } => {
                out.insert(name.clone(), scans[0].merged(field).render(*metric));
            }
            AggRequest::Terms {
                name,
                field,
                size,
                missing,
                subs,
            } => {
                let Some(scan) = scans.iter().find(|s| s.group.as_deref() == Some(field)) else {
                    continue;
                };
                out.insert(name.clone(), buckets(scan, *size, missing.as_ref(), subs));
            }
        }
    }
    Ok(Aggregated {
        aggregations: Value::Object(out),
        total: scans[0].total(),
    })
}

fn buckets(
    scan: &Scan,
    size: usize,
    missing: Option<&Value>,
    subs: &[(String, Metric, String)],
) -> Value {
    let mut merged: BTreeMap<String, (i128, Vec<Acc>)> = BTreeMap::new();
    for (key, (count, accs)) in &scan.groups {
        let key = match (key, missing) {
            (Some(g), _) => g.clone(),
            (None, Some(m)) => m.to_string(),
            (None, None) => continue,
        };
        let entry = merged
            .entry(key)
            .or_insert_with(|| (0, vec![Acc::default(); accs.len()]));
        entry.0 += count;
        for (a, b) in entry.1.iter_mut().zip(accs) {
            a.merge(b);
        }
    }
    let mut rows: Vec<(Value, i128, Vec<Acc>)> = merged
        .into_iter()
        .map(|(k, (c, accs))| (bucket_key(&k), c, accs))
        .collect();
    rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| key_order(&a.0, &b.0)));
    let other: i128 = rows.iter().skip(size).map(|r| r.1).sum();
    let shown: Vec<Value> = rows
        .into_iter()
        .take(size)
        .map(|(key, count, accs)| {
            let mut b = Map::new();
            if let Value::Bool(v) = key {
                b.insert("key".into(), json!(i32::from(v)));
                b.insert("key_as_string".into(), json!(v.to_string()));
            } else {
                b.insert("key".into(), key);
            }
            b.insert("doc_count".into(), json!(count));
            for (sub_name, metric, f) in subs {
                let i = scan.fields.iter().position(|x| x == f).unwrap_or(0);
                b.insert(sub_name.clone(), accs[i].render(*metric));
            }
            Value::Object(b)
        })
        .collect();
    json!({"doc_count_error_upper_bound": 0, "sum_other_doc_count": other, "buckets": shown})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_metrics_and_terms_and_refuses_the_rest() {
        let r = parse(&json!({"v": {"terms": {"field": "venue", "size": 3}, "aggs": {"y": {"avg": {"field": "year"}}}}, "s": {"stats": {"field": "pages"}}})).unwrap();
        assert_eq!(r.len(), 2);
        assert!(parse(&json!({"h": {"histogram": {"field": "year", "interval": 5}}})).is_err());
        assert!(parse(&json!({"a": {"avg": {"script": "x"}}})).is_err());
        assert!(parse(
            &json!({"t": {"terms": {"field": "v"}, "aggs": {"n": {"terms": {"field": "w"}}}}})
        )
        .is_err());
    }
}
