//! TensorFlow's answers on random TFRecord files of `tf.train.Example`s, replayed against
//! `minibatchd dump` (issue 39). The corpus in `tests/fixtures_tfrecord` was written and read by
//! TensorFlow itself (`scripts/oracle/tf_diff.py`, which records it and runs this test): per
//! case the streams' features, the dataset's precision, and per record TensorFlow's values (float
//! bits, exact integers) or its error, or the record where TensorFlow stops reading a damaged
//! file. A second corpus (`tests/fixtures_tfrecord_seq`, `--kinds sequence`) adds bytes features
//! (their strings compared byte for byte, as hex) and sequences.
//!
//! Record by record: where TensorFlow parses a record, minibatchd serves the same values, floats
//! bitwise; where TensorFlow refuses a record, minibatchd leaves it out and reports it (an empty
//! sequence, charged to `max_errors`). Deliberate differences (`docs/differences.md`), each
//! checked here as an error, never as data: an int64 value the dataset's precision cannot hold
//! exactly, and more values in a var-length feature than its stream's `dim`. A damaged file:
//! TensorFlow stops at the damaged record; minibatchd reports that record (its number and byte
//! offset) — refusing the whole file when the framing is damaged, or leaving the record out when
//! only its data fails its CRC. A file cut inside a record's header: TensorFlow ends it there
//! without a word; minibatchd refuses it (deliberate).

mod support;

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;
use support::{parse_dump, write};

const CORPUS: &str = "tests/fixtures_tfrecord";
/// Bytes features (fixed-length and sequences) and numeric sequences
/// (`scripts/oracle/tf_diff.py --kinds sequence`).
const SEQUENCE_CORPUS: &str = "tests/fixtures_tfrecord_seq";

fn config(dir: &Path, data: &Path, case: &Value) -> std::path::PathBuf {
    let mut toml = format!(
        "[daemon]\nstate_dir = \"{}\"\n[datasets.t]\nformat = \"tfrecord\"\nfiles = [\"{}\"]\nmax_errors = 1000000\nprecision = \"{}\"\n",
        dir.join("state").display(),
        data.display(),
        case["precision"].as_str().expect("precision")
    );
    // A ZLIB file has no magic to be recognised by: the dataset says so, as TensorFlow's reader
    // is told.
    if data.extension().is_some_and(|e| e == "zlib") {
        toml.push_str("compression = \"zlib\"\n");
    }
    for f in case["features"].as_array().expect("features") {
        let stream = f["stream"].as_str().expect("stream");
        let (key, dtype, format, dim) = (&f["key"], &f["dtype"], &f["format"], &f["dim"]);
        writeln!(
            toml,
            "[datasets.t.streams.{stream}]\nfeature = {key}\ndtype = {dtype}\nformat = {format}\ndim = {dim}"
        )
        .expect("write");
        if let Some(d) = f.get("default") {
            writeln!(toml, "default = {d}").expect("write");
        }
    }
    write(dir, "c.toml", toml)
}

/// Per stream, its sequences in record order: each a list of values (empty for a record left
/// out).
fn sequences(mbs: &[Value], stream: &str, sparse: bool) -> Vec<Vec<f64>> {
    mbs.iter()
        .flat_map(|m| m["streams"][stream]["sequences"].as_array().expect("sequences").clone())
        .map(|seq| {
            let samples = seq.as_array().expect("samples");
            samples
                .iter()
                .flat_map(|s| {
                    let values = if sparse { &s["values"] } else { s };
                    values.as_array().expect("values").iter().map(|v| v.as_f64().expect("number")).collect::<Vec<_>>()
                })
                .collect()
        })
        .collect()
}

/// Per bytes stream, its sequences in record order: each a list of its byte strings as hex (a
/// sample is a JSON string of UTF-8 bytes, or `{"hex": …}`).
fn byte_sequences(mbs: &[Value], stream: &str) -> Vec<Vec<String>> {
    mbs.iter()
        .flat_map(|m| m["streams"][stream]["sequences"].as_array().expect("sequences").clone())
        .map(|seq| {
            let samples = seq.as_array().expect("samples");
            samples.iter().map(|s| support::hex(&support::dump_bytes(s))).collect()
        })
        .collect()
}

