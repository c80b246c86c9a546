//! [`DeviceIo`]: blocking I/O on one device from any thread, through the
//! engine and the pool — the one way the crates above do a device I/O when
//! they want to wait for it (the store's log, tables, manifest and
//! superblock; the exporter's pages and checkpoints).
//!
//! A `DeviceIo` keeps a few idle engines. Each call leases one (opening a
//! new one when all are busy), submits its requests, reaps them and gives
//! the engine back, so threads never share a ring and never wait for each
//! other's I/O. Callers that want deep queues lease an engine and drive it
//! themselves ([`DeviceIo::lease`]).
//!
//! Every request carries a [`Priority`]: the engine's gate and the kernel's
//! ioprio (the engine's `high_ioprio`/`low_ioprio`) both see it.
//!
//! [`DeviceIo::start_read`] is the one exception to blocking: it submits a
//! read on an engine of its own and returns a [`PendingRead`] to finish
//! later, so a scan reads its next run while it walks the current one.
//!
//! [`write_bufs_on`] writes buffers a caller filled in an engine's own pool
//! (from any thread: the pool is shared, the ring is not) where they lie:
//! the exporter builds each page in one and hands it to the kernel with no
//! copy.
//!
//! [`DeviceIo::write_durable`] submits the writes and a flush ordered after
//! them ([`Request::flush_after_prior`]) together and waits for all of them:
//! one `io_uring_enter` makes the bytes durable.

use crate::device::Device;
use crate::engine::{open_engine, Completion, Engine, EngineConfig, Priority, Request};
use crate::error::{IoError, Result};
use crate::mem::AlignedMem;
use crate::pool::{Direction, IoBuf};
use std::sync::{Arc, Mutex};

/// Engines kept idle per device by default; more concurrent callers open
/// and drop their own.
pub const DEFAULT_MAX_IDLE_ENGINES: usize = 8;
/// Bytes one request of a long write or read carries: a long run goes out
/// as several requests in flight at once.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;
/// Requests one call keeps in flight at most (with [`MAX_REQUEST_BYTES`],
/// 16 MiB of buffers), whatever the engine's queue depth.
pub const MAX_REQUESTS_IN_FLIGHT: usize = 16;
/// Bytes one [`Priority::Low`] request carries, and how many of them one
/// call keeps in flight. The device serves the store's engines in the
/// order requests reach it, so a foreground read that comes behind a
/// flush's or a compaction's I/O waits for what they have queued: up to
/// 16 MiB with 16 requests of 1 MiB, at most 512 KiB with 2 of 256 KiB.
/// Fewer bytes in flight also pin less memory (docs/BENCHMARKS.md, "A
/// data set four times the memory, in its memory group").
pub const LOW_REQUEST_BYTES: usize = 256 << 10;
/// See [`LOW_REQUEST_BYTES`].
pub const LOW_REQUESTS_IN_FLIGHT: usize = 2;

/// The largest request and the most requests in flight for `priority`.
fn request_limits(priority: Priority) -> (usize, usize) {
    match priority {
        Priority::High => (MAX_REQUEST_BYTES, MAX_REQUESTS_IN_FLIGHT),
        Priority::Low => (LOW_REQUEST_BYTES, LOW_REQUESTS_IN_FLIGHT),
    }
}

/// How [`DeviceIo::write_durable`] makes writes durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurableWrites {
    /// The writes, then a flush ordered after them (IOSQE_IO_DRAIN),
    /// submitted together.
    OrderedFlush,
    /// A single write with RWF_DSYNC (FUA where the device has it);
    /// several writes still take an ordered flush.
    Dsync,
}

impl DurableWrites {
    /// `SLUICE_DURABLE_WRITES=dsync|ordered-flush` picks one for a run;
    /// the default is the faster one here (docs/BENCHMARKS.md).
    pub fn from_env() -> Self {
        match std::env::var("SLUICE_DURABLE_WRITES").as_deref() {
            Ok("ordered-flush") => DurableWrites::OrderedFlush,
            Ok("dsync") => DurableWrites::Dsync,
            _ => DurableWrites::DEFAULT,
        }
    }

