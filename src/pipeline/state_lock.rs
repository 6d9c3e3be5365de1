//! One daemon per `state_dir`: a file in it locked (`flock`) while the daemon runs, looked at
//! again before each checkpoint is written.

use std::path::{Path, PathBuf};

use super::PipelineError;

/// File in `state_dir` locked (`flock`) by the daemon that uses the directory; holds its pid.
pub const LOCK_FILE: &str = "daemon.lock";

/// Takes `state_dir` for this process: a second daemon on the same directory would rewrite the
/// first one's checkpoint and caches under it.
pub(crate) fn lock_state_dir(state_dir: &Path) -> Result<std::fs::File, PipelineError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    // Created private (whatever the umask); an existing one must be this user's (its group and
    // other write bits are taken off) before anything is written into it: found by a probe, the
    // lock file was written into another user's directory before that directory was refused.
    minibatchd_engine::state_file::secure_dir(state_dir)
        .map_err(|e| PipelineError::Fatal(format!("cannot use daemon.state_dir {}: {e}", state_dir.display())))?;
    let path = state_dir.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(o_nofollow())
        .open(&path)
        .map_err(|e| PipelineError::Fatal(lock_refusal(&path, &e)))?;
    if let Err(e) = rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        let holder = std::fs::read_to_string(&path).unwrap_or_default();
        return Err(PipelineError::Fatal(format!(
            "another minibatchd (pid {}) uses state_dir {} ({e}); give each daemon its own state_dir",
            holder.trim(),
            state_dir.display()
        )));
    }
    file.set_len(0)
        .and_then(|()| writeln!(file, "{}", std::process::id()))
        .map_err(|e| PipelineError::Fatal(format!("cannot write {} (daemon.state_dir): {e}", path.display())))?;
    Ok(file)
}

/// Why the lock file `path` could not be opened (`e`): a link or a directory in its place said as
/// such (found by a probe: a link gave only "Too many levels of symbolic links").
fn lock_refusal(path: &Path, e: &std::io::Error) -> String {
    let what = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            "; it is a symbolic link, which the daemon never follows there: remove it (the daemon creates the file)"
        }
        Ok(m) if m.is_dir() => "; it is a directory: remove it (the daemon creates the file)",
        _ => "",
    };
    format!("cannot open {}: {e}{what}", path.display())
}

/// `O_NOFOLLOW`: the lock file is never a link planted by someone else.
fn o_nofollow() -> i32 {
    i32::try_from(rustix::fs::OFlags::NOFOLLOW.bits()).unwrap_or(0)
}

/// The lock on `state_dir` that this daemon holds.
#[derive(Debug)]
pub struct StateLock {
    dir: PathBuf,
    file: std::fs::File,
}

impl StateLock {
    /// Takes `state_dir` for this process ([`lock_state_dir`]).
    ///
    /// # Errors
    /// [`PipelineError::Fatal`]: the directory cannot be used, or another daemon holds it.
    pub fn take(state_dir: &Path) -> Result<Self, PipelineError> {
        Ok(Self { dir: state_dir.to_owned(), file: lock_state_dir(state_dir)? })
    }

    /// Whether the lock file in `state_dir` is still the one this daemon holds; if it was
    /// removed or replaced (found by a probe: `state_dir` wiped while the daemon ran let a second
    /// daemon take the directory, whose checkpoints then overwrote this one's, and a resume by
    /// name after a restart began again at minibatch 0, unsaid), it is taken again — or, with
    /// another daemon holding it now, the error says so and the caller writes nothing there.
    ///
    /// # Errors
    /// Another daemon holds the directory's lock, or it cannot be taken again.
    pub fn ensure(&mut self) -> std::io::Result<()> {
        use std::os::unix::fs::MetadataExt as _;
        let held = self.file.metadata()?;
        let path = self.dir.join(LOCK_FILE);
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.dev() == held.dev() && m.ino() == held.ino()) {
            return Ok(());
        }
        let file = lock_state_dir(&self.dir).map_err(|e| std::io::Error::other(e.to_string()))?;
        tracing::warn!(path = %path.display(), "the state_dir's lock file was removed or replaced while this daemon ran: taken again");
        self.file = file;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by a probe: a link at the lock file's place gave only "Too many levels of symbolic
    /// links"; a link or a directory there is now named as such, with what to do.
    #[test]
    fn a_link_or_a_directory_in_the_lock_files_place_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        std::fs::create_dir(&state).expect("state");
        std::fs::write(dir.path().join("target"), "").expect("target");
        std::os::unix::fs::symlink(dir.path().join("target"), state.join(LOCK_FILE)).expect("link");
        let e = lock_state_dir(&state).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("it is a symbolic link") && e.contains("remove it"), "{e}");
        std::fs::remove_file(state.join(LOCK_FILE)).expect("unlink");
        std::fs::create_dir(state.join(LOCK_FILE)).expect("dir");
        let e = lock_state_dir(&state).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("it is a directory"), "{e}");
        std::fs::remove_dir(state.join(LOCK_FILE)).expect("rmdir");
        assert!(lock_state_dir(&state).is_ok(), "a plain lock file is taken");
    }
}
