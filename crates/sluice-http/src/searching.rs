//! `_search`, `_count`, scroll and point-in-time contexts: a request's
//! query compiled, run against the index, and answered as Elasticsearch does.

use crate::aggs;
use crate::api::*;
use crate::catalog::Index;
use crate::crud::SourceFilter;
use crate::dsl;
use crate::error::{ApiError, ApiResult};
use crate::reqcache::{Cached, RequestCache};
use crate::search::{self, Context, Slice, SortKey, Spec, TrackTotal};
use crate::wire::{Request, Response};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// Puts `aggregations` last in a search answer, inside its closing brace.
fn append_aggregations(response: &mut Response, aggregations: &Value) {
    response.body.pop();
    response.body.extend_from_slice(b",\"aggregations\":");
    response
        .body
        .extend_from_slice(aggregations.to_string().as_bytes());
    response.body.push(b'}');
}

impl Api {
    pub(crate) fn search_spec(
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

    pub(crate) fn search(&self, req: &Request, idx: Option<&str>) -> ApiResult<Response> {
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
    pub(crate) fn run_in_context(
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

    pub(crate) fn search_response(
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

    pub(crate) fn start_scroll(
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

    pub(crate) fn count(&self, req: &Request, idx: Option<&str>) -> ApiResult<Response> {
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

    pub(crate) fn scroll(&self, req: &Request, path_id: Option<&str>) -> ApiResult<Response> {
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

    pub(crate) fn clear_scroll(&self, req: &Request, path_id: Option<&str>) -> ApiResult<Response> {
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

    pub(crate) fn open_pit(
        &self,
        req: &Request,
        expression: &str,
        opensearch: bool,
    ) -> ApiResult<Response> {
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

    pub(crate) fn close_pit_es(&self, req: &Request) -> ApiResult<Response> {
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

    pub(crate) fn close_pit_os(&self, req: &Request, all: bool) -> ApiResult<Response> {
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
