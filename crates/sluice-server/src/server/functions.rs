//! FUNCTION and its libraries (Redis 7.0's functions.c): FUNCTION LOAD,
//! DELETE, FLUSH, LIST, STATS, KILL and HELP, and the lookup FCALL does.
//!
//! A library is kept as its code in the store (`redis.meta`, docs/FORMAT.md
//! "Function libraries"), written in the same store batch discipline as
//! any write, so a loaded library survives a restart as data does. What
//! functions exist is what the code registers: at start every stored
//! library is loaded again. An FCALL runs its library's code in a fresh
//! Lua state and calls the function it registered (`server::lua`).

use super::lua::{self, Registered};
use super::scripting::Runnable;
use super::Shared;
use crate::commands::{self, Ctx};
use crate::resp::{Args, Reply};
use sluice_redis::Db;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// The engine every library names (compared without case, as Redis).
const ENGINE: &str = "LUA";

/// Longest library name Sluice keeps (a store key holds it).
const MAX_NAME_BYTES: usize = 1024;

/// Longest library code Sluice keeps (one store entry holds it).
const MAX_CODE_BYTES: usize = 1 << 20;

/// Most libraries loaded at once.
const MAX_LIBRARIES: usize = 10_000;

/// FUNCTION's subcommands and Redis's arities.
const SUBCOMMANDS: &[(&str, i32)] = &[
    ("delete", 3),
    ("dump", 2),
    ("flush", -2),
    ("help", 2),
    ("kill", 2),
    ("list", -2),
    ("load", -3),
    ("restore", -3),
    ("stats", 2),
];

/// The loaded libraries.
#[derive(Default)]
pub struct Functions {
    state: Mutex<Libraries>,
}

#[derive(Default, Clone)]
struct Libraries {
    by_name: BTreeMap<String, Library>,
    /// Each function's library.
    owner: HashMap<String, String>,
}

#[derive(Clone)]
struct Library {
    /// The code as FUNCTION LOAD was given it.
    code: Vec<u8>,
    /// The code after its `#!` line (what runs).
    body: Arc<[u8]>,
    functions: BTreeMap<String, Function>,
}

#[derive(Clone)]
struct Function {
    description: Option<Vec<u8>>,
    /// Bit i: `lua::FLAG_NAMES[i]`.
    flags: u8,
}

/// A library's `#!<engine> name=<name>` line, as Redis reads it.
struct Metadata {
    name: String,
    /// Where the code after the line starts (its newline kept).
    body_at: usize,
}

impl Functions {
    /// The libraries stored in `db`, each loaded again from its code; one
    /// that no longer loads is logged and left out (and left stored).
    pub fn open(db: &Db) -> Result<Functions, sluice_store::StoreError> {
        let functions = Functions::default();
        {
            let mut state = functions.lock();
            for (name, code) in db.libraries()? {
                match loaded(&code, &state, true) {
                    Ok((meta, registered)) => state.link(meta, code, registered),
                    Err(text) => log::error!(
                        "function library '{}' does not load and is not served: {text}",
                        String::from_utf8_lossy(&name)
                    ),
                }
            }
        }
        Ok(functions)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Libraries> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The flags of function `name`, if there is one.
    pub(super) fn flags_of(&self, name: &[u8]) -> Option<u8> {
        let name = String::from_utf8_lossy(name);
        let state = self.lock();
        let library = state.owner.get(name.as_ref())?;
        Some(
            state
                .by_name
                .get(library)?
                .functions
                .get(name.as_ref())?
                .flags,
        )
    }

    /// FCALL's (or FCALL_RO's, `ro`) function, key count and whether it
    /// may write; or Redis's error.
    pub(super) fn prepare(
        &self,
        shared: &Shared,
        args: &Args,
        ro: bool,
    ) -> Result<(Runnable, usize, bool), Reply> {
        let name = String::from_utf8_lossy(&args[1]).to_string();
        let (body, flags) = {
            let state = self.lock();
            let library = state
                .owner
                .get(&name)
                .and_then(|l| state.by_name.get(l))
                .ok_or_else(|| error("ERR Function not found"))?;
            let function = &library.functions[&name];
            (library.body.clone(), function.flags)
        };
        let numkeys = super::scripting::numkeys(args, "ERR Bad number of keys provided")?;
        let no_writes = flags & lua::NO_WRITES != 0;
        super::scripting::writable_check(shared, ro, no_writes)?;
        let what = Runnable::Function { code: body, name };
        Ok((what, numkeys, ro || no_writes))
    }
}

impl Libraries {
    fn link(&mut self, meta: Metadata, code: Vec<u8>, registered: Vec<Registered>) {
        let body: Arc<[u8]> = code[meta.body_at..].into();
        let mut functions = BTreeMap::new();
        for r in registered {
            self.owner.insert(r.name.clone(), meta.name.clone());
            functions.insert(
                r.name,
                Function {
                    description: r.description,
                    flags: r.flags,
                },
            );
        }
        let library = Library {
            code,
            body,
            functions,
        };
        self.by_name.insert(meta.name, library);
    }

