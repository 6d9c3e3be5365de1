//! A format's two halves, as TensorFlow splits them.
//!
//! * [`RecordReader`]: splits a file into records and says where each is — the index pass, which
//!   chunking, the index cache, object storage and every error location rely on. Every format
//!   implements it; the dataset indexes each input through it (local files through the index
//!   cache, objects through the shared index of object storage) without knowing the format.
//! * [`RecordDecoder`]: turns one record's bytes into a sample of each stream, or a malformed
//!   place charged to `max_errors`. The deepx formats and TFRecord's Example decoder implement
//!   it (and the raw and CSV decoders, through [`StreamBufDecoder`]), and the dataset loads their
//!   chunks through one generic loop; CTF's decoder (whose
//!   sources are joined by sequence key) has its own loop still.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use crate::format::chunk::{StreamData, StreamSpec};
use crate::format::csv::{self, CsvLayout};
use crate::format::ctf::{self, CtfIndexOptions, StreamBuf};
use crate::format::deepx::{self, DeepxBufs, DeepxDecoder, DeepxElement, LineIndexOptions};
use crate::format::errors::{DataError, Malformed};
use crate::format::fixed::{self, FixedLengthOptions};
use crate::format::index::FileIndex;
use crate::format::line_chunks::LineKind;
use crate::format::stream_buf::record_buffer;
pub use crate::format::stream_buf::StreamBufDecoder;
use crate::format::tfrecord;
use crate::format::tfrecord::example::ExampleDecoder;
use crate::format::whole_file;
use crate::options::IndexLimits;

/// Splits a file into records: one [`crate::format::SequenceDesc`] (key, byte offset, line or
/// record number, size, samples) per record, the content's CRC-32 digest and size, within the
/// index budget of `limits`, with the file, line (or record) and byte offset in every error.
pub trait RecordReader: Send + Sync {
    /// What shapes the index (format and options): part of the index cache's key, so an index
    /// made with other options is never read back.
    fn fingerprint(&self) -> String;

    /// Indexes the local file `data` (named `name` in errors and in the result: a decompressed
    /// copy has another path than its input), on up to `threads` threads where the format can
    /// cut a file into parts; `progress` gets the bytes read so far.
    ///
    /// # Errors
    /// I/O errors, the format's fatal errors, and a limit exceeded.
    fn index_file(
        &self,
        data: &Path,
        name: Arc<Path>,
        limits: IndexLimits,
        threads: usize,
        progress: &mut dyn FnMut(u64),
    ) -> Result<FileIndex, DataError>;

    /// The lines a file of this format holds when every line is a sequence
    /// ([`crate::format::line_chunks`]); `None` (the default): its records are not lines.
    fn line_kind(&self) -> Option<LineKind> {
        None
    }

    /// How many of a file's first bytes [`RecordReader::plain_head`] reads; 0 (the default): the
    /// format has no such test.
    fn plain_head_bytes(&self) -> usize {
        0
    }

    /// Whether a file that begins with `head` (its first [`RecordReader::plain_head_bytes`]
    /// bytes) is plain data of the format — read as it is where `compression = "auto"` would
    /// take gzip's magic bytes at its start for a compressed file.
    fn plain_head(&self, _head: &[u8]) -> bool {
        false
    }

    /// Indexes the `size` bytes `reader` yields (an object streamed from object storage).
    ///
    /// # Errors
    /// As [`RecordReader::index_file`].
    fn index_stream(
        &self,
        reader: &mut dyn Read,
        name: Arc<Path>,
        size: u64,
        limits: IndexLimits,
        progress: &mut dyn FnMut(u64),
    ) -> Result<FileIndex, DataError>;
}

/// CTF: a record is a line, or the consecutive lines of one sequence id.
#[derive(Debug, Clone)]
pub struct CtfReader(pub CtfIndexOptions);

impl RecordReader for CtfReader {
    fn fingerprint(&self) -> String {
        self.0.fingerprint()
    }

    fn line_kind(&self) -> Option<LineKind> {
        // With a `defines_mb_size` stream a line without it is no sequence.
        self.0.main_alias.is_none().then_some(LineKind::Ctf { skip_ids: self.0.skip_sequence_ids })
    }

    fn index_file(
        &self,
        data: &Path,
        _name: Arc<Path>,
        limits: IndexLimits,
        threads: usize,
        progress: &mut dyn FnMut(u64),
    ) -> Result<FileIndex, DataError> {
        // CTF inputs are read as they are: the data is the input.
        ctf::index_file(data, &self.0, limits, threads, progress)
    }

    fn index_stream(
        &self,
        reader: &mut dyn Read,
        name: Arc<Path>,
        size: u64,
        limits: IndexLimits,
        progress: &mut dyn FnMut(u64),
    ) -> Result<FileIndex, DataError> {
        ctf::index_reader(reader, &name, size, &self.0, limits, progress)
    }
}

/// deepx's formats: a record is a non-blank line (not a comment).
#[derive(Debug, Clone, Copy)]
pub struct LineReader(pub LineIndexOptions);

