//! Which files a dataset reads, and their indexes: configured paths expanded (globs, directories,
//! files) in deepx's order, and each file's index taken from the on-disk cache when it is valid
//! for the file as it is now, else built and cached.
//!
//! The expansion treats the file system as hostile input (`docs/config.md`, the `files` key):
//!
//! * every path is classified from its metadata (symbolic links followed) before anything opens
//!   it, so a FIFO is never opened (that would wait for a writer forever); a FIFO, a socket, a
//!   device, a dangling symbolic link or one that cannot be followed (`ELOOP`) is an error that
//!   says which, naming the path, wherever it is met (an entry, a glob match, a directory's entry);
//! * a directory walk follows symbolic links to directories (as it always did) but enters each
//!   directory once, by (device, inode): a directory that is its own ancestor (a symbolic link
//!   loop) and a directory reached twice are errors naming both paths, so no walk repeats data
//!   or runs forever;
//! * one entry (a directory or a glob) yields each file once: the same file (device, inode)
//!   reached twice within it (two symbolic links, a hard link) is an error naming both paths.
//!   Entries are independent: a file named by two entries is read twice (a deliberate repeat is
//!   spelled in the configuration, not hidden in the file system);
//! * the work is bounded whatever the tree: [`MAX_DEPTH`] levels, [`MAX_FILES`] files and
//!   [`MAX_ENTRIES`] directory entries read per `files` list; more is an error, not a longer walk.
//!
//! A glob with a `**` component walks the tree below its fixed prefix (the `glob` crate follows
//! symbolic links there too): that tree is checked by the same walk first, so a loop under a
//! `**` is the same error, not a walk of every path through the loop.

use std::collections::HashMap;
use std::fs::Metadata;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::errors::DataError;
use crate::format::index::FileIndex;
use crate::format::index_cache::{self, FileStamp, Miss};
use crate::remote::{self, ObjectMeta, Remote};
use crate::Result;

/// The deepest a directory walk goes: directories more than this many levels below the
/// configured directory (or below a `**` glob's fixed prefix) are an error. Real datasets nest a
/// few levels; a tree this deep is a mistake or an attack.
pub(crate) const MAX_DEPTH: usize = 128;

/// The most files one `files` list (a dataset's, or one source's) may expand to: 2^20. Every file
/// is examined, indexed and cached on its own, so a million is far beyond any sane layout.
pub(crate) const MAX_FILES: usize = 1 << 20;

/// The most directory entries the walks of one `files` list may read, hidden ones included: 2^22
/// (four per allowed file), so a walk over a huge unrelated tree ends with an error in seconds.
pub(crate) const MAX_ENTRIES: usize = 1 << 22;

/// The bounds of one expansion (the constants above; smaller in the unit tests).
#[derive(Debug, Clone, Copy)]
struct Limits {
    depth: usize,
    files: usize,
    entries: usize,
}

const LIMITS: Limits = Limits { depth: MAX_DEPTH, files: MAX_FILES, entries: MAX_ENTRIES };

/// Expands the configured paths into files, in order: a glob expands to the regular files it
/// matches (directories it matches are skipped), sorted; a directory to every regular file below
/// it (recursively, symbolic links followed, names starting with `.` skipped as deepx does),
/// sorted by path; a file is itself. See the module documentation for what is refused.
///
/// # Errors
/// A pattern or directory that yields no file; a path that does not exist, is a dangling or
/// looping symbolic link, a FIFO, a socket or a device; a symbolic link loop or a directory
/// reached twice in a walk; the same file reached twice by one entry; a walk beyond its limits
/// (128 levels deep, 2^20 files, 2^22 directory entries); an I/O error listing a directory.
pub fn resolve_files(patterns: &[PathBuf], remote: Option<&Remote>) -> Result<Vec<PathBuf>> {
    Ok(resolve_inputs(patterns, remote)?.into_iter().map(|i| i.name).collect())
}

/// One input of a dataset: a local file, or an object with its size and ETag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// The file's path, or the object's URL (`s3://bucket/key`), as errors name it.
    pub name: PathBuf,
    /// The object, for an input in object storage.
    pub object: Option<ObjectMeta>,
}

