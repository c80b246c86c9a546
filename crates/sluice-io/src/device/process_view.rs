//! A memory device as one process sees it, for crash tests of whatever
//! runs above a device (the store, the server).

use super::{Device, MemoryDevice};
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
    /// A live view of `mem`.
    pub fn new(mem: &Arc<MemoryDevice>) -> Arc<Self> {
        Arc::new(ProcessView {
            mem: mem.clone(),
            dead: std::sync::RwLock::new(false),
        })
    }

    /// The process dies: writes under way land, later ones never do.
    pub fn kill(&self) {
        *self.dead.write().unwrap_or_else(|p| p.into_inner()) = true;
    }
}

impl Device for ProcessView {
    fn geometry(&self) -> crate::Geometry {
        self.mem.geometry()
    }
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> crate::Result<()> {
        self.mem.read_at(lba, buf)
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> crate::Result<()> {
        let dead = self.dead.read().unwrap_or_else(|p| p.into_inner());
        if *dead {
            return Ok(());
        }
        self.mem.write_at(lba, buf)
    }
    fn flush(&self) -> crate::Result<()> {
        let dead = self.dead.read().unwrap_or_else(|p| p.into_inner());
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
    fn io_counts(&self) -> Option<&super::IoCounts> {
        self.mem.io_counts()
    }

    fn describe(&self) -> String {
        self.mem.describe()
    }
}
