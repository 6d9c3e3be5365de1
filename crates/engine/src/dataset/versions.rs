//! Whether a dataset's files are still the versions it indexed: for a reload, which opens a
//! dataset whose files changed again ([`Dataset::is_current`]); for a new session, refused on
//! changed files ([`Dataset::files_unchanged`]); and for a chunk served from the parsed cache,
//! which holds the bytes as they were indexed ([`Dataset::chunk_inputs_unchanged`]). A read of a
//! file's bytes checks its version itself (`read::check_version`).

use std::path::Path;

use super::files::local_matches_now;
use super::read::{check_path_version, version_of};
use super::{resolve_inputs, Dataset, OpenSource, Stored};
use crate::format::errors::DataError;
use crate::remote;
use crate::Result;

impl OpenSource {
    /// An error unless the bytes of file `f` — the file, or a `.gz` input's decompressed copy —
    /// are still the version indexed. Objects are checked by their ETag when read, not here.
    fn data_unchanged(&self, f: usize) -> Result<()> {
        match (self.data_versions.get(f), self.data.get(f)) {
            (Some(Stored::Local(v)), Some(data)) => check_path_version(v, data),
            _ => Ok(()),
        }
    }

    /// For a `.gz` input read from its decompressed copy: an error unless the `.gz` is still the
    /// version indexed.
    fn original_unchanged(&self, f: usize) -> Result<()> {
        match (self.file_versions.get(f), self.files.get(f), self.data.get(f)) {
            (Some(Stored::Local(v)), Some(file), Some(data)) if file != data => check_path_version(v, file),
            _ => Ok(()),
        }
    }
}

impl Dataset {
    /// Whether the dataset's files are still those it indexed: the patterns match the same
    /// files, and none was rewritten or replaced since, nor a `.gz` input's decompressed copy. A
    /// reload opens a dataset that is not current again, even if its configuration did not
    /// change.
    #[must_use]
    pub fn is_current(&self) -> bool {
        self.config.sources.iter().zip(&self.sources).all(|(cfg, src)| {
            let Ok(now) = resolve_inputs(&cfg.files, self.remote.as_deref()) else { return false };
            now.len() == src.files.len()
                && now.iter().zip(src.files.iter().zip(&src.file_versions)).all(|(input, (f, v))| {
                    input.name == **f
                        && match v {
                            Stored::Local(v) => version_of(f).is_ok_and(|now| now.same_version(v)),
                            Stored::Remote(o) => input.object.as_ref() == Some(o),
                        }
                })
                // A `.gz` input's copy (a plain file was just looked at).
                && (0..src.files.len()).all(|f| src.files.get(f) == src.data.get(f) || src.data_unchanged(f).is_ok())
        })
    }

    /// An error, naming the first such file and what changed, unless every local file of the
    /// dataset — and every `.gz` input's decompressed copy — is still the version indexed (by
    /// size, times, device and inode: no byte is read; objects are checked by their ETag as they
    /// are read). A new session is refused on a dataset whose files changed since it was indexed
    /// — its chunks would fail as they are read, or be served from the caches as the files no
    /// longer are — until a reload (SIGHUP) indexes it again. Sessions already open go on with
    /// what they can read as it was indexed (a `.gz` input's copy, chunks in memory).
    ///
    /// # Errors
    /// [`crate::format::errors::DataError::Io`] for a file rewritten, replaced or gone.
    pub fn files_unchanged(&self) -> Result<()> {
        self.sources.iter().try_for_each(|src| {
            (0..src.files.len()).try_for_each(|f| src.original_unchanged(f).and_then(|()| src.data_unchanged(f)))
        })?;
        self.file_sets_unchanged()
    }

    /// An error unless every source's local directories and globs still match the files indexed
    /// (a listing of each, made only where a pattern is one). Found by a probe: a file added to a
    /// directory dataset was left out of every new session's sweep until a reload, without a word.
    fn file_sets_unchanged(&self) -> Result<()> {
        for (cfg, src) in self.config.sources.iter().zip(&self.sources) {
            let Some(now) = local_matches_now(&cfg.files)? else { continue };
            let indexed: Vec<&Path> = src.files.iter().map(|f| &**f).filter(|f| !remote::is_remote(f)).collect();
            if now.len() == indexed.len() && now.iter().zip(&indexed).all(|(a, b)| a == b) {
                continue;
            }
            let added = now.iter().find(|f| !indexed.contains(&f.as_path()));
            let what = match added {
                Some(f) => format!("{} is new", f.display()),
                None => "a file it held is gone".to_owned(),
            };
            let pattern =
                cfg.files.iter().find(|p| !remote::is_remote(p)).map_or_else(|| Path::new(""), |p| p.as_path());
            let message = format!(
                "its files changed: the local patterns match {} files now, {} when indexed ({what})",
                now.len(),
                indexed.len()
            );
            return Err(DataError::io(pattern, std::io::Error::other(message)));
        }
        Ok(())
    }

    /// An error unless the bytes chunk `chunk` is read from are still the versions indexed: its
    /// file of the primary source, and every file of the others (a joined source's sequences
    /// come from anywhere in them). A chunk of the parsed cache is those bytes as they were.
    pub(super) fn chunk_inputs_unchanged(&self, chunk: usize) -> Result<()> {
        for (i, src) in self.sources.iter().enumerate() {
            if i == 0 {
                src.data_unchanged(self.chunks.get(chunk).map_or(0, |c| c.file))?;
            } else {
                (0..src.files.len()).try_for_each(|f| src.data_unchanged(f))?;
            }
        }
        Ok(())
    }
}
