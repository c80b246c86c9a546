//! `sluice export`: one task per slice pulls pages from the source and writes
//! each with direct I/O at the LBA its slice's extents give, then makes the
//! slice's checkpoint durable. Layout in docs/FORMAT.md ("Export device").

use crate::device::{writer_engine, DeviceIo};
use crate::error::{Error, Result};
use crate::format::{
    max_extent_slots, Checkpoint, CursorKind, ExportState, Header, ManifestBlock, PageEntry,
    SliceState, MAX_SLICES, NO_EXTENT,
};
use crate::http::Client;
use crate::layout::{load_export, ExtentAllocator};
use crate::page::{PageBytes, PageTarget};
use crate::progress::{Counter, ProgressMode, Reporter};
use crate::source::{
    index_counts, pick_sort, sample_hit_bytes, slice_field, CursorState, Engine, FetchedPage,
    IndexInfo, SharedPit, SliceCursor, SourceSpec,
};
use sluice_io::{Device, DurableWrites, FileDevice, FileOptions, Geometry, Priority};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Largest page the engine accepts for a search (OpenSearch's default
/// `index.max_result_window`).
pub const MAX_PAGE_DOCS: u32 = 10_000;
/// Largest slot: one usual page.
pub const MAX_SLOT_BYTES: u64 = 256 << 20;
/// Extent size the slot count is picked for: large enough that a page of
/// documents many times the usual size still fits one extent, small enough
/// that the one partly used extent per slice wastes little.
pub const AUTO_EXTENT_BYTES: u64 = 32 << 20;
/// Headroom over the sampled page size before a page spills into a second slot.
const SLOT_HEADROOM: f64 = 1.15;

/// What `sluice export` is asked to do.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// The export device: a file (created when missing) or a block device.
    pub device: PathBuf,
    /// Size of the file to create when `device` does not exist; none = the size needed.
    pub device_size_bytes: Option<u64>,
    /// Block size of a device file created here.
    pub block_size_bytes: u32,
    /// Which index, query and fields.
    pub spec: SourceSpec,
    /// None: the index's primary shard count.
    pub slices: Option<u32>,
    /// Most documents a page asks for.
    pub page_docs: u32,
    /// The byte budget of one answer of the source: pages are sized by
    /// bytes, at most `page_docs` documents (see
    /// [`crate::source::PageSizer`]).
    pub page_bytes: u64,
    /// Point in time (resumable) or scroll.
    pub cursor: CursorKind,
    /// Slot size in bytes; none = sized from a sample.
    pub slot_bytes: Option<u64>,
    /// Slots per extent; none = enough for [`AUTO_EXTENT_BYTES`] (at least 8).
    pub extent_slots: Option<u32>,
    /// Documents per second over all slices; none = as fast as the source goes.
    pub throttle_docs_per_s: Option<f64>,
    /// Finish an interrupted export instead of starting a new one.
    pub resume: bool,
    /// Bars, lines or nothing.
    pub progress: ProgressMode,
    /// Time between progress lines.
    pub progress_interval: Duration,
    /// Most time a slice's written pages wait to be made durable and
    /// counted by its checkpoint; zero: every page at once. A crash loses
    /// nothing that was counted, and `--resume` fetches the rest again.
    pub checkpoint_interval: Duration,
    /// Progress counters and an interrupt that a caller (the Python
    /// package) reads and sets from another thread.
    pub watch: Option<Arc<ExportWatch>>,
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

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            device: "data/export.dev".into(),
            device_size_bytes: None,
            block_size_bytes: 4096,
            spec: SourceSpec {
                keep_alive: "5m".into(),
                ..SourceSpec::default()
            },
            slices: None,
            page_docs: 2048,
            page_bytes: crate::source::DEFAULT_PAGE_BYTES,
            cursor: CursorKind::Pit,
            slot_bytes: None,
            extent_slots: None,
            throttle_docs_per_s: None,
            resume: false,
            progress: ProgressMode::Auto,
            progress_interval: Duration::from_secs(5),
            checkpoint_interval: DEFAULT_CHECKPOINT_INTERVAL,
            watch: None,
        }
    }
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

/// Sizes of the layout, from what the sample says about the index.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Slices (one writer task each).
    pub slices: u32,
    /// Blocks of a page slot.
    pub slot_blocks: u32,
    /// Slots per extent.
    pub extent_slots: u32,
    /// Extents the whole export needs.
    pub needed_extents: u64,
    /// Device bytes the whole export needs.
    pub needed_bytes: u64,
    /// How the sizes were reckoned (for messages).
    pub detail: String,
}

/// The slices of an export: `--slices`, else one per primary shard.
pub fn slice_count(options: &ExportOptions, primary_shards: u32) -> Result<u32> {
    if options.slices.is_some_and(|s| s == 0 || s > MAX_SLICES) {
        return Err(Error::Config(format!(
            "--slices must be between 1 and {MAX_SLICES}"
        )));
    }
    Ok(options
        .slices
        .unwrap_or(primary_shards)
        .clamp(1, MAX_SLICES))
}

/// Sizes the layout from the options and what the source said about the index.
pub fn plan(options: &ExportOptions, info: &IndexInfo) -> Result<Plan> {
    let bs = options.block_size_bytes as u64;
    let slices = slice_count(options, info.primary_shards)?;
    if options.page_docs == 0 || options.page_docs > MAX_PAGE_DOCS {
        return Err(Error::Config(format!(
            "--page-docs {} must be between 1 and {MAX_PAGE_DOCS} (the engine's result window)",
            options.page_docs
        )));
    }
    let docs_per_page = (options.page_docs as u64).min(info.doc_count.max(1));
    // Pages are sized by bytes: the usual one holds the budget, or all
    // `page_docs` documents when they take less.
    let usual_docs_bytes =
        (info.mean_hit_bytes * docs_per_page as f64).min(options.page_bytes.max(1) as f64);
    let usual_page_bytes = match options.slot_bytes {
        Some(b) => b,
        None => (usual_docs_bytes * SLOT_HEADROOM) as u64 + 64,
    };
    if usual_page_bytes > MAX_SLOT_BYTES {
        return Err(Error::Config(format!(
            "a page of {docs_per_page} documents takes about {usual_page_bytes} bytes, more than the {MAX_SLOT_BYTES}-byte limit; lower --page-docs"
        )));
    }
    let slot_blocks = usual_page_bytes.div_ceil(bs).max(1);
    let slot_bytes = slot_blocks * bs;
    let most_slots = max_extent_slots(options.block_size_bytes);
    let extent_slots = match options.extent_slots {
        Some(n) if n == 0 || n > most_slots => {
            return Err(Error::Config(format!(
                "extent slots {n} must be between 1 and {most_slots}"
            )))
        }
        Some(n) => n,
        // An extent holds the largest page a cursor keeps (four page
        // budgets, `PageSizer::too_big`) with room to spare.
        None => (AUTO_EXTENT_BYTES
            .max(5 * options.page_bytes)
            .div_ceil(slot_bytes) as u32)
            .clamp(8, most_slots),
    };
    let data_bytes = (info.doc_count as f64 * info.mean_hit_bytes * SLOT_HEADROOM) as u64;
    let slots = data_bytes.div_ceil(slot_bytes) + 2 * slices as u64;
    let needed_extents = slots.div_ceil(extent_slots as u64) + slices as u64;
    let extent_bytes = extent_slots as u64 * slot_bytes;
    let needed_bytes =
        (2 + 2 * slices as u64 + needed_extents) * bs + needed_extents * extent_bytes;
    Ok(Plan {
        slices,
        slot_blocks: slot_blocks as u32,
        extent_slots,
        needed_extents,
        needed_bytes,
        detail: format!(
            "{} documents of about {:.0} bytes in {slices} slices: {needed_extents} extents of {extent_slots} slots of {slot_bytes} bytes",
            info.doc_count, info.mean_hit_bytes
        ),
    })
}

