//! NBD, the node's second front end over the same namespaces: the fixed
//! newstyle handshake (NBD_OPT_GO/INFO/EXPORT_NAME/LIST/STRUCTURED_REPLY),
//! then read, write, flush, trim and write zeroes, with structured replies
//! when the client asks for them (docs/NVMF.md, "NBD"). Export "" and "1"
//! are namespace 1, "N" namespace N.
//!
//! One thread per connection. Requests at byte offsets the device's blocks
//! do not align with are served by reading the covering blocks (and, for
//! writes, writing them back under the namespace's write gate held alone, so
//! no other write lands in between).

use crate::controller::{Namespace, Subsystem, MAX_TRANSFER_BYTES};
use sluice_io::Priority;
use std::io::{BufReader, BufWriter, ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
    pub const INFO: u32 = 6;
    pub const GO: u32 = 7;
    pub const STRUCTURED_REPLY: u32 = 8;
}

mod rep {
    pub const ACK: u32 = 1;
    pub const SERVER: u32 = 2;
    pub const INFO: u32 = 3;
    pub const ERR_UNSUP: u32 = 0x8000_0001;
    pub const ERR_INVALID: u32 = 0x8000_0003;
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

/// Accepts NBD clients on `listener` until `stop` is set, at most
/// `max_connections` at once, each on a thread of its own.
pub fn serve(
    listener: TcpListener,
    subsystem: Arc<Subsystem>,
    max_connections: usize,
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    crate::target::accept_loop(listener, max_connections, stop, "nbd-conn", move |stream| {
        serve_client(stream, &subsystem)
    })
}

/// How long a client may take over its handshake.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

fn serve_client(stream: TcpStream, subsystem: &Subsystem) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    // A client that never finishes its handshake does not hold a thread.
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let mut reader = BufReader::with_capacity(
        256 << 10,
        crate::poll::PolledStream::new(stream.try_clone()?),
    );
    let mut writer = BufWriter::with_capacity(256 << 10, stream);
    let Some((ns, structured)) = handshake(&mut reader, &mut writer, subsystem)? else {
        return Ok(());
    };
    reader.get_ref().get_ref().set_read_timeout(None)?;
    transmission(&mut reader, &mut writer, ns, structured)
}

fn read_u16(r: &mut impl Read) -> std::io::Result<u16> {
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
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

/// The namespace an export name names.
fn export<'s>(subsystem: &'s Subsystem, name: &[u8]) -> Option<&'s Namespace> {
    let n = match name {
        b"" => 1,
        digits => std::str::from_utf8(digits).ok()?.parse().ok()?,
    };
    subsystem.namespace(n)
}

fn size_of(ns: &Namespace) -> u64 {
    ns.block_count * ns.block_size_bytes as u64
}

