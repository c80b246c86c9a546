//! DUMP and RESTORE payloads: one value in Redis's RDB serialization,
//! then the RDB version (u16 LE) and a CRC-64 of everything before it
//! (u64 LE; Redis's CRC-64/Jones, reflected, initial value 0).
//!
//! DUMP writes what every Redis since 2.x reads back: a string (small
//! integers in their integer encodings), a list as a plain list, a set,
//! a sorted set with binary scores, a hash — and a stream as Redis 7.0
//! writes it (`crate::dump_stream`) — version 10, Redis 7.0's.
//! RESTORE reads those and every compact form Redis 7.0 and earlier
//! write: intsets, ziplists, listpacks and quicklists of both kinds, both
//! stream types, and LZF-compressed strings, so a payload from a real
//! Redis restores here. Module values are refused with their own error.

use crate::ctx::Ctx;
use crate::db::DbBatch;
pub use crate::dump_stream::{DumpedGroup, DumpedStream};
use crate::error::Failure;
use crate::rdb::{
    bad, intset, listpack, pairs, put_len, put_string, scored, strings, ziplist, Read, Reader,
    MOST_PREALLOCATED,
};
pub use crate::rdb::{crc64, RestoreError};
use crate::record::{Collection, Entry, StreamId, StreamMeta, Value};
use sluice_store::StoreError;
use std::collections::{BTreeMap, BTreeSet};

/// The RDB version DUMP writes, and the newest RESTORE takes (Redis 7.0).
pub const RDB_VERSION: u16 = 10;

const TYPE_STRING: u8 = 0;
const TYPE_LIST: u8 = 1;
const TYPE_SET: u8 = 2;
const TYPE_ZSET: u8 = 3;
const TYPE_HASH: u8 = 4;
const TYPE_ZSET_2: u8 = 5;
const TYPE_LIST_ZIPLIST: u8 = 10;
const TYPE_SET_INTSET: u8 = 11;
const TYPE_ZSET_ZIPLIST: u8 = 12;
const TYPE_HASH_ZIPLIST: u8 = 13;
const TYPE_LIST_QUICKLIST: u8 = 14;
const TYPE_STREAM_LISTPACKS: u8 = 15;
const TYPE_HASH_LISTPACK: u8 = 16;
const TYPE_ZSET_LISTPACK: u8 = 17;
const TYPE_LIST_QUICKLIST_2: u8 = 18;
const TYPE_STREAM_LISTPACKS_2: u8 = 19;

/// One value as a payload carries it.
#[derive(Debug, Clone, PartialEq)]
pub enum Dumped {
    /// A string's bytes.
    String(Vec<u8>),
    /// A list's items, in order.
    List(Vec<Vec<u8>>),
    /// A set's members.
    Set(Vec<Vec<u8>>),
    /// A sorted set's members and scores.
    ZSet(Vec<(Vec<u8>, f64)>),
    /// A hash's fields and values.
    Hash(Vec<(Vec<u8>, Vec<u8>)>),
    /// A stream with its consumer groups.
    Stream(Box<DumpedStream>),
}