    /// What `write_durable` does unless `SLUICE_DURABLE_WRITES` says otherwise.
    pub const DEFAULT: DurableWrites = DurableWrites::Dsync;
}

/// Blocking, thread-safe I/O on one device through leased engines.
pub struct DeviceIo {
    durable_writes: DurableWrites,
    device: Arc<dyn Device>,
    config: EngineConfig,
    idle: Mutex<Vec<Box<dyn Engine>>>,
    max_idle_engines: usize,
    describe: String,
}

impl std::fmt::Debug for DeviceIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceIo({}, {})", self.device.describe(), self.describe)
    }
}

/// An engine leased from a [`DeviceIo`]; returned on drop when nothing is
/// left in flight on it (else dropped, which drains it).
pub struct EngineLease<'a> {
    io: &'a DeviceIo,
    engine: Option<Box<dyn Engine>>,
}

impl std::ops::Deref for EngineLease<'_> {
    type Target = dyn Engine;
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: leased engine"
    )]
    fn deref(&self) -> &Self::Target {
        self.engine.as_deref().expect("leased engine")
    }
}

impl std::ops::DerefMut for EngineLease<'_> {
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: leased engine"
    )]
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.engine.as_deref_mut().expect("leased engine")
    }
}

impl Drop for EngineLease<'_> {
    fn drop(&mut self) {
        if let Some(engine) = self.engine.take() {
            self.io.give_back(engine);
        }
    }
}

impl DeviceIo {
    /// Opens the first engine at once, so a missing feature or a refused
    /// setting is reported here and not at the first I/O. Engines move
    /// between threads, so `defer_taskrun` (a single-issuer ring) is off.
    pub fn open(device: Arc<dyn Device>, config: EngineConfig) -> Result<Self> {
        Self::with_idle(device, config, DEFAULT_MAX_IDLE_ENGINES)
    }

    /// As [`DeviceIo::open`], keeping at most `max_idle_engines` idle engines.
    pub fn with_idle(
        device: Arc<dyn Device>,
        mut config: EngineConfig,
        max_idle_engines: usize,
    ) -> Result<Self> {
        config.defer_taskrun = false;
        // Requests go to the kernel from `reap`, with the wait: a call
        // makes one `io_uring_enter` for all it submits, not one more each.
        config.submit_batch = config.queue_depth;
        let first = open_engine(device.clone(), &config)?;
        let describe = first.describe();
        Ok(DeviceIo {
            durable_writes: DurableWrites::from_env(),
            device,
            config,
            idle: Mutex::new(vec![first]),
            max_idle_engines: max_idle_engines.max(1),
            describe,
        })
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// The device's logical block size.
    pub fn block_size_bytes(&self) -> usize {
        self.device.geometry().block_size_bytes as usize
    }

    /// The engine in use, as [`Engine::describe`] says it.
    pub fn describe(&self) -> &str {
        &self.describe
    }

    /// How `write_durable` makes writes durable.
    pub fn durable_writes(&self) -> DurableWrites {
        self.durable_writes
    }

    /// The configuration each engine is opened with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// An engine for this thread alone until the lease is dropped.
    pub fn lease(&self) -> Result<EngineLease<'_>> {
        Ok(EngineLease {
            io: self,
            engine: Some(self.take_engine()?),
        })
    }

