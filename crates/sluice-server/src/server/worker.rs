//! A worker thread's loop: reap the network ring, run what arrived,
//! release replies the log has made durable, send, and wait — polling
//! while busy, blocking when idle.

use super::clock::CommandClock;
use super::conn::{Conn, ShmLink, Transport};
use super::pass::{fill_token, start_fills, Grouped, Pass, Stop, MAX_FILL_ROUNDS};
use super::shm::WorkerInbox;
use super::{dispatch, Shared, WorkerStats, TICK};
use crate::session::Session;
use sluice_io::net::{ConnId, NetEvent, NetRing, NetRingConfig, Waker};
use sluice_store::wal::LogPosition;
use sluice_store::ReadCache;
use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Redis's reply to a client over `maxclients`.
const MAX_CLIENTS_REPLY: &[u8] = b"-ERR max number of clients reached\r\n";
/// A worker reads the clock once in this many turns (a read costs about
/// as much as a turn with nothing to do).
const CLOCK_EVERY_TURNS: u32 = 32;
/// How soon a worker holding writes back under write pressure looks again.
const DEFERRED_RETRY: Duration = Duration::from_millis(1);
/// How long a stopping worker waits for its connections to finish what
/// they hold (replies to send, held writes to commit) before it drops
/// those left, saying which and in what state.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// A send buffer kept for reuse only up to this size.
const SPARE_MAX_BYTES: usize = 1 << 20;
/// Most bytes taken from a shared-memory client's request ring at once.
const SHM_READ_BYTES: usize = 256 << 10;

/// What a listener of the worker's ring serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListenerKind {
    Tcp,
    Tls,
    Unix,
}

/// The sockets a worker accepts on.
pub(super) struct Listeners {
    pub(super) tcp: TcpListener,
    pub(super) tls: Option<TcpListener>,
    /// One Unix socket every worker accepts on.
    pub(super) unix: Option<Arc<UnixListener>>,
}

pub(super) fn run(
    shared: Arc<Shared>,
    listeners: Listeners,
    core: usize,
    ready: Sender<std::io::Result<()>>,
) -> std::io::Result<()> {
    // The cores the process may run on, read before this thread is pinned
    // to one (a pinned thread sees only its own).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let yield_while_idle = shared.config.threads >= cores;
    if shared.config.pin_threads {
        if let Err(e) = sluice_io::net::pin_current_thread(core) {
            log::warn!("could not pin a worker to core {core}: {e}");
        }
    }
    let mut kinds = Vec::new();
    let started = NetRing::new(NetRingConfig::default()).and_then(|mut ring| {
        ring.accept_on(&listeners.tcp)?;
        kinds.push(ListenerKind::Tcp);
        if let Some(l) = &listeners.tls {
            ring.accept_on(l)?;
            kinds.push(ListenerKind::Tls);
        }
        if let Some(l) = &listeners.unix {
            ring.accept_on(&**l)?;
            kinds.push(ListenerKind::Unix);
        }
        Ok(ring)
    });
    let ring = match started {
        Ok(ring) => ring,
        Err(e) => {
            let _ = ready.send(Err(std::io::Error::new(e.kind(), e.to_string())));
            return Err(e);
        }
    };
    let waker = ring.waker();
    let waker_for_wakes = waker.clone();
    let (index, kills) = shared.registry.add_worker(waker.clone());
    shared
        .wakers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(waker.clone());
    let inbox = Arc::new(WorkerInbox::new(waker.clone()));
    shared
        .shm_inboxes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(inbox.clone());
    let _ = ready.send(Ok(()));
    let shared_fill_queue = shared.db.store().fill_queue();
    let mut worker = Worker {
        yield_while_idle,
        shared,
        ring,
        waker,
        listeners: Some(listeners),
        kinds,
        conns: Vec::new(),
        free: Vec::new(),
        requested: None,
        last_tick: Instant::now(),
        now: Instant::now(),
        clock: CommandClock::start(),
        turns: 0,
        events: Events::default(),
        pending: Vec::new(),
        work: Vec::new(),
        marks: Vec::new(),
        turn_mark: 0,
        room_waiters: Vec::new(),
        index,
        kills,
        deferring: false,
        inbox,
        shm_conns: Vec::new(),
        reads: ReadCache::default(),
        fills: shared_fill_queue,
        filled: Vec::new(),
        group: Grouped::default(),
        wakes: super::blocking::WakeQueue::new(waker_for_wakes.clone()),
        pushes: super::pubsub::PushQueue::new(waker_for_wakes.clone()),
        scripts_done: super::scripting::DoneQueue::new(waker_for_wakes),
        blocked: Vec::new(),
        stop_started: None,
    };
    worker.run()
}

/// What one reap found, applied after it (the ring is borrowed during it).
#[derive(Default)]
struct Events {
    /// Connections a completion was about.
    touched: Vec<ConnId>,
    /// New connections, and the index of the listener they came to.
    accepted: Vec<(OwnedFd, usize)>,
    rearm: Vec<ConnId>,
    resend: Vec<(ConnId, Vec<u8>, usize)>,
}

