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

#[cfg(test)]
mod tests {
    use super::*;

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
