//! XCLAIM and XAUTOCLAIM: pending entries taken over by another consumer.

use super::{id_reply, stream_and_group, text};
use crate::commands::streams::{entry_reply, incr, interval_id, parse_id, MAX_ID};
use crate::commands::*;
use sluice_redis::stream;
use sluice_redis::stream_group::{self as groups, Consumer, Nack};
use sluice_redis::{Collection, StreamId};

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
pub(super) fn note_new_consumer(
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

pub(in crate::commands) fn xclaim(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
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

pub(in crate::commands) fn xautoclaim(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
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
