//! Index and decode throughput of the CTF engine on seeded generated data, in bytes/s per core
//! (single-threaded). Three shapes: dense rows of 128 floats with a sparse one-hot label
//! (line mode), sparse one-hot rows only, and variable-length id-mode sequences.
//!
//! `cargo bench --bench ctf`; figures and the machine are recorded in docs/benchmarks.md.

#![allow(missing_docs)] // criterion_group! and criterion_main! generate undocumented items.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use minibatchd::config::{StreamConfig, StreamFormat};
use minibatchd_engine::format::ctf::{index_file, CtfDecoder, CtfIndexOptions, SeqContext, StreamBuf};
use minibatchd_engine::format::FileIndex;

mod common;
use common::{dense_rows, Rng};

fn sparse_rows(bytes: usize) -> String {
    let mut r = Rng(11);
    let mut s = String::with_capacity(bytes + 64);
    while s.len() < bytes {
        writeln!(s, "|labels {}:1", r.next() % 1000).expect("writing to a String");
    }
    s
}

fn sequences(bytes: usize) -> String {
    let mut r = Rng(13);
    let mut s = String::with_capacity(bytes + 4096);
    let mut id = 0u64;
    while s.len() < bytes {
        let len = 1 + r.next() % 20;
        for i in 0..len {
            write!(s, "{id} |features").expect("writing to a String");
            for _ in 0..16 {
                write!(s, " {:.4}", r.unit()).expect("writing to a String");
            }
            if i == 0 {
                write!(s, " |labels {}:1", r.next() % 10).expect("writing to a String");
            }
            s.push('\n');
        }
        id += 1;
    }
    s
}

fn streams(dense_dim: usize, with_dense: bool) -> Vec<StreamConfig> {
    let mut v = Vec::new();
    if with_dense {
        v.push(StreamConfig {
            name: "features".into(),
            alias: "features".into(),
            dim: dense_dim,
            format: StreamFormat::Dense,
            defines_mb_size: false,
        });
    }
    v.push(StreamConfig {
        name: "labels".into(),
        alias: "labels".into(),
        dim: 1000,
        format: StreamFormat::Sparse,
        defines_mb_size: false,
    });
    v
}

fn index(dir: &Path, name: &str, text: &str) -> FileIndex {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    index_file(
        &p,
        &CtfIndexOptions { skip_sequence_ids: false, main_alias: None },
        minibatchd_engine::options::IndexLimits::UNBOUNDED,
        1,
        &mut |_| {},
    )
    .expect("index")
}

fn decode_all(dec: &CtfDecoder, text: &[u8], idx: &FileIndex, n: usize) -> usize {
    let mut bufs: Vec<StreamBuf<f32>> = (0..n).map(|_| StreamBuf::new()).collect();
    let mut errors = Vec::new();
    let file: Arc<Path> = idx.path.clone();
    for seq in idx.sequences.iter() {
        let seq = &seq;
        let start = usize::try_from(seq.offset).expect("the text is in memory");
        let end = usize::try_from(seq.offset + u64::from(seq.size)).expect("the text is in memory");
        let b = &text[start..end];
        dec.decode_sequence(b, &SeqContext { file: &file, seq }, &mut bufs, &mut errors).expect("decode");
    }
    assert!(errors.is_empty());
    bufs[0].values.len()
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let size = 32 << 20;
    let cases = [
        ("dense128_plus_label", dense_rows(size), streams(128, true), 2),
        ("sparse_one_hot", sparse_rows(size / 4), streams(0, false), 1),
        ("variable_sequences", sequences(size), streams(16, true), 2),
    ];
    let mut g = c.benchmark_group("ctf");
    g.sample_size(10);
    for (name, text, cfg, n) in &cases {
        let idx = index(dir.path(), name, text);
        g.throughput(Throughput::Bytes(text.len() as u64));
        g.bench_with_input(BenchmarkId::new("index", name), text, |b, _| {
            b.iter(|| index(dir.path(), name, text).sequences.len());
        });
        let dec = CtfDecoder::new(cfg);
        g.bench_with_input(BenchmarkId::new("decode", name), text, |b, t| {
            b.iter(|| decode_all(&dec, t.as_bytes(), &idx, *n));
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
