//! The deepx formats end to end: golden fixtures run through `minibatchd dump`, and deepx's own
//! reader test data replayed through the engine.
//!
//! * `tests/fixtures_deepx/<case>/` holds the data, a `config.toml` and a `case.toml` (as the CTF
//!   suite's: `args`, `exit`, `stderr_contains`) and, for successful cases, `expected.jsonl`, the
//!   exact dump. Every grammar rule and every difference from deepx (`docs/differences.md`) has a
//!   case. Regenerate with `MINIBATCHD_BLESS=1 cargo test --test deepx` and review the diff.
//! * deepx's `instance_reader/{libsvm,libsvm_ex,uch}.txt` and `stream/100.txt(.gz)` are read from
//!   `../shared/conformance/deepx`; when it is absent these tests print SKIPPED and pass. Each file
//!   is read with the batch sizes of deepx's reader tests, which fix the number of full batches
//!   and instances, and every tensor is compared with the instances read independently.

use std::path::{Path, PathBuf};
use std::process::Command;

use minibatchd::config::Config;
use minibatchd::dump::{dump, for_each_minibatch, DumpOptions};
use minibatchd_engine::dataset::Dataset;
use minibatchd_engine::format::{Indices, StreamKind, Values};
use minibatchd_engine::minibatch::{MbData, Minibatch};
use minibatchd_engine::sampling::{EpochLimit, SamplingOptions, Window};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures_deepx")
}

fn conformance() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance/deepx");
    p.is_dir().then_some(p)
}

struct Case {
    args: Vec<String>,
    exit: i32,
    stderr_contains: Vec<String>,
}

fn read_case(dir: &Path) -> Case {
    let text = std::fs::read_to_string(dir.join("case.toml")).expect("case.toml");
    let mut case = Case { args: Vec::new(), exit: 0, stderr_contains: Vec::new() };
    for line in text.lines() {
        let Some((k, v)) = line.split_once(" = ") else { continue };
        match k {
            "args" => case.args = serde_json::from_str(v).expect("args"),
            "exit" => case.exit = v.parse().expect("exit"),
            "stderr_contains" => case.stderr_contains = serde_json::from_str(v).expect("stderr_contains"),
            other => panic!("unknown case key {other}"),
        }
    }
    case
}

