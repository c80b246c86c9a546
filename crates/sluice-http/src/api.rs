//! The routes: requests in, Elasticsearch-shaped responses out.

use crate::aggs;
use crate::catalog::{Catalog, Index};
use crate::docs::{self, DocOp, Docs, Expect, Outcome};
use crate::dsl;
use crate::error::{ApiError, ApiResult};
use crate::reqcache::{Cached, RequestCache};
use crate::search::{self, Context, Contexts, Slice, SortKey, Spec, TrackTotal};
use crate::wire::{Request, Response};
use serde_json::{json, Value};
use sluice_store::Store;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The version Sluice answers as: clients pick their API by it.
pub const COMPAT_VERSION: &str = "8.11.0";

/// Figures another part of the process adds to `/_sluice/stats` (the
/// Redis-protocol server's counters).
pub type ExtraStats = Box<dyn Fn() -> Value + Send + Sync>;

/// The rest of the process's figures for `/_sluice/metrics`, written in
/// Prometheus's text format after the HTTP API's own (the Redis-protocol
/// server's and the store's).
pub type ExtraMetrics = Box<dyn Fn(&mut String) + Send + Sync>;

/// The API over one store.
pub struct Api {
    catalog: Catalog,
    docs: Docs,
    contexts: Contexts,
    /// Answers of counts and size-0 searches.
    pub request_cache: crate::reqcache::RequestCache,
    /// Requests served.
    pub requests: AtomicU64,
    /// Requests answered with a 4xx or 5xx status.
    pub errors: AtomicU64,
    latency_us: std::sync::Mutex<hdrhistogram::Histogram<u64>>,
    extra: std::sync::OnceLock<ExtraStats>,
    extra_metrics: std::sync::OnceLock<ExtraMetrics>,
    cluster_uuid: String,
    /// `action.destructive_requires_name` (true by default, as in
    /// Elasticsearch 8): deleting indices takes their names, not `_all`
    /// or a wildcard.
    destructive_requires_name: std::sync::atomic::AtomicBool,
    native_budget: crate::native::NativeBudget,
}

/// Puts `aggregations` last in a search answer, inside its closing brace.
fn append_aggregations(response: &mut Response, aggregations: &Value) {
    response.body.pop();
    response.body.extend_from_slice(b",\"aggregations\":");
    response
        .body
        .extend_from_slice(aggregations.to_string().as_bytes());
    response.body.push(b'}');
}

fn shards(n: u32) -> Value {
    json!({"total": n, "successful": n, "skipped": 0, "failed": 0})
}

fn write_shards() -> Value {
    json!({"total": 1, "successful": 1, "failed": 0})
}

fn ok(status: u16, v: &Value) -> ApiResult<Response> {
    Ok(Response::json(status, v.to_string().into_bytes()))
}

fn body_json(req: &Request) -> ApiResult<Option<Value>> {
    if req.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    serde_json::from_slice(&req.body)
        .map(Some)
        .map_err(|e| ApiError::not_json("the request body", e))
}

fn json_escape(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// A string or an array of strings (as Elasticsearch takes ids and field
/// lists); None for anything else.
fn strings(v: Option<&Value>) -> Option<Vec<String>> {
    match v {
        Some(Value::String(s)) => Some(vec![s.clone()]),
        Some(Value::Array(a)) => Some(
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect(),
        ),
        _ => None,
    }
}

/// Appends `text` as a JSON string, escaped as serde_json escapes.
fn write_json_string(out: &mut Vec<u8>, text: &str) {
    let plain = text
        .bytes()
        .all(|b| b >= 0x20 && b != b'"' && b != b'\\' && b != 0x7f);
    if plain {
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    } else {
        out.extend_from_slice(json_escape(text).as_bytes());
    }
}

/// `_source` as a request asks for it.
#[derive(Debug, Clone, Default)]
struct SourceFilter {
    off: bool,
    includes: Vec<String>,
    excludes: Vec<String>,
}

impl SourceFilter {
    fn from_value(v: Option<&Value>) -> ApiResult<SourceFilter> {
        let list = |v: Option<&Value>| strings(v).unwrap_or_default();
        Ok(match v {
            None | Some(Value::Bool(true)) => SourceFilter::default(),
            Some(Value::Bool(false)) => SourceFilter {
                off: true,
                ..Default::default()
            },
            Some(Value::Object(m)) => SourceFilter {
                off: false,
                includes: list(m.get("includes").or_else(|| m.get("include"))),
                excludes: list(m.get("excludes").or_else(|| m.get("exclude"))),
            },
            Some(other @ (Value::String(_) | Value::Array(_))) => SourceFilter {
                off: false,
                includes: list(Some(other)),
                excludes: Vec::new(),
            },
            Some(other) => {
                return Err(ApiError::parsing(format!(
                    "[_source] does not take [{other}]"
                )))
            }
        })
    }

    fn from_params(req: &Request, base: SourceFilter) -> SourceFilter {
        let split = |s: &str| {
            s.split(',')
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        let mut f = base;
        match req.param("_source") {
            Some("false") => f.off = true,
            Some("true") | None => {}
            Some(list) => f.includes = split(list),
        }
        if let Some(i) = req.param("_source_includes") {
            f.includes = split(i);
        }
        if let Some(e) = req.param("_source_excludes") {
            f.excludes = split(e);
        }
        f
    }

    fn to_value(&self) -> Value {
        if self.off {
            return Value::Bool(false);
        }
        json!({"includes": self.includes, "excludes": self.excludes})
    }

    /// The source as the request wants it: none, the stored bytes as they
    /// are (no copy), or filtered.
    fn apply<'a>(&self, source: &'a [u8]) -> ApiResult<Option<std::borrow::Cow<'a, [u8]>>> {
        if self.off {
            return Ok(None);
        }
        if self.includes.is_empty() && self.excludes.is_empty() {
            return Ok(Some(std::borrow::Cow::Borrowed(source)));
        }
        docs::filter_source(source, &self.includes, &self.excludes)
            .map(|v| Some(std::borrow::Cow::Owned(v)))
    }
}

fn expect_of(req: &Request) -> ApiResult<Expect> {
    let num = |name: &str| -> ApiResult<Option<u64>> {
        req.param(name)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| ApiError::illegal(format!("[{name}] must be a number, got [{v}]")))
            })
            .transpose()
    };
    Ok(Expect {
        seq_no: num("if_seq_no")?,
        primary_term: num("if_primary_term")?,
    })
}

fn outcome_body(index: &str, o: &Outcome) -> Value {
    json!({
        "_index": index,
        "_id": o.id,
        "_version": o.version,
        "result": o.result,
        "_shards": write_shards(),
        "_seq_no": o.seq_no,
        "_primary_term": 1,
    })
}

