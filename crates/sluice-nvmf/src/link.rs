//! A connection's socket as the front ends use it: plain, or under TLS
//! (rustls for NBD's certificates, OpenSSL for NVMe/TCP's pre-shared keys).
//! Reads either take what has come or wait (up to the socket's read
//! timeout); sends go out whole.

use crate::datapath::Outgoing;
use std::io::{BufWriter, ErrorKind, Read, Write};
use std::net::TcpStream;

/// Bytes gathered into one TLS write (one record or a few), so that a
/// group of answers is not split into a record per PDU.
const TLS_WRITE_BYTES: usize = 64 << 10;

/// A connection's socket.
pub(crate) trait Link {
    /// Bytes already received, or `WouldBlock`; 0: the peer closed.
    fn try_read(&mut self, buf: &mut [u8]) -> std::io::Result<usize>;
    /// Waits for bytes (up to the socket's read timeout: then `WouldBlock`
    /// or `TimedOut`); 0: the peer closed.
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize>;
    /// Sends all of `out` and empties it.
    fn send(&mut self, out: &mut Outgoing) -> std::io::Result<()>;
    /// Sends `bytes` (a last word before the connection ends).
    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()>;
}

/// The plain socket: reads that poll before they block, replies with one
/// `writev` that sends read data from its I/O buffers.
pub(crate) struct PlainLink {
    pub(crate) stream: TcpStream,
    pub(crate) reader: crate::poll::PollingReader,
}

impl PlainLink {
    pub(crate) fn new(stream: TcpStream) -> PlainLink {
        PlainLink {
            stream,
            reader: crate::poll::PollingReader::new(),
        }
    }
}

impl Link for PlainLink {
    fn try_read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        sluice_io::net::recv_nowait(&self.stream, buf)
    }
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.reader.read(&mut self.stream, buf)
    }
    fn send(&mut self, out: &mut Outgoing) -> std::io::Result<()> {
        out.send(&mut self.stream)
    }
    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }
}

/// The socket under rustls: plaintext in and out through the connection's
/// TLS state.
pub(crate) struct RustlsLink {
    pub(crate) tls: rustls::StreamOwned<rustls::ServerConnection, TcpStream>,
}

impl Drop for RustlsLink {
    /// A TLS session ends with close_notify both ways before the socket
    /// closes: libnbd, having sent NBD_CMD_DISC, waits for the server's
    /// close_notify, and a socket closed without one (or with the
    /// client's own still unread, which makes the close a reset) fails
    /// its shutdown with "server closed socket unexpectedly".
    fn drop(&mut self) {
        self.tls.conn.send_close_notify();
        let _ = self.tls.flush();
        let _ = self.tls.sock.shutdown(std::net::Shutdown::Write);
        let _ = self
            .tls
            .sock
            .set_read_timeout(Some(std::time::Duration::from_millis(200)));
        // What the client still sends (its close_notify), up to its close
        // or a second: never a wait on a client that does not close.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        let mut sink = [0u8; 4096];
        while std::time::Instant::now() < deadline {
            match self.tls.sock.read(&mut sink) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    }
}

/// A socket's reads without waiting.
struct NoWait<'a>(&'a TcpStream);

impl Read for NoWait<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        sluice_io::net::recv_nowait(self.0, buf)
    }
}

impl Link for RustlsLink {
    fn try_read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            match self.tls.conn.reader().read(buf) {
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                other => return other,
            }
            if self.tls.conn.read_tls(&mut NoWait(&self.tls.sock))? == 0 {
                return Ok(0);
            }
            self.tls
                .conn
                .process_new_packets()
                .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e))?;
        }
    }
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.tls.read(buf)
    }
    fn send(&mut self, out: &mut Outgoing) -> std::io::Result<()> {
        out.write_to(&mut self.tls)?;
        self.tls.flush()
    }
    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.tls.write_all(bytes)?;
        self.tls.flush()
    }
}

/// The socket under OpenSSL (NVMe/TCP with a pre-shared key). OpenSSL
/// reads a record's header and then its body and nothing past it, so what
/// it holds undecrypted is at most the rest of one record: a socket with
/// nothing to read and no decrypted bytes pending means nothing has come.
pub(crate) struct OpensslLink {
    pub(crate) tls: openssl::ssl::SslStream<crate::poll::PolledStream>,
}

impl Link for OpensslLink {
    fn try_read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.tls.ssl().pending() == 0
            && !sluice_io::net::readable_now(self.tls.get_ref().get_ref())?
        {
            return Err(ErrorKind::WouldBlock.into());
        }
        self.tls.read(buf)
    }
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.tls.read(buf)
    }
    fn send(&mut self, out: &mut Outgoing) -> std::io::Result<()> {
        let mut w = BufWriter::with_capacity(TLS_WRITE_BYTES, &mut self.tls);
        out.write_to(&mut w)?;
        w.flush()
    }
    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.tls.write_all(bytes)?;
        self.tls.flush()
    }
}
