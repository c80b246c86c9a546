//! Pipelined writes of one kind, run key by key and committed as one
//! batch.
//!
//! A client that pipelines `LPUSH queue job` fifty times pays, run one by
//! one, fifty reads of the list's record, fifty new versions of it, and
//! fifty trips through the store's write path. A [`KeyGroup`] holds a
//! serving pass's plain writes of one kind (LPUSH, RPUSH, LPOP, RPOP,
//! INCR, DECR, SADD, HSET, ZADD without options; SPOP, ZPOPMIN and ZPOPMAX
//! without a count; XADD with an automatic id and no option), then runs
//! them per key
//! in arrival order — one record read and one record write per key, each
//! command's reply what it would have answered alone — and commits every
//! key's changes as one batch, under the stripe locks of all its keys,
//! before any reply goes out. As with [`super::set_group`], the connection
//! that sent them runs nothing else before the commit, and each command
//! takes effect at the commit, between its arrival and its reply.

use super::{failure_reply, store_error_text, Failure};
use crate::resp::{Args, Reply};
use sluice_redis::db::{Db, KeyHash};
use sluice_redis::list::{self, End};
use sluice_redis::{hash, set, stream, zset, Ctx};
use sluice_store::wal::LogPosition;
use sluice_store::ReadCache;
use std::collections::HashMap;

/// Commands one group holds at most.
pub const MAX_COMMANDS: usize = 256;
/// Argument bytes one group holds at most.
pub const MAX_BYTES: usize = 1 << 20;
/// Values, members or field-value pairs one group holds at most.
pub const MAX_ELEMENTS: usize = 4096;
/// The longest key, value or member a grouped command may carry: longer
/// ones run alone (where the store's limits give each its own error).
pub const ARG_MAX_BYTES: usize = 1024;
/// The most elements one grouped command may carry.
const COMMAND_MAX_ELEMENTS: usize = 512;

/// The writes a group takes, each in its plain form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `LPUSH key value [value ...]`
    LPush,
    /// `RPUSH key value [value ...]`
    RPush,
    /// `LPOP key` (no count)
    LPop,
    /// `RPOP key` (no count)
    RPop,
    /// `INCR key`
    Incr,
    /// `DECR key`
    Decr,
    /// `SADD key member [member ...]`
    SAdd,
    /// `HSET key field value [field value ...]`
    HSet,
    /// `ZADD key score member [score member ...]` (no option)
    ZAdd,
    /// `SPOP key` (no count)
    SPop,
    /// `ZPOPMIN key` (no count)
    ZPopMin,
    /// `ZPOPMAX key` (no count)
    ZPopMax,
    /// `XADD key * field value [field value ...]` (no option)
    XAdd,
}

impl Kind {
    /// The kind of `args` when it is a plain write a group takes (the
    /// command's shape, arity and argument sizes; not its user's rights).
    pub fn of(args: &Args) -> Option<Kind> {
        let name = &args[0];
        if name.len() > 7 || name.len() < 4 {
            return None;
        }
        let mut lower = [0u8; 7];
        lower[..name.len()].copy_from_slice(name);
        lower.make_ascii_lowercase();
        let kind = match &lower[..name.len()] {
            b"lpush" => Kind::LPush,
            b"rpush" => Kind::RPush,
            b"lpop" => Kind::LPop,
            b"rpop" => Kind::RPop,
            b"incr" => Kind::Incr,
            b"decr" => Kind::Decr,
            b"sadd" => Kind::SAdd,
            b"hset" => Kind::HSet,
            b"zadd" => Kind::ZAdd,
            b"spop" => Kind::SPop,
            b"zpopmin" => Kind::ZPopMin,
            b"zpopmax" => Kind::ZPopMax,
            b"xadd" => Kind::XAdd,
            _ => return None,
        };
        let fits = args[1..].iter().all(|a| a.len() <= ARG_MAX_BYTES)
            && args.len() - 2 <= COMMAND_MAX_ELEMENTS;
        let shaped = match kind {
            Kind::LPop
            | Kind::RPop
            | Kind::Incr
            | Kind::Decr
            | Kind::SPop
            | Kind::ZPopMin
            | Kind::ZPopMax => args.len() == 2,
            Kind::LPush | Kind::RPush | Kind::SAdd => args.len() >= 3,
            Kind::HSet => args.len() >= 4 && args.len().is_multiple_of(2),
            // The key, `*`, then field-value pairs.
            Kind::XAdd => args.len() >= 5 && !args.len().is_multiple_of(2) && args[2] == b"*",
            Kind::ZAdd => {
                args.len() >= 4
                    && args.len().is_multiple_of(2)
                    && args[2..].chunks(2).all(|p| score(&p[0]).is_some())
            }
        };
        (fits && shaped).then_some(kind)
    }

