//! NBD, the node's second front end over the same namespaces: the fixed
//! newstyle handshake (NBD_OPT_GO/INFO/EXPORT_NAME/LIST/STRUCTURED_REPLY,
//! and STARTTLS: TLS through rustls, optional or required),
//! then read, write, flush, trim and write zeroes, with structured replies
//! when the client asks for them (docs/NVMF.md, "NBD"). Export "" and "1"
//! are namespace 1, "N" namespace N.
//!
//! The handshake runs on the thread that took the connection in (bounded in
//! time, and in number by the node's setup slots); then the node's workers
//! serve the transmission phase, many clients each: whole-block reads and
//! writes are kept in flight at the device (`datapath`), everything else
//! runs after them on the worker's helper thread.
//! Requests at byte offsets the device's blocks
//! do not align with are served by reading the covering blocks (and, for
//! writes, writing them back under the namespace's write gate held alone, so
//! no other write lands in between).
//!
//! Rooms: `handshake`, `transmission` (a client's session on a worker:
//! the requests kept at the device), `requests` (the wire format of
//! requests and replies, and the requests that run the slow way).

mod handshake;
mod requests;
mod transmission;

use handshake::{export_size_bytes, greet, handshake, Haggled, Split, TlsState, Watchdog};
use transmission::{NbdSession, NbdStart};

