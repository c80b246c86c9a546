//! Redis's keyspace on the store: what a key holds, when it expires, and
//! how a command reads and changes it. The layout is written down in
//! docs/FORMAT.md ("Serving keyspace").
//!
//! - `redis.keys` (database 0; `redis.keys.<n>` database n): Redis key →
//!   record ([`Entry`]): type, expiry, a string's bytes or a collection's
//!   object id and size (see [`crate::databases`] for the 16 databases);
//! - `redis.members`: `[object id u64 BE][sub-key]` → a member, for every
//!   collection (hash fields, list items, set and sorted-set members);
//! - `redis.expires` (`.<n>`): `[expire_at_ms u64 BE][key]` → empty, one entry per
//!   expiry ever set, in time order, so the background sweep reads only
//!   keys whose time has come (an entry whose key has since changed is
//!   dropped when the sweep reaches it);
//! - `redis.collections`: `[database u8][key]` → empty for each key that
//!   holds a collection; `redis.meta`: the object id ceiling, the
//!   database map and function libraries.
//!
//! A filter of the keys that may hold a collection
//! ([`Db::may_hold_collection`]) lets SET overwrite a key without reading
//! its old record: only a collection's members need removing with it, and
//! a key the filter has never seen as a collection holds none. It lives
//! in memory; at open a background scan of `redis.collections` fills it,
//! and until then every SET reads.
//!
//! Reads take no lock. Commands that read and then write (INCR, SET NX,
//! HSET, ...) hold the key's stripe lock from the read to the write, so
//! two threads cannot interleave on one key; a command on several keys
//! takes their stripes in order.

mod batch;
mod collections;
mod hints;
mod locks;
mod watch;

pub(crate) use batch::remove_entry;
pub use batch::{BatchRoom, Change, DbBatch, Swept};
use collections::{collection_index_range, CollectionKeys};
use hints::EndHintTable;
pub use hints::EndHints;
pub use locks::Locked;
pub use watch::Watched;

use crate::databases::{Databases, Space};
use crate::record::{Entry, Read, Value};
use sluice_store::{
    Found, Logged, ReadCache, Snapshot, Store, StoreError, StoreIter, ValueFormat, WriteBatch,
};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Name of the keyspace holding every key's record.
pub const KEYS_KEYSPACE: &str = "redis.keys";
/// Name of the keyspace holding every collection's members.
pub const MEMBERS_KEYSPACE: &str = "redis.members";
/// Name of the keyspace indexing keys by expiry time.
pub const EXPIRES_KEYSPACE: &str = "redis.expires";
/// Name of the keyspace listing the keys that hold a collection.
pub const COLLECTIONS_KEYSPACE: &str = "redis.collections";
/// Name of the keyspace of the keyspace's own records (the id ceiling).
pub const META_KEYSPACE: &str = "redis.meta";
/// Name of the keyspace hash fields were kept in before object ids
/// (docs/FORMAT.md, "Upgrade from the layout with `redis.fields`").
pub const LEGACY_FIELDS_KEYSPACE: &str = "redis.fields";
/// Stripe locks for read-modify-write commands.
const STRIPES: usize = 1024;
/// `redis.meta`'s key of the object id ceiling.
const ID_CEILING_KEY: &[u8] = b"id_ceiling";
/// How far each write of the ceiling raises it.
const ID_CEILING_STEP: u64 = 65536;

/// `redis.meta`'s keys of function libraries: this, then the library's
/// name (docs/FORMAT.md, "Function libraries").
const LIBRARY_PREFIX: &[u8] = b"library:";
/// The byte after `LIBRARY_PREFIX`'s last: the end of its range.
const LIBRARY_END: &[u8] = b"library;";
/// A hash field (or other member) and its value.
pub type FieldValue = (Vec<u8>, Vec<u8>);

/// The members' key prefix of collection `id`.
pub fn member_prefix(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

/// The store key of member `sub` of collection `id`.
pub fn member_key(id: u64, sub: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + sub.len());
    k.extend_from_slice(&id.to_be_bytes());
    k.extend_from_slice(sub);
    k
}

