//! Redis's keyspace on the store: what a key holds, when it expires, and
//! how a command reads and changes it. The layout is written down in
//! docs/FORMAT.md ("Serving keyspace").
//!
//! - keyspace `redis.keys`: user key → `[type u8][expire_at_ms u64 LE]
//!   [payload]`; a string's payload is its bytes, a hash's its field count
//!   (u64 LE);
//! - keyspace `redis.fields`: `[key length u32 BE][key][field]` → value,
//!   one entry per hash field; a hash's fields go with one range delete.
//! - keyspace `redis.expires`: `[expire_at_ms u64 BE][key]` → empty, one
//!   entry per expiry ever set, in time order, so the background sweep
//!   reads only keys whose time has come (an entry whose key has since
//!   changed is dropped when the sweep reaches it).
//!
//! A filter of the keys that may hold a hash ([`Db::may_hold_hash`]) lets
//! SET overwrite a key without reading its old entry: only a hash's
//! fields need removing with it, and a key the filter has never seen as a
//! hash holds none. It lives in memory; at open a background scan of the
//! hash fields fills it, and until then every SET reads.
//!
//! Reads take no lock. Commands that read and then write (INCR, SET NX,
//! HSET, ...) hold the key's stripe lock from the read to the write, so
//! two threads cannot interleave on one key; a command on several keys
//! takes their stripes in order.

use sluice_store::{
    Found, Logged, ReadCache, Snapshot, Store, StoreError, ValueFormat, WriteBatch,
};
use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Name of the keyspace holding every key's type, expiry and string value.
pub const KEYS_KEYSPACE: &str = "redis.keys";
/// Name of the keyspace holding hash fields.
pub const FIELDS_KEYSPACE: &str = "redis.fields";
/// Name of the keyspace indexing keys by expiry time.
pub const EXPIRES_KEYSPACE: &str = "redis.expires";
/// Stripe locks for read-modify-write commands.
const STRIPES: usize = 1024;
const HEADER_BYTES: usize = 9;

/// What a key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A string.
    String(Vec<u8>),
    /// A hash with this many fields (the fields live in `redis.fields`).
    Hash {
        /// Number of fields.
        len: u64,
    },
}

impl Value {
    /// The type name TYPE prints.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::String(_) => "string",
            Value::Hash { .. } => "hash",
        }
    }
}

/// A key's value and expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The value.
    pub value: Value,
    /// Unix time in ms at which it expires; 0: never.
    pub expire_at_ms: u64,
}

impl Entry {
    /// A string that never expires.
    pub fn string(bytes: Vec<u8>) -> Entry {
        Entry {
            value: Value::String(bytes),
            expire_at_ms: 0,
        }
    }

    /// Hands `f` the record as pieces laid one after the other (its header,
    /// then the payload), so that a batch copies it once.
    fn with_pieces<R>(&self, f: impl FnOnce(&[&[u8]]) -> R) -> R {
        let mut header = [0u8; HEADER_BYTES];
        header[1..].copy_from_slice(&self.expire_at_ms.to_le_bytes());
        match &self.value {
            Value::String(s) => f(&[&header, s]),
            Value::Hash { len } => {
                header[0] = 1;
                f(&[&header, &len.to_le_bytes()])
            }
        }
    }

    /// [`Entry::with_pieces`] of a string `value` with no expiry.
    fn with_string_pieces<R>(value: &[u8], f: impl FnOnce(&[&[u8]]) -> R) -> R {
        f(&[&[0u8; HEADER_BYTES], value])
    }

    fn decode(bytes: &[u8]) -> Result<Entry, StoreError> {
        Entry::decode_as(bytes, Read::Whole)
    }

    fn decode_as(bytes: &[u8], read: Read) -> Result<Entry, StoreError> {
        if let Some((s, expire_at_ms)) = Entry::string_view(bytes)? {
            let s = match read {
                Read::Whole => s.to_vec(),
                Read::Shape => Vec::new(),
            };
            return Ok(Entry {
                value: Value::String(s),
                expire_at_ms,
            });
        }
        // string_view checked the header and the kind: a hash.
        let len = sluice_io::codec::u64_at(bytes, HEADER_BYTES)
            .filter(|_| bytes.len() == HEADER_BYTES + 8)
            .ok_or_else(|| StoreError::BadInput("a serving key's record is malformed".into()))?;
        Ok(Entry {
            value: Value::Hash { len },
            expire_at_ms: sluice_io::codec::u64_at(bytes, 1).expect("checked"),
        })
    }

