//! The deepx formats end to end: golden fixtures run through `minibatchd dump`, and deepx's own
//! reader test data replayed through the engine.
//!
//! * `tests/fixtures_deepx/<case>/` holds the data, a `config.toml` and a `case.toml` (as the CTF
//!   suite's: `args`, `exit`, `stderr_contains`) and, for successful cases, `expected.jsonl`, the
//!   exact dump. Every grammar rule and every difference from deepx (`docs/differences.md`) has a
//!   case. Regenerate with `MINIBATCHD_BLESS=1 cargo test --test deepx` and review the diff.
//! * deepx's `instance_reader/{libsvm,libsvm_ex,uch}.txt` and `stream/100.txt(.gz)` are read from
//!   `../shared/conformance/deepx`; when it is absent these tests pass, listed as skipped in
//!   `scripts/test.sh`'s summary. Each file
//!   is read with the batch sizes of deepx's reader tests, which fix the number of full batches
//!   and instances, and every tensor is compared with the instances read independently.

mod support;

use std::path::{Path, PathBuf};

use minibatchd::dump::{dump, for_each_minibatch, DumpOptions};
use minibatchd_engine::dataset::Dataset;
use minibatchd_engine::format::StreamKind;
use minibatchd_engine::sampling::EpochLimit;
use support::deepx::{instances, Instance};
use support::golden::Suite;
use support::{dump_options, in_file_order, shared_conformance, write};

#[test]
fn golden_fixtures() {
    Suite { dir: "tests/fixtures_deepx", min_cases: 19, what: "deepx fixtures" }.run();
}

/// The `id[:value]` features of one tensor.
fn features(text: &str) -> Vec<(u64, f32)> {
    text.split_whitespace()
        .map(|t| match t.split_once(':') {
            Some((id, v)) => (id.parse().expect("id"), v.parse().expect("value")),
            None => (t.parse().expect("id"), 1.0),
        })
        .collect()
}

/// A clean line of deepx's test files as an instance, read independently of minibatchd with
/// plain splitting (`label_size` 1).
fn oracle(line: &str, format: &str, slots: usize) -> Instance {
    let line = line.trim_start();
    let (label, rest) = line.split_once(' ').unwrap_or((line, ""));
    let (y, w) = match label.split_once(':') {
        Some((l, w)) => (l.parse().expect("label"), w.parse().expect("weight")),
        None => (label.parse().expect("label"), 1.0),
    };
    let rest = rest.trim_start();
    let (uuid, body) = match rest.strip_prefix("uuid:") {
        Some(r) => {
            let (u, b) = r.split_once(' ').unwrap_or((r, ""));
            (u.to_owned(), b)
        }
        None => (String::new(), rest),
    };
    let (x, hist) = match format {
        "libsvm" => (vec![features(body)], None),
        "libsvm_ex" => (body.split('|').map(features).collect(), None),
        _ => {
            let parts: Vec<&str> = body.split('|').collect();
            let items: Vec<&str> = parts[2..].iter().copied().filter(|p| !p.trim().is_empty()).collect();
            let mut x = vec![features(parts[0]), features(parts[1])];
            for h in 0..slots {
                x.push(items.get(h).map(|t| features(t)).unwrap_or_default());
            }
            #[allow(clippy::cast_precision_loss)]
            let n = items.len().min(slots) as f32;
            (x, Some(n))
        }
    };
    Instance { x, y, w, uuid, hist }
}

/// Dataset `d` of `format` over `files`, in file order, with `extra` options and 1000-byte chunks.
fn open(format: &str, files: &[&Path], extra: &str, state: &Path) -> Dataset {
    let list: Vec<String> = files.iter().map(|f| format!("{:?}", f.display().to_string())).collect();
    let text = format!(
        "[datasets.d]\nformat = \"{format}\"\nfiles = [{}]\nchunk_size_bytes = 1000\n{extra}\n[datasets.d.sampling]\nrandomize = false\n",
        list.join(", ")
    );
    support::open(&text, "d", state, state)
}

fn options(size: usize) -> DumpOptions {
    dump_options(in_file_order(EpochLimit::FullSweep), size, true)
}

/// deepx's `*_instance_reader_test.cc`: (batch, full batches) over 60 instances.
const DEEPX_BATCHES: [(usize, usize); 7] = [(1, 60), (10, 6), (15, 4), (20, 3), (32, 1), (60, 1), (64, 0)];

