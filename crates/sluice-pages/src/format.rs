//! The export device's blocks, byte by byte as docs/FORMAT.md ("Export
//! device format") writes them down: header, checkpoints, manifest blocks.
//! Header and checkpoint blocks end with a CRC32C of the bytes before it; a
//! manifest block, rewritten in place as pages are added, has one for its
//! header and one for each entry, so that a torn rewrite keeps every entry
//! that was already on the device.

use crate::error::{Error, Result};
use sluice_io::codec;

/// First bytes of both header copies.
pub const HEADER_MAGIC: &[u8; 8] = b"SLCEXPT1";
/// First bytes of each slice checkpoint copy.
pub const CHECKPOINT_MAGIC: &[u8; 8] = b"SLCCKPT1";
/// First bytes of each manifest block (format 2: a CRC32C per entry).
pub const MANIFEST_MAGIC: &[u8; 8] = b"SLCMANI2";
/// First bytes of a format-1 manifest block (one CRC32C for the block),
/// still read.
pub const MANIFEST_MAGIC_V1: &[u8; 8] = b"SLCMANI1";
/// The format version this build writes.
pub const FORMAT_VERSION: u32 = 2;
/// The oldest format version this build reads.
pub const OLDEST_READ_VERSION: u32 = 1;
/// Most slices one export may have (each takes two checkpoint blocks).
pub const MAX_SLICES: u32 = 1024;
/// "No extent": a slice that has written nothing yet, or the first extent's predecessor.
pub const NO_EXTENT: u64 = u64::MAX;
/// Bytes of one page entry in a manifest block.
pub const ENTRY_BYTES: usize = 32;
const MANIFEST_HEADER_BYTES: usize = 64;
/// Where a format-2 manifest block's header CRC32C lies (it covers the bytes before).
const MANIFEST_HEADER_CRC_AT: usize = 60;
const HEADER_FIXED_BYTES: usize = 108;
const CHECKPOINT_FIXED_BYTES: usize = 64;

/// Manifest entries one block holds: the most slots an extent may have.
pub fn max_extent_slots(block_size_bytes: u32) -> u32 {
    ((block_size_bytes as usize - MANIFEST_HEADER_BYTES - 4) / ENTRY_BYTES) as u32
}

/// Longest cursor a checkpoint block holds.
pub fn max_cursor_bytes(block_size_bytes: u32) -> usize {
    block_size_bytes as usize - CHECKPOINT_FIXED_BYTES - 4
}

/// Whether every slice has finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportState {
    /// Some slice is still being written (or was interrupted).
    InProgress = 1,
    /// Every slice is done: the export can be read.
    Complete = 2,
}

/// How the slices walked the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CursorKind {
    /// Point in time + search_after.
    Pit = 0,
    /// Scroll contexts (cannot resume).
    Scroll = 1,
}

/// Where a slice stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SliceState {
    /// No page written yet.
    NotStarted = 0,
    /// Pages written, more to come.
    Running = 1,
    /// Every page written.
    Done = 2,
}

/// The export device's header (two copies); docs/FORMAT.md "Export device format".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The device's block size when written.
    pub block_size_bytes: u32,
    /// Raised on every write; the higher valid copy wins.
    pub generation: u64,
    /// In progress or complete.
    pub state: ExportState,
    /// Slices.
    pub slice_count: u32,
    /// Documents per page.
    pub page_docs: u32,
    /// Blocks of a page slot.
    pub slot_blocks: u32,
    /// Slots per extent.
    pub extent_slots: u32,
    /// Point in time or scroll.
    pub cursor_kind: CursorKind,
    /// First manifest block (one per extent).
    pub manifest_lba: u64,
    /// First data block.
    pub data_lba: u64,
    /// Extents the device holds.
    pub extent_capacity: u64,
    /// When the export started.
    pub created_unix_ms: u64,
    /// Documents written (final once complete).
    pub total_docs: u64,
    /// Pages written.
    pub total_pages: u64,
    /// Page bytes written.
    pub total_bytes: u64,
    /// JSON: source URL (no credentials), index, query, `_source` filters.
    pub description: String,
}

