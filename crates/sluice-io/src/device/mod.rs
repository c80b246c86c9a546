//! LBA-addressed devices: a namespace of fixed-size logical blocks.
//!
//! Three kinds share one trait: a preallocated regular file opened with
//! O_DIRECT, a raw block device (size and logical block size from the kernel),
//! and memory with fault injection for tests.

mod counts;
mod file;
mod memory;
mod process_view;

pub use counts::{ClassSnapshot, IoCounts, IoCountsSnapshot};
pub use file::{FileDevice, FileOptions};
pub use memory::{MemoryDevice, PowerCutMode, SECTOR_SIZE_BYTES};
pub use process_view::ProcessView;

use crate::error::{IoError, Result};
use std::os::fd::RawFd;

/// Largest single I/O the layer accepts. The kernel caps one read/write at
/// about 2 GiB; we stay well below and let callers split.
pub const MAX_IO_BYTES: u64 = 1 << 30;

/// Size and addressing unit of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Logical block size: the unit of LBAs and of direct I/O.
    pub block_size_bytes: u32,
    /// Blocks the device holds.
    pub block_count: u64,
}

impl Geometry {
    /// The device's size.
    pub fn size_bytes(&self) -> u64 {
        self.block_count * self.block_size_bytes as u64
    }

    /// Checks one I/O against the device: length a whole number of blocks,
    /// within bounds, and the buffer aligned for direct I/O.
    pub fn check_io(&self, lba: u64, len_bytes: u64, buf_addr: usize) -> Result<()> {
        let bs = self.block_size_bytes as u64;
        if len_bytes == 0 || len_bytes > MAX_IO_BYTES {
            return Err(IoError::BadLength {
                len_bytes,
                max_bytes: MAX_IO_BYTES,
            });
        }
        if !len_bytes.is_multiple_of(bs) {
            return Err(IoError::Misaligned {
                what: "I/O length",
                value: len_bytes,
                block_size_bytes: self.block_size_bytes,
            });
        }
        let end_lba = lba.saturating_add(len_bytes / bs);
        if end_lba > self.block_count {
            return Err(IoError::OutOfRange {
                lba,
                len_bytes,
                end_lba,
                block_count: self.block_count,
            });
        }
        if !buf_addr.is_multiple_of(self.block_size_bytes as usize) {
            return Err(IoError::MisalignedBuffer {
                address: buf_addr,
                alignment_bytes: self.block_size_bytes as usize,
            });
        }
        Ok(())
    }

    /// Converts a byte offset to an LBA, refusing offsets inside a block.
    pub fn lba_of_offset(&self, offset_bytes: u64) -> Result<u64> {
        if !offset_bytes.is_multiple_of(self.block_size_bytes as u64) {
            return Err(IoError::Misaligned {
                what: "byte offset",
                value: offset_bytes,
                block_size_bytes: self.block_size_bytes,
            });
        }
        Ok(offset_bytes / self.block_size_bytes as u64)
    }
}

/// Takes an exclusive advisory lock (`flock`) on an open device, trying
/// until `wait` has passed: `Ok(false)` when another open of the same file
/// or block device still holds it. The lock lasts as long as this open
/// (it goes with the descriptor, a crash included); a second lock through
/// the same descriptor succeeds. Store opens use it so that one process
/// at a time has a store open.
pub fn lock_exclusive(fd: RawFd, wait: std::time::Duration) -> std::io::Result<bool> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        // SAFETY: flock takes a descriptor and flags and touches no memory
        // of ours; a bad descriptor comes back as EBADF.
        let rc = unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(true);
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(err);
        }
        if std::time::Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A namespace of logical blocks. Synchronous calls; the engines add queues,
/// batching and priorities on top.
pub trait Device: Send + Sync + std::fmt::Debug {
    /// Block size and block count.
    fn geometry(&self) -> Geometry;

    /// Reads `buf.len()` bytes starting at block `lba`.
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> Result<()>;

    /// Writes `buf` starting at block `lba`. Not durable until `flush`.
    fn write_at(&self, lba: u64, buf: &[u8]) -> Result<()>;

    /// Makes every completed write durable.
    fn flush(&self) -> Result<()>;

    /// The file descriptor the kernel engines submit against, if there is one.
    fn raw_fd(&self) -> Option<RawFd>;

    /// Whether the descriptor was opened with O_DIRECT.
    fn is_direct(&self) -> bool;

    /// A short human description: path or kind.
    fn describe(&self) -> String;

    /// `major:minor` of the block device holding the data, if any.
    fn backing_dev(&self) -> Option<(u32, u32)> {
        None
    }

    /// The requests engines took for this device, if it counts them.
    fn io_counts(&self) -> Option<&IoCounts> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: Geometry = Geometry {
        block_size_bytes: 4096,
        block_count: 100,
    };

    #[test]
    fn check_io_names_each_violation() {
        G.check_io(99, 4096, 8192).unwrap();
        assert!(matches!(
            G.check_io(0, 0, 0),
            Err(IoError::BadLength { .. })
        ));
        assert!(matches!(
            G.check_io(0, 4095, 0),
            Err(IoError::Misaligned { value: 4095, .. })
        ));
        assert!(matches!(
            G.check_io(99, 8192, 0),
            Err(IoError::OutOfRange {
                end_lba: 101,
                block_count: 100,
                ..
            })
        ));
        assert!(matches!(
            G.check_io(u64::MAX, 4096, 0),
            Err(IoError::OutOfRange { .. })
        ));
        assert!(matches!(
            G.check_io(0, 4096, 512),
            Err(IoError::MisalignedBuffer {
                address: 512,
                alignment_bytes: 4096
            })
        ));
    }

    #[test]
    fn offsets_inside_a_block_are_refused() {
        assert_eq!(G.lba_of_offset(8192).unwrap(), 2);
        let err = G.lba_of_offset(8193).unwrap_err();
        assert!(
            err.to_string().contains("8193") && err.to_string().contains("4096"),
            "{err}"
        );
    }
}
