//! Errors of the store. Each says what was wrong and where.

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("I/O at store block {block}: {error}")]
    Io {
        block: u64,
        error: sluice_io::IoError,
    },

    #[error("{0}")]
    BadDevice(String),

    #[error("{what} is not a Sluice store: {reason}")]
    NotAStore { what: String, reason: String },

    #[error(
        "store format version {found}, this build reads version {supported}; use a matching build"
    )]
    UnsupportedVersion { found: u32, supported: u32 },

    #[error("device full: {needed_blocks} blocks needed, largest free extent {largest_free_blocks} blocks of {free_blocks} free")]
    DeviceFull {
        needed_blocks: u64,
        largest_free_blocks: u64,
        free_blocks: u64,
    },

    #[error("extent {start_block}+{block_count} {problem}")]
    BadExtent {
        start_block: u64,
        block_count: u32,
        problem: &'static str,
    },

    #[error("write-ahead log full: {used_blocks} of {ring_blocks} blocks hold records not yet flushed to tables; flush the memtable")]
    WalFull { used_blocks: u64, ring_blocks: u64 },

    #[error("record of {len_bytes} bytes exceeds the limit of {max_bytes} bytes")]
    RecordTooLarge { len_bytes: usize, max_bytes: usize },

    #[error("bad input: {0}")]
    BadInput(String),

    #[error("unknown keyspace {name:?}; known: {known}")]
    UnknownKeyspace { name: String, known: String },

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
        damaged: Vec<DamagedBlock>,
        proven_by: u64,
    },

    #[error("corrupt {what} at store block {block} (LBA {lba}): {reason}")]
    Corrupt {
        what: &'static str,
        block: u64,
        lba: u64,
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
