//! Streams in DUMP and RESTORE payloads: Redis 7.0's RDB stream types
//! (15, and 19 with the ids and counters Redis 7.0 added), so a stream
//! dumped by Redis restores here with its consumer groups, and one dumped
//! here restores in Redis.
//!
//! The payload: the number of nodes, then per node its master id (16
//! bytes: ms and seq, big-endian) and a listpack of its entries; the
//! entry count; the last id; (19 only) the first id, the greatest deleted
//! id and the entries ever added; then the groups, each with its name,
//! last delivered id, (19 only) entries read, its pending entries (16-byte
//! id, delivery time as 8 bytes LE, delivery count) and its consumers
//! (name, seen time as 8 bytes LE, and the ids of the pending entries it
//! holds).
//!
//! A node's listpack (Redis's t_stream.c): a master entry — count of live
//! entries, count of deleted ones, the number of master fields, those
//! fields, 0 — then per entry its flags (1 deleted, 2 the same fields as
//! the master), its id as differences from the master id, the number of
//! fields and each field and value (or, with flag 2, the values only),
//! and how many listpack elements the entry took (read backwards).
//! Sluice writes nodes of [`crate::stream::NODE_ENTRIES`] entries, each
//! master the node's first entry, with no deleted entries.

use crate::rdb::{
    backlen_bytes, bad, canonical_integer, listpack, put_len, put_string, Read, Reader,
    RestoreError,
};
use crate::record::{StreamId, StreamMeta};
use crate::stream_group::{Group, Nack};
use std::collections::{BTreeMap, BTreeSet};

/// Entry flag: deleted (skipped when read).
const FLAG_DELETED: i64 = 1;
/// Entry flag: the master entry's fields, values only.
const FLAG_SAME_FIELDS: i64 = 2;

/// Most entries, groups or pending entries a payload may claim before
/// they are read (a payload cannot make the server allocate without end).
const MOST_PREALLOCATED: usize = 1 << 16;

/// A stream as a payload carries it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DumpedStream {
    /// Its entries in id order, each with its fields and values, flat.
    pub entries: Vec<(StreamId, Vec<Vec<u8>>)>,
    /// Its ids and counter.
    pub meta: StreamMeta,
    /// Its consumer groups, by name.
    pub groups: Vec<DumpedGroup>,
}

/// A consumer group as a payload carries it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DumpedGroup {
    /// The group's name.
    pub name: Vec<u8>,
    /// Last delivered id and entries read.
    pub group: Group,
    /// Its pending entries in id order (each naming its consumer).
    pub pending: Vec<(StreamId, Nack)>,
    /// Its consumers by name, each with its seen time (Unix ms).
    pub consumers: Vec<(Vec<u8>, u64)>,
}

// ---- writing ----------------------------------------------------------

/// A listpack being written (Redis's listpack.c): a 6-byte header (total
/// bytes u32 LE, element count u16 LE), the elements, each followed by
/// its length backwards, and 0xFF.
struct Listpack {
    bytes: Vec<u8>,
    count: usize,
}

impl Listpack {
    fn new() -> Listpack {
        Listpack {
            bytes: vec![0; 6],
            count: 0,
        }
    }

    /// An integer in the smallest of listpack's integer encodings.
    fn int(&mut self, v: i64) {
        let start = self.bytes.len();
        if (0..=127).contains(&v) {
            self.bytes.push(v as u8);
        } else if (-4096..=4095).contains(&v) {
            let u = (v as u64) & 0x1fff;
            self.bytes.push(0xc0 | (u >> 8) as u8);
            self.bytes.push(u as u8);
        } else if let Ok(v) = i16::try_from(v) {
            self.bytes.push(0xf1);
            self.bytes.extend_from_slice(&v.to_le_bytes());
        } else if (-(1 << 23)..(1 << 23)).contains(&v) {
            self.bytes.push(0xf2);
            self.bytes.extend_from_slice(&(v as i32).to_le_bytes()[..3]);
        } else if let Ok(v) = i32::try_from(v) {
            self.bytes.push(0xf3);
            self.bytes.extend_from_slice(&v.to_le_bytes());
        } else {
            self.bytes.push(0xf4);
            self.bytes.extend_from_slice(&v.to_le_bytes());
        }
        self.close(start);
    }

    /// A string; one that is exactly an integer's decimal form goes in as
    /// that integer, as Redis's listpack stores it.
    fn string(&mut self, s: &[u8]) {
        if let Some(v) = canonical_integer(s) {
            return self.int(v);
        }
        let start = self.bytes.len();
        let n = s.len();
        if n < 64 {
            self.bytes.push(0x80 | n as u8);
        } else if n < 4096 {
            self.bytes.push(0xe0 | (n >> 8) as u8);
            self.bytes.push(n as u8);
        } else {
            self.bytes.push(0xf0);
            self.bytes.extend_from_slice(&(n as u32).to_le_bytes());
        }
        self.bytes.extend_from_slice(s);
        self.close(start);
    }

