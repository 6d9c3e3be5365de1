//! CSV as TensorFlow reads it: `tf.data.TextLineDataset` (every line a record) and
//! `tf.io.decode_csv` (fields, quotes, defaults, numbers).
//!
//! **Reader.** Every line is a record — an empty line too — after the first `skip_header_lines`
//! lines of each file; a last line without a newline is a record, a file's final newline ends
//! its last record. Record keys and "lines" are 0-based line numbers, so every error names the
//! file's own line. The index pass reads the file once (line ends and the CRC-32 digest).
//!
//! **Decoder** (`decode_csv`'s rules, checked against TensorFlow 2.21):
//! * every `\r` of a line is dropped first (`TextLineDataset` drops them all, not only before the
//!   newline);
//! * an empty line has no field; otherwise fields are split at `field_delim`, a trailing
//!   delimiter making one more (empty) field; a record must have exactly `columns` fields;
//! * with `use_quote_delim`, a field that starts with `"` is quoted: it ends at a `"` followed by
//!   the delimiter or the line's end, and `""` inside is one `"`; a quoted field that does not end
//!   so, and an unquoted field holding a `"`, are malformed;
//! * a field that is empty or equal to `na_value` takes its stream's default, or is malformed when
//!   the stream has none (a required column);
//! * `float32` and `float64` fields: decimal numbers with optional sign, exponent and ASCII
//!   whitespace around, `inf`, `infinity` and `nan` in any case, hexadecimal (`0x1p3`); a value
//!   beyond the type's range is infinity, one below it zero. `int32` and `int64` fields: decimal
//!   integers with optional sign and whitespace around, within the type's range;
//! * deliberate differences (`docs/differences.md`): an integer the dataset's precision cannot hold
//!   exactly, and a hexadecimal float that its type cannot hold exactly, make the record malformed
//!   rather than a rounded value.
//!
//! A malformed record is a place charged to `max_errors` (`bad_line`), delivered as a sequence of
//! 0 samples, its message naming the field and what was expected.

use std::borrow::Cow;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use crate::format::chunk::{StreamData, StreamKind, StreamSpec};
use crate::format::ctf::StreamBuf;
use crate::format::deepx::DeepxElement;
use crate::format::deepx::LineContext as RecordAt;
use crate::format::errors::{DataError, ErrorKind, Locate, Location, Malformed};
use crate::format::index::{
    index_local, read_as_sized, read_full, room_for_one_more, FileIndex, SequenceDesc, Sequences,
};
use crate::format::parts;
use crate::format::stream_buf::{record_buffer, StreamBufDecoder, MAX_RESERVED_VALUES};
use crate::options::IndexLimits;
pub use crate::options::{CsvLayout, CsvOptions, CsvStream, CsvType, CsvValue};

/// Size of the read buffer of the index pass.
const BLOCK_BYTES: usize = 256 << 10;

/// Longest line: a record is one sequence, whose size the index keeps in a `u32`.
pub const MAX_LINE_BYTES: u64 = u32::MAX as u64;

/// Indexes the local file `data` (named `name` in errors): a large file in parts on up to
/// `threads` threads (every line is a record, so a part may start at any line); the same index
/// as the one-thread pass, which runs where the parts cannot (a part that fails, a header longer
/// than the first part).
///
/// # Errors
/// I/O errors, a line longer than [`MAX_LINE_BYTES`], a limit exceeded.
pub fn index_file(
    data: &Path,
    name: Arc<Path>,
    layout: CsvLayout,
    limits: IndexLimits,
    threads: usize,
    progress: &mut dyn FnMut(u64),
) -> Result<FileIndex, DataError> {
    let file = minibatchd_sys::files::open_regular(data).map_err(|e| DataError::io(&name, e))?;
    let size = file.metadata().map_err(|e| DataError::io(&name, e))?.len();
    if let Some(index) = index_in_parts(&file, &name, size, layout, limits, threads, progress)? {
        return Ok(index);
    }
    index_local(data, &name.clone(), |file, size| index_reader(file, name, size, layout, limits, progress))
}

