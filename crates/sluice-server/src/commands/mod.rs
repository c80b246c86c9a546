//! The data commands: strings, keys and expiry, hashes, and the server
//! commands that read the keyspace — each with Redis 7's arity, its checks
//! in Redis's order and its exact reply and error texts (checked against a
//! real `redis-server` in tests/commands_redis.rs).
//!
//! A command runs to completion on the calling thread: reads go straight
//! to the store (no lock), writes are applied at once (visible) and hand
//! back where their log record ends; the connection sends the reply once
//! the log is durable that far, as the server's durability mode asks.

mod bits;
pub mod blocking;
mod glob;
mod hashes;
mod hyperloglog;
pub mod key_group;
mod keys;
pub(crate) mod lists;
pub mod long_double;
pub(crate) mod multi_pop;
mod object;
mod server;
pub mod set_group;
mod sets;
mod sort;
pub mod stream_groups;
pub mod streams;
mod strings;
pub(crate) mod zsets;
pub use strings::{get_borrowed, get_borrowed_or_miss};

pub use glob::glob_match;
pub use sort::pattern_option as sort_pattern_option;

use crate::resp::{string_to_i64, Args, Reply};
use sluice_redis::db::{Db, DbBatch};
pub use sluice_redis::error::{
    fail, Failure, NOT_FLOAT, NOT_INTEGER, OVERFLOW, STRING_MAX_BYTES, SYNTAX, WRONGTYPE,
};
pub use sluice_redis::Ctx;
use sluice_redis::{Entry, Value};
use sluice_store::StoreError;
use std::collections::HashMap;

/// What a command handler returns: its reply, or an error reply.
type Outcome = Result<Reply, Failure>;

/// Keys (or fields) with their values.
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// The stored entries a command reads, by where its arguments name them:
/// a server brings them in from the device before the command runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads {
    /// None it could name ahead (writes that read nothing, range walks,
    /// server commands).
    Unnamed,
    /// The entry of its first argument.
    FirstKey,
    /// The entry of every argument.
    EveryKey,
    /// The hash entry of its first argument and the field its second names.
    KeyAndField,
    /// The hash entry of its first argument and the fields every later
    /// argument names.
    KeyAndFields,
}

/// How a command is called: its name, Redis's arity (`n`: exactly n
/// arguments with the name; `-n`: at least n), and what it reads.
struct Spec {
    name: &'static str,
    arity: i32,
    run: fn(&mut Ctx<'_>, &Args) -> Outcome,
    reads: Reads,
}

const fn spec(name: &'static str, arity: i32, run: fn(&mut Ctx<'_>, &Args) -> Outcome) -> Spec {
    Spec {
        name,
        arity,
        run,
        reads: Reads::Unnamed,
    }
}

impl Spec {
    const fn reading(self, reads: Reads) -> Spec {
        Spec { reads, ..self }
    }
}

