//! Memory that outlives the process: a file in a memory-backed file system
//! (tmpfs, as `/dev/shm` is), mapped shared.
//!
//! A store instruction puts bytes into the kernel's memory with no system
//! call and no device I/O. They survive the process's death (kill -9, a
//! crash, an abort) and are gone with the machine (a power cut, a reboot):
//! what Redis's `write(2)` to its append-only file promises before its
//! once-a-second `fsync`. The store keeps its write-ahead log's unwritten
//! tail here ("Log mirror" in docs/FORMAT.md).
//!
//! One process at a time: opening takes an exclusive `flock` on the file,
//! and a second opener is refused while the first lives. The file's pages
//! are reserved with `fallocate` when it is sized, so that a full tmpfs
//! refuses the open instead of killing the process with SIGBUS on a later
//! store into a page it could not supply.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

/// `statfs`'s `f_type` of tmpfs (linux/magic.h).
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// Largest kept file: its pages are reserved in memory whole.
pub const MAX_KEPT_BYTES: usize = 1 << 30;

/// A shared mapping of a tmpfs file, held by this process alone.
pub struct KeptMem {
    ptr: NonNull<u8>,
    len_bytes: usize,
    /// Open for as long as the mapping lives: it holds the `flock`.
    file: File,
    path: PathBuf,
}

// SAFETY: the mapping is plain memory owned by this value (no other
// process maps it while the flock is held; see `open`), so moving it to
// another thread is as safe as moving a `Vec<u8>`.
unsafe impl Send for KeptMem {}
// SAFETY: shared references only read; writes need `&mut self`.
unsafe impl Sync for KeptMem {}

impl std::fmt::Debug for KeptMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptMem")
            .field("path", &self.path)
            .field("len_bytes", &self.len_bytes)
            .finish()
    }
}

impl KeptMem {
    /// Opens `path` (created, mode 0600, if absent) and maps it whole: at
    /// its present size if it has one (what an earlier process left there,
    /// to be read back), else at `len_bytes`, reserved in memory. Refuses a
    /// file outside tmpfs (its pages would be written back to a disk), one
    /// another process holds, and sizes over [`MAX_KEPT_BYTES`].
    pub fn open(path: &Path, len_bytes: usize) -> io::Result<KeptMem> {
        if len_bytes == 0 || len_bytes > MAX_KEPT_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a kept memory file of {len_bytes} bytes: give 1 to {MAX_KEPT_BYTES} bytes"
                ),
            ));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| named(path, "cannot open", e))?;
        check_tmpfs(&file, path)?;
        // SAFETY: flock on a descriptor we own; the result is checked.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return Err(named(path, "is held by another process", e));
        }
        let present = file.metadata()?.len() as usize;
        let len_bytes = if present == 0 {
            reserve(&file, path, len_bytes)?;
            len_bytes
        } else {
            present.min(MAX_KEPT_BYTES)
        };
        let ptr = crate::mem::map_shared(file.as_fd(), len_bytes)
            .map_err(|e| named(path, "cannot be mapped", e))?;
        Ok(KeptMem {
            ptr,
            len_bytes,
            file,
            path: path.to_owned(),
        })
    }

    /// Empties the file and maps it again at `len_bytes`, reserved in
    /// memory: whatever it held is gone.
    pub fn recreate(&mut self, len_bytes: usize) -> io::Result<()> {
        if len_bytes == 0 || len_bytes > MAX_KEPT_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a kept memory file of {len_bytes} bytes"),
            ));
        }
        // SAFETY: the mapping made in `open` or here, unmapped once; a
        // failure below leaves `len_bytes` 0 so that drop unmaps nothing.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len_bytes) };
        self.len_bytes = 0;
        self.file.set_len(0)?;
        reserve(&self.file, &self.path, len_bytes)?;
        self.ptr = crate::mem::map_shared(self.file.as_fd(), len_bytes)
            .map_err(|e| named(&self.path, "cannot be mapped", e))?;
        self.len_bytes = len_bytes;
        Ok(())
    }

    /// The file's bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: a live mapping of `len_bytes`, written by no one else:
        // the flock keeps other processes of ours out, and this value is
        // the one mapping in this process.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len_bytes) }
    }

    /// The file's bytes, to write.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for `as_slice`; `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len_bytes) }
    }

    /// Its size.
    pub fn len(&self) -> usize {
        self.len_bytes
    }

    /// Whether it maps nothing (only after a failed [`KeptMem::recreate`]).
    pub fn is_empty(&self) -> bool {
        self.len_bytes == 0
    }

    /// Where it lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Unmaps and deletes the file: its bytes are no longer wanted.
    pub fn remove(self) -> io::Result<()> {
        let path = self.path.clone();
        drop(self);
        std::fs::remove_file(&path)
    }
}

