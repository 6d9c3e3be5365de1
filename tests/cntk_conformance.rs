//! CNTK's own CTF reader unit tests, replayed against minibatchd.
//!
//! `tests/conformance/cntk_cases.json` lists every test of CNTK's `CNTKTextFormatReaderTests.cpp`
//! with its effective parameters (extracted from the C++ test source and the `BrainScript` configs,
//! and validated independently). The data and the expected dumps (`Control/`) are read from
//! `../shared/conformance/cntk` — present in CI; when it is absent the tests pass without
//! checking anything, and `scripts/test.sh`'s summary lists them as skipped.
//!
//! A legacy epoch `e` is replayed as reference §5 describes: a fresh session with
//! `max_samples = (e + 1) * epoch_size`, restored to `e * epoch_size`, at most 10 minibatches;
//! each stream is packed into CNTK's `MBLayout` and printed with `%g`, then compared token for token.

#[path = "conformance/legacy_dump.rs"]
mod legacy_dump;
mod support;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use minibatchd_engine::dataset::Dataset;
use minibatchd_engine::feed::Feeder;
use minibatchd_engine::minibatch::MbIndices as Indices;
use minibatchd_engine::minibatch::MbValues as Values;
use minibatchd_engine::minibatch::{MbData, MbStream};
use minibatchd_engine::sampling::{EpochLimit, Sampler, SamplingOptions, Window};
use serde_json::Value;
use support::{package_root, shared_conformance, write};

/// CNTK's reader tests (data and control files) in `../shared/conformance`, if present.
fn shared_root(what: &str) -> Option<PathBuf> {
    shared_conformance("cntk/Tests/UnitTests/ReaderTests", what)
}

fn manifest() -> Value {
    let p = package_root().join("tests/conformance/cntk_cases.json");
    serde_json::from_str(&std::fs::read_to_string(p).expect("manifest")).expect("json")
}

fn cases(kind: &str) -> Vec<Value> {
    let m = manifest();
    let mut v: Vec<Value> = m["cases"].as_array().expect("cases").clone();
    v.extend(m["inferred_variants"].as_array().cloned().unwrap_or_default());
    v.into_iter().filter(|c| c["kind"] == kind).collect()
}

/// A dataset config for one case; the data file is `data`.
fn config_for(case: &Value, data: &Path, randomize: bool) -> String {
    let chunk = case["chunk_size_bytes"].as_u64().unwrap_or(32 << 20).min(u64::from(u32::MAX));
    let precision = if case["precision"] == "double" { "float64" } else { "float32" };
    let mut s = format!(
        "[datasets.d]\nformat = \"ctf\"\nfiles = [{:?}]\ncache_index = false\nchunk_size_bytes = {chunk}\nmax_errors = {}\n\
         skip_sequence_ids = {}\nprecision = \"{precision}\"\n",
        data.display().to_string(),
        case["max_errors"].as_u64().unwrap_or(0),
        case["skip_sequence_ids"].as_bool().unwrap_or(false),
    );
    write!(s, "[datasets.d.sampling]\nrandomize = {randomize}\nseed = {}\n", case["seed"].as_u64().unwrap_or(0))
        .expect("writing to a String");
    if let Some(n) = case["window"]["chunks"].as_u64() {
        writeln!(s, "window_chunks = {n}").expect("writing to a String");
    } else if let Some(n) = case["window"]["samples"].as_u64() {
        writeln!(s, "window_samples = {n}").expect("writing to a String");
    }
    for st in case["streams"].as_array().expect("streams") {
        write!(
            s,
            "[datasets.d.streams.{}]\nalias = {:?}\ndim = {}\nformat = \"{}\"\ndefines_mb_size = {}\n",
            st["name"].as_str().expect("name"),
            st["alias"].as_str().expect("alias"),
            st["dim"],
            st["format"].as_str().expect("format"),
            st["defines_mb_size"].as_bool().unwrap_or(false),
        )
        .expect("writing to a String");
    }
    s
}

fn open(case: &Value, data: &Path) -> Result<Dataset, String> {
    let randomize = case["randomize"].as_bool().unwrap_or(false) && !case["window"].is_null();
    support::try_open(&config_for(case, data, randomize), "d", Path::new("/"), Path::new("/nonexistent"))
}

/// An offset, index or count (of a minibatch or the manifest) as an index.
fn idx(v: impl TryInto<usize, Error: std::fmt::Debug>) -> usize {
    v.try_into().expect("a non-negative index that fits in memory")
}

