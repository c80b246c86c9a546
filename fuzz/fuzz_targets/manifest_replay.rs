//! Manifest replay: a freshly formatted manifest whose first blocks the
//! fuzzer overwrites (framed so their checksums hold; records are the
//! fuzzer's). Opening returns a state or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_io::{Device, MemoryDevice};
use sluice_store::blocks::BlockDevice;
use sluice_store::fuzzing::manifest_block;
use sluice_store::manifest::Manifest;
use std::sync::Arc;

const STORE_ID: [u8; 16] = [7; 16];
const CHUNK: usize = 1 + 1024;

fuzz_target!(|data: &[u8]| {
    let mem = Arc::new(MemoryDevice::new(4096, 2048));
    let dev = BlockDevice::new(mem as Arc<dyn Device>).expect("a block device");
    let m = Manifest::create(dev.clone(), STORE_ID, 0).expect("format");
    let extent = m.superblock().manifest;
    let first_seq = m.superblock().manifest_first_seq;
    drop(m);
    for (i, chunk) in data.chunks(CHUNK).take(8).enumerate() {
        let (&keep, body) = chunk.split_first().expect("non-empty chunk");
        if keep % 4 == 0 {
            continue; // the formatted block stays
        }
        let seq = first_seq + i as u64;
        let block = manifest_block(body, seq, &STORE_ID);
        dev.write(extent.start_block + i as u64, &block)
            .expect("write to memory");
    }
    let _ = Manifest::open(dev);
});
