//! Store blocks (4096 bytes) over a device of 512- or 4096-byte LBAs, and
//! the extents they are handed out in. See docs/FORMAT.md.

use crate::error::{Result, StoreError};
use sluice_io::engine::{Engine, EngineConfig, EngineKind, Priority, Request};
use sluice_io::mem::AlignedMem;
use sluice_io::pool::Direction;
use sluice_io::{Device, DeviceIo};
use std::cell::Cell;
use std::sync::Arc;

thread_local! {
    static IO_PRIORITY: Cell<Priority> = const { Cell::new(Priority::High) };
}

/// Runs `f` with every store I/O of this thread at `priority` (in the
/// engine's gate and as the kernel's ioprio): the background thread's
/// memtable flushes and compactions run at [`Priority::Low`]; log writes and
/// foreground reads stay at the default, high.
pub fn with_io_priority<T>(priority: Priority, f: impl FnOnce() -> T) -> T {
    let before = IO_PRIORITY.with(|p| p.replace(priority));
    struct Restore(Priority);
    impl Drop for Restore {
        fn drop(&mut self) {
            IO_PRIORITY.with(|p| p.set(self.0));
        }
    }
    let _restore = Restore(before);
    f()
}

/// The priority this thread's store I/O carries now.
pub fn io_priority() -> Priority {
    IO_PRIORITY.with(Cell::get)
}

/// Size of a store block, whatever the device's logical block size.
pub const STORE_BLOCK_BYTES: usize = 4096;

/// A run of store blocks on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Extent {
    /// First store block.
    pub start_block: u64,
    /// Store blocks it spans.
    pub block_count: u32,
}

impl Extent {
    /// Bytes of its encoding: start, count, four zero bytes.
    pub const ENCODED_BYTES: usize = 16;

    /// The block after its last.
    pub fn end_block(&self) -> u64 {
        self.start_block + self.block_count as u64
    }

    /// Writes its encoding into `out[..ENCODED_BYTES]`.
    pub fn encode(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.start_block.to_le_bytes());
        out[8..12].copy_from_slice(&self.block_count.to_le_bytes());
        out[12..16].fill(0);
    }

    /// The extent `encode` wrote; None if `bytes` is too short.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        Some(Extent {
            start_block: sluice_io::codec::u64_at(bytes, 0)?,
            block_count: sluice_io::codec::u32_at(bytes, 8)?,
        })
    }
}

/// Store blocks being read ahead: see [`BlockDevice::start_read`].
#[derive(Debug)]
pub struct PendingBlocks {
    block: u64,
    read: sluice_io::PendingRead,
}

impl PendingBlocks {
    /// Waits for the blocks and hands them to `visit`, straight from the
    /// I/O buffer where the read was one request.
    pub fn finish<R>(self, visit: impl FnOnce(&[u8]) -> R) -> Result<R> {
        let block = self.block;
        self.read
            .finish(visit)
            .map_err(|error| StoreError::Io { block, error })
    }

    /// Waits for the blocks and returns them owned: the I/O buffer itself
    /// where the read was one contiguous request.
    pub fn finish_owned(self) -> Result<sluice_io::ReadBytes> {
        let block = self.block;
        self.read
            .finish_owned()
            .map_err(|error| StoreError::Io { block, error })
    }
}

