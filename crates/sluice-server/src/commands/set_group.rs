//! Plain SETs of one serving pass, committed as one batch.
//!
//! With pipelining, a thread reads many `SET key value` at once; each
//! committed alone pays the store's write path (log append, memtable
//! locks, WAL bookkeeping, its stripe lock) once per command. A
//! [`SetGroup`] collects them and commits them together, under the stripe
//! locks of all their keys, before any reply goes out and before the next
//! command of another kind runs on that thread: a connection's later
//! commands see its SETs, and no client hears OK for a SET not yet
//! applied. Each SET takes effect at the group's commit, which lies between
//! its arrival and its reply.

use super::store_error_text;
use crate::resp::{Args, Reply};
use sluice_redis::db::{BatchRoom, Db, KeyHash};
use sluice_store::Logged;

/// SETs one group holds at most.
pub const MAX_SETS: usize = 256;
/// Key and value bytes one group holds at most.
pub const MAX_BYTES: usize = 1 << 20;

/// The most buffer room a group keeps between commits: one that took a
/// bigger SET lets its buffers go.
const KEPT_ROOM_BYTES: usize = 2 * MAX_BYTES;

/// Values at least this long go into a group without a copy: the group
/// takes the request buffer they arrived in ([`SetGroup::push_large`]).
pub const LARGE_VALUE_BYTES: usize = 1 << 20;

/// A SET of a large value, in the request buffer it arrived in.
#[derive(Debug)]
struct LargeSet {
    buf: Vec<u8>,
    key: std::ops::Range<usize>,
    value: std::ops::Range<usize>,
    hash: KeyHash,
    database: u8,
}

/// Plain SETs waiting to be committed together, in arrival order (a
/// large one last: a group that holds one is full).
#[derive(Debug, Default)]
pub struct SetGroup {
    large: Option<LargeSet>,
    sets: Vec<Set>,
    /// Every SET's key then value, one after another: a SET framed in
    /// place ([`SetGroup::push_set`]) allocates nothing.
    bytes: Vec<u8>,
    /// The last commit's batch buffers, for the next.
    room: BatchRoom,
}

/// One SET held: where its key and value lie in the group's bytes, and
/// its key's hash (for its stripe lock and WATCH slot).
#[derive(Debug)]
struct Set {
    start: usize,
    key_len: usize,
    value_len: usize,
    hash: KeyHash,
    /// The logical database of the connection that sent it.
    database: u8,
}

/// How a group's commit went.
#[derive(Debug)]
pub enum GroupOutcome {
    /// Every SET is applied, in one batch logged here.
    Committed(Logged),
    /// None is applied; each SET answers this error.
    Failed(Reply),
    /// A key may hold a hash (whose fields a SET must remove): none is
    /// applied, and each SET is to run on its own, in order.
    OneByOne(Vec<Args>),
}

impl SetGroup {
    /// Whether `args` is a SET a group can take: `SET key value` with no
    /// option, a key and value the store takes.
    pub fn takes(db: &Db, args: &Args) -> bool {
        args.len() == 3 && args[0].eq_ignore_ascii_case(b"set") && db.entry_fits(&args[1], &args[2])
    }

    /// Adds a SET [`SetGroup::takes`] accepted, of a connection in
    /// logical database `database`.
    pub fn push(&mut self, database: u8, args: Args) {
        debug_assert_eq!(args.len(), 3);
        self.push_set(database, &args[1], &args[2]);
    }

