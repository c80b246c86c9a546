//! Shared-memory rings between `sluice serve` and a local client, with
//! everything unsafe about them kept here (docs/FORMAT.md, "Shared-memory
//! transport").
//!
//! A client connects to the server's Unix socket once; the server answers
//! with a sealed memfd ([`ShmRegion`]) holding a control block and two
//! single-producer/single-consumer byte rings — requests (client → server)
//! and responses (server → client) — and an eventfd that wakes the
//! server's thread. From then on a request is bytes copied into the ring
//! and one release store of the ring's head: no system call, unless the
//! other side announced that it sleeps.
//!
//! Waiting without lost wake-ups: a side about to sleep sets its
//! `sleeping` word, issues a full fence, and looks at its ring once more
//! before it sleeps; a side that publishes issues a full fence after the
//! head store and then takes the peer's `sleeping` word (swap to 0): if it
//! was set, it wakes the peer (the client with `FUTEX_WAKE` on its word,
//! the server through its eventfd). One of the two always sees the other.
//!
//! Nothing the peer writes is trusted: the memfd is sealed against
//! shrinking and growing before it is handed over (a client cannot make
//! the server's mapping fault), ring sizes are the creator's own copies,
//! and every counter read from the peer is checked against the ring's
//! size ([`ShmError::Corrupt`] names the violation). Each client has its
//! own memfd, so no client can reach another's bytes.
//!
//! Needs Linux 3.17 (memfd_create, seals) and futexes on shared mappings.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// The first eight bytes of a region: "SLUSHM" and the layout version.
pub const SHM_MAGIC: u64 = u64::from_le_bytes(*b"SLUSHM\x01\x00");
/// Bytes of the control block, before the rings.
pub const CONTROL_BYTES: usize = 4096;
/// Smallest ring.
pub const MIN_RING_BYTES: usize = 4096;
/// Largest ring.
pub const MAX_RING_BYTES: usize = 1 << 30;

// Control block layout (docs/FORMAT.md): each word one side writes often
// sits on its own cache line, so the two sides do not bounce one line.
/// Offset of the magic (u64, [`SHM_MAGIC`]).
pub const OFF_MAGIC: usize = 0;
/// Offset of the request ring's size in bytes (u32).
pub const OFF_REQUEST_BYTES: usize = 8;
/// Offset of the response ring's size in bytes (u32).
pub const OFF_RESPONSE_BYTES: usize = 12;
/// Offset of the request ring's head: bytes the client has published (u64).
pub const OFF_REQUEST_HEAD: usize = 64;
/// Offset of the request ring's tail: bytes the server has taken (u64).
pub const OFF_REQUEST_TAIL: usize = 128;
/// Offset of the response ring's head: bytes the server has published (u64).
pub const OFF_RESPONSE_HEAD: usize = 192;
/// Offset of the response ring's tail: bytes the client has taken (u64).
pub const OFF_RESPONSE_TAIL: usize = 256;
/// Offset of the server's sleeping word (u32, 1: wake it by its eventfd).
pub const OFF_SERVER_SLEEPING: usize = 320;
/// Offset of the client's sleeping word (u32, 1: wake it with FUTEX_WAKE;
/// the futex the client parks on).
pub const OFF_CLIENT_SLEEPING: usize = 384;
/// Offset of the closed word (u32, 1: a side closed the channel).
pub const OFF_CLOSED: usize = 448;

/// The version of the handshake and the region layout.
pub const HANDSHAKE_VERSION: u32 = 1;
/// What a client sends first: this, the version u32 LE, flags u32 (0).
pub const HELLO_MAGIC: &[u8; 8] = b"SLUSHMHI";
/// The server's answer admitting a client: this, the version, 0u32, the
/// client id u64 LE; the memfd and the eventfd ride along (SCM_RIGHTS).
pub const ADMIT_MAGIC: &[u8; 8] = b"SLUSHMOK";
/// The server's answer refusing a client: this, the version, the error
/// text's length u32 LE, 0u64, then the text.
pub const REFUSE_MAGIC: &[u8; 8] = b"SLUSHMNO";
/// Bytes of the client's hello.
pub const HELLO_BYTES: usize = 16;
/// Bytes of the server's answer before any error text.
pub const ANSWER_BYTES: usize = 24;
/// Longest refusal text.
pub const MAX_REFUSAL_BYTES: usize = 512;

