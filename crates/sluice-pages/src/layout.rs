//! Reading an export's layout back: the newest valid header, each slice's
//! newest valid checkpoint, and the slice's pages found by walking its chain
//! of manifest blocks. Plus the extent allocator shared by the slices.

use crate::device::{read_block, DeviceIo};
use crate::error::{Error, Result};
use crate::format::{Checkpoint, ExportState, Header, ManifestBlock, PageEntry, NO_EXTENT};
use std::collections::BTreeSet;
use std::sync::Mutex;

/// One slice of an export as the device holds it.
#[derive(Debug, Clone)]
pub struct LoadedSlice {
    /// Its newest valid checkpoint.
    pub checkpoint: Checkpoint,
    /// The slice's extents, oldest first.
    pub extents: Vec<u64>,
    /// Its durable pages in sequence order: 0 … pages − 1.
    pub pages: Vec<PageEntry>,
    /// The manifest block of the current extent, cut to the durable pages.
    pub current_manifest: Option<ManifestBlock>,
}

/// An export as the device holds it.
#[derive(Debug, Clone)]
pub struct LoadedExport {
    /// The newest valid header.
    pub header: Header,
    /// Every slice.
    pub slices: Vec<LoadedSlice>,
}

impl LoadedExport {
    /// Refuses an export that is not complete, naming what is missing.
    pub fn require_complete(&self, device: &str) -> Result<()> {
        if self.header.state == ExportState::Complete {
            return Ok(());
        }
        let open: Vec<String> = self
            .slices
            .iter()
            .filter(|s| s.checkpoint.state != crate::format::SliceState::Done)
            .map(|s| s.checkpoint.slice.to_string())
            .collect();
        // A scroll cannot be resumed where it stopped (the source's position
        // runs ahead of what was written): only a new export finishes it.
        let what_to_do = match self.header.cursor_kind {
            crate::format::CursorKind::Pit => {
                "finish it with `sluice export --resume` and the same options"
            }
            crate::format::CursorKind::Scroll => {
                "it was written with --api scroll, which cannot resume: run the export again without --resume (the default point-in-time cursor can resume after an interruption)"
            }
        };
        Err(Error::Incomplete(format!(
            "the export on {device} is not complete (slices {} not finished, {} documents durable so far); {what_to_do}",
            if open.is_empty() { "none".into() } else { open.join(", ") },
            self.slices.iter().map(|s| s.checkpoint.docs).sum::<u64>()
        )))
    }
}

/// The valid copy with the higher generation, or both copies' errors.
fn newest<T>(a: Result<T>, b: Result<T>, generation: impl Fn(&T) -> u64) -> Result<T> {
    match (a, b) {
        (Ok(x), Ok(y)) => Ok(if generation(&y) > generation(&x) {
            y
        } else {
            x
        }),
        (Ok(x), Err(_)) | (Err(_), Ok(x)) => Ok(x),
        (Err(e), Err(f)) => Err(Error::Format(format!("{e}; and the other copy: {f}"))),
    }
}

/// The newest valid header copy.
pub fn load_header(io: &DeviceIo) -> Result<Header> {
    let a = read_block(io, 0).and_then(|b| Header::decode(&b, 0));
    let b = read_block(io, 1).and_then(|b| Header::decode(&b, 1));
    newest(a, b, |h| h.generation)
}

/// The header, every slice's checkpoint and its durable pages.
pub fn load_export(io: &DeviceIo) -> Result<LoadedExport> {
    let header = load_header(io)?;
    let slices = (0..header.slice_count)
        .map(|slice| load_slice(io, &header, slice))
        .collect::<Result<_>>()?;
    Ok(LoadedExport { header, slices })
}

