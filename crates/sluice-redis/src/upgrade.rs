//! The layout before object ids kept hash fields in `redis.fields` keyed
//! `[key length u32 BE][key][field]`, and a hash's record as type 1 with
//! an 8-byte field count. At open each such hash is given an object id and
//! its fields are copied under it (docs/FORMAT.md, "Upgrade from the
//! layout with `redis.fields`"); then `redis.fields` is dropped.

use crate::db::{Db, LEGACY_FIELDS_KEYSPACE};
use crate::record::{Collection, Entry, Value};
use sluice_store::StoreError;
use std::ops::Bound;

/// Bytes of copied fields per batch before the batch is written.
const BATCH_BYTES: usize = 4 << 20;

/// Rewrites every hash of the old layout, then drops `redis.fields`.
/// Nothing to do (and quick) when there is no such keyspace.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: checked length"
)]
pub fn legacy_hashes(db: &Db) -> Result<(), StoreError> {
    let store = db.store();
    let fields = match store.keyspace(LEGACY_FIELDS_KEYSPACE) {
        Ok(id) => id,
        Err(StoreError::UnknownKeyspace { .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    // The old layout had one database.
    let space = db.space_used(0);
    let keys = space.keys;
    let snapshot = store.snapshot();
    let all = (Bound::Unbounded::<&[u8]>, Bound::Unbounded);
    let mut upgraded = 0u64;
    for item in store.iter(keys, all, &snapshot, false) {
        let (key, record) = item?;
        if !Entry::is_legacy_hash(&record) {
            continue;
        }
        let expire_at_ms = sluice_io::codec::u64_at(&record, 1).expect("checked length");
        let id = db.new_id()?;
        let mut prefix = (key.len() as u32).to_be_bytes().to_vec();
        prefix.extend_from_slice(&key);
        // The record is rewritten by the batch of the last fields: until
        // then the hash reads as before, and a crash leaves it to the next
        // open (the fields copied so far sit unreferenced under `id`).
        let mut batch = db.batch(space);
        let (mut len, mut bytes) = (0u64, 0usize);
        for field in store.iter_prefix(fields, &prefix, &snapshot, false) {
            let (field_key, value) = field?;
            let sub = &field_key[prefix.len()..];
            batch.put_member(&key, id, sub, &value)?;
            len += 1;
            bytes += field_key.len() + value.len();
            if bytes >= BATCH_BYTES {
                batch.commit()?;
                batch = db.batch(space);
                bytes = 0;
            }
        }
        if len == 0 {
            batch.remove_record(&key, &Value::String(Vec::new()))?;
        } else {
            let entry = Entry {
                value: Value::Hash {
                    c: Collection { id, len },
                    order: None,
                },
                expire_at_ms,
            };
            batch.put_new(&key, &entry)?;
        }
        batch.commit()?;
        upgraded += 1;
        if upgraded.is_multiple_of(10_000) {
            log::info!("upgrading hashes to object ids: {upgraded} done");
        }
    }
    drop(snapshot);
    // Every rewritten hash on the device before its old fields go.
    store.flush()?;
    store.drop_keyspace(LEGACY_FIELDS_KEYSPACE)?;
    if upgraded > 0 {
        log::info!("upgraded {upgraded} hashes to object ids; dropped {LEGACY_FIELDS_KEYSPACE}");
    }
    Ok(())
}
