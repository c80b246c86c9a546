//! Lists: a record of type list (`head`, length) and one member
//! `[id][index u64 BE]` → item per item, at indexes `head .. head + len`
//! (docs/FORMAT.md, "Members"). Both ends grow from the middle of the
//! index space, so pushes and pops at either end touch one entry.
//! Following Redis 7.0's t_list.c for what each operation answers.

use crate::ctx::Ctx;
use crate::db::DbBatch;
use crate::error::{fail, Failure, NO_SUCH_KEY, WRONGTYPE};
use crate::record::{Collection, Entry, Value};
use sluice_store::StoreError;
use std::ops::Bound;

/// The index of a new list's first item.
pub const FIRST_INDEX: u64 = 1 << 63;

/// Which end of a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The head (LPUSH, LPOP).
    Left,
    /// The tail (RPUSH, RPOP).
    Right,
}

/// A list being changed by one command: its record as it will be written.
pub struct List {
    key: Vec<u8>,
    c: Collection,
    head: u64,
    expire_at_ms: u64,
    /// No record is stored yet.
    new: bool,
    /// The record needs writing.
    changed: bool,
}

fn sub(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn exhausted() -> Failure {
    fail("ERR list index space exhausted")
}

impl List {
    /// The live list at `key`, for reading; None if there is no key,
    /// WRONGTYPE if it holds something else.
    pub fn read(ctx: &Ctx<'_>, key: &[u8]) -> Result<Option<List>, Failure> {
        List::of(key, ctx.get(key)?)
    }

    fn of(key: &[u8], entry: Option<Entry>) -> Result<Option<List>, Failure> {
        match entry {
            None => Ok(None),
            Some(Entry {
                value: Value::List { c, head },
                expire_at_ms,
            }) => Ok(Some(List {
                key: key.to_vec(),
                c,
                head,
                expire_at_ms,
                new: false,
                changed: false,
            })),
            Some(_) => Err(fail(WRONGTYPE)),
        }
    }

    /// The list at `key` for a command that changes it, with the batch to
    /// change it in (an expired record already removed in it). The caller
    /// holds `key`'s lock.
    pub fn begin<'a>(
        ctx: &mut Ctx<'a>,
        key: &[u8],
    ) -> Result<(Option<List>, DbBatch<'a>), Failure> {
        let (entry, batch) = ctx.begin(key)?;
        Ok((List::of(key, entry)?, batch))
    }

    /// An empty list at `key`, to push to (its object id is new).
    pub fn create(ctx: &Ctx<'_>, key: &[u8]) -> Result<List, Failure> {
        Ok(List {
            key: key.to_vec(),
            c: Collection {
                id: ctx.db().new_id()?,
                len: 0,
            },
            head: FIRST_INDEX,
            expire_at_ms: 0,
            new: true,
            changed: false,
        })
    }

    /// Items.
    pub fn len(&self) -> u64 {
        self.c.len
    }

    /// Whether it has no items (only while a command empties it).
    pub fn is_empty(&self) -> bool {
        self.c.len == 0
    }

    /// The store index of position `i` (0-based from the head).
    fn at(&self, i: u64) -> u64 {
        self.head.wrapping_add(i)
    }

    /// Adds `value` at `end`.
    pub fn push(&mut self, batch: &mut DbBatch<'_>, end: End, value: &[u8]) -> Result<(), Failure> {
        let index = match end {
            End::Left => {
                self.head = self.head.checked_sub(1).ok_or_else(exhausted)?;
                self.head
            }
            End::Right => self
                .head
                .checked_add(self.c.len)
                .filter(|i| *i != u64::MAX)
                .ok_or_else(exhausted)?,
        };
        batch.put_member(&self.key, self.c.id, &sub(index), value)?;
        self.c.len += 1;
        self.changed = true;
        Ok(())
    }

    /// Removes and returns the item at `end`; None when empty.
    pub fn pop(
        &mut self,
        ctx: &Ctx<'_>,
        batch: &mut DbBatch<'_>,
        end: End,
    ) -> Result<Option<Vec<u8>>, Failure> {
        if self.c.len == 0 {
            return Ok(None);
        }
        let index = match end {
            End::Left => self.head,
            End::Right => self.at(self.c.len - 1),
        };
        let item = ctx.member(self.c.id, &sub(index))?.ok_or_else(|| {
            StoreError::BadInput(format!(
                "list item {index} of object {} is missing",
                self.c.id
            ))
        })?;
        batch.delete_member(&self.key, self.c.id, &sub(index))?;
        if end == End::Left {
            self.head = self.head.wrapping_add(1);
        }
        self.c.len -= 1;
        self.changed = true;
        Ok(Some(item))
    }

    /// Removes and returns up to `count` items from `end`, nearest the end
    /// first: read in one walk of their index range, not one look-up each.
    pub fn pop_many(
        &mut self,
        ctx: &Ctx<'_>,
        batch: &mut DbBatch<'_>,
        end: End,
        count: u64,
    ) -> Result<Vec<Vec<u8>>, Failure> {
        let taken = count.min(self.c.len);
        if taken == 0 {
            return Ok(Vec::new());
        }
        let first = match end {
            End::Left => 0,
            End::Right => self.c.len - taken,
        };
        let mut items = self.items(ctx, first, first + taken - 1)?;
        if items.len() as u64 != taken {
            return Err(StoreError::BadInput(format!(
                "list object {} holds {} of its items {first}..={}",
                self.c.id,
                items.len(),
                first + taken - 1
            ))
            .into());
        }
        for i in first..first + taken {
            batch.delete_member(&self.key, self.c.id, &sub(self.at(i)))?;
        }
        if end == End::Left {
            self.head = self.head.wrapping_add(taken);
        } else {
            items.reverse();
        }
        self.c.len -= taken;
        self.changed = true;
        Ok(items)
    }

    /// Items at positions `first ..= last` (in range), in list order.
    pub fn items(&self, ctx: &Ctx<'_>, first: u64, last: u64) -> Result<Vec<Vec<u8>>, Failure> {
        let count = last.saturating_sub(first).saturating_add(1).min(1 << 16) as usize;
        let mut out = Vec::with_capacity(count);
        self.visit_items(ctx, first, last, |item| out.push(item.to_vec()))?;
        Ok(out)
    }

    /// Shows `visit` the items from position `first` through `last`
    /// (clamped to the list), in order, where they lie in the store.
    pub fn visit_items(
        &self,
        ctx: &Ctx<'_>,
        first: u64,
        last: u64,
        mut visit: impl FnMut(&[u8]),
    ) -> Result<(), Failure> {
        if first > last || first >= self.c.len {
            return Ok(());
        }
        let last = last.min(self.c.len - 1);
        let (lo, hi) = (sub(self.at(first)), sub(self.at(last)));
        let count = (last - first + 1).min(1 << 16) as usize;
        let range = (Bound::Included(&lo[..]), Bound::Included(&hi[..]));
        ctx.for_each_member(self.c.id, range, false, count, |_, item| {
            visit(item);
            true
        })?;
        Ok(())
    }

    /// Every item with its position, from `end` inward.
    fn walk<'c>(
        &self,
        ctx: &'c Ctx<'_>,
        end: End,
    ) -> impl Iterator<Item = Result<(u64, Vec<u8>), Failure>> + 'c {
        let (lo, hi) = (sub(self.head), sub(self.at(self.c.len.saturating_sub(1))));
        let head = self.head;
        ctx.members(
            self.c.id,
            (Bound::Included(&lo), Bound::Included(&hi)),
            end == End::Right,
        )
        .map(move |item| {
            let (k, v) = item?;
            let index = u64::from_be_bytes(k[..8].try_into().map_err(|_| {
                Failure::Store(StoreError::BadInput(
                    "a list item's key is malformed".into(),
                ))
            })?);
            Ok((index.wrapping_sub(head), v))
        })
    }

    /// Writes the record as changed (or removes it once empty) in `batch`.
    pub fn finish(self, batch: &mut DbBatch<'_>) -> Result<(), StoreError> {
        if !self.changed {
            return Ok(());
        }
        let value = Value::List {
            c: self.c,
            head: self.head,
        };
        batch.finish_collection(&self.key, value, self.expire_at_ms, self.new)
    }

    /// Rewrites positions `from ..` as `items` (the list's new tail from
    /// `from` on), deleting indexes past the new end.
    fn rewrite_from(
        &mut self,
        batch: &mut DbBatch<'_>,
        from: u64,
        items: &[Vec<u8>],
    ) -> Result<(), Failure> {
        let new_len = from + items.len() as u64;
        for (i, item) in items.iter().enumerate() {
            batch.put_member(&self.key, self.c.id, &sub(self.at(from + i as u64)), item)?;
        }
        for i in new_len..self.c.len {
            batch.delete_member(&self.key, self.c.id, &sub(self.at(i)))?;
        }
        self.c.len = new_len;
        self.changed = true;
        Ok(())
    }
}

