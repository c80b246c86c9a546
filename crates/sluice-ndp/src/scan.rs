//! SCAN with a predicate, a projection and a limit, run inside the engine.
//! Each pair is examined where the store's iterator holds it (no copy, no
//! allocation per pair); only matching pairs are copied out — projected to
//! the fields asked for — into result batches handed over whole.
//!
//! ## Result batch encoding
//!
//! A batch is a multiple of 4096 bytes, little-endian:
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 4 | magic `"SLRB"` |
//! | 4 | 4 | rows |
//! | 8 | 4 | bytes used, header included |
//! | 12 | 4 | zero |
//! | 16 | … | per row: `u32` key length, `u32` value length, key, value |
//! | used | … | zero padding to the batch size |
//!
//! A batch is cut when the next row would pass the batch size; a row larger
//! than that gets a batch of its own, rounded up to 4096 bytes.
//!
//! Why not Arrow IPC, the ecosystem's choice for columnar result sets: the
//! rows here are a key and a variable JSON document (or a projection of
//! one), not typed columns, so an Arrow batch would hold two binary columns
//! and add a schema message and flatbuffer metadata per batch for nothing a
//! reader could use; and a batch must be a whole number of 4 KiB blocks so
//! it can be written to or read from a device with direct I/O as it is.
//! Arrow comes at the edge instead: `sluice-arrow` turns these rows into
//! typed record batches where a consumer asks for columns (Python,
//! `sluice query --format arrow`).

use crate::expr::Path;
use crate::format::{Access, FormatError, Layout};
use crate::predicate::{FieldPredicate, MalformedValue};
use sluice_io::codec::{u32_at, Reader};
use sluice_store::{Store, StoreError};
use std::ops::Bound;

/// Result batches are multiples of this.
pub const BATCH_ALIGN_BYTES: usize = 4096;
/// Bytes of a batch's header (magic, rows, used length, reserved).
pub const BATCH_HEADER_BYTES: usize = 16;
const MAGIC: &[u8; 4] = b"SLRB";
/// Largest batch a scan may be asked for.
pub const MAX_BATCH_BYTES: usize = 64 << 20;

/// What a scan refuses or fails at.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The scan does not fit the keyspace's format.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A stored value that is not of its keyspace's format.
    #[error("key {key}: {error}")]
    Malformed {
        /// Its key.
        key: String,
        /// What is wrong.
        error: MalformedValue,
    },
    /// A batch size out of range.
    #[error("batch size {0} bytes: use a multiple of 4096 from 4096 to 64 MiB")]
    BatchSize(usize),
    /// Bytes that are not a result batch.
    #[error("not a result batch: {0}")]
    BadBatch(&'static str),
    /// The consumer of the batches failed (writing them out, say).
    #[error("handing results over: {0}")]
    Sink(String),
}

/// Fields to keep of each matching value: the result is a JSON object
/// with one member per path found, named by the path as written.
#[derive(Debug, Clone)]
pub struct Projection {
    layout: Layout,
    fields: Vec<(String, Access)>,
}

impl Projection {
    /// For JSON documents with no declared fields.
    pub fn new(paths: &[Path]) -> Self {
        Self::build(paths, Layout::json_undeclared())
    }

    /// For a keyspace's declared format; unknown fields are refused here.
    pub fn new_for(paths: &[Path], layout: &Layout) -> Result<Self, FormatError> {
        for p in paths {
            layout.check_path(p)?;
        }
        Ok(Self::build(paths, layout.clone()))
    }

    fn build(paths: &[Path], layout: Layout) -> Self {
        let fields = paths
            .iter()
            .map(|p| (p.to_string(), layout.access(p)))
            .collect();
        Projection { layout, fields }
    }

    /// Appends the projected document to `out`.
    #[expect(
        clippy::expect_used,
        reason = "serializing a string to JSON cannot fail"
    )]
    fn apply(&self, doc: &[u8], out: &mut Vec<u8>) -> Result<(), MalformedValue> {
        out.push(b'{');
        let mut first = true;
        for (name, access) in &self.fields {
            let Some(value) = self.layout.get(doc, access)? else {
                continue;
            };
            if !first {
                out.push(b',');
            }
            first = false;
            out.extend_from_slice(sonic_rs::to_string(name).expect("a string").as_bytes());
            out.push(b':');
            value.write_json(out);
        }
        out.push(b'}');
        Ok(())
    }
}

