//! Prototype for choosing the server's I/O layer: a thread-per-core
//! PING/ECHO server on the io-uring crate directly. Per thread: one ring
//! (single issuer, deferred task work), a SO_REUSEPORT listener with a
//! multishot accept, a multishot recv per connection into a provided
//! buffer ring (the kernel picks the buffer; no buffer per idle
//! connection), one send in flight per connection with the replies of
//! everything received meanwhile gathered into the next, and one
//! `io_uring_enter` per loop turn. Measured against examples/net_compio.rs
//! and redis-server by scripts/bench-net.
//!
//! `cargo run --release --example net_uring -- THREADS PORT`

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use sluice_server::resp::{Limits, Protocol, Reply, RequestReader};
use std::net::SocketAddr;
use std::os::fd::{IntoRawFd, RawFd};
use std::sync::atomic::{AtomicU16, Ordering};

const ACCEPT: u64 = 0;
const RECV: u64 = 1 << 62;
const SEND: u64 = 2 << 62;
const KIND: u64 = 3 << 62;
/// The provided buffer group of the recvs.
const GROUP: u16 = 7;
/// Buffers in the ring (a power of two) and the size of each.
const BUFFERS: u16 = 256;
const BUFFER_BYTES: usize = 16 << 10;

struct Conn {
    fd: RawFd,
    reader: RequestReader,
    /// Replies not yet handed to a send, and the send in flight.
    pending: Vec<u8>,
    sending: Vec<u8>,
    sent: usize,
    send_in_flight: bool,
    recv_armed: bool,
    closing: bool,
}

/// A provided buffer ring: the kernel takes a buffer per received chunk,
/// the loop gives it back once the bytes are framed.
struct BufferRing {
    entries: *mut types::BufRingEntry,
    buffers: Vec<u8>,
    tail: u16,
}

impl BufferRing {
    fn register(ring: &IoUring) -> std::io::Result<BufferRing> {
        let bytes = BUFFERS as usize * std::mem::size_of::<types::BufRingEntry>();
        // SAFETY: a fresh anonymous private mapping; checked below.
        let entries = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if entries == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let mut r = BufferRing {
            entries: entries.cast(),
            buffers: vec![0u8; BUFFERS as usize * BUFFER_BYTES],
            tail: 0,
        };
        for id in 0..BUFFERS {
            r.give_back(id);
        }
        // SAFETY: the entries are a page-aligned mapping of BUFFERS entries
        // that lives (never unmapped) as long as the ring uses it.
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(r.entries as u64, BUFFERS, GROUP, 0)?
        };
        Ok(r)
    }

    fn give_back(&mut self, id: u16) {
        let slot = (self.tail & (BUFFERS - 1)) as usize;
        // SAFETY: slot < BUFFERS entries of the mapping; the buffer `id`
        // lies inside `buffers`, which lives as long as the ring.
        unsafe {
            let e = &mut *self.entries.add(slot);
            e.set_addr(self.buffers.as_ptr().add(id as usize * BUFFER_BYTES) as u64);
            e.set_len(BUFFER_BYTES as u32);
            e.set_bid(id);
        }
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: the tail field of the ring's first entry, which the
        // kernel reads; the release store publishes the entry written above.
        unsafe {
            let tail = types::BufRingEntry::tail(self.entries) as *const AtomicU16;
            (*tail).store(self.tail, Ordering::Release);
        }
    }

    fn bytes(&self, id: u16, len: usize) -> &[u8] {
        &self.buffers[id as usize * BUFFER_BYTES..][..len]
    }
}

fn listener(addr: SocketAddr) -> std::io::Result<RawFd> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.set_reuse_port(true)?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    let l: std::net::TcpListener = s.into();
    Ok(l.into_raw_fd())
}

fn push(ring: &mut IoUring, entry: &squeue::Entry) -> std::io::Result<()> {
    loop {
        // SAFETY: every buffer an entry names (send data, the buffer ring)
        // stays alive and unmoved until its completion is reaped.
        if unsafe { ring.submission().push(entry) }.is_ok() {
            return Ok(());
        }
        ring.submit()?;
    }
}

fn recv(fd: RawFd, id: usize) -> squeue::Entry {
    opcode::RecvMulti::new(types::Fd(fd), GROUP)
        .build()
        .user_data(RECV | id as u64)
}

