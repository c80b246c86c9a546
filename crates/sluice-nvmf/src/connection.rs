//! One NVMe/TCP connection of the target: its PDUs framed from the
//! socket, command data moved (in-capsule, or asked for with R2T and
//! received in H2CData straight into pinned buffers where it can be; read
//! data out in C2HData), each command handed to its queue. Served a
//! non-blocking `Connection::turn` at a time by a worker, or blocking on
//! its socket on a thread of its own (TLS: `Connection::run`).

use crate::command::{status, Completion, SglKind, Sqe};
use crate::controller::{DataNeed, Outcome, Queue, MAX_TRANSFER_BYTES};
use crate::datapath::{DataPath, Finished, Outgoing};
use crate::link::Link;
use crate::pdu::{
    flags, term_req, DataHeader, Digests, Encoder, Fatal, Fes, Framed, Framer, Header, Limits,
    PFV_1_0,
};
use sluice_io::IoBuf;
use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Most bytes of H2CData a host may send in one PDU (MAXH2CDATA).
pub const MAXH2CDATA: u32 = MAX_TRANSFER_BYTES as u32;
/// Most commands of one queue waiting for their data at once.
pub const MAX_PENDING_WRITES: usize = 128;
/// Least data of an H2CData PDU still to come for it to be read straight
/// into its write's pinned buffer (smaller remainders come with the next
/// read into the receive buffer, in one system call with what follows).
const DIRECT_MIN_BYTES: usize = 16 << 10;
/// How long a send may wait for a host to read before the connection ends.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection may take to send its ICReq and Connect.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(30);

/// A write waiting for its data.
struct PendingWrite {
    sqe: Sqe,
    ttag: u16,
    data: Staging,
    received: usize,
    digest_ok: bool,
}

/// Where a write's data is received.
enum Staging {
    /// A pinned buffer of the connection's engine: written from where it
    /// lies.
    Pinned(IoBuf),
    /// Memory of its own, for a command that runs the slow way.
    Heap(Vec<u8>),
}

impl Staging {
    fn len(&self) -> usize {
        match self {
            Staging::Pinned(b) => b.len(),
            Staging::Heap(v) => v.len(),
        }
    }

    fn put(&mut self, offset: usize, bytes: &[u8]) {
        match self {
            Staging::Pinned(b) => b.write_at(offset, bytes),
            Staging::Heap(v) => v[offset..offset + bytes.len()].copy_from_slice(bytes),
        }
    }
}

/// One host connection: one queue.
pub(crate) struct Connection {
    queue: Queue,
    framer: Framer,
    encoder: Encoder,
    initialized: bool,
    pending: HashMap<u16, PendingWrite>,
    next_ttag: u16,
    /// PDUs to send, read data from its I/O buffers.
    out: Outgoing,
    /// Reads and writes at the device.
    data_path: DataPath,
    /// Served by a worker among other connections (non-blocking turns).
    in_worker: bool,
    /// Commands that run the slow way, waiting for the worker (in order;
    /// no later PDU is handled before they ran).
    deferred: std::collections::VecDeque<(Sqe, Vec<u8>)>,
}

impl Connection {
    pub(crate) fn new(queue: Queue) -> Connection {
        let subsystem = queue.subsystem().clone();
        Connection {
            queue,
            framer: Framer {
                digests: Digests::default(),
                limits: Limits {
                    max_data_bytes: MAXH2CDATA,
                    max_capsule_data_bytes: subsystem.in_capsule_bytes() as u32,
                },
            },
            encoder: Encoder::default(),
            initialized: false,
            pending: HashMap::new(),
            next_ttag: 1,
            out: Outgoing::default(),
            data_path: DataPath::new(subsystem),
            in_worker: false,
            deferred: std::collections::VecDeque::new(),
        }
    }

    /// A connection a worker serves with [`Connection::turn`]: its engines are the worker thread's
    /// own and signal their completions to `completions` (an eventfd in the
    /// worker's epoll set, which outlives the connection).
    pub(crate) fn for_worker(queue: Queue, completions: std::os::fd::RawFd) -> Connection {
        let data_path = DataPath::signalling(queue.subsystem().clone(), Some(completions));
        Connection {
            in_worker: true,
            data_path,
            ..Connection::new(queue)
        }
    }

    /// Whether every completion of this connection's device I/O is
    /// signalled to the worker's eventfd: the worker may then sleep in
    /// epoll while commands are at the device.
    pub(crate) fn signals_completions(&self) -> bool {
        self.data_path.signals_completions()
    }

    /// Commands waiting for [`Connection::run_deferred`].
    pub(crate) fn has_deferred(&self) -> bool {
        !self.deferred.is_empty()
    }

    /// Whether the connection is an admin queue (or not connected yet).
    pub(crate) fn is_admin(&self) -> bool {
        self.queue.is_admin()
    }

    /// Reaps every command at the device and queues their answers.
    pub(crate) fn drain_device(&mut self) {
        if self.data_path.busy() {
            self.drain();
        }
    }

    /// Runs the waiting commands, in order, after this connection's
    /// commands at the device (the worker has reaped the others' writes
    /// first when they may wait on the write gate).
    pub(crate) fn run_deferred(&mut self) {
        self.drain_device();
        while let Some((sqe, data)) = self.deferred.pop_front() {
            let outcome = self.queue.execute(&sqe, &data);
            self.send_outcome(&sqe, outcome);
        }
    }