impl Api {
    /// The API over `store` (its catalog made on first use).
    pub fn open(store: Arc<Store>) -> Result<Api, sluice_store::StoreError> {
        let catalog = Catalog::open(store.clone())?;
        Ok(Api {
            catalog,
            docs: Docs::new(store),
            contexts: Contexts::default(),
            request_cache: Default::default(),
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            latency_us: std::sync::Mutex::new(
                hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 2)
                    .map_err(|e| sluice_store::StoreError::BadInput(e.to_string()))?,
            ),
            extra: std::sync::OnceLock::new(),
            extra_metrics: std::sync::OnceLock::new(),
            cluster_uuid: {
                use base64::Engine;
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 16]>())
            },
            destructive_requires_name: std::sync::atomic::AtomicBool::new(true),
            native_budget: Default::default(),
        })
    }

    /// The memory budget of the graph endpoints (BC, the demo).
    pub fn native_budget(&self) -> &crate::native::NativeBudget {
        &self.native_budget
    }

    /// Sets `action.destructive_requires_name`: whether deleting indices
    /// needs their names (`false` lets `_all` and wildcards through).
    pub fn set_destructive_requires_name(&self, required: bool) {
        self.destructive_requires_name
            .store(required, Ordering::Relaxed);
    }

    /// The indices.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Document writes and reads.
    pub fn docs(&self) -> &Docs {
        &self.docs
    }

    /// Open (scroll, point-in-time) contexts.
    pub fn open_contexts(&self) -> (usize, usize) {
        self.contexts.counts()
    }

    /// Adds figures to `/_sluice/stats` (set once).
    pub fn set_extra_stats(&self, f: ExtraStats) {
        let _ = self.extra.set(f);
    }

    pub(crate) fn extra_stats(&self) -> Option<Value> {
        self.extra.get().map(|f| f())
    }

    /// Adds the rest of the process's figures to `/_sluice/metrics` (set
    /// once).
    pub fn set_extra_metrics(&self, f: ExtraMetrics) {
        let _ = self.extra_metrics.set(f);
    }

    /// Writes the HTTP API's figures in Prometheus's text format: requests,
    /// errors, latency quantiles and open search contexts.
    pub fn http_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        let counters = [
            (
                "sluice_http_requests_total",
                "HTTP requests served.",
                &self.requests,
            ),
            (
                "sluice_http_errors_total",
                "HTTP requests answered with a 4xx or 5xx status.",
                &self.errors,
            ),
        ];
        for (name, help, counter) in counters {
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
                counter.load(Ordering::Relaxed)
            );
        }
        let h = self.latency_us.lock().unwrap_or_else(|p| p.into_inner());
        let name = "sluice_http_request_duration_seconds";
        let _ = write!(
            out,
            "# HELP {name} Time an HTTP request took to answer, since start.\n# TYPE {name} summary\n"
        );
        for q in [0.5, 0.9, 0.99] {
            let seconds = h.value_at_quantile(q) as f64 / 1e6;
            let _ = writeln!(out, "{name}{{quantile=\"{q}\"}} {seconds}");
        }
        let sum_seconds = h.mean() * h.len() as f64 / 1e6;
        let _ = write!(out, "{name}_sum {sum_seconds}\n{name}_count {}\n", h.len());
        let (scrolls, pits) = self.open_contexts();
        let name = "sluice_http_open_contexts";
        let _ = write!(
            out,
            "# HELP {name} Open search contexts, by kind.\n# TYPE {name} gauge\n\
             {name}{{kind=\"scroll\"}} {scrolls}\n{name}{{kind=\"point_in_time\"}} {pits}\n"
        );
    }

    /// `/_sluice/metrics`: the HTTP API's figures, then the rest of the
    /// process's.
    pub(crate) fn metrics(&self) -> Response {
        let mut body = String::new();
        self.http_metrics(&mut body);
        if let Some(extra) = self.extra_metrics.get() {
            extra(&mut body);
        }
        Response {
            status: 200,
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            headers: vec![("Cache-Control", "no-store".into())],
            body: body.into_bytes(),
        }
    }

    pub(crate) fn http_stats(&self) -> Value {
        let h = self.latency_us.lock().unwrap_or_else(|p| p.into_inner());
        json!({
            "requests": self.requests.load(Ordering::Relaxed),
            "errors": self.errors.load(Ordering::Relaxed),
            "latency_us": {
                "p50": h.value_at_quantile(0.5),
                "p90": h.value_at_quantile(0.9),
                "p99": h.value_at_quantile(0.99),
                "max": h.max(),
            },
        })
    }

    /// Answers one request. A request that stores its body (a document
    /// written) takes it out of `req`, so a large one is not copied.
    pub fn handle(&self, req: &mut Request) -> Response {
        let started = Instant::now();
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut response = match self.route(req) {
            Ok(r) => r,
            Err(e) => Response::json(e.status, e.body().to_string().into_bytes()),
        };
        if response.status >= 400 {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        let us = started.elapsed().as_micros().max(1) as u64;
        let _ = self
            .latency_us
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(us.min(3_600_000_000));
        if let Some(ct) = compat_type(req) {
            response.content_type = ct;
        }
        response
    }

    fn route(&self, req: &mut Request) -> ApiResult<Response> {
        let (path, method) = (req.path.clone(), req.method.clone());
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let m = method.as_str();
        match (m, parts.as_slice()) {
            ("GET" | "HEAD", []) => self.root(),
            (_, ["_sluice", rest @ ..]) => self.native(req, rest),
            ("GET", ["_cluster", "health"]) => self.health(None),
            ("GET", ["_cluster", "health", expression]) => self.health(Some(expression)),
            ("GET", ["_cat", "indices", rest @ ..]) => self.cat_indices(req, rest.first().copied()),
            ("POST" | "GET", ["_refresh"]) | ("POST" | "GET", [_, "_refresh"]) => {
                ok(200, &json!({"_shards": write_shards()}))
            }
            ("POST" | "GET", ["_flush"]) | ("POST" | "GET", [_, "_flush"]) => {
                self.catalog.store().flush().map_err(ApiError::store)?;
                ok(200, &json!({"_shards": write_shards()}))
            }
            ("POST" | "PUT", ["_bulk"]) => self.bulk(req, None),
            ("POST" | "PUT", [idx, "_bulk"]) => self.bulk(req, Some(idx)),
            ("POST" | "GET", ["_mget"]) => self.mget(req, None),
            ("POST" | "GET", [idx, "_mget"]) => self.mget(req, Some(idx)),
            ("POST" | "GET", ["_search"]) => self.search(req, None),
            ("POST" | "GET", ["_count"]) => self.count(req, None),
            ("POST" | "GET", ["_search", "scroll"]) => self.scroll(req, None),
            ("POST" | "GET", ["_search", "scroll", id]) => self.scroll(req, Some(id)),
            ("DELETE", ["_search", "scroll", rest @ ..]) => {
                self.clear_scroll(req, rest.first().copied())
            }
            ("DELETE", ["_pit"]) => self.close_pit_es(req),
            ("DELETE", ["_search", "point_in_time"]) => self.close_pit_os(req, false),
            ("DELETE", ["_search", "point_in_time", "_all"]) => self.close_pit_os(req, true),
            ("POST" | "GET", [idx, "_search"]) => self.search(req, Some(idx)),
            ("POST" | "GET", [idx, "_count"]) => self.count(req, Some(idx)),
            ("POST", [idx, "_pit"]) => self.open_pit(req, idx, false),
            ("POST", [idx, "_search", "point_in_time"]) => self.open_pit(req, idx, true),
            ("PUT", [idx]) => self.create_index(req, idx),
            ("DELETE", [idx]) => self.delete_index(idx),
            ("HEAD", [idx]) => {
                self.catalog.resolve(idx)?;
                Ok(Response::json(200, Vec::new()))
            }
            ("GET", [idx]) => self.get_index(idx),
            ("GET", [idx, "_mapping"]) => self.get_mapping(idx),
            ("PUT" | "POST", [idx, "_mapping"]) => self.put_mapping(req, idx),
            ("GET", [idx, "_settings", rest @ ..]) => self.get_settings(idx, rest.first().copied()),
            ("PUT" | "POST", [idx, "_doc", id]) => {
                let create = req.param("op_type") == Some("create");
                self.index_doc(req, idx, Some(id), create)
            }
            ("POST", [idx, "_doc"]) => self.index_doc(req, idx, None, false),
            ("PUT" | "POST", [idx, "_create", id]) => self.index_doc(req, idx, Some(id), true),
            ("GET" | "HEAD", [idx, "_doc", id]) => self.get_doc(req, idx, id, false),
            ("GET" | "HEAD", [idx, "_source", id]) => self.get_doc(req, idx, id, true),
            ("DELETE", [idx, "_doc", id]) => self.delete_doc(req, idx, id),
            ("POST", [idx, "_update", id]) => self.update_doc(req, idx, id),
            _ => Err(ApiError::new(
                400,
                "no_handler_exception",
                format!("no handler found for uri [{}] and method [{m}]", req.path),
            )),
        }
    }

    fn root(&self) -> ApiResult<Response> {
        ok(
            200,
            &json!({
                "name": "sluice-0",
                "cluster_name": "sluice",
                "cluster_uuid": self.cluster_uuid,
                "version": {
                    "number": COMPAT_VERSION,
                    "build_flavor": "default",
                    "build_type": "sluice",
                    "build_hash": env!("CARGO_PKG_VERSION"),
                    "build_date": "2026-01-01T00:00:00.000Z",
                    "build_snapshot": false,
                    "lucene_version": "9.8.0",
                    "minimum_wire_compatibility_version": "7.17.0",
                    "minimum_index_compatibility_version": "7.0.0"
                },
                "tagline": "You Know, for Search"
            }),
        )
    }

    /// Cluster health, of every index or of those `expression` names. An
    /// expression naming no index is red and timed out at once (Elasticsearch
    /// answers so after waiting for the index to appear).
    fn health(&self, expression: Option<&str>) -> ApiResult<Response> {
        let (indices, found) = match expression {
            None => (self.catalog.all(), true),
            Some(e) => match self.catalog.resolve(e) {
                Ok(i) => (i, true),
                Err(_) => (Vec::new(), false),
            },
        };
        let shards: u32 = indices.iter().map(|i| i.shards).sum();
        ok(
            if found { 200 } else { 408 },
            &json!({
                "cluster_name": "sluice",
                "status": if found { "green" } else { "red" },
                "timed_out": !found,
                "number_of_nodes": 1, "number_of_data_nodes": 1,
                "active_primary_shards": shards, "active_shards": shards,
                "relocating_shards": 0, "initializing_shards": 0, "unassigned_shards": 0,
                "unassigned_primary_shards": 0,
                "delayed_unassigned_shards": 0, "number_of_pending_tasks": 0,
                "number_of_in_flight_fetch": 0, "task_max_waiting_in_queue_millis": 0,
                "active_shards_percent_as_number": 100.0
            }),
        )
    }

    fn doc_count(&self, index: &Arc<Index>) -> ApiResult<u64> {
        search::count(
            self.catalog.store(),
            std::slice::from_ref(index),
            &dsl::Query::All,
        )
    }

    fn cat_indices(&self, req: &Request, pattern: Option<&str>) -> ApiResult<Response> {
        let indices = match pattern {
            Some(p) => self.catalog.resolve(p)?,
            None => self.catalog.all(),
        };
        let raw_bytes = req.param("bytes") == Some("b");
        let store = self.catalog.store();
        let mut rows = Vec::new();
        for i in &indices {
            let count = self.doc_count(i)?;
            let bytes = store.keyspace_table_bytes(i.docs) + store.keyspace_table_bytes(i.versions);
            let size = if raw_bytes {
                bytes.to_string()
            } else {
                human_bytes(bytes)
            };
            rows.push(json!({
                "health": "green", "status": "open", "index": i.name, "uuid": i.uuid,
                "pri": i.shards.to_string(), "rep": "0", "docs.count": count.to_string(),
                "docs.deleted": "0", "store.size": size, "pri.store.size": size,
                "dataset.size": size,
                "creation.date": i.created_ms.to_string(),
            }));
        }
        const DEFAULT_COLUMNS: [&str; 11] = [
            "health",
            "status",
            "index",
            "uuid",
            "pri",
            "rep",
            "docs.count",
            "docs.deleted",
            "store.size",
            "pri.store.size",
            "dataset.size",
        ];
        let columns: Vec<&str> = match req.param("h") {
            Some(h) => h.split(',').collect(),
            None => DEFAULT_COLUMNS.to_vec(),
        };
        if req.param("format") == Some("json") {
            let picked: Vec<Value> = rows
                .iter()
                .map(|r| {
                    Value::Object(
                        columns
                            .iter()
                            .map(|c| (c.to_string(), r.get(*c).cloned().unwrap_or(Value::Null)))
                            .collect(),
                    )
                })
                .collect();
            return ok(200, &Value::Array(picked));
        }
        let mut text = String::new();
        for r in &rows {
            let cells: Vec<&str> = columns
                .iter()
                .map(|c| r.get(*c).and_then(Value::as_str).unwrap_or(""))
                .collect();
            text.push_str(&cells.join(" "));
            text.push('\n');
        }
        Ok(Response::text(200, text))
    }

    fn create_index(&self, req: &Request, name: &str) -> ApiResult<Response> {
        let body = body_json(req)?.unwrap_or(json!({}));
        self.catalog.create(name, &body)?;
        ok(
            200,
            &json!({"acknowledged": true, "shards_acknowledged": true, "index": name}),
        )
    }

    fn delete_index(&self, expression: &str) -> ApiResult<Response> {
        // Elasticsearch's DestructiveOperations: a name is needed for each
        // index, so that one mistyped request cannot drop every index.
        let wildcard = expression
            .split(',')
            .any(|part| part == "_all" || part.contains('*'));
        if wildcard && self.destructive_requires_name.load(Ordering::Relaxed) {
            return Err(ApiError::illegal(
                "Wildcard expressions or all indices are not allowed",
            ));
        }
        for i in self.catalog.resolve(expression)? {
            self.catalog.delete(&i.name)?;
        }
        ok(200, &json!({"acknowledged": true}))
    }

    fn settings_of(i: &Index) -> Value {
        json!({"index": {
            "number_of_shards": i.shards.to_string(), "number_of_replicas": "0",
            "uuid": i.uuid, "creation_date": i.created_ms.to_string(), "provided_name": i.name,
            "version": {"created": "8500003"}
        }})
    }

    fn get_index(&self, expression: &str) -> ApiResult<Response> {
        let mut out = serde_json::Map::new();
        for i in self.catalog.resolve(expression)? {
            out.insert(
                i.name.clone(),
                json!({"aliases": {}, "mappings": i.mappings(), "settings": Self::settings_of(&i)}),
            );
        }
        ok(200, &Value::Object(out))
    }

    fn get_mapping(&self, expression: &str) -> ApiResult<Response> {
        let mut out = serde_json::Map::new();
        for i in self.catalog.resolve(expression)? {
            out.insert(i.name.clone(), json!({"mappings": i.mappings()}));
        }
        ok(200, &Value::Object(out))
    }

    fn put_mapping(&self, req: &Request, expression: &str) -> ApiResult<Response> {
        let body = body_json(req)?.ok_or_else(|| {
            ApiError::new(
                400,
                "action_request_validation_exception",
                "Validation Failed: 1: mapping source is missing;",
            )
        })?;
        for i in self.catalog.resolve(expression)? {
            self.catalog.put_mapping(&i, &body)?;
        }
        ok(200, &json!({"acknowledged": true}))
    }

    fn get_settings(&self, expression: &str, name: Option<&str>) -> ApiResult<Response> {
        let mut out = serde_json::Map::new();
        for i in self.catalog.resolve(expression)? {
            let mut s = Self::settings_of(&i);
            if let Some(n) = name {
                let key = n.strip_prefix("index.").unwrap_or(n);
                let picked = s["index"].get(key).cloned();
                s = match picked {
                    Some(v) => json!({"index": {key: v}}),
                    None => json!({}),
                };
            }
            out.insert(i.name.clone(), json!({"settings": s}));
        }
        ok(200, &Value::Object(out))
    }

    /// The index for a write, created on first use as Elasticsearch's
    /// `action.auto_create_index` does.
    fn index_for_write(&self, name: &str) -> ApiResult<Arc<Index>> {
        match self.catalog.get(name) {
            Ok(i) => Ok(i),
            Err(_) => match self.catalog.create(name, &json!({})) {
                Ok(i) => Ok(i),
                Err(e) if e.kind == "resource_already_exists_exception" => self.catalog.get(name),
                Err(e) => Err(e),
            },
        }
    }

    fn one(&self, index: &Index, op: DocOp) -> ApiResult<Outcome> {
        self.docs
            .apply(index, vec![op])
            .pop()
            .unwrap_or_else(|| Err(ApiError::store("no outcome")))
    }

    fn index_doc(
        &self,
        req: &mut Request,
        idx: &str,
        id: Option<&str>,
        create: bool,
    ) -> ApiResult<Response> {
        let index = self.index_for_write(idx)?;
        let expect = expect_of(req)?;
        let op = DocOp::Index {
            id: id.map(str::to_string),
            // Taken, not copied: a document may be 100 MB.
            source: std::mem::take(&mut req.body),
            create,
            expect,
        };
        let o = self.one(&index, op)?;
        ok(o.status, &outcome_body(&index.name, &o))
    }

    fn delete_doc(&self, req: &Request, idx: &str, id: &str) -> ApiResult<Response> {
        let index = self.catalog.get(idx)?;
        let o = self.one(
            &index,
            DocOp::Delete {
                id: id.into(),
                expect: expect_of(req)?,
            },
        )?;
        ok(o.status, &outcome_body(&index.name, &o))
    }

    fn update_doc(&self, req: &Request, idx: &str, id: &str) -> ApiResult<Response> {
        let body = body_json(req)?.ok_or_else(|| {
            ApiError::new(
                400,
                "action_request_validation_exception",
                "Validation Failed: 1: script or doc is missing;",
            )
        })?;
        let index = self.index_for_write(idx)?;
        let op = update_op(id, &body, expect_of(req)?)?;
        let o = self.one(&index, op)?;
        let mut answer = outcome_body(&index.name, &o);
        // Asked for, the document as the update left it.
        let asked = body.get("_source").is_some()
            || ["_source", "_source_includes", "_source_excludes"]
                .iter()
                .any(|p| req.param(p).is_some());
        if let (true, Some(source)) = (asked, &o.source) {
            let filter =
                SourceFilter::from_params(req, SourceFilter::from_value(body.get("_source"))?);
            if let Some(kept) = filter.apply(source)? {
                let kept: Value = serde_json::from_slice(&kept)
                    .map_err(|e| ApiError::store(format!("an updated source: {e}")))?;
                answer["get"] = json!({"_seq_no": o.seq_no, "_primary_term": 1, "found": true, "_source": kept});
            }
        }
        ok(o.status, &answer)
    }

    fn get_doc(
        &self,
        req: &Request,
        idx: &str,
        id: &str,
        source_only: bool,
    ) -> ApiResult<Response> {
        let index = self.catalog.get(idx)?;
        let filter = SourceFilter::from_params(req, SourceFilter::default());
        let Some(doc) = self.docs.get(&index, id, None)? else {
            if source_only {
                return Err(ApiError::new(
                    404,
                    "resource_not_found_exception",
                    format!("Document not found [{}]/[{id}]", index.name),
                ));
            }
            return ok(
                404,
                &json!({"_index": index.name, "_id": id, "found": false}),
            );
        };
        if source_only {
            // The whole source goes out as read (not copied: it may be
            // 100 MB); a filtered one is a new, smaller document.
            let filtered = filter.apply(&doc.source)?.map(|c| match c {
                std::borrow::Cow::Borrowed(_) => None,
                std::borrow::Cow::Owned(kept) => Some(kept),
            });
            let bytes = match filtered {
                None => b"{}".to_vec(),
                Some(None) => doc.source,
                Some(Some(kept)) => kept,
            };
            return Ok(Response::json(200, bytes));
        }
        let mut head = format!(
            "{{\"_index\":{},\"_id\":{},\"_version\":{},\"_seq_no\":{},\"_primary_term\":1,\"found\":true",
            json_escape(&index.name), json_escape(id), doc.version, doc.seq_no
        )
        .into_bytes();
        let filtered = filter.apply(&doc.source)?.map(|c| match c {
            std::borrow::Cow::Borrowed(_) => None,
            std::borrow::Cow::Owned(kept) => Some(kept),
        });
        let source = match filtered {
            None => {
                head.push(b'}');
                return Ok(Response::json(200, head));
            }
            Some(None) => doc.source,
            Some(Some(kept)) => kept,
        };
        // The answer is built around the source where it lies (it may be
        // 100 MB): the head goes in front of it, not the source after a
        // head.
        head.extend_from_slice(b",\"_source\":");
        let mut out = source;
        out.reserve_exact(head.len() + 1);
        out.splice(0..0, head);
        out.push(b'}');
        Ok(Response::json(200, out))
    }

    fn mget(&self, req: &Request, idx: Option<&str>) -> ApiResult<Response> {
        let body = body_json(req)?.ok_or_else(|| {
            ApiError::new(
                400,
                "action_request_validation_exception",
                "Validation Failed: 1: no documents to get;",
            )
        })?;
        let filter = SourceFilter::from_params(req, SourceFilter::default());
        let mut wanted: Vec<(String, String, SourceFilter)> = Vec::new();
        if let Some(ids) = body.get("ids").and_then(Value::as_array) {
            let index = idx.ok_or_else(|| {
                ApiError::new(
                    400,
                    "action_request_validation_exception",
                    "Validation Failed: 1: index is missing for doc 0;",
                )
            })?;
            for id in ids {
                wanted.push((index.to_string(), id_text(id)?, filter.clone()));
            }
        } else if let Some(docs) = body.get("docs").and_then(Value::as_array) {
            for (n, d) in docs.iter().enumerate() {
                let index = d
                    .get("_index")
                    .and_then(Value::as_str)
                    .or(idx)
                    .ok_or_else(|| {
                        ApiError::new(
                            400,
                            "action_request_validation_exception",
                            format!("Validation Failed: 1: index is missing for doc {n};"),
                        )
                    })?;
                let id = d.get("_id").map(id_text).transpose()?.ok_or_else(|| {
                    ApiError::new(
                        400,
                        "action_request_validation_exception",
                        format!("Validation Failed: 1: id is missing for doc {n};"),
                    )
                })?;
                let f = match d.get("_source") {
                    Some(s) => SourceFilter::from_value(Some(s))?,
                    None => filter.clone(),
                };
                wanted.push((index.to_string(), id, f));
            }
        } else {
            return Err(ApiError::parsing(
                "unknown parameter: [mget] needs [docs] or [ids]",
            ));
        }
        let snapshot = self.catalog.store().snapshot();
        let mut out = b"{\"docs\":[".to_vec();
        for (n, (index_name, id, f)) in wanted.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            let index = match self.catalog.get(index_name) {
                Ok(i) => i,
                Err(e) => {
                    let v = json!({"_index": index_name, "_id": id, "error": e.body()["error"]});
                    out.extend_from_slice(v.to_string().as_bytes());
                    continue;
                }
            };
            match self.docs.get(&index, id, Some(&snapshot))? {
                None => out.extend_from_slice(
                    json!({"_index": index.name, "_id": id, "found": false})
                        .to_string()
                        .as_bytes(),
                ),
                Some(doc) => {
                    out.extend_from_slice(format!(
                        "{{\"_index\":{},\"_id\":{},\"_version\":{},\"_seq_no\":{},\"_primary_term\":1,\"found\":true",
                        json_escape(&index.name), json_escape(id), doc.version, doc.seq_no
                    ).as_bytes());
                    if let Some(src) = f.apply(&doc.source)? {
                        out.extend_from_slice(b",\"_source\":");
                        out.extend_from_slice(&src);
                    }
                    out.push(b'}');
                }
            }
        }
        out.extend_from_slice(b"]}");
        Ok(Response::json(200, out))
    }

    fn bulk(&self, req: &Request, idx: Option<&str>) -> ApiResult<Response> {
        let started = Instant::now();
        let items = parse_bulk(&req.body, idx)?;
        let mut results: Vec<(String, &'static str, ApiResult<Outcome>, String)> =
            Vec::with_capacity(items.len());
        // Consecutive operations on one index go in one store batch.
        let mut i = 0;
        while i < items.len() {
            let j = (i..items.len())
                .find(|&k| items[k].index != items[i].index)
                .unwrap_or(items.len());
            let group = &items[i..j];
            let index_name = group[0].index.clone();
            let target = if group.iter().all(|it| it.action == "delete") {
                self.catalog.get(&index_name)
            } else {
                self.index_for_write(&index_name)
            };
            match target {
                Err(e) => {
                    for it in group {
                        results.push((
                            index_name.clone(),
                            it.action,
                            Err(e.clone()),
                            it.id.clone().unwrap_or_default(),
                        ));
                    }
                }
                Ok(index) => {
                    let mut ops = Vec::new();
                    let mut pre: Vec<Option<ApiError>> = Vec::new();
                    for it in group {
                        match &it.op {
                            Ok(op) => {
                                ops.push(op.clone());
                                pre.push(None);
                            }
                            Err(e) => pre.push(Some(e.clone())),
                        }
                    }
                    let mut outcomes = self.docs.apply(&index, ops).into_iter();
                    for (it, p) in group.iter().zip(pre) {
                        let r = match p {
                            Some(e) => Err(e),
                            None => outcomes
                                .next()
                                .unwrap_or_else(|| Err(ApiError::store("no outcome"))),
                        };
                        results.push((
                            index.name.clone(),
                            it.action,
                            r,
                            it.id.clone().unwrap_or_default(),
                        ));
                    }
                }
            }
            i = j;
        }
        let errors = results.iter().any(|r| r.2.is_err());
        // Written directly: a bulk answer has one item per operation, and
        // building each as a JSON tree cost more than the writes.
        let mut out = Vec::with_capacity(64 + 200 * results.len());
        out.extend_from_slice(
            format!(
                "{{\"took\":{},\"errors\":{errors},\"items\":[",
                started.elapsed().as_millis()
            )
            .as_bytes(),
        );
        let mut index_json = (String::new(), String::new());
        for (n, (index, action, r, id)) in results.into_iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            if index_json.0 != index {
                index_json = (index.clone(), json_escape(&index));
            }
            out.extend_from_slice(b"{\"");
            out.extend_from_slice(action.as_bytes());
            out.extend_from_slice(b"\":{\"_index\":");
            out.extend_from_slice(index_json.1.as_bytes());
            out.extend_from_slice(b",\"_id\":");
            match r {
                Ok(o) => {
                    write_json_string(&mut out, &o.id);
                    out.extend_from_slice(
                        format!(
                            ",\"_version\":{},\"result\":\"{}\",\"_shards\":{{\"total\":1,\"successful\":1,\"failed\":0}},\"_seq_no\":{},\"_primary_term\":1,\"status\":{}}}}}",
                            o.version, o.result, o.seq_no, o.status
                        )
                        .as_bytes(),
                    );
                }
                Err(e) => {
                    write_json_string(&mut out, &id);
                    out.extend_from_slice(
                        format!(",\"status\":{},\"error\":{}}}}}", e.status, e.cause()).as_bytes(),
                    );
                }
            }
        }
        out.extend_from_slice(b"]}");
        Ok(Response::json(200, out))
    }

    fn search_spec(
        &self,
        body: &Value,
        req: &Request,
        mapping: &Value,
        pit: bool,
    ) -> ApiResult<(Spec, SourceFilter)> {
        const KEYS: &[&str] = &[
            "query",
            "size",
            "from",
            "sort",
            "search_after",
            "_source",
            "track_total_hits",
            "slice",
            "pit",
            "timeout",
            "track_scores",
            "version",
            "seq_no_primary_term",
            "explain",
            "aggs",
            "stored_fields",
            "aggregations",
        ];
        if let Some(m) = body.as_object() {
            for k in m.keys() {
                if !KEYS.contains(&k.as_str()) {
                    return Err(ApiError::parsing(format!(
                        "Unknown key for a {} in [{k}].",
                        token_name(&m[k])
                    )));
                }
            }
        }
        let num = |name: &str, default: usize| -> ApiResult<usize> {
            if let Some(p) = req.param(name) {
                return p.parse().map_err(|_| {
                    ApiError::illegal(format!("[{name}] must be a number, got [{p}]"))
                });
            }
            match body.get(name) {
                None | Some(Value::Null) => Ok(default),
                // Elasticsearch reads these as a Java int.
                Some(v) if v.as_u64().is_some_and(|n| n > i32::MAX as u64) => {
                    let reason = format!(
                        "Numeric value ({v}) out of range of int (-2147483648 - 2147483647)"
                    );
                    Err(
                        ApiError::new(400, "x_content_parse_exception", reason.clone()).with(
                            "caused_by",
                            json!({"type": "input_coercion_exception", "reason": reason}),
                        ),
                    )
                }
                Some(v) => v.as_u64().map(|n| n as usize).ok_or_else(|| {
                    ApiError::illegal(format!("[{name}] must be a positive number, got [{v}]"))
                }),
            }
        };
        let size = num("size", 10)?;
        let from = num("from", 0)?;
        // Both come from the request: compared before any sum can wrap.
        let window = from.saturating_add(size);
        if req.param("scroll").is_some() {
            if from > 0 {
                return Err(ApiError::new(
                    400,
                    "action_request_validation_exception",
                    "Validation Failed: 1: using [from] is not allowed in a scroll context;",
                ));
            }
            if size > search::MAX_RESULT_WINDOW {
                return Err(ApiError::illegal(format!(
                    "Batch size is too large, size must be less than or equal to: [{}] but was [{size}]. Scroll batch sizes cost as much memory as result windows so they are controlled by the [index.max_result_window] index level setting.",
                    search::MAX_RESULT_WINDOW
                )).on_shards());
            }
        } else if window > search::MAX_RESULT_WINDOW {
            return Err(ApiError::illegal(format!(
                "Result window is too large, from + size must be less than or equal to: [{}] but was [{window}]. See the scroll api for a more efficient way to request large data sets. This limit can be set by changing the [index.max_result_window] index level setting.",
                search::MAX_RESULT_WINDOW
            )).on_shards());
        }
        let mut sort = match req.param("sort") {
            Some(s) => search::parse_sort_param(s)?,
            None => search::parse_sort(body.get("sort"))?,
        };
        // A point in time breaks ties by document, and says so in the sort values.
        if pit && !sort.is_empty() && !matches!(sort.last(), Some(SortKey::Doc { .. })) {
            sort.push(SortKey::Doc { desc: false });
        }
        let track = match req.param("track_total_hits") {
            Some(t) => TrackTotal::parse(Some(&Value::String(t.into())))?,
            None => TrackTotal::parse(body.get("track_total_hits"))?,
        };
        let search_after = match body.get("search_after") {
            None | Some(Value::Null) => None,
            Some(Value::Array(a)) => Some(a.clone()),
            Some(other) => {
                return Err(ApiError::parsing(format!(
                    "[search_after] must be an array, got [{other}]"
                )))
            }
        };
        let mut base = SourceFilter::from_value(body.get("_source"))?;
        // Documents keep no stored fields but _source; asking for stored
        // fields without _source returns none, as Elasticsearch does.
        if body.get("stored_fields").is_some() && body.get("_source").is_none() {
            base.off = true;
        }
        let filter = SourceFilter::from_params(req, base);
        let spec = Spec {
            query: Arc::new(dsl::compile(body.get("query"), mapping)?),
            sort,
            from,
            size,
            search_after,
            slice: Slice::parse(body.get("slice"))?,
            track_total: track,
        };
        Ok((spec, filter))
    }

    fn search(&self, req: &Request, idx: Option<&str>) -> ApiResult<Response> {
        let started = Instant::now();
        let body = body_json(req)?.unwrap_or(json!({}));
        let pit = body.get("pit");
        let mut generations = Vec::new();
        let (snapshot, indices, pit_id) = match pit {
            Some(p) => {
                if idx.is_some() {
                    return Err(ApiError::new(400, "action_request_validation_exception", "Validation Failed: 1: [indices] cannot be used with point in time. Do not specify any index with point in time.;"));
                }
                let id = p
                    .get("id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::parsing("[pit] needs an [id]"))?;
                let keep = p
                    .get("keep_alive")
                    .and_then(Value::as_str)
                    .map(search::parse_keep_alive)
                    .transpose()?;
                let (s, i) = self.contexts.view(id, keep).map_err(missing_in_search)?;
                (s, i, Some(id.to_string()))
            }
            None => {
                let indices = match idx {
                    Some(e) => self.catalog.resolve(e)?,
                    None => self.catalog.all(),
                };
                generations = RequestCache::generations(&indices);
                (self.catalog.store().snapshot(), indices, None)
            }
        };
        let mapping = indices.first().map_or(json!({}), |i| i.mappings());
        let names: Vec<&str> = indices.iter().map(|i| i.name.as_str()).collect();
        let as_search = |e: ApiError| e.as_search_failure(&names);
        let (mut spec, filter) = self
            .search_spec(&body, req, &mapping, pit_id.is_some())
            .map_err(as_search)?;
        // Slices of a point in time read key ranges fixed for it.
        if let (Some(id), Some(slice)) = (&pit_id, spec.slice.as_mut()) {
            let store = self.catalog.store();
            let bounds = self.contexts.with(id, None, |c| {
                Ok(c.slice_bounds
                    .entry(slice.max)
                    .or_insert_with(|| Arc::new(Slice::bounds_for(store, &c.indices, slice.max)))
                    .clone())
            })?;
            slice.bounds = Some(bounds);
        }
        // A keep-alive past the limit is refused by the shards, as
        // Elasticsearch refuses it.
        let scroll = match req.param("scroll") {
            None => None,
            Some(t) => {
                let keep = search::parse_time_param("scroll", t)?;
                Some(search::check_keep_alive(t, keep).map_err(|e| as_search(e.on_shards()))?)
            }
        };
        if let Some(keep) = scroll {
            if pit_id.is_some() {
                return Err(ApiError::new(400, "action_request_validation_exception", "Validation Failed: 1: using [point in time] is not allowed in a scroll context;"));
            }
            return self
                .start_scroll(spec, filter, snapshot, indices.clone(), keep, started)
                .map_err(as_search);
        }
        let aggs = match body.get("aggs").or_else(|| body.get("aggregations")) {
            Some(a) => Some(aggs::parse(a)?),
            None => None,
        };
        let cache_key = (spec.size == 0
            && pit_id.is_none()
            && spec.slice.is_none()
            && spec.search_after.is_none())
        .then(|| RequestCache::key("search", req, &body, &indices, &generations))
        .flatten();
        if let Some(Cached::Search {
            total,
            exact,
            aggregations,
        }) = cache_key.as_deref().and_then(|k| self.request_cache.get(k))
        {
            let found = search::Found {
                hits: Vec::new(),
                total,
                exact,
            };
            let total_shards = indices.iter().map(|i| i.shards).sum::<u32>().max(1);
            let mut response =
                self.search_response(&spec, &filter, found, total_shards, started, None)?;
            if let Some(a) = aggregations {
                append_aggregations(&mut response, &a);
            }
            return Ok(response);
        }
        // A size-0 search with aggregations: the aggregations' scan counts
        // the matches too.
        let aggregated = match &aggs {
            Some(requests)
                if spec.size == 0 && spec.slice.is_none() && spec.search_after.is_none() =>
            {
                Some(aggs::run(
                    self.catalog.store(),
                    &indices,
                    &spec.query,
                    requests,
                )?)
            }
            _ => None,
        };
        let found = match &aggregated {
            Some(a) => {
                let limit = match spec.track_total {
                    TrackTotal::Off => 0,
                    TrackTotal::UpTo(n) => n,
                };
                search::Found {
                    hits: Vec::new(),
                    total: a.total.min(limit),
                    exact: a.total <= limit,
                }
            }
            None => self
                .run_in_context(&indices, &snapshot, &spec, pit_id.as_deref())
                .map_err(as_search)?,
        };
        if pit_id.is_none() && spec.size == 0 {
            self.catalog.remember_columns(&indices);
        }
        let total_shards = indices.iter().map(|i| i.shards).sum::<u32>().max(1);
        let extra = pit_id.map(|id| format!("\"pit_id\":{},", json_escape(&id)));
        let (total, exact) = (found.total, found.exact);
        let mut response = self.search_response(
            &spec,
            &filter,
            found,
            total_shards,
            started,
            extra.as_deref(),
        )?;
        let mut aggregations = None;
        if let Some(requests) = aggs {
            let result = match aggregated {
                Some(a) => a.aggregations,
                None => {
                    aggs::run(self.catalog.store(), &indices, &spec.query, &requests)?.aggregations
                }
            };
            append_aggregations(&mut response, &result);
            aggregations = Some(Arc::new(result));
        }
        if let Some(key) = cache_key {
            let answer = Cached::Search {
                total,
                exact,
                aggregations,
            };
            self.request_cache.put(key, answer);
        }
        Ok(response)
    }

    /// Runs a search; in a point in time, a page that continues where an
    /// earlier one ended goes on with that page's scan.
    fn run_in_context(
        &self,
        indices: &[Arc<Index>],
        snapshot: &sluice_store::Snapshot,
        spec: &Spec,
        pit_id: Option<&str>,
    ) -> ApiResult<search::Found> {
        let store = self.catalog.store();
        let Some(pit) = pit_id else {
            return search::run(store, indices, snapshot, spec, &mut None, false);
        };
        let after = spec
            .search_after
            .as_ref()
            .and_then(|a| a.first())
            .and_then(Value::as_str);
        let mut resume = match after {
            None => None,
            Some(after) => self
                .contexts
                .with(pit, None, |c| {
                    Ok(c.resumes
                        .iter()
                        .position(|r| r.after == after.as_bytes())
                        .map(|i| c.resumes.swap_remove(i)))
                })
                .unwrap_or(None),
        };
        let found = search::run(store, indices, snapshot, spec, &mut resume, true)?;
        if let Some(r) = resume {
            // The context may have closed meanwhile: then the scan just ends.
            let _ = self.contexts.with(pit, None, |c| {
                if c.resumes.len() >= search::MAX_RESUMES {
                    c.resumes.remove(0);
                }
                c.resumes.push(r);
                Ok(())
            });
        }
        Ok(found)
    }

    fn search_response(
        &self,
        spec: &Spec,
        filter: &SourceFilter,
        found: search::Found,
        total_shards: u32,
        started: Instant,
        extra: Option<&str>,
    ) -> ApiResult<Response> {
        let sorted = !spec.sort.is_empty() && !matches!(spec.sort.as_slice(), [SortKey::Score]);
        let score = if sorted { "null" } else { "1.0" };
        let mut out = crate::wire::body_buffer(
            256 + found
                .hits
                .iter()
                .map(|h| h.source.len() + 2 * h.id.len() + h.index.name.len() + 96)
                .sum::<usize>(),
        );
        out.push(b'{');
        if let Some(e) = extra {
            out.extend_from_slice(e.as_bytes());
        }
        out.extend_from_slice(
            format!(
                "\"took\":{},\"timed_out\":false,\"_shards\":{},\"hits\":{{",
                started.elapsed().as_millis(),
                shards(total_shards)
            )
            .as_bytes(),
        );
        if spec.track_total != TrackTotal::Off {
            out.extend_from_slice(
                format!(
                    "\"total\":{{\"value\":{},\"relation\":\"{}\"}},",
                    found.total,
                    if found.exact { "eq" } else { "gte" }
                )
                .as_bytes(),
            );
        }
        let max_score = if found.hits.is_empty() { "null" } else { score };
        out.extend_from_slice(format!("\"max_score\":{max_score},\"hits\":[").as_bytes());
        // The index name escaped once per index, not once per hit.
        let mut index_json: (*const Index, String) = (std::ptr::null(), String::new());
        for (n, h) in found.hits.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            if !std::ptr::eq(index_json.0, Arc::as_ptr(&h.index)) {
                index_json = (Arc::as_ptr(&h.index), json_escape(&h.index.name));
            }
            out.extend_from_slice(b"{\"_index\":");
            out.extend_from_slice(index_json.1.as_bytes());
            out.extend_from_slice(b",\"_id\":");
            write_json_string(&mut out, &String::from_utf8_lossy(&h.id));
            out.extend_from_slice(b",\"_score\":");
            out.extend_from_slice(score.as_bytes());
            if let Some(src) = filter.apply(&h.source)? {
                out.extend_from_slice(b",\"_source\":");
                out.extend_from_slice(&src);
            }
            if sorted {
                out.extend_from_slice(b",\"sort\":[");
                for (i, v) in h.sort.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    match v {
                        Value::String(text) => write_json_string(&mut out, text),
                        other => out.extend_from_slice(other.to_string().as_bytes()),
                    }
                }
                out.push(b']');
            }
            out.push(b'}');
        }
        out.extend_from_slice(b"]}}");
        Ok(Response::json(200, out))
    }

    fn start_scroll(
        &self,
        mut spec: Spec,
        filter: SourceFilter,
        snapshot: sluice_store::Snapshot,
        indices: Vec<Arc<Index>>,
        keep: Duration,
        started: Instant,
    ) -> ApiResult<Response> {
        if !matches!(spec.sort.last(), Some(SortKey::Doc { .. })) {
            spec.sort.push(SortKey::Doc { desc: false });
        }
        let found = search::run(
            self.catalog.store(),
            &indices,
            &snapshot,
            &spec,
            &mut None,
            true,
        )?;
        let total_shards = indices.iter().map(|i| i.shards).sum::<u32>().max(1);
        let mut next = spec.clone();
        next.from = 0;
        next.search_after = found.hits.last().map(|h| h.sort.clone());
        next.track_total = TrackTotal::Off;
        let total = (spec.track_total != TrackTotal::Off).then_some((found.total, found.exact));
        let id = self.contexts.open(Context {
            snapshot,
            indices,
            scroll: Some(next),
            source: filter.to_value(),
            expires: Instant::now() + keep,
            slice_bounds: Default::default(),
            resumes: Vec::new(),
            pit: false,
            total,
        })?;
        let extra = format!("\"_scroll_id\":{},", json_escape(&id));
        self.search_response(&spec, &filter, found, total_shards, started, Some(&extra))
    }
}

