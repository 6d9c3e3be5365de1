//! Fixed-length records (TensorFlow's `FixedLengthRecordDataset`) and their raw decoder
//! (`tf.io.decode_raw`): the small format that `docs/formats.md` walks through as the example of
//! adding one.
//!
//! **Reader.** A file is `header_bytes`, then records of exactly `record_bytes` each, then
//! `footer_bytes`. As TensorFlow, a file smaller than its header and footer, or whose body (what
//! lies between them) is not a whole number of records, is refused — the whole file, naming it,
//! its body length and the record length; so is an empty body, which TensorFlow reads as no record
//! (a dataset with an input of no record is a configuration mistake worth a word). Record `i`
//! (0-based) is at byte `header_bytes + i × record_bytes`; its key and "line" are `i`. The index
//! pass reads the whole file once for its CRC-32 digest (the dataset's identity, as for every
//! format).
//!
//! **Decoder.** Each stream is a dense stream of `dim` values of one type (`decode_raw`'s
//! `out_type`: 8- to 64-bit integers, `float16`, `bfloat16`, `float32`, `float64`, `bool`; and
//! `uint32` and `uint64`, which TensorFlow's `decode_raw` lacks) at a byte offset of the record,
//! little- or big-endian. An integer that the dataset's precision does
//! not hold exactly (beyond ±2^24 in `float32`, ±2^53 in `float64`) makes the record a malformed
//! place charged to `max_errors` (a sequence of 0 samples), never a rounded value; floats are
//! converted as a cast (a `float64` value in a `float32` dataset rounds to nearest).

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use crate::format::chunk::{StreamData, StreamKind, StreamSpec};
use crate::format::ctf::StreamBuf;
use crate::format::deepx::DeepxElement;
use crate::format::deepx::LineContext as RecordAt;
use crate::format::errors::{DataError, ErrorKind, Locate, Location, Malformed};
use crate::format::index::{
    index_local, read_as_sized, read_digest, room_for_one_more, FileIndex, SequenceDesc, Sequences,
};
use crate::format::parts;
use crate::format::stream_buf::{record_buffer, StreamBufDecoder, MAX_RESERVED_VALUES};
use crate::options::IndexLimits;
pub use crate::options::{FixedLengthOptions, RawStream, RawType, MAX_RECORD_BYTES};

/// Size of the read buffer of the index pass.
const BLOCK_BYTES: usize = 256 << 10;

/// Indexes the local file `data` (named `name` in errors): its records from the layout, its
/// digest read in parts on up to `threads` threads.
///
/// # Errors
/// I/O errors, a layout the file does not have ([`FixedLengthOptions::records`]), a limit exceeded.
pub fn index_file(
    data: &Path,
    name: Arc<Path>,
    options: FixedLengthOptions,
    limits: IndexLimits,
    threads: usize,
    progress: &mut dyn FnMut(u64),
) -> Result<FileIndex, DataError> {
    let file = minibatchd_sys::files::open_regular(data).map_err(|e| DataError::io(&name, e))?;
    let size = file.metadata().map_err(|e| DataError::io(&name, e))?.len();
    let parts = parts::parts_for(size, threads);
    if parts < 2 {
        return index_local(data, &name.clone(), |file, size| {
            index_reader(file, name, size, options, limits, progress)
        });
    }
    let sequences = records(&name, size, options, limits)?;
    let (digest, read) =
        parts::digest(&file, size, parts, BLOCK_BYTES, progress).map_err(|e| DataError::io(&name, e))?;
    read_as_sized(&name, read, size)?;
    Ok(FileIndex { path: name, size, digest, sequences })
}

