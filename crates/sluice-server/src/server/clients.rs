//! Every connected client, for CLIENT LIST / INFO / KILL, and the way a
//! command on one worker closes a client on another: a kill queue per
//! worker, drained on its next turn (its waker ends any wait).

use sluice_io::net::{ConnId, Waker};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What CLIENT LIST shows of one client.
#[derive(Clone)]
pub struct ClientEntry {
    /// The client's address.
    pub addr: String,
    /// The server's address of the connection.
    pub laddr: String,
    /// CLIENT SETNAME's name.
    pub name: Vec<u8>,
    /// The ACL user it runs as.
    pub user: Vec<u8>,
    /// CLIENT SETINFO's library name and version.
    pub lib_name: Vec<u8>,
    /// See `lib_name`.
    pub lib_ver: Vec<u8>,
    /// When it connected.
    pub created: Instant,
    /// The worker serving it, and its slot there.
    pub worker: usize,
    /// Its slot on the worker.
    pub slot: ConnId,
    /// The logical database it selected.
    pub db: u8,
    /// Its worker's push queue (pub/sub messages, invalidations).
    pub(super) pushes: Arc<super::pubsub::PushQueue>,
    /// What CLIENT LIST shows of it that changes with every command.
    pub(super) live: Arc<ClientLive>,
}

/// What CLIENT LIST shows of a client that changes as it runs. Only its
/// worker writes it (relaxed stores after each command: no other thread
/// waits on them); a listing reads it.
#[derive(Debug)]
pub(super) struct ClientLive {
    /// The last command run, as its id in ACL's table + 1 (0: none yet).
    pub(super) last_command: AtomicU32,
    /// When it last sent or was sent anything, in ms since the server
    /// started.
    pub(super) last_interaction_ms: AtomicU64,
    /// Channels, patterns and shard channels it is subscribed to.
    pub(super) channels: AtomicU32,
    pub(super) patterns: AtomicU32,
    pub(super) shard_channels: AtomicU32,
    /// Commands queued in MULTI (-1: not in MULTI).
    pub(super) multi: AtomicI32,
    /// CLIENT LIST's flags, as bits of [`FLAGS`].
    pub(super) flags: AtomicU32,
    /// The descriptor of its socket (-1: shared memory).
    pub(super) fd: i32,
}

/// CLIENT LIST's flag letters Sluice shows, in the order Redis prints them, and the
/// bits `ClientLive::flags` keeps them by.
pub(super) const FLAGS: &[(u32, char)] = &[
    (FLAG_MONITOR, 'O'),
    (FLAG_PUBSUB, 'P'),
    (FLAG_MULTI, 'x'),
    (FLAG_BLOCKED, 'b'),
    (FLAG_TRACKING, 't'),
    (FLAG_CLOSE_AFTER_REPLY, 'c'),
];
pub(super) const FLAG_MONITOR: u32 = 1 << 0;
pub(super) const FLAG_PUBSUB: u32 = 1 << 1;
pub(super) const FLAG_MULTI: u32 = 1 << 2;
pub(super) const FLAG_BLOCKED: u32 = 1 << 3;
pub(super) const FLAG_TRACKING: u32 = 1 << 4;
pub(super) const FLAG_CLOSE_AFTER_REPLY: u32 = 1 << 5;

impl ClientLive {
    pub(super) fn new(fd: i32, now_ms: u64) -> ClientLive {
        ClientLive {
            last_command: AtomicU32::new(0),
            last_interaction_ms: AtomicU64::new(now_ms),
            channels: AtomicU32::new(0),
            patterns: AtomicU32::new(0),
            shard_channels: AtomicU32::new(0),
            multi: AtomicI32::new(-1),
            flags: AtomicU32::new(0),
            fd,
        }
    }

