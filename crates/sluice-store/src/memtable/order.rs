//! The memtable's keys in order, kept as a few sorted runs of small
//! fixed-size entries instead of one search tree.
//!
//! A key's first write puts its [`OrderKey`] in a small sorted tail; a full
//! tail becomes a run, merged with the last runs while they are not much
//! larger (each run at least [`RUN_RATIO`] times the size of the one after
//! it, so there are few, up to runs of [`MAX_RUN_KEYS`]). An insert then costs a search of the tail and,
//! amortized, a few sequential moves of 40 bytes, where an insert into a
//! B-tree of a million keys searched several nodes that were mostly out of
//! cache. A walk merges the runs as it goes.

use std::cmp::Ordering;
use std::ops::Bound;

/// Keys the sorted tail holds before it becomes a run.
#[cfg(not(test))]
const TAIL_KEYS: usize = 64;
/// Small in tests, so that a few dozen keys make many runs and merges.
#[cfg(test)]
const TAIL_KEYS: usize = 2;

/// Each run is at least this many times larger than the one after it,
/// or of [`MAX_RUN_KEYS`].
const RUN_RATIO: usize = 4;

/// Runs grow by merges to this many keys and no further: a merge into a
/// run of the whole memtable copied megabytes while every writer waited
/// (a few milliseconds at a quarter of a million keys).
#[cfg(not(test))]
const MAX_RUN_KEYS: usize = 1 << 16;
#[cfg(test)]
const MAX_RUN_KEYS: usize = 32;

/// Where a memtable key's bytes are, by the slot its [`OrderKey`] names.
pub(super) trait SlotKeys {
    /// The key bytes of `slot`.
    fn slot_key(&self, slot: u32) -> &[u8];
}

/// A key's place in the order: its keyspace and first [`HEAD_BYTES`] inline,
/// and the slot of its chain, whose key settles ties past those bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct OrderKey {
    pub(super) keyspace: u32,
    /// Where the key's chain is in the memtable.
    pub(super) slot: u32,
    /// The key's first [`HEAD_BYTES`], zero-padded, as big-endian numbers:
    /// where two keys' heads differ they order as their bytes do (a zero
    /// pad only meets a byte of a longer key with the same beginning).
    head: Head,
}

/// Key bytes an [`OrderKey`] holds inline: a key that fits is ordered
/// without its chain. A Redis key with its database byte, or a member
/// with its collection's 8-byte id, mostly fits in 32 (measured against
/// 16 and 24 under redis-benchmark, pipelined, twice each: 32 took INCR
/// +15%, SADD +10-20%, HSET +15-40%, SPOP +50% over 16; LPUSH, SET and
/// LRANGE unchanged; 24 gave SPOP -15%, its members tying past 24 bytes).
const HEAD_BYTES: usize = 32;

/// A key's first [`HEAD_BYTES`] as numbers that order as the bytes do.
type Head = [u64; HEAD_BYTES / 8];

/// The first [`HEAD_BYTES`] of `key`, as [`OrderKey::head`] keeps them.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: 8 bytes"
)]
fn head_of(key: &[u8]) -> Head {
    let mut bytes = [0u8; HEAD_BYTES];
    let n = key.len().min(HEAD_BYTES);
    bytes[..n].copy_from_slice(&key[..n]);
    let mut head = [0u64; HEAD_BYTES / 8];
    for (word, chunk) in head.iter_mut().zip(bytes.chunks_exact(8)) {
        *word = u64::from_be_bytes(chunk.try_into().expect("8 bytes"));
    }
    head
}

impl OrderKey {
    pub(super) fn new(keyspace: u32, key: &[u8], slot: u32) -> OrderKey {
        OrderKey {
            keyspace,
            slot,
            head: head_of(key),
        }
    }
}

/// A key to search for: (keyspace, key).
#[derive(Debug, Clone, Copy)]
pub(super) struct Probe<'k> {
    keyspace: u32,
    head: Head,
    key: &'k [u8],
}

impl<'k> Probe<'k> {
    pub(super) fn new(keyspace: u32, key: &'k [u8]) -> Probe<'k> {
        Probe {
            keyspace,
            head: head_of(key),
            key,
        }
    }

    /// Where keyspace `keyspace` ends: before the first key of the next
    /// one (None past the last keyspace).
    pub(super) fn keyspace_end(keyspace: u32) -> Option<Probe<'static>> {
        keyspace.checked_add(1).map(|next| Probe::new(next, &[]))
    }
}

