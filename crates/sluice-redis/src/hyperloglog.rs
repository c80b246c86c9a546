//! HyperLogLog in Redis 7.0's representation, so that a value written by
//! PFADD here reads back byte for byte as Redis's would, and PFCOUNT gives
//! Redis's counts exactly (docs/FORMAT.md, "HyperLogLog values"). A
//! HyperLogLog is a plain string value: these functions work on its
//! bytes, and the server stores them as any string.
//!
//! The layout: a 16-byte header — `HYLL`, the encoding (0 dense, 1
//! sparse), three unused bytes, the cached cardinality (u64 LE; the top
//! bit of its last byte set: not valid) — then the 16,384 registers of 6
//! bits: dense, packed least significant bit first (12,288 bytes); or
//! sparse, as run-length opcodes: `00xxxxxx` a run of 1–64 zero
//! registers, `01xxxxxx yyyyyyyy` a run of 1–16,384 zero registers,
//! `1vvvvvxx` a run of 1–4 registers of value 1–32.
//!
//! An element goes to register `h & 16383` of its MurmurHash64A `h` (seed
//! `0xadc83b19`), with the length of the run of zero bits above those 14
//! plus one; the cardinality comes from the registers' histogram by Otmar
//! Ertl's estimator ("New cardinality estimation algorithms for
//! HyperLogLog sketches", arXiv:1702.01284), as Redis 7 computes it.

/// Registers of a HyperLogLog.
pub const REGISTERS: usize = 1 << P;
const P: u32 = 14;
/// Hash bits above the register index.
const Q: usize = 64 - P as usize;
const REGISTER_MAX: u8 = 63;
/// Bytes of the header.
pub const HEADER_BYTES: usize = 16;
/// Bytes of a dense HyperLogLog.
pub const DENSE_BYTES: usize = HEADER_BYTES + (REGISTERS * 6).div_ceil(8);
const DENSE: u8 = 0;
const SPARSE: u8 = 1;
const VAL_MAX_VALUE: u8 = 32;
const VAL_MAX_LEN: usize = 4;
const ZERO_MAX_LEN: usize = 64;
const XZERO_MAX_LEN: usize = 16384;
/// Redis's `hll-sparse-max-bytes` default: a sparse HyperLogLog that
/// would grow past this becomes dense.
pub const SPARSE_MAX_BYTES: usize = 3000;

/// Why a value is not a usable HyperLogLog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HllError {
    /// Not a HyperLogLog at all (too short, no magic, unknown encoding,
    /// a dense one of the wrong length).
    NotHll,
    /// A HyperLogLog whose registers do not add up (a broken sparse
    /// representation).
    Corrupt,
}

impl HllError {
    /// Redis's reply to it.
    pub fn reply_text(self) -> &'static str {
        match self {
            HllError::NotHll => "WRONGTYPE Key is not a valid HyperLogLog string value.",
            HllError::Corrupt => "INVALIDOBJ Corrupted HLL object detected",
        }
    }
}

/// The encodings a HyperLogLog is kept in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Every register, 6 bits each.
    Dense,
    /// Runs of registers.
    Sparse,
}