/// Redis's LRANGE/LTRIM index pair resolved against `len`: the first and
/// last positions, or None when the range is empty.
pub fn resolve_range(start: i64, stop: i64, len: u64) -> Option<(u64, u64)> {
    let len = len as i64;
    let start = if start < 0 {
        (len + start).max(0)
    } else {
        start
    };
    let stop = if stop < 0 { len + stop } else { stop };
    if start > stop || start >= len || stop < 0 {
        return None;
    }
    Some((start as u64, stop.min(len - 1) as u64))
}

/// A Redis index (negative: from the tail) resolved against `len`.
fn resolve_index(index: i64, len: u64) -> Option<u64> {
    let i = if index < 0 { len as i64 + index } else { index };
    (0..len as i64).contains(&i).then_some(i as u64)
}

/// LPUSH/RPUSH (`only_existing`: LPUSHX/RPUSHX): the length after, 0 when
/// `only_existing` and there is no list. The caller holds `key`'s lock.
pub fn push(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    values: &[&[u8]],
    end: End,
    only_existing: bool,
) -> Result<i64, Failure> {
    let (list, mut batch) = List::begin(ctx, key)?;
    let mut list = match list {
        Some(list) => list,
        None if only_existing => {
            ctx.commit(batch)?;
            return Ok(0);
        }
        None => List::create(ctx, key)?,
    };
    for value in values {
        list.push(&mut batch, end, value)?;
    }
    let len = list.len();
    list.finish(&mut batch)?;
    ctx.commit(batch)?;
    Ok(len as i64)
}