fn run_case(dir: &Path) -> Result<(), String> {
    let case = read_case(dir);
    let state = tempfile::tempdir().map_err(|e| e.to_string())?;
    let out = Command::new(env!("CARGO_BIN_EXE_minibatchd"))
        .arg("dump")
        .arg("--config")
        .arg(dir.join("config.toml"))
        .args(["--dataset", "d"])
        .args(&case.args)
        .env("MINIBATCHD_LOG", "warn")
        // Decompressed copies and index caches go to a fresh directory, not the source tree.
        .env("MINIBATCHD__DAEMON__STATE_DIR", state.path())
        .output()
        .map_err(|e| format!("cannot run minibatchd: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code().unwrap_or(-1);
    if code != case.exit {
        return Err(format!("exit {code}, expected {}\nstderr:\n{stderr}", case.exit));
    }
    for frag in &case.stderr_contains {
        if !stderr.contains(frag.as_str()) {
            return Err(format!("stderr lacks {frag:?}:\n{stderr}"));
        }
    }
    let expected_path = dir.join("expected.jsonl");
    if case.exit == 0 {
        if std::env::var_os("MINIBATCHD_BLESS").is_some() {
            std::fs::write(&expected_path, stdout.as_bytes()).map_err(|e| e.to_string())?;
        }
        let expected =
            std::fs::read_to_string(&expected_path).map_err(|e| format!("{}: {e}", expected_path.display()))?;
        if expected != stdout {
            return Err(format!(
                "output differs from {}\n--- expected\n{expected}\n--- got\n{stdout}",
                expected_path.display()
            ));
        }
    } else if !stdout.is_empty() {
        return Err(format!("a failing dump printed minibatches:\n{stdout}"));
    }
    Ok(())
}

#[test]
fn golden_fixtures() {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .expect("tests/fixtures_deepx")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join("case.toml").is_file())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 19, "fixtures missing: found {}", dirs.len());
    let failures: Vec<String> = dirs
        .iter()
        .filter_map(|d| {
            run_case(d).err().map(|e| {
                format!("== {}: {e}", d.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default())
            })
        })
        .collect();
    println!("{} deepx fixtures, {} failed", dirs.len(), failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// One instance as read independently of minibatchd: CSR rows per X tensor, labels, weights,
/// uuid, history size.
#[derive(Debug, Clone, PartialEq)]
struct Instance {
    x: Vec<Vec<(u64, f32)>>,
    y: f32,
    w: f32,
    uuid: String,
    hist: Option<f32>,
}

fn features(text: &str) -> Vec<(u64, f32)> {
    text.split_whitespace()
        .map(|t| match t.split_once(':') {
            Some((id, v)) => (id.parse().expect("id"), v.parse().expect("value")),
            None => (t.parse().expect("id"), 1.0),
        })
        .collect()
}

/// The clean lines of deepx's test files, read with plain splitting (label_size 1).
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

fn f32s(v: &Values) -> Vec<f32> {
    match v {
        Values::F32(v) => v.clone(),
        Values::F64(_) => panic!("float32 expected"),
    }
}

/// The instances of a minibatch, in order, from its streams (named as deepx's tensors).
fn instances(mb: &Minibatch, names: &[String]) -> Vec<Instance> {
    let n = mb.streams[0].num_samples();
    let mut out = vec![Instance { x: Vec::new(), y: 0.0, w: 1.0, uuid: String::new(), hist: None }; n];
    for (name, s) in names.iter().zip(&mb.streams) {
        match &s.data {
            MbData::Sparse { sample_offsets, indices: Indices::U64(ids), values, .. } => {
                let values = f32s(values);
                for (j, inst) in out.iter_mut().enumerate() {
                    let (a, b) = (
                        usize::try_from(sample_offsets[j]).expect("offset"),
                        usize::try_from(sample_offsets[j + 1]).expect("offset"),
                    );
                    inst.x.push((a..b).map(|e| (ids[e], values[e])).collect());
                }
            }
            MbData::Dense { values, .. } => {
                let values = f32s(values);
                for (j, inst) in out.iter_mut().enumerate() {
                    match name.as_str() {
                        "__instY" => inst.y = values[j],
                        "__instW" => inst.w = values[j],
                        "__instXhist_size" => inst.hist = Some(values[j]),
                        other => panic!("unexpected dense stream {other}"),
                    }
                }
            }
            MbData::Strings { offsets, bytes } => {
                for (j, inst) in out.iter_mut().enumerate() {
                    let (a, b) = (
                        usize::try_from(offsets[j]).expect("offset"),
                        usize::try_from(offsets[j + 1]).expect("offset"),
                    );
                    inst.uuid = String::from_utf8(bytes[a..b].to_vec()).expect("utf-8");
                }
            }
            MbData::Sparse { .. } => panic!("u64 ids expected"),
        }
    }
    out
}

fn open(format: &str, files: &[&Path], extra: &str, state: &Path) -> Dataset {
    let list: Vec<String> = files.iter().map(|f| format!("{:?}", f.display().to_string())).collect();
    let text = format!(
        "[datasets.d]\nformat = \"{format}\"\nfiles = [{}]\nchunk_size_bytes = 1000\n{extra}\n[datasets.d.sampling]\nrandomize = false\n",
        list.join(", ")
    );
    let c = Config::from_toml_str(&text, state).expect("config");
    Dataset::open(c.dataset("d").expect("d"), state, &mut |_| {}).expect("open")
}

fn options(size: usize) -> DumpOptions {
    DumpOptions {
        sampling: SamplingOptions {
            randomize: false,
            window: Window::Chunks(1),
            seed: 0,
            limit: EpochLimit::FullSweep,
            num_workers: 1,
            rank: 0,
        },
        minibatch_sizes: vec![size],
        num_minibatches: None,
        restore: None,
        restore_before: Vec::new(),
        equal_steps: false,
        frame_mode: true,
    }
}

/// deepx's `*_instance_reader_test.cc`: (batch, full batches) over 60 instances.
const DEEPX_BATCHES: [(usize, usize); 7] = [(1, 60), (10, 6), (15, 4), (20, 3), (32, 1), (60, 1), (64, 0)];

fn replay(format: &str, file: &str, extra: &str, slots: usize) {
    let Some(root) = conformance() else {
        println!("SKIPPED: ../shared/conformance/deepx is absent");
        return;
    };
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
    let Some(root) = conformance() else {
        println!("SKIPPED: ../shared/conformance/deepx is absent");
        return;
    };
    let plain = root.join("stream/100.txt");
    let gz = root.join("stream/100.txt.gz");
    let state = tempfile::tempdir().expect("tempdir");
    let a = open("libsvm", &[&plain], "", state.path());
    let b = open("libsvm", &[&gz], "", state.path());
    assert_eq!(a.timeline().num_sequences(), 100);
    assert_eq!(dump_all(&a, 7), dump_all(&b, 7));
    // `cat 100.txt.gz 100.txt.gz`: deepx hangs on it; here it is the file twice.
    let twice = state.path().join("twice.gz");
    let member = std::fs::read(&gz).expect("read gz");
    std::fs::write(&twice, [member.clone(), member].concat()).expect("write");
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
    let f = dir.path().join("u.txt");
    std::fs::write(&f, "1:2 0 uuid:x 1|2|3\n").expect("write");
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
    let f = dir.path().join("a.txt");
    std::fs::write(&f, "1 1\n\n0 2\n").expect("write");
    let first = open("libsvm", &[&f], "", dir.path());
    assert!(dir.path().join("index").is_dir());
    let second = open("libsvm", &[&f], "", dir.path());
    assert_eq!(first.identity(), second.identity());
    assert_eq!(dump_all(&first, 2), dump_all(&second, 2));
}