const COMMANDS: &[Spec] = &[
    spec("get", 2, strings::get).reading(Reads::FirstKey),
    spec("set", -3, strings::set),
    spec("setnx", 3, strings::setnx),
    spec("setex", 4, strings::setex),
    spec("psetex", 4, strings::psetex),
    spec("getset", 3, strings::getset).reading(Reads::FirstKey),
    spec("getdel", 2, strings::getdel).reading(Reads::FirstKey),
    spec("getex", -2, strings::getex).reading(Reads::FirstKey),
    spec("mget", -2, strings::mget).reading(Reads::EveryKey),
    spec("mset", -3, strings::mset),
    spec("msetnx", -3, strings::msetnx),
    spec("append", 3, strings::append).reading(Reads::FirstKey),
    spec("strlen", 2, strings::strlen).reading(Reads::FirstKey),
    spec("getrange", 4, strings::getrange).reading(Reads::FirstKey),
    spec("substr", 4, strings::getrange).reading(Reads::FirstKey),
    spec("setrange", 4, strings::setrange).reading(Reads::FirstKey),
    spec("incr", 2, strings::incr).reading(Reads::FirstKey),
    spec("decr", 2, strings::decr).reading(Reads::FirstKey),
    spec("incrby", 3, strings::incrby).reading(Reads::FirstKey),
    spec("decrby", 3, strings::decrby).reading(Reads::FirstKey),
    spec("incrbyfloat", 3, strings::incrbyfloat).reading(Reads::FirstKey),
    spec("lcs", -3, strings::lcs),
    spec("pfadd", -2, hyperloglog::pfadd).reading(Reads::FirstKey),
    spec("pfcount", -2, hyperloglog::pfcount).reading(Reads::EveryKey),
    spec("pfmerge", -2, hyperloglog::pfmerge).reading(Reads::EveryKey),
    spec("pfdebug", 3, hyperloglog::pfdebug),
    spec("pfselftest", 1, hyperloglog::pfselftest),
    spec("setbit", 4, bits::setbit).reading(Reads::FirstKey),
    spec("getbit", 3, bits::getbit).reading(Reads::FirstKey),
    spec("bitcount", -2, bits::bitcount).reading(Reads::FirstKey),
    spec("bitpos", -3, bits::bitpos).reading(Reads::FirstKey),
    spec("bitop", -4, bits::bitop),
    spec("sort", -2, sort::sort),
    spec("object", -2, object::object),
    spec("memory", -2, object::memory),
    spec("touch", -2, object::touch),
    spec("sort_ro", -2, sort::sort_ro),
    spec("bitfield", -2, bits::bitfield).reading(Reads::FirstKey),
    spec("bitfield_ro", -2, bits::bitfield_ro).reading(Reads::FirstKey),
    spec("del", -2, keys::del),
    spec("unlink", -2, keys::del),
    spec("exists", -2, keys::exists).reading(Reads::EveryKey),
    spec("type", 2, keys::type_of).reading(Reads::FirstKey),
    spec("rename", 3, keys::rename),
    spec("renamenx", 3, keys::renamenx),
    spec("copy", -3, keys::copy),
    spec("move", 3, keys::move_key),
    spec("dump", 2, keys::dump).reading(Reads::FirstKey),
    spec("restore", -4, keys::restore),
    spec("swapdb", 3, keys::swapdb),
    spec("keys", 2, keys::keys),
    spec("scan", -2, keys::scan),
    spec("randomkey", 1, keys::randomkey),
    spec("expire", -3, keys::expire),
    spec("pexpire", -3, keys::pexpire),
    spec("expireat", -3, keys::expireat),
    spec("pexpireat", -3, keys::pexpireat),
    spec("ttl", 2, keys::ttl).reading(Reads::FirstKey),
    spec("pttl", 2, keys::pttl).reading(Reads::FirstKey),
    spec("expiretime", 2, keys::expiretime).reading(Reads::FirstKey),
    spec("pexpiretime", 2, keys::pexpiretime).reading(Reads::FirstKey),
    spec("persist", 2, keys::persist),
    spec("dbsize", 1, keys::dbsize),
    spec("flushdb", -1, keys::flush),
    spec("flushall", -1, keys::flush),
    spec("hset", -4, hashes::hset),
    spec("hmset", -4, hashes::hmset),
    spec("hsetnx", 4, hashes::hsetnx).reading(Reads::KeyAndField),
    spec("hget", 3, hashes::hget).reading(Reads::KeyAndField),
    spec("hmget", -3, hashes::hmget).reading(Reads::KeyAndFields),
    spec("hrandfield", -2, hashes::hrandfield),
    spec("hgetall", 2, hashes::hgetall),
    spec("hkeys", 2, hashes::hkeys),
    spec("hvals", 2, hashes::hvals),
    spec("hdel", -3, hashes::hdel),
    spec("hlen", 2, hashes::hlen).reading(Reads::FirstKey),
    spec("hexists", 3, hashes::hexists).reading(Reads::KeyAndField),
    spec("hstrlen", 3, hashes::hstrlen).reading(Reads::KeyAndField),
    spec("hincrby", 4, hashes::hincrby).reading(Reads::KeyAndField),
    spec("hincrbyfloat", 4, hashes::hincrbyfloat).reading(Reads::KeyAndField),
    spec("hscan", -3, hashes::hscan),
    spec("lpush", -3, lists::lpush),
    spec("rpush", -3, lists::rpush),
    spec("lpushx", -3, lists::lpushx),
    spec("rpushx", -3, lists::rpushx),
    spec("lpop", -2, lists::lpop),
    spec("rpop", -2, lists::rpop),
    spec("llen", 2, lists::llen).reading(Reads::FirstKey),
    spec("lrange", 4, lists::lrange).reading(Reads::FirstKey),
    spec("lindex", 3, lists::lindex).reading(Reads::FirstKey),
    spec("lset", 4, lists::lset),
    spec("ltrim", 4, lists::ltrim),
    spec("lrem", 4, lists::lrem),
    spec("linsert", 5, lists::linsert),
    spec("lpos", -3, lists::lpos),
    spec("lmove", 5, lists::lmove),
    spec("rpoplpush", 3, lists::rpoplpush),
    spec("lmpop", -4, lists::lmpop),
    spec("sadd", -3, sets::sadd),
    spec("srem", -3, sets::srem),
    spec("smove", 4, sets::smove),
    spec("sismember", 3, sets::sismember).reading(Reads::KeyAndField),
    spec("smismember", -3, sets::smismember).reading(Reads::KeyAndFields),
    spec("scard", 2, sets::scard).reading(Reads::FirstKey),
    spec("smembers", 2, sets::smembers),
    spec("spop", -2, sets::spop),
    spec("srandmember", -2, sets::srandmember),
    spec("sinter", -2, sets::sinter),
    spec("sintercard", -3, sets::sintercard),
    spec("sinterstore", -3, sets::sinterstore),
    spec("sunion", -2, sets::sunion),
    spec("sunionstore", -3, sets::sunionstore),
    spec("sdiff", -2, sets::sdiff),
    spec("sdiffstore", -3, sets::sdiffstore),
    spec("sscan", -3, sets::sscan),
    spec("zadd", -4, zsets::zadd),
    spec("zincrby", 4, zsets::zincrby),
    spec("zrem", -3, zsets::zrem),
    spec("zcard", 2, zsets::zcard).reading(Reads::FirstKey),
    spec("zscore", 3, zsets::zscore),
    spec("zmscore", -3, zsets::zmscore),
    spec("zrank", 3, zsets::zrank),
    spec("zrevrank", 3, zsets::zrevrank),
    spec("zcount", 4, zsets::zcount),
    spec("zlexcount", 4, zsets::zlexcount),
    spec("zrange", -4, zsets::zrange),
    spec("zrevrange", -4, zsets::zrevrange),
    spec("zrangebyscore", -4, zsets::zrangebyscore),
    spec("zrevrangebyscore", -4, zsets::zrevrangebyscore),
    spec("zrangebylex", -4, zsets::zrangebylex),
    spec("zrevrangebylex", -4, zsets::zrevrangebylex),
    spec("zrangestore", -5, zsets::zrangestore),
    spec("zremrangebyrank", 4, zsets::zremrangebyrank),
    spec("zremrangebyscore", 4, zsets::zremrangebyscore),
    spec("zremrangebylex", 4, zsets::zremrangebylex),
    spec("zpopmin", -2, zsets::zpopmin),
    spec("zpopmax", -2, zsets::zpopmax),
    spec("zmpop", -4, zsets::zmpop),
    spec("zunion", -3, zsets::zunion),
    spec("zinter", -3, zsets::zinter),
    spec("zdiff", -3, zsets::zdiff),
    spec("zunionstore", -4, zsets::zunionstore),
    spec("zinterstore", -4, zsets::zinterstore),
    spec("zdiffstore", -4, zsets::zdiffstore),
    spec("zintercard", -3, zsets::zintercard),
    spec("zrandmember", -2, zsets::zrandmember),
    spec("zscan", -3, zsets::zscan),
    spec("blpop", -3, blocking::once),
    spec("brpop", -3, blocking::once),
    spec("brpoplpush", 4, blocking::once),
    spec("blmove", 6, blocking::once),
    spec("blmpop", -5, blocking::once),
    spec("bzpopmin", -3, blocking::once),
    spec("bzpopmax", -3, blocking::once),
    spec("bzmpop", -5, blocking::once),
    spec("xadd", -5, streams::xadd),
    spec("xlen", 2, streams::xlen),
    spec("xrange", -4, streams::xrange),
    spec("xrevrange", -4, streams::xrevrange),
    spec("xdel", -3, streams::xdel),
    spec("xtrim", -4, streams::xtrim),
    spec("xread", -4, streams::xread),
    spec("xreadgroup", -7, stream_groups::xreadgroup),
    spec("xgroup", -2, stream_groups::xgroup),
    spec("xack", -4, stream_groups::xack),
    spec("xpending", -3, stream_groups::xpending),
    spec("xinfo", -2, stream_groups::xinfo),
    spec("xclaim", -6, stream_groups::xclaim),
    spec("xautoclaim", -6, stream_groups::xautoclaim),
    spec("xsetid", -3, stream_groups::xsetid),
    spec("time", 1, server::time),
    spec("lastsave", 1, server::lastsave),
];

