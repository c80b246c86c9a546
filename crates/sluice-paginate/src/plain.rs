//! Plain HTTP/1.1 over keep-alive TCP connections, for `http://` sources.
//!
//! An answer's body is read straight from the socket into the recycled
//! buffer it is then parsed from, in reads as large as the buffer has room
//! for. A general-purpose client reads a body through an 8 KiB buffer and
//! copies it out: for megabyte pages that is a system call per 8 KiB and
//! a second pass over every byte. `https://` sources go through the
//! general client (see [`crate::http`]).

use crate::buffers::Body;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most idle connections kept for reuse.
const MAX_IDLE_CONNECTIONS: usize = 64;
/// Largest header section of an answer.
const MAX_HEAD_BYTES: usize = 64 << 10;
/// Most header lines of an answer.
const MAX_HEADERS: usize = 64;

/// Keep-alive connections to one `http://host:port`.
#[derive(Debug)]
pub struct PlainPool {
    /// `host:port`, as connected to and sent in `Host`.
    authority: String,
    /// The URL's path prefix (no trailing slash), put before every path.
    prefix: String,
    connect_timeout: Duration,
    io_timeout: Duration,
    idle: Mutex<Vec<TcpStream>>,
}

/// An answer: its status, body and `X-Elastic-Product` header.
#[derive(Debug)]
pub struct PlainAnswer {
    /// The HTTP status.
    pub status: u16,
    /// The body, in a recycled buffer.
    pub body: Body,
    /// The `X-Elastic-Product` header.
    pub elastic_product: Option<String>,
}

/// One request.
pub struct PlainRequest<'a> {
    /// `GET`, `POST`, ...
    pub method: &'a str,
    /// Path and query, from the source's root.
    pub path: &'a str,
    /// Body and its content type.
    pub body: Option<(&'a [u8], &'a str)>,
    /// The `Authorization` header.
    pub authorization: Option<&'a str>,
    /// The answer must be whole by then.
    pub deadline: Instant,
    /// Largest body accepted.
    pub max_body_bytes: usize,
}

/// Why an exchange failed: before the answer began on a connection taken
/// from the pool (the server may have closed it meanwhile: worth one more
/// try on a new one), or otherwise.
enum Failure {
    Stale(String),
    Failed(String),
}

impl PlainPool {
    /// A pool for `base` if it is a plain `http://` URL (credentials
    /// already taken out).
    pub fn for_url(base: &str, connect_timeout: Duration, io_timeout: Duration) -> Option<Self> {
        let rest = base.strip_prefix("http://")?;
        let (authority, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return None;
        }
        Some(PlainPool {
            authority: authority.to_string(),
            prefix: prefix.to_string(),
            connect_timeout,
            io_timeout,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Sends `request` and reads its answer whole.
    pub fn send(&self, request: &PlainRequest<'_>) -> Result<PlainAnswer, String> {
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        if let Some(mut stream) = pooled {
            match self.exchange(&mut stream, request, true) {
                Ok((answer, keep)) => {
                    self.give_back(stream, keep);
                    return Ok(answer);
                }
                Err(Failure::Failed(e)) => return Err(e),
                Err(Failure::Stale(_)) => {}
            }
        }
        let mut stream = self.connect()?;
        match self.exchange(&mut stream, request, false) {
            Ok((answer, keep)) => {
                self.give_back(stream, keep);
                Ok(answer)
            }
            Err(Failure::Failed(e) | Failure::Stale(e)) => Err(e),
        }
    }

    fn give_back(&self, stream: TcpStream, keep: bool) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if keep && idle.len() < MAX_IDLE_CONNECTIONS {
            idle.push(stream);
        }
    }

    fn connect(&self) -> Result<TcpStream, String> {
        let addrs = self
            .authority
            .to_socket_addrs()
            .map_err(|e| format!("resolving {}: {e}", self.authority))?;
        let mut last = format!("{} resolves to no address", self.authority);
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, self.connect_timeout) {
                Ok(s) => {
                    let set = |r: std::io::Result<()>| r.map_err(|e| e.to_string());
                    set(s.set_nodelay(true))?;
                    set(s.set_read_timeout(Some(self.io_timeout)))?;
                    set(s.set_write_timeout(Some(self.io_timeout)))?;
                    return Ok(s);
                }
                Err(e) => last = format!("connecting to {addr}: {e}"),
            }
        }
        Err(last)
    }

