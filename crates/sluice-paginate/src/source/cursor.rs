//! One cursor per slice (point in time + search_after, or scroll) and
//! the point in time the slices share, reopened when it expires.

use super::hits::{build_page, context_missing, empty_page, BuiltPage};
use super::sizing::PageSizer;
use super::{check, Engine, SourceSpec};
use crate::error::{Error, Result};
use crate::format::CursorKind;
use crate::http::{Client, Response};
use crate::page::PageTarget;
use sluice_pages::write::FetchedPage;
use std::sync::Mutex;

/// The point in time all slices read from. When it expires, the first slice
/// to notice opens a new one and the others take it.
pub struct SharedPit {
    engine: Engine,
    id: Mutex<String>,
    reopened: std::sync::atomic::AtomicU32,
    index: String,
    keep_alive: String,
}

impl SharedPit {
    /// Opens a point in time on the index, through the engine's API.
    pub fn open(client: &Client, engine: Engine, spec: &SourceSpec) -> Result<SharedPit> {
        let id = engine.open_pit(client, &spec.index, &spec.keep_alive)?;
        Ok(Self::adopt(engine, id, spec))
    }

    /// Takes over a PIT recorded in a checkpoint (it may have expired).
    pub fn adopt(engine: Engine, id: String, spec: &SourceSpec) -> SharedPit {
        SharedPit {
            engine,
            id: Mutex::new(id),
            reopened: Default::default(),
            index: spec.index.clone(),
            keep_alive: spec.keep_alive.clone(),
        }
    }

    /// The point in time's current id.
    pub fn current(&self) -> String {
        self.id.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces `stale` with a new PIT unless another slice already did.
    pub fn reopen(&self, client: &Client, stale: &str) -> Result<String> {
        let mut id = self.id.lock().unwrap_or_else(|p| p.into_inner());
        if *id == stale {
            *id = self
                .engine
                .open_pit(client, &self.index, &self.keep_alive)?;
            self.reopened
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            log::warn!(
                "the point in time on {} expired; opened a new one and continue from the last sort values",
                self.index
            );
        }
        Ok(id.clone())
    }

    /// How often the PIT expired and was opened again.
    pub fn reopened(&self) -> u32 {
        self.reopened.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Closes the point in time (one that expired already is fine).
    pub fn close(&self, client: &Client) {
        match self.engine.close_pit(client, &self.current()) {
            Ok(r) if r.is_success() || r.status == 404 => {}
            Ok(r) => log::warn!(
                "closing the point in time: HTTP {}: {}",
                r.status,
                r.error_summary()
            ),
            Err(e) => log::warn!("closing the point in time: {e}"),
        }
    }
}

/// The sort of a point-in-time cursor: `_shard_doc` where the engine has it
/// (Elasticsearch 7.12+, OpenSearch 3.3+); else `_doc`, which is unique
/// within one shard, with `_id` added when a slice spans several shards.
pub fn pick_sort(client: &Client, pit: &SharedPit, slices: u32, shards: u32) -> Result<String> {
    let shard_doc = r#"[{"_shard_doc":"asc"}]"#;
    let body = format!(
        r#"{{"size":0,"pit":{{"id":"{}"}},"sort":{shard_doc},"track_total_hits":false}}"#,
        pit.current()
    );
    let r = client.send("POST", "/_search", Some(body.as_bytes()))?;
    if r.is_success() {
        return Ok(shard_doc.into());
    }
    let summary = r.error_summary();
    if !summary.contains("_shard_doc") {
        return Err(Error::Source(format!(
            "probing the sort on the point in time failed: HTTP {}: {summary}",
            r.status
        )));
    }
    // Slicing a PIT gives each slice whole shards when slices >= shards.
    Ok(if slices >= shards {
        r#"[{"_doc":"asc"}]"#.into()
    } else {
        log::info!(
            "{slices} slices over {shards} shards: sorting by _doc then _id (the engine has no _shard_doc; _id costs heap on the source)"
        );
        r#"[{"_doc":"asc"},{"_id":"asc"}]"#.into()
    })
}

/// The field slices split documents by. With no more slices than shards,
/// none: the engine gives each slice whole shards. With more, each shard's
/// documents are split by a numeric doc-values field; `_seq_no` is in every
/// index (the default `_id` needs id field data, which OpenSearch 2 refuses).
pub fn slice_field(slices: u32, shards: u32) -> Option<String> {
    (slices > shards).then(|| "_seq_no".to_string())
}

/// The saved state of a slice's cursor, as a checkpoint records it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum CursorState {
    /// A point in time and the position after the last page.
    Pit {
        /// The point in time's id.
        pit_id: String,
        /// Raw JSON array of the last hit's sort values; none before the first page.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        search_after: Option<serde_json::Value>,
    },
    /// A scroll context.
    Scroll {
        /// The scroll id.
        scroll_id: String,
    },
}

impl CursorState {
    /// Reads a checkpoint's cursor text.
    pub fn parse(text: &str) -> Result<CursorState> {
        serde_json::from_str(text)
            .map_err(|e| Error::Format(format!("checkpoint cursor {text:?} is unreadable: {e}")))
    }
}

/// One slice's cursor: fetches its pages in order.
pub struct SliceCursor<'a> {
    client: &'a Client,
    spec: &'a SourceSpec,
    pit: Option<&'a SharedPit>,
    sort: String,
    slice: u32,
    slices: u32,
    sizer: PageSizer,
    /// Documents the last page asked for: fewer came only at the end.
    asked: u32,
    slice_field: Option<String>,
    kind: CursorKind,
    /// Raw search_after JSON (PIT) or scroll id; none before the first page.
    position: Option<String>,
    pub(super) pit_id: String,
    done: bool,
    /// Where pages are built: the slice writer's pinned buffers.
    target: Option<PageTarget>,
}