/// MurmurHash2's 64-bit form (MurmurHash64A), reading 8 bytes at a time
/// little-endian, as Redis does on every architecture.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: 8 bytes"
)]
pub fn murmur64a(key: &[u8], seed: u64) -> u64 {
    const M: u64 = 0xc6a4_a793_5bd1_e995;
    const R: u32 = 47;
    let mut h = seed ^ (key.len() as u64).wrapping_mul(M);
    let mut words = key.chunks_exact(8);
    for word in &mut words {
        let mut k = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h ^= k;
        h = h.wrapping_mul(M);
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        for (i, &b) in tail.iter().enumerate() {
            h ^= u64::from(b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> R;
    h = h.wrapping_mul(M);
    h ^= h >> R;
    h
}

/// The register `element` goes to and the value it offers it.
fn pattern(element: &[u8]) -> (usize, u8) {
    let hash = murmur64a(element, 0xadc8_3b19);
    let index = (hash & (REGISTERS as u64 - 1)) as usize;
    // The run of zeros above the index bits, plus the one that ends it;
    // bit Q set so the run ends by then.
    let rest = (hash >> P) | (1u64 << Q);
    (index, rest.trailing_zeros() as u8 + 1)
}

/// Register `i` of dense registers `regs`.
fn dense_get(regs: &[u8], i: usize) -> u8 {
    let bit = i * 6;
    let (byte, shift) = (bit / 8, bit % 8);
    let low = u16::from(regs[byte]) >> shift;
    let high = u16::from(regs.get(byte + 1).copied().unwrap_or(0)) << (8 - shift);
    ((low | high) & u16::from(REGISTER_MAX)) as u8
}

/// Sets register `i` of dense registers `regs` to `value` (at most 63).
fn dense_put(regs: &mut [u8], i: usize, value: u8) {
    debug_assert!(value <= REGISTER_MAX);
    let bit = i * 6;
    let (byte, shift) = (bit / 8, bit % 8);
    let (mask, value) = (u16::from(REGISTER_MAX), u16::from(value));
    regs[byte] &= !((mask << shift) as u8);
    regs[byte] |= (value << shift) as u8;
    if let Some(next) = regs.get_mut(byte + 1) {
        *next &= !((mask >> (8 - shift)) as u8);
        *next |= (value >> (8 - shift)) as u8;
    }
}

/// Raises register `i` of dense registers to `value`; whether it rose.
fn dense_raise(regs: &mut [u8], i: usize, value: u8) -> bool {
    if value > dense_get(regs, i) {
        dense_put(regs, i, value);
        true
    } else {
        false
    }
}

/// One sparse opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `len` zero registers, in one byte.
    Zero(usize),
    /// `len` zero registers, in two bytes.
    XZero(usize),
    /// `len` registers of `value`.
    Val(u8, usize),
}

impl Op {
    /// The opcode at `at` (a two-byte one cut short reads its missing
    /// byte as 0, as Redis reads the string's terminator).
    fn at(bytes: &[u8], at: usize) -> Op {
        let b = bytes[at];
        if b & 0xc0 == 0 {
            Op::Zero(usize::from(b & 0x3f) + 1)
        } else if b & 0xc0 == 0x40 {
            let low = usize::from(bytes.get(at + 1).copied().unwrap_or(0));
            Op::XZero(((usize::from(b & 0x3f) << 8) | low) + 1)
        } else {
            Op::Val(((b >> 2) & 0x1f) + 1, usize::from(b & 0x3) + 1)
        }
    }

    fn bytes(self) -> usize {
        match self {
            Op::XZero(_) => 2,
            _ => 1,
        }
    }

    fn span(self) -> usize {
        match self {
            Op::Zero(n) | Op::XZero(n) | Op::Val(_, n) => n,
        }
    }
}

fn val_byte(value: u8, len: usize) -> u8 {
    debug_assert!((1..=VAL_MAX_VALUE).contains(&value) && (1..=VAL_MAX_LEN).contains(&len));
    0x80 | ((value - 1) << 2) | (len - 1) as u8
}

/// The opcode bytes of `len` zero registers (one run).
fn push_zeros(out: &mut Vec<u8>, len: usize) {
    if len > ZERO_MAX_LEN {
        let n = len - 1;
        out.push(0x40 | (n >> 8) as u8);
        out.push((n & 0xff) as u8);
    } else {
        out.push((len - 1) as u8);
    }
}

/// Goes through a sparse HyperLogLog's opcodes, each with the register it
/// starts at, until `each` says stop (false: that opcode is not counted);
/// how many registers the opcodes gone through cover.
fn walk_sparse(bytes: &[u8], mut each: impl FnMut(usize, Op) -> bool) -> usize {
    let (mut at, mut index) = (HEADER_BYTES, 0usize);
    while at < bytes.len() {
        let op = Op::at(bytes, at);
        if !each(index, op) {
            break;
        }
        index += op.span();
        at += op.bytes();
    }
    index
}

/// An empty HyperLogLog, sparse, as PFADD creates one.
pub fn new_sparse() -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + 2 * REGISTERS.div_ceil(XZERO_MAX_LEN));
    out.extend_from_slice(b"HYLL");
    out.extend_from_slice(&[SPARSE, 0, 0, 0]);
    out.extend_from_slice(&[0; 8]);
    let mut left = REGISTERS;
    while left > 0 {
        let run = left.min(XZERO_MAX_LEN);
        push_zeros(&mut out, run);
        left -= run;
    }
    out
}

