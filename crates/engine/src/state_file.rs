//! State files: durable, atomic and private.
//!
//! * **Atomic and durable.** [`write_atomic`]: temporary file → fsync → rename → fsync of the
//!   directory, so readers see either the old content or the new, never a torn file, even across
//!   a crash. Used for index caches, the sidecars of decompressed copies and the daemon's
//!   checkpoint and `metrics.addr`.
//! * **Private whatever the umask.** A state file is created `0600` ([`FILE_MODE`]) and the
//!   directories the engine creates (`state_dir`, `state_dir/index`, `state_dir/inflated`) `0700`
//!   ([`DIR_MODE`]): the modes are set explicitly after creation, so the process umask (the unit's
//!   `UMask=0007`, a user's `umask 000`) cannot widen them.
//! * **No planted names.** A file is created under a fresh temporary name with `O_CREAT|O_EXCL`
//!   ([`create_temp`]): an existing name — a symbolic link included, dangling or not — makes the
//!   open fail (POSIX: with `O_CREAT|O_EXCL` a symbolic link is never followed), so nothing is
//!   ever written through a link. The temporary is then renamed onto the final name, which
//!   replaces whatever is there (a link included) without following it.
//! * **Directories.** [`private_subdir`] makes `state_dir/NAME` a real directory (not a symbolic
//!   link) owned by this process's user with mode `0700`: created so, or, when it exists and is
//!   ours, reset to `0700`; one of another user is refused. `state_dir` itself ([`secure_dir`]) is
//!   the administrator's (systemd's `StateDirectoryMode=0750`): created `0700` when missing; an
//!   existing one must be ours, and loses its group and other **write** bits (its read bits are
//!   kept). A directory of another user (`/tmp`, the daemon's directory for someone running `dump`)
//!   is refused, never written into.
//! * **Reading.** [`open_trusted`] opens an existing state file only if it is a regular file, not
//!   a symbolic link, owned by this process's user and not writable by group or others (checked
//!   on the opened file, so it cannot be swapped between the check and the open).

use std::fmt;
use std::fs::{self, File, Metadata, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of every state file.
pub const FILE_MODE: u32 = 0o600;
/// Mode of the directories the engine owns (`state_dir/index`, `state_dir/inflated`, and
/// `state_dir` when the engine creates it).
pub const DIR_MODE: u32 = 0o700;
/// Group and other write permission bits.
const GROUP_OTHER_WRITE: u32 = 0o022;

/// Why a state file or directory is not trusted (wrapped in an [`io::Error`]; see
/// [`is_untrusted`]).
#[derive(Debug)]
struct Untrusted(String);

impl fmt::Display for Untrusted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Untrusted {}

fn untrusted(path: &Path, why: impl fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, Untrusted(format!("{}: {why}", path.display())))
}

/// `name` for a file name that has a hash beside it and `room` more bytes around it (suffixes,
/// a temporary file's decorations): as it is while the whole stays within a file name's 255
/// bytes, else its first 48 characters (an object key may be 1,024 bytes: its cache file could not
/// be written, and was built again on every run).
#[must_use]
pub fn short_name(name: &str, room: usize) -> String {
    if name.len() + room <= 255 {
        name.to_owned()
    } else {
        name.chars().take(48).collect()
    }
}

/// Whether `e` says that a state file or directory exists but is not trusted (wrong owner, mode,
/// type, or a symbolic link), as opposed to an I/O error.
#[must_use]
pub fn is_untrusted(e: &io::Error) -> bool {
    e.get_ref().is_some_and(<dyn std::error::Error + Send + Sync>::is::<Untrusted>)
}

/// The effective uid of this process, from `/proc/self/status` (the engine has no `unsafe` and no
/// libc to call `geteuid`).
///
/// # Errors
/// `/proc/self/status` unreadable or without a `Uid:` line: every ownership check then fails
/// closed.
pub fn effective_uid() -> io::Result<u32> {
    let status = fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .and_then(|uid| uid.parse().ok())
        .ok_or_else(|| io::Error::other("cannot read this process's effective uid from /proc/self/status"))
}

fn check_owner(path: &Path, meta: &Metadata) -> io::Result<()> {
    let me = effective_uid()?;
    if meta.uid() == me {
        Ok(())
    } else {
        Err(untrusted(path, format_args!("owned by uid {}, not by this process's user (uid {me})", meta.uid())))
    }
}

