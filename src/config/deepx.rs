//! Configuration keys of the deepx instance formats and deepx's `instance_reader_config` string,
//! validated with deepx's rules (deepx's `InstanceReader` config parsing; `docs/config.md` lists
//! the keys).
//!
//! Keys of a `libsvm`, `libsvm_ex` or `uch` dataset table:
//!
//! | key | default | rule |
//! |---|---|---|
//! | `label_size` | 1 | `1..=32` (deepx's `MAX_LABEL_SIZE`, checked here instead of at the first line) |
//! | `w`, `uuid` | false | `true`/`false`, or an integer as deepx (non-zero = on) |
//! | `x_size` | — | `libsvm_ex` only and required there; `1..=128` (`MAX_X_SIZE`) |
//! | `x_hist_item_size` | — | `uch` only and required there; `1..=128` |
//! | `instance_reader_config` | — | deepx's `"k=v;k=v"` string with the keys above plus `batch` |
//! | `comments`, `qid` | false | `libsvm` only (svmlight variants) |
//! | `feature_index_base` | 0 | `libsvm` only: 0 (ids as written) or 1 (1-based ids) |
//!
//! The string is split as deepx's `ParseConfig` does: on `;`, then each piece on `=`, empty parts
//! dropped, so `"batch=32;"` and `"batch==32"` are accepted and `"batch="` is not; no whitespace
//! is trimmed. Keys take deepx's aliases (`batch_size`, `has_w`, `has_uuid`, `hist_item_size`,
//! `history_item_size`); a later duplicate overrides an earlier one. Stricter than deepx: a value
//! must be a whole integer (`std::stoi` reads `"32abc"` as 32 and throws on `"abc"`), and a key
//! given both in the string and as a table key must have the same value in both.
//!
//! `batch` (instances per deepx batch) must be > 0. Every line is a sequence of one sample, so a
//! deepx batch of N instances is a minibatch of N samples: `batch` is kept as the dataset's
//! suggested minibatch size ([`DeepxOptions::batch`]); the size a session or
//! `dump --minibatch-size` asks for always wins, as deepx's rank trainer overrides `batch` with
//! its `--batch` flag.

use serde_json::Value;

use super::walk::{Node, Table, Walker};
use super::{DeepxOptions, FormatKind};

/// deepx's `MAX_LABEL_SIZE`.
pub const MAX_LABEL_SIZE: u64 = 32;
/// deepx's `MAX_X_SIZE` (also the bound of `x_hist_item_size`).
pub const MAX_X_SIZE: u64 = 128;

/// What the `instance_reader_config` string set, by canonical key.
#[derive(Debug, Default)]
struct FromString {
    batch: Option<u64>,
    label_size: Option<u64>,
    w: Option<bool>,
    uuid: Option<bool>,
    x_size: Option<u64>,
    x_hist_item_size: Option<u64>,
    /// `x_size` or a history size was given, valid or not (an invalid one is reported as such,
    /// not again as missing).
    sizes_given: bool,
}

/// Reads the deepx keys of a dataset table of format `format` (not `ctf`).
pub(crate) fn parse(w: &mut Walker, t: &mut Table<'_>, format: FormatKind) -> DeepxOptions {
    let label_size = t.uint(w, "label_size", 1, MAX_LABEL_SIZE);
    let has_w = flag(w, t, "w");
    let has_uuid = flag(w, t, "uuid");
    let x_size = t.uint(w, "x_size", 1, MAX_X_SIZE);
    let x_hist = t.uint(w, "x_hist_item_size", 1, MAX_X_SIZE);
    let comments = flag(w, t, "comments");
    let qid = flag(w, t, "qid");
    let base = t.uint(w, "feature_index_base", 0, 1);
    let cfg_path = t.key_path("instance_reader_config");
    let from_string = match t.string(w, "instance_reader_config") {
        Some(s) => parse_reader_config(w, &cfg_path, &s, format),
        None => FromString::default(),
    };

    let label_size = merge(w, t, "label_size", label_size, from_string.label_size);
    let has_w = merge(w, t, "w", has_w, from_string.w);
    let has_uuid = merge(w, t, "uuid", has_uuid, from_string.uuid);
    let x_size = merge(w, t, "x_size", x_size, from_string.x_size);
    let x_hist = merge(w, t, "x_hist_item_size", x_hist, from_string.x_hist_item_size);

    let only = |w: &mut Walker, key: &str, given: bool, allowed: bool, formats: &str| {
        if given && !allowed {
            w.issue(&t.key_path(key), &format!("exists for format {formats} only (deepx: \"Unexpected config\")"));
        }
    };
    only(w, "x_size", x_size.is_some(), format == FormatKind::LibsvmEx, "libsvm_ex");
    only(w, "x_hist_item_size", x_hist.is_some(), format == FormatKind::Uch, "uch");
    let libsvm = format == FormatKind::Libsvm;
    only(w, "comments", comments.is_some(), libsvm, "libsvm");
    only(w, "qid", qid.is_some(), libsvm, "libsvm");
    only(w, "feature_index_base", base.is_some(), libsvm, "libsvm");
    // A size given but invalid was reported as such (a probe saw `x_size = 129` also called missing).
    let given = |key: &str| t.had(key) || from_string.sizes_given;
    if format == FormatKind::LibsvmEx && x_size.is_none() && !given("x_size") {
        w.issue(
            &t.key_path("x_size"),
            "missing: libsvm_ex needs the number of feature groups, 1..=128 (deepx: \"Please specify x_size.\")",
        );
    }
    if format == FormatKind::Uch && x_hist.is_none() && !given("x_hist_item_size") {
        w.issue(
            &t.key_path("x_hist_item_size"),
            "missing: uch needs the number of history slots, 1..=128 (deepx: \"Please specify x_hist_item_size.\")",
        );
    }
    let size = |v: Option<u64>| v.and_then(|v| usize::try_from(v).ok());
    DeepxOptions {
        label_size: size(label_size).unwrap_or(1),
        w: has_w.unwrap_or(false),
        uuid: has_uuid.unwrap_or(false),
        x_size: size(x_size),
        x_hist_item_size: size(x_hist),
        batch: size(from_string.batch),
        comments: comments.unwrap_or(false),
        qid: qid.unwrap_or(false),
        feature_index_base: u8::from(base == Some(1)),
    }
}

