//! Recovery: reads the ring back, rebuilds what parity can, tells a torn
//! tail from damage, decodes the complete records, and seals the ring so
//! that appending may resume.

use crate::blocks::{block_buffer, BlockDevice};
use crate::codec::{u64_at, Reader};
use crate::error::{DamagedBlock, Result, StoreError};
use crate::parity::{Scan, Slot};
use sluice_io::mem::AlignedMem;

use super::format::*;

/// What recovery found. Nothing is written until [`Recovered::seal`].
#[derive(Debug)]
pub struct Recovered {
    /// Every block of the ring as read back.
    scan: Scan,
    /// Damaged blocks below the end that recovery passed over.
    skipped: Vec<u64>,
    /// Complete records, in log order, with where each ended.
    pub records: Vec<(LogPosition, Vec<u8>)>,
    /// The end of the log: append after it (under a new epoch).
    pub next_seq: u64,
    /// Log blocks that were damaged and rebuilt from their group's parity.
    pub rebuilt: Vec<u64>,
    /// Damaged log blocks passed over by the recovery asked for, and the
    /// blocks dropped after a point-in-time stop.
    pub dropped: Vec<u64>,
}

/// Reads the log from `start_seq`: every block of the ring is classified,
/// a damaged block is rebuilt from its group's parity where the rest of the
/// group is intact, and the log ends at the first block that fails unless a
/// later block proves it was durable — then it is damage, handled as
/// `mode` says. A record whose fragments do not complete is dropped: its
/// commit never returned.
pub fn recover(
    dev: &BlockDevice,
    layout: &WalLayout,
    start_seq: u64,
    mode: WalRecovery,
) -> Result<Recovered> {
    let scan = Scan::read(dev, layout, start_seq, layout.ring_blocks())?;
    for &seq in scan.rebuilt.keys() {
        log::warn!(
            "WAL block {seq} (store block {}) was damaged and is rebuilt from its group's parity",
            layout.block_of(seq)
        );
    }
    let first_invalid = scan.first_invalid();
    let (proven_below, proven_by) = scan.proven_below();
    let damaged = scan.damaged();
    let (end, skip, dropped) = if damaged.is_empty() {
        (first_invalid, Vec::new(), Vec::new())
    } else {
        match mode {
            WalRecovery::Strict => {
                return Err(StoreError::WalDamaged {
                    damaged: damaged
                        .iter()
                        .map(|&seq| {
                            let block = layout.block_of(seq);
                            DamagedBlock {
                                seq,
                                block,
                                lba: dev.lba_of(block),
                            }
                        })
                        .collect(),
                    proven_by,
                })
            }
            WalRecovery::PointInTime => {
                let after: Vec<u64> = (first_invalid..proven_below).collect();
                (first_invalid, Vec::new(), after)
            }
            WalRecovery::SkipDamaged => {
                let end = scan.first_invalid_from(proven_below);
                (end, damaged.clone(), damaged)
            }
        }
    };
    let records = decode_records(dev, layout, &scan, end, &skip)?;
    Ok(Recovered {
        rebuilt: scan.rebuilt.keys().copied().collect(),
        scan,
        skipped: skip,
        records,
        next_seq: end,
        dropped,
    })
}

impl Recovered {
    /// Makes the ring what recovery took it to be, so that appending at
    /// `next_seq` under the same epoch is safe: rebuilt blocks go back,
    /// damaged blocks passed over become empty log blocks, and every valid
    /// block after the end (a torn write's remnant, or blocks dropped as
    /// asked) is zeroed — none can be replayed after newer writes later.
    /// And every group of the log gets back a parity block it lost
    /// (damaged, or never written at the end): a lost parity block is not
    /// damage, but until it is rewritten its group is unprotected, and a
    /// later damage to one of its blocks — after a second crash — was
    /// refused as unmendable, or at the end taken for a torn tail and its
    /// acknowledged records dropped (both found by the WAL damage property
    /// test). A group at the end gets its parity after it, and appending
    /// resumes after that.
    pub fn seal(&mut self, dev: &BlockDevice, layout: &WalLayout) -> Result<usize> {
        let mut written = self
            .scan
            .seal(dev, layout, self.next_seq, &self.skipped, |seq| {
                empty_block(layout, seq)
            })?;
        let mut lost = self.scan.lost_parity_places(self.next_seq, &self.skipped);
        let at_end = self
            .scan
            .unprotected_group(self.next_seq, layout.ring_blocks());
        lost.extend(at_end.map(|group| (group, self.next_seq)));
        for &(group, place) in &lost {
            Scan::write_parity(dev, layout, group, place, |parity, out, seq| {
                parity.seal_into(out, PARITY_MAGIC, seq, layout.epoch, &[])
            })?;
            written += 1;
        }
        if !lost.is_empty() {
            dev.flush()?;
        }
        if at_end.is_some() {
            self.next_seq += 1;
        }
        Ok(written)
    }
}

