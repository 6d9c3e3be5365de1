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
//!
//! **Checksum.** A checkpoint carries `checksum`, the CRC-32 of its content (its compact JSON
//! without the checksum): a file damaged on disk — one flipped digit of a position would resume
//! a session past samples it never took, as exact — is set aside like any unreadable one. A file
//! without it (written before it was kept, as the golden file) is read as before.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::pipeline::control::session::{ForgottenNote, SavedSession};

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
    /// Lingering sessions let go, the most recent first: an `open` by one of their names after a
    /// restart is told it starts afresh. Absent when there are none (and in checkpoints written
    /// before it was kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forgotten: Vec<ForgottenNote>,
    /// `crc32:` and 8 hex digits: [`content_checksum`] of the rest. Absent in checkpoints
    /// written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
}

/// The checksum of `c`'s content: CRC-32 of its compact JSON with no checksum, as `crc32:` and 8
/// hex digits. The JSON of what a checkpoint holds is the same whenever it is written (structs
/// and ordered maps; numbers written as read back), so the reader recomputes it from what it
/// parsed.
///
/// The checksum is taken out for the hash and put back: no copy of the sessions (a checkpoint is
/// written at every `open`).
fn content_checksum(c: &mut Checkpoint) -> String {
    let Checkpoint::V1(v1) = c;
    let checksum = v1.checksum.take();
    let bytes = serde_json::to_vec(&*c).unwrap_or_default();
    let Checkpoint::V1(v1) = c;
    v1.checksum = checksum;
    format!("crc32:{:08x}", crc32fast::hash(&bytes))
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
    pub fn new(daemon_id: u64, reason: &str, sessions: Vec<SavedSession>, forgotten: Vec<ForgottenNote>) -> Self {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let mut c = Self::V1(CheckpointV1 {
            written_unix_secs: now.as_secs(),
            daemon_id: minibatchd_client::protocol::hex64(daemon_id),
            reason: reason.to_owned(),
            sessions,
            forgotten,
            checksum: None,
        });
        let checksum = content_checksum(&mut c);
        let Self::V1(v1) = &mut c;
        v1.checksum = Some(checksum);
        c
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
        self.into_parts().0
    }

    /// The sessions and the notes of sessions let go.
    #[must_use]
    pub fn into_parts(self) -> (Vec<SavedSession>, Vec<ForgottenNote>) {
        match self {
            Self::V1(c) => (c.sessions, c.forgotten),
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

/// What one session's record in a checkpoint may take at most: its `open` options (a message
/// of at most 64 KiB, several times that once pretty-printed: a long `weight_schedule`'s numbers
/// one to a line) and its state.
const MAX_SESSION_RECORD: u64 = 1 << 20;

/// The largest checkpoint a daemon with `memory_limit` and `max_sessions` reads: a quarter of the
/// limit (at least 4 MiB), or what its sessions — connected and lingering, twice `max_sessions`
/// — can have written, whichever is more (found by a probe: a checkpoint padded to 300 MiB was
/// read whole, past a 256 MiB limit, before anything ran; a review: a cap of the limit alone
/// could set aside one the daemon wrote itself, with many sessions under a small limit).
#[must_use]
pub fn max_bytes(memory_limit: u64, max_sessions: usize) -> u64 {
    let sessions = (max_sessions as u64).saturating_mul(2).saturating_mul(MAX_SESSION_RECORD);
    (memory_limit / 4).max(4 << 20).max(sessions.saturating_add(1 << 20))
}

/// Reads the checkpoint of `state_dir`, of at most `max_bytes` ([`max_bytes`]); `Ok(None)` when
/// there is none.
///
/// # Errors
/// [`CheckpointError`]; a larger file is a [`CheckpointError::Format`].
pub fn read(state_dir: &Path, max_bytes: u64) -> Result<Option<Checkpoint>, CheckpointError> {
    use std::io::Read as _;
    let p = path(state_dir);
    // Only a file no one else could have written: it says which uid owns which session.
    let mut bytes = Vec::new();
    let read = minibatchd_engine::state_file::open_trusted(&p)
        .and_then(|(f, _)| f.take(max_bytes.saturating_add(1)).read_to_end(&mut bytes));
    match read {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(CheckpointError::Io { path: p, source }),
    }
    if bytes.len() as u64 > max_bytes {
        let message = format!(
            "it is larger than {max_bytes} bytes, the most this daemon reads (a quarter of memory_limit_bytes, or \
             what twice max_sessions sessions can write, whichever is more): not a checkpoint such a daemon wrote"
        );
        return Err(CheckpointError::Format { path: p, message });
    }
    let mut c: Checkpoint = serde_json::from_slice(&bytes)
        .map_err(|e| CheckpointError::Format { path: p.clone(), message: e.to_string() })?;
    let Checkpoint::V1(v1) = &c;
    if let Some(saved) = v1.checksum.clone() {
        let now = content_checksum(&mut c);
        if saved != now {
            let message = format!("its checksum is {saved}, its content's {now}: damaged since it was written");
            return Err(CheckpointError::Format { path: p, message });
        }
    }
    Ok(Some(c))
}

/// What a start found in the checkpoint.
#[derive(Debug, Default)]
pub struct Restored {
    /// Its sessions.
    pub sessions: Vec<SavedSession>,
    /// Its notes of sessions let go.
    pub forgotten: Vec<ForgottenNote>,
    /// When it was written (Unix seconds).
    pub written: u64,
    /// Written at a clean stop.
    pub clean: bool,
    /// A checkpoint was there but could not be read: set aside at this path. Its sessions are
    /// lost, so an `open` by a name that may have been among them is told it starts afresh.
    pub set_aside: Option<PathBuf>,
}

/// Reads the checkpoint for a start: an unreadable one is logged and renamed to
/// `checkpoint.json.unreadable` (so the next write cannot destroy the evidence).
#[must_use]
pub fn restore(state_dir: &Path, max_bytes: u64) -> Restored {
    // Found by a probe: every kill -9 during a write left its temporary file, for ever.
    let removed = minibatchd_engine::state_file::remove_dead_temps(state_dir, CHECKPOINT_FILE);
    if removed > 0 {
        tracing::info!(removed, "removed the temporary checkpoint files of crashed daemons");
    }
    match read(state_dir, max_bytes) {
        Ok(Some(c)) => {
            let (written, clean) = c.written();
            let Checkpoint::V1(v1) = &c;
            // Without its checksum, nothing says it is the file the daemon wrote: a build before
            // checksums wrote it, or someone edited it and took the checksum out (found by a
            // probe: an edited position then resumed with `exact: true`). Its resumes are not
            // labelled exact.
            let clean = clean && v1.checksum.is_some();
            if v1.checksum.is_none() {
                tracing::warn!(path = %path(state_dir).display(), "the checkpoint has no checksum (an older build's, or edited): resumes by name from it are not exact");
            }
            let (sessions, forgotten) = c.into_parts();
            Restored { sessions, forgotten, written, clean, set_aside: None }
        }
        Ok(None) => Restored { clean: true, ..Restored::default() },
        Err(e) => {
            let p = path(state_dir);
            let aside = state_dir.join(format!("{CHECKPOINT_FILE}.unreadable"));
            tracing::error!(error = %e, moved_to = %aside.display(), "ignoring the daemon checkpoint: its sessions cannot be resumed by name (a named open that may have been one of them is told so)");
            let _ = std::fs::rename(&p, &aside);
            Restored { clean: true, set_aside: Some(aside), ..Restored::default() }
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
                equal_steps_minibatch: None,
                decode_digest: None,
            },
            owner: None,
            given_up_to: None,
            generated: false,
        }
    }

    #[test]
    fn round_trips_atomically_with_a_version_tag() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = Checkpoint::new(0xabc, "shutdown", vec![session()], Vec::new());
        write(dir.path(), &c).expect("write");
        let text = std::fs::read_to_string(path(dir.path())).expect("read");
        assert!(text.contains("\"version\": \"1\""), "{text}");
        assert_eq!(read(dir.path(), max_bytes(8 << 30, 1)).expect("read"), Some(c));
        let names: Vec<_> = std::fs::read_dir(dir.path()).expect("ls").map(|e| e.expect("entry").file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from(CHECKPOINT_FILE)], "no temporary left behind");
    }

    #[test]
    fn a_start_removes_the_temporary_files_crashed_writers_left() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path();
        let dead = format!(".{CHECKPOINT_FILE}.4294967.0.tmp");
        // A crashed daemon that had this process's id (a container's daemon gets the same one).
        let own = format!(".{CHECKPOINT_FILE}.{}.3.tmp", std::process::id());
        // A live writer's, and another file's: left alone.
        let live = format!(".{CHECKPOINT_FILE}.1.0.tmp");
        let other = ".index.4294967.0.tmp";
        for name in [&dead, &own, &live, other] {
            std::fs::write(p.join(name), b"partial").expect("write");
        }
        write(p, &Checkpoint::new(0xabc, "shutdown", vec![session()], Vec::new())).expect("write");
        assert_eq!(restore(p, max_bytes(8 << 30, 1)).sessions, vec![session()]);
        for (name, kept) in [(dead.as_str(), false), (own.as_str(), false), (live.as_str(), true), (other, true)] {
            assert_eq!(p.join(name).exists(), kept, "{name}");
        }
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
        assert!(restore(dir.path(), max_bytes(8 << 30, 1)).sessions.is_empty(), "no checkpoint: nothing to restore");
        assert_eq!(restore(dir.path(), max_bytes(8 << 30, 1)).set_aside, None);
        std::fs::write(path(dir.path()), br#"{"version": "99", "sessions": []}"#).expect("write");
        assert!(matches!(read(dir.path(), max_bytes(8 << 30, 1)), Err(CheckpointError::Format { .. })));
        let r = restore(dir.path(), max_bytes(8 << 30, 1));
        assert!(r.sessions.is_empty());
        assert_eq!(r.set_aside, Some(dir.path().join("checkpoint.json.unreadable")));
        assert!(dir.path().join("checkpoint.json.unreadable").exists());
        assert!(!path(dir.path()).exists());
        std::fs::write(path(dir.path()), b"\x00garbage").expect("write");
        assert!(restore(dir.path(), max_bytes(8 << 30, 1)).sessions.is_empty());
    }

    /// Found by a probe: a checkpoint padded to 300 MiB was read whole before anything ran, past
    /// the memory limit. One larger than a quarter of the limit is set aside unread.
    #[test]
    fn a_checkpoint_larger_than_the_limit_allows_is_set_aside() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), &Checkpoint::new(1, "shutdown", vec![session()], Vec::new())).expect("write");
        let mut text = std::fs::read(path(dir.path())).expect("read");
        let size = text.len();
        assert_eq!(max_bytes(16 << 20, 1), 4 << 20, "at least 4 MiB");
        assert_eq!(max_bytes(8 << 30, 1), 2 << 30);
        // Whatever the limit, what the sessions can have written is read.
        assert_eq!(max_bytes(16 << 20, 256), 513 << 20);
        assert!(read(dir.path(), size as u64).expect("exactly the bound").is_some());
        let e = read(dir.path(), size as u64 - 1).expect_err("one byte over");
        assert!(e.to_string().contains("larger than"), "{e}");
        // Padded with whitespace past the bound: the JSON is valid, its size is not.
        let end = text.iter().rposition(|&b| b == b'}').expect("an object");
        text.splice(end..end, std::iter::repeat_n(b' ', 5 << 20));
        std::fs::write(path(dir.path()), &text).expect("write");
        assert!(read(dir.path(), max_bytes(8 << 30, 1)).expect("under a large limit").is_some());
        let r = restore(dir.path(), max_bytes(16 << 20, 1));
        assert!(r.sessions.is_empty());
        assert_eq!(r.set_aside, Some(dir.path().join("checkpoint.json.unreadable")));
    }

    /// Issue #15: under `UMask=0007` state files were group-writable; a checkpoint a group member
    /// could have rewritten (to take over sessions) is set aside, not restored.
    #[test]
    fn a_checkpoint_others_could_write_is_set_aside() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), &Checkpoint::new(1, "periodic", vec![session()], Vec::new())).expect("write");
        let mode = std::fs::metadata(path(dir.path())).expect("stat").permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        std::fs::set_permissions(path(dir.path()), std::fs::Permissions::from_mode(0o660)).expect("chmod");
        let e = read(dir.path(), max_bytes(8 << 30, 1)).expect_err("group-writable");
        assert!(e.to_string().contains("writable by group or others"), "{e}");
        assert!(restore(dir.path(), max_bytes(8 << 30, 1)).sessions.is_empty());
        assert!(dir.path().join("checkpoint.json.unreadable").exists());
    }

    /// Found by a hostile probe: one flipped digit of a position (60 → 61) resumed a session a
    /// sample past where its trainer was, as exact. Every byte of content is now checked.
    #[test]
    fn a_checkpoint_damaged_on_disk_is_set_aside() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), &Checkpoint::new(1, "shutdown", vec![session()], Vec::new())).expect("write");
        let good = std::fs::read(path(dir.path())).expect("read");
        assert!(String::from_utf8_lossy(&good).contains("\"checksum\": \"crc32:"));
        assert_eq!(restore(dir.path(), max_bytes(8 << 30, 1)).sessions, vec![session()]);
        // Every digit of the file, changed: each change is refused.
        let digits: Vec<usize> = (0..good.len()).filter(|&i| good[i].is_ascii_digit()).collect();
        assert!(digits.len() > 20);
        for i in digits {
            let mut bad = good.clone();
            bad[i] = if bad[i] == b'9' { b'8' } else { bad[i] + 1 };
            std::fs::write(path(dir.path()), &bad).expect("write");
            let r = restore(dir.path(), max_bytes(8 << 30, 1));
            assert!(r.sessions.is_empty() && r.set_aside.is_some(), "digit at byte {i} changed: {r:?}");
        }
        // Whitespace is not content: reformatted, the same checkpoint.
        let compact: serde_json::Value = serde_json::from_slice(&good).expect("json");
        std::fs::write(path(dir.path()), serde_json::to_vec(&compact).expect("json")).expect("write");
        assert_eq!(restore(dir.path(), max_bytes(8 << 30, 1)).sessions, vec![session()]);
    }
}
