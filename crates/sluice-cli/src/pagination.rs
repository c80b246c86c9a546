//! `sluice load`, `sluice export`, `sluice read`: sliced-scroll pagination of
//! a search index onto a device and back (sluice-paginate).

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use sluice_io::{Device, EngineKind, FileDevice, FileOptions};
use sluice_ndp::pages::PageFilter;
use sluice_paginate::format::CursorKind;
use sluice_paginate::load::{load, LoadOptions};
use sluice_paginate::progress::ProgressMode;
use sluice_paginate::read::{read_export, OnCorrupt, ReadOptions, ReadSummary};
use sluice_paginate::sinks::{CountSink, FilterCountSink, NdjsonSink, SharedOut, SourceFilter};
use sluice_paginate::source::SourceSpec;
use sluice_paginate::{export, Auth, Client, ExportOptions, HttpOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How to reach the source.
#[derive(clap::Args, Debug, Clone)]
pub struct SourceArgs {
    /// URL of the OpenSearch/Elasticsearch node: http(s)://host:port.
    #[arg(long, default_value = "http://127.0.0.1:9200")]
    source: String,
    /// User for basic auth (the password from --password or SLUICE_SOURCE_PASSWORD).
    #[arg(long)]
    user: Option<String>,
    #[arg(long, env = "SLUICE_SOURCE_PASSWORD", hide_env_values = true)]
    password: Option<String>,
    /// API key: `id:key` or its base64 form.
    #[arg(long, env = "SLUICE_SOURCE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// PEM file of the CA that signed the source's TLS certificate.
    #[arg(long)]
    ca_cert: Option<PathBuf>,
    #[arg(long, default_value_t = 5_000)]
    connect_timeout_ms: u64,
    /// Whole request, answer included.
    #[arg(long, default_value_t = 120_000)]
    timeout_ms: u64,
    /// Retries on 429, 5xx and dropped connections, with backoff.
    #[arg(long, default_value_t = 6)]
    retries: u32,
}

impl SourceArgs {
    fn client(&self) -> Result<Client> {
        let auth = match (&self.user, &self.api_key) {
            (Some(_), Some(_)) => bail!("give --user/--password or --api-key, not both"),
            (Some(user), None) => Auth::Basic {
                user: user.clone(),
                password: self.password.clone().unwrap_or_default(),
            },
            (None, Some(key)) => Auth::ApiKey(key.clone()),
            (None, None) => Auth::None,
        };
        Ok(Client::new(&HttpOptions {
            url: self.source.clone(),
            auth,
            ca_cert: self.ca_cert.clone(),
            connect_timeout_ms: self.connect_timeout_ms,
            request_timeout_ms: self.timeout_ms,
            max_retries: self.retries,
            ..HttpOptions::default()
        })?)
    }
}

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum ProgressArg {
    Auto,
    Bars,
    Lines,
    Off,
}

impl From<ProgressArg> for ProgressMode {
    fn from(p: ProgressArg) -> Self {
        match p {
            ProgressArg::Auto => ProgressMode::Auto,
            ProgressArg::Bars => ProgressMode::Bars,
            ProgressArg::Lines => ProgressMode::Lines,
            ProgressArg::Off => ProgressMode::Off,
        }
    }
}

#[derive(clap::Args)]
pub struct LoadArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// Index to create and fill.
    #[arg(long, default_value = "papers")]
    index: String,
    /// Documents to index (paper-shaped JSON of 1556 bytes each).
    #[arg(long, default_value_t = 10_000)]
    docs: u64,
    /// Primary shards of the new index.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// Seed of the generated documents (the same seed gives the same documents).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Drop an existing index of that name first.
    #[arg(long)]
    replace: bool,
    /// Bulk requests in flight.
    #[arg(long, default_value_t = 2)]
    connections: usize,
    #[arg(long, value_enum, default_value = "auto")]
    progress: ProgressArg,
}

