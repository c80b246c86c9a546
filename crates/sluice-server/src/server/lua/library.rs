//! Function libraries: loading one in a state of its own, the
//! `register_function` calls it makes, its shebang and flags.

use super::api::add_log_and_version;
use super::{
    find_call_error, lua_message, lua_string, new_state, CallError, Registered, FLAG_NAMES,
    KILL_CHECK_INSTRUCTIONS,
};
use mlua::{Lua, MultiValue, Table, Value};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Most functions one library may register.
const MAX_FUNCTIONS_PER_LIBRARY: usize = 1024;

/// Runs a library's `code` (after its `#!` line) to see what it
/// registers: with only `redis.register_function`, `redis.log` and the
/// version fields visible, and at most `timeout` long. Redis's error text
/// (after `ERR `) if it fails or registers nothing.
pub(in crate::server) fn load_library(
    code: &[u8],
    timeout: Duration,
) -> Result<Vec<Registered>, String> {
    let lua = new_state().map_err(|e| format!("starting Lua: {e}"))?;
    let (_, readonly) =
        crate::server::lua_libs::protect(&lua).map_err(|e| format!("starting Lua: {e}"))?;
    let deadline = Instant::now() + timeout;
    register(&lua, &readonly, code, Some(deadline))
}

/// [`load_library`] in `lua`; afterwards the functions see its globals.
pub(super) fn register(
    lua: &Lua,
    readonly: &mlua::Function,
    code: &[u8],
    deadline: Option<Instant>,
) -> Result<Vec<Registered>, String> {
    let found: Rc<RefCell<Vec<Registered>>> = Rc::default();
    let setup = || -> mlua::Result<(Table, Table)> {
        let api = lua.create_table()?;
        let load_redis = lua.create_table()?;
        let into = found.clone();
        load_redis.set(
            "register_function",
            lua.create_function(move |_, args: MultiValue| {
                let r = registration(args)
                    .map_err(|text| mlua::Error::external(CallError(format!("ERR {text}"), 0)))?;
                let mut into = into.borrow_mut();
                if into.iter().any(|f| f.name == r.name) {
                    return Err(mlua::Error::external(CallError(
                        "ERR Function already exists in the library".into(),
                        0,
                    )));
                }
                if into.len() >= MAX_FUNCTIONS_PER_LIBRARY {
                    return Err(mlua::Error::external(CallError(
                        format!(
                            "ERR a library registers at most {MAX_FUNCTIONS_PER_LIBRARY} functions"
                        ),
                        0,
                    )));
                }
                into.push(r);
                Ok(())
            })?,
        )?;
        add_log_and_version(lua, &load_redis)?;
        api.set("redis", readonly.call::<Table>(load_redis)?)?;
        // Anything else read while loading is an undeclared global.
        api.set_metatable(lua.globals().metatable())?;
        let env = readonly.call::<Table>(api)?;
        let meta = env
            .metatable()
            .ok_or_else(|| mlua::Error::runtime("a read-only view has a metatable"))?;
        Ok((env, meta))
    };
    let (env, meta) = setup().map_err(|e| format!("starting Lua: {e}"))?;
    let function = lua
        .load(code)
        .set_name("@user_function")
        .set_environment(env)
        .into_function()
        .map_err(|e| format!("Error compiling function: {}", lua_message(&e)))?;
    if let Some(deadline) = deadline {
        lua.set_hook(
            mlua::HookTriggers::new().every_nth_instruction(KILL_CHECK_INSTRUCTIONS),
            move |_, _| {
                if Instant::now() > deadline {
                    return Err(mlua::Error::external(CallError(
                        "ERR FUNCTION LOAD timeout".into(),
                        0,
                    )));
                }
                Ok(mlua::VmState::Continue)
            },
        )
        .ok();
    }
    let ran = function.call::<()>(());
    if deadline.is_some() {
        lua.remove_hook();
    }
    if let Err(e) = ran {
        let text = match find_call_error(&e) {
            Some(CallError(text, _)) => text.clone(),
            None => format!("ERR {}", lua_message(&e)),
        };
        return Err(format!("Error registering functions: {text}"));
    }
    // Called later, the functions see the whole API.
    meta.raw_set("__index", lua.globals())
        .map_err(|e| format!("starting Lua: {e}"))?;
    let registered = std::mem::take(&mut *found.borrow_mut());
    if registered.is_empty() {
        return Err("No functions registered".into());
    }
    Ok(registered)
}

