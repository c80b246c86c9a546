//! Stream commands, following Redis 7.0's t_stream.c: XADD, XLEN,
//! XRANGE, XREVRANGE, XDEL, XTRIM, XREAD (its BLOCK form blocks through
//! the server's registry, as the blocking pops do). Consumer groups are
//! to come. The streams themselves are `sluice_redis::stream`'s.

use super::*;
use sluice_redis::stream::{self, IdSpec, StreamEntry, Trim, TrimSpec};
use sluice_redis::StreamId;
use std::sync::atomic::Ordering;

pub(super) const INVALID_ID: &str = "ERR Invalid stream ID specified as stream command argument";
pub(super) const MAX_ID: StreamId = StreamId {
    ms: u64::MAX,
    seq: u64::MAX,
};

/// Redis's `string2ull`: decimal digits only, within u64.
fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

/// `streamGenericParseIDOrReply`: `-`, `+` (unless `strict`), `ms`
/// (sequence `missing_seq`), `ms-seq`, and with `star` `ms-*` (Err(None)
/// marks a parse error).
pub(super) fn parse_id(arg: &[u8], missing_seq: u64, strict: bool) -> Result<StreamId, Failure> {
    if arg.len() > 127 {
        return Err(fail(INVALID_ID));
    }
    match arg {
        b"-" if !strict => return Ok(StreamId::default()),
        b"+" if !strict => return Ok(MAX_ID),
        _ => {}
    }
    let (ms, seq) = match arg.iter().position(|&b| b == b'-') {
        Some(dash) => (&arg[..dash], Some(&arg[dash + 1..])),
        None => (arg, None),
    };
    let ms = parse_u64(ms).ok_or_else(|| fail(INVALID_ID))?;
    let seq = match seq {
        Some(s) => parse_u64(s).ok_or_else(|| fail(INVALID_ID))?,
        None => missing_seq,
    };
    Ok(StreamId { ms, seq })
}

/// One entry as Redis replies it: its id and its fields and values.
pub(super) fn entry_reply(id: StreamId, fields: Vec<Vec<u8>>) -> Reply {
    Reply::Array(vec![
        Reply::Bulk(id.to_string().into_bytes()),
        Reply::Array(fields.into_iter().map(Reply::Bulk).collect()),
    ])
}

pub(super) fn entries_reply(entries: Vec<StreamEntry>) -> Reply {
    Reply::Array(
        entries
            .into_iter()
            .map(|(id, fields)| entry_reply(id, fields))
            .collect(),
    )
}

/// XADD's and XTRIM's options from `args[2..]`: the trim, NOMKSTREAM,
/// and (XADD) where the id is.
struct AddTrim {
    trim: Option<TrimSpec>,
    nomkstream: bool,
    id_at: usize,
}

