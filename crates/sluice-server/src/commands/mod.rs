//! The data commands: strings, keys and expiry, hashes, and the server
//! commands that read the keyspace — each with Redis 7's arity, its checks
//! in Redis's order and its exact reply and error texts (checked against a
//! real `redis-server` in tests/commands_redis.rs).
//!
//! A command runs to completion on the calling thread: reads go straight
//! to the store (no lock), writes are applied at once (visible) and hand
//! back where their log record ends; the connection sends the reply once
//! the log is durable that far, as the server's durability mode asks.

mod glob;
mod hashes;
mod keys;
pub mod long_double;
mod server;
pub mod set_group;
mod strings;
pub use strings::{get_borrowed, get_borrowed_or_miss};

pub use glob::glob_match;

use crate::db::{Db, DbBatch, DbOp, Entry, Locked, Read, Value};
use crate::resp::{string_to_i64, Args, Reply};
use sluice_store::wal::LogPosition;
use sluice_store::{ReadCache, Snapshot, StoreError};
use std::collections::{BTreeMap, HashMap};

/// What a command handler returns: its reply, or an error reply.
type Outcome = Result<Reply, Failure>;

/// Keys (or fields) with their values.
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// Why a command failed: a Redis error text, or the store's.
#[derive(Debug)]
pub enum Failure {
    /// An error reply, already in Redis's words.
    Reply(String),
    /// The store failed under the command.
    Store(StoreError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

fn fail(text: &str) -> Failure {
    Failure::Reply(text.to_string())
}

pub(crate) const WRONGTYPE: &str =
    "WRONGTYPE Operation against a key holding the wrong kind of value";
pub(crate) const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
pub(crate) const SYNTAX: &str = "ERR syntax error";
pub(crate) const NOT_FLOAT: &str = "ERR value is not a valid float";
pub(crate) const OVERFLOW: &str = "ERR increment or decrement would overflow";
/// Redis's `proto-max-bulk-len` default: the longest string a command may make.
pub(crate) const STRING_MAX_BYTES: u64 = 512 << 20;

/// One command's run (or one transaction's): the keyspace, the time it
/// runs at, and the log position its writes need durable.
pub struct Ctx<'a> {
    db: &'a Db,
    now_ms: u64,
    wrote: Option<LogPosition>,
    /// Inside EXEC: the transaction's writes so far, read back by its
    /// later commands and committed as one batch at the end.
    tx: Option<Overlay<'a>>,
    /// Every read of the run sees the store as of one moment (MGET and
    /// its kind never see half of another connection's batch).
    snapshot: std::cell::OnceCell<Snapshot>,
    /// The serving thread's cache of the store's view, for reads of keys
    /// the run holds locked ([`Ctx::begin`]); None: a fresh one each read.
    reads: Option<&'a mut ReadCache>,
}

/// A transaction's uncommitted writes, as its own commands see them.
struct Overlay<'a> {
    batch: DbBatch<'a>,
    keys: BTreeMap<Vec<u8>, Option<Entry>>,
    fields: HashMap<Vec<u8>, FieldOverlay>,
    flushed: bool,
}

#[derive(Default)]
struct FieldOverlay {
    cleared: bool,
    set: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl Overlay<'_> {
    fn apply(&mut self, op: &DbOp) {
        match op {
            DbOp::Put(k, e) => {
                self.keys.insert(k.clone(), Some(e.clone()));
            }
            DbOp::Remove(k) => {
                self.keys.insert(k.clone(), None);
            }
            DbOp::RemoveFields(k) => {
                self.fields.insert(
                    k.clone(),
                    FieldOverlay {
                        cleared: true,
                        set: BTreeMap::new(),
                    },
                );
            }
            DbOp::PutField(k, f, v) => {
                let o = self.fields.entry(k.clone()).or_default();
                o.set.insert(f.clone(), Some(v.clone()));
            }
            DbOp::RemoveField(k, f) => {
                let o = self.fields.entry(k.clone()).or_default();
                o.set.insert(f.clone(), None);
            }
            DbOp::RemoveEverything => {
                self.keys.clear();
                self.fields.clear();
                self.flushed = true;
            }
        }
    }
}

impl<'a> Ctx<'a> {
    /// A run at `now_ms` (Unix ms).
    pub fn new(db: &'a Db, now_ms: u64) -> Self {
        Ctx {
            db,
            now_ms,
            wrote: None,
            tx: None,
            snapshot: std::cell::OnceCell::new(),
            reads: None,
        }
    }

