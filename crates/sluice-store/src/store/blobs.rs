//! Large values apart from the tree: a batch's large puts written to blob
//! files and replaced by references before the batch is logged, blob files
//! opened as they fill, and removed once nothing references them
//! (docs/FORMAT.md, "Blob files").

use super::*;
use crate::batch::LargePut;
use crate::blob::Reserved;

/// The smallest blob file (256 KiB).
const MIN_BLOB_FILE_BLOCKS: u64 = 64;

impl Store {
    /// `batch` with every put of a value at least the blob threshold long
    /// written to a blob file and replaced by its reference, with the
    /// records' places (to be told the write's sequence); None when it
    /// has no such put.
    pub(super) fn separate(
        &self,
        batch: &WriteBatch,
        large_puts: &[LargePut<'_>],
    ) -> Result<Option<(WriteBatch, Vec<Reserved>)>> {
        let threshold = self.inner.blob_threshold_bytes();
        let large =
            |op: &crate::batch::BatchOp<'_>| op.kind == OpKind::Put && op.value.len() >= threshold;
        if large_puts.is_empty()
            && (!batch.has_blob_candidates() || !batch.ops().any(|op| large(&op)))
        {
            return Ok(None);
        }
        if self.inner.short_of_room() {
            self.check_room(batch)?;
            if !large_puts.is_empty() {
                if let Some(why) = self.writes_refused(false) {
                    return Err(StoreError::WritesRefused(why));
                }
            }
        }
        let mut out = WriteBatch::new();
        let mut reserved = Vec::new();
        let mut direct_devices = BTreeSet::new();
        for op in batch.ops() {
            if !large(&op) {
                out.push_op(&op)?;
                continue;
            }
            let (place, reference, staged) =
                self.inner
                    .place_blob(op.keyspace, op.key, &[op.value], true)?;
            out.put_blob(op.keyspace, op.key, &reference.encode());
            if !staged {
                direct_devices.insert(place.file.extent.start_block);
            }
            reserved.push(place);
        }
        // Written from where they lie, never gathered: they are large.
        for put in large_puts {
            let (place, reference, _) =
                self.inner
                    .place_blob(put.keyspace, put.key, put.value, false)?;
            out.put_blob(put.keyspace, put.key, &reference.encode());
            direct_devices.insert(place.file.extent.start_block);
            reserved.push(place);
        }
        // A blob written on another device than the log's: the log's flush
        // does not cover it, so it is made durable before its reference is
        // logged. (Gathered records are written, and their device flushed,
        // before any log block: `Inner::write_blob_staging`.)
        let log_device = self.inner.log_device();
        let mut flushed = BTreeSet::new();
        for block in direct_devices {
            let k = self.inner.dev.member_of(block);
            if k != log_device && flushed.insert(k) {
                self.inner.dev.flush_holding(block)?;
            }
        }
        Ok(Some((out, reserved)))
    }
}

impl Inner {
    /// The blob threshold, kept in its bounds.
    pub(super) fn blob_threshold_bytes(&self) -> usize {
        self.config
            .blob_threshold_bytes
            .clamp(blob::MIN_THRESHOLD_BYTES, blob::MAX_THRESHOLD_BYTES)
    }

    /// What a memtable counts for against the write buffer: its own bytes,
    /// and the values its blob references name at the buffer's share of
    /// the blob budget (a sixteenth of the device, 1 MiB to 1 GiB). A
    /// blob file that overwrites and deletes emptied can go only once no
    /// memtable may reference it: large values make the memtable flush
    /// after about that budget of them, not after a write buffer of
    /// 28-byte references.
    pub(super) fn memtable_weight(&self, m: &Memtable) -> usize {
        let budget =
            (self.dev.block_count() * STORE_BLOCK_BYTES as u64 / 16).clamp(1 << 20, 1 << 30);
        let share =
            m.blob_value_bytes() as u128 * self.config.write_buffer_bytes as u128 / budget as u128;
        m.approximate_bytes()
            .saturating_add(usize::try_from(share).unwrap_or(usize::MAX))
    }

    /// The device of the log.
    pub(super) fn log_device(&self) -> usize {
        self.dev.member_of(self.wal.layout().ring[0].start_block)
    }

    /// Writes the records gathered in memory (the log calls it before it
    /// writes any block).
    pub(super) fn write_blob_staging(&self) -> Result<()> {
        lock(&self.blob_appender).write_staging(&self.dev, self.log_device())
    }

