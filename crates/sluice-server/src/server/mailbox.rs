//! A worker's mailbox: where other threads leave what one of its
//! connections waits for (a blocked client's wake-up, a subscriber's
//! message, a script's reply). The worker takes everything left each
//! turn; a post wakes it should it sleep.

use sluice_io::net::Waker;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Items left for one worker, taken all at once.
pub(super) struct Mailbox<T> {
    items: Mutex<Vec<T>>,
    /// Whether `items` may hold anything: a worker looks every turn, and
    /// a load costs less than the lock.
    pending: AtomicBool,
    waker: Arc<Waker>,
}

impl<T> Mailbox<T> {
    pub(super) fn new(waker: Arc<Waker>) -> Arc<Mailbox<T>> {
        Arc::new(Mailbox {
            items: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            waker,
        })
    }

    /// What was left since the last take, in the order it was left.
    pub(super) fn take(&self) -> Vec<T> {
        if !self.pending.load(Ordering::Acquire) || !self.pending.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        std::mem::take(&mut *self.items.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Leaves `item` and wakes the worker.
    pub(super) fn post(&self, item: T) {
        self.items
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(item);
        self.pending.store(true, Ordering::Release);
        self.waker.wake();
    }
}
