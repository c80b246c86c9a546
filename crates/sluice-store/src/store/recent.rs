//! Point reads a thread remembers until the store's next write.
//!
//! A server worker asks, before it queues a write, whether the keys the
//! write reads are all in memory: that is a whole point read (memtables,
//! filters, index, block search). The command runs a moment later and
//! reads the same keys again. When nothing was written in between — the
//! store's visible sequence is the one the first read was taken at — the
//! second read's answer is the first one's, so [`RecentReads`] keeps it
//! and the second read answers from there: one hashed lookup instead of a
//! point read. Any write moves the visible sequence, and any change of the
//! memtables or tables read (a flush, a compaction, a keyspace dropped)
//! the view generation: either drops them all.

use crate::found::{Found, Kept};

/// Reads remembered at most: a server's group of commands reads fewer.
const RECENT_READS_MAX: usize = 512;

/// Key bytes remembered at most, all reads together.
const RECENT_KEY_BYTES_MAX: usize = 64 << 10;

/// The longest value remembered: a small record is what is read twice;
/// anything longer is read again.
pub(crate) const RECENT_VALUE_MAX_BYTES: usize = 16 << 10;

/// Slots of the open-addressing table: a power of two, twice the reads.
const SLOTS: usize = 2 * RECENT_READS_MAX;

/// One remembered answer: None for no live value.
struct Recent {
    hash: u64,
    keyspace: u32,
    key_start: u32,
    key_len: u32,
    slot: u32,
    value: Option<Kept>,
}

/// When a read was taken: the store's visible sequence and view
/// generation, each read before the read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub(crate) seq: u64,
    pub(crate) generation: u64,
}

/// The answers of point reads taken at one [`Stamp`], by key.
/// Empty, it holds no allocation (a [`crate::ReadCache`] is made per read
/// by some callers).
#[derive(Default)]
pub(crate) struct RecentReads {
    /// When every remembered answer was read.
    stamp: Stamp,
    reads: Vec<Recent>,
    keys: Vec<u8>,
    /// 0: empty; else 1 + the read's place in `reads`. Allocated at the
    /// first answer remembered.
    slots: Vec<u32>,
}

