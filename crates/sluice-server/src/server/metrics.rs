//! The server's and its store's figures in Prometheus's text exposition
//! format (version 0.0.4): what `/metrics` answers. The same counters INFO
//! reads; names follow Prometheus's conventions (`_total` for counters,
//! base units: seconds and bytes).
//!
//! [`serve`] answers scrapes on a loopback listener of its own (one thread,
//! one request at a time: a scrape every few seconds needs no more).

use super::Shared;
use std::fmt::{Display, Write as _};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Upper bounds of the command latency histogram's buckets, in µs: powers
/// of two from 1 µs to about 1 s (the last bucket, +Inf, takes the rest).
pub const LATENCY_BUCKETS: usize = 21;

/// The bucket a command of `us` µs falls in.
pub fn latency_bucket(us: u64) -> usize {
    // Bucket i holds durations up to 2^i µs.
    let i = (64 - us.saturating_sub(1).leading_zeros()) as usize;
    i.min(LATENCY_BUCKETS)
}

/// Writes one metric family's HELP and TYPE lines.
pub fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
}

/// Writes one sample, its label values escaped as the format asks.
pub fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: impl Display) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (label, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let escaped = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            let _ = write!(out, "{label}=\"{escaped}\"");
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// A family of one unlabelled sample.
fn single(out: &mut String, name: &str, kind: &str, help: &str, value: impl Display) {
    family(out, name, kind, help);
    sample(out, name, &[], value);
}

/// Writes the server's figures (Redis protocol, durability) and its
/// store's into `out`.
pub fn render(shared: &Shared, out: &mut String) {
    resp(shared, out);
    commands(shared, out);
    store(&shared.db.store().stats(), out);
}

fn resp(shared: &Shared, out: &mut String) {
    let s = &shared.stats;
    single(
        out,
        "sluice_uptime_seconds",
        "gauge",
        "Seconds since the server started.",
        shared.started.elapsed().as_secs_f64(),
    );
    single(
        out,
        "sluice_resp_connected_clients",
        "gauge",
        "Clients connected over the Redis protocol.",
        shared.clients.load(Ordering::Relaxed),
    );
    single(
        out,
        "sluice_resp_max_clients",
        "gauge",
        "Most clients connected at once (maxclients).",
        shared.max_clients.load(Ordering::Relaxed),
    );
    single(
        out,
        "sluice_resp_blocked_clients",
        "gauge",
        "Clients waiting in a blocking command or CLIENT PAUSE.",
        shared.blocking.blocked_clients() + shared.pause.postponed.load(Ordering::Relaxed),
    );
    single(
        out,
        "sluice_resp_connections_received_total",
        "counter",
        "Connections accepted.",
        s.connections_received.load(Ordering::Relaxed),
    );
    single(
        out,
        "sluice_resp_rejected_connections_total",
        "counter",
        "Connections refused at maxclients.",
        s.rejected_connections.load(Ordering::Relaxed),
    );
    single(
        out,
        "sluice_resp_commands_processed_total",
        "counter",
        "Commands run.",
        s.sum(|w| &w.commands_processed),
    );
    single(
        out,
        "sluice_resp_net_input_bytes_total",
        "counter",
        "Bytes received from clients.",
        s.sum(|w| &w.net_input_bytes),
    );
    single(
        out,
        "sluice_resp_net_output_bytes_total",
        "counter",
        "Bytes sent to clients.",
        s.sum(|w| &w.net_output_bytes),
    );
    single(
        out,
        "sluice_resp_durable_waits_total",
        "counter",
        "Replies held until their writes were durable.",
        s.durable_waits.load(Ordering::Relaxed),
    );
    single(
        out,
        "sluice_resp_durable_wait_seconds_total",
        "counter",
        "Time replies were held for durability, in all.",
        s.durable_wait_us.load(Ordering::Relaxed) as f64 / 1e6,
    );
}

/// Per command: calls, time, refusals, errors; and the latency histogram
/// of every command run.
fn commands(shared: &Shared, out: &mut String) {
    let per_command = [
        ("sluice_resp_command_calls_total", "Times a command ran."),
        (
            "sluice_resp_command_seconds_total",
            "Time a command ran for, in all.",
        ),
        (
            "sluice_resp_command_rejected_total",
            "Times a command was refused before it ran (arity, ACL, BUSY...).",
        ),
        (
            "sluice_resp_command_failed_total",
            "Times a command ran and answered an error.",
        ),
    ];
    let mut rows = Vec::new();
    for id in 0..crate::acl::command_count() {
        let c = shared.stats.command_sums(id);
        if c.any() {
            rows.push((
                crate::acl::name_of(id),
                [c.calls, c.usec, c.rejected, c.failed],
            ));
        }
    }
    for (k, (name, help)) in per_command.iter().enumerate() {
        family(out, name, "counter", help);
        for (command, figures) in &rows {
            let labels = [("command", *command)];
            if k == 1 {
                sample(out, name, &labels, figures[k] as f64 / 1e6);
            } else {
                sample(out, name, &labels, figures[k]);
            }
        }
    }
    let name = "sluice_resp_command_duration_seconds";
    family(
        out,
        name,
        "histogram",
        "Time each command ran for (every command, from its start to its reply).",
    );
    let mut cumulative = 0u64;
    let bucket_name = format!("{name}_bucket");
    for (i, count) in shared.stats.latency_counts().into_iter().enumerate() {
        cumulative += count;
        let le = if i == LATENCY_BUCKETS {
            "+Inf".to_string()
        } else {
            format!("{}", (1u64 << i) as f64 / 1e6)
        };
        sample(out, &bucket_name, &[("le", &le)], cumulative);
    }
    let total_us: u64 = rows.iter().map(|(_, f)| f[1]).sum();
    sample(out, &format!("{name}_sum"), &[], total_us as f64 / 1e6);
    sample(out, &format!("{name}_count"), &[], cumulative);
}

/// The store's figures.
pub fn store(s: &sluice_store::StoreStats, out: &mut String) {
    let block = sluice_store::blocks::STORE_BLOCK_BYTES as u64;
    let gauges: [(&str, &str, u64); 12] = [
        (
            "sluice_store_memtable_bytes",
            "Bytes in the memtable.",
            s.memtable_bytes as u64,
        ),
        (
            "sluice_store_memtable_entries",
            "Entries in the memtable.",
            s.memtable_entries as u64,
        ),
        (
            "sluice_store_retired_memtables",
            "Memtables waiting for their flush.",
            s.retired_memtables as u64,
        ),
        (
            "sluice_store_compaction_debt_bytes",
            "Bytes compaction has yet to merge to bring every level within its target.",
            s.compaction_debt_bytes,
        ),
        (
            "sluice_store_block_cache_bytes",
            "Bytes of decoded data blocks cached.",
            s.block_cache_used_bytes as u64,
        ),
        (
            "sluice_store_pinned_index_bytes",
            "Bytes of table indexes and filters pinned in memory.",
            s.pinned_index_bytes as u64,
        ),
        (
            "sluice_store_index_cache_bytes",
            "Bytes of the index cache (tables past the pinning bound).",
            s.index_cache_used_bytes as u64,
        ),
        (
            "sluice_store_table_data_bytes",
            "Bytes of table data.",
            s.table_data_bytes,
        ),
        (
            "sluice_store_table_entries",
            "Entries in tables.",
            s.table_entries,
        ),
        (
            "sluice_store_blob_bytes",
            "Bytes in blob files (large values kept apart from the tree).",
            s.blob_bytes,
        ),
        (
            "sluice_store_device_bytes",
            "Bytes of the store's devices.",
            s.device_blocks * block,
        ),
        (
            "sluice_store_free_bytes",
            "Free bytes of the store's devices.",
            s.free_blocks * block,
        ),
    ];
    for (name, help, value) in gauges {
        single(out, name, "gauge", help, value);
    }
    let counters: [(&str, &str, u64); 7] = [
        (
            "sluice_store_wal_flushes_total",
            "Device flushes of the write-ahead log.",
            s.wal_flushes,
        ),
        (
            "sluice_store_wal_written_bytes_total",
            "Bytes of write-ahead log written.",
            s.wal_written_below * block,
        ),
        (
            "sluice_store_flushes_total",
            "Memtables flushed to tables.",
            s.flushes,
        ),
        (
            "sluice_store_compactions_total",
            "Compactions run.",
            s.compactions,
        ),
        (
            "sluice_store_block_cache_hits_total",
            "Data block reads answered by the cache.",
            s.block_cache_hits,
        ),
        (
            "sluice_store_block_cache_misses_total",
            "Data block reads that went to the device.",
            s.block_cache_misses,
        ),
        (
            "sluice_store_write_stalls_total",
            "Writes held back under write pressure.",
            s.write_stalls,
        ),
    ];
    for (name, help, value) in counters {
        single(out, name, "counter", help, value);
    }
    single(
        out,
        "sluice_store_write_stall_seconds_total",
        "counter",
        "Time writes were held back under write pressure, in all.",
        s.write_stall_us as f64 / 1e6,
    );
    family(
        out,
        "sluice_store_tables",
        "gauge",
        "Tables per level of the tree.",
    );
    for (level, count) in s.tables_per_level.iter().enumerate() {
        sample(
            out,
            "sluice_store_tables",
            &[("level", &level.to_string())],
            count,
        );
    }
    device_io(s, out);
}

/// Device I/O by device and priority class.
fn device_io(s: &sluice_store::StoreStats, out: &mut String) {
    type Field = fn(&sluice_io::device::ClassSnapshot) -> u64;
    let fields: [(&str, &str, Field); 5] = [
        ("sluice_device_reads_total", "Read requests.", |c| c.reads),
        (
            "sluice_device_read_bytes_total",
            "Bytes read requests asked for.",
            |c| c.read_bytes,
        ),
        ("sluice_device_writes_total", "Write requests.", |c| {
            c.writes
        }),
        (
            "sluice_device_write_bytes_total",
            "Bytes write requests carried.",
            |c| c.write_bytes,
        ),
        ("sluice_device_flushes_total", "Flush requests.", |c| {
            c.flushes
        }),
    ];
    for (name, help, field) in fields {
        family(
            out,
            name,
            "counter",
            &format!("{help} By device of the store (0: the first) and I/O priority (high: log and foreground reads; low: flushes, compaction)."),
        );
        for (device, io) in s.device_io.iter().enumerate() {
            let device = device.to_string();
            for (priority, class) in [("high", &io.high), ("low", &io.low)] {
                sample(
                    out,
                    name,
                    &[("device", &device), ("priority", priority)],
                    field(class),
                );
            }
        }
    }
}

/// Answers `GET /metrics` on `listener` with what `render` writes, until
/// the listener fails; every other path is 404. One request a connection,
/// a few seconds at most for it.
pub fn serve(listener: TcpListener, render: Arc<dyn Fn() -> String + Send + Sync>) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        if let Err(e) = answer(stream, &*render) {
            log::debug!("a metrics scrape failed: {e}");
        }
    }
}

