//! Clients blocked on keys (BLPOP and its kind), without a thread per
//! waiter: a blocked connection is a state its worker keeps; the
//! registry here lists, per key, the connections waiting on it in the
//! order they blocked.
//!
//! A command that writes a key someone waits on signals it after it
//! commits; the signal wakes the first waiter only (through its worker's
//! wake queue). That waiter runs its command again: served, it leaves
//! the registry and signals its keys for the next waiter; not served
//! (someone else took the item), it keeps its place. A waiter that times
//! out or disconnects leaves and signals its keys too, so a wake it did
//! not use passes on. Redis serves waiters in the order they blocked; so
//! does this.
//!
//! No wake-up is lost: a client registers while it holds its keys'
//! stripe locks, after finding them empty, and a writer signals after
//! its commit, which needed those locks.
//!
//! Redis serves a woken client right after the command that woke it,
//! before the writer's next pipelined command (a second LPUSH answers 1,
//! not 2, when the first one's item went to a waiter). Here each wake is
//! remembered until its waiter has run its command again
//! ([`Blocking::retried`]); the connection whose write woke it goes on
//! only after that, or after [`WAKE_WAIT`] (`Blocking::any_in_flight`).

use sluice_io::net::ConnId;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The registry's key of `key` in logical database `db`: a write wakes
/// only the clients waiting on its key in its database.
pub(super) fn waited_key(db: u8, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + key.len());
    k.push(db);
    k.extend_from_slice(key);
    k
}

/// What a wake-up asks of a blocked connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wake {
    /// Run the command again: its keys were written.
    Retry,
    /// CLIENT UNBLOCK: answer as a timeout, or (`error`) with Redis's
    /// UNBLOCKED error.
    Unblock { error: bool },
}

/// Where a worker takes the wake-ups of its blocked connections:
/// (slot, ticket, what); the ticket tells a blocking from a later one.
pub(super) type WakeQueue = super::mailbox::Mailbox<(ConnId, u64, Wake)>;

/// The longest a connection whose write woke a waiter holds its next
/// command back for the waiter to run first (a waiter on another worker
/// is served within microseconds; this bounds a lost one).
pub(super) const WAKE_WAIT: std::time::Duration = std::time::Duration::from_millis(5);

/// One connection waiting on a key.
#[derive(Clone)]
struct Waiter {
    ticket: u64,
    slot: ConnId,
    queue: Arc<WakeQueue>,
}

/// Every key someone waits on, with its waiters in blocking order.
#[derive(Default)]
pub struct Blocking {
    by_key: Mutex<HashMap<Vec<u8>, VecDeque<Waiter>>>,
    /// The blocked clients by client id, and their ids by ticket (CLIENT
    /// UNBLOCK finds a client by id).
    by_client: Mutex<Clients>,
    /// Connections blocked now (a command that writes checks this first).
    blocked: AtomicUsize,
    next_ticket: AtomicU64,
    /// Tickets woken to run again that have not yet (at most one entry
    /// per waiter: a waiter has one ticket).
    in_flight: Mutex<Vec<u64>>,
}

#[derive(Default)]
struct Clients {
    waiters: HashMap<u64, Waiter>,
    by_ticket: HashMap<u64, u64>,
}

/// The ticket of a connection blocked on no key (WAIT): never given to a
/// registered waiter.
pub(super) const NO_TICKET: u64 = u64::MAX;

/// What a blocked connection waits with.
#[derive(Debug, Clone)]
pub(super) struct Blocked {
    /// The command, run again when woken.
    pub(super) args: crate::resp::Args,
    /// The keys it waits on.
    pub(super) keys: Vec<Vec<u8>>,
    /// When it gives up (None: never).
    pub(super) deadline: Option<Instant>,
    /// Its place in the registry.
    pub(super) ticket: u64,
}

impl Waiter {
    /// Asks the waiter's worker to run its command again, remembered in
    /// `in_flight` until it has.
    fn wake(&self, in_flight: &Mutex<Vec<u64>>) {
        let mut woken = in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if !woken.contains(&self.ticket) {
            woken.push(self.ticket);
        }
        drop(woken);
        self.queue.post((self.slot, self.ticket, Wake::Retry));
    }
}

impl Blocking {
    /// Marks waiter `ticket`'s wake done: it ran its command again, left,
    /// or was gone when the wake came.
    pub(super) fn retried(&self, ticket: u64) {
        let mut woken = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        woken.retain(|&t| t != ticket);
    }

    /// Whether any of `tickets` is woken and has not run yet.
    pub(super) fn any_in_flight(&self, tickets: &[u64]) -> bool {
        let woken = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        tickets.iter().any(|t| woken.contains(t))
    }

    /// Whether anyone is blocked (one load).
    pub(super) fn any(&self) -> bool {
        self.blocked.load(Ordering::Acquire) > 0
    }

    /// Connections blocked now.
    pub fn blocked_clients(&self) -> usize {
        self.blocked.load(Ordering::Relaxed)
    }

