//! Sluice's JSON scanner: validates JSON text and indexes its structure in
//! one pass, then hands out values as borrowed slices of the text.
//!
//! Pagination reads pages of search hits at device speed, and a page must be
//! checked whole (a page that is not valid JSON is reported, never half
//! used) while each hit's `_source` is handed on as the exact bytes the
//! source sent. A DOM parser does more than that asks (it builds every value)
//! and a validating skip of each source is slower still, so this crate does
//! what the simdjson design does in its first two stages and stops there:
//!
//! 1. **Structural index** ([`stage1`]): 64 bytes at a time, AVX2 compares
//!    classify quotes, backslashes, the six operators, whitespace and control
//!    characters into bit masks; escapes are resolved with carry arithmetic,
//!    string interiors with a prefix XOR of the quote mask, and the offsets of
//!    every operator and the first byte of every scalar outside strings are
//!    written to an index. Control characters inside strings and bad escapes
//!    are errors here. The same pass notes whether any byte has its high bit
//!    set; only a text that is not all ASCII is checked as UTF-8 (`simdutf8`).
//! 2. **Validation** ([`stage2`]): one walk over the index checks the grammar
//!    (objects, arrays, keys, commas, literals, numbers), with an explicit
//!    stack (no recursion, no depth limit beyond the text's size), and records
//!    for every `{` and `[` the index of its matching close.
//!
//! The result, [`Json`], is navigated without further parsing: a container's
//! end is one lookup away, so skipping a value of any size costs the same,
//! and [`Value::raw`] is the value's exact text.
//!
//! Without AVX2 at compile time (the workspace builds for x86-64-v3, which
//! has it) the first stage classifies bytes one at a time; both paths give
//! the same index, which the tests check.
//!
//! For one or two fields of each of many small documents (a predicate over
//! stored values), [`skim::find`] walks to a value by its path without
//! indexing the rest of the text.
//!
//! ```ignore
//! let mut scanner = sluice_json::Scanner::new();
//! let json = scanner.scan(br#"[{"_id":"a","_source":{"x":[1,2]}}]"#)?;
//! for hit in json.root().elements() {
//!     let id = hit.get("_id").map(|v| v.to_str());
//!     let source = hit.get("_source").map(|v| v.raw());
//! }
//! ```

#![warn(clippy::expect_used)]
#![warn(missing_docs)]
#![deny(unsafe_code)]

pub mod skim;
pub mod stage1;
pub mod stage2;
mod value;

pub use value::{Elements, Json, Kind, Members, Value};

/// Why a text is not valid JSON, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// Byte offset in the text where the problem was found.
    pub offset: usize,
    /// What is wrong there.
    pub reason: &'static str,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}", self.reason, self.offset)
    }
}

impl std::error::Error for Error {}

pub(crate) fn error(offset: usize, reason: &'static str) -> Error {
    Error { offset, reason }
}

/// Most bytes one text may have: offsets are kept as `u32`.
pub const MAX_TEXT_BYTES: usize = u32::MAX as usize;

/// Scans texts; keeps its index buffers between scans, so a reader that
/// scans page after page allocates only when a page has more structure than
/// any before it.
#[derive(Debug, Default)]
pub struct Scanner {
    structurals: Vec<u32>,
    closes: Vec<u32>,
    stack: Vec<u32>,
}

impl Scanner {
    /// A scanner with empty buffers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Validates `bytes` as one JSON text (RFC 8259: one value, whitespace
    /// around it, UTF-8) and indexes it.
    pub fn scan<'t, 'i>(&'i mut self, bytes: &'t [u8]) -> Result<Json<'t, 'i>, Error> {
        if bytes.len() > MAX_TEXT_BYTES {
            return Err(error(MAX_TEXT_BYTES, "text longer than 4 GiB"));
        }
        let (count, ascii) = stage1::index_noting_ascii(bytes, &mut self.structurals)?;
        self.finish(bytes, count, ascii)
    }