/// One SCAN.
pub struct ScanSpec<'a> {
    /// The keyspace scanned.
    pub keyspace: u32,
    /// The key range scanned.
    pub range: (Bound<&'a [u8]>, Bound<&'a [u8]>),
    /// From the largest key down.
    pub reverse: bool,
    /// Rows must match it (None: every row).
    pub predicate: Option<&'a FieldPredicate>,
    /// Fields returned (None: whole values).
    pub projection: Option<&'a Projection>,
    /// Most rows returned.
    pub limit: usize,
    /// Size of each result batch (a multiple of 4096).
    pub batch_bytes: usize,
    /// Worker threads over disjoint parts of the range (1 to 64).
    pub threads: usize,
}

/// What a scan looked at and what it handed over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanStats {
    /// Rows read.
    pub rows_examined: u64,
    /// Bytes of keys and values read.
    pub bytes_examined: u64,
    /// Rows handed over.
    pub rows_returned: u64,
    /// Bytes of the batches handed over, padding included.
    pub bytes_returned: u64,
    /// Batches handed over.
    pub batches: u64,
}

/// Rows in the batch encoding above.
#[derive(Debug, Clone)]
pub struct ResultBatch {
    bytes: Vec<u8>,
}

impl ResultBatch {
    fn with_capacity(batch_bytes: usize) -> Self {
        let mut bytes = Vec::with_capacity(batch_bytes);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&[0; BATCH_HEADER_BYTES - 4]);
        ResultBatch { bytes }
    }

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a batch has its header"
    )]
    fn rows_count(&self) -> u32 {
        u32_at(&self.bytes, 4).expect("a batch has its header")
    }

    fn is_empty(&self) -> bool {
        self.rows_count() == 0
    }

    fn used(&self) -> usize {
        self.bytes.len()
    }

    fn push(&mut self, key: &[u8], value: &[u8]) {
        self.bytes
            .extend_from_slice(&(key.len() as u32).to_le_bytes());
        self.bytes
            .extend_from_slice(&(value.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(key);
        self.bytes.extend_from_slice(value);
        let rows = self.rows_count() + 1;
        self.bytes[4..8].copy_from_slice(&rows.to_le_bytes());
    }

    /// Seals the batch: used length in the header, padding to 4 KiB.
    fn seal(mut self) -> Self {
        let used = self.bytes.len() as u32;
        self.bytes[8..12].copy_from_slice(&used.to_le_bytes());
        let padded = self.bytes.len().div_ceil(BATCH_ALIGN_BYTES) * BATCH_ALIGN_BYTES;
        self.bytes.resize(padded, 0);
        self
    }

    /// The encoded batch, a multiple of 4096 bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Checks an encoded batch received from elsewhere.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a batch has its header"
    )]
    pub fn decode(bytes: Vec<u8>) -> Result<Self, ScanError> {
        if bytes.len() < BATCH_HEADER_BYTES || !bytes.len().is_multiple_of(BATCH_ALIGN_BYTES) {
            return Err(ScanError::BadBatch("length is not a multiple of 4096"));
        }
        if &bytes[..4] != MAGIC {
            return Err(ScanError::BadBatch("no SLRB magic"));
        }
        let used = u32_at(&bytes, 8).expect("a batch has its header") as usize;
        if !(BATCH_HEADER_BYTES..=bytes.len()).contains(&used) {
            return Err(ScanError::BadBatch("used length out of range"));
        }
        let batch = ResultBatch { bytes };
        let (mut at, mut rows) = (BATCH_HEADER_BYTES, 0);
        while at < used {
            let mut header = Reader::at(&batch.bytes, at);
            let (k, v) = (header.u32(), header.u32());
            let (Some(k), Some(v)) = (k, v) else {
                return Err(ScanError::BadBatch("row header runs past the used length"));
            };
            at += 8 + k as usize + v as usize;
            rows += 1;
        }
        if at != used || rows != batch.rows_count() {
            return Err(ScanError::BadBatch("rows do not add up to the header"));
        }
        Ok(batch)
    }

    /// The rows: (key, value).
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a batch has its header; a checked batch"
    )]
    pub fn rows(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        let used = u32_at(&self.bytes, 8).expect("a batch has its header") as usize;
        let mut at = BATCH_HEADER_BYTES;
        std::iter::from_fn(move || {
            if at >= used {
                return None;
            }
            let len = |o: usize| u32_at(&self.bytes, o).expect("a checked batch") as usize;
            let (k, v) = (len(at), len(at + 4));
            let key = &self.bytes[at + 8..at + 8 + k];
            let value = &self.bytes[at + 8 + k..at + 8 + k + v];
            at += 8 + k + v;
            Some((key, value))
        })
    }
}

