//! Hash commands, following Redis 7.0's t_hash.c. Fields are listed in
//! field order (Redis lists a small hash in insertion order: clients that
//! need an order sort, and the differential test compares these replies
//! as sets).

use super::keys::{parse_cursor, parse_scan_options};
use super::*;

/// The live hash at `key`: its field count, None if there is no key,
/// WRONGTYPE if it holds something else.
fn hash_len(ctx: &Ctx<'_>, key: &[u8]) -> Result<Option<u64>, Failure> {
    match ctx.get(key)? {
        None => Ok(None),
        Some(Entry {
            value: Value::Hash { len },
            ..
        }) => Ok(Some(len)),
        Some(_) => Err(fail(WRONGTYPE)),
    }
}

/// Sets `pairs` in hash `key` (made if missing); returns how many fields
/// are new. `only_new`: HSETNX, leaves an existing field alone.
fn set_fields(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    pairs: &[(&[u8], Vec<u8>)],
    only_new: bool,
) -> Result<i64, Failure> {
    let (old, mut batch) = ctx.begin(key)?;
    let (mut len, expire_at_ms) = match old {
        None => (0, 0),
        Some(Entry {
            value: Value::Hash { len },
            expire_at_ms,
        }) => (len, expire_at_ms),
        Some(_) => return Err(fail(WRONGTYPE)),
    };
    let mut added = 0;
    let mut seen = std::collections::HashSet::new();
    for (field, value) in pairs {
        let exists = !seen.insert(*field) || (len > 0 && ctx.field(key, field)?.is_some());
        if exists && only_new {
            continue;
        }
        if !exists {
            added += 1;
        }
        batch.put_field(key, field, value)?;
    }
    len += added as u64;
    if added > 0 || len == 0 {
        batch.put(
            key,
            &Entry {
                value: Value::Hash { len },
                expire_at_ms,
            },
        )?;
    }
    ctx.commit(batch)?;
    Ok(added)
}

/// Fields named in a request, with the values to set.
type FieldValues<'a> = Vec<(&'a [u8], Vec<u8>)>;

fn field_pairs<'a>(args: &'a Args, command: &str) -> Result<FieldValues<'a>, Failure> {
    if !args.len().is_multiple_of(2) {
        return Err(Failure::Reply(format!(
            "ERR wrong number of arguments for '{command}' command"
        )));
    }
    Ok(args[2..]
        .chunks(2)
        .map(|p| (&p[0][..], p[1].clone()))
        .collect())
}

pub(super) fn hset(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let pairs = field_pairs(args, "hset")?;
    let _locked = ctx.lock(&[&args[1]]);
    Ok(int(set_fields(ctx, &args[1], &pairs, false)?))
}

pub(super) fn hmset(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let pairs = field_pairs(args, "hmset")?;
    let _locked = ctx.lock(&[&args[1]]);
    set_fields(ctx, &args[1], &pairs, false)?;
    Ok(ok())
}

pub(super) fn hsetnx(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let _locked = ctx.lock(&[&args[1]]);
    let pairs = [(&args[2][..], args[3].clone())];
    Ok(int(set_fields(ctx, &args[1], &pairs, true)?))
}

pub(super) fn hget(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    if hash_len(ctx, &args[1])?.is_none() {
        return Ok(Reply::Null);
    }
    Ok(ctx
        .field(&args[1], &args[2])?
        .map_or(Reply::Null, Reply::Bulk))
}

pub(super) fn hmget(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let live = hash_len(ctx, &args[1])?.is_some();
    let mut out = Vec::with_capacity(args.len() - 2);
    for field in &args[2..] {
        let value = if live {
            ctx.field(&args[1], field)?
        } else {
            None
        };
        out.push(value.map_or(Reply::Null, Reply::Bulk));
    }
    Ok(Reply::Array(out))
}

fn live_fields(ctx: &Ctx<'_>, key: &[u8]) -> Result<Pairs, Failure> {
    match hash_len(ctx, key)? {
        None => Ok(Vec::new()),
        Some(_) => Ok(ctx.fields(key)?),
    }
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
    let (old, mut batch) = ctx.begin(key)?;
    let (len, expire_at_ms) = match old {
        None => {
            ctx.commit(batch)?;
            return Ok(int(0));
        }
        Some(Entry {
            value: Value::Hash { len },
            expire_at_ms,
        }) => (len, expire_at_ms),
        Some(_) => return Err(fail(WRONGTYPE)),
    };
    let mut removed = 0u64;
    let mut seen = std::collections::HashSet::new();
    for field in &args[2..] {
        if seen.insert(&field[..]) && ctx.field(key, field)?.is_some() {
            batch.remove_field(key, field)?;
            removed += 1;
        }
    }
    let left = len - removed.min(len);
    if left == 0 {
        ctx.remove(&mut batch, key, &Value::Hash { len })?;
    } else if removed > 0 {
        batch.put(
            key,
            &Entry {
                value: Value::Hash { len: left },
                expire_at_ms,
            },
        )?;
    }
    ctx.commit(batch)?;
    Ok(int(removed as i64))
}

pub(super) fn hlen(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    Ok(int(hash_len(ctx, &args[1])?.unwrap_or(0) as i64))
}

pub(super) fn hexists(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let found = hash_len(ctx, &args[1])?.is_some() && ctx.field(&args[1], &args[2])?.is_some();
    Ok(int(i64::from(found)))
}

pub(super) fn hstrlen(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    if hash_len(ctx, &args[1])?.is_none() {
        return Ok(int(0));
    }
    let len = ctx.field(&args[1], &args[2])?.map_or(0, |v| v.len());
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
    let current = match hash_len(ctx, key)? {
        Some(_) => ctx.field(key, field)?,
        None => None,
    };
    let (new, reply) = change(current.as_deref())?;
    set_fields(ctx, key, &[(field, new)], false)?;
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
    if hash_len(ctx, &args[1])?.is_none() {
        return Ok(empty());
    }
    let o = parse_scan_options(args, 3, false)?;
    let mut out = Vec::new();
    for (field, value) in ctx.fields(&args[1])? {
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
