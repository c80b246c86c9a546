//! # sluice-bench
//!
//! `sluice bench`: each benchmark runs Sluice and its baseline in the same
//! run and prints the ratio. Medians over repeated runs; these machines are
//! noisy. The `sluice` binary mounts [`BenchCommand`] and calls [`run`];
//! the baselines' own programs and scripts live in bench/baselines/.
//!
//! - `io`: 4 KiB random and sequential I/O against fio (`fio` drives it);
//! - `pool`: the uDMA experiments (pinning cost, response time per tier);
//! - `kv`: db_bench's workloads against RocksDB's db_bench;
//! - `ndp`: near-data SCAN, BC and GET against the block stack, RocksDB and
//!   networkit;
//! - `pages`: the sliced-scroll paper's read + parse against fio and
//!   fread + Jansson (`jansson` loads libjansson at run time);
//! - `export`: documents per second out of a search index against
//!   elasticdump, helpers.scan and a bare sliced PIT loop;
//! - `serve`: redis-benchmark against redis-server and `sluice serve`;
//! - `shm`: the shared-memory transport against sockets, ours and Redis's.
#![warn(clippy::expect_used)]
#![warn(missing_docs)]

mod export;
mod fio;
mod http;
mod io;
mod io_row;
mod jansson;
mod kv;
mod ndp;
mod node;
mod pages;
mod pool;
mod serve;
mod shm;

pub use io_row::RunResult;
pub use node::{initiator_load, InitiatorLoad};

use anyhow::{Context, Result};
use clap::Subcommand;
use sluice_io::engine::{open_engine, EngineConfig, EngineKind, Request};
use sluice_io::pool::Direction;
use sluice_io::{Device, FileDevice, FileOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The benchmarks, as `sluice bench` subcommands.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// 4 KiB random and 128 KiB / 1 MiB sequential I/O, ours against fio on the same file.
    Io(io::IoArgs),
    /// The uDMA experiments: pinning cost against memcpy, and I/O response
    /// time with the pool, per-request registration and unregistered buffers.
    Pool(pool::PoolArgs),
    /// db_bench's workloads on Sluice's store against RocksDB's db_bench.
    Kv(kv::KvBenchArgs),
    /// Near-data SCAN, BC and GET against the block stack, RocksDB and networkit.
    Ndp(ndp::NdpBenchArgs),
    /// The sliced-scroll paper's read + parse of L pages of 2048 documents:
    /// ours against fio, fread + Jansson and the I/O × parser ablation.
    Read(pages::ReadBenchArgs),
    /// Documents per second out of a search index: sluice export against
    /// elasticdump, opensearch-py's helpers.scan and a bare sliced PIT loop.
    Export(export::ExportBenchArgs),
    /// OpenSearch against sluice serve --http on the same documents: bulk,
    /// sliced export, helpers.scan, _count and aggregations.
    Http(http::HttpBenchArgs),
    /// redis-benchmark against redis-server and sluice serve in matching
    /// durability modes, same flags, same run.
    Serve(serve::ServeBenchArgs),
    /// GET/SET at batch 1/10/50 over sluice serve's shared-memory rings, a
    /// Unix socket and TCP, against redis-server over both sockets.
    Shm(shm::ShmBenchArgs),
    /// The storage node over loopback: fio on the local device, fio's nbd
    /// engine against sluice node and nbdkit, and our NVMe/TCP initiator.
    Node(node::NodeBenchArgs),
}

/// Runs one benchmark and prints its table.
pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Io(args) => io::run(&args),
        BenchCommand::Pool(args) => pool::run(&args),
        BenchCommand::Kv(args) => kv::run(&args),
        BenchCommand::Ndp(args) => ndp::run(&args),
        BenchCommand::Read(args) => pages::run(&args),
        BenchCommand::Export(args) => export::run(&args),
        BenchCommand::Http(args) => http::run(&args),
        BenchCommand::Serve(args) => serve::run(&args),
        BenchCommand::Shm(args) => shm::run(&args),
        BenchCommand::Node(args) => node::run(&args),
    }
}

