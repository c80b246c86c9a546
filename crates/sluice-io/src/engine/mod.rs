//! Engines: queues of requests against a device, completed asynchronously.
//!
//! - [`UringEngine`]: io_uring with a registered file, fixed buffers from the
//!   pool, batched submission, optional SQPOLL and IOPOLL.
//! - [`PosixEngine`]: pread/pwrite on worker threads, buffered or O_DIRECT:
//!   the honest baseline.
//!
//! Both take requests with [`Engine::submit`] and hand back completions with
//! [`Engine::reap`]; a request's buffer travels with it and comes back in its
//! completion. Two priority classes: high (log writes, foreground reads) and
//! low (background work). Low requests are issued only while high ones hold
//! less than `high_share` of the queue depth, and each request carries the
//! kernel I/O priority of its class.

mod gate;
mod posix;
mod uring;

pub use posix::PosixEngine;
pub use uring::UringEngine;

use crate::device::Device;
use crate::error::{IoError, Result};
use crate::pool::{BufferPool, IoBuf, PoolConfig};
use std::sync::Arc;

/// Upper bound on queue depth (requests accepted and not yet reaped).
pub const MAX_QUEUE_DEPTH: usize = 4096;
/// Upper bound on posix worker threads.
pub const MAX_POSIX_THREADS: usize = 256;

/// Kernel I/O priority classes (ioprio_set(2)).
pub const IOPRIO_CLASS_BE: u16 = 2;
/// The idle class: served only when the disk has nothing else to do.
pub const IOPRIO_CLASS_IDLE: u16 = 3;

/// Builds a kernel ioprio value from a class and a level (0 highest, 7 lowest).
pub const fn ioprio(class: u16, level: u16) -> u16 {
    (class << 13) | (level & 7)
}

/// The engine's two priority classes (and the kernel ioprio each carries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// Log writes and foreground reads.
    High,
    /// Background work: compaction, prefetch, export.
    Low,
}

/// What a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Reads into the buffer.
    Read,
    /// Writes the buffer.
    Write,
    /// Makes every write completed before it was submitted durable.
    Flush,
}

impl Op {
    /// The operation's name in errors.
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
        }
    }
}

/// One I/O. `buf` is required for reads and writes; its `len()` is the length.
#[derive(Debug)]
pub struct Request {
    /// What to do.
    pub op: Op,
    /// First block (in the device's logical blocks).
    pub lba: u64,
    /// The data (read into or written from); None for a flush.
    pub buf: Option<IoBuf>,
    /// Its class in the engine's gate and as kernel ioprio.
    pub priority: Priority,
    /// The caller's tag, given back in the completion.
    pub user_data: u64,
    /// For a flush: start only once every request this engine issued before
    /// it has completed (io_uring's IOSQE_IO_DRAIN), so writes and the flush
    /// that makes them durable go to the kernel together, in one system
    /// call. Requests of one priority are issued in the order submitted.
    pub after_prior: bool,
    /// For a write: durable when it completes (RWF_DSYNC: a FUA write
    /// where the device has it, else the kernel flushes after it) —
    /// one request instead of a write and a flush.
    pub dsync: bool,
}

impl Request {
    /// A read of `buf.len()` bytes at `lba`, high priority.
    pub fn read(lba: u64, buf: IoBuf, user_data: u64) -> Self {
        Request {
            op: Op::Read,
            lba,
            buf: Some(buf),
            priority: Priority::High,
            user_data,
            after_prior: false,
            dsync: false,
        }
    }

    /// A write of `buf` at `lba`, high priority.
    pub fn write(lba: u64, buf: IoBuf, user_data: u64) -> Self {
        Request {
            op: Op::Write,
            lba,
            buf: Some(buf),
            priority: Priority::High,
            user_data,
            after_prior: false,
            dsync: false,
        }
    }

    /// A flush: every write completed before it is issued becomes durable.
    pub fn flush(user_data: u64) -> Self {
        Request {
            op: Op::Flush,
            lba: 0,
            buf: None,
            priority: Priority::High,
            user_data,
            after_prior: false,
            dsync: false,
        }
    }

