//! The order's promises, checked over every format on random datasets (issue 39, item 5). In
//! each format — CTF, libsvm, TFRecord with `tf.train.Example`, CSV, fixed-length records, whole
//! files — a dataset of `n` records whose record `i` carries the id `i`, cut into small chunks,
//! read in-process through the same `Feeder` loop the daemon's producers run
//! ([`for_each_minibatch`]):
//!
//! * every record exactly once per sweep over any number of workers (a job's ranks times its
//!   `DataLoader` workers are one `num_workers` to the sampler), randomized or in file order;
//! * the order a worker gets does not depend on the minibatch sizes (one size or several, cycled);
//! * a restore at the position after any minibatch continues with exactly the records the
//!   uninterrupted run went on with;
//! * with equal steps every worker gets as many minibatches — padded, every record once per
//!   sweep; dropped, none twice;
//! * a second run reads every chunk back from the parsed cache and gets the same minibatches;
//! * the data-order ledger, computed from the index alone, names exactly the records delivered,
//!   minibatch by minibatch, with the same fingerprints.
//!
//! The sampler's own property tests check these on synthetic timelines; here they are checked
//! through each format's reader and decoder, so that none loses, doubles or reorders a record on
//! the way to the sampler or from a chunk to a minibatch.

mod support;

use std::fmt::Write as _;
use std::path::Path;

use minibatchd::dump::{for_each_minibatch, for_each_plan, DumpOptions};
use std::sync::Arc;

use minibatchd_engine::dataset::{Dataset, Persist};
use minibatchd_engine::format::parsed_cache::ParsedCache;
use minibatchd_engine::format::tfrecord::example::write::{example, Value};
use minibatchd_engine::format::tfrecord::frame;
use minibatchd_engine::minibatch::{MbData, MbValues, Minibatch};
use minibatchd_engine::sampling::{EpochLimit, SamplingOptions, Tail, Window};
use proptest::prelude::*;
use support::{dump_options, open, write};

/// The formats, each with a dataset whose records carry their ids.
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

/// Writes a dataset of `n` records in `format` below `dir` (record `i` carrying id `i`), its
/// chunks about `chunk` bytes, and opens it as dataset `d`. Returns it with the name of the
/// stream that carries the ids.
fn dataset(dir: &Path, format: Format, n: usize, chunk: u64) -> (Dataset, &'static str) {
    let head =
        format!("[daemon]\nstate_dir = \"state\"\n[datasets.d]\nchunk_size_bytes = {chunk}\ncache_index = false\n");
    let (body, stream) = match format {
        Format::Ctf => {
            write(dir, "d.ctf", text(n, |s, i| writeln!(s, "{i} |x {i}")));
            ("format = \"ctf\"\nfiles = [\"d.ctf\"]\n[datasets.d.streams.x]\ndim = 1\nformat = \"dense\"\n", "x")
        }
        Format::Libsvm => {
            write(dir, "d.svm", text(n, |s, i| writeln!(s, "{i} {}:1", i % 7 + 1)));
            ("format = \"libsvm\"\nfiles = [\"d.svm\"]\n", "__instY")
        }
        Format::TfRecord => {
            let ids: Vec<f32> = (0..n).map(id_value).collect();
            let file: Vec<u8> = ids.iter().flat_map(|x| frame(&example(&[("x", Value::Floats(&[*x]))]))).collect();
            write(dir, "d.tfrecord", file);
            ("format = \"tfrecord\"\nfiles = [\"d.tfrecord\"]\n[datasets.d.streams.x]\nformat = \"dense\"\ndim = 1\n", "x")
        }
        Format::Csv => {
            write(dir, "d.csv", text(n, |s, i| writeln!(s, "{i},{i}")));
            ("format = \"csv\"\nfiles = [\"d.csv\"]\ncolumns = 2\n[datasets.d.streams.x]\ncolumns = [1]\n", "x")
        }
        Format::FixedLength => {
            write(dir, "d.bin", (0..n).flat_map(|i| id_value(i).to_le_bytes()).collect::<Vec<u8>>());
            (
                "format = \"fixed_length\"\nfiles = [\"d.bin\"]\nrecord_bytes = 4\n\
                 [datasets.d.streams.x]\ndtype = \"float32\"\noffset = 0\ndim = 1\n",
                "x",
            )
        }
        Format::WholeFile => {
            std::fs::create_dir_all(dir.join("w")).expect("mkdir");
            for i in 0..n {
                write(&dir.join("w"), &format!("{i:05}.bin"), i.to_string());
            }
            ("format = \"whole_file\"\nfiles = [\"w/*.bin\"]\n", "contents")
        }
    };
    (open(&format!("{head}{body}"), "d", dir, &dir.join("state")), stream)
}

