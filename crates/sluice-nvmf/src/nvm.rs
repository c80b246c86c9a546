//! The I/O commands the node runs against its namespaces: the NVM command
//! set's Read, Write, Flush, Write Zeroes, Dataset Management, Compare,
//! fused Compare-and-Write and Copy, and the node's own commands that move
//! or compute data between devices without sending it over the network —
//! Copy across namespaces, MultiCast and add_write (docs/NVMF.md, "I/O
//! commands").
//!
//! Every device I/O here goes through the namespace's `DeviceIo` (the
//! target's plain Reads and Writes kept in flight go through engines taken
//! from it: `datapath`). Writes of all
//! kinds share a namespace's write gate; a fused Compare-and-Write takes it
//! alone, so no other write to the namespace lands between its compare and
//! its write.

use crate::command::Outcome;
use crate::command::{status, Completion, Sqe, Status};
use crate::namespace::{by_nsid, Namespace, MAX_TRANSFER_BYTES};
use sluice_io::codec::{u16_at, u32_at, u64_at};
use sluice_io::Priority;

/// NVM command set and vendor-specific opcodes the node serves.
pub mod opcode {
    /// Flush.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Compare (alone, or first of a fused Compare-and-Write).
    pub const COMPARE: u8 = 0x05;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// Dataset Management (deallocate).
    pub const DATASET_MANAGEMENT: u8 = 0x09;
    /// Copy within a namespace, source range descriptors of format 0.
    pub const COPY: u8 = 0x19;
    /// Vendor: copy a range of one namespace to another, inside the node.
    pub const COPY_ACROSS: u8 = 0x80;
    /// Vendor: one write that lands on several namespaces.
    pub const MULTICAST: u8 = 0x81;
    /// Vendor: the element-wise sum of two ranges written to a third.
    pub const ADD_WRITE: u8 = 0x82;
}

/// Most source ranges of one Copy (MSRC + 1) and of one Dataset Management.
pub const MAX_RANGES: usize = 128;
/// Most blocks of one Copy source range (MSSRL) and of one Copy (MCL), in
/// units of the namespace's blocks, and of the node's own commands.
pub const MAX_COPY_BLOCKS: u32 = 65536;

/// Whether a command carries data from the host to the node.
pub fn takes_data(opcode: u8) -> bool {
    matches!(
        opcode,
        opcode::WRITE
            | opcode::COMPARE
            | opcode::DATASET_MANAGEMENT
            | opcode::COPY
            | opcode::MULTICAST
    )
}

fn ok(sqe: &Sqe) -> Outcome {
    fail(sqe, Status::SUCCESS)
}

fn fail(sqe: &Sqe, s: Status) -> Outcome {
    Outcome::Done {
        data: Vec::new(),
        completion: Completion::new(sqe.cid(), s),
    }
}

/// A run of blocks of one namespace, checked to lie inside it.
#[derive(Debug, Clone, Copy)]
struct Extent {
    lba: u64,
    blocks: u64,
}

impl Extent {
    fn new(ns: &Namespace, lba: u64, blocks: u64) -> Result<Extent, Status> {
        match lba.checked_add(blocks) {
            Some(end) if end <= ns.block_count && blocks > 0 => Ok(Extent { lba, blocks }),
            _ => Err(status::LBA_OUT_OF_RANGE),
        }
    }

    fn bytes(&self, ns: &Namespace) -> usize {
        self.blocks as usize * ns.block_size_bytes as usize
    }
}

/// SLBA in CDW10–11, blocks (0's based) in CDW12 bits 15:0.
fn extent_of(ns: &Namespace, sqe: &Sqe) -> Result<Extent, Status> {
    let slba = sqe.cdw(10) as u64 | (sqe.cdw(11) as u64) << 32;
    Extent::new(ns, slba, (sqe.cdw(12) & 0xffff) as u64 + 1)
}

fn read(ns: &Namespace, e: Extent) -> Result<Vec<u8>, Status> {
    let mut out = vec![0u8; e.bytes(ns)];
    ns.io
        .read(e.lba, &mut out, Priority::High)
        .map_err(|_| status::UNRECOVERED_READ)?;
    Ok(out)
}

/// Reads an extent in pieces of at most one transfer, handing each on.
fn read_in_pieces(
    ns: &Namespace,
    e: Extent,
    mut each: impl FnMut(u64, &[u8]) -> Result<(), Status>,
) -> Result<(), Status> {
    let per = (MAX_TRANSFER_BYTES / ns.block_size_bytes as usize).max(1) as u64;
    let mut done = 0;
    while done < e.blocks {
        let n = (e.blocks - done).min(per);
        let piece = read(
            ns,
            Extent {
                lba: e.lba + done,
                blocks: n,
            },
        )?;
        each(done, &piece)?;
        done += n;
    }
    Ok(())
}

