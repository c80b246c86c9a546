//! Streams' consumer groups: each group, its consumers and its pending
//! entries (the PEL) are members of the stream's collection beside its
//! entries (docs/FORMAT.md, "Members"):
//!
//! - `[0x01][group]` → the group: last delivered id (ms, seq) and entries
//!   read (`u64::MAX`: unknown), u64 LE each;
//! - `[0x02][group length u32 BE][group][consumer]` → the consumer: when it
//!   was last seen and last active, ms u64 LE each;
//! - `[0x03][group length u32 BE][group][ms u64 BE][seq u64 BE]` → a pending
//!   entry: when it was last delivered (ms u64 LE), how many times (u64
//!   LE), then the consumer that holds it.
//!
//! The stream's record counts its entries only. A consumer's own pending
//! entries are the group's filtered by consumer (Redis keeps a second
//! index; a consumer's count here costs a walk of its group's PEL).
//! Following Redis 7.0's t_stream.c for the read counter and lag.

use crate::ctx::Ctx;
use crate::db::DbBatch;
use crate::error::Failure;
use crate::record::{Collection, StreamId, StreamMeta};
use sluice_store::StoreError;
use std::ops::Bound;

const GROUP: u8 = 1;
const CONSUMER: u8 = 2;
const PENDING: u8 = 3;

/// A consumer group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Group {
    /// The last entry delivered to any of its consumers.
    pub last: StreamId,
    /// Entries read (Redis's `entries_read`); None when unknown.
    pub entries_read: Option<u64>,
}

/// A consumer of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Consumer {
    /// When it last read or was created (Unix ms).
    pub seen_ms: u64,
}

/// A pending entry: delivered, not yet acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nack {
    /// When it was last delivered (Unix ms).
    pub delivered_ms: u64,
    /// How many times it was delivered.
    pub deliveries: u64,
    /// The consumer that holds it.
    pub consumer: Vec<u8>,
}

fn bad(what: &str) -> StoreError {
    StoreError::BadInput(format!("a stream's {what} is malformed"))
}

fn u64_at(bytes: &[u8], at: usize, what: &str) -> Result<u64, StoreError> {
    sluice_io::codec::u64_at(bytes, at).ok_or_else(|| bad(what))
}

fn group_sub(name: &[u8]) -> Vec<u8> {
    [&[GROUP][..], name].concat()
}

/// `[kind][group length u32 BE][group]`: where a group's consumers or
/// pending entries start.
fn group_prefix(kind: u8, group: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(5 + group.len());
    k.push(kind);
    k.extend_from_slice(&(group.len() as u32).to_be_bytes());
    k.extend_from_slice(group);
    k
}

fn consumer_sub(group: &[u8], consumer: &[u8]) -> Vec<u8> {
    [group_prefix(CONSUMER, group), consumer.to_vec()].concat()
}

fn pending_sub(group: &[u8], id: StreamId) -> Vec<u8> {
    let mut k = group_prefix(PENDING, group);
    k.extend_from_slice(&id.ms.to_be_bytes());
    k.extend_from_slice(&id.seq.to_be_bytes());
    k
}

/// The first key past every key starting with `prefix`.
fn past(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0xff; 9]
}

fn encode_group(g: &Group) -> [u8; 24] {
    let mut v = [0u8; 24];
    v[..8].copy_from_slice(&g.last.ms.to_le_bytes());
    v[8..16].copy_from_slice(&g.last.seq.to_le_bytes());
    v[16..].copy_from_slice(&g.entries_read.unwrap_or(u64::MAX).to_le_bytes());
    v
}

fn decode_group(v: &[u8]) -> Result<Group, StoreError> {
    if v.len() != 24 {
        return Err(bad("consumer group"));
    }
    let read = u64_at(v, 16, "consumer group")?;
    Ok(Group {
        last: StreamId {
            ms: u64_at(v, 0, "consumer group")?,
            seq: u64_at(v, 8, "consumer group")?,
        },
        entries_read: (read != u64::MAX).then_some(read),
    })
}

