//! Search execution on a store snapshot: the compiled query run on each
//! document in key order, hits in key order (`_doc`, `_shard_doc`) or by
//! field sort values; `from`/`size`, `search_after`, slices, total hits;
//! and the search contexts that scrolls and points in time keep.

use crate::catalog::Index;
use crate::dsl::Query;
use crate::error::{ApiError, ApiResult};
use serde_json::Value;
use sluice_store::{Snapshot, Store};
use std::cmp::Ordering;
use std::collections::HashMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `index.max_result_window`: most `from + size` of one search.
pub const MAX_RESULT_WINDOW: usize = 10_000;
/// `search.max_open_scroll_context`.
pub const MAX_SCROLL_CONTEXTS: usize = 500;
/// `search.max_open_pit_context` (OpenSearch's name; Elasticsearch has no
/// separate limit, the same bound applies).
pub const MAX_PIT_CONTEXTS: usize = 300;
/// `search.max_keep_alive`.
pub const MAX_KEEP_ALIVE: Duration = Duration::from_secs(24 * 3600);

/// One sort key.
#[derive(Debug, Clone, PartialEq)]
pub enum SortKey {
    /// Index order of the documents (`_doc`, `_shard_doc`, `_id`): key order.
    Doc {
        /// Descending.
        desc: bool,
    },
    /// `_score` (every hit scores 1.0 here).
    Score,
    /// A field's value.
    Field {
        /// The dotted path.
        path: String,
        /// Descending.
        desc: bool,
        /// Missing values first (`_first`) instead of last.
        missing_first: bool,
        /// An array sorts by its largest element (`mode: max`; the default
        /// descending) instead of its smallest.
        by_max: bool,
    },
}

/// Parses `sort` as Elasticsearch takes it: a name, `{name: order}`,
/// `{name: {"order":…, "missing":…}}`, or an array of those.
pub fn parse_sort(v: Option<&Value>) -> ApiResult<Vec<SortKey>> {
    let Some(v) = v else {
        return Ok(Vec::new());
    };
    let items: Vec<&Value> = match v {
        Value::Array(a) => a.iter().collect(),
        one => vec![one],
    };
    items.into_iter().map(parse_one_sort).collect()
}

/// Parses the `sort` URL parameter (`field:desc,other`).
pub fn parse_sort_param(text: &str) -> ApiResult<Vec<SortKey>> {
    text.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let (name, order) = s.split_once(':').unwrap_or((s, "asc"));
            parse_one_sort(&serde_json::json!({ name: order }))
        })
        .collect()
}

fn parse_one_sort(v: &Value) -> ApiResult<SortKey> {
    let (name, spec) = match v {
        Value::String(s) => (s.clone(), Value::Null),
        Value::Object(m) if m.len() == 1 => {
            let (k, s) = m
                .iter()
                .next()
                .ok_or_else(|| ApiError::parsing("empty sort"))?;
            (k.clone(), s.clone())
        }
        _ => return Err(ApiError::parsing(format!("malformed sort [{v}]"))),
    };
    let order = match &spec {
        Value::String(s) => Some(s.as_str()),
        Value::Object(m) => m.get("order").and_then(Value::as_str),
        _ => None,
    };
    let desc = match order {
        None => name == "_score",
        Some("asc") => false,
        Some("desc") => true,
        Some(o) => return Err(ApiError::illegal(format!("Unknown SortOrder [{o}]"))),
    };
    let missing_first = spec.get("missing").and_then(Value::as_str) == Some("_first");
    let by_max = match spec.get("mode").and_then(Value::as_str) {
        None => desc,
        Some("min") => false,
        Some("max") => true,
        Some(m @ ("avg" | "sum" | "median")) => {
            return Err(ApiError::illegal(format!(
                "sort mode [{m}] is not supported here: use min or max"
            )))
        }
        Some(m) => return Err(ApiError::illegal(format!("Unknown SortMode [{m}]"))),
    };
    Ok(match name.as_str() {
        "_doc" | "_shard_doc" | "_id" => SortKey::Doc { desc },
        "_score" => SortKey::Score,
        _ => SortKey::Field {
            path: name,
            desc,
            missing_first,
            by_max,
        },
    })
}