/// Frames what arrived and queues the replies.
fn answer(c: &mut Conn) {
    loop {
        match c.reader.next(false) {
            Ok(Some(args)) => {
                let reply = match &args[..] {
                    [_, x] => Reply::Bulk(x.clone()),
                    _ => Reply::Simple("PONG".into()),
                };
                reply.encode_into(Protocol::Resp2, &mut c.pending);
            }
            Ok(None) => return,
            Err(e) => {
                c.pending.extend(e.reply());
                c.closing = true;
                return;
            }
        }
    }
}

fn run(listen_fd: RawFd) -> std::io::Result<()> {
    let mut ring = IoUring::builder()
        .setup_single_issuer()
        .setup_coop_taskrun()
        .setup_defer_taskrun()
        .build(4096)?;
    let mut buffers = BufferRing::register(&ring)?;
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let accept = opcode::AcceptMulti::new(types::Fd(listen_fd))
        .build()
        .user_data(ACCEPT);
    push(&mut ring, &accept)?;
    let mut done = Vec::new();
    loop {
        ring.submit_and_wait(1)?;
        done.clear();
        done.extend(
            ring.completion()
                .map(|c| (c.user_data(), c.result(), c.flags())),
        );
        for &(user_data, result, flags) in &done {
            let id = (user_data & !KIND) as usize;
            match user_data & KIND {
                ACCEPT => {
                    if result >= 0 {
                        let id = match conns.iter().position(Option::is_none) {
                            Some(free) => free,
                            None => {
                                conns.push(None);
                                conns.len() - 1
                            }
                        };
                        conns[id] = Some(Conn {
                            fd: result,
                            reader: RequestReader::new(Limits::default()),
                            pending: Vec::new(),
                            sending: Vec::new(),
                            sent: 0,
                            send_in_flight: false,
                            recv_armed: true,
                            closing: false,
                        });
                        push(&mut ring, &recv(result, id))?;
                    }
                    if !cqueue::more(flags) {
                        push(&mut ring, &accept)?;
                    }
                }
                RECV => {
                    let Some(c) = conns.get_mut(id).and_then(Option::as_mut) else {
                        continue;
                    };
                    c.recv_armed = cqueue::more(flags);
                    if result > 0 {
                        if let Some(buffer) = cqueue::buffer_select(flags) {
                            c.reader.feed(buffers.bytes(buffer, result as usize));
                            buffers.give_back(buffer);
                        }
                        if !c.closing {
                            answer(c);
                        }
                    } else if result == -libc::ENOBUFS && !c.closing {
                        // Every buffer was taken: the loop gives them back
                        // this turn, so ask again.
                    } else {
                        c.closing = true;
                    }
                    if !c.recv_armed && !c.closing {
                        push(&mut ring, &recv(c.fd, id))?;
                        c.recv_armed = true;
                    }
                }
                SEND => {
                    let Some(c) = conns.get_mut(id).and_then(Option::as_mut) else {
                        continue;
                    };
                    c.send_in_flight = false;
                    if result < 0 {
                        c.closing = true;
                        c.sending.clear();
                        c.pending.clear();
                        c.sent = 0;
                    } else {
                        c.sent += result as usize;
                    }
                }
                _ => {}
            }
        }
        for (id, slot) in conns.iter_mut().enumerate() {
            let Some(c) = slot.as_mut() else { continue };
            if c.send_in_flight {
                continue;
            }
            if c.sent == c.sending.len() {
                c.sending.clear();
                c.sent = 0;
                std::mem::swap(&mut c.sending, &mut c.pending);
            }
            if c.sent < c.sending.len() {
                let rest = &c.sending[c.sent..];
                let send = opcode::Send::new(types::Fd(c.fd), rest.as_ptr(), rest.len() as u32)
                    .build()
                    .user_data(SEND | id as u64);
                push(&mut ring, &send)?;
                c.send_in_flight = true;
            } else if c.closing && c.recv_armed {
                // Ends the armed recv (it completes with 0); the slot is
                // freed once it has, so a late completion cannot reach
                // another connection in the same slot.
                // SAFETY: shutdown on our own socket.
                unsafe { libc::shutdown(c.fd, libc::SHUT_RDWR) };
            } else if c.closing {
                // SAFETY: our own socket; nothing is in flight on it.
                unsafe { libc::close(c.fd) };
                *slot = None;
            }
        }
    }
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1);
    let port: u16 = args.next().and_then(|s| s.parse().ok()).unwrap_or(7002);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut handles = Vec::new();
    for _ in 0..threads {
        let fd = listener(addr)?;
        handles.push(std::thread::spawn(move || run(fd)));
    }
    for h in handles {
        h.join().expect("a server thread panicked")?;
    }
    Ok(())
}
