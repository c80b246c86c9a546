//! The predicate language: any text parses or fails with an error, never
//! a panic; what parses prints back to the same predicate, and runs on a
//! document without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_ndp::{parse, FieldPredicate};

const DOC: &[u8] = br#"{"year":2016,"venue":"VLDB","title":"Graph scans","n":null,"a":[1,"x",{"b":true}],"m":{"k":-1.5e3}}"#;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(pred) = parse(text) else {
        return;
    };
    let printed = pred.to_string();
    let again = parse(&printed).unwrap_or_else(|e| panic!("{printed:?} does not parse back: {e}"));
    assert_eq!(again, pred, "{printed:?}");
    let _ = FieldPredicate::compile(&pred).matches(DOC);
});
