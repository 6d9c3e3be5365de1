//! A `[datasets.NAME]` table: its format, its files or CTF sources and streams (a record
//! format's streams from its own table: `record_format`), chunking, errors, precision,
//! compression and sampling defaults — every problem reported with its key path.

use std::collections::BTreeMap;

use minibatchd_engine::options::{
    Compression, CsvValue, DatasetConfig, FeatureDefault, FeatureLength, FeatureType, FormatKind, InflateLimits,
    Precision, RecordOptions, SamplingDefaults, SourceConfig, StreamConfig, StreamFormat, DEFAULT_CHUNK_SIZE_BYTES,
    MAX_DENSE_DIM, MAX_SPARSE_DIM,
};
use minibatchd_engine::sampling::{Window, DEFAULT_WINDOW_CHUNKS};

use super::walk::{self, Node, Walker};
use super::{csv, deepx, fixed, tfrecord};

pub(super) fn parse_dataset(
    w: &mut Walker,
    name: &str,
    node: &Node<'_>,
    inflate: InflateLimits,
    index_threads: usize,
) -> Option<DatasetConfig> {
    let mut t = w.table(node)?;
    let format = if let Some(s) = t.string(w, "format") {
        FormatKind::parse(&s).or_else(|| {
            w.issue(&t.key_path("format"), &format!("unknown format '{s}': expected {}", FormatKind::NAMES));
            None
        })
    } else {
        w.issue(&t.key_path("format"), &format!("missing: expected {}", FormatKind::NAMES));
        None
    };
    let chunk_size_bytes = t.uint(w, "chunk_size_bytes", 1, u64::from(u32::MAX)).unwrap_or(DEFAULT_CHUNK_SIZE_BYTES);
    let max_errors = t.uint(w, "max_errors", 0, u64::MAX).unwrap_or(0);
    let cache_index = t.boolean(w, "cache_index").unwrap_or(true);
    let preload = t.boolean(w, "preload").unwrap_or(false);
    let precision = match t.string(w, "precision").as_deref() {
        None | Some("float32" | "float") => Precision::Float32,
        Some("float64" | "double") => Precision::Float64,
        Some(other) => {
            w.issue(&t.key_path("precision"), &format!("unknown precision '{other}': expected float32 or float64"));
            Precision::Float32
        }
    };
    let compression = parse_compression(w, &mut t, format);
    let sampling = match t.take("sampling") {
        Some(n) => parse_sampling(w, &n),
        None => Some(SamplingDefaults { randomize: true, window: Window::Chunks(DEFAULT_WINDOW_CHUNKS), seed: 0 }),
    };
    // A record format's streams come from its own table: taken before the sources.
    let records = format.and_then(|f| record_format(w, &mut t, f));
    let sources = parse_sources(w, &mut t, format);
    let deepx = format.filter(|f| f.is_deepx()).map(|f| deepx::parse(w, &mut t, f));
    w.finish(t);
    let mut sources = sources?;
    let records = with_streams(records, &mut sources)?;
    check_streams(w, node.path(), &sources);
    check_defaults_exact(w, node.path(), records.as_ref(), precision);
    Some(DatasetConfig {
        name: name.to_owned(),
        format: format?,
        sources,
        chunk_size_bytes,
        max_errors,
        cache_index,
        preload,
        precision,
        sampling: sampling?,
        deepx,
        records,
        compression,
        inflate,
        index_threads,
    })
}

