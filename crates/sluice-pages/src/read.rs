//! `sluice read`: N tasks read their slices' pages back with deep queues of
//! direct reads into fixed buffers and parse each page as its read completes.
//! Memory: tasks × (the queue depth + 1) × the largest page, whatever the
//! export's size.

use crate::device::{check_done, engine_config, DeviceIo};
use crate::error::{Error, Result};
use crate::format::PageEntry;
use crate::layout::load_export;
use crate::progress::{Counter, ProgressMode, Reporter};
use sluice_io::{open_engine, Completion, Device, Direction, EngineKind, Request};
use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most pages in flight per task.
pub const MAX_QUEUE_DEPTH: usize = 256;
/// Most reading tasks.
pub const MAX_TASKS: usize = 256;

/// What a read does at a page that fails its checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnCorrupt {
    /// Report the page and go on with the rest.
    Skip,
    /// Stop at the first bad page.
    Fail,
}

/// How `sluice read` reads.
#[derive(Debug, Clone)]
pub struct ReadOptions {
    /// Reading tasks (each a share of the slices).
    pub tasks: usize,
    /// Pages in flight per task.
    pub queue_depth: usize,
    /// Skip or stop at a bad page.
    pub on_corrupt: OnCorrupt,
    /// The engine: io_uring (direct, fixed buffers) or the posix baseline.
    pub engine: EngineKind,
    /// Bars, lines or nothing.
    pub progress: ProgressMode,
    /// Time between progress lines.
    pub progress_interval: Duration,
    /// Only these slices (each read whole); none = every slice. A reader
    /// per slice is how a cluster of workers shares one export.
    pub slices: Option<Vec<u32>>,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            tasks: 2,
            queue_depth: 4,
            on_corrupt: OnCorrupt::Fail,
            engine: EngineKind::Uring,
            progress: ProgressMode::Off,
            progress_interval: Duration::from_secs(5),
            slices: None,
        }
    }
}

/// One hit of a page: its id and the raw JSON of its source.
#[derive(Debug)]
pub struct Hit<'a> {
    /// The document's `_id`.
    pub id: Cow<'a, str>,
    /// The source's JSON text exactly as the export holds it (`null` if it had none).
    pub source: &'a str,
}

/// Where a page came from.
#[derive(Debug, Clone, Copy)]
pub struct PageInfo {
    /// The page's slice.
    pub slice: u32,
    /// Its number in the slice.
    pub seq: u32,
    /// Its first block.
    pub lba: u64,
    /// Documents in it.
    pub docs: u32,
    /// Its bytes (before padding).
    pub bytes: u32,
}

/// Takes the parsed pages of one task. Later issues import into the store
/// through this.
pub trait Sink: Send {
    /// Takes one page's hits, in the slice's order; an error stops the read.
    fn page(&mut self, page: &PageInfo, hits: &[Hit<'_>]) -> Result<()>;
}

/// What was read of one slice.
#[derive(Debug, Clone, Default)]
pub struct SliceCount {
    /// Documents.
    pub docs: u64,
    /// Pages.
    pub pages: u64,
    /// Page bytes.
    pub bytes: u64,
}

/// What a read did.
#[derive(Debug, Clone)]
pub struct ReadSummary {
    /// Documents read.
    pub docs: u64,
    /// Pages read.
    pub pages: u64,
    /// Page bytes parsed (before padding).
    pub bytes: u64,
    /// Bytes read from the device (whole blocks).
    pub device_bytes: u64,
    /// Per slice.
    pub slices: Vec<SliceCount>,
    /// Pages skipped under `OnCorrupt::Skip`, each with what was wrong.
    pub bad_pages: Vec<String>,
    /// Time it took.
    pub elapsed: Duration,
    /// Tasks that read.
    pub tasks: usize,
}

/// Parses pages one after another, keeping the scanner's index buffers
/// between pages.
#[derive(Debug, Default)]
pub struct PageParser {
    scanner: sluice_json::Scanner,
}

impl PageParser {
    /// A parser with empty buffers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses one page: a JSON array of `{"_id","_source"}` objects, checked
    /// whole (every byte of every source is validated) by `sluice-json`'s
    /// structural scan; the hits borrow from the page.
    pub fn parse<'a>(&mut self, bytes: &'a [u8], info: &PageInfo) -> Result<Vec<Hit<'a>>> {
        let json = self
            .scanner
            .scan(bytes)
            .map_err(|e| malformed(info, e.to_string()))?;
        hits_of(json, info)
    }

