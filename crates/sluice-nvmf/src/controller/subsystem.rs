//! The subsystem: its namespaces, the controllers hosts made in it, and
//! the figures the node reports of them.

use super::{DEFAULT_IN_CAPSULE_BYTES, IN_CAPSULE_BYTES};
use crate::namespace::uuid_of;
use crate::namespace::{Namespace, MAX_TRANSFER_BYTES};
use sluice_io::codec::u64_at;
use std::collections::HashMap;
use std::sync::Mutex;

/// The subsystem the node serves: its name, its namespaces (NSID 1…N in
/// the order given) and its controllers.
pub struct Subsystem {
    /// The subsystem's NQN.
    pub nqn: String,
    /// Serial number reported in Identify Controller.
    pub serial: String,
    pub(super) namespaces: Vec<Namespace>,
    controllers: Mutex<Controllers>,
    /// Host NQNs allowed to connect; empty: any.
    pub(super) allowed_hosts: Vec<String>,
    /// Where hosts reach the subsystem, for the discovery log.
    pub(super) address: Option<std::net::SocketAddr>,
    /// TLS at that address: `None` none, `Some(true)` required,
    /// `Some(false)` on offer.
    pub(super) tls_required: Option<bool>,
    /// In-capsule data a command capsule may carry (IOCCSZ − 64 bytes).
    pub(super) in_capsule_bytes: usize,
    /// Where the data of plain writes was received.
    write_data: WriteDataCounters,
    /// The connected queues' command counters.
    pub(super) queues: crate::queue_figures::QueueRegistry,
    /// How long the admin queue of a controller whose host asked for no
    /// keep-alive (KATO 0) may stay silent before the controller ends.
    pub(super) unkept_silence: std::time::Duration,
    /// Hosts that must authenticate (DH-HMAC-CHAP), with their secrets.
    pub(super) dhchap: HashMap<String, crate::auth::HostSecrets>,
}

/// The default silence a controller without keep-alive (KATO 0) is
/// allowed: Linux nvmet's keep-alive for discovery controllers, 120 s.
pub const DEFAULT_UNKEPT_SILENCE: std::time::Duration = std::time::Duration::from_secs(120);

/// What a node reports about itself ([`Subsystem::figures`]).
#[derive(Debug, Clone)]
pub struct NodeFigures {
    /// Per namespace, in NSID order.
    pub namespaces: Vec<NamespaceFigures>,
    /// Per live controller, in id order.
    pub controllers: Vec<ControllerFigures>,
    /// Where write data was received.
    pub write_data: WriteDataBytes,
    /// Per connected queue, by controller and queue id.
    pub queues: Vec<crate::queue_figures::QueueFigures>,
}

/// One namespace's figures.
#[derive(Debug, Clone)]
pub struct NamespaceFigures {
    /// Its namespace id.
    pub nsid: u32,
    /// Its size.
    pub size_bytes: u64,
    /// Its device's I/O by priority class (none for a device that does not
    /// count).
    pub io: Option<sluice_io::IoCountsSnapshot>,
}

/// One live controller's figures.
#[derive(Debug, Clone)]
pub struct ControllerFigures {
    /// Its controller id.
    pub id: u16,
    /// The host that made it.
    pub host_nqn: String,
    /// A discovery controller (no I/O queues).
    pub discovery: bool,
    /// I/O queues granted to it.
    pub io_queues: u16,
}

/// Bytes of plain writes' data (NVMe/TCP's Write and MultiCast, in the
/// capsule or in H2CData, and NBD's block-aligned writes) by where they
/// were received: straight into the write's pinned
/// buffer, or into a connection's receive buffer first and copied from
/// there (bytes that came with the PDU's header in one read).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WriteDataBytes {
    /// Read from the socket into the pinned buffer the device writes from.
    pub direct: u64,
    /// Copied from a receive buffer.
    pub staged: u64,
}

