//! The HTTP API's connections on a network ring ([`sluice_io::net`]), as
//! the Redis protocol's are: one thread accepts, receives into the ring's
//! provided buffers, frames requests ([`crate::framing`]) and sends
//! answers; whole requests run on the pool's threads ([`crate::pool`]).
//! A connection is a slot and its buffered bytes, never a thread: a
//! thousand idle keep-alive connections cost what sixteen do.
//!
//! The wire's limits are the same as before: the head's and body's sizes,
//! a request whole within `request_timeout` from its first byte (a sender
//! that trickles is closed), an idle connection closed after
//! `idle_timeout`, an answer's send taken by the client within
//! `request_timeout`, at most `max_connections` open (more are answered
//! 429), credentials checked from the head before a body is read.

use crate::access::{refusal, MAX_UNAUTHORIZED_BODY_BYTES};
use crate::config::HttpConfig;
use crate::error::ApiError;
use crate::framing;
use crate::pool::{Done, Job, Mailbox, Pool};
use crate::wire::{self, Encoded, Request, Response, WireError};
use sluice_io::net::{NetEvent, NetRing, NetRingConfig};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a wait on the ring lasts at most: timeouts and shutdown are
/// looked at this often.
const TICK: Duration = Duration::from_millis(100);

/// How long a connection closed for a bad request reads what its client
/// still sends: closing with unread bytes makes the kernel reset the
/// connection, and a reset discards the error answer the client has not
/// read yet (a client sending a body over the limit would see "connection
/// reset" instead of 413).
const LINGER: Duration = Duration::from_secs(2);
/// The most such a connection reads before it closes.
const LINGER_MOST_BYTES: usize = 64 << 20;

/// How long a stopping server waits for requests still running.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// What the ring threads share with the server that started them.
#[derive(Clone)]
pub(crate) struct RingSettings {
    pub(crate) config: Arc<HttpConfig>,
    pub(crate) shutdown: Arc<AtomicBool>,
    /// Connections open (counted against `max_connections`).
    pub(crate) open: Arc<AtomicUsize>,
}

/// One connection's state.
struct Conn {
    socket: TcpStream,
    peer: SocketAddr,
    generation: u64,
    tls: Option<Box<rustls::ServerConnection>>,
    /// Bytes received (decrypted) and not yet framed.
    input: Vec<u8>,
    /// A request whose head has come, waiting for its body.
    head: Option<Waiting>,
    /// Bytes to send after the send in flight, with the offset each
    /// starts at.
    out: VecDeque<(Vec<u8>, usize)>,
    /// When the send in flight began.
    send_since: Option<Instant>,
    /// A request of this connection is on the pool.
    running: bool,
    /// Input came while `running` (counted in [`RingLoop::held`]).
    held: bool,
    /// Close once `out` is sent (lingering first if `linger`).
    closing: bool,
    linger: bool,
    /// Reading and dropping what the client sends, until then.
    linger_until: Option<Instant>,
    lingered_bytes: usize,
    /// Close now (what is unsent is dropped).
    dead: bool,
    recv_armed: bool,
    peer_closed: bool,
    /// The request being read must be whole by then.
    request_deadline: Option<Instant>,
    /// Since when the connection has had nothing to do.
    idle_since: Instant,
}

/// A request whose head has come.
struct Waiting {
    request: Request,
    /// The answer when it may not run (read only its body, then answer).
    refused: Option<Response>,
    /// The body's limit: the server's, or the refused request's.
    max_body_bytes: usize,
}

/// What [`Conn::read_body`] found.
enum Body {
    /// More bytes are needed.
    Incomplete,
    /// The request was answered without running (or could not be read).
    Answered,
    /// A request to run.
    Whole(Request),
}

