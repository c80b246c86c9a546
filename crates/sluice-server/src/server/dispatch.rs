//! Command dispatch on a connection, and the server commands that need
//! the dispatch's own tables (COMMAND, CLUSTER, WAIT, SAVE, SHUTDOWN);
//! CLIENT, CONFIG and INFO have modules of their own.
//!
//! Redis's order of checks: the connection's own commands first (the
//! session), then unknown command, then arity, then authentication.

use super::client_cmd::{client, client_line, set_tracking};
use super::clock::CommandClock;
use super::config_cmd::config;
pub(super) use super::config_cmd::config_set;
use super::conn::Conn;
use super::info::info;
use super::Shared;
use crate::acl::{self, Denied, LogContext, LogEntry, LogReason};
use crate::commands::{self, Ctx};
use crate::resp::{Args, Reply};
use crate::session::{unknown_command, Handled, Refreshed};
use sluice_store::wal::LogPosition;
use sluice_store::ReadCache;
use std::sync::atomic::Ordering;

/// Server commands and their arities (Redis's convention).
const ADMIN: &[(&str, i32)] = &[
    ("info", -1),
    ("config", -2),
    ("command", -1),
    ("shutdown", -1),
    ("acl", -2),
    ("save", 1),
    ("bgsave", -1),
    ("cluster", -2),
    ("monitor", 1),
    ("slowlog", -2),
    ("latency", -2),
    ("wait", 3),
    ("role", 1),
];

fn admin_arity(name: &[u8]) -> Option<i32> {
    ADMIN
        .iter()
        .find(|(n, _)| n.as_bytes() == name)
        .map(|&(_, a)| a)
}

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

/// Redis's ACL check of a request, after its own checks (unknown command,
/// arity, authentication: those errors come first, from the dispatch):
/// None to run it; else the NOPERM reply (logged in ACL LOG), or no reply
/// at all when the connection's user was removed (it closes, as Redis
/// closes the clients of a removed user).
fn acl_gate(shared: &Shared, conn: &mut Conn, name: &[u8], args: &Args) -> Option<Option<Reply>> {
    let users = &shared.config.users;
    if conn.session.unrestricted(users) {
        return None;
    }
    if conn.session.refresh(users) == Refreshed::Removed {
        conn.quit = true;
        conn.closing = true;
        return Some(None);
    }
    if conn.session.unauthenticated() || !arity_fits(name, args.len()) {
        return None;
    }
    let Some(id) = acl::resolve(args) else {
        // A command the dispatch knows and ACL's table does not (a test
        // keeps this from happening): refused, never let through.
        return Some(Some(unknown_to_acl(name)));
    };
    let denied = match conn.session.user().check(id, args) {
        Ok(()) => return sort_patterns_gate(conn, id, args),
        Err(denied) => denied,
    };
    let context = if conn.tx.is_some() {
        LogContext::Multi
    } else {
        LogContext::TopLevel
    };
    log_denied(shared, conn, id, args, denied, context);
    Some(Some(match denied {
        Denied::Command => error(&format!(
            "NOPERM this user has no permissions to run the '{}' command",
            acl::name_of(id)
        )),
        Denied::Key(_) => {
            error("NOPERM this user has no permissions to access one of the keys used as arguments")
        }
    }))
}

/// Redis's refusal of a write while `min-replicas-to-write` asks for more
/// replicas than there are.
pub(super) const NO_REPLICAS: &str = "NOREPLICAS Not enough good replicas to write.";

