//! Write batches: what one WAL record holds (docs/FORMAT.md, "Write-ahead
//! log"): `u64 first sequence`, `u32 entry count`, then entries
//! `u8 kind`, `u32 keyspace`, `u32 key length`, key, `u32 value length`, value.

use crate::error::{Result, StoreError};

/// Longest key the store takes.
pub const MAX_KEY_BYTES: usize = 8 << 10;
/// Longest value the store takes (values from the store's blob threshold
/// on are kept in blob files: docs/FORMAT.md, "Blob files").
pub const MAX_VALUE_BYTES: usize = (512 << 20) + (64 << 10);
/// Most bytes of values one batch holds.
pub const MAX_BATCH_VALUE_BYTES: usize = 1 << 30;

/// A put whose value goes to a blob file from where it lies, in pieces
/// laid one after the other, never copied into a batch
/// ([`crate::Store::write_logged_large`]): a value of hundreds of MiB is
/// then held once, by its caller.
#[derive(Debug, Clone, Copy)]
pub struct LargePut<'a> {
    /// The keyspace.
    pub keyspace: u32,
    /// The key (at most [`MAX_KEY_BYTES`]).
    pub key: &'a [u8],
    /// The value's pieces (at most [`MAX_VALUE_BYTES`] together).
    pub value: &'a [&'a [u8]],
}

impl LargePut<'_> {
    /// The value's length.
    pub fn value_len(&self) -> usize {
        self.value.iter().map(|p| p.len()).sum()
    }

    /// Refuses a key or value over the store's limits, as a batch does.
    pub fn check(&self) -> Result<()> {
        check_lengths(self.key.len(), self.value_len())
    }
}

/// Refuses a key (or a range delete's end) longer than [`MAX_KEY_BYTES`]
/// or a value longer than [`MAX_VALUE_BYTES`], naming the length.
fn check_lengths(key_len: usize, value_len: usize) -> Result<()> {
    if key_len > MAX_KEY_BYTES {
        return Err(StoreError::BadInput(format!(
            "key of {key_len} bytes exceeds the limit of {MAX_KEY_BYTES} bytes"
        )));
    }
    if value_len > MAX_VALUE_BYTES {
        return Err(StoreError::BadInput(format!(
            "value of {value_len} bytes exceeds the limit of {MAX_VALUE_BYTES} bytes"
        )));
    }
    Ok(())
}

/// What one operation of a batch does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum OpKind {
    /// Sets the key's value.
    Put = 1,
    /// Removes the key.
    Delete = 2,
    /// Deletes `[key, value)`: the value holds the exclusive end key.
    RangeDelete = 3,
    /// Sets the key's value to the one a blob reference names (the store
    /// writes these in place of large puts; the value is the reference).
    PutBlob = 4,
}

/// One operation of a batch, borrowed from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchOp<'a> {
    /// Put or delete.
    pub kind: OpKind,
    /// The keyspace's id.
    pub keyspace: u32,
    /// The key.
    pub key: &'a [u8],
    /// The value (empty for a delete).
    pub value: &'a [u8],
}

