//! A transaction's writes as its own later commands read them: the store
//! operations of its batch so far, indexed, laid over a snapshot of the
//! store (as RocksDB's `WriteBatchWithIndex` does).

use sluice_store::batch::OpKind;
use sluice_store::{StoreError, WriteBatch};
use std::collections::BTreeMap;
use std::ops::Bound;

/// A stored pair, or the store's error reading it.
pub type Item = Result<(Vec<u8>, Vec<u8>), StoreError>;

/// A key and its pending value (None: deleted).
type Pending = (Vec<u8>, Option<Vec<u8>>);

/// Writes not yet committed, by store keyspace and key.
#[derive(Debug, Default)]
pub struct Overlay {
    /// The newest put (Some) or delete (None) of each key.
    entries: BTreeMap<(u32, Vec<u8>), Option<Vec<u8>>>,
    /// Range deletes `[start, end)`, each hiding what the store holds in
    /// it (overlay entries in it were dropped when it was applied).
    ranges: Vec<(u32, Vec<u8>, Vec<u8>)>,
}

impl Overlay {
    /// Takes in the operations of `batch`, in order.
    pub fn apply(&mut self, batch: &WriteBatch) {
        for op in batch.ops() {
            match op.kind {
                OpKind::Put => {
                    self.entries
                        .insert((op.keyspace, op.key.to_vec()), Some(op.value.to_vec()));
                }
                OpKind::Delete => {
                    self.entries.insert((op.keyspace, op.key.to_vec()), None);
                }
                OpKind::RangeDelete => {
                    let (start, end) = (op.key.to_vec(), op.value.to_vec());
                    let doomed: Vec<_> = self
                        .entries
                        .range((op.keyspace, start.clone())..(op.keyspace, end.clone()))
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in doomed {
                        self.entries.remove(&k);
                    }
                    self.ranges.push((op.keyspace, start, end));
                }
                OpKind::PutBlob => unreachable!("only the store makes blob references"),
            }
        }
    }

    /// What the overlay says of `key`: `Some(value)` (None: deleted) when
    /// it decides, `None` when the store does.
    pub fn get(&self, keyspace: u32, key: &[u8]) -> Option<Option<Vec<u8>>> {
        if let Some(v) = self.entries.get(&(keyspace, key.to_vec())) {
            return Some(v.clone());
        }
        self.hides(keyspace, key).then_some(None)
    }

    /// Whether a range delete hides the store's `key`.
    fn hides(&self, keyspace: u32, key: &[u8]) -> bool {
        self.ranges.iter().any(|(ks, start, end)| {
            *ks == keyspace && start.as_slice() <= key && key < end.as_slice()
        })
    }

    /// `stored` (the store's pairs of `keyspace` in `range`, in the
    /// direction `reverse` says) with the overlay laid over it.
    pub fn merge<'a>(
        &'a self,
        keyspace: u32,
        range: (Bound<&[u8]>, Bound<&[u8]>),
        reverse: bool,
        stored: impl Iterator<Item = Item> + 'a,
    ) -> impl Iterator<Item = Item> + 'a {
        let own = |b: Bound<&[u8]>| match b {
            Bound::Included(k) => Bound::Included((keyspace, k.to_vec())),
            Bound::Excluded(k) => Bound::Excluded((keyspace, k.to_vec())),
            Bound::Unbounded => Bound::Unbounded,
        };
        let lower = match range.0 {
            Bound::Unbounded => Bound::Included((keyspace, Vec::new())),
            b => own(b),
        };
        let upper = match range.1 {
            Bound::Unbounded => match keyspace.checked_add(1) {
                Some(next) => Bound::Excluded((next, Vec::new())),
                None => Bound::Unbounded,
            },
            b => own(b),
        };
        let mut mine: Vec<Pending> = if inverted(&lower, &upper) {
            Vec::new()
        } else {
            self.entries
                .range((lower, upper))
                .map(|((_, k), v)| (k.clone(), v.clone()))
                .collect()
        };
        if reverse {
            mine.reverse();
        }
        Merge {
            overlay: self,
            keyspace,
            reverse,
            stored: stored.peekable(),
            mine: mine.into_iter().peekable(),
        }
    }
}

/// Whether `lower .. upper` holds nothing for being backwards (which a
/// `BTreeMap` range refuses).
fn inverted<K: Ord>(lower: &Bound<K>, upper: &Bound<K>) -> bool {
    match (lower, upper) {
        (Bound::Included(l), Bound::Included(u)) => l > u,
        (Bound::Included(l) | Bound::Excluded(l), Bound::Excluded(u))
        | (Bound::Excluded(l), Bound::Included(u)) => l >= u,
        _ => false,
    }
}

struct Merge<'a, I: Iterator<Item = Item>> {
    overlay: &'a Overlay,
    keyspace: u32,
    reverse: bool,
    stored: std::iter::Peekable<I>,
    mine: std::iter::Peekable<std::vec::IntoIter<Pending>>,
}

