//! `.gz` inputs: gzip data cannot be read at byte offsets, but chunks are read by offset. A gzip
//! file is therefore decompressed once, in full, into a cache directory, and the decompressed copy
//! is what the index pass and every chunk read use.
//!
//! * **Detection** is by content — the gzip magic `1f 8b` — not by the `.gz` suffix (deepx's rule),
//!   so a renamed file still works and a text file called `x.gz` is read as text.
//! * **Multi-member** gzip (`cat a.gz b.gz`, which hangs deepx's reader) is decompressed member
//!   after member ([`flate2::read::MultiGzDecoder`]); each member's CRC and length are checked.
//! * **Cache.** The copy lives in `state_dir/inflated/`, or — when that cannot be written — in
//!   `$TMPDIR/minibatchd-inflated/`. Its name holds a hash of the canonical source path and one of
//!   the source's size and modification time, so a changed source gets a new copy and an unchanged
//!   one reuses it across runs. Copies are written to a temporary name, fsynced and renamed, so a
//!   name that exists is complete; older copies of the same source are removed.
//! * **Errors** name the `.gz` file; their byte offsets are offsets in the decompressed data.

use std::fs::{self, File};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::format::errors::DataError;
use crate::format::index_cache::FileStamp;
use crate::hash::Fnv1a;

/// The gzip magic bytes.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Whether `path` starts with the gzip magic.
///
/// # Errors
/// I/O errors opening or reading the file.
pub fn is_gzip(path: &Path) -> std::io::Result<bool> {
    let mut magic = [0u8; 2];
    let mut f = File::open(path)?;
    let mut got = 0;
    while got < 2 {
        match f.read(&mut magic[got..])? {
            0 => return Ok(false),
            n => got += n,
        }
    }
    Ok(magic == GZIP_MAGIC)
}

/// The hash of `parts`, each followed by a `0xff` byte (the names of existing copies).
fn hash_parts(parts: &[&[u8]]) -> u64 {
    let mut h = Fnv1a::new();
    for part in parts {
        h.write(part);
        h.write(&[0xff]);
    }
    h.finish()
}

/// The decompressed copy of `source` if `source` is gzip data, else `source` itself.
///
/// # Errors
/// I/O errors, corrupt gzip data, or no writable cache directory.
pub fn readable_path(source: &Path, state_dir: &Path) -> Result<PathBuf, DataError> {
    if !is_gzip(source).map_err(|e| DataError::io(source, e))? {
        return Ok(source.to_owned());
    }
    let stamp = FileStamp::of(source).map_err(|e| DataError::io(source, e))?;
    let primary = state_dir.join("inflated");
    match inflate_into(source, &stamp, &primary) {
        Ok(p) => Ok(p),
        Err(Failure::Target(e)) => {
            let fallback = std::env::temp_dir().join("minibatchd-inflated");
            tracing::warn!(file = %source.display(), dir = %primary.display(), error = %e, fallback = %fallback.display(), "cannot decompress into state_dir; using the fallback directory");
            inflate_into(source, &stamp, &fallback).map_err(|f| match f {
                Failure::Target(e) => DataError::Dataset(format!(
                    "{}: cannot write its decompressed copy into {} or {}: {e}",
                    source.display(),
                    primary.display(),
                    fallback.display()
                )),
                Failure::Source(e) => e,
            })
        }
        Err(Failure::Source(e)) => Err(e),
    }
}

/// Why inflating failed: the target directory (try another) or the source (give up).
enum Failure {
    Target(std::io::Error),
    Source(DataError),
}

fn inflate_into(source: &Path, stamp: &FileStamp, dir: &Path) -> Result<PathBuf, Failure> {
    let name = stamp.path.file_name().map_or_else(|| "data".into(), |n| n.to_string_lossy().into_owned());
    let path_hash = hash_parts(&[stamp.path.as_os_str().as_encoded_bytes()]);
    let stamp_hash =
        hash_parts(&[&stamp.size.to_le_bytes(), &stamp.mtime_secs.to_le_bytes(), &stamp.mtime_nanos.to_le_bytes()]);
    let prefix = format!("{name}.{path_hash:016x}.");
    let target = dir.join(format!("{prefix}{stamp_hash:016x}"));
    if target.is_file() {
        return Ok(target);
    }
    fs::create_dir_all(dir).map_err(Failure::Target)?;
    let tmp = dir.join(format!(".{prefix}{stamp_hash:016x}.tmp.{}", std::process::id()));
    let out = File::create(&tmp).map_err(Failure::Target)?;
    let result = copy_inflated(source, out);
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    fs::rename(&tmp, &target).map_err(Failure::Target)?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    // Older copies of the same source.
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            let n = e.file_name();
            let n = n.to_string_lossy();
            if n.starts_with(&prefix) && e.path() != target {
                let _ = fs::remove_file(e.path());
            }
        }
    }
    tracing::info!(file = %source.display(), copy = %target.display(), "decompressed gzip input");
    Ok(target)
}

fn copy_inflated(source: &Path, out: File) -> Result<(), Failure> {
    let input = File::open(source).map_err(|e| Failure::Source(DataError::io(source, e)))?;
    let mut decoder = flate2::read::MultiGzDecoder::new(std::io::BufReader::with_capacity(1 << 20, input));
    let mut writer = BufWriter::with_capacity(1 << 20, out);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match decoder.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(Failure::Source(DataError::Dataset(format!(
                    "{}: invalid gzip data: {e}",
                    source.display()
                ))));
            }
        };
        writer.write_all(&buf[..n]).map_err(Failure::Target)?;
    }
    let file = writer.into_inner().map_err(|e| Failure::Target(e.into_error()))?;
    file.sync_all().map_err(Failure::Target)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::GzEncoder;

    fn gz(bytes: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(bytes).expect("compress");
        e.finish().expect("finish")
    }

    #[test]
    fn multi_member_gzip_is_decompressed_whole_and_reused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("a.txt.gz");
        let mut data = gz(b"1 2\n");
        data.extend(gz(b"0 3\n"));
        fs::write(&src, &data).expect("write");
        let state = dir.path().join("state");
        let copy = readable_path(&src, &state).expect("inflate");
        assert!(copy.starts_with(&state));
        assert_eq!(fs::read(&copy).expect("read"), b"1 2\n0 3\n");
        assert_eq!(readable_path(&src, &state).expect("again"), copy);
    }

    #[test]
    fn plain_files_are_read_in_place_whatever_their_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("plain.gz");
        fs::write(&src, b"1 2\n").expect("write");
        assert_eq!(readable_path(&src, dir.path()).expect("plain"), src);
    }

    #[test]
    fn corrupt_gzip_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("bad.gz");
        let mut data = gz(b"1 2\n0 3\n");
        let n = data.len();
        data[n - 6] ^= 0xff; // the CRC
        fs::write(&src, &data).expect("write");
        let e = readable_path(&src, dir.path()).expect_err("corrupt").to_string();
        assert!(e.contains("bad.gz") && e.contains("invalid gzip"), "{e}");
    }

    #[test]
    fn a_changed_source_gets_a_new_copy() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("c.gz");
        fs::write(&src, gz(b"1\n")).expect("write");
        let first = readable_path(&src, dir.path()).expect("first");
        fs::write(&src, gz(b"1\n2\n")).expect("rewrite");
        let second = readable_path(&src, dir.path()).expect("second");
        assert_eq!(fs::read(&second).expect("read"), b"1\n2\n");
        assert!(!first.exists() || first == second);
    }
}
