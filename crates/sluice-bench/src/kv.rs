//! `sluice bench kv`: db_bench's workloads on Sluice's store, and RocksDB's
//! db_bench with the same parameters in the same run.

use super::median;
use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use rand::{rngs::SmallRng, Rng, SeedableRng};
use sluice_store::{Store, StoreConfig, StoreFiles, WriteBatch, WriteOptions};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Flags are db_bench's, spelled as db_bench spells them.
#[derive(clap::Args)]
pub struct KvBenchArgs {
    /// Comma-separated db_bench workloads: fillseq, fillrandom, overwrite,
    /// readrandom, seekrandom, readseq.
    #[arg(
        long,
        default_value = "fillrandom,overwrite,readrandom,seekrandom,readseq,fillseq"
    )]
    benchmarks: String,
    /// Keys written by each fill.
    #[arg(long, default_value_t = 100_000)]
    num: u64,
    /// Operations of each read workload (default: --num).
    #[arg(long)]
    reads: Option<u64>,
    #[arg(long = "key_size", default_value_t = 16)]
    key_size: usize,
    #[arg(long = "value_size", default_value_t = 200)]
    value_size: usize,
    /// Block cache bytes.
    #[arg(long = "cache_size", default_value_t = 5 << 20)]
    cache_size: u64,
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Entries read after each seek in seekrandom.
    #[arg(long = "seek_nexts", default_value_t = 100)]
    seek_nexts: usize,
    /// Make every write durable before it returns (db_bench --sync).
    #[arg(long)]
    sync: bool,
    /// Keep values of at least this many bytes apart from the tree on
    /// both sides: db_bench's integrated BlobDB (`--enable_blob_files`,
    /// with its garbage collection) and our blob files (4 KiB to 1 MiB).
    #[arg(long = "min_blob_size")]
    min_blob_size: Option<usize>,
    /// Run our log's engines on SQPOLL rings with this idle time (ms):
    /// commits then make no system call while the kernel threads are awake
    #[arg(long, value_name = "IDLE_MS")]
    wal_sqpoll: Option<u32>,
    /// Our device file (created as needed).
    #[arg(long, default_value = "data/kv-bench.dev")]
    device: PathBuf,
    /// db_bench's database directory.
    #[arg(long, default_value = "data/rocksdb-bench")]
    rocksdb_dir: PathBuf,
    /// Runs per side; medians are reported.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Skip db_bench.
    #[arg(long)]
    no_rocksdb: bool,
    #[arg(long)]
    json: Option<PathBuf>,
}

const KNOWN: &[&str] = &[
    "fillseq",
    "fillrandom",
    "overwrite",
    "readrandom",
    "seekrandom",
    "readseq",
];

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Figures {
    ops_per_s: f64,
    p50_us: f64,
    p99_us: f64,
}

/// db_bench's key: the number big-endian in the first 8 bytes, '0' after.
fn make_key(n: u64, key_size: usize) -> Vec<u8> {
    let mut k = vec![b'0'; key_size.max(8)];
    k[..8].copy_from_slice(&n.to_be_bytes());
    k
}