impl Header {
    /// LBA of copy `copy` (0 or 1) of slice `slice`'s checkpoint.
    pub fn checkpoint_lba(slice: u32, copy: u64) -> u64 {
        2 + 2 * slice as u64 + (copy & 1)
    }

    /// LBA of extent `extent`'s manifest block.
    pub fn manifest_block_lba(&self, extent: u64) -> u64 {
        debug_assert!(extent < self.extent_capacity);
        self.manifest_lba + extent
    }

    /// Blocks of one extent.
    pub fn extent_blocks(&self) -> u64 {
        self.extent_slots as u64 * self.slot_blocks as u64
    }

    /// LBA of slot `slot` of extent `extent`.
    pub fn slot_lba(&self, extent: u64, slot: u32) -> u64 {
        debug_assert!(extent < self.extent_capacity && slot < self.extent_slots);
        self.data_lba + extent * self.extent_blocks() + slot as u64 * self.slot_blocks as u64
    }

    /// Bytes of one slot.
    pub fn slot_bytes(&self) -> u64 {
        self.slot_blocks as u64 * self.block_size_bytes as u64
    }

    /// Writes the header into one block (sealed with its CRC32C); refuses a description that does not fit.
    pub fn encode(&self, block: &mut [u8]) -> Result<()> {
        assert_eq!(block.len(), self.block_size_bytes as usize);
        let room = block.len() - HEADER_FIXED_BYTES - 4;
        if self.description.len() > room {
            return Err(Error::Config(format!(
                "the export description ({} bytes: source, index, query, _source filters) does not fit the header's {room} bytes; shorten the query",
                self.description.len()
            )));
        }
        block.fill(0);
        let mut w = Writer::new(block);
        w.bytes(HEADER_MAGIC);
        w.u32(FORMAT_VERSION);
        w.u32(self.block_size_bytes);
        w.u64(self.generation);
        w.u32(self.state as u32);
        w.u32(self.slice_count);
        w.u32(self.page_docs);
        w.u32(self.slot_blocks);
        w.u32(self.extent_slots);
        w.u32(self.cursor_kind as u32);
        w.u64(self.manifest_lba);
        w.u64(self.data_lba);
        w.u64(self.extent_capacity);
        w.u64(self.created_unix_ms);
        w.u64(self.total_docs);
        w.u64(self.total_pages);
        w.u64(self.total_bytes);
        w.u32(self.description.len() as u32);
        debug_assert_eq!(w.pos, HEADER_FIXED_BYTES);
        w.bytes(self.description.as_bytes());
        seal(block);
        Ok(())
    }

    /// Decodes one header copy; `lba` names it in errors.
    pub fn decode(block: &[u8], lba: u64) -> Result<Header> {
        check_block(block, HEADER_MAGIC, "export header", lba)?;
        let mut r = Fields::new(block, 8, "export header", lba);
        let version = r.u32()?;
        if !(OLDEST_READ_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(Error::Format(format!(
                "export header at LBA {lba} is format version {version}; this build reads versions {OLDEST_READ_VERSION} to {FORMAT_VERSION}"
            )));
        }
        let block_size_bytes = r.u32()?;
        if block_size_bytes as usize != block.len() {
            return Err(Error::Format(format!(
                "export header at LBA {lba} was written with {block_size_bytes}-byte blocks; the device has {}-byte blocks",
                block.len()
            )));
        }
        let generation = r.u64()?;
        let state = match r.u32()? {
            1 => ExportState::InProgress,
            2 => ExportState::Complete,
            other => return Err(invalid("export header", lba, format!("state {other}"))),
        };
        let slice_count = r.u32()?;
        let page_docs = r.u32()?;
        let slot_blocks = r.u32()?;
        let extent_slots = r.u32()?;
        let cursor_kind = match r.u32()? {
            0 => CursorKind::Pit,
            1 => CursorKind::Scroll,
            other => {
                return Err(invalid(
                    "export header",
                    lba,
                    format!("cursor kind {other}"),
                ))
            }
        };
        let header = Header {
            block_size_bytes,
            generation,
            state,
            slice_count,
            page_docs,
            slot_blocks,
            extent_slots,
            cursor_kind,
            manifest_lba: r.u64()?,
            data_lba: r.u64()?,
            extent_capacity: r.u64()?,
            created_unix_ms: r.u64()?,
            total_docs: r.u64()?,
            total_pages: r.u64()?,
            total_bytes: r.u64()?,
            description: {
                let len = r.u32()? as usize;
                r.string(len, block.len() - 4)?
            },
        };
        header.validate(lba)?;
        Ok(header)
    }

