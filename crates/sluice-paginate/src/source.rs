//! The search engine as a source of pages: index facts, the point in time
//! (shared by all slices, reopened when it expires), and one cursor per slice
//! (point in time + search_after, or scroll).

use crate::error::{Error, Result};
use crate::format::CursorKind;
use crate::http::{Client, Response};
use crate::page::{PageBytes, PageTarget};
use serde::Deserialize;
use sluice_pages::write::FetchedPage;
use std::borrow::Cow;
use std::sync::Mutex;

/// What to take from the index.
#[derive(Debug, Clone, Default)]
pub struct SourceSpec {
    /// The index (or alias, or comma-separated indices).
    pub index: String,
    /// The `query` clause as JSON text (`{"range":{"year":{"gte":2015}}}`); none = all.
    pub query: Option<String>,
    /// Only these source fields (wildcards as the engine allows).
    pub source_includes: Vec<String>,
    /// All source fields but these.
    pub source_excludes: Vec<String>,
    /// PIT and scroll keep-alive, in the engine's time syntax (`5m`).
    pub keep_alive: String,
}

impl SourceSpec {
    fn query_json(&self) -> Result<Option<serde_json::Value>> {
        match &self.query {
            None => Ok(None),
            Some(q) => serde_json::from_str(q).map(Some).map_err(|e| {
                Error::Config(format!(
                    "--query is not JSON ({e}); give the query clause, e.g. '{{\"term\":{{\"venue\":\"VLDB\"}}}}'"
                ))
            }),
        }
    }

    fn source_filter(&self) -> Option<serde_json::Value> {
        if self.source_includes.is_empty() && self.source_excludes.is_empty() {
            return None;
        }
        Some(serde_json::json!({
            "includes": self.source_includes,
            "excludes": self.source_excludes,
        }))
    }

    /// Checks the index name before it goes into a URL path.
    pub fn validate(&self) -> Result<()> {
        let bad = self.index.is_empty()
            || self
                .index
                .chars()
                .any(|c| c.is_whitespace() || matches!(c, '/' | '?' | '#' | '"' | '\\'));
        if bad {
            return Err(Error::Config(format!(
                "index name {:?} is empty or holds one of / ? # \" \\ or a space",
                self.index
            )));
        }
        self.query_json().map(|_| ())
    }
}

/// Which search engine answers at the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// OpenSearch.
    OpenSearch,
    /// Elasticsearch.
    Elasticsearch,
}

/// The engine and version at the source: they decide the point-in-time API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Engine {
    /// OpenSearch or Elasticsearch.
    pub flavor: Flavor,
    /// major, minor, patch
    pub version: (u32, u32, u32),
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (a, b, c) = self.version;
        let name = match self.flavor {
            Flavor::OpenSearch => "OpenSearch",
            Flavor::Elasticsearch => "Elasticsearch",
        };
        write!(f, "{name} {a}.{b}.{c}")
    }
}

impl Engine {
    /// Asks the source: `GET /` names the version and, for OpenSearch, the
    /// distribution; Elasticsearch 7.14+ also sends `X-Elastic-Product`.
    /// Where `GET /` is not served (Elasticsearch builds without the root
    /// handler), the header and the node's version say it.
    pub fn detect(client: &Client) -> Result<Engine> {
        let what = "asking the source what it is";
        let root = match client.send("GET", "/", None)? {
            // check() turns refused credentials into an error that says what to do.
            r if r.status == 401 || r.status == 403 => check(r, what, client, "the cluster")?,
            r => r,
        };
        #[derive(Deserialize)]
        struct Root {
            version: RootVersion,
        }
        #[derive(Deserialize)]
        struct RootVersion {
            number: String,
            #[serde(default)]
            distribution: Option<String>,
        }
        if root.is_success() {
            let r: Root = serde_json::from_slice(&root.body).map_err(|e| {
                Error::Source(format!(
                    "{} does not answer GET / like Elasticsearch or OpenSearch ({e}): {}",
                    client.base_url(),
                    crate::http::error_summary(&root.body)
                ))
            })?;
            let flavor = match r.version.distribution.as_deref() {
                Some("opensearch") => Flavor::OpenSearch,
                _ => Flavor::Elasticsearch,
            };
            return Ok(Engine {
                flavor,
                version: parse_version(&r.version.number)?,
            });
        }
        let nodes = check(
            client.send("GET", "/_nodes/_local?filter_path=nodes.*.version", None)?,
            "asking the source for its version",
            client,
            "the cluster",
        )?;
        let v: serde_json::Value = serde_json::from_slice(&nodes.body)
            .map_err(|e| Error::Source(format!("the node information is not JSON: {e}")))?;
        let number = v["nodes"]
            .as_object()
            .and_then(|n| n.values().next())
            .and_then(|n| n["version"].as_str())
            .ok_or_else(|| {
                Error::Source(format!(
                    "{} names no version (GET / answered HTTP {})",
                    client.base_url(),
                    root.status
                ))
            })?;
        // OpenSearch always serves GET /: without it, this is Elasticsearch.
        Ok(Engine {
            flavor: Flavor::Elasticsearch,
            version: parse_version(number)?,
        })
    }

