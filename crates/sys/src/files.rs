//! Opening input files without blocking on what is not a file; reading arrays of numbers from a
//! file without zeroing them first; advisory locks.

use std::fs::File;
use std::io;
use std::path::Path;

/// Opens `path` for reading if it is a regular file, without ever blocking in `open`: a FIFO
/// put where a data file was (after the name was checked) would otherwise block the opener until
/// someone writes to it. Opened with `O_NONBLOCK` (no effect on regular files: their reads never
/// return `EAGAIN`), then checked with `fstat` on the opened descriptor; a FIFO, socket or
/// device is an `InvalidInput` error saying so.
///
/// # Errors
/// The `open` or `fstat` error, or `InvalidInput` for anything but a regular file.
pub fn open_regular(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let nonblock = i32::try_from(rustix::fs::OFlags::NONBLOCK.bits()).unwrap_or(0);
    let file = std::fs::OpenOptions::new().read(true).custom_flags(nonblock).open(path)?;
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        return Ok(file);
    }
    let what = if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device"
    } else if kind.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    };
    Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{what}, not a regular file")))
}

/// Starts writing `file`'s dirty pages to its disk (`sync_file_range(SYNC_FILE_RANGE_WRITE)`)
/// without waiting for them to land: for a cache entry written for a later start. Left to the
/// kernel's flusher, such pages go out about 30 s after they were written — and a durable write of
/// any other file then (a checkpoint's `fsync`: on ext4 a journal commit, which first writes the
/// data of every file given blocks in it) waits for all of them: a daemon restarted then waited
/// for its predecessor's entries before it bound its first socket (`docs/benchmarks.md`, "Cache
/// entries put on disk as they are written"). Started here, the writer alone waits, and only
/// when the device's queue is full. A hint: a file system or kernel that cannot do it changes
/// nothing.
pub fn start_writeback(file: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd as _;
        // SAFETY: `file` is an open descriptor, borrowed for the call; the call neither reads nor
        // writes this process's memory, only asks the kernel to queue the file's dirty pages.
        let _ = unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

/// The longest name `memfd_create` takes (`NAME_MAX` less its `memfd:` prefix): a longer one is
/// refused with `EINVAL`.
pub const MEMFD_NAME_MAX: usize = 249;

/// `name` cut to what `memfd_create` takes (at a character's boundary): the name is only what
/// `/proc/PID/fd` shows (found by a probe: a session on a dataset of a 225-character name could
/// not create its ring, refused as `resource_exhausted`).
#[must_use]
pub fn memfd_name(name: &str) -> &str {
    let mut end = name.len().min(MEMFD_NAME_MAX);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// An anonymous file in memory (`memfd_create`), gone once closed: bytes that need a `File` but
/// have no place on disk.
///
/// # Errors
/// The kernel's, as an I/O error.
pub fn anonymous_file(name: &str) -> io::Result<File> {
    let fd = rustix::fs::memfd_create(memfd_name(name), rustix::fs::MemfdFlags::CLOEXEC)?;
    Ok(File::from(fd))
}

/// Takes a shared advisory lock (`flock(LOCK_SH)`) on `file` (a file or a directory opened for
/// reading), waiting while another holds it exclusively; released when the file is closed.
///
/// # Errors
/// The `flock` error.
pub fn lock_shared(file: &File) -> io::Result<()> {
    loop {
        match rustix::fs::flock(file, rustix::fs::FlockOperation::LockShared) {
            Err(rustix::io::Errno::INTR) => {}
            other => return other.map_err(io::Error::from),
        }
    }
}

/// Takes an exclusive advisory lock (`flock(LOCK_EX | LOCK_NB)`) on `file` if nobody holds one:
/// `Ok(false)` when another does. Released when the file is closed.
///
/// # Errors
/// The `flock` error other than "would block".
pub fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    match rustix::fs::flock(file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// Whether a change to the file at `path` after a `stat` of it always gets a change time of its
/// own: Linux's multigrain timestamps (6.13 and later), which only the file systems that opt in
/// have — ext4, XFS, Btrfs and tmpfs. Elsewhere (NFS and other network file systems, FUSE,
/// ZFS, older kernels) two writes within one tick of the clock that stamps them can leave the
/// same times. `false` when unsure.
#[must_use]
pub fn change_times_are_unique(path: &Path) -> bool {
    const EXT4: i64 = 0xEF53;
    const XFS: i64 = 0x5846_5342;
    const BTRFS: i64 = 0x9123_683E;
    const TMPFS: i64 = 0x0102_1994;
    if !kernel_has_multigrain_times() {
        return false;
    }
    rustix::fs::statfs(path).is_ok_and(|s| {
        #[allow(clippy::useless_conversion)] // `f_type`'s width differs between targets
        let kind = i64::from(s.f_type);
        [EXT4, XFS, BTRFS, TMPFS].contains(&kind)
    })
}

/// Whether this kernel has multigrain timestamps (6.13 and later), read once.
fn kernel_has_multigrain_times() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut parts = release.trim().split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (6, 13)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// #15: a file swapped for a FIFO after the dataset's files were listed blocked `open`.
    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("mbd-sys-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let fifo = dir.join("data.ctf");
        let _ = std::fs::remove_file(&fifo);
        rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, rustix::fs::Mode::from_raw_mode(0o600)).expect("mkfifo");
        let e = open_regular(&fifo).expect_err("a FIFO");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("a FIFO"), "{e}");
        let e = open_regular(&dir).expect_err("a directory");
        assert!(e.to_string().contains("a directory"), "{e}");
        let file = dir.join("f");
        std::fs::write(&file, b"x").expect("write");
        let mut s = String::new();
        std::io::Read::read_to_string(&mut open_regular(&file).expect("a file"), &mut s).expect("read");
        assert_eq!(s, "x");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
