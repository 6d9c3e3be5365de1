//! Which files a dataset reads, and their indexes: configured paths expanded (globs, directories,
//! files) in deepx's order, and each file's index taken from the on-disk cache when it is valid
//! for the file as it is now, else built and cached.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::errors::DataError;
use crate::format::index::FileIndex;
use crate::format::index_cache::{self, FileStamp, Miss};
use crate::Result;

/// Expands the configured paths into files, in order: a glob expands to the regular files it
/// matches, sorted; a directory to every regular file below it (recursively, names starting with
/// `.` skipped, as deepx does), sorted by path; a file is itself.
///
/// # Errors
/// A pattern or directory that yields no file, or a path that does not exist.
pub fn resolve_files(patterns: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in patterns {
        let text = p.to_string_lossy();
        if text.contains(['*', '?', '[']) {
            // As a shell does (and as directory listings skip them): `*` does not match a
            // leading '.'.
            let options = glob::MatchOptions { require_literal_leading_dot: true, ..glob::MatchOptions::new() };
            let mut matched: Vec<PathBuf> = glob::glob_with(&text, options)
                .map_err(|e| DataError::Dataset(format!("invalid glob '{text}': {e}")))?
                .filter_map(Result::ok)
                .filter(|m| m.is_file())
                .collect();
            sort_by_path_bytes(&mut matched);
            if matched.is_empty() {
                return Err(DataError::Dataset(format!("no file matches '{text}'")));
            }
            out.extend(matched);
        } else if p.is_file() {
            out.push(p.clone());
        } else if p.is_dir() {
            let mut found = Vec::new();
            list_dir(p, &mut found)?;
            sort_by_path_bytes(&mut found);
            if found.is_empty() {
                return Err(DataError::Dataset(format!("{}: the directory holds no file", p.display())));
            }
            out.extend(found);
        } else {
            return Err(DataError::Dataset(format!("{}: no such file", p.display())));
        }
    }
    Ok(out)
}

/// Sorts paths as deepx's `ListRecursive` does: by the whole path's bytes (`a-b/q` < `a.txt` <
/// `a/z`), not component by component as `Path`'s `Ord` would (`a/z` < `a-b/q`).
fn sort_by_path_bytes(paths: &mut [PathBuf]) {
    paths.sort_by(|a, b| a.as_os_str().as_encoded_bytes().cmp(b.as_os_str().as_encoded_bytes()));
}

/// Regular files below `dir`, recursively, skipping names that start with `.`.
fn list_dir(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| DataError::io(dir, e))? {
        let entry = entry.map_err(|e| DataError::io(dir, e))?;
        if entry.file_name().as_encoded_bytes().first() == Some(&b'.') {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            list_dir(&path, out)?;
        } else if path.is_file() {
            out.push(path);
        }
    }
    Ok(())
}

/// Builds the index of one file, reporting progress in bytes.
pub(super) type BuildIndex<'a> = dyn FnMut(&mut dyn FnMut(u64)) -> Result<FileIndex, DataError> + 'a;

/// The index of the file `name` whose bytes are at `data` (the same file, or a gzip input's
/// decompressed copy): from the cache when it is valid for `data` as it is now and for
/// `fingerprint`, else built by `build` (and cached).
pub(super) fn index_with_cache(
    name: &Arc<Path>,
    data: &Path,
    fingerprint: &str,
    use_cache: bool,
    state_dir: &Path,
    progress: &mut dyn FnMut(u64),
    build: &mut BuildIndex<'_>,
) -> Result<FileIndex> {
    let stamp = FileStamp::of(data).map_err(|e| DataError::io(name, e))?;
    if use_cache {
        match index_cache::load(state_dir, &stamp, fingerprint, name) {
            Ok(idx) => {
                progress(stamp.size);
                return Ok(idx);
            }
            Err(Miss::Absent) => {}
            Err(Miss::Stale(why)) => tracing::info!(file = %name.display(), why, "index cache is stale; rebuilding"),
        }
    }
    let idx = build(progress)?;
    if use_cache {
        if let Err(e) = index_cache::store(state_dir, &stamp, fingerprint, &idx) {
            tracing::warn!(file = %name.display(), state_dir = %state_dir.display(), error = %e, "cannot write the index cache; going on without it");
        }
    }
    Ok(idx)
}
