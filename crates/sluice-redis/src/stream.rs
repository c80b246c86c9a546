//! Streams: a record of type stream (its ids) and one member per entry,
//! `[0x00][ms u64 BE][seq u64 BE]` → `[field count u32 LE]` then each
//! field and value as `[length u32 LE][bytes]` (docs/FORMAT.md,
//! "Members"). Entries come back in id order. Following Redis 7.0's
//! t_stream.c for ids, trimming and what each operation answers;
//! consumer groups are to come.

use crate::ctx::Ctx;
use crate::db::DbBatch;
use crate::error::{fail, Failure, WRONGTYPE};
use crate::record::{Collection, Entry, StreamId, StreamMeta, Value};
use sluice_store::StoreError;
use std::ops::Bound;

const ENTRY: u8 = 0;

/// Entries Redis keeps in one listpack node (`stream-node-max-entries`):
/// approximate trimming (`~`) removes whole nodes only.
pub const NODE_ENTRIES: u64 = 100;

/// An entry: its id and its fields and values, flat.
pub type StreamEntry = (StreamId, Vec<Vec<u8>>);

/// A stream entry's sub-key: `[0x00][ms u64 BE][seq u64 BE]`.
pub(crate) fn entry_sub(id: StreamId) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[0] = ENTRY;
    k[1..9].copy_from_slice(&id.ms.to_be_bytes());
    k[9..].copy_from_slice(&id.seq.to_be_bytes());
    k
}

fn id_of(sub: &[u8]) -> Result<StreamId, StoreError> {
    let bad = || StoreError::BadInput("a stream entry's key is malformed".into());
    if sub.len() != 17 || sub[0] != ENTRY {
        return Err(bad());
    }
    Ok(StreamId {
        ms: u64::from_be_bytes(sub[1..9].try_into().map_err(|_| bad())?),
        seq: u64::from_be_bytes(sub[9..].try_into().map_err(|_| bad())?),
    })
}

/// An entry's stored value.
pub fn encode_fields(pairs: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + pairs.iter().map(|p| 4 + p.len()).sum::<usize>());
    out.extend_from_slice(&((pairs.len() / 2) as u32).to_le_bytes());
    for p in pairs {
        out.extend_from_slice(&(p.len() as u32).to_le_bytes());
        out.extend_from_slice(p);
    }
    out
}

/// An entry's fields and values, flat, from its stored value.
pub fn decode_fields(bytes: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
    let bad = || StoreError::BadInput("a stream entry is malformed".into());
    let mut r = sluice_io::codec::Reader::new(bytes);
    let count = r.u32().ok_or_else(bad)? as usize;
    let mut out = Vec::with_capacity(count.min(1 << 16) * 2);
    for _ in 0..count * 2 {
        let len = r.u32().ok_or_else(bad)? as usize;
        out.push(r.take(len).ok_or_else(bad)?.to_vec());
    }
    if !r.is_done() {
        return Err(bad());
    }
    Ok(out)
}

/// The live stream at `key`; None if there is no key, WRONGTYPE if it
/// holds something else.
pub fn get(ctx: &Ctx<'_>, key: &[u8]) -> Result<Option<(Collection, StreamMeta)>, Failure> {
    match ctx.get(key)? {
        None => Ok(None),
        Some(Entry {
            value: Value::Stream { c, meta },
            ..
        }) => Ok(Some((c, meta))),
        Some(_) => Err(fail(WRONGTYPE)),
    }
}

/// Entries with ids in `start ..= end`, in id order or (`rev`) from the
/// newest, at most `count` (0: all).
pub fn range(
    ctx: &Ctx<'_>,
    c: Collection,
    start: StreamId,
    end: StreamId,
    count: u64,
    rev: bool,
) -> Result<Vec<StreamEntry>, Failure> {
    if start > end {
        return Ok(Vec::new());
    }
    let (lo, hi) = (entry_sub(start), entry_sub(end));
    let take = if count == 0 {
        usize::MAX
    } else {
        count as usize
    };
    let mut out = Vec::new();
    for item in ctx
        .members(
            c.id,
            (Bound::Included(&lo[..]), Bound::Included(&hi[..])),
            rev,
        )
        .take(take)
    {
        let (sub, value) = item?;
        out.push((id_of(&sub)?, decode_fields(&value)?));
    }
    Ok(out)
}

