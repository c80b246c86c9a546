//! Finding one value of a document by its path without indexing the whole
//! document: what a predicate over stored documents needs, where most
//! documents are rejected on a field near their start.
//!
//! [`find`] walks the members of each object on the path in order and skips
//! every value before the one it wants: a string by looking for its closing
//! quote (`memchr`), a container by counting brackets outside strings, a
//! number or literal by its grammar. Nothing after the value found is read,
//! and what is skipped is not validated (a misplaced bracket inside a skipped
//! array goes unnoticed); what the walk itself has to read — member names,
//! colons, commas, the value found — must be well formed, or the walk stops
//! with an [`Error`] at that byte.
//!
//! Compared with [`crate::Scanner`], which validates and indexes a whole text
//! once so that any number of lookups cost nothing more, a skim costs a few
//! nanoseconds per byte it passes and nothing for the bytes after: the right
//! tool for one or two fields of each of many small documents.
//!
//! Semantics: the first member of an object with the name wanted is the one
//! found (names compared after unescaping); a step that meets a value of
//! another kind (a name asked of an array, an index of an object or scalar)
//! finds nothing, as does an index past an array's end.

use crate::{error, Error};
use memchr::memchr2;

/// One step of a path: an object member by name, or an array element by
/// position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<'p> {
    /// The first member with this name.
    Key(&'p str),
    /// The element at this position (from 0).
    Index(usize),
}

/// The exact text of the value at `path` in the document `text` (without
/// the whitespace around it); `Ok(None)` where the path leads nowhere.
pub fn find<'t, 'p>(
    text: &'t [u8],
    path: impl IntoIterator<Item = Step<'p>>,
) -> Result<Option<&'t [u8]>, Error> {
    let mut start = skip_ws(text, 0);
    for step in path {
        let found = match (step, text.get(start)) {
            (Step::Key(name), Some(b'{')) => member(text, start, name)?,
            (Step::Index(n), Some(b'[')) => element(text, start, n)?,
            (_, None) => return Err(error(start, "expected a value")),
            _ => None,
        };
        match found {
            Some(at) => start = at,
            None => return Ok(None),
        }
    }
    let end = value_end(text, start)?;
    Ok(Some(&text[start..end]))
}

/// The start of the value of the first member named `name` of the object
/// opening at `open`.
fn member(text: &[u8], open: usize, name: &str) -> Result<Option<usize>, Error> {
    let mut at = skip_ws(text, open + 1);
    if text.get(at) == Some(&b'}') {
        return Ok(None);
    }
    loop {
        if text.get(at) != Some(&b'"') {
            return Err(error(at, "expected a member name"));
        }
        let (name_end, escaped) = string_end(text, at)?;
        let matched = if escaped {
            unescaped_equals(&text[at..name_end], name)
        } else {
            &text[at + 1..name_end - 1] == name.as_bytes()
        };
        at = skip_ws(text, name_end);
        if text.get(at) != Some(&b':') {
            return Err(error(at, "expected ':' after a member name"));
        }
        at = skip_ws(text, at + 1);
        if matched {
            return Ok(Some(at));
        }
        at = skip_ws(text, value_end(text, at)?);
        match text.get(at) {
            Some(b',') => at = skip_ws(text, at + 1),
            Some(b'}') => return Ok(None),
            _ => return Err(error(at, "expected ',' or '}' after a member")),
        }
    }
}

/// The start of element `n` of the array opening at `open`.
fn element(text: &[u8], open: usize, n: usize) -> Result<Option<usize>, Error> {
    let mut at = skip_ws(text, open + 1);
    if text.get(at) == Some(&b']') {
        return Ok(None);
    }
    for _ in 0..n {
        at = skip_ws(text, value_end(text, at)?);
        match text.get(at) {
            Some(b',') => at = skip_ws(text, at + 1),
            Some(b']') => return Ok(None),
            _ => return Err(error(at, "expected ',' or ']' after an element")),
        }
    }
    Ok(Some(at))
}

/// One past the last byte of the value starting at `at`.
fn value_end(text: &[u8], at: usize) -> Result<usize, Error> {
    match text.get(at) {
        Some(b'"') => string_end(text, at).map(|(end, _)| end),
        Some(b'{' | b'[') => container_end(text, at),
        Some(b't') => literal_end(text, at, b"true"),
        Some(b'f') => literal_end(text, at, b"false"),
        Some(b'n') => literal_end(text, at, b"null"),
        Some(b'-' | b'0'..=b'9') => number_end(text, at),
        Some(_) => Err(error(at, "expected a value")),
        None => Err(error(at, "expected a value, found the end")),
    }
}

/// One past the closing quote of the string whose opening quote is at `at`,
/// and whether it holds an escape.
fn string_end(text: &[u8], at: usize) -> Result<(usize, bool), Error> {
    let mut i = at + 1;
    let mut escaped = false;
    loop {
        let Some(k) = text.get(i..).and_then(|rest| memchr2(b'"', b'\\', rest)) else {
            return Err(error(at, "unterminated string"));
        };
        i += k;
        if text[i] == b'"' {
            return Ok((i + 1, escaped));
        }
        // A backslash and the byte it escapes; a \u escape's hex digits
        // hold no quote or backslash, so they need no special case.
        escaped = true;
        i += 2;
    }
}

