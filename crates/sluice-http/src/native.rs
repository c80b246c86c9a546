//! Sluice's own endpoints beside the Elasticsearch API (`/_sluice/...`):
//! near-data queries and aggregates, Betweenness Centrality, the nKV demo
//! scenario, live statistics and the web console. Queries and BC answer
//! JSON, or an Arrow IPC stream when the request accepts
//! `application/vnd.apache.arrow.stream`.

use crate::api::Api;
use crate::error::{ApiError, ApiResult};
use crate::wire::{Request, Response};
use arrow_array::{ArrayRef, Float64Array, RecordBatch, RecordBatchIterator, UInt64Array};
use serde_json::{json, Value};
use sluice_ndp::aggregate::aggregate;
use sluice_ndp::query::{Query, QueryText};
use sluice_ndp::scan;
use sluice_store::Store;
use std::sync::Arc;
use std::time::Instant;

/// The Arrow IPC stream media type.
pub const ARROW_STREAM: &str = "application/vnd.apache.arrow.stream";
/// Rows a JSON query answer holds at most (ask for Arrow, or page with
/// `start`, for more).
pub const MAX_JSON_ROWS: usize = 100_000;
/// Rows an Arrow query answer holds at most (it is built in memory).
pub const MAX_ARROW_ROWS: usize = 10_000_000;

/// What to do when the store has no paper data set.
const PAPERS_NEXT_STEP: &str =
    "this store holds no paper data set: generate one from the console's \
     Generate button (POST /_sluice/demo/generate {\"papers\": 10000}), or stop the server and run \
     `sluice papers --device DEVICE generate`";

/// The most papers `POST /_sluice/demo/generate` writes: about a minute's
/// work here (the CLI has no such limit).
pub const MAX_GENERATED_PAPERS: usize = 1_000_000;

fn no_papers() -> ApiError {
    ApiError::new(404, "resource_not_found_exception", PAPERS_NEXT_STEP)
}

const CONSOLE_HTML: &str = include_str!("../assets/console.html");

fn wants_arrow(req: &Request) -> bool {
    req.header("accept")
        .is_some_and(|a| a.contains(ARROW_STREAM))
}

fn arrow_response(
    batches: Vec<RecordBatch>,
    schema: arrow_schema::SchemaRef,
) -> ApiResult<Response> {
    let reader = RecordBatchIterator::new(batches.into_iter().map(Ok), schema);
    let mut body = Vec::new();
    sluice_arrow::ipc::write_stream(reader, &mut body)
        .map_err(|e| ApiError::store(e.to_string()))?;
    Ok(Response {
        status: 200,
        content_type: ARROW_STREAM,
        headers: Vec::new(),
        body,
    })
}

fn text(body: &Value, name: &str) -> ApiResult<Option<String>> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(a)) if name == "select" => Ok(Some(
            a.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(","),
        )),
        Some(other) => Err(ApiError::illegal(format!(
            "[{name}] must be a string, got [{other}]"
        ))),
    }
}

fn usize_of(body: &Value, name: &str, default: usize, max: usize) -> ApiResult<usize> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_u64()
            .map(|n| n as usize)
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| {
                ApiError::illegal(format!(
                    "[{name}] must be a number from 1 to {max}, got [{v}]"
                ))
            }),
    }
}

/// A key as JSON: its text where it is printable UTF-8, else its bytes in
/// hex (as `sluice query` prints keys).
fn key_json(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(s) if !s.chars().any(char::is_control) => json!(s).to_string(),
        _ => json!(key.iter().map(|b| format!("{b:02x}")).collect::<String>()).to_string(),
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Threads a request asks for, held to the machine's cores: more would
/// only take turns, each with its own working memory.
fn threads_of(body: &Value) -> ApiResult<usize> {
    Ok(usize_of(body, "threads", cores(), 256)?.min(cores()))
}

/// Memory the graph endpoints' requests (BC, the demo) may hold at once,
/// all of them together: each reserves what it asks for before it builds
/// anything, and a request past what is left is answered 429, as
/// Elasticsearch's circuit breakers answer.
#[derive(Debug)]
pub struct NativeBudget {
    limit_bytes: std::sync::atomic::AtomicU64,
    held_bytes: std::sync::atomic::AtomicU64,
}

/// The default [`NativeBudget`]: 1 GiB.
pub const DEFAULT_NATIVE_BUDGET_BYTES: u64 = 1 << 30;

impl Default for NativeBudget {
    fn default() -> Self {
        NativeBudget {
            limit_bytes: DEFAULT_NATIVE_BUDGET_BYTES.into(),
            held_bytes: 0.into(),
        }
    }
}

/// Bytes of a [`NativeBudget`] held until dropped.
struct Reservation<'a> {
    budget: &'a NativeBudget,
    bytes: u64,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.budget
            .held_bytes
            .fetch_sub(self.bytes, std::sync::atomic::Ordering::AcqRel);
    }
}