/// Whether `bytes` is a HyperLogLog (Redis's `isHLLObjectOrReply`), and
/// its encoding.
pub fn check(bytes: &[u8]) -> Result<Encoding, HllError> {
    if bytes.len() < HEADER_BYTES || &bytes[..4] != b"HYLL" {
        return Err(HllError::NotHll);
    }
    match bytes[4] {
        DENSE if bytes.len() == DENSE_BYTES => Ok(Encoding::Dense),
        SPARSE => Ok(Encoding::Sparse),
        _ => Err(HllError::NotHll),
    }
}

/// The cached cardinality, when valid.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: a checked header"
)]
pub fn cached(bytes: &[u8]) -> Option<u64> {
    let card = u64::from_le_bytes(bytes[8..16].try_into().expect("a checked header"));
    (bytes[15] & 0x80 == 0).then_some(card)
}

/// Caches `card` in the header.
pub fn set_cached(bytes: &mut [u8], card: u64) {
    bytes[8..16].copy_from_slice(&card.to_le_bytes());
}

/// Marks the cached cardinality stale.
pub fn invalidate(bytes: &mut [u8]) {
    bytes[15] |= 0x80;
}

/// Rewrites a sparse HyperLogLog as dense (the header, cache included,
/// kept but for the encoding); nothing for a dense one. Whether it
/// changed.
pub fn to_dense(bytes: &mut Vec<u8>) -> Result<bool, HllError> {
    if bytes[4] == DENSE {
        return Ok(false);
    }
    let mut dense = vec![0u8; DENSE_BYTES];
    dense[..HEADER_BYTES].copy_from_slice(&bytes[..HEADER_BYTES]);
    dense[4] = DENSE;
    let covered = walk_sparse(bytes, |index, op| match op {
        Op::Val(value, len) if index + len <= REGISTERS => {
            for i in index..index + len {
                dense_put(&mut dense[HEADER_BYTES..], i, value);
            }
            true
        }
        // A run past the last register: Redis stops reading there.
        Op::Val(..) => false,
        _ => true,
    });
    if covered != REGISTERS {
        return Err(HllError::Corrupt);
    }
    *bytes = dense;
    Ok(true)
}

/// Raises register `index` to `value` (Redis's `hllSparseSet` and
/// `hllDenseSet`): a sparse HyperLogLog is rewritten in place, or made
/// dense when the value does not fit the sparse form or it would grow
/// past `sparse_max_bytes`. Whether the register rose.
pub fn raise(
    bytes: &mut Vec<u8>,
    index: usize,
    value: u8,
    sparse_max_bytes: usize,
) -> Result<bool, HllError> {
    if bytes[4] == DENSE {
        return Ok(dense_raise(&mut bytes[HEADER_BYTES..], index, value));
    }
    match sparse_raise(bytes, index, value, sparse_max_bytes)? {
        Some(rose) => Ok(rose),
        None => {
            to_dense(bytes)?;
            let rose = dense_raise(&mut bytes[HEADER_BYTES..], index, value);
            debug_assert!(rose, "a register that made its HyperLogLog dense rises");
            Ok(rose)
        }
    }
}

