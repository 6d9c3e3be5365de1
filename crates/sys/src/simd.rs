//! The CTF dense fast path's vector code (`format::ctf::scan`) — the one piece of `unsafe`
//! outside shared memory, kept here with the rest (module docs):
//!
//! * [`byte_classes`]: the byte classes of a 64-byte window as bit masks, with SSE2 where the
//!   target has it. On targets without SSE2 a plain loop computes the same masks; the tests
//!   compare the two on every byte value.
//! * [`dense_window_f32`] / [`dense_window_f64`]: every value of a 64-byte window of plain
//!   decimals read at once with AVX2, BMI and POPCNT, where the CPU has them (asked once at run
//!   time, [`has_avx2`]); a window of any other shape is declined and read by the caller's own
//!   loop. Its results are compared with CNTK's digit loop by the engine's tests and fuzz target.

/// Per-byte classes of a window, bit `i` for byte `i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteClasses {
    /// Space or tab (CNTK's value delimiters).
    pub delim: u64,
    /// `|`, or a non-printable byte (a control byte or ≥ 0x80) other than tab: where a dense
    /// sample ends.
    pub stop: u64,
    /// ASCII digits.
    pub digit: u64,
    /// Periods.
    pub dot: u64,
}

/// The classes of the 64 bytes of `w`.
#[must_use]
#[inline]
pub fn byte_classes(w: &[u8; 64]) -> ByteClasses {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    {
        // SAFETY: `sse2_classes` only needs SSE2, which this build's target enables statically
        // (`cfg(target_feature = "sse2")`, part of the x86_64 baseline), so every CPU that runs
        // this binary has it. It reads nothing but `w` through safe indexing.
        unsafe { sse2_classes(w) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
    {
        scalar_classes(w)
    }
}

/// The reference: one byte at a time.
#[must_use]
pub fn scalar_classes(w: &[u8; 64]) -> ByteClasses {
    let mut c = ByteClasses { delim: 0, stop: 0, digit: 0, dot: 0 };
    for (i, &b) in w.iter().enumerate() {
        c.delim |= u64::from(b == b' ' || b == b'\t') << i;
        c.stop |= u64::from(b == b'|' || (!(0x20..0x80).contains(&b) && b != b'\t')) << i;
        c.digit |= u64::from(b.is_ascii_digit()) << i;
        c.dot |= u64::from(b == b'.') << i;
    }
    c
}

#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[target_feature(enable = "sse2")]
fn sse2_classes(w: &[u8; 64]) -> ByteClasses {
    use std::arch::x86_64::{
        __m128i, _mm_and_si128, _mm_andnot_si128, _mm_cmpeq_epi8, _mm_cmpgt_epi8, _mm_cmplt_epi8, _mm_movemask_epi8,
        _mm_or_si128, _mm_set1_epi8, _mm_set_epi64x,
    };
    #[target_feature(enable = "sse2")]
    #[allow(clippy::cast_possible_wrap)] // byte patterns
    fn splat(b: u8) -> __m128i {
        _mm_set1_epi8(b as i8)
    }
    #[target_feature(enable = "sse2")]
    fn bits(v: __m128i) -> u64 {
        u64::from(_mm_movemask_epi8(v).cast_unsigned() & 0xFFFF)
    }
    let mut c = ByteClasses { delim: 0, stop: 0, digit: 0, dot: 0 };
    let (chunks, _) = w.as_chunks::<16>();
    for (k, chunk) in chunks.iter().enumerate() {
        let v = u128::from_le_bytes(*chunk);
        #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)] // the two halves, as bits
        let x = _mm_set_epi64x((v >> 64) as u64 as i64, v as u64 as i64);
        let tab = _mm_cmpeq_epi8(x, splat(b'\t'));
        // As signed bytes, control bytes and every byte >= 0x80 are below 0x20.
        let non_printable = _mm_andnot_si128(tab, _mm_cmplt_epi8(x, splat(0x20)));
        let digit = _mm_and_si128(_mm_cmpgt_epi8(x, splat(b'0' - 1)), _mm_cmplt_epi8(x, splat(b'9' + 1)));
        let shift = 16 * k;
        c.delim |= bits(_mm_or_si128(tab, _mm_cmpeq_epi8(x, splat(b' ')))) << shift;
        c.stop |= bits(_mm_or_si128(non_printable, _mm_cmpeq_epi8(x, splat(b'|')))) << shift;
        c.digit |= bits(digit) << shift;
        c.dot |= bits(_mm_cmpeq_epi8(x, splat(b'.'))) << shift;
    }
    c
}

/// Bytes a dense window is read from: 64 examined, and 16 more that an eight-byte read of a value
/// starting near the end may touch.
pub const DENSE_WINDOW: usize = 80;

/// What [`dense_window_f32`] and [`dense_window_f64`] made of a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenseWindow {
    /// `count` values were stored; the next window starts `advance` bytes on (at the value that
    /// runs past this one, or at byte 64), or, if `stopped`, the dense sample ends there (at its
    /// first stop byte).
    Read {
        /// Bytes consumed: every value that ends inside the window and the delimiters around them.
        advance: usize,
        /// Values stored.
        count: usize,
        /// Whether `advance` is at a stop byte.
        stopped: bool,
    },
    /// The window is not of the shape the kernel reads (or the CPU lacks AVX2): nothing was
    /// consumed, and the first `written` slots of `out` may have been overwritten.
    Declined {
        /// Slots of `out` that may hold values of an abandoned read.
        written: usize,
    },
}

/// Reads every value that ends inside the first 64 bytes of `w` into `out`, as `f32`, where the
/// CPU has AVX2 and the window is of the common shape of dense CTF data:
///
/// * the window is read up to its first stop byte (`|`, or a non-printable byte: a control byte
///   other than tab, or ≥ 0x80), where the dense sample ends, or else its 64 bytes;
/// * every value that ends inside that (a run of bytes other than space and tab, followed by
///   one or by the stop byte) is a plain decimal `[+-]?d+(.d+)?`, with 1 to 8 integer digits (7
///   after a sign) and 1 to 8 fraction digits, and either all of them have a period or none has;
/// * at least one value ends there and `out` has room for all of them.
///
/// Each value is CNTK's `f64` `integer + fraction / 10^digits` (bit-identical to its digit loop
/// for these shapes: every partial sum is an exact integer), negated by its sign bit and rounded
/// to `f32` as `static_cast<float>` does. Anything else is [`DenseWindow::Declined`], left to the
/// caller's own reading.
pub fn dense_window_f32(w: &[u8; DENSE_WINDOW], out: &mut [f32]) -> DenseWindow {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU has AVX2, BMI1, BMI2, LZCNT and POPCNT (`has_avx2`), the features the
        // kernel is compiled for.
        return unsafe { avx2_window_f32(w, out) };
    }
    let _ = (w, out);
    DenseWindow::Declined { written: 0 }
}

