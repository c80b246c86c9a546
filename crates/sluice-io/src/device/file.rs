//! Devices backed by a file descriptor: a preallocated regular file or a raw
//! block device.

use super::{Device, Geometry};
use crate::error::{IoError, Result};
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

// From <linux/fs.h>: _IOR(0x12, 114, size_t) and _IO(0x12, 104).
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKSSZGET: libc::c_ulong = 0x1268;

/// How a file-backed device is opened.
#[derive(Debug, Clone)]
pub struct FileOptions {
    /// Open with O_DIRECT (no page cache). The default; turn it off only for
    /// the buffered baseline.
    pub direct: bool,
    /// Logical block size of a regular file (block devices report their own).
    pub block_size_bytes: u32,
    /// Refuse a device smaller than this.
    pub min_size_bytes: u64,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            direct: true,
            block_size_bytes: 4096,
            min_size_bytes: 0,
        }
    }
}

/// A regular file or block device addressed in logical blocks.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    path: PathBuf,
    geometry: Geometry,
    direct: bool,
    is_block_device: bool,
    io_counts: super::IoCounts,
}

impl FileDevice {
    /// Creates (or grows) a regular file of `size_bytes`, preallocated with
    /// fallocate so that later writes never allocate, and opens it.
    pub fn create(path: &Path, size_bytes: u64, options: &FileOptions) -> Result<Self> {
        check_block_size(path, options.block_size_bytes)?;
        if size_bytes == 0 || !size_bytes.is_multiple_of(options.block_size_bytes as u64) {
            return Err(IoError::Misaligned {
                what: "device size",
                value: size_bytes,
                block_size_bytes: options.block_size_bytes,
            });
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|e| IoError::os("create directory", parent, e))?;
        }
        let file = open_file(path, options.direct, true)?;
        let current = file
            .metadata()
            .map_err(|e| IoError::os("stat", path, e))?
            .len();
        if current < size_bytes {
            // SAFETY: plain syscall on a descriptor we own; no memory is passed.
            let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size_bytes as libc::off_t) };
            if rc != 0 {
                return Err(IoError::os(
                    "fallocate",
                    path,
                    std::io::Error::last_os_error(),
                ));
            }
        }
        Self::from_file(file, path, options)
    }

    /// Opens an existing regular file or block device.
    pub fn open(path: &Path, options: &FileOptions) -> Result<Self> {
        let file = open_file(path, options.direct, false)?;
        Self::from_file(file, path, options)
    }

    fn from_file(file: File, path: &Path, options: &FileOptions) -> Result<Self> {
        let meta = file.metadata().map_err(|e| IoError::os("stat", path, e))?;
        let is_block_device = meta.file_type().is_block_device();
        let (size_bytes, block_size_bytes) = if is_block_device {
            block_device_geometry(&file, path)?
        } else if meta.file_type().is_file() {
            check_block_size(path, options.block_size_bytes)?;
            (meta.len(), options.block_size_bytes)
        } else {
            return Err(IoError::BadDevice {
                path: path.into(),
                reason: "neither a regular file nor a block device".into(),
            });
        };
        if size_bytes < options.min_size_bytes || size_bytes < block_size_bytes as u64 {
            return Err(IoError::DeviceTooSmall {
                path: path.into(),
                size_bytes,
                needed_bytes: options.min_size_bytes.max(block_size_bytes as u64),
            });
        }
        Ok(FileDevice {
            file,
            path: path.into(),
            geometry: Geometry {
                block_size_bytes,
                block_count: size_bytes / block_size_bytes as u64,
            },
            direct: options.direct,
            is_block_device,
            io_counts: super::IoCounts::default(),
        })
    }

    /// The file or block device opened.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether it is a block device (else a regular file).
    pub fn is_block_device(&self) -> bool {
        self.is_block_device
    }
}

fn check_block_size(path: &Path, block_size_bytes: u32) -> Result<()> {
    if !(512..=65536).contains(&block_size_bytes) || !block_size_bytes.is_power_of_two() {
        return Err(IoError::BadDevice {
            path: path.into(),
            reason: format!(
                "logical block size {block_size_bytes} is not a power of two between 512 and 65536"
            ),
        });
    }
    Ok(())
}

