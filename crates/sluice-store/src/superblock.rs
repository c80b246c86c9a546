//! The superblock: two copies in store blocks 0 and 1, written alternately
//! with a rising generation. Layout in docs/FORMAT.md.

use crate::blocks::{
    block_buffer, block_is_sealed, seal_block, BlockDevice, Extent, STORE_BLOCK_BYTES,
};
use crate::codec;
use crate::error::{Result, StoreError};

/// First bytes of both superblock copies.
pub const MAGIC: &[u8; 8] = b"SLUICEKV";
/// 2: the superblock lists the store blocks of each device of the set.
/// 3: manifest checksums seeded with the store id. 4: WAL and manifest
/// blocks carry a durable mark and each write group a parity block.
pub const FORMAT_VERSION: u32 = 4;
/// Store blocks 0 and 1 hold the two copies.
pub const SUPERBLOCK_BLOCKS: u64 = 2;

/// What the first device's superblock (and each member's label) records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// Raised on every write; the higher valid copy wins.
    pub generation: u64,
    /// Random per store; every device of the set carries it.
    pub store_id: [u8; 16],
    /// Store blocks of the whole set.
    pub device_blocks: u64,
    /// This device's place in the set.
    pub device_index: u32,
    /// Devices in the set.
    pub device_count: u32,
    /// When the store was formatted.
    pub created_unix_ms: u64,
    /// Where the manifest log lies.
    pub manifest: Extent,
    /// Sequence of the manifest extent's first block.
    pub manifest_first_seq: u64,
    /// Store blocks used on each device of the set, in order (their sum is
    /// `device_blocks`).
    pub member_blocks: Vec<u64>,
}

/// Where the member table starts, and the most devices it lists.
const MEMBERS_AT: usize = 96;
/// Most devices a set may have.
pub const MAX_MEMBERS: usize = crate::blocks::MAX_DEVICES;

impl Superblock {
    /// The block this superblock is written as.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; STORE_BLOCK_BYTES];
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(STORE_BLOCK_BYTES as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.generation.to_le_bytes());
        b[24..40].copy_from_slice(&self.store_id);
        b[40..48].copy_from_slice(&self.device_blocks.to_le_bytes());
        b[48..52].copy_from_slice(&self.device_index.to_le_bytes());
        b[52..56].copy_from_slice(&self.device_count.to_le_bytes());
        b[56..64].copy_from_slice(&self.created_unix_ms.to_le_bytes());
        self.manifest.encode(&mut b[64..80]);
        b[80..88].copy_from_slice(&self.manifest_first_seq.to_le_bytes());
        assert!(self.member_blocks.len() <= MAX_MEMBERS);
        for (k, blocks) in self.member_blocks.iter().enumerate() {
            b[MEMBERS_AT + 8 * k..MEMBERS_AT + 8 * k + 8].copy_from_slice(&blocks.to_le_bytes());
        }
        seal_block(&mut b);
        b
    }

    /// Decodes one copy; the error says why it is not valid.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: in a sealed block; 16; 16 bytes"
    )]
    pub fn decode(b: &[u8]) -> std::result::Result<Self, DecodeError> {
        if b.get(0..8) != Some(MAGIC.as_slice()) {
            return Err(DecodeError::Magic);
        }
        if !block_is_sealed(b) {
            return Err(DecodeError::Checksum);
        }
        // A sealed block is whole: every fixed offset below lies in it.
        let u64_at = |o: usize| codec::u64_at(b, o).expect("in a sealed block");
        let u32_at = |o: usize| codec::u32_at(b, o).expect("in a sealed block");
        let version = u32_at(8);
        if version != FORMAT_VERSION {
            return Err(DecodeError::Version(version));
        }
        let block_size = u32_at(12);
        if block_size as usize != STORE_BLOCK_BYTES {
            return Err(DecodeError::BlockSize(block_size));
        }
        let count = u32_at(52) as usize;
        if count == 0 || count > MAX_MEMBERS {
            return Err(DecodeError::Members(count as u32));
        }
        let member_blocks: Vec<u64> = (0..count).map(|k| u64_at(MEMBERS_AT + 8 * k)).collect();
        if member_blocks.iter().sum::<u64>() != u64_at(40) {
            return Err(DecodeError::Members(count as u32));
        }
        Ok(Superblock {
            generation: u64_at(16),
            store_id: b[24..40].try_into().expect("16"),
            device_blocks: u64_at(40),
            device_index: u32_at(48),
            device_count: u32_at(52),
            created_unix_ms: u64_at(56),
            manifest: Extent::decode(&b[64..80]).expect("16 bytes"),
            manifest_first_seq: u64_at(80),
            member_blocks,
        })
    }

    /// The copy (0 or 1) a superblock of this generation is written to.
    pub fn slot(&self) -> u64 {
        self.generation % 2
    }
}