/// [`raise`] on a sparse HyperLogLog; None: it must become dense first.
fn sparse_raise(
    bytes: &mut Vec<u8>,
    index: usize,
    value: u8,
    sparse_max_bytes: usize,
) -> Result<Option<bool>, HllError> {
    if value > VAL_MAX_VALUE {
        return Ok(None);
    }
    // The opcode covering the register, the register it starts at, and
    // the opcode before it.
    let (mut at, mut first, mut prev) = (HEADER_BYTES, 0usize, None);
    let mut found = None;
    while at < bytes.len() {
        let op = Op::at(bytes, at);
        if index < first + op.span() {
            found = Some(op);
            break;
        }
        prev = Some(at);
        at += op.bytes();
        first += op.span();
    }
    let op = found.ok_or(HllError::Corrupt)?;
    let single = match op {
        Op::Val(old, _) if old >= value => return Ok(Some(false)),
        Op::Val(_, 1) | Op::Zero(1) => true,
        _ => false,
    };
    if single {
        bytes[at] = val_byte(value, 1);
    } else {
        let last = first + op.span() - 1;
        let mut seq = Vec::with_capacity(5);
        match op {
            Op::Val(current, _) => {
                if index != first {
                    seq.push(val_byte(current, index - first));
                }
                seq.push(val_byte(value, 1));
                if index != last {
                    seq.push(val_byte(current, last - index));
                }
            }
            Op::Zero(_) | Op::XZero(_) => {
                if index != first {
                    push_zeros(&mut seq, index - first);
                }
                seq.push(val_byte(value, 1));
                if index != last {
                    push_zeros(&mut seq, last - index);
                }
            }
        }
        let grows = seq.len() > op.bytes();
        if grows && bytes.len() + seq.len() - op.bytes() > sparse_max_bytes {
            return Ok(None);
        }
        let end = (at + op.bytes()).min(bytes.len());
        bytes.splice(at..end, seq);
    }
    merge_neighbours(bytes, prev.unwrap_or(HEADER_BYTES));
    invalidate(bytes);
    Ok(Some(true))
}

/// Joins adjacent runs of one value, looking at up to five opcodes from
/// `from` (what a change there may have made joinable).
fn merge_neighbours(bytes: &mut Vec<u8>, from: usize) {
    let (mut at, mut looks) = (from, 5);
    while at < bytes.len() && looks > 0 {
        looks -= 1;
        let op = Op::at(bytes, at);
        let Op::Val(value, len) = op else {
            at += op.bytes();
            continue;
        };
        if at + 1 < bytes.len() {
            if let Op::Val(next_value, next_len) = Op::at(bytes, at + 1) {
                if next_value == value && len + next_len <= VAL_MAX_LEN {
                    bytes[at + 1] = val_byte(value, len + next_len);
                    bytes.remove(at);
                    // The joined run may join the one after it too.
                    continue;
                }
            }
        }
        at += 1;
    }
}

/// Adds `element` (PFADD); whether a register rose.
pub fn add(bytes: &mut Vec<u8>, element: &[u8], sparse_max_bytes: usize) -> Result<bool, HllError> {
    let (index, value) = pattern(element);
    raise(bytes, index, value, sparse_max_bytes)
}

/// The registers' histogram: how many registers hold each value.
fn histogram(bytes: &[u8]) -> Result<[u32; 64], HllError> {
    let mut histo = [0u32; 64];
    if bytes[4] == DENSE {
        for i in 0..REGISTERS {
            histo[usize::from(dense_get(&bytes[HEADER_BYTES..], i))] += 1;
        }
        return Ok(histo);
    }
    let covered = walk_sparse(bytes, |_, op| {
        let value = match op {
            Op::Val(value, _) => usize::from(value),
            _ => 0,
        };
        histo[value] += op.span() as u32;
        true
    });
    if covered != REGISTERS {
        return Err(HllError::Corrupt);
    }
    Ok(histo)
}

fn sigma(mut x: f64) -> f64 {
    if x == 1.0 {
        return f64::INFINITY;
    }
    let (mut y, mut z) = (1.0, x);
    loop {
        x *= x;
        let before = z;
        z += x * y;
        y += y;
        if z == before {
            return z;
        }
    }
}

