//! Sorted sets: a record of type zset and two members per member
//! (docs/FORMAT.md, "Members"): `[0x00][member]` → its score (f64 LE),
//! and `[0x01][score key u64 BE][member]` → its score, which orders the
//! members as Redis does (by score, then by member bytes). Ranks are
//! counted by walking that order from an end (O(rank), as a skiplist
//! without spans would be).

use crate::ctx::{Ctx, MemberItem};
use crate::db::DbBatch;
use crate::error::{fail, Failure, WRONGTYPE};
use crate::hash::check_member;
use crate::record::{Collection, Entry, Value};
use sluice_store::StoreError;
use std::ops::Bound;

/// Longest member: its score index key is `[id][0x01][score 8][member]`.
pub const MAX_MEMBER_BYTES: usize = sluice_store::batch::MAX_KEY_BYTES - 17;

const BY_MEMBER: u8 = 0;
const BY_SCORE: u8 = 1;

/// The key that orders `score` (−0 as +0; never NaN).
pub fn score_key(score: f64) -> u64 {
    let bits = if score == 0.0 { 0 } else { score.to_bits() };
    if bits >> 63 == 0 {
        bits | (1 << 63)
    } else {
        !bits
    }
}

pub(crate) fn member_sub(member: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + member.len());
    k.push(BY_MEMBER);
    k.extend_from_slice(member);
    k
}

pub(crate) fn score_sub(score_key: u64, member: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + member.len());
    k.push(BY_SCORE);
    k.extend_from_slice(&score_key.to_be_bytes());
    k.extend_from_slice(member);
    k
}

pub(crate) fn score_of(value: &[u8]) -> Result<f64, StoreError> {
    let bytes: [u8; 8] = value
        .try_into()
        .map_err(|_| StoreError::BadInput("a sorted set's score is malformed".into()))?;
    Ok(f64::from_le_bytes(bytes))
}

/// A member and its score.
pub type Scored = (Vec<u8>, f64);

/// One end of a score range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScoreBound {
    /// Scores from (or to) this one, itself included.
    Included(f64),
    /// Scores past this one.
    Excluded(f64),
}

/// A score range, `min` to `max`, as ZRANGEBYSCORE parses it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreRange {
    /// The low end.
    pub min: ScoreBound,
    /// The high end.
    pub max: ScoreBound,
}

impl ScoreRange {
    /// The range's sub-key bounds in the score index.
    fn sub_bounds(&self) -> (Vec<u8>, Vec<u8>) {
        let lower = match self.min {
            ScoreBound::Included(s) => score_key(s),
            ScoreBound::Excluded(s) => score_key(s).saturating_add(1),
        };
        let upper = match self.max {
            ScoreBound::Included(s) => score_key(s).saturating_add(1),
            ScoreBound::Excluded(s) => score_key(s),
        };
        (score_sub(lower, &[]), score_sub(upper, &[]))
    }

    /// Whether `score` is inside.
    pub fn contains(&self, score: f64) -> bool {
        let above = match self.min {
            ScoreBound::Included(m) => score >= m,
            ScoreBound::Excluded(m) => score > m,
        };
        let below = match self.max {
            ScoreBound::Included(m) => score <= m,
            ScoreBound::Excluded(m) => score < m,
        };
        above && below
    }
}

/// A member range, as ZRANGEBYLEX parses it (`-`/`+` are unbounded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LexRange {
    /// The low end.
    pub min: Bound<Vec<u8>>,
    /// The high end.
    pub max: Bound<Vec<u8>>,
}

impl LexRange {
    /// Whether it holds nothing for being backwards (Redis answers such a
    /// range with nothing rather than an error).
    fn is_empty(&self) -> bool {
        match (&self.min, &self.max) {
            (Bound::Included(a), Bound::Included(b)) => a > b,
            (Bound::Included(a) | Bound::Excluded(a), Bound::Excluded(b))
            | (Bound::Excluded(a), Bound::Included(b)) => a >= b,
            _ => false,
        }
    }

