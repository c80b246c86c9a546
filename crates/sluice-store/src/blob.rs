//! Blob files: large values kept apart from the tree (docs/FORMAT.md,
//! "Blob files"). A put whose value reaches the store's threshold writes
//! the value to the blob file being appended to and puts a 28-byte
//! [`BlobRef`] in the tree in its place, so flushes and compactions move
//! the reference, never the value.
//!
//! A file lives while a table references it, a memtable may, or it is
//! the one being appended to; then it is removed in a manifest group and
//! its extent returns once the last view that could read it is dropped
//! (as a replaced table's does).

use crate::blocks::{BlockDevice, Extent, STORE_BLOCK_BYTES};
use crate::error::{Result, StoreError};
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes of an encoded [`BlobRef`].
pub const REF_BYTES: usize = 28;
/// Bytes of a blob record's header (the key follows it).
pub const RECORD_HEADER_BYTES: usize = 32;
/// The smallest and largest blob threshold a store takes.
pub const MIN_THRESHOLD_BYTES: usize = 4 << 10;
/// See [`MIN_THRESHOLD_BYTES`]: a value at least this large always goes
/// to a blob file, so a batch's log record never holds one.
pub const MAX_THRESHOLD_BYTES: usize = 1 << 20;
/// Bytes one write or read of a blob record moves at a time: a value of
/// hundreds of MiB goes through a staging buffer of this size, not a
/// second copy of itself.
const IO_CHUNK_BYTES: usize = 4 << 20;

/// Records of at most this many bytes are gathered in memory and written
/// together ([`BlobFile`]'s staging): a put of a 16 KiB value then costs
/// a copy, not a device write of its own.
pub const MAX_STAGED_RECORD_BYTES: usize = 256 << 10;
/// Gathered records are written once they reach this many bytes (or
/// before any log block that may reference them is written).
const STAGING_BYTES: usize = 1 << 20;

const RECORD_MAGIC: &[u8; 4] = b"SLBL";

/// Where a value lies in a blob file: the tree's value for an entry of
/// kind blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobRef {
    /// The blob file's number.
    pub file_no: u64,
    /// The record's first store block, from the file's start.
    pub record_block: u32,
    /// The value's offset in bytes from the record's start.
    pub value_offset: u32,
    /// The value's length.
    pub len: u64,
    /// CRC32C of the value.
    pub crc: u32,
}

impl BlobRef {
    /// Its 28 bytes.
    pub fn encode(&self) -> [u8; REF_BYTES] {
        let mut b = [0u8; REF_BYTES];
        b[0..8].copy_from_slice(&self.file_no.to_le_bytes());
        b[8..12].copy_from_slice(&self.record_block.to_le_bytes());
        b[12..16].copy_from_slice(&self.value_offset.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b[24..28].copy_from_slice(&self.crc.to_le_bytes());
        b
    }

    /// Decodes 28 bytes; None for any other length.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: 4 bytes; 8 bytes"
    )]
    pub fn decode(b: &[u8]) -> Option<BlobRef> {
        if b.len() != REF_BYTES {
            return None;
        }
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        Some(BlobRef {
            file_no: u64_at(0),
            record_block: u32_at(8),
            value_offset: u32_at(12),
            len: u64_at(16),
            crc: u32_at(24),
        })
    }

    /// Store blocks its record takes in its file.
    pub fn record_blocks(&self) -> u64 {
        (self.value_offset as u64 + self.len).div_ceil(STORE_BLOCK_BYTES as u64)
    }
}

/// Store blocks a record of a `key_len`-byte key and `value_len`-byte
/// value takes.
pub fn record_blocks(key_len: usize, value_len: usize) -> u64 {
    ((RECORD_HEADER_BYTES + key_len + value_len) as u64).div_ceil(STORE_BLOCK_BYTES as u64)
}

/// A blob file a version knows. Once removed from the version it is
/// marked obsolete, and its extent goes to `released` when the last view
/// holding it lets go.
#[derive(Debug)]
pub struct BlobFile {
    /// Its number (from the store's table numbers).
    pub file_no: u64,
    /// Where it lies.
    pub extent: Extent,
    /// No more records are appended to it.
    sealed: AtomicBool,
    /// The highest sequence of a write that referenced it.
    last_seq: AtomicU64,
    /// Records written whose write is not yet in the memtable.
    in_flight: AtomicU32,
    obsolete: AtomicBool,
    released: Arc<Mutex<Vec<Extent>>>,
    /// Whole records appended to the file and not yet written, from the
    /// file's store block `first_block` on (reads look here first).
    staging: Mutex<Staging>,
}

