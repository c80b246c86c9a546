//! NBD, the node's second front end over the same namespaces: the fixed
//! newstyle handshake (NBD_OPT_GO/INFO/EXPORT_NAME/LIST/STRUCTURED_REPLY,
//! and STARTTLS: TLS through rustls, optional or required),
//! then read, write, flush, trim and write zeroes, with structured replies
//! when the client asks for them (docs/NVMF.md, "NBD"). Export "" and "1"
//! are namespace 1, "N" namespace N.
//!
//! One thread per connection; whole-block reads and writes are kept in
//! flight at the device (`datapath`), everything else runs after them.
//! Requests at byte offsets the device's blocks
//! do not align with are served by reading the covering blocks (and, for
//! writes, writing them back under the namespace's write gate held alone, so
//! no other write lands in between).

use crate::controller::{Namespace, Subsystem, MAX_TRANSFER_BYTES};
use crate::datapath::{DataPath, Finished, Outgoing};
use crate::link::{Link, PlainLink, RustlsLink};
use sluice_io::{IoBuf, Priority};
use std::io::{BufReader, BufWriter, ErrorKind, Read, Write};
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
}

impl Default for NbdConfig {
    fn default() -> Self {
        NbdConfig {
            max_connections: crate::target::DEFAULT_MAX_CONNECTIONS,
            tls: None,
            tls_required: false,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            request_timeout: REQUEST_TIMEOUT,
        }
    }
}

/// Accepts NBD clients on `listener` until `stop` is set, at most
/// `config.max_connections` at once, each on a thread of its own.
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
    crate::target::accept_loop(listener, max, stop, "nbd-conn", move |stream, counted| {
        serve_client(stream, counted, subsystem.clone(), &config)
    })
}

/// How long a client may take over its handshake by default, all of it
/// (a client that trickles its options a byte at a time is cut at this
/// too).
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// By default, a request whose first byte has come must arrive whole (its
/// write data included) within this; between requests a client may idle
/// for ever.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// How often a read that waits for a client wakes to look at the
/// request's deadline.
const REQUEST_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// Shuts a connection's socket at a deadline unless dropped first, so that
/// a phase made of many reads (the handshake) has one deadline, however
/// its bytes trickle in.
struct Watchdog {
    disarm: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn arm(
        stream: &TcpStream,
        limit: std::time::Duration,
        what: &'static str,
    ) -> std::io::Result<Watchdog> {
        let socket = stream.try_clone()?;
        let (disarm, armed) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("nbd-deadline".into())
            .spawn(move || {
                if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = armed.recv_timeout(limit) {
                    log::info!(
                        "NBD client {:?}: {what} not done within {} s; closed",
                        socket.peer_addr().ok(),
                        limit.as_secs()
                    );
                    let _ = socket.shutdown(std::net::Shutdown::Both);
                }
            })?;
        Ok(Watchdog {
            disarm: Some(disarm),
            thread: Some(thread),
        })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // The sender's end wakes the thread at once.
        drop(self.disarm.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether a read ended because its wait ran out.
fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// The error of a request that did not arrive whole within `limit`, if it
/// is late.
fn overdue(
    since: Option<std::time::Instant>,
    limit: std::time::Duration,
) -> Option<std::io::Error> {
    since.filter(|t| t.elapsed() > limit).map(|_| {
        std::io::Error::new(
            ErrorKind::TimedOut,
            format!(
                "a request did not arrive whole within {} ms",
                limit.as_millis()
            ),
        )
    })
}

#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: offered only with a certificate"
)]
fn serve_client(
    stream: TcpStream,
    mut counted: crate::target::Counted,
    subsystem: Arc<Subsystem>,
    config: &NbdConfig,
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
    let haggled = handshake(&mut plain, &subsystem, tls, no_zeroes)?;
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
            let haggled = handshake(&mut tls_stream, &subsystem, active, no_zeroes);
            let haggled = haggled.and_then(|h| tls_stream.flush().map(|()| h))?;
            let Haggled::Export(nsid, structured) = haggled else {
                return Ok(());
            };
            drop(watchdog);
            counted.admitted();
            tls_stream.sock.set_read_timeout(Some(REQUEST_POLL))?;
            return Transmission::new(subsystem, nsid, structured, config.request_timeout)
                .run(RustlsLink { tls: tls_stream }, Vec::new());
        }
    };
    drop(watchdog);
    counted.admitted();
    stream.set_read_timeout(Some(REQUEST_POLL))?;
    // Requests the client sent right after its last option.
    let early = plain.r.buffer().to_vec();
    let link = PlainLink {
        stream,
        reader: crate::poll::PollingReader::new(),
    };
    Transmission::new(subsystem, nsid, structured, config.request_timeout).run(link, early)
}

