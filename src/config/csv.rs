//! Configuration of a `csv` dataset: header lines, how fields split, and the streams, each some
//! columns of one type (`docs/config.md`, "`csv`").
//!
//! | key | default | rule |
//! |---|---|---|
//! | `columns` | — | fields per record, 1..=65536 |
//! | `skip_header_lines` | 0 | lines skipped at the start of each file |
//! | `field_delim` | `","` | one ASCII character other than `"`, `\r`, `\n` |
//! | `use_quote_delim` | true | `"` quotes a field |
//! | `na_value` | `""` | a field equal to it is missing |
//! | stream `columns` | — | the stream's columns (0-based), each below `columns` |
//! | stream `dtype` | `float32` | `float32`, `float64`, `int32`, `int64`, `string` (a strings stream, a sample per column) |
//! | stream `default` | — | the value of a missing field (a string for `string`); without it the columns are required |

use minibatchd_engine::format::csv::{CsvLayout, CsvOptions, CsvStream, CsvType, CsvValue};
use minibatchd_engine::options::{CsvConfig, StreamConfig};
use serde_json::Value;

use super::dense_streams;
use super::walk::{Node, Table, Walker};

/// Most fields per record.
const MAX_COLUMNS: u64 = 1 << 16;

/// The keys and `streams` of a `csv` dataset table: the stream configs and the CSV config, in
/// name order; `None` after an issue.
pub(crate) fn parse(w: &mut Walker, t: &mut Table<'_>) -> Option<(Vec<StreamConfig>, CsvConfig)> {
    let columns = t.uint(w, "columns", 1, MAX_COLUMNS).and_then(|c| usize::try_from(c).ok());
    if columns.is_none() && !t.had("columns") {
        w.issue(&t.key_path("columns"), "missing: the number of fields of each record");
    }
    let skip_header_lines = t.uint(w, "skip_header_lines", 0, u64::MAX).unwrap_or(0);
    let delim_path = t.key_path("field_delim");
    let field_delim = match t.string(w, "field_delim") {
        None => Some(b','),
        Some(d) if d.len() == 1 && d.is_ascii() && !matches!(d.as_bytes()[0], b'"' | b'\r' | b'\n') => {
            Some(d.as_bytes()[0])
        }
        Some(d) => {
            w.issue(&delim_path, &format!("{d:?}: expected one ASCII character other than a quote or a line end"));
            None
        }
    };
    let use_quote_delim = t.boolean(w, "use_quote_delim").unwrap_or(true);
    let na_value = t.string(w, "na_value").unwrap_or_default().into_bytes();
    let streams =
        dense_streams(w, t, "missing: a csv dataset needs at least one stream (some of its columns)", |w, name, n| {
            stream(w, name, n, columns).map(|s| {
                let dim = s.columns.len();
                (s, dim)
            })
        });
    let options = CsvOptions { columns: columns?, field_delim: field_delim?, use_quote_delim, na_value };
    let (configs, streams) = streams?;
    Some((configs, CsvConfig { layout: CsvLayout { skip_header_lines }, options, streams }))
}

fn stream(w: &mut Walker, name: &str, node: &Node<'_>, columns: Option<usize>) -> Option<CsvStream> {
    let mut t = w.table(node)?;
    let dtype = match t.string(w, "dtype") {
        None => Some(CsvType::F32),
        Some(d) => CsvType::parse(&d).or_else(|| {
            w.issue(
                &t.key_path("dtype"),
                &format!("unknown dtype '{d}': expected float32, float64, int32, int64 or string"),
            );
            None
        }),
    };
    let cols = if let Some(n) = t.take("columns") {
        column_list(w, &n, columns)
    } else {
        w.issue(&t.key_path("columns"), "missing: the stream's columns (0-based), e.g. [1, 2, 3]");
        None
    };
    let default = match (t.take("default"), dtype) {
        (None, _) => Some(None),
        (Some(n), Some(dtype)) => default(w, &n, dtype).map(Some),
        (Some(_), None) => None,
    };
    w.finish(t);
    Some(CsvStream { name: name.to_owned(), dtype: dtype?, columns: cols?, default: default? })
}

fn column_list(w: &mut Walker, node: &Node<'_>, columns: Option<usize>) -> Option<Vec<usize>> {
    let items = w.array(node)?;
    if items.is_empty() {
        w.issue(node.path(), "expected at least one column");
        return None;
    }
    let mut out = Vec::with_capacity(items.len());
    for item in &items {
        let Some(c) = item.json().and_then(Value::as_u64).and_then(|c| usize::try_from(c).ok()) else {
            w.issue(item.path(), "expected a column number (0-based)");
            return None;
        };
        if let Some(n) = columns.filter(|&n| c >= n) {
            w.issue(item.path(), &format!("column {c} of records of {n} fields (columns count from 0)"));
            return None;
        }
        out.push(c);
    }
    Some(out)
}

fn default(w: &mut Walker, node: &Node<'_>, dtype: CsvType) -> Option<CsvValue> {
    let v = node.json();
    let value = match dtype {
        CsvType::I32 => v.and_then(Value::as_i64).filter(|i| i32::try_from(*i).is_ok()).map(CsvValue::Int),
        CsvType::I64 => v.and_then(Value::as_i64).map(CsvValue::Int),
        CsvType::F32 => v.and_then(Value::as_f64).map(|f| {
            #[allow(clippy::cast_possible_truncation)]
            let single = f as f32;
            CsvValue::Float(f64::from(single))
        }),
        CsvType::F64 => v.and_then(Value::as_f64).map(CsvValue::Float),
        CsvType::String => v.and_then(Value::as_str).map(|s| CsvValue::Text(s.as_bytes().to_vec())),
    };
    if value.is_none() {
        w.issue(node.path(), &format!("expected a {} value", dtype.name()));
    }
    value
}
