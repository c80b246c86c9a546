//! The server commands that need the dispatch's own tables: COMMAND,
//! CLUSTER, WAIT, SAVE/BGSAVE, SHUTDOWN, and the arities of them all.

use super::error;
use super::transaction::TX_COMMANDS;
use crate::acl::{self};
use crate::commands::{self};
use crate::resp::{Args, Reply};
use crate::server::config_cmd::config;
use crate::server::conn::Conn;
use crate::server::info::info;
use crate::server::Shared;
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

pub(super) fn admin_arity(name: &[u8]) -> Option<i32> {
    ADMIN
        .iter()
        .find(|(n, _)| n.as_bytes() == name)
        .map(|&(_, a)| a)
}

/// A server command; None: no reply (SHUTDOWN closes the connection).
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: a worker's connection"
)]
pub(super) fn admin(shared: &Shared, conn: &mut Conn, name: &[u8], args: &Args) -> Option<Reply> {
    Some(match name {
        b"info" => Reply::Verbatim {
            format: *b"txt",
            text: info(shared, args).into_bytes(),
        },
        b"config" => config(shared, args),
        b"command" => command(args),
        b"acl" => crate::server::acl_command::acl(shared, conn, args),
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
pub(super) fn wait(conn: &mut Conn, args: &Args, in_transaction: bool) -> Option<Reply> {
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
    conn.blocked = Some(crate::server::blocking::Blocked {
        args: args.clone(),
        keys: Vec::new(),
        deadline,
        ticket: crate::server::blocking::NO_TICKET,
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
    if let Err(e) = crate::server::durability::make_all_durable(shared) {
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

pub(super) fn shutdown(shared: &Shared, conn: &mut Conn, args: &Args) -> Option<Reply> {
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

pub(super) fn command(args: &Args) -> Reply {
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