/// A reader and a writer as one stream (the handshake's plain socket).
struct Split<R, W> {
    r: R,
    w: W,
}

impl<R: Read, W> Read for Split<R, W> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.r.read(buf)
    }
}

impl<R, W: Write> Write for Split<R, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.w.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.w.flush()
    }
}

/// Where a connection stands with TLS.
#[derive(Debug, Clone, Copy)]
struct TlsState {
    /// The node has a certificate: STARTTLS is accepted.
    offered: bool,
    /// The connection runs over TLS now.
    active: bool,
    /// Nothing but STARTTLS and ABORT before TLS.
    required: bool,
}

/// How option haggling ended.
enum Haggled {
    /// Transmission on this namespace, structured replies or not.
    Export(u32, bool),
    /// The client asked for TLS and was told yes: the TLS handshake is next.
    StartTls,
    /// The client ended it.
    Abort,
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn read_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn protocol(what: &str) -> std::io::Error {
    std::io::Error::new(ErrorKind::InvalidData, what.to_string())
}

fn option_reply(w: &mut impl Write, option: u32, reply: u32, data: &[u8]) -> std::io::Result<()> {
    w.write_all(&OPTION_REPLY_MAGIC.to_be_bytes())?;
    w.write_all(&option.to_be_bytes())?;
    w.write_all(&reply.to_be_bytes())?;
    w.write_all(&(data.len() as u32).to_be_bytes())?;
    w.write_all(data)
}

/// The export's namespace and its NSID.
fn export<'s>(subsystem: &'s Subsystem, name: &[u8]) -> Option<(u32, &'s Namespace)> {
    let n = match name {
        b"" => 1,
        digits => std::str::from_utf8(digits).ok()?.parse().ok()?,
    };
    Some((n, subsystem.namespace(n)?))
}

fn size_of(ns: &Namespace) -> u64 {
    ns.block_count * ns.block_size_bytes as u64
}

/// The server's greeting and the client's flags: whether the client asked
/// for no zeroes after NBD_OPT_EXPORT_NAME's reply.
fn greet(io: &mut (impl Read + Write)) -> std::io::Result<bool> {
    io.write_all(&NBDMAGIC.to_be_bytes())?;
    io.write_all(&IHAVEOPT.to_be_bytes())?;
    io.write_all(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes())?;
    io.flush()?;
    let client_flags = read_u32(io)?;
    if client_flags & 1 == 0 {
        return Err(protocol("the client does not speak fixed newstyle"));
    }
    Ok(client_flags & 2 != 0)
}

