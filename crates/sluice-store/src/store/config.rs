//! What a store is created and opened with, and the check that a format
//! fits its first device.

use super::*;

/// The keyspace every store has.
pub const DEFAULT_KEYSPACE: &str = "default";

/// Most keyspaces one store holds.
pub const MAX_KEYSPACES: usize = 1024;

/// What a store is created and opened with.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Size of the WAL ring in 4 KiB blocks (format time only).
    pub wal_blocks: u32,
    /// The memtable is flushed to a table once it holds this many bytes.
    pub write_buffer_bytes: usize,
    /// When and how tables are merged.
    pub compaction: CompactionConfig,
    /// Run compactions in a background thread (off: only `compact()`).
    pub background_compaction: bool,
    /// How the background thread is scheduled against the caller's threads
    /// (default: the same fair share; a server gives it `Idle`).
    pub background_cpu: sluice_io::cpu::BackgroundCpu,
    /// Decoded data blocks kept in memory (there is no page cache below).
    pub block_cache_bytes: usize,
    /// Bound on index and filter memory pinned for the life of their
    /// tables. Tables opened once it is spent keep theirs in the index
    /// cache instead, and a read may then cost one more device read.
    pub pinned_index_bytes: usize,
    /// Indexes and filters of unpinned tables kept in memory.
    pub index_cache_bytes: usize,
    /// What open does when the WAL is damaged before its end (default:
    /// refuse, naming the blocks).
    pub wal_recovery: WalRecovery,
    /// SQPOLL for the log's two engines, with this idle time before their
    /// kernel threads sleep: a synced commit then makes no system call
    /// while they are awake, at the cost of a core each while busy. Off by
    /// default (measured: docs/BENCHMARKS.md).
    pub wal_sqpoll_idle_ms: Option<u32>,
    /// How long open waits for another process to close the store (each
    /// device is locked while a store is open; 0: refuse at once). The
    /// default, 10 s, also covers the moment after a process ends: the
    /// kernel drops its io_uring's hold on the device, and with it the
    /// lock, asynchronously.
    pub lock_wait_ms: u64,
    /// Room kept free for flushes and compactions: below it, writes that
    /// add data are refused ([`crate::WritesRefused::SpaceLow`]) and
    /// deletes are taken, so that the store never fills to where it can
    /// neither put its memtable on the device nor compact. Default (None):
    /// the WAL ring (the most a memtable can hold: every record not in a
    /// table is in the ring) and two of compaction's tables, at most a
    /// quarter of the room for tables.
    pub space_reserve_bytes: Option<u64>,
    /// Values at least this long are kept in blob files, apart from the
    /// tree (docs/FORMAT.md, "Blob files"): from
    /// [`crate::blob::MIN_THRESHOLD_BYTES`] to
    /// [`crate::blob::MAX_THRESHOLD_BYTES`]; default 16 KiB.
    pub blob_threshold_bytes: usize,
    /// Size of a blob file (a larger value gets a file of its own).
    pub blob_file_bytes: u64,
    /// A mirror of the log's records in memory that outlives the process
    /// (docs/FORMAT.md, "Log mirror"): a record it holds survives the
    /// process's death before its log block reaches the device
    /// ([`Store::is_kept`]). Open reads back what an earlier process left
    /// there whatever `size_bytes` says. Off by default; `sluice serve`
    /// keeps one.
    pub log_mirror: Option<crate::wal_mirror::LogMirrorConfig>,
}

/// The log ring of [`StoreConfig::default`], in store blocks (64 MiB).
const DEFAULT_WAL_BLOCKS: u32 = 16384;

/// Blocks the first device keeps for tables at the least when a store is
/// formatted (their indexes live there even on a device set).
const MIN_TABLE_BLOCKS: u64 = 256;

