//! Where pops from the ends of a collection may start their scans.

use super::Db;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Most collections [`EndHints`] are kept for (the table is cleared when
/// it would grow past this: a hint is only a shortcut).
const END_HINTS_MOST: usize = 4096;

/// Where a scan for the first or last live member of a collection may
/// start: every live member's sub-key is `>= floor` and `<= ceiling`.
/// Pops from an end delete the members they take, and the store skips
/// each deleted entry until compaction drops it, so a queue popped from
/// its head would scan ever more of them; a pop starts at the hint its
/// last one left instead. Any member written to the collection forgets
/// its hints (the write may be outside them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndHints {
    /// No live member's sub-key is below this.
    pub floor: Option<Vec<u8>>,
    /// No live member's sub-key is above this.
    pub ceiling: Option<Vec<u8>>,
    /// Members popped at random since the hints were first set: deleted
    /// entries the store may still hold among the live ones.
    pub popped: u64,
}

#[derive(Debug, Default)]
pub(super) struct EndHintTable {
    /// Whether `by_id` may hold anything (a member write looks first).
    any: AtomicBool,
    by_id: Mutex<HashMap<u64, EndHints>>,
    /// Live members a set's pops near its floor draw from next (see
    /// `set::pop_near_floor`), at most [`END_HINTS_MOST`] sets' worth.
    candidates: Mutex<HashMap<u64, Vec<Vec<u8>>>>,
}

impl EndHintTable {
    fn by_id(&self) -> std::sync::MutexGuard<'_, HashMap<u64, EndHints>> {
        self.by_id.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn candidates(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Vec<Vec<u8>>>> {
        self.candidates.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Db {
    /// The [`EndHints`] of collection `id` (none known: both open).
    pub fn end_hints(&self, id: u64) -> EndHints {
        if !self.end_hints.any.load(Ordering::Acquire) {
            return EndHints::default();
        }
        self.end_hints.by_id().get(&id).cloned().unwrap_or_default()
    }

    /// Records that no live member of collection `id` is below (`floor`)
    /// or above sub-key `at`. The caller holds the collection's key
    /// locked and has committed the removals that make it true (never
    /// inside a transaction, whose batch could still fail as a whole; in
    /// a group's run, taken in to be committed before the key is unlocked,
    /// with every hint dropped if that commit fails).
    pub fn set_end_hint(&self, id: u64, floor: bool, at: Vec<u8>) {
        let mut by_id = self.end_hints.by_id();
        if by_id.len() >= END_HINTS_MOST && !by_id.contains_key(&id) {
            by_id.clear();
        }
        let hints = by_id.entry(id).or_default();
        if floor {
            hints.floor = Some(at);
        } else {
            hints.ceiling = Some(at);
        }
        self.end_hints.any.store(true, Ordering::Release);
    }

    /// Counts `n` members of collection `id` popped at random (committed,
    /// outside a transaction); nothing while it has no hints.
    pub fn count_pops(&self, id: u64, n: u64) {
        if !self.end_hints.any.load(Ordering::Acquire) {
            return;
        }
        let mut by_id = self.end_hints.by_id();
        if let Some(hints) = by_id.get_mut(&id) {
            hints.popped = hints.popped.saturating_add(n);
        }
    }

    /// Takes one of the members a pop of set `id` may draw next, at
    /// random (see [`Db::set_pop_candidates`]); None when none are left.
    pub fn take_pop_candidate(&self, id: u64, rng: &mut impl rand::Rng) -> Option<Vec<u8>> {
        if !self.end_hints.any.load(Ordering::Acquire) {
            return None;
        }
        let mut all = self.end_hints.candidates();
        let list = all.get_mut(&id)?;
        if list.is_empty() {
            all.remove(&id);
            return None;
        }
        let at = rng.gen_range(0..list.len());
        Some(list.swap_remove(at))
    }

    /// Keeps `members` of set `id`, live when the caller (holding the
    /// set's key locked) read them, for its next pops to draw from. A
    /// later removal may leave one stale, so a pop checks what it draws;
    /// any member written forgets them with the hints.
    pub fn set_pop_candidates(&self, id: u64, members: Vec<Vec<u8>>) {
        let mut all = self.end_hints.candidates();
        if all.len() >= END_HINTS_MOST && !all.contains_key(&id) {
            all.clear();
        }
        all.insert(id, members);
        self.end_hints.any.store(true, Ordering::Release);
    }

    /// Drops every collection's hints (a group's batch that set some
    /// failed to commit).
    pub(crate) fn forget_every_end_hint(&self) {
        self.end_hints.by_id().clear();
        self.end_hints.candidates().clear();
    }

    /// Drops collection `id`'s hints (a member is being written).
    pub(super) fn forget_end_hints(&self, id: u64) {
        if self.end_hints.any.load(Ordering::Acquire) {
            self.end_hints.by_id().remove(&id);
            self.end_hints.candidates().remove(&id);
        }
    }
}
