//! Document writes and reads: index, create, update (partial merge,
//! upsert), delete, get; a request's operations (one, or a whole `_bulk`)
//! checked in order under the stripe locks of their ids and written as one
//! atomic store batch, so they meet in the store's group commit.
//!
//! A document is two store entries: `_id` → `_source` bytes exactly as
//! sent (the near-data operators read them in place), and `_id` → version
//! record (`version` u64 LE, `seq_no` u64 LE; docs/FORMAT.md).

use crate::catalog::{Index, MAX_ID_BYTES};
use crate::error::{ApiError, ApiResult};
pub use crate::tombstones::{Tombstones, GC_DELETES, MAX_TOMBSTONES};
use serde_json::{json, Map, Value};
use sluice_store::{LargePut, Snapshot, Store, WriteBatch};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

const STRIPES: usize = 256;
const VERSION_RECORD_BYTES: usize = 16;

/// Optimistic concurrency: the write applies only where the document's
/// current `_seq_no` and `_primary_term` are these.
#[derive(Debug, Clone, Copy, Default)]
pub struct Expect {
    /// `if_seq_no`.
    pub seq_no: Option<u64>,
    /// `if_primary_term`.
    pub primary_term: Option<u64>,
}

/// One write.
#[derive(Debug, Clone)]
pub enum DocOp {
    /// Index (or with `create`, only create) a whole document.
    Index {
        /// The id; none: a generated one.
        id: Option<String>,
        /// The `_source` bytes (a JSON object).
        source: Vec<u8>,
        /// Refuse when the document exists.
        create: bool,
        /// Concurrency check.
        expect: Expect,
    },
    /// Merge a partial document into the stored one.
    Update {
        /// The id.
        id: String,
        /// The partial document.
        doc: Option<Value>,
        /// The document to create when none exists.
        upsert: Option<Value>,
        /// Create from `doc` when none exists.
        doc_as_upsert: bool,
        /// Concurrency check.
        expect: Expect,
    },
    /// Delete a document.
    Delete {
        /// The id.
        id: String,
        /// Concurrency check.
        expect: Expect,
    },
}

/// What one write did.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The document's id.
    pub id: String,
    /// `created`, `updated`, `deleted`, `not_found` or `noop`.
    pub result: &'static str,
    /// Its version after the write.
    pub version: u64,
    /// Its sequence number after the write.
    pub seq_no: u64,
    /// The HTTP status of this operation.
    pub status: u16,
    /// An update's document as it is after it (for `_source` in the
    /// answer); None for other operations.
    pub source: Option<Arc<[u8]>>,
}

/// A document as read.
#[derive(Debug, Clone)]
pub struct Doc {
    /// `_source` bytes.
    pub source: Vec<u8>,
    /// `_version`.
    pub version: u64,
    /// `_seq_no`.
    pub seq_no: u64,
}

/// A request's writes so far, as later operations of it see them.
#[derive(Default)]
struct Overlay {
    /// Documents written (`Some`) or deleted (`None`).
    docs: HashMap<String, Option<Current>>,
    /// Ids deleted at a version (`Some`), or written again (`None`).
    tombs: HashMap<String, Option<u64>>,
    /// Ids whose source (in `docs`, the one copy held) goes to the store
    /// as a large put after the batch's operations, at the commit.
    large: Vec<String>,
}

impl Overlay {
    /// The version `id` was deleted at, by this request or recently.
    fn deleted_version(&self, index: &Index, id: &str) -> Option<u64> {
        match self.tombs.get(id) {
            Some(change) => *change,
            None => index.tombstones.recent(id),
        }
    }
}

/// A document source at least this long is written from where the
/// request holds it (a large put at the commit), not copied into the
/// store's write batch.
pub const LARGE_DOC_BYTES: usize = 1 << 20;

/// Bytes of log record a store batch of document writes reaches before
/// the rest of a request goes to the next one (the store's record limit
/// is 16 MiB; documents of 1 MiB and more take a reference's room).
pub const SPLIT_BATCH_BYTES: usize = 4 << 20;

