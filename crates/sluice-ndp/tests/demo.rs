//! The demo scenario: the paper it picks is the most central of the
//! venue's papers of the year, its listings hold what they say, and the
//! engine hands over far fewer bytes than pulling every record out.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;

use serde_json::Value;
use sluice_ndp::demo::{self, DemoQuery};
use sluice_ndp::graph::Csr;
use sluice_ndp::papers::{self};
use std::ops::Bound;

#[test]
fn the_demo_finds_the_most_central_paper_and_lists_its_neighbourhood() {
    let s = common::paper_store(3000, 42);
    let q = DemoQuery {
        venue: "SIGMOD".into(),
        year: 2008,
        sources: None,
        seed: 1,
        list: 4,
        memory_bytes: 64 << 20,
        threads: 2,
    };
    let r = demo::run(&s, &q).unwrap();
    // Independently: candidates by full parse, BC over the whole graph.
    let ks = papers::keyspaces(&s).unwrap();
    let docs: Vec<Value> = s
        .scan(
            ks.papers,
            (Bound::Unbounded, Bound::Unbounded),
            &s.snapshot(),
            false,
            usize::MAX,
        )
        .unwrap()
        .into_iter()
        .map(|(_, v)| serde_json::from_slice(&v).unwrap())
        .collect();
    let candidates: Vec<u64> = docs
        .iter()
        .filter(|d| d["venue"] == "SIGMOD" && d["year"] == 2008)
        .map(|d| d["id"].as_u64().unwrap())
        .collect();
    assert_eq!(r.candidates, candidates.len());
    assert!(candidates.len() >= 2, "{}", candidates.len());
    let g = Csr::build(&s, ks.refs, 64 << 20, &mut |_, _| true).unwrap();
    let bc = g.betweenness(1).unwrap();
    let best = candidates
        .iter()
        .filter_map(|id| g.ids.iter().position(|x| x == id).map(|v| bc[v]))
        .fold(f64::MIN, f64::max);
    let (id, score, doc) = r.central.clone().expect("a central paper");
    assert_eq!(score, best);
    let doc: Value = serde_json::from_str(&doc).unwrap();
    assert_eq!(doc["id"], id);
    assert!(r.same_venue_year.len() <= 4 && !r.same_venue_year.is_empty());
    for p in &r.same_venue_year {
        let p: Value = serde_json::from_str(p).unwrap();
        assert_eq!(
            (p["venue"].as_str(), p["year"].as_u64()),
            (Some("SIGMOD"), Some(2008))
        );
        assert_ne!(p["id"], id);
    }
    let author = &doc["authors"][0];
    for p in &r.same_author {
        let p: Value = serde_json::from_str(p).unwrap();
        let full = docs.iter().find(|d| d["id"] == p["id"]).unwrap();
        assert_eq!(&full["authors"][0], author);
    }
    assert!(r.ours_bytes_handed_over * 100 < r.block_stack_bytes_handed_over);
}

/// The demo's question for VLDB 2010, 64 BC sources, one thread.
fn vldb_2010() -> DemoQuery {
    DemoQuery {
        venue: "VLDB".into(),
        year: 2010,
        sources: Some(64),
        seed: 1,
        list: 4,
        memory_bytes: 64 << 20,
        threads: 1,
    }
}

#[test]
fn a_store_without_the_papers_is_told_so_and_left_as_it_was() {
    let s = common::store();
    let before: Vec<String> = s.keyspaces().into_iter().map(|d| d.name).collect();
    let q = vldb_2010();
    let e = demo::run(&s, &q).err().unwrap();
    assert!(matches!(e, demo::DemoError::NoPapers), "{e}");
    assert!(
        e.to_string()
            .contains("sluice papers --device DEVICE generate"),
        "{e}"
    );
    assert!(papers::find_keyspaces(&s).unwrap().is_none());
    let after: Vec<String> = s.keyspaces().into_iter().map(|d| d.name).collect();
    assert_eq!(before, after, "a demo run made keyspaces");
}

#[test]
fn a_venue_with_no_citations_has_no_central_paper() {
    // Papers without references: the citation graph is empty.
    let s = common::paper_store(50, 42);
    assert!(papers::find_keyspaces(&s).unwrap().is_some());
    s.drop_keyspace("refs").unwrap();
    s.create_keyspace("refs", sluice_store::ValueFormat::Raw, "")
        .unwrap();
    let q = vldb_2010();
    let r = demo::run(&s, &q).unwrap();
    assert_eq!((r.graph_vertices, r.graph_edges), (0, 0));
    assert!(r.central.is_none());
}
