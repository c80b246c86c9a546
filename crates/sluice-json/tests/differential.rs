//! The scanner against serde_json: the same texts are valid or not for both,
//! and a valid text navigates to the same values.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use proptest::prelude::*;
use serde::de::IgnoredAny;
use serde_json::Value as Serde;
use sluice_json::{Kind, Scanner, Value};

fn json_value() -> impl Strategy<Value = Serde> {
    let leaf = prop_oneof![
        Just(Serde::Null),
        any::<bool>().prop_map(Serde::Bool),
        any::<i64>().prop_map(Serde::from),
        any::<u64>().prop_map(Serde::from),
        (-1e300f64..1e300).prop_map(Serde::from),
        "[a-z\"\\\\/\u{0}-\u{1f}é😀 ]{0,12}".prop_map(Serde::String),
    ];
    leaf.prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Serde::Array),
            proptest::collection::btree_map("[a-z_\"]{0,4}", inner, 0..6)
                .prop_map(|m| Serde::Object(m.into_iter().collect())),
        ]
    })
}

/// Whitespace put after every operator, as a pretty printer would.
fn spaced(text: &str, ws: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() * 2);
    let mut in_string = false;
    let mut escaped = false;
    for (i, &b) in text.as_bytes().iter().enumerate() {
        out.push(b);
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else if b == b'"' {
            in_string = true;
        } else if matches!(b, b'{' | b'[' | b':' | b',') {
            out.push(ws[i % ws.len()]);
        }
    }
    out
}

/// Rebuilds the value from the scanner's navigation only.
fn rebuild(v: Value<'_, '_>) -> Serde {
    match v.kind() {
        Kind::Object => Serde::Object(
            v.members()
                .map(|(k, v)| (k.to_str().unwrap().into_owned(), rebuild(v)))
                .collect(),
        ),
        Kind::Array => Serde::Array(v.elements().map(rebuild).collect()),
        _ => serde_json::from_str(v.raw()).unwrap(),
    }
}

/// serde_json does not check the UTF-8 of strings it skips: the text is
/// checked whole first, as the scanner does.
fn serde_valid(bytes: &[u8]) -> bool {
    std::str::from_utf8(bytes).is_ok() && serde_json::from_slice::<IgnoredAny>(bytes).is_ok()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn valid_texts_navigate_to_serde_json_values(v in json_value(), ws in proptest::collection::vec(
        prop_oneof![Just(b' '), Just(b'\n'), Just(b'\t'), Just(b'\r')], 1..4)) {
        let text = spaced(&serde_json::to_string(&v).unwrap(), &ws);
        let mut scanner = Scanner::new();
        let json = scanner.scan(&text).unwrap();
        prop_assert_eq!(rebuild(json.root()), serde_json::from_slice::<Serde>(&text).unwrap());
        prop_assert_eq!(json.root().raw().as_bytes(), text.trim_ascii());
    }

    /// Texts one edit away from valid JSON: valid exactly when serde_json
    /// says so.
    #[test]
    fn edited_texts_are_valid_exactly_when_serde_json_says(
        v in json_value(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), 0u8..3, prop_oneof![
            Just(b'"'), Just(b'\\'), Just(b'{'), Just(b'}'), Just(b'['), Just(b']'), Just(b':'),
            Just(b','), Just(b' '), Just(b'0'), Just(b'1'), Just(b'-'), Just(b'.'), Just(b'e'),
            Just(b'+'), Just(b'u'), Just(b'n'), Just(b't'), Just(b'f'), Just(b'a'), Just(0x01),
            Just(0xc3), Just(0xff)]), 1..4),
    ) {
        let mut text = serde_json::to_vec(&v).unwrap();
        for (at, op, b) in edits {
            if text.is_empty() {
                text.push(b);
                continue;
            }
            let i = at.index(text.len());
            match op {
                0 => text[i] = b,
                1 => text.insert(i, b),
                _ => { text.remove(i); }
            }
        }
        let mut scanner = Scanner::new();
        let ours = scanner.scan(&text);
        prop_assert_eq!(ours.is_ok(), serde_valid(&text),
            "{:?}: ours {:?}", String::from_utf8_lossy(&text), ours.err());
    }
}

#[test]
fn long_strings_and_many_escapes_across_blocks() {
    for len in [0, 1, 31, 32, 63, 64, 65, 127, 128, 1000, 1_500_000] {
        let s: String = (0..len)
            .map(|i| ['a', '\\', '"', 'é', '\u{1}', '/'][i % 6])
            .collect();
        let v = serde_json::json!([{"_id": s, "_source": {"x": [s, 1.5, null]}}]);
        let text = serde_json::to_vec(&v).unwrap();
        let mut scanner = Scanner::new();
        let json = scanner.scan(&text).unwrap();
        assert_eq!(rebuild(json.root()), v, "len {len}");
    }
}

/// Every path to a value of `v`, with the value there.
fn paths(v: &Serde, here: &mut Vec<PathStep>, out: &mut Vec<(Vec<PathStep>, Serde)>) {
    out.push((here.clone(), v.clone()));
    match v {
        Serde::Object(m) => {
            let mut seen = std::collections::HashSet::new();
            for (k, child) in m {
                // The first member of a name is the one a path finds.
                if seen.insert(k.clone()) {
                    here.push(PathStep::Key(k.clone()));
                    paths(child, here, out);
                    here.pop();
                }
            }
        }
        Serde::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                here.push(PathStep::Index(i));
                paths(child, here, out);
                here.pop();
            }
        }
        _ => {}
    }
}

#[derive(Debug, Clone)]
enum PathStep {
    Key(String),
    Index(usize),
}

fn skim_steps(path: &[PathStep]) -> Vec<sluice_json::skim::Step<'_>> {
    path.iter()
        .map(|s| match s {
            PathStep::Key(k) => sluice_json::skim::Step::Key(k),
            PathStep::Index(i) => sluice_json::skim::Step::Index(*i),
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// A skim finds every value of a valid text by its path, as exactly the
    /// text serde_json reads as that value, and nothing one step past it.
    #[test]
    fn skim_finds_every_value_by_its_path(v in json_value(), ws in proptest::collection::vec(
        prop_oneof![Just(b' '), Just(b'\n'), Just(b'\t'), Just(b'\r')], 1..4)) {
        let text = spaced(&serde_json::to_string(&v).unwrap(), &ws);
        let mut all = Vec::new();
        paths(&v, &mut Vec::new(), &mut all);
        for (path, want) in &all {
            let found = sluice_json::skim::find(&text, skim_steps(path)).unwrap();
            let found = found.unwrap_or_else(|| panic!("{path:?} not found"));
            prop_assert_eq!(&serde_json::from_slice::<Serde>(found).unwrap(), want);
            prop_assert_eq!(found.trim_ascii(), found);
            let mut past = path.clone();
            past.push(match want {
                Serde::Array(a) => PathStep::Index(a.len()),
                _ => PathStep::Key("\u{1}absent".into()),
            });
            prop_assert_eq!(sluice_json::skim::find(&text, skim_steps(&past)).unwrap(), None);
        }
    }
}