/// The keyspace of one server.
pub struct Db {
    store: Arc<Store>,
    databases: Databases,
    members: u32,
    collections: u32,
    meta: u32,
    stripes: Box<[Mutex<()>]>,
    /// Modification counters for WATCH, by key hash.
    versions: Box<[AtomicU64]>,
    /// Connections with a WATCH in force (see [`Watched`]).
    watchers: Arc<AtomicUsize>,
    cursors: Mutex<Cursors>,
    collection_keys: Arc<CollectionKeys>,
    /// The scan that fills `collection_keys` at open.
    filling: Mutex<Option<std::thread::JoinHandle<()>>>,
    ids: Mutex<Ids>,
    /// The data model's settings a server may change while serving.
    pub settings: Settings,
    /// Where pops from the ends of collections may start their scans.
    end_hints: EndHintTable,
}

/// What a server may tune in the data model while it serves (Redis's
/// `CONFIG SET` names). Of Redis's memory-encoding thresholds only the
/// hash's are here (they bound how long a hash keeps its field order):
/// every type keeps one layout on the device whatever its size.
#[derive(Debug)]
pub struct Settings {
    /// `stream-node-max-entries`: how many entries make one node, the unit
    /// `XADD`/`XTRIM ... ~` trims by (0: nodes bounded by bytes only, so
    /// approximate trimming removes nothing).
    pub stream_node_entries: AtomicU64,
    /// `hll-sparse-max-bytes`: a sparse HyperLogLog that would grow past
    /// this many bytes becomes dense.
    pub hll_sparse_max_bytes: AtomicU64,
    /// Whether batches list the keys they change (keyspace
    /// notifications are on): [`DbBatch::changes`].
    pub record_changes: AtomicBool,
    /// `hash-max-listpack-entries`: a hash with more fields loses its
    /// field order (docs/FORMAT.md, "Members").
    pub hash_order_entries: AtomicU64,
    /// `hash-max-listpack-value`: a field or value longer than this drops
    /// its hash's field order.
    pub hash_order_value_bytes: AtomicU64,
}

/// Redis's `hash-max-listpack-entries` default.
pub const HASH_ORDER_ENTRIES: u64 = 512;
/// Redis's `hash-max-listpack-value` default.
pub const HASH_ORDER_VALUE_BYTES: u64 = 64;

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            stream_node_entries: AtomicU64::new(crate::stream::NODE_ENTRIES),
            hll_sparse_max_bytes: AtomicU64::new(crate::hyperloglog::SPARSE_MAX_BYTES as u64),
            record_changes: AtomicBool::new(false),
            hash_order_entries: AtomicU64::new(HASH_ORDER_ENTRIES),
            hash_order_value_bytes: AtomicU64::new(HASH_ORDER_VALUE_BYTES),
        }
    }
}

/// The object id counter: ids below `ceiling` may be given without a
/// write; `ceiling` is what `redis.meta` holds.
struct Ids {
    next: u64,
    ceiling: u64,
}

impl Drop for Db {
    fn drop(&mut self) {
        self.collection_keys.stop.store(true, Ordering::Relaxed);
        let filling = self.filling.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(handle) = filling.take() {
            let _ = handle.join();
        }
    }
}

/// A function library as `redis.meta` keeps it: (name, code).
pub type StoredLibrary = (Vec<u8>, Vec<u8>);

fn library_key(name: &[u8]) -> Vec<u8> {
    [LIBRARY_PREFIX, name].concat()
}

/// Collections of at most this many member entries are removed entry by
/// entry, larger ones with one range delete.
pub const SMALL_COLLECTION_ENTRIES: u64 = 64;

/// WATCH's modification counters (a key shares one with the keys of the
/// same hash: a false "modified" is one in this many).
const VERSION_SLOTS: usize = 1 << 16;

/// SCAN cursors handed out: a number stands for the key the next call
/// starts at. Kept for the last [`MAX_CURSORS`] calls; an older cursor is
/// refused ("ERR invalid cursor") rather than silently restarted.
#[derive(Default)]
struct Cursors {
    next_id: u64,
    by_id: std::collections::HashMap<u64, Vec<u8>>,
    order: std::collections::VecDeque<u64>,
}

/// SCAN cursors remembered at once (each holds one key).
pub const MAX_CURSORS: usize = 65536;