    /// Whether the engine has point-in-time searches (Elasticsearch 7.10,
    /// OpenSearch 2.4).
    pub fn has_pit(&self) -> bool {
        match self.flavor {
            Flavor::Elasticsearch => self.version >= (7, 10, 0),
            Flavor::OpenSearch => self.version >= (2, 4, 0),
        }
    }

    fn open_pit(&self, client: &Client, index: &str, keep_alive: &str) -> Result<String> {
        let path = match self.flavor {
            Flavor::Elasticsearch => format!("/{index}/_pit?keep_alive={keep_alive}"),
            Flavor::OpenSearch => format!("/{index}/_search/point_in_time?keep_alive={keep_alive}"),
        };
        let r = check(
            client.send("POST", &path, None)?,
            "opening a point in time",
            client,
            index,
        )?;
        let answer: serde_json::Value = serde_json::from_slice(&r.body)
            .map_err(|e| Error::Source(format!("the point-in-time answer is not JSON: {e}")))?;
        let field = match self.flavor {
            Flavor::Elasticsearch => "id",
            Flavor::OpenSearch => "pit_id",
        };
        answer[field].as_str().map(String::from).ok_or_else(|| {
            Error::Source(format!(
                "the point-in-time answer of {self} has no {field:?}"
            ))
        })
    }

    fn close_pit(&self, client: &Client, id: &str) -> Result<Response> {
        let (path, body) = match self.flavor {
            Flavor::Elasticsearch => ("/_pit", serde_json::json!({ "id": id })),
            Flavor::OpenSearch => (
                "/_search/point_in_time",
                serde_json::json!({ "pit_id": [id] }),
            ),
        };
        client.send("DELETE", path, Some(body.to_string().as_bytes()))
    }
}

/// "8.19.7", "9.2.0-SNAPSHOT", "2.11.1" → (major, minor, patch).
fn parse_version(text: &str) -> Result<(u32, u32, u32)> {
    let mut parts = text
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (
        parts.next().flatten(),
        parts.next().flatten(),
        parts.next().flatten(),
    ) {
        (Some(a), Some(b), c) => Ok((a, b, c.unwrap_or(0))),
        _ => Err(Error::Source(format!("unreadable engine version {text:?}"))),
    }
}

/// Facts about the index, asked before anything is written.
#[derive(Debug, Clone)]
pub struct IndexInfo {
    /// Primary shards of the index (the default slice count).
    pub primary_shards: u32,
    /// Documents the query matches.
    pub doc_count: u64,
    /// Mean bytes of one hit as a page holds it, from a sample (0 without documents).
    pub mean_hit_bytes: f64,
}

/// Maps statuses every call treats alike to clear errors.
pub fn check(response: Response, what: &str, client: &Client, index: &str) -> Result<Response> {
    if response.is_success() {
        return Ok(response);
    }
    let summary = response.error_summary();
    Err(Error::Source(match response.status {
        401 => format!(
            "{} refused the credentials ({what}: HTTP 401: {summary}); check --user and --password (or SLUICE_SOURCE_PASSWORD) or --api-key",
            client.base_url()
        ),
        403 => format!(
            "{} denied {what} (HTTP 403: {summary}); the user needs read and point-in-time rights on {index}",
            client.base_url()
        ),
        404 if summary.starts_with("index_not_found_exception") => format!(
            "index {index:?} does not exist on {} ({summary}){}",
            client.base_url(),
            known_indices(client)
        ),
        status => format!("{what} failed: HTTP {status}: {summary}"),
    }))
}