fn load_slice(io: &DeviceIo, header: &Header, slice: u32) -> Result<LoadedSlice> {
    let copy = |c: u64| {
        let lba = Header::checkpoint_lba(slice, c);
        read_block(io, lba).and_then(|b| Checkpoint::decode(&b, lba))
    };
    let checkpoint = newest(copy(0), copy(1), |c| c.generation)?;
    if checkpoint.slice != slice {
        return Err(Error::Format(format!(
            "the checkpoint of slice {slice} names slice {}",
            checkpoint.slice
        )));
    }
    let mut extents = Vec::new();
    let mut pages = Vec::new();
    let mut current_manifest = None;
    // Pages of an older extent of the chain come before those of the next
    // one: an entry at or past the next extent's first page is an earlier
    // run's, written before a crash that no checkpoint counted, after
    // which that page went to a new extent.
    let mut next_extent_first_seq = u64::MAX;
    let mut extent = checkpoint.current_extent;
    while extent != NO_EXTENT {
        if extent >= header.extent_capacity || extents.len() as u64 >= header.extent_capacity {
            return Err(Error::Format(format!(
                "slice {slice}'s chain of extents is broken at extent {extent} (capacity {})",
                header.extent_capacity
            )));
        }
        let lba = header.manifest_block_lba(extent);
        let mut block = ManifestBlock::decode(&read_block(io, lba)?, lba)?;
        if block.extent != extent || block.owner_slice != slice {
            return Err(Error::Format(format!(
                "manifest block at LBA {lba} belongs to extent {} of slice {}, where slice {slice}'s extent {extent} was expected",
                block.extent, block.owner_slice
            )));
        }
        // Entries written after the last durable checkpoint are not part of the export.
        let bound = checkpoint.pages.min(next_extent_first_seq);
        block.entries.retain(|e| (e.seq as u64) < bound);
        if let Some(first) = block.entries.iter().map(|e| e.seq as u64).min() {
            next_extent_first_seq = first;
        }
        pages.extend(block.entries.iter().copied());
        extents.push(extent);
        extent = block.prev_extent;
        if current_manifest.is_none() {
            current_manifest = Some(block);
        }
    }
    extents.reverse();
    pages.sort_by_key(|e| e.seq);
    check_pages(slice, &checkpoint, &pages)?;
    Ok(LoadedSlice {
        checkpoint,
        extents,
        pages,
        current_manifest,
    })
}

fn check_pages(slice: u32, checkpoint: &Checkpoint, pages: &[PageEntry]) -> Result<()> {
    let broken = |what: String| {
        Err(Error::Format(format!(
            "slice {slice}'s manifest does not match its checkpoint: {what}"
        )))
    };
    if pages.len() as u64 != checkpoint.pages {
        return broken(format!(
            "{} pages found, {} recorded",
            pages.len(),
            checkpoint.pages
        ));
    }
    for (i, p) in pages.iter().enumerate() {
        if p.seq as usize != i || p.slice != slice {
            return broken(format!(
                "page {i} missing or repeated (found page {} of slice {})",
                p.seq, p.slice
            ));
        }
    }
    let docs: u64 = pages.iter().map(|p| p.doc_count as u64).sum();
    let bytes: u64 = pages.iter().map(|p| p.byte_len as u64).sum();
    if docs != checkpoint.docs || bytes != checkpoint.bytes {
        return broken(format!(
            "{docs} documents in {bytes} bytes found, {} in {} recorded",
            checkpoint.docs, checkpoint.bytes
        ));
    }
    Ok(())
}

/// Hands out extents, lowest free first, to the slices of one export.
#[derive(Debug)]
pub struct ExtentAllocator {
    capacity: u64,
    state: Mutex<AllocState>,
}

#[derive(Debug)]
struct AllocState {
    next: u64,
    holes: BTreeSet<u64>,
}

impl ExtentAllocator {
    /// `used`: extents that belong to the export already (after `--resume`).
    pub fn new(capacity: u64, used: Vec<u64>) -> Self {
        let next = used.iter().max().map_or(0, |m| m + 1);
        let used: BTreeSet<u64> = used.into_iter().collect();
        let holes = (0..next).filter(|e| !used.contains(e)).collect();
        ExtentAllocator {
            capacity,
            state: Mutex::new(AllocState { next, holes }),
        }
    }

