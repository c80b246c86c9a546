//! `sluice bench ndp`: near-data operators against the ways the same work
//! is done without them, in one run on the same data set:
//!
//! - the block stack: every pair pulled out through the engine's plain
//!   iterator and parsed whole on the host (sonic-rs), at each selectivity;
//! - RocksDB (bench/baselines/ndp_rocksdb.cc, linked with librocksdb-dev):
//!   the same predicate SCAN (iterate, parse with RapidJSON, filter), the
//!   same sampled BC (iterate the references into an adjacency, Brandes
//!   from the same sources), the same GETs;
//! - networkit (PyPI): exact BC on the same graph, excluding the load.
//!
//! Results are cross-checked: every side must find the same rows and the
//! same centrality, or the run fails.

use super::median as median_of;
use super::{build_baseline, repo_file};

fn median(mut v: Vec<f64>) -> f64 {
    median_of(&mut v)
}
use anyhow::{bail, Context, Result};
use sluice_ndp::graph::Csr;
use sluice_ndp::papers::{self, PaperConfig};
use sluice_ndp::scan::{self, ScanSpec};
use sluice_ndp::{parse, FieldPredicate, Layout};
use sluice_store::{Store, StoreConfig, StoreFiles};
use sonic_rs::JsonValueTrait;
use std::io::Write;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

#[derive(clap::Args)]
pub struct NdpBenchArgs {
    /// Papers of the data set (about ten references each).
    #[arg(long, default_value_t = 200_000)]
    papers: u64,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Selectivities of the predicate SCAN, in percent of the papers.
    #[arg(long, default_value = "0.1,1,10,50")]
    selectivity: String,
    /// BC sources sampled on the whole citation graph.
    #[arg(long, default_value_t = 16)]
    bc_sources: usize,
    /// Random point GETs of papers, over all papers and again over a hot set.
    #[arg(long, default_value_t = 200_000)]
    gets: u64,
    /// Papers of the hot set (the first ones; their blocks fit the cache).
    #[arg(long, default_value_t = 10_000)]
    get_hot_papers: u64,
    /// Block cache of each side, MiB.
    #[arg(long, default_value_t = 32)]
    cache_mib: u64,
    /// Runs per side; medians are reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Our worker threads for SCAN and BC (RocksDB's program uses one).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Papers whose citation subgraph gets exact BC against networkit (0: skip).
    #[arg(long, default_value_t = 4000)]
    networkit_papers: u64,
    /// Threads of both sides in the networkit comparison.
    #[arg(long, default_value_t = 2)]
    networkit_threads: usize,
    #[arg(long, default_value = "data/ndp-bench.dev")]
    device: PathBuf,
    #[arg(long, default_value = "data/rocksdb-ndp")]
    rocksdb_dir: PathBuf,
    /// Skip RocksDB.
    #[arg(long)]
    no_rocksdb: bool,
    #[arg(long)]
    json: Option<PathBuf>,
}

const BASELINE_SOURCE: &str = "bench/baselines/ndp_rocksdb.cc";
const NETWORKIT_SCRIPT: &str = "bench/baselines/bc_networkit.py";
const BATCH_BYTES: usize = 256 << 10;