    /// Its name as the command table spells it.
    pub fn name(self) -> &'static [u8] {
        match self {
            Kind::LPush => b"lpush",
            Kind::RPush => b"rpush",
            Kind::LPop => b"lpop",
            Kind::RPop => b"rpop",
            Kind::Incr => b"incr",
            Kind::Decr => b"decr",
            Kind::SAdd => b"sadd",
            Kind::HSet => b"hset",
            Kind::ZAdd => b"zadd",
            Kind::SPop => b"spop",
            Kind::ZPopMin => b"zpopmin",
            Kind::ZPopMax => b"zpopmax",
            Kind::XAdd => b"xadd",
        }
    }
}

/// A ZADD score as ZADD parses it.
fn score(arg: &[u8]) -> Option<f64> {
    sluice_redis::number::parse_double(arg)
}

/// One command held: the logical database of the connection that sent it
/// and its arguments.
#[derive(Debug)]
struct Held {
    database: u8,
    args: Args,
}

/// Plain writes of one kind waiting to run together, in arrival order.
#[derive(Debug, Default)]
pub struct KeyGroup {
    kind: Option<Kind>,
    held: Vec<Held>,
    bytes: usize,
    elements: usize,
}

/// What a group's commit did: each command's reply in arrival order, the
/// log position to wait for (None: nothing was written), and the commands
/// with their databases (for the clients blocked on their keys).
#[derive(Debug)]
pub struct Committed {
    /// The kind of every command.
    pub kind: Kind,
    /// Each command's reply, in arrival order.
    pub replies: Vec<Reply>,
    /// Where the log must be durable before the replies go out.
    pub position: Option<LogPosition>,
    /// Each command with its connection's logical database.
    pub commands: Vec<(u8, Args)>,
}

impl KeyGroup {
    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Whether it should be committed before it takes another.
    pub fn is_full(&self) -> bool {
        self.held.len() >= MAX_COMMANDS || self.bytes >= MAX_BYTES || self.elements >= MAX_ELEMENTS
    }

    /// Whether it may take a command of `kind` now: it is empty or holds
    /// that kind.
    pub fn takes(&self, kind: Kind) -> bool {
        self.kind.is_none_or(|k| k == kind)
    }

    /// Adds `args` ([`Kind::of`] said `kind`, [`KeyGroup::takes`] it) of a
    /// connection in logical database `database`.
    pub fn push(&mut self, kind: Kind, database: u8, args: Args) {
        assert!(self.takes(kind), "a group holds one kind of command");
        self.kind = Some(kind);
        self.bytes += args.iter().map(Vec::len).sum::<usize>();
        self.elements += args.len().saturating_sub(2).max(1);
        self.held.push(Held { database, args });
    }

