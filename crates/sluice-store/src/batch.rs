//! Write batches: what one WAL record holds (docs/FORMAT.md, "Write-ahead
//! log"): `u64 first sequence`, `u32 entry count`, then entries
//! `u8 kind`, `u32 keyspace`, `u32 key length`, key, `u32 value length`, value.

use crate::error::{Result, StoreError};

/// Longest key the store takes.
pub const MAX_KEY_BYTES: usize = 8 << 10;
/// Longest value the store takes.
pub const MAX_VALUE_BYTES: usize = 4 << 20;

/// What one operation of a batch does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum OpKind {
    /// Sets the key's value.
    Put = 1,
    /// Removes the key.
    Delete = 2,
    /// Deletes `[key, value)`: the value holds the exclusive end key.
    RangeDelete = 3,
}

/// One operation of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchOp {
    /// Put or delete.
    pub kind: OpKind,
    /// The keyspace's id.
    pub keyspace: u32,
    /// The key.
    pub key: Vec<u8>,
    /// The value (empty for a delete).
    pub value: Vec<u8>,
}

/// Operations applied atomically: all or none survive a crash.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteBatch {
    pub(crate) ops: Vec<BatchOp>,
    encoded_bytes: usize,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a put; refuses keys and values over the limits.
    pub fn put(&mut self, keyspace: u32, key: &[u8], value: &[u8]) -> Result<&mut Self> {
        self.push(OpKind::Put, keyspace, key, value)
    }

    /// Adds a delete; refuses keys over the limit.
    pub fn delete(&mut self, keyspace: u32, key: &[u8]) -> Result<&mut Self> {
        self.push(OpKind::Delete, keyspace, key, &[])
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
        self.push(OpKind::RangeDelete, keyspace, start, end)
    }

    fn push(&mut self, kind: OpKind, keyspace: u32, key: &[u8], value: &[u8]) -> Result<&mut Self> {
        if key.len() > MAX_KEY_BYTES || (kind == OpKind::RangeDelete && value.len() > MAX_KEY_BYTES)
        {
            return Err(StoreError::BadInput(format!(
                "key of {} bytes exceeds the limit of {MAX_KEY_BYTES} bytes",
                key.len().max(value.len())
            )));
        }
        if value.len() > MAX_VALUE_BYTES {
            return Err(StoreError::BadInput(format!(
                "value of {} bytes exceeds the limit of {MAX_VALUE_BYTES} bytes",
                value.len()
            )));
        }
        let size = 13 + key.len() + value.len();
        if HEADER_BYTES + self.encoded_bytes + size > crate::wal::MAX_RECORD_BYTES {
            return Err(StoreError::BadInput(format!(
                "write batch would exceed {} bytes; split it",
                crate::wal::MAX_RECORD_BYTES
            )));
        }
        self.encoded_bytes += size;
        self.ops.push(BatchOp {
            kind,
            keyspace,
            key: key.to_vec(),
            value: value.to_vec(),
        });
        Ok(self)
    }

    /// Operations in the batch.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    pub(crate) fn encode(&self, first_seq: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + self.encoded_bytes);
        out.extend_from_slice(&first_seq.to_le_bytes());
        out.extend_from_slice(&(self.ops.len() as u32).to_le_bytes());
        for op in &self.ops {
            out.push(op.kind as u8);
            out.extend_from_slice(&op.keyspace.to_le_bytes());
            out.extend_from_slice(&(op.key.len() as u32).to_le_bytes());
            out.extend_from_slice(&op.key);
            out.extend_from_slice(&(op.value.len() as u32).to_le_bytes());
            out.extend_from_slice(&op.value);
        }
        out
    }

    /// Decodes a WAL record into (first sequence, batch).
    pub(crate) fn decode(record: &[u8]) -> Option<(u64, WriteBatch)> {
        let mut r = crate::codec::Reader::new(record);
        let first_seq = r.u64()?;
        let count = r.u32()?;
        let mut batch = WriteBatch::new();
        for _ in 0..count {
            let kind = match r.u8()? {
                1 => OpKind::Put,
                2 => OpKind::Delete,
                3 => OpKind::RangeDelete,
                _ => return None,
            };
            let keyspace = r.u32()?;
            let key = r.bytes()?;
            let value = r.bytes()?;
            batch.encoded_bytes += 13 + key.len() + value.len();
            batch.ops.push(BatchOp {
                kind,
                keyspace,
                key,
                value,
            });
        }
        r.is_done().then_some((first_seq, batch))
    }
}

const HEADER_BYTES: usize = 12;

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
