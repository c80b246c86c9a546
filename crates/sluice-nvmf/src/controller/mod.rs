//! The target's controllers: one subsystem of namespaces (Sluice devices),
//! the controllers hosts create in it with Connect, and each queue's command
//! handling (docs/NVMF.md, "Target"): Fabrics and admin commands here, I/O
//! commands in [`crate::nvm`]. Commands run to completion against the
//! devices through sluice-io's `DeviceIo` (plain Reads and Writes are kept
//! in flight by the transport's `datapath` instead); the transport
//! (`target`) moves the data and the capsules.
//!
//! Rooms: `subsystem` (namespaces, controllers, figures), `identify`
//! (Identify data, the discovery log); a queue's commands are here.

mod identify;
mod subsystem;

pub use identify::capabilities;
use identify::{discovery_log, identify_controller, identify_namespace, nqn_field};
use subsystem::ControllerState;
pub use subsystem::{
    ControllerFigures, NamespaceFigures, NodeFigures, Subsystem, WriteDataBytes,
    DEFAULT_UNKEPT_SILENCE,
};

pub use crate::command::Outcome;
use crate::command::{status, Completion, Fuse, SglKind, Sqe, Status, FABRICS_OPCODE};
pub use crate::namespace::{Namespace, DEVICE_SPIN_WAIT_US, MAX_TRANSFER_BYTES, MDTS};
use crate::nvm::{self, opcode};
use sluice_io::codec::{u16_at, u32_at, u64_at};
use std::sync::Arc;

/// Bytes of the data of an Identify, and the most of any admin transfer.
pub const IDENTIFY_BYTES: usize = 4096;
/// Bytes of a Connect command's data.
pub const CONNECT_DATA_BYTES: usize = 1024;
/// Entries of each queue (CAP.MQES + 1) and commands in flight per queue.
pub const QUEUE_ENTRIES: u16 = 128;
/// Most I/O queues per controller.
pub const MAX_IO_QUEUES: u16 = 8;
/// Most controllers (associations) at once.
pub const MAX_CONTROLLERS: usize = 64;
/// Most outstanding Asynchronous Event Requests per controller (AERL + 1).
pub const MAX_AERS: usize = 4;
/// Connect's CATTR bit 2: the host disables SQ flow control on the queue.
pub const CATTR_DISABLE_SQ_FLOW: u8 = 1 << 2;
/// A discovery log entry's TREQ bit 2: the controller can disable SQ flow
/// control (a host then asks for it in Connect).
pub const TREQ_SQ_FLOW_DISABLE_SUPPORTED: u8 = 1 << 2;

/// In-capsule data every Sluice node takes in a command capsule (the
/// least [`Subsystem::with_in_capsule_bytes`] allows): what a host may send
/// in the capsule before it has read IOCCSZ.
pub const IN_CAPSULE_BYTES: usize = 8192;
/// In-capsule data an I/O command capsule may carry by default (IOCCSZ −
/// 64 bytes): a write up to MDTS needs no R2T round trip.
pub const DEFAULT_IN_CAPSULE_BYTES: usize = MAX_TRANSFER_BYTES;
/// The NQN hosts connect to for the discovery controller.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// The log page of a discovery controller.
pub const DISCOVERY_LOG: u8 = 0x70;
/// The NVMe version the node reports (1.4).
pub const VERSION: u32 = 0x0001_0400;

/// Fabrics command types (FCTYPE).
pub mod fctype {
    /// Property Set.
    pub const PROPERTY_SET: u8 = 0x00;
    /// Connect.
    pub const CONNECT: u8 = 0x01;
    /// Property Get.
    pub const PROPERTY_GET: u8 = 0x04;
    /// Disconnect.
    pub const DISCONNECT: u8 = 0x08;
}

/// Admin opcodes the node serves.
pub mod admin {
    /// Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Abort.
    pub const ABORT: u8 = 0x08;
    /// Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Get Features.
    pub const GET_FEATURES: u8 = 0x0a;
    /// Asynchronous Event Request.
    pub const ASYNC_EVENT: u8 = 0x0c;
    /// Keep Alive.
    pub const KEEP_ALIVE: u8 = 0x18;
}

/// Controller properties (offsets in the property space).
pub mod property {
    /// Controller Capabilities (8 bytes).
    pub const CAP: u32 = 0x00;
    /// Version.
    pub const VS: u32 = 0x08;
    /// Controller Configuration.
    pub const CC: u32 = 0x14;
    /// Controller Status.
    pub const CSTS: u32 = 0x1c;
}