/// Replaces whatever `dst` holds with a list of `items` in order (SORT
/// ... STORE); returns its length. An empty list removes `dst`. The
/// caller holds `dst`'s lock.
pub fn store(ctx: &mut Ctx<'_>, dst: &[u8], items: &[Vec<u8>]) -> Result<i64, Failure> {
    let mut batch = ctx.batch();
    if let Some(old) = ctx.get_raw(dst)? {
        ctx.remove(&mut batch, dst, &old.value)?;
    }
    if !items.is_empty() {
        let mut list = List::create(ctx, dst)?;
        for item in items {
            list.push(&mut batch, End::Right, item)?;
        }
        list.finish(&mut batch)?;
    }
    ctx.commit(batch)?;
    Ok(items.len() as i64)
}

/// LPOP/RPOP of up to `count` items; None when there is no list. The
/// caller holds `key`'s lock.
pub fn pop(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    end: End,
    count: u64,
) -> Result<Option<Vec<Vec<u8>>>, Failure> {
    let (list, mut batch) = List::begin(ctx, key)?;
    let Some(mut list) = list else {
        ctx.commit(batch)?;
        return Ok(None);
    };
    let out = if count == 1 {
        list.pop(ctx, &mut batch, end)?.into_iter().collect()
    } else {
        list.pop_many(ctx, &mut batch, end, count)?
    };
    list.finish(&mut batch)?;
    ctx.commit(batch)?;
    Ok(Some(out))
}

/// LLEN.
pub fn len(ctx: &Ctx<'_>, key: &[u8]) -> Result<u64, Failure> {
    Ok(List::read(ctx, key)?.map_or(0, |l| l.len()))
}