/// One device of a set, and the store blocks it holds.
struct Member {
    device: Arc<dyn Device>,
    /// Every I/O of this device goes through here.
    io: Arc<DeviceIo>,
    lbas_per_block: u64,
    /// First global store block of this device, and how many it holds.
    base_block: u64,
    block_count: u64,
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

/// Engines kept idle per device; more concurrent callers open and drop
/// their own.
const MAX_IDLE_ENGINES: usize = 8;
/// Pinned memory one engine of the store may hold.
const ENGINE_PINNED_BYTES: u64 = 64 << 20;
/// Reads one batch may hold.
const MAX_BATCH_READS: usize = 64;
/// Devices one store may span.
pub const MAX_DEVICES: usize = 64;

fn lbas_per_block(device: &Arc<dyn Device>) -> Result<u64> {
    let lba = device.geometry().block_size_bytes as usize;
    if lba > STORE_BLOCK_BYTES || !STORE_BLOCK_BYTES.is_multiple_of(lba) {
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
            let io = DeviceIo::with_idle(device.clone(), engine_config(), MAX_IDLE_ENGINES)
                .map_err(|error| StoreError::Io {
                    block: base_block,
                    error,
                })?;
            let io = Arc::new(io);
            members.push(Member {
                lbas_per_block: lbas_per_block(&device)?,
                device,
                io,
                base_block,
                block_count,
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

    /// Devices of the set.
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

    /// The device of the set holding `blocks` store blocks from `block`
    /// (its place in the set), and the LBA there.
    pub(crate) fn place(&self, block: u64, blocks: usize) -> Result<(usize, u64)> {
        let (_, lba) = self.locate(block, blocks * STORE_BLOCK_BYTES)?;
        Ok((self.member_of(block), lba))
    }

    /// Reads whole blocks starting at `block` into `buf` (a multiple of the
    /// block size), at this thread's I/O priority.
    pub fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        debug_assert!(buf.len().is_multiple_of(STORE_BLOCK_BYTES));
        let (m, lba) = self.locate(block, buf.len())?;
        m.io.read(lba, buf, io_priority())
            .map_err(|error| StoreError::Io { block, error })
    }

    /// Starts reading `blocks` store blocks from `block` and returns at
    /// once (read-ahead): [`PendingBlocks::finish`] waits for them.
    pub fn start_read(&self, block: u64, blocks: usize) -> Result<PendingBlocks> {
        let (m, lba) = self.locate(block, blocks * STORE_BLOCK_BYTES)?;
        let read =
            m.io.start_read(lba, blocks * STORE_BLOCK_BYTES, io_priority())
                .map_err(|error| StoreError::Io { block, error })?;
        Ok(PendingBlocks { block, read })
    }

    /// Writes whole blocks from `block`; returns once the device has them,
    /// not yet durable.
    pub fn write(&self, block: u64, buf: &[u8]) -> Result<()> {
        debug_assert!(buf.len().is_multiple_of(STORE_BLOCK_BYTES));
        let (m, lba) = self.locate(block, buf.len())?;
        m.io.write(lba, buf, io_priority())
            .map_err(|error| StoreError::Io { block, error })
    }

    /// An engine of its own on the device holding `block` for a thread
    /// that polls it between other work (a server worker's fill queue): a
    /// single-issuer ring whose kernel flags pending completions, so a
    /// poll enters the kernel only when there is something to take in
    /// (Linux 6.1; falls back as the engine says).
    pub fn own_polled_engine(&self, block: u64) -> Result<Box<dyn Engine>> {
        let (m, _) = self.locate(block, STORE_BLOCK_BYTES)?;
        let mut config = m.io.config().clone();
        config.defer_taskrun = true;
        // The flag is asked for with a spin wait; this engine's owner
        // reaps without waiting, so the spin never runs.
        config.spin_wait_us = config.spin_wait_us.max(1);
        sluice_io::open_engine(m.device.clone(), &config)
            .map_err(|error| StoreError::Io { block, error })
    }

    /// An engine of its own on the device holding `block`, for a caller
    /// that keeps writes in flight across calls (the WAL's early writes),
    /// with the LBA of `block` there.
    /// With `sqpoll_idle_ms`, a SQPOLL ring whose reaps poll completions:
    /// its I/O makes no system call while the kernel thread is awake.
    pub fn own_engine(&self, block: u64, sqpoll_idle_ms: Option<u32>) -> Result<Box<dyn Engine>> {
        let (m, _) = self.locate(block, STORE_BLOCK_BYTES)?;
        let mut config = m.io.config().clone();
        if sqpoll_idle_ms.is_some() {
            config.sqpoll_idle_ms = sqpoll_idle_ms;
            config.poll_completions = true;
            config.submit_batch = 0;
        }
        sluice_io::open_engine(m.device.clone(), &config)
            .map_err(|error| StoreError::Io { block, error })
    }

    /// Writes each `(first block, bytes)` run, all submitted together (one
    /// `io_uring_enter`, or none on a polling SQPOLL ring), on a caller's
    /// own engine (idle when called; see [`BlockDevice::own_engine`]).
    /// With `durable` they are made durable too; without, the call returns
    /// once the device has them (in its volatile cache, if it has one: they
    /// survive the process, not a power cut). Every run lies on the device
    /// holding the first.
    pub fn write_runs_on(
        &self,
        engine: &mut dyn Engine,
        runs: &[(u64, &[u8])],
        durable: bool,
    ) -> Result<()> {
        let Some(&(first, _)) = runs.first() else {
            return Ok(());
        };
        let k = self.member_of(first);
        let mut writes = Vec::with_capacity(runs.len());
        for &(block, bytes) in runs {
            assert_eq!(
                self.member_of(block),
                k,
                "one durable write spans one device"
            );
            let (_, lba) = self.locate(block, bytes.len())?;
            writes.push((lba, bytes, bytes.len()));
        }
        let how = durable.then(|| self.members[k].io.durable_writes());
        sluice_io::write_runs_on(engine, &writes, 0, io_priority(), how).map_err(|error| {
            StoreError::Io {
                block: first,
                error,
            }
        })
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
        let batched = runs.len() > 1;
        if !batched {
            for (i, &(b, n)) in runs.iter().enumerate() {
                visit(i, &self.read_vec(b, n)?)?;
            }
            return Ok(());
        }
        let all: Vec<usize> = (0..runs.len()).collect();
        for batch in all.chunks(MAX_BATCH_READS) {
            let mut engines: Vec<(usize, sluice_io::EngineLease<'_>, usize)> = Vec::new();
            self.submit_batch(runs, batch, &mut engines)?;
            for (_, engine, submitted) in &mut engines {
                reap_all(&mut **engine, *submitted, runs, visit)?;
            }
        }
        Ok(())
    }

    /// Submits the runs `batch` names, each to an engine leased from its
    /// device (taken into `engines` with how many it was given).
    fn submit_batch<'a>(
        &'a self,
        runs: &[(u64, usize)],
        batch: &[usize],
        engines: &mut Vec<(usize, sluice_io::EngineLease<'a>, usize)>,
    ) -> Result<()> {
        let priority = io_priority();
        for &i in batch {
            let (block, blocks) = runs[i];
            let (m, lba) = self.locate(block, blocks * STORE_BLOCK_BYTES)?;
            let k = self.member_of(block);
            let at = match engines.iter().position(|(e, _, _)| *e == k) {
                Some(at) => at,
                None => {
                    let lease =
                        m.io.lease()
                            .map_err(|error| StoreError::Io { block, error })?;
                    engines.push((k, lease, 0));
                    engines.len() - 1
                }
            };
            let engine = &mut engines[at].1;
            let buf = engine
                .pool()
                .alloc(blocks * STORE_BLOCK_BYTES, Direction::Read)
                .map_err(|error| StoreError::Io { block, error })?;
            engine
                .submit(Request::read(lba, buf, i as u64).with_priority(priority))
                .map_err(|r| StoreError::Io {
                    block,
                    error: r.error,
                })?;
            engines[at].2 += 1;
        }
        Ok(())
    }

    fn read_vec(&self, block: u64, blocks: usize) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; blocks * STORE_BLOCK_BYTES];
        self.read(block, &mut buf)?;
        Ok(buf)
    }

    /// Makes the completed writes of the device holding `block` durable
    /// (the WAL and manifest live on one device; no need to flush all).
    pub fn flush_holding(&self, block: u64) -> Result<()> {
        let m = &self.members[self.member_of(block)];
        m.io.flush(io_priority())
            .map_err(|error| StoreError::Io { block, error })
    }

    /// Makes every device's completed writes durable.
    pub fn flush(&self) -> Result<()> {
        for m in self.members.iter() {
            m.io.flush(io_priority()).map_err(|error| StoreError::Io {
                block: m.base_block,
                error,
            })?;
        }
        Ok(())
    }
}

/// How the store's engines are opened: io_uring where the device has a
/// descriptor (posix workers otherwise), reads batched up to
/// [`MAX_BATCH_READS`], pinned memory bounded.
fn engine_config() -> EngineConfig {
    let mut cfg = EngineConfig {
        kind: EngineKind::Uring,
        queue_depth: MAX_BATCH_READS,
        posix_threads: 4,
        ..EngineConfig::default()
    };
    cfg.pool.max_pinned_bytes = ENGINE_PINNED_BYTES;
    cfg
}

/// Waits for `submitted` reads on `engine` and hands each to `visit`.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: a read returns its buffer"
)]
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

/// Writes the CRC32C of the block's first 4092 bytes into its last four.
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

/// Whether the block carries the checksum `seal_block_for` gives it for this store.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: a whole block"
)]
pub fn block_is_sealed_for(block: &[u8], store_id: &[u8; 16]) -> bool {
    block.len() == STORE_BLOCK_BYTES
        && crc32c::crc32c_append(crc32c::crc32c(store_id), &block[..STORE_BLOCK_BYTES - 4])
            == sluice_io::codec::u32_at(block, STORE_BLOCK_BYTES - 4).expect("a whole block")
}

/// Whether a whole block carries its checksum.
pub fn block_is_sealed(block: &[u8]) -> bool {
    block.len() == STORE_BLOCK_BYTES && trailing_crc_ok(block)
}

/// Whether the last 4 bytes of `bytes` are the CRC32C of the rest.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: 4 bytes past split"
)]
pub fn trailing_crc_ok(bytes: &[u8]) -> bool {
    let Some(split) = bytes.len().checked_sub(4) else {
        return false;
    };
    let stored = sluice_io::codec::u32_at(bytes, split).expect("4 bytes past split");
    crc32c::crc32c(&bytes[..split]) == stored
}
