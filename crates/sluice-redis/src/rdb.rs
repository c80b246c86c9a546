//! Redis's serialization (RDB, version 10, as DUMP and RESTORE carry it):
//! lengths, strings, doubles, LZF, listpacks, ziplists and intsets, read
//! and written; CRC-64 (Jones), the payload's checksum. What `dump` and
//! `dump_stream` both build on.

use std::sync::OnceLock;

/// Most members a restored collection may claim (a payload cannot make
/// the server allocate without end before it is found short).
pub(crate) const MOST_PREALLOCATED: usize = 1 << 16;

/// Why a payload is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreError {
    /// Shorter than its footer, of a newer RDB version, or its checksum
    /// does not match.
    VersionOrChecksum,
    /// Not a value Redis could have written.
    BadFormat,
    /// A value of a kind Sluice does not restore yet (its name).
    Unsupported(&'static str),
}

impl RestoreError {
    /// Redis's reply to it (Sluice's own for a kind it does not take).
    pub fn reply_text(&self) -> String {
        match self {
            RestoreError::VersionOrChecksum => {
                "ERR DUMP payload version or checksum are wrong".into()
            }
            RestoreError::BadFormat => "ERR Bad data format".into(),
            RestoreError::Unsupported(kind) => {
                format!("ERR RESTORE of a {kind} is not served by Sluice yet")
            }
        }
    }
}