fn chmod(path: &Path, mode: u32) -> io::Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

/// Makes sure `dir` is a directory this process's user alone can write: created (with missing
/// parents) mode `0700` when missing; when it exists — possibly through a symbolic link, which
/// only its creator can have set up — it must be a directory owned by this user, and its group
/// and other write bits are removed (read bits are kept).
///
/// # Errors
/// I/O errors; an [`is_untrusted`] error when `dir` is not a directory or belongs to another
/// user.
pub fn secure_dir(dir: &Path) -> io::Result<()> {
    let meta = match fs::metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)?;
            let m = fs::metadata(dir)?;
            check_owner(dir, &m)?;
            // The umask may have taken bits off 0700.
            chmod(dir, DIR_MODE)?;
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        return Err(untrusted(dir, "not a directory"));
    }
    check_owner(dir, &meta)?;
    let mode = meta.mode() & 0o7777;
    if mode & GROUP_OTHER_WRITE != 0 {
        let tightened = mode & !GROUP_OTHER_WRITE;
        chmod(dir, tightened)?;
        tracing::warn!(dir = %dir.display(), from = format!("{mode:04o}"), to = format!("{tightened:04o}"), "state directory was writable by group or others; removed those bits");
    }
    Ok(())
}

/// `state_dir/name` as a private directory: `state_dir` secured ([`secure_dir`]), then
/// `state_dir/name` created mode `0700`, or — when it exists — required to be a real directory
/// (not a symbolic link) owned by this user, and reset to `0700`.
///
/// # Errors
/// I/O errors; an [`is_untrusted`] error for a symbolic link, a non-directory or a directory of
/// another user.
pub fn private_subdir(state_dir: &Path, name: &str) -> io::Result<PathBuf> {
    secure_dir(state_dir)?;
    let dir = state_dir.join(name);
    let meta = match fs::symlink_metadata(&dir) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            match fs::DirBuilder::new().mode(DIR_MODE).create(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            fs::symlink_metadata(&dir)?
        }
        Err(e) => return Err(e),
    };
    if meta.file_type().is_symlink() {
        return Err(untrusted(&dir, "a symbolic link, not a directory"));
    }
    if !meta.is_dir() {
        return Err(untrusted(&dir, "not a directory"));
    }
    check_owner(&dir, &meta)?;
    if meta.mode() & 0o7777 != DIR_MODE {
        chmod(&dir, DIR_MODE)?;
    }
    Ok(dir)
}

/// Opens the existing state file `path` for reading, only if it can be trusted: a regular file,
/// not a symbolic link, owned by this process's user, not writable by group or others. The
/// checks are made on the opened file (and its identity compared with the name's), so the name
/// cannot be swapped between the check and the open.
///
/// # Errors
/// I/O errors (`NotFound` when there is no such file); an [`is_untrusted`] error otherwise.
pub fn open_trusted(path: &Path) -> io::Result<(File, Metadata)> {
    let link = fs::symlink_metadata(path)?;
    if link.file_type().is_symlink() {
        return Err(untrusted(path, "a symbolic link"));
    }
    if !link.is_file() {
        return Err(untrusted(path, "not a regular file"));
    }
    let file = File::open(path)?;
    let meta = file.metadata()?;
    if (meta.dev(), meta.ino()) != (link.dev(), link.ino()) {
        return Err(untrusted(path, "replaced while it was opened"));
    }
    check_owner(path, &meta)?;
    if meta.mode() & GROUP_OTHER_WRITE != 0 {
        return Err(untrusted(path, format_args!("writable by group or others (mode {:04o})", meta.mode() & 0o7777)));
    }
    Ok((file, meta))
}