impl Drop for KeptMem {
    fn drop(&mut self) {
        if self.len_bytes > 0 {
            // SAFETY: the mapping made in `open` or `recreate`, unmapped once.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len_bytes) };
        }
    }
}

fn named(path: &Path, what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {what}: {e}", path.display()))
}

fn check_tmpfs(file: &File, path: &Path) -> io::Result<()> {
    // SAFETY: an all-zero statfs is a valid value to be filled in.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs of a descriptor we own into a struct we own.
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) };
    if rc != 0 {
        return Err(named(
            path,
            "cannot stat its file system",
            io::Error::last_os_error(),
        ));
    }
    if st.f_type as i64 != TMPFS_MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: not in a memory-backed file system (tmpfs, such as /dev/shm): its pages would be written back to a disk",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// Sizes the file to `len_bytes` and reserves its pages.
fn reserve(file: &File, path: &Path, len_bytes: usize) -> io::Result<()> {
    // SAFETY: fallocate on a descriptor we own; the result is checked.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len_bytes as libc::off_t) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        let _ = file.set_len(0);
        return Err(named(path, &format!("cannot reserve {len_bytes} bytes"), e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shm_path(name: &str) -> PathBuf {
        PathBuf::from(format!(
            "/dev/shm/sluice-kept-test-{}-{name}",
            std::process::id()
        ))
    }

    #[test]
    fn bytes_written_are_there_for_the_next_opener() {
        let path = shm_path("reopen");
        let _ = std::fs::remove_file(&path);
        let mut m = KeptMem::open(&path, 8192).unwrap();
        assert_eq!(m.len(), 8192);
        m.as_mut_slice()[100..105].copy_from_slice(b"kept!");
        drop(m);
        // Opened again with another size: the present size wins, so that
        // what the file holds can be read back.
        let mut m = KeptMem::open(&path, 4096).unwrap();
        assert_eq!(m.len(), 8192);
        assert_eq!(&m.as_slice()[100..105], b"kept!");
        m.recreate(4096).unwrap();
        assert_eq!(m.len(), 4096);
        assert!(m.as_slice().iter().all(|&b| b == 0));
        m.remove().unwrap();
        assert!(!path.exists());
    }

    #[test]
    fn a_second_holder_and_a_disk_file_are_refused() {
        let path = shm_path("twice");
        let _ = std::fs::remove_file(&path);
        let m = KeptMem::open(&path, 4096).unwrap();
        let e = KeptMem::open(&path, 4096).unwrap_err();
        assert!(e.to_string().contains("held by another process"), "{e}");
        m.remove().unwrap();
        let dir = std::env::temp_dir().join(format!("sluice-kept-disk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let on_disk = dir.join("kept");
        match KeptMem::open(&on_disk, 4096) {
            // /tmp may itself be a tmpfs: then there is nothing to refuse.
            Ok(m) => m.remove().unwrap(),
            Err(e) => assert!(e.to_string().contains("memory-backed"), "{e}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
        assert!(KeptMem::open(&path, 0).is_err());
    }
}