/// A size as Elasticsearch's `_cat` APIs write it: `225b`, `5.2kb`, `1mb`.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["kb", "mb", "gb", "tb", "pb"];
    if bytes < 1024 {
        return format!("{bytes}b");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let text = format!("{value:.1}");
    let text = text.strip_suffix(".0").unwrap_or(&text);
    format!("{text}{}", UNITS[unit])
}

/// The name Elasticsearch's parser gives the token a JSON value starts with.
fn token_name(v: &Value) -> &'static str {
    match v {
        Value::Object(_) => "START_OBJECT",
        Value::Array(_) => "START_ARRAY",
        Value::String(_) => "VALUE_STRING",
        Value::Number(_) => "VALUE_NUMBER",
        Value::Bool(_) => "VALUE_BOOLEAN",
        Value::Null => "VALUE_NULL",
    }
}

fn missing_in_search(e: ApiError) -> ApiError {
    if e.kind != "search_context_missing_exception" {
        return e;
    }
    let cause = e.cause();
    ApiError::new(404, "search_phase_execution_exception", "all shards failed")
        .with("phase", json!("query"))
        .with("grouped", json!(true))
        .with(
            "failed_shards",
            json!([{"shard": -1, "index": null, "reason": cause}]),
        )
        .with("caused_by", cause.clone())
        .rooted_in(cause)
}

