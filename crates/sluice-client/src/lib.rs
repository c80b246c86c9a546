//! # sluice-client
//!
//! A blocking client for `sluice serve` with one API over two transports:
//!
//! - `redis://host:port` — the Redis protocol over TCP (any Redis-protocol
//!   server answers it, `redis-server` too);
//! - `unix:///path/to/redis.sock` — the same over a Unix socket
//!   (`sluice serve --unixsocket`, Redis's `unixsocket`);
//! - `shm:///path/to/shm.sock` — the server's shared-memory rings
//!   (`sluice serve --shm PATH`): after a one-time handshake on the Unix
//!   socket, a request is bytes copied into a ring and one release store,
//!   no system call, unless the server thread sleeps.
//!
//! ```no_run
//! let mut c = sluice_client::Client::connect("shm:///run/sluice/shm.sock")?;
//! c.set(b"k", b"v")?;
//! assert_eq!(c.get(b"k")?, Some(b"v".to_vec()));
//! let replies = c.batch(&[vec![b"INCR".to_vec(), b"n".to_vec()]; 50])?;
//! # Ok::<(), sluice_client::Error>(())
//! ```
//!
//! Pipelining: [`Client::batch`] sends N commands at once and reads N
//! replies (over shm the N frames are published with one store). A reply
//! is framed in RESP2 or RESP3; [`Client::call_raw`] gives its bytes.
#![warn(clippy::expect_used)]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod shm;
pub mod value;

pub use value::Value;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

/// What can go wrong talking to a server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The URL is not one this client knows.
    #[error("{0}")]
    Url(String),
    /// The connection failed or closed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The server sent bytes that are not RESP.
    #[error("the server's reply is not valid RESP: {0}")]
    Protocol(String),
    /// The server refused the command (an error reply).
    #[error("{0}")]
    Server(String),
    /// The server refused the shared-memory connection.
    #[error("the server refused the shared-memory connection: {0}")]
    Refused(String),
    /// The server closed the connection.
    #[error("the server closed the connection")]
    Closed,
}

/// Where to connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `redis://host:port` (port 6379 if left out).
    Tcp(String),
    /// `unix:///path`: the Redis protocol on a Unix socket.
    Unix(PathBuf),
    /// `shm:///path`: the server's shared-memory socket.
    Shm(PathBuf),
}

impl Endpoint {
    /// Reads a URL: `redis://host[:port][/0]` or `shm:///absolute/path`.
    pub fn parse(url: &str) -> Result<Endpoint, Error> {
        if let Some(rest) = url.strip_prefix("redis://") {
            let host = rest.split('/').next().unwrap_or_default();
            let host = host.rsplit('@').next().unwrap_or_default();
            if host.is_empty() {
                return Err(Error::Url(format!("{url}: no host after redis://")));
            }
            let with_port = if host.contains(':') && !host.ends_with(']') {
                host.to_string()
            } else {
                format!("{host}:6379")
            };
            return Ok(Endpoint::Tcp(with_port));
        }
        for (scheme, shm) in [("shm://", true), ("unix://", false)] {
            let Some(path) = url.strip_prefix(scheme) else {
                continue;
            };
            if !path.starts_with('/') {
                return Err(Error::Url(format!(
                    "{url}: a {scheme} URL names an absolute socket path, as in {scheme}/run/sluice/sluice.sock"
                )));
            }
            let path = PathBuf::from(path);
            return Ok(if shm {
                Endpoint::Shm(path)
            } else {
                Endpoint::Unix(path)
            });
        }
        Err(Error::Url(format!(
            "{url}: the client speaks redis://host:port, unix:///path and shm:///path"
        )))
    }
}

/// Bytes in and out, whatever carries them.
trait Transport {
    /// Sends all of `bytes`, reading replies into `replies` meanwhile if
    /// the way out is full (so a big batch cannot deadlock against its own
    /// unread replies).
    fn send(&mut self, bytes: &[u8], replies: &mut Vec<u8>) -> Result<(), Error>;
    /// Appends what has arrived to `into`, waiting for at least one byte.
    fn receive(&mut self, into: &mut Vec<u8>) -> Result<(), Error>;
}

/// A socket: TCP or Unix.
struct Socket<S> {
    stream: S,
    chunk: Vec<u8>,
}