#[derive(Debug, Default)]
struct WriteDataCounters {
    direct: std::sync::atomic::AtomicU64,
    staged: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
pub(super) struct Controllers {
    next_id: u16,
    pub(super) live: HashMap<u16, ControllerState>,
}

/// Highest controller id (0xFFF0 and up are reserved).
pub(super) const MAX_CONTROLLER_ID: u16 = 0xffef;

impl Controllers {
    /// The next id no live controller has, in turn from 1 to 0xFFEF (the
    /// caller keeps fewer than that many alive).
    pub(super) fn allocate_id(&mut self) -> u16 {
        loop {
            let id = self.next_id.clamp(1, MAX_CONTROLLER_ID);
            self.next_id = if id == MAX_CONTROLLER_ID { 1 } else { id + 1 };
            if !self.live.contains_key(&id) {
                return id;
            }
        }
    }
}

/// What a controller keeps between its queues' commands.
#[derive(Debug, Clone)]
pub(super) struct ControllerState {
    pub(super) host_nqn: String,
    /// A discovery controller (no namespaces, no I/O queues; the
    /// discovery log).
    pub(super) discovery: bool,
    pub(super) cc: u32,
    pub(super) csts: u32,
    pub(super) io_queues: u16,
    pub(super) kato_ms: u32,
    pub(super) async_event_config: u32,
}

impl Subsystem {
    /// A subsystem named `nqn` over `namespaces`; `allowed_hosts` empty lets
    /// any host connect.
    pub fn new(nqn: String, namespaces: Vec<Namespace>, allowed_hosts: Vec<String>) -> Subsystem {
        let serial = format!("{:016x}", u64_at(&uuid_of(&nqn), 0).unwrap_or_default());
        Subsystem {
            nqn,
            serial,
            namespaces,
            controllers: Mutex::new(Controllers {
                next_id: 1,
                live: HashMap::new(),
            }),
            allowed_hosts,
            address: None,
            tls_required: None,
            in_capsule_bytes: DEFAULT_IN_CAPSULE_BYTES,
            write_data: WriteDataCounters::default(),
            queues: Default::default(),
            unkept_silence: DEFAULT_UNKEPT_SILENCE,
            dhchap: HashMap::new(),
        }
    }

    /// Hosts that must authenticate with DH-HMAC-CHAP on every queue, with
    /// their secrets. When hosts are named ([`Subsystem::new`]'s
    /// `allowed_hosts`), these are admitted too.
    pub fn with_dhchap(mut self, secrets: HashMap<String, crate::auth::HostSecrets>) -> Subsystem {
        if !self.allowed_hosts.is_empty() {
            for host in secrets.keys() {
                if !self.allowed_hosts.contains(host) {
                    self.allowed_hosts.push(host.clone());
                }
            }
        }
        self.dhchap = secrets;
        self
    }

    /// Sets how long a controller whose host asked for no keep-alive
    /// (KATO 0) may stay silent on its admin queue: without a limit, a
    /// host that went away without closing would hold one of the
    /// [`MAX_CONTROLLERS`] for ever.
    pub fn with_unkept_silence(mut self, silence: std::time::Duration) -> Subsystem {
        self.unkept_silence = silence;
        self
    }

    /// What the node reports about itself (`sluice node --metrics`): each
    /// namespace's size and device I/O, each live controller's host and
    /// queues, and where write data was received.
    pub fn figures(&self) -> NodeFigures {
        let namespaces = self
            .namespaces
            .iter()
            .enumerate()
            .map(|(i, ns)| NamespaceFigures {
                nsid: i as u32 + 1,
                size_bytes: ns.block_count * ns.block_size_bytes as u64,
                io: ns.io.device().io_counts().map(|c| c.snapshot()),
            })
            .collect();
        let controllers = {
            let controllers = self.controllers.lock().unwrap_or_else(|e| e.into_inner());
            let mut live: Vec<ControllerFigures> = controllers
                .live
                .iter()
                .map(|(&id, state)| ControllerFigures {
                    id,
                    host_nqn: state.host_nqn.clone(),
                    discovery: state.discovery,
                    io_queues: state.io_queues,
                })
                .collect();
            live.sort_by_key(|c| c.id);
            live
        };
        NodeFigures {
            namespaces,
            controllers,
            write_data: self.write_data_bytes(),
            queues: self.queues.figures(),
        }
    }

