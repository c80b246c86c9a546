//! The filter of keys that may hold a collection ([`super::Db::may_hold_collection`])
//! and `redis.collections`, the index it is filled from at open.

use super::Db;
use crate::databases::DATABASES;
use sluice_store::{Store, StoreError};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Bits of the filter of keys that may hold a collection (512 KiB): with
/// 100,000 collections about one SET in 40 reads an old record it did not
/// need to.
const COLLECTION_KEY_BITS: usize = 1 << 22;

/// `redis.collections`' key of `key` in physical database `database`.
pub(super) fn collection_index_key(database: u8, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + key.len());
    k.push(database);
    k.extend_from_slice(key);
    k
}

/// `redis.collections`' range of physical database `database`: its
/// entries' keys are at least the first and below the second.
pub(super) fn collection_index_range(database: u8) -> (Vec<u8>, Vec<u8>) {
    (vec![database], vec![database + 1])
}

/// Which keys may hold a collection: one bit per key hash, set before a
/// collection is written at the key and never cleared (a key that stopped
/// being one only costs its SETs a read). `complete` once the scan at open
/// has marked every collection stored before it.
pub(super) struct CollectionKeys {
    bits: Box<[AtomicU64]>,
    /// Whether any bit was ever set: while none is, a SET reads no bit
    /// (each a likely cache miss in half a MiB).
    any: AtomicBool,
    pub(super) complete: AtomicBool,
    /// Asks the scan at open to stop (the keyspace is being dropped).
    pub(super) stop: AtomicBool,
}

impl CollectionKeys {
    pub(super) fn new() -> CollectionKeys {
        CollectionKeys {
            bits: (0..COLLECTION_KEY_BITS / 64)
                .map(|_| AtomicU64::new(0))
                .collect(),
            any: AtomicBool::new(false),
            complete: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        }
    }

    fn slot(key: &[u8]) -> (usize, u64) {
        let bit = (Db::hash(key) as usize) % COLLECTION_KEY_BITS;
        (bit / 64, 1u64 << (bit % 64))
    }

    pub(super) fn mark(&self, key: &[u8]) {
        let (word, mask) = CollectionKeys::slot(key);
        self.any.store(true, Ordering::Release);
        self.bits[word].fetch_or(mask, Ordering::AcqRel);
    }

    pub(super) fn may_hold(&self, key: &[u8]) -> bool {
        if !self.complete.load(Ordering::Acquire) {
            return true;
        }
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        let (word, mask) = CollectionKeys::slot(key);
        self.bits[word].load(Ordering::Acquire) & mask != 0
    }

    /// Marks every key `redis.collections` lists as of a snapshot taken
    /// now (collections written later mark themselves), then says the
    /// filter is complete. Stops early, incomplete, when asked to.
    pub(super) fn fill(&self, store: &Store, collections: u32) -> Result<(), StoreError> {
        let all = (Bound::Unbounded::<&[u8]>, Bound::Unbounded);
        for item in store.iter(collections, all, &store.snapshot(), false) {
            if self.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            let (index_key, _) = item?;
            match index_key.split_first() {
                Some((&database, key)) if usize::from(database) < DATABASES => self.mark(key),
                _ => {
                    return Err(StoreError::BadInput(
                        "an entry of redis.collections is malformed".into(),
                    ))
                }
            }
        }
        self.complete.store(true, Ordering::Release);
        Ok(())
    }
}