    /// CLIENT LIST's `flags=` field: the letters of the flags set, or N.
    pub(super) fn flag_letters(&self) -> String {
        let bits = self.flags.load(Ordering::Relaxed);
        let letters: String = FLAGS
            .iter()
            .filter(|(bit, _)| bits & bit != 0)
            .map(|(_, c)| *c)
            .collect();
        if letters.is_empty() {
            "N".into()
        } else {
            letters
        }
    }
}

/// A worker's queue of clients to close. On lines of its own: the worker
/// loads `pending` every turn, and a neighbour written by another thread
/// would make that load a miss.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(super) struct KillQueue {
    pending: AtomicBool,
    /// (slot, client id): the id tells a reused slot from the client.
    slots: Mutex<Vec<(ConnId, u64)>>,
}

impl KillQueue {
    /// Takes the slots to close, if any (one atomic load when none).
    pub(super) fn take(&self) -> Vec<(ConnId, u64)> {
        // A load first: the swap's locked write would cost every turn.
        if !self.pending.load(Ordering::Relaxed) || !self.pending.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        std::mem::take(&mut *self.slots.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The registry of connected clients.
#[derive(Default)]
pub struct Clients {
    by_id: Mutex<HashMap<u64, ClientEntry>>,
    workers: Mutex<Vec<(Arc<KillQueue>, Arc<Waker>)>>,
}

impl Clients {
    /// A worker's kill queue, registered with its waker; returns its index.
    pub(super) fn add_worker(&self, waker: Arc<Waker>) -> (usize, Arc<KillQueue>) {
        let mut w = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        let queue = Arc::new(KillQueue::default());
        w.push((queue.clone(), waker));
        (w.len() - 1, queue)
    }

    pub(super) fn insert(&self, id: u64, entry: ClientEntry) {
        self.lock().insert(id, entry);
    }

    pub(super) fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Changes client `id`'s entry.
    pub(super) fn update(&self, id: u64, change: impl FnOnce(&mut ClientEntry)) {
        if let Some(e) = self.lock().get_mut(&id) {
            change(e);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, ClientEntry>> {
        self.by_id.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Leaves `push` for client `id` with its worker; false if no such
    /// client is connected.
    pub(super) fn post(&self, id: u64, push: super::tracking::Push) -> bool {
        let target = self.lock().get(&id).map(|e| (e.slot, e.pushes.clone()));
        match target {
            Some((slot, queue)) => {
                queue.post((slot, id, push));
                true
            }
            None => false,
        }
    }

    /// Every client, by id.
    pub fn list(&self) -> Vec<(u64, ClientEntry)> {
        let mut v: Vec<(u64, ClientEntry)> =
            self.lock().iter().map(|(k, e)| (*k, e.clone())).collect();
        v.sort_by_key(|(id, _)| *id);
        v
    }

    /// Client `id`'s entry.
    pub fn get(&self, id: u64) -> Option<ClientEntry> {
        self.lock().get(&id).cloned()
    }

    /// Closes every client `matches` picks; returns how many. They leave
    /// the registry at once, as Redis frees a killed client at once: its
    /// worker closes the connection on its next turn, and a kill or a list
    /// meanwhile no longer finds it.
    pub(super) fn kill(&self, matches: impl Fn(u64, &ClientEntry) -> bool) -> usize {
        let victims: Vec<(usize, ConnId, u64)> = {
            let mut by_id = self.lock();
            let picked: Vec<(usize, ConnId, u64)> = by_id
                .iter()
                .filter(|(id, e)| matches(**id, e))
                .map(|(id, e)| (e.worker, e.slot, *id))
                .collect();
            for (_, _, id) in &picked {
                by_id.remove(id);
            }
            picked
        };
        let workers = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        for &(worker, slot, id) in &victims {
            if let Some((queue, waker)) = workers.get(worker) {
                queue
                    .slots
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((slot, id));
                queue.pending.store(true, Ordering::Release);
                waker.wake();
            }
        }
        victims.len()
    }
}
