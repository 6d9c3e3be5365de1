//! The CTF parse pass (CNTK's `TextParser::LoadSequence` and below, reference §1.5–§1.11).
//!
//! [`CtfDecoder::decode_sequence`] parses the bytes of one sequence into the columnar stream
//! buffers of a chunk. Malformed places are reported as [`Malformed`] (each costs one unit of
//! `max_errors`, charged by the caller); CNTK's fatal conditions return [`DataError::Fatal`].
//!
//! Error accounting follows CNTK: a bad sample costs 1 and is discarded (the parser resumes at the
//! next `|` or end of row); a row that yields no sample costs 1; per sequence, a length-defining
//! stream over the nominal length costs 1, else one under it costs 1.
//!
//! Where the sequence's bytes end without a newline (the last line of a file without a final
//! `\n`), CNTK's rules differ from a newline's, and are followed (checked on CNTK 2.7):
//! * the row costs nothing even if it yields no sample (a comment, an unknown name, a bad sample:
//!   only the sample's own error counts);
//! * an input name the bytes end in (`|a`, `|`) costs 1, and no sample is read;
//! * a dense sample needs at least one value (`|a ` costs 1); more than `dim` values are not an
//!   error there: the first `dim` are kept;
//! * a sparse sample, even an empty one, is valid only if its stream has an entry in the sequence
//!   (in this sample or an earlier one); else it costs 1 — so a one-line last sequence `|a ` costs
//!   1 and then lacks stream `a`, which is fatal.
//!
//! Deviations, all documented in `docs/differences.md`:
//! * blank (whitespace-only) rows are skipped silently (the index pass ignores them too);
//! * a dense sample with fewer than `dim` values where the bytes end is zero-padded, as
//!   elsewhere (CNTK reads uninitialised memory there).

use std::path::Path;
use std::sync::Arc;

use super::element::Element;
use super::index::show_byte;
use crate::format::chunk::{Indices, StreamData, StreamValues};
use crate::format::errors::{DataError, ErrorKind, Location, Malformed};
use crate::format::index::SequenceDesc;
use crate::options::{StreamConfig, StreamFormat};
use sample::{read_dense, read_sparse};

/// `isValueDelimiter`: space or tab.
#[inline]
fn is_value_delim(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// `isNonPrintable` on a signed char: control bytes and every byte ≥ 0x80.
#[inline]
fn is_non_printable(b: u8) -> bool {
    !(b' '..0x80).contains(&b)
}

/// `isColumnDelimiter`: a value delimiter or a non-printable byte other than `\n`.
#[inline]
fn is_column_delim(b: u8) -> bool {
    is_value_delim(b) || (is_non_printable(b) && b != b'\n')
}

/// Growing buffers of one stream for the chunk being parsed.
#[derive(Debug)]
pub struct StreamBuf<T> {
    /// Dense: `samples * dim`; sparse: entry values.
    pub values: Vec<T>,
    /// Sparse: entry indices.
    pub indices: Vec<i32>,
    /// Sparse: entry offsets per sample (starts with 0); strings: byte offsets per sample.
    pub sample_offsets: Vec<usize>,
    /// Strings (a `tf.train.Example`'s `bytes` feature): the samples' bytes, concatenated.
    pub bytes: Vec<u8>,
    /// Sample offsets per sequence (starts with 0).
    pub seq_offsets: Vec<usize>,
    /// Samples so far.
    pub samples: usize,
    /// Dense: the most values the buffer may hold (a chunk's share of the memory limit): a dense
    /// sample costs `dim` values whatever its text, so short or empty samples of a wide stream
    /// parse to far more than their bytes. Past it the sequence fails ([`CtfDecoder::decode_sequence`]).
    pub max_values: usize,
    /// A dense sample did not fit `max_values`.
    over_limit: bool,
    /// The chunk's bound on all its dense values, for the message ([`CtfDecoder::dense_room`]).
    chunk_max_values: usize,
}

impl<T> Default for StreamBuf<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> StreamBuf<T> {
    /// Bytes its vectors hold (their capacities): what a chunk being parsed costs so far.
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        self.values.capacity() * std::mem::size_of::<T>()
            + self.indices.capacity() * 4
            + (self.sample_offsets.capacity() + self.seq_offsets.capacity()) * 8
            + self.bytes.capacity()
    }

    /// Empty buffers, ready for the first sequence.
    #[must_use]
    pub fn new() -> Self {
        Self {
            values: Vec::new(),
            indices: Vec::new(),
            sample_offsets: vec![0],
            bytes: Vec::new(),
            seq_offsets: vec![0],
            samples: 0,
            max_values: usize::MAX,
            over_limit: false,
            chunk_max_values: usize::MAX,
        }
    }
}