    fn sub_bounds(&self) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
        let map = |b: &Bound<Vec<u8>>, unbounded: Bound<Vec<u8>>| match b {
            Bound::Included(m) => Bound::Included(member_sub(m)),
            Bound::Excluded(m) => Bound::Excluded(member_sub(m)),
            Bound::Unbounded => unbounded,
        };
        (
            map(&self.min, Bound::Included(vec![BY_MEMBER])),
            map(&self.max, Bound::Excluded(vec![BY_MEMBER + 1])),
        )
    }
}

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k),
        Bound::Excluded(k) => Bound::Excluded(k),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// The live sorted set at `key`; None if there is no key, WRONGTYPE if
/// it holds something else.
pub fn get(ctx: &Ctx<'_>, key: &[u8]) -> Result<Option<Collection>, Failure> {
    match ctx.get(key)? {
        None => Ok(None),
        Some(Entry {
            value: Value::ZSet(c),
            ..
        }) => Ok(Some(c)),
        Some(_) => Err(fail(WRONGTYPE)),
    }
}

/// `member`'s score.
pub fn score(ctx: &Ctx<'_>, c: Collection, member: &[u8]) -> Result<Option<f64>, Failure> {
    match ctx.member(c.id, &member_sub(member))? {
        None => Ok(None),
        Some(v) => Ok(Some(score_of(&v)?)),
    }
}

fn scored(item: MemberItem, prefix: usize) -> Result<Scored, Failure> {
    let (sub, value) = item?;
    Ok((sub[prefix..].to_vec(), score_of(&value)?))
}

/// Members in Redis's order (`reverse`: from the highest), from the
/// first on.
pub fn ordered<'c>(
    ctx: &'c Ctx<'_>,
    c: Collection,
    reverse: bool,
) -> impl Iterator<Item = Result<Scored, Failure>> + 'c {
    let (lo, hi) = ([BY_SCORE], [BY_SCORE + 1]);
    ctx.members(
        c.id,
        (Bound::Included(&lo[..]), Bound::Excluded(&hi[..])),
        reverse,
    )
    .map(|item| scored(item, 9))
}

/// Members whose scores are in `range`, in order or (`reverse`) from the
/// highest.
pub fn in_score_range<'c>(
    ctx: &'c Ctx<'_>,
    c: Collection,
    range: ScoreRange,
    reverse: bool,
) -> Box<dyn Iterator<Item = Result<Scored, Failure>> + 'c> {
    let (lo, hi) = range.sub_bounds();
    if lo >= hi {
        return Box::new(std::iter::empty());
    }
    Box::new(
        ctx.members(c.id, (Bound::Included(&lo), Bound::Excluded(&hi)), reverse)
            .map(|item| scored(item, 9)),
    )
}

/// Members in `range` by member bytes (Redis's lex order where every
/// score is equal), in order or (`reverse`) from the highest.
pub fn in_lex_range<'c>(
    ctx: &'c Ctx<'_>,
    c: Collection,
    range: &LexRange,
    reverse: bool,
) -> Box<dyn Iterator<Item = Result<Scored, Failure>> + 'c> {
    if range.is_empty() {
        return Box::new(std::iter::empty());
    }
    let (lo, hi) = range.sub_bounds();
    Box::new(
        ctx.members(c.id, (as_ref(&lo), as_ref(&hi)), reverse)
            .map(|item| scored(item, 1)),
    )
}

/// `member`'s rank (0: the lowest; `reverse`: 0 the highest).
pub fn rank(
    ctx: &Ctx<'_>,
    c: Collection,
    member: &[u8],
    reverse: bool,
) -> Result<Option<u64>, Failure> {
    let Some(s) = score(ctx, c, member)? else {
        return Ok(None);
    };
    let target = score_sub(score_key(s), member);
    let (lo, hi) = ([BY_SCORE], [BY_SCORE + 1]);
    let walk = ctx.members(
        c.id,
        (Bound::Included(&lo[..]), Bound::Excluded(&hi[..])),
        reverse,
    );
    for (n, item) in walk.enumerate() {
        if item?.0 == target {
            return Ok(Some(n as u64));
        }
    }
    Ok(None)
}

/// ZADD's options.
#[derive(Debug, Clone, Copy, Default)]
pub struct AddFlags {
    /// Only add new members.
    pub nx: bool,
    /// Only update existing members.
    pub xx: bool,
    /// Only update to a greater score.
    pub gt: bool,
    /// Only update to a lower score.
    pub lt: bool,
    /// Add the score to the member's (ZINCRBY, ZADD INCR).
    pub incr: bool,
}

