//! Formatting a device set, opening it (superblock, manifest, WAL
//! recovery), and reclaiming extents a crash left allocated.

use super::background::background_loop;
use super::config::check_format_fits;
use super::*;
use crate::manifest::ManifestState;

/// The first memtable's chains make room for a key per this many bytes of
/// the write buffer (later memtables for as many keys as the one before took).
const FIRST_MEMTABLE_BYTES_PER_KEY: usize = 256;

impl Store {
    /// Formats `device` as a new store (everything on it is overwritten).
    pub fn create(device: Arc<dyn Device>, config: &StoreConfig) -> Result<Self> {
        Self::create_on(vec![device], config)
    }

    /// Formats a store over several devices (everything on them is
    /// overwritten). The first holds the superblock, manifest, WAL and
    /// every table's index and filter; table data blocks are striped over
    /// the others, one table per device in turn. With one device,
    /// everything shares it.
    pub fn create_on(devices: Vec<Arc<dyn Device>>, config: &StoreConfig) -> Result<Self> {
        lock_devices(&devices, config.lock_wait_ms)?;
        let sized = devices
            .iter()
            .map(|d| Ok((d.clone(), crate::blocks::device_store_blocks(d)?)))
            .collect::<Result<Vec<_>>>()?;
        check_format_fits(&sized[0].0, sized[0].1, config)?;
        let dev = BlockDevice::set(sized)?;
        let mut rng = rand::thread_rng();
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut manifest = Manifest::create(dev.clone(), rng.gen(), now_ms)?;
        let ring = manifest.allocate(config.wal_blocks as u64)?;
        let layout = WalLayout {
            ring: vec![ring],
            epoch: rng.gen(),
        };
        layout.format(&dev)?;
        manifest.log(&[
            Edit::Alloc(ring),
            Edit::Wal(WalPlace {
                epoch: layout.epoch,
                tail_seq: 0,
                ring: layout.ring.clone(),
            }),
            Edit::AddKeyspace(KeyspaceDef {
                id: 0,
                name: DEFAULT_KEYSPACE.into(),
                format: ValueFormat::Raw,
                schema: String::new(),
            }),
        ])?;
        drop(manifest);
        Self::open_on(devices, config)
    }

    /// Opens the store on `device`: manifest, tables, WAL replay.
    pub fn open(device: Arc<dyn Device>, config: &StoreConfig) -> Result<Self> {
        Self::open_on(vec![device], config)
    }