fn encode_nack(n: &Nack) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + n.consumer.len());
    v.extend_from_slice(&n.delivered_ms.to_le_bytes());
    v.extend_from_slice(&n.deliveries.to_le_bytes());
    v.extend_from_slice(&n.consumer);
    v
}

fn decode_nack(v: &[u8]) -> Result<Nack, StoreError> {
    Ok(Nack {
        delivered_ms: u64_at(v, 0, "pending entry")?,
        deliveries: u64_at(v, 8, "pending entry")?,
        consumer: v.get(16..).ok_or_else(|| bad("pending entry"))?.to_vec(),
    })
}

/// Every group of stream `c`, by name.
pub fn groups(ctx: &Ctx<'_>, c: Collection) -> Result<Vec<(Vec<u8>, Group)>, Failure> {
    let (lo, hi) = ([GROUP], [GROUP + 1]);
    let mut out = Vec::new();
    for item in ctx.members(
        c.id,
        (Bound::Included(&lo[..]), Bound::Excluded(&hi[..])),
        false,
    ) {
        let (sub, value) = item?;
        out.push((sub[1..].to_vec(), decode_group(&value)?));
    }
    Ok(out)
}

/// Group `name` of stream `c`.
pub fn group(ctx: &Ctx<'_>, c: Collection, name: &[u8]) -> Result<Option<Group>, Failure> {
    match ctx.member(c.id, &group_sub(name))? {
        None => Ok(None),
        Some(v) => Ok(Some(decode_group(&v)?)),
    }
}

/// Every consumer of `group`, by name.
pub fn consumers(
    ctx: &Ctx<'_>,
    c: Collection,
    group: &[u8],
) -> Result<Vec<(Vec<u8>, Consumer)>, Failure> {
    let lo = group_prefix(CONSUMER, group);
    let hi = past(&lo);
    let mut out = Vec::new();
    for item in ctx.members(
        c.id,
        (Bound::Included(&lo[..]), Bound::Excluded(&hi[..])),
        false,
    ) {
        let (sub, value) = item?;
        out.push((
            sub[lo.len()..].to_vec(),
            Consumer {
                seen_ms: u64_at(&value, 0, "consumer")?,
            },
        ));
    }
    Ok(out)
}

/// Consumer `name` of `group`.
pub fn consumer(
    ctx: &Ctx<'_>,
    c: Collection,
    group: &[u8],
    name: &[u8],
) -> Result<Option<Consumer>, Failure> {
    match ctx.member(c.id, &consumer_sub(group, name))? {
        None => Ok(None),
        Some(v) => Ok(Some(Consumer {
            seen_ms: u64_at(&v, 0, "consumer")?,
        })),
    }
}

/// `group`'s pending entries with ids in `start ..= end`, in id order
/// (`rev`: from the newest).
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: 8 bytes"
)]
pub fn pending<'c>(
    ctx: &'c Ctx<'_>,
    c: Collection,
    group: &[u8],
    start: StreamId,
    end: StreamId,
    rev: bool,
) -> impl Iterator<Item = Result<(StreamId, Nack), Failure>> + 'c {
    let prefix_len = group_prefix(PENDING, group).len();
    let (lo, hi) = (pending_sub(group, start), pending_sub(group, end));
    let items = ctx
        .members(
            c.id,
            (Bound::Included(&lo[..]), Bound::Included(&hi[..])),
            rev,
        )
        .take(if start > end { 0 } else { usize::MAX });
    items.map(move |item| {
        let (sub, value) = item?;
        let id: [u8; 16] = sub
            .get(prefix_len..)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| bad("pending entry's key"))?;
        let (ms, seq) = id.split_at(8);
        let id = StreamId {
            ms: u64::from_be_bytes(ms.try_into().expect("8 bytes")),
            seq: u64::from_be_bytes(seq.try_into().expect("8 bytes")),
        };
        Ok((id, decode_nack(&value)?))
    })
}