/// A key's hash, computed once for its stripe lock and its WATCH counter.
///
/// Eight bytes at a time, each word mixed in with a multiply and a shift:
/// FNV's byte at a time took 2% of a worker's time at batch-1 SETs. Only
/// for locks and counters in memory; `Db::hash`, which long keys' expiry
/// index entries hold, stays as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyHash(u64);

impl KeyHash {
    /// The hash of `key`.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: 8 bytes"
    )]
    pub fn of(key: &[u8]) -> KeyHash {
        const MUL: u64 = 0xbf58_476d_1ce4_e5b9;
        let mix = |h: u64, word: u64| {
            let h = (h ^ word).wrapping_mul(MUL);
            h ^ (h >> 31)
        };
        let mut h = 0x9e37_79b9_7f4a_7c15 ^ key.len() as u64;
        let mut words = key.chunks_exact(8);
        for word in &mut words {
            h = mix(h, u64::from_le_bytes(word.try_into().expect("8 bytes")));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            h = mix(h, u64::from_le_bytes(last));
        }
        KeyHash(mix(h, 0) ^ (h >> 17))
    }

    fn stripe(self) -> usize {
        (self.0 % STRIPES as u64) as usize
    }

    /// The WATCH counter slot of the key in physical database
    /// `database` (the same key in two databases is two keys).
    fn version_slot(self, database: u8) -> usize {
        let h = self.0 ^ u64::from(database).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (h % VERSION_SLOTS as u64) as usize
    }
}

/// The expiry index's key for `key` expiring at `at_ms`, and its value:
/// `[at_ms u64 BE][key]` → empty; a key too long for that keeps its first
/// bytes and a hash of the whole key in the index key and the whole key
/// in the value.
fn expiry_entry(key: &[u8], at_ms: u64) -> (Vec<u8>, Vec<u8>) {
    const MAX: usize = sluice_store::batch::MAX_KEY_BYTES;
    let mut k = Vec::with_capacity(8 + key.len().min(MAX));
    k.extend_from_slice(&at_ms.to_be_bytes());
    if 8 + key.len() <= MAX {
        k.extend_from_slice(key);
        (k, Vec::new())
    } else {
        k.extend_from_slice(&key[..MAX - 16]);
        k.extend_from_slice(&Db::hash(key).to_be_bytes());
        (k, key.to_vec())
    }
}

/// The key and expiry time an expiry index entry stands for.
fn expiry_of(index_key: &[u8], value: &[u8]) -> Option<(Vec<u8>, u64)> {
    let at_ms = u64::from_be_bytes(index_key.get(..8)?.try_into().ok()?);
    let key = if value.is_empty() {
        index_key[8..].to_vec()
    } else {
        value.to_vec()
    };
    Some((key, at_ms))
}

