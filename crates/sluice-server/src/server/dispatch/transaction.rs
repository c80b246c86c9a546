//! MULTI, EXEC, DISCARD, WATCH: queueing a transaction's commands and
//! running them under every stripe lock as one store batch.

use super::gates::{log_denied, unknown_to_acl};
use super::{check, count_call, error, remember_reads, run, signal_writes, wait_for_woken};
use crate::acl::{self, Denied, LogContext};
use crate::commands::{self, Ctx};
use crate::resp::{Args, Reply};
use crate::server::conn::Conn;
use crate::server::Shared;
use crate::session::Refreshed;
use sluice_store::wal::LogPosition;

/// The transaction commands and their arities.
pub(super) const TX_COMMANDS: &[(&str, i32)] = &[
    ("multi", 1),
    ("exec", 1),
    ("discard", 1),
    ("watch", -2),
    ("unwatch", 1),
];

/// Most commands one transaction queues.
pub const MAX_QUEUED: usize = 100_000;

/// Commands that run at once inside MULTI instead of being queued.
pub(super) const TX_CONTROL: &[&[u8]] =
    &[b"multi", b"exec", b"discard", b"watch", b"quit", b"reset"];

/// Inside MULTI: checks the command as Redis does before queueing it; a
/// failed check marks the transaction to be refused at EXEC.
pub(super) fn queue(conn: &mut Conn, name: &[u8], args: &Args) -> Reply {
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

/// MULTI, EXEC, DISCARD, WATCH, UNWATCH: the reply and the write made.
pub(super) fn transaction_command(
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
            conn.tx = Some(crate::server::conn::Queued {
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
            let now_ms = crate::server::now_ms();
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
pub(super) fn exec(
    shared: &Shared,
    conn: &mut Conn,
    word: &[u8],
) -> (Option<Reply>, Option<LogPosition>) {
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
    tx: crate::server::conn::Queued,
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
    let now_ms = crate::server::now_ms();
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
        crate::server::notify::hold(args, ctx.take_changes());
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
            crate::server::notify::release(shared, Some(conn.session.id()));
            if flushed {
                shared.tracking.flush(shared);
            }
        }
        Err(_) => crate::server::notify::forget(),
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
