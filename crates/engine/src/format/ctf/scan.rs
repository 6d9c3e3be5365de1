//! The common case of a dense sample, read a 64-byte window at a time.
//!
//! Almost every value in real CTF data is a plain decimal: an optional sign, up to 15 integer
//! digits, optionally a period and up to 15 fraction digits, then a space, a tab, a `|` or the end
//! of the line. For those, CNTK's `f64` digit loop (reference §1.7) computes exact integers — every
//! partial sum is below 2^53 and `divider` is an exact power of ten up to 10^22 — so
//! `integer + fraction / 10^k` computed from integer digit sums is bit-identical to it.
//!
//! [`dense_values`] finds the bytes that end values (delimiters and stop bytes) for a whole
//! window first, as bit masks, and then converts each value from its known extent, eight digits
//! at a time. The byte loop of [`parse_real`](super::number::parse_real) advances through a value
//! one byte at a time and, on random signs, mispredicts once per value, which exposes its chain of
//! `f64` multiply-adds; here the values of a window are independent of each other.
//!
//! Where the CPU has AVX2, a window whose every value is of the common shape (1 to 8 digits on
//! either side of the period, all with a period or none), up to the sample's first stop byte, is
//! read whole first by the vector kernel of `minibatchd-sys` (`dense_run_f32`): its shape checked
//! on the window's masks for all values at once, then four values at a time in vector lanes. It
//! declines every other window, which the loop of one value at a time below reads as before.
//!
//! The fast path never decides anything the byte loop would decide differently: it consumes only
//! whole values of that plain shape and the delimiters between them, and hands everything else —
//! exponents, glued numbers (`1-2`), malformed text, long mantissas, the last bytes of the
//! sequence — back to the byte loop at the first byte of the value it did not take, in the same
//! state the byte loop would be in there.

// The window helpers are `#[inline(always)]` so that `dense_values` is one loop over the window;
// the fast path's speed-up was measured that way (scripts/bench/bench_daemon.py). Measure again before
// leaving inlining to rustc.
#![allow(clippy::inline_always)]

use minibatchd_sys::simd::{byte_classes, has_avx2, ByteClasses as Masks};

use super::element::Element;

/// Bytes per window (one bit per byte in the masks).
const W: usize = 64;
/// Bytes a window reads beyond its 64: a value's eight-digit loads may start at byte 63 (and,
/// for more than eight digits, eight bytes later, within the value).
const OVERHANG: usize = 16;

/// `10^k`, exact in `f64` for `k <= 22` (only `k <= 15` is used).
const POW10: [f64; 16] = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15];
/// `10^k` as integers, `k <= 7`.
const POW10_U64: [u64; 8] = [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000];

/// The little-endian `u64` of `w[at..at + 8]`.
#[inline(always)]
fn load8(w: &[u8; W + OVERHANG], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&w[at..at + 8]);
    u64::from_le_bytes(b)
}

/// The value of the `len` (1..=8) ASCII digits at the start of `chunk` (first digit in the low
/// byte). The bytes after them are ignored.
#[inline(always)]
fn digits8(chunk: u64, len: usize) -> u64 {
    debug_assert!((1..=8).contains(&len));
    let mut v = chunk.wrapping_sub(0x3030_3030_3030_3030);
    if len < 8 {
        // Keep the `len` digits and move them to the top: the low bytes become leading zeros.
        v = (v & ((1u64 << (8 * len)) - 1)) << (8 * (8 - len));
    }
    // Pairs, then quads, then the eight digits (the well-known SWAR reduction).
    v = v.wrapping_mul(10).wrapping_add(v >> 8);
    let lo = (v & 0x0000_00FF_0000_00FF).wrapping_mul(100 + (1_000_000 << 32));
    let hi = ((v >> 16) & 0x0000_00FF_0000_00FF).wrapping_mul(1 + (10_000 << 32));
    lo.wrapping_add(hi) >> 32
}

/// The value of the `len` (1..=15) digits at `w[at..]`.
#[inline(always)]
fn digits(w: &[u8; W + OVERHANG], at: usize, len: usize) -> u64 {
    if len == 1 {
        // The usual integer part ("0.123456", "-1.5"): one byte, no SWAR.
        return u64::from(w[at] - b'0');
    }
    if len <= 8 {
        digits8(load8(w, at), len)
    } else {
        let rest = len - 8;
        digits8(load8(w, at), 8) * POW10_U64[rest] + digits8(load8(w, at + 8), rest)
    }
}