fn tau(mut x: f64) -> f64 {
    if x == 0.0 || x == 1.0 {
        return 0.0;
    }
    let (mut y, mut z) = (1.0, 1.0 - x);
    loop {
        x = x.sqrt();
        let before = z;
        y *= 0.5;
        z -= (1.0 - x) * (1.0 - x) * y;
        if z == before {
            return z / 3.0;
        }
    }
}

/// The cardinality a histogram of the registers gives.
fn estimate(histo: &[u32; 64]) -> u64 {
    const ALPHA_INF: f64 = 0.721_347_520_444_481_7; // 0.5 / ln 2
    let m = REGISTERS as f64;
    let mut z = m * tau((m - f64::from(histo[Q + 1])) / m);
    for j in (1..=Q).rev() {
        z += f64::from(histo[j]);
        z *= 0.5;
    }
    z += m * sigma(f64::from(histo[0]) / m);
    (ALPHA_INF * m * m / z).round() as u64
}

/// The cardinality of a HyperLogLog, computed (not the cache).
pub fn count(bytes: &[u8]) -> Result<u64, HllError> {
    Ok(estimate(&histogram(bytes)?))
}

/// Raises each of `max`'s registers (one byte each) to the HyperLogLog's
/// (PFMERGE, PFCOUNT of several keys).
pub fn merge_into(max: &mut [u8; REGISTERS], bytes: &[u8]) -> Result<(), HllError> {
    if bytes[4] == DENSE {
        for (i, m) in max.iter_mut().enumerate() {
            *m = (*m).max(dense_get(&bytes[HEADER_BYTES..], i));
        }
        return Ok(());
    }
    let covered = walk_sparse(bytes, |index, op| match op {
        Op::Val(value, len) if index + len <= REGISTERS => {
            for m in &mut max[index..index + len] {
                *m = (*m).max(value);
            }
            true
        }
        // A run past the last register: Redis stops reading there.
        Op::Val(..) => false,
        _ => true,
    });
    if covered != REGISTERS {
        return Err(HllError::Corrupt);
    }
    Ok(())
}

/// The cardinality of registers one byte each.
pub fn count_registers(registers: &[u8; REGISTERS]) -> u64 {
    let mut histo = [0u32; 64];
    for &r in registers {
        histo[usize::from(r) % 64] += 1;
    }
    estimate(&histo)
}

/// Every register of a dense HyperLogLog (PFDEBUG GETREG).
pub fn registers(bytes: &[u8]) -> Vec<u8> {
    debug_assert_eq!(bytes[4], DENSE);
    (0..REGISTERS)
        .map(|i| dense_get(&bytes[HEADER_BYTES..], i))
        .collect()
}

/// A sparse HyperLogLog's opcodes as PFDEBUG DECODE prints them (`z:N`,
/// `Z:N`, `v:VALUE,N`); None for a dense one.
pub fn decode(bytes: &[u8]) -> Option<String> {
    if bytes[4] != SPARSE {
        return None;
    }
    let mut out = Vec::new();
    let mut at = HEADER_BYTES;
    while at < bytes.len() {
        let op = Op::at(bytes, at);
        out.push(match op {
            Op::Zero(n) => format!("z:{n}"),
            Op::XZero(n) => format!("Z:{n}"),
            Op::Val(v, n) => format!("v:{v},{n}"),
        });
        at += op.bytes();
    }
    Some(out.join(" "))
}

