//! `sluice bench export`: documents per second pulled out of one index by
//!
//! - `sluice export` (sliced PIT + search_after, pages written with direct
//!   I/O, checkpoints durable after each page);
//! - elasticdump (npm), the index to an NDJSON file, pages of the same size;
//! - opensearch-py's `helpers.scan` (bench/baselines/scan_opensearchpy.py),
//!   each hit to an NDJSON file;
//! - a bare sliced PIT loop with the same slices, sort and page size that
//!   fetches each page and keeps only the last sort values: the source's own
//!   ceiling for this access pattern.
//!
//! Every side must see every document of the index, or the run fails.

use super::{median, repo_file};
use anyhow::{bail, ensure, Context, Result};
use serde::Deserialize;
use sluice_paginate::export::{export, ExportOptions};
use sluice_paginate::format::CursorKind;
use sluice_paginate::http::{Client, HttpOptions};
use sluice_paginate::load::{load, LoadOptions};
use sluice_paginate::progress::ProgressMode;
use sluice_paginate::source::{index_info, pick_sort, SharedPit, SourceSpec};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const SCAN_SCRIPT: &str = "bench/baselines/scan_opensearchpy.py";

#[derive(clap::Args)]
pub struct ExportBenchArgs {
    /// The search engine (start ours with scripts/opensearch start).
    #[arg(long, default_value = "http://127.0.0.1:9200")]
    source: String,
    #[arg(long, default_value = "papers-bench")]
    index: String,
    /// Documents of the index; loaded (seeded paper documents) when the index
    /// is missing or holds another count.
    #[arg(long, default_value_t = 100_000)]
    docs: u64,
    /// Primary shards of an index this benchmark loads.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// Documents per page, every side.
    #[arg(long, default_value_t = 2048)]
    page_docs: u32,
    /// Runs of every side; medians are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long, default_value = "data/bench-export.dev")]
    device: PathBuf,
    /// Where elasticdump and helpers.scan write their NDJSON.
    #[arg(long, default_value = "data/bench-export-out")]
    out_dir: PathBuf,
    /// Skip elasticdump.
    #[arg(long)]
    no_elasticdump: bool,
    /// Skip opensearch-py.
    #[arg(long)]
    no_python: bool,
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum Side {
    Sluice,
    Ceiling,
    Elasticdump,
    /// elasticdump as it runs without options: pages of 100.
    ElasticdumpDefault,
    HelpersScan,
}

impl Side {
    fn label(self) -> &'static str {
        match self {
            Side::Sluice => "sluice export",
            Side::Ceiling => "bare sliced PIT loop (source ceiling)",
            Side::Elasticdump => "elasticdump (npm), same page size",
            Side::ElasticdumpDefault => "elasticdump (npm), its default 100",
            Side::HelpersScan => "opensearch-py helpers.scan",
        }
    }
}

#[derive(Debug, serde::Serialize)]
struct SideFigures {
    side: Side,
    label: &'static str,
    seconds: Vec<f64>,
    median_seconds: f64,
    median_docs_per_s: f64,
    /// CPU seconds (user + system) of this process and the children it
    /// waited for, per run: the client's share of the cores.
    client_cpu_seconds: Vec<f64>,
    median_client_cpu_seconds: f64,
    /// CPU seconds of the source's process per run, where it says
    /// (`GET /_nodes/_local/stats/process`).
    source_cpu_seconds: Vec<f64>,
    median_source_cpu_seconds: Option<f64>,
}

#[derive(Debug, serde::Serialize)]
struct Report {
    index: String,
    docs: u64,
    shards: u32,
    slices: u32,
    page_docs: u32,
    runs: usize,
    sides: Vec<SideFigures>,
}

