//! The loader: bulk-indexes seeded paper documents into the source, any
//! count from a thousand to tens of millions, on a few connections at once.

use crate::docgen::paper_doc;
use crate::error::{Error, Result};
use crate::http::Client;
use crate::progress::{Counter, ProgressMode, Reporter};
use crate::source::check;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What `sluice load` is asked to do.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The index to create and fill.
    pub index: String,
    /// Documents to load.
    pub docs: u64,
    /// Primary shards of the index.
    pub shards: u32,
    /// Seed of the generated documents.
    pub seed: u64,
    /// Bytes of documents per bulk request.
    pub bulk_bytes: usize,
    /// Bulk requests in flight.
    pub connections: usize,
    /// Drop an index of that name first.
    pub replace: bool,
    /// Bars, lines or nothing.
    pub progress: ProgressMode,
    /// How long the new index's primary shards may take to start.
    pub primaries_timeout_seconds: u32,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            index: "papers".into(),
            docs: 10_000,
            shards: 4,
            seed: 1,
            bulk_bytes: 8 << 20,
            connections: 2,
            replace: false,
            progress: ProgressMode::Auto,
            primaries_timeout_seconds: 60,
        }
    }
}

/// What a load did.
#[derive(Debug, Clone)]
pub struct LoadSummary {
    /// Documents loaded.
    pub docs: u64,
    /// Bytes of documents loaded.
    pub bytes: u64,
    /// Time it took.
    pub elapsed: Duration,
}

const MAPPING: &str = r#"{"properties":{"id":{"type":"long"},"doi":{"type":"keyword"},"title":{"type":"text"},"venue":{"type":"keyword"},"year":{"type":"integer"},"authors":{"type":"keyword"},"references":{"type":"long"},"abstract":{"type":"text"}}}"#;

/// Creates the index (replicas 0, refresh off while loading), loads, refreshes,
/// and checks the count.
pub fn load(client: &Client, options: &LoadOptions) -> Result<LoadSummary> {
    let start = Instant::now();
    if options.shards == 0
        || options.shards > 1024
        || options.connections == 0
        || options.connections > 64
        || !(1..=3600).contains(&options.primaries_timeout_seconds)
    {
        return Err(Error::Config(
            "--shards must be 1..=1024, --connections 1..=64 and the shard start timeout 1..=3600 s"
                .into(),
        ));
    }
    create_index(client, options)?;
    let per_batch = (options.bulk_bytes / (crate::docgen::PAPER_DOC_BYTES + 48)).max(1) as u64;
    let next = AtomicU64::new(0);
    let counters = Arc::new(vec![Counter::default()]);
    let reporter = Reporter::start(
        options.progress,
        "load",
        counters.clone(),
        Some(options.docs),
        Duration::from_secs(5),
    );
    let failure: Mutex<Option<Error>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..options.connections {
            scope.spawn(|| loop {
                if failure.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
                    return;
                }
                let first = next.fetch_add(per_batch, Ordering::Relaxed);
                if first >= options.docs {
                    return;
                }
                let last = (first + per_batch).min(options.docs);
                match bulk(client, options, first, last) {
                    Ok(bytes) => counters[0].add(last - first, bytes),
                    Err(e) => {
                        *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                        return;
                    }
                }
            });
        }
    });
    reporter.finish();
    if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let index = &options.index;
    let settings = r#"{"index":{"refresh_interval":"1s"}}"#;
    check(
        client.send(
            "PUT",
            &format!("/{index}/_settings"),
            Some(settings.as_bytes()),
        )?,
        "restoring the refresh interval",
        client,
        index,
    )?;
    check(
        client.send("POST", &format!("/{index}/_refresh"), None)?,
        "refresh",
        client,
        index,
    )?;
    let count = check(
        client.send("GET", &format!("/{index}/_count"), None)?,
        "count",
        client,
        index,
    )?;
    let count: serde_json::Value = serde_json::from_slice(&count.body)
        .map_err(|e| Error::Source(format!("count answer: {e}")))?;
    if count["count"].as_u64() != Some(options.docs) {
        return Err(Error::Source(format!(
            "{index} holds {} documents after loading {}",
            count["count"], options.docs
        )));
    }
    Ok(LoadSummary {
        docs: options.docs,
        bytes: counters[0].bytes.load(Ordering::Relaxed),
        elapsed: start.elapsed(),
    })
}

