//! Replies to Lua values and back, as Redis converts them (RESP2 and
//! RESP3).

use super::error;
use crate::resp::Reply;
use mlua::{Lua, Table, Value};

/// A table with one field `name` holding `value` (RESP3's typed replies
/// as Lua sees them: `{double = 3.5}`, `{map = {...}}`).
pub(super) fn tagged(lua: &Lua, name: &str, value: Value) -> mlua::Result<Value> {
    let t = lua.create_table()?;
    t.set(name, value)?;
    Ok(Value::Table(t))
}

/// A reply as Lua sees it: RESP2's conversion, or (`resp3`, after
/// `redis.setresp(3)`) RESP3's, where maps, sets, doubles, big numbers
/// and verbatim strings are tables tagged with their type, booleans are
/// booleans and a null is nil.
pub(super) fn to_lua(lua: &Lua, reply: &Reply, resp3: bool) -> mlua::Result<Value> {
    let string = |b: &[u8]| -> mlua::Result<Value> { Ok(Value::String(lua.create_string(b)?)) };
    let sequence = |items: &mut dyn Iterator<Item = mlua::Result<Value>>| -> mlua::Result<Value> {
        let t = lua.create_table()?;
        for (i, item) in items.enumerate() {
            t.raw_set(i + 1, item?)?;
        }
        Ok(Value::Table(t))
    };
    let map = |pairs: &[(Reply, Reply)]| -> mlua::Result<Value> {
        let t = lua.create_table()?;
        for (k, v) in pairs {
            t.raw_set(to_lua(lua, k, resp3)?, to_lua(lua, v, resp3)?)?;
        }
        tagged(lua, "map", Value::Table(t))
    };
    let pair = |k: &Reply, v: &Reply| -> mlua::Result<Value> {
        sequence(&mut [to_lua(lua, k, resp3), to_lua(lua, v, resp3)].into_iter())
    };
    Ok(match reply {
        Reply::Integer(n) => Value::Number(*n as f64),
        Reply::Bulk(b) => string(b)?,
        Reply::Double(d) if resp3 => {
            tagged(lua, "double", Value::Number(d.parse().unwrap_or(0.0)))?
        }
        Reply::BigNumber(d) if resp3 => tagged(lua, "big_number", string(d.as_bytes())?)?,
        Reply::Double(d) | Reply::BigNumber(d) => string(d.as_bytes())?,
        Reply::Verbatim { format, text } if resp3 => {
            let t = lua.create_table()?;
            t.set("format", lua.create_string(format)?)?;
            t.set("string", lua.create_string(text)?)?;
            tagged(lua, "verbatim_string", Value::Table(t))?
        }
        Reply::Verbatim { text, .. } => string(text)?,
        Reply::Null | Reply::NullArray if resp3 => Value::Nil,
        Reply::Null | Reply::NullArray => Value::Boolean(false),
        Reply::Boolean(b) if resp3 => Value::Boolean(*b),
        Reply::Boolean(b) => Value::Number(f64::from(u8::from(*b))),
        Reply::Simple(s) => tagged(lua, "ok", string(s.as_bytes())?)?,
        Reply::Error(s) => tagged(lua, "err", string(s.as_bytes())?)?,
        Reply::Set(items) if resp3 => {
            let t = lua.create_table()?;
            for item in items {
                t.raw_set(to_lua(lua, item, resp3)?, true)?;
            }
            tagged(lua, "set", Value::Table(t))?
        }
        Reply::Array(items) | Reply::Set(items) | Reply::Push(items) => {
            sequence(&mut items.iter().map(|item| to_lua(lua, item, resp3)))?
        }
        Reply::Bulks(bulks) => sequence(&mut bulks.iter().map(string))?,
        Reply::Map(pairs) | Reply::KeyedArrays(pairs) if resp3 => map(pairs)?,
        Reply::Pairs(pairs) if resp3 => sequence(&mut pairs.iter().map(|(k, v)| pair(k, v)))?,
        Reply::Map(pairs) | Reply::Pairs(pairs) => sequence(
            &mut pairs
                .iter()
                .flat_map(|(k, v)| [to_lua(lua, k, resp3), to_lua(lua, v, resp3)]),
        )?,
        Reply::KeyedArrays(pairs) => sequence(&mut pairs.iter().map(|(k, v)| pair(k, v)))?,
        Reply::Attributed { reply, .. } => to_lua(lua, reply, resp3)?,
    })
}

/// How deep a script's reply may nest (deeper: Redis's error in its
/// place, as its Lua stack runs out).
const MAX_REPLY_DEPTH: usize = 1000;

/// A script's return value as a reply (Redis's conversion); `resp3`:
/// the script asked for RESP3 (`redis.setresp(3)`), so booleans are
/// booleans and typed tables become their RESP3 replies.
pub(super) fn from_lua(value: &Value, resp3: bool, depth: usize) -> Reply {
    if depth > MAX_REPLY_DEPTH {
        return error("ERR reached lua stack limit");
    }
    match value {
        Value::Nil => Reply::Null,
        Value::Boolean(b) if resp3 => Reply::Boolean(*b),
        Value::Boolean(true) => Reply::Integer(1),
        Value::Boolean(false) => Reply::Null,
        Value::Integer(i) => Reply::Integer(*i),
        Value::Number(n) => Reply::Integer(*n as i64),
        Value::String(s) => Reply::Bulk(s.as_bytes().to_vec()),
        Value::Table(t) => table_reply(t, resp3, depth),
        _ => Reply::Null,
    }
}

fn table_reply(t: &Table, resp3: bool, depth: usize) -> Reply {
    let field = |name: &str| t.raw_get::<Value>(name).unwrap_or(Value::Nil);
    let text = |v: &mlua::LuaString| v.to_string_lossy().to_string();
    if let Value::String(e) = field("err") {
        return Reply::Error(text(&e));
    }
    if let Value::String(s) = field("ok") {
        return Reply::Simple(text(&s));
    }
    if let Value::Number(n) = field("double") {
        return Reply::Double(crate::server::lua_libs::format_g(n, 17));
    }
    if let Value::String(s) = field("big_number") {
        return Reply::BigNumber(text(&s));
    }
    if let Value::Table(m) = field("map") {
        let pairs = m
            .pairs::<Value, Value>()
            .filter_map(Result::ok)
            .map(|(k, v)| {
                (
                    from_lua(&k, resp3, depth + 1),
                    from_lua(&v, resp3, depth + 1),
                )
            })
            .collect();
        return Reply::Map(pairs);
    }
    if let Value::Table(m) = field("set") {
        let members = m
            .pairs::<Value, Value>()
            .filter_map(Result::ok)
            .map(|(k, _)| from_lua(&k, resp3, depth + 1))
            .collect();
        return Reply::Set(members);
    }
    if let Value::Table(v) = field("verbatim_string") {
        let format = v.raw_get::<mlua::LuaString>("format");
        let body = v.raw_get::<mlua::LuaString>("string");
        if let (Ok(format), Ok(body)) = (format, body) {
            let format = format.as_bytes();
            if format.len() == 3 {
                return Reply::Verbatim {
                    format: [format[0], format[1], format[2]],
                    text: body.as_bytes().to_vec(),
                };
            }
        }
    }
    let mut items = Vec::new();
    for i in 1.. {
        match t.raw_get::<Value>(i) {
            Ok(Value::Nil) | Err(_) => break,
            Ok(v) => items.push(from_lua(&v, resp3, depth + 1)),
        }
    }
    Reply::Array(items)
}
