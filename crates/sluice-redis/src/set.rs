//! Sets: a record of type set and one member `[id][member]` → empty per
//! member (docs/FORMAT.md, "Members"). Members come back in byte order.
//! Following Redis 7.0's t_set.c for what each operation answers.

use crate::ctx::Ctx;
use crate::db::DbBatch;
use crate::error::{fail, Failure, WRONGTYPE};
use crate::hash::{check_member, MAX_FIELD_BYTES};
use crate::record::{Collection, Entry, Value};
use rand::Rng;
use sluice_store::StoreError;
use std::collections::BTreeSet;
use std::ops::Bound;

/// Sets at most this long are read whole to pick random members from
/// (uniformly); a longer one is sampled by position.
const READ_WHOLE_MOST: u64 = 1 << 16;

/// A set being changed by one command: its record as it will be written.
struct Changing {
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
                value: Value::Set(c),
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

    fn create(ctx: &Ctx<'_>, key: &[u8]) -> Result<Changing, Failure> {
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

    fn add(&mut self, batch: &mut DbBatch<'_>, member: &[u8]) -> Result<(), StoreError> {
        batch.put_member(&self.key, self.c.id, member, &[])?;
        self.c.len += 1;
        self.changed = true;
        Ok(())
    }

    fn remove(&mut self, batch: &mut DbBatch<'_>, member: &[u8]) -> Result<(), StoreError> {
        batch.delete_member(&self.key, self.c.id, member)?;
        self.c.len -= 1;
        self.changed = true;
        Ok(())
    }

    fn finish(self, batch: &mut DbBatch<'_>) -> Result<(), StoreError> {
        if !self.changed {
            return Ok(());
        }
        batch.finish_collection(&self.key, Value::Set(self.c), self.expire_at_ms, self.new)
    }
}

/// The live set at `key`: id and size; None if there is no key, WRONGTYPE
/// if it holds something else.
pub fn get(ctx: &Ctx<'_>, key: &[u8]) -> Result<Option<Collection>, Failure> {
    match ctx.get(key)? {
        None => Ok(None),
        Some(Entry {
            value: Value::Set(c),
            ..
        }) => Ok(Some(c)),
        Some(_) => Err(fail(WRONGTYPE)),
    }
}

/// Every member, in byte order (empty: no such set).
pub fn members(ctx: &Ctx<'_>, key: &[u8]) -> Result<Vec<Vec<u8>>, Failure> {
    match get(ctx, key)? {
        None => Ok(Vec::new()),
        Some(c) => Ok(ctx.all_members(c.id)?.into_iter().map(|(m, _)| m).collect()),
    }
}

/// Whether `member` is in the set at `key`.
pub fn contains(ctx: &Ctx<'_>, key: &[u8], member: &[u8]) -> Result<bool, Failure> {
    match get(ctx, key)? {
        None => Ok(false),
        Some(c) => Ok(ctx.member(c.id, member)?.is_some()),
    }
}

/// SADD: how many members were new. The caller holds `key`'s lock.
pub fn add(ctx: &mut Ctx<'_>, key: &[u8], members: &[&[u8]]) -> Result<i64, Failure> {
    Ok(add_runs(ctx, key, &[members])?[0])
}

/// SADDs of `runs` (each one command's members) in order, in one batch:
/// how many members each added. The caller holds `key`'s lock.
pub fn add_runs(ctx: &mut Ctx<'_>, key: &[u8], runs: &[&[&[u8]]]) -> Result<Vec<i64>, Failure> {
    for m in runs.iter().flat_map(|r| r.iter()) {
        check_member(m, MAX_FIELD_BYTES)?;
    }
    let (entry, mut batch) = ctx.begin(key)?;
    let mut set = match Changing::of(key, entry)? {
        Some(s) => s,
        None => Changing::create(ctx, key)?,
    };
    let mentions: Vec<&[u8]> = runs.iter().flat_map(|r| r.iter().copied()).collect();
    let mut present = ctx
        .mentions_present(set.c.id, set.new, &mentions)?
        .into_iter();
    let mut added = Vec::with_capacity(runs.len());
    for run in runs {
        let mut n = 0;
        for m in run.iter() {
            // A repeat is skipped, as a stored member is.
            if present.next().flatten() == Some(false) {
                set.add(&mut batch, m)?;
                n += 1;
            }
        }
        added.push(n);
    }
    set.finish(&mut batch)?;
    ctx.commit(batch)?;
    Ok(added)
}

/// SREM: how many members were there. The caller holds `key`'s lock.
pub fn remove(ctx: &mut Ctx<'_>, key: &[u8], members: &[&[u8]]) -> Result<i64, Failure> {
    let (entry, mut batch) = ctx.begin(key)?;
    let Some(mut set) = Changing::of(key, entry)? else {
        ctx.commit(batch)?;
        return Ok(0);
    };
    let mut removed = 0;
    let mut seen = std::collections::HashSet::new();
    for m in members {
        if seen.insert(*m) && ctx.member(set.c.id, m)?.is_some() {
            set.remove(&mut batch, m)?;
            removed += 1;
        }
    }
    set.finish(&mut batch)?;
    ctx.commit(batch)?;
    Ok(removed)
}

/// SMOVE: whether `member` moved from `src` to `dst`. The caller holds
/// both keys' locks.
pub fn smove(ctx: &mut Ctx<'_>, src: &[u8], dst: &[u8], member: &[u8]) -> Result<bool, Failure> {
    let (entry, mut batch) = ctx.begin(src)?;
    // Redis answers 0 for a missing source before it looks at the
    // destination's type.
    let Some(mut source) = Changing::of(src, entry)? else {
        ctx.commit(batch)?;
        return Ok(false);
    };
    let target = match ctx.get_raw(dst)? {
        Some(e) if e.expired(ctx.now_ms()) => {
            ctx.remove(&mut batch, dst, &e.value)?;
            None
        }
        other => Changing::of(dst, other)?,
    };
    if src == dst {
        return Ok(ctx.member(source.c.id, member)?.is_some());
    }
    if ctx.member(source.c.id, member)?.is_none() {
        ctx.commit(batch)?;
        return Ok(false);
    }
    source.remove(&mut batch, member)?;
    let mut target = match target {
        Some(t) => t,
        None => Changing::create(ctx, dst)?,
    };
    if target.new || ctx.member(target.c.id, member)?.is_none() {
        target.add(&mut batch, member)?;
    }
    source.finish(&mut batch)?;
    target.finish(&mut batch)?;
    ctx.commit(batch)?;
    Ok(true)
}

/// `count` members picked at random: distinct ones (at most the set's
/// size), or with `repeat`, `count` picks that may repeat. From a set of
/// at most [`READ_WHOLE_MOST`] members the picks are uniform.
pub fn random(
    ctx: &Ctx<'_>,
    c: Collection,
    count: u64,
    repeat: bool,
) -> Result<Vec<Vec<u8>>, Failure> {
    let picked = random_entries(ctx, c, count, repeat)?;
    Ok(picked.into_iter().map(|(member, _)| member).collect())
}

/// [`random`] over a collection whose members are one entry each (a set's
/// members, a hash's fields), with each entry's value.
pub fn random_entries(
    ctx: &Ctx<'_>,
    c: Collection,
    count: u64,
    repeat: bool,
) -> Result<Vec<crate::db::FieldValue>, Failure> {
    let mut rng = rand::thread_rng();
    if c.len <= READ_WHOLE_MOST {
        let all = ctx.all_members(c.id)?;
        if all.is_empty() {
            return Ok(Vec::new());
        }
        if repeat {
            return Ok((0..count)
                .map(|_| all[rng.gen_range(0..all.len())].clone())
                .collect());
        }
        let picked = rand::seq::index::sample(&mut rng, all.len(), (count as usize).min(all.len()));
        return Ok(picked.into_iter().map(|i| all[i].clone()).collect());
    }
    // A long set: positions drawn at random, each read by walking to it
    // in one pass over the members in order.
    let want = if repeat { count } else { count.min(c.len) };
    let mut positions: Vec<u64> = if repeat {
        (0..want).map(|_| rng.gen_range(0..c.len)).collect()
    } else {
        let mut chosen = BTreeSet::new();
        while (chosen.len() as u64) < want {
            chosen.insert(rng.gen_range(0..c.len));
        }
        chosen.into_iter().collect()
    };
    positions.sort_unstable();
    let mut out = Vec::with_capacity(positions.len());
    let mut next = positions.iter().peekable();
    let all = (std::ops::Bound::Unbounded, std::ops::Bound::Unbounded);
    for (pos, item) in ctx.members(c.id, all, false).enumerate() {
        let entry = item?;
        while next.peek().is_some_and(|p| **p == pos as u64) {
            out.push(entry.clone());
            next.next();
        }
        if next.peek().is_none() {
            break;
        }
    }
    if repeat {
        use rand::seq::SliceRandom;
        out.shuffle(&mut rng);
    }
    Ok(out)
}

/// Sets larger than this pop by seeking (see [`seek_random`]) rather than
/// by reading every member each time.
const SEEK_PICKS_FROM: u64 = 128;

/// A point near the members between `first` and `last` drawn at random:
/// their common prefix, then eight bytes each drawn between the two
/// members' bytes at that place. Drawing byte by byte keeps the points
/// among the bytes members use (digits stay digits), so that picks spread
/// over the members instead of piling up after the gaps between them.
fn point_between(first: &[u8], last: &[u8], rng: &mut impl rand::Rng) -> Vec<u8> {
    let common = first.iter().zip(last).take_while(|(a, b)| a == b).count();
    let mut point = first[..common].to_vec();
    for i in common..common + 8 {
        let (a, b) = (first.get(i).copied(), last.get(i).copied());
        let (lo, hi) = match (a, b) {
            (Some(a), Some(b)) => (a.min(b), a.max(b)),
            (Some(x), None) | (None, Some(x)) => (x, x),
            (None, None) => break,
        };
        point.push(rng.gen_range(lo..=hi));
    }
    point
}

/// The most members a pick of [`seek_random`] takes from one random
/// point (one store walk each: a walk's start is what a pick costs).
const SEEK_RUN_MOST: u64 = 8;

/// Members a pick of `count` takes per random point: one for a few, up
/// to [`SEEK_RUN_MOST`] adjacent ones when many are drawn at once.
fn seek_run(count: u64) -> u64 {
    (count / 32).clamp(1, SEEK_RUN_MOST)
}

/// `count` distinct members (fewer than the set has) picked by seeking
/// random points between the first and last member and taking the next
/// member not yet picked (the next [`seek_run`] of them when many are
/// drawn), wrapping to the start: a few reads per pick whatever the set's
/// size. Random as RANDOMKEY is, not uniform (a member after a wide gap
/// in byte order is likelier); SPOP promises random members, SRANDMEMBER's
/// picks stay uniform ([`random`]).
fn seek_random(ctx: &Ctx<'_>, c: Collection, count: u64) -> Result<Vec<Vec<u8>>, Failure> {
    let Some((first, last)) = ends(ctx, c)? else {
        return Ok(Vec::new());
    };
    let mut rng = rand::thread_rng();
    let mut picked: BTreeSet<Vec<u8>> = BTreeSet::new();
    let run = seek_run(count);
    while (picked.len() as u64) < count {
        let point = point_between(&first, &last, &mut rng);
        let want = run.min(count - picked.len() as u64) as usize;
        let next_unpicked = |from: &[u8]| -> Result<Option<Vec<Vec<u8>>>, Failure> {
            let mut found = Vec::new();
            for item in ctx.members(c.id, (Bound::Included(from), Bound::Unbounded), false) {
                let (member, _) = item?;
                if !picked.contains(&member) {
                    found.push(member);
                    if found.len() == want {
                        break;
                    }
                }
            }
            Ok((!found.is_empty()).then_some(found))
        };
        // Past the last member: wrap to the first (only then is a second
        // scan made). Each scan that ends tells where the live members
        // end: nothing unpicked above the point, nothing below the member
        // the wrap found (what this pop picked goes with it). Kept as the
        // set's end hints, later points fall among live members, and no
        // later pop walks again the deleted entries of earlier ones
        // outside them (as a set popped nearly empty would, every time).
        let tighten = !ctx.in_transaction();
        let found = match next_unpicked(&point)? {
            Some(member) => Some(member),
            None => {
                if tighten {
                    ctx.db().set_end_hint(c.id, false, point.clone());
                }
                let wrapped = next_unpicked(&first)?;
                if let (Some(members), true) = (&wrapped, tighten) {
                    ctx.db().set_end_hint(c.id, true, members[0].clone());
                }
                wrapped
            }
        };
        match found {
            Some(members) => picked.extend(members),
            None => break,
        };
    }
    Ok(picked.into_iter().collect())
}

/// A set popped at random this many times over its live members since
/// its hints were set is mostly deleted entries: a random point would
/// walk past many of them to a live member, so its pops take from the
/// floor instead ([`pop_near_floor`]).
const SPARSE_POPS_PER_MEMBER: u64 = 2;

/// Live members a pop near the floor reads at once, for its later pops
/// to draw from.
const FLOOR_CANDIDATES: usize = 64;

/// Whether set `c` is popped sparse (see [`SPARSE_POPS_PER_MEMBER`]).
/// Never in a transaction, whose view may hold its own uncommitted pops.
fn popped_sparse(ctx: &Ctx<'_>, c: Collection) -> bool {
    if ctx.in_transaction() {
        return false;
    }
    let hints = ctx.db().end_hints(c.id);
    hints.floor.is_some() && hints.popped >= SPARSE_POPS_PER_MEMBER.saturating_mul(c.len)
}

/// `count` distinct members of set `c` (fewer than it has), drawn at
/// random from its lowest live members: [`FLOOR_CANDIDATES`] of them are
/// read from the floor hint on at a time and kept (the floor raised to
/// the first), and each pop draws from those left, checking the one it
/// draws is still there. So the deleted entries below the floor are
/// walked once, not once a pop. Random among the lowest members only:
/// SPOP of a set mostly popped already trades the spread of its picks for
/// not walking its deleted entries.
fn pop_near_floor(ctx: &Ctx<'_>, c: Collection, count: u64) -> Result<Vec<Vec<u8>>, Failure> {
    let db = ctx.db();
    let mut rng = rand::thread_rng();
    let mut out: BTreeSet<Vec<u8>> = BTreeSet::new();
    while (out.len() as u64) < count {
        if let Some(m) = db.take_pop_candidate(c.id, &mut rng) {
            if !out.contains(&m) && ctx.member(c.id, &m)?.is_some() {
                out.insert(m);
            }
            continue;
        }
        let floor = db.end_hints(c.id).floor.unwrap_or_default();
        let want = FLOOR_CANDIDATES.max((count as usize).saturating_sub(out.len()));
        let mut read = Vec::with_capacity(want.min(1 << 16));
        for item in ctx.members(c.id, (Bound::Included(&floor[..]), Bound::Unbounded), false) {
            let (m, _) = item?;
            if !out.contains(&m) {
                read.push(m);
                if read.len() == want {
                    break;
                }
            }
        }
        let Some(first) = read.first() else {
            break;
        };
        db.set_end_hint(c.id, true, first.clone());
        db.set_pop_candidates(c.id, read);
    }
    Ok(out.into_iter().collect())
}

/// Every member of set `c`, read from its floor hint on (no live member
/// lies below it; see [`crate::db::EndHints`]).
fn every_member_from_floor(ctx: &Ctx<'_>, c: Collection) -> Result<Vec<Vec<u8>>, Failure> {
    let floor = ctx.db().end_hints(c.id).floor.unwrap_or_default();
    let range = (Bound::Included(&floor[..]), Bound::Unbounded);
    let mut out = Vec::with_capacity(c.len.min(1 << 16) as usize);
    for item in ctx.members(c.id, range, false) {
        out.push(item?.0);
    }
    Ok(out)
}

/// A set's first and last members (or bounds on them).
type Ends = (Vec<u8>, Vec<u8>);

/// The first and last members of set `c`, or bounds on them that an
/// earlier pop left (see [`crate::db::EndHints`]): they only shape where
/// the random points fall, so a bound whose member was popped since serves
/// as well, and each pop saves the two scans to the ends past the entries
/// the earlier pops deleted. None: the set has no member.
fn ends(ctx: &Ctx<'_>, c: Collection) -> Result<Option<Ends>, Failure> {
    let hints = ctx.db().end_hints(c.id);
    if let (Some(floor), Some(ceiling)) = (hints.floor, hints.ceiling) {
        return Ok(Some((floor, ceiling)));
    }
    let all = (Bound::Unbounded, Bound::Unbounded);
    let end = |reverse: bool| -> Result<Option<Vec<u8>>, Failure> {
        Ok(ctx
            .members(c.id, all, reverse)
            .next()
            .transpose()?
            .map(|(m, _)| m))
    };
    let (Some(first), Some(last)) = (end(false)?, end(true)?) else {
        return Ok(None);
    };
    // True now, and pops only make them truer; a transaction's view may
    // hold writes its batch has yet to commit, so it leaves none.
    if !ctx.in_transaction() {
        ctx.db().set_end_hint(c.id, true, first.clone());
        ctx.db().set_end_hint(c.id, false, last.clone());
    }
    Ok(Some((first, last)))
}

/// SPOP of `count` members (distinct, at random); None: no such set.
/// The caller holds `key`'s lock.
pub fn pop(ctx: &mut Ctx<'_>, key: &[u8], count: u64) -> Result<Option<Vec<Vec<u8>>>, Failure> {
    let (entry, mut batch) = ctx.begin(key)?;
    let Some(mut set) = Changing::of(key, entry)? else {
        ctx.commit(batch)?;
        return Ok(None);
    };
    // A set popped one member at a time is soon mostly deleted entries
    // the store skips until compaction drops them: a single pop seeks
    // (a few of them skipped, not all), and taking every member starts at
    // the floor an earlier pop left.
    let id = set.c.id;
    let seek = count == 1 || (set.c.len > SEEK_PICKS_FROM && count <= set.c.len / 4);
    let picked = if count >= set.c.len {
        every_member_from_floor(ctx, set.c)?
    } else if seek && popped_sparse(ctx, set.c) {
        pop_near_floor(ctx, set.c, count)?
    } else if seek {
        seek_random(ctx, set.c, count)?
    } else {
        random(ctx, set.c, count, false)?
    };
    for m in &picked {
        set.remove(&mut batch, m)?;
    }
    set.finish(&mut batch)?;
    ctx.commit(batch)?;
    if !ctx.in_transaction() {
        ctx.db().count_pops(id, picked.len() as u64);
    }
    Ok(Some(picked))
}

/// Replaces whatever `dst` holds with a set of `members` (the *STORE
/// commands); returns its size. An empty result removes `dst`. The caller
/// holds `dst`'s lock.
pub fn store(ctx: &mut Ctx<'_>, dst: &[u8], members: &BTreeSet<Vec<u8>>) -> Result<i64, Failure> {
    let mut batch = ctx.batch();
    if let Some(old) = ctx.get_raw(dst)? {
        ctx.remove(&mut batch, dst, &old.value)?;
    }
    if !members.is_empty() {
        let mut set = Changing::create(ctx, dst)?;
        for m in members {
            set.add(&mut batch, m)?;
        }
        set.finish(&mut batch)?;
    }
    ctx.commit(batch)?;
    Ok(members.len() as i64)
}

/// The members of each of `keys` (a missing key: an empty set), checking
/// every key's type first as Redis does.
pub fn each(ctx: &Ctx<'_>, keys: &[&[u8]]) -> Result<Vec<Option<Collection>>, Failure> {
    keys.iter().map(|k| get(ctx, k)).collect()
}

/// SINTER of the sets `found` lists (`each`'s result); at most `limit`
/// members (0: all).
pub fn inter(
    ctx: &Ctx<'_>,
    found: &[Option<Collection>],
    limit: u64,
) -> Result<BTreeSet<Vec<u8>>, Failure> {
    let mut out = BTreeSet::new();
    if found.iter().any(Option::is_none) || found.is_empty() {
        return Ok(out);
    }
    let mut sets: Vec<Collection> = found.iter().flatten().copied().collect();
    sets.sort_by_key(|c| c.len);
    let all = (std::ops::Bound::Unbounded, std::ops::Bound::Unbounded);
    'members: for item in ctx.members(sets[0].id, all, false) {
        let (m, _) = item?;
        for other in &sets[1..] {
            if ctx.member(other.id, &m)?.is_none() {
                continue 'members;
            }
        }
        out.insert(m);
        if limit != 0 && out.len() as u64 >= limit {
            break;
        }
    }
    Ok(out)
}

/// SUNION of the sets `found` lists.
pub fn union(ctx: &Ctx<'_>, found: &[Option<Collection>]) -> Result<BTreeSet<Vec<u8>>, Failure> {
    let mut out = BTreeSet::new();
    for c in found.iter().flatten() {
        for (m, _) in ctx.all_members(c.id)? {
            out.insert(m);
        }
    }
    Ok(out)
}

/// SDIFF: the first set's members in none of the others.
pub fn diff(ctx: &Ctx<'_>, found: &[Option<Collection>]) -> Result<BTreeSet<Vec<u8>>, Failure> {
    let mut out = BTreeSet::new();
    let Some(Some(first)) = found.first() else {
        return Ok(out);
    };
    let all = (std::ops::Bound::Unbounded, std::ops::Bound::Unbounded);
    'members: for item in ctx.members(first.id, all, false) {
        let (m, _) = item?;
        for other in found[1..].iter().flatten() {
            if ctx.member(other.id, &m)?.is_some() {
                continue 'members;
            }
        }
        out.insert(m);
    }
    Ok(out)
}
