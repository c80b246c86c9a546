//! Sorted set commands, following Redis 7.0's t_zset.c: argument checks
//! in its order, its replies (WITHSCORES as pairs in RESP3, flat in
//! RESP2; scores printed as `%.17g`) and error texts. The sorted sets
//! themselves are `sluice_redis::zset`'s.

use super::keys::{parse_cursor, parse_scan_options};
use super::*;
use sluice_redis::number::{format_double, parse_double};
use sluice_redis::zset::{self, AddFlags, LexRange, ScoreBound, ScoreRange, Scored};
use sluice_redis::Collection;
use std::ops::Bound;

pub(super) fn double(score: f64) -> Reply {
    Reply::Double(format_double(score))
}

fn member_list(items: Vec<Scored>, withscores: bool) -> Reply {
    if withscores {
        Reply::Pairs(
            items
                .into_iter()
                .map(|(m, s)| (Reply::Bulk(m), double(s)))
                .collect(),
        )
    } else {
        Reply::Array(items.into_iter().map(|(m, _)| Reply::Bulk(m)).collect())
    }
}

/// A score as `getDoubleFromObjectOrReply` takes it.
fn parse_score(arg: &[u8], message: &str) -> Result<f64, Failure> {
    parse_double(arg).ok_or_else(|| fail(message))
}

/// One end of a score range as `zslParseRange` reads it: `strtod` over
/// what follows an optional `(`, with leading spaces, overflow to ±inf
/// and an empty number (0) taken as C takes them; only NaN and trailing
/// bytes are refused.
fn parse_score_bound(arg: &[u8]) -> Option<ScoreBound> {
    let (open, text) = match arg.split_first() {
        Some((b'(', rest)) => (true, rest),
        _ => (false, arg),
    };
    let value = if text.is_empty() {
        0.0
    } else {
        let s = std::str::from_utf8(text).ok()?;
        let trimmed = s.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
        if trimmed.is_empty() {
            return None;
        }
        match parse_double(trimmed.as_bytes()) {
            Some(v) => v,
            // strtod's overflow (±HUGE_VAL) and underflow (0) are kept.
            None => lenient(trimmed)?,
        }
    };
    Some(if open {
        ScoreBound::Excluded(value)
    } else {
        ScoreBound::Included(value)
    })
}

/// A decimal that only overflows or underflows: what strtod returns then.
fn lenient(s: &str) -> Option<f64> {
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    if unsigned.is_empty()
        || !unsigned
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
    {
        return None;
    }
    let v: f64 = s.parse().ok()?;
    (!v.is_nan()).then_some(v)
}

fn parse_score_range(min: &[u8], max: &[u8]) -> Result<ScoreRange, Failure> {
    match (parse_score_bound(min), parse_score_bound(max)) {
        (Some(min), Some(max)) => Ok(ScoreRange { min, max }),
        _ => Err(fail("ERR min or max is not a float")),
    }
}

fn parse_lex_item(arg: &[u8]) -> Option<Bound<Vec<u8>>> {
    match arg.split_first()? {
        (b'+' | b'-', []) => Some(Bound::Unbounded),
        (b'(', rest) => Some(Bound::Excluded(rest.to_vec())),
        (b'[', rest) => Some(Bound::Included(rest.to_vec())),
        _ => None,
    }
}

/// `-` is below everything and `+` above: as a low end `+` leaves nothing,
/// as a high end `-` leaves nothing.
fn parse_lex_range(min: &[u8], max: &[u8]) -> Result<Option<LexRange>, Failure> {
    let bad = || fail("ERR min or max not valid string range item");
    let (lo, hi) = (
        parse_lex_item(min).ok_or_else(bad)?,
        parse_lex_item(max).ok_or_else(bad)?,
    );
    if min == b"+" || max == b"-" {
        return Ok(None);
    }
    Ok(Some(LexRange { min: lo, max: hi }))
}

