//! Sessions restored from the daemon checkpoint found at start.

use std::time::Instant;

use minibatchd_client::protocol::Resumed;

use super::forgotten::Gone;
use super::{Lingering, Registry, SavedSession, GIVEN_UNKNOWN};

impl Registry {
    /// Makes checkpointed sessions lingering (resumable by name for the linger time from `now`);
    /// a name already in use is left alone. Returns how many were restored.
    ///
    /// `written_unix_secs` is when the checkpoint was written; `clean` whether it was written at a
    /// clean stop. After an unclean one nobody knows how far a trainer got since the checkpoint
    /// ([`GIVEN_UNKNOWN`]); after a clean one a session is exact when its trainer was given
    /// nothing past its state ([`SavedSession::exact`]). A session resumed from it says so
    /// (`opened.resumed`).
    pub fn restore(&mut self, sessions: Vec<SavedSession>, written_unix_secs: u64, clean: bool, now: Instant) -> usize {
        if self.linger.is_zero() {
            // Found by a probe: a restart with no linger dropped the checkpoint's sessions, and
            // an open of one of their names started afresh without a word.
            for saved in sessions {
                self.forgotten.note(saved.name, saved.owner, Gone::NotKept);
            }
            return 0;
        }
        let mut restored = Vec::new();
        for mut saved in sessions {
            if self.active.contains_key(&saved.name) || self.lingering.contains_key(&saved.name) {
                continue;
            }
            saved.given_up_to = match saved.given_up_to {
                _ if !clean => Some(GIVEN_UNKNOWN),
                // Written before the field existed, at a clean stop: every position was exact.
                None => Some(saved.state.minibatches),
                given => given,
            };
            let exact = saved.exact();
            let origin = Resumed { from: "checkpoint".into(), checkpoint_unix_secs: Some(written_unix_secs), exact };
            let generated = saved.generated;
            restored.push(saved.name.clone());
            self.lingering.insert(
                saved.name.clone(),
                Lingering { saved, parked: now, expires: now + self.linger, origin, generated },
            );
            self.lingers_until(now + self.linger);
        }
        self.trim_lingering();
        // Those `max_sessions` kept (found by a probe: the log counted the ones it had just
        // dropped as resumable too).
        restored.iter().filter(|name| self.lingering.contains_key(*name)).count()
    }
}
