//! Bitmaps over strings: SETBIT, GETBIT, BITCOUNT, BITPOS, BITOP,
//! BITFIELD and BITFIELD_RO, as Redis 7.0 answers them. Bit 0 is the most
//! significant bit of the first byte; a missing key reads as zeros.

use super::*;

const BIT_OFFSET: &str = "ERR bit offset is not an integer or out of range";
const BIT_VALUE: &str = "ERR bit is not an integer or out of range";
const FIELD_TYPE: &str =
    "ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is.";

/// A bit offset (Redis's getBitOffsetFromArgument): a non-negative integer
/// whose byte is within the longest string; with `width`, `#n` means
/// `n * width` (BITFIELD).
fn bit_offset(arg: &[u8], width: Option<u32>) -> Result<u64, Failure> {
    let (digits, scale) = match (arg.first(), width) {
        (Some(b'#'), Some(w)) => (&arg[1..], i64::from(w)),
        _ => (arg, 1),
    };
    let n = string_to_i64(digits).ok_or_else(|| fail(BIT_OFFSET))?;
    let n = n.wrapping_mul(scale);
    if n < 0 || (n as u64 >> 3) >= STRING_MAX_BYTES {
        return Err(fail(BIT_OFFSET));
    }
    Ok(n as u64)
}

fn bit_at(bytes: &[u8], offset: u64) -> bool {
    let byte = (offset >> 3) as usize;
    byte < bytes.len() && bytes[byte] & (0x80 >> (offset & 7)) != 0
}

fn set_bit(bytes: &mut [u8], offset: u64, on: bool) {
    let (byte, mask) = ((offset >> 3) as usize, 0x80 >> (offset & 7));
    if on {
        bytes[byte] |= mask;
    } else {
        bytes[byte] &= !mask;
    }
}

/// The bytes of `current` grown with zeros so that bit `last` exists.
fn grown(current: Option<&[u8]>, last: u64) -> Vec<u8> {
    let mut bytes = current.unwrap_or_default().to_vec();
    let need = (last >> 3) as usize + 1;
    if bytes.len() < need {
        bytes.resize(need, 0);
    }
    bytes
}

pub(super) fn setbit(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let offset = bit_offset(&args[2], None)?;
    let on = match string_to_i64(&args[3]) {
        Some(v @ (0 | 1)) => v == 1,
        _ => return Err(fail(BIT_VALUE)),
    };
    super::strings::update_string(ctx, &args[1], |current| {
        let was = current.is_some_and(|c| bit_at(c, offset));
        let grows = current.is_none_or(|c| ((offset >> 3) as usize) >= c.len());
        if !grows && was == on {
            return Ok((None, int(i64::from(was))));
        }
        let mut bytes = grown(current, offset);
        set_bit(&mut bytes, offset, on);
        Ok((Some(bytes), int(i64::from(was))))
    })
}

pub(super) fn getbit(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let offset = bit_offset(&args[2], None)?;
    let bytes = ctx.get_string(&args[1])?.map(|(s, _)| s);
    Ok(int(i64::from(bytes.is_some_and(|b| bit_at(&b, offset)))))
}

/// A BITCOUNT/BITPOS range made byte bounds: `first..=last` bytes, and
/// the bits of the edge bytes outside a BIT range.
struct ByteRange {
    first: i64,
    last: i64,
    /// Bits of the first byte before the range (high bits).
    first_outside: u8,
    /// Bits of the last byte after the range (low bits).
    last_outside: u8,
}

/// Redis's clamping of `start..=end` over `len` bytes, counted in bits when
/// `bits` (then narrowed to bytes with edge masks).
fn byte_range(mut start: i64, mut end: i64, len: i64, bits: bool) -> ByteRange {
    let total = if bits { len << 3 } else { len };
    if start < 0 {
        start += total;
    }
    if end < 0 {
        end += total;
    }
    start = start.max(0);
    end = end.max(0);
    if end >= total {
        end = total - 1;
    }
    let (mut first_outside, mut last_outside) = (0, 0);
    if bits && start <= end {
        first_outside = !((1u16 << (8 - (start & 7))) - 1) as u8;
        last_outside = ((1u16 << (7 - (end & 7))) - 1) as u8;
        start >>= 3;
        end >>= 3;
    }
    ByteRange {
        first: start,
        last: end,
        first_outside,
        last_outside,
    }
}

fn bit_unit(arg: &[u8]) -> Result<bool, Failure> {
    match arg.to_ascii_lowercase().as_slice() {
        b"bit" => Ok(true),
        b"byte" => Ok(false),
        _ => Err(fail(SYNTAX)),
    }
}