/// Key boundaries per documents keyspace: `max - 1` keys cutting it into
/// `max` ranges.
pub type SliceBounds = HashMap<u32, Vec<Vec<u8>>>;

/// A key range, ends open where None.
type KeyRange<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);

/// Which slice of a sliced search.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    /// This slice, `0..max`.
    pub id: u32,
    /// How many.
    pub max: u32,
    /// Key boundaries that cut each index (by documents keyspace) into
    /// `max` ranges, fixed for a point in time: a slice then reads only its
    /// range. Without them, a slice takes the ids that hash to it.
    pub bounds: Option<Arc<SliceBounds>>,
}

impl Slice {
    /// Parses `{"id":…,"max":…}` (a `field` is accepted and ignored: slices
    /// split by the document's id).
    pub fn parse(v: Option<&Value>) -> ApiResult<Option<Slice>> {
        let Some(v) = v else { return Ok(None) };
        let id = v.get("id").and_then(Value::as_u64);
        let max = v.get("max").and_then(Value::as_u64);
        match (id, max) {
            (Some(id), Some(max)) if max >= 1 && id < max && max <= 1024 => Ok(Some(Slice {
                id: id as u32,
                max: max as u32,
                bounds: None,
            })),
            (Some(_), Some(max)) if max <= 1 => {
                Err(ApiError::illegal("max must be greater than 1"))
            }
            (Some(id), Some(max)) => Err(ApiError::illegal(format!(
                "max must be greater than id ({id} >= {max}), and at most 1024"
            ))),
            _ => Err(ApiError::parsing("[slice] needs [id] and [max]")),
        }
    }

    /// The key range of this slice in keyspace `docs`, where boundaries
    /// cut it (else None: hash the ids).
    fn range(&self, docs: u32) -> Option<KeyRange<'_>> {
        let b = self.bounds.as_ref()?.get(&docs)?;
        if b.len() + 1 != self.max as usize {
            return None;
        }
        let i = self.id as usize;
        let low = if i == 0 {
            None
        } else {
            Some(b[i - 1].as_slice())
        };
        let high = b.get(i).map(Vec::as_slice);
        Some((low, high))
    }

    /// Boundaries cutting each index into `max` key ranges; an index
    /// whose tables give too few keeps hashing.
    pub fn bounds_for(store: &Store, indices: &[Arc<Index>], max: u32) -> SliceBounds {
        indices
            .iter()
            .map(|i| (i.docs, store.split_keys(i.docs, max as usize)))
            .filter(|(_, b)| b.len() + 1 == max as usize)
            .collect()
    }

    /// Whether document `id` is in this slice.
    pub fn holds(&self, id: &[u8]) -> bool {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in id {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        (h % u64::from(self.max)) as u32 == self.id
    }
}

/// `track_total_hits`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrackTotal {
    /// Not counted.
    Off,
    /// Counted exactly up to this many, then "gte".
    UpTo(u64),
}

impl TrackTotal {
    /// Parses the body's or parameter's value.
    pub fn parse(v: Option<&Value>) -> ApiResult<TrackTotal> {
        Ok(match v {
            None => TrackTotal::UpTo(MAX_RESULT_WINDOW as u64),
            Some(Value::Bool(true)) => TrackTotal::UpTo(u64::MAX),
            Some(Value::Bool(false)) => TrackTotal::Off,
            Some(Value::Number(n)) => match n.as_i64() {
                Some(-1) => TrackTotal::UpTo(u64::MAX),
                Some(k) if k >= 0 => TrackTotal::UpTo(k as u64),
                _ => return Err(ApiError::illegal("[track_total_hits] must be positive")),
            },
            Some(Value::String(s)) => match s.as_str() {
                "true" => TrackTotal::UpTo(u64::MAX),
                "false" => TrackTotal::Off,
                n => TrackTotal::UpTo(n.parse().map_err(|_| {
                    ApiError::illegal(format!(
                        "[track_total_hits] [{n}] is not a number or boolean"
                    ))
                })?),
            },
            Some(other) => {
                return Err(ApiError::parsing(format!(
                    "[track_total_hits] does not take [{other}]"
                )))
            }
        })
    }
}

