//! A connection's reads and writes in flight: each plain Read and Write of
//! an I/O queue goes to the device the moment its command (and, for a
//! write, its data) has arrived, on an engine the connection keeps for that
//! namespace, and its completion is reaped later — so a queue 32 deep keeps
//! 32 commands at the device, not one. A MultiCast goes the same way, one
//! write per namespace it names, answered when the last is done.
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
//! device; one engine per namespace the connection touches, each with its
//! pool's pinned memory (512 KiB of small blocks, 4 MiB chunks while
//! larger transfers need them, released when idle) — so pinned memory
//! grows with connections × namespaces, under the connection limit.

use crate::command::{Fuse, Sqe};
use crate::controller::{Subsystem, MAX_TRANSFER_BYTES, QUEUE_ENTRIES};
use crate::nvm::opcode;
use sluice_io::{Direction, Engine, IoBuf, IoError, Op, Priority, Request};
use std::collections::HashMap;
use std::io::{ErrorKind, IoSlice, Write};
use std::net::TcpStream;
use std::sync::Arc;

/// Most commands of one connection at the device at once (a queue's
/// entries: a host never has more outstanding).
pub const MAX_IN_FLIGHT: usize = QUEUE_ENTRIES as usize;

/// Most finished commands handed out to be answered together. A device may
/// complete a whole batch of commands at once; answered all together, the
/// host sends its next batch only after the last answer, and the device
/// idles meanwhile. Answered in groups, the host's next commands arrive
/// (and go to the device) while the rest are still being sent.
pub const ANSWER_GROUP: usize = 8;

/// A run of whole blocks of one namespace, checked to lie inside it and to
/// fit one transfer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockIo {
    pub(crate) nsid: u32,
    pub(crate) lba: u64,
    pub(crate) bytes: usize,
}

/// A command this path finished; `tag` is the front end's.
pub(crate) enum Finished {
    /// A read's data, in the buffer it landed in (exactly its length).
    Read { tag: u64, buf: IoBuf },
    /// A write, or a read that failed.
    Done { tag: u64, op: Op, ok: bool },
}

struct InFlight {
    tag: u64,
    nsid: u32,
    op: Op,
}

/// The I/O a connection keeps in flight, and the engines it keeps for it.
pub(crate) struct DataPath {
    subsystem: Arc<Subsystem>,
    /// By namespace (NSID − 1), opened at the first command for it.
    engines: Vec<Option<Box<dyn Engine>>>,
    /// Where the engines signal their completions (a connection worker's
    /// eventfd), if anywhere: they are then this thread's own rings, not
    /// the namespace's shared ones.
    completions: Option<std::os::fd::RawFd>,
    /// An engine could not signal its completions (the caller must wait on
    /// the device itself).
    unsignalled: bool,
    /// By namespace: the engine is this thread's own (closed at the end),
    /// not one taken from the namespace (given back).
    own_engine: Vec<bool>,
    /// By the request's tag; `None` slots are free.
    slots: Vec<Option<InFlight>>,
    free: Vec<usize>,
    in_flight: usize,
    reaped: Vec<sluice_io::Completion>,
    /// Finished and not yet handed out to be answered.
    backlog: std::collections::VecDeque<Finished>,
    /// Commands made of several requests (a MultiCast's writes), by tag:
    /// the requests still at the device and whether all so far succeeded.
    /// The command is answered once, when its last request is done.
    groups: HashMap<u64, Group>,
}

#[derive(Debug, Clone, Copy)]
struct Group {
    left: usize,
    ok: bool,
}

impl DataPath {
    /// A data path whose engines are the calling thread's own and signal
    /// their completions to `eventfd` (see [`DataPath::signals_completions`]);
    /// with `None`, engines shared with the namespace's other users. The
    /// eventfd must outlive the data path, which must stay on this thread.
    pub(crate) fn signalling(
        subsystem: Arc<Subsystem>,
        eventfd: Option<std::os::fd::RawFd>,
    ) -> DataPath {
        let namespaces = subsystem.namespace_count() as usize;
        DataPath {
            subsystem,
            completions: eventfd,
            unsignalled: eventfd.is_none(),
            own_engine: vec![false; namespaces],
            engines: (0..namespaces).map(|_| None).collect(),
            slots: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            reaped: Vec::new(),
            backlog: std::collections::VecDeque::new(),
            groups: HashMap::new(),
        }
    }