/// Refuses an integer `default` the dataset's precision cannot hold exactly (above 2^24 for
/// `float32`, 2^53 for `float64`). Found by a probe: such a default was accepted, then every
/// record that used it failed as malformed data, blaming a value no record held.
fn check_defaults_exact(w: &mut Walker, path: &str, records: Option<&RecordOptions>, precision: Precision) {
    // Exact, bit for bit: a round trip through the precision, and an integer within its range.
    #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
    let exact = |x: f64| match precision {
        Precision::Float32 => f64::from(x as f32).to_bits() == x.to_bits(),
        Precision::Float64 => ((x as i64) as f64).to_bits() == x.to_bits() && x.abs() <= 9_007_199_254_740_992.0,
    };
    let (limit, fix) = match precision {
        Precision::Float32 => ("2^24", "; precision = \"float64\" holds integers up to 2^53"),
        Precision::Float64 => ("2^53", ""),
    };
    let mut refuse = |stream: &str, value: f64| {
        w.issue(
            &format!("{path}.streams.{stream}.default"),
            &format!("{value} is not exact in the dataset's precision (integers are exact up to {limit}){fix}"),
        );
    };
    match records {
        Some(RecordOptions::TfRecord(features)) => {
            for f in features.iter().filter(|f| f.dtype == FeatureType::Int64) {
                if let FeatureLength::Fixed { default: Some(FeatureDefault::Numbers(values)) } = &f.length {
                    if let Some(&v) = values.iter().find(|&&v| !exact(v)) {
                        refuse(&f.stream, v);
                    }
                }
            }
        }
        Some(RecordOptions::Csv(csv)) => {
            for s in &csv.streams {
                #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
                if let Some(CsvValue::Int(i)) = s.default {
                    if !exact(i as f64) || (i as f64) as i64 != i {
                        refuse(&s.name, i as f64);
                    }
                }
            }
        }
        _ => {}
    }
}

/// The record formats' own dataset tables, one arm each (the engine's `format::registry` maps the
/// options to a reader and decoder): the streams and options of a record format's dataset, or
/// `None` for CTF and the deepx formats; `Some(None)` after an issue.
#[allow(clippy::option_option)] // the inner `None` is an issue, the outer one another format
fn record_format(
    w: &mut Walker,
    t: &mut walk::Table<'_>,
    format: FormatKind,
) -> Option<Option<(Vec<StreamConfig>, RecordOptions)>> {
    Some(match format {
        FormatKind::TfRecord => tfrecord::parse(w, t).map(|(s, f)| (s, RecordOptions::TfRecord(f))),
        FormatKind::FixedLength => fixed::parse(w, t).map(|(s, f)| (s, RecordOptions::FixedLength(f))),
        FormatKind::Csv => csv::parse(w, t).map(|(s, c)| (s, RecordOptions::Csv(c))),
        // A whole file's streams are its contents and its path: nothing to configure.
        FormatKind::WholeFile => {
            Some((strings_streams(&minibatchd_engine::format::whole_file::STREAMS), RecordOptions::WholeFile))
        }
        FormatKind::Ctf | FormatKind::Libsvm | FormatKind::LibsvmEx | FormatKind::Uch => return None,
    })
}

/// Stream configs of strings streams named `names` (a format whose streams are fixed).
fn strings_streams(names: &[&str]) -> Vec<StreamConfig> {
    names
        .iter()
        .map(|n| StreamConfig {
            name: (*n).to_owned(),
            alias: (*n).to_owned(),
            dim: 0,
            format: StreamFormat::Dense,
            defines_mb_size: false,
        })
        .collect()
}

/// A record format's streams go to the dataset's one source and its options are returned.
/// `None` (outer) when its table had an issue; `Some(None)` when the dataset is of another
/// format.
#[allow(clippy::option_option)] // the outer `None` is an issue, the inner one another format
fn with_streams<T>(parsed: Option<Option<(Vec<StreamConfig>, T)>>, sources: &mut [SourceConfig]) -> Option<Option<T>> {
    match parsed {
        None => Some(None),
        Some(parsed) => {
            let (streams, options) = parsed?;
            if let Some(s) = sources.first_mut() {
                s.streams = streams;
            }
            Some(Some(options))
        }
    }
}

/// `compression`: how the inputs are compressed; not for CTF (read as it is), none by default for
/// `fixed_length` (binary records may begin with gzip's magic), else gzip recognised by its magic.
fn parse_compression(w: &mut Walker, t: &mut walk::Table<'_>, format: Option<FormatKind>) -> Compression {
    let path = t.key_path("compression");
    match t.string(w, "compression") {
        None if format.is_some_and(FormatKind::read_as_is_by_default) => Compression::None,
        None => Compression::Auto,
        Some(_) if format == Some(FormatKind::Ctf) => {
            w.issue(&path, "CTF inputs are read as they are: no compression key");
            Compression::None
        }
        Some(c) => Compression::parse(&c).unwrap_or_else(|| {
            w.issue(&path, &format!("unknown compression '{c}': expected auto, none, gzip or zlib"));
            Compression::None
        }),
    }
}

