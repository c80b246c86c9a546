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

/// Plain SETs waiting to be committed together, in arrival order.
#[derive(Debug, Default)]
pub struct SetGroup {
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

    fn key(&self, set: &Set) -> &[u8] {
        &self.bytes[set.start..set.start + set.key_len]
    }

    fn value(&self, set: &Set) -> &[u8] {
        let at = set.start + set.key_len;
        &self.bytes[at..at + set.value_len]
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    /// Whether it should be committed before it takes another.
    pub fn is_full(&self) -> bool {
        self.sets.len() >= MAX_SETS || self.bytes.len() >= MAX_BYTES
    }

    /// Commits every SET held (the group is empty after; its buffers keep
    /// their room for the next, up to [`KEPT_ROOM_BYTES`]).
    pub fn commit(&mut self, db: &Db) -> GroupOutcome {
        let locked = db.lock_hashes(self.sets.iter().map(|s| s.hash));
        let outcome = if self
            .sets
            .iter()
            .any(|s| db.may_hold_collection(self.key(s)))
        {
            drop(locked);
            let args = self
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
            GroupOutcome::OneByOne(args)
        } else {
            let outcome = self.commit_locked(db);
            drop(locked);
            outcome
        };
        self.sets.clear();
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
        let (logged, room) = batch.commit_keeping_room();
        self.room = room;
        match logged {
            Ok(logged) => GroupOutcome::Committed(logged),
            Err(e) => GroupOutcome::Failed(Reply::Error(store_error_text(&e))),
        }
    }
}