fn write(ns: &Namespace, lba: u64, data: &[u8]) -> Result<(), Status> {
    ns.io
        .write(lba, data, Priority::High)
        .map_err(|_| status::WRITE_FAULT)
}

fn zero(ns: &Namespace, e: Extent) -> Result<(), Status> {
    let bs = ns.block_size_bytes as u64;
    let per = (MAX_TRANSFER_BYTES as u64 / bs).max(1);
    let zeros = vec![0u8; (per.min(e.blocks) * bs) as usize];
    let mut lba = e.lba;
    while lba < e.lba + e.blocks {
        let n = (e.lba + e.blocks - lba).min(per);
        write(ns, lba, &zeros[..(n * bs) as usize])?;
        lba += n;
    }
    Ok(())
}

/// The state a queue keeps between the two halves of a fused command.
#[derive(Debug, Default)]
pub struct Fused {
    first: Option<(Sqe, Vec<u8>)>,
}

impl Fused {
    /// A Compare that waits for its fused Write.
    pub fn hold(&mut self, sqe: Sqe, data: Vec<u8>) {
        self.first = Some((sqe, data));
    }

    /// The held Compare, if any: a command that is not its Write ends it
    /// with Missing Fused Command.
    pub fn take(&mut self) -> Option<(Sqe, Vec<u8>)> {
        self.first.take()
    }

    /// Whether a Compare waits for its Write.
    pub fn is_holding(&self) -> bool {
        self.first.is_some()
    }
}

/// Runs one I/O command (not a fused half).
pub fn execute(namespaces: &[Namespace], sqe: &Sqe, data: &[u8]) -> Outcome {
    let Some(ns) = by_nsid(namespaces, sqe.nsid()) else {
        return fail(sqe, status::INVALID_NAMESPACE);
    };
    let result = match sqe.opcode() {
        opcode::FLUSH => ns.io.flush(Priority::High).map_err(|_| status::WRITE_FAULT),
        opcode::READ => {
            return match extent_of(ns, sqe).and_then(|e| {
                if e.bytes(ns) > MAX_TRANSFER_BYTES || sqe.sgl().length as usize != e.bytes(ns) {
                    Err(status::SGL_LENGTH_INVALID)
                } else {
                    read(ns, e)
                }
            }) {
                Ok(data) => Outcome::Done {
                    data,
                    completion: Completion::new(sqe.cid(), Status::SUCCESS),
                },
                Err(s) => fail(sqe, s),
            };
        }
        opcode::WRITE => extent_of(ns, sqe).and_then(|e| {
            if data.len() != e.bytes(ns) {
                return Err(status::SGL_LENGTH_INVALID);
            }
            let _writes = ns.shared_writes();
            write(ns, e.lba, data)
        }),
        opcode::WRITE_ZEROES => extent_of(ns, sqe).and_then(|e| {
            let _writes = ns.shared_writes();
            zero(ns, e)
        }),
        opcode::DATASET_MANAGEMENT => deallocate(ns, sqe, data),
        opcode::COMPARE => extent_of(ns, sqe).and_then(|e| compare(ns, e, data)),
        opcode::COPY => copy(ns, sqe, data),
        opcode::COPY_ACROSS => copy_across(namespaces, ns, sqe),
        opcode::MULTICAST => multicast(namespaces, sqe, data),
        opcode::ADD_WRITE => add_write(ns, sqe),
        _ => Err(status::INVALID_OPCODE),
    };
    match result {
        Ok(()) => ok(sqe),
        Err(s) => fail(sqe, s),
    }
}

fn compare(ns: &Namespace, e: Extent, data: &[u8]) -> Result<(), Status> {
    if data.len() != e.bytes(ns) || data.len() > MAX_TRANSFER_BYTES {
        return Err(status::SGL_LENGTH_INVALID);
    }
    if read(ns, e)? == data {
        Ok(())
    } else {
        Err(status::COMPARE_FAILURE)
    }
}