    /// The run reads keys it holds locked through `reads`, the serving
    /// thread's cache of the store's view (kept from run to run).
    pub fn with_reads(mut self, reads: &'a mut ReadCache) -> Self {
        self.reads = Some(reads);
        self
    }

    /// A transaction's run: writes are held until [`Ctx::finish`]. The
    /// caller holds every stripe lock (`Db::lock_all`) meanwhile.
    pub fn transaction(db: &'a Db, now_ms: u64) -> Self {
        Ctx {
            tx: Some(Overlay {
                batch: db.recording_batch(),
                keys: BTreeMap::new(),
                fields: HashMap::new(),
                flushed: false,
            }),
            ..Ctx::new(db, now_ms)
        }
    }

    /// Commits a transaction's writes as one batch (all or none).
    pub fn finish(&mut self) -> Result<(), StoreError> {
        if let Some(tx) = self.tx.take() {
            if !tx.batch.is_empty() {
                let logged = tx.batch.commit()?;
                self.wrote = self.wrote.max(Some(logged.position));
            }
        }
        Ok(())
    }

    /// A batch for this run's changes (recording them in a transaction,
    /// whose overlay reads them back).
    fn batch(&self) -> DbBatch<'a> {
        if self.tx.is_some() {
            self.db.recording_batch()
        } else {
            self.db.batch()
        }
    }

    /// Removes `key` holding `value` in `batch`: a small hash field by
    /// field (its fields as this run sees them), anything else at once.
    fn remove(&self, batch: &mut DbBatch<'_>, key: &[u8], value: &Value) -> Result<(), StoreError> {
        match value {
            Value::Hash { len } if *len <= crate::db::SMALL_HASH_FIELDS => {
                batch.remove_small_hash(key, &self.fields(key)?)
            }
            _ => batch.remove(key, value),
        }
    }

    /// Where the log must be durable before the replies of this run go out.
    pub fn wrote(&self) -> Option<LogPosition> {
        self.wrote
    }

    fn commit(&mut self, batch: DbBatch<'_>) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        if let Some(tx) = &mut self.tx {
            for op in batch.ops() {
                tx.batch.apply(op)?;
                tx.apply(op);
            }
            return Ok(());
        }
        let logged = batch.commit()?;
        self.wrote = self.wrote.max(Some(logged.position));
        Ok(())
    }

    fn at(&self) -> &Snapshot {
        self.snapshot.get_or_init(|| self.db.snapshot())
    }

    /// Locks every stripe — unless a transaction holds them all.
    fn lock_all(&self) -> Option<Locked<'a>> {
        self.tx.is_none().then(|| self.db.lock_all())
    }

    /// Locks `keys`' stripes — unless a transaction holds them all.
    fn lock(&self, keys: &[&[u8]]) -> Option<Locked<'a>> {
        self.tx.is_none().then(|| self.db.lock(keys))
    }

    /// The stored entry of `key`, expired or not.
    fn get_raw(&self, key: &[u8]) -> Result<Option<Entry>, StoreError> {
        if let Some(tx) = &self.tx {
            if let Some(e) = tx.keys.get(key) {
                return Ok(e.clone());
            }
            if tx.flushed {
                return Ok(None);
            }
        }
        self.db.get_raw_at(key, self.at())
    }

    /// The live entry of `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Entry>, StoreError> {
        Ok(self.get_raw(key)?.filter(|e| !e.expired(self.now_ms)))
    }

    /// One field of hash `key`.
    fn field(&self, key: &[u8], field: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(tx) = &self.tx {
            if let Some(o) = tx.fields.get(key) {
                if let Some(v) = o.set.get(field) {
                    return Ok(v.clone());
                }
                if o.cleared {
                    return Ok(None);
                }
            }
            if tx.flushed {
                return Ok(None);
            }
        }
        self.db.field_at(key, field, self.at())
    }

    /// Every field of hash `key`, in field order.
    fn fields(&self, key: &[u8]) -> Result<Pairs, StoreError> {
        let Some(tx) = &self.tx else {
            return self.db.fields_at(key, self.at());
        };
        let o = tx.fields.get(key);
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> = if tx.flushed || o.is_some_and(|o| o.cleared) {
            BTreeMap::new()
        } else {
            self.db.fields_at(key, self.at())?.into_iter().collect()
        };
        for (f, v) in o.map(|o| &o.set).into_iter().flatten() {
            match v {
                Some(v) => merged.insert(f.clone(), v.clone()),
                None => merged.remove(f),
            };
        }
        Ok(merged.into_iter().collect())
    }

    /// Stored keys (expired too) from `start`, in order, at most `limit`.
    fn keys_from(&self, start: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Entry)>, StoreError> {
        let Some(tx) = &self.tx else {
            return self.db.keys_from_at(start, limit, self.at());
        };
        let mut merged: BTreeMap<Vec<u8>, Entry> = if tx.flushed {
            BTreeMap::new()
        } else {
            // Enough stored keys that the overlay's removals cannot leave
            // fewer than `limit` when more exist.
            self.db
                .keys_from_at(start, limit.saturating_add(tx.keys.len()), self.at())?
                .into_iter()
                .collect()
        };
        let stored_end = merged.keys().next_back().cloned();
        let full = !tx.flushed && merged.len() >= limit.saturating_add(tx.keys.len());
        for (k, e) in tx
            .keys
            .range::<[u8], _>((std::ops::Bound::Included(start), std::ops::Bound::Unbounded))
        {
            // Past the last stored key read, a stored key may be missing:
            // overlay keys there wait for the next look.
            if full && stored_end.as_ref().is_some_and(|end| k > end) {
                break;
            }
            match e {
                Some(e) => merged.insert(k.clone(), e.clone()),
                None => merged.remove(k),
            };
        }
        Ok(merged.into_iter().take(limit).collect())
    }

    /// [`Ctx::get_string`] for a command whose only read this is (GET):
    /// outside a transaction and before any other read it needs no
    /// snapshot.
    fn get_string_once(&self, key: &[u8]) -> Result<Option<(Vec<u8>, u64)>, Failure> {
        if self.tx.is_some() || self.snapshot.get().is_some() {
            return self.get_string(key);
        }
        let entry = self.db.get_raw_latest(key)?;
        Self::string_of(entry.filter(|e| !e.expired(self.now_ms)))
    }

    /// The live string at `key`; WRONGTYPE if it holds something else.
    fn get_string(&self, key: &[u8]) -> Result<Option<(Vec<u8>, u64)>, Failure> {
        Self::string_of(self.get(key)?)
    }

    /// A string entry's value and expiry; WRONGTYPE for another type.
    fn string_of(entry: Option<Entry>) -> Result<Option<(Vec<u8>, u64)>, Failure> {
        match entry {
            None => Ok(None),
            Some(Entry {
                value: Value::String(s),
                expire_at_ms,
            }) => Ok(Some((s, expire_at_ms))),
            Some(_) => Err(fail(WRONGTYPE)),
        }
    }

    /// A batch to change `key`, and its live entry. An expired entry is
    /// removed first in the same batch, so nothing of it (a hash's
    /// fields) outlives it.
    ///
    /// The caller holds `key`'s stripe lock (or, in a transaction, every
    /// stripe): outside a transaction the entry is read as it is now, with
    /// no snapshot, since no other write of it can land meanwhile.
    fn begin(&mut self, key: &[u8]) -> Result<(Option<Entry>, DbBatch<'a>), StoreError> {
        self.begin_reading(key, Read::Whole)
    }

    /// Whether a command that replaces `key`'s entry whatever it holds may
    /// do so without reading it: when the key holds no hash, outside a
    /// transaction (which reads through its overlay, as it always has).
    /// The caller holds `key`'s stripe lock.
    fn may_skip_read(&self, key: &[u8]) -> bool {
        self.tx.is_none() && !self.db.may_hold_hash(key)
    }

    /// [`Ctx::begin`] for a command that replaces the key's value without
    /// looking at it (SET): a string entry comes back without its bytes.
    fn begin_overwrite(&mut self, key: &[u8]) -> Result<(Option<Entry>, DbBatch<'a>), StoreError> {
        self.begin_reading(key, Read::Shape)
    }

    fn begin_reading(
        &mut self,
        key: &[u8],
        read: Read,
    ) -> Result<(Option<Entry>, DbBatch<'a>), StoreError> {
        let mut batch = self.batch();
        let stored = if self.tx.is_some() {
            self.get_raw(key)?
        } else {
            match self.reads.as_deref_mut() {
                Some(cache) => self.db.get_locked(cache, key, read)?,
                None => self.db.get_locked(&mut ReadCache::default(), key, read)?,
            }
        };
        match stored {
            Some(e) if e.expired(self.now_ms) => {
                self.remove(&mut batch, key, &e.value)?;
                Ok((None, batch))
            }
            live => Ok((live, batch)),
        }
    }
}

