//! `.gz` inputs: gzip data cannot be read at byte offsets, but chunks are read by offset. A gzip
//! file is therefore decompressed once, in full, into a cache directory, and the decompressed copy
//! is what the index pass and every chunk read use.
//!
//! * **Detection** is by content — the gzip magic and method `1f 8b 08` — not by the `.gz` suffix (deepx's rule),
//!   so a renamed file still works and a text file called `x.gz` is read as text.
//! * **Multi-member** gzip (`cat a.gz b.gz`, which hangs deepx's reader) is decompressed member
//!   after member (a [`flate2::bufread::GzDecoder`] each); each member's CRC and length are
//!   checked, and bytes after a member that do not start another are an error at the member's end
//!   — but for zero bytes to the end of the file (padding, which gzip and Python read past).
//! * **Where.** The copy lives in `state_dir/inflated/` and nowhere else: never in a shared
//!   temporary directory, where another user could plant a copy or a symbolic link. When that
//!   directory cannot be written (a user running `dump` with the daemon's config), opening fails
//!   with an error that says so and what to do. The directory is private
//!   ([`crate::state_file::private_subdir`]: `0700`, owned by this user); the copy is created `0600`
//!   under a fresh temporary name with `O_CREAT|O_EXCL`, fsynced and renamed.
//! * **Names and reuse.** A copy's name holds a hash of the canonical source path and one of the
//!   source's version ([`FileStamp`]: size, modification and status-change times, device and
//!   inode), so a changed source — even one replaced by another file of the same size and mtime,
//!   or rewritten with its mtime set back — gets a new copy and an unchanged one reuses it across
//!   runs; older copies of the same source are removed once no dataset reads them (the daemon's
//!   tidy, [`remove_unused`]). Beside each copy a sidecar `NAME.meta` (also `0600`, checksummed)
//!   records the source's path and version and the copy's version when it was written. A copy is
//!   reused only if the sidecar is intact and matches the source, and the copy is a regular file
//!   (not a symbolic link) owned by this user, not writable by group or others, and still the
//!   version recorded (its size, times, device and inode: a rewrite of the copy changes its
//!   status-change time, which nobody can set back). Anything else — a copy of another user, a
//!   link, a group-writable copy, a copy without sidecar (older versions, an interrupted write),
//!   a copy changed since — is decompressed again.
//! * **Limits** ([`InflateLimits`]): the copy may hold at most `daemon.max_inflated_bytes`, and at
//!   most `daemon.max_inflate_ratio` times the compressed size (a gzip bomb; small files always
//!   get [`INFLATE_RATIO_GRACE_BYTES`](crate::options::INFLATE_RATIO_GRACE_BYTES)). Exceeding
//!   either is an error naming the file, the limit and the key; the partial copy is removed. A
//!   reused copy is held to the same limits.
//! * **Errors** name the `.gz` file. Corrupt, truncated or appended-to compressed data names the
//!   compressed byte offset the decoder had reached and the bytes decompressed before it; a parse
//!   error's byte offset is an offset in the decompressed data.

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::format::errors::DataError;
use crate::format::index_cache::{FileStamp, Removed};
use crate::hash::Fnv1a;
pub use crate::options::Compression;
use crate::options::InflateLimits;
use crate::state_file;

mod copy;
mod errors;
use copy::{copy_inflated, Failure};
use errors::{cannot_write, changed_meanwhile, over_limit};

/// How gzip data starts: its magic bytes and the compression method, deflate (the only one gzip
/// defines). The method byte too: a file that starts `1f 8b` by chance (found by a probe: a
/// damaged TFRecord file whose first record is 35,615 bytes long) is not taken for gzip and
/// told of a bad gzip header.
pub(crate) const GZIP_MAGIC: [u8; 3] = [0x1f, 0x8b, 0x08];
/// The version of what a decompressed copy is checked for (bytes after a zlib stream refused
/// since 2): part of the copy's name, so that a copy an earlier version made is not reused.
const COPY_RULES: &str = "inflate copy rules 2";
/// The subdirectory of `state_dir` that holds decompressed copies.
pub const INFLATED_DIR: &str = "inflated";
/// Suffix of a copy's sidecar.
const SIDECAR_SUFFIX: &str = ".meta";
const SIDECAR_MAGIC: &[u8; 8] = b"MBDINFL\0";
/// 2: the source's and the copy's status-change time, device and inode.
const SIDECAR_VERSION: u32 = 2;

/// A decompressor of a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Codec {
    Gzip,
    Zlib,
}

impl Codec {
    /// What the copy's name adds for it (gzip copies keep the names they always had).
    fn suffix(self) -> &'static str {
        match self {
            Self::Gzip => "",
            Self::Zlib => ".zlib",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Gzip => "gzip",
            Self::Zlib => "zlib",
        }
    }
}