fn compat_type(req: &Request) -> Option<&'static str> {
    let accept = req.header("accept")?;
    if !accept.contains("vnd.elasticsearch+json") {
        return None;
    }
    Some(if accept.contains("compatible-with=7") {
        "application/vnd.elasticsearch+json;compatible-with=7"
    } else if accept.contains("compatible-with=9") {
        "application/vnd.elasticsearch+json;compatible-with=9"
    } else {
        "application/vnd.elasticsearch+json;compatible-with=8"
    })
}

fn id_text(v: &Value) -> ApiResult<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        _ => Err(ApiError::parsing(format!(
            "an id must be a string, got [{v}]"
        ))),
    }
}

fn update_op(id: &str, body: &Value, expect: Expect) -> ApiResult<DocOp> {
    if body.get("script").is_some() {
        return Err(ApiError::illegal(
            "scripted updates are not supported by Sluice; send a partial document as [doc]",
        ));
    }
    if let Some(m) = body.as_object() {
        for k in m.keys() {
            if !matches!(
                k.as_str(),
                "doc" | "upsert" | "doc_as_upsert" | "detect_noop" | "_source" | "scripted_upsert"
            ) {
                return Err(ApiError::parsing(format!(
                    "[UpdateRequest] unknown field [{k}]"
                )));
            }
        }
    }
    let doc = body.get("doc").cloned();
    let upsert = body.get("upsert").cloned();
    if doc.is_none() && upsert.is_none() {
        return Err(ApiError::new(
            400,
            "action_request_validation_exception",
            "Validation Failed: 1: script or doc is missing;",
        ));
    }
    Ok(DocOp::Update {
        id: id.to_string(),
        doc,
        upsert,
        doc_as_upsert: body
            .get("doc_as_upsert")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        expect,
    })
}

