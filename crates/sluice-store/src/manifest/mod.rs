//! The manifest: a log of version edits in its own extent, replayed at open
//! into the store's state (keyspaces, tables, WAL place, free map). Layout
//! in docs/FORMAT.md ("Manifest log").
//!
//! Edits are logged in groups; a group counts only once its commit record
//! is read back, so a torn write can lose only a group whose `log` call had
//! not returned. When the extent fills, the full state is written as a
//! checkpoint at the start of a new extent, the superblock is pointed at it,
//! and only then is the old extent freed.
//!
//! Rooms: `state` (what the manifest holds and the edits to it),
//! `edit_codec` (edits as records); here the log's blocks, its writer and
//! its replay.

mod edit_codec;
mod state;

use edit_codec::{decode_edit, encode_edit};
pub use state::{Edit, KeyspaceDef, ManifestState, TableMeta, ValueFormat, WalPlace};

use crate::alloc::ExtentAllocator;
use crate::blocks::{
    block_buffer, block_is_sealed_for, seal_block_for, BlockDevice, Extent, STORE_BLOCK_BYTES,
};
use crate::codec::{u64_at, Reader};
use crate::error::{Result, StoreError};
use crate::parity::{LogFormat, Parity, Scan, Slot, DERIVED_BYTES};
use crate::superblock::{self, Superblock, SUPERBLOCK_BLOCKS};
use sluice_io::mem::AlignedMem;

const MAGIC: &[u8; 4] = b"MANB";
const PARITY_MAGIC: &[u8; 4] = b"MANP";
const USED_AT: usize = DERIVED_BYTES;
const CLAIM_AT: usize = DERIVED_BYTES + 8;
const HEADER_BYTES: usize = DERIVED_BYTES + 16;
const PAYLOAD_BYTES: usize = STORE_BLOCK_BYTES - HEADER_BYTES - 4;
/// u32 length, u8 type, u32 CRC32C of type + payload.
const RECORD_HEADER_BYTES: usize = 9;
/// Largest record payload: a record never spans blocks. An edit longer
/// than this (a table bounded by long keys) is cut into `T_CONTINUED`
/// records followed by one of its own type.
pub const MAX_RECORD_PAYLOAD: usize = PAYLOAD_BYTES - RECORD_HEADER_BYTES;
/// Longest edit: a table whose two bounds are keys of the longest kind
/// (`batch::MAX_KEY_BYTES` each) and its fixed fields, with room to spare.
const MAX_EDIT_BYTES: usize = 64 << 10;

const T_CHECKPOINT_BEGIN: u8 = 1;
const T_CHECKPOINT_END: u8 = 2;
const T_ALLOC: u8 = 3;
const T_FREE: u8 = 4;
const T_KEYSPACE: u8 = 5;
const T_ADD_TABLE: u8 = 6;
const T_REMOVE_TABLE: u8 = 7;
const T_WAL: u8 = 8;
const T_LAST_SEQUENCE: u8 = 9;
const T_NEXT_FILE: u8 = 10;
const T_GROUP_COMMIT: u8 = 11;
const T_DROP_KEYSPACE: u8 = 12;
const T_NEXT_KEYSPACE: u8 = 13;
/// The first part of the next record's payload (an edit longer than a
/// record holds).
const T_CONTINUED: u8 = 14;
const T_ADD_BLOB_FILE: u8 = 15;
const T_REMOVE_BLOB_FILE: u8 = 16;

/// Packs records into sealed blocks, each block written once.
struct BlockPacker {
    blocks: Vec<Vec<u8>>,
    used: usize,
}

impl BlockPacker {
    fn new() -> Self {
        BlockPacker {
            blocks: vec![vec![0u8; STORE_BLOCK_BYTES]],
            used: 0,
        }
    }

    fn push(&mut self, t: u8, payload: &[u8]) -> Result<()> {
        if payload.len() > MAX_EDIT_BYTES {
            return Err(StoreError::RecordTooLarge {
                len_bytes: payload.len(),
                max_bytes: MAX_EDIT_BYTES,
            });
        }
        let mut rest = payload;
        while rest.len() > MAX_RECORD_PAYLOAD {
            let (part, after) = rest.split_at(MAX_RECORD_PAYLOAD);
            self.push_record(T_CONTINUED, part);
            rest = after;
        }
        self.push_record(t, rest);
        Ok(())
    }

