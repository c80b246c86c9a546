//! Leveled compaction: picks a level that is over its budget, merges its
//! tables (all of level 0, or one table of a deeper level) with the
//! overlapping tables of the next level, and writes the next level's new
//! tables. Versions no live snapshot can see are dropped; so are deletes
//! and range tombstones once nothing older is left below them.

use crate::blocks::BlockDevice;
use crate::error::Result;
use crate::iter::{LevelSource, MergeIter, Source, TableList};
use crate::sst::{
    BuiltTable, CursorSpec, Entry, EntryKind, RangeTombstone, TableBuffers, TableBuilder,
};
use crate::version::{Levels, Table, MAX_LEVELS};
use std::sync::Arc;

/// When and how tables are merged.
#[derive(Debug, Clone)]
pub struct CompactionConfig {
    /// Level 0 is compacted once it holds this many tables.
    pub l0_trigger: usize,
    /// Level 1's budget; each deeper level gets `multiplier` times more.
    pub level_base_bytes: u64,
    /// Growth of each level's budget over the one above.
    pub multiplier: u64,
    /// Output tables are cut near this size (never between two versions of a key).
    pub target_file_bytes: usize,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        CompactionConfig {
            l0_trigger: 4,
            level_base_bytes: 256 << 20,
            multiplier: 10,
            target_file_bytes: 64 << 20,
        }
    }
}

/// What one compaction merges.
#[derive(Debug)]
pub struct Job {
    /// The keyspace compacted.
    pub keyspace: u32,
    /// The level merged into the next one.
    pub level: usize,
    /// Its tables taken.
    pub inputs: Vec<Arc<Table>>,
    /// The next level's tables they overlap.
    pub next_inputs: Vec<Arc<Table>>,
    /// No table lives below the output level: deletes can go.
    pub bottommost: bool,
    /// Key ranges of tables at the merged levels that are not merged: a
    /// range tombstone reaching into one of them must stay.
    pub outside: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Smallest and largest key of `tables`, range tombstones included.
fn span(tables: &[Arc<Table>]) -> Option<(Vec<u8>, Vec<u8>)> {
    let lo = tables
        .iter()
        .flat_map(|t| {
            std::iter::once(&t.meta.smallest)
                .chain(t.reader.range_tombstones.iter().map(|r| &r.start))
        })
        .min()?;
    let hi = tables
        .iter()
        .flat_map(|t| {
            std::iter::once(&t.meta.largest).chain(t.reader.range_tombstones.iter().map(|r| &r.end))
        })
        .max()?;
    Some((lo.clone(), hi.clone()))
}

fn level_budget(cfg: &CompactionConfig, level: usize) -> u64 {
    cfg.level_base_bytes * cfg.multiplier.pow(level.saturating_sub(1) as u32)
}

/// Bytes compaction is behind on in one keyspace: all of level 0 once it
/// holds `l0_trigger` tables, plus each deeper level's bytes over its budget.
pub fn debt_bytes(cfg: &CompactionConfig, levels: &Levels) -> u64 {
    let l0 = levels.level(0);
    let l0_debt = if l0.len() >= cfg.l0_trigger {
        levels.level_bytes(0)
    } else {
        0
    };
    let deeper: u64 = (1..MAX_LEVELS - 1)
        .map(|l| levels.level_bytes(l).saturating_sub(level_budget(cfg, l)))
        .sum();
    l0_debt + deeper
}

/// Which compaction [`pick`] looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Urge {
    /// One the level sizes call for, if any.
    Due,
    /// One that pushes data down, if nothing is due ([`crate::Store::compact`]).
    Force,
    /// The shallowest level's, whatever is due: free space is short, and
    /// the newest deletes are there.
    Reclaim,
}