/// Fused Compare-and-Write: the Compare `first` with its data, then the
/// Write `second` with its own, over the same blocks; no other write to the
/// namespace between them. Two completions, the Compare's first.
pub fn compare_and_write(
    namespaces: &[Namespace],
    first: (&Sqe, &[u8]),
    second: (&Sqe, &[u8]),
) -> (Completion, Completion) {
    let (compare_sqe, compare_data) = first;
    let (write_sqe, write_data) = second;
    let done = |a: Status, b: Status| {
        (
            Completion::new(compare_sqe.cid(), a),
            Completion::new(write_sqe.cid(), b),
        )
    };
    let same_blocks = compare_sqe.nsid() == write_sqe.nsid()
        && compare_sqe.cdw(10) == write_sqe.cdw(10)
        && compare_sqe.cdw(11) == write_sqe.cdw(11)
        && compare_sqe.cdw(12) & 0xffff == write_sqe.cdw(12) & 0xffff;
    if compare_sqe.opcode() != opcode::COMPARE
        || write_sqe.opcode() != opcode::WRITE
        || !same_blocks
    {
        return done(status::INVALID_FIELD, status::FUSED_FAILED);
    }
    let Some(ns) = by_nsid(namespaces, write_sqe.nsid()) else {
        return done(status::INVALID_NAMESPACE, status::FUSED_FAILED);
    };
    let e = match extent_of(ns, write_sqe) {
        Ok(e) => e,
        Err(s) => return done(s, status::FUSED_FAILED),
    };
    if write_data.len() != e.bytes(ns) {
        return done(Status::SUCCESS, status::SGL_LENGTH_INVALID);
    }
    let _alone = ns.exclusive_writes();
    match compare(ns, e, compare_data) {
        Err(s) => done(s, status::FUSED_FAILED),
        Ok(()) => match write(ns, e.lba, write_data) {
            Ok(()) => done(Status::SUCCESS, Status::SUCCESS),
            Err(s) => done(Status::SUCCESS, s),
        },
    }
}

/// Dataset Management: CDW10 bits 7:0 ranges (0's based), CDW11 bit 2
/// deallocate; the data holds 16-byte ranges (4 attributes, 4 blocks, 8
/// SLBA). Deallocated blocks read as zeros (DLFEAT), so they are zeroed.
fn deallocate(ns: &Namespace, sqe: &Sqe, data: &[u8]) -> Result<(), Status> {
    let ranges = (sqe.cdw(10) & 0xff) as usize + 1;
    if data.len() < ranges * 16 {
        return Err(status::SGL_LENGTH_INVALID);
    }
    if sqe.cdw(11) & (1 << 2) == 0 {
        return Ok(()); // attributes only: hints the node takes as given
    }
    let extents: Vec<Extent> = data
        .chunks_exact(16)
        .take(ranges)
        .map(|r| {
            let blocks = u32_at(r, 4).unwrap_or_default() as u64;
            let lba = u64_at(r, 8).unwrap_or_default();
            if blocks == 0 {
                Ok(None)
            } else {
                Extent::new(ns, lba, blocks).map(Some)
            }
        })
        .filter_map(Result::transpose)
        .collect::<Result<_, _>>()?;
    let _writes = ns.shared_writes();
    extents.into_iter().try_for_each(|e| zero(ns, e))
}

/// Copy (format 0): SDLBA in CDW10–11, ranges (0's based) in CDW12 bits
/// 7:0, the format in bits 11:8; the data holds 32-byte source ranges (8
/// SLBA at offset 8, NLB 0's based at offset 16). The sources, in order,
/// land back to back from SDLBA; no byte leaves the node.
fn copy(ns: &Namespace, sqe: &Sqe, data: &[u8]) -> Result<(), Status> {
    let ranges = (sqe.cdw(12) & 0xff) as usize + 1;
    if (sqe.cdw(12) >> 8) & 0xf != 0 {
        return Err(status::INVALID_FIELD);
    }
    if ranges > MAX_RANGES || data.len() < ranges * 32 {
        return Err(status::SGL_LENGTH_INVALID);
    }
    let sources: Vec<Extent> = data
        .chunks_exact(32)
        .take(ranges)
        .map(|r| {
            let lba = u64_at(r, 8).unwrap_or_default();
            let blocks = u16_at(r, 16).unwrap_or_default() as u64 + 1;
            Extent::new(ns, lba, blocks)
        })
        .collect::<Result<_, _>>()?;
    let total: u64 = sources.iter().map(|e| e.blocks).sum();
    if total > MAX_COPY_BLOCKS as u64 {
        return Err(status::INVALID_FIELD);
    }
    let sdlba = sqe.cdw(10) as u64 | (sqe.cdw(11) as u64) << 32;
    let dest = Extent::new(ns, sdlba, total)?;
    let _writes = ns.shared_writes();
    let mut at = dest.lba;
    for src in sources {
        read_in_pieces(ns, src, |_, piece| {
            write(ns, at, piece)?;
            at += (piece.len() / ns.block_size_bytes as usize) as u64;
            Ok(())
        })?;
    }
    Ok(())
}

