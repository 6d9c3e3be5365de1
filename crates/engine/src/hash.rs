//! The one hash of minibatchd for everything that must be stable across runs, builds and
//! machines: index-cache file names and checksums, names of decompressed `.gz` copies, dataset
//! identities and session option hashes in checkpoints, the data-order ledger's fingerprints.
//!
//! Also the cheap hasher of chunk-index maps and sets ([`ChunkMap`], [`ChunkSet`]), which no
//! checkpoint or file depends on.
//!
//! 64-bit FNV-1a. Not a cryptographic hash — nothing here is chosen by an adversary who profits
//! from a collision; a collision costs a cache miss or a refused restore, never wrong data (the
//! index cache validates size, mtime and options besides the name, and carries its own checksum).
//!
//! The exact byte stream of each persisted value is part of the on-disk formats: changing what is
//! fed (or [`Fnv1a::field`]'s separator) changes the names of caches and checkpoint identities, so
//! it needs a cache version bump and a checkpoint migration.

const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0100_0000_01b3;

/// `PRIME^i` modulo 2^64, `i` in `0..=8`: `i` multiplies of FNV-1a by zero bytes in one.
const PRIME_POWERS: [u64; 9] = {
    let mut p = [1u64; 9];
    let mut i = 1;
    while i < 9 {
        p[i] = p[i - 1].wrapping_mul(PRIME);
        i += 1;
    }
    p
};

/// A streaming 64-bit FNV-1a hasher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Self::new()
    }
}

impl Fnv1a {
    /// The empty hash (FNV's offset basis).
    #[must_use]
    pub fn new() -> Self {
        Self(OFFSET_BASIS)
    }

    /// The hash of `bytes` alone.
    #[must_use]
    pub fn of(bytes: &[u8]) -> u64 {
        let mut h = Self::new();
        h.write(bytes);
        h.finish()
    }

