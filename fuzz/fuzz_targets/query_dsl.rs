//! The HTTP API's query DSL (`sluice_http::dsl::compile`): any JSON compiles
//! or is refused with an error, never a panic; a compiled query judges any
//! document without a panic, and the same document the same way twice.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let cut = split as usize % (rest.len() + 1);
    let (query, doc) = rest.split_at(cut);
    let Ok(query) = serde_json::from_slice::<serde_json::Value>(query) else {
        return;
    };
    let mapping = serde_json::json!({"properties": {
        "n": {"type": "long"}, "tag": {"type": "keyword"}, "title": {"type": "text"},
        "o": {"properties": {"x": {"type": "long"}}}}});
    let Ok(compiled) = sluice_http::dsl::compile(Some(&query), &mapping) else {
        return;
    };
    for source in [doc, br#"{"n":3,"tag":"a","title":"x y","o":{"x":[1,2]}}"#] {
        let first = compiled.matches(b"id-1", source).ok();
        assert_eq!(first, compiled.matches(b"id-1", source).ok());
    }
});
