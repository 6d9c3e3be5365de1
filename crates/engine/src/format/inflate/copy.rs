//! The decompression itself: a compressed input copied out through its decoder, within the
//! allowed size, with the compressed offset an error names.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;

use super::Codec;
use crate::format::errors::DataError;

/// Why decompressing failed.
pub(super) enum Failure {
    /// Writing the copy.
    Target(std::io::Error),
    /// Reading the source (I/O or corrupt gzip data).
    Source(DataError),
    /// The copy would exceed the allowed size.
    Limit,
}

/// A buffered reader that counts the bytes its reader consumes.
struct Consumed<R> {
    inner: R,
    count: std::rc::Rc<std::cell::Cell<u64>>,
}

impl<R: std::io::BufRead> Read for Consumed<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.set(self.count.get() + n as u64);
        Ok(n)
    }
}

impl<R: std::io::BufRead> std::io::BufRead for Consumed<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.inner.fill_buf()
    }

    fn consume(&mut self, amt: usize) {
        self.count.set(self.count.get() + amt as u64);
        self.inner.consume(amt);
    }
}

/// Decompresses `source` into `out`, at most `allowed` bytes; the bytes written.
pub(super) fn copy_inflated(
    source: &Path,
    codec: Codec,
    input: Box<dyn Read + Send>,
    out: File,
    allowed: u64,
) -> Result<u64, Failure> {
    // The compressed bytes the decoder has taken, for the offset an error names.
    let consumed = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let input = Consumed { inner: std::io::BufReader::with_capacity(1 << 20, input), count: consumed.clone() };
    let mut writer = BufWriter::with_capacity(1 << 20, out);
    let invalid = |written: u64, what: &str| {
        Failure::Source(DataError::Dataset(format!(
            "{}: invalid {} data at compressed byte offset {} or just before it, after {written} bytes decompressed: {what}",
            source.display(),
            codec.name(),
            consumed.get(),
        )))
    };
    let written = match codec {
        Codec::Gzip => {
            // Member by member (as `MultiGzDecoder` reads them), so that what follows a complete
            // member is judged where it starts: fewer bytes than a gzip header after the last
            // member read as a member cut short ("truncated?"), found by a probe.
            let mut input = input;
            let mut written = 0;
            let mut member = 0u64;
            loop {
                let mut decoder = flate2::bufread::GzDecoder::new(&mut input);
                written = pump(&mut decoder, &mut writer, allowed, written, member > 0, &invalid, |_| None)?;
                member += 1;
                // Only the first byte is judged here: the buffer may hold just one byte of the
                // next member, whose header its decoder judges (found by a review).
                let rest = std::io::BufRead::fill_buf(&mut input).map_err(|e| invalid(written, &e.to_string()))?;
                match rest.first() {
                    None => break written,
                    // Zeros to the end: padding (a tape's or a block device's), which gzip and
                    // Python's `gzip` read past; zeros then anything else are appended data.
                    Some(0) => {
                        if zeros_to_the_end(&mut input).map_err(|e| invalid(written, &e.to_string()))? {
                            break written;
                        }
                        return Err(invalid(written, NOT_A_MEMBER));
                    }
                    Some(&b) if b != super::GZIP_MAGIC[0] => return Err(invalid(written, NOT_A_MEMBER)),
                    Some(_) => {}
                }
            }
        }
        Codec::Zlib => {
            let mut decoder = flate2::bufread::ZlibDecoder::new(input);
            // The decoder's own count: the read that finds a bad Adler-32 checksum is the one that
            // decompressed the last bytes, which the copy never saw (found by a probe: "after 0
            // bytes decompressed" of a file whose data was whole).
            let written = pump(&mut decoder, &mut writer, allowed, 0, false, &invalid, |d| Some(d.total_out()))?;
            // A zlib stream ends where its checksum does: bytes after it were left out (found by a
            // probe: a second stream appended was dropped without a word, as TensorFlow drops it).
            let rest = std::io::BufRead::fill_buf(decoder.get_mut()).map_err(|e| invalid(written, &e.to_string()))?;
            if !rest.is_empty() {
                return Err(invalid(
                    written,
                    "bytes follow the end of the zlib stream (data appended to the file, or a second stream?): a ZLIB input is one stream",
                ));
            }
            written
        }
    };
    let file = writer.into_inner().map_err(|e| Failure::Target(e.into_error()))?;
    file.sync_all().map_err(Failure::Target)?;
    Ok(written)
}

/// Whether everything `input` has left is zero bytes (consuming them, up to the first other byte).
fn zeros_to_the_end(input: &mut impl std::io::BufRead) -> std::io::Result<bool> {
    loop {
        let rest = input.fill_buf()?;
        if rest.is_empty() {
            return Ok(true);
        }
        let zeros = rest.iter().take_while(|&&b| b == 0).count();
        let whole = zeros == rest.len();
        input.consume(zeros);
        if !whole {
            return Ok(false);
        }
    }
}

/// What follows a complete gzip member, when it does not start another.
const NOT_A_MEMBER: &str = "the bytes after a complete gzip member are not another member (data appended to the file?)";

/// Copies what `decoder` yields into `writer`, the total (from `written`, already written) at most
/// `allowed` bytes; the new total. `after_member`: the decoder reads a member that follows
/// another, so a header it cannot read is bytes appended to the file.
/// `decompressed`: what the decoder says it decompressed in all, where it keeps count (a zlib
/// decoder), for an error's message.
fn pump<D: Read>(
    decoder: &mut D,
    writer: &mut BufWriter<File>,
    allowed: u64,
    mut written: u64,
    after_member: bool,
    invalid: &dyn Fn(u64, &str) -> Failure,
    decompressed: impl Fn(&D) -> Option<u64>,
) -> Result<u64, Failure> {
    let mut buf = vec![0u8; 1 << 20];
    let start = written;
    loop {
        let n = match decoder.read(&mut buf) {
            Ok(0) => return Ok(written),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                let counted = decompressed(decoder);
                let what = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    "the file ends inside compressed data (truncated?)".to_owned()
                } else if after_member && written == start && e.to_string().contains("header") {
                    format!("{e}: {NOT_A_MEMBER}")
                } else if counted.is_some() {
                    format!("{e} (damaged data, or an Adler-32 checksum that does not match what was decompressed)")
                } else if e.to_string().contains("matching checksum") {
                    // The gzip decoder says this of a trailer's CRC-32 and of its length alike.
                    format!(
                        "{e} (the CRC-32 or the length in the member's trailer does not match what was decompressed)"
                    )
                } else {
                    e.to_string()
                };
                return Err(invalid(counted.map_or(written, |d| d.max(written)), &what));
            }
        };
        written += n as u64;
        if written > allowed {
            return Err(Failure::Limit);
        }
        writer.write_all(&buf[..n]).map_err(Failure::Target)?;
    }
}
