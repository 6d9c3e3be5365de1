//! CNTK 2.7 parity corpus: `tests/parity/cases/*.json`, each a random case recorded by
//! `scripts/oracle/cntk_diff.py --record` from the real CNTK 2.7 (`docs/parity.md`). A fixture holds the
//! CTF data, the minibatchd config, the `minibatchd dump` arguments and CNTK's answer in the
//! harness's canonical form; this test runs the real binary on it and compares, without CNTK:
//! positions, `end_of_sweep`, per-stream sample and sequence counts, values (dense within 1 ulp
//! of float32; sparse after CNTK's Value -> scipy normalization: duplicate indices summed,
//! indices sorted, zeros dropped) and the end (limit, empty, or a fatal error).
//!
//! Where CNTK is inconsistent with itself over part of a run (it re-shuffles after a seek, re-counts
//! errors, joins by a wrong key, repeats a sequence within a sweep), the fixture's `compare` says
//! how many leading minibatches are compared: the part where CNTK is still consistent.

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::Value;
use support::{command, package_root, parse_dump, write};

#[derive(Deserialize)]
struct Fixture {
    name: String,
    status: String,
    files: BTreeMap<String, String>,
    config: String,
    dataset: String,
    args: Vec<String>,
    sparse: Vec<String>,
    compare: Option<usize>,
    end: String,
    expected: Vec<Expected>,
}

#[derive(Deserialize)]
struct Expected {
    position: u64,
    end_of_sweep: Option<bool>,
    streams: BTreeMap<String, ExpectedStream>,
}

#[derive(Deserialize)]
struct ExpectedStream {
    num_samples: u64,
    num_sequences: u64,
    sequences: Value,
}

