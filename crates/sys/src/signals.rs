//! The calling thread's signal mask, and signals whose default action would end the process
//! without a word.
//!
//! A process inherits its parent's blocked signals across `exec`. A daemon started with SIGTERM
//! or SIGHUP blocked (by a shell, a supervisor or a test harness that blocked them around its
//! `fork`) would install its handlers and still never see those signals: a stop or a reload
//! sent to it would wait, pending, for ever.

/// Unblocks `signals` in the calling thread (and so in every thread it starts from now on).
/// Signals already pending are delivered before this returns, to the handlers in place.
///
/// # Errors
/// A number that is not a signal.
pub fn unblock(signals: &[i32]) -> std::io::Result<()> {
    // SAFETY: `set` is a local `sigset_t`, initialised by `sigemptyset` before any other use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable `sigset_t`.
    unsafe { libc::sigemptyset(&raw mut set) };
    for &signal in signals {
        // SAFETY: as above; an invalid number is reported by the return value.
        if unsafe { libc::sigaddset(&raw mut set, signal) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: `set` is initialised; the old mask is not asked for (null).
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &raw const set, std::ptr::null_mut()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}

/// Ignores SIGXFSZ. A write past the file-size limit (`ulimit -f`, systemd's `LimitFSIZE=`)
/// raises it, and its default action kills the process with no log line (found by a probe: a
/// decompressed copy or a parsed-cache entry past the limit ended the daemon and every session);
/// ignored, the write fails with `EFBIG`, which every writer reports as it reports a full disk.
/// Call before any thread exists: the disposition is the process's.
///
/// # Errors
/// `sigaction`'s.
pub fn ignore_file_size_limit_signal() -> std::io::Result<()> {
    // SAFETY: a zeroed `sigaction` is a valid C struct; `SIG_IGN` needs no handler, and the old
    // action is not asked for (null).
    let rc = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = libc::SIG_IGN;
        libc::sigaction(libc::SIGXFSZ, &raw const action, std::ptr::null_mut())
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_past_the_file_size_limit_fails_with_efbig_once_sigxfsz_is_ignored() {
        // In a child process: the limit and the disposition are the process's. The child makes
        // no allocation (other test threads may hold the allocator's lock at the fork).
        let path = std::env::temp_dir().join(format!("minibatchd-sigxfsz-{}", std::process::id()));
        let cpath = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("a path without NUL");
        let block = [0u8; 8192];
        // SAFETY: `fork`; the child calls only async-signal-safe functions before `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            let code = if ignore_file_size_limit_signal().is_err() {
                3
            } else {
                // SAFETY: a valid `rlimit`, a NUL-terminated path, a buffer of `block.len()`
                // bytes; `__errno_location` is this thread's errno.
                unsafe {
                    let limit = libc::rlimit { rlim_cur: 4096, rlim_max: libc::RLIM_INFINITY };
                    let fd = libc::open(cpath.as_ptr(), libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, 0o600);
                    if libc::setrlimit(libc::RLIMIT_FSIZE, &raw const limit) != 0 || fd < 0 {
                        4
                    } else {
                        let first = libc::write(fd, block.as_ptr().cast(), 4096);
                        let past = libc::write(fd, block.as_ptr().cast(), block.len());
                        if first == 4096 && past < 0 && *libc::__errno_location() == libc::EFBIG {
                            0
                        } else {
                            2
                        }
                    }
                }
            };
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &raw mut status, 0) }, pid);
        let _ = std::fs::remove_file(&path);
        assert!(libc::WIFEXITED(status), "the child was killed by signal {}", libc::WTERMSIG(status));
        assert_eq!(libc::WEXITSTATUS(status), 0, "the write past the limit failed otherwise than with EFBIG");
    }

    #[test]
    fn a_blocked_signal_is_unblocked_and_an_invalid_one_refused() {
        let signal = libc::SIGUSR2;
        std::thread::spawn(move || {
            // SAFETY: local sets, initialised before use; this thread's mask only.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&raw mut set);
                libc::sigaddset(&raw mut set, signal);
                assert_eq!(libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, std::ptr::null_mut()), 0);
            }
            unblock(&[signal]).expect("unblock");
            // SAFETY: as above.
            let blocked = unsafe {
                let mut now: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&raw mut now);
                assert_eq!(libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &raw mut now), 0);
                libc::sigismember(&raw const now, signal)
            };
            assert_eq!(blocked, 0, "still blocked");
            assert!(unblock(&[100_000]).is_err());
        })
        .join()
        .expect("thread");
    }
}