/// The client's hello.
pub fn hello() -> [u8; HELLO_BYTES] {
    let mut out = [0u8; HELLO_BYTES];
    out[..8].copy_from_slice(HELLO_MAGIC);
    out[8..12].copy_from_slice(&HANDSHAKE_VERSION.to_le_bytes());
    out
}

/// Checks a client's hello.
pub fn check_hello(hello: &[u8; HELLO_BYTES]) -> Result<(), String> {
    if &hello[..8] != HELLO_MAGIC {
        return Err("the client's first bytes are not a Sluice shared-memory hello".into());
    }
    let version = u32::from_le_bytes([hello[8], hello[9], hello[10], hello[11]]);
    if version != HANDSHAKE_VERSION {
        return Err(format!(
            "the client speaks version {version} of the shared-memory transport; this server speaks {HANDSHAKE_VERSION}"
        ));
    }
    Ok(())
}

/// The answer admitting client `id`.
pub fn admit_answer(id: u64) -> [u8; ANSWER_BYTES] {
    let mut out = [0u8; ANSWER_BYTES];
    out[..8].copy_from_slice(ADMIT_MAGIC);
    out[8..12].copy_from_slice(&HANDSHAKE_VERSION.to_le_bytes());
    out[16..24].copy_from_slice(&id.to_le_bytes());
    out
}

/// The answer refusing a client, with why.
pub fn refuse_answer(text: &str) -> Vec<u8> {
    let text = &text.as_bytes()[..text.len().min(MAX_REFUSAL_BYTES)];
    let mut out = Vec::with_capacity(ANSWER_BYTES + text.len());
    out.extend_from_slice(REFUSE_MAGIC);
    out.extend_from_slice(&HANDSHAKE_VERSION.to_le_bytes());
    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(text);
    out
}

/// A server's answer as the client reads it.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// Admitted, with this client id.
    Admitted(u64),
    /// Refused, with why.
    Refused(String),
}

/// Reads a server's answer (`bytes` holds all of it).
pub fn parse_answer(bytes: &[u8]) -> Result<Answer, String> {
    if bytes.len() < ANSWER_BYTES {
        return Err(format!(
            "the server's answer is {} bytes, short of {ANSWER_BYTES}",
            bytes.len()
        ));
    }
    let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if version != HANDSHAKE_VERSION {
        return Err(format!(
            "the server speaks version {version} of the shared-memory transport; this client speaks {HANDSHAKE_VERSION}"
        ));
    }
    let word = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]) as usize;
    let mut id = [0u8; 8];
    id.copy_from_slice(&bytes[16..24]);
    match &bytes[..8] {
        m if m == ADMIT_MAGIC => Ok(Answer::Admitted(u64::from_le_bytes(id))),
        m if m == REFUSE_MAGIC => {
            let text = bytes.get(ANSWER_BYTES..ANSWER_BYTES + word).unwrap_or(&bytes[ANSWER_BYTES..]);
            Ok(Answer::Refused(String::from_utf8_lossy(text).into_owned()))
        }
        _ => Err("the server's answer is not a Sluice shared-memory answer (is the path a Sluice --shm socket?)".into()),
    }
}

/// What went wrong with a ring.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShmError {
    /// The peer wrote a counter the protocol does not allow.
    #[error("the shared-memory ring is corrupt: {0}")]
    Corrupt(String),
    /// The other side closed the channel.
    #[error("the other side closed the shared-memory channel")]
    Closed,
}

/// A sealed memfd mapped into this process: the control block and both
/// rings of one client.
#[derive(Debug)]
pub struct ShmRegion {
    fd: OwnedFd,
    base: NonNull<u8>,
    len: usize,
    request_bytes: usize,
    response_bytes: usize,
}

// SAFETY: the region is plain shared memory; every access from this side
// goes through atomics or through `ShmChannel`, which has one owner.
unsafe impl Send for ShmRegion {}
// SAFETY: as above: shared access is only to atomic control words.
unsafe impl Sync for ShmRegion {}