    /// One request and its answer on `stream`; whether the connection may
    /// carry another.
    fn exchange(
        &self,
        stream: &mut TcpStream,
        request: &PlainRequest<'_>,
        pooled: bool,
    ) -> Result<(PlainAnswer, bool), Failure> {
        let failed = |e: String| Failure::Failed(e);
        let mut head = format!(
            "{} {}{} HTTP/1.1\r\nHost: {}\r\nUser-Agent: sluice/{}\r\nAccept: application/json\r\n",
            request.method,
            self.prefix,
            request.path,
            self.authority,
            env!("CARGO_PKG_VERSION")
        );
        if let Some(auth) = request.authorization {
            head.push_str(&format!("Authorization: {auth}\r\n"));
        }
        match request.body {
            Some((body, content_type)) => head.push_str(&format!(
                "Content-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )),
            None => head.push_str("Content-Length: 0\r\n\r\n"),
        }
        let stale_or_failed = |e: std::io::Error| {
            let text = format!("sending the request: {e}");
            if pooled {
                Failure::Stale(text)
            } else {
                Failure::Failed(text)
            }
        };
        stream.write_all(head.as_bytes()).map_err(stale_or_failed)?;
        if let Some((body, _)) = request.body {
            stream.write_all(body).map_err(stale_or_failed)?;
        }
        let (mut received, head_end) = read_head(stream, pooled)?;
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut headers);
        match parsed.parse(&received[..head_end]) {
            Ok(httparse::Status::Complete(_)) => {}
            Ok(httparse::Status::Partial) => {
                return Err(failed("an incomplete answer head".into()))
            }
            Err(e) => return Err(failed(format!("a malformed answer head: {e}"))),
        }
        let status = parsed.code.unwrap_or(0);
        let header = |name: &str| {
            parsed
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).trim().to_string())
        };
        let elastic_product = header("X-Elastic-Product");
        let mut keep = parsed.version == Some(1)
            && !header("Connection").is_some_and(|c| c.eq_ignore_ascii_case("close"));
        let chunked = header("Transfer-Encoding").is_some_and(|t| !t.is_empty());
        let length = header("Content-Length")
            .map(|l| {
                l.parse::<usize>()
                    .map_err(|_| failed(format!("a bad Content-Length: {l:?}")))
            })
            .transpose()?;
        let no_body = request.method.eq_ignore_ascii_case("HEAD") || matches!(status, 204 | 304);
        let leftover = received.split_off(head_end);
        let body = if no_body {
            Body::from(Vec::new())
        } else if chunked {
            let mut reader = BufReader::with_capacity(
                256 << 10,
                std::io::Cursor::new(leftover).chain(&mut *stream),
            );
            let body = read_chunked(&mut reader, request.max_body_bytes).map_err(failed)?;
            // Bytes past the last chunk would belong to no request.
            keep &= reader.buffer().is_empty();
            body
        } else {
            let limit = length.unwrap_or(usize::MAX);
            if length.is_none() {
                keep = false;
            }
            if limit > request.max_body_bytes && length.is_some() {
                return Err(failed(format!(
                    "an answer of {limit} bytes, more than the {} accepted",
                    request.max_body_bytes
                )));
            }
            // What came with the head counts toward the length.
            let mut leftover = leftover;
            leftover.truncate(limit);
            let from_socket = (limit - leftover.len()) as u64;
            let mut reader = std::io::Cursor::new(leftover).chain((&mut *stream).take(from_socket));
            let body = Body::read_from(
                &mut reader,
                length.unwrap_or(0),
                request.max_body_bytes,
                Some(request.deadline),
            )
            .map_err(|e| failed(format!("reading the answer: {e}")))?;
            if let Some(n) = length {
                if body.len() != n {
                    return Err(failed(format!(
                        "the connection closed {} bytes into an answer of {n}",
                        body.len()
                    )));
                }
            }
            body
        };
        Ok((
            PlainAnswer {
                status,
                body,
                elastic_product,
            },
            keep,
        ))
    }
}

