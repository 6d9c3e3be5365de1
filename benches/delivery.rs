//! The daemon producer's own cost per minibatch, without the daemon: the sampler's plan, the
//! gather of the plan's samples out of parsed chunks (`assemble`) and the slot write, for
//! minibatches of 256 rows of 128 floats + a sparse label, randomized over a window that covers
//! every chunk (CNTK's default on a file smaller than 4 GiB) — the access pattern of
//! `scripts/bench/bench_daemon.py`'s drain phase, at 1/8 of its size.
//!
//! `cargo bench --bench delivery`; `BENCH_MB=1024` for the full size of the daemon benchmark
//! (1 GiB of text: more cache and TLB misses per sample than at 128 MiB). Figures and the
//! machine are recorded in docs/benchmarks.md.

#![allow(missing_docs)] // criterion_group! and criterion_main! generate undocumented items.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use minibatchd::Config;
use minibatchd_engine::format::chunk::ParsedChunk;
use minibatchd_engine::minibatch::{gather, ChunkMap};
use minibatchd_engine::sampling::{EpochLimit, Sampler, SamplingOptions, Window};
use minibatchd_engine::Dataset;
use minibatchd_shm::{Ring, RingGeometry};
use minibatchd_sys::LocalMemory;

mod common;

const MINIBATCH: usize = 256;
const SLOTS: u64 = 16;

fn write_data(path: &std::path::Path, bytes: usize) {
    std::fs::write(path, common::dense_rows(bytes)).expect("write the bench data");
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("bench.ctf");
    write_data(&data, std::env::var("BENCH_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(128usize) << 20);
    let toml = format!(
        "[daemon]\nstate_dir = \"{0}/state\"\n\n[datasets.b]\nformat = \"ctf\"\nfiles = [\"{1}\"]\ncache_index = false\n\n\
         [datasets.b.streams.features]\ndim = 128\nformat = \"dense\"\n\n[datasets.b.streams.labels]\ndim = 10\nformat = \"sparse\"\n",
        dir.path().display(),
        data.display()
    );
    let config = Config::from_toml_str(&toml, dir.path()).expect("config");
    let dataset =
        Dataset::open(config.dataset("b").expect("dataset"), &dir.path().join("state"), &mut |_| {}).expect("open");
    let chunks: ChunkMap<Arc<ParsedChunk>> = (0..dataset.chunks().len())
        .map(|i| (u32::try_from(i).expect("chunk ids are u32"), Arc::new(dataset.load_chunk(i).expect("chunk").0)))
        .collect();
    let names: Vec<String> = dataset.streams().iter().map(|s| s.name.clone()).collect();
    let shapes = dataset.stream_shapes();
    let options = SamplingOptions {
        randomize: true,
        window: Window::Chunks(128),
        seed: 0,
        limit: EpochLimit::Infinite,
        num_workers: 1,
        rank: 0,
    };
    let mut sampler = Sampler::new(dataset.timeline().clone(), options).expect("sampler");
    let mut ring = Ring::new(
        LocalMemory::new(
            usize::try_from(RingGeometry::new(SLOTS, 4 << 20).total_bytes()).expect("the ring fits in memory"),
        ),
        RingGeometry::new(SLOTS, 4 << 20),
        1,
        1,
    )
    .expect("ring");

    let mut g = c.benchmark_group("delivery");
    g.throughput(Throughput::Elements(MINIBATCH as u64));
    let mut index = 0u64;
    let mut sources = chunks;
    g.bench_function("plan+assemble+slot_write/256x(128f+sparse)", |b| {
        b.iter(|| {
            let plan = sampler.next_minibatch(MINIBATCH).expect("infinite epoch");
            let mb = gather(index, &plan, dataset.timeline(), &shapes, false, &mut sources).expect("gather");
            ring.write(index % SLOTS, index + 1, &mb, &names).expect("slot write");
            index += 1;
        });
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
