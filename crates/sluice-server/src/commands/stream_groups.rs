//! Streams' consumer groups, following Redis 7.0's t_stream.c: XGROUP
//! (CREATE, SETID, DESTROY, CREATECONSUMER, DELCONSUMER, HELP), XREADGROUP
//! (new entries with `>`, a consumer's history with an id; BLOCK through
//! the server's registry as XREAD), XACK, XPENDING (summary and ranges,
//! IDLE, a consumer), XCLAIM, XAUTOCLAIM, XINFO STREAM, GROUPS and CONSUMERS,
//! and XSETID. Each command's changes
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

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Redis's error of a subcommand its command itself refuses (options
/// that do not fit).
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

#[expect(
    clippy::expect_used,
    reason = "each expect follows the check of the same value just before it"
)]
pub(super) fn xgroup(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let arities = [
        ("create", -5),
        ("setid", -5),
        ("destroy", 4),
        ("createconsumer", 5),
        ("delconsumer", 5),
        ("help", 2),
    ];
    let sub = subcommand("XGROUP", args, &arities)?;
    if sub == b"help" {
        return Ok(help_reply(XGROUP_HELP));
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
    let arities = [("consumers", 4), ("groups", 3), ("stream", -3), ("help", 2)];
    let sub = subcommand("XINFO", args, &arities)?;
    if sub == b"help" {
        return Ok(help_reply(XINFO_HELP));
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
        _ => stream_info(ctx, c, meta, args),
    }
}

/// XINFO STREAM key [FULL [COUNT n]]. `radix-tree-keys` and
/// `radix-tree-nodes` count Redis's memory layout, which Sluice does not
/// have: both are the nodes of `stream-node-max-entries` entries the
/// stream's entries would fill there.
fn stream_info(ctx: &Ctx<'_>, c: Collection, meta: StreamMeta, args: &Args) -> Outcome {
    let options = &args[3..];
    let full = !options.is_empty();
    let mut count = 10u64;
    if full {
        let full_word = options[0].eq_ignore_ascii_case(b"full");
        let count_ok = options.len() == 1 || options[1].eq_ignore_ascii_case(b"count");
        if !(options.len() == 1 || options.len() == 3) || !full_word || !count_ok {
            return Err(sub_syntax("XINFO", &args[1]));
        }
        if options.len() == 3 {
            count = match parse_i64(&options[2])? {
                n if n < 0 => 10,
                n => n as u64,
            };
        }
    }
    let name = |s: &str| Reply::Bulk(s.as_bytes().to_vec());
    let node_entries = ctx
        .db()
        .settings
        .stream_node_entries
        .load(std::sync::atomic::Ordering::Relaxed)
        .max(1);
    let nodes = int(c.len.div_ceil(node_entries) as i64);
    let mut map = vec![
        (name("length"), int(c.len as i64)),
        (name("radix-tree-keys"), nodes.clone()),
        (name("radix-tree-nodes"), nodes),
        (name("last-generated-id"), id_reply(meta.last)),
        (name("max-deleted-entry-id"), id_reply(meta.max_deleted)),
        (name("entries-added"), int(meta.added as i64)),
        (name("recorded-first-entry-id"), id_reply(meta.first)),
    ];
    let all = |rev: bool, n: u64| stream::range(ctx, c, StreamId::default(), MAX_ID, n, rev);
    if !full {
        let edge = |rev: bool| -> Result<Reply, Failure> {
            Ok(all(rev, 1)?
                .pop()
                .map_or(Reply::Null, |(id, fields)| entry_reply(id, fields)))
        };
        map.push((name("groups"), int(groups::groups(ctx, c)?.len() as i64)));
        map.push((name("first-entry"), edge(false)?));
        map.push((name("last-entry"), edge(true)?));
        return Ok(Reply::Map(map));
    }
    map.push((name("entries"), entries_reply(all(false, count)?)));
    let limit = if count == 0 { u64::MAX } else { count };
    let mut group_replies = Vec::new();
    for (group, g) in groups::groups(ctx, c)? {
        let pel: Vec<(StreamId, Nack)> =
            groups::pending(ctx, c, &group, StreamId::default(), MAX_ID, false)
                .collect::<Result<_, _>>()?;
        let optional = |v: Option<u64>| v.map_or(Reply::Null, |n| int(n as i64));
        let pending = pel
            .iter()
            .take(limit as usize)
            .map(|(id, n)| {
                Reply::Array(vec![
                    id_reply(*id),
                    Reply::Bulk(n.consumer.clone()),
                    int(n.delivered_ms as i64),
                    int(n.deliveries as i64),
                ])
            })
            .collect();
        let mut consumers = Vec::new();
        for (consumer, seen) in groups::consumers(ctx, c, &group)? {
            let own: Vec<&(StreamId, Nack)> =
                pel.iter().filter(|(_, n)| n.consumer == consumer).collect();
            let own_pending = own
                .iter()
                .take(limit as usize)
                .map(|(id, n)| {
                    Reply::Array(vec![
                        id_reply(*id),
                        int(n.delivered_ms as i64),
                        int(n.deliveries as i64),
                    ])
                })
                .collect();
            consumers.push(Reply::Map(vec![
                (name("name"), Reply::Bulk(consumer)),
                (name("seen-time"), int(seen.seen_ms as i64)),
                (name("pel-count"), int(own.len() as i64)),
                (name("pending"), Reply::Array(own_pending)),
            ]));
        }
        group_replies.push(Reply::Map(vec![
            (name("name"), Reply::Bulk(group)),
            (name("last-delivered-id"), id_reply(g.last)),
            (name("entries-read"), optional(g.entries_read)),
            (name("lag"), optional(groups::lag(&meta, c.len, &g))),
            (name("pel-count"), int(pel.len() as i64)),
            (name("pending"), Reply::Array(pending)),
            (name("consumers"), Reply::Array(consumers)),
        ]));
    }
    map.push((name("groups"), Reply::Array(group_replies)));
    Ok(Reply::Map(map))
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
        note_new_consumer(ctx, batch, key, c, name, consumer)?;
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
    note_new_consumer(ctx, batch, key, c, name, consumer)?;
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
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: a group read"
)]
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
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: a group read"
)]
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

