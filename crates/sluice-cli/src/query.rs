//! `sluice query`: SCAN with a predicate, a projection and a limit, run in
//! the engine (sluice-ndp); only matching rows, projected, come out.

use anyhow::Result;
use sluice_ndp::aggregate::aggregate;
use sluice_ndp::query::{Query, QueryText};
use sluice_ndp::scan;
use sluice_store::StoreConfig;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct QueryArgs {
    #[command(flatten)]
    store: crate::StoreOpenArgs,
    /// The store's devices, in the order they were formatted.
    #[arg(long = "device", default_value = "data/kv.dev")]
    devices: Vec<PathBuf>,
    /// Keyspace to scan (its declared format decides which fields exist).
    #[arg(long, default_value = "default")]
    keyspace: String,
    /// Predicate, e.g. "venue IN ('VLDB','SIGMOD') AND year BETWEEN 2000 AND 2010".
    #[arg(long = "where")]
    predicate: Option<String>,
    /// Fields to return, comma-separated paths, e.g. "title,year,authors[0]".
    #[arg(long)]
    select: Option<String>,
    /// Most rows to return.
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Scan from the largest key down.
    #[arg(long)]
    reverse: bool,
    /// Result batch size in bytes (a multiple of 4096).
    #[arg(long, default_value_t = 256 << 10)]
    batch_bytes: usize,
    /// Aggregates instead of rows, e.g. "count(*),avg(year),max(year)".
    #[arg(long, conflicts_with = "select")]
    aggregate: Option<String>,
    /// With --aggregate: one row per value of this field.
    #[arg(long, requires = "aggregate")]
    group_by: Option<String>,
    /// Worker threads over disjoint key ranges (cut at table boundaries).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Output: text (key, tab, JSON per line) or arrow (an Arrow IPC
    /// stream of typed columns, which pyarrow, pandas and DuckDB read).
    #[arg(long, value_enum, default_value = "text")]
    format: OutputFormat,
    /// With --format arrow: write the stream to this file (default: stdout).
    #[arg(long)]
    out: Option<PathBuf>,
    /// With --format arrow: a column's type, e.g. --type year:int64
    /// (bool, int64, uint64, uint32, float64, string, json, list<...>).
    #[arg(long = "type", value_name = "FIELD:TYPE")]
    types: Vec<String>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// One row per line: the key, a tab, the value as JSON.
    Text,
    /// An Arrow IPC stream.
    Arrow,
}

pub fn run(args: &QueryArgs) -> Result<()> {
    if args.format == OutputFormat::Arrow {
        return run_arrow(args);
    }
    if args.out.is_some() || !args.types.is_empty() {
        anyhow::bail!("--out and --type go with --format arrow");
    }
    let query = Query::parse(&QueryText {
        predicate: args.predicate.as_deref(),
        select: args.select.as_deref(),
        aggregate: args.aggregate.as_deref(),
        group_by: args.group_by.as_deref(),
    })?;
    let store = args.store.open(&args.devices, StoreConfig::default())?;
    let plan = query.plan(&store.keyspace_def(&args.keyspace)?)?;
    if let Some(spec) = plan.aggregate_spec(args.threads) {
        let start = Instant::now();
        let (rows, stats) = aggregate(&store, &spec)?;
        let names: Vec<String> = spec.aggregates.iter().map(|a| a.to_string()).collect();
        let group = args.group_by.as_deref().unwrap_or("");
        println!("{group}\t{}", names.join("\t"));
        for row in rows {
            let values: Vec<String> = row.values.iter().map(|v| v.to_string()).collect();
            println!(
                "{}\t{}",
                row.group.as_deref().unwrap_or("null"),
                values.join("\t")
            );
        }
        eprintln!(
            "{} rows matched of {} examined ({} bytes), {:.1} ms",
            stats.rows_returned,
            stats.rows_examined,
            stats.bytes_examined,
            start.elapsed().as_secs_f64() * 1e3
        );
        return Ok(());
    }
    let spec = plan.scan_spec(args.reverse, args.limit, args.batch_bytes, args.threads);
    let as_record = plan.record_output();
    let start = Instant::now();
    let out = std::io::stdout();
    let mut out = out.lock();
    let mut text = Vec::new();
    let stats = scan::scan(&store, &spec, &mut |batch| {
        for (k, v) in batch.rows() {
            let v = match as_record {
                Some(l) => {
                    text.clear();
                    l.to_json(v, &mut text)
                        .map_err(|e| scan::ScanError::Malformed {
                            key: String::from_utf8_lossy(k).into(),
                            error: e,
                        })?;
                    &text[..]
                }
                None => v,
            };
            let key: String = match std::str::from_utf8(k) {
                Ok(s) if !s.chars().any(char::is_control) => s.into(),
                _ => k.iter().map(|b| format!("{b:02x}")).collect(),
            };
            writeln!(out, "{key}\t{}", String::from_utf8_lossy(v))
                .map_err(|e| scan::ScanError::Sink(e.to_string()))?;
        }
        Ok(())
    })?;
    eprintln!(
        "{} rows of {} examined ({} bytes), {} bytes handed over in {} batches, {:.1} ms",
        stats.rows_returned,
        stats.rows_examined,
        stats.bytes_examined,
        stats.bytes_returned,
        stats.batches,
        start.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

/// `--format arrow`: the rows (or aggregates) as an Arrow IPC stream.
fn run_arrow(args: &QueryArgs) -> Result<()> {
    let mut types = std::collections::HashMap::new();
    for t in &args.types {
        let (name, ty) = t
            .split_once(':')
            .ok_or_else(|| anyhow::anyhow!("--type {t:?}: give FIELD:TYPE, e.g. year:int64"))?;
        let parsed = sluice_arrow::ColumnType::parse(ty).ok_or_else(|| {
            anyhow::anyhow!(
                "--type {t:?}: use bool, int64, uint64, uint32, float64, string, json or list<...>"
            )
        })?;
        types.insert(name.to_string(), parsed);
    }
    let store = std::sync::Arc::new(args.store.open(&args.devices, StoreConfig::default())?);
    let out: Box<dyn Write> = match &args.out {
        Some(path) => Box::new(std::io::BufWriter::new(std::fs::File::create(path)?)),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let start = Instant::now();
    let rows = match &args.aggregate {
        Some(aggregates) => {
            let batch = sluice_arrow::aggregate_batch(
                &store,
                &args.keyspace,
                args.predicate.as_deref(),
                aggregates,
                args.group_by.as_deref(),
                args.threads,
            )?;
            let schema = batch.schema();
            let reader = arrow_array::RecordBatchIterator::new(vec![Ok(batch)], schema);
            sluice_arrow::ipc::write_stream(reader, out)?
        }
        None => {
            let options = sluice_arrow::QueryOptions {
                predicate: args.predicate.clone(),
                select: args
                    .select
                    .as_deref()
                    .map(|s| s.split(',').map(|f| f.trim().to_string()).collect()),
                reverse: args.reverse,
                limit: Some(args.limit),
                threads: args.threads,
                types,
                ..sluice_arrow::QueryOptions::default()
            };
            let stream = sluice_arrow::query_stream(store, &args.keyspace, &options)?;
            sluice_arrow::ipc::write_stream(stream, out)?
        }
    };
    eprintln!(
        "{rows} rows written as an Arrow IPC stream in {:.1} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}