/// How XADD picks its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdSpec {
    /// `*`: from the clock.
    Auto,
    /// `ms-*`: the next sequence in that ms.
    Seq(u64),
    /// A whole id.
    Exact(StreamId),
}

/// How XADD and XTRIM trim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trim {
    /// Keep at most this many entries.
    MaxLen(u64),
    /// Drop entries below this id.
    MinId(StreamId),
}

/// A trim and its manner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrimSpec {
    /// What to keep.
    pub trim: Trim,
    /// `~`: only whole nodes of `node_entries` go (as Redis trims).
    pub approx: bool,
    /// Entries per node (`stream-node-max-entries`; 0: no whole node is
    /// known, so `~` removes nothing).
    pub node_entries: u64,
    /// LIMIT: most entries one call removes (0: no limit).
    pub limit: u64,
}

/// Redis's errors of XADD's id.
pub const ID_TOO_SMALL: &str =
    "ERR The ID specified in XADD is equal or smaller than the target stream top item";

fn next_id(meta: &StreamMeta, spec: IdSpec, now_ms: u64) -> Result<StreamId, Failure> {
    let last = meta.last;
    let id = match spec {
        IdSpec::Auto => {
            if now_ms > last.ms {
                StreamId { ms: now_ms, seq: 0 }
            } else {
                match last.seq.checked_add(1) {
                    Some(seq) => StreamId { ms: last.ms, seq },
                    None => StreamId {
                        ms: last.ms.checked_add(1).ok_or_else(|| fail(ID_TOO_SMALL))?,
                        seq: 0,
                    },
                }
            }
        }
        IdSpec::Seq(ms) => {
            if ms == last.ms {
                let seq = last.seq.checked_add(1).ok_or_else(|| fail(ID_TOO_SMALL))?;
                StreamId { ms, seq }
            } else {
                StreamId { ms, seq: 0 }
            }
        }
        IdSpec::Exact(id) => id,
    };
    if id <= last && (last != StreamId::default() || id == last) {
        return Err(fail(ID_TOO_SMALL));
    }
    Ok(id)
}

/// XADD: appends an entry of `pairs` (fields and values, flat) and trims
/// as `trim` says; the new id, None when there is no stream and
/// `nomkstream`. The caller holds `key`'s lock.
pub fn add(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    spec: IdSpec,
    pairs: &[&[u8]],
    nomkstream: bool,
    trim: Option<TrimSpec>,
) -> Result<Option<StreamId>, Failure> {
    let (entry, mut batch) = ctx.begin(key)?;
    if entry.is_none() && nomkstream {
        ctx.commit(batch)?;
        return Ok(None);
    }
    let (c, mut meta, expire_at_ms, new) = to_add_to(ctx, entry)?;
    let id = next_add_id(&meta, spec, ctx.now_ms())?;
    batch.put_member(key, c.id, &entry_sub(id), &encode_fields(pairs))?;
    meta.last = id;
    if c.len == 0 {
        meta.first = id;
    }
    meta.added += 1;
    let mut c = Collection {
        len: c.len + 1,
        ..c
    };
    // The trim sees the new entry, which the store does not show yet.
    let removed = match trim {
        Some(t) => doomed(ctx, c, &meta, t, Some(id))?,
        None => Vec::new(),
    };
    for gone in &removed {
        batch.delete_member(key, c.id, &entry_sub(*gone))?;
    }
    c.len -= removed.len() as u64;
    if c.len == 0 {
        meta.first = StreamId::default();
    } else if !removed.is_empty() {
        meta.first = first_after(ctx, c, &removed, id)?;
    }
    put_added_to(&mut batch, key, c, meta, expire_at_ms, new)?;
    ctx.commit(batch)?;
    Ok(Some(id))
}

