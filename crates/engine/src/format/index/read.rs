//! How the index passes read a file: a local file opened for its pass, blocks read whole, the
//! content's CRC-32, the line loop of the line-based formats. Kept apart from what the index
//! holds (sequences, columns, chunks), which these only produce.

use std::path::Path;
use std::sync::Arc;

use super::FileIndex;
use crate::format::errors::DataError;

/// Opens the local file `data` (named `name` in errors) and hands it, with its size, to `index`:
/// the `index_file` of a format whose pass reads one stream (CSV, fixed-length records).
///
/// # Errors
/// I/O errors opening the file, and what `index` returns.
pub(crate) fn index_local(
    data: &Path,
    name: &Arc<Path>,
    index: impl FnOnce(std::fs::File, u64) -> Result<FileIndex, DataError>,
) -> Result<FileIndex, DataError> {
    let file = minibatchd_sys::files::open_regular(data).map_err(|e| DataError::io(name, e))?;
    let size = file.metadata().map_err(|e| DataError::io(name, e))?.len();
    index(file, size)
}

/// An error when a pass read `read` bytes of a file of `size`: it changed while it was indexed.
///
/// # Errors
/// `read != size`.
pub(crate) fn read_as_sized(name: &Arc<Path>, read: u64, size: u64) -> Result<(), DataError> {
    if read == size {
        return Ok(());
    }
    Err(DataError::io(
        name,
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("read {read} bytes of a file of {size} (changed while it was indexed?)"),
        ),
    ))
}

/// The content digest of a format whose index needs nothing else from the bytes (fixed-length
/// records, whole files): the CRC-32 of everything `reader` yields, `block_bytes` at a time,
/// `progress` told the bytes read after each block; then checked to be the `size` bytes the file
/// had ([`read_as_sized`]).
///
/// # Errors
/// I/O errors, and a reader that yields other than `size` bytes.
pub(crate) fn read_digest(
    reader: &mut impl std::io::Read,
    name: &Arc<Path>,
    size: u64,
    block_bytes: usize,
    progress: &mut dyn FnMut(u64),
) -> Result<u32, DataError> {
    let mut buf = vec![0u8; block_bytes];
    let mut digest = crc32fast::Hasher::new();
    let mut read = 0u64;
    loop {
        let n = read_full(reader, &mut buf).map_err(|e| DataError::io(name, e))?;
        if n == 0 {
            break;
        }
        digest.update(&buf[..n]);
        read += n as u64;
        progress(read);
    }
    read_as_sized(name, read, size)?;
    Ok(digest.finalize())
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
             is {max_line_bytes} bytes ({})",
            crate::options::largest_sequence_why()
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