/// Option haggling, until transmission, STARTTLS or the client's end.
fn handshake(
    io: &mut (impl Read + Write),
    subsystem: &Subsystem,
    tls: TlsState,
    no_zeroes: bool,
) -> std::io::Result<Haggled> {
    let mut structured = false;
    loop {
        if read_u64(io)? != IHAVEOPT {
            return Err(protocol("an option without IHAVEOPT"));
        }
        let option = read_u32(io)?;
        let len = read_u32(io)?;
        if len > MAX_OPTION_BYTES {
            return Err(protocol("option data past 64 KiB"));
        }
        let mut data = vec![0u8; len as usize];
        io.read_exact(&mut data)?;
        if tls.required && !tls.active && !matches!(option, opt::STARTTLS | opt::ABORT) {
            if option == opt::EXPORT_NAME {
                // No error reply exists for it: the connection ends.
                return Err(protocol(
                    "NBD_OPT_EXPORT_NAME before the TLS this node requires",
                ));
            }
            let why = b"this node requires TLS: send NBD_OPT_STARTTLS first";
            option_reply(io, option, rep::ERR_TLS_REQD, why)?;
            io.flush()?;
            continue;
        }
        match option {
            opt::STARTTLS => {
                let refusal: Option<(u32, &[u8])> = if !data.is_empty() {
                    Some((rep::ERR_INVALID, b"NBD_OPT_STARTTLS carries no data"))
                } else if tls.active {
                    Some((rep::ERR_INVALID, b"TLS is already on"))
                } else if !tls.offered {
                    Some((
                        rep::ERR_POLICY,
                        b"this node serves NBD without TLS (start it with a certificate)",
                    ))
                } else {
                    None
                };
                match refusal {
                    Some((code, why)) => option_reply(io, option, code, why)?,
                    None => {
                        option_reply(io, option, rep::ACK, &[])?;
                        io.flush()?;
                        return Ok(Haggled::StartTls);
                    }
                }
            }
            opt::EXPORT_NAME => {
                let Some((nsid, ns)) = export(subsystem, &data) else {
                    return Err(protocol("NBD_OPT_EXPORT_NAME of an export there is not"));
                };
                io.write_all(&size_of(ns).to_be_bytes())?;
                io.write_all(&TRANSMISSION_FLAGS.to_be_bytes())?;
                if !no_zeroes {
                    io.write_all(&[0u8; 124])?;
                }
                io.flush()?;
                return Ok(Haggled::Export(nsid, structured));
            }
            opt::ABORT => {
                option_reply(io, option, rep::ACK, &[])?;
                io.flush()?;
                return Ok(Haggled::Abort);
            }
            opt::LIST => {
                for n in 1..=subsystem.namespace_count() {
                    let name = n.to_string();
                    let mut d = (name.len() as u32).to_be_bytes().to_vec();
                    d.extend_from_slice(name.as_bytes());
                    option_reply(io, option, rep::SERVER, &d)?;
                }
                option_reply(io, option, rep::ACK, &[])?;
            }
            opt::STRUCTURED_REPLY => {
                structured = true;
                option_reply(io, option, rep::ACK, &[])?;
            }
            opt::INFO | opt::GO => {
                let name_len = data
                    .get(..4)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
                let Some(name) = name_len.and_then(|l| data.get(4..4 + l)) else {
                    option_reply(io, option, rep::ERR_INVALID, b"malformed NBD_OPT_GO")?;
                    io.flush()?;
                    continue;
                };
                let Some((nsid, ns)) = export(subsystem, name) else {
                    option_reply(io, option, rep::ERR_UNKNOWN, b"no such export")?;
                    io.flush()?;
                    continue;
                };
                let mut info = vec![0u8, 0];
                info.extend_from_slice(&size_of(ns).to_be_bytes());
                info.extend_from_slice(&TRANSMISSION_FLAGS.to_be_bytes());
                option_reply(io, option, rep::INFO, &info)?;
                // NBD_INFO_BLOCK_SIZE: any byte (unaligned requests are
                // served), 1 MiB preferred.
                let mut sizes = vec![0u8, 3];
                sizes.extend_from_slice(&1u32.to_be_bytes());
                sizes.extend_from_slice(&(1u32 << 20).max(ns.block_size_bytes).to_be_bytes());
                sizes.extend_from_slice(&MAX_REQUEST_BYTES.to_be_bytes());
                option_reply(io, option, rep::INFO, &sizes)?;
                option_reply(io, option, rep::ACK, &[])?;
                io.flush()?;
                if option == opt::GO {
                    return Ok(Haggled::Export(nsid, structured));
                }
            }
            _ => {
                option_reply(io, option, rep::ERR_UNSUP, b"option not supported")?;
            }
        }
        io.flush()?;
    }
}

/// A byte range's covering blocks: the first block and the bytes they span.
fn covering(ns: &Namespace, offset: u64, len: u64) -> (u64, u64) {
    let bs = ns.block_size_bytes as u64;
    let first = offset / bs;
    let end = (offset + len).div_ceil(bs);
    (first, (end - first) * bs)
}