    /// Opens a store formatted over `devices`, given in the order they
    /// were formatted; each device's label is checked first.
    pub fn open_on(devices: Vec<Arc<dyn Device>>, config: &StoreConfig) -> Result<Self> {
        lock_devices(&devices, config.lock_wait_ms)?;
        let dev = open_device_set(devices)?;
        let mut manifest = Manifest::open(dev.clone())?;
        let state = manifest.state().clone();
        let place = state.wal.clone().ok_or_else(|| StoreError::Corrupt {
            what: "manifest",
            block: manifest.superblock().manifest.start_block,
            lba: dev.lba_of(manifest.superblock().manifest.start_block),
            reason: "no write-ahead log recorded".into(),
        })?;
        // Everything up to here only reads: a store that cannot be
        // recovered as asked is left as it was.
        let layout = WalLayout {
            ring: place.ring.clone(),
            epoch: place.epoch,
        };
        let mut recovered = wal::recover(&dev, &layout, place.tail_seq, config.wal_recovery)?;
        report_wal_recovery(&recovered, config.wal_recovery);
        let (mut memtable, mut last_seq) =
            replay_log(&dev, &layout, &recovered, state.last_sequence, config)?;
        let owner = crate::wal_mirror::Owner {
            store_id: manifest.superblock().store_id,
            epoch: layout.epoch,
        };
        let (mirror_mem, from_mirror) = read_mirror(
            config.log_mirror.as_ref(),
            owner,
            &mut memtable,
            &mut last_seq,
        );
        manifest.begin_writing()?;
        recovered.seal(&dev, &layout)?;
        reclaim_unreferenced(&mut manifest)?;
        let fixed =
            crate::superblock::SUPERBLOCK_BLOCKS + crate::manifest::MANIFEST_EXTENT_BLOCKS as u64;
        let table_room_blocks = manifest
            .superblock()
            .device_blocks
            .saturating_sub(fixed + layout.ring_blocks());
        let reserve_blocks = config.reserve_blocks(table_room_blocks, layout.ring_blocks());
        let free_blocks = manifest.state().allocator.free_blocks();
        let released = Arc::new(Mutex::new(Vec::new()));
        let memory = TableMemory {
            cache: Arc::new(BlockCache::new(config.block_cache_bytes)),
            pin_budget: Arc::new(PinBudget::new(config.pinned_index_bytes)),
            index_cache: Arc::new(IndexCache::new(config.index_cache_bytes)),
        };
        let version = open_version(&dev, &state, &memory, &released, last_seq)?;
        let keyspaces = state
            .keyspaces
            .values()
            .map(|k| (k.name.clone(), k.clone()))
            .collect();
        let wal = Wal::open(
            dev.clone(),
            layout,
            place.tail_seq,
            recovered.next_seq,
            config.wal_sqpoll_idle_ms,
        )?;
        log_again(&wal, &from_mirror)?;
        wal.note_replayed_from_mirror(from_mirror.len() as u64);
        renew_mirror(&wal, mirror_mem, config.log_mirror.as_ref(), owner);
        let active_bytes = memtable.approximate_bytes()
            + memtable
                .blob_value_bytes()
                .min(config.write_buffer_bytes as u64) as usize;
        let active = Arc::new(RwLock::new(memtable));
        let writer = Writer {
            next_seq: last_seq + 1,
            active: active.clone(),
            keyspace_ids: state.keyspaces.values().map(|k| k.id).collect(),
        };
        let TableMemory {
            cache,
            pin_budget,
            index_cache,
        } = memory;
        let inner = Arc::new(Inner {
            dev,
            cache,
            pin_budget,
            index_cache,
            config: config.clone(),
            manifest: Mutex::new(manifest),
            keyspaces: RwLock::new(keyspaces),
            wal,
            active_bytes: AtomicUsize::new(active_bytes),
            flushing: AtomicBool::new(false),
            l0_counted: AtomicU64::new(u64::MAX),
            memtables: RwLock::new(Memtables {
                active,
                frozen: None,
            }),
            version: RwLock::new(Arc::new(version)),
            view_generation: AtomicU64::new(0),
            writer: Mutex::new(writer),
            visible: Mutex::new(Visible {
                pending: BTreeMap::new(),
                ready_upto: last_seq,
                failed: None,
            }),
            visible_seq: SeqGate::new(last_seq),
            write_failed: AtomicBool::new(false),
            snapshots: Arc::new(SnapshotRegistry::default()),
            released,
            reserve_blocks,
            space_low: AtomicBool::new(free_blocks < reserve_blocks),
            free_blocks_hint: AtomicU64::new(free_blocks),
            flush_failure: Mutex::new(None),
            flush_failing: AtomicBool::new(false),
            unflushed: Mutex::new(None),
            flush_lock: Mutex::new(()),
            compaction_lock: Mutex::new(()),
            compaction_cursor: AtomicU64::new(0),
            next_data_device: AtomicU64::new(0),
            next_file: AtomicU64::new(state.next_file),
            flushes: AtomicU64::new(0),
            compactions: AtomicU64::new(0),
            write_stalls: AtomicU64::new(0),
            write_stall_us: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
            flush_requested: AtomicBool::new(false),
            retired_memtables: Mutex::new(Vec::new()),
            table_buffers: TableBuffers::default(),
            blob_appender: Mutex::new(blob::Appender::default()),
            tables_hold_upto: AtomicU64::new(state.last_sequence),
            blob_relocations: AtomicU64::new(0),
            wake: Condvar::new(),
            wake_lock: Mutex::new(false),
        });
        // Blob records gathered in memory go to the device before any log
        // block that may reference them.
        let weak = Arc::downgrade(&inner);
        inner
            .wal
            .set_before_write(Box::new(move || match weak.upgrade() {
                Some(inner) => inner.write_blob_staging(),
                None => Ok(()),
            }));
        let background = start_background(&inner, config)?;
        Ok(Store { inner, background })
    }
}

/// The block cache and index memory every table of the store shares.
struct TableMemory {
    cache: Arc<BlockCache>,
    pin_budget: Arc<PinBudget>,
    index_cache: Arc<IndexCache>,
}

