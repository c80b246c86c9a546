//! `cjson`: JSON as lua-cjson 2.1 encodes and decodes it.

use super::{format_g, lib_fn, type_name, BytesOut, MAX_NESTING};
use mlua::{Lua, LuaString, Table, Value};
use std::cell::Cell;
use std::rc::Rc;

/// cjson's settings, per Lua state (its functions change them).
struct JsonConfig {
    encode_max_depth: Cell<u32>,
    decode_max_depth: Cell<u32>,
    /// 0: refused; 1: `nan`/`inf`; 2: `null`.
    encode_invalid_numbers: Cell<u8>,
    decode_invalid_numbers: Cell<bool>,
    precision: Cell<usize>,
    sparse_convert: Cell<bool>,
    sparse_ratio: Cell<u32>,
    sparse_safe: Cell<u32>,
}

impl Default for JsonConfig {
    fn default() -> JsonConfig {
        JsonConfig {
            encode_max_depth: Cell::new(1000),
            decode_max_depth: Cell::new(1000),
            encode_invalid_numbers: Cell::new(0),
            decode_invalid_numbers: Cell::new(true),
            precision: Cell::new(14),
            sparse_convert: Cell::new(false),
            sparse_ratio: Cell::new(2),
            sparse_safe: Cell::new(10),
        }
    }
}

pub(super) fn cjson(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    let config = Rc::new(JsonConfig::default());
    let c = config.clone();
    t.set(
        "encode",
        lib_fn(lua, move |_, v: Value| {
            let mut out = Vec::new();
            encode_json(&c, &v, 0, &mut out)?;
            Ok(BytesOut(out))
        })?,
    )?;
    let c = config.clone();
    t.set(
        "decode",
        lib_fn(lua, move |lua, s: LuaString| {
            let bytes = s.as_bytes();
            let mut p = JsonParser {
                lua,
                s: &bytes,
                at: 0,
                depth: 0,
                config: &c,
            };
            p.document()
        })?,
    )?;
    // encode_max_depth / decode_max_depth: set (within MAX_NESTING) and
    // answer the depth.
    let depth = |cell: fn(&JsonConfig) -> &Cell<u32>| {
        let c = config.clone();
        lib_fn(lua, move |_, d: Option<u32>| {
            if let Some(d) = d {
                cell(&c).set(d.clamp(1, MAX_NESTING));
            }
            Ok(cell(&c).get())
        })
    };
    t.set("encode_max_depth", depth(|c| &c.encode_max_depth)?)?;
    t.set("decode_max_depth", depth(|c| &c.decode_max_depth)?)?;
    let c = config.clone();
    t.set(
        "encode_invalid_numbers",
        lib_fn(lua, move |_, v: Value| {
            match v {
                Value::Boolean(b) => c.encode_invalid_numbers.set(u8::from(b)),
                Value::String(s) if s.as_bytes().as_ref() == b"null" => {
                    c.encode_invalid_numbers.set(2)
                }
                Value::String(s) if s.as_bytes().as_ref() == b"on" => {
                    c.encode_invalid_numbers.set(1)
                }
                Value::String(s) if s.as_bytes().as_ref() == b"off" => {
                    c.encode_invalid_numbers.set(0)
                }
                _ => {}
            }
            Ok(c.encode_invalid_numbers.get() != 0)
        })?,
    )?;
    let c = config.clone();
    t.set(
        "decode_invalid_numbers",
        lib_fn(lua, move |_, v: Option<bool>| {
            if let Some(v) = v {
                c.decode_invalid_numbers.set(v);
            }
            Ok(c.decode_invalid_numbers.get())
        })?,
    )?;
    let c = config.clone();
    t.set(
        "encode_number_precision",
        lib_fn(lua, move |_, p: Option<usize>| {
            if let Some(p) = p {
                if !(1..=14).contains(&p) {
                    return Err(mlua::Error::runtime(
                        "bad argument #1 to '?' (expected integer between 1 and 14)",
                    ));
                }
                c.precision.set(p);
            }
            Ok(c.precision.get())
        })?,
    )?;
    let c = config;
    t.set(
        "encode_sparse_array",
        lib_fn(
            lua,
            move |_, (convert, ratio, safe): (Option<bool>, Option<u32>, Option<u32>)| {
                if let Some(v) = convert {
                    c.sparse_convert.set(v);
                }
                if let Some(v) = ratio {
                    c.sparse_ratio.set(v);
                }
                if let Some(v) = safe {
                    c.sparse_safe.set(v);
                }
                Ok((
                    c.sparse_convert.get(),
                    c.sparse_ratio.get(),
                    c.sparse_safe.get(),
                ))
            },
        )?,
    )?;
    t.set(
        "encode_keep_buffer",
        lib_fn(lua, |_, v: Option<bool>| Ok(v.unwrap_or(true)))?,
    )?;
    t.set(
        "null",
        Value::LightUserData(mlua::LightUserData(std::ptr::null_mut())),
    )?;
    t.set("_NAME", "cjson")?;
    t.set("_VERSION", "2.1.0")?;
    Ok(t)
}

