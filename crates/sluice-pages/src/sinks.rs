//! The sinks of `sluice read`: count, NDJSON, and counting what a filter keeps.

use crate::error::{Error, Result};
use crate::read::{Hit, PageInfo, Sink};
use std::io::Write;
use std::sync::{Arc, Mutex};

/// Counts documents and bytes (per slice, through the read summary).
#[derive(Debug, Default)]
pub struct CountSink {
    /// Documents counted.
    pub docs: u64,
    /// Bytes of their sources.
    pub source_bytes: u64,
}

impl Sink for CountSink {
    fn page(&mut self, _page: &PageInfo, hits: &[Hit<'_>]) -> Result<()> {
        self.docs += hits.len() as u64;
        self.source_bytes += hits.iter().map(|h| h.source.len() as u64).sum::<u64>();
        Ok(())
    }
}

/// One output shared by the tasks: each writes a page's lines at once.
pub type SharedOut = Arc<Mutex<Box<dyn Write + Send>>>;

/// Writes `{"_id":…,"_source":…}` per line, optionally only hits the filter keeps.
pub struct NdjsonSink {
    out: SharedOut,
    filter: Option<Arc<dyn SourceFilter>>,
    buf: Vec<u8>,
    /// Lines written.
    pub written: u64,
    /// Hits looked at.
    pub examined: u64,
}

impl NdjsonSink {
    /// A sink writing to `out`, keeping what `filter` keeps (all without one).
    pub fn new(out: SharedOut, filter: Option<Arc<dyn SourceFilter>>) -> Self {
        NdjsonSink {
            out,
            filter,
            buf: Vec::new(),
            written: 0,
            examined: 0,
        }
    }
}

impl Sink for NdjsonSink {
    #[expect(
        clippy::expect_used,
        reason = "serializing a string to JSON cannot fail"
    )]
    fn page(&mut self, _page: &PageInfo, hits: &[Hit<'_>]) -> Result<()> {
        self.buf.clear();
        for h in hits {
            self.examined += 1;
            if let Some(f) = &self.filter {
                if !f.keep(h.source)? {
                    continue;
                }
            }
            self.buf.extend_from_slice(b"{\"_id\":");
            self.buf
                .extend_from_slice(sonic_rs::to_string(&h.id).expect("a string").as_bytes());
            self.buf.extend_from_slice(b",\"_source\":");
            self.buf.extend_from_slice(h.source.as_bytes());
            self.buf.extend_from_slice(b"}\n");
            self.written += 1;
        }
        if !self.buf.is_empty() {
            let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
            out.write_all(&self.buf)
                .map_err(|e| Error::Config(format!("writing the output: {e}")))?;
        }
        Ok(())
    }
}

/// Decides which documents a filtering sink keeps, from their `_source`
/// text. Pagination knows nothing of predicates: `sluice-ndp` provides the
/// one predicate language of Sluice (`sluice_ndp::pages::PageFilter`).
pub trait SourceFilter: Send + Sync {
    /// Whether to keep the document; an error stops the read.
    fn keep(&self, source: &str) -> Result<bool>;
}

/// Counts the hits a filter keeps (without writing them).
pub struct FilterCountSink {
    filter: Arc<dyn SourceFilter>,
    /// Hits the filter kept.
    pub matched: u64,
    /// Hits looked at.
    pub examined: u64,
}

impl FilterCountSink {
    /// A sink counting what `filter` keeps.
    pub fn new(filter: Arc<dyn SourceFilter>) -> Self {
        FilterCountSink {
            filter,
            matched: 0,
            examined: 0,
        }
    }
}

impl Sink for FilterCountSink {
    fn page(&mut self, _page: &PageInfo, hits: &[Hit<'_>]) -> Result<()> {
        self.examined += hits.len() as u64;
        for h in hits {
            self.matched += self.filter.keep(h.source)? as u64;
        }
        Ok(())
    }
}
