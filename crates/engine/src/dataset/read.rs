//! Reading a chunk's bytes: sequential windows through a per-thread reused buffer (CTF), or one
//! read of the whole range. A parser thread keeps its buffer between chunks up to
//! [`MAX_REUSED_READ_BUFFER`], which the daemon counts against its memory limit.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::format::errors::DataError;
use crate::format::index_cache::FileStamp;
use crate::Result;

thread_local! {
    /// Per-thread read buffer of [`ReadWindow`]: one window, or a whole sequence when longer.
    static READ_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The largest read buffer a parser thread keeps for its next chunk; larger ones (a sequence
/// longer than that) are freed.
pub const MAX_REUSED_READ_BUFFER: u64 = 64 << 20;

/// A buffer borrowed from this thread's [`READ_BUFFER`]; returned to it on drop.
struct ReusedBuffer(Vec<u8>);

impl Drop for ReusedBuffer {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        if buf.capacity() as u64 <= MAX_REUSED_READ_BUFFER {
            READ_BUFFER.with(|b| *b.borrow_mut() = buf);
        }
    }
}

/// What identifies the bytes of a data file as they were indexed ([`FileStamp`]: size,
/// modification and status-change times, device and inode). A chunk is read only from the file
/// as it was then: an index's offsets say nothing about a file rewritten since (in place, even
/// at the same size with its modification time set back, or replaced by another).
pub(super) type FileVersion = FileStamp;

/// The version of `path` now.
pub(super) fn version_of(path: &Path) -> Result<FileVersion> {
    FileStamp::of(path).map_err(|e| DataError::io(path, e))
}

/// An error unless `file` (opened from `path`) is still `version`. A file unlinked since it was
/// opened is said to be deleted, or replaced where another file now has its path (found by a
/// probe: both were told "changed in place", from the open file's new status-change time).
pub(super) fn check_version(version: &FileVersion, path: &Path, file: &File) -> Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = file.metadata().map_err(|e| DataError::io(path, e))?;
    // Unlinked is changed, whether or not its status-change time could tell (a review: with
    // coarse timestamps an unlink in the tick of the last change leaves the stamp as it was).
    if meta.nlink() == 0 {
        return match std::fs::metadata(path) {
            Ok(there) => unchanged_since(version, &there, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(changed(path, "deleted")),
            Err(e) => Err(DataError::io(path, e)),
        };
    }
    unchanged_since(version, &meta, path)
}

/// An error unless the file at `path` is still `version`, looked up by its path: a `.gz` input
/// whose decompressed copy is what is read, or a file whose chunk is served from the parsed
/// cache (its bytes as they were indexed, which a file changed since no longer holds).
pub(super) fn check_path_version(version: &FileVersion, path: &Path) -> Result<()> {
    // One stat (the version compares no path: no canonical name to resolve, a call per open
    // of a dataset of many files).
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(changed(path, "deleted")),
        Err(e) => return Err(DataError::io(path, e)),
    };
    unchanged_since(version, &meta, path)
}

/// An error unless `meta` (of what is at `path` now) is still `version`: what replaced a data file
/// is named when it is not a file (found by a probe: a directory in its place, given the file's
/// freed inode number, was said to be the file "rewritten").
fn unchanged_since(version: &FileVersion, meta: &std::fs::Metadata, path: &Path) -> Result<()> {
    if meta.is_dir() {
        return Err(changed(path, "replaced by a directory"));
    }
    if !meta.is_file() {
        return Err(changed(path, "replaced by something other than a regular file"));
    }
    let now = FileStamp::from_meta(PathBuf::new(), meta);
    if now.same_version(version) {
        return Ok(());
    }
    Err(changed(path, &version.change(&now)))
}

/// The error of a file `how` (what became of it) since it was indexed.
fn changed(path: &Path, how: &str) -> DataError {
    DataError::io(
        path,
        std::io::Error::other(format!(
            "the file was {how} since it was indexed; its chunks are not read with the old index \
             (a daemon indexes it again at a reload, SIGHUP; `dump` and `index` when run again)"
        )),
    )
}

/// Bytes a [`ReadWindow`] reads at once: well inside a core's L2 (1 MiB here), so what it
/// copies is still cached when the decoder reads it.
const READ_WINDOW: u64 = 256 << 10;

