//! `sluice export`: a search index's slices pulled through point-in-time
//! (or scroll) cursors and handed to the export device's writer
//! ([`sluice_pages::write`]), which puts each page at the LBA its slice's
//! extents give; `--resume` goes on from the slices' checkpoints. Layout in
//! docs/FORMAT.md ("Export device").

use crate::http::Client;
use crate::source::{
    index_counts, pick_sort, sample_hit_bytes, slice_field, CursorState, Engine, IndexInfo,
    SharedPit, SliceCursor, SourceSpec,
};
use sluice_io::{Device, FileDevice, FileOptions};
use sluice_pages::device::DeviceIo;
use sluice_pages::error::{Error, Result};
use sluice_pages::format::{max_extent_slots, CursorKind, ExportState, SliceState, MAX_SLICES};
use sluice_pages::layout::load_export;
use sluice_pages::page::PageTarget;
use sluice_pages::progress::ProgressMode;
use sluice_pages::write::{
    continue_export, write_new_export, ExportSummary, ExportWatch, FetchedPage, Layout, PageSource,
    WriteSettings, DEFAULT_CHECKPOINT_INTERVAL,
};
use std::path::PathBuf;
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
/// How an export's pages are written, from its options.
fn write_settings(options: &ExportOptions, total_docs: Option<u64>) -> WriteSettings {
    {
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
            &write_settings(options, Some(doc_count)),
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
                #[expect(clippy::expect_used, reason = "a thread is refused only when the process is out of resources, where the export cannot go on")]
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
    let header = loaded.header.clone();
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
    let checkpoints: Vec<&sluice_pages::format::Checkpoint> =
        loaded.slices.iter().map(|s| &s.checkpoint).collect();
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
        continue_export(
            device as Arc<dyn Device>,
            loaded,
            &sources,
            &write_settings(options, None),
            start,
        )
    };
    finish_source(client, pit, sort, start, summary)
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
}