/// Reads a byte range, block-aligned or not, in pieces of one transfer.
fn read_bytes(ns: &Namespace, offset: u64, out: &mut [u8]) -> Result<(), u32> {
    let bs = ns.block_size_bytes as u64;
    let piece = (MAX_TRANSFER_BYTES as u64 / bs).max(1) * bs;
    let mut done = 0u64;
    let mut scratch = Vec::new();
    while done < out.len() as u64 {
        let at = offset + done;
        let want = (out.len() as u64 - done).min(piece - at % bs);
        let (first, span) = covering(ns, at, want);
        let dst = &mut out[done as usize..(done + want) as usize];
        if at.is_multiple_of(bs) && want.is_multiple_of(bs) {
            ns.io.read(first, dst, Priority::High).map_err(|_| EIO)?;
        } else {
            scratch.resize(span as usize, 0);
            ns.io
                .read(first, &mut scratch, Priority::High)
                .map_err(|_| EIO)?;
            let skip = (at - first * bs) as usize;
            dst.copy_from_slice(&scratch[skip..skip + want as usize]);
        }
        done += want;
    }
    Ok(())
}

/// Writes a byte range; a range that does not cover whole blocks has its
/// first and last blocks read and written back around it, with no other
/// write to the namespace in between.
fn write_bytes(ns: &Namespace, offset: u64, data: &[u8]) -> Result<(), u32> {
    let bs = ns.block_size_bytes as u64;
    let aligned = offset.is_multiple_of(bs) && (data.len() as u64).is_multiple_of(bs);
    if aligned {
        let _writes = ns.shared_writes();
        let piece = (MAX_TRANSFER_BYTES as u64 / bs).max(1) * bs;
        for (i, chunk) in data.chunks(piece as usize).enumerate() {
            let lba = (offset + i as u64 * piece) / bs;
            ns.io.write(lba, chunk, Priority::High).map_err(|_| EIO)?;
        }
        return Ok(());
    }
    let (first, span) = covering(ns, offset, data.len() as u64);
    let _alone = ns.exclusive_writes();
    let mut buf = vec![0u8; span as usize];
    read_bytes(ns, first * bs, &mut buf)?;
    let skip = (offset - first * bs) as usize;
    buf[skip..skip + data.len()].copy_from_slice(data);
    for (i, chunk) in buf.chunks(MAX_TRANSFER_BYTES).enumerate() {
        let lba = first + (i * MAX_TRANSFER_BYTES) as u64 / bs;
        ns.io.write(lba, chunk, Priority::High).map_err(|_| EIO)?;
    }
    Ok(())
}

fn reply(
    w: &mut dyn Write,
    structured: bool,
    cookie: u64,
    error: u32,
    read: Option<(u64, &[u8])>,
) -> std::io::Result<()> {
    if !structured {
        w.write_all(&SIMPLE_REPLY_MAGIC.to_be_bytes())?;
        w.write_all(&error.to_be_bytes())?;
        w.write_all(&cookie.to_be_bytes())?;
        if let (0, Some((_, data))) = (error, read) {
            w.write_all(data)?;
        }
        return Ok(());
    }
    let chunk = |w: &mut dyn Write, kind: u16, payload: &[&[u8]]| -> std::io::Result<()> {
        let len: usize = payload.iter().map(|p| p.len()).sum();
        w.write_all(&STRUCTURED_REPLY_MAGIC.to_be_bytes())?;
        w.write_all(&1u16.to_be_bytes())?; // NBD_REPLY_FLAG_DONE
        w.write_all(&kind.to_be_bytes())?;
        w.write_all(&cookie.to_be_bytes())?;
        w.write_all(&(len as u32).to_be_bytes())?;
        payload.iter().try_for_each(|p| w.write_all(p))
    };
    match (error, read) {
        // NBD_REPLY_TYPE_ERROR: the error and an empty message.
        (e, _) if e != 0 => chunk(w, 0x8001, &[&e.to_be_bytes(), &0u16.to_be_bytes()]),
        // NBD_REPLY_TYPE_OFFSET_DATA: the offset, then the data.
        (_, Some((offset, data))) => chunk(w, 1, &[&offset.to_be_bytes(), data]),
        // NBD_REPLY_TYPE_NONE.
        _ => chunk(w, 0, &[]),
    }
}