/// Opens the device, creating a file of the needed size where there is
/// none, and checks it fits the plan; a file created here is removed again
/// when it does not.
fn open_device(options: &ExportOptions, plan: &Plan) -> Result<Arc<FileDevice>> {
    let file_options = FileOptions {
        block_size_bytes: options.block_size_bytes,
        ..FileOptions::default()
    };
    let created = !options.device.exists();
    let device = if created {
        let mib = 1u64 << 20;
        let size = options
            .device_size_bytes
            .unwrap_or(plan.needed_bytes)
            .div_ceil(mib)
            * mib;
        FileDevice::create(&options.device, size, &file_options)?
    } else {
        FileDevice::open(&options.device, &file_options)?
    };
    let geometry = device.geometry();
    let fits = if geometry.block_size_bytes != options.block_size_bytes {
        Err(Error::Config(format!(
            "{} has {}-byte blocks; run with --block-size {}",
            options.device.display(),
            geometry.block_size_bytes,
            geometry.block_size_bytes
        )))
    } else if geometry.size_bytes() < plan.needed_bytes {
        Err(Error::DeviceTooSmall {
            path: options.device.clone(),
            size_bytes: geometry.size_bytes(),
            needed_bytes: plan.needed_bytes,
            detail: plan.detail.clone(),
        })
    } else {
        Ok(())
    };
    if let Err(e) = fits {
        drop(device);
        if created {
            let _ = std::fs::remove_file(&options.device);
        }
        return Err(e);
    }
    Ok(Arc::new(device))
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn description(
    client: &Client,
    spec: &SourceSpec,
    sort: &str,
    slice_field: &Option<String>,
) -> String {
    serde_json::json!({
        "slice_field": slice_field,
        "source": client.base_url(),
        "index": spec.index,
        "query": spec.query,
        "source_includes": spec.source_includes,
        "source_excludes": spec.source_excludes,
        "sort": sort,
    })
    .to_string()
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

impl PageSource for SliceCursor<'_> {
    fn next_page(&mut self) -> Result<Option<FetchedPage>> {
        SliceCursor::next_page(self)
    }

    fn build_pages_in(&mut self, target: PageTarget) {
        SliceCursor::build_pages_in(self, target)
    }

    fn close(&mut self) {
        SliceCursor::close(self)
    }
}

/// Makes slice `slice`'s source, continuing after `cursor` (the slice's
/// checkpoint cursor; empty = from the start). Called on the slice's own
/// fetcher thread.
pub type SourceFactory<'a> = dyn Fn(u32, &str) -> Result<Box<dyn PageSource + 'a>> + Sync + 'a;

/// The sizes of a new export's layout and what it is an export of.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Slices.
    pub slices: u32,
    /// Most documents a page asks for.
    pub page_docs: u32,
    /// Blocks of a page slot.
    pub slot_blocks: u32,
    /// Slots per extent.
    pub extent_slots: u32,
    /// Point in time or scroll (recorded for `--resume`).
    pub cursor_kind: CursorKind,
    /// JSON that names the source; `--resume` refuses a different one.
    pub description: String,
}

/// How pages are written, whatever their source.
#[derive(Debug, Clone)]
pub struct WriteSettings {
    /// Documents per second over all slices; none = as fast as the sources go.
    pub throttle_docs_per_s: Option<f64>,
    /// Bars, lines or nothing.
    pub progress: ProgressMode,
    /// Time between progress lines.
    pub progress_interval: Duration,
    /// Documents expected (for the ETA), if known.
    pub total_docs: Option<u64>,
    /// Most time written pages wait for a durable checkpoint (zero: none).
    pub checkpoint_interval: Duration,
    /// Progress and interrupt shared with the caller.
    pub watch: Option<Arc<ExportWatch>>,
}

impl Default for WriteSettings {
    fn default() -> Self {
        WriteSettings {
            throttle_docs_per_s: None,
            progress: ProgressMode::Off,
            progress_interval: Duration::from_secs(5),
            total_docs: None,
            checkpoint_interval: DEFAULT_CHECKPOINT_INTERVAL,
            watch: None,
        }
    }
}

impl WriteSettings {
    fn from_options(options: &ExportOptions, total_docs: Option<u64>) -> Self {
        WriteSettings {
            throttle_docs_per_s: options.throttle_docs_per_s,
            progress: options.progress,
            progress_interval: options.progress_interval,
            total_docs,
            checkpoint_interval: options.checkpoint_interval,
            watch: options.watch.clone(),
        }
    }
}

/// The in-progress header of a new export of `layout` on a device of `geometry`.
pub fn new_header(geometry: Geometry, layout: &Layout) -> Result<Header> {
    let manifest_lba = 2 + 2 * layout.slices as u64;
    let extent_blocks = layout.extent_slots as u64 * layout.slot_blocks as u64;
    if layout.slices == 0
        || layout.slices > MAX_SLICES
        || extent_blocks == 0
        || layout.extent_slots > max_extent_slots(geometry.block_size_bytes)
    {
        return Err(Error::Config(format!(
            "layout out of range: {} slices (1..={MAX_SLICES}), {} slots of {} blocks per extent (1..={} slots)",
            layout.slices,
            layout.extent_slots,
            layout.slot_blocks,
            max_extent_slots(geometry.block_size_bytes)
        )));
    }
    let extent_capacity = geometry.block_count.saturating_sub(manifest_lba) / (1 + extent_blocks);
    if extent_capacity == 0 {
        return Err(Error::Config(format!(
            "the device ({} bytes) holds no extent of {} bytes",
            geometry.size_bytes(),
            extent_blocks * geometry.block_size_bytes as u64
        )));
    }
    Ok(Header {
        block_size_bytes: geometry.block_size_bytes,
        generation: 1,
        state: ExportState::InProgress,
        slice_count: layout.slices,
        page_docs: layout.page_docs,
        slot_blocks: layout.slot_blocks,
        extent_slots: layout.extent_slots,
        cursor_kind: layout.cursor_kind,
        manifest_lba,
        data_lba: manifest_lba + extent_capacity,
        extent_capacity,
        created_unix_ms: now_unix_ms(),
        total_docs: 0,
        total_pages: 0,
        total_bytes: 0,
        description: layout.description.clone(),
    })
}

/// Writes a new export of `layout` onto `device`, one task per slice pulling
/// pages from `sources`: everything of [`export`] that does not depend on
/// where the pages come from.
pub fn write_new_export(
    device: Arc<dyn Device>,
    layout: &Layout,
    sources: &SourceFactory<'_>,
    settings: &WriteSettings,
) -> Result<ExportSummary> {
    let start = Instant::now();
    let header = new_header(device.geometry(), layout)?;
    let io = DeviceIo::open(device.clone(), 4, 16 << 20)?;
    initialise(&io, &header)?;
    let checkpoints = (0..layout.slices).map(Checkpoint::new).collect();
    let allocator = ExtentAllocator::new(header.extent_capacity, Vec::new());
    write_slices(
        device,
        header,
        checkpoints,
        Vec::new(),
        allocator,
        sources,
        settings,
        start,
    )
}