pub(super) fn bitcount(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let Some((bytes, _)) = ctx.get_string(&args[1])? else {
        return Ok(int(0));
    };
    let len = bytes.len() as i64;
    let range = match args.len() {
        2 => ByteRange {
            first: 0,
            last: len - 1,
            first_outside: 0,
            last_outside: 0,
        },
        4 | 5 => {
            let (start, end) = (parse_i64(&args[2])?, parse_i64(&args[3])?);
            if start < 0 && end < 0 && start > end {
                return Ok(int(0));
            }
            let bits = args.len() == 5 && bit_unit(&args[4])?;
            byte_range(start, end, len, bits)
        }
        _ => return Err(fail(SYNTAX)),
    };
    if range.first > range.last {
        return Ok(int(0));
    }
    let (first, last) = (range.first as usize, range.last as usize);
    let mut count: u64 = bytes[first..=last]
        .iter()
        .map(|b| u64::from(b.count_ones()))
        .sum();
    count -= u64::from((bytes[first] & range.first_outside).count_ones());
    count -= u64::from((bytes[last] & range.last_outside).count_ones());
    Ok(int(count as i64))
}

pub(super) fn bitpos(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let bit = match parse_i64(&args[2])? {
        b @ (0 | 1) => b == 1,
        _ => return Err(fail("ERR The bit argument must be 1 or 0.")),
    };
    let Some((bytes, _)) = ctx.get_string(&args[1])? else {
        return Ok(int(if bit { -1 } else { 0 }));
    };
    let len = bytes.len() as i64;
    let (range, end_given) = match args.len() {
        3 => (
            ByteRange {
                first: 0,
                last: len - 1,
                first_outside: 0,
                last_outside: 0,
            },
            false,
        ),
        4..=6 => {
            let start = parse_i64(&args[3])?;
            let bits = args.len() == 6 && bit_unit(&args[5])?;
            let end = match args.get(4) {
                Some(e) => parse_i64(e)?,
                None if bits => (len << 3) + 7,
                None => len - 1,
            };
            (byte_range(start, end, len, bits), args.len() >= 5)
        }
        _ => return Err(fail(SYNTAX)),
    };
    if range.first > range.last {
        return Ok(int(-1));
    }
    // Bits outside a BIT range read as the opposite of what is sought.
    let (first, last) = (range.first as usize, range.last as usize);
    let mut window = bytes[first..=last].to_vec();
    let n = window.len();
    let fill = |b: &mut u8, outside: u8| {
        if bit {
            *b &= !outside
        } else {
            *b |= outside
        }
    };
    fill(&mut window[0], range.first_outside);
    fill(&mut window[n - 1], range.last_outside);
    let found = window.iter().enumerate().find_map(|(i, &b)| {
        let b = if bit { b } else { !b };
        (b != 0).then(|| (i as i64) * 8 + i64::from(b.leading_zeros()))
    });
    // Looking for a clear bit past the string: the padding zeros count
    // only when no end was given.
    let pos = match found {
        Some(p) => p,
        None if bit => return Ok(int(-1)),
        None if end_given => return Ok(int(-1)),
        None => (n as i64) * 8,
    };
    Ok(int(pos + range.first * 8))
}

pub(super) fn bitop(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    let op = args[1].to_ascii_lowercase();
    if !matches!(&op[..], b"and" | b"or" | b"xor" | b"not") {
        return Err(fail(SYNTAX));
    }
    if op == b"not" && args.len() != 4 {
        return Err(fail(
            "ERR BITOP NOT must be called with a single source key.",
        ));
    }
    let target = &args[2];
    let keys: Vec<&[u8]> = args[2..].iter().map(|k| &k[..]).collect();
    let _locked = ctx.lock(&keys);
    let mut sources = Vec::with_capacity(args.len() - 3);
    for key in &args[3..] {
        sources.push(ctx.get_string(key)?.map(|(s, _)| s).unwrap_or_default());
    }
    let longest = sources.iter().map(Vec::len).max().unwrap_or(0);
    let (old, mut batch) = ctx.begin(target)?;
    if longest == 0 {
        if let Some(old) = &old {
            ctx.remove(&mut batch, target, &old.value)?;
        }
        ctx.commit(batch)?;
        return Ok(int(0));
    }
    let byte_of = |s: &Vec<u8>, j: usize| s.get(j).copied().unwrap_or(0);
    let result: Vec<u8> = (0..longest)
        .map(|j| {
            let first = byte_of(&sources[0], j);
            let rest = sources[1..].iter().map(|s| byte_of(s, j));
            match &op[..] {
                b"and" => rest.fold(first, |a, b| a & b),
                b"or" => rest.fold(first, |a, b| a | b),
                b"xor" => rest.fold(first, |a, b| a ^ b),
                _ => !first,
            }
        })
        .collect();
    if let Some(old) = old.as_ref().filter(|e| e.value.collection().is_some()) {
        ctx.remove(&mut batch, target, &old.value)?;
    }
    batch.put(
        target,
        &Entry {
            value: Value::String(result),
            expire_at_ms: 0,
        },
    )?;
    ctx.commit(batch)?;
    Ok(int(longest as i64))
}

