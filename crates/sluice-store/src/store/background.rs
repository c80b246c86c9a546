//! The compaction driver and the background thread that runs flushes and
//! compactions.

use super::flush::Placed;
use super::*;
use crate::compaction::Urge;

impl Store {
    /// Flushes the memtable and compacts until every keyspace's data sits
    /// in one level.
    pub fn compact(&self) -> Result<()> {
        self.flush()?;
        while self.inner.compact_once(Urge::Force)? {}
        // Log the frees of tables nobody reads any more.
        let frees = self.inner.take_released();
        if !frees.is_empty() {
            self.inner.log_group(&frees)?;
        }
        Ok(())
    }
}

impl Inner {
    /// Runs one compaction of those `urge` looks for, if any. Returns
    /// whether it did anything.
    pub(super) fn compact_once(&self, urge: Urge) -> Result<bool> {
        with_io_priority(Priority::Low, || self.compact_one(urge))
    }

    fn compact_one(&self, urge: Urge) -> Result<bool> {
        let inner = self;
        let _one = lock(&inner.compaction_lock);
        let version = read(&inner.version).clone();
        let cursor = inner.compaction_cursor.fetch_add(1, Ordering::Relaxed) as usize;
        let Some(job) = version.keyspaces.iter().find_map(|(ks, levels)| {
            compaction::pick(&inner.config.compaction, *ks, levels, cursor, urge)
        }) else {
            return Ok(false);
        };
        if compaction::is_trivial_move(&job) {
            self.move_down(&job)?;
            inner.compactions.fetch_add(1, Ordering::Relaxed);
            return Ok(true);
        }
        let snapshots: Vec<u64> = lock(&inner.snapshots.live).keys().copied().collect();
        let mut placed = Vec::new();
        // Values moved out of mostly-empty blob files: their new places
        // stay counted in flight until the outputs are installed.
        let sparse = self.sparse_blob_files(&version);
        let mut moved = Vec::new();
        let ran = compaction::run(
            &inner.dev,
            &job,
            &snapshots,
            inner.config.compaction.target_file_bytes,
            &|| self.table_room_bytes(),
            &inner.table_buffers,
            &mut |t| {
                placed.push(self.place(job.keyspace, t, false)?);
                Ok(())
            },
            &mut |key, reference| {
                self.relocate_blob(&sparse, job.keyspace, key, reference, &mut moved)
            },
        );
        if let Err(e) = ran {
            self.unplace(&placed.iter().flat_map(Placed::extents).collect::<Vec<_>>());
            return Err(e);
        }
        let names: BTreeMap<u32, String> = read(&inner.keyspaces)
            .values()
            .map(|k| (k.id, k.name.clone()))
            .collect();
        let removed: Vec<(u32, u64)> = job
            .inputs
            .iter()
            .chain(&job.next_inputs)
            .map(|t| (job.keyspace, t.meta.file_no))
            .collect();
        let released = self.take_released();
        let tables = self.install(placed, (job.level + 1) as u8, &names, &removed, released)?;
        {
            let mut v = write(&inner.version);
            let mut next = (**v).clone();
            let levels: &mut Levels = next.keyspaces.entry(job.keyspace).or_default();
            for (_, file_no) in &removed {
                levels.remove(*file_no);
            }
            for t in tables {
                levels.insert(t);
            }
            *v = Arc::new(next);
            inner.view_generation.fetch_add(1, Ordering::Release);
        }
        for t in job.inputs.iter().chain(&job.next_inputs) {
            t.mark_obsolete();
        }
        drop(moved);
        drop(job);
        drop(version);
        inner.compactions.fetch_add(1, Ordering::Relaxed);
        self.drop_unreferenced_blob_files_logged();
        Ok(true)
    }

