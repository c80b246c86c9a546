//! The store's superblock: a superblock made from any fields encodes and
//! decodes back the same; a copy with one byte changed decodes to the same
//! superblock or is refused (its checksum), never read as another.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_store::superblock::Superblock;

fn u64_from(data: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    for (i, x) in b.iter_mut().enumerate() {
        *x = data.get(at + i).copied().unwrap_or(0);
    }
    u64::from_le_bytes(b)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 40 {
        return;
    }
    let members = (data[0] as usize % 4) + 1;
    let member_blocks: Vec<u64> = (0..members).map(|k| u64_from(data, 8 + 8 * k) >> 8).collect();
    let sb = Superblock {
        generation: u64_from(data, 1),
        store_id: [data[2]; 16],
        device_blocks: member_blocks.iter().sum(),
        device_index: 0,
        device_count: members as u32,
        created_unix_ms: u64_from(data, 3),
        manifest: sluice_store::blocks::Extent { start_block: u64_from(data, 4) >> 4, block_count: u64_from(data, 5) as u32 },
        manifest_first_seq: u64_from(data, 6),
        member_blocks,
    };
    let block = sb.encode();
    assert_eq!(Superblock::decode(&block).expect("encoded, decodes"), sb);
    let at = u64_from(data, 32) as usize % block.len();
    let mut changed = block.clone();
    changed[at] ^= data[39] | 1;
    if let Ok(other) = Superblock::decode(&changed) {
        assert_eq!(other, sb, "a changed byte at {at} read as another superblock");
    }
});