/// The stored entries a command reads, by where its arguments name them:
/// a server brings them in from the device before the command runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads {
    /// None it could name ahead (writes that read nothing, range walks,
    /// server commands).
    Unnamed,
    /// The entry of its first argument.
    FirstKey,
    /// The entry of every argument.
    EveryKey,
    /// The hash entry of its first argument and the field its second names.
    KeyAndField,
    /// The hash entry of its first argument and the fields every later
    /// argument names.
    KeyAndFields,
}

/// How a command is called: its name, Redis's arity (`n`: exactly n
/// arguments with the name; `-n`: at least n), and what it reads.
struct Spec {
    name: &'static str,
    arity: i32,
    run: fn(&mut Ctx<'_>, &Args) -> Outcome,
    reads: Reads,
}

const fn spec(name: &'static str, arity: i32, run: fn(&mut Ctx<'_>, &Args) -> Outcome) -> Spec {
    Spec {
        name,
        arity,
        run,
        reads: Reads::Unnamed,
    }
}

impl Spec {
    const fn reading(self, reads: Reads) -> Spec {
        Spec { reads, ..self }
    }
}

const COMMANDS: &[Spec] = &[
    spec("get", 2, strings::get).reading(Reads::FirstKey),
    spec("set", -3, strings::set),
    spec("setnx", 3, strings::setnx),
    spec("setex", 4, strings::setex),
    spec("psetex", 4, strings::psetex),
    spec("getset", 3, strings::getset).reading(Reads::FirstKey),
    spec("getdel", 2, strings::getdel).reading(Reads::FirstKey),
    spec("getex", -2, strings::getex).reading(Reads::FirstKey),
    spec("mget", -2, strings::mget).reading(Reads::EveryKey),
    spec("mset", -3, strings::mset),
    spec("msetnx", -3, strings::msetnx),
    spec("append", 3, strings::append).reading(Reads::FirstKey),
    spec("strlen", 2, strings::strlen).reading(Reads::FirstKey),
    spec("getrange", 4, strings::getrange).reading(Reads::FirstKey),
    spec("substr", 4, strings::getrange).reading(Reads::FirstKey),
    spec("setrange", 4, strings::setrange).reading(Reads::FirstKey),
    spec("incr", 2, strings::incr).reading(Reads::FirstKey),
    spec("decr", 2, strings::decr).reading(Reads::FirstKey),
    spec("incrby", 3, strings::incrby).reading(Reads::FirstKey),
    spec("decrby", 3, strings::decrby).reading(Reads::FirstKey),
    spec("incrbyfloat", 3, strings::incrbyfloat).reading(Reads::FirstKey),
    spec("del", -2, keys::del),
    spec("unlink", -2, keys::del),
    spec("exists", -2, keys::exists).reading(Reads::EveryKey),
    spec("type", 2, keys::type_of).reading(Reads::FirstKey),
    spec("rename", 3, keys::rename),
    spec("renamenx", 3, keys::renamenx),
    spec("copy", -3, keys::copy),
    spec("keys", 2, keys::keys),
    spec("scan", -2, keys::scan),
    spec("randomkey", 1, keys::randomkey),
    spec("expire", -3, keys::expire),
    spec("pexpire", -3, keys::pexpire),
    spec("expireat", -3, keys::expireat),
    spec("pexpireat", -3, keys::pexpireat),
    spec("ttl", 2, keys::ttl).reading(Reads::FirstKey),
    spec("pttl", 2, keys::pttl).reading(Reads::FirstKey),
    spec("expiretime", 2, keys::expiretime).reading(Reads::FirstKey),
    spec("pexpiretime", 2, keys::pexpiretime).reading(Reads::FirstKey),
    spec("persist", 2, keys::persist),
    spec("dbsize", 1, keys::dbsize),
    spec("flushdb", -1, keys::flush),
    spec("flushall", -1, keys::flush),
    spec("hset", -4, hashes::hset),
    spec("hmset", -4, hashes::hmset),
    spec("hsetnx", 4, hashes::hsetnx).reading(Reads::KeyAndField),
    spec("hget", 3, hashes::hget).reading(Reads::KeyAndField),
    spec("hmget", -3, hashes::hmget).reading(Reads::KeyAndFields),
    spec("hgetall", 2, hashes::hgetall),
    spec("hkeys", 2, hashes::hkeys),
    spec("hvals", 2, hashes::hvals),
    spec("hdel", -3, hashes::hdel),
    spec("hlen", 2, hashes::hlen).reading(Reads::FirstKey),
    spec("hexists", 3, hashes::hexists).reading(Reads::KeyAndField),
    spec("hstrlen", 3, hashes::hstrlen).reading(Reads::KeyAndField),
    spec("hincrby", 4, hashes::hincrby).reading(Reads::KeyAndField),
    spec("hincrbyfloat", 4, hashes::hincrbyfloat).reading(Reads::KeyAndField),
    spec("hscan", -3, hashes::hscan),
    spec("time", 1, server::time),
    spec("lastsave", 1, server::lastsave),
];

