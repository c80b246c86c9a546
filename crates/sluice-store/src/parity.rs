//! Group parity: one block per write group holding the XOR of the group's
//! blocks, written with the group and flushed with it, so that any one
//! damaged block of a group is rebuilt and checked against its own
//! checksum. The WAL and the manifest both use it; layout in
//! docs/FORMAT.md ("Group parity").
//!
//! A protected block starts with [`DERIVED_BYTES`] that its position alone
//! determines (magic, sequence, epoch, zeros): those are rebuilt from the
//! position, so the parity holds only the XOR of the rest and fits one
//! block beside its own header.

use crate::blocks::{block_buffer, BlockDevice, STORE_BLOCK_BYTES};
use crate::codec;
use crate::error::Result;
use sluice_io::mem::AlignedMem;
use std::collections::BTreeMap;

/// Header bytes of a protected block that follow from its position.
pub const DERIVED_BYTES: usize = 32;
/// Bytes of a protected block the parity covers.
pub const PROTECTED_BYTES: usize = STORE_BLOCK_BYTES - DERIVED_BYTES;

const CRC_AT: usize = 4;
const SEQ_AT: usize = 8;
const TAG_AT: usize = 16;
const FIRST_AT: usize = 24;

/// The running XOR of a group's blocks.
#[derive(Debug)]
pub struct Parity {
    xor: Vec<u8>,
    first_seq: u64,
    blocks: u64,
}

impl Parity {
    /// An empty group whose first block will carry `first_seq`.
    pub fn new(first_seq: u64) -> Self {
        Parity {
            xor: vec![0u8; PROTECTED_BYTES],
            first_seq,
            blocks: 0,
        }
    }

    /// Whether no block was added since the last parity block.
    pub fn is_empty(&self) -> bool {
        self.blocks == 0
    }

    /// The sequence of the group's first block.
    pub fn first_seq(&self) -> u64 {
        self.first_seq
    }

    /// Adds a sealed block of the group.
    pub fn add(&mut self, block: &[u8]) {
        assert_eq!(block.len(), STORE_BLOCK_BYTES);
        xor_into(&mut self.xor, &block[DERIVED_BYTES..]);
        self.blocks += 1;
    }

    /// Writes the group's parity block for sequence `seq` (the block after
    /// the group's last) into `out`, and starts the next group after it.
    /// `tag` is the WAL epoch or zero; `seed` seeds the checksum.
    pub fn seal_into(&mut self, out: &mut [u8], magic: &[u8; 4], seq: u64, tag: u64, seed: &[u8]) {
        assert_eq!(out.len(), STORE_BLOCK_BYTES);
        assert!(
            seq >= self.first_seq + self.blocks,
            "parity placed inside its group"
        );
        out[0..4].copy_from_slice(magic);
        out[SEQ_AT..SEQ_AT + 8].copy_from_slice(&seq.to_le_bytes());
        out[TAG_AT..TAG_AT + 8].copy_from_slice(&tag.to_le_bytes());
        out[FIRST_AT..FIRST_AT + 8].copy_from_slice(&self.first_seq.to_le_bytes());
        out[DERIVED_BYTES..].copy_from_slice(&self.xor);
        let crc = parity_crc(out, seed);
        out[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        self.xor.fill(0);
        self.first_seq = seq + 1;
        self.blocks = 0;
    }
}

fn parity_crc(block: &[u8], seed: &[u8]) -> u32 {
    let c = crc32c::crc32c_append(crc32c::crc32c(seed), &block[0..CRC_AT]);
    crc32c::crc32c_append(c, &block[SEQ_AT..])
}

/// The first sequence of the group a valid parity block at `seq` covers,
/// or `None` if the block is not that parity block.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: in a whole block"
)]
pub fn check_parity(block: &[u8], magic: &[u8; 4], seq: u64, tag: u64, seed: &[u8]) -> Option<u64> {
    if block.len() != STORE_BLOCK_BYTES {
        return None;
    }
    let u64_at = |at: usize| codec::u64_at(block, at).expect("in a whole block");
    let stored = codec::u32_at(block, CRC_AT).expect("in a whole block");
    let ok = &block[0..4] == magic
        && u64_at(SEQ_AT) == seq
        && u64_at(TAG_AT) == tag
        && u64_at(FIRST_AT) <= seq
        && parity_crc(block, seed) == stored;
    ok.then(|| u64_at(FIRST_AT))
}