impl<S: Read + Write> Transport for Socket<S> {
    fn send(&mut self, bytes: &[u8], _replies: &mut Vec<u8>) -> Result<(), Error> {
        // The kernel's socket buffers take a batch while the server writes
        // its replies into its own; a client-side deadlock needs batches
        // far larger than those, which `Client::batch` splits.
        Ok(self.stream.write_all(bytes)?)
    }

    fn receive(&mut self, into: &mut Vec<u8>) -> Result<(), Error> {
        let n = self.stream.read(&mut self.chunk)?;
        if n == 0 {
            return Err(Error::Closed);
        }
        into.extend_from_slice(&self.chunk[..n]);
        Ok(())
    }
}

/// Most request bytes one TCP write of a batch carries before its replies
/// are read (see [`Socket::send`]).
const TCP_BATCH_BYTES: usize = 1 << 20;

/// A connection to a server.
pub struct Client {
    transport: Box<dyn Transport + Send>,
    /// Received bytes not yet handed out as replies.
    buf: Vec<u8>,
    /// Where the next unread reply starts in `buf`.
    pos: usize,
    request: Vec<u8>,
    is_shm: bool,
}

impl Client {
    /// Connects to `url` (see [`Endpoint::parse`]).
    pub fn connect(url: &str) -> Result<Client, Error> {
        Client::connect_to(&Endpoint::parse(url)?)
    }

