//! The Lua engine under EVAL and FCALL: Lua 5.1 as Redis embeds it
//! (mlua, its own copy of Lua 5.1 built in: Redis scripts are written for
//! 5.1's semantics, and a vendored build needs no system library). Each
//! run gets a fresh Lua state, so nothing one script leaves behind is
//! seen by the next.
//!
//! `redis.call` and `redis.pcall` run the data commands (and PUBLISH);
//! replies convert as Redis converts them: integers to numbers, bulk
//! strings to strings, nulls to false, arrays to tables, status replies
//! to `{ok=...}` and errors to `{err=...}`; the script's return value
//! converts back the same way. Also `redis.error_reply`,
//! `redis.status_reply`, `redis.sha1hex` and `redis.log`.
//!
//! A function library's code runs with only `redis.register_function`,
//! `redis.log` and the version fields visible (as Redis loads libraries);
//! the functions it registers see the whole API when they are called.

use super::Shared;
use crate::acl::User;
use crate::commands::{self, Ctx};
use crate::resp::{Args, Reply};
use mlua::{Lua, LuaOptions, MultiValue, StdLib, Table, Value};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The error a killed script ends with (its line and name are added as
/// for any script error).
const KILLED: &str = "ERR Script killed by user with SCRIPT KILL...";

/// How often (in Lua VM instructions) a running script looks whether it
/// was asked to stop.
const KILL_CHECK_INSTRUCTIONS: u32 = 10_000;

/// How long a library's code may take to register its functions (Redis's
/// `LOAD_TIMEOUT_MS`).
pub(super) const LOAD_TIMEOUT: Duration = Duration::from_millis(500);

/// Most functions one library may register.
const MAX_FUNCTIONS_PER_LIBRARY: usize = 1024;

/// A script's flags (Redis's `scripts_flags_def`, in its order: the
/// order FUNCTION LIST names them in).
pub(super) const FLAG_NAMES: [&str; 5] = [
    "no-writes",
    "allow-oom",
    "allow-stale",
    "no-cluster",
    "allow-cross-slot-keys",
];

/// The bit of `no-writes` in a flag set (bit i: `FLAG_NAMES[i]`).
pub(super) const NO_WRITES: u8 = 1;

/// What one run executes.
pub(super) struct Program<'a> {
    /// The script (EVAL), or a library's code after its `#!` line (FCALL).
    pub(super) body: &'a [u8],
    /// FCALL: the function of the library to call with (KEYS, ARGV).
    pub(super) function: Option<&'a str>,
    /// What errors name: the script's sha, or the function's name.
    pub(super) name: &'a str,
}

impl Program<'_> {
    /// The chunk name errors give the script's lines under.
    fn source(&self) -> &'static str {
        if self.function.is_some() {
            "user_function"
        } else {
            "user_script"
        }
    }
}

/// One run: what it runs, with which keys and arguments, as whom.
#[derive(Clone, Copy)]
pub(super) struct Run<'a> {
    /// Set to stop it (SCRIPT KILL, FUNCTION KILL, a shutdown).
    pub(super) kill: &'a Arc<AtomicBool>,
    pub(super) program: &'a Program<'a>,
    pub(super) keys: &'a [Vec<u8>],
    pub(super) argv: &'a [Vec<u8>],
    /// Write commands are refused (EVAL_RO, `no-writes`).
    pub(super) read_only: bool,
    /// The user it runs as; None: one who may run everything.
    pub(super) user: Option<&'a User>,
}

/// A function a library's code registered.
pub(super) struct Registered {
    pub(super) name: String,
    pub(super) description: Option<Vec<u8>>,
    /// Bit i: `FLAG_NAMES[i]`.
    pub(super) flags: u8,
    callback: mlua::Function,
}

/// Why a script's command raised: its error reply's text, and the
/// script's line that called it.
#[derive(Debug)]
struct CallError(String, i32);

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The line of the script that called into Rust now.
fn caller_line(lua: &Lua) -> i32 {
    lua.inspect_stack(1, |d| d.current_line())
        .flatten()
        .map_or(0, |l| l as i32)
}

