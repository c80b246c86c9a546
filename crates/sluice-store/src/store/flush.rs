//! Memtable flushes into level-0 tables, and where tables are placed on
//! the device set.

use super::*;

/// A table written to its extents, not yet logged.
pub(super) struct Placed {
    keyspace: u32,
    extent: Extent,
    /// Index, filter, tombstones and footer, when not inside `extent`.
    meta: Option<Extent>,
    file_no: u64,
    index_offset_blocks: u32,
    entries: u64,
    smallest: Vec<u8>,
    largest: Vec<u8>,
    blob_refs: Vec<(u64, u64)>,
    /// The data blocks as written, to put in the block cache once the
    /// table is installed (a memtable flush's: the newest data is read
    /// most, and otherwise every read of it misses until it is read back).
    warm: Option<Vec<u8>>,
}

impl Placed {
    pub(super) fn extents(&self) -> impl Iterator<Item = Extent> {
        std::iter::once(self.extent).chain(self.meta)
    }
}

impl Store {
    /// Writes the memtable out as level-0 tables and releases its WAL blocks.
    pub fn flush(&self) -> Result<()> {
        self.inner.flush()
    }
}

impl Inner {
    /// Writes the memtable out as level-0 tables and releases its WAL
    /// blocks; the tables and the manifest at low I/O priority, the log's
    /// last block at high.
    pub fn flush(&self) -> Result<()> {
        with_io_priority(Priority::Low, || self.flush_memtable())
    }

    fn flush_memtable(&self) -> Result<()> {
        let _one = lock(&self.flush_lock);
        // A memtable whose flush failed goes first, and no other is frozen
        // before it is in tables: the log keeps its records until then,
        // and reads find it where they look for a frozen memtable.
        let left = lock(&self.unflushed).take();
        if let Some(frozen) = left {
            self.flush_noting(frozen)?;
        }
        match self.freeze()? {
            Some(frozen) => self.flush_noting(frozen),
            None => Ok(()),
        }
    }

    /// Writes `frozen` to tables; a failure keeps it for the next flush
    /// and refuses writes past the memtable's room until one succeeds.
    fn flush_noting(&self, frozen: Frozen) -> Result<()> {
        match self.flush_frozen(&frozen) {
            Ok(()) => {
                if self.flush_failing.swap(false, Ordering::AcqRel) {
                    log::info!("the memtable is on the device again: writes resume");
                }
                *lock(&self.flush_failure) = None;
                lock(&self.retired_memtables).push(frozen.mem);
                self.free_retired_memtables();
                self.wake_background();
                Ok(())
            }
            Err(e) => {
                let why = e.to_string();
                let mut failure = lock(&self.flush_failure);
                if failure.as_deref() != Some(why.as_str()) {
                    log::error!("flushing the memtable failed (retried each second): {why}");
                }
                *failure = Some(why);
                self.flush_failing.store(true, Ordering::Release);
                *lock(&self.unflushed) = Some(frozen);
                Err(e)
            }
        }
    }

    /// Freezes the active memtable, if it holds anything: new writes go
    /// to a fresh one; the WAL closes its open block so the frozen records
    /// end at a block boundary.
    fn freeze(&self) -> Result<Option<Frozen>> {
        let inner = self;
        let mut writer = lock(&inner.writer);
        let mut mem = write(&inner.memtables);
        let keys = {
            let active = read(&mem.active);
            if active.is_empty() {
                return Ok(None);
            }
            active.key_count()
        };
        let tail = with_io_priority(Priority::High, || inner.wal.close_block())?;
        // Room for as many keys as the last one took, and an eighth.
        let next_memtable = Memtable::with_key_room(keys + keys / 8, keys + keys / 8);
        let frozen = std::mem::replace(&mut mem.active, Arc::new(RwLock::new(next_memtable)));
        writer.active = mem.active.clone();
        assert!(
            mem.frozen.is_none(),
            "a second memtable frozen before the first is flushed"
        );
        mem.frozen = Some(frozen.clone());
        // Under the writer lock, as every apply is.
        inner.active_bytes.store(0, Ordering::Relaxed);
        inner.flushing.store(true, Ordering::Relaxed);
        inner.view_generation.fetch_add(1, Ordering::Release);
        Ok(Some(Frozen {
            mem: frozen,
            tail_seq: tail,
            last_seq: writer.next_seq - 1,
        }))
    }