/// Whether `path` starts with the gzip magic.
///
/// # Errors
/// I/O errors opening or reading the file.
pub fn is_gzip(path: &Path) -> std::io::Result<bool> {
    let mut magic = [0u8; GZIP_MAGIC.len()];
    let mut f = minibatchd_sys::files::open_regular(path)?;
    let mut got = 0;
    while got < magic.len() {
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

/// The names of the copy of the source `stamp`: the prefix shared by every copy of that source,
/// and the copy's own file name.
fn copy_names(stamp: &FileStamp, codec: Codec) -> (String, String) {
    // Two hashes, a suffix and a temporary file's decorations beside it (`state_file::short_name`).
    let name =
        stamp.path.file_name().map_or_else(|| "data".into(), |n| state_file::short_name(&n.to_string_lossy(), 72));
    let path_hash = hash_parts(&[stamp.path.as_os_str().as_encoded_bytes()]);
    let stamp_hash = {
        let mut h = Fnv1a::new();
        stamp.hash_version(&mut h);
        // What the decompression checks: a copy made by an earlier one is made again (found by a
        // review: a ZLIB copy made before bytes after the stream were refused kept being reused,
        // those bytes silently left out).
        h.field(COPY_RULES.as_bytes());
        h.finish()
    };
    let prefix = format!("{name}.{path_hash:016x}.");
    let file = format!("{prefix}{stamp_hash:016x}{}", codec.suffix());
    (prefix, file)
}

/// The decompressed copy of `source` if `source` is gzip data, else `source` itself.
///
/// # Errors
/// I/O errors, corrupt gzip data, a copy beyond `limits`, or `state_dir/inflated` not writable
/// by this user.
pub fn readable_path(source: &Path, state_dir: &Path, limits: &InflateLimits) -> Result<PathBuf, DataError> {
    readable_path_as(source, Compression::Auto, state_dir, limits)
}

/// The decompressed copy of `source` as `compression` says (`Auto`: [`readable_path`]), or
/// `source` itself.
///
/// # Errors
/// As [`readable_path`]; `Gzip` data without gzip's magic.
pub fn readable_path_as(
    source: &Path,
    compression: Compression,
    state_dir: &Path,
    limits: &InflateLimits,
) -> Result<PathBuf, DataError> {
    let Some(codec) = codec_for(compression, &source.display().to_string(), || {
        is_gzip(source).map_err(|e| DataError::io(source, e))
    })?
    else {
        return Ok(source.to_owned());
    };
    let stamp = FileStamp::of(source).map_err(|e| DataError::io(source, e))?;
    inflated_copy(source, &stamp, codec, state_dir, limits, &mut || {
        let f = minibatchd_sys::files::open_regular(source).map_err(|e| DataError::io(source, e))?;
        Ok(Box::new(f))
    })
}

/// How an input named `name` is decompressed, as `compression` says: `None` when it is read as
/// it is; `gzip` tells whether it starts with gzip's magic (asked only when needed).
///
/// # Errors
/// What `gzip` returns; `Gzip` data without the magic.
pub(crate) fn codec_for(
    compression: Compression,
    name: &str,
    gzip: impl FnOnce() -> Result<bool, DataError>,
) -> Result<Option<Codec>, DataError> {
    Ok(match compression {
        Compression::None => None,
        Compression::Zlib => Some(Codec::Zlib),
        Compression::Auto => gzip()?.then_some(Codec::Gzip),
        Compression::Gzip if gzip()? => Some(Codec::Gzip),
        Compression::Gzip => {
            return Err(DataError::Dataset(format!(
                "{name}: not gzip data (compression = \"gzip\"), it does not start with gzip's magic bytes and method 1f 8b 08"
            )))
        }
    })
}

/// The decompressed copy of the gzip data `source` (recorded as `stamp`) that `open` yields
/// (a local file's, or an object's: `crate::remote::inflated_object`).
pub(crate) fn inflated_copy(
    source: &Path,
    stamp: &FileStamp,
    codec: Codec,
    state_dir: &Path,
    limits: &InflateLimits,
    open: &mut dyn FnMut() -> Result<Box<dyn Read + Send>, DataError>,
) -> Result<PathBuf, DataError> {
    let stamp = stamp.clone();
    let wanted = state_dir.join(INFLATED_DIR);
    let dir = state_file::private_subdir(state_dir, INFLATED_DIR)
        .map_err(|e| cannot_write(source, &wanted, state_dir, &e))?;
    let (_, file) = copy_names(&stamp, codec);
    let target = dir.join(&file);
    let sidecar = dir.join(format!("{file}{SIDECAR_SUFFIX}"));
    let (allowed, bound) = limits.allowed(stamp.size);
    // Held until the copy is taken up (its use marked) or written with its sidecar: shared with
    // other datasets and processes doing the same, exclusive with the tidy ([`remove_unused`]),
    // which so never removes a copy being taken up or replaced. Best effort: without it (a file
    // system without `flock`) the tidy's second look at the sidecar is what remains.
    let _lock = lock_dir_shared(&dir);
    match reusable(&target, &sidecar, &stamp) {
        Ok(size) if size > allowed => return Err(over_limit(source, &stamp, limits, allowed, bound)),
        Ok(_) => return Ok(target),
        Err(Reuse::Absent) => {}
        Err(Reuse::Refused(why)) => {
            tracing::warn!(file = %source.display(), copy = %target.display(), why, "not reusing the decompressed copy; decompressing again");
        }
    }
    let (tmp, out) = state_file::create_temp(&dir, &file).map_err(|e| cannot_write(source, &dir, state_dir, &e))?;
    let began = crate::format::index_cache::unix_now_nanos();
    let written =
        match open().map_err(Failure::Source).and_then(|input| copy_inflated(source, codec, input, out, allowed)) {
            Ok(n) => n,
            Err(f) => {
                let _ = fs::remove_file(&tmp);
                return Err(match f {
                    Failure::Target(e) => cannot_write(source, &dir, state_dir, &e),
                    Failure::Source(e) => changed_meanwhile(source, &stamp, e),
                    Failure::Limit => over_limit(source, &stamp, limits, allowed, bound),
                });
            }
        };
    let finish = || -> std::io::Result<()> {
        fs::rename(&tmp, &target)?;
        state_file::sync_dir(&dir);
        let meta = fs::symlink_metadata(&target)?;
        let record = Record { source: stamp.clone(), copy: FileStamp::from_meta(target.clone(), &meta) };
        debug_assert_eq!(record.copy.size, written);
        if !stamp.settled_by(began) {
            // A source changed in the last seconds (`FileStamp::settled_by`): the copy serves this
            // open, but without its sidecar no later one takes it for the source by the stamp.
            let _ = fs::remove_file(&sidecar);
            return Ok(());
        }
        state_file::write_atomic(&sidecar, &record.encode())
    };
    if let Err(e) = finish() {
        let _ = fs::remove_file(&tmp);
        return Err(cannot_write(source, &dir, state_dir, &e));
    }
    // Older copies of the same source stay until no dataset reads them: a version of the dataset
    // still served (sessions of the version before a reload, or the old version kept when the new
    // one fails to open) reads its chunks from its copy. `remove_unused` removes them then.
    tracing::info!(file = %source.display(), copy = %target.display(), bytes = written, codec = codec.name(), "decompressed input");
    Ok(target)
}

/// Why an existing copy is not reused.
enum Reuse {
    /// There is no copy.
    Absent,
    /// There is one, but it cannot be trusted.
    Refused(String),
}

/// The directory `dir` (`inflated/`) itself, opened and locked shared ([`inflated_copy`]; the
/// tidy, [`remove_unused`], locks it exclusively): `None` when it cannot be opened or the lock
/// fails (a file system without `flock` on directories). No lock file: nothing for the tidy to
/// keep.
fn lock_dir_shared(dir: &Path) -> Option<File> {
    let f = File::open(dir).ok()?;
    minibatchd_sys::files::lock_shared(&f).ok()?;
    Some(f)
}

/// The size of the copy at `target` if it can be reused for the source `stamp`.
fn reusable(target: &Path, sidecar: &Path, stamp: &FileStamp) -> Result<u64, Reuse> {
    let (side, record) = match state_file::open_trusted(sidecar) {
        Ok((mut f, _)) => {
            let record = read_record(&mut f).map_err(Reuse::Refused)?;
            (f, record)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(match fs::symlink_metadata(target) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Reuse::Absent,
                _ => Reuse::Refused("no sidecar recording its size (an older or interrupted copy)".into()),
            });
        }
        Err(e) => return Err(Reuse::Refused(format!("sidecar: {e}"))),
    };
    if record.source != *stamp {
        return Err(Reuse::Refused("the sidecar describes another source".into()));
    }
    let (_, meta) = state_file::open_trusted(target).map_err(|e| Reuse::Refused(e.to_string()))?;
    let now = FileStamp::from_meta(target.to_owned(), &meta);
    if !now.same_version(&record.copy) {
        return Err(Reuse::Refused(format!("{} since it was written", record.copy.change(&now))));
    }
    // The sidecar's modification time says when the copy was last used ([`remove_unused`]);
    // best effort. (The copy's own is recorded, so it is not touched.)
    let _ = side.set_modified(std::time::SystemTime::now());
    Ok(record.copy.size)
}

/// How long a decompressed copy that no open dataset reads is kept after its last use (written,
/// or reused: the sidecar's modification time): a day, so that a dataset being opened, one that
/// failed to open for a while, or a `dump` do not lose theirs.
pub const UNUSED_COPY_GRACE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Removes from `state_dir/inflated/` the decompressed copies (with their sidecars) that no open
/// dataset reads (`in_use(copy)` is false) and whose source is gone or changed since (an older
/// copy of a rewritten file) or that were not used for [`UNUSED_COPY_GRACE`] — or, of the copies
/// the caller read before (`ours`: the daemon's datasets, not a `dump` or `index` that may be
/// reading its own right now), the least recently used first while those kept for reuse pass
/// `keep_unused_bytes` together (the daemon's `max_inflated_bytes`: without it, datasets rotated
/// through reloads each left a copy for a day, however many); sidecars whose copy is gone; and
/// the temporary files of writers that are gone. A copy a dataset reads is never removed, whatever its source: sessions read chunks
/// from it. Without this, every gzip file a dataset ever read — rotated daily data, a dataset
/// removed from the configuration — kept a copy of up to `max_inflated_bytes` for good.
///
/// Files that are not this user's private regular files are left alone. Errors are skipped: this
/// only tidies.
#[must_use]
pub fn remove_unused(
    state_dir: &Path,
    in_use: &dyn Fn(&Path) -> bool,
    ours: &dyn Fn(&Path) -> bool,
    keep_unused_bytes: u64,
) -> Removed {
    let mut removed = Removed::default();
    // Only a private directory of ours (as when copies are written), and never created here.
    if fs::symlink_metadata(state_dir.join(INFLATED_DIR)).is_err() {
        return removed;
    }
    let Ok(dir) = state_file::private_subdir(state_dir, INFLATED_DIR) else { return removed };
    let Ok(entries) = fs::read_dir(&dir) else { return removed };
    // First what to remove, without the lock (the sources' stamps may take a while on a slow
    // file system, and datasets taking up copies would wait on it)...
    let mut doomed: Vec<Doomed> = Vec::new();
    // The copies the caller read before and no dataset reads now that are kept for now, with when
    // they were last used.
    let mut kept: Vec<(std::time::SystemTime, Doomed)> = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        // Only names this module writes: `NAME.HASH.HASH` copies (`copy_names`), their sidecars,
        // and temporary files (`state_file::create_temp`, in lower case).
        let is_temp = name.starts_with('.') && Path::new(&name).extension().is_some_and(|x| x == "tmp");
        let sidecar_of = name.strip_suffix(SIDECAR_SUFFIX);
        if !is_temp && !is_copy_name(sidecar_of.unwrap_or(&name)) {
            continue;
        }
        let Ok((_, meta)) = state_file::open_trusted(&path) else { continue };
        if is_temp {
            if !state_file::writer_alive(&name) {
                doomed.push(Doomed { file: (path, Seen::of(&meta)), sidecar: None });
            }
            continue;
        }
        if let Some(copy) = sidecar_of {
            if matches!(fs::symlink_metadata(dir.join(copy)), Err(e) if e.kind() == std::io::ErrorKind::NotFound) {
                doomed.push(Doomed { file: (path, Seen::of(&meta)), sidecar: None });
            }
            continue;
        }
        if in_use(&path) {
            continue;
        }
        let sidecar = dir.join(format!("{name}{SIDECAR_SUFFIX}"));
        let record = read_sidecar(&sidecar);
        // Last used: the sidecar's time, or the copy's where there is no sidecar (a copy being
        // finished has none for a moment).
        let last_used = record.as_ref().map_or(&meta, |(_, side)| side);
        let when = last_used.modified().ok();
        let idle = when.and_then(|t| t.elapsed().ok()).is_some_and(|i| i >= UNUSED_COPY_GRACE);
        // A local source that is gone, or that changed since (a copy is reused only for the
        // source it records, so nothing will reuse this one).
        let outdated = record.as_ref().is_some_and(|(r, _)| {
            r.source.path.is_absolute()
                && match FileStamp::of(&r.source.path) {
                    Ok(now) => now != r.source,
                    Err(e) => e.kind() == std::io::ErrorKind::NotFound,
                }
        });
        let sidecar = record.map(|(_, side)| (sidecar, Seen::of(&side)));
        let copy = Doomed { file: (path, Seen::of(&meta)), sidecar };
        if outdated || idle {
            doomed.push(copy);
        } else if ours(&copy.file.0) {
            kept.push((when.unwrap_or(std::time::UNIX_EPOCH), copy));
        }
    }
    // The most recently used are kept while they fit the bound; the rest go.
    kept.sort_by_key(|k| std::cmp::Reverse(k.0));
    let mut total = 0u64;
    for (_, copy) in kept {
        total = total.saturating_add(copy.file.1.len);
        if total > keep_unused_bytes {
            doomed.push(copy);
        }
    }
    if doomed.is_empty() {
        return removed;
    }
    // ...then, with the directory locked exclusively against datasets and processes taking up or
    // writing copies ([`inflated_copy`]), each removed only if nothing changed since it was looked
    // at: a copy taken up in between has a newer sidecar, one written again another inode. While
    // the lock is held elsewhere nothing is removed (`busy`: the tidy comes back soon). Where it
    // cannot be taken at all (a file system without `flock` on directories) the check that
    // nothing changed is what remains.
    let lock = File::open(&dir);
    if matches!(lock.as_ref().map(minibatchd_sys::files::try_lock_exclusive), Ok(Ok(false))) {
        removed.busy = true;
        return removed;
    }
    let unchanged = |(path, seen): &(PathBuf, Seen)| fs::symlink_metadata(path).is_ok_and(|m| Seen::of(&m) == *seen);
    for d in &doomed {
        if !unchanged(&d.file) || !d.sidecar.as_ref().is_none_or(unchanged) {
            continue;
        }
        for (path, seen) in std::iter::once(&d.file).chain(&d.sidecar) {
            if fs::remove_file(path).is_ok() {
                removed.files += 1;
                removed.bytes += seen.len;
            }
        }
    }
    drop(lock);
    removed
}

