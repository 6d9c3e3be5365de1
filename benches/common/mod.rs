//! Seeded data shared by the benches, so every bench of the same shape reads the same bytes.

#[path = "../support/criteo_gen.rs"]
pub mod criteo_gen;
pub use criteo_gen::Rng;

/// About `bytes` of CTF rows: 128 floats `-0.dddddd`…`0.dddddd` and a sparse one-hot label of
/// dim 10 (the shape of `scripts/bench/bench_daemon.py`'s file), in line mode.
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
