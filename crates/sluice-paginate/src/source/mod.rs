//! The search engine as a source of pages: the engine and index facts
//! here; page sizes in `sizing`, hits made into pages in `hits`, and the
//! slices' cursors with their shared point in time in `cursor`.

mod cursor;
mod hits;
mod sizing;

pub use cursor::{pick_sort, slice_field, CursorState, SharedPit, SliceCursor};
pub use sizing::{
    docs_in_budget, sample_hit_bytes, PageSizer, DEFAULT_PAGE_BYTES, FIRST_PAGE_DOCS,
};

use crate::error::{Error, Result};
use crate::http::{Client, Response};
use serde::Deserialize;

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