fn cmp_keys<K: SlotKeys + ?Sized>(keys: &K, a: &OrderKey, b: &OrderKey) -> Ordering {
    (a.keyspace, a.head)
        .cmp(&(b.keyspace, b.head))
        .then_with(|| keys.slot_key(a.slot).cmp(keys.slot_key(b.slot)))
}

fn cmp_probe<K: SlotKeys + ?Sized>(keys: &K, a: &OrderKey, p: &Probe<'_>) -> Ordering {
    (a.keyspace, a.head)
        .cmp(&(p.keyspace, p.head))
        .then_with(|| keys.slot_key(a.slot).cmp(p.key))
}

/// Every key of a memtable, in (keyspace, key) order.
#[derive(Debug, Default)]
pub(super) struct KeyOrder {
    /// The newest keys, sorted; fewer than [`TAIL_KEYS`].
    tail: Vec<OrderKey>,
    /// Sorted runs, each at least [`RUN_RATIO`] times the next or of
    /// [`MAX_RUN_KEYS`] (no merge makes a larger one).
    runs: Vec<Run>,
    len: usize,
}

impl KeyOrder {
    /// Adds a key not yet here.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a last run"
    )]
    pub(super) fn insert<K: SlotKeys + ?Sized>(&mut self, keys: &K, key: OrderKey) {
        let at = self
            .tail
            .partition_point(|o| cmp_keys(keys, o, &key) == Ordering::Less);
        debug_assert!(
            self.tail
                .get(at)
                .is_none_or(|o| cmp_keys(keys, o, &key) != Ordering::Equal),
            "a key is inserted once"
        );
        self.tail.insert(at, key);
        self.len += 1;
        if self.tail.len() == TAIL_KEYS {
            let mut run = std::mem::replace(&mut self.tail, Vec::with_capacity(TAIL_KEYS));
            while let Some(last) = self.runs.last() {
                let last_len = last.keys.len();
                if last_len >= run.len() * RUN_RATIO || last_len + run.len() > MAX_RUN_KEYS {
                    break;
                }
                let last = self.runs.pop().expect("a last run");
                run = merge(keys, &last.keys, &run);
            }
            self.runs.push(Run::new(keys, run));
        }
    }

    /// Keys held.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Runs a walk merges (the tail counted as one).
    #[cfg(test)]
    pub(super) fn parts(&self) -> usize {
        self.runs.len() + 1
    }

    /// The keys from `lower` to `upper`, ascending or, with `reverse`,
    /// descending. Each run is searched for where the walk starts only:
    /// where it stops is checked as keys are taken, so a walk that takes
    /// a few keys (a seek) pays one search of each run, not two.
    pub(super) fn walk<'a, 'p, K: SlotKeys + ?Sized>(
        &'a self,
        keys: &'a K,
        lower: Bound<Probe<'p>>,
        upper: Bound<Probe<'p>>,
        reverse: bool,
    ) -> Walk<'a, 'p, K> {
        let (start, stop) = if reverse {
            (upper, lower)
        } else {
            (lower, upper)
        };
        // Forward: the first key at or past `start`; reversed: the last
        // key at or before it. As a test of how a key orders against the
        // start, true for the keys before the place.
        let (p, before): (Option<&Probe<'_>>, fn(Ordering) -> bool) = match (&start, reverse) {
            (Bound::Unbounded, false) => (None, |_| false),
            (Bound::Unbounded, true) => (None, |_| true),
            (Bound::Included(p), false) | (Bound::Excluded(p), true) => {
                (Some(p), |o| o == Ordering::Less)
            }
            (Bound::Excluded(p), false) | (Bound::Included(p), true) => {
                (Some(p), |o| o != Ordering::Greater)
            }
        };
        let place = |run: &[OrderKey], fences: Option<&Fences>| -> usize {
            let Some(p) = p else {
                return if before(Ordering::Equal) {
                    run.len()
                } else {
                    0
                };
            };
            // A run wholly on one side of the place needs no search (a
            // list pushed at one end: each run holds a stretch of it).
            match (run.first(), run.last()) {
                (None, _) => return 0,
                (Some(first), _) if !before(cmp_probe(keys, first, p)) => return 0,
                (_, Some(last)) if before(cmp_probe(keys, last, p)) => return run.len(),
                _ => {}
            }
            // The fences narrow the search to the keys between two of
            // them, which alone are compared through their chains.
            let (lo, hi) = match fences {
                Some(f) => f.window(run.len(), |i| before(f.cmp_probe(i, p))),
                None => (0, run.len()),
            };
            lo + run[lo..hi].partition_point(|o| before(cmp_probe(keys, o, p)))
        };
        let parts = self
            .runs
            .iter()
            .map(|r| (r.keys.as_slice(), Some(&r.fences)))
            .chain(std::iter::once((self.tail.as_slice(), None)))
            .map(|(run, fences)| {
                let at = place(run, fences);
                if reverse {
                    &run[..at]
                } else {
                    &run[at..]
                }
            })
            .filter(|part| !part.is_empty())
            .collect();
        Walk::new(keys, parts, reverse, stop)
    }
}