    /// Reads `out.len()` bytes (whole blocks) at `lba`.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a read returns its buffer"
    )]
    pub fn read(&self, lba: u64, out: &mut [u8], priority: Priority) -> Result<()> {
        let mut engine = self.lease()?;
        let pieces = self.pieces(lba, out.len(), priority);
        let in_flight = engine.queue_depth().min(request_limits(priority).1);
        let mut done = Vec::new();
        let mut submitted = 0;
        let mut next = 0;
        while next < pieces.len() || submitted > 0 {
            while next < pieces.len() && submitted < in_flight {
                let (at, offset, len) = pieces[next];
                let buf = engine.pool().alloc(len, Direction::Read)?;
                let request = Request::read(at, buf, offset as u64).with_priority(priority);
                engine.submit(request).map_err(|r| r.error)?;
                submitted += 1;
                next += 1;
            }
            done.clear();
            submitted -= engine.reap(1, &mut done)?;
            for c in done.drain(..) {
                let offset = c.user_data as usize;
                let buf = checked(c)?.expect("a read returns its buffer");
                buf.read_at(0, &mut out[offset..offset + buf.len()]);
            }
        }
        Ok(())
    }

    /// Starts reading `len` bytes (whole blocks) at `lba` on an engine of
    /// its own and returns at once: the read goes on while the caller works,
    /// and [`PendingRead::finish`] waits for it (read-ahead). Dropping the
    /// pending read waits for it too, then gives the engine back.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: leased engine"
    )]
    pub fn start_read(
        self: &Arc<Self>,
        lba: u64,
        len: usize,
        priority: Priority,
    ) -> Result<PendingRead> {
        let pieces = self.pieces(lba, len, priority);
        let mut pending = PendingRead {
            io: self.clone(),
            engine: None,
            lba,
            len,
            priority,
            pieces: pieces.len(),
            done: Vec::with_capacity(pieces.len()),
        };
        let mut engine = self.lease()?;
        if pieces.len() > engine.queue_depth().min(request_limits(priority).1) {
            // Too long to have in flight at once: read whole at `finish`.
            return Ok(pending);
        }
        let mut engine = engine.engine.take().expect("leased engine");
        for &(at, offset, n) in &pieces {
            let buf = engine.pool().alloc(n, Direction::Read)?;
            let request = Request::read(at, buf, offset as u64).with_priority(priority);
            engine.submit(request).map_err(|r| r.error)?;
        }
        // Issues the reads without waiting for them.
        engine.reap(0, &mut pending.done)?;
        pending.engine = Some(engine);
        Ok(pending)
    }

    /// An engine of this device's for the caller to keep, for requests it
    /// keeps in flight across calls (a storage node's connection submits
    /// each command as it arrives and reaps the completions later). Opened
    /// with this `DeviceIo`'s configuration, so it may move between
    /// threads; give it back with [`DeviceIo::give_back`] once nothing is
    /// in flight on it.
    pub fn take_engine(&self) -> Result<Box<dyn Engine>> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match idle {
            Some(e) => Ok(e),
            None => open_engine(self.device.clone(), &self.config),
        }
    }

    /// An engine of this device's bound to the calling thread: a
    /// single-issuer ring (`defer_taskrun`) whose completions can be
    /// signalled to an eventfd ([`Engine::notify_completions`]), for a
    /// thread that serves many connections from one epoll set. Opened
    /// fresh, not from the idle engines, and never to be given back (other
    /// threads could not use it): drop it when done.
    pub fn open_thread_engine(&self) -> Result<Box<dyn Engine>> {
        let mut config = self.config.clone();
        config.defer_taskrun = true;
        open_engine(self.device.clone(), &config)
    }

    /// Takes back an engine from [`DeviceIo::take_engine`] to serve later
    /// calls; one with requests still in flight is closed instead (closing
    /// waits for them).
    pub fn give_back(&self, engine: Box<dyn Engine>) {
        if engine.in_flight() != 0 {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < self.max_idle_engines {
            idle.push(engine);
        }
    }

    /// Writes `data` (whole blocks) at `lba`; returns once the device has it
    /// (not yet durable: see [`DeviceIo::flush`] and [`DeviceIo::write_durable`]).
    pub fn write(&self, lba: u64, data: &[u8], priority: Priority) -> Result<()> {
        self.write_all(&[(lba, data)], priority, false)
    }

    /// Writes every `(lba, data)` run and then makes them durable, all
    /// submitted together: with io_uring, one system call.
    pub fn write_durable(&self, writes: &[(u64, &[u8])], priority: Priority) -> Result<()> {
        self.write_all(writes, priority, true)
    }

    /// Makes every completed write durable.
    pub fn flush(&self, priority: Priority) -> Result<()> {
        let mut engine = self.lease()?;
        checked(engine.run(Request::flush(0).with_priority(priority)))?;
        Ok(())
    }

    fn write_all(&self, writes: &[(u64, &[u8])], priority: Priority, durable: bool) -> Result<()> {
        let runs: Vec<(u64, &[u8], usize)> = writes.iter().map(|&(l, d)| (l, d, d.len())).collect();
        self.write_runs(&runs, 0, priority, durable)
    }

    /// Writes each `(lba, data, len)` run: `data` then `pad` up to `len`.
    fn write_runs(
        &self,
        writes: &[(u64, &[u8], usize)],
        pad: u8,
        priority: Priority,
        durable: bool,
    ) -> Result<()> {
        let mut engine = self.lease()?;
        let how = durable.then_some(self.durable_writes);
        write_runs_on(&mut *engine, writes, pad, priority, how)
    }

    fn pieces(&self, lba: u64, len: usize, priority: Priority) -> Vec<(u64, usize, usize)> {
        pieces_of(
            self.block_size_bytes(),
            lba,
            len,
            request_limits(priority).0,
        )
    }
}