fn check_ring_size(bytes: usize, what: &str) -> io::Result<()> {
    if !bytes.is_power_of_two() || !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&bytes) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "the {what} ring is {bytes} bytes: it must be a power of two from {MIN_RING_BYTES} to {MAX_RING_BYTES}"
            ),
        ));
    }
    Ok(())
}

impl ShmRegion {
    /// Creates a region with rings of the given sizes (powers of two), and
    /// seals its size so the peer cannot shrink it under this mapping.
    pub fn create(request_bytes: usize, response_bytes: usize) -> io::Result<ShmRegion> {
        check_ring_size(request_bytes, "request")?;
        check_ring_size(response_bytes, "response")?;
        let len = CONTROL_BYTES + request_bytes + response_bytes;
        // SAFETY: the name is a NUL-terminated literal; the result is checked.
        let raw = unsafe {
            libc::memfd_create(
                c"sluice-shm".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain calls on our descriptor; results checked.
        unsafe {
            if libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) != 0 {
                return Err(io::Error::last_os_error());
            }
            let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
            if libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        let base = map(&fd, len)?;
        let region = ShmRegion {
            fd,
            base,
            len,
            request_bytes,
            response_bytes,
        };
        region
            .u32_at(OFF_REQUEST_BYTES)
            .store(request_bytes as u32, Ordering::Relaxed);
        region
            .u32_at(OFF_RESPONSE_BYTES)
            .store(response_bytes as u32, Ordering::Relaxed);
        region.u64_at(OFF_MAGIC).store(SHM_MAGIC, Ordering::Release);
        Ok(region)
    }

    /// Maps a region received from a server, after checking its seals,
    /// magic and sizes.
    pub fn open(fd: OwnedFd) -> io::Result<ShmRegion> {
        let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        // SAFETY: plain fcntl on our descriptor.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(bad(
                "the shared-memory region is not sealed against shrinking".into(),
            ));
        }
        // SAFETY: stat is plain data, filled by fstat from a live pointer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let len = st.st_size as usize;
        if len < CONTROL_BYTES + 2 * MIN_RING_BYTES {
            return Err(bad(format!("the shared-memory region is only {len} bytes")));
        }
        let base = map(&fd, len)?;
        let mut region = ShmRegion {
            fd,
            base,
            len,
            request_bytes: 0,
            response_bytes: 0,
        };
        let magic = region.u64_at(OFF_MAGIC).load(Ordering::Acquire);
        if magic != SHM_MAGIC {
            return Err(bad(format!(
                "the shared-memory region starts with {magic:#x}, not Sluice's {SHM_MAGIC:#x} (a different layout version?)"
            )));
        }
        let request = region.u32_at(OFF_REQUEST_BYTES).load(Ordering::Relaxed) as usize;
        let response = region.u32_at(OFF_RESPONSE_BYTES).load(Ordering::Relaxed) as usize;
        check_ring_size(request, "request")?;
        check_ring_size(response, "response")?;
        if CONTROL_BYTES + request + response != len {
            return Err(bad(format!(
                "the shared-memory region is {len} bytes, its rings say {}",
                CONTROL_BYTES + request + response
            )));
        }
        region.request_bytes = request;
        region.response_bytes = response;
        Ok(region)
    }

    /// The memfd, to hand to the client.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Bytes of the request ring.
    pub fn request_bytes(&self) -> usize {
        self.request_bytes
    }

    /// Bytes of the response ring.
    pub fn response_bytes(&self) -> usize {
        self.response_bytes
    }

    fn u64_at(&self, offset: usize) -> &AtomicU64 {
        assert!(offset + 8 <= CONTROL_BYTES && offset.is_multiple_of(8));
        // SAFETY: in bounds of the live mapping (asserted), 8-aligned (the
        // mapping is page-aligned), and only ever accessed atomically.
        unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    fn u32_at(&self, offset: usize) -> &AtomicU32 {
        assert!(offset + 4 <= CONTROL_BYTES && offset.is_multiple_of(4));
        // SAFETY: as for `u64_at`.
        unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU32>() }
    }
}