/// Keys of a run between two fences: a search compares at most
/// log2 of this many keys through their chains.
#[cfg(not(test))]
const FENCE_EVERY: usize = 32;
#[cfg(test)]
const FENCE_EVERY: usize = 3;

/// A sorted run of keys, and its fences.
#[derive(Debug)]
struct Run {
    keys: Vec<OrderKey>,
    fences: Fences,
}

impl Run {
    fn new<K: SlotKeys + ?Sized>(slot_keys: &K, keys: Vec<OrderKey>) -> Run {
        let fences = Fences::of(slot_keys, &keys);
        Run { keys, fences }
    }
}

/// Every [`FENCE_EVERY`]-th key of a run, whole and side by side: a
/// search of a run bisects them first, in memory that lies together,
/// where bisecting the run itself would follow a chain to its key bytes
/// at every step that the [`OrderKey`]s' heads do not settle (a set's
/// members, sharing the set's id and often their first bytes, tie there).
#[derive(Debug, Default)]
struct Fences {
    keyspaces: Vec<u32>,
    /// Fence `i`'s key bytes: `bytes[ends[i - 1]..ends[i]]`.
    ends: Vec<u32>,
    bytes: Vec<u8>,
}

impl Fences {
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a run's fences fit in 4 GiB"
    )]
    fn of<K: SlotKeys + ?Sized>(slot_keys: &K, run: &[OrderKey]) -> Fences {
        let mut f = Fences::default();
        for o in run.iter().step_by(FENCE_EVERY) {
            f.keyspaces.push(o.keyspace);
            f.bytes.extend_from_slice(slot_keys.slot_key(o.slot));
            let end = u32::try_from(f.bytes.len()).expect("a run's fences fit in 4 GiB");
            f.ends.push(end);
        }
        f
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn key(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.bytes[start..self.ends[i] as usize]
    }

    /// How fence `i` orders against `p`.
    fn cmp_probe(&self, i: usize, p: &Probe<'_>) -> Ordering {
        self.keyspaces[i]
            .cmp(&p.keyspace)
            .then_with(|| self.key(i).cmp(p.key))
    }

    /// Where, in a run of `len` keys, the first key for which `before`
    /// fails lies: a window `lo..hi` of at most [`FENCE_EVERY`] keys
    /// (`before` holds for the keys ahead of the place, then fails).
    fn window(&self, len: usize, before: impl Fn(usize) -> bool) -> (usize, usize) {
        debug_assert_eq!(self.len(), len.div_ceil(FENCE_EVERY));
        // Fences 0..ahead are before the place; fence `ahead` is not.
        let (mut ahead, mut not_ahead) = (0, self.len());
        while ahead < not_ahead {
            let mid = ahead + (not_ahead - ahead) / 2;
            if before(mid) {
                ahead = mid + 1;
            } else {
                not_ahead = mid;
            }
        }
        let lo = if ahead == 0 {
            0
        } else {
            (ahead - 1) * FENCE_EVERY + 1
        };
        (lo, (ahead * FENCE_EVERY).min(len))
    }
}

