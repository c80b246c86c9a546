//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// Deterministic bytes for a (length, seed): what was written can be checked.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A directory on a disk-backed filesystem (O_DIRECT does not work on tmpfs).
pub fn disk_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

/// Records that `test` could not run here, and why: the harness counts a
/// test that returns as passed, so scripts/test reads these files, lists
/// the reasons and counts the tests as skipped in its closing line.
pub fn skipped(test: &str, reason: &str) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("skipped");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(test), reason).unwrap();
    eprintln!("SKIPPED {test}: {reason}");
}

/// A loop device over a temporary file, detached on drop.
pub struct LoopDevice {
    pub path: PathBuf,
    _backing: tempfile::NamedTempFile,
}

impl LoopDevice {
    /// Attaches a loop device of `size_bytes`. Loop devices need root: when
    /// the test does not run as root it says so and returns None (CI runs as
    /// root, so there the test always runs).
    pub fn attach(test: &str, size_bytes: u64) -> Option<Self> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            skipped(
                test,
                "loop devices need root; run the tests as root to cover raw block devices",
            );
            return None;
        }
        let backing = tempfile::NamedTempFile::new_in(disk_dir()).unwrap();
        backing.as_file().set_len(size_bytes).unwrap();
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(backing.path())
            .output()
            .expect("losetup (util-linux) must be installed");
        assert!(
            out.status.success(),
            "losetup failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
        Some(LoopDevice {
            path,
            _backing: backing,
        })
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.path).status();
    }
}