pub fn run_load(args: &LoadArgs) -> Result<()> {
    let client = args.source.client()?;
    let s = load(
        &client,
        &LoadOptions {
            index: args.index.clone(),
            docs: args.docs,
            shards: args.shards,
            seed: args.seed,
            replace: args.replace,
            connections: args.connections,
            progress: args.progress.into(),
            ..LoadOptions::default()
        },
    )?;
    println!(
        "loaded {} documents ({:.1} MB) into {} in {:.1} s ({:.0} docs/s)",
        s.docs,
        s.bytes as f64 / 1e6,
        args.index,
        s.elapsed.as_secs_f64(),
        s.docs as f64 / s.elapsed.as_secs_f64()
    );
    Ok(())
}

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum ApiArg {
    /// Point in time + search_after.
    Pit,
    /// Sliced scroll.
    Scroll,
}

#[derive(clap::Args)]
pub struct ExportArgs {
    #[command(flatten)]
    source: SourceArgs,
    #[arg(long, default_value = "papers")]
    index: String,
    /// Export device: a file (created at the size needed when missing) or a block device.
    #[arg(long, default_value = "data/export.dev")]
    device: PathBuf,
    /// Size of the file to create, in MiB (default: what the export needs).
    #[arg(long)]
    device_size_mib: Option<u64>,
    /// Slices, one task each (default: the index's primary shard count).
    #[arg(long)]
    slices: Option<u32>,
    /// Most documents a page (one search response) asks for.
    #[arg(long, default_value_t = 2048)]
    page_docs: u32,
    /// The byte budget of one search response, in MiB: pages are sized by
    /// the documents' measured size to stay near it (starting at 16
    /// documents, at most doubling a page), and halve when the source
    /// answers 429, a circuit breaker, 5xx or not in time.
    #[arg(long, default_value_t = 8)]
    page_mib: u64,
    /// Cursor: pit (point in time + search_after; resumes after a crash)
    /// or scroll (cannot resume).
    #[arg(long, value_enum, default_value = "pit")]
    api: ApiArg,
    /// Point-in-time or scroll keep-alive.
    #[arg(long, default_value = "5m")]
    keep_alive: String,
    /// The query clause as JSON (default: all documents).
    #[arg(long)]
    query: Option<String>,
    /// `_source` fields to keep (comma separated, wildcards allowed).
    #[arg(long, value_delimiter = ',')]
    source_includes: Vec<String>,
    #[arg(long, value_delimiter = ',')]
    source_excludes: Vec<String>,
    /// At most this many documents per second over all slices.
    #[arg(long)]
    throttle: Option<f64>,
    /// Slot size in bytes (default: sized from a sample so a usual page fits one).
    #[arg(long)]
    slot_bytes: Option<u64>,
    /// Continue an interrupted export where its checkpoints say.
    #[arg(long)]
    resume: bool,
    /// Most milliseconds written pages wait to be made durable and
    /// checkpointed (one device flush each time); 0: every page at once.
    /// After a crash, `--resume` fetches again what no checkpoint counted.
    #[arg(long, default_value_t = sluice_paginate::DEFAULT_CHECKPOINT_INTERVAL.as_millis() as u64)]
    checkpoint_interval_ms: u64,
    #[arg(long, value_enum, default_value = "auto")]
    progress: ProgressArg,
    /// Seconds between progress lines when not on a terminal.
    #[arg(long, default_value_t = 5.0)]
    progress_interval_s: f64,
}

