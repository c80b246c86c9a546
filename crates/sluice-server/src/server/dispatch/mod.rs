//! Command dispatch on a connection: a request's checks, its run and its
//! reply, counted and timed. Its rooms: `gates` (ACL and the other
//! refusals), `transaction` (MULTI/EXEC), `keys` (the fast paths' reads),
//! `admin` (the server commands that need the dispatch's tables: COMMAND,
//! CLUSTER, WAIT, SAVE, SHUTDOWN); CLIENT, CONFIG and INFO have modules of
//! their own.
//!
//! Redis's order of checks: the connection's own commands first (the
//! session), then unknown command, then arity, then authentication.

mod admin;
mod gates;
mod keys;
mod transaction;

use admin::{admin, admin_arity, wait};
pub(super) use gates::{acl_allows, busy_reply, log_entry, NO_REPLICAS};
use gates::{acl_gate, subscriber_context};
pub(super) use keys::{expire_lazily, get_key_or_miss, misses, try_get};
use transaction::{queue, transaction_command, TX_COMMANDS, TX_CONTROL};

use super::client_cmd::{client, set_tracking};
use super::clock::CommandClock;
pub(super) use super::config_cmd::config_set;
use super::conn::Conn;
use super::Shared;
use crate::acl::{self, LogContext, LogReason};
use crate::commands::{self, Ctx};
use crate::resp::{Args, Reply};
use crate::session::{unknown_command, Handled};
use sluice_store::wal::LogPosition;
use sluice_store::ReadCache;
use std::sync::atomic::Ordering;

/// Data commands that only read.
const READ_ONLY: &[&[u8]] = &[
    b"get",
    b"mget",
    b"strlen",
    b"getrange",
    b"substr",
    b"exists",
    b"type",
    b"keys",
    b"scan",
    b"randomkey",
    b"ttl",
    b"pttl",
    b"expiretime",
    b"pexpiretime",
    b"dbsize",
    b"hget",
    b"hmget",
    b"hgetall",
    b"hkeys",
    b"hvals",
    b"hlen",
    b"hexists",
    b"hstrlen",
    b"hscan",
    b"time",
    b"lastsave",
];

/// Whether `args` may write to the store when it runs on `conn` (queued
/// inside MULTI it does not; EXEC may).
pub(super) fn may_write(conn: &Conn, args: &Args) -> bool {
    let mut lower = [0u8; NAME_MAX_BYTES];
    let name = lowercase_name(&args[0], &mut lower);
    if conn.tx.is_some() {
        return name == b"exec";
    }
    commands::known(name) && !READ_ONLY.contains(&name)
}

/// Longer than every command's name: a longer one is unknown anyway.
const NAME_MAX_BYTES: usize = 32;

/// `name` in lower case, in `buf` (no allocation per request); a name
/// too long to be a command's comes back as it is.
fn lowercase_name<'a>(name: &'a [u8], buf: &'a mut [u8; NAME_MAX_BYTES]) -> &'a [u8] {
    if name.len() > NAME_MAX_BYTES {
        return name;
    }
    let out = &mut buf[..name.len()];
    out.copy_from_slice(name);
    out.make_ascii_lowercase();
    out
}

