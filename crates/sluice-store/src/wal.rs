//! The write-ahead log: a ring of extents holding 4096-byte log blocks,
//! early write of every block that fills, group commit, and recovery that
//! ends at the first block that is torn or from an earlier lap. Layout and
//! rules in docs/FORMAT.md ("Write-ahead log").

use crate::blocks::{
    block_buffer, block_is_sealed, seal_block, BlockDevice, Extent, STORE_BLOCK_BYTES,
};
use crate::error::{Result, StoreError};
use sluice_io::mem::AlignedMem;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

const MAGIC: &[u8; 4] = b"WALB";
const HEADER_BYTES: usize = 24;
const PAYLOAD_BYTES: usize = STORE_BLOCK_BYTES - HEADER_BYTES - 4;
/// crc u32, length u16, type u8.
const FRAGMENT_HEADER_BYTES: usize = 7;
/// Largest record (one write batch) the log takes.
pub const MAX_RECORD_BYTES: usize = 16 << 20;

const FULL: u8 = 1;
const FIRST: u8 = 2;
const MIDDLE: u8 = 3;
const LAST: u8 = 4;

/// Where a record ended: the sequence of the log block holding its last
/// fragment. The record is durable once `last_durable() > end_seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LogPosition {
    pub end_seq: u64,
}

/// The log's place on the device.
#[derive(Debug, Clone)]
pub struct WalLayout {
    pub ring: Vec<Extent>,
    /// Random per ring; blocks carrying another epoch never validate.
    pub epoch: u64,
}

impl WalLayout {
    pub fn ring_blocks(&self) -> u64 {
        self.ring.iter().map(|e| e.block_count as u64).sum()
    }

    /// The store block that log block `seq` occupies.
    fn block_of(&self, seq: u64) -> u64 {
        let mut pos = seq % self.ring_blocks();
        for e in &self.ring {
            if pos < e.block_count as u64 {
                return e.start_block + pos;
            }
            pos -= e.block_count as u64;
        }
        unreachable!("position inside the ring")
    }

    /// Zero-fills the ring once, so that later writes into it never change
    /// file metadata (on a file-backed device) and a flush of data suffices.
    pub fn format(&self, dev: &BlockDevice) -> Result<()> {
        let chunk_blocks = 256u64;
        let zeros = AlignedMem::new(chunk_blocks as usize * STORE_BLOCK_BYTES);
        for e in &self.ring {
            let mut at = e.start_block;
            while at < e.end_block() {
                let n = (e.end_block() - at).min(chunk_blocks) as usize;
                dev.write(at, &zeros.as_slice()[..n * STORE_BLOCK_BYTES])?;
                at += n as u64;
            }
        }
        dev.flush()
    }
}

struct State {
    open: AlignedMem,
    open_used: usize,
    open_seq: u64,
    /// Oldest log block still needed (its records are not yet in tables).
    tail_seq: u64,
    committing: bool,
    failed: Option<String>,
}

