//! `sluice bench read`: the read + parse benchmark of the sliced-scroll
//! paper. L pages of `--page-docs` paper documents of 1556 bytes are written
//! onto a device through the export writer (generated pages, no search
//! engine), back to back, so that every side reads the same bytes:
//!
//! - fio: a sequential direct read of the pages' region (the device limit);
//! - Sluice: `sluice read` (io_uring, O_DIRECT, fixed buffers, CRC check and
//!   the sluice-json scan in the completion path);
//! - bench/baselines/fread_jansson.c: the paper's baseline (two pthreads,
//!   fread page-sized chunks, Jansson);
//! - the 2×2 ablation {buffered pread, io_uring direct} × {Jansson, our
//!   scan}, all through our read path with its CRC check;
//! - the parsers alone on pages in memory (the sluice-json scan, sonic-rs as
//!   `sluice read` used it before and as a DOM, simd-json, Jansson).
//!
//! Cold runs drop the page cache before every cell; warm runs read the
//! region once first, so the buffered sides read from memory.

use super::jansson::Jansson;
use super::{build_baseline, median};
use anyhow::{bail, ensure, Context, Result};
use simd_json::prelude::ValueAsArray as _;
use sluice_io::{Device, EngineKind, FileDevice, FileOptions};
use sluice_paginate::device::DeviceIo;
use sluice_paginate::format::{max_extent_slots, CursorKind, ExportState};
use sluice_paginate::layout::load_export;
use sluice_paginate::progress::ProgressMode;
use sluice_paginate::read::{read_export, read_pages, PageInfo, PageParser, PageSink};
use sluice_paginate::sinks::CountSink;
use sluice_paginate::synthetic::{page_bytes, PaperPages};
use sluice_paginate::write::{write_new_export, Layout, PageSource, WriteSettings};
use sluice_paginate::{Error as PageError, ReadOptions};
use sonic_rs::JsonContainerTrait as _;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BASELINE_SOURCE: &str = "bench/baselines/fread_jansson.c";
const BLOCK_BYTES: u64 = 4096;
/// Most slots per extent the benchmark picks (a divisor of each slice's pages).
const MOST_EXTENT_SLOTS: u64 = 16;