/// Whether two numbers are the same float32 within one unit in the last place.
#[allow(clippy::float_cmp)] // an infinity matches only the same infinity, exactly
fn f32_close(a: f64, b: f64) -> bool {
    #[allow(clippy::cast_possible_truncation)] // the values are float32 on both sides
    let (a, b) = (a as f32, b as f32);
    if a.is_nan() || b.is_nan() {
        return a.is_nan() && b.is_nan();
    }
    if a.is_infinite() || b.is_infinite() {
        return a == b;
    }
    let ordered = |x: f32| {
        let bits = i64::from(x.to_bits().cast_signed());
        if bits < 0 {
            -(bits & 0x7FFF_FFFF)
        } else {
            bits
        }
    };
    (ordered(a) - ordered(b)).abs() <= 1
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// A sparse sample of `dump` ({"indices", "values"}) in CNTK's normalized form: indices,
/// values, and per index the sum of the absolute values added up (the rounding bound of a sum
/// done in another order).
fn normalize_sparse(sample: &Value) -> (Vec<u64>, Vec<f64>, Vec<f64>) {
    let mut acc: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    let indices = sample["indices"].as_array().cloned().unwrap_or_default();
    let values = sample["values"].as_array().cloned().unwrap_or_default();
    for (i, v) in indices.iter().zip(&values) {
        let e = acc.entry(i.as_u64().unwrap_or(u64::MAX)).or_insert((0.0, 0.0));
        e.0 += num(v);
        e.1 += num(v).abs();
    }
    #[allow(clippy::cast_possible_truncation)]
    let kept: Vec<(u64, (f64, f64))> = acc.into_iter().filter(|(_, (v, _))| (*v as f32) != 0.0).collect();
    (
        kept.iter().map(|(i, _)| *i).collect(),
        kept.iter().map(|(_, (v, _))| *v).collect(),
        kept.iter().map(|(_, (_, m))| *m).collect(),
    )
}

fn compare_sequences(expected: &Value, ours: &Value, sparse: bool) -> Result<(), String> {
    let (e, o) = (expected.as_array().ok_or("expected sequences")?, ours.as_array().ok_or("our sequences")?);
    if e.len() != o.len() {
        return Err(format!("{} sequences (CNTK) vs {}", e.len(), o.len()));
    }
    for (qi, (eq, oq)) in e.iter().zip(o).enumerate() {
        let (eq, oq) = (eq.as_array().ok_or("sequence")?, oq.as_array().ok_or("sequence")?);
        if eq.len() != oq.len() {
            return Err(format!("sequence {qi}: {} samples (CNTK) vs {}", eq.len(), oq.len()));
        }
        for (si, (es, os)) in eq.iter().zip(oq).enumerate() {
            let same = if sparse {
                let (idx, val, mag) = normalize_sparse(os);
                let e_idx: Vec<u64> =
                    es[0].as_array().map(|a| a.iter().filter_map(Value::as_u64).collect()).unwrap_or_default();
                let e_val: Vec<f64> = es[1].as_array().map(|a| a.iter().map(num).collect()).unwrap_or_default();
                let e_mag: Vec<f64> = es[2].as_array().map(|a| a.iter().map(num).collect()).unwrap_or_default();
                e_idx == idx
                    && e_val.len() == val.len()
                    && e_val
                        .iter()
                        .zip(&val)
                        .zip(e_mag.iter().zip(&mag))
                        .all(|((a, b), (ma, mb))| f32_close(*a, *b) || (a - b).abs() <= 4e-7 * ma.max(*mb))
            } else {
                let (ev, ov) = (es.as_array().ok_or("sample")?, os.as_array().ok_or("sample")?);
                ev.len() == ov.len() && ev.iter().zip(ov).all(|(a, b)| f32_close(num(a), num(b)))
            };
            if !same {
                return Err(format!("sequence {qi} sample {si}: {es} (CNTK) vs {os}"));
            }
        }
    }
    Ok(())
}

fn compare_minibatch(f: &Fixture, i: usize, e: &Expected, o: &Value) -> Result<(), String> {
    if o["position"].as_u64() != Some(e.position) {
        return Err(format!("mb {i}: position {} (CNTK) vs {}", e.position, o["position"]));
    }
    if let Some(eos) = e.end_of_sweep {
        if o["end_of_sweep"].as_bool() != Some(eos) {
            return Err(format!("mb {i}: end_of_sweep {eos} (CNTK) vs {}", o["end_of_sweep"]));
        }
    }
    for (name, es) in &e.streams {
        let os = &o["streams"][name.as_str()];
        let counts = (os["num_samples"].as_u64(), os["num_sequences"].as_u64());
        if counts != (Some(es.num_samples), Some(es.num_sequences)) {
            return Err(format!(
                "mb {i} stream {name}: samples/sequences {}/{} (CNTK) vs {:?}",
                es.num_samples, es.num_sequences, counts
            ));
        }
        compare_sequences(&es.sequences, &os["sequences"], f.sparse.contains(name))
            .map_err(|m| format!("mb {i} stream {name}: {m}"))?;
    }
    Ok(())
}

fn run_fixture(f: &Fixture) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    for (name, text) in &f.files {
        write(dir.path(), name, text);
    }
    let config = write(dir.path(), "config.toml", &f.config);
    // Twice on the same files and state: the second run reads the chunks the first persisted
    // (the parsed cache) and must give CNTK's answer all the same.
    check_run(f, &config).map_err(|e| format!("cold: {e}"))?;
    check_run(f, &config).map_err(|e| format!("from the persisted parsed chunks: {e}"))
}