/// One past the bracket that closes the container opening at `at`: strings
/// are skipped whole, brackets counted, nothing else looked at.
fn container_end(text: &[u8], at: usize) -> Result<usize, Error> {
    let mut depth = 0usize;
    let mut i = at;
    while let Some(&b) = text.get(i) {
        match b {
            b'"' => {
                i = string_end(text, i)?.0;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Ok(i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
    Err(error(at, "unterminated object or array"))
}

fn literal_end(text: &[u8], at: usize, word: &[u8]) -> Result<usize, Error> {
    let end = at + word.len();
    if text.get(at..end) == Some(word) {
        Ok(end)
    } else {
        Err(error(at, "expected true, false or null"))
    }
}

/// One past the last byte of the number at `at`, checked against RFC 8259's
/// grammar: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
fn number_end(text: &[u8], at: usize) -> Result<usize, Error> {
    let digits = |mut i: usize| {
        while text.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        i
    };
    let bad = || error(at, "malformed number");
    let mut i = at + usize::from(text.get(at) == Some(&b'-'));
    match text.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => i = digits(i + 1),
        _ => return Err(bad()),
    }
    if text.get(i) == Some(&b'.') {
        let end = digits(i + 1);
        if end == i + 1 {
            return Err(bad());
        }
        i = end;
    }
    if matches!(text.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(text.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let end = digits(i);
        if end == i {
            return Err(bad());
        }
        i = end;
    }
    Ok(i)
}

fn skip_ws(text: &[u8], mut at: usize) -> usize {
    while matches!(text.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// Whether the JSON string `quoted` (quotes included, holding escapes)
/// spells `name`; a string whose escapes do not decode spells nothing.
fn unescaped_equals(quoted: &[u8], name: &str) -> bool {
    serde_json::from_slice::<String>(quoted).is_ok_and(|s| s == name)
}

/// A string value's contents when it holds no escape (borrowed, checked as
/// UTF-8); None for any other value, or a string with escapes (decode
/// those with serde_json or [`crate::Scanner`]).
pub fn plain_str(value: &[u8]) -> Option<Result<&str, Error>> {
    let inner = value.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    if memchr::memchr(b'\\', inner).is_some() {
        return None;
    }
    Some(std::str::from_utf8(inner).map_err(|e| error(e.valid_up_to() + 1, "string is not UTF-8")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at<'t>(text: &'t str, path: &[Step<'_>]) -> Option<&'t str> {
        find(text.as_bytes(), path.iter().copied())
            .expect("well formed")
            .map(|v| std::str::from_utf8(v).expect("UTF-8"))
    }

    #[test]
    fn finds_members_and_elements_skipping_what_comes_before() {
        let doc = r#" { "a" : [1, {"x": "]}\"["}, -2.5e+3] , "b\u0062":{"c":null},
            "s":"q\"", "b":true, "bb": 7 } "#;
        assert_eq!(at(doc, &[Step::Key("bb")]), Some(r#"{"c":null}"#));
        assert_eq!(at(doc, &[Step::Key("bb"), Step::Key("c")]), Some("null"));
        assert_eq!(at(doc, &[Step::Key("a"), Step::Index(2)]), Some("-2.5e+3"));
        assert_eq!(
            at(doc, &[Step::Key("a"), Step::Index(1), Step::Key("x")]),
            Some(r#""]}\"[""#)
        );
        assert_eq!(at(doc, &[Step::Key("s")]), Some(r#""q\"""#));
        assert_eq!(at(doc, &[Step::Key("b")]), Some("true"));
        assert_eq!(at(doc, &[]), Some(doc.trim()));
        // Paths that lead nowhere.
        assert_eq!(at(doc, &[Step::Key("zz")]), None);
        assert_eq!(at(doc, &[Step::Key("a"), Step::Index(3)]), None);
        assert_eq!(at(doc, &[Step::Key("a"), Step::Key("x")]), None);
        assert_eq!(at(doc, &[Step::Key("b"), Step::Index(0)]), None);
        assert_eq!(at("[]", &[Step::Index(0)]), None);
        assert_eq!(at("{}", &[Step::Key("")]), None);
    }

    #[test]
    fn stops_with_an_error_where_what_it_reads_is_malformed() {
        for (doc, path) in [
            (r#"{"a":1,"b""#, "b"),
            (r#"{"a":1 "b":2}"#, "b"),
            (r#"{"a":01,"b":2}"#, "b"),
            (r#"{"a":1.,"b":2}"#, "b"),
            (r#"{"a":"x,"b":2}"#, "b"),
            (r#"{"a":[1,2,"b":2}"#, "b"),
            (r#"{"a":tru,"b":2}"#, "b"),
            (r#"{a:1}"#, "a"),
            (r#"{"b":"#, "b"),
            ("", "b"),
        ] {
            assert!(find(doc.as_bytes(), [Step::Key(path)]).is_err(), "{doc}");
        }
        // What comes after the value found is not read.
        assert_eq!(at(r#"{"a":1,"b":"#, &[Step::Key("a")]), Some("1"));
    }

    #[test]
    fn plain_strings_borrow_and_escaped_ones_are_left_to_a_decoder() {
        assert_eq!(
            plain_str("\"café\"".as_bytes()).map(Result::ok),
            Some(Some("café"))
        );
        assert!(plain_str(br#""a\"b""#).is_none());
        assert!(plain_str(b"12").is_none());
        assert!(plain_str(b"\"\xff\"").is_some_and(|r| r.is_err()));
    }
}