/// LRANGE.
pub fn range(ctx: &Ctx<'_>, key: &[u8], start: i64, stop: i64) -> Result<Vec<Vec<u8>>, Failure> {
    let Some(list) = List::read(ctx, key)? else {
        return Ok(Vec::new());
    };
    match resolve_range(start, stop, list.len()) {
        Some((first, last)) => list.items(ctx, first, last),
        None => Ok(Vec::new()),
    }
}

/// LINDEX.
pub fn index(ctx: &Ctx<'_>, key: &[u8], index: i64) -> Result<Option<Vec<u8>>, Failure> {
    let Some(list) = List::read(ctx, key)? else {
        return Ok(None);
    };
    let Some(i) = resolve_index(index, list.len()) else {
        return Ok(None);
    };
    Ok(ctx.member(list.c.id, &sub(list.at(i)))?)
}

/// LSET. The caller holds `key`'s lock.
pub fn set(ctx: &mut Ctx<'_>, key: &[u8], index: i64, value: &[u8]) -> Result<(), Failure> {
    let (list, mut batch) = List::begin(ctx, key)?;
    let Some(list) = list else {
        return Err(fail(NO_SUCH_KEY));
    };
    let Some(i) = resolve_index(index, list.len()) else {
        return Err(fail("ERR index out of range"));
    };
    batch.put_member(key, list.c.id, &sub(list.at(i)), value)?;
    ctx.commit(batch)?;
    Ok(())
}

/// LTRIM. The caller holds `key`'s lock.
pub fn trim(ctx: &mut Ctx<'_>, key: &[u8], start: i64, stop: i64) -> Result<(), Failure> {
    let (list, mut batch) = List::begin(ctx, key)?;
    let Some(mut list) = list else {
        ctx.commit(batch)?;
        return Ok(());
    };
    let (first, last) = resolve_range(start, stop, list.len()).unwrap_or((list.len(), list.len()));
    let keep_end = if first >= list.len() { first } else { last + 1 };
    for i in (0..first).chain(keep_end..list.len()) {
        batch.delete_member(key, list.c.id, &sub(list.at(i)))?;
    }
    list.head = list.at(first.min(list.len()));
    list.c.len = keep_end - first.min(keep_end);
    list.changed = true;
    list.finish(&mut batch)?;
    ctx.commit(batch)?;
    Ok(())
}

/// LREM: removes up to |count| items equal to `element` (all for 0), from
/// the head for count ≥ 0, from the tail for count < 0; returns how many.
/// The caller holds `key`'s lock.
pub fn remove(ctx: &mut Ctx<'_>, key: &[u8], count: i64, element: &[u8]) -> Result<i64, Failure> {
    let (list, mut batch) = List::begin(ctx, key)?;
    let Some(mut list) = list else {
        ctx.commit(batch)?;
        return Ok(0);
    };
    let end = if count < 0 { End::Right } else { End::Left };
    let most = if count == 0 {
        u64::MAX
    } else {
        count.unsigned_abs()
    };
    let mut doomed = Vec::new();
    for item in list.walk(ctx, end) {
        let (pos, value) = item?;
        if value == element {
            doomed.push(pos);
            if doomed.len() as u64 == most {
                break;
            }
        }
    }
    if doomed.is_empty() {
        ctx.commit(batch)?;
        return Ok(0);
    }
    doomed.sort_unstable();
    let from = doomed[0];
    let kept: Vec<Vec<u8>> = list
        .items(ctx, from, list.len() - 1)?
        .into_iter()
        .enumerate()
        .filter(|(i, _)| doomed.binary_search(&(from + *i as u64)).is_err())
        .map(|(_, v)| v)
        .collect();
    list.rewrite_from(&mut batch, from, &kept)?;
    list.finish(&mut batch)?;
    ctx.commit(batch)?;
    Ok(doomed.len() as i64)
}

