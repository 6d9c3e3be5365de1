//! Numbers of the deepx formats: a strict grammar with deepx's arithmetic.
//!
//! * **Feature ids** are unsigned decimal `u64`s: digits only, no sign, no hex; a value that does
//!   not fit in 64 bits is an error (deepx wraps it modulo 2^64).
//! * **Reals** (labels, weights, feature values) follow the grammar
//!   `[+-]? ( digits ( '.' digits* )? | '.' digits ) ( [eE] [+-]? digits )?`. deepx's
//!   `fast_strtod` also takes `-`, `+`, `.` (as 0), `1.2.3` (as 1.23) and `1e` (as 1); here they
//!   are errors. For every number both accept, the value is bit-identical to deepx's: the
//!   mantissa digits accumulate as `b = b * 10 + c - '0'` in `f64`, the exponent is the explicit
//!   one minus the number of fraction digits, and the result is `b * POW10[e]` with the `f64`
//!   nearest to `10^e` (deepx's table covers `1e-323..=1e308`); the caller narrows it to the
//!   element type. Exponents outside deepx's table (undefined behaviour there) are evaluated by
//!   Rust's correctly rounded parser instead.
//!
//! Parsers take the whole line and a start offset and return the offset after the number, so the
//! caller decides what may follow it. Nothing here allocates.

// `parse_id` and `parse_real` are `#[inline(always)]` so their fast paths sit in the callers'
// token loops (the slow paths are `#[cold]`, `#[inline(never)]`); measure with
// scripts/bench/bench_libsvm.sh before leaving inlining to rustc.
#![allow(clippy::inline_always)]

use super::pow10::POW10;

/// Smallest exponent of deepx's `POW10` table.
const MIN_EXP: i64 = -323;
/// Largest exponent of deepx's `POW10` table.
const MAX_EXP: i64 = 308;
/// Mantissas up to this value accumulate exactly in a `u64`: `b * 10 + 57 < 2^53`, so every
/// step of deepx's `f64` chain is exact too.
const EXACT_MANTISSA: u64 = ((1 << 53) - 57) / 10;

/// Why a feature id could not be read; the offset of the offending byte is returned beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdError {
    /// The first byte is not a decimal digit.
    NoDigits,
    /// More than 64 bits.
    Overflow,
}

/// The 8 bytes at `bytes[q..q + 8]` as a little-endian word, if there are 8.
#[inline]
fn load8(bytes: &[u8], q: usize) -> Option<u64> {
    let b: [u8; 8] = bytes.get(q..q + 8)?.try_into().ok()?;
    Some(u64::from_le_bytes(b))
}

/// The number of leading ASCII digits of the little-endian word `w` (0..=8) and their value.
///
/// SWAR: a byte is a digit iff its high nibble is 3 both as is and after adding 6. Carries and
/// borrows between bytes only run from a non-digit byte towards later bytes, which are past the
/// first non-digit and shifted out before the digits are combined.
#[inline]
fn swar_digits(w: u64) -> (u64, usize) {
    const HI: u64 = 0xF0F0_F0F0_F0F0_F0F0;
    const THREES: u64 = 0x3030_3030_3030_3030;
    let bad = ((w & HI) ^ THREES) | ((w.wrapping_add(0x0606_0606_0606_0606) & HI) ^ THREES);
    let n = (bad.trailing_zeros() / 8) as usize;
    if n == 0 {
        return (0, 0);
    }
    // The n digits in the top n bytes, zeros (leading zeros) below.
    let d = w.wrapping_sub(THREES) << (8 * (8 - n));
    // Combine 8 digit bytes (first digit in the lowest byte) into their value (Lemire).
    let d = d.wrapping_mul(10).wrapping_add(d >> 8);
    let v = ((d & 0x0000_00FF_0000_00FF).wrapping_mul(100 + (1_000_000 << 32))
        + ((d >> 16) & 0x0000_00FF_0000_00FF).wrapping_mul(1 + (10_000 << 32)))
        >> 32;
    (v, n)
}

/// Bytes [`plain_feature`] reads at once: an 8-digit id, `:`, `-`, a digit, `.`, 7 digits and a
/// blank (20), with room for its 8-byte loads (the fraction's starts at byte 12 at most).
pub const FEATURE_WINDOW: usize = 24;