    /// A flush that waits for every request issued before it on the same
    /// engine (see [`Request::after_prior`]): submit the writes, then this,
    /// and reap them all — one `io_uring_enter` makes the writes durable.
    pub fn flush_after_prior(user_data: u64) -> Self {
        Request {
            after_prior: true,
            ..Request::flush(user_data)
        }
    }

    /// This write, durable when it completes (see [`Request::dsync`]).
    pub fn durable(mut self) -> Self {
        self.dsync = true;
        self
    }

    /// The same request in another priority class.
    pub fn with_priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    fn len_bytes(&self) -> usize {
        self.buf.as_ref().map_or(0, IoBuf::len)
    }
}

/// The outcome of one request, with its buffer back.
#[derive(Debug)]
pub struct Completion {
    /// The request's tag.
    pub user_data: u64,
    /// The request's operation.
    pub op: Op,
    /// The request's first block.
    pub lba: u64,
    /// The request's class.
    pub priority: Priority,
    /// Bytes transferred, or what went wrong.
    pub result: Result<usize>,
    /// The request's buffer, back to the caller.
    pub buf: Option<IoBuf>,
}

/// A request the engine would not take, with the request handed back.
#[derive(Debug)]
pub struct Rejected {
    /// Why it was refused.
    pub error: IoError,
    /// The request, untouched.
    pub request: Request,
}

/// Which engine runs the requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// io_uring (registered file, fixed buffers, optional SQPOLL/IOPOLL).
    Uring,
    /// pread/pwrite on worker threads: the honest baseline.
    Posix,
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EngineKind::Uring => "uring",
            EngineKind::Posix => "posix",
        })
    }
}

/// How an engine is opened.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// io_uring or the posix baseline.
    pub kind: EngineKind,
    /// Requests accepted and not yet reaped, at most.
    pub queue_depth: usize,
    /// SQPOLL with this idle time before the kernel thread sleeps.
    pub sqpoll_idle_ms: Option<u32>,
    /// Submit to the kernel from `submit` once this many requests are
    /// queued; `reap` always submits what is queued. 0 picks it: 1 (at
    /// once, as fio's default iodepth_batch_submit=1) for an interrupt-driven
    /// ring, up to 8 with SQPOLL, where publishing entries in small groups
    /// lets the kernel thread take them together (measured in
    /// docs/BENCHMARKS.md). Larger batches: fewer wake-ups, more latency.
    pub submit_batch: usize,
    /// Single issuer with deferred task work (Linux 6.1): completions are
    /// processed only when the issuing thread reaps, which cuts completion
    /// latency. The ring is bound to the thread that first submits or reaps;
    /// using the engine from another thread afterwards is refused with a
    /// clear error. Pool buffers may still be taken and dropped on any
    /// thread: memory pinned elsewhere serves plain I/O until the engine's
    /// next reap registers it, and memory released elsewhere is unregistered
    /// at that reap. On by default (falls back with a note where the kernel
    /// refuses it); COOP_TASKRUN is always on. Ignored with SQPOLL.
    pub defer_taskrun: bool,
    /// Busy-poll completions (only where the device has poll queues).
    pub iopoll: bool,
    /// With SQPOLL: `reap` polls the completion queue instead of waiting
    /// in the kernel, so while the submission thread is awake a request
    /// costs no system call at all. Burns the waiting thread's core.
    pub poll_completions: bool,
    /// io_uring without SQPOLL: before sleeping for a completion, poll for
    /// it this long (microseconds; 0: sleep at once), holding one of the
    /// process's polling slots ([`crate::spin`]; without a free one, sleep).
    /// The completion's task work is run as soon as the kernel flags it
    /// (`IORING_SETUP_TASKRUN_FLAG`, Linux 5.19), without a system call
    /// before then. For a thread that waits on one request at a time with
    /// nothing else to do (a storage node's connection): a sleep and a
    /// wake-up cost about as much as a fast device's own latency.
    pub spin_wait_us: u32,
    /// Use fixed buffers (ReadFixed/WriteFixed) from a registered pool.
    pub fixed_buffers: bool,
    /// Low-priority requests wait while high ones hold this share of the depth.
    pub high_share: f64,
    /// Kernel ioprio of high-priority requests (0: the process's own).
    pub high_ioprio: u16,
    /// Kernel ioprio of low-priority requests (default best-effort level 7).
    pub low_ioprio: u16,
    /// Worker threads of the posix engine.
    pub posix_threads: usize,
    /// Fall back (uring to posix, SQPOLL to plain, ...) instead of failing.
    pub allow_fallback: bool,
    /// The buffer pool the engine registers and allocates from.
    pub pool: PoolConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            kind: EngineKind::Uring,
            queue_depth: 64,
            sqpoll_idle_ms: None,
            defer_taskrun: true,
            submit_batch: 0,
            iopoll: false,
            poll_completions: false,
            spin_wait_us: 0,
            fixed_buffers: true,
            high_share: 0.75,
            high_ioprio: 0,
            low_ioprio: ioprio(IOPRIO_CLASS_BE, 7),
            posix_threads: 8,
            allow_fallback: true,
            pool: PoolConfig::default(),
        }
    }
}

