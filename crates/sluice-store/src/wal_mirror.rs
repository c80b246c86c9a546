//! The log mirror: every record the write-ahead log takes, copied into
//! memory that outlives the process ([`sluice_io::kept::KeptMem`]), so that
//! a write survives the process's death before its log block is on the
//! device (`everysec`). Layout and rules in docs/FORMAT.md ("Log mirror").

use sluice_io::kept::KeptMem;
use std::path::PathBuf;

const MAGIC: &[u8; 8] = b"SLMIRROR";
const VERSION: u32 = 1;
const HEADER_BYTES: usize = 4096;
const FIXED_BYTES: usize = 64;
const SLOT_AT: [usize; 2] = [64, 128];
const ENTRY_HEADER_BYTES: usize = 24;
/// Ordinals start here, so that zeroed memory never reads as an entry.
const FIRST_ORDINAL: u64 = 1;

/// Where a store keeps its log mirror and how large it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogMirrorConfig {
    /// A file in a memory-backed file system (tmpfs: `/dev/shm`), one per
    /// device; read back at open whatever its size.
    pub path: PathBuf,
    /// Its size when made: records in it wait for their log blocks to
    /// reach the device (a write through every few milliseconds lets them
    /// go); past it, a record is not kept and its writer waits for the
    /// device as without a mirror. Up to 1 GiB; under 1 MiB is taken as
    /// 1 MiB; 0 keeps none from now on (a mirror left there is still read
    /// back, then deleted).
    pub size_bytes: usize,
}

/// The smallest mirror.
pub const MIN_MIRROR_BYTES: usize = 1 << 20;

/// Whom a mirror belongs to: the store and its log ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner {
    pub store_id: [u8; 16],
    pub epoch: u64,
}

/// A mirror being written: the ring between `tail` and `head` holds the
/// entries kept.
pub(crate) struct LogMirror {
    mem: KeptMem,
    head: usize,
    tail: usize,
    /// Bytes from `tail` to `head` around the ring, wrap padding included.
    used_bytes: usize,
    next_ordinal: u64,
    tail_ordinal: u64,
    generation: u64,
}

impl std::fmt::Debug for LogMirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogMirror")
            .field("path", &self.mem.path())
            .field("used_bytes", &self.used_bytes)
            .finish()
    }
}

/// One kept record read back: its log position and bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeptRecord {
    pub end_seq: u64,
    pub record: Vec<u8>,
}

#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: 4 bytes"
)]
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: 8 bytes"
)]
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn align8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

fn entry_bytes(record_len: usize) -> usize {
    align8(ENTRY_HEADER_BYTES + record_len)
}

impl LogMirror {
    /// Makes `mem` a fresh, empty mirror of `size_bytes` for `owner`.
    pub fn fresh(mut mem: KeptMem, size_bytes: usize, owner: Owner) -> std::io::Result<LogMirror> {
        mem.recreate(size_bytes)?;
        let b = mem.as_mut_slice();
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[16..32].copy_from_slice(&owner.store_id);
        b[32..40].copy_from_slice(&owner.epoch.to_le_bytes());
        b[40..48].copy_from_slice(&(size_bytes as u64).to_le_bytes());
        let crc = crc32c::crc32c(&b[16..FIXED_BYTES]);
        b[12..16].copy_from_slice(&crc.to_le_bytes());
        let mut m = LogMirror {
            mem,
            head: HEADER_BYTES,
            tail: HEADER_BYTES,
            used_bytes: 0,
            next_ordinal: FIRST_ORDINAL,
            tail_ordinal: FIRST_ORDINAL,
            generation: 0,
        };
        m.write_tail_slot();
        Ok(m)
    }

    fn ring_bytes(&self) -> usize {
        self.mem.len() - HEADER_BYTES
    }

    /// Copies the record `head` + `body`, which the log placed to end at
    /// `end_seq`; false if the ring has no room for it (nothing written).
    pub fn append(&mut self, end_seq: u64, head: &[u8], body: &[u8]) -> bool {
        let len = head.len() + body.len();
        // Length 0 marks a wrap; a log record is never empty.
        assert!(len > 0, "an empty record for the log mirror");
        let need = entry_bytes(len);
        if need > self.ring_bytes() / 4 || len > u32::MAX as usize {
            return false;
        }
        let cap = self.mem.len();
        let mut at = self.head;
        let wraps = at + need > cap;
        let waste = if wraps { cap - at } else { 0 };
        if self.used_bytes + waste + need > self.ring_bytes() {
            return false;
        }
        let ordinal = self.next_ordinal;
        if wraps {
            if waste >= ENTRY_HEADER_BYTES {
                self.write_entry(at, ordinal, 0, &[], &[]);
            }
            at = HEADER_BYTES;
        }
        self.write_entry(at, ordinal, end_seq, head, body);
        self.head = at + need;
        self.used_bytes += waste + need;
        self.next_ordinal += 1;
        true
    }

