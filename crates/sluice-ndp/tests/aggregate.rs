//! Aggregates with and without GROUP BY against a reference that parses
//! every document whole; the aggregate list's parser and its errors.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

mod common;

use common::store;
use serde_json::Value;
use sluice_ndp::aggregate::{self, parse_aggregates, AggValue, AggregateSpec, Func};
use sluice_ndp::expr::Path;
use sluice_ndp::papers::{self, PaperConfig};
use sluice_ndp::{parse, FieldPredicate, Layout, Predicate};
use sluice_store::ValueFormat;
use std::collections::BTreeMap;
use std::ops::Bound;

/// The path of a field, as a GROUP BY names it.
fn field(name: &str) -> Path {
    match parse(&format!("EXISTS {name}")).unwrap() {
        Predicate::Exists(p) => p,
        _ => unreachable!("EXISTS parses to Exists"),
    }
}

fn as_f64(v: &AggValue) -> Option<f64> {
    match v {
        AggValue::Int(i) => Some(*i as f64),
        AggValue::Float(x) => Some(*x),
        AggValue::Null => None,
    }
}

#[test]
fn grouped_aggregates_match_a_full_parse_reference() {
    let s = store();
    papers::generate(&s, &PaperConfig::demo(4000, 9), &mut |_| {}).unwrap();
    let ks = papers::keyspaces(&s).unwrap().papers;
    let aggs = parse_aggregates(
        "count(*), sum(year), avg(year), min(year), max(authors[2]), count(authors[3])",
    )
    .unwrap();
    let pred = FieldPredicate::compile(&parse("year >= 2000 AND NOT venue PREFIX 'S'").unwrap());
    let venue = field("venue");
    let spec = AggregateSpec {
        layout: &Layout::json_undeclared(),
        keyspace: ks,
        range: (Bound::Unbounded, Bound::Unbounded),
        predicate: Some(&pred),
        aggregates: &aggs,
        group_by: Some(&venue),
        threads: 1,
        multi_valued: false,
    };
    let (rows, stats) = aggregate::aggregate(&s, &spec).unwrap();
    assert_eq!(stats.rows_examined, 4000);
    // Reference: (count, sum year, min year, max authors[2], count authors[3]) per venue.
    let mut want: BTreeMap<String, (u64, u64, u64, Option<u64>, u64)> = BTreeMap::new();
    for (_, v) in s
        .scan(
            ks,
            (Bound::Unbounded, Bound::Unbounded),
            &s.snapshot(),
            false,
            usize::MAX,
        )
        .unwrap()
    {
        let d: Value = serde_json::from_slice(&v).unwrap();
        let (year, venue) = (d["year"].as_u64().unwrap(), d["venue"].as_str().unwrap());
        if year < 2000 || venue.starts_with('S') {
            continue;
        }
        let e = want
            .entry(format!("\"{venue}\""))
            .or_insert((0, 0, u64::MAX, None, 0));
        e.0 += 1;
        e.1 += year;
        e.2 = e.2.min(year);
        if let Some(a) = d["authors"].get(2).and_then(Value::as_u64) {
            e.3 = Some(e.3.map_or(a, |m: u64| m.max(a)));
        }
        e.4 += u64::from(d["authors"].get(3).is_some());
    }
    assert_eq!(rows.len(), want.len());
    assert_eq!(stats.rows_returned, want.values().map(|w| w.0).sum::<u64>());
    for (row, (group, w)) in rows.iter().zip(&want) {
        assert_eq!(row.group.as_deref(), Some(group.as_str()));
        assert_eq!(row.values[0], AggValue::Int(w.0 as i128));
        assert_eq!(
            row.values[1],
            AggValue::Int(w.1 as i128),
            "exact integer sum"
        );
        assert!((as_f64(&row.values[2]).unwrap() - w.1 as f64 / w.0 as f64).abs() < 1e-9);
        assert_eq!(as_f64(&row.values[3]), Some(w.2 as f64));
        assert_eq!(as_f64(&row.values[4]), w.3.map(|m| m as f64));
        assert_eq!(row.values[5], AggValue::Int(w.4 as i128));
    }
}

