//! HTTP/1.1 on a byte stream: requests read with limits (head size, body
//! size, `Content-Length` or chunked, gzip bodies), responses written with
//! keep-alive, optionally gzip-compressed.

use std::io::{BufRead, Read, Write};

/// Largest request head (request line and headers).
pub const MAX_HEAD_BYTES: usize = 64 << 10;
/// Most headers a request may carry.
pub const MAX_HEADERS: usize = 100;

/// A request as the API sees it.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// `GET`, `PUT`, ... (upper case as sent).
    pub method: String,
    /// The path, percent-decoded, without the query string.
    pub path: String,
    /// Query parameters in order, percent-decoded.
    pub params: Vec<(String, String)>,
    /// Headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The body, decompressed.
    pub body: Vec<u8>,
}

impl Request {
    /// The first header called `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The last query parameter called `name`.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the client keeps the connection open after this request.
    pub fn keep_alive(&self) -> bool {
        !self
            .header("connection")
            .is_some_and(|c| c.eq_ignore_ascii_case("close"))
    }
}

/// A request that cannot be read; the connection answers it and closes.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The peer closed or the socket failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Not HTTP/1.x as it must be.
    #[error("{0}")]
    Malformed(String),
    /// The head is too big.
    #[error("the request head is over {MAX_HEAD_BYTES} bytes")]
    HeadTooLarge,
    /// The body is over the limit.
    #[error("the request body is over the limit of {limit_bytes} bytes (http.max_content_length)")]
    BodyTooLarge {
        /// The limit.
        limit_bytes: usize,
    },
}

/// Reads one request; `Ok(None)` when the peer closed between requests.
pub fn read_request(
    reader: &mut impl BufRead,
    max_body_bytes: usize,
) -> Result<Option<Request>, WireError> {
    match read_request_head(reader)? {
        None => Ok(None),
        Some(mut request) => {
            read_body(reader, &mut request, max_body_bytes)?;
            Ok(Some(request))
        }
    }
}

/// Whether the client waits for `100 Continue` before it sends the body
/// (curl does for bodies over 1 KiB, for a second).
pub fn expects_continue(request: &Request) -> bool {
    request
        .header("expect")
        .is_some_and(|e| e.eq_ignore_ascii_case("100-continue"))
}

/// The interim answer to `Expect: 100-continue`.
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Reads a request's line and headers; the body is left for [`read_body`].
pub fn read_request_head(reader: &mut impl BufRead) -> Result<Option<Request>, WireError> {
    let head = match read_head(reader)? {
        Some(h) => h,
        None => return Ok(None),
    };
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut headers);
    match parsed.parse(&head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => {
            return Err(WireError::Malformed("the request head ends early".into()))
        }
        Err(e) => return Err(WireError::Malformed(format!("bad request head: {e}"))),
    }
    let method = parsed.method.unwrap_or("GET").to_string();
    let target = parsed.path.unwrap_or("/");
    let headers: Vec<(String, String)> = parsed
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_ascii_lowercase(),
                String::from_utf8_lossy(h.value).trim().to_string(),
            )
        })
        .collect();
    let (raw_path, raw_query) = target.split_once('?').unwrap_or((target, ""));
    Ok(Some(Request {
        method,
        path: percent_decode(raw_path),
        params: parse_query(raw_query),
        headers,
        body: Vec::new(),
    }))
}

/// The body's length as `Content-Length` gives it (0 without one); an
/// error past `max_body_bytes`.
pub fn declared_length(request: &Request, max_body_bytes: usize) -> Result<usize, WireError> {
    let length = match request.header("content-length") {
        None => 0,
        Some(v) => v
            .parse::<usize>()
            .map_err(|_| WireError::Malformed(format!("Content-Length {v:?} is not a number")))?,
    };
    if length > max_body_bytes {
        return Err(WireError::BodyTooLarge {
            limit_bytes: max_body_bytes,
        });
    }
    Ok(length)
}

