//! Writes: [`Logged`] and [`LogMarks`] (see [`Store::write_logged`]).
//! The write path: sequence assignment, WAL append, memtable insert, and
//! visibility in sequence order once the log position is durable.

use super::*;
use crate::batch::LargePut;

/// A write applied and logged: its last sequence and where its log record
/// ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Logged {
    /// The sequence of the batch's last operation.
    pub seq: u64,
    /// Where its log record ends; see [`Store::is_durable`].
    pub position: wal::LogPosition,
}

/// The log's marks, in log blocks ([`Store::log_marks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogMarks {
    /// Blocks written to the device (durable or not).
    pub written: u64,
    /// Blocks durable.
    pub durable: u64,
}

impl Store {
    /// Applies `batch` atomically and durably; returns the sequence number
    /// of its last operation. Returns only once the batch survives a crash.
    pub fn write(&self, batch: &WriteBatch) -> Result<u64> {
        self.write_with(batch, WriteOptions::default())
    }

    /// [`Store::write`] with options: `sync: false` returns once the batch
    /// is in the WAL's open block and the memtable, before it is durable
    /// (as RocksDB's default); a crash — of the machine, or of the process,
    /// unlike RocksDB, whose unsynced writes wait in the page cache — may
    /// lose it, never part of it. Its block is written once it fills (full
    /// blocks go out eight at a time while no commit is made:
    /// `wal::EARLY_WRITES_PER_SUBMIT`), or with the next synced write or
    /// close.
    pub fn write_with(&self, batch: &WriteBatch, options: WriteOptions) -> Result<u64> {
        Ok(self.write_inner(batch, options, false, true)?.seq)
    }

    /// Applies `batch` atomically without waiting for it to be durable
    /// (visible at once, as `sync: false`) and says where its log record
    /// ends: a server acknowledges it once [`Store::is_durable`] says so,
    /// serving other requests meanwhile, and asks for durability with
    /// [`Store::make_durable`] (or lets a later synced write carry it).
    ///
    /// With background compaction on, it never flushes or compacts on the
    /// calling thread (a server's event loop): past the write buffer it
    /// asks the background thread to flush and goes on, and the caller
    /// holds writes back while [`Store::write_pressure`] says so.
    pub fn write_logged(&self, batch: &WriteBatch) -> Result<Logged> {
        self.write_inner(batch, WriteOptions { sync: false }, false, false)
    }

    /// Whether a write now would stall a writer of [`Store::write`]: the
    /// memtables hold twice the write buffer, or level 0 has three times
    /// its compaction trigger. A server defers writes while it holds (and
    /// goes on serving reads).
    ///
    /// While writes are refused for room ([`Store::writes_refused`]) it
    /// says no: held back, they would wait for space that may never come;
    /// let through, each is refused or taken at once.
    pub fn write_pressure(&self) -> bool {
        let inner = &self.inner;
        if inner.short_of_room() {
            return false;
        }
        let ring = inner.wal.layout().ring_blocks();
        let (buffered, frozen) = self.memtable_fill();
        let ring_full = inner.wal.used_blocks_hint() * 4 >= ring * 3;
        let memtable_full = buffered >= inner.config.write_buffer_bytes;
        if (ring_full || memtable_full) && !frozen && inner.config.background_compaction {
            // Only a flush frees the ring and the memtable, and the writes
            // that would ask for one are the ones held back: ask here. (A
            // write asks with the fill it found before it was applied: the
            // last one before a hold, or one large value that took the
            // memtable past twice the buffer at once, asked for nothing,
            // and a flush that ended with the memtable already full
            // leaves no writer to ask.)
            inner.flush_requested.store(true, Ordering::Release);
            inner.wake_background();
        }
        buffered >= 2 * inner.config.write_buffer_bytes
            || inner.l0_tables() >= 3 * inner.config.compaction.l0_trigger
            || ring_full
    }

