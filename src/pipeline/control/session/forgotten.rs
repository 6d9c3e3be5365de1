//! Lingering sessions the registry let go, remembered by name ([`Forgotten`]), so that an `open`
//! by one of those names — which starts afresh — is told so (`opened.warnings`) instead of
//! repeating its trainer's data without a word ([`super::Registry::take_forgotten`]); and the
//! registry's part of it: the notes taken, put back, and the checkpoint lost at start.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Names of lingering sessions the registry let go that it remembers.
pub const FORGOTTEN_KEPT: usize = 4096;

/// Of those, the most recent the checkpoint carries across a restart (it is written at every
/// `open`: a few hundred short notes keep it small).
pub const FORGOTTEN_CHECKPOINTED: usize = 256;

/// A note of [`Forgotten`] as the checkpoint carries it, so that after a restart an `open` by
/// the name of a session let go before it is still told it starts afresh (found by a probe: a
/// name whose linger ran out, then a restart, started over from minibatch 0 without a word).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForgottenNote {
    /// The session's name.
    pub name: String,
    /// Its owner's uid, where known.
    #[serde(default)]
    pub owner: Option<u32>,
    /// Its linger time ran out at this Unix time (seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expired_unix_secs: Option<u64>,
    /// The warning as told (pushed out by `max_sessions`, or told to a refused `open`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Why a lingering session is no longer kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gone {
    /// Its linger time ran out at this instant.
    Expired(Instant),
    /// Dropped to keep at most `max_sessions` lingering.
    Pushed,
    /// Not kept at all: `session_linger_secs` is 0 (when it was parked, or restored from a
    /// checkpoint).
    NotKept,
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
            Self::NotKept => format!(
                "session {name:?} ended (or was restored from the checkpoint) while session_linger_secs is 0, which keeps no session for resuming by name; {afresh}"
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
    /// The most recent [`FORGOTTEN_CHECKPOINTED`] notes, oldest first, as of `now`.
    fn notes(&self, now: Instant, linger_secs: u64) -> Vec<ForgottenNote> {
        let unix_now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let skip = self.order.len().saturating_sub(FORGOTTEN_CHECKPOINTED);
        self.order
            .iter()
            .skip(skip)
            .filter_map(|name| {
                let (owner, gone) = self.by_name.get(name)?;
                let (expired_unix_secs, message) = match gone {
                    Gone::Expired(at) => {
                        (Some(unix_now.saturating_sub(now.saturating_duration_since(*at).as_secs())), None)
                    }
                    other => (None, Some(other.message(name, linger_secs, now))),
                };
                Some(ForgottenNote { name: name.clone(), owner: *owner, expired_unix_secs, message })
            })
            .collect()
    }

    /// Takes back the notes of a checkpoint written by an earlier start, at `now` (a name noted
    /// already keeps its own).
    fn restore(&mut self, notes: Vec<ForgottenNote>, now: Instant) {
        let unix_now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        for n in notes.into_iter().rev().take(FORGOTTEN_CHECKPOINTED).rev() {
            let gone = match (n.expired_unix_secs, n.message) {
                (Some(at), _) => match now.checked_sub(Duration::from_secs(unix_now.saturating_sub(at))) {
                    Some(at) => Gone::Expired(at),
                    None => Gone::Said(format!(
                        "session {:?} was kept for resuming by name until its session_linger_secs ran out, before the daemon last started; this session starts afresh, not where that one ended: to continue it, open with the state its client saved (resume)",
                        n.name
                    )),
                },
                (None, Some(m)) => Gone::Said(m),
                (None, None) => continue,
            };
            // A name noted since the start keeps its own note.
            if !self.by_name.contains_key(&n.name) {
                self.note(n.name, n.owner, gone);
            }
        }
    }

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
    /// The notes of sessions let go that a checkpoint carries ([`FORGOTTEN_CHECKPOINTED`]).
    #[must_use]
    pub fn forgotten_notes(&self, now: Instant) -> Vec<ForgottenNote> {
        self.forgotten.notes(now, self.linger.as_secs())
    }

    /// Takes back the notes of the checkpoint found at start (a name already noted keeps its own).
    pub fn restore_forgotten(&mut self, notes: Vec<ForgottenNote>, now: Instant) {
        self.forgotten.restore(notes, now);
    }

    /// Why a session `name` of peer uid `uid` that lingered is no longer kept, if the registry
    /// let it go since the daemon started (the most recent [`FORGOTTEN_KEPT`] names), or lost it
    /// with an unreadable checkpoint: a warning for an `open` that names it and so starts
    /// afresh. Asked once: the note is dropped ([`Registry::unclaim`](Self::unclaim) puts it back).
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
    /// `told`: the note the `open` was given ([`Registry::take_forgotten`](Self::take_forgotten)), kept for
    /// the next.
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
    fn the_checkpoint_carries_the_latest_notes_and_gives_them_back() {
        let t0 = Instant::now();
        let mut f = Forgotten::default();
        for i in 0..FORGOTTEN_CHECKPOINTED + 3 {
            f.note(format!("p{i}"), Some(7), Gone::Pushed);
        }
        f.note("e".into(), None, Gone::Expired(t0));
        let notes = f.notes(t0 + Duration::from_secs(30), 60);
        assert_eq!(notes.len(), FORGOTTEN_CHECKPOINTED, "the most recent only");
        assert_eq!(notes.last().map(|n| (n.name.as_str(), n.message.is_none())), Some(("e", true)));
        assert!(notes[0].message.as_deref().is_some_and(|m| m.contains("max_sessions")), "{:?}", notes[0]);
        let mut back = Forgotten::default();
        back.restore(notes, t0 + Duration::from_secs(40));
        assert_eq!(back.take("p3", 7), None, "left out of the checkpoint");
        let told = back.take("e", 1).expect("the expired note").message("e", 60, t0 + Duration::from_secs(40));
        // The age comes from the wall clock, which did not move between the two calls.
        assert!(told.contains("until 30 s ago") || told.contains("until 31 s ago"), "{told}");
        let pushed = back.take(&format!("p{}", FORGOTTEN_CHECKPOINTED + 2), 7).expect("a pushed note");
        assert!(pushed.message("x", 60, t0).contains("max_sessions"));
    }

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
