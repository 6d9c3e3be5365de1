//! Parse rate of minibatchd on a libsvm or CTF file, with N parser threads, as the daemon's parser
//! pool does it: the dataset is opened (index pass, cached in a state directory), then every chunk
//! is loaded (`Dataset::load_chunk`: read + decode into columnar buffers) by N threads taking
//! chunks in turn. Used by `scripts/bench/bench_libsvm.sh`; `ctf` reads the file of
//! `scripts/bench/bench_daemon.py` (128 dense floats `features` + a sparse `labels` of dim 10);
//! `tfrecord` the `tf.train.Example` records of `scripts/bench/bench_tfrecord.py` (64 floats `x`
//! and an int64 `y`).
//!
//! ```text
//! minibatchd-parse-rate generate PATH BYTES        # seeded Criteo-like lines (benches/support/criteo_gen.rs)
//! minibatchd-parse-rate parse PATH [THREADS] [CHUNK_BYTES] [STATE_DIR] [persisted|one-pass]
//! minibatchd-parse-rate ctf PATH [THREADS] [CHUNK_BYTES] [STATE_DIR] [persisted|one-pass]
//! minibatchd-parse-rate tfrecord PATH [THREADS] [CHUNK_BYTES] [STATE_DIR] [persisted|one-pass]
//! ```
//!
//! With `persisted`, chunks go through the parsed cache in `STATE_DIR/parsed`:
//! the first such run parses and writes each chunk, the next ones read every chunk from it.
//! With `one-pass` (and a `STATE_DIR` without the file's index cache), the index pass parses
//! the chunks as it counts them, as the daemon's cold start does: "parse" is then the time to take
//! the chunks it kept.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use minibatchd::config::Config;
use minibatchd_engine::dataset::{Dataset, Persist};
use minibatchd_engine::format::parsed_cache::{ParsedCache, PARSED_DIR};
use minibatchd_engine::format::StreamValues;

#[path = "../../../../benches/support/criteo_gen.rs"]
mod criteo_gen;

fn generate(path: &Path, bytes: u64) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut r = criteo_gen::Rng(42);
    let mut line = Vec::with_capacity(1024);
    let mut written = 0u64;
    while written < bytes {
        line.clear();
        criteo_gen::line(&mut r, &mut line);
        out.write_all(&line)?;
        written += line.len() as u64;
    }
    out.flush()
}

/// The dataset's format and, for CTF, its streams.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Libsvm,
    Ctf,
    TfRecord,
}

