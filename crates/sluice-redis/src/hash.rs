//! Hashes: a record of type hash and one member `[id][field]` → value per
//! field (docs/FORMAT.md, "Members"). A small hash's fields come back in
//! the order they were first set (its record lists them, as Redis keeps a
//! small hash in a listpack); a larger one's in byte order.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use crate::ctx::Ctx;
use crate::db::FieldValue;
use crate::error::{fail, Failure, WRONGTYPE};
use crate::record::{Collection, Entry, FieldOrder, Value};

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
    Ok(get_ordered(ctx, key)?.map(|(c, _)| c))
}

/// [`get`] with the hash's field order, if it keeps one.
fn get_ordered(
    ctx: &Ctx<'_>,
    key: &[u8],
) -> Result<Option<(Collection, Option<FieldOrder>)>, Failure> {
    match ctx.get(key)? {
        None => Ok(None),
        Some(Entry {
            value: Value::Hash { c, order },
            ..
        }) => Ok(Some((c, order))),
        Some(_) => Err(fail(WRONGTYPE)),
    }
}

/// `fields` (in byte order, as stored) in `order`, if there is one.
pub fn in_order(fields: Vec<FieldValue>, order: Option<&FieldOrder>) -> Vec<FieldValue> {
    let Some(order) = order else {
        return fields;
    };
    debug_assert_eq!(order.len(), fields.len() as u64);
    let mut by_field: HashMap<Vec<u8>, Vec<u8>> = fields.into_iter().collect();
    let mut out = Vec::with_capacity(by_field.len());
    for field in order.iter() {
        if let Some((f, v)) = by_field.remove_entry(field) {
            out.push((f, v));
        }
    }
    // Nothing is left unless record and members disagree; answer them all.
    let mut rest: Vec<FieldValue> = by_field.into_iter().collect();
    rest.sort_unstable();
    out.extend(rest);
    out
}

/// Whether a hash may keep its field order with fields and values of
/// these lengths (Redis's `hash-max-listpack-value`).
fn short_enough<'p>(
    ctx: &Ctx<'_>,
    pairs: impl IntoIterator<Item = &'p (&'p [u8], &'p [u8])>,
) -> bool {
    let most = ctx
        .db()
        .settings
        .hash_order_value_bytes
        .load(Ordering::Relaxed);
    pairs
        .into_iter()
        .all(|(f, v)| f.len() as u64 <= most && v.len() as u64 <= most)
}

/// Whether a hash of `len` fields may keep its field order (Redis's
/// `hash-max-listpack-entries`).
fn few_enough(ctx: &Ctx<'_>, len: u64) -> bool {
    len <= ctx.db().settings.hash_order_entries.load(Ordering::Relaxed)
}

/// The order a hash made of `pairs` (first set first, as a payload lists
/// them) keeps; None when it is too large to keep one.
pub fn order_of(ctx: &Ctx<'_>, pairs: &[(&[u8], &[u8])]) -> Option<FieldOrder> {
    if !short_enough(ctx, pairs) {
        return None;
    }
    let mut order = FieldOrder::default();
    let mut seen = std::collections::HashSet::new();
    for (field, _) in pairs {
        if seen.insert(*field) && !order.push(field) {
            return None;
        }
    }
    few_enough(ctx, order.len()).then_some(order)
}

/// One field's value (None: no such hash or field).
pub fn field(ctx: &Ctx<'_>, key: &[u8], field: &[u8]) -> Result<Option<Vec<u8>>, Failure> {
    match get(ctx, key)? {
        None => Ok(None),
        Some(c) => Ok(ctx.member(c.id, field)?),
    }
}

/// Every field and value: a small hash's in the order first set, a
/// larger one's in byte order (empty: no such hash).
pub fn all(ctx: &Ctx<'_>, key: &[u8]) -> Result<Vec<FieldValue>, Failure> {
    match get_ordered(ctx, key)? {
        None => Ok(Vec::new()),
        Some((c, order)) => Ok(in_order(ctx.all_members(c.id)?, order.as_ref())),
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
    Ok(set_runs(ctx, key, &[pairs], only_new)?[0])
}

/// [`set`] of `runs` (each one command's pairs) in order, in one batch:
/// how many fields each made. The caller holds `key`'s lock.
pub fn set_runs(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    runs: &[&[(&[u8], &[u8])]],
    only_new: bool,
) -> Result<Vec<i64>, Failure> {
    let pairs = || runs.iter().flat_map(|r| r.iter());
    for (field, _) in pairs() {
        check_member(field, MAX_FIELD_BYTES)?;
    }
    let (old, mut batch) = ctx.begin(key)?;
    let (c, expire_at_ms, new, mut order) = match old {
        None => (
            Collection {
                id: ctx.db().new_id()?,
                len: 0,
            },
            0,
            true,
            Some(FieldOrder::default()),
        ),
        Some(Entry {
            value: Value::Hash { c, order },
            expire_at_ms,
        }) => (c, expire_at_ms, false, order),
        Some(_) => return Err(fail(WRONGTYPE)),
    };
    let had_order = order.is_some();
    // As Redis converts a listpack before it looks at the fields (a later
    // command's long field drops the order all the same once it runs).
    if !short_enough(ctx, pairs()) {
        order = None;
    }
    let fields: Vec<&[u8]> = pairs().map(|(f, _)| *f).collect();
    let mut present = ctx.mentions_present(c.id, new, &fields)?.into_iter();
    let mut added = 0u64;
    let mut each = Vec::with_capacity(runs.len());
    for run in runs {
        let before = added;
        for (field, value) in run.iter() {
            // A repeat exists by then: the run set it.
            let exists = present.next().flatten().unwrap_or(true);
            if exists && only_new {
                continue;
            }
            if !exists {
                added += 1;
                if order.as_mut().is_some_and(|o| !o.push(field)) {
                    order = None;
                }
            }
            batch.put_member(key, c.id, field, value)?;
        }
        each.push((added - before) as i64);
    }
    let len = c.len + added;
    if !few_enough(ctx, len) {
        order = None;
    }
    if added > 0 || had_order != order.is_some() {
        let c = Collection { len, ..c };
        batch.finish_collection(key, Value::Hash { c, order }, expire_at_ms, new)?;
    }
    ctx.commit(batch)?;
    Ok(each)
}

/// Removes `fields` from hash `key`; returns how many were there. The
/// caller holds `key`'s lock.
pub fn delete(ctx: &mut Ctx<'_>, key: &[u8], fields: &[&[u8]]) -> Result<i64, Failure> {
    let (old, mut batch) = ctx.begin(key)?;
    let (c, expire_at_ms, mut order) = match old {
        None => {
            ctx.commit(batch)?;
            return Ok(0);
        }
        Some(Entry {
            value: Value::Hash { c, order },
            expire_at_ms,
        }) => (c, expire_at_ms, order),
        Some(_) => return Err(fail(WRONGTYPE)),
    };
    let mut removed = 0u64;
    let mut seen = std::collections::HashSet::new();
    for field in fields {
        if seen.insert(*field) && ctx.member(c.id, field)?.is_some() {
            batch.delete_member(key, c.id, field)?;
            removed += 1;
            if let Some(o) = order.as_mut() {
                o.remove(field);
            }
        }
    }
    if removed > 0 {
        let c = Collection {
            len: c.len - removed.min(c.len),
            ..c
        };
        batch.finish_collection(key, Value::Hash { c, order }, expire_at_ms, false)?;
    }
    ctx.commit(batch)?;
    Ok(removed as i64)
}