    fn write_entry(&mut self, at: usize, ordinal: u64, end_seq: u64, head: &[u8], body: &[u8]) {
        let len = head.len() + body.len();
        let b = &mut self.mem.as_mut_slice()[at..at + ENTRY_HEADER_BYTES + len];
        b[4..8].copy_from_slice(&(len as u32).to_le_bytes());
        b[8..16].copy_from_slice(&ordinal.to_le_bytes());
        b[16..24].copy_from_slice(&end_seq.to_le_bytes());
        b[24..24 + head.len()].copy_from_slice(head);
        b[24 + head.len()..].copy_from_slice(body);
        // Last: an entry cut short by the process's death fails it.
        let crc = crc32c::crc32c(&b[4..]);
        b[0..4].copy_from_slice(&crc.to_le_bytes());
    }

    /// Lets go of every entry whose record ends before `through_seq` (its
    /// log blocks are on the device).
    pub fn let_go_below(&mut self, through_seq: u64) {
        let cap = self.mem.len();
        let mut moved = false;
        while self.used_bytes > 0 {
            if self.tail + ENTRY_HEADER_BYTES > cap {
                self.used_bytes -= cap - self.tail;
                self.tail = HEADER_BYTES;
                moved = true;
                continue;
            }
            let b = self.mem.as_slice();
            let len = le32(b, self.tail + 4) as usize;
            if len == 0 {
                self.used_bytes -= cap - self.tail;
                self.tail = HEADER_BYTES;
                moved = true;
                continue;
            }
            if le64(b, self.tail + 16) >= through_seq {
                break;
            }
            let n = entry_bytes(len);
            self.tail += n;
            self.used_bytes -= n;
            self.tail_ordinal += 1;
            moved = true;
        }
        debug_assert!(self.used_bytes > 0 || self.tail == self.head);
        if moved {
            self.write_tail_slot();
        }
    }

    /// Records the tail in the slot not in use, with the next generation.
    fn write_tail_slot(&mut self) {
        self.generation += 1;
        let at = SLOT_AT[(self.generation % 2) as usize];
        let (tail, ordinal, generation) = (self.tail as u64, self.tail_ordinal, self.generation);
        let s = &mut self.mem.as_mut_slice()[at..at + 32];
        s[0..8].copy_from_slice(&generation.to_le_bytes());
        s[8..16].copy_from_slice(&tail.to_le_bytes());
        s[16..24].copy_from_slice(&ordinal.to_le_bytes());
        let crc = crc32c::crc32c(&s[0..24]);
        s[24..28].copy_from_slice(&crc.to_le_bytes());
    }

    /// Bytes its entries take now.
    pub fn used_bytes(&self) -> usize {
        self.used_bytes
    }

    /// Deletes the file (a clean close: the log is durable).
    pub fn remove(self) -> std::io::Result<()> {
        self.mem.remove()
    }
}

/// The records a mirror holds for `owner`, oldest first, or why it holds
/// none for it.
pub(crate) fn read_kept(mem: &KeptMem, owner: Owner) -> Result<Vec<KeptRecord>, String> {
    let b = mem.as_slice();
    let cap = b.len();
    if cap < HEADER_BYTES + ENTRY_HEADER_BYTES || &b[0..8] != MAGIC {
        return Err("it holds no log mirror (no header)".into());
    }
    if le32(b, 8) != VERSION || le32(b, 12) != crc32c::crc32c(&b[16..FIXED_BYTES]) {
        return Err("its header is damaged or of another version".into());
    }
    if b[16..32] != owner.store_id || le64(b, 32) != owner.epoch {
        return Err("it is the mirror of another store or log ring".into());
    }
    if le64(b, 40) != cap as u64 {
        return Err(format!(
            "its header gives {} bytes; the file has {cap}",
            le64(b, 40)
        ));
    }
    let (mut at, mut ordinal) = tail_slot(b).ok_or("neither tail slot is whole")?;
    if at < HEADER_BYTES || at > cap {
        return Err(format!(
            "its tail slot points outside the ring (offset {at})"
        ));
    }
    let mut out = Vec::new();
    let mut walked = 0usize;
    let ring = cap - HEADER_BYTES;
    while walked <= ring {
        if at + ENTRY_HEADER_BYTES > cap {
            walked += cap - at;
            at = HEADER_BYTES;
            continue;
        }
        let len = le32(b, at + 4) as usize;
        let end = at + ENTRY_HEADER_BYTES + len;
        if end > cap || le64(b, at + 8) != ordinal || le32(b, at) != crc32c::crc32c(&b[at + 4..end])
        {
            break;
        }
        if len == 0 {
            walked += cap - at;
            at = HEADER_BYTES;
            continue;
        }
        out.push(KeptRecord {
            end_seq: le64(b, at + 16),
            record: b[at + ENTRY_HEADER_BYTES..end].to_vec(),
        });
        walked += entry_bytes(len);
        at += entry_bytes(len);
        ordinal += 1;
    }
    Ok(out)
}

