//! A table's footer, index, filter and range tombstones as the store opens
//! them: any bytes in a table's extent (the footer sealed, and each region
//! the footer describes sealed too, so the fuzzer gets past their
//! checksums) open or are refused as corruption, never a panic or an
//! allocation the extent does not justify; a table that opens answers a
//! point read, a range and a full walk, each Ok or Err.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_io::{Device, MemoryDevice};
use sluice_store::blocks::{BlockDevice, Extent, STORE_BLOCK_BYTES};
use sluice_store::sst::{TablePlace, TableReader};
use std::sync::{Arc, OnceLock};

const MOST_BLOCKS: usize = 16;

fn device() -> &'static BlockDevice {
    static DEV: OnceLock<BlockDevice> = OnceLock::new();
    DEV.get_or_init(|| {
        BlockDevice::new(Arc::new(MemoryDevice::new(4096, 64)) as Arc<dyn Device>).unwrap()
    })
}

fn seal_tail(bytes: &mut [u8]) {
    let n = bytes.len();
    let crc = crc32c::crc32c(&bytes[..n - 4]);
    bytes[n - 4..].copy_from_slice(&crc.to_le_bytes());
}

fn u32_at(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let blocks = 1 + first as usize % MOST_BLOCKS;
    let mut bytes = vec![0u8; blocks * STORE_BLOCK_BYTES];
    let n = rest.len().min(bytes.len());
    bytes[..n].copy_from_slice(&rest[..n]);
    let footer_at = bytes.len() - STORE_BLOCK_BYTES;
    let total = bytes.len();
    bytes[total - 12..total - 4].copy_from_slice(b"SLSTFOOT");
    // Each region the footer names, if it lies in the extent: its last 8
    // bytes are `u32 payload length` (kept) and its checksum (made right).
    for r in 0..3 {
        let (off, len) = (u32_at(&bytes, footer_at + r * 8), u32_at(&bytes, footer_at + r * 8 + 4));
        if len > 0 && off < blocks && off + len < blocks {
            let region = &mut bytes[off * STORE_BLOCK_BYTES..(off + len) * STORE_BLOCK_BYTES];
            seal_tail(region);
        }
    }
    seal_tail(&mut bytes[footer_at..]);
    let dev = device();
    let mut aligned = sluice_io::mem::AlignedMem::new(bytes.len());
    aligned.as_mut_slice().copy_from_slice(&bytes);
    dev.write(0, aligned.as_slice()).unwrap();
    // The memory device keeps unflushed writes: one flush per input.
    dev.flush().unwrap();
    let extent = Extent {
        start_block: 0,
        block_count: blocks as u32,
    };
    let place = TablePlace {
        keyspace: "fuzz",
        file_no: 1,
    };
    let Ok(reader) = TableReader::open(dev, extent, place) else {
        return;
    };
    let _ = reader.get(dev, b"k", u64::MAX);
    let _ = reader.range(dev, b"", None);
    if let Ok(all) = reader.entries(dev) {
        assert!(all.len() <= blocks * STORE_BLOCK_BYTES, "more entries than bytes");
    }
});
