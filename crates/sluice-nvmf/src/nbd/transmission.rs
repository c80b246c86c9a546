//! The transmission phase, served by the node's workers: requests taken off
//! the socket as they come, whole-block reads and writes kept in flight at
//! the device, replies as they finish; every other request waits for the
//! worker (its helper thread runs it after the requests at the device).

use super::requests::{read_reply_header, reply, run_request, NbdRequest};
use super::{cmd, CMD_FLAG_FUA, EIO, MAX_REQUEST_BYTES};
use crate::connection::{MAX_UNSENT_BYTES, SEND_TIMEOUT};
use crate::controller::{Namespace, Subsystem};
use crate::datapath::{BlockIo, DataPath, Finished, Outgoing};
use crate::session::Session;
use crate::wire::Wire;
use sluice_io::IoBuf;
use std::collections::VecDeque;
use std::io::ErrorKind;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of a request's header (magic, flags, type, cookie, offset,
/// length).
pub(super) const REQUEST_HEADER_BYTES: usize = 28;
/// A write with this much of its data still to come when its header has
/// been read has the rest read straight into its pinned buffer.
const DIRECT_MIN_BYTES: usize = 16 << 10;
/// Whole requests after a direct write before reads take all the socket
/// holds again (until then a header's worth alone).
const HEADERS_FIRST_REQUESTS: usize = 8;
/// Bytes one turn reads at most, so that one busy client does not hold up
/// the worker's others.
const TURN_READ_BYTES: usize = 1 << 20;
/// The receive buffer's size between big requests.
const RECEIVE_BUFFER_BYTES: usize = 256 << 10;
/// How long a client may take to close its end once the session has ended
/// (a TLS client reads the node's close_notify first).
const FINISH_TIMEOUT: Duration = Duration::from_secs(1);

/// What a worker needs to serve a client whose handshake is done.
pub(super) struct NbdStart {
    pub(super) nsid: u32,
    pub(super) structured: bool,
    /// A request must arrive whole within this of its first byte.
    pub(super) request_timeout: Duration,
    /// Requests the client sent right after its last option.
    pub(super) early: Vec<u8>,
}

