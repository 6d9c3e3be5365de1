//! Configuration of a `tfrecord` dataset: its streams, each a feature of the records'
//! `tf.train.Example`s (`docs/config.md`, "TFRecord datasets").
//!
//! | stream key | default | rule |
//! |---|---|---|
//! | `feature` | the stream's name | the feature's key in the Example |
//! | `dtype` | `float32` | `float32` (a `float_list`), `int64` (an `int64_list`) or `bytes` (a `bytes_list`: a strings stream, one sample per byte string) |
//! | `format` | — | `dense`: `tf.io.FixedLenFeature([dim])`; `sparse`: `tf.io.VarLenFeature`, at most `dim` values (not for bytes); `sequence`: `tf.io.FixedLenSequenceFeature([dim], allow_missing=True)`, a sample per `dim` values |
//! | `dim` | — (sequence: 1) | values per record: exactly (dense) or at most (sparse); values per sample (sequence; 1 for bytes) |
//! | `default` | — | dense only: a number or string, or `dim` of them, for a record without the feature (integers for `int64`, strings for `bytes`); without it the feature is required |

use minibatchd_engine::options::{
    ExampleFeature, FeatureDefault, FeatureLength, FeatureType, StreamConfig, StreamFormat,
};
use serde_json::Value;

use super::walk::{Node, Table, Walker};
use super::{MAX_DENSE_DIM, MAX_SPARSE_DIM};

/// The `streams` of a `tfrecord` dataset table: its stream configs and their features, in name
/// order; `None` after an issue.
pub(crate) fn parse(w: &mut Walker, t: &mut Table<'_>) -> Option<(Vec<StreamConfig>, Vec<ExampleFeature>)> {
    let Some(node) = t.take("streams") else {
        w.issue(
            &t.key_path("streams"),
            "missing: a tfrecord dataset needs at least one stream (a feature of its Examples)",
        );
        return None;
    };
    let mut st = w.table(&node)?;
    let (mut streams, mut features) = (Vec::new(), Vec::new());
    let mut ok = true;
    for (name, n) in st.drain() {
        match stream(w, &name, &n) {
            Some((s, f)) => {
                streams.push(s);
                features.push(f);
            }
            None => ok = false,
        }
    }
    w.finish(st);
    if streams.is_empty() && ok {
        w.issue(node.path(), "expected at least one stream");
        return None;
    }
    ok.then_some((streams, features))
}

/// What `format` may be.
const FORMATS: &str =
    "expected dense (a fixed-length feature), sparse (a var-length one) or sequence (any multiple of dim values, \
     each dim of them a sample)";

fn stream(w: &mut Walker, name: &str, node: &Node<'_>) -> Option<(StreamConfig, ExampleFeature)> {
    let mut t = w.table(node)?;
    let key = t.string(w, "feature").unwrap_or_else(|| name.to_owned());
    let dtype = match t.string(w, "dtype").as_deref() {
        None | Some("float32" | "float") => Some(FeatureType::Float),
        Some("int64") => Some(FeatureType::Int64),
        Some("bytes" | "string") => Some(FeatureType::Bytes),
        Some(other) => {
            w.issue(&t.key_path("dtype"), &format!("unknown dtype '{other}': expected float32, int64 or bytes"));
            None
        }
    };
    let length = match t.string(w, "format").map(|s| s.to_ascii_lowercase()).as_deref() {
        Some("dense") => Some(FeatureLength::Fixed { default: None }),
        Some("sparse") if dtype == Some(FeatureType::Bytes) => {
            w.issue(
                &t.key_path("format"),
                "a bytes feature is dense (exactly dim byte strings) or sequence (any number of them), each byte \
                 string one sample of a strings stream: read a tf.io.VarLenFeature(tf.string) as format = \"sequence\"",
            );
            None
        }
        Some("sparse") => Some(FeatureLength::Var),
        Some("sequence") => Some(FeatureLength::Sequence),
        Some(other) => {
            w.issue(&t.key_path("format"), &format!("unknown stream format '{other}': {FORMATS}"));
            None
        }
        None => {
            w.issue(&t.key_path("format"), &format!("missing: {FORMATS}"));
            None
        }
    };
    let max_dim = if length == Some(FeatureLength::Var) { MAX_SPARSE_DIM } else { MAX_DENSE_DIM };
    let mut dim = t.uint(w, "dim", 1, max_dim).and_then(|d| usize::try_from(d).ok());
    if dim.is_none() && !t.had("dim") {
        if length == Some(FeatureLength::Sequence) {
            // A sequence's samples are one value (or byte string) each unless said.
            dim = Some(1);
        } else {
            w.issue(
                &t.key_path("dim"),
                "missing: values per record (exactly for dense, at most for sparse; byte strings for a dense bytes \
                 feature)",
            );
        }
    }
    if dtype == Some(FeatureType::Bytes) && length == Some(FeatureLength::Sequence) && dim.is_some_and(|d| d != 1) {
        w.issue(&t.key_path("dim"), "a bytes sequence has one byte string a sample: dim is 1 (or left out)");
    }
    let default_path = t.key_path("default");
    let default = match t.take("default") {
        None => None,
        Some(n) if !matches!(length, Some(FeatureLength::Fixed { .. })) => {
            w.issue(
                n.path(),
                "only a fixed-length (dense) feature has a default: a record without a sparse or sequence feature has \
                 no values",
            );
            None
        }
        Some(n) if dtype == Some(FeatureType::Bytes) => default_strings(w, &default_path, n.json(), dim?),
        Some(n) => default_values(w, &default_path, n.json(), dim?, dtype?).map(FeatureDefault::Numbers),
    };
    w.finish(t);
    let (dim, dtype, mut length) = (dim?, dtype?, length?);
    if let FeatureLength::Fixed { default: d } = &mut length {
        *d = default;
    }
    let format = if length == FeatureLength::Var { StreamFormat::Sparse } else { StreamFormat::Dense };
    let stream = StreamConfig { name: name.to_owned(), alias: key.clone(), dim, format, defines_mb_size: false };
    Some((stream, ExampleFeature { stream: name.to_owned(), key, dtype, length, dim }))
}