/// [`dense_window_f32`], the values kept as `f64`.
pub fn dense_window_f64(w: &[u8; DENSE_WINDOW], out: &mut [f64]) -> DenseWindow {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: as in `dense_window_f32`.
        return unsafe { avx2_window_f64(w, out) };
    }
    let _ = (w, out);
    DenseWindow::Declined { written: 0 }
}

/// Whether the dense window kernel runs on this CPU (asked once).
#[cfg(target_arch = "x86_64")]
#[must_use]
#[inline]
pub fn has_avx2() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("bmi1")
            && std::arch::is_x86_feature_detected!("bmi2")
            && std::arch::is_x86_feature_detected!("lzcnt")
            && std::arch::is_x86_feature_detected!("popcnt")
    })
}

/// Whether the dense window kernel runs on this CPU: never off x86-64.
#[cfg(not(target_arch = "x86_64"))]
#[must_use]
pub fn has_avx2() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
fn avx2_window_f32(w: &[u8; DENSE_WINDOW], out: &mut [f32]) -> DenseWindow {
    avx2_window(w, out.len(), |k, count, v| {
        let mut four = [0f32; 4];
        // SAFETY: writes the 16 bytes of `four`, a local array of four `f32`.
        unsafe { std::arch::x86_64::_mm_storeu_ps(four.as_mut_ptr(), std::arch::x86_64::_mm256_cvtpd_ps(v)) };
        place(&mut out[k..k + count], &four);
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
fn avx2_window_f64(w: &[u8; DENSE_WINDOW], out: &mut [f64]) -> DenseWindow {
    avx2_window(w, out.len(), |k, count, v| {
        let mut four = [0f64; 4];
        // SAFETY: writes the 32 bytes of `four`, a local array of four `f64`.
        unsafe { std::arch::x86_64::_mm256_storeu_pd(four.as_mut_ptr(), v) };
        place(&mut out[k..k + count], &four);
    })
}

/// `four[..out.len()]` into `out` (1 to 4 values), as copies of fixed sizes: a copy of a length
/// known only at run time is a call to `memcpy` (and, from AVX code, a `vzeroupper` before it).
#[inline]
fn place<T: Copy>(out: &mut [T], four: &[T; 4]) {
    match out {
        [a, b, c, d] => (*a, *b, *c, *d) = (four[0], four[1], four[2], four[3]),
        [a, b, c] => (*a, *b, *c) = (four[0], four[1], four[2]),
        [a, b] => (*a, *b) = (four[0], four[1]),
        [a] => *a = four[0],
        _ => {}
    }
}

/// The classes of the window's 64 bytes the kernel needs, with AVX2: value delimiters, stop
/// bytes, digits, periods, signs and minus signs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
#[inline]
fn avx2_classes(w: &[u8; DENSE_WINDOW]) -> [u64; 6] {
    use std::arch::x86_64::{
        _mm256_and_si256, _mm256_andnot_si256, _mm256_cmpeq_epi8, _mm256_cmpgt_epi8, _mm256_loadu_si256,
        _mm256_movemask_epi8, _mm256_or_si256, _mm256_set1_epi8,
    };
    let mut c = [0u64; 6];
    for half in 0..2 {
        let bytes: &[u8; 32] = w[32 * half..32 * half + 32].try_into().expect("32 bytes");
        // SAFETY: reads the 32 bytes of `bytes`, borrowed from `w`.
        let x = unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) };
        #[allow(clippy::cast_possible_wrap)] // byte patterns
        let is = |b: u8| _mm256_cmpeq_epi8(x, _mm256_set1_epi8(b as i8));
        let tab = is(b'\t');
        // As signed bytes, control bytes and every byte >= 0x80 are below 0x20.
        let non_printable = _mm256_andnot_si256(tab, _mm256_cmpgt_epi8(_mm256_set1_epi8(0x20), x));
        let digit = _mm256_andnot_si256(
            _mm256_cmpgt_epi8(x, _mm256_set1_epi8(0x39)),
            _mm256_cmpgt_epi8(x, _mm256_set1_epi8(0x2F)),
        );
        let minus = is(b'-');
        let bits = |v| u64::from(_mm256_movemask_epi8(v).cast_unsigned()) << (32 * half);
        c[0] |= bits(_mm256_or_si256(tab, is(b' ')));
        c[1] |= bits(_mm256_or_si256(non_printable, is(b'|')));
        c[2] |= bits(_mm256_and_si256(digit, digit));
        c[3] |= bits(is(b'.'));
        c[4] |= bits(_mm256_or_si256(minus, is(b'+')));
        c[5] |= bits(minus);
    }
    c
}

/// The kernel of [`dense_window_f32`] and [`dense_window_f64`]: the window's shape checked on its
/// byte classes for all values together, then four values at a time — their places found in the
/// masks (one `tzcnt` each for start, period and end), their digits read as one word each and
/// moved to the top of it, then summed in AVX2 lanes of 64 bits (`vpmaddubsw`, `vpmaddwd`, one
/// multiply), converted, divided, signed and handed to `store(k, count, four)` for the first
/// `count` (4, fewer in the last group) to go to slots `k..k + count`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
#[inline]
#[allow(clippy::similar_names)] // the masks of a window
fn avx2_window(
    w: &[u8; DENSE_WINDOW],
    room: usize,
    store: impl FnMut(usize, usize, std::arch::x86_64::__m256d),
) -> DenseWindow {
    const DECLINED: DenseWindow = DenseWindow::Declined { written: 0 };
    let [delim, stop, digit, dot, sign, minus] = avx2_classes(w);
    // The first stop byte ends the sample: only the bytes before it are read.
    let first_stop = stop & stop.wrapping_neg();
    let value = !delim & first_stop.wrapping_sub(1);
    // The delimiters (or the stop byte) right after a value: one per value that ends inside.
    let ends = (delim | first_stop) & (value << 1);
    if ends == 0 {
        return DECLINED;
    }
    // Everything before the last value's end.
    let region = (1u64 << ends.ilog2()) - 1;
    let all_starts = value & !(value << 1);
    let digit_next = digit >> 1;
    let run9 = {
        let r2 = digit & digit_next;
        let r4 = r2 & (r2 >> 2);
        (r4 & (r4 >> 4)) & (digit >> 8)
    };
    let odd = !(digit | dot | delim | sign)
        | (sign & !(all_starts & digit_next))
        | (dot & !((digit << 1) & digit_next))
        | run9;
    let n = ends.count_ones() as usize;
    let dots = dot & region;
    let dotted = dots != 0;
    if odd & region != 0 || (dotted && dots.count_ones() as usize != n) || n > room {
        return DECLINED;
    }
    let starts = all_starts & region;
    let read = if dotted {
        avx2_values::<true>(w, starts, ends, dots, minus, store)
    } else {
        avx2_values::<false>(w, starts, ends, dots, minus, store)
    };
    match read {
        Ok(()) => {
            let partial = all_starts & !region;
            let advance = if stop != 0 {
                stop.trailing_zeros()
            } else if partial == 0 {
                64
            } else {
                partial.trailing_zeros()
            };
            DenseWindow::Read { advance: advance as usize, count: n, stopped: stop != 0 }
        }
        Err(written) => DenseWindow::Declined { written },
    }
}

/// The values of a checked window, four at a time: their places found in the masks (one
/// `tzcnt` each for start, period and end), their digits read as one word each and moved to its
/// top, then summed, converted, divided and signed in AVX2 lanes. `Err(written)` if a value's
/// period is not its own or a signed value has eight integer digits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
#[inline]
fn avx2_values<const DOTTED: bool>(
    w: &[u8; DENSE_WINDOW],
    starts: u64,
    ends: u64,
    dots: u64,
    minus: u64,
    mut store: impl FnMut(usize, usize, std::arch::x86_64::__m256d),
) -> Result<(), usize> {
    use std::arch::x86_64::{
        _mm256_add_pd, _mm256_castsi256_pd, _mm256_div_pd, _mm256_or_pd, _mm256_set1_pd, _mm256_setr_epi64x,
    };
    let load8 = |at: u32| -> i64 {
        let at = (at & 63) as usize;
        let b: [u8; 8] = w[at..at + 8].try_into().expect("eight bytes");
        i64::from_le_bytes(b)
    };
    let n = ends.count_ones() as usize;
    let (mut st, mut en, mut dt) = (starts, ends, dots);
    let mut k = 0;
    while k < n {
        // One lane per value; lanes past `n` find every mask empty (64 for each place), pass the
        // checks and are dropped.
        let mut int = [0i64; 4];
        let mut frac = [0i64; 4];
        let mut neg = [0i64; 4];
        let mut ok = true;
        for lane in 0..4 {
            let s = st.trailing_zeros();
            st &= st.wrapping_sub(1);
            let e = en.trailing_zeros();
            en &= en.wrapping_sub(1);
            let d = if DOTTED {
                let d = dt.trailing_zeros();
                dt &= dt.wrapping_sub(1);
                d
            } else {
                e
            };
            // The value's own period (never at its start nor its end: checked on the masks), and
            // a sign with at most 7 digits: all of the integer part fits one word.
            let int_bytes = d.wrapping_sub(s);
            // Without branches: `&` on purpose.
            #[allow(clippy::needless_bitwise_bool)]
            {
                ok &= (s <= d) & (d <= e) & (int_bytes <= 8);
            }
            // The integer digits (and sign) at the top of the word, the bytes after shifted out.
            int[lane] = load8(s).wrapping_shl(64u32.wrapping_sub(int_bytes.wrapping_mul(8)) & 63);
            neg[lane] = i64::from((minus >> (s & 63)) & 1 == 1) << 63;
            if DOTTED {
                // The fraction digits from the word's first byte; what follows them is cut in
                // the lanes.
                frac[lane] = load8(d + 1);
            }
        }
        if !ok {
            return Err(k);
        }
        let int = avx2_sum4(_mm256_setr_epi64x(int[0], int[1], int[2], int[3]));
        let v = if DOTTED {
            // `frac * 10^(8 - k)` over 10^8 is the same rational as `frac` over 10^k, both parts
            // exact: the correctly rounded quotient is the same `f64`.
            let frac = avx2_sum4_leading(_mm256_setr_epi64x(frac[0], frac[1], frac[2], frac[3]));
            _mm256_add_pd(int, _mm256_div_pd(frac, _mm256_set1_pd(1e8)))
        } else {
            // CNTK's integer: `int + 0 / 1`, the same bits as `int`.
            int
        };
        let v = _mm256_or_pd(v, _mm256_castsi256_pd(_mm256_setr_epi64x(neg[0], neg[1], neg[2], neg[3])));
        store(k, (n - k).min(4), v);
        k += 4;
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
/// The digits of each lane's word, at its top bytes (anything below them above 9 after the
/// subtraction, or zero), summed as four `f64`.
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
#[inline]
fn avx2_sum4(words: std::arch::x86_64::__m256i) -> std::arch::x86_64::__m256d {
    use std::arch::x86_64::{_mm256_and_si256, _mm256_cmpeq_epi8, _mm256_min_epu8, _mm256_set1_epi8, _mm256_sub_epi8};
    let v = _mm256_sub_epi8(words, _mm256_set1_epi8(0x30));
    // Bytes that are not digits (the shifted-in zeros, a sign) become 0.
    avx2_eights(_mm256_and_si256(v, _mm256_cmpeq_epi8(_mm256_min_epu8(v, _mm256_set1_epi8(9)), v)))
}

#[cfg(target_arch = "x86_64")]
/// The digits at the start of each lane's word (first digit in the low byte), up to the first
/// byte that is not one, read as if eight: `k` digits give their number times `10^(8 - k)`.
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
#[inline]
fn avx2_sum4_leading(words: std::arch::x86_64::__m256i) -> std::arch::x86_64::__m256d {
    use std::arch::x86_64::{
        _mm256_andnot_si256, _mm256_cmpeq_epi8, _mm256_min_epu8, _mm256_or_si256, _mm256_set1_epi8, _mm256_slli_epi64,
        _mm256_sub_epi8,
    };
    let v = _mm256_sub_epi8(words, _mm256_set1_epi8(0x30));
    // 0xFF from the first byte that is not a digit to the top of the lane, then those bytes cut.
    let digit = _mm256_cmpeq_epi8(_mm256_min_epu8(v, _mm256_set1_epi8(9)), v);
    let mut cut = _mm256_andnot_si256(digit, _mm256_set1_epi8(-1));
    cut = _mm256_or_si256(cut, _mm256_slli_epi64::<8>(cut));
    cut = _mm256_or_si256(cut, _mm256_slli_epi64::<16>(cut));
    cut = _mm256_or_si256(cut, _mm256_slli_epi64::<32>(cut));
    avx2_eights(_mm256_andnot_si256(cut, v))
}

#[cfg(target_arch = "x86_64")]
/// The eight digits (0..=9 each, the first in the low byte) of each lane as a number, as `f64`.
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
#[inline]
fn avx2_eights(v: std::arch::x86_64::__m256i) -> std::arch::x86_64::__m256d {
    use std::arch::x86_64::{
        _mm256_add_epi64, _mm256_castsi256_si128, _mm256_cvtepi32_pd, _mm256_madd_epi16, _mm256_maddubs_epi16,
        _mm256_mul_epu32, _mm256_permutevar8x32_epi32, _mm256_set1_epi16, _mm256_set1_epi32, _mm256_set1_epi64x,
        _mm256_setr_epi32, _mm256_srli_epi64,
    };
    let pairs = _mm256_maddubs_epi16(v, _mm256_set1_epi16(0x010A)); // bytes (10, 1)
    let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi32(0x0001_0064)); // words (100, 1)
    let eights = _mm256_add_epi64(_mm256_mul_epu32(quads, _mm256_set1_epi64x(10_000)), _mm256_srli_epi64::<32>(quads));
    // The low 32 bits of each lane (a sum of eight digits is below 10^8), as `f64`.
    let low = _mm256_permutevar8x32_epi32(eights, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
    _mm256_cvtepi32_pd(_mm256_castsi256_si128(low))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_value_at_every_position_matches_the_reference() {
        for b in 0..=255u8 {
            for at in [0usize, 1, 15, 16, 31, 47, 62, 63] {
                let mut w = [b'x'; 64];
                w[at] = b;
                w[(at + 17) % 64] = b.wrapping_add(1);
                assert_eq!(byte_classes(&w), scalar_classes(&w), "byte {b:#04x} at {at}");
            }
        }
    }

    /// A window of `text`, padded with spaces to 80 bytes.
    fn window(text: &str) -> [u8; DENSE_WINDOW] {
        let mut w = [b' '; DENSE_WINDOW];
        w[..text.len()].copy_from_slice(text.as_bytes());
        w
    }

    /// CNTK's value of a plain decimal, the slow way.
    fn cntk(token: &str) -> f64 {
        let (negative, digits) = match token.as_bytes()[0] {
            b'-' => (true, &token[1..]),
            b'+' => (false, &token[1..]),
            _ => (false, token),
        };
        let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
        let int: u64 = int.parse().expect("digits");
        let k = i32::try_from(frac.len()).expect("short");
        let frac: u64 = if frac.is_empty() { 0 } else { frac.parse().expect("digits") };
        #[allow(clippy::cast_precision_loss)] // small integers
        let v = int as f64 + frac as f64 / 10f64.powi(k);
        if negative {
            -v
        } else {
            v
        }
    }

    #[test]
    fn a_plain_window_is_read_whole_and_stops_before_the_value_it_cuts() {
        // 64 bytes end inside "0.123456": it is left to the next window.
        let text = "-0.012410 0.984487 +12.5 -1234567.25 0.5\t3.14159265 0.777777 0.123456 1.5";
        let w = window(text);
        let tokens: Vec<&str> = text[..64].split([' ', '\t']).collect();
        let (whole, cut) = tokens.split_at(tokens.len() - 1);
        let mut out = [0f64; 40];
        let got = dense_window_f64(&w, &mut out);
        if !has_avx2() {
            assert_eq!(got, DenseWindow::Declined { written: 0 });
            return;
        }
        assert_eq!(got, DenseWindow::Read { advance: 64 - cut[0].len(), count: whole.len(), stopped: false });
        for (j, t) in whole.iter().enumerate() {
            assert_eq!(out[j].to_bits(), cntk(t).to_bits(), "{t}");
        }
        assert!(out[whole.len()..].iter().all(|v| v.to_bits() == 0), "stored past the count");
        let mut narrow = [0f32; 40];
        assert_eq!(dense_window_f32(&w, &mut narrow), got);
        #[allow(clippy::cast_possible_truncation)] // as static_cast<float>
        for (j, t) in whole.iter().enumerate() {
            assert_eq!(narrow[j].to_bits(), (cntk(t) as f32).to_bits(), "{t}");
        }
        // Integers only, signed or not; the window's last byte a delimiter: it advances by 64.
        let ints = format!("{:<63} ", "1 -22 333 +4444 55555 -666666 7777777 88888888 0 -0 10");
        let mut out = [0f64; 40];
        assert_eq!(
            dense_window_f64(&window(&ints), &mut out),
            DenseWindow::Read { advance: 64, count: 11, stopped: false }
        );
        for (j, t) in ints.split_whitespace().enumerate() {
            assert_eq!(out[j].to_bits(), cntk(t).to_bits(), "{t}");
        }
    }

    #[test]
    fn any_other_window_is_declined() {
        if !has_avx2() {
            return;
        }
        for text in [
            "|labels 3:1",                                                         // a stop byte first
            "1.5 2 3.5 4.5",                                                       // periods in some values only
            "1.5 1e5 3.5",                                                         // an exponent
            "1.5 .5 3.5",                                                          // no integer digit
            "1.5 5. 3.5",                                                          // no fraction digit
            "1.5 123456789.5 3.5",                                                 // nine integer digits
            "1.5 1.123456789 3.5",                                                 // nine fraction digits
            "1.5 1-2 3.5",                                                         // a sign inside a value
            "1.5 - 3.5",                                                           // a sign alone
            "1.5 2.5 3.5 4.5 1.2.3 6 7.5 8.5", // two periods in one value, none in another
            "1.5 2.5 3.5 4.5 -12345678.5 9.5", // a sign and eight integer digits
            "0.12345678901234567890123456789012345678901234567890123456789012345", // no delimiter
        ] {
            let mut out = [0f32; 40];
            let got = dense_window_f32(&window(text), &mut out);
            let DenseWindow::Declined { written } = got else { panic!("{text:?} was read: {got:?}") };
            assert!(out[written..].iter().all(|v| v.to_bits() == 0), "{text:?}: stored past {written}");
        }
        // A late value's failure is found after a group of four was stored.
        let mut out = [0f32; 40];
        assert_eq!(
            dense_window_f32(&window("1.5 2.5 3.5 4.5 -12345678.5 9.5"), &mut out),
            DenseWindow::Declined { written: 4 }
        );
        // A stop byte ends the sample: the values before it are read, up to it.
        for (text, count) in
            [("1.5 2.5 |labels 3:1", 2), ("1.5 -2.5\n4.5", 2), ("1 2|b", 2), ("-7\r\n", 1), ("3 \u{e9}", 1)]
        {
            let mut out = [0f32; 40];
            let got = dense_window_f32(&window(text), &mut out);
            let stop = text.find(['|', '\n', '\r', '\u{e9}']).expect("a stop byte");
            assert_eq!(got, DenseWindow::Read { advance: stop, count, stopped: true }, "{text:?}");
            #[allow(clippy::cast_possible_truncation)] // as static_cast<float>
            for (j, t) in text[..stop].split_whitespace().enumerate() {
                assert_eq!(out[j].to_bits(), (cntk(t) as f32).to_bits(), "{t}");
            }
        }
        // Not enough room for every value.
        assert_eq!(dense_window_f32(&window("1.5 2.5 3.5 "), &mut [0f32; 2]), DenseWindow::Declined { written: 0 });
    }
}