/// Two sorted runs as one.
fn merge<K: SlotKeys + ?Sized>(keys: &K, a: &[OrderKey], b: &[OrderKey]) -> Vec<OrderKey> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if cmp_keys(keys, &a[i], &b[j]) == Ordering::Less {
            out.push(a[i]);
            i += 1;
        } else {
            out.push(b[j]);
            j += 1;
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    out
}

/// A walk over a [`KeyOrder`]: at each step the least (or, reversed, the
/// greatest) of the runs' next keys, until one is past `stop`.
///
/// The runs' next keys are kept in a binary heap: a step compares about
/// 2·log2(runs) keys, and two while one run's keys come before every
/// other's (a list pushed at one end: each run holds a stretch of it),
/// where a look at every run's next key compared them all.
pub(super) struct Walk<'a, 'p, K: SlotKeys + ?Sized> {
    keys: &'a K,
    /// What is left of each run.
    parts: Vec<&'a [OrderKey]>,
    /// The runs with keys left, as indexes into `parts`, in heap order:
    /// each one's next key comes before its children's (at 2i+1, 2i+2).
    heap: Vec<usize>,
    reverse: bool,
    /// Where the walk ends: its upper bound, reversed its lower one.
    stop: Bound<Probe<'p>>,
}

impl<'a, 'p, K: SlotKeys + ?Sized> Walk<'a, 'p, K> {
    /// A walk over `parts` (none empty).
    fn new(keys: &'a K, parts: Vec<&'a [OrderKey]>, reverse: bool, stop: Bound<Probe<'p>>) -> Self {
        debug_assert!(parts.iter().all(|part| !part.is_empty()));
        let mut walk = Walk {
            keys,
            parts,
            heap: Vec::new(),
            reverse,
            stop,
        };
        // A part whose next key is past the stop gives nothing: left out,
        // it costs the steps nothing (a short range of a list pushed at
        // one end lies in one or two of the runs).
        walk.heap = (0..walk.parts.len())
            .filter(|&part| !walk.past_stop(walk.next_of(part)))
            .collect();
        for at in (0..walk.heap.len() / 2).rev() {
            walk.sift_down(at);
        }
        walk
    }

    /// The next key of part `part`.
    fn next_of(&self, part: usize) -> &'a OrderKey {
        next_of(&self.parts, self.reverse, part)
    }

    /// Moves the part at heap place `at` down to where its next key
    /// comes before its children's.
    fn sift_down(&mut self, at: usize) {
        let Walk {
            keys,
            parts,
            heap,
            reverse,
            ..
        } = self;
        crate::heap::sift_down(heap, at, |a, b| part_first(*keys, parts, *reverse, a, b));
    }

    /// Whether `key` lies past where the walk stops.
    fn past_stop(&self, key: &OrderKey) -> bool {
        let (p, included) = match &self.stop {
            Bound::Unbounded => return false,
            Bound::Included(p) => (p, true),
            Bound::Excluded(p) => (p, false),
        };
        let beyond = if self.reverse {
            Ordering::Less
        } else {
            Ordering::Greater
        };
        match cmp_probe(self.keys, key, p) {
            Ordering::Equal => !included,
            order => order == beyond,
        }
    }
}

/// The next key of part `part` of a walk.
#[inline]
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: a part in the heap has keys left"
)]
fn next_of<'a>(parts: &[&'a [OrderKey]], reverse: bool, part: usize) -> &'a OrderKey {
    let keys = parts[part];
    let next = if reverse { keys.last() } else { keys.first() };
    next.expect("a part in the heap has keys left")
}

/// Whether part `a`'s next key comes before part `b`'s in a walk.
#[inline]
fn part_first<K: SlotKeys + ?Sized>(
    keys: &K,
    parts: &[&[OrderKey]],
    reverse: bool,
    a: usize,
    b: usize,
) -> bool {
    let order = cmp_keys(keys, next_of(parts, reverse, a), next_of(parts, reverse, b));
    debug_assert!(order != Ordering::Equal, "a key is in one run only");
    (order == Ordering::Less) != reverse
}

