//! Shared-memory rings between `sluice serve` and a local client, with
//! everything unsafe about them kept here (docs/FORMAT.md, "Shared-memory
//! transport").
//!
//! A client connects to the server's Unix socket once; the server answers
//! with a sealed memfd ([`ShmRegion`]) holding a control block and two
//! single-producer/single-consumer byte rings — requests (client → server)
//! and responses (server → client) — and an eventfd that wakes the
//! server's thread. From then on a request is a frame copied into the ring
//! and one release store of its header: no system call, unless the other
//! side announced that it sleeps.
//!
//! Waiting without lost wake-ups: a side about to sleep sets its
//! `sleeping` word, issues a full fence, and looks at its ring once more
//! before it sleeps; a side that publishes issues a full fence after the
//! header store and then takes the peer's `sleeping` word (swap to 0): if it
//! was set, it wakes the peer (the client with `FUTEX_WAKE` on its word,
//! the server through its eventfd). One of the two always sees the other.
//!
//! Nothing the peer writes is trusted: the memfd is sealed against
//! shrinking and growing before it is handed over (a client cannot make
//! the server's mapping fault), ring sizes are the creator's own copies,
//! and every frame header and counter read from the peer is checked
//! against the ring ([`ShmError::Corrupt`] names the violation). Each client has its
//! own memfd, so no client can reach another's bytes.
//!
//! Needs Linux 3.17 (memfd_create, seals) and futexes on shared mappings.
//!
//! The region is here; `channel` holds a side's rings, `handshake` the
//! exchange that hands a region over, `unix` the socket helpers it uses.

mod channel;
mod handshake;
mod unix;

pub use channel::{Notifier, ShmChannel, Side, FRAME_ALIGN_BYTES, FRAME_HEADER_BYTES, WRAP_LENGTH};
pub use handshake::{
    admit_answer, check_hello, hello, parse_answer, refuse_answer, Answer, ADMIT_MAGIC,
    ANSWER_BYTES, HANDSHAKE_VERSION, HELLO_BYTES, HELLO_MAGIC, MAX_REFUSAL_BYTES, REFUSE_MAGIC,
};
pub use unix::{
    duplicate, peer_credentials, recv_with_fds, send_with_fds, wait_readable, PeerCredentials,
    MAX_PASSED_FDS,
};

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The first eight bytes of a region: "SLUSHM" and the layout version.
pub const SHM_MAGIC: u64 = u64::from_le_bytes(*b"SLUSHM\x02\x00");
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
/// Offset of the request ring's tail: the stream position of the next
/// frame the server will read (u64).
pub const OFF_REQUEST_TAIL: usize = 128;
/// Offset of the response ring's tail: the stream position of the next
/// frame the client will read (u64).
pub const OFF_RESPONSE_TAIL: usize = 256;
/// Offset of the server's sleeping word (u32, 1: wake it by its eventfd).
pub const OFF_SERVER_SLEEPING: usize = 320;
/// Offset of the client's sleeping word (u32, 1: wake it with FUTEX_WAKE;
/// the futex the client parks on).
pub const OFF_CLIENT_SLEEPING: usize = 384;
/// Offset of the closed word (u32, 1: a side closed the channel).
pub const OFF_CLOSED: usize = 448;

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
        let base = crate::mem::map_shared(fd.as_fd(), len)?;
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
        let base = crate::mem::map_shared(fd.as_fd(), len)?;
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