/// Reads up to the end of the header section: the bytes read, and where
/// the body starts in them.
fn read_head(stream: &mut TcpStream, pooled: bool) -> Result<(Vec<u8>, usize), Failure> {
    let mut received = vec![0u8; 16 << 10];
    let mut len = 0;
    loop {
        if let Some(end) = find_head_end(&received[..len]) {
            received.truncate(len);
            return Ok((received, end));
        }
        if len == received.len() {
            if len >= MAX_HEAD_BYTES {
                return Err(Failure::Failed(format!(
                    "an answer head longer than {MAX_HEAD_BYTES} bytes"
                )));
            }
            received.resize(len * 2, 0);
        }
        match stream.read(&mut received[len..]) {
            Ok(0) if len == 0 && pooled => {
                return Err(Failure::Stale("the server closed the connection".into()))
            }
            Ok(0) => {
                return Err(Failure::Failed(
                    "the server closed the connection before answering".into(),
                ))
            }
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if len == 0 && pooled => return Err(Failure::Stale(e.to_string())),
            Err(e) => return Err(Failure::Failed(format!("reading the answer: {e}"))),
        }
    }
}

fn find_head_end(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
}

/// Longest chunk-size or trailer line taken from a server.
const MAX_CHUNK_LINE_BYTES: u64 = 8 << 10;

/// One line of at most [`MAX_CHUNK_LINE_BYTES`], or an error naming `what`.
fn chunk_line(reader: &mut impl BufRead, line: &mut String, what: &str) -> Result<usize, String> {
    line.clear();
    let n = reader
        .by_ref()
        .take(MAX_CHUNK_LINE_BYTES)
        .read_line(line)
        .map_err(|e| format!("reading {what}: {e}"))?;
    if n as u64 == MAX_CHUNK_LINE_BYTES && !line.ends_with('\n') {
        return Err(format!("{what} longer than {MAX_CHUNK_LINE_BYTES} bytes"));
    }
    Ok(n)
}

/// A chunk's size: hex digits only, at most 16, so it fits a u64.
fn chunk_size(line: &str) -> Result<u64, String> {
    let text = line.trim_end().split(';').next().unwrap_or("").trim_end();
    if text.is_empty() || text.len() > 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("a bad chunk size: {:?}", line.trim()));
    }
    u64::from_str_radix(text, 16).map_err(|_| format!("a bad chunk size: {:?}", line.trim()))
}

/// [`read_chunked`] for the fuzz targets: the body's bytes, or why not.
#[cfg(feature = "fuzzing")]
pub fn fuzz_read_chunked(reader: &mut impl BufRead, max_bytes: usize) -> Result<Vec<u8>, String> {
    read_chunked(reader, max_bytes).map(|b| b.to_vec())
}