/// The records of a file of `size` bytes laid out as `options` says.
fn records(
    name: &Arc<Path>,
    size: u64,
    options: FixedLengthOptions,
    limits: IndexLimits,
) -> Result<Sequences, DataError> {
    let record = options.record_bytes;
    // About the file's layout as a whole: named at its start, record 1 (places are 1-based) —
    // or, for bytes left after the last whole record, where they start, as the record they
    // would begin (found by a probe: they were named at byte 0).
    let records = options.records(size).map_err(|message| {
        let (line, offset) = options
            .leftover(size)
            .map_or((1, 0), |(at, _)| ((at - options.header_bytes) / u64::from(record.max(1)) + 1, at));
        DataError::Fatal { at: Location { file: name.clone(), line, offset }, message }
    })?;
    let mut sequences = Sequences::default();
    for i in 0..records {
        let s = SequenceDesc {
            key: i,
            offset: options.header_bytes + i * u64::from(record),
            line: i,
            size: record,
            samples: 1,
        };
        room_for_one_more(&sequences, &s, &limits, || Location { file: name.clone(), line: i + 1, offset: s.offset })?;
        sequences.push(s);
    }
    sequences.shrink_to_fit();
    Ok(sequences)
}

/// Indexes the `size` bytes `reader` yields (a file, or an object streamed from object storage).
///
/// # Errors
/// As [`index_file`]; also a reader that yields other than `size` bytes.
pub fn index_reader(
    mut reader: impl Read,
    name: Arc<Path>,
    size: u64,
    options: FixedLengthOptions,
    limits: IndexLimits,
    progress: &mut dyn FnMut(u64),
) -> Result<FileIndex, DataError> {
    let sequences = records(&name, size, options, limits)?;
    // The digest: every byte of the file, as the text formats' passes have it (a TFRecord
    // file's is of its records' headers and footers).
    let digest = read_digest(&mut reader, &name, size, BLOCK_BYTES, progress)?;
    Ok(FileIndex { path: name, size, digest, sequences })
}

/// Decodes fixed-length records into dense streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawDecoder {
    streams: Vec<RawStream>,
}

/// One value as read: an integer (exactness checked) or a float (cast).
enum Raw {
    Int(i128),
    Float(f64),
}

impl RawDecoder {
    /// A decoder of `streams` (each within the record: checked by the configuration).
    #[must_use]
    pub fn new(streams: Vec<RawStream>) -> Self {
        Self { streams }
    }

    fn decode_stream<T: DeepxElement>(s: &RawStream, record: &[u8], buf: &mut StreamBuf<T>) -> Result<(), String> {
        let bytes = record.get(s.offset..s.offset.saturating_add(s.bytes())).ok_or_else(|| {
            format!(
                "the record holds {} bytes; stream '{}' reads {} bytes from byte {}",
                record.len(),
                s.name,
                s.bytes(),
                s.offset
            )
        })?;
        let limit: i128 = if std::mem::size_of::<T>() == 4 { 1 << 24 } else { 1 << 53 };
        for (k, v) in bytes.chunks_exact(s.dtype.size()).enumerate() {
            let value = match read_value(s.dtype, v, s.little_endian) {
                Raw::Float(f) => T::from_f64(f),
                Raw::Int(i) => {
                    #[allow(clippy::cast_precision_loss)]
                    let wide = i as f64;
                    let t = T::from_f64(wide);
                    let back: f64 = t.into();
                    #[allow(clippy::cast_possible_truncation)]
                    let exact = i.abs() <= limit || (back.is_finite() && back as i128 == i);
                    if !exact {
                        return Err(format!(
                            "value {k} of stream '{}' is {i}, which the dataset's precision cannot hold exactly \
                             (integers up to ±{limit}); {}",
                            s.name,
                            if std::mem::size_of::<T>() == 4 {
                                "use precision = \"float64\""
                            } else {
                                "no precision holds it exactly (float64 is the widest)"
                            }
                        ));
                    }
                    t
                }
            };
            buf.values.push(value);
        }
        Ok(())
    }
}

impl StreamBufDecoder for RawDecoder {
    fn specs(&self) -> Vec<StreamSpec> {
        self.streams.iter().map(|s| StreamSpec { name: s.name.clone(), kind: StreamKind::Dense, dim: s.dim }).collect()
    }