    /// Writes a frozen memtable to level-0 tables, logs them with the log's
    /// new tail, and releases the log's blocks before it.
    fn flush_frozen(&self, frozen: &Frozen) -> Result<()> {
        let inner = self;
        let (tail_seq, last_seq) = (frozen.tail_seq, frozen.last_seq);
        let frozen = &frozen.mem;
        // Every frozen write must be visible (committed) before it is flushed.
        inner
            .visible_seq
            .wait(last_seq, 0, || inner.write_failed.load(Ordering::Acquire));
        // Read after every frozen write is visible: a snapshot registered
        // later sees the newest version of every frozen key.
        let snapshots: Vec<u64> = lock(&inner.snapshots.live).keys().copied().collect();
        let frozen_guard = read(frozen);
        let names: BTreeMap<u32, String> = read(&inner.keyspaces)
            .values()
            .map(|k| (k.id, k.name.clone()))
            .collect();
        let mut placed = Vec::new();
        for ks in frozen_guard.keyspaces() {
            if !names.contains_key(&ks) {
                // Dropped since these writes were made.
                continue;
            }
            if let Err(e) = self.flush_keyspace(&frozen_guard, ks, &snapshots, &mut placed) {
                self.unplace(&placed.iter().flat_map(Placed::extents).collect::<Vec<_>>());
                return Err(e);
            }
        }
        drop(frozen_guard);
        let mut extra = vec![
            Edit::Wal(WalPlace {
                epoch: inner.wal_epoch(),
                tail_seq,
                ring: inner.wal_ring(),
            }),
            Edit::LastSequence(last_seq),
        ];
        extra.extend(self.take_released());
        let tables = self.install(placed, 0, &names, &[], extra)?;
        inner.wal.release_before(tail_seq);
        {
            let mut mem = write(&inner.memtables);
            let mut v = write(&inner.version);
            let mut next = (**v).clone();
            for t in tables {
                next.keyspaces.entry(t.meta.keyspace).or_default().insert(t);
            }
            *v = Arc::new(next);
            mem.frozen = None;
            inner.flushing.store(false, Ordering::Relaxed);
            inner.view_generation.fetch_add(1, Ordering::Release);
        }
        inner
            .tables_hold_upto
            .fetch_max(last_seq, Ordering::Release);
        inner.flushes.fetch_add(1, Ordering::Relaxed);
        self.drop_unreferenced_blob_files_logged();
        Ok(())
    }

    /// Writes one keyspace of a frozen memtable to level-0 tables, pushed
    /// to `placed`: one table, or several with adjacent key ranges when
    /// the device has no free run long enough for one
    /// ([`Inner::table_room_bytes`]).
    fn flush_keyspace(
        &self,
        frozen: &Memtable,
        ks: u32,
        snapshots: &[u64],
        placed: &mut Vec<Placed>,
    ) -> Result<()> {
        // The memtable's size is above its tables' (it counts each key's
        // bookkeeping too): room enough, and only touched pages are ever
        // faulted in.
        let buffer_bytes = frozen.approximate_bytes();
        let new_builder = || TableBuilder::with_buffer(self.table_buffers.take(buffer_bytes));
        // Range tombstones go to every table of the flush, as compaction
        // puts them in every output.
        let tombstones = frozen.range_tombstones(ks);
        let mut place = |mut b: TableBuilder| -> Result<()> {
            for t in &tombstones {
                b.add_range_tombstone(t.clone());
            }
            let built = b.finish();
            // Warmed only while one table takes at most a quarter of the
            // cache, so a flush never empties it.
            let data_bytes = built.index_offset_blocks as usize * STORE_BLOCK_BYTES;
            let warm = data_bytes <= self.cache.capacity_bytes() / 4;
            placed.push(self.place(ks, built, warm)?);
            Ok(())
        };
        let mut b = new_builder();
        let mut cut_bytes = self.table_room_bytes();
        let mut failed = None;
        // Only the newest version of a key in each snapshot stripe goes to
        // the table, as compaction keeps them: an overwritten hot key
        // costs the flush one entry, not one per write.
        let (mut last_key, mut last_stripe, mut any) = (Vec::new(), 0usize, false);
        frozen.chunk(
            ks,
            &[],
            None,
            false,
            None,
            usize::MAX,
            &mut |key, seq, kind, value| {
                let stripe = compaction::stripe(snapshots, seq);
                let new_key = !any || last_key != key;
                if failed.is_some() || (!new_key && last_stripe == stripe) {
                    return;
                }
                // Never cut between two versions of one key.
                if new_key && b.entries() > 0 && b.estimated_bytes() >= cut_bytes {
                    if let Err(e) = place(std::mem::replace(&mut b, new_builder())) {
                        failed = Some(e);
                        return;
                    }
                    cut_bytes = self.table_room_bytes();
                }
                last_key.clear();
                last_key.extend_from_slice(key);
                (last_stripe, any) = (stripe, true);
                b.add_version(key, seq, kind, value);
            },
        );
        match failed {
            Some(e) => Err(e),
            None => place(b),
        }
    }