/// The names of the data commands and their arities, for COMMAND.
pub fn table() -> impl Iterator<Item = (&'static str, i32)> {
    COMMANDS.iter().map(|s| (s.name, s.arity))
}

/// Whether `name` (lower case) is a data command.
pub fn known(name: &[u8]) -> bool {
    find(name).is_some()
}

/// FNV-1a over a command name: names are a few bytes, where SipHash's
/// setup costs more than the lookup (this runs for every request).
#[derive(Default)]
pub(crate) struct NameHasher(u64);

impl std::hash::Hasher for NameHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// [`NameHasher`]'s builder, for maps keyed by command names.
pub(crate) type ByNameHash = std::hash::BuildHasherDefault<NameHasher>;

type ByName = HashMap<&'static [u8], &'static Spec, ByNameHash>;

fn find(name: &[u8]) -> Option<&'static Spec> {
    static BY_NAME: std::sync::OnceLock<ByName> = std::sync::OnceLock::new();
    thread_local! {
        // A command is looked up several times on its way (prefetch,
        // checks, dispatch), and a pipeline repeats one: the last name
        // asked for and what it found — nothing, for the commands that
        // are not data commands (PING, CLIENT, ...).
        static LAST: std::cell::Cell<LastFound> = const { std::cell::Cell::new(LastFound::NONE) };
    }
    let last = LAST.get();
    if last.is(name) {
        return last.found;
    }
    let found = BY_NAME
        .get_or_init(|| COMMANDS.iter().map(|s| (s.name.as_bytes(), s)).collect())
        .get(name)
        .copied();
    LAST.set(LastFound::of(name, found));
    found
}