    pub(crate) fn run(mut self, link: &mut impl Link, stop: &AtomicBool) -> Result<(), String> {
        let mut buf = vec![0u8; 256 << 10];
        let (mut start, mut filled) = (0usize, 0usize);
        let opened = Instant::now();
        let mut last_heard = Instant::now();
        let result = loop {
            // Every whole PDU already received.
            // Tiny commands can ask for big answers: at most
            // MAX_UNSENT_BYTES of them are made before they go out.
            let mut answers_first = false;
            let framed = loop {
                if self.out.pending_bytes() >= MAX_UNSENT_BYTES {
                    answers_first = true;
                    break Ok(0);
                }
                match self.framer.next(&buf[start..filled]) {
                    Ok(Framed::Pdu(pdu, used)) => {
                        // The data is handled where it was received.
                        if let Err(e) = self.handle(pdu.header, pdu.data, pdu.data_digest_ok) {
                            break Err(e);
                        }
                        start += used;
                    }
                    Ok(Framed::NeedBytes(n)) => break Ok(n),
                    Err(e) => break Err(e),
                }
            };
            // Issue what the PDUs started; answer what is already done.
            self.collect(false);
            if let Err(e) = link.send(&mut self.out) {
                break Err(format!("sending: {e}"));
            }
            if answers_first {
                continue;
            }
            let need = match framed {
                Ok(n) => n,
                Err(fatal) => {
                    let _ = link.write_all(&term_req(&fatal, &buf[start..filled]));
                    break Err(format!("fatal transport error: {fatal}"));
                }
            };
            if stop.load(Ordering::Relaxed) {
                break Ok(());
            }
            if need >= DIRECT_MIN_BYTES {
                match self.receive_direct(link, &buf[start..filled], stop) {
                    Ok(Some(used)) => {
                        start += used;
                        last_heard = Instant::now();
                        continue;
                    }
                    Ok(None) => {}
                    Err(Stop::Fatal(fatal)) => {
                        let _ = link.write_all(&term_req(&fatal, &buf[start..filled]));
                        break Err(format!("fatal transport error: {fatal}"));
                    }
                    Err(Stop::Io(e)) => break Err(e),
                }
            }
            // Room for what comes next: move the partial PDU to the front.
            buf.copy_within(start..filled, 0);
            filled -= start;
            start = 0;
            if filled + need > buf.len() {
                buf.resize(filled + need, 0);
            }
            if self.data_path.busy() {
                // Commands at the device: take what the host sent since,
                // else wait for the device, not the host.
                match link.try_read(&mut buf[filled..]) {
                    Ok(0) => break Ok(()),
                    Ok(n) => {
                        filled += n;
                        last_heard = Instant::now();
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => self.collect(true),
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => break Err(format!("receiving: {e}")),
                }
                continue;
            }
            match link.read(&mut buf[filled..]) {
                Ok(0) => break Ok(()),
                Ok(n) => {
                    filled += n;
                    last_heard = Instant::now();
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if !self.queue.is_connected() && opened.elapsed() > SETUP_TIMEOUT {
                        break Err(format!(
                            "no ICReq and Connect within {} s",
                            SETUP_TIMEOUT.as_secs()
                        ));
                    }
                    if let Some(why) = self.queue.expiry(last_heard.elapsed()) {
                        break Err(why);
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => break Err(format!("receiving: {e}")),
            }
        };
        // Nothing is acknowledged past this point; what is at the device
        // finishes before the queue goes.
        let mut unsent = Vec::new();
        self.data_path.drain(&mut unsent);
        self.queue.disconnect();
        result
    }

    /// One non-blocking turn of a connection served by a worker among
    /// others (`stream` non-blocking): takes what the host sent, runs every
    /// whole PDU, issues and answers what the device finished, and sends
    /// what the socket takes. Returns whether anything happened; `Err` ends
    /// the connection (`Ok` inside: the host left).
    pub(crate) fn turn(
        &mut self,
        stream: &TcpStream,
        rx: &mut Receiving,
    ) -> Result<bool, Result<(), String>> {
        let mut progressed = false;
        // A host that does not read its answers gets no more read from it.
        if self.out.pending_bytes() < MAX_UNSENT_BYTES {
            let was_direct = rx.direct.is_some();
            if was_direct {
                progressed |= self.fill_direct(stream, rx)?;
            }
            // Bytes that followed a direct PDU are framed first: a greedy
            // read now would take the next PDU's data into the buffer.
            if rx.direct.is_none() && !(was_direct && rx.filled > 0) {
                progressed |= rx.fill(stream)?;
            }
        }
        // Commands waiting for the worker run before any later PDU, and
        // tiny commands can ask for big answers: no more PDUs are handled
        // while MAX_UNSENT_BYTES of answers wait.
        rx.held = false;
        loop {
            if rx.direct.is_some() {
                // The PDUs after it wait for its data.
                break;
            }
            if !self.deferred.is_empty() || self.out.pending_bytes() >= MAX_UNSENT_BYTES {
                // What is left of the buffer waits for a later turn.
                rx.held = rx.start < rx.filled;
                break;
            }
            match self.framer.next(&rx.buf[rx.start..rx.filled]) {
                Ok(Framed::Pdu(pdu, used)) => {
                    if let Err(fatal) = self.handle(pdu.header, pdu.data, pdu.data_digest_ok) {
                        return Err(self.terminate(stream, &fatal, &rx.buf[rx.start..rx.filled]));
                    }
                    rx.start += used;
                    rx.whole_pdus += 1;
                    rx.headers_first &= rx.whole_pdus <= HEADERS_FIRST_PDUS;
                    progressed = true;
                }
                Ok(Framed::NeedBytes(n)) => {
                    rx.need = n;
                    if n < DIRECT_MIN_BYTES {
                        break;
                    }
                    match self.begin_direct(rx) {
                        Ok(true) => {
                            progressed = true;
                            progressed |= self.fill_direct(stream, rx)?;
                        }
                        Ok(false) => break,
                        Err(fatal) => {
                            return Err(self.terminate(
                                stream,
                                &fatal,
                                &rx.buf[rx.start..rx.filled],
                            ))
                        }
                    }
                }
                Err(fatal) => {
                    return Err(self.terminate(stream, &fatal, &rx.buf[rx.start..rx.filled]))
                }
            }
        }
        let answered = self.out.pending_bytes();
        self.collect(false);
        progressed |= self.out.pending_bytes() != answered;
        if self.out.pending_bytes() > 0 {
            let before = self.out.pending_bytes();
            let all = self
                .out
                .send_some(stream)
                .map_err(|e| Err(format!("sending: {e}")))?;
            progressed |= self.out.pending_bytes() != before;
            rx.unsent_since = if all {
                None
            } else {
                rx.unsent_since.or(Some(Instant::now()))
            };
        }
        Ok(progressed)
    }

    /// When the PDU begun at `rx.start` (its header here, its data mostly
    /// not) is a plain write's data — a Write or MultiCast capsule with its
    /// data in the capsule, or H2CData for one — and its pinned buffer is
    /// one piece: takes the data bytes already here into the buffer and
    /// makes the rest come straight into it ([`Connection::fill_direct`]).
    /// `false`: the PDU is framed as usual once it is all here.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: pending, checked above"
    )]
    fn begin_direct(&mut self, rx: &mut Receiving) -> Result<bool, Fatal> {
        let partial = &rx.buf[rx.start..rx.filled];
        let Some(pdu) = self.framer.data_header(partial)? else {
            return Ok(false);
        };
        let have = partial.len() - pdu.data_offset;
        if have >= pdu.data_len || pdu.data_len - have < DIRECT_MIN_BYTES {
            return Ok(false);
        }
        let Some(cid) = self.direct_write(&pdu.header, pdu.data_len)? else {
            return Ok(false);
        };
        let p = self.pending.get_mut(&cid).expect("pending, checked above");
        let data_at = p.received;
        p.data.put(data_at, &partial[pdu.data_offset..]);
        p.received += have;
        self.queue.subsystem().count_write_data(have, false);
        rx.direct = Some(DirectData {
            cid,
            data_at,
            data_len: pdu.data_len,
            digest: pdu.data_digest.then_some(([0; 4], 0)),
        });
        (rx.start, rx.filled) = (0, 0);
        Ok(true)
    }

    /// The pending write whose data the data PDU with `header` carries
    /// (`data_len` bytes), when that data can be read straight into its
    /// pinned buffer: H2CData for a write with a one-piece pinned buffer,
    /// or a Write or MultiCast capsule with its data in it (then made
    /// pending here). `None`: the PDU is framed as usual.
    fn direct_write(&mut self, header: &Header, data_len: usize) -> Result<Option<u16>, Fatal> {
        match header {
            Header::H2cData(d) => {
                let p = self.expecting(d, data_len)?;
                let one_piece = matches!(&p.data, Staging::Pinned(b) if b.as_slice().is_some());
                Ok(one_piece.then_some(d.cccid))
            }
            Header::CapsuleCmd(sqe) if self.initialized => {
                Ok(self.pend_capsule_write(sqe, data_len).then(|| sqe.cid()))
            }
            _ => Ok(None),
        }
    }

    /// A Write or MultiCast capsule whose `len` bytes of in-capsule data
    /// are to be received straight into a pinned buffer: the capsule is
    /// checked as [`Connection::command`] checks it, and the write waits in
    /// `pending` for its data as one after an R2T does. `false`: it runs
    /// the usual way once its capsule is all here.
    fn pend_capsule_write(&mut self, sqe: &Sqe, len: usize) -> bool {
        let sgl = sqe.sgl();
        let cid = sqe.cid();
        if sgl.kind != SglKind::InCapsule
            || sgl.address != 0
            || sgl.length as usize != len
            || self.pending.len() >= MAX_PENDING_WRITES
            || self.pending.contains_key(&cid)
        {
            return false;
        }
        let Some(ios) = self.fast_write(sqe, len) else {
            return false;
        };
        let Some(buf) = self.data_path.write_buffer(&ios[0]) else {
            return false;
        };
        if buf.as_slice().is_none() {
            return false;
        }
        self.pending.insert(
            cid,
            PendingWrite {
                sqe: sqe.clone(),
                ttag: 0,
                data: Staging::Pinned(buf),
                received: 0,
                digest_ok: true,
            },
        );
        // Counted here: this capsule does not pass through `command`.
        self.queue.count_command(sqe.opcode());
        true
    }

    /// Reads what has come of the data PDU of `rx.direct` straight into
    /// its write's pinned buffer, then its digest; what follows it on the
    /// socket goes to the receive buffer in the same read (a header's worth
    /// when headers come first). Starts the write once all is here.
    /// Returns whether bytes came.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a direct PDU's write is pending; one piece, checked when begun; present; pending; one piece"
    )]
    fn fill_direct(
        &mut self,
        stream: &TcpStream,
        rx: &mut Receiving,
    ) -> Result<bool, Result<(), String>> {
        use std::io::{IoSliceMut, Read};
        let Some(direct) = rx.direct.as_mut() else {
            return Ok(false);
        };
        debug_assert_eq!((rx.start, rx.filled), (0, 0), "nothing framed past it");
        let p = self
            .pending
            .get_mut(&direct.cid)
            .expect("a direct PDU's write is pending");
        let Staging::Pinned(buf) = &mut p.data else {
            unreachable!("direct data goes to a pinned buffer");
        };
        let data = buf.as_mut_slice().expect("one piece, checked when begun");
        let end = direct.data_at + direct.data_len;
        let data_left = end - p.received;
        let tail_bytes = HEADER_READ_BYTES.min(rx.buf.len());
        let (digest_bytes, digest_got) = match &mut direct.digest {
            Some((bytes, got)) => (&mut bytes[*got..], *got),
            None => (&mut [][..], 0),
        };
        let digest_left = digest_bytes.len();
        let mut parts = [
            IoSliceMut::new(&mut data[p.received..end]),
            IoSliceMut::new(digest_bytes),
            IoSliceMut::new(&mut rx.buf[..tail_bytes]),
        ];
        let n = match (&mut &*stream).read_vectored(&mut parts) {
            Ok(0) => return Err(Ok(())),
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                return Ok(false)
            }
            Err(e) => return Err(Err(format!("receiving: {e}"))),
        };
        rx.last_heard = Instant::now();
        let to_data = n.min(data_left);
        let to_digest = (n - to_data).min(digest_left);
        p.received += to_data;
        if let Some((_, got)) = &mut direct.digest {
            *got = digest_got + to_digest;
        }
        rx.filled = n - to_data - to_digest;
        self.queue.subsystem().count_write_data(to_data, true);
        if to_data < data_left || to_digest < digest_left {
            return Ok(true);
        }
        let direct = rx.direct.take().expect("present");
        if let Some((digest, _)) = direct.digest {
            let range = direct.data_at..direct.data_at + direct.data_len;
            let p = self.pending.get_mut(&direct.cid).expect("pending");
            let Staging::Pinned(buf) = &p.data else {
                unreachable!("direct data goes to a pinned buffer");
            };
            let data = buf.as_slice().expect("one piece");
            p.digest_ok &= u32::from_le_bytes(digest) == crc32c::crc32c(&data[range]);
        }
        rx.headers_first = true;
        rx.whole_pdus = 0;
        self.h2c_received(direct.cid);
        Ok(true)
    }

    /// Sends a TermReq for `fatal` (as far as the socket takes it now) and
    /// says why the connection ends.
    fn terminate(
        &mut self,
        stream: &TcpStream,
        fatal: &Fatal,
        partial: &[u8],
    ) -> Result<(), String> {
        self.out.bytes.extend_from_slice(&term_req(fatal, partial));
        let _ = self.out.send_some(stream);
        Err(format!("fatal transport error: {fatal}"))
    }

    /// Why a worker's connection must end now, if it must: no ICReq and
    /// Connect in time, a silent host past its keep-alive, or a host that
    /// has not taken its answers for [`SEND_TIMEOUT`].
    /// Whether the host's ICReq came.
    pub(crate) fn initialized(&self) -> bool {
        self.initialized
    }

    /// Whether a host's Connect made this connection's queue part of a
    /// controller.
    pub(crate) fn is_connected(&self) -> bool {
        self.queue.is_connected()
    }

    pub(crate) fn expired(&self, rx: &Receiving) -> Option<String> {
        if !self.queue.is_connected() && rx.opened.elapsed() > SETUP_TIMEOUT {
            return Some(format!(
                "no ICReq and Connect within {} s",
                SETUP_TIMEOUT.as_secs()
            ));
        }
        if let Some(why) = self.queue.expiry(rx.last_heard.elapsed()) {
            return Some(why);
        }
        if rx.unsent_since.is_some_and(|t| t.elapsed() > SEND_TIMEOUT) {
            return Some(format!(
                "the host took no answer for {} s",
                SEND_TIMEOUT.as_secs()
            ));
        }
        None
    }

    /// Commands at the device (or finished, not yet answered).
    pub(crate) fn busy_at_device(&self) -> bool {
        self.data_path.busy()
    }

    /// Answers still to send.
    pub(crate) fn has_unsent(&self) -> bool {
        self.out.pending_bytes() > 0
    }

    /// Waits for the device to finish at least one command and answers
    /// what finished (sent by the next turn).
    pub(crate) fn wait_for_device(&mut self) {
        self.collect(true);
    }

    /// Ends the connection: nothing is acknowledged past this point; what
    /// is at the device finishes before the queue goes.
    pub(crate) fn close(mut self) {
        let mut unsent = Vec::new();
        self.data_path.drain(&mut unsent);
        self.queue.disconnect();
    }

    /// Issues the I/O queued at the device and answers a group of what
    /// finished (with `wait`, waiting for the device first if nothing has).
    fn collect(&mut self, wait: bool) {
        let mut done = Vec::new();
        self.data_path.next_group(wait, &mut done);
        done.into_iter().for_each(|f| self.answer(f));
    }

    /// Waits for every command at the device and answers them all: before
    /// a command that runs the slow way, so it sees their effects.
    fn drain(&mut self) {
        let mut done = Vec::new();
        self.data_path.drain(&mut done);
        done.into_iter().for_each(|f| self.answer(f));
    }

    fn answer(&mut self, finished: Finished) {
        match finished {
            Finished::Done { tag, op, ok } => {
                let status = match (ok, op) {
                    (true, _) => crate::command::Status::SUCCESS,
                    (false, sluice_io::Op::Read) => status::UNRECOVERED_READ,
                    (false, _) => status::WRITE_FAULT,
                };
                self.complete(Completion::new(tag as u16, status));
            }
            Finished::Read { tag, buf } => {
                let cid = tag as u16;
                let header = Header::C2hData(DataHeader {
                    cccid: cid,
                    ttag: 0,
                    datao: 0,
                    datal: buf.len() as u32,
                });
                // With SQ flow control off the data PDU says it succeeded,
                // and no response capsule follows.
                let success_in_data = self.queue.success_in_data();
                let pdu_flags = last_data_pdu_flags(success_in_data);
                match buf.as_slice() {
                    Some(data) => {
                        let at = self.encoder.encode_around(
                            &header,
                            pdu_flags,
                            data,
                            &mut self.out.bytes,
                        );
                        self.out.insert(at, buf);
                    }
                    None => {
                        let data = buf.to_vec();
                        self.encoder
                            .encode(&header, pdu_flags, &data, &mut self.out.bytes);
                    }
                }
                if !success_in_data {
                    self.complete(Completion::new(cid, crate::command::Status::SUCCESS));
                }
            }
        }
    }

    fn handle(&mut self, header: Header, data: &[u8], data_digest_ok: bool) -> Result<(), Fatal> {
        match header {
            Header::IcReq {
                pfv, hpda, digests, ..
            } if !self.initialized => self.ic_req(pfv, hpda, digests),
            Header::CapsuleCmd(sqe) if self.initialized => {
                self.command(sqe, data, data_digest_ok);
                Ok(())
            }
            Header::H2cData(d) if self.initialized => self.h2c_data(d, data, data_digest_ok),
            Header::H2cTermReq(t) => Err(Fatal {
                fes: Fes::SequenceError,
                fei: t.fei,
                reason: "the host terminated the connection",
            }),
            _ => Err(Fatal {
                fes: Fes::SequenceError,
                fei: 0,
                reason: "a PDU this connection's state does not expect",
            }),
        }
    }

    fn ic_req(&mut self, pfv: u16, hpda: u8, digests: Digests) -> Result<(), Fatal> {
        if pfv != PFV_1_0 {
            return Err(Fatal {
                fes: Fes::UnsupportedParameter,
                fei: 8,
                reason: "PDU format version not supported",
            });
        }
        if hpda > 31 {
            return Err(Fatal {
                fes: Fes::InvalidHeaderField,
                fei: 10,
                reason: "HPDA past 31",
            });
        }
        Encoder::default().encode(
            &Header::IcResp {
                pfv: PFV_1_0,
                cpda: 0,
                digests,
                maxh2cdata: MAXH2CDATA,
            },
            0,
            &[],
            &mut self.out.bytes,
        );
        log::debug!(
            "ICReq: header digest {}, data digest {}, HPDA {hpda}",
            if digests.header { "on" } else { "off" },
            if digests.data { "on" } else { "off" }
        );
        self.framer.digests = digests;
        self.encoder = Encoder {
            digests,
            data_alignment: (hpda as usize + 1) * 4,
        };
        self.initialized = true;
        Ok(())
    }

    fn command(&mut self, sqe: Sqe, data: &[u8], data_digest_ok: bool) {
        self.queue.count_command(sqe.opcode());
        if !data.is_empty() {
            let sgl = sqe.sgl();
            let status = if !data_digest_ok {
                Some(status::TRANSIENT_TRANSPORT)
            } else if sgl.kind != SglKind::InCapsule {
                Some(status::SGL_TYPE_INVALID)
            } else if sgl.address != 0 {
                Some(status::SGL_OFFSET_INVALID)
            } else if sgl.length as usize != data.len() {
                Some(status::SGL_LENGTH_INVALID)
            } else {
                None
            };
            match status {
                Some(s) => self.complete(Completion::new(sqe.cid(), s)),
                None => self.write_in_capsule(&sqe, data),
            }
            return;
        }
        match self.queue.data_need(&sqe) {
            Err(s) => self.complete(Completion::new(sqe.cid(), s)),
            Ok(DataNeed::None) => {
                let started = self.queue.independent(&sqe).is_some()
                    && sqe.opcode() == crate::nvm::opcode::READ
                    && self.data_path.nvme_io(&sqe).is_some_and(|io| {
                        sqe.sgl().length as usize == io.bytes
                            && self.data_path.start_read(sqe.cid() as u64, &io)
                    });
                if !started {
                    self.run_command(&sqe, &[]);
                }
            }
            Ok(DataNeed::FromHost(len)) => self.ask_for_data(sqe, len),
        }
    }

    /// The blocks a plain Write or a MultiCast of `len_bytes` writes, when
    /// this connection keeps it in flight (the first run's engine receives
    /// the data), or `None` (the slow way).
    fn fast_write(&self, sqe: &Sqe, len_bytes: usize) -> Option<Vec<crate::datapath::BlockIo>> {
        self.queue.independent(sqe)?;
        let ios = match sqe.opcode() {
            crate::nvm::opcode::WRITE => vec![self.data_path.nvme_io(sqe)?],
            crate::nvm::opcode::MULTICAST => self.data_path.multicast_io(sqe)?,
            _ => return None,
        };
        (ios[0].bytes == len_bytes).then_some(ios)
    }

    /// Starts the writes of [`Connection::fast_write`]'s `ios` from `buf`.
    fn start_fast_write(
        &mut self,
        sqe: &Sqe,
        ios: &[crate::datapath::BlockIo],
        buf: IoBuf,
    ) -> Result<(), IoBuf> {
        let tag = sqe.cid() as u64;
        match ios {
            [io] => self.data_path.start_write(tag, io, buf),
            _ => self.data_path.start_multicast(tag, ios, buf),
        }
    }

    /// A command with its data in the capsule: a plain Write or a MultiCast
    /// goes to the device from a pinned buffer, anything else the slow way.
    fn write_in_capsule(&mut self, sqe: &Sqe, data: &[u8]) {
        if let Some(ios) = self.fast_write(sqe, data.len()) {
            if let Some(mut buf) = self.data_path.write_buffer(&ios[0]) {
                buf.write_at(0, data);
                self.queue.subsystem().count_write_data(data.len(), false);
                if self.start_fast_write(sqe, &ios, buf).is_ok() {
                    return;
                }
            }
        }
        self.run_command(sqe, data);
    }

    fn ask_for_data(&mut self, sqe: Sqe, len: usize) {
        let cid = sqe.cid();
        if self.pending.len() >= MAX_PENDING_WRITES || self.pending.contains_key(&cid) {
            let s = if self.pending.contains_key(&cid) {
                status::CID_CONFLICT
            } else {
                status::INTERNAL
            };
            self.complete(Completion::new(cid, s));
            return;
        }
        let ttag = self.next_ttag;
        self.next_ttag = self.next_ttag.wrapping_add(1).max(1);
        let pinned = match self.fast_write(&sqe, len) {
            Some(ios) => self.data_path.write_buffer(&ios[0]),
            None => None,
        };
        let data = match pinned {
            Some(buf) => Staging::Pinned(buf),
            None => Staging::Heap(vec![0u8; len]),
        };
        self.encoder.encode(
            &Header::R2t {
                cccid: cid,
                ttag,
                r2to: 0,
                r2tl: len as u32,
            },
            0,
            &[],
            &mut self.out.bytes,
        );
        self.pending.insert(
            cid,
            PendingWrite {
                sqe,
                ttag,
                data,
                received: 0,
                digest_ok: true,
            },
        );
    }

    fn h2c_data(&mut self, d: DataHeader, data: &[u8], digest_ok: bool) -> Result<(), Fatal> {
        let p = self.expecting(&d, data.len())?;
        p.data.put(p.received, data);
        p.received += data.len();
        p.digest_ok &= digest_ok;
        if matches!(p.data, Staging::Pinned(_)) {
            self.queue.subsystem().count_write_data(data.len(), false);
        }
        self.h2c_received(d.cccid);
        Ok(())
    }

    /// The write an H2CData PDU of `len` bytes is for, checked against
    /// what its R2T asked for.
    fn expecting(&mut self, d: &DataHeader, len: usize) -> Result<&mut PendingWrite, Fatal> {
        let out_of_range = |reason| Fatal {
            fes: Fes::DataOutOfRange,
            fei: 12,
            reason,
        };
        let Some(p) = self.pending.get_mut(&d.cccid) else {
            return Err(Fatal {
                fes: Fes::InvalidHeaderField,
                fei: 8,
                reason: "H2CData for a command that asked for none",
            });
        };
        if d.ttag != p.ttag {
            return Err(Fatal {
                fes: Fes::InvalidHeaderField,
                fei: 10,
                reason: "H2CData with a transfer tag no R2T gave",
            });
        }
        if d.datao as usize != p.received {
            return Err(out_of_range(
                "H2CData not at the next offset of the transfer",
            ));
        }
        if p.received + len > p.data.len() {
            return Err(out_of_range("H2CData past the end of the transfer"));
        }
        Ok(p)
    }

    /// Runs the write `cccid` once all its data is here.
    #[expect(
        clippy::expect_used,
        reason = "the pending write is present: its CCCID was looked up just before"
    )]
    fn h2c_received(&mut self, cccid: u16) {
        let Some(p) = self.pending.get(&cccid) else {
            return;
        };
        if p.received < p.data.len() {
            return;
        }
        let p = self.pending.remove(&cccid).expect("present");
        if !p.digest_ok {
            self.complete(Completion::new(cccid, status::TRANSIENT_TRANSPORT));
            return;
        }
        match p.data {
            Staging::Heap(data) => self.run_command(&p.sqe, &data),
            Staging::Pinned(buf) => {
                let started = match self.fast_write(&p.sqe, buf.len()) {
                    Some(ios) => self.start_fast_write(&p.sqe, &ios, buf),
                    None => Err(buf),
                };
                if let Err(buf) = started {
                    self.run_command(&p.sqe, &buf.to_vec());
                }
            }
        }
    }

    /// When the PDU begun in `partial` (everything received of it) is a
    /// plain write's data still mostly on its way — a Write or MultiCast
    /// capsule with its data in it, or H2CData for one — and its pinned
    /// buffer is one piece: reads the rest of its data from `stream`
    /// straight into that buffer (no staging copy), then its digest.
    /// Returns the bytes of `partial` it used (all of them), or `None` to
    /// let the PDU be framed as usual.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: pending, checked above; pending; one piece, checked above"
    )]
    fn receive_direct(
        &mut self,
        stream: &mut impl Link,
        partial: &[u8],
        stop: &AtomicBool,
    ) -> Result<Option<usize>, Stop> {
        let Some(pdu) = self.framer.data_header(partial).map_err(Stop::Fatal)? else {
            return Ok(None);
        };
        let data_end = pdu.data_offset + pdu.data_len;
        if partial.len() >= data_end || data_end - partial.len() < DIRECT_MIN_BYTES {
            return Ok(None);
        }
        let Some(cid) = self
            .direct_write(&pdu.header, pdu.data_len)
            .map_err(Stop::Fatal)?
        else {
            return Ok(None);
        };
        let p = self.pending.get_mut(&cid).expect("pending, checked above");
        let at = p.received;
        let have = partial.len() - pdu.data_offset;
        p.data.put(at, &partial[pdu.data_offset..]);
        self.read_into_pending(stream, cid, at + have..at + pdu.data_len, stop)?;
        let subsystem = self.queue.subsystem();
        subsystem.count_write_data(have, false);
        subsystem.count_write_data(pdu.data_len - have, true);
        let p = self.pending.get_mut(&cid).expect("pending");
        let Staging::Pinned(buf) = &p.data else {
            unreachable!("checked above");
        };
        let ok = if pdu.data_digest {
            // The digest follows the data at once: no wait worth reaping for.
            let mut digest = [0u8; 4];
            read_exact_patiently(stream, &mut digest, stop)?;
            let data = buf.as_slice().expect("one piece, checked above");
            u32::from_le_bytes(digest) == crc32c::crc32c(&data[at..at + pdu.data_len])
        } else {
            true
        };
        p.received += pdu.data_len;
        p.digest_ok &= ok;
        self.h2c_received(cid);
        Ok(Some(partial.len()))
    }

    /// Reads `range` of pending write `cid`'s pinned buffer from `stream`.
    /// While the host's bytes are on their way, what the device finishes is
    /// reaped and answered: a write share is never held waiting on the host
    /// (a Compare-and-Write of another host may be waiting for it).
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: pending; one piece"
    )]
    fn read_into_pending(
        &mut self,
        stream: &mut impl Link,
        cid: u16,
        range: std::ops::Range<usize>,
        stop: &AtomicBool,
    ) -> Result<(), Stop> {
        let mut at = range.start;
        let mut last_bytes = Instant::now();
        while at < range.end {
            let busy = self.data_path.busy();
            let p = self.pending.get_mut(&cid).expect("pending");
            let Staging::Pinned(buf) = &mut p.data else {
                unreachable!("direct data goes to a pinned buffer");
            };
            let dst = &mut buf.as_mut_slice().expect("one piece")[at..range.end];
            let got = if busy {
                stream.try_read(dst)
            } else {
                stream.read(dst)
            };
            match got {
                Ok(0) => return Err(Stop::Io("the host closed the connection mid-PDU".into())),
                Ok(n) => {
                    at += n;
                    last_bytes = Instant::now();
                }
                Err(e) if busy && e.kind() == ErrorKind::WouldBlock => {
                    self.collect(true);
                    stream
                        .send(&mut self.out)
                        .map_err(|e| Stop::Io(format!("sending: {e}")))?;
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    keep_waiting(stop, last_bytes)?
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(Stop::Io(format!("receiving: {e}"))),
            }
        }
        Ok(())
    }

    /// Runs a command to completion on this thread, after the commands at
    /// the device. Under a worker the command waits for the worker instead
    /// ([`Connection::run_deferred`]): it may wait on the namespace's write
    /// gate, and the worker must first reap the writes every connection it
    /// serves holds shares of.
    fn run_command(&mut self, sqe: &Sqe, data: &[u8]) {
        if self.in_worker {
            self.deferred.push_back((sqe.clone(), data.to_vec()));
            return;
        }
        if self.data_path.busy() {
            self.drain();
        }
        let outcome = self.queue.execute(sqe, data);
        self.send_outcome(sqe, outcome);
    }

    fn send_outcome(&mut self, sqe: &Sqe, outcome: Outcome) {
        match outcome {
            Outcome::Held => {}
            Outcome::Also(earlier, then) => {
                self.complete(earlier);
                self.send_outcome(sqe, *then);
            }
            Outcome::Done { data, completion } => {
                // Only a plain success (nothing in DW0/DW1) may ride on the
                // data PDU.
                let success_in_data = !data.is_empty()
                    && self.queue.success_in_data()
                    && completion.status.is_success()
                    && completion.result == 0
                    && completion.dw1 == 0;
                if !data.is_empty() {
                    let len = data.len().min(sqe.sgl().length as usize);
                    let pdu_flags = last_data_pdu_flags(success_in_data);
                    self.encoder.encode(
                        &Header::C2hData(DataHeader {
                            cccid: sqe.cid(),
                            ttag: 0,
                            datao: 0,
                            datal: len as u32,
                        }),
                        pdu_flags,
                        &data[..len],
                        &mut self.out.bytes,
                    );
                }
                if !success_in_data {
                    self.complete(completion);
                }
            }
        }
    }

    fn complete(&mut self, completion: Completion) {
        if !completion.status.is_success() {
            self.queue.count_error();
        }
        self.encoder.encode(
            &Header::CapsuleResp(completion),
            0,
            &[],
            &mut self.out.bytes,
        );
    }
}