    /// Runs every command held, key by key, and commits them as one batch
    /// (the group is empty after). `reads` is the serving thread's cache
    /// of the store's view; `now_ms` the time they run at.
    pub fn commit(&mut self, db: &Db, reads: &mut ReadCache, now_ms: u64) -> Option<Committed> {
        let kind = self.kind.take()?;
        let held = std::mem::take(&mut self.held);
        self.bytes = 0;
        self.elements = 0;
        let mut replies = vec![Reply::Null; held.len()];
        let by_key = keys_of(&held);
        let locked = db.lock_hashes(by_key.iter().map(|(_, key, _)| KeyHash::of(key)));
        let mut ctx = Ctx::gathering(db, now_ms).with_reads(reads);
        // One list for every key's commands: most keys have one.
        let mut commands: Vec<&Args> = Vec::with_capacity(held.len());
        for (database, key, at) in &by_key {
            commands.clear();
            commands.extend(at.iter().map(|&i| &held[i].args));
            let run = ctx
                .select(*database)
                .map_err(Failure::from)
                .and_then(|()| run_key(&mut ctx, kind, key, &commands));
            match run {
                Ok(each) => {
                    for (&i, reply) in at.iter().zip(each) {
                        replies[i] = reply;
                    }
                }
                Err(failure) => {
                    let reply = failure_reply(failure);
                    for &i in at {
                        replies[i] = reply.clone();
                    }
                }
            }
        }
        let finished = ctx.finish();
        drop(locked);
        if let Err(e) = finished {
            // None is applied: every command answers the store's error.
            let reply = Reply::Error(store_error_text(&e));
            replies.iter_mut().for_each(|r| *r = reply.clone());
        }
        Some(Committed {
            kind,
            replies,
            position: ctx.wrote(),
            commands: held.into_iter().map(|h| (h.database, h.args)).collect(),
        })
    }
}

/// Each distinct (database, key) of `held`, in the order first named, with
/// the indexes of its commands in arrival order.
fn keys_of(held: &[Held]) -> Vec<(u8, &[u8], Vec<usize>)> {
    let mut out: Vec<(u8, &[u8], Vec<usize>)> = Vec::with_capacity(held.len());
    let mut index: HashMap<(u8, &[u8]), usize> = HashMap::with_capacity(held.len());
    for (i, h) in held.iter().enumerate() {
        let name = (h.database, &h.args[1][..]);
        match index.get(&name) {
            Some(&k) => out[k].2.push(i),
            None => {
                index.insert(name, out.len());
                out.push((name.0, name.1, vec![i]));
            }
        }
    }
    out
}

/// Each command's arguments from position `at` on.
fn arguments_from<'c>(commands: &[&'c Args], at: usize) -> Vec<Vec<&'c [u8]>> {
    commands
        .iter()
        .map(|c| c[at..].iter().map(|v| &v[..]).collect())
        .collect()
}