/// A record's line of `bytes` bytes as the index holds its size, within the largest sequence
/// the limits allow (a record of many empty fields costs far more parsed than as text: found by
/// a probe, a 40 MB line of commas took 985 MB to be found malformed), and within
/// [`MAX_LINE_BYTES`].
fn record_size(bytes: u64, limits: &IndexLimits, at: impl FnOnce() -> Location) -> Result<u32, DataError> {
    match u32::try_from(bytes) {
        Ok(size) if bytes <= limits.largest_sequence() => Ok(size),
        Ok(_) => Err(DataError::Fatal {
            at: at(),
            message: format!(
                "a line of {bytes} bytes exceeds the largest allowed, {} bytes ({})",
                limits.largest_sequence(),
                crate::options::largest_sequence_why()
            ),
        }),
        Err(_) => Err(DataError::Fatal {
            at: at(),
            message: format!("a line of {bytes} bytes; at most {MAX_LINE_BYTES} are read"),
        }),
    }
}

/// One part's lines: every line a record, but the first part's header lines.
struct LinePass {
    path: Arc<Path>,
    line_no: u64,
    skip: u64,
    sequences: Sequences,
    limits: IndexLimits,
}

impl LinePass {
    fn line(&mut self, line: &[u8], offset: u64) -> Result<(), DataError> {
        let line_no = self.line_no;
        self.line_no += 1;
        if line_no < self.skip {
            return Ok(());
        }
        let at = || Location { file: self.path.clone(), line: line_no + 1, offset };
        let size = record_size(line.len() as u64, &self.limits, at)?;
        let s = SequenceDesc { key: line_no, offset, line: line_no, size, samples: 1 };
        room_for_one_more(&self.sequences, &s, &self.limits, at)?;
        self.sequences.push(s);
        Ok(())
    }
}

/// [`index_file`]'s pass in parts; `None` when the file is too small for parts or a part
/// cannot be trusted (the one-thread pass then runs and reports any error).
fn index_in_parts(
    file: &std::fs::File,
    name: &Arc<Path>,
    size: u64,
    layout: CsvLayout,
    limits: IndexLimits,
    threads: usize,
    progress: &mut dyn FnMut(u64),
) -> Result<Option<FileIndex>, DataError> {
    let parts = parts::parts_for(size, threads);
    if parts < 2 {
        return Ok(None);
    }
    let cuts = parts::cuts(file, size, parts, |_, at| Ok(Some(at))).map_err(|e| DataError::io(name, e))?;
    if cuts.is_empty() {
        return Ok(None);
    }
    let share = parts::part_limits(limits, cuts.len() + 1);
    let passes = (0..=cuts.len())
        .map(|i| LinePass {
            path: name.clone(),
            line_no: 0,
            // Header lines are the file's first: only the first part has them.
            skip: if i == 0 { layout.skip_header_lines } else { 0 },
            sequences: Sequences::default(),
            limits: share,
        })
        .collect();
    let max_line = limits.max_sequence_bytes.min(MAX_LINE_BYTES);
    let reading = parts::Parts { file, path: name, cuts, block_bytes: BLOCK_BYTES, max_line_bytes: max_line };
    let Some((scanned, digest)) = parts::scan(&reading, passes, progress, LinePass::line) else { return Ok(None) };
    if scanned.first().is_some_and(|s| s.lines < layout.skip_header_lines) {
        // More header lines than the first part holds: the one-thread pass skips them.
        return Ok(None);
    }
    if scanned.last().map_or(0, |s| s.end) != size {
        // The file changed size while it was read: the one-thread pass says so.
        return Ok(None);
    }
    let found = scanned.into_iter().map(|s| (s.pass.sequences, s.lines)).collect();
    let sequences = parts::merge(found, true, &limits, name)?;
    Ok(Some(FileIndex { path: name.clone(), size, digest, sequences }))
}