struct BulkItem {
    index: String,
    action: &'static str,
    id: Option<String>,
    op: ApiResult<DocOp>,
}

/// Most operations one `_bulk` request may carry.
pub const MAX_BULK_ITEMS: usize = 1_000_000;

fn parse_bulk(body: &[u8], default_index: Option<&str>) -> ApiResult<Vec<BulkItem>> {
    let mut lines = body
        .split(|&b| b == b'\n')
        .enumerate()
        .filter(|(_, l)| !l.iter().all(u8::is_ascii_whitespace));
    let mut items = Vec::new();
    while let Some((n, line)) = lines.next() {
        let action: Value = serde_json::from_slice(line).map_err(|e| {
            ApiError::illegal(format!("Malformed action/metadata line [{}], expected START_OBJECT or END_OBJECT but found [{e}]", n + 1))
        })?;
        let (name, meta) = action
            .as_object()
            .and_then(|m| if m.len() == 1 { m.iter().next() } else { None })
            .ok_or_else(|| ApiError::illegal(format!("Malformed action/metadata line [{}], expected a simple value for field [_index] but found an object", n + 1)))?;
        let action: &'static str = match name.as_str() {
            "index" => "index",
            "create" => "create",
            "update" => "update",
            "delete" => "delete",
            other => {
                return Err(ApiError::illegal(format!(
                    "Malformed action/metadata line [{}], expected field [create], [delete], [index] or [update] but found [{other}]",
                    n + 1
                )))
            }
        };
        let index = meta
            .get("_index")
            .and_then(Value::as_str)
            .or(default_index)
            .ok_or_else(|| {
                ApiError::new(
                    400,
                    "action_request_validation_exception",
                    format!("Validation Failed: 1: index is missing for line {};", n + 1),
                )
            })?;
        let id = meta.get("_id").map(id_text).transpose()?;
        let expect = Expect {
            seq_no: meta.get("if_seq_no").and_then(Value::as_u64),
            primary_term: meta.get("if_primary_term").and_then(Value::as_u64),
        };
        let op = if action == "delete" {
            match &id {
                Some(id) => Ok(DocOp::Delete {
                    id: id.clone(),
                    expect,
                }),
                None => Err(ApiError::new(
                    400,
                    "action_request_validation_exception",
                    "Validation Failed: 1: id is missing;",
                )),
            }
        } else {
            let (_, source) = lines.next().ok_or_else(|| {
                ApiError::illegal(format!("The bulk request must be terminated by a newline [\\n] (the {action} on line {} has no source)", n + 1))
            })?;
            match action {
                "update" => match (&id, serde_json::from_slice::<Value>(source)) {
                    (Some(id), Ok(body)) => update_op(id, &body, expect),
                    (None, _) => Err(ApiError::new(
                        400,
                        "action_request_validation_exception",
                        "Validation Failed: 1: id is missing;",
                    )),
                    (_, Err(e)) => Err(ApiError::not_json("the update body", e)),
                },
                _ => Ok(DocOp::Index {
                    id: id.clone(),
                    source: trim(source).to_vec(),
                    create: action == "create"
                        || meta.get("op_type").and_then(Value::as_str) == Some("create"),
                    expect,
                }),
            }
        };
        items.push(BulkItem {
            index: index.to_string(),
            action,
            id,
            op,
        });
        if items.len() > MAX_BULK_ITEMS {
            return Err(ApiError::illegal(format!(
                "a bulk request may hold at most {MAX_BULK_ITEMS} operations"
            )));
        }
    }
    if items.is_empty() {
        return Err(ApiError::new(
            400,
            "action_request_validation_exception",
            "Validation Failed: 1: no requests added;",
        ));
    }
    Ok(items)
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &b[start..end]
}

