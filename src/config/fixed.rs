//! Configuration of a `fixed_length` dataset: the files' layout and the streams each record holds
//! (`docs/config.md`, "`fixed_length`").
//!
//! | key | default | rule |
//! |---|---|---|
//! | `record_bytes` | — | bytes per record, 1..=2^30 |
//! | `header_bytes`, `footer_bytes` | 0 | bytes before the first and after the last record of each file |
//! | stream `dtype` | — | `decode_raw`'s type: 8- to 64-bit integers, `float16`, `float32`, `float64` |
//! | stream `offset` | 0 | byte offset of the stream's first value in the record |
//! | stream `dim` | what is left of the record from `offset` | values per record |
//! | stream `little_endian` | true | byte order of the values |

use minibatchd_engine::format::fixed::{FixedLengthOptions, RawStream, RawType, MAX_RECORD_BYTES};
use minibatchd_engine::options::{FixedConfig, StreamConfig};

use super::dense_streams;
use super::walk::{Node, Table, Walker};
use super::MAX_DENSE_DIM;

/// The layout keys and `streams` of a `fixed_length` dataset table: the stream configs and the
/// layout, in name order; `None` after an issue.
pub(crate) fn parse(w: &mut Walker, t: &mut Table<'_>) -> Option<(Vec<StreamConfig>, FixedConfig)> {
    let record_bytes = t.uint(w, "record_bytes", 1, u64::from(MAX_RECORD_BYTES)).and_then(|r| u32::try_from(r).ok());
    if record_bytes.is_none() && !t.had("record_bytes") {
        w.issue(&t.key_path("record_bytes"), "missing: the bytes of each record");
    }
    let header_bytes = t.uint(w, "header_bytes", 0, u64::MAX / 4).unwrap_or(0);
    let footer_bytes = t.uint(w, "footer_bytes", 0, u64::MAX / 4).unwrap_or(0);
    let streams = dense_streams(
        w,
        t,
        "missing: a fixed_length dataset needs at least one stream (a slice of its records)",
        |w, name, n| {
            stream(w, name, n, record_bytes).map(|s| {
                let dim = s.dim;
                (s, dim)
            })
        },
    );
    let layout = FixedLengthOptions { record_bytes: record_bytes?, header_bytes, footer_bytes };
    let (configs, streams) = streams?;
    Some((configs, FixedConfig { layout, streams }))
}

fn stream(w: &mut Walker, name: &str, node: &Node<'_>, record_bytes: Option<u32>) -> Option<RawStream> {
    let mut t = w.table(node)?;
    let dtype = if let Some(d) = t.string(w, "dtype") {
        RawType::parse(&d).or_else(|| {
            w.issue(&t.key_path("dtype"), &format!("unknown dtype '{d}': expected one of {}", RawType::NAMES));
            None
        })
    } else {
        w.issue(&t.key_path("dtype"), &format!("missing: the values' type, one of {}", RawType::NAMES));
        None
    };
    let offset = t.uint(w, "offset", 0, u64::from(MAX_RECORD_BYTES)).unwrap_or(0);
    let dim = t.uint(w, "dim", 1, MAX_DENSE_DIM);
    let dim_given = t.had("dim");
    let little_endian = t.boolean(w, "little_endian").unwrap_or(true);
    let path = node.path().to_owned();
    w.finish(t);
    let (dtype, record) = (dtype?, u64::from(record_bytes?));
    let size = dtype.size() as u64;
    let dim = match dim {
        Some(d) => d,
        None if dim_given => return None,
        // What is left of the record, as decode_raw of the whole record reads it.
        None if offset < record && (record - offset) % size == 0 => (record - offset) / size,
        None => {
            w.issue(
                &path,
                &format!(
                    "the {} bytes of the record from offset {offset} are not whole {} values ({size} bytes each): give dim",
                    record.saturating_sub(offset),
                    dtype.name()
                ),
            );
            return None;
        }
    };
    if offset + dim * size > record {
        w.issue(
            &path,
            &format!("reads bytes {offset}..{} of a record of {record} bytes (dim {dim} × {size} bytes from offset {offset})", offset + dim * size),
        );
        return None;
    }
    Some(RawStream {
        name: name.to_owned(),
        dtype,
        offset: usize::try_from(offset).ok()?,
        dim: usize::try_from(dim).ok()?,
        little_endian,
    })
}