fn known_indices(client: &Client) -> String {
    let Ok(r) = client.send("GET", "/_cat/indices?h=index&s=index", None) else {
        return String::new();
    };
    if !r.is_success() {
        return String::new();
    }
    let names: Vec<String> = String::from_utf8_lossy(&r.body)
        .lines()
        .map(str::trim)
        .filter(|n| !n.is_empty() && !n.starts_with('.'))
        .take(20)
        .map(String::from)
        .collect();
    if names.is_empty() {
        "; the source holds no index".into()
    } else {
        format!("; indices there: {}", names.join(", "))
    }
}

/// Asks the source for the facts an export needs before it writes anything.
pub fn index_info(client: &Client, spec: &SourceSpec) -> Result<IndexInfo> {
    let (primary_shards, doc_count) = index_counts(client, spec)?;
    let mean_hit_bytes = sample_hit_bytes(client, spec)?;
    Ok(IndexInfo {
        primary_shards,
        doc_count,
        mean_hit_bytes,
    })
}

/// The index's primary shards and the documents the query matches: what
/// [`index_info`] asks for before its sample.
pub fn index_counts(client: &Client, spec: &SourceSpec) -> Result<(u32, u64)> {
    spec.validate()?;
    let index = &spec.index;
    let settings = check(
        client.send(
            "GET",
            &format!("/{index}/_settings/index.number_of_shards"),
            None,
        )?,
        "reading the index settings",
        client,
        index,
    )?;
    let settings: serde_json::Value = serde_json::from_slice(&settings.body)
        .map_err(|e| Error::Source(format!("index settings are not JSON: {e}")))?;
    let primary_shards: u32 = settings
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(_, v)| {
            v.pointer("/settings/index/number_of_shards")?
                .as_str()?
                .parse::<u32>()
                .ok()
        })
        .sum();
    if primary_shards == 0 {
        return Err(Error::Source(format!(
            "{index} names no index with shards on {}",
            client.base_url()
        )));
    }
    let mut count_body = serde_json::Map::new();
    if let Some(q) = spec.query_json()? {
        count_body.insert("query".into(), q);
    }
    let count = check(
        client.send(
            "POST",
            &format!("/{index}/_count"),
            Some(serde_json::Value::Object(count_body).to_string().as_bytes()),
        )?,
        "counting the documents",
        client,
        index,
    )?;
    #[derive(Deserialize)]
    struct Count {
        count: u64,
    }
    let doc_count = sonic_rs::from_slice::<Count>(&count.body)
        .map_err(|e| Error::Source(format!("count answer is not what was expected: {e}")))?
        .count;
    Ok((primary_shards, doc_count))
}

/// Documents sampled for the mean hit size, per request: few, since their
/// size is not known yet (megabyte documents make a large answer of a few
/// of them).
const SAMPLE_DOCS: usize = 16;

/// Requests of [`SAMPLE_DOCS`] random documents each: 64 documents in all,
/// so that a minority of big documents shows in the mean.
const SAMPLE_REQUESTS: u64 = 4;

/// The first page of a slice asks for at most this many documents: until
/// a page has come, nothing says how big they are.
pub const FIRST_PAGE_DOCS: u32 = 16;

/// The default byte budget of one answer of the source: a page of this
/// many bytes, about three times that in the source's heap while it builds
/// it, times the slices asking at once, stays far below what a node with a
/// 1 GiB heap can hold.
pub const DEFAULT_PAGE_BYTES: u64 = 8 << 20;

/// Documents of `mean_bytes` that fill a page budget of `budget_bytes`:
/// at least one, at most `max_docs` (a mean of 0, no documents: `max_docs`).
pub fn docs_in_budget(mean_bytes: f64, max_docs: u32, budget_bytes: u64) -> u32 {
    if mean_bytes < 1.0 {
        return max_docs.max(1);
    }
    ((budget_bytes as f64 / mean_bytes) as u64).clamp(1, max_docs.max(1) as u64) as u32
}

/// How many documents a slice asks for per page: sized by bytes, not by a
/// fixed count. Each answer is meant to stay under a byte budget at the
/// documents' measured size; a page grows at most twice a page (slow
/// start: the next documents may be bigger than these), never past what
/// the budget holds at a quarter of the largest document seen (so that
/// pages of such documents stay within four budgets), and halves when the
/// source refuses or fails to build an answer.
#[derive(Debug, Clone)]
pub struct PageSizer {
    max_docs: u32,
    budget_bytes: u64,
    docs: u32,
    largest_hit_bytes: u64,
    /// Times the source refused a page and the size was halved.
    pub halvings: u64,
}