pub fn run(args: &ExportBenchArgs) -> Result<()> {
    ensure!(args.runs >= 1, "--runs must be at least 1");
    let client = Client::new(&HttpOptions {
        url: args.source.clone(),
        ..HttpOptions::default()
    })?;
    let spec = SourceSpec {
        index: args.index.clone(),
        keep_alive: "5m".into(),
        ..SourceSpec::default()
    };
    let mut sides = vec![Side::Sluice, Side::Ceiling];
    if !args.no_elasticdump {
        locate("elasticdump", &["--version"], "npm install -g elasticdump")?;
        sides.extend([Side::Elasticdump, Side::ElasticdumpDefault]);
    }
    if !args.no_python {
        locate(
            "python3",
            &["-c", "import opensearchpy"],
            "pip install opensearch-py",
        )?;
        sides.push(Side::HelpersScan);
    }
    prepare_index(&client, args, &spec)?;
    let info = index_info(&client, &spec)?;
    std::fs::create_dir_all(&args.out_dir)?;
    // One unrecorded pass of ours and of the ceiling: the source's caches are
    // warm for whichever side goes first, and the device file is written
    // once, as a preallocated device would be (a new file's first writes
    // also convert its extents, which a block device never pays). The
    // measured exports overwrite it.
    let _ = std::fs::remove_file(&args.device);
    run_side(&client, args, &spec, info.primary_shards, Side::Sluice)?;
    ceiling(&client, &spec, info.primary_shards, args.page_docs)?;
    let mut seconds: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    let mut client_cpu: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    let mut source_cpu: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    for run in 0..args.runs {
        for k in 0..sides.len() {
            let i = (k + run) % sides.len();
            let side = sides[i];
            let (client_before, source_before) = (own_cpu_seconds()?, source_cpu_seconds(&client));
            let machine_before = machine_ticks()?;
            let start = Instant::now();
            let docs = run_side(&client, args, &spec, info.primary_shards, side)
                .with_context(|| side.label())?;
            let s = start.elapsed().as_secs_f64();
            let client_s = own_cpu_seconds()? - client_before;
            let machine: Vec<f64> = machine_ticks()?
                .iter()
                .zip(machine_before)
                .map(|(after, before)| after.saturating_sub(before) as f64 / 100.0)
                .collect();
            let source_s = source_before
                .zip(source_cpu_seconds(&client))
                .map(|(a, b)| b - a);
            ensure!(
                docs == args.docs,
                "{} saw {docs} documents of {}",
                side.label(),
                args.docs
            );
            let source_note = source_s.map_or(String::new(), |c| format!(", source CPU {c:.2} s"));
            let machine_note = format!(
                "; machine: user {:.2}, system {:.2}, interrupts {:.2}, idle + iowait {:.2} s",
                machine[0], machine[1], machine[2], machine[3]
            );
            eprintln!(
                "  run {}: {:<40} {:8.2} s {:9.0} docs/s  (client CPU {client_s:.2} s{source_note}{machine_note})",
                run + 1,
                side.label(),
                s,
                docs as f64 / s
            );
            seconds[i].push(s);
            client_cpu[i].push(client_s);
            source_cpu[i].extend(source_s);
        }
    }
    let report = Report {
        index: args.index.clone(),
        docs: args.docs,
        shards: info.primary_shards,
        slices: info.primary_shards,
        page_docs: args.page_docs,
        runs: args.runs,
        sides: sides
            .iter()
            .zip(seconds)
            .zip(client_cpu.into_iter().zip(source_cpu))
            .map(|((&side, s), (client_cpu, source_cpu))| {
                let m = median(&mut s.clone());
                SideFigures {
                    side,
                    label: side.label(),
                    seconds: s,
                    median_seconds: m,
                    median_docs_per_s: args.docs as f64 / m,
                    median_client_cpu_seconds: median(&mut client_cpu.clone()),
                    client_cpu_seconds: client_cpu,
                    median_source_cpu_seconds: (source_cpu.len() == args.runs)
                        .then(|| median(&mut source_cpu.clone())),
                    source_cpu_seconds: source_cpu,
                }
            })
            .collect(),
    };
    print_report(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// CPU seconds (user + system) this process and its waited-for children
/// have used so far.
fn own_cpu_seconds() -> Result<f64> {
    let ticks = crate::serve::cpu_ticks_with_children(std::process::id())?;
    // USER_HZ: 100 on every Linux architecture Sluice builds for.
    Ok(ticks as f64 / 100.0)
}

/// Ticks all cores spent so far in user mode (nice included), system mode,
/// hard and soft interrupts, and idle or waiting for I/O (/proc/stat).
fn machine_ticks() -> Result<[u64; 4]> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let line = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .context("/proc/stat has no cpu line")?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().context("a /proc/stat field is not a number"))
        .collect::<Result<_>>()?;
    ensure!(f.len() >= 7, "a short cpu line in /proc/stat");
    Ok([f[0] + f[1], f[2], f[5] + f[6], f[3] + f[4]])
}