/// What BITFIELD does when a value does not fit its field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Overflow {
    Wrap,
    Sat,
    Fail,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FieldOp {
    Get,
    Set(i64),
    IncrBy(i64),
}

/// One BITFIELD operation on a field of `width` bits at bit `offset`.
#[derive(Debug, Clone, Copy)]
struct Field {
    op: FieldOp,
    signed: bool,
    width: u32,
    offset: u64,
    overflow: Overflow,
}

/// `i8`..`i64` or `u1`..`u63`.
fn field_type(arg: &[u8]) -> Result<(bool, u32), Failure> {
    let signed = match arg.first() {
        Some(b'i') => true,
        Some(b'u') => false,
        _ => return Err(fail(FIELD_TYPE)),
    };
    let max = if signed { 64 } else { 63 };
    match string_to_i64(&arg[1..]) {
        Some(w) if (1..=max).contains(&w) => Ok((signed, w as u32)),
        _ => Err(fail(FIELD_TYPE)),
    }
}

fn parse_fields(args: &Args) -> Result<Vec<Field>, Failure> {
    let mut fields = Vec::new();
    let mut overflow = Overflow::Wrap;
    let mut j = 2;
    while j < args.len() {
        let more = args.len() - j - 1;
        let sub = args[j].to_ascii_lowercase();
        let takes_value = match &sub[..] {
            b"get" if more >= 2 => false,
            b"set" | b"incrby" if more >= 3 => true,
            b"overflow" if more >= 1 => {
                overflow = match args[j + 1].to_ascii_lowercase().as_slice() {
                    b"wrap" => Overflow::Wrap,
                    b"sat" => Overflow::Sat,
                    b"fail" => Overflow::Fail,
                    _ => return Err(fail("ERR Invalid OVERFLOW type specified")),
                };
                j += 2;
                continue;
            }
            _ => return Err(fail(SYNTAX)),
        };
        let (signed, width) = field_type(&args[j + 1])?;
        let offset = bit_offset(&args[j + 2], Some(width))?;
        let op = match &sub[..] {
            b"get" => FieldOp::Get,
            b"set" => FieldOp::Set(parse_i64(&args[j + 3])?),
            _ => FieldOp::IncrBy(parse_i64(&args[j + 3])?),
        };
        fields.push(Field {
            op,
            signed,
            width,
            offset,
            overflow,
        });
        j += if takes_value { 4 } else { 3 };
    }
    Ok(fields)
}

fn read_field(bytes: &[u8], offset: u64, width: u32) -> u64 {
    (0..u64::from(width)).fold(0, |v, i| (v << 1) | u64::from(bit_at(bytes, offset + i)))
}

fn write_field(bytes: &mut [u8], offset: u64, width: u32, value: u64) {
    for i in 0..width {
        let on = value & (1u64 << (width - 1 - i)) != 0;
        set_bit(bytes, offset + u64::from(i), on);
    }
}

fn signed_of(raw: u64, width: u32) -> i64 {
    if width < 64 && raw & (1u64 << (width - 1)) != 0 {
        (raw | (u64::MAX << width)) as i64
    } else {
        raw as i64
    }
}

/// `value + incr` in an unsigned field of `width` bits (Redis's
/// checkUnsignedBitfieldOverflow): the result, or None when it does not
/// fit and the policy is FAIL.
fn unsigned_step(value: u64, incr: i64, width: u32, overflow: Overflow) -> Option<u64> {
    let max = (1u64 << width) - 1;
    let max_incr = max.wrapping_sub(value) as i64;
    let min_incr = value.wrapping_neg() as i64;
    let over = value > max || (incr > 0 && incr > max_incr);
    let under = !over && incr < 0 && incr < min_incr;
    if !over && !under {
        return Some(value.wrapping_add(incr as u64));
    }
    match overflow {
        Overflow::Fail => None,
        Overflow::Sat => Some(if over { max } else { 0 }),
        Overflow::Wrap => Some(value.wrapping_add(incr as u64) & max),
    }
}

/// `value + incr` in a signed field of `width` bits (Redis's
/// checkSignedBitfieldOverflow).
fn signed_step(value: i64, incr: i64, width: u32, overflow: Overflow) -> Option<i64> {
    let max = if width == 64 {
        i64::MAX
    } else {
        (1i64 << (width - 1)) - 1
    };
    let min = -max - 1;
    let max_incr = (max as u64).wrapping_sub(value as u64) as i64;
    let min_incr = min.wrapping_sub(value);
    let over = value > max
        || (width != 64 && incr > max_incr)
        || (value >= 0 && incr > 0 && incr > max_incr);
    let under = !over
        && (value < min
            || (width != 64 && incr < min_incr)
            || (value < 0 && incr < 0 && incr < min_incr));
    if !over && !under {
        return Some(value.wrapping_add(incr));
    }
    match overflow {
        Overflow::Fail => None,
        Overflow::Sat => Some(if over { max } else { min }),
        Overflow::Wrap => {
            let c = (value as u64).wrapping_add(incr as u64);
            Some(signed_of(c & field_mask(width), width))
        }
    }
}