pub(super) fn zadd(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    add_generic(ctx, args, false)
}

pub(super) fn zincrby(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    add_generic(ctx, args, true)
}

fn add_generic(ctx: &mut Ctx<'_>, args: &Args, incrby: bool) -> Outcome {
    let mut f = AddFlags {
        incr: incrby,
        ..AddFlags::default()
    };
    let mut ch = false;
    let mut at = 2;
    while at < args.len() {
        let o = args[at].to_ascii_lowercase();
        match &o[..] {
            b"nx" => f.nx = true,
            b"xx" => f.xx = true,
            b"ch" => ch = true,
            b"incr" => f.incr = true,
            b"gt" => f.gt = true,
            b"lt" => f.lt = true,
            _ => break,
        }
        at += 1;
    }
    let elements = args.len() - at;
    if !elements.is_multiple_of(2) || elements == 0 {
        return Err(fail(SYNTAX));
    }
    if f.nx && f.xx {
        return Err(fail(
            "ERR XX and NX options at the same time are not compatible",
        ));
    }
    if (f.nx && (f.gt || f.lt)) || (f.gt && f.lt) {
        return Err(fail(
            "ERR GT, LT, and/or NX options at the same time are not compatible",
        ));
    }
    if f.incr && elements > 2 {
        return Err(fail(
            "ERR INCR option supports a single increment-element pair",
        ));
    }
    let mut items = Vec::with_capacity(elements / 2);
    for pair in args[at..].chunks(2) {
        items.push((parse_score(&pair[0], NOT_FLOAT)?, &pair[1][..]));
    }
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    let done = zset::add(ctx, key, &items, f)?;
    if f.incr {
        return Ok(done.score.map_or(Reply::Null, double));
    }
    Ok(int((if ch {
        done.added + done.updated
    } else {
        done.added
    }) as i64))
}

pub(super) fn zrem(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let key = &args[1][..];
    let members: Vec<&[u8]> = args[2..].iter().map(|m| &m[..]).collect();
    let _locked = ctx.lock(&[key]);
    Ok(int(zset::remove(ctx, key, &members)?))
}

pub(super) fn zcard(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    Ok(int(zset::get(ctx, &args[1])?.map_or(0, |c| c.len) as i64))
}

pub(super) fn zscore(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let Some(c) = zset::get(ctx, &args[1])? else {
        return Ok(Reply::Null);
    };
    Ok(zset::score(ctx, c, &args[2])?.map_or(Reply::Null, double))
}

pub(super) fn zmscore(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let found = zset::get(ctx, &args[1])?;
    let mut out = Vec::with_capacity(args.len() - 2);
    for m in &args[2..] {
        let s = match found {
            Some(c) => zset::score(ctx, c, m)?,
            None => None,
        };
        out.push(s.map_or(Reply::Null, double));
    }
    Ok(Reply::Array(out))
}

fn rank_generic(ctx: &mut Ctx<'_>, args: &Args, reverse: bool) -> Outcome {
    let Some(c) = zset::get(ctx, &args[1])? else {
        return Ok(Reply::Null);
    };
    Ok(zset::rank(ctx, c, &args[2], reverse)?.map_or(Reply::Null, |r| int(r as i64)))
}

pub(super) fn zrank(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    rank_generic(ctx, args, false)
}

pub(super) fn zrevrank(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    rank_generic(ctx, args, true)
}

pub(super) fn zcount(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let range = parse_score_range(&args[2], &args[3])?;
    let Some(c) = zset::get(ctx, &args[1])? else {
        return Ok(int(0));
    };
    let mut n = 0;
    for item in zset::in_score_range(ctx, c, range, false) {
        item?;
        n += 1;
    }
    Ok(int(n))
}