fn replay(format: &str, file: &str, extra: &str, slots: usize) {
    let Some(root) = shared_conformance("deepx", &format!("deepx's {file}")) else { return };
    let path = root.join("instance_reader").join(file);
    let text = std::fs::read_to_string(&path).expect("read");
    let expected: Vec<Instance> = text.lines().map(|l| oracle(l, format, slots)).collect();
    assert_eq!(expected.len(), 60);
    let state = tempfile::tempdir().expect("tempdir");
    let ds = open(format, &[&path], &format!("w = true\nuuid = true\n{extra}"), state.path());
    let names = ds.stream_names().to_vec();
    for (batch, full) in DEEPX_BATCHES {
        let mut got = Vec::new();
        let mut full_batches = 0;
        for_each_minibatch(&ds, &options(batch), &mut |mb| {
            full_batches += usize::from(mb.streams[0].num_samples() == batch);
            got.extend(instances(mb, &names));
            Ok(())
        })
        .expect("sweep");
        assert_eq!((full_batches, got.len()), (full, 60), "{file}, batch {batch}");
        assert_eq!(got, expected, "{file}, batch {batch}");
    }
}

#[test]
fn deepx_libsvm_reader_test_data() {
    replay("libsvm", "libsvm.txt", "", 0);
}

#[test]
fn deepx_libsvm_ex_reader_test_data() {
    replay("libsvm_ex", "libsvm_ex.txt", "x_size = 2", 0);
}

#[test]
fn deepx_uch_reader_test_data() {
    replay("uch", "uch.txt", "x_hist_item_size = 3", 3);
}

fn dump_all(ds: &Dataset, size: usize) -> String {
    let mut out = Vec::new();
    dump(ds, &options(size), &mut out).expect("dump");
    String::from_utf8(out).expect("utf-8")
}

#[test]
fn deepx_stream_test_data_plain_gzip_and_multi_member() {
    let Some(root) = shared_conformance("deepx", "deepx's stream/100.txt") else { return };
    let plain = root.join("stream/100.txt");
    let gz = root.join("stream/100.txt.gz");
    let state = tempfile::tempdir().expect("tempdir");
    let a = open("libsvm", &[&plain], "", state.path());
    let b = open("libsvm", &[&gz], "", state.path());
    assert_eq!(a.timeline().num_sequences(), 100);
    assert_eq!(dump_all(&a, 7), dump_all(&b, 7));
    // `cat 100.txt.gz 100.txt.gz`: deepx hangs on it; here it is the file twice.
    let member = std::fs::read(&gz).expect("read gz");
    let twice = write(state.path(), "twice.gz", [member.clone(), member].concat());
    let c = open("libsvm", &[&twice], "", state.path());
    let d = open("libsvm", &[&plain, &plain], "", state.path());
    assert_eq!(c.timeline().num_sequences(), 200);
    let strip = |s: String| {
        s.lines().map(|l| l.split_once("\"streams\"").map(|x| x.1.to_owned()).unwrap_or_default()).collect::<Vec<_>>()
    };
    assert_eq!(strip(dump_all(&c, 200)), strip(dump_all(&d, 200)));
}

#[test]
fn streams_describe_deepx_tensors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = write(dir.path(), "u.txt", "1:2 0 uuid:x 1|2|3\n");
    let ds = open("uch", &[&f], "label_size = 2\nw = true\nuuid = true\nx_hist_item_size = 2", dir.path());
    let got: Vec<(&str, StreamKind, usize)> = ds.streams().iter().map(|s| (s.name.as_str(), s.kind, s.dim)).collect();
    assert_eq!(
        got,
        vec![
            ("__instXuser", StreamKind::SparseU64, 0),
            ("__instXcand", StreamKind::SparseU64, 0),
            ("__instXhist0", StreamKind::SparseU64, 0),
            ("__instXhist1", StreamKind::SparseU64, 0),
            ("__instXhist_size", StreamKind::Dense, 1),
            ("__instY", StreamKind::Dense, 2),
            ("__instW", StreamKind::Dense, 2),
            ("__instUUID", StreamKind::Strings, 0),
        ]
    );
    assert_eq!(ds.stream_names().len(), 8);
    let text = dump_all(&ds, 1);
    assert!(
        text.contains("\"__instUUID\": {\"num_samples\": 1, \"num_sequences\": 1, \"sequences\": [[\"x\"]]}"),
        "{text}"
    );
    assert!(
        text.contains("\"__instW\": {\"num_samples\": 1, \"num_sequences\": 1, \"sequences\": [[[2.0, 1.0]]]}"),
        "{text}"
    );
}

#[test]
fn the_index_cache_serves_a_second_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = write(dir.path(), "a.txt", "1 1\n\n0 2\n");
    let first = open("libsvm", &[&f], "", dir.path());
    assert!(dir.path().join("index").is_dir());
    let second = open("libsvm", &[&f], "", dir.path());
    assert_eq!(first.identity(), second.identity());
    assert_eq!(dump_all(&first, 2), dump_all(&second, 2));
}