/// One ring thread's connections.
pub(crate) struct RingLoop {
    ring: NetRing,
    settings: RingSettings,
    mailbox: Arc<Mailbox>,
    pool: Arc<Pool>,
    conns: Vec<Option<Conn>>,
    free: Vec<u32>,
    next_generation: u64,
    /// Slots touched by the last events, to advance.
    touched: Vec<u32>,
    accepted: Vec<std::os::fd::OwnedFd>,
    rearm: Vec<u32>,
    done: Vec<Done>,
    stop_began: Option<Instant>,
    /// Connections whose received bytes wait for the answer running.
    held: usize,
}

impl RingLoop {
    /// A ring for the calling thread, accepting on `listener`.
    pub(crate) fn new(
        listener: &TcpListener,
        settings: RingSettings,
        pool: Arc<Pool>,
    ) -> std::io::Result<RingLoop> {
        let mut ring = NetRing::new(NetRingConfig::default())?;
        ring.accept_on(listener)?;
        let mailbox = Arc::new(Mailbox::new(ring.waker()));
        Ok(RingLoop {
            ring,
            settings,
            mailbox,
            pool,
            conns: Vec::new(),
            free: Vec::new(),
            next_generation: 1,
            touched: Vec::new(),
            accepted: Vec::new(),
            rearm: Vec::new(),
            done: Vec::new(),
            stop_began: None,
            held: 0,
        })
    }

    /// Serves until shutdown, and until the requests running then have
    /// been answered (at most [`STOP_GRACE`]).
    pub(crate) fn run(mut self) {
        let mut last_sweep = Instant::now();
        loop {
            if let Err(e) = self.turn() {
                log::error!("http: the connection ring failed: {e}");
                break;
            }
            if last_sweep.elapsed() >= TICK {
                last_sweep = Instant::now();
                self.sweep();
            }
            if self.settings.shutdown.load(Ordering::Acquire) && self.stopped() {
                break;
            }
        }
        for c in self.conns.iter().flatten() {
            let _ = c.socket.shutdown(Shutdown::Both);
        }
        let open = self.conns.iter().flatten().count();
        self.settings.open.fetch_sub(open, Ordering::AcqRel);
    }

    /// One wait and what it brought.
    fn turn(&mut self) -> std::io::Result<()> {
        self.mailbox.set_urgent(self.held > 0);
        if self.mailbox.park() {
            let waited = self.ring.wait(Some(TICK));
            self.mailbox.unpark();
            waited?;
        } else {
            // Answers are waiting: submit what is queued, do not wait.
            self.ring.wait(None)?;
        }
        self.reap()?;
        for socket in std::mem::take(&mut self.accepted) {
            self.admit(TcpStream::from(socket));
        }
        for id in std::mem::take(&mut self.rearm) {
            if let Some(c) = self.conns[id as usize].as_mut() {
                if c.dead || c.peer_closed {
                    c.recv_armed = false;
                } else if let Err(e) = self.ring.recv(id, &c.socket) {
                    // This connection ends; the ring and the others go on.
                    log::warn!("http: receiving from {}: {e}", c.peer);
                    c.recv_armed = false;
                    c.dead = true;
                    self.touched.push(id);
                }
            }
        }
        let mut done = std::mem::take(&mut self.done);
        self.mailbox.take(&mut done);
        for d in done.drain(..) {
            self.answered(d);
        }
        self.done = done;
        let mut touched = std::mem::take(&mut self.touched);
        touched.sort_unstable();
        touched.dedup();
        for &id in &touched {
            self.advance(id);
            self.flush(id);
            self.close_if_finished(id);
        }
        touched.clear();
        self.touched = touched;
        Ok(())
    }