    /// Feeds `bytes` (plain FNV-1a).
    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(PRIME);
        }
    }

    /// Feeds `bytes` as one field of a record: the bytes, then a separator folded into the state
    /// (`^ 0xff`), so `("ab", "c")` and `("a", "bc")` differ.
    pub fn field(&mut self, bytes: &[u8]) {
        self.write(bytes);
        self.0 ^= 0xff;
    }

    /// Feeds `v` as a field of 8 little-endian bytes.
    ///
    /// Exactly [`Fnv1a::field`] of the bytes, in fewer steps: a zero byte leaves the state as it
    /// is before its multiply (`h ^ 0 == h`), so the high zero bytes of a small value — most
    /// values fed, sequence lengths and offsets — fold into one multiply by a power of the prime.
    /// (A dataset's identity feeds one value per sequence: 4.5 M of them took 30 ms a walk.)
    #[inline]
    pub fn u64(&mut self, v: u64) {
        // Bytes up to the highest non-zero one (at least one: the last multiply takes the
        // power of the zero bytes after it).
        let k = (8 - v.leading_zeros() as usize / 8).max(1);
        let mut h = self.0;
        for i in 0..k - 1 {
            h = (h ^ ((v >> (8 * i)) & 0xff)).wrapping_mul(PRIME);
        }
        h = (h ^ ((v >> (8 * (k - 1))) & 0xff)).wrapping_mul(PRIME_POWERS[9 - k]);
        self.0 = h ^ 0xff;
    }

    /// Feeds `n` fields of the value 1: exactly `n` calls of [`Fnv1a::u64`]`(1)` (a dataset's
    /// identity feeds one length per sequence, all 1 for one-sample sequences: a billion of them
    /// took 4.6 s a walk), in at most 511 steps and a logarithm's.
    ///
    /// With `u = h ^ 1`, one field is `u -> (u * P^8) ^ 0xfe`: a multiply, then an xor of the low
    /// byte's bits, which adds a constant that depends only on that low byte — and the low byte
    /// goes round a cycle of at most 256 (a permutation of the bytes). Over one turn of the cycle
    /// the map is affine in `u`, `u -> A u + B` modulo 2^64, and `m` turns are that map's `m`-th
    /// power, by squaring.
    pub fn ones(&mut self, n: u64) {
        const Q: u64 = PRIME_POWERS[8];
        let step = |u: u64| u.wrapping_mul(Q) ^ 0xfe;
        let mut u = self.0 ^ 1;
        // The cycle of the low byte from here, and the affine map of one turn (`u -> a u + b`).
        let mut turn = 1u64;
        let mut v = step(u);
        let mut a = Q;
        while (v & 0xff) != (u & 0xff) {
            v = step(v);
            a = a.wrapping_mul(Q);
            turn += 1;
        }
        if n >= turn {
            let b = v.wrapping_sub(a.wrapping_mul(u));
            // (a, b)^m: compose u -> a u + b with itself m times, by squaring.
            let (mut pa, mut pb) = (a, b);
            let (mut ra, mut rb) = (1u64, 0u64);
            let mut m = n / turn;
            while m > 0 {
                if m & 1 == 1 {
                    (ra, rb) = (pa.wrapping_mul(ra), pa.wrapping_mul(rb).wrapping_add(pb));
                }
                (pa, pb) = (pa.wrapping_mul(pa), pa.wrapping_mul(pb).wrapping_add(pb));
                m >>= 1;
            }
            u = ra.wrapping_mul(u).wrapping_add(rb);
        }
        for _ in 0..n % turn {
            u = step(u);
        }
        self.0 = u ^ 1;
    }

    /// The hash so far.
    #[must_use]
    pub fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ones(n)` is `n` fields of 1, from any state, for counts below, at and past the cycle of
    /// the low byte, and a large one.
    #[test]
    fn ones_are_that_many_fields_of_one() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..40 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut walked = Fnv1a(x);
            for n in 0..1200u64 {
                let mut folded = Fnv1a(x);
                folded.ones(n);
                assert_eq!(folded, walked, "{n} ones from {x:#x}");
                walked.u64(1);
            }
        }
        let (mut walked, mut folded) = (Fnv1a::new(), Fnv1a::new());
        for _ in 0..3_000_017 {
            walked.u64(1);
        }
        folded.ones(3_000_017);
        assert_eq!(folded, walked);
    }

    #[test]
    fn matches_the_published_fnv1a_vectors() {
        // From the FNV reference test suite (64-bit FNV-1a).
        assert_eq!(Fnv1a::of(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(Fnv1a::of(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(Fnv1a::of(b"foobar"), 0x8594_4171_f739_67e8);
    }

    /// `u64`'s folded multiplies give exactly the field of its eight bytes, for values of every
    /// width.
    #[test]
    fn a_u64_is_the_field_of_its_bytes() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut values = vec![0, 1, 0xff, 0x100, 0x1_0000, u64::MAX, 1 << 63, 0x0100_0000_0000_0001];
        for shift in 0..64 {
            // A few values of each width, some with zero bytes inside.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.extend([x >> shift, (x >> shift) & 0xff00_ff00_00ff_00ff, 1u64 << shift]);
        }
        for v in values {
            let mut a = Fnv1a::new();
            a.field(b"state");
            let mut b = a;
            a.u64(v);
            b.field(&v.to_le_bytes());
            assert_eq!(a, b, "{v:#x}");
        }
    }

    #[test]
    fn fields_are_separated() {
        let mut a = Fnv1a::new();
        a.field(b"ab");
        a.field(b"c");
        let mut b = Fnv1a::new();
        b.field(b"a");
        b.field(b"bc");
        assert_ne!(a.finish(), b.finish());
    }
}

/// A hasher for small integer keys (chunk indices): one multiply, no per-lookup `SipHash` rounds.
/// Keys come from the index, never from a client, so flooding is not a concern.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (u64::from(v) ^ self.0).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_usize(&mut self, v: usize) {
        self.0 = (v as u64 ^ self.0).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A `HashMap` keyed by chunk index (a [`crate::minibatch::ChunkSource`] like every such map).
pub type ChunkMap<V> = std::collections::HashMap<u32, V, std::hash::BuildHasherDefault<IdHasher>>;

/// A set of chunk indices, hashed as [`ChunkMap`]'s keys.
pub type ChunkSet = std::collections::HashSet<u32, std::hash::BuildHasherDefault<IdHasher>>;
