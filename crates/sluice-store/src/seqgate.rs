//! A sequence number that only grows, which threads wait on: readable by
//! any thread without a lock or a system call, waited for by spinning
//! briefly and then parking, and advanced with a wake-up for exactly the
//! waiters it satisfies (no thundering herd: a condition variable's
//! `notify_all` woke every waiter for every advance).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::Thread;

/// Polls of the value before a waiter parks where the machine has more than
/// two cores: about a microsecond, enough for a wake already on its way, far
/// less than a device flush. On two cores a spinning waiter holds a core the
/// thread it waits for needs: parking at once measured faster there
/// (docs/BENCHMARKS.md, "Synced writes on one I/O path").
const SPIN_POLLS: u32 = 256;

fn spin_polls() -> u32 {
    static POLLS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *POLLS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cores > 2 {
            SPIN_POLLS
        } else {
            0
        }
    })
}
/// Room the parked list starts with (it grows past it: one entry per
/// parked thread).
const PARKED_HINT: usize = 64;

#[derive(Debug)]
pub struct SeqGate {
    value: AtomicU64,
    /// `parked.len()`, stored under its lock after every change: an
    /// advance with nobody parked takes no lock. A waiter stores it after
    /// registering and then reads `value`; an advance raises `value` and
    /// then reads it (all sequentially consistent), so one of the two
    /// sees the other.
    parked_count: AtomicUsize,
    parked: Mutex<Vec<Parked>>,
}

#[derive(Debug)]
struct Parked {
    target: u64,
    /// The waiter's own mark (the store: the log position its write needs
    /// durable), for [`SeqGate::advance`] to pick one to wake.
    key: u64,
    thread: Thread,
}

impl SeqGate {
    pub fn new(value: u64) -> Self {
        SeqGate {
            value: AtomicU64::new(value),
            parked_count: AtomicUsize::new(0),
            parked: Mutex::new(Vec::with_capacity(PARKED_HINT)),
        }
    }

    /// Whether any thread is parked on the gate now (a hint: it may change
    /// at once).
    pub fn has_parked(&self) -> bool {
        self.parked_count.load(Ordering::SeqCst) > 0
    }

    /// The current value (no lock, no system call).
    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Acquire)
    }

    fn parked(&self) -> std::sync::MutexGuard<'_, Vec<Parked>> {
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Raises the value to `to` (never lowers it) and wakes the waiters it
    /// satisfies; with `and_one_keyed_from: Some(k)`, also the unsatisfied
    /// waiter of the smallest key at least `k` (who may then act to satisfy
    /// the rest).
    pub fn advance(&self, to: u64, and_one_keyed_from: Option<u64>) {
        let now = self.value.fetch_max(to, Ordering::SeqCst).max(to);
        if self.parked_count.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut to_wake = Vec::new();
        {
            let mut parked = self.parked();
            let extra = and_one_keyed_from.and_then(|k| {
                parked
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.target > now && p.key >= k)
                    .min_by_key(|(_, p)| p.key)
                    .map(|(i, _)| i)
            });
            if let Some(i) = extra {
                to_wake.push(parked.swap_remove(i).thread);
            }
            parked.retain(|p| {
                let wake = p.target <= now;
                if wake {
                    to_wake.push(p.thread.clone());
                }
                !wake
            });
            self.parked_count.store(parked.len(), Ordering::SeqCst);
        }
        // Woken outside the lock: each wake-up can cost a cross-core
        // interrupt, and a waiter woken while the lock is held would block
        // on it at once. The one that may act (`extra`) goes first.
        for thread in to_wake {
            thread.unpark();
        }
    }

    /// Wakes every waiter (after a failure their `stop` reports).
    pub fn wake_all(&self) {
        let mut parked = self.parked();
        for p in parked.drain(..) {
            p.thread.unpark();
        }
        self.parked_count.store(0, Ordering::SeqCst);
    }

    /// Returns once the value reaches `target` (true) or `stop()` holds
    /// (false). `stop` must become true only together with a wake-up
    /// ([`SeqGate::advance`] with `and_one_more`, or [`SeqGate::wake_all`])
    /// made after it turned true.
    pub fn wait(&self, target: u64, key: u64, stop: impl Fn() -> bool) -> bool {
        for _ in 0..spin_polls() {
            if self.get() >= target {
                return true;
            }
            if stop() {
                return false;
            }
            std::hint::spin_loop();
        }
        let me = std::thread::current();
        loop {
            {
                let mut parked = self.parked();
                parked.push(Parked {
                    target,
                    key,
                    thread: me.clone(),
                });
                self.parked_count.store(parked.len(), Ordering::SeqCst);
            }
            // Checked after registering: an advance or a stop that came
            // before the registration is seen here; one after it wakes us.
            let done = self.value.load(Ordering::SeqCst) >= target;
            if done || stop() {
                self.unregister(&me);
                return done;
            }
            std::thread::park();
            // Satisfied: the advance that raised the value past `target`
            // takes this entry out (it may still be on its way to the lock),
            // so a woken waiter goes on without touching the lock.
            if self.get() >= target {
                return true;
            }
            self.unregister(&me);
            if stop() {
                return false;
            }
        }
    }

    fn unregister(&self, me: &Thread) {
        let id = me.id();
        let mut parked = self.parked();
        parked.retain(|p| p.thread.id() != id);
        self.parked_count.store(parked.len(), Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn waiters_wake_when_their_target_is_reached_and_not_before() {
        let gate = Arc::new(SeqGate::new(0));
        let woke = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (1..=8u64)
            .map(|t| {
                let (gate, woke) = (gate.clone(), woke.clone());
                std::thread::spawn(move || {
                    assert!(gate.wait(t * 10, 0, || false));
                    assert!(
                        gate.get() >= t * 10,
                        "woke at {} for {}",
                        gate.get(),
                        t * 10
                    );
                    woke.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(woke.load(Ordering::SeqCst), 0);
        gate.advance(35, None);
        while woke.load(Ordering::SeqCst) < 3 {
            std::thread::yield_now();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(
            woke.load(Ordering::SeqCst),
            3,
            "only targets 10, 20, 30 are reached"
        );
        gate.advance(80, None);
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn stop_wakes_a_waiter_without_the_target() {
        let gate = Arc::new(SeqGate::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let t = {
            let (gate, stop) = (gate.clone(), stop.clone());
            std::thread::spawn(move || gate.wait(100, 7, || stop.load(Ordering::SeqCst)))
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        stop.store(true, Ordering::SeqCst);
        gate.advance(1, Some(5));
        assert!(!t.join().unwrap());
    }

    #[test]
    fn no_wake_up_is_lost_under_many_advances() {
        let gate = Arc::new(SeqGate::new(0));
        let threads: Vec<_> = (0..16u64)
            .map(|t| {
                let gate = gate.clone();
                std::thread::spawn(move || {
                    for i in 0..200u64 {
                        assert!(gate.wait(i * 16 + t, 0, || false));
                    }
                })
            })
            .collect();
        for v in 0..=(200 * 16) {
            gate.advance(v, None);
            if v % 64 == 0 {
                std::thread::yield_now();
            }
        }
        for t in threads {
            t.join().unwrap();
        }
    }
}
