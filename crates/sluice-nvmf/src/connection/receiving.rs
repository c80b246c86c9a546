//! A connection's receive side: its buffer and clocks.

use super::{DIRECT_MIN_BYTES, HEADER_READ_BYTES, TURN_READ_BYTES};
use crate::wire::Wire;
use std::io::ErrorKind;
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
    pub(super) fn fill(&mut self, wire: &mut Wire) -> Result<bool, Result<(), String>> {
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
            match wire.recv(into) {
                Ok(0) => return Err(Ok(())),
                Ok(n) => {
                    self.filled += n;
                    got += n;
                    got_any = true;
                    self.last_heard = Instant::now();
                    // A read of the socket that left room took all it held:
                    // asking again would only hear EAGAIN, a system call a
                    // group of commands. Bytes that come later make the
                    // socket ready. (A TLS read ends at its record's end.)
                    if (n < space && wire.short_read_drains()) || header_only {
                        break;
                    }
                    // A TLS read ends at its record's end, the next may
                    // begin a big PDU's data: stop there, so that the rest
                    // of it is read straight into its write's buffer.
                    if partial_pdu_need(&self.buf[self.start..self.filled]) >= DIRECT_MIN_BYTES {
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

/// The bytes the last PDU begun in `bytes` (whole PDUs before it) still
/// needs, by the lengths their common headers give; 0 when `bytes` ends
/// on a PDU's end or within a common header (or a header is malformed:
/// the framer refuses it).
fn partial_pdu_need(bytes: &[u8]) -> usize {
    /// The common header: type, flags, HLEN, PDO, PLEN (u32 LE at 4).
    const COMMON_HEADER_BYTES: usize = 8;
    let mut at = 0;
    while bytes.len() - at >= COMMON_HEADER_BYTES {
        let plen = u32::from_le_bytes([bytes[at + 4], bytes[at + 5], bytes[at + 6], bytes[at + 7]]);
        let plen = plen as usize;
        if plen < COMMON_HEADER_BYTES {
            return 0;
        }
        if bytes.len() - at < plen {
            return plen - (bytes.len() - at);
        }
        at += plen;
    }
    0
}

#[cfg(test)]
mod tests {
    use super::partial_pdu_need;

    fn header(plen: u32) -> Vec<u8> {
        let mut h = vec![0x04, 0, 72, 72];
        h.extend_from_slice(&plen.to_le_bytes());
        h
    }

    #[test]
    fn the_need_is_what_the_last_begun_pdu_lacks() {
        assert_eq!(partial_pdu_need(&[]), 0);
        let mut bytes = header(72);
        bytes.resize(72, 0);
        assert_eq!(partial_pdu_need(&bytes), 0, "one whole PDU");
        bytes.extend_from_slice(&header(72 + 131_072));
        bytes.resize(72 + 1000, 0);
        assert_eq!(partial_pdu_need(&bytes), 72 + 131_072 - 1000);
        assert_eq!(partial_pdu_need(&header(4)), 0, "malformed: the framer's");
    }
}