/// The DUMP payload of `value`.
pub fn dump(value: &Dumped) -> Vec<u8> {
    let mut out = Vec::new();
    match value {
        Dumped::String(s) => {
            out.push(TYPE_STRING);
            put_string(&mut out, s);
        }
        Dumped::List(items) | Dumped::Set(items) => {
            out.push(if matches!(value, Dumped::List(_)) {
                TYPE_LIST
            } else {
                TYPE_SET
            });
            put_len(&mut out, items.len() as u64);
            for item in items {
                put_string(&mut out, item);
            }
        }
        Dumped::ZSet(members) => {
            out.push(TYPE_ZSET_2);
            put_len(&mut out, members.len() as u64);
            for (member, score) in members {
                put_string(&mut out, member);
                out.extend_from_slice(&score.to_le_bytes());
            }
        }
        Dumped::Hash(pairs) => {
            out.push(TYPE_HASH);
            put_len(&mut out, pairs.len() as u64);
            for (field, value) in pairs {
                put_string(&mut out, field);
                put_string(&mut out, value);
            }
        }
        Dumped::Stream(stream) => {
            out.push(TYPE_STREAM_LISTPACKS_2);
            crate::dump_stream::write(&mut out, stream);
        }
    }
    out.extend_from_slice(&RDB_VERSION.to_le_bytes());
    let crc = crc64(0, &out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

// ---- reading ----------------------------------------------------------

/// The value in a RESTORE payload, its version and checksum checked
/// first.
pub fn restore(payload: &[u8]) -> Result<Dumped, RestoreError> {
    footer_checked(payload)?;
    let body = &payload[..payload.len() - 10];
    let mut r = Reader { bytes: body, at: 0 };
    let value = read_value(&mut r)?;
    let empty = match &value {
        Dumped::String(_) => false,
        Dumped::List(v) | Dumped::Set(v) => v.is_empty(),
        Dumped::ZSet(v) => v.is_empty(),
        Dumped::Hash(v) => v.is_empty(),
        // Redis keeps a stream that XDEL or XTRIM emptied.
        Dumped::Stream(_) => false,
    };
    let nan = matches!(&value, Dumped::ZSet(v) if v.iter().any(|(_, s)| s.is_nan()));
    // Redis refuses empty collections and trailing bytes.
    if empty || nan || r.at != body.len() {
        return bad();
    }
    Ok(value)
}

fn read_value(r: &mut Reader<'_>) -> Read<Dumped> {
    let kind = r.byte()?;
    Ok(match kind {
        TYPE_STRING => Dumped::String(r.string()?),
        TYPE_LIST | TYPE_SET => {
            let n = r.len()?;
            let items = strings(r, n)?;
            if kind == TYPE_LIST {
                Dumped::List(items)
            } else {
                Dumped::Set(items)
            }
        }
        TYPE_ZSET | TYPE_ZSET_2 => {
            let n = r.len()?;
            let mut members = Vec::with_capacity(n.min(MOST_PREALLOCATED));
            for _ in 0..n {
                let member = r.string()?;
                let score = if kind == TYPE_ZSET_2 {
                    r.binary_double()?
                } else {
                    r.text_double()?
                };
                members.push((member, score));
            }
            Dumped::ZSet(members)
        }
        TYPE_HASH => {
            let n = r.len()?;
            let flat = strings(r, n.checked_mul(2).ok_or(RestoreError::BadFormat)?)?;
            Dumped::Hash(pairs(flat)?)
        }
        TYPE_LIST_ZIPLIST => Dumped::List(ziplist(&r.string()?)?),
        TYPE_SET_INTSET => Dumped::Set(intset(&r.string()?)?),
        TYPE_ZSET_ZIPLIST => Dumped::ZSet(scored(pairs(ziplist(&r.string()?)?)?)?),
        TYPE_HASH_ZIPLIST => Dumped::Hash(pairs(ziplist(&r.string()?)?)?),
        TYPE_HASH_LISTPACK => Dumped::Hash(pairs(listpack(&r.string()?)?)?),
        TYPE_ZSET_LISTPACK => Dumped::ZSet(scored(pairs(listpack(&r.string()?)?)?)?),
        TYPE_LIST_QUICKLIST => {
            let nodes = r.len()?;
            let mut items = Vec::new();
            for _ in 0..nodes {
                items.extend(ziplist(&r.string()?)?);
            }
            Dumped::List(items)
        }
        TYPE_LIST_QUICKLIST_2 => {
            let nodes = r.len()?;
            let mut items = Vec::new();
            for _ in 0..nodes {
                // 1: a plain node holding one item; 2: a listpack.
                match r.len()? {
                    1 => items.push(r.string()?),
                    2 => items.extend(listpack(&r.string()?)?),
                    _ => return bad(),
                }
            }
            Dumped::List(items)
        }
        TYPE_STREAM_LISTPACKS | TYPE_STREAM_LISTPACKS_2 => Dumped::Stream(Box::new(
            crate::dump_stream::read(r, kind == TYPE_STREAM_LISTPACKS_2)?,
        )),
        6 | 7 => return Err(RestoreError::Unsupported("module value")),
        _ => return bad(),
    })
}

// ---- function libraries ------------------------------------------------

/// The RDB opcode of one function library (Redis 7.0's, with its code).
const OPCODE_FUNCTION2: u8 = 245;
/// The opcode of Redis 7.0's release candidates, whose form is not read.
const OPCODE_FUNCTION_PRE_GA: u8 = 246;

/// FUNCTION DUMP's payload of libraries whose codes these are (each as
/// FUNCTION LOAD took it, `#!` line included).
pub fn dump_functions<'a>(codes: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    for code in codes {
        out.push(OPCODE_FUNCTION2);
        put_string(&mut out, code);
    }
    out.extend_from_slice(&RDB_VERSION.to_le_bytes());
    let crc = crc64(0, &out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The library codes in a FUNCTION RESTORE payload, or Redis's error
/// text for it (after `ERR `).
pub fn restore_functions(payload: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    if let Err(RestoreError::VersionOrChecksum) = footer_checked(payload) {
        return Err("DUMP payload version or checksum are wrong".into());
    }
    let body = &payload[..payload.len() - 10];
    let mut r = Reader { bytes: body, at: 0 };
    let mut codes = Vec::new();
    while r.at < body.len() {
        match r.byte().map_err(|_| "can not read data type".to_string())? {
            OPCODE_FUNCTION2 => codes.push(
                r.string()
                    .map_err(|_| "failed loading the given functions payload".to_string())?,
            ),
            OPCODE_FUNCTION_PRE_GA => return Err("Pre-GA function format not supported".into()),
            _ => return Err("given type is not a function".into()),
        }
    }
    Ok(codes)
}

/// Checks a payload's footer: long enough, a version this reads, the
/// CRC-64 of the rest.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: 8 bytes"
)]
fn footer_checked(payload: &[u8]) -> Result<(), RestoreError> {
    if payload.len() < 10 {
        return Err(RestoreError::VersionOrChecksum);
    }
    let footer = &payload[payload.len() - 10..];
    let version = u16::from_le_bytes([footer[0], footer[1]]);
    let crc = u64::from_le_bytes(footer[2..].try_into().expect("8 bytes"));
    if version > RDB_VERSION || crc64(0, &payload[..payload.len() - 8]) != crc {
        return Err(RestoreError::VersionOrChecksum);
    }
    Ok(())
}