/// A digit sum below 10^15 (< 2^53) as `f64`, exactly; through `i64`, which converts in one
/// instruction where `u64` takes several.
#[inline(always)]
#[allow(clippy::cast_possible_wrap, clippy::cast_precision_loss)] // < 10^15: both exact
fn exact(v: u64) -> f64 {
    v as i64 as f64
}

/// A plain decimal taken apart: `±(int + frac / 10^frac_len)`.
#[derive(Clone, Copy)]
struct Parts {
    int: u64,
    frac: u64,
    frac_len: usize,
    negative: bool,
}

impl Parts {
    /// CNTK's value: `coefficient + number / divider` on exact integers (an integer is
    /// `int + 0 / 1`, the same bits), negated as a sign bit since it is never negative.
    #[inline(always)]
    fn value(self) -> f64 {
        let v = exact(self.int) + exact(self.frac) / POW10[self.frac_len];
        f64::from_bits(v.to_bits() | u64::from(self.negative) << 63)
    }
}

/// The plain decimal at `w[s..e)`, or `None` if it is anything else.
#[inline(always)]
fn plain_parts(w: &[u8; W + OVERHANG], m: &Masks, s: usize, e: usize) -> Option<Parts> {
    let negative = w[s] == b'-';
    let i = s + usize::from(negative || w[s] == b'+');
    // Bits [i, e): e <= 63, so the shifts are in range.
    let span = ((1u64 << e) - 1) & !((1u64 << i) - 1);
    let dots = m.dot & span;
    if !m.digit & span & !dots != 0 {
        return None;
    }
    if dots == 0 {
        let len = e - i;
        if len == 0 || len > 15 {
            return None;
        }
        return Some(Parts { int: digits(w, i, len), frac: 0, frac_len: 0, negative });
    }
    if dots & (dots - 1) != 0 {
        return None;
    }
    let d = dots.trailing_zeros() as usize;
    let (int_len, frac_len) = (d - i, e - d - 1);
    if int_len == 0 || int_len > 15 || frac_len == 0 || frac_len > 15 {
        return None;
    }
    Some(Parts { int: digits(w, i, int_len), frac: digits(w, d + 1, frac_len), frac_len, negative })
}

/// Where a dense sample's values go: its `dim` slots (zero until read), and how many values were
/// read — values past `dim` are counted, not stored, so that the sample is rejected with its count.
pub struct DenseOut<'a, T> {
    /// The sample's slots.
    pub slots: &'a mut [T],
    /// Values read so far.
    pub count: usize,
    /// Where the vector kernel may be tried again after it declined a window: data it declines
    /// (exponents, long mantissas) would otherwise cost a try per value, as the byte loop hands
    /// each such value back. One window on after a first decline, then twice as far each time.
    kernel_from: usize,
    /// Windows the kernel declined in this sample.
    declined: u32,
}

impl<'a, T> DenseOut<'a, T> {
    /// Nothing read into `slots` yet.
    pub fn new(slots: &'a mut [T]) -> Self {
        DenseOut { slots, count: 0, kernel_from: 0, declined: 0 }
    }
}

impl<T: Element> DenseOut<'_, T> {
    /// Stores (within `dim`) and counts one value.
    #[inline(always)]
    pub fn push(&mut self, v: f64) {
        if let Some(slot) = self.slots.get_mut(self.count) {
            *slot = T::from_f64(v);
        }
        self.count += 1;
    }

    /// Reads from `bytes[p..]` with the vector kernel
    /// ([`minibatchd_sys::simd::dense_run_f32`]) for as long as its windows have the kernel's
    /// shape: where it stopped, and whether the sample ends there.
    #[inline(always)]
    fn run(&mut self, bytes: &[u8], p: usize) -> (usize, bool) {
        let free = self.slots.get_mut(self.count..).unwrap_or_default();
        let run = T::dense_run(bytes.get(p..).unwrap_or_default(), free);
        self.count += run.count;
        let at = p + run.consumed;
        if !run.stopped {
            self.kernel_from = at + (W << self.declined.min(6));
            self.declined += 1;
        }
        (at, run.stopped)
    }
}