    /// Where the data of plain writes has been received so far.
    pub fn write_data_bytes(&self) -> WriteDataBytes {
        use std::sync::atomic::Ordering::Relaxed;
        WriteDataBytes {
            direct: self.write_data.direct.load(Relaxed),
            staged: self.write_data.staged.load(Relaxed),
        }
    }

    /// Counts `bytes` of a write's data received straight into its pinned
    /// buffer (`direct`) or copied from a receive buffer.
    pub(crate) fn count_write_data(&self, bytes: usize, direct: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        let counter = if direct {
            &self.write_data.direct
        } else {
            &self.write_data.staged
        };
        counter.fetch_add(bytes as u64, Relaxed);
    }

    /// Sets the in-capsule data a command capsule may carry (reported as
    /// IOCCSZ; more in one capsule ends the connection with Data Transfer
    /// Limit Exceeded): a whole number of 16-byte units from
    /// [`IN_CAPSULE_BYTES`] to [`MAX_TRANSFER_BYTES`].
    pub fn with_in_capsule_bytes(mut self, bytes: usize) -> Result<Subsystem, String> {
        if !(IN_CAPSULE_BYTES..=MAX_TRANSFER_BYTES).contains(&bytes) || !bytes.is_multiple_of(16) {
            return Err(format!(
                "in-capsule data of {bytes} bytes: give a multiple of 16 from {IN_CAPSULE_BYTES} to {MAX_TRANSFER_BYTES} (8 to 128 KiB)"
            ));
        }
        self.in_capsule_bytes = bytes;
        Ok(self)
    }

    /// In-capsule data a command capsule may carry.
    pub fn in_capsule_bytes(&self) -> usize {
        self.in_capsule_bytes
    }

    /// Says in the discovery log that the subsystem's address speaks TLS
    /// 1.3, and whether hosts must use it.
    pub fn with_tls(mut self, required: bool) -> Subsystem {
        self.tls_required = Some(required);
        self
    }

    /// Sets where hosts reach the subsystem over NVMe/TCP: the discovery
    /// log's one entry names it.
    pub fn with_address(mut self, address: std::net::SocketAddr) -> Subsystem {
        self.address = Some(address);
        self
    }

    /// Namespaces served.
    pub fn namespace_count(&self) -> u32 {
        self.namespaces.len() as u32
    }

    pub(crate) fn namespace(&self, nsid: u32) -> Option<&Namespace> {
        (nsid as usize)
            .checked_sub(1)
            .and_then(|i| self.namespaces.get(i))
    }

    pub(super) fn controllers(&self) -> std::sync::MutexGuard<'_, Controllers> {
        self.controllers.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_ids_wrap_and_skip_live_ones() {
        let mut c = Controllers {
            next_id: MAX_CONTROLLER_ID - 1,
            live: HashMap::new(),
        };
        let state = ControllerState {
            host_nqn: String::new(),
            discovery: false,
            cc: 0,
            csts: 0,
            io_queues: 0,
            kato_ms: 0,
            async_event_config: 0,
        };
        c.live.insert(1, state.clone());
        assert_eq!(c.allocate_id(), MAX_CONTROLLER_ID - 1);
        assert_eq!(c.allocate_id(), MAX_CONTROLLER_ID);
        assert_eq!(c.allocate_id(), 2, "wrapped, and 1 is alive");
        assert_eq!(c.allocate_id(), 3);
    }
}