impl RecordReader for LineReader {
    fn fingerprint(&self) -> String {
        self.0.fingerprint()
    }

    fn line_kind(&self) -> Option<LineKind> {
        Some(LineKind::Deepx { comments: self.0.comments })
    }

    fn index_file(
        &self,
        data: &Path,
        name: Arc<Path>,
        limits: IndexLimits,
        threads: usize,
        progress: &mut dyn FnMut(u64),
    ) -> Result<FileIndex, DataError> {
        deepx::index_file(data, name, self.0, limits, threads, progress)
    }

    fn index_stream(
        &self,
        reader: &mut dyn Read,
        name: Arc<Path>,
        size: u64,
        limits: IndexLimits,
        progress: &mut dyn FnMut(u64),
    ) -> Result<FileIndex, DataError> {
        let reader = std::io::BufReader::with_capacity(1 << 16, reader);
        deepx::index_reader(reader, name, size, self.0, limits, progress)
    }
}

/// TFRecord: a record is a frame (length, CRCs, data).
#[derive(Debug, Clone, Copy)]
pub struct TfRecordReader;

impl RecordReader for TfRecordReader {
    fn fingerprint(&self) -> String {
        tfrecord::fingerprint()
    }

    fn plain_head_bytes(&self) -> usize {
        tfrecord::HEADER_BYTES
    }

    /// A TFRecord file whose first record's length begins with gzip's magic bytes is still plain
    /// TFRecord when its header's CRC holds.
    fn plain_head(&self, head: &[u8]) -> bool {
        tfrecord::starts_with_frame(head)
    }

    fn index_file(
        &self,
        data: &Path,
        name: Arc<Path>,
        limits: IndexLimits,
        threads: usize,
        progress: &mut dyn FnMut(u64),
    ) -> Result<FileIndex, DataError> {
        tfrecord::index_file(data, name, limits, threads, progress)
    }

    fn index_stream(
        &self,
        reader: &mut dyn Read,
        name: Arc<Path>,
        size: u64,
        limits: IndexLimits,
        progress: &mut dyn FnMut(u64),
    ) -> Result<FileIndex, DataError> {
        tfrecord::index_reader(reader, name, size, limits, progress)
    }
}

/// Fixed-length records: a record is `record_bytes` at `header_bytes + i × record_bytes`.
#[derive(Debug, Clone, Copy)]
pub struct FixedLengthReader(pub FixedLengthOptions);

impl RecordReader for FixedLengthReader {
    fn fingerprint(&self) -> String {
        self.0.fingerprint()
    }

    fn index_file(
        &self,
        data: &Path,
        name: Arc<Path>,
        limits: IndexLimits,
        threads: usize,
        progress: &mut dyn FnMut(u64),
    ) -> Result<FileIndex, DataError> {
        fixed::index_file(data, name, self.0, limits, threads, progress)
    }

    fn index_stream(
        &self,
        reader: &mut dyn Read,
        name: Arc<Path>,
        size: u64,
        limits: IndexLimits,
        progress: &mut dyn FnMut(u64),
    ) -> Result<FileIndex, DataError> {
        fixed::index_reader(reader, name, size, self.0, limits, progress)
    }
}

/// CSV: a record is a line (an empty one too), after the header lines.
#[derive(Debug, Clone, Copy)]
pub struct CsvReader(pub CsvLayout);

impl RecordReader for CsvReader {
    fn fingerprint(&self) -> String {
        self.0.fingerprint()
    }

    fn index_file(
        &self,
        data: &Path,
        name: Arc<Path>,
        limits: IndexLimits,
        threads: usize,
        progress: &mut dyn FnMut(u64),
    ) -> Result<FileIndex, DataError> {
        csv::index_file(data, name, self.0, limits, threads, progress)
    }

    fn index_stream(
        &self,
        reader: &mut dyn Read,
        name: Arc<Path>,
        size: u64,
        limits: IndexLimits,
        progress: &mut dyn FnMut(u64),
    ) -> Result<FileIndex, DataError> {
        csv::index_reader(reader, name, size, self.0, limits, progress)
    }
}

/// Whole files: a record is a file.
#[derive(Debug, Clone, Copy)]
pub struct WholeFileReader;

impl RecordReader for WholeFileReader {
    fn fingerprint(&self) -> String {
        whole_file::fingerprint()
    }

    fn index_file(
        &self,
        data: &Path,
        name: Arc<Path>,
        limits: IndexLimits,
        _threads: usize,
        progress: &mut dyn FnMut(u64),
    ) -> Result<FileIndex, DataError> {
        whole_file::index_file(data, name, limits, progress)
    }

    fn index_stream(
        &self,
        reader: &mut dyn Read,
        name: Arc<Path>,
        size: u64,
        limits: IndexLimits,
        progress: &mut dyn FnMut(u64),
    ) -> Result<FileIndex, DataError> {
        whole_file::index_reader(reader, name, size, limits, progress)
    }
}

/// Where a record is, for its errors: the file as configured (a `.gz` input, not its copy), its
/// 0-based line or record number, and its byte offset (in the decompressed data).
pub use crate::format::deepx::LineContext as RecordAt;