/// A bytes feature's `default`: one string for every value, or `dim` of them (as UTF-8 bytes).
fn default_strings(w: &mut Walker, path: &str, v: Option<&Value>, dim: usize) -> Option<FeatureDefault> {
    let strings: Vec<Option<&str>> = match v {
        // One string for all: kept as one (`FeatureDefault`).
        Some(Value::String(s)) => vec![Some(s.as_str())],
        Some(Value::Array(a)) if a.len() == dim => a.iter().map(Value::as_str).collect(),
        Some(Value::Array(a)) => {
            w.issue(path, &format!("{} strings, expected one string or dim = {dim} of them", a.len()));
            return None;
        }
        _ => {
            w.issue(path, "expected a string or a list of dim strings (a bytes feature's default)");
            return None;
        }
    };
    let Some(strings) = strings.into_iter().collect::<Option<Vec<&str>>>() else {
        w.issue(path, "expected strings (a bytes feature's default)");
        return None;
    };
    Some(FeatureDefault::Bytes(strings.into_iter().map(|s| s.as_bytes().to_vec()).collect()))
}
/// `default`: one number for every value, or `dim` of them; integers for `int64`.
fn default_values(w: &mut Walker, path: &str, v: Option<&Value>, dim: usize, dtype: FeatureType) -> Option<Vec<f64>> {
    let numbers: Vec<Option<f64>> = match v {
        // One number for all: kept as one (`FeatureDefault`).
        Some(Value::Number(n)) => vec![n.as_f64()],
        Some(Value::Array(a)) if a.len() == dim => a.iter().map(Value::as_f64).collect(),
        Some(Value::Array(a)) => {
            w.issue(path, &format!("{} values, expected one number or dim = {dim} of them", a.len()));
            return None;
        }
        _ => {
            w.issue(path, "expected a number or a list of dim numbers");
            return None;
        }
    };
    let Some(values) = numbers.into_iter().collect::<Option<Vec<f64>>>() else {
        w.issue(path, "expected numbers");
        return None;
    };
    if dtype == FeatureType::Int64 && values.iter().any(|x| x.fract() != 0.0) {
        w.issue(path, "an int64 feature's default holds integers");
        return None;
    }
    // Read as a float, an integer past 2^53 was already rounded (found by a review: a default
    // of 2^53 + 1 was served as 2^53): the written integers are checked as written.
    let written: Vec<&Value> = match v {
        Some(Value::Array(a)) => a.iter().collect(),
        Some(n) => vec![n],
        None => Vec::new(),
    };
    #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
    let inexact = written.iter().find_map(|n| {
        let exact = match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => (i as f64) as i64 == i && i.unsigned_abs() <= 1 << 53,
            (None, Some(u)) => u <= 1 << 53,
            _ => true,
        };
        (!exact).then(|| n.to_string())
    });
    if dtype == FeatureType::Int64 {
        if let Some(n) = inexact {
            w.issue(path, &format!("{n} is not exact in any precision (integers are exact up to 2^53)"));
            return None;
        }
    }
    Some(values)
}