/// The pending entry `id` of `group`.
pub fn nack(
    ctx: &Ctx<'_>,
    c: Collection,
    group: &[u8],
    id: StreamId,
) -> Result<Option<Nack>, Failure> {
    match ctx.member(c.id, &pending_sub(group, id))? {
        None => Ok(None),
        Some(v) => Ok(Some(decode_nack(&v)?)),
    }
}

/// Writes group `name` of the stream at `key`.
pub fn put_group(
    batch: &mut DbBatch<'_>,
    key: &[u8],
    c: Collection,
    name: &[u8],
    g: &Group,
) -> Result<(), StoreError> {
    batch.put_member(key, c.id, &group_sub(name), &encode_group(g))
}

/// Writes consumer `name` of `group`.
pub fn put_consumer(
    batch: &mut DbBatch<'_>,
    key: &[u8],
    c: Collection,
    group: &[u8],
    name: &[u8],
    consumer: Consumer,
) -> Result<(), StoreError> {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&consumer.seen_ms.to_le_bytes());
    v[8..].copy_from_slice(&consumer.seen_ms.to_le_bytes());
    batch.put_member(key, c.id, &consumer_sub(group, name), &v)
}

/// Writes pending entry `id` of `group`.
pub fn put_nack(
    batch: &mut DbBatch<'_>,
    key: &[u8],
    c: Collection,
    group: &[u8],
    id: StreamId,
    n: &Nack,
) -> Result<(), StoreError> {
    batch.put_member(key, c.id, &pending_sub(group, id), &encode_nack(n))
}

/// Removes pending entry `id` of `group`.
pub fn delete_nack(
    batch: &mut DbBatch<'_>,
    key: &[u8],
    c: Collection,
    group: &[u8],
    id: StreamId,
) -> Result<(), StoreError> {
    batch.delete_member(key, c.id, &pending_sub(group, id))
}

/// Removes consumer `name` of `group` (not its pending entries).
pub fn delete_consumer(
    batch: &mut DbBatch<'_>,
    key: &[u8],
    c: Collection,
    group: &[u8],
    name: &[u8],
) -> Result<(), StoreError> {
    batch.delete_member(key, c.id, &consumer_sub(group, name))
}

/// Removes group `name` with its consumers and pending entries.
pub fn delete_group(
    ctx: &Ctx<'_>,
    batch: &mut DbBatch<'_>,
    key: &[u8],
    c: Collection,
    name: &[u8],
) -> Result<(), Failure> {
    batch.delete_member(key, c.id, &group_sub(name))?;
    for kind in [CONSUMER, PENDING] {
        let lo = group_prefix(kind, name);
        let hi = past(&lo);
        for item in ctx.members(
            c.id,
            (Bound::Included(&lo[..]), Bound::Excluded(&hi[..])),
            false,
        ) {
            let (sub, _) = item?;
            batch.delete_member(key, c.id, &sub)?;
        }
    }
    Ok(())
}

/// Whether `start ..` holds an id XDEL removed (Redis's
/// streamRangeHasTombstones with no end).
pub fn has_tombstones_from(meta: &StreamMeta, len: u64, start: StreamId) -> bool {
    let none = StreamId::default();
    if len == 0 || meta.max_deleted == none || meta.first > meta.max_deleted {
        return false;
    }
    start <= meta.max_deleted
}

