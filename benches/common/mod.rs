//! Seeded data shared by the benches, so every bench of the same shape reads the same bytes.

/// xorshift64*: a tiny seeded generator so the data is identical on every run.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// About `bytes` of CTF rows: 128 floats `-0.dddddd`…`0.dddddd` and a sparse one-hot label of
/// dim 10 (the shape of `scripts/bench_daemon.py`'s file), in line mode.
pub fn dense_rows(bytes: usize) -> String {
    use std::fmt::Write as _;
    let mut r = Rng(7);
    let mut s = String::with_capacity(bytes + 2048);
    while s.len() < bytes {
        s.push_str("|features");
        for _ in 0..128 {
            let _ = write!(s, " {:.6}", r.unit() * 2.0 - 1.0);
        }
        let _ = writeln!(s, " |labels {}:1", r.next() % 10);
    }
    s
}