/// The stream `entry` holds, to add to — its collection, metadata,
/// expiry and whether it is new (no entry: an empty one with a new id) —
/// or WRONGTYPE.
fn to_add_to(
    ctx: &Ctx<'_>,
    entry: Option<Entry>,
) -> Result<(Collection, StreamMeta, u64, bool), Failure> {
    match entry {
        None => {
            let c = Collection {
                id: ctx.db().new_id()?,
                len: 0,
            };
            Ok((c, StreamMeta::default(), 0, true))
        }
        Some(Entry {
            value: Value::Stream { c, meta },
            expire_at_ms,
        }) => Ok((c, meta, expire_at_ms, false)),
        Some(_) => Err(fail(WRONGTYPE)),
    }
}

/// Writes the record of a stream XADD added to ([`to_add_to`]'s `new`:
/// its first record).
fn put_added_to(
    batch: &mut DbBatch<'_>,
    key: &[u8],
    c: Collection,
    meta: StreamMeta,
    expire_at_ms: u64,
    new: bool,
) -> Result<(), StoreError> {
    let entry = Entry {
        value: Value::Stream { c, meta },
        expire_at_ms,
    };
    if new {
        batch.put_new(key, &entry)
    } else {
        batch.put(key, &entry)
    }
}

/// The id XADD gives its entry under `spec`, or Redis's error when the
/// stream's ids are exhausted or `spec` is not above the last.
fn next_add_id(meta: &StreamMeta, spec: IdSpec, now_ms: u64) -> Result<StreamId, Failure> {
    let exhausted = StreamId {
        ms: u64::MAX,
        seq: u64::MAX,
    };
    if meta.last == exhausted {
        return Err(fail(
            "ERR The stream has exhausted the last possible ID, unable to add more items",
        ));
    }
    next_id(meta, spec, now_ms)
}

/// `XADD key * field value ...` of each of `runs` (one command's field
/// and value list each), in order, in one batch: each entry's id, or the
/// error that command answers (the stream's ids exhausted). The caller
/// holds `key`'s lock.
#[allow(clippy::type_complexity)]
pub fn add_auto_runs(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    runs: &[&[&[u8]]],
) -> Result<Vec<Result<StreamId, Failure>>, Failure> {
    let (entry, mut batch) = ctx.begin(key)?;
    let (mut c, mut meta, expire_at_ms, new) = to_add_to(ctx, entry)?;
    let mut each = Vec::with_capacity(runs.len());
    for pairs in runs {
        let id = next_add_id(&meta, IdSpec::Auto, ctx.now_ms());
        let Ok(id) = id else {
            each.push(id);
            continue;
        };
        batch.put_member(key, c.id, &entry_sub(id), &encode_fields(pairs))?;
        meta.last = id;
        if c.len == 0 {
            meta.first = id;
        }
        meta.added += 1;
        c.len += 1;
        each.push(Ok(id));
    }
    if each.iter().any(Result::is_ok) {
        put_added_to(&mut batch, key, c, meta, expire_at_ms, new)?;
    }
    ctx.commit(batch)?;
    Ok(each)
}

/// The first id left once `removed` (the oldest entries) go; `newest`
/// is an entry the store may not show yet.
fn first_after(
    ctx: &Ctx<'_>,
    c: Collection,
    removed: &[StreamId],
    newest: StreamId,
) -> Result<StreamId, Failure> {
    if c.len == 0 {
        return Ok(StreamId::default());
    }
    let past = removed.iter().max().copied().unwrap_or_default();
    let found = range(
        ctx,
        c,
        past,
        StreamId {
            ms: u64::MAX,
            seq: u64::MAX,
        },
        2,
        false,
    )?;
    Ok(found
        .into_iter()
        .map(|(id, _)| id)
        .find(|id| *id > past)
        .unwrap_or(newest))
}

