//! `minibatchd-gen`: writes seeded synthetic training data for benchmarks and soak tests.
//!
//! ```text
//! minibatchd-gen ctf-dense  OUT SIZE_BYTES [DIM=128] [CLASSES=10]   |features <DIM floats> |labels <k>:1
//! minibatchd-gen ctf-seq    OUT SIZE_BYTES                           id-mode sequences of 1..20 lines
//! minibatchd-gen libsvm     OUT SIZE_BYTES [FEATURES=39]             <label> <id>:<value> ... (Criteo-like)
//! ```
//! The same arguments always produce the same bytes.

#![forbid(unsafe_code)]

use std::io::{BufWriter, Write};
use std::process::ExitCode;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A value in (-1, 1) with 6 decimals, formatted without allocation.
    fn value(&mut self, out: &mut Vec<u8>) {
        let v = self.next() % 2_000_000;
        if v < 1_000_000 {
            out.push(b'-');
        }
        let frac = v % 1_000_000;
        out.extend_from_slice(b"0.");
        let digits = [frac / 100_000, frac / 10_000 % 10, frac / 1000 % 10, frac / 100 % 10, frac / 10 % 10, frac % 10];
        out.extend(digits.iter().map(|&d| b'0' + u8::try_from(d % 10).unwrap_or(0)));
    }
}

fn arg(args: &[String], i: usize, default: u64) -> Result<u64, String> {
    args.get(i).map_or(Ok(default), |s| s.parse().map_err(|_| format!("not a number: {s}")))
}

fn run(args: &[String]) -> Result<(), String> {
    let (kind, out, size) = match args {
        [k, o, s, ..] => (k.as_str(), o, s.parse::<u64>().map_err(|_| format!("not a size: {s}"))?),
        _ => return Err("usage: minibatchd-gen ctf-dense|ctf-seq|libsvm OUT SIZE_BYTES [..]".into()),
    };
    let file = std::fs::File::create(out).map_err(|e| format!("{out}: {e}"))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let mut line = Vec::with_capacity(4096);
    let mut written = 0u64;
    let mut id = 0u64;
    while written < size {
        line.clear();
        match kind {
            "ctf-dense" => {
                let (dim, classes) = (arg(args, 3, 128)?, arg(args, 4, 10)?.max(1));
                line.extend_from_slice(b"|features");
                for _ in 0..dim {
                    line.push(b' ');
                    r.value(&mut line);
                }
                line.extend_from_slice(format!(" |labels {}:1\n", r.next() % classes).as_bytes());
            }
            "ctf-seq" => {
                let len = 1 + r.next() % 20;
                for i in 0..len {
                    line.extend_from_slice(format!("{id} |features").as_bytes());
                    for _ in 0..16 {
                        line.push(b' ');
                        r.value(&mut line);
                    }
                    if i == 0 {
                        line.extend_from_slice(format!(" |labels {}:1", r.next() % 10).as_bytes());
                    }
                    line.push(b'\n');
                }
                id += 1;
            }
            "libsvm" => {
                let features = arg(args, 3, 39)?;
                line.extend_from_slice(if r.next().is_multiple_of(4) { b"1" } else { b"0" });
                for f in 0..features {
                    // Criteo-like: 13 numeric features with small ids, 26 hashed categoricals.
                    let id = if f < 13 { f + 1 } else { r.next() % 1_000_000_007 };
                    line.extend_from_slice(format!(" {id}:").as_bytes());
                    if f < 13 {
                        r.value(&mut line);
                    } else {
                        line.push(b'1');
                    }
                }
                line.push(b'\n');
            }
            other => return Err(format!("unknown kind {other}")),
        }
        w.write_all(&line).map_err(|e| e.to_string())?;
        written += line.len() as u64;
    }
    w.flush().map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("minibatchd-gen: {e}");
            ExitCode::from(2)
        }
    }
}