impl Api {
    fn count(&self, req: &Request, idx: Option<&str>) -> ApiResult<Response> {
        let body = body_json(req)?.unwrap_or(json!({}));
        if let Some(m) = body.as_object() {
            if let Some(k) = m.keys().find(|k| k.as_str() != "query") {
                return Err(ApiError::parsing(format!("request does not support [{k}]")));
            }
        }
        let indices = match idx {
            Some(e) => self.catalog.resolve(e)?,
            None => self.catalog.all(),
        };
        let mapping = indices.first().map_or(json!({}), |i| i.mappings());
        let query = dsl::compile(body.get("query"), &mapping)?;
        let generations = RequestCache::generations(&indices);
        let key = RequestCache::key("count", req, &body, &indices, &generations);
        let cached = key.as_deref().and_then(|k| self.request_cache.get(k));
        let n = match cached {
            Some(Cached::Count(n)) => n,
            _ => {
                let n = search::count(self.catalog.store(), &indices, &query)?;
                self.catalog.remember_columns(&indices);
                if let Some(key) = key {
                    self.request_cache.put(key, Cached::Count(n));
                }
                n
            }
        };
        let total_shards = indices.iter().map(|i| i.shards).sum::<u32>().max(1);
        ok(200, &json!({"count": n, "_shards": shards(total_shards)}))
    }

