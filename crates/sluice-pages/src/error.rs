use std::path::PathBuf;

/// Result alias of pagination.
pub type Result<T> = std::result::Result<T, Error>;

/// What went wrong, said so that the reader knows what to do next.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The device I/O failed.
    #[error(transparent)]
    Io(#[from] sluice_io::IoError),
    /// The source (search engine) refused, could not be reached, or answered
    /// something we cannot use.
    #[error("{0}")]
    Source(String),
    /// A block of the export device is not what the format says.
    #[error("{0}")]
    Format(String),
    /// Options that cannot work together, or a value out of range.
    #[error("{0}")]
    Config(String),
    /// The caller interrupted an export; its checkpoints are durable.
    #[error("export interrupted; every page written so far is durable: finish it with `sluice export --resume` (resume=True in Python)")]
    Interrupted,
    /// The device is too small for the export's layout.
    #[error(
        "device {path} holds {size_bytes} bytes; this export needs about {needed_bytes} bytes ({detail}); use a larger device (or a new file: it is created at the size needed)"
    )]
    DeviceTooSmall {
        /// The device.
        path: PathBuf,
        /// Its size.
        size_bytes: u64,
        /// The size the export needs.
        needed_bytes: u64,
        /// How that size was reckoned.
        detail: String,
    },
    /// A page whose checksum does not match its manifest entry.
    #[error("page {seq} of slice {slice} at LBA {lba} is corrupt: CRC32C {computed:#010x}, the manifest records {recorded:#010x}")]
    CorruptPage {
        /// The page's slice.
        slice: u32,
        /// Its number in the slice.
        seq: u32,
        /// Its first block.
        lba: u64,
        /// The CRC32C of what was read.
        computed: u32,
        /// The CRC32C the manifest records.
        recorded: u32,
    },
    /// A page whose checksum holds but whose bytes are not a JSON array of hits.
    #[error("page {seq} of slice {slice} at LBA {lba} is not valid JSON of hits: {detail}")]
    MalformedPage {
        /// The page's slice.
        slice: u32,
        /// Its number in the slice.
        seq: u32,
        /// Its first block.
        lba: u64,
        /// What the parser said.
        detail: String,
    },
    /// The export was stopped (a signal or the caller) before it finished.
    #[error("{0}")]
    Incomplete(String),
}
