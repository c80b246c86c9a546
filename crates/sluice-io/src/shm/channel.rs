//! One side's end of a region's two rings: framing, publishing and
//! taking frames, sleeping and waking the peer.

use super::{
    ShmError, ShmRegion, CONTROL_BYTES, OFF_CLIENT_SLEEPING, OFF_CLOSED, OFF_REQUEST_TAIL,
    OFF_RESPONSE_TAIL, OFF_SERVER_SLEEPING,
};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::time::Duration;

/// Which end of a region this process holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Writes responses, reads requests.
    Server,
    /// Writes requests, reads responses.
    Client,
}

/// Frames start on a cache line: a frame of up to 56 payload bytes (a
/// GET, an OK) is one line, so one transfer between the cores.
pub const FRAME_ALIGN_BYTES: usize = 64;
/// How far past its position a producer keeps the header slots zeroed
/// (why: docs/BENCHMARKS.md, "Framed rings").
const ZERO_AHEAD_BYTES: usize = 2048;
/// Bytes of a frame's header: payload length (low half) and lap stamp
/// (high half), one u64 in native byte order.
pub const FRAME_HEADER_BYTES: usize = 8;
/// The payload length that marks a wrap: the next frame starts at the
/// ring's start.
pub const WRAP_LENGTH: u32 = u32::MAX;

/// The stamp a frame header at stream position `pos` carries: the lap of
/// the ring it lies in, plus one (never 0, so a zeroed slot is no frame).
/// Ring sizes are powers of two: a shift, not a division.
fn lap_stamp(pos: u64, ring_bytes: usize) -> u64 {
    (pos >> ring_bytes.trailing_zeros()) % u64::from(u32::MAX) + 1
}

/// Where stream position `pos` lies in a ring of `ring_bytes` (a power of
/// two).
fn ring_offset(pos: u64, ring_bytes: usize) -> usize {
    (pos & (ring_bytes as u64 - 1)) as usize
}

/// Ring bytes a frame with `payload` bytes takes: header, payload, and
/// padding to the next frame's line.
fn frame_bytes(payload: usize) -> usize {
    (FRAME_HEADER_BYTES + payload).next_multiple_of(FRAME_ALIGN_BYTES)
}

/// Where the next frame goes, and how much payload fits there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Placement {
    /// The open frame is published first.
    close_open: bool,
    /// A wrap marker is published first: the frame starts at the ring's start.
    wrap: bool,
    /// Payload bytes the (open or new) frame can take.
    room: usize,
}