/// Once chunked, a deepx file whose sequences are its lines keeps no sizes: a chunk is read as
/// its lines. Read so, a file gives exactly what the same lines give read by their sizes (the
/// same file with a blank first line, which makes the index keep them): with a byte-order mark,
/// `\r\n` endings, lines longer than a read window (256 KiB), blank lines after the last one and
/// a last line without its newline, over chunks of 1,000 bytes.
#[test]
fn a_chunk_read_as_its_lines_gives_what_its_sizes_give() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut lines: Vec<String> = (0..300).map(|i| format!("{} {}:1.5 {}:2\r\n", i % 2, i, i + 1)).collect();
    lines[7] = format!("1 {}\n", (1..40_000).map(|k| format!("{k}:1")).collect::<Vec<_>>().join(" "));
    lines[150] = format!("0 {}\n", (1..90_000).map(|k| format!("{k}:0.5")).collect::<Vec<_>>().join(" "));
    let body = lines.concat();
    let variants = [
        ("bom.txt", format!("\u{feff}{body}")),
        ("trailing.txt", format!("{body}\n\n")),
        ("cut.txt", body.trim_end_matches(['\r', '\n']).to_owned()),
    ];
    for (name, text) in variants {
        let lines_file = write(dir.path(), name, &text);
        let sized_file =
            write(dir.path(), &format!("sized_{name}"), format!("\n{}", text.trim_start_matches('\u{feff}')));
        let state = tempfile::tempdir().expect("tempdir");
        let by_lines = open("libsvm", &[&lines_file], "", state.path());
        let by_sizes = open("libsvm", &[&sized_file], "", state.path());
        assert_eq!(by_lines.timeline().num_sequences(), 300, "{name}");
        assert!(by_lines.index_bytes() < 300 * 4, "{name}: the sizes are let go ({} bytes)", by_lines.index_bytes());
        assert!(by_sizes.index_bytes() > 300 * 4, "{name}: the sizes are kept ({} bytes)", by_sizes.index_bytes());
        assert!(by_lines.timeline().num_chunks() >= 5, "{name}: {} chunks", by_lines.timeline().num_chunks());
        assert_eq!(dump_all(&by_lines, 64), dump_all(&by_sizes, 64), "{name}");
    }
}

/// Each file of a deepx dataset is chunked as soon as it is indexed (and its sizes let go, so the
/// next file's pass does not find them all held): the chunks are CNTK's rule over every file —
/// a chunk never crosses a file, and one closes when the next line would pass
/// `chunk_size_bytes` — and the timeline is the same, whether the index comes from the pass or
/// from its cache.
#[test]
fn a_dataset_of_many_files_is_chunked_file_by_file_as_its_rule_says() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut files = Vec::new();
    let mut expected = Vec::new(); // (file, start, end, lines) by the rule
    for (f, n) in [37usize, 1, 120, 64].into_iter().enumerate() {
        let lines: Vec<String> = (0..n)
            .map(|i| {
                format!(
                    "{} {}\n",
                    i % 2,
                    (0..=(i * 7 + f) % 23).map(|k| format!("{k}:1")).collect::<Vec<_>>().join(" ")
                )
            })
            .collect();
        let mut open_chunk: Option<(u64, u64, usize)> = None;
        let mut at = 0u64;
        for line in &lines {
            let size = line.len() as u64;
            match &mut open_chunk {
                Some((start, end, count)) if *end - *start + size <= 1000 => {
                    *end += size;
                    *count += 1;
                }
                _ => {
                    if let Some((s, e, c)) = open_chunk.take() {
                        expected.push((f, s, e, c));
                    }
                    open_chunk = Some((at, at + size, 1));
                }
            }
            at += size;
        }
        if let Some((s, e, c)) = open_chunk {
            expected.push((f, s, e, c));
        }
        files.push(write(dir.path(), &format!("part-{f}.txt"), lines.concat()));
    }
    let paths: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let state = tempfile::tempdir().expect("tempdir");
    for pass in ["the index pass", "the index cache"] {
        let ds = open("libsvm", &paths, "", state.path());
        let got: Vec<(usize, u64, u64, usize)> =
            ds.chunks().iter().map(|c| (c.file, c.start, c.end, c.num_seqs)).collect();
        assert_eq!(got, expected, "{pass}");
        let starts: Vec<usize> = expected
            .iter()
            .scan(0, |at, c| {
                *at += c.3;
                Some(*at)
            })
            .collect();
        assert_eq!(ds.timeline().chunk_start[1..], starts[..], "{pass}");
        assert_eq!(ds.timeline().num_sequences(), 37 + 1 + 120 + 64, "{pass}");
        // Every file is indexed by its chunks alone (its lines are its sequences): beside the
        // chunks' descriptors and starts, each chunk's end and line count is what is left.
        let chunks = ds.chunks().len() * (std::mem::size_of::<minibatchd_engine::format::ChunkDesc>() + 8) + 8;
        let rest = ds.index_bytes() - chunks as u64;
        assert!(rest <= 16 * ds.chunks().len() as u64 + 64, "{pass}: {rest} bytes beside the chunks");
    }
}