/// A valid log block at `seq` holding no records.
fn empty_block(layout: &WalLayout, seq: u64) -> AlignedMem {
    let mut b = block_buffer();
    write_derived_header(b.as_mut_slice(), seq, layout.epoch);
    // Its own group: it names no parity place.
    b.as_mut_slice()[GROUP_AT..GROUP_AT + 8].copy_from_slice(&seq.to_le_bytes());
    crate::blocks::seal_block(b.as_mut_slice());
    b
}

/// Reassembles the records of the data blocks from the scan's start to
/// `end`, passing over the blocks in `skip` (a record with a fragment in
/// one is dropped).
fn decode_records(
    dev: &BlockDevice,
    layout: &WalLayout,
    scan: &Scan,
    end: u64,
    skip: &[u64],
) -> Result<Vec<(LogPosition, Vec<u8>)>> {
    let mut records = Vec::new();
    let mut partial: Option<Vec<u8>> = None;
    let mut buf = block_buffer();
    for seq in scan.start_seq..end {
        if skip.contains(&seq) {
            partial = None;
            continue;
        }
        if !matches!(scan.slot(seq), Slot::Data { .. }) {
            continue;
        }
        let b = scan.block(dev, layout, seq, &mut buf)?;
        decode_block(
            b,
            seq,
            layout.block_of(seq),
            dev,
            &mut records,
            &mut partial,
        )?;
    }
    Ok(records)
}

#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: in a sealed block; partial record"
)]
fn decode_block(
    b: &[u8],
    seq: u64,
    block: u64,
    dev: &BlockDevice,
    records: &mut Vec<(LogPosition, Vec<u8>)>,
    partial: &mut Option<Vec<u8>>,
) -> Result<()> {
    let corrupt = |reason: String| StoreError::Corrupt {
        what: "WAL block",
        block,
        lba: dev.lba_of(block),
        reason,
    };
    let used = u64_at(b, USED_AT).expect("in a sealed block") as usize;
    let mut at = HEADER_BYTES;
    let end = HEADER_BYTES + used;
    while at < end {
        if end - at < FRAGMENT_HEADER_BYTES {
            return Err(corrupt("truncated fragment header".into()));
        }
        let mut header = Reader::at(b, at);
        let (Some(crc), Some(len), Some(kind)) = (header.u32(), header.u16(), header.u8()) else {
            return Err(corrupt("fragment header runs past the block".into()));
        };
        let len = len as usize;
        let data_at = at + FRAGMENT_HEADER_BYTES;
        if data_at + len > end {
            return Err(corrupt(format!(
                "fragment of {len} bytes runs past the payload"
            )));
        }
        let data = &b[data_at..data_at + len];
        if crc32c::crc32c_append(crc32c::crc32c(&[kind]), data) != crc {
            return Err(corrupt("fragment checksum mismatch".into()));
        }
        let pos = LogPosition { end_seq: seq };
        match kind {
            FULL => {
                *partial = None;
                records.push((pos, data.to_vec()));
            }
            FIRST => *partial = Some(data.to_vec()),
            MIDDLE | LAST => {
                // None: the record began before the start, or in a block
                // passed over as damaged: not ours to replay.
                if let Some(p) = partial.as_mut() {
                    p.extend_from_slice(data);
                    if kind == LAST {
                        records.push((pos, partial.take().expect("partial record")));
                    }
                }
            }
            other => return Err(corrupt(format!("unknown fragment type {other}"))),
        }
        at = data_at + len;
    }
    Ok(())
}
