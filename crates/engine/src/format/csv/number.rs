//! CSV fields as numbers, as TensorFlow's `decode_csv` parses them: integers in decimal within
//! `int32` or `int64`, floats with whitespace around, signs, exponents, `inf`/`infinity`/`nan` in
//! any case and hexadecimal, each parsed straight to its column's type — and the fast path's
//! plain decimals (Clinger's: an exact mantissa over an exact power of ten, one rounding).

use crate::options::{CsvType, CsvValue};

/// A byte of a field the fast path reads as a number.
pub(super) fn is_fast_byte(b: u8) -> bool {
    b.is_ascii_digit() || matches!(b, b'+' | b'-' | b'.')
}

/// `[+-]digits` as an integer within `i32` (`narrow`) or `i64`, as `str::parse` reads it.
pub(super) fn fast_int(field: &[u8], narrow: bool) -> Option<i64> {
    let (negative, digits) = match field.first()? {
        b'-' => (true, &field[1..]),
        b'+' => (false, &field[1..]),
        _ => (false, field),
    };
    if digits.is_empty() {
        return None;
    }
    // Accumulated negative, so that i64::MIN is read as str::parse reads it.
    let mut v: i64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_sub(i64::from(b - b'0'))?;
    }
    let v = if negative { v } else { v.checked_neg()? };
    (!narrow || i32::try_from(v).is_ok()).then_some(v)
}

/// Whitespace around a number, as TensorFlow's number parsing skips it.
pub(super) fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

pub(super) fn trim(field: &[u8]) -> &[u8] {
    let start = field.iter().position(|&b| !is_space(b)).unwrap_or(field.len());
    let end = field.iter().rposition(|&b| !is_space(b)).map_or(start, |e| e + 1);
    &field[start..end]
}

/// A non-empty field as a value of `dtype`, or `None` when it is not one.
#[must_use]
pub fn parse_field(field: &[u8], dtype: CsvType) -> Option<CsvValue> {
    if dtype == CsvType::String {
        return Some(CsvValue::Text(field.to_vec()));
    }
    let text = std::str::from_utf8(trim(field)).ok()?;
    if text.is_empty() {
        return None;
    }
    match dtype {
        CsvType::String => None,
        CsvType::I32 => text.parse::<i32>().ok().map(|v| CsvValue::Int(i64::from(v))),
        CsvType::I64 => text.parse::<i64>().ok().map(CsvValue::Int),
        CsvType::F32 => parse_float(text, true),
        CsvType::F64 => parse_float(text, false),
    }
}

/// Powers of ten exact in `f64` (and, to 10^10, in `f32`).
pub(super) const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20,
    1e21, 1e22,
];

/// The common case without the general parser: `[+-]digits[.digits]` (no exponent) whose digits
/// and scale make the result one correctly rounded operation on exact operands (Clinger's fast
/// path: an integer mantissa within the type's precision divided by an exact power of ten).
/// `None` when the text is not of that shape or too long: the general parser decides.
pub(super) fn fast_decimal(text: &[u8], single: bool) -> Option<f64> {
    let (negative, digits) = match text.first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let mut mantissa: u64 = 0;
    let (mut seen, mut scale, mut dot) = (0usize, 0usize, false);
    for &b in digits {
        match b {
            b'0'..=b'9' => {
                mantissa = mantissa.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
                seen += 1;
                scale += usize::from(dot);
            }
            b'.' if !dot => dot = true,
            _ => return None,
        }
    }
    let (max_mantissa, max_scale) = if single { (1u64 << 24, 10) } else { (1u64 << 53, 22) };
    if seen == 0 || mantissa > max_mantissa || scale > max_scale {
        return None;
    }
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    let magnitude = if single {
        // Both operands exact in f32: one rounding, to f32.
        f64::from(mantissa as f32 / POW10[scale] as f32)
    } else {
        mantissa as f64 / POW10[scale]
    };
    Some(if negative { -magnitude } else { magnitude })
}

