//! Doubles as Redis reads and prints them: `strtod` over the whole
//! argument (no leading space, no NaN, no overflow or underflow to zero),
//! and `%.17g`.

/// A double as Redis's `getDoubleFromObject` takes it: the whole text,
/// decimal or `inf`/`infinity` with an optional sign; None for anything
/// else, NaN, a leading space, or a value too large or too small for a
/// double (where `strtod` reports ERANGE at infinity or zero).
pub fn parse_double(text: &[u8]) -> Option<f64> {
    let s = std::str::from_utf8(text).ok()?;
    let first = *text.first()?;
    if first.is_ascii_whitespace() {
        return None;
    }
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    let lower = unsigned.to_ascii_lowercase();
    if lower == "inf" || lower == "infinity" {
        return Some(if s.starts_with('-') {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        });
    }
    // Rust's parser takes what strtod takes in decimal, and more words
    // ("nan") that Redis refuses.
    if !unsigned
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
    {
        return None;
    }
    let value: f64 = s.parse().ok()?;
    if value.is_infinite() {
        return None;
    }
    if value == 0.0 {
        let mantissa = unsigned.split(['e', 'E']).next().unwrap_or("");
        if mantissa.bytes().any(|b| (b'1'..=b'9').contains(&b)) {
            return None;
        }
    }
    Some(value)
}

/// `value` printed as C's `%.17g` (Redis 7.0's `addReplyDouble` and
/// `d2string`): `inf`, `-inf`, `-0`, integers without a point, else 17
/// significant digits with trailing zeros cut, in exponent form below
/// 1e-4 or from 1e17.
#[expect(
    clippy::expect_used,
    reason = "each expect states its invariant: exponent form; exponent"
)]
pub fn format_double(value: f64) -> String {
    if value.is_infinite() {
        return if value > 0.0 { "inf" } else { "-inf" }.into();
    }
    if value.is_nan() {
        return "nan".into();
    }
    if value == 0.0 {
        return if value.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // 17 significant digits, rounded as printf rounds (exactly).
    let sci = format!("{value:.16e}");
    let (digits, exp) = sci.split_once('e').expect("exponent form");
    let exp: i32 = exp.parse().expect("exponent");
    let negative = digits.starts_with('-');
    let digits: String = digits.chars().filter(char::is_ascii_digit).collect();
    let sign = if negative { "-" } else { "" };
    if !(-4..17).contains(&exp) {
        let mut mantissa = format!("{}.{}", &digits[..1], &digits[1..]);
        trim_fraction(&mut mantissa);
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{mantissa}e{esign}{:02}", exp.abs());
    }
    let mut out = if exp >= 0 {
        let point = exp as usize + 1;
        format!("{}.{}", &digits[..point], &digits[point..])
    } else {
        format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
    };
    trim_fraction(&mut out);
    format!("{sign}{out}")
}

/// Cuts trailing zeros after a point, and the point if nothing follows.
fn trim_fraction(s: &mut String) {
    if s.contains('.') {
        while s.ends_with('0') {
            s.pop();
        }
        if s.ends_with('.') {
            s.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_print_as_printf_17g() {
        for (v, want) in [
            (1.0, "1"),
            (-3.0, "-3"),
            (1.1, "1.1000000000000001"),
            (0.1, "0.10000000000000001"),
            (1.5, "1.5"),
            (1e17, "1e+17"),
            (1.5e17, "1.5e+17"),
            (12345678901234567.0, "12345678901234568"),
            (0.0001, "0.0001"),
            (0.00001, "1.0000000000000001e-05"),
            (123.456, "123.456"),
            (-0.0, "-0"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (1e300, "1.0000000000000001e+300"),
            (5e-324, "4.9406564584124654e-324"),
        ] {
            assert_eq!(format_double(v), want, "{v:e}");
        }
    }

    #[test]
    fn doubles_parse_as_redis_takes_them() {
        assert_eq!(parse_double(b"1.5"), Some(1.5));
        assert_eq!(parse_double(b"-inf"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_double(b"+Infinity"), Some(f64::INFINITY));
        assert_eq!(parse_double(b"1e3"), Some(1000.0));
        assert_eq!(parse_double(b".5"), Some(0.5));
        assert_eq!(parse_double(b"-0"), Some(-0.0));
        assert_eq!(parse_double(b"0e5"), Some(0.0));
        for bad in [
            &b""[..],
            b" 1",
            b"1 ",
            b"nan",
            b"abc",
            b"1e400",
            b"1e-400",
            b"0x10",
            b"1,5",
        ] {
            assert_eq!(parse_double(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }
}