/// Creates a new, empty file mode `0600` in `dir`, named `.{base}.{writer}.{n}.tmp` for the first
/// `n` whose name does not exist, where `writer` is this process: its id and its start time
/// (`PID-TICKS`, [`writer_alive`]). `O_CREAT|O_EXCL`: an existing name, a symbolic link included,
/// is never opened, so nothing is written through a planted link.
///
/// # Errors
/// I/O errors, or no free name after many tries.
pub fn create_temp(dir: &Path, base: &str) -> io::Result<(PathBuf, File)> {
    let writer = temp_writer();
    for n in 0..1000u32 {
        let path = dir.join(format!(".{base}.{writer}.{n}.tmp"));
        match OpenOptions::new().write(true).create_new(true).mode(FILE_MODE).open(&path) {
            Ok(file) => {
                // The umask may have taken bits off 0600; fchmod on the open file.
                file.set_permissions(fs::Permissions::from_mode(FILE_MODE))?;
                return Ok((path, file));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("{}: no free temporary name for {base}", dir.display())))
}

/// Whether `name` is a temporary file's name as [`create_temp`] makes them
/// (`.{base}.{pid}-{ticks}.{n}.tmp`, or an older build's `.{base}.{pid}.{n}.tmp`): a cache's
/// directory removes no other file, whatever its name (found by a probe: `.x.tmp` and other
/// files of a directory shared by mistake were removed).
#[must_use]
pub fn is_temp_name(name: &str) -> bool {
    let Some(inner) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) else { return false };
    let mut parts = inner.rsplitn(3, '.');
    let (Some(n), Some(writer), Some(base)) = (parts.next(), parts.next(), parts.next()) else { return false };
    let writer_ok = match writer.split_once('-') {
        Some((pid, ticks)) => is_number(pid) && is_number(ticks),
        None => is_number(writer),
    };
    !base.is_empty() && is_number(n) && writer_ok
}

