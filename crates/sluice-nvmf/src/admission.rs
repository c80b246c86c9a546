//! Admission of the node's connections: each counted against the accept
//! loop's limit while it lives ([`Counted`]), and those still setting up
//! held in [`SetupSlots`], the oldest closed to make room.

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// A connection counted against the accept loop's limit until this
/// drops (with the connection, wherever it is served); while it is still
/// setting up (no NVMe Connect, no NBD handshake done), it holds one of the
/// [`SetupSlots`] too, and may be closed to make room.
pub struct Counted {
    open: Arc<AtomicUsize>,
    setup: Option<(Arc<SetupSlots>, u64)>,
    /// Set by whichever lets the count go first: this, dropped, or the
    /// setup slots, closing the connection to make room.
    uncounted: Arc<AtomicBool>,
    /// The peer has shown it speaks the protocol (a whole ICReq, a TLS
    /// handshake record, NBD's client flags): closed for room only after
    /// every silent one.
    talking: Arc<AtomicBool>,
}

impl Counted {
    /// Whether the connection is still setting up.
    pub fn in_setup(&self) -> bool {
        self.setup.is_some()
    }

    /// The peer has shown it speaks the protocol: among the connections
    /// setting up, the silent ones are closed for room first.
    pub fn talking(&self) {
        self.talking.store(true, Ordering::Relaxed);
    }

    /// The connection is past its setup (a host connected, a handshake
    /// done): it no longer holds a setup slot, and is never closed to make
    /// room.
    pub fn admitted(&mut self) {
        if let Some((slots, id)) = self.setup.take() {
            slots.release(id);
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.admitted();
        if !self.uncounted.swap(true, Ordering::AcqRel) {
            self.open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The connections still setting up, oldest first, each with a handle
/// that can close it. A connection that does not set up quickly is what
/// an attacker who holds idle connections looks like: the node keeps at
/// most `max` of them, and when it needs room (that many, or every
/// connection taken) it closes the oldest — so idle connections cannot
/// lock hosts out, and a host, past its setup within a round trip or
/// two, is never the one closed.
pub struct SetupSlots {
    pub(crate) max: usize,
    /// The accept loop's count of open connections: a connection closed
    /// to make room leaves it at once (its thread or worker lets it go a
    /// moment later).
    open: Arc<AtomicUsize>,
    waiting: std::sync::Mutex<std::collections::VecDeque<Waiting>>,
    next_id: std::sync::atomic::AtomicU64,
    closed: AtomicUsize,
}

/// A connection setting up: its id, a handle that closes it, its counted
/// flag and its talking flag.
type Waiting = (u64, TcpStream, Arc<AtomicBool>, Arc<AtomicBool>);

impl SetupSlots {
    /// At most `max` (at least 1) connections setting up at once, of the
    /// `open` ones.
    pub(crate) fn new(max: usize, open: Arc<AtomicUsize>) -> Self {
        SetupSlots {
            max: max.max(1),
            open,
            waiting: std::sync::Mutex::new(std::collections::VecDeque::new()),
            next_id: std::sync::atomic::AtomicU64::new(0),
            closed: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<Waiting>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many connections are setting up.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many connections were closed to make room so far.
    pub fn closed(&self) -> usize {
        self.closed.load(Ordering::Relaxed)
    }

    /// Counts a new connection, setting up, with `handle` to close it.
    pub(crate) fn enter(self: &Arc<Self>, handle: TcpStream, talking: bool) -> Counted {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let uncounted = Arc::new(AtomicBool::new(false));
        let talking = Arc::new(AtomicBool::new(talking));
        self.open.fetch_add(1, Ordering::Relaxed);
        self.lock()
            .push_back((id, handle, uncounted.clone(), talking.clone()));
        Counted {
            open: self.open.clone(),
            setup: Some((self.clone(), id)),
            uncounted,
            talking,
        }
    }

    fn release(&self, id: u64) {
        self.lock().retain(|(i, ..)| *i != id);
    }

    /// Closes the oldest silent connection still setting up, or with none
    /// silent the oldest; whether there was one.
    pub(crate) fn close_oldest(&self) -> bool {
        let picked = {
            let mut waiting = self.lock();
            let at = waiting
                .iter()
                .position(|(.., talking)| !talking.load(Ordering::Relaxed))
                .unwrap_or(0);
            waiting.remove(at)
        };
        let Some((_, stream, uncounted, _)) = picked else {
            return false;
        };
        if !uncounted.swap(true, Ordering::AcqRel) {
            self.open.fetch_sub(1, Ordering::Relaxed);
        }
        let peer = stream
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let _ = stream.shutdown(std::net::Shutdown::Both);
        let n = self.closed.fetch_add(1, Ordering::Relaxed) + 1;
        // One line per doubling: an attack does not flood the log.
        if n.is_power_of_two() {
            log::warn!(
                "closed the connection from {peer}, still setting up, to make room ({n} so far): at most {} connections may be setting up at once",
                self.max
            );
        }
        true
    }
}