/// [`resolve_files`] with objects: an entry starting `s3://` is listed in object storage
/// ([`crate::remote::ObjectStore::list`]: a key, a prefix ending in `/`, a "directory" key or a
/// glob; minibatchd's own shared indexes are never inputs), every other entry is expanded on the
/// local file system as [`resolve_files`] says. The order of entries is kept.
///
/// # Errors
/// As [`resolve_files`]; for an object entry, what listing it says (no such bucket, key or
/// prefix; access denied), or no object store installed.
pub fn resolve_inputs(patterns: &[PathBuf], remote: Option<&Remote>) -> Result<Vec<Input>> {
    let mut out = Vec::new();
    let mut local: Vec<PathBuf> = Vec::new();
    let flush = |local: &mut Vec<PathBuf>, out: &mut Vec<Input>| -> Result<()> {
        if !local.is_empty() {
            out.extend(resolve_with(local, LIMITS)?.into_iter().map(|name| Input { name, object: None }));
            local.clear();
        }
        Ok(())
    };
    for p in patterns {
        if !remote::is_remote(p) {
            local.push(p.clone());
            continue;
        }
        flush(&mut local, &mut out)?;
        let r = remote::require(remote, p)?;
        let objects = r.store.list(&p.to_string_lossy()).map_err(remote::RemoteError::into_data)?;
        let objects: Vec<ObjectMeta> = objects.into_iter().filter(|o| !remote::is_index_key(&o.url)).collect();
        let objects = listed_once(p, objects)?;
        if objects.is_empty() {
            return Err(DataError::io(p, std::io::Error::new(std::io::ErrorKind::NotFound, "no object matches")));
        }
        if out.len() + objects.len() > MAX_FILES {
            return Err(DataError::io(p, std::io::Error::other(format!("more than {MAX_FILES} inputs"))));
        }
        out.extend(objects.into_iter().map(|o| Input { name: PathBuf::from(&o.url), object: Some(o) }));
    }
    flush(&mut local, &mut out)?;
    Ok(out)
}

/// `objects` (one entry's listing, sorted by URL) with each key once. A store that lists a key
/// twice (found by a probe: a server repeating a listing entry had that object read twice in
/// every sweep) names one object, read once — with a warning; twice with different versions is
/// an error, as no one version can be said to be the one listed.
fn listed_once(pattern: &Path, mut objects: Vec<ObjectMeta>) -> Result<Vec<ObjectMeta>> {
    let before = objects.len();
    if let Some(w) = objects.windows(2).find(|w| w[0].url == w[1].url && w[0] != w[1]) {
        return Err(DataError::io(
            pattern,
            std::io::Error::other(format!(
                "the store listed {} twice, as two versions (ETag {}, {} bytes; ETag {}, {} bytes): list it again \
                 once the object is no longer being written",
                w[0].url, w[0].etag, w[0].size, w[1].etag, w[1].size
            )),
        ));
    }
    objects.dedup();
    if objects.len() < before {
        tracing::warn!(
            pattern = %pattern.display(),
            repeated = before - objects.len(),
            "the store listed some objects more than once; each is read once"
        );
    }
    Ok(objects)
}

/// The local files `patterns` match now, in the order [`resolve_inputs`] gives them (patterns in
/// object storage are left out: listing them is a request, made by a reload, not at every
/// `open`); `None` when none of the local patterns can match other files than before — a plain
/// file's name can only stop matching, which a stat of the file finds.
///
/// # Errors
/// As [`resolve_inputs`] (a directory gone, more files than allowed).
pub fn local_matches_now(patterns: &[PathBuf]) -> Result<Option<Vec<PathBuf>>> {
    let local: Vec<PathBuf> = patterns.iter().filter(|p| !remote::is_remote(p)).cloned().collect();
    let open_ended = |p: &PathBuf| is_pattern(p) || p.is_dir();
    if !local.iter().any(open_ended) {
        return Ok(None);
    }
    resolve_with(&local, LIMITS).map(Some)
}

/// Whether a `files` entry is a glob pattern (`*`, `?` or `[`), not a path.
#[must_use]
pub fn is_pattern(entry: &Path) -> bool {
    entry.to_string_lossy().contains(['*', '?', '['])
}

fn resolve_with(patterns: &[PathBuf], limits: Limits) -> Result<Vec<PathBuf>> {
    let mut r = Resolver { limits, out: Vec::new(), seen: HashMap::new(), entries: 0 };
    for p in patterns {
        // Each entry is checked for repeats on its own (module documentation).
        r.seen.clear();
        let text = p.to_string_lossy();
        if is_pattern(p) {
            r.glob(&text)?;
        } else {
            match classify(p)? {
                Kind::File(id) => r.add_file(p.clone(), id)?,
                Kind::Dir(id) => r.directory(p, id)?,
            }
        }
    }
    Ok(r.out)
}