impl<T: Element> StreamBuf<T> {
    /// The chunk's stream from these buffers: `dim` values a sample, or (`sparse`) CSR entries
    /// with 32-bit indices.
    #[must_use]
    pub fn into_stream_data(self, dim: usize, sparse: bool) -> StreamData {
        let values = T::into_values(self.values);
        let data = if sparse {
            StreamValues::Sparse {
                sample_offsets: self.sample_offsets,
                indices: Indices::I32(self.indices.into()),
                values,
            }
        } else {
            StreamValues::Dense { dim, values }
        };
        StreamData::new(self.seq_offsets, data)
    }

    /// The chunk's strings stream from these buffers: one byte string a sample.
    #[must_use]
    pub fn into_strings_data(self) -> StreamData {
        StreamData::new(self.seq_offsets, StreamValues::Strings { offsets: self.sample_offsets, bytes: self.bytes })
    }
}

#[derive(Debug, Clone)]
struct Stream {
    name: String,
    alias: Vec<u8>,
    dim: usize,
    sparse: bool,
}

/// Parses CTF sequences for one source's configured streams.
#[derive(Debug, Clone)]
pub struct CtfDecoder {
    streams: Vec<Stream>,
    max_alias_len: usize,
    /// Index of the `defines_mb_size` stream, if any.
    main: Option<usize>,
    /// Dense samples through [`super::scan`] first (off only in tests, to compare with the byte
    /// loop alone).
    fast_dense: bool,
    /// Within it, whole windows through the vector kernel where the CPU has it (off only in
    /// tests, to check the loop of one value at a time on such a CPU too).
    dense_kernel: bool,
}

/// Where a sequence's bytes come from, for error locations.
pub struct SeqContext<'a> {
    /// The file.
    pub file: &'a Arc<Path>,
    /// The sequence.
    pub seq: &'a SequenceDesc,
}

impl CtfDecoder {
    /// A decoder for `streams`.
    #[must_use]
    pub fn new(streams: &[StreamConfig]) -> Self {
        let main = streams.iter().position(|s| s.defines_mb_size);
        let streams: Vec<Stream> = streams
            .iter()
            .map(|s| Stream {
                name: s.name.clone(),
                alias: s.alias.as_bytes().to_vec(),
                dim: s.dim,
                sparse: s.format == StreamFormat::Sparse,
            })
            .collect();
        let max_alias_len = streams.iter().map(|s| s.alias.len()).max().unwrap_or(0);
        Self { streams, max_alias_len, main, fast_dense: true, dense_kernel: true }
    }

    /// The same decoder with the dense fast path off, every value through the byte loop: the
    /// reference the fast path (and its vector kernel) is checked against (tests, fuzzing). Not
    /// for production use.
    #[doc(hidden)]
    #[must_use]
    pub fn without_fast_path(mut self) -> Self {
        self.fast_dense = false;
        self
    }

    /// The same decoder with the dense fast path's vector kernel off: windows read one value at a
    /// time, as on a CPU without AVX2 (tests, fuzzing). Not for production use.
    #[doc(hidden)]
    #[must_use]
    pub fn without_kernel(mut self) -> Self {
        self.dense_kernel = false;
        self
    }

    /// Number of streams.
    #[must_use]
    pub fn num_streams(&self) -> usize {
        self.streams.len()
    }

    /// The values per sample of stream `index` if it is dense (`None` for sparse streams).
    #[must_use]
    pub fn dense_dim(&self, index: usize) -> Option<usize> {
        self.streams.get(index).filter(|s| !s.sparse).map(|s| s.dim)
    }

    /// Before the next sequence: whether the chunk's dense values so far (`out`, this decoder's
    /// streams) are within `max_values` in all, and each dense stream's room
    /// ([`StreamBuf::max_values`]) set to what is left of it. A stream past its room fails the
    /// sequence ([`CtfDecoder::decode_sequence`]); several together may pass what was left by one
    /// sequence's growth, which the next call tells.
    pub fn dense_room<T>(&self, out: &mut [StreamBuf<T>], max_values: usize) -> bool {
        let used: usize = (0..out.len()).filter(|&i| self.dense_dim(i).is_some()).map(|i| out[i].values.len()).sum();
        let left = max_values.saturating_sub(used);
        for (i, b) in out.iter_mut().enumerate() {
            if self.dense_dim(i).is_some() {
                b.max_values = b.values.len().saturating_add(left);
                b.chunk_max_values = max_values;
            }
        }
        used <= max_values
    }

