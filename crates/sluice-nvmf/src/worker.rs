//! Connection workers: the node's NVMe/TCP (and, on workers of their own,
//! NBD) connections served by one thread per core, not one per connection.
//! The accept path hands each connection, past its TLS or NBD handshake,
//! to a worker (in turn); the worker keeps its sockets non-blocking in one
//! epoll set and gives every connection with something to do a turn
//! ([`Session::turn`]): take what the peer sent, run its requests, issue
//! and answer device I/O, send what the socket takes.
//!
//! Between turns with nothing to do, a worker polls (epoll without waiting,
//! and the device completions of its busy connections) for a short while
//! if it holds one of the process's polling slots, as the connection
//! threads did: the next command or batch of completions usually follows
//! within a few hundred microseconds. Then it sleeps in epoll, for its
//! sockets and its devices at once: each connection's engines are the
//! worker thread's own single-issuer rings (DEFER_TASKRUN), which signal an
//! eventfd in the epoll set the moment a completion is ready to be reaped.
//! (Where an engine cannot, the worker waits for the device of a
//! connection with commands there, looking at all of them in turn when
//! several have.)
//!
//! Commands that run the slow way (Flush, Write Zeroes, Copy, the fused
//! pair, admin) wait for the worker: an admin queue's run on it, an I/O
//! queue's on the worker's helper thread, which takes the connection for
//! the time being, so that a long one holds up no other connection. A TLS
//! connection is served the same way once its handshake is done (the
//! session non-blocking over its socket: [`crate::wire::Wire`]), and so is
//! an NBD client past its handshake: a worker serves
//! [`Session`]s, whatever their protocol.

use crate::admission::Counted;
use crate::controller::Subsystem;
use crate::session::{Begin, Session};
use crate::wire::Wire;
use sluice_io::readiness::{Interest, Poller, Wakeup};
use std::collections::HashMap;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a worker polls after its last work before it waits: longer
/// than a batch of 32 commands takes at this VM's disk (as
/// [`crate::poll::POLL_AFTER_BYTES`]).
const POLL_AFTER_WORK: Duration = crate::poll::POLL_AFTER_BYTES;
/// How often a waiting worker looks at its connections' clocks and the
/// stop flag.
const TICK: Duration = Duration::from_millis(200);
/// The token of a worker's wake-up in its epoll set.
const WAKEUP_TOKEN: u64 = u64::MAX;
/// The token of the eventfd its connections' engines signal completions to.
const COMPLETIONS_TOKEN: u64 = u64::MAX - 1;
/// Most events one wait reports.
const MAX_EVENTS: usize = 256;

/// A connection on its way to a worker, with what keeps it counted
/// against the node's connection limit.
pub(crate) struct Handoff {
    pub(crate) wire: Wire,
    pub(crate) counted: Counted,
    /// Its protocol's session, made on the worker.
    pub(crate) begin: Begin,
}

struct WorkerHandle {
    inbox: Sender<Handoff>,
    wakeup: Arc<Wakeup>,
}

/// The workers of one listener.
pub(crate) struct Workers {
    workers: Vec<WorkerHandle>,
    /// Ends the workers when their listener's loop ends, stopped or not.
    done: Arc<AtomicBool>,
    next: AtomicUsize,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Workers {
    /// Starts `count` workers serving `subsystem` until `stop` is set, their
    /// threads named `name`-N.
    pub(crate) fn start(
        count: usize,
        subsystem: Arc<Subsystem>,
        stop: Arc<AtomicBool>,
        name: &str,
    ) -> std::io::Result<Workers> {
        assert!(count > 0, "at least one worker");
        let mut workers = Vec::with_capacity(count);
        let mut threads = Vec::with_capacity(count);
        let done = Arc::new(AtomicBool::new(false));
        for i in 0..count {
            let (inbox, arrivals) = channel();
            let wakeup = Arc::new(Wakeup::new()?);
            let mut worker = Worker::new(subsystem.clone(), arrivals, wakeup.clone())?;
            let (stop, done) = (stop.clone(), done.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || worker.run(&stop, &done))?,
            );
            workers.push(WorkerHandle { inbox, wakeup });
        }
        Ok(Workers {
            workers,
            done,
            next: AtomicUsize::new(0),
            threads: Mutex::new(threads),
        })
    }

