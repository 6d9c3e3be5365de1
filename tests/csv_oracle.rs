//! TensorFlow's answers on random CSV files, replayed against `minibatchd dump` (issue 39). The
//! corpus in `tests/fixtures_csv` was read by TensorFlow itself (`scripts/oracle/tf_csv.py`, which
//! records it and runs this test): `TextLineDataset` after the header lines, then `decode_csv`
//! of each line with the case's delimiter, quoting and `na_value`, a default or a required
//! column per stream column; per record TensorFlow's values or its error.
//!
//! Record by record: where TensorFlow decodes a line, minibatchd serves the same values (floats
//! bitwise once cast to the dataset's precision, infinities and NaN included; integers
//! exactly); where TensorFlow refuses it, minibatchd leaves it out and reports it (an empty
//! sequence, charged to `max_errors`). One deliberate difference (`docs/differences.md`),
//! checked as an error, never as data: an integer the dataset's precision cannot hold exactly.

mod support;

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;
use support::{parse_dump, write};

const CORPUS: &str = "tests/fixtures_csv";
/// Text columns read as `string` streams too (`scripts/oracle/tf_csv.py --kinds strings`).
const TEXT_CORPUS: &str = "tests/fixtures_csv_text";

fn config(dir: &Path, data: &Path, case: &Value) -> std::path::PathBuf {
    let mut toml = format!(
        "[daemon]\nstate_dir = \"{}\"\n[datasets.c]\nformat = \"csv\"\nfiles = [\"{}\"]\nmax_errors = 1000000\n\
         precision = \"{}\"\ncolumns = {}\nfield_delim = {}\nuse_quote_delim = {}\nna_value = {}\nskip_header_lines = {}\n",
        dir.join("state").display(),
        data.display(),
        case["precision"].as_str().expect("precision"),
        case["columns"],
        case["field_delim"],
        case["use_quote_delim"],
        case["na_value"],
        case["skip_header_lines"],
    );
    for s in case["streams"].as_array().expect("streams") {
        writeln!(
            toml,
            "[datasets.c.streams.{}]\ndtype = {}\ncolumns = {}",
            s["name"].as_str().expect("name"),
            s["dtype"],
            s["columns"]
        )
        .expect("write");
        if let Some(d) = s.get("default") {
            writeln!(toml, "default = {d}").expect("write");
        }
    }
    write(dir, "c.toml", toml)
}

/// `dump`'s non-finite numbers (`Infinity`, `-Infinity`, `NaN`, which Python reads) as JSON
/// strings, so that serde reads the lines.
fn finite_json(text: &str) -> String {
    text.replace("-Infinity", "\"-inf\"").replace("Infinity", "\"inf\"").replace("NaN", "\"nan\"")
}

fn number(v: &Value) -> f64 {
    match v.as_str() {
        Some("inf") => f64::INFINITY,
        Some("-inf") => f64::NEG_INFINITY,
        Some("nan") => f64::NAN,
        _ => v.as_f64().expect("a number"),
    }
}

/// The bits of `x` once stored in `precision` (f64 bits of the f32 or f64 value), NaN as one.
fn stored_bits(x: f64, precision: &str) -> u64 {
    if x.is_nan() {
        return f64::NAN.to_bits();
    }
    #[allow(clippy::cast_possible_truncation)]
    let stored = if precision == "float32" { f64::from(x as f32) } else { x };
    stored.to_bits()
}

/// Whether minibatchd refuses TensorFlow's integer `v` in `precision` (not exactly held).
fn inexact(v: i64, precision: &str) -> bool {
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    let held = if precision == "float32" { f64::from(v as f32) as i128 } else { v as f64 as i128 };
    held != i128::from(v)
}

#[test]
fn minibatchd_reads_csv_as_tensorflow_does() {
    let (same, tf_refused) = check_corpus(CORPUS);
    assert!(same > 200 && tf_refused > 50, "the corpus exercises too little");
}

/// `string` columns: each field's bytes exactly as TensorFlow's `decode_csv` gives them.
#[test]
fn minibatchd_reads_csv_string_columns_as_tensorflow_does() {
    let (same, tf_refused) = check_corpus(TEXT_CORPUS);
    assert!(same > 200 && tf_refused > 50, "the corpus exercises too little");
}