    /// Adds `library` (loaded elsewhere) under `name`.
    fn insert(&mut self, name: String, library: Library) {
        for f in library.functions.keys() {
            self.owner.insert(f.clone(), name.clone());
        }
        self.by_name.insert(name, library);
    }

    fn unlink(&mut self, name: &str) -> Option<Library> {
        let library = self.by_name.remove(name)?;
        for f in library.functions.keys() {
            self.owner.remove(f);
        }
        Some(library)
    }
}

fn error(text: &str) -> Reply {
    Reply::Error(text.to_string())
}

fn ok() -> Reply {
    Reply::Simple("OK".into())
}

/// FUNCTION's subcommands.
pub(super) fn command(shared: &Shared, args: &Args, ctx: &mut Ctx<'_>) -> Reply {
    let sub = match commands::subcommand("FUNCTION", args, SUBCOMMANDS) {
        Ok(sub) => sub,
        Err(f) => return commands::failure_reply(f),
    };
    let functions = &shared.functions;
    match &sub[..] {
        b"load" => load(functions, args, ctx),
        b"delete" => delete(functions, &args[2], ctx),
        b"flush" => flush(functions, args, ctx),
        b"list" => list(functions, args),
        b"stats" => stats(shared),
        b"kill" => shared.scripts.kill(false),
        b"dump" => {
            let state = functions.lock();
            let codes = state.by_name.values().map(|l| &l.code[..]);
            Reply::Bulk(sluice_redis::dump::dump_functions(codes))
        }
        b"restore" => restore(functions, args, ctx),
        _ => commands::help_reply(HELP),
    }
}

/// A library's `#!` line (Redis's `functionExtractLibMetaData`).
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: checked: letters, digits and _"
)]
fn metadata(code: &[u8]) -> Result<Metadata, String> {
    if !code.starts_with(b"#!") {
        return Err("Missing library metadata".into());
    }
    let (end, mut parts) = lua::shebang_words(code).ok_or("Invalid library metadata")?;
    let engine = parts.next().ok_or("Invalid library metadata")?;
    let mut name = None;
    for part in parts {
        if part.len() >= 5 && part[..5].eq_ignore_ascii_case(b"name=") {
            if name.is_some() {
                return Err(
                    "Invalid metadata value, name argument was given multiple times".into(),
                );
            }
            name = Some(part[5..].to_vec());
            continue;
        }
        return Err(format!(
            "Invalid metadata value given: {}",
            String::from_utf8_lossy(part)
        ));
    }
    let name = name.ok_or("Library name was not given")?;
    if !lua::valid_name(&name) {
        return Err("Library names can only contain letters, numbers, or underscores(_) and must be at least one character long".into());
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(format!(
            "a library name of {} bytes is longer than Sluice's limit of {MAX_NAME_BYTES} bytes",
            name.len()
        ));
    }
    let engine = &engine[2..];
    if !engine.eq_ignore_ascii_case(ENGINE.as_bytes()) {
        return Err(format!(
            "Engine '{}' not found",
            String::from_utf8_lossy(engine)
        ));
    }
    let name = String::from_utf8(name).expect("checked: letters, digits and _");
    Ok(Metadata { name, body_at: end })
}

