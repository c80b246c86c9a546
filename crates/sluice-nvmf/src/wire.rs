//! A worker's connection's socket: plain, or under TLS after its handshake
//! (OpenSSL for NVMe/TCP's pre-shared keys, rustls for NBD's certificates).
//! All are non-blocking: a read takes what has come (or `WouldBlock`), a
//! send takes what the socket takes now and keeps the rest for the
//! connection's next turn, so that a TLS client costs no thread of its own.

use crate::datapath::Outgoing;
use crate::poll::PolledStream;
use openssl::ssl::SslStream;
use std::io::{ErrorKind, IoSliceMut, Read, Write};
use std::net::TcpStream;

/// Plaintext gathered for TLS records at a time: a group of answers goes
/// out in few records rather than one per PDU (a header alone would be a
/// record and a system call of its own), and the rest waits in the
/// connection's [`Outgoing`] (which its unsent-bytes limit counts).
const TLS_STAGED_BYTES: usize = 64 << 10;

/// A worker's connection's socket.
pub(crate) enum Wire {
    /// The socket itself: reads into the caller's buffers, answers with
    /// one `writev` that sends read data from its I/O buffers.
    Plain(TcpStream),
    /// An OpenSSL session (NVMe/TCP with a pre-shared key) over the socket.
    Tls(Box<TlsWire>),
    /// A rustls session (NBD with the node's certificate) over the socket.
    Rustls(Box<RustlsWire>),
}

/// A rustls session on a worker.
pub(crate) struct RustlsWire {
    session: rustls::ServerConnection,
    socket: TcpStream,
    staged: Staged,
    /// The last read filled its buffer: more plaintext may be decrypted
    /// and waiting (the session's own bytes are looked at first).
    maybe_buffered: bool,
    /// The end of the session: close_notify queued, then the socket shut
    /// for writing once it went.
    closing: Closing,
}

/// How far a rustls session has come in ending.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Closing {
    Open,
    NotifyQueued,
    WriteShut,
}

/// A TLS session on a worker, with the plaintext of answers staged for it.
pub(crate) struct TlsWire {
    session: SslStream<PolledStream>,
    staged: Staged,
}

/// Plaintext taken from a connection's answers for its TLS session, at
/// most [`TLS_STAGED_BYTES`] at a time, which the session has taken up to
/// `at`. A write the session could not finish is retried with the same
/// bytes at the front, as OpenSSL requires.
struct Staged {
    bytes: Vec<u8>,
    at: usize,
}

impl Staged {
    fn new() -> Staged {
        Staged {
            bytes: Vec::with_capacity(TLS_STAGED_BYTES),
            at: 0,
        }
    }

    /// What the session is to take next: the rest of what is staged, or,
    /// once all of it went, the next bytes of `out`; empty when nothing is
    /// left to send.
    fn next(&mut self, out: &mut Outgoing) -> &[u8] {
        if self.at == self.bytes.len() {
            self.bytes.clear();
            self.at = 0;
            out.copy_out(&mut self.bytes, TLS_STAGED_BYTES);
        }
        &self.bytes[self.at..]
    }

    /// The session took `n` bytes of [`Staged::next`].
    fn took(&mut self, n: usize) {
        self.at += n;
        assert!(self.at <= self.bytes.len(), "took only what was staged");
    }

    /// Bytes staged that the session has not taken yet.
    fn is_pending(&self) -> bool {
        self.at < self.bytes.len()
    }
}

impl Wire {
    /// A TLS session whose handshake is done, made non-blocking.
    pub(crate) fn tls(mut session: SslStream<PolledStream>) -> std::io::Result<Wire> {
        session.get_mut().serve_nonblocking()?;
        Ok(Wire::Tls(Box::new(TlsWire {
            session,
            staged: Staged::new(),
        })))
    }

    /// A rustls session whose handshake is done (plaintext the client sent
    /// after it may wait in the session already).
    pub(crate) fn rustls(session: rustls::ServerConnection, socket: TcpStream) -> Wire {
        Wire::Rustls(Box::new(RustlsWire {
            session,
            socket,
            staged: Staged::new(),
            maybe_buffered: true,
            closing: Closing::Open,
        }))
    }

    /// The socket (to watch for readiness and name the peer).
    pub(crate) fn socket(&self) -> &TcpStream {
        match self {
            Wire::Plain(s) => s,
            Wire::Tls(t) => t.session.get_ref().get_ref(),
            Wire::Rustls(t) => &t.socket,
        }
    }