/// CRC-64/Jones as Redis computes it: polynomial 0xad93d23594c935a9,
/// reflected, initial value `crc`, no final xor.
pub fn crc64(mut crc: u64, bytes: &[u8]) -> u64 {
    static TABLE: OnceLock<[u64; 256]> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        // The polynomial with its bits reversed, for the reflected form.
        const REFLECTED: u64 = 0x95ac_9329_ac4b_c9b5;
        std::array::from_fn(|i| {
            let mut c = i as u64;
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    (c >> 1) ^ REFLECTED
                } else {
                    c >> 1
                };
            }
            c
        })
    });
    for &b in bytes {
        crc = table[((crc ^ u64::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

// ---- writing ----------------------------------------------------------

pub(crate) fn put_len(out: &mut Vec<u8>, n: u64) {
    if n < 1 << 6 {
        out.push(n as u8);
    } else if n < 1 << 14 {
        out.push(0x40 | (n >> 8) as u8);
        out.push(n as u8);
    } else if let Ok(n) = u32::try_from(n) {
        out.push(0x80);
        out.extend_from_slice(&n.to_be_bytes());
    } else {
        out.push(0x81);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

/// A string as RDB writes it: a short integer in its integer encoding
/// when the string is exactly that integer's decimal form, else its
/// length and bytes (never compressed: every reader takes that).
pub(crate) fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    let integer = canonical_integer(s);
    match integer {
        Some(n) if i8::try_from(n).is_ok() => out.extend_from_slice(&[0xc0, n as i8 as u8]),
        Some(n) if i16::try_from(n).is_ok() => {
            out.push(0xc1);
            out.extend_from_slice(&(n as i16).to_le_bytes());
        }
        Some(n) if i32::try_from(n).is_ok() => {
            out.push(0xc2);
            out.extend_from_slice(&(n as i32).to_le_bytes());
        }
        _ => {
            put_len(out, s.len() as u64);
            out.extend_from_slice(s);
        }
    }
}

pub(crate) type Read<T> = Result<T, RestoreError>;

pub(crate) fn bad<T>() -> Read<T> {
    Err(RestoreError::BadFormat)
}

/// A cursor over a payload's body.
pub(crate) struct Reader<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) at: usize,
}

/// A length, or (RDB's `11xxxxxx` form) a special string encoding.
enum Len {
    Plain(u64),
    Encoded(u8),
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Read<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else { return bad() };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    pub(crate) fn byte(&mut self) -> Read<u8> {
        Ok(self.take(1)?[0])
    }

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: 4 bytes; 8 bytes"
    )]
    fn len_or_encoding(&mut self) -> Read<Len> {
        let b = self.byte()?;
        Ok(match b >> 6 {
            0 => Len::Plain(u64::from(b & 0x3f)),
            1 => Len::Plain((u64::from(b & 0x3f) << 8) | u64::from(self.byte()?)),
            3 => Len::Encoded(b & 0x3f),
            _ if b == 0x80 => Len::Plain(u64::from(u32::from_be_bytes(
                self.take(4)?.try_into().expect("4 bytes"),
            ))),
            _ if b == 0x81 => Len::Plain(u64::from_be_bytes(
                self.take(8)?.try_into().expect("8 bytes"),
            )),
            _ => return bad(),
        })
    }

    /// A length as a u64 (ids and counters, which may pass usize).
    pub(crate) fn len64(&mut self) -> Read<u64> {
        match self.len_or_encoding()? {
            Len::Plain(n) => Ok(n),
            Len::Encoded(_) => bad(),
        }
    }

    pub(crate) fn len(&mut self) -> Read<usize> {
        match self.len_or_encoding()? {
            Len::Plain(n) => usize::try_from(n).or_else(|_| bad()),
            Len::Encoded(_) => bad(),
        }
    }

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: 2 bytes; 4 bytes"
    )]
    pub(crate) fn string(&mut self) -> Read<Vec<u8>> {
        match self.len_or_encoding()? {
            Len::Plain(n) => {
                let n = usize::try_from(n).or_else(|_| bad())?;
                Ok(self.take(n)?.to_vec())
            }
            Len::Encoded(0) => Ok((self.byte()? as i8).to_string().into_bytes()),
            Len::Encoded(1) => {
                let v = i16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes"));
                Ok(v.to_string().into_bytes())
            }
            Len::Encoded(2) => {
                let v = i32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes"));
                Ok(v.to_string().into_bytes())
            }
            Len::Encoded(3) => {
                let compressed = self.len()?;
                let plain = self.len()?;
                lzf_decompress(self.take(compressed)?, plain)
            }
            Len::Encoded(_) => bad(),
        }
    }

    /// A score as RDB's first sorted-set type writes it: a length byte
    /// and that many ASCII characters, or 253/254/255 for NaN/+inf/-inf.
    pub(crate) fn text_double(&mut self) -> Read<f64> {
        match self.byte()? {
            253 => Ok(f64::NAN),
            254 => Ok(f64::INFINITY),
            255 => Ok(f64::NEG_INFINITY),
            n => parse_double(self.take(usize::from(n))?),
        }
    }

    #[expect(
        clippy::expect_used,
        reason = "each expect states its invariant: 8 bytes"
    )]
    pub(crate) fn binary_double(&mut self) -> Read<f64> {
        Ok(f64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
}

pub(crate) fn parse_double(b: &[u8]) -> Read<f64> {
    crate::number::parse_double(b).ok_or(RestoreError::BadFormat)
}

/// LZF decompression (liblzf's format): literal runs `000LLLLL` of L+1
/// bytes, back references `LLLooooo oooooooo` (L = 7: one more length
/// byte) copying L+2 bytes from `offset + 1` back.
pub(crate) fn lzf_decompress(input: &[u8], plain: usize) -> Read<Vec<u8>> {
    let mut out = Vec::with_capacity(plain.min(MOST_PREALLOCATED * 64));
    let mut at = 0;
    while at < input.len() {
        let ctrl = usize::from(input[at]);
        at += 1;
        if ctrl < 32 {
            let run = input
                .get(at..at + ctrl + 1)
                .ok_or(RestoreError::BadFormat)?;
            out.extend_from_slice(run);
            at += ctrl + 1;
        } else {
            let mut len = ctrl >> 5;
            if len == 7 {
                len += usize::from(*input.get(at).ok_or(RestoreError::BadFormat)?);
                at += 1;
            }
            let low = usize::from(*input.get(at).ok_or(RestoreError::BadFormat)?);
            at += 1;
            let back = ((ctrl & 0x1f) << 8) + low + 1;
            let from = out.len().checked_sub(back).ok_or(RestoreError::BadFormat)?;
            for i in 0..len + 2 {
                let b = out[from + i];
                out.push(b);
            }
        }
        if out.len() > plain {
            return bad();
        }
    }
    if out.len() != plain {
        return bad();
    }
    Ok(out)
}

/// A listpack's entries, integers as their decimal strings.
/// Bytes a listpack element's length backwards takes after an element
/// of `size` bytes (its encoding and data): 7 bits a byte.
pub(crate) fn backlen_bytes(size: u64) -> usize {
    match size {
        0..=127 => 1,
        128..=16382 => 2,
        16383..=2_097_150 => 3,
        2_097_151..=268_435_454 => 4,
        _ => 5,
    }
}

/// `s` as an integer when it is exactly that integer's decimal form (no
/// sign but a minus, no leading zero, at most 20 characters).
pub(crate) fn canonical_integer(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    let v: i64 = std::str::from_utf8(s).ok()?.parse().ok()?;
    (v.to_string().as_bytes() == s).then_some(v)
}

#[expect(
    clippy::expect_used,
    reason = "each expect reads 4 bytes the bound check before it left in the slice"
)]
pub(crate) fn listpack(lp: &[u8]) -> Read<Vec<Vec<u8>>> {
    if lp.len() < 7 || u32::from_le_bytes(lp[..4].try_into().expect("4")) as usize != lp.len() {
        return bad();
    }
    let mut out = Vec::new();
    let mut at = 6;
    loop {
        let b = *lp.get(at).ok_or(RestoreError::BadFormat)?;
        if b == 0xff {
            break;
        }
        let take = |from: usize, n: usize| lp.get(from..from + n).ok_or(RestoreError::BadFormat);
        let int = |v: i64| v.to_string().into_bytes();
        let sign_extend = |v: u64, bits: u32| ((v << (64 - bits)) as i64) >> (64 - bits);
        let (entry, header, data) = if b & 0x80 == 0 {
            (int(i64::from(b & 0x7f)), 1, 0)
        } else if b & 0xc0 == 0x80 {
            let n = usize::from(b & 0x3f);
            (take(at + 1, n)?.to_vec(), 1, n)
        } else if b & 0xe0 == 0xc0 {
            let v = (u64::from(b & 0x1f) << 8) | u64::from(take(at + 1, 1)?[0]);
            (int(sign_extend(v, 13)), 2, 0)
        } else if b & 0xf0 == 0xe0 {
            let n = (usize::from(b & 0x0f) << 8) | usize::from(take(at + 1, 1)?[0]);
            (take(at + 2, n)?.to_vec(), 2, n)
        } else {
            let le = |n: usize| -> Read<u64> {
                let mut v = [0u8; 8];
                v[..n].copy_from_slice(take(at + 1, n)?);
                Ok(u64::from_le_bytes(v))
            };
            match b {
                0xf0 => {
                    let n = le(4)? as usize;
                    (take(at + 5, n)?.to_vec(), 5, n)
                }
                0xf1 => (int(sign_extend(le(2)?, 16)), 3, 0),
                0xf2 => (int(sign_extend(le(3)?, 24)), 4, 0),
                0xf3 => (int(sign_extend(le(4)?, 32)), 5, 0),
                0xf4 => (int(le(8)? as i64), 9, 0),
                _ => return bad(),
            }
        };
        let size = header + data;
        at += size + backlen_bytes(size as u64);
        out.push(entry);
    }
    if at + 1 != lp.len() {
        return bad();
    }
    Ok(out)
}