    /// [`Scanner::scan`], and the text's CRC32C (Castagnoli, equal to
    /// `crc32c::crc32c(bytes)`) computed in the same pass: a reader that
    /// checks stored text against its checksum reads it once, not twice.
    /// On an error no checksum is given (compute it apart if it matters).
    pub fn scan_crc32c<'t, 'i>(
        &'i mut self,
        bytes: &'t [u8],
    ) -> Result<(Json<'t, 'i>, u32), Error> {
        if bytes.len() > MAX_TEXT_BYTES {
            return Err(error(MAX_TEXT_BYTES, "text longer than 4 GiB"));
        }
        let (count, ascii, crc) = stage1::index_noting_ascii_crc32c(bytes, &mut self.structurals)?;
        Ok((self.finish(bytes, count, ascii)?, crc))
    }

    /// Stage 2 over the index stage 1 left, and the text as `str`.
    fn finish<'t, 'i>(
        &'i mut self,
        bytes: &'t [u8],
        count: usize,
        ascii: bool,
    ) -> Result<Json<'t, 'i>, Error> {
        // Stage 1 notes whether the text is all ASCII as it goes; only a
        // text that is not needs its own UTF-8 pass (a page of hits usually
        // is ASCII: sources escape what they do not send as UTF-8).
        let text = if ascii {
            ascii_text(bytes)
        } else {
            utf8(bytes)?
        };
        let structurals = &self.structurals[..count];
        stage2::validate(bytes, structurals, &mut self.closes, &mut self.stack)?;
        Ok(Json::new(text, structurals, &self.closes))
    }
}

/// A text stage 1 found to be all ASCII, as `str`.
#[allow(unsafe_code)]
fn ascii_text(bytes: &[u8]) -> &str {
    debug_assert!(bytes.is_ascii());
    // SAFETY: stage 1 saw the high bit clear in every byte of `bytes`
    // (`index_noting_ascii`, tested against a bytewise reading), and ASCII
    // is valid UTF-8. Checking again here was about a twentieth of a page's
    // read and parse (docs/BENCHMARKS.md).
    unsafe { std::str::from_utf8_unchecked(bytes) }
}