/// An open write-ahead log.
pub struct Wal {
    dev: BlockDevice,
    layout: WalLayout,
    state: Mutex<State>,
    commit_done: Condvar,
    /// Every log block below this sequence has been written.
    written_below: AtomicU64,
    /// Every log block below this sequence is durable.
    durable_below: AtomicU64,
    flushes: AtomicU64,
}

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
    pub fn open(dev: BlockDevice, layout: WalLayout, tail_seq: u64, next_seq: u64) -> Result<Self> {
        if layout.ring_blocks() < 2 {
            return Err(StoreError::BadDevice(
                "the WAL ring needs at least 2 blocks".into(),
            ));
        }
        assert!(tail_seq <= next_seq);
        Ok(Wal {
            dev,
            layout,
            state: Mutex::new(State {
                open: block_buffer(),
                open_used: 0,
                open_seq: next_seq,
                tail_seq,
                committing: false,
                failed: None,
            }),
            commit_done: Condvar::new(),
            written_below: AtomicU64::new(next_seq),
            durable_below: AtomicU64::new(next_seq),
            flushes: AtomicU64::new(0),
        })
    }

    /// Every log block below this sequence has been written (no system call).
    pub fn last_written(&self) -> u64 {
        self.written_below.load(Ordering::Acquire)
    }

    /// Every log block below this sequence is durable (no system call).
    pub fn last_durable(&self) -> u64 {
        self.durable_below.load(Ordering::Acquire)
    }

    pub fn is_durable(&self, pos: LogPosition) -> bool {
        self.last_durable() > pos.end_seq
    }

    /// Device flushes made so far: fewer than commits when commits group.
    pub fn flush_count(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// Writes the open block (padded) if it holds anything, so that every
    /// record appended so far lies before the returned sequence.
    pub fn close_block(&self) -> Result<u64> {
        let mut st = self.lock();
        self.check_failed(&st)?;
        if st.open_used > 0 {
            self.write_open(&mut st)?;
        }
        Ok(st.open_seq)
    }

    /// Log blocks before `seq` are no longer needed (their records are in tables).
    pub fn release_before(&self, seq: u64) {
        let mut st = self.lock();
        assert!(seq <= st.open_seq, "releasing log blocks not yet written");
        st.tail_seq = st.tail_seq.max(seq);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends one record. Blocks that fill are written at once; the record
    /// is durable only after [`Wal::commit`] of its position returns.
    pub fn append(&self, record: &[u8]) -> Result<LogPosition> {
        if record.len() > MAX_RECORD_BYTES {
            return Err(StoreError::RecordTooLarge {
                len_bytes: record.len(),
                max_bytes: MAX_RECORD_BYTES,
            });
        }
        let mut st = self.lock();
        self.check_failed(&st)?;
        // Room check before any byte is placed, so a record is all or nothing.
        let fragments = record
            .len()
            .div_ceil(PAYLOAD_BYTES - FRAGMENT_HEADER_BYTES)
            .max(1);
        let worst_blocks = (fragments + 1) as u64;
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
            put_fragment(&mut st, kind, &rest[..take]);
            rest = &rest[take..];
            first = false;
            if last {
                break;
            }
        }
        let pos = LogPosition {
            end_seq: st.open_seq,
        };
        if PAYLOAD_BYTES - st.open_used < FRAGMENT_HEADER_BYTES + 1 {
            self.write_open(&mut st)?;
        }
        Ok(pos)
    }

    fn check_failed(&self, st: &State) -> Result<()> {
        match &st.failed {
            Some(why) => Err(StoreError::BadDevice(format!(
                "the write-ahead log failed earlier and takes no more writes: {why}; reopen the store to recover"
            ))),
            None => Ok(()),
        }
    }

    /// Seals the open block, writes it at its ring position and opens the next.
    fn write_open(&self, st: &mut State) -> Result<()> {
        let seq = st.open_seq;
        let used = st.open_used;
        let epoch = self.layout.epoch;
        let b = st.open.as_mut_slice();
        b[0..4].copy_from_slice(MAGIC);
        b[4..6].copy_from_slice(&(used as u16).to_le_bytes());
        b[6..8].fill(0);
        b[8..16].copy_from_slice(&seq.to_le_bytes());
        b[16..24].copy_from_slice(&epoch.to_le_bytes());
        b[HEADER_BYTES + used..STORE_BLOCK_BYTES - 4].fill(0);
        seal_block(b);
        if let Err(e) = self
            .dev
            .write(self.layout.block_of(seq), st.open.as_slice())
        {
            st.failed = Some(e.to_string());
            return Err(e);
        }
        st.open_seq += 1;
        st.open_used = 0;
        self.written_below.store(st.open_seq, Ordering::Release);
        Ok(())
    }

    /// Makes every record up to `pos` durable. Concurrent callers share one
    /// write and one flush.
    pub fn commit(&self, pos: LogPosition) -> Result<()> {
        loop {
            if self.is_durable(pos) {
                return Ok(());
            }
            let mut st = self.lock();
            self.check_failed(&st)?;
            if st.committing {
                // Another caller is flushing; its flush may cover us.
                let _st = self.commit_done.wait(st).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            if self.is_durable(pos) {
                return Ok(());
            }
            st.committing = true;
            // The open block holds the record (or later ones): write it padded.
            let result = if st.open_seq <= pos.end_seq && st.open_used > 0 {
                self.write_open(&mut st)
            } else {
                Ok(())
            };
            let target = st.open_seq;
            drop(st);
            let result = result.and_then(|()| {
                self.flushes.fetch_add(1, Ordering::Relaxed);
                // The ring lives on the first device: only it is flushed.
                self.dev.flush_holding(self.layout.ring[0].start_block)
            });
            let mut st = self.lock();
            st.committing = false;
            match &result {
                Ok(()) => {
                    self.durable_below.fetch_max(target, Ordering::AcqRel);
                }
                Err(e) => st.failed = Some(e.to_string()),
            }
            drop(st);
            self.commit_done.notify_all();
            result?;
        }
    }
}

fn put_fragment(st: &mut State, kind: u8, data: &[u8]) {
    let at = HEADER_BYTES + st.open_used;
    let b = st.open.as_mut_slice();
    let mut crc = crc32c::crc32c(&[kind]);
    crc = crc32c::crc32c_append(crc, data);
    b[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    b[at + 4..at + 6].copy_from_slice(&(data.len() as u16).to_le_bytes());
    b[at + 6] = kind;
    b[at + FRAGMENT_HEADER_BYTES..at + FRAGMENT_HEADER_BYTES + data.len()].copy_from_slice(data);
    st.open_used += FRAGMENT_HEADER_BYTES + data.len();
}

/// What recovery found.
#[derive(Debug)]
pub struct Recovered {
    /// Complete records, in log order, with where each ended.
    pub records: Vec<(LogPosition, Vec<u8>)>,
    /// The first log block sequence that did not validate: append from here.
    pub next_seq: u64,
}

/// Reads the log from `start_seq` until the first block that is torn, never
/// written, from an earlier lap or another ring. A record whose fragments
/// do not complete is dropped: its commit never returned.
pub fn recover(dev: &BlockDevice, layout: &WalLayout, start_seq: u64) -> Result<Recovered> {
    let mut records = Vec::new();
    let mut partial: Option<Vec<u8>> = None;
    let mut buf = block_buffer();
    let mut seq = start_seq;
    while seq - start_seq < layout.ring_blocks() {
        let block = layout.block_of(seq);
        dev.read(block, buf.as_mut_slice())?;
        let b = buf.as_slice();
        let valid = &b[0..4] == MAGIC
            && block_is_sealed(b)
            && u64::from_le_bytes(b[8..16].try_into().expect("8")) == seq
            && u64::from_le_bytes(b[16..24].try_into().expect("8")) == layout.epoch;
        if !valid {
            break;
        }
        let used = u16::from_le_bytes(b[4..6].try_into().expect("2")) as usize;
        let corrupt = |reason: String| StoreError::Corrupt {
            what: "WAL block",
            block,
            lba: dev.lba_of(block),
            reason,
        };
        if used > PAYLOAD_BYTES {
            return Err(corrupt(format!(
                "payload length {used} exceeds {PAYLOAD_BYTES}"
            )));
        }
        let mut at = HEADER_BYTES;
        let end = HEADER_BYTES + used;
        while at < end {
            if end - at < FRAGMENT_HEADER_BYTES {
                return Err(corrupt("truncated fragment header".into()));
            }
            let crc = u32::from_le_bytes(b[at..at + 4].try_into().expect("4"));
            let len = u16::from_le_bytes(b[at + 4..at + 6].try_into().expect("2")) as usize;
            let kind = b[at + 6];
            let data_at = at + FRAGMENT_HEADER_BYTES;
            if data_at + len > end {
                return Err(corrupt(format!(
                    "fragment of {len} bytes runs past the payload"
                )));
            }
            let data = &b[data_at..data_at + len];
            if crc32c::crc32c_append(crc32c::crc32c(&[kind]), data) != crc {
                return Err(corrupt("fragment checksum mismatch".into()));
            }
            let pos = LogPosition { end_seq: seq };
            match kind {
                FULL => {
                    partial = None;
                    records.push((pos, data.to_vec()));
                }
                FIRST => partial = Some(data.to_vec()),
                MIDDLE | LAST => match partial.as_mut() {
                    Some(p) => {
                        p.extend_from_slice(data);
                        if kind == LAST {
                            records.push((pos, partial.take().expect("partial record")));
                        }
                    }
                    // The record began before start_seq: not ours to replay.
                    None => {}
                },
                other => return Err(corrupt(format!("unknown fragment type {other}"))),
            }
            at = data_at + len;
        }
        seq += 1;
    }
    Ok(Recovered {
        records,
        next_seq: seq,
    })
}
