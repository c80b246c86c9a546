//! Requests a device's engines took, by priority and kind (the store's
//! and the server's statistics).

use crate::engine::{Op, Priority};
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters for one priority class.
#[derive(Debug, Default)]
struct ClassCounts {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    flushes: AtomicU64,
}

/// Requests an engine admitted for a device, by priority class: counted
/// when the engine takes them, so a failed request counts too.
#[derive(Debug, Default)]
pub struct IoCounts {
    high: ClassCounts,
    low: ClassCounts,
}

/// One priority class's counts at one moment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ClassSnapshot {
    /// Read requests.
    pub reads: u64,
    /// Bytes those reads asked for.
    pub read_bytes: u64,
    /// Write requests.
    pub writes: u64,
    /// Bytes those writes carried.
    pub write_bytes: u64,
    /// Flush requests.
    pub flushes: u64,
}

impl std::ops::AddAssign for ClassSnapshot {
    fn add_assign(&mut self, o: Self) {
        self.reads += o.reads;
        self.read_bytes += o.read_bytes;
        self.writes += o.writes;
        self.write_bytes += o.write_bytes;
        self.flushes += o.flushes;
    }
}

/// [`IoCounts`] at one moment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IoCountsSnapshot {
    /// [`Priority::High`]: log writes and foreground reads.
    pub high: ClassSnapshot,
    /// [`Priority::Low`]: flushes of memtables, compaction, export.
    pub low: ClassSnapshot,
}

impl std::ops::AddAssign for IoCountsSnapshot {
    fn add_assign(&mut self, o: Self) {
        self.high += o.high;
        self.low += o.low;
    }
}

impl IoCounts {
    /// Counts one admitted request of `len_bytes`.
    pub fn record(&self, priority: Priority, op: Op, len_bytes: usize) {
        let class = match priority {
            Priority::High => &self.high,
            Priority::Low => &self.low,
        };
        let (count, bytes) = match op {
            Op::Read => (&class.reads, Some(&class.read_bytes)),
            Op::Write => (&class.writes, Some(&class.write_bytes)),
            Op::Flush => (&class.flushes, None),
        };
        count.fetch_add(1, Ordering::Relaxed);
        if let Some(b) = bytes {
            b.fetch_add(len_bytes as u64, Ordering::Relaxed);
        }
    }

    /// The counts now.
    pub fn snapshot(&self) -> IoCountsSnapshot {
        let class = |c: &ClassCounts| ClassSnapshot {
            reads: c.reads.load(Ordering::Relaxed),
            read_bytes: c.read_bytes.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            write_bytes: c.write_bytes.load(Ordering::Relaxed),
            flushes: c.flushes.load(Ordering::Relaxed),
        };
        IoCountsSnapshot {
            high: class(&self.high),
            low: class(&self.low),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_land_in_their_class_and_kind() {
        let c = IoCounts::default();
        c.record(Priority::High, Op::Read, 4096);
        c.record(Priority::High, Op::Read, 8192);
        c.record(Priority::Low, Op::Write, 4096);
        c.record(Priority::Low, Op::Flush, 0);
        let s = c.snapshot();
        assert_eq!((s.high.reads, s.high.read_bytes), (2, 12288));
        assert_eq!((s.high.writes, s.high.flushes), (0, 0));
        assert_eq!(
            (s.low.writes, s.low.write_bytes, s.low.flushes),
            (1, 4096, 1)
        );
        let mut sum = s;
        sum += s;
        assert_eq!(sum.high.read_bytes, 24576);
    }
}