/// LINSERT: `element` before or after the first `pivot`; the length
/// after, -1 when there is no pivot, 0 when there is no list. The caller
/// holds `key`'s lock.
pub fn insert(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    after: bool,
    pivot: &[u8],
    element: &[u8],
) -> Result<i64, Failure> {
    let (list, mut batch) = List::begin(ctx, key)?;
    let Some(mut list) = list else {
        ctx.commit(batch)?;
        return Ok(0);
    };
    let mut found = None;
    for item in list.walk(ctx, End::Left) {
        let (pos, value) = item?;
        if value == pivot {
            found = Some(pos);
            break;
        }
    }
    let Some(pos) = found else {
        ctx.commit(batch)?;
        return Ok(-1);
    };
    let at = pos + u64::from(after);
    let mut tail = list.items(ctx, at, list.len().saturating_sub(1))?;
    if at >= list.len() {
        tail.clear();
    }
    tail.insert(0, element.to_vec());
    list.rewrite_from(&mut batch, at, &tail)?;
    let len = list.len();
    list.finish(&mut batch)?;
    ctx.commit(batch)?;
    Ok(len as i64)
}

/// LPOS's options.
#[derive(Debug, Clone, Copy)]
pub struct Position {
    /// RANK: which match to start at (negative: from the tail), never 0.
    pub rank: i64,
    /// COUNT: how many matches (0: all); None: LPOS without COUNT.
    pub count: u64,
    /// MAXLEN: items to compare at most (0: all).
    pub maxlen: u64,
}

/// LPOS: the positions of matches of `element`, as the options say.
pub fn position(
    ctx: &Ctx<'_>,
    key: &[u8],
    element: &[u8],
    o: Position,
) -> Result<Vec<u64>, Failure> {
    let Some(list) = List::read(ctx, key)? else {
        return Ok(Vec::new());
    };
    let end = if o.rank < 0 { End::Right } else { End::Left };
    let mut skip = o.rank.unsigned_abs() - 1;
    let mut out = Vec::new();
    for (compared, item) in list.walk(ctx, end).enumerate() {
        if o.maxlen != 0 && compared as u64 >= o.maxlen {
            break;
        }
        let (pos, value) = item?;
        if value != element {
            continue;
        }
        if skip > 0 {
            skip -= 1;
            continue;
        }
        out.push(pos);
        if o.count != 0 && out.len() as u64 >= o.count {
            break;
        }
    }
    Ok(out)
}

/// LMOVE (and RPOPLPUSH): pops from `src`'s `from` end, pushes to `dst`'s
/// `to` end; the item, None when `src` has no list. The caller holds both
/// keys' locks.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: a stored list has items"
)]
pub fn lmove(
    ctx: &mut Ctx<'_>,
    src: &[u8],
    dst: &[u8],
    from: End,
    to: End,
) -> Result<Option<Vec<u8>>, Failure> {
    let (source, mut batch) = List::begin(ctx, src)?;
    let Some(mut source) = source else {
        ctx.commit(batch)?;
        return Ok(None);
    };
    if src == dst {
        let item = source
            .pop(ctx, &mut batch, from)?
            .expect("a stored list has items");
        source.push(&mut batch, to, &item)?;
        source.finish(&mut batch)?;
        ctx.commit(batch)?;
        return Ok(Some(item));
    }
    let target = match ctx.get_raw(dst)? {
        Some(e) if e.expired(ctx.now_ms()) => {
            ctx.remove(&mut batch, dst, &e.value)?;
            None
        }
        other => List::of(dst, other)?,
    };
    let item = source
        .pop(ctx, &mut batch, from)?
        .expect("a stored list has items");
    let mut target = match target {
        Some(t) => t,
        None => List::create(ctx, dst)?,
    };
    target.push(&mut batch, to, &item)?;
    source.finish(&mut batch)?;
    target.finish(&mut batch)?;
    ctx.commit(batch)?;
    Ok(Some(item))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_resolve_as_redis_resolves_them() {
        assert_eq!(resolve_range(0, -1, 5), Some((0, 4)));
        assert_eq!(resolve_range(-100, 100, 5), Some((0, 4)));
        assert_eq!(resolve_range(3, 1, 5), None);
        assert_eq!(resolve_range(5, 10, 5), None);
        assert_eq!(resolve_range(0, -6, 5), None);
        assert_eq!(resolve_range(-2, -1, 5), Some((3, 4)));
        assert_eq!(resolve_range(0, 0, 0), None);
    }
}
