//! List commands, following Redis 7.0's t_list.c: argument checks in its
//! order, its replies and error texts. The lists themselves are
//! `sluice_redis::list`'s.

use super::*;
use crate::resp::BulkArray;
use sluice_redis::list::{self, End};

/// Bytes an LRANGE item is guessed to take, to make room for the reply.
const LRANGE_ITEM_BYTES_GUESS: usize = 32;

/// Redis's `getPositiveLongFromObjectOrReply`: a non-negative integer, or
/// `message` (Redis's default when None) for anything else.
fn positive(arg: &[u8], message: Option<&str>) -> Result<u64, Failure> {
    let message = message.unwrap_or("ERR value is out of range, must be positive");
    match string_to_i64(arg) {
        Some(n) if n >= 0 => Ok(n as u64),
        _ => Err(fail(message)),
    }
}

/// LEFT or RIGHT, as Redis spells them in LMOVE and LMPOP.
pub(crate) fn end_of(arg: &[u8]) -> Result<End, Failure> {
    if arg.eq_ignore_ascii_case(b"left") {
        Ok(End::Left)
    } else if arg.eq_ignore_ascii_case(b"right") {
        Ok(End::Right)
    } else {
        Err(fail(SYNTAX))
    }
}

fn bulks(items: Vec<Vec<u8>>) -> Reply {
    Reply::Array(items.into_iter().map(Reply::Bulk).collect())
}

fn push(ctx: &mut Ctx<'_>, args: &Args, end: End, only_existing: bool) -> Outcome {
    let key = &args[1][..];
    let values: Vec<&[u8]> = args[2..].iter().map(|v| &v[..]).collect();
    let _locked = ctx.lock(&[key]);
    Ok(int(list::push(ctx, key, &values, end, only_existing)?))
}

pub(super) fn lpush(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    push(ctx, args, End::Left, false)
}

pub(super) fn rpush(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    push(ctx, args, End::Right, false)
}

pub(super) fn lpushx(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    push(ctx, args, End::Left, true)
}

pub(super) fn rpushx(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    push(ctx, args, End::Right, true)
}

fn pop(ctx: &mut Ctx<'_>, args: &Args, end: End) -> Outcome {
    if args.len() > 3 {
        return Ok(wrong_arity(if end == End::Left { "lpop" } else { "rpop" }));
    }
    let count = match args.get(2) {
        Some(arg) => Some(positive(arg, None)?),
        None => None,
    };
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    let Some(count) = count else {
        return Ok(match list::pop(ctx, key, end, 1)? {
            Some(mut items) => items.pop().map_or(Reply::Null, Reply::Bulk),
            None => Reply::Null,
        });
    };
    if count == 0 {
        // Redis looks the key up (and checks its type) before this exit.
        return Ok(match list::List::read(ctx, key)? {
            Some(_) => Reply::Array(Vec::new()),
            None => Reply::NullArray,
        });
    }
    Ok(list::pop(ctx, key, end, count)?.map_or(Reply::NullArray, bulks))
}

pub(super) fn lpop(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    pop(ctx, args, End::Left)
}

pub(super) fn rpop(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    pop(ctx, args, End::Right)
}

pub(super) fn llen(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    Ok(int(list::len(ctx, &args[1])? as i64))
}

pub(super) fn lrange(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let (start, stop) = (parse_i64(&args[2])?, parse_i64(&args[3])?);
    let Some(list) = list::List::read(ctx, &args[1])? else {
        return Ok(Reply::Bulks(BulkArray::default()));
    };
    let Some((first, last)) = list::resolve_range(start, stop, list.len()) else {
        return Ok(Reply::Bulks(BulkArray::default()));
    };
    // The items go from the store's buffers into the framed reply.
    let n = (last - first + 1) as usize;
    let mut items = BulkArray::with_capacity(n, LRANGE_ITEM_BYTES_GUESS);
    list.visit_items(ctx, first, last, |item| items.push(item))?;
    Ok(Reply::Bulks(items))
}

/// LRANGE framed straight onto `out`, a connection's queued replies, where
/// [`lrange`] would frame its items apart and the reply be copied there
/// (a tenth of a pipelined LRANGE_100's time with 100-byte items). Whether
/// it did: with false, `out` is as it was and the command is left to the
/// general way, which answers what this does not (no such key, an empty
/// range, a wrong type, a bad index, a store error).
pub(crate) fn lrange_into(ctx: &mut Ctx<'_>, args: &Args, out: &mut Vec<u8>) -> bool {
    let (Ok(start), Ok(stop)) = (parse_i64(&args[2]), parse_i64(&args[3])) else {
        return false;
    };
    let Ok(Some(list)) = list::List::read(ctx, &args[1]) else {
        return false;
    };
    let Some((first, last)) = list::resolve_range(start, stop, list.len()) else {
        return false;
    };
    let n = (last - first + 1) as usize;
    let mark = out.len();
    crate::resp::reply::push_array_header(out, n);
    let mut pushed = 0;
    let visited = list.visit_items(ctx, first, last, |item| {
        crate::resp::reply::push_bulk(out, item);
        pushed += 1;
    });
    if visited.is_err() || pushed != n {
        // The header promised n items: none of it goes out.
        out.truncate(mark);
        return false;
    }
    true
}