/// What a claim does to the pending entries it takes: the consumer, the
/// delivery time, and how the delivery count changes.
struct Claim<'a> {
    key: &'a [u8],
    c: Collection,
    group: &'a [u8],
    consumer: &'a [u8],
    delivered_ms: u64,
    /// RETRYCOUNT: the count to set.
    retry_count: Option<u64>,
    justid: bool,
}

impl Claim<'_> {
    /// Gives pending entry `id` (`nack`) to the claiming consumer; its
    /// reply (the id, or the entry).
    fn take(
        &self,
        batch: &mut sluice_redis::db::DbBatch<'_>,
        id: StreamId,
        mut nack: Nack,
        fields: Vec<Vec<u8>>,
    ) -> Result<Reply, Failure> {
        nack.delivered_ms = self.delivered_ms;
        match self.retry_count {
            Some(n) => nack.deliveries = n,
            None if !self.justid => nack.deliveries += 1,
            None => {}
        }
        nack.consumer = self.consumer.to_vec();
        groups::put_nack(batch, self.key, self.c, self.group, id, &nack)?;
        Ok(if self.justid {
            id_reply(id)
        } else {
            entry_reply(id, fields)
        })
    }

    /// Makes (or sees) the claiming consumer once something is claimed.
    fn consumer_seen(
        &self,
        ctx: &Ctx<'_>,
        batch: &mut sluice_redis::db::DbBatch<'_>,
        now: u64,
    ) -> Result<(), Failure> {
        let seen = Consumer { seen_ms: now };
        note_new_consumer(ctx, batch, self.key, self.c, self.group, self.consumer)?;
        Ok(groups::put_consumer(
            batch,
            self.key,
            self.c,
            self.group,
            self.consumer,
            seen,
        )?)
    }
}

/// Tells keyspace notifications of a consumer a read or a claim makes
/// (XGROUP CREATECONSUMER's is the command's own event).
fn note_new_consumer(
    ctx: &Ctx<'_>,
    batch: &mut sluice_redis::db::DbBatch<'_>,
    key: &[u8],
    c: Collection,
    group: &[u8],
    consumer: &[u8],
) -> Result<(), Failure> {
    if batch.records_changes() && groups::consumer(ctx, c, group, consumer)?.is_none() {
        batch.note_event(key, "xgroup-createconsumer");
    }
    Ok(())
}

/// The entry `id` of stream `c`, if it is still there.
fn entry_of(ctx: &Ctx<'_>, c: Collection, id: StreamId) -> Result<Option<Vec<Vec<u8>>>, Failure> {
    Ok(stream::range(ctx, c, id, id, 1, false)?
        .pop()
        .map(|(_, f)| f))
}