/// A table key given in both places must agree; either alone is taken as is.
fn merge<V: PartialEq + std::fmt::Debug + Copy>(
    w: &mut Walker,
    t: &Table<'_>,
    key: &str,
    table: Option<V>,
    string: Option<V>,
) -> Option<V> {
    match (table, string) {
        (Some(a), Some(b)) if a != b => {
            w.issue(
                &t.key_path(key),
                &format!("{a:?} here but {b:?} in instance_reader_config: give it once, or the same value in both"),
            );
            Some(a)
        }
        (a, b) => a.or(b),
    }
}

/// `true`/`false`, or an integer (non-zero = on, as deepx's `std::stoi` flags).
fn flag(w: &mut Walker, t: &mut Table<'_>, key: &str) -> Option<bool> {
    let n: Node<'_> = t.take(key)?;
    match n.json() {
        Some(Value::Bool(b)) => Some(*b),
        Some(Value::Number(x)) if x.as_i64().is_some() => Some(x.as_i64() != Some(0)),
        Some(Value::String(s)) => match s.as_str() {
            "true" => Some(true),
            "false" => Some(false),
            other => other
                .parse::<i64>()
                .map(|v| v != 0)
                .map_err(|_| w.issue(n.path(), &format!("expected true, false or an integer, found '{other}'")))
                .ok(),
        },
        Some(_) => {
            w.issue(n.path(), "expected true, false or an integer");
            None
        }
        None => None,
    }
}

/// Parses deepx's `"k=v;k=v"` string for `format`, reporting every bad piece at `path`.
fn parse_reader_config(w: &mut Walker, path: &str, text: &str, format: FormatKind) -> FromString {
    let mut out = FromString::default();
    for piece in text.split(';').filter(|p| !p.is_empty()) {
        let parts: Vec<&str> = piece.split('=').filter(|p| !p.is_empty()).collect();
        let [key, value] = parts.as_slice() else {
            w.issue(path, &format!("'{piece}' is not key=value (deepx's ParseConfig rejects it)"));
            continue;
        };
        let Ok(v) = value.parse::<i64>() else {
            w.issue(path, &format!("'{piece}': the value must be an integer"));
            continue;
        };
        let bounded = |w: &mut Walker, min: i64, max: i64| -> Option<u64> {
            if (min..=max).contains(&v) {
                u64::try_from(v).ok()
            } else {
                w.issue(path, &format!("'{piece}': {v} is out of range: expected {min}..={max}"));
                None
            }
        };
        let max_x = i64::try_from(MAX_X_SIZE).unwrap_or(i64::MAX);
        match *key {
            "batch" | "batch_size" => out.batch = bounded(w, 1, i64::from(i32::MAX)),
            "label_size" => out.label_size = bounded(w, 1, i64::try_from(MAX_LABEL_SIZE).unwrap_or(i64::MAX)),
            "w" | "has_w" => out.w = Some(v != 0),
            "uuid" | "has_uuid" => out.uuid = Some(v != 0),
            "x_size" if format == FormatKind::LibsvmEx => {
                out.x_size = bounded(w, 1, max_x);
                out.sizes_given = true;
            }
            "x_hist_item_size" | "hist_item_size" | "history_item_size" if format == FormatKind::Uch => {
                out.x_hist_item_size = bounded(w, 1, max_x);
                out.sizes_given = true;
            }
            other => w.issue(
                path,
                &format!("unexpected key '{other}' for format {format:?} (deepx: \"Unexpected config: {piece}\")"),
            ),
        }
    }
    out
}