    /// Whether the memtable should go to a table now: it reached the
    /// write buffer, or its records fill half the log's ring (a full ring
    /// makes the writer flush on its own thread).
    /// A flush under way (`frozen`) frees the ring when it ends: not due.
    fn flush_due(&self, buffered: usize, frozen: bool) -> bool {
        let inner = &self.inner;
        buffered >= inner.config.write_buffer_bytes
            || (!frozen && inner.wal.used_blocks_hint() * 2 >= inner.wal.layout().ring_blocks())
    }

    /// Whether the log is durable up to `position`: one atomic load, no
    /// system call.
    pub fn is_durable(&self, position: wal::LogPosition) -> bool {
        self.inner.wal.is_durable(position)
    }

    /// Whether the log is on the device up to `position` (its writes
    /// completed, durable or not): one atomic load.
    pub fn is_written_through(&self, position: wal::LogPosition) -> bool {
        self.inner.wal.is_written_through(position)
    }

    /// Whether the write whose record ends at `position` survives the
    /// process's death: its record is in the log mirror
    /// ([`StoreConfig::log_mirror`]) or written through the device. One
    /// atomic load where the mirror keeps it.
    pub fn is_kept(&self, position: wal::LogPosition) -> bool {
        self.inner.wal.is_kept(position)
    }

    /// Whether the store copies its log records into a mirror.
    pub fn has_log_mirror(&self) -> bool {
        self.inner.wal.has_mirror()
    }

    /// Bytes the log mirror's records take (0 without one): they wait for
    /// a write through the device ([`Store::write_through`]).
    pub fn log_mirror_used_bytes(&self) -> usize {
        self.inner.wal.mirror_used_bytes()
    }

    /// Log records (write batches) the log mirror an earlier process left
    /// gave back at open (they were in no log block on the device).
    pub fn log_mirror_replayed(&self) -> u64 {
        self.inner.wal.replayed_from_mirror()
    }

    /// Puts the log on the device up to `position` without a flush: it
    /// survives the process's death, and a power cut once a later
    /// [`Store::make_durable`] covers it (Redis's `appendfsync everysec`).
    /// A failure fails the store.
    pub fn write_through(&self, position: wal::LogPosition) -> Result<()> {
        self.check_failed()?;
        self.inner.wal.write_through(position).inspect_err(|e| {
            self.fail(e.to_string());
        })
    }

    /// Makes the log durable up to `position` (a group commit: one
    /// committer writes every record appended so far and flushes, others
    /// wait on it). A failure fails the store, as a failed synced write does.
    pub fn make_durable(&self, position: wal::LogPosition) -> Result<()> {
        self.check_failed()?;
        match self.inner.wal.commit(position) {
            Ok(()) => {
                self.advance_visible(None, false);
                Ok(())
            }
            Err(e) => {
                self.fail(e.to_string());
                Err(e)
            }
        }
    }

    /// Where the log's writes (`written`) and its durable part (`durable`)
    /// end, in log blocks: each one atomic load.
    pub fn log_marks(&self) -> LogMarks {
        LogMarks {
            written: self.inner.wal.last_written(),
            durable: self.inner.wal.last_durable(),
        }
    }

    /// `stall`: the writer may flush and compact itself when the
    /// background thread is behind (off for [`Store::write_logged`]).
    /// Large values go to blob files first, and the batch of their
    /// references is logged.
    fn write_inner(
        &self,
        batch: &WriteBatch,
        options: WriteOptions,
        retried: bool,
        stall: bool,
    ) -> Result<Logged> {
        self.write_separating(batch, &[], options, retried, stall)
    }