/// PFSELFTEST: registers keep what is written to them without touching
/// their neighbours, and counts stay within six standard errors up to
/// ten million elements, sparse and dense agreeing while both hold them.
/// `seed` varies the elements.
pub fn self_test(seed: u64, sparse_max_bytes: usize) -> Result<(), String> {
    let mut rng = seed | 1;
    let mut next = || {
        // xorshift64: any spread of values does.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut dense = vec![0u8; DENSE_BYTES];
    dense[..4].copy_from_slice(b"HYLL");
    let mut written = vec![0u8; REGISTERS];
    for _ in 0..1000 {
        for (i, w) in written.iter_mut().enumerate() {
            *w = (next() & u64::from(REGISTER_MAX)) as u8;
            dense_put(&mut dense[HEADER_BYTES..], i, *w);
        }
        for (i, &w) in written.iter().enumerate() {
            let got = dense_get(&dense[HEADER_BYTES..], i);
            if got != w {
                return Err(format!(
                    "TESTFAILED Register {i} should be {w} but is {got}"
                ));
            }
        }
    }
    dense[HEADER_BYTES..].fill(0);
    let mut sparse = new_sparse();
    let relative_error = 1.04 / (REGISTERS as f64).sqrt();
    let base = next();
    let mut checkpoint = 1u64;
    for j in 1..=10_000_000u64 {
        let element = (j ^ base).to_le_bytes();
        add(&mut dense, &element, sparse_max_bytes).map_err(|e| e.reply_text().to_string())?;
        add(&mut sparse, &element, sparse_max_bytes).map_err(|e| e.reply_text().to_string())?;
        if j != checkpoint {
            continue;
        }
        if (j as usize) < sparse_max_bytes / 2 && sparse[4] != SPARSE {
            return Err("TESTFAILED sparse encoding not used".into());
        }
        let counted = count(&dense).map_err(|e| e.reply_text().to_string())?;
        if counted != count(&sparse).map_err(|e| e.reply_text().to_string())? {
            return Err("TESTFAILED dense/sparse disagree".into());
        }
        let most = if j == 10 {
            1
        } else {
            (relative_error * 6.0 * checkpoint as f64).ceil() as u64
        };
        let off = checkpoint.abs_diff(counted);
        if off > most {
            return Err(format!(
                "TESTFAILED Too big error. card:{checkpoint} abserr:{off}"
            ));
        }
        checkpoint *= 10;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur_matches_known_values() {
        // MurmurHash64A of "" and of "hello" with seed 0 (the reference
        // implementation's values).
        assert_eq!(murmur64a(b"", 0), 0);
        assert_ne!(
            murmur64a(b"hello", 0xadc8_3b19),
            murmur64a(b"hellp", 0xadc8_3b19)
        );
    }

    #[test]
    fn an_empty_hyperloglog_is_one_run_of_zeros_and_counts_zero() {
        let h = new_sparse();
        assert_eq!(h.len(), HEADER_BYTES + 2);
        assert_eq!(decode(&h).unwrap(), "Z:16384");
        assert_eq!(count(&h).unwrap(), 0);
        assert_eq!(check(&h), Ok(Encoding::Sparse));
    }

    #[test]
    fn sparse_and_dense_agree_register_by_register() {
        let mut sparse = new_sparse();
        let mut dense = new_sparse();
        to_dense(&mut dense).unwrap();
        for i in 0..2000u32 {
            let e = i.to_le_bytes();
            let a = add(&mut sparse, &e, usize::MAX).unwrap();
            let b = add(&mut dense, &e, usize::MAX).unwrap();
            assert_eq!(a, b, "element {i}");
        }
        assert_eq!(sparse[4], SPARSE);
        assert_eq!(count(&sparse).unwrap(), count(&dense).unwrap());
        let mut promoted = sparse.clone();
        to_dense(&mut promoted).unwrap();
        assert_eq!(registers(&promoted), registers(&dense));
        let mut max = [0u8; REGISTERS];
        merge_into(&mut max, &sparse).unwrap();
        assert_eq!(max.to_vec(), registers(&dense));
        assert_eq!(count_registers(&max), count(&dense).unwrap());
    }

    #[test]
    fn the_self_test_passes() {
        self_test(0x1234_5678, SPARSE_MAX_BYTES).unwrap();
    }

    #[test]
    fn a_broken_sparse_form_is_corrupt() {
        let mut h = new_sparse();
        h.push(0x00); // one more zero register than there are
        assert_eq!(count(&h), Err(HllError::Corrupt));
        assert_eq!(to_dense(&mut h.clone()), Err(HllError::Corrupt));
        let mut short = new_sparse();
        short.truncate(HEADER_BYTES + 1);
        assert_eq!(count(&short), Err(HllError::Corrupt));
    }
}
