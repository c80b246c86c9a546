//! A device in memory with fault injection, so that crash and error paths of
//! everything above can be tested without a disk that misbehaves on cue.
//!
//! It keeps two images: what is durable and what is visible. A write changes
//! the visible image at once and is durable only after `flush`. A power cut
//! throws away unflushed writes, or, in torn mode, keeps a seeded random
//! subset of each unflushed write's sectors, as a drive that loses power
//! mid-write may.

use super::{Device, Geometry};
use crate::error::{IoError, Result};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use std::collections::BTreeSet;
use std::os::fd::RawFd;
use std::sync::Mutex;

/// The atomic unit of a torn write.
pub const SECTOR_SIZE_BYTES: usize = 512;

/// What a simulated power cut does to writes not yet flushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerCutMode {
    /// Every unflushed write is lost whole.
    DropUnflushed,
    /// Each sector of each unflushed write independently survives or not,
    /// decided by a generator seeded with this value.
    TornSectors {
        /// Seed of the generator that decides each sector.
        seed: u64,
    },
}

#[derive(Debug)]
struct PendingWrite {
    offset_bytes: usize,
    data: Vec<u8>,
}

#[derive(Debug, Default)]
struct Faults {
    read_error_lbas: BTreeSet<u64>,
    write_error_lbas: BTreeSet<u64>,
}

#[derive(Debug)]
struct State {
    durable: Vec<u8>,
    visible: Vec<u8>,
    pending: Vec<PendingWrite>,
    faults: Faults,
    flushes: u64,
}

/// An LBA-addressed device in memory, with injected faults.
#[derive(Debug)]
pub struct MemoryDevice {
    geometry: Geometry,
    state: Mutex<State>,
    io_counts: super::IoCounts,
}

impl MemoryDevice {
    /// A zeroed device of `block_count` blocks of `block_size_bytes`.
    pub fn new(block_size_bytes: u32, block_count: u64) -> Self {
        assert!((block_size_bytes as usize).is_multiple_of(SECTOR_SIZE_BYTES));
        let size = block_size_bytes as usize * block_count as usize;
        MemoryDevice {
            geometry: Geometry {
                block_size_bytes,
                block_count,
            },
            io_counts: super::IoCounts::default(),
            state: Mutex::new(State {
                durable: vec![0; size],
                visible: vec![0; size],
                pending: Vec::new(),
                faults: Faults::default(),
                flushes: 0,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic in a test thread must not hide the device from the others.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every read that touches `lba` fails with a media error.
    pub fn inject_read_error(&self, lba: u64) {
        self.state().faults.read_error_lbas.insert(lba);
    }

    /// Every write that touches `lba` fails with a media error, changing nothing.
    pub fn inject_write_error(&self, lba: u64) {
        self.state().faults.write_error_lbas.insert(lba);
    }

    /// Removes every injected fault.
    pub fn clear_faults(&self) {
        self.state().faults = Faults::default();
    }

    /// Simulates losing power: unflushed writes are dropped or torn.
    pub fn power_cut(&self, mode: PowerCutMode) {
        let mut st = self.state();
        let pending = std::mem::take(&mut st.pending);
        if let PowerCutMode::TornSectors { seed } = mode {
            let mut rng = SmallRng::seed_from_u64(seed);
            for write in &pending {
                for (i, sector) in write.data.chunks(SECTOR_SIZE_BYTES).enumerate() {
                    if rng.gen_bool(0.5) {
                        let at = write.offset_bytes + i * SECTOR_SIZE_BYTES;
                        st.durable[at..at + sector.len()].copy_from_slice(sector);
                    }
                }
            }
        }
        let durable = st.durable.clone();
        st.visible = durable;
    }

    /// Damages the medium: `change` rewrites `len_bytes` bytes from
    /// `offset_bytes` in what the device holds durably and shows, as a
    /// flipped bit or a ruined block would, with no error on later reads.
    pub fn damage(&self, offset_bytes: usize, len_bytes: usize, change: impl FnOnce(&mut [u8])) {
        let mut st = self.state();
        change(&mut st.durable[offset_bytes..offset_bytes + len_bytes]);
        let State {
            durable, visible, ..
        } = &mut *st;
        visible[offset_bytes..offset_bytes + len_bytes]
            .copy_from_slice(&durable[offset_bytes..offset_bytes + len_bytes]);
    }

    /// Number of writes that a power cut now would affect.
    pub fn unflushed_writes(&self) -> usize {
        self.state().pending.len()
    }

    /// Flushes made so far (tests count them).
    pub fn flush_count(&self) -> u64 {
        self.state().flushes
    }

    fn covered(faulty: &BTreeSet<u64>, lba: u64, blocks: u64) -> Option<u64> {
        faulty.range(lba..lba + blocks).next().copied()
    }
}

impl Device for MemoryDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn read_at(&self, lba: u64, buf: &mut [u8]) -> Result<()> {
        self.geometry
            .check_io(lba, buf.len() as u64, buf.as_ptr() as usize)?;
        let st = self.state();
        let blocks = buf.len() as u64 / self.geometry.block_size_bytes as u64;
        if let Some(bad) = Self::covered(&st.faults.read_error_lbas, lba, blocks) {
            return Err(IoError::Media {
                lba: bad,
                reason: "injected read error".into(),
            });
        }
        let at = (lba * self.geometry.block_size_bytes as u64) as usize;
        buf.copy_from_slice(&st.visible[at..at + buf.len()]);
        Ok(())
    }

    fn write_at(&self, lba: u64, buf: &[u8]) -> Result<()> {
        self.geometry
            .check_io(lba, buf.len() as u64, buf.as_ptr() as usize)?;
        let mut st = self.state();
        let blocks = buf.len() as u64 / self.geometry.block_size_bytes as u64;
        if let Some(bad) = Self::covered(&st.faults.write_error_lbas, lba, blocks) {
            return Err(IoError::Media {
                lba: bad,
                reason: "injected write error".into(),
            });
        }
        let at = (lba * self.geometry.block_size_bytes as u64) as usize;
        st.visible[at..at + buf.len()].copy_from_slice(buf);
        st.pending.push(PendingWrite {
            offset_bytes: at,
            data: buf.to_vec(),
        });
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        let mut st = self.state();
        // Only what was written since the last flush needs copying.
        for w in std::mem::take(&mut st.pending) {
            st.durable[w.offset_bytes..w.offset_bytes + w.data.len()].copy_from_slice(&w.data);
        }
        st.flushes += 1;
        Ok(())
    }

    fn raw_fd(&self) -> Option<RawFd> {
        None
    }

    fn is_direct(&self) -> bool {
        true
    }

    fn io_counts(&self) -> Option<&super::IoCounts> {
        Some(&self.io_counts)
    }

    fn describe(&self) -> String {
        format!(
            "memory device ({} blocks of {} bytes)",
            self.geometry.block_count, self.geometry.block_size_bytes
        )
    }
}
