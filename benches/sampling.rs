//! Sampling overhead: the cost of scheduling one sample (randomizing a sweep and walking it in
//! minibatches), to set beside the cost of parsing it (benches/ctf.rs). Timelines are generated
//! with a seeded generator: 1M one-sample sequences in 500 chunks, and 200k variable-length
//! sequences (1..20 samples).

#![allow(missing_docs)] // criterion_group! and criterion_main! generate undocumented items.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use minibatchd_engine::sampling::{EpochLimit, Sampler, SamplingOptions, Tail, Timeline, Window};

fn timeline(seqs: usize, chunks: usize, variable: bool) -> Timeline {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let seq_len: Vec<u32> = (0..seqs)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if variable {
                1 + (x % 20) as u32
            } else {
                1
            }
        })
        .collect();
    let per = seqs / chunks;
    let mut chunk_start: Vec<usize> = (0..chunks).map(|c| c * per).collect();
    chunk_start.push(seqs);
    Timeline { seq_len: seq_len.into(), chunk_start }
}

fn sweep(t: &Arc<Timeline>, randomize: bool, window: Window, mb: usize, fingerprint: bool) -> u64 {
    let opts = SamplingOptions { randomize, window, seed: 1, limit: EpochLimit::FullSweep, num_workers: 1, rank: 0 };
    let mut s = Sampler::new(t.clone(), opts).expect("sampler");
    let mut n = 0u64;
    while let Some(p) = s.next_minibatch(mb) {
        n += p.sequences.len() as u64;
        if fingerprint {
            // The data-order ledger's cost: the daemon computes this once per minibatch.
            n ^= criterion::black_box(p.fingerprint()) & 1;
        }
    }
    n
}

/// A sweep walked as the daemon's producer walks it: a prefetch hint of 8 chunks before every
/// minibatch.
fn sweep_with_hints(t: &Arc<Timeline>, window: Window, mb: usize) -> u64 {
    let opts =
        SamplingOptions { randomize: true, window, seed: 1, limit: EpochLimit::FullSweep, num_workers: 1, rank: 0 };
    let mut s = Sampler::new(t.clone(), opts).expect("sampler");
    let mut n = 0u64;
    loop {
        n += criterion::black_box(s.upcoming_chunks_built(8)).len() as u64;
        match s.next_minibatch(mb) {
            Some(p) => n += p.sequences.len() as u64,
            None => return n,
        }
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("sampling");
    g.sample_size(10);
    for (name, t) in [
        ("1M_frames_500_chunks", timeline(1_000_000, 500, false)),
        ("200k_sequences_100_chunks", timeline(200_000, 100, true)),
    ] {
        let t = Arc::new(t);
        let samples: u64 = t.samples(..);
        g.throughput(Throughput::Elements(samples));
        for (label, randomize, window) in [
            ("sequential", false, Window::Chunks(1)),
            ("window_128_chunks", true, Window::Chunks(128)),
            ("window_4_chunks", true, Window::Chunks(4)),
            // CNTK's default: one window over the whole sweep (every draw anywhere in it).
            ("whole_sweep_window", true, Window::Chunks(1 << 20)),
        ] {
            g.bench_with_input(BenchmarkId::new(label, name), &t, |b, t| {
                b.iter(|| sweep(t, randomize, window, 256, false));
            });
        }
        g.bench_with_input(BenchmarkId::new("sequential_with_fingerprint", name), &t, |b, t| {
            b.iter(|| sweep(t, false, Window::Chunks(1), 256, true));
        });
    }
    // The shape of `scripts/bench/bench_beyond_limit.py`: 433,659 one-sample sequences in 16
    // chunks, a window of 4 (about 108 k positions, past a core's L2): every draw of the swap loop
    // reads a random position of the window and is rejected when its sequence may not move.
    let t = Arc::new(timeline(433_659, 16, false));
    g.throughput(Throughput::Elements(433_659));
    g.bench_with_input(BenchmarkId::new("window_4_chunks", "434k_frames_16_chunks"), &t, |b, t| {
        b.iter(|| sweep(t, true, Window::Chunks(4), 256, true));
    });
    // Equal steps for 8 data-parallel workers, as each rank's `open` computes them (the counts
    // and this worker's cut), over 2 sweeps of 1M one-sample sequences, window of 4 chunks.
    let t = Arc::new(timeline(1_000_000, 500, false));
    g.throughput(Throughput::Elements(2_000_000));
    for rank in [0, 5] {
        g.bench_with_input(
            BenchmarkId::new(format!("equal_steps_8_workers_rank_{rank}"), "1M_frames_500_chunks"),
            &t,
            |b, t| {
                b.iter(|| {
                    let opts = SamplingOptions {
                        randomize: true,
                        window: Window::Chunks(4),
                        seed: 1,
                        limit: EpochLimit::Sweeps(2),
                        num_workers: 8,
                        rank,
                    };
                    let mut s = Sampler::new(t.clone(), opts).expect("sampler");
                    s.equalize_steps(256, Tail::Drop).expect("equal steps").steps
                });
            },
        );
    }
    // Many small chunks: the hint must not cost every chunk used so far.
    let t = Arc::new(timeline(1_000_000, 20_000, false));
    g.throughput(Throughput::Elements(1_000_000));
    g.bench_with_input(BenchmarkId::new("window_4_chunks_with_hints", "1M_frames_20k_chunks"), &t, |b, t| {
        b.iter(|| sweep_with_hints(t, Window::Chunks(4), 256));
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
