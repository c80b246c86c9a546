//! WATCH: the keys a connection watches and the modification counters
//! its EXEC checks them against.

use super::{Db, VERSION_SLOTS};
use sluice_store::StoreError;
use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicUsize, Ordering};
use std::sync::Arc;

/// The keys one connection WATCHes: each one's counter slot and its count
/// when watched. While it holds any, the connection is counted among the
/// [`Db`]'s watchers, and commits count their changes.
/// Keys share the 65,536 counter slots, so a connection holds at most one
/// entry a slot however many keys it watches: at most 65,536 entries
/// (about 1.5 MiB), whatever a client sends.
#[derive(Debug, Default)]
pub struct Watched {
    /// Counter slot → its count when first watched.
    keys: HashMap<usize, WatchedSlot>,
    /// Keys that existed with a time to live when watched, with their
    /// logical database: one that expires before EXEC aborts it, even
    /// before the sweep removes it (Redis 7's rule). At most
    /// [`VERSION_SLOTS`] of them; a WATCH of more such keys checks the
    /// first ones.
    expiring: Vec<(u8, Vec<u8>)>,
    /// Keys that did not exist when watched, with their logical database:
    /// after a SWAPDB of that database, one that exists now was brought in
    /// by it (Redis touches it). At most [`VERSION_SLOTS`] of them.
    absent: Vec<(u8, Vec<u8>)>,
    /// Each logical database watched in and its SWAPDB count then.
    databases: Vec<(u8, u64)>,
    /// The watcher count this WATCH is counted in, while it holds keys.
    counted: Option<Arc<AtomicUsize>>,
}

impl Watched {
    /// Forgets every key (UNWATCH, EXEC, DISCARD, RESET).
    pub fn clear(&mut self) {
        self.keys.clear();
        self.expiring.clear();
        self.absent.clear();
        self.databases.clear();
        if let Some(watchers) = self.counted.take() {
            watchers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.clear();
    }
}

/// What a WATCH noted of one counter slot.
#[derive(Debug, Clone, Copy)]
struct WatchedSlot {
    /// The slot's count when first watched.
    count: u64,
    /// The logical and the physical database of the key watched in it
    /// first.
    logical: u8,
    physical: u8,
    /// The physical database's flush count then.
    flushes: u64,
    /// Whether a key watched in the slot existed then: a FLUSHALL or
    /// FLUSHDB aborts the EXEC only for keys it removed, as in Redis.
    existed: bool,
}

impl Db {
    /// Adds `key` to a connection's WATCH: its counter slot and the count
    /// now, read after the connection is counted among the watchers (a
    /// commit that saw no watcher was applied before this).
    /// `logical` is the connection's database; the caller holds no lock
    /// (a SWAPDB meanwhile is seen as one after the WATCH).
    pub fn watch(
        &self,
        watched: &mut Watched,
        logical: u8,
        key: &[u8],
        now_ms: u64,
    ) -> Result<(), StoreError> {
        if watched.counted.is_none() {
            self.watchers.fetch_add(1, Ordering::SeqCst);
            watched.counted = Some(self.watchers.clone());
        }
        if !watched.databases.iter().any(|&(l, _)| l == logical) {
            let swaps = self.databases.swaps(logical);
            watched.databases.push((logical, swaps));
        }
        let space = self.space(logical)?;
        let slot = Db::version_slot(space.index, key);
        // Counted as watched before the key is read: a write between the
        // two is seen as a change.
        let count = self.versions[slot].load(Ordering::SeqCst);
        let flushes = self.databases.flushes(space.index);
        let live = self.get_raw(space, key)?.filter(|e| !e.expired(now_ms));
        let existed = live.is_some();
        let room = |list: &Vec<(u8, Vec<u8>)>| list.len() < VERSION_SLOTS;
        if live.is_some_and(|e| e.expire_at_ms != 0) && room(&watched.expiring) {
            watched.expiring.push((logical, key.to_vec()));
        }
        if !existed && room(&watched.absent) {
            watched.absent.push((logical, key.to_vec()));
        }
        // A slot watched before keeps its first count, as Redis keeps the
        // first WATCH of a key: a change since then aborts the EXEC.
        let entry = watched.keys.entry(slot).or_insert(WatchedSlot {
            count,
            logical,
            physical: space.index,
            flushes,
            existed,
        });
        entry.existed |= existed;
        Ok(())
    }

    /// Connections with a WATCH in force.
    pub fn watching_clients(&self) -> usize {
        self.watchers.load(Ordering::Relaxed)
    }

    /// Whether any key of a WATCH may have changed since it was watched:
    /// written, removed by a flush, or expired (at `now_ms`).
    ///
    /// A SWAPDB of a watched database touches the keys that existed in
    /// either of its two databases, as Redis's does: here, a key that
    /// existed when watched, or one absent then that exists now.
    pub fn changed_since(&self, watched: &Watched, now_ms: u64) -> Result<bool, StoreError> {
        let swapped: Vec<u8> = watched
            .databases
            .iter()
            .filter(|&&(logical, swaps)| self.databases.swaps(logical) != swaps)
            .map(|&(logical, _)| logical)
            .collect();
        let changed = watched.keys.iter().any(|(&slot, w)| {
            self.versions[slot].load(Ordering::Acquire) != w.count
                || (w.existed && w.flushes != self.databases.flushes(w.physical))
                || (w.existed && swapped.contains(&w.logical))
        });
        if changed {
            return Ok(true);
        }
        for (logical, key) in &watched.expiring {
            let space = self.space_used(*logical);
            if self.get_raw(space, key)?.is_none_or(|e| e.expired(now_ms)) {
                return Ok(true);
            }
        }
        for (logical, key) in watched.absent.iter().filter(|(l, _)| swapped.contains(l)) {
            let space = self.space_used(*logical);
            if self
                .get_raw(space, key)?
                .is_some_and(|e| !e.expired(now_ms))
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Counts a commit's changes for WATCH, when anyone watches: the
    /// counters are spread over half a MiB, so bumping one is a likely
    /// cache miss and a locked add on every write of a server where nobody
    /// uses WATCH.
    pub(super) fn count_changes(&self, touched: &[usize], flushed: &[u8]) {
        if touched.is_empty() && flushed.is_empty() {
            return;
        }
        // Pairs with the SeqCst add in `watch`: either the watcher is
        // seen here, or its counter reads come after this write.
        fence(Ordering::SeqCst);
        if self.watchers.load(Ordering::Relaxed) == 0 {
            return;
        }
        for &database in flushed {
            self.databases.note_flush(database);
        }
        for &slot in touched {
            self.versions[slot].fetch_add(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_holds_one_entry_a_counter_slot_however_many_keys() {
        let dev = Arc::new(sluice_io::MemoryDevice::new(4096, 64 << 10));
        let store = Arc::new(
            sluice_store::Store::create(dev, &sluice_store::StoreConfig::default()).unwrap(),
        );
        let db = Db::open(store).unwrap();
        let mut watched = Watched::default();
        for i in 0..300_000u32 {
            db.watch(&mut watched, 0, format!("key:{i}").as_bytes(), 0)
                .unwrap();
        }
        assert!(
            watched.keys.len() <= VERSION_SLOTS,
            "{}",
            watched.keys.len()
        );
        assert_eq!(db.watching_clients(), 1);
        assert!(!db.changed_since(&watched, 0).unwrap());
        watched.clear();
        assert_eq!(db.watching_clients(), 0);
    }
}
