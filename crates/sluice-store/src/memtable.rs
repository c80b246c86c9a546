//! The memtable: every version of every key written since the last flush,
//! ordered by (keyspace, key, sequence descending), plus range tombstones.
//! Reads at a snapshot sequence see the newest version at or below it.

use crate::batch::{OpKind, WriteBatch};
use crate::sst::{Entry, EntryKind, RangeTombstone as SstRangeTombstone};
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Keys and values are shared between the ordered map and the index of
/// newest versions, not copied.
type InternalKey = (u32, Arc<[u8]>, Reverse<u64>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Version {
    Value(Arc<[u8]>),
    Tombstone,
}

impl Version {
    /// The value, None for a tombstone.
    fn value(&self) -> Option<&Arc<[u8]>> {
        match self {
            Version::Value(v) => Some(v),
            Version::Tombstone => None,
        }
    }
}

/// The newest version of one key: a point read at a snapshot it is not
/// newer than (nearly all of them) takes it by hash, without the ordered
/// map's search.
#[derive(Debug)]
struct Newest {
    keyspace: u32,
    key: Arc<[u8]>,
    seq: u64,
    version: Version,
}

/// What a key's [`Newest`] adds to a memtable's size, roughly.
const NEWEST_BYTES: usize = 56;

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

/// Recent writes of every keyspace, ordered, in memory until flushed.
#[derive(Debug, Default)]
pub struct Memtable {
    entries: BTreeMap<InternalKey, Version>,
    /// Every key with a point version here, by [`point_hash`], with its
    /// newest version: a point read of a key not in it skips the ordered
    /// map (most point reads, once the data outgrows the memtable), and of
    /// a key in it usually needs nothing else.
    newest: hashbrown::HashTable<Newest>,
    ranges: Vec<RangeTombstone>,
    approximate_bytes: usize,
}

impl Memtable {
    /// Adds a batch whose first operation has sequence `first_seq`.
    pub fn apply(&mut self, first_seq: u64, batch: &WriteBatch) {
        for (i, op) in batch.ops.iter().enumerate() {
            let seq = first_seq + i as u64;
            self.approximate_bytes += op.key.len() + op.value.len() + 32;
            let version = match op.kind {
                OpKind::Put => Version::Value(Arc::from(&op.value[..])),
                OpKind::Delete => Version::Tombstone,
                OpKind::RangeDelete => {
                    self.ranges.push(RangeTombstone {
                        keyspace: op.keyspace,
                        start: op.key.clone(),
                        end: op.value.clone(),
                        seq,
                    });
                    continue;
                }
            };
            let key = self.insert_newest(op.keyspace, &op.key, seq, &version);
            self.entries
                .insert((op.keyspace, key, Reverse(seq)), version);
        }
    }

    /// Records `version` of `key` in the index of newest versions if it is
    /// newer than the one there; the key as the memtable shares it.
    fn insert_newest(
        &mut self,
        keyspace: u32,
        key: &[u8],
        seq: u64,
        version: &Version,
    ) -> Arc<[u8]> {
        let hash = point_hash(keyspace, key);
        let same = |n: &Newest| n.keyspace == keyspace && *n.key == *key;
        if let Some(n) = self.newest.find_mut(hash, same) {
            if seq > n.seq {
                n.seq = seq;
                n.version = version.clone();
            }
            return n.key.clone();
        }
        let key: Arc<[u8]> = Arc::from(key);
        self.approximate_bytes += NEWEST_BYTES;
        self.newest.insert_unique(
            hash,
            Newest {
                keyspace,
                key: key.clone(),
                seq,
                version: version.clone(),
            },
            |n| point_hash(n.keyspace, &n.key),
        );
        key
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
    ) -> Option<(u64, Option<&Arc<[u8]>>)> {
        let newest = self.newest.find(point_hash(keyspace, key), |n| {
            n.keyspace == keyspace && *n.key == *key
        })?;
        if newest.seq <= snapshot {
            return Some((newest.seq, newest.version.value()));
        }
        // An older snapshot, or a write still being committed: the ordered
        // map has the version at the snapshot.
        let from = (keyspace, newest.key.clone(), Reverse(snapshot));
        self.entries
            .range(from..)
            .next()
            .filter(|((ks, k, _), _)| *ks == keyspace && **k == *key)
            .map(|((_, _, Reverse(seq)), v)| (*seq, v.value()))
    }

    /// Every version of every key of `keyspace` from `start` on, in internal order.
    pub fn iter_from<'a>(
        &'a self,
        keyspace: u32,
        start: &[u8],
    ) -> impl Iterator<Item = Entry> + 'a {
        let lower = (keyspace, Arc::from(start), Reverse(u64::MAX));
        self.entries
            .range(lower..)
            .take_while(move |((ks, _, _), _)| *ks == keyspace)
            .map(|((_, k, Reverse(seq)), v)| match v {
                Version::Value(v) => Entry::new(k.to_vec(), *seq, EntryKind::Put, v.to_vec()),
                Version::Tombstone => Entry::new(k.to_vec(), *seq, EntryKind::Delete, Vec::new()),
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
        let lowest: InternalKey = (keyspace, Arc::from(start), Reverse(u64::MAX));
        let resume = after.map(|(k, s)| (keyspace, Arc::<[u8]>::from(k), Reverse(s)));
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
                (None, Some(end)) => Excluded((keyspace, Arc::from(end), Reverse(u64::MAX))),
                (None, None) => match keyspace.checked_add(1) {
                    Some(next) => Excluded((next, Arc::from(&[][..]), Reverse(u64::MAX))),
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
                .take_while(|((ks, k, _), _)| *ks == keyspace && end.is_none_or(|end| &k[..] < end))
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap as Model;

    /// A write: sequence, keyspace, key, value (None: a delete).
    type Write = (u64, u32, Vec<u8>, Option<Vec<u8>>);
    /// Each key's versions: (sequence, value or None).
    type Versions = Model<(u32, Vec<u8>), Vec<(u64, Option<Vec<u8>>)>>;

    proptest! {
        /// Point reads through the index of newest versions agree with the
        /// ordered map at every snapshot, whatever order batches arrive in.
        #[test]
        fn point_reads_match_a_model_at_every_snapshot(
            ops in proptest::collection::vec((0u32..2, 0u8..6, any::<bool>(), 0u8..200), 1..60),
            order in any::<u64>(),
        ) {
            // Batches of one op each, applied in a shuffled order (group
            // commit may apply a later sequence first).
            let mut batches: Vec<Write> = ops
                .iter()
                .enumerate()
                .map(|(i, &(ks, k, put, v))| {
                    let key = vec![b'k', k];
                    (i as u64 + 1, ks, key, put.then(|| vec![v; v as usize % 40]))
                })
                .collect();
            let mut state = order;
            for i in (1..batches.len()).rev() {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                batches.swap(i, (state >> 33) as usize % (i + 1));
            }
            let mut m = Memtable::default();
            let mut model = Versions::new();
            for (seq, ks, key, value) in &batches {
                let mut b = WriteBatch::new();
                match value {
                    Some(v) => b.put(*ks, key, v).unwrap(),
                    None => b.delete(*ks, key).unwrap(),
                };
                m.apply(*seq, &b);
                model.entry((*ks, key.clone())).or_default().push((*seq, value.clone()));
            }
            for ks in 0..2u32 {
                for k in 0..7u8 {
                    let key = vec![b'k', k];
                    for snapshot in 0..=ops.len() as u64 + 1 {
                        let want = model.get(&(ks, key.clone())).and_then(|vs| {
                            vs.iter().filter(|(s, _)| *s <= snapshot).max_by_key(|(s, _)| *s).cloned()
                        });
                        let got = m
                            .newest_version(ks, &key, snapshot)
                            .map(|(s, v)| (s, v.map(|v| v.to_vec())));
                        prop_assert_eq!(got, want, "keyspace {} key {:?} at {}", ks, key, snapshot);
                    }
                }
            }
        }
    }
}
