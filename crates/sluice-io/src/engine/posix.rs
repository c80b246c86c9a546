//! The posix engine: pread/pwrite on worker threads. Works on every device,
//! buffered or O_DIRECT, and is the baseline every benchmark can switch to.

use super::gate::PriorityGate;
use super::{admit, Completion, Engine, EngineConfig, EngineKind, Op, Priority, Rejected, Request};
use crate::device::Device;
use crate::error::{IoError, Result};
use crate::pool::{BufferPool, Pinning};
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

struct Job {
    request: Request,
    ioprio: u16,
}

/// pread/pwrite on a fixed set of worker threads: the baseline engine.
pub struct PosixEngine {
    device: Arc<dyn Device>,
    pool: BufferPool,
    queue_depth: usize,
    accepted: usize,
    gate: PriorityGate<Request>,
    jobs: Option<Sender<Job>>,
    done: Receiver<Completion>,
    workers: Vec<JoinHandle<()>>,
    high_ioprio: u16,
    low_ioprio: u16,
    notes: Vec<String>,
}

impl PosixEngine {
    /// Starts `config.posix_threads` workers on `device`.
    pub fn open(
        device: Arc<dyn Device>,
        config: &EngineConfig,
        notes: Vec<String>,
    ) -> Result<Self> {
        config.validate()?;
        let pool = BufferPool::new(config.pool.clone(), Pinning::Unpinned)?;
        let (job_tx, job_rx) = unbounded::<Job>();
        let (done_tx, done_rx) = unbounded::<Completion>();
        let threads = config.posix_threads.min(config.queue_depth);
        let workers = (0..threads)
            .map(|i| {
                let (rx, tx, dev) = (job_rx.clone(), done_tx.clone(), device.clone());
                std::thread::Builder::new()
                    .name(format!("sluice-posix-{i}"))
                    .spawn(move || worker(dev, rx, tx))
                    .map_err(|e| IoError::os("spawn worker thread", device.describe(), e))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(PosixEngine {
            device,
            pool,
            queue_depth: config.queue_depth,
            accepted: 0,
            gate: PriorityGate::new(config.queue_depth, config.high_share),
            jobs: Some(job_tx),
            done: done_rx,
            workers,
            high_ioprio: config.high_ioprio,
            low_ioprio: config.low_ioprio,
            notes,
        })
    }

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: workers running; workers outlive the engine"
    )]
    fn issue_queued(&mut self) {
        let jobs = self.jobs.as_ref().expect("workers running");
        while let Some((priority, request)) = self.gate.pop() {
            // An ordered flush waits, and everything behind it, until what
            // was issued before it has completed (workers run in parallel).
            if request.after_prior && self.gate.issued() > 1 {
                self.gate.unpop(priority, request);
                break;
            }
            let ioprio = match priority {
                Priority::High => self.high_ioprio,
                Priority::Low => self.low_ioprio,
            };
            jobs.send(Job { request, ioprio })
                .expect("workers outlive the engine");
        }
    }

    fn take(&mut self, c: Completion, out: &mut Vec<Completion>) {
        self.gate.completed(c.priority);
        self.accepted -= 1;
        out.push(c);
    }
}

fn set_thread_ioprio(ioprio: u16) {
    const IOPRIO_WHO_PROCESS: libc::c_int = 1;
    // SAFETY: ioprio_set takes plain integers; who=0 means the calling thread.
    unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0,
            ioprio as libc::c_int,
        )
    };
}

fn worker(device: Arc<dyn Device>, jobs: Receiver<Job>, done: Sender<Completion>) {
    let mut current_ioprio = None;
    let block_size = device.geometry().block_size_bytes as u64;
    for Job { request, ioprio } in jobs.iter() {
        if current_ioprio != Some(ioprio) {
            set_thread_ioprio(ioprio);
            current_ioprio = Some(ioprio);
        }
        let result = execute(device.as_ref(), &request, block_size);
        let c = Completion {
            user_data: request.user_data,
            op: request.op,
            lba: request.lba,
            priority: request.priority,
            result,
            buf: request.buf,
        };
        if done.send(c).is_err() {
            return;
        }
    }
}

fn execute(device: &dyn Device, request: &Request, block_size: u64) -> Result<usize> {
    let Some(buf) = request.buf.as_ref() else {
        return device.flush().map(|()| 0);
    };
    for (at, seg) in buf.io_segments() {
        let lba = request.lba + at as u64 / block_size;
        // SAFETY: the segment belongs to the request's buffer, which this
        // worker holds exclusively until it sends the completion.
        let bytes = unsafe { std::slice::from_raw_parts_mut(seg.ptr(), seg.len_bytes()) };
        match request.op {
            Op::Read => device.read_at(lba, bytes)?,
            Op::Write => device.write_at(lba, bytes)?,
            Op::Flush => unreachable!("flush carries no buffer"),
        }
    }
    if request.dsync {
        device.flush()?;
    }
    Ok(buf.len())
}

impl Engine for PosixEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Posix
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

    fn submit(&mut self, request: Request) -> std::result::Result<(), Rejected> {
        let request = admit(
            self.device.as_ref(),
            &self.pool,
            self.accepted,
            self.queue_depth,
            request,
        )?;
        self.accepted += 1;
        self.gate.push(request.priority, request);
        self.issue_queued();
        Ok(())
    }

    fn reap(&mut self, min_complete: usize, out: &mut Vec<Completion>) -> Result<usize> {
        let min = min_complete.min(self.accepted);
        let mut added = 0;
        loop {
            // A completion may free the gate for held requests (an ordered
            // flush waits for everything before it).
            self.issue_queued();
            while let Ok(c) = self.done.try_recv() {
                self.take(c, out);
                added += 1;
                self.issue_queued();
            }
            if added >= min {
                return Ok(added);
            }
            let c = self
                .done
                .recv()
                .map_err(|_| IoError::EngineStopped("posix workers exited".into()))?;
            self.take(c, out);
            added += 1;
        }
    }

    fn notes(&self) -> &[String] {
        &self.notes
    }

    fn describe(&self) -> String {
        format!(
            "posix ({} threads, qd {}, {})",
            self.workers.len(),
            self.queue_depth,
            if self.device.is_direct() {
                "O_DIRECT"
            } else {
                "buffered"
            }
        )
    }
}

impl Drop for PosixEngine {
    fn drop(&mut self) {
        // Closing the job channel lets workers finish what they hold and exit.
        self.jobs.take();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
