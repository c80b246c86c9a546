//! `sluice bench io`: our engine and fio, same file, same parameters, same
//! run. fio runs with its default memory and with huge pages (what our pool
//! uses); the ratio is ours against the better of the two.

use super::{bench_device, fio, median};
use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use rand::{rngs::SmallRng, Rng, SeedableRng};
use sluice_io::engine::{open_engine, Engine, EngineConfig, EngineKind, Op, Request};
use sluice_io::pool::Direction;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct IoArgs {
    /// Benchmark device: a file (created and filled once) or a block device.
    #[arg(long, default_value = "data/bench.dev")]
    device: PathBuf,
    /// Size of the device file in MiB.
    #[arg(long, default_value_t = 1024)]
    size_mib: u64,
    /// Seconds per run of each side.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Runs per row and side, alternating who goes first; medians are reported.
    #[arg(long, default_value_t = 4)]
    repeat: usize,
    /// Our engine: uring or posix (the baseline engine).
    #[arg(long, default_value = "uring")]
    engine: String,
    /// Plain Read/Write on unregistered pool memory instead of fixed buffers (ablation).
    #[arg(long)]
    no_fixed_buffers: bool,
    /// Open the ring without single-issuer deferred task work (ablation).
    #[arg(long)]
    no_defer_taskrun: bool,
    /// Requests queued before the engine submits them (default: the
    /// engine's pick, 1, or 8 with SQPOLL; reap always submits what is queued).
    #[arg(long)]
    submit_batch: Option<usize>,
    /// Only these rows (comma-separated names, as printed).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Skip fio (ours only).
    #[arg(long)]
    no_fio: bool,
    /// Write all figures as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

use crate::io_row::{Row, RunResult};

const ROWS: &[Row] = &[
    Row {
        name: "randread-4k-qd1",
        write: false,
        random: true,
        block_bytes: 4096,
        queue_depth: 1,
        sqpoll: false,
    },
    Row {
        name: "randread-4k-qd32",
        write: false,
        random: true,
        block_bytes: 4096,
        queue_depth: 32,
        sqpoll: false,
    },
    Row {
        name: "randwrite-4k-qd32",
        write: true,
        random: true,
        block_bytes: 4096,
        queue_depth: 32,
        sqpoll: false,
    },
    Row {
        name: "seqread-128k-qd8",
        write: false,
        random: false,
        block_bytes: 128 << 10,
        queue_depth: 8,
        sqpoll: false,
    },
    Row {
        name: "seqwrite-128k-qd8",
        write: true,
        random: false,
        block_bytes: 128 << 10,
        queue_depth: 8,
        sqpoll: false,
    },
    Row {
        name: "seqread-1m-qd8",
        write: false,
        random: false,
        block_bytes: 1 << 20,
        queue_depth: 8,
        sqpoll: false,
    },
    Row {
        name: "seqwrite-1m-qd8",
        write: true,
        random: false,
        block_bytes: 1 << 20,
        queue_depth: 8,
        sqpoll: false,
    },
    Row {
        name: "randread-4k-qd32-sqpoll",
        write: false,
        random: true,
        block_bytes: 4096,
        queue_depth: 32,
        sqpoll: true,
    },
];

/// fio with one kind of buffer memory.
#[derive(serde::Serialize)]
struct FioSide {
    memory: fio::Memory,
    median: RunResult,
    runs: Vec<RunResult>,
}

#[derive(serde::Serialize)]
struct RowReport {
    row: &'static str,
    ours: RunResult,
    ours_runs: Vec<RunResult>,
    fio: Vec<FioSide>,
    /// The fio side with the most IOPS, which the ratio is against.
    best_fio: Option<fio::Memory>,
    /// Median over runs of ours/best fio of the runs made back to back.
    ratio_iops: Option<f64>,
}

pub fn run(args: &IoArgs) -> Result<()> {
    let kind = match args.engine.as_str() {
        "uring" => EngineKind::Uring,
        "posix" => EngineKind::Posix,
        other => bail!("unknown engine {other:?}: use uring or posix"),
    };
    if args.repeat == 0 || args.seconds <= 0.0 {
        bail!("--repeat and --seconds must be positive");
    }
    let device = bench_device(&args.device, args.size_mib << 20)?;
    let fio_bin = if args.no_fio {
        None
    } else {
        Some(fio::locate()?)
    };
    let rows: Vec<Row> = ROWS
        .iter()
        .copied()
        .filter(|r| args.only.is_empty() || args.only.iter().any(|o| o == r.name))
        .collect();
    if rows.is_empty() {
        let names: Vec<&str> = ROWS.iter().map(|r| r.name).collect();
        bail!(
            "no row named {:?}; rows are: {}",
            args.only,
            names.join(", ")
        );
    }
    // fio's huge pages, reserved for the whole benchmark (given back at
    // the end); without them fio runs on its default memory only.
    let mut fio_memories = Vec::new();
    let mut _huge_pages = None;
    if fio_bin.is_some() {
        fio_memories.push(fio::Memory::Malloc);
        let pages = rows.iter().map(fio::huge_pages_for).max().unwrap_or(1);
        match fio::HugePages::reserve(pages) {
            Ok(guard) => {
                _huge_pages = Some(guard);
                fio_memories.push(fio::Memory::ShmHuge);
            }
            Err(e) => eprintln!("fio on huge pages skipped: {e:#}"),
        }
    }
    println!(
        "device {}; {} s per run, {} runs per side, medians; ours = sluice {} engine",
        device.describe(),
        args.seconds,
        args.repeat,
        kind
    );
    let fio_names: Vec<&str> = fio_memories.iter().map(|m| m.describe()).collect();
    println!(
        "memory: ours = pool of 2 MiB-aligned mappings advised as transparent huge pages; fio = {} (the ratio is against the faster)",
        if fio_names.is_empty() { "-".to_string() } else { fio_names.join(" and ") }
    );
    let mut reports = Vec::new();
    for row in rows {
        let mut cfg = engine_config(kind, &row);
        cfg.fixed_buffers = !args.no_fixed_buffers;
        cfg.defer_taskrun = !args.no_defer_taskrun;
        if let Some(batch) = args.submit_batch {
            cfg.submit_batch = batch.min(row.queue_depth);
        }
        let mut engine = open_engine(device.clone(), &cfg)?;
        if reports.is_empty() {
            println!("ours: {}", engine.describe());
            print_header();
        }
        let mut ours_runs = Vec::new();
        let mut fio_runs: Vec<Vec<RunResult>> = vec![Vec::new(); fio_memories.len()];
        let size_bytes = device.geometry().size_bytes();
        let run_fio = |runs: &mut Vec<Vec<RunResult>>| -> Result<()> {
            if let Some(bin) = &fio_bin {
                for (memory, runs) in fio_memories.iter().zip(runs.iter_mut()) {
                    let r = fio::run(bin, &args.device, size_bytes, &row, args.seconds, *memory)?;
                    runs.push(r);
                }
            }
            Ok(())
        };
        for rep in 0..args.repeat {
            // Alternate who goes first: the device (and the host behind a
            // virtual disk) warms up, and neither side should always get the
            // warm or the cold slot.
            let fio_first = rep % 2 == 1;
            if fio_first {
                run_fio(&mut fio_runs)?;
            }
            ours_runs.push(run_ours(engine.as_mut(), &row, args.seconds)?);
            if !fio_first {
                run_fio(&mut fio_runs)?;
            }
        }
        let ours = median_result(&ours_runs);
        let fio: Vec<FioSide> = fio_memories
            .iter()
            .zip(fio_runs)
            .map(|(memory, runs)| FioSide {
                memory: *memory,
                median: median_result(&runs),
                runs,
            })
            .collect();
        let best = fio
            .iter()
            .max_by(|a, b| a.median.iops.total_cmp(&b.median.iops));
        // The median of the ratios of adjacent pairs: a drift of the disk
        // over the minutes of a row cancels out within each pair.
        let ratio_against = |side: &FioSide| {
            let mut pairs: Vec<f64> = ours_runs
                .iter()
                .zip(&side.runs)
                .map(|(o, f)| o.iops / f.iops)
                .collect();
            median(&mut pairs)
        };
        let ratio_iops = best.map(ratio_against);
        print_row(&row, &ours, best, ratio_iops);
        for other in fio
            .iter()
            .filter(|s| best.is_some_and(|b| b.memory != s.memory))
        {
            println!(
                "{:<24} {:>10} {:>10.0} {:>8} {:>7.2}   (fio on {})",
                "",
                "",
                other.median.iops,
                other.memory.describe(),
                ratio_against(other),
                other.memory.describe()
            );
        }
        reports.push(RowReport {
            row: row.name,
            ours,
            ours_runs,
            best_fio: best.map(|b| b.memory),
            ratio_iops,
            fio,
        });
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&reports)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn engine_config(kind: EngineKind, row: &Row) -> EngineConfig {
    let mut cfg = EngineConfig {
        kind,
        queue_depth: row.queue_depth,
        sqpoll_idle_ms: row.sqpoll.then_some(100),
        posix_threads: row.queue_depth,
        ..EngineConfig::default()
    };
    // Enough small blocks that every in-flight 4 KiB request has a pinned one.
    cfg.pool.small_read_blocks = cfg.pool.small_read_blocks.max(row.queue_depth as u32);
    cfg.pool.small_write_blocks = cfg.pool.small_write_blocks.max(row.queue_depth as u32);
    cfg
}

fn median_result(runs: &[RunResult]) -> RunResult {
    let pick = |f: &dyn Fn(&RunResult) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
    RunResult {
        iops: pick(&|r| r.iops),
        mb_per_s: pick(&|r| r.mb_per_s),
        lat_us: [
            pick(&|r| r.lat_us[0]),
            pick(&|r| r.lat_us[1]),
            pick(&|r| r.lat_us[2]),
            pick(&|r| r.lat_us[3]),
        ],
    }
}

/// Keeps `queue_depth` requests in flight for `seconds`, each buffer taken
/// from the engine's pool once and reused, as fio does with fixedbufs.
fn run_ours(engine: &mut dyn Engine, row: &Row, seconds: f64) -> Result<RunResult> {
    let g = engine.device().geometry();
    let bs_blocks = (row.block_bytes / g.block_size_bytes as usize) as u64;
    let slots = g.block_count / bs_blocks;
    let mut rng = SmallRng::seed_from_u64(0x10_u64 + row.queue_depth as u64);
    let mut next_seq = 0u64;
    let mut next_lba = |rng: &mut SmallRng| {
        let slot = if row.random {
            rng.gen_range(0..slots)
        } else {
            let s = next_seq % slots;
            next_seq += 1;
            s
        };
        slot * bs_blocks
    };
    let direction = if row.write {
        Direction::Write
    } else {
        Direction::Read
    };
    let mut started = vec![Instant::now(); row.queue_depth];
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let make = |lba, buf, ud| {
        if row.write {
            Request::write(lba, buf, ud)
        } else {
            Request::read(lba, buf, ud)
        }
    };
    for (ud, started_at) in started.iter_mut().enumerate() {
        let mut buf = engine.pool().alloc(row.block_bytes, direction)?;
        if row.write {
            buf.write_at(0, &vec![0xA5; row.block_bytes]);
        }
        *started_at = Instant::now();
        engine
            .submit(make(next_lba(&mut rng), buf, ud as u64))
            .map_err(|r| r.error)?;
    }
    let begin = Instant::now();
    let deadline = begin + Duration::from_secs_f64(seconds);
    let mut done_ops = 0u64;
    let mut out = Vec::with_capacity(row.queue_depth);
    loop {
        out.clear();
        engine.reap(1, &mut out)?;
        let now = Instant::now();
        let stopping = now >= deadline;
        for c in out.drain(..) {
            let ud = c.user_data as usize;
            if let Err(e) = &c.result {
                bail!(
                    "{} at LBA {} failed: {e}",
                    if c.op == Op::Write { "write" } else { "read" },
                    c.lba
                );
            }
            hist.record((now - started[ud]).as_nanos() as u64)?;
            done_ops += 1;
            if !stopping {
                started[ud] = Instant::now();
                #[expect(
                    clippy::expect_used,
                    reason = "the engine hands a request's buffer back with its completion"
                )]
                let buf = c.buf.expect("buffer comes back");
                engine
                    .submit(make(next_lba(&mut rng), buf, ud as u64))
                    .map_err(|r| r.error)?;
            }
        }
        if stopping && engine.in_flight() == 0 {
            break;
        }
    }
    let elapsed = begin.elapsed().as_secs_f64();
    let iops = done_ops as f64 / elapsed;
    let q = |p: f64| hist.value_at_quantile(p) as f64 / 1000.0;
    Ok(RunResult {
        iops,
        mb_per_s: iops * row.block_bytes as f64 / 1e6,
        lat_us: [q(0.5), q(0.9), q(0.99), q(0.999)],
    })
}

