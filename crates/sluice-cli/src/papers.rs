//! `sluice papers`: the research-paper data set of the near-data demo.

use crate::kv::open_devices;
use anyhow::Result;
use clap::Subcommand;
use sluice_ndp::papers::{self, PaperConfig};
use sluice_store::{Store, StoreConfig};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct PapersArgs {
    /// The store's devices (format one with `sluice kv format`).
    #[arg(long = "device", default_value = "data/kv.dev")]
    devices: Vec<PathBuf>,
    #[command(subcommand)]
    command: PapersCommand,
}

#[derive(Subcommand)]
enum PapersCommand {
    /// Write a seeded paper database (papers, authors, venues, references)
    /// into the keyspaces papers, authors, venues and refs.
    Generate {
        #[arg(long, default_value_t = 100_000)]
        papers: u64,
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
}

pub fn run(args: &PapersArgs) -> Result<()> {
    let store = Store::open_on(open_devices(&args.devices)?, &StoreConfig::default())?;
    match &args.command {
        PapersCommand::Generate { papers: n, seed } => {
            let cfg = PaperConfig::demo(*n, *seed);
            let start = Instant::now();
            let mut last = Instant::now();
            let counts = papers::generate(&store, &cfg, &mut |done| {
                // A line every two seconds on long runs.
                if last.elapsed().as_secs() >= 2 {
                    last = Instant::now();
                    eprintln!("papers: {done} of {n} written");
                }
            })?;
            store.flush()?;
            println!(
                "generated {} papers, {} authors, {} venues, {} references: {} bytes of keys and values in {:.1} s",
                counts.papers,
                counts.authors,
                counts.venues,
                counts.refs,
                counts.bytes,
                start.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}
