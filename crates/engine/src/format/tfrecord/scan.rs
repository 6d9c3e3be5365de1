//! The TFRecord index pass proper: the frames of a run of bytes, found from their headers.
//!
//! A record's place, length and footer are all the index needs: the length's CRC is checked
//! (a damaged length would send every later record astray), the data's CRC is checked when the
//! record is decoded. So from a local file (a decompressed copy included) the pass reads each
//! header and footer, and skips the data between them when a record is larger than a page
//! ([`FileAt`]); a stream (an object read from S3 as it is indexed) is read through
//! ([`Through`]). The digest every format's index carries —
//! the dataset's identity, which resumes check — is the CRC-32 of every record's header and
//! footer, in order: it covers each record's length and its data's CRC-32C, so any other content
//! of valid records is another identity (but for a collision of the data's CRC-32C, one in 2^32
//! per changed record), and damaged data is an error where the record is decoded.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use super::{frame_of, FOOTER_BYTES, HEADER_BYTES};
use crate::format::errors::{DataError, Location};
use crate::format::index::{read_full, room_for_one_more, SequenceDesc, Sequences};
use crate::options::IndexLimits;

/// Bytes read at once while records lie close together (within a core's L2).
const BLOCK_BYTES: usize = 256 << 10;

/// Headers and footers gathered before they go into the digest.
const DIGEST_BLOCK_BYTES: usize = 16 << 10;

/// Bytes read at a record's footer when the window left it more than this far behind: the
/// footer, the next header, and the rest of the page or so.
const JUMP_BYTES: usize = 4 << 10;

/// Where [`scan`] reads: bytes at increasing file offsets.
pub(super) trait Source {
    /// Up to `n` bytes (`n` ≤ 16) at file offset `pos` — fewer only where the input ends — with
    /// `pos` never before an earlier call's.
    ///
    /// # Errors
    /// I/O errors.
    fn at(&mut self, pos: u64, n: usize) -> io::Result<&[u8]>;

    /// The offset where the input ended, once a read has met it.
    fn end_seen(&self) -> Option<u64>;
}

/// A local file read at offsets: a block at a time where records lie close together, a page at
/// each footer where they do not. Reads stop at `limit` (a part's end), which then counts as the
/// input's end.
pub(super) struct FileAt<'f> {
    file: &'f File,
    limit: u64,
    buf: Vec<u8>,
    /// The file offset of `buf[0]`, and how many bytes of `buf` hold the file's.
    base: u64,
    filled: usize,
    end: Option<u64>,
}

impl<'f> FileAt<'f> {
    pub(super) fn new(file: &'f File, from: u64, limit: Option<u64>) -> Self {
        FileAt { file, limit: limit.unwrap_or(u64::MAX), buf: vec![0; BLOCK_BYTES], base: from, filled: 0, end: None }
    }
}