/// Reads the body of `request` (chunked or `Content-Length`), inflating
/// a gzip one.
pub fn read_body(
    reader: &mut impl BufRead,
    request: &mut Request,
    max_body_bytes: usize,
) -> Result<(), WireError> {
    let chunked = request
        .header("transfer-encoding")
        .is_some_and(|t| t.to_ascii_lowercase().contains("chunked"));
    let body = if chunked {
        read_chunked(reader, max_body_bytes)?
    } else {
        let length = declared_length(request, max_body_bytes)?;
        read_exactly(reader, length)?
    };
    decode_content(request, body, max_body_bytes)
}

/// Sets `request`'s body from `body` as its `Content-Encoding` says:
/// inflated when gzip, taken as it is when identity (or none).
pub fn decode_content(
    request: &mut Request,
    body: Vec<u8>,
    max_body_bytes: usize,
) -> Result<(), WireError> {
    request.body = match request.header("content-encoding") {
        Some(e) if e.eq_ignore_ascii_case("gzip") => gunzip(&body, max_body_bytes)?,
        Some(e) if !e.eq_ignore_ascii_case("identity") => {
            return Err(WireError::Malformed(format!(
                "Content-Encoding {e:?} is not supported: send gzip or identity"
            )))
        }
        _ => body,
    };
    Ok(())
}

fn read_head(reader: &mut impl BufRead) -> Result<Option<Vec<u8>>, WireError> {
    let mut head = Vec::new();
    loop {
        let mut line = Vec::new();
        let n = reader
            .by_ref()
            .take((MAX_HEAD_BYTES + 1 - head.len().min(MAX_HEAD_BYTES)) as u64)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            if head.is_empty() {
                return Ok(None);
            }
            return Err(WireError::Malformed("the peer closed mid-request".into()));
        }
        // Blank lines before a request line are allowed (RFC 9112 2.2).
        if head.is_empty() && (line == b"\r\n" || line == b"\n") {
            continue;
        }
        head.extend_from_slice(&line);
        if head.len() > MAX_HEAD_BYTES {
            return Err(WireError::HeadTooLarge);
        }
        if line == b"\r\n" || line == b"\n" {
            return Ok(Some(head));
        }
    }
}

/// Reads `length` bytes, the buffer growing with what arrives: a client
/// that declares a large body and sends none makes the server hold no
/// more than it sent.
fn read_exactly(reader: &mut impl BufRead, length: usize) -> Result<Vec<u8>, WireError> {
    let mut body = Vec::with_capacity(length.min(READ_AHEAD_BYTES));
    let mut rest = reader.by_ref().take(length as u64);
    // The first part read, the rest gets room for exactly itself (a body
    // grown by doubling would be copied on its way in and held in room
    // for up to twice its size), and only once a client has sent that
    // much of what it declared.
    rest.by_ref()
        .take(READ_AHEAD_BYTES as u64)
        .read_to_end(&mut body)?;
    if body.len() == READ_AHEAD_BYTES && length > READ_AHEAD_BYTES {
        body.reserve_exact(length - body.len());
        rest.read_to_end(&mut body)?;
    }
    if body.len() < length {
        return Err(WireError::Malformed(format!(
            "the peer closed after {} of the {length} body bytes it declared",
            body.len()
        )));
    }
    Ok(body)
}

/// What a body's buffer holds before its bytes arrive.
const READ_AHEAD_BYTES: usize = 1 << 20;

/// Longest chunk-size line (the size, extensions and CRLF).
const MAX_CHUNK_LINE_BYTES: u64 = 1024;

/// A chunk's size from its line (`1a;ext=x\r\n`): hex digits only, at most
/// 16 of them, so that it fits a u64 and no sign or space slips through.
pub(crate) fn chunk_size(line: &str) -> Result<u64, WireError> {
    let text = line
        .trim_end_matches(['\r', '\n'])
        .split(';')
        .next()
        .unwrap_or("")
        .trim_end_matches([' ', '\t']);
    if text.is_empty() || text.len() > 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(WireError::Malformed(format!("bad chunk size {text:?}")));
    }
    u64::from_str_radix(text, 16)
        .map_err(|_| WireError::Malformed(format!("bad chunk size {text:?}")))
}

