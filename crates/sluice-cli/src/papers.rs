//! `sluice papers`: the research-paper data set of the near-data demo.

use anyhow::Result;
use clap::Subcommand;
use sluice_ndp::demo::DemoQuery;
use sluice_ndp::papers::{self, PaperConfig};
use sluice_store::{Store, StoreConfig};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct PapersArgs {
    #[command(flatten)]
    store: crate::StoreOpenArgs,
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
    /// The near-data demo: the most central paper of a venue and year
    /// (SCAN then Betweenness Centrality), its details (GET), other papers
    /// of its venue and year and of its first author (SCAN); timed against
    /// the same done by pulling every record out to the host.
    Demo {
        #[arg(long, default_value = "VLDB")]
        venue: String,
        #[arg(long, default_value_t = 2010)]
        year: u32,
        /// BC sources to sample, for large graphs (0: exact, from every
        /// vertex).
        #[arg(long, default_value_t = 0)]
        sources: usize,
        #[arg(long, default_value_t = 5)]
        list: usize,
        /// Memory the citation graph may take, in MiB.
        #[arg(long, default_value_t = 4096)]
        memory_mib: u64,
        /// Worker threads for BC (default: one per core).
        #[arg(long, default_value_t = crate::cores())]
        threads: usize,
    },
}

pub fn run(args: &PapersArgs) -> Result<()> {
    let store = args.store.open(&args.devices, StoreConfig::default())?;
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
        PapersCommand::Demo {
            venue,
            year,
            sources,
            list,
            memory_mib,
            threads,
        } => demo(&store, venue, *year, *sources, *list, *memory_mib, *threads)?,
    }
    Ok(())
}

fn demo(
    store: &Store,
    venue: &str,
    year: u32,
    sources: usize,
    list: usize,
    memory_mib: u64,
    threads: usize,
) -> Result<()> {
    let q = DemoQuery {
        venue: venue.into(),
        year,
        sources: (sources > 0).then_some(sources),
        seed: 1,
        list,
        memory_bytes: memory_mib << 20,
        threads,
    };
    let r = sluice_ndp::demo::run(store, &q)?;
    let how = match q.sources {
        Some(k) => format!("estimated from {} sources", k.min(r.graph_vertices)),
        None => "exact".into(),
    };
    println!(
        "{} {venue} papers of {year}; betweenness {how} over {} papers and {} citations",
        r.candidates, r.graph_vertices, r.graph_edges
    );
    let Some((id, score, doc)) = &r.central else {
        println!("none of them is cited or cites: no central paper");
        return Ok(());
    };
    println!("\nmost central: paper {id}, betweenness {score:.1}\n  {doc}");
    println!("\nother {venue} papers of {year}:");
    r.same_venue_year.iter().for_each(|p| println!("  {p}"));
    println!("\nother papers of its first author:");
    r.same_author.iter().for_each(|p| println!("  {p}"));
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    println!(
        "\nin the engine: {:.1} ms, {} bytes handed over\nblock stack:   {:.1} ms, {} bytes handed over (every record pulled out and parsed on the host)",
        ms(r.ours),
        r.ours_bytes_handed_over,
        ms(r.block_stack),
        r.block_stack_bytes_handed_over
    );
    // "1 in N" stays readable where a percentage would round to 100.00.
    let fraction = r.ours_bytes_handed_over as f64 / r.block_stack_bytes_handed_over.max(1) as f64;
    println!(
        "saved: {:.2}% of the bytes (ours are 1 in {:.0} of the block stack's), the block stack took {:.1}x the time",
        100.0 * (1.0 - fraction),
        1.0 / fraction.max(1e-12),
        ms(r.block_stack) / ms(r.ours).max(1e-3)
    );
    Ok(())
}
