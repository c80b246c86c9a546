//! What the manifest holds: keyspaces, tables, blob files, the WAL's
//! place and the free map ([`ManifestState`]), and the edits that change
//! it ([`Edit`]).

use crate::alloc::ExtentAllocator;
use crate::blocks::Extent;
use crate::error::{Result, StoreError};
use crate::superblock::SUPERBLOCK_BLOCKS;
use std::collections::BTreeMap;

/// How a keyspace's values are laid out (near-data operators read it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueFormat {
    /// Bytes, never read field by field.
    Raw = 1,
    /// JSON documents (fields optionally declared).
    Json = 2,
    /// Typed records laid out by a schema.
    Record = 3,
}

impl std::str::FromStr for ValueFormat {
    type Err = String;

    /// `raw`, `json` or `record`.
    fn from_str(name: &str) -> std::result::Result<Self, String> {
        match name {
            "raw" => Ok(ValueFormat::Raw),
            "json" => Ok(ValueFormat::Json),
            "record" => Ok(ValueFormat::Record),
            other => Err(format!(
                "unknown value format {other:?}: use raw, json or record"
            )),
        }
    }
}

impl ValueFormat {
    /// Its name, as `FromStr` reads it.
    pub fn name(self) -> &'static str {
        match self {
            ValueFormat::Raw => "raw",
            ValueFormat::Json => "json",
            ValueFormat::Record => "record",
        }
    }

    pub(super) fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(ValueFormat::Raw),
            2 => Some(ValueFormat::Json),
            3 => Some(ValueFormat::Record),
            _ => None,
        }
    }
}

/// A keyspace as the manifest records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyspaceDef {
    /// Its id, used in keys of the memtable, tables and log.
    pub id: u32,
    /// Its name.
    pub name: String,
    /// The format of its values.
    pub format: ValueFormat,
    /// For `Record`: the schema text; empty otherwise.
    pub schema: String,
}

/// A table (SST) as the manifest knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableMeta {
    /// The table's keyspace.
    pub keyspace: u32,
    /// Its level.
    pub level: u8,
    /// Its number, unique in the store.
    pub file_no: u64,
    /// Where its data blocks lie.
    pub data: Extent,
    /// Where its index, filter, tombstones and footer lie.
    pub index: Extent,
    /// Versions it holds.
    pub entries: u64,
    /// Its first key.
    pub smallest: Vec<u8>,
    /// Its last key.
    pub largest: Vec<u8>,
    /// The blob files its values lie in: (file number, store blocks of
    /// the records it references), by file number.
    pub blob_refs: Vec<(u64, u64)>,
}

/// Where the WAL ring lies and what of it is live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalPlace {
    /// The ring's random epoch (blocks of an older ring never validate).
    pub epoch: u64,
    /// Oldest log block whose records are not yet in tables.
    pub tail_seq: u64,
    /// The ring's extents, in order.
    pub ring: Vec<Extent>,
}

/// One change to the store's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// An extent taken.
    Alloc(Extent),
    /// An extent given back.
    Free(Extent),
    /// A keyspace created.
    AddKeyspace(KeyspaceDef),
    /// A table added (or moved to another level).
    AddTable(TableMeta),
    /// A table removed.
    RemoveTable {
        /// Its keyspace.
        keyspace: u32,
        /// Its number.
        file_no: u64,
    },
    /// The WAL's place and live tail.
    Wal(WalPlace),
    /// Every write up to this sequence is in tables or the WAL.
    LastSequence(u64),
    /// The next table number to give.
    NextFile(u64),
    /// A keyspace dropped (its tables are removed by `RemoveTable` edits
    /// of the same group). Its id is never given again.
    DropKeyspace(u32),
    /// The next keyspace id to give (ids of dropped keyspaces stay used:
    /// log records written to them before the drop must not reach another).
    NextKeyspace(u32),
    /// A blob file opened for large values (its extent is allocated by an
    /// `Alloc` of the same group).
    AddBlobFile {
        /// Its number.
        file_no: u64,
        /// Where it lies.
        extent: Extent,
    },
    /// A blob file nothing references any more (its extent is freed by a
    /// `Free` edit, once no reader holds it).
    RemoveBlobFile(u64),
}

