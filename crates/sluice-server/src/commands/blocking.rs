//! The blocking pops (BLPOP, BRPOP, BLMOVE, BRPOPLPUSH, BLMPOP,
//! BZPOPMIN, BZPOPMAX, BZMPOP): their arguments in Redis 7.0's order of
//! checks, and one try at serving them. Blocking itself — a client
//! waiting on its keys, woken by writes — is the server's
//! (`server::blocking`); inside MULTI, where Redis never blocks, a try
//! that finds nothing answers as a timeout does.

use super::lists::{self, end_of, parse_multi_pop as parse_lmpop};
use super::zsets;
use super::*;
use sluice_redis::list::{self as list_model, End};
use sluice_redis::number::format_double;
use sluice_redis::zset;

/// What a blocking command asks for.
pub enum Want {
    /// BLPOP/BRPOP: one item from the first non-empty list.
    Pop(End),
    /// BLMOVE/BRPOPLPUSH: keys are [source, destination].
    Move(End, End),
    /// BLMPOP: the LMPOP it runs.
    ListMulti(End, u64),
    /// BZPOPMIN/BZPOPMAX (`true`: max).
    ZPop(bool),
    /// BZMPOP (max, count).
    ZSetMulti(bool, u64),
    /// XREAD with BLOCK.
    Read(super::streams::Read),
}

/// A parsed blocking command.
pub struct Request {
    /// What it pops.
    pub want: Want,
    /// The keys it waits on, in the order given (BLMOVE: source, then the
    /// destination, which it does not wait on).
    pub keys: Vec<Vec<u8>>,
    /// How long it waits, in ms (0: for ever).
    pub timeout_ms: u64,
}

impl Request {
    /// The keys it waits on (BLMOVE waits on its source only).
    pub fn waits_on(&self) -> &[Vec<u8>] {
        match self.want {
            Want::Move(..) => &self.keys[..1],
            _ => &self.keys,
        }
    }
}

/// Whether `args` (named `name`, lower case) is a blocking command: a
/// blocking pop, or XREAD with BLOCK.
pub fn is_blocking(name: &[u8], args: &Args) -> bool {
    match name {
        b"blpop" | b"brpop" | b"blmove" | b"brpoplpush" | b"blmpop" | b"bzpopmin" | b"bzpopmax"
        | b"bzmpop" => true,
        b"xread" | b"xreadgroup" => {
            super::streams::parse_read(args).is_ok_and(|r| r.block_ms.is_some())
        }
        _ => false,
    }
}

/// The command a client blocks with, as it runs again when woken: an
/// XREAD's `$` ids become the streams' last ids now (it waits for what
/// comes after them). The caller holds the keys' locks.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: pinned"
)]
pub fn pinned(ctx: &Ctx<'_>, name: &[u8], args: &Args) -> Result<Args, Failure> {
    if name != b"xread" {
        return Ok(args.clone());
    }
    let mut r = super::streams::parse_read(args)?;
    super::streams::pin_ids(ctx, &mut r)?;
    let n = r.streams.len();
    let mut out = args.clone();
    let first_id = out.len() - n;
    for (k, (_, id)) in r.streams.iter().enumerate() {
        let id = id.expect("pinned");
        out[first_id + k] = id.to_string().into_bytes();
    }
    Ok(out)
}

/// Redis's `getTimeoutFromObjectOrReply` in seconds: a float, rounded up
/// to whole ms, never negative.
fn parse_timeout(arg: &[u8]) -> Result<u64, Failure> {
    let seconds = sluice_redis::number::parse_double(arg)
        .filter(|s| s.is_finite())
        .ok_or_else(|| fail("ERR timeout is not a float or out of range"))?;
    let ms = (seconds * 1000.0).ceil();
    if ms < 0.0 {
        return Err(fail("ERR timeout is negative"));
    }
    Ok(ms.min(u64::MAX as f64 / 2.0) as u64)
}

fn keys(args: &[Vec<u8>]) -> Vec<Vec<u8>> {
    args.to_vec()
}