/// A float32 value, widened to f64 for the dump, back as the float32 it is (exact).
#[allow(clippy::cast_possible_truncation)] // float32 data: narrowing it back loses nothing
fn as_f32(v: f64) -> f32 {
    v as f32
}

/// The dense values of sample `k` of sequence `q` (sparse converted: zero-filled, last duplicate wins).
fn dense_sample(s: &MbStream, q: usize, k: usize) -> Vec<f64> {
    let j = idx(s.sequence_offsets[q]) + k;
    let get = |v: &Values, i: usize| v.get_f64(i);
    match &s.data {
        MbData::Dense { dim, values } => (j * dim..(j + 1) * dim).map(|i| get(values, i)).collect(),
        MbData::Sparse { dim, sample_offsets, indices, values } => {
            let mut out = vec![0.0; *dim];
            for e in idx(sample_offsets[j])..idx(sample_offsets[j + 1]) {
                let col = match indices {
                    Indices::I32(v) => idx(v[e]),
                    Indices::U64(v) => idx(v[e]),
                };
                out[col] = get(values, e);
            }
            out
        }
        MbData::Strings { .. } => panic!("no strings in CTF"),
    }
}

/// Replays a legacy test and returns its dump text.
fn replay(case: &Value, ds: &Dataset) -> Result<String, String> {
    let double = case["precision"] == "double";
    let epoch = case["epoch_size"].as_u64().expect("epoch_size");
    let mb = idx(case["mb_size"].as_u64().expect("mb_size"));
    let names: Vec<&str> =
        case["streams"].as_array().expect("streams").iter().map(|s| s["name"].as_str().expect("name")).collect();
    let order: Vec<usize> =
        names.iter().map(|n| ds.stream_names().iter().position(|x| x == n).expect("stream in dataset")).collect();
    let shapes = ds.stream_shapes();
    let randomize = case["randomize"].as_bool().unwrap_or(false) && !case["window"].is_null();
    let window = match (case["window"]["chunks"].as_u64(), case["window"]["samples"].as_u64()) {
        (Some(c), _) => Window::Chunks(idx(c)),
        (None, Some(s)) => Window::Samples(s),
        _ => Window::Chunks(128),
    };
    let mut out = String::new();
    for e in 0..case["num_epochs"].as_u64().unwrap_or(1) {
        let options = SamplingOptions {
            randomize,
            window,
            seed: case["seed"].as_u64().unwrap_or(0),
            limit: EpochLimit::Samples((e + 1) * epoch),
            num_workers: idx(case["num_subsets"].as_u64().unwrap_or(1)),
            rank: idx(case["subset_num"].as_u64().unwrap_or(0)),
        };
        let mut sampler = Sampler::new(ds.timeline().clone(), options).map_err(|e| e.to_string())?;
        sampler.restore(e * epoch).map_err(|e| e.to_string())?;
        let mut feeder = Feeder::new(sampler, ds.timeline().clone(), shapes.clone(), false, 0);
        let mut load = |c: u32| ds.load_chunk(c as usize).map(|(parsed, _)| std::sync::Arc::new(parsed));
        for _ in 0..case["max_minibatches_per_epoch"].as_u64().unwrap_or(10) {
            let Some(plan) = feeder.plan(mb) else { break };
            let m = feeder.gather(&plan, &mut load).map_err(|e| e.to_string())?.to_minibatch();
            for &si in &order {
                let s = &m.streams[si];
                let lens: Vec<usize> =
                    (0..s.num_sequences()).map(|q| idx(s.sequence_offsets[q + 1] - s.sequence_offsets[q])).collect();
                let dense: Vec<Vec<Vec<f64>>> =
                    (0..lens.len()).map(|q| (0..lens[q]).map(|k| dense_sample(s, q, k)).collect()).collect();
                if double {
                    legacy_dump::dump_stream(&mut out, &lens, |q, k| dense[q][k].as_slice(), legacy_dump::format_g);
                } else {
                    legacy_dump::dump_stream(
                        &mut out,
                        &lens,
                        |q, k| dense[q][k].as_slice(),
                        |v: f64| legacy_dump::format_g_f32(as_f32(v)),
                    );
                }
            }
        }
    }
    Ok(out)
}

/// Baselines where minibatchd differs from CNTK on purpose (docs/differences.md): the case, the
/// tokens minibatchd prints instead, and why.
const KNOWN_DIFFERENCES: &[(&str, &str, &str)] = &[(
    "CNTKTextFormatReader_blank_lines_ignored",
    "1 2 1",
    "blank lines are not part of a sequence: CNTK counts the blank line into sequence 1 (a sweep of 3 \
     samples, 2 errors), minibatchd ignores it (a sweep of 2), so the 3-sample epoch wraps into sweep 1",
)];