impl std::error::Error for CallError {}

/// An error of a library function (cjson, cmsgpack, bit): a Lua error
/// message, the caller's position first.
#[derive(Debug)]
pub(super) struct LibError(pub(super) String);

impl std::fmt::Display for LibError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LibError {}

/// An error a Rust function raised, as a Lua string (`pcall` hands the
/// script Redis's error text or a library's message); anything else as
/// it is.
pub(super) fn error_value(lua: &Lua, v: Value) -> mlua::Result<Value> {
    let Value::Error(e) = &v else {
        return Ok(v);
    };
    let text = match (find_call_error(e), find_lib_error(e)) {
        (Some(CallError(text, _)), _) | (None, Some(LibError(text))) => text.clone(),
        (None, None) => lua_message(e),
    };
    Ok(Value::String(lua.create_string(text)?))
}

/// The error of type `T` a Rust function raised, under mlua's wrapping.
fn find_external<T: std::error::Error + 'static>(e: &mlua::Error) -> Option<&T> {
    match e {
        mlua::Error::ExternalError(inner) => inner.downcast_ref::<T>(),
        mlua::Error::CallbackError { cause, .. } => find_external(cause),
        mlua::Error::WithContext { cause, .. } => find_external(cause),
        _ => None,
    }
}

fn find_lib_error(e: &mlua::Error) -> Option<&LibError> {
    find_external(e)
}

/// A Lua state with the libraries Redis gives scripts.
fn new_state() -> mlua::Result<Lua> {
    Lua::new_with(
        StdLib::TABLE | StdLib::STRING | StdLib::MATH,
        LuaOptions::default(),
    )
}

/// Most compiled scripts, and loaded libraries, an engine keeps (past
/// it, it forgets them all and compiles again as they come).
const MAX_COMPILED: usize = 10_000;

/// A thread's Lua state, kept across runs as Redis keeps its one: the
/// script thread's, and a worker's for scripts inside EXEC. Scripts are
/// compiled once (by sha) and libraries loaded once (by their code's
/// sha); SCRIPT FLUSH and FUNCTION changes start a new one.
struct Engine {
    lua: Lua,
    /// The `redis` table behind its read-only view: `call` and `pcall`
    /// are set in it for each run.
    redis: Table,
    env: Table,
    readonly: mlua::Function,
    scripts: HashMap<String, mlua::Function>,
    libraries: HashMap<String, Vec<Registered>>,
    /// The run asked for RESP3 (`redis.setresp(3)`); false at each start.
    resp3: Rc<Cell<bool>>,
    /// [`super::scripting::Scripts::generation`] when it was made.
    generation: u64,
}

thread_local! {
    static ENGINE: RefCell<Option<Engine>> = const { RefCell::new(None) };
}

impl Engine {
    fn new(generation: u64) -> mlua::Result<Engine> {
        let lua = new_state()?;
        let redis = lua.create_table()?;
        add_script_api(&lua, &redis)?;
        let resp3 = Rc::new(Cell::new(false));
        let set = resp3.clone();
        redis.set(
            "setresp",
            lua.create_function(move |lua, args: MultiValue| {
                let line = caller_line(lua);
                let fail = |text: &str| Err(mlua::Error::external(CallError(text.into(), line)));
                if args.len() != 1 {
                    return fail("ERR redis.setresp() requires one argument.");
                }
                match lua_string(&args[0]).as_deref() {
                    Some("2") => set.set(false),
                    Some("3") => set.set(true),
                    _ => return fail("ERR RESP version must be 2 or 3."),
                }
                Ok(())
            })?,
        )?;
        lua.globals().set("redis", redis.clone())?;
        super::lua_libs::install(&lua)?;
        let (env, readonly) = super::lua_libs::protect(&lua)?;
        Ok(Engine {
            lua,
            redis,
            env,
            readonly,
            scripts: HashMap::new(),
            libraries: HashMap::new(),
            resp3,
            generation,
        })
    }

