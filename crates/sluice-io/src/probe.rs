//! What this kernel and process can do: io_uring opcodes and set-up flags,
//! the memlock limit, the memory limit of the process's control group.
//! Probed once; engines decide their fallbacks from it.

use crate::error::{IoError, Result};
use io_uring::{opcode, IoUring, Probe};
use std::sync::OnceLock;

/// RLIMIT_MEMLOCK and whether it applies to us.
#[derive(Debug, Clone, Copy)]
pub struct MemlockLimits {
    /// Soft limit in bytes; `u64::MAX` when unlimited.
    pub limit_bytes: u64,
    /// CAP_IPC_LOCK lifts the limit (for mlock and, since Linux 5.12, for
    /// io_uring buffer registration).
    pub cap_ipc_lock: bool,
}

/// This process's RLIMIT_MEMLOCK and whether it has CAP_IPC_LOCK.
pub fn memlock() -> MemlockLimits {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit through a pointer to a live local.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) };
    let limit_bytes = if rc != 0 || rl.rlim_cur == libc::RLIM_INFINITY {
        u64::MAX
    } else {
        rl.rlim_cur
    };
    MemlockLimits {
        limit_bytes,
        cap_ipc_lock: has_capability(14), // CAP_IPC_LOCK
    }
}

fn has_capability(bit: u32) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << bit) != 0)
}

/// Refuses a pool whose ceiling the memlock limit could not hold.
pub fn check_memlock(requested_bytes: u64, limits: &MemlockLimits) -> Result<()> {
    if limits.cap_ipc_lock || requested_bytes <= limits.limit_bytes {
        return Ok(());
    }
    Err(IoError::MemlockTooLow {
        requested_bytes,
        limit_bytes: limits.limit_bytes,
    })
}

/// io_uring features Sluice uses.
#[derive(Debug, Clone)]
pub struct UringSupport {
    /// IORING_OP_READ_FIXED.
    pub read_fixed: bool,
    /// IORING_OP_WRITE_FIXED.
    pub write_fixed: bool,
    /// IORING_OP_READ.
    pub read: bool,
    /// IORING_OP_WRITE.
    pub write: bool,
    /// IORING_OP_FSYNC.
    pub fsync: bool,
    /// Sparse buffer table with updates (Linux 5.19).
    pub buffers_sparse: bool,
}

impl UringSupport {
    /// Why SQPOLL cannot be used, if it cannot. Probed on first asking, once
    /// per process: the probe starts (and stops) a kernel polling thread,
    /// which a process that never asks for SQPOLL should not pay for.
    pub fn sqpoll_error(&self) -> Option<&'static str> {
        static SQPOLL: OnceLock<Option<String>> = OnceLock::new();
        SQPOLL
            .get_or_init(|| {
                IoUring::<io_uring::squeue::Entry>::builder()
                    .setup_sqpoll(10)
                    .build(4)
                    .err()
                    .map(|e| format!("SQPOLL set-up refused: {e}"))
            })
            .as_deref()
    }
}

/// Result of probing the kernel.
#[derive(Debug, Clone)]
pub struct KernelProbe {
    /// The io_uring support, or why io_uring cannot be used at all.
    pub uring: std::result::Result<UringSupport, String>,
    /// The memory-locking limit buffer registration counts against.
    pub memlock: MemlockLimits,
    /// `uname -r`.
    pub kernel_release: String,
}

impl KernelProbe {
    /// The first missing feature the uring engine cannot do without.
    pub fn uring_missing(&self) -> Option<(&'static str, String)> {
        match &self.uring {
            Err(why) => Some(("io_uring", why.clone())),
            Ok(u) => [
                ("IORING_OP_READ", u.read),
                ("IORING_OP_WRITE", u.write),
                ("IORING_OP_FSYNC", u.fsync),
            ]
            .into_iter()
            .find(|(_, ok)| !ok)
            .map(|(name, _)| {
                (
                    name,
                    format!("kernel {} lacks the opcode", self.kernel_release),
                )
            }),
        }
    }
}

/// Probes once per process.
pub fn kernel() -> &'static KernelProbe {
    static PROBE: OnceLock<KernelProbe> = OnceLock::new();
    PROBE.get_or_init(run_probe)
}

fn run_probe() -> KernelProbe {
    KernelProbe {
        uring: probe_uring(),
        memlock: memlock(),
        kernel_release: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into()),
    }
}