/// The flags of a command's last C2HData: LAST_PDU, and SUCCESS when it
/// also stands for the command's successful completion.
fn last_data_pdu_flags(success_in_data: bool) -> u8 {
    if success_in_data {
        flags::LAST_PDU | flags::SUCCESS
    } else {
        flags::LAST_PDU
    }
}

/// Most answer bytes a connection may have waiting for its host before
/// the node stops reading its commands.
pub(crate) const MAX_UNSENT_BYTES: usize = 4 << 20;
/// Most bytes one turn reads from a socket before the worker's next
/// connection gets its turn.
const TURN_READ_BYTES: usize = 1 << 20;
/// What a worker reads of a PDU before its data when the data is to go
/// straight into a pinned buffer: a command capsule's header and digest
/// (72 + 4 bytes), rounded up; the few data bytes it may take are copied.
const HEADER_READ_BYTES: usize = 128;
/// Whole PDUs (commands, small data) after a direct one before reads take
/// all the socket holds again: a write after R2T sends its command whole
/// between two direct H2CData PDUs, a host that turned to reads sends
/// many.
const HEADERS_FIRST_PDUS: usize = 8;

/// A worker's connection's receive side and clocks.
pub(crate) struct Receiving {
    buf: Vec<u8>,
    start: usize,
    filled: usize,
    /// Bytes the PDU begun at `start` still needs.
    need: usize,
    /// PDUs received and not handled yet (held back by waiting commands or
    /// unsent answers): the connection needs a turn without new bytes.
    held: bool,
    opened: Instant,
    last_heard: Instant,
    /// Since when answers have waited for the host to take them.
    unsent_since: Option<Instant>,
    /// A write's data being read straight into its pinned buffer: nothing
    /// after it is framed until it is all here.
    direct: Option<DirectData>,
    /// A data PDU's data came direct lately: read a header's worth alone,
    /// so that the next one's data does too.
    headers_first: bool,
    /// PDUs framed whole since the last direct one: past
    /// [`HEADERS_FIRST_PDUS`] of them, reads take all there is again.
    whole_pdus: usize,
}

