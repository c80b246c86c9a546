//! Helpers shared by the store's test binaries.
#![allow(dead_code)] // each test binary uses its own part

use sluice_io::{Device, MemoryDevice};
use std::sync::Arc;

/// The memory device as one process sees it: `kill` is the process dying —
/// it waits for the writes under way (they landed before the death) and
/// drops every later one, as the I/O of a dead process never reaches the
/// device. A store that is only forgotten keeps its engines' threads, whose
/// queued writes would otherwise land after the power cut.
#[derive(Debug)]
pub struct ProcessView {
    mem: Arc<MemoryDevice>,
    dead: std::sync::RwLock<bool>,
}

impl ProcessView {
    pub fn new(mem: &Arc<MemoryDevice>) -> Arc<Self> {
        Arc::new(ProcessView {
            mem: mem.clone(),
            dead: std::sync::RwLock::new(false),
        })
    }

    pub fn kill(&self) {
        *self.dead.write().unwrap() = true;
    }
}

impl Device for ProcessView {
    fn geometry(&self) -> sluice_io::Geometry {
        self.mem.geometry()
    }
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> sluice_io::Result<()> {
        self.mem.read_at(lba, buf)
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> sluice_io::Result<()> {
        let dead = self.dead.read().unwrap();
        if *dead {
            return Ok(());
        }
        self.mem.write_at(lba, buf)
    }
    fn flush(&self) -> sluice_io::Result<()> {
        let dead = self.dead.read().unwrap();
        if *dead {
            return Ok(());
        }
        self.mem.flush()
    }
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    fn is_direct(&self) -> bool {
        self.mem.is_direct()
    }
    fn describe(&self) -> String {
        self.mem.describe()
    }
}