fn create_index(client: &Client, options: &LoadOptions) -> Result<()> {
    let index = &options.index;
    let exists = client.send("HEAD", &format!("/{index}"), None)?;
    if exists.status == 200 {
        if !options.replace {
            return Err(Error::Config(format!(
                "index {index} already exists on {}; pass --replace to drop and load it again",
                client.base_url()
            )));
        }
        check(
            client.send("DELETE", &format!("/{index}"), None)?,
            "dropping the index",
            client,
            index,
        )?;
    }
    let body = format!(
        r#"{{"settings":{{"index":{{"number_of_shards":{},"number_of_replicas":0,"refresh_interval":"-1"}}}},"mappings":{MAPPING}}}"#,
        options.shards
    );
    // Created without waiting for its shards (the source would wait 30 s
    // for them by default): `wait_for_primaries` waits as long as asked
    // and says why a shard did not start.
    check(
        client.send(
            "PUT",
            &format!("/{index}?wait_for_active_shards=0"),
            Some(body.as_bytes()),
        )?,
        "creating the index",
        client,
        index,
    )?;
    wait_for_primaries(client, index, options.primaries_timeout_seconds)
}

/// Waits until every primary shard of `index` has started. A shard that does
/// not start (a full disk, a node out of heap) would otherwise surface a
/// minute later as a bulk failure that names no cause.
fn wait_for_primaries(client: &Client, index: &str, timeout_seconds: u32) -> Result<()> {
    let path =
        format!("/_cluster/health/{index}?wait_for_status=yellow&timeout={timeout_seconds}s");
    // The source answers 408 with the health body when the wait timed out.
    let r = client.send("GET", &path, None)?;
    let r = if r.status == 408 {
        r
    } else {
        check(r, "waiting for the index's shards", client, index)?
    };
    let health: serde_json::Value = serde_json::from_slice(&r.body)
        .map_err(|e| Error::Source(format!("cluster health answer is not JSON: {e}")))?;
    if health["timed_out"] != serde_json::Value::Bool(true) {
        return Ok(());
    }
    Err(Error::Source(format!(
        "the primary shards of {index} did not start within {timeout_seconds} s \
         ({} active, {} unassigned); the source says: {}; look at its log and free disk",
        health["active_primary_shards"],
        health["unassigned_shards"],
        allocation_explanation(client),
    )))
}

/// The source's own account of why a shard is unassigned (it explains the
/// first unassigned shard it finds).
fn allocation_explanation(client: &Client) -> String {
    let Ok(r) = client.send("GET", "/_cluster/allocation/explain", None) else {
        return "no allocation explanation (the request failed)".into();
    };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&r.body) else {
        return format!("no allocation explanation (HTTP {})", r.status);
    };
    let parts: Vec<&str> = [
        &v["index"],
        &v["allocate_explanation"],
        &v["unassigned_info"]["reason"],
        &v["unassigned_info"]["details"],
        &v["error"]["reason"],
    ]
    .into_iter()
    .filter_map(|f| f.as_str())
    .collect();
    if parts.is_empty() {
        format!("no allocation explanation (HTTP {})", r.status)
    } else {
        parts.join("; ")
    }
}

/// Indexes documents `first..last`; retries the whole request (ids are fixed,
/// so a retry overwrites) while the source rejects items for load.
fn bulk(client: &Client, options: &LoadOptions, first: u64, last: u64) -> Result<u64> {
    let mut body = Vec::with_capacity(((last - first) as usize) * 1620);
    let mut doc_bytes = 0;
    for id in first..last {
        body.extend_from_slice(format!("{{\"index\":{{\"_id\":\"{id}\"}}}}\n").as_bytes());
        let doc = paper_doc(options.seed, id);
        doc_bytes += doc.len() as u64;
        body.extend_from_slice(&doc);
        body.push(b'\n');
    }
    let path = format!("/{}/_bulk", options.index);
    for attempt in 0..10u32 {
        let r = check(
            client.send("POST", &path, Some(&body))?,
            "bulk indexing",
            client,
            &options.index,
        )?;
        let answer: serde_json::Value = serde_json::from_slice(&r.body)
            .map_err(|e| Error::Source(format!("bulk answer is not JSON: {e}")))?;
        if answer["errors"] != serde_json::Value::Bool(true) {
            return Ok(doc_bytes);
        }
        let first_error = answer["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|i| i["index"]["error"].as_object().cloned());
        let reason = first_error
            .map(|e| format!("{}: {}", e["type"], e["reason"]))
            .unwrap_or_default();
        if !reason.contains("rejected") {
            return Err(Error::Source(format!("bulk indexing failed: {reason}")));
        }
        std::thread::sleep(Duration::from_millis(200 << attempt.min(5)));
    }
    Err(Error::Source(
        "bulk indexing: the source kept rejecting documents for load after 10 tries".into(),
    ))
}
