//! The threads that run requests: a fixed few, shared by every
//! connection. The event loop ([`crate::ring`]) hands them whole requests
//! and they hand back encoded answers; a request may block (a scan, a
//! device read, a bulk write waiting for the log) without holding up any
//! connection but its own, and a thousand idle connections cost no thread.
//!
//! Each connection has at most one request here at a time, so the queue
//! never holds more than `--http-max-connections` jobs.

use crate::api::Api;
use crate::error::ApiError;
use crate::wire::{self, Encoded, Request, Response};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Where a ring's finished requests go: a list it drains, and its waker.
/// The waker is used only while the ring is parked in a wait: a busy ring
/// drains the list on its next turn anyway, and a wake is a system call.
pub(crate) struct Mailbox {
    done: Mutex<Vec<Done>>,
    /// Answers in `done` (read without the lock).
    waiting: AtomicUsize,
    /// The ring is in, or about to enter, a wait.
    parked: AtomicBool,
    /// The ring holds bytes of a connection that wait for its answer
    /// (pipelined requests): every answer wakes it. Otherwise only answers
    /// it must act on wake it — the rest of one to send, a connection to
    /// close — and one wholly sent is taken on its next turn.
    urgent: AtomicBool,
    waker: Arc<sluice_io::net::Waker>,
}

impl Mailbox {
    pub(crate) fn new(waker: Arc<sluice_io::net::Waker>) -> Mailbox {
        Mailbox {
            done: Mutex::new(Vec::new()),
            waiting: AtomicUsize::new(0),
            parked: AtomicBool::new(false),
            urgent: AtomicBool::new(false),
            waker,
        }
    }

    /// Whether the ring holds input that waits for an answer.
    pub(crate) fn set_urgent(&self, urgent: bool) {
        self.urgent.store(urgent, Ordering::SeqCst);
    }

    fn post(&self, done: Done) {
        let must_act =
            !done.keep_alive || done.sent < done.encoded.head.len() + done.encoded.body.len();
        {
            let mut list = self.done.lock().unwrap_or_else(|p| p.into_inner());
            list.push(done);
            self.waiting.store(list.len(), Ordering::SeqCst);
        }
        // Paired with `park`: either the ring sees the answer before it
        // waits, or this sees it parked and wakes it.
        if self.parked.load(Ordering::SeqCst) && (must_act || self.urgent.load(Ordering::SeqCst)) {
            self.waker.wake();
        }
    }