/// The lines `line` writes for records `0..n`.
fn text(n: usize, line: impl Fn(&mut String, usize) -> std::fmt::Result) -> String {
    let mut s = String::new();
    for i in 0..n {
        line(&mut s, i).expect("a String takes any text");
    }
    s
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

fn flat(run: &[Seen]) -> Vec<usize> {
    run.iter().flat_map(|(ids, _, _)| ids.iter().copied()).collect()
}

/// One random case: a format's dataset and a job reading it.
#[derive(Debug, Clone)]
struct Case {
    format: Format,
    records: usize,
    chunk_bytes: u64,
    randomize: bool,
    window: usize,
    seed: u64,
    workers: usize,
    sizes: Vec<usize>,
    rank: usize,
    restore_after: usize,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0..FORMATS.len(),
        1usize..120,
        prop_oneof![Just(16u64), 40u64..400],
        any::<bool>(),
        1usize..6,
        0u64..1000,
        1usize..6,
        prop::collection::vec(1usize..40, 1..4),
        (0usize..6, 0usize..200),
    )
        .prop_map(|(f, records, chunk_bytes, randomize, window, seed, workers, sizes, (rank, restore_after))| {
            Case {
                format: FORMATS[f],
                records,
                chunk_bytes,
                randomize,
                window,
                seed,
                workers,
                sizes,
                rank: rank % workers,
                restore_after,
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_format_keeps_the_orders_promises(c in case()) {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut ds, stream) = dataset(dir.path(), c.format, c.records, c.chunk_bytes);
        let all: Vec<usize> = (0..c.records).collect();

        // Every record once per sweep over the workers, each sweep on its own.
        let mut sweeps = vec![Vec::new(), Vec::new()];
        for rank in 0..c.workers {
            for (k, sweep) in sweeps.iter_mut().enumerate() {
                let options = dump_options(sampling(&c, EpochLimit::Sweep(k as u64), rank), c.sizes[0], false);
                sweep.extend(flat(&run(&ds, stream, &options)));
            }
        }
        for (k, mut sweep) in sweeps.into_iter().enumerate() {
            sweep.sort_unstable();
            prop_assert_eq!(&sweep, &all, "sweep {} of {:?} over {} workers", k, c.format, c.workers);
        }

        // The order a worker gets does not depend on the minibatch sizes.
        let one = dump_options(sampling(&c, EpochLimit::Sweeps(2), c.rank), c.sizes[0], false);
        let baseline = run(&ds, stream, &one);
        prop_assert_eq!(&ledger(&ds, &one), &baseline, "{:?}: the ledger against the minibatches", c.format);
        let cycled = DumpOptions { minibatch_sizes: c.sizes.clone(), ..one.clone() };
        prop_assert_eq!(flat(&run(&ds, stream, &cycled)), flat(&baseline), "{:?} with sizes {:?}", c.format, c.sizes);

        // A restore after any minibatch goes on with exactly what the run went on with.
        if !baseline.is_empty() {
            let k = c.restore_after % baseline.len();
            let restored = DumpOptions { restore: Some(baseline[k].1), ..one.clone() };
            prop_assert_eq!(
                flat(&run(&ds, stream, &restored)),
                flat(&baseline[k + 1..]),
                "{:?} restored after minibatch {} of {}", c.format, k, baseline.len()
            );
        }

        // Equal steps: as many minibatches on every worker; padded, nothing lost or repeated;
        // dropped, nothing repeated.
        for tail in [Tail::Pad, Tail::Drop] {
            let (mut counts, mut seen) = (Vec::new(), Vec::new());
            for rank in 0..c.workers {
                let options = DumpOptions {
                    equal_steps: true,
                    tail,
                    ..dump_options(sampling(&c, EpochLimit::Sweep(0), rank), c.sizes[0], false)
                };
                let mbs = run(&ds, stream, &options);
                counts.push(mbs.len());
                seen.extend(flat(&mbs));
            }
            prop_assert!(counts.windows(2).all(|w| w[0] == w[1]), "{:?} {:?}: steps {:?}", c.format, tail, counts);
            seen.sort_unstable();
            if tail == Tail::Pad {
                prop_assert_eq!(&seen, &all, "{:?} padded", c.format);
            } else {
                prop_assert!(seen.windows(2).all(|w| w[0] < w[1]), "{:?} dropped: a record twice", c.format);
            }
        }

        // The parsed cache: the first run writes every chunk, the second reads them back, and
        // the minibatches are the same.
        let cache = Arc::new(ParsedCache::open(&dir.path().join("parsed"), 1 << 30).expect("parsed cache"));
        ds.use_parsed_cache(cache.clone(), Persist::OnLoad);
        let parsed = run(&ds, stream, &one);
        let hits = cache.stats().hits;
        prop_assert_eq!(&run(&ds, stream, &one), &parsed, "{:?} from the parsed cache", c.format);
        prop_assert_eq!(&parsed, &baseline, "{:?} with the parsed cache", c.format);
        // (A worker whose share is empty loads no chunk.)
        prop_assert!(
            parsed.is_empty() || cache.stats().hits > hits,
            "{:?}: nothing read back from the parsed cache",
            c.format
        );
    }
}