/// Runs one request on `conn` and queues its reply — held until the log
/// is durable past its write with `--durability always`. Returns the log
/// position of its write, if it wrote.
///
/// `reads`: the worker's cache of the store's view; `clock` times it (its
/// start is the clock's last lap).
pub(super) fn execute(
    shared: &Shared,
    conn: &mut Conn,
    args: &Args,
    reads: &mut ReadCache,
    clock: &mut CommandClock,
) -> Option<LogPosition> {
    let mut lower = [0u8; NAME_MAX_BYTES];
    let name = lowercase_name(&args[0], &mut lower);
    if conn.replies == super::conn::Replies::SkipNext {
        conn.replies = super::conn::Replies::Skipping;
    }
    if shared.monitors.any() && conn.tx.is_none() && name != b"exec" && name != b"multi" {
        // Shown before it runs, so a script's own commands follow it
        // (EXEC shows its commands itself, MULTI with them).
        shared.monitors.feed(conn.session.id(), &conn.addr, args);
    }
    // One wall-clock time per command: its run's time and the client's
    // last interaction.
    let now_ms = clock.wall_ms();
    // Queued in MULTI, a command is counted when EXEC runs it.
    let queued = conn.tx.is_some() && !TX_CONTROL.contains(&name);
    conn.last_error = None;
    let id = acl::resolve(args);
    if let Some(id) = id {
        conn.live
            .last_command
            .store(id as u32 + 1, Ordering::Relaxed);
        if !queued {
            remember_reads(shared, conn, id, args);
        }
    }
    let wrote = execute_command(shared, conn, name, args, reads, now_ms);
    if wrote.is_some() {
        let stats = &shared.stats.by_worker[conn.worker];
        super::WorkerStats::add(&stats.changes, 1);
    }
    let us = clock.lap_us();
    if !queued && !conn.script_pending {
        if let Some(id) = id {
            count_call(shared, conn.worker, id, us, conn.last_error);
        }
    }
    // CLIENT CACHING's choice holds for the next command, or transaction.
    if conn.tx.is_none() && name != b"client" {
        conn.tracking_caching = false;
    }
    publish_live(shared, conn, now_ms);
    if shared.tunables.slow.timing() {
        // A script is timed where it runs; a blocked command has not run.
        if !conn.script_pending && conn.blocked.is_none() {
            let name = conn.session.name().unwrap_or_default();
            shared
                .slowlog
                .note(&shared.tunables.slow, args, us, &conn.addr, name);
        }
    }
    if conn.replies == super::conn::Replies::Skipping {
        conn.replies = super::conn::Replies::On;
    }
    wrote
}

#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: a selected database exists"
)]
fn execute_command(
    shared: &Shared,
    conn: &mut Conn,
    name: &[u8],
    args: &Args,
    reads: &mut ReadCache,
    now_ms: u64,
) -> Option<LogPosition> {
    if let Some(gated) = acl_gate(shared, conn, name, args) {
        if let Some(tx) = &mut conn.tx {
            tx.dirty = true;
        }
        if let Some(reply) = gated {
            conn.push_reply(&reply);
        }
        return None;
    }
    let (reply, wrote) = if conn.tx.is_some() && !TX_CONTROL.contains(&name) {
        (Some(queue(conn, name, args)), None)
    } else if TX_COMMANDS.iter().any(|(n, _)| n.as_bytes() == name) {
        transaction_command(shared, conn, name, args)
    } else {
        if name == b"reset" {
            conn.tx = None;
            conn.watched.clear();
            shared.pubsub.leave_all(conn);
            shared.monitors.remove(conn.session.id());
            set_tracking(shared, conn, None);
        }
        let mut ctx = Ctx::new(&shared.db, now_ms).with_reads(reads);
        // The connection's database was created when it was selected.
        ctx.select(conn.session.db())
            .expect("a selected database exists");
        let reply = run(shared, conn, name, args, &mut ctx);
        if ctx.wrote().is_some() {
            let woken = signal_writes(shared, std::iter::once((ctx.database(), args)));
            wait_for_woken(conn, woken);
            let writer = Some(conn.session.id());
            super::notify::command(shared, writer, args, &ctx.take_changes());
        }
        let expired = ctx.take_expired_seen();
        if !expired.is_empty() && !conn.script_pending {
            expire_lazily(shared, &expired, now_ms);
        }
        if matches!(name, b"flushdb" | b"flushall") && reply_is_ok(&reply) {
            shared.tracking.flush(shared);
        }
        (reply, ctx.wrote())
    };
    if let Some(at) = wrote {
        shared.committer.wrote(at);
        if shared.durability().holds(shared.db.store(), at) {
            // Before the reply is queued: it is the first to wait.
            conn.hold_until(at);
        }
    }
    if let Some(reply) = reply {
        conn.push_reply(&reply);
    }
    wrote
}

/// With tracking on, remembers the keys a read-only command reads (Redis
/// does so after it runs; here before, so that a write on another worker
/// between the read and the remembering cannot go untold).
fn remember_reads(shared: &Shared, conn: &Conn, id: acl::CommandId, args: &Args) {
    if !conn.tracking || !acl::is_read(id) {
        return;
    }
    let keys = acl::keys_of(id, args);
    if keys.is_empty() {
        return;
    }
    let me = conn.session.id();
    let keys = keys.into_iter().map(|(at, _, _)| &args[at][..]);
    shared
        .tracking
        .remember(shared, me, conn.tracking_caching, keys);
}

