//! The io_uring engine.
//!
//! One ring, owned by one thread at a time. The device's descriptor is a
//! registered file; buffers come from a pool registered in a sparse
//! fixed-buffer table (Linux 5.19), so a read or write of a pooled buffer is a
//! ReadFixed/WriteFixed and the kernel does not pin pages per I/O. Requests
//! are queued and submitted in batches from `reap`, one system call for many.
//! A scatter/gather buffer becomes one SQE per segment at consecutive offsets.

use super::gate::PriorityGate;
use super::{admit, Completion, Engine, EngineConfig, EngineKind, Op, Priority, Rejected, Request};
use crate::device::Device;
use crate::error::{IoError, Result};
use crate::pool::{BufferPool, Pinning, Registrar};
use io_uring::{opcode, squeue, types, IoUring};
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::Arc;

/// Registers pool memory in the ring's sparse buffer table.
struct RingRegistrar {
    ring: Arc<IoUring>,
    /// The thread a single-issuer ring is bound to, once it is enabled.
    issuer: std::sync::OnceLock<std::thread::ThreadId>,
}

impl std::fmt::Debug for RingRegistrar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RingRegistrar")
    }
}

impl Registrar for RingRegistrar {
    unsafe fn register(&self, slot: u16, iov: libc::iovec) -> std::io::Result<()> {
        // SAFETY: the caller keeps the memory valid until unregister.
        unsafe {
            self.ring
                .submitter()
                .register_buffers_update(slot as u32, &[iov], None)
        }
    }

    fn is_issuer_thread(&self) -> bool {
        self.issuer
            .get()
            .is_none_or(|&t| t == std::thread::current().id())
    }

    fn unregister(&self, slot: u16) -> std::io::Result<()> {
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        // SAFETY: an empty iovec clears the slot; no memory is handed over.
        unsafe {
            self.ring
                .submitter()
                .register_buffers_update(slot as u32, &[empty], None)
        }
    }
}

#[derive(Debug)]
struct InFlight {
    request: Request,
    sqes_left: u32,
    done_bytes: usize,
    error: Option<IoError>,
}

/// An io_uring engine: one ring per engine, a registered file, fixed buffers from the pool, two priority classes in a gate before the ring.
pub struct UringEngine {
    ring: Arc<IoUring>,
    device: Arc<dyn Device>,
    pool: BufferPool,
    fd: RawFd,
    fixed_file: bool,
    iopoll: bool,
    sqpoll: bool,
    /// SQPOLL and `poll_completions`: reap without entering the kernel.
    poll_cq: bool,
    /// `spin_wait_us`: how long a reap polls before it sleeps, and when
    /// it does not (after polls that ran out of time).
    spin_wait: std::time::Duration,
    spin_backoff: crate::spin::SpinBackoff,
    block_size_bytes: u64,
    queue_depth: usize,
    sq_entries: usize,
    sqes_in_kernel: usize,
    unsubmitted: usize,
    accepted: usize,
    slots: Vec<Option<InFlight>>,
    free_slots: Vec<u32>,
    gate: PriorityGate<u32>,
    ready: VecDeque<Completion>,
    /// Created disabled (single issuer): enabled by the first reap, which
    /// binds the ring to the reaping thread.
    disabled: bool,
    single_issuer: bool,
    /// The kernel flags pending completion work in the SQ ring's flags
    /// (`IORING_SETUP_TASKRUN_FLAG`).
    taskrun_flag: bool,
    /// An eventfd is registered ([`Engine::notify_completions`]).
    notifying: bool,
    registrar: Option<Arc<RingRegistrar>>,
    submit_batch: usize,
    high_ioprio: u16,
    low_ioprio: u16,
    notes: Vec<String>,
}

impl std::fmt::Debug for UringEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Builds an SQE against the registered file (index 0) or the plain
/// descriptor; the opcode builders take distinct types for the two.
macro_rules! entry {
    ($target:expr, $ctor:path, ($($arg:expr),*) $(.$method:ident($value:expr))*) => {
        if $target.fixed_file {
            $ctor(types::Fixed(0), $($arg),*)$(.$method($value))*.build()
        } else {
            $ctor(types::Fd($target.fd), $($arg),*)$(.$method($value))*.build()
        }
    };
}

