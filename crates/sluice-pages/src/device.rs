//! Synchronous block I/O through a sluice-io engine (io_uring with fixed
//! buffers where the kernel has it): what the exporter and the layout reader
//! need. The deep-queue read path lives in [`crate::read`].

use crate::error::{Error, Result};
use sluice_io::{Device, EngineConfig, OnExhausted, PoolConfig, Priority};
use std::sync::Arc;

/// Pool settings for page buffers: contiguous buffers only (a page is parsed
/// in place), pinned memory capped at `max_pinned_bytes`.
pub fn page_pool_config(max_pinned_bytes: u64) -> PoolConfig {
    let base = PoolConfig::default();
    PoolConfig {
        max_pinned_bytes: max_pinned_bytes
            .max(base.small_tier_bytes() + base.chunk_size_bytes as u64),
        max_segments: 1,
        on_exhausted: OnExhausted::Wait { timeout_ms: 60_000 },
        ..base
    }
}

/// The engine configuration of an export device: `queue_depth` requests in flight, pinned memory bounded by `max_pinned_bytes`.
pub fn engine_config(queue_depth: usize, max_pinned_bytes: u64) -> EngineConfig {
    EngineConfig {
        queue_depth,
        pool: page_pool_config(max_pinned_bytes),
        ..EngineConfig::default()
    }
}

/// An engine of its own for one slice's writer: `queue_depth` 4 (a page,
/// its manifest block and the flush), pinned memory bounded by
/// `max_pinned_bytes`, medium chunks sized so that two pages of
/// `usual_page_bytes` fit one (a page the fetcher builds in the pool is
/// then served from a chunk kept registered, not pinned afresh).
pub fn writer_engine(
    device: Arc<dyn Device>,
    max_pinned_bytes: u64,
    usual_page_bytes: u64,
) -> Result<Box<dyn sluice_io::Engine>> {
    let mut config = engine_config(4, max_pinned_bytes);
    let chunk = (2 * usual_page_bytes)
        .next_power_of_two()
        .clamp(4 << 20, 64 << 20);
    config.pool.chunk_size_bytes = chunk as usize;
    config.pool.max_pinned_bytes = config
        .pool
        .max_pinned_bytes
        .max(config.pool.small_tier_bytes() + chunk);
    // Every request goes in with the wait for it: one system call per page.
    config.submit_batch = config.queue_depth;
    Ok(sluice_io::open_engine(device, &config)?)
}

/// The exporter's blocking I/O: sluice-io's [`sluice_io::DeviceIo`] (engines
/// leased per call from any thread), with this crate's errors.
pub struct DeviceIo {
    io: sluice_io::DeviceIo,
}

impl DeviceIo {
    /// Opens blocking I/O on `device` (the first engine at once, so a refused setting is reported here).
    pub fn open(
        device: Arc<dyn Device>,
        queue_depth: usize,
        max_pinned_bytes: u64,
    ) -> Result<Self> {
        let io = sluice_io::DeviceIo::open(device, engine_config(queue_depth, max_pinned_bytes))?;
        Ok(DeviceIo { io })
    }

    /// The device's logical block size.
    pub fn block_size_bytes(&self) -> usize {
        self.io.block_size_bytes()
    }

    /// Writes whole blocks.
    pub fn write(&self, lba: u64, data: &[u8]) -> Result<()> {
        debug_assert_eq!(data.len() % self.block_size_bytes(), 0);
        Ok(self.io.write(lba, data, Priority::High)?)
    }

    /// Writes whole blocks and makes them durable, in one submission.
    pub fn write_durable(&self, lba: u64, data: &[u8]) -> Result<()> {
        debug_assert_eq!(data.len() % self.block_size_bytes(), 0);
        Ok(self.io.write_durable(&[(lba, data)], Priority::High)?)
    }

    /// Makes every completed write durable.
    pub fn flush(&self) -> Result<()> {
        Ok(self.io.flush(Priority::High)?)
    }

    /// Reads `len_bytes` (whole blocks) at `lba`.
    pub fn read(&self, lba: u64, len_bytes: usize) -> Result<Vec<u8>> {
        let mut out = vec![0u8; len_bytes];
        self.io.read(lba, &mut out, Priority::High)?;
        Ok(out)
    }
}

/// Checks that an I/O moved `expected` bytes; a short one is an error naming `what` and `lba`.
pub fn check_done(
    result: sluice_io::Result<usize>,
    expected: usize,
    what: &str,
    lba: u64,
) -> Result<()> {
    let n = result?;
    if n != expected {
        return Err(Error::Format(format!(
            "short {what} at LBA {lba}: {n} of {expected} bytes"
        )));
    }
    Ok(())
}

/// Reads the one block at `lba`.
pub fn read_block(io: &DeviceIo, lba: u64) -> Result<Vec<u8>> {
    io.read(lba, io.block_size_bytes())
}
