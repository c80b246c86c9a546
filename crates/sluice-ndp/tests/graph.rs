//! Graph operators: Brandes against the definition of Betweenness
//! Centrality on random small graphs, sampling, BFS against one prefix scan
//! per vertex, and the memory budget.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;

use proptest::prelude::*;
use sluice_ndp::graph::{Csr, GraphError};
use sluice_ndp::papers::{self};
use sluice_store::Store;
use std::collections::{BTreeMap, VecDeque};

/// BC by its definition: all-pairs shortest path counts by BFS, then
/// Σ σ_st(v)/σ_st over s ≠ v ≠ t with d(s,v) + d(v,t) = d(s,t).
fn reference_bc(g: &Csr) -> Vec<f64> {
    let n = g.vertices();
    let mut dist = vec![vec![u32::MAX; n]; n];
    let mut sigma = vec![vec![0f64; n]; n];
    for s in 0..n {
        dist[s][s] = 0;
        sigma[s][s] = 1.0;
        let mut q = VecDeque::from([s]);
        while let Some(v) = q.pop_front() {
            for &w in g.neighbours(v as u32) {
                let w = w as usize;
                if dist[s][w] == u32::MAX {
                    dist[s][w] = dist[s][v] + 1;
                    q.push_back(w);
                }
                if dist[s][w] == dist[s][v] + 1 {
                    sigma[s][w] += sigma[s][v];
                }
            }
        }
    }
    (0..n)
        .map(|v| {
            let mut b = 0.0;
            for s in 0..n {
                for t in 0..n {
                    if s == v || t == v || s == t || dist[s][t] == u32::MAX {
                        continue;
                    }
                    if dist[s][v] != u32::MAX
                        && dist[v][t] != u32::MAX
                        && dist[s][v] + dist[v][t] == dist[s][t]
                    {
                        b += sigma[s][v] * sigma[v][t] / sigma[s][t];
                    }
                }
            }
            b
        })
        .collect()
}

fn graph(n: usize, edges: &[(u32, u32)]) -> Csr {
    let edges: Vec<(u32, u32)> = edges
        .iter()
        .map(|&(s, t)| (s % n as u32, t % n as u32))
        .filter(|(s, t)| s != t)
        .collect();
    Csr::from_edges((0..n as u64).collect(), edges)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn brandes_matches_the_definition(n in 1usize..14, edges in prop::collection::vec((any::<u32>(), any::<u32>()), 0..60)) {
        let g = graph(n, &edges);
        let got = g.betweenness(1).unwrap();
        let want = reference_bc(&g);
        for v in 0..n {
            prop_assert!((got[v] - want[v]).abs() < 1e-9, "vertex {}: {} vs {}", v, got[v], want[v]);
        }
        // Sources spread over workers: the same sums.
        let spread = g.betweenness(3).unwrap();
        for v in 0..n {
            prop_assert!((spread[v] - want[v]).abs() < 1e-9);
        }
        // Every vertex as a source: the sampled estimate is the exact value.
        let all = g.betweenness_sampled(n, 5, 1).unwrap();
        for v in 0..n {
            prop_assert!((all[v] - want[v]).abs() < 1e-9);
        }
    }
}

#[test]
fn known_values_and_sample_sizes() {
    // a -> b -> c, a -> d -> c: b and d each carry half of a's paths to c.
    let g = Csr::from_edges(vec![10, 11, 12, 13], vec![(0, 1), (1, 2), (0, 3), (3, 2)]);
    assert_eq!(g.betweenness(1).unwrap(), vec![0.0, 0.5, 0.0, 0.5]);
    assert!(matches!(
        g.betweenness_sampled(0, 1, 1),
        Err(GraphError::BadSampleSize(0))
    ));
    assert!(matches!(
        g.betweenness_sampled(5, 1, 1),
        Err(GraphError::BadSampleSize(5))
    ));
    // The estimator averages to the exact value over many draws.
    let edges: Vec<(u32, u32)> = (0..40u32)
        .flat_map(|v| [(v, (v * 7 + 1) % 40), (v, (v * 3 + 2) % 40)])
        .collect();
    let g = graph(40, &edges);
    let exact = g.betweenness(1).unwrap();
    let top = (0..40)
        .max_by(|&a, &b| exact[a].total_cmp(&exact[b]))
        .unwrap();
    let mean: f64 = (0..400)
        .map(|seed| g.betweenness_sampled(10, seed, 1).unwrap()[top])
        .sum::<f64>()
        / 400.0;
    assert!(
        (mean - exact[top]).abs() < 0.1 * exact[top],
        "mean {mean} vs exact {}",
        exact[top]
    );
}