impl UringEngine {
    /// Opens a ring over `device`. Features the kernel or device lacks are
    /// turned off with a note (or an error when fallback is off).
    pub fn open(device: Arc<dyn Device>, config: &EngineConfig) -> Result<Self> {
        config.validate()?;
        let probe = crate::probe::kernel();
        let support = probe
            .uring
            .as_ref()
            .map_err(|why| IoError::FeatureMissing {
                feature: "io_uring",
                reason: why.clone(),
            })?;
        let fd = device.raw_fd().ok_or_else(|| IoError::FeatureMissing {
            feature: "a file descriptor",
            reason: format!("{} has none", device.describe()),
        })?;
        let mut notes = Vec::new();
        let mut fallback = |feature: &'static str, reason: String| -> Result<()> {
            if !config.allow_fallback {
                return Err(IoError::FeatureMissing { feature, reason });
            }
            let note = format!("engine uring: {feature} off: {reason}");
            log::warn!("{note}");
            notes.push(note);
            Ok(())
        };

        let sq_entries = config
            .queue_depth
            .max(config.pool.max_segments)
            .next_power_of_two()
            .clamp(8, 4096);
        let mut builder = IoUring::builder();
        let mut sqpoll = false;
        if let Some(idle_ms) = config.sqpoll_idle_ms {
            match support.sqpoll_error() {
                None => {
                    builder.setup_sqpoll(idle_ms);
                    sqpoll = true;
                }
                Some(why) => fallback("SQPOLL", why.to_string())?,
            }
        }
        let mut iopoll = false;
        if config.iopoll {
            match device.backing_dev() {
                Some((maj, min)) if crate::probe::device_has_poll_queues(maj, min) => {
                    builder.setup_iopoll();
                    iopoll = true;
                }
                _ => fallback(
                    "IOPOLL",
                    format!(
                        "{} has no poll queues (queue/io_poll is not 1)",
                        device.describe()
                    ),
                )?,
            }
        }
        // Completions run only when this thread waits for them (no IPIs,
        // no interrupting the submitter), as fio does. The ring starts
        // disabled so that the thread that first reaps becomes its issuer.
        if !sqpoll {
            builder.setup_coop_taskrun();
        }
        // Polling for completions needs the kernel to say when their task
        // work is pending.
        let spin_wait = if !sqpoll && config.spin_wait_us > 0 {
            builder.setup_taskrun_flag();
            std::time::Duration::from_micros(config.spin_wait_us as u64)
        } else {
            std::time::Duration::ZERO
        };
        let mut deferred = builder.clone();
        let mut single_issuer = false;
        if !sqpoll && config.defer_taskrun {
            deferred
                .setup_single_issuer()
                .setup_defer_taskrun()
                .setup_r_disabled();
            single_issuer = true;
        }
        let ring = match deferred.build(sq_entries as u32) {
            Ok(ring) => ring,
            Err(e) if single_issuer => {
                fallback(
                    "DEFER_TASKRUN",
                    format!("refused by kernel {}: {e}", probe.kernel_release),
                )?;
                single_issuer = false;
                builder
                    .build(sq_entries as u32)
                    .map_err(|e| IoError::os("io_uring_setup", device.describe(), e))?
            }
            Err(e) => return Err(IoError::os("io_uring_setup", device.describe(), e)),
        };
        let ring = Arc::new(ring);

