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

use crate::databases::{Databases, Space, DATABASES};
use crate::record::{Entry, Read, Value};
use sluice_store::{
    Found, Logged, ReadCache, Snapshot, Store, StoreError, StoreIter, ValueFormat, WriteBatch,
};
use std::collections::HashMap;
use std::ops::Bound;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

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

/// Bits of the filter of keys that may hold a collection (512 KiB): with
/// 100,000 collections about one SET in 40 reads an old record it did not
/// need to.
const COLLECTION_KEY_BITS: usize = 1 << 22;

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

/// `redis.collections`' key of `key` in physical database `database`.
fn collection_index_key(database: u8, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + key.len());
    k.push(database);
    k.extend_from_slice(key);
    k
}

/// `redis.collections`' range of physical database `database`: its
/// entries' keys are at least the first and below the second.
fn collection_index_range(database: u8) -> (Vec<u8>, Vec<u8>) {
    (vec![database], vec![database + 1])
}

/// Which keys may hold a collection: one bit per key hash, set before a
/// collection is written at the key and never cleared (a key that stopped
/// being one only costs its SETs a read). `complete` once the scan at open
/// has marked every collection stored before it.
struct CollectionKeys {
    bits: Box<[AtomicU64]>,
    /// Whether any bit was ever set: while none is, a SET reads no bit
    /// (each a likely cache miss in half a MiB).
    any: AtomicBool,
    complete: AtomicBool,
    /// Asks the scan at open to stop (the keyspace is being dropped).
    stop: AtomicBool,
}

