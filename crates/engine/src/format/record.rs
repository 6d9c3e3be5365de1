//! The record reader: the half of a format that splits a file into records and says where each
//! is — the index pass, which chunking, the index cache, object storage and every error location
//! rely on. Every format implements [`RecordReader`]; the dataset indexes each input through it
//! (local files through the index cache, objects through the shared index of object storage)
//! without knowing the format.
//!
//! The other half, the record decoder, is still one path per format in the dataset's chunk
//! loading (`docs/formats.md`, "Adding a format").

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use crate::format::ctf::{self, CtfIndexOptions};
use crate::format::deepx::{self, LineIndexOptions};
use crate::format::errors::DataError;
use crate::format::index::FileIndex;
use crate::format::tfrecord;
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