/// `redis.register_function`'s arguments as Redis reads them: (name,
/// callback) or one table of named arguments.
fn registration(args: MultiValue) -> Result<Registered, &'static str> {
    let args: Vec<Value> = args.into_iter().collect();
    match &args[..] {
        [Value::Table(t)] => named_registration(t),
        [_] => Err("calling redis.register_function with a single argument is only applicable to Lua table (representing named arguments)."),
        [name, callback] => {
            let Some(name) = lua_string(name) else {
                return Err("first argument to redis.register_function must be a string");
            };
            let Value::Function(callback) = callback else {
                return Err("second argument to redis.register_function must be a function");
            };
            checked_function(name, None, 0, callback.clone())
        }
        _ => Err("wrong number of arguments to redis.register_function"),
    }
}

fn named_registration(t: &Table) -> Result<Registered, &'static str> {
    let (mut name, mut description, mut callback, mut flags) = (None, None, None, 0u8);
    for pair in t.pairs::<Value, Value>() {
        let Ok((key, value)) = pair else {
            return Err("named argument key given to redis.register_function is not a string");
        };
        let Some(key) = lua_string(&key) else {
            return Err("named argument key given to redis.register_function is not a string");
        };
        match &key.to_ascii_lowercase()[..] {
            "function_name" => {
                name = Some(lua_string(&value).ok_or(
                    "function_name argument given to redis.register_function must be a string",
                )?)
            }
            "description" => {
                description = Some(lua_string(&value).ok_or(
                    "description argument given to redis.register_function must be a string",
                )?)
            }
            "callback" => match value {
                Value::Function(f) => callback = Some(f),
                _ => {
                    return Err(
                        "callback argument given to redis.register_function must be a function",
                    )
                }
            },
            "flags" => {
                let Value::Table(list) = value else {
                    return Err("flags argument to redis.register_function must be a table representing function flags");
                };
                flags = flag_bits(&list).ok_or("unknown flag given")?;
            }
            _ => return Err("unknown argument given to redis.register_function"),
        }
    }
    let name = name.ok_or("redis.register_function must get a function name argument")?;
    let callback = callback.ok_or("redis.register_function must get a callback argument")?;
    checked_function(name, description.map(String::into_bytes), flags, callback)
}

fn checked_function(
    name: String,
    description: Option<Vec<u8>>,
    flags: u8,
    callback: mlua::Function,
) -> Result<Registered, &'static str> {
    if !valid_name(name.as_bytes()) {
        return Err("Library names can only contain letters, numbers, or underscores(_) and must be at least one character long");
    }
    Ok(Registered {
        name,
        description,
        flags,
        callback,
    })
}

/// The words of a script's or library's `#!` line, and where the line
/// ends (its newline, kept with the code so line numbers stay right);
/// None if there is no newline.
pub(in crate::server) fn shebang_words(
    code: &[u8],
) -> Option<(usize, impl Iterator<Item = &[u8]>)> {
    let end = code.iter().position(|&b| b == b'\n')?;
    let words = code[..end]
        .split(u8::is_ascii_whitespace)
        .filter(|w| !w.is_empty());
    Some((end, words))
}

/// Redis's names of libraries and functions: letters, digits, `_`.
pub(in crate::server) fn valid_name(name: &[u8]) -> bool {
    !name.is_empty() && name.iter().all(|&b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A list of flag names as bits; None if one is unknown.
fn flag_bits(list: &Table) -> Option<u8> {
    let mut bits = 0u8;
    for item in list.sequence_values::<Value>() {
        let name = lua_string(&item.ok()?)?;
        let at = FLAG_NAMES.iter().position(|f| *f == name)?;
        bits |= 1 << at;
    }
    Some(bits)
}

/// Flags named by `flags=a,b` in an EVAL script's `#!lua` line.
pub(in crate::server) fn flag_bits_of(list: &[u8]) -> Result<u8, String> {
    let mut bits = 0u8;
    if list.is_empty() {
        return Ok(0);
    }
    for name in list.split(|&b| b == b',') {
        match FLAG_NAMES.iter().position(|f| f.as_bytes() == name) {
            Some(at) => bits |= 1 << at,
            None => {
                return Err(format!(
                    "Unexpected flag in script shebang: {}",
                    String::from_utf8_lossy(name)
                ))
            }
        }
    }
    Ok(bits)
}
