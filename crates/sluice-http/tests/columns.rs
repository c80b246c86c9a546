//! Counts and aggregations answered from the field columns against the
//! same questions answered by scanning the documents: random documents of
//! mixed shapes (arrays, nulls, nested objects, numbers where strings are
//! expected), random writes, updates and deletes between the questions, and
//! random queries of the DSL subset.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use proptest::prelude::*;
use serde_json::{json, Value};
use sluice_http::catalog::{Catalog, Index};
use sluice_http::docs::{DocOp, Docs, Expect};
use sluice_http::{aggs, dsl, search};
use sluice_io::{Device, MemoryDevice};
use sluice_store::{Store, StoreConfig};
use std::sync::Arc;

fn small_config() -> StoreConfig {
    let mut cfg = StoreConfig {
        wal_blocks: 2048,
        write_buffer_bytes: 64 << 10,
        block_cache_bytes: 64 << 10,
        ..StoreConfig::default()
    };
    cfg.compaction.l0_trigger = 3;
    cfg.compaction.target_file_bytes = 64 << 10;
    cfg
}

fn store() -> Arc<Store> {
    let mem = Arc::new(MemoryDevice::new(4096, 16 << 10));
    Arc::new(Store::create(mem as Arc<dyn Device>, &small_config()).unwrap())
}

/// The same index seen twice: through a catalog whose columns answer, and
/// through one with no room for columns, which always scans.
struct Pair {
    store: Arc<Store>,
    docs: Docs,
    columns: Arc<Index>,
    scans: Arc<Index>,
    _catalogs: (Catalog, Catalog),
}

impl Pair {
    /// The budget of the catalog whose columns answer.
    fn columns_budget(&self) -> &Arc<sluice_http::columns::ColumnBudget> {
        self._catalogs.0.column_budget()
    }
}

fn pair() -> Pair {
    let store = store();
    let catalog = Catalog::open(store.clone()).unwrap();
    let columns = catalog.create("t", &json!({})).unwrap();
    let scanning = Catalog::open(store.clone()).unwrap();
    scanning.column_budget().set_limit_bytes(0);
    let scans = scanning.get("t").unwrap();
    Pair {
        docs: Docs::new(store.clone()),
        store,
        columns,
        scans,
        _catalogs: (catalog, scanning),
    }
}

fn venue() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!("VLDB")),
        Just(json!("SIGMOD")),
        Just(json!("ICDE")),
        Just(json!("vldb")),
        Just(json!(5)),
        Just(Value::Null),
        Just(json!(["VLDB", "ICDE"])),
        Just(json!([["SIGMOD"], null])),
        Just(json!([])),
    ]
}

fn year() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => (2000i64..2010).prop_map(|y| json!(y)),
        1 => Just(json!(2005.5)),
        1 => Just(json!("2005")),
        1 => Just(json!([2001, 2007])),
        1 => Just(json!(-1)),
        1 => Just(json!(1e300)),
        1 => Just(Value::Null),
    ]
}

fn meta() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0i64..20).prop_map(|p| json!({ "pages": p })),
        Just(json!({ "pages": null })),
        Just(json!({})),
        Just(json!(7)),
        Just(json!([{ "pages": 3 }])),
    ]
}

fn document() -> impl Strategy<Value = Value> {
    (
        proptest::option::of(venue()),
        proptest::option::of(year()),
        proptest::option::of(meta()),
        proptest::option::of(0i64..400),
    )
        .prop_map(|(v, y, m, n)| {
            let mut doc = serde_json::Map::new();
            doc.insert("title".into(), json!("a paper"));
            if let Some(v) = v {
                doc.insert("venue".into(), v);
            }
            if let Some(y) = y {
                doc.insert("year".into(), y);
            }
            if let Some(m) = m {
                doc.insert("meta".into(), m);
            }
            // Many distinct values: past the bitmaps' limit.
            if let Some(n) = n {
                doc.insert("n".into(), json!(n));
            }
            Value::Object(doc)
        })
}

#[derive(Debug, Clone)]
enum Step {
    Put(u8, Value),
    Delete(u8),
    Ask(Value, Option<Value>),
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        prop_oneof![
            Just(json!("VLDB")),
            Just(json!("vldb")),
            Just(json!("ICDE")),
            Just(json!(5))
        ]
        .prop_map(|v| json!({"term": {"venue": v}})),
        (2000i64..2010).prop_map(|y| json!({"term": {"year": y}})),
        Just(json!({"term": {"year": "2005"}})),
        Just(json!({"terms": {"venue": ["VLDB", "ICDE", 5]}})),
        (2000i64..2010).prop_map(|y| json!({"range": {"year": {"gte": y}}})),
        (2000i64..2010, 0i64..5)
            .prop_map(|(y, d)| json!({"range": {"year": {"gt": y, "lte": y + d}}})),
        (0i64..20).prop_map(|p| json!({"range": {"meta.pages": {"lt": p}}})),
        (0i64..400).prop_map(|n| json!({"range": {"n": {"lt": n}}})),
        (0i64..400).prop_map(|n| json!({"term": {"n": n}})),
        Just(json!({"exists": {"field": "venue"}})),
        Just(json!({"exists": {"field": "meta.pages"}})),
        Just(json!({"prefix": {"venue": "V"}})),
        Just(json!({"match": {"venue": "SIGMOD"}})),
        (0u8..24).prop_map(|i| json!({"ids": {"values": [format!("d{i}"), "d1"]}})),
        Just(json!({"match_all": {}})),
    ]
}