    /// Called by the ring before it waits: false when answers are waiting
    /// already (then it must not wait). [`Mailbox::unpark`] after the wait.
    pub(crate) fn park(&self) -> bool {
        self.parked.store(true, Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.parked.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Called by the ring after a wait.
    pub(crate) fn unpark(&self) {
        self.parked.store(false, Ordering::SeqCst);
    }

    /// Takes what finished since the last call.
    pub(crate) fn take(&self, into: &mut Vec<Done>) {
        if self.waiting.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::swap(&mut *done, into);
        self.waiting.store(0, Ordering::SeqCst);
    }
}

/// A request to run, and where its answer goes.
pub(crate) struct Job {
    pub(crate) mailbox: Arc<Mailbox>,
    /// The connection's slot and generation in its ring.
    pub(crate) conn: u32,
    pub(crate) generation: u64,
    pub(crate) request: Request,
    /// The connection's socket when the answer may be sent from the
    /// pool's thread (no TLS): the ring keeps it open until the answer is
    /// posted back.
    pub(crate) socket: Option<std::os::fd::RawFd>,
}

/// A request's answer, encoded.
pub(crate) struct Done {
    pub(crate) conn: u32,
    pub(crate) generation: u64,
    pub(crate) encoded: Encoded,
    /// Bytes of the head, then the body, already sent from the pool's
    /// thread; the ring sends the rest.
    pub(crate) sent: usize,
    /// Whether the connection goes on after this answer.
    pub(crate) keep_alive: bool,
}

/// The threads and their queue.
pub(crate) struct Pool {
    shared: Arc<Queue>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

struct Queue {
    jobs: Mutex<Jobs>,
    /// Jobs queued (read without the lock by spinning threads).
    queued: AtomicUsize,
    /// Threads looking for a job before they sleep: while one is, a new
    /// job wakes nobody (it will be taken in microseconds).
    spinning: AtomicUsize,
    ready: Condvar,
    stopping: AtomicBool,
}

/// How many times a thread out of jobs yields and looks again before it
/// sleeps: about the time a short request takes. While one looks, a new
/// job wakes no thread (a futex wake was 9.5% of the ring's time in a
/// profile of `_count` at 16 connections); the gain measured at 16
/// connections was within the runs' spread (docs/BENCHMARKS.md "One
/// network model"), and under no load the looking costs a thread ~40
/// yields after its last request.
const SPINS_BEFORE_SLEEP: usize = 40;

struct Jobs {
    queued: VecDeque<Job>,
    /// Threads waiting for a job: a job queued while every thread is busy
    /// needs no wake (the next thread free takes it).
    idle_threads: usize,
}

impl Pool {
    /// Starts `threads` threads running requests on `api`; `shutdown`
    /// makes the answers they give close their connections.
    pub(crate) fn start(
        api: Arc<Api>,
        threads: usize,
        shutdown: Arc<AtomicBool>,
    ) -> std::io::Result<Pool> {
        assert!(threads > 0, "a pool of no threads");
        let shared = Arc::new(Queue {
            jobs: Mutex::new(Jobs {
                queued: VecDeque::new(),
                idle_threads: 0,
            }),
            queued: AtomicUsize::new(0),
            spinning: AtomicUsize::new(0),
            ready: Condvar::new(),
            stopping: AtomicBool::new(false),
        });
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads {
            let (queue, api, shutdown) = (shared.clone(), api.clone(), shutdown.clone());
            handles.push(
                std::thread::Builder::new()
                    .name(format!("sluice-http-{i}"))
                    .spawn(move || work(&queue, &api, &shutdown))?,
            );
        }
        Ok(Pool {
            shared,
            threads: handles,
        })
    }

    /// Queues `job` for the next free thread.
    pub(crate) fn submit(&self, job: Job) {
        let wake = {
            let mut jobs = self.shared.jobs.lock().unwrap_or_else(|p| p.into_inner());
            jobs.queued.push_back(job);
            self.shared
                .queued
                .store(jobs.queued.len(), Ordering::SeqCst);
            jobs.idle_threads > 0 && self.shared.spinning.load(Ordering::SeqCst) == 0
        };
        if wake {
            self.shared.ready.notify_one();
        }
    }

    /// Lets the threads finish what is queued, then ends them.
    pub(crate) fn stop(self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.ready.notify_all();
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn work(queue: &Queue, api: &Api, shutdown: &AtomicBool) {
    loop {
        spin_for_a_job(queue);
        let job = {
            let mut jobs = queue.jobs.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(job) = jobs.queued.pop_front() {
                    queue.queued.store(jobs.queued.len(), Ordering::SeqCst);
                    break job;
                }
                if queue.stopping.load(Ordering::Acquire) {
                    return;
                }
                jobs.idle_threads += 1;
                jobs = queue.ready.wait(jobs).unwrap_or_else(|p| p.into_inner());
                jobs.idle_threads -= 1;
            }
        };
        let mailbox = job.mailbox.clone();
        mailbox.post(run(api, job, shutdown));
    }
}

/// Yields and looks for a job a few times before the caller locks the
/// queue (and sleeps there if it is still empty).
fn spin_for_a_job(queue: &Queue) {
    if queue.queued.load(Ordering::SeqCst) > 0 {
        return;
    }
    queue.spinning.fetch_add(1, Ordering::SeqCst);
    for _ in 0..SPINS_BEFORE_SLEEP {
        if queue.queued.load(Ordering::SeqCst) > 0 || queue.stopping.load(Ordering::Acquire) {
            break;
        }
        std::thread::yield_now();
    }
    // Before the lock: a job queued after this sees no spinner and wakes
    // a sleeper, and one queued before it is found under the lock.
    queue.spinning.fetch_sub(1, Ordering::SeqCst);
}

/// Runs one request and encodes its answer.
fn run(api: &Api, job: Job, shutdown: &AtomicBool) -> Done {
    let Job {
        conn,
        generation,
        mut request,
        socket,
        ..
    } = job;
    let head_only = request.method == "HEAD";
    let gzip = request
        .header("accept-encoding")
        .is_some_and(|a| a.contains("gzip"));
    let (response, sound) = answer(api, &mut request);
    let keep_alive = sound && request.keep_alive() && !shutdown.load(Ordering::Acquire);
    let encoded = wire::encode_response(response, head_only, gzip, keep_alive);
    match encoded {
        Ok(encoded) => {
            // Sent from here when the socket takes it now: the ring only
            // hears that the answer went.
            let sent = socket.map_or(0, |fd| {
                sluice_io::net::send_nowait(&fd, &[&encoded.head, &encoded.body]).unwrap_or(0)
            });
            Done {
                conn,
                generation,
                encoded,
                sent,
                keep_alive,
            }
        }
        Err(e) => {
            // Only compression can fail here, and it writes to memory.
            log::error!("http: encoding an answer failed: {e}");
            Done {
                conn,
                generation,
                encoded: Encoded {
                    head: b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_vec(),
                    body: Vec::new(),
                },
                sent: 0,
                keep_alive: false,
            }
        }
    }
}

/// Runs an allowed request; whether the connection may go on. A panic in
/// the API is a bug: it is answered 500 and the connection closed, instead
/// of the connection ending without a word.
fn answer(api: &Api, request: &mut Request) -> (Response, bool) {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| api.handle(request))) {
        Ok(response) => (response, true),
        Err(_) => {
            log::error!(
                "http: a {} {} request panicked; answered 500",
                request.method,
                request.path
            );
            let e = ApiError::new(
                500,
                "exception",
                "the server failed on this request (a bug: its log has the details)",
            );
            (
                Response::json(500, e.body().to_string().into_bytes()),
                false,
            )
        }
    }
}
