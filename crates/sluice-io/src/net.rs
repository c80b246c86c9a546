//! The network ring: one io_uring per server thread for its sockets, with
//! everything unsafe about it kept here.
//!
//! - a listener (`SO_REUSEPORT`, so every thread binds its own and the
//!   kernel spreads connections) with a multishot accept (Linux 5.19);
//! - a multishot recv per connection into a provided buffer ring (Linux
//!   6.0): the kernel picks a buffer per received chunk, so an idle
//!   connection holds no buffer; the bytes are lent to the caller during
//!   [`NetRing::reap`] and the buffer goes back right after;
//! - one send in flight per connection, its bytes owned by the ring until
//!   the completion hands them back;
//! - a [`Waker`] (an eventfd read kept armed) so other threads can end a
//!   wait, and waits with a timeout.
//!
//! The ring is single-issuer with deferred task work: only the thread that
//! made it may use it (`NetRing` is `!Send`).

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::collections::HashMap;
use std::io;
use std::marker::PhantomData;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

/// A connection's number, chosen by the caller; completions carry it back.
pub type ConnId = u32;

const KIND_SHIFT: u32 = 60;
const ACCEPT: u64 = 1 << KIND_SHIFT;
const RECV: u64 = 2 << KIND_SHIFT;
const SEND: u64 = 3 << KIND_SHIFT;
const WAKE: u64 = 4 << KIND_SHIFT;
const CANCEL: u64 = 5 << KIND_SHIFT;
const KIND_MASK: u64 = 0xf << KIND_SHIFT;
/// Most listeners one ring accepts on.
pub const MAX_LISTENERS: usize = 8;
/// The provided-buffer group id of the recvs.
const BUFFER_GROUP: u16 = 1;

/// Sizes of a [`NetRing`].
#[derive(Debug, Clone, Copy)]
pub struct NetRingConfig {
    /// Submission queue entries (completion queue: twice that).
    pub queue_depth: u32,
    /// Receive buffers shared by every connection of the ring (a power of
    /// two, at most 32768).
    pub recv_buffers: u16,
    /// Bytes of each receive buffer.
    pub recv_buffer_bytes: u32,
}

impl Default for NetRingConfig {
    fn default() -> Self {
        NetRingConfig {
            queue_depth: 4096,
            recv_buffers: 512,
            recv_buffer_bytes: 16 << 10,
        }
    }
}

/// What a completion reported, in the order the kernel finished them.
#[derive(Debug)]
pub enum NetEvent<'a> {
    /// A new connection on listener `listener` (the index
    /// [`NetRing::accept_on`] returned). The accept stays armed.
    Accepted {
        /// Which listener.
        listener: usize,
        /// The connection's socket (TCP or Unix, as the listener is).
        socket: OwnedFd,
    },
    /// An accept failed (e.g. out of file descriptors: `EMFILE`); it is
    /// re-armed unless the listener is gone.
    AcceptFailed(io::Error),
    /// Bytes from `conn`, lent until the callback returns.
    Received {
        /// The connection.
        conn: ConnId,
        /// What arrived.
        bytes: &'a [u8],
    },
    /// The connection's recv ended: the peer closed (`Ok`) or it failed.
    /// No recv is armed on it any more.
    RecvEnded {
        /// The connection.
        conn: ConnId,
        /// Why.
        result: io::Result<()>,
    },
    /// The kernel ended the connection's multishot recv without an error
    /// (every buffer was lent out, or its own limit): arm it again with
    /// [`NetRing::recv`] to read on.
    RecvPaused {
        /// The connection.
        conn: ConnId,
    },
    /// A send finished: `buf` is handed back with how far it got.
    Sent {
        /// The connection.
        conn: ConnId,
        /// The buffer given to [`NetRing::send`].
        buf: Vec<u8>,
        /// Bytes of `buf` sent so far (the offset given plus this send's).
        sent_to: usize,
        /// The send's error, if it failed.
        error: Option<io::Error>,
    },
    /// The ring's [`Waker`] was woken.
    Woken,
}

/// Wakes a thread waiting in [`NetRing::wait`], from any thread.
#[derive(Debug)]
pub struct Waker {
    fd: OwnedFd,
}

impl Waker {
    fn new() -> io::Result<Waker> {
        // SAFETY: eventfd takes no pointers; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Waker { fd })
    }

