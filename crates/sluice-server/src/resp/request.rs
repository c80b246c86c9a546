//! Client requests as Redis 7 reads them: RESP multibulk (`*N` then N
//! bulk strings) or an inline command (one line, split like a shell line
//! with Redis's quoting rules). The limits and every protocol error text
//! are Redis's own, so an unmodified client sees the same replies; the
//! differential test in tests/resp_redis.rs sends the same bytes to a real
//! `redis-server` and to this reader and compares the replies.
//!
//! A protocol error ends the connection: Redis replies with the error and
//! closes, as the rest of the stream can no longer be framed.

/// Longest inline command, and longest count line (`*N`, `$N`) that may
/// wait for its end, in bytes (Redis's PROTO_INLINE_MAX_SIZE).
pub const INLINE_MAX_BYTES: usize = 64 * 1024;
/// Most arguments of one multibulk request (Redis: INT_MAX).
pub const MULTIBULK_MAX: i64 = i32::MAX as i64;
/// Default longest bulk string (Redis's `proto-max-bulk-len`, 512 MiB).
pub const DEFAULT_BULK_MAX_BYTES: i64 = 512 << 20;
/// Most arguments a client that has not authenticated may send at once.
pub const UNAUTHENTICATED_MULTIBULK_MAX: i64 = 10;
/// Longest bulk string a client that has not authenticated may send.
pub const UNAUTHENTICATED_BULK_MAX_BYTES: i64 = 16384;

/// The limits a reader enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// See [`INLINE_MAX_BYTES`].
    pub inline_max_bytes: usize,
    /// Longest bulk string (`proto-max-bulk-len`).
    pub bulk_max_bytes: i64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            inline_max_bytes: INLINE_MAX_BYTES,
            bulk_max_bytes: DEFAULT_BULK_MAX_BYTES,
        }
    }
}

/// A request that cannot be framed: the text Redis replies with (after
/// `-ERR `), e.g. `Protocol error: invalid bulk length`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl ProtocolError {
    fn new(text: impl Into<String>) -> Self {
        // Redis replaces line breaks in error texts (a `\r` can be the
        // character reported after "got").
        ProtocolError(
            text.into()
                .chars()
                .map(|c| if c == '\r' || c == '\n' { ' ' } else { c })
                .collect(),
        )
    }

    /// The reply: `-ERR <text>\r\n`.
    pub fn reply(&self) -> Vec<u8> {
        format!("-ERR {}\r\n", self.0).into_bytes()
    }
}

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProtocolError {}

/// One request: its arguments (the command name first). Never empty.
pub type Args = Vec<Vec<u8>>;

/// Framed bytes a reader keeps before it moves the unframed rest to the
/// front of its buffer.
const COMPACT_AFTER_BYTES: usize = 16 << 10;

/// A bulk this long or longer gets a buffer sized for it as soon as its
/// header is in (Redis's `PROTO_MBULK_BIG_ARG`).
const BIG_BULK_BYTES: usize = 32 << 10;

/// Room an empty reader keeps for the next requests; a buffer grown past
/// it by a large request is let go once that request is framed.
const KEEP_CAPACITY_BYTES: usize = 1 << 20;

/// Frames requests out of the bytes a client sends, in order.
#[derive(Debug, Default)]
pub struct RequestReader {
    buf: Vec<u8>,
    /// Start of the first byte not yet consumed.
    pos: usize,
    limits: Limits,
    /// Where the plain GETs not yet shown by
    /// [`RequestReader::plain_gets_ahead`] start, and how many it showed
    /// that are not served yet (a hint: wrong, it only shows other keys).
    ahead_from: usize,
    ahead_gets: usize,
}

/// What one step of framing found.
enum Step {
    /// A request (or an empty one, which Redis skips without a reply).
    Request(Option<Args>),
    /// The bytes so far end inside a request.
    Incomplete,
}

impl RequestReader {
    /// A reader with these limits.
    pub fn new(limits: Limits) -> Self {
        RequestReader {
            buf: Vec::new(),
            pos: 0,
            limits,
            ahead_from: 0,
            ahead_gets: 0,
        }
    }

