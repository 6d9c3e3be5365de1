//! Byte classes of a 64-byte window as bit masks, with SSE2 where the target has it — the one
//! piece of `unsafe` outside shared memory, kept here with the rest (module docs).
//!
//! Used by the CTF dense fast path (`format::ctf::scan`). On targets without SSE2 a plain loop
//! computes the same masks; the tests compare the two on every byte value.

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
}
