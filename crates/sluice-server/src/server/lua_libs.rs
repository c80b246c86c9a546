//! The libraries Redis gives scripts beside Lua's own, written for Sluice
//! to the behaviour Redis 7.0's copies have: `cjson` (JSON, lua-cjson
//! 2.1's encoding: `%.14g` numbers, `/` escaped, an empty table as `{}`,
//! sparse arrays refused), `cmsgpack` (MessagePack, lua-cmsgpack 0.4's:
//! integers in the smallest form, a table an array when its keys are
//! exactly 1..n, nesting cut at 16), `bit` (LuaBitOp: 32-bit operations
//! on numbers), `struct` (binary packing as Lua's struct library: `<` `>`
//! `!` `x` `b` `h` `l` `T` `i`n `c`n `s` `f` `d`, little-endian by default,
//! as on the machines Redis runs on) and the global protection Redis
//! puts around a script (a
//! read of an undeclared global or any write of one is an error, the
//! library tables are read-only).

use mlua::{Lua, LuaString, MultiValue, Table, Value, Variadic};
use std::cell::Cell;
use std::rc::Rc;

/// Installs `cjson`, `cmsgpack` and `bit` into `lua`'s globals.
pub(super) fn install(lua: &Lua) -> mlua::Result<()> {
    let globals = lua.globals();
    globals.set("cjson", cjson(lua)?)?;
    globals.set("cmsgpack", cmsgpack(lua)?)?;
    globals.set("bit", bit(lua)?)?;
    globals.set("struct", structs(lua)?)?;
    Ok(())
}

/// A library function running `f`: its errors raise as a C library's
/// `luaL_error` raises them, a message with the caller's position
/// (`pcall` hands the script the message, see [`PROTECT`]).
fn lib_fn<A, R, F>(lua: &Lua, f: F) -> mlua::Result<mlua::Function>
where
    A: mlua::FromLuaMulti,
    R: mlua::IntoLuaMulti,
    F: Fn(&Lua, A) -> mlua::Result<R> + 'static,
{
    lua.create_function(move |lua, args: A| {
        f(lua, args).map_err(|e| {
            let message = match e {
                mlua::Error::RuntimeError(m) => m,
                other => other.to_string(),
            };
            let at = lua
                .inspect_stack(1, |d| {
                    let line = d.current_line()?;
                    let source = d.source().short_src?.to_string();
                    Some(format!("{source}:{line}: "))
                })
                .flatten()
                .unwrap_or_default();
            mlua::Error::external(super::lua::LibError(format!("{at}{message}")))
        })
    })
}

/// Protects `lua`'s globals as Redis does and returns the environment a
/// script runs in, and the function that makes a read-only view of a
/// table (a library's load environment is one).
pub(super) fn protect(lua: &Lua) -> mlua::Result<(Table, mlua::Function)> {
    let settle = lua.create_function(|lua, v: Value| super::lua::error_value(lua, v))?;
    lua.load(PROTECT)
        .set_name("=protect")
        .call::<(Table, mlua::Function)>((lua.globals(), settle))
}

/// Lua run once per state: read-only views of the globals and library
/// tables, `setmetatable` refusing them, `error` keeping a table it
/// raises (Redis reports its `err`), and the functions Redis removes.
const PROTECT: &str = r#"
local G, error_value = ...
local raw_setmetatable, raw_error, raw_type, raw_tostring, raw_rawset =
    setmetatable, error, type, tostring, rawset
local raw_loadstring, raw_sub = loadstring, string.sub
local protected = raw_setmetatable({}, {__mode = 'k'})
local function deny() raw_error('Attempt to modify a readonly table', 2) end
local function readonly(t)
    local meta_view = raw_setmetatable({}, {__index = {__index = t}, __newindex = deny})
    local proxy = raw_setmetatable({}, {__index = t, __newindex = deny, __metatable = meta_view})
    protected[proxy] = true
    protected[meta_view] = true
    return proxy
end
for _, name in ipairs({'redis', 'cjson', 'cmsgpack', 'bit', 'struct', 'string', 'table', 'math', 'coroutine'}) do
    local lib = G[name]
    if lib then raw_rawset(G, name, readonly(lib)) end
