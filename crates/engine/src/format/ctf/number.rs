//! CNTK's number grammar, bit for bit (`TryReadRealNumber`, `TryReadUint64`; reference §1.7).
//!
//! The value accumulates in `f64` exactly as CNTK does — digits as `number * 10 + d`, the
//! fraction as `coefficient + number / divider`, the exponent as `coefficient * 10^e` — and is
//! only then narrowed to the element type. Correctly rounded parsing (`str::parse`) differs from
//! CNTK in rare last bits, so it is deliberately not used. Parsing stops at the first byte that
//! does not fit, without consuming it: `1-2` is two numbers.

/// Why a number could not be read. The offset of the offending byte is returned beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumberError {
    /// The first byte is neither a digit nor a sign.
    Start,
    /// A sign not followed by a digit.
    AfterSign,
    /// `e`/`E` not followed by a digit or sign.
    AfterExponent,
    /// An exponent sign not followed by a digit.
    AfterExponentSign,
    /// The input ended where a digit was required.
    Truncated,
}

impl NumberError {
    /// What was expected, for messages.
    #[must_use]
    pub fn expected(self) -> &'static str {
        match self {
            Self::Start => "a number (a digit, '+' or '-')",
            Self::AfterSign => "a digit after the sign",
            Self::AfterExponent => "a digit, '+' or '-' after the exponent symbol",
            Self::AfterExponentSign => "a digit after the exponent sign",
            Self::Truncated => "more digits, but the input ended",
        }
    }
}

#[inline]
fn digit(b: u8) -> Option<f64> {
    b.is_ascii_digit().then(|| f64::from(b - b'0'))
}

/// Parses a CNTK real number at `bytes[pos..]`; `bytes` ends where the sequence ends.
///
/// Returns the value and the offset of the first byte not consumed.
///
/// # Errors
/// The kind of error and the offset of the offending byte (or `bytes.len()` when truncated).
#[inline]
pub fn parse_real(bytes: &[u8], mut pos: usize) -> Result<(f64, usize), (NumberError, usize)> {
    let at = |p: usize| bytes.get(p).copied();
    let mut negative = false;
    match at(pos) {
        Some(b'+' | b'-') => {
            negative = bytes[pos] == b'-';
            pos += 1;
            match at(pos) {
                Some(b) if b.is_ascii_digit() => {}
                Some(_) => return Err((NumberError::AfterSign, pos)),
                None => return Err((NumberError::Truncated, pos)),
            }
        }
        Some(b) if b.is_ascii_digit() => {}
        Some(_) => return Err((NumberError::Start, pos)),
        None => return Err((NumberError::Truncated, pos)),
    }
    let sign = |x: f64| if negative { -x } else { x };
    let mut number = 0.0f64;
    while let Some(d) = at(pos).and_then(digit) {
        number = number * 10.0 + d;
        pos += 1;
    }
    let coefficient = match at(pos) {
        Some(b'.') => {
            pos += 1;
            let Some(first) = at(pos).and_then(digit) else {
                // "4." is 4; the terminator after the period is not consumed ("1.e5" is 1, then "e5").
                return Ok((sign(number), pos));
            };
            let coefficient = number;
            let mut frac = first;
            let mut divider = 10.0f64;
            pos += 1;
            while let Some(d) = at(pos).and_then(digit) {
                frac = frac * 10.0 + d;
                divider *= 10.0;
                pos += 1;
            }
            let c = coefficient + frac / divider;
            if !matches!(at(pos), Some(b'e' | b'E')) {
                return Ok((sign(c), pos));
            }
            sign(c)
        }
        Some(b'e' | b'E') => sign(number),
        _ => return Ok((sign(number), pos)),
    };
    // At 'e' / 'E'.
    pos += 1;
    let mut exp_negative = false;
    match at(pos) {
        Some(b'+' | b'-') => {
            exp_negative = bytes[pos] == b'-';
            pos += 1;
            match at(pos) {
                Some(b) if b.is_ascii_digit() => {}
                Some(_) => return Err((NumberError::AfterExponentSign, pos)),
                None => return Err((NumberError::Truncated, pos)),
            }
        }
        Some(b) if b.is_ascii_digit() => {}
        Some(_) => return Err((NumberError::AfterExponent, pos)),
        None => return Err((NumberError::Truncated, pos)),
    }
    let mut exponent = 0.0f64;
    while let Some(d) = at(pos).and_then(digit) {
        exponent = exponent * 10.0 + d;
        pos += 1;
    }
    let exponent = if exp_negative { -exponent } else { exponent };
    Ok((coefficient * 10f64.powf(exponent), pos))
}

/// Why a sparse index could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexError {
    /// No digit where the index should start.
    NoDigits,
    /// More than 64 bits.
    Overflow,
}

