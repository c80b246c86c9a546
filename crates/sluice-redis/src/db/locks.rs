//! Stripe locks: a command that reads and then writes holds its keys'
//! stripes from the read to the write.

use super::{Db, KeyHash};
use std::sync::MutexGuard;

/// Stripe locks held by a command, released on drop.
pub struct Locked<'a> {
    _guards: Guards<'a>,
}

/// One stripe (most commands: one key) needs no list.
enum Guards<'a> {
    One(#[allow(dead_code)] MutexGuard<'a, ()>),
    Many(#[allow(dead_code)] Vec<MutexGuard<'a, ()>>),
}

impl Db {
    /// Locks every stripe (EXEC: no read-modify-write command runs
    /// meanwhile).
    pub fn lock_all(&self) -> Locked<'_> {
        Locked {
            _guards: Guards::Many(
                self.stripes
                    .iter()
                    .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()))
                    .collect(),
            ),
        }
    }

    /// Locks the stripes of `keys` (in stripe order, so two commands
    /// cannot deadlock) until the returned guard drops.
    pub fn lock<'a>(&'a self, keys: &[&[u8]]) -> Locked<'a> {
        self.lock_hashes(keys.iter().map(|k| KeyHash::of(k)))
    }

    /// [`Db::lock`] of the keys whose hashes these are.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: one hash"
    )]
    pub fn lock_hashes(&self, mut hashes: impl ExactSizeIterator<Item = KeyHash>) -> Locked<'_> {
        if hashes.len() == 1 {
            let only = hashes.next().expect("one hash");
            return self.lock_stripe(only.stripe());
        }
        let mut stripes: Vec<usize> = hashes.map(KeyHash::stripe).collect();
        stripes.sort_unstable();
        stripes.dedup();
        Locked {
            _guards: Guards::Many(
                stripes
                    .into_iter()
                    .map(|s| self.stripes[s].lock().unwrap_or_else(|p| p.into_inner()))
                    .collect(),
            ),
        }
    }

    /// Locks one stripe.
    fn lock_stripe(&self, stripe: usize) -> Locked<'_> {
        let guard = self.stripes[stripe]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        Locked {
            _guards: Guards::One(guard),
        }
    }
}