/// Where a command's data comes from or goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataNeed {
    /// The command moves no data to the node, or its data came in the
    /// capsule.
    None,
    /// The command's data (this many bytes) must come in H2CData PDUs after
    /// an R2T.
    FromHost(usize),
}

fn done(completion: Completion) -> Outcome {
    Outcome::Done {
        data: Vec::new(),
        completion,
    }
}

fn fail(sqe: &Sqe, status: Status) -> Outcome {
    done(Completion::new(sqe.cid(), status))
}

/// One queue of one connection: the admin queue (QID 0) or an I/O queue.
pub struct Queue {
    subsystem: Arc<Subsystem>,
    /// The controller, once connected.
    controller: Option<u16>,
    qid: u16,
    held_aers: usize,
    fused: nvm::Fused,
    /// The host NQN the connection's TLS PSK identity named: Connect must
    /// name the same host.
    tls_host: Option<String>,
    /// The host's Connect disabled SQ flow control (CATTR bit 2): it reads
    /// no SQHD, so a read's data PDU may carry its success (C2HData's
    /// SUCCESS flag) instead of a response capsule following it.
    sq_flow_disabled: bool,
    /// The DH-HMAC-CHAP exchange of a host that must authenticate.
    auth: Option<crate::auth::Exchange>,
    /// Its command counters, once connected.
    counters: Option<Arc<crate::queue_figures::QueueCounters>>,
}

impl Queue {
    /// A queue not connected yet.
    pub fn new(subsystem: Arc<Subsystem>) -> Queue {
        Queue {
            subsystem,
            controller: None,
            qid: 0,
            held_aers: 0,
            fused: nvm::Fused::default(),
            tls_host: None,
            sq_flow_disabled: false,
            auth: None,
            counters: None,
        }
    }

    /// Counts a command received (nothing before Connect: the queue has no
    /// controller to count it under).
    pub fn count_command(&self, opcode: u8) {
        if let Some(c) = &self.counters {
            c.count_command(crate::queue_figures::CommandKind::of(self.qid, opcode));
        }
    }

    /// Counts a command answered with an error status.
    pub fn count_error(&self) {
        if let Some(c) = &self.counters {
            c.count_error();
        }
    }

    /// Whether the queue may serve: its host authenticated, or needs not.
    fn host_authenticated(&self) -> bool {
        self.auth.as_ref().is_none_or(|a| a.authenticated())
    }

    /// Whether a successful read may be answered by its C2HData alone,
    /// with the SUCCESS flag: the host's Connect disabled SQ flow control.
    pub fn success_in_data(&self) -> bool {
        self.sq_flow_disabled
    }

    /// The subsystem the queue belongs to.
    pub fn subsystem(&self) -> &Arc<Subsystem> {
        &self.subsystem
    }

    /// A queue on a TLS connection authenticated as host `hostnqn`.
    pub fn authenticated(subsystem: Arc<Subsystem>, hostnqn: String) -> Queue {
        Queue {
            tls_host: Some(hostnqn),
            ..Queue::new(subsystem)
        }
    }

    /// The subsystem whose namespaces an independent command runs on
    /// ([`nvm::execute`]), when `sqe` is one: an I/O command of a connected
    /// I/O queue, not fused, with no Compare held for a Write. Such commands
    /// touch no state of the queue, so they may run on other threads, in
    /// any order (NVMe orders the commands of a queue only through fusing).
    pub fn independent(&self, sqe: &Sqe) -> Option<&Arc<Subsystem>> {
        let independent = self.qid != 0
            && self.controller.is_some()
            && self.host_authenticated()
            && sqe.opcode() != FABRICS_OPCODE
            && sqe.fuse() == Fuse::None
            && !self.fused.is_holding();
        independent.then_some(&self.subsystem)
    }

    /// Whether this is an admin queue (or not connected yet).
    pub fn is_admin(&self) -> bool {
        self.qid == 0
    }

    /// Whether a Connect made this queue part of a controller, and its
    /// host authenticated if it must: the queue is past its setup.
    pub fn is_connected(&self) -> bool {
        self.controller.is_some() && self.host_authenticated()
    }