    /// [`Store::write_logged`] of `batch` and, after its operations,
    /// `large` puts whose values are written to blob files from where they
    /// lie (no copy of them is made; see [`LargePut`]). One atomic write.
    pub fn write_logged_large(&self, batch: &WriteBatch, large: &[LargePut<'_>]) -> Result<Logged> {
        for put in large {
            put.check()?;
        }
        let options = WriteOptions { sync: false };
        self.write_separating(batch, large, options, false, false)
    }

    /// [`Store::write`] of `batch` and, after its operations, `large` puts
    /// written to blob files from where they lie (see [`LargePut`]): one
    /// atomic, synced write that holds no copy of the large values.
    pub fn write_large(&self, batch: &WriteBatch, large: &[LargePut<'_>]) -> Result<u64> {
        for put in large {
            put.check()?;
        }
        Ok(self
            .write_separating(batch, large, WriteOptions::default(), false, true)?
            .seq)
    }

    fn write_separating(
        &self,
        batch: &WriteBatch,
        large: &[LargePut<'_>],
        options: WriteOptions,
        retried: bool,
        stall: bool,
    ) -> Result<Logged> {
        let Some((separated, places)) = self.separate(batch, large)? else {
            return self.write_logged_batch(batch, options, retried, stall);
        };
        let logged = self.write_logged_batch(&separated, options, retried, stall)?;
        // The write is in the memtable: its files now count it there.
        for place in places {
            place.landed(logged.seq);
        }
        Ok(logged)
    }

    /// [`Store::write_inner`] of a batch whose large values are references.
    fn write_logged_batch(
        &self,
        batch: &WriteBatch,
        options: WriteOptions,
        retried: bool,
        stall: bool,
    ) -> Result<Logged> {
        if batch.is_empty() {
            return Ok(Logged {
                seq: self.inner.visible_seq.get(),
                position: wal::LogPosition { end_seq: 0 },
            });
        }
        self.check_failed()?;
        let inner = &self.inner;
        let (buffered, frozen) = self.memtable_fill();
        if inner.short_of_room() {
            self.check_room(batch)?;
        }
        let budget = inner.config.write_buffer_bytes;
        let background = inner.config.background_compaction;
        if background && self.flush_due(buffered, frozen) && buffered < budget {
            // The ring fills before the memtable: flush early.
            inner.flush_requested.store(true, Ordering::Release);
            inner.wake_background();
        }
        if buffered >= budget && background && !stall {
            inner.flush_requested.store(true, Ordering::Release);
            inner.wake_background();
        } else if buffered >= budget {
            let started = std::time::Instant::now();
            let mut stalled = false;
            if background && buffered < 2 * budget {
                // The background thread flushes; writes go on meanwhile.
                inner.flush_requested.store(true, Ordering::Release);
                inner.wake_background();
            } else {
                // No background thread, or it is behind: the writer flushes
                // (waiting for a flush under way first).
                stalled = true;
                inner.flush()?;
            }
            // Write stall: past three times the trigger, level 0 is compacted
            // by the writer itself, bounding read cost and space.
            while inner.l0_tables() >= 3 * inner.config.compaction.l0_trigger {
                stalled = true;
                if !inner.compact_once(crate::compaction::Urge::Due)? {
                    break;
                }
            }
            if stalled {
                let us = started.elapsed().as_micros() as u64;
                inner.write_stalls.fetch_add(1, Ordering::Relaxed);
                inner.write_stall_us.fetch_add(us, Ordering::Relaxed);
            }
        }
        let (first, pos, visible) = {
            let mut writer = lock(&inner.writer);
            if let Some(id) = writer.unknown_keyspace(batch) {
                // Not under the writer lock: `keyspaces` is taken first.
                drop(writer);
                return Err(self.unknown_keyspace(id));
            }
            let first = writer.next_seq;
            let keep = !batch.has_blob_refs();
            let pos = match inner
                .wal
                .append_pieces(&batch.header(first), batch.body(), keep)
            {
                Err(StoreError::WalFull { .. }) if !retried => {
                    drop(writer);
                    let started = std::time::Instant::now();
                    inner.flush()?;
                    inner.write_stalls.fetch_add(1, Ordering::Relaxed);
                    let us = started.elapsed().as_micros() as u64;
                    inner.write_stall_us.fetch_add(us, Ordering::Relaxed);
                    return self.write_logged_batch(batch, options, true, stall);
                }
                other => other?,
            };
            writer.next_seq += batch.len() as u64;
            {
                let mut active = write(&writer.active);
                active.apply(first, batch);
                inner
                    .active_bytes
                    .store(inner.memtable_weight(&active), Ordering::Relaxed);
            }
            // An unsynced write whose predecessors are all visible is made
            // visible here, without the pending map's lock: under the
            // writer lock no later write exists yet and no earlier one is
            // pending, and the mark only ever rises.
            let last = first + batch.len() as u64 - 1;
            let visible = !options.sync && inner.visible_seq.get() + 1 == first;
            if visible {
                inner.visible_seq.advance(last, None);
            }
            (first, pos, visible)
        };
        let last = first + batch.len() as u64 - 1;
        if !visible {
            self.finish_write(first, last, options.sync.then_some(pos))?;
        }
        Ok(Logged {
            seq: last,
            position: pos,
        })
    }

    /// The active memtable's bytes, and whether a frozen one is being
    /// flushed (two atomic loads: both are kept where they change).
    fn memtable_fill(&self) -> (usize, bool) {
        let inner = &self.inner;
        (
            inner.active_bytes.load(Ordering::Relaxed),
            inner.flushing.load(Ordering::Relaxed),
        )
    }

    /// Returns once `first..=last` is visible (and, with `durable_at`,
    /// durable). A write waits once: on the visible mark. Whoever finds its
    /// record in no commit group yet and a committer's slot free leads one
    /// (the WAL's group commit, up to `wal::MAX_COMMIT_LEADERS` groups in
    /// flight); the leader then makes every write now durable visible at
    /// once and wakes exactly their writers, plus one whose record no group
    /// holds, to lead the next.
    fn finish_write(
        &self,
        first: u64,
        last: u64,
        durable_at: Option<wal::LogPosition>,
    ) -> Result<()> {
        let inner = &self.inner;
        self.advance_visible(Some((first, last, durable_at)), false);
        let failed = || inner.write_failed.load(Ordering::Acquire);
        loop {
            if inner.visible_seq.get() >= last {
                return Ok(());
            }
            if failed() {
                return self.check_failed();
            }
            if durable_at.is_some_and(|p| inner.wal.can_lead(p)) {
                match inner.wal.try_lead_commit(inner.visible_seq.has_parked()) {
                    Some(Ok(_)) => {
                        self.advance_visible(None, true);
                        continue;
                    }
                    Some(Err(e)) => {
                        self.fail(e.to_string());
                        return Err(e);
                    }
                    None => {}
                }
            }
            let key = durable_at.map_or(0, |p| p.end_seq);
            inner.visible_seq.wait(last, key, || {
                failed() || durable_at.is_some_and(|p| inner.wal.can_lead(p))
            });
        }
    }

    /// Adds `finished` (first, last, log position it needs durable) to the
    /// pending writes, then makes visible every pending write whose
    /// predecessors are visible and whose log position is durable; with
    /// `wake_next_leader`, also wakes one writer whose record no commit
    /// group holds yet.
    fn advance_visible(
        &self,
        finished: Option<(u64, u64, Option<wal::LogPosition>)>,
        wake_next_leader: bool,
    ) {
        let inner = &self.inner;
        let mut v = lock(&inner.visible);
        let mut seq = inner.visible_seq.get().max(v.ready_upto);
        match finished {
            // Next in line and waiting on no flush: visible at once, without
            // a stop in the pending map (a server's unsynced writes).
            Some((first, last, None)) if first == seq + 1 => seq = last,
            Some((first, last, need)) => {
                v.pending.insert(first, (last, need));
            }
            None => {}
        }
        // Read under the lock, after the insert: a commit that made this
        // write durable either shows here or advances after we let go.
        let durable = inner.wal.last_durable();
        while let Some(&(end, need)) = v.pending.get(&(seq + 1)) {
            if need.is_some_and(|p| p.end_seq >= durable) {
                break;
            }
            v.pending.remove(&(seq + 1));
            seq = end;
        }
        v.ready_upto = seq;
        // The wake-ups go out after the lock is let go: each can cost a
        // cross-core interrupt, and every writer takes this lock once.
        drop(v);
        inner
            .visible_seq
            .advance(seq, wake_next_leader.then(|| inner.wal.staged_below()));
    }

    /// Why a write now would be refused for room, if it would: while
    /// free space is below the reserve, a write that adds data; while a
    /// flush fails, a write past twice the write buffer (a delete, past
    /// three times: it is what frees space).
    pub fn writes_refused(&self, deletes_only: bool) -> Option<WritesRefused> {
        let inner = &self.inner;
        if !deletes_only && inner.space_low.load(Ordering::Acquire) {
            let block = STORE_BLOCK_BYTES as u64;
            return Some(WritesRefused::SpaceLow {
                free_bytes: inner.free_blocks_hint.load(Ordering::Relaxed) * block,
                reserve_bytes: inner.reserve_blocks * block,
                resume_bytes: super::flush::resume_blocks(inner.reserve_blocks) * block,
                device_bytes: inner.dev.block_count() * block,
            });
        }
        if inner.flush_failing.load(Ordering::Acquire) {
            let (buffered, _) = self.memtable_fill();
            let room = if deletes_only { 3 } else { 2 } * inner.config.write_buffer_bytes;
            if buffered >= room {
                let why = lock(&inner.flush_failure).clone().unwrap_or_default();
                return Some(WritesRefused::FlushFailing { why });
            }
        }
        None
    }

    pub(super) fn check_room(&self, batch: &WriteBatch) -> Result<()> {
        let deletes_only = batch
            .ops()
            .all(|op| !matches!(op.kind, OpKind::Put | OpKind::PutBlob));
        match self.writes_refused(deletes_only) {
            Some(why) => Err(StoreError::WritesRefused(why)),
            None => Ok(()),
        }
    }

    /// The store takes no more writes; every waiting writer is told.
    fn fail(&self, why: String) {
        lock(&self.inner.visible).failed.get_or_insert(why);
        self.inner.write_failed.store(true, Ordering::Release);
        self.inner.visible_seq.wake_all();
    }

    fn check_failed(&self) -> Result<()> {
        // Set right after `failed`: a write that misses it raced the
        // failure, as one that took the lock a moment earlier did.
        if !self.inner.write_failed.load(Ordering::Acquire) {
            return Ok(());
        }
        match &lock(&self.inner.visible).failed {
            Some(why) => Err(StoreError::BadDevice(format!(
                "the store failed and takes no writes: {why}; reopen it to recover"
            ))),
            None => Ok(()),
        }
    }

    /// Writes one value durably; returns its sequence.
    pub fn put(&self, keyspace: u32, key: &[u8], value: &[u8]) -> Result<u64> {
        let mut b = WriteBatch::new();
        b.put(keyspace, key, value)?;
        self.write(&b)
    }

    /// Deletes one key durably; returns the delete's sequence.
    pub fn delete(&self, keyspace: u32, key: &[u8]) -> Result<u64> {
        let mut b = WriteBatch::new();
        b.delete(keyspace, key)?;
        self.write(&b)
    }

    /// Deletes every key in `[start, end)` durably; returns the sequence.
    pub fn delete_range(&self, keyspace: u32, start: &[u8], end: &[u8]) -> Result<u64> {
        let mut b = WriteBatch::new();
        b.delete_range(keyspace, start, end)?;
        self.write(&b)
    }
}