/// The source factory of a search engine export.
fn cursor_factory<'a>(
    client: &'a Client,
    spec: &'a SourceSpec,
    pit: Option<&'a SharedPit>,
    sort: &'a str,
    (slices, page_docs, page_bytes, first_docs): (u32, u32, u64, u32),
    split_field: &'a Option<String>,
) -> impl Fn(u32, &str) -> Result<Box<dyn PageSource + 'a>> + Sync + 'a {
    move |slice, cursor| {
        let resume_from = if cursor.is_empty() {
            None
        } else {
            Some(CursorState::parse(cursor)?)
        };
        Ok(Box::new(SliceCursor::new(
            client,
            spec,
            pit,
            sort.to_string(),
            slice,
            slices,
            (page_docs, page_bytes, first_docs),
            split_field.clone(),
            resume_from,
        )))
    }
}

/// Runs an export (or resumes one) to the end.
pub fn export(client: &Client, options: &ExportOptions) -> Result<ExportSummary> {
    let start = Instant::now();
    options.spec.validate()?;
    if options.resume {
        return resume(client, options, start);
    }
    // Every request needed to start is answered before the device is touched.
    let engine = Engine::detect(client)?;
    let (primary_shards, doc_count) = index_counts(client, &options.spec)?;
    let slices = slice_count(options, primary_shards)?;
    let cursor_kind = match options.cursor {
        CursorKind::Pit if !engine.has_pit() => {
            log::info!("{engine} has no point in time: exporting with sliced scroll instead");
            CursorKind::Scroll
        }
        kind => kind,
    };
    let pit = match cursor_kind {
        CursorKind::Pit => Some(SharedPit::open(client, engine, &options.spec)?),
        CursorKind::Scroll => None,
    };
    let sort = match &pit {
        Some(p) => pick_sort(client, p, slices, primary_shards),
        None => Ok(r#"["_doc"]"#.to_string()),
    };
    let sort = match sort {
        Ok(s) => s,
        Err(e) => {
            if let Some(p) = &pit {
                p.close(client);
            }
            return Err(e);
        }
    };
    let split_field = slice_field(slices, primary_shards);
    let summary = export_slices(
        client,
        options,
        (pit.as_ref(), &sort, &split_field),
        (slices, primary_shards, doc_count),
        cursor_kind,
    );
    finish_source(client, pit, sort, start, summary)
}

/// A new export's slices, from the cursors' first pages to the last
/// checkpoint: the first pages fetched while the index is sampled and the
/// device made ready. The point in time is closed when the export cannot
/// start; after a later error it stays open for `--resume`.
fn export_slices(
    client: &Client,
    options: &ExportOptions,
    (pit, sort, split_field): (Option<&SharedPit>, &str, &Option<String>),
    (slices, primary_shards, doc_count): (u32, u32, u64),
    cursor_kind: CursorKind,
) -> Result<ExportSummary> {
    // A scroll keeps the page size of its first request to its end: its
    // pages are sized from the sample before they start. A point in time
    // starts small and grows with what it measures.
    let scroll_sample = match cursor_kind {
        CursorKind::Scroll => Some(sample_hit_bytes(client, &options.spec)?),
        CursorKind::Pit => None,
    };
    let first_docs = match scroll_sample {
        Some(mean) => crate::source::docs_in_budget(mean, options.page_docs, options.page_bytes),
        None => crate::source::FIRST_PAGE_DOCS,
    };
    let cursors = cursor_factory(
        client,
        &options.spec,
        pit,
        sort,
        (slices, options.page_docs, options.page_bytes, first_docs),
        split_field,
    );
    std::thread::scope(|scope| {
        // Each slice's first page is on its way while the index is sampled
        // and the device made ready: the source works from the start.
        let first_pages = FirstPages::fetch(scope, slices, &cursors);
        let ready = (|| {
            let info = IndexInfo {
                primary_shards,
                doc_count,
                mean_hit_bytes: match scroll_sample {
                    Some(mean) => mean,
                    None => sample_hit_bytes(client, &options.spec)?,
                },
            };
            let plan = plan(options, &info)?;
            debug_assert_eq!(plan.slices, slices);
            let device = open_device(options, &plan)?;
            Ok((plan, device))
        })();
        let (plan, device) = match ready {
            Ok(r) => r,
            Err(e) => {
                // Nothing was written: nothing to resume either.
                first_pages.discard();
                if let Some(p) = pit {
                    p.close(client);
                }
                return Err(e);
            }
        };
        let layout = Layout {
            slices,
            page_docs: options.page_docs,
            slot_blocks: plan.slot_blocks,
            extent_slots: plan.extent_slots,
            cursor_kind,
            description: description(client, &options.spec, sort, split_field),
        };
        log::info!(
            "export of {} ({doc_count} documents) to {}: {slices} slices, sort {sort}, pages of at most {} documents and about {} bytes, in slots of {} bytes",
            options.spec.index,
            options.device.display(),
            options.page_docs,
            options.page_bytes,
            plan.slot_blocks as u64 * options.block_size_bytes as u64
        );
        let sources = |slice: u32, cursor: &str| match first_pages.take(slice, cursor) {
            Some(source) => Ok(source),
            None => cursors(slice, cursor),
        };
        let summary = write_new_export(
            device as Arc<dyn Device>,
            &layout,
            &sources,
            &WriteSettings::from_options(options, Some(doc_count)),
        );
        // Slices that never started (the export stopped first) still
        // close what their first fetch opened.
        first_pages.discard();
        summary
    })
}

/// The result of fetching a slice's first page ahead: the cursor, moved on
/// past it, and the page (or why there is none).
type FirstPage<'a> = (Box<dyn PageSource + 'a>, Result<Option<FetchedPage>>);

/// Each slice's first page, fetched on a thread of its own while the export
/// gets ready; taken by the slice's writer as the start of its source.
struct FirstPages<'scope, 'a> {
    pending: Vec<Mutex<Option<std::thread::ScopedJoinHandle<'scope, Result<FirstPage<'a>>>>>>,
}

impl<'scope, 'a: 'scope> FirstPages<'scope, 'a> {
    fn fetch<'env>(
        scope: &'scope std::thread::Scope<'scope, 'env>,
        slices: u32,
        cursors: &'env (impl Fn(u32, &str) -> Result<Box<dyn PageSource + 'a>> + Sync),
    ) -> Self {
        let pending = (0..slices)
            .map(|slice| {
                let handle = std::thread::Builder::new()
                    .name(format!("first-{slice}"))
                    .spawn_scoped(scope, move || {
                        let mut cursor = cursors(slice, "")?;
                        let page = cursor.next_page();
                        Ok((cursor, page))
                    })
                    .expect("spawn first-page fetcher");
                Mutex::new(Some(handle))
            })
            .collect();
        FirstPages { pending }
    }

    /// Slice `slice`'s source from its start, its first page fetched
    /// already (none once taken, or for a slice that starts elsewhere).
    fn take(&self, slice: u32, cursor: &str) -> Option<Box<dyn PageSource + 'scope>> {
        if !cursor.is_empty() {
            return None;
        }
        let handle = self.pending.get(slice as usize)?.lock().ok()?.take()?;
        Some(Box::new(Prefetched {
            handle: Some(handle),
            cursor: None,
            target: None,
        }))
    }

    /// Waits for the fetches not taken and closes what they opened.
    fn discard(&self) {
        for pending in &self.pending {
            let handle = pending.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(Ok(Ok((mut cursor, _)))) = handle.map(|h| h.join()) {
                cursor.close();
            }
        }
    }
}

