//! Configuration of a `tfrecord` dataset: its streams, each a feature of the records'
//! `tf.train.Example`s (`docs/config.md`, "TFRecord datasets").
//!
//! | stream key | default | rule |
//! |---|---|---|
//! | `feature` | the stream's name | the feature's key in the Example |
//! | `dtype` | `float32` | `float32` (a `float_list`) or `int64` (an `int64_list`) |
//! | `format` | — | `dense`: `tf.io.FixedLenFeature([dim])`; `sparse`: `tf.io.VarLenFeature`, at most `dim` values |
//! | `dim` | — | values per record: exactly (dense) or at most (sparse) |
//! | `default` | — | dense only: a number, or `dim` numbers, for a record without the feature (integers for `int64`); without it the feature is required |

use minibatchd_engine::options::{ExampleFeature, FeatureLength, FeatureType, StreamConfig, StreamFormat};
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

fn stream(w: &mut Walker, name: &str, node: &Node<'_>) -> Option<(StreamConfig, ExampleFeature)> {
    let mut t = w.table(node)?;
    let key = t.string(w, "feature").unwrap_or_else(|| name.to_owned());
    let dtype = match t.string(w, "dtype").as_deref() {
        None | Some("float32" | "float") => Some(FeatureType::Float),
        Some("int64") => Some(FeatureType::Int64),
        Some(other) => {
            w.issue(
                &t.key_path("dtype"),
                &format!("unknown dtype '{other}': expected float32 or int64 (bytes features are not read yet)"),
            );
            None
        }
    };
    let format = match t.string(w, "format").map(|s| s.to_ascii_lowercase()).as_deref() {
        Some("dense") => Some(StreamFormat::Dense),
        Some("sparse") => Some(StreamFormat::Sparse),
        Some(other) => {
            w.issue(&t.key_path("format"), &format!("unknown stream format '{other}': expected dense (a fixed-length feature) or sparse (a var-length one)"));
            None
        }
        None => {
            w.issue(
                &t.key_path("format"),
                "missing: expected dense (a fixed-length feature) or sparse (a var-length one)",
            );
            None
        }
    };
    let max_dim = if format == Some(StreamFormat::Sparse) { MAX_SPARSE_DIM } else { MAX_DENSE_DIM };
    let dim = t.uint(w, "dim", 1, max_dim).and_then(|d| usize::try_from(d).ok());
    if dim.is_none() && !t.had("dim") {
        w.issue(&t.key_path("dim"), "missing: values per record (exactly for dense, at most for sparse)");
    }
    let default_path = t.key_path("default");
    let default = match t.take("default") {
        None => None,
        Some(n) if format == Some(StreamFormat::Sparse) => {
            w.issue(n.path(), "a var-length (sparse) feature has no default: a record without it has no values");
            None
        }
        Some(n) => default_values(w, &default_path, n.json(), dim?, dtype?),
    };
    w.finish(t);
    let (dim, format, dtype) = (dim?, format?, dtype?);
    let length = match format {
        StreamFormat::Dense => FeatureLength::Fixed { default },
        StreamFormat::Sparse => FeatureLength::Var,
    };
    let stream = StreamConfig { name: name.to_owned(), alias: key.clone(), dim, format, defines_mb_size: false };
    Some((stream, ExampleFeature { stream: name.to_owned(), key, dtype, length, dim }))
}

/// `default`: one number for every value, or `dim` of them; integers for `int64`.
fn default_values(w: &mut Walker, path: &str, v: Option<&Value>, dim: usize, dtype: FeatureType) -> Option<Vec<f64>> {
    let numbers: Vec<Option<f64>> = match v {
        Some(Value::Number(n)) => vec![n.as_f64(); dim],
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
    Some(values)
}