/// Replays `corpus`; returns the records read as TensorFlow reads them and those refused as it
/// refuses them.
#[allow(clippy::too_many_lines)]
fn check_corpus(corpus: &str) -> (usize, usize) {
    let cases = support::oracle_cases(corpus, 50);
    let (mut same, mut tf_refused, mut by_design) = (0, 0, 0);
    for dir in cases {
        let case: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).expect("case.json")).expect("JSON");
        let tmp = tempfile::tempdir().expect("temp dir");
        let c = config(tmp.path(), &dir.join("data.csv"), &case);
        let out = support::command("dump", &c, "c")
            .args(["--minibatch-size", "1000", "--full-sweep", "--randomize", "false"])
            .output()
            .expect("run minibatchd");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let records = case["records"].as_array().expect("records");
        let streams = case["streams"].as_array().expect("streams");
        if records.is_empty() || streams.is_empty() {
            // No record or no stream: a dataset of nothing, which minibatchd refuses.
            assert!(!out.status.success(), "{}: {stderr}", dir.display());
            continue;
        }
        assert!(out.status.success(), "{}: {stderr}", dir.display());
        let mbs = parse_dump(&finite_json(&String::from_utf8_lossy(&out.stdout))).expect("dump's JSON");
        let precision = case["precision"].as_str().expect("precision");
        for s in streams {
            let name = s["name"].as_str().expect("name");
            let got: Vec<Value> = mbs
                .iter()
                .flat_map(|m| m["streams"][name]["sequences"].as_array().expect("sequences").clone())
                .collect();
            assert_eq!(got.len(), records.len(), "{}: records of {name}", dir.display());
        }
        for (r, tf) in records.iter().enumerate() {
            let refused_by_design = tf.get("values").is_some_and(|values| {
                streams.iter().filter(|s| s["dtype"].as_str().expect("dtype").starts_with("int")).any(|s| {
                    s["columns"]
                        .as_array()
                        .expect("columns")
                        .iter()
                        .any(|c| inexact(values[c.to_string()].as_i64().expect("int"), precision))
                })
            });
            for s in streams {
                let name = s["name"].as_str().expect("name");
                let seq = mbs
                    .iter()
                    .flat_map(|m| m["streams"][name]["sequences"].as_array().expect("sequences").clone())
                    .nth(r)
                    .expect("record");
                let samples = seq.as_array().expect("samples");
                let Some(values) = tf.get("values").filter(|_| !refused_by_design) else {
                    assert!(
                        samples.is_empty(),
                        "{}: record {r} ({tf}) must be left out: {seq}; {stderr}",
                        dir.display()
                    );
                    continue;
                };
                if s["dtype"] == "string" {
                    // A sample a column, its bytes as TensorFlow's.
                    let columns = s["columns"].as_array().expect("columns");
                    let got: Vec<String> = samples.iter().map(|v| support::hex(&support::dump_bytes(v))).collect();
                    let want: Vec<&str> =
                        columns.iter().map(|c| values[c.to_string()].as_str().expect("hex")).collect();
                    assert_eq!(got, want, "{}: record {r}, stream {name}; {stderr}", dir.display());
                    continue;
                }
                assert_eq!(samples.len(), 1, "{}: record {r} ({tf}): {seq}; {stderr}", dir.display());
                for (k, c) in s["columns"].as_array().expect("columns").iter().enumerate() {
                    let want = &values[c.to_string()];
                    let got = number(&samples[0][k]);
                    let want = if s["dtype"].as_str().expect("dtype").starts_with("float") {
                        f64::from_bits(want.as_u64().expect("bits"))
                    } else {
                        #[allow(clippy::cast_precision_loss)]
                        let i = want.as_i64().expect("int") as f64;
                        i
                    };
                    assert_eq!(
                        stored_bits(got, precision),
                        stored_bits(want, precision),
                        "{}: record {r}, column {c}: {got} vs {want}",
                        dir.display()
                    );
                }
            }
            match (tf.get("values"), refused_by_design) {
                (Some(_), false) => same += 1,
                (Some(_), true) => by_design += 1,
                (None, _) => tf_refused += 1,
            }
        }
    }
    println!(
        "{corpus}: {same} records as TensorFlow, {tf_refused} refused as TensorFlow refuses them, {by_design} refused \
         by design"
    );
    (same, tf_refused)
}