pub(crate) fn key_text(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(s) if !s.chars().any(char::is_control) => s.to_string(),
        _ => key.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

/// Most worker threads one operation may use.
pub const MAX_THREADS: usize = 64;
/// Bytes of full batches the workers of one scan may have waiting for the
/// consumer, shared out evenly (each worker at least two batches). Parts
/// are handed over in key order, so a worker past the first waits once its
/// share of its part's rows is ready: the budget lets two workers run side
/// by side through result sets of tens of megabytes, and bounds what a
/// large one holds whatever the thread count.
const BUFFERED_BYTES_PER_SCAN: usize = 64 << 20;

/// A part of a key range: `[start, end)`, `end` None for unbounded.
pub(crate) type KeyPart = (Vec<u8>, Option<Vec<u8>>);

/// Cuts `range` of `keyspace` into up to `threads` disjoint parts at table
/// boundaries (`Store::split_keys`), in key order.
pub(crate) fn key_parts(
    store: &Store,
    keyspace: u32,
    range: (Bound<&[u8]>, Bound<&[u8]>),
    threads: usize,
) -> Result<Vec<KeyPart>, ScanError> {
    if threads == 0 || threads > MAX_THREADS {
        return Err(ScanError::Sink(format!(
            "{threads} threads: use 1 to {MAX_THREADS}"
        )));
    }
    let (start, end) = sluice_store::half_open(range);
    let cuts: Vec<Vec<u8>> = if threads == 1 {
        Vec::new()
    } else {
        store
            .split_keys(keyspace, threads)
            .into_iter()
            .filter(|k| *k > start && end.as_ref().is_none_or(|e| k < e))
            .collect()
    };
    let mut bounds: Vec<Vec<u8>> = vec![start];
    bounds.extend(cuts);
    Ok((0..bounds.len())
        .map(|i| {
            (
                bounds[i].clone(),
                bounds.get(i + 1).cloned().or_else(|| end.clone()),
            )
        })
        .collect())
}

pub(crate) fn part_range(part: &KeyPart) -> (Bound<&[u8]>, Bound<&[u8]>) {
    (
        Bound::Included(part.0.as_slice()),
        part.1.as_deref().map_or(Bound::Unbounded, Bound::Excluded),
    )
}

/// Packs rows into batches of `batch_bytes`, handing each over when the
/// next row would not fit.
struct Batcher<'e> {
    batch_bytes: usize,
    batch: ResultBatch,
    stats: ScanStats,
    emit: &'e mut dyn FnMut(ResultBatch) -> Result<(), ScanError>,
}

impl<'e> Batcher<'e> {
    fn new(
        batch_bytes: usize,
        emit: &'e mut dyn FnMut(ResultBatch) -> Result<(), ScanError>,
    ) -> Self {
        Batcher {
            batch_bytes,
            batch: ResultBatch::with_capacity(batch_bytes),
            stats: ScanStats::default(),
            emit,
        }
    }

    fn push(&mut self, key: &[u8], value: &[u8]) -> Result<(), ScanError> {
        // Rows never straddle batches: a row that does not fit closes the
        // batch first.
        if !self.batch.is_empty()
            && self.batch.used() + 8 + key.len() + value.len() > self.batch_bytes
        {
            let full = std::mem::replace(
                &mut self.batch,
                ResultBatch::with_capacity(self.batch_bytes),
            );
            self.hand_over(full)?;
        }
        self.batch.push(key, value);
        self.stats.rows_returned += 1;
        Ok(())
    }

    fn hand_over(&mut self, batch: ResultBatch) -> Result<(), ScanError> {
        let sealed = batch.seal();
        self.stats.bytes_returned += sealed.bytes.len() as u64;
        self.stats.batches += 1;
        (self.emit)(sealed)
    }

    fn finish(mut self) -> Result<ScanStats, ScanError> {
        if !self.batch.is_empty() {
            let last = std::mem::replace(&mut self.batch, ResultBatch::with_capacity(0));
            self.hand_over(last)?;
        }
        Ok(self.stats)
    }
}

/// Receives one matching row (key, projected value); false stops the scan.
type RowSink<'a> = dyn FnMut(&[u8], &[u8]) -> Result<bool, ScanError> + 'a;