/// How many entries the stream had added up to and including `id`, when
/// that can be known (Redis's streamEstimateDistanceFromFirstEverEntry).
pub fn entries_before(meta: &StreamMeta, len: u64, id: StreamId) -> Option<u64> {
    if meta.added == 0 {
        return Some(0);
    }
    if len == 0 && id <= meta.last {
        return Some(meta.added);
    }
    match id.cmp(&meta.last) {
        std::cmp::Ordering::Equal => return Some(meta.added),
        std::cmp::Ordering::Greater => return None,
        std::cmp::Ordering::Less => {}
    }
    let none = StreamId::default();
    if meta.max_deleted == none || meta.max_deleted < meta.first {
        match id.cmp(&meta.first) {
            std::cmp::Ordering::Less => return Some(meta.added - len),
            std::cmp::Ordering::Equal => return Some(meta.added - len + 1),
            std::cmp::Ordering::Greater => {}
        }
    }
    None
}

/// A group's lag: entries added and not yet delivered to it, when known
/// (Redis's streamReplyWithCGLag).
pub fn lag(meta: &StreamMeta, len: u64, g: &Group) -> Option<u64> {
    if meta.added == 0 {
        return Some(0);
    }
    if let Some(read) = g.entries_read {
        if !has_tombstones_from(meta, len, g.last) {
            return Some(meta.added.saturating_sub(read));
        }
    }
    entries_before(meta, len, g.last).map(|read| meta.added.saturating_sub(read))
}

/// Moves `g` past entry `id` delivered to it (Redis's read counter kept
/// as streamReplyWithRange keeps it).
pub fn advance(g: &mut Group, meta: &StreamMeta, len: u64, id: StreamId) {
    if id <= g.last {
        return;
    }
    match g.entries_read {
        Some(read) if !has_tombstones_from(meta, len, id) => g.entries_read = Some(read + 1),
        _ if meta.added != 0 => g.entries_read = entries_before(meta, len, id),
        _ => {}
    }
    g.last = id;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_keys_sort_by_group_then_id() {
        let g = Group {
            last: StreamId { ms: 5, seq: 7 },
            entries_read: None,
        };
        assert_eq!(decode_group(&encode_group(&g)).unwrap(), g);
        let n = Nack {
            delivered_ms: 9,
            deliveries: 2,
            consumer: b"alice".to_vec(),
        };
        assert_eq!(decode_nack(&encode_nack(&n)).unwrap(), n);
        let a = pending_sub(b"g", StreamId { ms: 1, seq: 9 });
        let b = pending_sub(b"g", StreamId { ms: 2, seq: 0 });
        let other = pending_sub(b"g2", StreamId { ms: 0, seq: 0 });
        assert!(a < b && b < past(&group_prefix(PENDING, b"g")));
        assert!(other >= past(&group_prefix(PENDING, b"g")));
    }

    #[test]
    fn the_read_counter_follows_redis() {
        let meta = StreamMeta {
            last: StreamId { ms: 3, seq: 0 },
            first: StreamId { ms: 1, seq: 0 },
            max_deleted: StreamId::default(),
            added: 3,
        };
        assert_eq!(
            entries_before(&meta, 3, StreamId { ms: 1, seq: 0 }),
            Some(1)
        );
        assert_eq!(
            entries_before(&meta, 3, StreamId { ms: 0, seq: 5 }),
            Some(0)
        );
        assert_eq!(entries_before(&meta, 3, StreamId { ms: 2, seq: 0 }), None);
        assert_eq!(
            entries_before(&meta, 3, StreamId { ms: 3, seq: 0 }),
            Some(3)
        );
        let mut g = Group::default();
        // Before the first entry, with nothing deleted: all three to read.
        assert_eq!(lag(&meta, 3, &g), Some(3));
        let between = Group {
            last: StreamId { ms: 2, seq: 0 },
            entries_read: None,
        };
        assert_eq!(lag(&meta, 3, &between), None);
        g.entries_read = Some(0);
        assert_eq!(lag(&meta, 3, &g), Some(3));
        advance(&mut g, &meta, 3, StreamId { ms: 1, seq: 0 });
        assert_eq!((g.entries_read, lag(&meta, 3, &g)), (Some(1), Some(2)));
    }
}
