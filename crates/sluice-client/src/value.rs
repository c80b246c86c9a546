//! Replies as the client sees them, read from RESP2 or RESP3 bytes.

use crate::Error;

/// Deepest nesting of aggregates a reply may have (Redis's own replies
/// never come near it; a bound keeps a hostile server from exhausting
/// the stack).
pub const MAX_DEPTH: usize = 64;

/// One reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `+OK` and other status lines.
    Status(String),
    /// `-ERR ...` and blob errors: the server refused the command.
    Error(String),
    /// An integer.
    Int(i64),
    /// A bulk string (or verbatim string, its format prefix dropped).
    Bulk(Vec<u8>),
    /// Nil / null.
    Nil,
    /// An array, set or push.
    Array(Vec<Value>),
    /// A RESP3 map.
    Map(Vec<(Value, Value)>),
    /// A RESP3 double.
    Double(f64),
    /// A RESP3 boolean.
    Bool(bool),
    /// A RESP3 big number, as its digits.
    BigNumber(String),
}

impl Value {
    /// The bytes of a bulk or status reply.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bulk(b) => Some(b),
            Value::Status(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    /// An error reply as an `Err`, anything else as `Ok`.
    pub fn into_result(self) -> Result<Value, Error> {
        match self {
            Value::Error(e) => Err(Error::Server(e)),
            v => Ok(v),
        }
    }
}

/// The length of the whole reply at the start of `bytes`, or None if
/// `bytes` ends inside it.
pub fn reply_len(bytes: &[u8]) -> Result<Option<usize>, Error> {
    let mut at = 0;
    Ok(skip(bytes, &mut at, 0)?.map(|()| at))
}

/// Decodes the whole reply at the start of `bytes` (call after
/// [`reply_len`] said it is complete).
pub fn decode(bytes: &[u8]) -> Result<Value, Error> {
    let mut at = 0;
    read(bytes, &mut at, 0)?.ok_or_else(|| protocol("a reply ended early"))
}

fn protocol(what: impl Into<String>) -> Error {
    Error::Protocol(what.into())
}

/// The line after the marker at `*at`, moving `*at` past its CRLF.
fn line<'a>(bytes: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    let start = *at + 1;
    let end = start + memchr_crlf(bytes.get(start..)?)?;
    *at = end + 2;
    Some(&bytes[start..end])
}

fn memchr_crlf(bytes: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = bytes[from..].iter().position(|&b| b == b'\r') {
        let i = from + i;
        match bytes.get(i + 1) {
            Some(b'\n') => return Some(i),
            Some(_) => from = i + 1,
            None => return None,
        }
    }
    None
}

fn int(text: &[u8]) -> Result<i64, Error> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            protocol(format!(
                "{:?} is not a length or integer",
                String::from_utf8_lossy(text)
            ))
        })
}

fn utf8(text: &[u8]) -> String {
    String::from_utf8_lossy(text).into_owned()
}

/// Walks past one reply without building it.
fn skip(bytes: &[u8], at: &mut usize, depth: usize) -> Result<Option<()>, Error> {
    Ok(read_or_skip(bytes, at, depth, false)?.map(|_| ()))
}

fn read(bytes: &[u8], at: &mut usize, depth: usize) -> Result<Option<Value>, Error> {
    read_or_skip(bytes, at, depth, true)
}