    fn validate(&self, lba: u64) -> Result<()> {
        let bad = |what: String| Err(invalid("export header", lba, what));
        if self.slice_count == 0 || self.slice_count > MAX_SLICES {
            return bad(format!("slice count {}", self.slice_count));
        }
        if self.slot_blocks == 0 || self.page_docs == 0 {
            return bad("zero slot size or page size".into());
        }
        if self.extent_slots == 0 || self.extent_slots > max_extent_slots(self.block_size_bytes) {
            return bad(format!("extent_slots {}", self.extent_slots));
        }
        if self.manifest_lba != 2 + 2 * self.slice_count as u64
            || self.data_lba != self.manifest_lba + self.extent_capacity
        {
            return bad("region addresses do not follow from the slice count".into());
        }
        Ok(())
    }
}

/// Where one slice stands (two copies, written alternately).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The slice.
    pub slice: u32,
    /// Not started, running or done.
    pub state: SliceState,
    /// Raised on every write; the higher valid copy wins.
    pub generation: u64,
    /// Durable pages of the slice.
    pub pages: u64,
    /// Documents in them.
    pub docs: u64,
    /// Page bytes in them.
    pub bytes: u64,
    /// The extent the slice writes into.
    pub current_extent: u64,
    /// Next free slot of that extent.
    pub next_slot: u32,
    /// JSON: `{"pit_id":…,"search_after":[…]}` or `{"scroll_id":…}`; empty before the first page.
    pub cursor: String,
}

impl Checkpoint {
    /// A slice not yet started.
    pub fn new(slice: u32) -> Self {
        Checkpoint {
            slice,
            state: SliceState::NotStarted,
            generation: 0,
            pages: 0,
            docs: 0,
            bytes: 0,
            current_extent: NO_EXTENT,
            next_slot: 0,
            cursor: String::new(),
        }
    }

    /// Writes the checkpoint into one block (sealed); refuses a cursor that does not fit.
    pub fn encode(&self, block: &mut [u8]) -> Result<()> {
        let room = max_cursor_bytes(block.len() as u32);
        if self.cursor.len() > room {
            return Err(Error::Config(format!(
                "slice {}'s cursor ({} bytes) does not fit a checkpoint block ({room} bytes); use a device with 4096-byte blocks or fewer shards per slice",
                self.slice,
                self.cursor.len()
            )));
        }
        block.fill(0);
        let mut w = Writer::new(block);
        w.bytes(CHECKPOINT_MAGIC);
        w.u32(self.slice);
        w.u32(self.state as u32);
        w.u64(self.generation);
        w.u64(self.pages);
        w.u64(self.docs);
        w.u64(self.bytes);
        w.u64(self.current_extent);
        w.u32(self.next_slot);
        w.u32(self.cursor.len() as u32);
        debug_assert_eq!(w.pos, CHECKPOINT_FIXED_BYTES);
        w.bytes(self.cursor.as_bytes());
        seal(block);
        Ok(())
    }

    /// Decodes one checkpoint copy; `lba` names it in errors.
    pub fn decode(block: &[u8], lba: u64) -> Result<Checkpoint> {
        check_block(block, CHECKPOINT_MAGIC, "checkpoint", lba)?;
        let mut r = Fields::new(block, 8, "checkpoint", lba);
        let slice = r.u32()?;
        let state = match r.u32()? {
            0 => SliceState::NotStarted,
            1 => SliceState::Running,
            2 => SliceState::Done,
            other => return Err(invalid("checkpoint", lba, format!("state {other}"))),
        };
        Ok(Checkpoint {
            slice,
            state,
            generation: r.u64()?,
            pages: r.u64()?,
            docs: r.u64()?,
            bytes: r.u64()?,
            current_extent: r.u64()?,
            next_slot: r.u32()?,
            cursor: {
                let len = r.u32()? as usize;
                r.string(len, block.len() - 4)?
            },
        })
    }
}

