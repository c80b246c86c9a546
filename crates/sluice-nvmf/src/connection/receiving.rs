//! A connection's receive side: a worker's connection's buffer and
//! clocks, and the patient blocking reads of a connection on a thread.

use super::{HEADER_READ_BYTES, SETUP_TIMEOUT, TURN_READ_BYTES};
use crate::link::Link;
use crate::pdu::Fatal;
use std::io::ErrorKind;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// A worker's connection's receive side and clocks.
pub(crate) struct Receiving {
    pub(super) buf: Vec<u8>,
    pub(super) start: usize,
    pub(super) filled: usize,
    /// Bytes the PDU begun at `start` still needs.
    pub(super) need: usize,
    /// PDUs received and not handled yet (held back by waiting commands or
    /// unsent answers): the connection needs a turn without new bytes.
    pub(super) held: bool,
    pub(super) opened: Instant,
    pub(super) last_heard: Instant,
    /// Since when answers have waited for the host to take them.
    pub(super) unsent_since: Option<Instant>,
    /// A write's data being read straight into its pinned buffer: nothing
    /// after it is framed until it is all here.
    pub(super) direct: Option<DirectData>,
    /// A data PDU's data came direct lately: read a header's worth alone,
    /// so that the next one's data does too.
    pub(super) headers_first: bool,
    /// PDUs framed whole since the last direct one: past
    /// [`HEADERS_FIRST_PDUS`] of them, reads take all there is again.
    pub(super) whole_pdus: usize,
}

/// What is still to come of a write's data PDU read straight into the
/// write's pinned buffer (a worker's connection).
pub(super) struct DirectData {
    /// The write (its entry in `Connection::pending`).
    pub(super) cid: u16,
    /// Where the PDU's data begins in the buffer, and its length.
    pub(super) data_at: usize,
    pub(super) data_len: usize,
    /// The PDU's data digest, when it carries one, and how much of it came.
    pub(super) digest: Option<([u8; 4], usize)>,
}

impl Receiving {
    pub(crate) fn new() -> Receiving {
        Receiving {
            buf: vec![0u8; 256 << 10],
            start: 0,
            filled: 0,
            need: 0,
            held: false,
            opened: Instant::now(),
            last_heard: Instant::now(),
            unsent_since: None,
            direct: None,
            headers_first: false,
            whole_pdus: 0,
        }
    }

    /// Whether received PDUs wait for a turn.
    pub(crate) fn held(&self) -> bool {
        self.held
    }

    /// Reads what the socket holds now (up to [`TURN_READ_BYTES`]).
    pub(super) fn fill(&mut self, stream: &TcpStream) -> Result<bool, Result<(), String>> {
        let mut got_any = false;
        let mut got = 0;
        while got < TURN_READ_BYTES {
            // Room: the partial PDU to the front, the buffer as big as it.
            if self.start > 0 {
                self.buf.copy_within(self.start..self.filled, 0);
                self.filled -= self.start;
                self.start = 0;
            }
            let room = (self.filled + self.need).max(self.filled + (64 << 10));
            if room > self.buf.len() {
                self.buf.resize(room, 0);
            }
            // After a direct data PDU, a header's worth alone: the data of
            // the PDU it begins is read direct.
            let buffered = self.filled - self.start;
            let header_only = self.headers_first && buffered < HEADER_READ_BYTES;
            let space = if header_only {
                HEADER_READ_BYTES - buffered
            } else {
                self.buf.len() - self.filled
            };
            let into = &mut self.buf[self.filled..self.filled + space];
            match sluice_io::net::recv_nowait(stream, into) {
                Ok(0) => return Err(Ok(())),
                Ok(n) => {
                    self.filled += n;
                    got += n;
                    got_any = true;
                    self.last_heard = Instant::now();
                    // A read that left room took all the socket held: asking
                    // again would only hear EAGAIN, a system call a group of
                    // commands. Bytes that come later make the socket ready.
                    if n < space || header_only {
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(Err(format!("receiving: {e}"))),
            }
        }
        Ok(got_any)
    }
}

/// Why a connection stops.
pub(super) enum Stop {
    /// The host broke the transport's rules: a TermReq goes back.
    Fatal(Fatal),
    /// The socket failed, or the node is stopping.
    Io(String),
}

/// After a read timed out in the middle of a PDU: goes on waiting, unless
/// the node is stopping or the host has sent nothing since `last_bytes`
/// for [`SETUP_TIMEOUT`].
pub(super) fn keep_waiting(stop: &AtomicBool, last_bytes: Instant) -> Result<(), Stop> {
    if stop.load(Ordering::Relaxed) {
        return Err(Stop::Io("the node is stopping".into()));
    }
    if last_bytes.elapsed() > SETUP_TIMEOUT {
        return Err(Stop::Io(format!(
            "no byte of a PDU's data for {} s",
            SETUP_TIMEOUT.as_secs()
        )));
    }
    Ok(())
}

/// Fills `dst` from `stream`, waiting through its read timeouts (the host
/// is in the middle of a PDU) until the node stops or the host has sent
/// nothing for [`SETUP_TIMEOUT`].
pub(super) fn read_exact_patiently(
    stream: &mut impl Link,
    dst: &mut [u8],
    stop: &AtomicBool,
) -> Result<(), Stop> {
    let mut done = 0;
    let mut last_bytes = Instant::now();
    while done < dst.len() {
        match stream.read(&mut dst[done..]) {
            Ok(0) => return Err(Stop::Io("the host closed the connection mid-PDU".into())),
            Ok(n) => {
                done += n;
                last_bytes = Instant::now();
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                keep_waiting(stop, last_bytes)?
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(Stop::Io(format!("receiving: {e}"))),
        }
    }
    Ok(())
}
