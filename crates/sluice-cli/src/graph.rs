//! `sluice graph`: BFS and Betweenness Centrality over an edge keyspace,
//! on an adjacency built in the engine by one scan.

use anyhow::Result;
use clap::Subcommand;
use sluice_ndp::graph::{matching_ids, Csr};
use sluice_ndp::{parse, FieldPredicate, Layout};
use sluice_store::StoreConfig;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct GraphArgs {
    #[command(flatten)]
    store: crate::StoreOpenArgs,
    #[arg(long = "device", default_value = "data/kv.dev")]
    devices: Vec<PathBuf>,
    /// Edge keyspace: keys are source id ++ target id, 8 bytes big-endian each.
    #[arg(long, default_value = "refs")]
    keyspace: String,
    /// Memory the adjacency structure may take, in MiB.
    #[arg(long, default_value_t = 4096)]
    memory_mib: u64,
    /// Keep only vertices whose document (in --vertices) matches this
    /// predicate, and the edges among them: a SCAN feeding the graph
    /// operator, the matching set kept in the engine.
    #[arg(long = "where")]
    predicate: Option<String>,
    /// Keyspace of the vertex documents --where reads.
    #[arg(long, default_value = "papers")]
    vertices: String,
    /// Worker threads for BC (default: one per core).
    #[arg(long, default_value_t = crate::cores())]
    threads: usize,
    #[command(subcommand)]
    command: GraphCommand,
}

#[derive(Subcommand)]
enum GraphCommand {
    /// Betweenness Centrality (Brandes): exact, or estimated from --sources.
    Bc {
        /// Sample this many sources (unbiased estimate scaled by n/k).
        #[arg(long)]
        sources: Option<usize>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Print this many vertices, most central first.
        #[arg(long, default_value_t = 10)]
        top: usize,
    },
    /// Vertices reached from a vertex within a number of hops.
    Bfs {
        /// Vertex id to start from.
        #[arg(long)]
        from: u64,
        /// Hops to follow.
        #[arg(long, default_value_t = 2)]
        depth: u32,
    },
}

pub fn run(args: &GraphArgs) -> Result<()> {
    let store = args.store.open(&args.devices, StoreConfig::default())?;
    let ks = store.keyspace(&args.keyspace)?;
    let start = Instant::now();
    let g = match &args.predicate {
        Some(text) => {
            let vertices = store.keyspace_def(&args.vertices)?;
            let pred = FieldPredicate::compile_for(&parse(text)?, &Layout::of(&vertices)?)?;
            let keep = matching_ids(&store, vertices.id, &pred)?;
            eprintln!("graph: {} vertices match --where", keep.len());
            Csr::build(&store, ks, args.memory_mib << 20, &mut |s, t| {
                keep.contains(&s) && keep.contains(&t)
            })?
        }
        None => Csr::build(&store, ks, args.memory_mib << 20, &mut |_, _| true)?,
    };
    eprintln!(
        "graph: {} vertices, {} edges, built in {:.1} ms",
        g.vertices(),
        g.edges(),
        start.elapsed().as_secs_f64() * 1e3
    );
    match &args.command {
        GraphCommand::Bc { sources, seed, top } => {
            let start = Instant::now();
            let bc = match sources {
                Some(k) => g.betweenness_sampled(*k, *seed, args.threads)?,
                None => g.betweenness(args.threads)?,
            };
            let mut order: Vec<usize> = (0..bc.len()).collect();
            order.sort_by(|&a, &b| bc[b].total_cmp(&bc[a]).then(a.cmp(&b)));
            println!("id\tbetweenness");
            for &v in order.iter().take(*top) {
                println!("{}\t{:.3}", g.ids[v], bc[v]);
            }
            eprintln!(
                "betweenness: {} from {} sources in {:.1} ms",
                if sources.is_some() {
                    "estimated"
                } else {
                    "exact"
                },
                sources.unwrap_or(g.vertices()),
                start.elapsed().as_secs_f64() * 1e3
            );
        }
        GraphCommand::Bfs { from, depth } => {
            println!("id\tdepth");
            for (v, d) in g.bfs(g.vertex(*from)?, *depth) {
                println!("{}\t{d}", g.ids[v as usize]);
            }
        }
    }
    Ok(())
}