/// Reads one reply at `*at`; builds it only if `build` (else Nil stands
/// in, to frame without allocating).
fn read_or_skip(
    bytes: &[u8],
    at: &mut usize,
    depth: usize,
    build: bool,
) -> Result<Option<Value>, Error> {
    if depth > MAX_DEPTH {
        return Err(protocol(format!("a reply nests deeper than {MAX_DEPTH}")));
    }
    let Some(&marker) = bytes.get(*at) else {
        return Ok(None);
    };
    let Some(text) = line(bytes, at) else {
        return Ok(None);
    };
    let value = match marker {
        b'+' => Value::Status(if build { utf8(text) } else { String::new() }),
        b'-' => Value::Error(if build { utf8(text) } else { String::new() }),
        b':' => Value::Int(int(text)?),
        b'_' => Value::Nil,
        b'#' => Value::Bool(text == b"t"),
        b',' => Value::Double(if build {
            match text {
                b"inf" => f64::INFINITY,
                b"-inf" => f64::NEG_INFINITY,
                b"nan" => f64::NAN,
                t => utf8(t)
                    .parse()
                    .map_err(|_| protocol("a double that does not parse"))?,
            }
        } else {
            0.0
        }),
        b'(' => Value::BigNumber(if build { utf8(text) } else { String::new() }),
        b'$' | b'!' | b'=' => {
            let n = int(text)?;
            if n < 0 {
                return Ok(Some(Value::Nil));
            }
            let n = n as usize;
            let end = *at + n;
            if bytes.len() < end + 2 {
                return Ok(None);
            }
            if &bytes[end..end + 2] != b"\r\n" {
                return Err(protocol("a bulk reply not ended by CRLF"));
            }
            let body = &bytes[*at..end];
            *at = end + 2;
            match (marker, build) {
                (_, false) => Value::Nil,
                (b'!', true) => Value::Error(utf8(body)),
                (b'=', true) => Value::Bulk(body.get(4..).unwrap_or_default().to_vec()),
                _ => Value::Bulk(body.to_vec()),
            }
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let n = int(text)?;
            if n < 0 {
                return Ok(Some(Value::Nil));
            }
            let pairs = matches!(marker, b'%' | b'|');
            let items = if pairs { n as usize * 2 } else { n as usize };
            let mut values = Vec::with_capacity(if build { items.min(1 << 16) } else { 0 });
            for _ in 0..items {
                match read_or_skip(bytes, at, depth + 1, build)? {
                    Some(v) if build => values.push(v),
                    Some(_) => {}
                    None => return Ok(None),
                }
            }
            if marker == b'|' {
                // An attribute comes before the reply it annotates.
                return read_or_skip(bytes, at, depth, build);
            }
            if pairs {
                let mut map = Vec::with_capacity(values.len() / 2);
                let mut it = values.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    map.push((k, v));
                }
                Value::Map(map)
            } else {
                Value::Array(values)
            }
        }
        other => {
            return Err(protocol(format!(
                "a reply starting with byte {other:#04x}, which RESP does not have"
            )))
        }
    };
    Ok(Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_frames_and_decodes() {
        let cases: &[(&[u8], Value)] = &[
            (b"+OK\r\n", Value::Status("OK".into())),
            (b"-ERR no\r\n", Value::Error("ERR no".into())),
            (b":-42\r\n", Value::Int(-42)),
            (b"$3\r\na\r\n\r\n", Value::Bulk(b"a\r\n".to_vec())),
            (b"$-1\r\n", Value::Nil),
            (b"_\r\n", Value::Nil),
            (b"#t\r\n", Value::Bool(true)),
            (b",1.5\r\n", Value::Double(1.5)),
            (
                b"(12345678901234567890\r\n",
                Value::BigNumber("12345678901234567890".into()),
            ),
            (b"=7\r\ntxt:abc\r\n", Value::Bulk(b"abc".to_vec())),
            (
                b"*2\r\n:1\r\n*1\r\n+x\r\n",
                Value::Array(vec![
                    Value::Int(1),
                    Value::Array(vec![Value::Status("x".into())]),
                ]),
            ),
            (
                b"%1\r\n+k\r\n:2\r\n",
                Value::Map(vec![(Value::Status("k".into()), Value::Int(2))]),
            ),
            (b"|1\r\n+a\r\n+b\r\n:7\r\n", Value::Int(7)),
        ];
        for (bytes, want) in cases {
            assert_eq!(reply_len(bytes).unwrap(), Some(bytes.len()), "{bytes:?}");
            for cut in 0..bytes.len() {
                assert_eq!(
                    reply_len(&bytes[..cut]).unwrap(),
                    None,
                    "{bytes:?} cut at {cut}"
                );
            }
            assert_eq!(&decode(bytes).unwrap(), want);
        }
        assert!(reply_len(b"?x\r\n").is_err());
        assert!(reply_len(b"$2\r\nabcd\r\n").is_err());
        let deep = "*1\r\n".repeat(MAX_DEPTH + 2);
        assert!(reply_len(deep.as_bytes()).is_err());
    }
}
