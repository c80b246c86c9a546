//! Lua scripting: EVAL, EVALSHA, EVAL_RO, EVALSHA_RO and SCRIPT, with Lua
//! 5.1 as Redis embeds it (mlua, its own copy of Lua 5.1 built in: Redis
//! scripts are written for 5.1's semantics, and a vendored build needs no
//! system library). A script runs atomically: it holds every stripe lock
//! and reads its own writes through a transaction's overlay, and its
//! writes are one store batch, committed when it returns (also when it
//! fails part way, as Redis keeps what a failing script did).
//!
//! `redis.call` and `redis.pcall` run the data commands (and PUBLISH);
//! replies convert as Redis converts them: integers to numbers, bulk
//! strings to strings, nulls to false, arrays to tables, status replies
//! to `{ok=...}` and errors to `{err=...}`; the script's return value
//! converts back the same way. Also `redis.error_reply`,
//! `redis.status_reply`, `redis.sha1hex` and `redis.log`. The cjson,
//! cmsgpack, bit and struct libraries, RESP3 from scripts
//! (`redis.setresp`), FUNCTION and the script timeout are to come.

use super::conn::Conn;
use super::Shared;
use crate::commands::{self, Ctx};
use crate::resp::{Args, Reply};
use mlua::{Lua, LuaOptions, MultiValue, StdLib, Table, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Scripts by their SHA1 (EVAL and SCRIPT LOAD add them).
#[derive(Default)]
pub struct Scripts {
    by_sha: Mutex<HashMap<String, Vec<u8>>>,
    /// The script running now, if any (one at a time: a script holds
    /// every stripe lock).
    running: Running,
}

/// The script running now: when it started, who runs it, whether it has
/// written, and whether SCRIPT KILL (or a shutdown) asked it to stop.
#[derive(Default)]
struct Running {
    /// Microseconds since `epoch` when it started, plus one; 0: none.
    started_us: AtomicU64,
    client: AtomicU64,
    wrote: AtomicBool,
    kill: Arc<AtomicBool>,
    epoch: std::sync::OnceLock<Instant>,
}

/// Redis's reply to a command while a script has run past
/// `busy-reply-threshold`.
pub(super) const BUSY: &str =
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.";

/// The error a killed script ends with (its line and sha are added as
/// for any script error).
const KILLED: &str = "ERR Script killed by user with SCRIPT KILL...";

/// How often (in Lua VM instructions) a running script looks whether it
/// was asked to stop.
const KILL_CHECK_INSTRUCTIONS: u32 = 10_000;

/// Most scripts kept (each EVAL of a new body adds one; SCRIPT FLUSH
/// empties the cache).
const MAX_SCRIPTS: usize = 100_000;

impl Scripts {
    fn now_us(&self) -> u64 {
        let epoch = self.running.epoch.get_or_init(Instant::now);
        epoch.elapsed().as_micros() as u64 + 1
    }

    /// Marks a script of `client` as running; the flag its hook watches.
    fn begin(&self, client: u64) -> Arc<AtomicBool> {
        let r = &self.running;
        r.kill.store(false, Ordering::Release);
        r.wrote.store(false, Ordering::Release);
        r.client.store(client, Ordering::Release);
        r.started_us.store(self.now_us(), Ordering::Release);
        r.kill.clone()
    }

    fn end(&self) {
        self.running.started_us.store(0, Ordering::Release);
        self.running.kill.store(false, Ordering::Release);
    }

    /// Whether a script run by another client than `client` has run for
    /// more than `threshold_ms` (others then get [`BUSY`]).
    pub(super) fn busy_for(&self, client: u64, threshold_ms: u64) -> bool {
        let started = self.running.started_us.load(Ordering::Acquire);
        started != 0
            && self.running.client.load(Ordering::Acquire) != client
            && self.now_us().saturating_sub(started) > threshold_ms.saturating_mul(1000)
    }

    /// Stops the running script whatever it wrote (a shutdown: its writes
    /// are discarded whole, none was acknowledged).
    pub(super) fn kill_for_shutdown(&self) {
        if self.running.started_us.load(Ordering::Acquire) != 0 {
            self.running.kill.store(true, Ordering::Release);
        }
    }

    /// SCRIPT KILL, as Redis answers it.
    fn kill(&self) -> Reply {
        if self.running.started_us.load(Ordering::Acquire) == 0 {
            return error("NOTBUSY No scripts in execution right now.");
        }
        if self.running.wrote.load(Ordering::Acquire) {
            return error("UNKILLABLE Sorry the script already executed write commands against the dataset. You can either wait the script termination or kill the server in a hard way using the SHUTDOWN NOSAVE command.");
        }
        self.running.kill.store(true, Ordering::Release);
        Reply::Simple("OK".into())
    }

    fn add(&self, body: &[u8]) -> String {
        let sha = sha1_hex(body);
        let mut by_sha = self.by_sha.lock().unwrap_or_else(|p| p.into_inner());
        if by_sha.len() >= MAX_SCRIPTS && !by_sha.contains_key(&sha) {
            by_sha.clear();
        }
        by_sha.entry(sha.clone()).or_insert_with(|| body.to_vec());
        sha
    }

    fn get(&self, sha: &[u8]) -> Option<Vec<u8>> {
        let sha = String::from_utf8_lossy(sha).to_ascii_lowercase();
        self.by_sha
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&sha)
            .cloned()
    }
}