    /// Reads what has come into `buf`: 0 when the host closed,
    /// `WouldBlock` when nothing has.
    pub(crate) fn recv(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Wire::Plain(s) => sluice_io::net::recv_nowait(s, buf),
            Wire::Tls(t) => t.session.read(buf),
            Wire::Rustls(t) => t.recv(buf),
        }
    }

    /// Reads what has come into `parts`, in order.
    pub(crate) fn recv_vectored(&mut self, parts: &mut [IoSliceMut<'_>]) -> std::io::Result<usize> {
        match self {
            Wire::Plain(s) => (&*s).read_vectored(parts),
            // A record's plaintext at a time: the first part with room.
            Wire::Tls(_) | Wire::Rustls(_) => match parts.iter_mut().find(|p| !p.is_empty()) {
                Some(part) => self.recv(part),
                None => Ok(0),
            },
        }
    }

    /// Whether a read that did not fill its buffer took all there was: so
    /// for the socket itself; a TLS read ends at its record's end.
    pub(crate) fn short_read_drains(&self) -> bool {
        matches!(self, Wire::Plain(_))
    }

    /// Plaintext decrypted and not yet read: the connection needs a turn
    /// though its socket may not be readable.
    pub(crate) fn has_buffered(&self) -> bool {
        match self {
            Wire::Plain(_) => false,
            Wire::Tls(t) => t.session.ssl().pending() > 0,
            Wire::Rustls(t) => t.maybe_buffered,
        }
    }

    /// Bytes taken from the answers that the socket has not taken yet.
    pub(crate) fn has_unsent(&self) -> bool {
        match self {
            Wire::Plain(_) => false,
            Wire::Tls(t) => t.staged.is_pending(),
            Wire::Rustls(t) => t.staged.is_pending() || t.session.wants_write(),
        }
    }

    /// Sends what the socket takes now of `out` (and of what this wire
    /// holds); returns whether everything has gone.
    pub(crate) fn send_some(&mut self, out: &mut Outgoing) -> std::io::Result<bool> {
        match self {
            Wire::Plain(s) => out.send_some(s),
            Wire::Tls(t) => t.send_some(out),
            Wire::Rustls(t) => t.send_some(out),
        }
    }

    /// Ends the session's side of the conversation without waiting, a step
    /// a call: returns true when the socket may be closed. A plain socket
    /// may be at once. A rustls session sends close_notify, shuts the
    /// socket for writing and reads until the client closes: libnbd, having
    /// sent NBD_CMD_DISC, waits for the server's close_notify, and a socket
    /// closed without one (or with the client's own still unread, which
    /// makes the close a reset) fails its shutdown with "server closed
    /// socket unexpectedly". The caller bounds how long this may take.
    pub(crate) fn finish(&mut self) -> std::io::Result<bool> {
        match self {
            Wire::Plain(_) | Wire::Tls(_) => Ok(true),
            Wire::Rustls(t) => t.finish(),
        }
    }
}

impl RustlsWire {
    fn recv(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            match self.session.reader().read(buf) {
                Ok(n) => {
                    self.maybe_buffered = n > 0 && n == buf.len();
                    return Ok(n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            self.maybe_buffered = false;
            if self.session.read_tls(&mut &self.socket)? == 0 {
                return Ok(0);
            }
            self.session
                .process_new_packets()
                .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e))?;
        }
    }

    /// Sends the session's records first, then gives it more plaintext.
    fn send_some(&mut self, out: &mut Outgoing) -> std::io::Result<bool> {
        loop {
            while self.session.wants_write() {
                match self.session.write_tls(&mut &self.socket) {
                    Ok(0) => return Err(ErrorKind::WriteZero.into()),
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                    Err(e) => return Err(e),
                }
            }
            let next = self.staged.next(out);
            if next.is_empty() {
                return Ok(true);
            }
            let n = self.session.writer().write(next)?;
            if n == 0 {
                return Err(ErrorKind::WriteZero.into());
            }
            self.staged.took(n);
        }
    }

    fn finish(&mut self) -> std::io::Result<bool> {
        if self.closing == Closing::Open {
            self.session.send_close_notify();
            self.closing = Closing::NotifyQueued;
        }
        if self.closing == Closing::NotifyQueued {
            if !self.send_some(&mut Outgoing::default())? {
                return Ok(false);
            }
            self.socket.shutdown(std::net::Shutdown::Write)?;
            self.closing = Closing::WriteShut;
        }
        // What the client still sends (its close_notify), up to its close.
        let mut sink = [0u8; 4096];
        loop {
            match (&self.socket).read(&mut sink) {
                Ok(0) => return Ok(true),
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(_) => return Ok(true),
            }
        }
    }
}

impl TlsWire {
    fn send_some(&mut self, out: &mut Outgoing) -> std::io::Result<bool> {
        loop {
            let next = self.staged.next(out);
            if next.is_empty() {
                return Ok(true);
            }
            match self.session.write(next) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => self.staged.took(n),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
    }
}
