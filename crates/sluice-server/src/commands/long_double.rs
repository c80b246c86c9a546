//! INCRBYFLOAT's arithmetic as Redis does it: C's `long double` — on
//! x86-64 the x87 80-bit format, a 64-bit significand — read with
//! `strtold`, added, and printed with `%.17Lf` with trailing zeros cut.
//! f64 would print `1005.6` where Redis prints `1005.59999999999999998`,
//! so Sluice computes in the same format, exactly, with big integers:
//! parse and sum are rounded once to 64 significant bits (ties to even),
//! as the x87 unit and glibc do, and printing is exact.
//!
//! Out of scope (Sluice refuses them as "not a valid float", Redis would
//! accept them): hexadecimal floats, and subnormal results (below about
//! 3.6e-4951).

use num_bigint::BigUint;
use num_traits::{One, Zero};

/// Significand bits of the x87 extended format.
const SIGNIFICAND_BITS: u64 = 64;
/// Values at or above 2^16384 overflow.
const MAX_BINARY_EXPONENT: i64 = 16384;
/// Values below 2^-16445 (the smallest subnormal) underflow to zero.
const MIN_BINARY_EXPONENT: i64 = -16445;
/// Decimal exponents beyond which a non-zero value surely overflows or
/// underflows (the format spans about 1e-4951 to 1e4932).
const MAX_DECIMAL_EXPONENT: i64 = 5000;
/// Redis refuses float strings this long or longer (MAX_LONG_DOUBLE_CHARS).
const MAX_TEXT_BYTES: usize = 5 * 1024;

/// Text Redis does not read as a long double.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAFloat;

/// A finite long double: `(-1)^negative × significand × 2^exponent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LongDouble {
    negative: bool,
    significand: u64,
    exponent: i64,
}

impl LongDouble {
    fn zero(negative: bool) -> Self {
        LongDouble {
            negative,
            significand: 0,
            exponent: 0,
        }
    }

    /// `n × 2^shift` rounded to 64 significant bits; None past the range.
    fn round(negative: bool, n: &BigUint, shift: i64) -> Option<Self> {
        if n.is_zero() {
            return Some(LongDouble::zero(negative));
        }
        let bits = n.bits();
        let (mut q, mut drop) = if bits <= SIGNIFICAND_BITS {
            (n.clone(), 0u64)
        } else {
            let drop = bits - SIGNIFICAND_BITS;
            let q = n >> drop;
            let rem = n - (&q << drop);
            let half = BigUint::one() << (drop - 1);
            let odd = q.bit(0);
            let up = rem > half || (rem == half && odd);
            (if up { q + 1u32 } else { q }, drop)
        };
        if q.bits() > SIGNIFICAND_BITS {
            q >>= 1;
            drop += 1;
        }
        let exponent = shift + drop as i64;
        if exponent + q.bits() as i64 > MAX_BINARY_EXPONENT {
            return None;
        }
        let significand = q.iter_u64_digits().next().unwrap_or(0);
        Some(LongDouble {
            negative,
            significand,
            exponent,
        })
    }

    /// Reads `text` as Redis's string2ld does: the whole string, no
    /// leading space, not NaN, no overflow. `Ok(None)`: infinity (which
    /// Redis reads, and every sum with it is refused after).
    pub fn parse(text: &[u8]) -> Result<Option<LongDouble>, NotAFloat> {
        if text.is_empty() || text.len() >= MAX_TEXT_BYTES {
            return Err(NotAFloat);
        }
        let (negative, body) = match text[0] {
            b'-' => (true, &text[1..]),
            b'+' => (false, &text[1..]),
            _ => (false, text),
        };
        let lower = body.to_ascii_lowercase();
        if lower == b"inf" || lower == b"infinity" {
            return Ok(None);
        }
        let (digits, exponent) = decimal_parts(body).ok_or(NotAFloat)?;
        if digits.is_zero() {
            return Ok(Some(LongDouble::zero(negative)));
        }
        if exponent.abs() > MAX_DECIMAL_EXPONENT {
            // Overflow (ERANGE, HUGE_VAL) or underflow to zero (ERANGE):
            // both refused by Redis.
            return Err(NotAFloat);
        }
        let value = if exponent >= 0 {
            LongDouble::round(negative, &(digits * pow10(exponent as u32)), 0)
        } else {
            let divisor = pow10((-exponent) as u32);
            let k = (SIGNIFICAND_BITS as i64 + 2 + divisor.bits() as i64 - digits.bits() as i64)
                .max(0) as u64;
            let scaled = digits << k;
            let q = &scaled / &divisor;
            let sticky = !(scaled - &q * &divisor).is_zero();
            let q = (q << 1u32) + u32::from(sticky);
            LongDouble::round(negative, &q, -(k as i64) - 1)
        };
        match value {
            // Below the smallest subnormal: strtold underflows to zero
            // with ERANGE, which Redis refuses.
            Some(v)
                if v.exponent + (64 - v.significand.leading_zeros() as i64)
                    <= MIN_BINARY_EXPONENT =>
            {
                Err(NotAFloat)
            }
            Some(v) => Ok(Some(v)),
            None => Err(NotAFloat),
        }
    }

