//! The memtable: every version of every key written since the last flush,
//! ordered by (keyspace, key, sequence descending), plus range tombstones.
//! Reads at a snapshot sequence see the newest version at or below it.
//!
//! Each key's versions are one [`Chain`] in a hash table; a [`KeyOrder`]
//! of the keys gives the order scans and flushes walk. A write of a key
//! already here (an overwrite of a hot key) is a hash lookup and a push;
//! only a key's first write is placed in the order.

mod index;
mod order;

use crate::batch::{OpKind, WriteBatch};
use crate::found::Found;
use crate::sst::{Entry, EntryKind, RangeTombstone as SstRangeTombstone};
use bytes::Bytes;
use index::KeyIndex;
use order::{KeyOrder, OrderKey, Probe, SlotKeys};
use sluice_io::mem::{prefetch, prefetch_read};
use std::ops::Bound;

/// Values go into chunks of this many bytes, one after another; a flushed
/// memtable is freed a chunk at a time, where an allocation per value cost
/// the background thread a reference count and a free for each, at random
/// places in memory (17% of a server's samples under SETs of 100 bytes).
const VALUE_CHUNK_BYTES: usize = 64 << 10;

/// A value larger than this has a chunk of its own: a reader keeping a
/// value of the chunk still being filled copies it (see [`Values`]).
const OWN_CHUNK_MIN_BYTES: usize = 4 << 10;

/// Where a value lies: `len` bytes at `start` of chunk `chunk`. A version
/// holds this, not a reference-counted slice: taking one reference per
/// value was a locked add per write, which waits for the value's copy
/// into a fresh chunk to reach the cache (a tenth of a server's time
/// under SETs at batch 50).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ValueAt {
    chunk: u32,
    start: u32,
    len: u32,
}

/// A memtable's values: the chunks filled (or holding one large value),
/// each shared by the readers that keep a value of it, and the chunk being
/// filled, which only the memtable's writer touches — a reader keeping a
/// value of it gets a copy (it is at most [`OWN_CHUNK_MIN_BYTES`]).
#[derive(Debug, Default)]
struct Values {
    /// Indexed by chunk; the open chunk's place holds an empty `Bytes`
    /// until it is filled.
    chunks: Vec<Bytes>,
    /// The chunk being filled, and its index.
    open: Vec<u8>,
    open_index: u32,
}

impl Values {
    /// A copy of `value` in the open chunk (a new one when it is full), or
    /// in a chunk of its own.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a value under 4 GiB; under 2^32 chunks"
    )]
    fn stash(&mut self, value: &[u8]) -> ValueAt {
        let len = u32::try_from(value.len()).expect("a value under 4 GiB");
        if value.len() > OWN_CHUNK_MIN_BYTES {
            self.chunks.push(Bytes::copy_from_slice(value));
            let chunk = u32::try_from(self.chunks.len() - 1).expect("under 2^32 chunks");
            return ValueAt {
                chunk,
                start: 0,
                len,
            };
        }
        if self.open.capacity() == 0 || self.open.capacity() - self.open.len() < value.len() {
            self.seal();
            self.open = Vec::with_capacity(VALUE_CHUNK_BYTES);
            self.open_index = u32::try_from(self.chunks.len()).expect("under 2^32 chunks");
            self.chunks.push(Bytes::new());
        }
        let start = self.open.len() as u32;
        // Within capacity: the open chunk never moves while values point into it.
        debug_assert!(self.open.len() + value.len() <= self.open.capacity());
        self.open.extend_from_slice(value);
        ValueAt {
            chunk: self.open_index,
            start,
            len,
        }
    }

    /// Moves the open chunk to its place among the filled ones.
    fn seal(&mut self) {
        if self.open.capacity() > 0 {
            self.chunks[self.open_index as usize] = Bytes::from(std::mem::take(&mut self.open));
        }
    }

    fn is_open(&self, at: ValueAt) -> bool {
        at.chunk == self.open_index && self.open.capacity() > 0
    }

    /// The value's bytes.
    fn get(&self, at: ValueAt) -> &[u8] {
        let (start, end) = (at.start as usize, (at.start + at.len) as usize);
        if self.is_open(at) {
            &self.open[start..end]
        } else {
            &self.chunks[at.chunk as usize][start..end]
        }
    }

    /// The value, as a point read hands it on.
    fn found(&self, at: ValueAt) -> Found<'_> {
        if self.is_open(at) {
            Found::in_memtable_copy(&self.open, at.start as usize, at.len as usize)
        } else {
            Found::in_memtable(
                &self.chunks[at.chunk as usize],
                at.start as usize,
                at.len as usize,
            )
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    Value(ValueAt),
    /// A value kept in a blob file: the stashed bytes are its reference.
    Blob(ValueAt),
    Tombstone,
}