/// One page's manifest entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageEntry {
    /// The page's slice.
    pub slice: u32,
    /// Its number in the slice, from 0.
    pub seq: u32,
    /// Its first block.
    pub lba: u64,
    /// Bytes of the page (before padding).
    pub byte_len: u32,
    /// Documents in it.
    pub doc_count: u32,
    /// CRC32C of its bytes.
    pub crc32c: u32,
    /// Slots it takes.
    pub slots: u32,
}

impl PageEntry {
    /// The entry's fields after its slice, in both formats' order.
    fn read_after_slice(r: &mut Fields<'_>, slice: u32) -> Result<PageEntry> {
        Ok(PageEntry {
            slice,
            seq: r.u32()?,
            lba: r.u64()?,
            byte_len: r.u32()?,
            doc_count: r.u32()?,
            crc32c: r.u32()?,
            slots: r.u32()?,
        })
    }
}

/// One extent's manifest block: the pages written into the extent.
///
/// Written whole after every page placed in the extent, over the block's
/// last contents. Its header never changes once written and each entry is
/// checked by its own CRC32C (seeded with the extent and owner), so a
/// write torn at any sector keeps every entry written before it, and an
/// entry left by an earlier owner of the extent is not taken for this one's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestBlock {
    /// The extent.
    pub extent: u64,
    /// The slice that owns it.
    pub owner_slice: u32,
    /// The slice's previous extent (`u64::MAX` for its first).
    pub prev_extent: u64,
    /// Its pages, in order.
    pub entries: Vec<PageEntry>,
}

impl ManifestBlock {
    /// Writes the block (format 2): header with its CRC32C, then each
    /// entry with its own.
    pub fn encode(&self, block: &mut [u8]) {
        assert!(self.entries.len() <= max_extent_slots(block.len() as u32) as usize);
        block.fill(0);
        let mut w = Writer::new(block);
        w.bytes(MANIFEST_MAGIC);
        w.u64(self.extent);
        w.u32(self.owner_slice);
        w.u32(0);
        w.u64(self.prev_extent);
        let header_crc = crc32c::crc32c(&w.buf[..MANIFEST_HEADER_CRC_AT]);
        w.pos = MANIFEST_HEADER_CRC_AT;
        w.u32(header_crc);
        debug_assert_eq!(w.pos, MANIFEST_HEADER_BYTES);
        let seed = self.entry_seed();
        for e in &self.entries {
            debug_assert_eq!(e.slice, self.owner_slice, "an entry of the extent's owner");
            let start = w.pos;
            w.u32(e.seq);
            w.u64(e.lba);
            w.u32(e.byte_len);
            w.u32(e.doc_count);
            w.u32(e.crc32c);
            w.u32(e.slots);
            let crc = crc32c::crc32c_append(seed, &w.buf[start..w.pos]);
            w.u32(crc);
        }
    }

    /// What each entry's CRC32C starts from: the extent and its owner.
    fn entry_seed(&self) -> u32 {
        let mut seed = [0u8; 12];
        seed[..8].copy_from_slice(&self.extent.to_le_bytes());
        seed[8..].copy_from_slice(&self.owner_slice.to_le_bytes());
        crc32c::crc32c(&seed)
    }