    fn reap(&mut self) -> std::io::Result<usize> {
        let conns = &mut self.conns;
        let touched = &mut self.touched;
        let accepted = &mut self.accepted;
        let rearm = &mut self.rearm;
        let held = &mut self.held;
        let max_buffered = self.settings.config.max_body_bytes + wire::MAX_HEAD_BYTES * 2;
        self.ring.reap(|event| match event {
            NetEvent::Accepted { socket, .. } => accepted.push(socket),
            NetEvent::AcceptFailed(e) => log::warn!("http accept: {e}"),
            NetEvent::Received { conn, bytes } => {
                if let Some(c) = conns.get_mut(conn as usize).and_then(Option::as_mut) {
                    touched.push(conn);
                    c.receive(bytes, max_buffered);
                    if c.running && !c.held && !c.input.is_empty() {
                        c.held = true;
                        *held += 1;
                    }
                }
            }
            NetEvent::RecvPaused { conn } => rearm.push(conn),
            NetEvent::RecvEnded { conn, result } => {
                if let Some(c) = conns.get_mut(conn as usize).and_then(Option::as_mut) {
                    touched.push(conn);
                    c.recv_armed = false;
                    c.peer_closed = true;
                    if result.is_err() {
                        c.dead = true;
                    }
                }
            }
            NetEvent::Sent {
                conn,
                buf,
                sent_to,
                error,
            } => {
                let Some(c) = conns.get_mut(conn as usize).and_then(Option::as_mut) else {
                    return;
                };
                touched.push(conn);
                c.send_since = None;
                if error.is_some() {
                    c.dead = true;
                } else if sent_to < buf.len() {
                    c.out.push_front((buf, sent_to));
                } else {
                    wire::recycle_body(buf);
                    if c.out.is_empty() && !c.running {
                        c.idle_since = Instant::now();
                    }
                }
            }
            NetEvent::Woken => {}
        })
    }