/// Operations applied atomically: all or none survive a crash.
///
/// Kept as the body of its WAL record, entries one after another: the log
/// takes it as it is behind a 12-byte header, and the memtable reads its
/// keys and values from it, so a put allocates nothing of its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteBatch {
    body: Vec<u8>,
    count: u32,
    /// Bytes of its values.
    value_bytes: usize,
    /// Bytes its log record saves on values at least
    /// `blob::MAX_THRESHOLD_BYTES` long, which always go to blob files
    /// (the record holds a reference instead).
    separated_bytes: usize,
    /// Puts of values at least `blob::MIN_THRESHOLD_BYTES` long (the
    /// store looks for values to separate only when there are some).
    blob_candidates: u32,
    /// Puts of blob references (a log mirror keeps no such record: the
    /// blob's bytes may be in memory only until the log block is written).
    blob_refs: u32,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a put; refuses keys and values over the limits.
    pub fn put(&mut self, keyspace: u32, key: &[u8], value: &[u8]) -> Result<&mut Self> {
        self.push_parts(OpKind::Put, keyspace, key, &[value])
    }

    /// Adds a put of the value `parts` make one after another (a header
    /// and a payload, say), copied once.
    pub fn put_parts(&mut self, keyspace: u32, key: &[u8], parts: &[&[u8]]) -> Result<&mut Self> {
        self.push_parts(OpKind::Put, keyspace, key, parts)
    }

    /// Adds a delete; refuses keys over the limit.
    pub fn delete(&mut self, keyspace: u32, key: &[u8]) -> Result<&mut Self> {
        self.push_parts(OpKind::Delete, keyspace, key, &[])
    }

    /// Deletes every key in `[start, end)`.
    pub fn delete_range(&mut self, keyspace: u32, start: &[u8], end: &[u8]) -> Result<&mut Self> {
        if start >= end {
            return Err(StoreError::BadInput(format!(
                "range delete needs start < end, got {} .. {}",
                show(start),
                show(end)
            )));
        }
        self.push_parts(OpKind::RangeDelete, keyspace, start, &[end])
    }

    fn push_parts(
        &mut self,
        kind: OpKind,
        keyspace: u32,
        key: &[u8],
        parts: &[&[u8]],
    ) -> Result<&mut Self> {
        let value_len: usize = parts.iter().map(|p| p.len()).sum();
        // A range delete's value is its end key.
        let key_len = match kind {
            OpKind::RangeDelete => key.len().max(value_len),
            _ => key.len(),
        };
        check_lengths(key_len, value_len)?;
        let size = ENTRY_HEADER_BYTES + key.len() + value_len;
        let value_bytes = self.value_bytes + value_len;
        if value_bytes > MAX_BATCH_VALUE_BYTES {
            return Err(StoreError::BadInput(format!(
                "write batch would hold more than {MAX_BATCH_VALUE_BYTES} bytes of values; split it"
            )));
        }
        // What its log record will hold: large values as references.
        let separated = if kind == OpKind::Put && value_len >= crate::blob::MAX_THRESHOLD_BYTES {
            value_len - crate::blob::REF_BYTES
        } else {
            0
        };
        let logged = self.body.len() - self.separated_bytes + size - separated;
        if HEADER_BYTES + logged > crate::wal::MAX_RECORD_BYTES {
            return Err(StoreError::BadInput(format!(
                "write batch would exceed {} bytes; split it",
                crate::wal::MAX_RECORD_BYTES
            )));
        }
        self.value_bytes = value_bytes;
        self.separated_bytes += separated;
        if kind == OpKind::Put && value_len >= crate::blob::MIN_THRESHOLD_BYTES {
            self.blob_candidates += 1;
        }
        self.body.reserve(size);
        self.body.push(kind as u8);
        self.body.extend_from_slice(&keyspace.to_le_bytes());
        self.body
            .extend_from_slice(&(key.len() as u32).to_le_bytes());
        self.body.extend_from_slice(key);
        self.body
            .extend_from_slice(&(value_len as u32).to_le_bytes());
        for part in parts {
            self.body.extend_from_slice(part);
        }
        self.count += 1;
        Ok(self)
    }

    /// Empties it, keeping its room for the next batch.
    pub fn clear(&mut self) {
        self.body.clear();
        self.count = 0;
        self.value_bytes = 0;
        self.separated_bytes = 0;
        self.blob_candidates = 0;
    }

    /// Bytes its log record's entries take at most (values of
    /// [`crate::blob::MAX_THRESHOLD_BYTES`] and more as references, as the
    /// store always logs them): a caller filling batches from a stream
    /// starts a new one past a size of its choosing.
    pub fn logged_bytes(&self) -> usize {
        self.body.len() - self.separated_bytes
    }

    /// Whether it holds a put whose value may go to a blob file.
    pub(crate) fn has_blob_candidates(&self) -> bool {
        self.blob_candidates > 0
    }

    /// Adds a put of a value a blob reference names (`reference`: its
    /// encoded bytes).
    pub(crate) fn put_blob(&mut self, keyspace: u32, key: &[u8], reference: &[u8]) {
        debug_assert_eq!(reference.len(), crate::blob::REF_BYTES);
        self.body.push(OpKind::PutBlob as u8);
        self.body.extend_from_slice(&keyspace.to_le_bytes());
        self.body
            .extend_from_slice(&(key.len() as u32).to_le_bytes());
        self.body.extend_from_slice(key);
        self.body
            .extend_from_slice(&(reference.len() as u32).to_le_bytes());
        self.body.extend_from_slice(reference);
        self.count += 1;
        self.blob_refs += 1;
    }

    /// Whether it holds a put of a blob reference.
    pub(crate) fn has_blob_refs(&self) -> bool {
        self.blob_refs > 0
    }

    /// Adds `op` as it is (a batch rebuilt with some puts separated).
    pub(crate) fn push_op(&mut self, op: &BatchOp<'_>) -> Result<()> {
        match op.kind {
            OpKind::PutBlob => {
                self.put_blob(op.keyspace, op.key, op.value);
                Ok(())
            }
            kind => self
                .push_parts(kind, op.keyspace, op.key, &[op.value])
                .map(|_| ()),
        }
    }

    /// Operations in the batch.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Its operations in order.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a batch reads back as built"
    )]
    pub fn ops(&self) -> impl Iterator<Item = BatchOp<'_>> + '_ {
        let mut r = crate::codec::Reader::new(&self.body);
        (0..self.count).map(move |_| read_op(&mut r).expect("a batch reads back as built"))
    }

    /// The WAL record's header: first sequence, entry count.
    pub(crate) fn header(&self, first_seq: u64) -> [u8; HEADER_BYTES] {
        let mut h = [0u8; HEADER_BYTES];
        h[..8].copy_from_slice(&first_seq.to_le_bytes());
        h[8..].copy_from_slice(&self.count.to_le_bytes());
        h
    }

    /// The WAL record's entries (after [`WriteBatch::header`]).
    pub(crate) fn body(&self) -> &[u8] {
        &self.body
    }

    /// Decodes a WAL record into (first sequence, batch).
    pub(crate) fn decode(record: &[u8]) -> Option<(u64, WriteBatch)> {
        let mut r = crate::codec::Reader::new(record);
        let first_seq = r.u64()?;
        let count = r.u32()?;
        let body_at = r.position();
        let mut blob_refs = 0;
        for _ in 0..count {
            blob_refs += (read_op(&mut r)?.kind == OpKind::PutBlob) as u32;
        }
        let batch = WriteBatch {
            body: record[body_at..].to_vec(),
            count,
            value_bytes: 0,
            separated_bytes: 0,
            blob_candidates: 0,
            blob_refs,
        };
        r.is_done().then_some((first_seq, batch))
    }
}