impl RecentReads {
    /// The answer remembered for `key` when it was read at `now`, the
    /// store's stamp now: Some(None) for no live value, None when not
    /// remembered.
    pub(crate) fn get(
        &mut self,
        now: Stamp,
        keyspace: u32,
        key: &[u8],
    ) -> Option<Option<Found<'_>>> {
        if self.reads.is_empty() {
            return None;
        }
        if self.stamp != now {
            // Written since, or a new view: none of them holds.
            self.clear();
            return None;
        }
        let at = self.find(crate::memtable::point_hash(keyspace, key), keyspace, key)?;
        Some(self.reads[at].value.as_ref().map(Found::of_kept))
    }

    /// Remembers `value` as `key`'s answer read at `stamp` (None: no
    /// live value); a value too long, or a full table, is not remembered.
    pub(crate) fn remember(
        &mut self,
        stamp: Stamp,
        keyspace: u32,
        key: &[u8],
        value: Option<Kept>,
    ) {
        if self.stamp != stamp {
            self.clear();
            self.stamp = stamp;
        }
        if self.reads.len() >= RECENT_READS_MAX
            || self.keys.len() + key.len() > RECENT_KEY_BYTES_MAX
            || value
                .as_ref()
                .is_some_and(|v| v.len() > RECENT_VALUE_MAX_BYTES)
        {
            return;
        }
        if self.slots.is_empty() {
            self.slots = vec![0; SLOTS];
        }
        let hash = crate::memtable::point_hash(keyspace, key);
        if self.find(hash, keyspace, key).is_some() {
            // Read twice at one sequence: the same answer.
            return;
        }
        let mask = SLOTS - 1;
        let mut slot = hash as usize & mask;
        while self.slots[slot] != 0 {
            slot = (slot + 1) & mask;
        }
        self.slots[slot] = self.reads.len() as u32 + 1;
        self.reads.push(Recent {
            hash,
            keyspace,
            key_start: self.keys.len() as u32,
            key_len: key.len() as u32,
            slot: slot as u32,
            value,
        });
        self.keys.extend_from_slice(key);
    }

    /// Forgets every answer (and lets go of the blocks they hold).
    pub(crate) fn clear(&mut self) {
        for read in &self.reads {
            self.slots[read.slot as usize] = 0;
        }
        self.reads.clear();
        self.keys.clear();
    }

    /// How many answers it holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.reads.len()
    }

    fn find(&self, hash: u64, keyspace: u32, key: &[u8]) -> Option<usize> {
        let mask = SLOTS - 1;
        let mut slot = hash as usize & mask;
        // The table is at most half full: a probe ends at an empty slot.
        loop {
            let entry = self.slots[slot];
            if entry == 0 {
                return None;
            }
            let at = entry as usize - 1;
            let read = &self.reads[at];
            if read.hash == hash && read.keyspace == keyspace {
                let start = read.key_start as usize;
                if &self.keys[start..start + read.key_len as usize] == key {
                    return Some(at);
                }
            }
            slot = (slot + 1) & mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn kept(value: &[u8]) -> Kept {
        Kept::of_bytes(Bytes::copy_from_slice(value))
    }

    fn at(seq: u64) -> Stamp {
        Stamp { seq, generation: 3 }
    }

    fn answer(
        r: &mut RecentReads,
        now: Stamp,
        keyspace: u32,
        key: &[u8],
    ) -> Option<Option<Vec<u8>>> {
        r.get(now, keyspace, key)
            .map(|f| f.map(|f| f.bytes().to_vec()))
    }

    #[test]
    fn answers_only_at_the_sequence_it_was_read_at() {
        let mut r = RecentReads::default();
        r.remember(at(7), 1, b"a", Some(kept(b"one")));
        r.remember(at(7), 1, b"b", None);
        assert_eq!(answer(&mut r, at(7), 1, b"a"), Some(Some(b"one".to_vec())));
        assert_eq!(answer(&mut r, at(7), 1, b"b"), Some(None), "no live value");
        assert_eq!(answer(&mut r, at(7), 2, b"a"), None, "another keyspace");
        assert_eq!(answer(&mut r, at(7), 1, b"c"), None, "never read");
        let flushed = Stamp {
            seq: 7,
            generation: 4,
        };
        assert_eq!(answer(&mut r, flushed, 1, b"a"), None, "a new view since");
        assert_eq!(r.len(), 0, "a new view drops every answer");
        r.remember(at(7), 1, b"a", Some(kept(b"one")));
        assert_eq!(answer(&mut r, at(8), 1, b"a"), None, "written since");
        assert_eq!(r.len(), 0, "a write drops every answer");
        assert_eq!(answer(&mut r, at(7), 1, b"a"), None);
    }

    #[test]
    fn a_new_sequence_starts_over_and_the_table_stays_bounded() {
        let mut r = RecentReads::default();
        for round in 0..3u64 {
            for i in 0..RECENT_READS_MAX + 10 {
                let key = format!("key-{round}-{i}");
                r.remember(at(round), 0, key.as_bytes(), Some(kept(key.as_bytes())));
            }
            assert_eq!(r.len(), RECENT_READS_MAX);
            for i in 0..RECENT_READS_MAX {
                let key = format!("key-{round}-{i}");
                assert_eq!(
                    answer(&mut r, at(round), 0, key.as_bytes()),
                    Some(Some(key.clone().into_bytes()))
                );
            }
            let past = format!("key-{round}-{}", RECENT_READS_MAX);
            assert_eq!(answer(&mut r, at(round), 0, past.as_bytes()), None);
        }
        let long = vec![b'x'; RECENT_VALUE_MAX_BYTES + 1];
        r.remember(at(9), 0, b"long", Some(kept(&long)));
        assert_eq!(answer(&mut r, at(9), 0, b"long"), None, "too long to keep");
    }
}