    /// Why this queue must end now that it has heard nothing for
    /// `silent`, if it must. The keep-alive timer is its controller's: the
    /// admin queue, where Keep Alive arrives, ends after twice the KATO of
    /// silence (or the subsystem's limit for a controller without
    /// keep-alive), and its controller with it; an I/O queue may be idle
    /// for any time, and ends when its controller has ended.
    pub fn expiry(&self, silent: std::time::Duration) -> Option<String> {
        let id = self.controller?;
        let controllers = self.subsystem.controllers();
        let Some(c) = controllers.live.get(&id) else {
            return Some(format!("controller {id} of this I/O queue has ended"));
        };
        if self.qid != 0 {
            return None;
        }
        let limit = match c.kato_ms {
            0 => self.subsystem.unkept_silence,
            kato => std::time::Duration::from_millis(2 * kato as u64),
        };
        (silent > limit).then(|| match c.kato_ms {
            0 => format!(
                "no command for {} s on the admin queue of a controller without keep-alive (KATO 0)",
                limit.as_secs()
            ),
            kato => format!("no command within twice the keep-alive timeout ({kato} ms)"),
        })
    }

    /// Whether a command's data must be asked for with an R2T (a write with
    /// a transport SGL), and how much; checked against the limits first.
    pub fn data_need(&self, sqe: &Sqe) -> Result<DataNeed, Status> {
        let sgl = sqe.sgl();
        let to_node = nvm::takes_data(sqe.opcode()) && self.qid != 0
            || (sqe.opcode() == FABRICS_OPCODE
                && matches!(sqe.fctype(), fctype::CONNECT | crate::auth::FCTYPE_SEND));
        if !to_node || sgl.kind != SglKind::Transport {
            return Ok(DataNeed::None);
        }
        if sgl.length as usize > MAX_TRANSFER_BYTES.max(CONNECT_DATA_BYTES) {
            return Err(status::SGL_LENGTH_INVALID);
        }
        Ok(DataNeed::FromHost(sgl.length as usize))
    }

    /// Runs one command with the data that came with it (in the capsule or
    /// after an R2T).
    pub fn execute(&mut self, sqe: &Sqe, data: &[u8]) -> Outcome {
        if sqe.opcode() == FABRICS_OPCODE {
            return self.fabrics(sqe, data);
        }
        let Some(controller) = self.controller else {
            return fail(sqe, status::SEQUENCE_ERROR);
        };
        if !self.host_authenticated() {
            return fail(sqe, crate::auth::AUTH_REQUIRED);
        }
        if self.qid == 0 {
            if sqe.fuse() != Fuse::None {
                return fail(sqe, status::INVALID_FIELD);
            }
            return self.admin(controller, sqe, data);
        }
        self.io(sqe, data)
    }

    /// An I/O command, with the fused Compare-and-Write's two halves: the
    /// Compare is held until its Write comes; anything else ends it.
    fn io(&mut self, sqe: &Sqe, data: &[u8]) -> Outcome {
        let held = self.fused.take();
        let outcome = match (sqe.fuse(), &held) {
            (Fuse::First, _) if sqe.opcode() == opcode::COMPARE => {
                self.fused.hold(sqe.clone(), data.to_vec());
                Outcome::Held
            }
            (Fuse::Second, Some((first, first_data))) => {
                let (a, b) = nvm::compare_and_write(
                    &self.subsystem.namespaces,
                    (first, first_data),
                    (sqe, data),
                );
                return Outcome::Also(a, Box::new(done(b)));
            }
            (Fuse::Second, None) => fail(sqe, status::FUSED_MISSING),
            (Fuse::First | Fuse::Reserved, _) => fail(sqe, status::INVALID_FIELD),
            (Fuse::None, _) => nvm::execute(&self.subsystem.namespaces, sqe, data),
        };
        match held {
            Some((first, _)) => Outcome::Also(
                Completion::new(first.cid(), status::FUSED_MISSING),
                Box::new(outcome),
            ),
            None => outcome,
        }
    }

    fn fabrics(&mut self, sqe: &Sqe, data: &[u8]) -> Outcome {
        match sqe.fctype() {
            fctype::CONNECT => self.connect(sqe, data),
            crate::auth::FCTYPE_SEND | crate::auth::FCTYPE_RECEIVE => self.authenticate(sqe, data),
            fctype::PROPERTY_GET | fctype::PROPERTY_SET if !self.host_authenticated() => {
                fail(sqe, crate::auth::AUTH_REQUIRED)
            }
            fctype::PROPERTY_GET | fctype::PROPERTY_SET if self.qid == 0 => {
                let Some(id) = self.controller else {
                    return fail(sqe, status::SEQUENCE_ERROR);
                };
                self.property(id, sqe)
            }
            fctype::DISCONNECT => {
                self.disconnect();
                fail(sqe, Status::SUCCESS)
            }
            _ => fail(sqe, status::INVALID_OPCODE),
        }
    }

