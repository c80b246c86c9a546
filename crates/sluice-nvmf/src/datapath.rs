//! A connection's reads and writes in flight: each plain Read and Write of
//! an I/O queue goes to the device the moment its command (and, for a
//! write, its data) has arrived, on an engine the connection keeps for that
//! namespace, and its completion is reaped later — so a queue 32 deep keeps
//! 32 commands at the device, not one.
//!
//! The data stays in the engine's pinned pool buffers: a write's data is
//! received into one and written from it (registered, fixed-buffer I/O);
//! a read lands in one and is sent from it. Every other command (and a
//! Read or Write this path does not take: bad ranges, lengths, a fused
//! half) runs as before, after the connection's I/O in flight is reaped,
//! so the order hosts may rely on (Flush after completed writes, a fused
//! Compare-and-Write against every write) is kept.
//!
//! Limits: at most [`MAX_IN_FLIGHT`] commands of a connection at the
//! device; one engine per namespace the connection touches.

use crate::command::{status, Completion, Fuse, Sqe, Status};
use crate::controller::{Namespace, Subsystem, MAX_TRANSFER_BYTES, QUEUE_ENTRIES};
use crate::nvm::opcode;
use sluice_io::{Direction, Engine, IoBuf, IoError, Op, Priority, Request};
use std::sync::Arc;

/// Most commands of one connection at the device at once (a queue's
/// entries: a host never has more outstanding).
pub const MAX_IN_FLIGHT: usize = QUEUE_ENTRIES as usize;

/// A command this path finished.
pub(crate) enum Finished {
    /// A read's data, in the buffer it landed in, and its completion.
    Read {
        /// The command.
        cid: u16,
        /// The data (exactly the command's length).
        buf: IoBuf,
    },
    /// A completion with no data (a write, or a failed read).
    Done(Completion),
}

struct InFlight {
    cid: u16,
    nsid: u32,
    op: Op,
}

/// The I/O a connection keeps in flight, and the engines it keeps for it.
pub(crate) struct DataPath {
    subsystem: Arc<Subsystem>,
    /// By namespace (NSID − 1), opened at the first command for it.
    engines: Vec<Option<Box<dyn Engine>>>,
    /// By the request's tag; `None` slots are free.
    slots: Vec<Option<InFlight>>,
    free: Vec<usize>,
    in_flight: usize,
    reaped: Vec<sluice_io::Completion>,
}

impl DataPath {
    pub(crate) fn new(subsystem: Arc<Subsystem>) -> DataPath {
        let namespaces = subsystem.namespace_count() as usize;
        DataPath {
            subsystem,
            engines: (0..namespaces).map(|_| None).collect(),
            slots: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            reaped: Vec::new(),
        }
    }

    /// Commands at the device.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The namespace of a Read or Write this path takes, with its first
    /// block and length in bytes; `None` sends the command the slow way
    /// (which also answers every error).
    fn plain_io(&self, sqe: &Sqe) -> Option<(&Namespace, u64, usize)> {
        if !matches!(sqe.opcode(), opcode::READ | opcode::WRITE) || sqe.fuse() != Fuse::None {
            return None;
        }
        let ns = self.subsystem.namespace(sqe.nsid())?;
        let lba = sqe.cdw(10) as u64 | (sqe.cdw(11) as u64) << 32;
        let blocks = (sqe.cdw(12) & 0xffff) as u64 + 1;
        let end = lba.checked_add(blocks)?;
        let bytes = blocks as usize * ns.block_size_bytes as usize;
        (end <= ns.block_count && bytes <= MAX_TRANSFER_BYTES).then_some((ns, lba, bytes))
    }

    /// A pinned buffer for a Write's data, when this path will run it:
    /// `len_bytes` must be the command's length. `None`: receive it the
    /// slow way.
    pub(crate) fn write_buffer(&mut self, sqe: &Sqe, len_bytes: usize) -> Option<IoBuf> {
        let (_, _, bytes) = self.plain_io(sqe)?;
        if sqe.opcode() != opcode::WRITE || bytes != len_bytes {
            return None;
        }
        let engine = self.engine(sqe.nsid())?;
        let mut buf = engine.pool().alloc(len_bytes, Direction::Write).ok()?;
        buf.set_len(len_bytes);
        Some(buf)
    }

    /// Starts a Read at the device. Returns `false` when this path does not
    /// take it (the caller runs it the slow way).
    pub(crate) fn start_read(&mut self, sqe: &Sqe) -> bool {
        let Some((_, lba, bytes)) = self.plain_io(sqe) else {
            return false;
        };
        if sqe.opcode() != opcode::READ || sqe.sgl().length as usize != bytes {
            return false;
        }
        let nsid = sqe.nsid();
        let Some(engine) = self.engine(nsid) else {
            return false;
        };
        let Ok(buf) = engine.pool().alloc(bytes, Direction::Read) else {
            return false;
        };
        self.submit(sqe.cid(), nsid, Request::read(lba, buf, 0))
            .is_ok()
    }