/// Binds the metrics listener: loopback addresses only, since it asks no
/// password; `elsewhere` says what to do beyond loopback.
pub fn bind(addr: SocketAddr, elsewhere: &str) -> std::io::Result<TcpListener> {
    if !addr.ip().is_loopback() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "--metrics {addr}: the metrics listener asks no password, so it listens on loopback \
                 only (127.0.0.1 or ::1); {elsewhere}"
            ),
        ));
    }
    TcpListener::bind(addr)
}

/// Most bytes of a scrape's request read.
const MAX_REQUEST_BYTES: usize = 8 << 10;

fn answer(mut stream: TcpStream, render: &dyn Fn() -> String) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut request = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk)?;
        if n == 0 || request.len() + n > MAX_REQUEST_BYTES {
            return Ok(());
        }
        request.extend_from_slice(&chunk[..n]);
    }
    let first = request.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut words = first.split(|&b| b == b' ');
    let (method, path) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    let path = path.split(|&b| b == b'?').next().unwrap_or_default();
    let (status, content_type, body) = match (method, path) {
        (b"GET" | b"HEAD", b"/metrics") => ("200 OK", CONTENT_TYPE, render()),
        _ => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "only GET /metrics is served here\n".to_string(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    if method != b"HEAD" {
        stream.write_all(body.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_fall_in_power_of_two_buckets() {
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(1), 0);
        assert_eq!(latency_bucket(2), 1);
        assert_eq!(latency_bucket(3), 2);
        assert_eq!(latency_bucket(4), 2);
        assert_eq!(latency_bucket(1 << 20), 20);
        assert_eq!(latency_bucket((1 << 20) + 1), LATENCY_BUCKETS);
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BUCKETS);
    }

    #[test]
    fn label_values_are_escaped() {
        let mut out = String::new();
        sample(&mut out, "m", &[("a", "x\"y\\z\nw")], 1);
        assert_eq!(out, "m{a=\"x\\\"y\\\\z\\nw\"} 1\n");
    }

    #[test]
    fn only_loopback_is_bound() {
        let err = bind("0.0.0.0:0".parse().unwrap(), "scrape it through a proxy").unwrap_err();
        assert!(err.to_string().contains("loopback only"), "{err}");
        assert!(err.to_string().contains("through a proxy"), "{err}");
        assert!(bind("127.0.0.1:0".parse().unwrap(), "").is_ok());
    }
}
