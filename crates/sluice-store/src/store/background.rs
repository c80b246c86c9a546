//! The compaction driver and the background thread that runs flushes and
//! compactions.

use super::flush::Placed;
use super::*;

impl Store {
    /// Flushes the memtable and compacts until every keyspace's data sits
    /// in one level.
    pub fn compact(&self) -> Result<()> {
        self.flush()?;
        while self.inner.compact_once(true)? {}
        // Log the frees of tables nobody reads any more.
        let frees = self.inner.take_released();
        if !frees.is_empty() {
            self.inner.log_group(&frees)?;
        }
        Ok(())
    }
}

impl Inner {
    /// Runs one due compaction, if any (or, with `force`, one that pushes
    /// data down). Returns whether it did anything.
    pub(super) fn compact_once(&self, force: bool) -> Result<bool> {
        with_io_priority(Priority::Low, || self.compact_one(force))
    }

    fn compact_one(&self, force: bool) -> Result<bool> {
        let inner = self;
        let _one = lock(&inner.compaction_lock);
        let version = read(&inner.version).clone();
        let cursor = inner.compaction_cursor.fetch_add(1, Ordering::Relaxed) as usize;
        let Some(job) = version.keyspaces.iter().find_map(|(ks, levels)| {
            compaction::pick(&inner.config.compaction, *ks, levels, cursor, force)
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
        let ran = compaction::run(
            &inner.dev,
            &job,
            &snapshots,
            inner.config.compaction.target_file_bytes,
            &inner.table_buffers,
            &mut |t| {
                placed.push(self.place(job.keyspace, t, false)?);
                Ok(())
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
        drop(job);
        drop(version);
        inner.compactions.fetch_add(1, Ordering::Relaxed);
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
                }
            }
            *woken = false;
        }
        if inner.shutdown.load(Ordering::Acquire) {
            break;
        }
        inner.free_retired_memtables();
        if inner.flush_requested.swap(false, Ordering::AcqRel) {
            if let Err(e) = inner.flush() {
                log::error!("background flush failed: {e}");
            }
        }
        loop {
            match inner.compact_once(false) {
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
