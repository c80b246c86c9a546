//! Readiness of many sockets on one thread (epoll), for loops that serve
//! several connections without a thread each and send from I/O buffers
//! with `writev`: the storage node's connection workers. Level-triggered;
//! a [`Wakeup`] (an eventfd) lets other threads end a wait.
//!
//! Every unsafe call of the module is here, each with its reason.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// What a descriptor is watched for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interest {
    /// Bytes to read (or the peer's hang-up).
    pub read: bool,
    /// Room to write.
    pub write: bool,
}

impl Interest {
    /// Bytes to read only.
    pub const READ: Interest = Interest {
        read: true,
        write: false,
    };
    /// Bytes to read and room to write.
    pub const READ_WRITE: Interest = Interest {
        read: true,
        write: true,
    };

    fn events(self) -> u32 {
        let mut e = (libc::EPOLLRDHUP) as u32;
        if self.read {
            e |= libc::EPOLLIN as u32;
        }
        if self.write {
            e |= libc::EPOLLOUT as u32;
        }
        e
    }
}

/// An epoll instance and room for the events of one wait.
pub struct Poller {
    epfd: OwnedFd,
    events: Vec<libc::epoll_event>,
}

impl std::fmt::Debug for Poller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Poller(fd {})", self.epfd.as_raw_fd())
    }
}

impl Poller {
    /// A poller that reports at most `max_events` descriptors per wait.
    pub fn new(max_events: usize) -> io::Result<Poller> {
        assert!(max_events > 0, "room for at least one event");
        // SAFETY: epoll_create1 takes no pointers; the result is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Poller {
            // SAFETY: `fd` is a fresh descriptor nothing else owns.
            epfd: unsafe { OwnedFd::from_raw_fd(fd) },
            events: vec![libc::epoll_event { events: 0, u64: 0 }; max_events],
        })
    }

    fn control(&self, op: i32, fd: RawFd, token: u64, interest: Interest) -> io::Result<()> {
        let mut event = libc::epoll_event {
            events: interest.events(),
            u64: token,
        };
        // SAFETY: `event` is a live local the kernel reads during the call;
        // both descriptors are the caller's live ones.
        let r = unsafe { libc::epoll_ctl(self.epfd.as_raw_fd(), op, fd, &mut event) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Watches `fd` for `interest`; its events carry `token`. The caller
    /// removes it (or closes it) when done.
    pub fn add(&self, fd: &impl AsRawFd, token: u64, interest: Interest) -> io::Result<()> {
        self.control(libc::EPOLL_CTL_ADD, fd.as_raw_fd(), token, interest)
    }

    /// Changes what `fd` is watched for.
    pub fn modify(&self, fd: &impl AsRawFd, token: u64, interest: Interest) -> io::Result<()> {
        self.control(libc::EPOLL_CTL_MOD, fd.as_raw_fd(), token, interest)
    }

    /// Stops watching `fd`.
    pub fn remove(&self, fd: &impl AsRawFd) -> io::Result<()> {
        self.control(libc::EPOLL_CTL_DEL, fd.as_raw_fd(), 0, Interest::READ)
    }

    /// Waits up to `timeout` (zero: only looks) for watched descriptors to
    /// be ready, and adds their tokens to `ready`. A signal ends the wait
    /// early with nothing ready.
    pub fn wait(&mut self, timeout: Duration, ready: &mut Vec<u64>) -> io::Result<()> {
        // Rounded up: a wait of 100 µs is a wait of 1 ms, not a poll.
        let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: the kernel writes at most `events.len()` entries into the
        // live, exclusively borrowed `events`.
        let n = unsafe {
            libc::epoll_wait(
                self.epfd.as_raw_fd(),
                self.events.as_mut_ptr(),
                self.events.len() as i32,
                ms,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(())
            } else {
                Err(e)
            };
        }
        ready.extend(self.events[..n as usize].iter().map(|e| e.u64));
        Ok(())
    }
}

/// Ends a [`Poller`]'s wait from another thread: an eventfd the poller
/// watches (add it with [`Wakeup::fd`]).
#[derive(Debug)]
pub struct Wakeup {
    fd: OwnedFd,
}

impl Wakeup {
    /// A new wake-up, not yet signalled.
    pub fn new() -> io::Result<Wakeup> {
        // SAFETY: eventfd takes no pointers; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Wakeup {
            // SAFETY: `fd` is a fresh descriptor nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// The descriptor to watch.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Makes the descriptor readable (and the poller's wait end).
    pub fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live local to our own eventfd; a
        // full counter (EAGAIN) already means "woken".
        unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), 8) };
    }

    /// Takes the signal back (after a wait it ended).
    pub fn clear(&self) {
        let mut count = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live local from our own
        // non-blocking eventfd; EAGAIN means nothing to clear.
        unsafe { libc::read(self.fd.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn reports_readable_sockets_and_wakeups() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let mut poller = Poller::new(8).unwrap();
        let wakeup = Wakeup::new().unwrap();
        poller.add(&server, 7, Interest::READ).unwrap();
        poller.add(wakeup.fd(), 9, Interest::READ).unwrap();
        let mut ready = Vec::new();
        poller.wait(Duration::ZERO, &mut ready).unwrap();
        assert!(ready.is_empty(), "{ready:?}");
        client.write_all(b"x").unwrap();
        poller.wait(Duration::from_secs(5), &mut ready).unwrap();
        assert_eq!(ready, [7]);
        ready.clear();
        wakeup.wake();
        poller.remove(&server).unwrap();
        poller.wait(Duration::from_secs(5), &mut ready).unwrap();
        assert_eq!(ready, [9]);
        wakeup.clear();
        ready.clear();
        poller.wait(Duration::ZERO, &mut ready).unwrap();
        assert!(ready.is_empty(), "cleared: {ready:?}");
        // Writable: a fresh socket has room.
        poller.add(&server, 7, Interest::READ_WRITE).unwrap();
        poller.wait(Duration::from_secs(5), &mut ready).unwrap();
        assert_eq!(ready, [7]);
    }
}