/// Why a superblock copy is not valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// No superblock magic: not a store, or never formatted.
    Magic,
    /// The checksum fails.
    Checksum,
    /// Another format version.
    Version(u32),
    /// Another block size.
    BlockSize(u32),
    /// A device count of zero or over the limit, or sizes that do not add up.
    Members(u32),
}

/// Writes `sb` to the copy its generation selects and makes it durable.
pub fn write(dev: &BlockDevice, sb: &Superblock) -> Result<()> {
    let mut buf = block_buffer();
    buf.as_mut_slice().copy_from_slice(&sb.encode());
    dev.write(sb.slot(), buf.as_slice())?;
    dev.flush()
}

/// Writes `sb` to both copies, one after the other, each made durable
/// before the next: the generation rises by two. A crash or damage to
/// either copy then leaves the other pointing at the same manifest.
pub fn write_both(dev: &BlockDevice, sb: &mut Superblock) -> Result<()> {
    for _ in 0..SUPERBLOCK_BLOCKS {
        sb.generation += 1;
        write(dev, sb)?;
    }
    Ok(())
}

/// Writes a device's label (a superblock naming its place in the set) to
/// both of its first two blocks, from global block `first`.
pub fn write_label(dev: &BlockDevice, first: u64, label: &Superblock) -> Result<()> {
    let mut buf = block_buffer();
    buf.as_mut_slice().copy_from_slice(&label.encode());
    for slot in 0..SUPERBLOCK_BLOCKS {
        dev.write(first + slot, buf.as_slice())?;
    }
    dev.flush()
}

/// Reads the label of the device whose blocks start at global block
/// `first`: the valid copy, or why neither is.
pub fn read_label(
    dev: &BlockDevice,
    first: u64,
) -> Result<std::result::Result<Superblock, DecodeError>> {
    let mut last = Err(DecodeError::Magic);
    for slot in 0..SUPERBLOCK_BLOCKS {
        let mut buf = block_buffer();
        dev.read(first + slot, buf.as_mut_slice())?;
        last = Superblock::decode(buf.as_slice());
        if last.is_ok() {
            break;
        }
    }
    Ok(last)
}

/// Reads both copies and returns the valid one with the higher generation.
pub fn read(dev: &BlockDevice) -> Result<Superblock> {
    let mut copies = Vec::new();
    let mut errors = Vec::new();
    for slot in 0..SUPERBLOCK_BLOCKS {
        let mut buf = block_buffer();
        dev.read(slot, buf.as_mut_slice())?;
        match Superblock::decode(buf.as_slice()) {
            Ok(sb) => copies.push(sb),
            Err(e) => errors.push(e),
        }
    }
    if let Some(best) = copies.into_iter().max_by_key(|sb| sb.generation) {
        let (_, first, end) = dev.member(0);
        if best.member_blocks[0] > end - first {
            return Err(StoreError::BadDevice(format!(
                "{} holds {} store blocks but the store was formatted with {}",
                dev.device().describe(),
                end - first,
                best.member_blocks[0]
            )));
        }
        return Ok(best);
    }
    let what = dev.device().describe();
    if let Some(DecodeError::Version(found)) =
        errors.iter().find(|e| matches!(e, DecodeError::Version(_)))
    {
        return Err(StoreError::UnsupportedVersion {
            found: *found,
            supported: FORMAT_VERSION,
        });
    }
    let reason = if errors.iter().all(|e| *e == DecodeError::Magic) {
        "no superblock magic in blocks 0 and 1 (format it first)".to_string()
    } else {
        format!("both superblock copies are invalid ({errors:?})")
    };
    Err(StoreError::NotAStore { what, reason })
}