pub fn run(args: &KvBenchArgs) -> Result<()> {
    let workloads: Vec<&str> = args
        .benchmarks
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    for w in &workloads {
        if !KNOWN.contains(w) {
            bail!("unknown workload {w:?}; known: {}", KNOWN.join(", "));
        }
    }
    if args.key_size < 8
        || args.value_size == 0
        || args.num == 0
        || args.threads == 0
        || args.repeat == 0
    {
        bail!(
            "--key_size must be at least 8, and --value_size, --num, --threads, --repeat positive"
        );
    }
    if !args.no_rocksdb {
        Command::new("db_bench")
            .arg("--help")
            .output()
            .context("db_bench not found: install Debian's rocksdb-tools (scripts/setup does), or pass --no-rocksdb")?;
    }
    let reads = args.reads.unwrap_or(args.num);
    if let Some(n) = args.min_blob_size {
        let ours = n.clamp(
            sluice_store::blob::MIN_THRESHOLD_BYTES,
            sluice_store::blob::MAX_THRESHOLD_BYTES,
        );
        println!("values of at least {n} bytes in blob files (ours from {ours} bytes: its bounds)");
    }
    println!(
        "num {} keys of {} bytes, values {} bytes, {} reads, {} thread(s), sync {}, cache {} bytes; {} run(s) per side",
        args.num, args.key_size, args.value_size, reads, args.threads, args.sync, args.cache_size, args.repeat
    );
    println!(
        "{:<12} {:>12} {:>12} {:>9} {:>14} {:>14}",
        "workload", "ours ops/s", "rocksdb ops/s", "ours/rdb", "ours p50/p99", "rdb p50/p99"
    );
    let mut report = Vec::new();
    let (mut ours_runs, mut rdb_runs): (Vec<Vec<Figures>>, Vec<Vec<Figures>>) = (
        vec![Vec::new(); workloads.len()],
        vec![Vec::new(); workloads.len()],
    );
    for _ in 0..args.repeat {
        for (i, f) in run_ours(args, &workloads, reads)?.into_iter().enumerate() {
            ours_runs[i].push(f);
        }
        if !args.no_rocksdb {
            for (i, f) in run_db_bench(args, &workloads, reads)?
                .into_iter()
                .enumerate()
            {
                rdb_runs[i].push(f);
            }
        }
    }
    for (i, w) in workloads.iter().enumerate() {
        let ours = med(&ours_runs[i]);
        let rdb = (!rdb_runs[i].is_empty()).then(|| med(&rdb_runs[i]));
        let dash = || "-".to_string();
        println!(
            "{:<12} {:>12.0} {:>12} {:>9} {:>14} {:>14}",
            w,
            ours.ops_per_s,
            rdb.as_ref()
                .map_or_else(dash, |r| format!("{:.0}", r.ops_per_s)),
            rdb.as_ref()
                .map_or_else(dash, |r| format!("{:.2}", ours.ops_per_s / r.ops_per_s)),
            format!("{:.1}/{:.1}", ours.p50_us, ours.p99_us),
            rdb.as_ref()
                .map_or_else(dash, |r| format!("{:.1}/{:.1}", r.p50_us, r.p99_us)),
        );
        report.push(serde_json::json!({ "workload": w, "ours": ours, "rocksdb": rdb }));
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

fn med(runs: &[Figures]) -> Figures {
    let pick = |f: &dyn Fn(&Figures) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
    Figures {
        ops_per_s: pick(&|r| r.ops_per_s),
        p50_us: pick(&|r| r.p50_us),
        p99_us: pick(&|r| r.p99_us),
    }
}

fn device_bytes(args: &KvBenchArgs) -> u64 {
    let data = args.num * (args.key_size + args.value_size) as u64 * args.threads as u64;
    (data * 4 + (512 << 20)).next_multiple_of(1 << 20)
}

fn fresh_store(args: &KvBenchArgs) -> Result<Store> {
    let defaults = StoreConfig::default();
    let config = StoreConfig {
        block_cache_bytes: args.cache_size as usize,
        wal_sqpoll_idle_ms: args.wal_sqpoll,
        blob_threshold_bytes: args.min_blob_size.unwrap_or(defaults.blob_threshold_bytes),
        ..defaults
    };
    let files = StoreFiles::new([&args.device])
        .config(config)
        .create_bytes(device_bytes(args))
        .wal_blocks(defaults.wal_blocks);
    Ok(files.format()?)
}

/// Runs `op(thread, i)` `count` times on each of `threads` threads and
/// returns ops/s and the latency histogram.
fn timed(
    threads: usize,
    count: u64,
    op: &(dyn Fn(usize, u64, &mut SmallRng) -> Result<()> + Sync),
) -> Result<Figures> {
    let start = Instant::now();
    let hists: Vec<Result<Histogram<u64>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || -> Result<Histogram<u64>> {
                    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
                    let mut rng = SmallRng::seed_from_u64(301 + t as u64);
                    for i in 0..count {
                        let t0 = Instant::now();
                        op(t, i, &mut rng)?;
                        h.record(t0.elapsed().as_nanos() as u64)?;
                    }
                    Ok(h)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a benchmark thread panicked"))?
            })
            .collect()
    });
    let elapsed = start.elapsed().as_secs_f64();
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    for h in hists {
        all.add(h?)?;
    }
    Ok(Figures {
        ops_per_s: (count * threads as u64) as f64 / elapsed,
        p50_us: all.value_at_quantile(0.5) as f64 / 1000.0,
        p99_us: all.value_at_quantile(0.99) as f64 / 1000.0,
    })
}

