//! `sd_notify` over `$NOTIFY_SOCKET`: a few lines of the protocol instead of a libsystemd
//! dependency. systemd (with `Type=notify`) learns from it when the daemon is ready (`READY=1`,
//! after the control socket is open), reloading (`RELOADING=1` … `READY=1` around a SIGHUP),
//! stopping (`STOPPING=1`) and alive (`WATCHDOG=1` every half `WatchdogSec`, from the event
//! loop, so a wedged loop gets the daemon restarted).
//!
//! The socket is a Unix datagram socket, a path or (leading `@`) an abstract name. Without
//! `$NOTIFY_SOCKET` (not under systemd) every call does nothing. Sending is best effort and
//! never blocks (a manager that does not read its queue gets messages dropped, logged at debug
//! level); it never stops the daemon.

use std::ffi::OsString;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// A connection to the service manager, or nothing.
#[derive(Debug, Default)]
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
    watchdog: Option<Duration>,
}

fn address(socket: &OsString) -> std::io::Result<SocketAddr> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = socket.as_bytes();
    match bytes.first() {
        Some(b'@') => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(&bytes[1..])
        }
        Some(b'/') => SocketAddr::from_pathname(std::path::Path::new(socket)),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "NOTIFY_SOCKET is neither a path nor an abstract name",
        )),
    }
}

impl Notifier {
    /// From the environment (`NOTIFY_SOCKET`, `WATCHDOG_USEC`, `WATCHDOG_PID`).
    #[must_use]
    pub fn from_env() -> Self {
        Self::from_vars(
            std::env::var_os("NOTIFY_SOCKET"),
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
            std::process::id(),
        )
    }

    /// From explicit values (tests). The watchdog applies when `watchdog_usec` is a positive
    /// number and `watchdog_pid` is absent or this `pid`.
    #[must_use]
    pub fn from_vars(
        socket: Option<OsString>,
        watchdog_usec: Option<&str>,
        watchdog_pid: Option<&str>,
        pid: u32,
    ) -> Self {
        // Non-blocking: a manager that does not read (a full queue) must never stall the event
        // loop; the message is dropped instead.
        let unbound = || UnixDatagram::unbound().and_then(|s| s.set_nonblocking(true).map(|()| s));
        let target = socket.filter(|s| !s.is_empty()).and_then(|s| match (address(&s), unbound()) {
            (Ok(addr), Ok(sock)) => Some((sock, addr)),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(socket = ?s, error = %e, "cannot use NOTIFY_SOCKET");
                None
            }
        });
        let ours = watchdog_pid.is_none_or(|p| p.trim().parse::<u32>().ok() == Some(pid));
        let watchdog = watchdog_usec
            .and_then(|u| u.trim().parse::<u64>().ok())
            .filter(|&u| u > 0 && ours)
            .map(|u| Duration::from_micros(u / 2).max(Duration::from_millis(10)));
        let watchdog = if target.is_some() { watchdog } else { None };
        Self { target, watchdog }
    }

    /// Whether a service manager listens.
    #[must_use]
    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// How often to send `WATCHDOG=1` (half the manager's timeout), if it wants it.
    #[must_use]
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog
    }

    /// Sends `state` (newline-separated `KEY=VALUE` lines); `false` if nothing was sent.
    pub fn send(&self, state: &str) -> bool {
        let Some((sock, addr)) = &self.target else { return false };
        match sock.send_to_addr(state.as_bytes(), addr) {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!(error = %e, "sd_notify failed");
                false
            }
        }
    }

    /// `READY=1` with a status line. Best effort, as every message here: `false` when it could not
    /// be sent (logged at debug; the daemon goes on either way).
    #[allow(clippy::must_use_candidate)] // callers may ignore a best-effort notification
    pub fn ready(&self, status: &str) -> bool {
        self.send(&format!("READY=1\nSTATUS={status}\nMAINPID={}", std::process::id()))
    }

    /// `STATUS=` alone (what `systemctl status` shows).
    #[allow(clippy::must_use_candidate)] // best effort
    pub fn status(&self, status: &str) -> bool {
        self.send(&format!("STATUS={status}"))
    }

    /// `RELOADING=1` (with `MONOTONIC_USEC`, as `Type=notify-reload` wants).
    #[allow(clippy::must_use_candidate)] // best effort
    pub fn reloading(&self) -> bool {
        let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        let usec = u64::try_from(now.tv_sec)
            .unwrap_or(0)
            .saturating_mul(1_000_000)
            .saturating_add(u64::try_from(now.tv_nsec).unwrap_or(0) / 1000);
        self.send(&format!("RELOADING=1\nSTATUS=reloading the configuration\nMONOTONIC_USEC={usec}"))
    }

    /// `STOPPING=1`.
    #[allow(clippy::must_use_candidate)] // best effort
    pub fn stopping(&self) -> bool {
        self.send("STOPPING=1\nSTATUS=stopping: writing the checkpoint")
    }

    /// `WATCHDOG=1`.
    #[allow(clippy::must_use_candidate)] // best effort
    pub fn watchdog(&self) -> bool {
        self.send("WATCHDOG=1")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_to_a_path_socket_and_honours_the_watchdog_pid() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify.sock");
        let server = UnixDatagram::bind(&path).expect("bind");
        server.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let n = Notifier::from_vars(Some(path.clone().into_os_string()), Some("3000000"), None, 7);
        assert!(n.enabled());
        assert_eq!(n.watchdog_interval(), Some(Duration::from_millis(1500)));
        assert!(n.ready("serving"));
        let mut buf = [0u8; 256];
        let len = server.recv(&mut buf).expect("recv");
        let text = std::str::from_utf8(&buf[..len]).expect("utf8");
        assert!(text.starts_with("READY=1\nSTATUS=serving\nMAINPID="), "{text}");
        assert!(n.reloading());
        let len = server.recv(&mut buf).expect("recv");
        assert!(std::str::from_utf8(&buf[..len]).expect("utf8").contains("MONOTONIC_USEC="));
        let other = Notifier::from_vars(Some(path.into_os_string()), Some("3000000"), Some("8"), 7);
        assert_eq!(other.watchdog_interval(), None, "the watchdog is for another process");
        // Regression: a manager that stops reading must not block the sender.
        let started = std::time::Instant::now();
        let sent = (0..10_000).filter(|_| n.watchdog()).count();
        assert!(sent < 10_000, "the queue fills and messages are dropped");
        assert!(started.elapsed() < Duration::from_secs(30));
    }

    #[test]
    fn abstract_names_and_absence_are_handled() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("@minibatchd-test-{}", std::process::id());
        let server = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(&name.as_bytes()[1..]).expect("addr"))
            .expect("bind");
        server.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let n = Notifier::from_vars(Some(name.into()), None, None, 1);
        assert!(n.stopping());
        let mut buf = [0u8; 64];
        let len = server.recv(&mut buf).expect("recv");
        assert!(buf[..len].starts_with(b"STOPPING=1"));
        let none = Notifier::from_vars(None, Some("100"), None, 1);
        assert!(!none.enabled() && !none.ready("x") && none.watchdog_interval().is_none());
        assert!(!Notifier::from_vars(Some("relative".into()), None, None, 1).enabled());
    }
}