/// The valid tail slot of the higher generation: (offset, ordinal).
fn tail_slot(b: &[u8]) -> Option<(usize, u64)> {
    SLOT_AT
        .iter()
        .filter_map(|&at| {
            let s = &b[at..at + 32];
            let valid = le64(s, 0) > 0 && le32(s, 24) == crc32c::crc32c(&s[0..24]);
            valid.then(|| (le64(s, 0), le64(s, 8) as usize, le64(s, 16)))
        })
        .max_by_key(|&(generation, _, _)| generation)
        .map(|(_, at, ordinal)| (at, ordinal))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: Owner = Owner {
        store_id: [7; 16],
        epoch: 99,
    };

    fn path(name: &str) -> PathBuf {
        PathBuf::from(format!(
            "/dev/shm/sluice-mirror-test-{}-{name}",
            std::process::id()
        ))
    }

    fn fresh(name: &str, size: usize) -> LogMirror {
        let p = path(name);
        let _ = std::fs::remove_file(&p);
        LogMirror::fresh(KeptMem::open(&p, size).unwrap(), size, OWNER).unwrap()
    }

    /// What a later process reads: the file opened again.
    fn read_back(m: &LogMirror, owner: Owner) -> Result<Vec<KeptRecord>, String> {
        read_kept(&m.mem, owner)
    }

    fn record(i: u64, len: usize) -> Vec<u8> {
        (0..len).map(|j| (i as usize * 31 + j) as u8).collect()
    }

    #[test]
    fn records_come_back_in_order_across_wraps_and_let_go() {
        let size = HEADER_BYTES + 4096;
        let mut m = fresh("wraps", size);
        let mut expect: std::collections::VecDeque<(u64, Vec<u8>)> = Default::default();
        // Records of many sizes, let go as their "log blocks" reach the
        // device, so that the ring wraps many times at every alignment.
        for i in 0..2000u64 {
            let r = record(i, 1 + (i as usize * 7) % 300);
            let (h, body) = r.split_at(r.len() / 3);
            while !m.append(i, h, body) {
                let (first, _) = expect.pop_front().expect("a full ring holds something");
                m.let_go_below(first + 1);
            }
            expect.push_back((i, r));
            if i % 5 == 0 {
                let got = read_back(&m, OWNER).unwrap();
                let want: Vec<KeptRecord> = expect
                    .iter()
                    .map(|(end_seq, record)| KeptRecord {
                        end_seq: *end_seq,
                        record: record.clone(),
                    })
                    .collect();
                assert_eq!(got, want, "after record {i}");
            }
        }
        m.let_go_below(u64::MAX);
        assert_eq!(m.used_bytes(), 0);
        assert!(read_back(&m, OWNER).unwrap().is_empty());
        m.remove().unwrap();
    }

    #[test]
    fn a_record_cut_short_ends_what_is_read() {
        let mut m = fresh("torn", HEADER_BYTES + 64 * 1024);
        for i in 0..10 {
            assert!(m.append(i, &record(i, 100), &[]));
        }
        // The process died copying the eighth: its bytes are half there.
        let at = HEADER_BYTES + 7 * entry_bytes(100) + ENTRY_HEADER_BYTES + 50;
        m.mem.as_mut_slice()[at] ^= 0xff;
        let got = read_back(&m, OWNER).unwrap();
        assert_eq!(got.len(), 7);
        assert_eq!(got[6].record, record(6, 100));
        m.remove().unwrap();
    }

    #[test]
    fn a_torn_tail_slot_leaves_the_other() {
        let mut m = fresh("slots", HEADER_BYTES + 64 * 1024);
        for i in 0..10 {
            assert!(m.append(i, &record(i, 100), &[]));
        }
        m.let_go_below(3);
        assert_eq!(read_back(&m, OWNER).unwrap().len(), 7);
        // Death while the next slot was written: that slot fails its
        // check, and the one before it still names a kept entry.
        m.let_go_below(5);
        let newest = SLOT_AT[(m.generation % 2) as usize];
        m.mem.as_mut_slice()[newest + 9] ^= 1;
        let got = read_back(&m, OWNER).unwrap();
        assert_eq!(got.len(), 7, "read from the older slot: entries 3..10");
        assert_eq!(got[0].end_seq, 3);
        m.remove().unwrap();
    }

    #[test]
    fn another_owner_or_a_full_ring_is_refused() {
        let mut m = fresh("owner", HEADER_BYTES + 4096);
        assert!(m.append(1, &record(1, 500), &[]));
        let other = Owner {
            store_id: [8; 16],
            epoch: 99,
        };
        assert!(read_back(&m, other).unwrap_err().contains("another store"));
        let other_ring = Owner {
            store_id: [7; 16],
            epoch: 98,
        };
        assert!(read_back(&m, other_ring).is_err());
        // A quarter of the ring at most per record; then room runs out.
        assert!(!m.append(2, &record(2, 1200), &[]));
        let mut n = 1;
        while m.append(2, &record(2, 500), &[]) {
            n += 1;
        }
        assert_eq!(n, 4096 / entry_bytes(500));
        assert_eq!(read_back(&m, OWNER).unwrap().len(), n);
        m.remove().unwrap();
    }
}