/// The most urgent compaction of a keyspace, if any is due. `cursor` picks
/// which table of a deeper level goes next (round robin). With
/// [`Urge::Force`] (a manual compaction), the shallowest non-empty level
/// above the deepest one is compacted even when within budget, so repeated
/// calls push all data down into one level; with [`Urge::Reclaim`], the
/// shallowest level's whatever is due.
pub fn pick(
    cfg: &CompactionConfig,
    keyspace: u32,
    levels: &Levels,
    cursor: usize,
    urge: Urge,
) -> Option<Job> {
    let force = urge != Urge::Due;
    let non_empty: Vec<usize> = (0..MAX_LEVELS)
        .filter(|&l| !levels.level(l).is_empty())
        .collect();
    let shallowest = *non_empty.first()?;
    let level = if urge == Urge::Reclaim {
        // Deletes are newest in the shallowest level: merged down first,
        // they take what they cover off the device.
        if non_empty.len() < 2 && levels.level(0).is_empty() {
            return None;
        }
        shallowest
    } else if levels.level(0).len() >= cfg.l0_trigger {
        0
    } else if let Some(l) =
        (1..MAX_LEVELS - 1).find(|&l| levels.level_bytes(l) > level_budget(cfg, l))
    {
        l
    } else if force && (non_empty.len() > 1 || !levels.level(0).is_empty()) {
        shallowest
    } else {
        return None;
    };
    let inputs: Vec<Arc<Table>> = if level == 0 {
        levels.level(0).to_vec()
    } else {
        let tables = levels.level(level);
        vec![tables[cursor % tables.len()].clone()]
    };
    // The span covers the inputs' range tombstones too: every next-level
    // table they may delete from joins the merge.
    let (smallest, largest) = span(&inputs)?;
    let next_inputs: Vec<Arc<Table>> = levels
        .level(level + 1)
        .iter()
        .filter(|t| t.meta.largest >= smallest && t.meta.smallest <= largest)
        .cloned()
        .collect();
    let bottommost = (level + 2..MAX_LEVELS).all(|l| levels.level(l).is_empty());
    let merged = |t: &Arc<Table>| inputs.iter().chain(&next_inputs).any(|m| Arc::ptr_eq(m, t));
    let outside = (level.max(1)..MAX_LEVELS)
        .flat_map(|l| levels.level(l).iter())
        .filter(|t| !merged(t))
        .map(|t| (t.meta.smallest.clone(), t.meta.largest.clone()))
        .collect();
    Some(Job {
        keyspace,
        level,
        inputs,
        next_inputs,
        bottommost,
        outside,
    })
}

/// Whether the job can move its tables down a level as they are: nothing
/// in the next level overlaps them and they do not overlap each other
/// (sequential inserts, typically). Only the manifest changes.
pub fn is_trivial_move(job: &Job) -> bool {
    if !job.next_inputs.is_empty() {
        return false;
    }
    let mut spans: Vec<(Vec<u8>, Vec<u8>)> = job
        .inputs
        .iter()
        .filter_map(|t| span(std::slice::from_ref(t)))
        .collect();
    spans.sort();
    spans.windows(2).all(|w| w[0].1 < w[1].0)
}

/// The snapshot stripe a sequence falls in: the index of the oldest live
/// snapshot at or above it (`snapshots.len()` for the newest stripe).
pub(crate) fn stripe(snapshots: &[u64], seq: u64) -> usize {
    snapshots.partition_point(|&s| s < seq)
}

/// What a compaction asks of a blob reference it keeps (key, reference):
/// a new reference when the value was moved.
pub type Relocate<'a> =
    dyn FnMut(&[u8], &[u8]) -> Result<Option<[u8; crate::blob::REF_BYTES]>> + 'a;