/// What ZADD did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Added {
    /// New members.
    pub added: u64,
    /// Members whose score changed.
    pub updated: u64,
    /// With INCR: the member's score after, None when nothing was done.
    pub score: Option<f64>,
}

/// A sorted set being changed by one command.
pub struct Changing {
    key: Vec<u8>,
    c: Collection,
    expire_at_ms: u64,
    new: bool,
    changed: bool,
}

impl Changing {
    fn of(key: &[u8], entry: Option<Entry>) -> Result<Option<Changing>, Failure> {
        match entry {
            None => Ok(None),
            Some(Entry {
                value: Value::ZSet(c),
                expire_at_ms,
            }) => Ok(Some(Changing {
                key: key.to_vec(),
                c,
                expire_at_ms,
                new: false,
                changed: false,
            })),
            Some(_) => Err(fail(WRONGTYPE)),
        }
    }

    /// The sorted set at `key` for a command that changes it, and the
    /// batch. The caller holds `key`'s lock.
    pub fn begin<'a>(
        ctx: &mut Ctx<'a>,
        key: &[u8],
    ) -> Result<(Option<Changing>, DbBatch<'a>), Failure> {
        let (entry, batch) = ctx.begin(key)?;
        Ok((Changing::of(key, entry)?, batch))
    }

    /// An empty sorted set at `key` (its object id new).
    pub fn create(ctx: &Ctx<'_>, key: &[u8]) -> Result<Changing, Failure> {
        Ok(Changing {
            key: key.to_vec(),
            c: Collection {
                id: ctx.db().new_id()?,
                len: 0,
            },
            expire_at_ms: 0,
            new: true,
            changed: false,
        })
    }

    /// Its id and size.
    pub fn collection(&self) -> Collection {
        self.c
    }

    /// Sets `member`'s score to `score` (`old`: its score now, None when
    /// it is new).
    pub fn set(
        &mut self,
        batch: &mut DbBatch<'_>,
        member: &[u8],
        old: Option<f64>,
        score: f64,
    ) -> Result<(), StoreError> {
        let (key, id) = (&self.key, self.c.id);
        if let Some(old) = old {
            batch.delete_member(key, id, &score_sub(score_key(old), member))?;
        } else {
            self.c.len += 1;
        }
        // Redis keeps a small sorted set's scores as listpack text, where
        // "-0" reads back as the integer 0: −0 is stored as +0.
        let score = if score == 0.0 { 0.0 } else { score };
        let bytes = score.to_le_bytes();
        batch.put_member(key, id, &member_sub(member), &bytes)?;
        batch.put_member(key, id, &score_sub(score_key(score), member), &bytes)?;
        self.changed = true;
        Ok(())
    }

    /// Removes `member`, whose score is `score`.
    pub fn remove(
        &mut self,
        batch: &mut DbBatch<'_>,
        member: &[u8],
        score: f64,
    ) -> Result<(), StoreError> {
        batch.delete_member(&self.key, self.c.id, &member_sub(member))?;
        batch.delete_member(&self.key, self.c.id, &score_sub(score_key(score), member))?;
        self.c.len -= 1;
        self.changed = true;
        Ok(())
    }

    /// Writes the record as changed (or removes it once empty).
    pub fn finish(self, batch: &mut DbBatch<'_>) -> Result<(), StoreError> {
        if !self.changed {
            return Ok(());
        }
        batch.finish_collection(&self.key, Value::ZSet(self.c), self.expire_at_ms, self.new)
    }
}

/// Redis's error when INCR makes a NaN.
pub const NAN_SCORE: &str = "ERR resulting score is not a number (NaN)";

/// ZADD (and ZINCRBY): applies `items` under `flags`. The caller holds
/// `key`'s lock and has checked the options.
pub fn add(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    items: &[(f64, &[u8])],
    flags: AddFlags,
) -> Result<Added, Failure> {
    let mut each = add_runs(ctx, key, &[items], flags)?;
    Ok(each.pop().unwrap_or_default())
}

