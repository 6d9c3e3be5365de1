//! The daemon checkpoint: every session's last acknowledged position, its options and the
//! identity of its data, in `state_dir/checkpoint.json`.
//!
//! Written at start (what was restored), every `checkpoint_interval_secs`, and on SIGTERM/SIGINT
//! after the connected clients had [`shutdown_grace_secs`](crate::config::DaemonConfig) to report
//! their last position — always through [`minibatchd_engine::state_file::write_atomic`] (tmp → fsync → rename →
//! fsync dir), so a reader sees the old file or the new one, never a torn one. Read once at
//! start: its sessions become lingering sessions (resumable by name for `session_linger_secs`),
//! so a client that reconnects with its session name after a restart continues exactly where it
//! was acknowledged; a client that brings its own saved `state()` as `resume=` continues exactly
//! in any case.
//!
//! **Versioning.** The file is `#[serde(tag = "version")]`: `{"version": "1", ...}`. A future
//! format adds a variant and keeps reading the old ones; `tests/fixtures/checkpoint/v1.json` is
//! the golden file of version 1, which every later build must still read. A file that cannot be
//! read (corrupt, or a version from the future) is set aside as `checkpoint.json.unreadable`
//! and the daemon starts without it — so is one that others could have written (a symbolic link,
//! a file of another user, or one writable by group or others, as `UMask=0007` made them before
//! state files were created `0600`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::pipeline::control::session::SavedSession;

/// File name in `state_dir`.
pub const CHECKPOINT_FILE: &str = "checkpoint.json";

/// Version 1 of the checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointV1 {
    /// Unix time of the write, in seconds.
    pub written_unix_secs: u64,
    /// The daemon start that wrote it (16 hex digits).
    pub daemon_id: String,
    /// Why it was written: `start`, `periodic`, `reload` or `shutdown`.
    pub reason: String,
    /// Connected and lingering sessions.
    pub sessions: Vec<SavedSession>,
}

/// A checkpoint of any supported version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "version")]
pub enum Checkpoint {
    /// Version 1.
    #[serde(rename = "1")]
    V1(CheckpointV1),
}

impl Checkpoint {
    /// A checkpoint of the current version.
    #[must_use]
    pub fn new(daemon_id: u64, reason: &str, sessions: Vec<SavedSession>) -> Self {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Self::V1(CheckpointV1 {
            written_unix_secs: now.as_secs(),
            daemon_id: minibatchd_client::protocol::hex64(daemon_id),
            reason: reason.to_owned(),
            sessions,
        })
    }

    /// When it was written (Unix seconds), and whether at a clean stop (`reason` `shutdown`: every
    /// position is the last one its client took).
    #[must_use]
    pub fn written(&self) -> (u64, bool) {
        match self {
            Self::V1(c) => (c.written_unix_secs, c.reason == "shutdown"),
        }
    }

    /// The sessions, whatever the version.
    #[must_use]
    pub fn into_sessions(self) -> Vec<SavedSession> {
        match self {
            Self::V1(c) => c.sessions,
        }
    }
}

/// Reading the checkpoint failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file exists but cannot be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Not a checkpoint this build reads (corrupt or from a newer version).
    #[error("{}: not a checkpoint this build reads: {message}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// serde's explanation.
        message: String,
    },
}

/// The checkpoint's path in `state_dir`.
#[must_use]
pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(CHECKPOINT_FILE)
}

/// Writes `c` to `state_dir` atomically and durably.
///
/// # Errors
/// I/O errors; the previous checkpoint is then untouched.
pub fn write(state_dir: &Path, c: &Checkpoint) -> std::io::Result<()> {
    std::fs::create_dir_all(state_dir)?;
    let mut bytes = serde_json::to_vec_pretty(c).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    minibatchd_engine::state_file::write_atomic(&path(state_dir), &bytes)
}

/// Reads the checkpoint of `state_dir`; `Ok(None)` when there is none.
///
/// # Errors
/// [`CheckpointError`].
pub fn read(state_dir: &Path) -> Result<Option<Checkpoint>, CheckpointError> {
    use std::io::Read as _;
    let p = path(state_dir);
    // Only a file no one else could have written: it says which uid owns which session.
    let mut bytes = Vec::new();
    match minibatchd_engine::state_file::open_trusted(&p).and_then(|(mut f, _)| f.read_to_end(&mut bytes)) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(CheckpointError::Io { path: p, source }),
    }
    serde_json::from_slice(&bytes).map(Some).map_err(|e| CheckpointError::Format { path: p, message: e.to_string() })
}

