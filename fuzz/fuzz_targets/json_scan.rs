//! The JSON scanner: any bytes are valid JSON for it exactly when they are
//! UTF-8 and serde_json accepts them, never a panic; a valid text's values
//! navigate to the same values serde_json reads.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value as Serde;
use sluice_json::{Kind, Scanner, Value};

fn rebuild(v: Value<'_, '_>) -> Option<Serde> {
    Some(match v.kind() {
        Kind::Object => Serde::Object(
            v.members()
                .map(|(k, v)| Some((k.to_str().ok()?.into_owned(), rebuild(v)?)))
                .collect::<Option<_>>()?,
        ),
        Kind::Array => Serde::Array(v.elements().map(rebuild).collect::<Option<_>>()?),
        // Numbers past f64 and lone surrogates: serde_json refuses to build them.
        _ => serde_json::from_str(v.raw()).ok()?,
    })
}

fuzz_target!(|data: &[u8]| {
    let mut scanner = Scanner::new();
    let ours = scanner.scan(data);
    let theirs = std::str::from_utf8(data).is_ok()
        && serde_json::from_slice::<serde::de::IgnoredAny>(data).is_ok();
    // serde_json stops at 128 levels of nesting; the scanner does not.
    let deep = data.iter().filter(|&&b| b == b'[' || b == b'{').count() > 100;
    if !deep {
        assert_eq!(ours.is_ok(), theirs, "{:?}: {:?}", String::from_utf8_lossy(data), ours.err());
    }
    if let (Ok(json), false) = (ours, deep) {
        if let (Some(ours), Ok(theirs)) = (rebuild(json.root()), serde_json::from_slice::<Serde>(data)) {
            assert_eq!(ours, theirs);
        }
    }
});