fn parse_add_trim(ctx: &Ctx<'_>, args: &Args, xadd: bool) -> Result<AddTrim, Failure> {
    let mut trim: Option<(Trim, bool)> = None;
    let (mut limit, mut limit_given, mut nomkstream) = (0u64, false, false);
    let mut i = 2;
    while i < args.len() {
        let more = args.len() - 1 - i;
        let opt = args[i].to_ascii_lowercase();
        if xadd && args[i] == b"*" {
            break;
        } else if (opt == b"maxlen" || opt == b"minid") && more > 0 {
            if trim.is_some() {
                return Err(fail("ERR syntax error, MAXLEN and MINID options at the same time are not compatible"));
            }
            let mut approx = false;
            if more >= 2 && (args[i + 1] == b"~" || args[i + 1] == b"=") {
                approx = args[i + 1] == b"~";
                i += 1;
            }
            let t = if opt == b"maxlen" {
                let n = parse_i64(&args[i + 1])?;
                if n < 0 {
                    return Err(fail("ERR The MAXLEN argument must be >= 0."));
                }
                Trim::MaxLen(n as u64)
            } else {
                Trim::MinId(parse_id(&args[i + 1], 0, true)?)
            };
            trim = Some((t, approx));
            i += 2;
            continue;
        } else if opt == b"limit" && more > 0 {
            let n = parse_i64(&args[i + 1])?;
            if n < 0 {
                return Err(fail("ERR The LIMIT argument must be >= 0."));
            }
            limit = n as u64;
            limit_given = true;
            i += 2;
            continue;
        } else if xadd && opt == b"nomkstream" {
            nomkstream = true;
        } else if xadd {
            break;
        } else {
            return Err(fail(SYNTAX));
        }
        i += 1;
    }
    if limit > 0 && trim.is_none() {
        return Err(fail(
            "ERR syntax error, LIMIT cannot be used without specifying a trimming strategy",
        ));
    }
    if !xadd && trim.is_none() {
        return Err(fail(
            "ERR syntax error, XTRIM must be called with a trimming strategy",
        ));
    }
    if let Some((_, false)) = trim {
        if limit_given {
            return Err(fail(
                "ERR syntax error, LIMIT cannot be used without the special ~ option",
            ));
        }
    }
    let node_entries = ctx
        .db()
        .settings
        .stream_node_entries
        .load(Ordering::Relaxed);
    // Redis's default LIMIT for `~`: 100 nodes, within 10,000..=1,000,000.
    let default_limit = match node_entries.saturating_mul(100) {
        0 => 10_000,
        n => n.min(1_000_000),
    };
    let trim = trim.map(|(trim, approx)| TrimSpec {
        trim,
        approx,
        node_entries,
        limit: if approx && !limit_given {
            default_limit
        } else {
            limit
        },
    });
    Ok(AddTrim {
        trim,
        nomkstream,
        id_at: i,
    })
}

pub(super) fn xadd(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let o = parse_add_trim(ctx, args, true)?;
    let id_arg = args
        .get(o.id_at)
        .ok_or_else(|| wrong_arity_failure("xadd"))?;
    let spec = if id_arg == b"*" {
        IdSpec::Auto
    } else {
        match id_arg.strip_suffix(b"-*") {
            Some(ms) => IdSpec::Seq(parse_id(ms, 0, true).map(|id| id.ms)?),
            None => IdSpec::Exact(parse_id(id_arg, 0, true)?),
        }
    };
    let fields = &args[o.id_at + 1..];
    if fields.len() < 2 || !fields.len().is_multiple_of(2) {
        return Err(wrong_arity_failure("xadd"));
    }
    if spec == IdSpec::Exact(StreamId::default()) {
        return Err(fail(
            "ERR The ID specified in XADD must be greater than 0-0",
        ));
    }
    let pairs: Vec<&[u8]> = fields.iter().map(|f| &f[..]).collect();
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    let id = stream::add(ctx, key, spec, &pairs, o.nomkstream, o.trim)?;
    Ok(id.map_or(Reply::Null, |id| Reply::Bulk(id.to_string().into_bytes())))
}

fn wrong_arity_failure(name: &str) -> Failure {
    Failure::Reply(format!(
        "ERR wrong number of arguments for '{name}' command"
    ))
}

pub(super) fn xlen(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    Ok(int(
        stream::get(ctx, &args[1])?.map_or(0, |(c, _)| c.len) as i64
    ))
}

/// An interval end of XRANGE: `(` excludes (then the id moves by one).
pub(super) fn interval_id(arg: &[u8], missing_seq: u64) -> Result<(StreamId, bool), Failure> {
    if arg.len() > 1 && arg[0] == b'(' {
        return Ok((parse_id(&arg[1..], missing_seq, true)?, true));
    }
    Ok((parse_id(arg, missing_seq, false)?, false))
}

pub(super) fn incr(id: StreamId) -> Option<StreamId> {
    match id.seq.checked_add(1) {
        Some(seq) => Some(StreamId { seq, ..id }),
        None => id.ms.checked_add(1).map(|ms| StreamId { ms, seq: 0 }),
    }
}