#[test]
fn mixed_types_missing_fields_and_no_group() {
    let s = store();
    let ks = s.create_keyspace("docs", ValueFormat::Json, "").unwrap();
    for (k, v) in [
        ("a", r#"{"x": 1, "g": "p"}"#),
        ("b", r#"{"x": 2.5, "g": "p"}"#),
        ("c", r#"{"x": "three", "g": "q"}"#),
        ("d", r#"{"x": null}"#),
        ("e", r#"{"y": 7, "g": null}"#),
    ] {
        s.put(ks, k.as_bytes(), v.as_bytes()).unwrap();
    }
    let aggs = parse_aggregates("count(*), count(x), sum(x), avg(x), min(x), max(x), sum(nothing)")
        .unwrap();
    let spec = AggregateSpec {
        layout: &Layout::json_undeclared(),
        keyspace: ks,
        range: (Bound::Unbounded, Bound::Unbounded),
        predicate: None,
        aggregates: &aggs,
        group_by: None,
        threads: 1,
        multi_valued: false,
    };
    let (rows, _) = aggregate::aggregate(&s, &spec).unwrap();
    assert_eq!(rows.len(), 1);
    let v = &rows[0].values;
    assert_eq!(v[0], AggValue::Int(5));
    assert_eq!(v[1], AggValue::Int(3), "x present and not null in a, b, c");
    assert_eq!(v[2], AggValue::Float(3.5), "a float makes the sum a float");
    assert_eq!(v[3], AggValue::Float(1.75));
    assert_eq!(v[4], AggValue::Int(1));
    assert_eq!(v[5], AggValue::Float(2.5));
    assert_eq!(v[6], AggValue::Null, "no numbers: null");
    // Grouped: missing and null group fields share the group None.
    let g = field("g");
    let count = parse_aggregates("count(*)").unwrap();
    let spec = AggregateSpec {
        layout: &Layout::json_undeclared(),
        group_by: Some(&g),
        aggregates: &count,
        ..spec
    };
    let (rows, _) = aggregate::aggregate(&s, &spec).unwrap();
    let got: Vec<(Option<String>, AggValue)> = rows
        .into_iter()
        .map(|r| (r.group, r.values[0].clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (None, AggValue::Int(2)),
            (Some("\"p\"".into()), AggValue::Int(2)),
            (Some("\"q\"".into()), AggValue::Int(1)),
        ]
    );
}

#[test]
fn aggregate_lists_parse_and_bad_ones_say_where() {
    let a = parse_aggregates(" COUNT(*) ,avg( meta.year ),max(authors[0])").unwrap();
    assert_eq!(a.len(), 3);
    assert_eq!(a[0].func, Func::Count);
    assert!(a[0].path.is_none());
    assert_eq!(a[1].to_string(), "avg(meta.year)");
    assert_eq!(a[2].to_string(), "max(authors[0])");
    for (text, column, needle) in [
        ("count(*), median(x)", 11, "unknown aggregate \"median\""),
        ("sum(*)", 5, "only count takes *"),
        ("count(x", 8, "expected \")\""),
        ("year", 1, "expected name(field)"),
        ("avg(a b)", 5, "\"a b\" is not a field path"),
    ] {
        let e = parse_aggregates(text).unwrap_err();
        assert_eq!(e.column, column, "{text}: {e}");
        assert!(e.to_string().contains(needle), "{text}: {e}");
    }
}

/// Worker threads over disjoint parts of the keyspace give the same groups
/// and counts as one thread.
#[test]
fn parallel_parts_add_up_to_the_single_thread_result() {
    let s = common::store_with_buffer(256 << 10);
    papers::generate(&s, &PaperConfig::demo(4000, 17), &mut |_| {}).unwrap();
    let ks = papers::keyspaces(&s).unwrap().papers;
    assert!(s.split_keys(ks, 4).len() >= 2, "{:?}", s.split_keys(ks, 4));
    let aggs = parse_aggregates("count(*), sum(year), min(authors[0]), max(authors[0]), avg(year)")
        .unwrap();
    let venue = field("venue");
    let (lo, hi) = (100u64.to_be_bytes(), 3900u64.to_be_bytes());
    let run = |threads| {
        let spec = AggregateSpec {
            layout: &Layout::json_undeclared(),
            keyspace: ks,
            range: (Bound::Excluded(&lo[..]), Bound::Included(&hi[..])),
            predicate: None,
            aggregates: &aggs,
            group_by: Some(&venue),
            threads,
            multi_valued: false,
        };
        aggregate::aggregate(&s, &spec).unwrap()
    };
    let (one, one_stats) = run(1);
    for threads in [2, 4, 7] {
        let (many, stats) = run(threads);
        assert_eq!(stats.rows_examined, 3800, "threads {threads}");
        assert_eq!(stats.rows_examined, one_stats.rows_examined);
        assert_eq!(many.len(), one.len());
        for (a, b) in many.iter().zip(&one) {
            assert_eq!(a.group, b.group);
            for (x, y) in a.values.iter().zip(&b.values) {
                match (x, y) {
                    (AggValue::Float(x), AggValue::Float(y)) => assert!((x - y).abs() < 1e-6),
                    _ => assert_eq!(x, y),
                }
            }
        }
    }
    let bad = AggregateSpec {
        layout: &Layout::json_undeclared(),
        keyspace: ks,
        range: (Bound::Unbounded, Bound::Unbounded),
        predicate: None,
        aggregates: &aggs,
        group_by: None,
        threads: 0,
        multi_valued: false,
    };
    assert!(aggregate::aggregate(&s, &bad)
        .unwrap_err()
        .to_string()
        .contains("0 threads"));
}

/// Multi-valued (Elasticsearch's reading): a document falls in one group
/// per distinct element of an array group field, nested arrays flattened,
/// and metrics take every element; `[]` and nulls are no value.
#[test]
fn multi_valued_groups_and_metrics_take_each_element() {
    let s = store();
    let ks = s.create_keyspace("m", ValueFormat::Json, "").unwrap();
    let docs = [
        r#"{"g":["a","b","a"],"v":[1,2]}"#,
        r#"{"g":"a","v":10}"#,
        r#"{"g":[],"v":[]}"#,
        r#"{"g":null,"v":null}"#,
        r#"{"g":[["c"],null],"v":[[3],"x",4.5]}"#,
    ];
    for (i, d) in docs.iter().enumerate() {
        s.put(ks, format!("{i}").as_bytes(), d.as_bytes()).unwrap();
    }
    let g = field("g");
    let aggs = parse_aggregates("count(*), count(v), sum(v), min(v), max(v)").unwrap();
    let run = |multi_valued| {
        let spec = AggregateSpec {
            layout: &Layout::json_undeclared(),
            keyspace: ks,
            range: (Bound::Unbounded, Bound::Unbounded),
            predicate: None,
            aggregates: &aggs,
            group_by: Some(&g),
            threads: 1,
            multi_valued,
        };
        let (rows, _) = aggregate::aggregate(&s, &spec).unwrap();
        rows.into_iter()
            .map(|r| (r.group, r.values))
            .collect::<BTreeMap<_, _>>()
    };
    let int = |i| AggValue::Int(i);
    let got = run(true);
    let want: BTreeMap<Option<String>, Vec<AggValue>> = [
        (
            None,
            vec![
                int(2),
                int(0),
                AggValue::Null,
                AggValue::Null,
                AggValue::Null,
            ],
        ),
        (
            Some("\"a\"".into()),
            vec![int(2), int(3), int(13), int(1), int(10)],
        ),
        (
            Some("\"b\"".into()),
            vec![int(1), int(2), int(3), int(1), int(2)],
        ),
        (
            Some("\"c\"".into()),
            vec![
                int(1),
                int(3),
                AggValue::Float(7.5),
                int(3),
                AggValue::Float(4.5),
            ],
        ),
    ]
    .into_iter()
    .collect();
    assert_eq!(got, want);
    // Single-valued: an array is one group by its text, and no number.
    let got = run(false);
    assert_eq!(got[&Some(r#"["a","b","a"]"#.to_string())][0], int(1));
    assert_eq!(got[&Some("\"a\"".to_string())][2], int(10));
    assert_eq!(got.len(), 5, "{got:?}");
}

/// Rows of values with a weight aggregate as that many documents holding
/// them would: the same groups and values as the scan over those
/// documents, each stored `weight` times.
#[test]
fn weighted_value_rows_aggregate_as_the_documents_they_stand_for() {
    let s = store();
    let ks = s.create_keyspace("w", ValueFormat::Json, "").unwrap();
    // (group, value, weight); None: the field is absent.
    let rows: [(Option<&str>, Option<&str>, u64); 6] = [
        (Some(r#""a""#), Some("3"), 4),
        (Some(r#"["a","b"]"#), Some("[1,2.5]"), 3),
        (None, Some("7"), 2),
        (Some(r#""b""#), None, 5),
        (Some("null"), Some(r#""x""#), 1),
        (Some(r#""a""#), Some("-9223372036854775808"), 2),
    ];
    let mut n = 0;
    for (g, v, weight) in rows {
        let mut doc = String::from("{");
        if let Some(g) = g {
            doc += &format!("\"g\":{g},");
        }
        if let Some(v) = v {
            doc += &format!("\"v\":{v},");
        }
        doc += "\"pad\":0}";
        for _ in 0..weight {
            s.put(ks, format!("{n:04}").as_bytes(), doc.as_bytes())
                .unwrap();
            n += 1;
        }
    }
    let g = field("g");
    let aggs = parse_aggregates("count(*), count(v), sum(v), min(v), max(v), avg(v)").unwrap();
    let spec = AggregateSpec {
        layout: &Layout::json_undeclared(),
        keyspace: ks,
        range: (Bound::Unbounded, Bound::Unbounded),
        predicate: None,
        aggregates: &aggs,
        group_by: Some(&g),
        threads: 1,
        multi_valued: true,
    };
    let (scanned, _) = aggregate::aggregate(&s, &spec).unwrap();
    let value_rows = rows.iter().map(|(g, v, weight)| aggregate::ValueRow {
        group: g.map(str::as_bytes),
        fields: aggs
            .iter()
            .map(|a| a.path.as_ref().and(v.map(str::as_bytes)))
            .collect(),
        weight: *weight,
    });
    let weighted = aggregate::aggregate_rows(&aggs, true, value_rows).unwrap();
    assert_eq!(weighted, scanned);
    assert_eq!(weighted.len(), 3, "{weighted:?}");
}
