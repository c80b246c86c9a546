//! Stage 1: the structural index. For each 64-byte block, bit masks of the
//! bytes that matter (bit i is byte i of the block), then the offsets of the
//! structural bytes: the six operators `{ } [ ] : ,` outside strings, and
//! the first byte of every scalar (string, number, literal) outside strings.
//!
//! The masks are made with AVX2 compares where the build has AVX2
//! (`target-cpu=x86-64-v3`, the workspace's setting), and byte by byte
//! otherwise; [`classify_bytes`] is that fallback and the tests' reference.

use crate::{error, Error};

/// The masks of one 64-byte block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BlockMasks {
    /// `"`.
    pub quote: u64,
    /// `\`.
    pub backslash: u64,
    /// `{ } [ ] : ,`.
    pub op: u64,
    /// Space, tab, line feed, carriage return.
    pub whitespace: u64,
    /// Bytes below 0x20 (not allowed unescaped inside strings).
    pub control: u64,
    /// Bytes from 0x80 up (parts of multi-byte UTF-8 characters).
    pub non_ascii: u64,
}

/// Classifies one block byte by byte: the portable path and the reference
/// the SIMD path is tested against.
pub fn classify_bytes(block: &[u8; 64]) -> BlockMasks {
    let mut m = BlockMasks::default();
    for (i, &b) in block.iter().enumerate() {
        let bit = 1u64 << i;
        match b {
            b'"' => m.quote |= bit,
            b'\\' => m.backslash |= bit,
            b'{' | b'}' | b'[' | b']' | b':' | b',' => m.op |= bit,
            b' ' | b'\t' | b'\n' | b'\r' => m.whitespace |= bit,
            _ => {}
        }
        if b < 0x20 {
            m.control |= bit;
        }
        if b >= 0x80 {
            m.non_ascii |= bit;
        }
    }
    m
}

/// Classifies one block with AVX2: two 32-byte halves, each classified with
/// table lookups (`vpshufb`) for whitespace and operators, as simdjson does.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
#[inline(always)]
pub fn classify(block: &[u8; 64]) -> BlockMasks {
    avx2::classify(block)
}

