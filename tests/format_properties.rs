//! The order's promises, checked over every format on random datasets (issue 39, item 5). In
//! each format — CTF, libsvm, TFRecord with `tf.train.Example`, CSV, fixed-length records, whole
//! files — a dataset of `n` records whose record `i` carries the id `i`, over one to three files
//! (whole files: a file each), cut into chunks of one to eight records, read in-process through
//! the same `Feeder` loop the daemon's producers run ([`for_each_minibatch`]):
//!
//! * every record exactly once per sweep over any number of workers (a job's ranks times its
//!   `DataLoader` workers are one `num_workers` to the sampler), randomized or in file order;
//! * the order a worker gets does not depend on the minibatch sizes (two single sizes, and
//!   several cycled);
//! * a restore at the position after any minibatch continues with exactly the minibatches the
//!   uninterrupted run went on with (records, positions, fingerprints);
//! * with equal steps every worker gets as many minibatches: dropped, each worker's first ones
//!   up to the fewest any worker has; padded, all of them and then empty ones up to the most;
//! * a second run reads its chunks back from the parsed cache (no new load) and every stream of
//!   every minibatch is what the run without the cache gave;
//! * the data-order ledger, computed from the index alone, names exactly the records delivered,
//!   minibatch by minibatch, with the same positions and fingerprints — for every run above.
//!
//! The sampler's own property tests check these on synthetic timelines; here they are checked
//! through each format's reader and decoder, so that none loses, doubles or reorders a record on
//! the way to the sampler or from a chunk to a minibatch.

mod support;

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use minibatchd::dump::{for_each_minibatch, for_each_plan, DumpOptions};
use minibatchd_engine::dataset::{Dataset, Persist};
use minibatchd_engine::format::parsed_cache::ParsedCache;
use minibatchd_engine::format::tfrecord::example::write::{example, Value};
use minibatchd_engine::format::tfrecord::frame;
use minibatchd_engine::minibatch::{MbData, MbValues, Minibatch};
use minibatchd_engine::sampling::{EpochLimit, SamplingOptions, Tail, Window};
use proptest::prelude::*;
use support::{dump_options, open, write};

#[derive(Debug, Clone, Copy)]
enum Format {
    Ctf,
    Libsvm,
    TfRecord,
    Csv,
    FixedLength,
    WholeFile,
}

const FORMATS: [Format; 6] =
    [Format::Ctf, Format::Libsvm, Format::TfRecord, Format::Csv, Format::FixedLength, Format::WholeFile];

/// Record `i` of a dataset in `format`, as its file holds it.
fn record(format: Format, i: usize) -> Vec<u8> {
    let mut s = String::new();
    match format {
        Format::Ctf => writeln!(s, "{i} |x {i}"),
        Format::Libsvm => writeln!(s, "{i} {}:1", i % 7 + 1),
        Format::Csv => writeln!(s, "{i},{i}"),
        Format::WholeFile => write!(s, "{i}"),
        Format::TfRecord => return frame(&example(&[("x", Value::Floats(&[id_value(i)]))])),
        Format::FixedLength => return id_value(i).to_le_bytes().to_vec(),
    }
    .expect("a String takes any text");
    s.into_bytes()
}

/// Writes a dataset of `n` records in `format` below `dir` (record `i` carrying id `i`) over
/// `files` files in id order (whole files: one per record), its chunks about `per_chunk` records,
/// and opens it as dataset `d`. Returns it with the name of the stream that carries the ids.
fn dataset(dir: &Path, format: Format, n: usize, files: usize, per_chunk: usize) -> (Dataset, &'static str) {
    let records: Vec<Vec<u8>> = (0..n).map(|i| record(format, i)).collect();
    let total: usize = records.iter().map(Vec::len).sum();
    let chunk = (total * per_chunk / n).max(1);
    let (ext, kind, streams, stream) = match format {
        Format::Ctf => ("ctf", "ctf", "[datasets.d.streams.x]\ndim = 1\nformat = \"dense\"\n", "x"),
        Format::Libsvm => ("svm", "libsvm", "", "__instY"),
        Format::TfRecord => ("tfrecord", "tfrecord", "[datasets.d.streams.x]\nformat = \"dense\"\ndim = 1\n", "x"),
        Format::Csv => ("csv", "csv", "columns = 2\n[datasets.d.streams.x]\ncolumns = [1]\n", "x"),
        Format::FixedLength => (
            "bin",
            "fixed_length",
            "record_bytes = 4\n[datasets.d.streams.x]\ndtype = \"float32\"\noffset = 0\ndim = 1\n",
            "x",
        ),
        Format::WholeFile => ("bin", "whole_file", "", "contents"),
    };
    let names: Vec<String> = if let Format::WholeFile = format {
        std::fs::create_dir_all(dir.join("w")).expect("mkdir");
        for (i, r) in records.iter().enumerate() {
            write(&dir.join("w"), &format!("{i:05}.bin"), r);
        }
        vec!["w/*.bin".to_owned()]
    } else {
        // `files` runs of ids, none empty, in order.
        let files = files.clamp(1, n);
        (0..files)
            .map(|f| {
                let name = format!("d{f}.{ext}");
                write(dir, &name, records[f * n / files..(f + 1) * n / files].concat());
                name
            })
            .collect()
    };
    let files = names.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(", ");
    let toml = format!(
        "[daemon]\nstate_dir = \"state\"\n[datasets.d]\nformat = \"{kind}\"\nfiles = [{files}]\n\
         chunk_size_bytes = {chunk}\ncache_index = false\n{streams}"
    );
    (open(&toml, "d", dir, &dir.join("state")), stream)
}