/// Whether TensorFlow's `values` of a feature are a deliberate difference: minibatchd refuses
/// them (an int64 the precision does not hold exactly, more values than a sparse stream's dim).
fn refused_by_design(f: &Value, values: &[Value], precision: &str) -> bool {
    let limit: i128 = if precision == "float32" { 1 << 24 } else { 1 << 53 };
    let too_many = f["format"] == "sparse" && values.len() as u64 > f["dim"].as_u64().expect("dim");
    let inexact = f["dtype"] == "int64"
        && values.iter().any(|v| {
            let i = i128::from(v.as_i64().expect("int"));
            i.abs() > limit && {
                // Exact anyway when the float holds it (a power of two times a short mantissa).
                #[allow(clippy::cast_precision_loss)]
                let wide = i as f64;
                #[allow(clippy::cast_possible_truncation)]
                let narrow = if precision == "float32" { f64::from(wide as f32) } else { wide };
                #[allow(clippy::cast_possible_truncation)]
                let back = narrow as i128;
                back != i
            }
        });
    too_many || inexact
}

/// Whether minibatchd's values `have` of numeric feature `f` are TensorFlow's `want`: floats
/// bitwise (and, in float64, exactly the float32 widened), integers exactly.
fn same_numbers(f: &Value, have: &[f64], want: &[Value], precision: &str) -> Result<(), String> {
    for (h, w) in have.iter().zip(want) {
        let same = if f["dtype"] == "float32" {
            #[allow(clippy::cast_possible_truncation)]
            let bits = (*h as f32).to_bits();
            Some(u64::from(bits)) == w.as_u64()
                && (precision != "float64" || f64::from(f32::from_bits(bits)).to_bits() == h.to_bits())
        } else {
            // An integer exactly: the float has no fraction and is the value.
            #[allow(clippy::cast_possible_truncation)]
            let (i, wide) = (*h as i64, *h as i128);
            Some(i) == w.as_i64() && h.fract() == 0.0 && i128::from(i) == wide
        };
        if !same {
            return Err(format!("{h} where TensorFlow has {w}"));
        }
    }
    Ok(())
}