    /// Appends one record of at most `MAX_RECORD_PAYLOAD` bytes.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a block"
    )]
    fn push_record(&mut self, t: u8, payload: &[u8]) {
        assert!(payload.len() <= MAX_RECORD_PAYLOAD);
        if PAYLOAD_BYTES - self.used < RECORD_HEADER_BYTES + payload.len() {
            self.blocks.push(vec![0u8; STORE_BLOCK_BYTES]);
            self.used = 0;
        }
        let b = self.blocks.last_mut().expect("a block");
        let at = HEADER_BYTES + self.used;
        let crc = crc32c::crc32c_append(crc32c::crc32c(&[t]), payload);
        b[at..at + 4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        b[at + 4] = t;
        b[at + 5..at + 9].copy_from_slice(&crc.to_le_bytes());
        b[at + 9..at + 9 + payload.len()].copy_from_slice(payload);
        self.used += RECORD_HEADER_BYTES + payload.len();
        self.seal_last_header();
    }

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a block"
    )]
    fn seal_last_header(&mut self) {
        let used = self.used as u64;
        let b = self.blocks.last_mut().expect("a block");
        b[USED_AT..USED_AT + 8].copy_from_slice(&used.to_le_bytes());
    }

    /// Blocks the group takes on the device: its own and its parity block.
    fn device_blocks(&self) -> u64 {
        self.blocks.len() as u64 + 1
    }

    /// Numbers and seals the blocks from `first_seq` on, each marked with
    /// `first_seq` (every block before the group is durable when it is
    /// written), and adds the group's parity block.
    fn finish(mut self, first_seq: u64, store_id: &[u8; 16]) -> Vec<Vec<u8>> {
        let mut parity = Parity::new(first_seq);
        for (i, b) in self.blocks.iter_mut().enumerate() {
            write_derived_header(b, first_seq + i as u64);
            b[CLAIM_AT..CLAIM_AT + 8].copy_from_slice(&first_seq.to_le_bytes());
            seal_block_for(b, store_id);
            parity.add(b);
        }
        let parity_seq = first_seq + self.blocks.len() as u64;
        let mut p = vec![0u8; STORE_BLOCK_BYTES];
        parity.seal_into(&mut p, PARITY_MAGIC, parity_seq, 0, store_id);
        self.blocks.push(p);
        self.blocks
    }
}

/// Blocks per manifest extent.
pub const MANIFEST_EXTENT_BLOCKS: u32 = 256;

/// The open manifest: appends edit groups, rolls over to a new extent.
pub struct Manifest {
    dev: BlockDevice,
    superblock: Superblock,
    extent: Extent,
    /// Sequence of the extent's first block, and of the next block to write.
    first_seq: u64,
    next_seq: u64,
    state: ManifestState,
    /// Extents taken with [`Manifest::allocate_on`] whose `Alloc` edit is
    /// not logged yet (a table being written). A checkpoint lists them as
    /// free: the group that logs them follows it.
    unlogged: Vec<Extent>,
    /// The extent as replay read it, until [`Manifest::begin_writing`].
    replayed: Option<Scan>,
}

impl std::fmt::Debug for Manifest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manifest")
            .field("extent", &self.extent)
            .field("next_seq", &self.next_seq)
            .finish()
    }
}

