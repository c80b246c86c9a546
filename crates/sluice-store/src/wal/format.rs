//! The log's block format and its place on the device: block and fragment
//! headers, record kinds, positions, the ring's layout, and how a block read
//! back is classified (docs/FORMAT.md "Write-ahead log").

use crate::blocks::{BlockDevice, Extent, STORE_BLOCK_BYTES};
use crate::codec::u64_at;
use crate::error::Result;
use crate::parity::{self, LogFormat, Slot, DERIVED_BYTES};
use sluice_io::mem::AlignedMem;

pub(super) const MAGIC: &[u8; 4] = b"WALB";
pub(super) const PARITY_MAGIC: &[u8; 4] = b"WALP";
pub(super) const USED_AT: usize = DERIVED_BYTES;
pub(super) const CLAIM_AT: usize = DERIVED_BYTES + 8;
pub(super) const GROUP_AT: usize = DERIVED_BYTES + 16;
pub(super) const HEADER_BYTES: usize = DERIVED_BYTES + 24;
pub(super) const PAYLOAD_BYTES: usize = STORE_BLOCK_BYTES - HEADER_BYTES - 4;
/// crc u32, length u16, type u8.
pub(super) const FRAGMENT_HEADER_BYTES: usize = 7;
/// Largest record (one write batch) the log takes.
pub const MAX_RECORD_BYTES: usize = 16 << 20;

pub(super) const FULL: u8 = 1;
pub(super) const FIRST: u8 = 2;
pub(super) const MIDDLE: u8 = 3;
pub(super) const LAST: u8 = 4;

/// Where a record ended: the sequence of the log block holding its last
/// fragment. The record is durable once `last_durable() > end_seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LogPosition {
    /// One past the last log block the write's record reaches.
    pub end_seq: u64,
}

/// What recovery does when the log is damaged before its end (a block that
/// fails its checks although a later block proves it was durable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WalRecovery {
    /// Refuse to open, naming the damaged blocks and these choices.
    #[default]
    Strict,
    /// Keep the log up to the first damaged block; drop everything after.
    PointInTime,
    /// Keep every intact block; drop only the records in damaged ones.
    SkipDamaged,
}

impl std::str::FromStr for WalRecovery {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "strict" => Ok(WalRecovery::Strict),
            "point-in-time" => Ok(WalRecovery::PointInTime),
            "skip-damaged" => Ok(WalRecovery::SkipDamaged),
            other => Err(format!(
                "unknown WAL recovery {other:?}: use strict, point-in-time or skip-damaged"
            )),
        }
    }
}

/// The log's place on the device.
#[derive(Debug, Clone)]
pub struct WalLayout {
    /// The ring's extents, in log order.
    pub ring: Vec<Extent>,
    /// Random per ring; blocks carrying another epoch never validate.
    pub epoch: u64,
}

impl WalLayout {
    /// Blocks of the ring.
    pub fn ring_blocks(&self) -> u64 {
        self.ring.iter().map(|e| e.block_count as u64).sum()
    }

    /// The store block that log block `seq` occupies.
    pub fn block_of(&self, seq: u64) -> u64 {
        self.place_of(seq).0
    }

    /// The store block of `seq`, and how many log blocks from `seq` on are
    /// contiguous on the device.
    fn place_of(&self, seq: u64) -> (u64, u64) {
        let mut pos = seq % self.ring_blocks();
        for e in &self.ring {
            if pos < e.block_count as u64 {
                return (e.start_block + pos, e.block_count as u64 - pos);
            }
            pos -= e.block_count as u64;
        }
        unreachable!("position inside the ring")
    }

    /// Zero-fills the ring once, so that later writes into it never change
    /// file metadata (on a file-backed device) and a flush of data suffices.
    pub fn format(&self, dev: &BlockDevice) -> Result<()> {
        let chunk_blocks = 256u64;
        let zeros = AlignedMem::new(chunk_blocks as usize * STORE_BLOCK_BYTES);
        for e in &self.ring {
            let mut at = e.start_block;
            while at < e.end_block() {
                let n = (e.end_block() - at).min(chunk_blocks) as usize;
                dev.write(at, &zeros.as_slice()[..n * STORE_BLOCK_BYTES])?;
                at += n as u64;
            }
        }
        dev.flush()
    }
}

/// Frames `body` as the block at `seq`: derived header, body, seal.
#[cfg(feature = "fuzzing")]
pub(crate) fn frame_block(b: &mut [u8], body: &[u8], seq: u64, epoch: u64) {
    let n = body.len().min(STORE_BLOCK_BYTES - 4 - DERIVED_BYTES);
    b[DERIVED_BYTES..DERIVED_BYTES + n].copy_from_slice(&body[..n]);
    write_derived_header(b, seq, epoch);
    crate::blocks::seal_block(b);
}

pub(super) fn write_derived_header(b: &mut [u8], seq: u64, epoch: u64) {
    b[0..4].copy_from_slice(MAGIC);
    b[4..8].fill(0);
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    b[16..24].copy_from_slice(&epoch.to_le_bytes());
    b[24..DERIVED_BYTES].fill(0);
}

impl LogFormat for WalLayout {
    fn place_of(&self, seq: u64) -> (u64, u64) {
        WalLayout::place_of(self, seq)
    }

    fn classify(&self, block: &[u8], seq: u64) -> Slot {
        classify(block, seq, self.epoch)
    }

    fn derived_header(&self, block: &mut [u8], seq: u64) {
        write_derived_header(block, seq, self.epoch);
    }
}

#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: in a sealed block"
)]
pub(super) fn classify(b: &[u8], seq: u64, epoch: u64) -> Slot {
    let mut derived = [0u8; DERIVED_BYTES];
    write_derived_header(&mut derived, seq, epoch);
    if b[..DERIVED_BYTES] == derived && crate::blocks::block_is_sealed(b) {
        let used = u64_at(b, USED_AT).expect("in a sealed block");
        let claim = u64_at(b, CLAIM_AT).expect("in a sealed block");
        let group = u64_at(b, GROUP_AT).expect("in a sealed block");
        if used <= PAYLOAD_BYTES as u64 && claim <= seq && group <= seq {
            return Slot::Data { claim, group };
        }
    }
    match parity::check_parity(b, PARITY_MAGIC, seq, epoch, &[]) {
        Some(first) => Slot::Parity { first },
        None => Slot::Invalid,
    }
}