    fn scroll(&self, req: &Request, path_id: Option<&str>) -> ApiResult<Response> {
        let started = Instant::now();
        let body = body_json(req)?.unwrap_or(json!({}));
        let id = body
            .get("scroll_id")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| req.param("scroll_id").map(str::to_string))
            .or_else(|| path_id.map(str::to_string))
            .ok_or_else(|| {
                ApiError::new(
                    400,
                    "action_request_validation_exception",
                    "Validation Failed: 1: scrollId is missing;",
                )
            })?;
        let keep = match body.get("scroll").and_then(Value::as_str) {
            Some(t) => Some(search::parse_keep_alive(t)?),
            None => req
                .param("scroll")
                .map(|t| search::parse_keep_alive_param("scroll", t))
                .transpose()?,
        };
        let (snapshot, indices, spec, source, total) = self
            .contexts
            .with(&id, keep, |c| {
                let spec = c
                    .scroll
                    .clone()
                    .ok_or_else(|| search::context_missing(&id))?;
                Ok((
                    c.snapshot.clone(),
                    c.indices.clone(),
                    spec,
                    c.source.clone(),
                    c.total,
                ))
            })
            .map_err(missing_in_search)?;
        let filter = SourceFilter::from_value(Some(&source))?;
        let mut found = self.run_in_context(&indices, &snapshot, &spec, Some(&id))?;
        if let Some(last) = found.hits.last() {
            let after = last.sort.clone();
            self.contexts.with(&id, None, |c| {
                if let Some(s) = c.scroll.as_mut() {
                    s.search_after = Some(after);
                }
                Ok(())
            })?;
        }
        let total_shards = indices.iter().map(|i| i.shards).sum::<u32>().max(1);
        let extra = format!("\"_scroll_id\":{},", json_escape(&id));
        // Every page shows the total the first one counted.
        let mut shown = spec;
        if let Some((n, exact)) = total {
            (found.total, found.exact) = (n, exact);
            shown.track_total = TrackTotal::UpTo(u64::MAX);
        }
        self.search_response(&shown, &filter, found, total_shards, started, Some(&extra))
    }

    fn clear_scroll(&self, req: &Request, path_id: Option<&str>) -> ApiResult<Response> {
        let body = body_json(req)?.unwrap_or(json!({}));
        if path_id == Some("_all") {
            let n: usize = self.contexts.close_all(false).iter().map(|(_, n)| n).sum();
            return ok(200, &json!({"succeeded": true, "num_freed": n}));
        }
        let mut ids: Vec<String> = strings(body.get("scroll_id")).unwrap_or_default();
        if let Some(p) = path_id {
            ids.extend(p.split(',').map(str::to_string));
        }
        if let Some(p) = req.param("scroll_id") {
            ids.extend(p.split(',').map(str::to_string));
        }
        if ids.is_empty() {
            return Err(ApiError::new(
                400,
                "action_request_validation_exception",
                "Validation Failed: 1: no scroll ids specified;",
            ));
        }
        let freed: usize = ids.iter().filter_map(|id| self.contexts.close(id)).sum();
        ok(
            if freed == 0 { 404 } else { 200 },
            &json!({"succeeded": true, "num_freed": freed}),
        )
    }

    fn open_pit(&self, req: &Request, expression: &str, opensearch: bool) -> ApiResult<Response> {
        let keep = req.param("keep_alive").ok_or_else(|| {
            ApiError::new(
                400,
                "action_request_validation_exception",
                "Validation Failed: 1: [keep_alive] is not specified;",
            )
        })?;
        let keep = search::parse_keep_alive_param("keep_alive", keep)?;
        let indices = self.catalog.resolve(expression)?;
        let total_shards = indices.iter().map(|i| i.shards).sum::<u32>().max(1);
        let id = self.contexts.open(Context {
            snapshot: self.catalog.store().snapshot(),
            indices,
            scroll: None,
            source: Value::Bool(true),
            expires: Instant::now() + keep,
            slice_bounds: Default::default(),
            resumes: Vec::new(),
            pit: true,
            total: None,
        })?;
        if opensearch {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            return ok(
                200,
                &json!({"pit_id": id, "_shards": shards(total_shards), "creation_time": now_ms}),
            );
        }
        ok(200, &json!({"id": id, "_shards": shards(total_shards)}))
    }

    fn close_pit_es(&self, req: &Request) -> ApiResult<Response> {
        let body = body_json(req)?.unwrap_or(json!({}));
        let id = body.get("id").and_then(Value::as_str).ok_or_else(|| {
            ApiError::new(
                400,
                "action_request_validation_exception",
                "Validation Failed: 1: point in time id is missing;",
            )
        })?;
        let freed = self.contexts.close(id).unwrap_or(0);
        ok(
            if freed == 0 { 404 } else { 200 },
            &json!({"succeeded": true, "num_freed": freed}),
        )
    }

    fn close_pit_os(&self, req: &Request, all: bool) -> ApiResult<Response> {
        let ids: Vec<(String, bool)> = if all {
            self.contexts
                .close_all(true)
                .into_iter()
                .map(|(id, _)| (id, true))
                .collect()
        } else {
            let body = body_json(req)?.unwrap_or(json!({}));
            let wanted: Vec<String> = strings(body.get("pit_id")).ok_or_else(|| {
                ApiError::new(
                    400,
                    "action_request_validation_exception",
                    "Validation Failed: 1: no pit ids specified;",
                )
            })?;
            wanted
                .into_iter()
                .map(|id| {
                    let ok = self.contexts.close(&id).is_some();
                    (id, ok)
                })
                .collect()
        };
        if !all && ids.iter().all(|(_, ok)| !ok) {
            return Err(ApiError::new(
                404,
                "resource_not_found_exception",
                "pit is not found",
            ));
        }
        let pits: Vec<Value> = ids
            .into_iter()
            .map(|(id, ok)| json!({"successful": ok, "pit_id": id}))
            .collect();
        ok(200, &json!({"pits": pits}))
    }
}