/// What to find.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The query.
    pub query: Arc<Query>,
    /// Sort keys (none: key order).
    pub sort: Vec<SortKey>,
    /// Hits to skip.
    pub from: usize,
    /// Hits to return.
    pub size: usize,
    /// Continue after these sort values.
    pub search_after: Option<Vec<Value>>,
    /// Only this slice.
    pub slice: Option<Slice>,
    /// Count hits how far.
    pub track_total: TrackTotal,
}

/// One hit.
#[derive(Debug, Clone)]
pub struct Hit {
    /// Its index.
    pub index: Arc<Index>,
    /// `_id`.
    pub id: Vec<u8>,
    /// `_source` bytes.
    pub source: Vec<u8>,
    /// Sort values (when the search sorts).
    pub sort: Vec<Value>,
}

/// A page of hits.
#[derive(Debug, Default)]
pub struct Found {
    /// The hits of the page.
    pub hits: Vec<Hit>,
    /// Matching documents counted (see `exact`).
    pub total: u64,
    /// Whether `total` is all of them (else a lower bound).
    pub exact: bool,
}

/// A field's sort value: only that field is found and decoded (a skipping
/// lookup), not the whole document; an array sorts by its smallest element
/// (`by_max`: its largest), nested arrays flattened, nulls passed over.
fn sort_value(source: &[u8], path: &str, by_max: bool) -> Value {
    let pointer: Vec<sonic_rs::PointerNode> = path
        .split('.')
        .map(|s| sonic_rs::PointerNode::Key(s.to_string().into()))
        .collect();
    let Ok(found) = sonic_rs::get_from_slice(source, &pointer) else {
        return Value::Null;
    };
    match serde_json::from_str::<Value>(found.as_raw_str()) {
        Ok(Value::Array(a)) => {
            let mut best = Value::Null;
            pick_extreme(a, by_max, &mut best);
            best
        }
        Ok(v) => v,
        Err(_) => Value::Null,
    }
}

fn pick_extreme(values: Vec<Value>, by_max: bool, best: &mut Value) {
    for v in values {
        match v {
            Value::Array(inner) => pick_extreme(inner, by_max, best),
            Value::Null => {}
            v => {
                let better = best.is_null() || {
                    let o = compare_values(&v, best);
                    if by_max {
                        o == Ordering::Greater
                    } else {
                        o == Ordering::Less
                    }
                };
                if better {
                    *best = v;
                }
            }
        }
    }
}

fn rank(v: &Value) -> u8 {
    match v {
        Value::Bool(_) => 1,
        Value::Number(_) => 2,
        Value::String(_) => 3,
        _ => 4,
    }
}

/// Orders two sort values of one key: numbers by value, strings by bytes.
pub fn compare_values(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(i), Some(j)) => i.cmp(&j),
            _ => x
                .as_f64()
                .unwrap_or(0.0)
                .total_cmp(&y.as_f64().unwrap_or(0.0)),
        },
        (Value::String(x), Value::String(y)) => x.as_bytes().cmp(y.as_bytes()),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        _ => rank(a).cmp(&rank(b)),
    }
}

fn compare_keys(sort: &[SortKey], a: &[Value], b: &[Value]) -> Ordering {
    for (i, key) in sort.iter().enumerate() {
        let (x, y) = (&a[i], &b[i]);
        let ord = match key {
            SortKey::Score => Ordering::Equal,
            SortKey::Doc { desc } => {
                let o = compare_values(x, y);
                if *desc {
                    o.reverse()
                } else {
                    o
                }
            }
            SortKey::Field {
                desc,
                missing_first,
                ..
            } => match (x.is_null(), y.is_null()) {
                (true, true) => Ordering::Equal,
                (true, false) => {
                    if *missing_first {
                        Ordering::Less
                    } else {
                        Ordering::Greater
                    }
                }
                (false, true) => {
                    if *missing_first {
                        Ordering::Greater
                    } else {
                        Ordering::Less
                    }
                }
                _ => {
                    let o = compare_values(x, y);
                    if *desc {
                        o.reverse()
                    } else {
                        o
                    }
                }
            },
        };
        if ord != Ordering::Equal {
            return ord;
        }
    }
    Ordering::Equal
}

