//! CLIENT PAUSE and CLIENT UNPAUSE (Redis 7.0's `pauseClients`).
//!
//! `CLIENT PAUSE ms ALL` holds every command of every client until the
//! time is up or CLIENT UNPAUSE; `WRITE` holds only what may change the
//! keyspace or reach replicas (writes, EVAL/EVALSHA/FCALL unless their
//! script declares `no-writes`, PUBLISH, SPUBLISH, PFCOUNT, an EXEC that
//! queued any of those). A held command waits as the client's next
//! request (its worker looks again every few ms and when woken) and
//! counts in `blocked_clients`; a command Redis answers at once (unknown,
//! wrong arity, not authenticated) is answered at once. While paused the
//! expiry sweep removes nothing (expired keys read as absent). A second
//! PAUSE keeps the later end and the stricter kind, as Redis does.

use super::conn::Conn;
use super::Shared;
use crate::acl;
use crate::resp::Args;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;

/// No pause, WRITE, ALL: ordered so that the stricter is the greater.
const OFF: u8 = 0;
const WRITE: u8 = 1;
const ALL: u8 = 2;

/// The pause in force.
#[derive(Default)]
pub struct Pause {
    /// OFF, WRITE or ALL.
    kind: AtomicU8,
    /// When it ends, in ms since the epoch (as `super::now_ms`).
    until_ms: AtomicU64,
    /// Serializes PAUSE and UNPAUSE (a reader loads the two atomics).
    change: Mutex<()>,
    /// Clients with a command held now (INFO's `blocked_clients`).
    pub(super) postponed: AtomicUsize,
}

impl Pause {
    /// CLIENT PAUSE: until `until_ms`, all commands or only writes.
    pub(super) fn pause(&self, until_ms: u64, all: bool) {
        let _change = self.change.lock().unwrap_or_else(|p| p.into_inner());
        let kind = if all { ALL } else { WRITE };
        if self.kind.load(Ordering::Acquire) == OFF {
            self.until_ms.store(until_ms, Ordering::Release);
            self.kind.store(kind, Ordering::Release);
        } else {
            self.until_ms.fetch_max(until_ms, Ordering::AcqRel);
            self.kind.fetch_max(kind, Ordering::AcqRel);
        }
    }

    /// CLIENT UNPAUSE (and the end of the time).
    pub(super) fn unpause(&self) {
        let _change = self.change.lock().unwrap_or_else(|p| p.into_inner());
        self.kind.store(OFF, Ordering::Release);
        self.until_ms.store(0, Ordering::Release);
    }

    /// The kind in force at `now_ms`, or OFF (a pause whose time is up
    /// ends here).
    fn kind_at(&self, now_ms: u64) -> u8 {
        let kind = self.kind.load(Ordering::Acquire);
        if kind == OFF {
            return OFF;
        }
        if now_ms >= self.until_ms.load(Ordering::Acquire) {
            self.unpause();
            return OFF;
        }
        kind
    }

    /// Whether clients are paused now (the fast paths step aside, the
    /// expiry sweep waits).
    pub(super) fn active(&self) -> bool {
        self.kind.load(Ordering::Relaxed) != OFF && self.kind_at(super::now_ms()) != OFF
    }
}

/// Whether `conn`'s request `args` waits for the pause to end.
pub(super) fn holds(shared: &Shared, conn: &Conn, args: &Args) -> bool {
    let kind = shared.pause.kind.load(Ordering::Relaxed);
    if kind == OFF || conn.session.unauthenticated() {
        return false;
    }
    // Refused before the pause is looked at, as Redis refuses them.
    let Some(id) = acl::resolve(args) else {
        return false;
    };
    if !acl::arity_fits(id, args.len()) {
        return false;
    }
    match shared.pause.kind_at(super::now_ms()) {
        OFF => false,
        ALL => true,
        _ => may_replicate(shared, conn, id, args),
    }
}

/// Redis's `CMD_WRITE | CMD_MAY_REPLICATE`, with a script's declared
/// flags in place of EVAL's and FCALL's, and an EXEC's queued commands.
fn may_replicate(shared: &Shared, conn: &Conn, id: acl::CommandId, args: &Args) -> bool {
    match acl::name_of(id) {
        "exec" => conn.tx.as_ref().is_some_and(|tx| {
            tx.queued.iter().any(|queued| {
                acl::resolve(queued).is_some_and(|q| may_replicate(shared, conn, q, queued))
            })
        }),
        "eval" | "evalsha" | "fcall" => !super::scripting::declares_no_writes(shared, args),
        "publish" | "spublish" | "pfcount" => true,
        _ => acl::is_write(id),
    }
}

/// CLIENT PAUSE timeout [WRITE|ALL], as Redis checks it.
pub(super) fn client_pause(shared: &Shared, args: &Args) -> crate::resp::Reply {
    use crate::resp::Reply;
    let all = match args.get(3).map(|a| a.to_ascii_lowercase()) {
        None => true,
        Some(mode) if mode == b"all" => true,
        Some(mode) if mode == b"write" => false,
        Some(_) => return Reply::Error("ERR CLIENT PAUSE mode must be WRITE or ALL".into()),
    };
    let timeout_ms = match crate::resp::string_to_i64(&args[2]) {
        Some(ms) if ms >= 0 => ms as u64,
        Some(_) => return Reply::Error("ERR timeout is negative".into()),
        None => return Reply::Error("ERR timeout is not an integer or out of range".into()),
    };
    let until_ms = super::now_ms().saturating_add(timeout_ms);
    shared.pause.pause(until_ms, all);
    Reply::Simple("OK".into())
}