/// Every version of one key: the newest apart (a point read at a snapshot
/// it is not newer than — nearly all of them — takes it at once), the
/// older ones in ascending sequence.
#[derive(Debug)]
struct Chain {
    keyspace: u32,
    key: Box<[u8]>,
    seq: u64,
    version: Version,
    older: Vec<(u64, Version)>,
}

impl Chain {
    /// Adds a version (sequences may arrive out of order: group commit
    /// may apply a later batch first).
    fn add(&mut self, seq: u64, version: Version) {
        assert_ne!(seq, self.seq, "one version per sequence");
        if seq > self.seq {
            let old_seq = std::mem::replace(&mut self.seq, seq);
            let old = std::mem::replace(&mut self.version, version);
            self.older.push((old_seq, old));
        } else {
            let at = self.older.partition_point(|(s, _)| *s < seq);
            self.older.insert(at, (seq, version));
        }
    }

    /// The newest version at or below `snapshot`.
    fn at(&self, snapshot: u64) -> Option<(u64, &Version)> {
        if self.seq <= snapshot {
            return Some((self.seq, &self.version));
        }
        let below = self.older.partition_point(|(s, _)| *s <= snapshot);
        below
            .checked_sub(1)
            .map(|i| (self.older[i].0, &self.older[i].1))
    }

    /// Its versions in internal order (sequence descending) or, with
    /// `ascending`, the reverse; with `bound`, only those past it in that
    /// order (below it descending, above it ascending).
    fn versions(
        &self,
        ascending: bool,
        bound: Option<u64>,
    ) -> impl Iterator<Item = (u64, &Version)> + '_ {
        // Position n stands for the newest, 0..n for the older ones.
        let n = self.older.len();
        (0..=n)
            .map(move |i| {
                let at = if ascending { i } else { n - i };
                match self.older.get(at) {
                    Some((seq, v)) => (*seq, v),
                    None => (self.seq, &self.version),
                }
            })
            .filter(move |(seq, _)| match bound {
                None => true,
                Some(b) if ascending => *seq > b,
                Some(b) => *seq < b,
            })
    }

    fn len(&self) -> usize {
        1 + self.older.len()
    }
}

#[derive(Debug, Clone)]
struct RangeTombstone {
    keyspace: u32,
    start: Vec<u8>,
    end: Vec<u8>,
    seq: u64,
}

/// What a key's [`Chain`], its index entry and its place in the order add
/// to a memtable's size, roughly.
const KEY_BYTES: usize = 96;

/// How many keys ahead of the one it adds a batch asks the memory for
/// index slots, and for chains (a slot must have come before its chain
/// can be found).
const SLOTS_AHEAD: usize = 8;
const CHAINS_AHEAD: usize = 4;

/// Keys a walk asks the memory for at once (see [`Memtable::prefetch_walk`]).
const WALK_BATCH_KEYS: usize = 16;

/// What a [`Memtable::visible_run`] visitor did with a key's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStep {
    /// Taken (or passed over); the run goes on.
    Taken,
    /// Passed over by the run itself (no version visible, or a tombstone).
    Passed,
    /// Taken, and the run ends after it.
    TakenLast,
    /// Not taken: the run ends before it, for the caller to read it
    /// another way (a value in a blob file).
    Refused,
}

/// Receives a key's visible version in a [`Memtable::visible_run`]: key,
/// sequence, kind, value; says what became of it.
pub type RunVisitor<'a> = dyn FnMut(&[u8], u64, EntryKind, &[u8]) -> RunStep + 'a;

/// Receives one version: key, sequence, kind, value.
pub type VersionVisitor<'a> = dyn FnMut(&[u8], u64, EntryKind, &[u8]) + 'a;

