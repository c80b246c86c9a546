//! Command dispatch on a connection, and the server commands that need
//! the server's state: INFO, CONFIG GET, COMMAND, SHUTDOWN.
//!
//! Redis's order of checks: the connection's own commands first (the
//! session), then unknown command, then arity, then authentication.

use super::conn::Conn;
use super::Shared;
use crate::commands::{self, Ctx};
use crate::resp::{Args, Reply};
use crate::session::{unknown_command, Handled, SERVER_VERSION};
use sluice_store::wal::LogPosition;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

/// Server commands and their arities (Redis's convention).
const ADMIN: &[(&str, i32)] = &[
    ("info", -1),
    ("config", -2),
    ("command", -1),
    ("shutdown", -1),
];

fn admin_arity(name: &[u8]) -> Option<i32> {
    ADMIN
        .iter()
        .find(|(n, _)| n.as_bytes() == name)
        .map(|&(_, a)| a)
}

fn arity_ok(arity: i32, argc: usize) -> bool {
    if arity >= 0 {
        argc == arity as usize
    } else {
        argc >= arity.unsigned_abs() as usize
    }
}

/// Runs one request on `conn` and queues its reply — held until the log
/// is durable past its write with `--durability always`. Returns the log
/// position of its write, if it wrote.
pub(super) fn execute(shared: &Shared, conn: &mut Conn, args: &Args) -> Option<LogPosition> {
    shared
        .stats
        .commands_processed
        .fetch_add(1, Ordering::Relaxed);
    match conn.session.handle(args, &shared.config.users) {
        Handled::Reply(reply) => {
            conn.push_reply(&reply);
            return None;
        }
        Handled::Close(reply) => {
            conn.push_reply(&reply);
            conn.quit = true;
            conn.closing = true;
            return None;
        }
        Handled::Other => {}
    }
    let name = args[0].to_ascii_lowercase();
    if let Some(arity) = admin_arity(&name) {
        let reply = if !arity_ok(arity, args.len()) {
            commands::wrong_arity(&String::from_utf8_lossy(&name))
        } else if let Some(noauth) = conn.session.check_auth() {
            noauth
        } else {
            admin(shared, conn, &name, args)?
        };
        conn.push_reply(&reply);
        return None;
    }
    if !commands::known(&name) {
        conn.push_reply(&unknown_command(args));
        return None;
    }
    if let Some(error) = commands::check_arity(&name, args.len()) {
        conn.push_reply(&error);
        return None;
    }
    if let Some(noauth) = conn.session.check_auth() {
        conn.push_reply(&noauth);
        return None;
    }
    let mut ctx = Ctx::new(&shared.db, super::now_ms());
    let reply = commands::execute(&mut ctx, &name, args);
    let wrote = ctx.wrote();
    if let Some(at) = wrote {
        shared.committer.wrote(at);
        if shared.config.durability == super::Durability::Always {
            // Before the reply is queued: it is the first to wait.
            conn.hold_until(at);
        }
    }
    conn.push_reply(&reply);
    wrote
}