impl<'a> SliceCursor<'a> {
    /// A cursor over slice `slice` of `slices`, from `position` (None: the start).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: &'a Client,
        spec: &'a SourceSpec,
        pit: Option<&'a SharedPit>,
        sort: String,
        slice: u32,
        slices: u32,
        (page_docs, page_bytes, first_docs): (u32, u64, u32),
        slice_field: Option<String>,
        resume_from: Option<CursorState>,
    ) -> Self {
        let kind = if pit.is_some() {
            CursorKind::Pit
        } else {
            CursorKind::Scroll
        };
        let mut pit_id = pit.map(SharedPit::current).unwrap_or_default();
        let position = match resume_from {
            None => None,
            Some(CursorState::Pit {
                pit_id: id,
                search_after,
            }) => {
                pit_id = id;
                search_after.map(|v| v.to_string())
            }
            Some(CursorState::Scroll { scroll_id }) => Some(scroll_id),
        };
        SliceCursor {
            client,
            spec,
            pit,
            sort,
            slice,
            slices,
            sizer: PageSizer::new(page_docs, page_bytes).starting_at(first_docs),
            asked: 0,
            slice_field,
            kind,
            position,
            pit_id,
            done: false,
            target: None,
        }
    }

    /// Builds the pages in `target`'s pinned buffers from now on.
    pub fn build_pages_in(&mut self, target: PageTarget) {
        self.target = Some(target);
    }

    /// The next page, or none when the slice has no more hits.
    pub fn next_page(&mut self) -> Result<Option<FetchedPage>> {
        if self.done {
            return Ok(None);
        }
        let built = loop {
            let built = match self.kind {
                CursorKind::Pit => self.next_pit_page()?,
                CursorKind::Scroll => self.next_scroll_page()?,
            };
            // A page of documents far bigger than those before it is asked
            // for again, smaller (a point in time can; a scroll cannot).
            let bytes = built.bytes.len() as u64;
            if self.kind == CursorKind::Pit && self.sizer.too_big(built.docs, bytes) {
                log::warn!(
                    "slice {}: a page of {} documents came to {bytes} bytes, more than four page budgets; asking for {} instead",
                    self.slice,
                    built.docs,
                    self.sizer.docs()
                );
                continue;
            }
            break built;
        };
        if built.docs == 0 {
            // An empty answer still opened (or kept) a scroll context: keep
            // its id so that close() clears it.
            if let Some(id) = built.scroll_id {
                self.position = Some(id);
            }
            self.done = true;
            return Ok(None);
        }
        let cursor = match self.kind {
            CursorKind::Pit => {
                if let Some(id) = built.pit_id {
                    self.pit_id = id;
                }
                let sort = built.last_sort.ok_or_else(|| {
                    Error::Source(
                        "a hit came without sort values; search_after cannot go on".into(),
                    )
                })?;
                self.position = Some(sort.clone());
                CursorState::Pit {
                    pit_id: self.pit_id.clone(),
                    search_after: Some(
                        serde_json::from_str(&sort)
                            .map_err(|e| Error::Source(format!("sort values are not JSON: {e}")))?,
                    ),
                }
            }
            CursorKind::Scroll => {
                let id = built.scroll_id.ok_or_else(|| {
                    Error::Source("a scroll answer came without _scroll_id".into())
                })?;
                self.position = Some(id.clone());
                CursorState::Scroll { scroll_id: id }
            }
        };
        // A short page is the last one: no need to ask again.
        if built.docs < self.asked {
            self.done = true;
        }
        self.sizer.observe(
            built.docs,
            built.bytes.len() as u64,
            built.max_hit_bytes as u64,
        );
        Ok(Some(FetchedPage {
            bytes: built.bytes,
            crc32c: built.crc32c,
            docs: built.docs,
            max_hit_bytes: built.max_hit_bytes,
            cursor_after: serde_json::to_string(&cursor)
                .map_err(|e| Error::Source(format!("the cursor after a page: {e}")))?,
        }))
    }

    fn slice_clause(&self) -> Option<serde_json::Value> {
        (self.slices > 1).then(|| {
            let mut clause = serde_json::json!({ "id": self.slice, "max": self.slices });
            if let Some(field) = &self.slice_field {
                clause["field"] = field.as_str().into();
            }
            clause
        })
    }

    /// Sends the request `body_for(docs)` builds for the current page
    /// size. When the source refuses the answer or fails to build it (429,
    /// a circuit breaker, 5xx, a timeout, a dropped connection), the size
    /// is halved and the request tried again after a backoff, up to the
    /// client's retries: an export must never take its source down.
    fn send_page(
        &mut self,
        path: &str,
        body_for: impl Fn(&Self, u32) -> Result<serde_json::Value>,
    ) -> Result<Response> {
        let mut attempt = 0;
        loop {
            let docs = self.sizer.docs();
            let body = body_for(self, docs)?;
            let refused =
                match self
                    .client
                    .send_or_refused("POST", path, Some(body.to_string().as_bytes()))
                {
                    Ok(r) => {
                        self.asked = docs;
                        return Ok(r);
                    }
                    Err(why) => why,
                };
            if attempt >= self.client.max_retries() {
                return Err(Error::Source(format!(
                    "the source could not answer a page of {docs} documents of slice {} after {} tries, the last: {refused}; check its health and heap, or give smaller pages (--page-mib, --page-docs)",
                    self.slice,
                    attempt + 1
                )));
            }
            let delay = self.client.backoff(attempt);
            if self.sizer.refused() {
                log::warn!(
                    "slice {}: the source could not answer a page of {docs} documents ({refused}); asking for {} from now on, in {} ms",
                    self.slice,
                    self.sizer.docs(),
                    delay.as_millis()
                );
            } else {
                log::warn!(
                    "slice {}: the source could not answer a page of one document ({refused}); again in {} ms",
                    self.slice,
                    delay.as_millis()
                );
            }
            std::thread::sleep(delay);
            attempt += 1;
        }
    }

    fn search_body(&self, docs: u32) -> Result<serde_json::Value> {
        let mut body = serde_json::json!({ "size": docs });
        if self.kind == CursorKind::Pit {
            // A scroll refuses it.
            body["track_total_hits"] = false.into();
        }
        if let Some(q) = self.spec.query_json()? {
            body["query"] = q;
        }
        if let Some(f) = self.spec.source_filter() {
            body["_source"] = f;
        }
        if let Some(s) = self.slice_clause() {
            body["slice"] = s;
        }
        Ok(body)
    }

    fn next_pit_page(&mut self) -> Result<BuiltPage> {
        let Some(pit) = self.pit else {
            return Err(Error::Config(
                "a point-in-time cursor without its point in time".into(),
            ));
        };
        let mut reopened = false;
        loop {
            let r = self.send_page("/_search", |cursor, docs| {
                let mut body = cursor.search_body(docs)?;
                body["pit"] = serde_json::json!({ "id": cursor.pit_id, "keep_alive": cursor.spec.keep_alive });
                body["sort"] = serde_json::from_str(&cursor.sort)
                    .map_err(|e| Error::Config(format!("the sort {:?} is not JSON: {e}", cursor.sort)))?;
                if let Some(after) = &cursor.position {
                    body["search_after"] = serde_json::from_str(after).map_err(|e| {
                        Error::Format(format!("saved sort values are not JSON: {e}"))
                    })?;
                }
                Ok(body)
            })?;
            if context_missing(&r) && !reopened {
                self.pit_id = pit.reopen(self.client, &self.pit_id)?;
                reopened = true;
                continue;
            }
            let page = self.page_from(r, "search")?;
            // Some shards lost the point in time while the others answered
            // (it expired or was closed during this search): the same page
            // again on a new one.
            if page.failed_shards > 0
                && page.shard_failures.contains("search_context_missing")
                && !reopened
            {
                self.pit_id = pit.reopen(self.client, &self.pit_id)?;
                reopened = true;
                continue;
            }
            return self.complete(page);
        }
    }

    fn next_scroll_page(&mut self) -> Result<BuiltPage> {
        let r = match self.position.clone() {
            // A scroll's page size is fixed by its first request: only that
            // one can ask for less.
            None => {
                let path = format!(
                    "/{}/_search?scroll={}",
                    self.spec.index, self.spec.keep_alive
                );
                self.send_page(&path, |cursor, docs| {
                    let mut body = cursor.search_body(docs)?;
                    body["sort"] = serde_json::json!(["_doc"]);
                    Ok(body)
                })?
            }
            Some(id) => {
                let body = serde_json::json!({ "scroll": self.spec.keep_alive, "scroll_id": id });
                let r = self.client.send(
                    "POST",
                    "/_search/scroll",
                    Some(body.to_string().as_bytes()),
                )?;
                if context_missing(&r) {
                    return Err(Error::Source(format!(
                        "the scroll of slice {} expired on the source (keep-alive {}); a scroll cannot be reopened where it stopped: raise --keep-alive, or use the default point-in-time cursor, which can",
                        self.slice, self.spec.keep_alive
                    )));
                }
                r
            }
        };
        let page = self.page_from(r, "scroll")?;
        self.complete(page)
    }

    /// Refuses a page some shards did not answer: counting it would drop
    /// their documents without a word (a short page ends the slice).
    fn complete(&self, page: BuiltPage) -> Result<BuiltPage> {
        if page.failed_shards == 0 {
            return Ok(page);
        }
        Err(Error::Source(format!(
            "{} shard(s) failed in the search of slice {} on {} (their documents would be missing from the page): {}",
            page.failed_shards,
            self.slice,
            self.spec.index,
            crate::http::error_summary(page.shard_failures.as_bytes())
        )))
    }

    /// The page of an answer: empty for a shard that never held a document,
    /// else the hits of a successful answer.
    fn page_from(&self, r: Response, what: &str) -> Result<BuiltPage> {
        if self.is_empty_shard(&r) {
            return Ok(empty_page());
        }
        let r = check(
            r,
            &format!("{what} of slice {}", self.slice),
            self.client,
            &self.spec.index,
        )?;
        build_page(&r.body, self.target.as_ref())
    }

    /// A shard that never held a document has no `_seq_no` field to split
    /// by, and the engine says "field not found": that slice is empty.
    fn is_empty_shard(&self, r: &Response) -> bool {
        r.status == 400
            && self
                .slice_field
                .as_ref()
                .is_some_and(|f| r.error_summary().contains(&format!("field {f} not found")))
    }

    /// Releases the scroll context (a PIT is closed once for all slices).
    pub fn close(&self) {
        if let (CursorKind::Scroll, Some(id)) = (self.kind, &self.position) {
            let body = serde_json::json!({ "scroll_id": [id] }).to_string();
            let _ = self
                .client
                .send("DELETE", "/_search/scroll", Some(body.as_bytes()));
        }
    }
}