    /// The error of a chunk whose dense values pass `max_values` (of `T`) in all, at `at`.
    #[must_use]
    pub fn dense_over_limit<T>(&self, at: Location, max_values: usize) -> DataError {
        let dims: Vec<String> =
            self.streams.iter().filter(|s| !s.sparse).map(|s| format!("'{}' (dim {})", s.name, s.dim)).collect();
        DataError::Fatal {
            at,
            message: format!(
                "the dense values of stream {} in this chunk would pass {} bytes, more than a parsed chunk may hold within daemon.memory_limit_bytes: every dense sample costs dim values however short its text; lower the dataset's chunk_size_bytes or raise memory_limit_bytes",
                dims.join(", "),
                max_values.saturating_mul(std::mem::size_of::<T>()),
            ),
        }
    }

    /// Marks the stream at `index` as the one that defines the nominal length
    /// (`defines_mb_size`): only its count is checked against the nominal length.
    #[must_use]
    pub fn with_main_stream(mut self, index: Option<usize>) -> Self {
        self.main = index;
        self
    }

    fn lookup(&self, name: &[u8]) -> Option<usize> {
        self.streams.iter().position(|s| s.alias == name)
    }

    /// Parses one sequence (`bytes` = exactly its byte range) into `out` (one buffer per stream).
    ///
    /// # Errors
    /// [`DataError::Fatal`] when a stream has no sample in the sequence (CNTK: "Malformed input
    /// file. Bailing out."). Budgeted errors are appended to `errors`.
    pub fn decode_sequence<T: Element>(
        &self,
        bytes: &[u8],
        ctx: &SeqContext<'_>,
        out: &mut [StreamBuf<T>],
        errors: &mut Vec<Malformed>,
    ) -> Result<(), DataError> {
        let mut p = 0;
        let n = bytes.len();
        while p < n {
            let row_start = p;
            while p < n && bytes[p].is_ascii_digit() {
                p += 1;
            }
            let mut content = p > row_start;
            let mut samples_in_row = 0usize;
            while p < n {
                let c = bytes[p];
                if c == b'\n' {
                    break;
                }
                if is_column_delim(c) {
                    content |= !super::index::is_blank_byte(c);
                    p += 1;
                    continue;
                }
                content = true;
                let (read, np) = self.read_sample(bytes, p, ctx, out, errors);
                p = np;
                if read {
                    samples_in_row += 1;
                } else {
                    // SkipToNextInput: up to the next '|' or the end of the row.
                    while p < n && bytes[p] != b'|' && bytes[p] != b'\n' {
                        p += 1;
                    }
                }
            }
            // A row cut by the end of the bytes succeeds however many samples it yields (CNTK:
            // `TryReadRow` returns whether every byte was consumed).
            if samples_in_row == 0 && content && p < n {
                errors.push(ctx.malformed(
                    bytes,
                    row_start,
                    ErrorKind::EmptyRow,
                    "no sample could be read from this row".into(),
                ));
            }
            p += 1; // the '\n' (or past the end)
        }
        if let Some(b) = out.iter().find(|b| b.over_limit) {
            return Err(self.dense_over_limit::<T>(ctx.location(bytes, 0), b.chunk_max_values));
        }
        self.finish_sequence(bytes, ctx, out, errors)
    }