#[derive(Debug, Default)]
struct Staging {
    first_block: u64,
    bytes: Vec<u8>,
}

impl BlobFile {
    /// A file at `extent`; `sealed` for a file found at open, which counts
    /// as referenced by the memtable up to `last_seq`.
    pub fn new(
        file_no: u64,
        extent: Extent,
        sealed: bool,
        last_seq: u64,
        released: Arc<Mutex<Vec<Extent>>>,
    ) -> Self {
        BlobFile {
            file_no,
            extent,
            sealed: AtomicBool::new(sealed),
            last_seq: AtomicU64::new(last_seq),
            in_flight: AtomicU32::new(0),
            obsolete: AtomicBool::new(false),
            released,
            staging: Mutex::new(Staging::default()),
        }
    }

    fn staging(&self) -> std::sync::MutexGuard<'_, Staging> {
        self.staging.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes the records gathered in memory, if any.
    pub fn write_staging(&self, dev: &BlockDevice) -> Result<()> {
        let mut st = self.staging();
        if st.bytes.is_empty() {
            return Ok(());
        }
        dev.write(self.extent.start_block + st.first_block, &st.bytes)?;
        st.first_block += (st.bytes.len() / STORE_BLOCK_BYTES) as u64;
        st.bytes.clear();
        Ok(())
    }

    /// The value `r` names if its record is still gathered in memory.
    fn staged_value(&self, r: &BlobRef) -> Option<Bytes> {
        let st = self.staging();
        let record = r.record_block as u64;
        if st.bytes.is_empty() || record < st.first_block {
            return None;
        }
        let at = ((record - st.first_block) as usize) * STORE_BLOCK_BYTES + r.value_offset as usize;
        let end = at.checked_add(usize::try_from(r.len).ok()?)?;
        st.bytes.get(at..end).map(Bytes::copy_from_slice)
    }

    /// Whether a memtable may hold a reference into it: it is still
    /// appended to, a write into it is under way, or one is above
    /// `flushed_seq` (the last sequence in tables).
    pub fn memtable_may_reference(&self, flushed_seq: u64) -> bool {
        !self.sealed.load(Ordering::Acquire)
            || self.in_flight.load(Ordering::Acquire) > 0
            || self.last_seq.load(Ordering::Acquire) > flushed_seq
    }

    /// Marks it removed: its extent is released with its last holder.
    pub fn mark_obsolete(&self) {
        self.obsolete.store(true, Ordering::Release);
    }

    /// Reads the value `r` names, checking it against the file and its
    /// checksum.
    pub fn read_value(&self, dev: &BlockDevice, r: &BlobRef) -> Result<Bytes> {
        if let Some(value) = self.staged_value(r) {
            return self.checked(dev, r, value);
        }
        let file_bytes = self.extent.block_count as u64 * STORE_BLOCK_BYTES as u64;
        let start = r.record_block as u64 * STORE_BLOCK_BYTES as u64 + r.value_offset as u64;
        let block = STORE_BLOCK_BYTES as u64;
        let first_block = start / block;
        let end = start.checked_add(r.len).filter(|&e| e <= file_bytes);
        let Some(end) = end else {
            return Err(self.corrupt(dev, first_block, format!(
                "a reference names {} bytes at byte {start}, past the end of the file ({file_bytes} bytes)",
                r.len
            )));
        };
        let blocks = end.div_ceil(block) - first_block;
        let total = usize::try_from(blocks * block).map_err(|_| {
            StoreError::BadInput(format!("a value of {} bytes is too large here", r.len))
        })?;
        let mut buf = vec![0u8; total];
        for (i, chunk) in buf.chunks_mut(IO_CHUNK_BYTES).enumerate() {
            let at = self.extent.start_block
                + first_block
                + (i * IO_CHUNK_BYTES / STORE_BLOCK_BYTES) as u64;
            dev.read(at, chunk)?;
        }
        let skip = (start - first_block * block) as usize;
        let value = Bytes::from(buf).slice(skip..skip + r.len as usize);
        self.checked(dev, r, value)
    }

    /// `value` if it has the checksum `r` says, a corruption error if not.
    fn checked(&self, dev: &BlockDevice, r: &BlobRef, value: Bytes) -> Result<Bytes> {
        let crc = crc32c::crc32c(&value);
        if crc != r.crc {
            return Err(self.corrupt(
                dev,
                r.record_block as u64,
                format!(
                    "the value of {} bytes has CRC32C {crc:#010x}, its reference says {:#010x}",
                    r.len, r.crc
                ),
            ));
        }
        Ok(value)
    }