fn read_chunked(reader: &mut impl BufRead, max_body_bytes: usize) -> Result<Vec<u8>, WireError> {
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        reader
            .by_ref()
            .take(MAX_CHUNK_LINE_BYTES)
            .read_line(&mut line)?;
        if !line.ends_with('\n') {
            return Err(WireError::Malformed(
                "a chunk-size line is over 1024 bytes or ends early".into(),
            ));
        }
        let size = chunk_size(&line)?;
        if size == 0 {
            // Trailers, up to the blank line, within the head's limit.
            let mut trailer_bytes = 0usize;
            loop {
                let mut t = String::new();
                let n = reader.by_ref().take(8192).read_line(&mut t)?;
                trailer_bytes += n;
                if trailer_bytes > MAX_HEAD_BYTES {
                    return Err(WireError::HeadTooLarge);
                }
                if !t.ends_with('\n') {
                    return Err(WireError::Malformed(
                        "the peer closed before the chunked body's last blank line".into(),
                    ));
                }
                if t.trim().is_empty() {
                    return Ok(body);
                }
            }
        }
        // `body.len()` never passes the limit, so the room left is exact;
        // the size is compared before any arithmetic uses it.
        let room = (max_body_bytes - body.len()) as u64;
        if size > room {
            return Err(WireError::BodyTooLarge {
                limit_bytes: max_body_bytes,
            });
        }
        let size = size as usize;
        let got = reader.by_ref().take(size as u64).read_to_end(&mut body)?;
        if got < size {
            return Err(WireError::Malformed("the peer closed mid-chunk".into()));
        }
        let mut crlf = [0u8; 2];
        reader.read_exact(&mut crlf)?;
        if &crlf != b"\r\n" {
            return Err(WireError::Malformed("a chunk does not end in CRLF".into()));
        }
    }
}

fn gunzip(body: &[u8], max_body_bytes: usize) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body)
        .take(max_body_bytes as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| WireError::Malformed(format!("the gzip body does not inflate: {e}")))?;
    if out.len() > max_body_bytes {
        return Err(WireError::BodyTooLarge {
            limit_bytes: max_body_bytes,
        });
    }
    Ok(out)
}

/// `%XX` and `+` decoded (`+` only where `plus_is_space`).
fn decode(text: &str, plus_is_space: bool) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' if plus_is_space => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A path, percent-decoded.
pub fn percent_decode(path: &str) -> String {
    decode(path, false)
}

fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k, true), decode(v, true))
        })
        .collect()
}

/// A response on its way out.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The `Content-Type`.
    pub content_type: &'static str,
    /// More headers.
    pub headers: Vec<(&'static str, String)>,
    /// The body (empty for HEAD, which still sends its length).
    pub body: Vec<u8>,
}

impl Response {
    /// A JSON response.
    pub fn json(status: u16, body: Vec<u8>) -> Response {
        Response {
            status,
            content_type: "application/json; charset=UTF-8",
            headers: Vec::new(),
            body,
        }
    }

    /// A plain text response.
    pub fn text(status: u16, body: impl Into<Vec<u8>>) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=UTF-8",
            headers: Vec::new(),
            body: body.into(),
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        409 => "Conflict",
        413 => "Request Entity Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// Bodies at least this big are compressed for clients that accept gzip.
const GZIP_MIN_BYTES: usize = 1024;

/// Writes `response`; `head_only` sends the headers a GET would have.
/// `gzip` compresses a body worth it.
/// Most response bodies kept for reuse.
const MAX_KEPT_BODIES: usize = 8;
/// Bodies kept are at least this large (smaller ones cost little to make)
/// and at most the next.
const MIN_KEPT_BODY_BYTES: usize = 64 << 10;
const MAX_KEPT_BODY_BYTES: usize = 32 << 20;

static KEPT_BODIES: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());

