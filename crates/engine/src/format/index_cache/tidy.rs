//! Tidying `state_dir/index/`: the cache files that will not be used again go.

use std::fs;
use std::path::Path;

use super::{
    checksum_digest, state_file, BodyReader, FileStamp, Hashing, Removed, INDEX_DIR, MAGIC, OBJECT_CACHE_GRACE, VERSION,
};

/// Removes from `state_dir/index/` the cache files that will not be used again:
///
/// * those whose data file no longer exists (a cache is named by its data file's path and
///   options, so a file that is rewritten replaces its cache, but one that is deleted — rotated
///   data, a renamed directory — left its cache behind for good);
/// * those of files and of objects in object storage (named by URL) that no opened dataset reads
///   (`in_use(path)` is false) and that were not used for [`OBJECT_CACHE_GRACE`]: whether an
///   object still exists is not a local question, but objects that rotate out of a dataset's
///   prefix or glob left theirs behind as deleted files did; and the caches of existing files
///   that a dataset read once — another directory, a dataset removed from the configuration —
///   would otherwise stay as long as the files do;
/// * those that are not cache files of this version, and the temporary files of writers that
///   are gone (a crash during a write).
///
/// * those of a file rewritten or replaced since they were written, whatever their options and
///   whether or not a dataset reads the file (they index a version that is gone).
///
/// Caches of files that a dataset reads are kept whatever their options (another dataset, or the
/// same one configured again, may use them) while they index the file as it is. So the directory
/// holds the caches of the opened datasets' files and objects, one per set of index options, and
/// those used within the grace.
///
/// Files that are not this user's private regular files are left alone (they are never read
/// either). Errors are skipped: this only tidies.
#[must_use]
pub fn remove_orphans(state_dir: &Path, in_use: &dyn Fn(&Path) -> bool) -> Removed {
    let mut removed = Removed::default();
    let Ok(entries) = fs::read_dir(state_dir.join(INDEX_DIR)) else { return removed };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        // Both names are ours, in lower case (`cache_path`, `state_file::create_temp`).
        let ext = Path::new(&name).extension().and_then(|x| x.to_str()).unwrap_or("");
        let is_temp = name.starts_with('.') && ext == "tmp";
        if !is_temp && ext != "idx" {
            continue;
        }
        let Ok((f, meta)) = state_file::open_trusted(&path) else { continue };
        let orphan = if is_temp { !state_file::writer_alive(&name) } else { !still_used(f, &meta, in_use) };
        if orphan && fs::remove_file(&path).is_ok() {
            removed.files += 1;
            removed.bytes += meta.len();
        }
    }
    removed
}

/// Whether the cache file `f` (`meta` its metadata) may be used again (see [`remove_orphans`]);
/// `false` for a file that is not a cache file of this version. Reads only the header, through
/// the cache's own reader.
fn still_used(f: fs::File, meta: &fs::Metadata, in_use: &dyn Fn(&Path) -> bool) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let mut body = BodyReader {
        r: Hashing { inner: std::io::BufReader::with_capacity(4096, f), hash: checksum_digest() },
        left: meta.len().saturating_sub(8),
    };
    let mut magic = [0u8; 8];
    let header = body.fill(&mut magic).and_then(|()| body.u32()).and_then(|v| Ok((v, body.field()?)));
    let Ok((version, data)) = header else { return false };
    if &magic != MAGIC || version != VERSION || data.is_empty() {
        return false;
    }
    let path = Path::new(std::ffi::OsStr::from_bytes(&data));
    // Kept while a dataset reads it, or within the grace of its last use.
    let idle = meta.modified().ok().and_then(|m| m.elapsed().ok());
    let wanted = in_use(path) || idle.is_none_or(|idle| idle < OBJECT_CACHE_GRACE);
    if !path.is_absolute() {
        // An object's URL: whether it still exists is not a local question.
        return wanted;
    }
    // A data file that cannot be stat'ed for another reason (permissions) is judged as one that
    // exists.
    if !wanted || matches!(fs::symlink_metadata(path), Err(e) if e.kind() == std::io::ErrorKind::NotFound) {
        return false;
    }
    // The version it indexes: a file rewritten or replaced since makes it useless for good,
    // whether or not a dataset reads the file now (found by a probe: the caches of index options
    // not used since a rewrite stayed beside the current one, a third of the data's size each).
    let mut version = [0u8; FileStamp::VERSION_BYTES];
    if body.field().and_then(|_| body.fill(&mut version)).is_err() {
        return false;
    }
    match FileStamp::of(path) {
        Ok(now) => FileStamp::from_version_bytes(now.path.clone(), &version).same_version(&now),
        Err(_) => true,
    }
}