/// The feature at the start of `w` when it has the shape of most features of hashed categorical
/// and normalised numeric data (Criteo's in libsvm form, for one) — `id:d` or `id:d.ddddddd`
/// (1–8 id digits, one integer digit, 1–7 fraction digits) followed by a space or a tab — as
/// `(id, value, offset of that blank)`, the value perhaps negative (`id:-d.ddd`: read on a path
/// of its own, [`negative_plain_value`]); `None` for anything else (`+`, longer integer parts,
/// exponents, ids of 9 digits and more), which the caller reads with [`parse_id`] and
/// [`parse_real`]: accepting a sign and two integer digits in the one path cost 10–15 % on plain
/// data. The value is
/// bit for bit what [`parse_real`] returns for the same bytes (its fast path: the mantissa's
/// digits times `POW10`), and within every range check (`|v| < 10`).
#[must_use]
#[inline(always)]
pub fn plain_feature(w: &[u8; FEATURE_WINDOW]) -> Option<(u64, f64, usize)> {
    let (id, n) = swar_digits(u64::from_le_bytes(w[..8].try_into().ok()?));
    // No digit, or more than eight (the ninth byte is then a digit, not ':'): the general reader
    // decides. (Reading a ninth and tenth digit here, for hashed ids up to 2^32, made files of
    // nine-digit ids 1.6x faster to parse but files of seven- and eight-digit ids 8-17 % slower,
    // however it was placed: a test in the loop, a selected second word, a call on the way out.)
    if n == 0 || w[n] != b':' {
        return None;
    }
    let d = w[n + 1].wrapping_sub(b'0');
    if d > 9 {
        // Not a digit: a negative value of the same shape (normalised numeric features are
        // signed), read apart so that the unsigned path stays as it was; anything else, `None`.
        return if w[n + 1] == b'-' { negative_plain_value(w, id, n + 2) } else { None };
    }
    plain_value(w, id, d, n + 2)
}

/// The rest of a plain feature whose integer digit `d` is read, from `at` (`<= 11`): a blank, or
/// `.` and 1–7 fraction digits then a blank.
#[inline(always)]
fn plain_value(w: &[u8; FEATURE_WINDOW], id: u64, d: u8, at: usize) -> Option<(u64, f64, usize)> {
    match w[at] {
        b' ' | b'\t' => Some((id, f64::from(d), at)),
        b'.' => {
            let at = at + 1; // <= 12
            let (frac, k) = swar_digits(u64::from_le_bytes(w[at..at + 8].try_into().ok()?));
            if k == 0 || k == 8 || !matches!(w[at + k], b' ' | b'\t') {
                return None;
            }
            Some((id, scaled(u64::from(d) * POW10_U64[k] + frac, k), at + k))
        }
        _ => None,
    }
}

/// [`plain_feature`] past `id:-` (the value's digits from `at`, `<= 10`): the value negated, as
/// [`parse_real`] negates it (so `-0` is `-0.0`).
#[inline(never)]
fn negative_plain_value(w: &[u8; FEATURE_WINDOW], id: u64, at: usize) -> Option<(u64, f64, usize)> {
    let d = w[at].wrapping_sub(b'0');
    if d > 9 {
        return None;
    }
    plain_value(w, id, d, at + 1).map(|(id, v, end)| (id, -v, end))
}

/// All leading digits at `bytes[q..]`: their value (meaningful up to 19 digits; wraps beyond)
/// and their count.
#[inline]
fn digit_run(bytes: &[u8], mut q: usize) -> (u64, usize) {
    // No digit, or a single one (a value `1`, the `0` of `0.25`: most runs of a libsvm file
    // that are not ids), costs two byte tests instead of a word's classification.
    let Some(first) = digit(bytes.get(q)) else { return (0, 0) };
    if digit(bytes.get(q + 1)).is_none() {
        return (u64::from(first), 1);
    }
    let start = q;
    let mut v = 0u64;
    while let Some(w) = load8(bytes, q) {
        let (x, n) = swar_digits(w);
        v = v.wrapping_mul(POW10_U64[n]).wrapping_add(x);
        q += n;
        // Eight digits then a non-digit (ids up to 10^8): one byte test, not another word.
        if n < 8 || digit(bytes.get(q)).is_none() {
            return (v, q - start);
        }
    }
    while let Some(&b) = bytes.get(q) {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            break;
        }
        v = v.wrapping_mul(10).wrapping_add(u64::from(d));
        q += 1;
    }
    (v, q - start)
}

/// `10^n` for `n` in `0..=19`.
const POW10_U64: [u64; 20] = {
    let mut t = [1u64; 20];
    let mut i = 1;
    while i < 20 {
        t[i] = t[i - 1] * 10;
        i += 1;
    }
    t
};