    /// EVAL's script compiled; Err: Redis's reply to a script that does
    /// not compile.
    fn script(&mut self, program: &Program<'_>) -> Result<mlua::Function, Reply> {
        if let Some(f) = self.scripts.get(program.name) {
            return Ok(f.clone());
        }
        let compiled = self
            .lua
            .load(program.body)
            .set_name("@user_script")
            .set_environment(self.env.clone())
            .into_function()
            .map_err(|e| {
                Reply::Error(format!(
                    "ERR Error compiling script (new function): {}",
                    lua_message(&e)
                ))
            })?;
        if self.scripts.len() >= MAX_COMPILED {
            self.scripts.clear();
        }
        self.scripts
            .insert(program.name.to_string(), compiled.clone());
        Ok(compiled)
    }

    /// FCALL's function, its library loaded if it is not yet.
    fn function(&mut self, program: &Program<'_>, name: &str) -> Result<mlua::Function, Reply> {
        let key = super::scripting::sha1_hex(program.body);
        if !self.libraries.contains_key(&key) {
            let registered = register(&self.lua, &self.readonly, program.body, None)
                .map_err(|text| Reply::Error(format!("ERR {text}")))?;
            if self.libraries.len() >= MAX_COMPILED {
                self.libraries.clear();
            }
            self.libraries.insert(key.clone(), registered);
        }
        self.libraries[&key]
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.callback.clone())
            .ok_or_else(|| error("ERR Function not found"))
    }
}

/// Runs `program` against `ctx`: its reply (a script error as Redis
/// words it). `kill` set stops it between instructions; once set, every
/// check raises again, so a `pcall` in a loop cannot keep it alive.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: made above"
)]
pub(super) fn run(shared: &Shared, job: &Run<'_>, ctx: &mut Ctx<'_>) -> Reply {
    ENGINE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let generation = shared.scripts.generation();
        if slot.as_ref().is_none_or(|e| e.generation != generation) {
            *slot = None;
            match Engine::new(generation) {
                Ok(engine) => *slot = Some(engine),
                Err(e) => return Reply::Error(format!("ERR starting Lua: {e}")),
            }
        }
        let engine = slot.as_mut().expect("made above");
        let reply = run_in(engine, shared, job, ctx);
        shared
            .scripts
            .note_lua_memory(engine.lua.used_memory() as u64);
        reply
    })
}