    /// Takes a new connection, or answers 429 when the limit is held.
    fn admit(&mut self, socket: TcpStream) {
        let config = &self.settings.config;
        let limit = config.max_connections;
        let admitted = self
            .settings
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok();
        if !admitted || self.settings.shutdown.load(Ordering::Acquire) {
            if admitted {
                self.settings.open.fetch_sub(1, Ordering::AcqRel);
            }
            crate::access::refuse(socket, limit);
            return;
        }
        let peer = match socket.peer_addr() {
            Ok(p) => p,
            Err(_) => {
                // Gone before it was seen.
                self.settings.open.fetch_sub(1, Ordering::AcqRel);
                return;
            }
        };
        let _ = socket.set_nodelay(true);
        let tls = match &config.tls {
            None => None,
            Some(tls) => match rustls::ServerConnection::new(tls.clone()) {
                Ok(c) => Some(Box::new(c)),
                Err(e) => {
                    log::warn!("http: TLS session for {peer}: {e}");
                    self.settings.open.fetch_sub(1, Ordering::AcqRel);
                    return;
                }
            },
        };
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.conns.push(None);
                (self.conns.len() - 1) as u32
            }
        };
        self.next_generation += 1;
        if let Err(e) = self.ring.recv(id, &socket) {
            log::warn!("http: receiving from {peer}: {e}; closed");
            self.free.push(id);
            self.settings.open.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        self.conns[id as usize] = Some(Conn {
            socket,
            peer,
            generation: self.next_generation,
            tls,
            input: Vec::new(),
            head: None,
            out: VecDeque::new(),
            send_since: None,
            running: false,
            held: false,
            closing: false,
            linger: false,
            linger_until: None,
            lingered_bytes: 0,
            dead: false,
            recv_armed: true,
            peer_closed: false,
            request_deadline: None,
            idle_since: Instant::now(),
        });
    }

    /// An answer from the pool: queued to send; the connection goes on
    /// with what it received meanwhile, or closes.
    fn answered(&mut self, done: Done) {
        let Some(c) = self.conns[done.conn as usize]
            .as_mut()
            .filter(|c| c.generation == done.generation)
        else {
            // The connection closed while its request ran.
            return;
        };
        c.running = false;
        if c.held {
            c.held = false;
            self.held -= 1;
        }
        let Encoded { head, body } = done.encoded;
        let head_len = head.len();
        if done.sent < head_len {
            c.queue_out_from(head, done.sent);
        } else {
            wire::recycle_body(head);
        }
        let body_sent = done.sent.saturating_sub(head_len);
        if body_sent < body.len() {
            c.queue_out_from(body, body_sent);
        } else {
            wire::recycle_body(body);
        }
        if c.out.is_empty() {
            c.idle_since = Instant::now();
        }
        if !done.keep_alive {
            c.closing = true;
        }
        self.touched.push(done.conn);
    }

    /// Frames what `id` received: answers what may not run, sends
    /// `100 Continue` where asked, hands a whole request to the pool.
    fn advance(&mut self, id: u32) {
        let config = self.settings.config.clone();
        let Some(c) = self.conns[id as usize].as_mut() else {
            return;
        };
        while !(c.dead || c.running || c.closing) {
            if c.head.is_none() && !c.read_head(&config) {
                return;
            }
            let request = match c.read_body() {
                Body::Incomplete => return,
                // Answered here: the next request may be here already.
                Body::Answered => continue,
                Body::Whole(request) => request,
            };
            c.running = true;
            // Nothing queued to send ahead of the answer (a `100 Continue`
            // may be): only then may the pool's thread send it.
            let direct = c.tls.is_none() && c.out.is_empty() && !self.ring.sending(id);
            self.pool.submit(Job {
                mailbox: self.mailbox.clone(),
                conn: id,
                generation: c.generation,
                request,
                socket: direct.then(|| std::os::fd::AsRawFd::as_raw_fd(&c.socket)),
            });
        }
    }

    /// Starts the next send of `id` when none is in flight (a send the
    /// ring cannot take ends this connection, not the ring).
    fn flush(&mut self, id: u32) {
        let Some(c) = self.conns[id as usize].as_mut() else {
            return;
        };
        if c.dead || self.ring.sending(id) {
            return;
        }
        if let Some((buf, offset)) = c.out.pop_front() {
            c.send_since = Some(Instant::now());
            if let Err(e) = self.ring.send(id, &c.socket, buf, offset) {
                log::warn!("http: sending to {}: {e}", c.peer);
                c.send_since = None;
                c.dead = true;
            }
        }
    }

    /// Frees `id` once it is finished with: dead, or closing with all
    /// sent (and lingered), or its peer gone with nothing left to do.
    fn close_if_finished(&mut self, id: u32) {
        let sending = self.ring.sending(id);
        let Some(c) = self.conns[id as usize].as_mut() else {
            return;
        };
        if !c.dead {
            let all_sent = !sending && c.out.is_empty();
            let finished = c.closing || (c.peer_closed && !c.running);
            if !(all_sent && finished) {
                return;
            }
            if c.closing && c.linger && !c.peer_closed {
                // Read what the client still sends, for a while (the
                // sweep ends it when the time is up).
                c.linger_until.get_or_insert(Instant::now() + LINGER);
                return;
            }
            c.dead = true;
        }
        if c.recv_armed || sending || c.running {
            // Ends the armed recv and any send (they complete); the slot is
            // freed after, so no late completion reaches a new connection.
            // A running request's answer may be sent from the pool's thread
            // on this socket: it stays open until the answer is back.
            let _ = c.socket.shutdown(Shutdown::Both);
            return;
        }
        self.conns[id as usize] = None;
        self.free.push(id);
        self.settings.open.fetch_sub(1, Ordering::AcqRel);
    }

    /// Ends connections past their limits: a request not whole by its
    /// deadline, an idle one past the idle limit, a send the client has
    /// not taken within the request timeout, a linger that is over; and,
    /// once the server stops, connections with nothing running.
    fn sweep(&mut self) {
        let now = Instant::now();
        let config = &self.settings.config;
        let stopping = self.settings.shutdown.load(Ordering::Acquire);
        if stopping && self.stop_began.is_none() {
            self.stop_began = Some(now);
            self.ring.stop_accepting();
        }
        for id in 0..self.conns.len() as u32 {
            let Some(c) = self.conns[id as usize].as_mut() else {
                continue;
            };
            let idle =
                !c.running && c.out.is_empty() && c.send_since.is_none() && c.input.is_empty();
            let late = c.request_deadline.is_some_and(|d| now >= d)
                || c.send_since
                    .is_some_and(|s| now >= s + config.request_timeout)
                || c.linger_until.is_some_and(|u| now >= u);
            if late {
                c.dead = true;
            } else if idle && (stopping || now >= c.idle_since + config.idle_timeout) {
                c.closing = true;
            }
            self.touched.push(id);
        }
        let mut touched = std::mem::take(&mut self.touched);
        for &id in &touched {
            self.close_if_finished(id);
        }
        touched.clear();
        self.touched = touched;
    }

    /// Whether a stopping server may end this ring: no connection left,
    /// or the grace is over.
    fn stopped(&self) -> bool {
        self.conns.iter().all(Option::is_none)
            || self.stop_began.is_some_and(|t| t.elapsed() >= STOP_GRACE)
    }
}

