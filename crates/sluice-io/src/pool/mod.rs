//! The pinned buffer pool: three tiers by request size (the uDMA design).
//!
//! - small (≤ `small_block_size_bytes`): blocks pinned and registered once at
//!   start; one read list, two alternating write lists ([`small`]).
//! - medium: chunks of `chunk_size_bytes` pinned and registered on demand,
//!   carved first-fit, scatter/gather when no contiguous run fits, merged on
//!   free, released after `idle_release_ms` completely free ([`region`]).
//! - big (≥ `chunk_size_bytes`): pinned and registered per request, released
//!   when the buffer is dropped.
//!
//! "Pinned" means registered in the io_uring fixed-buffer table (the kernel
//! pins the pages once, instead of per I/O) when the pool belongs to a ring,
//! and `mlock`ed otherwise. Registration goes through a sparse table, one slot
//! per list, chunk or big buffer, so slots come and go without touching the
//! rest. Total pinned bytes never exceed `max_pinned_bytes`.
//!
//! A buffer is owned by exactly one [`IoBuf`]; an engine holds it while the
//! kernel may touch it and hands it back in the completion, so memory is never
//! reused or released under an I/O in flight.

mod buf;
pub mod region;
mod small;

pub use buf::{IoBuf, Segment, Tier};

use crate::error::{IoError, Result, WaitNote};
use crate::mem::{AlignedMem, HUGE_PAGE_SIZE_BYTES, PAGE_SIZE_BYTES};
use region::{ChunkId, RegionAllocator};
use small::SmallTier;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Upper bound of the sparse registered-buffer table (the kernel allows 16384).
pub const MAX_TABLE_SLOTS: u32 = 16384;

/// What the pool does when serving a request would exceed `max_pinned_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnExhausted {
    /// Fail at once with [`IoError::PoolExhausted`].
    Fail,
    /// Wait for buffers to come back, up to the timeout, then fail.
    Wait {
        /// Longest wait before failing.
        timeout_ms: u64,
    },
}

/// The pool's sizes and limits.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Size of one small block; requests up to this size use the small tier.
    pub small_block_size_bytes: usize,
    /// Blocks in the read list.
    pub small_read_blocks: u32,
    /// Blocks in each of the two write lists.
    pub small_write_blocks: u32,
    /// m: size of a medium chunk; requests of this size or more are big.
    pub chunk_size_bytes: usize,
    /// M: ceiling on all pinned memory, every tier included.
    pub max_pinned_bytes: u64,
    /// t: a completely free chunk is released after this long.
    pub idle_release_ms: u64,
    /// What an allocation does at the ceiling.
    pub on_exhausted: OnExhausted,
    /// Most discontiguous runs one scatter/gather buffer may use.
    pub max_segments: usize,
    /// Slots of the sparse registered-buffer table.
    pub table_slots: u32,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            small_block_size_bytes: 4096,
            small_read_blocks: 64,
            small_write_blocks: 32,
            chunk_size_bytes: 4 << 20,
            max_pinned_bytes: 256 << 20,
            idle_release_ms: 2000,
            on_exhausted: OnExhausted::Wait { timeout_ms: 10_000 },
            max_segments: 16,
            table_slots: 1024,
        }
    }
}