/// Reads the unsigned decimal at `bytes[p..]`.
///
/// # Errors
/// [`IdError`] with the offset of the number's first byte.
#[inline(always)]
pub fn parse_id(bytes: &[u8], p: usize) -> Result<(u64, usize), (IdError, usize)> {
    let (v, n) = digit_run(bytes, p);
    match n {
        0 => Err((IdError::NoDigits, p)),
        1..=19 => Ok((v, p + n)),
        _ => parse_long_id(bytes, p, n),
    }
}

/// More than 19 digits (leading zeros allowed): checked, digit by digit.
#[cold]
#[inline(never)]
fn parse_long_id(bytes: &[u8], p: usize, n: usize) -> Result<(u64, usize), (IdError, usize)> {
    let mut v: u64 = 0;
    for &b in &bytes[p..p + n] {
        v = v.checked_mul(10).and_then(|v| v.checked_add(u64::from(b - b'0'))).ok_or((IdError::Overflow, p))?;
    }
    Ok((v, p + n))
}

/// Why a real number could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RealError {
    /// No mantissa digit (`-`, `.`, `+`, a letter, the end of the line).
    NoDigits,
    /// `e`/`E` (and a sign) not followed by a digit.
    BadExponent,
}

impl RealError {
    /// What was expected, for messages.
    #[must_use]
    pub fn expected(self) -> &'static str {
        match self {
            Self::NoDigits => "a number (digits, with an optional sign, '.' and exponent)",
            Self::BadExponent => "digits after the exponent symbol",
        }
    }
}

#[inline]
fn digit(b: Option<&u8>) -> Option<u8> {
    let d = b?.wrapping_sub(b'0');
    (d <= 9).then_some(d)
}

/// Accumulates a run of digits onto the mantissa `(int, float)`: `int` while exact, then deepx's
/// `f64` chain. Returns the new offset and the number of digits read.
#[inline]
fn mantissa_digits(bytes: &[u8], mut q: usize, int: &mut u64, float: &mut Option<f64>) -> (usize, i64) {
    let start = q;
    if float.is_none() {
        while let Some(d) = digit(bytes.get(q)) {
            if *int > EXACT_MANTISSA {
                break;
            }
            *int = *int * 10 + u64::from(d);
            q += 1;
        }
    }
    while let Some(d) = digit(bytes.get(q)) {
        #[allow(clippy::cast_precision_loss)] // int ≤ 2^53 here: exact
        let b = float.unwrap_or(*int as f64);
        // deepx: `b = b * 10 + *s - '0'`, evaluated left to right in double.
        *float = Some((b * 10.0 + f64::from(d + b'0')) - f64::from(b'0'));
        q += 1;
    }
    #[allow(clippy::cast_possible_wrap)] // a line is far shorter than 2^63 bytes
    (q, (q - start) as i64)
}

/// The real at `bytes[p..]` when it is a single digit not followed by another digit, `.`, `e`
/// or `E` (the `1` of a categorical feature `id:1`), and the offset after it: exactly what
/// [`parse_real`] returns there (`d * 10^0`, and `10^0` is 1), for two byte tests.
#[must_use]
#[inline(always)]
pub fn single_digit_real(bytes: &[u8], p: usize) -> Option<(f64, usize)> {
    let d = digit(bytes.get(p))?;
    match bytes.get(p + 1) {
        Some(b'0'..=b'9' | b'.' | b'e' | b'E') => None,
        _ => Some((f64::from(d), p + 1)),
    }
}

/// Reads the real number at `bytes[p..]` with deepx's arithmetic, as `f64`.
///
/// # Errors
/// [`RealError`] with the offset of the offending byte.
#[inline(always)]
pub fn parse_real(bytes: &[u8], p: usize) -> Result<(f64, usize), (RealError, usize)> {
    // Fast path: `-?digits(.digits)?` with at most 15 digits and no exponent — almost every value
    // in practice. The mantissa is exact, so `int * POW10[-frac]` is deepx's result bit for bit.
    let neg = bytes.get(p) == Some(&b'-');
    let mut q = p + usize::from(neg);
    let (int, ni) = digit_run(bytes, q);
    q += ni;
    let (mut mantissa, mut digits, mut frac) = (int, ni, 0usize);
    if bytes.get(q) == Some(&b'.') {
        let (f, nf) = digit_run(bytes, q + 1);
        q += 1 + nf;
        digits += nf;
        frac = nf;
        if digits <= 15 {
            mantissa = int * POW10_U64[nf] + f;
        }
    }
    if digits > 0 && digits <= 15 && !matches!(bytes.get(q), Some(b'e' | b'E')) {
        let v = scaled(mantissa, frac);
        return Ok((if neg { -v } else { v }, q));
    }
    parse_real_slow(bytes, p)
}