/// Parses blocking command `name` (lower case, arity checked).
pub fn parse(name: &[u8], args: &Args) -> Result<Request, Failure> {
    let last = args.len() - 1;
    let request = |want, keys, timeout_ms| Request {
        want,
        keys,
        timeout_ms,
    };
    Ok(match name {
        b"blpop" | b"brpop" => {
            let timeout = parse_timeout(&args[last])?;
            let end = if name == b"blpop" {
                End::Left
            } else {
                End::Right
            };
            request(Want::Pop(end), keys(&args[1..last]), timeout)
        }
        b"bzpopmin" | b"bzpopmax" => {
            let timeout = parse_timeout(&args[last])?;
            request(
                Want::ZPop(name == b"bzpopmax"),
                keys(&args[1..last]),
                timeout,
            )
        }
        b"brpoplpush" => {
            let timeout = parse_timeout(&args[3])?;
            request(
                Want::Move(End::Right, End::Left),
                keys(&args[1..3]),
                timeout,
            )
        }
        b"blmove" => {
            let from = end_of(&args[3])?;
            let to = end_of(&args[4])?;
            let timeout = parse_timeout(&args[5])?;
            request(Want::Move(from, to), keys(&args[1..3]), timeout)
        }
        b"blmpop" => {
            let m = parse_lmpop(args, 2)?;
            let timeout = parse_timeout(&args[1])?;
            let keys = m.keys.iter().map(|k| k.to_vec()).collect();
            request(Want::ListMulti(m.side, m.count), keys, timeout)
        }
        b"xread" | b"xreadgroup" => {
            let r = super::streams::parse_read(args)?;
            let keys = r.streams.iter().map(|(k, _)| k.clone()).collect();
            let timeout = r.block_ms.unwrap_or(0);
            request(Want::Read(r), keys, timeout)
        }
        _ => {
            let m = zsets::parse_multi_pop(args, 2)?;
            let timeout = parse_timeout(&args[1])?;
            let keys = m.keys.iter().map(|k| k.to_vec()).collect();
            request(Want::ZSetMulti(m.side, m.count), keys, timeout)
        }
    })
}

/// What a blocking command answers when its time is up: Redis answers
/// every kind with a null array.
pub fn timeout_reply() -> Reply {
    Reply::NullArray
}

/// What a blocking command answers inside MULTI when there is nothing
/// (BLMOVE and BRPOPLPUSH a null bulk, as LMOVE does).
pub fn nothing_reply(name: &[u8]) -> Reply {
    match name {
        b"blmove" | b"brpoplpush" => Reply::Null,
        _ => Reply::NullArray,
    }
}

/// Whether the WRONGTYPE [`try_serve`] answered is about a key `r` waits
/// on (a woken client then waits on, as Redis serves a blocked client only
/// from keys of its type) rather than BLMOVE's destination (answered:
/// Redis's "BRPOPLPUSH with wrong destination type").
pub fn wrong_type_is_waited_on(ctx: &mut Ctx<'_>, r: &Request) -> bool {
    match r.want {
        Want::Move(..) => list_model::List::read(ctx, &r.keys[0]).is_err(),
        _ => true,
    }
}

/// One try: the reply when something was there, None when it must wait.
/// The caller holds the stripe locks of every key of `r`.
pub fn try_serve(ctx: &mut Ctx<'_>, r: &Request) -> Result<Option<Reply>, Failure> {
    match r.want {
        Want::Pop(end) => {
            for key in &r.keys {
                if list_model::List::read(ctx, key)?.is_none() {
                    continue;
                }
                let mut items = list_model::pop(ctx, key, end, 1)?.unwrap_or_default();
                let item = items.pop().unwrap_or_default();
                return Ok(Some(Reply::Array(vec![
                    Reply::Bulk(key.clone()),
                    Reply::Bulk(item),
                ])));
            }
            Ok(None)
        }
        Want::Move(from, to) => {
            let (src, dst) = (&r.keys[0], &r.keys[1]);
            if list_model::List::read(ctx, src)?.is_none() {
                return Ok(None);
            }
            Ok(list_model::lmove(ctx, src, dst, from, to)?.map(Reply::Bulk))
        }
        Want::ListMulti(end, count) => {
            let m = lists::MultiPop {
                keys: r.keys.iter().map(|k| &k[..]).collect(),
                side: end,
                count,
            };
            lists::multi_pop(ctx, &m)
        }
        Want::ZPop(max) => {
            for key in &r.keys {
                if zset::get(ctx, key)?.is_none() {
                    continue;
                }
                let Some((member, score)) = zset::pop(ctx, key, 1, max)?.pop() else {
                    continue;
                };
                return Ok(Some(Reply::Array(vec![
                    Reply::Bulk(key.clone()),
                    Reply::Bulk(member),
                    Reply::Double(format_double(score)),
                ])));
            }
            Ok(None)
        }
        Want::Read(ref r) => {
            let mut r = r.clone();
            super::streams::pin_ids(ctx, &mut r)?;
            super::streams::read_once(ctx, &r)
        }
        Want::ZSetMulti(max, count) => {
            let m = zsets::MultiPop {
                keys: r.keys.iter().map(|k| &k[..]).collect(),
                side: max,
                count,
            };
            zsets::multi_pop(ctx, &m)
        }
    }
}

/// A blocking command where it cannot block (inside MULTI): one try, and
/// the timeout's reply when nothing is there.
pub(super) fn once(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let name = args[0].to_ascii_lowercase();
    let r = parse(&name, args)?;
    let refs: Vec<&[u8]> = r.keys.iter().map(|k| &k[..]).collect();
    let _locked = ctx.lock(&refs);
    Ok(try_serve(ctx, &r)?.unwrap_or_else(|| nothing_reply(&name)))
}