impl PoolConfig {
    /// Checks every value against its limit, naming the one out of range.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(IoError::Config(msg));
        if !self.small_block_size_bytes.is_power_of_two()
            || self.small_block_size_bytes < 512
            || self.small_block_size_bytes > self.chunk_size_bytes
        {
            return bad(format!(
                "small_block_size_bytes {} must be a power of two, at least 512 and at most chunk_size_bytes {}",
                self.small_block_size_bytes, self.chunk_size_bytes
            ));
        }
        if self.chunk_size_bytes < PAGE_SIZE_BYTES
            || !self.chunk_size_bytes.is_multiple_of(PAGE_SIZE_BYTES)
        {
            return bad(format!(
                "chunk_size_bytes {} must be a positive multiple of {PAGE_SIZE_BYTES}",
                self.chunk_size_bytes
            ));
        }
        if self.chunk_size_bytes >= HUGE_PAGE_SIZE_BYTES
            && !self.chunk_size_bytes.is_multiple_of(HUGE_PAGE_SIZE_BYTES)
        {
            return bad(format!(
                "chunk_size_bytes {} must be a multiple of {HUGE_PAGE_SIZE_BYTES} (huge pages) from 2 MiB up",
                self.chunk_size_bytes
            ));
        }
        if self.small_read_blocks == 0 || self.small_write_blocks == 0 {
            return bad("small_read_blocks and small_write_blocks must be at least 1".into());
        }
        let small = self.small_tier_bytes();
        if small + self.chunk_size_bytes as u64 > self.max_pinned_bytes {
            return bad(format!(
                "max_pinned_bytes {} must hold the small tier ({small} bytes) plus one chunk ({} bytes)",
                self.max_pinned_bytes, self.chunk_size_bytes
            ));
        }
        if self.max_segments == 0 || self.max_segments > 1024 {
            return bad(format!(
                "max_segments {} must be between 1 and 1024",
                self.max_segments
            ));
        }
        if self.table_slots < 4 || self.table_slots > MAX_TABLE_SLOTS {
            return bad(format!(
                "table_slots {} must be between 4 and {MAX_TABLE_SLOTS}",
                self.table_slots
            ));
        }
        Ok(())
    }

    /// Bytes the small tier pins (its read list and both write lists).
    pub fn small_tier_bytes(&self) -> u64 {
        let blocks = self.small_read_blocks as u64 + 2 * self.small_write_blocks as u64;
        blocks * self.small_block_size_bytes as u64
    }
}

/// Registers memory with a ring's fixed-buffer table. Implemented by the
/// io_uring engine; the pool calls it for every chunk, list and big buffer.
pub trait Registrar: Send + Sync + std::fmt::Debug {
    /// Puts `iov` in table slot `slot`.
    ///
    /// # Safety
    /// The memory behind `iov` must stay valid until `unregister(slot)` has
    /// returned and no I/O that uses the slot is in flight.
    unsafe fn register(&self, slot: u16, iov: libc::iovec) -> std::io::Result<()>;
    /// Empties table slot `slot`.
    fn unregister(&self, slot: u16) -> std::io::Result<()>;
    /// Whether this thread may register now. A single-issuer ring takes
    /// registrations only from its issuer; elsewhere the pool defers the
    /// work to [`BufferPool::run_issuer_work`], which the engine calls.
    fn is_issuer_thread(&self) -> bool {
        true
    }
}

/// How the pool pins its memory.
#[derive(Debug, Clone)]
pub enum Pinning {
    /// Register with a ring (the kernel pins the pages).
    Registered(Arc<dyn Registrar>),
    /// `mlock` the pages (for engines without fixed buffers).
    Mlock,
    /// Leave memory unpinned (unprivileged tests, the buffered baseline).
    Unpinned,
}

/// Counters of the pool; a snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolStats {
    /// Requests served from memory that was already pinned.
    pub hits: u64,
    /// Requests that needed new memory pinned (a new chunk or a big buffer).
    pub misses: u64,
    /// Memory pinned (chunks and big buffers).
    pub pins: u64,
    /// Memory unpinned again.
    pub unpins: u64,
    /// Bytes pinned now.
    pub pinned_bytes: u64,
    /// Most bytes ever pinned at once.
    pub peak_pinned_bytes: u64,
    /// Buffers served by the small tier.
    pub small_allocs: u64,
    /// Buffers served as one medium run.
    pub medium_allocs: u64,
    /// Buffers served as scatter/gather lists of medium runs.
    pub scattered_allocs: u64,
    /// Buffers pinned for one request.
    pub big_allocs: u64,
    /// Allocations that waited for memory to come back.
    pub waits: u64,
    /// Allocations that failed at the ceiling.
    pub failures: u64,
    /// Medium chunks held now.
    pub chunks: u64,
    /// Chunks released after staying free for `idle_release_ms`.
    pub idle_releases: u64,
    /// 1 - largest free run / free bytes of the medium tier.
    pub fragmentation: f64,
}

