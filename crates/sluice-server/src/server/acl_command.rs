//! The ACL command: SETUSER, GETUSER, DELUSER, LIST, USERS, WHOAMI, CAT,
//! DRYRUN, LOG, GENPASS, LOAD, SAVE, HELP — Redis 7.0's replies and
//! texts (checked against a real `redis-server` in tests/acl_redis.rs).
//! Removing a user, or reloading them all, closes the connections that
//! run as a removed one, as Redis does.

use super::conn::Conn;
use super::Shared;
use crate::acl::{self, Denied};
use crate::resp::{Args, Reply};

fn error(text: impl Into<String>) -> Reply {
    Reply::Error(text.into())
}

fn bulk(s: impl AsRef<[u8]>) -> Reply {
    Reply::Bulk(s.as_ref().to_vec())
}

fn ok() -> Reply {
    Reply::Simple("OK".into())
}

/// One line, as an error reply carries it.
fn one_line(text: &str) -> String {
    text.replace(['\r', '\n'], " ")
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Most bits ACL GENPASS makes (Redis's limit).
const GENPASS_MAX_BITS: i64 = 4096;

/// ACL's reply to `args` (`ACL <sub> ...`, arity checked to 2 or more).
pub(super) fn acl(shared: &Shared, conn: &mut Conn, args: &Args) -> Reply {
    let mut full = b"acl|".to_vec();
    full.extend_from_slice(&args[1].to_ascii_lowercase());
    let Some(id) = acl::lookup(&full) else {
        return error(format!(
            "ERR unknown subcommand '{}'. Try ACL HELP.",
            lossy(&args[1][..args[1].len().min(128)])
        ));
    };
    if !acl::arity_fits(id, args.len()) {
        return crate::commands::wrong_arity(acl::name_of(id));
    }
    let users = &shared.config.users;
    match &full[4..] {
        b"setuser" => match users.set_user(&args[2], &args[3..]) {
            Ok(()) => ok(),
            Err(e) => error(format!("ERR {}", one_line(&e))),
        },
        b"deluser" => match users.delete(&args[2..]) {
            Ok(n) => {
                let gone: Vec<&Vec<u8>> = args[2..].iter().collect();
                shared.registry.kill(|_, e| gone.contains(&&e.user));
                Reply::Integer(n as i64)
            }
            Err(e) => error(format!("ERR {e}")),
        },
        b"getuser" => users.get(&args[2]).map_or(Reply::Null, |u| u.getuser()),
        b"list" => Reply::Array(users.list().into_iter().map(bulk).collect()),
        b"users" => Reply::Array(users.names().into_iter().map(bulk).collect()),
        b"whoami" => bulk(conn.session.user().name()),
        b"load" => match users.load() {
            Ok(()) => {
                // As Redis: every user but the default one is a new one.
                shared.registry.kill(|_, e| e.user != b"default");
                ok()
            }
            Err(e) => error(format!("ERR {}", one_line(&e))),
        },
        b"save" => match users.save() {
            Ok(()) => ok(),
            Err(e) => error(format!("ERR {}", one_line(&e))),
        },
        b"cat" => cat(args),
        b"genpass" => genpass(args),
        b"log" => log(shared, args),
        b"dryrun" => dryrun(shared, args),
        _ => help(),
    }
}

fn cat(args: &Args) -> Reply {
    let Some(name) = args.get(2) else {
        return Reply::Array(acl::CATEGORY_NAMES.iter().map(bulk).collect());
    };
    match acl::category_bit(name) {
        Some(bit) => Reply::Array(acl::in_category(bit).map(bulk).collect()),
        None => error(format!(
            "ERR Unknown category '{}'",
            lossy(&name[..name.len().min(128)])
        )),
    }
}

fn genpass(args: &Args) -> Reply {
    let bits = match args.get(2) {
        None => 256,
        Some(a) => match crate::resp::string_to_i64(a) {
            Some(n) => n,
            None => return error("ERR value is not an integer or out of range"),
        },
    };
    if bits <= 0 || bits > GENPASS_MAX_BITS {
        return error(format!(
            "ERR ACL GENPASS argument must be the number of bits for the output password, a positive number up to {GENPASS_MAX_BITS}"
        ));
    }
    match sluice_auth::random_hex((bits as usize).div_ceil(4)) {
        Some(hex) => bulk(hex),
        None => error("ERR the system's random source failed: try again"),
    }
}

fn log(shared: &Shared, args: &Args) -> Reply {
    let users = &shared.config.users;
    let count = match args.get(2) {
        None => 10,
        Some(a) if a.eq_ignore_ascii_case(b"reset") => {
            users.log_reset();
            return ok();
        }
        Some(a) => match crate::resp::string_to_i64(a) {
            Some(n) => n.max(0) as usize,
            None => return error("ERR value is not an integer or out of range"),
        },
    };
    let now_ms = super::now_ms();
    Reply::Array(
        users
            .log_entries(count)
            .iter()
            .map(|e| e.reply(now_ms))
            .collect(),
    )
}

fn dryrun(shared: &Shared, args: &Args) -> Reply {
    let Some(user) = shared.config.users.get(&args[2]) else {
        return error(format!("ERR User '{}' not found", lossy(&args[2])));
    };
    let command = &args[3..];
    let found = dryrun_command(command);
    let Some(id) = found else {
        return error(format!("ERR Command '{}' not found", lossy(&args[3])));
    };
    if !acl::arity_fits(id, command.len()) {
        return error(format!(
            "ERR wrong number of arguments for '{}' command",
            acl::name_of(id)
        ));
    }
    match user.check(id, command) {
        Ok(()) => ok(),
        Err(Denied::Command) => bulk(format!(
            "This user has no permissions to run the '{}' command",
            acl::name_of(id)
        )),
        Err(Denied::Key(at)) => bulk(format!(
            "This user has no permissions to access the '{}' key",
            lossy(&command[at])
        )),
    }
}

/// The command DRYRUN asks about, as Redis looks it up: a top-level name,
/// and for a container, one of its subcommands.
fn dryrun_command(command: &[Vec<u8>]) -> Option<acl::CommandId> {
    if command[0].contains(&b'|') {
        return None;
    }
    let id = acl::lookup(&command[0])?;
    if command.len() < 2 || !has_subcommands(id) {
        return Some(id);
    }
    let mut full = command[0].to_ascii_lowercase();
    full.push(b'|');
    full.extend_from_slice(&command[1]);
    acl::lookup(&full)
}

fn has_subcommands(id: acl::CommandId) -> bool {
    let prefix = format!("{}|", acl::name_of(id));
    acl::all_names().any(|n| n.starts_with(&prefix))
}

fn help() -> Reply {
    const LINES: &[&str] = &[
        "ACL <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "CAT [<category>]",
        "    List all commands that belong to <category>, or all command categories",
        "    when no category is specified.",
        "DELUSER <username> [<username> ...]",
        "    Delete a list of users.",
        "DRYRUN <username> <command> [<arg> ...]",
        "    Returns whether the user can execute the given command without executing the command.",
        "GETUSER <username>",
        "    Get the user's details.",
        "GENPASS [<bits>]",
        "    Generate a secure 256-bit user password. The optional `bits` argument can",
        "    be used to specify a different size.",
        "LIST",
        "    Show users details in config file format.",
        "LOAD",
        "    Reload users from the ACL file.",
        "LOG [<count> | RESET]",
        "    Show the ACL log entries.",
        "SAVE",
        "    Save the current config to the ACL file.",
        "SETUSER <username> <attribute> [<attribute> ...]",
        "    Create or modify a user with the specified attributes.",
        "USERS",
        "    List all the registered usernames.",
        "WHOAMI",
        "    Return the current connection username.",
        "HELP",
        "    Prints this help.",
    ];
    Reply::Array(LINES.iter().map(|l| Reply::Simple(l.to_string())).collect())
}