fn print_header() {
    println!(
        "{:<24} {:>10} {:>10} {:>8} {:>7} {:>9} {:>9}   {:<31} {:<31}",
        "row",
        "ours IOPS",
        "fio IOPS",
        "fio mem",
        "ours/fio",
        "ours MB/s",
        "fio MB/s",
        "ours lat us p50/p90/p99/p99.9",
        "fio lat us p50/p90/p99/p99.9"
    );
}

fn lat(r: &RunResult) -> String {
    format!(
        "{:.0}/{:.0}/{:.0}/{:.0}",
        r.lat_us[0], r.lat_us[1], r.lat_us[2], r.lat_us[3]
    )
}

fn print_row(row: &Row, ours: &RunResult, side: Option<&FioSide>, ratio: Option<f64>) {
    let dash = || "-".to_string();
    let fio = side.map(|s| &s.median);
    println!(
        "{:<24} {:>10.0} {:>10} {:>8} {:>7} {:>9.1} {:>9}   {:<31} {:<31}",
        row.name,
        ours.iops,
        fio.map_or_else(dash, |f| format!("{:.0}", f.iops)),
        side.map_or_else(dash, |s| s.memory.describe().to_string()),
        ratio.map_or_else(dash, |r| format!("{r:.2}")),
        ours.mb_per_s,
        fio.map_or_else(dash, |f| format!("{:.1}", f.mb_per_s)),
        lat(ours),
        fio.map_or_else(dash, lat),
    );
}