// ---- the keyspace ----------------------------------------------------

/// What DUMP serializes of the live value at `key`; None for no key.
/// The caller reads under the run's snapshot (or holds the key's lock).
pub fn read(ctx: &Ctx<'_>, key: &[u8]) -> Result<Option<Dumped>, Failure> {
    let Some(entry) = ctx.get(key)? else {
        return Ok(None);
    };
    let members = |id: u64| ctx.all_members(id);
    Ok(Some(match entry.value {
        Value::String(s) => Dumped::String(s),
        Value::Hash { c, order } => {
            Dumped::Hash(crate::hash::in_order(members(c.id)?, order.as_ref()))
        }
        Value::Set(c) => Dumped::Set(members(c.id)?.into_iter().map(|(m, _)| m).collect()),
        // Sub-keys are indexes, big-endian: their order is the list's.
        Value::List { c, .. } => Dumped::List(members(c.id)?.into_iter().map(|(_, v)| v).collect()),
        Value::ZSet(c) => {
            let mut scored =
                Vec::with_capacity(usize::try_from(c.len).unwrap_or(0).min(MOST_PREALLOCATED));
            // The by-score entries, in Redis's order: `[1][score key][member]`.
            for (sub, score) in members(c.id)? {
                if sub.first() == Some(&1) && sub.len() >= 9 {
                    scored.push((sub[9..].to_vec(), crate::zset::score_of(&score)?));
                }
            }
            Dumped::ZSet(scored)
        }
        Value::Stream { c, meta } => Dumped::Stream(Box::new(read_stream(ctx, c, meta)?)),
    }))
}