    /// Whether every completion of this data path is signalled to the
    /// eventfd it was made with, so a thread may sleep on that eventfd (and
    /// its sockets) instead of on the device.
    pub(crate) fn signals_completions(&self) -> bool {
        !self.unsignalled
    }

    /// Whether commands are at the device or finished and not yet handed
    /// out: the connection then waits for the device, not the host.
    pub(crate) fn busy(&self) -> bool {
        self.in_flight > 0 || !self.backlog.is_empty()
    }

    /// Issues what is queued, collects what finished (with `wait` and
    /// nothing finished yet, waiting for at least one command) and hands
    /// up to [`ANSWER_GROUP`] of them to `out`.
    pub(crate) fn next_group(&mut self, wait: bool, out: &mut Vec<Finished>) {
        let wait = wait && self.backlog.is_empty();
        let mut done = Vec::new();
        self.collect(wait, &mut done);
        self.backlog.extend(done);
        let n = self.backlog.len().min(ANSWER_GROUP);
        out.extend(self.backlog.drain(..n));
    }

    /// `blocks` blocks at `lba` of namespace `nsid`, when they lie inside
    /// it and fit one transfer.
    pub(crate) fn block_io(&self, nsid: u32, lba: u64, blocks: u64) -> Option<BlockIo> {
        let ns = self.subsystem.namespace(nsid)?;
        let end = lba.checked_add(blocks)?;
        let bytes = blocks.checked_mul(ns.block_size_bytes as u64)?;
        let fits = blocks > 0 && end <= ns.block_count && bytes <= MAX_TRANSFER_BYTES as u64;
        fits.then_some(BlockIo {
            nsid,
            lba,
            bytes: bytes as usize,
        })
    }

    /// The blocks of an NVMe Read or Write this path takes (not fused,
    /// inside the namespace, one transfer at most); `None` sends the
    /// command the slow way, which also answers every error.
    pub(crate) fn nvme_io(&self, sqe: &Sqe) -> Option<BlockIo> {
        if !matches!(sqe.opcode(), opcode::READ | opcode::WRITE) || sqe.fuse() != Fuse::None {
            return None;
        }
        let lba = sqe.cdw(10) as u64 | (sqe.cdw(11) as u64) << 32;
        self.block_io(sqe.nsid(), lba, (sqe.cdw(12) & 0xffff) as u64 + 1)
    }

    /// The blocks of a MultiCast this path takes, one run per namespace
    /// named (lowest NSID first): not fused, every namespace present, the
    /// range inside each and one transfer at most, the same length on
    /// each. `None` sends it the slow way, which answers every error.
    pub(crate) fn multicast_io(&self, sqe: &Sqe) -> Option<Vec<BlockIo>> {
        if sqe.opcode() != opcode::MULTICAST || sqe.fuse() != Fuse::None {
            return None;
        }
        let mask = sqe.cdw(13);
        let count = self.subsystem.namespace_count();
        if mask == 0 || (mask as u64) >> count != 0 {
            return None;
        }
        let lba = sqe.cdw(10) as u64 | (sqe.cdw(11) as u64) << 32;
        let blocks = (sqe.cdw(12) & 0xffff) as u64 + 1;
        let ios: Option<Vec<BlockIo>> = (1..=count)
            .filter(|n| mask & (1 << (n - 1)) != 0)
            .map(|n| self.block_io(n, lba, blocks))
            .collect();
        let ios = ios?;
        ios.iter().all(|io| io.bytes == ios[0].bytes).then_some(ios)
    }