    /// A duplicate of the eventfd behind this waker, for another process
    /// to wake the ring by writing 8 bytes to it (shared-memory clients).
    pub fn duplicate_fd(&self) -> io::Result<OwnedFd> {
        self.fd.try_clone()
    }

    /// Ends the ring's current or next wait.
    pub fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live local to our own eventfd. A
        // full counter (EAGAIN) already means "woken".
        unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), 8) };
    }
}

/// Binds a TCP listener with `SO_REUSEPORT` and `SO_REUSEADDR`, so each
/// server thread can bind its own to the same address.
pub fn bind_reuseport(addr: SocketAddr, backlog: i32) -> io::Result<TcpListener> {
    bind_with(addr, backlog, &[libc::SO_REUSEADDR, libc::SO_REUSEPORT])
}

/// Binds a TCP listener (`SO_REUSEADDR` only: a second server on the same
/// address fails with `AddrInUse`) with a listen backlog of `backlog`
/// (the standard library's is 128: a burst of a thousand connections
/// would see SYNs dropped and retried a second later).
pub fn bind_listener(addr: SocketAddr, backlog: i32) -> io::Result<TcpListener> {
    bind_with(addr, backlog, &[libc::SO_REUSEADDR])
}

fn bind_with(addr: SocketAddr, backlog: i32, options: &[libc::c_int]) -> io::Result<TcpListener> {
    let domain = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: plain socket(2); the result is checked and owned at once.
    let raw = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    for &option in options {
        let on: libc::c_int = 1;
        // SAFETY: passes a live c_int and its size.
        let r = unsafe {
            libc::setsockopt(
                raw,
                libc::SOL_SOCKET,
                option,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    let (storage, len) = sockaddr(addr);
    // SAFETY: `storage` holds a valid sockaddr of `len` bytes.
    if unsafe { libc::bind(raw, (&storage as *const libc::sockaddr_storage).cast(), len) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: listen(2) on our own socket.
    if unsafe { libc::listen(raw, backlog) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(TcpListener::from(fd))
}

fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all zeroes is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// Reads what `socket` holds now without waiting (`MSG_DONTWAIT`): the
/// bytes read, or an error of kind `WouldBlock` when none are there. The
/// socket's own blocking mode is left alone — it is shared with every
/// descriptor of the socket (`try_clone`), so a writer on one keeps
/// blocking while a reader polls on another.
pub fn recv_nowait(socket: &impl AsRawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the pointer and length describe `buf`, a live exclusive
    // borrow the kernel writes at most `buf.len()` bytes into; the
    // descriptor is borrowed from a live socket.
    let n = unsafe {
        libc::recv(
            socket.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Sends as much of `parts` (in order, one `sendmsg`) as `socket` takes
/// now without waiting (`MSG_DONTWAIT`, and `MSG_NOSIGNAL`: a peer that is
/// gone is an error, not a signal): the bytes sent, or an error of kind
/// `WouldBlock` when it takes none. At most [`MAX_SEND_PARTS`] parts.
pub fn send_nowait(socket: &impl AsRawFd, parts: &[&[u8]]) -> io::Result<usize> {
    assert!(
        parts.len() <= MAX_SEND_PARTS,
        "too many parts to send at once"
    );
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; MAX_SEND_PARTS];
    for (v, part) in iov.iter_mut().zip(parts) {
        // The kernel only reads through these (sendmsg).
        v.iov_base = part.as_ptr() as *mut libc::c_void;
        v.iov_len = part.len();
    }
    // SAFETY: msghdr is plain data; all zeroes is a valid (empty) value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = parts.len() as _;
    // SAFETY: `msg` names `parts.len()` iovecs, each describing a live
    // borrowed slice the kernel only reads; the descriptor is borrowed
    // from the caller, who keeps it open for the call.
    let n = unsafe {
        libc::sendmsg(
            socket.as_raw_fd(),
            &msg,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Most parts [`send_nowait`] sends in one call.
pub const MAX_SEND_PARTS: usize = 4;

/// Whether `socket` has bytes to read (or has been closed by its peer)
/// right now, without taking them and without waiting.
pub fn readable_now(socket: &impl AsRawFd) -> io::Result<bool> {
    let mut byte = [0u8; 1];
    // SAFETY: the pointer and length describe `byte`, a live exclusive
    // borrow; with MSG_PEEK the kernel copies at most one byte and keeps
    // it queued; the descriptor is borrowed from a live socket.
    let n = unsafe {
        libc::recv(
            socket.as_raw_fd(),
            byte.as_mut_ptr().cast(),
            1,
            libc::MSG_DONTWAIT | libc::MSG_PEEK,
        )
    };
    if n >= 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::WouldBlock => Ok(false),
        io::ErrorKind::Interrupted => Ok(false),
        _ => Err(e),
    }
}

/// Pins the calling thread to one CPU.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes inside it; the call
    // passes its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A provided buffer ring: the kernel takes a buffer per received chunk;
/// [`NetRing::reap`] gives it back once the caller has seen the bytes.
struct BufferRing {
    entries: *mut types::BufRingEntry,
    entries_bytes: usize,
    buffers: Vec<u8>,
    count: u16,
    buffer_bytes: usize,
    tail: u16,
}

impl BufferRing {
    fn register(ring: &IoUring, count: u16, buffer_bytes: u32) -> io::Result<BufferRing> {
        assert!(count.is_power_of_two() && count <= 32768, "recv_buffers");
        let entries_bytes = count as usize * std::mem::size_of::<types::BufRingEntry>();
        // SAFETY: a fresh anonymous private mapping; checked below.
        let entries = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                entries_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if entries == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mut r = BufferRing {
            entries: entries.cast(),
            entries_bytes,
            buffers: vec![0u8; count as usize * buffer_bytes as usize],
            count,
            buffer_bytes: buffer_bytes as usize,
            tail: 0,
        };
        for id in 0..count {
            r.give_back(id);
        }
        // SAFETY: the entries are a page-aligned mapping of `count` entries
        // that stays mapped until this BufferRing drops, after the ring
        // (NetRing's field order) — the kernel stops using it then.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                r.entries as u64,
                count,
                BUFFER_GROUP,
                0,
            )?
        };
        Ok(r)
    }

    fn give_back(&mut self, id: u16) {
        assert!(id < self.count);
        let slot = (self.tail & (self.count - 1)) as usize;
        // SAFETY: slot < count entries of the mapping; the buffer `id` lies
        // inside `buffers`, which lives as long as the ring.
        unsafe {
            let e = &mut *self.entries.add(slot);
            e.set_addr(self.buffers.as_ptr().add(id as usize * self.buffer_bytes) as u64);
            e.set_len(self.buffer_bytes as u32);
            e.set_bid(id);
        }
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: the tail field overlays the ring's first entry, which the
        // kernel reads; the release store publishes the entry written above.
        unsafe {
            let tail = types::BufRingEntry::tail(self.entries) as *const AtomicU16;
            (*tail).store(self.tail, Ordering::Release);
        }
    }

    fn bytes(&self, id: u16, len: usize) -> &[u8] {
        &self.buffers[id as usize * self.buffer_bytes..][..len]
    }
}

impl Drop for BufferRing {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `register`, unmapped once.
        unsafe { libc::munmap(self.entries.cast(), self.entries_bytes) };
    }
}

/// One thread's network ring. See the module docs.
pub struct NetRing {
    // Field order is drop order: the ring (and with it every operation the
    // kernel still holds) goes before the buffers those operations name.
    ring: IoUring,
    buffers: BufferRing,
    /// Send buffers in flight, with the offset each send started at.
    sends: HashMap<ConnId, (Vec<u8>, usize)>,
    waker: std::sync::Arc<Waker>,
    wake_buf: Box<[u8; 8]>,
    wake_armed: bool,
    /// The listeners accepted on, by index; None once stopped.
    listeners: Vec<Option<RawFd>>,
    done: Vec<(u64, i32, u32)>,
    /// Single issuer: the ring stays on the thread that made it.
    _not_send: PhantomData<*const ()>,
}

impl NetRing {
    /// A ring for the calling thread.
    pub fn new(config: NetRingConfig) -> io::Result<NetRing> {
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .setup_defer_taskrun()
            .setup_cqsize(config.queue_depth * 2)
            .build(config.queue_depth)?;
        let buffers = BufferRing::register(&ring, config.recv_buffers, config.recv_buffer_bytes)?;
        let mut r = NetRing {
            ring,
            buffers,
            sends: HashMap::new(),
            waker: std::sync::Arc::new(Waker::new()?),
            wake_buf: Box::new([0; 8]),
            wake_armed: false,
            listeners: Vec::new(),
            done: Vec::new(),
            _not_send: PhantomData,
        };
        r.arm_wake()?;
        Ok(r)
    }

    /// Wakes this ring's waits from any thread.
    pub fn waker(&self) -> std::sync::Arc<Waker> {
        self.waker.clone()
    }

    fn push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: every buffer an entry names — a send's Vec (held in
            // `sends`), the wake buffer (boxed, held), the buffer ring —
            // stays alive and unmoved until its completion is reaped.
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        let read = opcode::Read::new(
            types::Fd(self.waker.fd.as_raw_fd()),
            self.wake_buf.as_mut_ptr(),
            8,
        )
        .build()
        .user_data(WAKE);
        self.push(&read)?;
        self.wake_armed = true;
        Ok(())
    }

    /// Accepts connections on `listener` (kept open by the caller as long
    /// as the ring accepts on it) until [`NetRing::stop_accepting`];
    /// returns the index [`NetEvent::Accepted`] names it by.
    /// Any stream listener works: TCP, or a Unix socket several rings may
    /// accept on at once.
    pub fn accept_on(&mut self, listener: &impl AsRawFd) -> io::Result<usize> {
        assert!(self.listeners.len() < MAX_LISTENERS, "too many listeners");
        let fd = listener.as_raw_fd();
        self.listeners.push(Some(fd));
        let index = self.listeners.len() - 1;
        self.arm_accept(index, fd)?;
        Ok(index)
    }

    fn arm_accept(&mut self, index: usize, fd: RawFd) -> io::Result<()> {
        let accept = opcode::AcceptMulti::new(types::Fd(fd))
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(ACCEPT | index as u64);
        self.push(&accept)
    }

    /// Cancels every armed accept (their completions report `ECANCELED`)
    /// and stops re-arming them; the caller may then close the listeners.
    pub fn stop_accepting(&mut self) {
        for index in 0..self.listeners.len() {
            if self.listeners[index].take().is_some() {
                let cancel = opcode::AsyncCancel::new(ACCEPT | index as u64)
                    .build()
                    .user_data(CANCEL);
                if let Err(e) = self.push(&cancel) {
                    log::warn!("could not cancel an accept: {e}");
                }
            }
        }
    }

    /// Arms a multishot recv on `stream` for `conn`. At most one per
    /// connection; [`NetEvent::RecvEnded`] says when it ended.
    /// Any stream socket works (a Unix socket's recv ending is how a
    /// shared-memory client's hang-up is seen).
    pub fn recv(&mut self, conn: ConnId, stream: &impl AsRawFd) -> io::Result<()> {
        let recv = opcode::RecvMulti::new(types::Fd(stream.as_raw_fd()), BUFFER_GROUP)
            .build()
            .user_data(RECV | conn as u64);
        self.push(&recv)
    }

    /// Whether a send is in flight for `conn`.
    pub fn sending(&self, conn: ConnId) -> bool {
        self.sends.contains_key(&conn)
    }

    /// Sends `buf[offset..]` on `stream`; the buffer comes back in
    /// [`NetEvent::Sent`]. One send per connection at a time.
    pub fn send(
        &mut self,
        conn: ConnId,
        stream: &impl AsRawFd,
        buf: Vec<u8>,
        offset: usize,
    ) -> io::Result<()> {
        assert!(!self.sends.contains_key(&conn), "one send per connection");
        assert!(offset < buf.len(), "nothing to send");
        let rest = &buf[offset..];
        let len = rest.len().min(u32::MAX as usize) as u32;
        let send = opcode::Send::new(types::Fd(stream.as_raw_fd()), rest.as_ptr(), len)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(SEND | conn as u64);
        // The Vec's heap bytes do not move when the Vec does.
        self.sends.insert(conn, (buf, offset));
        let pushed = self.push(&send);
        if pushed.is_err() {
            // Never queued: no completion will hand the buffer back, and
            // the connection is not sending.
            self.sends.remove(&conn);
        }
        pushed
    }

    /// Whether a non-blocking [`NetRing::wait`] has anything to do: entries
    /// queued, or completions the kernel holds until this thread enters
    /// (deferred task work, flagged in the shared ring with
    /// `IORING_SETUP_TASKRUN_FLAG`, Linux 5.19). A thread busy with work
    /// that needs no socket skips the system call when this is false.
    pub fn needs_enter(&mut self) -> bool {
        let mut sq = self.ring.submission();
        sq.sync();
        !sq.is_empty() || sq.taskrun()
    }

    /// Submits what was queued and waits up to `timeout` for at least one
    /// completion (`None`: no wait, just submit).
    pub fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let result = match timeout {
            None => self.ring.submit(),
            Some(t) => {
                let ts = types::Timespec::new()
                    .sec(t.as_secs())
                    .nsec(t.subsec_nanos());
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
        };
        match result {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Hands every completion to `on_event`; returns how many there were.
    pub fn reap(&mut self, mut on_event: impl FnMut(NetEvent<'_>)) -> io::Result<usize> {
        let mut done = std::mem::take(&mut self.done);
        done.clear();
        done.extend(
            self.ring
                .completion()
                .map(|c| (c.user_data(), c.result(), c.flags())),
        );
        for &(user_data, result, flags) in &done {
            self.complete(user_data, result, flags, &mut on_event)?;
        }
        let n = done.len();
        self.done = done;
        Ok(n)
    }

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: a send completion for a send in flight"
    )]
    fn complete(
        &mut self,
        user_data: u64,
        result: i32,
        flags: u32,
        on_event: &mut impl FnMut(NetEvent<'_>),
    ) -> io::Result<()> {
        let conn = (user_data & !KIND_MASK) as ConnId;
        match user_data & KIND_MASK {
            ACCEPT => {
                let index = conn as usize;
                let live = self.listeners.get(index).copied().flatten();
                if result >= 0 {
                    // SAFETY: the kernel handed us a fresh connected socket.
                    let socket = unsafe { OwnedFd::from_raw_fd(result) };
                    on_event(NetEvent::Accepted {
                        listener: index,
                        socket,
                    });
                } else if !(result == -libc::ECANCELED && live.is_none()) {
                    on_event(NetEvent::AcceptFailed(io::Error::from_raw_os_error(
                        -result,
                    )));
                }
                if !cqueue::more(flags) {
                    if let Some(fd) = live {
                        self.arm_accept(index, fd)?;
                    }
                }
            }
            RECV => {
                if result > 0 {
                    if let Some(id) = cqueue::buffer_select(flags) {
                        on_event(NetEvent::Received {
                            conn,
                            bytes: self.buffers.bytes(id, result as usize),
                        });
                        self.buffers.give_back(id);
                    }
                } else if result == -libc::ENOBUFS {
                    // Every buffer was lent out this turn; they are back
                    // now, so the recv is simply asked for again below.
                } else if result == 0 {
                    on_event(NetEvent::RecvEnded {
                        conn,
                        result: Ok(()),
                    });
                    return Ok(());
                } else {
                    on_event(NetEvent::RecvEnded {
                        conn,
                        result: Err(io::Error::from_raw_os_error(-result)),
                    });
                    return Ok(());
                }
                if !cqueue::more(flags) {
                    on_event(NetEvent::RecvPaused { conn });
                }
            }
            SEND => {
                let (buf, offset) = self
                    .sends
                    .remove(&conn)
                    .expect("a send completion for a send in flight");
                let (sent_to, error) = if result >= 0 {
                    (offset + result as usize, None)
                } else {
                    (offset, Some(io::Error::from_raw_os_error(-result)))
                };
                on_event(NetEvent::Sent {
                    conn,
                    buf,
                    sent_to,
                    error,
                });
            }
            WAKE => {
                self.wake_armed = false;
                on_event(NetEvent::Woken);
                self.arm_wake()?;
            }
            CANCEL => {}
            _ => unreachable!("unknown completion kind {user_data:#x}"),
        }
        Ok(())
    }
}

/// Raises this process's open-file limit (soft, up to the hard limit) to
/// at least `wanted`; returns the limit now in force.
pub fn raise_fd_limit(wanted: u64) -> io::Result<u64> {
    // SAFETY: rlimit is plain data, filled by getrlimit from a live pointer.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: passes a live rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } < 0 {
        return Err(io::Error::last_os_error());
    }
    if limit.rlim_cur >= wanted {
        return Ok(limit.rlim_cur);
    }
    limit.rlim_cur = wanted.min(limit.rlim_max);
    // SAFETY: passes a live rlimit to read.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(limit.rlim_cur)
}