/// Sequential reads of one chunk through this thread's reused buffer, a window at a time.
pub(super) struct ReadWindow<'a> {
    path: &'a Path,
    file: File,
    /// The data offset of the file's first byte: 0 for a data file, the range's start for a
    /// cached range of an object.
    base: u64,
    /// Where the chunk ends: windows never read past it.
    end: u64,
    buf: ReusedBuffer,
    /// Data offset of `buf[0]`.
    at: u64,
    /// The version indexed, of a data file ([`ReadWindow::unchanged`]).
    version: Option<&'a FileVersion>,
}

impl<'a> ReadWindow<'a> {
    pub(super) fn new(path: &'a Path, end: u64, version: &'a FileVersion) -> Result<Self> {
        let file = open_indexed(path)?;
        check_version(version, path, &file)?;
        Ok(Self { version: Some(version), ..Self::over(path, file, 0, end) })
    }

    /// An error unless the data file is still the version indexed, once the chunk's bytes are
    /// read: a file rewritten while they were read (in place, its times set back) may have given
    /// some of them from before and some from after. (A range of an object is a file of the
    /// object cache's, fetched whole for its ETag.)
    pub(super) fn unchanged(&self) -> Result<()> {
        self.version.map_or(Ok(()), |v| check_version(v, self.path, &self.file))
    }

    /// Windows over `file`, which holds the data from offset `base` on; `path` names the data in
    /// errors.
    pub(super) fn over(path: &'a Path, file: File, base: u64, end: u64) -> Self {
        let mut buf = ReusedBuffer(READ_BUFFER.with(|b| std::mem::take(&mut *b.borrow_mut())));
        buf.0.clear();
        Self { path, file, base, end, buf, at: 0, version: None }
    }

    /// The `size` bytes at file offset `offset`, reading a new window (from `offset`, at least
    /// [`READ_WINDOW`] bytes or the whole sequence) when they are not all in the current one.
    pub(super) fn bytes(&mut self, offset: u64, size: u32) -> Result<&[u8]> {
        let size = u64::from(size);
        let inside = offset >= self.at && offset + size <= self.at + self.buf.0.len() as u64;
        if !inside {
            self.read_from(offset, size.max(READ_WINDOW).min(self.end.saturating_sub(offset)).max(size))?;
        }
        // In range: checked above, or the window was just read from `offset` with >= `size` bytes.
        let from = usize::try_from(offset - self.at).map_err(|_| DataError::Dataset("offset".into()))?;
        let to = from + usize::try_from(size).map_err(|_| DataError::Dataset("sequence too large".into()))?;
        self.buf.0.get(from..to).ok_or_else(|| DataError::Dataset("sequence outside its read window".into()))
    }

    /// The line at file offset `offset`: its bytes through its newline, or to the chunk's end
    /// for a last line without one. Reads windows as [`ReadWindow::bytes`] does, twice as long
    /// each time for a line that does not fit one.
    pub(super) fn line(&mut self, offset: u64) -> Result<&[u8]> {
        let left = self.end.saturating_sub(offset);
        if left == 0 {
            return Err(DataError::io(
                self.path,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "the chunk holds fewer lines than its index says (changed since it was indexed?)",
                ),
            ));
        }
        let mut want = READ_WINDOW.min(left);
        loop {
            let window_end = self.at + self.buf.0.len() as u64;
            let inside = offset >= self.at && offset < window_end;
            if inside {
                let from = usize::try_from(offset - self.at).map_err(|_| DataError::Dataset("offset".into()))?;
                if let Some(nl) = memchr::memchr(b'\n', &self.buf.0[from..]) {
                    return Ok(&self.buf.0[from..=from + nl]);
                }
                if window_end >= self.end {
                    // The chunk's last line, without a newline.
                    return Ok(&self.buf.0[from..]);
                }
                if offset + want <= window_end {
                    want = (want * 2).min(left);
                }
            }
            self.read_from(offset, want)?;
        }
    }

    /// Reads the window of `len` bytes from file offset `offset`.
    fn read_from(&mut self, offset: u64, len: u64) -> Result<()> {
        let len = usize::try_from(len).map_err(|_| DataError::Dataset("sequence too large".into()))?;
        self.buf.0.resize(len, 0);
        let at =
            offset.checked_sub(self.base).ok_or_else(|| DataError::Dataset("offset before the read range".into()))?;
        self.file.read_exact_at(&mut self.buf.0, at).map_err(|e| {
            let e = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                std::io::Error::new(e.kind(), "the file is shorter than its index says (changed since it was indexed?)")
            } else {
                e
            };
            DataError::io(self.path, e)
        })?;
        self.at = offset;
        Ok(())
    }
}

