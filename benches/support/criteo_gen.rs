//! Seeded generator of Criteo-like libsvm lines, shared by `benches/deepx.rs` and
//! `src/bin/parse_rate.rs`: a 0/1 label, 13 numeric features `i:v` (ids 1..=13, values
//! with 6 decimals in [0, 1)), and 26 categorical features `id:1` with ids hashed into
//! [14, 2^24), as the LIBSVM site's `criteo` file.

#![allow(dead_code)]

#[path = "rng.rs"]
mod rng;
pub use rng::Rng;

/// Appends one line to `out`.
pub fn line(r: &mut Rng, out: &mut Vec<u8>) {
    use std::io::Write;
    let _ = write!(out, "{}", r.next() % 2);
    for i in 1..=13u64 {
        let v = r.next() % 1_000_000;
        let _ = write!(out, " {i}:0.{v:06}");
    }
    for _ in 0..26 {
        let id = 14 + r.next() % ((1 << 24) - 14);
        let _ = write!(out, " {id}:1");
    }
    out.push(b'\n');
}

/// About `bytes` bytes of whole lines.
pub fn generate(bytes: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed | 1);
    let mut out = Vec::with_capacity(bytes + 1024);
    while out.len() < bytes {
        line(&mut r, &mut out);
    }
    out
}