/// The names of the data commands and their arities, for COMMAND.
pub fn table() -> impl Iterator<Item = (&'static str, i32)> {
    COMMANDS.iter().map(|s| (s.name, s.arity))
}

/// Whether `name` (lower case) is a data command.
pub fn known(name: &[u8]) -> bool {
    find(name).is_some()
}

/// FNV-1a over a command name: names are a few bytes, where SipHash's
/// setup costs more than the lookup (this runs for every request).
#[derive(Default)]
struct NameHasher(u64);

impl std::hash::Hasher for NameHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type ByName = HashMap<&'static [u8], &'static Spec, std::hash::BuildHasherDefault<NameHasher>>;

fn find(name: &[u8]) -> Option<&'static Spec> {
    static BY_NAME: std::sync::OnceLock<ByName> = std::sync::OnceLock::new();
    BY_NAME
        .get_or_init(|| COMMANDS.iter().map(|s| (s.name.as_bytes(), s)).collect())
        .get(name)
        .copied()
}

/// Redis's arity error for `name`.
pub fn wrong_arity(name: &str) -> Reply {
    Reply::Error(format!(
        "ERR wrong number of arguments for '{name}' command"
    ))
}

/// What data command `name` (lower case) reads, where its arguments name
/// it; `Unnamed` for any other command.
pub fn reads(name: &[u8]) -> Reads {
    find(name).map_or(Reads::Unnamed, |s| s.reads)
}