/// A slice's source whose first page was fetched ahead.
struct Prefetched<'scope, 'a> {
    handle: Option<std::thread::ScopedJoinHandle<'scope, Result<FirstPage<'a>>>>,
    cursor: Option<Box<dyn PageSource + 'a>>,
    target: Option<PageTarget>,
}

impl PageSource for Prefetched<'_, '_> {
    fn next_page(&mut self) -> Result<Option<FetchedPage>> {
        if let Some(handle) = self.handle.take() {
            let joined = handle
                .join()
                .map_err(|_| Error::Source("fetching a slice's first page panicked".into()))?;
            let (mut cursor, first) = joined?;
            if let Some(target) = self.target.take() {
                cursor.build_pages_in(target);
            }
            self.cursor = Some(cursor);
            return first;
        }
        match &mut self.cursor {
            Some(cursor) => cursor.next_page(),
            None => Ok(None),
        }
    }

    fn close(&mut self) {
        if let Some(handle) = self.handle.take() {
            if let Ok(Ok((cursor, _))) = handle.join() {
                self.cursor = Some(cursor);
            }
        }
        if let Some(cursor) = &mut self.cursor {
            cursor.close();
        }
    }

    fn build_pages_in(&mut self, target: PageTarget) {
        match &mut self.cursor {
            Some(cursor) => cursor.build_pages_in(target),
            None => self.target = Some(target),
        }
    }
}

/// Closes the point in time after a complete export (after an error it stays
/// open, until its keep-alive runs out, for `--resume`).
fn finish_source(
    client: &Client,
    pit: Option<SharedPit>,
    sort: String,
    start: Instant,
    summary: Result<ExportSummary>,
) -> Result<ExportSummary> {
    let mut summary = summary?;
    // From the start of the command: the index sample and PIT count too.
    summary.elapsed = start.elapsed();
    if let Some(p) = &pit {
        p.close(client);
        summary.pit_reopens = p.reopened();
    }
    summary.sort = sort;
    summary.page_refusals = client.refusals();
    Ok(summary)
}

/// Makes the device an empty export: old headers and checkpoints go first,
/// so a crash here leaves no export rather than a mix of two.
fn initialise(io: &DeviceIo, header: &Header) -> Result<()> {
    let bs = header.block_size_bytes as usize;
    let zero = vec![0u8; bs];
    io.write(0, &zero)?;
    io.write(1, &zero)?;
    let mut block = vec![0u8; bs];
    for slice in 0..header.slice_count {
        Checkpoint::new(slice).encode(&mut block)?;
        io.write(Header::checkpoint_lba(slice, 0), &block)?;
        io.write(Header::checkpoint_lba(slice, 1), &zero)?;
    }
    io.flush()?;
    header.encode(&mut block)?;
    io.write(header.generation & 1, &block)?;
    io.flush()
}

fn resume(client: &Client, options: &ExportOptions, start: Instant) -> Result<ExportSummary> {
    if !options.device.exists() {
        return Err(Error::Config(format!(
            "--resume: {} does not exist; run the export without --resume first",
            options.device.display()
        )));
    }
    let file_options = FileOptions {
        block_size_bytes: options.block_size_bytes,
        ..FileOptions::default()
    };
    let device = Arc::new(FileDevice::open(&options.device, &file_options)?);
    let io = DeviceIo::open(device.clone() as Arc<dyn Device>, 4, 16 << 20)?;
    let loaded = load_export(&io)?;
    let header = loaded.header;
    let recorded: serde_json::Value = serde_json::from_str(&header.description).unwrap_or_default();
    let sort = recorded["sort"].as_str().unwrap_or_default().to_string();
    let split_field = recorded["slice_field"].as_str().map(String::from);
    let wanted = description(client, &options.spec, &sort, &split_field);
    if wanted != header.description {
        return Err(Error::Config(format!(
            "--resume: {} holds an export of {}; this run asks for {}; resume with the same source, index, query and _source filters, or start a new export without --resume",
            options.device.display(),
            header.description,
            wanted
        )));
    }
    if header.state == ExportState::Complete {
        log::info!(
            "{} already holds a complete export ({} documents); nothing to resume",
            options.device.display(),
            header.total_docs
        );
    }
    if header.cursor_kind == CursorKind::Scroll
        && loaded
            .slices
            .iter()
            .any(|s| s.checkpoint.state != SliceState::Done)
    {
        return Err(Error::Config(
            "--resume: this export used --api scroll, and a scroll cannot be resumed exactly (the source's position runs ahead of what was written); start it again, or use the default point-in-time cursor, which resumes".into(),
        ));
    }
    let used: Vec<u64> = loaded
        .slices
        .iter()
        .flat_map(|s| s.extents.iter().copied())
        .collect();
    let allocator = ExtentAllocator::new(header.extent_capacity, used);
    let pit = match header.cursor_kind {
        CursorKind::Scroll => None,
        CursorKind::Pit => {
            let recorded = loaded.slices.iter().find_map(|s| {
                match CursorState::parse(&s.checkpoint.cursor).ok()? {
                    CursorState::Pit { pit_id, .. } => Some(pit_id),
                    CursorState::Scroll { .. } => None,
                }
            });
            let engine = Engine::detect(client)?;
            Some(match recorded {
                Some(id) => SharedPit::adopt(engine, id, &options.spec),
                None => SharedPit::open(client, engine, &options.spec)?,
            })
        }
    };
    let current_manifests = loaded
        .slices
        .iter()
        .map(|s| s.current_manifest.clone())
        .collect();
    let checkpoints: Vec<Checkpoint> = loaded.slices.into_iter().map(|s| s.checkpoint).collect();
    log::info!(
        "resuming the export on {}: {} of {} slices done, {} documents durable",
        options.device.display(),
        checkpoints
            .iter()
            .filter(|c| c.state == SliceState::Done)
            .count(),
        checkpoints.len(),
        checkpoints.iter().map(|c| c.docs).sum::<u64>()
    );
    let summary = {
        let sources = cursor_factory(
            client,
            &options.spec,
            pit.as_ref(),
            &sort,
            (
                header.slice_count,
                header.page_docs,
                options.page_bytes,
                crate::source::FIRST_PAGE_DOCS,
            ),
            &split_field,
        );
        write_slices(
            device as Arc<dyn Device>,
            header,
            checkpoints,
            current_manifests,
            allocator,
            &sources,
            &WriteSettings::from_options(options, None),
            start,
        )
    };
    finish_source(client, pit, sort, start, summary)
}

/// Shared by all slice tasks of one export.
struct Shared<'a, 's> {
    header: &'a Header,
    device: Arc<dyn Device>,
    allocator: &'a ExtentAllocator,
    sources: &'a SourceFactory<'s>,
    stop: AtomicBool,
    throttle: Option<Throttle>,
    counters: Arc<Vec<Counter>>,
    first_error: Mutex<Option<Error>>,
    watch: Option<Arc<ExportWatch>>,
    checkpoint_interval: Duration,
}