pub(super) fn zlexcount(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let range = parse_lex_range(&args[2], &args[3])?;
    let Some(c) = zset::get(ctx, &args[1])? else {
        return Ok(int(0));
    };
    let Some(range) = range else {
        return Ok(int(0));
    };
    let mut n = 0;
    for item in zset::in_lex_range(ctx, c, &range, false) {
        item?;
        n += 1;
    }
    Ok(int(n))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum RangeType {
    Auto,
    Rank,
    Score,
    Lex,
}

/// What a range command asks for, parsed.
enum Query {
    Rank(i64, i64),
    Score(ScoreRange),
    Lex(Option<LexRange>),
}

struct RangeRequest {
    query: Query,
    reverse: bool,
    withscores: bool,
    offset: i64,
    limit: i64,
}

/// Parses `key min max [options]` from `args[at..]` as
/// `zrangeGenericCommand` does.
fn parse_range(
    args: &Args,
    at: usize,
    store: bool,
    mut kind: RangeType,
    mut reverse: Option<bool>,
) -> Result<RangeRequest, Failure> {
    let (mut withscores, mut offset, mut limit) = (false, 0i64, -1i64);
    let mut j = at + 3;
    while j < args.len() {
        let left = args.len() - j - 1;
        let word = args[j].to_ascii_lowercase();
        if !store && word == b"withscores" {
            withscores = true;
        } else if word == b"limit" && left >= 2 {
            offset = parse_i64(&args[j + 1])?;
            limit = parse_i64(&args[j + 2])?;
            j += 2;
        } else if reverse.is_none() && word == b"rev" {
            reverse = Some(true);
        } else if kind == RangeType::Auto && word == b"bylex" {
            kind = RangeType::Lex;
        } else if kind == RangeType::Auto && word == b"byscore" {
            kind = RangeType::Score;
        } else {
            return Err(fail(SYNTAX));
        }
        j += 1;
    }
    let reverse = reverse.unwrap_or(false);
    if kind == RangeType::Auto {
        kind = RangeType::Rank;
    }
    if limit != -1 && kind == RangeType::Rank {
        return Err(fail(
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX",
        ));
    }
    if withscores && kind == RangeType::Lex {
        return Err(fail(
            "ERR syntax error, WITHSCORES not supported in combination with BYLEX",
        ));
    }
    let (mut min, mut max) = (&args[at + 1][..], &args[at + 2][..]);
    if reverse && kind != RangeType::Rank {
        std::mem::swap(&mut min, &mut max);
    }
    let query = match kind {
        RangeType::Score => Query::Score(parse_score_range(min, max)?),
        RangeType::Lex => Query::Lex(parse_lex_range(min, max)?),
        _ => Query::Rank(parse_i64(min)?, parse_i64(max)?),
    };
    Ok(RangeRequest {
        query,
        reverse,
        withscores,
        offset,
        limit,
    })
}

/// The members `r` selects from `c`.
fn select(ctx: &Ctx<'_>, c: Collection, r: &RangeRequest) -> Result<Vec<Scored>, Failure> {
    let walk = match &r.query {
        Query::Rank(start, stop) => {
            let Some((first, last)) = sluice_redis::list::resolve_range(*start, *stop, c.len)
            else {
                return Ok(Vec::new());
            };
            return zset::ordered(ctx, c, r.reverse)
                .skip(first as usize)
                .take((last - first + 1) as usize)
                .collect();
        }
        Query::Score(range) => zset::in_score_range(ctx, c, *range, r.reverse),
        Query::Lex(None) => return Ok(Vec::new()),
        Query::Lex(Some(range)) => zset::in_lex_range(ctx, c, range, r.reverse),
    };
    if r.offset < 0 || (r.offset > 0 && r.offset as u64 >= c.len) {
        return Ok(Vec::new());
    }
    let take = if r.limit < 0 {
        usize::MAX
    } else {
        r.limit as usize
    };
    walk.skip(r.offset as usize).take(take).collect()
}

fn range_generic(
    ctx: &mut Ctx<'_>,
    args: &Args,
    kind: RangeType,
    reverse: Option<bool>,
) -> Outcome {
    let r = parse_range(args, 1, false, kind, reverse)?;
    let Some(c) = zset::get(ctx, &args[1])? else {
        return Ok(Reply::Array(Vec::new()));
    };
    Ok(member_list(select(ctx, c, &r)?, r.withscores))
}

pub(super) fn zrange(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    range_generic(ctx, args, RangeType::Auto, None)
}

pub(super) fn zrevrange(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    range_generic(ctx, args, RangeType::Rank, Some(true))
}

pub(super) fn zrangebyscore(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    range_generic(ctx, args, RangeType::Score, Some(false))
}

pub(super) fn zrevrangebyscore(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    range_generic(ctx, args, RangeType::Score, Some(true))
}

pub(super) fn zrangebylex(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    range_generic(ctx, args, RangeType::Lex, Some(false))
}

pub(super) fn zrevrangebylex(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    range_generic(ctx, args, RangeType::Lex, Some(true))
}

pub(super) fn zrangestore(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let r = parse_range(args, 2, true, RangeType::Auto, None)?;
    let (dst, src) = (&args[1][..], &args[2][..]);
    let _locked = ctx.lock(&[dst, src]);
    let items = match zset::get(ctx, src)? {
        Some(c) => select(ctx, c, &r)?,
        None => Vec::new(),
    };
    Ok(int(zset::store(ctx, dst, &items)?))
}

fn remrange(ctx: &mut Ctx<'_>, args: &Args, kind: RangeType) -> Outcome {
    let query = match kind {
        RangeType::Score => Query::Score(parse_score_range(&args[2], &args[3])?),
        RangeType::Lex => Query::Lex(parse_lex_range(&args[2], &args[3])?),
        _ => Query::Rank(parse_i64(&args[2])?, parse_i64(&args[3])?),
    };
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    let Some(c) = zset::get(ctx, key)? else {
        return Ok(int(0));
    };
    let r = RangeRequest {
        query,
        reverse: false,
        withscores: false,
        offset: 0,
        limit: -1,
    };
    let doomed = select(ctx, c, &r)?;
    Ok(int(zset::remove_scored(ctx, key, &doomed)? as i64))
}

pub(super) fn zremrangebyrank(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    remrange(ctx, args, RangeType::Rank)
}

pub(super) fn zremrangebyscore(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    remrange(ctx, args, RangeType::Score)
}

pub(super) fn zremrangebylex(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    remrange(ctx, args, RangeType::Lex)
}

fn pop_generic(ctx: &mut Ctx<'_>, args: &Args, max: bool) -> Outcome {
    if args.len() > 3 {
        return Err(fail(SYNTAX));
    }
    let count = match args.get(2) {
        None => None,
        Some(arg) => match string_to_i64(arg) {
            Some(n) if n >= 0 => Some(n as u64),
            _ => return Err(fail("ERR value is out of range, must be positive")),
        },
    };
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    if zset::get(ctx, key)?.is_none() || count == Some(0) {
        return Ok(Reply::Array(Vec::new()));
    }
    let picked = zset::pop(ctx, key, count.unwrap_or(1), max)?;
    Ok(match count {
        // A plain pop is one flat pair in either protocol.
        None => Reply::Array(
            picked
                .into_iter()
                .flat_map(|(m, s)| [Reply::Bulk(m), double(s)])
                .collect(),
        ),
        Some(_) => member_list(picked, true),
    })
}

pub(super) fn zpopmin(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    pop_generic(ctx, args, false)
}

pub(super) fn zpopmax(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    pop_generic(ctx, args, true)
}

/// ZMPOP's arguments: its keys, the end (MAX: true, MIN: false), the
/// count.
pub(crate) type MultiPop<'a> = super::multi_pop::MultiPop<'a, bool>;

/// Parses `numkeys key... MIN|MAX [COUNT n]` from `args[at..]`.
pub(crate) fn parse_multi_pop(args: &Args, at: usize) -> Result<MultiPop<'_>, Failure> {
    super::multi_pop::parse(args, at, |arg| {
        if arg.eq_ignore_ascii_case(b"min") {
            Ok(false)
        } else if arg.eq_ignore_ascii_case(b"max") {
            Ok(true)
        } else {
            Err(fail(SYNTAX))
        }
    })
}

