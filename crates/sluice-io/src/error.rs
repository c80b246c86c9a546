//! One error type for the I/O layer. Every variant names the value that was
//! wrong and the requirement it broke, so a caller can print it as is.

use std::path::PathBuf;

/// Result alias for the I/O layer.
pub type Result<T, E = IoError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("{what} {value} is not a multiple of the device's logical block size {block_size_bytes} bytes; pad or align it")]
    Misaligned {
        what: &'static str,
        value: u64,
        block_size_bytes: u32,
    },

    #[error("buffer address {address:#x} is not aligned to {alignment_bytes} bytes, which direct I/O requires; allocate it from the buffer pool")]
    MisalignedBuffer {
        address: usize,
        alignment_bytes: usize,
    },

    #[error("I/O of {len_bytes} bytes at LBA {lba} ends at block {end_lba}, beyond the device's {block_count} blocks")]
    OutOfRange {
        lba: u64,
        len_bytes: u64,
        end_lba: u64,
        block_count: u64,
    },

    #[error(
        "I/O length must be at least one block and at most {max_bytes} bytes, got {len_bytes}"
    )]
    BadLength { len_bytes: u64, max_bytes: u64 },

    #[error("device {path} holds {size_bytes} bytes but {needed_bytes} are needed; give a larger file or device")]
    DeviceTooSmall {
        path: PathBuf,
        size_bytes: u64,
        needed_bytes: u64,
    },

    #[error("device {path}: {reason}")]
    BadDevice { path: PathBuf, reason: String },

    /// The OS error is part of the message (not a separate cause), so a
    /// printed error chain says it once.
    #[error("{op} on {path} failed: {error}")]
    Os {
        op: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },

    #[error("device I/O error at LBA {lba}: {reason}")]
    Media { lba: u64, reason: String },

    #[error("short {op}: {done_bytes} of {len_bytes} bytes at LBA {lba}")]
    ShortTransfer {
        op: &'static str,
        lba: u64,
        done_bytes: usize,
        len_bytes: usize,
    },

    #[error("kernel feature missing: {feature}: {reason}")]
    FeatureMissing {
        feature: &'static str,
        reason: String,
    },

    #[error("pinning {requested_bytes} bytes needs RLIMIT_MEMLOCK of at least {requested_bytes}, but the limit is {limit_bytes}; raise it (ulimit -l, or LimitMEMLOCK= in a unit) or lower the pool's max_pinned_bytes")]
    MemlockTooLow {
        requested_bytes: u64,
        limit_bytes: u64,
    },

    #[error("buffer pool exhausted: {requested_bytes} bytes wanted, {pinned_bytes} of max {max_pinned_bytes} pinned bytes in use{waited}; free buffers, raise max_pinned_bytes, or use wait mode")]
    PoolExhausted {
        requested_bytes: u64,
        pinned_bytes: u64,
        max_pinned_bytes: u64,
        waited: WaitNote,
    },

    #[error("invalid configuration: {0}")]
    Config(String),

    #[error("engine queue is full ({queue_depth} requests in flight or pending); reap completions first")]
    QueueFull { queue_depth: usize },

    #[error("engine stopped: {0}")]
    EngineStopped(String),
}

/// How long an allocation waited before it failed (empty when it did not wait).
#[derive(Debug, Clone, Copy, Default)]
pub struct WaitNote(pub Option<u64>);

impl std::fmt::Display for WaitNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(ms) => write!(f, " after waiting {ms} ms"),
            None => Ok(()),
        }
    }
}

impl IoError {
    pub(crate) fn os(op: &'static str, path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        IoError::Os {
            op,
            path: path.into(),
            error,
        }
    }

    /// An error from a completion, kept cloneable-ish by re-rendering OS errors.
    pub(crate) fn from_errno(op: &'static str, lba: u64, errno: i32) -> Self {
        IoError::Media {
            lba,
            reason: format!("{op} failed: {}", std::io::Error::from_raw_os_error(errno)),
        }
    }
}