impl Shared<'_, '_> {
    /// Whether the tasks should stop: a failure, or the caller's interrupt
    /// (recorded as the export's error).
    fn stopping(&self) -> bool {
        if self.stop.load(Ordering::Relaxed) {
            return true;
        }
        if self
            .watch
            .as_ref()
            .is_some_and(|w| w.interrupt.load(Ordering::Relaxed))
        {
            self.fail(Error::Interrupted);
            return true;
        }
        false
    }

    fn fail(&self, e: Error) {
        self.stop.store(true, Ordering::Relaxed);
        let mut first = self.first_error.lock().expect("error lock");
        if first.is_none() {
            *first = Some(e);
        }
    }
}

/// Runs one task per unfinished slice to the end, then marks the export
/// complete.
#[allow(clippy::too_many_arguments)]
fn write_slices(
    device: Arc<dyn Device>,
    header: Header,
    checkpoints: Vec<Checkpoint>,
    current_manifests: Vec<Option<ManifestBlock>>,
    allocator: ExtentAllocator,
    sources: &SourceFactory<'_>,
    settings: &WriteSettings,
    start: Instant,
) -> Result<ExportSummary> {
    let counters: Arc<Vec<Counter>> = Arc::new(
        (0..header.slice_count)
            .map(|_| Counter::default())
            .collect(),
    );
    let docs_before: u64 = checkpoints.iter().map(|c| c.docs).sum();
    let bytes_before: u64 = checkpoints.iter().map(|c| c.bytes).sum();
    for (c, counter) in checkpoints.iter().zip(counters.iter()) {
        counter
            .done
            .store(c.state == SliceState::Done, Ordering::Relaxed);
    }
    let shared = Shared {
        header: &header,
        device: device.clone(),
        allocator: &allocator,
        sources,
        stop: AtomicBool::new(false),
        throttle: settings.throttle_docs_per_s.map(Throttle::new),
        counters: counters.clone(),
        first_error: Mutex::new(None),
        watch: settings.watch.clone(),
        checkpoint_interval: settings.checkpoint_interval,
    };
    if let Some(w) = &settings.watch {
        w.docs.store(docs_before, Ordering::Relaxed);
        if let Some(t) = settings.total_docs {
            w.total_docs.store(t, Ordering::Relaxed);
        }
    }
    let reporter = Reporter::start(
        settings.progress,
        "export",
        counters.clone(),
        settings.total_docs.map(|t| t.saturating_sub(docs_before)),
        settings.progress_interval,
    );
    let mut manifests = current_manifests;
    manifests.resize(checkpoints.len(), None);
    let finals: Vec<Option<Checkpoint>> = std::thread::scope(|scope| {
        let handles: Vec<_> = checkpoints
            .into_iter()
            .zip(manifests)
            .map(|(ckpt, manifest)| {
                let shared = &shared;
                std::thread::Builder::new()
                    .name(format!("slice-{}", ckpt.slice))
                    .spawn_scoped(scope, move || run_slice(shared, ckpt, manifest))
                    .expect("spawn slice task")
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("slice task panicked"))
            .collect()
    });
    reporter.finish();
    if let Some(e) = shared.first_error.lock().expect("error lock").take() {
        return Err(e);
    }
    let finals: Vec<Checkpoint> = finals
        .into_iter()
        .map(|c| c.expect("no error, a checkpoint"))
        .collect();
    let io = DeviceIo::open(device, 4, 16 << 20)?;
    let mut done = header.clone();
    done.state = ExportState::Complete;
    done.generation += 1;
    done.total_docs = finals.iter().map(|c| c.docs).sum();
    done.total_pages = finals.iter().map(|c| c.pages).sum();
    done.total_bytes = finals.iter().map(|c| c.bytes).sum();
    let mut block = vec![0u8; header.block_size_bytes as usize];
    done.encode(&mut block)?;
    io.write(done.generation & 1, &block)?;
    io.flush()?;
    let used_extents = allocator.high_water();
    Ok(ExportSummary {
        docs: done.total_docs,
        pages: done.total_pages,
        bytes: done.total_bytes,
        slices: finals
            .iter()
            .map(|c| SliceSummary {
                docs: c.docs,
                pages: c.pages,
            })
            .collect(),
        elapsed: start.elapsed(),
        docs_this_run: done.total_docs - docs_before,
        bytes_this_run: done.total_bytes - bytes_before,
        sort: String::new(),
        pit_reopens: 0,
        page_refusals: 0,
        device_bytes_used: (header.data_lba + used_extents * header.extent_blocks())
            * header.block_size_bytes as u64,
    })
}

/// Why a slice's writer stopped before its source ended.
#[derive(Debug, PartialEq, Eq)]
enum Stopped {
    /// Its own write failed: nothing more goes to the device.
    Here,
    /// Another slice failed, or the caller interrupted the export.
    Elsewhere,
}

/// One slice: a fetcher thread pulls pages into a channel of one, this
/// thread writes them, so the next fetch overlaps the current write.
fn run_slice(
    shared: &Shared<'_, '_>,
    ckpt: Checkpoint,
    manifest: Option<ManifestBlock>,
) -> Option<Checkpoint> {
    let slice = ckpt.slice;
    if ckpt.state == SliceState::Done {
        return Some(ckpt);
    }
    let cursor = ckpt.cursor.clone();
    let mut writer = match SliceWriter::new(shared, ckpt, manifest) {
        Ok(w) => w,
        Err(e) => {
            shared.fail(e);
            return None;
        }
    };
    let target = writer.page_target();
    let (tx, rx) = crossbeam_channel::bounded(1);
    let outcome = std::thread::scope(|scope| {
        // Owned here, so that a writer that stops early drops it and a
        // fetcher blocked on a full channel gets an error instead of waiting
        // for the scope forever.
        let rx = rx;
        std::thread::Builder::new()
            .name(format!("fetch-{slice}"))
            .spawn_scoped(scope, move || {
                fetch_slice(shared, slice, &cursor, target, tx)
            })
            .expect("spawn fetcher");
        for page in rx.iter() {
            if shared.stopping() {
                return Err(Stopped::Elsewhere);
            }
            if let Err(e) = writer.write_page(page) {
                shared.fail(e);
                return Err(Stopped::Here);
            }
        }
        Ok(())
    });
    if outcome.is_err() || shared.stopping() {
        // What this slice wrote is kept for `--resume` unless its own
        // writes failed.
        if outcome != Err(Stopped::Here) && writer.pages_not_checkpointed > 0 {
            if let Err(e) = writer.checkpoint_durable() {
                log::warn!("slice {slice}: its last pages could not be checkpointed: {e}");
            }
        }
        return None;
    }
    match writer.finish() {
        Ok(c) => {
            shared.counters[slice as usize]
                .done
                .store(true, Ordering::Relaxed);
            Some(c)
        }
        Err(e) => {
            shared.fail(e);
            None
        }
    }
}

/// The fetcher of one slice: pages from its source into the channel until
/// the source ends, the writer stops or another slice fails.
fn fetch_slice(
    shared: &Shared<'_, '_>,
    slice: u32,
    cursor: &str,
    target: PageTarget,
    tx: crossbeam_channel::Sender<FetchedPage>,
) {
    let mut source = match (shared.sources)(slice, cursor) {
        Ok(s) => s,
        Err(e) => return shared.fail(e),
    };
    source.build_pages_in(target);
    loop {
        if shared.stopping() {
            break;
        }
        match source.next_page() {
            Ok(Some(page)) => {
                if let Some(t) = &shared.throttle {
                    t.take(page.docs as u64);
                }
                if tx.send(page).is_err() {
                    break;
                }
            }
            Ok(None) => break,
            Err(e) => {
                shared.fail(e);
                break;
            }
        }
    }
    source.close();
}

struct SliceWriter<'s, 'a, 'f> {
    shared: &'s Shared<'a, 'f>,
    /// This slice's own engine: its pool holds the pages the fetcher
    /// builds, so the writes go from where the pages lie.
    engine: Box<dyn sluice_io::Engine>,
    durable: DurableWrites,
    /// The state after the last page written; `checkpoint_durable` makes
    /// it the device's.
    ckpt: Checkpoint,
    manifest: Option<ManifestBlock>,
    block: Vec<u8>,
    /// Pages written since the checkpoint last went to the device.
    pages_not_checkpointed: u64,
    last_checkpoint: Instant,
}