/// A file [`remove_unused`] will remove (with its copy's sidecar) if it is still as it was seen.
struct Doomed {
    file: (PathBuf, Seen),
    sidecar: Option<(PathBuf, Seen)>,
}

/// A file as it was seen: which file, its size and when it was last written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
}

impl Seen {
    fn of(m: &fs::Metadata) -> Self {
        Self { dev: m.dev(), ino: m.ino(), len: m.len(), mtime: (m.mtime(), m.mtime_nsec()) }
    }
}

/// Whether `name` has the form of a copy's name, `NAME.HASH.HASH` with two 16-digit hex hashes
/// ([`copy_names`]).
fn is_copy_name(name: &str) -> bool {
    let hex16 = |s: &str| s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit());
    let mut parts = name.rsplitn(3, '.');
    matches!((parts.next(), parts.next(), parts.next()), (Some(a), Some(b), Some(n)) if hex16(a) && hex16(b) && !n.is_empty())
}

/// A sidecar's record and metadata, if it is ours and whole.
fn read_sidecar(sidecar: &Path) -> Option<(Record, fs::Metadata)> {
    let (mut f, side) = state_file::open_trusted(sidecar).ok()?;
    Some((read_record(&mut f).ok()?, side))
}

/// The record of the open sidecar `f` (at most 64 KiB are read: a path and a few numbers), or
/// why there is none.
fn read_record(f: &mut File) -> Result<Record, String> {
    let mut bytes = Vec::new();
    f.take(1 << 16).read_to_end(&mut bytes).map_err(|e| format!("sidecar unreadable: {e}"))?;
    Record::decode(&bytes).ok_or_else(|| "sidecar damaged".to_owned())
}