/// The most of the `n` oldest entries that fill whole nodes of
/// `node_entries`. Redis closes a node every `node_entries` entries added,
/// so where its nodes begin follows from the oldest entry's place in the
/// order of adding (`first_ordinal`): its node may be partly trimmed
/// already. Unknown (XDEL left holes), nodes are counted from the oldest.
fn whole_nodes(n: u64, first_ordinal: Option<u64>, node_entries: u64) -> u64 {
    let size = node_entries;
    if size == 0 {
        return 0;
    }
    let first_node = match first_ordinal {
        Some(ord) => size - ord % size,
        None => size,
    };
    if n < first_node {
        return 0;
    }
    let rest = n - first_node;
    first_node + rest - rest % size
}

/// The oldest entries `t` removes from stream `c` (`extra`: an entry just
/// added in the caller's batch, counted but never removed by MAXLEN).
fn doomed(
    ctx: &Ctx<'_>,
    c: Collection,
    meta: &StreamMeta,
    t: TrimSpec,
    extra: Option<StreamId>,
) -> Result<Vec<StreamId>, Failure> {
    let stored = c.len - u64::from(extra.is_some());
    let want = match t.trim {
        Trim::MaxLen(max) => c.len.saturating_sub(max),
        Trim::MinId(_) => stored,
    };
    // MAXLEN may take the entry just added too (MAXLEN 0 leaves the
    // stream empty, as Redis does); MINID never does (its id is the
    // newest).
    let mut want = match t.trim {
        Trim::MaxLen(_) => want.min(c.len),
        Trim::MinId(_) => want.min(stored),
    };
    if t.limit > 0 {
        want = want.min(t.limit);
    }
    // The oldest entry's place in the order of adding, when no XDEL made
    // holes after it (`meta.added` and `c.len` count an entry just added).
    let none = StreamId::default();
    let contiguous = meta.max_deleted == none || meta.max_deleted < meta.first;
    let first_ordinal = contiguous.then(|| meta.added.saturating_sub(c.len));
    if t.approx {
        if let Trim::MaxLen(_) = t.trim {
            want = whole_nodes(want, first_ordinal, t.node_entries);
        }
    }
    if want == 0 {
        return Ok(Vec::new());
    }
    let all = range(
        ctx,
        c,
        StreamId::default(),
        StreamId {
            ms: u64::MAX,
            seq: u64::MAX,
        },
        want,
        false,
    )?;
    let mut ids: Vec<StreamId> = all.into_iter().map(|(id, _)| id).collect();
    if let (Some(new), Trim::MaxLen(_)) = (extra, t.trim) {
        if want > stored {
            ids.push(new);
        }
    }
    if let Trim::MinId(min) = t.trim {
        ids.retain(|id| *id < min);
        if t.approx {
            let whole = whole_nodes(ids.len() as u64, first_ordinal, t.node_entries);
            ids.truncate(whole as usize);
        }
    }
    Ok(ids)
}

/// XTRIM: how many entries went. The caller holds `key`'s lock.
pub fn trim(ctx: &mut Ctx<'_>, key: &[u8], t: TrimSpec) -> Result<i64, Failure> {
    let (entry, mut batch) = ctx.begin(key)?;
    let (c, mut meta, expire_at_ms) = match entry {
        None => {
            ctx.commit(batch)?;
            return Ok(0);
        }
        Some(Entry {
            value: Value::Stream { c, meta },
            expire_at_ms,
        }) => (c, meta, expire_at_ms),
        Some(_) => return Err(fail(WRONGTYPE)),
    };
    let removed = doomed(ctx, c, &meta, t, None)?;
    if removed.is_empty() {
        ctx.commit(batch)?;
        return Ok(0);
    }
    for gone in &removed {
        batch.delete_member(key, c.id, &entry_sub(*gone))?;
    }
    let c = Collection {
        len: c.len - removed.len() as u64,
        ..c
    };
    meta.first = first_after(ctx, c, &removed, meta.last)?;
    batch.put(
        key,
        &Entry {
            value: Value::Stream { c, meta },
            expire_at_ms,
        },
    )?;
    ctx.commit(batch)?;
    Ok(removed.len() as i64)
}