    /// Moves the job's tables one level down without rewriting them: one
    /// manifest group re-adds each at its new level.
    fn move_down(&self, job: &compaction::Job) -> Result<()> {
        let level = (job.level + 1) as u8;
        let moved: Vec<Arc<Table>> = job
            .inputs
            .iter()
            .map(|t| Arc::new(t.moved_to(level)))
            .collect();
        let mut edits: Vec<Edit> = moved
            .iter()
            .map(|t| Edit::AddTable(t.meta.clone()))
            .collect();
        edits.extend(self.take_released());
        self.log_group(&edits)?;
        let mut v = write(&self.version);
        let mut next = (**v).clone();
        let levels: &mut Levels = next.keyspaces.entry(job.keyspace).or_default();
        for t in moved {
            levels.remove(t.meta.file_no);
            levels.insert(t);
        }
        *v = Arc::new(next);
        self.view_generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Whether writes may be refused for room (free space below the
    /// reserve, or a flush failing): writers then check their batch, and
    /// the background thread looks each second at what would bring room
    /// back.
    pub(super) fn short_of_room(&self) -> bool {
        self.space_low.load(Ordering::Acquire) || self.flush_failing.load(Ordering::Acquire)
    }

    /// Brings room back where it can: logs the frees of tables no reader
    /// holds any more, retries a failed flush, and, while free space is
    /// below the reserve and something changed since the last try (deletes
    /// came in, a table was let go), flushes the deletes and compacts, so
    /// that what they cover leaves the device.
    fn win_back_room(&self, reclaimed_at: &mut Option<u64>) {
        self.log_frees();
        if self.flush_failing.load(Ordering::Acquire) && self.flush().is_err() {
            // Said once by the flush; tried again in a second.
            return;
        }
        if !self.space_low.load(Ordering::Acquire) {
            return;
        }
        let generation = self.view_generation.load(Ordering::Acquire);
        let unflushed = self.active_bytes.load(Ordering::Relaxed) > 0;
        if *reclaimed_at == Some(generation) && !unflushed {
            return;
        }
        if unflushed && self.flush().is_err() {
            return;
        }
        loop {
            match self.compact_once(Urge::Reclaim) {
                Ok(true) if !self.shutdown.load(Ordering::Acquire) => {
                    self.log_frees();
                    if !self.space_low.load(Ordering::Acquire) {
                        break;
                    }
                }
                Ok(_) => break,
                Err(e) => {
                    log::warn!("compacting to win back room failed: {e}");
                    break;
                }
            }
        }
        self.log_frees();
        *reclaimed_at = Some(self.view_generation.load(Ordering::Acquire));
    }

    /// Logs the frees of tables no reader holds any more: their room is
    /// free once logged.
    fn log_frees(&self) {
        let frees = self.take_released();
        if !frees.is_empty() {
            if let Err(e) = self.log_group(&frees) {
                log::error!("logging the frees of released tables failed: {e}");
            }
        }
    }

    pub(super) fn wake_background(&self) {
        *lock(&self.wake_lock) = true;
        self.wake.notify_all();
    }
}

/// Memtable flushes and compactions, both at low I/O priority (yielding to
/// foreground reads and log writes; see [`Inner::flush`] and
/// [`Inner::compact_once`]), on the CPU as [`StoreConfig::background_cpu`]
/// says.
pub(super) fn background_loop(inner: &Arc<Inner>) {
    let cpu = inner.config.background_cpu;
    if let Err(e) = cpu.apply_to_this_thread() {
        log::warn!(
            "the store's background thread stays at normal CPU priority: setting {} failed: {e}",
            cpu.name()
        );
    }
    // The view generation of the last attempt to win back room: another
    // is made only once something changed.
    let mut reclaimed_at = None;
    loop {
        {
            let mut woken = lock(&inner.wake_lock);
            while !*woken && !inner.shutdown.load(Ordering::Acquire) {
                let (guard, waited) = inner
                    .wake
                    .wait_timeout(woken, std::time::Duration::from_secs(1))
                    .unwrap_or_else(|p| p.into_inner());
                woken = guard;
                if waited.timed_out() {
                    // A second with nothing to do: the memory kept for
                    // the next table goes back.
                    inner.table_buffers.release();
                    if inner.short_of_room() {
                        break;
                    }
                }
            }
            *woken = false;
        }
        if inner.shutdown.load(Ordering::Acquire) {
            break;
        }
        if inner.short_of_room() {
            inner.win_back_room(&mut reclaimed_at);
        }
        inner.free_retired_memtables();
        if inner.flush_requested.swap(false, Ordering::AcqRel) {
            // A failure of the flush itself is logged once where it is noted.
            if let Err(e) = inner.flush() {
                if !inner.flush_failing.load(Ordering::Acquire) {
                    log::error!("background flush failed: {e}");
                }
            }
        }
        // Short of room, compactions are the reclaiming ones above: a due
        // one would fail for room again, after writing its tables.
        while !inner.short_of_room() {
            match inner.compact_once(Urge::Due) {
                Ok(true) if !inner.shutdown.load(Ordering::Acquire) => continue,
                Ok(_) => break,
                Err(e) => {
                    log::error!("background compaction failed: {e}");
                    break;
                }
            }
        }
    }
}