/// Sorts paths as deepx's `ListRecursive` does: by the whole path's bytes (`a-b/q` < `a.txt` <
/// `a/z`), not component by component as `Path`'s `Ord` would (`a/z` < `a-b/q`).
fn sort_by_path_bytes(paths: &mut [(PathBuf, FileId)]) {
    paths.sort_by(|a, b| a.0.as_os_str().as_encoded_bytes().cmp(b.0.as_os_str().as_encoded_bytes()));
}

/// A file's identity: the same (device, inode) is the same file, whatever the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    fn of(m: &Metadata) -> Self {
        Self { dev: m.dev(), ino: m.ino() }
    }
}

/// What a path is, symbolic links followed, when it is something a dataset can use.
enum Kind {
    File(FileId),
    Dir(FileId),
}

/// What `path` is, symbolic links followed: a regular file or a directory; anything else is an
/// error that says what it is and names it. Reads metadata only: never opens `path`.
fn classify(path: &Path) -> Result<Kind> {
    let shown = path.display();
    match std::fs::metadata(path) {
        Ok(m) => {
            let t = m.file_type();
            if t.is_file() {
                return Ok(Kind::File(FileId::of(&m)));
            }
            if t.is_dir() {
                return Ok(Kind::Dir(FileId::of(&m)));
            }
            let what = if t.is_fifo() {
                "a FIFO (named pipe), not a regular file; it is not opened (reading it would wait for a writer)"
            } else if t.is_socket() {
                "a socket, not a regular file"
            } else if t.is_char_device() {
                "a character device, not a regular file"
            } else if t.is_block_device() {
                "a block device, not a regular file"
            } else {
                "neither a regular file nor a directory"
            };
            Err(DataError::Dataset(format!("{shown}{}: {what}", link_note(path))))
        }
        Err(e) => match link_target(path) {
            Some(target) if e.kind() == std::io::ErrorKind::NotFound => Err(DataError::Dataset(format!(
                "{shown}: a dangling symbolic link: its target {} does not exist",
                target.display()
            ))),
            Some(target) => Err(DataError::Dataset(format!(
                "{shown}: a symbolic link (to {}) that cannot be followed: {e}",
                target.display()
            ))),
            None if e.kind() == std::io::ErrorKind::NotFound => {
                Err(DataError::Dataset(format!("{shown}: no such file or directory")))
            }
            None => Err(DataError::io(path, e)),
        },
    }
}

/// Where the symbolic link `path` points, when `path` is one.
fn link_target(path: &Path) -> Option<PathBuf> {
    let m = std::fs::symlink_metadata(path).ok()?;
    if m.file_type().is_symlink() {
        std::fs::read_link(path).ok()
    } else {
        None
    }
}

/// ` (a symbolic link to T)` when `path` is one, for messages about what it leads to.
fn link_note(path: &Path) -> String {
    link_target(path).map(|t| format!(" (a symbolic link to {})", t.display())).unwrap_or_default()
}

/// One expansion of a `files` list: the files so far, their identities, the entries read.
struct Resolver {
    limits: Limits,
    out: Vec<PathBuf>,
    /// The files of the current entry by identity, with the path each was first reached by.
    seen: HashMap<FileId, PathBuf>,
    /// Directory entries read by the walks so far.
    entries: usize,
}

/// One directory walk.
struct Walk {
    /// Whether names starting with `.` are walked too (only when checking the tree below a `**`
    /// glob whose later components name hidden entries).
    hidden: bool,
    /// Whether regular files are collected (a directory entry of `files`) or only the directory
    /// tree is checked (below a `**` glob: non-directories are then ignored, errors included).
    collect: bool,
    /// The directories from the walk's root down to the one being listed.
    ancestors: Vec<(FileId, PathBuf)>,
    /// Every directory entered, with the path it was entered by.
    entered: HashMap<FileId, PathBuf>,
    /// The regular files found.
    found: Vec<(PathBuf, FileId)>,
}

impl Walk {
    fn new(root: &Path, id: FileId, hidden: bool, collect: bool) -> Self {
        Self {
            hidden,
            collect,
            ancestors: vec![(id, root.to_owned())],
            entered: HashMap::from([(id, root.to_owned())]),
            found: Vec::new(),
        }
    }
}