impl CollectionKeys {
    fn new() -> CollectionKeys {
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

    fn mark(&self, key: &[u8]) {
        let (word, mask) = CollectionKeys::slot(key);
        self.any.store(true, Ordering::Release);
        self.bits[word].fetch_or(mask, Ordering::AcqRel);
    }

    fn may_hold(&self, key: &[u8]) -> bool {
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
    fn fill(&self, store: &Store, collections: u32) -> Result<(), StoreError> {
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

/// Most collections [`EndHints`] are kept for (the table is cleared when
/// it would grow past this: a hint is only a shortcut).
const END_HINTS_MOST: usize = 4096;

/// Where a scan for the first or last live member of a collection may
/// start: every live member's sub-key is `>= floor` and `<= ceiling`.
/// Pops from an end delete the members they take, and the store skips
/// each deleted entry until compaction drops it, so a queue popped from
/// its head would scan ever more of them; a pop starts at the hint its
/// last one left instead. Any member written to the collection forgets
/// its hints (the write may be outside them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndHints {
    /// No live member's sub-key is below this.
    pub floor: Option<Vec<u8>>,
    /// No live member's sub-key is above this.
    pub ceiling: Option<Vec<u8>>,
    /// Members popped at random since the hints were first set: deleted
    /// entries the store may still hold among the live ones.
    pub popped: u64,
}

#[derive(Debug, Default)]
struct EndHintTable {
    /// Whether `by_id` may hold anything (a member write looks first).
    any: AtomicBool,
    by_id: Mutex<HashMap<u64, EndHints>>,
    /// Live members a set's pops near its floor draw from next (see
    /// `set::pop_near_floor`), at most [`END_HINTS_MOST`] sets' worth.
    candidates: Mutex<HashMap<u64, Vec<Vec<u8>>>>,
}

impl EndHintTable {
    fn by_id(&self) -> std::sync::MutexGuard<'_, HashMap<u64, EndHints>> {
        self.by_id.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn candidates(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Vec<Vec<u8>>>> {
        self.candidates.lock().unwrap_or_else(|p| p.into_inner())
    }
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

/// Stripe locks held by a command, released on drop.
pub struct Locked<'a> {
    _guards: Guards<'a>,
}

/// One stripe (most commands: one key) needs no list.
enum Guards<'a> {
    One(#[allow(dead_code)] MutexGuard<'a, ()>),
    Many(#[allow(dead_code)] Vec<MutexGuard<'a, ()>>),
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
    /// The [`EndHints`] of collection `id` (none known: both open).
    pub fn end_hints(&self, id: u64) -> EndHints {
        if !self.end_hints.any.load(Ordering::Acquire) {
            return EndHints::default();
        }
        self.end_hints.by_id().get(&id).cloned().unwrap_or_default()
    }

    /// Records that no live member of collection `id` is below (`floor`)
    /// or above sub-key `at`. The caller holds the collection's key
    /// locked and has committed the removals that make it true (never
    /// inside a transaction, whose batch could still fail as a whole; in
    /// a group's run, taken in to be committed before the key is unlocked,
    /// with every hint dropped if that commit fails).
    pub fn set_end_hint(&self, id: u64, floor: bool, at: Vec<u8>) {
        let mut by_id = self.end_hints.by_id();
        if by_id.len() >= END_HINTS_MOST && !by_id.contains_key(&id) {
            by_id.clear();
        }
        let hints = by_id.entry(id).or_default();
        if floor {
            hints.floor = Some(at);
        } else {
            hints.ceiling = Some(at);
        }
        self.end_hints.any.store(true, Ordering::Release);
    }

    /// Counts `n` members of collection `id` popped at random (committed,
    /// outside a transaction); nothing while it has no hints.
    pub fn count_pops(&self, id: u64, n: u64) {
        if !self.end_hints.any.load(Ordering::Acquire) {
            return;
        }
        let mut by_id = self.end_hints.by_id();
        if let Some(hints) = by_id.get_mut(&id) {
            hints.popped = hints.popped.saturating_add(n);
        }
    }

    /// Takes one of the members a pop of set `id` may draw next, at
    /// random (see [`Db::set_pop_candidates`]); None when none are left.
    pub fn take_pop_candidate(&self, id: u64, rng: &mut impl rand::Rng) -> Option<Vec<u8>> {
        if !self.end_hints.any.load(Ordering::Acquire) {
            return None;
        }
        let mut all = self.end_hints.candidates();
        let list = all.get_mut(&id)?;
        if list.is_empty() {
            all.remove(&id);
            return None;
        }
        let at = rng.gen_range(0..list.len());
        Some(list.swap_remove(at))
    }

    /// Keeps `members` of set `id`, live when the caller (holding the
    /// set's key locked) read them, for its next pops to draw from. A
    /// later removal may leave one stale, so a pop checks what it draws;
    /// any member written forgets them with the hints.
    pub fn set_pop_candidates(&self, id: u64, members: Vec<Vec<u8>>) {
        let mut all = self.end_hints.candidates();
        if all.len() >= END_HINTS_MOST && !all.contains_key(&id) {
            all.clear();
        }
        all.insert(id, members);
        self.end_hints.any.store(true, Ordering::Release);
    }

    /// Drops every collection's hints (a group's batch that set some
    /// failed to commit).
    pub(crate) fn forget_every_end_hint(&self) {
        self.end_hints.by_id().clear();
        self.end_hints.candidates().clear();
    }

    /// Drops collection `id`'s hints (a member is being written).
    fn forget_end_hints(&self, id: u64) {
        if self.end_hints.any.load(Ordering::Acquire) {
            self.end_hints.by_id().remove(&id);
            self.end_hints.candidates().remove(&id);
        }
    }

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

    /// Whether a string entry of `key` and `value` fits the store's limits.
    pub fn entry_fits(&self, key: &[u8], value: &[u8]) -> bool {
        key.len() <= sluice_store::batch::MAX_KEY_BYTES
            && value.len() + crate::record::HEADER_BYTES <= sluice_store::batch::MAX_VALUE_BYTES
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
    fn count_changes(&self, touched: &[usize], flushed: &[u8]) {
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

    /// Locks every stripe (EXEC: no read-modify-write command runs
    /// meanwhile).
    pub fn lock_all(&self) -> Locked<'_> {
        Locked {
            _guards: Guards::Many(
                self.stripes
                    .iter()
                    .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()))
                    .collect(),
            ),
        }
    }

    /// Locks the stripes of `keys` (in stripe order, so two commands
    /// cannot deadlock) until the returned guard drops.
    pub fn lock<'a>(&'a self, keys: &[&[u8]]) -> Locked<'a> {
        self.lock_hashes(keys.iter().map(|k| KeyHash::of(k)))
    }

    /// [`Db::lock`] of the keys whose hashes these are.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: one hash"
    )]
    pub fn lock_hashes(&self, mut hashes: impl ExactSizeIterator<Item = KeyHash>) -> Locked<'_> {
        if hashes.len() == 1 {
            let only = hashes.next().expect("one hash");
            return self.lock_stripe(only.stripe());
        }
        let mut stripes: Vec<usize> = hashes.map(KeyHash::stripe).collect();
        stripes.sort_unstable();
        stripes.dedup();
        Locked {
            _guards: Guards::Many(
                stripes
                    .into_iter()
                    .map(|s| self.stripes[s].lock().unwrap_or_else(|p| p.into_inner()))
                    .collect(),
            ),
        }
    }

    /// Locks one stripe.
    fn lock_stripe(&self, stripe: usize) -> Locked<'_> {
        let guard = self.stripes[stripe]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        Locked {
            _guards: Guards::One(guard),
        }
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

    /// A batch of changes to `space` (and the members of its
    /// collections).
    pub fn batch(&self, space: Space) -> DbBatch<'_> {
        self.batch_in(space, BatchRoom::default())
    }

    /// [`Db::batch`] built in the room an earlier one left
    /// ([`DbBatch::commit_keeping_room`]): a batch a request allocates
    /// nothing for.
    pub fn batch_in(&self, space: Space, room: BatchRoom) -> DbBatch<'_> {
        let BatchRoom {
            mut batch,
            mut touched,
        } = room;
        batch.clear();
        touched.clear();
        DbBatch {
            db: self,
            space,
            batch,
            touched,
            flushed: Vec::new(),
            changes: self
                .settings
                .record_changes
                .load(Ordering::Relaxed)
                .then(Vec::new),
        }
    }

    /// A transaction's batch, which takes in its commands' batches
    /// (whatever database each changes).
    pub fn recording_batch(&self) -> DbBatch<'_> {
        self.batch(self.space_used(0))
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

