//! TensorFlow's answers on random fixed-length record files, replayed against `minibatchd dump`
//! (issue 39). The corpus in `tests/fixtures_fixed` was read by TensorFlow itself
//! (`scripts/oracle/tf_fixed.py`, which records it and runs this test): per case the layout
//! (`record_bytes`, `header_bytes`, `footer_bytes`), the streams (`decode_raw` type, offset,
//! dim, byte order), the precision, and per record and stream TensorFlow's values — or the
//! error with which TensorFlow refuses the file.
//!
//! Record by record: floats bitwise once cast to the dataset's precision, integers exactly. One
//! deliberate difference (`docs/differences.md`), checked here as an error, never as data: an
//! integer the dataset's precision cannot hold exactly makes its record a malformed place (a
//! sequence of 0 samples, charged to `max_errors`), where TensorFlow would give the integer and
//! leave the rounding to a later cast.

mod support;

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;
use support::{parse_dump, write};

const CORPUS: &str = "tests/fixtures_fixed";

fn config(dir: &Path, data: &Path, case: &Value) -> std::path::PathBuf {
    let mut toml = format!(
        "[daemon]\nstate_dir = \"{}\"\n[datasets.f]\nformat = \"fixed_length\"\nfiles = [\"{}\"]\nmax_errors = 1000000\n\
         precision = \"{}\"\nrecord_bytes = {}\nheader_bytes = {}\nfooter_bytes = {}\n",
        dir.join("state").display(),
        data.display(),
        case["precision"].as_str().expect("precision"),
        case["record_bytes"],
        case["header_bytes"],
        case["footer_bytes"]
    );
    for s in case["streams"].as_array().expect("streams") {
        writeln!(
            toml,
            "[datasets.f.streams.{}]\ndtype = {}\noffset = {}\ndim = {}\nlittle_endian = {}",
            s["name"].as_str().expect("name"),
            s["dtype"],
            s["offset"],
            s["dim"],
            s["little_endian"]
        )
        .expect("write");
    }
    write(dir, "c.toml", toml)
}

/// Whether minibatchd must refuse TensorFlow's integer `v` in `precision` (not exactly held).
fn inexact(v: &Value, precision: &str) -> bool {
    let i = v.as_i64().map(i128::from).or_else(|| v.as_u64().map(i128::from)).expect("an integer");
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    let held = if precision == "float32" { f64::from(i as f32) as i128 } else { i as f64 as i128 };
    held != i
}

/// TensorFlow's value `v` of a `dtype` stream as minibatchd stores it in `precision`, as bits of
/// the printed number read back (f64 bits of the f32 or f64 value).
fn expected_bits(v: &Value, dtype: &str, precision: &str) -> u64 {
    let wide = if dtype.starts_with("float") || dtype == "bfloat16" {
        f64::from_bits(v.as_u64().expect("float bits"))
    } else {
        #[allow(clippy::cast_precision_loss)]
        let x = v.as_i64().map_or_else(|| v.as_u64().expect("an integer") as f64, |i| i as f64);
        x
    };
    #[allow(clippy::cast_possible_truncation)]
    let stored = if precision == "float32" { f64::from(wide as f32) } else { wide };
    stored.to_bits()
}

#[test]
fn minibatchd_reads_fixed_length_records_as_tensorflow_does() {
    let cases = support::oracle_cases(CORPUS, 30);
    let (mut records_checked, mut refused_files, mut refused_records) = (0, 0, 0);
    for dir in cases {
        let case: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).expect("case.json")).expect("JSON");
        let tmp = tempfile::tempdir().expect("temp dir");
        let c = config(tmp.path(), &dir.join("data.bin"), &case);
        let out = support::command("dump", &c, "f")
            .args(["--minibatch-size", "1000", "--full-sweep", "--randomize", "false"])
            .output()
            .expect("run minibatchd");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if let Some(e) = case.get("file_error") {
            assert_eq!(
                out.status.code(),
                Some(1),
                "{}: TensorFlow refuses the file ({e}); minibatchd said {stderr}",
                dir.display()
            );
            assert!(stderr.contains("data.bin"), "{}: the error names the file: {stderr}", dir.display());
            refused_files += 1;
            continue;
        }
        assert!(out.status.success(), "{}: {stderr}", dir.display());
        let mbs = parse_dump(&String::from_utf8_lossy(&out.stdout)).expect("dump's JSON");
        let precision = case["precision"].as_str().expect("precision");
        let tf_records = case["records"].as_array().expect("records");
        let streams = case["streams"].as_array().expect("streams");
        for s in streams {
            let name = s["name"].as_str().expect("name");
            let got: Vec<Value> = mbs
                .iter()
                .flat_map(|m| m["streams"][name]["sequences"].as_array().expect("sequences").clone())
                .collect();
            assert_eq!(got.len(), tf_records.len(), "{}: records of {name}", dir.display());
            for (r, (seq, tf)) in got.iter().zip(tf_records).enumerate() {
                let refused = streams.iter().any(|t| {
                    !t["dtype"].as_str().expect("dtype").contains("float")
                        && tf[t["name"].as_str().expect("name")]
                            .as_array()
                            .expect("values")
                            .iter()
                            .any(|v| inexact(v, precision))
                });
                let samples = seq.as_array().expect("samples");
                if refused {
                    assert!(
                        samples.is_empty(),
                        "{}: record {r} holds an integer {precision} cannot hold: {seq}",
                        dir.display()
                    );
                    refused_records += 1;
                    continue;
                }
                assert_eq!(
                    samples.len(),
                    1,
                    "{}: record {r} of {name}: {seq} (TensorFlow: {tf}); {stderr}",
                    dir.display()
                );
                let values = samples[0].as_array().expect("values");
                let want = tf[name].as_array().expect("values");
                assert_eq!(values.len(), want.len(), "{}: record {r}, {name}", dir.display());
                for (g, w) in values.iter().zip(want) {
                    let g = g.as_f64().expect("a number");
                    #[allow(clippy::cast_possible_truncation)]
                    let g_bits = if precision == "float32" { f64::from(g as f32).to_bits() } else { g.to_bits() };
                    assert_eq!(
                        g_bits,
                        expected_bits(w, s["dtype"].as_str().expect("dtype"), precision),
                        "{}: record {r}, {name}: {g} vs {w}",
                        dir.display()
                    );
                }
                records_checked += 1;
            }
        }
        if streams.iter().any(|_| true) && tf_records.iter().any(|_| true) {
            assert!(stderr.is_empty() || refused_records > 0, "{}: {stderr}", dir.display());
        }
    }
    println!("{records_checked} record streams as TensorFlow, {refused_records} refused by design, {refused_files} files refused as TensorFlow does");
    assert!(records_checked > 100 && refused_files >= 2, "the corpus exercises too little");
}