/// Bytes a [`PendingRead`] brought in, owned and contiguous.
#[derive(Debug)]
pub enum ReadBytes {
    /// The I/O buffer the device wrote into.
    Io(IoBuf),
    /// A buffer of its own.
    Mem(AlignedMem),
}

impl ReadBytes {
    /// The bytes.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: kept only when contiguous"
    )]
    pub fn as_slice(&self) -> &[u8] {
        match self {
            ReadBytes::Io(buf) => buf.as_slice().expect("kept only when contiguous"),
            ReadBytes::Mem(mem) => mem.as_slice(),
        }
    }
}

/// A read started by [`DeviceIo::start_read`] and not yet waited for.
pub struct PendingRead {
    io: Arc<DeviceIo>,
    /// None: nothing was submitted; `finish` reads synchronously.
    engine: Option<Box<dyn Engine>>,
    lba: u64,
    len: usize,
    priority: Priority,
    /// Requests the read was cut into, and those completed so far.
    pieces: usize,
    done: Vec<Completion>,
}

impl std::fmt::Debug for PendingRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PendingRead(lba {}, {} bytes)", self.lba, self.len)
    }
}

impl PendingRead {
    /// Bytes being read.
    pub fn len(&self) -> usize {
        self.len
    }

    /// A read of no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Waits for the read and hands its bytes to `visit`: straight from the
    /// I/O buffer when the read was one contiguous request, else gathered
    /// into one buffer first.
    pub fn finish<R>(self, visit: impl FnOnce(&[u8]) -> R) -> Result<R> {
        Ok(visit(self.finish_owned()?.as_slice()))
    }

