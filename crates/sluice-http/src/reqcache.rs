//! The request cache (Elasticsearch's shard request cache, here per
//! request): the answers of `_count` and of size-0 searches, kept under
//! the generation of every index they read. A write to an index moves its
//! generation on once the write is visible, so a cached answer is never
//! served after a write it does not include; `request_cache=false` skips
//! the cache, as in Elasticsearch.
//!
//! Bounded: at most [`MAX_ENTRIES`] answers and [`MAX_BYTES`] of them,
//! the oldest dropped first; an answer over [`MAX_ENTRY_BYTES`] is not
//! kept. Answers of older generations are never looked up again and age
//! out the same way.

use crate::catalog::Index;
use crate::wire::Request;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Most answers kept.
pub const MAX_ENTRIES: usize = 4096;
/// Most bytes of answers kept (keys and aggregation JSON counted).
pub const MAX_BYTES: usize = 64 << 20;
/// Larger answers are not kept.
pub const MAX_ENTRY_BYTES: usize = 4 << 20;

/// A cached answer.
#[derive(Debug, Clone)]
pub enum Cached {
    /// `_count`'s count.
    Count(u64),
    /// A size-0 search: its matches counted (and whether all were) and its
    /// aggregations.
    Search {
        /// Matching documents counted.
        total: u64,
        /// Whether `total` is all of them.
        exact: bool,
        /// The `aggregations` object, if asked for.
        aggregations: Option<Arc<Value>>,
    },
}

impl Cached {
    fn size_bytes(&self) -> usize {
        match self {
            Cached::Count(_) => 8,
            Cached::Search { aggregations, .. } => {
                32 + aggregations.as_ref().map_or(0, |a| a.to_string().len())
            }
        }
    }
}

#[derive(Default)]
struct Entries {
    map: HashMap<String, (Cached, usize)>,
    order: VecDeque<String>,
    bytes: usize,
}

/// See the module documentation.
#[derive(Default)]
pub struct RequestCache {
    entries: Mutex<Entries>,
    /// Answers served from the cache.
    pub hits: AtomicU64,
    /// Cacheable requests that were not in it.
    pub misses: AtomicU64,
}

impl std::fmt::Debug for RequestCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RequestCache({} hits, {} misses)",
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed)
        )
    }
}

impl RequestCache {
    /// The generations of `indices`, read before the snapshot an answer
    /// is computed on: an answer kept under them may include later writes
    /// but never lacks an earlier one.
    pub fn generations(indices: &[Arc<Index>]) -> Vec<u64> {
        indices.iter().map(|i| i.generation()).collect()
    }

    /// The key of `req` (kind `count` or `search`) over `indices` at
    /// `generations`; None when the request asks not to be cached.
    pub fn key(
        kind: &str,
        req: &Request,
        body: &Value,
        indices: &[Arc<Index>],
        generations: &[u64],
    ) -> Option<String> {
        if req.param("request_cache") == Some("false") {
            return None;
        }
        let mut key = String::with_capacity(128);
        key.push_str(kind);
        for (index, generation) in indices.iter().zip(generations) {
            key.push('\0');
            key.push_str(&index.uuid);
            key.push(':');
            key.push_str(&generation.to_string());
        }
        let mut params: Vec<&(String, String)> = req
            .params
            .iter()
            .filter(|(n, _)| n != "request_cache" && n != "pretty" && n != "filter_path")
            .collect();
        params.sort();
        for (n, v) in params {
            key.push('\0');
            key.push_str(n);
            key.push('=');
            key.push_str(v);
        }
        key.push('\0');
        key.push_str(&body.to_string());
        Some(key)
    }

    /// The answer kept under `key`.
    pub fn get(&self, key: &str) -> Option<Cached> {
        let found = lock(&self.entries).map.get(key).map(|(c, _)| c.clone());
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Keeps `answer` under `key`, dropping the oldest answers past the
    /// bounds.
    pub fn put(&self, key: String, answer: Cached) {
        let size = key.len() + answer.size_bytes();
        if size > MAX_ENTRY_BYTES {
            return;
        }
        let mut e = lock(&self.entries);
        if let Some((_, old)) = e.map.insert(key.clone(), (answer, size)) {
            e.bytes -= old;
        } else {
            e.order.push_back(key);
        }
        e.bytes += size;
        while e.map.len() > MAX_ENTRIES || e.bytes > MAX_BYTES {
            let Some(oldest) = e.order.pop_front() else {
                break;
            };
            if let Some((_, s)) = e.map.remove(&oldest) {
                e.bytes -= s;
            }
        }
        debug_assert!(e.map.len() <= MAX_ENTRIES && e.bytes <= MAX_BYTES);
    }

    /// Answers kept now, and their bytes.
    pub fn usage(&self) -> (usize, usize) {
        let e = lock(&self.entries);
        (e.map.len(), e.bytes)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_answers_go_first_past_the_bounds() {
        let cache = RequestCache::default();
        for i in 0..MAX_ENTRIES + 10 {
            cache.put(format!("k{i}"), Cached::Count(i as u64));
        }
        assert_eq!(cache.usage().0, MAX_ENTRIES);
        assert!(cache.get("k0").is_none() && cache.get("k9").is_none());
        assert!(matches!(cache.get("k10"), Some(Cached::Count(10))));
        let big = Value::String("x".repeat(MAX_ENTRY_BYTES));
        cache.put(
            "big".into(),
            Cached::Search {
                total: 1,
                exact: true,
                aggregations: Some(Arc::new(big)),
            },
        );
        assert!(
            cache.get("big").is_none(),
            "an answer over the entry bound was kept"
        );
        let (hits, misses) = (
            cache.hits.load(Ordering::Relaxed),
            cache.misses.load(Ordering::Relaxed),
        );
        assert_eq!((hits, misses), (1, 3));
    }
}