pub(super) fn lindex(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    // Redis checks the key's type before the index.
    if list::List::read(ctx, &args[1])?.is_none() {
        return Ok(Reply::Null);
    }
    let index = parse_i64(&args[2])?;
    Ok(list::index(ctx, &args[1], index)?.map_or(Reply::Null, Reply::Bulk))
}

pub(super) fn lset(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    // Redis answers a missing key before it parses the index.
    if list::List::read(ctx, key)?.is_none() {
        return Err(fail(sluice_redis::error::NO_SUCH_KEY));
    }
    let index = parse_i64(&args[2])?;
    list::set(ctx, key, index, &args[3])?;
    Ok(ok())
}

pub(super) fn ltrim(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let (start, stop) = (parse_i64(&args[2])?, parse_i64(&args[3])?);
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    list::trim(ctx, key, start, stop)?;
    Ok(ok())
}

pub(super) fn lrem(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let count = parse_i64(&args[2])?;
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    Ok(int(list::remove(ctx, key, count, &args[3])?))
}

pub(super) fn linsert(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let after = if args[2].eq_ignore_ascii_case(b"after") {
        true
    } else if args[2].eq_ignore_ascii_case(b"before") {
        false
    } else {
        return Err(fail(SYNTAX));
    };
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    Ok(int(list::insert(ctx, key, after, &args[3], &args[4])?))
}

pub(super) fn lpos(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let mut o = list::Position {
        rank: 1,
        count: 0,
        maxlen: 0,
    };
    let mut with_count = false;
    let mut j = 3;
    while j < args.len() {
        let more = j + 1 < args.len();
        if args[j].eq_ignore_ascii_case(b"rank") && more {
            o.rank = parse_i64(&args[j + 1])?;
            if o.rank == 0 {
                return Err(fail("ERR RANK can't be zero: use 1 to start from the first match, 2 from the second ... or use negative to start from the end of the list"));
            }
        } else if args[j].eq_ignore_ascii_case(b"count") && more {
            o.count = positive(&args[j + 1], Some("ERR COUNT can't be negative"))?;
            with_count = true;
        } else if args[j].eq_ignore_ascii_case(b"maxlen") && more {
            o.maxlen = positive(&args[j + 1], Some("ERR MAXLEN can't be negative"))?;
        } else {
            return Err(fail(SYNTAX));
        }
        j += 2;
    }
    if !with_count {
        o.count = 1;
    }
    let found = list::position(ctx, &args[1], &args[2], o)?;
    if with_count {
        return Ok(Reply::Array(
            found.into_iter().map(|p| int(p as i64)).collect(),
        ));
    }
    Ok(found.first().map_or(Reply::Null, |p| int(*p as i64)))
}

fn lmove_generic(ctx: &mut Ctx<'_>, src: &[u8], dst: &[u8], from: End, to: End) -> Outcome {
    let _locked = ctx.lock(&[src, dst]);
    Ok(list::lmove(ctx, src, dst, from, to)?.map_or(Reply::Null, Reply::Bulk))
}

pub(super) fn lmove(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let (from, to) = (end_of(&args[3])?, end_of(&args[4])?);
    lmove_generic(ctx, &args[1], &args[2], from, to)
}

pub(super) fn rpoplpush(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    lmove_generic(ctx, &args[1], &args[2], End::Right, End::Left)
}

/// LMPOP's arguments: its keys, the end (LEFT|RIGHT), the count.
pub(crate) type MultiPop<'a> = super::multi_pop::MultiPop<'a, End>;

/// Parses `numkeys key... LEFT|RIGHT [COUNT n]` from `args[at..]`.
pub(crate) fn parse_multi_pop(args: &Args, at: usize) -> Result<MultiPop<'_>, Failure> {
    super::multi_pop::parse(args, at, end_of)
}

/// Pops from the first of `m.keys` holding a list: `[key, [items]]`, or
/// None when none does. The caller holds the keys' locks.
pub(crate) fn multi_pop(ctx: &mut Ctx<'_>, m: &MultiPop<'_>) -> Result<Option<Reply>, Failure> {
    for key in &m.keys {
        if list::List::read(ctx, key)?.is_none() {
            continue;
        }
        let items = list::pop(ctx, key, m.side, m.count)?.unwrap_or_default();
        return Ok(Some(Reply::Array(vec![
            Reply::Bulk(key.to_vec()),
            bulks(items),
        ])));
    }
    Ok(None)
}

pub(super) fn lmpop(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let m = parse_multi_pop(args, 1)?;
    let _locked = ctx.lock(&m.keys);
    Ok(multi_pop(ctx, &m)?.unwrap_or(Reply::NullArray))
}