    /// Waits for the read and returns its bytes, owned: the I/O buffer
    /// itself when the read was one contiguous request and its pool is less
    /// than half full (no copy; it goes back to its pool when dropped),
    /// else a buffer they were copied into.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a read returns its buffer; one buffer"
    )]
    pub fn finish_owned(mut self) -> Result<ReadBytes> {
        let Some(mut engine) = self.engine.take() else {
            let mut out = AlignedMem::new(self.len);
            self.io.read(self.lba, out.as_mut_slice(), self.priority)?;
            return Ok(ReadBytes::Mem(out));
        };
        let waited = self.wait(&mut *engine);
        // The I/O buffer is kept only while its pool has room to spare: a
        // holder may keep it long (an iterator resumed later), and reads
        // must not wait for it.
        let pool = engine.pool();
        let keep = pool.pinned_bytes() * 2 < pool.config().max_pinned_bytes;
        self.io.give_back(engine);
        waited?;
        let mut bufs = Vec::with_capacity(self.pieces);
        for c in self.done.drain(..) {
            let offset = c.user_data as usize;
            bufs.push((offset, checked(c)?.expect("a read returns its buffer")));
        }
        if keep && bufs.len() == 1 && bufs[0].1.as_slice().is_some() {
            let (_, buf) = bufs.pop().expect("one buffer");
            return Ok(ReadBytes::Io(buf));
        }
        let mut out = AlignedMem::new(self.len);
        for (offset, buf) in &bufs {
            buf.read_at(0, &mut out.as_mut_slice()[*offset..*offset + buf.len()]);
        }
        Ok(ReadBytes::Mem(out))
    }

    fn wait(&mut self, engine: &mut dyn Engine) -> Result<()> {
        while self.done.len() < self.pieces {
            let left = self.pieces - self.done.len();
            let reaped = engine.reap(left, &mut self.done)?;
            assert!(
                reaped > 0 || engine.in_flight() > 0,
                "an engine lost {left} requests of a read-ahead"
            );
        }
        Ok(())
    }
}

impl Drop for PendingRead {
    fn drop(&mut self) {
        if let Some(mut engine) = self.engine.take() {
            // Waited for, so the engine goes back idle and the buffers
            // are not freed under the kernel.
            if self.wait(&mut *engine).is_ok() {
                self.io.give_back(engine);
            }
        }
    }
}

/// `(lba, byte offset, length)` of the requests of at most `max_bytes` a
/// run of `len` bytes at `lba` is cut into, for blocks of `block` bytes.
fn pieces_of(block: usize, lba: u64, len: usize, max_bytes: usize) -> Vec<(u64, usize, usize)> {
    assert!(
        len.is_multiple_of(block),
        "I/O of {len} bytes is not whole {block}-byte blocks"
    );
    assert!(max_bytes >= block && max_bytes.is_multiple_of(block));
    let mut out = Vec::with_capacity(len.div_ceil(max_bytes));
    let mut offset = 0;
    while offset < len {
        let n = (len - offset).min(max_bytes);
        out.push((lba + (offset / block) as u64, offset, n));
        offset += n;
    }
    out
}

/// The buffer of a completed request that moved all its bytes, or why not.
fn checked(c: Completion) -> Result<Option<crate::pool::IoBuf>> {
    let n = c.result?;
    let expected = c.buf.as_ref().map_or(0, |b| b.len());
    if n != expected {
        return Err(IoError::ShortTransfer {
            op: c.op.name(),
            lba: c.lba,
            done_bytes: n,
            len_bytes: expected,
        });
    }
    Ok(c.buf)
}

/// Writes each `(lba, data, len)` run on `engine` (idle when called):
/// `data` then `pad` up to `len`; with `durable`, made durable that way,
/// all submitted together.
pub fn write_runs_on(
    engine: &mut dyn Engine,
    writes: &[(u64, &[u8], usize)],
    pad: u8,
    priority: Priority,
    durable: Option<DurableWrites>,
) -> Result<()> {
    let block = engine.device().geometry().block_size_bytes as usize;
    let mut pieces = Vec::new();
    for (run, &(lba, _, len)) in writes.iter().enumerate() {
        for (at, offset, len) in pieces_of(block, lba, len, request_limits(priority).0) {
            pieces.push((run, at, offset, len));
        }
    }
    let fill = |engine: &mut dyn Engine, piece: usize| -> Result<(u64, IoBuf)> {
        let (run, at, offset, len) = pieces[piece];
        let mut buf = engine.pool().alloc(len, Direction::Write)?;
        let data = writes[run].1;
        let have = data.len().saturating_sub(offset).min(len);
        buf.write_at(0, &data[offset..offset + have]);
        if have < len {
            buf.write_at(have, &vec![pad; len - have]);
        }
        Ok((at, buf))
    };
    submit_writes(engine, pieces.len(), fill, priority, durable)
}