    /// Appends bytes received from the client.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.compact();
        self.buf.extend_from_slice(bytes);
    }

    /// Lets `fill` append received bytes straight to the reader's buffer
    /// (a shared-memory ring copies into it with no buffer between).
    pub fn feed_with<T>(&mut self, fill: impl FnOnce(&mut Vec<u8>) -> T) -> T {
        self.compact();
        fill(&mut self.buf)
    }

    fn compact(&mut self) {
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
            if self.buf.capacity() > KEEP_CAPACITY_BYTES {
                // A request of hundreds of MiB is done: its room goes back
                // (Redis shrinks an idle query buffer too).
                self.buf = Vec::new();
            }
        } else if self.pos >= COMPACT_AFTER_BYTES && self.pos * 2 >= self.buf.len() {
            // A pipelining client nearly always leaves part of a request
            // behind: drop the framed bytes before they pile up.
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        if self.pos == 0 {
            // The bytes moved: what was shown ahead is looked at again.
            (self.ahead_from, self.ahead_gets) = (0, 0);
        }
    }

    /// Bytes the reader holds, framed or not (its memory).
    pub fn held_bytes(&self) -> usize {
        self.buf.len()
    }

    /// Bytes received and not yet framed (what Redis calls the query
    /// buffer's pending part).
    pub fn pending_bytes(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next complete request, None when more bytes are needed, or the
    /// protocol error that ends the connection. `unauthenticated`: the
    /// client must still authenticate, which tightens the limits.
    pub fn next(&mut self, unauthenticated: bool) -> Result<Option<Args>, ProtocolError> {
        loop {
            if self.pos == self.buf.len() {
                return Ok(None);
            }
            let step = if self.buf[self.pos] == b'*' {
                self.multibulk(unauthenticated)?
            } else {
                self.inline()?
            };
            match step {
                Step::Incomplete => return Ok(None),
                Step::Request(Some(args)) => return Ok(Some(args)),
                Step::Request(None) => continue,
            }
        }
    }

    /// If the next request is a whole `SET key value` in plain RESP
    /// (`*3`, `$3`, `SET` in any case, lengths in plain digits within the
    /// bulk limit), its key, its value and its length in bytes, borrowed
    /// where they lie; consumed only by [`RequestReader::consume`]. None
    /// for anything else, which [`RequestReader::next`] frames (into
    /// these same three arguments, for a request this takes). For an
    /// authenticated client only: the tighter limits before AUTH are not
    /// looked at.
    pub fn peek_plain_set(&self) -> Option<(&[u8], &[u8], usize)> {
        const HEAD: &[u8] = b"*3\r\n$3\r\nSET\r\n";
        let rest = &self.buf[self.pos..];
        let head = rest.get(..HEAD.len())?;
        if !head.eq_ignore_ascii_case(HEAD) {
            return None;
        }
        let (key, at) = self.plain_bulk(rest, HEAD.len())?;
        let (value, end) = self.plain_bulk(rest, at)?;
        Some((key, value, end))
    }

    /// Takes the next request, a whole plain `SET key value`
    /// ([`RequestReader::peek_plain_set`]), with the buffer it lies in:
    /// the buffer (cut after the request), where the key and the value lie
    /// in it. The bytes received after the request stay in the reader (in
    /// a buffer of their own). For a large value: it is then held where it
    /// arrived, never copied. None if the next request is no plain SET.
    pub fn take_plain_set(
        &mut self,
    ) -> Option<(Vec<u8>, std::ops::Range<usize>, std::ops::Range<usize>)> {
        let (key, value, len) = self.peek_plain_set()?;
        let base = self.buf.as_ptr() as usize;
        let key_at = key.as_ptr() as usize - base;
        let value_at = value.as_ptr() as usize - base;
        let (key, value) = (key_at..key_at + key.len(), value_at..value_at + value.len());
        let end = self.pos + len;
        let mut taken = std::mem::take(&mut self.buf);
        self.buf = taken[end..].to_vec();
        taken.truncate(end);
        self.pos = 0;
        (self.ahead_from, self.ahead_gets) = (0, 0);
        Some((taken, key, value))
    }

    /// [`RequestReader::peek_plain_set`] for a whole `GET key`: the key and
    /// the request's length in bytes.
    pub fn peek_plain_get(&self) -> Option<(&[u8], usize)> {
        self.plain_get_at(self.pos)
    }

    /// [`RequestReader::peek_plain_get`] of the request at `at`.
    fn plain_get_at(&self, at: usize) -> Option<(&[u8], usize)> {
        const HEAD: &[u8] = b"*2\r\n$3\r\nGET\r\n";
        let rest = self.buf.get(at..)?;
        if !rest.get(..HEAD.len())?.eq_ignore_ascii_case(HEAD) {
            return None;
        }
        self.plain_bulk(rest, HEAD.len())
    }

    /// Shows `f` the keys of the plain GETs queued from the next request
    /// on, each once, keeping up to `window` shown ahead of those served:
    /// for a server to ask the memory for what they will read while it
    /// serves the ones before them.
    pub fn plain_gets_ahead(&mut self, window: usize, mut f: impl FnMut(&[u8])) {
        if self.ahead_from < self.pos || self.ahead_from > self.buf.len() {
            self.ahead_from = self.pos;
            self.ahead_gets = 0;
        }
        while self.ahead_gets < window {
            let Some((key, len)) = self.plain_get_at(self.ahead_from) else {
                break;
            };
            f(key);
            self.ahead_from += len;
            self.ahead_gets += 1;
        }
    }

    /// If the next request is a whole `PING` with no message in plain RESP
    /// (`*1`, `$4`, `PING` in any case), its length in bytes; consumed
    /// only by [`RequestReader::consume`].
    pub fn peek_plain_ping(&self) -> Option<usize> {
        const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";
        let rest = self.buf.get(self.pos..self.pos + PING.len())?;
        rest.eq_ignore_ascii_case(PING).then_some(PING.len())
    }

    /// The bulk string `$N\r\n<N bytes>` and two more bytes at `at` of
    /// `rest`, N in plain digits (no sign, no leading zero); where the
    /// next starts.
    fn plain_bulk<'a>(&self, rest: &'a [u8], at: usize) -> Option<(&'a [u8], usize)> {
        if rest.get(at) != Some(&b'$') {
            return None;
        }
        let digits_at = at + 1;
        let digits = rest[digits_at..]
            .iter()
            .take(11)
            .take_while(|d| d.is_ascii_digit())
            .count();
        if digits == 0 || digits > 10 || (digits > 1 && rest[digits_at] == b'0') {
            return None;
        }
        let len = rest[digits_at..digits_at + digits]
            .iter()
            .fold(0i64, |n, d| n * 10 + i64::from(d - b'0'));
        if len > self.limits.bulk_max_bytes {
            return None;
        }
        let start = digits_at + digits + 2;
        if rest.get(digits_at + digits..start)? != b"\r\n" {
            return None;
        }
        // The two bytes after the bulk are skipped unread, as Redis does.
        let end = start + len as usize + 2;
        (rest.len() >= end).then(|| (&rest[start..start + len as usize], end))
    }

    /// Consumes `len` bytes of framed request ([`RequestReader::peek_plain_set`],
    /// [`RequestReader::peek_plain_get`]).
    pub fn consume(&mut self, len: usize) {
        assert!(len <= self.pending_bytes(), "consumed past the bytes held");
        self.pos += len;
        self.ahead_gets = self.ahead_gets.saturating_sub(1);
    }

    fn inline(&mut self) -> Result<Step, ProtocolError> {
        let rest = &self.buf[self.pos..];
        // Redis looks for the line's end in a C string: a NUL ends the
        // search as if no end had arrived.
        let Some(newline) = c_find(rest, b'\n') else {
            if rest.len() > self.limits.inline_max_bytes {
                return Err(ProtocolError::new("Protocol error: too big inline request"));
            }
            return Ok(Step::Incomplete);
        };
        let line_end = if newline > 0 && rest[newline - 1] == b'\r' {
            newline - 1
        } else {
            newline
        };
        let args = split_args(&rest[..line_end])
            .ok_or_else(|| ProtocolError::new("Protocol error: unbalanced quotes in request"))?;
        self.pos += newline + 1;
        Ok(Step::Request((!args.is_empty()).then_some(args)))
    }

    fn multibulk(&mut self, unauthenticated: bool) -> Result<Step, ProtocolError> {
        let mut at = self.pos;
        let Some((count, next)) = self.count_line(at, "mbulk")? else {
            return Ok(Step::Incomplete);
        };
        let count = match string_to_i64(count) {
            Some(n) if n <= MULTIBULK_MAX => n,
            _ => {
                return Err(ProtocolError::new(
                    "Protocol error: invalid multibulk length",
                ))
            }
        };
        if count > UNAUTHENTICATED_MULTIBULK_MAX && unauthenticated {
            return Err(ProtocolError::new(
                "Protocol error: unauthenticated multibulk length",
            ));
        }
        at = next;
        if count <= 0 {
            self.pos = at;
            return Ok(Step::Request(None));
        }
        // Arguments are framed one at a time; nothing is consumed until the
        // whole request is here, but each header is checked as it arrives.
        let mut args: Args = Vec::with_capacity(count.min(1024) as usize);
        for _ in 0..count {
            let Some((header, next)) = self.count_line(at, "bulk")? else {
                return Ok(Step::Incomplete);
            };
            if self.buf[at] != b'$' {
                return Err(ProtocolError::new(format!(
                    "Protocol error: expected '$', got '{}'",
                    self.buf[at] as char
                )));
            }
            let len = match string_to_i64(&header[1..]) {
                Some(n) if (0..=self.limits.bulk_max_bytes).contains(&n) => n,
                _ => return Err(ProtocolError::new("Protocol error: invalid bulk length")),
            };
            if len > UNAUTHENTICATED_BULK_MAX_BYTES && unauthenticated {
                return Err(ProtocolError::new(
                    "Protocol error: unauthenticated bulk length",
                ));
            }
            let len = len as usize;
            // The bulk and the two bytes after it (Redis skips them
            // without looking).
            if self.buf.len() - next < len + 2 {
                // A big bulk gets room for exactly itself: grown by
                // doubling, a 512 MiB value would be copied on its way in
                // and held in room for 1 GiB (Redis sizes its query buffer
                // for a big argument too).
                let end = next + len + 2;
                if len >= BIG_BULK_BYTES && self.buf.capacity() < end {
                    self.buf.reserve_exact(end - self.buf.len());
                }
                return Ok(Step::Incomplete);
            }
            args.push(self.buf[next..next + len].to_vec());
            at = next + len + 2;
        }
        self.pos = at;
        Ok(Step::Request(Some(args)))
    }

    /// The count line at `at` (`*N` or `$N`, without the marker for `*`):
    /// its bytes and where the next line starts; None until it has ended.
    fn count_line(&self, at: usize, what: &str) -> Result<Option<(&[u8], usize)>, ProtocolError> {
        let rest = &self.buf[at..];
        let Some(cr) = c_find(rest, b'\r') else {
            if rest.len() > self.limits.inline_max_bytes {
                return Err(ProtocolError::new(format!(
                    "Protocol error: too big {what} count string"
                )));
            }
            return Ok(None);
        };
        // The line needs its '\n' too (Redis does not check that it is one).
        if cr + 2 > rest.len() {
            return Ok(None);
        }
        let line = if what == "mbulk" {
            &rest[1..cr]
        } else {
            &rest[..cr]
        };
        Ok(Some((line, at + cr + 2)))
    }
}