    fn finish_sequence<T: Element>(
        &self,
        bytes: &[u8],
        ctx: &SeqContext<'_>,
        out: &mut [StreamBuf<T>],
        errors: &mut Vec<Malformed>,
    ) -> Result<(), DataError> {
        // Samples of this sequence: everything since the previous sequence's end offset.
        let count = |b: &StreamBuf<T>| b.samples - b.seq_offsets.last().copied().unwrap_or(0);
        if let Some(empty) = out.iter().position(|b| count(b) == 0) {
            let s = &self.streams[empty];
            return Err(DataError::Fatal {
                at: ctx.location(bytes, 0),
                message: format!(
                    "malformed input: stream '{}' (alias '{}') has no sample in sequence {}; every sequence must mention every stream at least once (an empty sample '|{}' counts)",
                    s.name,
                    String::from_utf8_lossy(&s.alias),
                    ctx.seq.key,
                    String::from_utf8_lossy(&s.alias),
                ),
            });
        }
        let expected = ctx.seq.samples as usize;
        // Length-defining streams: the defines_mb_size stream if any, else all.
        let defining = |i: &usize| self.main.is_none_or(|m| m == *i);
        let over = (0..out.len()).filter(defining).find(|&i| count(&out[i]) > expected);
        let longest = (0..out.len()).filter(defining).map(|i| count(&out[i])).max().unwrap_or(0);
        if let Some(over) = over {
            let msg = format!(
                "stream '{}' has {} samples in sequence {}, more than its {} line(s) (the same input twice on one line?)",
                self.streams[over].name,
                count(&out[over]),
                ctx.seq.key,
                expected
            );
            errors.push(ctx.malformed(bytes, 0, ErrorKind::SequenceTooLong, msg));
        } else if longest < expected {
            let msg = format!(
                "sequence {} has {} line(s) but at most {} sample(s) could be read",
                ctx.seq.key, expected, longest
            );
            errors.push(ctx.malformed(bytes, 0, ErrorKind::SequenceTooShort, msg));
        }
        for b in out.iter_mut() {
            b.seq_offsets.push(b.samples);
        }
        Ok(())
    }

    /// `TryReadSample` at `bytes[p]`. Returns whether a sample was read and where parsing stopped.
    fn read_sample<T: Element>(
        &self,
        bytes: &[u8],
        mut p: usize,
        ctx: &SeqContext<'_>,
        out: &mut [StreamBuf<T>],
        errors: &mut Vec<Malformed>,
    ) -> (bool, usize) {
        let n = bytes.len();
        if bytes[p] != b'|' {
            let msg = format!("expected '|' and an input name, found {}", show_byte(bytes[p]));
            errors.push(ctx.malformed(bytes, p, ErrorKind::UnexpectedCharacter, msg));
            return (false, p);
        }
        p += 1;
        if p < n && bytes[p] == b'#' {
            return (false, p + 1); // a comment: skipped up to the next '|' or end of row
        }
        let name_start = p;
        while p < n {
            let c = bytes[p];
            if is_value_delim(c) || c == b'|' || is_non_printable(c) {
                break;
            }
            if p - name_start == self.max_alias_len {
                return (false, p); // longer than every alias: unknown, skipped without error
            }
            p += 1;
        }
        if p == n {
            // The bytes end inside the name, known or not (CNTK: a dangling input name).
            let message = if p == name_start {
                "expected an input name after '|', found the end of the sequence (no newline at the end of the file)"
                    .to_owned()
            } else {
                format!(
                    "the sequence ends inside the input name '{}' (no newline at the end of the file): no sample is read",
                    crate::format::errors::quoted(&bytes[name_start..p])
                )
            };
            errors.push(ctx.malformed(bytes, p, ErrorKind::DanglingName, message));
            return (false, p);
        }
        if p == name_start {
            errors.push(ctx.malformed(
                bytes,
                p,
                ErrorKind::InvalidName,
                format!("expected an input name after '|', found {}", show_byte(bytes[p])),
            ));
            return (false, p);
        }
        let Some(id) = self.lookup(&bytes[name_start..p]) else {
            return (false, p); // unknown input: skipped without error
        };
        let stream = &self.streams[id];
        let buf = &mut out[id];
        let result = if stream.sparse {
            read_sparse(bytes, p, stream.dim, buf)
        } else {
            read_dense(bytes, p, stream.dim, buf, self.fast_dense, self.dense_kernel)
        };
        match result {
            Ok(np) => (true, np),
            Err((at, kind, msg)) => {
                let msg =
                    format!("{msg} in input '{}' (stream '{}')", String::from_utf8_lossy(&stream.alias), stream.name);
                errors.push(ctx.malformed(bytes, at, kind, msg));
                (false, at)
            }
        }
    }
}

impl SeqContext<'_> {
    /// Where byte `at` of the sequence's `bytes` is in the file.
    fn location(&self, bytes: &[u8], at: usize) -> Location {
        let within = at.min(bytes.len());
        let lines = memchr::memchr_iter(b'\n', &bytes[..within]).count() as u64;
        Location { file: self.file.clone(), line: self.seq.line + lines + 1, offset: self.seq.offset + within as u64 }
    }

    fn malformed(&self, bytes: &[u8], at: usize, kind: ErrorKind, message: String) -> Malformed {
        Malformed { kind, at: self.location(bytes, at), message }
    }
}

mod sample;

#[cfg(test)]
mod tests;