    /// Puts the record of (`keyspace`, `key`, `value`) in a blob file:
    /// the file being appended to (gathered in memory with `stage` when it
    /// is small, written at once otherwise), a new one when it is full, or
    /// a file of its own for a value larger than a quarter of one. Returns
    /// its place, its reference and whether it was gathered.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a new blob file has room for a record"
    )]
    pub(super) fn place_blob(
        &self,
        keyspace: u32,
        key: &[u8],
        value: &[&[u8]],
        stage: bool,
    ) -> Result<(Reserved, blob::BlobRef, bool)> {
        let value_len = value.iter().map(|p| p.len()).sum();
        let blocks = blob::record_blocks(key.len(), value_len);
        // A small device gets small files: a 32nd of it at most.
        let file_blocks = self
            .config
            .blob_file_bytes
            .div_ceil(STORE_BLOCK_BYTES as u64)
            .min(self.dev.block_count() / 32)
            .max(MIN_BLOB_FILE_BLOCKS);
        // A record of more than a quarter of a file gets a file of its
        // own, sized to it: a shared file then wastes at most a quarter
        // at its end.
        if blocks > file_blocks / 4 {
            let file = self.open_blob_file(blocks)?;
            let place = blob::Appender::dedicated(file);
            let reference = place.write(&self.dev, keyspace, key, value)?;
            return Ok((place, reference, false));
        }
        let mut appender = lock(&self.blob_appender);
        let place = match appender.reserve(&self.dev, blocks)? {
            Some(place) => place,
            None => {
                let file = self.open_blob_file(file_blocks)?;
                appender.start(&self.dev, file)?;
                appender
                    .reserve(&self.dev, blocks)?
                    .expect("a new blob file has room for a record")
            }
        };
        let record_bytes = blocks as usize * STORE_BLOCK_BYTES;
        if stage && record_bytes <= blob::MAX_STAGED_RECORD_BYTES {
            // Under the appender's lock: it orders a file's records. (A
            // value to stage is one piece: it came from a batch.)
            let joined;
            let value = match value {
                [one] => *one,
                pieces => {
                    joined = pieces.concat();
                    &joined
                }
            };
            let reference = place.stage(&self.dev, keyspace, key, value)?;
            return Ok((place, reference, true));
        }
        drop(appender);
        let reference = place.write(&self.dev, keyspace, key, value)?;
        Ok((place, reference, false))
    }

    /// Allocates, logs and adds to the version a blob file of `blocks`,
    /// on the next data device in turn (the first device of a store with
    /// one). Refused while it would take the room kept for flushes and
    /// compactions.
    fn open_blob_file(&self, blocks: u64) -> Result<Arc<BlobFile>> {
        let block_count = u32::try_from(blocks).map_err(|_| {
            StoreError::BadInput(format!("a blob file of {blocks} store blocks is too large"))
        })?;
        let extent = {
            let mut manifest = lock(&self.manifest);
            let free = manifest.state().allocator.free_blocks();
            if free.saturating_sub(blocks) < self.reserve_blocks {
                // As a table allocation that left less than the reserve
                // would: writes that add data are refused until free
                // space is back past half the reserve again.
                if !self.space_low.swap(true, Ordering::AcqRel) {
                    log::warn!(
                        "device nearly full: a blob file of {blocks} store blocks would leave less than the {} kept for flushes and compactions: writes that add data are refused, deletes taken",
                        self.reserve_blocks
                    );
                }
                let block = STORE_BLOCK_BYTES as u64;
                return Err(StoreError::WritesRefused(WritesRefused::SpaceLow {
                    free_bytes: free * block,
                    reserve_bytes: self.reserve_blocks * block,
                    resume_bytes: super::flush::resume_blocks(self.reserve_blocks) * block,
                    device_bytes: self.dev.block_count() * block,
                }));
            }
            let data_devices = self.dev.device_count() - 1;
            let allocated = if data_devices == 0 {
                manifest.allocate(blocks)
            } else {
                let turn = self.next_data_device.fetch_add(1, Ordering::Relaxed) as usize;
                let mut result = Err(StoreError::BadInput("no data device".into()));
                for k in (0..data_devices).map(|i| 1 + (turn + i) % data_devices) {
                    result = manifest.allocate_on(k, blocks);
                    if result.is_ok() {
                        break;
                    }
                }
                result
            };
            self.note_free_space(&manifest);
            allocated?
        };
        debug_assert_eq!(extent.block_count, block_count);
        let file_no = self.next_file.fetch_add(1, Ordering::Relaxed);
        self.log_group(&[
            Edit::Alloc(extent),
            Edit::AddBlobFile { file_no, extent },
            Edit::NextFile(file_no + 1),
        ])?;
        let file = Arc::new(BlobFile::new(
            file_no,
            extent,
            false,
            0,
            self.released.clone(),
        ));
        let mut v = write(&self.version);
        let mut next = (**v).clone();
        next.blob_files.insert(file_no, file.clone());
        *v = Arc::new(next);
        self.view_generation.fetch_add(1, Ordering::Release);
        Ok(file)
    }

    /// [`Inner::drop_unreferenced_blob_files`] where a failure is not the
    /// caller's (a flush or compaction that succeeded): logged, and tried
    /// again after the next one.
    pub(super) fn drop_unreferenced_blob_files_logged(&self) {
        if let Err(e) = self.drop_unreferenced_blob_files() {
            log::warn!("removing blob files nothing references failed (tried again later): {e}");
        }
    }

    /// Blob files mostly garbage, by number: closed for appends, no
    /// memtable may reference them, and the tables of `version` reference
    /// less than half of their blocks. A compaction moves the values it
    /// keeps out of them ([`Inner::relocate_blob`]), so that they empty
    /// and go; this is the blob files' garbage collection, run by the
    /// compactions at their low I/O priority.
    pub(super) fn sparse_blob_files(&self, version: &Version) -> BTreeMap<u64, Arc<BlobFile>> {
        let flushed_seq = self.tables_hold_upto.load(Ordering::Acquire);
        let referenced = version.referenced_blob_blocks();
        version
            .blob_files
            .values()
            .filter(|f| !f.memtable_may_reference(flushed_seq))
            .filter(|f| {
                let live = referenced.get(&f.file_no).copied().unwrap_or(0);
                live * 2 < f.extent.block_count as u64
            })
            .map(|f| (f.file_no, f.clone()))
            .collect()
    }

    /// The new reference of a value a compaction keeps, if it lies in one
    /// of the `sparse` files: read, written to the file being appended
    /// to, its place kept in `moved` until the compaction is installed.
    pub(super) fn relocate_blob(
        &self,
        sparse: &BTreeMap<u64, Arc<BlobFile>>,
        keyspace: u32,
        key: &[u8],
        reference: &[u8],
        moved: &mut Vec<Reserved>,
    ) -> Result<Option<[u8; blob::REF_BYTES]>> {
        let Some(r) = blob::BlobRef::decode(reference) else {
            return Ok(None);
        };
        let Some(file) = sparse.get(&r.file_no) else {
            return Ok(None);
        };
        let value = file.read_value(&self.dev, &r)?;
        // Written at once, not gathered: the compaction's tables are
        // logged without the log's writes, which write what is gathered.
        let (place, new) = match self.place_blob(keyspace, key, &[&value[..]], false) {
            Ok((place, new, _)) => (place, new),
            // Short of room: the value stays where it is; the compaction
            // goes on (it may be what frees room).
            Err(StoreError::WritesRefused(_) | StoreError::DeviceFull { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        moved.push(place);
        self.blob_relocations.fetch_add(1, Ordering::Relaxed);
        Ok(Some(new.encode()))
    }

    /// Removes every blob file nothing references any more: no table of
    /// the version, no memtable (every write into it is flushed), and not
    /// the file being appended to. One manifest group; the extents come
    /// back once no reader holds a view with the file.
    pub(super) fn drop_unreferenced_blob_files(&self) -> Result<()> {
        // One caller at a time (a flush and a compaction may both ask).
        let _appender = lock(&self.blob_appender);
        // Read before the version: the flush that raised it had put its
        // tables in the version first.
        let flushed_seq = self.tables_hold_upto.load(Ordering::Acquire);
        let gone: Vec<u64> = {
            let v = read(&self.version);
            if v.blob_files.is_empty() {
                return Ok(());
            }
            let referenced = v.referenced_blob_blocks();
            v.blob_files
                .values()
                .filter(|f| {
                    !referenced.contains_key(&f.file_no) && !f.memtable_may_reference(flushed_seq)
                })
                .map(|f| f.file_no)
                .collect()
        };
        if gone.is_empty() {
            return Ok(());
        }
        let mut edits: Vec<Edit> = gone.iter().map(|&f| Edit::RemoveBlobFile(f)).collect();
        edits.extend(self.take_released());
        self.log_group(&edits)?;
        let mut v = write(&self.version);
        let mut next = (**v).clone();
        for file_no in &gone {
            if let Some(f) = next.blob_files.remove(file_no) {
                f.mark_obsolete();
            }
        }
        *v = Arc::new(next);
        self.view_generation.fetch_add(1, Ordering::Release);
        drop(v);
        // Files no reader held are released already: log their frees now
        // rather than with the next group (one may be a while coming).
        let frees = self.take_released();
        if !frees.is_empty() {
            self.log_group(&frees)?;
        }
        Ok(())
    }
}