/// Copy across namespaces (vendor 0x80): from namespace CDW13, blocks at
/// CDW10–11 (count 0's based in CDW12 15:0), to this command's namespace at
/// CDW14–15.
fn copy_across(namespaces: &[Namespace], dest_ns: &Namespace, sqe: &Sqe) -> Result<(), Status> {
    let src_ns = by_nsid(namespaces, sqe.cdw(13)).ok_or(status::INVALID_NAMESPACE)?;
    if src_ns.block_size_bytes != dest_ns.block_size_bytes {
        return Err(status::INVALID_FIELD);
    }
    let src = extent_of(src_ns, sqe)?;
    let dlba = sqe.cdw(14) as u64 | (sqe.cdw(15) as u64) << 32;
    let dest = Extent::new(dest_ns, dlba, src.blocks)?;
    let _writes = dest_ns.shared_writes();
    read_in_pieces(src_ns, src, |done, piece| {
        write(dest_ns, dest.lba + done, piece)
    })
}

/// MultiCast (vendor 0x81): the data written at CDW10–11 (blocks 0's based
/// in CDW12 15:0) of every namespace whose bit is set in CDW13 (bit n − 1 for
/// NSID n); done when every one has it.
fn multicast(namespaces: &[Namespace], sqe: &Sqe, data: &[u8]) -> Result<(), Status> {
    let mask = sqe.cdw(13);
    if mask == 0 || (mask as u64) >> namespaces.len() as u32 != 0 {
        return Err(status::INVALID_FIELD);
    }
    let targets: Vec<&Namespace> = (1..=namespaces.len() as u32)
        .filter(|n| mask & (1 << (n - 1)) != 0)
        .filter_map(|n| by_nsid(namespaces, n))
        .collect();
    let mut extents = Vec::with_capacity(targets.len());
    for ns in &targets {
        let e = extent_of(ns, sqe)?;
        if data.len() != e.bytes(ns) {
            return Err(status::SGL_LENGTH_INVALID);
        }
        extents.push(e);
    }
    for (ns, e) in targets.iter().zip(extents) {
        let _writes = ns.shared_writes();
        write(ns, e.lba, data)?;
    }
    Ok(())
}

/// add_write (vendor 0x82): over this namespace, A at CDW10–11, B at
/// CDW12–13, the destination at CDW14–15, CDW2 bits 15:0 the blocks (0's
/// based), CDW3 the element: 0 u8, 1 u32, 2 u64 (little-endian, wrapping
/// sums). The destination gets A + B element by element.
fn add_write(ns: &Namespace, sqe: &Sqe) -> Result<(), Status> {
    let blocks = (sqe.cdw(2) & 0xffff) as u64 + 1;
    let at = |lo: usize| sqe.cdw(lo) as u64 | (sqe.cdw(lo + 1) as u64) << 32;
    let a = Extent::new(ns, at(10), blocks)?;
    let b = Extent::new(ns, at(12), blocks)?;
    let d = Extent::new(ns, at(14), blocks)?;
    let element = sqe.cdw(3);
    if element > 2 {
        return Err(status::INVALID_FIELD);
    }
    let _writes = ns.shared_writes();
    read_in_pieces(ns, a, |done, pa| {
        let n = (pa.len() / ns.block_size_bytes as usize) as u64;
        let pb = read(
            ns,
            Extent {
                lba: b.lba + done,
                blocks: n,
            },
        )?;
        let sum = add(pa, &pb, element);
        write(ns, d.lba + done, &sum)
    })
}

fn add(a: &[u8], b: &[u8], element: u32) -> Vec<u8> {
    match element {
        0 => a.iter().zip(b).map(|(x, y)| x.wrapping_add(*y)).collect(),
        1 => a
            .chunks_exact(4)
            .zip(b.chunks_exact(4))
            .flat_map(|(x, y)| {
                let s = u32_at(x, 0)
                    .unwrap_or_default()
                    .wrapping_add(u32_at(y, 0).unwrap_or_default());
                s.to_le_bytes()
            })
            .collect(),
        _ => a
            .chunks_exact(8)
            .zip(b.chunks_exact(8))
            .flat_map(|(x, y)| {
                let s = u64_at(x, 0)
                    .unwrap_or_default()
                    .wrapping_add(u64_at(y, 0).unwrap_or_default());
                s.to_le_bytes()
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::add;

    #[test]
    fn sums_wrap_per_element() {
        assert_eq!(add(&[250, 1], &[10, 2], 0), vec![4, 3]);
        let a = [u32::MAX.to_le_bytes(), 5u32.to_le_bytes()].concat();
        let b = [2u32.to_le_bytes(), 6u32.to_le_bytes()].concat();
        assert_eq!(
            add(&a, &b, 1),
            [1u32.to_le_bytes(), 11u32.to_le_bytes()].concat()
        );
        let a = (u64::MAX - 1).to_le_bytes();
        assert_eq!(add(&a, &3u64.to_le_bytes(), 2), 1u64.to_le_bytes().to_vec());
    }
}