/// A name looked up in [`find`] and what it found.
#[derive(Clone, Copy)]
struct LastFound {
    name: [u8; LastFound::NAME_MAX_BYTES],
    /// `name`'s length; more than `NAME_MAX_BYTES`: no name remembered.
    len: usize,
    found: Option<&'static Spec>,
}

impl LastFound {
    /// Longer than every command's name.
    const NAME_MAX_BYTES: usize = 24;
    const NONE: Self = Self {
        name: [0; Self::NAME_MAX_BYTES],
        len: usize::MAX,
        found: None,
    };

    fn of(name: &[u8], found: Option<&'static Spec>) -> Self {
        let mut last = Self::NONE;
        if let Some(room) = last.name.get_mut(..name.len()) {
            room.copy_from_slice(name);
            last.len = name.len();
            last.found = found;
        }
        last
    }

    fn is(&self, name: &[u8]) -> bool {
        self.name.get(..self.len) == Some(name)
    }
}

/// Whether `argc` arguments (the name included) fit Redis's `arity`: that
/// many exactly, or (negative) at least that many.
pub fn arity_ok(arity: i32, argc: usize) -> bool {
    if arity >= 0 {
        argc == arity as usize
    } else {
        argc >= arity.unsigned_abs() as usize
    }
}

/// Redis's arity error for `name`.
pub fn wrong_arity(name: &str) -> Reply {
    Reply::Error(format!(
        "ERR wrong number of arguments for '{name}' command"
    ))
}

/// What data command `name` (lower case) reads, where its arguments name
/// it; `Unnamed` for any other command.
pub fn reads(name: &[u8]) -> Reads {
    find(name).map_or(Reads::Unnamed, |s| s.reads)
}

