//! The on-disk index cache.
//!
//! One file per (data file, index options) under `state_dir/index/`, named by a hash of the
//! canonical data path and the options fingerprint. Layout (little-endian):
//!
//! ```text
//! magic  b"MBDINDEX"          8 bytes
//! version u32 = 1
//! path_len u32, path bytes    the canonical data path (guards against hash collisions)
//! opts_len u32, opts bytes    CtfIndexOptions::fingerprint()
//! size u64, mtime_secs i64, mtime_nanos u32    of the data file when indexed
//! count u64, then count × { key u64, offset u64, line u64, size u32, samples u32 }
//! checksum u64                FNV-1a over everything before it
//! ```
//!
//! A cache is used only if every field matches the data file as it is now; anything else —
//! another version, a truncated or corrupt file, a changed size or mtime — makes the caller
//! rebuild. A cache is read only if it is a regular file (not a symbolic link) owned by this
//! process's user and not writable by group or others ([`persist::open_trusted`]): the checksum
//! guards against damage, not against someone who can recompute it. Writes go through
//! [`persist::write_atomic`] into `state_dir/index/`, a private directory
//! ([`persist::private_subdir`], `0700`): a temporary file (`0600`, `O_CREAT|O_EXCL`) that is
//! fsynced and renamed, then the directory is fsynced, so a crash never leaves a half-written cache
//! under the final name.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use crate::format::index::{FileIndex, SequenceDesc};
use crate::hash::Fnv1a;
use crate::persist;

const MAGIC: &[u8; 8] = b"MBDINDEX";
const VERSION: u32 = 1;
const RECORD_BYTES: usize = 32;
/// The subdirectory of `state_dir` that holds index caches.
pub const INDEX_DIR: &str = "index";

/// Identity of a data file as the cache records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStamp {
    /// Canonical path.
    pub path: PathBuf,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, seconds since the epoch.
    pub mtime_secs: i64,
    /// Sub-second part of the modification time.
    pub mtime_nanos: u32,
}

impl FileStamp {
    /// Stats `path` now.
    ///
    /// # Errors
    /// I/O errors from `canonicalize` or `metadata`.
    pub fn of(path: &Path) -> std::io::Result<Self> {
        let canonical = fs::canonicalize(path)?;
        let meta = fs::metadata(&canonical)?;
        let (mtime_secs, mtime_nanos) = match meta.modified()?.duration_since(UNIX_EPOCH) {
            Ok(d) => (i64::try_from(d.as_secs()).unwrap_or(i64::MAX), d.subsec_nanos()),
            Err(e) => (-i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX), e.duration().subsec_nanos()),
        };
        Ok(Self { path: canonical, size: meta.len(), mtime_secs, mtime_nanos })
    }
}

/// The cache file for `stamp` and `fingerprint` under `state_dir`.
#[must_use]
pub fn cache_path(state_dir: &Path, stamp: &FileStamp, fingerprint: &str) -> PathBuf {
    let mut key = stamp.path.as_os_str().as_encoded_bytes().to_vec();
    key.push(0);
    key.extend_from_slice(fingerprint.as_bytes());
    let name = stamp.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    state_dir.join(INDEX_DIR).join(format!("{name}.{:016x}.idx", Fnv1a::of(&key)))
}

