//! `sluice query`: SCAN with a predicate, a projection and a limit, run in
//! the engine (sluice-ndp); only matching rows, projected, come out.

use crate::kv::open_devices;
use anyhow::{bail, Result};
use sluice_ndp::aggregate::{aggregate, parse_aggregates, AggregateSpec};
use sluice_ndp::expr::Path;
use sluice_ndp::scan::{self, Projection, ScanSpec};
use sluice_ndp::{parse, FieldPredicate, Layout, Predicate};
use sluice_store::{Store, StoreConfig};
use std::io::Write;
use std::ops::Bound;
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
}

fn paths(select: &str) -> Result<Vec<Path>> {
    select
        .split(',')
        .map(|field| match parse(&format!("EXISTS {}", field.trim()))? {
            Predicate::Exists(p) => Ok(p),
            _ => bail!("--select: {field:?} is not a field path"),
        })
        .collect()
}

pub fn run(args: &QueryArgs) -> Result<()> {
    // Bad expressions fail before the store is opened, fields that do not
    // fit the keyspace's format before the scan starts.
    let predicate = args.predicate.as_deref().map(parse).transpose()?;
    let select = args.select.as_deref().map(paths).transpose()?;
    let aggregates = args
        .aggregate
        .as_deref()
        .map(parse_aggregates)
        .transpose()?;
    let group_by = match args.group_by.as_deref().map(paths).transpose()? {
        Some(mut p) if p.len() == 1 => p.pop(),
        Some(_) => bail!("--group-by takes one field"),
        None => None,
    };
    let store = Store::open_on(
        open_devices(&args.devices)?,
        &args.store.config(StoreConfig::default()),
    )?;
    let def = store.keyspace_def(&args.keyspace)?;
    let reads_fields = predicate.is_some() || select.is_some() || aggregates.is_some();
    // Raw keyspaces can still be listed; reading fields needs a format.
    let layout = match Layout::of(&def) {
        Ok(layout) => Some(layout),
        Err(e) if reads_fields => return Err(e.into()),
        Err(_) => None,
    };
    let predicate = match (&predicate, &layout) {
        (Some(p), Some(l)) => Some(FieldPredicate::compile_for(p, l)?),
        _ => None,
    };
    let projection = match (&select, &layout) {
        (Some(s), Some(l)) => Some(Projection::new_for(s, l)?),
        _ => None,
    };
    if let Some(aggs) = &aggregates {
        let spec = AggregateSpec {
            keyspace: def.id,
            layout: layout.as_ref().expect("checked above"),
            range: (Bound::Unbounded, Bound::Unbounded),
            predicate: predicate.as_ref(),
            aggregates: aggs,
            group_by: group_by.as_ref(),
            threads: args.threads,
        };
        let start = Instant::now();
        let (rows, stats) = aggregate(&store, &spec)?;
        let names: Vec<String> = aggs.iter().map(|a| a.to_string()).collect();
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
    let spec = ScanSpec {
        keyspace: def.id,
        range: (Bound::Unbounded, Bound::Unbounded),
        reverse: args.reverse,
        predicate: predicate.as_ref(),
        projection: projection.as_ref(),
        limit: args.limit,
        batch_bytes: args.batch_bytes,
        threads: args.threads,
    };
    let start = Instant::now();
    let out = std::io::stdout();
    let mut out = out.lock();
    // Records print as JSON; projections already are.
    let as_record = layout
        .as_ref()
        .filter(|l| l.is_record() && projection.is_none());
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