    /// Decodes a manifest block of either format; `lba` names it in
    /// errors. Format 2 gives the entries up to the first whose CRC32C does
    /// not match (never written, or torn on the way).
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a header; a whole entry"
    )]
    pub fn decode(block: &[u8], lba: u64) -> Result<ManifestBlock> {
        if block.len() >= 512 && &block[..8] == MANIFEST_MAGIC_V1 {
            return Self::decode_v1(block, lba);
        }
        if block.len() < 512 || &block[..8] != MANIFEST_MAGIC {
            // Names the block and what was found there.
            check_block(block, MANIFEST_MAGIC, "manifest block", lba)?;
        }
        let stored = codec::u32_at(block, MANIFEST_HEADER_CRC_AT).expect("a header");
        let computed = crc32c::crc32c(&block[..MANIFEST_HEADER_CRC_AT]);
        if stored != computed {
            return Err(Error::Format(format!(
                "manifest block at LBA {lba} is corrupt: header CRC32C {computed:#010x}, recorded {stored:#010x}"
            )));
        }
        let mut r = Fields::new(block, 8, "manifest block", lba);
        let extent = r.u64()?;
        let owner_slice = r.u32()?;
        let _zero = r.u32()?;
        let prev_extent = r.u64()?;
        let mut m = ManifestBlock {
            extent,
            owner_slice,
            prev_extent,
            entries: Vec::new(),
        };
        let seed = m.entry_seed();
        for i in 0..max_extent_slots(block.len() as u32) as usize {
            let start = MANIFEST_HEADER_BYTES + i * ENTRY_BYTES;
            let entry = &block[start..start + ENTRY_BYTES];
            let stored = codec::u32_at(entry, ENTRY_BYTES - 4).expect("a whole entry");
            if crc32c::crc32c_append(seed, &entry[..ENTRY_BYTES - 4]) != stored {
                break;
            }
            let mut r = Fields::new(entry, 0, "manifest entry", lba);
            m.entries
                .push(PageEntry::read_after_slice(&mut r, owner_slice)?);
        }
        Ok(m)
    }

    /// A format-1 block: one CRC32C over the block and an entry count.
    fn decode_v1(block: &[u8], lba: u64) -> Result<ManifestBlock> {
        check_block(block, MANIFEST_MAGIC_V1, "manifest block", lba)?;
        let mut r = Fields::new(block, 8, "manifest block", lba);
        let extent = r.u64()?;
        let owner_slice = r.u32()?;
        let count = r.u32()? as usize;
        let prev_extent = r.u64()?;
        if count > max_extent_slots(block.len() as u32) as usize {
            return Err(invalid("manifest block", lba, format!("{count} entries")));
        }
        let mut r = Fields::new(block, MANIFEST_HEADER_BYTES, "manifest block", lba);
        let entries = (0..count)
            .map(|_| {
                let slice = r.u32()?;
                PageEntry::read_after_slice(&mut r, slice)
            })
            .collect::<Result<_>>()?;
        Ok(ManifestBlock {
            extent,
            owner_slice,
            prev_extent,
            entries,
        })
    }
}

fn seal(block: &mut [u8]) {
    let end = block.len() - 4;
    let crc = crc32c::crc32c(&block[..end]);
    block[end..].copy_from_slice(&crc.to_le_bytes());
}

#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: 4 bytes at the end"
)]
fn check_block(block: &[u8], magic: &[u8; 8], what: &str, lba: u64) -> Result<()> {
    if block.len() < 512 {
        return Err(invalid(
            what,
            lba,
            format!("a block of {} bytes", block.len()),
        ));
    }
    if &block[..8] != magic {
        return Err(Error::Format(format!(
            "no {what} at LBA {lba} (found {:?} where {:?} belongs): not a Sluice export device, or not written yet",
            String::from_utf8_lossy(&block[..8]),
            String::from_utf8_lossy(magic)
        )));
    }
    let end = block.len() - 4;
    let stored = codec::u32_at(block, end).expect("4 bytes at the end");
    let computed = crc32c::crc32c(&block[..end]);
    if stored != computed {
        return Err(Error::Format(format!(
            "{what} at LBA {lba} is corrupt: CRC32C {computed:#010x}, recorded {stored:#010x}"
        )));
    }
    Ok(())
}

fn invalid(what: &str, lba: u64, detail: String) -> Error {
    Error::Format(format!("{what} at LBA {lba} is invalid: {detail}"))
}

struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    fn new(buf: &'a mut [u8]) -> Self {
        Writer { buf, pos: 0 }
    }
    fn bytes(&mut self, b: &[u8]) {
        self.buf[self.pos..self.pos + b.len()].copy_from_slice(b);
        self.pos += b.len();
    }
    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
}

