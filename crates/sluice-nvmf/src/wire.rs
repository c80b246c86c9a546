//! A worker's connection's socket: plain, or under TLS after its handshake.
//! Both are non-blocking: a read takes what has come (or `WouldBlock`), a
//! send takes what the socket takes now and keeps the rest for the
//! connection's next turn, so that a TLS host costs no thread of its own.

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
}

/// A TLS session on a worker, with the plaintext of answers staged for it.
pub(crate) struct TlsWire {
    session: SslStream<PolledStream>,
    /// Plaintext taken from the connection's answers, at most
    /// [`TLS_STAGED_BYTES`] at a time; the session has taken it up to
    /// `staged_at`. A write OpenSSL could not finish is retried with the
    /// same bytes at the front, as it requires.
    staged: Vec<u8>,
    staged_at: usize,
}

impl Wire {
    /// A TLS session whose handshake is done, made non-blocking.
    pub(crate) fn tls(mut session: SslStream<PolledStream>) -> std::io::Result<Wire> {
        session.get_mut().serve_nonblocking()?;
        Ok(Wire::Tls(Box::new(TlsWire {
            session,
            staged: Vec::with_capacity(TLS_STAGED_BYTES),
            staged_at: 0,
        })))
    }

    /// The socket (to watch for readiness and name the peer).
    pub(crate) fn socket(&self) -> &TcpStream {
        match self {
            Wire::Plain(s) => s,
            Wire::Tls(t) => t.session.get_ref().get_ref(),
        }
    }

    /// Reads what has come into `buf`: 0 when the host closed,
    /// `WouldBlock` when nothing has.
    pub(crate) fn recv(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Wire::Plain(s) => sluice_io::net::recv_nowait(s, buf),
            Wire::Tls(t) => t.session.read(buf),
        }
    }

    /// Reads what has come into `parts`, in order.
    pub(crate) fn recv_vectored(&mut self, parts: &mut [IoSliceMut<'_>]) -> std::io::Result<usize> {
        match self {
            Wire::Plain(s) => (&*s).read_vectored(parts),
            // A record's plaintext at a time: the first part with room.
            Wire::Tls(t) => match parts.iter_mut().find(|p| !p.is_empty()) {
                Some(part) => t.session.read(part),
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
        }
    }

    /// Bytes taken from the answers that the socket has not taken yet.
    pub(crate) fn has_unsent(&self) -> bool {
        match self {
            Wire::Plain(_) => false,
            Wire::Tls(t) => t.staged_at < t.staged.len(),
        }
    }

    /// Sends what the socket takes now of `out` (and of what this wire
    /// holds); returns whether everything has gone.
    pub(crate) fn send_some(&mut self, out: &mut Outgoing) -> std::io::Result<bool> {
        match self {
            Wire::Plain(s) => out.send_some(s),
            Wire::Tls(t) => t.send_some(out),
        }
    }
}

impl TlsWire {
    fn send_some(&mut self, out: &mut Outgoing) -> std::io::Result<bool> {
        loop {
            if self.staged_at == self.staged.len() {
                self.staged.clear();
                self.staged_at = 0;
                out.copy_out(&mut self.staged, TLS_STAGED_BYTES);
            }
            if self.staged.is_empty() {
                return Ok(true);
            }
            match self.session.write(&self.staged[self.staged_at..]) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => self.staged_at += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
    }
}
