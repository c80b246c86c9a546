//! Changes to the keyspace applied together: [`DbBatch`], and removing
//! a key with its members.

use super::collections::{collection_index_key, collection_index_range};
use super::{
    expiry_entry, library_key, member_key, member_prefix, Db, KeyHash, LIBRARY_END, LIBRARY_PREFIX,
    SMALL_COLLECTION_ENTRIES,
};
use crate::databases::Space;
use crate::record::{Entry, Value};
use sluice_store::{Logged, StoreError, WriteBatch};
use std::sync::atomic::Ordering;

impl Db {
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
    pub(super) batch: WriteBatch,
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