/// Indexes the `size` bytes `reader` yields (a file, or an object streamed from object storage).
///
/// # Errors
/// As [`index_file`].
pub fn index_reader(
    mut reader: impl Read,
    name: Arc<Path>,
    size: u64,
    layout: CsvLayout,
    limits: IndexLimits,
    progress: &mut dyn FnMut(u64),
) -> Result<FileIndex, DataError> {
    let mut buf = vec![0u8; BLOCK_BYTES];
    let mut digest = crc32fast::Hasher::new();
    let mut sequences = Sequences::default();
    // The current line: its number and first byte.
    let (mut line, mut start) = (0u64, 0u64);
    let mut read = 0u64;
    let push = |line: u64, start: u64, end: u64, sequences: &mut Sequences| -> Result<(), DataError> {
        if line < layout.skip_header_lines {
            return Ok(());
        }
        let at = || Location { file: name.clone(), line: line + 1, offset: start };
        let size = record_size(end - start, &limits, at)?;
        let s = SequenceDesc { key: line, offset: start, line, size, samples: 1 };
        room_for_one_more(sequences, &s, &limits, at)?;
        sequences.push(s);
        Ok(())
    };
    loop {
        let n = read_full(&mut reader, &mut buf).map_err(|e| DataError::io(&name, e))?;
        if n == 0 {
            break;
        }
        digest.update(&buf[..n]);
        for nl in memchr::memchr_iter(b'\n', &buf[..n]) {
            let end = read + nl as u64 + 1;
            push(line, start, end, &mut sequences)?;
            line += 1;
            start = end;
        }
        read += n as u64;
        progress(read);
    }
    // A last line without a newline.
    if start < read {
        push(line, start, read, &mut sequences)?;
    }
    read_as_sized(&name, read, size)?;
    sequences.shrink_to_fit();
    Ok(FileIndex { path: name, size, digest: digest.finalize(), sequences })
}

/// Decodes CSV records into dense streams.
#[derive(Debug, Clone, PartialEq)]
pub struct CsvDecoder {
    options: CsvOptions,
    streams: Vec<CsvStream>,
    /// Each column's type as the fast path reads it, when it can read this dataset's lines
    /// ([`CsvDecoder::fill_fast`]); `None` for a column no stream reads.
    fast: Option<Vec<Option<CsvType>>>,
}

/// Most columns the fast path reads a line of (its values sit on the stack).
const FAST_COLUMNS: usize = 64;

/// A number of a line the fast path read, before it goes to its streams.
#[derive(Clone, Copy)]
enum FastValue {
    Float(f64),
    Int(i64),
}

/// The integer `i` as a `T`, when `T` holds it exactly (`limit`: the precision's exact range).
fn exact_int<T: DeepxElement>(i: i64, limit: i64) -> Option<T> {
    #[allow(clippy::cast_precision_loss)]
    let t = T::from_f64(i as f64);
    let back: f64 = t.into();
    #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
    let exact = i.unsigned_abs() <= limit.unsigned_abs() || (back.is_finite() && back as i128 == i128::from(i));
    exact.then_some(t)
}

impl CsvDecoder {
    /// A decoder of `streams` (their columns below `options.columns`: checked by the config).
    #[must_use]
    pub fn new(options: CsvOptions, streams: Vec<CsvStream>) -> Self {
        // The fast path reads numbers only, and never a field that could equal `na_value`.
        let na_is_number = !options.na_value.is_empty() && options.na_value.iter().all(|&b| is_fast_byte(b));
        let mut types: Vec<Option<CsvType>> = vec![None; options.columns];
        let mut fast = options.columns <= FAST_COLUMNS && !na_is_number;
        for s in &streams {
            for &c in &s.columns {
                match types.get_mut(c) {
                    Some(t @ None) if s.dtype != CsvType::String => *t = Some(s.dtype),
                    Some(Some(t)) if *t == s.dtype => {}
                    _ => fast = false,
                }
            }
        }
        Self { options, streams, fast: fast.then_some(types) }
    }

    /// The same decoder without its fast path (for tests that compare the two).
    #[must_use]
    pub fn without_fast_path(mut self) -> Self {
        self.fast = None;
        self
    }

    /// Whether lines may take the fast path ([`CsvDecoder::fill_fast`]).
    #[must_use]
    pub fn has_fast_path(&self) -> bool {
        self.fast.is_some()
    }