/// Rebuilds the protected bytes of the one missing block of a group from
/// its parity block and every other block of the group. The caller writes
/// the derived header and checks the result with the block's own checksum.
pub fn rebuild<'a>(parity: &[u8], others: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = parity[DERIVED_BYTES..].to_vec();
    for b in others {
        xor_into(&mut out, &b[DERIVED_BYTES..]);
    }
    out
}

fn xor_into(acc: &mut [u8], b: &[u8]) {
    assert_eq!(acc.len(), b.len());
    for (a, x) in acc.iter_mut().zip(b) {
        *a ^= *x;
    }
}

/// What a block of a protected log read back turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// A valid block of the log at its place: every block below `claim`
    /// was durable when it was written; its group starts at `group`, so
    /// block `group - 1` is the previous group's parity block.
    Data {
        /// Every block below it was durable when this one was written.
        claim: u64,
        /// The first block of its group.
        group: u64,
    },
    /// The valid parity block of the group that starts at `first`.
    Parity {
        /// The first block of the group it covers.
        first: u64,
    },
    /// Torn, never written, left from earlier use of the space, or damaged.
    Invalid,
}

/// How a log built of protected blocks is laid out and checked.
pub trait LogFormat {
    /// The store block holding log block `seq`, and how many log blocks
    /// from `seq` on follow it contiguously on the device.
    fn place_of(&self, seq: u64) -> (u64, u64);
    /// What the block read at `seq` is.
    fn classify(&self, block: &[u8], seq: u64) -> Slot;
    /// Writes the header bytes a block at `seq` has by its position.
    fn derived_header(&self, block: &mut [u8], seq: u64);
}

/// A log read back: every block classified, damaged blocks rebuilt from
/// their group's parity where the rest of the group was intact.
#[derive(Debug)]
pub struct Scan {
    /// Sequence of the first block read.
    pub start_seq: u64,
    /// What each block from `start_seq` on is.
    pub slots: Vec<Slot>,
    /// Blocks rebuilt from parity, by sequence.
    pub rebuilt: BTreeMap<u64, AlignedMem>,
}

/// Blocks read per device request while scanning.
const SCAN_RUN_BLOCKS: u64 = 256;

impl Scan {
    /// Reads and classifies log blocks `start_seq..start_seq + count`,
    /// then rebuilds what parity can.
    pub fn read(
        dev: &BlockDevice,
        format: &impl LogFormat,
        start_seq: u64,
        count: u64,
    ) -> Result<Self> {
        let mut slots = Vec::with_capacity(count as usize);
        let mut buf = AlignedMem::new(SCAN_RUN_BLOCKS as usize * STORE_BLOCK_BYTES);
        let end = start_seq + count;
        let mut seq = start_seq;
        while seq < end {
            let (at, contiguous) = format.place_of(seq);
            let n = contiguous.min(SCAN_RUN_BLOCKS).min(end - seq);
            let bytes = &mut buf.as_mut_slice()[..n as usize * STORE_BLOCK_BYTES];
            dev.read(at, bytes)?;
            for (i, b) in bytes.chunks_exact(STORE_BLOCK_BYTES).enumerate() {
                slots.push(format.classify(b, seq + i as u64));
            }
            seq += n;
        }
        let mut scan = Scan {
            start_seq,
            slots,
            rebuilt: BTreeMap::new(),
        };
        scan.rebuild(dev, format)?;
        Ok(scan)
    }

    /// One past the last block read.
    pub fn end_seq(&self) -> u64 {
        self.start_seq + self.slots.len() as u64
    }

    /// What the block at `seq` is (Invalid outside what was read).
    pub fn slot(&self, seq: u64) -> Slot {
        self.slots[(seq - self.start_seq) as usize]
    }

    /// Where a later block says a parity block stood: an invalid block
    /// there lost no records.
    fn parity_places(&self) -> std::collections::BTreeSet<u64> {
        self.slots
            .iter()
            .filter_map(|s| match *s {
                Slot::Data { group, .. } if group > self.start_seq => Some(group - 1),
                _ => None,
            })
            .collect()
    }