/// XDEL: how many of `ids` were there. The caller holds `key`'s lock.
pub fn delete(ctx: &mut Ctx<'_>, key: &[u8], ids: &[StreamId]) -> Result<i64, Failure> {
    let (entry, mut batch) = ctx.begin(key)?;
    let (c, mut meta, expire_at_ms) = match entry {
        None => {
            ctx.commit(batch)?;
            return Ok(0);
        }
        Some(Entry {
            value: Value::Stream { c, meta },
            expire_at_ms,
        }) => (c, meta, expire_at_ms),
        Some(_) => return Err(fail(WRONGTYPE)),
    };
    let mut removed = Vec::new();
    for id in ids {
        if !removed.contains(id) && ctx.member(c.id, &entry_sub(*id))?.is_some() {
            batch.delete_member(key, c.id, &entry_sub(*id))?;
            removed.push(*id);
        }
    }
    if removed.is_empty() {
        ctx.commit(batch)?;
        return Ok(0);
    }
    let c = Collection {
        len: c.len - removed.len() as u64,
        ..c
    };
    meta.max_deleted = meta
        .max_deleted
        .max(removed.iter().copied().max().unwrap_or_default());
    if removed.contains(&meta.first) {
        meta.first = if c.len == 0 {
            StreamId::default()
        } else {
            let all = range(
                ctx,
                Collection {
                    len: c.len + removed.len() as u64,
                    ..c
                },
                meta.first,
                StreamId {
                    ms: u64::MAX,
                    seq: u64::MAX,
                },
                removed.len() as u64 + 1,
                false,
            )?;
            all.into_iter()
                .map(|(id, _)| id)
                .find(|id| !removed.contains(id))
                .unwrap_or_default()
        };
    }
    batch.put(
        key,
        &Entry {
            value: Value::Stream { c, meta },
            expire_at_ms,
        },
    )?;
    ctx.commit(batch)?;
    Ok(removed.len() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_encode_and_decode() {
        let pairs: Vec<&[u8]> = vec![b"a", b"1", b"", b"long value"];
        let bytes = encode_fields(&pairs);
        let back = decode_fields(&bytes).unwrap();
        assert_eq!(back, pairs.iter().map(|p| p.to_vec()).collect::<Vec<_>>());
        assert!(decode_fields(&bytes[..bytes.len() - 1]).is_err());
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(decode_fields(&extra).is_err());
    }

    #[test]
    fn ids_come_from_the_clock_and_never_go_back() {
        let mut meta = StreamMeta::default();
        let id = next_id(&meta, IdSpec::Auto, 1000).unwrap();
        assert_eq!(id, StreamId { ms: 1000, seq: 0 });
        meta.last = id;
        assert_eq!(
            next_id(&meta, IdSpec::Auto, 999).unwrap(),
            StreamId { ms: 1000, seq: 1 }
        );
        assert_eq!(
            next_id(&meta, IdSpec::Seq(1000), 0).unwrap(),
            StreamId { ms: 1000, seq: 1 }
        );
        assert_eq!(
            next_id(&meta, IdSpec::Seq(2000), 0).unwrap(),
            StreamId { ms: 2000, seq: 0 }
        );
        assert!(next_id(&meta, IdSpec::Seq(999), 0).is_err());
        assert!(next_id(&meta, IdSpec::Exact(id), 0).is_err());
        let empty = StreamMeta::default();
        assert_eq!(
            next_id(&empty, IdSpec::Exact(StreamId { ms: 0, seq: 1 }), 0).unwrap(),
            StreamId { ms: 0, seq: 1 }
        );
    }
}