/// A dataset is either `files` + `streams` (one source) or `[[datasets.NAME.sources]]` tables,
/// each with `files`, `streams` and optionally `skip_sequence_ids`.
fn parse_sources(w: &mut Walker, t: &mut walk::Table<'_>, format: Option<FormatKind>) -> Option<Vec<SourceConfig>> {
    // An unknown format is validated as CTF, so its other problems are reported too.
    let is_ctf = format.is_none_or(|f| f == FormatKind::Ctf);
    let top_skip = t.boolean(w, "skip_sequence_ids");
    if let (Some(_), Some(f)) = (top_skip, format.filter(|_| !is_ctf)) {
        // The other formats have one record per sequence and no sequence ids: accepting the key
        // would suggest an effect it cannot have.
        w.issue(
            &t.key_path("skip_sequence_ids"),
            &format!("exists for format ctf only ({} has no sequence ids)", f.name()),
        );
    }
    let files = t.take("files");
    let streams = t.take("streams");
    let sources = t.take("sources");
    match (files, sources) {
        (Some(_), Some(s)) => {
            w.issue(s.path(), "give either `files` (one source) or `sources` (several), not both");
            None
        }
        (None, None) => {
            w.issue(&t.key_path("files"), "missing: a list of paths or globs");
            None
        }
        (Some(files), None) => {
            let files = w.path_list(&files)?;
            let streams = match streams {
                Some(s) => parse_streams(w, &s, format)?,
                None if is_ctf => {
                    w.issue(&t.key_path("streams"), "missing: a CTF dataset needs at least one stream");
                    return None;
                }
                None => Vec::new(),
            };
            Some(vec![SourceConfig { files, skip_sequence_ids: top_skip.unwrap_or(false), streams }])
        }
        (None, Some(list)) => {
            if let Some(s) = streams {
                w.issue(s.path(), "with `sources`, streams belong to each source");
            }
            if !is_ctf {
                w.issue(list.path(), "`sources` (joining by sequence key) exists for the ctf format only");
            }
            let items = w.array(&list)?;
            if items.is_empty() {
                w.issue(list.path(), "expected at least one source");
            }
            let mut out = Vec::new();
            for item in &items {
                let mut st = w.table(item)?;
                let files = st.take("files").and_then(|f| w.path_list(&f));
                if files.is_none() && !st.had("files") {
                    w.issue(&st.key_path("files"), "missing: a list of paths or globs");
                }
                let skip = st.boolean(w, "skip_sequence_ids").or(top_skip).unwrap_or(false);
                let streams = if let Some(s) = st.take("streams") {
                    parse_streams(w, &s, Some(FormatKind::Ctf))
                } else {
                    w.issue(&st.key_path("streams"), "missing: each source needs at least one stream");
                    None
                };
                w.finish(st);
                if let (Some(files), Some(streams)) = (files, streams) {
                    out.push(SourceConfig { files, skip_sequence_ids: skip, streams });
                }
            }
            (out.len() == items.len()).then_some(out)
        }
    }
}

fn parse_streams(w: &mut Walker, node: &Node<'_>, format: Option<FormatKind>) -> Option<Vec<StreamConfig>> {
    let is_ctf = format.is_none_or(|f| f == FormatKind::Ctf);
    let mut t = w.table(node)?;
    let mut out = Vec::new();
    let mut aliases = BTreeMap::new();
    let mut ok = true;
    if format == Some(FormatKind::WholeFile) {
        w.issue(node.path(), "a whole_file dataset's streams are fixed (contents and path): no streams table");
        ok = false;
    }
    for (name, n) in t.drain() {
        if format == Some(FormatKind::WholeFile) {
            continue;
        }
        if !is_ctf {
            w.issue(n.path(), "streams are fixed by the deepx formats; configure them with label_size, w, uuid, x_size, x_hist_item_size");
            ok = false;
            continue;
        }
        let Some((alias, stream)) = parse_stream(w, &name, &n) else {
            ok = false;
            continue;
        };
        // Each alias once, whether or not the streams are otherwise valid (found by a probe: a
        // stream with a bad `dim` hid a duplicate alias, and `validate` reported every problem
        // but that one).
        if let Some(prev) = aliases.insert(alias.clone(), name.clone()) {
            w.issue(
                &format!("{}.{name}.alias", node.path()),
                &format!("alias '{alias}' is already mapped to stream '{prev}'"),
            );
        }
        match stream {
            Some(s) => out.push(s),
            None => ok = false,
        }
    }
    w.finish(t);
    if out.is_empty() && ok && is_ctf {
        w.issue(node.path(), "expected at least one stream");
        return None;
    }
    ok.then_some(out)
}

