//! The versions of recently deleted documents, per index: a write of a
//! deleted id soon after carries its version count on, as Elasticsearch's
//! version map does.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a deleted document's version is remembered, so that a write
/// of its id soon after carries the count on (Elasticsearch's
/// `index.gc_deletes`, 60 s).
pub const GC_DELETES: Duration = Duration::from_secs(60);
/// Most deleted documents' versions one index remembers; past it the oldest
/// are forgotten first.
pub const MAX_TOMBSTONES: usize = 1 << 20;

/// The versions of recently deleted documents of one index, in memory only
/// (as Elasticsearch's version map holds them): a restart forgets them, as
/// [`GC_DELETES`] would.
#[derive(Debug)]
pub struct Tombstones {
    inner: Mutex<TombstoneMap>,
    limit: usize,
}

impl Default for Tombstones {
    fn default() -> Self {
        Tombstones::with_limit(MAX_TOMBSTONES)
    }
}

#[derive(Debug, Default)]
struct TombstoneMap {
    versions: HashMap<String, (u64, Instant)>,
    /// Ids in the order they were deleted (an id may be listed again).
    order: VecDeque<(String, Instant)>,
}

impl Tombstones {
    /// Remembering at most `limit` deleted documents.
    pub fn with_limit(limit: usize) -> Tombstones {
        Tombstones {
            inner: Mutex::default(),
            limit,
        }
    }

    /// The version a document was deleted at, if that was within
    /// [`GC_DELETES`].
    pub fn recent(&self, id: &str) -> Option<u64> {
        let map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        map.versions
            .get(id)
            .filter(|(_, at)| at.elapsed() < GC_DELETES)
            .map(|(v, _)| *v)
    }

    /// Deleted documents remembered now.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .versions
            .len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A request's changes: ids deleted at a version (`Some`), or written
    /// again (`None`).
    pub(crate) fn apply(&self, changes: HashMap<String, Option<u64>>) {
        if changes.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for (id, change) in changes {
            match change {
                Some(v) => {
                    map.versions.insert(id.clone(), (v, now));
                    map.order.push_back((id, now));
                }
                None => {
                    map.versions.remove(&id);
                }
            }
        }
        // Forget what is past its time, or past the limit, oldest first.
        while let Some((id, at)) = map.order.front().cloned() {
            let expired = at.elapsed() >= GC_DELETES || map.versions.len() > self.limit;
            if !expired && map.order.len() <= 2 * self.limit {
                break;
            }
            map.order.pop_front();
            if map.versions.get(&id).is_some_and(|(_, when)| *when == at) {
                map.versions.remove(&id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tombstones_remember_the_newest_version_and_forget_the_oldest_past_the_limit() {
        let t = Tombstones::with_limit(3);
        let change = |pairs: &[(&str, Option<u64>)]| {
            pairs
                .iter()
                .map(|(id, v)| (id.to_string(), *v))
                .collect::<HashMap<_, _>>()
        };
        t.apply(change(&[("a", Some(2)), ("b", Some(1))]));
        t.apply(change(&[("a", Some(4))]));
        assert_eq!(t.recent("a"), Some(4));
        // Written again: forgotten.
        t.apply(change(&[("b", None)]));
        assert_eq!(t.recent("b"), None);
        for (i, id) in ["c", "d", "e", "f"].iter().enumerate() {
            t.apply(change(&[(id, Some(i as u64 + 1))]));
        }
        assert!(t.len() <= 3, "{}", t.len());
        assert_eq!(t.recent("a"), None, "the oldest goes first");
        assert_eq!(t.recent("f"), Some(4));
    }
}
