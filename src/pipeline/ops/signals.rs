//! Signals, through `signal-hook`, mapped to one enum: SIGTERM and SIGINT → [`Signal::Shutdown`],
//! SIGHUP → [`Signal::Reload`]. A named thread (`mbd-signals`) waits for them and forwards each
//! into a bounded channel that the daemon's main loop reads; nothing runs in the signal handler
//! itself but signal-hook's self-pipe write, so no signal can reach a panic or a lock.
//!
//! Reloads coalesce: while one is queued, another SIGHUP adds nothing (the queued reload reads
//! the newest file anyway).

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::{Handle, Signals};

/// What a signal asks of the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Stop taking work, checkpoint, exit 0 (SIGTERM, SIGINT); the name is for the logs.
    Shutdown(&'static str),
    /// Validate and apply the configuration file again (SIGHUP).
    Reload,
}

/// Maps a raw signal number.
#[must_use]
pub fn classify(signal: i32) -> Option<Signal> {
    match signal {
        SIGTERM => Some(Signal::Shutdown("SIGTERM")),
        SIGINT => Some(Signal::Shutdown("SIGINT")),
        SIGHUP => Some(Signal::Reload),
        _ => None,
    }
}

/// Capacity of the signal channel: a few shutdowns and one reload.
pub const SIGNAL_QUEUE: usize = 4;

/// The running signal thread; [`Listener::close`] (or drop) ends it.
#[derive(Debug)]
pub struct Listener {
    handle: Handle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Listener {
    /// Installs the handlers and starts the thread that forwards signals to `tx`.
    ///
    /// # Errors
    /// Installing the handlers or spawning the thread failed.
    pub fn start(tx: tokio::sync::mpsc::Sender<Signal>) -> std::io::Result<Self> {
        let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP])?;
        // Handled from here on, even if the parent started us with them blocked (a blocked mask
        // survives `exec`); any already pending reaches the handlers now.
        minibatchd_sys::signals::unblock(&[SIGTERM, SIGINT, SIGHUP])?;
        let handle = signals.handle();
        let thread = std::thread::Builder::new().name("mbd-signals".into()).spawn(move || {
            for raw in signals.forever() {
                let Some(signal) = classify(raw) else { continue };
                let sent = match signal {
                    // One queued reload is enough.
                    Signal::Reload => {
                        !matches!(tx.try_send(signal), Err(tokio::sync::mpsc::error::TrySendError::Closed(_)))
                    }
                    Signal::Shutdown(_) => tx.blocking_send(signal).is_ok(),
                };
                if !sent {
                    return;
                }
            }
        })?;
        Ok(Self { handle, thread: Some(thread) })
    }

    /// Stops forwarding and joins the thread.
    pub fn close(&mut self) {
        self.handle.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The signals caught from the first moments of `minibatchd run`: the forwarding thread and the
/// daemon's end of its channel. Installed before the configuration is read, so a SIGTERM or
/// SIGHUP that a supervisor sends while the daemon starts is a stop or a reload, never the
/// default disposition's death with `daemon.lock` and `metrics.addr` left behind; the daemon's
/// loop takes what came early as soon as it runs.
#[derive(Debug)]
pub struct Caught {
    /// The forwarding thread.
    pub listener: Listener,
    /// What it forwarded.
    pub received: tokio::sync::mpsc::Receiver<Signal>,
}

impl Caught {
    /// Installs the handlers.
    ///
    /// # Errors
    /// As [`Listener::start`].
    pub fn install() -> std::io::Result<Self> {
        let (tx, received) = tokio::sync::mpsc::channel(SIGNAL_QUEUE);
        Ok(Self { listener: Listener::start(tx)?, received })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_map_to_one_enum() {
        assert_eq!(classify(SIGTERM), Some(Signal::Shutdown("SIGTERM")));
        assert_eq!(classify(SIGINT), Some(Signal::Shutdown("SIGINT")));
        assert_eq!(classify(SIGHUP), Some(Signal::Reload));
        assert_eq!(classify(signal_hook::consts::SIGUSR1), None);
    }
}