/// What is still to come of a write's data PDU read straight into the
/// write's pinned buffer (a worker's connection).
struct DirectData {
    /// The write (its entry in `Connection::pending`).
    cid: u16,
    /// Where the PDU's data begins in the buffer, and its length.
    data_at: usize,
    data_len: usize,
    /// The PDU's data digest, when it carries one, and how much of it came.
    digest: Option<([u8; 4], usize)>,
}

impl Receiving {
    pub(crate) fn new() -> Receiving {
        Receiving {
            buf: vec![0u8; 256 << 10],
            start: 0,
            filled: 0,
            need: 0,
            held: false,
            opened: Instant::now(),
            last_heard: Instant::now(),
            unsent_since: None,
            direct: None,
            headers_first: false,
            whole_pdus: 0,
        }
    }

    /// Whether received PDUs wait for a turn.
    pub(crate) fn held(&self) -> bool {
        self.held
    }

    /// Reads what the socket holds now (up to [`TURN_READ_BYTES`]).
    fn fill(&mut self, stream: &TcpStream) -> Result<bool, Result<(), String>> {
        let mut got_any = false;
        let mut got = 0;
        while got < TURN_READ_BYTES {
            // Room: the partial PDU to the front, the buffer as big as it.
            if self.start > 0 {
                self.buf.copy_within(self.start..self.filled, 0);
                self.filled -= self.start;
                self.start = 0;
            }
            let room = (self.filled + self.need).max(self.filled + (64 << 10));
            if room > self.buf.len() {
                self.buf.resize(room, 0);
            }
            // After a direct data PDU, a header's worth alone: the data of
            // the PDU it begins is read direct.
            let buffered = self.filled - self.start;
            let header_only = self.headers_first && buffered < HEADER_READ_BYTES;
            let space = if header_only {
                HEADER_READ_BYTES - buffered
            } else {
                self.buf.len() - self.filled
            };
            let into = &mut self.buf[self.filled..self.filled + space];
            match sluice_io::net::recv_nowait(stream, into) {
                Ok(0) => return Err(Ok(())),
                Ok(n) => {
                    self.filled += n;
                    got += n;
                    got_any = true;
                    self.last_heard = Instant::now();
                    // A read that left room took all the socket held: asking
                    // again would only hear EAGAIN, a system call a group of
                    // commands. Bytes that come later make the socket ready.
                    if n < space || header_only {
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(Err(format!("receiving: {e}"))),
            }
        }
        Ok(got_any)
    }
}

/// Why a connection stops.
enum Stop {
    /// The host broke the transport's rules: a TermReq goes back.
    Fatal(Fatal),
    /// The socket failed, or the node is stopping.
    Io(String),
}

/// After a read timed out in the middle of a PDU: goes on waiting, unless
/// the node is stopping or the host has sent nothing since `last_bytes`
/// for [`SETUP_TIMEOUT`].
fn keep_waiting(stop: &AtomicBool, last_bytes: Instant) -> Result<(), Stop> {
    if stop.load(Ordering::Relaxed) {
        return Err(Stop::Io("the node is stopping".into()));
    }
    if last_bytes.elapsed() > SETUP_TIMEOUT {
        return Err(Stop::Io(format!(
            "no byte of a PDU's data for {} s",
            SETUP_TIMEOUT.as_secs()
        )));
    }
    Ok(())
}

/// Fills `dst` from `stream`, waiting through its read timeouts (the host
/// is in the middle of a PDU) until the node stops or the host has sent
/// nothing for [`SETUP_TIMEOUT`].
fn read_exact_patiently(
    stream: &mut impl Link,
    dst: &mut [u8],
    stop: &AtomicBool,
) -> Result<(), Stop> {
    let mut done = 0;
    let mut last_bytes = Instant::now();
    while done < dst.len() {
        match stream.read(&mut dst[done..]) {
            Ok(0) => return Err(Stop::Io("the host closed the connection mid-PDU".into())),
            Ok(n) => {
                done += n;
                last_bytes = Instant::now();
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                keep_waiting(stop, last_bytes)?
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(Stop::Io(format!("receiving: {e}"))),
        }
    }
    Ok(())
}