/// Pops from the first of `m.keys` holding a sorted set: `[key, [[member,
/// score]...]]`, or None when none does. The caller holds the keys' locks.
pub(crate) fn multi_pop(ctx: &mut Ctx<'_>, m: &MultiPop<'_>) -> Result<Option<Reply>, Failure> {
    for key in &m.keys {
        if zset::get(ctx, key)?.is_none() {
            continue;
        }
        let picked = zset::pop(ctx, key, m.count, m.side)?;
        let pairs = picked
            .into_iter()
            .map(|(member, s)| Reply::Array(vec![Reply::Bulk(member), double(s)]))
            .collect();
        return Ok(Some(Reply::Array(vec![
            Reply::Bulk(key.to_vec()),
            Reply::Array(pairs),
        ])));
    }
    Ok(None)
}

pub(super) fn zmpop(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let m = parse_multi_pop(args, 1)?;
    let _locked = ctx.lock(&m.keys);
    Ok(multi_pop(ctx, &m)?.unwrap_or(Reply::NullArray))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum SetOp {
    Union,
    Inter,
    Diff,
}

#[derive(Clone, Copy)]
enum Aggregate {
    Sum,
    Min,
    Max,
}

fn aggregate(target: &mut f64, value: f64, how: Aggregate) {
    match how {
        Aggregate::Sum => {
            *target += value;
            if target.is_nan() {
                *target = 0.0;
            }
        }
        Aggregate::Min => {
            if value < *target {
                *target = value;
            }
        }
        Aggregate::Max => {
            if value > *target {
                *target = value;
            }
        }
    }
}

/// One input of ZUNION/ZINTER/ZDIFF: a sorted set's members with scores,
/// or a set's with score 1.
fn source(ctx: &Ctx<'_>, key: &[u8]) -> Result<Vec<Scored>, Failure> {
    match ctx.get(key)? {
        None => Ok(Vec::new()),
        Some(sluice_redis::Entry {
            value: sluice_redis::Value::ZSet(c),
            ..
        }) => zset::all(ctx, c),
        Some(sluice_redis::Entry {
            value: sluice_redis::Value::Set(c),
            ..
        }) => Ok(ctx
            .all_members(c.id)?
            .into_iter()
            .map(|(m, _)| (m, 1.0))
            .collect()),
        Some(_) => Err(fail(WRONGTYPE)),
    }
}

/// What a ZUNION/ZINTER/ZDIFF call asks for.
struct Combine {
    weights: Vec<f64>,
    how: Aggregate,
    withscores: bool,
    limit: u64,
}

fn parse_combine(
    ctx: &Ctx<'_>,
    args: &Args,
    at: usize,
    op: SetOp,
    store: bool,
    card: bool,
    name: &str,
) -> Result<(Combine, Vec<Vec<Scored>>), Failure> {
    let setnum = parse_i64(&args[at])?;
    if setnum < 1 {
        return Err(Failure::Reply(format!(
            "ERR at least 1 input key is needed for '{name}' command"
        )));
    }
    if setnum as u64 > (args.len() - at - 1) as u64 {
        return Err(fail(SYNTAX));
    }
    let n = setnum as usize;
    let keys: Vec<&[u8]> = args[at + 1..at + 1 + n].iter().map(|k| &k[..]).collect();
    // Redis reads (and type-checks) the inputs before the options.
    let inputs = keys
        .iter()
        .map(|k| source(ctx, k))
        .collect::<Result<Vec<_>, _>>()?;
    let mut c = Combine {
        weights: vec![1.0; n],
        how: Aggregate::Sum,
        withscores: false,
        limit: 0,
    };
    let mut j = at + 1 + n;
    while j < args.len() {
        let remaining = args.len() - j;
        let word = args[j].to_ascii_lowercase();
        if op != SetOp::Diff && !card && remaining > n && word == b"weights" {
            for i in 0..n {
                c.weights[i] = parse_score(&args[j + 1 + i], "ERR weight value is not a float")?;
            }
            j += 1 + n;
        } else if op != SetOp::Diff && !card && remaining >= 2 && word == b"aggregate" {
            let how = args[j + 1].to_ascii_lowercase();
            c.how = match &how[..] {
                b"sum" => Aggregate::Sum,
                b"min" => Aggregate::Min,
                b"max" => Aggregate::Max,
                _ => return Err(fail(SYNTAX)),
            };
            j += 2;
        } else if !store && !card && word == b"withscores" {
            c.withscores = true;
            j += 1;
        } else if card && remaining >= 2 && word == b"limit" {
            c.limit = match string_to_i64(&args[j + 1]) {
                Some(l) if l >= 0 => l as u64,
                _ => return Err(fail("ERR LIMIT can't be negative")),
            };
            j += 2;
        } else {
            return Err(fail(SYNTAX));
        }
    }
    Ok((c, inputs))
}

/// The combined members in Redis's order (score, then member).
fn combine(c: &Combine, inputs: Vec<Vec<Scored>>, op: SetOp) -> Vec<Scored> {
    let mut order: Vec<usize> = (0..inputs.len()).collect();
    if op != SetOp::Diff {
        // Redis sorts the inputs by size (glibc's qsort: stable).
        order.sort_by_key(|&i| inputs[i].len());
    }
    let maps: Vec<std::collections::HashMap<&[u8], f64>> = inputs
        .iter()
        .map(|v| v.iter().map(|(m, s)| (&m[..], *s)).collect())
        .collect();
    let weighted = |i: usize, s: f64| {
        let v = c.weights[i] * s;
        if v.is_nan() {
            0.0
        } else {
            v
        }
    };
    let mut out: Vec<Scored> = Vec::new();
    match op {
        SetOp::Inter => {
            let first = order[0];
            'members: for (m, s) in &inputs[first] {
                let mut score = weighted(first, *s);
                for &i in &order[1..] {
                    match maps[i].get(&m[..]) {
                        Some(v) => aggregate(&mut score, c.weights[i] * v, c.how),
                        None => continue 'members,
                    }
                }
                out.push((m.clone(), score));
            }
        }
        SetOp::Union => {
            let mut acc: std::collections::HashMap<&[u8], f64> = std::collections::HashMap::new();
            for &i in &order {
                for (m, s) in &inputs[i] {
                    let v = weighted(i, *s);
                    match acc.get_mut(&m[..]) {
                        Some(t) => aggregate(t, v, c.how),
                        None => {
                            acc.insert(m, v);
                        }
                    }
                }
            }
            out = acc.into_iter().map(|(m, s)| (m.to_vec(), s)).collect();
        }
        SetOp::Diff => {
            for (m, s) in &inputs[0] {
                if maps[1..].iter().all(|other| !other.contains_key(&m[..])) {
                    out.push((m.clone(), *s));
                }
            }
        }
    }
    out.sort_by(|a, b| {
        a.1.partial_cmp(&b.1)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| a.0.cmp(&b.0))
    });
    out
}

