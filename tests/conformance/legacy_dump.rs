//! Helpers that reproduce the text dump written by CNTK's legacy reader unit tests.
//!
//! CNTK's `Tests/UnitTests/ReaderTests/Common/ReaderTestHelper.h` dumps every minibatch of a
//! legacy (`BrainScript`) reader to a text file and compares it with a stored *Control* file
//! (`CheckFilesEquivalent`). To compare our reader against those baselines we need three
//! pieces, each bit-exact with what the C++ test does:
//!
//! * [`format_g`]: how one element is printed. The test writes `ofstream << ElemType`, which is
//!   `printf("%g")`: 6 significant digits, trailing zeros stripped, a signed exponent of at
//!   least two digits, and glibc's spellings of the non-finite values. A `float` element is
//!   printed as the `double` it widens to, so callers pass `f64::from(x)` (or use
//!   [`format_g_f32`]).
//! * [`pack_layout`] / [`column_order`]: which sample sits in which matrix column. CNTK packs the
//!   sequences of a minibatch into an `S x T` `MBLayout` with first-fit (`Sequences.h`,
//!   `InitAsPackedSequences`); the dump walks columns `j = t*S + s` and skips gap cells.
//! * [`tokens`]: how two dumps are compared: `std::istream_iterator<std::string>`, i.e. tokens
//!   separated by C `isspace` bytes, compared for exact string equality.
//!
//! This module is dependency-free and is `#[path]`-included by an integration test; it is also
//! compiled standalone for its own unit tests:
//! `rustc --edition 2021 --test tests/conformance/legacy_dump.rs -o /tmp/ld && /tmp/ld`.

#![allow(dead_code)] // Each including test uses only part of the helpers.

/// Number of significant digits of `%g` without an explicit precision.
const G_PRECISION: usize = 6;

/// Formats `x` exactly like C's `printf("%g", x)` with glibc (and like C++ `ostream << x` with
/// default flags and precision).
///
/// Rules: 6 significant digits, rounded from the exact binary value with ties to even (glibc in
/// the default rounding mode); fixed notation when the decimal exponent `X` of the rounded value
/// satisfies `-4 <= X < 6`, otherwise `d.ddddde±XX`; trailing fractional zeros and a trailing
/// decimal point are removed; `-0` keeps its sign; non-finite values print as `inf`, `-inf`,
/// `nan` and `-nan` (a NaN with the sign bit set).
pub fn format_g(x: f64) -> String {
    if x.is_nan() {
        return if x.is_sign_negative() { "-nan" } else { "nan" }.to_string();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.to_string();
    }

    let (digits, exp10) = round_significant(exact_decimal(x.abs()), G_PRECISION);
    let mut out = String::with_capacity(16);
    if x.is_sign_negative() {
        out.push('-');
    }
    // `exp10` is at most 308 and at least -324; `push_fixed` converts it to usize only where it
    // is non-negative.
    if exp10 < -4 || exp10 >= i32::try_from(G_PRECISION).expect("a small constant") {
        push_scientific(&mut out, &digits, exp10);
    } else {
        push_fixed(&mut out, &digits, exp10);
    }
    out
}

/// Formats an `f32` element the way CNTK prints a `float` `ElemType`: widened exactly to `f64`,
/// then `%g`.
pub fn format_g_f32(x: f32) -> String {
    format_g(f64::from(x))
}

/// The decimal digits of a positive finite value: `value = 0.d1 d2 d3 ... x 10^(exp10 + 1)`,
/// i.e. `d1` is the digit of weight `10^exp10`. Digits are ASCII values `0..=9` (not chars), with
/// no leading zero; trailing zeros are stripped.
struct Decimal {
    digits: Vec<u8>,
    exp10: i32,
}