/// Classifies one block; this build has no AVX2, so byte by byte.
#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
pub fn classify(block: &[u8; 64]) -> BlockMasks {
    classify_bytes(block)
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
mod avx2 {
    use super::BlockMasks;
    use safe_arch::{
        bitor_m256i, cmp_eq_mask_i8_m256i, m256i, max_u8_m256i, move_mask_i8_m256i,
        set_splat_i8_m256i, shuffle_av_i8z_half_m256i, sub_i8_m256i,
    };

    /// Indexed by a byte's low nibble: the one whitespace byte with that
    /// nibble, or a byte with another nibble (never equal). `vpshufb` gives 0
    /// for bytes with the high bit set, which equals none of them.
    const WHITESPACE: [u8; 32] = table([
        b' ', 100, 100, 100, 17, 100, 113, 2, 100, b'\t', b'\n', 112, 100, b'\r', 100, 100,
    ]);
    /// Indexed by the low nibble of (byte − ','): the operator that lands
    /// there with bit 5 set (`[`→`{`, `]`→`}`), or 0, which no byte with bit
    /// 5 set equals.
    const OPERATORS: [u8; 32] = table([
        b',', b'}', 0, 0, 0xc0, 0, 0, 0, 0, 0, 0, 0, 0, 0, b':', b'{',
    ]);

    /// `vpshufb` looks up within each 16-byte lane: the table twice.
    const fn table(t: [u8; 16]) -> [u8; 32] {
        let mut out = [0u8; 32];
        let mut i = 0;
        while i < 32 {
            out[i] = t[i % 16];
            i += 1;
        }
        out
    }

    #[inline(always)]
    fn load(block: &[u8; 64], at: usize) -> m256i {
        let mut bytes = [0u8; 32];
        bytes.copy_from_slice(&block[at..at + 32]);
        m256i::from(bytes)
    }

    #[inline(always)]
    fn splat(b: u8) -> m256i {
        set_splat_i8_m256i(b as i8)
    }

    #[inline(always)]
    fn bits(v: m256i) -> u64 {
        move_mask_i8_m256i(v) as u32 as u64
    }

    #[inline(always)]
    fn half(v: m256i) -> BlockMasks {
        let whitespace =
            cmp_eq_mask_i8_m256i(v, shuffle_av_i8z_half_m256i(m256i::from(WHITESPACE), v));
        let op = cmp_eq_mask_i8_m256i(
            bitor_m256i(v, splat(0x20)),
            shuffle_av_i8z_half_m256i(m256i::from(OPERATORS), sub_i8_m256i(v, splat(b','))),
        );
        // Bytes at most 0x1f: an unsigned max with 0x1f leaves them at 0x1f.
        let control = cmp_eq_mask_i8_m256i(max_u8_m256i(v, splat(0x1f)), splat(0x1f));
        BlockMasks {
            quote: bits(cmp_eq_mask_i8_m256i(v, splat(b'"'))),
            backslash: bits(cmp_eq_mask_i8_m256i(v, splat(b'\\'))),
            op: bits(op),
            whitespace: bits(whitespace),
            control: bits(control),
            // The high bit of each byte is what the mask instruction takes.
            non_ascii: bits(v),
        }
    }

    #[inline(always)]
    pub(super) fn classify(block: &[u8; 64]) -> BlockMasks {
        let (lo, hi) = (half(load(block, 0)), half(load(block, 32)));
        BlockMasks {
            quote: lo.quote | hi.quote << 32,
            backslash: lo.backslash | hi.backslash << 32,
            op: lo.op | hi.op << 32,
            whitespace: lo.whitespace | hi.whitespace << 32,
            control: lo.control | hi.control << 32,
            non_ascii: lo.non_ascii | hi.non_ascii << 32,
        }
    }
}

/// Bit i set where byte i is inside a string (the opening quote counts as
/// inside, the closing one does not): the XOR of all quote bits at or below i.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "pclmulqdq",
    target_feature = "sse4.1"
))]
fn prefix_xor(bits: u64) -> u64 {
    use safe_arch::{extract_i64_imm_m128i, m128i, mul_i64_carryless_m128i};
    // A carry-less multiply by all ones is the running XOR.
    let product = mul_i64_carryless_m128i::<0>(m128i::from([bits, 0]), m128i::from([u64::MAX, 0]));
    extract_i64_imm_m128i::<0>(product) as u64
}

/// As above, with shifts where the build has no carry-less multiply.
#[cfg(not(all(
    target_arch = "x86_64",
    target_feature = "pclmulqdq",
    target_feature = "sse4.1"
)))]
fn prefix_xor(mut bits: u64) -> u64 {
    bits ^= bits << 1;
    bits ^= bits << 2;
    bits ^= bits << 4;
    bits ^= bits << 8;
    bits ^= bits << 16;
    bits ^= bits << 32;
    bits
}

const ODD_BITS: u64 = 0xAAAA_AAAA_AAAA_AAAA;

/// What carries from one block into the next.
#[derive(Debug, Default, Clone, Copy)]
struct Carry {
    /// 1 if the next block's first byte is escaped.
    next_escaped: u64,
    /// All ones if the block ended inside a string.
    in_string: u64,
    /// 1 if the block ended in a scalar byte other than a quote.
    scalar: u64,
}

/// Bytes escaped by a backslash (the byte right after an odd run of
/// backslashes). Runs are told apart with one subtraction: shifted
/// backslashes with the odd bits set, minus the backslashes, leaves each
/// run's carry where its escaped byte is.
#[inline(always)]
fn escaped(backslash: u64, carry: &mut Carry) -> u64 {
    if backslash == 0 {
        let escaped = carry.next_escaped;
        carry.next_escaped = 0;
        return escaped;
    }
    let potential = backslash & !carry.next_escaped;
    let codes = ((potential << 1) | ODD_BITS).wrapping_sub(potential) ^ ODD_BITS;
    let escaped = codes ^ (backslash | carry.next_escaped);
    let escapes = codes & backslash;
    carry.next_escaped = escapes >> 63;
    escaped
}

