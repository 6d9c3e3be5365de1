//! `std::mt19937_64`, bit for bit, and the two helpers CNTK builds on it.
//!
//! CNTK's randomizers draw from two separate `std::mt19937_64` engines (chunk shuffle, sequence
//! shuffle), seeded with the standard 64-bit initialisation. They never use a standard
//! distribution: a draw in `[begin, end)` is `begin + rng() % (end - begin)` (`RandMT` in CNTK's
//! `RandomOrdering.h`), and the chunk shuffle is the naive swap loop of `RandomShuffleMT`. Both are
//! reproduced here because the sampling order must match CNTK exactly.
//!
//! Fed by: [`super::randomizer`]. Feeds: nothing else.

/// Degree of recurrence (`n`).
const STATE_WORDS: usize = 312;
/// Middle word offset (`m`).
const SHIFT: usize = 156;
/// Twist matrix coefficients (`a`).
const MATRIX_A: u64 = 0xB502_6F5A_A966_19E9;
/// Most significant 33 bits.
const UPPER_MASK: u64 = 0xFFFF_FFFF_8000_0000;
/// Least significant 31 bits.
const LOWER_MASK: u64 = 0x7FFF_FFFF;
/// Initialisation multiplier (`f`).
const INIT_MULTIPLIER: u64 = 6_364_136_223_846_793_005;

/// The 64-bit Mersenne Twister with the exact parameters and seeding of C++'s `std::mt19937_64`.
#[derive(Clone)]
pub struct Mt19937_64 {
    state: [u64; STATE_WORDS],
    index: usize,
}

impl std::fmt::Debug for Mt19937_64 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mt19937_64").field("index", &self.index).finish_non_exhaustive()
    }
}

impl Mt19937_64 {
    /// The seed of a default-constructed `std::mt19937_64`.
    pub const DEFAULT_SEED: u64 = 5489;

    /// An engine seeded like `std::mt19937_64::seed(seed)`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        let mut state = [0u64; STATE_WORDS];
        state[0] = seed;
        for i in 1..STATE_WORDS {
            let prev = state[i - 1];
            state[i] = INIT_MULTIPLIER.wrapping_mul(prev ^ (prev >> 62)).wrapping_add(i as u64);
        }
        Self { state, index: STATE_WORDS }
    }

    /// The next 64-bit output (`rng()` in C++).
    pub fn next_u64(&mut self) -> u64 {
        if self.index >= STATE_WORDS {
            self.twist();
        }
        let mut x = self.state[self.index];
        self.index += 1;
        x ^= (x >> 29) & 0x5555_5555_5555_5555;
        x ^= (x << 17) & 0x71D6_7FFF_EDA6_0000;
        x ^= (x << 37) & 0xFFF7_EEE0_0000_0000;
        x ^ (x >> 43)
    }

    /// CNTK's `RandMT(begin, end, rng)`: `begin + rng() % (end - begin)`, plain modulo, no
    /// rejection. `end` must be greater than `begin`.
    pub fn rand_range(&mut self, begin: usize, end: usize) -> usize {
        debug_assert!(end > begin, "empty range {begin}..{end}");
        let span = (end - begin) as u64;
        // The remainder is below `span`, which came from a usize: the cast cannot truncate.
        #[allow(clippy::cast_possible_truncation)]
        let offset = (self.next_u64() % span) as usize;
        begin + offset
    }

    /// [`Mt19937_64::rand_range`] over `range`'s bounds, its remainder taken without a division.
    #[inline]
    pub fn draw(&mut self, range: &Range) -> usize {
        range.begin + range.offset(self.next_u64())
    }

    /// CNTK's `RandomShuffleMT(v, rng)`: for every index `i`, swap `v[i]` with `v[RandMT(0, n)]`.
    /// This is the naive shuffle, not Fisher–Yates; its bias is part of the reproduced behaviour.
    pub fn naive_shuffle<T>(&mut self, items: &mut [T]) {
        let n = items.len();
        for i in 0..n {
            let j = self.rand_range(0, n);
            items.swap(i, j);
        }
    }

    fn twist(&mut self) {
        for i in 0..STATE_WORDS {
            let x = (self.state[i] & UPPER_MASK) | (self.state[(i + 1) % STATE_WORDS] & LOWER_MASK);
            let mut next = x >> 1;
            if x & 1 != 0 {
                next ^= MATRIX_A;
            }
            self.state[i] = self.state[(i + SHIFT) % STATE_WORDS] ^ next;
        }
        self.index = 0;
    }
}

