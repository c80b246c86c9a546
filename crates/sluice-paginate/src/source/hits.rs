//! A search response's hits as a page: the frames the device format
//! holds, written front to back into the page's pinned buffer.

use crate::error::{Error, Result};
use crate::http::Response;
use crate::page::{PageBytes, PageTarget};
use std::borrow::Cow;
use std::sync::Mutex;

pub(super) struct BuiltPage {
    pub(super) bytes: PageBytes,
    pub(super) crc32c: u32,
    /// Shards that failed, and why (raw JSON): the page is incomplete.
    pub(super) failed_shards: u32,
    pub(super) shard_failures: String,
    pub(super) docs: u32,
    pub(super) max_hit_bytes: usize,
    pub(super) last_sort: Option<String>,
    pub(super) pit_id: Option<String>,
    pub(super) scroll_id: Option<String>,
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
pub(super) fn build_page(body: &[u8], target: Option<&PageTarget>) -> Result<BuiltPage> {
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
pub(super) fn context_missing(r: &Response) -> bool {
    r.status == 404 && r.error_summary().contains("search_context_missing")
}

pub(super) fn empty_page() -> BuiltPage {
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

/// Fills a page front to back.
struct PageFill<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl<'a> PageFill<'a> {
    pub(super) fn new(out: &'a mut [u8]) -> Self {
        PageFill { out, at: 0 }
    }

    /// Appends `bytes`.
    ///
    /// # Panics
    /// Past the page's length: the length was computed wrong.
    pub(super) fn put(&mut self, bytes: &[u8]) {
        self.out[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }

    /// Bytes filled so far.
    pub(super) fn filled(&self) -> usize {
        self.at
    }

    /// What has been filled.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.out[..self.at]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