    /// Ends the element that began at `start` with its length backwards:
    /// 7 bits a byte, most significant first, all but the first byte with
    /// the top bit set.
    fn close(&mut self, start: usize) {
        let l = (self.bytes.len() - start) as u64;
        let groups = backlen_bytes(l);
        for i in (0..groups).rev() {
            let bits = ((l >> (7 * i)) & 127) as u8;
            self.bytes
                .push(if i == groups - 1 { bits } else { bits | 128 });
        }
        self.count += 1;
    }

    fn finish(mut self) -> Vec<u8> {
        self.bytes.push(0xff);
        let total = self.bytes.len() as u32;
        self.bytes[..4].copy_from_slice(&total.to_le_bytes());
        let count = u16::try_from(self.count).unwrap_or(u16::MAX);
        self.bytes[4..6].copy_from_slice(&count.to_le_bytes());
        self.bytes
    }
}

fn id_bytes(id: StreamId) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&id.ms.to_be_bytes());
    k[8..].copy_from_slice(&id.seq.to_be_bytes());
    k
}

/// One node's listpack: `entries` (at least one), the first the master.
fn node(entries: &[(StreamId, Vec<Vec<u8>>)]) -> Vec<u8> {
    let (master, master_flat) = &entries[0];
    let master_fields: Vec<&[u8]> = master_flat.iter().step_by(2).map(|f| &f[..]).collect();
    let mut lp = Listpack::new();
    lp.int(entries.len() as i64);
    lp.int(0);
    lp.int(master_fields.len() as i64);
    for f in &master_fields {
        lp.string(f);
    }
    lp.int(0);
    for (id, flat) in entries {
        let fields = flat.len() / 2;
        let same = fields == master_fields.len()
            && flat
                .iter()
                .step_by(2)
                .zip(&master_fields)
                .all(|(a, b)| a == b);
        lp.int(if same { FLAG_SAME_FIELDS } else { 0 });
        lp.int(id.ms.wrapping_sub(master.ms) as i64);
        lp.int(id.seq.wrapping_sub(master.seq) as i64);
        if same {
            for v in flat.iter().skip(1).step_by(2) {
                lp.string(v);
            }
        } else {
            lp.int(fields as i64);
            for item in flat {
                lp.string(item);
            }
        }
        let elements = if same { fields + 3 } else { 2 * fields + 4 };
        lp.int(elements as i64);
    }
    lp.finish()
}

/// Appends `s` as RDB type 19's body (after the type byte).
pub(crate) fn write(out: &mut Vec<u8>, s: &DumpedStream) {
    let per_node = crate::stream::NODE_ENTRIES as usize;
    put_len(out, s.entries.len().div_ceil(per_node) as u64);
    for chunk in s.entries.chunks(per_node) {
        put_string(out, &id_bytes(chunk[0].0));
        put_string(out, &node(chunk));
    }
    let m = &s.meta;
    for n in [
        s.entries.len() as u64,
        m.last.ms,
        m.last.seq,
        m.first.ms,
        m.first.seq,
        m.max_deleted.ms,
        m.max_deleted.seq,
        m.added,
    ] {
        put_len(out, n);
    }
    put_len(out, s.groups.len() as u64);
    for g in &s.groups {
        put_string(out, &g.name);
        put_len(out, g.group.last.ms);
        put_len(out, g.group.last.seq);
        put_len(out, g.group.entries_read.unwrap_or(u64::MAX));
        put_len(out, g.pending.len() as u64);
        for (id, nack) in &g.pending {
            out.extend_from_slice(&id_bytes(*id));
            out.extend_from_slice(&nack.delivered_ms.to_le_bytes());
            put_len(out, nack.deliveries);
        }
        put_len(out, g.consumers.len() as u64);
        for (name, seen_ms) in &g.consumers {
            put_string(out, name);
            out.extend_from_slice(&seen_ms.to_le_bytes());
            let held: Vec<StreamId> = g
                .pending
                .iter()
                .filter(|(_, n)| &n.consumer == name)
                .map(|(id, _)| *id)
                .collect();
            put_len(out, held.len() as u64);
            for id in held {
                out.extend_from_slice(&id_bytes(id));
            }
        }
    }
}

// ---- reading ----------------------------------------------------------

fn integer(element: &[u8]) -> Read<i64> {
    std::str::from_utf8(element)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(RestoreError::BadFormat)
}