/// Brings what CLIENT LIST shows of `conn` up to date after a command.
fn publish_live(shared: &Shared, conn: &Conn, now_ms: u64) {
    use super::clients::*;
    let live = &conn.live;
    live.last_interaction_ms.store(now_ms, Ordering::Relaxed);
    let [channels, patterns, shards] = conn.subscriptions.counts();
    live.channels.store(channels as u32, Ordering::Relaxed);
    live.patterns.store(patterns as u32, Ordering::Relaxed);
    live.shard_channels.store(shards as u32, Ordering::Relaxed);
    let multi = conn.tx.as_ref().map_or(-1, |tx| tx.queued.len() as i32);
    live.multi.store(multi, Ordering::Relaxed);
    let mut flags = 0;
    for (set, bit) in [
        (shared.monitors.has(conn.session.id()), FLAG_MONITOR),
        (conn.subscriptions.any(), FLAG_PUBSUB),
        (conn.tx.is_some(), FLAG_MULTI),
        (conn.blocked.is_some(), FLAG_BLOCKED),
        (conn.tracking, FLAG_TRACKING),
        (conn.closing, FLAG_CLOSE_AFTER_REPLY),
    ] {
        if set {
            flags |= bit;
        }
    }
    live.flags.store(flags, Ordering::Relaxed);
}

fn reply_is_ok(reply: &Option<Reply>) -> bool {
    matches!(reply, Some(Reply::Simple(s)) if s == "OK")
}

/// Counts one run of command `id` on worker `worker` for INFO
/// commandstats: `us` microseconds, and `error` as the command answered
/// (Some(true): refused before it ran; Some(false): its own error).
pub(super) fn count_call(
    shared: &Shared,
    worker: usize,
    id: acl::CommandId,
    us: u64,
    error: Option<bool>,
) {
    let Some(c) = shared
        .stats
        .by_worker
        .get(worker)
        .and_then(|w| w.commands.get(id))
    else {
        return;
    };
    if error == Some(true) {
        super::WorkerStats::add(&c.rejected, 1);
        return;
    }
    super::WorkerStats::add(&c.calls, 1);
    super::WorkerStats::add(&c.usec, us);
    let buckets = &shared.stats.by_worker[worker].latency_buckets;
    super::WorkerStats::add(&buckets[super::metrics::latency_bucket(us)], 1);
    if error == Some(false) {
        super::WorkerStats::add(&c.failed, 1);
    }
}

/// Runs one command in `ctx` (a transaction's, inside EXEC); its reply,
/// or None for none (SHUTDOWN; LRANGE when it queued its reply itself).
fn run(
    shared: &Shared,
    conn: &mut Conn,
    name: &[u8],
    args: &Args,
    ctx: &mut Ctx<'_>,
) -> Option<Reply> {
    if conn.subscriptions.any() && conn.session.protocol() == crate::resp::Protocol::Resp2 {
        if let Some(refused) = subscriber_context(conn, name, args) {
            return Some(refused);
        }
    }
    if name == b"client" {
        if let Some(outcome) = client(shared, conn, args) {
            return outcome;
        }
    }
    let handled = if session_arity(name).is_some() {
        conn.session.handle(args, &shared.config.users)
    } else {
        Handled::Other
    };
    if name == b"client"
        || name == b"hello"
        || name == b"auth"
        || name == b"reset"
        || name == b"select"
    {
        let now = conn.session.name().unwrap_or_default().to_vec();
        let user = conn.session.user().name().to_vec();
        let db = conn.session.db();
        shared.registry.update(conn.session.id(), |e| {
            e.name = now;
            e.user = user;
            e.db = db;
        });
    }
    if let Some(tried) = conn.session.take_refused_login() {
        let context = if conn.tx.is_some() {
            LogContext::Multi
        } else {
            LogContext::TopLevel
        };
        log_entry(
            shared,
            conn,
            LogReason::Auth,
            context,
            args[0].clone(),
            tried,
        );
    }
    match handled {
        Handled::Reply(reply) if name == b"select" && conn.session.db() != ctx.database() => {
            // The database's keyspaces are created the first time it is
            // selected; the commands after it (in EXEC too) run there.
            if let Err(e) = ctx.select(conn.session.db()) {
                conn.session.set_db(ctx.database());
                return Some(commands::failure_reply(e.into()));
            }
            return Some(reply);
        }
        Handled::Reply(reply) => return Some(reply),
        Handled::Close(reply) => {
            conn.quit = true;
            conn.closing = true;
            // Gone for everyone else at once, as Redis frees a client once
            // QUIT's reply is written: not listed, not a redirect target.
            shared.registry.remove(conn.session.id());
            return Some(reply);
        }
        Handled::Other => {}
    }
    if let Some(error) = check(conn, name, args) {
        return Some(error);
    }
    if shared.tunables.writes_need_replicas() && acl::resolve(args).is_some_and(acl::is_write) {
        return Some(error(NO_REPLICAS));
    }
    if admin_arity(name).is_some() {
        if name == b"wait" {
            return wait(conn, args, ctx.in_transaction());
        }
        return admin(shared, conn, name, args);
    }
    if let Some(outcome) = super::pubsub::run(&shared.pubsub, conn, name, args) {
        return outcome;
    }
    if let Some(outcome) = super::scripting::run(shared, conn, name, args, ctx) {
        return outcome;
    }
    if !ctx.in_transaction() && commands::blocking::is_blocking(name, args) {
        return serve_or_block(shared, conn, name, args, ctx);
    }
    if name == b"lrange"
        && !ctx.in_transaction()
        && conn.replies == super::conn::Replies::On
        && conn.hold_until.is_none()
        && commands::lists::lrange_into(ctx, args, &mut conn.out)
    {
        // Its reply is queued already (where `push_reply` would put it).
        return None;
    }
    Some(commands::execute(ctx, name, args))
}