/// deepx's value of a mantissa of at most 15 digits of which the last `frac` are after the
/// point: `mantissa × POW10[-frac]`. Below 10^15, so the signed conversion (one instruction) is
/// exact; the table index is 323 - frac.
#[inline(always)]
#[allow(clippy::cast_precision_loss, clippy::cast_possible_wrap, clippy::cast_possible_truncation)]
fn scaled(mantissa: u64, frac: usize) -> f64 {
    mantissa as i64 as f64 * POW10[MIN_EXP.unsigned_abs() as usize - frac]
}

/// Every other form: long mantissas, exponents, and errors.
#[cold]
#[inline(never)]
fn parse_real_slow(bytes: &[u8], p: usize) -> Result<(f64, usize), (RealError, usize)> {
    let mut q = p;
    let negative = match bytes.get(q) {
        Some(b'-') => {
            q += 1;
            true
        }
        Some(b'+') => {
            q += 1;
            false
        }
        _ => false,
    };
    let mut int = 0u64;
    let mut float = None;
    let (after_int, int_digits) = mantissa_digits(bytes, q, &mut int, &mut float);
    q = after_int;
    let mut frac_digits = 0;
    if bytes.get(q) == Some(&b'.') {
        let (after_frac, n) = mantissa_digits(bytes, q + 1, &mut int, &mut float);
        q = after_frac;
        frac_digits = n;
    }
    if int_digits + frac_digits == 0 {
        return Err((RealError::NoDigits, p));
    }
    let mut exp: i64 = 0;
    if matches!(bytes.get(q), Some(b'e' | b'E')) {
        let mut r = q + 1;
        let exp_negative = match bytes.get(r) {
            Some(b'-') => {
                r += 1;
                true
            }
            Some(b'+') => {
                r += 1;
                false
            }
            _ => false,
        };
        if digit(bytes.get(r)).is_none() {
            return Err((RealError::BadExponent, r));
        }
        while let Some(d) = digit(bytes.get(r)) {
            // Saturate: anything beyond ±10^6 is far outside every range check anyway.
            exp = (exp * 10 + i64::from(d)).min(1_000_000);
            r += 1;
        }
        if exp_negative {
            exp = -exp;
        }
        q = r;
    }
    #[allow(clippy::cast_precision_loss)] // int ≤ 2^53 when float is None: exact
    let b = float.unwrap_or(int as f64);
    let b = if negative { -b } else { b };
    let e = exp - frac_digits;
    let value = if (MIN_EXP..=MAX_EXP).contains(&e) {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // in the table's range
        let k = (e - MIN_EXP) as usize;
        b * POW10[k]
    } else {
        // Outside deepx's table: correctly rounded (0, a subnormal or infinity). The token is
        // ASCII by construction.
        std::str::from_utf8(&bytes[p..q]).ok().and_then(|s| s.parse::<f64>().ok()).unwrap_or(f64::NAN)
    };
    Ok((value, q))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn real(s: &str) -> Result<(f64, usize), (RealError, usize)> {
        parse_real(s.as_bytes(), 0)
    }

    #[test]
    fn reals_follow_deepx_arithmetic() {
        // deepx: 708333 * 1e-6 in double, then (float); the reference prints 0.708333015.
        #[allow(clippy::cast_possible_truncation)]
        let f = real("0.708333").expect("number").0 as f32;
        assert_eq!(format!("{f:.9}"), "0.708333015");
        assert_eq!(real("1e2"), Ok((100.0, 3)));
        assert_eq!(real("1E-2").map(|r| r.0), Ok(1.0 * 1e-2));
        assert_eq!(real("+1"), Ok((1.0, 2)));
        assert_eq!(real("1."), Ok((1.0, 2)));
        assert_eq!(real(".5"), Ok((5.0 * 1e-1, 2)));
        assert!(real("-0").expect("number").0.is_sign_negative());
        // Long mantissas continue in f64 exactly as deepx does.
        let (v, end) = real("12345678901234567890").expect("number");
        assert_eq!(end, 20);
        assert!((v - 1.234_567_890_123_456_8e19).abs() < 1e4);
    }

    #[test]
    fn deepx_lenient_forms_are_rejected_or_stop_early() {
        assert_eq!(real("-"), Err((RealError::NoDigits, 0)));
        assert_eq!(real("."), Err((RealError::NoDigits, 0)));
        assert_eq!(real("+"), Err((RealError::NoDigits, 0)));
        assert_eq!(real("nan"), Err((RealError::NoDigits, 0)));
        assert_eq!(real("1e"), Err((RealError::BadExponent, 2)));
        assert_eq!(real("1e+"), Err((RealError::BadExponent, 3)));
        // `1.2.3` stops after `1.2`: the caller rejects the second '.'.
        assert_eq!(real("1.2.3").map(|r| r.1), Ok(3));
    }

    #[test]
    fn exponents_outside_the_table_are_correctly_rounded() {
        assert_eq!(real("1e400").map(|r| r.0), Ok(f64::INFINITY));
        assert_eq!(real("1e-400").map(|r| r.0), Ok(0.0));
        assert_eq!(real("0e999999999999999999999").map(|r| r.0), Ok(0.0));
    }

    #[test]
    fn single_digit_reals_are_what_parse_real_reads() {
        let mut seen = 0;
        for d in b'0'..=b'9' {
            // Every byte after the digit, and the end of the bytes.
            let mut texts: Vec<Vec<u8>> = (0..=255u8).map(|next| vec![d, next, b'5']).collect();
            texts.push(vec![d]);
            for text in texts {
                if let Some(fast) = single_digit_real(&text, 0) {
                    let full = parse_real(&text, 0).expect("a digit is a real");
                    assert_eq!((fast.0.to_bits(), fast.1), (full.0.to_bits(), full.1), "{text:?}");
                    seen += 1;
                } else {
                    assert!(text.len() > 1 && matches!(text[1], b'0'..=b'9' | b'.' | b'e' | b'E'), "{text:?}");
                }
            }
        }
        assert_eq!(seen, 10 * (256 - 13 + 1));
        assert_eq!(single_digit_real(b"x", 0), None);
        assert_eq!(single_digit_real(b"", 0), None);
    }

    #[test]
    fn swar_digit_runs_match_a_scalar_reading() {
        for text in [
            "",
            "x",
            "7",
            "12345678",
            "123456789",
            "00000000000000000001",
            "9:1",
            "1234567.5",
            "12|3",
            "99999999999999999999",
        ] {
            for pad in ["", "        ", "0123456789 "] {
                let s = format!("{text}{pad}");
                let n = s.bytes().take_while(u8::is_ascii_digit).count();
                let scalar = s.bytes().take(n).fold(0u64, |v, b| v.wrapping_mul(10).wrapping_add(u64::from(b - b'0')));
                assert_eq!(digit_run(s.as_bytes(), 0), (scalar, n), "{s:?}");
            }
        }
        // Every byte value after a digit prefix of every length.
        for len in 0..9 {
            for b in 0..=255u8 {
                let mut s = "12345678".as_bytes()[..len].to_vec();
                s.push(b);
                s.extend_from_slice(b"00000000");
                let n = s.iter().take_while(|c| c.is_ascii_digit()).count();
                let scalar = s[..n].iter().fold(0u64, |v, c| v.wrapping_mul(10).wrapping_add(u64::from(c - b'0')));
                assert_eq!(digit_run(&s, 0), (scalar, n), "{s:?}");
            }
        }
    }

    /// What the general readers make of the feature at the start of `w`, for the shapes
    /// [`plain_feature`] may take: `(id, value bits, offset after the value)`.
    fn general_feature(w: &[u8]) -> Option<(u64, u64, usize)> {
        let (id, q) = parse_id(w, 0).ok()?;
        if w.get(q) != Some(&b':') {
            return None;
        }
        let (v, r) = single_digit_real(w, q + 1).or_else(|| parse_real(w, q + 1).ok())?;
        Some((id, v.to_bits(), r))
    }

    /// Every answer of the plain-feature reader is the general readers' answer for the same
    /// bytes, ending at a blank; it answers for every `id:d`, `id:d.f` and `id:-d.f` of up to 8 id and 7
    /// fraction digits followed by a blank, and for nothing else.
    #[test]
    #[allow(clippy::cast_possible_truncation)] // random digits and indices below 32
    fn plain_features_read_as_the_general_readers_do() {
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let alphabet = b"0123456789:. \t|-+eE#x";
        let (mut taken, mut plain) = (0, 0);
        for round in 0..200_000 {
            let mut w = [0u8; FEATURE_WINDOW];
            if round % 2 == 0 {
                // A well-formed feature of random shape, then random bytes.
                let id_digits = 1 + (next() % 10) as usize;
                let frac = (next() % 9) as usize; // 0: `id:d`; 8: too long for the fast path
                let mut t: Vec<u8> = (0..id_digits).map(|_| b'0' + (next() % 10) as u8).collect();
                t.push(b':');
                let negative = next() % 4 == 0;
                if negative {
                    t.push(b'-');
                }
                let int_digits = 1 + (next() % 3) as usize;
                t.extend((0..int_digits).map(|_| b'0' + (next() % 10) as u8));
                if frac > 0 {
                    t.push(b'.');
                    t.extend((0..frac).map(|_| b'0' + (next() % 10) as u8));
                }
                t.push(if next() % 2 == 0 { b' ' } else { b'\t' });
                // The shapes of the fast path (a `-` included); longer integer parts are read by
                // the general readers (handling them on the fast path slowed plain data down).
                let is_plain = id_digits <= 8 && int_digits == 1 && frac <= 7;
                plain += usize::from(is_plain);
                t.resize(FEATURE_WINDOW, b'7');
                w.copy_from_slice(&t[..FEATURE_WINDOW]);
                if is_plain {
                    assert!(plain_feature(&w).is_some(), "{:?}", String::from_utf8_lossy(&w));
                }
            } else {
                for b in &mut w {
                    *b = alphabet[(next() % alphabet.len() as u64) as usize];
                }
            }
            if let Some((id, v, end)) = plain_feature(&w) {
                taken += 1;
                assert!(matches!(w[end], b' ' | b'\t'), "{:?}", String::from_utf8_lossy(&w));
                assert_eq!(general_feature(&w), Some((id, v.to_bits(), end)), "{:?}", String::from_utf8_lossy(&w));
            }
        }
        assert!(taken >= plain && plain > 15_000, "{taken} taken, {plain} plain");
        // The edges: nine id digits, eight fraction digits, a `+`, an exponent, no blank, a
        // sign alone or twice.
        for text in [
            "123456789:1 ",
            "123456789:-0.5 ",
            "1:0.12345678 ",
            "1:-0.12345678 ",
            "1:+0.5 ",
            "1:1e2 ",
            "1:-1e2 ",
            "1:5. ",
            "1:-5. ",
            "1:5|",
            ":1 ",
            "1:12 ",
            "1:-12 ",
            "1:- ",
            "1:--1 ",
            "1 ",
        ] {
            let mut w = [b'7'; FEATURE_WINDOW];
            w[..text.len()].copy_from_slice(text.as_bytes());
            assert_eq!(plain_feature(&w), None, "{text:?}");
        }
        let mut w = [b'7'; FEATURE_WINDOW];
        w[..20].copy_from_slice(b"12345678:9.1234567\t ");
        assert_eq!(plain_feature(&w).map(|(id, v, end)| (id, v.to_bits(), end)), general_feature(&w));
        assert_eq!(plain_feature(&w).map(|f| f.2), Some(18));

        // The longest negative one, and `-0` (negative zero, as the general reader has it).
        for (text, end) in
            [(&b"12345678:-9.1234567\t"[..], 19), (b"7:-0 ", 4), (b"7:-0.000 ", 8), (b"3:-0.318712 ", 11)]
        {
            let mut w = [b'7'; FEATURE_WINDOW];
            w[..text.len()].copy_from_slice(text);
            let read = plain_feature(&w).map(|(id, v, end)| (id, v.to_bits(), end));
            assert_eq!(read, general_feature(&w), "{:?}", String::from_utf8_lossy(text));
            assert_eq!(read.map(|f| f.2), Some(end), "{:?}", String::from_utf8_lossy(text));
            assert!(read.is_some_and(|(_, bits, _)| f64::from_bits(bits).is_sign_negative()));
        }
    }

    #[test]
    fn ids_are_u64_with_an_overflow_error() {
        assert_eq!(parse_id(b"18446744073709551615", 0), Ok((u64::MAX, 20)));
        assert_eq!(parse_id(b"18446744073709551616", 0), Err((IdError::Overflow, 0)));
        assert_eq!(parse_id(b"000000000000000000000000007:1", 0), Ok((7, 27)));
        assert_eq!(parse_id(b"-3", 0), Err((IdError::NoDigits, 0)));
        assert_eq!(parse_id(b"x 12", 2), Ok((12, 4)));
    }
}
