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

/// One device of a set, and the store blocks it holds.
struct Member {
    device: Arc<dyn Device>,
    lbas_per_block: u64,
    /// First global store block of this device, and how many it holds.
    base_block: u64,
    block_count: u64,
    /// io_uring engines for batched reads, kept for reuse.
    engines: Mutex<Vec<Box<dyn Engine>>>,
}

/// One or more devices addressed as a single run of store blocks: device
/// k holds global blocks `base_k..base_k + blocks_k`, in order. An extent
/// never spans two devices (the allocator hands them out per device).
#[derive(Clone)]
pub struct BlockDevice {
    members: Arc<Vec<Member>>,
    block_count: u64,
}

impl std::fmt::Debug for BlockDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.members.iter().map(|m| m.device.describe()).collect();
        write!(f, "BlockDevice({})", names.join(", "))
    }
}

/// Engines kept for batched reads per device; more concurrent batches open
/// and drop their own.
const MAX_IDLE_ENGINES: usize = 8;
/// Reads one batch may hold.
const MAX_BATCH_READS: usize = 64;
/// Devices one store may span.
pub const MAX_DEVICES: usize = 64;

fn lbas_per_block(device: &Arc<dyn Device>) -> Result<u64> {
    let lba = device.geometry().block_size_bytes as usize;
    if lba > STORE_BLOCK_BYTES || STORE_BLOCK_BYTES % lba != 0 {
        return Err(StoreError::BadDevice(format!(
            "{}: logical block size {lba} does not divide the store block size {STORE_BLOCK_BYTES}",
            device.describe()
        )));
    }
    Ok((STORE_BLOCK_BYTES / lba) as u64)
}

/// Store blocks a device holds.
pub fn device_store_blocks(device: &Arc<dyn Device>) -> Result<u64> {
    Ok(device.geometry().block_count / lbas_per_block(device)?)
}

impl BlockDevice {
    /// One device, all of it.
    pub fn new(device: Arc<dyn Device>) -> Result<Self> {
        let blocks = device_store_blocks(&device)?;
        Self::set(vec![(device, blocks)])
    }

    /// Devices in order, each with the store blocks of it to use (at most
    /// what it holds).
    pub fn set(devices: Vec<(Arc<dyn Device>, u64)>) -> Result<Self> {
        if devices.is_empty() || devices.len() > MAX_DEVICES {
            return Err(StoreError::BadDevice(format!(
                "a store spans 1 to {MAX_DEVICES} devices, not {}",
                devices.len()
            )));
        }
        let mut members = Vec::with_capacity(devices.len());
        let mut base_block = 0;
        for (device, block_count) in devices {
            let holds = device_store_blocks(&device)?;
            if block_count > holds {
                return Err(StoreError::BadDevice(format!(
                    "{} holds {holds} store blocks but the store uses {block_count} of it",
                    device.describe()
                )));
            }
            members.push(Member {
                lbas_per_block: lbas_per_block(&device)?,
                device,
                base_block,
                block_count,
                engines: Mutex::new(Vec::new()),
            });
            base_block += block_count;
        }
        Ok(BlockDevice {
            members: Arc::new(members),
            block_count: base_block,
        })
    }

    /// Global store blocks over all devices.
    pub fn block_count(&self) -> u64 {
        self.block_count
    }