    /// Authentication Send and Receive: a step of the host's DH-HMAC-CHAP
    /// exchange ([`crate::auth`]).
    fn authenticate(&mut self, sqe: &Sqe, data: &[u8]) -> Outcome {
        let length = match crate::auth::command_length(sqe) {
            Ok(length) => length,
            Err(status) => return fail(sqe, status),
        };
        let Some(exchange) = self.auth.as_mut().filter(|_| self.controller.is_some()) else {
            return fail(sqe, status::SEQUENCE_ERROR);
        };
        if sqe.fctype() == crate::auth::FCTYPE_SEND {
            if data.len() < length {
                return fail(sqe, status::SGL_LENGTH_INVALID);
            }
            exchange.send(&data[..length]);
            return fail(sqe, Status::SUCCESS);
        }
        let message = exchange.receive(length);
        Outcome::Done {
            data: message,
            completion: Completion::new(sqe.cid(), Status::SUCCESS),
        }
    }

    fn connect(&mut self, sqe: &Sqe, data: &[u8]) -> Outcome {
        if self.controller.is_some() {
            return fail(sqe, status::SEQUENCE_ERROR);
        }
        if data.len() < CONNECT_DATA_BYTES {
            return fail(sqe, status::SGL_LENGTH_INVALID);
        }
        let bytes = &sqe.0;
        let field16 = |at| u16_at(bytes, at).unwrap_or_default();
        let (recfmt, qid, sq_size) = (field16(40), field16(42), field16(44));
        let kato_ms = u32_at(bytes, 48).unwrap_or_default();
        let sq_flow_disabled = bytes[46] & CATTR_DISABLE_SQ_FLOW != 0;
        if recfmt != 0 {
            return fail(sqe, status::CONNECT_INCOMPATIBLE_FORMAT);
        }
        let cntlid = u16_at(data, 16).unwrap_or_default();
        let subnqn = nqn_field(&data[256..512]);
        let hostnqn = nqn_field(&data[512..768]);
        // Invalid parameters name the offending field: IATTR (bit 0: in
        // the data) and IPO (the byte offset) in DW0.
        let invalid = |in_data: bool, offset: u32| {
            let mut c = Completion::new(sqe.cid(), status::CONNECT_INVALID_PARAMETERS);
            c.result = in_data as u32 | offset << 16;
            done(c)
        };
        let discovery = subnqn == DISCOVERY_NQN;
        if subnqn != self.subsystem.nqn && !discovery || discovery && qid != 0 {
            return invalid(true, 256);
        }
        if !self.subsystem.allowed_hosts.is_empty()
            && !self.subsystem.allowed_hosts.contains(&hostnqn)
        {
            return fail(sqe, status::CONNECT_INVALID_HOST);
        }
        if self.tls_host.as_ref().is_some_and(|h| *h != hostnqn) {
            log::warn!(
                "Connect as host {hostnqn} on a TLS connection whose key is {}'s: refused",
                self.tls_host.as_deref().unwrap_or_default()
            );
            return fail(sqe, status::CONNECT_INVALID_HOST);
        }
        if sq_size == 0 || sq_size >= QUEUE_ENTRIES {
            return invalid(false, 44);
        }
        let mut controllers = self.subsystem.controllers();
        let id = if qid == 0 {
            if controllers.live.len() >= MAX_CONTROLLERS {
                return fail(sqe, status::CONNECT_CONTROLLER_BUSY);
            }
            let id = controllers.allocate_id();
            controllers.live.insert(
                id,
                ControllerState {
                    host_nqn: hostnqn.clone(),
                    discovery,
                    cc: 0,
                    csts: 0,
                    io_queues: 0,
                    kato_ms,
                    async_event_config: 0,
                },
            );
            id
        } else {
            match controllers.live.get(&cntlid) {
                Some(c)
                    if c.host_nqn == hostnqn
                        && !c.discovery
                        && qid <= c.io_queues.max(1)
                        && c.csts & 1 == 1 =>
                {
                    cntlid
                }
                Some(_) => return invalid(false, 42),
                None => return invalid(true, 16),
            }
        };
        drop(controllers);
        self.controller = Some(id);
        self.qid = qid;
        self.counters = Some(self.subsystem.queues.register(id, qid));
        self.sq_flow_disabled = sq_flow_disabled;
        let mut c = Completion::new(sqe.cid(), Status::SUCCESS);
        c.result = id as u32;
        if let Some(secrets) = self.subsystem.dhchap.get(&hostnqn).filter(|_| !discovery) {
            self.auth = Some(crate::auth::Exchange::new(
                secrets.clone(),
                hostnqn.clone(),
                self.subsystem.nqn.clone(),
            ));
            c.result |= crate::auth::CONNECT_ATR;
        }
        c.sqid = qid;
        if sq_flow_disabled {
            log::debug!("queue {qid} of controller {id}: SQ flow control disabled");
            // No SQ head is reported on this queue.
            c.sqhd = 0xffff;
        }
        done(c)
    }