        let fixed_file = match ring.submitter().register_files(&[fd]) {
            Ok(()) => true,
            Err(e) => {
                fallback("registered files", e.to_string())?;
                false
            }
        };
        let mut pinning = Pinning::Unpinned;
        let mut registrar = None;
        if config.fixed_buffers {
            if !(support.read_fixed && support.write_fixed && support.buffers_sparse) {
                fallback(
                    "fixed buffers",
                    format!(
                        "kernel {} lacks READ_FIXED/WRITE_FIXED or sparse buffer tables (5.19)",
                        probe.kernel_release
                    ),
                )?;
            } else {
                ring.submitter()
                    .register_buffers_sparse(config.pool.table_slots)
                    .map_err(|e| {
                        IoError::os("register sparse buffer table", device.describe(), e)
                    })?;
                let reg = Arc::new(RingRegistrar {
                    ring: ring.clone(),
                    issuer: std::sync::OnceLock::new(),
                });
                registrar = Some(reg.clone());
                pinning = Pinning::Registered(reg);
            }
        }
        let pool = BufferPool::new(config.pool.clone(), pinning)?;
        let block_size_bytes = device.geometry().block_size_bytes as u64;
        Ok(UringEngine {
            ring,
            device,
            pool,
            fd,
            fixed_file,
            iopoll,
            sqpoll,
            poll_cq: sqpoll && config.poll_completions,
            spin_wait,
            spin_backoff: crate::spin::SpinBackoff::default(),
            block_size_bytes,
            queue_depth: config.queue_depth,
            sq_entries,
            sqes_in_kernel: 0,
            unsubmitted: 0,
            accepted: 0,
            slots: (0..config.queue_depth).map(|_| None).collect(),
            free_slots: (0..config.queue_depth as u32).rev().collect(),
            gate: PriorityGate::new(config.queue_depth, config.high_share),
            ready: VecDeque::new(),
            disabled: single_issuer,
            single_issuer,
            taskrun_flag: !spin_wait.is_zero(),
            notifying: false,
            registrar,
            // 0 picks: see EngineConfig::submit_batch.
            submit_batch: match config.submit_batch {
                0 if sqpoll => config.queue_depth.min(8),
                0 => 1,
                n => n,
            },
            high_ioprio: config.high_ioprio,
            low_ioprio: config.low_ioprio,
            notes,
        })
    }

    /// Whether the ring submits through a kernel thread (SQPOLL).
    pub fn is_sqpoll(&self) -> bool {
        self.sqpoll
    }

    /// Moves queued requests into the submission queue while there is room.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: queued slot is live; room was checked"
    )]
    fn issue_queued(&mut self) {
        // SAFETY: only this engine touches the submission queue; the
        // registrar shares the ring but only makes register calls.
        let mut sq = unsafe { self.ring.submission_shared() };
        while let Some((priority, slot)) = self.gate.pop() {
            let inflight = self.slots[slot as usize]
                .as_mut()
                .expect("queued slot is live");
            let needed = inflight
                .request
                .buf
                .as_ref()
                .map_or(1, |b| b.io_segments().count());
            let room = sq.capacity() - sq.len();
            if needed > room || self.sqes_in_kernel + needed > self.sq_entries {
                self.gate.unpop(priority, slot);
                break;
            }
            let ioprio = match priority {
                Priority::High => self.high_ioprio,
                Priority::Low => self.low_ioprio,
            };
            let target = Target {
                fd: self.fd,
                fixed_file: self.fixed_file,
                block_size_bytes: self.block_size_bytes,
            };
            for_each_entry(&inflight.request, slot, target, ioprio, |entry| {
                // SAFETY: every buffer an entry points to is owned by the
                // request in `self.slots`, which stays put until its last CQE.
                unsafe { sq.push(&entry).expect("room was checked") };
            });
            inflight.sqes_left = needed as u32;
            self.sqes_in_kernel += needed;
            self.unsubmitted += needed;
        }
        sq.sync();
    }

    /// Whether completions' work waits on this single-issuer ring for the
    /// thread to ask for events (which a reap that does not wait would
    /// otherwise never do): flagged by the kernel where the ring has the
    /// flag, assumed while an eventfd is registered.
    fn deferred_work_pending(&self) -> bool {
        if !self.single_issuer || self.disabled || self.sqes_in_kernel == 0 {
            return false;
        }
        if self.taskrun_flag {
            // SAFETY: only this engine touches its submission queue, and
            // nothing is pushed while this shared view lives.
            unsafe { self.ring.submission_shared() }.taskrun()
        } else {
            self.notifying
        }
    }

    /// Submits what is queued and runs the completions' pending work
    /// without waiting for any (GETEVENTS with no minimum).
    fn enter_for_events(&mut self) -> Result<()> {
        loop {
            let to_submit = self.unsubmitted as u32;
            // SAFETY: no argument pointer (None, the size of a sigset that
            // is not passed); the SQEs counted in `to_submit` were pushed
            // and synced by `issue_queued`, their buffers held by `slots`.
            let entered = unsafe {
                self.ring.submitter().enter::<libc::sigset_t>(
                    to_submit,
                    0,
                    io_uring::EnterFlags::GETEVENTS.bits(),
                    None,
                )
            };
            match entered {
                Ok(_) => {
                    self.unsubmitted = 0;
                    return Ok(());
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Ok(()),
                Err(e) => return Err(IoError::os("io_uring_enter", self.device.describe(), e)),
            }
        }
    }

    fn enter(&mut self, want: usize) -> Result<()> {
        if self.disabled {
            // Name the issuer first: from here on other threads defer their
            // registrations instead of having the kernel refuse them.
            if let Some(reg) = &self.registrar {
                let _ = reg.issuer.set(std::thread::current().id());
            }
            self.ring
                .submitter()
                .register_enable_rings()
                .map_err(|e| IoError::os("enable ring", self.device.describe(), e))?;
            self.disabled = false;
        }
        loop {
            match self.ring.submitter().submit_and_wait(want) {
                Ok(_) => {
                    self.unsubmitted = 0;
                    return Ok(());
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                // The completion queue is full: the caller drains it and comes back.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    return Err(IoError::Config(
                        "engine used from a thread other than the one that first reaped it (single-issuer ring, defer_taskrun); keep each engine on one thread or open it with defer_taskrun off".into(),
                    ))
                }
                Err(e) => return Err(IoError::os("io_uring_enter", self.device.describe(), e)),
            }
        }
    }

    /// `reap` on a SQPOLL ring without waiting in the kernel: entries are
    /// published for the submission thread (a system call only to wake it
    /// when it sleeps) and completions are polled.
    fn reap_polling(
        &mut self,
        min: usize,
        mut added: usize,
        out: &mut Vec<Completion>,
    ) -> Result<usize> {
        loop {
            self.issue_queued();
            if self.unsubmitted > 0 {
                // Enters the kernel only when the SQ thread needs a wake-up.
                self.ring
                    .submitter()
                    .submit()
                    .map_err(|e| IoError::os("io_uring_enter", self.device.describe(), e))?;
                self.unsubmitted = 0;
            }
            added += self.drain_completions(out);
            if added >= min || (self.sqes_in_kernel == 0 && self.gate.queued() == 0) {
                return Ok(added);
            }
            std::hint::spin_loop();
        }
    }

    /// Polls for `needed` completions for up to `spin_wait`: the kernel
    /// flags pending task work in the SQ ring's flags, and only then does
    /// the engine enter it (to run that work, which posts the completions).
    /// Returns the completions added and whether the time ran out (then
    /// requests are still in the kernel).
    fn spin_for_completions(
        &mut self,
        needed: usize,
        out: &mut Vec<Completion>,
    ) -> Result<(usize, bool)> {
        let deadline = std::time::Instant::now() + self.spin_wait;
        let mut added = 0;
        loop {
            added += self.drain_completions(out);
            if added >= needed || self.sqes_in_kernel == 0 {
                return Ok((added, false));
            }
            // SAFETY: only this engine touches its submission queue, and
            // nothing is pushed while this shared view lives.
            let pending = unsafe { self.ring.submission_shared() }.taskrun();
            if pending {
                // A single-issuer ring runs the work only when asked for
                // events; any other ring on the way out of the kernel.
                if self.single_issuer {
                    self.enter_for_events()?;
                } else {
                    self.enter(0)?;
                }
                continue;
            }
            if std::time::Instant::now() >= deadline {
                return Ok((added, true));
            }
            std::hint::spin_loop();
        }
    }

    /// Issues everything queued and waits for all of it, keeping the
    /// completions for the next reap.
    fn complete_issued_into_ready(&mut self) -> Result<()> {
        let mut done = Vec::new();
        while self.sqes_in_kernel > 0 || self.gate.queued() > 0 {
            self.issue_queued();
            self.enter(usize::from(self.sqes_in_kernel > 0))?;
            self.drain_completions(&mut done);
        }
        // `ready` holds completions still counted as accepted until reaped.
        self.accepted += done.len();
        self.ready.extend(done);
        Ok(())
    }

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: completion for a live slot; live slot"
    )]
    fn drain_completions(&mut self, out: &mut Vec<Completion>) -> usize {
        let mut added = 0;
        // SAFETY: only this engine touches the completion queue.
        let cq = unsafe { self.ring.completion_shared() };
        for cqe in cq {
            let slot = cqe.user_data() as usize;
            self.sqes_in_kernel -= 1;
            let inflight = self.slots[slot]
                .as_mut()
                .expect("completion for a live slot");
            let res = cqe.result();
            if res < 0 {
                let op = inflight.request.op.name();
                inflight
                    .error
                    .get_or_insert(IoError::from_errno(op, inflight.request.lba, -res));
            } else {
                inflight.done_bytes += res as usize;
            }
            inflight.sqes_left -= 1;
            if inflight.sqes_left == 0 {
                let done = self.slots[slot].take().expect("live slot");
                self.free_slots.push(slot as u32);
                self.gate.completed(done.request.priority);
                self.accepted -= 1;
                out.push(finish(done));
                added += 1;
            }
        }
        added
    }
}