impl Drop for ShmRegion {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

fn map(fd: &OwnedFd, len: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: a fresh shared mapping of our descriptor; the result is checked.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

/// Which end of a region this process holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Writes responses, reads requests.
    Server,
    /// Writes requests, reads responses.
    Client,
}

/// One side's view of a region: it produces into one ring and consumes
/// from the other. Its own counters are kept here, so a peer that
/// scribbles over the control block can only make this side see an error.
#[derive(Debug)]
pub struct ShmChannel {
    region: ShmRegion,
    side: Side,
    out_offset: usize,
    out_bytes: usize,
    in_offset: usize,
    in_bytes: usize,
    out_head_at: usize,
    out_tail_at: usize,
    in_head_at: usize,
    in_tail_at: usize,
    own_sleeping_at: usize,
    peer_sleeping_at: usize,
    /// Bytes this side has published into its outgoing ring.
    out_head: u64,
    /// The peer's outgoing-ring tail as last read: the producer reads the
    /// shared word (a cache miss: the peer wrote it) only when this says
    /// the ring may be full.
    out_tail_seen: u64,
    /// Bytes written after `out_head` and not yet published
    /// ([`ShmChannel::stage_all`]).
    out_staged: usize,
    /// Bytes this side has taken from its incoming ring.
    in_tail: u64,
}

impl ShmChannel {
    /// Takes `side` of `region`.
    pub fn new(region: ShmRegion, side: Side) -> ShmChannel {
        let request_offset = CONTROL_BYTES;
        let response_offset = CONTROL_BYTES + region.request_bytes;
        let (out_offset, out_bytes, in_offset, in_bytes) = match side {
            Side::Client => (
                request_offset,
                region.request_bytes,
                response_offset,
                region.response_bytes,
            ),
            Side::Server => (
                response_offset,
                region.response_bytes,
                request_offset,
                region.request_bytes,
            ),
        };
        let (out_head_at, out_tail_at, in_head_at, in_tail_at) = match side {
            Side::Client => (
                OFF_REQUEST_HEAD,
                OFF_REQUEST_TAIL,
                OFF_RESPONSE_HEAD,
                OFF_RESPONSE_TAIL,
            ),
            Side::Server => (
                OFF_RESPONSE_HEAD,
                OFF_RESPONSE_TAIL,
                OFF_REQUEST_HEAD,
                OFF_REQUEST_TAIL,
            ),
        };
        let (own_sleeping_at, peer_sleeping_at) = match side {
            Side::Client => (OFF_CLIENT_SLEEPING, OFF_SERVER_SLEEPING),
            Side::Server => (OFF_SERVER_SLEEPING, OFF_CLIENT_SLEEPING),
        };
        // A client takes over where the counters stand (zero when fresh).
        let out_head = region.u64_at(out_head_at).load(Ordering::Acquire);
        let out_tail_seen = region.u64_at(out_tail_at).load(Ordering::Acquire);
        let in_tail = region.u64_at(in_tail_at).load(Ordering::Acquire);
        ShmChannel {
            region,
            side,
            out_offset,
            out_bytes,
            in_offset,
            in_bytes,
            out_head_at,
            out_tail_at,
            in_head_at,
            in_tail_at,
            own_sleeping_at,
            peer_sleeping_at,
            out_head,
            out_tail_seen,
            out_staged: 0,
            in_tail,
        }
    }

    /// The region (its fd, sizes).
    pub fn region(&self) -> &ShmRegion {
        &self.region
    }

    /// Which side this is.
    pub fn side(&self) -> Side {
        self.side
    }

    /// Bytes free in the outgoing ring.
    pub fn out_free(&self) -> Result<usize, ShmError> {
        let tail = self.region.u64_at(self.out_tail_at).load(Ordering::Acquire);
        self.free_given(tail)
    }

    fn free_given(&self, tail: u64) -> Result<usize, ShmError> {
        let used = self.out_head.wrapping_sub(tail);
        if used > self.out_bytes as u64 {
            return Err(ShmError::Corrupt(format!(
                "the peer says it consumed up to byte {tail}, but only {} were published",
                self.out_head
            )));
        }
        // Staged bytes fitted in the room left when they were written, and
        // the tail only moves forward.
        Ok(self.out_bytes - used as usize - self.out_staged)
    }