pub(super) fn xclaim(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let (key, name, consumer) = (&args[1][..], &args[2][..], &args[3][..]);
    let _locked = ctx.lock(&[key]);
    let nogroup = || {
        fail(&format!(
            "NOGROUP No such key '{}' or consumer group '{}'",
            text(key),
            text(name)
        ))
    };
    let (c, _, mut g) = stream_and_group(ctx, key, name, nogroup)?;
    let min_idle = string_to_i64(&args[4])
        .ok_or_else(|| fail("ERR Invalid min-idle-time argument for XCLAIM"))?
        .max(0);
    let mut ids = Vec::new();
    let mut j = 5;
    while j < args.len() {
        match parse_id(&args[j], 0, true) {
            Ok(id) => ids.push(id),
            Err(_) => break,
        }
        j += 1;
    }
    let now = ctx.now_ms() as i64;
    let (mut force, mut justid, mut retry_count) = (false, false, None);
    let (mut delivery, mut last_id) = (None, StreamId::default());
    while j < args.len() {
        let more = j + 1 < args.len();
        let number = |what: &str| {
            string_to_i64(&args[j + 1])
                .ok_or_else(|| fail(&format!("ERR Invalid {what} option argument for XCLAIM")))
        };
        match args[j].to_ascii_lowercase().as_slice() {
            b"force" => force = true,
            b"justid" => justid = true,
            b"idle" if more => {
                delivery = Some(now - number("IDLE")?);
                j += 1;
            }
            b"time" if more => {
                delivery = Some(number("TIME")?);
                j += 1;
            }
            b"retrycount" if more => {
                retry_count = Some(number("RETRYCOUNT")?);
                j += 1;
            }
            b"lastid" if more => {
                last_id = parse_id(&args[j + 1], 0, true)?;
                j += 1;
            }
            _ => {
                return Err(fail(&format!(
                    "ERR Unrecognized XCLAIM option '{}'",
                    text(&args[j])
                )))
            }
        }
        j += 1;
    }
    let mut batch = ctx.batch();
    if last_id > g.last {
        g.last = last_id;
        groups::put_group(&mut batch, key, c, name, &g)?;
    }
    let delivered_ms = match delivery {
        Some(t) if (0..=now).contains(&t) => t as u64,
        _ => now as u64,
    };
    let claim = Claim {
        key,
        c,
        group: name,
        consumer,
        delivered_ms,
        // A negative RETRYCOUNT leaves the count as Redis does.
        retry_count: retry_count.and_then(|n| u64::try_from(n).ok()),
        justid,
    };
    let mut out = Vec::new();
    let mut claimed: Vec<StreamId> = Vec::new();
    for id in ids {
        if claimed.contains(&id) {
            continue;
        }
        let nack = groups::nack(ctx, c, name, id)?;
        let Some(fields) = entry_of(ctx, c, id)? else {
            if nack.is_some() {
                groups::delete_nack(&mut batch, key, c, name, id)?;
            }
            continue;
        };
        let nack = match nack {
            Some(n) => {
                if min_idle != 0 && now - (n.delivered_ms as i64) < min_idle {
                    continue;
                }
                n
            }
            None if force => Nack {
                delivered_ms: now as u64,
                deliveries: 1,
                consumer: Vec::new(),
            },
            None => continue,
        };
        if claimed.is_empty() {
            claim.consumer_seen(ctx, &mut batch, now as u64)?;
        }
        out.push(claim.take(&mut batch, id, nack, fields)?);
        claimed.push(id);
    }
    ctx.commit(batch)?;
    Ok(Reply::Array(out))
}

