//! `cmsgpack`: MessagePack as lua-cmsgpack 0.4 packs and unpacks it.

use super::MAX_NESTING;
use super::{lib_fn, BytesOut};
use mlua::{Lua, LuaString, MultiValue, Table, Value};

/// Tables nested deeper than this pack as nil (so circular references end).
const MSGPACK_MAX_NESTING: u32 = 16;

pub(super) fn cmsgpack(lua: &Lua) -> mlua::Result<Table> {
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

pub(super) fn pack(v: &Value, level: u32, out: &mut Vec<u8>) -> mlua::Result<()> {
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

pub(super) fn pack_int(n: i64, out: &mut Vec<u8>) {
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