/// CPU seconds the source's process has used so far, if it says.
fn source_cpu_seconds(client: &Client) -> Option<f64> {
    let r = client
        .send("GET", "/_nodes/_local/stats/process", None)
        .ok()?;
    if !r.is_success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
    let node = v["nodes"].as_object()?.values().next()?;
    Some(node["process"]["cpu"]["total_in_millis"].as_f64()? / 1000.0)
}

fn locate(program: &str, probe: &[&str], install: &str) -> Result<()> {
    let ok = Command::new(program)
        .args(probe)
        .output()
        .is_ok_and(|o| o.status.success());
    ensure!(
        ok,
        "`{program} {}` failed: run `{install}` (scripts/setup does), or skip that side",
        probe.join(" ")
    );
    Ok(())
}

/// Loads the index unless it holds exactly `--docs` documents already.
fn prepare_index(client: &Client, args: &ExportBenchArgs, spec: &SourceSpec) -> Result<()> {
    let have = client.send("GET", &format!("/{}/_count", args.index), None)?;
    let count = serde_json::from_slice::<serde_json::Value>(&have.body)
        .ok()
        .and_then(|v| v["count"].as_u64());
    if have.is_success() && count == Some(args.docs) {
        return Ok(());
    }
    eprintln!("loading {} documents into {}...", args.docs, args.index);
    load(
        client,
        &LoadOptions {
            index: spec.index.clone(),
            docs: args.docs,
            shards: args.shards,
            replace: true,
            progress: ProgressMode::Auto,
            ..LoadOptions::default()
        },
    )?;
    Ok(())
}

/// Documents one side pulled.
fn run_side(
    client: &Client,
    args: &ExportBenchArgs,
    spec: &SourceSpec,
    shards: u32,
    side: Side,
) -> Result<u64> {
    match side {
        Side::Sluice => {
            let summary = export(
                client,
                &ExportOptions {
                    device: args.device.clone(),
                    spec: spec.clone(),
                    page_docs: args.page_docs,
                    cursor: CursorKind::Pit,
                    progress: ProgressMode::Off,
                    ..ExportOptions::default()
                },
            )?;
            Ok(summary.docs)
        }
        Side::Ceiling => ceiling(client, spec, shards, args.page_docs),
        Side::Elasticdump | Side::ElasticdumpDefault => {
            let limit = if side == Side::Elasticdump {
                args.page_docs
            } else {
                100
            };
            let out = args.out_dir.join("elasticdump.ndjson");
            let _ = std::fs::remove_file(&out);
            let status = Command::new("elasticdump")
                .arg(format!(
                    "--input={}/{}",
                    args.source.trim_end_matches('/'),
                    args.index
                ))
                .arg(format!("--output={}", out.display()))
                .arg("--type=data")
                .arg(format!("--limit={limit}"))
                .arg("--quiet")
                .status()
                .context("running elasticdump")?;
            ensure!(status.success(), "elasticdump failed ({status})");
            count_lines(&out)
        }
        Side::HelpersScan => {
            let out = args.out_dir.join("helpers-scan.ndjson");
            let script = repo_file(SCAN_SCRIPT)?;
            let o = Command::new("python3")
                .arg(script)
                .arg(&args.source)
                .arg(&args.index)
                .arg(args.page_docs.to_string())
                .arg(&out)
                .output()
                .context("running python3")?;
            if !o.status.success() {
                bail!(
                    "{SCAN_SCRIPT} failed: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
            }
            count_lines(&out)
        }
    }
}

fn count_lines(path: &Path) -> Result<u64> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(bytes.iter().filter(|&&b| b == b'\n').count() as u64)
}

