//! The node's namespaces: each a Sluice device with its I/O path, found by
//! NSID; what commands may move at once (MDTS); the gate that lets a fused
//! Compare-and-Write run alone.

use sluice_io::{Device, DeviceIo, EngineConfig};
use std::sync::{Arc, Condvar, Mutex};

/// Most data of one command: 2^MDTS pages of 4 KiB.
pub const MDTS: u8 = 5;
/// Most data of one command, in bytes (128 KiB).
pub const MAX_TRANSFER_BYTES: usize = 4096 << MDTS;

/// How long a namespace's I/O polls for a completion before it sleeps
/// (`EngineConfig::spin_wait_us`): longer than a 4 KiB read of a fast
/// device takes and than a batch of 32 takes at this VM's disk (about 300
/// µs), short enough that a slow device's wait is mostly asleep.
pub const DEVICE_SPIN_WAIT_US: u32 = 600;

/// One namespace: a device and the I/O path to it.
pub struct Namespace {
    pub(crate) io: DeviceIo,
    pub(crate) block_size_bytes: u32,
    pub(crate) block_count: u64,
    pub(crate) uuid: [u8; 16],
    /// Writes share it; a fused Compare-and-Write holds it alone.
    writes: WriteGate,
}

impl Namespace {
    /// A namespace over `device`, its I/O through sluice-io's engines.
    pub fn new(device: Arc<dyn Device>) -> sluice_io::Result<Namespace> {
        let geometry = device.geometry();
        let uuid = uuid_of(&device.describe());
        // A connection waits on one command at a time: polling for the
        // device's completion saves it a sleep and a wake-up per command.
        let config = EngineConfig {
            spin_wait_us: DEVICE_SPIN_WAIT_US,
            ..EngineConfig::default()
        };
        let io = DeviceIo::open(device, config)?;
        Ok(Namespace {
            io,
            block_size_bytes: geometry.block_size_bytes,
            block_count: geometry.block_count,
            uuid,
            writes: WriteGate::default(),
        })
    }

    /// Held by every write while it writes.
    pub(crate) fn shared_writes(&self) -> SharedWrite<'_> {
        self.writes.shared();
        SharedWrite(&self.writes)
    }

    /// Held by a fused Compare-and-Write from its compare to its write.
    pub(crate) fn exclusive_writes(&self) -> ExclusiveWrite<'_> {
        self.writes.exclusive();
        ExclusiveWrite(&self.writes)
    }

    /// A share of the write gate for a write that outlives this call (a
    /// write in flight on a connection's own engine), or `false` while a
    /// Compare-and-Write holds or waits for the gate. Each `true` must be
    /// matched by one [`Namespace::end_write_in_flight`].
    pub(crate) fn begin_write_in_flight(&self) -> bool {
        self.writes.try_shared()
    }

    /// Gives back the share [`Namespace::begin_write_in_flight`] took.
    pub(crate) fn end_write_in_flight(&self) {
        self.writes.release_shared();
    }
}

/// A namespace's write gate: writes share it, a fused Compare-and-Write
/// holds it alone. Unlike a lock guard, a share may be taken by one call
/// and given back by another (a write in flight), and a waiting
/// Compare-and-Write keeps new writes out so a stream of writes cannot
/// starve it.
#[derive(Default)]
struct WriteGate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    shared: usize,
    exclusive: bool,
    exclusive_waiting: usize,
}

impl WriteGate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn try_shared(&self) -> bool {
        let mut st = self.lock();
        if st.exclusive || st.exclusive_waiting > 0 {
            return false;
        }
        st.shared += 1;
        true
    }

    fn shared(&self) {
        let mut st = self.lock();
        while st.exclusive || st.exclusive_waiting > 0 {
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.shared += 1;
    }

    fn release_shared(&self) {
        let mut st = self.lock();
        assert!(st.shared > 0, "a write share given back twice");
        st.shared -= 1;
        if st.shared == 0 {
            self.changed.notify_all();
        }
    }

    fn exclusive(&self) {
        let mut st = self.lock();
        st.exclusive_waiting += 1;
        while st.exclusive || st.shared > 0 {
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.exclusive_waiting -= 1;
        st.exclusive = true;
    }

    fn release_exclusive(&self) {
        let mut st = self.lock();
        assert!(st.exclusive, "an exclusive hold given back twice");
        st.exclusive = false;
        self.changed.notify_all();
    }
}

/// A write's share of its namespace's gate, given back when dropped.
pub(crate) struct SharedWrite<'a>(&'a WriteGate);

impl Drop for SharedWrite<'_> {
    fn drop(&mut self) {
        self.0.release_shared();
    }
}

/// A Compare-and-Write's hold of its namespace's gate, given back when
/// dropped.
pub(crate) struct ExclusiveWrite<'a>(&'a WriteGate);

impl Drop for ExclusiveWrite<'_> {
    fn drop(&mut self) {
        self.0.release_exclusive();
    }
}

/// A stable identifier from the device's description (a version 4 UUID's
/// layout over two FNV-1a hashes).
pub(crate) fn uuid_of(name: &str) -> [u8; 16] {
    let fnv = |seed: u64| {
        name.bytes()
            .fold(seed, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
    };
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&fnv(0xcbf2_9ce4_8422_2325).to_le_bytes());
    out[8..].copy_from_slice(&fnv(0x8422_2325_cbf2_9ce4).to_le_bytes());
    out[6] = (out[6] & 0x0f) | 0x40;
    out[8] = (out[8] & 0x3f) | 0x80;
    out
}

/// The namespace `nsid` names (1…N, in the order the node was given them).
pub(crate) fn by_nsid(namespaces: &[Namespace], nsid: u32) -> Option<&Namespace> {
    (nsid as usize)
        .checked_sub(1)
        .and_then(|i| namespaces.get(i))
}