    fn corrupt(&self, dev: &BlockDevice, offset_blocks: u64, reason: String) -> StoreError {
        let block = self.extent.start_block + offset_blocks.min(self.extent.block_count as u64);
        StoreError::Corrupt {
            what: "blob file",
            block,
            lba: dev.lba_of(block),
            reason: format!("blob file {}: {reason}", self.file_no),
        }
    }
}

impl Drop for BlobFile {
    fn drop(&mut self) {
        if self.obsolete.load(Ordering::Acquire) {
            let mut released = self.released.lock().unwrap_or_else(|p| p.into_inner());
            released.push(self.extent);
        }
    }
}

/// A record's place, taken from the file being appended to before it is
/// written: writers take places under one lock and write outside it.
pub struct Reserved {
    /// The file.
    pub file: Arc<BlobFile>,
    /// The record's first store block in it.
    pub record_block: u32,
}

impl Reserved {
    /// Writes the record of (`keyspace`, `key`, `value`) at its place and
    /// returns its reference. The file counts the write in flight until
    /// [`Reserved::landed`] (or a drop, for a write that failed).
    pub fn write(
        &self,
        dev: &BlockDevice,
        keyspace: u32,
        key: &[u8],
        value: &[&[u8]],
    ) -> Result<BlobRef> {
        let (header, reference) = self.record(keyspace, key, value);
        let value_len = value.iter().map(|p| p.len()).sum();
        let parts = [&header[..], key].into_iter().chain(value.iter().copied());
        let total_blocks = record_blocks(key.len(), value_len);
        let mut staging =
            Vec::with_capacity(IO_CHUNK_BYTES.min(total_blocks as usize * STORE_BLOCK_BYTES));
        let mut next_block = self.file.extent.start_block + self.record_block as u64;
        let mut flush = |staging: &mut Vec<u8>, last: bool| -> Result<()> {
            if last {
                staging.resize(staging.len().next_multiple_of(STORE_BLOCK_BYTES), 0);
            }
            dev.write(next_block, staging)?;
            next_block += (staging.len() / STORE_BLOCK_BYTES) as u64;
            staging.clear();
            Ok(())
        };
        for part in parts {
            let mut rest = part;
            while !rest.is_empty() {
                let room = IO_CHUNK_BYTES - staging.len();
                let (now, later) = rest.split_at(room.min(rest.len()));
                staging.extend_from_slice(now);
                rest = later;
                if staging.len() == IO_CHUNK_BYTES {
                    flush(&mut staging, false)?;
                }
            }
        }
        if !staging.is_empty() {
            flush(&mut staging, true)?;
        }
        Ok(reference)
    }

    /// Gathers the record in the file's memory instead of writing it (a
    /// record of at most [`MAX_STAGED_RECORD_BYTES`]); called under the
    /// appender's lock, which orders the records of a file. What was
    /// gathered is written once it reaches 1 MiB, when the
    /// file is closed, and before any log block is written
    /// ([`Appender::write_staging`]).
    pub fn stage(
        &self,
        dev: &BlockDevice,
        keyspace: u32,
        key: &[u8],
        value: &[u8],
    ) -> Result<BlobRef> {
        let (header, reference) = self.record(keyspace, key, &[value]);
        let size =
            (RECORD_HEADER_BYTES + key.len() + value.len()).next_multiple_of(STORE_BLOCK_BYTES);
        let record = self.record_block as u64;
        let (follows, full) = {
            let st = self.file.staging();
            (
                st.first_block + (st.bytes.len() / STORE_BLOCK_BYTES) as u64 == record,
                st.bytes.len() + size > STAGING_BYTES,
            )
        };
        if !follows || full {
            self.file.write_staging(dev)?;
        }
        let mut st = self.file.staging();
        if st.bytes.is_empty() {
            st.first_block = record;
        }
        st.bytes.extend_from_slice(&header);
        st.bytes.extend_from_slice(key);
        st.bytes.extend_from_slice(value);
        let padded = st.bytes.len().next_multiple_of(STORE_BLOCK_BYTES);
        st.bytes.resize(padded, 0);
        Ok(reference)
    }