/// The memtable of the log's records past the last flush, and the last
/// sequence the log holds (at least `flushed_upto`).
fn replay_log(
    dev: &BlockDevice,
    layout: &WalLayout,
    recovered: &wal::Recovered,
    flushed_upto: u64,
    config: &StoreConfig,
) -> Result<(Memtable, u64)> {
    // Chains only: with no count to go by, an index sized for the
    // whole write buffer would spread a small key set out.
    let mut memtable =
        Memtable::with_key_room(config.write_buffer_bytes / FIRST_MEMTABLE_BYTES_PER_KEY, 0);
    let mut last_seq = flushed_upto;
    for (pos, record) in &recovered.records {
        let (first, batch) = WriteBatch::decode(record).ok_or_else(|| {
            let block = layout.block_of(pos.end_seq);
            StoreError::Corrupt {
                what: "WAL record",
                block,
                lba: dev.lba_of(block),
                reason: "a record with valid checksums does not decode as a write batch".into(),
            }
        })?;
        // Records older than the last flush are already in tables.
        if first > flushed_upto {
            memtable.apply(first, &batch);
        }
        last_seq = last_seq.max(first + batch.len() as u64 - 1);
    }
    Ok((memtable, last_seq))
}

/// The version of the manifest's tables and blob files, each table's
/// reader open (shallow levels first: they are read most, so they take
/// the pin budget first).
fn open_version(
    dev: &BlockDevice,
    state: &ManifestState,
    memory: &TableMemory,
    released: &Arc<Mutex<Vec<Extent>>>,
    last_seq: u64,
) -> Result<Version> {
    let mut version = Version::default();
    let mut metas: Vec<&TableMeta> = state.tables.values().collect();
    metas.sort_by_key(|m| (m.level, std::cmp::Reverse(m.file_no)));
    for meta in metas {
        let name = state
            .keyspaces
            .get(&meta.keyspace)
            .map_or("?", |k| k.name.as_str());
        let reader = TableReader::open_parts(
            dev,
            meta.data,
            Some(meta.index),
            TablePlace {
                keyspace: name,
                file_no: meta.file_no,
            },
        )?
        .with_cache(memory.cache.clone())
        .with_index_memory(memory.pin_budget.clone(), memory.index_cache.clone());
        version
            .keyspaces
            .entry(meta.keyspace)
            .or_default()
            .insert(Arc::new(Table::new(meta.clone(), reader, released.clone())));
    }
    // Closed for appends; the memtable replayed from the log may
    // reference any of them until its first flush.
    for (&file_no, &extent) in &state.blob_files {
        let file = BlobFile::new(file_no, extent, true, last_seq, released.clone());
        version.blob_files.insert(file_no, Arc::new(file));
    }
    Ok(version)
}

/// After the mirror's records are logged again: its file deleted when no
/// mirror is kept from now on, else made anew and attached to `wal`.
fn renew_mirror(
    wal: &Wal,
    mem: Option<sluice_io::kept::KeptMem>,
    config: Option<&crate::wal_mirror::LogMirrorConfig>,
    owner: crate::wal_mirror::Owner,
) {
    let (Some(mem), Some(mirror)) = (mem, config) else {
        return;
    };
    if mirror.size_bytes == 0 {
        // Read back; none kept from now on.
        if let Err(e) = mem.remove() {
            log::warn!("the log mirror's file was not deleted: {e}");
        }
        return;
    }
    let size = mirror.size_bytes.max(crate::wal_mirror::MIN_MIRROR_BYTES);
    match crate::wal_mirror::LogMirror::fresh(mem, size, owner) {
        Ok(m) => wal.attach_mirror(m),
        Err(e) => log::warn!(
            "the log mirror {} cannot be made ({e}): writes wait for the device instead",
            mirror.path.display()
        ),
    }
}

/// The compaction thread, when the configuration asks for one.
fn start_background(
    inner: &Arc<Inner>,
    config: &StoreConfig,
) -> Result<Option<std::thread::JoinHandle<()>>> {
    if !config.background_compaction {
        return Ok(None);
    }
    let inner = inner.clone();
    std::thread::Builder::new()
        .name("sluice-compaction".into())
        .spawn(move || background_loop(&inner))
        .map(Some)
        .map_err(|e| StoreError::BadDevice(format!("cannot start the compaction thread: {e}")))
}

