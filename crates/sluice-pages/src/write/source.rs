//! What the writer takes pages from, and what it reports: the page as it
//! goes onto the device, the sources of a slice's pages, the watch a caller
//! holds on a running export and the summary it gets at the end.

use crate::error::Result;
use crate::page::{PageBytes, PageTarget};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

/// One page as it goes onto the device, and where the next one starts.
#[derive(Debug)]
pub struct FetchedPage {
    /// `[{"_id":…,"_source":…},…]\n`
    pub bytes: PageBytes,
    /// CRC32C of `bytes`, computed as they were put together (while they
    /// were still in the cache).
    pub crc32c: u32,
    /// Documents in the page.
    pub docs: u32,
    /// Bytes of the largest hit.
    pub max_hit_bytes: usize,
    /// The checkpoint cursor after this page.
    pub cursor_after: String,
}

/// How long written pages wait for their checkpoint unless told otherwise:
/// two device flushes a page cost an export from a source on the same
/// machine a tenth of its speed while the disk was busy (docs/BENCHMARKS.md,
/// "Checkpoints once a second"), and a second of pages is cheap to fetch
/// again after a crash.
pub const DEFAULT_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);

/// Progress an embedding program reads while an export runs, and its way
/// to stop one: an interrupted export stops after the pages in flight with
/// their checkpoints durable, and `resume` finishes it.
#[derive(Debug, Default)]
pub struct ExportWatch {
    /// Documents the export holds so far (earlier runs' too).
    pub docs: AtomicU64,
    /// Documents expected, once known (0 before).
    pub total_docs: AtomicU64,
    /// Set to stop the export.
    pub interrupt: AtomicBool,
}

/// What an export did.
#[derive(Debug, Clone)]
pub struct ExportSummary {
    /// Documents the export holds.
    pub docs: u64,
    /// Pages it holds.
    pub pages: u64,
    /// Page bytes it holds (before padding).
    pub bytes: u64,
    /// Per slice.
    pub slices: Vec<SliceSummary>,
    /// Time this run took.
    pub elapsed: Duration,
    /// Documents and page bytes written by this run (less than `docs` and
    /// `bytes` after `--resume`).
    pub docs_this_run: u64,
    /// Page bytes written by this run.
    pub bytes_this_run: u64,
    /// The sort the cursors used.
    pub sort: String,
    /// Bytes of the device the export takes.
    pub device_bytes_used: u64,
    /// Times the point in time expired mid-run and was reopened.
    pub pit_reopens: u32,
    /// Answers the source refused or failed to build (429, a circuit
    /// breaker, 5xx, a timeout), each followed by smaller pages.
    pub page_refusals: u64,
}

/// One slice's share.
#[derive(Debug, Clone, Copy)]
pub struct SliceSummary {
    /// Documents.
    pub docs: u64,
    /// Pages.
    pub pages: u64,
}
pub(super) fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
/// Where one slice's pages come from: a search engine's cursor for
/// `sluice export`, or anything else that yields a slice's pages in order
/// (the read benchmark's generated pages, later imports).
pub trait PageSource: Send {
    /// The next page, or none when the slice has no more.
    fn next_page(&mut self) -> Result<Option<FetchedPage>>;
    /// Releases what the source holds open (a scroll context); called once.
    fn close(&mut self) {}
    /// Offers the pinned buffers of the engine that writes the pages: a
    /// source that builds its pages may build them there (no copy on the
    /// way to the device); one that does not keeps handing heap pages.
    fn build_pages_in(&mut self, _target: PageTarget) {}
}
/// Makes slice `slice`'s source, continuing after `cursor` (the slice's
/// checkpoint cursor; empty = from the start). Called on the slice's own
/// fetcher thread.
pub type SourceFactory<'a> = dyn Fn(u32, &str) -> Result<Box<dyn PageSource + 'a>> + Sync + 'a;
