//! Reading a socket with adaptive polling: right after a PDU the next one
//! usually follows within tens of microseconds (a host at queue depth 1
//! sends its next command as soon as it has the last answer), so the reader
//! polls the socket for a short while before it blocks. Blocking costs a
//! sleep and a wake-up per PDU, which on a virtual machine measured about
//! as much as the device's own latency.
//!
//! A poller holds one of the process's polling slots (`sluice_io::spin`,
//! shared with the device engines' completion polling): more pollers than
//! half the cores would take the cores from the threads they wait for, so
//! past the limit a reader blocks at once.

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// How long after its last bytes a reader keeps polling before it blocks:
/// longer than a batch of 32 commands takes at this VM's disk (about 300
/// µs), so that at queue depth 32 the next answers or commands come while
/// the reader still polls (200 µs measured 0.65x the writes per second:
/// docs/BENCHMARKS.md).
pub const POLL_AFTER_BYTES: Duration = Duration::from_micros(600);

/// A socket read that polls before it blocks. The stream's read timeout
/// (set by its owner) still bounds the blocking read; the socket stays in
/// blocking mode throughout (polls read with `MSG_DONTWAIT`), so writes on
/// it or on its clones are never cut short.
pub struct PollingReader {
    /// When bytes last came.
    last_bytes: Instant,
    /// Polls that ran out of time make the next reads block at once.
    backoff: sluice_io::spin::SpinBackoff,
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
            backoff: sluice_io::spin::SpinBackoff::default(),
        }
    }

    /// Reads into `buf`: polls while bytes came less than
    /// [`POLL_AFTER_BYTES`] ago and a polling slot is free, then blocks.
    /// Errors as `Read::read` (a timeout of the blocking read included).
    pub fn read(&mut self, stream: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.last_bytes.elapsed() < POLL_AFTER_BYTES && self.backoff.should_spin() {
            // Counted as waiting only while it polls: a connection that
            // then blocks may stay idle for long.
            let waiting = sluice_io::spin::Waiting::begin();
            if let Some(_slot) = waiting.spin_slot() {
                let polled = self.poll(stream, buf)?;
                self.backoff.record(polled.is_some());
                if let Some(n) = polled {
                    self.last_bytes = Instant::now();
                    return Ok(n);
                }
            }
        }
        let n = stream.read(buf)?;
        self.last_bytes = Instant::now();
        Ok(n)
    }

    /// Polls until bytes come (`Some`) or the polling time is up (`None`).
    fn poll(&mut self, stream: &TcpStream, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
        loop {
            match sluice_io::net::recv_nowait(stream, buf) {
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
    /// Reads neither poll nor wait: the socket is non-blocking, served by
    /// a worker among others ([`PolledStream::serve_nonblocking`]).
    nonblocking: bool,
}

impl PolledStream {
    /// Polls `stream`'s reads from now on.
    pub fn new(stream: TcpStream) -> Self {
        PolledStream {
            stream,
            reader: PollingReader::new(),
            nonblocking: false,
        }
    }

    /// Makes the socket non-blocking and its reads plain: a read takes
    /// what has come or fails with `WouldBlock` (a worker waits for the
    /// socket, not the reader).
    pub fn serve_nonblocking(&mut self) -> std::io::Result<()> {
        self.stream.set_nonblocking(true)?;
        self.nonblocking = true;
        Ok(())
    }

    /// The socket (to set its timeouts).
    pub fn get_ref(&self) -> &TcpStream {
        &self.stream
    }
}

impl Read for PolledStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.nonblocking {
            return self.stream.read(buf);
        }
        self.reader.read(&mut self.stream, buf)
    }
}

/// Writes go straight to the socket (a TLS session over the stream both
/// reads and writes it).
impl std::io::Write for PolledStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
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
        writer.join().unwrap();
        assert_eq!(
            sluice_io::spin::SpinSlot::taken(),
            0,
            "a polling slot was not given back"
        );
    }

    #[test]
    fn a_writer_on_a_clone_keeps_blocking_while_its_reader_polls() {
        // The socket's blocking mode is shared by its clones: a poll that
        // switched it would cut a big reply short with WouldBlock.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        const REPLY_BYTES: usize = 32 << 20;
        let peer = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"x").unwrap();
            // Reads slowly, so the other side's send buffer fills.
            let mut buf = vec![0u8; 64 << 10];
            let mut total = 0;
            while total < REPLY_BYTES {
                std::thread::sleep(Duration::from_micros(200));
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "the reply was cut short");
                total += n;
            }
            total
        });
        let (stream, _) = listener.accept().unwrap();
        let mut writer = stream.try_clone().unwrap();
        // The byte is there before the poll starts; polled directly, so no
        // other test's hold on the process's polling slots changes the path.
        std::thread::sleep(Duration::from_millis(20));
        let mut reader = PollingReader::new();
        let mut buf = [0u8; 8];
        assert_eq!(reader.poll(&stream, &mut buf).unwrap(), Some(1));
        writer
            .write_all(&vec![7u8; REPLY_BYTES])
            .expect("a blocking write completes whole");
        assert_eq!(peer.join().unwrap(), REPLY_BYTES);
    }
}