/// Opens the log mirror `config` names and applies to `memtable` the
/// records it kept beyond the device's log (which ends at `last_seq`,
/// moved past them). Returns the mirror's memory (None where it cannot be
/// had: said in the log) and those records, to be logged again.
fn read_mirror(
    config: Option<&crate::wal_mirror::LogMirrorConfig>,
    owner: crate::wal_mirror::Owner,
    memtable: &mut Memtable,
    last_seq: &mut u64,
) -> (Option<sluice_io::kept::KeptMem>, Vec<Vec<u8>>) {
    let Some(config) = config else {
        return (None, Vec::new());
    };
    if config.size_bytes == 0 && !config.path.exists() {
        return (None, Vec::new());
    }
    let size = config.size_bytes.max(crate::wal_mirror::MIN_MIRROR_BYTES);
    let path = config.path.display();
    let mem = match sluice_io::kept::KeptMem::open(&config.path, size) {
        Ok(mem) => mem,
        Err(e) => {
            log::warn!("no log mirror: {e}; writes wait for the device instead");
            return (None, Vec::new());
        }
    };
    let kept = match crate::wal_mirror::read_kept(&mem, owner) {
        Ok(kept) => kept,
        Err(why) => {
            if mem.as_slice().iter().any(|&b| b != 0) {
                log::warn!("the log mirror {path} is not read ({why}); it is made anew");
            }
            return (Some(mem), Vec::new());
        }
    };
    let device_end = *last_seq;
    let mut replay = Vec::new();
    let mut stopped = None;
    for k in kept {
        let Some((first, batch)) = WriteBatch::decode(&k.record) else {
            stopped = Some("a record that does not decode as a write batch".to_string());
            break;
        };
        let last = first + batch.len() as u64 - 1;
        if last <= *last_seq {
            continue;
        }
        if first != *last_seq + 1 {
            stopped = Some(format!("a gap before sequence {first}"));
            break;
        }
        memtable.apply(first, &batch);
        *last_seq = last;
        replay.push(k.record);
    }
    if let Some(why) = stopped {
        // A record not kept (a blob reference, a full mirror) that never
        // reached the device: it and every record after it were never
        // acknowledged. (Or the device lost written blocks: a power cut,
        // which the mirror does not outlive either.)
        log::warn!(
            "the log mirror {path}: replay stops at {why}, after sequence {}; \
             the writes from there on were never acknowledged",
            *last_seq
        );
    }
    if !replay.is_empty() {
        log::info!(
            "replayed {} log record(s) (write batches) the log mirror {path} kept beyond the device's log (sequences {}..={})",
            replay.len(),
            device_end + 1,
            *last_seq
        );
    }
    (Some(mem), replay)
}

/// Logs `records` (kept by the mirror, applied to the memtable) again and
/// makes them durable before the store takes any write.
fn log_again(wal: &Wal, records: &[Vec<u8>]) -> Result<()> {
    let mut end = None;
    for record in records {
        end = Some(wal.append_pieces(record, &[], false)?);
    }
    match end {
        Some(position) => wal.commit(position),
        None => Ok(()),
    }
}

/// Says what WAL recovery, as asked, passed over (recovery itself names
/// each block it rebuilt).
fn report_wal_recovery(recovered: &wal::Recovered, mode: WalRecovery) {
    if !recovered.dropped.is_empty() {
        log::warn!(
            "WAL recovery {mode:?}: {} log block(s) dropped as asked: {:?}",
            recovered.dropped.len(),
            recovered.dropped
        );
    }
}

/// Opens the devices of a store as one block device: the superblock on the
/// first says how many there are and how much of each is used; every other
/// device's label must name this store and its place in the set.
/// Locks every device of the set for this open (see
/// `sluice_io::device::lock_exclusive`): two processes writing one store
/// would each take the other's extents and log blocks.
fn lock_devices(devices: &[Arc<dyn Device>], wait_ms: u64) -> Result<()> {
    for d in devices {
        let Some(fd) = d.raw_fd() else {
            continue;
        };
        let wait = std::time::Duration::from_millis(wait_ms);
        match sluice_io::device::lock_exclusive(fd, wait) {
            Ok(true) => {}
            Ok(false) => {
                return Err(StoreError::BadDevice(format!(
                    "{} is in use: another process has had this store open for the {wait_ms} ms \
                     this open waited (a store is opened by one process at a time); close it \
                     there, or wait longer (StoreConfig::lock_wait_ms; lock_timeout_s in Python)",
                    d.describe()
                )))
            }
            Err(e) => {
                return Err(StoreError::BadDevice(format!(
                    "locking {}: {e}",
                    d.describe()
                )))
            }
        }
    }
    Ok(())
}