#[derive(Debug)]
struct PinnedMem {
    mem: AlignedMem,
    slot: Option<u16>,
}

#[derive(Debug)]
struct State {
    small: SmallTier,
    medium: RegionAllocator,
    chunks: HashMap<ChunkId, PinnedMem>,
    free_slots: Vec<u16>,
    stats: PoolStats,
    /// Chunks pinned on a thread that could not register them: their
    /// buffers use plain I/O until the issuer registers the chunk.
    unregistered_chunks: Vec<ChunkId>,
    /// Memory released on a thread that could not unregister it: kept
    /// (and counted as pinned) until the issuer empties its slot.
    deferred_unpins: Vec<(AlignedMem, u16)>,
    /// Allocations waiting for memory to come back: a buffer given back
    /// wakes them only when there are any (a wake is a system call).
    waiting: usize,
}

#[derive(Debug)]
pub(crate) struct Shared {
    config: PoolConfig,
    pinning: Pinning,
    state: Mutex<State>,
    returned: Condvar,
    /// Set when `unregistered_chunks` or `deferred_unpins` has work.
    issuer_work: AtomicBool,
}

/// A handle to a pool; clones share it.
#[derive(Debug, Clone)]
pub struct BufferPool {
    shared: Arc<Shared>,
}

/// The direction of the I/O a buffer is for: it picks the small list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// A buffer to read into.
    Read,
    /// A buffer to write from.
    Write,
}