    /// The common line without splitting it into fields: every field a plain number
    /// (`[+-]digits[.digits]` for floats, within the fast decimal's digits; `[+-]digits` for
    /// integers), no quote, no `\r`, no empty field, exactly `columns` fields, and every integer
    /// exact in the precision — then the values are what [`CsvDecoder::fill`] reads, bit for bit,
    /// and go to the streams; anything else returns false with nothing written, and the general
    /// path decides.
    fn fill_fast<T: DeepxElement>(&self, types: &[Option<CsvType>], line: &[u8], out: &mut [StreamBuf<T>]) -> bool {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let delim = self.options.field_delim;
        let mut values = [FastValue::Int(0); FAST_COLUMNS];
        let mut p = 0;
        for (c, ty) in types.iter().enumerate() {
            let start = p;
            while p < line.len() && line[p] != delim {
                p += 1;
            }
            let field = &line[start..p];
            let last = c + 1 == types.len();
            // Each field ends at a delimiter, the last one at the line's end.
            if last != (p == line.len()) {
                return false;
            }
            p += 1;
            values[c] = match ty {
                None => {
                    if field.iter().any(|&b| b == b'"' || b == b'\r') {
                        return false;
                    }
                    continue;
                }
                Some(CsvType::F32) => match fast_decimal(field, true) {
                    Some(v) => FastValue::Float(v),
                    None => return false,
                },
                Some(CsvType::F64) => match fast_decimal(field, false) {
                    Some(v) => FastValue::Float(v),
                    None => return false,
                },
                Some(t @ (CsvType::I32 | CsvType::I64)) => match fast_int(field, *t == CsvType::I32) {
                    Some(v) => FastValue::Int(v),
                    None => return false,
                },
                Some(CsvType::String) => return false,
            };
        }
        let limit: i64 = if std::mem::size_of::<T>() == 4 { 1 << 24 } else { 1 << 53 };
        // Every integer exact in the precision before anything is written.
        if values[..types.len()].iter().any(|v| matches!(*v, FastValue::Int(i) if exact_int::<T>(i, limit).is_none())) {
            return false;
        }
        for (s, buf) in self.streams.iter().zip(out.iter_mut()) {
            buf.values.extend(s.columns.iter().map(|&c| match values[c] {
                FastValue::Float(f) => T::from_f64(f),
                FastValue::Int(i) => exact_int::<T>(i, limit).unwrap_or_else(|| T::from_f64(0.0)),
            }));
        }
        true
    }

    /// Fills a sample of each stream from `line`; or what is wrong, and in which field (its byte
    /// offset in the line is then the error's).
    fn fill<T: DeepxElement>(&self, line: &[u8], out: &mut [StreamBuf<T>]) -> Result<(), (String, Option<usize>)> {
        if let Some(types) = &self.fast {
            if self.fill_fast(types, line, out) {
                return Ok(());
            }
        }
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line: Cow<'_, [u8]> = if line.contains(&b'\r') {
            Cow::Owned(line.iter().copied().filter(|&b| b != b'\r').collect())
        } else {
            Cow::Borrowed(line)
        };
        let fields =
            split_fields_upto(&line, self.options.field_delim, self.options.use_quote_delim, self.options.columns)
                .map_err(|e| (e.message, Some(e.field)))?;
        if fields.len() != self.options.columns {
            return Err((format!("expected {} fields, found {}", self.options.columns, fields.len()), None));
        }
        let limit: i64 = if std::mem::size_of::<T>() == 4 { 1 << 24 } else { 1 << 53 };
        for (s, buf) in self.streams.iter().zip(out.iter_mut()) {
            for &c in &s.columns {
                let mut one = || -> Result<(), String> {
                    let field: &[u8] = &fields[c];
                    let missing = field.is_empty()
                        || (!self.options.na_value.is_empty() && field == self.options.na_value.as_slice());
                    let required = || format!("field {c} (stream '{}') is required but missing", s.name);
                    if s.dtype == CsvType::String {
                        // The field as it is; a missing one is the default string or an error.
                        let text = match (&s.default, missing) {
                            (_, false) => field,
                            (Some(CsvValue::Text(d)), true) => d.as_slice(),
                            (_, true) => return Err(required()),
                        };
                        buf.bytes.extend_from_slice(text);
                        buf.sample_offsets.push(buf.bytes.len());
                        return Ok(());
                    }
                    let value = if missing {
                        s.default.clone().ok_or_else(required)?
                    } else {
                        parse_field(field, s.dtype).ok_or_else(|| {
                            format!(
                                "field {c} (stream '{}') is not a valid {}: {}",
                                s.name,
                                s.dtype.name(),
                                crate::format::errors::quoted(field)
                            )
                        })?
                    };
                    let v = match value {
                        CsvValue::Float(f) => T::from_f64(f),
                        CsvValue::Int(i) => exact_int::<T>(i, limit).ok_or_else(|| {
                            format!(
                                "field {c} (stream '{}') is {i}, which the dataset's precision cannot hold exactly \
                                 (integers up to ±{limit}); {}",
                                s.name,
                                if std::mem::size_of::<T>() == 4 {
                                    "use precision = \"float64\""
                                } else {
                                    "no precision holds it exactly: read the column as a string (dtype = \"string\")"
                                }
                            )
                        })?,
                        CsvValue::Text(_) => return Err(format!("field {c} (stream '{}'): a string default", s.name)),
                    };
                    buf.values.push(v);
                    Ok(())
                };
                one().map_err(|m| (m, Some(c)))?;
            }
        }
        Ok(())
    }
}