pub(super) fn decr(id: StreamId) -> Option<StreamId> {
    match id.seq.checked_sub(1) {
        Some(seq) => Some(StreamId { seq, ..id }),
        None => id
            .ms
            .checked_sub(1)
            .map(|ms| StreamId { ms, seq: u64::MAX }),
    }
}

fn range_generic(ctx: &mut Ctx<'_>, args: &Args, rev: bool) -> Outcome {
    let (start_arg, end_arg) = if rev {
        (&args[3], &args[2])
    } else {
        (&args[2], &args[3])
    };
    let (mut start, ex) = interval_id(start_arg, 0)?;
    if ex {
        start = incr(start).ok_or_else(|| fail("ERR invalid start ID for the interval"))?;
    }
    let (mut end, ex) = interval_id(end_arg, u64::MAX)?;
    if ex {
        end = decr(end).ok_or_else(|| fail("ERR invalid end ID for the interval"))?;
    }
    let mut count: i64 = -1;
    let mut j = 4;
    while j < args.len() {
        if args[j].eq_ignore_ascii_case(b"count") && j + 1 < args.len() {
            count = parse_i64(&args[j + 1])?.max(0);
            j += 2;
        } else {
            return Err(fail(SYNTAX));
        }
    }
    let Some((c, _)) = stream::get(ctx, &args[1])? else {
        return Ok(Reply::Array(Vec::new()));
    };
    if count == 0 {
        return Ok(Reply::NullArray);
    }
    let count = if count < 0 { 0 } else { count as u64 };
    Ok(entries_reply(stream::range(
        ctx, c, start, end, count, rev,
    )?))
}

pub(super) fn xrange(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    range_generic(ctx, args, false)
}

pub(super) fn xrevrange(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    range_generic(ctx, args, true)
}

pub(super) fn xdel(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let ids = args[2..]
        .iter()
        .map(|a| parse_id(a, 0, true))
        .collect::<Result<Vec<_>, _>>()?;
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    Ok(int(stream::delete(ctx, key, &ids)?))
}

#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: XTRIM has a trim"
)]
pub(super) fn xtrim(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let o = parse_add_trim(ctx, args, false)?;
    if o.id_at < args.len() {
        return Err(fail(SYNTAX));
    }
    let key = &args[1][..];
    let _locked = ctx.lock(&[key]);
    Ok(int(stream::trim(
        ctx,
        key,
        o.trim.expect("XTRIM has a trim"),
    )?))
}

/// XREAD's and XREADGROUP's arguments.
#[derive(Clone)]
pub struct Read {
    /// COUNT (0: all).
    pub count: u64,
    /// BLOCK in ms (None: no BLOCK).
    pub block_ms: Option<u64>,
    /// The streams and the ids to read after (`$`: None, the last id;
    /// XREADGROUP's `>`: the greatest id, as Redis marks it).
    pub streams: Vec<(Vec<u8>, Option<StreamId>)>,
    /// XREADGROUP's GROUP and NOACK.
    pub group: Option<GroupRead>,
}

/// Who an XREADGROUP reads as.
#[derive(Clone)]
pub struct GroupRead {
    /// The group.
    pub group: Vec<u8>,
    /// The consumer.
    pub consumer: Vec<u8>,
    /// NOACK: delivered entries are not made pending.
    pub noack: bool,
}