/// One entry of a record's body; None if it is cut short or of no kind.
fn read_op<'a>(r: &mut crate::codec::Reader<'a>) -> Option<BatchOp<'a>> {
    let kind = match r.u8()? {
        1 => OpKind::Put,
        2 => OpKind::Delete,
        3 => OpKind::RangeDelete,
        4 => OpKind::PutBlob,
        _ => return None,
    };
    let keyspace = r.u32()?;
    let key_len = r.u32()? as usize;
    let key = r.take(key_len)?;
    let value_len = r.u32()? as usize;
    let value = r.take(value_len)?;
    Some(BatchOp {
        kind,
        keyspace,
        key,
        value,
    })
}

/// An entry's bytes besides its key and value: kind, keyspace, two lengths.
const ENTRY_HEADER_BYTES: usize = 13;

/// A record's header: first sequence, entry count.
pub(crate) const HEADER_BYTES: usize = 12;

/// A key for messages: printable as text when it is, hex otherwise.
pub fn show(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(s) if s.chars().all(|c| !c.is_control()) && s.len() <= 64 => format!("{s:?}"),
        _ => {
            let hex: String = key.iter().take(32).map(|b| format!("{b:02x}")).collect();
            format!("0x{hex}{}", if key.len() > 32 { "…" } else { "" })
        }
    }
}