    /// Drops the retired memtables no reader holds any more (each one's
    /// entries are freed here, on the flushing or background thread).
    pub(super) fn free_retired_memtables(&self) {
        let unheld: Vec<Arc<RwLock<Memtable>>> = {
            let mut retired = lock(&self.retired_memtables);
            let (unheld, held) = retired.drain(..).partition(|m| Arc::strong_count(m) == 1);
            *retired = held;
            unheld
        };
        drop(unheld);
    }

    /// Logs one manifest group. If it fails nothing was applied: the
    /// extents its `Alloc` edits name go back to the allocator (their
    /// tables are abandoned) and its `Free` edits wait for the next group.
    pub(super) fn log_group(&self, edits: &[Edit]) -> Result<()> {
        let mut manifest = lock(&self.manifest);
        let Err(e) = manifest.log(edits) else {
            self.note_free_space(&manifest);
            return Ok(());
        };
        for edit in edits {
            match edit {
                // Allocated and never logged: releasing cannot fail unless
                // the allocator is broken, and then reopening reclaims.
                Edit::Alloc(x) => drop(manifest.release_unlogged(*x)),
                Edit::Free(x) => lock(&self.released).push(*x),
                _ => {}
            }
        }
        Err(e)
    }

    /// Keeps the free-space figures writes look at as the manifest has
    /// them now.
    ///
    /// Writes are refused below the reserve and resume only once free
    /// space is back above [`resume_blocks`] (as Elasticsearch's flood
    /// stage holds until usage is below its high watermark): a compaction
    /// installs its outputs before its inputs are freed, and without the
    /// margin that dip and its recovery would refuse and take writes by
    /// turns while the device stays as full.
    pub(super) fn note_free_space(&self, manifest: &Manifest) {
        let free = manifest.state().allocator.free_blocks();
        self.free_blocks_hint.store(free, Ordering::Relaxed);
        let was_low = self.space_low.load(Ordering::Acquire);
        let low = if was_low {
            free < resume_blocks(self.reserve_blocks)
        } else {
            free < self.reserve_blocks
        };
        if self.space_low.swap(low, Ordering::AcqRel) != low {
            let mib = |blocks: u64| blocks as f64 * STORE_BLOCK_BYTES as f64 / (1 << 20) as f64;
            if low {
                log::warn!(
                    "device nearly full: {:.1} MiB free, below the {:.1} MiB kept for flushes and compactions: writes that add data are refused, deletes taken",
                    mib(free),
                    mib(self.reserve_blocks)
                );
            } else {
                log::info!(
                    "free space is back above the reserve and half of it again ({:.1} MiB free): writes resume",
                    mib(free)
                );
            }
        }
    }

    /// Free edits for tables whose last reader has let go.
    pub(super) fn take_released(&self) -> Vec<Edit> {
        std::mem::take(&mut *lock(&self.released))
            .into_iter()
            .map(Edit::Free)
            .collect()
    }