    fn buffers<T: DeepxElement>(&self, records: usize) -> Vec<StreamBuf<T>> {
        self.streams
            .iter()
            .map(|s| {
                let mut b = record_buffer(records);
                b.values.reserve(records.saturating_mul(s.dim).min(MAX_RESERVED_VALUES));
                b
            })
            .collect()
    }

    /// Decodes one record into a sample of each stream; a record shorter than the streams need,
    /// or an integer the precision does not hold exactly, is a malformed place (a sequence of 0
    /// samples).
    fn decode_record<T: DeepxElement>(
        &self,
        record: &[u8],
        at: &RecordAt<'_>,
        out: &mut [StreamBuf<T>],
        errors: &mut Vec<Malformed>,
    ) {
        for (s, buf) in self.streams.iter().zip(out.iter_mut()) {
            if let Err(message) = Self::decode_stream(s, record, buf) {
                // What the earlier records hold: `dim` values each.
                for (b, s) in out.iter_mut().zip(&self.streams) {
                    b.values.truncate(b.samples * s.dim);
                    b.seq_offsets.push(b.samples);
                }
                errors.push(Malformed { kind: ErrorKind::BadRecord, at: at.location(), message });
                return;
            }
        }
        for b in out.iter_mut() {
            b.samples += 1;
            b.seq_offsets.push(b.samples);
        }
    }

    fn chunk_streams<T: DeepxElement>(&self, out: Vec<StreamBuf<T>>) -> Vec<StreamData> {
        out.into_iter().zip(&self.streams).map(|(b, s)| b.into_stream_data(s.dim, false)).collect()
    }
}

fn read_value(dtype: RawType, v: &[u8], little_endian: bool) -> Raw {
    macro_rules! int {
        ($t:ty) => {{
            let a = v.try_into().unwrap_or([0; std::mem::size_of::<$t>()]);
            Raw::Int(i128::from(if little_endian { <$t>::from_le_bytes(a) } else { <$t>::from_be_bytes(a) }))
        }};
    }
    match dtype {
        RawType::I8 => int!(i8),
        RawType::U8 => int!(u8),
        RawType::I16 => int!(i16),
        RawType::U16 => int!(u16),
        RawType::I32 => int!(i32),
        RawType::U32 => int!(u32),
        RawType::I64 => int!(i64),
        RawType::U64 => int!(u64),
        RawType::F16 => {
            let a = v.try_into().unwrap_or([0; 2]);
            Raw::Float(f64::from(f16_to_f32(if little_endian { u16::from_le_bytes(a) } else { u16::from_be_bytes(a) })))
        }
        RawType::Bf16 => {
            let a = v.try_into().unwrap_or([0; 2]);
            let h = if little_endian { u16::from_le_bytes(a) } else { u16::from_be_bytes(a) };
            Raw::Float(f64::from(f32::from_bits(u32::from(h) << 16)))
        }
        RawType::Bool => Raw::Int(i128::from(v.first().is_some_and(|&b| b != 0))),
        RawType::F32 => {
            let a = v.try_into().unwrap_or([0; 4]);
            Raw::Float(f64::from(if little_endian { f32::from_le_bytes(a) } else { f32::from_be_bytes(a) }))
        }
        RawType::F64 => {
            let a = v.try_into().unwrap_or([0; 8]);
            Raw::Float(if little_endian { f64::from_le_bytes(a) } else { f64::from_be_bytes(a) })
        }
    }
}

/// An IEEE half (binary16) as the `f32` of the same value (exact: every half is an `f32`).
#[must_use]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let frac = u32::from(h & 0x3ff);
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: normalize into an f32 exponent.
            let shift = frac.leading_zeros() - 21;
            let frac = (frac << shift) & 0x3ff;
            sign | ((127 - 15 + 1 - shift) << 23) | (frac << 13)
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, _) => sign | 0x7fc0_0000 | (frac << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (frac << 13),
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests;