/// Bytes of a request's header (magic, flags, type, cookie, offset,
/// length).
const REQUEST_HEADER_BYTES: usize = 28;
/// A write with this much of its data still to come when its header has
/// been read has the rest read straight into its pinned buffer.
const DIRECT_MIN_BYTES: usize = 16 << 10;
/// Whole requests after a direct write before reads take all the socket
/// holds again (until then a header's worth alone).
const HEADERS_FIRST_REQUESTS: usize = 8;

/// A write whose data is being read from the socket straight into the
/// pinned buffer it is written from.
struct DirectWrite {
    request: NbdRequest,
    io: crate::datapath::BlockIo,
    buf: IoBuf,
    /// Bytes of its data in `buf`.
    got: usize,
    /// Of them, copied from the receive buffer.
    copied: usize,
}

/// One request as received.
#[derive(Debug, Clone)]
struct NbdRequest {
    flags: u16,
    kind: u16,
    cookie: u64,
    offset: u64,
    len: u32,
}

impl NbdRequest {
    /// The request whose header starts `bytes` (at least
    /// [`REQUEST_HEADER_BYTES`] of them).
    fn parse(bytes: &[u8]) -> std::io::Result<NbdRequest> {
        let be = |range: std::ops::Range<usize>| {
            bytes[range].iter().fold(0u64, |v, &b| v << 8 | b as u64)
        };
        if be(0..4) as u32 != REQUEST_MAGIC {
            return Err(protocol("a request without the request magic"));
        }
        Ok(NbdRequest {
            flags: be(4..6) as u16,
            kind: be(6..8) as u16,
            cookie: be(8..16),
            offset: be(16..24),
            len: be(24..28) as u32,
        })
    }

    /// Bytes of data that follow the header.
    fn data_bytes(&self) -> usize {
        if self.kind == cmd::WRITE {
            self.len as usize
        } else {
            0
        }
    }
}

/// A request at the device: what its reply needs.
struct AtDevice {
    cookie: u64,
    offset: u64,
}

/// One client's transmission phase, on its connection's thread. Block-
/// aligned reads and writes of up to one transfer (without FUA) go to the
/// device as they arrive, on the connection's own engine, data in pinned
/// pool buffers both ways, and are answered as they complete (NBD replies
/// carry the request's cookie: any order). Every other request — a flush,
/// trim, write zeroes, FUA, unaligned or large request — runs on this
/// thread after the requests at the device, so it sees their effects.
struct Transmission {
    subsystem: Arc<Subsystem>,
    nsid: u32,
    structured: bool,
    /// A request must arrive whole within this of its first byte.
    request_timeout: std::time::Duration,
    data_path: DataPath,
    /// By the tag given to the data path; `None` slots are free.
    at_device: Vec<Option<AtDevice>>,
    free_tags: Vec<usize>,
    out: Outgoing,
    scratch: Vec<u8>,
}