    /// Ends this queue; the admin queue's end ends its controller.
    pub fn disconnect(&mut self) {
        if let (Some(id), 0) = (self.controller.take(), self.qid) {
            self.subsystem.controllers().live.remove(&id);
        }
    }

    fn property(&mut self, id: u16, sqe: &Sqe) -> Outcome {
        let b = &sqe.0;
        let eight = b[40] & 7 == 1;
        let offset = u32_at(b, 44).unwrap_or_default();
        let value = u64_at(b, 48).unwrap_or_default();
        let mut controllers = self.subsystem.controllers();
        let Some(c) = controllers.live.get_mut(&id) else {
            return fail(sqe, status::SEQUENCE_ERROR);
        };
        let mut completion = Completion::new(sqe.cid(), Status::SUCCESS);
        if sqe.fctype() == fctype::PROPERTY_SET {
            match (offset, eight) {
                (property::CC, false) => {
                    c.cc = value as u32;
                    let enabled = c.cc & 1 == 1;
                    let shutdown = (c.cc >> 14) & 3 != 0;
                    c.csts = enabled as u32 | if shutdown { 2 << 2 } else { 0 };
                }
                _ => return fail(sqe, status::INVALID_FIELD),
            }
        } else {
            let value: u64 = match (offset, eight) {
                (property::CAP, true) => capabilities(),
                (property::VS, false) => VERSION as u64,
                (property::CC, false) => c.cc as u64,
                (property::CSTS, false) => c.csts as u64,
                _ => return fail(sqe, status::INVALID_FIELD),
            };
            completion.result = value as u32;
            completion.dw1 = (value >> 32) as u32;
        }
        done(completion)
    }

    fn is_discovery(&self, id: u16) -> bool {
        self.subsystem
            .controllers()
            .live
            .get(&id)
            .is_some_and(|c| c.discovery)
    }

    fn admin(&mut self, id: u16, sqe: &Sqe, _data: &[u8]) -> Outcome {
        match sqe.opcode() {
            admin::IDENTIFY => self.identify(id, sqe),
            admin::SET_FEATURES | admin::GET_FEATURES => self.features(id, sqe),
            admin::GET_LOG_PAGE => self.log_page(id, sqe),
            admin::KEEP_ALIVE => fail(sqe, Status::SUCCESS),
            admin::ASYNC_EVENT if self.held_aers < MAX_AERS => {
                self.held_aers += 1;
                Outcome::Held
            }
            // Asynchronous Event Request Limit Exceeded.
            admin::ASYNC_EVENT => fail(sqe, Status::new(1, 0x05, true)),
            admin::ABORT => {
                // Nothing is ever queued long enough to abort: "not aborted".
                let mut c = Completion::new(sqe.cid(), Status::SUCCESS);
                c.result = 1;
                done(c)
            }
            _ => fail(sqe, status::INVALID_OPCODE),
        }
    }

    fn identify(&self, id: u16, sqe: &Sqe) -> Outcome {
        let cns = sqe.cdw(10) as u8;
        let nsid = sqe.nsid();
        let mut page = vec![0u8; IDENTIFY_BYTES];
        let discovery = self.is_discovery(id);
        if discovery && cns != 0x01 {
            return fail(sqe, status::INVALID_FIELD);
        }
        match cns {
            0x00 => match self.subsystem.namespace(nsid) {
                Some(ns) => identify_namespace(ns, &mut page),
                None => return fail(sqe, status::INVALID_NAMESPACE),
            },
            0x01 => identify_controller(&self.subsystem, id, discovery, &mut page),
            0x02 => {
                let ids = (1..=self.subsystem.namespace_count()).filter(|&n| n > nsid);
                for (i, n) in ids.take(IDENTIFY_BYTES / 4).enumerate() {
                    page[4 * i..4 * i + 4].copy_from_slice(&n.to_le_bytes());
                }
            }
            0x03 => match self.subsystem.namespace(nsid) {
                Some(ns) => {
                    // One descriptor: type 3 (UUID), 16 bytes.
                    page[0] = 3;
                    page[1] = 16;
                    page[4..20].copy_from_slice(&ns.uuid);
                }
                None => return fail(sqe, status::INVALID_NAMESPACE),
            },
            _ => return fail(sqe, status::INVALID_FIELD),
        }
        Outcome::Done {
            data: page,
            completion: Completion::new(sqe.cid(), Status::SUCCESS),
        }
    }