pub fn run_export(args: &ExportArgs) -> Result<()> {
    let client = args.source.client()?;
    let options = ExportOptions {
        device: args.device.clone(),
        device_size_bytes: args.device_size_mib.map(|m| m << 20),
        spec: SourceSpec {
            index: args.index.clone(),
            query: args.query.clone(),
            source_includes: args.source_includes.clone(),
            source_excludes: args.source_excludes.clone(),
            keep_alive: args.keep_alive.clone(),
        },
        slices: args.slices,
        page_docs: args.page_docs,
        page_bytes: args.page_mib.max(1) << 20,
        cursor: match args.api {
            ApiArg::Pit => CursorKind::Pit,
            ApiArg::Scroll => CursorKind::Scroll,
        },
        slot_bytes: args.slot_bytes,
        throttle_docs_per_s: args.throttle,
        resume: args.resume,
        checkpoint_interval: Duration::from_millis(args.checkpoint_interval_ms),
        progress: args.progress.into(),
        progress_interval: Duration::from_secs_f64(args.progress_interval_s.max(0.1)),
        ..ExportOptions::default()
    };
    let s = export(&client, &options)?;
    let secs = s.elapsed.as_secs_f64();
    println!(
        "exported {} documents in {} pages ({:.1} MB, {:.1} MB of the device used) from {} to {} in {:.1} s: {:.0} docs/s, {:.1} MB/s{}",
        s.docs,
        s.pages,
        s.bytes as f64 / 1e6,
        s.device_bytes_used as f64 / 1e6,
        args.index,
        args.device.display(),
        secs,
        s.docs_this_run as f64 / secs,
        s.bytes_this_run as f64 / secs / 1e6,
        if s.docs_this_run != s.docs {
            format!(" ({} of them in this run)", s.docs_this_run)
        } else {
            String::new()
        }
    );
    for (i, slice) in s.slices.iter().enumerate() {
        println!(
            "  slice {i}: {} documents in {} pages",
            slice.docs, slice.pages
        );
    }
    if s.page_refusals > 0 {
        println!(
            "the source refused or failed {} answers (429, circuit breaker, 5xx or a timeout); each time the pages were halved and the request tried again after a pause",
            s.page_refusals
        );
    }
    Ok(())
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SinkArg {
    /// Documents and bytes, per slice.
    Count,
    /// One `{"_id","_source"}` line per document, to --out or stdout.
    Ndjson,
    /// Documents matching every --where; counted, or written with --out.
    Filter,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnCorruptArg {
    Skip,
    Fail,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadEngineArg {
    /// io_uring, O_DIRECT, fixed buffers.
    Uring,
    /// pread on threads: the baseline.
    Posix,
}

#[derive(clap::Args)]
pub struct ReadArgs {
    /// The device an export was written to.
    #[arg(long, default_value = "data/export.dev")]
    device: PathBuf,
    #[arg(long, value_enum, default_value = "count")]
    sink: SinkArg,
    /// Output file of the ndjson and filter sinks ("-" or none: stdout for ndjson).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Keep documents whose _source matches this predicate, in the language
    /// of `sluice query --where` (e.g. "year >= 2015 AND venue = 'VLDB'",
    /// "title CONTAINS 'graph'"); repeat to join with AND.
    #[arg(long = "where")]
    conditions: Vec<String>,
    /// Reading tasks (default: one per core).
    #[arg(long, default_value_t = crate::cores())]
    tasks: usize,
    /// Pages in flight per task. A page of 2048 documents is about 3 MB, many
    /// device requests deep; `sluice bench read` measured 4 fastest here.
    #[arg(long, default_value_t = 4)]
    queue_depth: usize,
    /// A page whose checksum or JSON is bad: stop (fail) or report it and
    /// read the rest (skip).
    #[arg(long, value_enum, default_value = "fail")]
    on_corrupt: OnCorruptArg,
    #[arg(long, value_enum, default_value = "uring")]
    engine: ReadEngineArg,
    #[arg(long, value_enum, default_value = "off")]
    progress: ProgressArg,
}

pub fn open_export_device(path: &Path, direct: bool) -> Result<Arc<dyn Device>> {
    let device = FileDevice::open(
        path,
        &FileOptions {
            direct,
            ..FileOptions::default()
        },
    )
    .with_context(|| format!("opening the export device {}", path.display()))?;
    Ok(Arc::new(device))
}

pub fn run_read(args: &ReadArgs) -> Result<()> {
    let options = ReadOptions {
        tasks: args.tasks,
        queue_depth: args.queue_depth,
        on_corrupt: match args.on_corrupt {
            OnCorruptArg::Skip => OnCorrupt::Skip,
            OnCorruptArg::Fail => OnCorrupt::Fail,
        },
        engine: match args.engine {
            ReadEngineArg::Uring => EngineKind::Uring,
            ReadEngineArg::Posix => EngineKind::Posix,
        },
        progress: args.progress.into(),
        ..ReadOptions::default()
    };
    let device = open_export_device(&args.device, args.engine == ReadEngineArg::Uring)?;
    if args.sink != SinkArg::Filter && !args.conditions.is_empty() {
        bail!("--where goes with --sink filter");
    }
    let summary = match args.sink {
        SinkArg::Count => {
            let (s, sinks) = read_export(device, &options, |_| CountSink::default())?;
            let source_bytes: u64 = sinks.iter().map(|k| k.source_bytes).sum();
            report(
                &s,
                &format!("{:.1} MB of sources", source_bytes as f64 / 1e6),
            );
            s
        }
        SinkArg::Ndjson => {
            let out = output(args.out.as_ref(), true)?;
            let (s, _) = read_export(device, &options, |_| NdjsonSink::new(out.clone(), None))?;
            flush(&out)?;
            report(&s, "written as NDJSON");
            s
        }
        SinkArg::Filter => {
            let filter: Arc<dyn SourceFilter> = Arc::new(PageFilter::parse(&args.conditions)?);
            match &args.out {
                None => {
                    let (s, sinks) =
                        read_export(device, &options, |_| FilterCountSink::new(filter.clone()))?;
                    let matched: u64 = sinks.iter().map(|k| k.matched).sum();
                    report(&s, &format!("{matched} match"));
                    s
                }
                Some(path) => {
                    let out = output(Some(path), false)?;
                    let (s, sinks) = read_export(device, &options, |_| {
                        NdjsonSink::new(out.clone(), Some(filter.clone()))
                    })?;
                    flush(&out)?;
                    let matched: u64 = sinks.iter().map(|k| k.written).sum();
                    report(
                        &s,
                        &format!("{matched} match, written to {}", path.display()),
                    );
                    s
                }
            }
        }
    };
    if !summary.bad_pages.is_empty() {
        bail!(
            "{} pages were skipped as corrupt or malformed (listed above); the rest was read",
            summary.bad_pages.len()
        );
    }
    Ok(())
}

fn output(path: Option<&PathBuf>, stdout_default: bool) -> Result<SharedOut> {
    let w: Box<dyn Write + Send> = match path {
        Some(p) if p.as_os_str() != "-" => Box::new(std::io::BufWriter::with_capacity(
            1 << 20,
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        _ if stdout_default || path.is_some() => Box::new(std::io::BufWriter::with_capacity(
            1 << 20,
            std::io::stdout(),
        )),
        _ => bail!("give --out"),
    };
    Ok(Arc::new(Mutex::new(w)))
}

fn flush(out: &SharedOut) -> Result<()> {
    out.lock()
        .unwrap_or_else(|p| p.into_inner())
        .flush()
        .context("flushing the output")
}

/// Summary lines go to stderr so that NDJSON on stdout stays clean.
fn report(s: &ReadSummary, what: &str) {
    let secs = s.elapsed.as_secs_f64();
    eprintln!(
        "read {} documents in {} pages ({:.1} MB) with {} tasks in {:.2} s: {:.0} docs/s, {:.0} MB/s; {what}",
        s.docs,
        s.pages,
        s.bytes as f64 / 1e6,
        s.tasks,
        secs,
        s.docs as f64 / secs,
        s.device_bytes as f64 / secs / 1e6
    );
    for (i, slice) in s.slices.iter().enumerate() {
        eprintln!(
            "  slice {i}: {} documents in {} pages ({:.1} MB)",
            slice.docs,
            slice.pages,
            slice.bytes as f64 / 1e6
        );
    }
}