    /// Gives a new connection to the next worker in turn.
    pub(crate) fn hand(&self, handoff: Handoff) -> std::io::Result<()> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.workers.len();
        let w = &self.workers[i];
        w.inbox
            .send(handoff)
            .map_err(|_| std::io::Error::other("the connection worker has stopped"))?;
        w.wakeup.wake();
        Ok(())
    }

    /// Ends the workers (their connections close) and waits for them.
    pub(crate) fn join(&self) {
        self.done.store(true, Ordering::Relaxed);
        for w in &self.workers {
            w.wakeup.wake();
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

/// One connection of a worker.
struct Served {
    session: Box<dyn Session>,
    wire: Wire,
    /// Watching for room to write too (answers wait for the host).
    watching_writes: bool,
    counted: Counted,
}

impl Served {
    /// Answers still to send: in the connection, or taken by its wire and
    /// not yet by the socket.
    fn has_unsent(&self) -> bool {
        self.session.has_unsent() || self.wire.has_unsent()
    }
}

struct Worker {
    subsystem: Arc<Subsystem>,
    arrivals: Receiver<Handoff>,
    wakeup: Arc<Wakeup>,
    poller: Poller,
    served: HashMap<u64, Served>,
    /// How many of `served` are still setting up (no Connect yet).
    setting_up: usize,
    next_token: u64,
    /// Connections epoll said were ready.
    ready: Vec<u64>,
    /// The worker's helper thread (started when first needed), which runs
    /// the slow commands of I/O queues so that a long one (a Copy of 256
    /// MiB, a Flush) holds up no other connection.
    helper: Option<Sender<(u64, Served)>>,
    /// Connections the helper is done with.
    returns: Receiver<(u64, Served)>,
    returns_to: Sender<(u64, Served)>,
    /// The eventfd the connections' engines signal their completions to,
    /// in the epoll set: the worker sleeps for sockets and devices at once.
    completions: Wakeup,
}

impl Worker {
    fn new(
        subsystem: Arc<Subsystem>,
        arrivals: Receiver<Handoff>,
        wakeup: Arc<Wakeup>,
    ) -> std::io::Result<Worker> {
        let poller = Poller::new(MAX_EVENTS)?;
        poller.add(wakeup.fd(), WAKEUP_TOKEN, Interest::READ)?;
        let completions = Wakeup::new()?;
        poller.add(completions.fd(), COMPLETIONS_TOKEN, Interest::READ)?;
        let (returns_to, returns) = channel();
        Ok(Worker {
            subsystem,
            arrivals,
            wakeup,
            poller,
            served: HashMap::new(),
            setting_up: 0,
            next_token: 0,
            ready: Vec::new(),
            helper: None,
            returns,
            returns_to,
            completions,
        })
    }

    fn run(&mut self, stop: &AtomicBool, done: &AtomicBool) {
        let mut last_work = Instant::now();
        let mut last_tick = Instant::now();
        let mut backoff = sluice_io::spin::SpinBackoff::default();
        while !stop.load(Ordering::Relaxed) && !done.load(Ordering::Relaxed) {
            // The clocks run out under load too.
            if last_tick.elapsed() >= TICK {
                self.expire();
                last_tick = Instant::now();
            }
            self.take_arrivals();
            self.take_returns();
            if self.turns() {
                last_work = Instant::now();
                continue;
            }
            if last_work.elapsed() < POLL_AFTER_WORK && backoff.should_spin() {
                let found = self.poll_briefly(last_work);
                backoff.record(found);
                if found {
                    last_work = Instant::now();
                    continue;
                }
            }
            // Nothing came while polling: sleep until a socket is ready or
            // a device completes — one epoll set holds both, as long as
            // every connection's engines signal their completions. Else
            // wait for the device if commands are there, else for a socket;
            // with commands of several connections at the device, waiting
            // on one would hold up the others' answers: look at them all,
            // giving the core away between looks.
            let unsignalled_busy =
                |s: &Served| s.session.busy_at_device() && !s.session.signals_completions();
            if !self.served.values().any(unsignalled_busy) {
                self.wait(TICK);
                continue;
            }
            let busy = self
                .served
                .values()
                .filter(|s| s.session.busy_at_device())
                .count();
            if busy > 1 {
                self.wait(Duration::ZERO);
                std::thread::yield_now();
                continue;
            }
            let busy = self
                .served
                .iter_mut()
                .find(|(_, s)| s.session.busy_at_device());
            match busy {
                Some((token, s)) => {
                    s.session.wait_for_device();
                    self.ready.push(*token);
                }
                None => self.wait(TICK),
            }
        }
        for (_, s) in self.served.drain() {
            s.session.close();
        }
    }

    /// Polls (epoll without waiting, and the connections with commands at
    /// the device) until something happens or the polling time is up,
    /// holding a polling slot; says whether something happened.
    fn poll_briefly(&mut self, last_work: Instant) -> bool {
        let waiting = sluice_io::spin::Waiting::begin();
        let Some(_slot) = waiting.spin_slot() else {
            return false;
        };
        while last_work.elapsed() < POLL_AFTER_WORK {
            self.wait(Duration::ZERO);
            if !self.ready.is_empty() || self.turns() {
                return true;
            }
            std::hint::spin_loop();
        }
        false
    }

    /// Waits in epoll up to `timeout`; the ready connections go to
    /// `self.ready`.
    fn wait(&mut self, timeout: Duration) {
        let before = self.ready.len();
        if let Err(e) = self.poller.wait(timeout, &mut self.ready) {
            log::error!("a connection worker's wait failed: {e}");
            std::thread::sleep(Duration::from_millis(10));
        }
        if self.ready[before..].contains(&COMPLETIONS_TOKEN) {
            // Every connection with commands at the device gets a turn
            // anyway ([`Worker::turns`]), which reaps them.
            self.completions.clear();
            self.ready.retain(|t| *t != COMPLETIONS_TOKEN);
        }
        if self.ready[before..].contains(&WAKEUP_TOKEN) {
            self.wakeup.clear();
            self.ready.retain(|t| *t != WAKEUP_TOKEN);
            // What the wake-up announced is taken now: a caller that polls
            // on finds those connections ready, where a wake-up cleared
            // here and acted on only at the loop's top was lost until the
            // next tick (200 ms for each MultiCast the helper ran).
            self.take_arrivals();
            self.take_returns();
        }
    }

    /// Takes back the connections the helper is done with.
    fn take_returns(&mut self) {
        while let Ok((token, s)) = self.returns.try_recv() {
            let interest = if s.has_unsent() {
                Interest::READ_WRITE
            } else {
                Interest::READ
            };
            if let Err(e) = self.poller.add(s.wire.socket(), token, interest) {
                log::warn!("a connection could not rejoin its worker: {e}");
                s.session.close();
                continue;
            }
            let mut s = s;
            s.watching_writes = interest == Interest::READ_WRITE;
            self.served.insert(token, s);
            // Its answers go out, and later PDUs are handled, next turn.
            self.ready.push(token);
        }
    }

    /// Hands a connection whose slow commands wait to the helper thread.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: started above"
    )]
    fn hand_to_helper(&mut self, token: u64) -> std::io::Result<()> {
        if self.helper.is_none() {
            let (tx, rx) = channel::<(u64, Served)>();
            let (back, wakeup) = (self.returns_to.clone(), self.wakeup.clone());
            std::thread::Builder::new()
                .name("nvmf-slow".into())
                .spawn(move || {
                    for (token, mut s) in rx {
                        s.session.run_deferred();
                        if let Err(std::sync::mpsc::SendError((_, s))) = back.send((token, s)) {
                            // The worker has stopped.
                            s.session.close();
                            continue;
                        }
                        wakeup.wake();
                    }
                })?;
            self.helper = Some(tx);
        }
        let Some(mut s) = self.served.remove(&token) else {
            return Ok(());
        };
        // It goes holding no write share: its writes at the device are
        // reaped here first, or a Compare-and-Write queued before it on the
        // helper would wait for them for ever.
        s.session.drain_device();
        let _ = self.poller.remove(s.wire.socket());
        let helper = self.helper.as_ref().expect("started above");
        if let Err(std::sync::mpsc::SendError((_, s))) = helper.send((token, s)) {
            s.session.close();
            return Err(std::io::Error::other(
                "the worker's helper thread has stopped",
            ));
        }
        Ok(())
    }

    fn take_arrivals(&mut self) {
        while let Ok(h) = self.arrivals.try_recv() {
            let token = self.next_token;
            self.next_token += 1;
            let socket = h.wire.socket();
            let added = socket
                .set_nonblocking(true)
                .and_then(|()| self.poller.add(socket, token, Interest::READ));
            if let Err(e) = added {
                log::warn!("a connection could not join its worker: {e}");
                continue;
            }
            if h.counted.in_setup() {
                self.setting_up += 1;
            }
            let completions = std::os::fd::AsRawFd::as_raw_fd(self.completions.fd());
            self.served.insert(
                token,
                Served {
                    session: (h.begin)(self.subsystem.clone(), completions),
                    wire: h.wire,
                    watching_writes: false,
                    counted: h.counted,
                },
            );
            // Its ICReq may already be there.
            self.ready.push(token);
        }
    }

    /// A turn for every connection that is ready, has commands at the
    /// device or answers to send; says whether any did something.
    fn turns(&mut self) -> bool {
        let mut ready = std::mem::take(&mut self.ready);
        ready.sort_unstable();
        ready.dedup();
        let mut progressed = false;
        let mut ended = Vec::new();
        for (token, s) in &mut self.served {
            let is_ready = ready.binary_search(token).is_ok();
            let wants_turn = s.session.busy_at_device()
                || s.has_unsent()
                || s.session.held()
                || s.wire.has_buffered();
            if !(wants_turn || is_ready) {
                continue;
            }
            match s.session.turn(&mut s.wire) {
                Ok(p) => progressed |= p,
                Err(end) => {
                    if let Err(e) = end {
                        log::info!("connection from {} ended: {e}", peer(s.wire.socket()));
                    }
                    ended.push(*token);
                    continue;
                }
            }
            let want_writes = s.has_unsent();
            if want_writes != s.watching_writes {
                let interest = if want_writes {
                    Interest::READ_WRITE
                } else {
                    Interest::READ
                };
                if self
                    .poller
                    .modify(s.wire.socket(), *token, interest)
                    .is_ok()
                {
                    s.watching_writes = want_writes;
                }
            }
        }
        for token in ended {
            self.end(token);
        }
        let progressed = progressed | self.run_deferred();
        self.admit_connected();
        progressed
    }

    /// Connections whose host has connected are past their setup: they no
    /// longer hold a setup slot (and are never closed to make room).
    fn admit_connected(&mut self) {
        if self.setting_up == 0 {
            return;
        }
        for s in self.served.values_mut() {
            if !s.counted.in_setup() {
                continue;
            }
            if s.session.is_connected() {
                s.counted.admitted();
                self.setting_up -= 1;
            } else if s.session.initialized() {
                s.counted.talking();
            }
        }
    }

    /// Runs the commands that wait for the worker (those that run the slow
    /// way): an admin queue's here, an I/O queue's on the helper thread —
    /// they may take long, or wait on a namespace's write gate, and the
    /// worker must go on reaping its other connections' writes meanwhile
    /// (a thread that waits on the gate must hold no write share, or a
    /// Compare-and-Write would wait for ever).
    fn run_deferred(&mut self) -> bool {
        let waiting: Vec<u64> = self
            .served
            .iter()
            .filter(|(_, s)| s.session.has_deferred())
            .map(|(t, _)| *t)
            .collect();
        if waiting.is_empty() {
            return false;
        }
        for t in waiting {
            if !self.served[&t].session.runs_on_worker() {
                if let Err(e) = self.hand_to_helper(t) {
                    log::error!("{e}");
                }
                continue;
            }
            if let Some(s) = self.served.get_mut(&t) {
                s.session.run_deferred();
            }
            // Its answers go out, and later PDUs are handled, next turn.
            self.ready.push(t);
        }
        true
    }

    /// Ends connections whose clocks ran out.
    fn expire(&mut self) {
        let expired: Vec<(u64, String)> = self
            .served
            .iter()
            .filter_map(|(t, s)| s.session.expired().map(|why| (*t, why)))
            .collect();
        for (token, why) in expired {
            if let Some(s) = self.served.get(&token) {
                log::info!("connection from {} ended: {why}", peer(s.wire.socket()));
            }
            self.end(token);
        }
    }

    fn end(&mut self, token: u64) {
        if let Some(s) = self.served.remove(&token) {
            if s.counted.in_setup() {
                self.setting_up -= 1;
            }
            let _ = self.poller.remove(s.wire.socket());
            s.session.close();
        }
    }
}

fn peer(stream: &TcpStream) -> String {
    stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default()
}