    /// Checks a page against the CRC32C its manifest records and parses it
    /// as [`PageParser::parse`] does, in one pass over its bytes (the scan
    /// computes the CRC from its own loads). A page whose CRC does not match
    /// is [`Error::CorruptPage`], also when the damage made it invalid JSON.
    pub fn parse_checked<'a>(
        &mut self,
        bytes: &'a [u8],
        info: &PageInfo,
        recorded_crc32c: u32,
    ) -> Result<Vec<Hit<'a>>> {
        let corrupt = |computed| Error::CorruptPage {
            slice: info.slice,
            seq: info.seq,
            lba: info.lba,
            computed,
            recorded: recorded_crc32c,
        };
        match self.scanner.scan_crc32c(bytes) {
            Ok((json, crc)) if crc == recorded_crc32c => hits_of(json, info),
            Ok((_, crc)) => Err(corrupt(crc)),
            Err(e) => match crc32c::crc32c(bytes) {
                crc if crc != recorded_crc32c => Err(corrupt(crc)),
                _ => Err(malformed(info, e.to_string())),
            },
        }
    }
}

/// A scanned page's hits, as many as the manifest records.
fn hits_of<'a>(json: sluice_json::Json<'a, '_>, info: &PageInfo) -> Result<Vec<Hit<'a>>> {
    let root = json.root();
    if root.kind() != sluice_json::Kind::Array {
        return Err(malformed(info, "the page is not an array of hits".into()));
    }
    let mut hits = Vec::with_capacity(info.docs as usize);
    for (n, hit) in root.elements().enumerate() {
        hits.push(page_hit(hit).map_err(|what| malformed(info, format!("hit {n}: {what}")))?);
    }
    if hits.len() != info.docs as usize {
        return Err(malformed(
            info,
            format!("{} hits, the manifest records {}", hits.len(), info.docs),
        ));
    }
    Ok(hits)
}

fn malformed(info: &PageInfo, detail: String) -> Error {
    Error::MalformedPage {
        slice: info.slice,
        seq: info.seq,
        lba: info.lba,
        detail,
    }
}

/// One hit's `_id` and `_source`, each exactly once.
fn page_hit<'a>(hit: sluice_json::Value<'a, '_>) -> std::result::Result<Hit<'a>, String> {
    if hit.kind() != sluice_json::Kind::Object {
        return Err("not an object".into());
    }
    let (mut id, mut source) = (None, None);
    for (key, value) in hit.members() {
        // Compared in place: no slice of the key is made per member.
        let slot = if key.is_str("_id") {
            &mut id
        } else if key.is_str("_source") {
            &mut source
        } else {
            continue;
        };
        if slot.replace(value).is_some() {
            return Err(format!("{} appears twice", key.raw()));
        }
    }
    let id = id.ok_or("no _id")?;
    let id = id
        .to_str()
        .map_err(|e| format!("_id is not a usable string: {e}"))?;
    let source = source.ok_or("no _source")?.raw();
    Ok(Hit { id, source })
}

/// Parses one page with a parser of its own (see [`PageParser::parse`]).
pub fn parse_page<'a>(bytes: &'a [u8], info: &PageInfo) -> Result<Vec<Hit<'a>>> {
    PageParser::new().parse(bytes, info)
}

/// Takes each page's bytes, their CRC checked, before any parsing: for
/// callers that parse pages themselves (the read benchmark's parser
/// ablation). A [`Error::MalformedPage`] it returns counts as a bad page
/// under [`OnCorrupt::Skip`]; any other error stops the read.
pub trait PageSink: Send {
    /// Takes one page's checked bytes; see the trait's documentation for errors.
    fn raw_page(&mut self, page: &PageInfo, bytes: &[u8]) -> Result<()>;
}

/// What a read task does with each page it has read: check its CRC32C
/// against the manifest's and hand it on.
trait PageHandler: Send {
    fn handle(&mut self, page: &PageInfo, bytes: &[u8], recorded_crc32c: u32) -> Result<()>;
}

/// A [`PageSink`] behind the CRC check.
struct Checked<P>(P);

impl<P: PageSink> PageHandler for Checked<P> {
    fn handle(&mut self, page: &PageInfo, bytes: &[u8], recorded_crc32c: u32) -> Result<()> {
        let computed = crc32c::crc32c(bytes);
        if computed != recorded_crc32c {
            return Err(Error::CorruptPage {
                slice: page.slice,
                seq: page.seq,
                lba: page.lba,
                computed,
                recorded: recorded_crc32c,
            });
        }
        self.0.raw_page(page, bytes)
    }
}

