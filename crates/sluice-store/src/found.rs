//! A value a point read found, borrowed where it lies — a memtable's chunk
//! of values or a cached table block — that its reader can keep, without a
//! copy but for small values of the memtable's chunk still being filled.

use crate::sst::RawBlock;
use bytes::Bytes;

/// A value found by a point read, borrowed from where it lies. Reading it
/// copies nothing; [`Found::keep`] holds it past the read, without a copy
/// but for a small value of the memtable's chunk still being filled (a
/// server streaming a big value into a client's ring piece by piece keeps
/// it that way).
#[derive(Clone, Copy)]
pub struct Found<'a> {
    owner: Owner<'a>,
    start: usize,
    len: usize,
}

#[derive(Clone, Copy)]
enum Owner<'a> {
    /// A memtable's filled chunk of values.
    Memtable(&'a Bytes),
    /// The memtable's chunk still being filled: a value kept is copied.
    MemtableOpen(&'a Vec<u8>),
    Block(&'a RawBlock),
    Empty,
}

impl<'a> Found<'a> {
    /// No bytes (a delete's value).
    pub(crate) fn empty() -> Found<'static> {
        Found {
            owner: Owner::Empty,
            start: 0,
            len: 0,
        }
    }

    /// A value read from a blob file, whole in `bytes`.
    pub(crate) fn in_blob(bytes: &'a Bytes) -> Found<'a> {
        Found::in_memtable(bytes, 0, bytes.len())
    }

    /// `len` bytes at `start` of a memtable's filled chunk of values.
    pub(crate) fn in_memtable(chunk: &'a Bytes, start: usize, len: usize) -> Found<'a> {
        assert!(start + len <= chunk.len(), "a value inside its chunk");
        Found {
            owner: Owner::Memtable(chunk),
            start,
            len,
        }
    }

    /// `len` bytes at `start` of the memtable's chunk still being filled,
    /// which [`Found::keep`] copies (such a value is small).
    pub(crate) fn in_memtable_copy(open: &'a Vec<u8>, start: usize, len: usize) -> Found<'a> {
        assert!(start + len <= open.len(), "a value inside its chunk");
        Found {
            owner: Owner::MemtableOpen(open),
            start,
            len,
        }
    }

    /// `len` bytes at `start` of a table block.
    pub(crate) fn in_block(block: &'a RawBlock, start: usize, len: usize) -> Found<'a> {
        assert!(
            start + len <= block.bytes().len(),
            "a value inside its block"
        );
        Found {
            owner: Owner::Block(block),
            start,
            len,
        }
    }

    /// The value a [`Kept`] holds, borrowed from it.
    pub(crate) fn of_kept(kept: &'a Kept) -> Found<'a> {
        let owner = match &kept.owner {
            KeptOwner::Memtable(v) => Owner::Memtable(v),
            KeptOwner::Block(b) => Owner::Block(b),
        };
        Found {
            owner,
            start: kept.start,
            len: kept.len,
        }
    }

    /// The value's bytes.
    pub fn bytes(&self) -> &'a [u8] {
        let all: &'a [u8] = match self.owner {
            Owner::Memtable(v) => v,
            Owner::MemtableOpen(v) => v,
            Owner::Block(b) => b.bytes(),
            Owner::Empty => &[],
        };
        &all[self.start..self.start + self.len]
    }

    /// Its bytes from `offset` on (a record's header left out).
    pub fn skip(self, offset: usize) -> Found<'a> {
        assert!(offset <= self.len, "skip {offset} of {} bytes", self.len);
        Found {
            start: self.start + offset,
            len: self.len - offset,
            ..self
        }
    }

    /// Holds the value past the read: what holds its bytes (the value's
    /// own allocation, or its block) stays alive while the [`Kept`] does.
    pub fn keep(&self) -> Kept {
        let (owner, start) = match self.owner {
            Owner::Memtable(v) => (KeptOwner::Memtable(v.clone()), self.start),
            Owner::MemtableOpen(_) => {
                (KeptOwner::Memtable(Bytes::copy_from_slice(self.bytes())), 0)
            }
            Owner::Block(b) => (KeptOwner::Block(b.clone()), self.start),
            Owner::Empty => (KeptOwner::Memtable(Bytes::new()), 0),
        };
        Kept {
            owner,
            start,
            len: self.len,
        }
    }
}

/// A [`Found`] value held past its read; nothing was copied.
#[derive(Clone)]
pub struct Kept {
    owner: KeptOwner,
    start: usize,
    len: usize,
}

#[derive(Clone)]
enum KeptOwner {
    Memtable(Bytes),
    Block(RawBlock),
}

impl Kept {
    /// All of `bytes`, held.
    #[cfg(test)]
    pub(crate) fn of_bytes(bytes: Bytes) -> Kept {
        let len = bytes.len();
        Kept {
            owner: KeptOwner::Memtable(bytes),
            start: 0,
            len,
        }
    }

    /// The value's bytes.
    pub fn bytes(&self) -> &[u8] {
        let all: &[u8] = match &self.owner {
            KeptOwner::Memtable(v) => v,
            KeptOwner::Block(b) => b.bytes(),
        };
        &all[self.start..self.start + self.len]
    }

    /// The value as a buffer to hand on (a socket's send): the buffer and
    /// where in it the value starts (it ends with the buffer). No copy
    /// when the value has an allocation of its own no one else holds (a
    /// value read from a blob file, once its read is done); else the value
    /// is copied.
    pub fn into_vec(self) -> (Vec<u8>, usize) {
        match self.owner {
            KeptOwner::Memtable(bytes) if bytes.is_unique() => {
                let mut v = Vec::from(bytes);
                v.truncate(self.start + self.len);
                (v, self.start)
            }
            owner => {
                let kept = Kept { owner, ..self };
                (kept.bytes().to_vec(), 0)
            }
        }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}
