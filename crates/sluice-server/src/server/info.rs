//! INFO: the server's, the store's and the commands' figures in Redis's
//! sections and field names (redis_exporter reads them).

use super::Shared;
use crate::acl;
use crate::resp::Args;
use crate::session::SERVER_VERSION;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

pub(super) fn info(shared: &Shared, args: &Args) -> String {
    let wanted: Vec<String> = args[1..]
        .iter()
        .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
        .collect();
    let all = wanted.is_empty()
        || wanted
            .iter()
            .any(|w| w == "all" || w == "everything" || w == "default");
    // `all` and `everything` add the per-command section to the default
    // ones, as Redis's do.
    let every = wanted.iter().any(|w| w == "all" || w == "everything");
    let mut out = String::new();
    let sections: [(&str, Section); 11] = [
        ("server", info_server),
        ("clients", info_clients),
        ("memory", info_memory),
        ("persistence", info_persistence),
        ("stats", info_stats),
        ("replication", info_replication),
        ("cpu", info_cpu),
        ("commandstats", info_commandstats),
        ("errorstats", info_errorstats),
        ("keyspace", info_keyspace),
        ("sluice", info_sluice),
    ];
    for (name, write) in sections {
        let in_all = name != "commandstats" || every;
        if (all && in_all) || wanted.iter().any(|w| w == name) {
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

/// `cmdstat_<name>:calls=..,usec=..,usec_per_call=..,rejected_calls=..,
/// failed_calls=..` for every command run or refused since start (or
/// CONFIG RESETSTAT), summed over the workers and the scripts' counters
/// (a script's commands count, as in Redis).
fn info_commandstats(shared: &Shared, out: &mut String) {
    for id in 0..crate::acl::command_count() {
        let super::CommandSums {
            calls,
            usec,
            rejected,
            failed,
        } = shared.stats.command_sums(id);
        if calls == 0 && rejected == 0 && failed == 0 {
            continue;
        }
        let per_call = if calls == 0 {
            0.0
        } else {
            usec as f64 / calls as f64
        };
        let _ = write!(
            out,
            "cmdstat_{}:calls={calls},usec={usec},usec_per_call={per_call:.2},rejected_calls={rejected},failed_calls={failed}\r\n",
            acl::name_of(id)
        );
    }
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
    line(
        out,
        "maxclients",
        shared.max_clients.load(Ordering::Relaxed),
    );
    // Clients whose command waits for CLIENT PAUSE count too, as in Redis.
    let postponed = shared.pause.postponed.load(Ordering::Relaxed);
    line(
        out,
        "blocked_clients",
        shared.blocking.blocked_clients() + postponed,
    );
    line(out, "tracking_clients", shared.tracking.client_count());
    line(out, "watching_clients", shared.db.watching_clients());
}

fn info_memory(shared: &Shared, out: &mut String) {
    let s = shared.db.store().stats();
    // Redis's `used_memory` is what its allocator holds for the data; the
    // nearest of Sluice's is what it holds in memory for the store (the
    // data itself is on the device) and for scripts.
    let used = (s.memtable_bytes + s.block_cache_used_bytes + s.pinned_index_bytes) as u64
        + shared.scripts.lua_memory();
    line(out, "used_memory", used);
    if let Some(rss) = resident_bytes() {
        line(out, "used_memory_rss", rss);
    }
    line(out, "sluice_memtable_bytes", s.memtable_bytes);
    line(out, "sluice_block_cache_bytes", s.block_cache_used_bytes);
    line(out, "sluice_pinned_index_bytes", s.pinned_index_bytes);
    line(out, "used_memory_lua", shared.scripts.lua_memory());
    line(out, "number_of_cached_scripts", shared.scripts.cached());
}

/// The process's resident memory (`/proc/self/status`'s VmRSS).
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kib * 1024)
}

/// Seconds of CPU the process (and its waited-for children) used, from
/// `/proc/self/stat`, whose times are in the kernel's USER_HZ (100 a
/// second on Linux): (user, system, children's user, children's system).
fn cpu_seconds() -> Option<[f64; 4]> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold
    // spaces: state is field 3, utime 14 ... cstime 17.
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| -> Option<f64> { Some(fields.get(i)?.parse::<f64>().ok()? / 100.0) };
    Some([tick(11)?, tick(12)?, tick(13)?, tick(14)?])
}

fn info_cpu(_shared: &Shared, out: &mut String) {
    let Some([user, system, child_user, child_system]) = cpu_seconds() else {
        return;
    };
    line(out, "used_cpu_sys", format!("{system:.6}"));
    line(out, "used_cpu_user", format!("{user:.6}"));
    line(out, "used_cpu_sys_children", format!("{child_system:.6}"));
    line(out, "used_cpu_user_children", format!("{child_user:.6}"));
}