/// A [`Sink`] behind the page parse, which checks the CRC as it scans.
struct Parsing<S>(S, PageParser);

impl<S: Sink> PageHandler for Parsing<S> {
    fn handle(&mut self, page: &PageInfo, bytes: &[u8], recorded_crc32c: u32) -> Result<()> {
        let hits = self.1.parse_checked(bytes, page, recorded_crc32c)?;
        self.0.page(page, &hits)
    }
}

/// The slices to read: all, or the ones asked for (each once, each one
/// the export has).
fn chosen_slices(asked: Option<&[u32]>, slice_count: usize) -> Result<Vec<usize>> {
    let Some(asked) = asked else {
        return Ok((0..slice_count).collect());
    };
    let mut chosen: Vec<usize> = Vec::with_capacity(asked.len());
    for &s in asked {
        if s as usize >= slice_count {
            return Err(Error::Config(format!(
                "slice {s} asked for, but the export has slices 0 to {}",
                slice_count.saturating_sub(1)
            )));
        }
        if !chosen.contains(&(s as usize)) {
            chosen.push(s as usize);
        }
    }
    Ok(chosen)
}

/// Each slice's documents, pages and page bytes as a complete export's
/// manifest records them, read without reading any page.
pub fn slice_counts(device: Arc<dyn Device>) -> Result<Vec<SliceCount>> {
    let io = DeviceIo::open(device.clone(), 4, 16 << 20)?;
    let loaded = load_export(&io)?;
    loaded.require_complete(&device.describe())?;
    Ok(loaded
        .slices
        .iter()
        .map(|s| SliceCount {
            docs: s.pages.iter().map(|p| p.doc_count as u64).sum(),
            pages: s.pages.len() as u64,
            bytes: s.pages.iter().map(|p| p.byte_len as u64).sum(),
        })
        .collect())
}

/// Reads a complete export and hands each task's parsed pages to its sink.
pub fn read_export<S, F>(
    device: Arc<dyn Device>,
    options: &ReadOptions,
    make_sink: F,
) -> Result<(ReadSummary, Vec<S>)>
where
    S: Sink,
    F: Fn(usize) -> S,
{
    let (summary, sinks) = read_with(device, options, |t| {
        Parsing(make_sink(t), PageParser::new())
    })?;
    Ok((summary, sinks.into_iter().map(|p| p.0).collect()))
}

/// Reads a complete export and hands each task's checked page bytes to its
/// [`PageSink`], unparsed.
pub fn read_pages<P, F>(
    device: Arc<dyn Device>,
    options: &ReadOptions,
    make_sink: F,
) -> Result<(ReadSummary, Vec<P>)>
where
    P: PageSink,
    F: Fn(usize) -> P,
{
    let (summary, sinks) = read_with(device, options, |t| Checked(make_sink(t)))?;
    Ok((summary, sinks.into_iter().map(|c| c.0).collect()))
}

