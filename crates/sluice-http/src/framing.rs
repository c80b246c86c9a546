//! Where a request ends in the bytes a connection has received so far:
//! the event loop ([`crate::ring`]) buffers what arrives and asks these
//! whether a head, then a whole request, is there — without a thread
//! blocked on the socket. The limits are [`crate::wire`]'s: the head's size,
//! the body's, chunk-size lines; the same bytes read by
//! [`crate::wire::read_request`] give the same request.

use crate::wire::{self, Request, WireError, MAX_HEAD_BYTES};

/// Longest chunk-size line (the size, extensions and CRLF), as
/// [`crate::wire`] reads them.
const MAX_CHUNK_LINE_BYTES: usize = 1024;
/// Longest trailer line after the last chunk, its `\n` included.
const MAX_TRAILER_LINE_BYTES: usize = 8192;

/// The end of the request head at the start of `buf` (just past its blank
/// line), or None while it is incomplete. Blank lines before the request
/// line are skipped, as RFC 9112 2.2 allows; they count toward nothing.
pub fn head_end(buf: &[u8]) -> Result<Option<usize>, WireError> {
    let mut at = 0;
    // Leading blank lines.
    loop {
        if buf[at..].starts_with(b"\r\n") {
            at += 2;
        } else if buf[at..].starts_with(b"\n") {
            at += 1;
        } else {
            break;
        }
    }
    let start = at;
    while let Some(nl) = buf[at..].iter().position(|&b| b == b'\n') {
        let line = &buf[at..at + nl + 1];
        at += nl + 1;
        if at - start > MAX_HEAD_BYTES {
            return Err(WireError::HeadTooLarge);
        }
        if line == b"\r\n" || line == b"\n" {
            return Ok(Some(at));
        }
    }
    if buf.len() - start > MAX_HEAD_BYTES {
        return Err(WireError::HeadTooLarge);
    }
    Ok(None)
}

/// The request whose head is `head` (as [`head_end`] delimited it).
pub fn parse_head(head: &[u8]) -> Result<Request, WireError> {
    wire::read_request_head(&mut std::io::Cursor::new(head))?
        .ok_or_else(|| WireError::Malformed("an empty request head".into()))
}

/// Whether `request`'s body comes in chunks.
pub fn is_chunked(request: &Request) -> bool {
    request
        .header("transfer-encoding")
        .is_some_and(|t| t.to_ascii_lowercase().contains("chunked"))
}

/// The length of `request`'s body as sent (chunk framing included) at the
/// start of `buf`, or None while it is incomplete; an error for a body
/// over `max_body_bytes` as soon as that shows, or bad chunk framing.
pub fn body_end(
    buf: &[u8],
    request: &Request,
    max_body_bytes: usize,
) -> Result<Option<usize>, WireError> {
    if !is_chunked(request) {
        let length = wire::declared_length(request, max_body_bytes)?;
        return Ok((buf.len() >= length).then_some(length));
    }
    let mut at = 0usize;
    let mut body_bytes = 0usize;
    loop {
        let Some(line_end) = line_end(&buf[at..], MAX_CHUNK_LINE_BYTES)? else {
            return Ok(None);
        };
        let line = std::str::from_utf8(&buf[at..at + line_end])
            .map_err(|_| WireError::Malformed("a chunk-size line is not text".into()))?;
        let size = wire::chunk_size(line)?;
        at += line_end;
        if size == 0 {
            return trailers_end(buf, at);
        }
        // `body_bytes` never passes the limit: the room left is exact.
        let room = (max_body_bytes - body_bytes) as u64;
        if size > room {
            return Err(WireError::BodyTooLarge {
                limit_bytes: max_body_bytes,
            });
        }
        let size = size as usize;
        if buf.len() < at + size + 2 {
            return Ok(None);
        }
        if &buf[at + size..at + size + 2] != b"\r\n" {
            return Err(WireError::Malformed("a chunk does not end in CRLF".into()));
        }
        at += size + 2;
        body_bytes += size;
    }
}

/// The length of the line at the start of `buf` with its `\n`, None while
/// it is incomplete; an error past `max_bytes`.
fn line_end(buf: &[u8], max_bytes: usize) -> Result<Option<usize>, WireError> {
    match buf.iter().take(max_bytes).position(|&b| b == b'\n') {
        Some(nl) => Ok(Some(nl + 1)),
        None if buf.len() >= max_bytes => Err(WireError::Malformed(
            "a chunk-size line is over 1024 bytes".into(),
        )),
        None => Ok(None),
    }
}