/// BUSY while another client's script has run past
/// `busy-reply-threshold`, but for the commands Redis lets through then
/// (SCRIPT KILL, SHUTDOWN, AUTH, HELLO, MULTI, WATCH...). Inside MULTI
/// the refusal marks the transaction, as any refused command does.
pub(super) fn busy_reply(shared: &Shared, conn: &mut Conn, args: &Args) -> Option<Reply> {
    let threshold_ms = shared.tunables.busy_reply_ms.load(Ordering::Relaxed);
    let busy = shared.scripts.busy_for(conn.session.id(), threshold_ms)?;
    let name = args.first()?.to_ascii_lowercase();
    let sub = args
        .get(1)
        .map(|a| a.to_ascii_lowercase())
        .unwrap_or_default();
    let allowed = match &name[..] {
        b"auth" | b"hello" | b"quit" | b"reset" | b"shutdown" | b"discard" | b"multi"
        | b"unwatch" | b"watch" => true,
        b"script" => sub == b"kill",
        b"function" => sub == b"kill" || sub == b"stats",
        _ => false,
    };
    if allowed {
        return None;
    }
    if name == b"exec" && conn.tx.is_some() {
        // EXEC refused ends the transaction, as Redis's execCommandAbort.
        conn.tx = None;
        conn.watched.clear();
        return Some(error(&format!(
            "EXECABORT Transaction discarded because of: {busy}"
        )));
    }
    if let Some(tx) = conn.tx.as_mut() {
        tx.dirty = true;
    }
    Some(error(busy))
}

/// SORT's BY and GET patterns name keys by the data: a user who may not
/// read every key gets Redis's refusal of the option.
fn sort_patterns_gate(conn: &Conn, id: acl::CommandId, args: &Args) -> Option<Option<Reply>> {
    let option = commands::sort_pattern_option(args)?;
    if conn.session.user().allows_every_key(id) {
        return None;
    }
    Some(Some(error(&format!(
        "ERR {option} option of SORT denied due to insufficient ACL permissions."
    ))))
}

/// The refusal of a command missing from ACL's table, for a user whose
/// rules are not "everything".
fn unknown_to_acl(name: &[u8]) -> Reply {
    error(&format!(
        "NOPERM this user has no permissions to run the '{}' command",
        String::from_utf8_lossy(name)
    ))
}

/// Whether a command's top-level arity admits `argc` (unknown commands
/// and arity errors are answered by the dispatch, before any ACL check).
fn arity_fits(name: &[u8], argc: usize) -> bool {
    match dispatch_arity(name) {
        Some(arity) => commands::arity_ok(arity, argc),
        None => commands::known(name) && commands::check_arity(name, argc).is_none(),
    }
}

/// Adds a refusal to ACL LOG.
fn log_denied(
    shared: &Shared,
    conn: &Conn,
    id: acl::CommandId,
    args: &Args,
    denied: Denied,
    context: LogContext,
) {
    let (reason, object) = match denied {
        Denied::Command => (LogReason::Command, acl::name_of(id).as_bytes().to_vec()),
        Denied::Key(at) => (LogReason::Key, args[at].clone()),
    };
    log_entry(
        shared,
        conn,
        reason,
        context,
        object,
        conn.session.user().name().to_vec(),
    );
}

pub(super) fn log_entry(
    shared: &Shared,
    conn: &Conn,
    reason: LogReason,
    context: LogContext,
    object: Vec<u8>,
    username: Vec<u8>,
) {
    let me = conn.session.id();
    let client_info = shared
        .registry
        .get(me)
        .map(|e| {
            client_line(shared, me, &e, conn, &[])
                .trim_end()
                .to_string()
        })
        .unwrap_or_default();
    shared.config.users.log(LogEntry {
        count: 1,
        reason,
        context,
        object,
        username,
        at_ms: super::now_ms(),
        client_info,
    });
}

/// Whether `conn` may run `args` on a path that answers it alone (a
/// grouped SET, a GET framed in place, a read brought in ahead):
/// authenticated, and its user allows it — no check at all for a user who
/// may run everything. Anything else takes the general path, which
/// answers a refusal and logs it.
pub(super) fn acl_allows(shared: &Shared, conn: &Conn, args: &Args) -> bool {
    let session = &conn.session;
    let users = &shared.config.users;
    if session.unrestricted(users) {
        return true;
    }
    if session.unauthenticated() || !session.current(users) {
        return false;
    }
    acl::resolve(args).is_some_and(|id| session.user().check(id, args).is_ok())
}