/// A chunked body whole (trailers read and dropped).
fn read_chunked(reader: &mut impl BufRead, max_bytes: usize) -> Result<Body, String> {
    let mut body = crate::buffers::take_empty(0);
    let mut line = String::new();
    loop {
        chunk_line(reader, &mut line, "a chunk size")?;
        let size = chunk_size(&line)?;
        if size == 0 {
            // Trailers, up to an empty line.
            loop {
                let n = chunk_line(reader, &mut line, "the trailers")?;
                if n == 0 || line.trim().is_empty() {
                    return Ok(Body::from(body));
                }
            }
        }
        // The size is compared with the room left before any arithmetic:
        // a size near 2^64 must not wrap past the limit.
        if size > max_bytes.saturating_sub(body.len()) as u64 {
            return Err(format!("an answer larger than {max_bytes} bytes"));
        }
        let start = body.len();
        body.resize(start + size as usize, 0);
        reader
            .read_exact(&mut body[start..])
            .map_err(|e| format!("reading a chunk: {e}"))?;
        let mut crlf = [0u8; 2];
        reader
            .read_exact(&mut crlf)
            .map_err(|e| format!("reading a chunk's end: {e}"))?;
        if &crlf != b"\r\n" {
            return Err("a chunk not followed by CRLF".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_authority_and_prefix() {
        let d = Duration::from_secs(1);
        let p = PlainPool::for_url("http://db:9200/prefix/", d, d).unwrap();
        assert_eq!(
            (p.authority.as_str(), p.prefix.as_str()),
            ("db:9200", "/prefix")
        );
        assert!(PlainPool::for_url("https://db:9200", d, d).is_none());
        assert!(PlainPool::for_url("http://", d, d).is_none());
    }

    /// A server that answers every request on a connection, keeping it
    /// open, with `answers` in turn (each written whole, head and body in
    /// one write); it counts the connections it accepted.
    fn keep_alive_server(
        answers: Vec<Vec<u8>>,
    ) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = std::sync::Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        std::thread::spawn(move || {
            let mut next = 0;
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                counter.fetch_add(1, Ordering::SeqCst);
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while next < answers.len() {
                    // One request: up to the end of its head (no bodies sent here).
                    while find_head_end(&seen).is_none() {
                        match stream.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    }
                    let Some(end) = find_head_end(&seen) else {
                        break;
                    };
                    seen.drain(..end);
                    if stream.write_all(&answers[next]).is_err() {
                        break;
                    }
                    next += 1;
                }
            }
        });
        (format!("http://{addr}"), accepted)
    }

    fn request(path: &str) -> PlainRequest<'_> {
        PlainRequest {
            method: "GET",
            path,
            body: None,
            authorization: None,
            deadline: Instant::now() + Duration::from_secs(10),
            max_body_bytes: 1 << 20,
        }
    }

    #[test]
    fn answers_whole_in_one_write_and_chunked_ones_reuse_the_connection() {
        let (url, accepted) = keep_alive_server(vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Elastic-Product: Elasticsearch\r\n\r\nhello".to_vec(),
            b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n".to_vec(),
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_vec(),
        ]);
        let d = Duration::from_secs(5);
        let pool = PlainPool::for_url(&url, d, d).unwrap();
        let a = pool.send(&request("/")).unwrap();
        assert_eq!((a.status, &a.body[..]), (200, &b"hello"[..]));
        assert_eq!(a.elastic_product.as_deref(), Some("Elasticsearch"));
        let b = pool.send(&request("/x")).unwrap();
        assert_eq!((b.status, &b.body[..]), (404, &b"abcde"[..]));
        let c = pool.send(&request("/y")).unwrap();
        assert_eq!((c.status, c.body.len()), (200, 0));
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "one connection for all"
        );
    }

    #[test]
    fn a_pooled_connection_the_server_closed_is_replaced() {
        // The server answers once per connection, then closes it.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf);
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
            }
        });
        let d = Duration::from_secs(5);
        let pool = PlainPool::for_url(&url, d, d).unwrap();
        for _ in 0..3 {
            let a = pool.send(&request("/")).unwrap();
            assert_eq!(&a.body[..], b"ok");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn chunked_bodies_are_put_together() {
        let mut r =
            std::io::Cursor::new(b"4\r\nWiki\r\n6;x=y\r\npedia \r\n0\r\nT: v\r\n\r\n".to_vec());
        assert_eq!(&read_chunked(&mut r, 1 << 20).unwrap()[..], b"Wikipedia ");
        let mut bad = std::io::Cursor::new(b"zz\r\n".to_vec());
        assert!(read_chunked(&mut bad, 1 << 20).is_err());
        let mut big = std::io::Cursor::new(b"10\r\n0123456789abcdef\r\n0\r\n\r\n".to_vec());
        assert!(read_chunked(&mut big, 8).is_err());
        // A size near 2^64 after a first chunk: `len + size` wrapped past
        // the limit, and the resize that followed aborted the process.
        let mut wraps = std::io::Cursor::new(&b"1\r\na\r\nffffffffffffffff\r\n"[..]);
        let e = read_chunked(&mut wraps, 1 << 20).unwrap_err();
        assert!(e.contains("larger than"), "{e}");
        for bad in ["+1", "-1", "", "10000000000000000", "0x1"] {
            let text = format!("{bad}\r\nx\r\n0\r\n\r\n");
            let mut r = std::io::Cursor::new(text.as_bytes());
            assert!(read_chunked(&mut r, 1 << 20).is_err(), "{bad:?} taken");
        }
        let endless = vec![b'1'; 100_000];
        let mut r = std::io::Cursor::new(&endless[..]);
        assert!(read_chunked(&mut r, 1 << 20)
            .unwrap_err()
            .contains("longer than"));
    }
}
