//! Read leases that guard file mappings ([`crate::column::FileMapping`]) against other
//! processes: a file truncated under a mapping makes reading its lost pages fault (`SIGBUS`,
//! which kills the whole daemon), and bytes written into it in place change the values read. A
//! mapping is therefore only made of a file this process holds a read lease on
//! (`fcntl(F_SETLEASE, F_RDLCK)`):
//!
//! * the lease is granted only while nobody has the file open for writing (nor mapped writable),
//!   so nothing can be changing it when it is mapped and checked;
//! * from then on, any other process that opens it for writing or truncates it (`open(O_WRONLY |
//!   O_RDWR | O_TRUNC)`, `truncate(2)`; also root, also this user) is **blocked by the kernel**
//!   until the lease is released (or `/proc/sys/fs/lease-break-time`, 45 s by default, passes),
//!   and this process is sent `SIGIO`;
//! * on that signal a thread of this module (`mbd-leases`) copies each broken lease's mapping
//!   into anonymous memory of the process's own and moves that over the mapping in one step
//!   (`mremap(MREMAP_FIXED)`: the same addresses, the same bytes, no longer the file's), then
//!   releases the lease. Only then can the writer go on, and nothing it does reaches the mapping.
//!
//! Readers of the mapping never notice: before and after the move they read the same bytes at the
//! same addresses. The cost is nothing while no one writes (one `fcntl` per mapping, and the file
//! descriptor held while the mapping lives) and one copy of the mapping when someone does.
//!
//! Where a lease cannot be taken — a file system without leases (NFS), `fs.leases-enable = 0`, a
//! file open for writing elsewhere, another `SIGIO` handler in the process, a quarter of the
//! process's descriptors already held by leases — [`take`] fails and the caller reads the file
//! into memory instead of mapping it. The thread also looks at every lease once a second without
//! a signal, so that a break whose signal went astray is found long before the kernel revokes
//! the lease (45 s).
//!
//! Process-wide state, because a signal handler needs it: the write end of a pipe the handler
//! writes a byte into (async-signal-safe: `write(2)` only, `errno` restored), and the registry of
//! guarded mappings the thread scans. Both are set up once, at the first lease.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// A mapping the lease thread can watch: whether its lease is being broken, and how to move its
/// pages into the process's memory ([`crate::column::FileMapping`] is the one).
pub(crate) trait Guarded: Send + Sync {
    /// Whether another process is breaking the mapping's lease.
    fn lease_broken(&self) -> bool;
    /// Moves the mapping's pages into the process's memory and releases its lease.
    fn detach(&self) -> std::io::Result<()>;
    /// The mapping's length in bytes.
    fn len(&self) -> usize;
}

// Process state, deliberately: a lease break arrives as `SIGIO`, a signal of the whole process
// with one handler, which can reach nothing but statics; the mappings it may concern are any the
// process made, whoever holds them. So the handler's pipe, the guarded mappings and the counts
// live here, once per process. Elsewhere the crates pass state rather than keep it in statics;
// this state cannot be passed.

/// The write end of the wake-up pipe, for the signal handler (-1 until set up).
static WAKE: AtomicI32 = AtomicI32::new(-1);

/// Whether the handler and the thread are in place (`Err` with why not).
static SETUP: OnceLock<Result<(), String>> = OnceLock::new();

/// The guarded mappings, for the thread to find the broken ones.
static GUARDED: Mutex<Vec<Weak<dyn Guarded>>> = Mutex::new(Vec::new());

/// Mappings moved into the process's memory because another process opened their file for
/// writing or truncated it.
static REVOKED: AtomicU64 = AtomicU64::new(0);

/// Leases held now: each keeps its file's descriptor open for as long as its mapping lives.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// How often the thread looks at every lease even without a signal: a break whose one `SIGIO`
/// went astray (another handler installed later, a signal before a mapping was watched) is still
/// found long before the kernel revokes the lease (`/proc/sys/fs/lease-break-time`, 45 s).
const RESCAN_MS: i32 = 1000;

/// The most leases held at once: a quarter of the descriptors the process may open, so that
/// mapped entries never take those the sockets, rings and data files need (more entries are read
/// into memory instead).
fn max_held() -> usize {
    static MAX: OnceLock<usize> = OnceLock::new();
    *MAX.get_or_init(|| {
        rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .map_or(usize::MAX, |n| usize::try_from(n / 4).unwrap_or(usize::MAX))
    })
}

/// How many guarded mappings were moved into the process's own memory since it started, because
/// another process opened their file for writing or truncated it.
#[must_use]
pub fn revoked() -> u64 {
    REVOKED.load(Ordering::Relaxed)
}

extern "C" fn on_sigio(_: libc::c_int) {
    // SAFETY: only async-signal-safe calls: `write` to a non-blocking pipe (a full pipe already
    // holds a wake-up: the result is ignored), and `errno` saved and restored around it so the
    // interrupted code sees its own.
    unsafe {
        let errno = *libc::__errno_location();
        let fd = WAKE.load(Ordering::Relaxed);
        if fd >= 0 {
            let byte = 1u8;
            let _ = libc::write(fd, std::ptr::from_ref(&byte).cast(), 1);
        }
        *libc::__errno_location() = errno;
    }
}