/// Exact decimal expansion of a positive, finite, non-zero `f64` (every binary fraction has a
/// finite decimal expansion). Uses a small base-2^32 bignum, so there is no rounding anywhere.
fn exact_decimal(x: f64) -> Decimal {
    debug_assert!(x.is_finite() && x > 0.0);
    let bits = x.to_bits();
    let biased_exp = ((bits >> 52) & 0x7ff) as i32;
    let fraction = bits & ((1u64 << 52) - 1);
    let (mantissa, exp2) = if biased_exp == 0 {
        (fraction, -1074) // subnormal
    } else {
        (fraction | (1u64 << 52), biased_exp - 1075)
    };

    let mut big = BigUint::from_u64(mantissa);
    // value = big * 10^decimal_shift
    let decimal_shift = if exp2 >= 0 {
        big.shl(exp2.unsigned_abs());
        0
    } else {
        // m / 2^k == m * 5^k / 10^k
        let k = exp2.unsigned_abs();
        big.mul_pow5(k);
        exp2
    };

    let mut digits = big.into_decimal_digits();
    let exp10 = i32::try_from(digits.len()).expect("at most 767 significant digits") - 1 + decimal_shift;
    while digits.last() == Some(&0) {
        digits.pop();
    }
    Decimal { digits, exp10 }
}

/// Rounds to at most `precision` significant digits, ties to even, and strips trailing zeros.
/// Returns the digits and the decimal exponent of the first digit after rounding.
fn round_significant(d: Decimal, precision: usize) -> (Vec<u8>, i32) {
    let Decimal { mut digits, mut exp10 } = d;
    if digits.len() > precision {
        let first_dropped = digits[precision];
        let rest_nonzero = digits[precision + 1..].iter().any(|&c| c != 0);
        digits.truncate(precision);
        let last_is_odd = digits[precision - 1] % 2 == 1;
        let round_up = first_dropped > 5 || (first_dropped == 5 && (rest_nonzero || last_is_odd));
        if round_up {
            let mut i = precision;
            loop {
                if i == 0 {
                    // 99...9 rounded up to 100...0: one more digit of magnitude.
                    digits.insert(0, 1);
                    digits.truncate(precision);
                    exp10 += 1;
                    break;
                }
                i -= 1;
                if digits[i] == 9 {
                    digits[i] = 0;
                } else {
                    digits[i] += 1;
                    break;
                }
            }
        }
    }
    while digits.len() > 1 && digits.last() == Some(&0) {
        digits.pop();
    }
    (digits, exp10)
}

/// `%e`-style output with trailing zeros already stripped: `d[.ddddd]e±XX`.
fn push_scientific(out: &mut String, digits: &[u8], exp10: i32) {
    out.push(char::from(b'0' + digits[0]));
    if digits.len() > 1 {
        out.push('.');
        out.extend(digits[1..].iter().map(|&c| char::from(b'0' + c)));
    }
    out.push('e');
    out.push(if exp10 < 0 { '-' } else { '+' });
    let magnitude = exp10.unsigned_abs();
    if magnitude < 10 {
        out.push('0');
    }
    out.push_str(&magnitude.to_string());
}

/// `%f`-style output for `-4 <= exp10 < 6` with trailing zeros already stripped.
fn push_fixed(out: &mut String, digits: &[u8], exp10: i32) {
    let to_char = |c: &u8| char::from(b'0' + *c);
    if exp10 < 0 {
        out.push_str("0.");
        for _ in 0..(-exp10 - 1) {
            out.push('0');
        }
        out.extend(digits.iter().map(to_char));
        return;
    }
    let int_len = usize::try_from(exp10).expect("exp10 >= 0 here") + 1;
    if digits.len() <= int_len {
        out.extend(digits.iter().map(to_char));
        for _ in digits.len()..int_len {
            out.push('0');
        }
    } else {
        out.extend(digits[..int_len].iter().map(to_char));
        out.push('.');
        out.extend(digits[int_len..].iter().map(to_char));
    }
}

/// Minimal little-endian base-2^32 unsigned bignum: just enough for [`exact_decimal`].
struct BigUint {
    limbs: Vec<u32>,
}