impl Transmission {
    fn new(
        subsystem: Arc<Subsystem>,
        nsid: u32,
        structured: bool,
        request_timeout: std::time::Duration,
    ) -> Transmission {
        Transmission {
            request_timeout,
            data_path: DataPath::new(subsystem.clone()),
            subsystem,
            nsid,
            structured,
            at_device: Vec::new(),
            free_tags: Vec::new(),
            out: Outgoing::default(),
            scratch: Vec::new(),
        }
    }

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: chosen in the handshake"
    )]
    fn ns(&self) -> &Namespace {
        self.subsystem
            .namespace(self.nsid)
            .expect("chosen in the handshake")
    }

    /// Serves requests until the client disconnects; `early` holds bytes
    /// that came before this phase began.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: one piece, checked; present"
    )]
    fn run(mut self, mut link: impl Link, early: Vec<u8>) -> std::io::Result<()> {
        let mut buf = early;
        let (mut start, mut filled) = (0usize, buf.len());
        buf.resize(buf.len().max(256 << 10), 0);
        // A write whose data is being read straight into its pinned buffer.
        let mut direct: Option<DirectWrite> = None;
        // Requests handled whole since the last direct write; until there
        // are HEADERS_FIRST_REQUESTS of them, reads take a header alone.
        let mut whole_requests = HEADERS_FIRST_REQUESTS;
        // When the first byte of the request being received came.
        let mut request_since: Option<std::time::Instant> = None;
        let result = loop {
            if let Some(d) = &mut direct {
                // Its data first; nothing after it is looked at before.
                let dst = &mut d.buf.as_mut_slice().expect("one piece, checked")[d.got..];
                let got = if self.data_path.busy() {
                    match link.try_read(dst) {
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {
                            self.collect(true);
                            if let Err(e) = link.send(&mut self.out) {
                                break Err(e);
                            }
                            continue;
                        }
                        other => other,
                    }
                } else {
                    link.read(dst)
                };
                match got {
                    Ok(0) => break Ok(()),
                    Ok(n) => d.got += n,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) if timed_out(&e) => {
                        if let Some(late) = overdue(request_since, self.request_timeout) {
                            break Err(late);
                        }
                    }
                    Err(e) => break Err(e),
                }
                if d.got < d.buf.len() {
                    continue;
                }
                let d = direct.take().expect("present");
                self.subsystem
                    .count_write_data(d.buf.len() - d.copied, true);
                self.start_write(&d.request, &d.io, d.buf);
                whole_requests = 0;
                request_since = None;
            }
            // Every whole request already received.
            let mut need = REQUEST_HEADER_BYTES;
            let mut disconnect = false;
            // Small requests can ask for big replies: the replies made go
            // out once they pass MAX_UNSENT_BYTES, before more requests.
            let mut replies_first = false;
            while filled - start >= REQUEST_HEADER_BYTES {
                if self.out.pending_bytes() >= crate::target::MAX_UNSENT_BYTES {
                    replies_first = true;
                    break;
                }
                let request = match NbdRequest::parse(&buf[start..filled]) {
                    Ok(r) => r,
                    Err(e) => return self.end(&mut link, Err(e)),
                };
                if request.kind == cmd::WRITE && request.len > MAX_REQUEST_BYTES {
                    return self.end(&mut link, Err(protocol("a write past the request limit")));
                }
                let whole = REQUEST_HEADER_BYTES + request.data_bytes();
                if filled - start < whole {
                    need = whole;
                    let here = &buf[start + REQUEST_HEADER_BYTES..filled];
                    if whole - (filled - start) >= DIRECT_MIN_BYTES {
                        direct = self.begin_direct(&request, here);
                        if direct.is_some() {
                            start = filled;
                        }
                    }
                    break;
                }
                whole_requests = whole_requests.saturating_add(1);
                let data = &buf[start + REQUEST_HEADER_BYTES..start + whole];
                if request.kind == cmd::DISC {
                    // What was sent before it is finished; then the end.
                    disconnect = true;
                    break;
                }
                self.dispatch(&request, data);
                start += whole;
            }
            if disconnect {
                break Ok(());
            }
            self.collect(false);
            if let Err(e) = link.send(&mut self.out) {
                break Err(e);
            }
            if replies_first {
                continue;
            }
            // A request's clock starts at its first byte: one came whole
            // since, or none is begun, and the clock starts over.
            let consumed = start > 0;
            // Room for what comes next: the partial request to the front.
            buf.copy_within(start..filled, 0);
            filled -= start;
            start = 0;
            let begun = filled > 0 || direct.is_some();
            request_since = match (begun, consumed) {
                (false, _) => None,
                (true, true) => Some(std::time::Instant::now()),
                (true, false) => request_since.or_else(|| Some(std::time::Instant::now())),
            };
            if filled + need > buf.len() {
                buf.resize(filled + need, 0);
            }
            if direct.is_some() {
                continue;
            }
            // Lately a write's data came direct: read the next header
            // alone, so that the next write's data does too.
            let end = if whole_requests < HEADERS_FIRST_REQUESTS && filled < REQUEST_HEADER_BYTES {
                REQUEST_HEADER_BYTES
            } else {
                buf.len()
            };
            if self.data_path.busy() {
                // Requests at the device: take what the client sent since,
                // else wait for the device, not the client.
                match link.try_read(&mut buf[filled..end]) {
                    Ok(0) => break Ok(()),
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => self.collect(true),
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => break Err(e),
                }
                continue;
            }
            match link.read(&mut buf[filled..end]) {
                Ok(0) => break Ok(()),
                Ok(n) => filled += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if timed_out(&e) => {
                    if let Some(late) = overdue(request_since, self.request_timeout) {
                        break Err(late);
                    }
                }
                Err(e) => break Err(e),
            }
        };
        self.end(&mut link, result)
    }

    /// Finishes what is at the device and sends its replies (the client
    /// may still read them), then returns `result`.
    fn end(mut self, link: &mut impl Link, result: std::io::Result<()>) -> std::io::Result<()> {
        self.drain();
        let _ = link.send(&mut self.out);
        result
    }

    /// Starts `request` at the device, or runs it here.
    fn dispatch(&mut self, request: &NbdRequest, data: &[u8]) {
        if let Some(io) = self.block_io(request) {
            let tag = self.take_tag();
            let started = match request.kind {
                cmd::READ => self.data_path.start_read(tag as u64, &io),
                _ => match self.data_path.write_buffer(&io) {
                    Some(mut buf) => {
                        buf.write_at(0, data);
                        self.subsystem.count_write_data(data.len(), false);
                        self.data_path.start_write(tag as u64, &io, buf).is_ok()
                    }
                    None => false,
                },
            };
            if started {
                self.at_device[tag] = Some(AtDevice {
                    cookie: request.cookie,
                    offset: request.offset,
                });
                return;
            }
            self.free_tags.push(tag);
        }
        self.run_here(request, data);
    }

    /// A tag of the data path no request at the device holds.
    fn take_tag(&mut self) -> usize {
        self.free_tags.pop().unwrap_or_else(|| {
            self.at_device.push(None);
            self.at_device.len() - 1
        })
    }

    /// Runs `request` on this thread after the requests at the device, and
    /// replies.
    fn run_here(&mut self, request: &NbdRequest, data: &[u8]) {
        self.drain();
        let mut scratch = std::mem::take(&mut self.scratch);
        let error = run_request(self.ns(), request, data, &mut scratch);
        let read =
            (error == 0 && request.kind == cmd::READ).then_some((request.offset, &scratch[..]));
        let _ = reply(
            &mut self.out.bytes,
            self.structured,
            request.cookie,
            error,
            read,
        );
        self.scratch = scratch;
    }

    /// When `request` is a write the data path takes and its pinned buffer
    /// is one piece: the buffer, with the data bytes already here (`here`)
    /// in it, for the rest to be read straight into.
    fn begin_direct(&mut self, request: &NbdRequest, here: &[u8]) -> Option<DirectWrite> {
        if request.kind != cmd::WRITE {
            return None;
        }
        let io = self.block_io(request)?;
        let mut buf = self.data_path.write_buffer(&io)?;
        buf.as_slice()?;
        buf.write_at(0, here);
        self.subsystem.count_write_data(here.len(), false);
        Some(DirectWrite {
            request: request.clone(),
            io,
            buf,
            got: here.len(),
            copied: here.len(),
        })
    }

    /// Starts a write whose data is all in `buf` at the device, or runs it
    /// here when the device takes no more now.
    fn start_write(&mut self, request: &NbdRequest, io: &crate::datapath::BlockIo, buf: IoBuf) {
        let tag = self.take_tag();
        match self.data_path.start_write(tag as u64, io, buf) {
            Ok(()) => {
                self.at_device[tag] = Some(AtDevice {
                    cookie: request.cookie,
                    offset: request.offset,
                });
            }
            Err(buf) => {
                self.free_tags.push(tag);
                self.run_here(request, &buf.to_vec());
            }
        }
    }

    /// The blocks of a read or write the data path takes: whole blocks
    /// inside the export, one transfer at most, no FUA.
    fn block_io(&self, request: &NbdRequest) -> Option<crate::datapath::BlockIo> {
        let bs = self.ns().block_size_bytes as u64;
        let (offset, len) = (request.offset, request.len as u64);
        let plain = matches!(request.kind, cmd::READ | cmd::WRITE)
            && request.flags & CMD_FLAG_FUA == 0
            && offset.is_multiple_of(bs)
            && len.is_multiple_of(bs);
        if !plain {
            return None;
        }
        self.data_path.block_io(self.nsid, offset / bs, len / bs)
    }

    /// Issues what is queued at the device and replies to a group of what
    /// finished (with `wait`, waiting for the device first if nothing has).
    fn collect(&mut self, wait: bool) {
        let mut done = Vec::new();
        self.data_path.next_group(wait, &mut done);
        done.into_iter().for_each(|f| self.reply(f));
    }

    /// Waits for every request at the device and replies to them all.
    fn drain(&mut self) {
        let mut done = Vec::new();
        self.data_path.drain(&mut done);
        done.into_iter().for_each(|f| self.reply(f));
    }

    fn reply(&mut self, finished: Finished) {
        let (tag, read, ok) = match finished {
            Finished::Read { tag, buf } => (tag, Some(buf), true),
            Finished::Done { tag, ok, .. } => (tag, None, ok),
        };
        let Some(r) = self.at_device.get_mut(tag as usize).and_then(Option::take) else {
            log::error!("NBD: a completion for no request at the device (tag {tag})");
            return;
        };
        self.free_tags.push(tag as usize);
        match read {
            Some(buf) => {
                let out = &mut self.out.bytes;
                read_reply_header(out, self.structured, r.cookie, r.offset, buf.len());
                let at = out.len();
                self.out.insert(at, buf);
            }
            None => {
                let error = if ok { 0 } else { EIO };
                // Writing into memory cannot fail.
                let _ = reply(&mut self.out.bytes, self.structured, r.cookie, error, None);
            }
        }
    }
}