#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: 8 bytes"
)]
fn raw_id(r: &mut Reader<'_>) -> Read<StreamId> {
    let b = r.take(16)?;
    Ok(StreamId {
        ms: u64::from_be_bytes(b[..8].try_into().expect("8 bytes")),
        seq: u64::from_be_bytes(b[8..].try_into().expect("8 bytes")),
    })
}

#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: 8 bytes"
)]
fn millis(r: &mut Reader<'_>) -> Read<u64> {
    Ok(u64::from_le_bytes(r.take(8)?.try_into().expect("8 bytes")))
}

/// The live entries of one node (master id `master`, listpack `lp`),
/// appended to `out`.
fn read_node(master: StreamId, lp: &[u8], out: &mut Vec<(StreamId, Vec<Vec<u8>>)>) -> Read<()> {
    let elements = listpack(lp)?;
    // Every count read below is checked against the elements there are
    // before any arithmetic with it.
    let most = elements.len() as i64;
    let mut it = elements.into_iter();
    let mut next = || it.next().ok_or(RestoreError::BadFormat);
    let count = integer(&next()?)?;
    let deleted = integer(&next()?)?;
    let master_count = integer(&next()?)?;
    let counts = 0..=most;
    if !counts.contains(&count)
        || !counts.contains(&deleted)
        || !counts.contains(&master_count)
        || count + deleted == 0
        || count + deleted > most
    {
        return bad();
    }
    let mut master_fields = Vec::new();
    for _ in 0..master_count {
        master_fields.push(next()?);
    }
    if integer(&next()?)? != 0 {
        return bad();
    }
    let mut live = 0;
    for _ in 0..count + deleted {
        let flags = integer(&next()?)?;
        let id = StreamId {
            ms: master.ms.wrapping_add(integer(&next()?)? as u64),
            seq: master.seq.wrapping_add(integer(&next()?)? as u64),
        };
        let mut flat = Vec::new();
        let elements = if flags & FLAG_SAME_FIELDS != 0 {
            for f in &master_fields {
                flat.push(f.clone());
                flat.push(next()?);
            }
            master_fields.len() as i64 + 3
        } else {
            let fields = integer(&next()?)?;
            if !(0..=most).contains(&fields) {
                return bad();
            }
            for _ in 0..fields * 2 {
                flat.push(next()?);
            }
            2 * fields + 4
        };
        if integer(&next()?)? != elements {
            return bad();
        }
        if flags & FLAG_DELETED == 0 {
            if out.last().is_some_and(|(last, _)| *last >= id) {
                return bad();
            }
            out.push((id, flat));
            live += 1;
        }
    }
    if live != count || next().is_ok() {
        return bad();
    }
    Ok(())
}

/// Reads RDB type `kind`'s stream body (15, or 19 with Redis 7.0's ids).
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: 8 bytes"
)]
pub(crate) fn read(r: &mut Reader<'_>, with_ids: bool) -> Read<DumpedStream> {
    let nodes = r.len()?;
    let mut entries = Vec::new();
    let mut masters = BTreeSet::new();
    for _ in 0..nodes {
        let key = r.string()?;
        let key: [u8; 16] = key.try_into().or_else(|_| bad())?;
        if !masters.insert(key) {
            return bad();
        }
        let master = StreamId {
            ms: u64::from_be_bytes(key[..8].try_into().expect("8 bytes")),
            seq: u64::from_be_bytes(key[8..].try_into().expect("8 bytes")),
        };
        read_node(master, &r.string()?, &mut entries)?;
    }
    let length = r.len64()?;
    let last = StreamId {
        ms: r.len64()?,
        seq: r.len64()?,
    };
    let meta = if with_ids {
        StreamMeta {
            last,
            first: StreamId {
                ms: r.len64()?,
                seq: r.len64()?,
            },
            max_deleted: StreamId {
                ms: r.len64()?,
                seq: r.len64()?,
            },
            added: r.len64()?,
        }
    } else {
        // As Redis 7.0 loads the older type.
        StreamMeta {
            last,
            first: entries.first().map(|(id, _)| *id).unwrap_or_default(),
            max_deleted: StreamId::default(),
            added: length,
        }
    };
    if length != entries.len() as u64 || entries.last().is_some_and(|(id, _)| *id > meta.last) {
        return bad();
    }
    let groups = read_groups(r, with_ids, &meta, length)?;
    Ok(DumpedStream {
        entries,
        meta,
        groups,
    })
}

