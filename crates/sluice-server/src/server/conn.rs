//! One client connection's state on its worker.

use crate::resp::reply::{blob_header, BLOB_HEADER_MAX_BYTES};
use crate::resp::{Limits, Reply, RequestReader};
use crate::session::Session;
use sluice_redis::db::Watched;
use sluice_store::wal::LogPosition;
use sluice_store::{Found, Kept};
use std::collections::VecDeque;
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Instant;

/// How a client's bytes come and go.
pub(super) enum Transport {
    /// A TCP socket, read and written through the worker's network ring.
    Tcp(TcpStream),
    /// A Unix socket (`--unixsocket`), the same way.
    Unix(UnixStream),
    /// Shared-memory rings, polled by the worker; the Unix socket of the
    /// handshake only tells when the client is gone.
    Shm(Box<ShmLink>),
}

/// A shared-memory client's rings and socket.
pub(super) struct ShmLink {
    pub(super) channel: sluice_io::shm::ShmChannel,
    pub(super) sock: UnixStream,
}

impl Transport {
    pub(super) fn shutdown(&self, how: Shutdown) -> std::io::Result<()> {
        match self {
            Transport::Tcp(s) => s.shutdown(how),
            Transport::Unix(s) => s.shutdown(how),
            Transport::Shm(link) => link.sock.shutdown(how),
        }
    }

    pub(super) fn is_shm(&self) -> bool {
        matches!(self, Transport::Shm(_))
    }
}

impl AsRawFd for Transport {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Transport::Tcp(s) => s.as_raw_fd(),
            Transport::Unix(s) => s.as_raw_fd(),
            Transport::Shm(link) => link.sock.as_raw_fd(),
        }
    }
}

/// A transaction being queued (MULTI).
#[derive(Debug, Default)]
pub(super) struct Queued {
    pub(super) queued: Vec<crate::resp::Args>,
    /// A command failed its checks while queueing: EXEC refuses.
    pub(super) dirty: bool,
    /// MULTI as the client spelled it (monitors see it at EXEC).
    pub(super) multi: Vec<u8>,
}

/// Values at least this big are streamed into a shared-memory client's
/// ring from where the store holds them, not copied into its output.
const STREAM_MIN_BYTES: usize = 16 << 10;

/// Values at least this big go to a socket client (no TLS) as a send of
/// their own, from where the store read them, not copied into its output.
const SOCKET_STREAM_MIN_BYTES: usize = 1 << 20;

/// A value streaming into a shared-memory client's ring, or waiting for
/// its own send to a socket client.
pub(super) struct Stream {
    /// Where in the output it goes: before the byte at this offset.
    pub(super) at: usize,
    pub(super) value: Kept,
    /// Bytes of it in the ring already.
    pub(super) sent: usize,
}

