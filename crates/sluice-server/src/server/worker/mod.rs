//! A worker thread's loop: reap the network ring, run what arrived,
//! release replies the log has made durable, send, and wait — polling
//! while busy, blocking when idle. Connections come in through
//! `arrivals` and leave through `closing`; `wakes` takes what other
//! threads hand the worker, `shm_clients` serves shared-memory clients.

use super::clock::CommandClock;
use super::conn::{Conn, Transport};
use super::pass::{fill_token, start_fills, Grouped, Pass, Stop, MAX_FILL_ROUNDS};
use super::shm::WorkerInbox;
use super::{Shared, WorkerStats, TICK};
use sluice_io::net::{ConnId, NetEvent, NetRing, NetRingConfig, Waker};
use sluice_store::wal::LogPosition;
use sluice_store::ReadCache;
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod arrivals;
mod closing;
mod shm_clients;
mod wakes;

use closing::STOP_GRACE;

/// A worker reads the clock once in this many turns (a read costs about
/// as much as a turn with nothing to do).
const CLOCK_EVERY_TURNS: u32 = 32;
/// How soon a worker holding writes back under write pressure looks again.
const DEFERRED_RETRY: Duration = Duration::from_millis(1);
/// A send buffer kept for reuse only up to this size.
const SPARE_MAX_BYTES: usize = 1 << 20;

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
}