fn check_run(f: &Fixture, config: &std::path::Path) -> Result<(), String> {
    let out = command("dump", config, &f.dataset)
        .args(&f.args)
        .env("MINIBATCHD_LOG", "error")
        .output()
        .map_err(|e| format!("cannot run minibatchd: {e}"))?;
    let mut ours = parse_dump(&String::from_utf8_lossy(&out.stdout))?;
    let mut our_end = if out.status.success() { "limit" } else { "error" };
    // CNTK returns an empty minibatch (and the recording stops) when this worker has no data
    // left; dump prints an empty minibatch and goes on.
    if let Some(cut) = ours.iter().position(|m| {
        m["streams"].as_object().is_some_and(|s| s.values().all(|v| v["num_sequences"].as_u64() == Some(0)))
    }) {
        ours.truncate(cut);
        our_end = "empty";
    }
    if f.compare == Some(0) {
        return Err("the fixture compares nothing".into());
    }
    let n = f.compare.unwrap_or(usize::MAX);
    for (i, (e, o)) in f.expected.iter().zip(&ours).take(n).enumerate() {
        compare_minibatch(f, i, e, o)?;
    }
    if let Some(n) = f.compare {
        if f.expected.len().min(n) != ours.len().min(n) {
            return Err(format!("{} minibatches (CNTK) vs {} within the first {n}", f.expected.len(), ours.len()));
        }
        return Ok(());
    }
    if f.end == "error" && our_end == "error" && ours.len() >= f.expected.len() {
        // A fatal data error surfaces in CNTK when it loads the chunk ahead of time
        // (docs/differences.md); minibatchd stops at the minibatch that needs it.
        return Ok(());
    }
    if ours.len() != f.expected.len() || (f.end == "error") != (our_end == "error") {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "{} minibatches ending {} (CNTK) vs {} ending {our_end}; stderr: {}",
            f.expected.len(),
            f.end,
            ours.len(),
            stderr.lines().last().unwrap_or("")
        ));
    }
    Ok(())
}

fn load_corpus() -> Vec<Fixture> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(package_root().join("tests/parity/cases"))
        .expect("tests/parity/cases")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        })
        .collect()
}

#[test]
fn the_recorded_cntk_answers_are_reproduced() {
    let fixtures = load_corpus();
    assert!(fixtures.len() >= 200, "the corpus holds {} cases; expected at least 200", fixtures.len());
    let mut failures = Vec::new();
    for f in &fixtures {
        if let Err(e) = run_fixture(f) {
            failures.push(format!("{} [{}]: {e}", f.name, f.status));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} parity cases differ:\n{}",
        failures.len(),
        fixtures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_corpus_covers_every_kind_of_case() {
    let fixtures = load_corpus();
    let count = |pred: &dyn Fn(&Fixture) -> bool| fixtures.iter().filter(|f| pred(f)).count();
    let has = |f: &Fixture, arg: &str| f.args.iter().any(|a| a == arg);
    let workers = |f: &Fixture| {
        f.args.iter().position(|a| a == "--workers").and_then(|i| f.args.get(i + 1)).is_some_and(|w| w != "1")
    };
    let kinds = [
        ("several workers", count(&|f| workers(f))),
        ("window in samples", count(&|f| has(f, "--window-samples"))),
        ("window in chunks", count(&|f| has(f, "--window-chunks"))),
        ("sequential", count(&|f| f.args.windows(2).any(|w| w[0] == "--randomize" && w[1] == "false"))),
        ("restore at start", count(&|f| has(f, "--restore"))),
        ("restore mid-run", count(&|f| has(f, "--restore-before"))),
        ("several sweeps", count(&|f| f.args.windows(2).any(|w| w[0] == "--max-sweeps" && w[1] != "1"))),
        ("several sources", count(&|f| f.config.contains("[[datasets.d.sources]]"))),
        ("frame mode", count(&|f| has(f, "--frame-mode"))),
        ("defines_mb_size", count(&|f| f.config.contains("defines_mb_size"))),
        ("sparse streams", count(&|f| !f.sparse.is_empty())),
        ("CRLF", count(&|f| f.files.values().any(|t| t.contains("\r\n")))),
        ("CNTK inconsistent, prefix compared", count(&|f| f.compare.is_some())),
    ];
    for (kind, n) in kinds {
        assert!(n >= 3, "only {n} parity cases of kind {kind:?}");
    }
}
