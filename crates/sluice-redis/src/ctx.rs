//! One command's run (or one transaction's) over the keyspace: the time
//! it runs at, the snapshot its reads share, the log position its writes
//! need durable, and, in a transaction, the writes so far that its later
//! commands read back.

use crate::databases::Space;
use crate::db::{remove_entry, Db, DbBatch, Locked};
use crate::error::{fail, Failure, WRONGTYPE};
use crate::overlay::{Item, Overlay};
use crate::record::{Entry, Read, Value};
use sluice_store::wal::LogPosition;
use sluice_store::{ReadCache, Snapshot, StoreError};
use std::cell::Cell;
use std::ops::Bound;

/// A command's run over the keyspace.
pub struct Ctx<'a> {
    db: &'a Db,
    /// The logical database the run is in (SELECT changes it in a
    /// transaction or a script) and the physical one it names.
    logical: Cell<u8>,
    space: Cell<Space>,
    now_ms: u64,
    wrote: Option<LogPosition>,
    /// Inside EXEC: the transaction's writes so far, read back by its
    /// later commands and committed as one batch at the end.
    tx: Option<Tx<'a>>,
    /// The keys the run's batches changed, while keyspace notifications
    /// are on (`Settings::record_changes`).
    changes: Vec<crate::db::Change>,
    /// Keys found holding nothing when the run began changing them
    /// (physical database, key), while changes are recorded.
    absent: std::cell::RefCell<Vec<(u8, Vec<u8>)>>,
    /// Every read of the run sees the store as of one moment (MGET and
    /// its kind never see half of another connection's batch).
    snapshot: std::cell::OnceCell<Snapshot>,
    /// The serving thread's cache of the store's view, for reads of keys
    /// the run holds locked ([`Ctx::begin`]); None: a fresh one each read.
    reads: Option<&'a mut ReadCache>,
    /// Keys its reads found expired (physical database, key).
    expired_seen: std::cell::RefCell<Vec<(Space, Vec<u8>)>>,
    /// A group's run ([`Ctx::gathering`]): its commands' batches, taken
    /// in and committed as one at [`Ctx::finish`].
    gathered: Option<DbBatch<'a>>,
}

/// Most expired keys one run notes for lazy removal (the sweep takes the
/// rest).
pub const MAX_EXPIRED_SEEN: usize = 16;

/// A transaction's batch and its writes indexed for reading.
struct Tx<'a> {
    batch: DbBatch<'a>,
    overlay: Overlay,
}

/// A sub-key and its member, or the store's error reading them.
pub type MemberItem = Result<(Vec<u8>, Vec<u8>), StoreError>;

impl<'a> Ctx<'a> {
    /// A run at `now_ms` (Unix ms), in database 0.
    pub fn new(db: &'a Db, now_ms: u64) -> Self {
        Ctx {
            db,
            logical: Cell::new(0),
            space: Cell::new(db.space_used(0)),
            now_ms,
            wrote: None,
            tx: None,
            changes: Vec::new(),
            absent: std::cell::RefCell::new(Vec::new()),
            snapshot: std::cell::OnceCell::new(),
            reads: None,
            expired_seen: std::cell::RefCell::new(Vec::new()),
            gathered: None,
        }
    }

    /// A group's run: several commands, each on keys no other command of
    /// the run touches, whose batches are taken in as they commit and
    /// written as one at [`Ctx::finish`] (one log append and one
    /// memtable visit for the lot). Nothing is read back from the held
    /// batch, so a key must be changed by one call only; the caller holds
    /// the stripe locks of every key meanwhile ([`Ctx::lock`] is then a
    /// no-op).
    pub fn gathering(db: &'a Db, now_ms: u64) -> Self {
        Ctx {
            gathered: Some(db.recording_batch()),
            ..Ctx::new(db, now_ms)
        }
    }

    fn note_expired(&self, space: Space, key: &[u8]) {
        let mut seen = self.expired_seen.borrow_mut();
        if seen.len() < MAX_EXPIRED_SEEN && !seen.iter().any(|(s, k)| *s == space && k == key) {
            seen.push((space, key.to_vec()));
        }
    }

