//! The daemon producer's own cost per minibatch, without the daemon: the sampler's plan, the
//! gather of the plan's samples out of parsed chunks (`assemble`) and the slot write, for
//! minibatches of 256 rows of 128 floats + a sparse label, randomized over a window that covers
//! every chunk (CNTK's default on a file smaller than 4 GiB) — the access pattern of
//! `scripts/bench/bench_daemon.py`'s drain phase, at 1/8 of its size.
//!
//! The same for minibatches of 1,024 Criteo-like libsvm lines (a label and 39 sparse features).
//!
//! `cargo bench --bench delivery`; `BENCH_MB=1024` for the full size of the daemon benchmark
//! (1 GiB of text: more cache and TLB misses per sample than at 128 MiB); `BENCH_ONLY=ctf` or
//! `BENCH_ONLY=libsvm` for one of the two. Figures and the
//! machine are recorded in docs/benchmarks.md.

#![allow(missing_docs)] // criterion_group! and criterion_main! generate undocumented items.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use minibatchd::Config;
use minibatchd_engine::format::chunk::ParsedChunk;
use minibatchd_engine::minibatch::{gather, ChunkMap, StreamShape};
use minibatchd_engine::sampling::{EpochLimit, Sampler, SamplingOptions, Window};
use minibatchd_engine::Dataset;
use minibatchd_shm::{Ring, RingGeometry};
use minibatchd_sys::LocalMemory;

mod common;

const MINIBATCH: usize = 256;
const LIBSVM_MINIBATCH: usize = 1024;
const SLOTS: u64 = 16;

fn write_data(path: &std::path::Path, bytes: usize) {
    std::fs::write(path, common::dense_rows(bytes)).expect("write the bench data");
}

/// A dataset, all its chunks parsed, a randomizing sampler over a window of every chunk and a ring
/// of slots: what the producer works on.
struct Producer {
    dataset: Dataset,
    chunks: ChunkMap<Arc<ParsedChunk>>,
    sampler: Sampler,
    ring: Ring<LocalMemory>,
    names: Vec<String>,
    shapes: Vec<StreamShape>,
    index: u64,
}

impl Producer {
    fn new(dir: &std::path::Path, format: &str, data: &std::path::Path, streams: &str) -> Self {
        let toml = format!(
            "[daemon]\nstate_dir = \"{0}/state\"\n\n[datasets.b]\nformat = \"{format}\"\nfiles = [\"{1}\"]\n\
             cache_index = false\n{streams}",
            dir.display(),
            data.display()
        );
        let config = Config::from_toml_str(&toml, dir).expect("config");
        let dataset =
            Dataset::open(config.dataset("b").expect("dataset"), &dir.join("state"), &mut |_| {}).expect("open");
        let chunks = (0..dataset.chunks().len())
            .map(|i| (u32::try_from(i).expect("chunk ids are u32"), Arc::new(dataset.load_chunk(i).expect("chunk").0)))
            .collect();
        let names = dataset.streams().iter().map(|s| s.name.clone()).collect();
        let shapes = dataset.stream_shapes();
        let options = SamplingOptions {
            randomize: true,
            window: Window::Chunks(128),
            seed: 0,
            limit: EpochLimit::Infinite,
            num_workers: 1,
            rank: 0,
        };
        let sampler = Sampler::new(dataset.timeline().clone(), options).expect("sampler");
        let geometry = RingGeometry::new(SLOTS, 4 << 20);
        let memory = LocalMemory::new(usize::try_from(geometry.total_bytes()).expect("the ring fits in memory"));
        let ring = Ring::new(memory, geometry, 1, 1).expect("ring");
        Self { dataset, chunks, sampler, ring, names, shapes, index: 0 }
    }

    /// Plans, gathers and writes the next minibatch of `size` samples.
    fn next(&mut self, size: usize) {
        let plan = self.sampler.next_minibatch(size).expect("infinite epoch");
        let mb =
            gather(self.index, &plan, self.dataset.timeline(), &self.shapes, false, &mut self.chunks).expect("gather");
        self.ring.write(self.index % SLOTS, self.index + 1, &mb, &self.names).expect("slot write");
        self.index += 1;
    }
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let bytes = std::env::var("BENCH_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(128usize) << 20;
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let mut g = c.benchmark_group("delivery");
    if only.is_empty() || only == "ctf" {
        let data = dir.path().join("bench.ctf");
        write_data(&data, bytes);
        let mut producer = Producer::new(
            dir.path(),
            "ctf",
            &data,
            "\n[datasets.b.streams.features]\ndim = 128\nformat = \"dense\"\n\n\
             [datasets.b.streams.labels]\ndim = 10\nformat = \"sparse\"\n",
        );
        g.throughput(Throughput::Elements(MINIBATCH as u64));
        g.bench_function("plan+assemble+slot_write/256x(128f+sparse)", |b| b.iter(|| producer.next(MINIBATCH)));
    }
    if only.is_empty() || only == "libsvm" {
        // The shape of scripts/bench/bench_libsvm_user.py --randomize: Criteo-like lines (a label,
        // 13 numeric and 26 categorical features), minibatches of 1,024.
        let data = dir.path().join("bench.svm");
        std::fs::write(&data, common::criteo_gen::generate(bytes, 42)).expect("write the bench data");
        let mut producer = Producer::new(dir.path(), "libsvm", &data, "");
        g.throughput(Throughput::Elements(LIBSVM_MINIBATCH as u64));
        g.bench_function("plan+assemble+slot_write/1024x(criteo libsvm)", |b| {
            b.iter(|| producer.next(LIBSVM_MINIBATCH));
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