    /// The first device (the one with the superblock).
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.members[0].device
    }

    pub fn device_count(&self) -> usize {
        self.members.len()
    }

    /// Device `k` and the global blocks `[first, end)` it holds.
    pub fn member(&self, k: usize) -> (&Arc<dyn Device>, u64, u64) {
        let m = &self.members[k];
        (&m.device, m.base_block, m.base_block + m.block_count)
    }

    /// Which device holds global block `block`.
    pub fn member_of(&self, block: u64) -> usize {
        self.members
            .partition_point(|m| m.base_block + m.block_count <= block)
            .min(self.members.len() - 1)
    }

    /// The LBA of `block` on the device that holds it.
    pub fn lba_of(&self, block: u64) -> u64 {
        let m = &self.members[self.member_of(block)];
        (block - m.base_block) * m.lbas_per_block
    }

    /// The device holding `blocks` store blocks from `block`, and the LBA
    /// there; an I/O may not cross from one device to the next.
    fn locate(&self, block: u64, bytes: usize) -> Result<(&Member, u64)> {
        let m = &self.members[self.member_of(block)];
        let blocks = bytes.div_ceil(STORE_BLOCK_BYTES) as u64;
        if block < m.base_block || block + blocks > m.base_block + m.block_count {
            return Err(StoreError::BadExtent {
                start_block: block,
                block_count: blocks as u32,
                problem: "crosses the end of its device",
            });
        }
        Ok((m, (block - m.base_block) * m.lbas_per_block))
    }

    /// Reads whole blocks starting at `block` into `buf` (a multiple of the
    /// block size, aligned).
    pub fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        debug_assert!(buf.len() % STORE_BLOCK_BYTES == 0);
        let (m, lba) = self.locate(block, buf.len())?;
        m.device
            .read_at(lba, buf)
            .map_err(|error| StoreError::Io { block, error })
    }

    pub fn write(&self, block: u64, buf: &[u8]) -> Result<()> {
        debug_assert!(buf.len() % STORE_BLOCK_BYTES == 0);
        let (m, lba) = self.locate(block, buf.len())?;
        m.device
            .write_at(lba, buf)
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
    /// index, bytes)` as it completes, straight from the I/O buffer. Runs
    /// on different devices go to each device's engine before any is
    /// waited for.
    pub fn visit_runs(
        &self,
        runs: &[(u64, usize)],
        visit: &mut dyn FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let batched = runs.len() > 1 && self.members.iter().all(|m| m.device.raw_fd().is_some());
        if !batched {
            for (i, &(b, n)) in runs.iter().enumerate() {
                visit(i, &self.read_vec(b, n)?)?;
            }
            return Ok(());
        }
        let all: Vec<usize> = (0..runs.len()).collect();
        for batch in all.chunks(MAX_BATCH_READS) {
            let mut engines: Vec<(usize, Box<dyn Engine>, usize)> = Vec::new();
            let result = self.submit_batch(runs, batch, &mut engines).and_then(|()| {
                for (_, engine, submitted) in &mut engines {
                    reap_all(engine.as_mut(), *submitted, runs, visit)?;
                }
                Ok(())
            });
            for (k, engine, _) in engines {
                let mut idle = self.members[k]
                    .engines
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                if idle.len() < MAX_IDLE_ENGINES && engine.in_flight() == 0 {
                    idle.push(engine);
                }
            }
            result?;
        }
        Ok(())
    }

    /// Submits the runs `batch` names, each to its device's engine (taken
    /// into `engines` with how many it was given).
    fn submit_batch(
        &self,
        runs: &[(u64, usize)],
        batch: &[usize],
        engines: &mut Vec<(usize, Box<dyn Engine>, usize)>,
    ) -> Result<()> {
        for &i in batch {
            let (block, blocks) = runs[i];
            let (m, lba) = self.locate(block, blocks * STORE_BLOCK_BYTES)?;
            let k = self.member_of(block);
            let at = match engines.iter().position(|(e, _, _)| *e == k) {
                Some(at) => at,
                None => {
                    engines.push((k, self.take_engine(m, block)?, 0));
                    engines.len() - 1
                }
            };
            let engine = &mut engines[at].1;
            let buf = engine
                .pool()
                .alloc(blocks * STORE_BLOCK_BYTES, Direction::Read)
                .map_err(|error| StoreError::Io { block, error })?;
            engine
                .submit(Request::read(lba, buf, i as u64))
                .map_err(|r| StoreError::Io {
                    block,
                    error: r.error,
                })?;
            engines[at].2 += 1;
        }
        Ok(())
    }

    fn take_engine(&self, m: &Member, block: u64) -> Result<Box<dyn Engine>> {
        if let Some(e) = m.engines.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(e);
        }
        let mut cfg = EngineConfig {
            kind: EngineKind::Uring,
            queue_depth: MAX_BATCH_READS,
            // Engines move between reader threads.
            defer_taskrun: false,
            ..EngineConfig::default()
        };
        cfg.pool.max_pinned_bytes = 64 << 20;
        open_engine(m.device.clone(), &cfg).map_err(|error| StoreError::Io { block, error })
    }

    fn read_vec(&self, block: u64, blocks: usize) -> Result<Vec<u8>> {
        let mut buf = AlignedMem::new(blocks * STORE_BLOCK_BYTES);
        self.read(block, buf.as_mut_slice())?;
        Ok(buf.as_slice().to_vec())
    }

    /// Makes the completed writes of the device holding `block` durable
    /// (the WAL and manifest live on one device; no need to flush all).
    pub fn flush_holding(&self, block: u64) -> Result<()> {
        let m = &self.members[self.member_of(block)];
        m.device
            .flush()
            .map_err(|error| StoreError::Io { block, error })
    }

    /// Makes every device's completed writes durable.
    pub fn flush(&self) -> Result<()> {
        for m in self.members.iter() {
            m.device.flush().map_err(|error| StoreError::Io {
                block: m.base_block,
                error,
            })?;
        }
        Ok(())
    }
}

/// Waits for `submitted` reads on `engine` and hands each to `visit`.
fn reap_all(
    engine: &mut dyn Engine,
    submitted: usize,
    runs: &[(u64, usize)],
    visit: &mut dyn FnMut(usize, &[u8]) -> Result<()>,
) -> Result<()> {
    let mut done = Vec::with_capacity(submitted);
    let mut seen = 0;
    while seen < submitted {
        done.clear();
        engine
            .reap(submitted - seen, &mut done)
            .map_err(|error| StoreError::Io {
                block: runs[0].0,
                error,
            })?;
        for c in done.drain(..) {
            seen += 1;
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

/// Seals a block with a checksum seeded by its store's id: a block that
/// an earlier store left on the device (formatted over) never passes for
/// one of this store's, even where its sequence number would fit.
pub fn seal_block_for(block: &mut [u8], store_id: &[u8; 16]) {
    let crc = crc32c::crc32c_append(crc32c::crc32c(store_id), &block[..STORE_BLOCK_BYTES - 4]);
    block[STORE_BLOCK_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
}

pub fn block_is_sealed_for(block: &[u8], store_id: &[u8; 16]) -> bool {
    block.len() == STORE_BLOCK_BYTES
        && crc32c::crc32c_append(crc32c::crc32c(store_id), &block[..STORE_BLOCK_BYTES - 4])
            == u32::from_le_bytes(block[STORE_BLOCK_BYTES - 4..].try_into().expect("4 bytes"))
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