fn open_file(path: &Path, direct: bool, create: bool) -> Result<File> {
    let mut opts = OpenOptions::new();
    opts.read(true).write(true).create(create);
    if direct {
        opts.custom_flags(libc::O_DIRECT);
    }
    opts.open(path).map_err(|e| {
        if direct && e.raw_os_error() == Some(libc::EINVAL) {
            IoError::BadDevice {
                path: path.into(),
                reason: "the filesystem refuses O_DIRECT (tmpfs does); put the device on a disk-backed filesystem or a block device".into(),
            }
        } else {
            IoError::os("open", path, e)
        }
    })
}

fn block_device_geometry(file: &File, path: &Path) -> Result<(u64, u32)> {
    let mut size_bytes: u64 = 0;
    let mut sector_bytes: libc::c_int = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points
    // to a live local of that type.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size_bytes as *mut u64) };
    if rc != 0 {
        return Err(IoError::os(
            "ioctl BLKGETSIZE64",
            path,
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: BLKSSZGET writes one int through the pointer, a live local.
    let rc = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            BLKSSZGET,
            &mut sector_bytes as *mut libc::c_int,
        )
    };
    if rc != 0 {
        return Err(IoError::os(
            "ioctl BLKSSZGET",
            path,
            std::io::Error::last_os_error(),
        ));
    }
    Ok((size_bytes, sector_bytes as u32))
}

impl Device for FileDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn read_at(&self, lba: u64, buf: &mut [u8]) -> Result<()> {
        self.geometry
            .check_io(lba, buf.len() as u64, buf.as_ptr() as usize)?;
        let offset = lba * self.geometry.block_size_bytes as u64;
        let mut done = 0usize;
        while done < buf.len() {
            let rest = &mut buf[done..];
            // SAFETY: rest is a valid writable slice for its whole length.
            let n = unsafe {
                libc::pread(
                    self.file.as_raw_fd(),
                    rest.as_mut_ptr().cast(),
                    rest.len(),
                    (offset + done as u64) as libc::off_t,
                )
            };
            if n < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(IoError::from_errno(
                    "read",
                    lba,
                    err.raw_os_error().unwrap_or(0),
                ));
            }
            if n == 0 {
                return Err(IoError::ShortTransfer {
                    op: "read",
                    lba,
                    done_bytes: done,
                    len_bytes: buf.len(),
                });
            }
            done += n as usize;
        }
        Ok(())
    }

    fn write_at(&self, lba: u64, buf: &[u8]) -> Result<()> {
        self.geometry
            .check_io(lba, buf.len() as u64, buf.as_ptr() as usize)?;
        let offset = lba * self.geometry.block_size_bytes as u64;
        let mut done = 0usize;
        while done < buf.len() {
            let rest = &buf[done..];
            // SAFETY: rest is a valid readable slice for its whole length.
            let n = unsafe {
                libc::pwrite(
                    self.file.as_raw_fd(),
                    rest.as_ptr().cast(),
                    rest.len(),
                    (offset + done as u64) as libc::off_t,
                )
            };
            if n < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(IoError::from_errno(
                    "write",
                    lba,
                    err.raw_os_error().unwrap_or(0),
                ));
            }
            done += n as usize;
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| IoError::os("fdatasync", &self.path, e))
    }

    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.file.as_raw_fd())
    }

    fn is_direct(&self) -> bool {
        self.direct
    }

    fn backing_dev(&self) -> Option<(u32, u32)> {
        use std::os::unix::fs::MetadataExt;
        let meta = self.file.metadata().ok()?;
        let dev = if self.is_block_device {
            meta.rdev()
        } else {
            meta.dev()
        };
        Some((libc::major(dev), libc::minor(dev)))
    }

    fn io_counts(&self) -> Option<&super::IoCounts> {
        Some(&self.io_counts)
    }

    fn describe(&self) -> String {
        let kind = if self.is_block_device {
            "block device"
        } else {
            "file"
        };
        format!(
            "{kind} {} ({} blocks of {} bytes{})",
            self.path.display(),
            self.geometry.block_count,
            self.geometry.block_size_bytes,
            if self.direct {
                ", O_DIRECT"
            } else {
                ", buffered"
            }
        )
    }
}