    /// A pinned buffer for the data of a write of `io`; `None`: receive it
    /// the slow way.
    pub(crate) fn write_buffer(&mut self, io: &BlockIo) -> Option<IoBuf> {
        let engine = self.engine(io.nsid)?;
        let mut buf = engine.pool().alloc(io.bytes, Direction::Write).ok()?;
        buf.set_len(io.bytes);
        Some(buf)
    }

    /// Starts a read of `io` at the device. Returns `false` when it could
    /// not start (the caller runs it the slow way).
    pub(crate) fn start_read(&mut self, tag: u64, io: &BlockIo) -> bool {
        let Some(engine) = self.engine(io.nsid) else {
            return false;
        };
        let Ok(buf) = engine.pool().alloc(io.bytes, Direction::Read) else {
            return false;
        };
        self.submit(tag, io.nsid, Request::read(io.lba, buf, 0))
            .is_ok()
    }

    /// Starts a write of `io` whose data is in `buf` (from
    /// [`DataPath::write_buffer`]). Hands the buffer back when the write
    /// cannot start here (a Compare-and-Write holds or waits for the
    /// namespace, the engine refused it): the caller runs it the slow way.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a write keeps its buffer"
    )]
    pub(crate) fn start_write(&mut self, tag: u64, io: &BlockIo, buf: IoBuf) -> Result<(), IoBuf> {
        let Some(ns) = self.subsystem.namespace(io.nsid) else {
            return Err(buf);
        };
        if buf.len() != io.bytes || !ns.begin_write_in_flight() {
            return Err(buf);
        }
        match self.submit(tag, io.nsid, Request::write(io.lba, buf, 0)) {
            Ok(()) => Ok(()),
            Err(request) => {
                self.end_write(io.nsid);
                Err(request.buf.expect("a write keeps its buffer"))
            }
        }
    }

    /// Starts a MultiCast: the data in `buf` (from the first run's
    /// [`DataPath::write_buffer`]) written to every run of `ios` at once,
    /// answered when all are done. Each other namespace's write goes from a
    /// copy in its own engine's pinned pool (an engine takes only its own
    /// registered buffers): one copy in memory per extra namespace, still
    /// no byte back over the network. Hands the buffer back when it cannot
    /// start here (no room for every write, a Compare-and-Write holds a
    /// namespace, no buffer): the caller runs it the slow way.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: checked; a write keeps its buffer"
    )]
    pub(crate) fn start_multicast(
        &mut self,
        tag: u64,
        ios: &[BlockIo],
        buf: IoBuf,
    ) -> Result<(), IoBuf> {
        assert!(!ios.is_empty(), "a MultiCast names a namespace");
        if ios.len() == 1 {
            return self.start_write(tag, &ios[0], buf);
        }
        if buf.len() != ios[0].bytes
            || self.in_flight + ios.len() > MAX_IN_FLIGHT
            || self.groups.contains_key(&tag)
        {
            return Err(buf);
        }
        let mut copies = Vec::with_capacity(ios.len() - 1);
        for io in &ios[1..] {
            let Some(mut copy) = self.write_buffer(io) else {
                return Err(buf);
            };
            match buf.as_slice() {
                Some(data) => copy.write_at(0, data),
                None => copy.write_at(0, &buf.to_vec()),
            }
            copies.push(copy);
        }
        // Every namespace's write share, or none.
        let mut shared = 0;
        for io in ios {
            let ns = self.subsystem.namespace(io.nsid).expect("checked");
            if !ns.begin_write_in_flight() {
                break;
            }
            shared += 1;
        }
        if shared < ios.len() {
            ios[..shared].iter().for_each(|io| self.end_write(io.nsid));
            return Err(buf);
        }
        let buffers = std::iter::once(buf).chain(copies);
        let mut started = 0;
        for (i, (io, b)) in ios.iter().zip(buffers).enumerate() {
            match self.submit(tag, io.nsid, Request::write(io.lba, b, 0)) {
                Ok(()) => started += 1,
                Err(request) if i == 0 => {
                    ios.iter().for_each(|io| self.end_write(io.nsid));
                    return Err(request.buf.expect("a write keeps its buffer"));
                }
                Err(_) => self.end_write(io.nsid),
            }
        }
        // A write that could not start after the first did fails the
        // command once those that started are done.
        self.groups.insert(
            tag,
            Group {
                left: started,
                ok: started == ios.len(),
            },
        );
        Ok(())
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
            let own = self.completions.and_then(|fd| {
                let signalling = ns.io.open_thread_engine().and_then(|mut e| {
                    e.notify_completions(fd)?;
                    Ok(e)
                });
                signalling
                    .map_err(|e| {
                        log::warn!(
                            "namespace {nsid}: an engine of this thread's own could not be opened to signal its completions ({e}); using a shared one"
                        )
                    })
                    .ok()
            });
            if own.is_none() {
                self.unsignalled = true;
            }
            self.own_engine[nsid as usize - 1] = own.is_some();
            match own.map(Ok).unwrap_or_else(|| ns.io.take_engine()) {
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

    /// Queues `request` for the front end's `tag`, or hands it back if the
    /// engine refused it.
    #[allow(clippy::result_large_err)] // the request comes back whole, as Engine::submit's
    fn submit(&mut self, tag: u64, nsid: u32, mut request: Request) -> Result<(), Request> {
        if self.in_flight >= MAX_IN_FLIGHT {
            return Err(request);
        }
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        request.user_data = slot as u64;
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
            self.free.push(slot);
            return Err(request);
        }
        self.slots[slot] = Some(InFlight { tag, nsid, op });
        self.in_flight += 1;
        Ok(())
    }

    /// Issues what is queued and collects what is done into `out`: with
    /// `wait`, at least one command (when any is in flight).
    fn collect(&mut self, wait: bool, out: &mut Vec<Finished>) {
        let mut want = usize::from(wait && self.reaped.is_empty());
        let mut failed = false;
        for engine in self.engines.iter_mut().flatten() {
            if engine.in_flight() == 0 {
                continue;
            }
            let before = self.reaped.len();
            let min = want.min(engine.in_flight());
            if let Err(e) = engine.reap(min, &mut self.reaped) {
                log::error!("reaping the device's completions failed: {e}");
                failed = true;
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
        if failed {
            self.abandon(out);
        }
    }

    /// After a ring failed: closes every engine (which waits for the
    /// kernel to be done with their buffers, or leaks them) and fails every
    /// command still in flight, its write share given back.
    fn abandon(&mut self, out: &mut Vec<Finished>) {
        for engine in &mut self.engines {
            drop(engine.take());
        }
        // A group's command is answered once, for its first request here.
        let grouped: Vec<u64> = self.groups.drain().map(|(tag, _)| tag).collect();
        let mut answered_groups = Vec::new();
        for (slot, f) in self.slots.iter_mut().enumerate() {
            let Some(f) = f.take() else { continue };
            self.free.push(slot);
            if f.op == Op::Write {
                if let Some(ns) = self.subsystem.namespace(f.nsid) {
                    ns.end_write_in_flight();
                }
            }
            if grouped.contains(&f.tag) {
                if answered_groups.contains(&f.tag) {
                    continue;
                }
                answered_groups.push(f.tag);
            }
            out.push(Finished::Done {
                tag: f.tag,
                op: f.op,
                ok: false,
            });
        }
        self.in_flight = 0;
    }

    /// Waits for every command in flight and hands every finished one to
    /// `out`: before a command that must see their effects.
    pub(crate) fn drain(&mut self, out: &mut Vec<Finished>) {
        out.extend(self.backlog.drain(..));
        while self.in_flight > 0 {
            self.collect(true, out);
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
        if let Some(group) = self.groups.get_mut(&f.tag) {
            group.left -= 1;
            group.ok &= c.result.is_ok();
            if group.left > 0 {
                return None;
            }
            let ok = group.ok;
            self.groups.remove(&f.tag);
            return Some(Finished::Done {
                tag: f.tag,
                op: f.op,
                ok,
            });
        }
        match (f.op, c.result.is_ok(), c.buf) {
            (Op::Read, true, Some(buf)) => Some(Finished::Read { tag: f.tag, buf }),
            (op, ok, _) => Some(Finished::Done {
                tag: f.tag,
                op,
                ok: ok && op != Op::Read,
            }),
        }
    }
}

impl Drop for DataPath {
    fn drop(&mut self) {
        let mut out = Vec::new();
        self.drain(&mut out);
        for (i, engine) in self.engines.iter_mut().enumerate() {
            if let (Some(e), Some(ns)) = (engine.take(), self.subsystem.namespace(i as u32 + 1)) {
                // An engine of this thread's own is closed; only shared
                // ones go back to the namespace.
                if !self.own_engine[i] {
                    ns.io.give_back(e);
                }
            }
        }
    }
}

/// Bytes to send on a connection, with read data that goes out from the
/// I/O buffer it landed in: each `(at, buf)` is sent between `bytes[..at]`
/// and `bytes[at..]`, in order, in one `writev` where the socket takes it.
#[derive(Default)]
pub(crate) struct Outgoing {
    pub(crate) bytes: Vec<u8>,
    bufs: Vec<(usize, IoBuf)>,
    /// Bytes of the stream (`bytes` with the buffers spliced in) a
    /// non-blocking send has already sent ([`Outgoing::send_some`]).
    sent: usize,
}

impl Outgoing {
    /// Sends `buf`'s bytes at offset `at` of `bytes` (what comes after `at`
    /// follows them). A buffer in pieces is copied into `bytes` instead.
    pub(crate) fn insert(&mut self, at: usize, buf: IoBuf) {
        assert!(at <= self.bytes.len(), "inside the bytes to send");
        assert!(
            self.bufs.last().is_none_or(|(last, _)| *last <= at),
            "in order"
        );
        if buf.as_slice().is_some() {
            self.bufs.push((at, buf));
        } else {
            let tail = self.bytes.split_off(at);
            self.bytes.extend_from_slice(&buf.to_vec());
            self.bytes.extend_from_slice(&tail);
        }
    }

    /// Bytes still to send.
    pub(crate) fn pending_bytes(&self) -> usize {
        self.bytes.len() + self.bufs.iter().map(|(_, b)| b.len()).sum::<usize>() - self.sent
    }

    /// Sends what the socket takes now, without waiting (`stream` is
    /// non-blocking); returns whether everything has gone. What was sent is
    /// forgotten (its buffers go back to their pool); the rest, and what is
    /// added meanwhile, goes on the next call.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: kept only when contiguous"
    )]
    pub(crate) fn send_some(&mut self, mut stream: &TcpStream) -> std::io::Result<bool> {
        // The kernel takes at most IOV_MAX (1024) pieces per call.
        const MAX_PIECES: usize = 1024;
        while self.pending_bytes() > 0 {
            let mut slices = Vec::with_capacity((self.bufs.len() * 2 + 1).min(MAX_PIECES));
            let mut skip = self.sent;
            let mut pieces: Vec<&[u8]> = Vec::with_capacity(self.bufs.len() * 2 + 1);
            let mut from = 0;
            for (at, buf) in &self.bufs {
                pieces.push(&self.bytes[from..*at]);
                pieces.push(buf.as_slice().expect("kept only when contiguous"));
                from = *at;
            }
            pieces.push(&self.bytes[from..]);
            for piece in pieces {
                if skip >= piece.len() {
                    skip -= piece.len();
                    continue;
                }
                slices.push(IoSlice::new(&piece[skip..]));
                skip = 0;
                if slices.len() == MAX_PIECES {
                    break;
                }
            }
            match stream.write_vectored(&slices) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => {
                    drop(slices);
                    self.sent += n;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        self.forget_sent();
        Ok(self.pending_bytes() == 0)
    }

    /// Drops what has been sent from the front: whole buffers and the bytes
    /// before them; `sent` then counts only into what is left.
    fn forget_sent(&mut self) {
        if self.sent == self.bytes.len() + self.bufs.iter().map(|(_, b)| b.len()).sum::<usize>() {
            self.bytes.clear();
            self.bufs.clear();
            self.sent = 0;
            return;
        }
        let (mut consumed, mut from, mut whole_bufs) = (0usize, 0usize, 0usize);
        for (at, buf) in &self.bufs {
            let through = consumed + (at - from) + buf.len();
            if through > self.sent {
                break;
            }
            consumed = through;
            from = *at;
            whole_bufs += 1;
        }
        if whole_bufs == 0 {
            return;
        }
        self.bytes.drain(..from);
        self.bufs.drain(..whole_bufs);
        for (at, _) in &mut self.bufs {
            *at -= from;
        }
        self.sent -= consumed;
    }

    /// Copies up to `max_bytes` of what is still to send, in order, to the
    /// end of `dst` and counts it as sent (whole buffers sent go back to
    /// their pool); returns how many bytes it copied.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: kept only when contiguous"
    )]
    pub(crate) fn copy_out(&mut self, dst: &mut Vec<u8>, max_bytes: usize) -> usize {
        let mut skip = self.sent;
        let mut copied = 0;
        let mut from = 0;
        let mut pieces: Vec<&[u8]> = Vec::with_capacity(self.bufs.len() * 2 + 1);
        for (at, buf) in &self.bufs {
            pieces.push(&self.bytes[from..*at]);
            pieces.push(buf.as_slice().expect("kept only when contiguous"));
            from = *at;
        }
        pieces.push(&self.bytes[from..]);
        for piece in pieces {
            if copied == max_bytes {
                break;
            }
            if skip >= piece.len() {
                skip -= piece.len();
                continue;
            }
            let take = (piece.len() - skip).min(max_bytes - copied);
            dst.extend_from_slice(&piece[skip..skip + take]);
            copied += take;
            skip = 0;
        }
        self.sent += copied;
        self.forget_sent();
        copied
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    /// A stream of bytes with buffers spliced in, sent through a socket
    /// whose reader takes its time, arrives whole and in order, whatever
    /// the partial sends and what was added between them.
    #[test]
    fn partial_sends_keep_the_stream_in_order() {
        let pool = sluice_io::BufferPool::new(
            sluice_io::PoolConfig::default(),
            sluice_io::Pinning::Unpinned,
        )
        .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        const ROUNDS: usize = 200;
        let reader = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            let mut chunk = [0u8; 65536];
            loop {
                std::thread::sleep(std::time::Duration::from_micros(50));
                match s.read(&mut chunk).unwrap() {
                    0 => return got,
                    n => got.extend_from_slice(&chunk[..n]),
                }
            }
        });
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_nonblocking(true).unwrap();
        let mut out = Outgoing::default();
        let mut want = Vec::new();
        let mut partial_sends = 0;
        for round in 0..ROUNDS {
            let head = vec![round as u8; 24 + round % 7];
            out.bytes.extend_from_slice(&head);
            want.extend_from_slice(&head);
            let mut buf = pool
                .alloc(65536 * (1 + round % 2), Direction::Read)
                .unwrap();
            let fill: Vec<u8> = (0..buf.len()).map(|i| (i * 31 + round) as u8).collect();
            buf.write_at(0, &fill);
            out.insert(out.bytes.len(), buf);
            want.extend_from_slice(&fill);
            let tail = [0xee, round as u8];
            out.bytes.extend_from_slice(&tail);
            want.extend_from_slice(&tail);
            if !out.send_some(&stream).unwrap() {
                partial_sends += 1;
            }
            assert!(out.pending_bytes() <= want.len());
        }
        assert!(partial_sends > 0, "the socket took everything at once");
        while !out.send_some(&stream).unwrap() {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        assert_eq!(out.pending_bytes(), 0);
        assert!(out.bufs.is_empty() && out.bytes.is_empty());
        drop(stream);
        let got = reader.join().unwrap();
        assert_eq!(got.len(), want.len());
        assert!(got == want, "the stream arrived out of order");
    }
}