impl Resolver {
    /// Adds one file, refusing a file the current entry already added (under any path) and more
    /// than the limit.
    fn add_file(&mut self, path: PathBuf, id: FileId) -> Result<()> {
        if let Some(first) = self.seen.get(&id) {
            return Err(DataError::Dataset(format!(
                "{} and {} are the same file (reached twice through a symbolic link or a hard link); \
                 its data would be read twice",
                first.display(),
                path.display()
            )));
        }
        self.check_file_count(&path, self.out.len())?;
        self.seen.insert(id, path.clone());
        self.out.push(path);
        Ok(())
    }

    fn check_file_count(&self, path: &Path, count: usize) -> Result<()> {
        if count >= self.limits.files {
            return Err(DataError::Dataset(format!(
                "{}: a `files` list expands to at most {} files",
                path.display(),
                self.limits.files
            )));
        }
        Ok(())
    }

    /// A directory entry of `files`: every regular file below it, sorted by path bytes.
    fn directory(&mut self, dir: &Path, id: FileId) -> Result<()> {
        let mut walk = Walk::new(dir, id, false, true);
        self.walk(&mut walk, dir)?;
        let mut found = walk.found;
        if found.is_empty() {
            return Err(DataError::Dataset(format!("{}: the directory holds no file", dir.display())));
        }
        sort_by_path_bytes(&mut found);
        found.into_iter().try_for_each(|(path, id)| self.add_file(path, id))
    }

    /// A glob entry of `files`: the regular files it matches, sorted by path bytes.
    fn glob(&mut self, text: &str) -> Result<()> {
        // As a shell does (and as directory listings skip them): `*` does not match a leading '.'.
        let options = glob::MatchOptions { require_literal_leading_dot: true, ..glob::MatchOptions::new() };
        let matches =
            glob::glob_with(text, options).map_err(|e| DataError::Dataset(format!("invalid glob '{text}': {e}")))?;
        if let Some((prefix, hidden)) = recursive_prefix(text) {
            // A prefix that is no directory matches nothing: the glob says so below.
            if let Ok(Kind::Dir(id)) = classify(&prefix) {
                let mut walk = Walk::new(&prefix, id, hidden, false);
                self.walk(&mut walk, &prefix)?;
            }
        }
        let mut files = Vec::new();
        for m in matches {
            let m = m.map_err(|e| {
                let path = e.path().to_owned();
                DataError::io(&path, e.into())
            })?;
            match classify(&m)? {
                Kind::File(id) => {
                    self.check_file_count(&m, self.out.len() + files.len())?;
                    files.push((m, id));
                }
                // A glob names files: a directory it matches is not listed.
                Kind::Dir(_) => {}
            }
        }
        if files.is_empty() {
            return Err(DataError::Dataset(format!("no file matches '{text}'")));
        }
        sort_by_path_bytes(&mut files);
        files.into_iter().try_for_each(|(path, id)| self.add_file(path, id))
    }

    /// Lists `dir` (the last of `walk.ancestors`) and walks its subdirectories, in name order.
    fn walk(&mut self, walk: &mut Walk, dir: &Path) -> Result<()> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| DataError::io(dir, e))? {
            let entry = entry.map_err(|e| DataError::io(dir, e))?;
            self.entries += 1;
            if self.entries > self.limits.entries {
                return Err(DataError::Dataset(format!(
                    "{}: more than {} directory entries listed; the directories of a `files` list \
                     may hold at most {} entries in all",
                    dir.display(),
                    self.limits.entries,
                    self.limits.entries
                )));
            }
            let name = entry.file_name();
            if walk.hidden || name.as_encoded_bytes().first() != Some(&b'.') {
                names.push(name);
            }
        }
        // Name order, so that which of two paths is reported first does not depend on the file
        // system's listing order (the files are sorted by whole path afterwards anyway).
        names.sort_unstable_by(|a, b| a.as_encoded_bytes().cmp(b.as_encoded_bytes()));
        for name in names {
            let path = dir.join(&name);
            let kind = match classify(&path) {
                Ok(kind) => kind,
                Err(e) if walk.collect => return Err(e),
                Err(_) => continue,
            };
            match kind {
                Kind::File(id) => {
                    if walk.collect {
                        self.check_file_count(&path, self.out.len() + walk.found.len())?;
                        walk.found.push((path, id));
                    }
                }
                Kind::Dir(id) => {
                    enter(walk, &path, id, self.limits.depth)?;
                    self.walk(walk, &path)?;
                    walk.ancestors.pop();
                }
            }
        }
        Ok(())
    }
}

