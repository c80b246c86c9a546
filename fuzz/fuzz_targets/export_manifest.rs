//! The export device's header, slice checkpoints and manifest blocks (both
//! formats): any block (with the right magic and valid checksums, so the
//! fuzzer gets past them) decodes or is refused, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_paginate::format::{
    Checkpoint, Header, ManifestBlock, CHECKPOINT_MAGIC, HEADER_MAGIC, MANIFEST_MAGIC,
    MANIFEST_MAGIC_V1,
};

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let size = if pick & 0x80 != 0 { 4096 } else { 512 };
    let magic = match pick % 4 {
        0 => HEADER_MAGIC,
        1 => CHECKPOINT_MAGIC,
        2 => MANIFEST_MAGIC,
        _ => MANIFEST_MAGIC_V1,
    };
    let mut block = vec![0u8; size];
    block[..8].copy_from_slice(magic);
    let n = body.len().min(size - 12);
    block[8..8 + n].copy_from_slice(&body[..n]);
    if pick % 4 == 2 {
        // Format 2 checks its header by the CRC32C at byte 60.
        let crc = crc32c::crc32c(&block[..60]);
        block[60..64].copy_from_slice(&crc.to_le_bytes());
    }
    let crc = crc32c::crc32c(&block[..size - 4]);
    block[size - 4..].copy_from_slice(&crc.to_le_bytes());
    match pick % 4 {
        0 => drop(Header::decode(&block, 0)),
        1 => drop(Checkpoint::decode(&block, 0)),
        _ => drop(ManifestBlock::decode(&block, 0)),
    }
});