/// One side's view of a region: it produces frames into one ring and
/// consumes frames from the other. Its own positions are kept here, so a
/// peer that scribbles over the region can only make this side see an
/// error.
///
/// A ring carries frames: an 8-byte header (payload length, lap stamp),
/// then the payload, padded to the next cache line. The producer zeroes the header
/// slot after a frame, then publishes the frame with one release store of
/// its header; the consumer polls the slot where the next frame will start.
/// So a frame that fits one cache line reaches the peer in one transfer of
/// that line, where a separate head word would take two (docs/FORMAT.md).
#[derive(Debug)]
pub struct ShmChannel {
    region: ShmRegion,
    side: Side,
    out_offset: usize,
    out_bytes: usize,
    in_offset: usize,
    in_bytes: usize,
    out_tail_at: usize,
    in_tail_at: usize,
    own_sleeping_at: usize,
    peer_sleeping_at: usize,
    /// Stream position after the last published frame: where the open
    /// frame's header lies, or the next frame's.
    out_head: u64,
    /// The peer's outgoing-ring tail as last read: the producer reads the
    /// shared word (a cache miss: the peer wrote it) only when this says
    /// the ring may be full.
    out_tail_seen: u64,
    /// Payload bytes of the open frame (written, not published), at
    /// `out_head` + header ([`ShmChannel::stage_all`]); 0: none open.
    out_staged: usize,
    /// Every line start from the next frame's slot up to here is zero.
    out_zeroed_to: u64,
    /// Stream position of the next frame to read.
    in_tail: u64,
    /// Payload bytes of the frame at `in_tail` already read.
    in_taken: usize,
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
        let (out_tail_at, in_tail_at) = match side {
            Side::Client => (OFF_REQUEST_TAIL, OFF_RESPONSE_TAIL),
            Side::Server => (OFF_RESPONSE_TAIL, OFF_REQUEST_TAIL),
        };
        let (own_sleeping_at, peer_sleeping_at) = match side {
            Side::Client => (OFF_CLIENT_SLEEPING, OFF_SERVER_SLEEPING),
            Side::Server => (OFF_SERVER_SLEEPING, OFF_CLIENT_SLEEPING),
        };
        // Each side of a fresh region is taken once: every position starts
        // at 0, and the zeroed ring is all empty header slots.
        ShmChannel {
            region,
            side,
            out_offset,
            out_bytes,
            in_offset,
            in_bytes,
            out_tail_at,
            in_tail_at,
            own_sleeping_at,
            peer_sleeping_at,
            out_head: 0,
            out_tail_seen: 0,
            out_staged: 0,
            out_zeroed_to: 0,
            in_tail: 0,
            in_taken: 0,
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

    /// The header slot of stream position `pos` in the ring at `offset`
    /// of `bytes`.
    fn slot(&self, offset: usize, bytes: usize, pos: u64) -> &AtomicU64 {
        let at = ring_offset(pos, bytes);
        assert!(at.is_multiple_of(FRAME_HEADER_BYTES) && at + FRAME_HEADER_BYTES <= bytes);
        // SAFETY: inside the ring, inside the live mapping (asserted); the
        // ring starts 8-aligned (after the 4096-byte control block and a
        // power-of-two ring) and `at` is 8-aligned, and header slots are
        // only ever accessed atomically by this side.
        unsafe {
            &*self
                .region
                .base
                .as_ptr()
                .add(offset + at)
                .cast::<AtomicU64>()
        }
    }

    /// Payload bytes a write could place now (0: the ring is full).
    pub fn out_free(&self) -> Result<usize, ShmError> {
        let tail = self.region.u64_at(self.out_tail_at).load(Ordering::Acquire);
        Ok(self.place(tail, usize::MAX)?.map_or(0, |p| p.room))
    }

    /// Ring bytes free from `out_head` on, given the peer's `tail`.
    fn free_given(&self, tail: u64) -> Result<usize, ShmError> {
        let used = self.out_head.wrapping_sub(tail);
        if used > self.out_bytes as u64 {
            return Err(ShmError::Corrupt(format!(
                "the peer says it consumed up to byte {tail}, but only {} were published",
                self.out_head
            )));
        }
        Ok(self.out_bytes - used as usize)
    }

    /// Payload room of a new frame at `pos` with `free` ring bytes from
    /// `pos` on: the frame may not cross the ring's end, and the header
    /// slot after it must be free too (it is zeroed before the publish).
    fn room_at(&self, pos: u64, free: usize) -> usize {
        let to_end = self.out_bytes - ring_offset(pos, self.out_bytes);
        // Down to a whole line: an honest peer's tail always is on one.
        let limit = to_end.min(free.saturating_sub(FRAME_HEADER_BYTES)) & !(FRAME_ALIGN_BYTES - 1);
        limit.saturating_sub(FRAME_HEADER_BYTES)
    }

    /// Where `wanted` more payload bytes go, given the peer's `tail`. In
    /// order: the open frame, a new frame after it, a new frame after a
    /// wrap. The first that takes all of them, else the first that takes
    /// some (the rest then goes after the wrap, so no room before the
    /// ring's end is skipped while it could be used). None: not a byte fits.
    fn place(&self, tail: u64, wanted: usize) -> Result<Option<Placement>, ShmError> {
        let free = self.free_given(tail)?;
        let open = Placement {
            close_open: false,
            wrap: false,
            room: self
                .room_at(self.out_head, free)
                .saturating_sub(self.out_staged),
        };
        if open.room >= wanted {
            return Ok(Some(open));
        }
        let close_open = self.out_staged > 0;
        let (mut pos, mut left) = (self.out_head, free);
        if close_open {
            let taken = frame_bytes(self.out_staged);
            pos += taken as u64;
            left -= taken;
        }
        let here = Placement {
            close_open,
            wrap: false,
            room: self.room_at(pos, left),
        };
        let to_end = self.out_bytes - ring_offset(pos, self.out_bytes);
        // The marker's own slot is zeroed already; the slot at the ring's
        // start must be free to zero.
        let wrapped = (left >= to_end + FRAME_HEADER_BYTES).then(|| Placement {
            close_open,
            wrap: true,
            room: self.room_at(pos + to_end as u64, left - to_end),
        });
        let candidates = [Some(open), Some(here), wrapped];
        let whole = candidates.iter().flatten().find(|p| p.room >= wanted);
        let some = candidates.iter().flatten().find(|p| p.room > 0);
        Ok(whole.or(some).copied())
    }

    /// [`ShmChannel::place`] against the tail last seen, reading the
    /// peer's tail again only when that leaves less than `wanted`.
    fn place_for(&mut self, wanted: usize) -> Result<Option<Placement>, ShmError> {
        let seen = self.place(self.out_tail_seen, wanted)?;
        if seen.is_some_and(|p| p.room >= wanted) {
            return Ok(seen);
        }
        self.out_tail_seen = self.region.u64_at(self.out_tail_at).load(Ordering::Acquire);
        self.place(self.out_tail_seen, wanted)
    }

    /// Publishes the frame or wrap marker whose header goes at `out_head`
    /// and takes `taken` ring bytes: makes sure the slot after it is zero,
    /// then one release store of the header.
    fn publish_header(&mut self, length: u32, taken: usize) {
        let next = self.out_head + taken as u64;
        let (offset, bytes) = (self.out_offset, self.out_bytes);
        if next >= self.out_zeroed_to {
            self.slot(offset, bytes, next).store(0, Ordering::Relaxed);
            self.out_zeroed_to = next + FRAME_ALIGN_BYTES as u64;
        }
        let header = lap_stamp(self.out_head, bytes) << 32 | u64::from(length);
        self.slot(offset, bytes, self.out_head)
            .store(header, Ordering::Release);
        self.out_head = next;
        self.zero_ahead();
    }

    /// Zeroes the line starts (future header slots) up to
    /// [`ZERO_AHEAD_BYTES`] past `out_head`, within the room the peer has
    /// given back. Done after a publish, so a frame's own publish seldom
    /// stores to a line besides its own: on the critical path that zero
    /// store had to reach its line (a miss) before the header store could
    /// follow it.
    fn zero_ahead(&mut self) {
        let (offset, bytes) = (self.out_offset, self.out_bytes);
        let given_back = self.out_tail_seen + (bytes - FRAME_ALIGN_BYTES) as u64;
        let target = (self.out_head + ZERO_AHEAD_BYTES as u64).min(given_back);
        while self.out_zeroed_to < target {
            self.slot(offset, bytes, self.out_zeroed_to)
                .store(0, Ordering::Relaxed);
            self.out_zeroed_to += FRAME_ALIGN_BYTES as u64;
        }
    }

    /// Carries out `placement`'s close and wrap: afterwards the open frame
    /// (maybe empty) starts at `out_head`.
    fn prepare(&mut self, placement: Placement) {
        if placement.close_open {
            self.publish_staged();
        }
        if placement.wrap {
            let to_end = self.out_bytes - ring_offset(self.out_head, self.out_bytes);
            self.publish_header(WRAP_LENGTH, to_end);
        }
    }

    /// Copies `bytes` into the open frame after what it holds, without
    /// publishing. The caller made room with [`ShmChannel::prepare`].
    fn copy_out(&mut self, bytes: &[u8]) {
        let n = bytes.len();
        let at = ring_offset(self.out_head, self.out_bytes) + FRAME_HEADER_BYTES + self.out_staged;
        assert!(
            at + n <= self.out_bytes,
            "a frame never crosses the ring's end"
        );
        // SAFETY: the range lies inside the outgoing ring of the live
        // mapping (asserted); the bytes after the open frame's header up
        // to the peer's tail are ours to write until the header store that
        // publishes them.
        unsafe {
            let ring = self.region.base.as_ptr().add(self.out_offset);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), ring.add(at), n);
        }
        self.out_staged += n;
    }

    /// Copies as much of `bytes` as fits into the outgoing ring, in as few
    /// frames as the ring's end allows, and publishes them (after anything
    /// staged); returns how much of `bytes` went in.
    pub fn write(&mut self, bytes: &[u8]) -> Result<usize, ShmError> {
        let mut done = 0;
        while done < bytes.len() {
            let Some(placement) = self.place_for(bytes.len() - done)? else {
                break;
            };
            self.prepare(placement);
            let n = placement.room.min(bytes.len() - done);
            self.copy_out(&bytes[done..done + n]);
            done += n;
            if done < bytes.len() {
                self.publish_staged();
            }
        }
        self.publish_staged();
        Ok(done)
    }

    /// Copies `parts` one after another into the outgoing ring, if they
    /// all fit, without publishing them; whether they did (nothing is
    /// written if not). A server builds replies straight in the ring this
    /// way, each value copied once, and publishes a turn's worth as one
    /// frame with [`ShmChannel::publish_staged`] (or the next
    /// [`ShmChannel::write`]). Parts that do not fit the open frame before
    /// the ring's end publish it and start a new one.
    pub fn stage_all(&mut self, parts: &[&[u8]]) -> Result<bool, ShmError> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if total == 0 {
            return Ok(true);
        }
        match self.place_for(total)? {
            Some(placement) if placement.room >= total => {
                self.prepare(placement);
                for part in parts {
                    self.copy_out(part);
                }
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Publishes what [`ShmChannel::stage_all`] wrote; how many payload
    /// bytes.
    pub fn publish_staged(&mut self) -> usize {
        let n = self.out_staged;
        if n > 0 {
            self.publish_header(n as u32, frame_bytes(n));
            self.out_staged = 0;
        }
        n
    }

    /// Whether everything published has been taken by the peer and
    /// nothing is staged.
    pub fn out_drained(&self) -> Result<bool, ShmError> {
        let tail = self.region.u64_at(self.out_tail_at).load(Ordering::Acquire);
        Ok(self.free_given(tail)? == self.out_bytes && self.out_staged == 0)
    }

    /// The header of the frame at stream position `pos` of the incoming
    /// ring: None if none is published there yet, else its payload length
    /// ([`WRAP_LENGTH`] for a wrap marker), checked against the ring.
    fn frame_at(&self, pos: u64) -> Result<Option<u32>, ShmError> {
        let header = self
            .slot(self.in_offset, self.in_bytes, pos)
            .load(Ordering::Acquire);
        if header == 0 {
            return Ok(None);
        }
        let (stamp, length) = (header >> 32, header as u32);
        let to_end = self.in_bytes - ring_offset(pos, self.in_bytes);
        if stamp != lap_stamp(pos, self.in_bytes)
            || length == 0
            || (length != WRAP_LENGTH && FRAME_HEADER_BYTES + length as usize > to_end)
        {
            return Err(ShmError::Corrupt(format!(
                "at byte {pos} of the stream the peer's frame header is {header:#x}: not a frame of lap {} that fits before the ring's end",
                lap_stamp(pos, self.in_bytes)
            )));
        }
        Ok(Some(length))
    }

    /// Payload bytes of the next frame not yet read (past a wrap marker);
    /// 0 if none is published.
    pub fn in_pending(&self) -> Result<usize, ShmError> {
        match self.frame_at(self.in_tail)? {
            None => Ok(0),
            Some(WRAP_LENGTH) => {
                let to_end = self.in_bytes - ring_offset(self.in_tail, self.in_bytes);
                match self.frame_at(self.in_tail + to_end as u64)? {
                    Some(WRAP_LENGTH) => {
                        Err(ShmError::Corrupt("the peer wrapped twice in a row".into()))
                    }
                    other => Ok(other.map_or(0, |n| n as usize)),
                }
            }
            Some(n) => Ok(n as usize - self.in_taken),
        }
    }

    /// Appends up to `max` payload bytes of the published frames of the
    /// incoming ring to `into`, and gives the room of every frame read
    /// whole back to the peer; returns how many.
    pub fn read(&mut self, into: &mut Vec<u8>, max: usize) -> Result<usize, ShmError> {
        let tail_before = self.in_tail;
        let mut done = 0;
        while done < max {
            let Some(length) = self.frame_at(self.in_tail)? else {
                break;
            };
            let at = ring_offset(self.in_tail, self.in_bytes);
            if length == WRAP_LENGTH {
                if self.in_taken > 0 {
                    return Err(ShmError::Corrupt("a wrap marker inside a frame".into()));
                }
                self.in_tail += (self.in_bytes - at) as u64;
                continue;
            }
            let length = length as usize;
            if self.in_taken >= length {
                return Err(ShmError::Corrupt(format!(
                    "the frame at byte {} shrank under its reader",
                    self.in_tail
                )));
            }
            let n = (length - self.in_taken).min(max - done);
            let from = at + FRAME_HEADER_BYTES + self.in_taken;
            into.reserve(n);
            let len = into.len();
            // SAFETY: the source lies inside the incoming ring of the live
            // mapping (`frame_at` checked the frame fits before the ring's
            // end); the destination is `into`'s reserved spare capacity,
            // whose length is set only after the copy. A peer that writes
            // these bytes while we copy breaks the protocol and only gets
            // garbage parsed as its own frame.
            unsafe {
                let ring = self.region.base.as_ptr().add(self.in_offset);
                std::ptr::copy_nonoverlapping(ring.add(from), into.as_mut_ptr().add(len), n);
                into.set_len(len + n);
            }
            done += n;
            self.in_taken += n;
            if self.in_taken == length {
                self.in_tail += frame_bytes(length) as u64;
                self.in_taken = 0;
            }
        }
        if self.in_tail != tail_before {
            self.region
                .u64_at(self.in_tail_at)
                .store(self.in_tail, Ordering::Release);
        }
        Ok(done)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::*;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

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
        let mut partial_rounds = 0;
        for round in 0..50u32 {
            let msg: Vec<u8> = (0..3000).map(|i| (i as u32 + round) as u8).collect();
            assert_eq!(client.write(&msg).unwrap(), 3000);
            let more = client.write(&msg).unwrap();
            assert!(more < 3000, "only what fits: {more}");
            partial_rounds += usize::from(more > 0);
            assert_eq!(client.write(&msg).unwrap(), 0, "a full ring takes nothing");
            got.clear();
            assert_eq!(server.read(&mut got, usize::MAX).unwrap(), 3000 + more);
            assert_eq!(&got[..3000], &msg[..]);
            assert_eq!(&got[3000..], &msg[..more]);
            assert_eq!(server.write(&msg).unwrap(), 3000);
            got.clear();
            assert_eq!(client.read(&mut got, 1000).unwrap(), 1000);
            assert_eq!(client.read(&mut got, 5000).unwrap(), 2000);
            assert_eq!(got, msg);
            assert!(server.out_drained().unwrap());
        }
        assert!(partial_rounds > 10, "{partial_rounds} rounds wrote a part");
    }

    #[test]
    fn staged_replies_go_in_whole_or_not_at_all_and_show_once_published() {
        let (mut server, mut client) = pair(4096, 4096);
        let mut got = Vec::new();
        for round in 0..40usize {
            // 1000 + round bytes a reply: the frames start at every offset
            // of the ring, and some replies meet its end.
            let value: Vec<u8> = (0..1000 + round).map(|i| (i + round) as u8).collect();
            let header = format!("${}\r\n", value.len());
            let parts: [&[u8]; 3] = [header.as_bytes(), &value, b"\r\n"];
            let reply_bytes = header.len() + value.len() + 2;
            let mut fit = 0;
            while server.stage_all(&parts).unwrap() {
                fit += 1;
                if round == 0 && fit < 3 {
                    got.clear();
                    assert_eq!(
                        client.read(&mut got, usize::MAX).unwrap(),
                        0,
                        "staged in one frame, not published"
                    );
                }
            }
            assert!(
                (1..=4096 / reply_bytes).contains(&fit),
                "{fit} replies of {reply_bytes} bytes"
            );
            got.clear();
            client.read(&mut got, usize::MAX).unwrap();
            server.publish_staged();
            client.read(&mut got, usize::MAX).unwrap();
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
    fn old_payload_bytes_that_look_like_headers_are_never_read_as_frames() {
        let (mut server, mut client) = pair(4096, 4096);
        // Every 8-byte word of every payload is a well-formed header of a
        // later lap: a reader that polled a slot nobody zeroed would take
        // one for a frame.
        let mut sent = Vec::new();
        let mut got = Vec::new();
        for i in 0..2000usize {
            let lap = (sent.len() / 4096) as u64 + 2;
            let word = (lap << 32 | 16).to_ne_bytes();
            let len = 1 + (i * 37) % 700;
            let msg: Vec<u8> = (0..len).map(|j| word[j % 8]).collect();
            let n = client.write(&msg).unwrap();
            sent.extend_from_slice(&msg[..n]);
            server.read(&mut got, 1 + i % 900).unwrap();
        }
        while server.read(&mut got, usize::MAX).unwrap() > 0 {}
        assert_eq!(got, sent);
    }

    #[test]
    fn frames_cross_between_threads_in_order() {
        let (mut server, mut client) = pair(4096, 4096);
        let total = 3_000_000usize;
        let producer = std::thread::spawn(move || {
            let mut sent = 0usize;
            let mut i = 0usize;
            while sent < total {
                let len = (1 + (i * 7919) % 3000).min(total - sent);
                let msg: Vec<u8> = (sent..sent + len).map(|b| (b % 251) as u8).collect();
                let mut at = 0;
                while at < len {
                    at += client.write(&msg[at..]).unwrap();
                    std::hint::spin_loop();
                }
                sent += len;
                i += 1;
            }
        });
        let mut got = Vec::with_capacity(total);
        let mut progress = std::time::Instant::now();
        while got.len() < total {
            let most = 1 + got.len() % 5000;
            if server.read(&mut got, most).unwrap() > 0 {
                progress = std::time::Instant::now();
            } else {
                assert!(
                    progress.elapsed() < Duration::from_secs(10),
                    "stuck after {} bytes: a published frame was lost",
                    got.len()
                );
                std::hint::spin_loop();
            }
        }
        producer.join().unwrap();
        assert!(got.iter().enumerate().all(|(b, &v)| v == (b % 251) as u8));
    }

    #[test]
    fn a_lying_peer_is_an_error_not_a_fault() {
        let (mut server, client) = pair(4096, 4096);
        // A frame of the right lap that claims more bytes than the ring has.
        client
            .slot(client.out_offset, client.out_bytes, 0)
            .store(1 << 32 | 1 << 30, Ordering::Release);
        assert!(matches!(server.in_pending(), Err(ShmError::Corrupt(_))));
        assert!(matches!(
            server.read(&mut Vec::new(), 10),
            Err(ShmError::Corrupt(_))
        ));
        // A header of the wrong lap.
        client
            .slot(client.out_offset, client.out_bytes, 0)
            .store(7 << 32 | 10, Ordering::Release);
        assert!(matches!(server.in_pending(), Err(ShmError::Corrupt(_))));
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