#[allow(clippy::cast_possible_truncation)] // limb arithmetic: `as u32` keeps the low 32 bits on purpose
impl BigUint {
    fn from_u64(v: u64) -> Self {
        let mut limbs = vec![v as u32, (v >> 32) as u32];
        while limbs.len() > 1 && limbs.last() == Some(&0) {
            limbs.pop();
        }
        BigUint { limbs }
    }

    fn mul_small(&mut self, m: u32) {
        let mut carry = 0u64;
        for limb in &mut self.limbs {
            let p = u64::from(*limb) * u64::from(m) + carry;
            *limb = p as u32;
            carry = p >> 32;
        }
        if carry != 0 {
            self.limbs.push(carry as u32);
        }
    }

    fn shl(&mut self, bits: u32) {
        let (words, rem) = ((bits / 32) as usize, bits % 32);
        if rem != 0 {
            let mut carry = 0u32;
            for limb in &mut self.limbs {
                let v = (u64::from(*limb) << rem) | u64::from(carry);
                *limb = v as u32;
                carry = (v >> 32) as u32;
            }
            if carry != 0 {
                self.limbs.push(carry);
            }
        }
        if words != 0 {
            self.limbs.splice(0..0, std::iter::repeat_n(0, words));
        }
    }

    fn mul_pow5(&mut self, mut k: u32) {
        const FIVE_POW_13: u32 = 1_220_703_125; // largest power of 5 below 2^32
        while k >= 13 {
            self.mul_small(FIVE_POW_13);
            k -= 13;
        }
        self.mul_small(5u32.pow(k));
    }

    /// Divides in place by `d` and returns the remainder.
    fn div_small(&mut self, d: u32) -> u32 {
        let mut rem = 0u64;
        for limb in self.limbs.iter_mut().rev() {
            let cur = (rem << 32) | u64::from(*limb);
            *limb = (cur / u64::from(d)) as u32;
            rem = cur % u64::from(d);
        }
        while self.limbs.len() > 1 && self.limbs.last() == Some(&0) {
            self.limbs.pop();
        }
        rem as u32
    }

    fn is_zero(&self) -> bool {
        self.limbs.iter().all(|&l| l == 0)
    }

    /// Decimal digits, most significant first, no leading zeros (`[0]` for zero).
    fn into_decimal_digits(mut self) -> Vec<u8> {
        let mut groups = Vec::new(); // base 10^9, least significant first
        while !self.is_zero() {
            groups.push(self.div_small(1_000_000_000));
        }
        if groups.is_empty() {
            return vec![0];
        }
        let mut digits = Vec::with_capacity(groups.len() * 9);
        for (i, g) in groups.iter().rev().enumerate() {
            let s = if i == 0 { g.to_string() } else { format!("{g:09}") };
            digits.extend(s.bytes().map(|b| b - b'0'));
        }
        digits
    }
}

/// CNTK's `MBLayout` packing (`MBLayout::InitAsPackedSequences`, `Common/Include/Sequences.h`).
///
/// `seq_lens` are one stream's *actual* sample counts, in minibatch order. The width is
/// `T = max(len)`; each sequence goes, in order, into the first row `s` with `used[s] + len <= T`,
/// else into a new row. Returns `(S rows, T width, (s, t0) per sequence)`. The cells of a row past
/// its used length are gaps. An empty minibatch gives `(0, 0, [])`.
pub fn pack_layout(seq_lens: &[usize]) -> (usize, usize, Vec<(usize, usize)>) {
    let width = seq_lens.iter().copied().max().unwrap_or(0);
    let mut row_used: Vec<usize> = Vec::new();
    let mut placement = Vec::with_capacity(seq_lens.len());
    for &len in seq_lens {
        let row = if let Some(row) = row_used.iter().position(|&used| used + len <= width) {
            row
        } else {
            row_used.push(0);
            row_used.len() - 1
        };
        placement.push((row, row_used[row]));
        row_used[row] += len;
    }
    (row_used.len(), width, placement)
}