impl Manifest {
    /// Formats a fresh store on `dev`: superblock, first manifest extent
    /// holding a checkpoint of `state` after `setup` edits.
    pub fn create(dev: BlockDevice, store_id: [u8; 16], created_unix_ms: u64) -> Result<Self> {
        let device_blocks = dev.block_count();
        if device_blocks < SUPERBLOCK_BLOCKS + MANIFEST_EXTENT_BLOCKS as u64 * 2 {
            return Err(StoreError::BadDevice(format!(
                "{} holds {device_blocks} store blocks; a store needs at least {}",
                dev.device().describe(),
                SUPERBLOCK_BLOCKS + MANIFEST_EXTENT_BLOCKS as u64 * 2
            )));
        }
        let mut state = ManifestState::new(device_blocks);
        let member_blocks: Vec<u64> = (0..dev.device_count())
            .map(|k| {
                let (_, first, end) = dev.member(k);
                end - first
            })
            .collect();
        // Every device after the first starts with a label naming the
        // store and its place in the set; its blocks are never allocated.
        for k in 1..dev.device_count() {
            let (device, first, _) = dev.member(k);
            if member_blocks[k] <= SUPERBLOCK_BLOCKS {
                return Err(StoreError::BadDevice(format!(
                    "{} is too small to join a store",
                    device.describe()
                )));
            }
            let label = Superblock {
                generation: 0,
                store_id,
                device_blocks,
                device_index: k as u32,
                device_count: member_blocks.len() as u32,
                created_unix_ms,
                manifest: Extent {
                    start_block: 0,
                    block_count: 0,
                },
                manifest_first_seq: 0,
                member_blocks: member_blocks.clone(),
            };
            superblock::write_label(&dev, first, &label)?;
            state.allocator.reserve(Extent {
                start_block: first,
                block_count: SUPERBLOCK_BLOCKS as u32,
            })?;
        }
        let (_, first, end) = dev.member(0);
        let extent = state
            .allocator
            .allocate_within(MANIFEST_EXTENT_BLOCKS as u64, first, end)?;
        let superblock = Superblock {
            generation: 0,
            store_id,
            device_blocks,
            device_index: 0,
            device_count: member_blocks.len() as u32,
            created_unix_ms,
            manifest: extent,
            manifest_first_seq: 0,
            member_blocks,
        };
        let mut m = Manifest {
            dev,
            superblock,
            extent,
            first_seq: 0,
            next_seq: 0,
            state,
            unlogged: Vec::new(),
            replayed: None,
        };
        m.write_checkpoint()?;
        superblock::write_both(&m.dev, &mut m.superblock)?;
        Ok(m)
    }

    /// Opens the store on `dev`: superblock, then manifest replay. Reads
    /// only: call [`Manifest::begin_writing`] before logging anything.
    pub fn open(dev: BlockDevice) -> Result<Self> {
        let sb = superblock::read(&dev)?;
        let (state, next_seq, scan) = replay(&dev, &sb)?;
        Ok(Manifest {
            dev,
            extent: sb.manifest,
            first_seq: sb.manifest_first_seq,
            next_seq,
            superblock: sb,
            state,
            unlogged: Vec::new(),
            replayed: Some(scan),
        })
    }

    /// Makes the extent what replay took it to be before anything is
    /// logged: rebuilt blocks are written back and every valid block after
    /// the end (a remnant of a group torn by a crash) is zeroed, so that
    /// none can be read as part of the log once new groups follow. A last
    /// group whose parity block was lost (a crash between its blocks and
    /// its parity) gets it now, and logging resumes after it: otherwise
    /// the next group would take the parity's place and the group would
    /// stay unprotected — a later damage to one of its blocks could not
    /// be mended and the store would not open.
    pub fn begin_writing(&mut self) -> Result<()> {
        if let Some(scan) = self.replayed.take() {
            let format = ManifestLog {
                sb: &self.superblock,
            };
            scan.seal(&self.dev, &format, self.next_seq, &[], |_| block_buffer())?;
            let capacity = self.extent.block_count as u64;
            if let Some(group) = scan.unprotected_group(self.next_seq, capacity) {
                let store_id = self.superblock.store_id;
                Scan::write_parity(
                    &self.dev,
                    &format,
                    group,
                    self.next_seq,
                    |parity, out, seq| parity.seal_into(out, PARITY_MAGIC, seq, 0, &store_id),
                )?;
                self.dev.flush()?;
                self.next_seq += 1;
            }
        }
        Ok(())
    }

    /// The device set the store lives on.
    pub fn device(&self) -> &BlockDevice {
        &self.dev
    }

    /// The state the log describes (with allocations made since).
    pub fn state(&self) -> &ManifestState {
        &self.state
    }

    /// The superblock the manifest was opened or last written through.
    pub fn superblock(&self) -> &Superblock {
        &self.superblock
    }

    /// Allocates an extent on the first device (superblock, manifest, WAL
    /// and table indexes live there); the allocation is logged with the
    /// next group.
    pub fn allocate(&mut self, blocks: u64) -> Result<Extent> {
        self.allocate_on(0, blocks)
    }

    /// Allocates an extent on device `k` of the set.
    pub fn allocate_on(&mut self, k: usize, blocks: u64) -> Result<Extent> {
        let (_, first, end) = self.dev.member(k);
        let extent = self.state.allocator.allocate_within(blocks, first, end)?;
        self.unlogged.push(extent);
        Ok(extent)
    }