#[test]
fn cntk_dump_baselines() {
    let Some(root) = shared_root("CNTK dump baselines") else { return };
    let data_dir = root.join("Data/CNTKTextFormatReader");
    let control_dir = root.join("Control/CNTKTextFormatReader");
    let (mut passed, mut failures) = (0, Vec::new());
    for case in cases("dump") {
        let name = case["name"].as_str().expect("name").to_owned();
        let data = data_dir.join(case["data_file"].as_str().expect("data_file"));
        let mut expected = match case["control_file"].as_str() {
            Some(c) => std::fs::read_to_string(control_dir.join(c)).expect("control"),
            None => String::new(), // e.g. NoFirstMinibatchData: the worker gets nothing
        };
        if let Some((_, ours, why)) = KNOWN_DIFFERENCES.iter().find(|(n, _, _)| *n == name) {
            println!("known difference in {name}: expecting {ours:?} ({why})");
            expected = (*ours).to_owned();
        }
        let got = open(&case, &data).and_then(|ds| replay(&case, &ds));
        match got {
            Ok(text) if legacy_dump::tokens(&text) == legacy_dump::tokens(&expected) => passed += 1,
            Ok(text) => {
                let (g, x) = (legacy_dump::tokens(&text), legacy_dump::tokens(&expected));
                let at = g.iter().zip(&x).position(|(a, b)| a != b).unwrap_or(g.len().min(x.len()));
                failures.push(format!(
                    "{name}: {} tokens vs {} expected; first difference at token {at}: got {:?}, expected {:?}",
                    g.len(),
                    x.len(),
                    g.get(at),
                    x.get(at)
                ));
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    println!("CNTK dump baselines: {passed} passed, {} failed", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn cntk_error_cases() {
    let Some(root) = shared_root("CNTK error cases") else { return };
    let data_dir = root.join("Data/CNTKTextFormatReader");
    for case in cases("error") {
        let name = case["name"].as_str().expect("name");
        let data = data_dir.join(case["data_file"].as_str().expect("data_file"));
        let result = open(&case, &data).and_then(|ds| replay(&case, &ds));
        if name.starts_with("CNTKTextFormatReader_blank_lines") {
            // Deliberate difference (docs/differences.md): blank lines are ignored, so the file
            // that CNTK rejects reads as its two samples.
            let text = result.unwrap_or_else(|e| panic!("{name}: {e}"));
            let mut t = legacy_dump::tokens(&text);
            t.sort_unstable();
            assert_eq!(t, vec!["1", "2"], "{name}");
        } else {
            let e = result.err().unwrap_or_else(|| panic!("{name}: expected an error"));
            assert!(
                e.contains("maximum number of allowed errors")
                    && e.contains(data.file_name().and_then(|n| n.to_str()).unwrap_or("?")),
                "{name}: {e}"
            );
        }
    }
}

fn inline(case: &Value) -> Result<Vec<f64>, String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = write(
        dir.path(),
        case["inline_file_name"].as_str().unwrap_or("inline.txt"),
        case["inline_data"].as_str().expect("inline_data"),
    );
    let mut c = case.clone();
    c["num_epochs"] = 1.into();
    c["epoch_size"] = 1.into();
    c["mb_size"] = 1.into();
    c["max_minibatches_per_epoch"] = 1.into();
    let ds = open(&c, &data)?;
    let text = replay(&c, &ds)?;
    Ok(legacy_dump::tokens(&text).iter().map(|t| t.parse::<f64>().expect("number")).collect())
}

#[test]
fn cntk_no_trailing_newline_cases() {
    for case in cases("parser_value") {
        let want = case["expected_value"].as_f64().expect("expected_value");
        let got = inline(&case).unwrap_or_else(|e| panic!("{}: {e}", case["variant"]));
        assert_eq!(got.len(), 1, "{}", case["variant"]);
        assert!((got[0] - want).abs() <= 1e-7 * want.abs().max(1e-300), "{}: {} vs {want}", case["variant"], got[0]);
    }
    for case in cases("parser_error") {
        // `|A`, `|A\t`, `|A `, `|A     ` at the end of the file: a dangling name or a dense
        // sample without a value there, 1 error each, as in CNTK 2.7.
        let data = case["inline_data"].as_str().expect("inline_data");
        let e = inline(&case).expect_err(data);
        assert!(e.contains("maximum number of allowed errors"), "{data:?}: {e}");
    }
}