/// A server command; None: no reply (SHUTDOWN closes the connection).
fn admin(shared: &Shared, conn: &mut Conn, name: &[u8], args: &Args) -> Option<Reply> {
    Some(match name {
        b"info" => Reply::Verbatim {
            format: *b"txt",
            text: info(shared, args).into_bytes(),
        },
        b"config" => config(shared, args),
        b"command" => command(args),
        _ => return shutdown(shared, conn, args),
    })
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

fn config(shared: &Shared, args: &Args) -> Reply {
    let sub = args[1].to_ascii_lowercase();
    match &sub[..] {
        b"get" if args.len() >= 3 => {
            let settings = settings(shared);
            let mut out = Vec::new();
            for (name, value) in &settings {
                if args[2..]
                    .iter()
                    .any(|p| commands::glob_match(&p.to_ascii_lowercase(), name.as_bytes()))
                {
                    out.push((
                        Reply::Bulk(name.as_bytes().to_vec()),
                        Reply::Bulk(value.as_bytes().to_vec()),
                    ));
                }
            }
            Reply::Map(out)
        }
        b"get" => commands::wrong_arity("config|get"),
        b"set" => Reply::Error(
            "ERR CONFIG SET is not supported by Sluice yet: restart `sluice serve` with the setting's flag".into(),
        ),
        b"resetstat" => Reply::Simple("OK".into()),
        _ => Reply::Error(format!(
            "ERR unknown subcommand '{}'. Try CONFIG HELP.",
            String::from_utf8_lossy(&args[1])
        )),
    }
}

/// The settings CONFIG GET reports, by Redis's names.
fn settings(shared: &Shared) -> Vec<(&'static str, String)> {
    let c = &shared.config;
    let appendfsync = match c.durability {
        super::Durability::Always => "always",
        super::Durability::Everysec => "everysec",
        super::Durability::None => "no",
    };
    vec![
        ("appendonly", "yes".into()),
        ("appendfsync", appendfsync.into()),
        ("bind", shared.resp_addr.ip().to_string()),
        ("client-query-buffer-limit", c.max_query_bytes.to_string()),
        ("databases", "1".into()),
        ("io-threads", c.threads.to_string()),
        ("maxclients", c.max_clients.to_string()),
        ("port", shared.resp_addr.port().to_string()),
        ("proto-max-bulk-len", c.limits.bulk_max_bytes.to_string()),
        ("save", String::new()),
        ("timeout", c.idle_timeout_secs.to_string()),
    ]
}

fn command(args: &Args) -> Reply {
    let sub = args.get(1).map(|s| s.to_ascii_lowercase());
    let table = || {
        commands::table()
            .chain(ADMIN.iter().copied())
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
        Some(_) => Reply::Error(format!(
            "ERR unknown subcommand '{}'. Try COMMAND HELP.",
            String::from_utf8_lossy(&args[1])
        )),
    }
}

fn info(shared: &Shared, args: &Args) -> String {
    let wanted: Vec<String> = args[1..]
        .iter()
        .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
        .collect();
    let all = wanted.is_empty()
        || wanted
            .iter()
            .any(|w| w == "all" || w == "everything" || w == "default");
    let mut out = String::new();
    let sections: [(&str, Section); 7] = [
        ("server", info_server),
        ("clients", info_clients),
        ("memory", info_memory),
        ("persistence", info_persistence),
        ("stats", info_stats),
        ("keyspace", info_keyspace),
        ("sluice", info_sluice),
    ];
    for (name, write) in sections {
        if all || wanted.iter().any(|w| w == name) {
            if !out.is_empty() {
                out.push_str("\r\n");
            }
            let _ = write!(out, "# {}{}\r\n", name[..1].to_uppercase(), &name[1..]);
            write(shared, &mut out);
        }
    }
    out
}

/// Writes one INFO section's lines.
type Section = fn(&Shared, &mut String);

fn line(out: &mut String, key: &str, value: impl std::fmt::Display) {
    let _ = write!(out, "{key}:{value}\r\n");
}

fn info_server(shared: &Shared, out: &mut String) {
    line(out, "redis_version", SERVER_VERSION);
    line(out, "sluice_version", env!("CARGO_PKG_VERSION"));
    line(out, "redis_mode", "standalone");
    line(out, "os", std::env::consts::OS);
    line(out, "process_id", std::process::id());
    line(out, "tcp_port", shared.resp_addr.port());
    line(out, "uptime_in_seconds", shared.started.elapsed().as_secs());
    line(out, "io_threads_active", shared.config.threads);
}

fn info_clients(shared: &Shared, out: &mut String) {
    line(
        out,
        "connected_clients",
        shared.clients.load(Ordering::Relaxed),
    );
    line(out, "maxclients", shared.config.max_clients);
}

fn info_memory(shared: &Shared, out: &mut String) {
    let s = shared.db.store().stats();
    line(out, "sluice_memtable_bytes", s.memtable_bytes);
    line(out, "sluice_block_cache_bytes", s.block_cache_used_bytes);
    line(out, "sluice_pinned_index_bytes", s.pinned_index_bytes);
}

fn info_persistence(shared: &Shared, out: &mut String) {
    line(out, "loading", 0);
    line(out, "aof_enabled", 1);
    line(out, "appendfsync", shared.config.durability.name());
    let marks = shared.db.store().log_marks();
    line(out, "sluice_wal_last_written", marks.written);
    line(out, "sluice_wal_last_durable", marks.durable);
}

fn info_stats(shared: &Shared, out: &mut String) {
    let s = &shared.stats;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    line(
        out,
        "total_connections_received",
        get(&s.connections_received),
    );
    line(out, "total_commands_processed", get(&s.commands_processed));
    line(out, "total_net_input_bytes", get(&s.net_input_bytes));
    line(out, "total_net_output_bytes", get(&s.net_output_bytes));
    line(out, "rejected_connections", get(&s.rejected_connections));
}

fn info_keyspace(_shared: &Shared, _out: &mut String) {
    // Redis lists `db0:keys=N,...` here; counting keys walks the whole
    // keyspace (DBSIZE does), so INFO leaves it out.
}

fn info_sluice(shared: &Shared, out: &mut String) {
    let store = shared.db.store().stats();
    let s = &shared.stats;
    let c = &shared.committer;
    let waits = s.durable_waits.load(Ordering::Relaxed);
    let wait_us = s.durable_wait_us.load(Ordering::Relaxed);
    line(out, "wal_last_written", store.wal_written_below);
    line(out, "wal_last_durable", store.wal_durable_below);
    line(out, "wal_flushes", store.wal_flushes);
    line(out, "group_commits", c.commits.load(Ordering::Relaxed));
    line(
        out,
        "group_commit_requests",
        c.requests.load(Ordering::Relaxed),
    );
    line(out, "durable_reply_waits", waits);
    line(
        out,
        "durable_reply_wait_avg_us",
        wait_us.checked_div(waits).unwrap_or(0),
    );
    line(out, "memtable_flushes", store.flushes);
    line(out, "compactions", store.compactions);
    line(
        out,
        "tables_per_level",
        format!("{:?}", store.tables_per_level),
    );
    line(out, "block_cache_hits", store.block_cache_hits);
    line(out, "block_cache_misses", store.block_cache_misses);
    line(out, "free_blocks", store.free_blocks);
    line(out, "device_blocks", store.device_blocks);
}
