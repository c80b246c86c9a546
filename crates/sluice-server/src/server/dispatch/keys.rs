//! Reading a command's keys for the worker's fast paths: a record or a
//! miss to wait for, and expiring what a read found due.

use super::gates::acl_allows;
use super::{lowercase_name, NAME_MAX_BYTES};
use crate::commands::{self};
use crate::resp::{Args, Reply};
use crate::server::conn::Conn;
use crate::server::Shared;
use sluice_store::ReadCache;
use std::sync::atomic::Ordering;

/// GET outside a transaction from an authenticated client: the value is
/// copied once, from where the store holds it into the reply (for a
/// shared-memory client, straight into its response ring), with none of
/// the general dispatch. The same reply and checks as through
/// [`execute`]; whether it ran (anything else goes there). `reads` is the
/// worker's cache of the store's view; `now_ms` the time it runs at.
pub(in crate::server) fn try_get(
    shared: &Shared,
    conn: &mut Conn,
    args: &Args,
    reads: &mut ReadCache,
    now_ms: u64,
) -> bool {
    if args.len() != 2
        || !args[0].eq_ignore_ascii_case(b"get")
        || conn.tx.is_some()
        || conn.subscriptions.any()
        || !acl_allows(shared, conn, args)
    {
        return false;
    }
    get_key(shared, conn, &args[1], reads, now_ms);
    true
}

/// The GET of [`try_get`], of a key framed in place (the checks done).
pub(super) fn get_key(
    shared: &Shared,
    conn: &mut Conn,
    key: &[u8],
    reads: &mut ReadCache,
    now_ms: u64,
) {
    if get_key_or_miss(shared, conn, key, true, reads, now_ms).is_err() {
        unreachable!("a read that may wait never misses");
    }
}

/// [`get_key`], or with `wait` false, what it would have to read from the
/// device first (nothing is replied then).
pub(in crate::server) fn get_key_or_miss(
    shared: &Shared,
    conn: &mut Conn,
    key: &[u8],
    wait: bool,
    reads: &mut ReadCache,
    now_ms: u64,
) -> Result<(), sluice_store::CacheMiss> {
    let space = shared.db.space_used(conn.session.db());
    let mut expired = false;
    let answered = commands::get_borrowed_or_miss(
        &shared.db,
        reads,
        space,
        key,
        wait,
        || now_ms,
        |found| match found {
            Ok(Some(value)) => conn.push_bulk(value),
            Ok(None) => conn.push_reply(&Reply::Null),
            Err(error) => conn.push_reply(&error),
        },
        || expired = true,
    );
    if expired {
        expire_lazily(shared, &[(space, key.to_vec())], now_ms);
    }
    answered
}

/// Removes keys reads found expired, as Redis's lazy expiry does (counted
/// in `expired_keys`, told as `expired` keyspace events) — unless CLIENT
/// PAUSE holds writes, when keys expire logically and stay until it ends.
/// A key written again meanwhile stays.
pub(in crate::server) fn expire_lazily(
    shared: &Shared,
    keys: &[(sluice_redis::Space, Vec<u8>)],
    now_ms: u64,
) {
    if shared.pause.active() {
        return;
    }
    for (space, key) in keys {
        match shared.db.remove_if_expired(*space, key, now_ms) {
            Ok(swept) => {
                if let Some(position) = swept.position {
                    shared.committer.wrote(position);
                }
                crate::server::notify::expired(shared, &swept.expired);
                shared
                    .stats
                    .expired_keys
                    .fetch_add(swept.removed as u64, Ordering::Relaxed);
            }
            Err(e) => {
                log::warn!("removing an expired key a read found failed (the sweep will): {e}")
            }
        }
    }
}

/// The device reads running `args` would wait for, up to `most`: for the
/// commands that read entries their arguments name (GET, MGET, EXISTS,
/// HGET, HMGET, INCR, ...), the first index or block each key's entry
/// and each hash field it reads would need. Empty for any other command,
/// a command of the wrong arity (its error needs no read), and where all
/// of it is in memory or cached. `database` is the client's logical one,
/// looked up only for a command that reads.
pub(in crate::server) fn misses(
    shared: &Shared,
    database: u8,
    args: &Args,
    reads: &mut ReadCache,
    most: usize,
) -> Vec<sluice_store::CacheMiss> {
    let mut lower = [0u8; NAME_MAX_BYTES];
    let name = lowercase_name(&args[0], &mut lower);
    let reads_of = commands::reads(name);
    if reads_of == commands::Reads::Unnamed || commands::check_arity(name, args.len()).is_some() {
        return Vec::new();
    }
    let db = &shared.db;
    let space = db.space_used(database);
    let mut out = Vec::new();
    let mut push = |miss: Option<sluice_store::CacheMiss>| {
        if let Some(miss) = miss.filter(|_| out.len() < most) {
            out.push(miss);
        }
    };
    let (keys, fields) = match reads_of {
        commands::Reads::Unnamed => (&args[..0], &args[..0]),
        commands::Reads::FirstKey => (&args[1..2], &args[..0]),
        commands::Reads::EveryKey => (&args[1..], &args[..0]),
        commands::Reads::KeyAndField => (&args[1..2], &args[2..3]),
        commands::Reads::KeyAndFields => (&args[1..2], &args[2..]),
    };
    for key in keys {
        push(db.miss_of_key(reads, space, key));
    }
    for field in fields {
        push(db.miss_of_member(reads, space, &args[1], field));
    }
    out
}