fn open_device_set(devices: Vec<Arc<dyn Device>>) -> Result<BlockDevice> {
    let first = devices
        .first()
        .cloned()
        .ok_or_else(|| StoreError::BadDevice("no device given".into()))?;
    let sb = crate::superblock::read(&BlockDevice::new(first)?)?;
    if sb.member_blocks.len() != devices.len() {
        return Err(StoreError::BadDevice(format!(
            "the store on {} spans {} devices but got {}: pass all of them, in the order they were formatted",
            devices[0].describe(),
            sb.member_blocks.len(),
            devices.len()
        )));
    }
    let names: Vec<String> = devices.iter().map(|d| d.describe()).collect();
    let dev = BlockDevice::set(
        devices
            .into_iter()
            .zip(sb.member_blocks.iter().copied())
            .collect(),
    )?;
    for (k, name) in names.iter().enumerate().skip(1) {
        let (_, base, _) = dev.member(k);
        let problem = match crate::superblock::read_label(&dev, base)? {
            Ok(label) if label.store_id == sb.store_id && label.device_index == k as u32 => continue,
            Ok(label) if label.store_id == sb.store_id => format!(
                "it is device {} of this store, not device {k}: pass the devices in the order they were formatted",
                label.device_index
            ),
            Ok(_) => "it belongs to another store".to_string(),
            Err(e) => format!("it holds no valid store label ({e:?})"),
        };
        return Err(StoreError::BadDevice(format!(
            "{name} cannot be device {k} of the store on {}: {problem}",
            names[0]
        )));
    }
    Ok(dev)
}

/// Frees extents the manifest has allocated but nothing refers to: tables
/// removed by a compaction whose frees were not logged before a crash, or
/// tables written by a flush or compaction that crashed before logging
/// them.
fn reclaim_unreferenced(manifest: &mut Manifest) -> Result<()> {
    let member_starts: Vec<u64> = (1..manifest.device().device_count())
        .map(|k| manifest.device().member(k).1)
        .collect();
    let state = manifest.state();
    let mut referenced: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut refer = |e: Extent| {
        referenced.insert((e.start_block, e.end_block()));
    };
    refer(manifest.superblock().manifest);
    for t in state.tables.values() {
        refer(t.data);
        refer(t.index);
    }
    state.blob_files.values().copied().for_each(&mut refer);
    // The labels at the start of every device after the first.
    for &first in &member_starts {
        refer(Extent {
            start_block: first,
            block_count: crate::superblock::SUPERBLOCK_BLOCKS as u32,
        });
    }
    if let Some(w) = &state.wal {
        w.ring.iter().copied().for_each(&mut refer);
    }
    // Walk the allocated runs (the complement of the free map) and free
    // every part no referenced extent covers.
    let free = state.allocator.free_list();
    let end = manifest.superblock().device_blocks;
    let mut allocated = Vec::new();
    let mut at = crate::superblock::SUPERBLOCK_BLOCKS;
    for f in &free {
        if f.start_block > at {
            allocated.push((at, f.start_block));
        }
        at = f.end_block();
    }
    if at < end {
        allocated.push((at, end));
    }
    let mut frees = Vec::new();
    for (mut s, e) in allocated {
        for &(rs, re) in referenced.range((s, 0)..(e, 0)) {
            if rs > s {
                frees.push((s, rs));
            }
            s = s.max(re);
        }
        if s < e {
            frees.push((s, e));
        }
    }
    if frees.is_empty() {
        return Ok(());
    }
    let edits: Vec<Edit> = frees
        .into_iter()
        .map(|(s, e)| {
            log::warn!("reclaiming unreferenced blocks {s}..{e}");
            Edit::Free(Extent {
                start_block: s,
                block_count: (e - s) as u32,
            })
        })
        .collect();
    manifest.log(&edits)
}