impl BufferPool {
    /// Creates a pool and pins its small tier.
    pub fn new(config: PoolConfig, pinning: Pinning) -> Result<Self> {
        config.validate()?;
        if !matches!(pinning, Pinning::Unpinned) {
            crate::probe::check_memlock(config.max_pinned_bytes, &crate::probe::memlock())?;
        }
        let mut small = SmallTier::new(
            config.small_block_size_bytes,
            config.small_read_blocks,
            config.small_write_blocks,
        );
        let slots = config.table_slots.min(u16::MAX as u32 + 1);
        let mut free_slots: Vec<u16> = (0..slots).rev().map(|s| s as u16).collect();
        let mut stats = PoolStats::default();
        let [w0, w1] = &mut small.write;
        for list in [&mut small.read, w0, w1] {
            // SAFETY: the list's memory lives as long as the pool's state,
            // which unregisters it on drop before freeing.
            list.slot = unsafe { pin(&pinning, &list.mem, &mut free_slots)? };
            stats.pins += 1;
        }
        stats.pinned_bytes = small.pinned_bytes() as u64;
        stats.peak_pinned_bytes = stats.pinned_bytes;
        let medium = RegionAllocator::new(config.chunk_size_bytes, PAGE_SIZE_BYTES);
        Ok(BufferPool {
            shared: Arc::new(Shared {
                config,
                pinning,
                state: Mutex::new(State {
                    small,
                    medium,
                    chunks: HashMap::new(),
                    free_slots,
                    stats,
                    unregistered_chunks: Vec::new(),
                    deferred_unpins: Vec::new(),
                    waiting: 0,
                }),
                returned: Condvar::new(),
                issuer_work: AtomicBool::new(false),
            }),
        })
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &PoolConfig {
        &self.shared.config
    }

    /// Whether buffers carry fixed-buffer table indices.
    pub fn is_registered(&self) -> bool {
        matches!(self.shared.pinning, Pinning::Registered(_))
    }

    /// Bytes pinned now (in use or free), against `max_pinned_bytes`.
    pub fn pinned_bytes(&self) -> u64 {
        self.shared.lock().stats.pinned_bytes
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        let st = self.shared.lock();
        let mut s = st.stats.clone();
        s.chunks = st.medium.chunk_count() as u64;
        s.fragmentation = st.medium.fragmentation();
        s
    }

    /// Takes a buffer of `len_bytes` from the tier its size selects.
    pub fn alloc(&self, len_bytes: usize, direction: Direction) -> Result<IoBuf> {
        if len_bytes == 0 || len_bytes as u64 > crate::device::MAX_IO_BYTES {
            return Err(IoError::BadLength {
                len_bytes: len_bytes as u64,
                max_bytes: crate::device::MAX_IO_BYTES,
            });
        }
        let cfg = &self.shared.config;
        let ceiling = cfg.max_pinned_bytes - cfg.small_tier_bytes();
        if len_bytes >= cfg.chunk_size_bytes && AlignedMem::pinning_size(len_bytes) as u64 > ceiling
        {
            // No amount of waiting makes room for it.
            return Err(IoError::PoolExhausted {
                requested_bytes: len_bytes as u64,
                pinned_bytes: self.stats().pinned_bytes,
                max_pinned_bytes: cfg.max_pinned_bytes,
                waited: WaitNote(None),
            });
        }
        let started = Instant::now();
        let mut st = self.shared.lock();
        loop {
            if let Some(buf) = self.try_alloc(&mut st, len_bytes, direction)? {
                return Ok(buf);
            }
            let timeout_ms = match self.shared.config.on_exhausted {
                OnExhausted::Fail => 0,
                OnExhausted::Wait { timeout_ms } => timeout_ms,
            };
            let waited = started.elapsed();
            if waited >= Duration::from_millis(timeout_ms) {
                st.stats.failures += 1;
                return Err(IoError::PoolExhausted {
                    requested_bytes: len_bytes as u64,
                    pinned_bytes: st.stats.pinned_bytes,
                    max_pinned_bytes: self.shared.config.max_pinned_bytes,
                    waited: WaitNote((timeout_ms > 0).then_some(waited.as_millis() as u64)),
                });
            }
            st.stats.waits += 1;
            let rest = Duration::from_millis(timeout_ms) - waited;
            st.waiting += 1;
            st = self
                .shared
                .returned
                .wait_timeout(st, rest)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            st.waiting -= 1;
        }
    }

    /// Allocates, pins and registers a buffer for this one request, whatever
    /// its size (the big tier's path): released when dropped. The baseline
    /// the pool is measured against, and a way out for one-off buffers.
    pub fn alloc_transient(&self, len_bytes: usize) -> Result<IoBuf> {
        let mut st = self.shared.lock();
        match self.alloc_big(&mut st, len_bytes)? {
            Some(buf) => Ok(buf),
            None => {
                st.stats.failures += 1;
                Err(IoError::PoolExhausted {
                    requested_bytes: len_bytes as u64,
                    pinned_bytes: st.stats.pinned_bytes,
                    max_pinned_bytes: self.shared.config.max_pinned_bytes,
                    waited: WaitNote(None),
                })
            }
        }
    }

    fn try_alloc(&self, st: &mut State, len: usize, direction: Direction) -> Result<Option<IoBuf>> {
        let cfg = &self.shared.config;
        if len <= cfg.small_block_size_bytes {
            let got = match direction {
                Direction::Read => st.small.alloc_read(),
                Direction::Write => st.small.alloc_write(),
            };
            if let Some((list, index)) = got {
                st.stats.hits += 1;
                st.stats.small_allocs += 1;
                let l = st.small.list(list);
                let seg = Segment::new(l.ptr_of(index), cfg.small_block_size_bytes, l.slot);
                return Ok(Some(IoBuf::pooled(
                    len,
                    vec![seg],
                    buf::Origin::Small { list, index },
                    self.shared.clone(),
                )));
            }
        }
        if len >= cfg.chunk_size_bytes {
            return self.alloc_big(st, len);
        }
        self.alloc_medium(st, len)
    }

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a fresh chunk fits a medium request"
    )]
    fn alloc_medium(&self, st: &mut State, len: usize) -> Result<Option<IoBuf>> {
        let cfg = &self.shared.config;
        let regions = if let Some(r) = st.medium.alloc_contiguous(len) {
            st.stats.hits += 1;
            vec![r]
        } else if let Some(rs) = st.medium.alloc_scattered(len, cfg.max_segments) {
            st.stats.hits += 1;
            st.stats.scattered_allocs += 1;
            rs
        } else if self.can_pin(st, cfg.chunk_size_bytes) {
            let mem = AlignedMem::for_pinning(cfg.chunk_size_bytes);
            // SAFETY: the chunk's memory is kept in `st.chunks` until it is
            // unregistered in `release_chunk`.
            let slot = unsafe { pin(&self.shared.pinning, &mem, &mut st.free_slots)? };
            let id = st.medium.add_chunk(Instant::now());
            if slot.is_none() && self.is_registered() {
                st.unregistered_chunks.push(id);
                self.shared.issuer_work.store(true, Ordering::Release);
            }
            st.chunks.insert(id, PinnedMem { mem, slot });
            self.account_pin(st, cfg.chunk_size_bytes);
            st.stats.misses += 1;
            vec![st
                .medium
                .alloc_contiguous(len)
                .expect("a fresh chunk fits a medium request")]
        } else {
            return Ok(None);
        };
        st.stats.medium_allocs += 1;
        let segments = regions
            .iter()
            .map(|r| {
                let chunk = &st.chunks[&r.chunk];
                // SAFETY: the region lies inside the chunk (allocator invariant).
                let ptr = unsafe { chunk.mem.as_ptr().add(r.offset_bytes) };
                Segment::new(ptr, r.len_bytes, chunk.slot)
            })
            .collect();
        Ok(Some(IoBuf::pooled(
            len,
            segments,
            buf::Origin::Medium { regions },
            self.shared.clone(),
        )))
    }

    fn alloc_big(&self, st: &mut State, len: usize) -> Result<Option<IoBuf>> {
        let rounded = AlignedMem::pinning_size(len);
        // Completely free chunks give way to a big request before it waits.
        while !self.fits(st, rounded) {
            let Some(id) = st
                .medium
                .idle_chunks(Instant::now(), Duration::ZERO)
                .first()
                .copied()
            else {
                return Ok(None);
            };
            self.shared.release_chunk(st, id);
        }
        if !self.can_pin(st, rounded) {
            return Ok(None);
        }
        let mem = AlignedMem::for_pinning(rounded);
        // SAFETY: the memory moves into the IoBuf, whose drop unregisters it
        // before freeing.
        let slot = unsafe { pin(&self.shared.pinning, &mem, &mut st.free_slots)? };
        self.account_pin(st, rounded);
        st.stats.misses += 1;
        st.stats.big_allocs += 1;
        let seg = Segment::new(mem.as_ptr(), rounded, slot);
        Ok(Some(IoBuf::pooled(
            len,
            vec![seg],
            buf::Origin::Big { mem, slot },
            self.shared.clone(),
        )))
    }

    /// Room under M and, for a registered pool, a free table slot.
    fn can_pin(&self, st: &State, more_bytes: usize) -> bool {
        self.fits(st, more_bytes) && (!self.is_registered() || !st.free_slots.is_empty())
    }

    fn fits(&self, st: &State, more_bytes: usize) -> bool {
        st.stats.pinned_bytes + more_bytes as u64 <= self.shared.config.max_pinned_bytes
    }

    fn account_pin(&self, st: &mut State, bytes: usize) {
        st.stats.pins += 1;
        st.stats.pinned_bytes += bytes as u64;
        st.stats.peak_pinned_bytes = st.stats.peak_pinned_bytes.max(st.stats.pinned_bytes);
        debug_assert!(st.stats.pinned_bytes <= self.shared.config.max_pinned_bytes);
    }

    /// Registration work that a thread other than the ring's issuer left:
    /// registers chunks pinned there, unregisters memory released there.
    /// The engine calls it from `reap`; cheap when there is nothing to do.
    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: unregistered chunk exists"
    )]
    pub fn run_issuer_work(&self) {
        if !self.shared.issuer_work.load(Ordering::Acquire) {
            return;
        }
        let Pinning::Registered(reg) = &self.shared.pinning else {
            return;
        };
        if !reg.is_issuer_thread() {
            return;
        }
        let mut st = self.shared.lock();
        self.shared.issuer_work.store(false, Ordering::Release);
        let st = &mut *st;
        for (mem, slot) in std::mem::take(&mut st.deferred_unpins) {
            unpin(&self.shared.pinning, &mem, Some(slot), &mut st.free_slots);
            st.stats.unpins += 1;
            st.stats.pinned_bytes -= mem.len() as u64;
        }
        for id in std::mem::take(&mut st.unregistered_chunks) {
            let chunk = st.chunks.get_mut(&id).expect("unregistered chunk exists");
            // SAFETY: the chunk's memory stays in `st.chunks` until
            // `release_chunk` unregisters it.
            match unsafe { pin(&self.shared.pinning, &chunk.mem, &mut st.free_slots) } {
                Ok(slot) => chunk.slot = slot,
                // The chunk keeps serving plain I/O; nothing is lost.
                Err(e) => log::warn!("registering chunk {id} later failed: {e}"),
            }
        }
    }

    /// Releases chunks that have been completely free for the idle time.
    /// Also done on every free; call it from an idle loop to release memory
    /// when no buffer comes back.
    pub fn release_idle(&self) -> usize {
        let mut st = self.shared.lock();
        self.shared.release_idle_chunks(&mut st, Instant::now())
    }

    /// Releases idle chunks as if `now` were the current time (tests).
    pub fn release_idle_at(&self, now: Instant) -> usize {
        let mut st = self.shared.lock();
        self.shared.release_idle_chunks(&mut st, now)
    }

    /// Number of small blocks handed out now (tests and diagnostics).
    pub fn small_blocks_in_use(&self) -> usize {
        self.shared.lock().small.blocks_in_use()
    }

    /// Which write list is filling now (0 or 1).
    pub fn active_write_list(&self) -> usize {
        self.shared.lock().small.active_write_list()
    }

    /// Free runs per chunk: (chunk id, [(offset, len)]). For invariant checks.
    pub fn medium_free_map(&self) -> Vec<(u32, Vec<(usize, usize)>)> {
        let st = self.shared.lock();
        st.medium
            .chunk_ids()
            .into_iter()
            .map(|id| (id, st.medium.free_runs(id)))
            .collect()
    }
}