fn combine_command(ctx: &mut Ctx<'_>, args: &Args, op: SetOp, name: &str) -> Outcome {
    let (c, inputs) = parse_combine(ctx, args, 1, op, false, false, name)?;
    Ok(member_list(combine(&c, inputs, op), c.withscores))
}

fn combine_store(ctx: &mut Ctx<'_>, args: &Args, op: SetOp, name: &str) -> Outcome {
    let dst = &args[1][..];
    let mut locked: Vec<&[u8]> = args[3..].iter().map(|k| &k[..]).collect();
    locked.push(dst);
    let _locked = ctx.lock(&locked);
    let (c, inputs) = parse_combine(ctx, args, 2, op, true, false, name)?;
    let items = combine(&c, inputs, op);
    Ok(int(zset::store(ctx, dst, &items)?))
}

pub(super) fn zunion(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    combine_command(ctx, args, SetOp::Union, "zunion")
}

pub(super) fn zinter(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    combine_command(ctx, args, SetOp::Inter, "zinter")
}

pub(super) fn zdiff(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    combine_command(ctx, args, SetOp::Diff, "zdiff")
}

pub(super) fn zunionstore(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    combine_store(ctx, args, SetOp::Union, "zunionstore")
}

pub(super) fn zinterstore(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    combine_store(ctx, args, SetOp::Inter, "zinterstore")
}