/// Writes the offsets of `bytes`'s structural bytes into `out` and returns
/// how many there are: `out[..count]` (past it, `out` holds scratch; it only
/// grows, so a scanner reused on similar texts does not allocate). Fails on a
/// control byte inside a string, an escape other than `\" \\ \/ \b \f \n
/// \r \t \uXXXX`, or a string still open at the end.
pub fn index(bytes: &[u8], out: &mut Vec<u32>) -> Result<usize, Error> {
    index_noting_ascii(bytes, out).map(|(count, _)| count)
}

/// [`index`], and whether every byte of the text is ASCII (then the text is
/// valid UTF-8 without a further check).
pub fn index_noting_ascii(bytes: &[u8], out: &mut Vec<u32>) -> Result<(usize, bool), Error> {
    index_blocks::<false>(bytes, out).map(|(count, ascii, _)| (count, ascii))
}

/// [`index_noting_ascii`], and the CRC32C (Castagnoli, as the `crc32c`
/// crate and iSCSI compute it) of the text, taken from the same loads: the
/// checksum's dependency chain runs beside the index's work instead of in a
/// pass of its own.
pub fn index_noting_ascii_crc32c(
    bytes: &[u8],
    out: &mut Vec<u32>,
) -> Result<(usize, bool, u32), Error> {
    index_blocks::<true>(bytes, out)
}

#[inline(always)]
fn index_blocks<const CRC: bool>(
    bytes: &[u8],
    out: &mut Vec<u32>,
) -> Result<(usize, bool, u32), Error> {
    let mut crc = Crc32c::new();
    let mut count = 0;
    let mut carry = Carry::default();
    let mut non_ascii = 0;
    let (blocks, tail) = bytes.as_chunks::<64>();
    for (n, block) in blocks.iter().enumerate() {
        if CRC {
            crc.block(block);
        }
        let masks = classify(block);
        non_ascii |= masks.non_ascii;
        count = block_structurals(bytes, n * 64, &masks, &mut carry, out, count)?;
    }
    if !tail.is_empty() {
        // Spaces are whitespace: the padding adds nothing.
        if CRC {
            crc.bytes(tail);
        }
        let mut last = [b' '; 64];
        last[..tail.len()].copy_from_slice(tail);
        let masks = classify(&last);
        non_ascii |= masks.non_ascii;
        count = block_structurals(bytes, blocks.len() * 64, &masks, &mut carry, out, count)?;
    }
    if carry.in_string != 0 {
        return Err(error(
            bytes.len(),
            "string not closed at the end of the text",
        ));
    }
    Ok((count, non_ascii == 0, crc.finish()))
}

/// CRC32C with the SSE 4.2 instruction, eight bytes at a time.
#[cfg(all(target_arch = "x86_64", target_feature = "sse4.2"))]
struct Crc32c(u64);

#[cfg(all(target_arch = "x86_64", target_feature = "sse4.2"))]
impl Crc32c {
    fn new() -> Self {
        Crc32c(u32::MAX as u64)
    }

    #[inline(always)]
    fn block(&mut self, block: &[u8; 64]) {
        for word in block.as_chunks::<8>().0 {
            self.0 = safe_arch::crc32_u64(self.0, u64::from_le_bytes(*word));
        }
    }

    fn bytes(&mut self, bytes: &[u8]) {
        let mut crc = self.0 as u32;
        for &b in bytes {
            crc = safe_arch::crc32_u8(crc, b);
        }
        self.0 = crc as u64;
    }

    fn finish(self) -> u32 {
        !(self.0 as u32)
    }
}

/// CRC32C without the instruction: the `crc32c` crate's own software path.
#[cfg(not(all(target_arch = "x86_64", target_feature = "sse4.2")))]
struct Crc32c(u32);

#[cfg(not(all(target_arch = "x86_64", target_feature = "sse4.2")))]
impl Crc32c {
    fn new() -> Self {
        Crc32c(0)
    }

    fn block(&mut self, block: &[u8; 64]) {
        self.0 = crc32c::crc32c_append(self.0, block);
    }

