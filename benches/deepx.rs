//! Decode throughput of the deepx `libsvm` format on seeded Criteo-like lines (a label and 39
//! features: 13 numeric `id:value` with ids 1..=13, 26 hashed categorical `id:1`), in bytes/s,
//! single-threaded; plus the line index pass, and the decode of lines of 10 signed numeric features
//! of six decimals (`numeric10`: the shape of `minibatchd-gen libsvm F BYTES 10`, half of the values
//! negative). The Criteo-like generator feeds
//! `scripts/bench/bench_libsvm.sh` (through `src/bin/parse_rate.rs`, binary `minibatchd-parse-rate`).
//!
//! `cargo bench --bench deepx`; figures and the machine are recorded in docs/benchmarks.md.

#![allow(missing_docs)] // criterion_group! and criterion_main! generate undocumented items.

use std::path::Path;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use minibatchd::config::{DeepxOptions, FormatKind};
use minibatchd_engine::format::deepx::{index_reader, DeepxDecoder, LineContext, LineIndexOptions, Schema};
use minibatchd_engine::format::FileIndex;

#[path = "support/criteo_gen.rs"]
mod criteo_gen;

/// The line index of `text`.
fn index(text: &[u8]) -> FileIndex {
    index_reader(
        text,
        Arc::from(Path::new("criteo")),
        text.len() as u64,
        LineIndexOptions { comments: false },
        minibatchd_engine::options::IndexLimits::UNBOUNDED,
        &mut |_| {},
    )
    .expect("index")
}

/// Decodes every line of `text` into one set of buffers (a chunk of the whole text).
fn decode_all<T: minibatchd_engine::format::deepx::DeepxElement>(
    dec: &DeepxDecoder,
    text: &[u8],
    idx: &FileIndex,
) -> usize {
    let mut bufs = dec.buffers_for::<T>(text.len(), idx.sequences.len(), true);
    let mut errors = Vec::new();
    for seq in &idx.sequences {
        let start = usize::try_from(seq.offset).expect("the text is in memory");
        let end = usize::try_from(seq.offset + u64::from(seq.size)).expect("the text is in memory");
        let b = &text[start..end];
        dec.decode_line(
            b,
            &LineContext { file: &idx.path, line: seq.line, offset: seq.offset },
            &mut bufs,
            &mut errors,
        );
    }
    assert!(errors.is_empty(), "{:?}", errors.first());
    bufs.x[0].len()
}

/// `bytes` of lines of 10 numeric features `k:±0.dddddd` (ids 1..=10), a label `0` or `1`: about
/// half of the values negative, in an order a branch predictor cannot learn.
fn numeric10(bytes: usize) -> Vec<u8> {
    use std::io::Write as _;
    let mut rng = criteo_gen::Rng(0x2545_f491_4f6c_dd1d);
    let mut text = Vec::with_capacity(bytes + 128);
    while text.len() < bytes {
        write!(text, "{}", rng.next() % 2).expect("a write to a Vec");
        for k in 1..=10 {
            let r = rng.next();
            let sign = if r & 1 == 1 { "-" } else { "" };
            write!(text, " {k}:{sign}0.{:06}", (r >> 1) % 1_000_000).expect("a write to a Vec");
        }
        text.push(b'\n');
    }
    text
}

/// The benchmark group.
fn bench(c: &mut Criterion) {
    let text = criteo_gen::generate(32 << 20, 42);
    let idx = index(&text);
    let dec = DeepxDecoder::new(Schema::new(FormatKind::Libsvm, &DeepxOptions::default()));
    let mut g = c.benchmark_group("deepx");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_with_input(BenchmarkId::new("index", "criteo_libsvm"), &text, |b, t| b.iter(|| index(t).sequences.len()));
    g.bench_with_input(BenchmarkId::new("decode_f32", "criteo_libsvm"), &text, |b, t| {
        b.iter(|| decode_all::<f32>(&dec, t, &idx));
    });
    g.bench_with_input(BenchmarkId::new("decode_f64", "criteo_libsvm"), &text, |b, t| {
        b.iter(|| decode_all::<f64>(&dec, t, &idx));
    });
    // The same decode with the general readers only (no plain-feature window): the fast path's
    // gain, measured in the same run.
    let general = dec.clone().general_only();
    g.bench_with_input(BenchmarkId::new("decode_f32_general_readers", "criteo_libsvm"), &text, |b, t| {
        b.iter(|| decode_all::<f32>(&general, t, &idx));
    });
    let text = numeric10(32 << 20);
    let idx = index(&text);
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_with_input(BenchmarkId::new("decode_f32", "numeric10"), &text, |b, t| {
        b.iter(|| decode_all::<f32>(&dec, t, &idx));
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
