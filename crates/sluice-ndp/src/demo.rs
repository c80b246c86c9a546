//! The nKV demonstration scenario on the paper data set: pick a venue and
//! a year, find the most central paper of that year (SCAN → BC), show its
//! details (GET), list other papers of the same venue and year and of the
//! same first author (SCAN). Each step runs in the engine; the same steps
//! done the "block stack" way — every record pulled out through the plain
//! iterator and parsed whole on the host — are timed beside it.

use crate::expr::{parse, Literal, Path, Predicate, Step};
use crate::graph::{Csr, CsrBuilder, GraphError};
use crate::papers::{self, id_key};
use crate::predicate::FieldPredicate;
use crate::scan::{self, Projection, ScanSpec, ScanStats};
use sluice_store::Store;
use std::collections::HashSet;
use std::ops::Bound;
use std::time::{Duration, Instant};

/// What the scenario asks.
#[derive(Debug, Clone)]
pub struct DemoQuery {
    /// The venue of the papers asked about.
    pub venue: String,
    /// Their year.
    pub year: u32,
    /// BC sources to sample (None: exact).
    pub sources: Option<usize>,
    /// Seed of the BC source sample.
    pub seed: u64,
    /// Rows of each listing.
    pub list: usize,
    /// Memory budget of the citation graph.
    pub memory_bytes: u64,
    /// Worker threads for BC (both the engine's run and the host-side one).
    pub threads: usize,
}

/// What it found, and what it cost.
#[derive(Debug, Clone)]
pub struct DemoReport {
    /// Papers of the venue and year.
    pub candidates: usize,
    /// The most central paper of the venue and year: id, BC, its JSON.
    pub central: Option<(u64, f64, String)>,
    /// Other papers of the venue and year (JSON).
    pub same_venue_year: Vec<String>,
    /// Other papers of its first author (JSON).
    pub same_author: Vec<String>,
    /// Vertices of the citation graph.
    pub graph_vertices: usize,
    /// Edges of the citation graph.
    pub graph_edges: usize,
    /// Time of the steps in the engine.
    pub ours: Duration,
    /// Bytes the engine handed over.
    pub ours_bytes_handed_over: u64,
    /// Time of the same steps the block-stack way.
    pub block_stack: Duration,
    /// Bytes the block stack moved to the host.
    pub block_stack_bytes_handed_over: u64,
}

/// What stops the demo.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// Building or running on the graph failed.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// A scan failed.
    #[error(transparent)]
    Scan(#[from] scan::ScanError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] sluice_store::StoreError),
    /// The store holds no paper data set.
    #[error(
        "this store holds no paper data set (keyspaces papers, authors, venues and refs): \
         write one with `sluice papers --device DEVICE generate`"
    )]
    NoPapers,
    /// A stored paper that is not JSON.
    #[error("a stored paper is not JSON: {0}")]
    BadPaper(String),
    /// The engine's and the host-side run's answers differ (a bug).
    #[error("the engine found paper {ours:?} most central, the host-side run {host:?}")]
    Disagree {
        /// The engine's most central paper.
        ours: Option<u64>,
        /// The host-side run's.
        host: Option<u64>,
    },
}

fn field(name: &str) -> Path {
    Path {
        steps: vec![Step::Key(name.into())],
    }
}

fn venue_year(venue: &str, year: u32) -> Predicate {
    Predicate::And(vec![
        Predicate::Cmp {
            path: field("venue"),
            op: crate::expr::CmpOp::Eq,
            value: Literal::Str(venue.into()),
        },
        Predicate::Cmp {
            path: field("year"),
            op: crate::expr::CmpOp::Eq,
            value: Literal::Int(year as i64),
        },
    ])
}

/// A key and its value.
type Pair = (Vec<u8>, Vec<u8>);

/// Runs a SCAN and returns its rows' keys and values.
fn scan_rows(
    store: &Store,
    keyspace: u32,
    pred: &Predicate,
    projection: Option<&Projection>,
    limit: usize,
    stats: &mut ScanStats,
) -> Result<Vec<Pair>, DemoError> {
    let compiled = FieldPredicate::compile(pred);
    let spec = ScanSpec {
        keyspace,
        range: (Bound::Unbounded, Bound::Unbounded),
        reverse: false,
        predicate: Some(&compiled),
        projection,
        limit,
        batch_bytes: 256 << 10,
        threads: 1,
    };
    let mut rows = Vec::new();
    let s = scan::scan(store, &spec, &mut |b| {
        rows.extend(b.rows().map(|(k, v)| (k.to_vec(), v.to_vec())));
        Ok(())
    })?;
    stats.bytes_returned += s.bytes_returned;
    Ok(rows)
}

fn paper_id(key: &[u8]) -> u64 {
    u64::from_be_bytes(key.try_into().unwrap_or([0; 8]))
}