fn sort_values(sort: &[SortKey], id: &[u8], source: &[u8]) -> Vec<Value> {
    sort.iter()
        .map(|k| match k {
            SortKey::Doc { .. } => Value::String(String::from_utf8_lossy(id).into_owned()),
            SortKey::Score => serde_json::json!(1.0),
            SortKey::Field { path, by_max, .. } => sort_value(source, path, *by_max),
        })
        .collect()
}

/// A key-order scan left where a page ended: the next page, asked for
/// with `search_after` = that page's last id, goes on with the same
/// iterator (its blocks and read-ahead) instead of seeking again.
pub struct Resume {
    /// The documents keyspace it reads.
    pub docs: u32,
    /// The id of the last document it returned.
    pub after: Vec<u8>,
    /// The iterator, positioned after that document.
    pub iter: sluice_store::StoreIter,
}

/// Most scans a point in time keeps for resumption.
pub const MAX_RESUMES: usize = 64;

/// Runs `spec` over `indices` at `snapshot`. `resume` may hold a scan to
/// go on with (used if it fits); on return it holds this one's, when a
/// next page can go on with it. `paging`: a page of a point in time or a
/// scroll, which read the index through — their blocks do not fill the
/// block cache.
pub fn run(
    store: &Store,
    indices: &[Arc<Index>],
    snapshot: &Snapshot,
    spec: &Spec,
    resume: &mut Option<Resume>,
    paging: bool,
) -> ApiResult<Found> {
    let mut offered = resume.take();
    let window = spec.from.saturating_add(spec.size);
    check_search_after(spec)?;
    let key_order = in_key_order(&spec.sort);
    let limit = match spec.track_total {
        TrackTotal::Off => 0,
        TrackTotal::UpTo(n) => n,
    };
    if window == 0 && spec.slice.is_none() && spec.search_after.is_none() {
        // Only the total is wanted: the near-data count, on every core; a
        // point in time or scroll counts what its snapshot holds.
        let total = match (limit, paging) {
            (0, _) => 0,
            (_, false) => count(store, indices, &spec.query)?,
            (_, true) => count_at(store, indices, &spec.query, snapshot)?,
        };
        return Ok(Found {
            hits: Vec::new(),
            total: total.min(limit),
            exact: total <= limit,
        });
    }
    let mut found = Found {
        exact: true,
        ..Found::default()
    };
    let mut kept: Vec<Hit> = Vec::new();
    for index in indices {
        // In key order a search_after names the key to start after.
        let start: Option<Vec<u8>> = match (&spec.search_after, key_order) {
            (Some(after), true) => after
                .first()
                .and_then(Value::as_str)
                .map(|s| s.as_bytes().to_vec()),
            _ => None,
        };
        let slice_range = spec.slice.as_ref().and_then(|s| s.range(index.docs));
        let Some((lower, upper)) = scan_bounds(start.as_deref(), slice_range) else {
            continue;
        };
        let hash_slice = spec.slice.as_ref().filter(|_| slice_range.is_none());
        let mut iter = match &offered {
            Some(r)
                if key_order && r.docs == index.docs && start.as_deref() == Some(&r.after[..]) =>
            {
                offered.take().map(|r| r.iter)
            }
            _ => None,
        }
        .unwrap_or_else(|| {
            store.iter_paging(
                index.docs,
                (lower, upper),
                snapshot,
                false,
                window.min(4096),
                paging,
            )
        });
        while let Some(pair) = iter.next() {
            let (id, source) = pair.map_err(ApiError::store)?;
            if let Some(s) = hash_slice {
                if !s.holds(&id) {
                    continue;
                }
            }
            if !spec.query.matches(&id, &source)? {
                continue;
            }
            let values = if spec.sort.is_empty() {
                Vec::new()
            } else {
                sort_values(&spec.sort, &id, &source)
            };
            if !key_order {
                if let Some(after) = &spec.search_after {
                    if compare_keys(&spec.sort, &values, after) != Ordering::Greater {
                        continue;
                    }
                }
            }
            found.total += 1;
            let want_more = !key_order || kept.len() < window;
            let mut just_kept = None;
            if want_more {
                just_kept = Some(id.clone());
                kept.push(Hit {
                    index: index.clone(),
                    id,
                    source,
                    sort: values,
                });
                if !key_order && kept.len() >= 2 * window.max(64) {
                    prune(&spec.sort, &mut kept, window);
                }
            }
            if key_order && kept.len() >= window && found.total >= limit {
                // Enough hits, and counted as far as asked: the total is a bound.
                found.exact = false;
                if let (Some(after), 0) = (just_kept, spec.from) {
                    // The iterator stands right after the last hit returned.
                    *resume = Some(Resume {
                        docs: index.docs,
                        after,
                        iter,
                    });
                }
                return Ok(finish(spec, kept, found, limit));
            }
        }
    }
    if !key_order {
        prune(&spec.sort, &mut kept, window);
    }
    Ok(finish(spec, kept, found, limit))
}