/// Stream `c` with its groups, as DUMP serializes it.
fn read_stream(ctx: &Ctx<'_>, c: Collection, meta: StreamMeta) -> Result<DumpedStream, Failure> {
    let (first, last) = (
        StreamId::default(),
        StreamId {
            ms: u64::MAX,
            seq: u64::MAX,
        },
    );
    let entries = crate::stream::range(ctx, c, first, last, 0, false)?;
    let mut groups = Vec::new();
    for (name, group) in crate::stream_group::groups(ctx, c)? {
        let pending = crate::stream_group::pending(ctx, c, &name, first, last, false)
            .collect::<Result<Vec<_>, Failure>>()?;
        let consumers = crate::stream_group::consumers(ctx, c, &name)?
            .into_iter()
            .map(|(consumer, info)| (consumer, info.seen_ms))
            .collect();
        groups.push(DumpedGroup {
            name,
            group,
            pending,
            consumers,
        });
    }
    Ok(DumpedStream {
        entries,
        meta,
        groups,
    })
}

/// Writes `value` at `key` with `expire_at_ms` (0: none) into `batch`, a
/// collection under a new object id. The key holds nothing in `batch`'s
/// database (the caller removed what it held).
pub fn write(
    ctx: &Ctx<'_>,
    batch: &mut DbBatch<'_>,
    key: &[u8],
    value: Dumped,
    expire_at_ms: u64,
) -> Result<(), StoreError> {
    let entry = |value: Value| Entry {
        value,
        expire_at_ms,
    };
    let collection = |id: u64, len: usize| Collection {
        id,
        len: len as u64,
    };
    match value {
        Dumped::String(s) => batch.put(key, &entry(Value::String(s))),
        Dumped::Hash(pairs) => {
            let id = ctx.db().new_id()?;
            let order = {
                let borrowed: Vec<(&[u8], &[u8])> =
                    pairs.iter().map(|(f, v)| (&f[..], &v[..])).collect();
                crate::hash::order_of(ctx, &borrowed)
            };
            let fields: BTreeMap<Vec<u8>, Vec<u8>> = pairs.into_iter().collect();
            for (field, v) in &fields {
                batch.put_member(key, id, field, v)?;
            }
            let c = collection(id, fields.len());
            batch.put_new(key, &entry(Value::Hash { c, order }))
        }
        Dumped::Set(members) => {
            let id = ctx.db().new_id()?;
            let members: BTreeSet<Vec<u8>> = members.into_iter().collect();
            for m in &members {
                batch.put_member(key, id, m, &[])?;
            }
            batch.put_new(key, &entry(Value::Set(collection(id, members.len()))))
        }
        Dumped::List(items) => {
            let id = ctx.db().new_id()?;
            let head = crate::list::FIRST_INDEX;
            for (i, item) in items.iter().enumerate() {
                let index = head + i as u64;
                batch.put_member(key, id, &index.to_be_bytes(), item)?;
            }
            let c = collection(id, items.len());
            batch.put_new(key, &entry(Value::List { c, head }))
        }
        Dumped::ZSet(members) => {
            let id = ctx.db().new_id()?;
            // The last score of a member given twice wins; -0 is kept as 0.
            let scores: BTreeMap<Vec<u8>, f64> = members
                .into_iter()
                .map(|(m, s)| (m, if s == 0.0 { 0.0 } else { s }))
                .collect();
            for (m, &score) in &scores {
                let bytes = score.to_le_bytes();
                batch.put_member(key, id, &crate::zset::member_sub(m), &bytes)?;
                let by_score = crate::zset::score_sub(crate::zset::score_key(score), m);
                batch.put_member(key, id, &by_score, &bytes)?;
            }
            batch.put_new(key, &entry(Value::ZSet(collection(id, scores.len()))))
        }
        Dumped::Stream(stream) => {
            let id = ctx.db().new_id()?;
            let c = collection(id, stream.entries.len());
            for (entry_id, flat) in &stream.entries {
                let refs: Vec<&[u8]> = flat.iter().map(|v| &v[..]).collect();
                let sub = crate::stream::entry_sub(*entry_id);
                batch.put_member(key, id, &sub, &crate::stream::encode_fields(&refs))?;
            }
            for g in &stream.groups {
                use crate::stream_group as sg;
                sg::put_group(batch, key, c, &g.name, &g.group)?;
                for (name, seen_ms) in &g.consumers {
                    let consumer = sg::Consumer { seen_ms: *seen_ms };
                    sg::put_consumer(batch, key, c, &g.name, name, consumer)?;
                }
                for (pending_id, nack) in &g.pending {
                    sg::put_nack(batch, key, c, &g.name, *pending_id, nack)?;
                }
            }
            let meta = stream.meta;
            batch.put_new(key, &entry(Value::Stream { c, meta }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdb::lzf_decompress;

    /// 250 entries (three nodes), fields changing from the master's, two
    /// groups, one with pending entries of two consumers and one unknown
    /// entries-read count.
    fn a_stream() -> DumpedStream {
        use crate::stream_group::{Group, Nack};
        let id = |ms, seq| StreamId { ms, seq };
        let entries: Vec<(StreamId, Vec<Vec<u8>>)> = (0..250u64)
            .map(|i| {
                let mut flat = vec![b"field".to_vec(), format!("v{i}").into_bytes()];
                if i % 7 == 0 {
                    flat.extend([b"extra".to_vec(), i.to_string().into_bytes()]);
                }
                (id(1000 + i / 3, i % 3), flat)
            })
            .collect();
        let nack = |consumer: &[u8], n| Nack {
            delivered_ms: 1_700_000_000_000 + n,
            deliveries: n,
            consumer: consumer.to_vec(),
        };
        DumpedStream {
            meta: StreamMeta {
                last: id(2000, 0),
                first: entries[0].0,
                max_deleted: id(1500, 1),
                added: 300,
            },
            groups: vec![
                DumpedGroup {
                    name: b"a-group".to_vec(),
                    group: Group {
                        last: id(1010, 1),
                        entries_read: Some(31),
                    },
                    pending: vec![
                        (id(1000, 0), nack(b"alice", 1)),
                        (id(1001, 2), nack(b"bob", 3)),
                    ],
                    consumers: vec![
                        (b"alice".to_vec(), 5),
                        (b"bob".to_vec(), 6),
                        (b"idle".to_vec(), 7),
                    ],
                },
                DumpedGroup {
                    name: b"b-group".to_vec(),
                    group: Group {
                        last: id(0, 0),
                        entries_read: None,
                    },
                    pending: Vec::new(),
                    consumers: Vec::new(),
                },
            ],
            entries,
        }
    }

    #[test]
    fn crc64_is_redis_s() {
        // Redis's crc64 test vector (src/crc64.c).
        assert_eq!(crc64(0, b"123456789"), 0xe9c6_d914_c4b8_d9ca);
    }

    #[test]
    fn every_kind_comes_back_as_dumped() {
        let values = [
            Dumped::String(b"hello".to_vec()),
            Dumped::String(b"12345".to_vec()),
            Dumped::String(b"-7".to_vec()),
            Dumped::String(b"0123".to_vec()),
            Dumped::String(vec![0u8; 20_000]),
            Dumped::List(vec![b"a".to_vec(), b"100000".to_vec()]),
            Dumped::Set(vec![b"x".to_vec()]),
            Dumped::ZSet(vec![(b"m".to_vec(), -1.5), (b"n".to_vec(), f64::INFINITY)]),
            Dumped::Hash(vec![(b"f".to_vec(), b"v".to_vec())]),
            Dumped::Stream(Box::new(a_stream())),
            Dumped::Stream(Box::default()),
        ];
        for v in values {
            assert_eq!(restore(&dump(&v)).unwrap(), v);
        }
    }

    #[test]
    fn a_changed_byte_or_a_newer_version_is_refused() {
        let mut p = dump(&Dumped::String(b"hello".to_vec()));
        p[2] ^= 1;
        assert_eq!(restore(&p), Err(RestoreError::VersionOrChecksum));
        assert_eq!(restore(b"short"), Err(RestoreError::VersionOrChecksum));
        let mut newer = dump(&Dumped::String(b"x".to_vec()));
        let at = newer.len() - 10;
        newer[at] = 11;
        assert_eq!(restore(&newer), Err(RestoreError::VersionOrChecksum));
    }

    #[test]
    fn lzf_back_references_copy_what_came_before() {
        // "abcabcabc": three literals, then a reference 3 back of 6 bytes.
        let input = [2, b'a', b'b', b'c', (4 << 5), 2];
        assert_eq!(lzf_decompress(&input, 9).unwrap(), b"abcabcabc");
        assert!(lzf_decompress(&input, 8).is_err());
    }
}