impl PageSizer {
    /// At most `max_docs` a page, each answer about `budget_bytes`.
    pub fn new(max_docs: u32, budget_bytes: u64) -> PageSizer {
        let max_docs = max_docs.max(1);
        PageSizer {
            max_docs,
            budget_bytes: budget_bytes.max(1),
            docs: FIRST_PAGE_DOCS.min(max_docs),
            largest_hit_bytes: 0,
            halvings: 0,
        }
    }

    /// The same, its first page of `docs` documents (at most the most a
    /// page may ask for, at least one).
    pub fn starting_at(mut self, docs: u32) -> PageSizer {
        self.docs = docs.clamp(1, self.max_docs);
        self
    }

    /// Documents to ask for next.
    pub fn docs(&self) -> u32 {
        self.docs
    }

    /// Takes in a page that came: `docs` documents in `bytes`, the largest
    /// `largest_hit_bytes`.
    pub fn observe(&mut self, docs: u32, bytes: u64, largest_hit_bytes: u64) {
        if docs == 0 {
            return;
        }
        self.largest_hit_bytes = self.largest_hit_bytes.max(largest_hit_bytes);
        let mean = (bytes / docs as u64).max(1);
        let at_mean = self.budget_bytes / mean;
        let at_largest = 4 * self.budget_bytes / self.largest_hit_bytes.max(1);
        let fits = at_mean.min(at_largest).clamp(1, self.max_docs as u64) as u32;
        self.docs = fits.min(self.docs.saturating_mul(2));
    }

    /// Whether a page that came is too big to keep: over four budgets
    /// with more than one document (the documents were far bigger than
    /// those before them). Then the next request asks for about one
    /// budget of such documents.
    pub fn too_big(&mut self, docs: u32, bytes: u64) -> bool {
        if docs <= 1 || bytes <= 4 * self.budget_bytes {
            return false;
        }
        let fits = (docs as u64 * self.budget_bytes / bytes.max(1)).max(1);
        self.docs = (fits as u32).min(docs / 2).max(1);
        true
    }

    /// The source refused a page or failed to build it: half as many
    /// documents next time (at least one). Whether there was anything to
    /// halve.
    pub fn refused(&mut self) -> bool {
        self.halvings += 1;
        let before = self.docs;
        self.docs = (self.docs / 2).max(1);
        before > 1
    }
}

/// Mean bytes of one hit as a page holds it, from documents the query
/// matches drawn at random (a fixed seed: the same sample each time), in
/// requests of a few documents each (0 without documents). A source
/// without `function_score` (Sluice's own HTTP API) gives its first
/// documents instead.
pub fn sample_hit_bytes(client: &Client, spec: &SourceSpec) -> Result<f64> {
    let query = spec
        .query_json()?
        .unwrap_or_else(|| serde_json::json!({ "match_all": {} }));
    let (mut bytes, mut docs) = (0usize, 0u32);
    let mut random = true;
    let mut request = 0;
    while request < SAMPLE_REQUESTS {
        let mut body = if random {
            serde_json::json!({
                "size": SAMPLE_DOCS,
                "track_total_hits": false,
                "query": { "function_score": {
                    "query": query,
                    "random_score": { "seed": request, "field": "_seq_no" },
                    "boost_mode": "replace"
                }}
            })
        } else {
            serde_json::json!({
                "size": SAMPLE_DOCS,
                "from": request * SAMPLE_DOCS as u64,
                "track_total_hits": false,
                "query": query,
            })
        };
        if let Some(f) = spec.source_filter() {
            body["_source"] = f;
        }
        let r = client.send(
            "POST",
            &format!("/{}/_search", spec.index),
            Some(body.to_string().as_bytes()),
        )?;
        if random && request == 0 && r.status == 400 {
            log::debug!("the source samples no random documents: sampling its first ones");
            random = false;
            continue;
        }
        let r = check(r, "sampling documents", client, &spec.index)?;
        let page = build_page(&r.body, None)?;
        bytes += page.bytes.len();
        docs += page.docs;
        request += 1;
    }
    if docs == 0 {
        return Ok(0.0);
    }
    Ok(bytes as f64 / docs as f64)
}

struct BuiltPage {
    bytes: PageBytes,
    crc32c: u32,
    /// Shards that failed, and why (raw JSON): the page is incomplete.
    failed_shards: u32,
    shard_failures: String,
    docs: u32,
    max_hit_bytes: usize,
    last_sort: Option<String>,
    pit_id: Option<String>,
    scroll_id: Option<String>,
}

