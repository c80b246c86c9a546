//! `sluice kv`: the key/value store on a device path.

use anyhow::{bail, Result};
use clap::Subcommand;
use sluice_ndp::Layout;
use sluice_store::{Store, StoreConfig, ValueFormat};
use std::io::{IsTerminal, Write};
use std::ops::Bound;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct KvArgs {
    #[command(flatten)]
    store: crate::StoreOpenArgs,
    /// Device: a file (created with --create-mib) or a block device.
    /// Repeat it to spread a store over several devices: the first holds
    /// the WAL, manifest and table indexes, the others the table data.
    #[arg(long = "device", default_value = "data/kv.dev")]
    devices: Vec<PathBuf>,
    /// Keyspace to use.
    #[arg(long, default_value = "default")]
    keyspace: String,
    /// Memtable size before a flush to a table, in KiB.
    #[arg(long, default_value_t = 65536)]
    write_buffer_kib: usize,
    #[command(subcommand)]
    command: KvCommand,
}

#[derive(Subcommand)]
enum KvCommand {
    /// Format the device as a new, empty store (erases it).
    Format {
        /// Create (or grow) a file of this many MiB first.
        #[arg(long)]
        create_mib: Option<u64>,
        /// WAL ring size in 4 KiB blocks (default: an eighth of the first
        /// device, at most 16384 = 64 MiB).
        #[arg(long)]
        wal_blocks: Option<u32>,
    },
    /// Create a keyspace with a declared value format: raw, json or record.
    Keyspace {
        name: String,
        #[arg(long, default_value = "raw")]
        format: String,
        /// Schema of a record keyspace, e.g. "name:str,year:u32".
        #[arg(long, default_value = "")]
        schema: String,
    },
    /// Drop a keyspace and everything in it (durable; its space is freed).
    DropKeyspace { name: String },
    /// Write one key; durable when it returns.
    Put {
        key: String,
        /// Bytes as given; JSON for a record keyspace.
        value: String,
    },
    /// Print one key's value (an error naming the key if it is absent).
    Get { key: String },
    /// Delete one key.
    Del { key: String },
    /// Keys in [start, end) (or with a prefix), in order.
    Scan {
        #[arg(long)]
        start: Option<String>,
        #[arg(long)]
        end: Option<String>,
        #[arg(long)]
        prefix: Option<String>,
        #[arg(long)]
        reverse: bool,
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Counters: sequence, memtable, WAL, free space, tables per level, caches.
    Stats,
    /// Flush and compact until every keyspace's data sits in one level.
    Compact,
    /// Write keys PREFIX000000.. one by one, printing each key once its
    /// write is durable (the crash tests kill it with SIGKILL).
    #[command(hide = true)]
    Load {
        #[arg(long, default_value_t = 1000)]
        count: u64,
        #[arg(long, default_value = "load-")]
        prefix: String,
        #[arg(long, default_value_t = 100)]
        value_bytes: usize,
    },
}

pub fn run(args: &KvArgs) -> Result<()> {
    if let KvCommand::Format {
        create_mib,
        wal_blocks,
    } = &args.command
    {
        return format(args, *create_mib, *wal_blocks);
    }
    let store = args.store.open(
        &args.devices,
        StoreConfig {
            write_buffer_bytes: args.write_buffer_kib << 10,
            ..StoreConfig::default()
        },
    )?;
    match &args.command {
        KvCommand::Keyspace {
            name,
            format,
            schema,
        } => {
            let format: ValueFormat = format.parse().map_err(anyhow::Error::msg)?;
            sluice_ndp::check_definition(format, schema)?;
            let id = store.create_keyspace(name, format, schema)?;
            println!("keyspace {name} created (id {id})");
            Ok(())
        }
        KvCommand::DropKeyspace { name } => {
            store.drop_keyspace(name)?;
            println!("keyspace {name} dropped");
            Ok(())
        }
        _ => run_in_keyspace(args, &store),
    }
}

/// `sluice kv format`.
fn format(args: &KvArgs, create_mib: Option<u64>, wal_blocks: Option<u32>) -> Result<()> {
    let mut files = args.store.files(&args.devices, StoreConfig::default());
    if let Some(mib) = create_mib {
        files = files.create_bytes(mib << 20);
    }
    if let Some(blocks) = wal_blocks {
        files = files.wal_blocks(blocks);
    }
    let store = files.format()?;
    let names: Vec<String> = args
        .devices
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    println!(
        "formatted {}: {} blocks",
        names.join(" + "),
        store.stats().device_blocks
    );
    Ok(())
}

/// The commands on one keyspace's entries, and the store's figures.
fn run_in_keyspace(args: &KvArgs, store: &Store) -> Result<()> {
    let def = store.keyspace_def(&args.keyspace)?;
    let ks = def.id;
    let layout = Layout::of(&def).ok();
    let out = std::io::stdout();
    let mut out = out.lock();
    match &args.command {
        KvCommand::Put { key, value } => {
            let encoded = sluice_ndp::encode_value(&def, value)?;
            let seq = store.put(ks, key.as_bytes(), &encoded)?;
            writeln!(out, "ok (sequence {seq})")?;
        }
        KvCommand::Get { key } => match store.get(ks, key.as_bytes())? {
            Some(v) => writeln!(
                out,
                "{}",
                shown(layout.as_ref(), &v, std::io::stdout().is_terminal())?
            )?,
            None => bail!("key {key:?} not found in keyspace {}", args.keyspace),
        },
        KvCommand::Del { key } => {
            store.delete(ks, key.as_bytes())?;
            writeln!(out, "ok")?;
        }
        KvCommand::Scan {
            start,
            end,
            prefix,
            reverse,
            limit,
        } => {
            let range = ScanRange {
                start: start.as_deref(),
                end: end.as_deref(),
                prefix: prefix.as_deref(),
                reverse: *reverse,
                limit: *limit,
            };
            scan(store, ks, layout.as_ref(), &range, &mut out)?;
        }
        KvCommand::Compact => {
            store.compact()?;
            let s = store.stats();
            writeln!(
                out,
                "compacted: tables per level {:?}, {} entries in {} bytes of table data, {} of {} blocks free",
                s.tables_per_level, s.table_entries, s.table_data_bytes, s.free_blocks, s.device_blocks
            )?;
        }
        KvCommand::Stats => print_stats(&store.stats(), &mut out)?,
        KvCommand::Load {
            count,
            prefix,
            value_bytes,
        } => {
            let value = vec![b'v'; *value_bytes];
            for i in 0..*count {
                let key = format!("{prefix}{i:06}");
                store.put(ks, key.as_bytes(), &value)?;
                writeln!(out, "{key}")?;
                out.flush()?;
            }
        }
        KvCommand::Format { .. } | KvCommand::Keyspace { .. } | KvCommand::DropKeyspace { .. } => {
            unreachable!("handled by run")
        }
    }
    Ok(())
}

/// What `sluice kv scan` reads.
struct ScanRange<'a> {
    start: Option<&'a str>,
    end: Option<&'a str>,
    prefix: Option<&'a str>,
    reverse: bool,
    limit: usize,
}

