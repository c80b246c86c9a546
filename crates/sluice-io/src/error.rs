//! One error type for the I/O layer. Every variant names the value that was
//! wrong and the requirement it broke, so a caller can print it as is.

use std::path::PathBuf;

/// Result alias for the I/O layer.
pub type Result<T, E = IoError> = std::result::Result<T, E>;

/// Everything that can go wrong below the store: bad requests, devices,
/// the kernel, and the pool's limits.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// An LBA or a length that is not a whole number of device blocks.
    #[error("{what} {value} is not a multiple of the device's logical block size {block_size_bytes} bytes; pad or align it")]
    Misaligned {
        /// What was misaligned ("length", "offset", ...).
        what: &'static str,
        /// Its value.
        value: u64,
        /// The device's logical block size.
        block_size_bytes: u32,
    },

    /// A buffer direct I/O cannot use.

    #[error("buffer address {address:#x} is not aligned to {alignment_bytes} bytes, which direct I/O requires; allocate it from the buffer pool")]
    MisalignedBuffer {
        /// The buffer's address.
        address: usize,
        /// The alignment direct I/O needs.
        alignment_bytes: usize,
    },

    /// An I/O that runs past the end of the device.

    #[error("I/O of {len_bytes} bytes at LBA {lba} ends at block {end_lba}, beyond the device's {block_count} blocks")]
    OutOfRange {
        /// First block of the I/O.
        lba: u64,
        /// Its length.
        len_bytes: u64,
        /// The block it would end at (exclusive).
        end_lba: u64,
        /// The device's blocks.
        block_count: u64,
    },

    /// An empty I/O, or one longer than a request may be.

    #[error(
        "I/O length must be at least one block and at most {max_bytes} bytes, got {len_bytes}"
    )]
    BadLength {
        /// The length asked for.
        len_bytes: u64,
        /// The most one request may move.
        max_bytes: u64,
    },

    /// A device smaller than what is to be written on it.

    #[error("device {path} holds {size_bytes} bytes but {needed_bytes} are needed; give a larger file or device")]
    DeviceTooSmall {
        /// The device's file or block device.
        path: PathBuf,
        /// Its size.
        size_bytes: u64,
        /// The size needed.
        needed_bytes: u64,
    },

    /// A device that cannot be used (not a file or block device, wrong
    /// geometry, ...).

    #[error("device {path}: {reason}")]
    BadDevice {
        /// The device's path.
        path: PathBuf,
        /// Why it cannot be used.
        reason: String,
    },

    /// A system call on a device failed.

    /// The OS error is part of the message (not a separate cause), so a
    /// printed error chain says it once.
    #[error("{op} on {path} failed: {error}")]
    Os {
        /// The operation ("open", "pread", "fdatasync", ...).
        op: &'static str,
        /// The device's path.
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },

    /// The device reported an error for these blocks.

    #[error("device I/O error at LBA {lba}: {reason}")]
    Media {
        /// The first block of the failed I/O.
        lba: u64,
        /// What the device or kernel said.
        reason: String,
    },

    /// A read or write that moved fewer bytes than asked.

    #[error("short {op}: {done_bytes} of {len_bytes} bytes at LBA {lba}")]
    ShortTransfer {
        /// "read" or "write".
        op: &'static str,
        /// The first block of the I/O.
        lba: u64,
        /// Bytes moved.
        done_bytes: usize,
        /// Bytes asked for.
        len_bytes: usize,
    },

    /// The kernel lacks something the configuration asks for.

    #[error("kernel feature missing: {feature}: {reason}")]
    FeatureMissing {
        /// The feature (SQPOLL, IOPOLL, fixed buffers, ...).
        feature: &'static str,
        /// What the kernel answered.
        reason: String,
    },

    /// RLIMIT_MEMLOCK is below what the pool would pin.

    #[error("pinning {requested_bytes} bytes needs RLIMIT_MEMLOCK of at least {requested_bytes}, but the limit is {limit_bytes}; raise it (ulimit -l, or LimitMEMLOCK= in a unit) or lower the pool's max_pinned_bytes")]
    MemlockTooLow {
        /// Bytes the pool would pin.
        requested_bytes: u64,
        /// The process's limit.
        limit_bytes: u64,
    },

    /// The pool's pinned-memory ceiling is reached.

    #[error("buffer pool exhausted: {requested_bytes} bytes wanted, {pinned_bytes} of max {max_pinned_bytes} pinned bytes in use{waited}; free buffers, raise max_pinned_bytes, or use wait mode")]
    PoolExhausted {
        /// Bytes the allocation wanted.
        requested_bytes: u64,
        /// Bytes pinned now.
        pinned_bytes: u64,
        /// The ceiling.
        max_pinned_bytes: u64,
        /// How long the allocation waited first.
        waited: WaitNote,
    },

    /// A configuration value out of range, or values that conflict.

    #[error("invalid configuration: {0}")]
    Config(String),

    /// The engine holds `queue_depth` requests already.
    #[error("engine queue is full ({queue_depth} requests in flight or pending); reap completions first")]
    QueueFull {
        /// The engine's queue depth.
        queue_depth: usize,
    },

    /// The engine can take no more work (its ring or threads are gone).

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