impl Conn {
    /// Takes bytes received: decrypted when TLS, dropped while lingering.
    fn receive(&mut self, bytes: &[u8], max_buffered: usize) {
        if self.dead {
            return;
        }
        if self.closing && self.linger {
            self.lingered_bytes += bytes.len();
            if self.lingered_bytes > LINGER_MOST_BYTES {
                self.dead = true;
            }
            return;
        }
        match self.tls.as_mut() {
            None => self.input.extend_from_slice(bytes),
            Some(tls) => {
                if let Err(e) = tls_receive(tls, bytes, &mut self.input) {
                    log::debug!("http: TLS from {}: {e}", self.peer);
                    self.dead = true;
                    return;
                }
                // The handshake's answers.
                let mut out = Vec::new();
                while tls.wants_write() {
                    if tls.write_tls(&mut out).is_err() {
                        break;
                    }
                }
                if !out.is_empty() {
                    self.out.push_back((out, 0));
                }
            }
        }
        if self.input.len() > max_buffered {
            // More than one whole request can hold, sent ahead while one
            // runs: the client is not speaking HTTP as the limits allow.
            log::debug!("http: {} sent past its buffer; closed", self.peer);
            self.dead = true;
        }
    }

    /// Queues `bytes[offset..]` to send: bytes sent from the pool's thread
    /// (never TLS) are not sent again.
    fn queue_out_from(&mut self, bytes: Vec<u8>, offset: usize) {
        if offset == 0 {
            self.queue_out(bytes);
        } else {
            debug_assert!(self.tls.is_none(), "TLS answers are sealed here, whole");
            self.out.push_back((bytes, offset));
        }
    }