fn run_in(engine: &mut Engine, shared: &Shared, job: &Run<'_>, ctx: &mut Ctx<'_>) -> Reply {
    let Run {
        kill,
        program,
        keys,
        argv,
        read_only,
        user,
    } = *job;
    let stop = kill.clone();
    engine
        .lua
        .set_hook(
            mlua::HookTriggers::new().every_nth_instruction(KILL_CHECK_INSTRUCTIONS),
            move |lua, _| {
                if !stop.load(Ordering::Acquire) {
                    return Ok(mlua::VmState::Continue);
                }
                // From now on every line raises, as Redis does: a pcall in
                // a loop catches the error where it was raised, but not on
                // the loop's own lines.
                let again = stop.clone();
                let _ = lua.set_hook(mlua::HookTriggers::EVERY_LINE, move |_, _| {
                    if again.load(Ordering::Acquire) {
                        return Err(mlua::Error::external(CallError(KILLED.into(), 0)));
                    }
                    Ok(mlua::VmState::Continue)
                });
                Err(mlua::Error::external(CallError(KILLED.into(), 0)))
            },
        )
        .ok();
    let entry = match program.function {
        None => engine.script(program),
        Some(name) => engine.function(program, name),
    };
    let entry = match entry {
        Ok(f) => f,
        Err(reply) => return reply,
    };
    let lua = &engine.lua;
    let redis = &engine.redis;
    let resp3 = &engine.resp3;
    resp3.set(false);
    let ctx = RefCell::new(ctx);
    let outcome = lua.scope(|scope| {
        let globals = lua.globals();
        globals.raw_set("__sluice_raised", Value::Nil)?;
        let call = |raise: bool| {
            let ctx = &ctx;
            scope.create_function_mut(move |lua, vals: MultiValue| {
                let line = caller_line(lua);
                let args = command_args(vals, line)?;
                let reply = call_command(shared, &mut ctx.borrow_mut(), &args, read_only, user);
                if raise {
                    if let Reply::Error(text) = &reply {
                        return Err(mlua::Error::external(CallError(text.clone(), line)));
                    }
                }
                to_lua(lua, &reply, resp3.get())
            })
        };
        redis.raw_set("call", call(true)?)?;
        redis.raw_set("pcall", call(false)?)?;
        redis.raw_set(
            "acl_check_cmd",
            scope.create_function(move |lua, vals: MultiValue| {
                let line = caller_line(lua);
                let args = command_args(vals, line)?;
                let Some(id) = crate::acl::resolve(&args) else {
                    return Err(mlua::Error::external(CallError(
                        "ERR Invalid command passed to redis.acl_check_cmd()".into(),
                        line,
                    )));
                };
                Ok(user.is_none_or(|u| u.check(id, &args).is_ok()))
            })?,
        )?;
        let keys = sequence(lua, keys)?;
        let argv = sequence(lua, argv)?;
        let result = if program.function.is_none() {
            globals.raw_set("KEYS", keys)?;
            globals.raw_set("ARGV", argv)?;
            entry.call::<Value>(())
        } else {
            globals.raw_set("KEYS", Value::Nil)?;
            globals.raw_set("ARGV", Value::Nil)?;
            entry.call::<Value>((keys, argv))
        };
        Ok(match result {
            Ok(value) => from_lua(&value, resp3.get(), 0),
            Err(e) => {
                let raised: Option<Table> = globals.raw_get("__sluice_raised").ok();
                script_error(&e, raised, program)
            }
        })
    });
    // The scope's functions are gone: what a script kept of them fails.
    let _ = redis.raw_set("call", Value::Nil);
    let _ = redis.raw_set("pcall", Value::Nil);
    let _ = redis.raw_set("acl_check_cmd", Value::Nil);
    engine.lua.remove_hook();
    outcome.unwrap_or_else(|e| Reply::Error(format!("ERR running the script: {e}")))
}

/// Runs a library's `code` (after its `#!` line) to see what it
/// registers: with only `redis.register_function`, `redis.log` and the
/// version fields visible, and at most `timeout` long. Redis's error text
/// (after `ERR `) if it fails or registers nothing.
pub(super) fn load_library(code: &[u8], timeout: Duration) -> Result<Vec<Registered>, String> {
    let lua = new_state().map_err(|e| format!("starting Lua: {e}"))?;
    let (_, readonly) = super::lua_libs::protect(&lua).map_err(|e| format!("starting Lua: {e}"))?;
    let deadline = Instant::now() + timeout;
    register(&lua, &readonly, code, Some(deadline))
}

/// [`load_library`] in `lua`; afterwards the functions see its globals.
fn register(
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
pub(super) fn shebang_words(code: &[u8]) -> Option<(usize, impl Iterator<Item = &[u8]>)> {
    let end = code.iter().position(|&b| b == b'\n')?;
    let words = code[..end]
        .split(u8::is_ascii_whitespace)
        .filter(|w| !w.is_empty());
    Some((end, words))
}

/// Redis's names of libraries and functions: letters, digits, `_`.
pub(super) fn valid_name(name: &[u8]) -> bool {
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
pub(super) fn flag_bits_of(list: &[u8]) -> Result<u8, String> {
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

/// A Lua string or number as Rust text (Lua's `lua_isstring`).
fn lua_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.to_string_lossy().to_string()),
        Value::Integer(i) => Some(i.to_string()),
        Value::Number(n) => Some(lua_number(*n)),
        _ => None,
    }
}

