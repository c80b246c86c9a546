//! `sluice bench pool`: the uDMA paper's two experiments, measured here.
//!
//! 1. Cost of pinning + registering a buffer (allocate, register in the
//!    ring's buffer table, unregister, free) against copying the same bytes
//!    with memcpy, by size; the crossover is where pinning becomes cheaper.
//! 2. Mean response time of one read at queue depth 1, by size, with a
//!    buffer from the pool, with a buffer allocated and registered for the
//!    request, and with an unregistered buffer allocated for the request.

use super::{bench_device, median};
use anyhow::{bail, Result};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use sluice_io::engine::{open_engine, Engine, EngineConfig, EngineKind, Request};
use sluice_io::pool::{Direction, IoBuf};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct PoolArgs {
    #[arg(long, default_value = "data/bench.dev")]
    device: PathBuf,
    #[arg(long, default_value_t = 1024)]
    size_mib: u64,
    /// Rounds; each round runs every mode once, and medians are reported.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Write all figures as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

const PIN_SIZES: &[usize] = &[
    1 << 10,
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    64 << 20,
];
const IO_SIZES: &[usize] = &[
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    2 << 20,
    4 << 20,
    8 << 20,
];

#[derive(serde::Serialize)]
struct PinRow {
    size_bytes: usize,
    pin_register_us: f64,
    memcpy_us: f64,
}

#[derive(serde::Serialize)]
struct IoRow {
    size_bytes: usize,
    pool_us: f64,
    per_request_us: f64,
    unregistered_us: f64,
}

pub fn run(args: &PoolArgs) -> Result<()> {
    if args.rounds == 0 {
        bail!("--rounds must be positive");
    }
    let device = bench_device(&args.device, args.size_mib << 20)?;
    let mut cfg = EngineConfig {
        kind: EngineKind::Uring,
        queue_depth: 1,
        allow_fallback: false,
        ..EngineConfig::default()
    };
    cfg.pool.max_pinned_bytes = 512 << 20;
    let mut engine = open_engine(device, &cfg)?;
    println!(
        "engine {}; {} rounds, medians",
        engine.describe(),
        args.rounds
    );

    let pin_rows = pin_vs_memcpy(engine.as_ref(), args.rounds)?;
    let io_rows = response_time(engine.as_mut(), args.rounds)?;
    if let Some(path) = &args.json {
        let v = serde_json::json!({ "pin_vs_memcpy": pin_rows, "response_time": io_rows });
        std::fs::write(path, serde_json::to_string_pretty(&v)?)?;
    }
    Ok(())
}

fn iterations(size: usize, budget_bytes: usize, lo: usize, hi: usize) -> usize {
    (budget_bytes / size).clamp(lo, hi)
}

fn pin_vs_memcpy(engine: &dyn Engine, rounds: usize) -> Result<Vec<PinRow>> {
    println!("\n(1) pin + register + unregister + free, against memcpy of the same bytes (mean us per operation)");
    println!(
        "{:>10} {:>14} {:>12} {:>10}",
        "size", "pin+register", "memcpy", "pin/copy"
    );
    let pool = engine.pool();
    let mut rows = Vec::new();
    let mut cheaper_pinned = Vec::new();
    for &size in PIN_SIZES {
        let n = iterations(size, 64 << 20, 3, 2000);
        let src = vec![0x5Au8; size];
        let mut dst = pool.alloc_transient(size)?;
        let (mut pin, mut copy) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let t = Instant::now();
            for _ in 0..n {
                drop(pool.alloc_transient(size)?);
            }
            pin.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
            let t = Instant::now();
            for _ in 0..n {
                dst.write_at(0, std::hint::black_box(&src));
            }
            copy.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
        }
        let row = PinRow {
            size_bytes: size,
            pin_register_us: median(&mut pin),
            memcpy_us: median(&mut copy),
        };
        if row.pin_register_us < row.memcpy_us {
            cheaper_pinned.push(human(size));
        }
        println!(
            "{:>10} {:>14.2} {:>12.2} {:>10.2}",
            human(size),
            row.pin_register_us,
            row.memcpy_us,
            row.pin_register_us / row.memcpy_us
        );
        rows.push(row);
    }
    if cheaper_pinned.is_empty() {
        #[expect(clippy::expect_used, reason = "PIN_SIZES is a non-empty constant")]
        let largest = human(*PIN_SIZES.last().expect("sizes"));
        println!("crossover: none up to {largest} (copying stayed cheaper)");
    } else {
        println!(
            "pinning cheaper than copying at: {}",
            cheaper_pinned.join(", ")
        );
    }
    Ok(rows)
}

#[derive(Clone, Copy)]
enum Mode {
    Pool,
    PerRequest,
    Unregistered,
}

fn one_read(engine: &mut dyn Engine, mode: Mode, size: usize, lba: u64) -> Result<()> {
    let buf = match mode {
        Mode::Pool => engine.pool().alloc(size, Direction::Read)?,
        Mode::PerRequest => engine.pool().alloc_transient(size)?,
        Mode::Unregistered => IoBuf::unpooled(size),
    };
    engine.run(Request::read(lba, buf, 0)).result?;
    Ok(())
}

fn response_time(engine: &mut dyn Engine, rounds: usize) -> Result<Vec<IoRow>> {
    println!("\n(2) mean response time of one read at QD1, buffer obtained + read + released (us)");
    println!(
        "{:>10} {:>10} {:>13} {:>13} {:>22} {:>18}",
        "size", "pool", "per-request", "unregistered", "pool vs per-request", "pool/unregistered"
    );
    let g = engine.device().geometry();
    let mut rng = SmallRng::seed_from_u64(7);
    let mut rows = Vec::new();
    let (mut medium_ok, mut never_slower) = (true, true);
    for &size in IO_SIZES {
        let blocks = (size / g.block_size_bytes as usize) as u64;
        let slots = g.block_count / blocks;
        let n = iterations(size, 32 << 20, 20, 500);
        let mut times = [Vec::new(), Vec::new(), Vec::new()];
        // Warm the pool's chunk so the pool mode measures steady state.
        one_read(engine, Mode::Pool, size, 0)?;
        for _ in 0..rounds {
            for (i, mode) in [Mode::Pool, Mode::PerRequest, Mode::Unregistered]
                .into_iter()
                .enumerate()
            {
                let t = Instant::now();
                for _ in 0..n {
                    one_read(engine, mode, size, rng.gen_range(0..slots) * blocks)?;
                }
                times[i].push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
            }
        }
        let [p, r, u] = times.map(|mut v| median(&mut v));
        let gain = 1.0 - p / r;
        let is_medium = size > 4096 && size < (4 << 20);
        if is_medium && gain < 0.17 {
            medium_ok = false;
        }
        if p > u {
            never_slower = false;
        }
        println!(
            "{:>10} {:>10.1} {:>13.1} {:>13.1} {:>21.1}% {:>18.2}",
            human(size),
            p,
            r,
            u,
            gain * 100.0,
            p / u
        );
        rows.push(IoRow {
            size_bytes: size,
            pool_us: p,
            per_request_us: r,
            unregistered_us: u,
        });
    }
    println!(
        "target: pool at least 17% faster than per-request registration for medium sizes: {}",
        if medium_ok { "met" } else { "NOT met" }
    );
    println!(
        "target: pool never slower than unregistered buffers: {}",
        if never_slower { "met" } else { "NOT met" }
    );
    Ok(rows)
}

fn human(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}
