//! One sample's values, CNTK's `TryReadDenseSample` and `TryReadSparseSample`: the innermost loops
//! of the CTF parse, apart from the sequence and row logic of [`super::CtfDecoder`] that calls them.

use super::{is_non_printable, is_value_delim, StreamBuf};
use crate::format::ctf::element::Element;
use crate::format::ctf::index::show_byte;
use crate::format::ctf::number::{parse_index, parse_real, IndexError};
use crate::format::ctf::scan::{dense_values, DenseOut};
use crate::format::errors::ErrorKind;

pub(super) type SampleError = (usize, ErrorKind, String);

/// `TryReadDenseSample`: values up to `|` or a non-printable byte; pads to `dim`, rejects more.
#[inline]
pub(super) fn read_dense<T: Element>(
    bytes: &[u8],
    mut p: usize,
    dim: usize,
    buf: &mut StreamBuf<T>,
    fast: bool,
    kernel: bool,
) -> Result<usize, SampleError> {
    let (mark, start) = (buf.values.len(), p);
    if mark.saturating_add(dim) > buf.max_values {
        // The sequence fails once its rows are read; nothing more is stored.
        buf.over_limit = true;
        return Ok(bytes.len());
    }
    // The sample's `dim` values, zero until read: a short sample is padded by construction.
    buf.values.resize(mark + dim, T::default());
    // Past `dim` the sample is rejected anyway: keep scanning for syntax, stop storing.
    let mut out = DenseOut::new(&mut buf.values[mark..]);
    let n = bytes.len();
    while p < n {
        // Plain decimals a window at a time; the byte loop below takes whatever they are not.
        if fast {
            p = dense_values(bytes, p, &mut out, kernel);
        }
        let Some(&c) = bytes.get(p) else { break };
        if is_value_delim(c) {
            p += 1;
            continue;
        }
        if is_non_printable(c) || c == b'|' {
            break;
        }
        match parse_real(bytes, p) {
            Ok((v, np)) => {
                out.push(v);
                p = np;
            }
            Err((e, at)) => {
                buf.values.truncate(mark);
                let found = bytes.get(at).map_or_else(|| "the end of the sequence".to_owned(), |&b| show_byte(b));
                return Err((at, ErrorKind::BadNumber, format!("expected {}, found {found}", e.expected())));
            }
        }
    }
    let count = out.count;
    if p >= n {
        // Cut by the end of the bytes (CNTK's `TryReadDenseSample` there): valid with at least
        // one value, and not length-checked — the first `dim` values are kept.
        if count == 0 {
            buf.values.truncate(mark);
            return Err((
                p,
                ErrorKind::BadNumber,
                "expected a value, found the end of the sequence (no newline at the end of the file; there a dense sample needs at least one value)".into(),
            ));
        }
    } else if count > dim {
        buf.values.truncate(mark);
        // Where the first value past `dim` is (found again only here, off the hot loop).
        let at = value_start(bytes, start, dim).unwrap_or(p);
        let message =
            format!("dense sample has {count} values, more than dim = {dim}: the first extra value starts here");
        return Err((at, ErrorKind::DenseTooLong, message));
    }
    buf.samples += 1;
    Ok(p)
}

/// Where value `i` (0-based) of a dense sample whose values start at or after `from` starts,
/// read as [`read_dense`]'s byte loop reads them (numbers may touch: `3-4` is two values).
fn value_start(bytes: &[u8], from: usize, i: usize) -> Option<usize> {
    let mut seen = 0;
    let mut p = from;
    while let Some(&c) = bytes.get(p) {
        if is_value_delim(c) {
            p += 1;
            continue;
        }
        if is_non_printable(c) || c == b'|' {
            return None;
        }
        if seen == i {
            return Some(p);
        }
        seen += 1;
        p = parse_real(bytes, p).ok()?.1;
    }
    None
}

/// `TryReadSparseSample`: `index:value` entries, `index < dim`; an empty sample is valid.
#[inline]
pub(super) fn read_sparse<T: Element>(
    bytes: &[u8],
    mut p: usize,
    dim: usize,
    buf: &mut StreamBuf<T>,
) -> Result<usize, SampleError> {
    let mark = buf.values.len();
    let n = bytes.len();
    let fail = |buf: &mut StreamBuf<T>, at: usize, kind: ErrorKind, msg: String| {
        buf.values.truncate(mark);
        buf.indices.truncate(mark);
        Err((at, kind, msg))
    };
    while p < n {
        let c = bytes[p];
        if is_value_delim(c) {
            p += 1;
            continue;
        }
        if is_non_printable(c) || c == b'|' {
            break;
        }
        let (index, np) = match parse_index(bytes, p) {
            Ok(x) => x,
            Err((IndexError::NoDigits, at)) => {
                return fail(
                    buf,
                    at,
                    ErrorKind::BadSparseEntry,
                    format!("expected a sparse index (digits), found {}", show_byte(bytes[at])),
                );
            }
            Err((IndexError::Overflow, at)) => {
                return fail(buf, at, ErrorKind::BadSparseEntry, "sparse index overflows 64 bits".into());
            }
        };
        if index >= dim as u64 {
            return fail(
                buf,
                p,
                ErrorKind::SparseIndexOutOfRange,
                format!("sparse index {index} exceeds the maximum {}", dim - 1),
            );
        }
        p = np;
        match bytes.get(p) {
            Some(b':') => p += 1,
            Some(&b) => {
                return fail(
                    buf,
                    p,
                    ErrorKind::BadSparseEntry,
                    format!("expected ':' after sparse index {index}, found {}", show_byte(b)),
                );
            }
            None => {
                return fail(
                    buf,
                    p,
                    ErrorKind::BadSparseEntry,
                    format!("expected ':' after sparse index {index}, found the end of the sequence"),
                )
            }
        }
        match parse_real(bytes, p) {
            Ok((v, np)) => {
                buf.values.push(T::from_f64(v));
                #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
                buf.indices.push(index as i32); // index < dim <= i32::MAX (validated config)
                p = np;
            }
            Err((e, at)) => {
                let found = bytes.get(at).map_or_else(|| "the end of the sequence".to_owned(), |&b| show_byte(b));
                return fail(
                    buf,
                    at,
                    ErrorKind::BadSparseEntry,
                    format!("expected {} after '{index}:', found {found}", e.expected()),
                );
            }
        }
    }
    if p >= n {
        // Cut by the end of the bytes (CNTK's `TryReadSparseSample` there): valid only if the
        // stream has an entry in this sequence, in this sample or an earlier one.
        let sequence_start = buf.seq_offsets.last().and_then(|&s| buf.sample_offsets.get(s)).copied().unwrap_or(0);
        if buf.values.len() == sequence_start {
            return fail(
                buf,
                p,
                ErrorKind::BadSparseEntry,
                "expected a sparse entry (index:value), found the end of the sequence (no newline at the end of the file; there an empty sample is valid only after an entry of its stream in the sequence)".into(),
            );
        }
    }
    buf.sample_offsets.push(buf.values.len());
    buf.samples += 1;
    Ok(p)
}