/// What building a page needs besides the answer: the scanner's index and
/// the hits' places in the answer. Kept between answers and between
/// exports of the process (a fresh index of a few megabytes costs the
/// kernel a zeroed page per 4 KiB the first time it is touched).
#[derive(Default)]
struct PageScratch {
    scanner: sluice_json::Scanner,
    /// Byte ranges of each hit's `_id` and `_source` in the answer.
    parts: Vec<(std::ops::Range<usize>, std::ops::Range<usize>)>,
}

/// Scratch kept for reuse: one per fetcher at work, at most this many idle.
const MAX_KEPT_SCRATCH: usize = 16;

static SCRATCH: Mutex<Vec<PageScratch>> = Mutex::new(Vec::new());

/// What a hit adds to its page besides its id and source:
/// `{"_id":`, `,"_source":`, `}` and the comma before it.
const HIT_FRAME_BYTES: usize = 20;

/// The source of a hit that came without one.
const NULL: &[u8] = b"null";

/// Turns a search answer into page bytes: each hit reduced to `_id` and
/// `_source`, the source's bytes unchanged, built in `target`'s pinned
/// buffers when given. The whole answer is validated (sluice-json's
/// structural scan), so a page holds only valid JSON.
fn build_page(body: &[u8], target: Option<&PageTarget>) -> Result<BuiltPage> {
    let kept = SCRATCH.lock().unwrap_or_else(|e| e.into_inner()).pop();
    let mut scratch = kept.unwrap_or_default();
    let built = build_page_with(&mut scratch, body, target);
    let mut kept = SCRATCH.lock().unwrap_or_else(|e| e.into_inner());
    if kept.len() < MAX_KEPT_SCRATCH {
        kept.push(scratch);
    }
    built
}

fn build_page_with(
    scratch: &mut PageScratch,
    body: &[u8],
    target: Option<&PageTarget>,
) -> Result<BuiltPage> {
    use sluice_json::Kind;
    let PageScratch { scanner, parts } = scratch;
    parts.clear();
    // Where a value the scan hands out lies in the answer.
    let range = |raw: &str| {
        let start = raw.as_ptr() as usize - body.as_ptr() as usize;
        start..start + raw.len()
    };
    let unexpected = |what: String| {
        Error::Source(format!(
            "search answer is not what was expected ({what}): {}",
            crate::http::error_summary(body)
        ))
    };
    let json = scanner.scan(body).map_err(|e| unexpected(e.to_string()))?;
    let root = json.root();
    let text = |name: &str| -> Result<Option<String>> {
        root.get(name)
            .filter(|v| v.kind() != Kind::Null)
            .map(|v| v.to_str().map(Cow::into_owned))
            .transpose()
            .map_err(|e| unexpected(format!("{name}: {e}")))
    };
    let (pit_id, scroll_id) = (text("pit_id")?, text("_scroll_id")?);
    let hits = root
        .get("hits")
        .and_then(|h| h.get("hits"))
        .filter(|h| h.kind() == Kind::Array)
        .ok_or_else(|| unexpected("no hits.hits array".into()))?;
    // First the hits' parts and the page's exact length, so that the page
    // is built once, in the buffer it is written from.
    let mut last_sort = None;
    let mut page_len = 3; // [ and ]\n
    for hit in hits.elements() {
        let (mut id, mut source, mut sort) = (None, None, None);
        for (key, value) in hit.members() {
            match key.raw() {
                "\"_id\"" => id = Some(value),
                "\"_source\"" => source = Some(value),
                "\"sort\"" => sort = Some(value),
                _ => {}
            }
        }
        let id = id
            .filter(|id| id.kind() == Kind::String)
            .ok_or_else(|| unexpected(format!("hit {} has no _id string", parts.len())))?;
        let (id, source) = (range(id.raw()), source.map_or(0..0, |s| range(s.raw())));
        let source_len = if source.is_empty() {
            NULL.len()
        } else {
            source.len()
        };
        page_len += HIT_FRAME_BYTES + id.len() + source_len;
        parts.push((id, source));
        last_sort = sort;
    }
    let docs = u32::try_from(parts.len()).map_err(|_| unexpected("more than 2^32 hits".into()))?;
    page_len -= usize::from(docs > 0); // no comma before the first hit
    let mut bytes = PageBytes::with_len(target, page_len);
    let mut page = PageFill::new(bytes.as_mut_slice());
    page.put(b"[");
    let (mut max_hit_bytes, mut crc, mut crc_upto) = (0, 0u32, 0);
    for (n, (id, source)) in parts.iter().enumerate() {
        let source = if source.is_empty() {
            NULL
        } else {
            &body[source.clone()]
        };
        // What the last hit added, while the cache still holds it.
        crc = crc32c::crc32c_append(crc, &page.bytes()[crc_upto..]);
        crc_upto = page.filled();
        if n > 0 {
            page.put(b",");
        }
        page.put(b"{\"_id\":");
        page.put(&body[id.clone()]);
        page.put(b",\"_source\":");
        page.put(source);
        page.put(b"}");
        max_hit_bytes = max_hit_bytes.max(page.filled() - crc_upto);
    }
    page.put(b"]\n");
    assert_eq!(page.filled(), page_len, "the page's length as computed");
    let crc32c = crc32c::crc32c_append(crc, &page.bytes()[crc_upto..]);
    let shards = root.get("_shards");
    let failed_shards = shards
        .and_then(|s| s.get("failed"))
        .map_or(Some(0), |f| f.as_u64())
        .and_then(|f| u32::try_from(f).ok())
        .ok_or_else(|| unexpected("_shards.failed is not a count".into()))?;
    let shard_failures = match shards.and_then(|s| s.get("failures")) {
        Some(f) if failed_shards > 0 => f.raw().to_string(),
        _ => String::new(),
    };
    Ok(BuiltPage {
        failed_shards,
        shard_failures,
        docs,
        max_hit_bytes,
        last_sort: last_sort.map(|s| s.raw().to_string()),
        pit_id,
        scroll_id,
        bytes,
        crc32c,
    })
}