    /// Whether everything published outgoing has been taken by the peer.
    pub fn out_drained(&self) -> Result<bool, ShmError> {
        Ok(self.out_free()? == self.out_bytes)
    }

    /// Bytes free in the outgoing ring for a write of `wanted`: the
    /// peer's tail is read again only when the last one seen leaves too
    /// little room (it only ever frees more).
    fn room_for(&mut self, wanted: usize) -> Result<usize, ShmError> {
        let free = self.free_given(self.out_tail_seen)?;
        if free >= wanted {
            return Ok(free);
        }
        self.out_tail_seen = self.region.u64_at(self.out_tail_at).load(Ordering::Acquire);
        self.free_given(self.out_tail_seen)
    }

    /// Copies `bytes` into the outgoing ring at `offset` bytes past what
    /// is written (published or staged), without publishing. The caller
    /// made sure they fit.
    fn copy_out(&mut self, offset: usize, bytes: &[u8]) {
        let n = bytes.len();
        debug_assert!(offset + n <= self.free_given(self.out_tail_seen).unwrap_or(0));
        let written = self.out_head + (self.out_staged + offset) as u64;
        let at = (written % self.out_bytes as u64) as usize;
        let first = n.min(self.out_bytes - at);
        // SAFETY: both ranges lie inside the outgoing ring of the live
        // mapping (`at + first <= out_bytes`, and the wrapped part starts
        // at 0 with `n - first <= at`); the bytes between the peer's tail
        // and our head plus the free room are ours to write until the
        // head store that publishes them.
        unsafe {
            let ring = self.region.base.as_ptr().add(self.out_offset);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), ring.add(at), first);
            std::ptr::copy_nonoverlapping(bytes.as_ptr().add(first), ring, n - first);
        }
    }

    /// Publishes what is staged and `n` more bytes written after it (one
    /// release store).
    fn publish(&mut self, n: usize) {
        self.out_head += (std::mem::take(&mut self.out_staged) + n) as u64;
        self.region
            .u64_at(self.out_head_at)
            .store(self.out_head, Ordering::Release);
    }

    /// Copies as much of `bytes` as fits into the outgoing ring and
    /// publishes it, after anything staged, with one release store;
    /// returns how much of `bytes` went in.
    pub fn write(&mut self, bytes: &[u8]) -> Result<usize, ShmError> {
        let n = bytes.len().min(self.room_for(bytes.len())?);
        if n > 0 {
            self.copy_out(0, &bytes[..n]);
        }
        if n > 0 || self.out_staged > 0 {
            self.publish(n);
        }
        Ok(n)
    }

    /// Copies `parts` one after another into the outgoing ring, if they
    /// all fit, without publishing them; whether they did (nothing is
    /// written if not). A server builds replies straight in the ring this
    /// way, each value copied once, and publishes a turn's worth with
    /// [`ShmChannel::publish_staged`] (or the next [`ShmChannel::write`]):
    /// the client does not pull a line back while the next reply goes in.
    pub fn stage_all(&mut self, parts: &[&[u8]]) -> Result<bool, ShmError> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if self.room_for(total)? < total {
            return Ok(false);
        }
        let mut offset = 0;
        for part in parts {
            self.copy_out(offset, part);
            offset += part.len();
        }
        self.out_staged += total;
        Ok(true)
    }

    /// Publishes what [`ShmChannel::stage_all`] wrote; how many bytes.
    pub fn publish_staged(&mut self) -> usize {
        let n = self.out_staged;
        if n > 0 {
            self.publish(0);
        }
        n
    }

    /// Bytes waiting in the incoming ring.
    pub fn in_pending(&self) -> Result<usize, ShmError> {
        let head = self.region.u64_at(self.in_head_at).load(Ordering::Acquire);
        let pending = head.wrapping_sub(self.in_tail);
        if pending > self.in_bytes as u64 {
            return Err(ShmError::Corrupt(format!(
                "the peer published up to byte {head}, {pending} bytes past what was consumed, in a {}-byte ring",
                self.in_bytes
            )));
        }
        Ok(pending as usize)
    }

    /// Appends up to `max` waiting bytes of the incoming ring to `into`
    /// and gives their room back to the peer; returns how many.
    pub fn read(&mut self, into: &mut Vec<u8>, max: usize) -> Result<usize, ShmError> {
        let n = self.in_pending()?.min(max);
        if n == 0 {
            return Ok(0);
        }
        let at = (self.in_tail % self.in_bytes as u64) as usize;
        let first = n.min(self.in_bytes - at);
        into.reserve(n);
        let len = into.len();
        // SAFETY: the source ranges lie inside the incoming ring of the live
        // mapping (as in `write`); the destination is `into`'s reserved
        // spare capacity, whose length is set only after the copy. A peer
        // that writes these bytes while we copy breaks the protocol and
        // only gets garbage parsed as its own request.
        unsafe {
            let ring = self.region.base.as_ptr().add(self.in_offset);
            let dst = into.as_mut_ptr().add(len);
            std::ptr::copy_nonoverlapping(ring.add(at), dst, first);
            std::ptr::copy_nonoverlapping(ring, dst.add(first), n - first);
            into.set_len(len + n);
        }
        self.in_tail += n as u64;
        self.region
            .u64_at(self.in_tail_at)
            .store(self.in_tail, Ordering::Release);
        Ok(n)
    }

    /// Announces that this side is about to sleep. The caller must look
    /// at its rings once more afterwards and sleep only if they are still
    /// idle ([`ShmChannel::clear_sleeping`] if it does not sleep).
    pub fn announce_sleeping(&self) {
        self.region
            .u32_at(self.own_sleeping_at)
            .store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Withdraws [`ShmChannel::announce_sleeping`].
    pub fn clear_sleeping(&self) {
        self.region
            .u32_at(self.own_sleeping_at)
            .store(0, Ordering::Relaxed);
    }

    /// After publishing: whether the peer announced it sleeps (the flag is
    /// taken, so it is woken once). The caller then wakes it.
    pub fn take_peer_sleeping(&self) -> bool {
        fence(Ordering::SeqCst);
        let flag = self.region.u32_at(self.peer_sleeping_at);
        flag.load(Ordering::Relaxed) != 0 && flag.swap(0, Ordering::AcqRel) != 0
    }

    /// Client: sleeps until the server clears this side's sleeping word
    /// (it published or closed), or `timeout` passes. Call after
    /// [`ShmChannel::announce_sleeping`] and a last look at the rings.
    pub fn park(&self, timeout: Duration) {
        assert_eq!(self.side, Side::Client, "only a client parks on its futex");
        let word = self.region.u32_at(self.own_sleeping_at);
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: the futex word lives in the live shared mapping; the
        // timespec is a live local. A shared (not private) futex, as the
        // waker is another process. EAGAIN/EINTR/ETIMEDOUT all mean "look
        // again", which the caller does.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT,
                1u32,
                &ts as *const libc::timespec,
            );
        }
    }

    /// Server: wakes a client parked in [`ShmChannel::park`].
    pub fn wake_client(&self) {
        let word = self.region.u32_at(OFF_CLIENT_SLEEPING);
        // SAFETY: the futex word lives in the live shared mapping.
        unsafe {
            libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
        }
    }

    /// Marks the channel closed by this side, and wakes a parked client.
    pub fn close(&self) {
        self.region.u32_at(OFF_CLOSED).store(1, Ordering::SeqCst);
        if self.side == Side::Server {
            self.region
                .u32_at(OFF_CLIENT_SLEEPING)
                .store(0, Ordering::SeqCst);
            self.wake_client();
        }
    }

    /// Whether either side closed the channel.
    pub fn closed(&self) -> bool {
        self.region.u32_at(OFF_CLOSED).load(Ordering::Acquire) != 0
    }
}