/// The state the manifest describes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestState {
    /// Free and used extents.
    pub allocator: ExtentAllocator,
    /// Keyspaces by id.
    pub keyspaces: BTreeMap<u32, KeyspaceDef>,
    /// Live tables by (keyspace, number).
    pub tables: BTreeMap<(u32, u64), TableMeta>,
    /// The WAL's place.
    pub wal: Option<WalPlace>,
    /// Highest sequence recorded.
    pub last_sequence: u64,
    /// Next table number.
    pub next_file: u64,
    /// Next keyspace id.
    pub next_keyspace: u32,
    /// Live blob files by number.
    pub blob_files: BTreeMap<u64, Extent>,
}

impl ManifestState {
    /// The empty state of a device of `device_blocks`.
    pub fn new(device_blocks: u64) -> Self {
        ManifestState {
            allocator: ExtentAllocator::new(SUPERBLOCK_BLOCKS, device_blocks),
            keyspaces: BTreeMap::new(),
            tables: BTreeMap::new(),
            wal: None,
            last_sequence: 0,
            next_file: 1,
            next_keyspace: 0,
            blob_files: BTreeMap::new(),
        }
    }

    /// Applies one edit; an edit that does not fit the state is an error.
    pub fn apply(&mut self, edit: &Edit) -> Result<()> {
        match edit {
            Edit::Alloc(e) => self.allocator.reserve(*e)?,
            Edit::Free(e) => self.allocator.release(*e)?,
            Edit::AddKeyspace(k) => {
                self.keyspaces.insert(k.id, k.clone());
                self.next_keyspace = self.next_keyspace.max(k.id.saturating_add(1));
            }
            Edit::DropKeyspace(id) => {
                if self.keyspaces.remove(id).is_none() {
                    return Err(StoreError::BadInput(format!(
                        "manifest drops keyspace #{id}, which it does not hold"
                    )));
                }
                self.next_keyspace = self.next_keyspace.max(id.saturating_add(1));
            }
            Edit::NextKeyspace(n) => self.next_keyspace = self.next_keyspace.max(*n),
            Edit::AddTable(t) => {
                self.tables.insert((t.keyspace, t.file_no), t.clone());
            }
            Edit::RemoveTable { keyspace, file_no } => {
                self.tables.remove(&(*keyspace, *file_no));
            }
            Edit::Wal(w) => self.wal = Some(w.clone()),
            Edit::LastSequence(s) => self.last_sequence = self.last_sequence.max(*s),
            Edit::NextFile(n) => self.next_file = self.next_file.max(*n),
            Edit::AddBlobFile { file_no, extent } => {
                self.blob_files.insert(*file_no, *extent);
            }
            Edit::RemoveBlobFile(file_no) => {
                if self.blob_files.remove(file_no).is_none() {
                    return Err(StoreError::BadInput(format!(
                        "manifest removes blob file {file_no}, which it does not hold"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The whole state as edits, for a checkpoint. Free extents are given
    /// as the free map itself (inside a checkpoint, `Free` builds the map
    /// from empty).
    pub(super) fn checkpoint_edits(&self) -> Vec<Edit> {
        let mut edits: Vec<Edit> = self
            .allocator
            .free_list()
            .into_iter()
            .map(Edit::Free)
            .collect();
        edits.extend(self.keyspaces.values().cloned().map(Edit::AddKeyspace));
        edits.extend(self.tables.values().cloned().map(Edit::AddTable));
        edits.extend(
            self.blob_files
                .iter()
                .map(|(&file_no, &extent)| Edit::AddBlobFile { file_no, extent }),
        );
        edits.extend(self.wal.clone().map(Edit::Wal));
        edits.push(Edit::LastSequence(self.last_sequence));
        edits.push(Edit::NextFile(self.next_file));
        edits.push(Edit::NextKeyspace(self.next_keyspace));
        edits
    }
}