pub(super) fn parse_float(text: &str, single: bool) -> Option<CsvValue> {
    if let Some(v) = fast_decimal(text.as_bytes(), single) {
        return Some(CsvValue::Float(v));
    }
    let (sign, body) = match text.as_bytes().first()? {
        b'-' => (-1.0, &text[1..]),
        b'+' => (1.0, &text[1..]),
        _ => (1.0, text),
    };
    if body.len() > 2 && body.as_bytes()[0] == b'0' && matches!(body.as_bytes()[1], b'x' | b'X') {
        return parse_hex(&body[2..], single).map(|v| CsvValue::Float(sign * v));
    }
    // Rust's parser takes what TensorFlow's does otherwise (signs, exponents, inf, infinity,
    // nan in any case), rounding correctly to the type; it refuses "1_0", "1e", ".".
    if body.starts_with(['+', '-']) {
        return None;
    }
    if single {
        text.parse::<f32>().ok().map(|v| CsvValue::Float(f64::from(v)))
    } else {
        text.parse::<f64>().ok().map(CsvValue::Float)
    }
}

/// A hexadecimal float's digits after `0x` (`1.8p3`, `10`), when its type holds it exactly.
pub(super) fn parse_hex(digits: &str, single: bool) -> Option<f64> {
    let (mantissa_text, exponent) = match digits.find(['p', 'P']) {
        Some(p) => (&digits[..p], digits[p + 1..].parse::<i32>().ok()?),
        None => (digits, 0),
    };
    let (int, frac) = mantissa_text.split_once('.').unwrap_or((mantissa_text, ""));
    if int.is_empty() && frac.is_empty() || !int.chars().chain(frac.chars()).all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    // Zeros before the integer digits and after the fraction's change nothing.
    let (int, frac) = (int.trim_start_matches('0'), frac.trim_end_matches('0'));
    let mut m: u64 = 0;
    let mut exp = i64::from(exponent);
    for (k, c) in int.chars().chain(frac.chars()).enumerate() {
        let d = u64::from(c.to_digit(16)?);
        if m >> 60 != 0 {
            // A 61st bit and more: exact in no float unless what follows is zeros of the integer
            // part (`0x10000000000000000`), which scale it; a fraction's digit here is followed by
            // a non-zero one (its trailing zeros are gone).
            if d != 0 || k >= int.len() {
                return None;
            }
            exp += 4;
            continue;
        }
        m = m * 16 + d;
        if k >= int.len() {
            exp -= 4;
        }
    }
    // The significant bits, from the highest set to the lowest: `0x1.fffffep0` has 24, which a
    // float32 holds (counting from bit 0 made it 25, and refused float32's largest values).
    let bits = if m == 0 { 0 } else { 64 - m.leading_zeros() - m.trailing_zeros() };
    if bits > if single { 24 } else { 53 } {
        return None;
    }
    #[allow(clippy::cast_precision_loss)]
    let mut v = m as f64;
    let e = i32::try_from(exp.clamp(-2200, 2200)).ok()?;
    v *= 2f64.powi(e.clamp(-1000, 1000));
    if e.abs() > 1000 {
        v *= 2f64.powi(e - e.clamp(-1000, 1000));
    }
    // Exact only if nothing was lost to the range: the value scales back to the mantissa.
    let exact = v.is_finite() && (m == 0 || v != 0.0);
    #[allow(clippy::cast_possible_truncation)]
    let fits = !single || f64::from(v as f32).to_bits() == v.to_bits();
    (exact && fits && (m == 0 || is_exact_scale(v, m, e))).then_some(v)
}

/// Whether `v` is exactly `m × 2^e`.
pub(super) fn is_exact_scale(v: f64, m: u64, e: i32) -> bool {
    let mut back = v;
    let mut k = e;
    while k > 0 {
        back /= 2.0;
        k -= 1;
    }
    while k < 0 {
        back *= 2.0;
        k += 1;
    }
    #[allow(clippy::cast_precision_loss, clippy::float_cmp)]
    let same = back == m as f64;
    same
}