/// An eventfd the client writes to wake the server's thread.
#[derive(Debug)]
pub struct Notifier {
    fd: OwnedFd,
}

impl Notifier {
    /// Wraps an eventfd received from the server.
    pub fn new(fd: OwnedFd) -> Notifier {
        Notifier { fd }
    }

    /// Wakes the server thread.
    pub fn notify(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live local to our eventfd; a full
        // counter (EAGAIN) already means "woken".
        unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), 8) };
    }
}

/// Most descriptors one message carries.
pub const MAX_PASSED_FDS: usize = 4;

/// Sends `bytes` with `fds` attached (SCM_RIGHTS) in one message.
pub fn send_with_fds(sock: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    assert!(
        fds.len() <= MAX_PASSED_FDS,
        "at most {MAX_PASSED_FDS} descriptors"
    );
    assert!(!bytes.is_empty(), "a message carries at least one byte");
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let fd_bytes = std::mem::size_of_val(raw.as_slice());
    let mut control = [0u64; 16];
    // SAFETY: CMSG_SPACE is pure arithmetic.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    assert!(space <= std::mem::size_of_val(&control));
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is plain data; every pointer set below is live for the
    // sendmsg call, and the control buffer is 8-aligned and big enough.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !raw.is_empty() {
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
            std::ptr::copy_nonoverlapping(
                raw.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                fd_bytes,
            );
        }
        let n = libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if (n as usize) < bytes.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "a handshake message went out in part",
            ));
        }
    }
    Ok(())
}