/// Document operations on every index of a store.
pub struct Docs {
    store: Arc<Store>,
    next_seq_no: AtomicU64,
    stripes: Box<[Mutex<()>]>,
}

#[derive(Clone)]
struct Current {
    version: u64,
    seq_no: u64,
    source: Option<Vec<u8>>,
}

impl Docs {
    /// Document operations on `store`.
    pub fn new(store: Arc<Store>) -> Docs {
        // Every document write takes two store sequences and one `_seq_no`,
        // so numbers handed out after this open exceed those of earlier ones.
        let next = store.snapshot().seq() + 1;
        Docs {
            store,
            next_seq_no: AtomicU64::new(next),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }

    fn stripe(id: &str) -> usize {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in id.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        (h % STRIPES as u64) as usize
    }

    /// Reads a document at `snapshot` (or the latest).
    pub fn get(
        &self,
        index: &Index,
        id: &str,
        snapshot: Option<&Snapshot>,
    ) -> ApiResult<Option<Doc>> {
        let owned;
        let snap = match snapshot {
            Some(s) => s,
            None => {
                owned = self.store.snapshot();
                &owned
            }
        };
        let Some(record) = self
            .store
            .get_at(index.versions, id.as_bytes(), snap)
            .map_err(ApiError::store)?
        else {
            return Ok(None);
        };
        let source = self
            .store
            .get_at(index.docs, id.as_bytes(), snap)
            .map_err(ApiError::store)?
            .ok_or_else(|| {
                ApiError::store(format!(
                    "document {id:?} has a version record but no source"
                ))
            })?;
        let (version, seq_no) = decode_record(&record)?;
        Ok(Some(Doc {
            source,
            version,
            seq_no,
        }))
    }

    fn current(&self, index: &Index, id: &str, with_source: bool) -> ApiResult<Option<Current>> {
        let Some(record) = self
            .store
            .get_latest(index.versions, id.as_bytes())
            .map_err(ApiError::store)?
        else {
            return Ok(None);
        };
        let (version, seq_no) = decode_record(&record)?;
        let source = if with_source {
            self.store
                .get_latest(index.docs, id.as_bytes())
                .map_err(ApiError::store)?
        } else {
            None
        };
        Ok(Some(Current {
            version,
            seq_no,
            source,
        }))
    }

    /// Applies `ops` in order, one result per operation. Operations that
    /// pass their checks are written in store batches of up to
    /// [`SPLIT_BATCH_BYTES`] (a `_bulk` of large documents takes several,
    /// as Elasticsearch's bulk items are independent); each batch is
    /// atomic, and a batch the store refuses fails only its own items.
    pub fn apply(&self, index: &Index, ops: Vec<DocOp>) -> Vec<ApiResult<Outcome>> {
        let ops: Vec<DocOp> = ops.into_iter().map(with_generated_id).collect();
        let mut stripes: Vec<usize> = ops.iter().map(|op| Self::stripe(op_id(op))).collect();
        stripes.sort_unstable();
        stripes.dedup();
        let _guards: Vec<MutexGuard<'_, ()>> = stripes
            .iter()
            .map(|&s| self.stripes[s].lock().unwrap_or_else(|p| p.into_inner()))
            .collect();
        let mut overlay = Overlay::default();
        let mut batch = WriteBatch::new();
        let mut results = Vec::with_capacity(ops.len());
        let mut part_start = 0;
        for op in ops {
            // A large put lands after the batch's operations: a later
            // operation on its id goes into the next batch.
            let after_large = overlay.large.iter().any(|id| id == op_id(&op));
            if batch.logged_bytes() >= SPLIT_BATCH_BYTES || after_large {
                self.commit_part(index, &mut batch, &mut overlay, &mut results[part_start..]);
                part_start = results.len();
            }
            let r = self.check_one(index, op, &mut overlay, &mut batch);
            results.push(r);
        }
        self.commit_part(index, &mut batch, &mut overlay, &mut results[part_start..]);
        results
    }

    /// Writes one store batch of [`Docs::apply`] (`results`: its
    /// operations'), and lets the index know: its columns, the cache
    /// generation, the deletes it remembers. A refused batch fails the
    /// writes among `results`; the overlay starts empty for the next.
    fn commit_part(
        &self,
        index: &Index,
        batch: &mut WriteBatch,
        overlay: &mut Overlay,
        results: &mut [ApiResult<Outcome>],
    ) {
        let overlay = std::mem::take(overlay);
        if batch.is_empty() && overlay.large.is_empty() {
            index.tombstones.apply(overlay.tombs);
            return;
        }
        let written = if overlay.large.is_empty() {
            self.store.write(batch)
        } else {
            let sources: Vec<(&str, [&[u8]; 1])> = overlay
                .large
                .iter()
                .filter_map(|id| match overlay.docs.get(id) {
                    Some(Some(Current {
                        source: Some(s), ..
                    })) => Some((id.as_str(), [&s[..]])),
                    _ => None,
                })
                .collect();
            debug_assert_eq!(
                sources.len(),
                overlay.large.len(),
                "each large put's source held"
            );
            let large: Vec<LargePut<'_>> = sources
                .iter()
                .map(|(id, value)| LargePut {
                    keyspace: index.docs,
                    key: id.as_bytes(),
                    value,
                })
                .collect();
            self.store.write_large(batch, &large)
        };
        batch.clear();
        // Still under the ids' stripe locks: the columns see each id's
        // writes in the order the store committed them.
        match &written {
            Ok(_) => index
                .columns
                .record(overlay.docs.iter().filter_map(|(id, now)| match now {
                    // Every write of a document keeps its source here.
                    Some(c) => c.source.as_deref().map(|s| (id.as_bytes(), Some(s))),
                    None => Some((id.as_bytes(), None)),
                })),
            Err(_) => index.columns.forget(),
        }
        // After the write is visible: a cached answer read before it
        // is never served after it.
        index.bump_generation();
        match written {
            Ok(_) => index.tombstones.apply(overlay.tombs),
            Err(e) => {
                let failed = ApiError::write_refused(&index.name, &e);
                // The deletes not written are not remembered either.
                for r in results.iter_mut() {
                    if matches!(r, Ok(o) if matches!(o.result, "created" | "updated" | "deleted")) {
                        *r = Err(failed.clone());
                    }
                }
            }
        }
    }

    fn lookup(
        &self,
        index: &Index,
        id: &str,
        with_source: bool,
        overlay: &Overlay,
    ) -> ApiResult<Option<Current>> {
        match overlay.docs.get(id) {
            Some(c) => Ok(c.clone()),
            None => self.current(index, id, with_source),
        }
    }

    fn check_one(
        &self,
        index: &Index,
        op: DocOp,
        overlay: &mut Overlay,
        batch: &mut WriteBatch,
    ) -> ApiResult<Outcome> {
        let id = op_id(&op).to_string();
        check_id(&id)?;
        match op {
            DocOp::Index {
                source,
                create,
                expect,
                ..
            } => {
                check_source(&source)?;
                let cur = self.lookup(index, &id, false, overlay)?;
                if create {
                    if let Some(c) = &cur {
                        return Err(conflict(index, format!(
                            "[{id}]: version conflict, document already exists (current version [{}])",
                            c.version
                        )));
                    }
                }
                check_expect(index, &id, &expect, cur.as_ref())?;
                let version = match &cur {
                    Some(c) => c.version + 1,
                    None => overlay.deleted_version(index, &id).map_or(1, |v| v + 1),
                };
                let (result, status) = if cur.is_some() {
                    ("updated", 200)
                } else {
                    ("created", 201)
                };
                self.put(index, &id, source, version, result, status, overlay, batch)
            }
            DocOp::Update {
                doc,
                upsert,
                doc_as_upsert,
                expect,
                ..
            } => {
                let cur = self.lookup(index, &id, true, overlay)?;
                check_expect(index, &id, &expect, cur.as_ref())?;
                let Some(cur) = cur else {
                    let created = match (upsert, doc_as_upsert, doc) {
                        (Some(u), _, _) => u,
                        (None, true, Some(d)) => d,
                        _ => {
                            return Err(ApiError::new(
                                404,
                                "document_missing_exception",
                                format!("[{id}]: document missing"),
                            )
                            .with("index_uuid", json!(index.uuid))
                            .with("shard", json!("0"))
                            .with("index", json!(index.name)))
                        }
                    };
                    let bytes = object_bytes(&created)?;
                    let after = Arc::<[u8]>::from(&bytes[..]);
                    let version = overlay.deleted_version(index, &id).map_or(1, |v| v + 1);
                    return self
                        .put(index, &id, bytes, version, "created", 201, overlay, batch)
                        .map(|o| Outcome {
                            source: Some(after),
                            ..o
                        });
                };
                let old_source = cur.source.clone().unwrap_or_default();
                let mut merged: Value = serde_json::from_slice(&old_source).map_err(|e| {
                    ApiError::store(format!("stored document {id:?} is not JSON: {e}"))
                })?;
                let before = merged.clone();
                if let Some(d) = &doc {
                    merge(&mut merged, d);
                }
                if merged == before {
                    return Ok(Outcome {
                        id,
                        result: "noop",
                        version: cur.version,
                        seq_no: cur.seq_no,
                        status: 200,
                        source: Some(Arc::from(&old_source[..])),
                    });
                }
                let bytes = object_bytes(&merged)?;
                let after = Arc::<[u8]>::from(&bytes[..]);
                self.put(
                    index,
                    &id,
                    bytes,
                    cur.version + 1,
                    "updated",
                    200,
                    overlay,
                    batch,
                )
                .map(|o| Outcome {
                    source: Some(after),
                    ..o
                })
            }
            DocOp::Delete { expect, .. } => {
                let cur = self.lookup(index, &id, false, overlay)?;
                check_expect(index, &id, &expect, cur.as_ref())?;
                let seq_no = self.next_seq_no.fetch_add(1, Ordering::Relaxed);
                let Some(cur) = cur else {
                    // Deleting what is not there still counts a version.
                    let version = overlay.deleted_version(index, &id).map_or(1, |v| v + 1);
                    overlay.tombs.insert(id.clone(), Some(version));
                    return Ok(Outcome {
                        id,
                        result: "not_found",
                        version,
                        seq_no,
                        status: 404,
                        source: None,
                    });
                };
                batch
                    .delete(index.docs, id.as_bytes())
                    .map_err(ApiError::store)?;
                batch
                    .delete(index.versions, id.as_bytes())
                    .map_err(ApiError::store)?;
                overlay.docs.insert(id.clone(), None);
                overlay.tombs.insert(id.clone(), Some(cur.version + 1));
                Ok(Outcome {
                    id,
                    result: "deleted",
                    version: cur.version + 1,
                    seq_no,
                    status: 200,
                    source: None,
                })
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn put(
        &self,
        index: &Index,
        id: &str,
        source: Vec<u8>,
        version: u64,
        result: &'static str,
        status: u16,
        overlay: &mut Overlay,
        batch: &mut WriteBatch,
    ) -> ApiResult<Outcome> {
        let seq_no = self.next_seq_no.fetch_add(1, Ordering::Relaxed);
        let mut record = [0u8; VERSION_RECORD_BYTES];
        record[..8].copy_from_slice(&version.to_le_bytes());
        record[8..].copy_from_slice(&seq_no.to_le_bytes());
        if source.len() >= LARGE_DOC_BYTES {
            // Written from the overlay's copy at the commit; refused here,
            // alone, if the store would refuse it there.
            let put = LargePut {
                keyspace: index.docs,
                key: id.as_bytes(),
                value: &[&source],
            };
            put.check().map_err(ApiError::store)?;
            overlay.large.push(id.to_string());
        } else {
            batch
                .put(index.docs, id.as_bytes(), &source)
                .map_err(ApiError::store)?;
        }
        batch
            .put(index.versions, id.as_bytes(), &record)
            .map_err(ApiError::store)?;
        overlay.tombs.insert(id.to_string(), None);
        overlay.docs.insert(
            id.to_string(),
            Some(Current {
                version,
                seq_no,
                source: Some(source),
            }),
        );
        Ok(Outcome {
            id: id.to_string(),
            result,
            version,
            seq_no,
            status,
            source: None,
        })
    }
}

fn op_id(op: &DocOp) -> &str {
    match op {
        DocOp::Index { id, .. } => id.as_deref().unwrap_or(""),
        DocOp::Update { id, .. } | DocOp::Delete { id, .. } => id,
    }
}

fn with_generated_id(op: DocOp) -> DocOp {
    match op {
        DocOp::Index {
            id: None,
            source,
            create,
            expect,
        } => DocOp::Index {
            id: Some(generate_id()),
            source,
            create,
            expect,
        },
        other => other,
    }
}

/// A new document id: 20 URL-safe characters, like Elasticsearch's.
pub fn generate_id() -> String {
    use base64::Engine;
    let bytes: [u8; 15] = rand::random();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn decode_record(record: &[u8]) -> ApiResult<(u64, u64)> {
    let (Some(v), Some(s)) = (record.get(..8), record.get(8..16)) else {
        return Err(ApiError::store(format!(
            "a version record is {} bytes, not {VERSION_RECORD_BYTES}",
            record.len()
        )));
    };
    let word = |b: &[u8]| {
        b.iter()
            .rev()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
    };
    Ok((word(v), word(s)))
}

fn check_id(id: &str) -> ApiResult<()> {
    if id.is_empty() {
        return Err(ApiError::new(
            400,
            "action_request_validation_exception",
            "Validation Failed: 1: an id must be provided if version type or value are set;"
                .to_string(),
        ));
    }
    if id.len() > MAX_ID_BYTES {
        return Err(ApiError::new(
            400,
            "action_request_validation_exception",
            format!(
                "Validation Failed: 1: id [{id}] is too long, must be no longer than {MAX_ID_BYTES} bytes but was: {};",
                id.len()
            ),
        ));
    }
    Ok(())
}

/// Checks that `source` is one JSON object (what `_source` must be).
pub fn check_source(source: &[u8]) -> ApiResult<()> {
    let first = source.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(not_an_object());
    }
    serde_json::from_slice::<serde::de::IgnoredAny>(source).map_err(|e| {
        ApiError::new(
            400,
            "mapper_parsing_exception",
            format!("failed to parse: {e}"),
        )
        .with(
            "caused_by",
            json!({"type": "json_parse_exception", "reason": e.to_string()}),
        )
    })?;
    Ok(())
}

/// A document that is JSON but not an object, as Elasticsearch refuses it.
fn not_an_object() -> ApiError {
    ApiError::new(
        400,
        "mapper_parsing_exception",
        "failed to parse: the document must be a JSON object",
    )
    .with(
        "caused_by",
        json!({"type": "not_x_content_exception", "reason": "the document must be a JSON object"}),
    )
}

fn object_bytes(v: &Value) -> ApiResult<Vec<u8>> {
    if !v.is_object() {
        return Err(not_an_object());
    }
    serde_json::to_vec(v).map_err(|e| ApiError::store(e.to_string()))
}

fn conflict(index: &Index, reason: String) -> ApiError {
    ApiError::new(409, "version_conflict_engine_exception", reason)
        .with("index_uuid", json!(index.uuid))
        .with("shard", json!("0"))
        .with("index", json!(index.name))
}

fn check_expect(index: &Index, id: &str, expect: &Expect, cur: Option<&Current>) -> ApiResult<()> {
    let Some(want) = expect.seq_no else {
        return Ok(());
    };
    let term = expect.primary_term.unwrap_or(1);
    match cur {
        Some(c) if c.seq_no == want && term == 1 => Ok(()),
        Some(c) => Err(conflict(index, format!(
            "[{id}]: version conflict, required seqNo [{want}], primary term [{term}]. current document has seqNo [{}] and primary term [1]",
            c.seq_no
        ))),
        None => Err(conflict(index, format!(
            "[{id}]: version conflict, required seqNo [{want}], primary term [{term}] but no document was found"
        ))),
    }
}

/// Deep merge as Elasticsearch's partial update does: objects merge member
/// by member, anything else replaces.
fn merge(into: &mut Value, patch: &Value) {
    match (into, patch) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                    _ => {
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (slot, other) => *slot = other.clone(),
    }
}

/// `_source` filtering: `includes`/`excludes` path patterns (`*` wildcards).
pub fn filter_source(
    source: &[u8],
    includes: &[String],
    excludes: &[String],
) -> ApiResult<Vec<u8>> {
    let v: Value = serde_json::from_slice(source)
        .map_err(|e| ApiError::store(format!("a stored document is not JSON: {e}")))?;
    let mut out = Map::new();
    if let Value::Object(m) = v {
        filter_into(&m, "", includes, excludes, &mut out);
    }
    serde_json::to_vec(&Value::Object(out)).map_err(|e| ApiError::store(e.to_string()))
}

fn path_matches(pattern: &str, path: &str) -> bool {
    crate::catalog::glob(pattern, path)
}

fn filter_into(
    m: &Map<String, Value>,
    prefix: &str,
    inc: &[String],
    exc: &[String],
    out: &mut Map<String, Value>,
) {
    for (k, v) in m {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if exc.iter().any(|p| path_matches(p, &path)) {
            continue;
        }
        let included = inc.is_empty() || inc.iter().any(|p| path_matches(p, &path));
        if included {
            if let (Value::Object(inner), false) = (v, exc.is_empty()) {
                let mut sub = Map::new();
                filter_into(inner, &path, &[], exc, &mut sub);
                out.insert(k.clone(), Value::Object(sub));
            } else {
                out.insert(k.clone(), v.clone());
            }
            continue;
        }
        // An include may name something inside this object.
        if let Value::Object(inner) = v {
            if inc
                .iter()
                .any(|p| p.starts_with(&format!("{path}.")) || p.starts_with('*'))
            {
                let mut sub = Map::new();
                filter_into(inner, &path, inc, exc, &mut sub);
                if !sub.is_empty() {
                    out.insert(k.clone(), Value::Object(sub));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_documents_merge_deeply() {
        let mut a = json!({"a":1,"o":{"x":1,"y":2}});
        merge(&mut a, &json!({"o":{"y":3,"z":4},"b":[1]}));
        assert_eq!(a, json!({"a":1,"o":{"x":1,"y":3,"z":4},"b":[1]}));
    }

    #[test]
    fn source_filters_take_includes_and_excludes() {
        let src = br#"{"title":"t","meta":{"year":2020,"pages":9},"authors":["a"]}"#;
        let f = |i: &[&str], e: &[&str]| {
            let i: Vec<String> = i.iter().map(|s| s.to_string()).collect();
            let e: Vec<String> = e.iter().map(|s| s.to_string()).collect();
            serde_json::from_slice::<Value>(&filter_source(src, &i, &e).unwrap()).unwrap()
        };
        assert_eq!(f(&["title"], &[]), json!({"title":"t"}));
        assert_eq!(f(&["meta.year"], &[]), json!({"meta":{"year":2020}}));
        assert_eq!(f(&["meta"], &[]), json!({"meta":{"year":2020,"pages":9}}));
        assert_eq!(
            f(&[], &["meta.pages", "authors"]),
            json!({"title":"t","meta":{"year":2020}})
        );
        assert_eq!(f(&["t*"], &[]), json!({"title":"t"}));
    }

    #[test]
    fn sources_must_be_objects() {
        assert!(check_source(b" {\"a\":1}").is_ok());
        assert!(check_source(b"[1]").is_err());
        assert!(check_source(b"{\"a\":").is_err());
    }
}
