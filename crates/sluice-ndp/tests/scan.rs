//! SCAN with predicate, projection and limit against a host-side reference
//! that pulls every pair out and parses it whole; result batches and their
//! encoding; bad input.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;

use serde_json::{json, Value};
use sluice_ndp::expr::Path;
use sluice_ndp::papers::{self};
use sluice_ndp::scan::{self, Projection, ResultBatch, ScanError, ScanSpec, BATCH_ALIGN_BYTES};
use sluice_ndp::{parse, FieldPredicate};
use sluice_store::{Store, ValueFormat};
use std::ops::Bound;

fn paper_store(papers: u64) -> (Store, u32) {
    let store = common::paper_store(papers, 11);
    let ks = papers::keyspaces(&store).unwrap().papers;
    (store, ks)
}

fn path(p: &str) -> Path {
    match parse(&format!("EXISTS {p}")).unwrap() {
        sluice_ndp::Predicate::Exists(path) => path,
        other => panic!("{other:?}"),
    }
}

fn run(store: &Store, spec: &ScanSpec<'_>) -> (Vec<ResultBatch>, scan::ScanStats) {
    let mut batches = Vec::new();
    let stats = scan::scan(store, spec, &mut |b| {
        batches.push(b);
        Ok(())
    })
    .unwrap();
    (batches, stats)
}

