//! Requests and replies on the wire, and the requests that run the slow
//! way (on a worker's helper thread): flush, trim, write zeroes, FUA,
//! unaligned and large reads and writes.

use super::{
    cmd, export_size_bytes, protocol, CMD_FLAG_FUA, EINVAL, EIO, ENOSPC, ENOTSUP,
    MAX_REQUEST_BYTES, REQUEST_MAGIC, SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC,
};
use crate::controller::{Namespace, MAX_TRANSFER_BYTES};
use sluice_io::Priority;
use std::io::Write;

/// A byte range's covering blocks: the first block and the bytes they span.
pub(super) fn covering(ns: &Namespace, offset: u64, len: u64) -> (u64, u64) {
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

pub(super) fn reply(
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

/// One request as received.
#[derive(Debug, Clone)]
pub(super) struct NbdRequest {
    pub(super) flags: u16,
    pub(super) kind: u16,
    pub(super) cookie: u64,
    pub(super) offset: u64,
    pub(super) len: u32,
}

impl NbdRequest {
    /// The request whose header starts `bytes` (at least
    /// [`REQUEST_HEADER_BYTES`] of them).
    pub(super) fn parse(bytes: &[u8]) -> std::io::Result<NbdRequest> {
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
    pub(super) fn data_bytes(&self) -> usize {
        if self.kind == cmd::WRITE {
            self.len as usize
        } else {
            0
        }
    }
}

/// Everything of a successful read's reply before its data.
pub(super) fn read_reply_header(
    out: &mut Vec<u8>,
    structured: bool,
    cookie: u64,
    offset: u64,
    len: usize,
) {
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
pub(super) fn run_request(
    ns: &Namespace,
    request: &NbdRequest,
    data: &[u8],
    buf: &mut Vec<u8>,
) -> u32 {
    let (offset, len) = (request.offset, request.len);
    let in_range = offset
        .checked_add(len as u64)
        .is_some_and(|end| end <= export_size_bytes(ns));
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