/// A write whose data is being read from the socket straight into the
/// pinned buffer it is written from.
struct DirectWrite {
    request: NbdRequest,
    io: BlockIo,
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

/// One client's transmission phase, a non-blocking turn at a time on a
/// worker. Block-aligned reads and writes of up to one transfer (without
/// FUA) go to the device as they arrive, on the worker's own engines, data
/// in pinned pool buffers both ways, and are answered as they complete
/// (NBD replies carry the request's cookie: any order). Every other
/// request — a flush, trim, write zeroes, FUA, unaligned or large request —
/// waits, with the requests after it, for [`NbdSession::run_deferred`],
/// which runs it after the requests at the device, so it sees their effects.
pub(super) struct NbdSession {
    subsystem: Arc<Subsystem>,
    nsid: u32,
    structured: bool,
    request_timeout: Duration,
    data_path: DataPath,
    /// By the tag given to the data path; `None` slots are free.
    at_device: Vec<Option<AtDevice>>,
    free_tags: Vec<usize>,
    out: Outgoing,
    scratch: Vec<u8>,
    /// Received bytes: requests from `start` to `filled`.
    buf: Vec<u8>,
    start: usize,
    filled: usize,
    /// Bytes the request begun at `start` needs whole.
    need: usize,
    /// A write whose data is being read straight into its pinned buffer;
    /// nothing after it is looked at before it is all here.
    direct: Option<DirectWrite>,
    /// Requests handled whole since the last direct write; until there are
    /// [`HEADERS_FIRST_REQUESTS`] of them, reads take a header alone.
    whole_requests: usize,
    /// When the first byte of the request being received came.
    request_since: Option<Instant>,
    /// Since when replies have waited for the client to take them.
    unsent_since: Option<Instant>,
    /// Requests that run the slow way, in order; none after them is taken
    /// before they ran.
    deferred: VecDeque<(NbdRequest, Vec<u8>)>,
    /// Whole requests received and not taken yet: a turn is due without
    /// new bytes.
    held: bool,
    /// The client said goodbye (NBD_CMD_DISC) or closed: what it sent
    /// before is finished and answered, then the session ends.
    ending: bool,
    /// Since when the session's end has waited for the client's close.
    finishing_since: Option<Instant>,
}

impl NbdSession {
    /// A session on the calling worker, its engines signalling completions
    /// to `completions` (the worker's eventfd).
    pub(super) fn new(
        subsystem: Arc<Subsystem>,
        start: NbdStart,
        completions: std::os::fd::RawFd,
    ) -> NbdSession {
        // Zeroed by the allocator: pages an idle client never fills are
        // never touched (resident memory grows with what clients send).
        let filled = start.early.len();
        let mut buf = vec![0u8; filled.max(RECEIVE_BUFFER_BYTES)];
        buf[..filled].copy_from_slice(&start.early);
        NbdSession {
            data_path: DataPath::signalling(subsystem.clone(), Some(completions)),
            subsystem,
            nsid: start.nsid,
            structured: start.structured,
            request_timeout: start.request_timeout,
            at_device: Vec::new(),
            free_tags: Vec::new(),
            out: Outgoing::default(),
            scratch: Vec::new(),
            buf,
            start: 0,
            filled,
            need: REQUEST_HEADER_BYTES,
            direct: None,
            whole_requests: HEADERS_FIRST_REQUESTS,
            request_since: (filled > 0).then(Instant::now),
            unsent_since: None,
            deferred: VecDeque::new(),
            held: filled > 0,
            ending: false,
            finishing_since: None,
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

    /// Sends what is still unsent (as far as the socket takes it now) and
    /// says why the session ends.
    fn fail(&mut self, wire: &mut Wire, why: String) -> Result<(), String> {
        let _ = wire.send_some(&mut self.out);
        Err(why)
    }

    /// One read from the socket: into a direct write's buffer, else into
    /// the receive buffer. Returns the bytes read (0: none now) and whether
    /// they were all the socket held; a client that closed ends the
    /// session.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: one piece, checked"
    )]
    fn receive(&mut self, wire: &mut Wire) -> Result<(usize, bool), String> {
        let into = match &mut self.direct {
            Some(d) => &mut d.buf.as_mut_slice().expect("one piece, checked")[d.got..],
            None => {
                // Lately a write's data came direct: read the next header
                // alone, so that the next write's data does too.
                let end = if self.whole_requests < HEADERS_FIRST_REQUESTS
                    && self.filled < REQUEST_HEADER_BYTES
                {
                    REQUEST_HEADER_BYTES
                } else {
                    self.buf.len()
                };
                &mut self.buf[self.filled..end]
            }
        };
        let room = into.len();
        if room == 0 {
            // Nothing to read into (a read of none would look like the
            // client's close): the requests held take their turn first.
            return Ok((0, true));
        }
        let n = loop {
            match wire.recv(into) {
                Ok(n) => break n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok((0, true)),
                Err(e) => return Err(format!("receiving: {e}")),
            }
        };
        if n == 0 {
            self.ending = true;
            return Ok((0, true));
        }
        let drained = n < room && wire.short_read_drains();
        match &mut self.direct {
            Some(d) => d.got += n,
            None => self.filled += n,
        }
        if self.request_since.is_none() {
            self.request_since = Some(Instant::now());
        }
        Ok((n, drained))
    }