    fn bytes(&mut self, bytes: &[u8]) {
        self.0 = crc32c::crc32c_append(self.0, bytes);
    }

    fn finish(self) -> u32 {
        self.0
    }
}

#[inline(always)]
fn block_structurals(
    bytes: &[u8],
    base: usize,
    m: &BlockMasks,
    carry: &mut Carry,
    out: &mut Vec<u32>,
    count: usize,
) -> Result<usize, Error> {
    let escaped = escaped(m.backslash, carry);
    let quote = m.quote & !escaped;
    let in_string = prefix_xor(quote) ^ carry.in_string;
    carry.in_string = ((in_string as i64) >> 63) as u64;
    let bad_control = m.control & in_string;
    if bad_control != 0 {
        let at = base + bad_control.trailing_zeros() as usize;
        return Err(error(at, "control character inside a string (escape it)"));
    }
    let escaped_inside = escaped & in_string;
    if escaped_inside != 0 {
        check_escapes(bytes, base, escaped_inside)?;
    }
    let scalar = !(m.op | m.whitespace);
    let nonquote_scalar = scalar & !quote;
    let follows_nonquote_scalar = (nonquote_scalar << 1) | carry.scalar;
    carry.scalar = nonquote_scalar >> 63;
    let scalar_start = scalar & !follows_nonquote_scalar;
    // String interiors and closing quotes are not structural; an opening
    // quote is (it starts a scalar).
    let string_tail = in_string ^ quote;
    let structural = (m.op | scalar_start) & !string_tail;
    Ok(push_offsets(base, structural, out, count))
}

/// Appends the offsets of the set bits at `out[count..]`, eight at a time
/// whatever the number of bits (fewer unpredictable branches; the slots past
/// the new count are scratch), and returns the new count.
#[inline(always)]
fn push_offsets(base: usize, mut bits: u64, out: &mut Vec<u32>, count: usize) -> usize {
    if count + 64 > out.len() {
        out.resize((out.len() * 2).max(count + 64).max(1024), 0);
    }
    let ones = bits.count_ones() as usize;
    let slots = &mut out[count..count + 64];
    let base = base as u32;
    for chunk in slots.chunks_exact_mut(8).take(ones.div_ceil(8)) {
        for slot in chunk {
            *slot = base.wrapping_add(bits.trailing_zeros());
            bits &= bits.wrapping_sub(1);
        }
    }
    count + ones
}