    /// Invalid blocks that may have held records, in order.
    fn gaps(&self) -> impl Iterator<Item = u64> + '_ {
        let parity = self.parity_places();
        (self.start_seq..self.end_seq())
            .filter(move |&seq| self.slot(seq) == Slot::Invalid && !parity.contains(&seq))
    }

    /// The first invalid block (after rebuilding) that may have held
    /// records — the end of the log unless it is damage — or the end.
    pub fn first_invalid(&self) -> u64 {
        self.first_invalid_from(self.start_seq)
    }

    /// [`Scan::first_invalid`] at or after `from`.
    pub fn first_invalid_from(&self, from: u64) -> u64 {
        self.gaps()
            .find(|&seq| seq >= from)
            .unwrap_or(self.end_seq())
    }

    /// The highest durable mark any valid block carries, and that block:
    /// every block below the mark was durable, so one that fails there is
    /// damage, not a torn write.
    pub fn proven_below(&self) -> (u64, u64) {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match *s {
                Slot::Data { claim, .. } => Some((claim, self.start_seq + i as u64)),
                Slot::Parity { .. } | Slot::Invalid => None,
            })
            .max()
            .unwrap_or((0, 0))
    }

    /// Invalid blocks below the proven mark that may have held records:
    /// damage.
    pub fn damaged(&self) -> Vec<u64> {
        let (proven, _) = self.proven_below();
        self.gaps().take_while(|&seq| seq < proven).collect()
    }

    /// The bytes of valid block `seq`: rebuilt, or read from the device.
    pub fn block<'a>(
        &'a self,
        dev: &BlockDevice,
        format: &impl LogFormat,
        seq: u64,
        buf: &'a mut AlignedMem,
    ) -> Result<&'a [u8]> {
        if let Some(b) = self.rebuilt.get(&seq) {
            return Ok(b.as_slice());
        }
        dev.read(format.place_of(seq).0, buf.as_mut_slice())?;
        Ok(buf.as_slice())
    }

    /// Makes the log on the device what recovery took it to be, before
    /// anything is appended after `end`: rebuilt blocks are written back,
    /// `replace` blocks below `end` are overwritten with what it returns
    /// (the caller's empty block), and every valid block from `end` on (a
    /// remnant of a torn write, or what recovery was asked to drop) is
    /// zeroed, so that no later recovery can read it as part of the log.
    /// Writes only what needs it; flushes if it wrote. Returns the blocks
    /// written.
    pub fn seal(
        &self,
        dev: &BlockDevice,
        format: &impl LogFormat,
        end: u64,
        replace: &[u64],
        empty_block: impl Fn(u64) -> AlignedMem,
    ) -> Result<usize> {
        let mut written = 0;
        for (&seq, block) in self.rebuilt.range(..end) {
            dev.write(format.place_of(seq).0, block.as_slice())?;
            written += 1;
        }
        for &seq in replace.iter().filter(|&&s| s < end) {
            dev.write(format.place_of(seq).0, empty_block(seq).as_slice())?;
            written += 1;
        }
        let zeros = block_buffer();
        for seq in end..self.end_seq() {
            if self.slot(seq) != Slot::Invalid {
                dev.write(format.place_of(seq).0, zeros.as_slice())?;
                written += 1;
            }
        }
        if written > 0 {
            dev.flush()?;
        }
        Ok(written)
    }

    /// (first block of the group, parity place) of each group inside the
    /// log (below `end`) whose parity block is invalid: an invalid block
    /// below the end that recovery did not pass over as damaged
    /// (`skipped`) is a lost parity block.
    pub fn lost_parity_places(&self, end: u64, skipped: &[u64]) -> Vec<(u64, u64)> {
        let start = self.start_seq;
        (start + 1..end)
            .filter(|&p| self.slot(p) == Slot::Invalid && !skipped.contains(&p))
            .filter_map(|p| match self.slot(p - 1) {
                Slot::Data { group, .. } if (start..p).contains(&group) => Some((group, p)),
                _ => None,
            })
            .collect()
    }

    /// The first block of the log's last group when that group ends the
    /// log at `end` without its parity block and a log of `capacity`
    /// blocks has room for one there.
    pub fn unprotected_group(&self, end: u64, capacity: u64) -> Option<u64> {
        let last = end.checked_sub(1)?;
        if last < self.start_seq {
            return None;
        }
        let Slot::Data { group, .. } = self.slot(last) else {
            return None;
        };
        let room = end + 1 - self.start_seq <= capacity;
        (room && (self.start_seq..=last).contains(&group)).then_some(group)
    }

    /// Writes the parity block of the group `group..place` at `place`;
    /// `seal` frames it as the log's parity block at that sequence.
    pub fn write_parity(
        dev: &BlockDevice,
        format: &impl LogFormat,
        group: u64,
        place: u64,
        seal: impl Fn(&mut Parity, &mut [u8], u64),
    ) -> Result<()> {
        let mut parity = Parity::new(group);
        let mut block = AlignedMem::new(STORE_BLOCK_BYTES);
        for seq in group..place {
            dev.read(format.place_of(seq).0, block.as_mut_slice())?;
            parity.add(block.as_slice());
        }
        let mut out = AlignedMem::new(STORE_BLOCK_BYTES);
        seal(&mut parity, out.as_mut_slice(), place);
        dev.write(format.place_of(place).0, out.as_slice())
    }

    /// Rebuilds each group's one invalid block from the group's parity
    /// block and the rest of the group; kept only if it then validates.
    fn rebuild(&mut self, dev: &BlockDevice, format: &impl LogFormat) -> Result<()> {
        let read = |seq: u64| -> Result<AlignedMem> {
            let mut b = block_buffer();
            dev.read(format.place_of(seq).0, b.as_mut_slice())?;
            Ok(b)
        };
        for p in 0..self.slots.len() {
            let Slot::Parity { first } = self.slots[p] else {
                continue;
            };
            if first < self.start_seq {
                continue;
            }
            let group = (first - self.start_seq) as usize..p;
            let not_data: Vec<usize> = group
                .clone()
                .filter(|&i| !matches!(self.slots[i], Slot::Data { .. }))
                .collect();
            if not_data.len() != 1 || self.slots[not_data[0]] != Slot::Invalid {
                continue;
            }
            let k = not_data[0];
            let parity_block = read(self.start_seq + p as u64)?;
            let others = group
                .filter(|&i| i != k)
                .map(|i| read(self.start_seq + i as u64))
                .collect::<Result<Vec<_>>>()?;
            let seq = self.start_seq + k as u64;
            let mut block = block_buffer();
            format.derived_header(block.as_mut_slice(), seq);
            block.as_mut_slice()[DERIVED_BYTES..].copy_from_slice(&rebuild(
                parity_block.as_slice(),
                others.iter().map(|b| b.as_slice()),
            ));
            let slot = format.classify(block.as_slice(), seq);
            if let Slot::Data { .. } = slot {
                self.slots[k] = slot;
                self.rebuilt.insert(seq, block);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_one_block_of_a_group_is_rebuilt() {
        let blocks: Vec<Vec<u8>> = (0..5u8)
            .map(|i| {
                (0..STORE_BLOCK_BYTES)
                    .map(|j| (j as u8).wrapping_mul(i + 3))
                    .collect()
            })
            .collect();
        let mut p = Parity::new(10);
        for b in &blocks {
            p.add(b);
        }
        let mut pb = vec![0u8; STORE_BLOCK_BYTES];
        p.seal_into(&mut pb, b"TSTP", 15, 7, b"seed");
        assert_eq!(check_parity(&pb, b"TSTP", 15, 7, b"seed"), Some(10));
        assert_eq!(check_parity(&pb, b"TSTP", 15, 8, b"seed"), None);
        assert_eq!(check_parity(&pb, b"TSTP", 15, 7, b"other"), None);
        assert!(p.is_empty());
        for missing in 0..blocks.len() {
            let others = blocks
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != missing)
                .map(|(_, b)| b.as_slice());
            assert_eq!(
                rebuild(&pb, others),
                blocks[missing][DERIVED_BYTES..].to_vec()
            );
        }
        let mut damaged = pb.clone();
        damaged[2000] ^= 1;
        assert_eq!(check_parity(&damaged, b"TSTP", 15, 7, b"seed"), None);
    }
}