impl NativeBudget {
    /// Sets the limit (requests holding more keep it until they end).
    pub fn set_limit_bytes(&self, limit_bytes: u64) {
        self.limit_bytes
            .store(limit_bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// The limit in MiB, what one request may ask for at most.
    fn limit_mib(&self) -> usize {
        (self.limit_bytes.load(std::sync::atomic::Ordering::Relaxed) >> 20) as usize
    }

    /// Holds `bytes` for one request, or says why it cannot.
    fn reserve(&self, bytes: u64) -> ApiResult<Reservation<'_>> {
        use std::sync::atomic::Ordering;
        let limit = self.limit_bytes.load(Ordering::Relaxed);
        self.held_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|total| *total <= limit)
            })
            .map(|_| Reservation {
                budget: self,
                bytes,
            })
            .map_err(|held| {
                ApiError::new(
                    429,
                    "circuit_breaking_exception",
                    format!(
                        "[sluice_native] Data too large: this request asks for [{bytes}] bytes and other requests hold [{held}] of the limit of [{limit}] (--http-native-memory-mib); ask for less with [memory_mib] or retry when they are done"
                    ),
                )
                .with("bytes_wanted", json!(bytes))
                .with("bytes_limit", json!(limit))
                .with("durability", json!("TRANSIENT"))
            })
    }
}

/// A `/_sluice/query` answer past `cap` bytes: refused as Elasticsearch's
/// circuit breakers refuse what would not fit, with what to ask instead.
fn answer_too_large(cap: usize) -> ApiError {
    ApiError::new(
        429,
        "circuit_breaking_exception",
        format!(
            "[sluice_native] Data too large: the answer passed [{cap}] bytes (a quarter of \
             --http-native-memory-mib); ask for fewer rows with [limit], fewer columns with \
             [select], or a narrower [where], and page through with more requests"
        ),
    )
    .with("bytes_limit", json!(cap))
    .with("durability", json!("PERMANENT"))
}

impl Api {
    /// The most one `/_sluice/query` answer may hold in memory: a quarter
    /// of the native budget (several answers may be built at once).
    fn answer_cap_bytes(&self) -> usize {
        let limit = self
            .native_budget()
            .limit_bytes
            .load(std::sync::atomic::Ordering::Relaxed);
        (limit / 4).max(1 << 20) as usize
    }