pub(super) fn xautoclaim(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let (key, name, consumer) = (&args[1][..], &args[2][..], &args[3][..]);
    let min_idle = string_to_i64(&args[4])
        .ok_or_else(|| fail("ERR Invalid min-idle-time argument for XAUTOCLAIM"))?
        .max(0);
    let (mut start, start_ex) = interval_id(&args[5], 0)?;
    if start_ex {
        start = incr(start).ok_or_else(|| fail("ERR invalid start ID for the interval"))?;
    }
    let (mut count, mut justid) = (100i64, false);
    let mut j = 6;
    while j < args.len() {
        match args[j].to_ascii_lowercase().as_slice() {
            b"count" if j + 1 < args.len() => {
                let most = i64::MAX / 16;
                count = string_to_i64(&args[j + 1])
                    .filter(|n| (1..=most).contains(n))
                    .ok_or_else(|| fail("ERR COUNT must be > 0"))?;
                j += 1;
            }
            b"justid" => justid = true,
            _ => return Err(fail(SYNTAX)),
        }
        j += 1;
    }
    let _locked = ctx.lock(&[key]);
    let nogroup = || {
        fail(&format!(
            "NOGROUP No such key '{}' or consumer group '{}'",
            text(key),
            text(name)
        ))
    };
    let (c, _, _) = stream_and_group(ctx, key, name, nogroup)?;
    let now = ctx.now_ms();
    let claim = Claim {
        key,
        c,
        group: name,
        consumer,
        delivered_ms: now,
        retry_count: None,
        justid,
    };
    let mut batch = ctx.batch();
    let (mut attempts, mut out, mut deleted) = (count * 10, Vec::new(), Vec::new());
    let mut pel = groups::pending(ctx, c, name, start, MAX_ID, false);
    let mut next = StreamId::default();
    while attempts > 0 && count > 0 {
        attempts -= 1;
        let Some(item) = pel.next() else {
            break;
        };
        let (id, nack) = item?;
        let Some(fields) = entry_of(ctx, c, id)? else {
            groups::delete_nack(&mut batch, key, c, name, id)?;
            deleted.push(id_reply(id));
            count -= 1;
            continue;
        };
        if min_idle != 0 && (now as i64) - (nack.delivered_ms as i64) < min_idle {
            continue;
        }
        if out.is_empty() {
            claim.consumer_seen(ctx, &mut batch, now)?;
        }
        out.push(claim.take(&mut batch, id, nack, fields)?);
        count -= 1;
    }
    // Where the next call starts: the pending entry after the last one
    // looked at, or 0-0 when none is left.
    if let Some(item) = pel.next() {
        next = item?.0;
    }
    drop(pel);
    ctx.commit(batch)?;
    Ok(Reply::Array(vec![
        id_reply(next),
        Reply::Array(out),
        Reply::Array(deleted),
    ]))
}

pub(super) fn xsetid(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let key = &args[1][..];
    let id = parse_id(&args[2], 0, true)?;
    let (mut added, mut max_deleted) = (None, StreamId::default());
    let mut j = 3;
    while j < args.len() {
        let more = j + 1 < args.len();
        match args[j].to_ascii_lowercase().as_slice() {
            b"entriesadded" if more => {
                let n = parse_i64(&args[j + 1])?;
                if n < 0 {
                    return Err(fail("ERR entries_added must be positive"));
                }
                added = Some(n as u64);
            }
            b"maxdeletedid" if more => {
                max_deleted = parse_id(&args[j + 1], 0, true)?;
                if id < max_deleted {
                    return Err(fail(
                        "ERR The ID specified in XSETID is smaller than the provided max_deleted_entry_id",
                    ));
                }
            }
            _ => return Err(fail(SYNTAX)),
        }
        j += 2;
    }
    let _locked = ctx.lock(&[key]);
    let (entry, mut batch) = ctx.begin(key)?;
    let (c, mut meta, expire_at_ms) = match entry {
        None => return Err(fail("ERR no such key")),
        Some(Entry {
            value: sluice_redis::Value::Stream { c, meta },
            expire_at_ms,
        }) => (c, meta, expire_at_ms),
        Some(_) => return Err(fail(WRONGTYPE)),
    };
    if c.len > 0 {
        let top = stream::range(ctx, c, StreamId::default(), MAX_ID, 1, true)?;
        if top.first().is_some_and(|(top, _)| id < *top) {
            return Err(fail(
                "ERR The ID specified in XSETID is smaller than the target stream top item",
            ));
        }
        if added.is_some_and(|n| c.len > n) {
            return Err(fail(
                "ERR The entries_added specified in XSETID is smaller than the target stream length",
            ));
        }
    }
    meta.last = id;
    if let Some(n) = added {
        meta.added = n;
    }
    if max_deleted != StreamId::default() {
        meta.max_deleted = max_deleted;
    }
    let value = sluice_redis::Value::Stream { c, meta };
    batch.put(
        key,
        &Entry {
            value,
            expire_at_ms,
        },
    )?;
    ctx.commit(batch)?;
    Ok(ok())
}
