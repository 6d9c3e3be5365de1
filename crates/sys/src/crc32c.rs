//! CRC-32C (Castagnoli) of short inputs with SSE 4.2's `crc32` instruction, where the CPU has it
//! (asked once at run time): TensorFlow's TFRecord frames checksum every record's 8-byte length
//! and its data, most records a few hundred bytes, where a general SIMD CRC's set-up and final
//! reduction cost more than the bytes. Long inputs are the caller's to send to such a CRC.

/// The CRC-32C of `data` (reflected, initial value and final XOR `0xffff_ffff`, as iSCSI and
/// TensorFlow compute it), or `None` where the CPU lacks SSE 4.2 (or off x86-64).
#[must_use]
#[inline]
pub fn crc32c_hw(data: &[u8]) -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    {
        if has_sse42() {
            // SAFETY: the CPU has SSE 4.2, asked just above.
            return Some(unsafe { sse42(data) });
        }
    }
    let _ = data;
    None
}

#[cfg(target_arch = "x86_64")]
fn has_sse42() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| std::arch::is_x86_feature_detected!("sse4.2"))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
fn sse42(data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut crc = u64::from(u32::MAX);
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        crc = _mm_crc32_u64(crc, u64::from_le_bytes(w.try_into().unwrap_or_default()));
    }
    #[allow(clippy::cast_possible_truncation)] // the instruction's result is 32 bits wide
    let mut crc = crc as u32;
    for &b in words.remainder() {
        crc = _mm_crc32_u8(crc, b);
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::crc32c_hw;

    /// Bit by bit, from the polynomial (reflected 0x82f63b78).
    fn reference(data: &[u8]) -> u32 {
        let mut crc = u32::MAX;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 { crc >> 1 ^ 0x82f6_3b78 } else { crc >> 1 };
            }
        }
        !crc
    }

    #[test]
    fn matches_the_polynomial_at_every_length_and_alignment() {
        let Some(check) = crc32c_hw(b"123456789") else { return };
        assert_eq!(check, 0xe306_9283, "CRC-32C's check value");
        let bytes: Vec<u8> = (0..600u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13).to_le_bytes()[0]).collect();
        for start in 0..9 {
            for len in 0..bytes.len() - start {
                let data = &bytes[start..start + len];
                assert_eq!(crc32c_hw(data), Some(reference(data)), "{start} {len}");
            }
        }
    }
}
