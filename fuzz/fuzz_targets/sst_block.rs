//! The SST data block decoder: any bytes (with a valid checksum, so the
//! fuzzer gets past it) parse or are refused, never a panic; a block that
//! parses can be searched for any key.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_store::sst::RawBlock;

fuzz_target!(|data: &[u8]| {
    let (probe, body) = data.split_at(data.len().min(8));
    let mut block = body.to_vec();
    let crc = crc32c::crc32c(&block);
    block.extend_from_slice(&crc.to_le_bytes());
    if let Some(b) = RawBlock::parse(&block) {
        let _ = b.seek_point(probe, u64::MAX);
        let _ = b.seek_point(&[], 0);
        let _ = b.seek_point(&[0xFF; 16], u64::MAX);
    }
});