/// The non-gap columns of a packed minibatch in the order the CNTK test dump prints them.
///
/// The matrix has `S*T` columns and column `j` holds cell `(s, t) = (j % S, j / S)`; the dump
/// skips gap cells. Each returned pair is `(sequence index in minibatch order, sample index within
/// that sequence)`.
pub fn column_order(seq_lens: &[usize]) -> Vec<(usize, usize)> {
    let (rows, width, placement) = pack_layout(seq_lens);
    // cell (s, t) -> (sequence, sample), None for gaps
    let mut cells: Vec<Option<(usize, usize)>> = vec![None; rows * width];
    for (seq, (&(s, t0), &len)) in placement.iter().zip(seq_lens).enumerate() {
        for k in 0..len {
            cells[(t0 + k) * rows + s] = Some((seq, k));
        }
    }
    cells.into_iter().flatten().collect()
}

/// Appends one stream of one minibatch to a dump, exactly as `ReaderFixture::OutputMatrix`
/// writes it: for each non-gap column in [`column_order`], its `dim` values formatted with
/// `format` and joined by single spaces, then `'\n'`.
///
/// `sample(seq, k)` returns the `dim` dense values of sample `k` of sequence `seq` (a sparse
/// sample converted to dense: zero-filled, last duplicate index wins).
pub fn dump_stream<'a, F, V>(out: &mut String, seq_lens: &[usize], mut sample: F, format: impl Fn(V) -> String)
where
    F: FnMut(usize, usize) -> &'a [V],
    V: Copy + 'a,
{
    for (seq, k) in column_order(seq_lens) {
        let values = sample(seq, k);
        for (i, &v) in values.iter().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(&format(v));
        }
        out.push('\n');
    }
}

