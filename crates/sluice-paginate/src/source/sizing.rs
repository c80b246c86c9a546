//! How many documents a page asks for: sampled hit sizes, then each
//! slice's own measure of what its pages came to.

use super::hits::build_page;
use super::{check, SourceSpec};
use crate::error::Result;
use crate::http::Client;

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
    pub(super) docs: u32,
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