impl Source for FileAt<'_> {
    fn at(&mut self, pos: u64, n: usize) -> io::Result<&[u8]> {
        let window_end = self.base + self.filled as u64;
        if pos < self.base || pos + n as u64 > window_end {
            let want = if pos > window_end + JUMP_BYTES as u64 { JUMP_BYTES } else { BLOCK_BYTES };
            let want = usize::try_from(self.limit.saturating_sub(pos)).map_or(want, |left| left.min(want));
            let mut got = 0;
            while got < want {
                match self.file.read_at(&mut self.buf[got..want], pos + got as u64) {
                    Ok(0) => break,
                    Ok(k) => got += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            (self.base, self.filled) = (pos, got);
            if got < n {
                // The input ends before `pos + n`, perhaps before `pos` (a jump past the end).
                self.end = Some(self.limit.min(self.file.metadata()?.len()).min(pos + got as u64));
            }
        }
        let from = usize::try_from(pos - self.base).unwrap_or(usize::MAX).min(self.filled);
        Ok(&self.buf[from..self.filled.min(from + n)])
    }

    fn end_seen(&self) -> Option<u64> {
        self.end
    }
}

/// A stream read through from offset `from`: every byte passes, the ones between headers and
/// footers unused. Bytes are moved within the buffer only when fewer than a request's remain.
pub(super) struct Through<R> {
    reader: R,
    buf: Vec<u8>,
    /// The input's bytes from offset `base` on are `buf[start..filled]`.
    base: u64,
    start: usize,
    filled: usize,
    end: Option<u64>,
}

impl<R: Read> Through<R> {
    pub(super) fn new(reader: R, from: u64) -> Self {
        Through { reader, buf: vec![0; BLOCK_BYTES], base: from, start: 0, filled: 0, end: None }
    }

    /// Reads into `buf[filled..]`; notes the end of the input when it meets it.
    fn fill(&mut self) -> io::Result<()> {
        let got = read_full(&mut self.reader, &mut self.buf[self.filled..])?;
        self.filled += got;
        if got == 0 {
            self.end = Some(self.base + (self.filled - self.start) as u64);
        }
        Ok(())
    }
}

impl<R: Read> Source for Through<R> {
    fn at(&mut self, pos: u64, n: usize) -> io::Result<&[u8]> {
        if pos < self.base {
            return Err(io::Error::other("the TFRecord index pass went back in a stream"));
        }
        // Drop what lies before `pos`, reading through it.
        while pos >= self.base + (self.filled - self.start) as u64 && self.end.is_none() {
            self.base += (self.filled - self.start) as u64;
            (self.start, self.filled) = (0, 0);
            self.fill()?;
        }
        let skip = usize::try_from(pos - self.base).unwrap_or(usize::MAX).min(self.filled - self.start);
        self.start += skip;
        self.base += skip as u64;
        if self.filled - self.start < n && self.end.is_none() {
            // The few bytes left to the buffer's front, and more after them.
            self.buf.copy_within(self.start..self.filled, 0);
            (self.start, self.filled) = (0, self.filled - self.start);
            while self.filled < n && self.end.is_none() {
                self.fill()?;
            }
        }
        let from = self.start + usize::try_from(pos - self.base).unwrap_or(usize::MAX).min(self.filled - self.start);
        Ok(&self.buf[from..self.filled.min(from + n)])
    }

    fn end_seen(&self) -> Option<u64> {
        self.end
    }
}

/// The records of one run of bytes.
pub(super) struct Scanned {
    pub(super) sequences: Sequences,
    /// The file offset after the last record.
    pub(super) end: u64,
    /// CRC-32 of the records' headers and footers.
    pub(super) crc: u32,
    /// Records found.
    pub(super) records: u64,
}

/// Indexes the records `src` holds from file offset `origin` (record numbers count from there)
/// to the end of its input; `progress` gets the bytes passed.
///
/// # Errors
/// I/O errors, a damaged length, an input that ends inside a record, a record over the limits.
pub(super) fn scan(
    src: &mut impl Source,
    path: &Arc<Path>,
    origin: u64,
    limits: IndexLimits,
    progress: &mut dyn FnMut(u64),
) -> Result<Scanned, DataError> {
    let mut digest = crc32fast::Hasher::new();
    // Each record's header and footer, gathered and hashed a block at a time: the CRC of the
    // concatenation, as hashing them one by one, but through the wide loop rather than the byte
    // loop that inputs of 12 and 4 bytes take (a tenth of the pass).
    let mut framing: Vec<u8> = Vec::with_capacity(DIGEST_BLOCK_BYTES + HEADER_BYTES + FOOTER_BYTES);
    let mut sequences = Sequences::default();
    let (mut at, mut record, mut reported) = (origin, 0u64, origin);
    let fatal = |record: u64, offset: u64, message: String| DataError::Fatal {
        at: Location { file: path.clone(), line: record + 1, offset },
        message,
    };
    loop {
        let got = src.at(at, HEADER_BYTES).map_err(|e| DataError::io(path, e))?;
        if got.is_empty() {
            break;
        }
        let Ok(head) = <[u8; HEADER_BYTES]>::try_from(got) else {
            return Err(fatal(
                record,
                at,
                format!(
                    "the file ends inside record {}'s header: {} of its {HEADER_BYTES} bytes (a truncated TFRecord \
                     file)",
                    record + 1,
                    got.len()
                ),
            ));
        };
        let (len, frame) = frame_of(&head, record, limits).map_err(|message| fatal(record, at, message))?;
        let foot_at = at + frame - FOOTER_BYTES as u64;
        let foot = src.at(foot_at, FOOTER_BYTES).map_err(|e| DataError::io(path, e))?;
        if foot.len() < FOOTER_BYTES {
            let input_end = src.end_seen().unwrap_or(foot_at);
            // What is missing: some of the data and the footer, or only (some of) the footer.
            let short = (at + frame).saturating_sub(input_end);
            let what = match short.checked_sub(FOOTER_BYTES as u64) {
                Some(data) if data > 0 => format!("{data} of them missing, and the {FOOTER_BYTES}-byte footer"),
                _ => format!(
                    "all of them there, but {short} of the footer's {FOOTER_BYTES} bytes (the data's CRC) missing"
                ),
            };
            return Err(fatal(
                record,
                at,
                format!(
                    "the file ends inside record {} ({len} bytes of data declared, {what}: a truncated TFRecord file)",
                    record + 1
                ),
            ));
        }
        framing.extend_from_slice(&head);
        framing.extend_from_slice(foot);
        if framing.len() >= DIGEST_BLOCK_BYTES {
            digest.update(&framing);
            framing.clear();
        }
        let size = u32::try_from(frame).unwrap_or(u32::MAX);
        let seq = SequenceDesc { key: record, offset: at, line: record, size, samples: 1 };
        room_for_one_more(&sequences, &seq, &limits, || Location { file: path.clone(), line: record + 1, offset: at })?;
        sequences.push(seq);
        record += 1;
        at += frame;
        if at - reported >= BLOCK_BYTES as u64 {
            progress(at - origin);
            reported = at;
        }
    }
    progress(at - origin);
    digest.update(&framing);
    Ok(Scanned { sequences, end: at, crc: digest.finalize(), records: record })
}