/// Checks the arity of a data command: `None` if `args` fits, else the
/// error; `Some(None)`-like unknown commands are the caller's.
pub fn check_arity(name: &[u8], argc: usize) -> Option<Reply> {
    let spec = find(name)?;
    let ok = if spec.arity >= 0 {
        argc == spec.arity as usize
    } else {
        argc >= spec.arity.unsigned_abs() as usize
    };
    (!ok).then(|| wrong_arity(spec.name))
}

/// A failed command's error reply.
pub fn failure_reply(f: Failure) -> Reply {
    match f {
        Failure::Reply(text) => Reply::Error(text),
        Failure::Store(e) => Reply::Error(store_error_text(&e)),
    }
}

/// Runs data command `args` (name lower-cased in `name`, arity checked).
pub fn execute(ctx: &mut Ctx<'_>, name: &[u8], args: &Args) -> Reply {
    let Some(spec) = find(name) else {
        return crate::session::unknown_command(args);
    };
    match (spec.run)(ctx, args) {
        Ok(reply) => reply,
        Err(Failure::Reply(text)) => Reply::Error(text),
        Err(Failure::Store(e)) => Reply::Error(store_error_text(&e)),
    }
}

/// A store error as an error reply: one line, `ERR` first — or, when the
/// store cannot put writes on its device (nearly full, a flush failing),
/// `MISCONF` first, as Redis answers writes while it cannot persist
/// (`-MISCONF Errors writing to the AOF file: ...`).
fn store_error_text(e: &StoreError) -> String {
    let text = e.to_string().replace(['\r', '\n'], " ");
    match e {
        StoreError::WritesRefused(_) | StoreError::DeviceFull { .. } => {
            format!("MISCONF Errors writing to the device: {text}")
        }
        _ => format!("ERR {text}"),
    }
}

/// A container command's subcommand (`XGROUP CREATE`, `OBJECT ENCODING`)
/// checked as Redis 7.0's dispatch checks it against `arities` (name,
/// Redis's arity): the lower-cased subcommand, or Redis's error for an
/// unknown one or one with the wrong count.
pub(crate) fn subcommand(
    command: &str,
    args: &Args,
    arities: &[(&str, i32)],
) -> Result<Vec<u8>, Failure> {
    let sub = args[1].to_ascii_lowercase();
    let given = String::from_utf8_lossy(&args[1]);
    let Some((name, arity)) = arities.iter().find(|(n, _)| n.as_bytes() == sub) else {
        return Err(fail(&format!(
            "ERR unknown subcommand '{given}'. Try {command} HELP."
        )));
    };
    let fits = if *arity >= 0 {
        args.len() == *arity as usize
    } else {
        args.len() >= arity.unsigned_abs() as usize
    };
    if !fits {
        return Err(fail(&format!(
            "ERR wrong number of arguments for '{}|{name}' command",
            command.to_ascii_lowercase()
        )));
    }
    Ok(sub)
}

/// A HELP reply: its lines as simple strings.
pub(crate) fn help_reply(lines: &[&str]) -> Reply {
    Reply::Array(lines.iter().map(|l| Reply::Simple((*l).into())).collect())
}

fn ok() -> Reply {
    Reply::Simple("OK".into())
}

fn int(n: i64) -> Reply {
    Reply::Integer(n)
}

fn parse_i64(arg: &[u8]) -> Result<i64, Failure> {
    string_to_i64(arg).ok_or_else(|| fail(NOT_INTEGER))
}

/// Redis's float step (INCRBYFLOAT, HINCRBYFLOAT): `current + by` in
/// long double, printed as Redis prints it. `current_error` is the reply
/// when `current` is not a float.
fn float_sum(current: &[u8], by: &[u8], current_error: &str) -> Result<String, Failure> {
    if long_double::LongDouble::parse(current).is_err() {
        return Err(fail(current_error));
    }
    long_double::incr_by_float(current, by).map_err(|e| match e {
        long_double::FloatStepError::NotAFloat => fail(NOT_FLOAT),
        long_double::FloatStepError::NotFinite => {
            fail("ERR increment would produce NaN or Infinity")
        }
    })
}
