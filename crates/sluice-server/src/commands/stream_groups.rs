//! Streams' consumer groups, following Redis 7.0's t_stream.c: XGROUP
//! (CREATE, SETID, DESTROY, CREATECONSUMER, DELCONSUMER, HELP), XREADGROUP
//! (new entries with `>`, a consumer's history with an id; BLOCK through
//! the server's registry as XREAD), XACK, XPENDING (summary and ranges,
//! IDLE, a consumer), XINFO GROUPS and CONSUMERS. Each command's changes
//! to groups, consumers and pending entries are one store batch. The
//! layout is `sluice_redis::stream_group`'s.

use super::streams::{entries_reply, entry_reply, incr, interval_id, parse_id, Read, MAX_ID};
use super::*;
use sluice_redis::stream;
use sluice_redis::stream_group::{self as groups, Consumer, Group, Nack};
use sluice_redis::{Collection, StreamId, StreamMeta};

const XGROUP_HELP: &[&str] = &[
    "XGROUP <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CREATE <key> <groupname> <id|$> [option]",
    "    Create a new consumer group. Options are:",
    "    * MKSTREAM",
    "      Create the empty stream if it does not exist.",
    "    * ENTRIESREAD entries_read",
    "      Set the group's entries_read counter (internal use).",
    "CREATECONSUMER <key> <groupname> <consumer>",
    "    Create a new consumer in the specified group.",
    "DELCONSUMER <key> <groupname> <consumer>",
    "    Remove the specified consumer.",
    "DESTROY <key> <groupname>",
    "    Remove the specified group.",
    "SETID <key> <groupname> <id|$> [ENTRIESREAD entries_read]",
    "    Set the current group ID and entries_read counter.",
    "HELP",
    "    Prints this help.",
];

const XINFO_HELP: &[&str] = &[
    "XINFO <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CONSUMERS <key> <groupname>",
    "    Show consumers of <groupname>.",
    "GROUPS <key>",
    "    Show the stream consumer groups.",
    "STREAM <key> [FULL [COUNT <count>]",
    "    Show information about the stream.",
    "HELP",
    "    Prints this help.",
];

