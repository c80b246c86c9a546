//! The block cache: verified data blocks kept in memory under a byte budget,
//! evicted by CLOCK (second chance). No page cache sits under the store, so
//! this is the only read cache. The same structure caches the indexes and
//! filters of tables that are not pinned.

use crate::sst::{RawBlock, TableIndex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// (table file number, data block index).
pub type BlockKey = (u64, u32);

/// Data blocks.
pub type BlockCache = Cache<RawBlock>;
/// Indexes and filters of unpinned tables, keyed by (file number, 0).
pub type IndexCache = Cache<TableIndex>;

struct Slot<T> {
    key: BlockKey,
    block: Arc<T>,
    bytes: usize,
    referenced: bool,
}

struct Clock<T> {
    map: HashMap<BlockKey, usize>,
    slots: Vec<Option<Slot<T>>>,
    free: Vec<usize>,
    hand: usize,
    used_bytes: usize,
}

impl<T> Default for Clock<T> {
    fn default() -> Self {
        Clock {
            map: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            hand: 0,
            used_bytes: 0,
        }
    }
}

pub struct Cache<T> {
    capacity_bytes: usize,
    clock: Mutex<Clock<T>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl<T> std::fmt::Debug for Cache<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cache({} bytes)", self.capacity_bytes)
    }
}

impl<T> Cache<T> {
    pub fn new(capacity_bytes: usize) -> Self {
        Cache {
            capacity_bytes,
            clock: Mutex::new(Clock::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Clock<T>> {
        self.clock.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, key: BlockKey) -> Option<Arc<T>> {
        let mut c = self.lock();
        let Some(&i) = c.map.get(&key) else {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let slot = c.slots[i].as_mut().expect("mapped slot is full");
        slot.referenced = true;
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(slot.block.clone())
    }

    /// Caches `block` (of about `bytes`), evicting blocks not referenced
    /// since the hand last passed them.
    pub fn insert(&self, key: BlockKey, block: Arc<T>, bytes: usize) {
        if bytes > self.capacity_bytes {
            return;
        }
        let mut c = self.lock();
        if c.map.contains_key(&key) {
            return;
        }
        while c.used_bytes + bytes > self.capacity_bytes {
            let n = c.slots.len();
            let h = c.hand % n.max(1);
            c.hand = h + 1;
            match c.slots[h].as_mut() {
                Some(s) if s.referenced => s.referenced = false,
                Some(_) => {
                    let s = c.slots[h].take().expect("full slot");
                    c.map.remove(&s.key);
                    c.used_bytes -= s.bytes;
                    c.free.push(h);
                }
                None => {}
            }
        }
        let slot = Slot {
            key,
            block,
            bytes,
            referenced: false,
        };
        let i = match c.free.pop() {
            Some(i) => {
                c.slots[i] = Some(slot);
                i
            }
            None => {
                c.slots.push(Some(slot));
                c.slots.len() - 1
            }
        };
        c.map.insert(key, i);
        c.used_bytes += bytes;
    }

    pub fn capacity_bytes(&self) -> usize {
        self.capacity_bytes
    }

    pub fn used_bytes(&self) -> usize {
        self.lock().used_bytes
    }

    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }
}