    /// Registers connection `slot` of the worker whose queue is `queue` as
    /// waiting on `keys`; returns its ticket. The caller holds the keys'
    /// stripe locks and found them empty.
    pub(super) fn register(
        &self,
        keys: &[Vec<u8>],
        client: u64,
        slot: ConnId,
        queue: &Arc<WakeQueue>,
    ) -> u64 {
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed) + 1;
        let waiter = Waiter {
            ticket,
            slot,
            queue: queue.clone(),
        };
        {
            let mut clients = self.by_client.lock().unwrap_or_else(|p| p.into_inner());
            clients.waiters.insert(client, waiter.clone());
            clients.by_ticket.insert(ticket, client);
        }
        let mut by_key = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        for key in keys {
            let waiters = by_key.entry(key.clone()).or_default();
            if !waiters.iter().any(|w| w.ticket == ticket) {
                waiters.push_back(waiter.clone());
            }
        }
        self.blocked.fetch_add(1, Ordering::AcqRel);
        ticket
    }

    /// Removes the waiter `ticket` from `keys` and wakes whoever is first
    /// on them now (the item it was woken for, or left, goes on).
    pub(super) fn leave(&self, keys: &[Vec<u8>], ticket: u64) {
        let mut by_key = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        let mut was_there = false;
        for key in keys {
            if let Some(waiters) = by_key.get_mut(key) {
                let before = waiters.len();
                waiters.retain(|w| w.ticket != ticket);
                was_there |= waiters.len() != before;
                match waiters.front() {
                    Some(first) => first.wake(&self.in_flight),
                    None => {
                        by_key.remove(key);
                    }
                }
            }
        }
        drop(by_key);
        self.retried(ticket);
        let mut clients = self.by_client.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(client) = clients.by_ticket.remove(&ticket) {
            if clients
                .waiters
                .get(&client)
                .is_some_and(|w| w.ticket == ticket)
            {
                clients.waiters.remove(&client);
            }
        }
        drop(clients);
        if was_there {
            self.blocked.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// CLIENT UNBLOCK: asks client `client`'s worker to answer its blocked
    /// command now; false when the client is not blocked.
    pub(super) fn unblock(&self, client: u64, error: bool) -> bool {
        let clients = self.by_client.lock().unwrap_or_else(|p| p.into_inner());
        match clients.waiters.get(&client) {
            Some(w) => {
                w.queue.post((w.slot, w.ticket, Wake::Unblock { error }));
                true
            }
            None => false,
        }
    }

    /// Wakes the first waiter of each of `keys` (after a write to them);
    /// the tickets woken go into `woken`.
    pub(super) fn signal<'a>(&self, keys: impl Iterator<Item = &'a [u8]>, woken: &mut Vec<u64>) {
        let by_key = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        for key in keys {
            if let Some(first) = by_key.get(key).and_then(VecDeque::front) {
                // Once per waiter, however many of its keys were written.
                if !woken.contains(&first.ticket) {
                    first.wake(&self.in_flight);
                    woken.push(first.ticket);
                }
            }
        }
    }

    /// Wakes the first waiter of every key of logical databases `dbs`
    /// (SWAPDB: what each key holds may have changed).
    pub(super) fn signal_databases(&self, dbs: &[u8]) {
        let by_key = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        for (key, waiters) in by_key.iter() {
            let in_one = key.first().is_some_and(|db| dbs.contains(db));
            if let Some(first) = waiters.front().filter(|_| in_one) {
                first.wake(&self.in_flight);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> Arc<WakeQueue> {
        let ring = sluice_io::net::NetRing::new(sluice_io::net::NetRingConfig::default()).unwrap();
        WakeQueue::new(ring.waker())
    }

    #[test]
    fn a_signal_wakes_the_first_waiter_and_leaving_passes_it_on() {
        let b = Blocking::default();
        let q = queue();
        let k = vec![b"k".to_vec()];
        let first = b.register(&k, 11, 1, &q);
        let second = b.register(&k, 12, 2, &q);
        assert!(b.any());
        let mut woken = Vec::new();
        b.signal([&b"k"[..]].into_iter(), &mut woken);
        assert_eq!(woken, vec![first]);
        assert!(b.any_in_flight(&[first]), "woken, not yet run again");
        assert_eq!(q.take(), vec![(1, first, Wake::Retry)]);
        b.leave(&k, first);
        assert!(!b.any_in_flight(&[first]), "left: its wake is done");
        assert_eq!(q.take(), vec![(2, second, Wake::Retry)]);
        assert!(!b.unblock(11, false), "client 11 left");
        assert!(b.unblock(12, true));
        assert_eq!(q.take(), vec![(2, second, Wake::Unblock { error: true })]);
        b.leave(&k, second);
        assert!(!b.unblock(12, true));
        assert!(q.take().is_empty());
        assert!(!b.any());
        assert!(b.by_key.lock().unwrap().is_empty());
        // A key nobody waits on: no wake.
        let mut woken = Vec::new();
        b.signal([&b"other"[..]].into_iter(), &mut woken);
        assert!(q.take().is_empty() && woken.is_empty());
    }
}