/// Where the trailers after the last chunk end (their blank line), from
/// `at`; within the head's limit.
fn trailers_end(buf: &[u8], mut at: usize) -> Result<Option<usize>, WireError> {
    let start = at;
    loop {
        let Some(nl) = buf[at..].iter().position(|&b| b == b'\n') else {
            if buf.len() - start > MAX_HEAD_BYTES {
                return Err(WireError::HeadTooLarge);
            }
            if buf.len() - at >= MAX_TRAILER_LINE_BYTES {
                return Err(WireError::Malformed(
                    "a trailer line is over 8192 bytes".into(),
                ));
            }
            return Ok(None);
        };
        if nl >= MAX_TRAILER_LINE_BYTES {
            return Err(WireError::Malformed(
                "a trailer line is over 8192 bytes".into(),
            ));
        }
        let line = &buf[at..at + nl + 1];
        at += nl + 1;
        if at - start > MAX_HEAD_BYTES {
            return Err(WireError::HeadTooLarge);
        }
        // Blank as the stream reader judges it: text that trims to nothing.
        let text = std::str::from_utf8(line)
            .map_err(|_| WireError::Malformed("a trailer line is not text".into()))?;
        if text.trim().is_empty() {
            return Ok(Some(at));
        }
    }
}

/// Sets `request`'s body from its bytes as sent (`raw`, as [`body_end`]
/// delimited them): chunks joined, gzip inflated. A plain body is taken
/// as it is, without a copy.
pub fn set_body(
    request: &mut Request,
    raw: Vec<u8>,
    max_body_bytes: usize,
) -> Result<(), WireError> {
    if is_chunked(request) {
        let mut cursor = std::io::Cursor::new(&raw[..]);
        let mut plain = Request {
            headers: request
                .headers
                .iter()
                .filter(|(n, _)| n == "transfer-encoding" || n == "content-encoding")
                .cloned()
                .collect(),
            ..Request::default()
        };
        wire::read_body(&mut cursor, &mut plain, max_body_bytes)?;
        request.body = plain.body;
        return Ok(());
    }
    wire::decode_content(request, raw, max_body_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames `raw` as the event loop does, byte by byte growing: the
    /// request it makes once whole, and how many bytes it took.
    fn frame_growing(raw: &[u8], max: usize) -> Result<(Request, usize), WireError> {
        for have in 0..=raw.len() {
            let buf = &raw[..have];
            let Some(head) = head_end(buf)? else { continue };
            let mut request = parse_head(&buf[..head])?;
            let Some(body) = body_end(&buf[head..], &request, max)? else {
                continue;
            };
            set_body(&mut request, buf[head..head + body].to_vec(), max)?;
            return Ok((request, head + body));
        }
        Err(WireError::Malformed("never whole".into()))
    }

    fn same_as_the_stream_reader(raw: &[u8]) {
        let (framed, used) = frame_growing(raw, 1 << 20).unwrap();
        let read = wire::read_request(&mut std::io::BufReader::new(raw), 1 << 20)
            .unwrap()
            .unwrap();
        assert_eq!(framed.method, read.method);
        assert_eq!(framed.path, read.path);
        assert_eq!(framed.params, read.params);
        assert_eq!(framed.headers, read.headers);
        assert_eq!(framed.body, read.body);
        assert_eq!(used, raw.len(), "{:?}", String::from_utf8_lossy(raw));
    }

    #[test]
    fn framing_gives_what_the_stream_reader_gives() {
        same_as_the_stream_reader(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n");
        same_as_the_stream_reader(b"\r\n\r\nGET /x?a=1 HTTP/1.1\r\n\r\n");
        same_as_the_stream_reader(b"POST /i/_search HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}");
        same_as_the_stream_reader(b"PUT /i HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
        same_as_the_stream_reader(b"PUT /i HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3 ;a=b\r\nabc\r\n0\r\nX-T: 1\r\n\r\n");
        // Found by fuzzing: a trailer line of a vertical tab is blank to the
        // stream reader (`str::trim`), so it ends the trailers here too.
        same_as_the_stream_reader(
            b"PUT /i HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0 \nX: y\n\x0b\t \r\n",
        );
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut enc, b"{\"a\":1}").unwrap();
        let gz = enc.finish().unwrap();
        let mut raw = format!(
            "PUT /i HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\n\r\n",
            gz.len()
        )
        .into_bytes();
        raw.extend_from_slice(&gz);
        same_as_the_stream_reader(&raw);
    }

    /// Requests built from pieces that stress the framing: leading blank
    /// lines, chunked and plain bodies, trailers, bad sizes, cut short.
    fn arbitrary_request() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let chunk = prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..40).prop_map(|d| {
                let mut c = format!("{:x}\r\n", d.len()).into_bytes();
                c.extend_from_slice(&d);
                c.extend_from_slice(b"\r\n");
                c
            }),
            Just(b"zz\r\nab\r\n".to_vec()),
            Just(b"3\r\nabcXY".to_vec()),
        ];
        (
            0..3usize,
            any::<bool>(),
            proptest::collection::vec(chunk, 0..4),
            proptest::collection::vec(any::<u8>(), 0..60),
            0..200usize,
        )
            .prop_map(|(blanks, chunked, chunks, body, cut)| {
                let mut raw = b"\r\n".repeat(blanks);
                if chunked {
                    raw.extend_from_slice(
                        b"POST /i/_bulk?x=1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                    );
                    for c in chunks {
                        raw.extend_from_slice(&c);
                    }
                    raw.extend_from_slice(b"0\r\nX-T: 1\r\n\r\n");
                } else {
                    raw.extend_from_slice(
                        format!("PUT /d HTTP/1.1\r\nContent-Length: {}\r\n\r\n", body.len())
                            .as_bytes(),
                    );
                    raw.extend_from_slice(&body);
                }
                let keep = raw.len().saturating_sub(cut % 8);
                raw.truncate(keep);
                raw
            })
    }

    fn outcome(r: Result<Request, WireError>) -> Option<(String, String, Vec<u8>)> {
        r.ok().map(|q| (q.method, q.path, q.body))
    }

    proptest::proptest! {
        /// Whatever the bytes, the framing and the stream reader agree:
        /// the same request when whole, nothing when cut short or bad; and
        /// no prefix of the bytes frames to anything else.
        #[test]
        fn framing_and_the_stream_reader_agree(raw in arbitrary_request()) {
            let read = wire::read_request(&mut std::io::BufReader::new(&raw[..]), 1 << 20)
                .ok()
                .flatten()
                .map(|q| (q.method, q.path, q.body));
            let framed = outcome(frame_growing(&raw, 1 << 20).map(|(q, _)| q));
            proptest::prop_assert_eq!(read, framed);
        }
    }

    #[test]
    fn pipelined_requests_are_framed_one_at_a_time() {
        let raw = b"POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /b HTTP/1.1\r\n\r\n";
        let (first, used) = frame_growing(raw, 1 << 20).unwrap();
        assert_eq!(
            (first.path.as_str(), first.body.as_slice()),
            ("/a", &b"abc"[..])
        );
        let (second, rest) = frame_growing(&raw[used..], 1 << 20).unwrap();
        assert_eq!(second.path, "/b");
        assert_eq!(used + rest, raw.len());
    }

    #[test]
    fn limits_are_the_stream_readers() {
        let over = format!("PUT /i HTTP/1.1\r\nContent-Length: {}\r\n\r\n", 2 << 20);
        let head = head_end(over.as_bytes()).unwrap().unwrap();
        let request = parse_head(&over.as_bytes()[..head]).unwrap();
        assert!(matches!(
            body_end(b"", &request, 1 << 20),
            Err(WireError::BodyTooLarge { .. })
        ));
        // A chunk past the limit is refused before its bytes come.
        let chunked = b"PUT /i HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        let request = parse_head(chunked).unwrap();
        assert!(matches!(
            body_end(b"1\r\na\r\nffffffffffffffff\r\n", &request, 1 << 20),
            Err(WireError::BodyTooLarge { .. })
        ));
        assert!(matches!(
            body_end(b"3\r\nabcX\r\n", &request, 1 << 20),
            Err(WireError::Malformed(_))
        ));
        assert!(matches!(
            body_end(&[b'1'; 2000], &request, 1 << 20),
            Err(WireError::Malformed(_))
        ));
        assert!(matches!(
            body_end(b"zz\r\n", &request, 1 << 20),
            Err(WireError::Malformed(_))
        ));
        // A head that never ends is refused at the head's limit.
        let endless = vec![b'a'; MAX_HEAD_BYTES + 1];
        assert!(matches!(head_end(&endless), Err(WireError::HeadTooLarge)));
        let many_lines = b"GET / HTTP/1.1\r\n"
            .iter()
            .copied()
            .chain(b"X: y\r\n".repeat(MAX_HEAD_BYTES / 6))
            .collect::<Vec<u8>>();
        assert!(matches!(
            head_end(&many_lines),
            Err(WireError::HeadTooLarge)
        ));
        assert!(head_end(b"GET / HTTP/1.1\r\nHost: h\r\n")
            .unwrap()
            .is_none());
    }
}
