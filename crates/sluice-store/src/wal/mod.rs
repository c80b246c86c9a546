//! The write-ahead log: a ring of extents holding 4096-byte log blocks,
//! early write of every block that fills, group commit with a parity block
//! per group, and recovery that tells a torn tail (the normal end after a
//! crash) from damage in the middle of the log (reported, never passed over
//! silently). Layout and rules in docs/FORMAT.md ("Write-ahead log").
//!
//! This file is the writer (`Wal`: appends, early writes, group commit);
//! `format` holds the block format and the ring's layout, `recover` the
//! reading back after a crash.

mod format;
mod recover;

use crate::blocks::{block_buffer, BlockDevice, STORE_BLOCK_BYTES};
use crate::error::{Result, StoreError};
use crate::parity::{LogFormat, Parity};
use crate::seqgate::SeqGate;
use crate::wal_mirror::LogMirror;
use sluice_io::mem::AlignedMem;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

#[cfg(feature = "fuzzing")]
pub(crate) use format::frame_block;
use format::*;
pub use format::{LogPosition, WalLayout, WalRecovery, MAX_RECORD_BYTES};
pub use recover::{recover, Recovered};

struct State {
    open: AlignedMem,
    open_used: usize,
    open_seq: u64,
    /// Oldest log block still needed (its records are not yet in tables).
    tail_seq: u64,
    /// XOR of the blocks sealed since the last parity block.
    parity: Parity,
    /// A commit's closing block and parity block, written with one request.
    stage: AlignedMem,
    /// First block of the next commit group: every block from here on is
    /// made durable by the group's write (blocks written early or by
    /// `close_block` before it included: the device flush covers them).
    group_start: u64,
    /// The engine full blocks are written early on, without waiting: the
    /// writes are reaped as later ones go out, and all of them before a
    /// group is made durable or closed.
    early: Box<dyn sluice_io::Engine>,
    /// Sealed blocks that follow one another on the device, gathered into
    /// one write that goes to `early` when it holds
    /// [`EARLY_WRITES_PER_SUBMIT`] blocks, when a commit has come since the
    /// last early write, or before any wait for the early writes.
    early_batch: Option<EarlyBatch>,
    /// Commits made when the last early write was queued.
    commits_at_early: u64,
    failed: Option<String>,
    /// Every record appended is copied here too, when there is one.
    mirror: Option<LogMirror>,
    /// The log block of the last record the mirror did not keep, until a
    /// write through the device covers it.
    unkept_last: Option<u64>,
}

/// Consecutive log blocks on their way to the device as one write.
struct EarlyBatch {
    first_block: u64,
    buf: sluice_io::IoBuf,
    blocks: usize,
}

/// Commit groups in flight at once. More than one lets the next group go out
/// while one is on its way (the durable mark advances over them in order),
/// but here every durable write flushes the whole device cache: with 4 in
/// flight groups shrank from 12.8 to 3.5 writes and 32 synced writers fell
/// from 22494 to 16581 ops/s (docs/BENCHMARKS.md, "Synced writes on one I/O
/// path"). A device with FUA may want more.
pub const MAX_COMMIT_LEADERS: usize = 1;

/// Full blocks gathered before they go to the kernel as one write (one
/// system call, one request and one device notification for all of them),
/// while no commit is being made (then each goes at once, as a commit would
/// wait for it). Unsynced writes in gathered blocks are lost if the process
/// dies before the next write, commit or close, as those in the open block
/// always are.
pub const EARLY_WRITES_PER_SUBMIT: usize = 32;

/// Longest a commit leader waits for more records to join its group, when
/// other writers are waiting (a fraction of one durable write, ~200 µs here).
pub const GATHER_MAX_US: u64 = 100;