fn help(lines: &[&str]) -> Reply {
    Reply::Array(lines.iter().map(|l| Reply::Simple((*l).into())).collect())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Redis 7.0's errors of a container's subcommand: known with the wrong
/// count (its dispatch), unknown, or refused by the command itself.
fn wrong_sub(command: &str, sub: &[u8]) -> Failure {
    fail(&format!(
        "ERR wrong number of arguments for '{}|{}' command",
        command.to_ascii_lowercase(),
        text(sub).to_ascii_lowercase()
    ))
}

fn unknown_sub(command: &str, sub: &[u8]) -> Failure {
    fail(&format!(
        "ERR unknown subcommand '{}'. Try {command} HELP.",
        text(sub)
    ))
}

fn sub_syntax(command: &str, sub: &[u8]) -> Failure {
    fail(&format!(
        "ERR unknown subcommand or wrong number of arguments for '{}'. Try {command} HELP.",
        text(sub)
    ))
}

fn id_reply(id: StreamId) -> Reply {
    Reply::Bulk(id.to_string().into_bytes())
}

fn no_such_group(group: &[u8], key: &[u8]) -> Failure {
    fail(&format!(
        "NOGROUP No such consumer group '{}' for key name '{}'",
        text(group),
        text(key)
    ))
}

/// Whether `argc` fits the arity Redis 7.0 gives subcommand `sub`.
fn arity_fits(arity: i32, argc: usize) -> bool {
    if arity >= 0 {
        argc == arity as usize
    } else {
        argc >= arity.unsigned_abs() as usize
    }
}

pub(super) fn xgroup(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let sub = args[1].to_ascii_lowercase();
    let arity = match &sub[..] {
        b"create" | b"setid" => -5,
        b"destroy" => 4,
        b"createconsumer" | b"delconsumer" => 5,
        b"help" => 2,
        _ => return Err(unknown_sub("XGROUP", &args[1])),
    };
    if !arity_fits(arity, args.len()) {
        return Err(wrong_sub("XGROUP", &args[1]));
    }
    if sub == b"help" {
        return Ok(help(XGROUP_HELP));
    }
    let (mut mkstream, mut entries_read) = (false, None);
    let mut i = 5;
    while i < args.len() {
        let opt = args[i].to_ascii_lowercase();
        if sub == b"create" && opt == b"mkstream" {
            mkstream = true;
            i += 1;
        } else if (sub == b"create" || sub == b"setid")
            && opt == b"entriesread"
            && i + 1 < args.len()
        {
            let n = parse_i64(&args[i + 1])?;
            if n < -1 {
                return Err(fail("ERR value for ENTRIESREAD must be positive or -1"));
            }
            entries_read = u64::try_from(n).ok();
            i += 2;
        } else {
            return Err(sub_syntax("XGROUP", &args[1]));
        }
    }
    let (key, name) = (&args[2][..], &args[3][..]);
    let _locked = ctx.lock(&[key]);
    let (entry, mut batch) = ctx.begin(key)?;
    let found = match entry.map(|e| (e.value, e.expire_at_ms)) {
        None => None,
        Some((sluice_redis::Value::Stream { c, meta }, expire_at_ms)) => {
            Some((c, meta, expire_at_ms))
        }
        Some(_) => return Err(fail(WRONGTYPE)),
    };
    let group = match &found {
        Some((c, _, _)) => groups::group(ctx, *c, name)?,
        None => None,
    };
    if !mkstream {
        if found.is_none() {
            return Err(fail(
                "ERR The XGROUP subcommand requires the key to exist. Note that for CREATE you may want to use the MKSTREAM option to create an empty stream automatically.",
            ));
        }
        if group.is_none() && sub != b"create" && sub != b"destroy" {
            return Err(no_such_group(name, key));
        }
    }
    let reply = match &sub[..] {
        b"create" if args.len() <= 8 => {
            let id = if &args[4][..] == b"$" {
                found
                    .as_ref()
                    .map_or(StreamId::default(), |(_, meta, _)| meta.last)
            } else {
                parse_id(&args[4], 0, true)?
            };
            let c = match found {
                Some((c, _, _)) => c,
                None => {
                    let c = Collection {
                        id: ctx.db().new_id()?,
                        len: 0,
                    };
                    let empty = sluice_redis::Value::Stream {
                        c,
                        meta: StreamMeta::default(),
                    };
                    batch.put_new(
                        key,
                        &Entry {
                            value: empty,
                            expire_at_ms: 0,
                        },
                    )?;
                    c
                }
            };
            if group.is_some() {
                return Err(fail("BUSYGROUP Consumer Group name already exists"));
            }
            let g = Group {
                last: id,
                entries_read,
            };
            groups::put_group(&mut batch, key, c, name, &g)?;
            ok()
        }
        b"setid" if args.len() == 5 || args.len() == 7 => {
            let (c, meta, _) = found.expect("checked");
            let id = if &args[4][..] == b"$" {
                meta.last
            } else {
                parse_id(&args[4], 0, false)?
            };
            let g = Group {
                last: id,
                entries_read,
            };
            groups::put_group(&mut batch, key, c, name, &g)?;
            ok()
        }
        b"destroy" => match (&found, group) {
            (Some((c, _, _)), Some(_)) => {
                groups::delete_group(ctx, &mut batch, key, *c, name)?;
                int(1)
            }
            _ => int(0),
        },
        b"createconsumer" => {
            let (c, _, _) = found.expect("checked");
            let consumer = &args[4];
            if groups::consumer(ctx, c, name, consumer)?.is_some() {
                int(0)
            } else {
                let seen = Consumer {
                    seen_ms: ctx.now_ms(),
                };
                groups::put_consumer(&mut batch, key, c, name, consumer, seen)?;
                int(1)
            }
        }
        b"delconsumer" => {
            let (c, _, _) = found.expect("checked");
            let consumer = &args[4];
            let mut pending = 0;
            if groups::consumer(ctx, c, name, consumer)?.is_some() {
                for item in groups::pending(ctx, c, name, StreamId::default(), MAX_ID, false) {
                    let (id, nack) = item?;
                    if nack.consumer == *consumer {
                        groups::delete_nack(&mut batch, key, c, name, id)?;
                        pending += 1;
                    }
                }
                groups::delete_consumer(&mut batch, key, c, name, consumer)?;
            }
            int(pending)
        }
        _ => return Err(sub_syntax("XGROUP", &args[1])),
    };
    ctx.commit(batch)?;
    Ok(reply)
}

/// The stream at `key` and its group `group`, or Redis's NOGROUP reply
/// `missing` gives.
fn stream_and_group(
    ctx: &Ctx<'_>,
    key: &[u8],
    group: &[u8],
    missing: impl FnOnce() -> Failure,
) -> Result<(Collection, StreamMeta, Group), Failure> {
    let Some((c, meta)) = stream::get(ctx, key)? else {
        return Err(missing());
    };
    match groups::group(ctx, c, group)? {
        Some(g) => Ok((c, meta, g)),
        None => Err(missing()),
    }
}

pub(super) fn xack(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let (key, name) = (&args[1][..], &args[2][..]);
    let _locked = ctx.lock(&[key]);
    let Some((c, _)) = stream::get(ctx, key)? else {
        return Ok(int(0));
    };
    if groups::group(ctx, c, name)?.is_none() {
        return Ok(int(0));
    }
    let ids = args[3..]
        .iter()
        .map(|a| parse_id(a, 0, true))
        .collect::<Result<Vec<_>, _>>()?;
    let mut batch = ctx.batch();
    let mut acked: Vec<StreamId> = Vec::new();
    for id in ids {
        if !acked.contains(&id) && groups::nack(ctx, c, name, id)?.is_some() {
            groups::delete_nack(&mut batch, key, c, name, id)?;
            acked.push(id);
        }
    }
    ctx.commit(batch)?;
    Ok(int(acked.len() as i64))
}

pub(super) fn xpending(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let n = args.len();
    if n != 3 && !(6..=9).contains(&n) {
        return Err(fail(SYNTAX));
    }
    let (key, name) = (&args[1][..], &args[2][..]);
    let mut range = None;
    if n >= 6 {
        let mut at = 3;
        let mut min_idle = 0;
        if args[3].eq_ignore_ascii_case(b"idle") {
            min_idle = parse_i64(&args[4])?;
            if n < 8 {
                return Err(fail(SYNTAX));
            }
            at += 2;
        }
        let count = parse_i64(&args[at + 2])?.max(0) as u64;
        let (mut start, start_ex) = interval_id(&args[at], 0)?;
        if start_ex {
            start = incr(start).ok_or_else(|| fail("ERR invalid start ID for the interval"))?;
        }
        let (mut end, end_ex) = interval_id(&args[at + 1], u64::MAX)?;
        if end_ex {
            end = super::streams::decr(end)
                .ok_or_else(|| fail("ERR invalid end ID for the interval"))?;
        }
        let consumer = args.get(at + 3).cloned();
        range = Some((start, end, count, min_idle, consumer));
    }
    let nogroup = || {
        fail(&format!(
            "NOGROUP No such key '{}' or consumer group '{}'",
            text(key),
            text(name)
        ))
    };
    let (c, _, _) = stream_and_group(ctx, key, name, nogroup)?;
    let now = ctx.now_ms() as i64;
    let Some((start, end, count, min_idle, consumer)) = range else {
        return pending_summary(ctx, c, name);
    };
    if let Some(consumer) = &consumer {
        if groups::consumer(ctx, c, name, consumer)?.is_none() {
            return Ok(Reply::Array(Vec::new()));
        }
    }
    let mut out = Vec::new();
    for item in groups::pending(ctx, c, name, start, end, false) {
        if out.len() as u64 >= count {
            break;
        }
        let (id, nack) = item?;
        if consumer.as_ref().is_some_and(|want| *want != nack.consumer) {
            continue;
        }
        let idle = now - nack.delivered_ms as i64;
        if min_idle != 0 && idle < min_idle {
            continue;
        }
        out.push(Reply::Array(vec![
            id_reply(id),
            Reply::Bulk(nack.consumer),
            int(idle.max(0)),
            int(nack.deliveries as i64),
        ]));
    }
    Ok(Reply::Array(out))
}

/// XPENDING key group: how many, the first and last id, and each consumer
/// with entries pending and how many (as bulk strings, as Redis answers).
fn pending_summary(ctx: &Ctx<'_>, c: Collection, name: &[u8]) -> Outcome {
    let mut total = 0i64;
    let (mut first, mut last) = (None, None);
    let mut per_consumer: std::collections::BTreeMap<Vec<u8>, i64> = Default::default();
    for item in groups::pending(ctx, c, name, StreamId::default(), MAX_ID, false) {
        let (id, nack) = item?;
        total += 1;
        first.get_or_insert(id);
        last = Some(id);
        *per_consumer.entry(nack.consumer).or_default() += 1;
    }
    let (Some(first), Some(last)) = (first, last) else {
        return Ok(Reply::Array(vec![
            int(0),
            Reply::Null,
            Reply::Null,
            Reply::NullArray,
        ]));
    };
    Ok(Reply::Array(vec![
        int(total),
        id_reply(first),
        id_reply(last),
        Reply::Array(
            per_consumer
                .into_iter()
                .map(|(name, n)| {
                    Reply::Array(vec![
                        Reply::Bulk(name),
                        Reply::Bulk(n.to_string().into_bytes()),
                    ])
                })
                .collect(),
        ),
    ]))
}

pub(super) fn xinfo(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let sub = args[1].to_ascii_lowercase();
    let arity = match &sub[..] {
        b"consumers" => 4,
        b"groups" => 3,
        b"stream" => -3,
        b"help" => 2,
        _ => return Err(unknown_sub("XINFO", &args[1])),
    };
    if !arity_fits(arity, args.len()) {
        return Err(wrong_sub("XINFO", &args[1]));
    }
    if sub == b"help" {
        return Ok(help(XINFO_HELP));
    }
    let key = &args[2][..];
    let Some((c, meta)) = stream::get(ctx, key)? else {
        return Err(fail("ERR no such key"));
    };
    let name = |s: &str| Reply::Bulk(s.as_bytes().to_vec());
    match &sub[..] {
        b"groups" => {
            let mut out = Vec::new();
            for (group, g) in groups::groups(ctx, c)? {
                let consumers = groups::consumers(ctx, c, &group)?.len() as i64;
                let pending = groups::pending(ctx, c, &group, StreamId::default(), MAX_ID, false)
                    .count() as i64;
                let optional = |v: Option<u64>| v.map_or(Reply::Null, |n| int(n as i64));
                out.push(Reply::Map(vec![
                    (name("name"), Reply::Bulk(group.clone())),
                    (name("consumers"), int(consumers)),
                    (name("pending"), int(pending)),
                    (name("last-delivered-id"), id_reply(g.last)),
                    (name("entries-read"), optional(g.entries_read)),
                    (name("lag"), optional(groups::lag(&meta, c.len, &g))),
                ]));
            }
            Ok(Reply::Array(out))
        }
        b"consumers" => {
            let group = &args[3][..];
            if groups::group(ctx, c, group)?.is_none() {
                return Err(no_such_group(group, key));
            }
            let mut pending: std::collections::HashMap<Vec<u8>, i64> = Default::default();
            for item in groups::pending(ctx, c, group, StreamId::default(), MAX_ID, false) {
                *pending.entry(item?.1.consumer).or_default() += 1;
            }
            let now = ctx.now_ms() as i64;
            let mut out = Vec::new();
            for (consumer, seen) in groups::consumers(ctx, c, group)? {
                out.push(Reply::Map(vec![
                    (name("name"), Reply::Bulk(consumer.clone())),
                    (
                        name("pending"),
                        int(pending.get(&consumer).copied().unwrap_or(0)),
                    ),
                    (name("idle"), int((now - seen.seen_ms as i64).max(0))),
                ]));
            }
            Ok(Reply::Array(out))
        }
        _ => Err(fail(
            "ERR XINFO STREAM is not served by Sluice yet: XINFO GROUPS and XINFO CONSUMERS are",
        )),
    }
}

/// XREADGROUP's reading of one stream: new entries after the group's last
/// (`>`, recorded as pending unless NOACK) or the consumer's own pending
/// entries after `after` (its history; an entry deleted since is its id
/// with a null). None when `>` finds nothing new.
#[allow(clippy::too_many_arguments)]
fn read_group_stream(
    ctx: &Ctx<'_>,
    batch: &mut sluice_redis::db::DbBatch<'_>,
    key: &[u8],
    (c, meta): (Collection, StreamMeta),
    name: &[u8],
    consumer: &[u8],
    after: StreamId,
    count: u64,
    noack: bool,
) -> Result<Option<Reply>, Failure> {
    let mut g = groups::group(ctx, c, name)?.ok_or_else(|| {
        fail(&format!(
            "NOGROUP No such key '{}' or consumer group '{}' in XREADGROUP with GROUP option",
            text(key),
            text(name)
        ))
    })?;
    let now = ctx.now_ms();
    // The consumer is made (or seen) when the stream serves it, as Redis
    // does: not by a `>` read that finds nothing and blocks.
    let seen = Consumer { seen_ms: now };
    let take = if count == 0 { u64::MAX } else { count };
    if after != MAX_ID {
        groups::put_consumer(batch, key, c, name, consumer, seen)?;
        let mut out = Vec::new();
        let start = incr(after).unwrap_or(MAX_ID);
        for item in groups::pending(ctx, c, name, start, MAX_ID, false) {
            if out.len() as u64 >= take {
                break;
            }
            let (id, mut nack) = item?;
            if nack.consumer != consumer {
                continue;
            }
            match stream::range(ctx, c, id, id, 1, false)?.pop() {
                None => out.push(Reply::Array(vec![id_reply(id), Reply::NullArray])),
                Some((_, fields)) => {
                    nack.delivered_ms = now;
                    nack.deliveries += 1;
                    groups::put_nack(batch, key, c, name, id, &nack)?;
                    out.push(entry_reply(id, fields));
                }
            }
        }
        return Ok(Some(Reply::Array(out)));
    }
    let Some(start) = incr(g.last) else {
        return Ok(None);
    };
    let entries = stream::range(ctx, c, start, MAX_ID, count, false)?;
    if entries.is_empty() {
        return Ok(None);
    }
    groups::put_consumer(batch, key, c, name, consumer, seen)?;
    for (id, _) in &entries {
        groups::advance(&mut g, &meta, c.len, *id);
        if !noack {
            let nack = Nack {
                delivered_ms: now,
                deliveries: 1,
                consumer: consumer.to_vec(),
            };
            groups::put_nack(batch, key, c, name, *id, &nack)?;
        }
    }
    groups::put_group(batch, key, c, name, &g)?;
    Ok(Some(entries_reply(entries)))
}

/// XREADGROUP once: the reply, None when no stream had anything (the
/// caller blocks or answers a null array). Every change is one batch.
pub fn read_group_once(ctx: &mut Ctx<'_>, r: &Read) -> Result<Option<Reply>, Failure> {
    let gr = r.group.as_ref().expect("a group read");
    let mut batch = ctx.batch();
    let mut out = Vec::new();
    for (key, after) in &r.streams {
        let Some(found) = stream::get(ctx, key)? else {
            continue;
        };
        let after = after.unwrap_or(MAX_ID);
        let read = read_group_stream(
            ctx,
            &mut batch,
            key,
            found,
            &gr.group,
            &gr.consumer,
            after,
            r.count,
            gr.noack,
        )?;
        if let Some(entries) = read {
            out.push((Reply::Bulk(key.clone()), entries));
        }
    }
    ctx.commit(batch)?;
    Ok((!out.is_empty()).then_some(Reply::KeyedArrays(out)))
}

/// Checks XREADGROUP's streams before a read or a block: each a stream
/// (WRONGTYPE) holding the group (NOGROUP), as Redis checks them.
pub fn check_group_streams(ctx: &Ctx<'_>, r: &Read) -> Result<(), Failure> {
    let gr = r.group.as_ref().expect("a group read");
    for (key, _) in &r.streams {
        let missing = || {
            fail(&format!(
                "NOGROUP No such key '{}' or consumer group '{}' in XREADGROUP with GROUP option",
                text(key),
                text(&gr.group)
            ))
        };
        stream_and_group(ctx, key, &gr.group, missing)?;
    }
    Ok(())
}

pub(super) fn xreadgroup(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let r = super::streams::parse_read(args)?;
    let keys: Vec<&[u8]> = r.streams.iter().map(|(k, _)| &k[..]).collect();
    let _locked = ctx.lock(&keys);
    check_group_streams(ctx, &r)?;
    Ok(read_group_once(ctx, &r)?.unwrap_or(Reply::NullArray))
}