/// Receives one message into `buf` with the descriptors it carries.
pub fn recv_with_fds(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut control = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut fds = Vec::new();
    // SAFETY: msghdr is plain data with pointers to live locals; the
    // control messages are walked with the CMSG macros within
    // msg_controllen, and each received descriptor is owned at once.
    let n = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        let n = libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let bytes = (*cmsg).cmsg_len as usize - (data as usize - cmsg as usize);
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a handshake message carried more descriptors than expected",
            ));
        }
        n as usize
    };
    Ok((n, fds))
}

/// The peer's process, user and group ids (SO_PEERCRED).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCredentials {
    /// Process id.
    pub pid: i32,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// Who is at the other end of `sock`.
pub fn peer_credentials(sock: &UnixStream) -> io::Result<PeerCredentials> {
    // SAFETY: ucred is plain data filled by getsockopt from live pointers.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: as above.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCredentials {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// Waits until `fd` is readable (or hung up) or `timeout` passes;
/// returns whether it is.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one live pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    match n {
        n if n > 0 => Ok(true),
        0 => Ok(false),
        _ => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}

/// A duplicate of `fd` (to hand a waker's eventfd to a client).
pub fn duplicate(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    fd.try_clone_to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(request: usize, response: usize) -> (ShmChannel, ShmChannel) {
        let server = ShmRegion::create(request, response).unwrap();
        let fd = server.fd().try_clone_to_owned().unwrap();
        let client = ShmRegion::open(fd).unwrap();
        (
            ShmChannel::new(server, Side::Server),
            ShmChannel::new(client, Side::Client),
        )
    }

    #[test]
    fn bytes_cross_both_rings_and_wrap() {
        let (mut server, mut client) = pair(4096, 8192);
        let mut got = Vec::new();
        for round in 0..50u32 {
            let msg: Vec<u8> = (0..3000).map(|i| (i as u32 + round) as u8).collect();
            assert_eq!(client.write(&msg).unwrap(), 3000);
            assert_eq!(client.write(&msg).unwrap(), 1096, "only what fits");
            got.clear();
            assert_eq!(server.read(&mut got, usize::MAX).unwrap(), 4096);
            assert_eq!(&got[..3000], &msg[..]);
            assert_eq!(&got[3000..], &msg[..1096]);
            assert_eq!(server.write(&msg).unwrap(), 3000);
            got.clear();
            assert_eq!(client.read(&mut got, 1000).unwrap(), 1000);
            assert_eq!(client.read(&mut got, 5000).unwrap(), 2000);
            assert_eq!(got, msg);
        }
    }

    #[test]
    fn staged_writes_go_in_whole_or_not_at_all_and_show_once_published() {
        let (mut server, mut client) = pair(4096, 4096);
        let mut got = Vec::new();
        for round in 0..40usize {
            // 1000 + round bytes a reply: the replies land at every offset
            // of the ring, some across its end.
            let value: Vec<u8> = (0..1000 + round).map(|i| (i + round) as u8).collect();
            let header = format!("${}\r\n", value.len());
            let parts: [&[u8]; 3] = [header.as_bytes(), &value, b"\r\n"];
            let reply_bytes = header.len() + value.len() + 2;
            let fit = 4096 / reply_bytes;
            for _ in 0..fit {
                assert!(server.stage_all(&parts).unwrap());
            }
            assert!(
                !server.stage_all(&parts).unwrap(),
                "a reply that does not fit"
            );
            got.clear();
            assert_eq!(
                client.read(&mut got, usize::MAX).unwrap(),
                0,
                "staged, not published"
            );
            assert_eq!(server.publish_staged(), fit * reply_bytes);
            assert_eq!(
                client.read(&mut got, usize::MAX).unwrap(),
                fit * reply_bytes
            );
            let mut want = Vec::new();
            for _ in 0..fit {
                want.extend_from_slice(header.as_bytes());
                want.extend_from_slice(&value);
                want.extend_from_slice(b"\r\n");
            }
            assert_eq!(got, want);
        }
    }

    #[test]
    fn a_lying_peer_is_an_error_not_a_fault() {
        let (mut server, client) = pair(4096, 4096);
        client
            .region
            .u64_at(OFF_REQUEST_HEAD)
            .store(1 << 40, Ordering::Release);
        assert!(matches!(server.in_pending(), Err(ShmError::Corrupt(_))));
        assert!(matches!(
            server.read(&mut Vec::new(), 10),
            Err(ShmError::Corrupt(_))
        ));
        client
            .region
            .u64_at(OFF_RESPONSE_TAIL)
            .store(99, Ordering::Release);
        // The producer reads the peer's tail when the ring may be full.
        assert!(matches!(
            server.write(&[0; 5000]),
            Err(ShmError::Corrupt(_))
        ));
    }

    #[test]
    fn sizes_seals_and_magic_are_checked() {
        assert!(ShmRegion::create(1000, 4096).is_err());
        assert!(ShmRegion::create(4096, 1 << 31).is_err());
        let region = ShmRegion::create(4096, 4096).unwrap();
        let fd = region.fd().try_clone_to_owned().unwrap();
        // SAFETY: test-only ftruncate on our own memfd, which must fail.
        let r = unsafe { libc::ftruncate(fd.as_raw_fd(), 100) };
        assert_ne!(r, 0, "a sealed region cannot shrink");
        region.u64_at(OFF_MAGIC).store(7, Ordering::Release);
        let err = ShmRegion::open(fd).unwrap_err();
        assert!(err.to_string().contains("not Sluice's"), "{err}");
    }

    #[test]
    fn a_parked_client_is_woken_by_the_server() {
        let (mut server, mut client) = pair(4096, 4096);
        let t = std::thread::spawn(move || {
            let mut got = Vec::new();
            let start = std::time::Instant::now();
            while got.is_empty() {
                client.announce_sleeping();
                if client.in_pending().unwrap() == 0 {
                    client.park(Duration::from_secs(10));
                }
                client.clear_sleeping();
                client.read(&mut got, 100).unwrap();
            }
            (got, start.elapsed())
        });
        std::thread::sleep(Duration::from_millis(50));
        server.write(b"+OK\r\n").unwrap();
        if server.take_peer_sleeping() {
            server.wake_client();
        }
        let (got, waited) = t.join().unwrap();
        assert_eq!(got, b"+OK\r\n");
        assert!(
            waited < Duration::from_secs(5),
            "woken, not timed out: {waited:?}"
        );
    }

    #[test]
    fn descriptors_pass_over_a_unix_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let region = ShmRegion::create(4096, 4096).unwrap();
        send_with_fds(&a, b"hi", &[region.fd()]).unwrap();
        let mut buf = [0u8; 16];
        let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hi");
        assert_eq!(fds.len(), 1);
        let opened = ShmRegion::open(fds.into_iter().next().unwrap()).unwrap();
        assert_eq!(opened.request_bytes(), 4096);
        let cred = peer_credentials(&b).unwrap();
        assert_eq!(cred.pid, std::process::id() as i32);
    }
}
