//! Which announced minibatches the client has taken ([`Progress`]), hence the session's position:
//! one connection's bookkeeping, apart from the registry all connections share.

use std::collections::VecDeque;

use minibatchd_client::protocol::{MinibatchMeta, MixtureState, SessionState};

/// Released minibatches that may wait for a client's `taken` count beyond the ring's slots
/// ([`Progress::released`]): as many as the Python client can give back (its `UNTAKE_DEPTH`).
pub const RELEASED_UNTAKEN: usize = 1024;

/// The minibatches announced to the client and how many it has taken.
#[derive(Debug, Clone)]
pub struct Progress {
    /// With a mixture's state after each, for a mixture's session.
    announced: VecDeque<(MinibatchMeta, Option<MixtureState>)>,
    taken: u64,
    position: u64,
    /// A mixture's state after the last minibatch taken.
    mixture: Option<MixtureState>,
    /// One past the highest minibatch index announced (the starting count before any).
    announced_up_to: u64,
    /// Released minibatches counted as taken past [`RELEASED_UNTAKEN`], in all.
    forced: u64,
}

impl Progress {
    /// Progress of a session that starts at `start`.
    #[must_use]
    pub fn new(start: &SessionState) -> Self {
        Self {
            announced: VecDeque::new(),
            taken: start.minibatches,
            position: start.position,
            mixture: start.mixture.clone(),
            announced_up_to: start.minibatches,
            forced: 0,
        }
    }

    /// A `ready` went out (with the mixture's state after it, for a mixture's session).
    pub fn announced(&mut self, meta: MinibatchMeta, mixture: Option<MixtureState>) {
        self.announced_up_to = self.announced_up_to.max(meta.index.saturating_add(1));
        self.announced.push_back((meta, mixture));
    }

    /// One past the highest minibatch index announced on this connection (the starting count
    /// before any): the client may have handed every one of them to its trainer.
    #[must_use]
    pub fn announced_up_to(&self) -> u64 {
        self.announced_up_to
    }

    /// The client reports `taken` minibatches taken in total. Counts beyond what was announced
    /// are clamped; smaller counts than already known are ignored.
    pub fn taken(&mut self, taken: u64) {
        while self.taken < taken && self.take_first() {}
    }

    /// Counts the first minibatch announced and not taken as taken; false when there is none.
    fn take_first(&mut self) -> bool {
        let Some((m, mixture)) = self.announced.pop_front() else { return false };
        self.taken = m.index.saturating_add(1);
        self.position = m.position;
        if mixture.is_some() {
            self.mixture = mixture;
        }
        true
    }

    /// The client gave back the slot of minibatch `index`, reporting `taken` minibatches taken
    /// (already applied with [`Progress::taken`]). A release that does not say implies its
    /// minibatch was taken. One that says less is believed: a client may release the slot of a
    /// minibatch it has not handed on yet and may still give back (the Python adapters' `DataLoader`
    /// steps, `docs/daemon.md`), and a resume by name must continue with it. Such minibatches wait
    /// for the count at most [`RELEASED_UNTAKEN`] past the ring's `slot_count` slots (the
    /// connection's memory stays bounded); older ones count as taken, and the number of them is
    /// returned.
    pub fn released(&mut self, index: u64, taken: Option<u64>, slot_count: usize) -> u64 {
        if taken.is_none() {
            self.taken(index.saturating_add(1));
            return 0;
        }
        let before = self.taken;
        let cap = slot_count.saturating_add(RELEASED_UNTAKEN);
        while self.announced.len() > cap && self.take_first() {}
        let forced = self.taken.saturating_sub(before);
        self.forced = self.forced.saturating_add(forced);
        forced
    }

    /// Minibatches [`Progress::released`] counted as taken past the bound, in all.
    #[must_use]
    pub fn forced(&self) -> u64 {
        self.forced
    }

    /// Minibatches announced whose taking the client has not reported (yet).
    #[must_use]
    pub fn unacknowledged(&self) -> usize {
        self.announced.len()
    }

    /// Minibatches taken so far.
    #[must_use]
    pub fn taken_count(&self) -> u64 {
        self.taken
    }

    /// Checkpoint position after the last minibatch taken.
    #[must_use]
    pub fn position(&self) -> u64 {
        self.position
    }

    /// A mixture's state after the last minibatch taken (`None` for a dataset's session).
    #[must_use]
    pub fn mixture(&self) -> Option<&MixtureState> {
        self.mixture.as_ref()
    }
}