/// Marks a woken waiter's wake done when its run again ends, whichever
/// way it ends.
struct RetryDone<'a> {
    shared: &'a Shared,
    ticket: u64,
}

impl Drop for RetryDone<'_> {
    fn drop(&mut self) {
        self.shared.blocking.retried(self.ticket);
    }
}

/// A blocking command outside MULTI: served if its keys hold something,
/// else the connection blocks (no reply now) until a write wakes it or
/// its time is up (`server::blocking`). Run again after a wake, it keeps
/// its place in the registry when it still finds nothing, and waits on
/// when its key now holds another type (as Redis's blocked clients do).
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: a worker's connection; served"
)]
fn serve_or_block(
    shared: &Shared,
    conn: &mut Conn,
    name: &[u8],
    args: &Args,
    ctx: &mut Ctx<'_>,
) -> Option<Reply> {
    let retry = conn.retry.take();
    // Its wake is done once this run has served it or left it waiting.
    let _retried = retry.as_ref().map(|r| RetryDone {
        shared,
        ticket: r.ticket,
    });
    let request = match commands::blocking::parse(name, args) {
        Ok(r) => r,
        Err(f) => return Some(commands::failure_reply(f)),
    };
    let refs: Vec<&[u8]> = request.keys.iter().map(|k| &k[..]).collect();
    let locked = shared.db.lock(&refs);
    let tried = commands::blocking::try_serve(ctx, &request);
    let waits_on = wrong_type(&tried) && commands::blocking::wrong_type_is_waited_on(ctx, &request);
    let waiting = match (&tried, retry) {
        (Ok(Some(_)), Some(r)) | (Err(_), Some(r)) if !waits_on => {
            shared.blocking.leave(&r.keys, r.ticket);
            None
        }
        (Ok(Some(_)), None) | (Err(_), None) => None,
        (_, Some(r)) => Some(r),
        (Ok(None), None) => {
            let args = match commands::blocking::pinned(ctx, name, args) {
                Ok(pinned) => pinned,
                Err(f) => return Some(commands::failure_reply(f)),
            };
            let db = ctx.database();
            let keys: Vec<Vec<u8>> = request
                .waits_on()
                .iter()
                .map(|k| super::blocking::waited_key(db, k))
                .collect();
            let wakes = conn.wakes.clone().expect("a worker's connection");
            let ticket = shared
                .blocking
                .register(&keys, conn.session.id(), conn.slot, &wakes);
            let deadline = (request.timeout_ms > 0).then(|| {
                std::time::Instant::now() + std::time::Duration::from_millis(request.timeout_ms)
            });
            Some(super::blocking::Blocked {
                args,
                keys,
                deadline,
                ticket,
            })
        }
    };
    drop(locked);
    if let Some(b) = waiting {
        conn.blocked = Some(b);
        return None;
    }
    Some(match tried {
        Ok(reply) => reply.expect("served"),
        Err(f) => commands::failure_reply(f),
    })
}