/// A client connection.
pub(super) struct Conn {
    pub(super) stream: Transport,
    pub(super) session: Session,
    pub(super) reader: RequestReader,
    /// Replies ready to send. For a shared-memory client, the first
    /// `out_sent` bytes are in the ring already, and big values sit
    /// between its bytes as `streams` (kept where the store holds them).
    pub(super) out: Vec<u8>,
    pub(super) out_sent: usize,
    pub(super) streams: VecDeque<Stream>,
    /// Replies produced after a write not yet durable, sent once the log
    /// is durable to `hold_until` (in order: everything after such a write
    /// waits with it).
    pub(super) held: Vec<u8>,
    pub(super) hold_until: Option<LogPosition>,
    pub(super) held_since: Option<Instant>,
    /// A spare send buffer, so steady traffic allocates nothing.
    pub(super) spare: Vec<u8>,
    /// Whether the multishot recv is armed.
    pub(super) recv_armed: bool,
    /// Whether requests wait in `reader` (it was cut short by the
    /// pipeline limit).
    pub(super) more_input: bool,
    /// Close once what was received has run and every reply is sent
    /// (QUIT, protocol error, peer closed, shutdown).
    pub(super) closing: bool,
    /// Run no more requests (QUIT, protocol error).
    pub(super) quit: bool,
    /// The peer is gone: nothing more is read or sent.
    pub(super) dead: bool,
    /// A command held back (a write while the store is under write
    /// pressure, a read while what it reads comes in from the device); it
    /// runs before anything else of this connection.
    pub(super) deferred: Option<crate::resp::Args>,
    /// Device reads on the worker's fill queue its next request (a command
    /// that reads keys) waits for: nothing of it runs until they are done.
    pub(super) parked_reads: u16,
    /// Rounds of reads done for the request at the head of its input; past
    /// a bound, the request reads what it still misses while the worker
    /// waits.
    pub(super) fills: u8,
    /// Inside MULTI: the commands queued so far.
    pub(super) tx: Option<Queued>,
    /// WATCH's view of the watched keys.
    pub(super) watched: Watched,
    pub(super) last_active: Instant,
    pub(super) addr: String,
    /// The connection's TLS state (connections to the TLS listener).
    pub(super) tls: Option<Box<rustls::ServerConnection>>,
    /// TLS only: close_notify was queued.
    pub(super) tls_closed: bool,
    /// TLS only: protected mode turns this client away once its handshake
    /// is done; nothing it sends runs.
    pub(super) denied: bool,
    /// Its slot on its worker, and the worker's wake queue (what a
    /// blocking command registers with).
    pub(super) slot: sluice_io::net::ConnId,
    /// The worker serving it (its counters are that worker's).
    pub(super) worker: usize,
    /// What the last error reply queued was, since the caller cleared it:
    /// Some(true) a refusal before the command ran, Some(false) an error
    /// of the command itself (INFO commandstats).
    pub(super) last_error: Option<bool>,
    pub(super) wakes: Option<std::sync::Arc<super::blocking::WakeQueue>>,
    /// Blocked on keys (BLPOP ...): nothing else of it runs meanwhile.
    pub(super) blocked: Option<super::blocking::Blocked>,
    /// Woken: its blocking command runs again (`deferred`) with this
    /// place in the registry, kept if it finds nothing.
    pub(super) retry: Option<super::blocking::Blocked>,
    /// The waiters its last write woke, and until when its next command
    /// waits for them to run theirs (`blocking::WAKE_WAIT`).
    pub(super) woke: Vec<u64>,
    pub(super) woke_until: Option<std::time::Instant>,
    /// The worker's queue of pub/sub messages, and this connection's
    /// subscriptions.
    pub(super) pushes: Option<std::sync::Arc<super::pubsub::PushQueue>>,
    pub(super) subscriptions: super::pubsub::Subscriptions,
    /// Its script runs on the script thread: nothing more of it runs until
    /// the reply comes back through `scripts_done`, the worker's mailbox.
    pub(super) script_pending: bool,
    pub(super) scripts_done: Option<std::sync::Arc<super::scripting::DoneQueue>>,
    /// The server's error counts (every error reply is counted).
    pub(super) errors: Option<std::sync::Arc<super::ErrorStats>>,
    /// CLIENT REPLY: whether replies are sent.
    pub(super) replies: Replies,
    /// What CLIENT LIST shows of it that changes as it runs (shared with
    /// the registry).
    pub(super) live: std::sync::Arc<super::clients::ClientLive>,
    /// CLIENT TRACKING is on (its mode is in `Shared::tracking`).
    pub(super) tracking: bool,
    /// CLIENT CACHING was given for the next command (or transaction).
    pub(super) tracking_caching: bool,
    /// Its next command waits for CLIENT PAUSE to end (counted in
    /// `Pause::postponed`).
    pub(super) postponed: bool,
}

/// CLIENT REPLY's modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Replies {
    /// Every reply is sent (the default, CLIENT REPLY ON).
    On,
    /// No reply is sent (CLIENT REPLY OFF); pub/sub messages still are.
    Off,
    /// The next command's reply is not sent (CLIENT REPLY SKIP).
    SkipNext,
    /// This command's reply is not sent; the next ones are.
    Skipping,
}

impl Conn {
    pub(super) fn new(stream: Transport, addr: String, session: Session, limits: Limits) -> Conn {
        let now = Instant::now();
        let fd = match &stream {
            Transport::Shm(_) => -1,
            other => other.as_raw_fd(),
        };
        let live = super::clients::ClientLive::new(fd, super::now_ms());
        Conn {
            stream,
            session,
            reader: RequestReader::new(limits),
            out: Vec::new(),
            out_sent: 0,
            streams: VecDeque::new(),
            held: Vec::new(),
            hold_until: None,
            held_since: None,
            spare: Vec::new(),
            recv_armed: false,
            more_input: false,
            closing: false,
            quit: false,
            dead: false,
            deferred: None,
            parked_reads: 0,
            fills: 0,
            tx: None,
            watched: Watched::default(),
            last_active: now,
            addr,
            tls: None,
            tls_closed: false,
            denied: false,
            slot: 0,
            worker: 0,
            last_error: None,
            wakes: None,
            blocked: None,
            retry: None,
            woke: Vec::new(),
            woke_until: None,
            pushes: None,
            subscriptions: super::pubsub::Subscriptions::default(),
            script_pending: false,
            scripts_done: None,
            errors: None,
            replies: Replies::On,
            live: std::sync::Arc::new(live),
            tracking: false,
            tracking_caching: false,
            postponed: false,
        }
    }

