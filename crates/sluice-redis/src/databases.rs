//! Redis's 16 databases (`SELECT 0` to `15`): each physical database is
//! a pair of store keyspaces of its own (records, expiry index), and a
//! map says which physical database each logical one — the number a
//! client selects — names, so `SWAPDB` swaps two numbers instead of
//! moving keys (docs/FORMAT.md, "The collections index and the database
//! map").
//!
//! Physical database 0 is created at open; another the first time a
//! command uses it (SELECT, MOVE, COPY ... DB, SWAPDB), so a server that
//! never selects one has no keyspaces for it.

use sluice_store::{Store, StoreError, ValueFormat};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// How many databases a server has (Redis's default `databases 16`).
pub const DATABASES: usize = 16;

/// `redis.meta`'s key of the database map.
pub(crate) const MAP_KEY: &[u8] = b"databases";

/// One physical database: the store keyspaces of its records and its
/// expiry index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    pub(crate) index: u8,
    pub(crate) keys: u32,
    pub(crate) expires: u32,
}

impl Space {
    /// Which physical database this is (0 to 15).
    pub fn index(self) -> u8 {
        self.index
    }
}

/// The names of physical database `index`'s keyspaces: (records, expiry
/// index). Database 0 keeps the names it had before there were others.
fn keyspace_names(index: u8) -> (String, String) {
    let (keys, expires) = (crate::db::KEYS_KEYSPACE, crate::db::EXPIRES_KEYSPACE);
    match index {
        0 => (keys.into(), expires.into()),
        n => (format!("{keys}.{n}"), format!("{expires}.{n}")),
    }
}

/// The physical databases opened so far and the logical → physical map.
pub(crate) struct Databases {
    spaces: [OnceLock<Space>; DATABASES],
    /// Held while a database's keyspaces are created.
    creating: Mutex<()>,
    /// Four bits per logical database, database i at bits 4i to 4i+3: the
    /// physical database it names. One word, so a command resolves its
    /// database with one load.
    map: AtomicU64,
    /// SWAPDBs each logical database took part in (a WATCH notes them).
    swaps: [AtomicU64; DATABASES],
    /// FLUSHDBs and FLUSHALLs that emptied each physical database.
    flushes: [AtomicU64; DATABASES],
}

/// The identity map: logical database i is physical database i.
const IDENTITY: [u8; DATABASES] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

fn pack(map: &[u8; DATABASES]) -> u64 {
    map.iter()
        .enumerate()
        .fold(0, |word, (i, &p)| word | (u64::from(p) << (4 * i)))
}

fn unpack(word: u64) -> [u8; DATABASES] {
    std::array::from_fn(|i| ((word >> (4 * i)) & 0xf) as u8)
}

/// The map `redis.meta` holds, checked: a permutation of 0 to 15.
fn decode_map(bytes: &[u8]) -> Result<[u8; DATABASES], StoreError> {
    let malformed = |why: String| {
        StoreError::BadInput(format!(
            "redis.meta's database map is malformed ({why}); it is written by SWAPDB only: \
             restore the store from a backup"
        ))
    };
    let map: [u8; DATABASES] = bytes
        .try_into()
        .map_err(|_| malformed(format!("{} bytes, not {DATABASES}", bytes.len())))?;
    let mut seen = [false; DATABASES];
    for &p in &map {
        let slot = seen
            .get_mut(usize::from(p))
            .ok_or_else(|| malformed(format!("names database {p}")))?;
        if *slot {
            return Err(malformed(format!("names database {p} twice")));
        }
        *slot = true;
    }
    Ok(map)
}

impl Databases {
    /// The databases of `store`: the map `redis.meta` (`meta`) holds,
    /// database 0 (created if new) and every other one created before.
    pub(crate) fn open(store: &Store, meta: u32) -> Result<Databases, StoreError> {
        let map = match store.get(meta, MAP_KEY)? {
            None => IDENTITY,
            Some(bytes) => decode_map(&bytes)?,
        };
        let dbs = Databases {
            spaces: std::array::from_fn(|_| OnceLock::new()),
            creating: Mutex::new(()),
            map: AtomicU64::new(pack(&map)),
            swaps: std::array::from_fn(|_| AtomicU64::new(0)),
            flushes: std::array::from_fn(|_| AtomicU64::new(0)),
        };
        dbs.physical(store, 0)?;
        for index in 1..DATABASES as u8 {
            let (keys, expires) = keyspace_names(index);
            if let (Ok(keys), Ok(expires)) = (store.keyspace(&keys), store.keyspace(&expires)) {
                let _ = dbs.spaces[usize::from(index)].set(Space {
                    index,
                    keys,
                    expires,
                });
            }
        }
        Ok(dbs)
    }