/// An open write-ahead log.
pub struct Wal {
    dev: BlockDevice,
    layout: WalLayout,
    state: Mutex<State>,
    /// Records appended since the log was opened (for a leader gathering
    /// its group).
    appended: AtomicU64,
    /// Committers writing a group now (at most [`MAX_COMMIT_LEADERS`]).
    leaders: AtomicUsize,
    /// The engine commit groups are written durable on (one leader at a
    /// time holds it).
    commit_engine: Mutex<Box<dyn sluice_io::Engine>>,
    /// Every block below this sequence is in a group some committer has
    /// taken (written, or being written).
    staged_below: AtomicU64,
    /// Groups durable ahead of an earlier one: first block -> end.
    completed: Mutex<std::collections::BTreeMap<u64, u64>>,
    /// Every log block below this sequence has been handed to the device
    /// (an early write may still be in flight).
    written_below: AtomicU64,
    /// Every log block below this sequence is durable; committers wait on it.
    durable_below: SeqGate,
    /// Every log block below this sequence is on the device, its write
    /// completed, durable or not ([`Wal::write_through`]).
    through_below: AtomicU64,
    flushes: AtomicU64,
    /// `State::tail_seq`, readable without the lock.
    tail_hint: AtomicU64,
    /// Called before any log block goes to the device (the store writes
    /// the blob records gathered in memory that the block may reference).
    before_write: std::sync::OnceLock<BeforeWrite>,
    /// A record ending before this block is kept (in the mirror or on the
    /// device); 0 without a mirror, `u64::MAX` while the mirror has kept
    /// every record not yet written through.
    unkept_from: AtomicU64,
    /// Records the mirror an earlier process left gave back at open.
    replayed_from_mirror: AtomicU64,
}

/// What the log calls before it writes blocks.
pub type BeforeWrite = Box<dyn Fn() -> Result<()> + Send + Sync>;

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("ring_blocks", &self.layout.ring_blocks())
            .field("written_below", &self.last_written())
            .field("durable_below", &self.last_durable())
            .finish()
    }
}

impl Wal {
    /// Opens the log for appending at `next_seq`, keeping blocks from
    /// `tail_seq` on (as recovery reported them).
    /// With `sqpoll_idle_ms`, the log's engines are SQPOLL rings whose
    /// waits poll: a commit makes no system call while their kernel
    /// threads are awake (each costs a core while busy).
    pub fn open(
        dev: BlockDevice,
        layout: WalLayout,
        tail_seq: u64,
        next_seq: u64,
        sqpoll_idle_ms: Option<u32>,
    ) -> Result<Self> {
        if layout.ring_blocks() < 4 {
            return Err(StoreError::BadDevice(
                "the WAL ring needs at least 4 blocks".into(),
            ));
        }
        assert!(tail_seq <= next_seq);
        let early = dev.own_engine(layout.ring[0].start_block, sqpoll_idle_ms)?;
        let commit_engine = Mutex::new(dev.own_engine(layout.ring[0].start_block, sqpoll_idle_ms)?);
        Ok(Wal {
            dev,
            layout,
            state: Mutex::new(State {
                open: block_buffer(),
                open_used: 0,
                open_seq: next_seq,
                tail_seq,
                parity: Parity::new(next_seq),
                stage: AlignedMem::new(2 * STORE_BLOCK_BYTES),
                group_start: next_seq,
                early,
                early_batch: None,
                commits_at_early: 0,
                failed: None,
                mirror: None,
                unkept_last: None,
            }),
            appended: AtomicU64::new(0),
            leaders: AtomicUsize::new(0),
            commit_engine,
            staged_below: AtomicU64::new(next_seq),
            completed: Mutex::new(std::collections::BTreeMap::new()),
            written_below: AtomicU64::new(next_seq),
            durable_below: SeqGate::new(next_seq),
            through_below: AtomicU64::new(next_seq),
            flushes: AtomicU64::new(0),
            tail_hint: AtomicU64::new(tail_seq),
            before_write: std::sync::OnceLock::new(),
            unkept_from: AtomicU64::new(0),
            replayed_from_mirror: AtomicU64::new(0),
        })
    }

    /// Has `f` called before any log block is written from now on (once
    /// per log; a second call is ignored).
    pub fn set_before_write(&self, f: BeforeWrite) {
        let _ = self.before_write.set(f);
    }

    fn before_write(&self) -> Result<()> {
        match self.before_write.get() {
            Some(f) => f(),
            None => Ok(()),
        }
    }