/// Id `i` as the number the numeric formats store (exact in `f32` below 2^24).
fn id_value(i: usize) -> f32 {
    f32::from(u16::try_from(i).expect("a small dataset"))
}

/// The ids of `mb`'s samples of stream `at`, in order.
fn ids(mb: &Minibatch, at: usize) -> Vec<usize> {
    match &mb.streams[at].data {
        MbData::Dense { values: MbValues::F32(v), .. } => v.iter().map(|&x| as_id(f64::from(x))).collect(),
        MbData::Dense { values: MbValues::F64(v), .. } => v.iter().map(|&x| as_id(x)).collect(),
        MbData::Strings { offsets, bytes } => offsets
            .windows(2)
            .map(|w| {
                let s = &bytes[usize::try_from(w[0]).expect("offset")..usize::try_from(w[1]).expect("offset")];
                std::str::from_utf8(s).expect("utf-8").parse().expect("an id")
            })
            .collect(),
        MbData::Sparse { .. } => panic!("the id stream is dense or strings"),
    }
}

fn as_id(x: f64) -> usize {
    assert!(x >= 0.0 && x.fract() == 0.0, "{x} is no id");
    // An exact small integer (checked above): the cast keeps it.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let id = x as usize;
    id
}

/// A minibatch as the tests compare it: its ids, the position after it, its fingerprint.
type Seen = (Vec<usize>, u64, u64);

/// Every minibatch of the run `options` describes.
fn run(ds: &Dataset, stream: &str, options: &DumpOptions) -> Vec<Seen> {
    let at = ds.stream_names().iter().position(|s| s == stream).expect("the id stream");
    let mut out = Vec::new();
    for_each_minibatch(ds, options, &mut |mb| {
        out.push((ids(mb, at), mb.position, mb.fingerprint));
        Ok(())
    })
    .expect("the run");
    out
}

/// The ledger of the same run, from the index alone: each minibatch's sequences (global
/// file-order indices, which are the ids here), position and fingerprint.
fn ledger(ds: &Dataset, options: &DumpOptions) -> Vec<Seen> {
    let mut out = Vec::new();
    for_each_plan(ds, options, &mut |_, plan| {
        out.push((plan.sequences.iter().map(|r| r.seq as usize).collect(), plan.position, plan.fingerprint()));
        Ok(())
    })
    .expect("the ledger");
    out
}

/// Every minibatch of the run `options` describes, whole.
fn minibatches(ds: &Dataset, options: &DumpOptions) -> Vec<Minibatch> {
    let mut out = Vec::new();
    for_each_minibatch(ds, options, &mut |mb| {
        out.push(mb.clone());
        Ok(())
    })
    .expect("the run");
    out
}

/// [`run`], checked against its [`ledger`].
fn run_and_ledger(ds: &Dataset, stream: &str, options: &DumpOptions) -> Result<Vec<Seen>, TestCaseError> {
    let seen = run(ds, stream, options);
    prop_assert_eq!(&ledger(ds, options), &seen, "the ledger against the minibatches");
    Ok(seen)
}

fn flat(run: &[Seen]) -> Vec<usize> {
    run.iter().flat_map(|(ids, _, _)| ids.iter().copied()).collect()
}

/// One random case: a format's dataset and a job reading it.
#[derive(Debug, Clone)]
struct Case {
    format: Format,
    records: usize,
    files: usize,
    per_chunk: usize,
    randomize: bool,
    window: usize,
    seed: u64,
    workers: usize,
    /// Minibatch sizes: the first two are run alone, all of them cycled.
    sizes: Vec<usize>,
    rank: usize,
    restore_at: prop::sample::Index,
}

fn case() -> impl Strategy<Value = Case> {
    (
        (0..FORMATS.len(), 1usize..120, 1usize..4, 1usize..9),
        any::<bool>(),
        1usize..6,
        0u64..1000,
        1usize..6,
        prop::collection::vec(1usize..40, 2..4),
        0usize..6,
        any::<prop::sample::Index>(),
    )
        .prop_map(|((f, records, files, per_chunk), randomize, window, seed, workers, sizes, rank, restore_at)| {
            Case {
                format: FORMATS[f],
                records,
                files,
                per_chunk,
                randomize,
                window,
                seed,
                workers,
                sizes,
                rank: rank % workers,
                restore_at,
            }
        })
}

