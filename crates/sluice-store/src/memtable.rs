//! The memtable: every version of every key written since the last flush,
//! ordered by (keyspace, key, sequence descending), plus range tombstones.
//! Reads at a snapshot sequence see the newest version at or below it.

use crate::batch::{OpKind, WriteBatch};
use crate::sst::{Entry, EntryKind, RangeTombstone as SstRangeTombstone};
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashSet};

type InternalKey = (u32, Vec<u8>, Reverse<u64>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Version {
    Value(Vec<u8>),
    Tombstone,
}

#[derive(Debug, Clone)]
struct RangeTombstone {
    keyspace: u32,
    start: Vec<u8>,
    end: Vec<u8>,
    seq: u64,
}

/// Receives one version: key, sequence, kind, value.
pub type VersionVisitor<'a> = dyn FnMut(&[u8], u64, EntryKind, &[u8]) + 'a;

/// A 64-bit hash of (keyspace, key), eight bytes at a time.
fn point_hash(keyspace: u32, key: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mix = |h: u64, v: u64| {
        let h = (h ^ v).wrapping_mul(K);
        h ^ (h >> 32)
    };
    let mut h = mix(keyspace as u64, key.len() as u64);
    let mut chunks = key.chunks_exact(8);
    for c in &mut chunks {
        h = mix(h, u64::from_le_bytes(c.try_into().expect("8 bytes")));
    }
    let mut tail = [0u8; 8];
    tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    mix(h, u64::from_le_bytes(tail))
}

/// A hasher that passes an already mixed u64 through.
#[derive(Default, Clone, Copy)]
struct PassThrough(u64);

impl std::hash::Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Recent writes of every keyspace, ordered, in memory until flushed.
#[derive(Debug, Default)]
pub struct Memtable {
    entries: BTreeMap<InternalKey, Version>,
    /// [`point_hash`] of every key with a point version here: a point
    /// read of a key not in it skips the ordered map's search (most point
    /// reads, once the data outgrows the memtable).
    present: HashSet<u64, std::hash::BuildHasherDefault<PassThrough>>,
    ranges: Vec<RangeTombstone>,
    approximate_bytes: usize,
}

impl Memtable {
    /// Adds a batch whose first operation has sequence `first_seq`.
    pub fn apply(&mut self, first_seq: u64, batch: &WriteBatch) {
        for (i, op) in batch.ops.iter().enumerate() {
            let seq = first_seq + i as u64;
            self.approximate_bytes += op.key.len() + op.value.len() + 32;
            if op.kind != OpKind::RangeDelete {
                self.present.insert(point_hash(op.keyspace, &op.key));
            }
            match op.kind {
                OpKind::Put => {
                    self.entries.insert(
                        (op.keyspace, op.key.clone(), Reverse(seq)),
                        Version::Value(op.value.clone()),
                    );
                }
                OpKind::Delete => {
                    self.entries.insert(
                        (op.keyspace, op.key.clone(), Reverse(seq)),
                        Version::Tombstone,
                    );
                }
                OpKind::RangeDelete => self.ranges.push(RangeTombstone {
                    keyspace: op.keyspace,
                    start: op.key.clone(),
                    end: op.value.clone(),
                    seq,
                }),
            }
        }
    }

    /// Bytes its keys and values take, roughly.
    pub fn approximate_bytes(&self) -> usize {
        self.approximate_bytes
    }

    /// Newest range tombstone over `key` at or below `snapshot` (0: none).
    pub fn range_deleted_at(&self, keyspace: u32, key: &[u8], snapshot: u64) -> u64 {
        self.ranges
            .iter()
            .filter(|r| {
                r.keyspace == keyspace
                    && r.seq <= snapshot
                    && r.start.as_slice() <= key
                    && key < r.end.as_slice()
            })
            .map(|r| r.seq)
            .max()
            .unwrap_or(0)
    }

    /// The newest point version of `key` at or below `snapshot`, range
    /// tombstones not applied: (sequence, value or None for a delete).
    pub fn newest_version(
        &self,
        keyspace: u32,
        key: &[u8],
        snapshot: u64,
    ) -> Option<(u64, Option<&[u8]>)> {
        if !self.present.contains(&point_hash(keyspace, key)) {
            return None;
        }
        let from = (keyspace, key.to_vec(), Reverse(snapshot));
        self.entries
            .range(from..)
            .next()
            .filter(|((ks, k, _), _)| *ks == keyspace && k.as_slice() == key)
            .map(|((_, _, Reverse(seq)), v)| {
                (
                    *seq,
                    match v {
                        Version::Value(v) => Some(v.as_slice()),
                        Version::Tombstone => None,
                    },
                )
            })
    }

    /// Every version of every key of `keyspace` from `start` on, in internal order.
    pub fn iter_from<'a>(
        &'a self,
        keyspace: u32,
        start: &[u8],
    ) -> impl Iterator<Item = Entry> + 'a {
        let lower = (keyspace, start.to_vec(), Reverse(u64::MAX));
        self.entries
            .range(lower..)
            .take_while(move |((ks, _, _), _)| *ks == keyspace)
            .map(|((_, k, Reverse(seq)), v)| Entry {
                key: k.clone(),
                seq: *seq,
                kind: if matches!(v, Version::Value(_)) {
                    EntryKind::Put
                } else {
                    EntryKind::Delete
                },
                value: match v {
                    Version::Value(v) => v.clone(),
                    Version::Tombstone => Vec::new(),
                },
            })
    }

    /// Hands `visit` up to `max` versions of `keyspace` with keys in
    /// `[start, end)` (end None: unbounded), in internal order or, with
    /// `reverse`, its reverse; strictly after `after` (the last version
    /// taken before) when given. Returns how many it visited.
    #[allow(clippy::too_many_arguments)]
    pub fn chunk(
        &self,
        keyspace: u32,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        after: Option<(&[u8], u64)>,
        max: usize,
        visit: &mut VersionVisitor<'_>,
    ) -> usize {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let lowest = (keyspace, start.to_vec(), Reverse(u64::MAX));
        let resume = after.map(|(k, s)| (keyspace, k.to_vec(), Reverse(s)));
        let mut n = 0;
        let mut give = |((_, k, Reverse(seq)), v): (&InternalKey, &Version)| {
            n += 1;
            match v {
                Version::Value(v) => visit(k, *seq, EntryKind::Put, v),
                Version::Tombstone => visit(k, *seq, EntryKind::Delete, &[]),
            }
        };
        if reverse {
            let upper = match (resume, end) {
                (Some(r), _) => Excluded(r),
                (None, Some(end)) => Excluded((keyspace, end.to_vec(), Reverse(u64::MAX))),
                (None, None) => match keyspace.checked_add(1) {
                    Some(next) => Excluded((next, Vec::new(), Reverse(u64::MAX))),
                    None => Unbounded,
                },
            };
            if matches!(&upper, Excluded(u) if *u <= lowest) {
                return 0;
            }
            self.entries
                .range((Included(lowest), upper))
                .rev()
                .take(max)
                .for_each(&mut give);
        } else {
            let lower = match resume {
                Some(r) => Excluded(r),
                None => Included(lowest),
            };
            self.entries
                .range((lower, Unbounded))
                .take_while(|((ks, k, _), _)| {
                    *ks == keyspace && end.is_none_or(|end| k.as_slice() < end)
                })
                .take(max)
                .for_each(&mut give);
        }
        n
    }

    /// Every version of every key of `keyspace` in `[start, end)` (end None:
    /// unbounded), in internal order.
    pub fn versions(&self, keyspace: u32, start: &[u8], end: Option<&[u8]>) -> Vec<Entry> {
        self.iter_from(keyspace, start)
            .take_while(|e| end.is_none_or(|end| e.key.as_slice() < end))
            .collect()
    }

    /// The keyspace's range tombstones.
    pub fn range_tombstones(&self, keyspace: u32) -> Vec<SstRangeTombstone> {
        self.ranges
            .iter()
            .filter(|r| r.keyspace == keyspace)
            .map(|r| SstRangeTombstone {
                start: r.start.clone(),
                end: r.end.clone(),
                seq: r.seq,
            })
            .collect()
    }

    /// Keyspaces with anything in this memtable.
    pub fn keyspaces(&self) -> Vec<u32> {
        let mut ks: Vec<u32> = self.entries.keys().map(|(k, _, _)| *k).collect();
        ks.extend(self.ranges.iter().map(|r| r.keyspace));
        ks.sort_unstable();
        ks.dedup();
        ks
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.ranges.is_empty()
    }

    /// Versions it holds.
    pub fn entry_count(&self) -> usize {
        self.entries.len() + self.ranges.len()
    }
}