/// Reads the checkpoint for a start: an unreadable one is logged and renamed to
/// `checkpoint.json.unreadable` (so the next write cannot destroy the evidence).
///
/// Returns the sessions, when the checkpoint was written and whether at a clean stop.
#[must_use]
pub fn restore(state_dir: &Path) -> (Vec<SavedSession>, u64, bool) {
    match read(state_dir) {
        Ok(Some(c)) => {
            let (written, exact) = c.written();
            (c.into_sessions(), written, exact)
        }
        Ok(None) => (Vec::new(), 0, true),
        Err(e) => {
            let p = path(state_dir);
            let aside = state_dir.join(format!("{CHECKPOINT_FILE}.unreadable"));
            tracing::error!(error = %e, moved_to = %aside.display(), "ignoring the daemon checkpoint");
            let _ = std::fs::rename(&p, &aside);
            (Vec::new(), 0, true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minibatchd_client::protocol::{SessionOptions, SessionState};

    fn session() -> SavedSession {
        SavedSession {
            name: "trainer-0".into(),
            options: SessionOptions {
                minibatch_size: Some(64),
                max_sweeps: Some(2),
                seed: Some(3),
                session: Some("trainer-0".into()),
                ..SessionOptions::default()
            },
            state: SessionState {
                version: 1,
                dataset: "train".into(),
                position: 1280,
                minibatches: 20,
                data_identity: "3f0c5e2a9b1d7c44".into(),
                options_hash: "9a1e00c2d4b7f613".into(),
                job: None,
                worker: None,
                mixture: None,
            },
            owner: None,
            given_up_to: None,
        }
    }

    #[test]
    fn round_trips_atomically_with_a_version_tag() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = Checkpoint::new(0xabc, "shutdown", vec![session()]);
        write(dir.path(), &c).expect("write");
        let text = std::fs::read_to_string(path(dir.path())).expect("read");
        assert!(text.contains("\"version\": \"1\""), "{text}");
        assert_eq!(read(dir.path()).expect("read"), Some(c));
        let names: Vec<_> = std::fs::read_dir(dir.path()).expect("ls").map(|e| e.expect("entry").file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from(CHECKPOINT_FILE)], "no temporary left behind");
    }

    #[test]
    fn the_version_1_golden_file_still_reads() {
        let golden = include_str!("../../../tests/fixtures/checkpoint/v1.json");
        let c: Checkpoint = serde_json::from_str(golden).expect("version 1 must stay readable");
        let Checkpoint::V1(v1) = &c;
        assert_eq!(v1.reason, "shutdown");
        assert_eq!(c.into_sessions(), vec![session()]);
    }

    #[test]
    fn unknown_versions_and_garbage_are_set_aside() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(restore(dir.path()).0.is_empty(), "no checkpoint: nothing to restore");
        std::fs::write(path(dir.path()), br#"{"version": "99", "sessions": []}"#).expect("write");
        assert!(matches!(read(dir.path()), Err(CheckpointError::Format { .. })));
        assert!(restore(dir.path()).0.is_empty());
        assert!(dir.path().join("checkpoint.json.unreadable").exists());
        assert!(!path(dir.path()).exists());
        std::fs::write(path(dir.path()), b"\x00garbage").expect("write");
        assert!(restore(dir.path()).0.is_empty());
    }

    /// Issue #15: under `UMask=0007` state files were group-writable; a checkpoint a group member
    /// could have rewritten (to take over sessions) is set aside, not restored.
    #[test]
    fn a_checkpoint_others_could_write_is_set_aside() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), &Checkpoint::new(1, "periodic", vec![session()])).expect("write");
        let mode = std::fs::metadata(path(dir.path())).expect("stat").permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        std::fs::set_permissions(path(dir.path()), std::fs::Permissions::from_mode(0o660)).expect("chmod");
        let e = read(dir.path()).expect_err("group-writable");
        assert!(e.to_string().contains("writable by group or others"), "{e}");
        assert!(restore(dir.path()).0.is_empty());
        assert!(dir.path().join("checkpoint.json.unreadable").exists());
    }
}
