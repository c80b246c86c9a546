//! When writes become durable: the committer thread (`always`), the
//! once-a-second commit (`everysec`), and the final one at shutdown.

use super::Shared;
use sluice_io::net::Waker;
use sluice_store::wal::LogPosition;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// When a write is acknowledged (Redis's `appendfsync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Once its group commit is on the device and flushed: it survives a
    /// power cut.
    Always,
    /// Once its group commit is on the device, not flushed: it survives
    /// the process's death (as Redis's everysec write(2) does); a flush
    /// once a second makes it survive a power cut.
    Everysec,
    /// At once; durable at the next flush or at shutdown.
    None,
}

impl std::str::FromStr for Durability {
    type Err = String;

    /// `always`, `everysec` or `none`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "always" => Ok(Durability::Always),
            "everysec" => Ok(Durability::Everysec),
            "none" | "no" => Ok(Durability::None),
            other => Err(format!(
                "unknown durability {other:?}: use always, everysec or none"
            )),
        }
    }
}

impl Durability {
    /// Whether a write's reply waits for the committer.
    pub fn holds_replies(self) -> bool {
        self != Durability::None
    }

    /// Whether a write that reached `at` may be acknowledged: with
    /// `everysec`, once it survives the process (in the log mirror, or
    /// written through the device).
    pub fn acknowledges(self, store: &sluice_store::Store, at: LogPosition) -> bool {
        match self {
            Durability::Always => store.is_durable(at),
            Durability::Everysec => store.is_kept(at),
            Durability::None => true,
        }
    }

    /// Whether the reply to a write that reached `at` waits (for the
    /// committer) before it goes out.
    pub fn holds(self, store: &sluice_store::Store, at: LogPosition) -> bool {
        self.holds_replies() && !self.acknowledges(store, at)
    }

    pub(super) fn as_byte(self) -> u8 {
        match self {
            Durability::Always => 0,
            Durability::Everysec => 1,
            Durability::None => 2,
        }
    }

    pub(super) fn from_byte(byte: u8) -> Durability {
        match byte {
            0 => Durability::Always,
            1 => Durability::Everysec,
            _ => Durability::None,
        }
    }

    /// Its name, as `--durability` and INFO spell it.
    pub fn name(self) -> &'static str {
        match self {
            Durability::Always => "always",
            Durability::Everysec => "everysec",
            Durability::None => "none",
        }
    }
}

/// Requests for durability from the workers, served by one thread.
#[derive(Default)]
pub(super) struct Committer {
    state: Mutex<Requests>,
    wake: Condvar,
    /// The furthest log position any write reached (`end_seq`).
    latest: AtomicU64,
    /// Group commits made, and the requests they answered.
    pub(super) commits: AtomicU64,
    pub(super) requests: AtomicU64,
}

#[derive(Default)]
struct Requests {
    wanted: Option<LogPosition>,
    waiters: Vec<Arc<Waker>>,
}

impl Committer {
    /// Notes a write that reached `position`.
    pub(super) fn wrote(&self, position: LogPosition) {
        // A load first: writes in one log block share their position, and
        // the max's locked instruction would cost each of them.
        if self.latest.load(Ordering::Acquire) < position.end_seq {
            self.latest.fetch_max(position.end_seq, Ordering::AcqRel);
        }
    }

    /// Asks for the log durable to `position`; `waker` is woken when it is.
    pub(super) fn request(&self, position: LogPosition, waker: &Arc<Waker>) {
        let mut r = self.state.lock().unwrap_or_else(|p| p.into_inner());
        r.wanted = r.wanted.max(Some(position));
        if !r.waiters.iter().any(|w| Arc::ptr_eq(w, waker)) {
            r.waiters.push(waker.clone());
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        drop(r);
        self.wake.notify_one();
    }

    /// Wakes the committer to look at its mode again.
    pub(super) fn nudge(&self) {
        self.wake.notify_one();
    }

    fn latest(&self) -> LogPosition {
        LogPosition {
            end_seq: self.latest.load(Ordering::Acquire),
        }
    }
}

/// Starts the durability thread of `shared`'s mode.
pub(super) fn start(shared: Arc<Shared>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("sluice-commit".into())
        .spawn(move || run(&shared))
}

/// How often, with `everysec` and a log mirror, the log is written
/// through the device so that the mirror lets its records go (no reply
/// waits for it: the mirror's copy answered them).
pub(super) const MIRROR_WRITE_THROUGH: Duration = Duration::from_millis(10);

fn run(shared: &Shared) {
    let mut last_everysec = Instant::now();
    let mut last_through = Instant::now();
    while !shared.stopping() {
        let durability = shared.durability();
        let mirrored =
            durability == super::Durability::Everysec && shared.db.store().has_log_mirror();
        let tick = if mirrored {
            MIRROR_WRITE_THROUGH
        } else {
            super::TICK
        };
        // In `none` too: replies held before CONFIG SET appendfsync no
        // still have their requests here (none arrive after).
        serve_requests(shared, tick);
        if mirrored && last_through.elapsed() >= MIRROR_WRITE_THROUGH {
            last_through = Instant::now();
            let latest = shared.committer.latest();
            let store = shared.db.store();
            if latest.end_seq > 0 && !store.is_written_through(latest) {
                if let Err(e) = store.write_through(latest) {
                    log::error!("writing the log through failed: {e}; the server stops");
                    shared.request_shutdown();
                }
            }
        }
        if durability == super::Durability::Everysec
            && last_everysec.elapsed() >= Duration::from_secs(1)
        {
            last_everysec = Instant::now();
            if let Err(e) = make_all_durable(shared) {
                log::error!("the once-a-second commit failed: {e}; the server stops");
                shared.request_shutdown();
            }
        }
    }
}

/// Waits for requests (up to `tick`), commits the furthest one (durable
/// with `always`, written through to the device with `everysec`), wakes
/// every thread that asked.
fn serve_requests(shared: &Shared, tick: Duration) {
    let c = &shared.committer;
    let (wanted, waiters) = {
        let mut r = c.state.lock().unwrap_or_else(|p| p.into_inner());
        if r.wanted.is_none() {
            r = c
                .wake
                .wait_timeout(r, tick)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        (r.wanted.take(), std::mem::take(&mut r.waiters))
    };
    let Some(wanted) = wanted else { return };
    let store = shared.db.store();
    let committed = match shared.durability() {
        super::Durability::Everysec => store.write_through(wanted),
        _ => store.make_durable(wanted),
    };
    if let Err(e) = committed {
        // The store has failed and takes no writes; the held replies are
        // never sent and the clients see their connections close.
        log::error!("a group commit failed: {e}; the server stops");
        shared.request_shutdown();
    }
    c.commits.fetch_add(1, Ordering::Relaxed);
    for w in waiters {
        w.wake();
    }
}

/// Makes every write made so far durable.
pub(super) fn make_all_durable(shared: &Shared) -> sluice_store::Result<()> {
    let latest = shared.committer.latest();
    if latest.end_seq == 0 || shared.db.store().is_durable(latest) {
        return Ok(());
    }
    shared.db.store().make_durable(latest)
}