/// A Lua error's own message: its first line, without mlua's wrapping.
fn lua_message(e: &mlua::Error) -> String {
    let text = match e {
        mlua::Error::SyntaxError { message, .. } => message.clone(),
        mlua::Error::RuntimeError(m) => m.clone(),
        mlua::Error::CallbackError { cause, .. } => return lua_message(cause),
        other => other.to_string(),
    };
    text.lines().next().unwrap_or_default().to_string()
}

fn sequence(lua: &Lua, items: &[Vec<u8>]) -> mlua::Result<Table> {
    lua.create_sequence_from(
        items
            .iter()
            .map(|k| lua.create_string(k))
            .collect::<mlua::Result<Vec<_>>>()?,
    )
}

/// `redis.error_reply`, `status_reply`, `sha1hex`, and what a library's
/// code sees too ([`add_log_and_version`]).
fn add_script_api(lua: &Lua, redis: &Table) -> mlua::Result<()> {
    redis.set(
        "error_reply",
        lua.create_function(|lua, args: MultiValue| {
            let Some(msg) = one_string(&args) else {
                return tagged(
                    lua,
                    "err",
                    Value::String(lua.create_string("ERR wrong number or type of arguments")?),
                );
            };
            // As Redis: a code is the first word; without one, ERR.
            let msg = msg.as_bytes();
            let text: Vec<u8> = match msg.strip_prefix(b"-").unwrap_or(&msg) {
                rest if msg.starts_with(b"-") && rest.contains(&b' ') => rest.to_vec(),
                rest if msg.starts_with(b"-") => [&b"ERR "[..], rest].concat(),
                _ if msg.contains(&b' ') => msg.to_vec(),
                _ => [&b"ERR "[..], &msg].concat(),
            };
            let text = trim_line_end(&text);
            tagged(lua, "err", Value::String(lua.create_string(text)?))
        })?,
    )?;
    redis.set(
        "status_reply",
        lua.create_function(|lua, args: MultiValue| match one_string(&args) {
            Some(msg) => tagged(lua, "ok", Value::String(msg)),
            None => tagged(
                lua,
                "err",
                Value::String(lua.create_string("ERR wrong number or type of arguments")?),
            ),
        })?,
    )?;
    redis.set(
        "sha1hex",
        lua.create_function(|lua, args: MultiValue| {
            if args.len() != 1 {
                let line = caller_line(lua);
                return Err(mlua::Error::external(CallError(
                    "ERR wrong number of arguments".into(),
                    line,
                )));
            }
            let text = match &args[0] {
                Value::String(s) => s.as_bytes().to_vec(),
                other => lua_string(other).unwrap_or_default().into_bytes(),
            };
            Ok(super::scripting::sha1_hex(&text))
        })?,
    )?;
    add_log_and_version(lua, redis)
}

/// The only argument, if it is one string.
fn one_string(args: &MultiValue) -> Option<mlua::LuaString> {
    match args.iter().collect::<Vec<_>>()[..] {
        [Value::String(s)] => Some(s.clone()),
        _ => None,
    }
}

fn trim_line_end(text: &[u8]) -> &[u8] {
    let end = text
        .iter()
        .rposition(|&b| b != b'\r' && b != b'\n')
        .map_or(0, |p| p + 1);
    &text[..end]
}

/// `redis.log`, its levels, and the version fields.
fn add_log_and_version(lua: &Lua, redis: &Table) -> mlua::Result<()> {
    redis.set("log", lua.create_function(|_, _: MultiValue| Ok(()))?)?;
    for (name, level) in [
        ("LOG_DEBUG", 0),
        ("LOG_VERBOSE", 1),
        ("LOG_NOTICE", 2),
        ("LOG_WARNING", 3),
    ] {
        redis.set(name, level)?;
    }
    redis.set("REDIS_VERSION", "7.0.15")?;
    redis.set("REDIS_VERSION_NUM", 0x0007_000f)?;
    Ok(())
}

