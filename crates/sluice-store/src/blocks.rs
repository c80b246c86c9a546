//! Store blocks (4096 bytes) over a device of 512- or 4096-byte LBAs, and
//! the extents they are handed out in. See docs/FORMAT.md.

use crate::error::{Result, StoreError};
use sluice_io::engine::{open_engine, Engine, EngineConfig, EngineKind, Request};
use sluice_io::mem::AlignedMem;
use sluice_io::pool::Direction;
use sluice_io::Device;
use std::sync::{Arc, Mutex};

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
#[derive(Clone)]
pub struct BlockDevice {
    device: Arc<dyn Device>,
    lbas_per_block: u64,
    block_count: u64,
    /// io_uring engines for batched reads, kept for reuse.
    engines: Arc<Mutex<Vec<Box<dyn Engine>>>>,
}

impl std::fmt::Debug for BlockDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlockDevice({})", self.device.describe())
    }
}

/// Engines kept for batched reads; more concurrent batches open and drop
/// their own.
const MAX_IDLE_ENGINES: usize = 8;
/// Reads one batch may hold.
const MAX_BATCH_READS: usize = 64;

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
            engines: Arc::new(Mutex::new(Vec::new())),
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

    /// Reads several runs `(first block, blocks)` at once: submitted
    /// together through io_uring, so they cost about one device latency
    /// instead of one each. Devices without a descriptor read in turn.
    pub fn read_runs(&self, runs: &[(u64, usize)]) -> Result<Vec<Vec<u8>>> {
        let mut out = vec![Vec::new(); runs.len()];
        self.visit_runs(runs, &mut |i, bytes| {
            out[i] = bytes.to_vec();
            Ok(())
        })?;
        Ok(out)
    }

    /// [`BlockDevice::read_runs`] handing each run's bytes to `visit(run
    /// index, bytes)` as it completes, straight from the I/O buffer.
    pub fn visit_runs(
        &self,
        runs: &[(u64, usize)],
        visit: &mut dyn FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<()> {
        if runs.len() <= 1 || self.device.raw_fd().is_none() {
            for (i, &(b, n)) in runs.iter().enumerate() {
                visit(i, &self.read_vec(b, n)?)?;
            }
            return Ok(());
        }
        let mut engine = match self.engines.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            Some(e) => e,
            None => {
                let mut cfg = EngineConfig {
                    kind: EngineKind::Uring,
                    queue_depth: MAX_BATCH_READS,
                    // Engines move between reader threads.
                    defer_taskrun: false,
                    ..EngineConfig::default()
                };
                cfg.pool.max_pinned_bytes = 64 << 20;
                open_engine(self.device.clone(), &cfg).map_err(|error| StoreError::Io {
                    block: runs[0].0,
                    error,
                })?
            }
        };
        let result = self.read_runs_with(engine.as_mut(), runs, visit);
        let mut idle = self.engines.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE_ENGINES && engine.in_flight() == 0 {
            idle.push(engine);
        }
        result
    }

    fn read_runs_with(
        &self,
        engine: &mut dyn Engine,
        runs: &[(u64, usize)],
        visit: &mut dyn FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<()> {
        for batch in (0..runs.len()).collect::<Vec<_>>().chunks(MAX_BATCH_READS) {
            for &i in batch {
                let (block, blocks) = runs[i];
                let buf = engine
                    .pool()
                    .alloc(blocks * STORE_BLOCK_BYTES, Direction::Read)
                    .map_err(|error| StoreError::Io { block, error })?;
                engine
                    .submit(Request::read(self.lba_of(block), buf, i as u64))
                    .map_err(|r| StoreError::Io {
                        block,
                        error: r.error,
                    })?;
            }
            let mut done = Vec::with_capacity(batch.len());
            while done.len() < batch.len() {
                engine
                    .reap(batch.len() - done.len(), &mut done)
                    .map_err(|error| StoreError::Io {
                        block: runs[batch[0]].0,
                        error,
                    })?;
            }
            for c in done {
                let i = c.user_data as usize;
                c.result.map_err(|error| StoreError::Io {
                    block: runs[i].0,
                    error,
                })?;
                let buf = c.buf.expect("a read returns its buffer");
                match buf.as_slice() {
                    Some(bytes) => visit(i, bytes)?,
                    None => visit(i, &buf.to_vec())?,
                }
            }
        }
        Ok(())
    }

    fn read_vec(&self, block: u64, blocks: usize) -> Result<Vec<u8>> {
        let mut buf = AlignedMem::new(blocks * STORE_BLOCK_BYTES);
        self.read(block, buf.as_mut_slice())?;
        Ok(buf.as_slice().to_vec())
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
    block.len() == STORE_BLOCK_BYTES && trailing_crc_ok(block)
}

/// Whether the last 4 bytes of `bytes` are the CRC32C of the rest.
pub fn trailing_crc_ok(bytes: &[u8]) -> bool {
    let Some(split) = bytes.len().checked_sub(4) else {
        return false;
    };
    let stored = u32::from_le_bytes(bytes[split..].try_into().expect("4 bytes"));
    crc32c::crc32c(&bytes[..split]) == stored
}
