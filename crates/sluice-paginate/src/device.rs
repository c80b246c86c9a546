//! Synchronous block I/O through a sluice-io engine (io_uring with fixed
//! buffers where the kernel has it): what the exporter and the layout reader
//! need. The deep-queue read path lives in [`crate::read`].

use crate::error::{Error, Result};
use sluice_io::{
    open_engine, Device, Direction, Engine, EngineConfig, OnExhausted, PoolConfig, Request,
};
use std::sync::{Arc, Mutex};

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

pub fn engine_config(queue_depth: usize, max_pinned_bytes: u64) -> EngineConfig {
    EngineConfig {
        queue_depth,
        pool: page_pool_config(max_pinned_bytes),
        ..EngineConfig::default()
    }
}

/// One engine used from one thread at a time.
pub struct DeviceIo {
    engine: Mutex<Box<dyn Engine>>,
    block_size_bytes: usize,
}

impl DeviceIo {
    pub fn open(
        device: Arc<dyn Device>,
        queue_depth: usize,
        max_pinned_bytes: u64,
    ) -> Result<Self> {
        let block_size_bytes = device.geometry().block_size_bytes as usize;
        let engine = open_engine(device, &engine_config(queue_depth, max_pinned_bytes))?;
        Ok(DeviceIo {
            engine: Mutex::new(engine),
            block_size_bytes,
        })
    }

    pub fn block_size_bytes(&self) -> usize {
        self.block_size_bytes
    }

    /// Writes whole blocks.
    pub fn write(&self, lba: u64, data: &[u8]) -> Result<()> {
        debug_assert_eq!(data.len() % self.block_size_bytes, 0);
        let mut engine = self.engine.lock().expect("engine lock");
        let mut buf = engine.pool().alloc(data.len(), Direction::Write)?;
        buf.write_at(0, data);
        let done = engine.run(Request::write(lba, buf, 0));
        check_done(done.result, data.len(), "write", lba)
    }

    pub fn flush(&self) -> Result<()> {
        let mut engine = self.engine.lock().expect("engine lock");
        engine.run(Request::flush(0)).result?;
        Ok(())
    }

    /// Reads `len_bytes` (whole blocks) at `lba`.
    pub fn read(&self, lba: u64, len_bytes: usize) -> Result<Vec<u8>> {
        let mut engine = self.engine.lock().expect("engine lock");
        let buf = engine.pool().alloc(len_bytes, Direction::Read)?;
        let done = engine.run(Request::read(lba, buf, 0));
        check_done(done.result, len_bytes, "read", lba)?;
        Ok(done.buf.expect("a read hands its buffer back").to_vec())
    }
}

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

pub fn read_block(io: &DeviceIo, lba: u64) -> Result<Vec<u8>> {
    io.read(lba, io.block_size_bytes())
}

/// Writes `data` at `lba`, padded with `pad` to whole blocks, in one I/O.
pub fn write_padded(io: &DeviceIo, lba: u64, data: &[u8], pad: u8) -> Result<()> {
    let bs = io.block_size_bytes();
    let len = data.len().div_ceil(bs).max(1) * bs;
    let mut engine = io.engine.lock().expect("engine lock");
    let mut buf = engine.pool().alloc(len, Direction::Write)?;
    buf.write_at(0, data);
    if len > data.len() {
        buf.write_at(data.len(), &vec![pad; len - data.len()]);
    }
    let done = engine.run(Request::write(lba, buf, 0));
    check_done(done.result, len, "page write", lba)
}