/// A script's failure as Redis 7.0 words it: the error (a command's
/// error reply, a table's `err`, or `ERR` and Lua's message), then
/// ` script: <name>, on @<source>:<line>.`.
fn script_error(e: &mlua::Error, raised: Option<Table>, program: &Program<'_>) -> Reply {
    let source = program.source();
    let (text, line) = if let Some(CallError(text, line)) = find_call_error(e) {
        (text.clone(), *line)
    } else if let Some(LibError(text)) = find_lib_error(e) {
        (format!("ERR {text}"), script_line(text, source))
    } else {
        let message = match e {
            mlua::Error::RuntimeError(m) => m.clone(),
            other => other.to_string(),
        };
        let line = script_line(&message, source);
        match raised.and_then(|t| t.raw_get::<mlua::LuaString>("err").ok()) {
            Some(err) => (err.to_string_lossy().to_string(), line),
            None => {
                let first = message.lines().next().unwrap_or_default();
                (format!("ERR {first}"), line)
            }
        }
    };
    Reply::Error(format!(
        "{text} script: {}, on @{source}:{line}.",
        program.name
    ))
}

/// The first `<source>:N:` line number in a Lua error and traceback.
fn script_line(message: &str, source: &str) -> i32 {
    let marker = format!("{source}:");
    message
        .split(marker.as_str())
        .skip(1)
        .find_map(|rest| rest.split(':').next()?.parse().ok())
        .unwrap_or(0)
}

fn find_call_error(e: &mlua::Error) -> Option<&CallError> {
    find_external(e)
}

/// A command's arguments from Lua: strings as they are, numbers as Lua
/// prints them; anything else is Redis's error.
fn command_args(vals: MultiValue, line: i32) -> mlua::Result<Args> {
    if vals.is_empty() {
        return Err(mlua::Error::external(CallError(
            "ERR Please specify at least one argument for this redis lib call".into(),
            line,
        )));
    }
    let mut out = Vec::with_capacity(vals.len());
    for v in vals {
        match v {
            Value::String(s) => out.push(s.as_bytes().to_vec()),
            Value::Integer(i) => out.push(i.to_string().into_bytes()),
            Value::Number(n) => out.push(lua_number(n).into_bytes()),
            _ => {
                return Err(mlua::Error::external(CallError(
                    "ERR Lua redis lib command arguments must be strings or integers".into(),
                    line,
                )))
            }
        }
    }
    Ok(out)
}

/// A number as Lua 5.1's `tostring` prints it (`%.14g`).
fn lua_number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        return format!("{}", n as i64);
    }
    let s = format!("{n:.13e}");
    let v: f64 = s.parse().unwrap_or(n);
    format!("{v}")
}

/// Runs one command from a script, after Redis's checks (its
/// `scriptCall`), in its order.
fn call_command(
    shared: &Shared,
    ctx: &mut Ctx<'_>,
    args: &Args,
    read_only: bool,
    user: Option<&User>,
) -> Reply {
    let Some(id) = crate::acl::resolve(args) else {
        return error("ERR Unknown Redis command called from script");
    };
    if !crate::acl::arity_fits(id, args.len()) {
        return error("ERR Wrong number of args calling Redis command from script");
    }
    if crate::acl::no_script(id) {
        return error("ERR This Redis command is not allowed from script");
    }
    if let Some(Err(denied)) = user.map(|u| u.check(id, args)) {
        return error(match denied {
            crate::acl::Denied::Command => {
                "ERR The user executing the script can't run this command or subcommand"
            }
            crate::acl::Denied::Key(_) => "ERR The user executing the script can't access at least one of the keys mentioned in the command arguments",
        });
    }
    let write = crate::acl::is_write(id);
    if crate::acl::is_read(id) {
        shared.scripts.note_read();
    }
    // Redis's CMD_MAY_REPLICATE: refused from a read-only script too.
    let may_replicate = matches!(crate::acl::name_of(id), "publish" | "spublish" | "pfcount");
    if read_only && (write || may_replicate) {
        return error("ERR Write commands are not allowed from read-only scripts.");
    }
    if write && shared.tunables.writes_need_replicas() && !shared.scripts.wrote() {
        return error(super::dispatch::NO_REPLICAS);
    }
    if write {
        // From now on SCRIPT KILL cannot stop it (Redis marks the script
        // before the command runs, whatever it answers).
        shared.scripts.note_write();
    }
    if shared.monitors.any() {
        shared.monitors.feed(0, "lua", args);
    }
    // Counted in INFO commandstats as Redis counts a script's commands, in
    // the scripts' own slot of the counters (scripts run one at a time).
    let started = std::time::Instant::now();
    let reply = run_checked(shared, ctx, args);
    let failed = matches!(reply, Reply::Error(_)).then_some(false);
    let us = started.elapsed().as_micros() as u64;
    super::dispatch::count_call(shared, shared.stats.scripts_slot(), id, us, failed);
    reply
}

