//! Streams' consumer groups, following Redis 7.0's t_stream.c: XGROUP
//! (CREATE, SETID, DESTROY, CREATECONSUMER, DELCONSUMER, HELP), XREADGROUP
//! (new entries with `>`, a consumer's history with an id; BLOCK through
//! the server's registry as XREAD), XACK, XPENDING (summary and ranges,
//! IDLE, a consumer), XCLAIM, XAUTOCLAIM, XINFO STREAM, GROUPS and CONSUMERS,
//! and XSETID. Each command's changes
//! to groups, consumers and pending entries are one store batch. The
//! layout is `sluice_redis::stream_group`'s. XGROUP, XACK, XPENDING and
//! XSETID are here; XREADGROUP in `read`, XCLAIM and XAUTOCLAIM in
//! `claim`, XINFO in `info`.

mod claim;
mod info;
mod read;

pub(super) use claim::{xautoclaim, xclaim};
pub(super) use info::xinfo;
pub(super) use read::xreadgroup;
pub use read::{check_group_streams, read_group_once};

use super::streams::{incr, interval_id, parse_id, MAX_ID};
use super::*;
use sluice_redis::stream;
use sluice_redis::stream_group::{self as groups, Consumer, Group};
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
    let (mkstream, entries_read) = xgroup_options(&sub, args)?;
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
            let last = found.as_ref().map(|(_, meta, _)| meta.last);
            let id = if &args[4][..] == b"$" {
                last.unwrap_or_default()
            } else {
                parse_id(&args[4], 0, true)?
            };
            // After the id, as Redis checks them.
            if group.is_some() {
                return Err(fail("BUSYGROUP Consumer Group name already exists"));
            }
            let c = match found {
                Some((c, _, _)) => c,
                None => new_empty_stream(ctx, &mut batch, key)?,
            };
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
            int(delete_consumer(ctx, &mut batch, key, c, name, &args[4])?)
        }
        _ => return Err(sub_syntax("XGROUP", &args[1])),
    };
    ctx.commit(batch)?;
    Ok(reply)
}

/// XGROUP's options after its fixed arguments: MKSTREAM (CREATE) and
/// ENTRIESREAD (CREATE, SETID).
fn xgroup_options(sub: &[u8], args: &Args) -> Result<(bool, Option<u64>), Failure> {
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
    Ok((mkstream, entries_read))
}

/// An empty stream written at `key` in `batch` (XGROUP CREATE MKSTREAM).
fn new_empty_stream(
    ctx: &Ctx<'_>,
    batch: &mut DbBatch<'_>,
    key: &[u8],
) -> Result<Collection, Failure> {
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
    Ok(c)
}

/// XGROUP DELCONSUMER: the consumer and its pending entries go; how many
/// pending entries it had.
fn delete_consumer(
    ctx: &Ctx<'_>,
    batch: &mut DbBatch<'_>,
    key: &[u8],
    c: Collection,
    group: &[u8],
    consumer: &[u8],
) -> Result<i64, Failure> {
    if groups::consumer(ctx, c, group, consumer)?.is_none() {
        return Ok(0);
    }
    let mut pending = 0;
    for item in groups::pending(ctx, c, group, StreamId::default(), MAX_ID, false) {
        let (id, nack) = item?;
        if nack.consumer == consumer {
            groups::delete_nack(batch, key, c, group, id)?;
            pending += 1;
        }
    }
    groups::delete_consumer(batch, key, c, group, consumer)?;
    Ok(pending)
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