#[test]
fn predicate_projection_and_limit_match_the_host_side_reference() {
    let (store, ks) = paper_store(3000);
    let text = "venue IN ('VLDB', 'SIGMOD', 'FAST') AND year >= 2000 AND NOT title PREFIX 'scan'";
    let pred = FieldPredicate::compile(&parse(text).unwrap());
    let proj = Projection::new(&[
        path("title"),
        path("year"),
        path("authors[0]"),
        path("nothing"),
    ]);
    // The reference: every pair out of the store, parsed whole, filtered.
    let all = store
        .scan(
            ks,
            (Bound::Unbounded, Bound::Unbounded),
            &store.snapshot(),
            false,
            usize::MAX,
        )
        .unwrap();
    let want: Vec<(Vec<u8>, Value)> = all
        .iter()
        .filter_map(|(k, v)| {
            let d: Value = serde_json::from_slice(v).unwrap();
            let hit = ["VLDB", "SIGMOD", "FAST"].contains(&d["venue"].as_str().unwrap())
                && d["year"].as_u64().unwrap() >= 2000
                && !d["title"].as_str().unwrap().starts_with("scan");
            hit.then(|| {
                (
                    k.clone(),
                    json!({"title": d["title"], "year": d["year"], "authors[0]": d["authors"][0]}),
                )
            })
        })
        .collect();
    assert!(want.len() > 50, "{}", want.len());
    for (reverse, limit) in [(false, usize::MAX), (false, 37), (true, 50)] {
        let spec = ScanSpec {
            keyspace: ks,
            range: (Bound::Unbounded, Bound::Unbounded),
            reverse,
            predicate: Some(&pred),
            projection: Some(&proj),
            limit,
            batch_bytes: 8192,
            threads: 1,
        };
        let (batches, stats) = run(&store, &spec);
        let got: Vec<(Vec<u8>, Value)> = batches
            .iter()
            .flat_map(|b| {
                b.rows()
                    .map(|(k, v)| (k.to_vec(), serde_json::from_slice(v).unwrap()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut expect = want.clone();
        if reverse {
            expect.reverse();
        }
        expect.truncate(limit);
        assert_eq!(got, expect, "reverse {reverse} limit {limit}");
        assert_eq!(stats.rows_returned as usize, expect.len());
        if limit == usize::MAX {
            assert_eq!(stats.rows_examined, 3000);
        }
        // Batches: whole 4 KiB multiples, none past the batch size, and no
        // more handed over than the rows plus a batch of slack per batch.
        let rows_bytes: usize = got.len() * 8
            + batches
                .iter()
                .flat_map(|b| b.rows().map(|(k, v)| k.len() + v.len()).collect::<Vec<_>>())
                .sum::<usize>();
        for b in &batches {
            assert_eq!(b.as_bytes().len(), 8192.min(b.as_bytes().len()));
            assert_eq!(b.as_bytes().len() % BATCH_ALIGN_BYTES, 0);
            ResultBatch::decode(b.as_bytes().to_vec()).unwrap();
        }
        assert_eq!(stats.batches as usize, batches.len());
        assert_eq!(
            stats.bytes_returned as usize,
            batches.iter().map(|b| b.as_bytes().len()).sum::<usize>()
        );
        assert!(stats.bytes_returned as usize <= rows_bytes + batches.len() * 8192);
    }
}

#[test]
fn without_a_predicate_or_projection_a_range_comes_back_whole() {
    let (store, ks) = paper_store(500);
    let (lo, hi) = (100u64.to_be_bytes(), 200u64.to_be_bytes());
    let spec = ScanSpec {
        keyspace: ks,
        range: (Bound::Included(&lo), Bound::Excluded(&hi)),
        reverse: false,
        predicate: None,
        projection: None,
        limit: usize::MAX,
        batch_bytes: 4096,
        threads: 1,
    };
    let (batches, stats) = run(&store, &spec);
    let rows: Vec<(Vec<u8>, Vec<u8>)> = batches
        .iter()
        .flat_map(|b| {
            b.rows()
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .collect::<Vec<_>>()
        })
        .collect();
    let want = store
        .scan(
            ks,
            (Bound::Included(&lo[..]), Bound::Excluded(&hi[..])),
            &store.snapshot(),
            false,
            usize::MAX,
        )
        .unwrap();
    assert_eq!(rows, want);
    assert_eq!(stats.rows_examined, 100);
    assert!(
        batches.len() > 10,
        "4 KiB batches of ~700-byte papers: {}",
        batches.len()
    );
}

#[test]
fn bad_batch_sizes_malformed_documents_and_damaged_batches_are_errors() {
    let (store, ks) = paper_store(50);
    let mut spec = ScanSpec {
        keyspace: ks,
        range: (Bound::Unbounded, Bound::Unbounded),
        reverse: false,
        predicate: None,
        projection: None,
        limit: 10,
        batch_bytes: 5000,
        threads: 1,
    };
    let e = scan::scan(&store, &spec, &mut |_| Ok(())).unwrap_err();
    assert!(matches!(e, ScanError::BatchSize(5000)), "{e}");
    assert!(e.to_string().contains("multiple of 4096"), "{e}");
    // A document that is not JSON, where the predicate looks.
    let bad = store.create_keyspace("bad", ValueFormat::Json, "").unwrap();
    store
        .put(bad, b"doc-1", br#"{"title": "x", "year": "#)
        .unwrap();
    let pred = FieldPredicate::compile(&parse("year > 1").unwrap());
    spec.keyspace = bad;
    spec.batch_bytes = 4096;
    spec.predicate = Some(&pred);
    let e = scan::scan(&store, &spec, &mut |_| Ok(())).unwrap_err();
    assert!(
        e.to_string().contains("key doc-1") && e.to_string().contains("malformed value: JSON"),
        "{e}"
    );
    // Damaged batches.
    spec.keyspace = ks;
    spec.predicate = None;
    let (batches, _) = run(&store, &spec);
    let good = batches[0].as_bytes().to_vec();
    let mut magic = good.clone();
    magic[0] = b'X';
    assert!(ResultBatch::decode(magic)
        .unwrap_err()
        .to_string()
        .contains("magic"));
    let mut rows = good.clone();
    rows[4] += 1;
    assert!(ResultBatch::decode(rows)
        .unwrap_err()
        .to_string()
        .contains("do not add up"));
    assert!(ResultBatch::decode(good[..100].to_vec()).is_err());
}

/// Scans on worker threads hand over exactly the batches of the one-thread
/// scan — same rows, same order, same cuts — forward and reverse, with and
/// without a limit, over sub-ranges, and examine every row once.
#[test]
fn scans_on_worker_threads_hand_over_the_same_batches() {
    // A small write buffer: many tables, so the range is cut into parts.
    let store = common::store_with_buffer(64 << 10);
    papers::generate(&store, &papers::PaperConfig::demo(3000, 5), &mut |_| {}).unwrap();
    let ks = papers::keyspaces(&store).unwrap().papers;
    assert!(store.split_keys(ks, 4).len() >= 3, "the range must split");
    let pred = FieldPredicate::compile(&parse("year >= 2000 OR venue = 'VLDB'").unwrap());
    let proj = Projection::new(&[path("title"), path("year")]);
    let lo = 500u64.to_be_bytes();
    let hi = 2600u64.to_be_bytes();
    let ranges = [
        (Bound::Unbounded, Bound::Unbounded),
        (Bound::Included(&lo[..]), Bound::Excluded(&hi[..])),
    ];
    for range in ranges {
        for (reverse, limit) in [
            (false, usize::MAX),
            (true, usize::MAX),
            (false, 301),
            (true, 7),
        ] {
            let spec = |threads| ScanSpec {
                keyspace: ks,
                range,
                reverse,
                predicate: Some(&pred),
                projection: Some(&proj),
                limit,
                batch_bytes: 8192,
                threads,
            };
            let (one, one_stats) = run(&store, &spec(1));
            assert!(one_stats.rows_returned > 0);
            for threads in [2, 3, 4] {
                let (many, stats) = run(&store, &spec(threads));
                let bytes = |v: &[ResultBatch]| -> Vec<Vec<u8>> {
                    v.iter().map(|b| b.as_bytes().to_vec()).collect()
                };
                assert_eq!(
                    bytes(&many),
                    bytes(&one),
                    "{threads} threads, reverse {reverse}, limit {limit}"
                );
                assert_eq!(stats.rows_returned, one_stats.rows_returned);
                assert_eq!(stats.bytes_returned, one_stats.bytes_returned);
                if limit == usize::MAX {
                    assert_eq!(stats.rows_examined, one_stats.rows_examined);
                }
            }
        }
    }
}