/// The export format's fields, read through [`codec::Reader`]: a block
/// too short for them is an error naming the block, never a panic.
struct Fields<'a> {
    r: codec::Reader<'a>,
    what: &'static str,
    lba: u64,
}

impl<'a> Fields<'a> {
    fn new(block: &'a [u8], at: usize, what: &'static str, lba: u64) -> Self {
        Fields {
            r: codec::Reader::at(block, at),
            what,
            lba,
        }
    }
    fn short(&self) -> Error {
        invalid(
            self.what,
            self.lba,
            "the block ends inside its fields".into(),
        )
    }
    fn u32(&mut self) -> Result<u32> {
        self.r.u32().ok_or_else(|| self.short())
    }
    fn u64(&mut self) -> Result<u64> {
        self.r.u64().ok_or_else(|| self.short())
    }
    /// UTF-8 text of `len` bytes that must end before `limit`.
    fn string(&mut self, len: usize, limit: usize) -> Result<String> {
        if self.r.position().saturating_add(len) > limit {
            return Err(invalid(
                self.what,
                self.lba,
                format!("a text of {len} bytes runs past the block"),
            ));
        }
        let bytes = self.r.take(len).ok_or_else(|| self.short())?;
        std::str::from_utf8(bytes)
            .map(str::to_string)
            .map_err(|_| invalid(self.what, self.lba, "a text that is not UTF-8".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            block_size_bytes: 4096,
            generation: 3,
            state: ExportState::InProgress,
            slice_count: 4,
            page_docs: 2048,
            slot_blocks: 800,
            extent_slots: 16,
            cursor_kind: CursorKind::Pit,
            manifest_lba: 10,
            data_lba: 110,
            extent_capacity: 100,
            created_unix_ms: 1_700_000_000_000,
            total_docs: 0,
            total_pages: 0,
            total_bytes: 0,
            description: r#"{"index":"papers"}"#.into(),
        }
    }

    #[test]
    fn header_round_trips_and_every_flipped_byte_is_caught() {
        let h = header();
        let mut block = vec![0u8; 4096];
        h.encode(&mut block).unwrap();
        assert_eq!(Header::decode(&block, 0).unwrap(), h);
        for pos in [0, 9, 30, 108, 2000, 4095] {
            let mut bad = block.clone();
            bad[pos] ^= 0x40;
            let err = Header::decode(&bad, 1).unwrap_err().to_string();
            assert!(err.contains("LBA 1"), "{err}");
        }
    }

    #[test]
    fn header_regions_must_follow_from_the_slice_count() {
        let mut h = header();
        h.data_lba = 111;
        let mut block = vec![0u8; 4096];
        h.encode(&mut block).unwrap();
        assert!(Header::decode(&block, 0).is_err());
    }

    #[test]
    fn checkpoint_and_manifest_round_trip() {
        let c = Checkpoint {
            slice: 3,
            state: SliceState::Running,
            generation: 9,
            pages: 8,
            docs: 16000,
            bytes: 25_000_000,
            current_extent: 5,
            next_slot: 2,
            cursor: r#"{"pit_id":"abc","search_after":[12]}"#.into(),
        };
        let mut block = vec![0u8; 4096];
        c.encode(&mut block).unwrap();
        assert_eq!(Checkpoint::decode(&block, 9).unwrap(), c);
        let m = ManifestBlock {
            extent: 5,
            owner_slice: 3,
            prev_extent: NO_EXTENT,
            entries: (0..max_extent_slots(4096))
                .map(|i| PageEntry {
                    slice: 3,
                    seq: i,
                    lba: 1000 + i as u64,
                    byte_len: 77 + i,
                    doc_count: i,
                    crc32c: i * 7,
                    slots: 1,
                })
                .collect(),
        };
        m.encode(&mut block);
        assert_eq!(ManifestBlock::decode(&block, 12).unwrap(), m);
        // A damaged entry ends the block's entries there; a damaged header
        // is an error naming the block.
        let mut damaged = block.clone();
        damaged[MANIFEST_HEADER_BYTES + 3 * ENTRY_BYTES + 5] ^= 1;
        let decoded = ManifestBlock::decode(&damaged, 12).unwrap();
        assert_eq!(decoded.entries, m.entries[..3]);
        damaged[20] ^= 1;
        let err = ManifestBlock::decode(&damaged, 12).unwrap_err().to_string();
        assert!(err.contains("manifest block at LBA 12 is corrupt"), "{err}");
    }

    #[test]
    fn a_torn_manifest_rewrite_keeps_the_entries_written_before_it() {
        let entry = |seq: u32| PageEntry {
            slice: 2,
            seq,
            lba: 500 + seq as u64 * 3,
            byte_len: 9000 + seq,
            doc_count: 16,
            crc32c: seq.wrapping_mul(0x9e37_79b9),
            slots: 1,
        };
        let mut m = ManifestBlock {
            extent: 7,
            owner_slice: 2,
            prev_extent: 3,
            entries: (0..20).map(entry).collect(),
        };
        let mut old = vec![0u8; 4096];
        m.encode(&mut old);
        m.entries.extend((20..40).map(entry));
        let mut new = vec![0u8; 4096];
        m.encode(&mut new);
        // Every mix of the two writes' 512-byte sectors.
        for mask in 0u32..256 {
            let mut torn = old.clone();
            for sector in 0..8 {
                if mask & (1 << sector) != 0 {
                    let r = sector * 512..(sector + 1) * 512;
                    torn[r.clone()].copy_from_slice(&new[r]);
                }
            }
            let got = ManifestBlock::decode(&torn, 1).unwrap();
            assert!(
                got.entries.len() >= 20,
                "mask {mask:#x}: {} entries",
                got.entries.len()
            );
            assert_eq!(
                got.entries,
                m.entries[..got.entries.len()],
                "mask {mask:#x}"
            );
        }
        // The same bytes under another owner or extent are not its entries.
        let other = ManifestBlock {
            owner_slice: 3,
            ..m.clone()
        };
        let mut reused = vec![0u8; 4096];
        other.encode(&mut reused[..]);
        reused[MANIFEST_HEADER_BYTES..].copy_from_slice(&new[MANIFEST_HEADER_BYTES..]);
        assert!(ManifestBlock::decode(&reused, 1)
            .unwrap()
            .entries
            .is_empty());
    }

    #[test]
    fn format_1_manifest_blocks_are_still_read() {
        let mut block = vec![0u8; 4096];
        block[..8].copy_from_slice(MANIFEST_MAGIC_V1);
        block[8..16].copy_from_slice(&4u64.to_le_bytes());
        block[16..20].copy_from_slice(&1u32.to_le_bytes());
        block[20..24].copy_from_slice(&1u32.to_le_bytes());
        block[24..32].copy_from_slice(&NO_EXTENT.to_le_bytes());
        let fields: [u32; 8] = [1, 0, 900, 0, 1234, 10, 0xabcd, 2];
        for (i, f) in fields.iter().enumerate() {
            block[64 + 4 * i..68 + 4 * i].copy_from_slice(&f.to_le_bytes());
        }
        seal(&mut block);
        let m = ManifestBlock::decode(&block, 3).unwrap();
        assert_eq!((m.extent, m.owner_slice, m.prev_extent), (4, 1, NO_EXTENT));
        assert_eq!(
            m.entries,
            [PageEntry {
                slice: 1,
                seq: 0,
                lba: 900,
                byte_len: 1234,
                doc_count: 10,
                crc32c: 0xabcd,
                slots: 2,
            }]
        );
        block[100] ^= 1;
        let err = ManifestBlock::decode(&block, 3).unwrap_err().to_string();
        assert!(err.contains("manifest block at LBA 3 is corrupt"), "{err}");
    }

    #[test]
    fn oversized_cursor_is_refused_with_sizes() {
        let mut c = Checkpoint::new(0);
        c.cursor = "x".repeat(5000);
        let err = c.encode(&mut [0u8; 4096]).unwrap_err().to_string();
        assert!(err.contains("5000 bytes"), "{err}");
    }
}
