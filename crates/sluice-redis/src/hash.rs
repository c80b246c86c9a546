//! Hashes: a record of type hash and one member `[id][field]` → value per
//! field (docs/FORMAT.md, "Members"). Fields come back in byte order.

use crate::ctx::Ctx;
use crate::db::FieldValue;
use crate::error::{fail, Failure, WRONGTYPE};
use crate::record::{Collection, Entry, Value};

/// Longest hash field (or set member): a member key is `[id u64][field]`.
pub const MAX_FIELD_BYTES: usize = sluice_store::batch::MAX_KEY_BYTES - 8;

/// Refuses a member longer than `most` bytes, naming both lengths.
pub(crate) fn check_member(member: &[u8], most: usize) -> Result<(), Failure> {
    if member.len() > most {
        return Err(Failure::Reply(format!(
            "ERR member of {} bytes is longer than the limit of {most} bytes",
            member.len()
        )));
    }
    Ok(())
}

/// The live hash at `key`: its id and field count; None if there is no
/// key, WRONGTYPE if it holds something else.
pub fn get(ctx: &Ctx<'_>, key: &[u8]) -> Result<Option<Collection>, Failure> {
    match ctx.get(key)? {
        None => Ok(None),
        Some(Entry {
            value: Value::Hash(c),
            ..
        }) => Ok(Some(c)),
        Some(_) => Err(fail(WRONGTYPE)),
    }
}

/// One field's value (None: no such hash or field).
pub fn field(ctx: &Ctx<'_>, key: &[u8], field: &[u8]) -> Result<Option<Vec<u8>>, Failure> {
    match get(ctx, key)? {
        None => Ok(None),
        Some(c) => Ok(ctx.member(c.id, field)?),
    }
}

/// Every field and value, in field order (empty: no such hash).
pub fn all(ctx: &Ctx<'_>, key: &[u8]) -> Result<Vec<FieldValue>, Failure> {
    match get(ctx, key)? {
        None => Ok(Vec::new()),
        Some(c) => Ok(ctx.all_members(c.id)?),
    }
}

/// Sets `pairs` in hash `key` (made if missing); returns how many fields
/// are new. `only_new`: HSETNX, leaves an existing field alone. The
/// caller holds `key`'s lock.
pub fn set(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    pairs: &[(&[u8], &[u8])],
    only_new: bool,
) -> Result<i64, Failure> {
    for (field, _) in pairs {
        check_member(field, MAX_FIELD_BYTES)?;
    }
    let (old, mut batch) = ctx.begin(key)?;
    let (c, expire_at_ms, new) = match old {
        None => (
            Collection {
                id: ctx.db().new_id()?,
                len: 0,
            },
            0,
            true,
        ),
        Some(Entry {
            value: Value::Hash(c),
            expire_at_ms,
        }) => (c, expire_at_ms, false),
        Some(_) => return Err(fail(WRONGTYPE)),
    };
    let mut added = 0u64;
    let mut seen = std::collections::HashSet::new();
    for (field, value) in pairs {
        let exists = !seen.insert(*field) || (!new && ctx.member(c.id, field)?.is_some());
        if exists && only_new {
            continue;
        }
        added += u64::from(!exists);
        batch.put_member(key, c.id, field, value)?;
    }
    if added > 0 {
        let entry = Entry {
            value: Value::Hash(Collection {
                len: c.len + added,
                ..c
            }),
            expire_at_ms,
        };
        if new {
            batch.put_new(key, &entry)?;
        } else {
            batch.put(key, &entry)?;
        }
    }
    ctx.commit(batch)?;
    Ok(added as i64)
}

/// Removes `fields` from hash `key`; returns how many were there. The
/// caller holds `key`'s lock.
pub fn delete(ctx: &mut Ctx<'_>, key: &[u8], fields: &[&[u8]]) -> Result<i64, Failure> {
    let (old, mut batch) = ctx.begin(key)?;
    let (c, expire_at_ms) = match old {
        None => {
            ctx.commit(batch)?;
            return Ok(0);
        }
        Some(Entry {
            value: Value::Hash(c),
            expire_at_ms,
        }) => (c, expire_at_ms),
        Some(_) => return Err(fail(WRONGTYPE)),
    };
    let mut removed = 0u64;
    let mut seen = std::collections::HashSet::new();
    for field in fields {
        if seen.insert(*field) && ctx.member(c.id, field)?.is_some() {
            batch.delete_member(key, c.id, field)?;
            removed += 1;
        }
    }
    let left = c.len - removed.min(c.len);
    if left == 0 {
        batch.remove_record(key, &Value::Hash(c))?;
    } else if removed > 0 {
        let entry = Entry {
            value: Value::Hash(Collection { len: left, ..c }),
            expire_at_ms,
        };
        batch.put(key, &entry)?;
    }
    ctx.commit(batch)?;
    Ok(removed as i64)
}