/// Writes buffers the caller has filled, with no copy: each `(lba, buf)`
/// holds whole blocks and comes from `engine`'s own pool
/// ([`Engine::pool`]; a registered buffer of another pool is refused) or
/// is unpooled. With `durable`, makes them durable that way; all submitted
/// together, on `engine` (idle when called). The buffers go back to their
/// pool as their writes complete.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: one buffer per write"
)]
pub fn write_bufs_on(
    engine: &mut dyn Engine,
    writes: Vec<(u64, IoBuf)>,
    priority: Priority,
    durable: Option<DurableWrites>,
) -> Result<()> {
    let count = writes.len();
    let mut writes = writes.into_iter();
    let take = |_: &mut dyn Engine, _: usize| -> Result<(u64, IoBuf)> {
        Ok(writes.next().expect("one buffer per write"))
    };
    submit_writes(engine, count, take, priority, durable)
}

/// Submits `count` writes, the buffer of write `i` from `buffer(engine, i)`
/// when there is room in the queue for it, then (with `durable`) what
/// makes them durable, and waits for all of them.
fn submit_writes(
    engine: &mut dyn Engine,
    count: usize,
    mut buffer: impl FnMut(&mut dyn Engine, usize) -> Result<(u64, IoBuf)>,
    priority: Priority,
    durable: Option<DurableWrites>,
) -> Result<()> {
    // One write made durable by itself, or writes and a flush ordered
    // after them; the flush goes in with the last writes when they fit
    // in the queue with it, else the writes drain first.
    let dsync_one = count == 1 && durable == Some(DurableWrites::Dsync);
    let mut flush_pending = durable.is_some();
    let mut submitted = 0;
    let mut next = 0;
    let mut done = Vec::new();
    let mut first_error = None;
    while next < count || submitted > 0 || flush_pending {
        while next < count && submitted < engine.queue_depth().min(request_limits(priority).1) {
            let (lba, buf) = buffer(&mut *engine, next)?;
            let mut request = Request::write(lba, buf, 0).with_priority(priority);
            if dsync_one {
                request = request.durable();
                flush_pending = false;
            }
            engine.submit(request).map_err(|r| r.error)?;
            submitted += 1;
            next += 1;
        }
        if next == count && flush_pending && submitted < engine.queue_depth() {
            let flush = Request::flush_after_prior(1).with_priority(priority);
            engine.submit(flush).map_err(|r| r.error)?;
            submitted += 1;
            flush_pending = false;
        }
        done.clear();
        // Everything submitted is reaped in one wait where it can be.
        submitted -= engine.reap(submitted, &mut done)?;
        for c in done.drain(..) {
            if let Err(e) = checked(c) {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Background I/O goes out in small requests, few at a time, so that
    /// a foreground read waits behind little of it; foreground I/O in big
    /// ones, many at a time.
    #[test]
    fn low_priority_runs_are_cut_small_and_kept_few_in_flight() {
        let run_bytes = 3 << 20;
        let low = pieces_of(4096, 100, run_bytes, request_limits(Priority::Low).0);
        assert_eq!(low.len(), run_bytes / LOW_REQUEST_BYTES);
        assert!(low.iter().all(|&(_, _, n)| n == LOW_REQUEST_BYTES));
        assert_eq!(
            low[1],
            (
                100 + (LOW_REQUEST_BYTES / 4096) as u64,
                LOW_REQUEST_BYTES,
                LOW_REQUEST_BYTES
            )
        );
        let high = pieces_of(4096, 100, run_bytes, request_limits(Priority::High).0);
        assert_eq!(high.len(), 3);
        assert!(request_limits(Priority::Low).1 * LOW_REQUEST_BYTES <= 512 << 10);
        assert_eq!(request_limits(Priority::High).1, MAX_REQUESTS_IN_FLIGHT);
        let tail = pieces_of(4096, 0, LOW_REQUEST_BYTES + 8192, LOW_REQUEST_BYTES);
        assert_eq!(tail.last(), Some(&(64, LOW_REQUEST_BYTES, 8192)));
    }
}