fn info_persistence(shared: &Shared, out: &mut String) {
    line(out, "loading", 0);
    // Every write is in the log at once; SAVE makes the log durable, and
    // this counts the write commands since (Redis's "dirty" counter).
    let changes = shared.stats.sum(|w| &w.changes);
    let saved = shared.stats.changes_at_save.load(Ordering::Relaxed);
    line(
        out,
        "rdb_changes_since_last_save",
        changes.saturating_sub(saved),
    );
    line(out, "rdb_bgsave_in_progress", 0);
    line(out, "aof_enabled", 1);
    line(out, "appendfsync", shared.durability().name());
    // As Redis says its AOF cannot be written (monitoring reads it):
    // `err` while the store refuses writes for room or a failing flush.
    let store = shared.db.store();
    let refused = store.writes_refused(false);
    line(
        out,
        "aof_last_write_status",
        if refused.is_some() { "err" } else { "ok" },
    );
    let s = store.stats();
    let block = sluice_store::blocks::STORE_BLOCK_BYTES as u64;
    line(out, "sluice_device_bytes", s.device_blocks * block);
    line(out, "sluice_device_free_bytes", s.free_blocks * block);
    line(out, "sluice_writes_refused", u8::from(refused.is_some()));
    let marks = shared.db.store().log_marks();
    line(out, "sluice_wal_last_written", marks.written);
    line(out, "sluice_wal_last_durable", marks.durable);
    line(out, "sluice_log_mirror", u8::from(store.has_log_mirror()));
    line(
        out,
        "sluice_log_mirror_used_bytes",
        store.log_mirror_used_bytes(),
    );
    line(
        out,
        "sluice_log_mirror_replayed_records",
        store.log_mirror_replayed(),
    );
}

fn info_stats(shared: &Shared, out: &mut String) {
    let s = &shared.stats;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    line(
        out,
        "total_connections_received",
        get(&s.connections_received),
    );
    line(out, "pubsub_channels", shared.pubsub.channel_count());
    line(out, "pubsub_patterns", shared.pubsub.pattern_count());
    let (keys, items, prefixes) = shared.tracking.counts();
    line(out, "tracking_total_keys", keys);
    line(out, "tracking_total_items", items);
    line(out, "tracking_total_prefixes", prefixes);
    let sum = |counter: fn(&super::WorkerStats) -> &std::sync::atomic::AtomicU64| s.sum(counter);
    line(
        out,
        "total_commands_processed",
        sum(|w| &w.commands_processed),
    );
    line(out, "total_net_input_bytes", sum(|w| &w.net_input_bytes));
    line(out, "total_net_output_bytes", sum(|w| &w.net_output_bytes));
    line(out, "rejected_connections", get(&s.rejected_connections));
    // Removed by the sweep; a read of an expired key finds nothing but
    // leaves its removal to the sweep.
    line(out, "expired_keys", get(&s.expired_keys));
    line(out, "total_error_replies", s.errors.total());
    // Sluice has no MIGRATE, so never holds a connection for one.
    line(out, "migrate_cached_sockets", 0);
}

/// A master without replicas (Sluice serves none yet): Redis's fields for
/// one, the replication id made at start.
fn info_replication(shared: &Shared, out: &mut String) {
    line(out, "role", "master");
    line(out, "connected_slaves", 0);
    line(out, "master_failover_state", "no-failover");
    line(out, "master_replid", &shared.replication_id);
    line(out, "master_replid2", "0".repeat(40));
    line(out, "master_repl_offset", 0);
    line(out, "second_repl_offset", -1);
    line(out, "repl_backlog_active", 0);
    line(out, "repl_backlog_histlen", 0);
}

fn info_errorstats(shared: &Shared, out: &mut String) {
    for (code, count) in shared.stats.errors.by_code() {
        let _ = write!(out, "errorstat_{code}:count={count}\r\n");
    }
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
    line(out, "compaction_debt_bytes", store.compaction_debt_bytes);
    line(out, "write_stalls", store.write_stalls);
    line(out, "write_stall_us", store.write_stall_us);
    line(
        out,
        "write_pressure_waits",
        s.write_pressure_waits.load(Ordering::Relaxed),
    );
    line(out, "reads_queued", s.reads_queued.load(Ordering::Relaxed));

    let shm_clients: usize = shared
        .shm_inboxes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|w| w.load.load(Ordering::Relaxed))
        .sum();
    line(out, "shm_clients", shm_clients);
    line(
        out,
        "tables_per_level",
        format!("{:?}", store.tables_per_level),
    );
    line(out, "block_cache_hits", store.block_cache_hits);
    line(out, "block_cache_misses", store.block_cache_misses);
    let lookups = store.block_cache_hits + store.block_cache_misses;
    line(
        out,
        "block_cache_hit_rate",
        format!(
            "{:.4}",
            store.block_cache_hits as f64 / lookups.max(1) as f64
        ),
    );
    let mut io = sluice_io::IoCountsSnapshot::default();
    for device in &store.device_io {
        io += *device;
    }
    for (class, c) in [("high", io.high), ("low", io.low)] {
        line(out, &format!("io_{class}_reads"), c.reads);
        line(out, &format!("io_{class}_read_bytes"), c.read_bytes);
        line(out, &format!("io_{class}_writes"), c.writes);
        line(out, &format!("io_{class}_write_bytes"), c.write_bytes);
        line(out, &format!("io_{class}_flushes"), c.flushes);
    }
    line(out, "free_blocks", store.free_blocks);
    line(out, "device_blocks", store.device_blocks);
}