    /// Allocates an extent for a built table and writes it there; the
    /// allocation is logged by [`Inner::install`].
    ///
    /// With `warm`, the placed table keeps its data blocks for the cache.
    pub(super) fn place(&self, keyspace: u32, t: BuiltTable, warm: bool) -> Result<Placed> {
        let (extent, meta) = self.allocate_table(&t)?;
        let written = match meta {
            Some(meta) => write_table_parts(&self.dev, extent, meta, &t),
            None => write_table(&self.dev, extent, &t),
        };
        if let Err(e) = written {
            self.unplace(&[extent]);
            self.unplace(meta.as_slice());
            return Err(e);
        }
        let file_no = self.next_file.fetch_add(1, Ordering::Relaxed);
        Ok(Placed {
            keyspace,
            extent,
            meta,
            file_no,
            index_offset_blocks: t.index_offset_blocks,
            entries: t.entries,
            smallest: t.smallest,
            largest: t.largest,
            blob_refs: t.blob_refs,
            warm: if warm {
                let mut data = t.bytes;
                data.truncate(t.index_offset_blocks as usize * STORE_BLOCK_BYTES);
                Some(data)
            } else {
                self.table_buffers.give(t.bytes);
                None
            },
        })
    }

    /// Bytes a table may reach and still find one extent now: three
    /// quarters of the largest free run where tables' data goes (its
    /// index, filter and footer, and the versions of its last key past the
    /// cut, take the rest). On a fragmented device, flushes and
    /// compactions cut their tables to it rather than fail for want of
    /// one long run while the free space is there.
    pub(super) fn table_room_bytes(&self) -> usize {
        let manifest = lock(&self.manifest);
        let data_devices = self.dev.device_count() - 1;
        let blocks = if data_devices == 0 {
            manifest.largest_free_on(0)
        } else {
            (1..=data_devices)
                .map(|k| manifest.largest_free_on(k))
                .max()
                .unwrap_or(0)
        };
        let bytes = usize::try_from(blocks).unwrap_or(usize::MAX / 2);
        (bytes.saturating_mul(STORE_BLOCK_BYTES) / 4 * 3).max(STORE_BLOCK_BYTES)
    }

    /// Allocates a table's extents ([`Inner::allocate_table_in`]) and
    /// updates the free-space figures writes look at at once: a compaction
    /// places its outputs long before it logs them, and writes must be
    /// refused for room while it is taking the room, not after (a flush
    /// would find none left).
    fn allocate_table(&self, t: &BuiltTable) -> Result<(Extent, Option<Extent>)> {
        let mut manifest = lock(&self.manifest);
        let allocated = self.allocate_table_in(&mut manifest, t);
        self.note_free_space(&manifest);
        allocated
    }