    /// The keys its reads found expired (up to [`MAX_EXPIRED_SEEN`]), for
    /// the caller to remove once the run is done ([`Db::remove_if_expired`]:
    /// Redis's lazy expiry).
    pub fn take_expired_seen(&mut self) -> Vec<(Space, Vec<u8>)> {
        std::mem::take(self.expired_seen.get_mut())
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
            tx: Some(Tx {
                batch: db.recording_batch(),
                overlay: Overlay::default(),
            }),
            ..Ctx::new(db, now_ms)
        }
    }

    /// The run in logical database `logical` (0 to 15): SELECT's number.
    pub fn in_database(self, logical: u8) -> Result<Self, StoreError> {
        self.select(logical)?;
        Ok(self)
    }

    /// Goes on in logical database `logical` (SELECT in a transaction or a
    /// script).
    pub fn select(&self, logical: u8) -> Result<(), StoreError> {
        self.space.set(self.db.space(logical)?);
        self.logical.set(logical);
        Ok(())
    }

    /// The logical database the run is in.
    pub fn database(&self) -> u8 {
        self.logical.get()
    }

    /// The physical database the run reads and writes.
    pub fn space(&self) -> Space {
        self.space.get()
    }

    /// Reads the database map again once the run holds stripe locks: a
    /// SWAPDB holds them all while it swaps, so the database found now
    /// stays the run's until it unlocks.
    fn resolve_locked(&self) {
        self.space.set(self.db.space_used(self.logical.get()));
    }

    /// The keyspace.
    pub fn db(&self) -> &'a Db {
        self.db
    }

    /// The Unix time in ms the run happens at.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Whether the run is a transaction's.
    pub fn in_transaction(&self) -> bool {
        self.tx.is_some()
    }

    /// Commits a transaction's writes, or a group's, as one batch (all or
    /// none).
    pub fn finish(&mut self) -> Result<(), StoreError> {
        if let Some(tx) = self.tx.take().filter(|tx| !tx.batch.is_empty()) {
            let logged = tx.batch.commit()?;
            self.wrote = self.wrote.max(Some(logged.position));
        }
        if let Some(batch) = self.gathered.take().filter(|b| !b.is_empty()) {
            // A group's pops left end hints as their batches were taken
            // in (the keys stay locked until this commit): one that fails
            // makes them all untrue.
            let logged = batch
                .commit()
                .inspect_err(|_| self.db.forget_every_end_hint())?;
            self.wrote = self.wrote.max(Some(logged.position));
        }
        Ok(())
    }

    /// A batch for this run's changes.
    pub fn batch(&self) -> DbBatch<'a> {
        self.db.batch(self.space.get())
    }

    /// Notes that a write of another run (a script's) must be durable
    /// to `at` before this run's reply goes out.
    pub fn note_wrote(&mut self, at: LogPosition) {
        self.wrote = self.wrote.max(Some(at));
    }

    /// The keys changed since the last call (nothing unless keyspace
    /// notifications are on), in the order first changed.
    pub fn take_changes(&mut self) -> Vec<crate::db::Change> {
        let mut changes = std::mem::take(&mut self.changes);
        let absent = std::mem::take(self.absent.get_mut());
        for c in &mut changes {
            c.created = !c.removed && absent.iter().any(|(d, k)| *d == c.database && *k == c.key);
        }
        changes
    }

    fn recording(&self) -> bool {
        self.db
            .settings
            .record_changes
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Where the log must be durable before the replies of this run go out.
    pub fn wrote(&self) -> Option<LogPosition> {
        self.wrote
    }

    /// Applies `batch`: at once, or in a transaction, into its batch (read
    /// back by its later commands).
    pub fn commit(&mut self, mut batch: DbBatch<'_>) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let changes = batch.take_changes();
        if let Some(tx) = &mut self.tx {
            let ops = tx.batch.absorb(batch)?;
            tx.overlay.apply(&ops);
            self.changes.extend(changes);
            return Ok(());
        }
        if let Some(gathered) = &mut self.gathered {
            gathered.absorb(batch)?;
            self.changes.extend(changes);
            return Ok(());
        }
        let logged = batch.commit()?;
        self.wrote = self.wrote.max(Some(logged.position));
        self.changes.extend(changes);
        Ok(())
    }

    fn at(&self) -> &Snapshot {
        self.snapshot.get_or_init(|| self.db.snapshot())
    }

    /// Whether the caller of the run holds the locks it needs: a
    /// transaction holds every stripe, a group its keys' stripes.
    fn locks_held(&self) -> bool {
        self.tx.is_some() || self.gathered.is_some()
    }

    /// Locks every stripe — unless a transaction holds them all.
    pub fn lock_all(&self) -> Option<Locked<'a>> {
        assert!(
            self.gathered.is_none(),
            "a group's run locks no more stripes"
        );
        let locked = self.tx.is_none().then(|| self.db.lock_all());
        self.resolve_locked();
        locked
    }

    /// Locks `keys`' stripes — unless a transaction holds them all, or a
    /// group's caller holds them.
    pub fn lock(&self, keys: &[&[u8]]) -> Option<Locked<'a>> {
        let locked = (!self.locks_held()).then(|| self.db.lock(keys));
        self.resolve_locked();
        locked
    }

    /// The stored record of `key`, expired or not.
    pub fn get_raw(&self, key: &[u8]) -> Result<Option<Entry>, StoreError> {
        self.get_raw_in(self.space.get(), key)
    }

    /// [`Ctx::get_raw`] in database `space` (MOVE's and COPY's target).
    pub fn get_raw_in(&self, space: Space, key: &[u8]) -> Result<Option<Entry>, StoreError> {
        let found = match self
            .tx
            .as_ref()
            .and_then(|tx| tx.overlay.get(space.keys, key))
        {
            Some(found) => found.map(|b| Entry::decode(&b)).transpose()?,
            None => self.db.get_raw_at(space, key, self.at())?,
        };
        if found.as_ref().is_some_and(|e| e.expired(self.now_ms)) {
            self.note_expired(space, key);
        }
        if self.recording() && found.as_ref().is_none_or(|e| e.expired(self.now_ms)) {
            self.absent.borrow_mut().push((space.index(), key.to_vec()));
        }
        Ok(found)
    }

    /// The live record of `key` in database `space`.
    pub fn get_in(&self, space: Space, key: &[u8]) -> Result<Option<Entry>, StoreError> {
        Ok(self
            .get_raw_in(space, key)?
            .filter(|e| !e.expired(self.now_ms)))
    }

    /// The live record of `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Entry>, StoreError> {
        Ok(self.get_raw(key)?.filter(|e| !e.expired(self.now_ms)))
    }

    /// Member `sub` of collection `id`.
    pub fn member(&self, id: u64, sub: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(tx) = &self.tx {
            let members = self.db.members_keyspace();
            if let Some(found) = tx.overlay.get(members, &crate::db::member_key(id, sub)) {
                return Ok(found);
            }
        }
        self.db.member_at(id, sub, self.at())
    }

    /// For each of `mentions` in order (a command run's members or
    /// fields, repeats and all): None for a repeat of an earlier one,
    /// else whether it is stored in collection `id` (as [`Ctx::member`]
    /// would say; `new`: the collection is being created, nothing is).
    /// The first mentions are looked up as one run.
    pub fn mentions_present(
        &self,
        id: u64,
        new: bool,
        mentions: &[&[u8]],
    ) -> Result<Vec<Option<bool>>, StoreError> {
        let mut seen = std::collections::HashSet::with_capacity(mentions.len());
        let mut out: Vec<Option<bool>> = mentions
            .iter()
            .map(|m| seen.insert(*m).then_some(false))
            .collect();
        if new {
            return Ok(out);
        }
        let (at, firsts): (Vec<usize>, Vec<&[u8]>) = mentions
            .iter()
            .enumerate()
            .filter(|(i, _)| out[*i].is_some())
            .map(|(i, m)| (i, *m))
            .unzip();
        self.member_each(id, &firsts, |j, value| out[at[j]] = Some(value.is_some()))?;
        Ok(out)
    }

    /// Each of `subs`' values in collection `id` (as [`Ctx::member`]
    /// would give it), shown to `visit` with its place in `subs`: looked
    /// up as one run ([`Db::member_each_at`]), in no promised order.
    pub fn member_each(
        &self,
        id: u64,
        subs: &[&[u8]],
        mut visit: impl FnMut(usize, Option<&[u8]>),
    ) -> Result<(), StoreError> {
        // In a transaction, what it wrote answers first; the rest are
        // looked up in the store together.
        let mut asked: Vec<usize> = Vec::with_capacity(subs.len());
        match &self.tx {
            Some(tx) => {
                let members = self.db.members_keyspace();
                for (i, sub) in subs.iter().enumerate() {
                    match tx.overlay.get(members, &crate::db::member_key(id, sub)) {
                        Some(found) => visit(i, found.as_deref()),
                        None => asked.push(i),
                    }
                }
            }
            None => asked.extend(0..subs.len()),
        }
        let asked_subs: Vec<&[u8]> = asked.iter().map(|&i| subs[i]).collect();
        self.db
            .member_each_at(id, &asked_subs, self.at(), |j, value| {
                visit(asked[j], value)
            })
    }

    /// The members of collection `id` whose sub-keys are in `range`, in
    /// sub-key order or (`reverse`) descending, as (sub-key, value).
    pub fn members(
        &self,
        id: u64,
        range: (Bound<&[u8]>, Bound<&[u8]>),
        reverse: bool,
    ) -> Box<dyn Iterator<Item = MemberItem> + '_> {
        let mut stored = self.db.members_at(id, range, self.at(), reverse);
        let strip = |item: Item| item.map(|(k, v)| (k[8..].to_vec(), v));
        match &self.tx {
            // Copied once each from the iterator's own buffers.
            None => Box::new(std::iter::from_fn(move || match stored.next_ref() {
                Ok(Some((k, v))) => Some(Ok((k[8..].to_vec(), v.to_vec()))),
                Ok(None) => None,
                Err(e) => Some(Err(e)),
            })),
            Some(tx) => {
                let members = self.db.members_keyspace();
                let key = |b: Bound<&[u8]>| b.map(|sub| crate::db::member_key(id, sub));
                let (lower, upper) = (key(range.0), key(range.1));
                let lower = match lower {
                    Bound::Unbounded => Bound::Included(crate::db::member_key(id, &[])),
                    b => b,
                };
                let upper = match upper {
                    Bound::Unbounded => match id.checked_add(1) {
                        Some(n) => Bound::Excluded(crate::db::member_key(n, &[])),
                        None => Bound::Unbounded,
                    },
                    b => b,
                };
                let merged: Vec<Item> = tx
                    .overlay
                    .merge(
                        members,
                        (bound_ref(&lower), bound_ref(&upper)),
                        reverse,
                        stored,
                    )
                    .collect();
                Box::new(merged.into_iter().map(strip))
            }
        }
    }

    /// Hands `visit` each member of collection `id` whose sub-key is in
    /// `range` (sub-key, value), in order or (`reverse`) descending, until
    /// it answers false; `expected`: about how many it will take (0:
    /// unknown). Outside a transaction the pairs are lent from the store's
    /// iterator: no copy of a key or value `visit` does not keep; `visit`
    /// must not read or write the store meanwhile (see
    /// `StoreIter::for_each_ref`: it may run under a memtable's read lock).
    pub fn for_each_member(
        &self,
        id: u64,
        range: (Bound<&[u8]>, Bound<&[u8]>),
        reverse: bool,
        expected: usize,
        mut visit: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        if self.tx.is_some() {
            for item in self.members(id, range, reverse) {
                let (sub, value) = item?;
                if !visit(&sub, &value) {
                    break;
                }
            }
            return Ok(());
        }
        self.db
            .members_expecting(id, range, self.at(), reverse, expected)
            .for_each_ref(|key, value| visit(&key[8..], value))
    }

    /// Every member of collection `id`, in sub-key order.
    pub fn all_members(&self, id: u64) -> Result<Vec<crate::db::FieldValue>, StoreError> {
        self.members(id, (Bound::Unbounded, Bound::Unbounded), false)
            .collect()
    }

    /// Stored keys (expired too) from `start`, in order, at most `limit`.
    pub fn keys_from(
        &self,
        start: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Entry)>, StoreError> {
        self.keys_from_in(self.space.get(), start, limit)
    }

    /// [`Ctx::keys_from`] of database `space`.
    pub fn keys_from_in(
        &self,
        space: Space,
        start: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Entry)>, StoreError> {
        let Some(tx) = &self.tx else {
            return self.db.keys_from_at(space, start, limit, self.at());
        };
        let keys = space.keys;
        let range = (Bound::Included(start), Bound::Unbounded);
        let stored = self.db.store().iter(keys, range, self.at(), false);
        let mut out = Vec::new();
        for item in tx.overlay.merge(keys, range, false, stored) {
            let (k, v) = item?;
            out.push((k, Entry::decode(&v)?));
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// The object ids of every collection of database `space` (FLUSHDB
    /// removes their members once their records are gone).
    pub fn collection_ids(&self, space: Space) -> Result<Vec<u64>, StoreError> {
        let (collections, (from, to)) = self.db.collections_of(space.index());
        let range = (Bound::Included(&from[..]), Bound::Excluded(&to[..]));
        let stored = self.db.store().iter(collections, range, self.at(), false);
        let listed: Box<dyn Iterator<Item = Item> + '_> = match &self.tx {
            None => Box::new(stored),
            Some(tx) => Box::new(tx.overlay.merge(collections, range, false, stored)),
        };
        let mut ids = Vec::new();
        for item in listed {
            let (index_key, _) = item?;
            let record = self.get_raw_in(space, &index_key[1..])?;
            if let Some(c) = record.as_ref().and_then(|e| e.value.collection()) {
                ids.push(c.id);
            }
        }
        Ok(ids)
    }

    /// Removes `key` holding `value` in `batch`: its record, and a
    /// collection's members (a small one's one by one, as this run sees
    /// them).
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: asked for collections only"
    )]
    pub fn remove(
        &self,
        batch: &mut DbBatch<'_>,
        key: &[u8],
        value: &Value,
    ) -> Result<(), StoreError> {
        remove_entry(batch, key, value, || {
            let c = value.collection().expect("asked for collections only");
            Ok(self
                .all_members(c.id)?
                .into_iter()
                .map(|(sub, _)| sub)
                .collect())
        })
    }

    /// [`Ctx::get_string`] for a command whose only read this is (GET):
    /// outside a transaction and before any other read it needs no
    /// snapshot.
    pub fn get_string_once(&self, key: &[u8]) -> Result<Option<(Vec<u8>, u64)>, Failure> {
        if self.tx.is_some() || self.snapshot.get().is_some() {
            return self.get_string(key);
        }
        let entry = self.db.get_raw_latest(self.space.get(), key)?;
        if entry.as_ref().is_some_and(|e| e.expired(self.now_ms)) {
            self.note_expired(self.space.get(), key);
        }
        Self::string_of(entry.filter(|e| !e.expired(self.now_ms)))
    }

    /// The live string at `key`; WRONGTYPE if it holds something else.
    pub fn get_string(&self, key: &[u8]) -> Result<Option<(Vec<u8>, u64)>, Failure> {
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

    /// A batch to change `key`, and its live record. An expired record is
    /// removed first in the same batch, so nothing of it (a collection's
    /// members) outlives it.
    ///
    /// The caller holds `key`'s stripe lock (or, in a transaction, every
    /// stripe): outside a transaction the record is read as it is now,
    /// with no snapshot, since no other write of it can land meanwhile.
    pub fn begin(&mut self, key: &[u8]) -> Result<(Option<Entry>, DbBatch<'a>), StoreError> {
        self.begin_reading(key, Read::Whole)
    }

    /// Whether a command that replaces `key`'s record whatever it holds
    /// may do so without reading it: when the key holds no collection,
    /// outside a transaction. The caller holds `key`'s stripe lock.
    pub fn may_skip_read(&self, key: &[u8]) -> bool {
        // Keyspace notifications tell a new key from an old one.
        self.tx.is_none() && !self.db.may_hold_collection(key) && !self.recording()
    }

    /// [`Ctx::begin`] for a command that replaces the key's value without
    /// looking at it (SET): a string record comes back without its bytes.
    pub fn begin_overwrite(
        &mut self,
        key: &[u8],
    ) -> Result<(Option<Entry>, DbBatch<'a>), StoreError> {
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
            let space = self.space.get();
            match self.reads.as_deref_mut() {
                Some(cache) => self.db.get_locked(cache, space, key, read)?,
                None => self
                    .db
                    .get_locked(&mut ReadCache::default(), space, key, read)?,
            }
        };
        if self.recording() && stored.as_ref().is_none_or(|e| e.expired(self.now_ms)) {
            let at = self.space.get().index();
            self.absent.get_mut().push((at, key.to_vec()));
        }
        match stored {
            Some(e) if e.expired(self.now_ms) => {
                self.remove(&mut batch, key, &e.value)?;
                Ok((None, batch))
            }
            live => Ok((live, batch)),
        }
    }
}

fn bound_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k),
        Bound::Excluded(k) => Bound::Excluded(k),
        Bound::Unbounded => Bound::Unbounded,
    }
}