    /// Free blocks on device `k` of the set.
    pub fn free_blocks_on(&self, k: usize) -> u64 {
        let (_, first, end) = self.dev.member(k);
        self.state
            .allocator
            .free_list()
            .iter()
            .map(|e| {
                e.end_block()
                    .min(end)
                    .saturating_sub(e.start_block.max(first))
            })
            .sum()
    }

    /// Blocks of the largest extent device `k` of the set can give now.
    pub fn largest_free_on(&self, k: usize) -> u64 {
        let (_, first, end) = self.dev.member(k);
        self.state.allocator.largest_free_within(first, end)
    }

    /// Returns an extent taken with [`Manifest::allocate`] whose `Alloc`
    /// edit was never logged (its table was abandoned).
    pub fn release_unlogged(&mut self, extent: Extent) -> Result<()> {
        self.unlogged.retain(|e| *e != extent);
        self.state.allocator.release(extent)
    }

    /// Applies `edits` and makes them durable as one group. `Alloc` edits
    /// for extents taken with [`Manifest::allocate`] are logged, not
    /// re-applied. On an error nothing is applied: the state in memory
    /// stays what the device says (a `Free` applied but never logged would
    /// let a later group log an `Alloc` of an extent the log still holds).
    pub fn log(&mut self, edits: &[Edit]) -> Result<()> {
        let mut packer = BlockPacker::new();
        for e in edits {
            let (t, p) = encode_edit(e);
            packer.push(t, &p)?;
        }
        packer.push(T_GROUP_COMMIT, &[])?;
        let blocks_needed = packer.device_blocks();
        let logged: Vec<Extent> = edits
            .iter()
            .filter_map(|e| match e {
                Edit::Alloc(x) => Some(*x),
                _ => None,
            })
            .collect();
        if self.next_seq - self.first_seq + blocks_needed > self.extent.block_count as u64 {
            // The group goes into the new extent's checkpoint.
            let unlogged_before = self.unlogged.clone();
            self.unlogged.retain(|e| !logged.contains(e));
            let before = (
                self.state.clone(),
                self.extent,
                self.first_seq,
                self.next_seq,
                self.superblock.clone(),
            );
            let rolled = edits
                .iter()
                .filter(|e| !matches!(e, Edit::Alloc(_)))
                .try_for_each(|e| self.state.apply(e))
                .and_then(|()| self.roll_over());
            if rolled.is_err() {
                (
                    self.state,
                    self.extent,
                    self.first_seq,
                    self.next_seq,
                    self.superblock,
                ) = before;
                self.unlogged = unlogged_before;
            }
            return rolled;
        }
        self.write_blocks(packer)?;
        self.unlogged.retain(|e| !logged.contains(e));
        for e in edits.iter().filter(|e| !matches!(e, Edit::Alloc(_))) {
            self.state.apply(e)?;
        }
        Ok(())
    }

    fn write_blocks(&mut self, packer: BlockPacker) -> Result<()> {
        let blocks = packer.finish(self.next_seq, &self.superblock.store_id);
        let mut buf = AlignedMem::new(blocks.len() * STORE_BLOCK_BYTES);
        for (i, b) in blocks.iter().enumerate() {
            buf.as_mut_slice()[i * STORE_BLOCK_BYTES..(i + 1) * STORE_BLOCK_BYTES]
                .copy_from_slice(b);
        }
        let at = self.extent.start_block + (self.next_seq - self.first_seq);
        self.dev.write(at, buf.as_slice())?;
        // Tables a group adds were flushed when written: only the device
        // holding the manifest needs it now.
        self.dev.flush_holding(at)?;
        self.next_seq += blocks.len() as u64;
        Ok(())
    }

    /// The whole state as checkpoint blocks.
    fn checkpoint(&self) -> Result<BlockPacker> {
        let mut packer = BlockPacker::new();
        packer.push(T_CHECKPOINT_BEGIN, &[])?;
        let mut state = self.state.clone();
        for e in &self.unlogged {
            state.allocator.release(*e)?;
        }
        for e in state.checkpoint_edits() {
            let (t, p) = encode_edit(&e);
            packer.push(t, &p)?;
        }
        packer.push(T_CHECKPOINT_END, &[])?;
        Ok(packer)
    }

    /// Blocks for a manifest extent that holds a checkpoint of `blocks`
    /// with room for three times as many edits after it.
    fn extent_blocks_for(checkpoint_blocks: usize) -> u64 {
        (checkpoint_blocks as u64 * 4)
            .next_power_of_two()
            .max(MANIFEST_EXTENT_BLOCKS as u64)
    }