    /// Starts or defers every whole request received (a direct write whose
    /// data is all here first), until one waits for the worker or replies
    /// pass [`MAX_UNSENT_BYTES`]; the partial request goes to the front of
    /// the buffer.
    fn take_requests(&mut self) -> Result<bool, String> {
        let mut progressed = self.finish_direct();
        self.need = REQUEST_HEADER_BYTES;
        self.held = false;
        let buf = std::mem::take(&mut self.buf);
        let mut result = Ok(());
        while self.direct.is_none()
            && !self.ending
            && self.filled - self.start >= REQUEST_HEADER_BYTES
        {
            // Small requests can ask for big replies: the replies made go
            // out once they pass MAX_UNSENT_BYTES, before more requests.
            if !self.deferred.is_empty() || self.out.pending_bytes() >= MAX_UNSENT_BYTES {
                self.held = true;
                break;
            }
            match self.take_one(&buf) {
                Ok(took) => progressed |= took,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
            if self.need > REQUEST_HEADER_BYTES {
                break;
            }
        }
        self.buf = buf;
        result?;
        self.make_room();
        Ok(progressed)
    }

    /// Takes the request at `start`: starts or defers it when whole (the
    /// end of the session when it is NBD_CMD_DISC), else says what it needs
    /// (`need`) and, for a big write, begins reading its data direct.
    fn take_one(&mut self, buf: &[u8]) -> Result<bool, String> {
        let request =
            NbdRequest::parse(&buf[self.start..self.filled]).map_err(|e| e.to_string())?;
        if request.kind == cmd::WRITE && request.len > MAX_REQUEST_BYTES {
            return Err("a write past the request limit".into());
        }
        let whole = REQUEST_HEADER_BYTES + request.data_bytes();
        let have = self.filled - self.start;
        if have < whole {
            self.need = whole;
            if whole - have < DIRECT_MIN_BYTES {
                return Ok(false);
            }
            let here = &buf[self.start + REQUEST_HEADER_BYTES..self.filled];
            self.direct = self.begin_direct(&request, here);
            if self.direct.is_none() {
                return Ok(false);
            }
            self.start = self.filled;
            return Ok(true);
        }
        self.whole_requests = self.whole_requests.saturating_add(1);
        let data = &buf[self.start + REQUEST_HEADER_BYTES..self.start + whole];
        self.start += whole;
        // A request's clock starts at its first byte: one came whole since.
        self.request_since = Some(Instant::now());
        if request.kind == cmd::DISC {
            // What was sent before it is finished; then the end.
            self.ending = true;
        } else {
            self.dispatch(&request, data);
        }
        Ok(true)
    }

    /// A direct write whose data is all here goes to the device.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: present"
    )]
    fn finish_direct(&mut self) -> bool {
        if self.direct.as_ref().is_none_or(|d| d.got < d.buf.len()) {
            return false;
        }
        let d = self.direct.take().expect("present");
        self.subsystem
            .count_write_data(d.buf.len() - d.copied, true);
        self.start_write(&d.request, &d.io, d.buf);
        self.whole_requests = 0;
        self.request_since = None;
        true
    }

    /// The partial request to the front of the buffer, the buffer as big
    /// as it needs; its clock stops when nothing is begun.
    fn make_room(&mut self) {
        self.buf.copy_within(self.start..self.filled, 0);
        self.filled -= self.start;
        self.start = 0;
        if self.filled == 0 && self.direct.is_none() {
            self.request_since = None;
        }
        let want = (self.filled + self.need).max(RECEIVE_BUFFER_BYTES);
        if want > self.buf.len() {
            self.buf.resize(want, 0);
        } else if want == RECEIVE_BUFFER_BYTES && self.buf.len() > RECEIVE_BUFFER_BYTES {
            // A big request's room goes back once it has gone.
            self.buf.truncate(RECEIVE_BUFFER_BYTES);
            self.buf.shrink_to_fit();
        }
    }

    /// Sends what the socket takes now; says whether any went.
    fn send(&mut self, wire: &mut Wire) -> Result<bool, String> {
        if self.out.pending_bytes() == 0 && !wire.has_unsent() {
            return Ok(false);
        }
        let before = self.out.pending_bytes();
        let all = wire
            .send_some(&mut self.out)
            .map_err(|e| format!("sending: {e}"))?;
        self.unsent_since = if all {
            None
        } else {
            self.unsent_since.or(Some(Instant::now()))
        };
        Ok(self.out.pending_bytes() != before)
    }

    /// Once everything before the end is answered and sent: the wire's
    /// goodbye, then `Err(Ok(()))` when the socket may close.
    fn finish(&mut self, wire: &mut Wire) -> Result<(), Result<(), String>> {
        let done = !self.data_path.busy()
            && self.deferred.is_empty()
            && self.out.pending_bytes() == 0
            && !wire.has_unsent();
        if !done {
            return Ok(());
        }
        self.finishing_since.get_or_insert_with(Instant::now);
        match wire.finish() {
            Ok(false) => Ok(()),
            Ok(true) | Err(_) => Err(Ok(())),
        }
    }