/// Runs `commands` (all of `kind`, all on `key`) in order in `ctx`: each
/// one's reply, or one failure for them all (the key holds another type).
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: scores checked by Kind::of"
)]
fn run_key(
    ctx: &mut Ctx<'_>,
    kind: Kind,
    key: &[u8],
    commands: &[&Args],
) -> Result<Vec<Reply>, Failure> {
    let ints = |each: Vec<i64>| each.into_iter().map(Reply::Integer).collect();
    match kind {
        Kind::LPush | Kind::RPush => {
            let end = if kind == Kind::LPush {
                End::Left
            } else {
                End::Right
            };
            let values: Vec<&[u8]> = commands
                .iter()
                .flat_map(|c| &c[2..])
                .map(|v| &v[..])
                .collect();
            let len = list::push(ctx, key, &values, end, false)?;
            // Each command answers the length right after its own values.
            let mut running = len - values.len() as i64;
            Ok(commands
                .iter()
                .map(|c| {
                    running += (c.len() - 2) as i64;
                    Reply::Integer(running)
                })
                .collect())
        }
        Kind::LPop | Kind::RPop => {
            let end = if kind == Kind::LPop {
                End::Left
            } else {
                End::Right
            };
            let mut items = list::pop(ctx, key, end, commands.len() as u64)?
                .unwrap_or_default()
                .into_iter();
            Ok(commands
                .iter()
                .map(|_| items.next().map_or(Reply::Null, Reply::Bulk))
                .collect())
        }
        Kind::SPop => {
            // Members drawn at random, each once: one pop's draw of n.
            let mut picked = set::pop(ctx, key, commands.len() as u64)?
                .unwrap_or_default()
                .into_iter();
            Ok(commands
                .iter()
                .map(|_| picked.next().map_or(Reply::Null, Reply::Bulk))
                .collect())
        }
        Kind::ZPopMin | Kind::ZPopMax => {
            let max = kind == Kind::ZPopMax;
            let mut picked = zset::pop(ctx, key, commands.len() as u64, max)?.into_iter();
            // A plain pop is one flat pair in either protocol; none left,
            // an empty array.
            Ok(commands
                .iter()
                .map(|_| match picked.next() {
                    Some((member, score)) => {
                        Reply::Array(vec![Reply::Bulk(member), super::zsets::double(score)])
                    }
                    None => Reply::Array(Vec::new()),
                })
                .collect())
        }
        Kind::XAdd => {
            let runs = arguments_from(commands, 3);
            let runs: Vec<&[&[u8]]> = runs.iter().map(Vec::as_slice).collect();
            let each = stream::add_auto_runs(ctx, key, &runs)?;
            Ok(each
                .into_iter()
                .map(|id| match id {
                    Ok(id) => Reply::Bulk(id.to_string().into_bytes()),
                    Err(failure) => failure_reply(failure),
                })
                .collect())
        }
        Kind::Incr | Kind::Decr => {
            let delta = if kind == Kind::Incr { 1 } else { -1 };
            super::strings::increments(ctx, key, delta, commands.len())
        }
        Kind::SAdd => {
            let runs = arguments_from(commands, 2);
            let runs: Vec<&[&[u8]]> = runs.iter().map(Vec::as_slice).collect();
            Ok(ints(set::add_runs(ctx, key, &runs)?))
        }
        Kind::HSet => {
            let runs: Vec<Vec<(&[u8], &[u8])>> = commands
                .iter()
                .map(|c| c[2..].chunks(2).map(|p| (&p[0][..], &p[1][..])).collect())
                .collect();
            let runs: Vec<&[(&[u8], &[u8])]> = runs.iter().map(Vec::as_slice).collect();
            Ok(ints(hash::set_runs(ctx, key, &runs, false)?))
        }
        Kind::ZAdd => {
            let runs: Vec<Vec<(f64, &[u8])>> = commands
                .iter()
                .map(|c| {
                    c[2..]
                        .chunks(2)
                        .map(|p| (score(&p[0]).expect("scores checked by Kind::of"), &p[1][..]))
                        .collect()
                })
                .collect();
            let runs: Vec<&[(f64, &[u8])]> = runs.iter().map(Vec::as_slice).collect();
            let each = zset::add_runs(ctx, key, &runs, zset::AddFlags::default())?;
            Ok(each
                .into_iter()
                .map(|a| Reply::Integer(a.added as i64))
                .collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Args {
        line.split(' ').map(|a| a.as_bytes().to_vec()).collect()
    }

    #[test]
    fn plain_writes_are_grouped_and_others_are_not() {
        for (line, kind) in [
            ("LPUSH q a", Kind::LPush),
            ("rpush q a b c", Kind::RPush),
            ("LPOP q", Kind::LPop),
            ("RPOP q", Kind::RPop),
            ("INCR n", Kind::Incr),
            ("decr n", Kind::Decr),
            ("SADD s a b", Kind::SAdd),
            ("HSET h f v g w", Kind::HSet),
            ("ZADD z 1 a -inf b", Kind::ZAdd),
            ("SPOP s", Kind::SPop),
            ("ZPOPMIN z", Kind::ZPopMin),
            ("zpopmax z", Kind::ZPopMax),
            ("XADD x * f v", Kind::XAdd),
            ("XADD x * f v g w", Kind::XAdd),
        ] {
            assert_eq!(Kind::of(&args(line)), Some(kind), "{line}");
        }
        for line in [
            "LPUSH q",
            "LPOP q 2",
            "INCR n 1",
            "HSET h f",
            "HSET h f v g",
            "ZADD z NX 1 a",
            "ZADD z 1",
            "ZADD z nan a",
            "SPOP s 3",
            "ZPOPMIN z 2",
            "XADD x MAXLEN 10 * f v",
            "XADD x 1-1 f v",
            "XADD x * f",
            "XADD x * f v g",
            "LPUSHX q a",
            "SET k v",
        ] {
            assert_eq!(Kind::of(&args(line)), None, "{line}");
        }
        let long = format!("LPUSH q {}", "x".repeat(ARG_MAX_BYTES + 1));
        assert_eq!(
            Kind::of(&args(&long)),
            None,
            "a value past the bound runs alone"
        );
    }
}
