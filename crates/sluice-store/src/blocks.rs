//! Store blocks (4096 bytes) over a device of 512- or 4096-byte LBAs, and
//! the extents they are handed out in. See docs/FORMAT.md.

use crate::error::{Result, StoreError};
use sluice_io::mem::AlignedMem;
use sluice_io::Device;
use std::sync::Arc;

/// Size of a store block, whatever the device's logical block size.
pub const STORE_BLOCK_BYTES: usize = 4096;

/// A run of store blocks on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Extent {
    pub start_block: u64,
    pub block_count: u32,
}

impl Extent {
    pub const ENCODED_BYTES: usize = 16;

    pub fn end_block(&self) -> u64 {
        self.start_block + self.block_count as u64
    }

    pub fn encode(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.start_block.to_le_bytes());
        out[8..12].copy_from_slice(&self.block_count.to_le_bytes());
        out[12..16].fill(0);
    }

    pub fn decode(bytes: &[u8]) -> Self {
        Extent {
            start_block: u64::from_le_bytes(bytes[0..8].try_into().expect("8 bytes")),
            block_count: u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")),
        }
    }
}

/// A device addressed in store blocks.
#[derive(Debug, Clone)]
pub struct BlockDevice {
    device: Arc<dyn Device>,
    lbas_per_block: u64,
    block_count: u64,
}

impl BlockDevice {
    pub fn new(device: Arc<dyn Device>) -> Result<Self> {
        let g = device.geometry();
        let lba = g.block_size_bytes as usize;
        if lba > STORE_BLOCK_BYTES || STORE_BLOCK_BYTES % lba != 0 {
            return Err(StoreError::BadDevice(format!(
                "{}: logical block size {lba} does not divide the store block size {STORE_BLOCK_BYTES}",
                device.describe()
            )));
        }
        let lbas_per_block = (STORE_BLOCK_BYTES / lba) as u64;
        Ok(BlockDevice {
            block_count: g.block_count / lbas_per_block,
            device,
            lbas_per_block,
        })
    }

    pub fn block_count(&self) -> u64 {
        self.block_count
    }

    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    pub fn lba_of(&self, block: u64) -> u64 {
        block * self.lbas_per_block
    }

    /// Reads whole blocks starting at `block` into `buf` (a multiple of the
    /// block size, aligned).
    pub fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        debug_assert!(buf.len() % STORE_BLOCK_BYTES == 0);
        self.device
            .read_at(self.lba_of(block), buf)
            .map_err(|error| StoreError::Io { block, error })
    }

    pub fn write(&self, block: u64, buf: &[u8]) -> Result<()> {
        debug_assert!(buf.len() % STORE_BLOCK_BYTES == 0);
        self.device
            .write_at(self.lba_of(block), buf)
            .map_err(|error| StoreError::Io { block, error })
    }

    pub fn flush(&self) -> Result<()> {
        self.device
            .flush()
            .map_err(|error| StoreError::Io { block: 0, error })
    }
}

/// One aligned store block of memory.
pub fn block_buffer() -> AlignedMem {
    AlignedMem::new(STORE_BLOCK_BYTES)
}

/// CRC32C of a block's bytes before its trailing checksum.
pub fn block_checksum(block: &[u8]) -> u32 {
    crc32c::crc32c(&block[..STORE_BLOCK_BYTES - 4])
}

pub fn seal_block(block: &mut [u8]) {
    let crc = block_checksum(block);
    block[STORE_BLOCK_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
}

pub fn block_is_sealed(block: &[u8]) -> bool {
    let stored = u32::from_le_bytes(block[STORE_BLOCK_BYTES - 4..].try_into().expect("4 bytes"));
    stored == block_checksum(block)
}