fn run_ours(args: &KvBenchArgs, workloads: &[&str], reads: u64) -> Result<Vec<Figures>> {
    let mut store: Option<Store> = None;
    let value: Vec<u8> = {
        let mut rng = SmallRng::seed_from_u64(7);
        (0..args.value_size).map(|_| rng.gen()).collect()
    };
    let wopts = WriteOptions { sync: args.sync };
    let mut out = Vec::new();
    // The workloads run on the current store, for its report.
    let mut ran: Vec<&str> = Vec::new();
    for &w in workloads {
        if w.starts_with("fill") || store.is_none() {
            if let Some(st) = store.take() {
                report_store(&st, args, &ran);
            }
            ran.clear();
            store = Some(fresh_store(args)?);
        }
        ran.push(w);
        #[expect(
            clippy::expect_used,
            reason = "the store was made just above when there was none"
        )]
        let st = store.as_ref().expect("store");
        let (num, ks) = (args.num, args.key_size);
        let put = |k: u64| -> Result<()> {
            let mut b = WriteBatch::new();
            b.put(0, &make_key(k, ks), &value)?;
            st.write_with(&b, wopts)?;
            Ok(())
        };
        let figures = match w {
            "fillseq" => timed(args.threads, num, &|t, i, _| put(t as u64 * num + i))?,
            "fillrandom" | "overwrite" => {
                timed(args.threads, num, &|_, _, rng| put(rng.gen_range(0..num)))?
            }
            "readrandom" => timed(args.threads, reads, &|_, _, rng| {
                st.get(0, &make_key(rng.gen_range(0..num), ks))?;
                Ok(())
            })?,
            "seekrandom" => {
                let nexts = args.seek_nexts + 1;
                timed(args.threads, reads, &|_, _, rng| {
                    let k = make_key(rng.gen_range(0..num), ks);
                    let snap = st.snapshot();
                    // A scan with a limit: the store sizes its first reads for it.
                    st.scan(
                        0,
                        (Bound::Included(&k), Bound::Unbounded),
                        &snap,
                        false,
                        nexts,
                    )?;
                    Ok(())
                })?
            }
            "readseq" => {
                // One pass over every key, in order, counted per key read;
                // no per-key timing, so both latency columns are the mean.
                let t0 = Instant::now();
                let snap = st.snapshot();
                let mut n = 0usize;
                for row in st.iter(0, (Bound::Unbounded, Bound::Unbounded), &snap, false) {
                    row?;
                    n += 1;
                }
                let secs = t0.elapsed().as_secs_f64();
                Figures {
                    ops_per_s: n as f64 / secs,
                    p50_us: secs * 1e6 / n.max(1) as f64,
                    p99_us: secs * 1e6 / n.max(1) as f64,
                }
            }
            _ => unreachable!("checked above"),
        };
        out.push(figures);
    }
    if let Some(st) = &store {
        report_store(st, args, &ran);
    }
    Ok(out)
}

/// One line on a store's memory and shape after the workloads `ran` on it.
fn report_store(st: &Store, args: &KvBenchArgs, ran: &[&str]) {
    let s = st.stats();
    let written = args.num * (args.key_size + args.value_size) as u64 * args.threads as u64;
    let pct = |of: u64| 100.0 * s.pinned_index_bytes as f64 / of.max(1) as f64;
    println!(
        "ours after {}: index+filter pinned {} bytes = {:.2}% of the {} bytes of table data blocks, {:.2}% of the {} bytes of keys and values one fill writes over all threads ({} tables unpinned); tables per level {:?}; block cache {} hits, {} misses; device {} of {} blocks free",
        ran.join(","),
        s.pinned_index_bytes,
        pct(s.table_data_bytes),
        s.table_data_bytes,
        pct(written),
        written,
        s.unpinned_tables,
        s.tables_per_level,
        s.block_cache_hits,
        s.block_cache_misses,
        s.free_blocks,
        s.device_blocks
    );
    if args.sync && s.wal_flushes > 0 {
        // Every write on this store (it is fresh at each fill) was synced:
        // how many each durable WAL write (one group) carried on average.
        let writing = ran
            .iter()
            .filter(|w| w.starts_with("fill") || **w == "overwrite");
        let synced = args.num * args.threads as u64 * writing.count() as u64;
        println!(
            "ours WAL groups: {} durable writes for {} synced writes ({:.1} writes per group)",
            s.wal_flushes,
            synced,
            synced as f64 / s.wal_flushes as f64
        );
    }
}

