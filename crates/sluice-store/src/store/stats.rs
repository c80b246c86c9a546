//! What the store reports about itself.

use super::*;

/// What the store reports about itself.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreStats {
    /// Sequence of the last write.
    pub last_sequence: u64,
    /// Versions in the memtables.
    pub memtable_entries: usize,
    /// Bytes in the memtables.
    pub memtable_bytes: usize,
    /// Flushed memtables still held by a reader (a server worker's cached
    /// view), to be freed off that reader's thread once it lets go.
    pub retired_memtables: usize,
    /// WAL blocks below this are written.
    pub wal_written_below: u64,
    /// WAL blocks below this are durable.
    pub wal_durable_below: u64,
    /// Durable writes the WAL made.
    pub wal_flushes: u64,
    /// Free store blocks.
    pub free_blocks: u64,
    /// Store blocks of the device set.
    pub device_blocks: u64,
    /// Free store blocks on each device of the set, in order.
    pub device_free_blocks: Vec<u64>,
    /// Keyspace names.
    pub keyspaces: Vec<String>,
    /// Tables per level, summed over keyspaces.
    pub tables_per_level: Vec<usize>,
    /// Bytes of data blocks in all live tables (what the pinned index
    /// and filter serve), and the entries (versions) they hold.
    pub table_data_bytes: u64,
    /// Versions in live tables.
    pub table_entries: u64,
    /// Live blob files (large values kept apart from the tree).
    pub blob_files: usize,
    /// Bytes those files take on the device.
    pub blob_bytes: u64,
    /// Values compactions moved out of mostly-empty blob files since open.
    pub blob_relocations: u64,
    /// Index + filter memory pinned by open tables, and its bound.
    pub pinned_index_bytes: usize,
    /// The bound on pinned index and filter memory.
    pub pinned_index_limit_bytes: usize,
    /// Tables whose index and filter are not pinned (read through the
    /// index cache), and that cache's use.
    pub unpinned_tables: usize,
    /// Bytes the index cache holds.
    pub index_cache_used_bytes: usize,
    /// Memtable flushes since open.
    pub flushes: u64,
    /// Compactions since open.
    pub compactions: u64,
    /// Bytes the block cache holds.
    pub block_cache_used_bytes: usize,
    /// Block cache lookups that hit.
    pub block_cache_hits: u64,
    /// Block cache lookups that missed.
    pub block_cache_misses: u64,
    /// Bytes compaction is behind: all of level 0 once it reaches its
    /// trigger, plus what each deeper level holds over its budget.
    pub compaction_debt_bytes: u64,
    /// Writes that flushed or compacted on their own thread because the
    /// background thread was behind.
    pub write_stalls: u64,
    /// Time those writes spent at it, in µs.
    pub write_stall_us: u64,
    /// Requests the engines took for each device of the set, by priority.
    pub device_io: Vec<sluice_io::IoCountsSnapshot>,
}

/// Where one table lies on the device set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TablePlacement {
    /// The table's keyspace.
    pub keyspace: u32,
    /// Its level.
    pub level: u8,
    /// Its number.
    pub file_no: u64,
    /// Device (index into the set) of its data blocks and of its index.
    pub data_device: usize,
    /// Device (index into the set) of its index.
    pub index_device: usize,
    /// Its data blocks.
    pub data_blocks: u32,
}

impl Store {
    /// Where every live table lies, shallowest level first.
    pub fn table_placement(&self) -> Vec<TablePlacement> {
        let version = read(&self.inner.version).clone();
        let dev = &self.inner.dev;
        version
            .keyspaces
            .iter()
            .flat_map(|(ks, levels)| levels.all().map(move |t| (*ks, t)))
            .map(|(keyspace, t)| TablePlacement {
                keyspace,
                level: t.meta.level,
                file_no: t.meta.file_no,
                data_device: dev.member_of(t.meta.data.start_block),
                index_device: dev.member_of(t.meta.index.start_block),
                data_blocks: t.meta.data.block_count,
            })
            .collect()
    }

    /// A snapshot of the store's figures.
    pub fn stats(&self) -> StoreStats {
        let inner = &self.inner;
        let manifest = lock(&inner.manifest);
        let (mems, version) = self.read_view();
        let (entries, bytes) = mems.iter().fold((0, 0), |(e, b), m| {
            let m = read(m);
            (e + m.entry_count(), b + m.approximate_bytes())
        });
        let mut per_level = vec![0usize; version::MAX_LEVELS];
        let (mut pinned, mut unpinned, mut data_bytes, mut table_entries) =
            (0usize, 0usize, 0u64, 0u64);
        let mut debt = 0u64;
        for levels in version.keyspaces.values() {
            debt += compaction::debt_bytes(&inner.config.compaction, levels);
            for (l, tables) in levels.levels.iter().enumerate() {
                per_level[l] += tables.len();
                for t in tables {
                    data_bytes += t.data_bytes();
                    table_entries += t.reader.entries;
                    pinned += t.reader.pinned_bytes();
                    unpinned += usize::from(!t.reader.is_pinned());
                }
            }
        }
        StoreStats {
            last_sequence: inner.visible_seq.get(),
            memtable_entries: entries,
            memtable_bytes: bytes,
            retired_memtables: lock(&inner.retired_memtables).len(),
            wal_written_below: inner.wal.last_written(),
            wal_durable_below: inner.wal.last_durable(),
            wal_flushes: inner.wal.flush_count(),
            free_blocks: manifest.state().allocator.free_blocks(),
            device_free_blocks: (0..inner.dev.device_count())
                .map(|k| manifest.free_blocks_on(k))
                .collect(),
            device_blocks: manifest.superblock().device_blocks,
            keyspaces: read(&inner.keyspaces).keys().cloned().collect(),
            tables_per_level: per_level,
            table_data_bytes: data_bytes,
            table_entries,
            blob_files: version.blob_files.len(),
            blob_bytes: version
                .blob_files
                .values()
                .map(|f| f.extent.block_count as u64 * STORE_BLOCK_BYTES as u64)
                .sum(),
            blob_relocations: inner.blob_relocations.load(Ordering::Relaxed),
            pinned_index_bytes: pinned,
            pinned_index_limit_bytes: inner.pin_budget.limit_bytes(),
            unpinned_tables: unpinned,
            index_cache_used_bytes: inner.index_cache.used_bytes(),
            flushes: inner.flushes.load(Ordering::Relaxed),
            compactions: inner.compactions.load(Ordering::Relaxed),
            block_cache_used_bytes: inner.cache.used_bytes(),
            block_cache_hits: inner.cache.hits(),
            block_cache_misses: inner.cache.misses(),
            compaction_debt_bytes: debt,
            write_stalls: inner.write_stalls.load(Ordering::Relaxed),
            write_stall_us: inner.write_stall_us.load(Ordering::Relaxed),
            device_io: (0..inner.dev.device_count())
                .map(|k| {
                    let (device, _, _) = inner.dev.member(k);
                    device.io_counts().map(|c| c.snapshot()).unwrap_or_default()
                })
                .collect(),
        }
    }
}