    /// Queues `bytes` to send, through TLS when the connection has it.
    fn queue_out(&mut self, bytes: Vec<u8>) {
        let Some(tls) = self.tls.as_mut() else {
            self.out.push_back((bytes, 0));
            return;
        };
        let mut sealed = Vec::with_capacity(bytes.len() + 64);
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            match tls.writer().write(rest) {
                Ok(0) | Err(_) => break,
                Ok(n) => rest = &rest[n..],
            }
            while tls.wants_write() {
                if tls.write_tls(&mut sealed).is_err() {
                    break;
                }
            }
        }
        wire::recycle_body(bytes);
        if !sealed.is_empty() {
            self.out.push_back((sealed, 0));
        }
    }

    /// Reads a request's head if it is all here: false while it is not,
    /// or when the connection ends or is answered without running it.
    fn read_head(&mut self, config: &HttpConfig) -> bool {
        if self.input.is_empty() {
            self.request_deadline = None;
            return false;
        }
        let now = Instant::now();
        self.request_deadline
            .get_or_insert(now + config.request_timeout);
        let end = match framing::head_end(&self.input) {
            Ok(None) => return false,
            Ok(Some(end)) => end,
            Err(e) => {
                self.fail(e);
                return false;
            }
        };
        let request = match framing::parse_head(&self.input[..end]) {
            Ok(r) => r,
            Err(e) => {
                self.fail(e);
                return false;
            }
        };
        self.input.drain(..end);
        if let Some(response) = refusal(&request, &self.peer, config) {
            // Its body is read only when small and not held back for a
            // `100 Continue`; otherwise the answer closes the connection.
            let small = wire::declared_length(&request, MAX_UNAUTHORIZED_BODY_BYTES).is_ok();
            if wire::expects_continue(&request) || !small {
                self.answer(&request, response, false);
                return false;
            }
            self.head = Some(Waiting {
                request,
                refused: Some(response),
                max_body_bytes: MAX_UNAUTHORIZED_BODY_BYTES,
            });
            return true;
        }
        if wire::expects_continue(&request) {
            if let Err(e) = wire::declared_length(&request, config.max_body_bytes) {
                self.fail(e);
                return false;
            }
            self.queue_out(wire::CONTINUE.to_vec());
        }
        self.head = Some(Waiting {
            request,
            refused: None,
            max_body_bytes: config.max_body_bytes,
        });
        true
    }

    /// The request whose head was read, once its body is all here; a
    /// refused one is answered here.
    fn read_body(&mut self) -> Body {
        let Some(waiting) = self.head.as_ref() else {
            return Body::Incomplete;
        };
        let length = match framing::body_end(&self.input, &waiting.request, waiting.max_body_bytes)
        {
            Ok(Some(length)) => length,
            Ok(None) => {
                if let Ok(declared) =
                    wire::declared_length(&waiting.request, waiting.max_body_bytes)
                {
                    // Room for exactly the body, once: not grown by doubling.
                    self.input
                        .reserve(declared.saturating_sub(self.input.len()));
                }
                return Body::Incomplete;
            }
            Err(e) => {
                if let Some(Waiting {
                    request,
                    refused: Some(response),
                    ..
                }) = self.head.take()
                {
                    self.answer(&request, response, false);
                } else {
                    self.fail(e);
                }
                return Body::Answered;
            }
        };
        let Some(Waiting {
            mut request,
            refused,
            max_body_bytes,
        }) = self.head.take()
        else {
            return Body::Incomplete;
        };
        let raw = if length == self.input.len() {
            std::mem::take(&mut self.input)
        } else {
            let rest = self.input.split_off(length);
            std::mem::replace(&mut self.input, rest)
        };
        self.request_deadline = None;
        if let Some(response) = refused {
            let keep_alive = request.keep_alive();
            self.answer(&request, response, keep_alive);
            return Body::Answered;
        }
        if let Err(e) = framing::set_body(&mut request, raw, max_body_bytes) {
            self.fail(e);
            return Body::Answered;
        }
        Body::Whole(request)
    }

    /// Answers `request` here (a refusal), closing after when not
    /// `keep_alive`.
    fn answer(&mut self, request: &Request, response: Response, keep_alive: bool) {
        let head_only = request.method == "HEAD";
        match wire::encode_response(response, head_only, false, keep_alive) {
            Ok(encoded) => {
                self.queue_out(encoded.head);
                if !encoded.body.is_empty() {
                    self.queue_out(encoded.body);
                }
            }
            Err(_) => self.dead = true,
        }
        if !keep_alive {
            self.closing = true;
            self.linger = true;
        }
    }

    /// Answers a request that cannot be read (400 or 413) and closes.
    fn fail(&mut self, e: WireError) {
        let (status, kind) = match e {
            WireError::BodyTooLarge { .. } => (413, "content_too_long_exception"),
            _ => (400, "illegal_argument_exception"),
        };
        let body = ApiError::new(status, kind, e.to_string())
            .body()
            .to_string()
            .into_bytes();
        self.head = None;
        self.request_deadline = None;
        self.answer(&Request::default(), Response::json(status, body), false);
    }
}

/// Feeds `bytes` from the socket through `tls` and appends the plaintext
/// they carried to `plain`.
fn tls_receive(
    tls: &mut rustls::ServerConnection,
    mut bytes: &[u8],
    plain: &mut Vec<u8>,
) -> Result<(), String> {
    while !bytes.is_empty() {
        let n = tls.read_tls(&mut bytes).map_err(|e| e.to_string())?;
        tls.process_new_packets().map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        loop {
            let mut chunk = [0u8; 16 << 10];
            match tls.reader().read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => plain.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.to_string()),
            }
        }
    }
    Ok(())
}