fn finish(done: InFlight) -> Completion {
    let req = done.request;
    let len = req.len_bytes();
    let result = match done.error {
        Some(e) => Err(e),
        None if done.done_bytes < len => Err(IoError::ShortTransfer {
            op: req.op.name(),
            lba: req.lba,
            done_bytes: done.done_bytes,
            len_bytes: len,
        }),
        None => Ok(done.done_bytes),
    };
    Completion {
        user_data: req.user_data,
        op: req.op,
        lba: req.lba,
        priority: req.priority,
        result,
        buf: req.buf,
    }
}

#[derive(Clone, Copy)]
struct Target {
    fd: RawFd,
    fixed_file: bool,
    block_size_bytes: u64,
}

/// Builds the SQEs of one request (one per buffer segment, or one fsync).
fn for_each_entry(
    req: &Request,
    slot: u32,
    target: Target,
    ioprio: u16,
    mut push: impl FnMut(squeue::Entry),
) {
    let base = req.lba * target.block_size_bytes;
    let ud = slot as u64;
    let Some(buf) = req.buf.as_ref() else {
        let e = entry!(
            target,
            opcode::Fsync::new,
            ().flags(types::FsyncFlags::DATASYNC)
        );
        let e = if req.after_prior {
            e.flags(squeue::Flags::IO_DRAIN)
        } else {
            e
        };
        push(e.user_data(ud));
        return;
    };
    let rw_flags = if req.dsync { libc::RWF_DSYNC } else { 0 };
    for (at, seg) in buf.io_segments() {
        let (off, ptr, len) = (base + at as u64, seg.ptr(), seg.len_bytes() as u32);
        let e = match (req.op, seg.buf_index()) {
            (Op::Read, Some(i)) => entry!(
                target,
                opcode::ReadFixed::new,
                (ptr, len, i).offset(off).ioprio(ioprio)
            ),
            (Op::Read, None) => entry!(
                target,
                opcode::Read::new,
                (ptr, len).offset(off).ioprio(ioprio)
            ),
            (Op::Write, Some(i)) => entry!(
                target,
                opcode::WriteFixed::new,
                (ptr, len, i).offset(off).ioprio(ioprio).rw_flags(rw_flags)
            ),
            (Op::Write, None) => entry!(
                target,
                opcode::Write::new,
                (ptr, len).offset(off).ioprio(ioprio).rw_flags(rw_flags)
            ),
            (Op::Flush, _) => unreachable!("flush carries no buffer"),
        };
        push(e.user_data(ud));
    }
}

