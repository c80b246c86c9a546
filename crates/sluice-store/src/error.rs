//! Errors of the store. Each says what was wrong and where.

/// Result alias of the store.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Everything the store can refuse or fail at.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A device I/O failed.
    #[error("I/O at store block {block}: {error}")]
    Io {
        /// The store block the I/O was for.
        block: u64,
        /// What failed.
        error: sluice_io::IoError,
    },

    /// A device that cannot hold or be a store (size, set, labels).
    #[error("{0}")]
    BadDevice(String),

    /// A device file that does not exist where a store was to be opened.
    #[error("no store at {}: {advice}", path.display())]
    NoStore {
        /// The missing file.
        path: std::path::PathBuf,
        /// What to do about it.
        advice: String,
    },

    /// A device that holds no Sluice store.
    #[error("{what} is not a Sluice store: {reason}")]
    NotAStore {
        /// The device.
        what: String,
        /// What was found instead.
        reason: String,
    },

    /// A store written by another format version.
    #[error(
        "store format version {found}, this build reads version {supported}; use a matching build"
    )]
    UnsupportedVersion {
        /// The store's version.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },

    /// No free extent large enough.
    #[error("device full: {needed_blocks} blocks needed, largest free extent {largest_free_blocks} blocks of {free_blocks} free")]
    DeviceFull {
        /// Blocks asked for.
        needed_blocks: u64,
        /// The largest free run.
        largest_free_blocks: u64,
        /// Free blocks in all.
        free_blocks: u64,
    },

    /// Writes refused until the store can put its memtable on the device
    /// again: its free space fell below the room kept for flushes and
    /// compactions, or a flush failed (retried each second). Reads go on;
    /// deletes are taken while there is room for them.
    #[error("{0}")]
    WritesRefused(WritesRefused),

    /// An extent that cannot be reserved or released as asked.
    #[error("extent {start_block}+{block_count} {problem}")]
    BadExtent {
        /// Its first block.
        start_block: u64,
        /// Its length.
        block_count: u32,
        /// What is wrong with it.
        problem: &'static str,
    },

    /// The WAL ring holds no room for the write.
    #[error("write-ahead log full: {used_blocks} of {ring_blocks} blocks hold records not yet flushed to tables; flush the memtable")]
    WalFull {
        /// Blocks holding records not yet in tables.
        used_blocks: u64,
        /// Blocks of the ring.
        ring_blocks: u64,
    },

    /// A batch too large for one log record.
    #[error("record of {len_bytes} bytes exceeds the limit of {max_bytes} bytes")]
    RecordTooLarge {
        /// Its encoded size.
        len_bytes: usize,
        /// The limit.
        max_bytes: usize,
    },

    /// A key, value, range or name the store refuses.
    #[error("bad input: {0}")]
    BadInput(String),

    /// No keyspace of this name or id.
    #[error("unknown keyspace {name:?}; known: {known}")]
    UnknownKeyspace {
        /// The name asked for.
        name: String,
        /// The keyspaces there are.
        known: String,
    },

    /// Damage before the log's end that recovery may not pass over unasked.
    #[error(
        "the write-ahead log is damaged before its end: {} fail{} their checks, yet log block {proven_by} \
         was written after they were durable, so they hold acknowledged writes. Nothing was changed. \
         Choose a recovery and open again: `--recover-wal point-in-time` keeps the log up to the first \
         damaged block and drops everything after it; `--recover-wal skip-damaged` keeps every intact \
         block and drops only the records in damaged ones (from Rust: StoreConfig::wal_recovery)",
        DamagedBlock::list(damaged),
        if damaged.len() == 1 { "s" } else { "" }
    )]
    WalDamaged {
        /// The damaged blocks.
        damaged: Vec<DamagedBlock>,
        /// A later block whose durable mark proves they held acknowledged writes.
        proven_by: u64,
    },

    /// A block that fails its checks.
    #[error("corrupt {what} at store block {block} (LBA {lba}): {reason}")]
    Corrupt {
        /// What the block is (manifest block, table footer, ...).
        what: &'static str,
        /// Its store block.
        block: u64,
        /// Its LBA on its device.
        lba: u64,
        /// What is wrong.
        reason: String,
    },
}

/// A log block that failed its checks where the log proves it was durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedBlock {
    /// Log block sequence.
    pub seq: u64,
    /// Store block, and the LBA on its device.
    pub block: u64,
    /// The LBA of that store block on its device.
    pub lba: u64,
}

impl DamagedBlock {
    /// "log block 7 (store block 12, LBA 96)", the first few of a list.
    fn list(blocks: &[DamagedBlock]) -> String {
        const SHOWN: usize = 4;
        let mut s: Vec<String> = blocks
            .iter()
            .take(SHOWN)
            .map(|d| {
                format!(
                    "log block {} (store block {}, LBA {})",
                    d.seq, d.block, d.lba
                )
            })
            .collect();
        if blocks.len() > SHOWN {
            s.push(format!("{} more", blocks.len() - SHOWN));
        }
        s.join(", ")
    }
}

/// Why writes are refused ([`StoreError::WritesRefused`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WritesRefused {
    /// Free space went below the reserve and is not yet back above half as
    /// much again: only deletes are taken.
    SpaceLow {
        /// Free bytes on the device set.
        free_bytes: u64,
        /// Bytes kept for flushes and compactions.
        reserve_bytes: u64,
        /// Free bytes at which writes resume (the reserve and half of it
        /// again).
        resume_bytes: u64,
        /// Bytes of the device set.
        device_bytes: u64,
    },
    /// The last flush failed and the memtable is full.
    FlushFailing {
        /// Why the flush failed.
        why: String,
    },
}

impl std::fmt::Display for WritesRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const MIB: f64 = (1 << 20) as f64;
        match self {
            WritesRefused::SpaceLow {
                free_bytes,
                reserve_bytes,
                resume_bytes,
                device_bytes,
            } => write!(
                f,
                "device nearly full: {:.1} MiB free of {:.1} MiB, short of the {:.1} MiB kept for flushes \
                 and compactions (writes resume above {:.1} MiB free); only deletes are taken until \
                 compaction frees space (delete keys, or move the store to a larger device)",
                *free_bytes as f64 / MIB,
                *device_bytes as f64 / MIB,
                *reserve_bytes as f64 / MIB,
                *resume_bytes as f64 / MIB
            ),
            WritesRefused::FlushFailing { why } => write!(
                f,
                "writes refused: the memtable is full and writing it to the device failed ({why}); \
                 the flush is retried each second and writes resume once it succeeds"
            ),
        }
    }
}