    /// A record's string value and expiry, borrowed from `bytes`; None if
    /// it holds another type.
    pub fn string_view(bytes: &[u8]) -> Result<Option<(&[u8], u64)>, StoreError> {
        let bad = || StoreError::BadInput("a serving key's record is malformed".into());
        let expire_at_ms = sluice_io::codec::u64_at(bytes, 1).ok_or_else(bad)?;
        match bytes[0] {
            0 => Ok(Some((&bytes[HEADER_BYTES..], expire_at_ms))),
            1 => Ok(None),
            _ => Err(bad()),
        }
    }

    /// Whether it has expired at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.expire_at_ms != 0 && self.expire_at_ms <= now_ms
    }
}

/// How much of an entry a read decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// All of it.
    Whole,
    /// Its type, expiry and a hash's length; a string comes back empty
    /// (no copy of a value the caller is about to overwrite).
    Shape,
}

/// A hash field and its value.
pub type FieldValue = (Vec<u8>, Vec<u8>);

/// Bits of the filter of keys that may hold a hash (512 KiB): with 100,000
/// hashes about one SET in 40 reads an old entry it did not need to.
const HASH_KEY_BITS: usize = 1 << 22;

/// Which keys may hold a hash: one bit per key hash, set before a hash is
/// written at the key and never cleared (a key that stopped being a hash
/// only costs its SETs a read). `complete` once the scan at open has
/// marked every hash stored before it.
struct HashKeys {
    bits: Box<[AtomicU64]>,
    /// Whether any bit was ever set: while none is, a SET reads no bit
    /// (each a likely cache miss in half a MiB).
    any: AtomicBool,
    complete: AtomicBool,
    /// Asks the scan at open to stop (the keyspace is being dropped).
    stop: AtomicBool,
}

impl HashKeys {
    fn new() -> HashKeys {
        HashKeys {
            bits: (0..HASH_KEY_BITS / 64).map(|_| AtomicU64::new(0)).collect(),
            any: AtomicBool::new(false),
            complete: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        }
    }

    fn slot(key: &[u8]) -> (usize, u64) {
        let bit = (Db::hash(key) as usize) % HASH_KEY_BITS;
        (bit / 64, 1u64 << (bit % 64))
    }

    fn mark(&self, key: &[u8]) {
        let (word, mask) = HashKeys::slot(key);
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
        let (word, mask) = HashKeys::slot(key);
        self.bits[word].load(Ordering::Acquire) & mask != 0
    }

    /// Marks the key of every hash with fields in `fields` as of a
    /// snapshot taken now (hashes written later mark themselves), then
    /// says the filter is complete. Stops early, incomplete, when asked to.
    fn fill(&self, store: &Store, fields: u32) -> Result<(), StoreError> {
        let all = (
            std::ops::Bound::Unbounded::<&[u8]>,
            std::ops::Bound::Unbounded,
        );
        let mut last: Vec<u8> = Vec::new();
        for item in store.iter(fields, all, &store.snapshot(), false) {
            if self.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            let (field_key, _) = item?;
            let Some(key) = hash_key_of(&field_key) else {
                return Err(StoreError::BadInput(
                    "a hash field's key is malformed".into(),
                ));
            };
            if key != last.as_slice() {
                self.mark(key);
                last = key.to_vec();
            }
        }
        self.complete.store(true, Ordering::Release);
        Ok(())
    }
}

/// The hash key a field key (`[key length u32 BE][key][field]`) belongs to.
fn hash_key_of(field_key: &[u8]) -> Option<&[u8]> {
    let len = u32::from_be_bytes(field_key.get(..4)?.try_into().ok()?) as usize;
    field_key.get(4..4 + len)
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
    keys: HashMap<usize, u64>,
    /// The watcher count this WATCH is counted in, while it holds keys.
    counted: Option<Arc<AtomicUsize>>,
}