/// The first `byte` before any NUL, as `strchr` on a C string finds it.
fn c_find(bytes: &[u8], byte: u8) -> Option<usize> {
    bytes
        .iter()
        .position(|&b| b == byte || b == 0)
        .filter(|&i| bytes[i] == byte)
}

/// A decimal integer the way Redis's `string2ll` accepts it: an optional
/// `-`, no `+`, no leading zeros, no spaces, within i64.
pub fn string_to_i64(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() >= 21 {
        return None;
    }
    if s == b"0" {
        return Some(0);
    }
    let (negative, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    match digits.first() {
        Some(b'1'..=b'9') => {}
        _ => return None,
    }
    let mut value: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_add((d - b'0') as u64)?;
    }
    if negative {
        if value > i64::MAX as u64 + 1 {
            return None;
        }
        Some((value as i64).wrapping_neg())
    } else {
        i64::try_from(value).ok()
    }
}

/// Splits an inline command the way Redis's `sdssplitargs` does: words
/// separated by blanks; `"..."` with `\n \r \t \b \a \xHH` and `\<c>`
/// escapes; `'...'` with `\'`; a closing quote must be followed by a
/// blank or the end. A NUL ends the line. None: unbalanced quotes.
pub fn split_args(line: &[u8]) -> Option<Args> {
    let end = line.iter().position(|&b| b == 0).unwrap_or(line.len());
    let line = &line[..end];
    let is_blank = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c);
    let mut args = Vec::new();
    let mut p = 0;
    loop {
        while p < line.len() && is_blank(line[p]) {
            p += 1;
        }
        if p == line.len() {
            return Some(args);
        }
        let mut current = Vec::new();
        let (mut in_double, mut in_single) = (false, false);
        loop {
            let c = line.get(p).copied();
            if in_double {
                match c {
                    None => return None,
                    Some(b'\\')
                        if line.get(p + 1) == Some(&b'x')
                            && line.get(p + 2).is_some_and(u8::is_ascii_hexdigit)
                            && line.get(p + 3).is_some_and(u8::is_ascii_hexdigit) =>
                    {
                        let hex = |b: u8| (b as char).to_digit(16).unwrap_or(0) as u8;
                        current.push(hex(line[p + 2]) * 16 + hex(line[p + 3]));
                        p += 3;
                    }
                    Some(b'\\') if p + 1 < line.len() => {
                        p += 1;
                        current.push(match line[p] {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            b'b' => 0x08,
                            b'a' => 0x07,
                            other => other,
                        });
                    }
                    Some(b'"') => {
                        // The closing quote must be followed by a blank.
                        if line.get(p + 1).is_some_and(|&b| !is_blank(b)) {
                            return None;
                        }
                        p += 1;
                        break;
                    }
                    Some(other) => current.push(other),
                }
            } else if in_single {
                match c {
                    None => return None,
                    Some(b'\\') if line.get(p + 1) == Some(&b'\'') => {
                        p += 1;
                        current.push(b'\'');
                    }
                    Some(b'\'') => {
                        if line.get(p + 1).is_some_and(|&b| !is_blank(b)) {
                            return None;
                        }
                        p += 1;
                        break;
                    }
                    Some(other) => current.push(other),
                }
            } else {
                match c {
                    None | Some(b' ' | b'\n' | b'\r' | b'\t') => break,
                    Some(b'"') => in_double = true,
                    Some(b'\'') => in_single = true,
                    Some(other) => current.push(other),
                }
            }
            p += 1;
        }
        args.push(current);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(bytes: &[u8], unauthenticated: bool) -> (Vec<Args>, Option<ProtocolError>) {
        let mut r = RequestReader::new(Limits::default());
        r.feed(bytes);
        let mut out = Vec::new();
        loop {
            match r.next(unauthenticated) {
                Ok(Some(args)) => out.push(args),
                Ok(None) => return (out, None),
                Err(e) => return (out, Some(e)),
            }
        }
    }

    fn strs(args: &[Args]) -> Vec<Vec<String>> {
        args.iter()
            .map(|a| {
                a.iter()
                    .map(|x| String::from_utf8_lossy(x).into())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn frames_multibulk_and_inline_requests_in_order() {
        let (got, err) = read_all(
            b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\nPING\r\n\r\n*0\r\n*-1\r\nSET a \"b c\"\n",
            false,
        );
        assert_eq!(err, None);
        assert_eq!(
            strs(&got),
            [vec!["ECHO", "hi"], vec!["PING"], vec!["SET", "a", "b c"]]
        );
    }

    #[test]
    fn a_pipelining_client_that_always_leaves_a_partial_request_holds_bounded_memory() {
        let mut r = RequestReader::new(Limits::default());
        let request = b"*2\r\n$3\r\nGET\r\n$6\r\nkey:01\r\n";
        let mut stream = Vec::new();
        for _ in 0..20_000 {
            stream.extend_from_slice(request);
        }
        // Chunks that end inside a request: the reader never runs dry.
        for chunk in stream.chunks(1000) {
            r.feed(chunk);
            while let Ok(Some(args)) = r.next(false) {
                assert_eq!(args[1], b"key:01");
            }
            assert!(r.pending_bytes() < request.len());
            assert!(r.held_bytes() < 64 << 10, "{} bytes held", r.held_bytes());
        }
    }

    #[test]
    fn a_request_split_anywhere_is_framed_once_it_is_whole() {
        let whole = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nvalue\r\n";
        for cut in 0..whole.len() {
            let mut r = RequestReader::new(Limits::default());
            r.feed(&whole[..cut]);
            assert_eq!(r.next(false), Ok(None), "cut at {cut}");
            r.feed(&whole[cut..]);
            let args = r.next(false).unwrap().unwrap();
            assert_eq!(args, [b"SET".to_vec(), b"k".to_vec(), b"value".to_vec()]);
            assert_eq!(r.pending_bytes(), 0);
        }
    }

    #[test]
    fn protocol_errors_carry_redis_texts() {
        let err = |b: &[u8]| read_all(b, false).1.map(|e| e.0);
        assert_eq!(
            err(b"*3000000000\r\n").as_deref(),
            Some("Protocol error: invalid multibulk length")
        );
        assert_eq!(
            err(b"*01\r\n").as_deref(),
            Some("Protocol error: invalid multibulk length")
        );
        assert_eq!(
            err(b"*1\r\nfoo\r\n").as_deref(),
            Some("Protocol error: expected '$', got 'f'")
        );
        assert_eq!(
            err(b"*1\r\n\r\n").as_deref(),
            Some("Protocol error: expected '$', got ' '")
        );
        assert_eq!(
            err(b"*1\r\n$-1\r\n").as_deref(),
            Some("Protocol error: invalid bulk length")
        );
        assert_eq!(
            err(b"ECHO \"a\n").as_deref(),
            Some("Protocol error: unbalanced quotes in request")
        );
        assert_eq!(
            err(b"ECHO \"a\"b\n").as_deref(),
            Some("Protocol error: unbalanced quotes in request")
        );
        let long = vec![b'a'; INLINE_MAX_BYTES + 1];
        assert_eq!(
            err(&long).as_deref(),
            Some("Protocol error: too big inline request")
        );
        let mut count = b"*".to_vec();
        count.extend(vec![b'1'; INLINE_MAX_BYTES + 1]);
        assert_eq!(
            err(&count).as_deref(),
            Some("Protocol error: too big mbulk count string")
        );
        let e = read_all(b"*11\r\n", true).1.unwrap();
        assert_eq!(e.0, "Protocol error: unauthenticated multibulk length");
        let e = read_all(b"*1\r\n$16385\r\n", true).1.unwrap();
        assert_eq!(e.0, "Protocol error: unauthenticated bulk length");
        assert_eq!(
            e.reply(),
            b"-ERR Protocol error: unauthenticated bulk length\r\n"
        );
    }

    #[test]
    fn inline_quoting_follows_redis() {
        let one = |s: &[u8]| split_args(s).map(|a| strs(&[a]).remove(0));
        assert_eq!(
            one(br#"a "b\x41\n" 'c\'d' e"#).unwrap(),
            ["a", "bA\n", "c'd", "e"]
        );
        assert_eq!(one(b"  ").unwrap(), Vec::<String>::new());
        assert_eq!(one(b"a\0b c").unwrap(), ["a"]);
        assert_eq!(one(br#"x"y z""#).unwrap(), ["xy z"]);
        assert_eq!(one(b"'a'b"), None);
    }

    #[test]
    fn counts_are_read_like_redis_string2ll() {
        for (s, want) in [
            (&b"0"[..], Some(0)),
            (b"-1", Some(-1)),
            (b"9223372036854775807", Some(i64::MAX)),
            (b"-9223372036854775808", Some(i64::MIN)),
            (b"9223372036854775808", None),
            (b"01", None),
            (b"+1", None),
            (b"-0", None),
            (b"", None),
            (b"1 ", None),
        ] {
            assert_eq!(string_to_i64(s), want, "{}", String::from_utf8_lossy(s));
        }
    }

    /// What `next` frames of `bytes`, and how many bytes it consumed.
    fn framed_by_next(bytes: &[u8]) -> (Option<Args>, usize) {
        let mut r = RequestReader::new(Limits::default());
        r.feed(bytes);
        let args = r.next(false).ok().flatten();
        (args, r.pos)
    }

    #[test]
    fn a_plain_set_taken_with_its_buffer_leaves_the_bytes_after_it() {
        let mut r = RequestReader::new(Limits::default());
        r.feed(b"*1\r\n$4\r\nPING\r\n*3\r\n$3\r\nSET\r\n$2\r\nkk\r\n$5\r\nvalue\r\n*2\r\n$3\r\nGE");
        assert_eq!(r.take_plain_set(), None, "PING comes first");
        assert_eq!(strs(&[r.next(false).unwrap().unwrap()]), [["PING"]]);
        let (buf, key, value) = r.take_plain_set().expect("a plain SET");
        assert_eq!((&buf[key], &buf[value]), (&b"kk"[..], &b"value"[..]));
        assert!(buf.ends_with(b"value\r\n"), "cut after the request");
        r.feed(b"T\r\n$2\r\nkk\r\n");
        assert_eq!(strs(&[r.next(false).unwrap().unwrap()]), [["GET", "kk"]]);
        assert_eq!(r.pending_bytes(), 0);
    }

    #[test]
    fn a_plain_set_is_framed_in_place_and_anything_else_is_left() {
        let mut r = RequestReader::new(Limits::default());
        r.feed(b"*3\r\n$3\r\nsEt\r\n$1\r\nk\r\n$3\r\nv\r\n\r\n*1\r\n$4\r\nPING\r\n");
        let (key, value, len) = r.peek_plain_set().expect("a plain SET");
        assert_eq!((key, value, len), (&b"k"[..], &b"v\r\n"[..], 29));
        r.consume(len);
        assert_eq!(r.peek_plain_set(), None, "PING is no SET");
        assert_eq!(strs(&[r.next(false).unwrap().unwrap()]), [["PING"]]);
        for other in [
            &b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv"[..], // not whole yet
            b"*3\r\n$3\r\nSET\r\n$01\r\nk\r\n$1\r\nv\r\n", // a leading zero
            b"*3\r\n$3\r\nSET\r\n$+1\r\nk\r\n$1\r\nv\r\n", // a sign
            b"*3\r\n$3\r\nSET\r\n$1\rxk\r\n$1\r\nv\r\n",   // no line feed
            b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$2\r\nNX\r\n",
            b"*3\r\n$3\r\nGET\r\n$1\r\nk\r\n$1\r\nv\r\n",
            b"SET k v\r\n",
        ] {
            let mut r = RequestReader::new(Limits::default());
            r.feed(other);
            assert_eq!(
                r.peek_plain_set(),
                None,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
        let mut small = RequestReader::new(Limits {
            bulk_max_bytes: 2,
            ..Limits::default()
        });
        small.feed(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nabc\r\n");
        assert_eq!(small.peek_plain_set(), None, "past the bulk limit");
    }

    proptest::proptest! {
        /// Whatever a plain SET frames, the general path frames the same:
        /// the three arguments, and the same bytes consumed.
        #[test]
        fn a_plain_set_frames_as_next_does(
            name in proptest::sample::select(vec!["SET", "set", "Set", "GET"]),
            key in proptest::collection::vec(proptest::num::u8::ANY, 0..40),
            value in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
            key_len_shift in 0usize..3,
            cut in 0usize..400,
        ) {
            let key_len = key.len().saturating_sub(key_len_shift);
            let mut bytes = format!("*3\r\n$3\r\n{name}\r\n${key_len}\r\n").into_bytes();
            bytes.extend_from_slice(&key);
            bytes.extend_from_slice(format!("\r\n${}\r\n", value.len()).as_bytes());
            bytes.extend_from_slice(&value);
            bytes.extend_from_slice(b"\r\n");
            bytes.truncate(cut.max(1).min(bytes.len()));
            let mut r = RequestReader::new(Limits::default());
            r.feed(&bytes);
            if let Some((k, v, len)) = r.peek_plain_set() {
                let (args, consumed) = framed_by_next(&bytes);
                let args = args.expect("next frames it too");
                proptest::prop_assert_eq!(args, vec![name.as_bytes().to_vec(), k.to_vec(), v.to_vec()]);
                proptest::prop_assert_eq!(consumed, len);
                proptest::prop_assert!(name.eq_ignore_ascii_case("set"));
            }
        }
    }

    #[test]
    fn plain_gets_ahead_shows_each_queued_get_once_within_its_window() {
        let get = |k: &str| format!("*2\r\n$3\r\nGET\r\n${}\r\n{k}\r\n", k.len());
        let mut r = RequestReader::new(Limits::default());
        let mut bytes: String = ["a", "b", "c", "d"].map(get).concat();
        bytes.push_str("*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$1\r\n1\r\n");
        bytes.push_str(&get("e"));
        r.feed(bytes.as_bytes());
        let shown = |r: &mut RequestReader| {
            let mut keys = Vec::new();
            r.plain_gets_ahead(2, |k| keys.push(String::from_utf8(k.to_vec()).unwrap()));
            keys
        };
        assert_eq!(shown(&mut r), ["a", "b"]);
        assert!(shown(&mut r).is_empty(), "each once");
        for next in ["c", "d"] {
            let (_, len) = r.peek_plain_get().unwrap();
            r.consume(len);
            assert_eq!(shown(&mut r), [next]);
        }
        // The SET stops the look ahead; past it, it goes on.
        let (_, len) = r.peek_plain_get().unwrap();
        r.consume(len);
        assert!(shown(&mut r).is_empty());
        let (_, len) = r.peek_plain_get().unwrap();
        r.consume(len);
        assert!(shown(&mut r).is_empty(), "a SET is next");
        assert_eq!(&r.next(false).unwrap().unwrap()[0][..], b"SET");
        assert_eq!(shown(&mut r), ["e"]);
    }

    #[test]
    fn a_plain_ping_is_seen_in_place_and_anything_else_is_left() {
        for (bytes, want) in [
            (&b"*1\r\n$4\r\nPING\r\n"[..], Some(14)),
            (b"*1\r\n$4\r\nping\r\n*1\r\n$4\r\nPING\r\n", Some(14)),
            (b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n", None),
            (b"*1\r\n$4\r\nPING\r", None),
            (b"PING\r\n", None),
            (b"*1\r\n$4\r\nPONG\r\n", None),
        ] {
            let mut r = RequestReader::new(Limits::default());
            r.feed(bytes);
            assert_eq!(
                r.peek_plain_ping(),
                want,
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
            if let Some(len) = want {
                r.consume(len);
                assert_eq!(r.pending_bytes(), bytes.len() - len);
            }
        }
    }

    #[test]
    fn a_plain_get_is_framed_in_place_and_anything_else_is_left() {
        let mut r = RequestReader::new(Limits::default());
        r.feed(b"*2\r\n$3\r\nget\r\n$3\r\nk\r\n\r\n*2\r\n$3\r\nGET\r\n$1\r\nk");
        let (key, len) = r.peek_plain_get().expect("a plain GET");
        assert_eq!((key, len), (&b"k\r\n"[..], 22));
        r.consume(len);
        assert_eq!(r.peek_plain_get(), None, "not whole yet");
        for other in [
            &b"*2\r\n$3\r\nGET\r\n$01\r\nk\r\n"[..],
            b"*3\r\n$3\r\nGET\r\n$1\r\nk\r\n$1\r\nv\r\n",
            b"*2\r\n$3\r\nSET\r\n$1\r\nk\r\n",
            b"*2\r\n$4\r\nGETX\r\n$1\r\nk\r\n",
            b"GET k\r\n",
        ] {
            let mut r = RequestReader::new(Limits::default());
            r.feed(other);
            assert_eq!(
                r.peek_plain_get(),
                None,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }

    proptest::proptest! {
        /// Whatever a plain GET frames, the general path frames the same.
        #[test]
        fn a_plain_get_frames_as_next_does(
            name in proptest::sample::select(vec!["GET", "get", "gEt", "SET"]),
            key in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
            key_len_shift in 0usize..3,
            cut in 0usize..340,
        ) {
            let key_len = key.len().saturating_sub(key_len_shift);
            let mut bytes = format!("*2\r\n$3\r\n{name}\r\n${key_len}\r\n").into_bytes();
            bytes.extend_from_slice(&key);
            bytes.extend_from_slice(b"\r\n");
            bytes.truncate(cut.max(1).min(bytes.len()));
            let mut r = RequestReader::new(Limits::default());
            r.feed(&bytes);
            if let Some((k, len)) = r.peek_plain_get() {
                let (args, consumed) = framed_by_next(&bytes);
                let args = args.expect("next frames it too");
                proptest::prop_assert_eq!(args, vec![name.as_bytes().to_vec(), k.to_vec()]);
                proptest::prop_assert_eq!(consumed, len);
                proptest::prop_assert!(name.eq_ignore_ascii_case("get"));
            }
        }
    }
}
