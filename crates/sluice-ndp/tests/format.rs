//! Declared value formats: schema text, typed records read in place
//! (checked against the same predicates on the records' JSON rendering),
//! and the checks that refuse a query before any work starts.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;

use common::{paper_store, store};
use proptest::prelude::*;
use sluice_ndp::aggregate::{aggregate, parse_aggregates, AggregateSpec};
use sluice_ndp::expr::Path;
use sluice_ndp::scan::{scan, Projection, ScanError, ScanSpec};
use sluice_ndp::{parse, FieldPredicate, FormatError, Layout, Predicate, Schema};
use sluice_store::{KeyspaceDef, Store, ValueFormat};
use std::ops::Bound;

const RECORD_SCHEMA: &str = "a:u32,s:str,b:i64,t:bool,c:f64,name:str,n:u64";

fn def(format: ValueFormat, schema: &str) -> KeyspaceDef {
    KeyspaceDef {
        id: 7,
        name: "things".into(),
        format,
        schema: schema.into(),
    }
}

fn record_layout() -> Layout {
    Layout::of(&def(ValueFormat::Record, RECORD_SCHEMA)).unwrap()
}

fn field(name: &str) -> Path {
    match parse(&format!("EXISTS {name}")).unwrap() {
        Predicate::Exists(p) => p,
        other => panic!("{other:?}"),
    }
}

#[test]
fn schema_text_parses_prints_and_explains_errors() {
    let s = Schema::parse("id:u64, title:str,authors:u64[],ok:bool").unwrap();
    assert_eq!(s.to_string(), "id:u64,title:str,authors:u64[],ok:bool");
    assert_eq!(s.fields().len(), 4);
    for (text, says) in [
        ("id", "is not name:type"),
        ("id:u16", "unknown type \"u16\""),
        ("9x:u32", "is not a field name"),
        ("a:u32,a:str", "declared twice"),
        ("a:list[]", "unknown type"),
    ] {
        let e = Schema::parse(text).unwrap_err().to_string();
        assert!(e.contains(says), "{text}: {e}");
    }
    let e = Layout::of(&def(ValueFormat::Record, "tags:str[]")).unwrap_err();
    assert!(e.to_string().contains("records hold scalars"), "{e}");
    let e = Layout::of(&def(ValueFormat::Raw, "")).unwrap_err();
    assert!(matches!(e, FormatError::RawValues { .. }), "{e}");
}