impl Db {
    /// The keyspace on `store`, creating its store keyspaces if new, and
    /// upgrading hashes kept in the layout before object ids.
    pub fn open(store: Arc<Store>) -> Result<Db, StoreError> {
        let keyspace = |name: &str| match store.keyspace(name) {
            Ok(id) => Ok(id),
            Err(StoreError::UnknownKeyspace { .. }) => {
                store.create_keyspace(name, ValueFormat::Raw, "")
            }
            Err(e) => Err(e),
        };
        let members = keyspace(MEMBERS_KEYSPACE)?;
        let collections = keyspace(COLLECTIONS_KEYSPACE)?;
        let meta = keyspace(META_KEYSPACE)?;
        let ceiling = match store.get(meta, ID_CEILING_KEY)? {
            None => 1,
            Some(b) => sluice_io::codec::u64_at(&b, 0)
                .filter(|_| b.len() == 8)
                .ok_or_else(|| {
                    StoreError::BadInput("redis.meta's id ceiling is malformed".into())
                })?,
        };
        let databases = Databases::open(&store, meta)?;
        let db = Db {
            store,
            databases,
            members,
            collections,
            meta,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            versions: (0..VERSION_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            watchers: Arc::new(AtomicUsize::new(0)),
            cursors: Mutex::new(Cursors::default()),
            collection_keys: Arc::new(CollectionKeys::new()),
            filling: Mutex::new(None),
            ids: Mutex::new(Ids {
                next: ceiling,
                ceiling,
            }),
            settings: Settings::default(),
            end_hints: EndHintTable::default(),
        };
        crate::upgrade::legacy_hashes(&db)?;
        let (collection_keys, store) = (db.collection_keys.clone(), db.store.clone());
        let filling = std::thread::Builder::new()
            .name("sluice-collections".into())
            .spawn(move || {
                if let Err(e) = collection_keys.fill(&store, collections) {
                    log::error!(
                        "listing the stored collections failed ({e}): every SET reads the old record"
                    );
                }
            })
            .map_err(|e| {
                StoreError::BadInput(format!("starting the scan of stored collections: {e}"))
            })?;
        *db.filling.lock().unwrap_or_else(|p| p.into_inner()) = Some(filling);
        Ok(db)
    }

    /// Whether `key` may hold a collection (false: it certainly holds
    /// none, so a SET replaces its record without reading it). Ask while
    /// holding the key's stripe lock: a collection written under that lock
    /// before marked it.
    pub fn may_hold_collection(&self, key: &[u8]) -> bool {
        self.collection_keys.may_hold(key)
    }

    /// Whether the filter behind [`Db::may_hold_collection`] knows every
    /// stored collection yet (the scan at open finished).
    pub fn collection_filter_complete(&self) -> bool {
        self.collection_keys.complete.load(Ordering::Acquire)
    }

    /// A new object id, never given before (docs/FORMAT.md, "Object
    /// ids"). Raising the ceiling is a write of its own, logged before any
    /// batch that holds an id above the old ceiling.
    pub fn new_id(&self) -> Result<u64, StoreError> {
        let mut ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        if ids.next >= ids.ceiling {
            let ceiling = ids.next + ID_CEILING_STEP;
            self.store
                .put(self.meta, ID_CEILING_KEY, &ceiling.to_le_bytes())?;
            ids.ceiling = ceiling;
        }
        let id = ids.next;
        ids.next += 1;
        Ok(id)
    }

    /// The store keyspace of every collection's members.
    pub(crate) fn members_keyspace(&self) -> u32 {
        self.members
    }

    /// The physical database logical database `logical` (0 to 15) names
    /// now, its keyspaces created if it is used for the first time.
    pub fn space(&self, logical: u8) -> Result<Space, StoreError> {
        let physical = self.databases.physical_of(logical);
        self.databases.physical(&self.store, physical)
    }

    /// [`Db::space`] of a logical database used before: never creates
    /// anything. A SWAPDB creates both databases before it swaps them, so
    /// a logical database that named a created one always does.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a logical database used before names a created physical one"
    )]
    pub fn space_used(&self, logical: u8) -> Space {
        let physical = self.databases.physical_of(logical);
        self.databases
            .created(physical)
            .expect("a logical database used before names a created physical one")
    }

    /// The logical database that names physical database `index` now.
    pub fn logical_of(&self, index: u8) -> u8 {
        let map = self.databases.map();
        map.iter().position(|&p| p == index).unwrap_or(0) as u8
    }

    /// Physical database `index` if it was ever used.
    pub fn physical_space(&self, index: u8) -> Option<Space> {
        self.databases.created(index)
    }

    /// Every physical database ever used, in index order.
    pub fn spaces(&self) -> Vec<Space> {
        self.databases.all_created().collect()
    }

    /// Swaps logical databases `a` and `b` (SWAPDB): one write of the
    /// database map. The caller holds every stripe lock
    /// ([`Db::lock_all`]), so no command sees half of it.
    pub fn swap_databases(&self, a: u8, b: u8) -> Result<Logged, StoreError> {
        self.space(a)?;
        self.space(b)?;
        let mut map = self.databases.map();
        map.swap(usize::from(a), usize::from(b));
        let mut batch = WriteBatch::new();
        batch.put(self.meta, crate::databases::MAP_KEY, &map)?;
        let logged = self.store.write_logged(&batch)?;
        self.databases.set_map(&map);
        self.databases.note_swap(a, b);
        Ok(logged)
    }

    /// Whether physical database `space` holds no record, expired or not.
    pub fn space_is_empty(&self, space: Space) -> Result<bool, StoreError> {
        Ok(self.keys_from(space, &[], 1)?.is_empty())
    }

    /// The key SCAN cursor `id` resumes at.
    pub fn cursor(&self, id: u64) -> Option<Vec<u8>> {
        let cursors = self.cursors.lock().unwrap_or_else(|p| p.into_inner());
        cursors.by_id.get(&id).cloned()
    }

    /// A new SCAN cursor resuming at `key` (never 0, which means "start"
    /// and "done").
    pub fn save_cursor(&self, key: Vec<u8>) -> u64 {
        let mut c = self.cursors.lock().unwrap_or_else(|p| p.into_inner());
        c.next_id += 1;
        let id = c.next_id;
        c.by_id.insert(id, key);
        c.order.push_back(id);
        while c.order.len() > MAX_CURSORS {
            if let Some(old) = c.order.pop_front() {
                c.by_id.remove(&old);
            }
        }
        id
    }

    /// The store underneath.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    fn hash(key: &[u8]) -> u64 {
        // FNV-1a: cheap, and spread enough for stripes and slots.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in key {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        h
    }

    fn version_slot(database: u8, key: &[u8]) -> usize {
        KeyHash::of(key).version_slot(database)
    }

    /// Whether a string entry of `key` and `value` fits the store's limits.
    pub fn entry_fits(&self, key: &[u8], value: &[u8]) -> bool {
        key.len() <= sluice_store::batch::MAX_KEY_BYTES
            && value.len() + crate::record::HEADER_BYTES <= sluice_store::batch::MAX_VALUE_BYTES
    }

    /// A consistent view for a command that reads several keys.
    pub fn snapshot(&self) -> Snapshot {
        self.store.snapshot()
    }

    /// The stored entry of `key` in `space`, expired or not.
    pub fn get_raw(&self, space: Space, key: &[u8]) -> Result<Option<Entry>, StoreError> {
        self.get_raw_at(space, key, &self.store.snapshot())
    }

    /// [`Db::get_raw`] with no snapshot: for a command that reads one key
    /// once (`Store::get_latest`).
    pub fn get_raw_latest(&self, space: Space, key: &[u8]) -> Result<Option<Entry>, StoreError> {
        self.store
            .get_latest(space.keys, key)?
            .map(|b| Entry::decode(&b))
            .transpose()
    }

    /// [`Db::get_raw_latest`] with the record borrowed where the store
    /// holds it, through the calling thread's `cache` of the store's view: `f` sees it (None: no such key) and its result is
    /// returned. `f` runs under the store's read locks: keep it short.
    pub fn get_raw_latest_with<R>(
        &self,
        cache: &mut ReadCache,
        space: Space,
        key: &[u8],
        f: impl FnOnce(Option<Found<'_>>) -> R,
    ) -> Result<R, StoreError> {
        self.store.get_latest_cached(cache, space.keys, key, f)
    }

    /// Asks the memory for what reading `key`'s record will look at
    /// first ([`Store::prefetch_latest`]): a hint for a read to come.
    pub fn prefetch_record(&self, cache: &ReadCache, space: Space, key: &[u8]) {
        self.store.prefetch_latest(cache, space.keys, key);
    }

    /// [`Db::get_raw_latest_with`], or with `wait` false, what it would
    /// have to read from the device first (`Store::get_latest_or_miss`).
    pub fn get_raw_latest_or_miss<R>(
        &self,
        cache: &mut ReadCache,
        space: Space,
        key: &[u8],
        wait: bool,
        f: impl FnOnce(Option<Found<'_>>) -> R,
    ) -> Result<Result<R, sluice_store::CacheMiss>, StoreError> {
        self.store
            .get_latest_or_miss(cache, space.keys, key, wait, f)
    }

    /// The index or block reading `key`'s entry would wait for the device
    /// for, or `None` when the read needs no device read (or fails: the
    /// command that reads it then reports that). An answer found in memory
    /// is remembered in `cache` until the store's next write, so that the
    /// command's own read of the entry, right after, costs a lookup.
    pub fn miss_of_key(
        &self,
        cache: &mut ReadCache,
        space: Space,
        key: &[u8],
    ) -> Option<sluice_store::CacheMiss> {
        self.miss_in(cache, space.keys, key)
    }

    /// [`Db::miss_of_key`] for member `sub` of the collection at `key`:
    /// the miss of its record first, then, once that is cached, of the
    /// member's entry.
    pub fn miss_of_member(
        &self,
        cache: &mut ReadCache,
        space: Space,
        key: &[u8],
        sub: &[u8],
    ) -> Option<sluice_store::CacheMiss> {
        let record = self
            .store
            .get_latest_remembered(cache, space.keys, key, |found| {
                found.and_then(|f| Entry::decode_as(f.bytes(), Read::Shape).ok())
            });
        match record {
            Ok(Err(miss)) => Some(miss),
            Ok(Ok(Some(entry))) => {
                let c = entry.value.collection()?;
                self.miss_in(cache, self.members, &member_key(c.id, sub))
            }
            Ok(Ok(None)) | Err(_) => None,
        }
    }

    fn miss_in(
        &self,
        cache: &mut ReadCache,
        keyspace: u32,
        key: &[u8],
    ) -> Option<sluice_store::CacheMiss> {
        match self
            .store
            .get_latest_remembered(cache, keyspace, key, |_| ())
        {
            Ok(Err(miss)) => Some(miss),
            Ok(Ok(())) | Err(_) => None,
        }
    }

    /// The newest stored entry of `key` (expired or not), decoded as far
    /// as `read` says, through the calling thread's `cache` of the store's
    /// view: no snapshot is registered. For a command that holds `key`'s
    /// stripe lock, so no other write of it can land meanwhile.
    pub fn get_locked(
        &self,
        cache: &mut ReadCache,
        space: Space,
        key: &[u8],
        read: Read,
    ) -> Result<Option<Entry>, StoreError> {
        self.get_raw_latest_with(cache, space, key, |found| {
            found.map(|f| Entry::decode_as(f.bytes(), read)).transpose()
        })?
    }

    /// [`Db::get_raw`] as of `at`.
    pub fn get_raw_at(
        &self,
        space: Space,
        key: &[u8],
        at: &Snapshot,
    ) -> Result<Option<Entry>, StoreError> {
        self.store
            .get_at(space.keys, key, at)?
            .map(|b| Entry::decode(&b))
            .transpose()
    }

    /// Member `sub` of collection `id` as of `at`.
    pub fn member_at(
        &self,
        id: u64,
        sub: &[u8],
        at: &Snapshot,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.store.get_at(self.members, &member_key(id, sub), at)
    }

    /// Each of `subs`' values in collection `id` as of `at`, shown to
    /// `visit` with its place in `subs` ([`Store::get_each_at`]).
    pub fn member_each_at(
        &self,
        id: u64,
        subs: &[&[u8]],
        at: &Snapshot,
        visit: impl FnMut(usize, Option<&[u8]>),
    ) -> Result<(), StoreError> {
        let mut keys_bytes = Vec::with_capacity(subs.iter().map(|s| 8 + s.len()).sum());
        for sub in subs {
            keys_bytes.extend_from_slice(&id.to_be_bytes());
            keys_bytes.extend_from_slice(sub);
        }
        let mut keys = Vec::with_capacity(subs.len());
        let mut rest = &keys_bytes[..];
        for sub in subs {
            let (key, after) = rest.split_at(8 + sub.len());
            keys.push(key);
            rest = after;
        }
        self.store.get_each_at(self.members, &keys, at, visit)
    }

    /// The members of collection `id` whose sub-keys are in `range`, as of
    /// `at`, in sub-key order or (`reverse`) descending; keys come back
    /// whole (`[id][sub]`).
    pub fn members_at(
        &self,
        id: u64,
        range: (Bound<&[u8]>, Bound<&[u8]>),
        at: &Snapshot,
        reverse: bool,
    ) -> StoreIter {
        self.members_expecting(id, range, at, reverse, 0)
    }

    /// [`Db::members_at`] for a caller that expects to take about
    /// `expected` members (0: unknown): the first reads are sized for them.
    pub fn members_expecting(
        &self,
        id: u64,
        range: (Bound<&[u8]>, Bound<&[u8]>),
        at: &Snapshot,
        reverse: bool,
        expected: usize,
    ) -> StoreIter {
        let (lower, upper) = member_range(id, range);
        self.store.iter_expecting(
            self.members,
            (as_bound(&lower), as_bound(&upper)),
            at,
            reverse,
            expected,
        )
    }

    /// The store keyspace listing every key that holds a collection, and
    /// physical database `database`'s range of it.
    pub(crate) fn collections_of(&self, database: u8) -> (u32, (Vec<u8>, Vec<u8>)) {
        (self.collections, collection_index_range(database))
    }

    /// Every stored function library, by name.
    pub fn libraries(&self) -> Result<Vec<StoredLibrary>, StoreError> {
        let range = (
            Bound::Included(LIBRARY_PREFIX),
            Bound::Excluded(LIBRARY_END),
        );
        let mut out = Vec::new();
        for item in self
            .store
            .iter(self.meta, range, &self.store.snapshot(), false)
        {
            let (k, v) = item?;
            out.push((k[LIBRARY_PREFIX.len()..].to_vec(), v.to_vec()));
        }
        Ok(out)
    }

    /// Every stored key of `space` (expired ones too), in key order, from
    /// `start`.
    pub fn keys_from(
        &self,
        space: Space,
        start: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Entry)>, StoreError> {
        self.keys_from_at(space, start, limit, &self.store.snapshot())
    }

    /// [`Db::keys_from`] as of `at`.
    pub fn keys_from_at(
        &self,
        space: Space,
        start: &[u8],
        limit: usize,
        at: &Snapshot,
    ) -> Result<Vec<(Vec<u8>, Entry)>, StoreError> {
        let mut out = Vec::new();
        let range = (Bound::Included(start), Bound::Unbounded::<&[u8]>);
        for item in self.store.iter(space.keys, range, at, false) {
            let (k, v) = item?;
            out.push((k, Entry::decode(&v)?));
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// Removes up to `limit` keys whose expiry has passed at `now_ms`, in
    /// expiry order, and drops index entries whose key has changed since;
    /// returns how many index entries it went through (fewer than `limit`:
    /// nothing more is due) and the log position of the removals.
    ///
    /// Every database's index is swept, database 0 first, `limit` shared.
    /// The keys it removed come back while `Settings::record_changes` is
    /// on (keyspace notifications' `expired` events).
    pub fn sweep_expired(&self, now_ms: u64, limit: usize) -> Result<Swept, StoreError> {
        let mut swept = Swept::default();
        for space in self.spaces() {
            if swept.seen >= limit {
                break;
            }
            self.sweep_space(space, now_ms, limit - swept.seen, &mut swept)?;
        }
        Ok(swept)
    }

    fn sweep_space(
        &self,
        space: Space,
        now_ms: u64,
        limit: usize,
        swept: &mut Swept,
    ) -> Result<(), StoreError> {
        let due_below = now_ms.saturating_add(1).to_be_bytes();
        let range = (Bound::Unbounded::<&[u8]>, Bound::Excluded(&due_below[..]));
        let snapshot = self.store.snapshot();
        let mut due = Vec::new();
        for item in self.store.iter(space.expires, range, &snapshot, false) {
            let (index_key, value) = item?;
            due.push((index_key, value));
            if due.len() >= limit {
                break;
            }
        }
        swept.seen += due.len();
        for (index_key, value) in &due {
            let Some((key, at_ms)) = expiry_of(index_key, value) else {
                continue;
            };
            let _locked = self.lock(&[&key]);
            let mut b = self.batch(space);
            b.batch.delete(space.expires, index_key)?;
            let current = self.get_raw(space, &key)?;
            if let Some(e) = current.filter(|e| e.expire_at_ms == at_ms && e.expired(now_ms)) {
                let at = self.store.snapshot();
                remove_entry(&mut b, &key, &e.value, || {
                    self.member_subs_at(&e.value, &at)
                })?;
                swept.removed += 1;
            }
            let removed = b.take_changes();
            swept.position = swept.position.max(Some(b.commit()?.position));
            swept.expired.extend(removed);
        }
        Ok(())
    }

    /// Removes `key` from `space` if its record has expired at `now_ms`
    /// (a read found it so: Redis's lazy expiry), with its expiry index
    /// entry and its members, as the sweep removes it. Nothing happens if
    /// the key changed since and no longer expires by then.
    pub fn remove_if_expired(
        &self,
        space: Space,
        key: &[u8],
        now_ms: u64,
    ) -> Result<Swept, StoreError> {
        let mut swept = Swept::default();
        let _locked = self.lock(&[key]);
        let Some(e) = self.get_raw(space, key)?.filter(|e| e.expired(now_ms)) else {
            return Ok(swept);
        };
        let mut b = self.batch(space);
        let (index_key, _) = expiry_entry(key, e.expire_at_ms);
        b.batch.delete(space.expires, &index_key)?;
        let at = self.store.snapshot();
        remove_entry(&mut b, key, &e.value, || self.member_subs_at(&e.value, &at))?;
        swept.seen = 1;
        swept.removed = 1;
        swept.expired = b.take_changes();
        swept.position = Some(b.commit()?.position);
        Ok(swept)
    }

    /// Every member sub-key of a collection as of `at` (for removing a
    /// small one entry by entry).
    fn member_subs_at(&self, value: &Value, at: &Snapshot) -> Result<Vec<Vec<u8>>, StoreError> {
        let Some(c) = value.collection() else {
            return Ok(Vec::new());
        };
        let all = (Bound::Unbounded, Bound::Unbounded);
        self.members_at(c.id, all, at, false)
            .map(|item| item.map(|(k, _)| k[8..].to_vec()))
            .collect()
    }

    /// Whether every database's expiry index is empty.
    pub fn expiry_index_is_empty(&self) -> Result<bool, StoreError> {
        let all = (Bound::Unbounded::<&[u8]>, Bound::Unbounded);
        let snapshot = self.store.snapshot();
        for space in self.spaces() {
            let mut entries = self.store.iter(space.expires, all, &snapshot, false);
            if entries.next().transpose()?.is_some() {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// `[id][lower]` .. `[id][upper]` as owned bounds (an unbounded end: the
/// start of `id` or of `id + 1`).
fn member_range(id: u64, range: (Bound<&[u8]>, Bound<&[u8]>)) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let lower = match range.0 {
        Bound::Included(sub) => Bound::Included(member_key(id, sub)),
        Bound::Excluded(sub) => Bound::Excluded(member_key(id, sub)),
        Bound::Unbounded => Bound::Included(member_key(id, &[])),
    };
    let upper = match range.1 {
        Bound::Included(sub) => Bound::Included(member_key(id, sub)),
        Bound::Excluded(sub) => Bound::Excluded(member_key(id, sub)),
        Bound::Unbounded => match id.checked_add(1) {
            Some(next) => Bound::Excluded(member_key(next, &[])),
            None => Bound::Unbounded,
        },
    };
    (lower, upper)
}

fn as_bound(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k),
        Bound::Excluded(k) => Bound::Excluded(k),
        Bound::Unbounded => Bound::Unbounded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_hashes_spread_keys_over_stripes_and_slots() {
        // Keys as benchmarks and applications name them: a prefix and a
        // counter, where one byte or the length is all that differs.
        let keys: Vec<Vec<u8>> = (0..STRIPES as u32 * 64)
            .map(|i| format!("key:{i:012}").into_bytes())
            .chain((0..256u32).map(|i| i.to_le_bytes()[..(i % 4 + 1) as usize].to_vec()))
            .collect();
        let mut stripes = vec![0u32; STRIPES];
        let mut slots = std::collections::HashSet::new();
        for key in &keys {
            let hash = KeyHash::of(key);
            stripes[hash.stripe()] += 1;
            slots.insert(hash.version_slot(0));
        }
        let (fewest, most) = (stripes.iter().min().unwrap(), stripes.iter().max().unwrap());
        assert!(
            *fewest >= 32 && *most <= 110,
            "stripes hold {fewest} to {most} keys of 64 each"
        );
        assert!(
            slots.len() > keys.len() * 6 / 10,
            "{} slots for {} keys",
            slots.len(),
            keys.len()
        );
    }
}