/// Refuses a `search_after` that does not fit the request's sort or
/// `from`, as Elasticsearch does.
fn check_search_after(spec: &Spec) -> ApiResult<()> {
    let Some(after) = &spec.search_after else {
        return Ok(());
    };
    if after.len() != spec.sort.len() || spec.sort.is_empty() {
        return Err(ApiError::illegal(format!(
            "search_after has {} value(s) but sort has {}.",
            after.len(),
            spec.sort.len()
        ))
        .on_shards());
    }
    if spec.from > 0 {
        return Err(ApiError::illegal(
            "[from] parameter must be set to 0 when [search_after] is used",
        ));
    }
    Ok(())
}

/// Whether hits come in key order: sorted by `_doc` ascending first (the
/// score is the same for every hit), or not at all.
fn in_key_order(sort: &[SortKey]) -> bool {
    sort.iter()
        .all(|k| matches!(k, SortKey::Doc { desc: false } | SortKey::Score))
        && sort
            .first()
            .is_none_or(|k| matches!(k, SortKey::Doc { .. }))
}

/// A scan's lower and upper key bounds.
type KeyBounds<'a> = (Bound<&'a [u8]>, Bound<&'a [u8]>);

/// The keys an index's scan covers: after `start` (a search_after in key
/// order), within the slice's key range; None when they are empty.
fn scan_bounds<'a>(
    start: Option<&'a [u8]>,
    slice_range: Option<KeyRange<'a>>,
) -> Option<KeyBounds<'a>> {
    let mut lower = match start {
        Some(k) => Bound::Excluded(k),
        None => Bound::Unbounded,
    };
    let mut upper = Bound::Unbounded;
    if let Some((low, high)) = slice_range {
        if let Some(low) = low {
            if start.is_none_or(|k| k < low) {
                lower = Bound::Included(low);
            }
        }
        if let Some(high) = high {
            upper = Bound::Excluded(high);
        }
        if let (Bound::Excluded(k) | Bound::Included(k), Bound::Excluded(h)) = (lower, upper) {
            if k >= h {
                return None;
            }
        }
    }
    Some((lower, upper))
}

fn finish(spec: &Spec, kept: Vec<Hit>, mut found: Found, limit: u64) -> Found {
    if found.total > limit {
        found.total = limit;
        found.exact = false;
    }
    found.hits = kept.into_iter().skip(spec.from).take(spec.size).collect();
    found
}

fn prune(sort: &[SortKey], kept: &mut Vec<Hit>, window: usize) {
    kept.sort_by(|a, b| compare_keys(sort, &a.sort, &b.sort).then_with(|| a.id.cmp(&b.id)));
    kept.truncate(window);
}

/// Counts the matching documents: from the index's field columns where
/// they answer ([`crate::columns`]); else a query that is one predicate (or
/// none) as the near-data `count(*)`, on every core; others document by
/// document.
pub fn count(store: &Store, indices: &[Arc<Index>], query: &Query) -> ApiResult<u64> {
    let mut n = 0;
    for index in indices {
        n += match index.columns.count(store, index.docs, query) {
            Some(c) => c,
            None => scan_count(store, index, query)?,
        };
    }
    Ok(n)
}