fn field_mask(width: u32) -> u64 {
    if width == 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    }
}

/// Applies a SET or INCRBY: its reply, and writes the field unless FAIL
/// stopped it.
fn apply_field(bytes: &mut [u8], f: &Field) -> Reply {
    let raw = read_field(bytes, f.offset, f.width);
    let (new, reply) = match (f.op, f.signed) {
        (FieldOp::Set(v), true) => {
            let old = signed_of(raw, f.width);
            (
                signed_step(v, 0, f.width, f.overflow).map(|n| n as u64),
                old,
            )
        }
        (FieldOp::IncrBy(by), true) => {
            let n = signed_step(signed_of(raw, f.width), by, f.width, f.overflow);
            (n.map(|n| n as u64), n.unwrap_or(0))
        }
        (FieldOp::Set(v), false) => (unsigned_step(v as u64, 0, f.width, f.overflow), raw as i64),
        (FieldOp::IncrBy(by), false) => {
            let n = unsigned_step(raw, by, f.width, f.overflow);
            (n, n.unwrap_or(0) as i64)
        }
        (FieldOp::Get, _) => unreachable!("GET is read, not applied"),
    };
    match new {
        Some(n) => {
            write_field(bytes, f.offset, f.width, n & field_mask(f.width));
            int(reply)
        }
        None => Reply::Null,
    }
}

fn get_field(bytes: &[u8], f: &Field) -> Reply {
    let raw = read_field(bytes, f.offset, f.width);
    int(if f.signed {
        signed_of(raw, f.width)
    } else {
        raw as i64
    })
}

fn bitfield_generic(ctx: &mut Ctx<'_>, args: &Args, read_only: bool) -> Outcome {
    let fields = parse_fields(args)?;
    let writes = fields.iter().filter(|f| f.op != FieldOp::Get);
    let Some(last) = writes.map(|f| f.offset + u64::from(f.width) - 1).max() else {
        let bytes = ctx
            .get_string(&args[1])?
            .map(|(s, _)| s)
            .unwrap_or_default();
        return Ok(Reply::Array(
            fields.iter().map(|f| get_field(&bytes, f)).collect(),
        ));
    };
    if read_only {
        return Err(fail("ERR BITFIELD_RO only supports the GET subcommand"));
    }
    super::strings::update_string(ctx, &args[1], |current| {
        let mut bytes = grown(current, last);
        let replies = fields
            .iter()
            .map(|f| match f.op {
                FieldOp::Get => get_field(&bytes, f),
                _ => apply_field(&mut bytes, f),
            })
            .collect();
        let changed = current != Some(&bytes[..]);
        Ok((changed.then_some(bytes), Reply::Array(replies)))
    })
}

pub(super) fn bitfield(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    bitfield_generic(ctx, args, false)
}

pub(super) fn bitfield_ro(ctx: &mut Ctx<'_>, args: &Args) -> Outcome {
    bitfield_generic(ctx, args, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_wrap_saturate_and_fail_as_redis_computes() {
        assert_eq!(unsigned_step(250, 10, 8, Overflow::Wrap), Some(4));
        assert_eq!(unsigned_step(250, 10, 8, Overflow::Sat), Some(255));
        assert_eq!(unsigned_step(250, 10, 8, Overflow::Fail), None);
        assert_eq!(unsigned_step(3, -5, 8, Overflow::Sat), Some(0));
        assert_eq!(unsigned_step(3, -5, 8, Overflow::Wrap), Some(254));
        assert_eq!(signed_step(120, 10, 8, Overflow::Wrap), Some(-126));
        assert_eq!(signed_step(120, 10, 8, Overflow::Sat), Some(127));
        assert_eq!(signed_step(-120, -10, 8, Overflow::Sat), Some(-128));
        assert_eq!(signed_step(i64::MAX, 1, 64, Overflow::Wrap), Some(i64::MIN));
        assert_eq!(signed_step(i64::MAX, 1, 64, Overflow::Fail), None);
        let mut bytes = vec![0u8; 2];
        write_field(&mut bytes, 7, 5, 23);
        assert_eq!(bytes, [0b0000_0001, 0b0111_0000]);
        assert_eq!(read_field(&bytes, 7, 5), 23);
        assert_eq!(signed_of(0b1_0111, 5), -9);
    }
}