/// Pins `mem` the way the pool is configured; returns its table slot.
///
/// # Safety
/// `mem` must stay allocated until [`unpin`] has been called for it.
unsafe fn pin(
    pinning: &Pinning,
    mem: &AlignedMem,
    free_slots: &mut Vec<u16>,
) -> Result<Option<u16>> {
    match pinning {
        Pinning::Registered(reg) if !reg.is_issuer_thread() => Ok(None),
        Pinning::Registered(reg) => {
            let slot = free_slots.pop().ok_or_else(|| {
                IoError::Config("registered-buffer table is full; raise table_slots".into())
            })?;
            // SAFETY: forwarded from the caller's contract.
            if let Err(e) = unsafe { reg.register(slot, mem.iovec()) } {
                free_slots.push(slot);
                return Err(register_error(e, mem.len()));
            }
            Ok(Some(slot))
        }
        Pinning::Mlock => {
            // SAFETY: mem describes a live allocation of exactly this length.
            if unsafe { libc::mlock(mem.as_ptr().cast(), mem.len()) } != 0 {
                return Err(register_error(std::io::Error::last_os_error(), mem.len()));
            }
            Ok(None)
        }
        Pinning::Unpinned => Ok(None),
    }
}

fn register_error(e: std::io::Error, len: usize) -> IoError {
    if matches!(e.raw_os_error(), Some(libc::ENOMEM) | Some(libc::EPERM)) {
        let limits = crate::probe::memlock();
        return IoError::MemlockTooLow {
            requested_bytes: len as u64,
            limit_bytes: limits.limit_bytes,
        };
    }
    IoError::os("pin buffer", "(buffer pool)", e)
}