fn check_case(dir: &Path) -> Result<(), String> {
    let case: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    let cfg = config(work.path(), &dir.join(case["file"].as_str().unwrap_or("data.tfrecord")), &case);
    let out = support::command("dump", &cfg, "t")
        .args(["--minibatch-size", "1000", "--full-sweep", "--randomize", "false"])
        .output()
        .map_err(|e| e.to_string())?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let precision = case["precision"].as_str().unwrap_or("float32");
    let records = case["records"].as_array().ok_or("records")?;
    let features = case["features"].as_array().ok_or("features")?;
    if let Some(stopped) = case["stopped"].as_object() {
        // TensorFlow read `k` records and refused the file at the next one.
        let k = stopped["after_records"].as_u64().ok_or("after_records")?;
        let tf = stopped["error"].as_str().unwrap_or("");
        let named = stderr.contains(&format!("corrupted record {}", k + 1))
            || stderr.contains(&format!("ends inside record {}", k + 1));
        if !named {
            return Err(format!("TensorFlow stopped at record {} ({tf}); minibatchd said: {stderr}", k + 1));
        }
        if let Some(at) = tf.split("record at ").nth(1).and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next()) {
            if !stderr.contains(&format!("byte offset {at}")) {
                return Err(format!("TensorFlow names byte offset {at} ({tf}); minibatchd: {stderr}"));
            }
        }
        if !out.status.success() {
            return Ok(()); // the framing is damaged: the whole file is refused, never read astray
        }
    } else if !out.status.success() {
        // Deliberate: a file cut inside a record's header ends there for TensorFlow, silently;
        // minibatchd refuses it, naming that record.
        let cut = case["damage"].get("cut_to").is_some();
        if cut && stderr.contains(&format!("ends inside record {}'s header", records.len() + 1)) {
            return Ok(());
        }
        return Err(format!("dump failed: {stderr}"));
    }
    let mbs = parse_dump(&String::from_utf8_lossy(&out.stdout))?;
    let got: Vec<Vec<Vec<f64>>> = features
        .iter()
        .map(|f| match f["dtype"].as_str() {
            Some("bytes") => Vec::new(),
            _ => sequences(&mbs, f["stream"].as_str().unwrap_or(""), f["format"] == "sparse"),
        })
        .collect();
    let got_bytes: Vec<Vec<Vec<String>>> = features
        .iter()
        .map(|f| match f["dtype"].as_str() {
            Some("bytes") => byte_sequences(&mbs, f["stream"].as_str().unwrap_or("")),
            _ => Vec::new(),
        })
        .collect();
    let is_bytes = |f: &Value| f["dtype"] == "bytes";
    // A record's sequence in stream `k` is empty (left out, or no values).
    let empty =
        |k: usize, r: usize| got[k].get(r).is_none_or(Vec::is_empty) && got_bytes[k].get(r).is_none_or(Vec::is_empty);
    for (r, answer) in records.iter().enumerate() {
        let what = |f: &Value| format!("record {} stream {}", r + 1, f["stream"]);
        let left_out = (0..features.len()).all(|k| empty(k, r));
        let Some(values) = answer["values"].as_object() else {
            // TensorFlow refuses the record: minibatchd leaves it out.
            let has_values = features.iter().enumerate().any(|(k, f)| !empty(k, r) && f["format"] == "dense");
            if has_values {
                return Err(format!(
                    "record {}: TensorFlow refuses it ({}), minibatchd serves it",
                    r + 1,
                    answer["error"]
                ));
            }
            continue;
        };
        let by_design = features.iter().any(|f| {
            values
                .get(f["stream"].as_str().unwrap_or(""))
                .and_then(Value::as_array)
                .is_some_and(|v| refused_by_design(f, v, precision))
        });
        if by_design {
            if !left_out {
                return Err(format!("record {}: minibatchd serves values it cannot hold exactly or past dim", r + 1));
            }
            continue;
        }
        for (k, (f, seqs)) in features.iter().zip(&got).enumerate() {
            let want = values.get(f["stream"].as_str().unwrap_or("")).and_then(Value::as_array).ok_or("values")?;
            if is_bytes(f) {
                let have = got_bytes[k].get(r).ok_or_else(|| format!("{}: minibatchd has no such record", what(f)))?;
                let want: Vec<&str> = want.iter().filter_map(Value::as_str).collect();
                if *have != want {
                    return Err(format!("{}: {have:?} where TensorFlow has {want:?}", what(f)));
                }
                continue;
            }
            let have = seqs.get(r).ok_or_else(|| format!("{}: minibatchd has no such record", what(f)))?;
            if have.len() != want.len() {
                return Err(format!("{}: {} values, TensorFlow {}", what(f), have.len(), want.len()));
            }
            same_numbers(f, have, want, precision).map_err(|e| format!("{}: {e}", what(f)))?;
        }
    }
    Ok(())
}

fn check_corpus(corpus: &str, at_least: usize) {
    let cases = support::oracle_cases(corpus, at_least);
    let failures: Vec<String> =
        cases.iter().filter_map(|c| check_case(c).err().map(|e| format!("{}: {e}", c.display()))).collect();
    assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn minibatchd_reads_tfrecords_as_tensorflow_does() {
    check_corpus(CORPUS, 50);
}

/// Bytes features and sequences: each byte string exactly as TensorFlow's, each sequence's
/// values in order.
#[test]
fn minibatchd_reads_bytes_and_sequence_features_as_tensorflow_does() {
    check_corpus(SEQUENCE_CORPUS, 50);
}