/// GET outside a transaction from an authenticated client: the value is
/// copied once, from where the store holds it into the reply (for a
/// shared-memory client, straight into its response ring), with none of
/// the general dispatch. The same reply and checks as through
/// [`execute`]; whether it ran (anything else goes there). `reads` is the
/// worker's cache of the store's view; `now_ms` the time it runs at.
pub(super) fn try_get(
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
pub(super) fn get_key_or_miss(
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
pub(super) fn expire_lazily(shared: &Shared, keys: &[(sluice_redis::Space, Vec<u8>)], now_ms: u64) {
    if shared.pause.active() {
        return;
    }
    for (space, key) in keys {
        match shared.db.remove_if_expired(*space, key, now_ms) {
            Ok(swept) => {
                if let Some(position) = swept.position {
                    shared.committer.wrote(position);
                }
                super::notify::expired(shared, &swept.expired);
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
pub(super) fn misses(
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

/// RESP2's subscriber context (Redis's `processCommand`): after the
/// usual checks, PING answers `pong` as a message does and only the
/// pub/sub commands, QUIT and RESET run; None to go on.
fn subscriber_context(conn: &Conn, name: &[u8], args: &Args) -> Option<Reply> {
    if let Some(error) = check(conn, name, args) {
        return Some(error);
    }
    if name == b"ping" {
        let said = args.get(1).cloned().unwrap_or_default();
        return Some(Reply::Array(vec![
            Reply::Bulk(b"pong".to_vec()),
            Reply::Bulk(said),
        ]));
    }
    if super::pubsub::allowed_while_subscribed(name) {
        return None;
    }
    let full = match (acl::resolve(args), args.len()) {
        (Some(id), _) => acl::name_of(id).to_string(),
        _ => String::from_utf8_lossy(name).into_owned(),
    };
    Some(error(&format!(
        "ERR Can't execute '{full}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context"
    )))
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

/// The transaction commands and their arities.
const TX_COMMANDS: &[(&str, i32)] = &[
    ("multi", 1),
    ("exec", 1),
    ("discard", 1),
    ("watch", -2),
    ("unwatch", 1),
];

/// Most commands one transaction queues.
pub const MAX_QUEUED: usize = 100_000;

/// Commands that run at once inside MULTI instead of being queued.
const TX_CONTROL: &[&[u8]] = &[b"multi", b"exec", b"discard", b"watch", b"quit", b"reset"];

/// Inside MULTI: checks the command as Redis does before queueing it; a
/// failed check marks the transaction to be refused at EXEC.
fn queue(conn: &mut Conn, name: &[u8], args: &Args) -> Reply {
    let mut checked = check(conn, name, args).or_else(|| {
        acl::resolve(args)
            .filter(|&id| acl::no_multi(id))
            .map(|_| error("ERR Command not allowed inside a transaction"))
    });
    let tx = conn.tx.get_or_insert_with(Default::default);
    if checked.is_none() && tx.queued.len() >= MAX_QUEUED {
        checked = Some(Reply::Error(format!(
            "ERR a transaction holds at most {MAX_QUEUED} commands; split it"
        )));
    }
    match checked {
        Some(error) => {
            tx.dirty = true;
            error
        }
        None => {
            tx.queued.push(args.clone());
            Reply::Simple("QUEUED".into())
        }
    }
}

fn error(text: &str) -> Reply {
    Reply::Error(text.to_string())
}

/// MULTI, EXEC, DISCARD, WATCH, UNWATCH: the reply and the write made.
fn transaction_command(
    shared: &Shared,
    conn: &mut Conn,
    name: &[u8],
    args: &Args,
) -> (Option<Reply>, Option<LogPosition>) {
    if let Some(error) = check(conn, name, args) {
        if let Some(tx) = &mut conn.tx {
            tx.dirty = true;
        }
        return (Some(error), None);
    }
    let ok = || Some(Reply::Simple("OK".into()));
    match name {
        b"multi" if conn.tx.is_some() => (Some(error("ERR MULTI calls can not be nested")), None),
        b"multi" => {
            conn.tx = Some(super::conn::Queued {
                multi: args[0].clone(),
                ..Default::default()
            });
            (ok(), None)
        }
        b"discard" if conn.tx.is_none() => (Some(error("ERR DISCARD without MULTI")), None),
        b"discard" => {
            conn.tx = None;
            conn.watched.clear();
            (ok(), None)
        }
        b"watch" if conn.tx.is_some() => {
            (Some(error("ERR WATCH inside MULTI is not allowed")), None)
        }
        b"watch" => {
            let now_ms = super::now_ms();
            for key in &args[1..] {
                let db = conn.session.db();
                if let Err(e) = shared.db.watch(&mut conn.watched, db, key, now_ms) {
                    return (Some(commands::failure_reply(e.into())), None);
                }
            }
            (ok(), None)
        }
        b"unwatch" => {
            conn.watched.clear();
            (ok(), None)
        }
        _ => exec(shared, conn, &args[0]),
    }
}

/// EXEC: the queued commands run under every stripe lock and commit as
/// one batch — all of them or none, visible at once.
fn exec(shared: &Shared, conn: &mut Conn, word: &[u8]) -> (Option<Reply>, Option<LogPosition>) {
    let Some(tx) = conn.tx.take() else {
        return (Some(error("ERR EXEC without MULTI")), None);
    };
    let watched = std::mem::take(&mut conn.watched);
    let monitored = shared.monitors.any();
    let me = conn.session.id();
    let addr = conn.addr.clone();
    let show = |word: &[u8]| {
        if monitored {
            shared.monitors.feed(me, &addr, &[word.to_vec()]);
        }
    };
    // Monitors see MULTI, what runs, then EXEC (also when it aborts).
    show(&tx.multi.clone());
    let (reply, wrote) = exec_queued(shared, conn, tx, &watched);
    show(word);
    (reply, wrote)
}

/// EXEC's work once its MULTI is shown to monitors.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: a selected database exists"
)]
fn exec_queued(
    shared: &Shared,
    conn: &mut Conn,
    tx: super::conn::Queued,
    watched: &sluice_redis::db::Watched,
) -> (Option<Reply>, Option<LogPosition>) {
    if tx.dirty {
        return (
            Some(error(
                "EXECABORT Transaction discarded because of previous errors.",
            )),
            None,
        );
    }
    let db = &shared.db;
    let _all = db.lock_all();
    let now_ms = super::now_ms();
    match db.changed_since(watched, now_ms) {
        Ok(false) => {}
        Ok(true) => return (Some(Reply::NullArray), None),
        Err(e) => return (Some(commands::failure_reply(e.into())), None),
    }
    let mut ctx = Ctx::transaction(db, now_ms);
    ctx.select(conn.session.db())
        .expect("a selected database exists");
    let mut replies = Vec::with_capacity(tx.queued.len());
    // The database each queued command ran in (a SELECT among them
    // changes it for the ones after).
    let mut ran_in = Vec::with_capacity(tx.queued.len());
    let mut flushed = false;
    for args in &tx.queued {
        let name = args[0].to_ascii_lowercase();
        ran_in.push(ctx.database());
        if let Some(refused) = exec_acl_check(shared, conn, args) {
            replies.push(refused);
            continue;
        }
        if shared.monitors.any() {
            shared.monitors.feed(conn.session.id(), &conn.addr, args);
        }
        let started = std::time::Instant::now();
        let id = acl::resolve(args);
        if let Some(id) = id {
            remember_reads(shared, conn, id, args);
        }
        let reply = run(shared, conn, &name, args, &mut ctx).unwrap_or(Reply::Null);
        super::notify::hold(args, ctx.take_changes());
        flushed |= matches!(&name[..], b"flushdb" | b"flushall")
            && matches!(&reply, Reply::Simple(s) if s == "OK");
        if let Some(id) = id {
            let error = match &reply {
                Reply::Error(_) => Some(false),
                _ => None,
            };
            let us = started.elapsed().as_micros() as u64;
            count_call(shared, conn.worker, id, us, error);
        }
        replies.push(reply);
    }
    let finished = ctx.finish();
    match &finished {
        Ok(()) => {
            super::notify::release(shared, Some(conn.session.id()));
            if flushed {
                shared.tracking.flush(shared);
            }
        }
        Err(_) => super::notify::forget(),
    }
    match finished {
        Ok(()) => {
            if ctx.wrote().is_some() {
                let woken = signal_writes(shared, ran_in.into_iter().zip(tx.queued.iter()));
                wait_for_woken(conn, woken);
            }
            let reply = Reply::Array(replies);
            shared.stats.errors.note_nested(&reply);
            (Some(reply), ctx.wrote())
        }
        Err(e) => (
            Some(error(&format!(
                "ERR the transaction was not applied: {}",
                e.to_string().replace(['\r', '\n'], " ")
            ))),
            None,
        ),
    }
}

/// EXEC checks each queued command again, in case the rules changed since
/// it was queued; the refusal, in Redis's words, if they did.
fn exec_acl_check(shared: &Shared, conn: &mut Conn, args: &Args) -> Option<Reply> {
    let users = &shared.config.users;
    if conn.session.unrestricted(users) {
        return None;
    }
    if conn.session.refresh(users) == Refreshed::Removed {
        return Some(error("NOPERM the user of this connection was removed"));
    }
    let Some(id) = acl::resolve(args) else {
        return Some(unknown_to_acl(&args[0].to_ascii_lowercase()));
    };
    let denied = conn.session.user().check(id, args).err()?;
    log_denied(shared, conn, id, args, denied, LogContext::Multi);
    let reason = match denied {
        Denied::Command => "no permission to execute the command or subcommand",
        Denied::Key(_) => "no permission to touch the specified keys",
    };
    Some(error(&format!(
        "NOPERM ACLs rules changed between the moment the transaction was accumulated and the EXEC call. This command is no longer allowed for the following reason: {reason}"
    )))
}

/// A server command; None: no reply (SHUTDOWN closes the connection).
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: a worker's connection"
)]
fn admin(shared: &Shared, conn: &mut Conn, name: &[u8], args: &Args) -> Option<Reply> {
    Some(match name {
        b"info" => Reply::Verbatim {
            format: *b"txt",
            text: info(shared, args).into_bytes(),
        },
        b"config" => config(shared, args),
        b"command" => command(args),
        b"acl" => super::acl_command::acl(shared, conn, args),
        b"save" | b"bgsave" => save(shared, name, args),
        b"cluster" => cluster(args),
        b"slowlog" => shared.slowlog.slowlog(&args[1].to_ascii_lowercase(), args),
        // A master without replicas.
        b"role" => Reply::Array(vec![
            Reply::Bulk(b"master".to_vec()),
            Reply::Integer(0),
            Reply::Array(Vec::new()),
        ]),
        b"latency" => shared.slowlog.latency(&args[1].to_ascii_lowercase(), args),
        b"monitor" => {
            let queue = conn.pushes.clone().expect("a worker's connection");
            shared.monitors.add(conn.session.id(), conn.slot, queue);
            Reply::Simple("OK".into())
        }
        _ => return shutdown(shared, conn, args),
    })
}

/// CLUSTER: Sluice is not a cluster node, and answers as a Redis without
/// cluster support (after Redis's subcommand and arity checks). Known, so
/// that scripts and ACL rules treat its subcommands as Redis does.
fn cluster(args: &Args) -> Reply {
    let Some(id) = acl::resolve(args).filter(|&id| acl::name_of(id) != "cluster") else {
        return Reply::Error(format!(
            "ERR unknown subcommand '{}'. Try CLUSTER HELP.",
            String::from_utf8_lossy(&args[1])
        ));
    };
    if !acl::arity_fits(id, args.len()) {
        return Reply::Error(format!(
            "ERR wrong number of arguments for '{}' command",
            acl::name_of(id)
        ));
    }
    error("ERR This instance has cluster support disabled")
}

/// WAIT numreplicas timeout: Sluice has no replicas yet, so none
/// acknowledges: 0 at once when none is asked for (or inside a
/// transaction, as Redis), else 0 once `timeout` ms have passed (0: never,
/// as Redis waits), the connection blocked meanwhile without a thread.
fn wait(conn: &mut Conn, args: &Args, in_transaction: bool) -> Option<Reply> {
    let Some(replicas) = crate::resp::string_to_i64(&args[1]) else {
        return Some(error("ERR value is not an integer or out of range"));
    };
    let timeout_ms = match crate::resp::string_to_i64(&args[2]) {
        None => return Some(error("ERR timeout is not an integer or out of range")),
        Some(t) if t < 0 => return Some(error("ERR timeout is negative")),
        Some(t) => t as u64,
    };
    if replicas <= 0 || in_transaction {
        return Some(Reply::Integer(0));
    }
    let deadline = (timeout_ms > 0)
        .then(|| std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms));
    conn.blocked = Some(super::blocking::Blocked {
        args: args.clone(),
        keys: Vec::new(),
        deadline,
        ticket: super::blocking::NO_TICKET,
    });
    None
}

/// SAVE and BGSAVE [SCHEDULE]: Sluice has no snapshot to write; every
/// write is in its log, so saving makes the log durable up to now (with
/// `--durability always` it already is).
fn save(shared: &Shared, name: &[u8], args: &Args) -> Reply {
    let scheduled = match &args[1..] {
        [] => false,
        [s] if name == b"bgsave" && s.eq_ignore_ascii_case(b"schedule") => true,
        _ => return error("ERR syntax error"),
    };
    if let Err(e) = super::durability::make_all_durable(shared) {
        return Reply::Error(format!(
            "ERR the log could not be made durable: {}",
            e.to_string().replace(['\r', '\n'], " ")
        ));
    }
    let changes = shared.stats.sum(|w| &w.changes);
    shared
        .stats
        .changes_at_save
        .store(changes, Ordering::Relaxed);
    match (name, scheduled) {
        (b"save", _) => Reply::Simple("OK".into()),
        (_, true) => Reply::Simple("Background saving scheduled".into()),
        _ => Reply::Simple("Background saving started".into()),
    }
}

fn shutdown(shared: &Shared, conn: &mut Conn, args: &Args) -> Option<Reply> {
    for option in &args[1..] {
        let o = option.to_ascii_lowercase();
        if !matches!(&o[..], b"nosave" | b"save" | b"now" | b"force" | b"abort") {
            return Some(Reply::Error("ERR syntax error".into()));
        }
        if o == b"abort" {
            return Some(Reply::Error("ERR No shutdown in progress.".into()));
        }
    }
    log::info!("SHUTDOWN from client {}", conn.addr);
    shared.request_shutdown();
    conn.quit = true;
    conn.closing = true;
    None
}

/// COMMAND GETKEYS: the keys `command` names, found by the key
/// specifications ACL checks with (Redis's texts for what it refuses).
fn command_getkeys(command: &[Vec<u8>]) -> Reply {
    let Some(id) = acl::resolve(command) else {
        return error("ERR Invalid command specified");
    };
    if acl::keys_of(id, command).is_empty() && !acl::has_key_specs(id) {
        return error("ERR The command has no key arguments");
    }
    if !acl::arity_fits(id, command.len()) {
        return error("ERR Invalid number of arguments specified for command");
    }
    let keys = acl::keys_of(id, command);
    if keys.is_empty() {
        return error("ERR Invalid arguments specified for command");
    }
    Reply::Array(
        keys.into_iter()
            .map(|(at, _, _)| Reply::Bulk(command[at].clone()))
            .collect(),
    )
}

fn command(args: &Args) -> Reply {
    let sub = args.get(1).map(|s| s.to_ascii_lowercase());
    let table = || {
        commands::table()
            .chain(ADMIN.iter().copied())
            .chain(TX_COMMANDS.iter().copied())
            .chain(crate::session::COMMANDS.iter().copied())
    };
    let describe = |(name, arity): (&str, i32)| {
        Reply::Array(vec![
            Reply::Bulk(name.as_bytes().to_vec()),
            Reply::Integer(arity as i64),
        ])
    };
    match sub.as_deref() {
        None => Reply::Array(table().map(describe).collect()),
        Some(b"count") => Reply::Integer(table().count() as i64),
        Some(b"info") => Reply::Array(
            args[2..]
                .iter()
                .map(|n| {
                    let n = n.to_ascii_lowercase();
                    table()
                        .find(|(name, _)| name.as_bytes() == n)
                        .map_or(Reply::NullArray, describe)
                })
                .collect(),
        ),
        Some(b"docs") => Reply::Map(Vec::new()),
        Some(b"getkeys") if args.len() >= 4 => command_getkeys(&args[2..]),
        Some(b"getkeys") => commands::wrong_arity("command|getkeys"),
        Some(_) => Reply::Error(format!(
            "ERR unknown subcommand '{}'. Try COMMAND HELP.",
            String::from_utf8_lossy(&args[1])
        )),
    }
}