/// A range `[begin, end)` drawn from many times ([`Mt19937_64::draw`]): `x % (end - begin)` taken
/// as Lemire, Kaser and Kurz's direct remainder ("Faster Remainder by Direct Computation", 2019)
/// with a 128-bit fraction `m = ceil(2^128 / span)`, exact for every 64-bit `x` and span (the
/// fraction has at least 64 + log2(span) bits). Four multiplications instead of a 64-bit
/// division, which costs 35–88 cycles on Intel cores before Ice Lake: a sweep-wide window's
/// shuffle draws once per sequence, and spent most of its time there.
#[derive(Debug, Clone, Copy)]
pub struct Range {
    begin: usize,
    span: u64,
    m: u128,
}

impl Range {
    /// `[begin, end)`; `end` must be greater than `begin`.
    #[must_use]
    pub fn new(begin: usize, end: usize) -> Self {
        debug_assert!(end > begin, "empty range {begin}..{end}");
        let span = (end - begin) as u64;
        // ceil(2^128 / span) = floor((2^128 - 1) / span) + 1; for a span of 1 it wraps to 0,
        // which gives the remainder 0.
        let m = (u128::MAX / u128::from(span.max(1))).wrapping_add(1);
        Self { begin, span, m }
    }

    /// `x % span`: the top 128 bits of `(m * x mod 2^128) * span`.
    #[inline]
    fn offset(&self, x: u64) -> usize {
        let low = self.m.wrapping_mul(u128::from(x));
        let d = u128::from(self.span);
        #[allow(clippy::cast_possible_truncation)] // the low half, on purpose
        let (hi, lo) = (low >> 64, u128::from(low as u64));
        // hi * d <= (2^64 - 1)^2 and the carry is below 2^64: no overflow.
        // Below `span`, which came from a usize.
        #[allow(clippy::cast_possible_truncation)]
        let rem = ((hi * d + ((lo * d) >> 64)) >> 64) as usize;
        rem
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The direct remainder is the remainder, on the spans and numerators where an error would
    /// show first (powers of two and their neighbours, the largest values) and on random ones.
    #[test]
    fn direct_remainder_is_the_remainder() {
        let mut spans: Vec<u64> = vec![1, 2, 3, 5, 7, 10, 433_659, 1_000_000_007, u64::MAX, u64::MAX - 1];
        for k in 1..64 {
            spans.extend([(1u64 << k) - 1, 1 << k, (1 << k) + 1]);
        }
        let mut rng = Mt19937_64::new(11);
        spans.extend((0..2000).map(|i| rng.next_u64() >> (i % 64)).filter(|&s| s > 0));
        let mut xs: Vec<u64> = vec![0, 1, 2, u64::MAX, u64::MAX - 1, 1 << 63, (1 << 63) - 1];
        xs.extend((0..200).map(|_| rng.next_u64()));
        for &span in &spans {
            let Ok(end) = usize::try_from(span) else { continue };
            let range = Range::new(0, end);
            for &x in xs.iter().chain(&[span, span - 1, span.wrapping_mul(3), span.wrapping_mul(3) - 1]) {
                assert_eq!(range.offset(x) as u64, x % span, "{x} % {span}");
            }
        }
    }

    /// `draw` is `rand_range`, draw for draw.
    #[test]
    fn draw_is_rand_range() {
        let (mut a, mut b) = (Mt19937_64::new(3), Mt19937_64::new(3));
        for (begin, end) in [(0, 1), (0, 433_659), (17, 1_000), (5, 6)] {
            let range = Range::new(begin, end);
            for _ in 0..10_000 {
                assert_eq!(a.draw(&range), b.rand_range(begin, end));
            }
        }
    }

    /// The C++ standard ([rand.predef]) pins the 10000th output of a default-constructed engine.
    #[test]
    fn ten_thousandth_output_matches_the_standard() {
        let mut rng = Mt19937_64::new(Mt19937_64::DEFAULT_SEED);
        let mut last = 0;
        for _ in 0..10_000 {
            last = rng.next_u64();
        }
        assert_eq!(last, 9_981_545_732_273_789_042);
    }

    #[test]
    fn first_outputs_of_seed_zero() {
        // Known values of std::mt19937_64 seeded with 0.
        let mut rng = Mt19937_64::new(0);
        assert_eq!(rng.next_u64(), 2_947_667_278_772_165_694);
        assert_eq!(rng.next_u64(), 18_301_848_765_998_365_067);
    }

    #[test]
    fn rand_range_stays_in_range() {
        let mut rng = Mt19937_64::new(7);
        for _ in 0..1000 {
            let x = rng.rand_range(3, 10);
            assert!((3..10).contains(&x));
        }
    }

    #[test]
    fn naive_shuffle_is_a_permutation() {
        let mut rng = Mt19937_64::new(1);
        let mut v: Vec<u32> = (0..50).collect();
        rng.naive_shuffle(&mut v);
        let mut sorted = v.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        assert_ne!(v, sorted);
    }
}
