//! Recycled byte buffers for answers and pages. An export moves megabytes
//! per page through fresh allocations, and a fresh allocation of that size
//! costs the kernel a zeroed page per 4 KiB touched (and a read into it, a
//! zeroing of its own): about a tenth of the exporter's CPU, which the
//! search engine on the same cores would rather have. Buffers go back here
//! when done and come out again for the next answer or page.
//!
//! A recycled buffer's length marks how much of it is initialised; its
//! contents are stale.

use std::sync::Mutex;

/// Most buffers kept; more are freed. With [`MAX_KEPT_BYTES`], at most
/// 256 MiB is kept idle (an export of pages of 2048 ordinary documents keeps
/// about 16 buffers of 4 MiB).
pub const MAX_KEPT: usize = 16;
/// Buffers larger than this are freed rather than kept.
pub const MAX_KEPT_BYTES: usize = 16 << 20;

static KEPT: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// A buffer to fill: recycled if one is kept (its length says how much of
/// it is initialised, its bytes are stale), else empty.
pub fn take() -> Vec<u8> {
    KEPT.lock()
        .unwrap_or_else(|e| e.into_inner())
        .pop()
        .unwrap_or_default()
}

/// Capacities go up in powers of two, so that buffers of answers and pages
/// of about the same size fit each other's uses without a reallocation.
fn rounded(bytes: usize) -> usize {
    bytes.max(64 << 10).next_power_of_two()
}

/// An empty buffer with room for at least `capacity` bytes.
pub fn take_empty(capacity: usize) -> Vec<u8> {
    let mut buf = take();
    buf.clear();
    buf.reserve(rounded(capacity));
    buf
}

/// Gives a buffer back for reuse.
pub fn give(buf: Vec<u8>) {
    if buf.capacity() == 0 || buf.capacity() > MAX_KEPT_BYTES {
        return;
    }
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    if kept.len() < MAX_KEPT {
        kept.push(buf);
    }
}

/// An answer's body in a recycled buffer: derefs to the bytes received; the
/// buffer goes back for reuse when the body is dropped.
#[derive(Debug, Default)]
pub struct Body {
    buf: Vec<u8>,
    len: usize,
}

impl Body {
    /// Reads `reader` to its end into a recycled buffer, expecting about
    /// `expected` bytes; fails past `max_bytes`, or when a read ends after
    /// `deadline`.
    pub fn read_from(
        reader: &mut dyn std::io::Read,
        expected: usize,
        max_bytes: usize,
        deadline: Option<std::time::Instant>,
    ) -> std::io::Result<Body> {
        let mut buf = take();
        let want = rounded(expected).min(max_bytes);
        if buf.len() < want {
            // Zeroes only what was never initialised: up to the capacity.
            buf.resize(want.max(buf.capacity()).min(max_bytes), 0);
        }
        let mut len = 0;
        loop {
            if len == buf.len() {
                if len >= max_bytes {
                    give(buf);
                    return Err(std::io::Error::other(format!(
                        "answer larger than {max_bytes} bytes"
                    )));
                }
                buf.resize(rounded(len + 1).min(max_bytes), 0);
            }
            match reader.read(&mut buf[len..]) {
                Ok(0) => return Ok(Body { buf, len }),
                Ok(_) if deadline.is_some_and(|d| std::time::Instant::now() > d) => {
                    give(buf);
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the answer took longer than the request timeout",
                    ));
                }
                Ok(n) => len += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    give(buf);
                    return Err(e);
                }
            }
        }
    }
}

impl From<Vec<u8>> for Body {
    fn from(buf: Vec<u8>) -> Self {
        let len = buf.len();
        Body { buf, len }
    }
}

impl std::ops::Deref for Body {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        give(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_reads_everything_and_its_buffer_comes_back() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let body = Body::read_from(&mut &data[..], 10, 1 << 20, None).unwrap();
        assert_eq!(&*body, &data[..]);
        drop(body);
        let again = take();
        assert!(again.len() >= data.len(), "the buffer was kept");
        give(again);
        let small = Body::read_from(&mut &b"abc"[..], 3, 1 << 20, None).unwrap();
        assert_eq!(&*small, b"abc");
    }

    #[test]
    fn a_body_past_the_limit_is_refused() {
        let data = vec![7u8; 300_000];
        let err = Body::read_from(&mut &data[..], 0, 100_000, None)
            .err()
            .unwrap();
        assert!(err.to_string().contains("larger than 100000"), "{err}");
    }
}
