//! The index: where each sequence is, how long it is nominally, and how sequences group into
//! chunks — the output of the first pass over the data (CNTK's `Index`, `IndexBuilder`).
//!
//! Format-specific indexers produce one [`FileIndex`] per file; [`build_chunks`] groups the
//! sequences of all files into chunks with CNTK's rule (§1.14): a new chunk starts when the
//! current chunk's byte span is 0 or when `span + sequence size > chunk_size_bytes`. Chunks never
//! cross files. Everything scheduling-related uses the nominal lengths recorded here.

use crate::format::errors::DataError;
use crate::options::{INDEX_BYTES_PER_SEQUENCE, INDEX_SHARE_OF_MEMORY_LIMIT, SEQUENCE_SHARE_OF_MEMORY_LIMIT};
use std::path::Path;
use std::sync::Arc;

/// One sequence as the index pass found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceDesc {
    /// The sequence key: the numeric id, or the 0-based line number in line mode.
    pub key: u64,
    /// Byte offset of its first byte in the file.
    pub offset: u64,
    /// 0-based line number of its first line.
    pub line: u64,
    /// Size in bytes (up to the next sequence's first byte).
    pub size: u32,
    /// Nominal length in samples (≥ 1).
    pub samples: u32,
}

/// The index of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileIndex {
    /// The file.
    pub path: Arc<Path>,
    /// Its size in bytes when indexed.
    pub size: u64,
    /// CRC-32 (ISO-HDLC) of the bytes the index pass read: what the file held, part of the
    /// dataset's identity (a resume refuses other content, wherever the file lives).
    pub digest: u32,
    /// Sequences in file order.
    pub sequences: Vec<SequenceDesc>,
}

/// A chunk: consecutive sequences of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkDesc {
    /// Index of the file in the source's file list.
    pub file: usize,
    /// First byte (the first sequence's offset).
    pub start: u64,
    /// One past the last byte of the last sequence.
    pub end: u64,
    /// Index of the first sequence within the file's sequence list.
    pub first_seq: usize,
    /// Number of sequences.
    pub num_seqs: usize,
    /// Sum of nominal lengths.
    pub num_samples: u64,
}

/// Groups the sequences of `files` into chunks with CNTK's rule; chunks never cross files.
#[must_use]
#[allow(clippy::missing_panics_doc)] // its one `expect` cannot fail: a chunk is pushed just before
pub fn build_chunks(files: &[FileIndex], chunk_size_bytes: u64) -> Vec<ChunkDesc> {
    let mut chunks: Vec<ChunkDesc> = Vec::new();
    for (fi, file) in files.iter().enumerate() {
        let mut open = false;
        for (si, s) in file.sequences.iter().enumerate() {
            let start_new = match chunks.last() {
                Some(c) if open => {
                    let span = c.end - c.start;
                    span == 0 || span + u64::from(s.size) > chunk_size_bytes
                }
                _ => true,
            };
            if start_new {
                chunks.push(ChunkDesc {
                    file: fi,
                    start: s.offset,
                    end: s.offset,
                    first_seq: si,
                    num_seqs: 0,
                    num_samples: 0,
                });
                open = true;
            }
            let c = chunks.last_mut().expect("a chunk was pushed above");
            c.num_seqs += 1;
            c.num_samples += u64::from(s.samples);
            c.end = s.offset + u64::from(s.size);
        }
    }
    chunks
}