#[test]
fn records_encode_read_in_place_and_render_as_json() {
    let l = record_layout();
    let json = r#"{"a":7,"s":"x\"y","b":-3,"t":true,"c":2.5,"name":"Ada","n":9007199254740991}"#;
    let rec = l.encode_record(json).unwrap();
    // Fixed fields, then strings with their u32 lengths: 4+7+8+1+8+7+8.
    assert_eq!(rec.len(), 4 + (4 + 3) + 8 + 1 + 8 + (4 + 3) + 8);
    let mut out = Vec::new();
    l.to_json(&rec, &mut out).unwrap();
    let back: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        back,
        serde_json::from_str::<serde_json::Value>(json).unwrap()
    );
    let matches = |text: &str| {
        FieldPredicate::compile_for(&parse(text).unwrap(), &l)
            .unwrap()
            .matches(&rec)
            .unwrap()
    };
    assert!(matches("name = 'Ada' AND n > 9007199254740990 AND b < 0"));
    assert!(matches("c BETWEEN 2 AND 3 AND t = true AND s PREFIX 'x'"));
    assert!(!matches("a IN (1, 2, 3) OR name PREFIX 'B'"));
    assert!(matches("name CONTAINS 'da' AND NOT name CONTAINS 'A d'"));
    // Bad records are refused when written, with what was wrong.
    for (bad, says) in [
        (r#"{"a":1}"#, "field s (str) is missing"),
        (r#"[1]"#, "JSON object"),
        (
            r#"{"a":-1,"s":"","b":0,"t":true,"c":0,"name":"","n":0}"#,
            "field a is u32",
        ),
        (
            r#"{"a":1,"s":"","b":0,"t":true,"c":0,"name":"","n":0,"zz":1}"#,
            "no field \"zz\"",
        ),
    ] {
        let e = l.encode_record(bad).unwrap_err().to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
    // A cut record is reported, naming the field it ends in.
    let p = FieldPredicate::compile_for(&parse("n = 1").unwrap(), &l).unwrap();
    let e = p.matches(&rec[..rec.len() - 3]).unwrap_err().to_string();
    assert!(e.contains("ends inside field n"), "{e}");
}

#[test]
fn queries_that_do_not_fit_the_declared_format_are_refused_with_the_reason() {
    let s = paper_store(200, 3);
    let papers = Layout::of(&s.keyspace_def("papers").unwrap()).unwrap();
    let check = |text: &str| FieldPredicate::compile_for(&parse(text).unwrap(), &papers);
    assert!(check("year BETWEEN 2000 AND 2010 AND authors[0] = 3 AND venue = null").is_ok());
    for (text, says) in [
        (
            "yaer = 2010",
            "no field \"yaer\"; its fields are id (u64), title (str)",
        ),
        (
            "year = '2010'",
            "year is u32: it cannot be compared with the string \"2010\"",
        ),
        (
            "venue > 3",
            "venue is str: it cannot be compared with the number 3",
        ),
        ("year PREFIX '19'", "PREFIX needs a str field"),
        ("year CONTAINS '9'", "CONTAINS needs a str field"),
        (
            "authors = 3",
            "authors is u64[]: read one element, e.g. authors[0]",
        ),
        ("title.main = 'x'", "title is str, it has no members"),
        (
            "NOT (id IN (1, 'two'))",
            "cannot be compared with the string \"two\"",
        ),
    ] {
        let e = check(text).unwrap_err().to_string();
        assert!(e.contains(says), "{text}: {e}");
    }
    let e = Projection::new_for(&[field("title"), field("pages")], &papers).unwrap_err();
    assert!(e.to_string().contains("no field \"pages\""), "{e}");
    // Aggregates: checked before a row is read.
    let aggs = parse_aggregates("count(*), avg(title)").unwrap();
    let spec = AggregateSpec {
        keyspace: s.keyspace("papers").unwrap(),
        layout: &papers,
        range: (Bound::Unbounded, Bound::Unbounded),
        predicate: None,
        aggregates: &aggs,
        group_by: None,
        threads: 1,
        multi_valued: false,
    };
    let e = aggregate(&s, &spec).unwrap_err();
    assert!(
        matches!(&e, ScanError::Format(_))
            && e.to_string().contains("avg(title) needs a numeric field"),
        "{e}"
    );
    // Records are never null.
    let e =
        FieldPredicate::compile_for(&parse("name = null").unwrap(), &record_layout()).unwrap_err();
    assert!(e.to_string().contains("never null"), "{e}");
}

/// A record keyspace of `rows` generated records; returns the layout.
fn record_store(rows: &[serde_json::Value]) -> (Store, u32, Layout) {
    let s = store();
    let ks = s
        .create_keyspace("things", ValueFormat::Record, RECORD_SCHEMA)
        .unwrap();
    let layout = Layout::of(&s.keyspace_def("things").unwrap()).unwrap();
    for (i, r) in rows.iter().enumerate() {
        let rec = layout.encode_record(&r.to_string()).unwrap();
        s.put(ks, &(i as u32).to_be_bytes(), &rec).unwrap();
    }
    (s, ks, layout)
}

fn arb_row() -> impl Strategy<Value = serde_json::Value> {
    (
        0u32..50,
        "[a-c]{0,3}",
        -20i64..20,
        any::<bool>(),
        -5.0f64..5.0,
        "[A-C][a-b]{0,2}",
        0u64..(1 << 53),
    )
        .prop_map(|(a, s, b, t, c, name, n)| {
            serde_json::json!({"a": a, "s": s, "b": b, "t": t, "c": c, "name": name, "n": n % 40})
        })
}

fn arb_test() -> impl Strategy<Value = String> {
    let num = prop_oneof![Just("a"), Just("b"), Just("c"), Just("n")];
    let text = prop_oneof![Just("s"), Just("name")];
    let op = prop_oneof![
        Just("="),
        Just("!="),
        Just("<"),
        Just("<="),
        Just(">"),
        Just(">=")
    ];
    prop_oneof![
        (num.clone(), op.clone(), -25i64..50).prop_map(|(f, o, v)| format!("{f} {o} {v}")),
        (num.clone(), -5.0f64..5.0).prop_map(|(f, v)| format!("{f} < {v:.2}")),
        (num.clone(), -10i64..30, 0i64..20)
            .prop_map(|(f, lo, w)| format!("{f} BETWEEN {lo} AND {}", lo + w)),
        (text.clone(), op, "[A-Ca-c]{0,2}").prop_map(|(f, o, v)| format!("{f} {o} '{v}'")),
        (text.clone(), "[A-Ca-c]{0,2}").prop_map(|(f, v)| format!("{f} PREFIX '{v}'")),
        (text.clone(), "[A-Ca-c]{0,2}").prop_map(|(f, v)| format!("{f} CONTAINS '{v}'")),
        (num, prop::collection::vec(0i64..40, 1..4)).prop_map(|(f, vs)| format!(
            "{f} IN ({})",
            vs.iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        any::<bool>().prop_map(|b| format!("t = {b}")),
        Just("EXISTS name".to_string()),
    ]
}

fn arb_predicate() -> impl Strategy<Value = String> {
    arb_test().prop_recursive(3, 12, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 2..4)
                .prop_map(|v| format!("({})", v.join(" AND "))),
            prop::collection::vec(inner.clone(), 2..4)
                .prop_map(|v| format!("({})", v.join(" OR "))),
            inner.prop_map(|p| format!("NOT {p}")),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// SCAN over records with a predicate and a projection returns what
    /// the same query returns over the records rendered as JSON documents
    /// (an evaluator checked against full parsing in predicates.rs).
    #[test]
    fn record_scans_agree_with_json_scans(
        rows in prop::collection::vec(arb_row(), 0..60),
        text in arb_predicate(),
    ) {
        let (s, ks, layout) = record_store(&rows);
        let pred = parse(&text).unwrap();
        let on_records = FieldPredicate::compile_for(&pred, &layout).unwrap();
        let on_json = FieldPredicate::compile(&pred);
        let proj = Projection::new_for(&[field("name"), field("n"), field("c")], &layout).unwrap();
        let spec = ScanSpec {
            keyspace: ks,
            range: (Bound::Unbounded, Bound::Unbounded),
            reverse: false,
            predicate: Some(&on_records),
            projection: Some(&proj),
            limit: usize::MAX,
            batch_bytes: 4096,
            threads: 1,
        };
        let mut got = Vec::new();
        scan(&s, &spec, &mut |b| {
            got.extend(b.rows().map(|(k, v)| (k.to_vec(), serde_json::from_slice::<serde_json::Value>(v).unwrap())));
            Ok(())
        }).unwrap();
        let mut want = Vec::new();
        for (i, r) in rows.iter().enumerate() {
            let doc = r.to_string();
            if on_json.matches(doc.as_bytes()).unwrap() {
                want.push(((i as u32).to_be_bytes().to_vec(), serde_json::json!({"name": r["name"], "n": r["n"], "c": r["c"]})));
            }
        }
        prop_assert_eq!(got, want, "{}", text);
    }

    /// Aggregates over records equal those over the JSON rendering.
    #[test]
    fn record_aggregates_agree_with_json_aggregates(
        rows in prop::collection::vec(arb_row(), 0..60),
    ) {
        let (s, ks, layout) = record_store(&rows);
        let json_store = store();
        let jks = json_store.create_keyspace("docs", ValueFormat::Json, "").unwrap();
        for (i, r) in rows.iter().enumerate() {
            json_store.put(jks, &(i as u32).to_be_bytes(), r.to_string().as_bytes()).unwrap();
        }
        let aggs = parse_aggregates("count(*), sum(b), avg(c), min(n), max(a), count(s)").unwrap();
        let group = field("name");
        let run = |store: &Store, keyspace: u32, layout: &Layout| {
            aggregate(store, &AggregateSpec {
                keyspace,
                layout,
                range: (Bound::Unbounded, Bound::Unbounded),
                predicate: None,
                aggregates: &aggs,
                group_by: Some(&group),
                threads: 1,
                multi_valued: false,
            }).unwrap().0
        };
        let got = run(&s, ks, &layout);
        let want = run(&json_store, jks, &Layout::json_undeclared());
        prop_assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            prop_assert_eq!(&g.group, &w.group);
            for (a, b) in g.values.iter().zip(&w.values) {
                let close = match (a, b) {
                    (sluice_ndp::aggregate::AggValue::Float(x), sluice_ndp::aggregate::AggValue::Float(y)) => (x - y).abs() < 1e-9,
                    _ => a == b,
                };
                prop_assert!(close, "{:?} vs {:?}", a, b);
            }
        }
    }
}
