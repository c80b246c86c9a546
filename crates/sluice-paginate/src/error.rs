use std::path::PathBuf;

pub type Result<T> = std::result::Result<T, Error>;

/// What went wrong, said so that the reader knows what to do next.
#[derive(Debug, thiserror::Error)]
pub enum Error {
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
    #[error(
        "device {path} holds {size_bytes} bytes; this export needs about {needed_bytes} bytes ({detail}); use a larger device (or a new file: it is created at the size needed)"
    )]
    DeviceTooSmall {
        path: PathBuf,
        size_bytes: u64,
        needed_bytes: u64,
        detail: String,
    },
    #[error("page {seq} of slice {slice} at LBA {lba} is corrupt: CRC32C {computed:#010x}, the manifest records {recorded:#010x}")]
    CorruptPage {
        slice: u32,
        seq: u32,
        lba: u64,
        computed: u32,
        recorded: u32,
    },
    #[error("page {seq} of slice {slice} at LBA {lba} is not valid JSON of hits: {detail}")]
    MalformedPage {
        slice: u32,
        seq: u32,
        lba: u64,
        detail: String,
    },
    /// The export was stopped (a signal or the caller) before it finished.
    #[error("{0}")]
    Incomplete(String),
}