    fn features(&mut self, id: u16, sqe: &Sqe) -> Outcome {
        let fid = sqe.cdw(10) as u8;
        let set = sqe.opcode() == admin::SET_FEATURES;
        let mut controllers = self.subsystem.controllers();
        let Some(c) = controllers.live.get_mut(&id) else {
            return fail(sqe, status::SEQUENCE_ERROR);
        };
        let mut completion = Completion::new(sqe.cid(), Status::SUCCESS);
        match fid {
            // Number of Queues: both counts 0's based; granted up to the limit.
            0x07 => {
                if set {
                    let asked = (sqe.cdw(11) as u16).max((sqe.cdw(11) >> 16) as u16);
                    if asked == 0xffff {
                        return fail(sqe, status::INVALID_FIELD);
                    }
                    c.io_queues = (asked + 1).min(MAX_IO_QUEUES);
                }
                let granted = c.io_queues.max(1) as u32 - 1;
                completion.result = granted | granted << 16;
            }
            // Asynchronous Event Configuration.
            0x0b => {
                if set {
                    c.async_event_config = sqe.cdw(11);
                }
                completion.result = c.async_event_config;
            }
            // Keep Alive Timer.
            0x0f => {
                if set {
                    c.kato_ms = sqe.cdw(11);
                }
                completion.result = c.kato_ms;
            }
            // Volatile Write Cache: the devices flush on Flush; reported on.
            0x06 => completion.result = 1,
            _ => return fail(sqe, status::INVALID_FIELD),
        }
        done(completion)
    }

    fn log_page(&self, id: u16, sqe: &Sqe) -> Outcome {
        let lid = sqe.cdw(10) as u8;
        let dwords = ((sqe.cdw(10) >> 16) | (sqe.cdw(11) & 0xffff) << 16) as usize + 1;
        let offset = sqe.cdw(12) as u64 | (sqe.cdw(13) as u64) << 32;
        let len = dwords * 4;
        if len > MAX_TRANSFER_BYTES {
            return fail(sqe, status::INVALID_FIELD);
        }
        let page: Vec<u8> = match lid {
            DISCOVERY_LOG if self.is_discovery(id) => discovery_log(&self.subsystem),
            // Error information: no errors logged (64-byte entries).
            0x01 => vec![0u8; 64],
            // SMART / health: all zero but the temperature (273 + 20 K).
            0x02 => {
                let mut p = vec![0u8; 512];
                p[1..3].copy_from_slice(&293u16.to_le_bytes());
                p
            }
            // Commands supported and effects: CSUPP for each command served.
            0x05 => {
                let mut p = vec![0u8; 4096];
                for op in [0x02u8, 0x06, 0x08, 0x09, 0x0a, 0x0c, 0x18] {
                    p[4 * op as usize] = 1;
                }
                for op in [
                    opcode::FLUSH,
                    opcode::WRITE,
                    opcode::READ,
                    opcode::COMPARE,
                    opcode::WRITE_ZEROES,
                    opcode::DATASET_MANAGEMENT,
                    opcode::COPY,
                    opcode::COPY_ACROSS,
                    opcode::MULTICAST,
                    opcode::ADD_WRITE,
                ] {
                    let at = 1024 + 4 * op as usize;
                    p[at] = 1;
                    // LBCC: the command changes logical block contents.
                    if !matches!(op, opcode::READ | opcode::COMPARE | opcode::FLUSH) {
                        p[at] |= 2;
                    }
                }
                p
            }
            _ => return fail(sqe, status::INVALID_FIELD),
        };
        let mut data = vec![0u8; len];
        let from = (offset as usize).min(page.len());
        let n = (page.len() - from).min(len);
        data[..n].copy_from_slice(&page[from..from + n]);
        Outcome::Done {
            data,
            completion: Completion::new(sqe.cid(), Status::SUCCESS),
        }
    }
}
