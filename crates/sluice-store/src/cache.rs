//! The block cache: verified data blocks kept in memory under a byte budget,
//! evicted by CLOCK (second chance), in shards with a lock each. No page cache sits under the store, so
//! this is the only read cache. The same structure caches the indexes and
//! filters of tables that are not pinned.

use crate::sst::{RawBlock, TableIndex};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// (table file number, data block index).
pub type BlockKey = (u64, u32);

/// Data blocks.
pub type BlockCache = Cache<RawBlock>;
/// Indexes and filters of unpinned tables, keyed by (file number, 0).
pub type IndexCache = Cache<Arc<TableIndex>>;

/// A cached value and its CLOCK state, held in the map itself: a lookup
/// finds the value in the bucket that matched its key, with no slot to
/// fetch after it (a miss of its own on every cached point read). The
/// value is held whole, not behind a reference count of its own: a data
/// block is a small handle (its bytes' reference, where its entries and
/// restart offsets lie), so from the bucket a point read goes on to the
/// block's bytes and nothing between them.
struct Held<T> {
    block: T,
    bytes: usize,
    referenced: bool,
    /// Put in for a read that missed and asks again
    /// ([`Cache::insert_for_retry`]): that look is no hit.
    awaiting_retry: bool,
}

/// Hashes a [`BlockKey`] with two multiplications: the keys are table
/// numbers and block indexes, not attacker-chosen, and SipHash (the
/// standard map's default) was a tenth of a cached point read's time.
#[derive(Default, Clone, Copy)]
struct BlockKeyHasher(u64);

impl std::hash::Hasher for BlockKeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ n as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        self.0 ^= self.0 >> 31;
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 ^= self.0 >> 29;
    }
}

type BlockMap<T> = HashMap<BlockKey, Held<T>, std::hash::BuildHasherDefault<BlockKeyHasher>>;

struct Clock<T> {
    map: BlockMap<T>,
    /// The keys in the hand's order; a free place is None.
    ring: Vec<Option<BlockKey>>,
    free: Vec<usize>,
    hand: usize,
    used_bytes: usize,
    hits: u64,
    misses: u64,
}

impl<T> Clock<T> {
    /// One step of the hand: a value referenced since the last pass gets
    /// a second chance, one that was not is evicted.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a key on the ring is held"
    )]
    fn advance_hand(&mut self) {
        let n = self.ring.len();
        assert!(n > 0, "the hand turns only while something is held");
        let h = self.hand % n;
        self.hand = h + 1;
        let Some(key) = self.ring[h] else {
            return;
        };
        let held = self.map.get_mut(&key).expect("a key on the ring is held");
        if held.referenced {
            held.referenced = false;
            return;
        }
        let bytes = held.bytes;
        self.map.remove(&key);
        self.ring[h] = None;
        self.used_bytes -= bytes;
        self.free.push(h);
    }
}

impl<T> Default for Clock<T> {
    fn default() -> Self {
        Clock {
            map: BlockMap::default(),
            ring: Vec::new(),
            free: Vec::new(),
            hand: 0,
            used_bytes: 0,
            hits: 0,
            misses: 0,
        }
    }
}

/// Shards hold at least this much (fewer shards for small caches), so a
/// shard never holds less than a few dozen blocks.
const MIN_SHARD_BYTES: usize = 256 << 10;
/// Most shards: enough that concurrent readers rarely meet on one lock.
const MAX_SHARDS: usize = 16;

/// A CLOCK cache split into shards by key, each behind its own lock, so
/// that readers on different threads rarely wait for each other.
pub struct Cache<T> {
    capacity_bytes: usize,
    shards: Vec<Mutex<Clock<T>>>,
}

impl<T> std::fmt::Debug for Cache<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Cache({} bytes in {} shards)",
            self.capacity_bytes,
            self.shards.len()
        )
    }
}

impl<T: Clone> Cache<T> {
    /// A cache holding up to `capacity_bytes`.
    pub fn new(capacity_bytes: usize) -> Self {
        let n = (capacity_bytes / MIN_SHARD_BYTES).clamp(1, MAX_SHARDS);
        Cache {
            capacity_bytes,
            shards: (0..n).map(|_| Mutex::new(Clock::default())).collect(),
        }
    }

    fn shard_capacity(&self) -> usize {
        self.capacity_bytes / self.shards.len()
    }