    /// Connects to `endpoint`.
    pub fn connect_to(endpoint: &Endpoint) -> Result<Client, Error> {
        let (transport, is_shm): (Box<dyn Transport + Send>, bool) = match endpoint {
            Endpoint::Tcp(addr) => {
                let stream = TcpStream::connect(addr.as_str())?;
                stream.set_nodelay(true)?;
                (
                    Box::new(Socket {
                        stream,
                        chunk: vec![0; 64 << 10],
                    }),
                    false,
                )
            }
            Endpoint::Unix(path) => {
                let stream = std::os::unix::net::UnixStream::connect(path).map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("cannot connect to {}: {e}", path.display()),
                    )
                })?;
                (
                    Box::new(Socket {
                        stream,
                        chunk: vec![0; 64 << 10],
                    }),
                    false,
                )
            }
            Endpoint::Shm(path) => (Box::new(shm::ShmTransport::connect(path)?), true),
        };
        Ok(Client {
            transport,
            buf: Vec::new(),
            pos: 0,
            request: Vec::new(),
            is_shm,
        })
    }

    /// Whether this client talks over shared memory.
    pub fn is_shm(&self) -> bool {
        self.is_shm
    }

    /// Sends one command; returns its reply (error replies included, as
    /// [`Value::Error`]).
    pub fn call(&mut self, args: &[&[u8]]) -> Result<Value, Error> {
        let raw = self.call_raw(args)?;
        value::decode(&raw)
    }

    /// Sends one command; returns its reply's bytes as the server sent them.
    pub fn call_raw(&mut self, args: &[&[u8]]) -> Result<Vec<u8>, Error> {
        self.request.clear();
        encode(&mut self.request, args);
        let request = std::mem::take(&mut self.request);
        let sent = self.transport.send(&request, &mut self.buf);
        self.request = request;
        sent?;
        self.read_reply_raw()
    }

    /// Sends raw bytes (inline commands, several frames, or something
    /// malformed on purpose); read the replies with
    /// [`Client::read_reply_raw`].
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.transport.send(bytes, &mut self.buf)
    }

    /// The next reply's bytes.
    pub fn read_reply_raw(&mut self) -> Result<Vec<u8>, Error> {
        loop {
            if let Some(len) = value::reply_len(&self.buf[self.pos..])? {
                let reply = self.buf[self.pos..self.pos + len].to_vec();
                self.pos += len;
                if self.pos == self.buf.len() {
                    self.buf.clear();
                    self.pos = 0;
                }
                return Ok(reply);
            }
            if self.pos > 0 {
                self.buf.drain(..self.pos);
                self.pos = 0;
            }
            self.transport.receive(&mut self.buf)?;
        }
    }

    /// Reads the next `n` replies without building them (load generators:
    /// no allocation per reply); returns how many were error replies.
    pub fn discard_replies(&mut self, n: usize) -> Result<usize, Error> {
        let mut errors = 0;
        let mut left = n;
        while left > 0 {
            while left > 0 {
                let Some(len) = value::reply_len(&self.buf[self.pos..])? else {
                    break;
                };
                errors += usize::from(self.buf[self.pos] == b'-');
                self.pos += len;
                left -= 1;
            }
            if self.pos == self.buf.len() {
                self.buf.clear();
                self.pos = 0;
            }
            if left > 0 {
                if self.pos > 0 {
                    self.buf.drain(..self.pos);
                    self.pos = 0;
                }
                self.transport.receive(&mut self.buf)?;
            }
        }
        Ok(errors)
    }

    /// The next reply.
    pub fn read_reply(&mut self) -> Result<Value, Error> {
        value::decode(&self.read_reply_raw()?)
    }

    /// Sends every command at once (pipelining) and returns their replies
    /// in order.
    pub fn batch(&mut self, commands: &[Vec<Vec<u8>>]) -> Result<Vec<Value>, Error> {
        let mut replies = Vec::with_capacity(commands.len());
        let mut start = 0;
        while start < commands.len() {
            self.request.clear();
            let mut end = start;
            while end < commands.len() && (end == start || self.request.len() < TCP_BATCH_BYTES) {
                let args: Vec<&[u8]> = commands[end].iter().map(|a| &a[..]).collect();
                encode(&mut self.request, &args);
                end += 1;
            }
            let request = std::mem::take(&mut self.request);
            let sent = self.transport.send(&request, &mut self.buf);
            self.request = request;
            sent?;
            for _ in start..end {
                replies.push(self.read_reply()?);
            }
            start = end;
        }
        Ok(replies)
    }

    /// PING.
    pub fn ping(&mut self) -> Result<(), Error> {
        self.call(&[b"PING"])?.into_result().map(|_| ())
    }

    /// GET: the value, or None for a missing key.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        match self.call(&[b"GET", key])?.into_result()? {
            Value::Bulk(v) => Ok(Some(v)),
            Value::Nil => Ok(None),
            other => Err(Error::Protocol(format!("GET answered {other:?}"))),
        }
    }

    /// SET.
    pub fn set(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        self.call(&[b"SET", key, value])?.into_result().map(|_| ())
    }

    /// DEL: how many of `keys` existed.
    pub fn del(&mut self, keys: &[&[u8]]) -> Result<i64, Error> {
        let mut args: Vec<&[u8]> = vec![b"DEL"];
        args.extend_from_slice(keys);
        self.int(&args)
    }

    /// INCRBY: the new value.
    pub fn incr_by(&mut self, key: &[u8], by: i64) -> Result<i64, Error> {
        self.int(&[b"INCRBY", key, by.to_string().as_bytes()])
    }

    /// AUTH with a user name and password.
    pub fn auth(&mut self, user: &str, password: &str) -> Result<(), Error> {
        self.call(&[b"AUTH", user.as_bytes(), password.as_bytes()])?
            .into_result()
            .map(|_| ())
    }

    /// HSET of one field: 1 if it is new.
    pub fn hset(&mut self, key: &[u8], field: &[u8], value: &[u8]) -> Result<i64, Error> {
        self.int(&[b"HSET", key, field, value])
    }

    /// HGET: the field's value, or None.
    pub fn hget(&mut self, key: &[u8], field: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        match self.call(&[b"HGET", key, field])?.into_result()? {
            Value::Bulk(v) => Ok(Some(v)),
            Value::Nil => Ok(None),
            other => Err(Error::Protocol(format!("HGET answered {other:?}"))),
        }
    }

    fn int(&mut self, args: &[&[u8]]) -> Result<i64, Error> {
        match self.call(args)?.into_result()? {
            Value::Int(n) => Ok(n),
            other => Err(Error::Protocol(format!(
                "{} answered {other:?}, not an integer",
                String::from_utf8_lossy(args[0])
            ))),
        }
    }
}

/// Appends one command as a RESP multibulk request.
pub fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.push(b'*');
    out.extend_from_slice(args.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    for a in args {
        out.push(b'$');
        out.extend_from_slice(a.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// How long a shared-memory client spins for a reply before it parks:
/// longer than a pipelined batch of writes takes (~100–250 µs for 50 SETs
/// on a two-core machine), so a busy client is not put to sleep and woken
/// with two system calls per batch, and well under the 1 ms after which an
/// idle client must burn nothing.
pub const SHM_SPIN: Duration = Duration::from_micros(500);