pub(super) fn zdiffstore(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    combine_store(ctx, args, SetOp::Diff, "zdiffstore")
}

pub(super) fn zintercard(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let (c, inputs) = parse_combine(ctx, args, 1, SetOp::Inter, false, true, "zintercard")?;
    let all = combine(&c, inputs, SetOp::Inter).len() as u64;
    Ok(int(if c.limit == 0 { all } else { all.min(c.limit) } as i64))
}

/// ZRANDMEMBER's and HRANDFIELD's count (negative: picks may repeat) and
/// whether `word` (WITHSCORES, WITHVALUES) follows it, with Redis 7.0's
/// range checks.
pub(super) fn parse_random_count(
    count: &[u8],
    args: &Args,
    word: &[u8],
) -> Result<(i64, bool), Failure> {
    let l = match string_to_i64(count) {
        Some(i64::MIN) => {
            return Err(fail(
                "ERR value is out of range, value must between -9223372036854775807 and 9223372036854775807",
            ))
        }
        Some(n) => n,
        None => return Err(fail(NOT_INTEGER)),
    };
    let with = match args.get(3) {
        None => false,
        Some(w) if args.len() == 4 && w.eq_ignore_ascii_case(word) => {
            if !(-(i64::MAX / 2)..=i64::MAX / 2).contains(&l) {
                return Err(fail("ERR value is out of range"));
            }
            true
        }
        Some(_) => return Err(fail(SYNTAX)),
    };
    Ok((l, with))
}