fn unpin(pinning: &Pinning, mem: &AlignedMem, slot: Option<u16>, free_slots: &mut Vec<u16>) {
    match pinning {
        Pinning::Registered(reg) => {
            // Memory pinned on a thread that could not register it has no slot.
            let Some(slot) = slot else { return };
            if let Err(e) = reg.unregister(slot) {
                // The slot stays taken: better a leaked slot than one reused
                // while the kernel still maps the old pages.
                log::error!("unregistering buffer slot {slot} failed: {e}");
                return;
            }
            free_slots.push(slot);
        }
        Pinning::Mlock => {
            // SAFETY: mem is live; munlock of locked pages has no other effect.
            unsafe { libc::munlock(mem.as_ptr().cast(), mem.len()) };
        }
        Pinning::Unpinned => {}
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: chunk memory exists"
    )]
    fn release_chunk(&self, st: &mut State, id: ChunkId) {
        st.medium.remove_chunk(id);
        st.unregistered_chunks.retain(|&c| c != id);
        let chunk = st.chunks.remove(&id).expect("chunk memory exists");
        self.unpin_owned(st, chunk.mem, chunk.slot);
    }

    /// Unpins and frees `mem`, or, on a thread that may not unregister,
    /// keeps it for the issuer.
    fn unpin_owned(&self, st: &mut State, mem: AlignedMem, slot: Option<u16>) {
        if let (Pinning::Registered(reg), Some(slot)) = (&self.pinning, slot) {
            if !reg.is_issuer_thread() {
                st.deferred_unpins.push((mem, slot));
                self.issuer_work.store(true, Ordering::Release);
                return;
            }
        }
        unpin(&self.pinning, &mem, slot, &mut st.free_slots);
        st.stats.unpins += 1;
        st.stats.pinned_bytes -= mem.len() as u64;
    }

    fn release_idle_chunks(&self, st: &mut State, now: Instant) -> usize {
        let idle = Duration::from_millis(self.config.idle_release_ms);
        let ids = st.medium.idle_chunks(now, idle);
        for &id in &ids {
            self.release_chunk(st, id);
            st.stats.idle_releases += 1;
        }
        ids.len()
    }

    /// Takes a buffer's memory back. Called from `IoBuf::drop`.
    pub(crate) fn give_back(&self, origin: buf::Origin) {
        let mut st = self.lock();
        let now = Instant::now();
        match origin {
            buf::Origin::Small { list, index } => st.small.free(list, index),
            buf::Origin::Medium { regions } => {
                for r in regions {
                    st.medium
                        .free(r, now)
                        .unwrap_or_else(|e| panic!("pool invariant broken freeing {r:?}: {e:?}"));
                }
                self.release_idle_chunks(&mut st, now);
            }
            buf::Origin::Big { mem, slot } => self.unpin_owned(&mut st, mem, slot),
            buf::Origin::Unpooled(_) => {}
        }
        let anyone_waiting = st.waiting > 0;
        drop(st);
        if anyone_waiting {
            self.returned.notify_all();
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let mut free_slots = std::mem::take(&mut st.free_slots);
        for list in [&st.small.read, &st.small.write[0], &st.small.write[1]] {
            unpin(&self.pinning, &list.mem, list.slot, &mut free_slots);
        }
        for chunk in st.chunks.values() {
            unpin(&self.pinning, &chunk.mem, chunk.slot, &mut free_slots);
        }
        for (mem, slot) in &st.deferred_unpins {
            unpin(&self.pinning, mem, Some(*slot), &mut free_slots);
        }
    }
}