/// The engine no longer holds the point in time or scroll (expired or deleted).
fn context_missing(r: &Response) -> bool {
    r.status == 404 && r.error_summary().contains("search_context_missing")
}

fn empty_page() -> BuiltPage {
    BuiltPage {
        failed_shards: 0,
        shard_failures: String::new(),
        bytes: PageBytes::Heap(Vec::new()),
        crc32c: 0,
        docs: 0,
        max_hit_bytes: 0,
        last_sort: None,
        pit_id: None,
        scroll_id: None,
    }
}

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
    pit_id: String,
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

/// Fills a page front to back.
struct PageFill<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl<'a> PageFill<'a> {
    fn new(out: &'a mut [u8]) -> Self {
        PageFill { out, at: 0 }
    }

    /// Appends `bytes`.
    ///
    /// # Panics
    /// Past the page's length: the length was computed wrong.
    fn put(&mut self, bytes: &[u8]) {
        self.out[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }

    /// Bytes filled so far.
    fn filled(&self) -> usize {
        self.at
    }

    /// What has been filled.
    fn bytes(&self) -> &[u8] {
        &self.out[..self.at]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_grow_by_measured_bytes_and_halve_when_refused() {
        let budget = 8u64 << 20;
        let mut s = PageSizer::new(2048, budget);
        assert_eq!(s.docs(), FIRST_PAGE_DOCS);
        // Small documents: the page doubles a page, up to `page_docs`.
        let mut asked = Vec::new();
        for _ in 0..10 {
            let docs = s.docs();
            asked.push(docs);
            s.observe(docs, docs as u64 * 1500, 1600);
        }
        assert_eq!(asked[..8], [16, 32, 64, 128, 256, 512, 1024, 2048]);
        assert_eq!(s.docs(), 2048);
        // A page with a megabyte document: the next stays within four
        // budgets even if all its documents are that big.
        s.observe(2048, 2047 * 1500 + (1 << 20), 1 << 20);
        assert!(s.docs() as u64 * (1 << 20) <= 4 * budget, "{}", s.docs());
        // Megabyte documents throughout: about a budget a page.
        for _ in 0..4 {
            let docs = s.docs();
            s.observe(docs, docs as u64 * (1 << 20), 1 << 20);
        }
        assert_eq!(s.docs(), 8);
        // Refused: halved down to one document, never zero.
        for want in [4, 2, 1, 1] {
            s.refused();
            assert_eq!(s.docs(), want);
        }
        assert_eq!(s.halvings, 4);
        // Documents bigger than the whole budget: one a page.
        let mut one = PageSizer::new(2048, 1 << 20);
        one.observe(16, 16 * (4 << 20), 4 << 20);
        assert_eq!(one.docs(), 1);
        // A page far over the budget is asked again at about one budget.
        let mut grown = PageSizer::new(2048, budget);
        assert!(!grown.too_big(256, 4 * budget));
        assert!(grown.too_big(256, 50 << 20));
        assert_eq!(grown.docs(), 40);
        assert!(!grown.too_big(1, 50 << 20), "one document is what it is");
        // A scroll's size, fixed at its start, from the sample.
        assert_eq!(docs_in_budget(1556.0, 1000, budget), 1000);
        assert_eq!(docs_in_budget(500_000.0, 2048, budget), 16);
        assert_eq!(docs_in_budget(0.0, 2048, budget), 2048);
        assert_eq!(PageSizer::new(2048, budget).starting_at(5000).docs(), 2048);
        // Never past the most a page may ask for.
        let mut few = PageSizer::new(10, budget);
        assert_eq!(few.docs(), 10);
        few.observe(10, 10, 1);
        assert_eq!(few.docs(), 10);
    }

    #[test]
    fn a_page_keeps_id_and_source_bytes_and_the_last_sort() {
        let body = br#"{"pit_id":"P2","took":1,"hits":{"hits":[
            {"_index":"x","_id":"a\"1","_score":null,"_source":{"t": "k\u00e9y" ,"n":[1, 2]},"sort":[7]},
            {"_index":"x","_id":"b","_source":{},"sort":[9,"b"]}]}}"#;
        let page = build_page(body, None).unwrap();
        assert_eq!(page.docs, 2);
        assert_eq!(
            std::str::from_utf8(&page.bytes).unwrap(),
            "[{\"_id\":\"a\\\"1\",\"_source\":{\"t\": \"k\\u00e9y\" ,\"n\":[1, 2]}},{\"_id\":\"b\",\"_source\":{}}]\n"
        );
        assert_eq!(page.last_sort.as_deref(), Some(r#"[9,"b"]"#));
        assert_eq!(page.pit_id.as_deref(), Some("P2"));
        let v: serde_json::Value = serde_json::from_slice(&page.bytes).unwrap();
        assert_eq!(v[0]["_id"], "a\"1");
    }

    /// A search answer of `hits`, each `(id, source or none, extra members)`.
    fn answer(hits: &[(String, Option<String>, bool)]) -> Vec<u8> {
        let mut out = String::from(r#"{"pit_id":"P","hits":{"total":{"value":9},"hits":["#);
        for (n, (id, source, extra)) in hits.iter().enumerate() {
            if n > 0 {
                out.push(',');
            }
            out.push_str(&format!("{{\"_id\":{}", serde_json::to_string(id).unwrap()));
            if *extra {
                out.push_str(r#","_index":"i","_score":null"#);
            }
            if let Some(s) = source {
                out.push_str(&format!(",\"_source\":{s}"));
            }
            out.push_str(&format!(",\"sort\":[{n}]}}"));
        }
        out.push_str("]}}");
        out.into_bytes()
    }

    fn pinned_target(block_size_bytes: usize) -> PageTarget {
        let config = crate::device::page_pool_config(32 << 20);
        let pool = sluice_io::BufferPool::new(config, sluice_io::Pinning::Unpinned).unwrap();
        PageTarget::new(pool, block_size_bytes)
    }

    use proptest::prelude::*;

    proptest! {
        /// A page built in a pinned buffer holds the same bytes and CRC as
        /// one built on the heap, padded with spaces to whole blocks, and
        /// the length computed before building is the length built.
        #[test]
        fn pages_built_in_pinned_buffers_match_heap_pages(
            hits in prop::collection::vec(
                (
                    r#"[a-z0-9 /"\\\x00\u{e9}]{0,12}"#,
                    prop::option::of(prop_oneof![
                        Just("{}".to_string()),
                        Just("null".to_string()),
                        "[a-z]{0,3000}".prop_map(|t| format!(r#"{{"t":"{t}","n":[1,2.5e300]}}"#)),
                    ]),
                    any::<bool>(),
                ),
                0..40,
            ),
            block in prop_oneof![Just(512usize), Just(4096usize)],
        ) {
            let body = answer(&hits);
            let heap = build_page(&body, None).unwrap();
            let target = pinned_target(block);
            let pinned = build_page(&body, Some(&target)).unwrap();
            prop_assert!(pinned.bytes.is_pinned());
            prop_assert!(!heap.bytes.is_pinned());
            prop_assert_eq!(&pinned.bytes[..], &heap.bytes[..]);
            prop_assert_eq!(pinned.crc32c, crc32c::crc32c(&heap.bytes));
            prop_assert_eq!(pinned.crc32c, heap.crc32c);
            prop_assert_eq!(pinned.docs as usize, hits.len());
            prop_assert_eq!(pinned.max_hit_bytes, heap.max_hit_bytes);
            let PageBytes::Pinned { buf, len } = &pinned.bytes else { unreachable!() };
            let whole = buf.as_slice().unwrap();
            prop_assert_eq!(whole.len() % block, 0);
            prop_assert!(whole.len() >= *len && whole.len() - *len < block.max(1));
            prop_assert!(whole[*len..].iter().all(|&b| b == b' '));
            let v: serde_json::Value = serde_json::from_slice(whole).unwrap();
            for (n, (id, source, _)) in hits.iter().enumerate() {
                prop_assert_eq!(v[n]["_id"].as_str().unwrap(), id.as_str());
                prop_assert_eq!(v[n]["_source"].is_null(), source.as_deref().is_none_or(|s| s == "null"));
            }
        }
    }

    /// A page the pool cannot hold is built on the heap instead.
    #[test]
    fn a_page_larger_than_the_pool_goes_to_the_heap() {
        let big = "x".repeat(40 << 20);
        let body = answer(&[("a".into(), Some(format!(r#"{{"t":"{big}"}}"#)), false)]);
        let page = build_page(&body, Some(&pinned_target(4096))).unwrap();
        assert!(!page.bytes.is_pinned());
        assert_eq!(page.crc32c, crc32c::crc32c(&page.bytes));
        assert!(page.bytes.ends_with(b"}}]\n"));
    }

    #[test]
    fn a_page_with_failed_shards_says_so() {
        let body = br#"{"_shards":{"total":2,"successful":1,"skipped":0,"failed":1,
            "failures":[{"shard":1,"reason":{"type":"search_context_missing_exception","reason":"No search context found for id [2]"}}]},
            "hits":{"hits":[{"_id":"a","_source":{},"sort":[1]}]}}"#;
        let page = build_page(body, None).unwrap();
        assert_eq!(page.failed_shards, 1);
        assert!(page.shard_failures.contains("search_context_missing"));
        let ok = build_page(
            br#"{"_shards":{"total":2,"successful":2,"failed":0},"hits":{"hits":[]}}"#,
            None,
        )
        .unwrap();
        assert_eq!(ok.failed_shards, 0);
    }

    #[test]
    fn cursor_state_round_trips_through_checkpoint_text() {
        let c = CursorState::Pit {
            pit_id: "abc".into(),
            search_after: Some(serde_json::json!([3, "x"])),
        };
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(text, r#"{"pit_id":"abc","search_after":[3,"x"]}"#);
        assert_eq!(CursorState::parse(&text).unwrap(), c);
        let s = CursorState::parse(r#"{"scroll_id":"s1"}"#).unwrap();
        assert_eq!(
            s,
            CursorState::Scroll {
                scroll_id: "s1".into()
            }
        );
    }

    #[test]
    fn engine_versions_parse() {
        assert_eq!(parse_version("8.19.7").unwrap(), (8, 19, 7));
        assert_eq!(parse_version("9.2.0-SNAPSHOT").unwrap(), (9, 2, 0));
        assert_eq!(parse_version("7.10").unwrap(), (7, 10, 0));
        assert!(parse_version("x").is_err());
        let es = |v| Engine {
            flavor: Flavor::Elasticsearch,
            version: v,
        };
        let os = |v| Engine {
            flavor: Flavor::OpenSearch,
            version: v,
        };
        assert!(es((7, 10, 0)).has_pit() && !es((7, 9, 3)).has_pit());
        assert!(os((2, 4, 0)).has_pit() && !os((1, 3, 9)).has_pit());
        assert_eq!(es((8, 19, 7)).to_string(), "Elasticsearch 8.19.7");
    }

    #[test]
    fn bad_index_names_and_queries_are_refused() {
        let mut spec = SourceSpec {
            index: "a/b".into(),
            ..SourceSpec::default()
        };
        assert!(spec.validate().is_err());
        spec.index = "papers".into();
        spec.query = Some("{not json".into());
        let err = spec.validate().unwrap_err().to_string();
        assert!(err.contains("--query is not JSON"), "{err}");
    }
}
