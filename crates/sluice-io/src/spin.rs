//! Slots for threads that poll instead of sleeping. A thread that waits for
//! something expected within microseconds (a device completion, the next
//! request on a busy socket) saves a sleep and a wake-up by polling for it,
//! but a poller holds its core: more pollers than half the cores would take
//! the cores from the threads that do the work being waited for. Every
//! poller of the process takes one of these slots first, and past the
//! limit waits the ordinary way.
//!
//! Polling pays only when the waiter is nearly alone: with many requests
//! in flight their completions come anyway and the cores have work, so a
//! poll would only take a core from it. A thread about to wait for
//! something soon says so ([`Waiting`]), and a slot is given only while no
//! more threads than the slots wait at all.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Pollers at once in this process.
static POLLING: AtomicUsize = AtomicUsize::new(0);
/// Threads waiting for something expected soon, polling or asleep.
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// A thread waiting for something expected soon (a device completion, the
/// next request of a busy connection), counted while it lives.
#[derive(Debug)]
pub struct Waiting(());

impl Waiting {
    /// Counts the calling thread in until the guard is dropped.
    pub fn begin() -> Waiting {
        WAITING.fetch_add(1, Ordering::AcqRel);
        Waiting(())
    }

    /// A polling slot for this wait, when no more threads than
    /// [`max_pollers`] wait now (this one included) and a slot is free.
    pub fn spin_slot(&self) -> Option<SpinSlot> {
        if WAITING.load(Ordering::Acquire) > max_pollers() {
            return None;
        }
        SpinSlot::take()
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        WAITING.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Most pollers at once: half the cores, at least one.
pub fn max_pollers() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / 2).max(1)
    })
}

/// One polling slot, given back when dropped.
#[derive(Debug)]
pub struct SpinSlot(());

impl SpinSlot {
    /// A slot, if fewer than [`max_pollers`] are taken.
    pub fn take() -> Option<SpinSlot> {
        let limit = max_pollers();
        POLLING
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| SpinSlot(()))
    }

    /// Slots taken now (tests).
    pub fn taken() -> usize {
        POLLING.load(Ordering::Acquire)
    }
}

impl Drop for SpinSlot {
    fn drop(&mut self) {
        POLLING.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether one waiter should poll this time: after a poll that ran out of
/// time (what it waited for was slow, or the cores were busy), the next
/// 1, 2, 4 … 64 waits sleep at once; a poll that found its event resets
/// that. A waiter at queue depth 1 keeps polling; one whose events are
/// slow stops burning a core on them.
#[derive(Debug, Default, Clone)]
pub struct SpinBackoff {
    misses: u32,
    skip: u32,
}

/// Most waits a [`SpinBackoff`] sleeps through after polls that missed.
const MAX_SKIPPED_WAITS: u32 = 64;

impl SpinBackoff {
    /// Whether to poll for this wait.
    pub fn should_spin(&mut self) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        true
    }

    /// What the poll came to: its event came (`true`) or its time ran out.
    pub fn record(&mut self, found: bool) {
        if found {
            self.misses = 0;
        } else {
            self.skip = (1u32 << self.misses.min(6)).min(MAX_SKIPPED_WAITS);
            self.misses = self.misses.saturating_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misses_make_waits_sleep_longer_and_a_hit_resets_it() {
        let mut b = SpinBackoff::default();
        assert!(b.should_spin());
        let slept = |b: &mut SpinBackoff| {
            let mut n = 0;
            while !b.should_spin() {
                n += 1;
            }
            n
        };
        let mut runs = Vec::new();
        for _ in 0..9 {
            b.record(false);
            runs.push(slept(&mut b));
        }
        assert_eq!(runs, [1, 2, 4, 8, 16, 32, 64, 64, 64]);
        b.record(true);
        assert!(b.should_spin());
        b.record(false);
        assert_eq!(slept(&mut b), 1);
    }

    #[test]
    fn a_waiter_polls_only_while_few_threads_wait() {
        let alone = Waiting::begin();
        // Other tests of this binary may hold slots; this one only needs
        // the counts to move as it says.
        let crowd: Vec<Waiting> = (0..max_pollers() + 1).map(|_| Waiting::begin()).collect();
        assert!(alone.spin_slot().is_none(), "too many waiters to poll");
        drop(crowd);
        assert!(WAITING.load(Ordering::Acquire) >= 1);
    }

    #[test]
    fn slots_stop_at_the_limit_and_come_back_when_dropped() {
        let held: Vec<SpinSlot> = std::iter::from_fn(SpinSlot::take).take(1000).collect();
        assert_eq!(held.len(), max_pollers());
        assert!(SpinSlot::take().is_none());
        drop(held);
        assert!(SpinSlot::take().is_some());
    }
}
