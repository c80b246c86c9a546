//! Set commands, following Redis 7.0's t_set.c: argument checks in its
//! order, its replies (RESP3 sets where Redis sends them) and error texts.
//! Members come back in byte order (Redis's are in hash order: clients
//! that need an order sort, and the differential test compares these
//! replies as sets).

use super::keys::{parse_cursor, parse_scan_options};
use super::*;
use sluice_redis::{set, Collection};
use std::collections::BTreeSet;

fn keys_of(args: &Args, from: usize) -> Vec<&[u8]> {
    args[from..].iter().map(|k| &k[..]).collect()
}

fn set_reply(members: impl IntoIterator<Item = Vec<u8>>) -> Reply {
    Reply::Set(members.into_iter().map(Reply::Bulk).collect())
}

pub(super) fn sadd(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    Ok(int(set::add(ctx, key, &keys_of(args, 2))?))
}

pub(super) fn srem(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    Ok(int(set::remove(ctx, key, &keys_of(args, 2))?))
}

pub(super) fn smove(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let (src, dst) = (&args[1][..], &args[2][..]);
    let _locked = ctx.lock(&[src, dst]);
    Ok(int(i64::from(set::smove(ctx, src, dst, &args[3])?)))
}

pub(super) fn sismember(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    Ok(int(i64::from(set::contains(ctx, &args[1], &args[2])?)))
}

pub(super) fn smismember(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let found = set::get(ctx, &args[1])?;
    let mut out = Vec::with_capacity(args.len() - 2);
    for member in &args[2..] {
        let is = match found {
            Some(c) => ctx.member(c.id, member)?.is_some(),
            None => false,
        };
        out.push(int(i64::from(is)));
    }
    Ok(Reply::Array(out))
}

pub(super) fn scard(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    Ok(int(set::get(ctx, &args[1])?.map_or(0, |c| c.len) as i64))
}

pub(super) fn smembers(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    Ok(set_reply(set::members(ctx, &args[1])?))
}

pub(super) fn spop(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    if args.len() > 3 {
        return Err(fail(SYNTAX));
    }
    let key = &args[1][..];
    let Some(count) = args.get(2) else {
        let _locked = ctx.lock(&[key]);
        return Ok(match set::pop(ctx, key, 1)? {
            Some(mut picked) => picked.pop().map_or(Reply::Null, Reply::Bulk),
            None => Reply::Null,
        });
    };
    let count = match string_to_i64(count) {
        Some(n) if n >= 0 => n as u64,
        _ => return Err(fail("ERR value is out of range, must be positive")),
    };
    let _locked = ctx.lock(&[key]);
    if count == 0 {
        set::get(ctx, key)?;
        return Ok(Reply::Set(Vec::new()));
    }
    Ok(set_reply(set::pop(ctx, key, count)?.unwrap_or_default()))
}

pub(super) fn srandmember(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    if args.len() > 3 {
        return Err(fail(SYNTAX));
    }
    let Some(count) = args.get(2) else {
        return Ok(match set::get(ctx, &args[1])? {
            Some(c) => set::random(ctx, c, 1, false)?
                .pop()
                .map_or(Reply::Null, Reply::Bulk),
            None => Reply::Null,
        });
    };
    let count = match string_to_i64(count) {
        Some(i64::MIN) => {
            return Err(fail(
                "ERR value is out of range, value must between -9223372036854775807 and 9223372036854775807",
            ))
        }
        Some(n) => n,
        None => return Err(fail(NOT_INTEGER)),
    };
    let Some(c) = set::get(ctx, &args[1])? else {
        return Ok(Reply::Array(Vec::new()));
    };
    let picked = set::random(ctx, c, count.unsigned_abs(), count < 0)?;
    Ok(Reply::Array(picked.into_iter().map(Reply::Bulk).collect()))
}

pub(super) fn sinter(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let found = set::each(ctx, &keys_of(args, 1))?;
    Ok(set_reply(set::inter(ctx, &found, 0)?))
}

pub(super) fn sintercard(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let numkeys = match string_to_i64(&args[1]) {
        Some(n) if n >= 1 => n as usize,
        _ => return Err(fail("ERR numkeys should be greater than 0")),
    };
    if numkeys > args.len() - 2 {
        return Err(fail(
            "ERR Number of keys can't be greater than number of args",
        ));
    }
    let mut limit = 0;
    let mut j = 2 + numkeys;
    while j < args.len() {
        if args[j].eq_ignore_ascii_case(b"limit") && j + 1 < args.len() {
            limit = match string_to_i64(&args[j + 1]) {
                Some(n) if n >= 0 => n as u64,
                _ => return Err(fail("ERR LIMIT can't be negative")),
            };
            j += 2;
        } else {
            return Err(fail(SYNTAX));
        }
    }
    let found = set::each(ctx, &keys_of(args, 2)[..numkeys])?;
    Ok(int(set::inter(ctx, &found, limit)?.len() as i64))
}

/// A *STORE command: `compute` over the sets `args[2..]` names, stored at
/// `args[1]`; replies with the result's size.
fn store_result(
    ctx: &mut Ctx<'_>,
    args: &Args,
    compute: impl FnOnce(&Ctx<'_>, &[Option<Collection>]) -> Result<BTreeSet<Vec<u8>>, Failure>,
) -> Outcome {
    let dst = &args[1][..];
    let keys = keys_of(args, 2);
    let mut locked_keys = keys.clone();
    locked_keys.push(dst);
    let _locked = ctx.lock(&locked_keys);
    let found = set::each(ctx, &keys)?;
    let result = compute(ctx, &found)?;
    Ok(int(set::store(ctx, dst, &result)?))
}

pub(super) fn sinterstore(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    store_result(ctx, args, |ctx, found| set::inter(ctx, found, 0))
}

pub(super) fn sunion(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let found = set::each(ctx, &keys_of(args, 1))?;
    Ok(set_reply(set::union(ctx, &found)?))
}

pub(super) fn sunionstore(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    store_result(ctx, args, set::union)
}

pub(super) fn sdiff(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let found = set::each(ctx, &keys_of(args, 1))?;
    Ok(set_reply(set::diff(ctx, &found)?))
}

pub(super) fn sdiffstore(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    store_result(ctx, args, set::diff)
}

/// SSCAN: every matching member in one reply, with cursor 0 (as Redis
/// does for a small set; COUNT is a hint).
pub(super) fn sscan(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    parse_cursor(&args[2])?;
    let empty = || Reply::Array(vec![Reply::Bulk(b"0".to_vec()), Reply::Array(Vec::new())]);
    if set::get(ctx, &args[1])?.is_none() {
        return Ok(empty());
    }
    let o = parse_scan_options(args, 3, false)?;
    let out = set::members(ctx, &args[1])?
        .into_iter()
        .filter(|m| o.pattern.as_ref().is_none_or(|p| glob_match(p, m)))
        .map(Reply::Bulk)
        .collect();
    Ok(Reply::Array(vec![
        Reply::Bulk(b"0".to_vec()),
        Reply::Array(out),
    ]))
}
