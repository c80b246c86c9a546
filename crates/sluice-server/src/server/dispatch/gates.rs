//! What a request passes before it runs: ACL (with ACL LOG), the
//! busy-script refusal, a subscriber's allowed commands, and the
//! ACL-only checks of SORT's patterns.

use super::{check, dispatch_arity, error};
use crate::acl::{self, Denied, LogContext, LogEntry, LogReason};
use crate::commands::{self};
use crate::resp::{Args, Reply};
use crate::server::client_cmd::client_line;
use crate::server::conn::Conn;
use crate::server::Shared;
use crate::session::Refreshed;
use std::sync::atomic::Ordering;

/// Redis's ACL check of a request, after its own checks (unknown command,
/// arity, authentication: those errors come first, from the dispatch):
/// None to run it; else the NOPERM reply (logged in ACL LOG), or no reply
/// at all when the connection's user was removed (it closes, as Redis
/// closes the clients of a removed user).
pub(super) fn acl_gate(
    shared: &Shared,
    conn: &mut Conn,
    name: &[u8],
    args: &Args,
) -> Option<Option<Reply>> {
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
pub(in crate::server) const NO_REPLICAS: &str = "NOREPLICAS Not enough good replicas to write.";

/// BUSY while another client's script has run past
/// `busy-reply-threshold`, but for the commands Redis lets through then
/// (SCRIPT KILL, SHUTDOWN, AUTH, HELLO, MULTI, WATCH...). Inside MULTI
/// the refusal marks the transaction, as any refused command does.
pub(in crate::server) fn busy_reply(
    shared: &Shared,
    conn: &mut Conn,
    args: &Args,
) -> Option<Reply> {
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
pub(super) fn unknown_to_acl(name: &[u8]) -> Reply {
    error(&format!(
        "NOPERM this user has no permissions to run the '{}' command",
        String::from_utf8_lossy(name)
    ))
}

/// Whether a command's top-level arity admits `argc` (unknown commands
/// and arity errors are answered by the dispatch, before any ACL check).
pub(super) fn arity_fits(name: &[u8], argc: usize) -> bool {
    match dispatch_arity(name) {
        Some(arity) => commands::arity_ok(arity, argc),
        None => commands::known(name) && commands::check_arity(name, argc).is_none(),
    }
}

/// Adds a refusal to ACL LOG.
pub(super) fn log_denied(
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

pub(in crate::server) fn log_entry(
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
        at_ms: crate::server::now_ms(),
        client_info,
    });
}

/// Whether `conn` may run `args` on a path that answers it alone (a
/// grouped SET, a GET framed in place, a read brought in ahead):
/// authenticated, and its user allows it — no check at all for a user who
/// may run everything. Anything else takes the general path, which
/// answers a refusal and logs it.
pub(in crate::server) fn acl_allows(shared: &Shared, conn: &Conn, args: &Args) -> bool {
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

/// RESP2's subscriber context (Redis's `processCommand`): after the
/// usual checks, PING answers `pong` as a message does and only the
/// pub/sub commands, QUIT and RESET run; None to go on.
pub(super) fn subscriber_context(conn: &Conn, name: &[u8], args: &Args) -> Option<Reply> {
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
    if crate::server::pubsub::allowed_while_subscribed(name) {
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
