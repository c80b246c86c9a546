//! The slice tasks of an export: each pulls pages from its source on a
//! fetcher thread and writes them with its own engine, checkpointing once a
//! second and at its end; all of them share one [`Shared`].

use crate::device::writer_engine;
use crate::error::{Error, Result};
use crate::format::{Checkpoint, Header, ManifestBlock, PageEntry, SliceState, NO_EXTENT};
use crate::layout::ExtentAllocator;
use crate::page::{PageBytes, PageTarget};
use crate::progress::Counter;
use sluice_io::{Device, DurableWrites, Priority};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::source::{ExportWatch, FetchedPage, SourceFactory};

/// Shared by all slice tasks of one export.
pub(super) struct Shared<'a, 's> {
    pub(super) header: &'a Header,
    pub(super) device: Arc<dyn Device>,
    pub(super) allocator: &'a ExtentAllocator,
    pub(super) sources: &'a SourceFactory<'s>,
    pub(super) stop: AtomicBool,
    pub(super) throttle: Option<Throttle>,
    pub(super) counters: Arc<Vec<Counter>>,
    pub(super) first_error: Mutex<Option<Error>>,
    pub(super) watch: Option<Arc<ExportWatch>>,
    pub(super) checkpoint_interval: Duration,
}

impl Shared<'_, '_> {
    /// Whether the tasks should stop: a failure, or the caller's interrupt
    /// (recorded as the export's error).
    pub(super) fn stopping(&self) -> bool {
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

    pub(super) fn fail(&self, e: Error) {
        self.stop.store(true, Ordering::Relaxed);
        let mut first = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() {
            *first = Some(e);
        }
    }
}

/// Why a slice's writer stopped before its source ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Stopped {
    /// Its own write failed: nothing more goes to the device.
    Here,
    /// Another slice failed, or the caller interrupted the export.
    Elsewhere,
}

/// One slice: a fetcher thread pulls pages into a channel of one, this
/// thread writes them, so the next fetch overlaps the current write.
#[expect(clippy::expect_used, reason = "each expect states its invariant")]
pub(super) fn run_slice(
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
    pub(super) fn new(
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
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: current extent has a manifest"
    )]
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
pub(super) struct Throttle {
    docs_per_s: f64,
    state: Mutex<(Instant, u64)>,
}

impl Throttle {
    pub(super) fn new(docs_per_s: f64) -> Self {
        Throttle {
            docs_per_s: docs_per_s.max(1e-3),
            state: Mutex::new((Instant::now(), 0)),
        }
    }

    pub(super) fn take(&self, docs: u64) {
        let due = {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            s.1 += docs;
            s.0 + Duration::from_secs_f64(s.1 as f64 / self.docs_per_s)
        };
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
    }
}