/// Parses CNTK's `TryReadUint64` at `bytes[pos..]`: digits only, no sign, overflow checked.
///
/// # Errors
/// The kind and the offset of the offending byte.
#[inline]
pub fn parse_index(bytes: &[u8], mut pos: usize) -> Result<(u64, usize), (IndexError, usize)> {
    let start = pos;
    let mut value: u64 = 0;
    while let Some(&b) = bytes.get(pos) {
        if !b.is_ascii_digit() {
            break;
        }
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(b - b'0')))
            .ok_or((IndexError::Overflow, pos))?;
        pos += 1;
    }
    if pos == start {
        return Err((IndexError::NoDigits, pos));
    }
    Ok((value, pos))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(s: &str) -> Option<(f64, usize)> {
        parse_real(s.as_bytes(), 0).ok()
    }

    #[test]
    fn accepted_forms() {
        for (s, v) in [
            ("1", 1.0),
            ("-2", -2.0),
            ("+3", 3.0),
            ("4.", 4.0),
            ("1e2", 100.0),
            ("1E+2", 100.0),
            ("-1.5e-1", -0.15),
            ("00012.50", 12.5),
            ("7e-0", 7.0),
            ("3.", 3.0),
        ] {
            let (got, end) = one(s).unwrap_or_else(|| panic!("{s} rejected"));
            assert_eq!(end, s.len(), "{s}");
            assert!((got - v).abs() <= 1e-12 * v.abs().max(1.0), "{s}: {got} != {v}");
        }
    }

    #[test]
    fn rejected_forms() {
        for s in [".5", "-.5", "inf", "nan", "2e ", "2e", "-", "+", "e5", "x"] {
            assert!(parse_real(s.as_bytes(), 0).is_err(), "{s} accepted");
        }
    }

    #[test]
    fn stops_without_consuming_the_terminator() {
        assert_eq!(one("0x10"), Some((0.0, 1)));
        assert_eq!(one("1,5"), Some((1.0, 1)));
        assert_eq!(one("2.0f"), Some((2.0, 3)));
        // "1.e5": the period state ends on 'e', so 1. is read and "e5" is left over.
        assert_eq!(one("1.e5"), Some((1.0, 2)));
        assert_eq!(one("1-2"), Some((1.0, 1)));
        let b = b"3+4e1";
        assert_eq!(parse_real(b, 1).ok(), Some((40.0, 5)));
    }

    #[test]
    fn overflow_and_underflow() {
        assert_eq!(one("1e400").map(|x| x.0), Some(f64::INFINITY));
        assert_eq!(one("1e-400").map(|x| x.0), Some(0.0));
        #[allow(clippy::cast_possible_truncation)] // narrowing to f32 is what is tested: it overflows
        let narrowed = one("-1e39").map(|x| x.0 as f32);
        assert_eq!(narrowed, Some(f32::NEG_INFINITY));
        let (v, _) = one("123456789012345678901234567890").expect("long mantissa");
        assert!((v - 1.234_567_890_123_456_8e29).abs() / v < 1e-15);
    }

    #[test]
    fn cntk_arithmetic_not_correct_rounding() {
        // CNTK: coefficient + number/divider in f64; 0.1 + 0.2 style sums are not re-rounded.
        let (v, _) = one("1.1").expect("1.1");
        assert_eq!(v.to_bits(), (1.0f64 + 1.0 / 10.0).to_bits());
        let (v, _) = one("9.10e-11").expect("9.10e-11");
        assert_eq!(v.to_bits(), ((9.0f64 + 10.0 / 100.0) * 10f64.powf(-11.0)).to_bits());
    }

    /// The reference implementation: CNTK's digit loop, literally.
    fn cntk_reference(s: &str) -> f64 {
        let b = s.as_bytes();
        let mut number = 0.0f64;
        let mut i = 0;
        while i < b.len() && b[i].is_ascii_digit() {
            number = number * 10.0 + f64::from(b[i] - b'0');
            i += 1;
        }
        if i < b.len() && b[i] == b'.' {
            i += 1;
            let coefficient = number;
            let (mut frac, mut divider) = (0.0f64, 1.0f64);
            while i < b.len() && b[i].is_ascii_digit() {
                frac = frac * 10.0 + f64::from(b[i] - b'0');
                divider *= 10.0;
                i += 1;
            }
            return coefficient + frac / divider;
        }
        number
    }

    #[test]
    fn fast_digit_accumulation_is_bit_identical_to_cntk() {
        let cases = [
            "0.1",
            "123456789012345",
            "1234567890123456",
            "9007199254740993",
            "123456789012345678901234567890",
            "0.000000000000000000000001",
            "3.14159265358979323846264338327950288",
            "99999999999999999999.99999999999999999999",
            "1.0000000000000002220446",
        ];
        for s in cases {
            let (v, _) = parse_real(s.as_bytes(), 0).expect(s);
            assert_eq!(v.to_bits(), cntk_reference(s).to_bits(), "{s}");
        }
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let int_digits = (x % 25) as usize;
            let frac_digits = ((x >> 8) % 30) as usize;
            let digits: String =
                (0..int_digits.max(1) + frac_digits).map(|i| char::from(b'0' + ((x >> (i % 60)) % 10) as u8)).collect();
            let s = format!("{}.{}", &digits[..int_digits.max(1)], &digits[int_digits.max(1)..]);
            let (v, _) = parse_real(s.as_bytes(), 0).expect("parses");
            assert_eq!(v.to_bits(), cntk_reference(&s).to_bits(), "{s}");
        }
    }

    #[test]
    fn indices() {
        assert_eq!(parse_index(b"12:", 0), Ok((12, 2)));
        assert_eq!(parse_index(b"-1:", 0), Err((IndexError::NoDigits, 0)));
        assert_eq!(parse_index(b"18446744073709551616", 0).map_err(|e| e.0), Err(IndexError::Overflow));
        assert_eq!(parse_index(b"18446744073709551615", 0).map(|x| x.0), Ok(u64::MAX));
    }
}