/// Runs one command from a script once [`call_command`]'s checks passed.
fn run_checked(shared: &Shared, ctx: &mut Ctx<'_>, args: &Args) -> Reply {
    let name = args[0].to_ascii_lowercase();
    if name == b"publish" || name == b"spublish" {
        return Reply::Integer(
            shared
                .pubsub
                .publish(&args[1], &args[2], name == b"spublish"),
        );
    }
    let blocking_read = name == b"xread" || name == b"xreadgroup";
    if blocking_read && args.iter().any(|a| a.eq_ignore_ascii_case(b"block")) {
        return Reply::Error(format!(
            "ERR {} command is not allowed with BLOCK option from scripts",
            String::from_utf8_lossy(&name)
        ));
    }
    match &name[..] {
        b"select" => {
            // The script's own database: its caller's stays as it was.
            return match crate::session::select(&args[1]) {
                Ok(db) => match ctx.select(db) {
                    Ok(()) => Reply::Simple("OK".into()),
                    Err(e) => commands::failure_reply(e.into()),
                },
                Err(refused) => refused,
            };
        }
        b"ping" if args.len() == 1 => return Reply::Simple("PONG".into()),
        b"ping" | b"echo" => return Reply::Bulk(args[1].clone()),
        b"time" => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            return Reply::Array(vec![
                Reply::Bulk(now.as_secs().to_string().into_bytes()),
                Reply::Bulk(now.subsec_micros().to_string().into_bytes()),
            ]);
        }
        _ => {}
    }
    if !commands::known(&name) {
        return Reply::Error(format!(
            "ERR Sluice runs only data commands from scripts, and '{}' is not one",
            String::from_utf8_lossy(&name)
        ));
    }
    let reply = commands::execute(ctx, &name, args);
    // Published once the script's (or its transaction's) writes are.
    super::notify::hold(args, ctx.take_changes());
    reply
}

/// A table with one field `name` holding `value` (RESP3's typed replies
/// as Lua sees them: `{double = 3.5}`, `{map = {...}}`).
fn tagged(lua: &Lua, name: &str, value: Value) -> mlua::Result<Value> {
    let t = lua.create_table()?;
    t.set(name, value)?;
    Ok(Value::Table(t))
}

/// A reply as Lua sees it: RESP2's conversion, or (`resp3`, after
/// `redis.setresp(3)`) RESP3's, where maps, sets, doubles, big numbers
/// and verbatim strings are tables tagged with their type, booleans are
/// booleans and a null is nil.
fn to_lua(lua: &Lua, reply: &Reply, resp3: bool) -> mlua::Result<Value> {
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
fn from_lua(value: &Value, resp3: bool, depth: usize) -> Reply {
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
        return Reply::Double(super::lua_libs::format_g(n, 17));
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

fn error(text: &str) -> Reply {
    Reply::Error(text.to_string())
}