fn read_groups(
    r: &mut Reader<'_>,
    with_ids: bool,
    meta: &StreamMeta,
    length: u64,
) -> Read<Vec<DumpedGroup>> {
    let count = r.len()?;
    let mut groups: Vec<DumpedGroup> = Vec::with_capacity(count.min(MOST_PREALLOCATED));
    let mut names = BTreeSet::new();
    for _ in 0..count {
        let name = r.string()?;
        if !names.insert(name.clone()) {
            return bad();
        }
        let last = StreamId {
            ms: r.len64()?,
            seq: r.len64()?,
        };
        let entries_read = if with_ids {
            Some(r.len64()?).filter(|&n| n != u64::MAX)
        } else {
            crate::stream_group::entries_before(meta, length, last)
        };
        // Pending entries, their consumers named as the consumers follow.
        let mut pending: BTreeMap<StreamId, (u64, u64, Option<Vec<u8>>)> = BTreeMap::new();
        for _ in 0..r.len()? {
            let id = raw_id(r)?;
            let delivered_ms = millis(r)?;
            let deliveries = r.len64()?;
            if pending
                .insert(id, (delivered_ms, deliveries, None))
                .is_some()
            {
                return bad();
            }
        }
        let mut consumers = Vec::new();
        let mut consumer_names = BTreeSet::new();
        for _ in 0..r.len()? {
            let consumer = r.string()?;
            if !consumer_names.insert(consumer.clone()) {
                return bad();
            }
            let seen_ms = millis(r)?;
            for _ in 0..r.len()? {
                let id = raw_id(r)?;
                match pending.get_mut(&id) {
                    Some((_, _, owner @ None)) => *owner = Some(consumer.clone()),
                    _ => return bad(),
                }
            }
            consumers.push((consumer, seen_ms));
        }
        let mut nacks = Vec::with_capacity(pending.len());
        for (id, (delivered_ms, deliveries, owner)) in pending {
            // A pending entry no consumer holds: Redis's deep check
            // refuses it too.
            let Some(consumer) = owner else {
                return bad();
            };
            nacks.push((
                id,
                Nack {
                    delivered_ms,
                    deliveries,
                    consumer,
                },
            ));
        }
        consumers.sort();
        groups.push(DumpedGroup {
            name,
            group: Group { last, entries_read },
            pending: nacks,
            consumers,
        });
    }
    groups.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listpack_integers_and_strings_read_back() {
        let mut lp = Listpack::new();
        let ints = [
            0i64,
            127,
            128,
            -1,
            4095,
            -4096,
            4096,
            32767,
            -32768,
            40_000,
            -(1 << 23),
            (1 << 23) - 1,
            1 << 23,
            i32::MIN as i64,
            i64::MAX,
            i64::MIN,
        ];
        for v in ints {
            lp.int(v);
        }
        let strings: [&[u8]; 4] = [b"", b"abc", &[b'x'; 200], &[b'y'; 5000]];
        for s in strings {
            lp.string(s);
        }
        lp.string(&vec![b'z'; 20_000]);
        let read = listpack(&lp.finish()).unwrap();
        let mut want: Vec<Vec<u8>> = ints.iter().map(|v| v.to_string().into_bytes()).collect();
        want.extend(strings.iter().map(|s| s.to_vec()));
        want.push(vec![b'z'; 20_000]);
        assert_eq!(read, want);
    }

    #[test]
    fn counts_past_what_a_node_holds_are_refused_not_trusted() {
        let id = StreamId { ms: 1, seq: 1 };
        // Live and deleted counts that would overflow, a field count
        // past the elements there are, an entry's lp-count that lies.
        let nodes: [&[i64]; 4] = [
            &[i64::MAX, 1, 0, 0],
            &[1, 0, 0, 0, 0, 0, 0, i64::MAX, 3],
            &[1, 0, 0, 0, 0, 0, 0, 1, 9],
            &[-1, 0, 0, 0],
        ];
        for ints in nodes {
            let mut lp = Listpack::new();
            for &v in ints {
                lp.int(v);
            }
            let mut out = Vec::new();
            assert!(read_node(id, &lp.finish(), &mut out).is_err(), "{ints:?}");
            assert!(out.is_empty());
        }
    }

    #[test]
    fn a_node_with_changing_fields_and_ids_reads_back() {
        let id = |ms, seq| StreamId { ms, seq };
        let entries = vec![
            (id(5, 3), vec![b"a".to_vec(), b"1".to_vec()]),
            (id(5, 9), vec![b"a".to_vec(), b"x".repeat(300)]),
            (
                id(7, 0),
                vec![b"b".to_vec(), b"2".to_vec(), b"c".to_vec(), b"".to_vec()],
            ),
            (id(u64::MAX, u64::MAX), vec![b"a".to_vec(), b"-12".to_vec()]),
        ];
        let mut out = Vec::new();
        read_node(entries[0].0, &node(&entries), &mut out).unwrap();
        assert_eq!(out, entries);
    }
}