    /// A free extent, or None when the device is full.
    pub fn take(&self) -> Option<u64> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = st.holes.pop_first() {
            return Some(e);
        }
        (st.next < self.capacity).then(|| {
            st.next += 1;
            st.next - 1
        })
    }

    /// One past the highest extent handed out.
    pub fn high_water(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_fills_holes_first_and_stops_at_capacity() {
        let a = ExtentAllocator::new(6, vec![0, 3, 1]);
        assert_eq!(a.take(), Some(2));
        assert_eq!(a.take(), Some(4));
        assert_eq!(a.take(), Some(5));
        assert_eq!(a.take(), None);
        assert_eq!(a.high_water(), 6);
    }

    #[test]
    fn an_earlier_runs_entries_before_a_new_extent_are_not_read() {
        use crate::device::DeviceIo;
        use crate::format::CursorKind;
        use crate::write::{new_header, Layout};
        use sluice_io::{Device, MemoryDevice};
        use std::sync::Arc;
        let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(4096, 4096));
        let layout = Layout {
            slices: 1,
            page_docs: 10,
            slot_blocks: 2,
            extent_slots: 8,
            cursor_kind: CursorKind::Pit,
            description: "{}".into(),
        };
        let header = new_header(device.geometry(), &layout).unwrap();
        let io = DeviceIo::open(device, 2, 1 << 20).unwrap();
        let mut block = vec![0u8; 4096];
        header.encode(&mut block).unwrap();
        io.write(0, &block).unwrap();
        let entry = |seq: u32, extent: u64, slot: u32| PageEntry {
            slice: 0,
            seq,
            lba: header.slot_lba(extent, slot),
            byte_len: 100 + seq,
            doc_count: 10,
            crc32c: seq,
            slots: 1,
        };
        // Extent 0 still holds pages 2 and 3 of a run that crashed before
        // counting them; the resumed run put its page 2 (larger) and what
        // followed into extent 1.
        let old = ManifestBlock {
            extent: 0,
            owner_slice: 0,
            prev_extent: NO_EXTENT,
            entries: (0..4).map(|s| entry(s, 0, s)).collect(),
        };
        let new = ManifestBlock {
            extent: 1,
            owner_slice: 0,
            prev_extent: 0,
            entries: (2..5).map(|s| entry(s, 1, s - 2)).collect(),
        };
        for m in [&old, &new] {
            m.encode(&mut block);
            io.write(header.manifest_block_lba(m.extent), &block)
                .unwrap();
        }
        let mut c = Checkpoint::new(0);
        c.generation = 1;
        c.pages = 5;
        c.docs = 50;
        c.bytes = (0..5).map(|s| 100 + s as u64).sum();
        c.current_extent = 1;
        c.next_slot = 3;
        c.encode(&mut block).unwrap();
        io.write(Header::checkpoint_lba(0, 1), &block).unwrap();
        let loaded = load_export(&io).unwrap();
        let pages = &loaded.slices[0].pages;
        assert_eq!(
            pages.iter().map(|p| p.seq).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
        assert_eq!(pages[2], entry(2, 1, 0));
        assert_eq!(loaded.slices[0].extents, [0, 1]);
    }

    #[test]
    fn page_checks_name_what_is_wrong() {
        let mut c = Checkpoint::new(2);
        c.pages = 2;
        c.docs = 3;
        c.bytes = 30;
        let e = |seq, docs| PageEntry {
            slice: 2,
            seq,
            lba: 0,
            byte_len: 15,
            doc_count: docs,
            crc32c: 0,
            slots: 1,
        };
        check_pages(2, &c, &[e(0, 1), e(1, 2)]).unwrap();
        let err = check_pages(2, &c, &[e(0, 1), e(0, 2)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("page 1 missing or repeated"), "{err}");
        let err = check_pages(2, &c, &[e(0, 1)]).unwrap_err().to_string();
        assert!(err.contains("1 pages found, 2 recorded"), "{err}");
        let err = check_pages(2, &c, &[e(0, 1), e(1, 1)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("2 documents"), "{err}");
    }
}