/// One SCAN's figures.
#[derive(Debug, Clone, Default, serde::Serialize)]
struct ScanFigures {
    seconds: f64,
    matched: u64,
    bytes_returned: u64,
    key_sum: u64,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
struct BcFigures {
    seconds: f64,
    build_seconds: f64,
    top_score: f64,
    score_sum: f64,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
struct GetFigures {
    p50_us: f64,
    p99_us: f64,
    mean_us: f64,
}

pub fn run(args: &NdpBenchArgs) -> Result<()> {
    let percents: Vec<f64> = args
        .selectivity
        .split(',')
        .map(|s| s.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .context("--selectivity: comma-separated percentages, e.g. 0.1,1,10,50")?;
    if percents.iter().any(|p| !(*p > 0.0 && *p <= 100.0)) {
        bail!("--selectivity: each percentage must be above 0 and at most 100");
    }
    if args.papers < 100 || args.repeat == 0 || args.gets == 0 || args.bc_sources == 0 {
        bail!("--papers must be at least 100, and --repeat, --gets, --bc-sources positive");
    }
    let below: Vec<u64> = percents
        .iter()
        .map(|p| ((args.papers as f64 * p / 100.0).round() as u64).max(1))
        .collect();
    let baseline = if args.no_rocksdb {
        None
    } else {
        Some(build_baseline(
            BASELINE_SOURCE,
            "g++",
            &["-O2", "-std=c++17"],
            &["-lrocksdb"],
            "install g++, librocksdb-dev and rapidjson-dev; scripts/setup does",
        )?)
    };
    prepare(args, baseline.as_deref())?;
    let store = StoreFiles::new([&args.device])
        .config(StoreConfig {
            block_cache_bytes: (args.cache_mib << 20) as usize,
            ..StoreConfig::default()
        })
        .open()?;
    println!(
        "data set: {} papers (seed {}), {} MiB block cache per side, {} runs per side, our threads {}",
        args.papers, args.seed, args.cache_mib, args.repeat, args.threads
    );
    let mut ours_scan = vec![Vec::new(); below.len()];
    let mut block_scan = vec![Vec::new(); below.len()];
    let mut ours_bc = Vec::new();
    let mut ours_get = Vec::new();
    let mut ours_hot = Vec::new();
    let hot = args.get_hot_papers.clamp(1, args.papers);
    for _ in 0..args.repeat {
        for (i, &b) in below.iter().enumerate() {
            ours_scan[i].push(scan_ours(&store, b, args.threads)?);
            block_scan[i].push(scan_block_stack(&store, b)?);
        }
        ours_bc.push(bc_ours(&store, args)?);
        ours_get.push(gets_ours(&store, args.papers, args.gets)?);
        ours_hot.push(gets_ours(&store, hot, args.gets)?);
    }
    let (rdb_scan, rdb_bc, rdb_get, rdb_hot) = match &baseline {
        Some(bin) => {
            let (s, b, g, h) = run_baseline(bin, args, &below, hot)?;
            (Some(s), Some(b), Some(g), Some(h))
        }
        None => (None, None, None, None),
    };
    let examined_bytes = store.stats().table_data_bytes;
    let mut report = serde_json::Map::new();
    let scans = ScanRuns {
        percents: &percents,
        below: &below,
        ours: &ours_scan,
        block: &block_scan,
        rocksdb: rdb_scan.as_deref(),
    };
    report.insert("scan".into(), report_scans(&scans, examined_bytes)?);
    report.insert("bc".into(), report_bc(args, &ours_bc, rdb_bc.as_deref())?);
    let mut get_rows = Vec::new();
    for (name, papers, ours, theirs) in [
        ("all", args.papers, &ours_get, &rdb_get),
        ("hot", hot, &ours_hot, &rdb_hot),
    ] {
        let ours = median_get(ours);
        print!(
            "\nGET of {} random papers among {papers} ({name}): ours p50 {:.1} us, p99 {:.1} us, mean {:.1} us",
            args.gets, ours.p50_us, ours.p99_us, ours.mean_us
        );
        let mut row = serde_json::json!({"set": name, "papers": papers, "ours": ours});
        if let Some(r) = theirs {
            let r = median_get(r);
            println!(
                "; rocksdb p50 {:.1} us, p99 {:.1} us, mean {:.1} us: p50 rocksdb/ours {:.2}, mean {:.2}",
                r.p50_us,
                r.p99_us,
                r.mean_us,
                r.p50_us / ours.p50_us,
                r.mean_us / ours.mean_us
            );
            row["rocksdb"] = serde_json::json!(r);
            row["ratio_p50"] = (r.p50_us / ours.p50_us).into();
            row["ratio_mean"] = (r.mean_us / ours.mean_us).into();
        } else {
            println!();
        }
        get_rows.push(row);
    }
    report.insert("get".into(), get_rows.into());
    if args.networkit_papers > 0 {
        report.insert("networkit".into(), networkit(&store, args)?);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

/// The SCAN runs of every selectivity, ours and the baselines'.
struct ScanRuns<'a> {
    percents: &'a [f64],
    below: &'a [u64],
    ours: &'a [Vec<ScanFigures>],
    block: &'a [Vec<ScanFigures>],
    rocksdb: Option<&'a [Vec<ScanFigures>]>,
}

/// Prints the SCAN table (medians, ratios) after checking that every
/// side found the same rows; its JSON report.
fn report_scans(runs: &ScanRuns<'_>, examined_bytes: u64) -> Result<serde_json::Value> {
    println!(
        "\npredicate SCAN \"id < N\" over every paper ({} bytes of tables), medians:",
        examined_bytes
    );
    println!(
        "{:>8} {:>9} {:>10} {:>10} {:>10} {:>14} {:>14} {:>9} {:>9}",
        "select%",
        "rows",
        "ours ms",
        "block ms",
        "rocksdb ms",
        "ours bytes",
        "block bytes",
        "block/us",
        "rdb/us"
    );
    let mut scans = Vec::new();
    for (i, p) in runs.percents.iter().enumerate() {
        let ours = median_scan(&runs.ours[i]);
        let block = median_scan(&runs.block[i]);
        if (block.matched, block.key_sum) != (ours.matched, ours.key_sum) {
            bail!(
                "the block stack found {} rows, ours {}",
                block.matched,
                ours.matched
            );
        }
        let rdb = runs.rocksdb.map(|r| median_scan(&r[i]));
        if let Some(r) = &rdb {
            if (r.matched, r.key_sum) != (ours.matched, ours.key_sum) {
                bail!("RocksDB found {} rows, ours {}", r.matched, ours.matched);
            }
        }
        // The block stack hands over every pair it pulls.
        let block_bytes = block.bytes_returned;
        println!(
            "{:>8} {:>9} {:>10.1} {:>10.1} {:>10} {:>14} {:>14} {:>9.2} {:>9}",
            p,
            ours.matched,
            ours.seconds * 1e3,
            block.seconds * 1e3,
            rdb.as_ref()
                .map_or("-".into(), |r| format!("{:.1}", r.seconds * 1e3)),
            ours.bytes_returned,
            block_bytes,
            block.seconds / ours.seconds,
            rdb.as_ref()
                .map_or("-".into(), |r| format!("{:.2}", r.seconds / ours.seconds)),
        );
        scans.push(serde_json::json!({
            "selectivity_percent": p, "below": runs.below[i], "ours": ours, "block_stack": block,
            "block_stack_bytes_handed_over": block_bytes, "rocksdb": rdb,
            "ratio_block": block.seconds / ours.seconds,
            "ratio_rocksdb": rdb.as_ref().map(|r| r.seconds / ours.seconds),
        }));
    }
    Ok(scans.into())
}

/// Prints the BC medians after checking that both sides found the same
/// scores; its JSON report.
fn report_bc(
    args: &NdpBenchArgs,
    ours: &[BcFigures],
    rocksdb: Option<&[BcFigures]>,
) -> Result<serde_json::Value> {
    let ours = median_bc(ours);
    println!(
        "\nBC sampled from {} sources on the whole citation graph (build + Brandes), medians:",
        args.bc_sources
    );
    print!(
        "ours {:.1} ms (build {:.1} ms)",
        ours.seconds * 1e3,
        ours.build_seconds * 1e3
    );
    if let Some(r) = rocksdb {
        let r = median_bc(r);
        agree("BC score sum", ours.score_sum, r.score_sum)?;
        agree("BC top score", ours.top_score, r.top_score)?;
        println!(
            ", rocksdb {:.1} ms (build {:.1} ms): rocksdb/ours {:.2} (same scores)",
            r.seconds * 1e3,
            r.build_seconds * 1e3,
            r.seconds / ours.seconds
        );
        Ok(serde_json::json!({"ours": ours, "rocksdb": r, "ratio": r.seconds / ours.seconds}))
    } else {
        println!();
        Ok(serde_json::json!({ "ours": ours }))
    }
}

fn agree(what: &str, ours: f64, theirs: f64) -> Result<()> {
    if (ours - theirs).abs() > 1e-6 * ours.abs().max(1.0) {
        bail!("{what}: ours {ours}, the baseline's {theirs}: the results differ");
    }
    Ok(())
}

fn median_scan(runs: &[ScanFigures]) -> ScanFigures {
    let mut f = runs[0].clone();
    f.seconds = median(runs.iter().map(|r| r.seconds).collect());
    f
}

fn median_bc(runs: &[BcFigures]) -> BcFigures {
    let mut f = runs[0].clone();
    f.seconds = median(runs.iter().map(|r| r.seconds).collect());
    f.build_seconds = median(runs.iter().map(|r| r.build_seconds).collect());
    f
}

fn median_get(runs: &[GetFigures]) -> GetFigures {
    GetFigures {
        p50_us: median(runs.iter().map(|r| r.p50_us).collect()),
        p99_us: median(runs.iter().map(|r| r.p99_us).collect()),
        mean_us: median(runs.iter().map(|r| r.mean_us).collect()),
    }
}

fn scan_ours(store: &Store, below: u64, threads: usize) -> Result<ScanFigures> {
    let def = store.keyspace_def("papers")?;
    let pred = FieldPredicate::compile_for(&parse(&format!("id < {below}"))?, &Layout::of(&def)?)?;
    let spec = ScanSpec {
        keyspace: def.id,
        range: (Bound::Unbounded, Bound::Unbounded),
        reverse: false,
        predicate: Some(&pred),
        projection: None,
        limit: usize::MAX,
        batch_bytes: BATCH_BYTES,
        threads,
    };
    let start = Instant::now();
    let mut key_sum = 0u64;
    let stats = scan::scan(store, &spec, &mut |batch| {
        for (k, _) in batch.rows() {
            key_sum = key_sum.wrapping_add(u64::from_be_bytes(k.try_into().unwrap_or([0; 8])));
        }
        Ok(())
    })?;
    Ok(ScanFigures {
        seconds: start.elapsed().as_secs_f64(),
        matched: stats.rows_returned,
        bytes_returned: stats.bytes_returned,
        key_sum,
    })
}

/// Every pair pulled out (copied), parsed whole, filtered on the host.
fn scan_block_stack(store: &Store, below: u64) -> Result<ScanFigures> {
    let ks = store.keyspace("papers")?;
    let start = Instant::now();
    let snap = store.snapshot();
    let mut f = ScanFigures::default();
    for pair in store.iter(ks, (Bound::Unbounded, Bound::Unbounded), &snap, false) {
        let (k, v) = pair?;
        f.bytes_returned += (k.len() + v.len()) as u64;
        let doc: sonic_rs::Value = sonic_rs::from_slice(&v).context("a paper is not JSON")?;
        if doc
            .get("id")
            .and_then(|id| id.as_u64())
            .is_some_and(|id| id < below)
        {
            f.matched += 1;
            f.key_sum = f.key_sum.wrapping_add(u64::from_be_bytes(
                k.as_slice().try_into().unwrap_or([0; 8]),
            ));
        }
    }
    f.seconds = start.elapsed().as_secs_f64();
    Ok(f)
}

fn bc_ours(store: &Store, args: &NdpBenchArgs) -> Result<BcFigures> {
    let refs = store.keyspace("refs")?;
    let start = Instant::now();
    let g = Csr::build(store, refs, 8 << 30, &mut |_, _| true)?;
    let build_seconds = start.elapsed().as_secs_f64();
    let k = args.bc_sources.min(g.vertices());
    let scores = g.betweenness_sampled(k, args.seed, args.threads)?;
    let seconds = start.elapsed().as_secs_f64();
    Ok(BcFigures {
        seconds,
        build_seconds,
        top_score: scores.iter().cloned().fold(0.0, f64::max),
        score_sum: scores.iter().sum(),
    })
}

/// The same LCG as the baseline: the same papers in the same order, drawn
/// from the first `papers`.
fn gets_ours(store: &Store, papers: u64, count: u64) -> Result<GetFigures> {
    let ks = store.keyspace("papers")?;
    let mut lat_us = Vec::with_capacity(count as usize);
    let mut x = 42u64;
    for _ in 0..count {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let id = (x >> 33) % papers;
        let t = Instant::now();
        let v = store.get(ks, &papers::id_key(id))?;
        lat_us.push(t.elapsed().as_secs_f64() * 1e6);
        if v.is_none() {
            bail!("paper {id} is missing from the benchmark store");
        }
    }
    lat_us.sort_by(f64::total_cmp);
    let n = lat_us.len();
    Ok(GetFigures {
        p50_us: lat_us[n / 2],
        p99_us: lat_us[n * 99 / 100],
        mean_us: lat_us.iter().sum::<f64>() / n as f64,
    })
}

/// Generates the data set on our device and loads the same pairs into
/// RocksDB, once per (papers, seed); a marker file remembers it.
fn prepare(args: &NdpBenchArgs, baseline: Option<&Path>) -> Result<()> {
    let marker = PathBuf::from(format!("{}.papers", args.device.display()));
    // The store format is part of the data set's name: one an older format
    // wrote is made again rather than refused at open.
    let data_set = format!(
        "{} {} {}",
        sluice_store::superblock::FORMAT_VERSION,
        args.papers,
        args.seed
    );
    let want = format!("{data_set} rocksdb={}", baseline.is_some());
    let have = std::fs::read_to_string(&marker).unwrap_or_default();
    let size_bytes = (args.papers * 8192).max(512 << 20);
    // A data set loaded into RocksDB serves a run without it too.
    let ready = have.trim() == want
        || (baseline.is_none() && have.trim() == format!("{data_set} rocksdb=true"));
    if ready && args.device.exists() {
        return Ok(());
    }
    let _ = std::fs::remove_file(&marker);
    let store = StoreFiles::new([&args.device])
        .create_bytes(size_bytes)
        .wal_blocks(StoreConfig::default().wal_blocks)
        .format()?;
    eprintln!("generating {} papers...", args.papers);
    let start = Instant::now();
    papers::generate(
        &store,
        &PaperConfig::demo(args.papers, args.seed),
        &mut |_| {},
    )?;
    store.flush()?;
    store.compact()?;
    eprintln!(
        "generated and compacted in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    if let Some(bin) = baseline {
        let dump = PathBuf::from(format!("{}.pairs", args.device.display()));
        write_dump(&store, &dump)?;
        let _ = std::fs::remove_dir_all(&args.rocksdb_dir);
        std::fs::create_dir_all(&args.rocksdb_dir)?;
        eprintln!("loading the same pairs into RocksDB...");
        let out = Command::new(bin)
            .arg("load")
            .arg(&args.rocksdb_dir)
            .arg(&dump)
            .output()?;
        if !out.status.success() {
            bail!(
                "loading RocksDB failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::fs::remove_file(&dump)?;
    }
    drop(store);
    std::fs::write(&marker, want)?;
    Ok(())
}

/// The papers and refs keyspaces as pairs, for the baseline's loader.
fn write_dump(store: &Store, path: &Path) -> Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    out.write_all(b"SLPAIRS1")?;
    let snap = store.snapshot();
    for (family, name) in [(0u8, "papers"), (1u8, "refs")] {
        let ks = store.keyspace(name)?;
        let mut iter = store.iter(ks, (Bound::Unbounded, Bound::Unbounded), &snap, false);
        while let Some((k, v)) = iter.next_ref()? {
            out.write_all(&[family])?;
            out.write_all(&(k.len() as u32).to_le_bytes())?;
            out.write_all(&(v.len() as u32).to_le_bytes())?;
            out.write_all(k)?;
            out.write_all(v)?;
        }
    }
    out.flush()?;
    Ok(())
}

type BaselineFigures = (
    Vec<Vec<ScanFigures>>,
    Vec<BcFigures>,
    Vec<GetFigures>,
    Vec<GetFigures>,
);

fn run_baseline(
    bin: &Path,
    args: &NdpBenchArgs,
    below: &[u64],
    hot: u64,
) -> Result<BaselineFigures> {
    let list: Vec<String> = below.iter().map(u64::to_string).collect();
    let out = Command::new(bin)
        .arg("run")
        .arg(&args.rocksdb_dir)
        .arg((args.cache_mib << 20).to_string())
        .arg(args.papers.to_string())
        .arg(list.join(","))
        .arg(args.bc_sources.to_string())
        .arg(args.seed.to_string())
        .arg(args.gets.to_string())
        .arg(hot.to_string())
        .arg(args.repeat.to_string())
        .output()
        .context("running the RocksDB baseline")?;
    if !out.status.success() {
        bail!(
            "the RocksDB baseline failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut scans = vec![Vec::new(); below.len()];
    let (mut bcs, mut gets, mut hots) = (Vec::new(), Vec::new(), Vec::new());
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("baseline output line {line:?}"))?;
        let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        let u = |k: &str| v[k].as_u64().unwrap_or(0);
        match v["op"].as_str() {
            Some("scan") => {
                let i = below
                    .iter()
                    .position(|&b| b == u("below"))
                    .context("a scan line for an unknown threshold")?;
                scans[i].push(ScanFigures {
                    seconds: f("seconds"),
                    matched: u("matched"),
                    bytes_returned: u("bytes_returned"),
                    key_sum: u("key_sum"),
                });
            }
            Some("bc") => bcs.push(BcFigures {
                seconds: f("seconds"),
                build_seconds: f("build_seconds"),
                top_score: f("top_score"),
                score_sum: f("score_sum"),
            }),
            Some("get") => {
                let figures = GetFigures {
                    p50_us: f("p50_us"),
                    p99_us: f("p99_us"),
                    mean_us: f("mean_us"),
                };
                match v["set"].as_str() {
                    Some("hot") => hots.push(figures),
                    _ => gets.push(figures),
                }
            }
            _ => bail!("unexpected baseline output {line:?}"),
        }
    }
    if bcs.len() != args.repeat || gets.len() != args.repeat || hots.len() != args.repeat {
        bail!(
            "the RocksDB baseline printed {} runs, {} asked for",
            bcs.len(),
            args.repeat
        );
    }
    Ok((scans, bcs, gets, hots))
}

/// Exact BC on the citation subgraph of the first papers: ours against
/// networkit on the same graph, both on the same threads, load excluded.
fn networkit(store: &Store, args: &NdpBenchArgs) -> Result<serde_json::Value> {
    let script = repo_file(NETWORKIT_SCRIPT)?;
    let m = args.networkit_papers;
    let refs = store.keyspace("refs")?;
    let g = Csr::build(store, refs, 8 << 30, &mut |s, t| s < m && t < m)?;
    let edges = PathBuf::from(format!("{}.edges", args.device.display()));
    let mut bytes = Vec::with_capacity(8 + 8 * g.edges());
    bytes.extend_from_slice(&(g.vertices() as u32).to_le_bytes());
    bytes.extend_from_slice(&(g.edges() as u32).to_le_bytes());
    for v in 0..g.vertices() as u32 {
        for &t in g.neighbours(v) {
            bytes.extend_from_slice(&v.to_le_bytes());
            bytes.extend_from_slice(&t.to_le_bytes());
        }
    }
    std::fs::write(&edges, bytes)?;
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for _ in 0..args.repeat {
        let start = Instant::now();
        let scores = g.betweenness(args.networkit_threads)?;
        ours.push(start.elapsed().as_secs_f64());
        let top = scores.iter().cloned().fold(0.0, f64::max);
        let sum: f64 = scores.iter().sum();
        let out = Command::new("python3")
            .arg(&script)
            .arg(&edges)
            .arg(args.networkit_threads.to_string())
            .output()
            .context("running python3")?;
        if !out.status.success() {
            bail!(
                "networkit failed (pip install networkit; scripts/bench-ndp does): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        agree(
            "networkit BC top score",
            top,
            v["top_score"].as_f64().unwrap_or(f64::NAN),
        )?;
        agree(
            "networkit BC score sum",
            sum,
            v["score_sum"].as_f64().unwrap_or(f64::NAN),
        )?;
        theirs.push(v["seconds"].as_f64().unwrap_or(f64::NAN));
    }
    let _ = std::fs::remove_file(&edges);
    let (o, t) = (median(ours), median(theirs));
    println!(
        "\nexact BC on the citations among the first {m} papers ({} vertices, {} edges), {} threads each, load excluded: ours {:.1} ms, networkit {:.1} ms: ours/networkit {:.2} (same scores)",
        g.vertices(),
        g.edges(),
        args.networkit_threads,
        o * 1e3,
        t * 1e3,
        o / t
    );
    Ok(serde_json::json!({
        "papers": m, "vertices": g.vertices(), "edges": g.edges(),
        "threads": args.networkit_threads, "ours_seconds": o, "networkit_seconds": t,
        "ours_over_networkit": o / t,
    }))
}