fn paper_store(papers: u64) -> Store {
    common::paper_store(papers, 21)
}

#[test]
fn one_scan_builds_the_graph_bfs_agrees_with_a_scan_per_vertex() {
    let s = paper_store(1500);
    let refs = papers::keyspaces(&s).unwrap().refs;
    let g = Csr::build(&s, refs, 64 << 20, &mut |_, _| true).unwrap();
    let all = s
        .scan(
            refs,
            (std::ops::Bound::Unbounded, std::ops::Bound::Unbounded),
            &s.snapshot(),
            false,
            usize::MAX,
        )
        .unwrap();
    assert_eq!(g.edges(), all.len());
    // Reference BFS: the neighbours of each vertex by a prefix scan.
    let start = 1400u64;
    let mut want: BTreeMap<u64, u32> = BTreeMap::from([(start, 0)]);
    let mut frontier = vec![start];
    for depth in 1..=3u32 {
        let mut next = Vec::new();
        for v in frontier {
            for (k, _) in s
                .scan_prefix(refs, &v.to_be_bytes(), &s.snapshot(), usize::MAX)
                .unwrap()
            {
                let t = u64::from_be_bytes(k[8..].try_into().unwrap());
                if let std::collections::btree_map::Entry::Vacant(e) = want.entry(t) {
                    e.insert(depth);
                    next.push(t);
                }
            }
        }
        frontier = next;
    }
    let got: BTreeMap<u64, u32> = g
        .bfs(g.vertex(start).unwrap(), 3)
        .into_iter()
        .map(|(v, d)| (g.ids[v as usize], d))
        .collect();
    assert_eq!(got, want);
    assert!(got.len() > 20, "{}", got.len());
    // A subgraph: only citations between papers 1000 and up.
    let sub = Csr::build(&s, refs, 64 << 20, &mut |a, b| a >= 1000 && b >= 1000).unwrap();
    assert!(sub.ids.iter().all(|&id| id >= 1000));
    assert!(sub.edges() < g.edges());
    assert!(matches!(
        g.vertex(999_999),
        Err(GraphError::UnknownVertex(999_999))
    ));
}

#[test]
fn a_graph_past_the_memory_budget_is_refused() {
    let s = paper_store(500);
    let refs = papers::keyspaces(&s).unwrap().refs;
    let e = Csr::build(&s, refs, 4096, &mut |_, _| true).unwrap_err();
    assert!(
        matches!(
            e,
            GraphError::TooLarge {
                budget_bytes: 4096,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("raise the budget"), "{e}");
    let papers_ks = papers::keyspaces(&s).unwrap().papers;
    let e = Csr::build(&s, papers_ks, 1 << 30, &mut |_, _| true).unwrap_err();
    assert!(e.to_string().contains("edge key of 8 bytes"), "{e}");
}

/// SCAN feeding BC: the matching set stays in the engine and the subgraph
/// among it gives the same BC as one built from a host-side filter.
#[test]
fn a_predicate_selects_the_subgraph_bc_runs_on() {
    use sluice_ndp::graph::matching_ids;
    use sluice_ndp::{parse, FieldPredicate};
    let s = paper_store(2000);
    let ks = papers::keyspaces(&s).unwrap();
    let pred = FieldPredicate::compile(
        &parse("venue IN ('VLDB', 'SIGMOD', 'ICDE', 'FAST') AND year >= 2000").unwrap(),
    );
    let keep = matching_ids(&s, ks.papers, &pred).unwrap();
    let snap = s.snapshot();
    let all = |k| {
        s.scan(
            k,
            (std::ops::Bound::Unbounded, std::ops::Bound::Unbounded),
            &snap,
            false,
            usize::MAX,
        )
        .unwrap()
    };
    let want: std::collections::HashSet<u64> = all(ks.papers)
        .into_iter()
        .filter_map(|(k, v)| {
            let d: serde_json::Value = serde_json::from_slice(&v).unwrap();
            let hit = ["VLDB", "SIGMOD", "ICDE", "FAST"].contains(&d["venue"].as_str().unwrap())
                && d["year"].as_u64().unwrap() >= 2000;
            hit.then(|| u64::from_be_bytes(k[..].try_into().unwrap()))
        })
        .collect();
    assert_eq!(keep, want);
    let sub = Csr::build(&s, ks.refs, 64 << 20, &mut |a, b| {
        keep.contains(&a) && keep.contains(&b)
    })
    .unwrap();
    // Reference: the same edges filtered on the host, numbered the same way.
    let mut ids = Vec::new();
    let mut index = std::collections::HashMap::new();
    let mut edges = Vec::new();
    for (k, _) in all(ks.refs) {
        let a = u64::from_be_bytes(k[..8].try_into().unwrap());
        let b = u64::from_be_bytes(k[8..].try_into().unwrap());
        if want.contains(&a) && want.contains(&b) {
            let mut num = |id: u64| {
                *index.entry(id).or_insert_with(|| {
                    ids.push(id);
                    (ids.len() - 1) as u32
                })
            };
            let e = (num(a), num(b));
            edges.push(e);
        }
    }
    let host = Csr::from_edges(ids, edges);
    assert_eq!(sub, host);
    assert!(sub.edges() > 10, "{}", sub.edges());
    let (got, want) = (sub.betweenness(2).unwrap(), reference_bc(&host));
    assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-9));
    assert!(got.iter().any(|&b| b > 0.0));
}