end
G.setmetatable = function(t, m)
    if protected[t] then raw_error('Attempt to modify a readonly table', 0) end
    return raw_setmetatable(t, m)
end
G.error = function(e, level)
    if raw_type(e) == 'table' then raw_rawset(G, '__sluice_raised', e) end
    return raw_error(e, (level or 1) + (level == 0 and 0 or 1))
end
-- pcall hands the script what Redis 7's does: an error table's `err`
-- (a failed redis.call's error, error({err = ...})), else the error as
-- it is (a Rust function's error made its message first).
local raw_pcall, raw_rawget = pcall, rawget
local function settle(ok, ...)
    if ok then return ok, ... end
    local e = error_value((...))
    if raw_type(e) == 'table' and raw_type(raw_rawget(e, 'err')) == 'string' then
        e = raw_rawget(e, 'err')
    end
    return false, e
end
G.pcall = function(f, ...) return settle(raw_pcall(f, ...)) end
G.loadstring = function(s, name)
    if raw_type(s) == 'string' and raw_sub(s, 1, 1) == '\27' then
        return nil, 'binary chunks are not loaded'
    end
    return raw_loadstring(s, name)
end
G.print, G.loadfile, G.dofile, G.load, G.module, G.require, G.gcinfo, G.newproxy =
    nil, nil, nil, nil, nil, nil, nil, nil
local env = readonly(G)
G._G = env
raw_setmetatable(G, {__index = function(_, k)
    raw_error("Script attempted to access nonexistent global variable '" .. raw_tostring(k) .. "'", 2)
end})
return env, readonly
"#;

// ---------------------------------------------------------------- cjson

/// Deepest nesting JSON or MessagePack is read or written to (cjson's
/// default depth; a script may lower cjson's, not raise it): the readers
/// recurse, and the script thread's stack is not to run out.
const MAX_NESTING: u32 = 1000;

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

fn cjson(lua: &Lua) -> mlua::Result<Table> {
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

/// Bytes handed back to Lua as a string.
struct BytesOut(Vec<u8>);

impl mlua::IntoLua for BytesOut {
    fn into_lua(self, lua: &Lua) -> mlua::Result<Value> {
        Ok(Value::String(lua.create_string(&self.0)?))
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Nil => "nil",
        Value::Boolean(_) => "boolean",
        Value::LightUserData(_) | Value::UserData(_) => "userdata",
        Value::Integer(_) | Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Table(_) => "table",
        Value::Function(_) => "function",
        Value::Thread(_) => "thread",
        _ => "userdata",
    }
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

/// C's `%.<precision>g`.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: {:e} has an exponent; {:e}'s exponent is a number"
)]
pub(super) fn format_g(n: f64, precision: usize) -> String {
    if n.is_nan() {
        return if n.is_sign_negative() { "-nan" } else { "nan" }.into();
    }
    if n.is_infinite() {
        return if n < 0.0 { "-inf" } else { "inf" }.into();
    }
    if n == 0.0 {
        return if n.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let p = precision.max(1);
    let sci = format!("{:.*e}", p - 1, n);
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e}'s exponent is a number");
    if exp < -4 || exp >= p as i32 {
        let mantissa = trim_fraction(mantissa);
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    } else {
        let decimals = (p as i32 - 1 - exp).max(0) as usize;
        trim_fraction(&format!("{n:.decimals$}")).to_string()
    }
}

fn trim_fraction(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
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

// ------------------------------------------------------------- cmsgpack

/// Tables nested deeper than this pack as nil (so circular references end).
const MSGPACK_MAX_NESTING: u32 = 16;

fn cmsgpack(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.set(
        "pack",
        lib_fn(lua, |_, args: MultiValue| {
            if args.is_empty() {
                return Err(mlua::Error::runtime(
                    "bad argument #0 to '?' (MessagePack pack needs input.)",
                ));
            }
            let mut out = Vec::new();
            for v in args.iter() {
                pack(v, 0, &mut out)?;
            }
            Ok(BytesOut(out))
        })?,
    )?;
    t.set(
        "unpack",
        lib_fn(lua, |lua, s: LuaString| {
            unpack_full(lua, &s.as_bytes(), 0, 0)
        })?,
    )?;
    t.set(
        "unpack_one",
        lib_fn(lua, |lua, (s, offset): (LuaString, Option<i64>)| {
            unpack_full(lua, &s.as_bytes(), 1, offset.unwrap_or(0))
        })?,
    )?;
    t.set(
        "unpack_limit",
        lib_fn(
            lua,
            |lua, (s, limit, offset): (LuaString, i64, Option<i64>)| {
                unpack_full(lua, &s.as_bytes(), limit, offset.unwrap_or(0))
            },
        )?,
    )?;
    t.set("_NAME", "cmsgpack")?;
    t.set("_VERSION", "lua-cmsgpack 0.4.0")?;
    Ok(t)
}

fn pack(v: &Value, level: u32, out: &mut Vec<u8>) -> mlua::Result<()> {
    match v {
        Value::String(s) => pack_bytes(&s.as_bytes(), out),
        Value::Boolean(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        Value::Integer(i) => pack_int(*i, out),
        Value::Number(n) => {
            if n.is_finite() && (*n as i64) as f64 == *n {
                pack_int(*n as i64, out);
            } else if (*n as f32) as f64 == *n {
                out.push(0xca);
                out.extend_from_slice(&(*n as f32).to_be_bytes());
            } else {
                out.push(0xcb);
                out.extend_from_slice(&n.to_be_bytes());
            }
        }
        Value::Table(t) if level < MSGPACK_MAX_NESTING => pack_table(t, level, out)?,
        _ => out.push(0xc0),
    }
    Ok(())
}

fn pack_bytes(s: &[u8], out: &mut Vec<u8>) {
    let len = s.len();
    if len < 32 {
        out.push(0xa0 | len as u8);
    } else if len <= 0xff {
        out.extend_from_slice(&[0xd9, len as u8]);
    } else if len <= 0xffff {
        out.push(0xda);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
    out.extend_from_slice(s);
}

fn pack_int(n: i64, out: &mut Vec<u8>) {
    if n >= 0 {
        if n <= 127 {
            out.push(n as u8);
        } else if n <= 0xff {
            out.extend_from_slice(&[0xcc, n as u8]);
        } else if n <= 0xffff {
            out.push(0xcd);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        } else if n <= 0xffff_ffff {
            out.push(0xce);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        } else {
            out.push(0xcf);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    } else if n >= -32 {
        out.push(n as i8 as u8);
    } else if n >= -128 {
        out.extend_from_slice(&[0xd0, n as i8 as u8]);
    } else if n >= -32768 {
        out.push(0xd1);
        out.extend_from_slice(&(n as i16).to_be_bytes());
    } else if n >= -2_147_483_648 {
        out.push(0xd2);
        out.extend_from_slice(&(n as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

fn pack_table(t: &Table, level: u32, out: &mut Vec<u8>) -> mlua::Result<()> {
    let (mut count, mut max, mut array) = (0u64, 0u64, true);
    for pair in t.pairs::<Value, Value>() {
        let (k, _) = pair?;
        count += 1;
        let n = match k {
            Value::Integer(i) => i as f64,
            Value::Number(n) => n,
            _ => {
                array = false;
                continue;
            }
        };
        if n <= 0.0 || n.floor() != n || n > i32::MAX as f64 {
            array = false;
        } else {
            max = max.max(n as u64);
        }
    }
    if array && max == count {
        let len = t.raw_len();
        pack_header(len as u64, 0x90, 0xdc, 0xdd, out);
        for i in 1..=len {
            pack(&t.get::<Value>(i)?, level + 1, out)?;
        }
    } else {
        pack_header(count, 0x80, 0xde, 0xdf, out);
        for pair in t.pairs::<Value, Value>() {
            let (k, v) = pair?;
            pack(&k, level + 1, out)?;
            pack(&v, level + 1, out)?;
        }
    }
    Ok(())
}

/// An array's or map's header: fix form up to 15, then 16 or 32 bits.
fn pack_header(len: u64, fix: u8, sixteen: u8, thirty_two: u8, out: &mut Vec<u8>) {
    if len <= 15 {
        out.push(fix | len as u8);
    } else if len <= 0xffff {
        out.push(sixteen);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(thirty_two);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
}

/// Why a MessagePack input did not decode.
enum Unpacked {
    Missing,
    Bad,
    /// Nested past [`MAX_NESTING`], in Redis's words: where its Lua stack
    /// ran out (the decoder of arrays or of maps).
    TooDeep(&'static str),
}

fn unpack_full(lua: &Lua, s: &[u8], limit: i64, offset: i64) -> mlua::Result<MultiValue> {
    if offset < 0 || limit < 0 {
        return Err(mlua::Error::runtime(format!(
            "Invalid request to unpack with offset of {offset} and limit of {}.",
            s.len()
        )));
    }
    if offset as usize > s.len() {
        return Err(mlua::Error::runtime(format!(
            "Start offset {offset} greater than input length {}.",
            s.len()
        )));
    }
    let all = limit == 0 && offset == 0;
    let limit = if all { i64::MAX } else { limit };
    let mut at = offset as usize;
    let mut values = Vec::new();
    while at < s.len() && (values.len() as i64) < limit {
        match unpack_one(lua, s, &mut at, 0) {
            Ok(v) => values.push(v),
            Err(Unpacked::Missing) => return Err(mlua::Error::runtime("Missing bytes in input.")),
            Err(Unpacked::Bad) => return Err(mlua::Error::runtime("Bad data format in input.")),
            Err(Unpacked::TooDeep(function)) => {
                return Err(mlua::Error::runtime(format!(
                    "stack overflow (in function {function})"
                )))
            }
        }
    }
    if !all {
        let next = if at == s.len() { -1 } else { at as i64 };
        values.insert(0, Value::Integer(next));
    }
    Ok(MultiValue::from_iter(values))
}

fn take<'a>(s: &'a [u8], at: &mut usize, n: usize) -> Result<&'a [u8], Unpacked> {
    let bytes = s.get(*at..*at + n).ok_or(Unpacked::Missing)?;
    *at += n;
    Ok(bytes)
}

fn be(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
}

fn unpack_one(lua: &Lua, s: &[u8], at: &mut usize, depth: u32) -> Result<Value, Unpacked> {
    let lua_err = |_| Unpacked::Bad;
    let b = take(s, at, 1)?[0];
    let number = |n: f64| Ok(Value::Number(n));
    match b {
        0x00..=0x7f => number(f64::from(b)),
        0xe0..=0xff => number(f64::from(b as i8)),
        0xc0 => Ok(Value::Nil),
        0xc2 => Ok(Value::Boolean(false)),
        0xc3 => Ok(Value::Boolean(true)),
        0xcc => number(be(take(s, at, 1)?) as f64),
        0xcd => number(be(take(s, at, 2)?) as f64),
        0xce => number(be(take(s, at, 4)?) as f64),
        0xcf => number(be(take(s, at, 8)?) as f64),
        0xd0 => number(f64::from(take(s, at, 1)?[0] as i8)),
        0xd1 => number(f64::from(be(take(s, at, 2)?) as u16 as i16)),
        0xd2 => number(f64::from(be(take(s, at, 4)?) as u32 as i32)),
        0xd3 => number(be(take(s, at, 8)?) as i64 as f64),
        0xca => number(f64::from(f32::from_bits(be(take(s, at, 4)?) as u32))),
        0xcb => number(f64::from_bits(be(take(s, at, 8)?))),
        0xa0..=0xbf | 0xd9 | 0xda | 0xdb | 0xc4 | 0xc5 | 0xc6 => {
            let len = match b {
                0xa0..=0xbf => usize::from(b & 0x1f),
                0xd9 | 0xc4 => be(take(s, at, 1)?) as usize,
                0xda | 0xc5 => be(take(s, at, 2)?) as usize,
                _ => be(take(s, at, 4)?) as usize,
            };
            let bytes = take(s, at, len)?;
            Ok(Value::String(lua.create_string(bytes).map_err(lua_err)?))
        }
        0x90..=0x9f | 0xdc | 0xdd => {
            let len = match b {
                0x90..=0x9f => u64::from(b & 0x0f),
                0xdc => be(take(s, at, 2)?),
                _ => be(take(s, at, 4)?),
            };
            if depth >= MAX_NESTING {
                return Err(Unpacked::TooDeep("mp_decode_to_lua_array"));
            }
            let t = lua.create_table().map_err(lua_err)?;
            for i in 1..=len {
                let v = unpack_one(lua, s, at, depth + 1)?;
                t.raw_set(i, v).map_err(lua_err)?;
            }
            Ok(Value::Table(t))
        }
        0x80..=0x8f | 0xde | 0xdf => {
            let len = match b {
                0x80..=0x8f => u64::from(b & 0x0f),
                0xde => be(take(s, at, 2)?),
                _ => be(take(s, at, 4)?),
            };
            if depth >= MAX_NESTING {
                return Err(Unpacked::TooDeep("mp_decode_to_lua_hash"));
            }
            let t = lua.create_table().map_err(lua_err)?;
            for _ in 0..len {
                let k = unpack_one(lua, s, at, depth + 1)?;
                let v = unpack_one(lua, s, at, depth + 1)?;
                if !matches!(k, Value::Nil) {
                    t.raw_set(k, v).map_err(lua_err)?;
                }
            }
            Ok(Value::Table(t))
        }
        _ => Err(Unpacked::Bad),
    }
}

// ------------------------------------------------------------------ bit

/// A number as LuaBitOp reads it: rounded, wrapped to 32 bits.
fn tobit(n: f64) -> i32 {
    // Adding 2^52 + 2^51 puts the rounded integer in the low bits of the
    // double's mantissa, as LuaBitOp does.
    (n + 6_755_399_441_055_744.0).to_bits() as u32 as i32
}

fn bit(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.set("tobit", lib_fn(lua, |_, n: f64| Ok(tobit(n)))?)?;
    t.set("bnot", lib_fn(lua, |_, n: f64| Ok(!tobit(n)))?)?;
    t.set("bswap", lib_fn(lua, |_, n: f64| Ok(tobit(n).swap_bytes()))?)?;
    let fold = |f: fn(i32, i32) -> i32| {
        lib_fn(lua, move |_, (first, rest): (f64, Variadic<f64>)| {
            Ok(rest.iter().fold(tobit(first), |acc, &n| f(acc, tobit(n))))
        })
    };
    t.set("band", fold(|a, b| a & b)?)?;
    t.set("bor", fold(|a, b| a | b)?)?;
    t.set("bxor", fold(|a, b| a ^ b)?)?;
    let shift = |f: fn(i32, u32) -> i32| {
        lib_fn(lua, move |_, (n, by): (f64, f64)| {
            Ok(f(tobit(n), (tobit(by) & 31) as u32))
        })
    };
    t.set("lshift", shift(|a, by| ((a as u32) << by) as i32)?)?;
    t.set("rshift", shift(|a, by| ((a as u32) >> by) as i32)?)?;
    t.set("arshift", shift(|a, by| a >> by)?)?;
    t.set("rol", shift(|a, by| (a as u32).rotate_left(by) as i32)?)?;
    t.set("ror", shift(|a, by| (a as u32).rotate_right(by) as i32)?)?;
    t.set(
        "tohex",
        lib_fn(lua, |_, (n, digits): (f64, Option<f64>)| {
            let mut digits = digits.map_or(8, tobit);
            let upper = digits < 0;
            if upper {
                digits = -digits;
            }
            let digits = digits.clamp(1, 8) as usize;
            let v = tobit(n) as u32 as u64;
            let text = if upper {
                format!("{v:0digits$X}")
            } else {
                format!("{v:0digits$x}")
            };
            Ok(text[text.len() - digits..].to_string())
        })?,
    )?;
    Ok(t)
}

// --------------------------------------------------------------- struct

/// Widest integer `i`n / `I`n packs.
const STRUCT_MAX_INT_BYTES: usize = 32;
/// Alignment `!` sets without a number (a double's, on 64-bit Linux).
const STRUCT_MAX_ALIGN: usize = 8;

/// A format's running state: byte order and alignment.
struct Layout {
    little: bool,
    align: usize,
}

/// Reads a decimal count at `at` in `fmt`; `default` if there is none.
fn struct_count(fmt: &[u8], at: &mut usize, default: usize) -> Result<usize, String> {
    if !fmt.get(*at).is_some_and(u8::is_ascii_digit) {
        return Ok(default);
    }
    let mut n: usize = 0;
    while let Some(d) = fmt.get(*at).filter(|b| b.is_ascii_digit()) {
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(usize::from(d - b'0')))
            .filter(|&n| n <= i32::MAX as usize)
            .ok_or("integral size overflow")?;
        *at += 1;
    }
    Ok(n)
}

/// The size option `opt` takes (reading its count from `fmt`).
fn struct_size(opt: u8, fmt: &[u8], at: &mut usize) -> Result<usize, String> {
    Ok(match opt {
        b'b' | b'B' | b'x' => 1,
        b'h' | b'H' => 2,
        b'l' | b'L' | b'T' | b'd' => 8,
        b'f' => 4,
        b'c' => struct_count(fmt, at, 1)?,
        b'i' | b'I' => {
            let n = struct_count(fmt, at, 4)?;
            if n > STRUCT_MAX_INT_BYTES {
                return Err(format!(
                    "integral size {n} is larger than limit of {STRUCT_MAX_INT_BYTES}"
                ));
            }
            n
        }
        _ => 0,
    })
}

/// Padding before an item of `size` at offset `len`.
fn struct_padding(len: usize, layout: &Layout, opt: u8, size: usize) -> usize {
    if size == 0 || opt == b'c' {
        return 0;
    }
    let size = size.min(layout.align);
    (size.wrapping_sub(len & (size - 1))) & (size - 1)
}

/// Applies a control option (`>`, `<`, `!`n, space); `function` names the
/// caller in the error for an unknown option.
fn struct_control(
    opt: u8,
    fmt: &[u8],
    at: &mut usize,
    layout: &mut Layout,
    function: &str,
) -> Result<(), String> {
    match opt {
        b' ' => {}
        b'>' => layout.little = false,
        b'<' => layout.little = true,
        b'!' => {
            let a = struct_count(fmt, at, STRUCT_MAX_ALIGN)?;
            if !a.is_power_of_two() {
                return Err(format!("alignment {a} is not a power of 2"));
            }
            layout.align = a;
        }
        _ => {
            return Err(format!(
                "bad argument #1 to '{function}' (invalid format option '{}')",
                opt as char
            ))
        }
    }
    Ok(())
}

fn struct_pack(fmt: &[u8], args: &[Value]) -> Result<Vec<u8>, String> {
    let mut layout = Layout {
        little: true,
        align: 1,
    };
    let (mut out, mut at, mut arg) = (Vec::new(), 0usize, 0usize);
    let number = |arg: usize| -> Result<f64, String> {
        match args.get(arg) {
            Some(Value::Number(n)) => Ok(*n),
            Some(Value::Integer(i)) => Ok(*i as f64),
            Some(Value::String(s)) => s
                .to_str()
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .ok_or_else(|| {
                    format!(
                        "bad argument #{} to 'pack' (number expected, got string)",
                        arg + 2
                    )
                }),
            other => Err(format!(
                "bad argument #{} to 'pack' (number expected, got {})",
                arg + 2,
                other.map_or("no value", type_name)
            )),
        }
    };
    while at < fmt.len() {
        let opt = fmt[at];
        at += 1;
        let mut size = struct_size(opt, fmt, &mut at)?;
        let pad = struct_padding(out.len(), &layout, opt, size);
        out.resize(out.len() + pad, 0);
        match opt {
            b'b' | b'B' | b'h' | b'H' | b'l' | b'L' | b'T' | b'i' | b'I' => {
                let n = number(arg)?;
                arg += 1;
                let value = if n < 0.0 { n as i64 as u64 } else { n as u64 };
                let mut bytes: Vec<u8> = (0..size)
                    .map(|i| if i < 8 { (value >> (8 * i)) as u8 } else { 0 })
                    .collect();
                if !layout.little {
                    bytes.reverse();
                }
                out.extend_from_slice(&bytes);
            }
            b'x' => out.push(0),
            b'f' | b'd' => {
                let n = number(arg)?;
                arg += 1;
                let mut bytes = if opt == b'f' {
                    (n as f32).to_le_bytes().to_vec()
                } else {
                    n.to_le_bytes().to_vec()
                };
                if !layout.little {
                    bytes.reverse();
                }
                out.extend_from_slice(&bytes);
            }
            b'c' | b's' => {
                let text = match args.get(arg) {
                    Some(Value::String(s)) => s.as_bytes().to_vec(),
                    Some(v @ (Value::Number(_) | Value::Integer(_))) => {
                        lua_number_text(v).into_bytes()
                    }
                    other => {
                        return Err(format!(
                            "bad argument #{} to 'pack' (string expected, got {})",
                            arg + 2,
                            other.map_or("no value", type_name)
                        ))
                    }
                };
                arg += 1;
                if size == 0 {
                    size = text.len();
                }
                if text.len() < size {
                    return Err(format!(
                        "bad argument #{} to 'pack' (string too short)",
                        arg + 1
                    ));
                }
                out.extend_from_slice(&text[..size]);
                if opt == b's' {
                    out.push(0);
                }
            }
            _ => struct_control(opt, fmt, &mut at, &mut layout, "pack")?,
        }
    }
    Ok(out)
}

/// A number as a string argument reads it (Lua's `%.14g`).
fn lua_number_text(v: &Value) -> String {
    match v {
        Value::Integer(i) => i.to_string(),
        Value::Number(n) => format_g(*n, 14),
        _ => String::new(),
    }
}

#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: 4 bytes; 8 bytes"
)]
fn struct_unpack(lua: &Lua, fmt: &[u8], data: &[u8], start: i64) -> Result<MultiValue, String> {
    if start < 1 {
        return Err("bad argument #3 to 'unpack' (offset must be 1 or greater)".into());
    }
    let mut layout = Layout {
        little: true,
        align: 1,
    };
    let (mut pos, mut at) = (start as usize - 1, 0usize);
    let mut out: Vec<Value> = Vec::new();
    let lua_err = |e: mlua::Error| e.to_string();
    while at < fmt.len() {
        let opt = fmt[at];
        at += 1;
        let mut size = struct_size(opt, fmt, &mut at)?;
        pos += struct_padding(pos, &layout, opt, size);
        let short = || "bad argument #2 to 'unpack' (data string too short)".to_string();
        if size > data.len() || pos > data.len() - size {
            return Err(short());
        }
        match opt {
            b'b' | b'B' | b'h' | b'H' | b'l' | b'L' | b'T' | b'i' | b'I' => {
                let mut bytes = data[pos..pos + size].to_vec();
                if !layout.little {
                    bytes.reverse();
                }
                let mut value: u64 = 0;
                for (i, b) in bytes.iter().enumerate().take(8) {
                    value |= u64::from(*b) << (8 * i);
                }
                let n = if opt.is_ascii_lowercase() && (1..8).contains(&size) {
                    let shift = 64 - 8 * size as u32;
                    ((value << shift) as i64 >> shift) as f64
                } else if opt.is_ascii_lowercase() {
                    value as i64 as f64
                } else {
                    value as f64
                };
                out.push(Value::Number(n));
            }
            b'x' => {}
            b'f' | b'd' => {
                let mut bytes = data[pos..pos + size].to_vec();
                if !layout.little {
                    bytes.reverse();
                }
                let n = if opt == b'f' {
                    f64::from(f32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")))
                } else {
                    f64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"))
                };
                out.push(Value::Number(n));
            }
            b'c' => {
                if size == 0 {
                    size = match out.pop() {
                        Some(Value::Number(n)) if n >= 0.0 => n as usize,
                        _ => return Err("format 'c0' needs a previous size".into()),
                    };
                    if size > data.len() || pos > data.len() - size {
                        return Err(short());
                    }
                }
                out.push(Value::String(
                    lua.create_string(&data[pos..pos + size]).map_err(lua_err)?,
                ));
            }
            b's' => {
                let end = data[pos..]
                    .iter()
                    .position(|&b| b == 0)
                    .ok_or("unfinished string in data")?;
                size = end + 1;
                out.push(Value::String(
                    lua.create_string(&data[pos..pos + end]).map_err(lua_err)?,
                ));
            }
            _ => struct_control(opt, fmt, &mut at, &mut layout, "unpack")?,
        }
        pos += size;
    }
    out.push(Value::Integer(pos as i64 + 1));
    Ok(MultiValue::from_iter(out))
}

fn struct_fixed_size(fmt: &[u8]) -> Result<usize, String> {
    let mut layout = Layout {
        little: true,
        align: 1,
    };
    let (mut pos, mut at) = (0usize, 0usize);
    while at < fmt.len() {
        let opt = fmt[at];
        at += 1;
        let size = struct_size(opt, fmt, &mut at)?;
        pos += struct_padding(pos, &layout, opt, size);
        if opt == b's' {
            return Err("bad argument #1 to 'size' (option 's' has no fixed size)".into());
        }
        if opt == b'c' && size == 0 {
            return Err("bad argument #1 to 'size' (option 'c0' has no fixed size)".into());
        }
        if !opt.is_ascii_alphanumeric() {
            struct_control(opt, fmt, &mut at, &mut layout, "size")?;
        }
        pos += size;
    }
    Ok(pos)
}

fn structs(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.set(
        "pack",
        lib_fn(lua, |_, args: MultiValue| {
            let args: Vec<Value> = args.into_iter().collect();
            let Some(Value::String(fmt)) = args.first() else {
                return Err(mlua::Error::runtime(
                    "bad argument #1 to 'pack' (string expected)",
                ));
            };
            struct_pack(&fmt.as_bytes(), &args[1..])
                .map(BytesOut)
                .map_err(mlua::Error::runtime)
        })?,
    )?;
    t.set(
        "unpack",
        lib_fn(
            lua,
            |lua, (fmt, data, start): (LuaString, LuaString, Option<i64>)| {
                struct_unpack(lua, &fmt.as_bytes(), &data.as_bytes(), start.unwrap_or(1))
                    .map_err(mlua::Error::runtime)
            },
        )?,
    )?;
    t.set(
        "size",
        lib_fn(lua, |_, fmt: LuaString| {
            struct_fixed_size(&fmt.as_bytes()).map_err(mlua::Error::runtime)
        })?,
    )?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_g_prints_as_c_does() {
        for (n, want) in [
            (0.0003, "0.0003"),
            (1023.2, "1023.2"),
            (-5000.0, "-5000"),
            (100.0, "100"),
            (1e15, "1e+15"),
            (123456789012345.0, "1.2345678901234e+14"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (1.234567890123456, "1.2345678901235"),
        ] {
            assert_eq!(format_g(n, 14), want, "{n}");
        }
    }

    #[test]
    fn tobit_wraps_and_rounds_as_luabitop() {
        assert_eq!(tobit(1.0), 1);
        assert_eq!(tobit(4294967295.0), -1);
        assert_eq!(tobit(2147483648.0), i32::MIN);
        assert_eq!(tobit(-1.0), -1);
        assert_eq!(tobit(1.5), 2);
    }

    #[test]
    fn msgpack_integers_take_their_smallest_form() {
        let mut out = Vec::new();
        pack_int(-1_099_511_627_776, &mut out);
        assert_eq!(out, [0xd3, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x00]);
        out.clear();
        pack(&Value::Number(0.1), 0, &mut out).expect("packs");
        assert_eq!(out[0], 0xcb);
    }
}
