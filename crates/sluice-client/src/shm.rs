//! The client end of the shared-memory transport (`sluice_io::shm`).

use crate::{Error, Transport, SHM_SPIN};
use sluice_io::shm::{self, Answer, Notifier, ShmChannel, ShmError, ShmRegion, Side};
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long the client waits for the server's answer to its hello.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one park lasts before the client checks the server is alive.
const PARK: Duration = Duration::from_millis(100);

pub(crate) struct ShmTransport {
    channel: ShmChannel,
    notifier: Notifier,
    /// Open for the client's life: the server sees the client die when it
    /// closes, and the client sees the server die the same way.
    sock: UnixStream,
}

fn ring_error(e: ShmError) -> Error {
    match e {
        ShmError::Closed => Error::Closed,
        ShmError::Corrupt(what) => Error::Protocol(what),
    }
}

impl ShmTransport {
    pub(crate) fn connect(path: &Path) -> Result<ShmTransport, Error> {
        let mut sock = UnixStream::connect(path).map_err(|e| {
            Error::Io(std::io::Error::new(
                e.kind(),
                format!(
                    "cannot connect to the shared-memory socket {}: {e} (is `sluice serve --shm {}` running, and may this user open it?)",
                    path.display(),
                    path.display()
                ),
            ))
        })?;
        sock.write_all(&shm::hello())?;
        sock.set_read_timeout(Some(ANSWER_TIMEOUT))?;
        let mut answer = vec![0u8; shm::ANSWER_BYTES + shm::MAX_REFUSAL_BYTES];
        let (n, fds) = shm::recv_with_fds(&sock, &mut answer)?;
        if n == 0 {
            return Err(Error::Closed);
        }
        match shm::parse_answer(&answer[..n]).map_err(Error::Protocol)? {
            Answer::Refused(why) => return Err(Error::Refused(why)),
            Answer::Admitted(_) => {}
        }
        let mut fds = fds.into_iter();
        let (Some(memfd), Some(eventfd), None) = (fds.next(), fds.next(), fds.next()) else {
            return Err(Error::Protocol(
                "the server's answer did not carry the ring and waker descriptors".into(),
            ));
        };
        let region = ShmRegion::open(memfd)?;
        sock.set_read_timeout(None)?;
        Ok(ShmTransport {
            channel: ShmChannel::new(region, Side::Client),
            notifier: Notifier::new(eventfd),
            sock,
        })
    }

    /// Wakes the server thread if it announced it sleeps.
    fn nudge(&self) {
        if self.channel.take_peer_sleeping() {
            self.notifier.notify();
        }
    }

    /// Waits until `ready` holds: spins for [`SHM_SPIN`], then parks on the
    /// futex until the server publishes (or closes, or dies).
    fn wait_until(
        &self,
        ready: impl Fn(&ShmChannel) -> Result<bool, ShmError>,
    ) -> Result<(), Error> {
        // The spin is timed from the 64th look: a reply that comes at once
        // costs no clock read.
        let mut start = None;
        let mut turns = 0u32;
        loop {
            if ready(&self.channel).map_err(ring_error)? {
                return Ok(());
            }
            turns += 1;
            if turns.is_multiple_of(64)
                && start.get_or_insert_with(Instant::now).elapsed() >= SHM_SPIN
            {
                break;
            }
            std::hint::spin_loop();
        }
        loop {
            self.channel.announce_sleeping();
            let now_ready = ready(&self.channel).map_err(ring_error)?;
            if !now_ready && !self.channel.closed() {
                self.channel.park(PARK);
            }
            self.channel.clear_sleeping();
            if ready(&self.channel).map_err(ring_error)? {
                return Ok(());
            }
            if self.channel.closed() {
                return Err(Error::Closed);
            }
            // A server that died never says so in the ring: its end of
            // the socket reads as end of file.
            if shm::wait_readable(self.sock.as_fd(), Duration::ZERO)? {
                return Err(Error::Closed);
            }
        }
    }
}

impl Transport for ShmTransport {
    fn send(&mut self, bytes: &[u8], replies: &mut Vec<u8>) -> Result<(), Error> {
        let mut rest = bytes;
        while !rest.is_empty() {
            if self.channel.closed() {
                return Err(Error::Closed);
            }
            let n = self.channel.write(rest).map_err(ring_error)?;
            if n > 0 {
                rest = &rest[n..];
                self.nudge();
                continue;
            }
            // The request ring is full: take replies meanwhile (the server
            // may be waiting for room to write them), then wait for room.
            if self.channel.read(replies, usize::MAX).map_err(ring_error)? > 0 {
                self.nudge();
                continue;
            }
            self.wait_until(|ch| Ok(ch.out_free()? > 0 || ch.in_pending()? > 0))?;
        }
        Ok(())
    }

    fn receive(&mut self, into: &mut Vec<u8>) -> Result<(), Error> {
        loop {
            if self.channel.read(into, usize::MAX).map_err(ring_error)? > 0 {
                // The server may be waiting for room in this ring.
                self.nudge();
                return Ok(());
            }
            self.wait_until(|ch| Ok(ch.in_pending()? > 0))?;
        }
    }
}
