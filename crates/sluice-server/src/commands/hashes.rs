//! Hash commands, following Redis 7.0's t_hash.c. A small hash's fields
//! are listed in the order first set, as Redis lists a hash it keeps as a
//! listpack; a larger one's in byte order (Redis's hash table has an order
//! of its own, so clients of a large hash do not rely on one).

use super::keys::{parse_cursor, parse_scan_options};
use super::*;

use sluice_redis::hash;

/// Fields named in a request, with the values to set.
type FieldValues<'a> = Vec<(&'a [u8], &'a [u8])>;

fn field_pairs<'a>(args: &'a Args, command: &str) -> Result<FieldValues<'a>, Failure> {
    if !args.len().is_multiple_of(2) {
        return Err(Failure::Reply(format!(
            "ERR wrong number of arguments for '{command}' command"
        )));
    }
    Ok(args[2..]
        .chunks(2)
        .map(|p| (&p[0][..], &p[1][..]))
        .collect())
}

pub(super) fn hset(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let pairs = field_pairs(args, "hset")?;
    let _locked = ctx.lock(&[&args[1]]);
    Ok(int(hash::set(ctx, &args[1], &pairs, false)?))
}

pub(super) fn hmset(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let pairs = field_pairs(args, "hmset")?;
    let _locked = ctx.lock(&[&args[1]]);
    hash::set(ctx, &args[1], &pairs, false)?;
    Ok(ok())
}

pub(super) fn hsetnx(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let _locked = ctx.lock(&[&args[1]]);
    let pairs = [(&args[2][..], &args[3][..])];
    Ok(int(hash::set(ctx, &args[1], &pairs, true)?))
}

pub(super) fn hget(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    Ok(hash::field(ctx, &args[1], &args[2])?.map_or(Reply::Null, Reply::Bulk))
}

pub(super) fn hmget(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let live = hash::get(ctx, &args[1])?;
    let mut out = Vec::with_capacity(args.len() - 2);
    for field in &args[2..] {
        let value = match live {
            Some(c) => ctx.member(c.id, field)?,
            None => None,
        };
        out.push(value.map_or(Reply::Null, Reply::Bulk));
    }
    Ok(Reply::Array(out))
}

fn live_fields(ctx: &Ctx<'_>, key: &[u8]) -> Result<Pairs, Failure> {
    hash::all(ctx, key)
}

pub(super) fn hgetall(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let fields = live_fields(ctx, &args[1])?;
    Ok(Reply::Map(
        fields
            .into_iter()
            .map(|(f, v)| (Reply::Bulk(f), Reply::Bulk(v)))
            .collect(),
    ))
}

pub(super) fn hkeys(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let fields = live_fields(ctx, &args[1])?;
    Ok(Reply::Array(
        fields.into_iter().map(|(f, _)| Reply::Bulk(f)).collect(),
    ))
}

pub(super) fn hvals(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let fields = live_fields(ctx, &args[1])?;
    Ok(Reply::Array(
        fields.into_iter().map(|(_, v)| Reply::Bulk(v)).collect(),
    ))
}

pub(super) fn hdel(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    let fields: Vec<&[u8]> = args[2..].iter().map(|f| &f[..]).collect();
    Ok(int(hash::delete(ctx, key, &fields)?))
}

pub(super) fn hlen(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    Ok(int(hash::get(ctx, &args[1])?.map_or(0, |c| c.len) as i64))
}

pub(super) fn hexists(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let found = hash::field(ctx, &args[1], &args[2])?.is_some();
    Ok(int(i64::from(found)))
}

pub(super) fn hstrlen(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let len = hash::field(ctx, &args[1], &args[2])?.map_or(0, |v| v.len());
    Ok(int(len as i64))
}

/// Changes one field under the key's lock: `change` gets its value and
/// returns the new one and the reply.
fn update_field(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    field: &[u8],
    change: impl FnOnce(Option<&[u8]>) -> Result<(Vec<u8>, Reply), Failure>,
) -> Outcome {
    let _locked = ctx.lock(&[key]);
    let current = hash::field(ctx, key, field)?;
    let (new, reply) = change(current.as_deref())?;
    hash::set(ctx, key, &[(field, &new)], false)?;
    Ok(reply)
}

pub(super) fn hincrby(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let by = parse_i64(&args[3])?;
    update_field(ctx, &args[1], &args[2], |current| {
        let value = match current {
            None => 0,
            Some(v) => string_to_i64(v).ok_or_else(|| fail("ERR hash value is not an integer"))?,
        };
        let new = value.checked_add(by).ok_or_else(|| fail(OVERFLOW))?;
        Ok((new.to_string().into_bytes(), int(new)))
    })
}

pub(super) fn hincrbyfloat(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let by = &args[3];
    match long_double::LongDouble::parse(by) {
        Err(long_double::NotAFloat) => return Err(fail(NOT_FLOAT)),
        Ok(None) => return Err(fail("ERR value is NaN or Infinity")),
        Ok(Some(_)) => {}
    }
    update_field(ctx, &args[1], &args[2], |current| {
        let current = current.unwrap_or(b"0");
        let text = float_sum(current, by, "ERR hash value is not a float")?.into_bytes();
        Ok((text.clone(), Reply::Bulk(text)))
    })
}

/// HSCAN: every matching field in one reply, with cursor 0 (as Redis does
/// for a small hash; COUNT is a hint).
pub(super) fn hscan(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    parse_cursor(&args[2])?;
    let empty = || Reply::Array(vec![Reply::Bulk(b"0".to_vec()), Reply::Array(Vec::new())]);
    if hash::get(ctx, &args[1])?.is_none() {
        return Ok(empty());
    }
    let o = parse_scan_options(args, 3, false)?;
    let mut out = Vec::new();
    for (field, value) in hash::all(ctx, &args[1])? {
        if o.pattern.as_ref().is_none_or(|p| glob_match(p, &field)) {
            out.push(Reply::Bulk(field));
            out.push(Reply::Bulk(value));
        }
    }
    Ok(Reply::Array(vec![
        Reply::Bulk(b"0".to_vec()),
        Reply::Array(out),
    ]))
}

/// HRANDFIELD key [count [WITHVALUES]]: as SRANDMEMBER picks (a negative
/// count may repeat), with Redis 7.0's range checks.
pub(super) fn hrandfield(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let Some(count) = args.get(2) else {
        let Some(c) = sluice_redis::hash::get(ctx, &args[1])? else {
            return Ok(Reply::Null);
        };
        let picked = sluice_redis::set::random_entries(ctx, c, 1, false)?;
        return Ok(picked
            .into_iter()
            .next()
            .map_or(Reply::Null, |(f, _)| Reply::Bulk(f)));
    };
    let (l, withvalues) = super::zsets::parse_random_count(count, args, b"withvalues")?;
    let Some(c) = sluice_redis::hash::get(ctx, &args[1])? else {
        return Ok(Reply::Array(Vec::new()));
    };
    let picked = sluice_redis::set::random_entries(ctx, c, l.unsigned_abs(), l < 0)?;
    Ok(if withvalues {
        Reply::Pairs(
            picked
                .into_iter()
                .map(|(f, v)| (Reply::Bulk(f), Reply::Bulk(v)))
                .collect(),
        )
    } else {
        Reply::Array(picked.into_iter().map(|(f, _)| Reply::Bulk(f)).collect())
    })
}