/// Loads `code` against the libraries in `state`: what it registers, or
/// Redis's error text (after `ERR `). `replace`: a library of the same
/// name is to be replaced.
fn loaded(
    code: &[u8],
    state: &Libraries,
    replace: bool,
) -> Result<(Metadata, Vec<Registered>), String> {
    let meta = metadata(code)?;
    if !replace && state.by_name.contains_key(&meta.name) {
        return Err(format!("Library '{}' already exists", meta.name));
    }
    let registered = lua::load_library(&code[meta.body_at..], lua::LOAD_TIMEOUT)?;
    for r in &registered {
        if state
            .owner
            .get(&r.name)
            .is_some_and(|owner| *owner != meta.name)
        {
            return Err(format!("Function {} already exists", r.name));
        }
    }
    Ok((meta, registered))
}

/// FUNCTION LOAD [REPLACE] code.
fn load(functions: &Functions, args: &Args, ctx: &mut Ctx<'_>) -> Reply {
    let mut replace = false;
    let mut at = 2;
    while at < args.len() - 1 {
        if !args[at].eq_ignore_ascii_case(b"replace") {
            return Reply::Error(format!(
                "ERR Unknown option given: {}",
                String::from_utf8_lossy(&args[at])
            ));
        }
        replace = true;
        at += 1;
    }
    let code = &args[at];
    if code.len() > MAX_CODE_BYTES {
        return Reply::Error(format!(
            "ERR library code of {} bytes is longer than Sluice's limit of {MAX_CODE_BYTES} bytes",
            code.len()
        ));
    }
    let mut state = functions.lock();
    let (meta, registered) = match loaded(code, &state, replace) {
        Ok(l) => l,
        Err(text) => return Reply::Error(format!("ERR {text}")),
    };
    if !state.by_name.contains_key(&meta.name) && state.by_name.len() >= MAX_LIBRARIES {
        return Reply::Error(format!(
            "ERR {MAX_LIBRARIES} libraries are loaded, Sluice's limit: delete one first"
        ));
    }
    let mut batch = ctx.batch();
    let stored = batch
        .put_library(meta.name.as_bytes(), code)
        .and_then(|()| ctx.commit(batch));
    if let Err(e) = stored {
        return commands::failure_reply(e.into());
    }
    let name = meta.name.clone();
    state.unlink(&name);
    state.link(meta, code.clone(), registered);
    Reply::Bulk(name.into_bytes())
}

/// What FUNCTION RESTORE does with the libraries already loaded.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Policy {
    /// Drops them all first.
    Flush,
    /// Keeps them; a library of the same name is an error.
    Append,
    /// Keeps them; one of the same name is replaced.
    Replace,
}