    fn write_checkpoint(&mut self) -> Result<()> {
        let packer = self.checkpoint()?;
        self.write_blocks(packer)
    }

    /// Moves the manifest to a new extent holding a checkpoint, points the
    /// superblock at it, then frees the old extent.
    fn roll_over(&mut self) -> Result<()> {
        let old = self.extent;
        // Sized for the checkpoint as it will be (one extent more or less
        // changes it by a record at most).
        let blocks = Self::extent_blocks_for(self.checkpoint()?.device_blocks() as usize + 1);
        // Not an unlogged allocation: the checkpoint holds it as used.
        let new = self.state.allocator.allocate_within(
            blocks,
            self.dev.member(0).1,
            self.dev.member(0).2,
        )?;
        // The old extent is free in the checkpointed state: once the
        // superblock points at the new extent nothing refers to the old one.
        self.state.allocator.release(old)?;
        self.extent = new;
        self.first_seq = self.next_seq;
        self.write_checkpoint()?;
        self.superblock.manifest = new;
        self.superblock.manifest_first_seq = self.first_seq;
        superblock::write_both(&self.dev, &mut self.superblock)
    }
}

/// Frames `body` as the block at `seq` of store `store_id`: derived
/// header, body, seal.
#[cfg(feature = "fuzzing")]
pub(crate) fn frame_block(b: &mut [u8], body: &[u8], seq: u64, store_id: &[u8; 16]) {
    let n = body.len().min(STORE_BLOCK_BYTES - 4 - DERIVED_BYTES);
    b[DERIVED_BYTES..DERIVED_BYTES + n].copy_from_slice(&body[..n]);
    write_derived_header(b, seq);
    seal_block_for(b, store_id);
}

fn write_derived_header(b: &mut [u8], seq: u64) {
    b[0..4].copy_from_slice(MAGIC);
    b[4..8].fill(0);
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    b[16..DERIVED_BYTES].fill(0);
}

/// The manifest extent the superblock names, as a protected log.
struct ManifestLog<'a> {
    sb: &'a Superblock,
}

impl LogFormat for ManifestLog<'_> {
    fn place_of(&self, seq: u64) -> (u64, u64) {
        let i = seq - self.sb.manifest_first_seq;
        (
            self.sb.manifest.start_block + i,
            self.sb.manifest.block_count as u64 - i,
        )
    }

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: in a sealed block"
    )]
    fn classify(&self, b: &[u8], seq: u64) -> Slot {
        let mut derived = [0u8; DERIVED_BYTES];
        write_derived_header(&mut derived, seq);
        if b[..DERIVED_BYTES] == derived && block_is_sealed_for(b, &self.sb.store_id) {
            let used = u64_at(b, USED_AT).expect("in a sealed block");
            let claim = u64_at(b, CLAIM_AT).expect("in a sealed block");
            if used <= PAYLOAD_BYTES as u64 && claim <= seq {
                // The durable mark is the group's first block.
                return Slot::Data {
                    claim,
                    group: claim,
                };
            }
        }
        match crate::parity::check_parity(b, PARITY_MAGIC, seq, 0, &self.sb.store_id) {
            Some(first) => Slot::Parity { first },
            None => Slot::Invalid,
        }
    }

    fn derived_header(&self, block: &mut [u8], seq: u64) {
        write_derived_header(block, seq);
    }
}