/// Reads the plain values and delimiters of a dense sample from `bytes[p..]` into `out`, and
/// returns where the byte loop must go on: at a stop byte, at the first byte of a value that is
/// not plain, or within the last bytes of `bytes`.
///
/// Windows of the common shape (see [`minibatchd_sys::simd::dense_run_f32`]) are read whole by
/// the vector kernel where the CPU has AVX2 (and `kernel` allows: off only in tests); any other
/// window, one value at a time below.
#[inline]
pub fn dense_values<T: Element>(bytes: &[u8], mut p: usize, out: &mut DenseOut<'_, T>, kernel: bool) -> usize {
    let kernel = kernel && has_avx2();
    loop {
        if kernel && p >= out.kernel_from {
            let (at, stopped) = out.run(bytes, p);
            p = at;
            if stopped {
                return p;
            }
        }
        // A window the kernel declined (or every window, without it): one value at a time.
        let Some(w) = bytes.get(p..p + W + OVERHANG) else { return p };
        let Ok(w) = <&[u8; W + OVERHANG]>::try_from(w) else { return p };
        let Ok(head) = <&[u8; W]>::try_from(&w[..W]) else { return p };
        let m = byte_classes(head);
        let ends = m.delim | m.stop;
        let mut q = 0usize;
        // Where this window's scan ended: `Ok(advance)` to go on, `Err(at)` to hand over.
        let ended = loop {
            let values = !m.delim & (!0u64 << q);
            if values == 0 {
                break Ok(W); // delimiters to the end of the window
            }
            let s = values.trailing_zeros() as usize;
            if m.stop >> s & 1 == 1 {
                break Err(s);
            }
            let after = ends & (!0u64 << s);
            if after == 0 {
                // The value runs past the window: the next window starts at it (a value of 64
                // bytes is not plain).
                break if s == 0 { Err(0) } else { Ok(s) };
            }
            let e = after.trailing_zeros() as usize;
            let Some(v) = plain_parts(w, &m, s, e) else { break Err(s) };
            out.push(v.value());
            q = e; // a delimiter or a stop byte, < 64
        };
        match ended {
            Ok(advance) => p += advance,
            Err(at) => return p + at,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write;

    use super::*;
    use crate::format::ctf::number::parse_real;

    /// What the byte loop of `read_dense` reads from `bytes[p..]` up to where `dense_values`
    /// stopped: the reference for the fast path.
    fn byte_loop(bytes: &[u8], mut p: usize, until: usize) -> Vec<u64> {
        let mut out = Vec::new();
        while p < until {
            let c = bytes[p];
            if c == b' ' || c == b'\t' {
                p += 1;
                continue;
            }
            let (v, np) = parse_real(bytes, p).expect("the fast path took only valid values");
            out.push(v.to_bits());
            p = np;
        }
        assert_eq!(p, until, "the fast path stopped inside a value");
        out
    }

    fn check(text: &str) -> usize {
        let bytes = text.as_bytes();
        // With the vector kernel (where the CPU has it) and without: the same as the byte loop.
        let mut kernel_end = 0;
        for kernel in [true, false] {
            let mut slots = vec![0f64; bytes.len()];
            let mut out = DenseOut::new(&mut slots);
            let end = dense_values(bytes, 0, &mut out, kernel);
            let count = out.count;
            let got: Vec<u64> = slots[..count].iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, byte_loop(bytes, 0, end), "{text:?}, kernel {kernel}");
            assert!(slots[count..].iter().all(|v| v.to_bits() == 0), "stored past the count in {text:?}");
            // Where it stopped, the byte loop would stop too or has a value it must read itself.
            // Short of the tail, it stops only where the byte loop has something to decide.
            if end + W + OVERHANG <= bytes.len() {
                assert!(bytes[end] != b' ' && bytes[end] != b'\t', "stopped at a delimiter in {text:?}");
            }
            if kernel {
                kernel_end = end;
            }
        }
        kernel_end
    }

    fn pad(s: &str) -> String {
        format!("{s}{}", " ".repeat(2 * W + OVERHANG))
    }

    #[test]
    fn plain_values_match_cntk_bit_for_bit() {
        let text = pad("0.5 -0.012410 +3 7 123456789012345 0.123456789012345 99999.00001\t-0 1.0 |labels 3:1");
        let end = check(&text);
        assert_eq!(&text[end..end + 7], "|labels");
    }

    #[test]
    fn windows_the_kernel_declines_are_read_value_by_value() {
        // Each text fills whole windows; the kernel (where the CPU has AVX2) declines those with a
        // value it does not take, and the loop of one value at a time reads them instead.
        for s in [
            "1.5 2.5 3.5 4.5 -12345678.5 9.5 0.25 0.125 1.5 2.5 3.5 4.5 5.5 6.5 7.5 8.5 9.5",
            "1.5 2.5 3.5 4.5 0.123456789012 9.5 0.25 0.125 1.5 2.5 3.5 4.5 5.5 6.5 7.5 8.5",
            "1 2 3 4 5 6 7 8 -123456789 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27",
            "1.5 2 3.5 4 5.5 6 7.5 8 9.5 10 11.5 12 13.5 14 15.5 16 17.5 18 19.5 20 21.5",
            "0.5\t-0.5\t+0.5\t-0\t+0\t0\t00.00\t-00000000.5\t12345678.12345678 1 2 3 4 5 6",
        ] {
            check(&pad(s));
        }
    }

    #[test]
    fn stops_at_what_the_byte_loop_must_read() {
        for (s, stop_at) in [
            ("1 2e5 3", "2e5"),
            ("1 1-2 3", "1-2"),
            ("1 .5 3", ".5"),
            ("1 4. 3", "4."),
            ("1 1.2.3 3", "1.2.3"),
            ("1 - 3", "-"),
            ("1 x 3", "x"),
            ("1 1234567890123456 3", "1234567890123456"),
            ("1 0.1234567890123456 3", "0.1234567890123456"),
            ("1 2\r\n", "\r"),
            ("1 2\n", "\n"),
            ("1 2|b", "|b"),
            ("1 2\u{e9}", "\u{e9}"),
        ] {
            let text = pad(s);
            let end = check(&text);
            assert!(text[end..].starts_with(stop_at), "{s:?} stopped at {:?}", &text[end..end + 8]);
        }
    }

    #[test]
    fn values_across_windows_and_the_tail() {
        // Values straddle window borders at every phase; the tail is left to the byte loop.
        for lead in 0..W {
            let mut s = " ".repeat(lead);
            for k in 0..60 {
                let _ =
                    write!(s, "{}{}.{:06} ", if k % 3 == 0 { "-" } else { "" }, k * 37 % 1000, k * 7919 % 1_000_000);
            }
            let end = check(&s);
            assert!(s.len() - end < W + OVERHANG + 24, "left {} bytes", s.len() - end);
        }
    }

    #[test]
    fn random_plain_and_odd_values() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let alphabet = b"0123456789.-+eE \t|x";
        for _ in 0..3000 {
            let mut s = String::new();
            for _ in 0..40 {
                let r = next();
                if r % 10 == 0 {
                    // Odd text: whatever the byte loop makes of it, the fast path hands it over.
                    for k in 0..(r >> 8) % 6 {
                        let pick = (r >> (12 + 4 * k)) % alphabet.len() as u64;
                        s.push(char::from(alphabet[usize::try_from(pick).expect("below the alphabet's length")]));
                    }
                } else {
                    let int_len = 1 + (r >> 8) % 16;
                    let frac_len = (r >> 16) % 17;
                    let sign = ["", "-", "+"][((r >> 24) % 3) as usize];
                    let digits: String =
                        (0..int_len + frac_len).map(|i| char::from(b'0' + ((next() >> (i % 50)) % 10) as u8)).collect();
                    let (a, b) = digits.split_at(usize::try_from(int_len).expect("at most 16"));
                    s.push_str(sign);
                    s.push_str(a);
                    if frac_len > 0 {
                        s.push('.');
                        s.push_str(b);
                    }
                }
                s.push(if r >> 40 & 1 == 0 { ' ' } else { '\t' });
            }
            // Stop before the first '|' or odd byte the byte loop would stop at: check() only
            // compares up to where the fast path stopped, which is never past such a byte.
            check(&pad(&s));
        }
    }
}