/// Whether `s` is a decimal number as the caches write them in names (digits, at least one).
pub(crate) fn is_number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `s` is a 64-bit hash as the caches write them in names (`{:016x}`).
pub(crate) fn is_hex64(s: &str) -> bool {
    s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether the process that named temporary file `name` ([`create_temp`]:
/// `.{base}.{pid}-{ticks}.{n}.tmp`) still runs: a temporary file whose writer is gone was left by
/// a crash. The writer is its process id and start time, so a later process that got the same id
/// — a daemon restarted in a container gets its crashed predecessor's — is not taken for it
/// (found by a probe: such temporary files were kept for ever). A name of an older build
/// (`.{base}.{pid}.{n}.tmp`) is alive while a process of that id runs.
#[must_use]
pub fn writer_alive(name: &str) -> bool {
    let mut parts = name.trim_end_matches(".tmp").rsplit('.');
    let _n = parts.next();
    let Some(writer) = parts.next() else { return false };
    match writer.split_once('-') {
        Some((pid, ticks)) => match (pid.parse::<u32>(), ticks.parse::<u64>()) {
            (Ok(pid), Ok(ticks)) => started_at(pid) == Some(ticks),
            _ => false,
        },
        None => writer.parse::<u32>().is_ok_and(|pid| Path::new(&format!("/proc/{pid}")).exists()),
    }
}

/// This process as [`create_temp`] names it in its files: `PID-TICKS` (its id and start time), or
/// `PID` where `/proc` cannot tell the start.
#[must_use]
pub fn temp_writer() -> String {
    let pid = std::process::id();
    started_at(pid).map_or_else(|| pid.to_string(), |ticks| format!("{pid}-{ticks}"))
}

/// When process `pid` started, in clock ticks after boot (`/proc/PID/stat`'s 22nd field), if it
/// runs.
fn started_at(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces and parentheses itself.
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Fields 3 onwards: the 22nd is the 20th of them.
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// Removes from `dir` the temporary files of `base` ([`create_temp`]) that a crash between
/// their creation and their rename left: those whose writer is gone ([`writer_alive`]), and
/// those an older build named with this process's own id (a daemon restarted in a container
/// often gets the id its crashed predecessor had). For a start, before this process writes any;
/// a link is removed, never followed. Returns how many were removed.
#[allow(clippy::must_use_candidate)] // the count is for a log line; removing is the point
pub fn remove_dead_temps(dir: &Path, base: &str) -> usize {
    let Ok(entries) = fs::read_dir(dir) else { return 0 };
    let prefix = format!(".{base}.");
    let own = format!(".{base}.{}.", std::process::id());
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let ours = name.starts_with(&prefix) && Path::new(name).extension().is_some_and(|e| e == "tmp");
        if ours
            && (name.starts_with(&own) || !writer_alive(name))
            && entry.file_type().is_ok_and(|t| !t.is_dir())
            && fs::remove_file(entry.path()).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

/// Fsyncs the directory `dir` (makes a rename in it durable). Errors are ignored: some file
/// systems cannot fsync a directory.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Replaces `path` with `bytes` atomically and durably, as a private file (mode `0600`). The
/// directory of `path` is secured first ([`secure_dir`]): created `0700` when missing, refused
/// when it belongs to another user, its group and other write bits removed.
///
/// # Errors
/// Any I/O error, or an untrusted directory; on error the previous content of `path` is
/// untouched.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_with(path, &mut |f| f.write_all(bytes))
}

/// [`write_atomic`] of what `write` writes, streamed (nothing held whole in memory).
///
/// # Errors
/// As [`write_atomic`], and `write`'s.
pub fn write_atomic_with(path: &Path, write: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>) -> io::Result<()> {
    write_replacing(path, write, true)
}

/// [`write_atomic_with`] without the fsyncs: atomic for readers and against a crash of the
/// process (a reader sees the old file or the whole new one), not against a crash of the
/// machine. For caches that are dropped after a reboot (`remote::ObjectCache`). The file's
/// writeback is started before the rename ([`minibatchd_sys::files::start_writeback`]), so that
/// a later durable write of another file does not wait for it.
///
/// # Errors
/// As [`write_atomic`].
pub fn write_replacing_unsynced(
    path: &Path,
    write: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    write_replacing(path, write, false)
}

fn write_replacing(path: &Path, write: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>, sync: bool) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    secure_dir(&dir)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let (tmp, mut f) = create_temp(&dir, &name)?;
    let result = (|| {
        write(&mut f)?;
        if sync {
            f.sync_all()?;
        } else {
            minibatchd_sys::files::start_writeback(&f);
        }
        fs::rename(&tmp, path)?;
        if sync {
            File::open(&dir)?.sync_all()?;
        }
        Ok(())
    })();
    drop(f);
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// What identifies one version of a cache entry's file (the parsed cache's, the object cache's): a write in place changes the modification
/// and status-change times, a replacement the inode. The status-change time cannot be set by a
/// user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileVersion {
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    pub(crate) len: u64,
    pub(crate) mtime: (i64, i64),
    pub(crate) ctime: (i64, i64),
}

impl FileVersion {
    pub(crate) fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// Whether the file was last changed [`STABLE_SECS`] whole seconds before `now` (Unix
    /// seconds, taken before the read that checks it; more than a second before it, then): a
    /// write within one tick of the kernel's coarse clock after that change could leave both
    /// times as they were ("racily clean", as git calls it), so a version that young is checked
    /// again at its next read.
    pub(crate) fn settled_by(&self, now: i64) -> bool {
        self.mtime.0.max(self.ctime.0).saturating_add(STABLE_SECS) <= now
    }
}

/// How long an entry's file must have stayed unchanged for its checked version to be trusted
/// without its checksum ([`FileVersion::settled_by`]).
const STABLE_SECS: i64 = 2;

/// Unix seconds now ([`FileVersion::settled_by`]).
pub(crate) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).expect("stat").mode() & 0o7777
    }

    #[test]
    fn a_temporary_file_is_alive_only_while_the_process_that_named_it_runs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, _file) = create_temp(dir.path(), "x").expect("temp");
        let name = path.file_name().expect("a name").to_string_lossy().into_owned();
        assert!(writer_alive(&name), "{name}: this process writes it");
        let pid = std::process::id();
        let ticks = started_at(pid).expect("this process runs");
        assert!(name.starts_with(&format!(".x.{pid}-{ticks}.")), "{name}");
        // This process's id with another start: a crashed predecessor of the same id (a container's
        // daemon restarted), whose file must go.
        assert!(!writer_alive(&format!(".x.{pid}-{}.0.tmp", ticks + 1)));
        // Names of an older build: alive while a process of that id runs.
        assert!(writer_alive(&format!(".x.{pid}.0.tmp")));
        assert!(!writer_alive(".x.4294967.0.tmp"));
        assert!(!writer_alive(".x.junk-1.0.tmp") && !writer_alive(".x.tmp"));
        // Which names are temporary files at all: a cache removes no other file.
        assert!(is_temp_name(&name) && is_temp_name(".a.ctf.0-9.00ff.chunk.12.3.tmp") && is_temp_name(".x.7.0.tmp"));
        for other in
            [".x.tmp", "x.1.0.tmp", ".x.1.tmp", "..1.0.tmp", ".x.a-1.0.tmp", ".x.1-.0.tmp", ".x.1.0.tmp~", ".tmp"]
        {
            assert!(!is_temp_name(other), "{other}");
        }
    }

    #[test]
    fn replaces_content_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("state.json");
        write_atomic(&p, b"one").expect("first");
        write_atomic(&p, b"two").expect("second");
        assert_eq!(fs::read(&p).expect("read"), b"two");
        let names: Vec<_> = fs::read_dir(dir.path()).expect("ls").map(|e| e.expect("entry").file_name()).collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn state_files_are_private_whatever_the_umask() {
        // The umask itself is exercised with the real binary (`tests/hostile_files.rs`); here,
        // what an earlier umask left behind: a group- and world-writable state directory and
        // subdirectory, and a group-writable file under the final name.
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        fs::create_dir(&state).expect("mkdir");
        chmod(&state, 0o777).expect("chmod");
        fs::create_dir(state.join("index")).expect("mkdir");
        chmod(&state.join("index"), 0o775).expect("chmod");
        let old = state.join("checkpoint.json");
        fs::write(&old, b"old").expect("write");
        chmod(&old, 0o666).expect("chmod");

        write_atomic(&old, b"new").expect("write");
        assert_eq!(mode(&old), 0o600);
        assert_eq!(mode(&state), 0o755, "write bits of group and others removed, read bits kept");
        let index = private_subdir(&state, "index").expect("index dir");
        assert_eq!(mode(&index), 0o700);
        let fresh = private_subdir(&dir.path().join("new-state"), "inflated").expect("created");
        assert_eq!((mode(fresh.parent().expect("parent")), mode(&fresh)), (0o700, 0o700));
        write_atomic(&fresh.join("x"), b"x").expect("write");
        assert_eq!(mode(&fresh.join("x")), 0o600);
        assert!(open_trusted(&fresh.join("x")).is_ok());
    }

    #[test]
    fn a_planted_symlink_is_never_followed_when_writing_state() {
        let dir = tempfile::tempdir().expect("tempdir");
        let victim = dir.path().join("victim");
        fs::write(&victim, b"precious").expect("write");
        let victim_mode = mode(&victim);
        let state = dir.path().join("state");
        fs::create_dir(&state).expect("mkdir");
        let target = state.join("checkpoint.json");
        // Links at the final name and at every temporary name this process could use (this
        // module's and the names the earlier code used).
        std::os::unix::fs::symlink(&victim, &target).expect("symlink");
        let pid = std::process::id();
        for n in 0..4 {
            std::os::unix::fs::symlink(&victim, state.join(format!(".checkpoint.json.{pid}.{n}.tmp"))).expect("ln");
            // The names this build writes (found by a review: the links above no longer met it).
            std::os::unix::fs::symlink(&victim, state.join(format!(".checkpoint.json.{}.{n}.tmp", temp_writer())))
                .expect("ln");
        }
        std::os::unix::fs::symlink(&victim, state.join(format!(".checkpoint.json.{pid}.tmp"))).expect("ln");

        write_atomic(&target, b"state").expect("write");
        assert_eq!(fs::read(&victim).expect("read"), b"precious");
        assert!(fs::symlink_metadata(&target).expect("stat").is_file());
        assert_eq!(fs::read(&target).expect("read"), b"state");
        assert_eq!(mode(&victim), victim_mode);

        // A linked or foreign subdirectory is refused, not written through.
        let elsewhere = dir.path().join("elsewhere");
        fs::create_dir(&elsewhere).expect("mkdir");
        std::os::unix::fs::symlink(&elsewhere, state.join("inflated")).expect("symlink");
        let e = private_subdir(&state, "inflated").expect_err("a link");
        assert!(is_untrusted(&e) && e.to_string().contains("symbolic link"), "{e}");
        // Reading: a link to a file of ours is not trusted either.
        let e = open_trusted(&state.join(format!(".checkpoint.json.{pid}.tmp"))).expect_err("a link");
        assert!(is_untrusted(&e), "{e}");
    }

    #[test]
    fn a_group_writable_file_is_not_trusted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f");
        write_atomic(&p, b"x").expect("write");
        chmod(&p, 0o660).expect("chmod");
        let e = open_trusted(&p).expect_err("group-writable");
        assert!(is_untrusted(&e) && e.to_string().contains("0660"), "{e}");
        assert_eq!(open_trusted(&dir.path().join("absent")).expect_err("absent").kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn the_effective_uid_is_the_owner_of_what_this_process_creates() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, f) = create_temp(dir.path(), "probe").expect("create");
        assert_eq!(effective_uid().expect("uid"), f.metadata().expect("stat").uid());
    }
}