impl StoreConfig {
    /// The reserve ([`StoreConfig::space_reserve_bytes`]) of a store
    /// whose tables have `table_room_blocks` store blocks and whose log
    /// ring `ring_blocks`, in blocks.
    pub(super) fn reserve_blocks(&self, table_room_blocks: u64, ring_blocks: u64) -> u64 {
        let block = STORE_BLOCK_BYTES as u64;
        match self.space_reserve_bytes {
            Some(bytes) => bytes.div_ceil(block),
            None => {
                let tables = (2 * self.compaction.target_file_bytes as u64).div_ceil(block);
                (ring_blocks + tables).min(table_room_blocks / 4)
            }
        }
    }

    /// The WAL ring a store formatted with this configuration gets on a
    /// first device of `device_blocks` store blocks: an eighth of the
    /// device, between 64 blocks and the default 16384 (64 MiB); and, where
    /// an eighth of the device allows, room for three write buffers — the
    /// memtable being flushed and the one filling meanwhile — so that a
    /// writer rarely waits for a flush to free the ring.
    pub fn format_wal_blocks(&self, device_blocks: u64) -> u32 {
        let eighth = device_blocks / 8;
        let base = eighth.clamp(64, DEFAULT_WAL_BLOCKS as u64);
        let buffers = (3 * self.write_buffer_bytes / STORE_BLOCK_BYTES) as u64;
        base.max(buffers.min(eighth)).min(u32::MAX as u64) as u32
    }
}

/// Refuses, before anything is written, a format whose parts do not fit
/// the first device, naming each part and what changes it.
pub(super) fn check_format_fits(
    device: &Arc<dyn Device>,
    device_blocks: u64,
    config: &StoreConfig,
) -> Result<()> {
    let fixed =
        crate::superblock::SUPERBLOCK_BLOCKS + crate::manifest::MANIFEST_EXTENT_BLOCKS as u64;
    let needed = fixed + config.wal_blocks as u64 + MIN_TABLE_BLOCKS;
    if needed <= device_blocks {
        return Ok(());
    }
    let mib = |blocks: u64| blocks as f64 * STORE_BLOCK_BYTES as f64 / (1 << 20) as f64;
    let room_for_wal = device_blocks.saturating_sub(fixed + MIN_TABLE_BLOCKS);
    let advice = if room_for_wal >= 64 {
        format!(
            "format with a smaller WAL (--wal-blocks {}, StoreConfig::wal_blocks) or a larger device",
            config.format_wal_blocks(device_blocks).min(room_for_wal as u32)
        )
    } else {
        format!(
            "use a device of at least {:.1} MiB",
            mib(fixed + 64 + MIN_TABLE_BLOCKS)
        )
    };
    Err(StoreError::BadDevice(format!(
        "{} holds {device_blocks} store blocks ({:.1} MiB); a store on it needs {needed} ({:.1} MiB): \
         {fixed} for the superblock and manifest, {} for the WAL ring and at least {MIN_TABLE_BLOCKS} \
         for tables. Nothing was written; {advice}",
        device.describe(),
        mib(device_blocks),
        mib(needed),
        config.wal_blocks
    )))
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            wal_blocks: DEFAULT_WAL_BLOCKS,
            write_buffer_bytes: 64 << 20,
            compaction: CompactionConfig::default(),
            background_compaction: true,
            background_cpu: sluice_io::cpu::BackgroundCpu::Normal,
            block_cache_bytes: 64 << 20,
            // About 1.3% of the data at 16-byte keys and 200-byte values:
            // enough for 20 GB of such data.
            pinned_index_bytes: 256 << 20,
            index_cache_bytes: 32 << 20,
            wal_recovery: WalRecovery::Strict,
            wal_sqpoll_idle_ms: None,
            lock_wait_ms: 10_000,
            space_reserve_bytes: None,
            blob_threshold_bytes: 16 << 10,
            blob_file_bytes: 64 << 20,
            log_mirror: None,
        }
    }
}

/// How a write is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOptions {
    /// Return only once the write is durable (the default).
    pub sync: bool,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions { sync: true }
    }
}