/// Runs the scenario in the engine, then the block-stack way, and checks
/// that both found the same.
#[expect(
    clippy::expect_used,
    reason = "the predicate is built from a number: always valid"
)]
pub fn run(store: &Store, q: &DemoQuery) -> Result<DemoReport, DemoError> {
    // Looked up, never made: a demo run on another store leaves it as it was.
    let ks = papers::find_keyspaces(store)?.ok_or(DemoError::NoPapers)?;
    let start = Instant::now();
    let mut stats = ScanStats::default();
    // SCAN: the venue's papers of the year, ids only.
    let only_id = Projection::new(&[field("id")]);
    let candidates: HashSet<u64> = scan_rows(
        store,
        ks.papers,
        &venue_year(&q.venue, q.year),
        Some(&only_id),
        usize::MAX,
        &mut stats,
    )?
    .iter()
    .map(|(k, _)| paper_id(k))
    .collect();
    // BC over the citation graph, kept in the engine; the most central
    // candidate comes out.
    let g = Csr::build(store, ks.refs, q.memory_bytes, &mut |_, _| true)?;
    let best = g.top_among(&betweenness(&g, q)?, &candidates);
    let mut report = DemoReport {
        candidates: candidates.len(),
        central: None,
        same_venue_year: Vec::new(),
        same_author: Vec::new(),
        graph_vertices: g.vertices(),
        graph_edges: g.edges(),
        ours: Duration::ZERO,
        ours_bytes_handed_over: 0,
        block_stack: Duration::ZERO,
        block_stack_bytes_handed_over: 0,
    };
    if let Some((id, score)) = best {
        // GET its details.
        let doc = store.get(ks.papers, &id_key(id))?.unwrap_or_default();
        stats.bytes_returned += doc.len() as u64;
        let doc = String::from_utf8_lossy(&doc).into_owned();
        let first_author =
            sonic_rs::get_from_slice(doc.as_bytes(), sonic_rs::pointer!["authors", 0])
                .ok()
                .and_then(|v| v.as_raw_str().parse::<i64>().ok());
        report.central = Some((id, score, doc));
        // SCAN: others of the venue and year, and of the first author.
        let title = Projection::new(&[field("id"), field("title"), field("venue"), field("year")]);
        let not_it = |p: Predicate| {
            Predicate::And(vec![
                p,
                Predicate::Cmp {
                    path: field("id"),
                    op: crate::expr::CmpOp::Ne,
                    value: Literal::Int(id as i64),
                },
            ])
        };
        let rows = scan_rows(
            store,
            ks.papers,
            &not_it(venue_year(&q.venue, q.year)),
            Some(&title),
            q.list,
            &mut stats,
        )?;
        report.same_venue_year = rows
            .into_iter()
            .map(|(_, v)| String::from_utf8_lossy(&v).into_owned())
            .collect();
        if let Some(author) = first_author {
            let by = parse(&format!("authors[0] = {author}")).expect("a valid predicate");
            let rows = scan_rows(
                store,
                ks.papers,
                &not_it(by),
                Some(&title),
                q.list,
                &mut stats,
            )?;
            report.same_author = rows
                .into_iter()
                .map(|(_, v)| String::from_utf8_lossy(&v).into_owned())
                .collect();
        }
    }
    report.ours = start.elapsed();
    report.ours_bytes_handed_over = stats.bytes_returned;
    block_stack(store, q, &mut report)?;
    Ok(report)
}

/// Betweenness as the query asks: exact or sampled.
fn betweenness(g: &Csr, q: &DemoQuery) -> Result<Vec<f64>, GraphError> {
    if g.vertices() == 0 {
        // No citation at all: nothing is central (and nothing to sample).
        return Ok(Vec::new());
    }
    match q.sources {
        Some(k) => g.betweenness_sampled(k.min(g.vertices()).max(1), q.seed, q.threads),
        None => g.betweenness(q.threads),
    }
}

/// Pulls every pair of `keyspace` out, counting its bytes into `bytes`.
fn pull_all(
    store: &Store,
    keyspace: u32,
    snap: &sluice_store::Snapshot,
    bytes: &mut u64,
    each: &mut dyn FnMut(Vec<u8>, Vec<u8>) -> Result<(), DemoError>,
) -> Result<(), DemoError> {
    for row in store.iter(keyspace, (Bound::Unbounded, Bound::Unbounded), snap, false) {
        let (k, v) = row?;
        *bytes += (k.len() + v.len()) as u64;
        each(k, v)?;
    }
    Ok(())
}

fn parse_whole(v: &[u8]) -> Result<serde_json::Value, DemoError> {
    serde_json::from_slice(v).map_err(|e| DemoError::BadPaper(e.to_string()))
}

/// The same steps with every record pulled out of the store and parsed
/// whole on the host (the graph fetched edge by edge likewise).
fn block_stack(store: &Store, q: &DemoQuery, report: &mut DemoReport) -> Result<(), DemoError> {
    let ks = papers::find_keyspaces(store)?.ok_or(DemoError::NoPapers)?;
    let start = Instant::now();
    let snap = store.snapshot();
    let mut bytes = 0u64;
    let mut candidates = HashSet::new();
    pull_all(store, ks.papers, &snap, &mut bytes, &mut |k, v| {
        let d = parse_whole(&v)?;
        if d["venue"] == q.venue.as_str() && d["year"] == q.year {
            candidates.insert(paper_id(&k));
        }
        Ok(())
    })?;
    let mut builder = CsrBuilder::default();
    pull_all(store, ks.refs, &snap, &mut bytes, &mut |k, _| {
        builder.add(paper_id(&k[..8]), paper_id(&k[8..]));
        Ok(())
    })?;
    let g = builder.finish();
    let best = g.top_among(&betweenness(&g, q)?, &candidates).map(|b| b.0);
    // The listings would pull every paper out again; one more full pass.
    pull_all(store, ks.papers, &snap, &mut bytes, &mut |_, v| {
        parse_whole(&v).map(|_| ())
    })?;
    report.block_stack = start.elapsed();
    report.block_stack_bytes_handed_over = bytes;
    let ours = report.central.as_ref().map(|c| c.0);
    if best != ours {
        return Err(DemoError::Disagree { ours, host: best });
    }
    Ok(())
}