impl Watched {
    /// Forgets every key (UNWATCH, EXEC, DISCARD, RESET).
    pub fn clear(&mut self) {
        self.keys.clear();
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

/// The keyspace of one server.
pub struct Db {
    store: Arc<Store>,
    keys: u32,
    fields: u32,
    expires: u32,
    stripes: Box<[Mutex<()>]>,
    /// Modification counters for WATCH, by key hash.
    versions: Box<[AtomicU64]>,
    /// Connections with a WATCH in force (see [`Watched`]).
    watchers: Arc<AtomicUsize>,
    cursors: Mutex<Cursors>,
    hash_keys: Arc<HashKeys>,
    /// The scan that fills `hash_keys` at open.
    filling: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Db {
    fn drop(&mut self) {
        self.hash_keys.stop.store(true, Ordering::Relaxed);
        let filling = self.filling.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(handle) = filling.take() {
            let _ = handle.join();
        }
    }
}

/// Hashes of at most this many fields are removed field by field, larger
/// ones with one range delete.
pub const SMALL_HASH_FIELDS: u64 = 64;

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
/// for locks and counters in memory; `Db::hash`, which hash field keys
/// hold, stays as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyHash(u64);

impl KeyHash {
    /// The hash of `key`.
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

    fn version_slot(self) -> usize {
        (self.0 % VERSION_SLOTS as u64) as usize
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

/// The field key of `field` in hash `key`.
fn field_key(key: &[u8], field: &[u8]) -> Vec<u8> {
    let mut k = hash_prefix(key);
    k.extend_from_slice(field);
    k
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

/// Every field key of hash `key` starts with this.
fn hash_prefix(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + key.len());
    k.extend_from_slice(&(key.len() as u32).to_be_bytes());
    k.extend_from_slice(key);
    k
}

impl Db {
    /// The keyspace on `store`, creating its three store keyspaces if new.
    pub fn open(store: Arc<Store>) -> Result<Db, StoreError> {
        let keyspace = |name: &str| match store.keyspace(name) {
            Ok(id) => Ok(id),
            Err(StoreError::UnknownKeyspace { .. }) => {
                store.create_keyspace(name, ValueFormat::Raw, "")
            }
            Err(e) => Err(e),
        };
        let keys = keyspace(KEYS_KEYSPACE)?;
        let fields = keyspace(FIELDS_KEYSPACE)?;
        let expires = keyspace(EXPIRES_KEYSPACE)?;
        let db = Db {
            store,
            keys,
            fields,
            expires,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            versions: (0..VERSION_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            watchers: Arc::new(AtomicUsize::new(0)),
            cursors: Mutex::new(Cursors::default()),
            hash_keys: Arc::new(HashKeys::new()),
            filling: Mutex::new(None),
        };
        let (hash_keys, store) = (db.hash_keys.clone(), db.store.clone());
        let filling = std::thread::Builder::new()
            .name("sluice-hashkeys".into())
            .spawn(move || {
                if let Err(e) = hash_keys.fill(&store, fields) {
                    log::error!(
                        "listing the stored hashes failed ({e}): every SET reads the old entry"
                    );
                }
            })
            .map_err(|e| {
                StoreError::BadInput(format!("starting the scan of stored hashes: {e}"))
            })?;
        *db.filling.lock().unwrap_or_else(|p| p.into_inner()) = Some(filling);
        Ok(db)
    }

    /// Whether `key` may hold a hash (false: it certainly holds none, so a
    /// SET replaces its entry without reading it). Ask while holding the
    /// key's stripe lock: a hash written under that lock before marked it.
    pub fn may_hold_hash(&self, key: &[u8]) -> bool {
        self.hash_keys.may_hold(key)
    }

    /// Whether the filter behind [`Db::may_hold_hash`] knows every stored
    /// hash yet (the scan at open finished).
    pub fn hash_filter_complete(&self) -> bool {
        self.hash_keys.complete.load(Ordering::Acquire)
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

    fn version_slot(key: &[u8]) -> usize {
        KeyHash::of(key).version_slot()
    }

    /// Adds `key` to a connection's WATCH: its counter slot and the count
    /// now, read after the connection is counted among the watchers (a
    /// commit that saw no watcher was applied before this).
    pub fn watch(&self, watched: &mut Watched, key: &[u8]) {
        if watched.counted.is_none() {
            self.watchers.fetch_add(1, Ordering::SeqCst);
            watched.counted = Some(self.watchers.clone());
        }
        let slot = Db::version_slot(key);
        // A slot watched before keeps its first count, as Redis keeps the
        // first WATCH of a key: a change since then aborts the EXEC.
        watched
            .keys
            .entry(slot)
            .or_insert_with(|| self.versions[slot].load(Ordering::SeqCst));
    }

    /// Whether a string entry of `key` and `value` fits the store's limits.
    pub fn entry_fits(&self, key: &[u8], value: &[u8]) -> bool {
        key.len() <= sluice_store::batch::MAX_KEY_BYTES
            && value.len() + HEADER_BYTES <= sluice_store::batch::MAX_VALUE_BYTES
    }

    /// Connections with a WATCH in force.
    pub fn watching_clients(&self) -> usize {
        self.watchers.load(Ordering::Relaxed)
    }

    /// Whether any key of a WATCH may have changed since it was watched.
    pub fn changed_since(&self, watched: &Watched) -> bool {
        watched
            .keys
            .iter()
            .any(|(&slot, &count)| self.versions[slot].load(Ordering::Acquire) != count)
    }

    /// Counts a commit's changes for WATCH, when anyone watches: the
    /// counters are spread over half a MiB, so bumping one is a likely
    /// cache miss and a locked add on every write of a server where nobody
    /// uses WATCH.
    fn count_changes(&self, touched: &[usize], touched_all: bool) {
        if touched.is_empty() && !touched_all {
            return;
        }
        // Pairs with the SeqCst add in `watch`: either the watcher is
        // seen here, or its counter reads come after this write.
        fence(Ordering::SeqCst);
        if self.watchers.load(Ordering::Relaxed) == 0 {
            return;
        }
        if touched_all {
            self.touch_all();
        }
        for &slot in touched {
            self.versions[slot].fetch_add(1, Ordering::AcqRel);
        }
    }

    fn touch_all(&self) {
        for v in self.versions.iter() {
            v.fetch_add(1, Ordering::AcqRel);
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

    /// The stored entry of `key`, expired or not.
    pub fn get_raw(&self, key: &[u8]) -> Result<Option<Entry>, StoreError> {
        self.get_raw_at(key, &self.store.snapshot())
    }

    /// [`Db::get_raw`] with no snapshot: for a command that reads one key
    /// once (`Store::get_latest`).
    pub fn get_raw_latest(&self, key: &[u8]) -> Result<Option<Entry>, StoreError> {
        self.store
            .get_latest(self.keys, key)?
            .map(|b| Entry::decode(&b))
            .transpose()
    }

    /// [`Db::get_raw_latest`] with the record borrowed where the store
    /// holds it, through the calling thread's `cache` of the store's view: `f` sees it (None: no such key) and its result is
    /// returned. `f` runs under the store's read locks: keep it short.
    pub fn get_raw_latest_with<R>(
        &self,
        cache: &mut ReadCache,
        key: &[u8],
        f: impl FnOnce(Option<Found<'_>>) -> R,
    ) -> Result<R, StoreError> {
        self.store.get_latest_cached(cache, self.keys, key, f)
    }

    /// [`Db::get_raw_latest_with`], or with `wait` false, what it would
    /// have to read from the device first (`Store::get_latest_or_miss`).
    pub fn get_raw_latest_or_miss<R>(
        &self,
        cache: &mut ReadCache,
        key: &[u8],
        wait: bool,
        f: impl FnOnce(Option<Found<'_>>) -> R,
    ) -> Result<Result<R, sluice_store::CacheMiss>, StoreError> {
        self.store
            .get_latest_or_miss(cache, self.keys, key, wait, f)
    }

    /// The index or block reading `key`'s entry would wait for the device
    /// for, or `None` when the read needs no device read (or fails: the
    /// command that reads it then reports that).
    pub fn miss_of_key(
        &self,
        cache: &mut ReadCache,
        key: &[u8],
    ) -> Option<sluice_store::CacheMiss> {
        self.miss_in(cache, self.keys, key)
    }

    /// [`Db::miss_of_key`] for one field of hash `key`.
    pub fn miss_of_field(
        &self,
        cache: &mut ReadCache,
        key: &[u8],
        field: &[u8],
    ) -> Option<sluice_store::CacheMiss> {
        self.miss_in(cache, self.fields, &field_key(key, field))
    }

    fn miss_in(
        &self,
        cache: &mut ReadCache,
        keyspace: u32,
        key: &[u8],
    ) -> Option<sluice_store::CacheMiss> {
        match self
            .store
            .get_latest_or_miss(cache, keyspace, key, false, |_| ())
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
        key: &[u8],
        read: Read,
    ) -> Result<Option<Entry>, StoreError> {
        self.get_raw_latest_with(cache, key, |found| {
            found.map(|f| Entry::decode_as(f.bytes(), read)).transpose()
        })?
    }

    /// [`Db::get_raw`] as of `at`.
    pub fn get_raw_at(&self, key: &[u8], at: &Snapshot) -> Result<Option<Entry>, StoreError> {
        self.store
            .get_at(self.keys, key, at)?
            .map(|b| Entry::decode(&b))
            .transpose()
    }

    /// One hash field's value as of `at`.
    pub fn field_at(
        &self,
        key: &[u8],
        field: &[u8],
        at: &Snapshot,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.store.get_at(self.fields, &field_key(key, field), at)
    }

    /// Every field of hash `key` as of `at`, in field order.
    pub fn fields_at(&self, key: &[u8], at: &Snapshot) -> Result<Vec<FieldValue>, StoreError> {
        let prefix = hash_prefix(key);
        let mut out = Vec::new();
        for item in self.store.iter_prefix(self.fields, &prefix, at, false) {
            let (k, v) = item?;
            out.push((k[prefix.len()..].to_vec(), v));
        }
        Ok(out)
    }

    /// Every stored key (expired ones too), in key order, from `start`.
    pub fn keys_from(
        &self,
        start: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Entry)>, StoreError> {
        self.keys_from_at(start, limit, &self.store.snapshot())
    }

    /// [`Db::keys_from`] as of `at`.
    pub fn keys_from_at(
        &self,
        start: &[u8],
        limit: usize,
        at: &Snapshot,
    ) -> Result<Vec<(Vec<u8>, Entry)>, StoreError> {
        let mut out = Vec::new();
        let range = (
            std::ops::Bound::Included(start),
            std::ops::Bound::Unbounded::<&[u8]>,
        );
        for item in self.store.iter(self.keys, range, at, false) {
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
    pub fn sweep_expired(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> Result<(usize, Option<sluice_store::wal::LogPosition>), StoreError> {
        let due_below = now_ms.saturating_add(1).to_be_bytes();
        let range = (
            std::ops::Bound::Unbounded::<&[u8]>,
            std::ops::Bound::Excluded(&due_below[..]),
        );
        let snapshot = self.store.snapshot();
        let mut due = Vec::new();
        for item in self.store.iter(self.expires, range, &snapshot, false) {
            let (index_key, value) = item?;
            due.push((index_key, value));
            if due.len() >= limit {
                break;
            }
        }
        let mut position = None;
        for (index_key, value) in &due {
            let Some((key, at_ms)) = expiry_of(index_key, value) else {
                continue;
            };
            let _locked = self.lock(&[&key]);
            let mut b = self.batch();
            b.batch.delete(self.expires, index_key)?;
            let current = self.get_raw(&key)?;
            if let Some(e) = current.filter(|e| e.expire_at_ms == at_ms && e.expired(now_ms)) {
                match e.value {
                    Value::Hash { len } if len <= SMALL_HASH_FIELDS => {
                        b.remove_small_hash(&key, &self.fields_at(&key, &self.store.snapshot())?)?
                    }
                    ref value => b.remove(&key, value)?,
                }
            }
            position = position.max(Some(b.commit()?.position));
        }
        Ok((due.len(), position))
    }

    /// Whether the expiry index holds anything.
    pub fn expiry_index_is_empty(&self) -> Result<bool, StoreError> {
        let all = (
            std::ops::Bound::Unbounded::<&[u8]>,
            std::ops::Bound::Unbounded,
        );
        Ok(self
            .store
            .iter(self.expires, all, &self.store.snapshot(), false)
            .next()
            .transpose()?
            .is_none())
    }

    /// A batch for this keyspace.
    pub fn batch(&self) -> DbBatch<'_> {
        self.batch_in(BatchRoom::default())
    }

    /// [`Db::batch`] built in the room an earlier one left
    /// ([`DbBatch::commit_keeping_room`]): a batch a request allocates
    /// nothing for.
    pub fn batch_in(&self, room: BatchRoom) -> DbBatch<'_> {
        let BatchRoom {
            mut batch,
            mut touched,
        } = room;
        batch.clear();
        touched.clear();
        DbBatch {
            db: self,
            batch,
            ops: None,
            touched,
            touched_all: false,
        }
    }

    /// A batch that also keeps its changes as [`DbOp`]s, for a
    /// transaction that reads its own writes.
    pub fn recording_batch(&self) -> DbBatch<'_> {
        DbBatch {
            ops: Some(Vec::new()),
            ..self.batch()
        }
    }
}

/// One change a batch makes, kept so that a transaction reads its own
/// writes before they are committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbOp {
    /// `key` now holds this entry.
    Put(Vec<u8>, Entry),
    /// `key` is gone (a hash's fields go with a [`DbOp::RemoveFields`]).
    Remove(Vec<u8>),
    /// Every field of hash `key` is gone.
    RemoveFields(Vec<u8>),
    /// Hash `key`'s field now holds this value.
    PutField(Vec<u8>, Vec<u8>, Vec<u8>),
    /// Hash `key`'s field is gone.
    RemoveField(Vec<u8>, Vec<u8>),
    /// Every key and field is gone (FLUSHDB).
    RemoveEverything,
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
    batch: WriteBatch,
    /// The changes as DbOps, when asked for ([`Db::recording_batch`]).
    ops: Option<Vec<DbOp>>,
    /// WATCH counter slots of the keys changed.
    touched: Vec<usize>,
    touched_all: bool,
}

impl DbBatch<'_> {
    /// Stores `entry` at `key` (a hash's fields are written separately).
    pub fn put(&mut self, key: &[u8], entry: &Entry) -> Result<(), StoreError> {
        if let Value::Hash { .. } = entry.value {
            // Before the hash can be seen: a SET that skips reading the
            // key's entry must know.
            self.db.hash_keys.mark(key);
        }
        entry.with_pieces(|pieces| self.batch.put_parts(self.db.keys, key, pieces))?;
        if entry.expire_at_ms != 0 {
            let (k, v) = expiry_entry(key, entry.expire_at_ms);
            self.batch.put(self.db.expires, &k, &v)?;
        }
        self.record(key, || DbOp::Put(key.to_vec(), entry.clone()));
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
        Entry::with_string_pieces(value, |pieces| {
            self.batch.put_parts(self.db.keys, key, pieces)
        })?;
        self.touched.push(hash.version_slot());
        if let Some(ops) = &mut self.ops {
            let entry = Entry {
                value: Value::String(value.to_vec()),
                expire_at_ms: 0,
            };
            ops.push(DbOp::Put(key.to_vec(), entry));
        }
        Ok(())
    }

    /// Removes `key` and, for a hash, its fields (with one range delete:
    /// see [`DbBatch::remove_small_hash`] for hashes of few fields).
    pub fn remove(&mut self, key: &[u8], value: &Value) -> Result<(), StoreError> {
        self.remove_entry(key)?;
        if let Value::Hash { .. } = value {
            self.remove_fields(key)?;
        }
        Ok(())
    }

    /// Removes hash `key` whose fields are `fields`, one delete each: a
    /// range delete stays in the store until compaction and every read
    /// passes it, so small hashes do without.
    pub fn remove_small_hash(
        &mut self,
        key: &[u8],
        fields: &[FieldValue],
    ) -> Result<(), StoreError> {
        self.remove_entry(key)?;
        for (field, _) in fields {
            self.remove_field(key, field)?;
        }
        Ok(())
    }

    /// Removes `key`'s entry only.
    fn remove_entry(&mut self, key: &[u8]) -> Result<(), StoreError> {
        self.batch.delete(self.db.keys, key)?;
        self.record(key, || DbOp::Remove(key.to_vec()));
        Ok(())
    }

    /// Removes every key and field (FLUSHDB).
    pub fn remove_everything(&mut self) -> Result<(), StoreError> {
        // Keys are at most MAX_KEY_BYTES long: the only key at or past
        // this end is the end itself.
        let end = vec![0xffu8; sluice_store::batch::MAX_KEY_BYTES];
        for keyspace in [self.db.keys, self.db.fields, self.db.expires] {
            self.batch.delete_range(keyspace, &[], &end)?;
            self.batch.delete(keyspace, &end)?;
        }
        self.touched_all = true;
        if let Some(ops) = &mut self.ops {
            ops.push(DbOp::RemoveEverything);
        }
        Ok(())
    }

    /// Removes every field of hash `key`.
    pub fn remove_fields(&mut self, key: &[u8]) -> Result<(), StoreError> {
        let start = hash_prefix(key);
        match sluice_store::store::prefix_end(&start) {
            Some(end) => self.batch.delete_range(self.db.fields, &start, &end)?,
            None => unreachable!("a hash prefix starts with a length, not all 0xff"),
        };
        self.record(key, || DbOp::RemoveFields(key.to_vec()));
        Ok(())
    }

    /// Sets one field of hash `key`.
    pub fn put_field(&mut self, key: &[u8], field: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.batch
            .put(self.db.fields, &field_key(key, field), value)?;
        self.record(key, || {
            DbOp::PutField(key.to_vec(), field.to_vec(), value.to_vec())
        });
        Ok(())
    }

    /// Removes one field of hash `key`.
    pub fn remove_field(&mut self, key: &[u8], field: &[u8]) -> Result<(), StoreError> {
        self.batch.delete(self.db.fields, &field_key(key, field))?;
        self.record(key, || DbOp::RemoveField(key.to_vec(), field.to_vec()));
        Ok(())
    }

    /// Adds `op` (a change another batch recorded).
    pub fn apply(&mut self, op: &DbOp) -> Result<(), StoreError> {
        match op {
            DbOp::Put(k, e) => self.put(k, e),
            DbOp::Remove(k) => {
                self.batch.delete(self.db.keys, k)?;
                self.record(k, || op.clone());
                Ok(())
            }
            DbOp::RemoveFields(k) => self.remove_fields(k),
            DbOp::PutField(k, f, v) => self.put_field(k, f, v),
            DbOp::RemoveField(k, f) => self.remove_field(k, f),
            DbOp::RemoveEverything => self.remove_everything(),
        }
    }

    /// Notes a change of `key` (and keeps it as a DbOp when recording).
    fn record(&mut self, key: &[u8], op: impl FnOnce() -> DbOp) {
        self.touched.push(Db::version_slot(key));
        if let Some(ops) = &mut self.ops {
            ops.push(op());
        }
    }

    /// The changes so far, in order (empty unless recording).
    pub fn ops(&self) -> &[DbOp] {
        self.ops.as_deref().unwrap_or_default()
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

    /// [`DbBatch::commit`], handing back the batch's room for the next
    /// ([`Db::batch_in`]).
    pub fn commit_keeping_room(self) -> (Result<Logged, StoreError>, BatchRoom) {
        let logged = self.db.store.write_logged(&self.batch);
        if logged.is_ok() {
            self.db.count_changes(&self.touched, self.touched_all);
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
            db.watch(&mut watched, format!("key:{i}").as_bytes());
        }
        assert!(
            watched.keys.len() <= VERSION_SLOTS,
            "{}",
            watched.keys.len()
        );
        assert_eq!(db.watching_clients(), 1);
        assert!(!db.changed_since(&watched));
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
            slots.insert(hash.version_slot());
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

    #[test]
    fn a_grouped_sets_record_is_the_record_of_its_entry() {
        for value in [&b""[..], b"v", &[7u8; 300]] {
            let entry = Entry {
                value: Value::String(value.to_vec()),
                expire_at_ms: 0,
            };
            let record = entry.with_pieces(|pieces| pieces.concat());
            let grouped = Entry::with_string_pieces(value, |pieces| pieces.concat());
            assert_eq!(grouped, record);
            assert_eq!(Entry::decode(&grouped).unwrap(), entry);
        }
    }
}