    /// About how many ring blocks hold records not yet in tables (within
    /// the open block; no lock): writers ask for a memtable flush well
    /// before the ring fills, since a full ring makes a writer flush.
    pub fn used_blocks_hint(&self) -> u64 {
        self.last_written()
            .saturating_sub(self.tail_hint.load(Ordering::Acquire))
    }

    /// The ring and epoch this log writes.
    pub fn layout(&self) -> &WalLayout {
        &self.layout
    }

    /// Every log block below this sequence has been handed to the device;
    /// early writes may still be in flight (no system call).
    pub fn last_written(&self) -> u64 {
        self.written_below.load(Ordering::Acquire)
    }

    /// Every log block below this sequence is durable (no system call).
    pub fn last_durable(&self) -> u64 {
        self.durable_below.get()
    }

    /// Whether every block up to `pos` is durable.
    pub fn is_durable(&self, pos: LogPosition) -> bool {
        self.last_durable() > pos.end_seq
    }

    /// Whether every block up to `pos` is on the device (its write
    /// completed; durable once a flush covers it).
    pub fn is_written_through(&self, pos: LogPosition) -> bool {
        self.through_below.load(Ordering::Acquire) > pos.end_seq || self.is_durable(pos)
    }

    /// Puts every record up to `pos` on the device without a flush: the
    /// open block and the group's parity block are written (the group
    /// closed, as a commit closes it) and the call returns once the device
    /// has them. They survive the process's death, not a power cut, until
    /// a [`Wal::commit`] covers them: Redis's `appendfsync everysec`, whose
    /// write(2) reaches the kernel before its reply. Takes a committer's
    /// slot, so that no commit's flush passes over a write still on its
    /// way.
    pub fn write_through(&self, pos: LogPosition) -> Result<()> {
        loop {
            if self.is_written_through(pos) {
                return Ok(());
            }
            let slot = self
                .leaders
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < MAX_COMMIT_LEADERS).then_some(n + 1)
                });
            if slot.is_err() {
                // A commit is on its way: it covers `pos`, or frees the slot.
                std::thread::yield_now();
                continue;
            }
            let written = self.write_group();
            self.leaders.fetch_sub(1, Ordering::AcqRel);
            // A committer parked for the slot looks again.
            self.durable_below.wake_all();
            written?;
        }
    }

    /// Closes the group and writes it without a flush (see
    /// [`Wal::write_through`]); the group's start stays, so that the next
    /// commit's flush covers these blocks.
    fn write_group(&self) -> Result<()> {
        let mut st = self.lock();
        self.check_failed(&st)?;
        self.drain_early(&mut st)?;
        let (first_seq, count) = self.stage_group(&mut st);
        let target = st.open_seq;
        let staged = self.copy_staged(&st, first_seq, count);
        drop(st);
        if !staged.is_empty() {
            self.write_staged(&staged, false)?;
        }
        self.written_below.fetch_max(target, Ordering::AcqRel);
        self.through_below.fetch_max(target, Ordering::AcqRel);
        self.mirror_caught_up(target);
        Ok(())
    }

    /// The staged blocks as owned runs, so that the state lock can go
    /// before they are written (appends go on meanwhile).
    fn copy_staged(&self, st: &State, first_seq: u64, count: usize) -> Vec<(u64, Vec<u8>)> {
        self.staged_runs(st, first_seq, count)
            .into_iter()
            .map(|(at, bytes)| (at, bytes.to_vec()))
            .collect()
    }

    /// Writes staged runs on the commit engine, made durable or not; a
    /// failure fails the log.
    fn write_staged(&self, staged: &[(u64, Vec<u8>)], durable: bool) -> Result<()> {
        let runs: Vec<(u64, &[u8])> = staged.iter().map(|(at, b)| (*at, &b[..])).collect();
        let written = self.before_write().and_then(|()| {
            let mut engine = self.commit_engine.lock().unwrap_or_else(|p| p.into_inner());
            self.dev.write_runs_on(engine.as_mut(), &runs, durable)
        });
        if let Err(e) = &written {
            self.lock().failed = Some(e.to_string());
        }
        written
    }

    /// Device flushes made so far: fewer than commits when commits group.
    pub fn flush_count(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// Writes the open block (padded) if it holds anything and ends the
    /// group with its parity block, so that every record appended so far
    /// lies before the returned sequence and no group straddles it.
    pub fn close_block(&self) -> Result<u64> {
        let mut st = self.lock();
        self.check_failed(&st)?;
        self.close_group(&mut st)?;
        Ok(st.open_seq)
    }

    /// Log blocks before `seq` are no longer needed (their records are in tables).
    pub fn release_before(&self, seq: u64) {
        let mut st = self.lock();
        assert!(seq <= st.open_seq, "releasing log blocks not yet written");
        st.tail_seq = st.tail_seq.max(seq);
        self.tail_hint.store(st.tail_seq, Ordering::Release);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends one record. Blocks that fill are written at once; the record
    /// is durable only after [`Wal::commit`] of its position returns.
    pub fn append(&self, record: &[u8]) -> Result<LogPosition> {
        self.append_pieces(record, &[], true)
    }

    /// [`Wal::append`] of the record `head` and `body` make one after the
    /// other (a batch's header and its entries), copied once into the log
    /// and, with `keep` and a mirror that has room, once into the mirror
    /// ([`Wal::is_kept`]).
    pub fn append_pieces(&self, head: &[u8], body: &[u8], keep: bool) -> Result<LogPosition> {
        let record = Pieces(head, body);
        if record.len() > MAX_RECORD_BYTES {
            return Err(StoreError::RecordTooLarge {
                len_bytes: record.len(),
                max_bytes: MAX_RECORD_BYTES,
            });
        }
        let mut st = self.lock();
        self.check_failed(&st)?;
        // Room check before any byte is placed, so a record is all or
        // nothing: its fragments, the open block, and the parity block a
        // commit or close adds after them.
        let fragments = record
            .len()
            .div_ceil(PAYLOAD_BYTES - FRAGMENT_HEADER_BYTES)
            .max(1);
        let worst_blocks = (fragments + 2) as u64;
        let ring = self.layout.ring_blocks();
        let used = st.open_seq - st.tail_seq;
        if used + worst_blocks > ring {
            return Err(StoreError::WalFull {
                used_blocks: used,
                ring_blocks: ring,
            });
        }
        let mut rest = record;
        let mut first = true;
        loop {
            if PAYLOAD_BYTES - st.open_used < FRAGMENT_HEADER_BYTES + 1 {
                self.write_open(&mut st)?;
            }
            let room = PAYLOAD_BYTES - st.open_used - FRAGMENT_HEADER_BYTES;
            let take = rest.len().min(room);
            let last = take == rest.len();
            let kind = match (first, last) {
                (true, true) => FULL,
                (true, false) => FIRST,
                (false, false) => MIDDLE,
                (false, true) => LAST,
            };
            let (fragment, after) = rest.split_at(take);
            put_fragment(&mut st, kind, fragment);
            rest = after;
            first = false;
            if last {
                break;
            }
        }
        let pos = LogPosition {
            end_seq: st.open_seq,
        };
        if let Some(mirror) = st.mirror.as_mut() {
            if !(keep && mirror.append(pos.end_seq, head, body)) {
                self.mark_unkept(&mut st, pos.end_seq);
            }
        }
        // Only appends change it, under the state lock: no locked add.
        let appended = self.appended.load(Ordering::Relaxed) + 1;
        self.appended.store(appended, Ordering::Release);
        if PAYLOAD_BYTES - st.open_used < FRAGMENT_HEADER_BYTES + 1 {
            self.write_open(&mut st)?;
        }
        Ok(pos)
    }

    /// A record ending in block `end_seq` is not in the mirror: neither it
    /// nor any after it counts as kept until a write through covers it
    /// (the mirror's records are replayed only without a gap).
    fn mark_unkept(&self, st: &mut State, end_seq: u64) {
        st.unkept_last = Some(end_seq);
        if self.unkept_from.load(Ordering::Relaxed) == u64::MAX {
            self.unkept_from.store(end_seq, Ordering::Release);
        }
    }

    /// Every block below `through_seq` is on the device: the mirror lets
    /// their records go, and records not kept below it count as kept.
    fn mirror_caught_up(&self, through_seq: u64) {
        let mut st = self.lock();
        let State {
            mirror,
            unkept_last,
            ..
        } = &mut *st;
        let Some(mirror) = mirror.as_mut() else {
            return;
        };
        mirror.let_go_below(through_seq);
        match *unkept_last {
            Some(last) if last < through_seq => {
                *unkept_last = None;
                self.unkept_from.store(u64::MAX, Ordering::Release);
            }
            Some(_) => {
                let from = self.unkept_from.load(Ordering::Relaxed).max(through_seq);
                self.unkept_from.store(from, Ordering::Release);
            }
            None => {}
        }
    }

    /// Copies every record appended from now on into `mirror` too (see
    /// [`Wal::is_kept`]). Records appended before and not yet written
    /// through the device count as not kept until a write covers them.
    pub(crate) fn attach_mirror(&self, mirror: LogMirror) {
        let mut st = self.lock();
        st.mirror = Some(mirror);
        let through = self.through_below.load(Ordering::Acquire);
        if st.open_used > 0 || self.last_written() > through {
            let open_seq = st.open_seq;
            st.unkept_last = Some(open_seq);
            self.unkept_from
                .store(through.min(open_seq), Ordering::Release);
        } else {
            st.unkept_last = None;
            self.unkept_from.store(u64::MAX, Ordering::Release);
        }
    }

    /// Whether the record ending at `pos` survives the process's death:
    /// in the mirror (one atomic load) or written through the device.
    pub fn is_kept(&self, pos: LogPosition) -> bool {
        pos.end_seq < self.unkept_from.load(Ordering::Acquire) || self.is_written_through(pos)
    }

    /// Records the mirror an earlier process left gave back at open.
    pub fn replayed_from_mirror(&self) -> u64 {
        self.replayed_from_mirror.load(Ordering::Relaxed)
    }

    pub(crate) fn note_replayed_from_mirror(&self, records: u64) {
        self.replayed_from_mirror.store(records, Ordering::Relaxed);
    }

    /// Whether records are copied into a mirror.
    pub fn has_mirror(&self) -> bool {
        self.unkept_from.load(Ordering::Acquire) != 0
    }

    /// Bytes the mirror's kept records take (0 without one).
    pub fn mirror_used_bytes(&self) -> usize {
        self.lock().mirror.as_ref().map_or(0, LogMirror::used_bytes)
    }

    /// Stops copying records and deletes the mirror's file: for a clean
    /// close, once the whole log is durable.
    pub(crate) fn discard_mirror(&self) {
        let mirror = {
            let mut st = self.lock();
            self.unkept_from.store(0, Ordering::Release);
            st.mirror.take()
        };
        if let Some(m) = mirror {
            if let Err(e) = m.remove() {
                log::warn!("closing the store: the log mirror's file was not deleted: {e}");
            }
        }
    }

    fn check_failed(&self, st: &State) -> Result<()> {
        match &st.failed {
            Some(why) => Err(StoreError::BadDevice(format!(
                "the write-ahead log failed earlier and takes no more writes: {why}; reopen the store to recover"
            ))),
            None => Ok(()),
        }
    }

    /// Seals the open block in place: header, the durable mark every block
    /// carries, padding, checksum; adds it to the group's parity.
    fn seal_open(&self, st: &mut State) {
        let used = st.open_used;
        let b = st.open.as_mut_slice();
        write_derived_header(b, st.open_seq, self.layout.epoch);
        b[USED_AT..USED_AT + 8].copy_from_slice(&(used as u64).to_le_bytes());
        b[CLAIM_AT..CLAIM_AT + 8].copy_from_slice(&self.last_durable().to_le_bytes());
        b[GROUP_AT..GROUP_AT + 8].copy_from_slice(&st.parity.first_seq().to_le_bytes());
        b[HEADER_BYTES + used..STORE_BLOCK_BYTES - 4].fill(0);
        crate::blocks::seal_block(b);
        st.parity.add(b);
    }

    /// Seals, writes at its ring position, and opens the next block (the
    /// early write of a block that filled).
    fn write_open(&self, st: &mut State) -> Result<()> {
        self.seal_open(st);
        let at = self.layout.block_of(st.open_seq);
        if let Err(e) = self.submit_early(st, at) {
            st.failed = Some(e.to_string());
            return Err(e);
        }
        st.open_seq += 1;
        st.open_used = 0;
        self.written_below.store(st.open_seq, Ordering::Release);
        Ok(())
    }

    /// Adds the sealed open block to the early batch (not waiting for it),
    /// which goes to the device once full or when a commit has come since
    /// the last early write; takes in whatever earlier early writes have
    /// completed.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a batch"
    )]
    fn submit_early(&self, st: &mut State, block: u64) -> Result<()> {
        if st
            .early_batch
            .as_ref()
            .is_some_and(|b| block != b.first_block + b.blocks as u64)
        {
            // Not the next block on the device (the ring wrapped).
            self.send_early_batch(st)?;
        }
        let State {
            early,
            open,
            early_batch,
            commits_at_early,
            ..
        } = &mut *st;
        if early_batch.is_none() {
            if early.in_flight() >= early.queue_depth() {
                reap_early(early.as_mut(), 1, block)?;
            }
            let buf = early
                .pool()
                .alloc(
                    EARLY_WRITES_PER_SUBMIT * STORE_BLOCK_BYTES,
                    sluice_io::Direction::Write,
                )
                .map_err(|error| StoreError::Io { block, error })?;
            *early_batch = Some(EarlyBatch {
                first_block: block,
                buf,
                blocks: 0,
            });
        }
        let batch = early_batch.as_mut().expect("a batch");
        batch
            .buf
            .write_at(batch.blocks * STORE_BLOCK_BYTES, open.as_slice());
        batch.blocks += 1;
        // Gathered only while no commit came since the last early write: a
        // commit would wait for the gathered blocks at their full latency.
        let commits = self.flushes.load(Ordering::Relaxed);
        let committing = commits != std::mem::replace(commits_at_early, commits);
        if batch.blocks < EARLY_WRITES_PER_SUBMIT && !committing {
            return Ok(());
        }
        self.send_early_batch(st)
    }

    /// Writes the early batch, if any, as one request (entering the kernel
    /// for it) and takes in whatever early writes have completed.
    fn send_early_batch(&self, st: &mut State) -> Result<()> {
        let Some(mut batch) = st.early_batch.take() else {
            return Ok(());
        };
        let block = batch.first_block;
        if let Err(e) = self.before_write() {
            // The batch's blocks are gone with it: the log takes no more.
            st.failed = Some(e.to_string());
            return Err(e);
        }
        batch.buf.set_len(batch.blocks * STORE_BLOCK_BYTES);
        let lba = self.dev.lba_of(block);
        st.early
            .submit(sluice_io::Request::write(lba, batch.buf, block))
            .map_err(|r| StoreError::Io {
                block,
                error: r.error,
            })?;
        reap_early(st.early.as_mut(), 0, block)
    }

    /// Waits until every early write is on the device.
    fn drain_early(&self, st: &mut State) -> Result<()> {
        if let Err(e) = self.send_early_batch(st) {
            st.failed = Some(e.to_string());
            return Err(e);
        }
        let n = st.early.in_flight();
        if n == 0 {
            return Ok(());
        }
        let result = reap_early(st.early.as_mut(), n, self.layout.ring[0].start_block);
        if let Err(e) = &result {
            st.failed = Some(e.to_string());
        }
        result
    }

    /// Ends the group: seals the open block if it holds anything and the
    /// parity block after it, and writes both, with one request where they
    /// are adjacent on the device. Used where the caller holds the state
    /// lock throughout (closing the log for a flush, at close).
    fn close_group(&self, st: &mut State) -> Result<()> {
        self.drain_early(st)?;
        let (first_seq, count) = self.stage_group(st);
        let runs = self.staged_runs(st, first_seq, count);
        if let Err(e) = self.before_write() {
            st.failed = Some(e.to_string());
            return Err(e);
        }
        for (at, bytes) in runs {
            if let Err(e) = self.dev.write(at, bytes) {
                st.failed = Some(e.to_string());
                return Err(e);
            }
        }
        self.written_below.store(st.open_seq, Ordering::Release);
        Ok(())
    }

    /// Seals the open block (if it holds anything) and the group's parity
    /// block into `stage` and moves the log past them. Returns the first
    /// staged sequence and how many blocks were staged (0 to 2).
    fn stage_group(&self, st: &mut State) -> (u64, usize) {
        let mut count = 0usize;
        if st.open_used > 0 {
            self.seal_open(st);
            let State { open, stage, .. } = &mut *st;
            stage.as_mut_slice()[..STORE_BLOCK_BYTES].copy_from_slice(open.as_slice());
            count = 1;
        }
        if !st.parity.is_empty() {
            let seq = st.open_seq + count as u64;
            let State { parity, stage, .. } = &mut *st;
            let out = &mut stage.as_mut_slice()[count * STORE_BLOCK_BYTES..][..STORE_BLOCK_BYTES];
            parity.seal_into(out, PARITY_MAGIC, seq, self.layout.epoch, &[]);
            count += 1;
        }
        let first_seq = st.open_seq;
        st.open_seq += count as u64;
        st.open_used = 0;
        (first_seq, count)
    }

    /// The staged blocks as `(store block, bytes)` runs: one run, or two
    /// where the ring wraps between them.
    fn staged_runs<'a>(&self, st: &'a State, first_seq: u64, count: usize) -> Vec<(u64, &'a [u8])> {
        let mut runs = Vec::with_capacity(2);
        let mut done = 0;
        while done < count {
            let (at, contiguous) = self.layout.place_of(first_seq + done as u64);
            let n = (count - done).min(contiguous as usize);
            runs.push((
                at,
                &st.stage.as_slice()[done * STORE_BLOCK_BYTES..(done + n) * STORE_BLOCK_BYTES],
            ));
            done += n;
        }
        runs
    }

    /// Makes every record up to `pos` durable. One committer at a time
    /// writes the group (every block since the last parity, the open block,
    /// the parity block) and the flush after it, submitted together; the
    /// others wait on the durable mark — spinning briefly, then parked —
    /// and are woken only when it covers them (or, one of them, to lead
    /// the next group).
    pub fn commit(&self, pos: LogPosition) -> Result<()> {
        loop {
            if self.is_durable(pos) {
                return Ok(());
            }
            if self.can_lead(pos) {
                if let Some(led) = self.try_lead_commit(false) {
                    led?;
                    continue;
                }
            }
            // A group in flight may cover us; if it does not, we are woken
            // when a committer's slot frees, to lead the next group.
            self.durable_below
                .wait(pos.end_seq + 1, pos.end_seq, || self.can_lead(pos));
            if !self.is_durable(pos) {
                self.check_failed(&self.lock())?;
            }
        }
    }

    /// Whether a record ending at `pos` is in no group taken yet and a
    /// committer's slot is free: then its writer should lead a group.
    pub fn can_lead(&self, pos: LogPosition) -> bool {
        pos.end_seq >= self.staged_below.load(Ordering::Acquire)
            && self.leaders.load(Ordering::Acquire) < MAX_COMMIT_LEADERS
            && !self.is_durable(pos)
    }

    /// Every block below this is in a group a committer has taken.
    pub fn staged_below(&self) -> u64 {
        self.staged_below.load(Ordering::Acquire)
    }

    /// Commits one group unless every committer's slot is taken (then
    /// `None`): every record appended before it staged its group is durable
    /// once the groups before it are too. Waiters on the durable mark are
    /// woken as it covers them, and one more to lead the next group.
    ///
    /// With `gather`, the leader first lets other threads run while records
    /// keep arriving (up to [`GATHER_MAX_US`]), so that writers woken by the
    /// last commit join this group instead of waiting for the next.
    pub fn try_lead_commit(&self, gather: bool) -> Option<Result<u64>> {
        self.leaders
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_COMMIT_LEADERS).then_some(n + 1)
            })
            .ok()?;
        if gather {
            self.gather();
        }
        let led = self.lead_group();
        self.leaders.fetch_sub(1, Ordering::AcqRel);
        match &led {
            Ok(durable) => self
                .durable_below
                .advance(*durable, Some(self.staged_below())),
            Err(_) => self.durable_below.wake_all(),
        }
        Some(led)
    }

    /// Yields while other threads append, up to [`GATHER_MAX_US`].
    fn gather(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_micros(GATHER_MAX_US);
        let mut seen = self.appended.load(Ordering::Acquire);
        loop {
            std::thread::yield_now();
            let now = self.appended.load(Ordering::Acquire);
            if now == seen || std::time::Instant::now() >= deadline {
                return;
            }
            seen = now;
        }
    }

    /// Closes the group under the state lock, then writes it durable
    /// outside it (appends, and other groups, go on meanwhile). Returns
    /// the durable mark after it: every block below is durable.
    fn lead_group(&self) -> Result<u64> {
        let mut st = self.lock();
        self.check_failed(&st)?;
        // The durable write's flush covers only writes already complete.
        self.drain_early(&mut st)?;
        let (first_seq, count) = self.stage_group(&mut st);
        let start = st.group_start;
        let target = st.open_seq;
        st.group_start = target;
        self.staged_below.fetch_max(target, Ordering::AcqRel);
        if start == target {
            return Ok(self.last_durable());
        }
        let staged = self.copy_staged(&st, first_seq, count);
        drop(st);
        self.flushes.fetch_add(1, Ordering::Relaxed);
        if staged.is_empty() {
            // Blocks written early, closed or written through, nothing
            // open: a flush alone.
            if let Err(e) = self.dev.flush_holding(self.layout.ring[0].start_block) {
                self.lock().failed = Some(e.to_string());
                return Err(e);
            }
        } else {
            self.write_staged(&staged, true)?;
        }
        self.written_below.fetch_max(target, Ordering::AcqRel);
        self.through_below.fetch_max(target, Ordering::AcqRel);
        self.mirror_caught_up(target);
        // The mark moves over this group once every group before it is
        // durable too.
        let mut completed = self.completed.lock().unwrap_or_else(|p| p.into_inner());
        completed.insert(start, target);
        let mut durable = self.last_durable();
        while let Some(end) = completed.remove(&durable) {
            durable = end;
        }
        self.durable_below.advance(durable, None);
        Ok(durable)
    }
}

