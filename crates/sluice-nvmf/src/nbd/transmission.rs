//! The transmission phase: requests read off the socket, whole-block
//! reads and writes kept in flight at the device, replies as they finish.

use super::requests::{read_reply_header, reply, run_request, NbdRequest};
use super::{cmd, protocol, CMD_FLAG_FUA, EIO, MAX_REQUEST_BYTES};
use crate::controller::{Namespace, Subsystem};
use crate::datapath::{DataPath, Finished, Outgoing};
use crate::link::Link;
use sluice_io::IoBuf;
use std::io::ErrorKind;
use std::sync::Arc;

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

/// Bytes of a request's header (magic, flags, type, cookie, offset,
/// length).
pub(super) const REQUEST_HEADER_BYTES: usize = 28;
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
pub(super) struct Transmission {
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
    pub(super) fn new(
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
    pub(super) fn run(mut self, mut link: impl Link, early: Vec<u8>) -> std::io::Result<()> {
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

/// Whether a read ended because its wait ran out.
fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}