#[expect(
    clippy::expect_used,
    reason = "a task that panicked ends the read: it has no sound result"
)]
fn read_with<P, F>(
    device: Arc<dyn Device>,
    options: &ReadOptions,
    make_sink: F,
) -> Result<(ReadSummary, Vec<P>)>
where
    P: PageHandler,
    F: Fn(usize) -> P,
{
    let start = Instant::now();
    if options.tasks == 0 || options.tasks > MAX_TASKS {
        return Err(Error::Config(format!(
            "--tasks must be between 1 and {MAX_TASKS}"
        )));
    }
    if options.queue_depth == 0 || options.queue_depth > MAX_QUEUE_DEPTH {
        return Err(Error::Config(format!(
            "--queue-depth must be between 1 and {MAX_QUEUE_DEPTH}"
        )));
    }
    let loaded = {
        let io = DeviceIo::open(device.clone(), 4, 16 << 20)?;
        load_export(&io)?
    };
    loaded.require_complete(&device.describe())?;
    let bs = loaded.header.block_size_bytes as u64;
    let chosen = chosen_slices(options.slices.as_deref(), loaded.slices.len())?;
    let tasks = options.tasks.min(chosen.len()).max(1);
    let mut work: Vec<Vec<PageEntry>> = vec![Vec::new(); tasks];
    for (i, &s) in chosen.iter().enumerate() {
        work[i % tasks].extend(loaded.slices[s].pages.iter().copied());
    }
    let counters: Arc<Vec<Counter>> = Arc::new(
        (0..loaded.slices.len())
            .map(|_| Counter::default())
            .collect(),
    );
    let reporter = Reporter::start(
        options.progress,
        "read",
        counters.clone(),
        Some(loaded.header.total_docs),
        options.progress_interval,
    );
    let sinks: Vec<P> = (0..tasks).map(&make_sink).collect();
    let results: Vec<Result<(P, TaskTally)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = work
            .into_iter()
            .zip(sinks)
            .enumerate()
            .map(|(t, (pages, sink))| {
                let device = device.clone();
                let counters = counters.clone();
                std::thread::Builder::new()
                    .name(format!("read-{t}"))
                    .spawn_scoped(scope, move || {
                        read_task(device, options, bs, pages, sink, &counters)
                    })
                    .expect("spawn read task")
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("read task panicked"))
            .collect()
    });
    reporter.finish();
    let mut sinks = Vec::with_capacity(tasks);
    let mut bad_pages = Vec::new();
    let mut device_bytes = 0;
    for r in results {
        let (sink, tally) = r?;
        sinks.push(sink);
        bad_pages.extend(tally.bad_pages);
        device_bytes += tally.device_bytes;
    }
    let slices: Vec<SliceCount> = counters
        .iter()
        .map(|c| SliceCount {
            docs: c.docs.load(Ordering::Relaxed),
            pages: c.pages.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
        })
        .collect();
    Ok((
        ReadSummary {
            docs: slices.iter().map(|s| s.docs).sum(),
            pages: slices.iter().map(|s| s.pages).sum(),
            bytes: slices.iter().map(|s| s.bytes).sum(),
            device_bytes,
            slices,
            bad_pages,
            elapsed: start.elapsed(),
            tasks,
        },
        sinks,
    ))
}

#[derive(Default)]
struct TaskTally {
    bad_pages: Vec<String>,
    device_bytes: u64,
}

fn read_task<S: PageHandler>(
    device: Arc<dyn Device>,
    options: &ReadOptions,
    bs: u64,
    pages: Vec<PageEntry>,
    mut sink: S,
    counters: &[Counter],
) -> Result<(S, TaskTally)> {
    let len_of = |p: &PageEntry| (p.byte_len as u64).div_ceil(bs).max(1) * bs;
    let largest = pages.iter().map(len_of).max().unwrap_or(bs);
    // A page below the pool's chunk size takes a chunk of its own (page
    // buffers are one contiguous run), so count whole chunks per page: the
    // queue depth in flight, the page being parsed, and one for slack.
    let chunk = sluice_io::PoolConfig::default().chunk_size_bytes as u64;
    let per_page = largest.div_ceil(chunk) * chunk;
    let pinned = per_page * (options.queue_depth as u64 + 2) + (8 << 20);
    let mut config = engine_config(options.queue_depth, pinned);
    config.kind = options.engine;
    let mut engine = open_engine(device, &config)?;
    let mut tally = TaskTally::default();
    let mut next = 0usize;
    let mut done = Vec::with_capacity(options.queue_depth);
    // Buffers in flight and read but not yet parsed together stay within
    // the queue depth + 1: a read is queued again as soon as a page's buffer
    // is free, so the device is left idle by the parse only when the parse
    // is slower than the device anyway, and fresh memory (which the kernel
    // zeroes on first touch) stays within what the depth needs.
    let budget = options.queue_depth + 1;
    let mut submit_up_to_depth =
        |engine: &mut Box<dyn sluice_io::Engine>, held: usize| -> Result<()> {
            while next < pages.len()
                && engine.in_flight() < options.queue_depth
                && engine.in_flight() + held < budget
            {
                let p = &pages[next];
                let buf = engine.pool().alloc(len_of(p) as usize, Direction::Read)?;
                if let Err(r) = engine.submit(Request::read(p.lba, buf, next as u64)) {
                    return Err(r.error.into());
                }
                next += 1;
            }
            Ok(())
        };
    submit_up_to_depth(&mut engine, 0)?;
    while engine.in_flight() > 0 {
        done.clear();
        engine.reap(1, &mut done)?;
        let mut held = done.len();
        submit_up_to_depth(&mut engine, held)?;
        for c in done.drain(..) {
            let entry = pages[c.user_data as usize];
            tally.device_bytes += len_of(&entry);
            // The page's buffer goes back to the pool when `complete` returns.
            complete(
                c,
                &entry,
                len_of(&entry),
                &mut sink,
                counters,
                options,
                &mut tally,
            )?;
            held -= 1;
            submit_up_to_depth(&mut engine, held)?;
        }
    }
    Ok((sink, tally))
}