/// ZADDs of `runs` (each one command's items, all under `flags`) in
/// order, in one batch: what each did. The caller holds `key`'s lock.
pub fn add_runs(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    runs: &[&[(f64, &[u8])]],
    flags: AddFlags,
) -> Result<Vec<Added>, Failure> {
    for (_, member) in runs.iter().flat_map(|r| r.iter()) {
        check_member(member, MAX_MEMBER_BYTES)?;
    }
    let (zset, mut batch) = Changing::begin(ctx, key)?;
    let mut z = match zset {
        Some(z) => z,
        None if flags.xx => {
            ctx.commit(batch)?;
            return Ok(vec![Added::default(); runs.len()]);
        }
        None => Changing::create(ctx, key)?,
    };
    // The stored scores of the members named, looked up as one run.
    let mut stored: std::collections::HashMap<&[u8], Option<f64>> =
        std::collections::HashMap::new();
    if !z.new {
        let mut named: Vec<&[u8]> = Vec::new();
        for (_, member) in runs.iter().flat_map(|r| r.iter()) {
            if let std::collections::hash_map::Entry::Vacant(e) = stored.entry(member) {
                e.insert(None);
                named.push(member);
            }
        }
        let subs: Vec<Vec<u8>> = named.iter().map(|m| member_sub(m)).collect();
        let sub_refs: Vec<&[u8]> = subs.iter().map(Vec::as_slice).collect();
        let mut bad = None;
        ctx.member_each(z.c.id, &sub_refs, |i, value| {
            if let Some(v) = value {
                match score_of(v) {
                    Ok(s) => {
                        stored.insert(named[i], Some(s));
                    }
                    Err(e) => bad = Some(e),
                }
            }
        })?;
        if let Some(e) = bad {
            return Err(e.into());
        }
    }
    // Scores set earlier in this batch, which the store does not show
    // yet.
    let mut pending: std::collections::HashMap<&[u8], f64> = std::collections::HashMap::new();
    let mut each = Vec::with_capacity(runs.len());
    for run in runs {
        let mut out = Added::default();
        for (score, member) in run.iter() {
            let current = match pending.get(member) {
                Some(s) => Some(*s),
                None => stored.get(member).copied().flatten(),
            };
            let mut score = *score;
            match current {
                Some(cur) => {
                    if flags.nx {
                        continue;
                    }
                    if flags.incr {
                        score += cur;
                        if score.is_nan() {
                            return Err(fail(NAN_SCORE));
                        }
                    }
                    if (flags.lt && score >= cur) || (flags.gt && score <= cur) {
                        continue;
                    }
                    out.score = Some(score);
                    // -0 and 0 are equal: Redis keeps the old one then.
                    if score != cur {
                        z.set(&mut batch, member, Some(cur), score)?;
                        pending.insert(member, score);
                        out.updated += 1;
                    }
                }
                None if flags.xx => continue,
                None => {
                    z.set(&mut batch, member, None, score)?;
                    pending.insert(member, score);
                    out.score = Some(score);
                    out.added += 1;
                }
            }
        }
        each.push(out);
    }
    z.finish(&mut batch)?;
    ctx.commit(batch)?;
    Ok(each)
}

/// ZREM: how many of `members` were there. The caller holds `key`'s lock.
pub fn remove(ctx: &mut Ctx<'_>, key: &[u8], members: &[&[u8]]) -> Result<i64, Failure> {
    let (zset, mut batch) = Changing::begin(ctx, key)?;
    let Some(mut z) = zset else {
        ctx.commit(batch)?;
        return Ok(0);
    };
    let mut removed = 0;
    let mut seen = std::collections::HashSet::new();
    for m in members {
        if !seen.insert(*m) {
            continue;
        }
        if let Some(s) = score(ctx, z.c, m)? {
            z.remove(&mut batch, m, s)?;
            removed += 1;
        }
    }
    z.finish(&mut batch)?;
    ctx.commit(batch)?;
    Ok(removed)
}

/// Removes `doomed` (members with their scores) from the sorted set at
/// `key`; returns how many. The caller holds `key`'s lock and read them
/// under it.
pub fn remove_scored(ctx: &mut Ctx<'_>, key: &[u8], doomed: &[Scored]) -> Result<u64, Failure> {
    let (zset, mut batch) = Changing::begin(ctx, key)?;
    let Some(mut z) = zset else {
        ctx.commit(batch)?;
        return Ok(0);
    };
    for (m, s) in doomed {
        z.remove(&mut batch, m, *s)?;
    }
    z.finish(&mut batch)?;
    ctx.commit(batch)?;
    Ok(doomed.len() as u64)
}