/// Takes in at least `min` completed early writes; the first failure is
/// returned, naming the store block it was for.
fn reap_early(engine: &mut dyn sluice_io::Engine, min: usize, block: u64) -> Result<()> {
    let mut done = Vec::new();
    engine
        .reap(min, &mut done)
        .map_err(|error| StoreError::Io { block, error })?;
    for c in done {
        if let Err(error) = c.result {
            return Err(StoreError::Io {
                block: c.user_data,
                error,
            });
        }
    }
    Ok(())
}

/// Bytes given as two slices one after the other: a record is its batch's
/// header and entries, copied into the log without being joined first.
#[derive(Debug, Clone, Copy)]
struct Pieces<'a>(&'a [u8], &'a [u8]);

impl<'a> Pieces<'a> {
    fn len(&self) -> usize {
        self.0.len() + self.1.len()
    }

    /// The first `n` bytes, and the rest.
    fn split_at(self, n: usize) -> (Pieces<'a>, Pieces<'a>) {
        if n <= self.0.len() {
            let (a, rest) = self.0.split_at(n);
            (Pieces(a, &[]), Pieces(rest, self.1))
        } else {
            let (b, rest) = self.1.split_at(n - self.0.len());
            (Pieces(self.0, b), Pieces(&[], rest))
        }
    }
}

fn put_fragment(st: &mut State, kind: u8, data: Pieces<'_>) {
    let at = HEADER_BYTES + st.open_used;
    let b = st.open.as_mut_slice();
    let mut crc = crc32c::crc32c(&[kind]);
    crc = crc32c::crc32c_append(crc, data.0);
    crc = crc32c::crc32c_append(crc, data.1);
    b[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    b[at + 4..at + 6].copy_from_slice(&(data.len() as u16).to_le_bytes());
    b[at + 6] = kind;
    let payload = at + FRAGMENT_HEADER_BYTES;
    b[payload..payload + data.0.len()].copy_from_slice(data.0);
    b[payload + data.0.len()..payload + data.len()].copy_from_slice(data.1);
    st.open_used += FRAGMENT_HEADER_BYTES + data.len();
}