/// Pushes the directory `path` onto the walk, refusing a loop, a second visit and the depth limit.
fn enter(walk: &mut Walk, path: &Path, id: FileId, max_depth: usize) -> Result<()> {
    if let Some((_, ancestor)) = walk.ancestors.iter().find(|(a, _)| *a == id) {
        let what = match link_target(path) {
            Some(target) => format!("a symbolic link loop: the link (to {})", target.display()),
            None => "a directory loop: it".to_owned(),
        };
        return Err(DataError::Dataset(format!(
            "{}: {what} leads back to {}, a directory it is inside of, so listing it would never \
             end; remove the link, or give it a name starting with '.' (listings skip those)",
            path.display(),
            ancestor.display()
        )));
    }
    if let Some(first) = walk.entered.get(&id) {
        return Err(DataError::Dataset(format!(
            "{} and {} are the same directory (reached twice through a symbolic link); its files \
             would be read twice",
            first.display(),
            path.display()
        )));
    }
    if walk.ancestors.len() > max_depth {
        return Err(DataError::Dataset(format!(
            "{}: more than {max_depth} directory levels below {}; a dataset directory is walked at \
             most {max_depth} levels deep",
            path.display(),
            walk.ancestors[0].1.display()
        )));
    }
    walk.entered.insert(id, path.to_owned());
    walk.ancestors.push((id, path.to_owned()));
    Ok(())
}

/// For a glob with a `**` component: the directory its fixed prefix names (the components before
/// the first with a wildcard), and whether a component after the `**` starts with `.` (then the
/// glob may enter hidden directories, and the check walks them too).
fn recursive_prefix(pattern: &str) -> Option<(PathBuf, bool)> {
    let components: Vec<&str> = pattern.split('/').collect();
    let recursive = components.iter().position(|c| *c == "**")?;
    let fixed = components.iter().position(|c| c.contains(['*', '?', '['])).unwrap_or(recursive);
    let prefix = components[..fixed].join("/");
    let prefix = match prefix.as_str() {
        "" if pattern.starts_with('/') => "/".to_owned(),
        "" => ".".to_owned(),
        _ => prefix,
    };
    let hidden = components[recursive + 1..].iter().any(|c| c.starts_with('.'));
    Some((PathBuf::from(prefix), hidden))
}

/// Builds the index of one file, reporting progress in bytes.
pub(super) type BuildIndex<'a> = dyn FnMut(&mut dyn FnMut(u64)) -> Result<FileIndex, DataError> + 'a;

