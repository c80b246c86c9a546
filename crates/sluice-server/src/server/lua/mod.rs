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
//!
//! Rooms: `api` (the `redis` table), `convert` (replies to Lua values and
//! back), `library` (loading function libraries).

mod api;
mod convert;
mod library;

use api::{add_script_api, call_command, command_args, lua_number, sequence};
use convert::{from_lua, to_lua};
use library::register;
pub(super) use library::{flag_bits_of, load_library, shebang_words, valid_name};

use super::Shared;
use crate::acl::User;
use crate::commands::Ctx;
use crate::resp::Reply;
use mlua::{Lua, LuaOptions, MultiValue, StdLib, Table, Value};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The error a killed script ends with (its line and name are added as
/// for any script error).
const KILLED: &str = "ERR Script killed by user with SCRIPT KILL...";

/// How often (in Lua VM instructions) a running script looks whether it
/// was asked to stop.
const KILL_CHECK_INSTRUCTIONS: u32 = 10_000;

/// How long a library's code may take to register its functions (Redis's
/// `LOAD_TIMEOUT_MS`).
pub(super) const LOAD_TIMEOUT: Duration = Duration::from_millis(500);

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

fn error(text: &str) -> Reply {
    Reply::Error(text.to_string())
}
