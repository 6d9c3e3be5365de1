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