impl StreamBufDecoder for CsvDecoder {
    fn specs(&self) -> Vec<StreamSpec> {
        self.streams
            .iter()
            .map(|s| match s.dtype {
                CsvType::String => StreamSpec { name: s.name.clone(), kind: StreamKind::Strings, dim: 0 },
                _ => StreamSpec { name: s.name.clone(), kind: StreamKind::Dense, dim: s.columns.len() },
            })
            .collect()
    }

    fn buffers<T: DeepxElement>(&self, records: usize) -> Vec<StreamBuf<T>> {
        self.streams
            .iter()
            .map(|s| {
                let mut b = record_buffer(records);
                if s.dtype != CsvType::String {
                    b.values.reserve(records.saturating_mul(s.columns.len()).min(MAX_RESERVED_VALUES));
                }
                b
            })
            .collect()
    }

    /// Decodes one line (its newline included or not) into a sample of each stream, or a
    /// malformed place and a sequence of 0 samples.
    fn decode_record<T: DeepxElement>(
        &self,
        line: &[u8],
        at: &RecordAt<'_>,
        out: &mut [StreamBuf<T>],
        errors: &mut Vec<Malformed>,
    ) {
        let result = self.fill(line, out);
        if let Err((message, field)) = result {
            for (b, s) in out.iter_mut().zip(&self.streams) {
                if s.dtype == CsvType::String {
                    b.sample_offsets.truncate(b.samples + 1);
                    b.bytes.truncate(b.sample_offsets.last().copied().unwrap_or(0));
                } else {
                    b.values.truncate(b.samples * s.columns.len());
                }
                b.seq_offsets.push(b.samples);
            }
            // The field's first byte (found by a probe: every error named the line's).
            let mut place = at.location();
            if let Some(k) = field {
                let text = line.strip_suffix(b"\n").unwrap_or(line);
                let (delim, quotes) = (self.options.field_delim, self.options.use_quote_delim);
                place.offset += field_starts(text, delim, quotes).nth(k).unwrap_or(0) as u64;
            }
            errors.push(Malformed { kind: ErrorKind::BadLine, at: place, message });
            return;
        }
        for (b, s) in out.iter_mut().zip(&self.streams) {
            // A sample a record, or a string a column.
            b.samples += if s.dtype == CsvType::String { s.columns.len() } else { 1 };
            b.seq_offsets.push(b.samples);
        }
    }

    fn chunk_streams<T: DeepxElement>(&self, out: Vec<StreamBuf<T>>) -> Vec<StreamData> {
        out.into_iter()
            .zip(&self.streams)
            .map(|(b, s)| match s.dtype {
                CsvType::String => b.into_strings_data(),
                _ => b.into_stream_data(s.columns.len(), false),
            })
            .collect()
    }
}

mod split;

use split::field_starts;
pub use split::{split_fields, split_fields_upto, FieldError};

mod number;

pub use number::parse_field;
use number::{fast_decimal, fast_int, is_fast_byte};

#[cfg(test)]
mod tests;