/// Checks the arity of a data command: `None` if `args` fits, else the
/// error; `Some(None)`-like unknown commands are the caller's.
pub fn check_arity(name: &[u8], argc: usize) -> Option<Reply> {
    let spec = find(name)?;
    let ok = if spec.arity >= 0 {
        argc == spec.arity as usize
    } else {
        argc >= spec.arity.unsigned_abs() as usize
    };
    (!ok).then(|| wrong_arity(spec.name))
}

/// Runs data command `args` (name lower-cased in `name`, arity checked).
pub fn execute(ctx: &mut Ctx<'_>, name: &[u8], args: &Args) -> Reply {
    let Some(spec) = find(name) else {
        return crate::session::unknown_command(args);
    };
    match (spec.run)(ctx, args) {
        Ok(reply) => reply,
        Err(Failure::Reply(text)) => Reply::Error(text),
        Err(Failure::Store(e)) => Reply::Error(store_error_text(&e)),
    }
}

/// A store error as an error reply: one line, `ERR` first — or, when the
/// store cannot put writes on its device (nearly full, a flush failing),
/// `MISCONF` first, as Redis answers writes while it cannot persist
/// (`-MISCONF Errors writing to the AOF file: ...`).
fn store_error_text(e: &StoreError) -> String {
    let text = e.to_string().replace(['\r', '\n'], " ");
    match e {
        StoreError::WritesRefused(_) | StoreError::DeviceFull { .. } => {
            format!("MISCONF Errors writing to the device: {text}")
        }
        _ => format!("ERR {text}"),
    }
}

fn ok() -> Reply {
    Reply::Simple("OK".into())
}

fn int(n: i64) -> Reply {
    Reply::Integer(n)
}

fn parse_i64(arg: &[u8]) -> Result<i64, Failure> {
    string_to_i64(arg).ok_or_else(|| fail(NOT_INTEGER))
}

/// Redis's float step (INCRBYFLOAT, HINCRBYFLOAT): `current + by` in
/// long double, printed as Redis prints it. `current_error` is the reply
/// when `current` is not a float.
fn float_sum(current: &[u8], by: &[u8], current_error: &str) -> Result<String, Failure> {
    if long_double::LongDouble::parse(current).is_err() {
        return Err(fail(current_error));
    }
    long_double::incr_by_float(current, by).map_err(|e| match e {
        long_double::FloatStepError::NotAFloat => fail(NOT_FLOAT),
        long_double::FloatStepError::NotFinite => {
            fail("ERR increment would produce NaN or Infinity")
        }
    })
}