/// A 64-bit hash of (keyspace, key), eight bytes at a time.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: 8 bytes"
)]
pub(crate) fn point_hash(keyspace: u32, key: &[u8]) -> u64 {
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

impl SlotKeys for [Chain] {
    fn slot_key(&self, slot: u32) -> &[u8] {
        &self[slot as usize].key
    }
}

/// Recent writes of every keyspace, ordered, in memory until flushed.
#[derive(Debug, Default)]
pub struct Memtable {
    /// Every key with a point version here, in (keyspace, key) order.
    order: KeyOrder,
    /// Each of those keys' versions, in the order the keys came.
    chains: Vec<Chain>,
    /// Where each key's chain is, by [`point_hash`]. A table of small
    /// entries that carry hash bits: growing it moves 8 bytes an entry and
    /// reads no key, where a table of the chains themselves stalled
    /// the writer for tens of milliseconds each time it doubled past a few
    /// hundred thousand keys.
    index: KeyIndex,
    /// Point versions in all chains.
    versions: usize,
    ranges: Vec<RangeTombstone>,
    approximate_bytes: usize,
    /// Bytes of the values its blob references name (kept in blob files,
    /// not here).
    blob_value_bytes: u64,
    values: Values,
}

/// Most keys a new memtable makes room for at once.
const MAX_KEY_ROOM: usize = 1 << 20;

impl Memtable {
    /// An empty memtable whose chains hold `chain_keys` keys and whose
    /// index holds `index_keys` (each at most [`MAX_KEY_ROOM`]) before they
    /// grow: growing one of several hundred thousand keys copies megabytes
    /// while every writer waits. Room in the chains is only address space
    /// until used; an index with room for many more keys than it holds
    /// spreads them over memory a lookup then misses in the cache.
    pub fn with_key_room(chain_keys: usize, index_keys: usize) -> Memtable {
        Memtable {
            chains: Vec::with_capacity(chain_keys.min(MAX_KEY_ROOM)),
            index: KeyIndex::with_capacity(index_keys.min(MAX_KEY_ROOM)),
            ..Memtable::default()
        }
    }

    /// Keys with a point version here.
    pub fn key_count(&self) -> usize {
        self.chains.len()
    }

    /// The chain of (`keyspace`, `key`) hashing to `hash`: its index.
    fn find_chain(&self, hash: u64, keyspace: u32, key: &[u8]) -> Option<usize> {
        self.index
            .find(hash, |at| {
                let c = &self.chains[at as usize];
                c.keyspace == keyspace && *c.key == *key
            })
            .map(|at| at as usize)
    }

    /// Adds a batch whose first operation has sequence `first_seq`.
    ///
    /// A key's lookup misses the cache twice in a large memtable: its
    /// index slot, then its chain. For a batch of several keys, both are
    /// asked for a few keys ahead of the one being added, so that the
    /// misses of neighbouring keys overlap.
    pub fn apply(&mut self, first_seq: u64, batch: &WriteBatch) {
        let ahead = batch.len() > 1;
        // The slots of ops 1 to SLOTS_AHEAD - 1 first; then, at op i, the
        // slot of op i + SLOTS_AHEAD and the chain of op i + CHAINS_AHEAD.
        let mut slots_ahead = batch.ops().skip(1);
        let mut chains_ahead = batch.ops().skip(CHAINS_AHEAD);
        if ahead {
            for op in slots_ahead.by_ref().take(SLOTS_AHEAD - 1) {
                self.index.prefetch(point_hash(op.keyspace, op.key));
            }
        }
        for (i, op) in batch.ops().enumerate() {
            if ahead {
                if let Some(op) = slots_ahead.next() {
                    self.index.prefetch(point_hash(op.keyspace, op.key));
                }
                self.prefetch_chain(chains_ahead.next());
            }
            let seq = first_seq + i as u64;
            self.approximate_bytes += op.key.len() + op.value.len() + 32;
            let version = match op.kind {
                OpKind::Put => Version::Value(self.values.stash(op.value)),
                OpKind::PutBlob => {
                    if let Some(r) = crate::blob::BlobRef::decode(op.value) {
                        self.blob_value_bytes += r.len;
                    }
                    Version::Blob(self.values.stash(op.value))
                }
                OpKind::Delete => Version::Tombstone,
                OpKind::RangeDelete => {
                    self.ranges.push(RangeTombstone {
                        keyspace: op.keyspace,
                        start: op.key.to_vec(),
                        end: op.value.to_vec(),
                        seq,
                    });
                    continue;
                }
            };
            self.add_version(op.keyspace, op.key, seq, version);
        }
    }

    /// Asks the memory for the chain `op`'s key most likely has.
    fn prefetch_chain(&self, op: Option<crate::batch::BatchOp<'_>>) {
        let Some(op) = op else { return };
        if let Some(at) = self.index.first_candidate(point_hash(op.keyspace, op.key)) {
            prefetch(&self.chains[at as usize]);
        }
    }

    /// Adds one point version: to the key's chain, or as a new chain (and
    /// a new key in the ordered set) for a key's first version here.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: fewer than 2^32 keys in a memtable"
    )]
    fn add_version(&mut self, keyspace: u32, key: &[u8], seq: u64, version: Version) {
        self.versions += 1;
        let hash = point_hash(keyspace, key);
        if let Some(at) = self.find_chain(hash, keyspace, key) {
            self.chains[at].add(seq, version);
            return;
        }
        let at = u32::try_from(self.chains.len()).expect("fewer than 2^32 keys in a memtable");
        self.approximate_bytes += KEY_BYTES;
        self.chains.push(Chain {
            keyspace,
            key: Box::from(key),
            seq,
            version,
            older: Vec::new(),
        });
        // After the push: the order reads the new key's bytes through its slot.
        self.order
            .insert(self.chains.as_slice(), OrderKey::new(keyspace, key, at));
        self.index.insert_unique(hash, at);
    }

    /// The chain of a key in the order.
    fn chain(&self, key: &OrderKey) -> &Chain {
        &self.chains[key.slot as usize]
    }

    /// The end of `keyspace`'s keys, as a walk's upper bound.
    fn keyspace_end(keyspace: u32) -> Bound<Probe<'static>> {
        Probe::keyspace_end(keyspace).map_or(Bound::Unbounded, Bound::Excluded)
    }

    /// Bytes its keys and values take, roughly.
    pub fn approximate_bytes(&self) -> usize {
        self.approximate_bytes
    }

    /// Bytes of the values its blob references name.
    pub fn blob_value_bytes(&self) -> u64 {
        self.blob_value_bytes
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

    /// Asks the memory for the index slot a lookup of `key` starts at:
    /// called a few keys ahead of a run of lookups, the large memtable's
    /// cache misses of neighbouring keys overlap.
    pub fn prefetch_point(&self, keyspace: u32, key: &[u8]) {
        self.index.prefetch(point_hash(keyspace, key));
    }

    /// The newest point version of `key` at or below `snapshot`, range
    /// tombstones not applied: (sequence, kind, value — empty for a
    /// delete, a blob reference for a blob).
    pub fn newest_version(
        &self,
        keyspace: u32,
        key: &[u8],
        snapshot: u64,
    ) -> Option<(u64, EntryKind, Found<'_>)> {
        let at = self.find_chain(point_hash(keyspace, key), keyspace, key)?;
        self.chains[at].at(snapshot).map(|(seq, v)| match v {
            Version::Value(v) => (seq, EntryKind::Put, self.values.found(*v)),
            Version::Blob(v) => (seq, EntryKind::Blob, self.values.found(*v)),
            Version::Tombstone => (seq, EntryKind::Delete, Found::empty()),
        })
    }

    /// Every version of every key of `keyspace` from `start` on, in internal order.
    pub fn iter_from<'a>(
        &'a self,
        keyspace: u32,
        start: &'a [u8],
    ) -> impl Iterator<Item = Entry> + 'a {
        let lower = Bound::Included(Probe::new(keyspace, start));
        self.order
            .walk(
                self.chains.as_slice(),
                lower,
                Self::keyspace_end(keyspace),
                false,
            )
            .flat_map(move |o| {
                let k = &self.chain(o).key;
                self.chain(o).versions(false, None).map(|(seq, v)| match v {
                    Version::Value(v) => Entry::new(
                        k.to_vec(),
                        seq,
                        EntryKind::Put,
                        self.values.get(*v).to_vec(),
                    ),
                    Version::Blob(v) => Entry::new(
                        k.to_vec(),
                        seq,
                        EntryKind::Blob,
                        self.values.get(*v).to_vec(),
                    ),
                    Version::Tombstone => {
                        Entry::new(k.to_vec(), seq, EntryKind::Delete, Vec::new())
                    }
                })
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
        let probe = |k| Probe::new(keyspace, k);
        let lowest = Bound::Included(probe(start));
        // Where the walk stops at the high end; resumed after a key, the
        // walk starts again at that key (for its versions still to come).
        let high = match end {
            Some(end) => Bound::Excluded(probe(end)),
            None => Self::keyspace_end(keyspace),
        };
        let chains = self.chains.as_slice();
        let keys = if reverse {
            let upper = match after {
                Some((k, _)) => Bound::Included(probe(k)),
                None => high,
            };
            self.order.walk(chains, lowest, upper, true)
        } else {
            let lower = match after {
                Some((k, _)) => Bound::Included(probe(k)),
                None => lowest,
            };
            self.order.walk(chains, lower, high, false)
        };
        let mut n = 0;
        let mut keys = keys.peekable();
        let mut batch: Vec<&OrderKey> = Vec::with_capacity(WALK_BATCH_KEYS);
        while keys.peek().is_some() {
            batch.clear();
            // A short walk asks for no more than it may visit.
            let room = (max - n).clamp(1, WALK_BATCH_KEYS);
            batch.extend(keys.by_ref().take(room));
            self.prefetch_walk(&batch);
            for o in &batch {
                let k = &self.chain(o).key;
                let bound = after.filter(|(ak, _)| *ak == &k[..]).map(|(_, s)| s);
                for (seq, v) in self.chain(o).versions(reverse, bound) {
                    if n == max {
                        return n;
                    }
                    n += 1;
                    match v {
                        Version::Value(v) => visit(k, seq, EntryKind::Put, self.values.get(*v)),
                        Version::Blob(v) => visit(k, seq, EntryKind::Blob, self.values.get(*v)),
                        Version::Tombstone => visit(k, seq, EntryKind::Delete, &[]),
                    }
                }
            }
        }
        n
    }

    /// Hands `visit` the version (key, sequence, kind, value) of each key
    /// of `keyspace` after key
    /// `after` and before key `end` (None: the keyspace's end) that is
    /// visible at `snapshot` — the newest at or below it — at most `max`
    /// keys, in key order; a key with no version visible is passed over,
    /// and so is one whose visible version is a tombstone. `visit` says
    /// what became of each: taken or not, and whether to go on. Leaves the
    /// last key looked at (taken or passed over) in `last_key` and returns
    /// how many were looked at; a key `visit` did not take is not one.
    ///
    /// For a reader that knows no other source holds a key in the range:
    /// it reads in place, with no copy of each version and no merge.
    #[allow(clippy::too_many_arguments)]
    pub fn visible_run(
        &self,
        keyspace: u32,
        after: &[u8],
        end: Option<&[u8]>,
        snapshot: u64,
        max: usize,
        last_key: &mut Vec<u8>,
        visit: &mut RunVisitor<'_>,
    ) -> usize {
        let probe = |k| Probe::new(keyspace, k);
        let high = match end {
            Some(end) => Bound::Excluded(probe(end)),
            None => Self::keyspace_end(keyspace),
        };
        let chains = self.chains.as_slice();
        let mut keys = self
            .order
            .walk(chains, Bound::Excluded(probe(after)), high, false)
            .peekable();
        let mut looked = 0;
        let mut last: Option<&[u8]> = None;
        let mut batch: Vec<&OrderKey> = Vec::with_capacity(WALK_BATCH_KEYS);
        'walk: while keys.peek().is_some() && looked < max {
            batch.clear();
            batch.extend(keys.by_ref().take((max - looked).min(WALK_BATCH_KEYS)));
            self.prefetch_walk(&batch);
            for o in &batch {
                let chain = self.chain(o);
                let visible = chain
                    .versions(false, None)
                    .find(|(seq, _)| *seq <= snapshot);
                let step = match visible {
                    None | Some((_, Version::Tombstone)) => RunStep::Passed,
                    Some((seq, Version::Value(v))) => {
                        visit(&chain.key, seq, EntryKind::Put, self.values.get(*v))
                    }
                    Some((seq, Version::Blob(v))) => {
                        visit(&chain.key, seq, EntryKind::Blob, self.values.get(*v))
                    }
                };
                if step == RunStep::Refused {
                    break 'walk;
                }
                looked += 1;
                last = Some(&chain.key);
                if step == RunStep::TakenLast {
                    break 'walk;
                }
            }
        }
        if let Some(key) = last {
            last_key.clear();
            last_key.extend_from_slice(key);
        }
        looked
    }

    /// Asks for the chains, keys and newest values of `keys` before any is
    /// read: a memtable's records lie where they were allocated, not in
    /// key order, so a walk in order misses the cache on each; asked for
    /// together, the misses overlap.
    fn prefetch_walk(&self, keys: &[&OrderKey]) {
        for o in keys {
            prefetch(self.chain(o));
        }
        for o in keys {
            let chain = self.chain(o);
            prefetch_read(&chain.key, 0);
            if let Version::Value(v) = chain.version {
                let value = self.values.get(v);
                prefetch_read(value, 0);
                prefetch_read(value, 64);
            }
        }
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
        let mut ks: Vec<u32> = Vec::new();
        // One step per keyspace: jump past each one found.
        let mut from = Bound::Unbounded;
        while let Some(o) = self
            .order
            .walk(self.chains.as_slice(), from, Bound::Unbounded, false)
            .next()
        {
            ks.push(o.keyspace);
            match Probe::keyspace_end(o.keyspace) {
                Some(next) => from = Bound::Included(next),
                None => break,
            }
        }
        ks.extend(self.ranges.iter().map(|r| r.keyspace));
        ks.sort_unstable();
        ks.dedup();
        ks
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.order.len() == 0 && self.ranges.is_empty()
    }

    /// Versions it holds.
    pub fn entry_count(&self) -> usize {
        debug_assert_eq!(
            self.versions,
            self.chains.iter().map(Chain::len).sum::<usize>()
        );
        self.versions + self.ranges.len()
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

    /// Shuffles `items` as `seed` says (group commit may apply a later
    /// sequence first).
    fn shuffle<T>(items: &mut [T], seed: u64) {
        let mut state = seed;
        for i in (1..items.len()).rev() {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            items.swap(i, (state >> 33) as usize % (i + 1));
        }
    }

    /// Keys for the walks: short ones, the same with a zero byte added
    /// (equal to them in the ordered set's inline head), and ones past
    /// the head's 32 bytes that share all of them.
    fn walk_key(k: u8) -> Vec<u8> {
        let long = &b"0123456789abcdef0123456789abcdef"[..];
        match k % 4 {
            0 => vec![b'k', k],
            1 => vec![b'k', k - 1, 0],
            2 => [long, &[k]].concat(),
            _ => [long, &[k, 0]].concat(),
        }
    }

    proptest! {
        /// Every value stashed reads back whole however the chunks fill
        /// (empty values, values that end a chunk, values with a chunk of
        /// their own), and a kept one outlives the memtable.
        #[test]
        fn stashed_values_read_back_and_keep(
            sizes in proptest::collection::vec(
                prop_oneof![0usize..200, 3000usize..4200, 4096usize..9000],
                1..120,
            ),
        ) {
            let mut values = Values::default();
            let mut stashed = Vec::new();
            for (i, &size) in sizes.iter().enumerate() {
                let value: Vec<u8> = (0..size).map(|j| (i * 31 + j) as u8).collect();
                stashed.push((values.stash(&value), value));
                for (at, want) in &stashed {
                    prop_assert_eq!(values.get(*at), &want[..]);
                }
            }
            let kept: Vec<_> = stashed.iter().map(|(at, _)| values.found(*at).keep()).collect();
            drop(values);
            for (k, (_, want)) in kept.iter().zip(&stashed) {
                prop_assert_eq!(k.bytes(), &want[..]);
            }
        }

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
            shuffle(&mut batches, order);
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
                            .map(|(s, kind, v)| (s, kind.is_value().then(|| v.bytes().to_vec())));
                        prop_assert_eq!(got, want, "keyspace {} key {:?} at {}", ks, key, snapshot);
                    }
                }
            }
        }

        /// A batch of many ops (which asks for slots and chains ahead of
        /// the op it adds, with keys repeated inside it and the index
        /// growing under it) reads back as the same ops added one by one.
        #[test]
        fn batches_of_many_ops_read_back_like_single_ops(
            ops in proptest::collection::vec((0u32..2, 0u16..300, any::<bool>()), 1..400),
            sizes in proptest::collection::vec(1usize..40, 1..40),
        ) {
            let mut batched = Memtable::default();
            let mut single = Memtable::default();
            let (mut at, mut size) = (0usize, sizes.iter().cycle());
            while at < ops.len() {
                let end = (at + size.next().expect("cycles")).min(ops.len());
                let mut b = WriteBatch::new();
                for (i, &(ks, k, put)) in ops[at..end].iter().enumerate() {
                    let key = k.to_be_bytes();
                    let seq = (at + i + 1) as u64;
                    let mut one = WriteBatch::new();
                    if put {
                        b.put(ks, &key, &seq.to_le_bytes()).unwrap();
                        one.put(ks, &key, &seq.to_le_bytes()).unwrap();
                    } else {
                        b.delete(ks, &key).unwrap();
                        one.delete(ks, &key).unwrap();
                    }
                    single.apply(seq, &one);
                }
                batched.apply(at as u64 + 1, &b);
                at = end;
            }
            prop_assert_eq!(batched.key_count(), single.key_count());
            let last = ops.len() as u64;
            for &(ks, k, _) in &ops {
                let key = k.to_be_bytes();
                for snapshot in [last / 2, last] {
                    let read = |m: &Memtable| {
                        m.newest_version(ks, &key, snapshot)
                            .map(|(s, kind, v)| (s, kind.is_value().then(|| v.bytes().to_vec())))
                    };
                    prop_assert_eq!(read(&batched), read(&single));
                }
            }
        }

        /// Walking a key range in chunks of `max`, each resuming after the
        /// last version taken, forwards or backwards, gives exactly the
        /// model's versions in internal order (or its reverse); `versions`
        /// gives the forward walk at once.
        #[test]
        fn chunked_walks_match_a_model(
            ops in proptest::collection::vec((0u32..2, 0u8..8, any::<bool>()), 1..80),
            order in any::<u64>(),
            bounds in (0u8..9, 0u8..10),
            reverse in any::<bool>(),
            max in 1usize..5,
        ) {
            let mut writes: Vec<(u64, u32, Vec<u8>, bool)> = ops
                .iter()
                .enumerate()
                .map(|(i, &(ks, k, put))| (i as u64 + 1, ks, walk_key(k), put))
                .collect();
            shuffle(&mut writes, order);
            let mut m = Memtable::default();
            let mut model: Vec<(u32, Vec<u8>, u64, bool)> = Vec::new();
            for (seq, ks, key, put) in &writes {
                let mut b = WriteBatch::new();
                if *put {
                    b.put(*ks, key, &seq.to_le_bytes()).unwrap();
                } else {
                    b.delete(*ks, key).unwrap();
                }
                m.apply(*seq, &b);
                model.push((*ks, key.clone(), *seq, *put));
            }
            prop_assert_eq!(m.entry_count(), model.len());
            // Internal order: keyspace, key, sequence descending.
            model.sort_by(|a, b| (a.0, &a.1, std::cmp::Reverse(a.2)).cmp(&(b.0, &b.1, std::cmp::Reverse(b.2))));
            let start = walk_key(bounds.0);
            let end = (bounds.1 < 9).then(|| walk_key(bounds.1));
            for ks in 0..2u32 {
                let mut want: Vec<(Vec<u8>, u64, bool)> = model
                    .iter()
                    .filter(|(k_ks, k, _, _)| {
                        *k_ks == ks && *k >= start && end.as_ref().is_none_or(|e| k < e)
                    })
                    .map(|(_, k, s, p)| (k.clone(), *s, *p))
                    .collect();
                let forward: Vec<(Vec<u8>, u64, bool)> = m
                    .versions(ks, &start, end.as_deref())
                    .into_iter()
                    .map(|e| (e.key.clone(), e.seq, e.kind == EntryKind::Put))
                    .collect();
                prop_assert_eq!(&forward, &want);
                if reverse {
                    want.reverse();
                }
                let mut got: Vec<(Vec<u8>, u64, bool)> = Vec::new();
                for _ in 0..=want.len() {
                    let last = got.last().map(|(k, s, _)| (k.clone(), *s));
                    let after = last.as_ref().map(|(k, s)| (&k[..], *s));
                    let mut taken = Vec::new();
                    let n = m.chunk(ks, &start, end.as_deref(), reverse, after, max, &mut |k, s, kind, v| {
                        if kind == EntryKind::Put {
                            assert_eq!(v, &s.to_le_bytes()[..], "a version's own value");
                        }
                        taken.push((k.to_vec(), s, kind == EntryKind::Put));
                    });
                    prop_assert_eq!(n, taken.len());
                    prop_assert!(n <= max);
                    if n == 0 {
                        break;
                    }
                    got.extend(taken);
                }
                prop_assert_eq!(&got, &want);
            }
            prop_assert_eq!(m.keyspaces(), {
                let mut ks: Vec<u32> = model.iter().map(|w| w.0).collect();
                ks.dedup();
                ks
            });
        }
    }
}
