//! The memtable's point index: where each key's chain is, by the key's
//! hash. An open-addressing table of 8-byte slots (32 bits of the hash and
//! the chain's place) with linear probing, so that the slot a key will be
//! found in is known from its hash alone: a batch asks the memory for its
//! keys' slots before it looks any of them up, and the misses of a
//! large memtable overlap instead of coming one after another.
//!
//! A key's home slot is its tag scaled to the table (`tag * slots >> 32`),
//! so the table doubles from the tags alone, reading no key. Eight slots
//! share a cache line: a search for an absent key, which runs to the next
//! empty slot, mostly stays in one.

use sluice_io::mem::prefetch;

/// One slot: the high 32 bits of a key's hash and its chain's place plus
/// one (0: empty).
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(8))]
struct Slot {
    tag: u32,
    at_plus_one: u32,
}

fn tag_of(hash: u64) -> u32 {
    // The high half of `point_hash`: the high bits of its last product.
    (hash >> 32) as u32
}

/// Fewest slots a table has.
const MIN_SLOTS: usize = 16;

/// Keys per slot at most: 3 of 4 (linear probing slows past that).
fn max_keys(slots: usize) -> usize {
    slots / 4 * 3
}

/// Hash to chain place, for keys that are in the table once each.
#[derive(Debug)]
pub(super) struct KeyIndex {
    slots: Vec<Slot>,
    keys: usize,
}

impl Default for KeyIndex {
    fn default() -> Self {
        KeyIndex::with_capacity(0)
    }
}

impl KeyIndex {
    /// A table that holds `keys` keys before it grows.
    pub(super) fn with_capacity(keys: usize) -> KeyIndex {
        let mut slots = MIN_SLOTS;
        while max_keys(slots) < keys {
            slots *= 2;
        }
        KeyIndex {
            slots: vec![Slot::default(); slots],
            keys: 0,
        }
    }

    fn home(&self, tag: u32) -> usize {
        ((u64::from(tag) * self.slots.len() as u64) >> 32) as usize
    }

    /// Asks the memory for the slot a lookup of `hash` starts at.
    pub(super) fn prefetch(&self, hash: u64) {
        prefetch(&self.slots[self.home(tag_of(hash))]);
    }

    /// The place of the first key stored with `hash` (a candidate: its
    /// key may still differ), for a caller to ask the memory for it early.
    pub(super) fn first_candidate(&self, hash: u64) -> Option<u32> {
        self.find(hash, |_| true)
    }

    /// The place stored for the key with `hash` for which `is_key` holds.
    pub(super) fn find(&self, hash: u64, is_key: impl Fn(u32) -> bool) -> Option<u32> {
        let (tag, mask) = (tag_of(hash), self.slots.len() - 1);
        let mut at = self.home(tag);
        loop {
            let slot = self.slots[at];
            if slot.at_plus_one == 0 {
                return None;
            }
            if slot.tag == tag && is_key(slot.at_plus_one - 1) {
                return Some(slot.at_plus_one - 1);
            }
            at = (at + 1) & mask;
        }
    }

    /// Stores `place` for a key with `hash` that the table does not hold.
    pub(super) fn insert_unique(&mut self, hash: u64, place: u32) {
        assert!(place < u32::MAX, "a chain's place fits a slot");
        if self.keys + 1 > max_keys(self.slots.len()) {
            self.grow();
        }
        self.put(tag_of(hash), place + 1);
        self.keys += 1;
    }

    fn put(&mut self, tag: u32, at_plus_one: u32) {
        let mask = self.slots.len() - 1;
        let mut at = self.home(tag);
        while self.slots[at].at_plus_one != 0 {
            at = (at + 1) & mask;
        }
        self.slots[at] = Slot { tag, at_plus_one };
    }

    fn grow(&mut self) {
        let doubled = vec![Slot::default(); self.slots.len() * 2];
        let old = std::mem::replace(&mut self.slots, doubled);
        for slot in old.into_iter().filter(|s| s.at_plus_one != 0) {
            self.put(slot.tag, slot.at_plus_one);
        }
    }

    /// Keys stored.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// Against a map, with hashes drawn from a few values so that
        /// probes run past slots of other keys with the same hash.
        #[test]
        fn finds_what_a_map_holds(keys in proptest::collection::vec((0u64..40, 0u16..2000), 0..600), start in 0usize..64) {
            let mut index = KeyIndex::with_capacity(start);
            let mut places: Vec<(u64, u16)> = Vec::new();
            let mut map = HashMap::new();
            for (hash_class, key) in keys {
                let hash = hash_class.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (hash_class << 20);
                let found = index.find(hash, |p| places[p as usize] == (hash, key));
                prop_assert_eq!(found, map.get(&(hash, key)).copied());
                if found.is_none() {
                    let place = places.len() as u32;
                    places.push((hash, key));
                    index.insert_unique(hash, place);
                    map.insert((hash, key), place);
                }
                if let Some(first) = index.first_candidate(hash) {
                    prop_assert_eq!(tag_of(places[first as usize].0), tag_of(hash));
                }
            }
            prop_assert_eq!(index.len(), map.len());
            for (&(hash, key), &place) in &map {
                prop_assert_eq!(index.find(hash, |p| places[p as usize] == (hash, key)), Some(place));
            }
            prop_assert!(index.keys <= max_keys(index.slots.len()));
        }
    }

    #[test]
    fn an_empty_table_finds_nothing_and_grows_from_its_smallest_size() {
        let mut index = KeyIndex::default();
        assert_eq!(index.find(7, |_| true), None);
        assert_eq!(index.first_candidate(7), None);
        let hash = |place: u32| u64::from(place).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for place in 0..1000u32 {
            index.insert_unique(hash(place), place);
        }
        assert_eq!(index.len(), 1000);
        assert!(index.slots.len() >= 1000 * 4 / 3);
        for place in 0..1000u32 {
            assert_eq!(index.find(hash(place), |p| p == place), Some(place));
        }
    }
}