fn run_db_bench(args: &KvBenchArgs, workloads: &[&str], reads: u64) -> Result<Vec<Figures>> {
    let _ = std::fs::remove_dir_all(&args.rocksdb_dir);
    std::fs::create_dir_all(&args.rocksdb_dir)?;
    // db_bench's read workloads need the data of a fill: it runs the list
    // in order on one database, like ours.
    let out = Command::new("db_bench")
        .arg(format!("--db={}", absolute(&args.rocksdb_dir)?.display()))
        .arg(format!("--benchmarks={}", workloads.join(",")))
        .arg(format!("--num={}", args.num))
        .arg(format!("--reads={reads}"))
        .arg(format!("--key_size={}", args.key_size))
        .arg(format!("--value_size={}", args.value_size))
        .arg(format!("--cache_size={}", args.cache_size))
        .arg(format!("--threads={}", args.threads))
        .arg(format!("--seek_nexts={}", args.seek_nexts))
        .arg(format!("--sync={}", args.sync))
        .args(args.min_blob_size.map_or_else(Vec::new, |n| {
            vec![
                "--enable_blob_files=true".to_string(),
                format!("--min_blob_size={n}"),
                "--enable_blob_garbage_collection=true".to_string(),
            ]
        }))
        .args([
            "--use_direct_reads=true",
            "--use_direct_io_for_flush_and_compaction=true",
            "--compression_type=none",
            "--histogram=1",
            "--statistics=false",
        ])
        .output()
        .context("running db_bench")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "db_bench failed: {}{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse_db_bench(&text, workloads)
}

fn absolute(p: &Path) -> Result<PathBuf> {
    Ok(if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    })
}

/// Reads "name : X micros/op Y ops/sec ..." and the following
/// "Percentiles: P50: a ... P99: b" for each workload.
pub fn parse_db_bench(text: &str, workloads: &[&str]) -> Result<Vec<Figures>> {
    let lines: Vec<&str> = text.lines().collect();
    workloads
        .iter()
        .map(|w| {
            let at = lines
                .iter()
                .position(|l| {
                    l.split(':').next().is_some_and(|n| n.trim() == *w) && l.contains("ops/sec")
                })
                .with_context(|| format!("db_bench printed no result line for {w}"))?;
            let words: Vec<&str> = lines[at].split_whitespace().collect();
            let ops = words
                .iter()
                .position(|x| *x == "ops/sec")
                .and_then(|i| words.get(i - 1))
                .and_then(|x| x.parse::<f64>().ok())
                .with_context(|| format!("no ops/sec in {:?}", lines[at]))?;
            let pct = lines[at..]
                .iter()
                .find(|l| l.starts_with("Percentiles:"))
                .with_context(|| format!("db_bench printed no percentiles for {w}"))?;
            let p = |name: &str| -> Option<f64> {
                let ws: Vec<&str> = pct.split_whitespace().collect();
                ws.iter()
                    .position(|x| *x == name)
                    .and_then(|i| ws.get(i + 1))
                    .and_then(|x| x.parse().ok())
            };
            Ok(Figures {
                ops_per_s: ops,
                p50_us: p("P50:").unwrap_or(f64::NAN),
                p99_us: p("P99:").unwrap_or(f64::NAN),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_db_bench_output() {
        let text = "fillrandom   :       5.765 micros/op 173442 ops/sec 0.577 seconds 100000 operations;   35.7 MB/s\nMicroseconds per write:\nCount: 1\nPercentiles: P50: 4.85 P75: 6.11 P99: 14.33 P99.9: 40.12 P99.99: 88.36\nreadrandom   :       3.907 micros/op 255702 ops/sec 0.078 seconds 20000 operations;\nPercentiles: P50: 2.90 P75: 3.83 P99: 9.96 P99.9: 80.25\n";
        let f = parse_db_bench(text, &["fillrandom", "readrandom"]).unwrap();
        assert_eq!(f[0].ops_per_s, 173442.0);
        assert_eq!((f[0].p50_us, f[0].p99_us), (4.85, 14.33));
        assert_eq!((f[1].ops_per_s, f[1].p99_us), (255702.0, 9.96));
        assert!(parse_db_bench(text, &["seekrandom"]).is_err());
    }

    #[test]
    fn keys_follow_db_bench() {
        assert_eq!(
            make_key(258, 16),
            [0, 0, 0, 0, 0, 0, 1, 2, b'0', b'0', b'0', b'0', b'0', b'0', b'0', b'0']
        );
    }
}