struct Worker {
    /// Workers on every core: an idle turn yields the core (see `run`).
    yield_while_idle: bool,
    shared: Arc<Shared>,
    ring: NetRing,
    waker: Arc<Waker>,
    /// Dropped (closed) when the worker stops accepting.
    listeners: Option<Listeners>,
    /// What each listener index of the ring serves.
    kinds: Vec<ListenerKind>,
    conns: Vec<Option<Conn>>,
    free: Vec<ConnId>,
    /// The furthest position this worker asked the committer for.
    requested: Option<LogPosition>,
    last_tick: Instant,
    /// The time as of the last clock read (every few turns): what
    /// activity is stamped with, for idle timeouts.
    now: Instant,
    /// Times the commands run, one clock reading each.
    clock: CommandClock,
    /// Turns so far.
    turns: u32,
    events: Events,
    /// Connections that need a look next turn without a completion
    /// (requests left by the pipeline limit, replies held, closing).
    pending: Vec<ConnId>,
    /// This turn's connections to look at, each once.
    work: Vec<ConnId>,
    /// Per slot, the last turn it was put in `work` (a turn's mark).
    marks: Vec<u32>,
    turn_mark: u32,
    /// Connections whose next command needs device reads while the fill
    /// queue is full: looked at again once reads complete.
    room_waiters: Vec<ConnId>,
    /// This worker's index among the server's workers.
    index: usize,
    /// A connection's write waits for the store's write pressure to pass.
    deferring: bool,
    /// Clients CLIENT KILL closes, from any worker.
    kills: Arc<super::clients::KillQueue>,
    /// Shared-memory clients the acceptor hands to this worker.
    inbox: Arc<WorkerInbox>,
    /// The slots of this worker's shared-memory clients, polled each turn.
    shm_conns: Vec<ConnId>,
    /// The store's view this worker's GETs read from; let go of while the
    /// thread blocks, so an idle worker holds no old tables.
    reads: ReadCache,
    /// Device reads of commands that did not wait for them (their
    /// connections parked meanwhile), and the reads found done this turn.
    fills: sluice_store::FillQueue,
    filled: Vec<(u64, sluice_store::Result<()>)>,
    /// A turn's SET group, kept between turns for its buffers' room.
    group: Grouped,
    /// Where writes to keys this worker's blocked clients wait on wake
    /// them (`server::blocking`).
    wakes: Arc<super::blocking::WakeQueue>,
    /// Where publishers leave messages for this worker's subscribers.
    pushes: Arc<super::pubsub::PushQueue>,
    /// Where the script thread leaves this worker's script replies.
    scripts_done: Arc<super::scripting::DoneQueue>,
    /// Connections blocked on keys (or woken and trying again), watched
    /// for their deadlines.
    blocked: Vec<ConnId>,
    /// When this worker began to stop.
    stop_started: Option<Instant>,
}

impl Worker {
    fn run(&mut self) -> std::io::Result<()> {
        let spin = Duration::from_micros(self.shared.config.spin_us);
        // Workers on every core leave none for the clients, the committer
        // and the background threads: an idle look gives the core to any
        // of them that can run (with `--threads 2` on two cores, 50
        // connections at P 1 went from 58-68k to 93-115k requests/s,
        // docs/BENCHMARKS.md). With a core to spare, it spins plainly.
        let yield_while_idle = self.yield_while_idle;
        // Idle turns in a row, and when they began: the clock is read
        // once every CLOCK_EVERY_TURNS of them, not every turn.
        let mut idle_turns = 0u32;
        let mut idle_since = Instant::now();
        // Held for the thread's life: a turn borrows it, not the worker.
        let gate = self.shared.scripts.gate.clone();
        loop {
            if self.shared.stopping() {
                self.begin_stop();
                if self.conns.iter().all(Option::is_none) {
                    return Ok(());
                }
                let started = *self.stop_started.get_or_insert_with(Instant::now);
                if started.elapsed() > STOP_GRACE {
                    self.drop_unfinished();
                    return Ok(());
                }
            }
            let worked = self.turn(&gate)?;
            if worked {
                idle_turns = 0;
            } else {
                idle_turns += 1;
            }
            // The spin is timed from the CLOCK_EVERY_TURNS-th idle turn: a
            // server answering one request at a time reads no clock.
            let spinning = self.fills.in_flight() > 0
                || match idle_turns {
                    n if n < CLOCK_EVERY_TURNS => true,
                    CLOCK_EVERY_TURNS => {
                        idle_since = Instant::now();
                        true
                    }
                    n => !n.is_multiple_of(CLOCK_EVERY_TURNS) || idle_since.elapsed() < spin,
                };
            if worked || spinning {
                // While shared-memory clients keep it busy, the thread
                // enters the kernel only when a socket needs it.
                if self.ring.needs_enter() {
                    self.ring.wait(None)?;
                } else if !worked && yield_while_idle {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            } else if self.shm_may_sleep() {
                self.reads.clear();
                let timeout = if self.deferring {
                    DEFERRED_RETRY
                } else {
                    self.until_next_deadline(TICK)
                };
                self.ring.wait(Some(timeout))?;
                self.shm_awake();
                self.now = Instant::now();
                idle_turns = 0;
            }
        }
    }

    /// One loop turn; whether anything happened. `gate` says whether its
    /// commands may take stripe locks (no script holds or waits for them).
    fn turn(&mut self, gate: &super::scripting::TurnGate) -> std::io::Result<bool> {
        let reaped = self.reap()? + self.reap_fills();
        self.apply_events()?;
        self.take_arrivals()?;
        let polled = self.poll_shm();
        for (slot, id) in self.kills.take() {
            if let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) {
                if c.session.id() == id {
                    c.dead = true;
                    self.pending.push(slot);
                }
            }
        }
        self.take_wakes();
        self.expire_blocked();
        self.take_pushes();
        self.take_script_replies();
        // Only connections something happened to, or that wait on
        // something, are looked at: ten thousand idle ones cost nothing.
        // In the order their requests came: those left from earlier turns
        // first, then as the completions arrived (as Redis's one event loop
        // takes them: a client blocked before another is served first).
        self.work.clear();
        self.turn_mark = self.turn_mark.wrapping_add(1).max(1);
        let mark = self.turn_mark;
        for id in self.pending.drain(..).chain(self.events.touched.drain(..)) {
            let slot = id as usize;
            if self.marks.len() <= slot {
                self.marks.resize(slot + 1, 0);
            }
            if self.marks[slot] != mark {
                self.marks[slot] = mark;
                self.work.push(id);
            }
        }
        // An idle turn ends here: the sooner the next look at the rings,
        // the sooner a request that lands meanwhile is seen.
        let (mut served, mut wrote) = (false, false);
        if !self.work.is_empty() {
            let gated = gate.begin();
            served = self.serve_all(gated.may_lock);
            drop(gated);
            self.release_durable();
            wrote = self.send_all()?;
            self.close_finished();
            self.keep_pending();
        } else {
            self.deferring = false;
        }
        self.turns = self.turns.wrapping_add(1);
        if self.turns.is_multiple_of(CLOCK_EVERY_TURNS) {
            self.now = Instant::now();
            if self.now.duration_since(self.last_tick) >= TICK {
                self.last_tick = self.now;
                self.close_idle();
            }
        }
        Ok(reaped > 0 || served || polled || wrote)
    }