impl<I: Iterator<Item = Item>> Iterator for Merge<'_, I> {
    type Item = Item;

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: peeked"
    )]
    fn next(&mut self) -> Option<Item> {
        loop {
            // The store's next key, past any the overlay hides or decides.
            let stored_key = match self.stored.peek() {
                Some(Err(_)) => return self.stored.next(),
                Some(Ok((k, _))) => Some(k.clone()),
                None => None,
            };
            let mine_key = self.mine.peek().map(|(k, _)| k.clone());
            let take_mine = match (&stored_key, &mine_key) {
                (None, None) => return None,
                (None, Some(_)) => true,
                (Some(_), None) => false,
                (Some(s), Some(m)) => {
                    if s == m {
                        self.stored.next();
                        true
                    } else {
                        (m < s) != self.reverse
                    }
                }
            };
            if take_mine {
                let (k, v) = self.mine.next().expect("peeked");
                if let Some(v) = v {
                    return Some(Ok((k, v)));
                }
                continue;
            }
            let item = self.stored.next().expect("peeked");
            if let Ok((k, _)) = &item {
                if self.overlay.hides(self.keyspace, k) {
                    continue;
                }
            }
            return Some(item);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn stored(pairs: &[(&[u8], &[u8])]) -> Vec<Item> {
        pairs
            .iter()
            .map(|(k, v)| Ok((k.to_vec(), v.to_vec())))
            .collect()
    }

    #[test]
    fn puts_deletes_and_range_deletes_are_laid_over_the_store() {
        let mut batch = WriteBatch::new();
        batch.put(1, b"b", b"B2").unwrap();
        batch.delete(1, b"c").unwrap();
        batch.put(1, b"e", b"E").unwrap();
        batch.delete_range(1, b"e", b"g").unwrap();
        batch.put(1, b"f2", b"F2").unwrap();
        batch.put(2, b"a", b"other keyspace").unwrap();
        let mut o = Overlay::default();
        o.apply(&batch);
        let store = [
            (&b"a"[..], &b"A"[..]),
            (b"b", b"B"),
            (b"c", b"C"),
            (b"f", b"F"),
            (b"h", b"H"),
        ];
        let all = (Bound::Unbounded, Bound::Unbounded);
        let got: Vec<_> = o
            .merge(1, all, false, stored(&store).into_iter())
            .map(|i| i.unwrap())
            .collect();
        let want: Vec<(Vec<u8>, Vec<u8>)> = [("a", "A"), ("b", "B2"), ("f2", "F2"), ("h", "H")]
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        assert_eq!(got, want);
        let mut rev_store = stored(&store);
        rev_store.reverse();
        let got: Vec<_> = o
            .merge(1, all, true, rev_store.into_iter())
            .map(|i| i.unwrap())
            .collect();
        assert_eq!(got, want.into_iter().rev().collect::<Vec<_>>());
        assert_eq!(o.get(1, b"c"), Some(None));
        assert_eq!(o.get(1, b"f"), Some(None));
        assert_eq!(o.get(1, b"a"), None);
        assert_eq!(o.get(1, b"f2"), Some(Some(b"F2".to_vec())));
    }

    proptest! {
        /// The merge equals a map the same operations were applied to.
        #[test]
        fn the_merge_equals_applying_the_batch_to_a_copy(
            base in proptest::collection::btree_map(0u8..32, 0u8..4, 0..20),
            ops in proptest::collection::vec((0u8..3, 0u8..32, 0u8..32, 0u8..4), 0..20),
            lo in 0u8..32, hi in 0u8..33, reverse: bool,
        ) {
            let mut model: BTreeMap<Vec<u8>, Vec<u8>> =
                base.iter().map(|(k, v)| (vec![*k], vec![*v])).collect();
            let mut batch = WriteBatch::new();
            for (kind, a, b, v) in ops {
                match kind {
                    0 => { batch.put(7, &[a], &[v]).unwrap(); model.insert(vec![a], vec![v]); }
                    1 => { batch.delete(7, &[a]).unwrap(); model.remove(&vec![a]); }
                    _ if a < b => {
                        batch.delete_range(7, &[a], &[b]).unwrap();
                        model.retain(|k, _| !(k.as_slice() >= &[a][..] && k.as_slice() < &[b][..]));
                    }
                    _ => {}
                }
            }
            let mut o = Overlay::default();
            o.apply(&batch);
            let (lo, hi) = (vec![lo], vec![hi]);
            let range = (Bound::Included(&lo[..]), Bound::Excluded(&hi[..]));
            let mut store: Vec<Item> = base
                .iter()
                .filter(|(k, _)| **k >= lo[0] && **k < hi[0])
                .map(|(k, v)| Ok((vec![*k], vec![*v])))
                .collect();
            if reverse { store.reverse(); }
            let got: Vec<_> = o.merge(7, range, reverse, store.into_iter()).map(|i| i.unwrap()).collect();
            let mut want: Vec<_> = model
                .iter()
                .filter(|(k, _)| **k >= lo && **k < hi)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if reverse { want.reverse(); }
            prop_assert_eq!(got, want);
        }
    }
}
