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

    #[error("corrupt {what} at store block {block} (LBA {lba}): {reason}")]
    Corrupt {
        what: &'static str,
        block: u64,
        lba: u64,
        reason: String,
    },
}