/// The stream's alias (its name unless set), and the stream when it is valid.
fn parse_stream(w: &mut Walker, name: &str, node: &Node<'_>) -> Option<(String, Option<StreamConfig>)> {
    let mut t = w.table(node)?;
    let alias = t.string(w, "alias").unwrap_or_else(|| name.to_owned());
    if alias.is_empty() {
        w.issue(&t.key_path("alias"), "must not be empty");
    } else if alias.bytes().any(|b| b <= b' ' || b >= 0x80 || b == b'|') || alias.starts_with('#') {
        w.issue(
            &t.key_path("alias"),
            &format!("'{alias}' can never match: an alias is printable ASCII without spaces or '|' and does not start with '#'"),
        );
    }
    let format = match t.string(w, "format").map(|s| s.to_ascii_lowercase()).as_deref() {
        Some("dense") => Some(StreamFormat::Dense),
        Some("sparse") => Some(StreamFormat::Sparse),
        Some(other) => {
            w.issue(&t.key_path("format"), &format!("unknown stream format '{other}': expected dense or sparse"));
            None
        }
        None => {
            w.issue(&t.key_path("format"), "missing: expected dense or sparse");
            None
        }
    };
    let max_dim = if format == Some(StreamFormat::Sparse) { MAX_SPARSE_DIM } else { MAX_DENSE_DIM };
    let dim = t.uint(w, "dim", 1, max_dim);
    if dim.is_none() && !t.had("dim") {
        w.issue(&t.key_path("dim"), "missing: the sample dimension");
    }
    let defines_mb_size = t.boolean(w, "defines_mb_size").unwrap_or(false);
    w.finish(t);
    let stream = match (dim.and_then(|d| usize::try_from(d).ok()), format) {
        (Some(dim), Some(format)) => {
            Some(StreamConfig { name: name.to_owned(), alias: alias.clone(), dim, format, defines_mb_size })
        }
        _ => None,
    };
    Some((alias, stream))
}

fn check_streams(w: &mut Walker, path: &str, sources: &[SourceConfig]) {
    let mut names = BTreeMap::new();
    let mut defining = Vec::new();
    for (si, src) in sources.iter().enumerate() {
        for s in &src.streams {
            if names.insert(s.name.as_str(), si).is_some() {
                w.issue(&format!("{path}.streams.{}", s.name), "a stream of this name exists in another source");
            }
            if s.defines_mb_size {
                defining.push(s.name.as_str());
            }
        }
    }
    if defining.len() > 1 {
        w.issue(
            path,
            &format!(
                "only a single stream is allowed to define the minibatch size, but {} found: {}",
                defining.len(),
                defining.join(", ")
            ),
        );
    }
}

fn parse_sampling(w: &mut Walker, node: &Node<'_>) -> Option<SamplingDefaults> {
    let mut t = w.table(node)?;
    let randomize = t.boolean(w, "randomize").unwrap_or(true);
    let chunks = t.usize(w, "window_chunks", 0, usize::MAX);
    let samples = t.uint(w, "window_samples", 0, u64::MAX);
    let seed = t.uint(w, "seed", 0, u64::MAX).unwrap_or(0);
    let window = match (chunks, samples) {
        (Some(_), Some(_)) => {
            w.issue(node.path(), "set window_chunks or window_samples, not both");
            Window::Chunks(DEFAULT_WINDOW_CHUNKS)
        }
        (c, s) => Window::from_options(c, s, Window::Chunks(DEFAULT_WINDOW_CHUNKS)),
    };
    w.finish(t);
    Some(SamplingDefaults { randomize, window, seed })
}