fn encode(stamp: &FileStamp, fingerprint: &str, index: &FileIndex) -> Vec<u8> {
    let path = stamp.path.as_os_str().as_encoded_bytes();
    let mut out = Vec::with_capacity(64 + path.len() + fingerprint.len() + index.sequences.len() * RECORD_BYTES);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    for field in [path, fingerprint.as_bytes()] {
        out.extend_from_slice(&u32::try_from(field.len()).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(field);
    }
    out.extend_from_slice(&stamp.size.to_le_bytes());
    out.extend_from_slice(&stamp.mtime_secs.to_le_bytes());
    out.extend_from_slice(&stamp.mtime_nanos.to_le_bytes());
    out.extend_from_slice(&(index.sequences.len() as u64).to_le_bytes());
    for s in &index.sequences {
        out.extend_from_slice(&s.key.to_le_bytes());
        out.extend_from_slice(&s.offset.to_le_bytes());
        out.extend_from_slice(&s.line.to_le_bytes());
        out.extend_from_slice(&s.size.to_le_bytes());
        out.extend_from_slice(&s.samples.to_le_bytes());
    }
    let sum = Fnv1a::of(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// A little-endian reader over a byte slice that fails softly.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.bytes.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// Why a cache was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Miss {
    /// No cache file.
    Absent,
    /// A cache exists but does not describe the data file as it is now, or is damaged.
    Stale(&'static str),
}

fn decode(bytes: &[u8], stamp: &FileStamp, fingerprint: &str, file: &Arc<Path>) -> Result<FileIndex, Miss> {
    if bytes.len() < 8 + 8 {
        return Err(Miss::Stale("truncated"));
    }
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    if u64::from_le_bytes(sum.try_into().map_err(|_| Miss::Stale("truncated"))?) != Fnv1a::of(body) {
        return Err(Miss::Stale("checksum mismatch"));
    }
    let mut r = Reader { bytes: body, pos: 0 };
    let bad = Miss::Stale("malformed");
    if r.take(8) != Some(MAGIC.as_slice()) {
        return Err(Miss::Stale("not an index cache"));
    }
    if r.u32() != Some(VERSION) {
        return Err(Miss::Stale("other cache version"));
    }
    let path_len = r.u32().ok_or(bad.clone())? as usize;
    if r.take(path_len) != Some(stamp.path.as_os_str().as_encoded_bytes()) {
        return Err(Miss::Stale("other data file"));
    }
    let opts_len = r.u32().ok_or(bad.clone())? as usize;
    if r.take(opts_len) != Some(fingerprint.as_bytes()) {
        return Err(Miss::Stale("other index options"));
    }
    let (size, secs, nanos) = (r.u64(), r.i64(), r.u32());
    if size != Some(stamp.size) || secs != Some(stamp.mtime_secs) || nanos != Some(stamp.mtime_nanos) {
        return Err(Miss::Stale("data file changed (size or mtime)"));
    }
    let count = usize::try_from(r.u64().ok_or(bad.clone())?).map_err(|_| bad.clone())?;
    if count.checked_mul(RECORD_BYTES) != Some(body.len() - r.pos) {
        return Err(bad);
    }
    let mut sequences = Vec::with_capacity(count);
    for _ in 0..count {
        let (key, offset, line, size, samples) = (r.u64(), r.u64(), r.u64(), r.u32(), r.u32());
        let (Some(key), Some(offset), Some(line), Some(size), Some(samples)) = (key, offset, line, size, samples)
        else {
            return Err(bad);
        };
        if samples == 0 || size == 0 || offset.saturating_add(u64::from(size)) > stamp.size {
            return Err(bad);
        }
        sequences.push(SequenceDesc { key, offset, line, size, samples });
    }
    Ok(FileIndex { path: file.clone(), size: stamp.size, sequences })
}

/// Loads the cached index of `file` if it is valid for `stamp` and `fingerprint`.
///
/// # Errors
/// Why it was not used; the caller rebuilds.
pub fn load(state_dir: &Path, stamp: &FileStamp, fingerprint: &str, file: &Arc<Path>) -> Result<FileIndex, Miss> {
    let path = cache_path(state_dir, stamp, fingerprint);
    let mut f = match persist::open_trusted(&path) {
        Ok((f, _)) => f,
        Err(e) if persist::is_untrusted(&e) => {
            return Err(Miss::Stale("not a private file of this user (owner, mode or symbolic link)"));
        }
        Err(_) => return Err(Miss::Absent),
    };
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes).map_err(|_| Miss::Absent)?;
    decode(&bytes, stamp, fingerprint, file)
}

/// Writes the cache atomically and privately into `state_dir/index/`: temporary file (`0600`),
/// fsync, rename, fsync of the directory.
///
/// # Errors
/// I/O errors, or a state directory of another user ([`persist::private_subdir`]); the caller
/// logs them and goes on without a cache.
pub fn store(state_dir: &Path, stamp: &FileStamp, fingerprint: &str, index: &FileIndex) -> std::io::Result<PathBuf> {
    let path = cache_path(state_dir, stamp, fingerprint);
    persist::private_subdir(state_dir, INDEX_DIR)?;
    persist::write_atomic(&path, &encode(stamp, fingerprint, index))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, PathBuf, FileStamp, FileIndex) {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("d.ctf");
        fs::write(&data, "|a 1\n|a 2\n").expect("write");
        let stamp = FileStamp::of(&data).expect("stamp");
        let file: Arc<Path> = Arc::from(data.as_path());
        let index = FileIndex {
            path: file,
            size: stamp.size,
            sequences: vec![
                SequenceDesc { key: 0, offset: 0, line: 0, size: 5, samples: 1 },
                SequenceDesc { key: 1, offset: 5, line: 1, size: 5, samples: 1 },
            ],
        };
        (dir, data, stamp, index)
    }

    #[test]
    fn round_trip() {
        let (dir, _data, stamp, index) = setup();
        store(dir.path(), &stamp, "opts", &index).expect("store");
        assert_eq!(load(dir.path(), &stamp, "opts", &index.path), Ok(index));
    }

    #[test]
    fn other_options_or_changed_file_are_misses() {
        let (dir, data, stamp, index) = setup();
        store(dir.path(), &stamp, "opts", &index).expect("store");
        assert_eq!(load(dir.path(), &stamp, "other", &index.path), Err(Miss::Absent));
        fs::write(&data, "|a 1\n|a 2\n|a 3\n").expect("rewrite");
        let changed = FileStamp::of(&data).expect("stamp");
        // The same cache name (path + options), but the size no longer matches.
        assert_eq!(
            load(dir.path(), &changed, "opts", &index.path),
            Err(Miss::Stale("data file changed (size or mtime)"))
        );
    }

    #[test]
    fn corrupt_cache_is_never_trusted() {
        let (dir, _data, stamp, index) = setup();
        let path = store(dir.path(), &stamp, "opts", &index).expect("store");
        let mut bytes = fs::read(&path).expect("read");
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        fs::write(&path, &bytes).expect("write");
        assert_eq!(load(dir.path(), &stamp, "opts", &index.path), Err(Miss::Stale("checksum mismatch")));
        fs::write(&path, &bytes[..10]).expect("truncate");
        assert!(matches!(load(dir.path(), &stamp, "opts", &index.path), Err(Miss::Stale(_))));
    }

    /// Issue #15: under `UMask=0007` the index directory and its files were group-writable, so a
    /// group member could rewrite a cache (recomputing its checksum).
    #[test]
    fn a_cache_others_could_write_is_never_trusted() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let (dir, _data, stamp, index) = setup();
        let idx_dir = dir.path().join(INDEX_DIR);
        fs::create_dir(&idx_dir).expect("mkdir");
        fs::set_permissions(&idx_dir, fs::Permissions::from_mode(0o770)).expect("chmod");
        let path = store(dir.path(), &stamp, "opts", &index).expect("store");
        let mode = |p: &Path| fs::symlink_metadata(p).expect("stat").mode() & 0o7777;
        assert_eq!((mode(&idx_dir), mode(&path)), (0o700, 0o600));
        fs::set_permissions(&path, fs::Permissions::from_mode(0o660)).expect("chmod");
        assert!(
            matches!(load(dir.path(), &stamp, "opts", &index.path), Err(Miss::Stale(why)) if why.contains("private"))
        );
        // A link to a valid cache is not followed either.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");
        let real = path.with_extension("real");
        fs::rename(&path, &real).expect("mv");
        std::os::unix::fs::symlink(&real, &path).expect("symlink");
        assert!(matches!(load(dir.path(), &stamp, "opts", &index.path), Err(Miss::Stale(_))));
        // Storing again replaces the link with a private file.
        store(dir.path(), &stamp, "opts", &index).expect("store");
        assert_eq!(mode(&path), 0o600);
        assert_eq!(load(dir.path(), &stamp, "opts", &index.path), Ok(index));
    }
}