/// FUNCTION RESTORE payload [FLUSH|APPEND|REPLACE], with Redis's checks
/// in Redis's order; all the payload's libraries load, or none.
fn restore(functions: &Functions, args: &Args, ctx: &mut Ctx<'_>) -> Reply {
    if args.len() > 4 {
        // Redis names the subcommand as it was typed.
        return Reply::Error(format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Try FUNCTION HELP.",
            String::from_utf8_lossy(&args[1])
        ));
    }
    let policy =
        match args.get(3).map(|a| a.to_ascii_lowercase()) {
            None => Policy::Append,
            Some(p) if p == b"append" => Policy::Append,
            Some(p) if p == b"replace" => Policy::Replace,
            Some(p) if p == b"flush" => Policy::Flush,
            Some(_) => return error(
                "ERR Wrong restore policy given, value should be either FLUSH, APPEND or REPLACE.",
            ),
        };
    let codes = match sluice_redis::dump::restore_functions(&args[2]) {
        Ok(codes) => codes,
        Err(text) => return Reply::Error(format!("ERR {text}")),
    };
    // The payload's libraries load on their own first, as Redis loads
    // them into a context of their own.
    let mut incoming = Libraries::default();
    for code in codes {
        match loaded(&code, &incoming, false) {
            Ok((meta, registered)) => incoming.link(meta, code, registered),
            Err(text) => return Reply::Error(format!("ERR {text}")),
        }
    }
    let mut state = functions.lock();
    let mut joined = if policy == Policy::Flush {
        Libraries::default()
    } else {
        state.clone()
    };
    for (name, lib) in &incoming.by_name {
        if joined.by_name.contains_key(name) {
            if policy == Policy::Append {
                return Reply::Error(format!("ERR Library {name} already exists"));
            }
            joined.unlink(name);
        }
        if let Some(f) = lib.functions.keys().find(|f| joined.owner.contains_key(*f)) {
            return Reply::Error(format!("ERR Function {f} already exists"));
        }
        joined.insert(name.clone(), lib.clone());
    }
    if joined.by_name.len() > MAX_LIBRARIES {
        return Reply::Error(format!(
            "ERR {MAX_LIBRARIES} libraries are loaded, Sluice's limit: delete some first"
        ));
    }
    let mut batch = ctx.batch();
    let stored = (|| {
        if policy == Policy::Flush {
            batch.delete_libraries()?;
        }
        for (name, lib) in &incoming.by_name {
            batch.put_library(name.as_bytes(), &lib.code)?;
        }
        Ok(())
    })()
    .and_then(|()| ctx.commit(batch));
    if let Err(e) = stored {
        return commands::failure_reply(e.into());
    }
    *state = joined;
    ok()
}

/// FUNCTION DELETE name.
fn delete(functions: &Functions, name: &[u8], ctx: &mut Ctx<'_>) -> Reply {
    let mut state = functions.lock();
    let name = String::from_utf8_lossy(name).to_string();
    if !state.by_name.contains_key(&name) {
        return error("ERR Library not found");
    }
    let mut batch = ctx.batch();
    let stored = batch
        .delete_library(name.as_bytes())
        .and_then(|()| ctx.commit(batch));
    if let Err(e) = stored {
        return commands::failure_reply(e.into());
    }
    state.unlink(&name);
    ok()
}

/// FUNCTION FLUSH [ASYNC|SYNC].
fn flush(functions: &Functions, args: &Args, ctx: &mut Ctx<'_>) -> Reply {
    let mode_ok = match &args[2..] {
        [] => true,
        [mode] => mode.eq_ignore_ascii_case(b"sync") || mode.eq_ignore_ascii_case(b"async"),
        _ => false,
    };
    if !mode_ok {
        return error("ERR FUNCTION FLUSH only supports SYNC|ASYNC option");
    }
    let mut state = functions.lock();
    if state.by_name.is_empty() {
        return ok();
    }
    let mut batch = ctx.batch();
    let stored = batch.delete_libraries().and_then(|()| ctx.commit(batch));
    if let Err(e) = stored {
        return commands::failure_reply(e.into());
    }
    *state = Libraries::default();
    ok()
}

/// FUNCTION LIST [LIBRARYNAME pattern] [WITHCODE].
fn list(functions: &Functions, args: &Args) -> Reply {
    let (mut with_code, mut pattern) = (false, None);
    let mut at = 2;
    while at < args.len() {
        let arg = &args[at];
        if !with_code && arg.eq_ignore_ascii_case(b"withcode") {
            with_code = true;
        } else if pattern.is_none() && arg.eq_ignore_ascii_case(b"libraryname") {
            if at + 1 >= args.len() {
                return error("ERR library name argument was not given");
            }
            at += 1;
            pattern = Some(&args[at]);
        } else {
            return Reply::Error(format!(
                "ERR Unknown argument {}",
                String::from_utf8_lossy(arg)
            ));
        }
        at += 1;
    }
    let state = functions.lock();
    let bulk = |s: &str| Reply::Bulk(s.as_bytes().to_vec());
    let libraries = state
        .by_name
        .iter()
        .filter(|(name, _)| pattern.is_none_or(|p| commands::glob_match(p, name.as_bytes())))
        .map(|(name, library)| {
            let functions = library
                .functions
                .iter()
                .map(|(fname, f)| {
                    Reply::Map(vec![
                        (bulk("name"), bulk(fname)),
                        (
                            bulk("description"),
                            f.description.clone().map_or(Reply::Null, Reply::Bulk),
                        ),
                        (bulk("flags"), flag_set(f.flags)),
                    ])
                })
                .collect();
            let mut fields = vec![
                (bulk("library_name"), bulk(name)),
                (bulk("engine"), bulk(ENGINE)),
                (bulk("functions"), Reply::Array(functions)),
            ];
            if with_code {
                fields.push((bulk("library_code"), Reply::Bulk(library.code.clone())));
            }
            Reply::Map(fields)
        })
        .collect();
    Reply::Array(libraries)
}

