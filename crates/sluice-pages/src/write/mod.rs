//! The writer of an export device: one task per slice pulls pages from its
//! [`PageSource`] and writes each with direct I/O at the LBA its slice's
//! extents give, then makes the slice's checkpoint durable. Where the pages
//! come from is the caller's (a search engine's cursors in sluice-paginate,
//! generated pages in [`crate::synthetic`]). Layout in docs/FORMAT.md
//! ("Export device").

mod slices;
mod source;

use crate::device::DeviceIo;
use crate::error::{Error, Result};
use crate::format::{
    max_extent_slots, Checkpoint, CursorKind, ExportState, Header, ManifestBlock, SliceState,
    MAX_SLICES,
};
use crate::layout::{ExtentAllocator, LoadedExport};
use crate::progress::{Counter, ProgressMode, Reporter};
use sluice_io::{Device, Geometry};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use slices::{run_slice, Shared, Throttle};
use source::now_unix_ms;
pub use source::{
    ExportSummary, ExportWatch, FetchedPage, PageSource, SliceSummary, SourceFactory,
    DEFAULT_CHECKPOINT_INTERVAL,
};

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
/// pages from `sources`: everything of an export that does not depend on
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
/// Goes on with the export `loaded` holds on `device` (`--resume`): its
/// unfinished slices continue after their checkpoints, pulling from
/// `sources`, into the extents it has not used; `start` is when the run
/// began (the summary's time counts from it).
pub fn continue_export(
    device: Arc<dyn Device>,
    loaded: LoadedExport,
    sources: &SourceFactory<'_>,
    settings: &WriteSettings,
    start: Instant,
) -> Result<ExportSummary> {
    let used: Vec<u64> = loaded
        .slices
        .iter()
        .flat_map(|s| s.extents.iter().copied())
        .collect();
    let allocator = ExtentAllocator::new(loaded.header.extent_capacity, used);
    let current_manifests = loaded
        .slices
        .iter()
        .map(|s| s.current_manifest.clone())
        .collect();
    let checkpoints: Vec<Checkpoint> = loaded.slices.into_iter().map(|s| s.checkpoint).collect();
    write_slices(
        device,
        loaded.header,
        checkpoints,
        current_manifests,
        allocator,
        sources,
        settings,
        start,
    )
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

/// Runs one task per unfinished slice to the end, then marks the export
/// complete.
#[allow(clippy::too_many_arguments)]
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: spawn slice task; slice task panicked; no error, a checkpoint"
)]
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
    if let Some(e) = shared
        .first_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
    {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::load_export;
    use sluice_io::{FileDevice, FileOptions};
    use std::sync::atomic::AtomicU64;
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
            let summary = continue_export(
                device.clone(),
                loaded,
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