    /// Starts `request` at the device, or defers it.
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
        self.deferred.push_back((request.clone(), data.to_vec()));
    }

    /// A tag of the data path no request at the device holds.
    fn take_tag(&mut self) -> usize {
        self.free_tags.pop().unwrap_or_else(|| {
            self.at_device.push(None);
            self.at_device.len() - 1
        })
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

    /// Starts a write whose data is all in `buf` at the device, or defers
    /// it when the device takes no more now.
    fn start_write(&mut self, request: &NbdRequest, io: &BlockIo, buf: IoBuf) {
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
                self.deferred.push_back((request.clone(), buf.to_vec()));
            }
        }
    }

    /// The blocks of a read or write the data path takes: whole blocks
    /// inside the export, one transfer at most, no FUA.
    fn block_io(&self, request: &NbdRequest) -> Option<BlockIo> {
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

impl Session for NbdSession {
    /// Whether completions of its device I/O are signalled to the worker.
    fn signals_completions(&self) -> bool {
        self.data_path.signals_completions()
    }

    /// Requests at the device (or finished, not yet answered).
    fn busy_at_device(&self) -> bool {
        self.data_path.busy()
    }

    /// Replies still to send.
    fn has_unsent(&self) -> bool {
        self.out.pending_bytes() > 0
    }

    /// Whole requests wait for a turn.
    fn held(&self) -> bool {
        self.held
    }

    /// The worker's helper runs them: each may take long (a flush) or wait
    /// on the namespace's write gate.
    fn runs_on_worker(&self) -> bool {
        false
    }

    /// The handshake was done before the client came to the worker.
    fn is_connected(&self) -> bool {
        true
    }

    fn initialized(&self) -> bool {
        true
    }

    /// Requests waiting for [`NbdSession::run_deferred`].
    fn has_deferred(&self) -> bool {
        !self.deferred.is_empty()
    }

    /// Waits for the device to finish at least one request and answers
    /// what finished.
    fn wait_for_device(&mut self) {
        self.collect(true);
    }

    /// Reaps every request at the device and answers them.
    fn drain_device(&mut self) {
        if self.data_path.busy() {
            self.drain();
        }
    }

    /// Runs the waiting requests, in order, after the requests at the
    /// device, and queues their replies.
    fn run_deferred(&mut self) {
        self.drain_device();
        let mut scratch = std::mem::take(&mut self.scratch);
        while let Some((request, data)) = self.deferred.pop_front() {
            let error = run_request(self.ns(), &request, &data, &mut scratch);
            let read =
                (error == 0 && request.kind == cmd::READ).then_some((request.offset, &scratch[..]));
            // Writing into memory cannot fail.
            let _ = reply(
                &mut self.out.bytes,
                self.structured,
                request.cookie,
                error,
                read,
            );
        }
        self.scratch = scratch;
    }

    /// Why the session must end now, if it must: a request begun and not
    /// whole in time, replies the client has not taken, or a client that
    /// does not close once the session has ended.
    fn expired(&self) -> Option<String> {
        if let Some(t) = self.request_since {
            if !self.ending && t.elapsed() > self.request_timeout {
                return Some(format!(
                    "a request did not arrive whole within {} ms",
                    self.request_timeout.as_millis()
                ));
            }
        }
        if self
            .unsent_since
            .is_some_and(|t| t.elapsed() > SEND_TIMEOUT)
        {
            return Some(format!(
                "the client took no reply for {} s",
                SEND_TIMEOUT.as_secs()
            ));
        }
        if self
            .finishing_since
            .is_some_and(|t| t.elapsed() > FINISH_TIMEOUT)
        {
            return Some(format!(
                "the client did not close within {} ms of the end",
                FINISH_TIMEOUT.as_millis()
            ));
        }
        None
    }

    /// Ends the session: what is at the device finishes first.
    fn close(mut self: Box<Self>) {
        let mut unsent = Vec::new();
        self.data_path.drain(&mut unsent);
    }

    /// One non-blocking turn: takes what the client sent, starts or defers
    /// every whole request, answers what the device finished and sends what
    /// the socket takes. Returns whether anything happened; `Err` ends the
    /// session (`Ok` inside: the client left).
    fn turn(&mut self, wire: &mut Wire) -> Result<bool, Result<(), String>> {
        let mut progressed = false;
        let mut got = 0;
        loop {
            progressed |= self.take_requests().map_err(|e| self.fail(wire, e))?;
            if self.ending
                || self.held
                || got >= TURN_READ_BYTES
                || self.out.pending_bytes() >= MAX_UNSENT_BYTES
            {
                break;
            }
            match self.receive(wire) {
                Ok((0, _)) => break,
                Ok((n, drained)) => {
                    got += n;
                    progressed = true;
                    if drained {
                        // The socket held no more: what came is taken,
                        // and asking again would only hear EAGAIN.
                        progressed |= self.take_requests().map_err(|e| self.fail(wire, e))?;
                        break;
                    }
                }
                Err(e) => return Err(Err(e)),
            }
        }
        let answered = self.out.pending_bytes();
        self.collect(false);
        progressed |= self.out.pending_bytes() != answered;
        match self.send(wire) {
            Ok(sent) => progressed |= sent,
            Err(_) if self.ending => return Err(Ok(())),
            Err(e) => return Err(Err(e)),
        }
        if self.ending {
            return self.finish(wire).map(|()| progressed);
        }
        Ok(progressed)
    }
}