/// Opens the benchmark device, creating and filling it when new: reads of a
/// never-written (unwritten-extent) range would not touch the disk at all.
pub fn bench_device(path: &Path, size_bytes: u64) -> Result<Arc<dyn Device>> {
    let marker = PathBuf::from(format!("{}.filled", path.display()));
    let dev = FileDevice::create(path, size_bytes, &FileOptions::default())
        .with_context(|| format!("creating benchmark device {}", path.display()))?;
    let dev: Arc<dyn Device> = Arc::new(dev);
    let filled = std::fs::read_to_string(&marker)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if filled != Some(size_bytes) {
        fill(&dev)?;
        std::fs::write(&marker, size_bytes.to_string()).context("writing fill marker")?;
    }
    Ok(dev)
}

fn fill(dev: &Arc<dyn Device>) -> Result<()> {
    let g = dev.geometry();
    eprintln!(
        "filling {} with data once ({} MiB)...",
        dev.describe(),
        g.size_bytes() >> 20
    );
    let cfg = EngineConfig {
        kind: EngineKind::Uring,
        queue_depth: 8,
        ..EngineConfig::default()
    };
    let mut engine = open_engine(dev.clone(), &cfg)?;
    let step = 1u64 << 20;
    let blocks_per_step = step / g.block_size_bytes as u64;
    let mut out = Vec::new();
    let mut lba = 0u64;
    let mut seed = 0x5eed_u64;
    let noise: Vec<u8> = (0..step)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect();
    while lba < g.block_count || engine.in_flight() > 0 {
        while lba < g.block_count && engine.in_flight() < engine.queue_depth() {
            let len = (g.block_count - lba).min(blocks_per_step) * g.block_size_bytes as u64;
            let mut buf = engine.pool().alloc(len as usize, Direction::Write)?;
            buf.write_at(0, &noise[..len as usize]);
            buf.write_at(0, &lba.to_le_bytes());
            engine
                .submit(Request::write(lba, buf, lba))
                .map_err(|r| r.error)?;
            lba += len / g.block_size_bytes as u64;
        }
        out.clear();
        engine.reap(1, &mut out)?;
        for c in &out {
            c.result
                .as_ref()
                .map_err(|e| anyhow::anyhow!("filling at LBA {}: {e}", c.lba))?;
        }
    }
    let flushed = engine.run(Request::flush(0));
    flushed.result?;
    Ok(())
}

/// Median of a list (mean of the middle two for even counts).
pub fn median(values: &mut [f64]) -> f64 {
    assert!(!values.is_empty());
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// A file of the repository: under the current directory, else under the
/// checkout this binary was built from.
pub fn repo_file(relative: &str) -> Result<PathBuf> {
    let built_from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    [PathBuf::from("."), built_from]
        .iter()
        .map(|root| root.join(relative))
        .find(|p| p.exists())
        .with_context(|| format!("{relative} not found: run from the repository root"))
}

/// Compiles a baseline program (`relative`, e.g. bench/baselines/x.c) into
/// target/ when missing or older than its source; `hint` says what to
/// install when the compiler or a library is missing.
pub fn build_baseline(
    relative: &str,
    compiler: &str,
    flags: &[&str],
    libs: &[&str],
    hint: &str,
) -> Result<PathBuf> {
    let source = repo_file(relative)?;
    let stem = source.file_stem().context("the baseline's name")?;
    let bin = source
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .context("the baseline's checkout")?
        .join("target")
        .join(stem);
    let stale = match (bin.metadata(), source.metadata()) {
        (Ok(b), Ok(s)) => b.modified()? < s.modified()?,
        _ => true,
    };
    if stale {
        eprintln!("compiling {relative}...");
        let out = std::process::Command::new(compiler)
            .args(flags)
            .arg("-o")
            .arg(&bin)
            .arg(&source)
            .args(libs)
            .output()
            .with_context(|| format!("running {compiler}: {hint}"))?;
        if !out.status.success() {
            anyhow::bail!(
                "compiling {relative} failed ({hint}):\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(bin)
}
