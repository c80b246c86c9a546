//! `sluice import`: an export device read back through the read path's
//! sink into an index of the store `sluice serve --http` serves.

use anyhow::{bail, Context, Result};
use sluice_http::docs::DocOp;
use sluice_http::Api;
use sluice_paginate::read::{read_export, Hit, PageInfo, ReadOptions, Sink};
use sluice_store::StoreConfig;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(clap::Args)]
pub struct ImportArgs {
    /// The export device (`sluice export --device`).
    #[arg(long)]
    export: PathBuf,
    /// The store's device (set): `sluice serve --device`; created and
    /// formatted if no file exists yet. The server must not be running on
    /// it (the store allows one process).
    #[arg(long = "device", default_value = "data/serve.dev")]
    devices: Vec<PathBuf>,
    /// Size of each device file created, in MiB.
    #[arg(long, default_value_t = 4096)]
    create_mib: u64,
    /// The index the documents go into (created if missing, with one shard
    /// per slice of the export).
    #[arg(long)]
    index: String,
    /// Reading tasks (default: one per core).
    #[arg(long, default_value_t = crate::cores())]
    tasks: usize,
    #[command(flatten)]
    store: crate::StoreOpenArgs,
}

/// Each page of the export becomes one store batch of index operations.
struct ImportSink {
    api: Arc<Api>,
    index: Arc<sluice_http::catalog::Index>,
    imported: Arc<AtomicU64>,
    failed: Option<String>,
}

impl Sink for ImportSink {
    fn page(&mut self, page: &PageInfo, hits: &[Hit<'_>]) -> sluice_paginate::Result<()> {
        let ops: Vec<DocOp> = hits
            .iter()
            .map(|h| DocOp::Index {
                id: Some(h.id.to_string()),
                // An export of an index without stored sources holds null.
                source: if h.source == "null" {
                    b"{}".to_vec()
                } else {
                    h.source.as_bytes().to_vec()
                },
                create: false,
                expect: Default::default(),
            })
            .collect();
        for (hit, r) in hits.iter().zip(self.api.docs().apply(&self.index, ops)) {
            if let Err(e) = r {
                let why = format!(
                    "document {:?} of slice {} page {}: {}",
                    hit.id, page.slice, page.seq, e.reason
                );
                self.failed = Some(why.clone());
                return Err(sluice_paginate::Error::Format(why));
            }
        }
        self.imported
            .fetch_add(hits.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

pub fn run(args: &ImportArgs) -> Result<()> {
    sluice_http::catalog::check_index_name(&args.index).map_err(|e| anyhow::anyhow!(e.reason))?;
    let counts = sluice_paginate::read::slice_counts(crate::pagination::open_export_device(
        &args.export,
        true,
    )?)
    .with_context(|| format!("reading the export manifest of {}", args.export.display()))?;
    let expected: u64 = counts.iter().map(|c| c.docs).sum();
    let store = args
        .store
        .files(&args.devices, StoreConfig::default())
        .create_bytes(args.create_mib << 20)
        .open()?;
    let store = Arc::new(store);
    let api = Arc::new(Api::open(store.clone())?);
    let index = match api.catalog().get(&args.index) {
        Ok(i) => i,
        Err(_) => {
            let shards = counts.len().max(1);
            api.catalog()
                .create(
                    &args.index,
                    &serde_json::json!({"settings": {"number_of_shards": shards}}),
                )
                .map_err(|e| anyhow::anyhow!("creating index {}: {}", args.index, e.reason))?
        }
    };
    let imported = Arc::new(AtomicU64::new(0));
    let options = ReadOptions {
        tasks: args.tasks,
        ..ReadOptions::default()
    };
    let device = crate::pagination::open_export_device(&args.export, true)?;
    let started = std::time::Instant::now();
    let (summary, sinks) = read_export(device, &options, |_| ImportSink {
        api: api.clone(),
        index: index.clone(),
        imported: imported.clone(),
        failed: None,
    })
    .with_context(|| {
        format!(
            "importing {} into index {}",
            args.export.display(),
            args.index
        )
    })?;
    if let Some(why) = sinks.iter().find_map(|s| s.failed.clone()) {
        bail!("import stopped: {why}");
    }
    let n = imported.load(Ordering::Relaxed);
    if n != expected || summary.docs != expected {
        bail!("imported {n} documents but the export's manifest lists {expected}");
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "imported {n} documents from {} into index {} on {} in {secs:.1} s ({:.0} docs/s)",
        args.export.display(),
        args.index,
        args.devices
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" + "),
        n as f64 / secs.max(1e-9)
    );
    drop(sinks);
    drop(api);
    match Arc::try_unwrap(store) {
        Ok(store) => drop(store),
        Err(_) => log::warn!("the store is still referenced at exit"),
    }
    Ok(())
}
