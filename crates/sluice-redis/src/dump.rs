//! DUMP and RESTORE payloads: one value in Redis's RDB serialization,
//! then the RDB version (u16 LE) and a CRC-64 of everything before it
//! (u64 LE; Redis's CRC-64/Jones, reflected, initial value 0).
//!
//! DUMP writes what every Redis since 2.x reads back: a string (small
//! integers in their integer encodings), a list as a plain list, a set,
//! a sorted set with binary scores, a hash — and a stream as Redis 7.0
//! writes it (`crate::dump_stream`) — version 10, Redis 7.0's.
//! RESTORE reads those and every compact form Redis 7.0 and earlier
//! write: intsets, ziplists, listpacks and quicklists of both kinds, both
//! stream types, and LZF-compressed strings, so a payload from a real
//! Redis restores here. Module values are refused with their own error.

use crate::ctx::Ctx;
use crate::db::DbBatch;
pub use crate::dump_stream::{DumpedGroup, DumpedStream};
use crate::error::Failure;
use crate::record::{Collection, Entry, StreamId, StreamMeta, Value};
use sluice_store::StoreError;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

/// The RDB version DUMP writes, and the newest RESTORE takes (Redis 7.0).
pub const RDB_VERSION: u16 = 10;

const TYPE_STRING: u8 = 0;
const TYPE_LIST: u8 = 1;
const TYPE_SET: u8 = 2;
const TYPE_ZSET: u8 = 3;
const TYPE_HASH: u8 = 4;
const TYPE_ZSET_2: u8 = 5;
const TYPE_LIST_ZIPLIST: u8 = 10;
const TYPE_SET_INTSET: u8 = 11;
const TYPE_ZSET_ZIPLIST: u8 = 12;
const TYPE_HASH_ZIPLIST: u8 = 13;
const TYPE_LIST_QUICKLIST: u8 = 14;
const TYPE_STREAM_LISTPACKS: u8 = 15;
const TYPE_HASH_LISTPACK: u8 = 16;
const TYPE_ZSET_LISTPACK: u8 = 17;
const TYPE_LIST_QUICKLIST_2: u8 = 18;
const TYPE_STREAM_LISTPACKS_2: u8 = 19;

/// Most members a restored collection may claim (a payload cannot make
/// the server allocate without end before it is found short).
const MOST_PREALLOCATED: usize = 1 << 16;

/// One value as a payload carries it.
#[derive(Debug, Clone, PartialEq)]
pub enum Dumped {
    /// A string's bytes.
    String(Vec<u8>),
    /// A list's items, in order.
    List(Vec<Vec<u8>>),
    /// A set's members.
    Set(Vec<Vec<u8>>),
    /// A sorted set's members and scores.
    ZSet(Vec<(Vec<u8>, f64)>),
    /// A hash's fields and values.
    Hash(Vec<(Vec<u8>, Vec<u8>)>),
    /// A stream with its consumer groups.
    Stream(Box<DumpedStream>),
}

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

