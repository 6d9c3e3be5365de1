//! xorshift64*: the tiny seeded generator of every bench's data, so the data is identical on
//! every run. Included by `criteo_gen.rs` (and through it `src/bin/parse_rate.rs`) and by
//! `benches/common`.

/// xorshift64*: a tiny seeded generator so the data is identical on every run.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A uniform number in [0, 1), from the top 53 bits.
    #[allow(clippy::cast_precision_loss)] // 53 bits: exact in an f64
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}