/// Option haggling; the namespace chosen and whether replies are
/// structured, or None when the client ended it.
fn handshake<'s>(
    r: &mut impl Read,
    w: &mut impl Write,
    subsystem: &'s Subsystem,
) -> std::io::Result<Option<(&'s Namespace, bool)>> {
    w.write_all(&NBDMAGIC.to_be_bytes())?;
    w.write_all(&IHAVEOPT.to_be_bytes())?;
    w.write_all(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes())?;
    w.flush()?;
    let client_flags = read_u32(r)?;
    if client_flags & 1 == 0 {
        return Err(protocol("the client does not speak fixed newstyle"));
    }
    let no_zeroes = client_flags & 2 != 0;
    let mut structured = false;
    loop {
        if read_u64(r)? != IHAVEOPT {
            return Err(protocol("an option without IHAVEOPT"));
        }
        let option = read_u32(r)?;
        let len = read_u32(r)?;
        if len > MAX_OPTION_BYTES {
            return Err(protocol("option data past 64 KiB"));
        }
        let mut data = vec![0u8; len as usize];
        r.read_exact(&mut data)?;
        match option {
            opt::EXPORT_NAME => {
                let Some(ns) = export(subsystem, &data) else {
                    return Err(protocol("NBD_OPT_EXPORT_NAME of an export there is not"));
                };
                w.write_all(&size_of(ns).to_be_bytes())?;
                w.write_all(&TRANSMISSION_FLAGS.to_be_bytes())?;
                if !no_zeroes {
                    w.write_all(&[0u8; 124])?;
                }
                w.flush()?;
                return Ok(Some((ns, structured)));
            }
            opt::ABORT => {
                option_reply(w, option, rep::ACK, &[])?;
                w.flush()?;
                return Ok(None);
            }
            opt::LIST => {
                for n in 1..=subsystem.namespace_count() {
                    let name = n.to_string();
                    let mut d = (name.len() as u32).to_be_bytes().to_vec();
                    d.extend_from_slice(name.as_bytes());
                    option_reply(w, option, rep::SERVER, &d)?;
                }
                option_reply(w, option, rep::ACK, &[])?;
            }
            opt::STRUCTURED_REPLY => {
                structured = true;
                option_reply(w, option, rep::ACK, &[])?;
            }
            opt::INFO | opt::GO => {
                let name_len = data
                    .get(..4)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
                let Some(name) = name_len.and_then(|l| data.get(4..4 + l)) else {
                    option_reply(w, option, rep::ERR_INVALID, b"malformed NBD_OPT_GO")?;
                    w.flush()?;
                    continue;
                };
                let Some(ns) = export(subsystem, name) else {
                    option_reply(w, option, rep::ERR_UNKNOWN, b"no such export")?;
                    w.flush()?;
                    continue;
                };
                let mut info = vec![0u8, 0];
                info.extend_from_slice(&size_of(ns).to_be_bytes());
                info.extend_from_slice(&TRANSMISSION_FLAGS.to_be_bytes());
                option_reply(w, option, rep::INFO, &info)?;
                // NBD_INFO_BLOCK_SIZE: any byte (unaligned requests are
                // served), 1 MiB preferred.
                let mut sizes = vec![0u8, 3];
                sizes.extend_from_slice(&1u32.to_be_bytes());
                sizes.extend_from_slice(&(1u32 << 20).max(ns.block_size_bytes).to_be_bytes());
                sizes.extend_from_slice(&MAX_REQUEST_BYTES.to_be_bytes());
                option_reply(w, option, rep::INFO, &sizes)?;
                option_reply(w, option, rep::ACK, &[])?;
                w.flush()?;
                if option == opt::GO {
                    return Ok(Some((ns, structured)));
                }
            }
            _ => {
                option_reply(w, option, rep::ERR_UNSUP, b"option not supported")?;
            }
        }
        w.flush()?;
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

/// Requests of one connection run on this many threads at once (NBD
/// replies carry the request's cookie, so they may come back in any order).
pub const WORKERS_PER_CONNECTION: usize = 8;
/// Most requests of one connection received and not yet answered.
pub const MAX_REQUESTS_IN_FLIGHT: usize = 64;

/// One request as received.
struct NbdRequest {
    flags: u16,
    kind: u16,
    cookie: u64,
    offset: u64,
    len: u32,
    data: Vec<u8>,
}

/// Reads requests and runs them until the client disconnects. A request
/// that arrives with nothing else in flight or waiting in the read buffer
/// (a client at queue depth 1) runs on the reading thread, answered at
/// once; the others go to the connection's workers, which run them against
/// the namespace at the same time. Replies go out one at a time on the
/// shared writer.
fn transmission<W: Write + Send, R: Read>(
    r: &mut BufReader<R>,
    w: &mut W,
    ns: &Namespace,
    structured: bool,
) -> std::io::Result<()> {
    let conn = Replies {
        writer: std::sync::Mutex::new(w),
        failed: AtomicBool::new(false),
        in_flight: AtomicUsize::new(0),
        ns,
        structured,
    };
    let (tx, rx) = crossbeam_channel::bounded::<NbdRequest>(MAX_REQUESTS_IN_FLIGHT);
    std::thread::scope(|scope| {
        for _ in 0..WORKERS_PER_CONNECTION {
            let (rx, conn) = (rx.clone(), &conn);
            scope.spawn(move || {
                let mut buf = Vec::new();
                for request in rx.iter() {
                    let answered = conn.answer(&request, &mut buf);
                    conn.in_flight.fetch_sub(1, Ordering::AcqRel);
                    if answered.is_err() {
                        return;
                    }
                }
            });
        }
        drop(rx);
        let outcome = receive_requests(r, &tx, &conn);
        drop(tx);
        outcome
    })
}

/// What the threads of one connection share to answer its requests.
struct Replies<'w, 'n, W: Write> {
    writer: std::sync::Mutex<&'w mut W>,
    /// A reply could not be sent: the connection is over.
    failed: AtomicBool,
    /// Requests handed to the workers and not yet answered.
    in_flight: AtomicUsize,
    ns: &'n Namespace,
    structured: bool,
}

impl<W: Write> Replies<'_, '_, W> {
    /// Runs `request` and sends its reply; `buf` holds a read's bytes.
    fn answer(&self, request: &NbdRequest, buf: &mut Vec<u8>) -> std::io::Result<()> {
        let answer = run_request(self.ns, request, buf);
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let read = (answer == 0 && request.kind == cmd::READ).then_some((request.offset, &buf[..]));
        let sent =
            reply(&mut **w, self.structured, request.cookie, answer, read).and_then(|()| w.flush());
        if sent.is_err() {
            self.failed.store(true, Ordering::Relaxed);
        }
        sent
    }
}

fn receive_requests<R: Read, W: Write>(
    r: &mut BufReader<R>,
    tx: &crossbeam_channel::Sender<NbdRequest>,
    conn: &Replies<'_, '_, W>,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    loop {
        if conn.failed.load(Ordering::Relaxed) {
            return Err(protocol("sending a reply failed"));
        }
        let magic = match read_u32(r) {
            Ok(m) => m,
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        if magic != REQUEST_MAGIC {
            return Err(protocol("a request without the request magic"));
        }
        let flags = read_u16(r)?;
        let kind = read_u16(r)?;
        let cookie = read_u64(r)?;
        let offset = read_u64(r)?;
        let len = read_u32(r)?;
        let mut data = Vec::new();
        if kind == cmd::WRITE {
            if len > MAX_REQUEST_BYTES {
                return Err(protocol("a write past the request limit"));
            }
            data.resize(len as usize, 0);
            r.read_exact(&mut data)?;
        }
        if kind == cmd::DISC {
            // The workers finish what was sent before it; then the end.
            return Ok(());
        }
        let request = NbdRequest {
            flags,
            kind,
            cookie,
            offset,
            len,
            data,
        };
        if conn.in_flight.load(Ordering::Acquire) == 0 && r.buffer().is_empty() {
            // Alone: no hand-over to a worker (a wake-up) on its way.
            conn.answer(&request, &mut buf)?;
            continue;
        }
        conn.in_flight.fetch_add(1, Ordering::AcqRel);
        if tx.send(request).is_err() {
            return Err(protocol("the connection's workers stopped"));
        }
    }
}

/// Runs one request; a read's bytes are left in `buf`. Returns the NBD
/// error (0: success).
fn run_request(ns: &Namespace, request: &NbdRequest, buf: &mut Vec<u8>) -> u32 {
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
        cmd::WRITE => write_bytes(ns, offset, &request.data)
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