/// Turns records into samples of the dataset's streams, a chunk at a time.
pub trait RecordDecoder: Send + Sync {
    /// The growing buffers of one chunk being decoded.
    type Buffers<T: DeepxElement>;

    /// The streams, in the order of the parsed chunk's.
    fn streams(&self) -> Vec<StreamSpec>;

    /// Empty buffers for a chunk of `bytes` bytes and `records` records; a decoder that advises
    /// its large ones huge pages (deepx's) does so when `huge` (the dataset's
    /// [`minibatchd_sys::HugePages`] now) says so.
    fn buffers<T: DeepxElement>(&self, bytes: usize, records: usize, huge: bool) -> Self::Buffers<T>;

    /// Decodes one record (at `at`) into a sample of each stream, or pushes its malformed place
    /// to `errors` and leaves a sequence of 0 samples: either way one sequence more.
    fn decode<T: DeepxElement>(
        &self,
        record: &[u8],
        at: &RecordAt<'_>,
        out: &mut Self::Buffers<T>,
        errors: &mut Vec<Malformed>,
    );

    /// Dense values the buffers hold (a chunk's are bounded by its share of the memory limit).
    fn dense_values<T: DeepxElement>(&self, out: &Self::Buffers<T>) -> usize;

    /// Bytes the buffers hold (their capacities): what a chunk being parsed costs so far.
    fn buffer_bytes<T: DeepxElement>(&self, out: &Self::Buffers<T>) -> usize;

    /// The chunk's streams.
    fn finish<T: DeepxElement>(&self, out: Self::Buffers<T>) -> Vec<StreamData>;
}

impl RecordDecoder for DeepxDecoder {
    type Buffers<T: DeepxElement> = DeepxBufs<T>;

    fn streams(&self) -> Vec<StreamSpec> {
        self.schema().specs()
    }

    fn buffers<T: DeepxElement>(&self, bytes: usize, records: usize, huge: bool) -> DeepxBufs<T> {
        self.buffers_for(bytes, records, huge)
    }

    fn decode<T: DeepxElement>(
        &self,
        record: &[u8],
        at: &RecordAt<'_>,
        out: &mut DeepxBufs<T>,
        errors: &mut Vec<Malformed>,
    ) {
        self.decode_line(record, at, out, errors);
    }

    fn dense_values<T: DeepxElement>(&self, out: &DeepxBufs<T>) -> usize {
        out.y.len() + out.w.len() + out.hist_size.len() + out.qid.len()
    }

    fn buffer_bytes<T: DeepxElement>(&self, out: &DeepxBufs<T>) -> usize {
        out.heap_bytes()
    }

    fn finish<T: DeepxElement>(&self, out: DeepxBufs<T>) -> Vec<StreamData> {
        self.into_streams(out)
    }
}

impl<D: StreamBufDecoder> RecordDecoder for D {
    type Buffers<T: DeepxElement> = Vec<StreamBuf<T>>;

    fn streams(&self) -> Vec<StreamSpec> {
        self.specs()
    }

    // Not advised huge pages: on the project's VM first touch of huge pages was several times
    // slower (`docs/daemon.md`, "Huge pages"), and these formats' sweeps were measured without
    // the advice; turning it on for them waits for a measurement.
    fn buffers<T: DeepxElement>(&self, _bytes: usize, records: usize, _huge: bool) -> Vec<StreamBuf<T>> {
        StreamBufDecoder::buffers(self, records)
    }

    fn decode<T: DeepxElement>(
        &self,
        record: &[u8],
        at: &RecordAt<'_>,
        out: &mut Vec<StreamBuf<T>>,
        errors: &mut Vec<Malformed>,
    ) {
        self.decode_record(record, at, out, errors);
    }

    fn dense_values<T: DeepxElement>(&self, out: &Vec<StreamBuf<T>>) -> usize {
        StreamBufDecoder::dense_values(self, out)
    }

    fn buffer_bytes<T: DeepxElement>(&self, out: &Vec<StreamBuf<T>>) -> usize {
        out.iter().map(StreamBuf::heap_bytes).sum()
    }

    fn finish<T: DeepxElement>(&self, out: Vec<StreamBuf<T>>) -> Vec<StreamData> {
        self.chunk_streams(out)
    }
}

impl StreamBufDecoder for ExampleDecoder {
    fn specs(&self) -> Vec<StreamSpec> {
        ExampleDecoder::specs(self)
    }

    fn buffers<T: DeepxElement>(&self, records: usize) -> Vec<StreamBuf<T>> {
        ExampleDecoder::specs(self).iter().map(|_| record_buffer(records)).collect()
    }

    fn decode_record<T: DeepxElement>(
        &self,
        record: &[u8],
        at: &RecordAt<'_>,
        out: &mut [StreamBuf<T>],
        errors: &mut Vec<Malformed>,
    ) {
        ExampleDecoder::decode_record(self, record, at, out, errors);
    }

    fn chunk_streams<T: DeepxElement>(&self, out: Vec<StreamBuf<T>>) -> Vec<StreamData> {
        ExampleDecoder::into_streams(self, out)
    }
}