/// The index of the file `name` whose bytes are at `data` (the same file, or a gzip input's
/// decompressed copy), the version of `data` it describes, and whether it was built but could not
/// be written to the cache (a warning says why; `minibatchd index` fails on it): from the cache
/// when it is valid for `data` as it is now and for `fingerprint`, else built by `build` (and
/// cached).
///
/// # Errors
/// `build`'s, and a file that changed while it was being indexed (its index would describe
/// neither version).
pub(super) fn index_with_cache(
    name: &Arc<Path>,
    data: &Path,
    fingerprint: &str,
    cache: Option<&Path>,
    max_sequences: u64,
    progress: &mut dyn FnMut(u64),
    build: &mut BuildIndex<'_>,
) -> Result<(FileIndex, FileStamp, bool)> {
    let stamp = FileStamp::of(data).map_err(|e| DataError::io(name, e))?;
    if let Some(state_dir) = cache {
        match index_cache::load(state_dir, &stamp, fingerprint, name, max_sequences) {
            Ok(idx) => {
                progress(stamp.size);
                return Ok((idx, stamp, false));
            }
            Err(Miss::Absent) => {}
            Err(Miss::Stale(why)) => tracing::info!(file = %name.display(), why, "index cache is stale; rebuilding"),
        }
    }
    // A version too young for a later write to change its stamp is waited out first (at most
    // `MAX_SETTLE_WAIT`, once a file): this process reads the file with this index for as long as
    // it runs. Not a decompressed copy: this process wrote it, and no one writes it after.
    let stamp = if data == &**name {
        index_cache::settle(
            stamp,
            &mut index_cache::unix_now_nanos,
            &mut |wait| {
                tracing::info!(
                    file = %name.display(),
                    wait_ms = wait.as_millis(),
                    "changed in the last moments: indexing it once a later write would change its times"
                );
                std::thread::sleep(wait);
            },
            &mut || FileStamp::of(data),
        )
        .map_err(|e| DataError::io(name, e))?
    } else {
        stamp
    };
    let began = crate::format::index_cache::unix_now_nanos();
    let idx = build(progress)?;
    let after = FileStamp::of(data).map_err(|e| DataError::io(name, e))?;
    if !after.same_version(&stamp) {
        return Err(DataError::io(
            name,
            std::io::Error::other(format!(
                "the file was {} while it was being indexed; it is indexed again at the next reload (SIGHUP) or start of \
                 a daemon, and when `dump` or `index` is run again",
                stamp.change(&after)
            )),
        ));
    }
    if !stamp.settled_by(began) {
        // A version changed in the last seconds: another write in the same tick of the file
        // system's clock would leave the stamp as it is, and a later run would take this index
        // for the new bytes. Indexed again by the next run instead.
        tracing::debug!(file = %name.display(), "changed in the last seconds: its index is not cached");
    } else if let Some(state_dir) = cache {
        if let Err(e) = index_cache::store(state_dir, &stamp, fingerprint, &idx) {
            tracing::warn!(file = %name.display(), state_dir = %state_dir.display(), error = %e, "cannot write the index cache; going on without it");
            return Ok((idx, stamp, true));
        }
    }
    Ok((idx, stamp, false))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use super::{listed_once, resolve_files, resolve_with, Limits};
    use crate::remote::ObjectMeta;

    /// Found by a probe: a store that listed a key twice had the object read twice a sweep.
    #[test]
    fn an_object_listed_twice_is_read_once_and_two_versions_of_it_are_an_error() {
        let meta = |key: &str, etag: &str| ObjectMeta { url: format!("s3://b/{key}"), size: 10, etag: etag.into() };
        let pattern = Path::new("s3://b/");
        let listed = vec![meta("a", "\"1\""), meta("a", "\"1\""), meta("b", "\"2\""), meta("b", "\"2\"")];
        let once = listed_once(pattern, listed).expect("the same version twice");
        assert_eq!(once, vec![meta("a", "\"1\""), meta("b", "\"2\"")]);
        let e =
            listed_once(pattern, vec![meta("a", "\"1\""), meta("a", "\"3\"")]).expect_err("two versions").to_string();
        assert!(e.contains("s3://b/a twice, as two versions") && e.contains("\"3\""), "{e}");
    }

    /// `f()` on a thread, failing the test (instead of hanging it) when it takes over 30 s: the
    /// old expansion walked two symbolic link loops for hours and opened FIFOs.
    fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| panic!("{what} did not end within 30 s"))
    }

    /// The error message of expanding `paths`, within the deadline.
    fn error_of(paths: &[PathBuf]) -> String {
        let paths = paths.to_vec();
        let shown = format!("{paths:?}");
        match within("resolve_files", move || resolve_files(&paths, None)) {
            Ok(files) => panic!("{shown} expanded to {} files: {files:?}", files.len()),
            Err(e) => e.to_string(),
        }
    }

    fn write(path: &Path) {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, "1 |x 1\n").expect("write");
    }

    fn mkfifo(path: &Path) {
        let ok = std::process::Command::new("mkfifo").arg(path).status().expect("run mkfifo").success();
        assert!(ok, "mkfifo {}", path.display());
    }

    /// `data/` with `a.txt` and `sub/b.txt`.
    fn data() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("data");
        write(&data.join("a.txt"));
        write(&data.join("sub/b.txt"));
        (tmp, data)
    }

    #[test]
    fn a_symlink_loop_in_a_dataset_directory_is_an_error_not_41_copies() {
        let (_tmp, data) = data();
        symlink("..", data.join("sub/back")).expect("symlink");
        let e = error_of(std::slice::from_ref(&data));
        assert!(e.contains("symbolic link loop"), "{e}");
        assert!(e.contains(&data.join("sub/back").display().to_string()), "names the link: {e}");
        assert!(e.contains(&format!("leads back to {},", data.display())), "names the ancestor: {e}");
    }

    #[test]
    fn two_symlink_loops_end_at_once_with_an_error() {
        let (_tmp, data) = data();
        symlink(".", data.join("loop1")).expect("symlink");
        symlink(&data, data.join("sub/loop2")).expect("symlink");
        let e = error_of(std::slice::from_ref(&data));
        assert!(e.contains("symbolic link loop") && e.contains("loop1"), "{e}");
        // The same through a recursive glob, which walks the tree below its fixed prefix.
        let e = error_of(&[data.join("**/*.txt")]);
        assert!(e.contains("symbolic link loop") && e.contains("loop1"), "{e}");
    }

    #[test]
    fn a_loop_behind_a_hidden_name_is_not_walked() {
        let (_tmp, data) = data();
        symlink("..", data.join("sub/.back")).expect("symlink");
        let files = resolve_files(std::slice::from_ref(&data), None).expect("hidden names are skipped");
        assert_eq!(files, [data.join("a.txt"), data.join("sub/b.txt")]);
        let files = resolve_files(&[data.join("**/*.txt")], None).expect("`**` skips hidden names too");
        assert_eq!(files, [data.join("a.txt"), data.join("sub/b.txt")]);
    }

    #[test]
    fn a_symlink_to_a_directory_outside_the_tree_is_followed() {
        let (tmp, data) = data();
        write(&tmp.path().join("elsewhere/c.txt"));
        symlink(tmp.path().join("elsewhere"), data.join("ext")).expect("symlink");
        symlink(tmp.path().join("elsewhere/c.txt"), tmp.path().join("c-link.txt")).expect("symlink");
        let files = resolve_files(std::slice::from_ref(&data), None).expect("followed");
        assert_eq!(files, [data.join("a.txt"), data.join("ext/c.txt"), data.join("sub/b.txt")]);
        // A symbolic link to a file, named directly, is that file.
        assert_eq!(
            resolve_files(&[tmp.path().join("c-link.txt")], None).expect("file link"),
            [tmp.path().join("c-link.txt")]
        );
    }

    #[test]
    fn the_same_file_through_two_symlinks_is_an_error_naming_both_paths() {
        let (_tmp, data) = data();
        symlink("a.txt", data.join("a-again.txt")).expect("symlink");
        let e = error_of(std::slice::from_ref(&data));
        let (first, second) = (data.join("a-again.txt"), data.join("a.txt"));
        assert!(e.contains(&format!("{} and {} are the same file", first.display(), second.display())), "{e}");
        // A hard link is the same file too.
        let (_tmp, data) = self::data();
        std::fs::hard_link(data.join("a.txt"), data.join("hard.txt")).expect("hard link");
        assert!(error_of(std::slice::from_ref(&data)).contains("are the same file"));
        // Entries are independent: a file named by two entries is read twice, as the
        // configuration says (tests/deepx.rs relies on it).
        let (_tmp, data) = self::data();
        let (a, b) = (data.join("a.txt"), data.join("sub/b.txt"));
        assert_eq!(resolve_files(&[a.clone(), a.clone()], None).expect("a repeat"), [a.clone(), a.clone()]);
        assert_eq!(resolve_files(&[data.clone(), b.clone()], None).expect("overlapping entries"), [a, b.clone(), b]);
    }

    #[test]
    fn the_same_directory_reached_twice_is_an_error_naming_both_paths() {
        let (_tmp, data) = data();
        symlink("sub", data.join("alias")).expect("symlink");
        let e = error_of(std::slice::from_ref(&data));
        let (first, second) = (data.join("alias"), data.join("sub"));
        assert!(e.contains(&format!("{} and {} are the same directory", first.display(), second.display())), "{e}");
        // A glob reaching it twice: the same file twice.
        let e = error_of(&[data.join("*/b.txt")]);
        assert!(e.contains("are the same file") && e.contains("alias/b.txt") && e.contains("sub/b.txt"), "{e}");
    }

    #[test]
    fn fifos_devices_and_dangling_links_are_named_as_such() {
        let (tmp, data) = data();
        let t = tmp.path();
        mkfifo(&t.join("fifo"));
        let socket = std::os::unix::net::UnixListener::bind(t.join("sock")).expect("bind");
        symlink(t.join("missing.txt"), t.join("dangling")).expect("symlink");
        symlink("loop-a", t.join("loop-a")).expect("symlink");
        symlink("fifo", t.join("fifo-link")).expect("symlink");
        let cases: [(PathBuf, &str); 7] = [
            (t.join("fifo"), "a FIFO (named pipe), not a regular file; it is not opened"),
            (t.join("fifo-link"), "(a symbolic link to fifo): a FIFO"),
            (t.join("sock"), "a socket, not a regular file"),
            (PathBuf::from("/dev/null"), "a character device, not a regular file"),
            (
                t.join("dangling"),
                &format!("a dangling symbolic link: its target {} does not exist", t.join("missing.txt").display()),
            ),
            (
                t.join("loop-a"),
                "a symbolic link (to loop-a) that cannot be followed: Too many levels of symbolic links",
            ),
            (t.join("nope.txt"), "no such file or directory"),
        ];
        for (path, what) in &cases {
            let e = error_of(std::slice::from_ref(path));
            assert!(e.starts_with(&path.display().to_string()) && e.contains(what), "{}: {e}", path.display());
        }
        // Inside a directory, and matched by a glob: the same errors (they used to be skipped).
        for (name, what) in [
            ("fifo", "a FIFO"),
            ("sock", "a socket"),
            ("dangling", "a dangling symbolic link"),
            ("loop-a", "Too many levels"),
        ] {
            let inside = data.join("sub").join(name);
            std::fs::rename(t.join(name), &inside).expect("move into the directory");
            let e = error_of(std::slice::from_ref(&data));
            assert!(e.starts_with(&inside.display().to_string()) && e.contains(what), "{e}");
            let e = error_of(&[data.join("sub/*")]);
            assert!(e.starts_with(&inside.display().to_string()) && e.contains(what), "{e}");
            std::fs::rename(&inside, t.join(name)).expect("move back");
        }
        // A block device, where the machine has one to point at.
        let block = std::fs::read_dir("/dev").ok().into_iter().flatten().flatten().map(|e| e.path()).find(|p| {
            std::os::unix::fs::FileTypeExt::is_block_device(&std::fs::metadata(p).map(|m| m.file_type()).expect("stat"))
        });
        if let Some(block) = block {
            assert!(error_of(&[block]).contains("a block device, not a regular file"));
        }
        drop(socket);
    }

    #[test]
    fn a_glob_skips_the_directories_it_matches_and_a_recursive_glob_works() {
        let (_tmp, data) = data();
        assert_eq!(resolve_files(&[data.join("*")], None).expect("glob"), [data.join("a.txt")]);
        assert_eq!(resolve_files(&[data.join("**/b.txt")], None).expect("recursive glob"), [data.join("sub/b.txt")]);
    }

    #[test]
    fn the_walk_is_bounded_in_depth_files_and_entries() {
        let (_tmp, data) = data();
        write(&data.join("sub/deeper/c.txt"));
        let roomy = Limits { depth: 2, files: 3, entries: 5 };
        assert_eq!(resolve_with(std::slice::from_ref(&data), roomy).expect("within the limits").len(), 3);
        let e = resolve_with(std::slice::from_ref(&data), Limits { depth: 1, ..roomy }).expect_err("depth");
        assert!(e.to_string().contains("more than 1 directory levels below"), "{e}");
        let e = resolve_with(std::slice::from_ref(&data), Limits { files: 2, ..roomy }).expect_err("files");
        assert!(e.to_string().contains("expands to at most 2 files"), "{e}");
        let e = resolve_with(std::slice::from_ref(&data), Limits { entries: 4, ..roomy }).expect_err("entries");
        assert!(e.to_string().contains("more than 4 directory entries"), "{e}");
        let e = resolve_with(&[data.join("**/c.txt")], Limits { depth: 1, ..roomy }).expect_err("`**` depth");
        assert!(e.to_string().contains("more than 1 directory levels below"), "{e}");
        let e = resolve_with(
            &[data.join("*.txt"), data.join("sub/*.txt"), data.join("sub/deeper/c.txt")],
            Limits { files: 2, ..roomy },
        )
        .expect_err("files through globs and files");
        assert!(e.to_string().contains("expands to at most 2 files"), "{e}");
    }

    #[test]
    fn two_links_per_level_are_refused_at_once_not_walked_2_to_the_30_times() {
        // 2 symbolic links per level, 30 levels, no loop: 2^30 paths. Each directory is entered
        // once, so the second link to a level is refused at once.
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("d");
        let mut dir = root.clone();
        for _ in 0..30 {
            std::fs::create_dir_all(dir.join("n")).expect("mkdir");
            symlink("n", dir.join("x")).expect("symlink");
            symlink("n", dir.join("y")).expect("symlink");
            dir = dir.join("n");
        }
        write(&dir.join("leaf.txt"));
        let e = error_of(std::slice::from_ref(&root));
        assert!(e.contains("are the same directory"), "{e}");
    }
}
