//! What the target's tests share: a target on two file devices, and a
//! host's admin and I/O queue connected to it.
#![allow(dead_code)] // each test binary uses its own part

use sluice_io::{FileDevice, FileOptions};
use sluice_nvmf::controller::{Namespace, Subsystem};
use sluice_nvmf::initiator::QueueConnection;
use sluice_nvmf::pdu::Digests;
use sluice_nvmf::target::{serve, TargetConfig};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub const NQN: &str = "nqn.2026-11.io.sluice:test";
pub const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:test-host";
pub const BLOCK: u32 = 4096;
pub const DEVICE_BYTES: u64 = 16 << 20;

pub struct Target {
    pub address: String,
    pub subsystem: Arc<Subsystem>,
    stop: Arc<AtomicBool>,
    _dir: tempfile::TempDir,
}

impl Drop for Target {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

pub fn start(allowed: Vec<String>) -> Target {
    start_with(allowed, |s, _| s)
}

/// A target whose connections all share one worker thread: the case where
/// one connection's wait could hold up another's.
pub fn start_with(
    allowed: Vec<String>,
    finish: impl FnOnce(Subsystem, std::net::SocketAddr) -> Subsystem,
) -> Target {
    start_configured(
        allowed,
        finish,
        TargetConfig {
            workers: 1,
            ..TargetConfig::default()
        },
    )
}

pub fn start_configured(
    allowed: Vec<String>,
    finish: impl FnOnce(Subsystem, std::net::SocketAddr) -> Subsystem,
    config: TargetConfig,
) -> Target {
    let dir = tempfile::tempdir().unwrap();
    let namespaces = (0..2)
        .map(|i| {
            let path = dir.path().join(format!("ns{i}.dev"));
            let dev = FileDevice::create(&path, DEVICE_BYTES, &FileOptions::default()).unwrap();
            Namespace::new(Arc::new(dev)).unwrap()
        })
        .collect();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let bound = listener.local_addr().unwrap();
    let address = bound.to_string();
    let subsystem = Arc::new(finish(
        Subsystem::new(NQN.into(), namespaces, allowed),
        bound,
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let served = subsystem.clone();
    std::thread::spawn(move || serve(listener, served, config, s));
    Target {
        address,
        subsystem,
        stop,
        _dir: dir,
    }
}

/// An admin queue, connected and enabled, and one I/O queue.
pub fn connect(t: &Target, digests: Digests) -> (QueueConnection, QueueConnection) {
    let mut admin = QueueConnection::open(&t.address, digests).unwrap();
    let cntlid = admin.connect(NQN, HOST, 0, 0xffff, 5000).unwrap();
    admin.enable().unwrap();
    assert_eq!(admin.set_queue_count(2).unwrap(), 2);
    let mut io = QueueConnection::open(&t.address, digests).unwrap();
    io.connect(NQN, HOST, 1, cntlid, 0).unwrap();
    (admin, io)
}

/// No digests, then header and data digests: what the data-path tests run
/// with.
pub fn no_digests_then_both() -> [Digests; 2] {
    let both = Digests {
        header: true,
        data: true,
    };
    [Digests::default(), both]
}

/// The process's resident memory, bytes.
pub fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb << 10
}

/// Threads of this process named `name` (test threads and other tests'
/// targets included).
pub fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}