impl EngineConfig {
    /// Checks every value against its limit, naming the one out of range.
    pub fn validate(&self) -> Result<()> {
        if self.queue_depth == 0 || self.queue_depth > MAX_QUEUE_DEPTH {
            return Err(IoError::Config(format!(
                "queue_depth {} must be between 1 and {MAX_QUEUE_DEPTH}",
                self.queue_depth
            )));
        }
        if !(self.high_share > 0.0 && self.high_share <= 1.0) {
            return Err(IoError::Config(format!(
                "high_share {} must be in (0, 1]",
                self.high_share
            )));
        }
        if self.submit_batch > self.queue_depth {
            return Err(IoError::Config(format!(
                "submit_batch {} must be at most queue_depth {} (0 picks it)",
                self.submit_batch, self.queue_depth
            )));
        }
        if self.spin_wait_us > MAX_SPIN_WAIT_US {
            return Err(IoError::Config(format!(
                "spin_wait_us {} must be at most {MAX_SPIN_WAIT_US} (a poller holds its core)",
                self.spin_wait_us
            )));
        }
        if self.posix_threads == 0 || self.posix_threads > MAX_POSIX_THREADS {
            return Err(IoError::Config(format!(
                "posix_threads {} must be between 1 and {MAX_POSIX_THREADS}",
                self.posix_threads
            )));
        }
        self.pool.validate()
    }
}

/// Longest [`EngineConfig::spin_wait_us`].
pub const MAX_SPIN_WAIT_US: u32 = 10_000;

/// A queue of I/O against one device.
pub trait Engine: Send {
    /// Which engine this is.
    fn kind(&self) -> EngineKind;
    /// The device it does I/O on.
    fn device(&self) -> &Arc<dyn Device>;
    /// The pool whose buffers this engine uses best (fixed buffers).
    fn pool(&self) -> &BufferPool;
    /// Most requests accepted and not yet reaped.
    fn queue_depth(&self) -> usize;
    /// Requests accepted and not yet reaped.
    fn in_flight(&self) -> usize;
    /// Accepts a request. Checked against the device first; a bad or
    /// surplus request comes back in `Rejected`, untouched.
    // The request travels back whole so the caller keeps its buffer; boxing
    // it would allocate on the submit path.
    #[allow(clippy::result_large_err)]
    fn submit(&mut self, request: Request) -> std::result::Result<(), Rejected>;
    /// Issues what is queued and appends at least `min_complete` completions
    /// (fewer only if fewer are in flight) to `out`. Returns how many it added.
    fn reap(&mut self, min_complete: usize, out: &mut Vec<Completion>) -> Result<usize>;
    /// Has the kernel signal `eventfd` whenever completions of this engine
    /// wait to be reaped, so a thread that serves many engines and sockets
    /// can sleep in one epoll set for all of them. Signalled completions
    /// are taken by a [`Engine::reap`] with `min_complete` 0. Only for a
    /// single-issuer ring (`defer_taskrun`, used from the thread that
    /// registers it): there the kernel signals the moment a completion's
    /// work is queued; elsewhere a completion would wait for the thread to
    /// enter the kernel before anything signalled. `Err` where the engine
    /// cannot (the posix engine, other rings): the caller waits on
    /// [`Engine::reap`] instead. The eventfd must outlive the engine.
    fn notify_completions(&mut self, eventfd: std::os::fd::RawFd) -> Result<()> {
        let _ = eventfd;
        Err(IoError::Config(format!(
            "{} cannot signal its completions to an eventfd",
            self.describe()
        )))
    }
    /// One line per fallback or adjustment made when the engine was opened.
    fn notes(&self) -> &[String];
    /// Short description: kind and the features in use.
    fn describe(&self) -> String;