/// Reads the manifest the superblock points at and rebuilds the state. A
/// block that fails is the end of the log (a group torn by a crash) unless
/// a later block was written after it was durable: then it is damage, and
/// open fails naming it. One damaged block per group is rebuilt from the
/// group's parity.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: in a sealed block"
)]
fn replay(dev: &BlockDevice, sb: &Superblock) -> Result<(ManifestState, u64, Scan)> {
    let format = ManifestLog { sb };
    let scan = Scan::read(
        dev,
        &format,
        sb.manifest_first_seq,
        sb.manifest.block_count as u64,
    )?;
    for &seq in scan.rebuilt.keys() {
        log::warn!(
            "manifest block {seq} (store block {}) was damaged and is rebuilt from its group's parity",
            format.place_of(seq).0
        );
    }
    if let Some(&seq) = scan.damaged().first() {
        let block = format.place_of(seq).0;
        let (_, proven_by) = scan.proven_below();
        return Err(StoreError::Corrupt {
            what: "manifest block",
            block,
            lba: dev.lba_of(block),
            reason: format!(
                "it fails its checks and cannot be rebuilt from its group's parity, yet manifest \
                 block {proven_by} was written after it was durable: the store's catalogue past it \
                 is lost. Nothing was changed; restore the device from a copy"
            ),
        });
    }
    let end = scan.first_invalid();
    let mut buf = block_buffer();
    let mut state: Option<ManifestState> = None;
    let mut checkpoint: Option<ManifestState> = None;
    let mut group: Vec<Edit> = Vec::new();
    // Parts of a record cut into `T_CONTINUED` records, in order.
    let mut carried: Vec<u8> = Vec::new();
    for seq in sb.manifest_first_seq..end {
        if !matches!(scan.slot(seq), Slot::Data { .. }) {
            continue;
        }
        let block = format.place_of(seq).0;
        let b = scan.block(dev, &format, seq, &mut buf)?;
        let corrupt = |reason: String| StoreError::Corrupt {
            what: "manifest block",
            block,
            lba: dev.lba_of(block),
            reason,
        };
        let used = u64_at(b, USED_AT).expect("in a sealed block") as usize;
        let mut at = HEADER_BYTES;
        while at < HEADER_BYTES + used {
            let mut header = Reader::at(b, at);
            let (Some(len), Some(t), Some(crc)) = (header.u32(), header.u8(), header.u32()) else {
                return Err(corrupt("record header runs past the block".into()));
            };
            let len = len as usize;
            let payload = b
                .get(at + 9..at + 9 + len)
                .filter(|_| at + 9 + len <= HEADER_BYTES + used)
                .ok_or_else(|| corrupt("record runs past the payload".into()))?;
            if crc32c::crc32c_append(crc32c::crc32c(&[t]), payload) != crc {
                return Err(corrupt(format!("record checksum mismatch (type {t})")));
            }
            at += RECORD_HEADER_BYTES + len;
            if t == T_CONTINUED {
                if carried.len() + payload.len() > MAX_EDIT_BYTES {
                    return Err(corrupt(format!(
                        "continued records longer than an edit may be ({MAX_EDIT_BYTES} bytes)"
                    )));
                }
                carried.extend_from_slice(payload);
                continue;
            }
            let control = matches!(t, T_CHECKPOINT_BEGIN | T_CHECKPOINT_END | T_GROUP_COMMIT);
            if control && !carried.is_empty() {
                return Err(corrupt(format!(
                    "continued records end in a record of type {t}"
                )));
            }
            let joined;
            let payload = if carried.is_empty() {
                payload
            } else {
                joined = [std::mem::take(&mut carried).as_slice(), payload].concat();
                joined.as_slice()
            };
            match t {
                T_CHECKPOINT_BEGIN => {
                    // Inside a checkpoint the free map is built from empty.
                    let mut fresh = ManifestState::new(sb.device_blocks);
                    fresh.allocator =
                        ExtentAllocator::from_free_list(SUPERBLOCK_BLOCKS, sb.device_blocks, &[])?;
                    checkpoint = Some(fresh);
                }
                T_CHECKPOINT_END => {
                    state = Some(
                        checkpoint
                            .take()
                            .ok_or_else(|| corrupt("checkpoint end without begin".into()))?,
                    );
                }
                T_GROUP_COMMIT => {
                    let st = state
                        .as_mut()
                        .ok_or_else(|| corrupt("edits before the checkpoint".into()))?;
                    for e in group.drain(..) {
                        st.apply(&e)?;
                    }
                }
                _ => {
                    let edit = decode_edit(t, payload)
                        .ok_or_else(|| corrupt(format!("undecodable record type {t}")))?;
                    match checkpoint.as_mut() {
                        Some(cp) => cp.apply(&edit)?,
                        None => group.push(edit),
                    }
                }
            }
        }
    }
    let state = state.ok_or_else(|| StoreError::Corrupt {
        what: "manifest",
        block: sb.manifest.start_block,
        lba: dev.lba_of(sb.manifest.start_block),
        reason: "no complete checkpoint at the start of the manifest extent".into(),
    })?;
    // The superblock and the manifest's own extent are in use.
    if state.allocator.is_free(sb.manifest.start_block) {
        return Err(StoreError::Corrupt {
            what: "manifest",
            block: sb.manifest.start_block,
            lba: dev.lba_of(sb.manifest.start_block),
            reason: "the free map lists the manifest's own extent as free".into(),
        });
    }
    Ok((state, end, scan))
}
