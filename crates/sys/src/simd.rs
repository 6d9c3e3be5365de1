//! The CTF dense fast path's vector code (`format::ctf::scan`) — the one piece of `unsafe`
//! outside shared memory, kept here with the rest (module docs):
//!
//! * [`byte_classes`]: the byte classes of a 64-byte window as bit masks, with SSE2 where the
//!   target has it. On targets without SSE2 a plain loop computes the same masks; the tests
//!   compare the two on every byte value.
//! * [`dense_run_f32`] / [`dense_run_f64`]: a dense sample's values read a 64-byte window of
//!   plain decimals at a time with AVX2, BMI, POPCNT and PCLMULQDQ, where the CPU has them (asked
//!   once at run time, [`has_avx2`]); the first window of any other shape ends the run and is read
//!   by the caller's own loop. Its results are compared with CNTK's digit loop by the engine's
//!   tests and fuzz target.

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
const DENSE_WINDOW: usize = 80;

/// How far [`dense_run_f32`] and [`dense_run_f64`] read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DenseRun {
    /// Bytes read: whole windows, up to the stop byte if `stopped`.
    pub consumed: usize,
    /// Values stored, in `out[..count]`.
    pub count: usize,
    /// Whether the dense sample ended at `consumed`, at a stop byte (or the end of the bytes).
    /// If not, the kernel declined the window that starts at `consumed` (or the CPU lacks AVX2):
    /// the caller reads it its own way; slots of `out` past `count` are as they were.
    pub stopped: bool,
}

/// Reads the values of a dense sample from the start of `bytes` into `out`, as `f32`, a 64-byte
/// window at a time, for as long as the windows are of the common shape of dense CTF data and
/// the CPU has AVX2 (with BMI1, BMI2, LZCNT, POPCNT and PCLMULQDQ):
///
/// * a window is read up to its first stop byte (`|`, or a non-printable byte: a control byte
///   other than tab, or ≥ 0x80), where the dense sample ends, or else its 64 bytes; the last
///   bytes of `bytes` are read as if a stop byte followed them;
/// * every value that ends there (a run of bytes other than space and tab, followed by one or
///   by the stop byte) is a plain decimal `[+-]?d+(.d+)?`, with 1 to 8 integer digits (7 after
///   a sign) and 1 to 8 fraction digits, and either all of them have a period or none has;
/// * at least one value ends there and `out` has room for them.
///
/// A value that runs past a window's 64 bytes starts the next window. Each value is CNTK's
/// `f64` `integer + fraction / 10^digits` (bit-identical to its digit loop for these shapes:
/// every partial sum is an exact integer), negated by its sign bit and rounded to `f32` as
/// `static_cast<float>` does. The first window of any other shape ends the run
/// ([`DenseRun::stopped`] false), left to the caller.
pub fn dense_run_f32(bytes: &[u8], out: &mut [f32]) -> DenseRun {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU has AVX2, BMI1, BMI2, LZCNT, POPCNT and PCLMULQDQ (`has_avx2`), the
        // features the kernel is compiled for.
        return unsafe { avx2_run_f32(bytes, out) };
    }
    let _ = (bytes, out);
    DenseRun { consumed: 0, count: 0, stopped: false }
}

/// [`dense_run_f32`], the values kept as `f64`.
pub fn dense_run_f64(bytes: &[u8], out: &mut [f64]) -> DenseRun {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: as in `dense_run_f32`.
        return unsafe { avx2_run_f64(bytes, out) };
    }
    let _ = (bytes, out);
    DenseRun { consumed: 0, count: 0, stopped: false }
}

/// Whether the dense kernel runs on this CPU (asked once).
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
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    })
}