/// Checks each escaped byte inside a string: one of `" \ / b f n r t u`,
/// and `u` followed by four hex digits.
fn check_escapes(bytes: &[u8], base: usize, mut bits: u64) -> Result<(), Error> {
    while bits != 0 {
        let at = base + bits.trailing_zeros() as usize;
        bits &= bits - 1;
        match bytes.get(at) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {}
            Some(b'u') => {
                let hex = bytes.get(at + 1..at + 5);
                if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                    return Err(error(at - 1, "\\u not followed by four hex digits"));
                }
            }
            _ => return Err(error(at - 1, "unknown escape in a string")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The index as a byte-at-a-time reading of the text gives it.
    fn reference(bytes: &[u8]) -> Option<Vec<u32>> {
        let mut out = Vec::new();
        let (mut in_string, mut escaped, mut prev_scalar) = (false, false, false);
        for (i, &b) in bytes.iter().enumerate() {
            // Escapes count everywhere (one outside a string is an error
            // stage 2 finds at the backslash).
            let is_escaped = escaped;
            escaped = !is_escaped && b == b'\\';
            let quote = b == b'"' && !is_escaped;
            if in_string {
                in_string = !quote;
                prev_scalar = false;
                continue;
            }
            match b {
                b'{' | b'}' | b'[' | b']' | b':' | b',' => {
                    out.push(i as u32);
                    prev_scalar = false;
                }
                b' ' | b'\t' | b'\n' | b'\r' => prev_scalar = false,
                _ if quote => {
                    if !prev_scalar {
                        out.push(i as u32);
                    }
                    in_string = true;
                    prev_scalar = false;
                }
                _ => {
                    if !prev_scalar {
                        out.push(i as u32);
                    }
                    prev_scalar = true;
                }
            }
        }
        (!in_string).then_some(out)
    }

    #[test]
    fn simd_and_bytewise_classification_agree_on_every_byte() {
        let mut block = [0u8; 64];
        for start in (0..256).step_by(64) {
            for (i, b) in block.iter_mut().enumerate() {
                *b = (start + i) as u8;
            }
            assert_eq!(
                classify(&block),
                classify_bytes(&block),
                "bytes from {start}"
            );
        }
    }

    proptest! {
        #[test]
        fn simd_and_bytewise_classification_agree(block in proptest::array::uniform32(any::<u8>()), other in proptest::array::uniform32(any::<u8>())) {
            let mut b = [0u8; 64];
            b[..32].copy_from_slice(&block);
            b[32..].copy_from_slice(&other);
            prop_assert_eq!(classify(&b), classify_bytes(&b));
        }

        /// Texts of the bytes that matter (many backslashes and quotes, runs
        /// across block edges) index as the bytewise reading does.
        #[test]
        fn index_matches_a_bytewise_reading(text in proptest::collection::vec(
            prop_oneof![Just(b'"'), Just(b'\\'), Just(b'\\'), Just(b'{'), Just(b']'), Just(b':'),
                         Just(b','), Just(b' '), Just(b'\n'), Just(b'a'), Just(b'1'), Just(b'n'), Just(b't')],
            0..300)) {
            let mut got = Vec::new();
            let result = index(&text, &mut got);
            match reference(&text) {
                None => prop_assert!(result.is_err()),
                Some(want) => match result {
                    Ok(count) => prop_assert_eq!(&got[..count], &want[..]),
                    // Only a bad escape or a line feed inside a string may
                    // fail a text the reading accepts.
                    Err(e) => prop_assert!(
                        e.reason.contains("escape") || e.reason.contains("\\u") || e.reason.contains("control"),
                        "{e}"
                    ),
                },
            }
        }
    }

    proptest! {
        #[test]
        fn the_fused_crc32c_is_the_crc32c_of_the_text(
            text in proptest::collection::vec(prop_oneof![Just(b'"'), Just(b'a'), Just(b'['), any::<u8>()], 0..400)
        ) {
            let mut out = Vec::new();
            if let Ok((count, ascii, crc)) = index_noting_ascii_crc32c(&text, &mut out) {
                prop_assert_eq!(crc, crc32c::crc32c(&text));
                let mut plain = Vec::new();
                prop_assert_eq!(index_noting_ascii(&text, &mut plain), Ok((count, ascii)));
                prop_assert_eq!(&out[..count], &plain[..count]);
            }
        }

        #[test]
        fn the_ascii_note_is_exact(text in proptest::collection::vec(
            prop_oneof![Just(b'"'), Just(b'a'), Just(b' '), Just(0x7fu8), Just(0x80u8), Just(0xc3u8), Just(0xffu8)],
            0..300)) {
            let mut out = Vec::new();
            if let Ok((_, ascii)) = index_noting_ascii(&text, &mut out) {
                prop_assert_eq!(ascii, text.is_ascii());
            }
        }
    }

    #[test]
    fn escapes_across_block_edges() {
        for run in 1..6 {
            for pad in 55..66 {
                let mut text = vec![b'"'];
                text.extend(std::iter::repeat_n(b'a', pad));
                text.extend(std::iter::repeat_n(b'\\', run * 2));
                text.extend_from_slice(b"\",1]");
                let mut full = b"[".to_vec();
                full.extend(&text);
                let mut got = Vec::new();
                let count = index(&full, &mut got).unwrap();
                assert_eq!(
                    Some(got[..count].to_vec()),
                    reference(&full),
                    "run {run} pad {pad}"
                );
                // An odd run escapes the quote: the string stays open.
                let mut odd = full.clone();
                odd.insert(1 + 1 + pad, b'\\');
                assert!(index(&odd, &mut Vec::new()).is_err(), "run {run} pad {pad}");
            }
        }
    }
}