pub(super) fn zrandmember(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let Some(count) = args.get(2) else {
        let Some(c) = zset::get(ctx, &args[1])? else {
            return Ok(Reply::Null);
        };
        return Ok(zset::random(ctx, c, 1, false)?
            .pop()
            .map_or(Reply::Null, |(m, _)| Reply::Bulk(m)));
    };
    let (l, withscores) = parse_random_count(count, args, b"withscores")?;
    let Some(c) = zset::get(ctx, &args[1])? else {
        return Ok(Reply::Array(Vec::new()));
    };
    let picked = zset::random(ctx, c, l.unsigned_abs(), l < 0)?;
    Ok(member_list(picked, withscores))
}

/// ZSCAN: every matching member and its score in one reply, cursor 0.
pub(super) fn zscan(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    parse_cursor(&args[2])?;
    let empty = || Reply::Array(vec![Reply::Bulk(b"0".to_vec()), Reply::Array(Vec::new())]);
    let Some(c) = zset::get(ctx, &args[1])? else {
        return Ok(empty());
    };
    let o = parse_scan_options(args, 3, false)?;
    let mut out = Vec::new();
    for (m, s) in zset::all(ctx, c)? {
        if o.pattern.as_ref().is_none_or(|p| glob_match(p, &m)) {
            out.push(Reply::Bulk(m));
            out.push(Reply::Bulk(format_double(s).into_bytes()));
        }
    }
    Ok(Reply::Array(vec![
        Reply::Bulk(b"0".to_vec()),
        Reply::Array(out),
    ]))
}