fn cannot_serialise(v: &Value, why: &str) -> mlua::Error {
    mlua::Error::runtime(format!("Cannot serialise {}: {why}", type_name(v)))
}

fn encode_json(c: &JsonConfig, v: &Value, depth: u32, out: &mut Vec<u8>) -> mlua::Result<()> {
    match v {
        Value::String(s) => json_string(&s.as_bytes(), out),
        Value::Integer(i) => out.extend_from_slice(i.to_string().as_bytes()),
        Value::Number(n) => json_number(c, v, *n, out)?,
        Value::Boolean(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Nil => out.extend_from_slice(b"null"),
        Value::LightUserData(p) if p.0.is_null() => out.extend_from_slice(b"null"),
        Value::Table(t) => {
            let depth = depth + 1;
            if depth > c.encode_max_depth.get() {
                return Err(mlua::Error::runtime(format!(
                    "Cannot serialise, excessive nesting ({depth})"
                )));
            }
            match json_array_length(c, v, t)? {
                Some(len) if len > 0 => {
                    out.push(b'[');
                    for i in 1..=len {
                        if i > 1 {
                            out.push(b',');
                        }
                        encode_json(c, &t.raw_get::<Value>(i)?, depth, out)?;
                    }
                    out.push(b']');
                }
                _ => {
                    out.push(b'{');
                    let mut first = true;
                    for pair in t.pairs::<Value, Value>() {
                        let (k, val) = pair?;
                        if !first {
                            out.push(b',');
                        }
                        first = false;
                        match &k {
                            Value::String(s) => json_string(&s.as_bytes(), out),
                            Value::Integer(_) | Value::Number(_) => {
                                out.push(b'"');
                                let n = match k {
                                    Value::Integer(i) => i as f64,
                                    Value::Number(n) => n,
                                    _ => unreachable!("matched a number"),
                                };
                                json_number(c, &k, n, out)?;
                                out.push(b'"');
                            }
                            _ => {
                                return Err(cannot_serialise(
                                    &k,
                                    "table key must be a number or string",
                                ))
                            }
                        }
                        out.push(b':');
                        encode_json(c, &val, depth, out)?;
                    }
                    out.push(b'}');
                }
            }
        }
        other => return Err(cannot_serialise(other, "type not supported")),
    }
    Ok(())
}

/// A table's array length as cjson sees it: None if it is an object.
fn json_array_length(c: &JsonConfig, v: &Value, t: &Table) -> mlua::Result<Option<usize>> {
    let (mut max, mut items) = (0usize, 0usize);
    for pair in t.pairs::<Value, Value>() {
        let (k, _) = pair?;
        let k = match k {
            Value::Integer(i) => i as f64,
            Value::Number(n) => n,
            _ => return Ok(None),
        };
        if k < 1.0 || k.floor() != k {
            return Ok(None);
        }
        max = max.max(k as usize);
        items += 1;
    }
    let ratio = c.sparse_ratio.get() as usize;
    if ratio > 0 && max > items * ratio && max > c.sparse_safe.get() as usize {
        if !c.sparse_convert.get() {
            return Err(cannot_serialise(v, "excessively sparse array"));
        }
        return Ok(None);
    }
    Ok(Some(max))
}

fn json_number(c: &JsonConfig, v: &Value, n: f64, out: &mut Vec<u8>) -> mlua::Result<()> {
    if !n.is_finite() {
        match c.encode_invalid_numbers.get() {
            0 => return Err(cannot_serialise(v, "must not be NaN or Inf")),
            1 if n.is_nan() => {
                out.extend_from_slice(b"nan");
                return Ok(());
            }
            1 => {}
            _ => {
                out.extend_from_slice(b"null");
                return Ok(());
            }
        }
    }
    out.extend_from_slice(format_g(n, c.precision.get()).as_bytes());
    Ok(())
}

fn json_string(s: &[u8], out: &mut Vec<u8>) {
    out.push(b'"');
    for &b in s {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'/' => out.extend_from_slice(b"\\/"),
            b'\x08' => out.extend_from_slice(b"\\b"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\x0c' => out.extend_from_slice(b"\\f"),
            b'\r' => out.extend_from_slice(b"\\r"),
            0..=0x1f | 0x7f => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

struct JsonParser<'a> {
    lua: &'a Lua,
    s: &'a [u8],
    at: usize,
    depth: u32,
    config: &'a JsonConfig,
}

impl JsonParser<'_> {
    fn document(&mut self) -> mlua::Result<Value> {
        let v = self.value()?;
        self.skip_space();
        if self.at < self.s.len() {
            return Err(self.expected("the end"));
        }
        Ok(v)
    }

    fn skip_space(&mut self) {
        while self.at < self.s.len() && matches!(self.s[self.at], b' ' | b'\t' | b'\n' | b'\r') {
            self.at += 1;
        }
    }

    fn expected(&self, what: &str) -> mlua::Error {
        let found = match self.s.get(self.at) {
            None => "T_END",
            Some(b'{') => "T_OBJ_BEGIN",
            Some(b'}') => "T_OBJ_END",
            Some(b'[') => "T_ARR_BEGIN",
            Some(b']') => "T_ARR_END",
            Some(b',') => "T_COMMA",
            Some(b':') => "T_COLON",
            Some(b'"') => "T_STRING",
            _ => "invalid token",
        };
        mlua::Error::runtime(format!(
            "Expected {what} but found {found} at character {}",
            self.at + 1
        ))
    }

    fn nest(&mut self) -> mlua::Result<()> {
        self.depth += 1;
        if self.depth > self.config.decode_max_depth.get() {
            return Err(mlua::Error::runtime(format!(
                "Found too many nested data structures ({}) at character {}",
                self.depth,
                self.at + 1
            )));
        }
        Ok(())
    }

    fn value(&mut self) -> mlua::Result<Value> {
        self.skip_space();
        let Some(&b) = self.s.get(self.at) else {
            return Err(self.expected("value"));
        };
        match b {
            b'{' => self.object(),
            b'[' => self.array(),
            b'"' => Ok(Value::String(self.lua.create_string(self.string()?)?)),
            b't' if self.s[self.at..].starts_with(b"true") => {
                self.at += 4;
                Ok(Value::Boolean(true))
            }
            b'f' if self.s[self.at..].starts_with(b"false") => {
                self.at += 5;
                Ok(Value::Boolean(false))
            }
            b'n' if self.s[self.at..].starts_with(b"null") => {
                self.at += 4;
                Ok(Value::LightUserData(mlua::LightUserData(
                    std::ptr::null_mut(),
                )))
            }
            _ => self.number(),
        }
    }

    fn number(&mut self) -> mlua::Result<Value> {
        let start = self.at;
        while self.at < self.s.len()
            && matches!(self.s[self.at], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E' | b'x' | b'X' | b'a'..=b'd' | b'f' | b'A'..=b'D' | b'F' | b'i' | b'n' | b'I' | b'N')
        {
            self.at += 1;
        }
        let text = std::str::from_utf8(&self.s[start..self.at]).unwrap_or("");
        let lower = text.to_ascii_lowercase();
        let invalid = lower.contains("inf") || lower.contains("nan") || lower.contains('x');
        let parsed = if invalid && !self.config.decode_invalid_numbers.get() {
            None
        } else if lower.contains('x') {
            let (neg, digits) = match lower.strip_prefix('-') {
                Some(d) => (true, d),
                None => (false, lower.as_str()),
            };
            digits
                .strip_prefix("0x")
                .and_then(|h| i64::from_str_radix(h, 16).ok())
                .map(|v| if neg { -(v as f64) } else { v as f64 })
        } else {
            lower.parse::<f64>().ok()
        };
        match parsed {
            Some(n) if !text.is_empty() => Ok(Value::Number(n)),
            _ => {
                self.at = start;
                Err(self.expected("value"))
            }
        }
    }

    fn string(&mut self) -> mlua::Result<Vec<u8>> {
        debug_assert_eq!(self.s[self.at], b'"');
        self.at += 1;
        let mut out = Vec::new();
        loop {
            let Some(&b) = self.s.get(self.at) else {
                return Err(mlua::Error::runtime(format!(
                    "Expected value but found unexpected end of string at character {}",
                    self.at + 1
                )));
            };
            self.at += 1;
            match b {
                b'"' => return Ok(out),
                b'\\' => {
                    let Some(&e) = self.s.get(self.at) else {
                        continue;
                    };
                    self.at += 1;
                    match e {
                        b'"' | b'\\' | b'/' => out.push(e),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'n' => out.push(b'\n'),
                        b'r' => out.push(b'\r'),
                        b't' => out.push(b'\t'),
                        b'u' => self.unicode_escape(&mut out)?,
                        _ => {
                            return Err(mlua::Error::runtime(format!(
                                "Expected value but found invalid escape code at character {}",
                                self.at - 1
                            )))
                        }
                    }
                }
                _ => out.push(b),
            }
        }
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.s.get(self.at..self.at + 4)?;
        let v = u32::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()?;
        self.at += 4;
        Some(v)
    }

    fn unicode_escape(&mut self, out: &mut Vec<u8>) -> mlua::Result<()> {
        let bad = |at: usize| {
            mlua::Error::runtime(format!(
                "Expected value but found invalid unicode escape code at character {at}"
            ))
        };
        let first = self.hex4().ok_or_else(|| bad(self.at))?;
        let code = if (0xd800..0xdc00).contains(&first) {
            if self.s.get(self.at..self.at + 2) != Some(b"\\u") {
                return Err(bad(self.at));
            }
            self.at += 2;
            let low = self.hex4().ok_or_else(|| bad(self.at))?;
            if !(0xdc00..0xe000).contains(&low) {
                return Err(bad(self.at));
            }
            0x10000 + ((first - 0xd800) << 10) + (low - 0xdc00)
        } else {
            first
        };
        let c = char::from_u32(code).ok_or_else(|| bad(self.at))?;
        let mut buf = [0u8; 4];
        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        Ok(())
    }

    fn object(&mut self) -> mlua::Result<Value> {
        self.nest()?;
        self.at += 1;
        let t = self.lua.create_table()?;
        self.skip_space();
        if self.s.get(self.at) == Some(&b'}') {
            self.at += 1;
            self.depth -= 1;
            return Ok(Value::Table(t));
        }
        loop {
            self.skip_space();
            if self.s.get(self.at) != Some(&b'"') {
                return Err(self.expected("object key string"));
            }
            let key = self.string()?;
            self.skip_space();
            if self.s.get(self.at) != Some(&b':') {
                return Err(self.expected("colon"));
            }
            self.at += 1;
            let v = self.value()?;
            t.raw_set(self.lua.create_string(&key)?, v)?;
            self.skip_space();
            match self.s.get(self.at) {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    self.depth -= 1;
                    return Ok(Value::Table(t));
                }
                _ => return Err(self.expected("comma or object end")),
            }
        }
    }

    fn array(&mut self) -> mlua::Result<Value> {
        self.nest()?;
        self.at += 1;
        let t = self.lua.create_table()?;
        self.skip_space();
        if self.s.get(self.at) == Some(&b']') {
            self.at += 1;
            self.depth -= 1;
            return Ok(Value::Table(t));
        }
        let mut i = 1;
        loop {
            let v = self.value()?;
            t.raw_set(i, v)?;
            i += 1;
            self.skip_space();
            match self.s.get(self.at) {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    self.depth -= 1;
                    return Ok(Value::Table(t));
                }
                _ => return Err(self.expected("comma or array end")),
            }
        }
    }
}