/// Checks and parses one page in its completion, then hands it to the sink.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: a read hands its buffer back; page buffers are contiguous: the pool allows one segment"
)]
fn complete<S: PageHandler>(
    c: Completion,
    entry: &PageEntry,
    len: u64,
    sink: &mut S,
    counters: &[Counter],
    options: &ReadOptions,
    tally: &mut TaskTally,
) -> Result<()> {
    check_done(c.result, len as usize, "page read", entry.lba)?;
    let buf = c.buf.expect("a read hands its buffer back");
    let all = buf
        .as_slice()
        .expect("page buffers are contiguous: the pool allows one segment");
    let bytes = &all[..entry.byte_len as usize];
    let info = PageInfo {
        slice: entry.slice,
        seq: entry.seq,
        lba: entry.lba,
        docs: entry.doc_count,
        bytes: entry.byte_len,
    };
    match sink.handle(&info, bytes, entry.crc32c) {
        Ok(()) => {
            counters[entry.slice as usize].add(entry.doc_count as u64, entry.byte_len as u64);
            Ok(())
        }
        Err(e @ (Error::CorruptPage { .. } | Error::MalformedPage { .. }))
            if options.on_corrupt == OnCorrupt::Skip =>
        {
            log::warn!("skipping: {e}");
            tally.bad_pages.push(e.to_string());
            Ok(())
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(docs: u32) -> PageInfo {
        PageInfo {
            slice: 1,
            seq: 7,
            lba: 4242,
            docs,
            bytes: 0,
        }
    }

    #[test]
    fn a_page_parses_to_ids_and_raw_sources() {
        let page = br#"[{"_id":"a","_source":{"x": [1,2]}},{"_id":"b\n","_source":null}]
   "#;
        let hits = parse_page(page, &info(2)).unwrap();
        assert_eq!(hits[0].id, "a");
        assert_eq!(hits[0].source, r#"{"x": [1,2]}"#);
        assert_eq!(hits[1].id, "b\n");
        assert_eq!(hits[1].source, "null");
    }

    #[test]
    fn a_checked_parse_tells_damage_from_a_bad_page() {
        let page = br#"[{"_id":"a","_source":{"x":1}}]"#;
        let mut parser = PageParser::new();
        let crc = crc32c::crc32c(page);
        let hits = parser.parse_checked(page, &info(1), crc).unwrap();
        assert_eq!((hits[0].id.as_ref(), hits[0].source), ("a", r#"{"x":1}"#));
        // Damage that leaves valid JSON, and damage that does not: both are
        // the CRC's to report.
        for damaged in [
            &br#"[{"_id":"b","_source":{"x":1}}]"#[..],
            br#"[{"_id":"a","_source":{"x":1}]]"#,
        ] {
            let err = parser.parse_checked(damaged, &info(1), crc).err().unwrap();
            assert!(
                matches!(err, Error::CorruptPage { recorded, .. } if recorded == crc),
                "{err}"
            );
        }
        // A page stored bad with its CRC is malformed, not damaged.
        let bad = br#"[{"_id":"a","_source":{"x":1}]]"#;
        let err = parser
            .parse_checked(bad, &info(1), crc32c::crc32c(bad))
            .err()
            .unwrap();
        assert!(matches!(err, Error::MalformedPage { .. }), "{err}");
    }

    #[test]
    fn malformed_pages_name_slice_page_and_lba() {
        for bad in [
            &br#"[{"_id":"a","_source":{"x": [1,2}}]"#[..],
            br#"[{"_id":"a","_source":{"x":tru}}]"#,
            br#"[{"_id":"a"}]"#,
            br#"{"_id":"a","_source":{}}"#,
            br#"[{"_id":"a","_id":"b","_source":{}}]"#,
            br#"[{"_id":1,"_source":{}}]"#,
            br#"[{"_id":"\ud800","_source":{}}]"#,
            br#"[{"_id":"a","_source":{}} x]"#,
            b"[{\"_id\":\"a\",\"_source\":\"\xff\"}]",
        ] {
            let err = parse_page(bad, &info(1)).err().unwrap().to_string();
            assert!(
                err.contains("page 7 of slice 1 at LBA 4242 is not valid JSON"),
                "{err}"
            );
        }
        let err = parse_page(br#"[{"_id":"a","_source":{}}]"#, &info(2))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("1 hits, the manifest records 2"), "{err}");
    }
}