use crate::controller::Subsystem;
use crate::wire::Wire;
use crate::worker::{Handoff, Workers};
use std::io::{BufReader, BufWriter, ErrorKind, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags: fixed newstyle, no zeroes.
const FLAG_FIXED_NEWSTYLE: u16 = 1;
const FLAG_NO_ZEROES: u16 = 2;

mod opt {
    pub const EXPORT_NAME: u32 = 1;
    pub const ABORT: u32 = 2;
    pub const LIST: u32 = 3;
    pub const STARTTLS: u32 = 5;
    pub const INFO: u32 = 6;
    pub const GO: u32 = 7;
    pub const STRUCTURED_REPLY: u32 = 8;
}

mod rep {
    pub const ACK: u32 = 1;
    pub const SERVER: u32 = 2;
    pub const INFO: u32 = 3;
    pub const ERR_UNSUP: u32 = 0x8000_0001;
    pub const ERR_POLICY: u32 = 0x8000_0002;
    pub const ERR_INVALID: u32 = 0x8000_0003;
    pub const ERR_TLS_REQD: u32 = 0x8000_0005;
    pub const ERR_UNKNOWN: u32 = 0x8000_0006;
}

mod cmd {
    pub const READ: u16 = 0;
    pub const WRITE: u16 = 1;
    pub const DISC: u16 = 2;
    pub const FLUSH: u16 = 3;
    pub const TRIM: u16 = 4;
    pub const WRITE_ZEROES: u16 = 6;
}

/// Transmission flags: has flags, flush, FUA, trim, write zeroes, several
/// connections may share an export (every write goes to the same device).
const TRANSMISSION_FLAGS: u16 = 1 | 4 | 8 | 32 | 64 | 256;
/// The FUA command flag: the write is durable before the reply.
const CMD_FLAG_FUA: u16 = 1;

const EIO: u32 = 5;
const EINVAL: u32 = 22;
const ENOSPC: u32 = 28;
const ENOTSUP: u32 = 95;

/// Most bytes of one request (larger ones are refused with EINVAL).
pub const MAX_REQUEST_BYTES: u32 = 32 << 20;
/// Most bytes of one option's data.
const MAX_OPTION_BYTES: u32 = 64 << 10;

/// How NBD is served.
#[derive(Clone)]
pub struct NbdConfig {
    /// Most connections at once.
    pub max_connections: usize,
    /// TLS for clients that ask for it (NBD_OPT_STARTTLS) with this
    /// certificate; `None`: STARTTLS is refused.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Clients must start TLS before anything but NBD_OPT_ABORT.
    pub tls_required: bool,
    /// The whole handshake must be done within this.
    pub handshake_timeout: std::time::Duration,
    /// A request must arrive whole within this of its first byte.
    pub request_timeout: std::time::Duration,
    /// Threads serving the clients past their handshake (each serves
    /// many): one per core by default.
    pub workers: usize,
}

impl Default for NbdConfig {
    fn default() -> Self {
        NbdConfig {
            max_connections: crate::target::DEFAULT_MAX_CONNECTIONS,
            tls: None,
            tls_required: false,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            request_timeout: REQUEST_TIMEOUT,
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// Accepts NBD clients on `listener` until `stop` is set, at most
/// `config.max_connections` at once: each one's handshake on a thread of its
/// own, then served by one of [`NbdConfig::workers`].
pub fn serve(
    listener: TcpListener,
    subsystem: Arc<Subsystem>,
    config: NbdConfig,
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    if config.tls_required && config.tls.is_none() {
        return Err(std::io::Error::new(
            ErrorKind::InvalidInput,
            "NBD with TLS required needs a certificate (NbdConfig::tls)",
        ));
    }
    let max = config.max_connections;
    let workers = Arc::new(Workers::start(
        config.workers.max(1),
        subsystem.clone(),
        stop.clone(),
        "nbd-worker",
    )?);
    let handing = workers.clone();
    let result =
        crate::target::accept_loop(listener, max, stop, "nbd-conn", move |stream, counted| {
            serve_client(stream, counted, &subsystem, &config, &handing)
        });
    workers.join();
    result
}

/// How long a client may take over its handshake by default, all of it
/// (a client that trickles its options a byte at a time is cut at this
/// too).
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// By default, a request whose first byte has come must arrive whole (its
/// write data included) within this; between requests a client may idle
/// for ever.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: offered only with a certificate"
)]
fn serve_client(
    stream: TcpStream,
    mut counted: crate::target::Counted,
    subsystem: &Subsystem,
    config: &NbdConfig,
    workers: &Workers,
) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    // A client that never finishes its handshake does not hold a thread.
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    // A client that stops reading its replies does not hold its requests'
    // write shares (and another client's unaligned write) for ever.
    stream.set_write_timeout(Some(crate::target::SEND_TIMEOUT))?;
    let mut plain = Split {
        r: BufReader::with_capacity(
            64 << 10,
            crate::poll::PolledStream::new(stream.try_clone()?),
        ),
        w: BufWriter::with_capacity(64 << 10, stream.try_clone()?),
    };
    let tls = TlsState {
        offered: config.tls.is_some(),
        active: false,
        required: config.tls_required,
    };
    let watchdog = Watchdog::arm(&stream, config.handshake_timeout, "the handshake")?;
    let no_zeroes = greet(&mut plain)?;
    counted.talking();
    let haggled = handshake(&mut plain, subsystem, tls, no_zeroes)?;
    plain.w.flush()?;
    let (nsid, structured) = match haggled {
        Haggled::Abort => return Ok(()),
        Haggled::Export(nsid, structured) => (nsid, structured),
        Haggled::StartTls => {
            if !plain.r.buffer().is_empty() {
                return Err(protocol("bytes sent after NBD_OPT_STARTTLS before TLS"));
            }
            drop(plain);
            let tls_config = config.tls.clone().expect("offered only with a certificate");
            let conn = rustls::ServerConnection::new(tls_config)
                .map_err(|e| protocol(&format!("TLS: {e}")))?;
            let mut tls_stream = rustls::StreamOwned::new(conn, stream);
            let active = TlsState {
                active: true,
                ..tls
            };
            let haggled = handshake(&mut tls_stream, subsystem, active, no_zeroes);
            let haggled = haggled.and_then(|h| tls_stream.flush().map(|()| h))?;
            let Haggled::Export(nsid, structured) = haggled else {
                return Ok(());
            };
            drop(watchdog);
            counted.admitted();
            let (session, socket) = tls_stream.into_parts();
            // Requests sent right after the last option wait in the session.
            let start = NbdStart {
                nsid,
                structured,
                request_timeout: config.request_timeout,
                early: Vec::new(),
            };
            return hand(workers, Wire::rustls(session, socket), counted, start);
        }
    };
    drop(watchdog);
    counted.admitted();
    let start = NbdStart {
        nsid,
        structured,
        request_timeout: config.request_timeout,
        // Requests the client sent right after its last option.
        early: plain.r.buffer().to_vec(),
    };
    drop(plain);
    hand(workers, Wire::Plain(stream), counted, start)
}

/// Gives a client past its handshake to the workers.
fn hand(
    workers: &Workers,
    wire: Wire,
    counted: crate::target::Counted,
    start: NbdStart,
) -> std::io::Result<()> {
    workers.hand(Handoff {
        wire,
        counted,
        begin: Box::new(move |subsystem, completions| {
            Box::new(NbdSession::new(subsystem, start, completions))
        }),
    })
}

fn protocol(what: &str) -> std::io::Error {
    std::io::Error::new(ErrorKind::InvalidData, what.to_string())
}

/// The NBD server's decoders without a socket, for the fuzz targets in
/// fuzz/ (feature `fuzzing`).
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    use super::requests::{run_request, NbdRequest};
    use super::transmission::REQUEST_HEADER_BYTES;
    use super::*;
    use std::io::Read;

    /// The client's bytes read from `input`, the server's kept.
    struct Duplex<'a> {
        input: &'a [u8],
        output: Vec<u8>,
    }

    impl Read for Duplex<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.input.read(buf)
        }
    }

    impl Write for Duplex<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.output.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The greeting and option haggling with `input` as all the client
    /// sends (TLS offered when `tls_offered`): the namespace an export
    /// chose, if one did; the bytes the server wrote; the input left.
    pub fn handshake<'a>(
        subsystem: &Subsystem,
        input: &'a [u8],
        tls_offered: bool,
    ) -> (Option<u32>, Vec<u8>, &'a [u8]) {
        let mut io = Duplex {
            input,
            output: Vec::new(),
        };
        let tls = TlsState {
            offered: tls_offered,
            active: false,
            required: false,
        };
        let chosen = greet(&mut io)
            .and_then(|no_zeroes| super::handshake(&mut io, subsystem, tls, no_zeroes))
            .ok()
            .and_then(|h| match h {
                Haggled::Export(nsid, _) => Some(nsid),
                _ => None,
            });
        (chosen, io.output, io.input)
    }

    /// A request as the transmission phase runs it the slow way.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Ran {
        /// Its command (NBD_CMD_*).
        pub kind: u16,
        /// Its byte offset.
        pub offset: u64,
        /// Its length in bytes.
        pub len: u32,
        /// The NBD error it is answered with (0: done).
        pub error: u32,
        /// What a read returned.
        pub read: Vec<u8>,
    }

    /// The request whose header (and, for a write, data) starts `input`,
    /// run against namespace `nsid`; and the input after it. None when the
    /// header is cut short or has no request magic, or no such namespace.
    pub fn request<'a>(
        subsystem: &Subsystem,
        nsid: u32,
        input: &'a [u8],
    ) -> Option<(Ran, &'a [u8])> {
        let ns = subsystem.namespace(nsid)?;
        let header = input.get(..REQUEST_HEADER_BYTES)?;
        let request = NbdRequest::parse(header).ok()?;
        let rest = &input[REQUEST_HEADER_BYTES..];
        let data_len = request.data_bytes().min(rest.len());
        let (data, rest) = rest.split_at(data_len);
        if data.len() != request.data_bytes() {
            return None;
        }
        let mut buf = Vec::new();
        let error = run_request(ns, &request, data, &mut buf);
        let read = if request.kind == cmd::READ && error == 0 {
            buf
        } else {
            Vec::new()
        };
        Some((
            Ran {
                kind: request.kind,
                offset: request.offset,
                len: request.len,
                error,
                read,
            },
            rest,
        ))
    }

    /// The size of namespace `nsid` in bytes.
    pub fn size(subsystem: &Subsystem, nsid: u32) -> Option<u64> {
        subsystem.namespace(nsid).map(export_size_bytes)
    }

    /// NBD's request magic.
    pub const REQUEST_MAGIC_BYTES: [u8; 4] = REQUEST_MAGIC.to_be_bytes();

    /// NBD_CMD_READ.
    pub const READ: u16 = cmd::READ;
    /// NBD_CMD_WRITE.
    pub const WRITE: u16 = cmd::WRITE;
    /// NBD_CMD_FLUSH.
    pub const FLUSH: u16 = cmd::FLUSH;
    /// NBD_CMD_TRIM (trimmed bytes read as zeros here).
    pub const TRIM: u16 = cmd::TRIM;
    /// NBD_CMD_WRITE_ZEROES.
    pub const WRITE_ZEROES: u16 = cmd::WRITE_ZEROES;
}