/// A function's flags as FUNCTION LIST gives them: a set of names.
fn flag_set(flags: u8) -> Reply {
    Reply::Set(
        lua::FLAG_NAMES
            .iter()
            .enumerate()
            .filter(|(i, _)| flags & (1 << i) != 0)
            .map(|(_, name)| Reply::Simple((*name).into()))
            .collect(),
    )
}

/// FUNCTION STATS.
fn stats(shared: &Shared) -> Reply {
    if shared.scripts.eval_running() {
        return error(super::scripting::BUSY);
    }
    let bulk = |s: &str| Reply::Bulk(s.as_bytes().to_vec());
    let running = match shared.scripts.running_function() {
        None => Reply::Null,
        Some((name, command, ms)) => Reply::Map(vec![
            (bulk("name"), bulk(&name)),
            (
                bulk("command"),
                Reply::Array(command.into_iter().map(Reply::Bulk).collect()),
            ),
            (bulk("duration_ms"), Reply::Integer(ms as i64)),
        ]),
    };
    let state = shared.functions.lock();
    let engine = Reply::Map(vec![
        (
            bulk("libraries_count"),
            Reply::Integer(state.by_name.len() as i64),
        ),
        (
            bulk("functions_count"),
            Reply::Integer(state.owner.len() as i64),
        ),
    ]);
    Reply::Map(vec![
        (bulk("running_script"), running),
        (bulk("engines"), Reply::Map(vec![(bulk(ENGINE), engine)])),
    ])
}

const HELP: &[&str] = &[
    "FUNCTION <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "LOAD [REPLACE] <FUNCTION CODE>",
    "    Create a new library with the given library name and code.",
    "DELETE <LIBRARY NAME>",
    "    Delete the given library.",
    "LIST [LIBRARYNAME PATTERN] [WITHCODE]",
    "    Return general information on all the libraries:",
    "    * Library name",
    "    * The engine used to run the Library",
    "    * Library description",
    "    * Functions list",
    "    * Library code (if WITHCODE is given)",
    "    It also possible to get only function that matches a pattern using LIBRARYNAME argument.",
    "STATS",
    "    Return information about the current function running:",
    "    * Function name",
    "    * Command used to run the function",
    "    * Duration in MS that the function is running",
    "    If no function is running, return nil",
    "    In addition, returns a list of available engines.",
    "KILL",
    "    Kill the current running function.",
    "FLUSH [ASYNC|SYNC]",
    "    Delete all the libraries.",
    "    When called without the optional mode argument, the behavior is determined by the",
    "    lazyfree-lazy-user-flush configuration directive. Valid modes are:",
    "    * ASYNC: Asynchronously flush the libraries.",
    "    * SYNC: Synchronously flush the libraries.",
    "DUMP",
    "    Return a serialized payload representing the current libraries, can be restored using FUNCTION RESTORE command",
    "RESTORE <PAYLOAD> [FLUSH|APPEND|REPLACE]",
    "    Restore the libraries represented by the given payload, it is possible to give a restore policy to",
    "    control how to handle existing libraries (default APPEND):",
    "    * FLUSH: delete all existing libraries.",
    "    * APPEND: appends the restored libraries to the existing libraries. On collision, abort.",
    "    * REPLACE: appends the restored libraries to the existing libraries, On collision, replace the old",
    "      libraries with the new libraries (notice that even on this option there is a chance of failure",
    "      in case of functions name collision with another library).",
    "HELP",
    "    Prints this help.",
];