/// A copy's sidecar: the source it was decompressed from, and the copy as written.
/// Little-endian: magic, version u32, path (u32 length + bytes), the source's version and the
/// copy's ([`FileStamp::version_bytes`]), FNV-1a of everything before.
#[derive(Debug, PartialEq, Eq)]
struct Record {
    source: FileStamp,
    /// The copy's version when it was written (its path is not recorded).
    copy: FileStamp,
}

impl Record {
    fn encode(&self) -> Vec<u8> {
        let path = self.source.path.as_os_str().as_encoded_bytes();
        let mut out = Vec::with_capacity(128 + path.len());
        out.extend_from_slice(SIDECAR_MAGIC);
        out.extend_from_slice(&SIDECAR_VERSION.to_le_bytes());
        out.extend_from_slice(&u32::try_from(path.len()).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(path);
        out.extend_from_slice(&self.source.version_bytes());
        out.extend_from_slice(&self.copy.version_bytes());
        let sum = Fnv1a::of(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let (body, sum) = bytes.split_at(bytes.len().checked_sub(8)?);
        if u64::from_le_bytes(sum.try_into().ok()?) != Fnv1a::of(body) {
            return None;
        }
        let mut pos = 0usize;
        let mut take = |n: usize| -> Option<&[u8]> {
            let s = body.get(pos..pos.checked_add(n)?)?;
            pos += n;
            Some(s)
        };
        if take(8)? != SIDECAR_MAGIC || take(4)? != SIDECAR_VERSION.to_le_bytes() {
            return None;
        }
        let path_len = usize::try_from(u32::from_le_bytes(take(4)?.try_into().ok()?)).ok()?;
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(take(path_len)?));
        let mut version = |path: PathBuf| -> Option<FileStamp> {
            Some(FileStamp::from_version_bytes(path, take(FileStamp::VERSION_BYTES)?.try_into().ok()?))
        };
        let source = version(path)?;
        let copy = version(PathBuf::new())?;
        (pos == body.len()).then_some(Self { source, copy })
    }
}

#[cfg(test)]
mod tests {
    /// `fs::write`, then the wait after which the written version counts as settled
    /// (`FileStamp::settled_by`): a copy of a source younger than that is not kept for reuse.
    fn write_settled(path: impl AsRef<std::path::Path>, bytes: impl AsRef<[u8]>) -> std::io::Result<()> {
        std::fs::write(path, bytes)?;
        std::thread::sleep(crate::format::index_cache::SETTLED_FINE + std::time::Duration::from_millis(5));
        Ok(())
    }

    use super::*;
    use flate2::write::GzEncoder;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_full_disk_is_told_to_free_space_not_to_change_owners() {
        let (source, dir, state) = (Path::new("/d/a.gz"), Path::new("/s/inflated"), Path::new("/s"));
        // ENOSPC.
        let full = cannot_write(source, dir, state, &std::io::Error::from_raw_os_error(28)).to_string();
        assert!(full.contains("/d/a.gz") && full.contains("free space") && !full.contains("owns"), "{full}");
        // EACCES.
        let denied = cannot_write(source, dir, state, &std::io::Error::from_raw_os_error(13)).to_string();
        assert!(denied.contains("this user owns"), "{denied}");
        // EISDIR, EFBIG.
        let dir_there = cannot_write(source, dir, state, &std::io::Error::from_raw_os_error(21)).to_string();
        assert!(dir_there.contains("A directory is in the copy's place") && !dir_there.contains("owns"), "{dir_there}");
        let limit = cannot_write(source, dir, state, &std::io::Error::from_raw_os_error(27)).to_string();
        assert!(limit.contains("file-size limit") && !limit.contains("owns"), "{limit}");
    }

    /// A way of tampering with a copy, and its name.
    type Tamper<'a> = (&'a str, &'a dyn Fn(&Path));

    fn gz(bytes: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(bytes).expect("compress");
        e.finish().expect("finish")
    }