impl<'s, 'a, 'f> SliceWriter<'s, 'a, 'f> {
    fn new(
        shared: &'s Shared<'a, 'f>,
        ckpt: Checkpoint,
        manifest: Option<ManifestBlock>,
    ) -> Result<Self> {
        let h = shared.header;
        let extent_bytes = h.extent_blocks() * h.block_size_bytes as u64;
        let engine = writer_engine(
            shared.device.clone(),
            2 * extent_bytes + (16 << 20),
            h.slot_bytes(),
        )?;
        Ok(SliceWriter {
            shared,
            engine,
            durable: DurableWrites::from_env(),
            block: vec![0u8; shared.header.block_size_bytes as usize],
            ckpt,
            manifest,
            pages_not_checkpointed: 0,
            last_checkpoint: Instant::now(),
        })
    }

    /// Where the fetcher builds pages: this writer's pinned buffers.
    fn page_target(&self) -> PageTarget {
        PageTarget::new(
            self.engine.pool().clone(),
            self.shared.header.block_size_bytes as usize,
        )
    }

    /// Page and manifest block, written together (one submission); once
    /// the checkpoint interval has passed since the last checkpoint, a
    /// durable checkpoint that counts them (`checkpoint_durable`).
    fn write_page(&mut self, page: FetchedPage) -> Result<()> {
        debug_assert_eq!(page.crc32c, crc32c::crc32c(&page.bytes), "the page's CRC");
        let h = self.shared.header;
        let slot_bytes = h.slot_bytes();
        let slots = (page.bytes.len() as u64).div_ceil(slot_bytes).max(1);
        if slots > h.extent_slots as u64 {
            return Err(Error::Config(format!(
                "page {} of slice {} is {} bytes (its largest document {} bytes), more than one extent ({} bytes); export again with a smaller --page-mib or a larger --slot-bytes",
                self.ckpt.pages,
                self.ckpt.slice,
                page.bytes.len(),
                page.max_hit_bytes,
                h.extent_slots as u64 * slot_bytes
            )));
        }
        let slots = slots as u32;
        if self.ckpt.current_extent == NO_EXTENT || self.ckpt.next_slot + slots > h.extent_slots {
            let extent = self.shared.allocator.take().ok_or_else(|| {
                Error::Incomplete(format!(
                    "the device is full after {} pages of slice {}: the index holds more than its sample promised; the export stays in progress (not complete); export again onto a larger device",
                    self.ckpt.pages, self.ckpt.slice
                ))
            })?;
            self.manifest = Some(ManifestBlock {
                extent,
                owner_slice: self.ckpt.slice,
                prev_extent: self.ckpt.current_extent,
                entries: Vec::new(),
            });
            self.ckpt.current_extent = extent;
            self.ckpt.next_slot = 0;
        }
        let extent = self.ckpt.current_extent;
        let lba = h.slot_lba(extent, self.ckpt.next_slot);
        let manifest = self
            .manifest
            .as_mut()
            .expect("current extent has a manifest");
        debug_assert_eq!(manifest.extent, extent);
        manifest.entries.push(PageEntry {
            slice: self.ckpt.slice,
            seq: u32::try_from(self.ckpt.pages).map_err(|_| {
                Error::Config("a slice has more than 2^32 pages; raise --page-docs".into())
            })?,
            lba,
            byte_len: page.bytes.len() as u32,
            doc_count: page.docs,
            crc32c: page.crc32c,
            slots,
        });
        manifest.encode(&mut self.block);
        let page_bytes = page.bytes.len() as u64;
        self.write_page_and_manifest(lba, page.bytes, h.manifest_block_lba(extent))?;
        self.ckpt.state = SliceState::Running;
        self.ckpt.pages += 1;
        self.ckpt.docs += page.docs as u64;
        self.ckpt.bytes += page_bytes;
        self.ckpt.next_slot += slots;
        self.ckpt.cursor = page.cursor_after;
        self.pages_not_checkpointed += 1;
        if self.last_checkpoint.elapsed() >= self.shared.checkpoint_interval {
            self.checkpoint_durable()?;
        }
        self.shared.counters[self.ckpt.slice as usize].add(page.docs as u64, page_bytes);
        if let Some(w) = &self.shared.watch {
            w.docs.fetch_add(page.docs as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The page padded with spaces to whole blocks at `lba` and the
    /// manifest block at `manifest_lba`, made durable together: a pinned
    /// page is written from where it was built, a heap page copied into
    /// pinned buffers on the way.
    fn write_page_and_manifest(
        &mut self,
        lba: u64,
        bytes: PageBytes,
        manifest_lba: u64,
    ) -> Result<()> {
        // With no interval, each page is made durable with its own
        // submission, and the checkpoint that follows needs no flush.
        let durable = self
            .shared
            .checkpoint_interval
            .is_zero()
            .then_some(self.durable);
        let engine = &mut *self.engine;
        match bytes {
            PageBytes::Pinned { buf, .. } => {
                let mut block = engine
                    .pool()
                    .alloc(self.block.len(), sluice_io::Direction::Write)?;
                block.write_at(0, &self.block);
                let writes = vec![(lba, buf), (manifest_lba, block)];
                sluice_io::write_bufs_on(engine, writes, Priority::High, durable)?;
            }
            heap => {
                let bs = self.block.len();
                let padded = heap.len().div_ceil(bs).max(1) * bs;
                let runs = [
                    (lba, &heap[..], padded),
                    (manifest_lba, &self.block[..], bs),
                ];
                sluice_io::write_runs_on(engine, &runs, b' ', Priority::High, durable)?;
                heap.recycle();
            }
        }
        Ok(())
    }

    /// Makes every page written so far durable (one device flush, unless
    /// each page already was), then writes the checkpoint that counts them,
    /// durable: when it is, so is everything it counts.
    fn checkpoint_durable(&mut self) -> Result<()> {
        if self.pages_not_checkpointed > 0 && !self.shared.checkpoint_interval.is_zero() {
            let durable = Some(self.durable);
            sluice_io::write_runs_on(&mut *self.engine, &[], 0, Priority::High, durable)?;
        }
        self.write_checkpoint()?;
        self.pages_not_checkpointed = 0;
        self.last_checkpoint = Instant::now();
        Ok(())
    }

    fn write_checkpoint(&mut self) -> Result<()> {
        self.ckpt.generation += 1;
        self.ckpt.encode(&mut self.block)?;
        let lba = Header::checkpoint_lba(self.ckpt.slice, self.ckpt.generation);
        let runs = [(lba, &self.block[..], self.block.len())];
        let durable = Some(self.durable);
        sluice_io::write_runs_on(&mut *self.engine, &runs, 0, Priority::High, durable)?;
        Ok(())
    }

    fn finish(mut self) -> Result<Checkpoint> {
        self.ckpt.state = SliceState::Done;
        self.checkpoint_durable()?;
        Ok(self.ckpt)
    }
}

/// Hands out documents per second over all slices.
struct Throttle {
    docs_per_s: f64,
    state: Mutex<(Instant, u64)>,
}

impl Throttle {
    fn new(docs_per_s: f64) -> Self {
        Throttle {
            docs_per_s: docs_per_s.max(1e-3),
            state: Mutex::new((Instant::now(), 0)),
        }
    }

    fn take(&self, docs: u64) {
        let due = {
            let mut s = self.state.lock().expect("throttle lock");
            s.1 += docs;
            s.0 + Duration::from_secs_f64(s.1 as f64 / self.docs_per_s)
        };
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(docs: u64, mean: f64) -> IndexInfo {
        IndexInfo {
            primary_shards: 4,
            doc_count: docs,
            mean_hit_bytes: mean,
        }
    }

    #[test]
    fn plan_sizes_slots_from_the_sample_and_counts_every_region() {
        let options = ExportOptions::default();
        let p = plan(&options, &info(1_000_000, 1580.0)).unwrap();
        assert_eq!(p.slices, 4);
        // 2048 × 1580 × 1.15 bytes, in 4 KiB blocks.
        assert_eq!(
            p.slot_blocks,
            ((2048.0 * 1580.0 * 1.15) as u64 + 64).div_ceil(4096) as u32
        );
        let data = 1_000_000.0 * 1580.0;
        assert!(p.needed_bytes as f64 > data * 1.15);
        assert!((p.needed_bytes as f64) < data * 1.15 + 4.0 * 16.0 * 4.0 * 1e6 + 1e8);
    }

    #[test]
    fn plan_refuses_page_sizes_the_engine_refuses() {
        let mut options = ExportOptions {
            page_docs: 20_000,
            ..ExportOptions::default()
        };
        assert!(plan(&options, &info(10, 100.0)).is_err());
        options.page_docs = 100;
        options.slices = Some(0);
        assert!(plan(&options, &info(10, 100.0)).is_err());
    }

    #[test]
    fn an_empty_index_still_gets_a_layout() {
        let p = plan(&ExportOptions::default(), &info(0, 0.0)).unwrap();
        assert_eq!(p.slot_blocks, 1);
        assert!(p.needed_extents >= 4);
    }

    #[test]
    fn generated_pages_go_through_the_writer_and_read_back_in_order() {
        use crate::read::{read_export, ReadOptions};
        use crate::sinks::CountSink;
        use crate::synthetic::{page_bytes, PaperPages};
        let dir = tempfile::tempdir().unwrap();
        let page_docs = 16;
        let slot_blocks = page_bytes(page_docs).div_ceil(4096) as u32;
        let device: Arc<dyn Device> = Arc::new(
            FileDevice::create(&dir.path().join("x.dev"), 8 << 20, &FileOptions::default())
                .unwrap(),
        );
        let layout = Layout {
            slices: 3,
            page_docs,
            slot_blocks,
            extent_slots: 2,
            cursor_kind: CursorKind::Pit,
            description: "{\"generated\":true}".into(),
        };
        let total_pages = 11;
        let sources = |slice: u32, cursor: &str| -> Result<Box<dyn PageSource>> {
            Ok(Box::new(PaperPages::for_slice(
                5,
                page_docs,
                total_pages,
                slice,
                3,
                cursor,
            )?))
        };
        let summary =
            write_new_export(device.clone(), &layout, &sources, &WriteSettings::default()).unwrap();
        assert_eq!(summary.pages, total_pages);
        assert_eq!(summary.docs, total_pages * page_docs as u64);
        assert_eq!(
            summary.slices.iter().map(|s| s.pages).collect::<Vec<_>>(),
            [4, 4, 3]
        );
        let (read, sinks) =
            read_export(device, &ReadOptions::default(), |_| CountSink::default()).unwrap();
        assert_eq!(read.docs, summary.docs);
        assert_eq!(read.bytes, total_pages * page_bytes(page_docs) as u64);
        assert_eq!(sinks.iter().map(|s| s.docs).sum::<u64>(), summary.docs);
    }

    /// A device that loses power at its n-th write: what was not flushed
    /// is dropped or torn, and every I/O after that fails, as a machine
    /// without power does nothing more; `revive` powers it on again. One
    /// I/O at a time, so none lands after the cut.
    #[derive(Debug)]
    struct DyingDevice {
        inner: sluice_io::MemoryDevice,
        /// Writes before the cut; below zero once the power is off.
        writes_left: Mutex<i64>,
        cut: sluice_io::PowerCutMode,
    }

    impl DyingDevice {
        fn powered<T>(
            &self,
            lba: u64,
            is_write: bool,
            io: impl FnOnce() -> sluice_io::Result<T>,
        ) -> sluice_io::Result<T> {
            let mut left = self.writes_left.lock().unwrap();
            if is_write && *left == 0 {
                self.inner.power_cut(self.cut);
                *left = -1;
            } else if is_write && *left > 0 {
                *left -= 1;
            }
            if *left < 0 {
                return Err(sluice_io::IoError::Media {
                    lba,
                    reason: "the power is off".into(),
                });
            }
            io()
        }

        fn revive(&self) {
            *self.writes_left.lock().unwrap() = i64::MAX;
        }
    }

    impl Device for DyingDevice {
        fn geometry(&self) -> Geometry {
            self.inner.geometry()
        }
        fn read_at(&self, lba: u64, buf: &mut [u8]) -> sluice_io::Result<()> {
            self.powered(lba, false, || self.inner.read_at(lba, buf))
        }
        fn write_at(&self, lba: u64, buf: &[u8]) -> sluice_io::Result<()> {
            self.powered(lba, true, || self.inner.write_at(lba, buf))
        }
        fn flush(&self) -> sluice_io::Result<()> {
            self.powered(0, false, || self.inner.flush())
        }
        fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
            None
        }
        fn is_direct(&self) -> bool {
            false
        }
        fn describe(&self) -> String {
            "a memory device that loses power".into()
        }
    }

    /// Pages a millisecond apart, so that checkpoint intervals of a few
    /// milliseconds pass now and then.
    struct SlowPages(crate::synthetic::PaperPages);

    impl PageSource for SlowPages {
        fn next_page(&mut self) -> Result<Option<FetchedPage>> {
            std::thread::sleep(Duration::from_millis(1));
            self.0.next_page()
        }
    }

    /// Every document id of a complete export, in read order per slice.
    fn exported_ids(device: Arc<dyn Device>) -> Vec<String> {
        use crate::read::{read_export, Hit, PageInfo, ReadOptions, Sink};
        #[derive(Default)]
        struct Ids(Vec<String>);
        impl Sink for Ids {
            fn page(&mut self, _page: &PageInfo, hits: &[Hit<'_>]) -> Result<()> {
                self.0.extend(hits.iter().map(|h| h.id.to_string()));
                Ok(())
            }
        }
        let (_, sinks) = read_export(device, &ReadOptions::default(), |_| Ids::default()).unwrap();
        let mut ids: Vec<String> = sinks.into_iter().flat_map(|s| s.0).collect();
        ids.sort();
        ids
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// A power cut at any write, whatever the checkpoint interval:
        /// every page a durable checkpoint counts reads back with its
        /// CRC, and `--resume` ends with every document exactly once.
        #[test]
        fn a_power_cut_loses_nothing_a_checkpoint_counted(
            cut_at_write in 0i64..WRITES_OF_A_WHOLE_EXPORT,
            interval_ms in proptest::sample::select(vec![0u64, 2, 3_600_000]),
            torn in proptest::bool::ANY,
        ) {
            use crate::synthetic::{page_bytes, PaperPages};
            let page_docs = 4;
            let slot_blocks = page_bytes(page_docs).div_ceil(4096) as u32;
            let cut = if torn {
                sluice_io::PowerCutMode::TornSectors { seed: cut_at_write as u64 }
            } else {
                sluice_io::PowerCutMode::DropUnflushed
            };
            let dying = Arc::new(DyingDevice {
                inner: sluice_io::MemoryDevice::new(4096, 2048),
                writes_left: Mutex::new(cut_at_write),
                cut,
            });
            let device: Arc<dyn Device> = dying.clone();
            let layout = Layout {
                slices: 3,
                page_docs,
                slot_blocks,
                extent_slots: 3,
                cursor_kind: CursorKind::Pit,
                description: "{\"generated\":true}".into(),
            };
            let total_pages = 20;
            let sources = |slice: u32, cursor: &str| -> Result<Box<dyn PageSource>> {
                let pages = PaperPages::for_slice(9, page_docs, total_pages, slice, 3, cursor)?;
                Ok(Box::new(SlowPages(pages)))
            };
            let settings = WriteSettings {
                checkpoint_interval: Duration::from_millis(interval_ms),
                ..WriteSettings::default()
            };
            let first = write_new_export(device.clone(), &layout, &sources, &settings);
            dying.revive();
            let io = DeviceIo::open(device.clone(), 4, 16 << 20).unwrap();
            if crate::layout::load_header(&io).is_err() {
                // The cut came before the header was durable: nothing was
                // counted, and the export must start again.
                proptest::prop_assert!(first.is_err());
                return Ok(());
            }
            let loaded = crate::layout::load_export(&io).unwrap();
            if first.is_ok() {
                proptest::prop_assert_eq!(loaded.header.state, ExportState::Complete);
            }
            for slice in &loaded.slices {
                for page in &slice.pages {
                    let bytes = io
                        .read(page.lba, page.slots as usize * slot_blocks as usize * 4096)
                        .unwrap();
                    let bytes = &bytes[..page.byte_len as usize];
                    proptest::prop_assert_eq!(crc32c::crc32c(bytes), page.crc32c);
                    proptest::prop_assert_eq!(
                        bytes,
                        &PaperPages::page(9, page_docs, slice_first_page(slice, total_pages) + page.seq as u64)[..]
                    );
                }
            }
            // --resume: the loaded checkpoints, their manifests, the same sources.
            let used = loaded.slices.iter().flat_map(|s| s.extents.iter().copied()).collect();
            let allocator = ExtentAllocator::new(loaded.header.extent_capacity, used);
            let manifests = loaded.slices.iter().map(|s| s.current_manifest.clone()).collect();
            let checkpoints = loaded.slices.into_iter().map(|s| s.checkpoint).collect();
            let summary = write_slices(
                device.clone(),
                loaded.header,
                checkpoints,
                manifests,
                allocator,
                &sources,
                &settings,
                Instant::now(),
            )
            .unwrap();
            proptest::prop_assert_eq!(summary.pages, total_pages);
            let expected: Vec<String> =
                (0..total_pages * page_docs as u64).map(|id| format!("{id:010}")).collect();
            proptest::prop_assert_eq!(exported_ids(device), expected);
        }
    }

    /// Pages until the `stop_after`-th, then the export's interrupt.
    struct InterruptingPages {
        pages: crate::synthetic::PaperPages,
        watch: Arc<ExportWatch>,
        stop_after: Arc<AtomicU64>,
    }

    impl PageSource for InterruptingPages {
        fn next_page(&mut self) -> Result<Option<FetchedPage>> {
            if self.stop_after.fetch_sub(1, Ordering::SeqCst) == 1 {
                self.watch.interrupt.store(true, Ordering::SeqCst);
            }
            self.pages.next_page()
        }
    }

    #[test]
    fn an_interrupted_export_checkpoints_every_page_it_wrote() {
        use crate::synthetic::{page_bytes, PaperPages};
        let dir = tempfile::tempdir().unwrap();
        let page_docs = 8;
        let device: Arc<dyn Device> = Arc::new(
            FileDevice::create(&dir.path().join("x.dev"), 16 << 20, &FileOptions::default())
                .unwrap(),
        );
        let layout = Layout {
            slices: 2,
            page_docs,
            slot_blocks: page_bytes(page_docs).div_ceil(4096) as u32,
            extent_slots: 4,
            cursor_kind: CursorKind::Pit,
            description: "{\"generated\":true}".into(),
        };
        let watch = Arc::new(ExportWatch::default());
        let stop_after = Arc::new(AtomicU64::new(9));
        let sources = |slice: u32, cursor: &str| -> Result<Box<dyn PageSource>> {
            Ok(Box::new(InterruptingPages {
                pages: PaperPages::for_slice(4, page_docs, 40, slice, 2, cursor)?,
                watch: watch.clone(),
                stop_after: stop_after.clone(),
            }))
        };
        let settings = WriteSettings {
            // No checkpoint falls due: only stopping makes the pages count.
            checkpoint_interval: Duration::from_secs(3600),
            watch: Some(watch.clone()),
            ..WriteSettings::default()
        };
        let err = write_new_export(device.clone(), &layout, &sources, &settings).unwrap_err();
        assert!(matches!(err, Error::Interrupted), "{err}");
        let written = watch.docs.load(Ordering::SeqCst);
        assert!(written > 0, "no page was written before the interrupt");
        let io = DeviceIo::open(device, 2, 16 << 20).unwrap();
        let loaded = load_export(&io).unwrap();
        let durable: u64 = loaded.slices.iter().map(|s| s.checkpoint.docs).sum();
        assert_eq!(
            durable, written,
            "pages written but not counted by a checkpoint"
        );
    }

    /// A little more than the device writes of the whole export of the
    /// power-cut test (headers, checkpoints, pages and manifest blocks: 73
    /// with a checkpoint per page), so that some runs end before the cut.
    const WRITES_OF_A_WHOLE_EXPORT: i64 = 76;

    /// The data set's page number of a slice's first page.
    fn slice_first_page(slice: &crate::layout::LoadedSlice, total_pages: u64) -> u64 {
        slice.checkpoint.slice as u64 * total_pages.div_ceil(3)
    }

    #[test]
    fn throttle_spaces_documents_out() {
        let t = Throttle::new(1000.0);
        let start = Instant::now();
        for _ in 0..5 {
            t.take(20);
        }
        assert!(start.elapsed() >= Duration::from_millis(95));
    }
}