/// networkx (Python) computes BC of the same fixed graph — the citations
/// among 400 papers of seed 21 — and agrees on every vertex.
/// scripts/setup installs networkx; without it this test fails saying so.
#[test]
fn networkx_agrees_on_a_fixed_graph() {
    let store = paper_store(400);
    let refs = papers::keyspaces(&store).unwrap().refs;
    let g = Csr::build(&store, refs, 64 << 20, &mut |_, _| true).unwrap();
    assert!(
        g.vertices() > 300 && g.edges() > 2000,
        "{} {}",
        g.vertices(),
        g.edges()
    );
    let ours = g.betweenness(2).unwrap();
    let mut edges = String::new();
    for v in 0..g.vertices() as u32 {
        for &t in g.neighbours(v) {
            edges.push_str(&format!("{} {}\n", g.ids[v as usize], g.ids[t as usize]));
        }
    }
    let script = "import sys, json, networkx as nx\n\
                  g = nx.DiGraph()\n\
                  g.add_edges_from(tuple(map(int, l.split())) for l in sys.stdin if l.strip())\n\
                  print(json.dumps({str(k): v for k, v in nx.betweenness_centrality(g, normalized=False).items()}))";
    let mut child = std::process::Command::new("python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 is needed for this test (scripts/setup installs it with networkx)");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(edges.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "networkx failed (scripts/setup installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: BTreeMap<String, f64> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(theirs.len(), g.vertices());
    for (v, score) in ours.iter().enumerate() {
        let want = theirs[&g.ids[v].to_string()];
        assert!(
            (score - want).abs() <= 1e-9 * want.abs().max(1.0),
            "paper {}: ours {score}, networkx {want}",
            g.ids[v]
        );
    }
    assert!(
        ours.iter().any(|&s| s > 1.0),
        "a graph with paths through vertices"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// The builder numbers vertices in the order first seen whether ids are
    /// looked up in its direct table or (once a large id comes) hashed.
    #[test]
    fn the_builder_numbers_small_and_large_ids_alike(
        edges in prop::collection::vec(
            (prop_oneof![0u64..300, 1u64 << 20..1u64 << 21, any::<u64>()],
             prop_oneof![0u64..300, any::<u64>()]),
            0..200),
    ) {
        let mut builder = sluice_ndp::graph::CsrBuilder::default();
        let mut index = std::collections::HashMap::new();
        let mut ids = Vec::new();
        let mut dense = Vec::new();
        for &(s, t) in &edges {
            builder.add(s, t);
            let mut number = |id: u64| *index.entry(id).or_insert_with(|| { ids.push(id); ids.len() as u32 - 1 });
            let e = (number(s), number(t));
            dense.push(e);
        }
        prop_assert_eq!(builder.finish(), Csr::from_edges(ids, dense));
    }
}

proptest! {
    /// Each row holds its source's targets sorted, each once.
    #[test]
    fn rows_hold_each_sources_targets_sorted_once(
        n in 1usize..30,
        edges in prop::collection::vec((any::<u32>(), any::<u32>()), 0..200),
    ) {
        let edges: Vec<(u32, u32)> = edges.iter().map(|&(s, t)| (s % n as u32, t % n as u32)).collect();
        let g = Csr::from_edges((0..n as u64).collect(), edges.clone());
        let mut total = 0;
        for v in 0..n as u32 {
            let want: std::collections::BTreeSet<u32> =
                edges.iter().filter(|e| e.0 == v).map(|e| e.1).collect();
            prop_assert_eq!(g.neighbours(v).to_vec(), want.into_iter().collect::<Vec<_>>());
            total += g.neighbours(v).len();
        }
        prop_assert_eq!(total, g.edges());
    }
}