    fn inflate(src: &Path, state: &Path) -> Result<PathBuf, DataError> {
        readable_path(src, state, &InflateLimits::default())
    }

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).expect("stat").mode() & 0o7777
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .expect("ls")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn copies_no_dataset_reads_go_when_their_source_is_gone_or_after_the_grace() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        let copy_of = |name: &str| {
            let src = dir.path().join(name);
            write_settled(&src, gz(name.as_bytes())).expect("write");
            (src.clone(), inflate(&src, &state).expect("inflate"))
        };
        let sidecar = |copy: &Path| PathBuf::from(format!("{}{SIDECAR_SUFFIX}", copy.display()));
        let long_ago = std::time::SystemTime::now() - 2 * UNUSED_COPY_GRACE;
        let age = |copy: &Path| {
            let f = fs::File::options().write(true).open(sidecar(copy)).expect("open sidecar");
            f.set_modified(long_ago).expect("set mtime");
        };
        let (_, read_old) = copy_of("read.gz"); // read by a dataset, unused for two days
        let (_, idle) = copy_of("idle.gz"); // read by none, unused for two days
        let (_, recent) = copy_of("recent.gz"); // read by none, used just now
        let (gone_src, gone) = copy_of("gone.gz"); // its source deleted
        let (read_gone_src, read_gone) = copy_of("read-gone.gz"); // source deleted, still read
        let (reused_src, reused) = copy_of("reused.gz"); // unused for two days, then reused
        for c in [&read_old, &idle, &reused] {
            age(c);
        }
        fs::remove_file(&gone_src).expect("rm");
        fs::remove_file(&read_gone_src).expect("rm");
        assert_eq!(inflate(&reused_src, &state).expect("reuse"), reused);
        let inflated = state.join(INFLATED_DIR);
        let lost = "lost.0123456789abcdef.0123456789abcdef.meta";
        write_settled(inflated.join(lost), b"sidecar of a copy that is gone").expect("write");
        // Not a name this module writes: left alone.
        write_settled(inflated.join("notes.txt"), b"keep").expect("write");
        write_settled(inflated.join(".x.4294967.0.tmp"), b"a dead writer's").expect("write");
        let read = [read_old.clone(), read_gone.clone()];
        // While a copy is being taken up or written (the shared lock `inflated_copy` holds on
        // the directory), nothing is removed.
        let held = fs::File::open(&inflated).expect("open the directory");
        minibatchd_sys::files::lock_shared(&held).expect("lock");
        let busy = remove_unused(&state, &|p: &Path| read.iter().any(|r| r == p), &|_: &Path| true, u64::MAX);
        assert_eq!(busy, Removed { busy: true, ..Removed::default() });
        assert!(idle.exists() && gone.exists(), "removed while a copy was being taken up");
        drop(held);
        let removed = remove_unused(&state, &|p: &Path| read.iter().any(|r| r == p), &|_: &Path| true, u64::MAX);
        for p in [&read_old, &read_gone, &recent, &reused] {
            assert!(p.exists() && sidecar(p).exists(), "{} removed", p.display());
        }
        for p in [&idle, &gone] {
            assert!(!p.exists() && !sidecar(p).exists(), "{} kept", p.display());
        }
        assert!(!inflated.join(lost).exists() && !inflated.join(".x.4294967.0.tmp").exists());
        assert!(inflated.join("notes.txt").exists(), "a file of another kind was removed");
        assert_eq!(removed.files, 6, "{removed:?}");
        assert_eq!(
            remove_unused(&state, &|p: &Path| read.iter().any(|r| r == p), &|_: &Path| true, u64::MAX),
            Removed::default()
        );
    }

    /// Found by a hostile probe: datasets rotated through reloads each left their copy for a day
    /// (177 MB after nine reloads, no bound). The copies no dataset reads are kept only while they
    /// fit `max_inflated_bytes` together, the least recently used going first; a copy a dataset
    /// reads neither counts nor goes.
    #[test]
    fn copies_no_dataset_reads_are_kept_within_a_bound_the_least_recently_used_going_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        let now = std::time::SystemTime::now();
        let copies: Vec<PathBuf> = (0..4u64)
            .map(|i| {
                let src = dir.path().join(format!("day{i}.gz"));
                write_settled(&src, gz(&[b'x'; 1000])).expect("write");
                let copy = inflate(&src, &state).expect("inflate");
                // Copy i was last used 4 - i minutes ago: the last is the most recent.
                let side = fs::File::options()
                    .write(true)
                    .open(format!("{}{SIDECAR_SUFFIX}", copy.display()))
                    .expect("open sidecar");
                side.set_modified(now - std::time::Duration::from_secs(60 * (4 - i))).expect("set mtime");
                copy
            })
            .collect();
        // Copy 0 is read (the oldest, and kept); of the others, 1000 bytes fit. Only the copies
        // the caller read before count: another process's (a `dump` reading its own) keep their
        // day.
        let read = |p: &Path| p == copies[0];
        let removed = remove_unused(&state, &read, &|p: &Path| p != copies[1], 1000);
        let exists: Vec<bool> = copies.iter().map(|c| c.exists()).collect();
        assert_eq!(exists, [true, true, false, true], "another's copy is not the caller's to bound: {removed:?}");
        let removed = remove_unused(&state, &read, &|_: &Path| true, 1000);
        let exists: Vec<bool> = copies.iter().map(|c| c.exists()).collect();
        assert_eq!(exists, [true, false, false, true], "{removed:?}");
        assert_eq!(removed.files, 2, "the copy and its sidecar");
        assert_eq!(remove_unused(&state, &read, &|_: &Path| true, 1000), Removed::default());
    }

    /// A dataset taking up a copy while the tidy removes it waits for the tidy's lock, then finds
    /// the copy gone and writes it again: never a path to a removed copy. (Whether it reaches the
    /// lock before the removal or after, the outcome is the same; without the lock it would take
    /// the copy up at once and be handed the path the removal then deletes.)
    #[test]
    fn a_copy_removed_while_it_is_taken_up_is_written_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        let src = dir.path().join("day.gz");
        write_settled(&src, gz(b"1 2\n0 3\n")).expect("write");
        let copy = inflate(&src, &state).expect("inflate");
        let sidecar = PathBuf::from(format!("{}{SIDECAR_SUFFIX}", copy.display()));
        // The tidy's side: the directory locked exclusively while the copy is removed.
        let lock = fs::File::open(state.join(INFLATED_DIR)).expect("open the directory");
        assert!(minibatchd_sys::files::try_lock_exclusive(&lock).expect("lock"));
        let taking = std::thread::spawn({
            let (src, state) = (src.clone(), state.clone());
            move || inflate(&src, &state)
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        fs::remove_file(&copy).expect("rm copy");
        fs::remove_file(&sidecar).expect("rm sidecar");
        drop(lock);
        let taken = taking.join().expect("join").expect("inflate");
        assert_eq!(fs::read(&taken).expect("the copy handed out exists"), b"1 2\n0 3\n");
    }

    #[test]
    fn multi_member_gzip_is_decompressed_whole_and_reused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("a.txt.gz");
        let mut data = gz(b"1 2\n");
        data.extend(gz(b"0 3\n"));
        write_settled(&src, &data).expect("write");
        let state = dir.path().join("state");
        let copy = inflate(&src, &state).expect("inflate");
        assert!(copy.starts_with(&state));
        assert_eq!(fs::read(&copy).expect("read"), b"1 2\n0 3\n");
        let before = fs::metadata(&copy).expect("stat").ino();
        assert_eq!(inflate(&src, &state).expect("again"), copy);
        assert_eq!(fs::metadata(&copy).expect("stat").ino(), before, "reused, not decompressed again");
    }

    #[test]
    fn plain_files_are_read_in_place_whatever_their_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("plain.gz");
        write_settled(&src, b"1 2\n").expect("write");
        assert_eq!(inflate(&src, dir.path()).expect("plain"), src);
    }

    #[test]
    fn corrupt_gzip_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("bad.gz");
        let mut data = gz(b"1 2\n0 3\n");
        let n = data.len();
        data[n - 6] ^= 0xff; // the CRC
        write_settled(&src, &data).expect("write");
        let e = inflate(&src, dir.path()).expect_err("corrupt").to_string();
        assert!(e.contains("bad.gz") && e.contains("invalid gzip"), "{e}");
        assert!(names(&dir.path().join(INFLATED_DIR)).is_empty(), "no partial copy left");
        // Where: the CRC is checked at the member's end, so the offset is the trailer's end.
        assert!(e.contains(&format!("compressed byte offset {n}")) && e.contains("after 8 bytes decompressed"), "{e}");
        assert!(e.contains("the CRC-32 or the length in the member's trailer"), "{e}");
        // The length (ISIZE) wrong, the CRC right: the decoder's words are the same, so both
        // causes are named (found by a probe: it was called a checksum mismatch alone).
        let mut data = gz(b"1 2\n0 3\n");
        data[n - 1] ^= 0x01;
        write_settled(&src, &data).expect("write");
        let e = inflate(&src, dir.path()).expect_err("bad length").to_string();
        assert!(e.contains("or the length in the member's trailer"), "{e}");
    }

    /// Found by a probe: a `.gz` rewritten in place while it was decompressed was reported as a
    /// corrupt gzip stream. Here the rewrite lands between the stamp and the read.
    #[test]
    fn a_source_changed_while_it_is_decompressed_is_said_to_have_changed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("moving.gz");
        let whole = gz(&b"1 2\n".repeat(1000));
        write_settled(&src, &whole).expect("write");
        let stamp = FileStamp::of(&src).expect("stamp");
        let mut open = || -> Result<Box<dyn Read + Send>, DataError> {
            fs::write(&src, &whole[..whole.len() / 2]).expect("rewrite");
            Ok(Box::new(File::open(&src).expect("open")))
        };
        let limits = InflateLimits::default();
        let e =
            inflated_copy(&src, &stamp, Codec::Gzip, dir.path(), &limits, &mut open).expect_err("moved").to_string();
        assert!(e.contains("moving.gz: the file changed while it was being decompressed"), "{e}");
        assert!(e.contains("truncated"), "the decoder's own words follow: {e}");
        // Unchanged since the stamp, the same damage is the decoder's error alone.
        let stamp = FileStamp::of(&src).expect("stamp");
        let mut open = || -> Result<Box<dyn Read + Send>, DataError> { Ok(Box::new(File::open(&src).expect("open"))) };
        let e = inflated_copy(&src, &stamp, Codec::Gzip, dir.path(), &limits, &mut open).expect_err("cut").to_string();
        assert!(!e.contains("changed while") && e.contains("truncated"), "{e}");
    }

    #[test]
    fn bytes_after_a_zlib_stream_are_an_error() {
        use flate2::write::ZlibEncoder;
        let dir = tempfile::tempdir().expect("tempdir");
        let zlib = |bytes: &[u8]| {
            let mut e = ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(bytes).expect("compress");
            e.finish().expect("finish")
        };
        let one = zlib(b"1 2\n3 4\n");
        let limits = InflateLimits::default();
        let read = |name: &str, bytes: &[u8]| {
            let src = dir.path().join(name);
            write_settled(&src, bytes).expect("write");
            readable_path_as(&src, Compression::Zlib, dir.path(), &limits)
        };
        let copy = read("one.z", &one).expect("one stream");
        assert_eq!(fs::read(copy).expect("read"), b"1 2\n3 4\n");
        for (name, tail) in [("two.z", zlib(b"5 6\n")), ("junk.z", b"abc".to_vec())] {
            let mut data = one.clone();
            data.extend_from_slice(&tail);
            let e = read(name, &data).expect_err("appended").to_string();
            assert!(e.contains(name) && e.contains("bytes follow the end of the zlib stream"), "{e}");
            assert!(e.contains(&format!("compressed byte offset {}", one.len())), "{e}");
        }
        // Only the Adler-32 trailer damaged: the data decompressed whole (found by a probe: the
        // message said "after 0 bytes decompressed" and named no checksum).
        let mut bad = one.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let e = read("adler.z", &bad).expect_err("a bad checksum").to_string();
        assert!(e.contains("after 8 bytes decompressed") && e.contains("Adler-32"), "{e}");
    }

    #[test]
    fn truncated_gzip_and_trailing_garbage_say_where() {
        let dir = tempfile::tempdir().expect("tempdir");
        let whole = gz(&b"1 2\n".repeat(1000));
        let src = dir.path().join("cut.gz");
        write_settled(&src, &whole[..whole.len() / 2]).expect("write");
        let e = inflate(&src, dir.path()).expect_err("truncated").to_string();
        let half = whole.len() / 2;
        assert!(e.contains(&format!("compressed byte offset {half}")) && e.contains("truncated"), "{e}");
        // Appended bytes, however few (fewer than a gzip header's 10 were once called a
        // truncation), are named where the member ends.
        for tail in [&b"garbage after the member"[..], b"garbage!", b"x"] {
            let src = dir.path().join("tail.gz");
            let mut data = whole.clone();
            data.extend_from_slice(tail);
            write_settled(&src, &data).expect("write");
            let e = inflate(&src, dir.path()).expect_err("garbage").to_string();
            assert!(e.contains("tail.gz") && e.contains("after 4000 bytes decompressed"), "{e}");
            assert!(e.contains("not another member"), "{e}");
            assert!(e.contains(&format!("compressed byte offset {} ", whole.len())), "{e}");
        }
        // Zeros to the end are padding, as gzip and Python's `gzip` read them; zeros then
        // anything else are appended data, named where the member ends.
        let src = dir.path().join("padded.gz");
        let mut data = whole.clone();
        data.extend_from_slice(&[0; 3000]);
        write_settled(&src, &data).expect("write");
        let copy = inflate(&src, dir.path()).expect("zero padding");
        assert_eq!(fs::read(copy).expect("read"), b"1 2\n".repeat(1000));
        data.push(b'x');
        write_settled(&src, &data).expect("write");
        let e = inflate(&src, dir.path()).expect_err("zeros then garbage").to_string();
        assert!(e.contains("not another member") && e.contains("after 4000 bytes decompressed"), "{e}");
        // A second member cut short is a truncation; a whole one is read.
        let src = dir.path().join("two.gz");
        let mut data = whole.clone();
        data.extend_from_slice(&whole[..3]);
        write_settled(&src, &data).expect("write");
        let e = inflate(&src, dir.path()).expect_err("cut member").to_string();
        assert!(e.contains("truncated"), "{e}");
        data.truncate(whole.len());
        data.extend_from_slice(&whole);
        write_settled(&src, &data).expect("write");
        let copy = inflate(&src, dir.path()).expect("two members");
        assert_eq!(fs::read(copy).expect("read"), b"1 2\n".repeat(2000));
    }

    /// Found by a review: after a member, the check of what follows looked at the buffered bytes
    /// only, and a buffer ending one byte into the next member failed a valid file ("not another
    /// member"). A source that returns one byte at a time puts every boundary there.
    #[test]
    fn members_split_anywhere_by_the_reads_are_read_whole() {
        struct Trickle(std::io::Cursor<Vec<u8>>);
        impl std::io::Read for Trickle {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = buf.len().min(1);
                self.0.read(&mut buf[..n])
            }
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let mut data = Vec::new();
        for part in [&b"1 2\n"[..], b"3 4\n", b"5 6\n"] {
            data.extend_from_slice(&gz(part));
        }
        let out = std::fs::File::create(dir.path().join("copy")).expect("create");
        let source = dir.path().join("three.gz");
        let input: Box<dyn std::io::Read + Send> = Box::new(Trickle(std::io::Cursor::new(data.clone())));
        let n = copy_inflated(&source, super::Codec::Gzip, input, out, 1 << 20).ok().expect("three members");
        assert_eq!(n, 12);
        assert_eq!(fs::read(dir.path().join("copy")).expect("read"), b"1 2\n3 4\n5 6\n");
        // A byte like a member's first after the last one, then something else: appended data.
        data.extend_from_slice(&[0x1f, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00]);
        let out = std::fs::File::create(dir.path().join("copy2")).expect("create");
        let input: Box<dyn std::io::Read + Send> = Box::new(Trickle(std::io::Cursor::new(data)));
        match copy_inflated(&source, super::Codec::Gzip, input, out, 1 << 20) {
            Err(Failure::Source(e)) => assert!(e.to_string().contains("not another member"), "{e}"),
            _ => panic!("appended bytes accepted"),
        }
    }

    #[test]
    fn a_changed_source_gets_a_new_copy() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("c.gz");
        write_settled(&src, gz(b"1\n")).expect("write");
        let first = inflate(&src, dir.path()).expect("first");
        write_settled(&src, gz(b"1\n2\n")).expect("rewrite");
        let second = inflate(&src, dir.path()).expect("second");
        assert_eq!(fs::read(&second).expect("read"), b"1\n2\n");
        assert_ne!(first, second);
        // The older copy stays while a dataset reads it (the version served before a reload),
        // and goes once none does; the current one stays.
        let inflated = dir.path().join(INFLATED_DIR);
        assert_eq!(remove_unused(dir.path(), &|p: &Path| p == first, &|_: &Path| true, u64::MAX), Removed::default());
        assert_eq!(names(&inflated).len(), 4, "both copies and their sidecars");
        assert_eq!(remove_unused(dir.path(), &|_: &Path| false, &|_: &Path| true, u64::MAX).files, 2);
        assert!(!first.exists() && second.exists());
        assert_eq!(names(&inflated).len(), 2, "one copy and its sidecar remain");
    }

    /// Issue #15: with `state_dir/inflated` not writable, the copy went to
    /// `$TMPDIR/minibatchd-inflated/` under a predictable name, where another user's planted copy
    /// was served.
    #[test]
    fn gzip_never_uses_a_shared_temp_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("shared.txt.gz");
        write_settled(&src, gz(b"1 2\n")).expect("write");
        let state = dir.path().join("state");
        fs::create_dir(&state).expect("mkdir");
        // `inflated` cannot be made a directory (the earlier code then fell back to $TMPDIR).
        write_settled(state.join(INFLATED_DIR), b"").expect("write");
        let e = inflate(&src, &state).expect_err("no writable state_dir").to_string();
        for part in
            ["shared.txt.gz", &state.join(INFLATED_DIR).display().to_string(), "daemon.state_dir", "never a shared"]
        {
            assert!(e.contains(part), "{part:?} missing from: {e}");
        }
        let (prefix, _) = copy_names(&FileStamp::of(&src).expect("stamp"), Codec::Gzip);
        let shared = std::env::temp_dir().join("minibatchd-inflated");
        if shared.is_dir() {
            assert!(
                !names(&shared).iter().any(|n| n.contains(&prefix)),
                "a copy was written into {}",
                shared.display()
            );
        }
    }

    /// Issue #15: a group member rewrote a decompressed copy at the same size and the daemon
    /// served the altered values after a restart.
    #[test]
    fn a_tampered_inflated_copy_is_not_served() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("t.txt.gz");
        write_settled(&src, gz(b"1 2\n0 3\n")).expect("write");
        let state = dir.path().join("state");
        let copy = inflate(&src, &state).expect("inflate");
        let tamper: [Tamper<'_>; 5] = [
            ("same size, group-writable", &|p| {
                fs::set_permissions(p, fs::Permissions::from_mode(0o660)).expect("chmod");
                write_settled(p, b"9 9\n9 9\n").expect("rewrite");
            }),
            ("same size, private", &|p| {
                std::thread::sleep(std::time::Duration::from_millis(20));
                write_settled(p, b"9 9\n9 9\n").expect("rewrite");
            }),
            ("longer", &|p| write_settled(p, b"9 9\n9 9\n9 9\n").expect("rewrite")),
            ("a symbolic link", &|p| {
                let other = p.with_extension("planted");
                write_settled(&other, b"9 9\n9 9\n").expect("write");
                fs::remove_file(p).expect("rm");
                std::os::unix::fs::symlink(&other, p).expect("symlink");
            }),
            ("no sidecar", &|p| {
                write_settled(p, b"9 9\n9 9\n").expect("rewrite");
                let mut side = p.as_os_str().to_owned();
                side.push(SIDECAR_SUFFIX);
                fs::remove_file(side).expect("rm");
            }),
        ];
        for (what, f) in tamper {
            f(&copy);
            let again = inflate(&src, &state).expect("inflate");
            assert_eq!(again, copy);
            assert_eq!(fs::read(&again).expect("read"), b"1 2\n0 3\n", "{what}: the tampered copy was served");
            assert!(!fs::symlink_metadata(&again).expect("stat").file_type().is_symlink(), "{what}");
            assert_eq!(mode(&again), 0o600, "{what}");
        }
    }

    /// Issue #15: a 3 MB gzip bomb made a 2 GB copy.
    #[test]
    fn a_gzip_bomb_stops_at_the_inflation_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        // 8 MiB of one byte: about 1000× in a few KiB, beyond the ratio (its grace is 1 MiB).
        let bomb = dir.path().join("bomb.gz");
        write_settled(&bomb, gz(&vec![b'1'; 8 << 20])).expect("write");
        let e = inflate(&bomb, &state).expect_err("a bomb").to_string();
        assert!(e.contains("bomb.gz") && e.contains("daemon.max_inflate_ratio") && e.contains("gzip bomb"), "{e}");
        assert!(names(&state.join(INFLATED_DIR)).is_empty(), "the partial copy is removed");

        // The absolute cap, on ordinary data; raising it is enough.
        let text: Vec<u8> = (0..20_000u32).flat_map(|i| format!("{i} 1:{}\n", i % 7).into_bytes()).collect();
        let src = dir.path().join("big.txt.gz");
        write_settled(&src, gz(&text)).expect("write");
        let small = InflateLimits { max_bytes: 4096, ..InflateLimits::default() };
        let e = readable_path(&src, &state, &small).expect_err("over the cap").to_string();
        assert!(e.contains("big.txt.gz") && e.contains("daemon.max_inflated_bytes (4096 bytes)"), "{e}");
        assert!(names(&state.join(INFLATED_DIR)).is_empty(), "the partial copy is removed");
        let copy = inflate(&src, &state).expect("within the default limits");
        assert_eq!(fs::read(&copy).expect("read"), text);
        // A reused copy is held to the limits in force.
        let e = readable_path(&src, &state, &small).expect_err("reused over the cap").to_string();
        assert!(e.contains("daemon.max_inflated_bytes"), "{e}");
    }

    /// Issue #15: with sprayed symbolic links, the victim's `dump` overwrote a file in the victim's
    /// home (the copy was created following links).
    #[test]
    fn a_planted_symlink_is_never_followed_when_writing_state() {
        let dir = tempfile::tempdir().expect("tempdir");
        let victim = dir.path().join("victim");
        write_settled(&victim, b"precious").expect("write");
        let src = dir.path().join("s.txt.gz");
        write_settled(&src, gz(b"1 2\n")).expect("write");
        let state = dir.path().join("state");
        let inflated = state.join(INFLATED_DIR);
        fs::create_dir_all(&inflated).expect("mkdir");
        let (_, file) = copy_names(&FileStamp::of(&src).expect("stamp"), Codec::Gzip);
        let pid = std::process::id();
        let mut planted = vec![file.clone(), format!("{file}{SIDECAR_SUFFIX}"), format!(".{file}.tmp.{pid}")];
        // Older builds' temporary names and this build's (`PID-TICKS`).
        for writer in [pid.to_string(), state_file::temp_writer()] {
            planted.extend((0..4).map(|n| format!(".{file}.{writer}.{n}.tmp")));
            planted.extend((0..4).map(|n| format!(".{file}{SIDECAR_SUFFIX}.{writer}.{n}.tmp")));
        }
        for name in &planted {
            std::os::unix::fs::symlink(&victim, inflated.join(name)).expect("symlink");
        }
        let copy = inflate(&src, &state).expect("inflate");
        assert_eq!(fs::read(&victim).expect("read"), b"precious");
        assert_eq!(fs::read(&copy).expect("read"), b"1 2\n");
        assert!(fs::symlink_metadata(&copy).expect("stat").is_file());
        // The links at the temporary names were skipped, never written through; none is served.
        assert_eq!(inflate(&src, &state).expect("again"), copy);
    }

    #[test]
    fn state_files_are_private_whatever_the_umask() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("p.txt.gz");
        write_settled(&src, gz(b"1 2\n")).expect("write");
        let state = dir.path().join("state");
        // What `UMask=0007` left behind: a group-writable `inflated/`.
        fs::create_dir_all(state.join(INFLATED_DIR)).expect("mkdir");
        fs::set_permissions(state.join(INFLATED_DIR), fs::Permissions::from_mode(0o770)).expect("chmod");
        let copy = inflate(&src, &state).expect("inflate");
        assert_eq!(mode(&state.join(INFLATED_DIR)), 0o700);
        for f in names(&state.join(INFLATED_DIR)) {
            assert_eq!(mode(&state.join(INFLATED_DIR).join(&f)), 0o600, "{f}");
        }
        assert!(copy.exists());
    }

    #[test]
    fn the_sidecar_round_trips_and_rejects_damage() {
        let r = Record {
            source: FileStamp {
                path: PathBuf::from("/d/x.gz"),
                size: 7,
                mtime_secs: -3,
                mtime_nanos: 9,
                ctime_secs: 4,
                ctime_nanos: 2,
                dev: 66,
                ino: 1234,
            },
            copy: FileStamp { size: 11, mtime_secs: 5, mtime_nanos: 6, ino: 99, ..FileStamp::default() },
        };
        let bytes = r.encode();
        assert_eq!(Record::decode(&bytes), Some(r));
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 1;
            assert_eq!(Record::decode(&b), None, "byte {i}");
        }
        assert_eq!(Record::decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(Record::decode(&[]), None);
    }
}
