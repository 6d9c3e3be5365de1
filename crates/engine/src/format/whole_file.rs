//! Whole files (TensorFlow's `WholeFileReader` and `tf.io.read_file`): every input file — an
//! image, an audio clip, a serialized document — is one record, decoded into two strings
//! streams of one sample each: `contents`, the file's bytes as they are, and `path`, the file as
//! the dataset names it (the reader's key: a local path, or `s3://bucket/key`).
//!
//! **Reader.** A file of `n` bytes is one record at byte 0 of `n` bytes (an empty file too: its
//! contents are empty); a file larger than a sequence may be (4 GiB, and a sixteenth of
//! `memory_limit_bytes`) is refused at its index pass, naming it. The index pass reads the
//! file once for its CRC-32 digest (the dataset's identity; every byte, as the text formats'
//! passes digest them).
//!
//! **Decoder.** Never fails: any bytes are a file's contents. A file whose contents do not fit a
//! parsed chunk's share of `memory_limit_bytes` fails its chunk, naming the file.
//!
//! Every file is its own chunk (chunks never span files), so a randomization window of `w`
//! chunks shuffles within `w` files: give such a dataset a window in samples
//! (`sampling.window_samples`) or of many chunks.

use std::io::Read;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;
use std::sync::Arc;

use crate::format::chunk::{StreamData, StreamKind, StreamSpec};
use crate::format::ctf::StreamBuf;
use crate::format::deepx::DeepxElement;
use crate::format::deepx::LineContext as RecordAt;
use crate::format::errors::{DataError, Location, Malformed};
use crate::format::index::{index_local, read_digest, room_for_one_more, FileIndex, SequenceDesc, Sequences};
use crate::format::stream_buf::{record_buffer, StreamBufDecoder, MAX_RESERVED_VALUES};
use crate::options::IndexLimits;

/// The streams' names: the file's bytes, and its path.
pub const STREAMS: [&str; 2] = ["contents", "path"];

/// Size of the read buffer of the index pass.
const BLOCK_BYTES: usize = 256 << 10;

/// What shapes the index: nothing but the format.
#[must_use]
pub fn fingerprint() -> String {
    "whole_file v1".to_owned()
}

/// Indexes the local file `data` (named `name` in errors).
///
/// # Errors
/// I/O errors, a file of 4 GiB or more, a limit exceeded.
pub fn index_file(
    data: &Path,
    name: Arc<Path>,
    limits: IndexLimits,
    progress: &mut dyn FnMut(u64),
) -> Result<FileIndex, DataError> {
    index_local(data, &name.clone(), |file, size| index_reader(file, name, size, limits, progress))
}

/// Indexes the `size` bytes `reader` yields (a file, or an object streamed from object storage):
/// one record of them all.
///
/// # Errors
/// As [`index_file`]; also a reader that yields other than `size` bytes.
pub fn index_reader(
    mut reader: impl Read,
    name: Arc<Path>,
    size: u64,
    limits: IndexLimits,
    progress: &mut dyn FnMut(u64),
) -> Result<FileIndex, DataError> {
    let at = || Location { file: name.clone(), line: 1, offset: 0 };
    let largest = limits.largest_sequence();
    let record = u32::try_from(size).ok().filter(|_| size <= largest).ok_or_else(|| DataError::Fatal {
        at: at(),
        message: format!(
            "a whole file is one record of at most {largest} bytes ({}); this one has {size}",
            crate::options::largest_sequence_why()
        ),
    })?;
    let mut sequences = Sequences::default();
    let s = SequenceDesc { key: 0, offset: 0, line: 0, size: record, samples: 1 };
    room_for_one_more(&sequences, &s, &limits, at)?;
    sequences.push(s);
    sequences.shrink_to_fit();
    // The digest: every byte of the file, as the text formats' passes have it (a TFRecord
    // file's is of its records' headers and footers).
    let digest = read_digest(&mut reader, &name, size, BLOCK_BYTES, progress)?;
    Ok(FileIndex { path: name, size, digest, sequences })
}

/// Decodes a whole file into its `contents` and `path` streams.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WholeFileDecoder;

fn push_string<T>(buf: &mut StreamBuf<T>, s: &[u8]) {
    buf.bytes.extend_from_slice(s);
    buf.sample_offsets.push(buf.bytes.len());
    buf.samples += 1;
    buf.seq_offsets.push(buf.samples);
}

impl StreamBufDecoder for WholeFileDecoder {
    fn specs(&self) -> Vec<StreamSpec> {
        STREAMS.iter().map(|n| StreamSpec { name: (*n).to_owned(), kind: StreamKind::Strings, dim: 0 }).collect()
    }

    fn buffers<T: DeepxElement>(&self, records: usize) -> Vec<StreamBuf<T>> {
        STREAMS
            .iter()
            .map(|_| {
                let mut b = record_buffer(records);
                b.sample_offsets.reserve(records.min(MAX_RESERVED_VALUES));
                b
            })
            .collect()
    }

    fn decode_record<T: DeepxElement>(
        &self,
        record: &[u8],
        at: &RecordAt<'_>,
        out: &mut [StreamBuf<T>],
        _errors: &mut Vec<Malformed>,
    ) {
        if let [contents, path] = out {
            push_string(contents, record);
            push_string(path, at.file.as_os_str().as_bytes());
        }
    }

    fn chunk_streams<T: DeepxElement>(&self, out: Vec<StreamBuf<T>>) -> Vec<StreamData> {
        out.into_iter().map(StreamBuf::into_strings_data).collect()
    }
}