    fn lock(&self, key: BlockKey) -> std::sync::MutexGuard<'_, Clock<T>> {
        // Neighbouring blocks of one table land in different shards.
        let h = key.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (key.1 as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let shard = &self.shards[(h >> 32) as usize % self.shards.len()];
        shard.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn each(&self) -> impl Iterator<Item = std::sync::MutexGuard<'_, Clock<T>>> {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The cached value, marked as used.
    pub fn get(&self, key: BlockKey) -> Option<T> {
        let mut c = self.lock(key);
        let Some(held) = c.map.get_mut(&key) else {
            c.misses += 1;
            return None;
        };
        held.referenced = true;
        let block = held.block.clone();
        if held.awaiting_retry {
            held.awaiting_retry = false;
        } else {
            c.hits += 1;
        }
        Some(block)
    }

    /// Caches `block` (of about `bytes`), evicting blocks not referenced
    /// since the hand last passed them.
    pub fn insert(&self, key: BlockKey, block: T, bytes: usize) {
        self.insert_as(key, block, bytes, false);
    }

    /// [`insert`](Self::insert) for a read that missed, had the block
    /// read, and looks again: that look is not counted as a hit (its miss
    /// was counted).
    pub fn insert_for_retry(&self, key: BlockKey, block: T, bytes: usize) {
        self.insert_as(key, block, bytes, true);
    }

    fn insert_as(&self, key: BlockKey, block: T, bytes: usize, awaiting_retry: bool) {
        let capacity = self.shard_capacity();
        if bytes > capacity {
            return;
        }
        let mut c = self.lock(key);
        if c.map.contains_key(&key) {
            return;
        }
        while c.used_bytes + bytes > capacity {
            c.advance_hand();
        }
        match c.free.pop() {
            Some(i) => c.ring[i] = Some(key),
            None => c.ring.push(Some(key)),
        }
        c.map.insert(
            key,
            Held {
                block,
                bytes,
                referenced: false,
                awaiting_retry,
            },
        );
        c.used_bytes += bytes;
    }

    /// The bound.
    pub fn capacity_bytes(&self) -> usize {
        self.capacity_bytes
    }

    /// Bytes held now.
    pub fn used_bytes(&self) -> usize {
        self.each().map(|c| c.used_bytes).sum()
    }

    /// Lookups that found their block.
    pub fn hits(&self) -> u64 {
        self.each().map(|c| c.hits).sum()
    }

    /// Lookups that did not.
    pub fn misses(&self) -> u64 {
        self.each().map(|c| c.misses).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block put in for a read that missed is no hit at that read's
    /// second look (its miss was counted), and a hit at every later one.
    #[test]
    fn the_look_after_a_fill_is_not_a_hit() {
        let cache: Cache<u32> = Cache::new(1 << 20);
        assert_eq!(cache.get((1, 1)), None);
        cache.insert_for_retry((1, 1), 7, 4096);
        assert_eq!(cache.get((1, 1)), Some(7));
        assert_eq!((cache.hits(), cache.misses()), (0, 1));
        assert_eq!(cache.get((1, 1)), Some(7));
        assert_eq!((cache.hits(), cache.misses()), (1, 1));
    }

    /// A sharded cache stays within its budget, counts hits and misses
    /// over all shards, and keeps what was just read.
    #[test]
    fn shards_share_the_budget_and_the_counters() {
        let cache: Cache<u32> = Cache::new(4 << 20);
        assert_eq!(cache.shards.len(), 16);
        for i in 0..10_000u32 {
            cache.insert((i as u64 / 100, i % 100), i, 4096);
            assert!(cache.used_bytes() <= 4 << 20);
        }
        assert!(cache.used_bytes() > 3 << 20, "{}", cache.used_bytes());
        let recent = (99, 99);
        assert_eq!(cache.get(recent), Some(9999));
        assert_eq!(cache.get((0, 0)), None);
        assert_eq!((cache.hits(), cache.misses()), (1, 1));
        // A small cache is one shard: nothing is lost to rounding.
        let small: Cache<u32> = Cache::new(32 << 10);
        assert_eq!(small.shards.len(), 1);
        for i in 0..8u32 {
            small.insert((1, i), i, 4096);
        }
        assert!((0..8).all(|i| small.get((1, i)).is_some()));
    }

    /// CLOCK: a block read since the hand last passed it gets a second
    /// chance; the first unread one goes instead.
    #[test]
    fn a_block_read_since_the_last_pass_outlives_one_that_was_not() {
        let cache: Cache<u32> = Cache::new(4 * 4096);
        assert_eq!(cache.shards.len(), 1);
        for i in 0..4u32 {
            cache.insert((7, i), i, 4096);
        }
        assert_eq!(cache.get((7, 0)), Some(0));
        cache.insert((7, 4), 4, 4096);
        assert_eq!(cache.get((7, 1)), None, "the first unread block is evicted");
        for i in [0, 2, 3, 4] {
            assert_eq!(cache.get((7, i)), Some(i));
        }
        assert_eq!(cache.used_bytes(), 4 * 4096);
    }
}
