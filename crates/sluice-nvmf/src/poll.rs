//! Reading a socket with adaptive polling: right after a PDU the next one
//! usually follows within tens of microseconds (a host at queue depth 1
//! sends its next command as soon as it has the last answer), so the reader
//! polls the socket for a short while before it blocks. Blocking costs a
//! sleep and a wake-up per PDU, which on a virtual machine measured about
//! as much as the device's own latency.
//!
//! Polling threads are limited machine-wide: more of them than cores would
//! take the cores from the threads they wait for (the host, the device's
//! completions), so past the limit a reader blocks at once.

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long after its last bytes a reader keeps polling before it blocks.
pub const POLL_AFTER_BYTES: Duration = Duration::from_micros(200);

/// Readers polling at once, machine-wide.
static POLLING: AtomicUsize = AtomicUsize::new(0);

/// Most readers polling at once: half the cores, at least one.
fn max_polling() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / 2).max(1)
    })
}

/// A socket read that polls before it blocks. The stream's read timeout
/// (set by its owner) still bounds the blocking read.
pub struct PollingReader {
    /// When bytes last came.
    last_bytes: Instant,
    /// Whether the socket is in non-blocking mode now.
    nonblocking: bool,
}

impl Default for PollingReader {
    fn default() -> Self {
        Self::new()
    }
}

impl PollingReader {
    /// A reader that starts out polling (a connection's first PDU follows
    /// its accept closely).
    pub fn new() -> Self {
        PollingReader {
            last_bytes: Instant::now(),
            nonblocking: false,
        }
    }

    /// Reads into `buf`: polls while bytes came less than
    /// [`POLL_AFTER_BYTES`] ago and a polling slot is free, then blocks.
    /// Errors as `Read::read` (a timeout of the blocking read included).
    pub fn read(&mut self, stream: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.last_bytes.elapsed() < POLL_AFTER_BYTES {
            if let Some(_slot) = PollSlot::take() {
                if let Some(n) = self.poll(stream, buf)? {
                    self.last_bytes = Instant::now();
                    return Ok(n);
                }
            }
        }
        if self.nonblocking {
            stream.set_nonblocking(false)?;
            self.nonblocking = false;
        }
        let n = stream.read(buf)?;
        self.last_bytes = Instant::now();
        Ok(n)
    }

    /// Polls until bytes come (`Some`) or the polling time is up (`None`).
    fn poll(&mut self, stream: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
        if !self.nonblocking {
            stream.set_nonblocking(true)?;
            self.nonblocking = true;
        }
        loop {
            match stream.read(buf) {
                Ok(n) => return Ok(Some(n)),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if self.last_bytes.elapsed() >= POLL_AFTER_BYTES {
                        return Ok(None);
                    }
                    std::hint::spin_loop();
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// A socket whose reads poll before they block ([`PollingReader`]), for
/// readers that take `impl Read` (a `BufReader` over it, say).
pub struct PolledStream {
    stream: TcpStream,
    reader: PollingReader,
}

impl PolledStream {
    /// Polls `stream`'s reads from now on.
    pub fn new(stream: TcpStream) -> Self {
        PolledStream {
            stream,
            reader: PollingReader::new(),
        }
    }

    /// The socket (to set its timeouts).
    pub fn get_ref(&self) -> &TcpStream {
        &self.stream
    }
}

impl Read for PolledStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.reader.read(&mut self.stream, buf)
    }
}

/// One of the machine-wide polling slots, given back when dropped.
struct PollSlot;

impl PollSlot {
    fn take() -> Option<PollSlot> {
        let limit = max_polling();
        POLLING
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| PollSlot)
    }
}

impl Drop for PollSlot {
    fn drop(&mut self) {
        POLLING.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    #[test]
    fn reads_what_comes_while_polling_and_after_blocking() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let writer = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"first").unwrap();
            // Past the polling time: the reader has blocked by then.
            std::thread::sleep(POLL_AFTER_BYTES * 20);
            s.write_all(b"second").unwrap();
        });
        let (mut stream, _) = listener.accept().unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut reader = PollingReader::new();
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        while got.len() < b"firstsecond".len() {
            let n = reader.read(&mut stream, &mut buf).unwrap();
            assert!(n > 0, "the peer closed early");
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, b"firstsecond");
        assert!(
            !reader.nonblocking,
            "a reader that blocked left the socket blocking"
        );
        writer.join().unwrap();
        assert_eq!(
            POLLING.load(Ordering::Acquire),
            0,
            "a polling slot was not given back"
        );
    }
}