    /// Blocked connections a write woke: their blocking command runs again
    /// this turn, keeping its place in the registry should it find
    /// nothing.
    #[expect(
        clippy::expect_used,
        reason = "each expect follows the check of the same value just before it"
    )]
    fn take_wakes(&mut self) {
        for (slot, ticket, wake) in self.wakes.take() {
            let c = self.conns.get_mut(slot as usize).and_then(Option::as_mut);
            // A second wake of a waiter already woken is the same run.
            let running = c
                .as_ref()
                .is_some_and(|c| c.retry.as_ref().is_some_and(|r| r.ticket == ticket));
            let Some(c) = c.filter(|c| c.blocked.as_ref().is_some_and(|b| b.ticket == ticket))
            else {
                // Gone, or no longer waiting with that ticket: nothing
                // runs again for this wake.
                if wake == super::blocking::Wake::Retry && !running {
                    self.shared.blocking.retried(ticket);
                }
                continue;
            };
            let b = c.blocked.take().expect("checked");
            match wake {
                super::blocking::Wake::Retry => {
                    c.deferred = Some(b.args.clone());
                    c.retry = Some(b);
                }
                super::blocking::Wake::Unblock { error } => {
                    self.shared.blocking.leave(&b.keys, b.ticket);
                    c.push_reply(&if error {
                        crate::resp::Reply::Error(
                            "UNBLOCKED client unblocked via CLIENT UNBLOCK".into(),
                        )
                    } else {
                        crate::commands::blocking::timeout_reply()
                    });
                }
            }
            c.more_input = true;
            self.pending.push(slot);
        }
    }

    /// Queues the messages publishers left for this worker's subscribers.
    fn take_pushes(&mut self) {
        for (slot, client, push) in self.pushes.take() {
            let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) else {
                continue;
            };
            if c.session.id() != client || c.dead {
                continue;
            }
            if let Some(message) = c.push_for(push) {
                c.push_message(&message);
                self.pending.push(slot);
            }
        }
    }

    /// Queues the replies of scripts the script thread ran; the
    /// connections go on with what they sent after.
    fn take_script_replies(&mut self) {
        for done in self.scripts_done.take() {
            let Some(c) = self
                .conns
                .get_mut(done.slot as usize)
                .and_then(Option::as_mut)
            else {
                continue;
            };
            if c.session.id() != done.client || !c.script_pending {
                continue;
            }
            c.script_pending = false;
            if let Some(at) = done.wrote {
                WorkerStats::add(&self.shared.stats.by_worker[self.index].changes, 1);
                self.shared.committer.wrote(at);
                if self.shared.durability().holds(self.shared.db.store(), at) {
                    // Before the reply is queued: it is the first to wait.
                    c.hold_until(at);
                }
            }
            c.push_reply(&done.reply);
            // Counted now that it is answered: its command is the last
            // this connection ran (nothing more of it ran meanwhile).
            if let Some(id) = c.live.last_command.load(Ordering::Relaxed).checked_sub(1) {
                let failed = matches!(done.reply, crate::resp::Reply::Error(_)).then_some(false);
                dispatch::count_call(&self.shared, self.index, id as usize, done.us, failed);
            }
            c.more_input = true;
            self.pending.push(done.slot);
        }
    }

    /// Answers blocked connections whose time is up as Redis does (a null
    /// reply) and takes them out of the registry.
    #[expect(
        clippy::expect_used,
        reason = "each expect follows the check of the same value just before it"
    )]
    fn expire_blocked(&mut self) {
        if self.blocked.is_empty() {
            return;
        }
        let now = Instant::now();
        let (conns, pending) = (&mut self.conns, &mut self.pending);
        let blocking = &self.shared.blocking;
        self.blocked.retain(|&slot| {
            let Some(c) = conns.get_mut(slot as usize).and_then(Option::as_mut) else {
                return false;
            };
            let Some(b) = &c.blocked else {
                return c.retry.is_some();
            };
            if b.deadline.is_none_or(|d| d > now) {
                return true;
            }
            let b = c.blocked.take().expect("checked");
            blocking.leave(&b.keys, b.ticket);
            c.push_reply(&timeout_reply_of(&b.args));
            c.more_input = true;
            pending.push(slot);
            false
        });
    }

    /// How long the worker may sleep: `most`, or less when a blocked
    /// connection's deadline comes sooner.
    fn until_next_deadline(&self, most: Duration) -> Duration {
        let now = Instant::now();
        self.blocked
            .iter()
            .filter_map(|&slot| {
                self.conns
                    .get(slot as usize)?
                    .as_ref()?
                    .blocked
                    .as_ref()?
                    .deadline
            })
            .map(|d| d.saturating_duration_since(now))
            .fold(most, Duration::min)
    }

    /// Takes in the GETs' device reads that are done, and gives their
    /// connections a look this turn; how many.
    fn reap_fills(&mut self) -> usize {
        if self.fills.in_flight() == 0 {
            return 0;
        }
        let mut filled = std::mem::take(&mut self.filled);
        if let Err(e) = self.fills.reap(&mut filled) {
            // Its reads may never be reported: every parked command runs
            // again and reads on the worker.
            log::warn!("reaping device reads failed: {e}; parked commands read on the worker");
            for (id, slot) in self.conns.iter_mut().enumerate() {
                if let Some(c) = slot.as_mut().filter(|c| c.parked_reads > 0) {
                    c.parked_reads = 0;
                    c.fills = MAX_FILL_ROUNDS;
                    c.more_input = true;
                    self.pending.push(id as ConnId);
                }
            }
        }
        let n = filled.len();
        for (token, result) in filled.drain(..) {
            let id = (token & u64::from(u32::MAX)) as ConnId;
            let Some(c) = self.conns.get_mut(id as usize).and_then(Option::as_mut) else {
                continue;
            };
            if fill_token(id, c.session.id()) != token || c.parked_reads == 0 {
                continue;
            }
            if let Err(e) = result {
                // Run again reading on the worker: the error is its reply.
                log::warn!("a device read for a command failed: {e}");
                c.fills = MAX_FILL_ROUNDS;
            }
            c.parked_reads -= 1;
            if c.parked_reads > 0 {
                continue;
            }
            c.fills = c.fills.saturating_add(1);
            c.more_input = true;
            self.pending.push(id);
        }
        self.filled = filled;
        if n > 0 && self.fills.has_room() {
            for id in self.room_waiters.drain(..) {
                if let Some(c) = self.conns.get_mut(id as usize).and_then(Option::as_mut) {
                    c.more_input = true;
                    self.pending.push(id);
                }
            }
        }
        n
    }

    fn reap(&mut self) -> std::io::Result<usize> {
        let conns = &mut self.conns;
        let events = &mut self.events;
        let stats = &self.shared.stats.by_worker[self.index];
        let max_query = self.shared.max_query_bytes.load(Ordering::Relaxed);
        let now = self.now;
        self.ring.reap(|event| match event {
            NetEvent::Accepted { listener, socket } => events.accepted.push((socket, listener)),
            NetEvent::AcceptFailed(e) => log::warn!("accept failed: {e}"),
            NetEvent::Received { conn, bytes } => {
                events.touched.push(conn);
                let Some(c) = conns.get_mut(conn as usize).and_then(Option::as_mut) else {
                    return;
                };
                WorkerStats::add(&stats.net_input_bytes, bytes.len() as u64);
                c.last_active = now;
                if c.dead || c.closing || c.stream.is_shm() {
                    // A shared-memory client's socket carries nothing
                    // after the handshake.
                    return;
                }
                match &mut c.tls {
                    None => c.reader.feed(bytes),
                    Some(tls) => {
                        let mut plain = Vec::new();
                        if let Err(e) = super::tls::receive(tls, bytes, &mut plain) {
                            log::info!("closing TLS client {}: {e}", c.addr);
                            c.dead = true;
                            return;
                        }
                        if c.denied {
                            if !tls.is_handshaking() {
                                c.push_bytes(super::DENIED_REPLY);
                                c.quit = true;
                                c.closing = true;
                            }
                            return;
                        }
                        c.reader.feed(&plain);
                    }
                }
                c.more_input = true;
                if c.reader.pending_bytes() > max_query {
                    log::warn!(
                        "closing client {}: its query buffer passed {max_query} bytes",
                        c.addr
                    );
                    c.dead = true;
                }
            }
            NetEvent::RecvPaused { conn } => events.rearm.push(conn),
            NetEvent::RecvEnded { conn, result } => {
                events.touched.push(conn);
                if let Some(c) = conns.get_mut(conn as usize).and_then(Option::as_mut) {
                    c.recv_armed = false;
                    match result {
                        // A shared-memory client hung up: it is gone, and
                        // so is whatever it left half-written.
                        Ok(()) if c.stream.is_shm() => c.dead = true,
                        Ok(()) => c.closing = true,
                        Err(_) => c.dead = true,
                    }
                }
            }
            NetEvent::Sent {
                conn,
                buf,
                sent_to,
                error,
            } => {
                events.touched.push(conn);
                let Some(c) = conns.get_mut(conn as usize).and_then(Option::as_mut) else {
                    return;
                };
                if error.is_some() {
                    c.dead = true;
                } else if sent_to < buf.len() && !c.dead {
                    events.resend.push((conn, buf, sent_to));
                } else {
                    WorkerStats::add(&stats.net_output_bytes, buf.len() as u64);
                    let mut buf = buf;
                    buf.clear();
                    if buf.capacity() <= SPARE_MAX_BYTES {
                        c.spare = buf;
                    }
                }
            }
            NetEvent::Woken => {}
        })
    }

    fn apply_events(&mut self) -> std::io::Result<()> {
        for (socket, listener) in std::mem::take(&mut self.events.accepted) {
            match self.kinds.get(listener) {
                Some(ListenerKind::Tcp) => self.admit(TcpStream::from(socket), false)?,
                Some(ListenerKind::Tls) => self.admit(TcpStream::from(socket), true)?,
                Some(ListenerKind::Unix) => self.admit_unix(UnixStream::from(socket))?,
                None => log::error!("a connection from unknown listener {listener}"),
            }
        }
        for id in std::mem::take(&mut self.events.rearm) {
            let Some(c) = self.conns.get_mut(id as usize).and_then(Option::as_mut) else {
                continue;
            };
            if c.dead || c.closing {
                c.recv_armed = false;
            } else {
                self.ring.recv(id, &c.stream)?;
            }
        }
        for (id, buf, sent_to) in std::mem::take(&mut self.events.resend) {
            if let Some(c) = self.conns.get_mut(id as usize).and_then(Option::as_mut) {
                self.ring.send(id, &c.stream, buf, sent_to)?;
            }
        }
        Ok(())
    }

    /// Counts a new connection in; false (and Redis's error sent) if it
    /// is over the client limit or the server stops.
    fn count_in(&self, mut refuse: impl FnMut(&[u8])) -> bool {
        let shared = &self.shared;
        shared
            .stats
            .connections_received
            .fetch_add(1, Ordering::Relaxed);
        let admitted = shared
            .clients
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < shared.max_clients.load(Ordering::Relaxed)).then_some(n + 1)
            })
            .is_ok();
        if !admitted || shared.stopping() {
            shared
                .stats
                .rejected_connections
                .fetch_add(1, Ordering::Relaxed);
            if admitted {
                shared.clients.fetch_sub(1, Ordering::AcqRel);
            }
            refuse(MAX_CLIENTS_REPLY);
            return false;
        }
        true
    }

    /// Takes a new connection on the Unix socket (Redis's `unixsocket`).
    fn admit_unix(&mut self, mut stream: UnixStream) -> std::io::Result<()> {
        let admitted = self.count_in(|reply| {
            // A fresh socket's send buffer takes these few bytes at once.
            let _ = stream.set_nonblocking(true);
            let _ = stream.write_all(reply);
        });
        if !admitted {
            return Ok(());
        }
        let id = self.shared.next_client_id.fetch_add(1, Ordering::Relaxed);
        let session = Session::new(id, &self.shared.config.users);
        let path = self
            .shared
            .config
            .unix_socket
            .as_ref()
            .map_or_else(|| "?".into(), |u| u.path.display().to_string());
        let conn = Conn::new(
            Transport::Unix(stream),
            format!("{path}:0"),
            session,
            self.shared.config.limits,
        );
        self.install(conn, path)
    }

    /// Takes a new TCP connection, or refuses it over the client limit or
    /// in protected mode (a TLS client hears `-DENIED` once its handshake
    /// is done, as Redis sends it).
    fn admit(&mut self, mut stream: TcpStream, tls: bool) -> std::io::Result<()> {
        let denied = self.shared.denies(stream.peer_addr().ok().as_ref());
        if denied && !tls {
            self.shared
                .stats
                .rejected_connections
                .fetch_add(1, Ordering::Relaxed);
            // A fresh socket's send buffer takes these bytes at once.
            let _ = stream.set_nonblocking(true);
            let _ = stream.write_all(super::DENIED_REPLY);
            return Ok(());
        }
        let admitted = self.count_in(|reply| {
            // A fresh socket's send buffer takes these few bytes at once.
            let _ = stream.set_nonblocking(true);
            let _ = stream.write_all(reply);
        });
        if !admitted {
            return Ok(());
        }
        let shared = &self.shared;
        let _ = stream.set_nodelay(true);
        let id = shared.next_client_id.fetch_add(1, Ordering::Relaxed);
        let session = Session::new(id, &shared.config.users);
        let addr = stream
            .peer_addr()
            .map_or_else(|_| "?".to_string(), |a| a.to_string());
        let laddr = stream
            .local_addr()
            .map_or_else(|_| "?".into(), |a| a.to_string());
        let mut conn = Conn::new(Transport::Tcp(stream), addr, session, shared.config.limits);
        conn.denied = denied;
        if tls {
            let Some(settings) = &shared.config.tls else {
                return Ok(());
            };
            match rustls::ServerConnection::new(settings.config.clone()) {
                Ok(mut t) => {
                    // The connection's own limits bound what waits here.
                    t.set_buffer_limit(None);
                    conn.tls = Some(Box::new(t));
                }
                Err(e) => {
                    log::warn!("TLS refused a connection: {e}");
                    shared.clients.fetch_sub(1, Ordering::AcqRel);
                    return Ok(());
                }
            }
        }
        self.install(conn, laddr)
    }

    /// Gives `conn` a slot, arms its recv, and registers it.
    fn install(&mut self, mut conn: Conn, laddr: String) -> std::io::Result<()> {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.conns.push(None);
                (self.conns.len() - 1) as ConnId
            }
        };
        self.ring.recv(slot, &conn.stream)?;
        conn.recv_armed = true;
        if conn.stream.is_shm() {
            self.shm_conns.push(slot);
        }
        self.shared.registry.insert(
            conn.session.id(),
            super::ClientEntry {
                addr: conn.addr.clone(),
                laddr,
                name: Vec::new(),
                user: conn.session.user().name().to_vec(),
                lib_name: Vec::new(),
                lib_ver: Vec::new(),
                created: Instant::now(),
                worker: self.index,
                slot,
                db: 0,
                pushes: self.pushes.clone(),
                live: conn.live.clone(),
            },
        );
        conn.slot = slot;
        conn.worker = self.index;
        conn.wakes = Some(self.wakes.clone());
        conn.pushes = Some(self.pushes.clone());
        conn.scripts_done = Some(self.scripts_done.clone());
        conn.errors = Some(self.shared.stats.errors.clone());
        self.conns[slot as usize] = Some(conn);
        self.events.touched.push(slot);
        Ok(())
    }

    /// Takes the shared-memory clients the acceptor handed over.
    fn take_arrivals(&mut self) -> std::io::Result<()> {
        let arrivals = self.inbox.take();
        let Some(settings) = self
            .shared
            .config
            .shm
            .as_ref()
            .filter(|_| !arrivals.is_empty())
        else {
            return Ok(());
        };
        let addr = super::shm::client_addr(&settings.path);
        let laddr = settings.path.display().to_string();
        for arrival in arrivals {
            let session = Session::new(arrival.id, &self.shared.config.users);
            let link = ShmLink {
                channel: arrival.channel,
                sock: arrival.sock,
            };
            log::debug!("shared-memory client {} (pid {})", arrival.id, arrival.pid);
            let conn = Conn::new(
                Transport::Shm(Box::new(link)),
                addr.clone(),
                session,
                self.shared.config.limits,
            );
            self.install(conn, laddr.clone())?;
        }
        Ok(())
    }

    /// Takes what the shared-memory clients published into the readers,
    /// and looks again at those with replies waiting for ring space;
    /// whether any requests came.
    fn poll_shm(&mut self) -> bool {
        let mut any = false;
        let out_limit = self.shm_out_limit();
        let max_query = self.shared.max_query_bytes.load(Ordering::Relaxed);
        for &id in &self.shm_conns {
            let Some(c) = self.conns[id as usize].as_mut() else {
                continue;
            };
            if c.dead || !c.stream.is_shm() {
                continue;
            }
            if c.has_backlog() {
                self.events.touched.push(id);
            }
            // Back-pressure: requests already taken wait to run first, and
            // a client that does not read its replies gets no more run. A
            // request bigger than the ring is read on until it is whole.
            if c.closing || c.more_input || c.backlog_bytes() >= out_limit {
                continue;
            }
            let Transport::Shm(link) = &mut c.stream else {
                continue;
            };
            match c
                .reader
                .feed_with(|buf| link.channel.read(buf, SHM_READ_BYTES))
            {
                Ok(0) => {}
                Ok(n) => {
                    // A client whose ring was full may be parked for room.
                    if link.channel.take_peer_sleeping() {
                        link.channel.wake_client();
                    }
                    WorkerStats::add(
                        &self.shared.stats.by_worker[self.index].net_input_bytes,
                        n as u64,
                    );
                    c.last_active = self.now;
                    c.more_input = true;
                    self.events.touched.push(id);
                    any = true;
                    if c.reader.pending_bytes() > max_query {
                        log::warn!(
                            "closing client {}: its query buffer passed {max_query} bytes",
                            c.addr
                        );
                        c.dead = true;
                    }
                }
                Err(e) => {
                    log::warn!("closing shared-memory client {}: {e}", c.session.id());
                    c.dead = true;
                    self.events.touched.push(id);
                }
            }
        }
        any
    }

    /// Most reply bytes a shared-memory client may have waiting before its
    /// requests stop running: one response ring.
    fn shm_out_limit(&self) -> usize {
        self.shared
            .config
            .shm
            .as_ref()
            .map_or(usize::MAX, |s| s.response_ring_bytes)
    }

    /// Before the thread blocks: tells every shared-memory client it is
    /// about to sleep, then looks once more (a client that published in
    /// between sees the flag and wakes the thread, or is seen here).
    /// Whether the thread may block.
    fn shm_may_sleep(&mut self) -> bool {
        let out_limit = self.shm_out_limit();
        for &id in &self.shm_conns {
            if let Some(Transport::Shm(link)) =
                self.conns[id as usize].as_mut().map(|c| &mut c.stream)
            {
                link.channel.announce_sleeping();
            }
        }
        let busy = self.shm_conns.iter().any(|&id| {
            let Some(c) = self.conns[id as usize].as_ref() else {
                return false;
            };
            let Transport::Shm(link) = &c.stream else {
                return false;
            };
            if c.dead {
                return false;
            }
            let wants_in = !c.closing
                && !c.more_input
                && c.backlog_bytes() < out_limit
                && link.channel.in_pending().map_or(true, |n| n > 0);
            let can_out = c.has_backlog() && link.channel.out_free().map_or(true, |n| n > 0);
            wants_in || can_out
        });
        if busy {
            self.shm_awake();
        }
        !busy
    }

    /// After a wait: the clients need not wake the thread any more.
    fn shm_awake(&mut self) {
        for &id in &self.shm_conns {
            if let Some(Transport::Shm(link)) = self.conns[id as usize].as_ref().map(|c| &c.stream)
            {
                link.channel.clear_sleeping();
            }
        }
    }

    /// Runs the requests that arrived, up to the pipeline limit per
    /// connection; whether any ran. Plain SETs go into one group committed
    /// before a connection that sent some runs anything else, and at the
    /// end: all before any reply goes out.
    fn serve_all(&mut self, may_lock: bool) -> bool {
        let mut served = false;
        self.deferring = false;
        let shm_out_limit = self.shm_out_limit();
        // Borrowed, not cloned: a reference count's locked add every turn
        // waits for the stores before it, a published reply among them.
        let shared: &Shared = &self.shared;
        let pass = Pass {
            shared,
            store: shared.db.store(),
            max_pipeline: shared.config.max_pipeline,
            shm_out_limit,
            stats: &shared.stats.by_worker[self.index],
            may_lock,
        };
        // Taken for the turn and put back: its buffers keep their room.
        let mut group = std::mem::take(&mut self.group);
        for &id in &self.work {
            let mut n = 0;
            while let Some(c) = self.conns[id as usize].as_mut() {
                let stop = pass.serve_conn(
                    c,
                    id,
                    &mut n,
                    &mut group,
                    &mut self.reads,
                    &mut self.clock,
                    &mut self.deferring,
                    self.fills.room(),
                );
                match stop {
                    Stop::Done => break,
                    Stop::NoRoom => {
                        // Looked at again when reads complete, not every
                        // turn until then.
                        c.more_input = false;
                        if !self.room_waiters.contains(&id) {
                            self.room_waiters.push(id);
                        }
                        break;
                    }
                    Stop::Missed(misses) => {
                        // Read on the queue; the connection runs nothing
                        // more until they are done.
                        let token = fill_token(id, c.session.id());
                        c.parked_reads = start_fills(&mut self.fills, misses, token);
                        if c.parked_reads == 0 {
                            c.fills = MAX_FILL_ROUNDS;
                            continue;
                        }
                        shared
                            .stats
                            .reads_queued
                            .fetch_add(u64::from(c.parked_reads), Ordering::Relaxed);
                        break;
                    }
                    Stop::GroupFirst(error) => {
                        group.commit(shared, &mut self.conns, &mut self.reads);
                        if let (Some(bytes), Some(c)) = (error, self.conns[id as usize].as_mut()) {
                            c.push_bytes(&bytes);
                            c.quit = true;
                            c.closing = true;
                        }
                    }
                }
            }
            served |= n > 0;
            let blocked = self.conns[id as usize]
                .as_ref()
                .is_some_and(|c| c.blocked.is_some());
            if blocked && !self.blocked.contains(&id) {
                self.blocked.push(id);
            }
        }
        group.commit(shared, &mut self.conns, &mut self.reads);
        self.group = group;
        served
    }

    /// Moves held replies to the send queue where the log is durable, and
    /// asks the committer for the furthest position a reply still waits on.
    fn release_durable(&mut self) {
        let store = self.shared.db.store();
        let mut furthest = None;
        for &id in &self.work {
            let Some(c) = self.conns[id as usize].as_mut() else {
                continue;
            };
            let durability = self.shared.durability();
            if let Some(waited_us) = c.release_if(|at| durability.acknowledges(store, at)) {
                let stats = &self.shared.stats;
                stats.durable_waits.fetch_add(1, Ordering::Relaxed);
                stats
                    .durable_wait_us
                    .fetch_add(waited_us as u64, Ordering::Relaxed);
            }
            furthest = furthest.max(c.hold_until);
        }
        if let Some(at) = furthest {
            if self.requested.is_none_or(|r| r < at) {
                self.requested = Some(at);
                self.shared.committer.request(at, &self.waker);
            }
        }
    }

    /// Hands waiting replies to the sockets and rings; whether any went
    /// into a ring (sockets report through their completions).
    fn send_all(&mut self) -> std::io::Result<bool> {
        let mut wrote = false;
        for &id in &self.work {
            let Some(c) = self.conns[id as usize].as_mut() else {
                continue;
            };
            if c.stream.is_shm() {
                // Replies built straight in the ring while serving, then
                // the queued ones; one look at the client's sleeping word.
                let published = if c.dead { Ok(0) } else { c.send_to_ring() };
                match published {
                    Ok(0) => {}
                    Ok(n) => {
                        wrote = true;
                        WorkerStats::add(
                            &self.shared.stats.by_worker[self.index].net_output_bytes,
                            n as u64,
                        );
                        if let Transport::Shm(link) = &c.stream {
                            if link.channel.take_peer_sleeping() {
                                link.channel.wake_client();
                            }
                        }
                    }
                    Err(e) => {
                        log::warn!("closing shared-memory client {}: {e}", c.session.id());
                        c.dead = true;
                    }
                }
                continue;
            }
            if c.dead || self.ring.sending(id as ConnId) {
                continue;
            }
            let (buf, offset) = match &mut c.tls {
                None => match c.next_socket_send() {
                    Some(next) => next,
                    None => continue,
                },
                Some(tls) => {
                    let drained = c.out.is_empty() && c.held.is_empty() && !c.more_input;
                    if c.closing && drained && !c.tls_closed {
                        // close_notify, so the client sees an orderly end.
                        tls.send_close_notify();
                        c.tls_closed = true;
                    }
                    let mut buf = std::mem::take(&mut c.spare);
                    if let Err(e) = super::tls::send(tls, &mut c.out, &mut buf) {
                        log::info!("closing TLS client {}: {e}", c.addr);
                        c.dead = true;
                        continue;
                    }
                    if buf.is_empty() {
                        c.spare = buf;
                        continue;
                    }
                    (buf, 0)
                }
            };
            self.ring.send(id as ConnId, &c.stream, buf, offset)?;
        }
        Ok(wrote)
    }

    /// Frees connections with nothing left in flight.
    fn close_finished(&mut self) {
        for &id in &self.work {
            let id = id as usize;
            let sending = self.ring.sending(id as ConnId);
            let Some(c) = self.conns[id].as_mut() else {
                continue;
            };
            let drained =
                !c.has_backlog() && c.held.is_empty() && !c.more_input && !c.script_pending;
            if !(c.dead || (c.closing && drained)) || sending {
                continue;
            }
            if c.recv_armed {
                // Ends the armed recv (it completes with 0); the slot is
                // freed after, so no late completion reaches a new client.
                let _ = c.stream.shutdown(Shutdown::Both);
                continue;
            }
            self.shared.registry.remove(c.session.id());
            if let Some(b) = c.blocked.take().or_else(|| c.retry.take()) {
                self.shared.blocking.leave(&b.keys, b.ticket);
            }
            self.shared.pubsub.leave_all(c);
            self.shared.monitors.remove(c.session.id());
            if c.postponed {
                self.shared.pause.postponed.fetch_sub(1, Ordering::Relaxed);
            }
            if c.tracking {
                self.shared.tracking.disable(c.session.id());
                self.shared.refresh_change_recording();
            }
            if let Transport::Shm(link) = &c.stream {
                // Wakes a client parked on its futex: it reads what is
                // left in its ring, then sees the channel closed.
                link.channel.close();
                self.shm_conns.retain(|&s| s as usize != id);
                self.inbox.load.fetch_sub(1, Ordering::Relaxed);
            }
            self.conns[id] = None;
            self.free.push(id as ConnId);
            self.shared.clients.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Connections to look at next turn even if no completion names them.
    fn keep_pending(&mut self) {
        for &id in &self.work {
            if let Some(c) = self.conns[id as usize].as_ref() {
                if c.more_input || c.hold_until.is_some() || c.closing || c.dead {
                    self.pending.push(id);
                }
            }
        }
    }

    fn close_idle(&mut self) {
        let timeout_secs = self.shared.idle_timeout_secs.load(Ordering::Relaxed);
        if timeout_secs == 0 {
            return;
        }
        let limit = Duration::from_secs(timeout_secs);
        for (id, slot) in self.conns.iter_mut().enumerate() {
            let Some(c) = slot.as_mut() else { continue };
            // Redis's `timeout` spares blocked clients.
            let waiting = c.hold_until.is_some() || c.blocked.is_some() || c.script_pending;
            if !waiting && c.last_active.elapsed() > limit {
                c.dead = true;
                self.pending.push(id as ConnId);
            }
        }
    }

    /// Shutdown: accept no more, read no more; what was received is run,
    /// its replies made durable and sent, then the connections close.
    /// Past [`STOP_GRACE`]: logs each connection still open with what
    /// kept it (a shutdown must end; what it shows is a bug to find), and
    /// leaves them to be dropped with the worker.
    fn drop_unfinished(&self) {
        for c in self.conns.iter().flatten() {
            log::warn!(
                "stopping: client {} still open after {STOP_GRACE:?} (closing {}, dead {}, recv armed {}, more input {}, backlog {}, held {} bytes, deferred {}, blocked {}, script {}); dropped",
                c.addr,
                c.closing,
                c.dead,
                c.recv_armed,
                c.more_input,
                c.has_backlog(),
                c.held.len(),
                c.deferred.is_some(),
                c.blocked.is_some(),
                c.script_pending,
            );
        }
    }

    fn begin_stop(&mut self) {
        if let Some(listeners) = self.listeners.take() {
            self.ring.stop_accepting();
            drop(listeners);
        }
        for (id, slot) in self.conns.iter_mut().enumerate() {
            let Some(c) = slot.as_mut() else { continue };
            if !c.closing {
                c.closing = true;
                // A shared-memory client's socket stays open: its end
                // would read as the client's death, dropping its replies.
                if !c.stream.is_shm() {
                    let _ = c.stream.shutdown(Shutdown::Read);
                }
                self.pending.push(id as ConnId);
            }
        }
        // The committer thread may have stopped: commit here.
        let furthest = self
            .conns
            .iter()
            .flatten()
            .filter_map(|c| c.hold_until)
            .max();
        if let Some(at) = furthest {
            if let Err(e) = self.shared.db.store().make_durable(at) {
                log::error!("a commit at shutdown failed: {e}; held replies are dropped");
                for c in self.conns.iter_mut().flatten() {
                    if c.hold_until.is_some() {
                        c.dead = true;
                    }
                }
            }
        }
    }
}

/// What a blocked command answers when its time is up: WAIT the replicas
/// that acknowledged (none: Sluice has no replicas yet), the others
/// Redis's null.
fn timeout_reply_of(args: &crate::resp::Args) -> crate::resp::Reply {
    if args[0].eq_ignore_ascii_case(b"wait") {
        return crate::resp::Reply::Integer(0);
    }
    crate::commands::blocking::timeout_reply()
}