#[derive(clap::Args)]
pub struct ReadBenchArgs {
    /// Page counts L to measure, each a multiple of --tasks.
    #[arg(long, value_delimiter = ',', default_value = "50,500")]
    pages: Vec<u64>,
    /// Documents per page (the paper: 2048).
    #[arg(long, default_value_t = 2048)]
    page_docs: u32,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Runs of every cell; medians are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Our reading tasks and the baseline's threads (the paper: 2).
    #[arg(long, default_value_t = 2)]
    tasks: usize,
    /// Pages in flight per task (`sluice read`'s default).
    #[arg(long, default_value_t = 4)]
    queue_depth: usize,
    /// Page-cache states to measure.
    #[arg(long, value_delimiter = ',', default_value = "cold,warm")]
    cache: Vec<CacheState>,
    #[arg(long, default_value = "data/bench-pages.dev")]
    device: PathBuf,
    /// Skip fio.
    #[arg(long)]
    no_fio: bool,
    /// Skip the Jansson cells and the fread + Jansson baseline.
    #[arg(long)]
    no_jansson: bool,
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq, Debug, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum CacheState {
    Cold,
    Warm,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum Cell {
    Fio,
    /// `sluice read`: io_uring direct + the sluice-json scan.
    Sluice,
    UringJansson,
    PreadScan,
    PreadJansson,
    FreadJansson,
}

impl Cell {
    fn label(self) -> &'static str {
        match self {
            Cell::Fio => "fio sequential read (device limit)",
            Cell::Sluice => "sluice read: io_uring direct + sluice-json scan",
            Cell::UringJansson => "io_uring direct + Jansson",
            Cell::PreadScan => "buffered pread + sluice-json scan",
            Cell::PreadJansson => "buffered pread + Jansson",
            Cell::FreadJansson => "fread + Jansson (C, paper baseline)",
        }
    }
}

/// The pages of one L on the device.
struct Prepared {
    pages: u64,
    docs: u64,
    data_offset_bytes: u64,
    slot_bytes: u64,
}

impl Prepared {
    fn region_bytes(&self) -> u64 {
        self.pages * self.slot_bytes
    }
}

#[derive(Debug, Clone, serde::Serialize)]
struct CellFigures {
    cell: Cell,
    label: &'static str,
    cache: CacheState,
    seconds: Vec<f64>,
    median_seconds: f64,
    median_mb_per_s: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
struct ParserFigures {
    parser: &'static str,
    median_mb_per_s: f64,
}

#[derive(Debug, serde::Serialize)]
struct Report {
    pages: u64,
    page_docs: u32,
    docs: u64,
    region_bytes: u64,
    tasks: usize,
    queue_depth: usize,
    runs: usize,
    cells: Vec<CellFigures>,
    parsers_one_thread: Vec<ParserFigures>,
}

pub fn run(args: &ReadBenchArgs) -> Result<()> {
    ensure!(args.runs >= 1, "--runs must be at least 1");
    ensure!(
        (1..=64).contains(&args.tasks),
        "--tasks must be between 1 and 64"
    );
    for &l in &args.pages {
        ensure!(
            l > 0 && l % args.tasks as u64 == 0,
            "--pages {l}: each L must be a positive multiple of --tasks ({}), so every slice fills whole extents and the pages lie back to back",
            args.tasks
        );
    }
    let jansson = if args.no_jansson {
        None
    } else {
        let bin = build_baseline(
            BASELINE_SOURCE,
            "cc",
            &["-O2", "-pthread"],
            &["-ljansson"],
            "install gcc and libjansson-dev; scripts/setup does",
        )?;
        Some((Jansson::load()?, bin))
    };
    if !args.no_fio {
        super::fio::locate()?;
    }
    if args.cache.contains(&CacheState::Cold) {
        drop_caches().context(
            "cold runs drop the page cache, which needs root: run as root or pass --cache warm",
        )?;
    }
    let mut reports = Vec::new();
    for &l in &args.pages {
        let prepared = prepare(args, l)?;
        let parsers = measure_parsers(args, jansson.as_ref().map(|j| &j.0))?;
        let mut cells = Vec::new();
        for &cache in &args.cache {
            cells.extend(measure_cells(
                args,
                &prepared,
                cache,
                jansson.as_ref().map(|(j, b)| (j, b.as_path())),
            )?);
        }
        let report = Report {
            pages: l,
            page_docs: args.page_docs,
            docs: prepared.docs,
            region_bytes: prepared.region_bytes(),
            tasks: args.tasks,
            queue_depth: args.queue_depth,
            runs: args.runs,
            cells,
            parsers_one_thread: parsers,
        };
        print_report(&report);
        reports.push(report);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&reports)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The description a generated export of L pages carries; an export with the
/// same one is used again.
fn description(args: &ReadBenchArgs, pages: u64) -> String {
    serde_json::json!({
        "generated": "paper pages",
        "seed": args.seed,
        "pages": pages,
        "page_docs": args.page_docs,
        "slices": args.tasks,
    })
    .to_string()
}

/// Writes L pages onto the device (unless it holds them already) and checks
/// they lie back to back from the data region's start.
fn prepare(args: &ReadBenchArgs, pages: u64) -> Result<Prepared> {
    let slices = args.tasks as u64;
    let per_slice = pages / slices;
    let most = MOST_EXTENT_SLOTS.min(max_extent_slots(BLOCK_BYTES as u32) as u64);
    let extent_slots = (1..=most)
        .rev()
        .find(|d| per_slice.is_multiple_of(*d))
        .unwrap_or(1);
    let slot_blocks = (page_bytes(args.page_docs) as u64).div_ceil(BLOCK_BYTES);
    let extents = pages / extent_slots;
    let manifest_lba = 2 + 2 * slices;
    let size_bytes = (manifest_lba + extents * (1 + extent_slots * slot_blocks)) * BLOCK_BYTES;
    let wanted = description(args, pages);
    if let Some(dir) = args.device.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    if !holds(&args.device, &wanted) {
        let _ = std::fs::remove_file(&args.device);
        eprintln!(
            "writing {pages} pages of {} documents ({:.2} GB) onto {}...",
            args.page_docs,
            size_bytes as f64 / 1e9,
            args.device.display()
        );
        let device: Arc<dyn Device> = Arc::new(FileDevice::create(
            &args.device,
            size_bytes,
            &FileOptions::default(),
        )?);
        let layout = Layout {
            slices: slices as u32,
            page_docs: args.page_docs,
            slot_blocks: slot_blocks as u32,
            extent_slots: extent_slots as u32,
            cursor_kind: CursorKind::Pit,
            description: wanted,
        };
        let (seed, page_docs) = (args.seed, args.page_docs);
        let sources = |slice: u32, cursor: &str| -> sluice_paginate::Result<Box<dyn PageSource>> {
            Ok(Box::new(PaperPages::for_slice(
                seed,
                page_docs,
                pages,
                slice,
                slices as u32,
                cursor,
            )?))
        };
        let settings = WriteSettings {
            progress: ProgressMode::Auto,
            progress_interval: Duration::from_secs(10),
            total_docs: Some(pages * page_docs as u64),
            ..WriteSettings::default()
        };
        let written = write_new_export(device, &layout, &sources, &settings)?;
        eprintln!("written in {:.1} s", written.elapsed.as_secs_f64());
    }
    check_back_to_back(&args.device, pages, args.page_docs)
}

fn holds(path: &Path, description: &str) -> bool {
    let Ok(device) = FileDevice::open(path, &FileOptions::default()) else {
        return false;
    };
    let Ok(io) = DeviceIo::open(Arc::new(device), 4, 16 << 20) else {
        return false;
    };
    load_export(&io).is_ok_and(|l| {
        l.header.state == ExportState::Complete && l.header.description == description
    })
}

/// The pages must fill slots data_lba, data_lba + slot, … with no gap: the
/// region fio and fread read is then exactly the pages.
fn check_back_to_back(path: &Path, pages: u64, page_docs: u32) -> Result<Prepared> {
    let device = Arc::new(FileDevice::open(path, &FileOptions::default())?);
    let io = DeviceIo::open(device, 4, 16 << 20)?;
    let loaded = load_export(&io)?;
    let h = &loaded.header;
    let mut lbas: Vec<u64> = loaded
        .slices
        .iter()
        .flat_map(|s| s.pages.iter().map(|p| p.lba))
        .collect();
    lbas.sort_unstable();
    let slot = h.slot_blocks as u64;
    let expected: Vec<u64> = (0..pages).map(|i| h.data_lba + i * slot).collect();
    ensure!(
        lbas == expected,
        "the generated pages on {} do not lie back to back; delete it and run again",
        path.display()
    );
    Ok(Prepared {
        pages,
        docs: pages * page_docs as u64,
        data_offset_bytes: h.data_lba * BLOCK_BYTES,
        slot_bytes: slot * BLOCK_BYTES,
    })
}

fn measure_cells(
    args: &ReadBenchArgs,
    prepared: &Prepared,
    cache: CacheState,
    jansson: Option<(&Jansson, &Path)>,
) -> Result<Vec<CellFigures>> {
    let mut cells = vec![Cell::Sluice, Cell::PreadScan];
    if !args.no_fio {
        cells.insert(0, Cell::Fio);
    }
    if jansson.is_some() {
        cells.extend([Cell::UringJansson, Cell::PreadJansson, Cell::FreadJansson]);
    }
    if cache == CacheState::Warm {
        warm(&args.device, prepared)?;
    }
    let mut seconds: Vec<Vec<f64>> = vec![Vec::new(); cells.len()];
    for run in 0..args.runs {
        // A different first cell each run, so no cell always follows the same one.
        for k in 0..cells.len() {
            let i = (k + run) % cells.len();
            if cache == CacheState::Cold {
                drop_caches()?;
            }
            let s = measure(args, prepared, cells[i], jansson)
                .with_context(|| format!("{} ({cache:?})", cells[i].label()))?;
            eprintln!(
                "  L={} {cache:?} run {}: {:<40} {:7.3} s {:8.0} MB/s",
                prepared.pages,
                run + 1,
                cells[i].label(),
                s,
                prepared.region_bytes() as f64 / s / 1e6
            );
            seconds[i].push(s);
        }
    }
    Ok(cells
        .iter()
        .zip(seconds)
        .map(|(&cell, s)| {
            let m = median(&mut s.clone());
            CellFigures {
                cell,
                label: cell.label(),
                cache,
                seconds: s,
                median_seconds: m,
                median_mb_per_s: prepared.region_bytes() as f64 / m / 1e6,
            }
        })
        .collect())
}

/// Seconds of one cell over the whole region; fails unless every document
/// was seen.
fn measure(
    args: &ReadBenchArgs,
    prepared: &Prepared,
    cell: Cell,
    jansson: Option<(&Jansson, &Path)>,
) -> Result<f64> {
    let options = |engine| ReadOptions {
        tasks: args.tasks,
        queue_depth: args.queue_depth,
        engine,
        ..ReadOptions::default()
    };
    let open = |direct| -> Result<Arc<dyn Device>> {
        let o = FileOptions {
            direct,
            ..FileOptions::default()
        };
        Ok(Arc::new(FileDevice::open(&args.device, &o)?))
    };
    let start = Instant::now();
    let docs = match cell {
        Cell::Fio => return run_fio(&args.device, prepared),
        Cell::FreadJansson => {
            let (_, bin) = jansson.context("Jansson")?;
            return run_fread_jansson(bin, &args.device, prepared, args.tasks);
        }
        Cell::Sluice | Cell::PreadScan => {
            let (direct, engine) = io_path(cell);
            let (summary, _) =
                read_export(open(direct)?, &options(engine), |_| CountSink::default())?;
            summary.docs
        }
        Cell::UringJansson | Cell::PreadJansson => {
            let (j, _) = jansson.context("Jansson")?;
            let (direct, engine) = io_path(cell);
            let (_, sinks) = read_pages(open(direct)?, &options(engine), |_| JanssonSink {
                jansson: j,
                docs: 0,
            })?;
            sinks.iter().map(|s| s.docs).sum()
        }
    };
    let seconds = start.elapsed().as_secs_f64();
    ensure!(
        docs == prepared.docs,
        "saw {docs} documents, expected {}",
        prepared.docs
    );
    Ok(seconds)
}

/// O_DIRECT and the engine of a cell: io_uring direct, or buffered pread.
fn io_path(cell: Cell) -> (bool, EngineKind) {
    match cell {
        Cell::Sluice | Cell::UringJansson => (true, EngineKind::Uring),
        _ => (false, EngineKind::Posix),
    }
}

/// Our read path with Jansson instead of our scan.
struct JanssonSink<'a> {
    jansson: &'a Jansson,
    docs: u64,
}

impl PageSink for JanssonSink<'_> {
    fn raw_page(&mut self, page: &PageInfo, bytes: &[u8]) -> sluice_paginate::Result<()> {
        let (docs, _) =
            self.jansson
                .walk_page(bytes)
                .map_err(|detail| PageError::MalformedPage {
                    slice: page.slice,
                    seq: page.seq,
                    lba: page.lba,
                    detail,
                })?;
        self.docs += docs;
        Ok(())
    }
}

fn run_fio(device: &Path, prepared: &Prepared) -> Result<f64> {
    // 1 MiB requests, or page-sized ones for pages smaller than that.
    let block = prepared.slot_bytes.min(1 << 20);
    let size = prepared.region_bytes() / block * block;
    let out = Command::new("fio")
        .args([
            "--name=pages",
            &format!("--filename={}", device.display()),
            "--ioengine=io_uring",
            "--direct=1",
            "--fixedbufs=1",
            "--registerfiles=1",
            "--rw=read",
            &format!("--bs={block}"),
            "--iodepth=32",
            // fio drops the file's cached pages before it starts by default,
            // which made every cell after it in a warm run read cold. Cold
            // runs drop the caches themselves.
            "--invalidate=0",
            &format!("--offset={}", prepared.data_offset_bytes),
            &format!("--size={size}"),
            "--output-format=json",
        ])
        .output()
        .context("running fio")?;
    if !out.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(&text[text.find('{').context("no JSON")?..])
        .context("parsing fio JSON")?;
    let bw = v["jobs"][0]["read"]["bw_bytes"]
        .as_f64()
        .filter(|b| *b > 0.0)
        .context("fio JSON has no read bw_bytes")?;
    // The same bytes as the others at fio's bandwidth.
    Ok(prepared.region_bytes() as f64 / bw)
}

fn run_fread_jansson(
    bin: &Path,
    device: &Path,
    prepared: &Prepared,
    threads: usize,
) -> Result<f64> {
    let out = Command::new(bin)
        .arg(device)
        .arg(prepared.data_offset_bytes.to_string())
        .arg(prepared.slot_bytes.to_string())
        .arg(prepared.pages.to_string())
        .arg(threads.to_string())
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("parsing fread_jansson's JSON line")?;
    let docs = v["docs"].as_u64().context("no docs")?;
    ensure!(
        docs == prepared.docs,
        "fread_jansson saw {docs} documents, expected {}",
        prepared.docs
    );
    v["seconds"].as_f64().context("no seconds")
}

fn drop_caches() -> Result<()> {
    let synced = Command::new("sync").status().context("running sync")?;
    ensure!(synced.success(), "sync failed");
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("writing /proc/sys/vm/drop_caches")
}

/// Reads the region once through the page cache.
fn warm(device: &Path, prepared: &Prepared) -> Result<()> {
    let mut file = std::fs::File::open(device)?;
    file.seek(SeekFrom::Start(prepared.data_offset_bytes))?;
    let mut left = prepared.region_bytes();
    let mut buf = vec![0u8; 4 << 20];
    while left > 0 {
        let n = (left as usize).min(buf.len());
        file.read_exact(&mut buf[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// Each parser alone, one thread, on pages in memory.
fn measure_parsers(args: &ReadBenchArgs, jansson: Option<&Jansson>) -> Result<Vec<ParserFigures>> {
    let pages: Vec<Vec<u8>> = (0..8)
        .map(|p| PaperPages::page(args.seed, args.page_docs, p))
        .collect();
    let bytes: usize = pages.iter().map(Vec::len).sum();
    let docs = args.page_docs as usize;
    type Parser<'a> = (&'static str, Box<dyn Fn(&[u8]) -> Result<usize> + 'a>);
    let parser = std::cell::RefCell::new(PageParser::new());
    let parser = &parser;
    let mut parsers: Vec<Parser> = vec![
        (
            "sluice-json scan, ids + raw sources (sluice read)",
            Box::new(move |p: &[u8]| {
                let info = PageInfo {
                    slice: 0,
                    seq: 0,
                    lba: 0,
                    docs: docs as u32,
                    bytes: p.len() as u32,
                };
                Ok(parser.borrow_mut().parse(p, &info)?.len())
            }),
        ),
        (
            "sonic-rs, ids + raw sources (sluice read before sluice-json)",
            Box::new(|p: &[u8]| Ok(sonic_rs::from_slice::<Vec<SonicHit>>(p)?.len())),
        ),
        (
            "sonic-rs, whole DOM",
            Box::new(|p: &[u8]| {
                let v: sonic_rs::Value = sonic_rs::from_slice(p)?;
                Ok(v.as_array().map_or(0, |a| a.len()))
            }),
        ),
        (
            "simd-json, whole DOM (copy + parse in place)",
            Box::new(|p: &[u8]| {
                let mut copy = p.to_vec();
                let v = simd_json::to_borrowed_value(&mut copy)?;
                Ok(v.as_array().map_or(0, |a| a.len()))
            }),
        ),
    ];
    if let Some(j) = jansson {
        parsers.push((
            "Jansson, whole DOM",
            Box::new(move |p: &[u8]| {
                j.walk_page(p)
                    .map(|(d, _)| d as usize)
                    .map_err(|e| anyhow::anyhow!(e))
            }),
        ));
    }
    let mut figures = Vec::new();
    for (name, parse) in &parsers {
        let mut rates = Vec::new();
        for _ in 0..args.runs.max(3) {
            let start = Instant::now();
            for p in &pages {
                ensure!(parse(p)? == docs, "{name} miscounted a page");
            }
            rates.push(bytes as f64 / start.elapsed().as_secs_f64() / 1e6);
        }
        figures.push(ParserFigures {
            parser: name,
            median_mb_per_s: median(&mut rates),
        });
    }
    Ok(figures)
}

/// A hit as sonic-rs's validating struct parse reads it (ids borrowed, each
/// source validated as it is skipped).
#[derive(serde::Deserialize)]
struct SonicHit<'a> {
    #[serde(borrow, rename = "_id")]
    _id: std::borrow::Cow<'a, str>,
    #[serde(borrow, rename = "_source")]
    _source: sonic_rs::LazyValue<'a>,
}

fn print_report(r: &Report) {
    println!(
        "\nL = {} pages × {} documents ({:.2} GB), {} tasks, queue depth {}, median of {} runs",
        r.pages,
        r.page_docs,
        r.region_bytes as f64 / 1e9,
        r.tasks,
        r.queue_depth,
        r.runs
    );
    println!(
        "{:<6} {:<42} {:>10} {:>10}",
        "cache", "side", "seconds", "MB/s"
    );
    for c in &r.cells {
        println!(
            "{:<6} {:<42} {:>10.3} {:>10.0}",
            format!("{:?}", c.cache).to_lowercase(),
            c.label,
            c.median_seconds,
            c.median_mb_per_s
        );
    }
    let rate = |cache, cell| {
        r.cells
            .iter()
            .find(|c| c.cache == cache && c.cell == cell)
            .map(|c| c.median_mb_per_s)
    };
    let ratio = |what: &str, a: Option<f64>, b: Option<f64>, target: &str| {
        if let (Some(a), Some(b)) = (a, b) {
            println!("  {what}: {:.2}x {target}", a / b);
        }
    };
    use CacheState::{Cold, Warm};
    ratio(
        "cold: sluice read / fio",
        rate(Cold, Cell::Sluice),
        rate(Cold, Cell::Fio),
        "(target >= 0.9)",
    );
    ratio(
        "cold: sluice read / fread + Jansson",
        rate(Cold, Cell::Sluice),
        rate(Cold, Cell::FreadJansson),
        "",
    );
    ratio(
        "warm: buffered pread + sluice-json scan / fread + Jansson",
        rate(Warm, Cell::PreadScan),
        rate(Warm, Cell::FreadJansson),
        "(target >= 26)",
    );
    ratio(
        "warm: sluice read (direct) / fread + Jansson",
        rate(Warm, Cell::Sluice),
        rate(Warm, Cell::FreadJansson),
        "",
    );
    println!("parsers alone, one thread, pages in memory:");
    for p in &r.parsers_one_thread {
        println!("  {:<46} {:>8.0} MB/s", p.parser, p.median_mb_per_s);
    }
}