fn parse(
    kind: Kind,
    path: &Path,
    threads: usize,
    chunk_bytes: u64,
    state: &Path,
    (persisted, one_pass): (bool, bool),
) -> Result<(), String> {
    let path = &std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let size = std::fs::metadata(path).map_err(|e| e.to_string())?.len();
    let (format, streams) = match kind {
        Kind::Libsvm => ("libsvm", ""),
        Kind::Ctf => (
            "ctf",
            "[datasets.d.streams.features]\ndim = 128\nformat = \"dense\"\n[datasets.d.streams.labels]\ndim = 10\nformat = \"sparse\"\n",
        ),
        Kind::TfRecord => (
            "tfrecord",
            "[datasets.d.streams.x]\ndim = 64\nformat = \"dense\"\n[datasets.d.streams.y]\ndim = 1\nformat = \"dense\"\ndtype = \"int64\"\n",
        ),
    };
    let text = format!(
        "[datasets.d]\nformat = \"{format}\"\nfiles = [{:?}]\nchunk_size_bytes = {chunk_bytes}\n{streams}",
        path.display().to_string()
    );
    let config = Config::from_toml_str(&text, state).map_err(|e| e.to_string())?;
    // The parsed cache under STATE_DIR: the first run writes it as it parses, a
    // later run reads every chunk from it.
    let cache = if persisted {
        Some(ParsedCache::open(&state.join(PARSED_DIR), u64::MAX).map_err(|e| e.to_string())?)
    } else {
        None
    };
    let t0 = Instant::now();
    let limits = minibatchd_engine::options::IndexLimits {
        parse_ahead_bytes: if one_pass { u64::MAX } else { 0 },
        parse_ahead_huge_pages: true,
        ..minibatchd_engine::options::IndexLimits::UNBOUNDED
    };
    let mut ds = Dataset::open_within(config.dataset("d").map_err(|e| e.to_string())?, state, limits, &mut |_| {})
        .map_err(|e| e.to_string())?;
    let index_s = t0.elapsed().as_secs_f64();
    if let Some(cache) = cache {
        ds.use_parsed_cache(std::sync::Arc::new(cache), Persist::OnLoad);
    }
    let chunks = ds.chunks().len();
    let next = AtomicUsize::new(0);
    let nnz = AtomicUsize::new(0);
    // Kept until the end, as the daemon's chunk cache keeps them: every chunk's buffers are
    // fresh memory (its first touch counted), not the last one's freed pages.
    let kept = std::sync::Mutex::new(Vec::with_capacity(chunks));
    let t1 = Instant::now();
    let failed = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<(), String> {
                    loop {
                        let c = next.fetch_add(1, Ordering::Relaxed);
                        if c >= chunks {
                            return Ok(());
                        }
                        let (parsed, _) = ds.load_chunk(c).map_err(|e| e.to_string())?;
                        if let StreamValues::Sparse { values, .. } = &parsed.streams[0].data {
                            nnz.fetch_add(values.len(), Ordering::Relaxed);
                        }
                        kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(parsed);
                    }
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or_else(|_| Err("a worker panicked".into()))).find(Result::is_err)
    });
    if let Some(Err(e)) = failed {
        return Err(e);
    }
    let parse_s = t1.elapsed().as_secs_f64();
    #[allow(clippy::cast_precision_loss)] // a rate for humans
    let mb = size as f64 / 1e6;
    println!(
        "minibatchd {format}: {mb:.0} MB, {} lines, {} nonzeros, {chunks} chunks, {threads} thread(s): index {index_s:.2} s ({:.0} MB/s), parse {parse_s:.2} s ({:.0} MB/s)",
        ds.timeline().num_sequences(),
        nnz.load(Ordering::Relaxed),
        mb / index_s,
        mb / parse_s
    );
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let result = match args.get(1).map(String::as_str) {
        Some("generate") if args.len() == 4 => match args[3].parse::<u64>() {
            Ok(bytes) => generate(Path::new(&args[2]), bytes).map_err(|e| e.to_string()),
            Err(e) => Err(format!("BYTES: {e}")),
        },
        Some(cmd @ ("parse" | "ctf" | "tfrecord")) if args.len() >= 3 => {
            let kind = match cmd {
                "ctf" => Kind::Ctf,
                "tfrecord" => Kind::TfRecord,
                _ => Kind::Libsvm,
            };
            let threads = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(2);
            let chunk = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(32 << 20);
            // Never a fixed name in the shared temp dir: beside the data, which the user owns.
            let state =
                args.get(5).map_or_else(|| PathBuf::from(format!("{}.parse-rate-state", args[2])), PathBuf::from);
            let persisted = args.get(6).is_some_and(|a| a == "persisted");
            let one_pass = args.get(6).is_some_and(|a| a == "one-pass");
            parse(kind, Path::new(&args[2]), threads, chunk, &state, (persisted, one_pass))
        }
        _ => {
            Err("usage: minibatchd-parse-rate generate PATH BYTES | parse|ctf|tfrecord PATH [THREADS] [CHUNK_BYTES] [STATE_DIR] [persisted|one-pass]"
                .into())
        }
    };
    if let Err(e) = result {
        eprintln!("deepx_parse_rate: {e}");
        std::process::exit(1);
    }
}