impl<'a, K: SlotKeys + ?Sized> Iterator for Walk<'a, '_, K> {
    type Item = &'a OrderKey;

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: the heap holds the part"
    )]
    fn next(&mut self) -> Option<&'a OrderKey> {
        let first = *self.heap.first()?;
        let taken = self.next_of(first);
        if self.past_stop(taken) {
            // Every key left is further still.
            self.heap.clear();
            return None;
        }
        let part = &mut self.parts[first];
        *part = if self.reverse {
            &part[..part.len() - 1]
        } else {
            &part[1..]
        };
        if part.is_empty() {
            let last = self.heap.pop().expect("the heap holds the part");
            if self.heap.is_empty() {
                return Some(taken);
            }
            self.heap[0] = last;
        }
        self.sift_down(0);
        Some(taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    struct Keys(Vec<Vec<u8>>);

    impl SlotKeys for Keys {
        fn slot_key(&self, slot: u32) -> &[u8] {
            &self.0[slot as usize]
        }
    }

    fn probe_bound(b: &Bound<(u32, Vec<u8>)>) -> Bound<Probe<'_>> {
        b.as_ref().map(|(ks, k)| Probe::new(*ks, k))
    }

    fn key_part() -> impl Strategy<Value = Vec<u8>> {
        // Few byte values after a run of 7s about as long as the head:
        // many keys share their first HEAD_BYTES bytes (and tie there) or
        // differ only by a trailing zero.
        let tail = proptest::collection::vec(prop_oneof![Just(0u8), Just(7u8), Just(255u8)], 0..6);
        (0usize..HEAD_BYTES + 3, tail).prop_map(|(shared, tail)| [vec![7u8; shared], tail].concat())
    }

    proptest! {
        /// Walks between any bounds, both ways, give exactly the sorted
        /// keys in them, however many runs the inserts left.
        #[test]
        fn walks_match_a_sorted_model(
            raw in proptest::collection::btree_set((0u32..3, key_part()), 0..120),
            order in any::<u64>(),
            lower in (0u32..3, key_part(), 0u8..3),
            upper in (0u32..3, key_part(), 0u8..3),
        ) {
            let mut entries: Vec<(u32, Vec<u8>)> = raw.iter().cloned().collect();
            // Inserted in a shuffled order.
            let mut state = order;
            for i in (1..entries.len()).rev() {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                entries.swap(i, (state >> 33) as usize % (i + 1));
            }
            let keys = Keys(entries.iter().map(|(_, k)| k.clone()).collect());
            let mut o = KeyOrder::default();
            for (slot, (ks, key)) in entries.iter().enumerate() {
                o.insert(&keys, OrderKey::new(*ks, key, slot as u32));
            }
            prop_assert_eq!(o.len(), entries.len());
            prop_assert!(
                o.parts()
                    <= 2 + entries.len() / MAX_RUN_KEYS
                        + 2 * (usize::BITS - entries.len().leading_zeros()) as usize
            );
            prop_assert!(o.runs.iter().all(|r| r.keys.len() <= MAX_RUN_KEYS));
            let bound = |(ks, key, kind): &(u32, Vec<u8>, u8)| -> Bound<(u32, Vec<u8>)> {
                match kind {
                    0 => Bound::Included((*ks, key.clone())),
                    1 => Bound::Excluded((*ks, key.clone())),
                    _ => Bound::Unbounded,
                }
            };
            let (lo, hi) = (bound(&lower), bound(&upper));
            let in_range = |e: &(u32, Vec<u8>)| -> bool {
                let above = match &lo {
                    Bound::Included(b) => e >= b,
                    Bound::Excluded(b) => e > b,
                    Bound::Unbounded => true,
                };
                let below = match &hi {
                    Bound::Included(b) => e <= b,
                    Bound::Excluded(b) => e < b,
                    Bound::Unbounded => true,
                };
                above && below
            };
            let want: Vec<(u32, Vec<u8>)> = raw.iter().filter(|e| in_range(e)).cloned().collect();
            for reverse in [false, true] {
                let got: Vec<(u32, Vec<u8>)> = o
                    .walk(&keys, probe_bound(&lo), probe_bound(&hi), reverse)
                    .map(|k| (k.keyspace, keys.slot_key(k.slot).to_vec()))
                    .collect();
                let mut want = want.clone();
                if reverse {
                    want.reverse();
                }
                prop_assert_eq!(got, want);
            }
        }
    }
}