    /// What a push left for this client becomes on its connection, if
    /// anything: an invalidation is a RESP3 push, or a message on
    /// `__redis__:invalidate` for a redirected RESP2 client in pub/sub
    /// mode, or nothing (Redis's `sendTrackingMessage`).
    pub(super) fn push_for(&self, push: super::tracking::Push) -> Option<Reply> {
        use super::tracking::Push;
        let resp3 = self.session.protocol() == crate::resp::Protocol::Resp3;
        let bulk = |b: &[u8]| Reply::Bulk(b.to_vec());
        match push {
            Push::Message(message) => Some(message),
            Push::Invalidate { keys, redirected } => {
                let keys = match keys {
                    Some(keys) => Reply::Array(keys.iter().map(|k| bulk(k)).collect()),
                    None => Reply::Null,
                };
                if resp3 {
                    Some(Reply::Push(vec![bulk(b"invalidate"), keys]))
                } else if redirected && self.subscriptions.any() {
                    Some(Reply::Push(vec![
                        bulk(b"message"),
                        bulk(super::tracking::CHANNEL),
                        keys,
                    ]))
                } else {
                    None
                }
            }
            Push::RedirectBroken(id) if resp3 => Some(Reply::Push(vec![
                bulk(b"tracking-redir-broken"),
                Reply::Integer(id as i64),
            ])),
            Push::RedirectBroken(_) => None,
        }
    }

    /// Queues `reply`; it waits for durability if an earlier one does.
    pub(super) fn push_reply(&mut self, reply: &Reply) {
        if let (Some(errors), Reply::Error(text)) = (&self.errors, reply) {
            errors.note(text);
        }
        if let Reply::Error(text) = reply {
            self.last_error = Some(is_refusal(text));
        }
        if matches!(self.replies, Replies::Off | Replies::Skipping) {
            return;
        }
        self.push_message(reply);
    }

    /// Queues `reply` whatever CLIENT REPLY says: pub/sub messages and
    /// (un)subscribe confirmations, which Redis sends as pushes.
    pub(super) fn push_message(&mut self, reply: &Reply) {
        let protocol = self.session.protocol();
        let target = if self.hold_until.is_some() {
            &mut self.held
        } else {
            &mut self.out
        };
        reply.encode_into(protocol, target);
    }

    /// Queues a bulk string reply of a value the store found. For a
    /// shared-memory client the value is copied once, from wherever the
    /// store holds it into the response ring: with nothing queued before
    /// it and room for it whole, the reply is built straight in the ring
    /// (published with the turn's other replies when the worker sends); a
    /// big value is kept where it lies and streams into the ring in
    /// pieces as the client reads. Anything else is queued like any reply.
    pub(super) fn push_bulk(&mut self, value: Found<'_>) {
        let bytes = value.bytes();
        let mut header = [0u8; BLOB_HEADER_MAX_BYTES];
        let header = blob_header(b'$', bytes.len(), &mut header);
        let backlog = self.has_backlog();
        if self.hold_until.is_none() {
            if let Transport::Shm(link) = &mut self.stream {
                // An error here (a lying client) leaves the reply queued;
                // the next send meets the error and closes the client.
                if !backlog && link.channel.stage_all(&[header, bytes, b"\r\n"]) == Ok(true) {
                    return;
                }
                if bytes.len() >= STREAM_MIN_BYTES {
                    self.push_stream(header, value);
                    return;
                }
            } else if self.tls.is_none() && bytes.len() >= SOCKET_STREAM_MIN_BYTES {
                self.push_stream(header, value);
                return;
            }
        }
        let target = if self.hold_until.is_some() {
            &mut self.held
        } else {
            &mut self.out
        };
        target.extend_from_slice(header);
        target.extend_from_slice(bytes);
        target.extend_from_slice(b"\r\n");
    }

    /// Queues a bulk reply whose value stays where the store holds it, to
    /// go out from there ([`Stream`]).
    fn push_stream(&mut self, header: &[u8], value: Found<'_>) {
        self.out.extend_from_slice(header);
        self.streams.push_back(Stream {
            at: self.out.len(),
            value: value.keep(),
            sent: 0,
        });
        self.out.extend_from_slice(b"\r\n");
    }