fn sha1_hex(bytes: &[u8]) -> String {
    sha1_smol::Sha1::from(bytes).digest().to_string()
}

/// The scripting commands and their arities.
pub(super) const COMMANDS: &[(&str, i32)] = &[
    ("eval", -3),
    ("evalsha", -3),
    ("eval_ro", -3),
    ("evalsha_ro", -3),
    ("script", -2),
    ("function", -2),
];

fn error(text: &str) -> Reply {
    Reply::Error(text.to_string())
}

/// Runs scripting command `name`; None if it is not one.
pub(super) fn run(
    shared: &Shared,
    conn: &mut Conn,
    name: &[u8],
    args: &Args,
    ctx: &mut Ctx<'_>,
) -> Option<Reply> {
    Some(match name {
        b"eval" | b"eval_ro" => {
            let sha = shared.scripts.add(&args[1]);
            eval(shared, conn, &args[1], &sha, args, name == b"eval_ro", ctx)
        }
        b"evalsha" | b"evalsha_ro" => match shared.scripts.get(&args[1]) {
            Some(body) => {
                let sha = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
                eval(shared, conn, &body, &sha, args, name == b"evalsha_ro", ctx)
            }
            None => error("NOSCRIPT No matching script. Please use EVAL."),
        },
        b"script" => script(shared, args),
        b"function" => function(args),
        _ => return None,
    })
}

fn script(shared: &Shared, args: &Args) -> Reply {
    let sub = args[1].to_ascii_lowercase();
    match (&sub[..], args.len()) {
        (b"load", 3) => Reply::Bulk(shared.scripts.add(&args[2]).into_bytes()),
        (b"exists", n) if n >= 3 => Reply::Array(
            args[2..]
                .iter()
                .map(|sha| Reply::Integer(i64::from(shared.scripts.get(sha).is_some())))
                .collect(),
        ),
        (b"flush", 2) | (b"flush", 3) => {
            if let Some(mode) = args.get(2) {
                if !mode.eq_ignore_ascii_case(b"sync") && !mode.eq_ignore_ascii_case(b"async") {
                    return error("ERR SCRIPT FLUSH only support SYNC|ASYNC option");
                }
            }
            shared
                .scripts
                .by_sha
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
            Reply::Simple("OK".into())
        }
        (b"kill", 2) => shared.scripts.kill(),
        (b"load" | b"kill", _) => Reply::Error(format!(
            "ERR wrong number of arguments for 'script|{}' command",
            String::from_utf8_lossy(&sub)
        )),
        _ => Reply::Error(format!(
            "ERR unknown subcommand '{}'. Try SCRIPT HELP.",
            String::from_utf8_lossy(&args[1])
        )),
    }
}

/// FUNCTION: no function libraries yet; FLUSH (which Redis's test
/// harness sends before every unit) empties nothing, LIST lists nothing.
fn function(args: &Args) -> Reply {
    let sub = args[1].to_ascii_lowercase();
    match (&sub[..], args.len()) {
        (b"flush", 2 | 3) => {
            if let Some(mode) = args.get(2) {
                if !mode.eq_ignore_ascii_case(b"sync") && !mode.eq_ignore_ascii_case(b"async") {
                    return error("ERR FUNCTION FLUSH only supports SYNC|ASYNC option");
                }
            }
            Reply::Simple("OK".into())
        }
        (b"list", _) => Reply::Array(Vec::new()),
        _ => Reply::Error(format!(
            "ERR unknown subcommand '{}'. Try FUNCTION HELP.",
            String::from_utf8_lossy(&args[1])
        )),
    }
}