/// Everything of a successful read's reply before its data.
fn read_reply_header(out: &mut Vec<u8>, structured: bool, cookie: u64, offset: u64, len: usize) {
    if !structured {
        out.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(&cookie.to_be_bytes());
        return;
    }
    // NBD_REPLY_TYPE_OFFSET_DATA, done: the offset, then the data.
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&((8 + len) as u32).to_be_bytes());
    out.extend_from_slice(&offset.to_be_bytes());
}

/// Runs one request; a read's bytes are left in `buf`. Returns the NBD
/// error (0: success).
fn run_request(ns: &Namespace, request: &NbdRequest, data: &[u8], buf: &mut Vec<u8>) -> u32 {
    let (offset, len) = (request.offset, request.len);
    let in_range = offset
        .checked_add(len as u64)
        .is_some_and(|end| end <= size_of(ns));
    match request.kind {
        cmd::READ if len > MAX_REQUEST_BYTES => EINVAL,
        cmd::READ | cmd::WRITE | cmd::TRIM | cmd::WRITE_ZEROES if !in_range => ENOSPC,
        cmd::READ => {
            buf.resize(len as usize, 0);
            read_bytes(ns, offset, buf).err().unwrap_or(0)
        }
        cmd::WRITE => write_bytes(ns, offset, data)
            .and_then(|()| {
                if request.flags & CMD_FLAG_FUA != 0 {
                    ns.io.flush(Priority::High).map_err(|_| EIO)
                } else {
                    Ok(())
                }
            })
            .err()
            .unwrap_or(0),
        cmd::FLUSH => ns.io.flush(Priority::High).err().map_or(0, |_| EIO),
        // Trimmed bytes read as zeros, as Write Zeroes leaves them.
        cmd::TRIM | cmd::WRITE_ZEROES => zero_bytes(ns, offset, len as u64).err().unwrap_or(0),
        _ => ENOTSUP,
    }
}

fn zero_bytes(ns: &Namespace, offset: u64, len: u64) -> Result<(), u32> {
    let zeros = vec![0u8; MAX_TRANSFER_BYTES.min(len as usize)];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(zeros.len() as u64);
        write_bytes(ns, offset + done, &zeros[..n as usize])?;
        done += n;
    }
    Ok(())
}

/// The NBD server's decoders without a socket, for the fuzz targets in
/// fuzz/ (feature `fuzzing`).
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    use super::*;

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

    /// A request as the transmission phase runs it on its own thread.
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
        subsystem.namespace(nsid).map(size_of)
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