    /// Submits one request and waits for it. Only with nothing else in flight.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: one completion"
    )]
    fn run(&mut self, request: Request) -> Completion {
        assert_eq!(self.in_flight(), 0, "run() needs an idle engine");
        let (user_data, op, lba, priority) =
            (request.user_data, request.op, request.lba, request.priority);
        if let Err(r) = self.submit(request) {
            return Completion {
                user_data,
                op,
                lba,
                priority,
                result: Err(r.error),
                buf: r.request.buf,
            };
        }
        let mut out = Vec::with_capacity(1);
        match self.reap(1, &mut out) {
            Ok(_) => out.pop().expect("one completion"),
            Err(e) => Completion {
                user_data,
                op,
                lba,
                priority,
                result: Err(e),
                buf: None,
            },
        }
    }
}

/// Takes a request into an engine holding `accepted` of `queue_depth`, or
/// hands it back with the reason.
#[allow(clippy::result_large_err)] // as Engine::submit: the request comes back whole
pub(crate) fn admit(
    device: &dyn Device,
    pool: &BufferPool,
    accepted: usize,
    queue_depth: usize,
    request: Request,
) -> std::result::Result<Request, Rejected> {
    if let Err(error) = check_request(device, pool, &request) {
        return Err(Rejected { error, request });
    }
    if accepted >= queue_depth {
        return Err(Rejected {
            error: IoError::QueueFull { queue_depth },
            request,
        });
    }
    if let Some(counts) = device.io_counts() {
        counts.record(request.priority, request.op, request.len_bytes());
    }
    Ok(request)
}

/// Checks a request against the device and the engine's pool before it is
/// queued.
fn check_request(device: &dyn Device, pool: &BufferPool, request: &Request) -> Result<()> {
    match request.op {
        Op::Flush => Ok(()),
        Op::Read | Op::Write => {
            let buf = request
                .buf
                .as_ref()
                .ok_or_else(|| IoError::Config("a read or write request needs a buffer".into()))?;
            // A fixed-buffer index means something only in the table of the
            // ring whose pool handed the buffer out.
            let registered = buf.segments().iter().any(|s| s.buf_index().is_some());
            if registered && !buf.is_from(pool) {
                return Err(IoError::Config(
                    "a buffer registered with another engine's pool was submitted; allocate it from this engine's pool (Engine::pool)".into(),
                ));
            }
            let geometry = device.geometry();
            geometry.check_io(request.lba, request.len_bytes() as u64, 0)?;
            for (_, seg) in buf.io_segments() {
                if device.is_direct() {
                    geometry.check_io(0, seg.len_bytes() as u64, seg.ptr() as usize)?;
                }
            }
            Ok(())
        }
    }
}

/// Opens the engine `config` asks for, falling back where the kernel or
/// device lacks a feature (each fallback logged in one line and kept in
/// `notes()`), or failing with the missing feature named when fallback is off.
pub fn open_engine(device: Arc<dyn Device>, config: &EngineConfig) -> Result<Box<dyn Engine>> {
    config.validate()?;
    match config.kind {
        EngineKind::Posix => Ok(Box::new(PosixEngine::open(device, config, Vec::new())?)),
        EngineKind::Uring => {
            let missing = if device.raw_fd().is_none() {
                Some((
                    "a file descriptor",
                    format!("{} has none", device.describe()),
                ))
            } else {
                crate::probe::kernel().uring_missing()
            };
            match missing {
                None => Ok(Box::new(UringEngine::open(device, config)?)),
                Some((feature, reason)) if config.allow_fallback => {
                    let note = format!("engine: uring -> posix: missing {feature}: {reason}");
                    log::warn!("{note}");
                    Ok(Box::new(PosixEngine::open(device, config, vec![note])?))
                }
                Some((feature, reason)) => Err(IoError::FeatureMissing { feature, reason }),
            }
        }
    }
}