/// Whether the dense kernel runs on this CPU: never off x86-64.
#[cfg(not(target_arch = "x86_64"))]
#[must_use]
pub fn has_avx2() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
fn avx2_run_f32(bytes: &[u8], out: &mut [f32]) -> DenseRun {
    let room = out.len();
    avx2_run(bytes, room, |k, count, v| {
        let mut four = [0f32; 4];
        // SAFETY: writes the 16 bytes of `four`, a local array of four `f32`.
        unsafe { std::arch::x86_64::_mm_storeu_ps(four.as_mut_ptr(), std::arch::x86_64::_mm256_cvtpd_ps(v)) };
        place(&mut out[k..k + count], &four);
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
fn avx2_run_f64(bytes: &[u8], out: &mut [f64]) -> DenseRun {
    let room = out.len();
    avx2_run(bytes, room, |k, count, v| {
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
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
#[inline]
fn avx2_classes(w: &[u8; DENSE_WINDOW]) -> [u64; 6] {
    use std::arch::x86_64::{
        _mm256_andnot_si256, _mm256_cmpeq_epi8, _mm256_cmpgt_epi8, _mm256_loadu_si256, _mm256_movemask_epi8,
        _mm256_or_si256, _mm256_set1_epi8,
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
        c[2] |= bits(digit);
        c[3] |= bits(is(b'.'));
        c[4] |= bits(_mm256_or_si256(minus, is(b'+')));
        c[5] |= bits(minus);
    }
    c
}

/// Values taken apart and waiting for a group of four: each one's integer word (its digits, and
/// sign, at the top), its fraction word (from its first fraction digit; 0 for an integer) and its
/// sign bit, in three arrays. A ring of [`LANES`] entries, value `k` in entry `k % LANES`: a
/// window's values (at most 32) are taken apart first, and the complete groups of four of the
/// windows *before* it are converted after them — no branch per value on whether it completes a
/// group, which the CPU mispredicted, and no group read back while its words are still on their
/// way from the stores that wrote them: a window later they are in the cache, and a group's four
/// words of a kind are one 32-byte load (the kernel's rates with each layout are in
/// `docs/benchmarks.md`).
#[cfg(target_arch = "x86_64")]
#[repr(C, align(32))]
struct Lanes {
    ints: [i64; LANES],
    fracs: [i64; LANES],
    signs: [i64; LANES],
}

/// Entries of [`Lanes`]: a power of two above what may wait at once — 3 values of a group not yet
/// complete, the previous window's 32 and this window's 32.
#[cfg(target_arch = "x86_64")]
const LANES: usize = 128;

#[cfg(target_arch = "x86_64")]
impl Lanes {
    const EMPTY: Self = Self { ints: [0; LANES], fracs: [0; LANES], signs: [0; LANES] };
}

/// The kernel of [`dense_run_f32`] and [`dense_run_f64`], on this thread's [`Lanes`] (kept, so
/// that no call zeroes 3 KiB first).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
#[inline]
fn avx2_run(bytes: &[u8], room: usize, store: impl FnMut(usize, usize, std::arch::x86_64::__m256d)) -> DenseRun {
    thread_local! {
        static LANES_OF_THREAD: std::cell::RefCell<Lanes> = const { std::cell::RefCell::new(Lanes::EMPTY) };
    }
    LANES_OF_THREAD.with(|lanes| {
        if let Ok(mut lanes) = lanes.try_borrow_mut() {
            avx2_run_in(bytes, room, store, &mut lanes)
        } else {
            // Never taken (a run does not call another), but a fresh ring would do.
            let mut fresh = Lanes::EMPTY;
            avx2_run_in(bytes, room, store, &mut fresh)
        }
    })
}

/// The kernel. Per window: its byte classes, its shape checked on them for all values together,
/// then each value's place found in the masks (one `tzcnt` each for start and period, or end) and
/// its words put in `lanes`; then every complete group of four of the windows before, across
/// windows, is summed in AVX2 lanes of 64 bits, converted, divided, signed and handed to
/// `store(k, count, four)` for slots `k..k + count`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
#[inline]
#[allow(clippy::similar_names)] // the masks of a window
fn avx2_run_in(
    bytes: &[u8],
    room: usize,
    mut store: impl FnMut(usize, usize, std::arch::x86_64::__m256d),
    lanes: &mut Lanes,
) -> DenseRun {
    // Values read (`count`), of which the first `stored` are in `out`, the rest in `lanes`; the
    // first `before` were read from earlier windows.
    let (mut p, mut count, mut stored, mut before) = (0usize, 0usize, 0usize, 0usize);
    let mut tail;
    let stopped = loop {
        let w: &[u8; DENSE_WINDOW] = if let Some(w) = bytes.get(p..p + DENSE_WINDOW) {
            w.try_into().expect("80 bytes")
        } else if p < bytes.len() {
            // The last bytes, followed by stop bytes (the padding): the sample ends there.
            tail = [b'\n'; DENSE_WINDOW];
            tail[..bytes.len() - p].copy_from_slice(&bytes[p..]);
            &tail
        } else {
            break true;
        };
        let [delim, stop, digit, dot, sign, minus] = avx2_classes(w);
        // The first stop byte ends the sample: only the bytes before it are read.
        let first_stop = stop & stop.wrapping_neg();
        let value = !delim & first_stop.wrapping_sub(1);
        // The delimiters (or the stop byte) right after a value: one per value that ends inside.
        let ends = (delim | first_stop) & (value << 1);
        if ends == 0 {
            break false;
        }
        // Everything before the last value's end.
        let region = (1u64 << ends.ilog2()) - 1;
        let all_starts = value & !(value << 1);
        let starts = all_starts & region;
        let digit_next = digit >> 1;
        let run8 = {
            let r2 = digit & digit_next;
            let r4 = r2 & (r2 >> 2);
            r4 & (r4 >> 4)
        };
        let dots = dot & region;
        // Dots and starts alternate (each value has exactly one period) if the parity of both up
        // to each value's end is the same: every value then has an odd number of periods, and
        // with as many periods as values, one each.
        let unpaired = {
            use std::arch::x86_64::{_mm_clmulepi64_si128, _mm_cvtsi128_si64, _mm_cvtsi64_si128, _mm_set1_epi64x};
            // The prefix XOR: a carry-less product with all ones.
            let x = _mm_cvtsi64_si128((dots ^ starts).cast_signed());
            _mm_cvtsi128_si64(_mm_clmulepi64_si128::<0>(x, _mm_set1_epi64x(-1))).cast_unsigned()
        };
        let odd = !(digit | dot | delim | sign)
            | (sign & !(all_starts & digit_next))
            | (dot & !((digit << 1) & digit_next))
            | (run8 & (digit >> 8))
            | (sign & (run8 >> 1));
        let n = ends.count_ones() as usize;
        if odd & region != 0
            || (dots != 0 && (dots.count_ones() as usize != n || unpaired & ends != 0))
            || n > room - count
        {
            break false;
        }
        // One value: its integer word from its start `s` to `d` (its period, or its end), its
        // fraction word `frac`, its sign.
        macro_rules! value {
            ($s:expr, $d:expr, $frac:expr) => {{
                let (s, d) = ($s, $d);
                let lane = count % LANES;
                lanes.fracs[lane] = $frac;
                // The integer digits (and sign) at the top of the word, the bytes after cut.
                lanes.ints[lane] = load8(w, s).wrapping_shl(64u32.wrapping_sub(d.wrapping_sub(s).wrapping_mul(8)) & 63);
                lanes.signs[lane] = i64::from((minus >> (s & 63)) & 1 == 1) << 63;
                count += 1;
            }};
        }
        let mut st = starts;
        if dots == 0 {
            let mut en = ends;
            for _ in 0..n {
                let s = st.trailing_zeros();
                st &= st.wrapping_sub(1);
                let e = en.trailing_zeros();
                en &= en.wrapping_sub(1);
                value!(s, e, 0);
            }
        } else {
            let mut dt = dots;
            for _ in 0..n {
                let s = st.trailing_zeros();
                st &= st.wrapping_sub(1);
                let d = dt.trailing_zeros();
                dt &= dt.wrapping_sub(1);
                // The fraction digits from the word's first byte; what follows them is cut in the
                // lanes.
                value!(s, d, load8(w, d + 1));
            }
        }
        while stored + 4 <= before {
            store(stored, 4, avx2_group(lanes, stored));
            stored += 4;
        }
        before = count;
        if stop != 0 {
            p += stop.trailing_zeros() as usize;
            break true;
        }
        let partial = all_starts & !region;
        p += if partial == 0 { 64 } else { partial.trailing_zeros() as usize };
    };
    while stored < count {
        let group = (count - stored).min(4);
        store(stored, group, avx2_group(lanes, stored));
        stored += group;
    }
    DenseRun { consumed: p, count, stopped }
}

/// The little-endian word of `w[at..at + 8]`, `at` taken below 64.
#[inline]
fn load8(w: &[u8; DENSE_WINDOW], at: u32) -> i64 {
    let at = (at & 63) as usize;
    let b: [u8; 8] = w[at..at + 8].try_into().expect("eight bytes");
    i64::from_le_bytes(b)
}

/// Four values (`from..from + 4` in `lanes`) from their words: CNTK's `int + frac / 10^k`, where
/// the fraction word read as eight digits is `frac * 10^(8 - k)` — over 10^8 the same rational as
/// `frac` over 10^k, both parts exact, so the correctly rounded quotient is the same `f64` — then
/// signed.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
#[inline]
fn avx2_group(lanes: &Lanes, from: usize) -> std::arch::x86_64::__m256d {
    use std::arch::x86_64::{
        __m256i, _mm256_add_pd, _mm256_castsi256_pd, _mm256_div_pd, _mm256_loadu_si256, _mm256_or_pd, _mm256_set1_pd,
    };
    // Values `from..from + 4`: `from` is a multiple of four, so they do not wrap around.
    let at = (from % LANES) & !3;
    let four = |words: &[i64; LANES]| -> __m256i {
        let four: &[i64; 4] = words[at..at + 4].try_into().expect("four lanes");
        // SAFETY: reads the 32 bytes of `four`, borrowed from `lanes`.
        unsafe { _mm256_loadu_si256(four.as_ptr().cast()) }
    };
    let int = avx2_sum4(four(&lanes.ints));
    let frac = avx2_sum4_leading(four(&lanes.fracs));
    let v = _mm256_add_pd(int, _mm256_div_pd(frac, _mm256_set1_pd(1e8)));
    _mm256_or_pd(v, _mm256_castsi256_pd(four(&lanes.signs)))
}

#[cfg(target_arch = "x86_64")]
/// The digits of each lane's word, at its top bytes (anything below them above 9 after the
/// subtraction, or zero), summed as four `f64`.
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
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
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
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
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
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
    use std::fmt::Write as _;

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

    /// Runs the kernel over `text` both ways and checks every value read against [`cntk`].
    fn run(text: &str) -> DenseRun {
        let mut wide = vec![0f64; 512];
        let got = dense_run_f64(text.as_bytes(), &mut wide);
        let mut narrow = vec![0f32; 512];
        assert_eq!(dense_run_f32(text.as_bytes(), &mut narrow), got, "{text:?}");
        let tokens: Vec<&str> = text[..got.consumed].split([' ', '\t']).filter(|t| !t.is_empty()).collect();
        assert_eq!(tokens.len(), got.count, "{text:?}");
        for (j, t) in tokens.iter().enumerate() {
            assert_eq!(wide[j].to_bits(), cntk(t).to_bits(), "{t} in {text:?}");
            #[allow(clippy::cast_possible_truncation)] // as static_cast<float>
            let narrowed = cntk(t) as f32;
            assert_eq!(narrow[j].to_bits(), narrowed.to_bits(), "{t} in {text:?}");
        }
        assert!(wide[got.count..].iter().all(|v| v.to_bits() == 0), "stored past the count in {text:?}");
        assert!(narrow[got.count..].iter().all(|v| v.to_bits() == 0), "stored past the count in {text:?}");
        got
    }

    #[test]
    fn plain_windows_are_read_whole_across_their_borders_to_the_end() {
        if !has_avx2() {
            assert_eq!(run("1.5 2.5"), DenseRun { consumed: 0, count: 0, stopped: false });
            return;
        }
        // Values cut by a window's border start the next one; the end of the bytes ends the
        // sample.
        let mut text = String::new();
        for k in 0..150u32 {
            let sign = ["", "-", "+"][(k % 3) as usize];
            let int = [7, 42, 1_234_567, 0, 99][(k % 5) as usize];
            let frac = ["5", "25", "012410", "98448712", "0"][(k % 7 % 5) as usize];
            let delim = if k % 4 == 0 { '\t' } else { ' ' };
            let _ = write!(text, "{sign}{int}.{frac}{delim}");
        }
        let text = text.trim_end();
        assert_eq!(run(text), DenseRun { consumed: text.len(), count: 150, stopped: true });
        // Integers only, signed or not.
        let ints = "1 -22 333 +4444 55555 -666666 7777777 88888888 0 -0 10 -1234567 12345678";
        assert_eq!(run(ints), DenseRun { consumed: ints.len(), count: 13, stopped: true });
    }

    #[test]
    fn windows_full_of_short_values_wrap_the_lanes_many_times() {
        if !has_avx2() {
            return;
        }
        // Windows of 32 values ("1 2 ..."), after 0 to 3 longer ones that leave values waiting
        // for their group; windows of 16 ("1.5 ..."); mixed lengths. Up to 449 values, so the
        // lanes' ring of 128 wraps three times, and windows of 32 values follow each other while
        // the groups of the one before are still to be converted.
        for count in [1usize, 3, 4, 5, 31, 32, 33, 63, 64, 65, 127, 128, 129, 198, 199, 255, 256, 257, 448, 449] {
            for longer in 0..4 {
                let ints: Vec<String> =
                    (0..count).map(|k| if k < longer { "12".to_owned() } else { ((k * 7) % 10).to_string() }).collect();
                let text = ints.join(" ");
                assert_eq!(run(&text), DenseRun { consumed: text.len(), count, stopped: true }, "{text:?}");
            }
            let halves: Vec<String> = (0..count).map(|k| format!("{}.5", k % 10)).collect();
            let text = halves.join(" ");
            assert_eq!(run(&text), DenseRun { consumed: text.len(), count, stopped: true }, "{count} halves");
            let mixed: Vec<String> =
                (0..count).map(|k| format!("-{}.{}", k % 3, "12345678".get(..1 + k % 8).unwrap_or("1"))).collect();
            let text = mixed.join("\t");
            assert_eq!(run(&text), DenseRun { consumed: text.len(), count, stopped: true }, "{count} mixed");
        }
    }

    #[test]
    fn random_long_samples_match_cntk_wherever_the_run_ends() {
        if !has_avx2() {
            return;
        }
        // Samples of up to 400 plain values (some windows of them converted while the next is
        // read), now and then an odd value that ends the run, and a stop byte or not at the end.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut read = 0;
        for _ in 0..400 {
            let r = next();
            let values = 1 + r % 400;
            let periods = r >> 10 & 1 == 1;
            let mut text = String::new();
            for _ in 0..values {
                let r = next();
                if r % 97 == 0 {
                    text.push_str("1e5");
                } else {
                    let sign = ["", "-", "", "+"][(r % 4) as usize];
                    let int = (r >> 8) % 10u64.pow(1 + ((r >> 40) % 7) as u32);
                    let _ = write!(text, "{sign}{int}");
                    if periods {
                        let k = 1 + ((r >> 44) % 8) as usize;
                        let _ = write!(text, ".{:08}", (r >> 20) % 100_000_000);
                        text.truncate(text.len() - (8 - k));
                    }
                }
                text.push(if (r >> 50) % 4 == 0 { '\t' } else { ' ' });
            }
            if r >> 20 & 1 == 1 {
                text.push_str("|labels 3:1");
            }
            let got = run(&text);
            assert!(got.consumed <= text.len() && got.count <= 400, "{text:?}");
            read += got.count;
        }
        eprintln!("{read} values read by the kernel");
        assert!(read > 10_000, "the kernel read {read} values: the samples exercise too little");
    }

    #[test]
    fn a_stop_byte_ends_the_sample() {
        if !has_avx2() {
            return;
        }
        for (text, count) in
            [("1.5 2.5 |labels 3:1", 2), ("1.5 -2.5\n4.5", 2), ("1 2|b", 2), ("-7\r\n", 1), ("3 \u{e9}", 1)]
        {
            let stop = text.find(['|', '\n', '\r', '\u{e9}']).expect("a stop byte");
            assert_eq!(run(text), DenseRun { consumed: stop, count, stopped: true }, "{text:?}");
        }
    }

    #[test]
    fn any_other_window_ends_the_run_where_it_starts() {
        if !has_avx2() {
            return;
        }
        for odd in [
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
            "1.5 2..5 3 4.5",                  // two periods together
            "0.12345678901234567890123456789012345678901234567890123456789012345", // no delimiter
        ] {
            assert_eq!(run(odd), DenseRun { consumed: 0, count: 0, stopped: false }, "{odd:?}");
            // After whole windows of plain values, the run ends at the odd window's start.
            let text = format!("{}{odd}", "0.5 ".repeat(32));
            assert_eq!(run(&text), DenseRun { consumed: 128, count: 32, stopped: false }, "{odd:?}");
        }
        assert_eq!(run("|labels 3:1"), DenseRun { consumed: 0, count: 0, stopped: false }, "a stop byte first");
        // Not enough room for every value: the window is left to the caller.
        assert_eq!(dense_run_f32(b"1.5 2.5 3.5 ", &mut [0f32; 2]), DenseRun { consumed: 0, count: 0, stopped: false });
    }
}