/// An empty buffer for a response body of about `capacity` bytes: a body
/// sent before, when one is kept. A fresh multi-megabyte allocation costs
/// the kernel a zeroed page per 4 KiB written (7% of the server's time
/// while it serves an export's pages).
pub fn body_buffer(capacity: usize) -> Vec<u8> {
    if capacity >= MIN_KEPT_BODY_BYTES {
        let mut kept = KEPT_BODIES.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = kept.iter().position(|b| b.capacity() >= capacity) {
            let mut buf = kept.swap_remove(i);
            buf.clear();
            return buf;
        }
    }
    Vec::with_capacity(capacity)
}

/// Keeps a response body's buffer, once sent, for a later response.
pub fn recycle_body(body: Vec<u8>) {
    keep_body(body)
}

fn keep_body(mut body: Vec<u8>) {
    if !(MIN_KEPT_BODY_BYTES..=MAX_KEPT_BODY_BYTES).contains(&body.capacity()) {
        return;
    }
    body.clear();
    let mut kept = KEPT_BODIES.lock().unwrap_or_else(|p| p.into_inner());
    if kept.len() < MAX_KEPT_BODIES {
        kept.push(body);
    }
}

/// Writes `response`; its body's buffer is kept for a later one.
pub fn write_response(
    out: &mut impl Write,
    response: Response,
    head_only: bool,
    gzip: bool,
    keep_alive: bool,
) -> std::io::Result<()> {
    let mut response = response;
    let written = write_response_inner(out, &mut response, head_only, gzip, keep_alive);
    keep_body(std::mem::take(&mut response.body));
    written
}

/// A response as bytes to send: its head, then its body (kept apart so
/// that a large body is sent from its own buffer, never copied behind the
/// head; empty for HEAD).
#[derive(Debug)]
pub struct Encoded {
    /// Status line and headers, with the blank line.
    pub head: Vec<u8>,
    /// The body as sent (gzip-compressed when asked and worth it).
    pub body: Vec<u8>,
}

/// Encodes `response` as [`write_response`] writes it.
pub fn encode_response(
    response: Response,
    head_only: bool,
    gzip: bool,
    keep_alive: bool,
) -> std::io::Result<Encoded> {
    let mut response = response;
    let head = response_head(&mut response, head_only, gzip, keep_alive)?;
    let mut body = std::mem::take(&mut response.body);
    if head_only {
        keep_body(std::mem::take(&mut body));
    }
    Ok(Encoded { head, body })
}

/// The head of `response`, its body compressed first when `gzip` asks and
/// it is worth it (the length sent is the body's as sent).
fn response_head(
    response: &mut Response,
    head_only: bool,
    gzip: bool,
    keep_alive: bool,
) -> std::io::Result<Vec<u8>> {
    let mut encoded = false;
    if gzip && !head_only && response.body.len() >= GZIP_MIN_BYTES {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&response.body)?;
        response.body = enc.finish()?;
        encoded = true;
    }
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nX-Elastic-Product: Elasticsearch\r\ncontent-type: {}\r\ncontent-length: {}\r\n",
        response.status,
        reason(response.status),
        response.content_type,
        response.body.len()
    );
    if encoded {
        head.push_str("content-encoding: gzip\r\n");
    }
    for (name, value) in &response.headers {
        head.push_str(name);
        head.push_str(": ");
        head.push_str(value);
        head.push_str("\r\n");
    }
    if !keep_alive {
        head.push_str("connection: close\r\n");
    }
    head.push_str("\r\n");
    Ok(head.into_bytes())
}