    /// The physical database logical database `logical` names now.
    pub(crate) fn physical_of(&self, logical: u8) -> u8 {
        debug_assert!(usize::from(logical) < DATABASES);
        // One nibble of the packed map, not the whole map unpacked: every
        // command asks.
        let at = usize::from(logical) % DATABASES;
        ((self.map.load(Ordering::Acquire) >> (4 * at)) & 0xf) as u8
    }

    /// The map now: physical database of each logical one.
    pub(crate) fn map(&self) -> [u8; DATABASES] {
        unpack(self.map.load(Ordering::Acquire))
    }

    /// Installs `map` (SWAPDB, once it is logged).
    pub(crate) fn set_map(&self, map: &[u8; DATABASES]) {
        self.map.store(pack(map), Ordering::Release);
    }

    /// Physical database `index`, its keyspaces created if new.
    pub(crate) fn physical(&self, store: &Store, index: u8) -> Result<Space, StoreError> {
        let slot = &self.spaces[usize::from(index) % DATABASES];
        if let Some(space) = slot.get() {
            return Ok(*space);
        }
        let _creating = self.creating.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(space) = slot.get() {
            return Ok(*space);
        }
        let (keys, expires) = keyspace_names(index);
        let open_or_create = |name: &str| match store.keyspace(name) {
            Ok(id) => Ok(id),
            Err(StoreError::UnknownKeyspace { .. }) => {
                store.create_keyspace(name, ValueFormat::Raw, "")
            }
            Err(e) => Err(e),
        };
        let space = Space {
            index,
            keys: open_or_create(&keys)?,
            expires: open_or_create(&expires)?,
        };
        let _ = slot.set(space);
        Ok(space)
    }

    /// Physical database `index` if it was created.
    pub(crate) fn created(&self, index: u8) -> Option<Space> {
        self.spaces[usize::from(index) % DATABASES].get().copied()
    }

    /// Every physical database created so far, in index order.
    pub(crate) fn all_created(&self) -> impl Iterator<Item = Space> + '_ {
        self.spaces.iter().filter_map(|s| s.get().copied())
    }

    /// SWAPDBs logical database `logical` took part in.
    pub(crate) fn swaps(&self, logical: u8) -> u64 {
        self.swaps[usize::from(logical) % DATABASES].load(Ordering::Acquire)
    }

    /// Counts a SWAPDB of `a` and `b` (after its map is installed).
    pub(crate) fn note_swap(&self, a: u8, b: u8) {
        for logical in [a, b] {
            self.swaps[usize::from(logical) % DATABASES].fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Flushes that emptied physical database `index`.
    pub(crate) fn flushes(&self, index: u8) -> u64 {
        self.flushes[usize::from(index) % DATABASES].load(Ordering::Acquire)
    }

    /// Counts a flush of physical database `index`.
    pub(crate) fn note_flush(&self, index: u8) {
        self.flushes[usize::from(index) % DATABASES].fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_map_packs_into_one_word_and_back() {
        let mut map = IDENTITY;
        map.swap(0, 15);
        map.swap(3, 9);
        assert_eq!(unpack(pack(&map)), map);
        assert_eq!(unpack(pack(&IDENTITY)), IDENTITY);
    }

    #[test]
    fn a_map_that_is_no_permutation_is_refused() {
        assert!(decode_map(&IDENTITY).is_ok());
        let short = decode_map(&IDENTITY[..15]).unwrap_err().to_string();
        assert!(short.contains("15 bytes, not 16"), "{short}");
        let mut twice = IDENTITY;
        twice[4] = 3;
        let e = decode_map(&twice).unwrap_err().to_string();
        assert!(e.contains("names database 3 twice"), "{e}");
        let mut high = IDENTITY;
        high[0] = 16;
        let e = decode_map(&high).unwrap_err().to_string();
        assert!(e.contains("names database 16"), "{e}");
    }
}