fn scan_count(store: &Store, index: &Arc<Index>, query: &Query) -> ApiResult<u64> {
    let indices = std::slice::from_ref(index);
    let predicate = match query {
        Query::All => Some(None),
        Query::Pred(p, _) => Some(Some(&**p)),
        _ => None,
    };
    if let Some(predicate) = predicate {
        let layout = sluice_ndp::Layout::json_undeclared();
        let aggregates = [sluice_ndp::aggregate::Aggregate {
            func: sluice_ndp::aggregate::Func::Count,
            path: None,
        }];
        let mut n = 0;
        for index in indices {
            let spec = sluice_ndp::aggregate::AggregateSpec {
                keyspace: index.docs,
                layout: &layout,
                range: (Bound::Unbounded, Bound::Unbounded),
                predicate,
                aggregates: &aggregates,
                group_by: None,
                threads: std::thread::available_parallelism().map_or(1, |c| c.get()),
                multi_valued: false,
            };
            let (rows, _) =
                sluice_ndp::aggregate::aggregate(store, &spec).map_err(ApiError::store)?;
            for row in rows {
                if let Some(sluice_ndp::aggregate::AggValue::Int(c)) = row.values.first() {
                    n += u64::try_from(*c).unwrap_or(0);
                }
            }
        }
        return Ok(n);
    }
    count_at(store, indices, query, &store.snapshot())
}

/// Counts the documents matching `query` at `snapshot`, one by one.
fn count_at(
    store: &Store,
    indices: &[Arc<Index>],
    query: &Query,
    snapshot: &Snapshot,
) -> ApiResult<u64> {
    let mut n = 0;
    for index in indices {
        for pair in store.iter(
            index.docs,
            (Bound::Unbounded, Bound::Unbounded),
            snapshot,
            false,
        ) {
            let (id, source) = pair.map_err(ApiError::store)?;
            if query.matches(&id, &source)? {
                n += 1;
            }
        }
    }
    Ok(n)
}

/// A scroll's or point in time's state.
pub struct Context {
    /// The view it searches.
    pub snapshot: Snapshot,
    /// The indices.
    pub indices: Vec<Arc<Index>>,
    /// For a scroll: the search and where its next page starts.
    pub scroll: Option<Spec>,
    /// For a scroll: its `_source` filter, as the request gave it.
    pub source: Value,
    /// When it expires.
    pub expires: Instant,
    /// Slice boundaries computed for it, by slice count.
    pub slice_bounds: HashMap<u32, Arc<SliceBounds>>,
    /// Scans its last pages ended with, for the next pages to go on with
    /// (at most [`MAX_RESUMES`]).
    pub resumes: Vec<Resume>,
    /// A point in time (else a scroll).
    pub pit: bool,
    /// For a scroll: the total its first page counted (and whether it is
    /// exact), which every page shows.
    pub total: Option<(u64, bool)>,
}

impl Context {
    /// The shards of its indices.
    pub fn shards(&self) -> usize {
        self.indices
            .iter()
            .map(|i| i.shards as usize)
            .sum::<usize>()
            .max(1)
    }
}

/// Open search contexts with their limits.
#[derive(Default)]
pub struct Contexts {
    open: Mutex<HashMap<String, Context>>,
}

/// Parses a keep-alive (`1m`, `30s`, `500ms`, `2h`, `1d`), held to
/// `search.max_keep_alive`.
pub fn parse_keep_alive(text: &str) -> ApiResult<Duration> {
    check_keep_alive(text, parse_time(text)?)
}

/// Parses a time value (`1m`, `30s`, `500ms`, `2h`, `1d`) with no limit.
fn parse_time(text: &str) -> ApiResult<Duration> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: u64 = n.parse().map_err(|_| bad_time(text))?;
    let seconds = |per: u64| Duration::from_secs(n.saturating_mul(per));
    // A product past u64 saturates, and so is refused as too large.
    Ok(match unit {
        "d" => seconds(86_400),
        "h" => seconds(3600),
        "m" => seconds(60),
        "s" => seconds(1),
        "ms" => Duration::from_millis(n),
        "micros" => Duration::from_micros(n),
        "nanos" => Duration::from_nanos(n),
        _ => return Err(bad_time(text)),
    })
}

/// A keep-alive held to `search.max_keep_alive`.
pub fn check_keep_alive(text: &str, keep: Duration) -> ApiResult<Duration> {
    if keep > MAX_KEEP_ALIVE {
        return Err(ApiError::illegal(format!(
            "Keep alive for request ({text}) is too large. It must be less than (1d). This limit can be set by changing the [search.max_keep_alive] cluster level setting."
        )));
    }
    Ok(keep)
}