    /// Extents for a built table: one on the first device when the store
    /// has one device (or the table no data blocks); else the data blocks
    /// on the next data device in turn (the others if it is full) and the
    /// rest on the first device.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: at least one data device"
    )]
    fn allocate_table_in(
        &self,
        manifest: &mut Manifest,
        t: &BuiltTable,
    ) -> Result<(Extent, Option<Extent>)> {
        let blocks = (t.bytes.len() / STORE_BLOCK_BYTES) as u64;
        let data_blocks = t.index_offset_blocks as u64;
        let data_devices = self.dev.device_count() - 1;
        if data_devices == 0 || data_blocks == 0 {
            return Ok((manifest.allocate(blocks)?, None));
        }
        let meta = manifest.allocate(blocks - data_blocks)?;
        let turn = self.next_data_device.fetch_add(1, Ordering::Relaxed) as usize;
        let mut full = None;
        for k in (0..data_devices).map(|i| 1 + (turn + i) % data_devices) {
            match manifest.allocate_on(k, data_blocks) {
                Ok(data) => return Ok((data, Some(meta))),
                Err(e @ StoreError::DeviceFull { .. }) => full = Some(e),
                Err(e) => {
                    let _ = manifest.release_unlogged(meta);
                    return Err(e);
                }
            }
        }
        let _ = manifest.release_unlogged(meta);
        Err(full.expect("at least one data device"))
    }

    /// Gives back extents of placed tables that will not be installed.
    pub(super) fn unplace(&self, extents: &[Extent]) {
        let mut manifest = lock(&self.manifest);
        for e in extents {
            // They were allocated and never logged: releasing cannot fail
            // unless the allocator is broken, and then reopening reclaims.
            let _ = manifest.release_unlogged(*e);
        }
        self.note_free_space(&manifest);
    }

    /// Logs placed tables at `level` (with `removed` and `extra` edits) as
    /// one manifest group, and opens them.
    pub(super) fn install(
        &self,
        placed: Vec<Placed>,
        level: u8,
        names: &BTreeMap<u32, String>,
        removed: &[(u32, u64)],
        extra: Vec<Edit>,
    ) -> Result<Vec<Arc<Table>>> {
        let inner = self;
        let mut edits = Vec::new();
        let mut metas = Vec::new();
        let mut warm = Vec::new();
        for p in placed {
            warm.push(p.warm);
            let meta = TableMeta {
                keyspace: p.keyspace,
                level,
                file_no: p.file_no,
                data: p.extent,
                index: p.meta.unwrap_or(Extent {
                    start_block: p.extent.start_block + p.index_offset_blocks as u64,
                    block_count: p.extent.block_count - p.index_offset_blocks,
                }),
                entries: p.entries,
                smallest: p.smallest,
                largest: p.largest,
                blob_refs: p.blob_refs,
            };
            edits.extend(std::iter::once(p.extent).chain(p.meta).map(Edit::Alloc));
            edits.push(Edit::AddTable(meta.clone()));
            metas.push(meta);
        }
        for (ks, file_no) in removed {
            edits.push(Edit::RemoveTable {
                keyspace: *ks,
                file_no: *file_no,
            });
        }
        edits.extend(extra);
        edits.push(Edit::NextFile(inner.next_file.load(Ordering::Relaxed)));
        self.log_group(&edits)?;
        metas
            .into_iter()
            .zip(warm)
            .map(|(meta, warm)| {
                let name = names.get(&meta.keyspace).map_or("?", String::as_str);
                let reader = TableReader::open_parts(
                    &inner.dev,
                    meta.data,
                    Some(meta.index),
                    TablePlace {
                        keyspace: name,
                        file_no: meta.file_no,
                    },
                )?
                .with_cache(inner.cache.clone())
                .with_index_memory(inner.pin_budget.clone(), inner.index_cache.clone());
                if let Some(data) = warm {
                    reader.warm_cache(&inner.dev, &data)?;
                    inner.table_buffers.give(data);
                }
                Ok(Arc::new(Table::new(meta, reader, inner.released.clone())))
            })
            .collect()
    }

    /// The most level-0 tables any keyspace has: counted once per view
    /// generation (every write asks).
    pub(super) fn l0_tables(&self) -> usize {
        const COUNT_BITS: u32 = 16;
        let generation = self.view_generation.load(Ordering::Acquire);
        let counted = self.l0_counted.load(Ordering::Acquire);
        if counted >> COUNT_BITS == generation {
            return (counted & ((1 << COUNT_BITS) - 1)) as usize;
        }
        // The version read is at least as new as `generation`: a count
        // stored under an older generation is never taken for a newer one.
        let count = read(&self.version)
            .keyspaces
            .values()
            .map(|l| l.level(0).len())
            .max()
            .unwrap_or(0);
        let stored = count.min((1 << COUNT_BITS) - 1) as u64;
        self.l0_counted
            .store(generation << COUNT_BITS | stored, Ordering::Release);
        count
    }

    fn wal_epoch(&self) -> u64 {
        self.wal.layout().epoch
    }

    fn wal_ring(&self) -> Vec<Extent> {
        self.wal.layout().ring.clone()
    }
}

/// Free blocks at which writes refused for room resume: the reserve and
/// half of it again.
pub(super) fn resume_blocks(reserve_blocks: u64) -> u64 {
    reserve_blocks.saturating_add(reserve_blocks / 2)
}