/// Installs the `SIGIO` handler (only if nobody else has one) and starts the thread, once.
fn set_up() -> Result<(), String> {
    SETUP
        .get_or_init(|| {
            let (read, write) =
                rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK)
                    .map_err(|e| format!("cannot create the lease pipe: {e}"))?;
            // The reader blocks; only the handler's end must never block.
            rustix::fs::fcntl_setfl(&read, rustix::fs::OFlags::empty()).map_err(|e| format!("lease pipe: {e}"))?;
            // SAFETY: `sigaction` with a null new action only reads the current one into `old`, a
            // zeroed `sigaction` (a valid bit pattern for the C struct).
            let current = unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(libc::SIGIO, std::ptr::null(), &raw mut old) != 0 {
                    return Err(format!("cannot read the SIGIO disposition: {}", io::Error::last_os_error()));
                }
                old.sa_sigaction
            };
            if current != libc::SIG_DFL && current != libc::SIG_IGN {
                return Err("another SIGIO handler is installed in this process".to_owned());
            }
            WAKE.store(write.as_raw_fd(), Ordering::Relaxed);
            std::mem::forget(write); // the handler's, for the life of the process
            std::thread::Builder::new()
                .name("mbd-leases".into())
                .spawn(move || watch(&read))
                .map_err(|e| format!("cannot start the lease thread: {e}"))?;
            // SAFETY: installs `on_sigio`, which is async-signal-safe (above), with an empty mask and
            // SA_RESTART so that no other thread's system call fails with EINTR because of it.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_sigio as extern "C" fn(libc::c_int) as libc::sighandler_t;
                action.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&raw mut action.sa_mask);
                if libc::sigaction(libc::SIGIO, &raw const action, std::ptr::null_mut()) != 0 {
                    return Err(format!("cannot install the SIGIO handler: {}", io::Error::last_os_error()));
                }
            }
            Ok(())
        })
        .clone()
}

/// Takes a read lease on `file` (opened read-only) for this process.
///
/// # Errors
/// `Unsupported` when leases cannot guard mappings in this process (no handler could be
/// installed); the `fcntl` error otherwise — `EAGAIN` while the file is open for writing
/// somewhere, `EINVAL` on a file system without leases, `EACCES` for a file of another user.
pub(crate) fn take(file: &File) -> io::Result<()> {
    set_up().map_err(|why| io::Error::new(io::ErrorKind::Unsupported, why))?;
    if HELD.fetch_add(1, Ordering::SeqCst) >= max_held() {
        HELD.fetch_sub(1, Ordering::SeqCst);
        return Err(io::Error::new(io::ErrorKind::QuotaExceeded, "as many leases held as descriptors allow"));
    }
    // SAFETY: `fcntl(F_SETLEASE)` on a descriptor this `File` owns; no memory is passed.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) } != 0 {
        let e = io::Error::last_os_error();
        HELD.fetch_sub(1, Ordering::SeqCst);
        return Err(e);
    }
    Ok(())
}

/// Whether the lease on `file` is being broken (another process wants to write or truncate it).
pub(crate) fn broken(file: &File) -> bool {
    // SAFETY: `fcntl(F_GETLEASE)` on a descriptor this `File` owns; no memory is passed.
    let kind = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLEASE) };
    kind != libc::F_RDLCK
}

/// Releases the lease on `file` (its mapping detached, dropped, or never made); each [`take`]
/// that succeeded is released once.
pub(crate) fn release(file: &File) {
    // SAFETY: `fcntl(F_SETLEASE, F_UNLCK)` on a descriptor this `File` owns.
    let _ = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
    HELD.fetch_sub(1, Ordering::SeqCst);
}

/// Puts `map` under the thread's watch.
pub(crate) fn guard<M: Guarded + 'static>(map: &Arc<M>) {
    let weak: Weak<M> = Arc::downgrade(map);
    let weak: Weak<dyn Guarded> = weak;
    let mut guarded = GUARDED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    guarded.retain(|w| w.strong_count() > 0);
    guarded.push(weak);
}

/// The thread: on each wake-up, every guarded mapping whose lease is being broken is moved into
/// the process's memory and its lease released.
fn watch(read: &OwnedFd) {
    let mut buf = [0u8; 64];
    loop {
        let mut ready = libc::pollfd { fd: read.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one `pollfd` for a descriptor this thread owns, valid for the call.
        let polled = unsafe { libc::poll(&raw mut ready, 1, RESCAN_MS) };
        if polled > 0 {
            match rustix::io::read(read, &mut buf) {
                Ok(0) => return,
                Ok(_) | Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
                Err(e) => {
                    tracing::error!(error = %e, "the lease thread cannot read its pipe; mappings are no longer guarded");
                    return;
                }
            }
        }
        // Strong references taken under the lock and dropped after it: the last one may run
        // the mapping's `drop`, which never takes this lock.
        let broken: Vec<Arc<dyn Guarded>> = {
            let mut guarded = GUARDED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            guarded.retain(|w| w.strong_count() > 0);
            guarded.iter().filter_map(Weak::upgrade).filter(|m| m.lease_broken()).collect()
        };
        for map in broken {
            match map.detach() {
                Ok(()) => {
                    REVOKED.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        bytes = map.len(),
                        "another process opened a mapped persisted parsed chunk for writing or truncated it: its pages were \
                         moved into the daemon's memory first (the chunk is served unchanged; the entry is checked again \
                         when it is next read)"
                    );
                }
                Err(e) => tracing::error!(error = %e, "could not move a mapped persisted parsed chunk into memory"),
            }
        }
    }
}