/// Whether a try failed for a key of another type (a woken client then
/// waits on if it is a key it waits on, as Redis serves blocked clients
/// only from keys of their type; BLMOVE's destination is answered).
fn wrong_type(tried: &Result<Option<Reply>, commands::Failure>) -> bool {
    matches!(tried, Err(commands::Failure::Reply(t)) if t.starts_with("WRONGTYPE"))
}

/// Wakes clients blocked on the keys `commands` write (after they
/// committed), each with the logical database it ran in; the tickets of
/// the waiters woken.
pub(super) fn signal_writes<'a>(
    shared: &Shared,
    commands: impl Iterator<Item = (u8, &'a Args)>,
) -> Vec<u64> {
    let mut woken = Vec::new();
    if !shared.blocking.any() {
        return woken;
    }
    let mut keys: Vec<Vec<u8>> = Vec::new();
    for (db, args) in commands {
        // Keys another database gets: MOVE's target, a SWAPDB's two.
        let other_db = |at: usize| args.get(at).and_then(|a| crate::session::select(a).ok());
        if args[0].eq_ignore_ascii_case(b"swapdb") {
            if let (Some(a), Some(b)) = (other_db(1), other_db(2)) {
                shared.blocking.signal_databases(&[a, b]);
            }
        } else if args[0].eq_ignore_ascii_case(b"move") {
            if let Some(to) = other_db(2) {
                keys.push(super::blocking::waited_key(to, &args[1]));
            }
        } else if args[0].eq_ignore_ascii_case(b"copy") {
            let option = (3..args.len()).find(|&j| args[j].eq_ignore_ascii_case(b"db"));
            if let Some(to) = option.and_then(|j| other_db(j + 1)) {
                keys.push(super::blocking::waited_key(to, &args[2]));
            }
        }
        if let Some(id) = acl::resolve(args) {
            for (at, _, write) in acl::keys_of(id, args) {
                if write {
                    keys.push(super::blocking::waited_key(db, &args[at]));
                }
            }
        }
    }
    shared
        .blocking
        .signal(keys.iter().map(|k| &k[..]), &mut woken);
    woken
}

/// Holds `conn`'s next command back until the waiters its write woke
/// (`woken`) have run theirs, as Redis serves them before it reads on.
fn wait_for_woken(conn: &mut Conn, woken: Vec<u64>) {
    if !woken.is_empty() {
        conn.woke = woken;
        conn.woke_until = Some(std::time::Instant::now() + super::blocking::WAKE_WAIT);
    }
}

/// Redis's checks before a command runs: unknown, arity, authentication.
fn check(conn: &Conn, name: &[u8], args: &Args) -> Option<Reply> {
    if let Some(arity) = dispatch_arity(name) {
        if !commands::arity_ok(arity, args.len()) {
            return Some(commands::wrong_arity(&String::from_utf8_lossy(name)));
        }
    } else if !commands::known(name) {
        return Some(unknown_command(args));
    } else if let Some(error) = commands::check_arity(name, args.len()) {
        return Some(error);
    }
    conn.session.check_auth()
}

/// The arity of a server, transaction or connection command (the data
/// commands have theirs in `commands`).
fn dispatch_arity(name: &[u8]) -> Option<i32> {
    admin_arity(name)
        .or_else(|| {
            TX_COMMANDS
                .iter()
                .find(|(n, _)| n.as_bytes() == name)
                .map(|&(_, a)| a)
        })
        .or_else(|| session_arity(name))
        .or_else(|| {
            super::pubsub::COMMANDS
                .iter()
                .chain(super::scripting::COMMANDS)
                .find(|(n, _)| n.as_bytes() == name)
                .map(|&(_, a)| a)
        })
}

fn session_arity(name: &[u8]) -> Option<i32> {
    crate::session::COMMANDS
        .iter()
        .find(|(n, _)| n.as_bytes() == name)
        .map(|&(_, a)| a)
}

fn error(text: &str) -> Reply {
    Reply::Error(text.to_string())
}