/// Fills `buf` from `reader` as far as it can (short only at the end of the input); the index
/// passes read fixed-size blocks with it.
///
/// # Errors
/// I/O errors other than `Interrupted`.
pub(crate) fn read_full(reader: &mut impl std::io::Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// The index passes' reading loop: calls `line(bytes, offset)` for every line `reader` yields, in
/// order — each with its `\n`, the last one without when the input does not end with one —, with
/// `offset` the line's byte offset in the input. Reads `block_bytes` at a time; a line longer
/// than a block is carried over whole, up to `max_line_bytes` (a longer line is a fatal error:
/// the carried line is the one thing here that grows with the input). Reports the bytes seen
/// after each block. Returns the bytes read and their CRC-32 (the content's digest,
/// [`FileIndex::digest`], computed on each block while it is in cache; its cost is measured in
/// docs/benchmarks.md).
///
/// # Errors
/// I/O errors (naming `path`), a line over `max_line_bytes`, and the first error `line` returns.
pub(crate) fn for_each_line(
    mut reader: impl std::io::Read,
    block_bytes: usize,
    path: &std::path::Path,
    max_line_bytes: u64,
    progress: &mut dyn FnMut(u64),
    mut line: impl FnMut(&[u8], u64) -> Result<(), DataError>,
) -> Result<(u64, u32), DataError> {
    let mut buf = vec![0u8; block_bytes];
    let mut digest = crc32fast::Hasher::new();
    // The unfinished last line of the previous block.
    let mut carry: Vec<u8> = Vec::new();
    let mut consumed: u64 = 0;
    // Lines passed to `line` so far (for the place of a too-long line).
    let mut lines: u64 = 0;
    let too_long = |lines: u64, offset: u64, len: u64| DataError::Fatal {
        at: crate::format::errors::Location { file: std::sync::Arc::from(path), line: lines + 1, offset },
        message: format!(
            "a line of more than {max_line_bytes} bytes (at least {len}); the largest sequence the memory limit allows \
             is {max_line_bytes} bytes (daemon.memory_limit_bytes / {SEQUENCE_SHARE_OF_MEMORY_LIMIT}, 4 GiB at most)"
        ),
    };
    loop {
        let n = read_full(&mut reader, &mut buf).map_err(|e| DataError::io(path, e))?;
        if n == 0 {
            break;
        }
        let block = &buf[..n];
        digest.update(block);
        let mut pos = 0;
        if !carry.is_empty() {
            let Some(nl) = memchr::memchr(b'\n', block) else {
                if (carry.len() + block.len()) as u64 > max_line_bytes {
                    return Err(too_long(lines, consumed, (carry.len() + block.len()) as u64));
                }
                carry.extend_from_slice(block);
                progress(consumed + carry.len() as u64);
                continue;
            };
            if (carry.len() + nl + 1) as u64 > max_line_bytes {
                return Err(too_long(lines, consumed, (carry.len() + nl + 1) as u64));
            }
            carry.extend_from_slice(&block[..=nl]);
            line(&carry, consumed)?;
            lines += 1;
            consumed += carry.len() as u64;
            carry.clear();
            pos = nl + 1;
        }
        while let Some(nl) = memchr::memchr(b'\n', &block[pos..]) {
            if nl as u64 + 1 > max_line_bytes {
                return Err(too_long(lines, consumed, nl as u64 + 1));
            }
            line(&block[pos..=pos + nl], consumed)?;
            lines += 1;
            consumed += nl as u64 + 1;
            pos += nl + 1;
        }
        if (block.len() - pos) as u64 > max_line_bytes {
            return Err(too_long(lines, consumed, (block.len() - pos) as u64));
        }
        carry.extend_from_slice(&block[pos..]);
        progress(consumed + carry.len() as u64);
    }
    if !carry.is_empty() {
        line(&carry, consumed)?;
        consumed += carry.len() as u64;
    }
    Ok((consumed, digest.finalize()))
}

/// The error of an index that would hold more than `limits.max_sequences` sequences, at the
/// sequence that would exceed it.
pub(crate) fn too_many_sequences(at: crate::format::errors::Location, max: u64) -> DataError {
    DataError::Fatal {
        at,
        message: format!(
            "the dataset has more than {max} sequences, the most its index may hold within the memory limit \
             (daemon.memory_limit_bytes / {INDEX_SHARE_OF_MEMORY_LIMIT} for the indexes of all datasets, \
             {INDEX_BYTES_PER_SEQUENCE} bytes per sequence); raise daemon.memory_limit_bytes"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(sizes: &[(u64, u32)]) -> FileIndex {
        FileIndex {
            path: Arc::from(Path::new("x")),
            size: 0,
            digest: 0,
            sequences: sizes
                .iter()
                .enumerate()
                .map(|(i, &(offset, size))| SequenceDesc { key: i as u64, offset, line: i as u64, size, samples: 1 })
                .collect(),
        }
    }

    #[test]
    fn chunk_boundaries_follow_cntk_rule() {
        // sizes 4,4,4 at 0,4,8 with chunk size 8 -> [0,1] [2]
        let f = file(&[(0, 4), (4, 4), (8, 4)]);
        let c = build_chunks(&[f], 8);
        assert_eq!(c.iter().map(|c| c.num_seqs).collect::<Vec<_>>(), vec![2, 1]);
    }

    #[test]
    fn a_sequence_larger_than_the_chunk_size_gets_its_own_chunk() {
        let f = file(&[(0, 2), (2, 100), (102, 2)]);
        let c = build_chunks(&[f], 10);
        assert_eq!(c.iter().map(|c| c.num_seqs).collect::<Vec<_>>(), vec![1, 1, 1]);
    }

    #[test]
    fn gaps_count_in_the_span() {
        // A dropped line between the first two sequences widens the span once the second is
        // added: 0..3, gap, 10..13 is a span of 13, so a third sequence of 3 needs 16.
        let f = file(&[(0, 3), (10, 3), (13, 3)]);
        assert_eq!(build_chunks(std::slice::from_ref(&f), 15).len(), 2);
        assert_eq!(build_chunks(&[f], 16).len(), 1);
    }

    #[test]
    fn chunks_never_cross_files() {
        let c = build_chunks(&[file(&[(0, 1)]), file(&[(0, 1)])], 1 << 20);
        assert_eq!(c.len(), 2);
        assert_eq!((c[1].file, c[1].first_seq), (1, 0));
    }
}