/// ZPOPMIN/ZPOPMAX: up to `count` members from the low (or, `max`, the
/// high) end, removed. The caller holds `key`'s lock.
pub fn pop(ctx: &mut Ctx<'_>, key: &[u8], count: u64, max: bool) -> Result<Vec<Scored>, Failure> {
    let Some(c) = get(ctx, key)? else {
        return Ok(Vec::new());
    };
    // Start past the entries earlier pops deleted (see `EndHints`).
    let hints = ctx.db().end_hints(c.id);
    let (mut lo, mut hi) = (vec![BY_SCORE], vec![BY_SCORE + 1]);
    let (mut lo_bound, mut hi_bound) = (Bound::Included(&lo[..]), Bound::Excluded(&hi[..]));
    if let (false, Some(floor)) = (max, hints.floor) {
        lo = floor;
        lo_bound = Bound::Included(&lo[..]);
    }
    if let (true, Some(ceiling)) = (max, hints.ceiling) {
        hi = ceiling;
        hi_bound = Bound::Included(&hi[..]);
    }
    let picked: Vec<Scored> = ctx
        .members(c.id, (lo_bound, hi_bound), max)
        .map(|item| scored(item, 9))
        .take(count.min(c.len) as usize)
        .collect::<Result<_, _>>()?;
    remove_scored(ctx, key, &picked)?;
    if let Some((member, score)) = picked.last() {
        if !ctx.in_transaction() && (picked.len() as u64) < c.len {
            ctx.db()
                .set_end_hint(c.id, !max, score_sub(score_key(*score), member));
        }
    }
    Ok(picked)
}

/// Replaces whatever `dst` holds with a sorted set of `items` (the
/// *STORE commands); an empty result removes `dst`. The caller holds
/// `dst`'s lock.
pub fn store(ctx: &mut Ctx<'_>, dst: &[u8], items: &[Scored]) -> Result<i64, Failure> {
    let mut batch = ctx.batch();
    if let Some(old) = ctx.get_raw(dst)? {
        ctx.remove(&mut batch, dst, &old.value)?;
    }
    if !items.is_empty() {
        let mut z = Changing::create(ctx, dst)?;
        for (m, s) in items {
            z.set(&mut batch, m, None, *s)?;
        }
        z.finish(&mut batch)?;
    }
    ctx.commit(batch)?;
    Ok(items.len() as i64)
}

/// Every member with its score, by member bytes.
pub fn all(ctx: &Ctx<'_>, c: Collection) -> Result<Vec<Scored>, Failure> {
    let all = LexRange {
        min: Bound::Unbounded,
        max: Bound::Unbounded,
    };
    in_lex_range(ctx, c, &all, false).collect()
}

/// `count` members at random (distinct, at most the size; with `repeat`,
/// `count` picks that may repeat), with their scores.
pub fn random(
    ctx: &Ctx<'_>,
    c: Collection,
    count: u64,
    repeat: bool,
) -> Result<Vec<Scored>, Failure> {
    use rand::Rng;
    let all = all(ctx, c)?;
    if all.is_empty() {
        return Ok(Vec::new());
    }
    let mut rng = rand::thread_rng();
    if repeat {
        return Ok((0..count)
            .map(|_| all[rng.gen_range(0..all.len())].clone())
            .collect());
    }
    let picked = rand::seq::index::sample(&mut rng, all.len(), (count as usize).min(all.len()));
    Ok(picked.into_iter().map(|i| all[i].clone()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn score_keys_order_as_the_scores() {
        let scores = [
            f64::NEG_INFINITY,
            -1e300,
            -2.5,
            -1.0,
            -5e-324,
            0.0,
            5e-324,
            1.0,
            2.5,
            1e300,
            f64::INFINITY,
        ];
        for pair in scores.windows(2) {
            assert!(score_key(pair[0]) < score_key(pair[1]), "{pair:?}");
        }
        assert_eq!(score_key(-0.0), score_key(0.0));
    }
}
