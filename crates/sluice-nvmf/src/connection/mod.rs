//! One NVMe/TCP connection of the target: its PDUs framed from the
//! socket, command data moved (in-capsule, or asked for with R2T and
//! received in H2CData straight into pinned buffers where it can be; read
//! data out in C2HData), each command handed to its queue. Served a
//! non-blocking `Connection::turn` at a time by a worker, over the socket
//! itself or a TLS session on it ([`crate::wire::Wire`]).
//!
//! Rooms: `data_in` (a write's data from the host: in-capsule, asked for
//! with R2T, received in H2CData — straight into pinned buffers where it
//! can be), `receiving` (the connection's receive buffer and clocks).

mod data_in;
mod receiving;

pub(crate) use receiving::Receiving;

use crate::command::{status, Completion, SglKind, Sqe};
use crate::controller::{DataNeed, Outcome, Queue, MAX_TRANSFER_BYTES};
use crate::datapath::{DataPath, Finished, Outgoing};
use crate::pdu::{
    flags, term_req, DataHeader, Digests, Encoder, Fatal, Fes, Framed, Framer, Header, Limits,
    PFV_1_0,
};
use crate::wire::Wire;
use sluice_io::IoBuf;
use std::collections::HashMap;
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
    /// Commands that run the slow way, waiting for the worker (in order;
    /// no later PDU is handled before they ran).
    deferred: std::collections::VecDeque<(Sqe, Vec<u8>)>,
}

impl Connection {
    /// A connection a worker serves with [`Connection::turn`]: its engines
    /// are the worker thread's own and signal their completions to
    /// `completions` (an eventfd in the worker's epoll set, which outlives
    /// the connection).
    pub(crate) fn new(queue: Queue, completions: std::os::fd::RawFd) -> Connection {
        let subsystem = queue.subsystem().clone();
        Connection {
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
            data_path: DataPath::signalling(subsystem, Some(completions)),
            deferred: std::collections::VecDeque::new(),
            queue,
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

    /// One non-blocking turn of a connection served by a worker among
    /// others (`wire` non-blocking): takes what the host sent, runs every
    /// whole PDU, issues and answers what the device finished, and sends
    /// what the socket takes. Returns whether anything happened; `Err` ends
    /// the connection (`Ok` inside: the host left).
    pub(crate) fn turn(
        &mut self,
        wire: &mut Wire,
        rx: &mut Receiving,
    ) -> Result<bool, Result<(), String>> {
        let mut progressed = false;
        // A host that does not read its answers gets no more read from it.
        if self.out.pending_bytes() < MAX_UNSENT_BYTES {
            let was_direct = rx.direct.is_some();
            if was_direct {
                progressed |= self.fill_direct(wire, rx)?;
            }
            // Bytes that followed a direct PDU are framed first: a greedy
            // read now would take the next PDU's data into the buffer.
            if rx.direct.is_none() && !(was_direct && rx.filled > 0) {
                progressed |= rx.fill(wire)?;
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
                        return Err(self.terminate(wire, &fatal, &rx.buf[rx.start..rx.filled]));
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
                            progressed |= self.fill_direct(wire, rx)?;
                        }
                        Ok(false) => break,
                        Err(fatal) => {
                            return Err(self.terminate(wire, &fatal, &rx.buf[rx.start..rx.filled]))
                        }
                    }
                }
                Err(fatal) => {
                    return Err(self.terminate(wire, &fatal, &rx.buf[rx.start..rx.filled]))
                }
            }
        }
        let answered = self.out.pending_bytes();
        self.collect(false);
        progressed |= self.out.pending_bytes() != answered;
        if self.out.pending_bytes() > 0 || wire.has_unsent() {
            let before = self.out.pending_bytes();
            let all = wire
                .send_some(&mut self.out)
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

    /// Sends a TermReq for `fatal` (as far as the socket takes it now) and
    /// says why the connection ends.
    fn terminate(&mut self, wire: &mut Wire, fatal: &Fatal, partial: &[u8]) -> Result<(), String> {
        self.out.bytes.extend_from_slice(&term_req(fatal, partial));
        let _ = wire.send_some(&mut self.out);
        Err(format!("fatal transport error: {fatal}"))
    }

    /// Whether the host's ICReq came.
    pub(crate) fn initialized(&self) -> bool {
        self.initialized
    }

    /// Whether a host's Connect made this connection's queue part of a
    /// controller.
    pub(crate) fn is_connected(&self) -> bool {
        self.queue.is_connected()
    }

    /// Why a worker's connection must end now, if it must: no ICReq and
    /// Connect in time, a silent host past its keep-alive, or a host that
    /// has not taken its answers for [`SEND_TIMEOUT`].
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

    /// Leaves a command that runs the slow way for the worker
    /// ([`Connection::run_deferred`]): it may wait on the namespace's write
    /// gate, and the worker must first reap the writes every connection it
    /// serves holds shares of.
    fn run_command(&mut self, sqe: &Sqe, data: &[u8]) {
        self.deferred.push_back((sqe.clone(), data.to_vec()));
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