    /// Starts a Write whose data is in `buf` (from [`DataPath::write_buffer`]).
    /// Hands the buffer back when the write cannot start here (a
    /// Compare-and-Write holds or waits for the namespace, the engine
    /// refused it): the caller runs it the slow way.
    pub(crate) fn start_write(&mut self, sqe: &Sqe, buf: IoBuf) -> Result<(), IoBuf> {
        let Some((ns, lba, bytes)) = self.plain_io(sqe) else {
            return Err(buf);
        };
        if sqe.opcode() != opcode::WRITE || buf.len() != bytes || !ns.begin_write_in_flight() {
            return Err(buf);
        }
        match self.submit(sqe.cid(), sqe.nsid(), Request::write(lba, buf, 0)) {
            Ok(()) => Ok(()),
            Err(request) => {
                self.end_write(sqe.nsid());
                Err(request.buf.expect("a write keeps its buffer"))
            }
        }
    }

    fn end_write(&self, nsid: u32) {
        if let Some(ns) = self.subsystem.namespace(nsid) {
            ns.end_write_in_flight();
        }
    }

    fn engine(&mut self, nsid: u32) -> Option<&mut Box<dyn Engine>> {
        let ns = self.subsystem.namespace(nsid)?;
        let slot = self.engines.get_mut(nsid as usize - 1)?;
        if slot.is_none() {
            match ns.io.take_engine() {
                Ok(e) => *slot = Some(e),
                Err(e) => {
                    log::warn!(
                        "namespace {nsid}: no engine for queued I/O ({e}); its commands run one at a time"
                    );
                    return None;
                }
            }
        }
        slot.as_mut()
    }

    /// Queues `request` for command `cid`, or hands it back if the engine
    /// refused it.
    #[allow(clippy::result_large_err)] // the request comes back whole, as Engine::submit's
    fn submit(&mut self, cid: u16, nsid: u32, mut request: Request) -> Result<(), Request> {
        if self.in_flight >= MAX_IN_FLIGHT {
            return Err(request);
        }
        let tag = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        request.user_data = tag as u64;
        request.priority = Priority::High;
        let op = request.op;
        let refused = match self.engines[nsid as usize - 1].as_mut() {
            None => Some(request),
            Some(engine) => loop {
                match engine.submit(request) {
                    Ok(()) => break None,
                    Err(r) if matches!(r.error, IoError::QueueFull { .. }) => {
                        // Make room: reap what is done (at least one).
                        request = r.request;
                        if let Err(e) = engine.reap(1, &mut self.reaped) {
                            log::warn!("namespace {nsid}: reaping to make room failed: {e}");
                            break Some(request);
                        }
                    }
                    Err(r) => {
                        log::warn!(
                            "namespace {nsid}: the engine refused a request: {}",
                            r.error
                        );
                        break Some(r.request);
                    }
                }
            },
        };
        if let Some(request) = refused {
            self.free.push(tag);
            return Err(request);
        }
        self.slots[tag] = Some(InFlight { cid, nsid, op });
        self.in_flight += 1;
        Ok(())
    }

    /// Issues what is queued and collects what is done into `out`: with
    /// `wait`, at least one command (when any is in flight).
    pub(crate) fn collect(&mut self, wait: bool, out: &mut Vec<Finished>) {
        let mut want = usize::from(wait && self.reaped.is_empty());
        for engine in self.engines.iter_mut().flatten() {
            if engine.in_flight() == 0 {
                continue;
            }
            let before = self.reaped.len();
            let min = want.min(engine.in_flight());
            if let Err(e) = engine.reap(min, &mut self.reaped) {
                log::warn!("reaping the device's completions failed: {e}");
            }
            if self.reaped.len() > before {
                want = 0;
            }
        }
        for c in std::mem::take(&mut self.reaped) {
            if let Some(done) = self.finish(c) {
                out.push(done);
            }
        }
    }

    /// Waits for every command in flight, collecting them into `out`.
    pub(crate) fn drain(&mut self, out: &mut Vec<Finished>) {
        let mut stuck = 0;
        while self.in_flight > 0 {
            let before = self.in_flight;
            self.collect(true, out);
            stuck = if self.in_flight == before {
                stuck + 1
            } else {
                0
            };
            assert!(stuck < 1000, "the device stopped completing requests");
        }
    }

    fn finish(&mut self, c: sluice_io::Completion) -> Option<Finished> {
        let Some(f) = self
            .slots
            .get_mut(c.user_data as usize)
            .and_then(Option::take)
        else {
            log::error!(
                "a completion for no request in flight (tag {})",
                c.user_data
            );
            return None;
        };
        self.free.push(c.user_data as usize);
        self.in_flight -= 1;
        if f.op == Op::Write {
            self.end_write(f.nsid);
        }
        let status = match (&c.result, f.op) {
            (Ok(_), _) => Status::SUCCESS,
            (Err(_), Op::Read) => status::UNRECOVERED_READ,
            (Err(_), _) => status::WRITE_FAULT,
        };
        match (f.op, c.buf) {
            (Op::Read, Some(buf)) if status == Status::SUCCESS => {
                Some(Finished::Read { cid: f.cid, buf })
            }
            _ => Some(Finished::Done(Completion::new(f.cid, status))),
        }
    }
}

impl Drop for DataPath {
    fn drop(&mut self) {
        let mut out = Vec::new();
        self.drain(&mut out);
        for (i, engine) in self.engines.iter_mut().enumerate() {
            if let (Some(e), Some(ns)) = (engine.take(), self.subsystem.namespace(i as u32 + 1)) {
                ns.io.give_back(e);
            }
        }
    }
}