fn write_response_inner(
    out: &mut impl Write,
    response: &mut Response,
    head_only: bool,
    gzip: bool,
    keep_alive: bool,
) -> std::io::Result<()> {
    let head = response_head(response, head_only, gzip, keep_alive)?;
    out.write_all(&head)?;
    if !head_only {
        out.write_all(&response.body)?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &[u8]) -> Result<Option<Request>, WireError> {
        read_request(&mut std::io::BufReader::new(text), 1 << 20)
    }

    #[test]
    fn a_body_past_the_first_read_gets_room_for_exactly_itself() {
        for length in [READ_AHEAD_BYTES - 1, READ_AHEAD_BYTES, (3 << 20) + 5] {
            let body: Vec<u8> = (0..length).map(|i| (i % 251) as u8).collect();
            let mut text = body.clone();
            text.extend_from_slice(b"next request");
            let mut reader = std::io::BufReader::new(&text[..]);
            let read = read_exactly(&mut reader, length).unwrap();
            assert!(read == body, "{length} bytes read back");
            assert_eq!(read.capacity(), length, "no room beyond the body");
            let mut after = Vec::new();
            reader.read_to_end(&mut after).unwrap();
            assert_eq!(after, b"next request", "nothing past the body taken");
            let short = &body[..length - 1];
            let mut reader = std::io::BufReader::new(short);
            assert!(read_exactly(&mut reader, length).is_err(), "a short body");
        }
    }

    #[test]
    fn reads_a_request_with_a_query_and_a_body() {
        let r = read(
            b"POST /a%2Fb/_search?q=x+y&size=3 HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}",
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.method, "POST");
        assert_eq!(r.path, "/a/b/_search");
        assert_eq!(r.param("q"), Some("x y"));
        assert_eq!(r.param("size"), Some("3"));
        assert_eq!(r.body, b"{}");
    }

    #[test]
    fn reads_chunked_and_gzip_bodies() {
        let r = read(b"PUT /i HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(r.body, b"abcde");
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(b"{\"a\":1}").unwrap();
        let gz = enc.finish().unwrap();
        let mut raw = format!(
            "PUT /i HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\n\r\n",
            gz.len()
        )
        .into_bytes();
        raw.extend_from_slice(&gz);
        assert_eq!(read(&raw).unwrap().unwrap().body, b"{\"a\":1}");
    }

    #[test]
    fn a_chunk_size_near_the_top_of_the_range_is_refused_not_wrapped() {
        // Chunk `1`, then one of 2^64 - 1 bytes: `len + size` wrapped and
        // the connection's thread panicked.
        let crafted = b"POST /i/_doc/1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\nffffffffffffffff\r\n";
        assert!(matches!(read(crafted), Err(WireError::BodyTooLarge { .. })));
        for bad in ["+1", "-1", " 1", "1 2", "", "10000000000000000", "0x1", "g"] {
            let raw = format!(
                "PUT /i HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{bad}\r\nx\r\n0\r\n\r\n"
            );
            assert!(
                matches!(read(raw.as_bytes()), Err(WireError::Malformed(_))),
                "chunk size {bad:?} was taken"
            );
        }
        // A size line with an extension and trailing blanks is fine.
        let r = read(b"PUT /i HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3 ;a=b\r\nabc\r\n0\r\nX-T: 1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(r.body, b"abc");
    }

    #[test]
    fn a_short_body_is_an_error_and_a_declared_one_is_not_allocated_ahead() {
        assert!(matches!(
            read(b"PUT /i HTTP/1.1\r\nContent-Length: 5\r\n\r\nab"),
            Err(WireError::Malformed(_))
        ));
        let mut reader = std::io::BufReader::new(
            &b"PUT /i HTTP/1.1\r\nContent-Length: 104857600\r\n\r\nabc"[..],
        );
        let mut request = read_request_head(&mut reader).unwrap().unwrap();
        assert!(read_body(&mut reader, &mut request, 100 << 20).is_err());
    }

    #[test]
    fn refuses_bodies_over_the_limit_and_bad_heads() {
        assert!(matches!(
            read(b"PUT /i HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n"),
            Err(WireError::BodyTooLarge { .. })
        ));
        assert!(matches!(
            read(b"NOT HTTP\r\n\r\n"),
            Err(WireError::Malformed(_))
        ));
        assert!(read(b"").unwrap().is_none());
    }
}
