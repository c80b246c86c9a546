//! XREADGROUP: new entries with `>` and a consumer's history, once or
//! blocking through the server's registry.

use super::claim::note_new_consumer;
use super::{id_reply, stream_and_group, text};
use crate::commands::streams::{entries_reply, entry_reply, incr, Read, MAX_ID};
use crate::commands::*;
use sluice_redis::stream;
use sluice_redis::stream_group::{self as groups, Consumer, Nack};
use sluice_redis::{Collection, StreamId, StreamMeta};

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

pub(in crate::commands) fn xreadgroup(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let r = crate::commands::streams::parse_read(args)?;
    let keys: Vec<&[u8]> = r.streams.iter().map(|(k, _)| &k[..]).collect();
    let _locked = ctx.lock(&keys);
    check_group_streams(ctx, &r)?;
    Ok(read_group_once(ctx, &r)?.unwrap_or(Reply::NullArray))
}
