//! The paper data set: deterministic per seed, the counts it reports,
//! references only to older existing papers with a skewed in-degree, and
//! documents the predicate evaluator reads the same as a full parser.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;

use common::store;
use sluice_ndp::papers::{self, PaperConfig, VENUES};
use sluice_ndp::{parse, FieldPredicate};
use sluice_store::Store;
use std::collections::HashMap;
use std::ops::Bound;

fn all(store: &Store, ks: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
    store
        .scan(
            ks,
            (Bound::Unbounded, Bound::Unbounded),
            &store.snapshot(),
            false,
            usize::MAX,
        )
        .unwrap()
}

#[test]
fn the_same_seed_gives_the_same_database_and_counts_are_right() {
    let cfg = PaperConfig::demo(3000, 42);
    let (a, b, c) = (store(), store(), store());
    let mut calls = 0;
    let counts = papers::generate(&a, &cfg, &mut |_| calls += 1).unwrap();
    assert!(calls > 1, "progress was reported {calls} times");
    papers::generate(&b, &cfg, &mut |_| {}).unwrap();
    papers::generate(
        &c,
        &PaperConfig {
            seed: 43,
            ..cfg.clone()
        },
        &mut |_| {},
    )
    .unwrap();
    let ks = papers::keyspaces(&a).unwrap();
    for k in [ks.papers, ks.authors, ks.venues, ks.refs] {
        assert_eq!(all(&a, k), all(&b, k));
    }
    assert_ne!(all(&a, ks.papers), all(&c, ks.papers));
    assert_eq!(counts.papers, 3000);
    assert_eq!(all(&a, ks.papers).len(), 3000);
    assert_eq!(counts.authors, 750);
    assert_eq!(all(&a, ks.authors).len(), 750);
    assert_eq!(counts.venues as usize, VENUES.len());
    assert_eq!(all(&a, ks.refs).len() as u64, counts.refs);
    // About ten references per paper.
    assert!((8..=12).contains(&(counts.refs / 3000)), "{counts:?}");
}

#[test]
fn references_cite_older_papers_with_a_skewed_in_degree() {
    let s = store();
    let cfg = PaperConfig::demo(5000, 7);
    let counts = papers::generate(&s, &cfg, &mut |_| {}).unwrap();
    let ks = papers::keyspaces(&s).unwrap();
    let mut in_degree: HashMap<u64, u64> = HashMap::new();
    for (k, v) in all(&s, ks.refs) {
        assert!(v.is_empty());
        let citing = u64::from_be_bytes(k[..8].try_into().unwrap());
        let cited = u64::from_be_bytes(k[8..].try_into().unwrap());
        assert!(cited < citing && citing < 5000, "{citing} cites {cited}");
        *in_degree.entry(cited).or_default() += 1;
    }
    let mut degrees: Vec<u64> = in_degree.values().copied().collect();
    degrees.sort_unstable_by(|a, b| b.cmp(a));
    let top: u64 = degrees.iter().take(50).sum();
    // The top 1% of papers collect over a tenth of all citations.
    assert!(
        top * 10 > counts.refs,
        "top 50 papers: {top} of {}",
        counts.refs
    );
    let mean = counts.refs as f64 / 5000.0;
    assert!(
        degrees[0] as f64 > 20.0 * mean,
        "most cited {} vs mean {mean}",
        degrees[0]
    );
}

#[test]
fn papers_are_json_that_predicates_read_like_a_full_parser() {
    let s = store();
    let cfg = PaperConfig::demo(2000, 3);
    papers::generate(&s, &cfg, &mut |_| {}).unwrap();
    let ks = papers::keyspaces(&s).unwrap();
    let pred = FieldPredicate::compile(
        &parse("venue IN ('VLDB', 'SIGMOD') AND year BETWEEN 2000 AND 2010 AND authors[1] >= 0")
            .unwrap(),
    );
    let (mut ours, mut theirs) = (0, 0);
    for (k, v) in all(&s, ks.papers) {
        let doc: serde_json::Value = serde_json::from_slice(&v).unwrap();
        let id = u64::from_be_bytes(k[..].try_into().unwrap());
        assert_eq!(doc["id"], id);
        let year = doc["year"].as_u64().unwrap();
        assert!((1990..=2024).contains(&year));
        let venue = doc["venue"].as_str().unwrap();
        assert!(VENUES.contains(&venue));
        let authors = doc["authors"].as_array().unwrap();
        assert!((1..=5).contains(&authors.len()));
        assert!(authors.iter().all(|a| a.as_u64().unwrap() < cfg.authors));
        assert!(doc["title"].as_str().unwrap().split(' ').count() >= 3);
        assert!(doc["abstract"].as_str().unwrap().len() > 100);
        ours += u32::from(pred.matches(&v).unwrap());
        theirs += u32::from(
            ["VLDB", "SIGMOD"].contains(&venue)
                && (2000..=2010).contains(&year)
                && authors.len() > 1,
        );
    }
    assert_eq!(ours, theirs);
    assert!(ours > 0);
}