fn sampling(c: &Case, limit: EpochLimit, rank: usize) -> SamplingOptions {
    SamplingOptions {
        randomize: c.randomize,
        window: Window::Chunks(c.window),
        seed: c.seed,
        limit,
        num_workers: c.workers,
        rank,
    }
}

/// Equal steps over every worker of sweep 0: each worker's run dropped and padded against the
/// same worker's run without equal steps.
fn check_equal_steps(ds: &Dataset, stream: &str, c: &Case) -> Result<(), TestCaseError> {
    let options = |rank: usize, tail: Option<Tail>| DumpOptions {
        equal_steps: tail.is_some(),
        tail: tail.unwrap_or_default(),
        ..dump_options(sampling(c, EpochLimit::Sweep(0), rank), c.sizes[0], false)
    };
    let plain: Vec<Vec<Seen>> =
        (0..c.workers).map(|rank| run_and_ledger(ds, stream, &options(rank, None))).collect::<Result<_, _>>()?;
    let fewest = plain.iter().map(Vec::len).min().unwrap_or(0);
    let most = plain.iter().map(Vec::len).max().unwrap_or(0);
    for (rank, plain) in plain.iter().enumerate() {
        let dropped = run_and_ledger(ds, stream, &options(rank, Some(Tail::Drop)))?;
        prop_assert_eq!(&dropped[..], &plain[..fewest], "rank {} dropped to the fewest steps", rank);
        let padded = run_and_ledger(ds, stream, &options(rank, Some(Tail::Pad)))?;
        prop_assert_eq!(padded.len(), most, "rank {} padded to the most steps", rank);
        prop_assert_eq!(&padded[..plain.len()], &plain[..], "rank {} padded", rank);
        prop_assert!(
            padded[plain.len()..].iter().all(|(ids, _, _)| ids.is_empty()),
            "rank {}: padding holds no record",
            rank
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_format_keeps_the_orders_promises(c in case()) {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut ds, stream) = dataset(dir.path(), c.format, c.records, c.files, c.per_chunk);
        let all: Vec<usize> = (0..c.records).collect();

        // Every record once per sweep over the workers, each sweep on its own.
        let mut sweeps = vec![Vec::new(), Vec::new()];
        for rank in 0..c.workers {
            for (k, sweep) in sweeps.iter_mut().enumerate() {
                let options = dump_options(sampling(&c, EpochLimit::Sweep(k as u64), rank), c.sizes[0], false);
                sweep.extend(flat(&run_and_ledger(&ds, stream, &options)?));
            }
        }
        for (k, mut sweep) in sweeps.into_iter().enumerate() {
            sweep.sort_unstable();
            prop_assert_eq!(&sweep, &all, "sweep {} of {:?} over {} workers", k, c.format, c.workers);
        }

        // The order a worker gets does not depend on the minibatch sizes.
        let one = dump_options(sampling(&c, EpochLimit::Sweeps(2), c.rank), c.sizes[0], false);
        let baseline = run_and_ledger(&ds, stream, &one)?;
        let other = DumpOptions { minibatch_sizes: vec![c.sizes[1]], ..one.clone() };
        prop_assert_eq!(flat(&run_and_ledger(&ds, stream, &other)?), flat(&baseline), "{:?} sizes {} and {}", c.format, c.sizes[0], c.sizes[1]);
        let cycled = DumpOptions { minibatch_sizes: c.sizes.clone(), ..one.clone() };
        prop_assert_eq!(flat(&run_and_ledger(&ds, stream, &cycled)?), flat(&baseline), "{:?} with sizes {:?}", c.format, c.sizes);

        // A restore after any minibatch goes on with exactly what the run went on with.
        if !baseline.is_empty() {
            let k = c.restore_at.index(baseline.len());
            let restored = DumpOptions { restore: Some(baseline[k].1), ..one.clone() };
            prop_assert_eq!(
                &run_and_ledger(&ds, stream, &restored)?[..],
                &baseline[k + 1..],
                "{:?} restored after minibatch {} of {}", c.format, k, baseline.len()
            );
        }

        check_equal_steps(&ds, stream, &c)?;

        // The parsed cache: the first run writes the chunks it loads, the second reads them
        // back without loading any, and every stream is what the run without the cache gave.
        let without = minibatches(&ds, &one);
        let cache = Arc::new(ParsedCache::open(&dir.path().join("parsed"), 1 << 30).expect("parsed cache"));
        ds.use_parsed_cache(cache.clone(), Persist::OnLoad);
        prop_assert!(minibatches(&ds, &one) == without, "{:?}: the run that fills the parsed cache", c.format);
        let filled = cache.stats();
        prop_assert!(minibatches(&ds, &one) == without, "{:?}: the run from the parsed cache", c.format);
        let read = cache.stats();
        prop_assert_eq!(read.misses, filled.misses, "{:?}: a chunk loaded again", c.format);
        prop_assert!(without.is_empty() || read.hits > filled.hits, "{:?}: nothing read back", c.format);
        prop_assert_eq!((read.rejected, read.write_errors), (0, 0), "{:?}", c.format);
    }
}