/// Removes `key`, holding `value`, in `batch`: its record, and a
/// collection's members — one delete per entry for a small one (`subs`
/// lists its sub-keys; a list's are computed), else one range delete.
pub(crate) fn remove_entry(
    batch: &mut DbBatch<'_>,
    key: &[u8],
    value: &Value,
    subs: impl FnOnce() -> Result<Vec<Vec<u8>>, StoreError>,
) -> Result<(), StoreError> {
    batch.remove_record(key, value)?;
    let Some(c) = value.collection() else {
        return Ok(());
    };
    if value.member_entries() > SMALL_COLLECTION_ENTRIES {
        return batch.delete_members(key, c.id);
    }
    if let Value::List { head, .. } = value {
        for i in 0..c.len {
            batch.delete_member(key, c.id, &head.wrapping_add(i).to_be_bytes())?;
        }
        return Ok(());
    }
    for sub in subs()? {
        batch.delete_member(key, c.id, &sub)?;
    }
    Ok(())
}

/// The buffers of a spent [`DbBatch`], for the next one to build in (as
/// big as the biggest batch built in them: a SET group's, at most
/// `set_group::MAX_BYTES` and a little).
#[derive(Debug, Default)]
pub struct BatchRoom {
    batch: WriteBatch,
    touched: Vec<usize>,
}

/// Changes to the keyspace applied together ([`DbBatch::commit`]).
pub struct DbBatch<'a> {
    db: &'a Db,
    /// The database whose records it changes.
    space: Space,
    batch: WriteBatch,
    /// WATCH counter slots of the keys changed.
    touched: Vec<usize>,
    /// Physical databases emptied.
    flushed: Vec<u8>,
    /// While keyspace notifications are on: each key changed, in the
    /// order first changed, and whether its record is gone at the end.
    changes: Option<Vec<Change>>,
}

/// What one pass of the expiry sweep did.
#[derive(Debug, Default)]
pub struct Swept {
    /// Expiry index entries gone through (fewer than asked: nothing more
    /// is due).
    pub seen: usize,
    /// The log position of its removals.
    pub position: Option<sluice_store::wal::LogPosition>,
    /// The keys it removed, while changes are recorded.
    pub expired: Vec<Change>,
    /// How many keys it removed (INFO's `expired_keys`).
    pub removed: usize,
}