/// Examines the pairs of `range`, handing each matching row (projected)
/// to `row` until it returns false. Returns rows and bytes examined.
fn examine(
    store: &Store,
    snapshot: &sluice_store::Snapshot,
    spec: &ScanSpec<'_>,
    range: (Bound<&[u8]>, Bound<&[u8]>),
    row: &mut RowSink<'_>,
) -> Result<ScanStats, ScanError> {
    let mut iter = store.iter(spec.keyspace, range, snapshot, spec.reverse);
    let mut stats = ScanStats::default();
    // The projected value of the current row (reused).
    let mut projected: Vec<u8> = Vec::new();
    while let Some((key, value)) = iter.next_ref()? {
        stats.rows_examined += 1;
        stats.bytes_examined += (key.len() + value.len()) as u64;
        let malformed = |error| ScanError::Malformed {
            key: key_text(key),
            error,
        };
        if let Some(p) = spec.predicate {
            if !p.matches(value).map_err(malformed)? {
                continue;
            }
        }
        let row_value: &[u8] = match spec.projection {
            Some(proj) => {
                projected.clear();
                proj.apply(value, &mut projected).map_err(malformed)?;
                &projected
            }
            None => value,
        };
        if !row(key, row_value)? {
            break;
        }
    }
    Ok(stats)
}

/// Runs the scan, handing each full batch to `emit`. With more than one
/// thread, workers scan disjoint parts of the range (cut at table
/// boundaries) from one snapshot; their rows are re-packed in key order,
/// so the batches are the same whatever the thread count.
pub fn scan(
    store: &Store,
    spec: &ScanSpec<'_>,
    emit: &mut dyn FnMut(ResultBatch) -> Result<(), ScanError>,
) -> Result<ScanStats, ScanError> {
    let b = spec.batch_bytes;
    if !(BATCH_ALIGN_BYTES..=MAX_BATCH_BYTES).contains(&b) || !b.is_multiple_of(BATCH_ALIGN_BYTES) {
        return Err(ScanError::BatchSize(b));
    }
    let mut parts = key_parts(store, spec.keyspace, spec.range, spec.threads)?;
    let snapshot = store.snapshot();
    let mut out = Batcher::new(b, emit);
    let limit = spec.limit as u64;
    if parts.len() == 1 {
        let examined = examine(store, &snapshot, spec, spec.range, &mut |k, v| {
            if out.stats.rows_returned >= limit {
                return Ok(false);
            }
            out.push(k, v)?;
            Ok(out.stats.rows_returned < limit)
        })?;
        let mut stats = out.finish()?;
        stats.rows_examined = examined.rows_examined;
        stats.bytes_examined = examined.bytes_examined;
        return Ok(stats);
    }
    if spec.reverse {
        parts.reverse();
    }
    let snapshot = &snapshot;
    let in_flight = (BUFFERED_BYTES_PER_SCAN / parts.len() / b).max(2);
    std::thread::scope(|scope| {
        let receivers: Vec<_> = parts
            .iter()
            .map(|part| {
                let (tx, rx) = std::sync::mpsc::sync_channel(in_flight);
                scope.spawn(move || scan_worker(store, snapshot, spec, part, tx));
                rx
            })
            .collect();
        let mut examined = ScanStats::default();
        // Parts are drained in key order; a worker ahead of the consumer
        // waits on its full channel, bounding memory.
        'parts: for rx in &receivers {
            for msg in rx {
                match msg? {
                    WorkerMsg::Batch(batch) => {
                        for (k, v) in batch.rows() {
                            if out.stats.rows_returned >= limit {
                                break 'parts;
                            }
                            out.push(k, v)?;
                        }
                    }
                    WorkerMsg::Done(s) => {
                        examined.rows_examined += s.rows_examined;
                        examined.bytes_examined += s.bytes_examined;
                    }
                }
            }
        }
        // Dropping the receivers stops workers still running (past the
        // limit).
        drop(receivers);
        let mut stats = out.finish()?;
        stats.rows_examined = examined.rows_examined;
        stats.bytes_examined = examined.bytes_examined;
        Ok(stats)
    })
}

enum WorkerMsg {
    Batch(ResultBatch),
    Done(ScanStats),
}

/// One scan worker: its part's matching rows in batches, then its counts.
fn scan_worker(
    store: &Store,
    snapshot: &sluice_store::Snapshot,
    spec: &ScanSpec<'_>,
    part: &KeyPart,
    tx: std::sync::mpsc::SyncSender<Result<WorkerMsg, ScanError>>,
) {
    let closed = || ScanError::Sink("the consumer stopped".into());
    let mut send = |batch: ResultBatch| tx.send(Ok(WorkerMsg::Batch(batch))).map_err(|_| closed());
    let mut rows = 0u64;
    let limit = spec.limit as u64;
    let result = (|| {
        let mut batcher = Batcher::new(spec.batch_bytes, &mut send);
        let examined = examine(store, snapshot, spec, part_range(part), &mut |k, v| {
            batcher.push(k, v)?;
            rows += 1;
            Ok(rows < limit)
        })?;
        batcher.finish()?;
        Ok(examined)
    })();
    // A send fails only when the consumer is gone; nothing to report then.
    let _ = tx.send(result.map(WorkerMsg::Done));
}