    /// A socket client (no TLS): the next buffer to send and where in it
    /// its bytes start — the replies before the first waiting value, or
    /// that value itself (no copy of it when it has an allocation of its
    /// own); None when nothing waits.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a first stream"
    )]
    pub(super) fn next_socket_send(&mut self) -> Option<(Vec<u8>, usize)> {
        debug_assert!(self.tls.is_none() && !self.stream.is_shm());
        match self.streams.front() {
            None if self.out.is_empty() => None,
            None => {
                let mut buf = std::mem::take(&mut self.spare);
                std::mem::swap(&mut buf, &mut self.out);
                Some((buf, 0))
            }
            Some(first) if first.at > 0 => {
                let at = first.at;
                let rest = self.out.split_off(at);
                let buf = std::mem::replace(&mut self.out, rest);
                for s in &mut self.streams {
                    s.at -= at;
                }
                Some((buf, 0))
            }
            Some(_) => {
                let first = self.streams.pop_front().expect("a first stream");
                debug_assert!(first.value.len() >= SOCKET_STREAM_MIN_BYTES);
                Some(first.value.into_vec())
            }
        }
    }

    /// Reply bytes waiting to go out (held ones not counted): for a
    /// shared-memory client, what is not in the ring yet, streamed values
    /// included.
    pub(super) fn backlog_bytes(&self) -> usize {
        let streamed: usize = self.streams.iter().map(|s| s.value.len() - s.sent).sum();
        self.out.len() - self.out_sent + streamed
    }

    /// Whether reply bytes wait to go out.
    pub(super) fn has_backlog(&self) -> bool {
        self.out.len() > self.out_sent || !self.streams.is_empty()
    }

    /// Shared memory: moves waiting replies into the response ring as far
    /// as it has room, after what was built in it this turn, and publishes
    /// them; how many bytes were published.
    pub(super) fn send_to_ring(&mut self) -> Result<usize, sluice_io::shm::ShmError> {
        let Transport::Shm(link) = &mut self.stream else {
            return Ok(0);
        };
        let mut published = link.channel.publish_staged();
        loop {
            let until = self.streams.front().map_or(self.out.len(), |s| s.at);
            if self.out_sent < until {
                let n = link.channel.write(&self.out[self.out_sent..until])?;
                self.out_sent += n;
                published += n;
                if self.out_sent < until {
                    break;
                }
            }
            let Some(stream) = self.streams.front_mut() else {
                break;
            };
            let n = link.channel.write(&stream.value.bytes()[stream.sent..])?;
            stream.sent += n;
            published += n;
            if stream.sent < stream.value.len() {
                break;
            }
            self.streams.pop_front();
        }
        if !self.has_backlog() {
            self.out.clear();
            self.out_sent = 0;
        } else if self.out_sent >= STREAM_MIN_BYTES && self.out_sent * 2 >= self.out.len() {
            // Give back the sent front now and then (not every send).
            self.out.drain(..self.out_sent);
            for s in &mut self.streams {
                s.at -= self.out_sent;
            }
            self.out_sent = 0;
        }
        Ok(published)
    }

    /// Queues raw reply bytes (protocol errors).
    pub(super) fn push_bytes(&mut self, bytes: &[u8]) {
        if self.hold_until.is_some() {
            self.held.extend_from_slice(bytes);
        } else {
            self.out.extend_from_slice(bytes);
        }
    }

    /// This reply and all after it wait until the log is durable to `at`.
    pub(super) fn hold_until(&mut self, at: LogPosition) {
        self.hold_until = self.hold_until.max(Some(at));
        self.held_since.get_or_insert_with(Instant::now);
    }

    /// Releases the held replies if the log is durable far enough; returns
    /// how long they waited.
    pub(super) fn release_if(&mut self, durable: impl Fn(LogPosition) -> bool) -> Option<u128> {
        let at = self.hold_until?;
        if !durable(at) {
            return None;
        }
        self.hold_until = None;
        self.out.append(&mut self.held);
        self.held_since.take().map(|t| t.elapsed().as_micros())
    }

    /// Bytes of replies not yet handed to a send.
    pub(super) fn waiting_bytes(&self) -> usize {
        self.backlog_bytes() + self.held.len()
    }
}

/// Whether an error reply refuses a command before it runs (Redis counts
/// those as `rejected_calls`, the others as `failed_calls`).
fn is_refusal(text: &str) -> bool {
    const REFUSALS: &[&str] = &[
        "ERR wrong number of arguments",
        "NOAUTH",
        "NOPERM",
        "BUSY",
        "NOREPLICAS",
        "OOM",
        "EXECABORT",
        "ERR Can't execute",
        "ERR only (P|S)SUBSCRIBE",
    ];
    REFUSALS.iter().any(|r| text.starts_with(r))
}