/// A key a batch changed (keyspace notifications).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Its physical database.
    pub database: u8,
    /// The Redis key.
    pub key: Vec<u8>,
    /// Whether the batch removed its record (and wrote none after).
    pub removed: bool,
    /// Whether the key held nothing before the command that changed it
    /// (set by [`crate::Ctx::take_changes`]).
    pub created: bool,
    /// Events the data model names itself, told before the command's own
    /// (a stream consumer a read or a claim makes).
    pub events: Vec<&'static str>,
}

impl DbBatch<'_> {
    /// The database whose records the batch changes.
    pub fn space(&self) -> Space {
        self.space
    }

    /// Changes the records of `space` from now on (MOVE, COPY ... DB: one
    /// batch removes a key from one database and writes it to another).
    pub fn switch_to(&mut self, space: Space) {
        self.space = space;
    }

    /// Stores `entry` at `key`, over a record of the same collection (or
    /// any string); see [`DbBatch::put_new`] for a collection's first.
    pub fn put(&mut self, key: &[u8], entry: &Entry) -> Result<(), StoreError> {
        if entry.value.collection().is_some() {
            // Before the collection can be seen: a SET that skips reading
            // the key's record must know.
            self.db.collection_keys.mark(key);
        }
        let space = self.space;
        entry.with_pieces(|pieces| self.batch.put_parts(space.keys, key, pieces))?;
        if entry.expire_at_ms != 0 {
            let (k, v) = expiry_entry(key, entry.expire_at_ms);
            self.batch.put(space.expires, &k, &v)?;
        }
        self.touch(key);
        self.note_change(key, Some(false));
        Ok(())
    }

    /// [`DbBatch::put`] of a collection's first record at `key` (a new
    /// object id, or one moved from another key): lists it in
    /// `redis.collections` too.
    pub fn put_new(&mut self, key: &[u8], entry: &Entry) -> Result<(), StoreError> {
        self.put(key, entry)?;
        if entry.value.collection().is_some() {
            let index_key = collection_index_key(self.space.index, key);
            self.batch.put(self.db.collections, &index_key, &[])?;
        }
        Ok(())
    }

    /// A plain string `value` at `key` with no expiry, whose [`KeyHash`]
    /// is known: [`DbBatch::put`] for a group of SETs, with the value
    /// borrowed.
    pub fn put_string(
        &mut self,
        key: &[u8],
        hash: KeyHash,
        value: &[u8],
    ) -> Result<(), StoreError> {
        let space = self.space;
        Entry::with_string_pieces(value, |pieces| {
            self.batch.put_parts(space.keys, key, pieces)
        })?;
        self.touched.push(hash.version_slot(space.index));
        self.note_change(key, Some(false));
        Ok(())
    }

    /// Writes a changed collection's record, or removes it once the
    /// collection is empty (Redis removes an empty collection's key); a
    /// `new` collection that ends empty never had a record to remove.
    /// Not for a stream, which Redis keeps when it empties.
    pub fn finish_collection(
        &mut self,
        key: &[u8],
        value: Value,
        expire_at_ms: u64,
        new: bool,
    ) -> Result<(), StoreError> {
        debug_assert!(
            !matches!(value, Value::Stream { .. }),
            "a stream stays when empty"
        );
        let empty = value.collection().is_some_and(|c| c.len == 0);
        if empty {
            return if new {
                Ok(())
            } else {
                self.remove_record(key, &value)
            };
        }
        let entry = Entry {
            value,
            expire_at_ms,
        };
        if new {
            self.put_new(key, &entry)
        } else {
            self.put(key, &entry)
        }
    }

    /// Removes `key`'s record (and its `redis.collections` entry); a
    /// collection's members are the caller's ([`remove_entry`]).
    pub fn remove_record(&mut self, key: &[u8], value: &Value) -> Result<(), StoreError> {
        self.batch.delete(self.space.keys, key)?;
        if value.collection().is_some() {
            let index_key = collection_index_key(self.space.index, key);
            self.batch.delete(self.db.collections, &index_key)?;
        }
        self.touch(key);
        self.note_change(key, Some(true));
        Ok(())
    }

    /// Removes every key of every database and every member (FLUSHALL;
    /// FLUSHDB when no other database holds a record).
    pub fn remove_all_databases(&mut self) -> Result<(), StoreError> {
        let db = self.db;
        for space in db.spaces() {
            self.remove_keyspace(space.keys)?;
            self.remove_keyspace(space.expires)?;
            self.flushed.push(space.index);
        }
        self.remove_keyspace(db.members)?;
        self.remove_keyspace(db.collections)
    }

    /// Removes every record and expiry of the batch's database and its
    /// range of `redis.collections` (FLUSHDB while another database holds
    /// records): the members of its collections are the caller's, with
    /// [`DbBatch::remove_members_of`].
    pub fn remove_database_records(&mut self) -> Result<(), StoreError> {
        let space = self.space;
        self.remove_keyspace(space.keys)?;
        self.remove_keyspace(space.expires)?;
        let (from, to) = collection_index_range(space.index);
        self.batch.delete_range(self.db.collections, &from, &to)?;
        self.flushed.push(space.index);
        Ok(())
    }

    /// Removes the members of collection `id` once no record names it.
    pub fn remove_members_of(&mut self, id: u64) -> Result<(), StoreError> {
        let start = member_prefix(id);
        match id.checked_add(1) {
            Some(next) => self
                .batch
                .delete_range(self.db.members, &start, &member_prefix(next))?,
            None => {
                let end = vec![0xffu8; sluice_store::batch::MAX_KEY_BYTES];
                self.batch.delete_range(self.db.members, &start, &end)?;
                self.batch.delete(self.db.members, &end)?
            }
        };
        Ok(())
    }

    fn remove_keyspace(&mut self, keyspace: u32) -> Result<(), StoreError> {
        // Keys are at most MAX_KEY_BYTES long: the only key at or past
        // this end is the end itself.
        let end = vec![0xffu8; sluice_store::batch::MAX_KEY_BYTES];
        self.batch.delete_range(keyspace, &[], &end)?;
        self.batch.delete(keyspace, &end)?;
        Ok(())
    }

    /// Sets member `sub` of collection `id` (at `key`) to `value`.
    pub fn put_member(
        &mut self,
        key: &[u8],
        id: u64,
        sub: &[u8],
        value: &[u8],
    ) -> Result<(), StoreError> {
        self.db.forget_end_hints(id);
        self.batch
            .put(self.db.members, &member_key(id, sub), value)?;
        self.touch(key);
        Ok(())
    }

    /// Removes member `sub` of collection `id` (at `key`).
    pub fn delete_member(&mut self, key: &[u8], id: u64, sub: &[u8]) -> Result<(), StoreError> {
        self.batch.delete(self.db.members, &member_key(id, sub))?;
        self.touch(key);
        Ok(())
    }

    /// Removes every member of collection `id` (at `key`) with one range
    /// delete.
    pub fn delete_members(&mut self, key: &[u8], id: u64) -> Result<(), StoreError> {
        self.remove_members_of(id)?;
        self.touch(key);
        Ok(())
    }

    /// Notes a change of `key` for WATCH (and notifications).
    fn touch(&mut self, key: &[u8]) {
        self.touched.push(Db::version_slot(self.space.index, key));
        self.note_change(key, None);
    }

    /// Lists `key` among the changes, when they are recorded. `record`:
    /// Some(true) its record is removed, Some(false) written, None only
    /// its members change.
    fn note_change(&mut self, key: &[u8], record: Option<bool>) {
        let database = self.space.index;
        let Some(changes) = &mut self.changes else {
            return;
        };
        match changes
            .iter_mut()
            .find(|c| c.database == database && c.key == key)
        {
            // What the record's last write or removal left.
            Some(c) => c.removed = record.unwrap_or(c.removed),
            None => changes.push(Change {
                database,
                key: key.to_vec(),
                removed: record == Some(true),
                created: false,
                events: Vec::new(),
            }),
        }
    }

    /// Whether the batch lists the keys it changes (keyspace
    /// notifications are on).
    pub fn records_changes(&self) -> bool {
        self.changes.is_some()
    }

    /// Tells `event` of `key` (a change of it), when changes are recorded.
    pub fn note_event(&mut self, key: &[u8], event: &'static str) {
        self.note_change(key, None);
        let database = self.space.index;
        if let Some(c) = self.changes.as_mut().and_then(|changes| {
            changes
                .iter_mut()
                .find(|c| c.database == database && c.key == key)
        }) {
            // Once a command: a claim sees its consumer again per entry.
            if !c.events.contains(&event) {
                c.events.push(event);
            }
        }
    }

    /// The keys changed so far (empty unless
    /// `Settings::record_changes` was on when the batch began).
    pub fn take_changes(&mut self) -> Vec<Change> {
        self.changes
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Adds the changes `other` holds (a transaction takes in each of its
    /// commands' batches); returns them for the transaction's overlay.
    pub(crate) fn absorb(&mut self, other: DbBatch<'_>) -> Result<WriteBatch, StoreError> {
        use sluice_store::batch::OpKind;
        for op in other.batch.ops() {
            match op.kind {
                OpKind::Put => self.batch.put(op.keyspace, op.key, op.value)?,
                OpKind::Delete => self.batch.delete(op.keyspace, op.key)?,
                OpKind::RangeDelete => self.batch.delete_range(op.keyspace, op.key, op.value)?,
                OpKind::PutBlob => unreachable!("only the store makes blob references"),
            };
        }
        self.touched.extend_from_slice(&other.touched);
        self.flushed.extend_from_slice(&other.flushed);
        if let (Some(mine), Some(theirs)) = (&mut self.changes, other.changes) {
            mine.extend(theirs);
        }
        Ok(other.batch)
    }

    /// Stores function library `name`'s `code` (FUNCTION LOAD).
    pub fn put_library(&mut self, name: &[u8], code: &[u8]) -> Result<(), StoreError> {
        self.batch.put(self.db.meta, &library_key(name), code)?;
        Ok(())
    }

    /// Removes function library `name` (FUNCTION DELETE).
    pub fn delete_library(&mut self, name: &[u8]) -> Result<(), StoreError> {
        self.batch.delete(self.db.meta, &library_key(name))?;
        Ok(())
    }

    /// Removes every function library (FUNCTION FLUSH).
    pub fn delete_libraries(&mut self) -> Result<(), StoreError> {
        self.batch
            .delete_range(self.db.meta, LIBRARY_PREFIX, LIBRARY_END)?;
        Ok(())
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }

    /// Applies the batch (visible at once; durable when the log says so)
    /// and marks every key it changed as modified for WATCH.
    pub fn commit(self) -> Result<Logged, StoreError> {
        self.commit_keeping_room().0
    }

    /// [`DbBatch::commit_keeping_room`] with, after the batch's changes, a
    /// plain SET of `value` at `key` (hash `hash`) in the batch's current
    /// database, its value written to the store's blob file from where it
    /// lies: a value of hundreds of MiB is not copied into the batch.
    pub fn commit_with_large_string(
        mut self,
        key: &[u8],
        hash: KeyHash,
        value: &[u8],
    ) -> (Result<Logged, StoreError>, BatchRoom) {
        let space = self.space;
        self.touched.push(hash.version_slot(space.index));
        self.note_change(key, Some(false));
        let logged = Entry::with_string_pieces(value, |pieces| {
            let large = sluice_store::LargePut {
                keyspace: space.keys,
                key,
                value: pieces,
            };
            self.db.store.write_logged_large(&self.batch, &[large])
        });
        self.finish_commit(logged)
    }

    /// [`DbBatch::commit`], handing back the batch's room for the next
    /// ([`Db::batch_in`]).
    pub fn commit_keeping_room(self) -> (Result<Logged, StoreError>, BatchRoom) {
        let logged = self.db.store.write_logged(&self.batch);
        self.finish_commit(logged)
    }

    /// Counts a commit's changes once it is logged, and gives the room back.
    fn finish_commit(
        self,
        logged: Result<Logged, StoreError>,
    ) -> (Result<Logged, StoreError>, BatchRoom) {
        if logged.is_ok() {
            self.db.count_changes(&self.touched, &self.flushed);
        }
        let room = BatchRoom {
            batch: self.batch,
            touched: self.touched,
        };
        (logged, room)
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
