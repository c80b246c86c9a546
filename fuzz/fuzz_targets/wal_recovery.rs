//! WAL recovery over a ring of 8 blocks whose contents the fuzzer picks:
//! each block is left empty, written raw, or framed so its checksum holds
//! (header and fragments are the fuzzer's). Recovery in every mode returns
//! records or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_io::{Device, MemoryDevice};
use sluice_store::blocks::{BlockDevice, Extent, STORE_BLOCK_BYTES};
use sluice_store::fuzzing::wal_block;
use sluice_store::wal::{recover, WalLayout, WalRecovery};
use std::sync::Arc;

const RING_BLOCKS: u32 = 8;
const EPOCH: u64 = 0x5eed;
/// Each block's share of the input: a kind byte and a body.
const CHUNK: usize = 1 + 512;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mem = Arc::new(MemoryDevice::new(4096, RING_BLOCKS as u64 + 4));
    let dev = BlockDevice::new(mem as Arc<dyn Device>).expect("a block device");
    for (i, chunk) in rest.chunks(CHUNK).take(RING_BLOCKS as usize).enumerate() {
        let (&kind, body) = chunk.split_first().expect("non-empty chunk");
        let block = match kind % 3 {
            0 => continue,
            1 => {
                let mut b = vec![0u8; STORE_BLOCK_BYTES];
                b[..body.len()].copy_from_slice(body);
                b
            }
            _ => wal_block(body, i as u64, EPOCH),
        };
        dev.write(i as u64, &block).expect("write to memory");
    }
    let layout = WalLayout {
        ring: vec![Extent {
            start_block: 0,
            block_count: RING_BLOCKS,
        }],
        epoch: EPOCH,
    };
    let mode = match mode % 3 {
        0 => WalRecovery::Strict,
        1 => WalRecovery::PointInTime,
        _ => WalRecovery::SkipDamaged,
    };
    let _ = recover(&dev, &layout, 0, mode);
});