    /// The keyspace a native request names: `keyspace` directly, or the
    /// documents of `index`.
    fn keyspace_name(&self, body: &Value) -> ApiResult<String> {
        if let Some(index) = body.get("index").and_then(Value::as_str) {
            let i = self.catalog().get(index)?;
            return Ok(format!("http.{}.docs", i.uuid));
        }
        let name = body
            .get("keyspace")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::illegal("name a [keyspace] of the store or an [index]"))?;
        match self.catalog().store().keyspace(name) {
            Ok(_) => Ok(name.to_string()),
            Err(sluice_store::StoreError::UnknownKeyspace { .. }) => Err(self.no_keyspace(name)),
            Err(e) => Err(ApiError::store(e)),
        }
    }

    /// The answer to a keyspace the store does not have: what it has
    /// instead, in the names a user gave (the API's and the Redis
    /// keyspace's own keyspaces are left out: they are not queried by
    /// name).
    fn no_keyspace(&self, name: &str) -> ApiError {
        let keyspaces: Vec<String> = self.user_keyspaces().into_iter().map(|d| d.name).collect();
        let indices: Vec<String> = self
            .catalog()
            .all()
            .iter()
            .map(|i| i.name.clone())
            .collect();
        let list = |names: &[String]| {
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        };
        let mut reason = format!(
            "no keyspace [{name}] in this store; its keyspaces: {}; its indices (query one with [index]): {}",
            list(&keyspaces),
            list(&indices)
        );
        if name == "papers" {
            reason.push_str(&format!("; {PAPERS_NEXT_STEP}"));
        }
        ApiError::new(404, "resource_not_found_exception", reason)
    }

    pub(crate) fn native(&self, req: &Request, parts: &[&str]) -> ApiResult<Response> {
        match (req.method.as_str(), parts) {
            ("GET", ["console"]) => Ok(Response {
                status: 200,
                content_type: "text/html; charset=UTF-8",
                headers: vec![("Cache-Control", "no-store".into())],
                body: CONSOLE_HTML.as_bytes().to_vec(),
            }),
            ("GET", ["metrics"]) => Ok(self.metrics()),
            ("GET", ["stats"]) => Ok(Response::json(
                200,
                self.stats_json().to_string().into_bytes(),
            )),
            ("GET", ["stats", "history"]) => {
                let since_ms = match req.param("since_ms") {
                    None => None,
                    Some(t) => Some(t.parse::<u64>().map_err(|_| {
                        ApiError::illegal(format!(
                            "[since_ms] must be a time in ms since the Unix epoch, not [{t}]"
                        ))
                    })?),
                };
                Ok(Response::json(
                    200,
                    self.history_json(since_ms).to_string().into_bytes(),
                ))
            }
            ("POST", ["query"]) => self.native_query(req),
            ("POST", ["graph", "bc"]) => self.native_bc(req),
            ("GET", ["keyspaces"]) => Ok(Response::json(
                200,
                self.keyspaces_json().to_string().into_bytes(),
            )),
            ("GET", ["demo"]) => self.demo_status(),
            ("POST", ["demo"]) => self.native_demo(req),
            ("POST", ["demo", "generate"]) => self.generate_papers(req),
            _ => Err(ApiError::new(
                400,
                "no_handler_exception",
                format!(
                    "no handler found for uri [{}] and method [{}]",
                    req.path, req.method
                ),
            )),
        }
    }

    fn body(req: &Request) -> ApiResult<Value> {
        if req.body.iter().all(u8::is_ascii_whitespace) {
            return Ok(json!({}));
        }
        serde_json::from_slice(&req.body).map_err(|e| ApiError::not_json("the request body", e))
    }

    fn native_query(&self, req: &Request) -> ApiResult<Response> {
        let started = Instant::now();
        let body = Self::body(req)?;
        let keyspace = self.keyspace_name(&body)?;
        let predicate = text(&body, "where")?;
        let select = text(&body, "select")?;
        let aggregate_text = text(&body, "aggregate")?;
        let group_by = text(&body, "group_by")?;
        let threads = threads_of(&body)?;
        let arrow = wants_arrow(req);
        let store = self.catalog().store().clone();
        if let Some(aggs) = &aggregate_text {
            if arrow {
                let batch = sluice_arrow::query::aggregate_batch(
                    &store,
                    &keyspace,
                    predicate.as_deref(),
                    aggs,
                    group_by.as_deref(),
                    threads,
                )
                .map_err(|e| ApiError::illegal(e.to_string()))?;
                let schema = batch.schema();
                return arrow_response(vec![batch], schema);
            }
            return self.aggregate_json(
                &store,
                &keyspace,
                predicate.as_deref(),
                aggs,
                group_by.as_deref(),
                threads,
                started,
            );
        }
        let max = if arrow { MAX_ARROW_ROWS } else { MAX_JSON_ROWS };
        let limit = usize_of(&body, "limit", max, max)?;
        if arrow {
            let options = sluice_arrow::query::QueryOptions {
                predicate: predicate.clone(),
                select: select
                    .as_ref()
                    .map(|s| s.split(',').map(|p| p.trim().to_string()).collect()),
                limit: Some(limit),
                threads,
                ..Default::default()
            };
            let stream = sluice_arrow::query::query_stream(store, &keyspace, &options)
                .map_err(|e| ApiError::illegal(e.to_string()))?;
            let schema = arrow_array::RecordBatchReader::schema(&stream);
            let cap = self.answer_cap_bytes();
            let (mut batches, mut held) = (Vec::new(), 0usize);
            for batch in stream {
                let batch = batch.map_err(|e| ApiError::store(e.to_string()))?;
                held += batch.get_array_memory_size();
                if held > cap {
                    return Err(answer_too_large(cap));
                }
                batches.push(batch);
            }
            return arrow_response(batches, schema);
        }
        let query = Query::parse(&QueryText {
            predicate: predicate.as_deref(),
            select: select.as_deref(),
            ..QueryText::default()
        })
        .map_err(|e| ApiError::illegal(e.to_string()))?;
        let def = store
            .keyspace_def(&keyspace)
            .map_err(|e| ApiError::illegal(e.to_string()))?;
        let plan = query
            .plan(&def)
            .map_err(|e| ApiError::illegal(e.to_string()))?;
        let spec = plan.scan_spec(false, limit, 1 << 20, threads);
        let as_record = plan.record_output();
        let mut out = b"{\"rows\":[".to_vec();
        let mut first = true;
        let mut value_text = Vec::new();
        let cap = self.answer_cap_bytes();
        let mut too_large = false;
        let scanned = scan::scan(&store, &spec, &mut |batch| {
            if out.len() > cap {
                too_large = true;
                return Err(scan::ScanError::Sink("the answer passed its cap".into()));
            }
            for (k, v) in batch.rows() {
                if !first {
                    out.push(b',');
                }
                first = false;
                out.extend_from_slice(b"{\"key\":");
                out.extend_from_slice(key_json(k).as_bytes());
                out.extend_from_slice(b",\"value\":");
                match (as_record, def.format) {
                    (Some(layout), _) => {
                        value_text.clear();
                        layout.to_json(v, &mut value_text).map_err(|e| {
                            scan::ScanError::Malformed {
                                key: String::from_utf8_lossy(k).into(),
                                error: e,
                            }
                        })?;
                        out.extend_from_slice(&value_text);
                    }
                    (None, sluice_store::ValueFormat::Json) => out.extend_from_slice(v),
                    (None, _) => out.extend_from_slice(
                        json!(String::from_utf8_lossy(v)).to_string().as_bytes(),
                    ),
                }
                out.push(b'}');
            }
            Ok(())
        });
        let stats = scanned.map_err(|e| {
            if too_large {
                answer_too_large(cap)
            } else {
                ApiError::store(e.to_string())
            }
        })?;
        if out.len() > cap {
            return Err(answer_too_large(cap));
        }
        out.extend_from_slice(
            format!(
                "],\"took\":{},\"stats\":{{\"rows_examined\":{},\"bytes_examined\":{},\"rows_returned\":{},\"bytes_handed_over\":{}}}}}",
                started.elapsed().as_millis(),
                stats.rows_examined,
                stats.bytes_examined,
                stats.rows_returned,
                stats.bytes_returned
            )
            .as_bytes(),
        );
        Ok(Response::json(200, out))
    }

    #[allow(clippy::too_many_arguments)]
    fn aggregate_json(
        &self,
        store: &Store,
        keyspace: &str,
        predicate: Option<&str>,
        aggs: &str,
        group_by: Option<&str>,
        threads: usize,
        started: Instant,
    ) -> ApiResult<Response> {
        let query = Query::parse(&QueryText {
            predicate,
            aggregate: Some(aggs),
            group_by,
            ..QueryText::default()
        })
        .map_err(|e| ApiError::illegal(e.to_string()))?;
        let def = store
            .keyspace_def(keyspace)
            .map_err(|e| ApiError::illegal(e.to_string()))?;
        let plan = query
            .plan(&def)
            .map_err(|e| ApiError::illegal(e.to_string()))?;
        let spec = plan.aggregate_spec(threads).ok_or_else(|| {
            ApiError::illegal(format!(
                "keyspace {keyspace} holds raw values: nothing to aggregate"
            ))
        })?;
        let (rows, stats) = aggregate(store, &spec).map_err(|e| ApiError::store(e.to_string()))?;
        let names: Vec<String> = spec.aggregates.iter().map(|a| a.to_string()).collect();
        let rows: Vec<Value> = rows
            .into_iter()
            .map(|r| {
                let mut m = serde_json::Map::new();
                if let Some(g) = group_by {
                    let key = r.group.as_deref().map_or(Value::Null, |t| {
                        serde_json::from_str(t).unwrap_or(Value::String(t.into()))
                    });
                    m.insert(g.to_string(), key);
                }
                for (n, v) in names.iter().zip(&r.values) {
                    let value = match v {
                        sluice_ndp::aggregate::AggValue::Int(i) => {
                            i64::try_from(*i).map_or_else(|_| json!(*i as f64), |x| json!(x))
                        }
                        sluice_ndp::aggregate::AggValue::Float(f) => json!(f),
                        sluice_ndp::aggregate::AggValue::Null => Value::Null,
                    };
                    m.insert(n.clone(), value);
                }
                Value::Object(m)
            })
            .collect();
        Ok(Response::json(
            200,
            json!({
                "rows": rows,
                "took": started.elapsed().as_millis() as u64,
                "stats": {"rows_examined": stats.rows_examined, "bytes_examined": stats.bytes_examined, "rows_returned": stats.rows_returned},
            })
            .to_string()
            .into_bytes(),
        ))
    }

    fn native_bc(&self, req: &Request) -> ApiResult<Response> {
        let started = Instant::now();
        let body = Self::body(req)?;
        // What the request may hold is settled before anything is read.
        let budget = self.native_budget();
        let most_mib = budget.limit_mib().max(1);
        let memory_mib = usize_of(&body, "memory_mib", most_mib.min(1024), most_mib)?;
        let threads = threads_of(&body)?;
        let _held = budget.reserve((memory_mib as u64) << 20)?;
        let store = self.catalog().store();
        let edges = body
            .get("keyspace")
            .and_then(Value::as_str)
            .unwrap_or("refs");
        let ks = store
            .keyspace(edges)
            .map_err(|e| ApiError::illegal(e.to_string()))?;
        let top = usize_of(&body, "top", 10, 1_000_000)?;
        let sources = match body.get("sources") {
            None | Some(Value::Null) => None,
            Some(_) => Some(usize_of(&body, "sources", 1, usize::MAX)?),
        };
        let seed = body.get("seed").and_then(Value::as_u64).unwrap_or(1);
        let g =
            sluice_ndp::graph::Csr::build(store, ks, (memory_mib as u64) << 20, &mut |_, _| true)
                .map_err(|e| ApiError::illegal(e.to_string()))?;
        let bc = match sources {
            Some(k) => g.betweenness_sampled(k, seed, threads),
            None => g.betweenness(threads),
        }
        .map_err(|e| ApiError::illegal(e.to_string()))?;
        let mut order: Vec<usize> = (0..bc.len()).collect();
        order.sort_by(|&a, &b| bc[b].total_cmp(&bc[a]).then(a.cmp(&b)));
        order.truncate(top);
        if wants_arrow(req) {
            let ids: ArrayRef = Arc::new(UInt64Array::from(
                order.iter().map(|&v| g.ids[v]).collect::<Vec<u64>>(),
            ));
            let values: ArrayRef = Arc::new(Float64Array::from(
                order.iter().map(|&v| bc[v]).collect::<Vec<f64>>(),
            ));
            let batch = RecordBatch::try_from_iter(vec![("id", ids), ("betweenness", values)])
                .map_err(|e| ApiError::store(e.to_string()))?;
            let schema = batch.schema();
            return arrow_response(vec![batch], schema);
        }
        let rows: Vec<Value> = order
            .iter()
            .map(|&v| json!({"id": g.ids[v], "betweenness": bc[v]}))
            .collect();
        Ok(Response::json(
            200,
            json!({
                "top": rows,
                "vertices": g.vertices(),
                "edges": g.edges(),
                "exact": sources.is_none(),
                "took": started.elapsed().as_millis() as u64,
            })
            .to_string()
            .into_bytes(),
        ))
    }

    fn native_demo(&self, req: &Request) -> ApiResult<Response> {
        let body = Self::body(req)?;
        let venue = body
            .get("venue")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::illegal("name a [venue]"))?;
        let year = body
            .get("year")
            .and_then(Value::as_u64)
            .and_then(|y| u32::try_from(y).ok())
            .ok_or_else(|| ApiError::illegal("give a [year]"))?;
        let q = sluice_ndp::demo::DemoQuery {
            venue: venue.to_string(),
            year,
            sources: match body.get("sources") {
                None | Some(Value::Null) => Some(64),
                Some(_) => Some(usize_of(&body, "sources", 64, 1 << 20)?),
            },
            seed: 1,
            list: usize_of(&body, "list", 10, 1000)?,
            memory_bytes: 1 << 30,
            threads: cores(),
        };
        let _held = self.native_budget().reserve(q.memory_bytes)?;
        let r = sluice_ndp::demo::run(self.catalog().store(), &q).map_err(|e| match e {
            sluice_ndp::demo::DemoError::NoPapers => no_papers(),
            e => ApiError::illegal(e.to_string()),
        })?;
        let parse =
            |t: &str| serde_json::from_str::<Value>(t).unwrap_or(Value::String(t.to_string()));
        Ok(Response::json(
            200,
            json!({
                "candidates": r.candidates,
                "central": r.central.as_ref().map(|(id, bc, doc)| json!({"id": id, "betweenness": bc, "paper": parse(doc)})),
                "same_venue_year": r.same_venue_year.iter().map(|d| parse(d)).collect::<Vec<_>>(),
                "same_author": r.same_author.iter().map(|d| parse(d)).collect::<Vec<_>>(),
                "graph": {"vertices": r.graph_vertices, "edges": r.graph_edges},
                "engine": {"ms": r.ours.as_secs_f64() * 1e3, "bytes_handed_over": r.ours_bytes_handed_over},
                "block_stack": {"ms": r.block_stack.as_secs_f64() * 1e3, "bytes_handed_over": r.block_stack_bytes_handed_over},
            })
            .to_string()
            .into_bytes(),
        ))
    }

    /// The store's keyspaces a user made and queries by name: all but the
    /// HTTP API's and the Redis keyspace's own.
    fn user_keyspaces(&self) -> Vec<sluice_store::KeyspaceDef> {
        let own = |k: &str| k.starts_with("http.") || k.starts_with("redis.");
        let mut defs = self.catalog().store().keyspaces();
        defs.retain(|d| !own(&d.name));
        defs
    }

    /// `GET /_sluice/keyspaces`: the keyspaces a query may name, with the
    /// format of their values.
    fn keyspaces_json(&self) -> Value {
        let list: Vec<Value> = self
            .user_keyspaces()
            .iter()
            .map(|d| json!({"name": d.name, "format": d.format.name()}))
            .collect();
        json!({ "keyspaces": list })
    }

    /// `GET /_sluice/demo`: whether the store holds the demo's paper data
    /// set, and if not what to do.
    fn demo_status(&self) -> ApiResult<Response> {
        let store = self.catalog().store();
        let found = sluice_ndp::papers::find_keyspaces(store).map_err(ApiError::store)?;
        let available = match &found {
            Some(ks) => {
                let snapshot = store.snapshot();
                let all = (std::ops::Bound::Unbounded, std::ops::Bound::Unbounded);
                match store.iter(ks.papers, all, &snapshot, false).next() {
                    Some(row) => row.map(|_| true).map_err(ApiError::store)?,
                    None => false,
                }
            }
            None => false,
        };
        let mut v = json!({"available": available});
        if !available {
            v["next_step"] = json!(PAPERS_NEXT_STEP);
        }
        Ok(Response::json(200, v.to_string().into_bytes()))
    }

    /// `POST /_sluice/demo/generate`: writes a seeded paper data set into
    /// the served store (`papers`, default 10,000, at most
    /// [`MAX_GENERATED_PAPERS`]; `seed`, default 42). Refused when the store
    /// has one already: two would mix.
    fn generate_papers(&self, req: &Request) -> ApiResult<Response> {
        let started = Instant::now();
        let body = Self::body(req)?;
        let n = usize_of(&body, "papers", 10_000, MAX_GENERATED_PAPERS)?;
        if n == 0 {
            return Err(ApiError::illegal("[papers] must be at least 1"));
        }
        let seed = match body.get("seed") {
            None | Some(Value::Null) => 42,
            Some(v) => v
                .as_u64()
                .ok_or_else(|| ApiError::illegal("[seed] must be a whole number"))?,
        };
        let store = self.catalog().store();
        if sluice_ndp::papers::find_keyspaces(store)
            .map_err(ApiError::store)?
            .is_some()
        {
            return Err(ApiError::new(
                409,
                "resource_already_exists_exception",
                "this store holds a paper data set already (keyspaces papers, authors, venues and refs): run the demo on it",
            ));
        }
        let cfg = sluice_ndp::papers::PaperConfig::demo(n as u64, seed);
        let counts =
            sluice_ndp::papers::generate(store, &cfg, &mut |_| {}).map_err(ApiError::store)?;
        Ok(Response::json(
            200,
            json!({
                "papers": counts.papers,
                "authors": counts.authors,
                "venues": counts.venues,
                "references": counts.refs,
                "bytes": counts.bytes,
                "took": started.elapsed().as_millis() as u64,
            })
            .to_string()
            .into_bytes(),
        ))
    }

    /// Live figures for the console: requests, latency, device I/O by
    /// priority, the log's marks, compaction debt.
    pub fn stats_json(&self) -> Value {
        let store = self.catalog().store();
        let s = store.stats();
        let marks = store.log_marks();
        let mut io = sluice_io::IoCountsSnapshot::default();
        for d in &s.device_io {
            io += *d;
        }
        let class = |c: &sluice_io::device::ClassSnapshot| json!({"reads": c.reads, "read_bytes": c.read_bytes, "writes": c.writes, "write_bytes": c.write_bytes, "flushes": c.flushes});
        let (scrolls, pits) = self.open_contexts();
        let (cache_entries, cache_bytes) = self.request_cache.usage();
        let mut v = json!({
            "http": self.http_stats(),
            "store": {
                "last_sequence": s.last_sequence,
                "wal": {"last_written": marks.written, "last_durable": marks.durable},
                "compaction_debt_bytes": s.compaction_debt_bytes,
                "flushes": s.flushes,
                "compactions": s.compactions,
                "tables_per_level": s.tables_per_level,
                "block_cache": {"hits": s.block_cache_hits, "misses": s.block_cache_misses, "used_bytes": s.block_cache_used_bytes},
                "device_io": {"high": class(&io.high), "low": class(&io.low)},
                "free_blocks": s.free_blocks,
                "device_blocks": s.device_blocks,
            },
            "contexts": {"scroll": scrolls, "point_in_time": pits},
            "request_cache": {
                "hits": self.request_cache.hits.load(std::sync::atomic::Ordering::Relaxed),
                "misses": self.request_cache.misses.load(std::sync::atomic::Ordering::Relaxed),
                "entries": cache_entries,
                "bytes": cache_bytes,
            },
        });
        v["columns"] = self.columns_json();
        if let Some(extra) = self.extra_stats() {
            v["resp"] = extra;
        }
        v
    }

    /// The field columns: the shared budget, and per index what its
    /// columns hold and have answered.
    fn columns_json(&self) -> Value {
        let budget = self.catalog().column_budget();
        let mut indices = serde_json::Map::new();
        for index in self.catalog().all() {
            let c = index.columns.stats();
            indices.insert(
                index.name.clone(),
                json!({"fields": c.fields, "docs": c.docs, "bytes": c.bytes, "builds": c.builds, "answers": c.answers}),
            );
        }
        json!({
            "limit_bytes": budget.limit_bytes(),
            "used_bytes": budget.used_bytes(),
            "indices": indices,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_native_budget_is_shared_and_given_back() {
        let budget = NativeBudget::default();
        budget.set_limit_bytes(64 << 20);
        assert_eq!(budget.limit_mib(), 64);
        let first = budget.reserve(60 << 20).unwrap();
        let refused = budget.reserve(10 << 20).err().unwrap();
        assert_eq!(refused.status, 429);
        assert_eq!(refused.kind, "circuit_breaking_exception");
        assert!(budget.reserve(u64::MAX).is_err(), "a sum past u64 wrapped");
        let small = budget.reserve(4 << 20).unwrap();
        drop(first);
        let again = budget.reserve(60 << 20).unwrap();
        drop((small, again));
        assert_eq!(
            budget.held_bytes.load(std::sync::atomic::Ordering::Relaxed),
            0
        );
    }
}