/// Parses a time value given as the URL parameter `name` (no limit
/// applied): a bad one is an `illegal_argument_exception` naming the
/// parameter, as Elasticsearch answers it.
pub fn parse_time_param(name: &str, text: &str) -> ApiResult<Duration> {
    parse_time(text).map_err(|_| {
        ApiError::illegal(format!(
            "failed to parse setting [{name}] with value [{text}] as a time value: unit is missing or unrecognized"
        ))
    })
}

/// Parses a keep-alive given as the URL parameter `name`, held to
/// `search.max_keep_alive`.
pub fn parse_keep_alive_param(name: &str, text: &str) -> ApiResult<Duration> {
    check_keep_alive(text, parse_time_param(name, text)?)
}

fn bad_time(text: &str) -> ApiError {
    ApiError::new(
        400,
        "parse_exception",
        format!("failed to parse setting [keep_alive] with value [{text}] as a time value: unit is missing or unrecognized"),
    )
}

/// The error a missing or expired context gives.
pub fn context_missing(id: &str) -> ApiError {
    ApiError::new(
        404,
        "search_context_missing_exception",
        format!("No search context found for id [{id}]"),
    )
}

impl Contexts {
    fn reap(open: &mut HashMap<String, Context>) {
        let now = Instant::now();
        open.retain(|_, c| c.expires > now);
    }

    /// Opens a context; refused past the limits.
    pub fn open(&self, context: Context) -> ApiResult<String> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        Self::reap(&mut open);
        let (limit, setting) = if context.pit {
            (MAX_PIT_CONTEXTS, "search.max_open_pit_context")
        } else {
            (MAX_SCROLL_CONTEXTS, "search.max_open_scroll_context")
        };
        if open.values().filter(|c| c.pit == context.pit).count() >= limit {
            return Err(ApiError::new(
                429,
                "too_many_scroll_contexts_exception",
                format!(
                    "Trying to create too many {} contexts. Must be less than or equal to: [{limit}]. This limit can be set by changing the [{setting}] setting.",
                    if context.pit { "point in time" } else { "scroll" }
                ),
            ));
        }
        let id = {
            use base64::Engine;
            let bytes: [u8; 24] = rand::random();
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
        };
        open.insert(id.clone(), context);
        Ok(id)
    }

    /// Runs `f` on the live context `id`, extending it by `keep_alive`.
    pub fn with<R>(
        &self,
        id: &str,
        keep_alive: Option<Duration>,
        f: impl FnOnce(&mut Context) -> ApiResult<R>,
    ) -> ApiResult<R> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        Self::reap(&mut open);
        let c = open.get_mut(id).ok_or_else(|| context_missing(id))?;
        if let Some(k) = keep_alive {
            c.expires = Instant::now() + k;
        }
        f(c)
    }

    /// A copy of what a context searches (so the search runs unlocked).
    pub fn view(
        &self,
        id: &str,
        keep_alive: Option<Duration>,
    ) -> ApiResult<(Snapshot, Vec<Arc<Index>>)> {
        self.with(id, keep_alive, |c| {
            Ok((c.snapshot.clone(), c.indices.clone()))
        })
    }

    /// Closes a context; if it was open, the shards it held (what
    /// Elasticsearch counts as freed: a context per shard).
    pub fn close(&self, id: &str) -> Option<usize> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        Self::reap(&mut open);
        open.remove(id).map(|c| c.shards())
    }

    /// Closes every context of one kind; their ids and shards.
    pub fn close_all(&self, pit: bool) -> Vec<(String, usize)> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        Self::reap(&mut open);
        let ids: Vec<String> = open
            .iter()
            .filter(|(_, c)| c.pit == pit)
            .map(|(k, _)| k.clone())
            .collect();
        ids.into_iter()
            .filter_map(|id| open.remove(&id).map(|c| (id, c.shards())))
            .collect()
    }

    /// How many of each kind are open: (scrolls, points in time).
    pub fn counts(&self) -> (usize, usize) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        Self::reap(&mut open);
        let pits = open.values().filter(|c| c.pit).count();
        (open.len() - pits, pits)
    }
}
