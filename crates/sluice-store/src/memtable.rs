//! The memtable: every version of every key written since the last flush,
//! ordered by (keyspace, key, sequence descending), plus range tombstones.
//! Reads at a snapshot sequence see the newest version at or below it.

use crate::batch::{OpKind, WriteBatch};
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::ops::Bound;

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

#[derive(Debug, Default)]
pub struct Memtable {
    entries: BTreeMap<InternalKey, Version>,
    ranges: Vec<RangeTombstone>,
    approximate_bytes: usize,
}

impl Memtable {
    /// Adds a batch whose first operation has sequence `first_seq`.
    pub fn apply(&mut self, first_seq: u64, batch: &WriteBatch) {
        for (i, op) in batch.ops.iter().enumerate() {
            let seq = first_seq + i as u64;
            self.approximate_bytes += op.key.len() + op.value.len() + 32;
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

    pub fn approximate_bytes(&self) -> usize {
        self.approximate_bytes
    }

    /// Newest range tombstone over `key` at or below `snapshot`.
    fn range_deleted_at(&self, keyspace: u32, key: &[u8], snapshot: u64) -> u64 {
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

    /// The value of `key` at `snapshot`: Some(Some(v)) found, Some(None)
    /// deleted, None not in the memtable.
    pub fn get(&self, keyspace: u32, key: &[u8], snapshot: u64) -> Option<Option<Vec<u8>>> {
        let from = (keyspace, key.to_vec(), Reverse(snapshot));
        let newest = self
            .entries
            .range(from..)
            .next()
            .filter(|((ks, k, _), _)| *ks == keyspace && k.as_slice() == key);
        let deleted_at = self.range_deleted_at(keyspace, key, snapshot);
        match newest {
            Some(((_, _, Reverse(seq)), v)) if *seq > deleted_at => Some(match v {
                Version::Value(v) => Some(v.clone()),
                Version::Tombstone => None,
            }),
            _ if deleted_at > 0 => Some(None),
            _ => None,
        }
    }

    /// Live (key, value) pairs of `keyspace` in `[start, end)` at `snapshot`,
    /// in key order.
    pub fn scan(
        &self,
        keyspace: u32,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        snapshot: u64,
    ) -> Vec<(Vec<u8>, Vec<u8>)> {
        let lower = match start {
            Bound::Included(k) => Bound::Included((keyspace, k.to_vec(), Reverse(u64::MAX))),
            Bound::Excluded(k) => Bound::Excluded((keyspace, k.to_vec(), Reverse(0))),
            Bound::Unbounded => Bound::Included((keyspace, Vec::new(), Reverse(u64::MAX))),
        };
        let in_end = |k: &[u8]| match end {
            Bound::Included(e) => k <= e,
            Bound::Excluded(e) => k < e,
            Bound::Unbounded => true,
        };
        let mut out = Vec::new();
        let mut last_key: Option<&[u8]> = None;
        for ((ks, k, Reverse(seq)), v) in self.entries.range((lower, Bound::Unbounded)) {
            if *ks != keyspace || !in_end(k) {
                break;
            }
            if *seq > snapshot || last_key == Some(k.as_slice()) {
                continue;
            }
            last_key = Some(k.as_slice());
            if *seq <= self.range_deleted_at(keyspace, k, snapshot) {
                continue;
            }
            if let Version::Value(v) = v {
                out.push((k.clone(), v.clone()));
            }
        }
        out
    }

    pub fn entry_count(&self) -> usize {
        self.entries.len() + self.ranges.len()
    }
}