/// The DUMP payload of `value`.
pub fn dump(value: &Dumped) -> Vec<u8> {
    let mut out = Vec::new();
    match value {
        Dumped::String(s) => {
            out.push(TYPE_STRING);
            put_string(&mut out, s);
        }
        Dumped::List(items) | Dumped::Set(items) => {
            out.push(if matches!(value, Dumped::List(_)) {
                TYPE_LIST
            } else {
                TYPE_SET
            });
            put_len(&mut out, items.len() as u64);
            for item in items {
                put_string(&mut out, item);
            }
        }
        Dumped::ZSet(members) => {
            out.push(TYPE_ZSET_2);
            put_len(&mut out, members.len() as u64);
            for (member, score) in members {
                put_string(&mut out, member);
                out.extend_from_slice(&score.to_le_bytes());
            }
        }
        Dumped::Hash(pairs) => {
            out.push(TYPE_HASH);
            put_len(&mut out, pairs.len() as u64);
            for (field, value) in pairs {
                put_string(&mut out, field);
                put_string(&mut out, value);
            }
        }
        Dumped::Stream(stream) => {
            out.push(TYPE_STREAM_LISTPACKS_2);
            crate::dump_stream::write(&mut out, stream);
        }
    }
    out.extend_from_slice(&RDB_VERSION.to_le_bytes());
    let crc = crc64(0, &out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

// ---- reading ----------------------------------------------------------

pub(crate) type Read<T> = Result<T, RestoreError>;

pub(crate) fn bad<T>() -> Read<T> {
    Err(RestoreError::BadFormat)
}

/// A cursor over a payload's body.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
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

    fn byte(&mut self) -> Read<u8> {
        Ok(self.take(1)?[0])
    }

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
    fn text_double(&mut self) -> Read<f64> {
        match self.byte()? {
            253 => Ok(f64::NAN),
            254 => Ok(f64::INFINITY),
            255 => Ok(f64::NEG_INFINITY),
            n => parse_double(self.take(usize::from(n))?),
        }
    }

    fn binary_double(&mut self) -> Read<f64> {
        Ok(f64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
}

fn parse_double(b: &[u8]) -> Read<f64> {
    crate::number::parse_double(b).ok_or(RestoreError::BadFormat)
}

/// LZF decompression (liblzf's format): literal runs `000LLLLL` of L+1
/// bytes, back references `LLLooooo oooooooo` (L = 7: one more length
/// byte) copying L+2 bytes from `offset + 1` back.
fn lzf_decompress(input: &[u8], plain: usize) -> Read<Vec<u8>> {
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
fn ziplist(zl: &[u8]) -> Read<Vec<Vec<u8>>> {
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
fn intset(is: &[u8]) -> Read<Vec<Vec<u8>>> {
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
fn pairs(entries: Vec<Vec<u8>>) -> Read<Vec<(Vec<u8>, Vec<u8>)>> {
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

fn scored(pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Read<Vec<(Vec<u8>, f64)>> {
    pairs
        .into_iter()
        .map(|(m, s)| Ok((m, parse_double(&s)?)))
        .collect()
}

/// Reads `n` strings.
fn strings(r: &mut Reader<'_>, n: usize) -> Read<Vec<Vec<u8>>> {
    let mut out = Vec::with_capacity(n.min(MOST_PREALLOCATED));
    for _ in 0..n {
        out.push(r.string()?);
    }
    Ok(out)
}

/// The value in a RESTORE payload, its version and checksum checked
/// first.
pub fn restore(payload: &[u8]) -> Result<Dumped, RestoreError> {
    footer_checked(payload)?;
    let body = &payload[..payload.len() - 10];
    let mut r = Reader { bytes: body, at: 0 };
    let value = read_value(&mut r)?;
    let empty = match &value {
        Dumped::String(_) => false,
        Dumped::List(v) | Dumped::Set(v) => v.is_empty(),
        Dumped::ZSet(v) => v.is_empty(),
        Dumped::Hash(v) => v.is_empty(),
        // Redis keeps a stream that XDEL or XTRIM emptied.
        Dumped::Stream(_) => false,
    };
    let nan = matches!(&value, Dumped::ZSet(v) if v.iter().any(|(_, s)| s.is_nan()));
    // Redis refuses empty collections and trailing bytes.
    if empty || nan || r.at != body.len() {
        return bad();
    }
    Ok(value)
}

fn read_value(r: &mut Reader<'_>) -> Read<Dumped> {
    let kind = r.byte()?;
    Ok(match kind {
        TYPE_STRING => Dumped::String(r.string()?),
        TYPE_LIST | TYPE_SET => {
            let n = r.len()?;
            let items = strings(r, n)?;
            if kind == TYPE_LIST {
                Dumped::List(items)
            } else {
                Dumped::Set(items)
            }
        }
        TYPE_ZSET | TYPE_ZSET_2 => {
            let n = r.len()?;
            let mut members = Vec::with_capacity(n.min(MOST_PREALLOCATED));
            for _ in 0..n {
                let member = r.string()?;
                let score = if kind == TYPE_ZSET_2 {
                    r.binary_double()?
                } else {
                    r.text_double()?
                };
                members.push((member, score));
            }
            Dumped::ZSet(members)
        }
        TYPE_HASH => {
            let n = r.len()?;
            let flat = strings(r, n.checked_mul(2).ok_or(RestoreError::BadFormat)?)?;
            Dumped::Hash(pairs(flat)?)
        }
        TYPE_LIST_ZIPLIST => Dumped::List(ziplist(&r.string()?)?),
        TYPE_SET_INTSET => Dumped::Set(intset(&r.string()?)?),
        TYPE_ZSET_ZIPLIST => Dumped::ZSet(scored(pairs(ziplist(&r.string()?)?)?)?),
        TYPE_HASH_ZIPLIST => Dumped::Hash(pairs(ziplist(&r.string()?)?)?),
        TYPE_HASH_LISTPACK => Dumped::Hash(pairs(listpack(&r.string()?)?)?),
        TYPE_ZSET_LISTPACK => Dumped::ZSet(scored(pairs(listpack(&r.string()?)?)?)?),
        TYPE_LIST_QUICKLIST => {
            let nodes = r.len()?;
            let mut items = Vec::new();
            for _ in 0..nodes {
                items.extend(ziplist(&r.string()?)?);
            }
            Dumped::List(items)
        }
        TYPE_LIST_QUICKLIST_2 => {
            let nodes = r.len()?;
            let mut items = Vec::new();
            for _ in 0..nodes {
                // 1: a plain node holding one item; 2: a listpack.
                match r.len()? {
                    1 => items.push(r.string()?),
                    2 => items.extend(listpack(&r.string()?)?),
                    _ => return bad(),
                }
            }
            Dumped::List(items)
        }
        TYPE_STREAM_LISTPACKS | TYPE_STREAM_LISTPACKS_2 => Dumped::Stream(Box::new(
            crate::dump_stream::read(r, kind == TYPE_STREAM_LISTPACKS_2)?,
        )),
        6 | 7 => return Err(RestoreError::Unsupported("module value")),
        _ => return bad(),
    })
}

// ---- function libraries ------------------------------------------------

/// The RDB opcode of one function library (Redis 7.0's, with its code).
const OPCODE_FUNCTION2: u8 = 245;
/// The opcode of Redis 7.0's release candidates, whose form is not read.
const OPCODE_FUNCTION_PRE_GA: u8 = 246;

/// FUNCTION DUMP's payload of libraries whose codes these are (each as
/// FUNCTION LOAD took it, `#!` line included).
pub fn dump_functions<'a>(codes: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    for code in codes {
        out.push(OPCODE_FUNCTION2);
        put_string(&mut out, code);
    }
    out.extend_from_slice(&RDB_VERSION.to_le_bytes());
    let crc = crc64(0, &out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The library codes in a FUNCTION RESTORE payload, or Redis's error
/// text for it (after `ERR `).
pub fn restore_functions(payload: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    if let Err(RestoreError::VersionOrChecksum) = footer_checked(payload) {
        return Err("DUMP payload version or checksum are wrong".into());
    }
    let body = &payload[..payload.len() - 10];
    let mut r = Reader { bytes: body, at: 0 };
    let mut codes = Vec::new();
    while r.at < body.len() {
        match r.byte().map_err(|_| "can not read data type".to_string())? {
            OPCODE_FUNCTION2 => codes.push(
                r.string()
                    .map_err(|_| "failed loading the given functions payload".to_string())?,
            ),
            OPCODE_FUNCTION_PRE_GA => return Err("Pre-GA function format not supported".into()),
            _ => return Err("given type is not a function".into()),
        }
    }
    Ok(codes)
}

/// Checks a payload's footer: long enough, a version this reads, the
/// CRC-64 of the rest.
fn footer_checked(payload: &[u8]) -> Result<(), RestoreError> {
    if payload.len() < 10 {
        return Err(RestoreError::VersionOrChecksum);
    }
    let footer = &payload[payload.len() - 10..];
    let version = u16::from_le_bytes([footer[0], footer[1]]);
    let crc = u64::from_le_bytes(footer[2..].try_into().expect("8 bytes"));
    if version > RDB_VERSION || crc64(0, &payload[..payload.len() - 8]) != crc {
        return Err(RestoreError::VersionOrChecksum);
    }
    Ok(())
}

// ---- the keyspace ----------------------------------------------------

/// What DUMP serializes of the live value at `key`; None for no key.
/// The caller reads under the run's snapshot (or holds the key's lock).
pub fn read(ctx: &Ctx<'_>, key: &[u8]) -> Result<Option<Dumped>, Failure> {
    let Some(entry) = ctx.get(key)? else {
        return Ok(None);
    };
    let members = |id: u64| ctx.all_members(id);
    Ok(Some(match entry.value {
        Value::String(s) => Dumped::String(s),
        Value::Hash { c, order } => {
            Dumped::Hash(crate::hash::in_order(members(c.id)?, order.as_ref()))
        }
        Value::Set(c) => Dumped::Set(members(c.id)?.into_iter().map(|(m, _)| m).collect()),
        // Sub-keys are indexes, big-endian: their order is the list's.
        Value::List { c, .. } => Dumped::List(members(c.id)?.into_iter().map(|(_, v)| v).collect()),
        Value::ZSet(c) => {
            let mut scored =
                Vec::with_capacity(usize::try_from(c.len).unwrap_or(0).min(MOST_PREALLOCATED));
            // The by-score entries, in Redis's order: `[1][score key][member]`.
            for (sub, score) in members(c.id)? {
                if sub.first() == Some(&1) && sub.len() >= 9 {
                    scored.push((sub[9..].to_vec(), crate::zset::score_of(&score)?));
                }
            }
            Dumped::ZSet(scored)
        }
        Value::Stream { c, meta } => Dumped::Stream(Box::new(read_stream(ctx, c, meta)?)),
    }))
}

/// Stream `c` with its groups, as DUMP serializes it.
fn read_stream(ctx: &Ctx<'_>, c: Collection, meta: StreamMeta) -> Result<DumpedStream, Failure> {
    let (first, last) = (
        StreamId::default(),
        StreamId {
            ms: u64::MAX,
            seq: u64::MAX,
        },
    );
    let entries = crate::stream::range(ctx, c, first, last, 0, false)?;
    let mut groups = Vec::new();
    for (name, group) in crate::stream_group::groups(ctx, c)? {
        let pending = crate::stream_group::pending(ctx, c, &name, first, last, false)
            .collect::<Result<Vec<_>, Failure>>()?;
        let consumers = crate::stream_group::consumers(ctx, c, &name)?
            .into_iter()
            .map(|(consumer, info)| (consumer, info.seen_ms))
            .collect();
        groups.push(DumpedGroup {
            name,
            group,
            pending,
            consumers,
        });
    }
    Ok(DumpedStream {
        entries,
        meta,
        groups,
    })
}

/// Writes `value` at `key` with `expire_at_ms` (0: none) into `batch`, a
/// collection under a new object id. The key holds nothing in `batch`'s
/// database (the caller removed what it held).
pub fn write(
    ctx: &Ctx<'_>,
    batch: &mut DbBatch<'_>,
    key: &[u8],
    value: Dumped,
    expire_at_ms: u64,
) -> Result<(), StoreError> {
    let entry = |value: Value| Entry {
        value,
        expire_at_ms,
    };
    let collection = |id: u64, len: usize| Collection {
        id,
        len: len as u64,
    };
    match value {
        Dumped::String(s) => batch.put(key, &entry(Value::String(s))),
        Dumped::Hash(pairs) => {
            let id = ctx.db().new_id()?;
            let order = {
                let borrowed: Vec<(&[u8], &[u8])> =
                    pairs.iter().map(|(f, v)| (&f[..], &v[..])).collect();
                crate::hash::order_of(ctx, &borrowed)
            };
            let fields: BTreeMap<Vec<u8>, Vec<u8>> = pairs.into_iter().collect();
            for (field, v) in &fields {
                batch.put_member(key, id, field, v)?;
            }
            let c = collection(id, fields.len());
            batch.put_new(key, &entry(Value::Hash { c, order }))
        }
        Dumped::Set(members) => {
            let id = ctx.db().new_id()?;
            let members: BTreeSet<Vec<u8>> = members.into_iter().collect();
            for m in &members {
                batch.put_member(key, id, m, &[])?;
            }
            batch.put_new(key, &entry(Value::Set(collection(id, members.len()))))
        }
        Dumped::List(items) => {
            let id = ctx.db().new_id()?;
            let head = crate::list::FIRST_INDEX;
            for (i, item) in items.iter().enumerate() {
                let index = head + i as u64;
                batch.put_member(key, id, &index.to_be_bytes(), item)?;
            }
            let c = collection(id, items.len());
            batch.put_new(key, &entry(Value::List { c, head }))
        }
        Dumped::ZSet(members) => {
            let id = ctx.db().new_id()?;
            // The last score of a member given twice wins; -0 is kept as 0.
            let scores: BTreeMap<Vec<u8>, f64> = members
                .into_iter()
                .map(|(m, s)| (m, if s == 0.0 { 0.0 } else { s }))
                .collect();
            for (m, &score) in &scores {
                let bytes = score.to_le_bytes();
                batch.put_member(key, id, &crate::zset::member_sub(m), &bytes)?;
                let by_score = crate::zset::score_sub(crate::zset::score_key(score), m);
                batch.put_member(key, id, &by_score, &bytes)?;
            }
            batch.put_new(key, &entry(Value::ZSet(collection(id, scores.len()))))
        }
        Dumped::Stream(stream) => {
            let id = ctx.db().new_id()?;
            let c = collection(id, stream.entries.len());
            for (entry_id, flat) in &stream.entries {
                let refs: Vec<&[u8]> = flat.iter().map(|v| &v[..]).collect();
                let sub = crate::stream::entry_sub(*entry_id);
                batch.put_member(key, id, &sub, &crate::stream::encode_fields(&refs))?;
            }
            for g in &stream.groups {
                use crate::stream_group as sg;
                sg::put_group(batch, key, c, &g.name, &g.group)?;
                for (name, seen_ms) in &g.consumers {
                    let consumer = sg::Consumer { seen_ms: *seen_ms };
                    sg::put_consumer(batch, key, c, &g.name, name, consumer)?;
                }
                for (pending_id, nack) in &g.pending {
                    sg::put_nack(batch, key, c, &g.name, *pending_id, nack)?;
                }
            }
            let meta = stream.meta;
            batch.put_new(key, &entry(Value::Stream { c, meta }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 250 entries (three nodes), fields changing from the master's, two
    /// groups, one with pending entries of two consumers and one unknown
    /// entries-read count.
    fn a_stream() -> DumpedStream {
        use crate::stream_group::{Group, Nack};
        let id = |ms, seq| StreamId { ms, seq };
        let entries: Vec<(StreamId, Vec<Vec<u8>>)> = (0..250u64)
            .map(|i| {
                let mut flat = vec![b"field".to_vec(), format!("v{i}").into_bytes()];
                if i % 7 == 0 {
                    flat.extend([b"extra".to_vec(), i.to_string().into_bytes()]);
                }
                (id(1000 + i / 3, i % 3), flat)
            })
            .collect();
        let nack = |consumer: &[u8], n| Nack {
            delivered_ms: 1_700_000_000_000 + n,
            deliveries: n,
            consumer: consumer.to_vec(),
        };
        DumpedStream {
            meta: StreamMeta {
                last: id(2000, 0),
                first: entries[0].0,
                max_deleted: id(1500, 1),
                added: 300,
            },
            groups: vec![
                DumpedGroup {
                    name: b"a-group".to_vec(),
                    group: Group {
                        last: id(1010, 1),
                        entries_read: Some(31),
                    },
                    pending: vec![
                        (id(1000, 0), nack(b"alice", 1)),
                        (id(1001, 2), nack(b"bob", 3)),
                    ],
                    consumers: vec![
                        (b"alice".to_vec(), 5),
                        (b"bob".to_vec(), 6),
                        (b"idle".to_vec(), 7),
                    ],
                },
                DumpedGroup {
                    name: b"b-group".to_vec(),
                    group: Group {
                        last: id(0, 0),
                        entries_read: None,
                    },
                    pending: Vec::new(),
                    consumers: Vec::new(),
                },
            ],
            entries,
        }
    }

    #[test]
    fn crc64_is_redis_s() {
        // Redis's crc64 test vector (src/crc64.c).
        assert_eq!(crc64(0, b"123456789"), 0xe9c6_d914_c4b8_d9ca);
    }

    #[test]
    fn every_kind_comes_back_as_dumped() {
        let values = [
            Dumped::String(b"hello".to_vec()),
            Dumped::String(b"12345".to_vec()),
            Dumped::String(b"-7".to_vec()),
            Dumped::String(b"0123".to_vec()),
            Dumped::String(vec![0u8; 20_000]),
            Dumped::List(vec![b"a".to_vec(), b"100000".to_vec()]),
            Dumped::Set(vec![b"x".to_vec()]),
            Dumped::ZSet(vec![(b"m".to_vec(), -1.5), (b"n".to_vec(), f64::INFINITY)]),
            Dumped::Hash(vec![(b"f".to_vec(), b"v".to_vec())]),
            Dumped::Stream(Box::new(a_stream())),
            Dumped::Stream(Box::default()),
        ];
        for v in values {
            assert_eq!(restore(&dump(&v)).unwrap(), v);
        }
    }

    #[test]
    fn a_changed_byte_or_a_newer_version_is_refused() {
        let mut p = dump(&Dumped::String(b"hello".to_vec()));
        p[2] ^= 1;
        assert_eq!(restore(&p), Err(RestoreError::VersionOrChecksum));
        assert_eq!(restore(b"short"), Err(RestoreError::VersionOrChecksum));
        let mut newer = dump(&Dumped::String(b"x".to_vec()));
        let at = newer.len() - 10;
        newer[at] = 11;
        assert_eq!(restore(&newer), Err(RestoreError::VersionOrChecksum));
    }

    #[test]
    fn lzf_back_references_copy_what_came_before() {
        // "abcabcabc": three literals, then a reference 3 back of 6 bytes.
        let input = [2, b'a', b'b', b'c', (4 << 5), 2];
        assert_eq!(lzf_decompress(&input, 9).unwrap(), b"abcabcabc");
        assert!(lzf_decompress(&input, 8).is_err());
    }
}