/// Merges the job's tables into new tables for the next level, streaming:
/// inputs are read block run by block run (not through the block cache)
/// and each output is handed to `emit` as soon as it reaches
/// `target_file_bytes`, so memory stays near one output table whatever the
/// size of the merge. `snapshots`: sequence numbers of live snapshots,
/// ascending. `room_bytes`, asked before each output, caps it below the
/// target when the device has no run that long free (a fragmented device
/// gets smaller tables, not a failed compaction). `relocate` sees each
/// blob reference kept (key, reference) and may return a new one: the
/// value moved out of a blob file that is mostly garbage.
#[allow(clippy::too_many_arguments)]
pub fn run(
    dev: &BlockDevice,
    job: &Job,
    snapshots: &[u64],
    target_file_bytes: usize,
    room_bytes: &dyn Fn() -> usize,
    buffers: &TableBuffers,
    emit: &mut dyn FnMut(BuiltTable) -> Result<()>,
    relocate: &mut Relocate<'_>,
) -> Result<()> {
    let spec = CursorSpec {
        use_cache: false,
        ..CursorSpec::default()
    };
    let mut sources: Vec<Source> = job
        .inputs
        .iter()
        .map(|t| Ok(Source::Table(t.reader.cursor(dev, spec.clone())?)))
        .collect::<Result<_>>()?;
    let next_level = job.next_inputs.iter().map(|t| t.reader.clone()).collect();
    sources.push(Source::Level(LevelSource::new(
        TableList::Owned(next_level),
        dev,
        spec,
    )?));
    let mut merge = MergeIter::new(dev, sources, false);
    let tombstones: Vec<RangeTombstone> = job
        .inputs
        .iter()
        .chain(&job.next_inputs)
        .flat_map(|t| t.reader.range_tombstones.iter().cloned())
        .collect();
    let live_tombstones: Vec<RangeTombstone> = tombstones
        .iter()
        // Without snapshots at the bottom, and with no unmerged table in its
        // range, every key a tombstone covers was in this merge and is gone.
        .filter(|t| {
            let reaches_outside = job.outside.iter().any(|(lo, hi)| {
                lo.as_slice() < t.end.as_slice() && hi.as_slice() >= t.start.as_slice()
            });
            !(job.bottommost && snapshots.is_empty() && !reaches_outside)
        })
        .cloned()
        .collect();
    let covered = |e: &Entry| {
        tombstones.iter().any(|t| {
            t.seq > e.seq
                && stripe(snapshots, t.seq) == stripe(snapshots, e.seq)
                && t.start.as_slice() <= e.key.as_slice()
                && e.key.as_slice() < t.end.as_slice()
        })
    };
    // Range tombstones go to every output (they are few, and reads apply
    // every table's tombstones, whatever its key range).
    let finish = |mut b: TableBuilder| {
        for t in &live_tombstones {
            b.add_range_tombstone(t.clone());
        }
        b.finish()
    };
    // An output ends past the target by at most one key's versions, then
    // gets its index and filter (about a tenth of it for small values).
    let new_builder = || TableBuilder::with_buffer(buffers.take(target_file_bytes / 8 * 9));
    let mut builder = new_builder();
    let mut cut_bytes = target_file_bytes.min(room_bytes());
    // The last version seen (key, stripe) and the last key kept.
    let (mut seen_key, mut seen_stripe, mut any_seen) = (Vec::new(), 0usize, false);
    let (mut kept_key, mut any_kept) = (Vec::new(), false);
    let mut outputs = 0usize;
    while let Some(e) = merge.next_entry()? {
        // Keep the newest version of each key in each snapshot stripe.
        let s = stripe(snapshots, e.seq);
        if any_seen && seen_key == e.key && seen_stripe == s {
            continue;
        }
        seen_key.clone_from(&e.key);
        (seen_stripe, any_seen) = (s, true);
        if covered(e) {
            continue;
        }
        // Oldest stripe, bottom of the tree: nothing older remains to hide.
        if e.kind == EntryKind::Delete && job.bottommost && s == 0 {
            continue;
        }
        // Never cut between two versions of one key.
        let new_key = !any_kept || kept_key != e.key;
        if new_key && builder.entries() > 0 && builder.estimated_bytes() >= cut_bytes {
            // The full builder's buffer comes back (once its table is
            // written) before the next one takes it.
            emit(finish(std::mem::take(&mut builder)))?;
            builder = new_builder();
            cut_bytes = target_file_bytes.min(room_bytes());
            outputs += 1;
        }
        let moved = match e.kind {
            EntryKind::Blob => relocate(&e.key, e.value())?,
            _ => None,
        };
        match moved {
            Some(reference) => builder.add_version(&e.key, e.seq, e.kind, &reference),
            None => builder.add(e),
        }
        kept_key.clone_from(&e.key);
        any_kept = true;
    }
    if builder.entries() > 0 {
        emit(finish(builder))?;
    } else if outputs == 0 && !live_tombstones.is_empty() {
        let mut built = finish(builder);
        // Only tombstones: the table spans what this merge emptied in the
        // next level, disjoint from every table left there.
        let merged = || job.inputs.iter().chain(&job.next_inputs);
        built.smallest = merged()
            .map(|t| t.meta.smallest.clone())
            .min()
            .unwrap_or_default();
        built.largest = merged()
            .map(|t| t.meta.largest.clone())
            .max()
            .unwrap_or_default();
        emit(built)?;
    }
    Ok(())
}