/// Parses XREAD or XREADGROUP (by `args[0]`).
pub fn parse_read(args: &Args) -> Result<Read, Failure> {
    let xreadgroup = args[0].eq_ignore_ascii_case(b"xreadgroup");
    let mut r = Read {
        count: 0,
        block_ms: None,
        streams: Vec::new(),
        group: None,
    };
    let mut noack = false;
    let mut i = 1;
    let mut streams_at = None;
    while i < args.len() {
        let more = args.len() - i - 1;
        let o = args[i].to_ascii_lowercase();
        if o == b"block" && more > 0 {
            let ms = string_to_i64(&args[i + 1])
                .ok_or_else(|| fail("ERR timeout is not an integer or out of range"))?;
            if ms < 0 {
                return Err(fail("ERR timeout is negative"));
            }
            r.block_ms = Some(ms as u64);
            i += 2;
        } else if o == b"count" && more > 0 {
            r.count = parse_i64(&args[i + 1])?.max(0) as u64;
            i += 2;
        } else if o == b"streams" && more > 0 {
            let n = args.len() - i - 1;
            if !n.is_multiple_of(2) {
                return Err(fail("ERR Unbalanced XREAD list of streams: for each stream key an ID or '$' must be specified."));
            }
            streams_at = Some(i + 1);
            break;
        } else if o == b"group" && more >= 2 {
            if !xreadgroup {
                return Err(fail(
                    "ERR The GROUP option is only supported by XREADGROUP. You called XREAD instead.",
                ));
            }
            r.group = Some(GroupRead {
                group: args[i + 1].clone(),
                consumer: args[i + 2].clone(),
                noack: false,
            });
            i += 3;
        } else if o == b"noack" {
            if !xreadgroup {
                return Err(fail(
                    "ERR The NOACK option is only supported by XREADGROUP. You called XREAD instead.",
                ));
            }
            noack = true;
            i += 1;
        } else {
            return Err(fail(SYNTAX));
        }
    }
    let Some(at) = streams_at else {
        return Err(fail(SYNTAX));
    };
    if xreadgroup {
        match &mut r.group {
            Some(g) => g.noack = noack,
            None => return Err(fail("ERR Missing GROUP option for XREADGROUP")),
        }
    }
    let n = (args.len() - at) / 2;
    for k in 0..n {
        let id_arg = &args[at + n + k];
        let id = if id_arg == b"$" && xreadgroup {
            return Err(fail("ERR The $ ID is meaningless in the context of XREADGROUP: you want to read the history of this consumer by specifying a proper ID, or use the > ID to get new messages. The $ ID would just return an empty result set."));
        } else if id_arg == b"$" {
            None
        } else if id_arg == b">" && xreadgroup {
            Some(MAX_ID)
        } else if id_arg == b">" {
            return Err(fail("ERR The > ID can be specified only when calling XREADGROUP using the GROUP <group> <consumer> option."));
        } else {
            Some(parse_id(id_arg, 0, true)?)
        };
        r.streams.push((args[at + k].clone(), id));
    }
    Ok(r)
}

/// `$` ids made the streams' last ids now (what a blocked XREAD waits
/// after); also checks every key is a stream (and for XREADGROUP holds
/// the group), as Redis does first.
pub fn pin_ids(ctx: &Ctx<'_>, r: &mut Read) -> Result<(), Failure> {
    if r.group.is_some() {
        return super::stream_groups::check_group_streams(ctx, r);
    }
    for (key, id) in &mut r.streams {
        let found = stream::get(ctx, key)?;
        if id.is_none() {
            *id = Some(found.map_or(StreamId::default(), |(_, meta)| meta.last));
        }
    }
    Ok(())
}

/// What XREAD finds after the pinned ids (XREADGROUP: what its group
/// delivers, recorded): the reply, None when nothing.
pub fn read_once(ctx: &mut Ctx<'_>, r: &Read) -> Result<Option<Reply>, Failure> {
    if r.group.is_some() {
        return super::stream_groups::read_group_once(ctx, r);
    }
    let mut out = Vec::new();
    for (key, after) in &r.streams {
        let Some((c, meta)) = stream::get(ctx, key)? else {
            continue;
        };
        let after = after.unwrap_or(meta.last);
        let Some(start) = incr(after) else {
            continue;
        };
        let entries = stream::range(ctx, c, start, MAX_ID, r.count, false)?;
        if !entries.is_empty() {
            out.push((Reply::Bulk(key.clone()), entries_reply(entries)));
        }
    }
    Ok((!out.is_empty()).then_some(Reply::KeyedArrays(out)))
}

/// XREAD without blocking (or inside MULTI): what is there, else a null.
pub(super) fn xread(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let mut r = parse_read(args)?;
    pin_ids(ctx, &mut r)?;
    Ok(read_once(ctx, &r)?.unwrap_or(Reply::NullArray))
}
