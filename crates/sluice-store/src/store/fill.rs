//! Point reads that do not wait for the device: a [`FillQueue`] keeps the
//! index and block reads of such reads in flight on engines of its own, one
//! per device of the set, and fills the caches as they complete. A server
//! worker asks [`Store::get_latest_or_miss`] without waiting, hands a miss
//! to its queue, serves its other clients, and asks again once the queue
//! reports the read done.

use super::*;
use sluice_io::{Completion, Direction, Engine, Request};

/// Reads one queue keeps in flight at most.
pub const FILL_QUEUE_DEPTH: usize = 64;
/// Most later misses that join one read in flight; past it a miss of the
/// same extent takes a read of its own.
pub const MAX_JOINED_PER_READ: usize = 1024;

/// A read in flight: what it is for, the caller's token, and the tokens
/// of later misses of the same extent that joined it.
struct InFlight {
    miss: CacheMiss,
    block: u64,
    token: u64,
    joined: Vec<u64>,
}

/// Reads for point reads that did not wait, in flight on the queue
/// owner's engines. Owned by one thread (the engines may be single-issuer
/// rings); dropping it waits for what is in flight.
pub struct FillQueue {
    dev: BlockDevice,
    /// One engine per device of the set, opened at its first read.
    engines: Vec<Option<Box<dyn Engine>>>,
    slots: Vec<Option<InFlight>>,
    free: Vec<usize>,
    done: Vec<Completion>,
}

impl std::fmt::Debug for FillQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FillQueue({} in flight)", self.in_flight())
    }
}

impl FillQueue {
    /// Reads in flight.
    pub fn in_flight(&self) -> usize {
        FILL_QUEUE_DEPTH - self.free.len()
    }

    /// Whether another read may start.
    pub fn has_room(&self) -> bool {
        !self.free.is_empty()
    }

    /// Starts reading what `miss` names; `token` comes back with it from
    /// [`FillQueue::reap`]. A miss of an extent already being read joins
    /// that read (its token comes back when it completes) and takes no
    /// room, up to [`MAX_JOINED_PER_READ`]. The caller checks
    /// [`FillQueue::has_room`] first.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: FillQueue::start without room"
    )]
    pub fn start(&mut self, miss: CacheMiss, token: u64) -> Result<()> {
        let (block, blocks) = miss.extent(&self.dev)?;
        let joinable = |r: &&mut InFlight| r.block == block && r.joined.len() < MAX_JOINED_PER_READ;
        if let Some(read) = self.slots.iter_mut().flatten().find(joinable) {
            read.joined.push(token);
            return Ok(());
        }
        let slot = self.free.pop().expect("FillQueue::start without room");
        match self.submit(block, blocks, slot) {
            Ok(()) => {
                self.slots[slot] = Some(InFlight {
                    miss,
                    block,
                    token,
                    joined: Vec::new(),
                });
                Ok(())
            }
            Err(e) => {
                self.free.push(slot);
                Err(e)
            }
        }
    }

    /// Reads left before the queue is full.
    pub fn room(&self) -> usize {
        self.free.len()
    }

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: opened above"
    )]
    fn submit(&mut self, block: u64, blocks: usize, slot: usize) -> Result<()> {
        let (member, lba) = self.dev.place(block, blocks)?;
        if self.engines[member].is_none() {
            self.engines[member] = Some(self.dev.own_polled_engine(block)?);
        }
        let engine = self.engines[member].as_mut().expect("opened above");
        let io = |error| StoreError::Io { block, error };
        let buf = engine
            .pool()
            .alloc(blocks * STORE_BLOCK_BYTES, Direction::Read)
            .map_err(io)?;
        engine
            .submit(Request::read(lba, buf, slot as u64))
            .map_err(|r| io(r.error))?;
        // Into the kernel now, without waiting for anything. The read is
        // the engine's from here: a failure to push it now leaves it for
        // the next reap, which reports it.
        if let Err(e) = engine.reap(0, &mut self.done) {
            log::warn!("submitting a point read of store block {block}: {e}");
        }
        Ok(())
    }

    /// Takes in the reads that completed, without waiting: each one's
    /// bytes go into the cache its miss names, and its token is pushed to
    /// `ready` with how that went (a failed read or a corrupt block is an
    /// error naming the block; asking again with waiting reports it too).
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a completion of a read in flight"
    )]
    pub fn reap(&mut self, ready: &mut Vec<(u64, Result<()>)>) -> Result<()> {
        for engine in self.engines.iter_mut().flatten() {
            if engine.in_flight() > 0 {
                engine.reap(0, &mut self.done).map_err(|error| {
                    StoreError::BadDevice(format!(
                        "taking in point reads' completions on {}: {error}",
                        engine.describe()
                    ))
                })?;
            }
        }
        // Drained, not dropped: the list keeps its room.
        let mut done = std::mem::take(&mut self.done);
        for c in done.drain(..) {
            let slot = c.user_data as usize;
            let read = self.slots[slot]
                .take()
                .expect("a completion of a read in flight");
            self.free.push(slot);
            let filled = self.fill(&read, c);
            for &token in &read.joined {
                let joined = match &filled {
                    Ok(()) => Ok(()),
                    Err(e) => Err(StoreError::BadDevice(format!(
                        "the read this point read joined failed: {e}"
                    ))),
                };
                ready.push((token, joined));
            }
            ready.push((read.token, filled));
        }
        self.done = done;
        Ok(())
    }

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a read returns its buffer"
    )]
    fn fill(&self, read: &InFlight, c: Completion) -> Result<()> {
        let block = read.block;
        let n = c.result.map_err(|error| StoreError::Io { block, error })?;
        let buf = c.buf.expect("a read returns its buffer");
        if n != buf.len() {
            return Err(StoreError::Io {
                block,
                error: sluice_io::IoError::ShortTransfer {
                    op: c.op.name(),
                    lba: c.lba,
                    done_bytes: n,
                    len_bytes: buf.len(),
                },
            });
        }
        match buf.as_slice() {
            Some(bytes) => read.miss.fill(&self.dev, bytes),
            None => {
                let mut bytes = vec![0u8; buf.len()];
                buf.read_at(0, &mut bytes);
                read.miss.fill(&self.dev, &bytes)
            }
        }
    }
}

impl Store {
    /// A queue for the index and block reads of point reads that do not
    /// wait ([`Store::get_latest_or_miss`]), for the calling thread.
    pub fn fill_queue(&self) -> FillQueue {
        FillQueue {
            dev: self.inner.dev.clone(),
            engines: (0..self.inner.dev.device_count()).map(|_| None).collect(),
            slots: (0..FILL_QUEUE_DEPTH).map(|_| None).collect(),
            free: (0..FILL_QUEUE_DEPTH).rev().collect(),
            done: Vec::new(),
        }
    }
}