/// EVAL's keys and arguments: `numkeys` checked as Redis checks it.
fn split_keys(args: &Args) -> Result<(Args, Args), Reply> {
    let numkeys = crate::resp::string_to_i64(&args[2])
        .ok_or_else(|| error("ERR value is not an integer or out of range"))?;
    if numkeys < 0 {
        return Err(error("ERR Number of keys can't be negative"));
    }
    if numkeys as u64 > (args.len() - 3) as u64 {
        return Err(error(
            "ERR Number of keys can't be greater than number of args",
        ));
    }
    let n = numkeys as usize;
    Ok((args[3..3 + n].to_vec(), args[3 + n..].to_vec()))
}

fn eval(
    shared: &Shared,
    conn: &mut Conn,
    body: &[u8],
    sha: &str,
    args: &Args,
    read_only: bool,
    outer: &mut Ctx<'_>,
) -> Reply {
    let (keys, argv) = match split_keys(args) {
        Ok(split) => split,
        Err(reply) => return reply,
    };
    if outer.in_transaction() {
        // Inside EXEC: the transaction's locks and overlay already.
        let kill = shared.scripts.begin(conn.session.id());
        let reply = run_lua(shared, &kill, body, sha, keys, argv, read_only, outer);
        shared.scripts.end();
        return reply;
    }
    let db = &shared.db;
    let _all = db.lock_all();
    let mut ctx = Ctx::transaction(db, outer.now_ms());
    let kill = shared.scripts.begin(conn.session.id());
    let reply = run_lua(shared, &kill, body, sha, keys, argv, read_only, &mut ctx);
    let killed = kill.load(Ordering::Acquire);
    shared.scripts.end();
    if killed {
        // Stopped by SCRIPT KILL or a shutdown: its writes are dropped
        // whole (the overlay is never committed).
        return reply;
    }
    if let Err(e) = ctx.finish() {
        return Reply::Error(format!(
            "ERR the script's writes were not applied: {}",
            e.to_string().replace(['\r', '\n'], " ")
        ));
    }
    if let Some(at) = ctx.wrote() {
        outer.note_wrote(at);
    }
    reply
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

/// Redis keeps what `error({err = ...})` raised: Lua's `error` is wrapped
/// so the table is seen (mlua reports a table error by its address).
const ERROR_WRAPPER: &str = "local raise = error\n\
error = function(e, level) if type(e) == 'table' then __sluice_raised = e end \
return raise(e, (level or 1) + (level == 0 and 0 or 1)) end";

impl std::error::Error for CallError {}

#[allow(clippy::too_many_arguments)]
fn run_lua(
    shared: &Shared,
    kill: &Arc<AtomicBool>,
    body: &[u8],
    sha: &str,
    keys: Vec<Vec<u8>>,
    argv: Vec<Vec<u8>>,
    read_only: bool,
    ctx: &mut Ctx<'_>,
) -> Reply {
    let lua = match Lua::new_with(
        StdLib::TABLE | StdLib::STRING | StdLib::MATH,
        LuaOptions::default(),
    ) {
        Ok(lua) => lua,
        Err(e) => return Reply::Error(format!("ERR starting Lua: {e}")),
    };
    // Stopped between instructions when asked; once asked, every check
    // raises again, so a `pcall` in a loop cannot keep the script alive.
    let stop = kill.clone();
    lua.set_hook(
        mlua::HookTriggers::new().every_nth_instruction(KILL_CHECK_INSTRUCTIONS),
        move |_, _| {
            if stop.load(Ordering::Acquire) {
                return Err(mlua::Error::external(CallError(KILLED.into(), 0)));
            }
            Ok(mlua::VmState::Continue)
        },
    )
    .ok();
    let ctx = std::cell::RefCell::new(ctx);
    let outcome = lua.scope(|scope| {
        let globals = lua.globals();
        globals.set(
            "KEYS",
            lua.create_sequence_from(
                keys.iter()
                    .map(|k| lua.create_string(k))
                    .collect::<mlua::Result<Vec<_>>>()?,
            )?,
        )?;
        globals.set(
            "ARGV",
            lua.create_sequence_from(
                argv.iter()
                    .map(|a| lua.create_string(a))
                    .collect::<mlua::Result<Vec<_>>>()?,
            )?,
        )?;
        let redis = lua.create_table()?;
        let call = |raise: bool| {
            let ctx = &ctx;
            scope.create_function_mut(move |lua, vals: MultiValue| {
                let line = caller_line(lua);
                let args = command_args(vals, line)?;
                let reply = call_command(shared, &mut ctx.borrow_mut(), &args, read_only);
                let write = crate::acl::resolve(&args).is_some_and(crate::acl::is_write);
                if write && !matches!(reply, Reply::Error(_)) {
                    shared.scripts.running.wrote.store(true, Ordering::Release);
                }
                if raise {
                    if let Reply::Error(text) = &reply {
                        return Err(mlua::Error::external(CallError(text.clone(), line)));
                    }
                }
                to_lua(lua, &reply)
            })
        };
        redis.set("call", call(true)?)?;
        redis.set("pcall", call(false)?)?;
        redis.set(
            "error_reply",
            lua.create_function(|lua, msg: mlua::LuaString| {
                let t = lua.create_table()?;
                t.set("err", msg)?;
                Ok(t)
            })?,
        )?;
        redis.set(
            "status_reply",
            lua.create_function(|lua, msg: mlua::LuaString| {
                let t = lua.create_table()?;
                t.set("ok", msg)?;
                Ok(t)
            })?,
        )?;
        redis.set(
            "sha1hex",
            lua.create_function(|_, s: mlua::LuaString| Ok(sha1_hex(&s.as_bytes())))?,
        )?;
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
        globals.set("redis", redis)?;
        lua.load(ERROR_WRAPPER).exec()?;
        let function = match lua.load(body).set_name("@user_script").into_function() {
            Ok(f) => f,
            Err(e) => {
                let text = match &e {
                    mlua::Error::SyntaxError { message, .. } => message.clone(),
                    other => other.to_string(),
                };
                return Ok(Reply::Error(format!(
                    "ERR Error compiling script (new function): {}",
                    text.lines().next().unwrap_or_default()
                )));
            }
        };
        Ok(match function.call::<Value>(()) {
            Ok(value) => from_lua(&value),
            Err(e) => {
                let raised: Option<Table> = globals.raw_get("__sluice_raised").ok();
                script_error(&e, raised, sha)
            }
        })
    });
    outcome.unwrap_or_else(|e| Reply::Error(format!("ERR running the script: {e}")))
}

/// A script's failure as Redis 7.0 words it: the error (a command's
/// error reply, a table's `err`, or `ERR` and Lua's message), then
/// ` script: <sha>, on @user_script:<line>.`.
fn script_error(e: &mlua::Error, raised: Option<Table>, sha: &str) -> Reply {
    let (text, line) = if let Some(CallError(text, line)) = find_call_error(e) {
        (text.clone(), *line)
    } else {
        let message = match e {
            mlua::Error::RuntimeError(m) => m.clone(),
            other => other.to_string(),
        };
        let line = script_line(&message);
        match raised.and_then(|t| t.raw_get::<mlua::LuaString>("err").ok()) {
            Some(err) => (err.to_string_lossy().to_string(), line),
            None => {
                let first = message.lines().next().unwrap_or_default();
                (format!("ERR {first}"), line)
            }
        }
    };
    Reply::Error(format!("{text} script: {sha}, on @user_script:{line}."))
}

/// The first `user_script:N:` line number in a Lua error and traceback.
fn script_line(message: &str) -> i32 {
    message
        .split("user_script:")
        .skip(1)
        .find_map(|rest| rest.split(':').next()?.parse().ok())
        .unwrap_or(0)
}

fn find_call_error(e: &mlua::Error) -> Option<&CallError> {
    match e {
        mlua::Error::ExternalError(inner) => inner.downcast_ref::<CallError>(),
        mlua::Error::CallbackError { cause, .. } => find_call_error(cause),
        mlua::Error::WithContext { cause, .. } => find_call_error(cause),
        _ => None,
    }
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

/// Runs one command from a script.
fn call_command(shared: &Shared, ctx: &mut Ctx<'_>, args: &Args, read_only: bool) -> Reply {
    let name = args[0].to_ascii_lowercase();
    if name == b"publish" || name == b"spublish" {
        if args.len() != 3 {
            return commands::wrong_arity(&String::from_utf8_lossy(&name));
        }
        return Reply::Integer(
            shared
                .pubsub
                .publish(&args[1], &args[2], name == b"spublish"),
        );
    }
    if !commands::known(&name) {
        return error("ERR Unknown Redis command called from script");
    }
    if commands::check_arity(&name, args.len()).is_some() {
        return error("ERR Wrong number of args calling Redis command from script");
    }
    if read_only && crate::acl::resolve(args).is_some_and(crate::acl::is_write) {
        return error("ERR Write commands are not allowed from read-only scripts.");
    }
    commands::execute(ctx, &name, args)
}

/// A reply as Lua sees it (RESP2's conversion).
fn to_lua(lua: &Lua, reply: &Reply) -> mlua::Result<Value> {
    Ok(match reply {
        Reply::Integer(n) => Value::Number(*n as f64),
        Reply::Bulk(b) => Value::String(lua.create_string(b)?),
        Reply::Double(d) | Reply::BigNumber(d) => Value::String(lua.create_string(d)?),
        Reply::Verbatim { text, .. } => Value::String(lua.create_string(text)?),
        Reply::Null | Reply::NullArray => Value::Boolean(false),
        Reply::Boolean(b) => {
            if *b {
                Value::Number(1.0)
            } else {
                Value::Boolean(false)
            }
        }
        Reply::Simple(s) => {
            let t = lua.create_table()?;
            t.set("ok", s.as_str())?;
            Value::Table(t)
        }
        Reply::Error(s) => {
            let t = lua.create_table()?;
            t.set("err", s.as_str())?;
            Value::Table(t)
        }
        Reply::Array(items) | Reply::Set(items) | Reply::Push(items) => {
            let t = lua.create_table()?;
            for (i, item) in items.iter().enumerate() {
                t.set(i + 1, to_lua(lua, item)?)?;
            }
            Value::Table(t)
        }
        Reply::Map(pairs) | Reply::Pairs(pairs) => {
            let t = lua.create_table()?;
            for (i, (k, v)) in pairs.iter().enumerate() {
                t.set(2 * i + 1, to_lua(lua, k)?)?;
                t.set(2 * i + 2, to_lua(lua, v)?)?;
            }
            Value::Table(t)
        }
        Reply::KeyedArrays(pairs) => {
            let t = lua.create_table()?;
            for (i, (k, v)) in pairs.iter().enumerate() {
                let pair = lua.create_table()?;
                pair.set(1, to_lua(lua, k)?)?;
                pair.set(2, to_lua(lua, v)?)?;
                t.set(i + 1, pair)?;
            }
            Value::Table(t)
        }
        Reply::Attributed { reply, .. } => to_lua(lua, reply)?,
    })
}

/// A script's return value as a reply (Redis's conversion).
fn from_lua(value: &Value) -> Reply {
    match value {
        Value::Nil => Reply::Null,
        Value::Boolean(true) => Reply::Integer(1),
        Value::Boolean(false) => Reply::Null,
        Value::Integer(i) => Reply::Integer(*i),
        Value::Number(n) => Reply::Integer(*n as i64),
        Value::String(s) => Reply::Bulk(s.as_bytes().to_vec()),
        Value::Table(t) => table_reply(t),
        _ => Reply::Null,
    }
}

fn table_reply(t: &Table) -> Reply {
    if let Ok(Value::String(e)) = t.raw_get::<Value>("err") {
        return Reply::Error(e.to_string_lossy().to_string());
    }
    if let Ok(Value::String(s)) = t.raw_get::<Value>("ok") {
        return Reply::Simple(s.to_string_lossy().to_string());
    }
    let mut items = Vec::new();
    for i in 1.. {
        match t.raw_get::<Value>(i) {
            Ok(Value::Nil) | Err(_) => break,
            Ok(v) => items.push(from_lua(&v)),
        }
    }
    Reply::Array(items)
}