    /// Adds `SET key value` (which [`Db::entry_fits`]) in logical
    /// database `database`.
    pub fn push_set(&mut self, database: u8, key: &[u8], value: &[u8]) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(key);
        self.bytes.extend_from_slice(value);
        self.sets.push(Set {
            start,
            key_len: key.len(),
            value_len: value.len(),
            hash: KeyHash::of(key),
            database,
        });
    }

    /// Adds a SET [`SetGroup::takes`] of a large value that lies in
    /// `buf` (the request buffer it arrived in, key at `key`, value at
    /// `value`); the group is full after it.
    pub fn push_large(
        &mut self,
        database: u8,
        buf: Vec<u8>,
        key: std::ops::Range<usize>,
        value: std::ops::Range<usize>,
    ) {
        debug_assert!(self.large.is_none(), "a group holding a large SET is full");
        let hash = KeyHash::of(&buf[key.clone()]);
        self.large = Some(LargeSet {
            buf,
            key,
            value,
            hash,
            database,
        });
    }

    /// The keys of every SET held (the large one last).
    fn keys(&self) -> impl Iterator<Item = &[u8]> {
        let large = self.large.as_ref().map(|l| &l.buf[l.key.clone()]);
        self.sets.iter().map(|s| self.key(s)).chain(large)
    }

    fn key(&self, set: &Set) -> &[u8] {
        &self.bytes[set.start..set.start + set.key_len]
    }

    fn value(&self, set: &Set) -> &[u8] {
        let at = set.start + set.key_len;
        &self.bytes[at..at + set.value_len]
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty() && self.large.is_none()
    }

    /// Whether it should be committed before it takes another.
    pub fn is_full(&self) -> bool {
        self.sets.len() >= MAX_SETS || self.bytes.len() >= MAX_BYTES || self.large.is_some()
    }

    /// Commits every SET held (the group is empty after; its buffers keep
    /// their room for the next, up to [`KEPT_ROOM_BYTES`]).
    pub fn commit(&mut self, db: &Db) -> GroupOutcome {
        let large_hash = self.large.as_ref().map(|l| l.hash);
        let locked = match large_hash {
            None => db.lock_hashes(self.sets.iter().map(|s| s.hash)),
            Some(large) => {
                let mut hashes: Vec<KeyHash> = self.sets.iter().map(|s| s.hash).collect();
                hashes.push(large);
                db.lock_hashes(hashes.into_iter())
            }
        };
        let outcome = if self.keys().any(|k| db.may_hold_collection(k)) {
            drop(locked);
            let mut args: Vec<Args> = self
                .sets
                .iter()
                .map(|s| {
                    vec![
                        b"SET".to_vec(),
                        self.key(s).to_vec(),
                        self.value(s).to_vec(),
                    ]
                })
                .collect();
            if let Some(l) = self.large.take() {
                // Run one by one as any SET (rare: the key may hold a
                // collection, whose members go with it).
                let key = l.buf[l.key.clone()].to_vec();
                let mut buf = l.buf;
                buf.truncate(l.value.end);
                let value = buf.split_off(l.value.start);
                args.push(vec![b"SET".to_vec(), key, value]);
            }
            GroupOutcome::OneByOne(args)
        } else {
            let outcome = self.commit_locked(db);
            drop(locked);
            outcome
        };
        self.sets.clear();
        self.large = None;
        self.bytes.clear();
        if self.bytes.capacity() > KEPT_ROOM_BYTES {
            self.bytes = Vec::new();
            self.room = BatchRoom::default();
        }
        outcome
    }

    /// The batch of every SET held, committed (their stripes locked).
    fn commit_locked(&mut self, db: &Db) -> GroupOutcome {
        // Each database is resolved under the stripe locks: a SWAPDB holds
        // them all while it swaps.
        let mut batch = db.batch_in(db.space_used(0), std::mem::take(&mut self.room));
        for set in &self.sets {
            batch.switch_to(db.space_used(set.database));
            if let Err(e) = batch.put_string(self.key(set), set.hash, self.value(set)) {
                return GroupOutcome::Failed(Reply::Error(store_error_text(&e)));
            }
        }
        let (logged, room) = match &self.large {
            Some(l) => {
                batch.switch_to(db.space_used(l.database));
                let (key, value) = (&l.buf[l.key.clone()], &l.buf[l.value.clone()]);
                batch.commit_with_large_string(key, l.hash, value)
            }
            None => batch.commit_keeping_room(),
        };
        self.room = room;
        match logged {
            Ok(logged) => GroupOutcome::Committed(logged),
            Err(e) => GroupOutcome::Failed(Reply::Error(store_error_text(&e))),
        }
    }
}