fn query() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 12, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 1..3)
                .prop_map(|m| json!({"bool": {"must": m}})),
            proptest::collection::vec(inner.clone(), 1..3)
                .prop_map(|m| json!({"bool": {"filter": m}})),
            proptest::collection::vec(inner.clone(), 1..4)
                .prop_map(|m| json!({"bool": {"should": m}})),
            (proptest::collection::vec(inner.clone(), 2..4), 1usize..3)
                .prop_map(|(m, k)| { json!({"bool": {"should": m, "minimum_should_match": k}}) }),
            inner.prop_map(|m| json!({"bool": {"must_not": [m]}})),
        ]
    })
}

fn aggregations() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        Just(None),
        Just(Some(json!({"v": {"terms": {"field": "venue", "size": 3}}}))),
        Just(Some(json!({
            "v": {"terms": {"field": "venue", "missing": "none"},
                  "aggs": {"y": {"stats": {"field": "year"}}}},
            "p": {"avg": {"field": "meta.pages"}}
        }))),
        Just(Some(
            json!({"y": {"terms": {"field": "year"}}, "c": {"value_count": {"field": "venue"}}})
        )),
        Just(Some(
            json!({"s": {"sum": {"field": "year"}}, "m": {"max": {"field": "meta.pages"}}})
        )),
        Just(Some(json!({"n": {"stats": {"field": "n"}},
            "v": {"terms": {"field": "venue"}, "aggs": {"a": {"avg": {"field": "n"}}}}}))),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u8..120, document()).prop_map(|(i, d)| Step::Put(i, d)),
        2 => (0u8..120).prop_map(Step::Delete),
        3 => (query(), aggregations()).prop_map(|(q, a)| Step::Ask(q, a)),
    ]
}

fn write(p: &Pair, op: DocOp) {
    for r in p.docs.apply(&p.columns, vec![op]) {
        r.unwrap();
    }
}

/// Numbers compared to 12 significant digits: a sum over counted
/// combinations adds in another order than the scan.
fn close(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            x == y || (x - y).abs() <= 1e-12 * x.abs().max(y.abs())
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| close(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| close(v, w)))
        }
        _ => a == b,
    }
}