/// Prints the entries of `range`, streamed: memory stays bounded however
/// many rows match.
fn scan(
    store: &Store,
    ks: u32,
    layout: Option<&Layout>,
    range: &ScanRange<'_>,
    out: &mut impl Write,
) -> Result<()> {
    let snap = store.snapshot();
    let rows = match range.prefix {
        Some(p) => store.iter_prefix(ks, p.as_bytes(), &snap, range.reverse),
        None => {
            let lo = range
                .start
                .map_or(Bound::Unbounded, |s| Bound::Included(s.as_bytes()));
            let hi = range
                .end
                .map_or(Bound::Unbounded, |s| Bound::Excluded(s.as_bytes()));
            store.iter(ks, (lo, hi), &snap, range.reverse)
        }
    };
    let terminal = std::io::stdout().is_terminal();
    for row in rows.take(range.limit) {
        let (k, v) = row?;
        writeln!(
            out,
            "{}\t{}",
            printable(&k, terminal),
            shown(layout, &v, terminal)?
        )?;
    }
    Ok(())
}

/// `sluice kv stats`.
fn print_stats(s: &sluice_store::StoreStats, out: &mut impl Write) -> Result<()> {
    writeln!(out, "last sequence     {}", s.last_sequence)?;
    writeln!(
        out,
        "memtable entries  {} ({} bytes)",
        s.memtable_entries, s.memtable_bytes
    )?;
    writeln!(
        out,
        "wal written/durable below block {} / {}, {} flushes",
        s.wal_written_below, s.wal_durable_below, s.wal_flushes
    )?;
    writeln!(
        out,
        "free blocks       {} of {}",
        s.free_blocks, s.device_blocks
    )?;
    writeln!(out, "keyspaces         {}", s.keyspaces.join(", "))?;
    writeln!(out, "tables per level  {:?}", s.tables_per_level)?;
    writeln!(
        out,
        "blob files        {} ({} bytes), {} values moved out of mostly-empty ones",
        s.blob_files, s.blob_bytes, s.blob_relocations
    )?;
    if s.device_free_blocks.len() > 1 {
        writeln!(out, "free per device   {:?}", s.device_free_blocks)?;
    }
    writeln!(
        out,
        "index+filter      {} bytes pinned (bound {}), {} tables unpinned, index cache {} bytes",
        s.pinned_index_bytes,
        s.pinned_index_limit_bytes,
        s.unpinned_tables,
        s.index_cache_used_bytes
    )?;
    writeln!(
        out,
        "block cache       {} bytes, {} hits, {} misses",
        s.block_cache_used_bytes, s.block_cache_hits, s.block_cache_misses
    )?;
    Ok(())
}

/// A value as printed: records as JSON, everything else as text.
fn shown(layout: Option<&Layout>, value: &[u8], terminal: bool) -> Result<String> {
    match layout.filter(|l| l.is_record()) {
        Some(l) => {
            let mut text = Vec::new();
            l.to_json(value, &mut text)?;
            Ok(String::from_utf8(text)?)
        }
        None => Ok(printable(value, terminal)),
    }
}

/// Bytes as text. To a terminal, bytes that are not printable UTF-8 (a
/// binary key, control characters, the tab that separates columns) are
/// escaped as `\xNN`, so they can neither garble the screen nor pass for
/// other keys; to a pipe or file, the text as it is.
fn printable(bytes: &[u8], terminal: bool) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) if !terminal || !text.chars().any(char::is_control) => text.to_string(),
        _ if !terminal => String::from_utf8_lossy(bytes).into_owned(),
        _ => bytes.escape_ascii().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn binary_keys_are_escaped_on_a_terminal_and_passed_through_elsewhere() {
        let edge = [0u8, 0, 0, 7, b'\t', 0x1b, 0xff, b'a'];
        assert_eq!(printable(&edge, true), "\\x00\\x00\\x00\\x07\\t\\x1b\\xffa");
        assert_eq!(printable("paper:1 é".as_bytes(), true), "paper:1 é");
        assert_eq!(printable(b"a\tb", false), "a\tb");
        assert_eq!(printable(&[0xff, b'x'], false), "\u{fffd}x");
    }
}