    /// The record's header and its reference.
    fn record(
        &self,
        keyspace: u32,
        key: &[u8],
        value: &[&[u8]],
    ) -> ([u8; RECORD_HEADER_BYTES], BlobRef) {
        let crc = value.iter().fold(0, |crc, p| crc32c::crc32c_append(crc, p));
        let value_len: usize = value.iter().map(|p| p.len()).sum();
        let mut header = [0u8; RECORD_HEADER_BYTES];
        header[0..4].copy_from_slice(RECORD_MAGIC);
        header[4..8].copy_from_slice(&keyspace.to_le_bytes());
        header[8..12].copy_from_slice(&(key.len() as u32).to_le_bytes());
        header[12..16].copy_from_slice(&crc.to_le_bytes());
        header[16..24].copy_from_slice(&(value_len as u64).to_le_bytes());
        let header_crc = crc32c::crc32c_append(crc32c::crc32c(&header[..28]), key);
        header[28..32].copy_from_slice(&header_crc.to_le_bytes());
        let reference = BlobRef {
            file_no: self.file.file_no,
            record_block: self.record_block,
            value_offset: (RECORD_HEADER_BYTES + key.len()) as u32,
            len: value_len as u64,
            crc,
        };
        (header, reference)
    }

    /// The write that references the record is in the memtable with
    /// sequence `seq`.
    pub fn landed(self, seq: u64) {
        self.file.last_seq.fetch_max(seq, Ordering::AcqRel);
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        // After `landed`'s store of the sequence: a checker that sees no
        // write in flight sees the sequence too.
        self.file.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The file being appended to and where its next record goes.
#[derive(Default)]
pub struct Appender {
    file: Option<Arc<BlobFile>>,
    next_block: u64,
}

impl Appender {
    /// A place for a record of `blocks` in the current file, if it has
    /// room; otherwise None, and the caller opens a new file with
    /// [`Appender::start`] (the old one is written out and closed here).
    pub fn reserve(&mut self, dev: &BlockDevice, blocks: u64) -> Result<Option<Reserved>> {
        let Some(file) = self.file.as_ref() else {
            return Ok(None);
        };
        if self.next_block + blocks > file.extent.block_count as u64 {
            self.seal(dev)?;
            return Ok(None);
        }
        let record_block = self.next_block as u32;
        self.next_block += blocks;
        file.in_flight.fetch_add(1, Ordering::AcqRel);
        Ok(Some(Reserved {
            file: file.clone(),
            record_block,
        }))
    }

    /// The place of the one record of a file of its own (a value larger
    /// than a quarter of a file): closed for appends at once.
    pub fn dedicated(file: Arc<BlobFile>) -> Reserved {
        // Counted in flight before it is sealed: never unreferenced between.
        file.in_flight.fetch_add(1, Ordering::AcqRel);
        file.sealed.store(true, Ordering::Release);
        Reserved {
            file,
            record_block: 0,
        }
    }

    /// Appends from now on to `file` (just added to the version).
    pub fn start(&mut self, dev: &BlockDevice, file: Arc<BlobFile>) -> Result<()> {
        self.seal(dev)?;
        self.file = Some(file);
        self.next_block = 0;
        Ok(())
    }

    /// Writes out what the current file gathered and closes it for
    /// appends. The file stays current if the write fails (the caller's
    /// write fails; a later one tries again).
    pub fn seal(&mut self, dev: &BlockDevice) -> Result<()> {
        if let Some(old) = &self.file {
            old.write_staging(dev)?;
            old.sealed.store(true, Ordering::Release);
        }
        self.file = None;
        Ok(())
    }

    /// Writes what the current file gathered: called before any log
    /// block goes to the device, so that no reference the log holds names
    /// a record the device does not. The file's device is flushed too when
    /// it is not `log_device` (the log's own flush covers blobs beside it).
    pub fn write_staging(&self, dev: &BlockDevice, log_device: usize) -> Result<()> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let had = !file.staging().bytes.is_empty();
        file.write_staging(dev)?;
        if had && dev.member_of(file.extent.start_block) != log_device {
            dev.flush_holding(file.extent.start_block)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_reads_back_as_encoded() {
        let r = BlobRef {
            file_no: 7,
            record_block: 3,
            value_offset: 40,
            len: 5 << 20,
            crc: 0xdead_beef,
        };
        assert_eq!(BlobRef::decode(&r.encode()), Some(r));
        assert_eq!(BlobRef::decode(&r.encode()[..27]), None);
        assert_eq!(r.record_blocks(), (40 + (5 << 20) as u64).div_ceil(4096));
    }

    #[test]
    fn a_record_takes_whole_blocks() {
        assert_eq!(record_blocks(0, 4096 - 32), 1);
        assert_eq!(record_blocks(1, 4096 - 32), 2);
        assert_eq!(
            record_blocks(8, 1 << 20),
            ((1 << 20) + 40u64).div_ceil(4096)
        );
    }
}