impl Engine for UringEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Uring
    }

    fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    fn pool(&self) -> &BufferPool {
        &self.pool
    }

    fn queue_depth(&self) -> usize {
        self.queue_depth
    }

    fn in_flight(&self) -> usize {
        self.accepted
    }

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a free slot per accepted request"
    )]
    fn submit(&mut self, request: Request) -> std::result::Result<(), Rejected> {
        let request = admit(
            self.device.as_ref(),
            &self.pool,
            self.accepted,
            self.queue_depth,
            request,
        )?;
        self.accepted += 1;
        if request.op == Op::Flush && self.iopoll {
            // An IOPOLL ring takes no fsync: flush synchronously, once what
            // was issued before it has completed where it asks for that.
            if request.after_prior {
                if let Err(error) = self.complete_issued_into_ready() {
                    self.accepted -= 1;
                    return Err(Rejected { error, request });
                }
            }
            let result = self.device.flush().map(|()| 0);
            self.ready.push_back(Completion {
                user_data: request.user_data,
                op: Op::Flush,
                lba: 0,
                priority: request.priority,
                result,
                buf: None,
            });
            return Ok(());
        }
        let slot = self
            .free_slots
            .pop()
            .expect("a free slot per accepted request");
        let priority = request.priority;
        self.slots[slot as usize] = Some(InFlight {
            request,
            sqes_left: 0,
            done_bytes: 0,
            error: None,
        });
        self.gate.push(priority, slot);
        if self.gate.queued() >= self.submit_batch {
            self.issue_queued();
            // A failed enter leaves the entries in the queue; the next reap
            // enters again and reports the error.
            if let Err(e) = self.enter(0) {
                log::debug!("deferred submission error to reap: {e}");
            }
        }
        Ok(())
    }

    fn reap(&mut self, min_complete: usize, out: &mut Vec<Completion>) -> Result<usize> {
        self.pool.run_issuer_work();
        let mut added = 0;
        while let Some(c) = self.ready.pop_front() {
            self.accepted -= 1;
            out.push(c);
            added += 1;
        }
        let min = min_complete.min(self.accepted + added);
        if self.poll_cq {
            return self.reap_polling(min, added, out);
        }
        loop {
            self.issue_queued();
            let want = usize::from(added < min && self.sqes_in_kernel > 0);
            // Counted as a waiter through the poll and the sleep after it.
            let waiting = (want > 0 && !self.spin_wait.is_zero()).then(crate::spin::Waiting::begin);
            if let Some(waiting) = waiting.as_ref().filter(|_| self.spin_backoff.should_spin()) {
                if let Some(_slot) = waiting.spin_slot() {
                    if self.unsubmitted > 0 {
                        self.enter(0)?;
                    }
                    let (got, timed_out) = self.spin_for_completions(min - added, out)?;
                    added += got;
                    self.spin_backoff.record(!timed_out);
                    if added >= min {
                        return Ok(added);
                    }
                    if !timed_out {
                        // The kernel holds nothing more: issue what the
                        // gate holds before any wait.
                        continue;
                    }
                }
            }
            if want == 0 && self.deferred_work_pending() {
                self.enter_for_events()?;
            } else if self.unsubmitted > 0 || want > 0 {
                self.enter(want)?;
            }
            added += self.drain_completions(out);
            if added >= min {
                return Ok(added);
            }
            if self.sqes_in_kernel == 0 && self.gate.queued() == 0 {
                return Ok(added);
            }
        }
    }

    fn notify_completions(&mut self, eventfd: RawFd) -> Result<()> {
        if !self.single_issuer {
            return Err(IoError::Config(format!(
                "{}: completions are signalled to an eventfd only on a single-issuer ring (defer_taskrun)",
                self.describe()
            )));
        }
        self.ring
            .submitter()
            .register_eventfd(eventfd)
            .map_err(|e| IoError::os("io_uring_register (eventfd)", self.device.describe(), e))?;
        self.notifying = true;
        Ok(())
    }

    fn notes(&self) -> &[String] {
        &self.notes
    }

    fn describe(&self) -> String {
        format!(
            "uring (qd {}, {}{}{}{}{})",
            self.queue_depth,
            if self.pool.is_registered() {
                "fixed buffers"
            } else {
                "plain buffers"
            },
            if self.fixed_file {
                ", registered file"
            } else {
                ""
            },
            if self.sqpoll { ", SQPOLL" } else { "" },
            if self.single_issuer {
                ", DEFER_TASKRUN"
            } else {
                ""
            },
            if self.iopoll { ", IOPOLL" } else { "" },
        )
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        // Buffers of requests in flight must outlive the kernel's use of them.
        let mut sink = Vec::new();
        while self.sqes_in_kernel > 0 || self.gate.queued() > 0 {
            sink.clear();
            if self.reap(1, &mut sink).is_err() {
                // The ring is unusable; leak the buffers rather than free
                // memory the kernel may still write.
                for slot in self.slots.iter_mut() {
                    if let Some(inflight) = slot.take() {
                        std::mem::forget(inflight);
                    }
                }
                return;
            }
        }
    }
}