/// A ziplist's entries, integers as their decimal strings.
#[expect(
    clippy::expect_used,
    reason = "each expect reads 4 bytes the bound check before it left in the slice"
)]
pub(crate) fn ziplist(zl: &[u8]) -> Read<Vec<Vec<u8>>> {
    if zl.len() < 11 || u32::from_le_bytes(zl[..4].try_into().expect("4")) as usize != zl.len() {
        return bad();
    }
    let take = |from: usize, n: usize| zl.get(from..from + n).ok_or(RestoreError::BadFormat);
    let mut out = Vec::new();
    let mut at = 10;
    loop {
        let first = take(at, 1)?[0];
        if first == 0xff {
            break;
        }
        at += if first == 0xfe { 5 } else { 1 };
        let b = take(at, 1)?[0];
        let le = |n: usize| -> Read<u64> {
            let mut v = [0u8; 8];
            v[..n].copy_from_slice(take(at + 1, n)?);
            Ok(u64::from_le_bytes(v))
        };
        let sign_extend = |v: u64, bits: u32| ((v << (64 - bits)) as i64) >> (64 - bits);
        let int = |v: i64| v.to_string().into_bytes();
        let (entry, size) = match b >> 6 {
            0 => {
                let n = usize::from(b & 0x3f);
                (take(at + 1, n)?.to_vec(), 1 + n)
            }
            1 => {
                let n = (usize::from(b & 0x3f) << 8) | usize::from(take(at + 1, 1)?[0]);
                (take(at + 2, n)?.to_vec(), 2 + n)
            }
            2 => {
                let n = u32::from_be_bytes(take(at + 1, 4)?.try_into().expect("4")) as usize;
                (take(at + 5, n)?.to_vec(), 5 + n)
            }
            _ => match b {
                0xc0 => (int(sign_extend(le(2)?, 16)), 3),
                0xd0 => (int(sign_extend(le(4)?, 32)), 5),
                0xe0 => (int(le(8)? as i64), 9),
                0xf0 => (int(sign_extend(le(3)?, 24)), 4),
                0xfe => (int(sign_extend(le(1)?, 8)), 2),
                0xf1..=0xfd => (int(i64::from(b & 0x0f) - 1), 1),
                _ => return bad(),
            },
        };
        at += size;
        out.push(entry);
    }
    if at + 1 != zl.len() {
        return bad();
    }
    Ok(out)
}