fn ask(p: &Pair, q: &Value, a: &Option<Value>) -> Result<(), TestCaseError> {
    let query =
        dsl::compile(Some(q), &json!({})).map_err(|e| TestCaseError::fail(format!("{q}: {e}")))?;
    let by_columns = search::count(&p.store, std::slice::from_ref(&p.columns), &query).unwrap();
    let by_scan = search::count(&p.store, std::slice::from_ref(&p.scans), &query).unwrap();
    prop_assert_eq!(by_columns, by_scan, "count of {}", q);
    if let Some(a) = a {
        let requests = aggs::parse(a).unwrap();
        let run = |i: &Arc<Index>| aggs::run(&p.store, std::slice::from_ref(i), &query, &requests);
        match (run(&p.columns), run(&p.scans)) {
            (Ok(x), Ok(y)) => {
                prop_assert_eq!(x.total, y.total, "aggregation total of {}", q);
                prop_assert!(
                    close(&x.aggregations, &y.aggregations),
                    "{} over {}: columns {} scan {}",
                    a,
                    q,
                    x.aggregations,
                    y.aggregations
                );
            }
            (Err(x), Err(y)) => prop_assert_eq!(x.to_string(), y.to_string()),
            (x, y) => prop_assert!(false, "one failed: {:?} / {:?}", x.err(), y.err()),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn columns_answer_as_the_scan_does(steps in proptest::collection::vec(step(), 1..200)) {
        let p = pair();
        for s in &steps {
            match s {
                Step::Put(i, d) => write(&p, DocOp::Index {
                    id: Some(format!("d{i}")),
                    source: serde_json::to_vec(d).unwrap(),
                    create: false,
                    expect: Expect::default(),
                }),
                Step::Delete(i) => write(&p, DocOp::Delete { id: format!("d{i}"), expect: Expect::default() }),
                Step::Ask(q, a) => ask(&p, q, a)?,
            }
        }
        ask(&p, &json!({"match_all": {}}), &Some(json!({"v": {"terms": {"field": "venue"}}, "y": {"stats": {"field": "year"}}, "p": {"min": {"field": "meta.pages"}}})))?;
        prop_assert!(p.columns.columns.stats().answers > 0);
        prop_assert_eq!(p.scans.columns.stats().answers, 0);
    }
}

/// Writes committed while a build scans are queued and applied after it:
/// counts stay exact while a writer runs beside the builds.
#[test]
fn writes_during_a_build_are_not_missed() {
    let p = Arc::new(pair());
    for i in 0..3000 {
        write(
            &p,
            DocOp::Index {
                id: Some(format!("d{i}")),
                source: serde_json::to_vec(&json!({"v": i % 7, "w": i % 3})).unwrap(),
                create: false,
                expect: Expect::default(),
            },
        );
    }
    let writer = {
        let p = p.clone();
        std::thread::spawn(move || {
            for i in 0..3000 {
                let op = if i % 5 == 0 {
                    DocOp::Delete {
                        id: format!("d{i}"),
                        expect: Expect::default(),
                    }
                } else {
                    DocOp::Index {
                        id: Some(format!("d{}", i * 7 % 5000)),
                        source: serde_json::to_vec(&json!({"v": i % 11, "w": i % 3, "x": i}))
                            .unwrap(),
                        create: false,
                        expect: Expect::default(),
                    }
                };
                write(&p, op);
            }
        })
    };
    // Each new field rebuilds the columns while the writer runs.
    for field in ["v", "w", "x", "v"] {
        let q = dsl::compile(Some(&json!({"range": {field: {"gte": 2}}})), &json!({})).unwrap();
        search::count(&p.store, std::slice::from_ref(&p.columns), &q).unwrap();
    }
    writer.join().unwrap();
    let stats = p.columns.columns.stats();
    assert!(stats.builds >= 1, "{stats:?}");
    for field in ["v", "w", "x"] {
        for q in [
            json!({"range": {field: {"gte": 2}}}),
            json!({"bool": {"must_not": [{"term": {field: 1}}]}}),
        ] {
            let q = dsl::compile(Some(&q), &json!({})).unwrap();
            let a = search::count(&p.store, std::slice::from_ref(&p.columns), &q).unwrap();
            let b = search::count(&p.store, std::slice::from_ref(&p.scans), &q).unwrap();
            assert_eq!(a, b, "{field}");
        }
    }
    assert!(p.columns.columns.stats().answers > 0);
}

/// Columns stay within their budget: a build that would pass it is
/// dropped, writes that push them past it drop them, and the answers
/// come from the scan meanwhile, equal to what the columns gave.
#[test]
fn columns_past_their_budget_are_dropped_and_answers_stay_right() {
    let p = pair();
    for i in 0..2000 {
        write(
            &p,
            DocOp::Index {
                id: Some(format!("doc-{i:05}")),
                source: serde_json::to_vec(&json!({"v": i % 5, "u": format!("unique-{i}")}))
                    .unwrap(),
                create: false,
                expect: Expect::default(),
            },
        );
    }
    let count = |q: Value| {
        let q = dsl::compile(Some(&q), &json!({})).unwrap();
        let a = search::count(&p.store, std::slice::from_ref(&p.columns), &q).unwrap();
        let b = search::count(&p.store, std::slice::from_ref(&p.scans), &q).unwrap();
        assert_eq!(a, b);
        a
    };
    // Room for the small field, not for 2000 unique values besides.
    let budget = p.columns_budget();
    budget.set_limit_bytes(250 << 10);
    assert_eq!(count(json!({"term": {"v": 1}})), 400);
    let built = p.columns.columns.stats();
    assert_eq!((built.fields, built.builds), (1, 1), "{built:?}");
    assert!(budget.used_bytes() > 0 && budget.used_bytes() <= 250 << 10);
    assert_eq!(count(json!({"prefix": {"u": "unique-1"}})), 1111);
    let refused = p.columns.columns.stats();
    assert_eq!(
        refused.builds, 1,
        "a build past the budget is dropped: {refused:?}"
    );
    assert_eq!(
        refused.fields, 1,
        "the columns held before stay: {refused:?}"
    );
    // Writes that push the columns past the budget drop them.
    budget.set_limit_bytes(budget.used_bytes() + 1024);
    for i in 2000..2100 {
        write(
            &p,
            DocOp::Index {
                id: Some(format!("doc-{i:05}-with-a-long-id-to-take-room")),
                source: serde_json::to_vec(&json!({"v": 1})).unwrap(),
                create: false,
                expect: Expect::default(),
            },
        );
    }
    let dropped = p.columns.columns.stats();
    assert_eq!(dropped.fields, 0, "{dropped:?}");
    assert_eq!(budget.used_bytes(), 0);
    assert_eq!(count(json!({"term": {"v": 1}})), 500);
}
