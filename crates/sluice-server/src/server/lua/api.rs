//! The `redis` table a script sees: `call`/`pcall` running commands as
//! the script's user, `error_reply`, `status_reply`, `sha1hex`, `log` and
//! the version fields.

use super::convert::tagged;
use super::{caller_line, error, lua_string, CallError};
use crate::acl::User;
use crate::commands::{self, Ctx};
use crate::resp::{Args, Reply};
use crate::server::Shared;
use mlua::{Lua, MultiValue, Table, Value};

pub(super) fn sequence(lua: &Lua, items: &[Vec<u8>]) -> mlua::Result<Table> {
    lua.create_sequence_from(
        items
            .iter()
            .map(|k| lua.create_string(k))
            .collect::<mlua::Result<Vec<_>>>()?,
    )
}

/// `redis.error_reply`, `status_reply`, `sha1hex`, and what a library's
/// code sees too ([`add_log_and_version`]).
pub(super) fn add_script_api(lua: &Lua, redis: &Table) -> mlua::Result<()> {
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
            Ok(crate::server::scripting::sha1_hex(&text))
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
pub(super) fn add_log_and_version(lua: &Lua, redis: &Table) -> mlua::Result<()> {
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

/// A command's arguments from Lua: strings as they are, numbers as Lua
/// prints them; anything else is Redis's error.
pub(super) fn command_args(vals: MultiValue, line: i32) -> mlua::Result<Args> {
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
pub(super) fn lua_number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        return format!("{}", n as i64);
    }
    let s = format!("{n:.13e}");
    let v: f64 = s.parse().unwrap_or(n);
    format!("{v}")
}

/// Runs one command from a script, after Redis's checks (its
/// `scriptCall`), in its order.
pub(super) fn call_command(
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
        return error(crate::server::dispatch::NO_REPLICAS);
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
    crate::server::dispatch::count_call(shared, shared.stats.scripts_slot(), id, us, failed);
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
    crate::server::notify::hold(args, ctx.take_changes());
    reply
}
