//! Helpers for the fuzz targets in fuzz/ (feature `fuzzing`): frame
//! arbitrary bytes as log blocks that pass their checksums, so that a
//! fuzzer reaches the record decoders behind them instead of stopping at
//! the CRC.

use crate::blocks::STORE_BLOCK_BYTES;

/// A WAL block at log sequence `seq` of a ring with `epoch`: the derived
/// header, then `body` (used length, claim, group, fragments; cut or
/// zero-padded), sealed.
pub fn wal_block(body: &[u8], seq: u64, epoch: u64) -> Vec<u8> {
    let mut b = vec![0u8; STORE_BLOCK_BYTES];
    crate::wal::frame_block(&mut b, body, seq, epoch);
    b
}

/// A manifest block at log sequence `seq` of the store `store_id`: the
/// derived header, then `body` (used length, claim, records), sealed for
/// the store.
pub fn manifest_block(body: &[u8], seq: u64, store_id: &[u8; 16]) -> Vec<u8> {
    let mut b = vec![0u8; STORE_BLOCK_BYTES];
    crate::manifest::frame_block(&mut b, body, seq, store_id);
    b
}
