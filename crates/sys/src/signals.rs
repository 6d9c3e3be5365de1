//! The calling thread's signal mask.
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

#[cfg(test)]
mod tests {
    use super::*;

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
