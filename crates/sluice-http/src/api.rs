//! The routes: requests in, Elasticsearch-shaped responses out.

use crate::catalog::Catalog;
use crate::docs::Docs;
use crate::error::{ApiError, ApiResult};
use crate::search::Contexts;
use crate::wire::{Request, Response};
use serde_json::{json, Value};
use sluice_store::Store;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

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
    pub(crate) catalog: Catalog,
    pub(crate) docs: Docs,
    pub(crate) contexts: Contexts,
    /// Answers of counts and size-0 searches.
    pub request_cache: crate::reqcache::RequestCache,
    /// Requests served.
    pub requests: AtomicU64,
    /// Requests answered with a 4xx or 5xx status.
    pub errors: AtomicU64,
    latency_us: std::sync::Mutex<Latency>,
    /// The last ten minutes, for the console's charts.
    history: crate::history::History,
    extra: std::sync::OnceLock<ExtraStats>,
    extra_metrics: std::sync::OnceLock<ExtraMetrics>,
    cluster_uuid: String,
    /// `action.destructive_requires_name` (true by default, as in
    /// Elasticsearch 8): deleting indices takes their names, not `_all`
    /// or a wildcard.
    pub(crate) destructive_requires_name: std::sync::atomic::AtomicBool,
    native_budget: crate::native::NativeBudget,
}

/// HTTP request latency in µs: since start (stats, metrics) and since
/// the last history sample (the console's charts).
struct Latency {
    since_start: hdrhistogram::Histogram<u64>,
    interval: hdrhistogram::Histogram<u64>,
}

/// The longest latency recorded: an hour (longer ones count as an hour).
const MAX_LATENCY_US: u64 = 3_600_000_000;

impl Latency {
    fn new() -> Result<Latency, sluice_store::StoreError> {
        let histogram = || {
            hdrhistogram::Histogram::new_with_bounds(1, MAX_LATENCY_US, 2)
                .map_err(|e| sluice_store::StoreError::BadInput(e.to_string()))
        };
        Ok(Latency {
            since_start: histogram()?,
            interval: histogram()?,
        })
    }

    fn record(&mut self, us: u64) {
        let us = us.clamp(1, MAX_LATENCY_US);
        // Both within bounds: recording cannot fail.
        let _ = self.since_start.record(us);
        let _ = self.interval.record(us);
    }

    /// The interval's figures, and a new interval.
    fn take_interval(&mut self) -> crate::history::IntervalLatency {
        let h = &self.interval;
        let figures = crate::history::IntervalLatency {
            requests: h.len(),
            p50_us: h.value_at_quantile(0.5),
            p90_us: h.value_at_quantile(0.9),
            p99_us: h.value_at_quantile(0.99),
            max_us: h.max(),
        };
        self.interval.reset();
        figures
    }
}

pub(crate) fn shards(n: u32) -> Value {
    json!({"total": n, "successful": n, "skipped": 0, "failed": 0})
}

pub(crate) fn write_shards() -> Value {
    json!({"total": 1, "successful": 1, "failed": 0})
}

pub(crate) fn ok(status: u16, v: &Value) -> ApiResult<Response> {
    Ok(Response::json(status, v.to_string().into_bytes()))
}

pub(crate) fn body_json(req: &Request) -> ApiResult<Option<Value>> {
    if req.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    serde_json::from_slice(&req.body)
        .map(Some)
        .map_err(|e| ApiError::not_json("the request body", e))
}

pub(crate) fn json_escape(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// A string or an array of strings (as Elasticsearch takes ids and field
/// lists); None for anything else.
pub(crate) fn strings(v: Option<&Value>) -> Option<Vec<String>> {
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
pub(crate) fn write_json_string(out: &mut Vec<u8>, text: &str) {
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
            latency_us: std::sync::Mutex::new(Latency::new()?),
            history: Default::default(),
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
        let latency = self.latency_us.lock().unwrap_or_else(|p| p.into_inner());
        let h = &latency.since_start;
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

    /// Takes one reading for the console's history: the sampler started
    /// with the HTTP server calls it once a second.
    pub fn sample_history(&self) {
        let store = self.catalog.store();
        let s = store.stats();
        let marks = store.log_marks();
        let mut io = sluice_io::IoCountsSnapshot::default();
        for d in &s.device_io {
            io += *d;
        }
        let extra = self.extra_stats().filter(|v| !v.is_null());
        let log_block_bytes = sluice_store::blocks::STORE_BLOCK_BYTES as u64;
        let totals = crate::history::Totals {
            at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            http_requests: self.requests.load(Ordering::Relaxed),
            resp_commands: extra
                .as_ref()
                .and_then(|v| v["commands_processed"].as_u64()),
            resp_latency_buckets: extra
                .as_ref()
                .and_then(|v| v["latency_buckets"].as_array())
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default(),
            device_bytes: [
                [io.high.read_bytes, io.high.write_bytes],
                [io.low.read_bytes, io.low.write_bytes],
            ],
            wal_written_bytes: marks.written * log_block_bytes,
            wal_durable_bytes: marks.durable * log_block_bytes,
            compaction_debt_bytes: s.compaction_debt_bytes,
            compactions: s.compactions,
            flushes: s.flushes,
        };
        let http = self
            .latency_us
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take_interval();
        self.history.record(totals, http);
    }

    /// The samples of the last ten minutes (after `since_ms`, if given).
    pub fn history_json(&self, since_ms: Option<u64>) -> Value {
        self.history.json(since_ms)
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
        let latency = self.latency_us.lock().unwrap_or_else(|p| p.into_inner());
        let h = &latency.since_start;
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
        self.latency_us
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(us);
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
}

pub(crate) fn compat_type(req: &Request) -> Option<&'static str> {
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