/// Splits a dump into the tokens `CheckFilesEquivalent` compares: maximal runs of bytes that
/// are not C `isspace` in the "C" locale (space, `\t`, `\n`, `\v`, `\f`, `\r`). Note that this
/// differs from both `str::split_whitespace` (Unicode spaces) and `split_ascii_whitespace`
/// (which does not treat `\v` as a separator).
pub fn tokens(s: &str) -> Vec<&str> {
    s.split([' ', '\t', '\n', '\u{0b}', '\u{0c}', '\r']).filter(|t| !t.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_g_zero_and_sign() {
        assert_eq!(format_g(0.0), "0");
        assert_eq!(format_g(-0.0), "-0");
        assert_eq!(format_g(1.0), "1");
        assert_eq!(format_g(-1.0), "-1");
        assert_eq!(format_g(0.5), "0.5");
        assert_eq!(format_g(-2.5), "-2.5");
    }

    #[test]
    fn format_g_non_finite_as_glibc() {
        assert_eq!(format_g(f64::INFINITY), "inf");
        assert_eq!(format_g(f64::NEG_INFINITY), "-inf");
        assert_eq!(format_g(f64::NAN.copysign(1.0)), "nan");
        assert_eq!(format_g(f64::NAN.copysign(-1.0)), "-nan");
        assert_eq!(format_g_f32(f32::INFINITY), "inf");
    }

    #[test]
    fn format_g_fixed_vs_scientific_boundaries() {
        assert_eq!(format_g(1e-5), "1e-05");
        assert_eq!(format_g(0.0001), "0.0001");
        assert_eq!(format_g(0.000_123_456_78), "0.000123457");
        assert_eq!(format_g(1e-7), "1e-07");
        assert_eq!(format_g(123_456.0), "123456");
        assert_eq!(format_g(100_000.0), "100000");
        assert_eq!(format_g(1_234_567.0), "1.23457e+06");
        assert_eq!(format_g(1e6), "1e+06");
        assert_eq!(format_g(-1e6), "-1e+06");
        assert_eq!(format_g(1e100), "1e+100");
        assert_eq!(format_g(1e-100), "1e-100");
        assert_eq!(format_g(12.5), "12.5");
        assert_eq!(format_g(0.1), "0.1");
        assert_eq!(format_g(1.0 / 3.0), "0.333333");
        assert_eq!(format_g(2.0 / 3.0), "0.666667");
    }

    #[test]
    fn format_g_rounding_carries_into_the_exponent() {
        assert_eq!(format_g(999_999.5), "1e+06"); // exact tie, 999999 is odd -> up
        assert_eq!(format_g(999_999.4), "999999");
        assert_eq!(format_g(9_999_995.0), "1e+07");
        assert_eq!(format_g(0.000_099_999_951), "0.0001"); // %e exponent -5 becomes -4 -> fixed
        assert_eq!(format_g(0.000_099_999_9), "9.99999e-05");
        assert_eq!(format_g(99999.95), "99999.9"); // binary value is just below the tie
        assert_eq!(format_g(99999.96), "100000");
    }

    #[test]
    fn format_g_exact_ties_go_to_even() {
        assert_eq!(format_g(1_234_565.0), "1.23456e+06");
        assert_eq!(format_g(1_234_575.0), "1.23458e+06");
        assert_eq!(format_g(2.5e6 + 0.5), "2.5e+06"); // 2500000.5: dropped "05" is below half
        assert_eq!(format_g(0.123_456_5), "0.123456"); // binary value below the decimal tie
    }

    #[test]
    fn format_g_values_from_cntk_baselines() {
        assert_eq!(format_g(1.42057e44), "1.42057e+44");
        assert_eq!(format_g(9.10e-11), "9.1e-11");
        assert_eq!(format_g(-6.4265e20), "-6.4265e+20");
        // float elements are printed as the widened double
        assert_eq!(format_g_f32(-1.43867e-7_f32), "-1.43867e-07");
        assert_eq!(format_g_f32(-1.07905e8_f32), "-1.07905e+08");
        assert_eq!(format_g_f32(0.1_f32), "0.1");
        assert_eq!(format_g_f32(16_777_217.0_f32), "1.67772e+07");
        assert_eq!(format_g_f32(-0.138_918_02_f32), "-0.138918");
        assert_eq!(format_g(982.587_022_405_312), "982.587");
    }

    #[test]
    #[allow(clippy::cast_precision_loss)] // u64::MAX rounds to 2^64: that f64 is the case under test
    fn format_g_extremes() {
        assert_eq!(format_g(f64::MAX), "1.79769e+308");
        assert_eq!(format_g(f64::MIN_POSITIVE), "2.22507e-308");
        assert_eq!(format_g(5e-324), "4.94066e-324");
        assert_eq!(format_g_f32(f32::MAX), "3.40282e+38");
        assert_eq!(format_g_f32(f32::MIN_POSITIVE), "1.17549e-38");
        assert_eq!(format_g(u64::MAX as f64), "1.84467e+19");
    }

    #[test]
    fn pack_layout_trivial_cases() {
        assert_eq!(pack_layout(&[]), (0, 0, vec![]));
        assert_eq!(pack_layout(&[1]), (1, 1, vec![(0, 0)]));
        assert_eq!(pack_layout(&[1, 1, 1]), (3, 1, vec![(0, 0), (1, 0), (2, 0)]));
        assert_eq!(pack_layout(&[10, 10]), (2, 10, vec![(0, 0), (1, 0)]));
    }

    #[test]
    fn pack_layout_first_fit_jagged() {
        // T = 3; [2] opens row 0, [3] does not fit -> row 1, [1] fits after the 2 in row 0.
        assert_eq!(pack_layout(&[2, 3, 1]), (2, 3, vec![(0, 0), (1, 0), (0, 2)]));
        // First fit, not best fit: the 1 goes to row 1 (used 2) although row 2 (used 3) would
        // fill up exactly.
        assert_eq!(pack_layout(&[4, 2, 3, 1]), (3, 4, vec![(0, 0), (1, 0), (2, 0), (1, 2)]));
        assert_eq!(pack_layout(&[4, 2, 2, 1]), (3, 4, vec![(0, 0), (1, 0), (1, 2), (2, 0)]));
        // Long sequence last: the width is the global max, decided before placement.
        assert_eq!(pack_layout(&[1, 1, 5]), (2, 5, vec![(0, 0), (0, 1), (1, 0)]));
        // Start of 50x20_jagged_sequences_dense.txt: lengths 5, 3, 10, 15, 12, 7.
        assert_eq!(pack_layout(&[5, 3, 10, 15, 12, 7]), (4, 15, vec![(0, 0), (0, 5), (1, 0), (2, 0), (3, 0), (0, 8)]));
    }

    #[test]
    fn column_order_interleaves_rows_by_time() {
        // 3 sequences of 2: j = t*S + s
        assert_eq!(column_order(&[2, 2, 2]), vec![(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]);
        // ref_data_with_escape_sequences labels: lengths 2, 1, 1 -> S=2, T=2, seq 2 at (1, 1).
        assert_eq!(column_order(&[2, 1, 1]), vec![(0, 0), (1, 0), (0, 1), (2, 0)]);
    }

    #[test]
    fn column_order_skips_gaps() {
        // [3, 1]: row 1 has gaps at t = 1, 2.
        assert_eq!(column_order(&[3, 1]), vec![(0, 0), (1, 0), (0, 1), (0, 2)]);
        // [2, 3, 1]: row 0 = seq0 t0..2 + seq2 t2; row 1 = seq1 t0..3; no gaps.
        assert_eq!(column_order(&[2, 3, 1]), vec![(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (1, 2)]);
        // [4, 2, 2, 1]: row 2 has gaps at t = 1..4.
        assert_eq!(
            column_order(&[4, 2, 2, 1]),
            vec![(0, 0), (1, 0), (3, 0), (0, 1), (1, 1), (0, 2), (2, 0), (0, 3), (2, 1)]
        );
        assert!(column_order(&[]).is_empty());
    }

    #[test]
    fn column_order_covers_every_sample_once() {
        let lens = [7, 1, 3, 3, 9, 2, 2, 5, 1, 1, 8];
        let order = column_order(&lens);
        assert_eq!(order.len(), lens.iter().sum::<usize>());
        for (seq, &len) in lens.iter().enumerate() {
            let ks: Vec<usize> = order.iter().filter(|p| p.0 == seq).map(|p| p.1).collect();
            assert_eq!(ks, (0..len).collect::<Vec<_>>(), "samples of a sequence stay in order");
        }
    }

    #[test]
    fn dump_stream_matches_output_matrix() {
        let seqs: Vec<Vec<Vec<f32>>> = vec![vec![vec![1.0, 0.0], vec![2.0, 0.5]], vec![vec![-1.43867e-7, 1e6]]];
        let lens: Vec<usize> = seqs.iter().map(Vec::len).collect();
        let mut out = String::new();
        dump_stream(&mut out, &lens, |s, k| seqs[s][k].as_slice(), format_g_f32);
        assert_eq!(out, "1 0\n-1.43867e-07 1e+06\n2 0.5\n");
    }

    #[test]
    fn tokens_split_on_c_isspace_only() {
        assert_eq!(tokens(""), Vec::<&str>::new());
        assert_eq!(tokens("1 2"), vec!["1", "2"]);
        assert_eq!(tokens("  1\t2\r\n3\u{0b}4\u{0c}5\n"), vec!["1", "2", "3", "4", "5"]);
        // not C whitespace: NBSP and NEL stay inside tokens
        assert_eq!(tokens("a\u{a0}b c\u{85}d"), vec!["a\u{a0}b", "c\u{85}d"]);
        // a missing trailing newline does not matter (missing_trailing_newline.txt is "1\n2")
        assert_eq!(tokens("1\n2"), tokens("1 2\n"));
    }
}