/// Opens a data file that was indexed: one that is no longer there was deleted since (found by a
/// probe: the error was the bare "No such file or directory").
fn open_indexed(path: &Path) -> Result<File> {
    minibatchd_sys::files::open_regular(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            changed(path, "deleted")
        } else {
            DataError::io(path, e)
        }
    })
}

pub(super) fn read_range(path: &Path, start: u64, end: u64, version: &FileVersion) -> Result<Vec<u8>> {
    let file = open_indexed(path)?;
    check_version(version, path, &file)?;
    let len = usize::try_from(end - start).map_err(|_| DataError::Dataset("chunk too large".into()))?;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, start).map_err(|e| DataError::io(path, e))?;
    // Changed while it was read: some bytes may be from before the change.
    check_version(version, path, &file)?;
    Ok(buf)
}

impl super::Dataset {
    /// The bytes of each chunk's records, as indexed (of a whole-file dataset, whose every file
    /// is a chunk: each file's size).
    pub fn chunk_bytes(&self) -> impl Iterator<Item = u64> + '_ {
        self.chunks.iter().map(|c| c.end.saturating_sub(c.start))
    }

    /// The longest name of an input file as configured (a path or an object's URL), in bytes.
    #[must_use]
    pub fn longest_file_name(&self) -> u64 {
        let names = self.sources.iter().flat_map(|s| s.files.iter());
        names.map(|f| f.as_os_str().len() as u64).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Seek, Write};

    use super::{version_of, ReadWindow};

    /// A file rewritten in place while a chunk's windows are read — at the same size, its
    /// modification time set back — gave a chunk of bytes from before and after the change, served
    /// and persisted without an error (found by a hostile probe: a file edited 0–400 ms after a
    /// session opened); the window checks the file's version again once its bytes are read.
    #[test]
    fn a_file_rewritten_while_its_chunk_is_read_is_an_error_once_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("d.txt");
        std::fs::write(&path, "1 1:1\n".repeat(1000)).expect("write");
        let version = version_of(&path).expect("version");
        let mut w = ReadWindow::new(&path, 6000, &version).expect("open");
        assert_eq!(w.bytes(0, 6).expect("first line"), b"1 1:1\n");
        w.unchanged().expect("not changed yet");
        let mut f = std::fs::File::options().write(true).open(&path).expect("open for writing");
        let mtime = f.metadata().and_then(|m| m.modified()).expect("mtime");
        f.seek(std::io::SeekFrom::Start(3000)).expect("seek");
        f.write_all(b"0 2:2\n").expect("rewrite a line");
        f.set_modified(mtime).expect("set the mtime back");
        // The window read before the change holds the old line; a later window would read the new.
        assert_eq!(w.bytes(3000, 6).expect("a later line"), b"1 1:1\n");
        let e = w.unchanged().expect_err("changed while read").to_string();
        assert!(e.contains("since it was indexed"), "{e}");
    }

    /// Found by a probe: a file deleted, or replaced by a rename, under a chunk's open reader was
    /// said to be "changed in place" (the open file's status-change time moved as its link went).
    #[test]
    fn a_file_deleted_or_replaced_under_its_reader_is_said_to_be() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("d.txt");
        for replace in [false, true] {
            std::fs::write(&path, "1 1:1\n".repeat(100)).expect("write");
            let version = version_of(&path).expect("version");
            let w = ReadWindow::new(&path, 600, &version).expect("open");
            if replace {
                let other = dir.path().join("other.txt");
                std::fs::write(&other, "1 1:1\n".repeat(100)).expect("write");
                std::fs::rename(&other, &path).expect("rename over it");
            } else {
                std::fs::remove_file(&path).expect("delete");
            }
            let e = w.unchanged().expect_err("gone").to_string();
            let want = if replace { "was replaced by another file" } else { "was deleted since it was indexed" };
            assert!(e.contains(want), "{e}");
        }
        // Replaced by a directory, which may take the file's freed inode number.
        std::fs::write(&path, "1 1:1\n".repeat(100)).expect("write");
        let version = version_of(&path).expect("version");
        std::fs::remove_file(&path).expect("delete");
        std::fs::create_dir(&path).expect("mkdir");
        let e = super::check_path_version(&version, &path).expect_err("a directory").to_string();
        assert!(e.contains("was replaced by a directory since it was indexed"), "{e}");
        std::fs::remove_dir(&path).expect("rmdir");
        // Deleted before a chunk's reader opens it.
        let e = ReadWindow::new(&path, 600, &super::FileVersion::default()).err().expect("gone").to_string();
        assert!(e.contains("was deleted since it was indexed"), "{e}");
    }
}