fn utf8(bytes: &[u8]) -> Result<&str, Error> {
    match simdutf8::basic::from_utf8(bytes) {
        Ok(text) => Ok(text),
        // The fast check says only whether; the standard one says where.
        Err(_) => Err(error(
            std::str::from_utf8(bytes).map_or_else(|e| e.valid_up_to(), |_| 0),
            "invalid UTF-8",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_ok(text: &str) -> Vec<(Kind, String)> {
        let mut s = Scanner::new();
        let json = s.scan(text.as_bytes()).unwrap();
        let root = json.root();
        let mut out = vec![(root.kind(), root.raw().to_string())];
        for e in root.elements() {
            out.push((e.kind(), e.raw().to_string()));
        }
        out
    }

    #[test]
    fn values_come_back_as_their_exact_text() {
        let got = scan_ok(" [ 1 , -2.5e+3,\"a\\\"b\" ,{ \"k\" : [ ] } ,true,false , null ]\n");
        assert_eq!(
            got[0].1,
            "[ 1 , -2.5e+3,\"a\\\"b\" ,{ \"k\" : [ ] } ,true,false , null ]"
        );
        let rest: Vec<_> = got[1..].iter().map(|(k, r)| (*k, r.as_str())).collect();
        assert_eq!(
            rest,
            vec![
                (Kind::Number, "1"),
                (Kind::Number, "-2.5e+3"),
                (Kind::String, "\"a\\\"b\""),
                (Kind::Object, "{ \"k\" : [ ] }"),
                (Kind::Bool, "true"),
                (Kind::Bool, "false"),
                (Kind::Null, "null"),
            ]
        );
    }

    #[test]
    fn members_keys_and_strings_decode() {
        let mut s = Scanner::new();
        let text = r#"{"_id":"a\/b \u00e9\ud83d\ude00","_source":{"x":{"y":[1,[2,{}]]}},"n":18446744073709551615,"z":"plain"}"#;
        let json = s.scan(text.as_bytes()).unwrap();
        let root = json.root();
        assert_eq!(root.get("_id").unwrap().to_str().unwrap(), "a/b é😀");
        assert_eq!(
            root.get("_source").unwrap().raw(),
            r#"{"x":{"y":[1,[2,{}]]}}"#
        );
        assert_eq!(root.get("n").unwrap().as_u64(), Some(u64::MAX));
        assert!(matches!(
            root.get("z").unwrap().to_str().unwrap(),
            std::borrow::Cow::Borrowed("plain")
        ));
        assert!(root.get("missing").is_none());
        let mut other = Scanner::new();
        let escaped_key = other
            .scan(br#"{"a\\":1,"\u0062":2,"a\"b":3}"#)
            .unwrap()
            .root();
        assert_eq!(escaped_key.get("a\\").unwrap().raw(), "1");
        assert_eq!(escaped_key.get("b").unwrap().raw(), "2");
        assert_eq!(escaped_key.get("a\"b").unwrap().raw(), "3");
        assert!(escaped_key.get("a").is_none());
        let keys: Vec<_> = root
            .members()
            .map(|(k, _)| k.to_str().unwrap().into_owned())
            .collect();
        assert_eq!(keys, ["_id", "_source", "n", "z"]);
        let deep = root
            .get("_source")
            .unwrap()
            .get("x")
            .unwrap()
            .get("y")
            .unwrap();
        let inner: Vec<_> = deep.elements().map(|v| v.raw()).collect();
        assert_eq!(inner, ["1", "[2,{}]"]);
    }

    #[test]
    fn scalars_and_empty_containers_at_the_top() {
        for (text, kind, raw) in [
            ("0", Kind::Number, "0"),
            ("  \"x\"\t", Kind::String, "\"x\""),
            ("null", Kind::Null, "null"),
            ("{}", Kind::Object, "{}"),
            ("[ ]", Kind::Array, "[ ]"),
        ] {
            let got = scan_ok(text);
            assert_eq!(got[0], (kind, raw.to_string()), "{text}");
        }
    }

    #[test]
    fn invalid_texts_are_refused_with_where() {
        for (text, offset) in [
            ("", 0),
            ("   ", 3),
            ("[1,]", 3),
            ("[1 2]", 3),
            ("{\"a\" 1}", 5),
            ("{\"a\":1,}", 7),
            ("{1:2}", 1),
            ("[01]", 1),
            ("[1.]", 1),
            ("[.5]", 1),
            ("[1e]", 1),
            ("[-]", 1),
            ("[+1]", 1),
            ("[tru]", 1),
            ("[truex]", 1),
            ("[nul1]", 1),
            ("\"abc", 4),
            ("\"a\u{1}b\"", 2),
            ("\"\\x\"", 1),
            ("\"\\u12g4\"", 1),
            ("\"\\u12\"", 1),
            ("[1]]", 3),
            ("[1] 2", 4),
            ("[[1]", 4),
            ("{\"a\":1", 6),
            ("[1\"a\"]", 1),
            ("[\"a\"\"b\"]", 4),
            ("[\"a\"b]", 4),
            ("\\", 0),
            ("[\u{1}]", 1),
            ("\u{feff}1", 0),
        ] {
            let mut s = Scanner::new();
            let err = s
                .scan(text.as_bytes())
                .err()
                .unwrap_or_else(|| panic!("{text:?} passed"));
            assert_eq!(err.offset, offset, "{text:?}: {err}");
        }
        let mut s = Scanner::new();
        let err = s.scan(b"[\"\xff\"]").err().unwrap();
        assert_eq!(err, error(2, "invalid UTF-8"));
    }

    #[test]
    fn deep_nesting_has_no_depth_limit_but_the_text() {
        let text = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let mut s = Scanner::new();
        let json = s.scan(text.as_bytes()).unwrap();
        assert_eq!(json.root().raw().len(), 200_000);
        let unbalanced = format!("{}{}", "[".repeat(1000), "]".repeat(999));
        assert!(s.scan(unbalanced.as_bytes()).is_err());
    }

    #[test]
    fn a_scanner_is_reused_across_texts() {
        let mut s = Scanner::new();
        let big = format!("[{}1]", "1,".repeat(10_000));
        assert_eq!(
            s.scan(big.as_bytes()).unwrap().root().elements().count(),
            10_001
        );
        let small = s.scan(b"[\"x\",{\"a\":[]}]").unwrap();
        let raws: Vec<_> = small.root().elements().map(|v| v.raw()).collect();
        assert_eq!(raws, ["\"x\"", "{\"a\":[]}"]);
    }
}
