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

mod bit;
mod cjson;
mod cmsgpack;
mod structs;

use bit::bit;
use cjson::cjson;
use cmsgpack::cmsgpack;
use structs::structs;

use mlua::{Lua, Table, Value};

/// Deepest nesting JSON or MessagePack is read or written to (cjson's
/// default depth; a script may lower cjson's, not raise it): the readers
/// recurse, and the script thread's stack is not to run out.
const MAX_NESTING: u32 = 1000;

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

#[cfg(test)]
mod tests {
    use super::bit::tobit;
    use super::cmsgpack::{pack, pack_int};
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