/// An intset's members as decimal strings.
#[expect(
    clippy::expect_used,
    reason = "each expect reads 4 bytes the bound check before it left in the slice"
)]
pub(crate) fn intset(is: &[u8]) -> Read<Vec<Vec<u8>>> {
    if is.len() < 8 {
        return bad();
    }
    let width = u32::from_le_bytes(is[..4].try_into().expect("4")) as usize;
    let count = u32::from_le_bytes(is[4..8].try_into().expect("4")) as usize;
    if ![2, 4, 8].contains(&width)
        || is.len() != 8 + width.checked_mul(count).ok_or(RestoreError::BadFormat)?
    {
        return bad();
    }
    Ok(is[8..]
        .chunks_exact(width)
        .map(|c| {
            let mut v = [0u8; 8];
            v[..width].copy_from_slice(c);
            let shift = 64 - 8 * width as u32;
            (((u64::from_le_bytes(v) << shift) as i64) >> shift)
                .to_string()
                .into_bytes()
        })
        .collect())
}

/// Pairs of alternate entries (a hash's fields and values, a sorted
/// set's members and scores); an odd count is malformed.
pub(crate) fn pairs(entries: Vec<Vec<u8>>) -> Read<Vec<(Vec<u8>, Vec<u8>)>> {
    if !entries.len().is_multiple_of(2) {
        return bad();
    }
    let mut it = entries.into_iter();
    let mut out = Vec::new();
    while let (Some(a), Some(b)) = (it.next(), it.next()) {
        out.push((a, b));
    }
    Ok(out)
}

pub(crate) fn scored(pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Read<Vec<(Vec<u8>, f64)>> {
    pairs
        .into_iter()
        .map(|(m, s)| Ok((m, parse_double(&s)?)))
        .collect()
}

/// Reads `n` strings.
pub(crate) fn strings(r: &mut Reader<'_>, n: usize) -> Read<Vec<Vec<u8>>> {
    let mut out = Vec::with_capacity(n.min(MOST_PREALLOCATED));
    for _ in 0..n {
        out.push(r.string()?);
    }
    Ok(out)
}
