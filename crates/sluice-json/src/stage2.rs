//! Stage 2: the grammar, checked in one walk over the structural index.
//!
//! Every structural byte is an operator or the first byte of a scalar, so
//! the walk sees each value's start, each key, colon and comma; strings were
//! checked in stage 1 (escapes, control bytes, closing quote), numbers and
//! literals are checked here from their first byte up to the byte after
//! them, which must end a scalar. Containers are kept on an explicit stack,
//! and each `{`/`[` gets the index of its matching close, so that a reader
//! skips a value of any size in one step.

use crate::{error, Error};

/// Bytes that may follow a number or literal: whitespace and operators.
const ENDS_SCALAR: [bool; 256] = {
    let mut t = [false; 256];
    let ends = b" \t\n\r{}[]:,";
    let mut i = 0;
    while i < ends.len() {
        t[ends[i] as usize] = true;
        i += 1;
    }
    t
};

/// Checks the grammar of the text `structurals` indexes, and fills
/// `closes`: for the structural at index k that opens a container, the index
/// of its close (other entries are left as they were: `closes` only grows,
/// so a reused scanner does not clear it per text). `stack` is scratch.
pub fn validate(
    bytes: &[u8],
    structurals: &[u32],
    closes: &mut Vec<u32>,
    stack: &mut Vec<u32>,
) -> Result<(), Error> {
    let n = structurals.len();
    if closes.len() < n {
        closes.resize(n, 0);
    }
    stack.clear();
    let at = |k: usize| structurals[k] as usize;
    if n == 0 {
        return Err(error(bytes.len(), "no JSON value in the text"));
    }
    let mut k = 0;
    // Whether the innermost open container is an object: kept here rather
    // than read back through the stack, the index and the text after every
    // value (three dependent loads); only a close reads the stack.
    let mut object = false;
    'value: loop {
        // k is a value's first structural.
        if k >= n {
            return Err(error(bytes.len(), "text ends where a value should be"));
        }
        let pos = at(k);
        match bytes[pos] {
            open @ (b'{' | b'[') => {
                let close = if open == b'{' { b'}' } else { b']' };
                if k + 1 < n && bytes[at(k + 1)] == close {
                    closes[k] = (k + 1) as u32;
                    k += 2;
                } else {
                    stack.push(k as u32);
                    k += 1;
                    object = open == b'{';
                    if object {
                        k = key(bytes, structurals, k)?;
                    }
                    continue 'value;
                }
            }
            b'"' => k += 1,
            b't' => k = literal(bytes, pos, b"true", k)?,
            b'f' => k = literal(bytes, pos, b"false", k)?,
            b'n' => k = literal(bytes, pos, b"null", k)?,
            b'-' | b'0'..=b'9' => {
                number(bytes, pos)?;
                k += 1;
            }
            _ => return Err(error(pos, "unexpected character where a value should be")),
        }
        // A value is complete; k is what follows it.
        loop {
            if stack.is_empty() {
                if k == n {
                    return Ok(());
                }
                return Err(error(at(k), "unexpected text after the JSON value"));
            }
            if k >= n {
                return Err(error(bytes.len(), "text ends inside an object or array"));
            }
            match (object, bytes[at(k)]) {
                (true, b',') => {
                    k = key(bytes, structurals, k + 1)?;
                    continue 'value;
                }
                (false, b',') => {
                    k += 1;
                    continue 'value;
                }
                (true, b'}') | (false, b']') => {
                    #[expect(
                        clippy::expect_used,
                        reason = "a close is taken only with an open container: the grammar walk pushed it"
                    )]
                    let open = stack.pop().expect("the stack is not empty") as usize;
                    closes[open] = k as u32;
                    object = stack
                        .last()
                        .is_some_and(|&outer| bytes[at(outer as usize)] == b'{');
                    k += 1;
                }
                (true, _) => return Err(error(at(k), "expected ',' or '}' after a member")),
                (false, _) => return Err(error(at(k), "expected ',' or ']' after an element")),
            }
        }
    }
}

/// Checks a key and its colon at k; returns where the member's value starts.
fn key(bytes: &[u8], structurals: &[u32], k: usize) -> Result<usize, Error> {
    match structurals.get(k) {
        Some(&p) if bytes[p as usize] == b'"' => {}
        Some(&p) => return Err(error(p as usize, "expected a string key")),
        None => return Err(error(bytes.len(), "text ends where a key should be")),
    }
    match structurals.get(k + 1) {
        Some(&p) if bytes[p as usize] == b':' => Ok(k + 2),
        Some(&p) => Err(error(p as usize, "expected ':' after a key")),
        None => Err(error(bytes.len(), "text ends where ':' should be")),
    }
}

fn literal(bytes: &[u8], pos: usize, word: &[u8], k: usize) -> Result<usize, Error> {
    let end = pos + word.len();
    if bytes.get(pos..end) == Some(word) && bytes.get(end).is_none_or(|&b| ENDS_SCALAR[b as usize])
    {
        Ok(k + 1)
    } else {
        Err(error(pos, "not a literal (true, false or null)"))
    }
}

/// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`, then a byte that
/// ends a scalar, or the end of the text.
fn number(bytes: &[u8], pos: usize) -> Result<(), Error> {
    let bad = || error(pos, "not a number");
    let digit = |i: usize| bytes.get(i).is_some_and(u8::is_ascii_digit);
    let digits = |mut i: usize| {
        while digit(i) {
            i += 1;
        }
        i
    };
    let mut i = pos;
    if bytes[i] == b'-' {
        i += 1;
    }
    match bytes.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => i = digits(i + 1),
        _ => return Err(bad()),
    }
    if bytes.get(i) == Some(&b'.') {
        if !digit(i + 1) {
            return Err(bad());
        }
        i = digits(i + 1);
    }
    if matches!(bytes.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(bytes.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !digit(i) {
            return Err(bad());
        }
        i = digits(i);
    }
    match bytes.get(i) {
        Some(&b) if !ENDS_SCALAR[b as usize] => Err(bad()),
        _ => Ok(()),
    }
}
