//! The initiator's socket (`sluice nvmf`): plain, or under OpenSSL with a
//! pre-shared key. Reads wait (up to the socket's read timeout), polling
//! first; sends go out whole. The node's own connections are served by its
//! workers over [`crate::wire::Wire`] instead.

use std::io::{Read, Write};
use std::net::TcpStream;

/// A blocking socket of the initiator.
pub(crate) trait Link {
    /// Waits for bytes (up to the socket's read timeout: then `WouldBlock`
    /// or `TimedOut`); 0: the peer closed.
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize>;
    /// Sends all of `bytes`.
    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()>;
}

/// The plain socket: reads that poll before they block.
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
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.reader.read(&mut self.stream, buf)
    }
    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }
}

/// The socket under OpenSSL (NVMe/TCP with a pre-shared key).
pub(crate) struct OpensslLink {
    pub(crate) tls: openssl::ssl::SslStream<crate::poll::PolledStream>,
}

impl Link for OpensslLink {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.tls.read(buf)
    }
    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.tls.write_all(bytes)?;
        self.tls.flush()
    }
}