#[derive(Deserialize)]
struct Answer<'a> {
    #[serde(borrow)]
    hits: Hits<'a>,
}

#[derive(Deserialize)]
struct Hits<'a> {
    #[serde(borrow)]
    hits: Vec<BareHit<'a>>,
}

#[derive(Deserialize)]
struct BareHit<'a> {
    #[serde(borrow, default)]
    sort: Option<sonic_rs::LazyValue<'a>>,
}

/// The source's ceiling: one thread per shard-slice asks for pages with the
/// same PIT, sort and page size as `sluice export` and keeps only the
/// count and the last sort values (search_after needs them).
fn ceiling(client: &Client, spec: &SourceSpec, shards: u32, page_docs: u32) -> Result<u64> {
    let pit = SharedPit::open(
        client,
        sluice_paginate::source::Engine::detect(client)?,
        spec,
    )?;
    let sort = pick_sort(client, &pit, shards, shards)?;
    let id = pit.current();
    let totals: Vec<Result<u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..shards)
            .map(|slice| {
                let (id, sort) = (&id, &sort);
                scope.spawn(move || -> Result<u64> {
                    let mut after: Option<String> = None;
                    let mut docs = 0u64;
                    loop {
                        let mut body = serde_json::json!({
                            "size": page_docs,
                            "track_total_hits": false,
                            "pit": { "id": id, "keep_alive": "5m" },
                            "sort": serde_json::from_str::<serde_json::Value>(sort)?,
                        });
                        if shards > 1 {
                            body["slice"] = serde_json::json!({ "id": slice, "max": shards });
                        }
                        if let Some(a) = &after {
                            body["search_after"] = serde_json::from_str(a)?;
                        }
                        let r =
                            client.send("POST", "/_search", Some(body.to_string().as_bytes()))?;
                        ensure!(r.is_success(), "search: {}", r.error_summary());
                        let answer: Answer = sonic_rs::from_slice(&r.body)?;
                        let n = answer.hits.hits.len() as u64;
                        docs += n;
                        match answer.hits.hits.last().and_then(|h| h.sort.as_ref()) {
                            Some(s) if n == page_docs as u64 => {
                                after = Some(s.as_raw_str().to_string())
                            }
                            _ => return Ok(docs),
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a ceiling slice's thread panicked"))?
            })
            .collect()
    });
    pit.close(client);
    totals.into_iter().sum()
}

fn print_report(r: &Report) {
    println!(
        "\nexport of {} documents ({} shards, {} slices, pages of {}), median of {} runs",
        r.docs, r.shards, r.slices, r.page_docs, r.runs
    );
    println!(
        "{:<40} {:>10} {:>12} {:>12} {:>12}",
        "side", "seconds", "docs/s", "client CPU s", "source CPU s"
    );
    for s in &r.sides {
        let source = s
            .median_source_cpu_seconds
            .map_or("-".to_string(), |c| format!("{c:.2}"));
        println!(
            "{:<40} {:>10.2} {:>12.0} {:>12.2} {:>12}",
            s.label, s.median_seconds, s.median_docs_per_s, s.median_client_cpu_seconds, source
        );
    }
    let rate = |side| {
        r.sides
            .iter()
            .find(|s| s.side == side)
            .map(|s| s.median_docs_per_s)
    };
    let ours = rate(Side::Sluice);
    for (side, target) in [
        (Side::Elasticdump, ">= 10"),
        (Side::ElasticdumpDefault, ""),
        (Side::HelpersScan, ">= 3"),
        (Side::Ceiling, ">= 0.95"),
    ] {
        if let (Some(a), Some(b)) = (ours, rate(side)) {
            let target = if target.is_empty() {
                String::new()
            } else {
                format!(" (target {target})")
            };
            println!("  sluice export / {}: {:.2}x{target}", side.label(), a / b);
        }
    }
}