fn probe_uring() -> std::result::Result<UringSupport, String> {
    let ring = IoUring::new(4).map_err(|e| format!("io_uring_setup failed: {e}"))?;
    let mut probe = Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|e| format!("IORING_REGISTER_PROBE failed (kernel older than 5.6?): {e}"))?;
    let buffers_sparse = ring.submitter().register_buffers_sparse(4).is_ok();
    Ok(UringSupport {
        read_fixed: probe.is_supported(opcode::ReadFixed::CODE),
        write_fixed: probe.is_supported(opcode::WriteFixed::CODE),
        read: probe.is_supported(opcode::Read::CODE),
        write: probe.is_supported(opcode::Write::CODE),
        fsync: probe.is_supported(opcode::Fsync::CODE),
        buffers_sparse,
    })
}

/// Whether the block device `major:minor` has poll queues (IOPOLL works).
pub fn device_has_poll_queues(major: u32, minor: u32) -> bool {
    let base = format!("/sys/dev/block/{major}:{minor}");
    // A partition has no queue/ of its own: look at its parent disk.
    ["queue/io_poll", "../queue/io_poll"].iter().any(|rel| {
        std::fs::read_to_string(format!("{base}/{rel}"))
            .map(|s| s.trim() == "1")
            .unwrap_or(false)
    })
}

/// The tightest memory limit of the control groups this process is in
/// (cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`, the group's own and
/// every parent's), in bytes; None where no limit applies.
pub fn cgroup_memory_limit_bytes() -> Option<u64> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    memory_limit_in(&groups, |path| std::fs::read_to_string(path).ok())
}

/// Limits at or above this mean "no limit" (v1 writes about 2^63 for one).
const NO_MEMORY_LIMIT_BYTES: u64 = 1 << 62;

/// [`cgroup_memory_limit_bytes`] over the text of `/proc/self/cgroup`, with
/// `read` to read the control files.
fn memory_limit_in(groups: &str, read: impl Fn(&str) -> Option<String>) -> Option<u64> {
    let mut tightest: Option<u64> = None;
    for line in groups.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (root, file) = if id == "0" && controllers.is_empty() {
            ("/sys/fs/cgroup", "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
        } else {
            continue;
        };
        let mut dir = path.trim_end_matches('/').to_string();
        loop {
            let limit = read(&format!("{root}{dir}/{file}"))
                .and_then(|text| text.trim().parse::<u64>().ok())
                .filter(|&bytes| bytes < NO_MEMORY_LIMIT_BYTES);
            if let Some(bytes) = limit {
                tightest = Some(tightest.map_or(bytes, |t| t.min(bytes)));
            }
            match dir.rfind('/') {
                Some(at) => dir.truncate(at),
                None => break,
            }
        }
    }
    tightest
}

#[cfg(test)]
mod cgroup_tests {
    use super::memory_limit_in;
    use std::collections::HashMap;

    fn limit(groups: &str, files: &[(&str, &str)]) -> Option<u64> {
        let files: HashMap<String, String> = files
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        memory_limit_in(groups, |path| files.get(path).cloned())
    }

    #[test]
    fn a_v1_memory_group_and_its_parents_give_the_tightest_limit() {
        let groups = "9:name=systemd:/\n4:memory:/api/job\n1:cpu:/\n0::/\n";
        let unlimited = "9223372036854771712\n";
        assert_eq!(
            limit(
                groups,
                &[
                    (
                        "/sys/fs/cgroup/memory/api/job/memory.limit_in_bytes",
                        unlimited
                    ),
                    (
                        "/sys/fs/cgroup/memory/api/memory.limit_in_bytes",
                        "268435456\n"
                    ),
                    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", unlimited),
                ]
            ),
            Some(256 << 20)
        );
        assert_eq!(
            limit(
                groups,
                &[(
                    "/sys/fs/cgroup/memory/api/job/memory.limit_in_bytes",
                    unlimited
                )]
            ),
            None
        );
    }

    #[test]
    fn a_v2_group_reads_memory_max_and_max_means_none() {
        let groups = "0::/sluice-big\n";
        assert_eq!(
            limit(
                groups,
                &[("/sys/fs/cgroup/sluice-big/memory.max", "134217728\n")]
            ),
            Some(128 << 20)
        );
        assert_eq!(
            limit(groups, &[("/sys/fs/cgroup/sluice-big/memory.max", "max\n")]),
            None
        );
        assert_eq!(limit("", &[]), None);
    }
}