    /// `self + other`, rounded; None if it overflows.
    pub fn add(&self, other: &LongDouble) -> Option<LongDouble> {
        let e = self.exponent.min(other.exponent);
        let a = BigUint::from(self.significand) << (self.exponent - e) as u64;
        let b = BigUint::from(other.significand) << (other.exponent - e) as u64;
        if self.negative == other.negative {
            return LongDouble::round(self.negative, &(a + b), e);
        }
        match a.cmp(&b) {
            std::cmp::Ordering::Equal => Some(LongDouble::zero(false)),
            std::cmp::Ordering::Greater => LongDouble::round(self.negative, &(a - b), e),
            std::cmp::Ordering::Less => LongDouble::round(other.negative, &(b - a), e),
        }
    }

    /// `%.17Lf`, trailing zeros and a bare point cut, `-0` as `0`
    /// (Redis's ld2string in LD_STR_HUMAN mode).
    pub fn to_human(&self) -> String {
        let scaled = BigUint::from(self.significand) * pow10(17);
        let q = if self.exponent >= 0 {
            scaled << self.exponent as u64
        } else {
            let drop = (-self.exponent) as u64;
            let q = &scaled >> drop;
            let rem = &scaled - (&q << drop);
            let half = BigUint::one() << (drop - 1);
            if rem > half || (rem == half && q.bit(0)) {
                q + 1u32
            } else {
                q
            }
        };
        let digits = q.to_str_radix(10);
        let digits = format!("{digits:0>18}");
        let (int_part, frac) = digits.split_at(digits.len() - 17);
        let frac = frac.trim_end_matches('0');
        let mut out = String::new();
        if self.negative {
            out.push('-');
        }
        out.push_str(int_part);
        if !frac.is_empty() {
            out.push('.');
            out.push_str(frac);
        }
        if out == "-0" {
            out = "0".into();
        }
        out
    }
}

fn pow10(n: u32) -> BigUint {
    BigUint::from(10u32).pow(n)
}

/// The digits (as one integer) and decimal exponent of `[digits][.digits]
/// [e[+-]digits]`; None if `text` is not all of that form.
fn decimal_parts(text: &[u8]) -> Option<(BigUint, i64)> {
    let mut i = 0;
    let mut digits = Vec::new();
    let mut exponent: i64 = 0;
    let mut seen_digit = false;
    while i < text.len() && text[i].is_ascii_digit() {
        digits.push(text[i]);
        seen_digit = true;
        i += 1;
    }
    if i < text.len() && text[i] == b'.' {
        i += 1;
        while i < text.len() && text[i].is_ascii_digit() {
            digits.push(text[i]);
            exponent -= 1;
            seen_digit = true;
            i += 1;
        }
    }
    if !seen_digit {
        return None;
    }
    if i < text.len() && (text[i] == b'e' || text[i] == b'E') {
        let rest = &text[i + 1..];
        let (sign, rest) = match rest.first() {
            Some(b'-') => (-1i64, &rest[1..]),
            Some(b'+') => (1, &rest[1..]),
            _ => (1, rest),
        };
        if rest.is_empty() || !rest.iter().all(u8::is_ascii_digit) {
            return None;
        }
        // Clamped: anything this far out over- or underflows anyway.
        let mut e: i64 = 0;
        for &d in rest {
            e = (e * 10 + (d - b'0') as i64).min(1 << 40);
        }
        exponent += sign * e;
        i = text.len();
    }
    if i != text.len() {
        return None;
    }
    let value = BigUint::parse_bytes(&digits, 10)?;
    Some((value, exponent))
}

/// Why a float step failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatStepError {
    /// A value is not a float.
    NotAFloat,
    /// The sum is NaN or infinite.
    NotFinite,
}

/// Redis's INCRBYFLOAT step: `current + by`, printed as Redis prints it.
pub fn incr_by_float(current: &[u8], by: &[u8]) -> Result<String, FloatStepError> {
    let value = LongDouble::parse(current).map_err(|_| FloatStepError::NotAFloat)?;
    let by = LongDouble::parse(by).map_err(|_| FloatStepError::NotAFloat)?;
    match (value, by) {
        (Some(a), Some(b)) => a
            .add(&b)
            .map(|s| s.to_human())
            .ok_or(FloatStepError::NotFinite),
        _ => Err(FloatStepError::NotFinite),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(a: &str, b: &str) -> String {
        incr_by_float(a.as_bytes(), b.as_bytes()).unwrap()
    }

    #[test]
    fn sums_print_as_redis_prints_them() {
        // Each expected text is what redis-server 7.0 (x86-64) replies.
        assert_eq!(sum("10.5", "0.1"), "10.6");
        assert_eq!(sum("5.6", "1e3"), "1005.59999999999999998");
        assert_eq!(sum("0", "9223372036854775807"), "9223372036854775807");
        assert_eq!(sum("3.0", "0"), "3");
        assert_eq!(sum("-1.5", "1.5"), "0");
        assert_eq!(sum("1", "-3"), "-2");
    }

    #[test]
    fn bad_floats_are_refused() {
        for bad in [
            "", "abc", " 1", "1 ", "nan", "1e", "1e5000", "1e-5000", ".", "0x10",
        ] {
            assert!(LongDouble::parse(bad.as_bytes()).is_err(), "{bad:?}");
        }
        assert_eq!(LongDouble::parse(b"inf"), Ok(None));
        assert_eq!(incr_by_float(b"inf", b"1"), Err(FloatStepError::NotFinite));
    }
}
