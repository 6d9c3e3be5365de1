//! Lingering sessions the registry let go, remembered by name ([`Forgotten`]), so that an `open`
//! by one of those names — which starts afresh — is told so (`opened.warnings`) instead of
//! repeating its trainer's data without a word ([`super::Registry::take_forgotten`]); and the
//! registry's part of it: the notes taken, put back, and the checkpoint lost at start.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

/// Names of lingering sessions the registry let go that it remembers.
pub const FORGOTTEN_KEPT: usize = 4096;

/// Why a lingering session is no longer kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gone {
    /// Its linger time ran out at this instant.
    Expired(Instant),
    /// Dropped to keep at most `max_sessions` lingering.
    Pushed,
    /// Told to an `open` that was then refused: told again, as it was.
    Said(String),
}

impl Gone {
    /// The warning for an `open` of `name` at `now` (`linger_secs`: `session_linger_secs`).
    #[must_use]
    pub fn message(&self, name: &str, linger_secs: u64, now: Instant) -> String {
        let afresh = "this session starts afresh, not where that one ended: to continue it, open with the state its client saved (resume)";
        match self {
            Self::Expired(at) => format!(
                "session {name:?} was kept for resuming by name until {} s ago, when its session_linger_secs ({linger_secs} s) ran out; {afresh}",
                now.saturating_duration_since(*at).as_secs()
            ),
            Self::Pushed => format!(
                "session {name:?} was kept for resuming by name until more sessions lingered than max_sessions allows; {afresh}"
            ),
            Self::Said(m) => m.clone(),
        }
    }
}

/// The last [`FORGOTTEN_KEPT`] lingering sessions let go, by name, with their owner (bounded: the
/// oldest note goes first, so no number of sessions makes it grow).
#[derive(Debug, Default)]
pub struct Forgotten {
    by_name: HashMap<String, (Option<u32>, Gone)>,
    order: VecDeque<String>,
}

impl Forgotten {
    /// Remembers that `name`, of peer uid `owner` (`None`: unknown), was let go.
    pub fn note(&mut self, name: String, owner: Option<u32>, gone: Gone) {
        if self.by_name.insert(name.clone(), (owner, gone)).is_none() {
            self.order.push_back(name);
        }
        while self.order.len() > FORGOTTEN_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.by_name.remove(&old);
            }
        }
    }

    /// The note of `name` for an `open` by peer uid `uid`, taken (a later open of the name is
    /// no news). Another user's note is neither told nor taken: that a session of that name
    /// existed is its owner's business, and its owner is still to be told.
    pub fn take(&mut self, name: &str, uid: u32) -> Option<Gone> {
        let (owner, _) = self.by_name.get(name)?;
        if owner.is_some_and(|o| o != uid) {
            return None;
        }
        let (_, gone) = self.by_name.remove(name)?;
        self.order.retain(|n| n != name);
        Some(gone)
    }
}

impl super::Registry {
    /// Why a session `name` of peer uid `uid` that lingered is no longer kept, if the registry
    /// let it go since the daemon started (the most recent [`FORGOTTEN_KEPT`] names), or lost it
    /// with an unreadable checkpoint: a warning for an `open` that names it and so starts
    /// afresh. Asked once: the note is dropped ([`Registry::unclaim`] puts it back).
    pub fn take_forgotten(&mut self, name: &str, uid: u32, now: Instant) -> Option<String> {
        if let Some(gone) = self.forgotten.take(name, uid) {
            return Some(gone.message(name, self.linger.as_secs(), now));
        }
        let (aside, until) = self.lost_checkpoint.as_ref()?;
        (now < *until).then(|| format!(
            "the daemon's checkpoint could not be read when it started (it was set aside as {aside}), so the sessions it held cannot be resumed by name: if session {name:?} was one of them, this session starts afresh, not where that one ended; to continue it, open with the state its client saved (resume)"
        ))
    }

    /// Gives up the claim on `name` of an `open` that was refused after it claimed a fresh
    /// session: the name lingers nowhere — a session that never was leaves nothing to resume,
    /// and parked it would count against `max_sessions` lingering and push out sessions that
    /// can be resumed (found by a probe: forty refused opens dropped a user's named session).
    /// `told`: the note the `open` was given ([`Registry::take_forgotten`]), kept for the next.
    pub fn unclaim(&mut self, name: &str, told: Option<String>) {
        let owner = self.active.remove(name).map(|e| e.owner);
        if let Some(note) = told {
            self.forgotten.note(name.to_owned(), owner, Gone::Said(note));
        }
    }

    /// The checkpoint found at start at `now` could not be read and was set aside at `aside`.
    pub fn checkpoint_lost(&mut self, aside: &std::path::Path, now: Instant) {
        self.lost_checkpoint = Some((aside.display().to_string(), now + self.linger));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_bounded_owned_and_taken_once() {
        let mut f = Forgotten::default();
        for i in 0..FORGOTTEN_KEPT + 10 {
            f.note(format!("s{i}"), Some(7), Gone::Pushed);
        }
        assert_eq!((f.by_name.len(), f.order.len()), (FORGOTTEN_KEPT, FORGOTTEN_KEPT));
        assert_eq!(f.take("s0", 7), None, "the oldest went first");
        assert_eq!(f.take("s10", 8), None, "another user is not told");
        assert_eq!(f.take("s10", 7), Some(Gone::Pushed), "its owner is, after");
        assert_eq!(f.take("s10", 7), None, "once");
        f.note("legacy".into(), None, Gone::Said("told".into()));
        assert_eq!(f.take("legacy", 3), Some(Gone::Said("told".into())), "an owner unknown: anyone");
    }
}
