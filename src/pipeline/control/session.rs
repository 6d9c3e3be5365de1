//! Sessions as plain, synchronous logic (no actors, no sockets), unit-tested here:
//! * [`resolve_options`] (`session/options.rs`): `open` options + dataset defaults → sampling
//!   options, with every violation reported as one message;
//! * [`options_hash`] (the same file): what a resume must match besides the data;
//! * [`check_resume`], [`check_mixture_resume`] (`session/resume.rs`): whether a saved state
//!   resumes the session being opened;
//! * [`SlotTable`]: who owns each ring slot, generations, stale releases;
//! * [`Progress`]: which announced minibatches the client has taken, hence the session position;
//! * [`Registry`]: session names, lingering (resumable) sessions and the memory reserved by rings;
//!   what the daemon checkpoint saves and restores.
//!
//! **State semantics.** A minibatch is *taken* once the client library has handed it to its user.
//! The client reports the count with `release`/`state`/`close` (`taken`); releasing a slot also
//! implies its minibatch was taken. The session's position is the checkpoint position after the
//! last minibatch taken — prefetched minibatches never count — so `resume` with that state (or a
//! reconnect by session name within `session_linger_secs`) continues with exactly the first
//! minibatch not taken.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use minibatchd_client::protocol::{Resumed, SessionOptions, SessionState, WorkerOf};

mod errors;
mod forgotten;
mod options;
mod progress;
mod restore;
mod resume;
mod slots;

pub use errors::RegistryError;
use forgotten::{Forgotten, Gone};
pub use forgotten::{ForgottenNote, FORGOTTEN_CHECKPOINTED, FORGOTTEN_KEPT};
pub use options::{
    options_hash, resolve_options, InvalidOptions, ResolvedOptions, MAX_MINIBATCH_SIZE, MAX_RING_SLOTS,
    MAX_SESSION_NAME, MAX_SLOT_SIZE_BYTES, MAX_WORKERS,
};
pub use progress::Progress;
pub use resume::{
    check_job_order, check_mixture_resume, check_resume, check_worker, EpochStarts, ResumeError, MAX_MINIBATCHES,
};
pub use slots::{Release, SlotOwner, SlotTable};

/// One session as the registry keeps it and the daemon checkpoint saves it (its JSON form is part
/// of the checkpoint format: fields are only ever added, with defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedSession {
    /// The session name (given by the client or generated).
    pub name: String,
    /// The `open` options, without `resume` and `resume_job` (the position, and the job it
    /// continues, are in `state`).
    pub options: SessionOptions,
    /// Position after the last minibatch taken, the data identity and the options hash.
    pub state: SessionState,
    /// The uid that opened the session (the control socket's peer credentials): only it may
    /// resume the session by name. Absent in checkpoints written before sessions had owners;
    /// such a session is bound to the first uid that resumes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<u32>,
    /// How many minibatches this session's trainer may have been given so far: one past the
    /// highest minibatch index announced to its clients (a client that closed with
    /// `close{taken}` said exactly what it took, so then its `taken`). A resume by name from
    /// `state` is exact only when this is not past `state.minibatches`: otherwise minibatches the
    /// trainer may hold come again. [`GIVEN_UNKNOWN`] when it cannot be known (the checkpoint
    /// was written before an unclean stop). Absent in checkpoints written before it was kept: a
    /// `shutdown` checkpoint's sessions then read as exact, any other's as unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub given_up_to: Option<u64>,
    /// The daemon generated its name (the client gave none). Such a session is in a checkpoint
    /// only while connected (for a client that kept its name across a crash); restored, it stays
    /// one: it goes first when `max_sessions` trims, is not remembered as forgotten, and once it
    /// has ended is left out of later checkpoints (found by a probe: after a kill -9, connected
    /// unnamed sessions came back as named ones, written again at every stop).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub generated: bool,
}

/// [`SavedSession::given_up_to`] when nobody knows how far the trainer got: after a kill -9, a
/// crash or a power loss, minibatches may have been given after the last checkpoint.
pub const GIVEN_UNKNOWN: u64 = u64::MAX;

impl SavedSession {
    /// Whether resuming from `state` gives the trainer nothing it may already have:
    /// `given_up_to` is not past the state's minibatch count.
    #[must_use]
    pub fn exact(&self) -> bool {
        self.given_up_to.is_none_or(|g| g <= self.state.minibatches)
    }
}

/// A disconnected session kept for resuming by name.
#[derive(Debug, Clone)]
struct Lingering {
    saved: SavedSession,
    /// When it was parked (or restored from the checkpoint): a shorter linger counts from here.
    parked: Instant,
    expires: Instant,
    /// Where its state came from.
    origin: Resumed,
    /// Its name was generated (the client gave none): it lingers in memory for a client that
    /// kept the name, but is not written to a checkpoint once it has ended.
    generated: bool,
}

/// A connected session: its id and, once opened, what a checkpoint saves of it.
#[derive(Debug, Clone)]
struct ActiveEntry {
    id: u64,
    /// The peer uid of the connection that claimed the name.
    owner: u32,
    saved: Option<SavedSession>,
    /// The daemon generated its name.
    generated: bool,
}

/// How an `open` with a session name starts.
// One per `open`: boxing the large variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// A new session.
    Fresh,
    /// A lingering session of that name continues from this state, which came from there.
    Resume(Kept),
}

/// What the registry keeps of a session between its connections: where it continues, where that
/// came from, and how far its trainer may have been given minibatches
/// ([`SavedSession::given_up_to`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// The state it continues from.
    pub state: SessionState,
    /// Where the state came from (`opened.resumed`).
    pub origin: Resumed,
    /// Minibatches its trainer may have been given ([`GIVEN_UNKNOWN`]: unknown).
    pub given_up_to: u64,
}

/// A lingering session's state as the registry kept it: `exact` when nothing past it may have
/// reached the trainer.
fn lingered(exact: bool) -> Resumed {
    Resumed { from: "lingering".into(), checkpoint_unix_secs: None, exact }
}

/// Session names, lingering sessions and ring memory, shared by all connections; what the daemon
/// checkpoint saves ([`Registry::snapshot`]) and restores ([`Registry::restore`]).
#[derive(Debug)]
pub struct Registry {
    active: HashMap<String, ActiveEntry>,
    lingering: HashMap<String, Lingering>,
    /// No lingering session expires before this (a lower bound: the earliest expiry when last
    /// looked, or of any parked since), so that [`Registry::expire`] at every `open` passes over
    /// the lingering sessions only when one may be due.
    next_expiry: Option<Instant>,
    linger: Duration,
    /// Lingering sessions let go (their linger time ran out, or `max_sessions` pushed them out),
    /// remembered so that an `open` by one of those names is told it starts afresh.
    forgotten: Forgotten,
    /// The checkpoint found at start could not be read (set aside at this path): until this
    /// instant (a linger time from start, as long as its sessions would have lingered), an `open`
    /// by a name that lingers nowhere is told it may have been one of them.
    lost_checkpoint: Option<(String, Instant)>,
    /// Most lingering sessions kept (`max_sessions`): beyond it the one that would expire first
    /// goes.
    max_lingering: usize,
    limit: u64,
    /// Share of the limit kept for parsed chunks: rings may not take it.
    cache_floor: u64,
    rings: u64,
    /// Reserved by the sessions' samplers (their sweep orders), like rings.
    sampling: u64,
    /// Held outside the cache and the rings: each parser thread's reused read buffer.
    buffers: u64,
    next_id: u64,
}

impl Registry {
    /// A registry with `memory_limit_bytes = limit`, of which `cache_floor` stays for chunks.
    #[must_use]
    pub fn new(limit: u64, cache_floor: u64, linger: Duration) -> Self {
        Self {
            active: HashMap::new(),
            lingering: HashMap::new(),
            next_expiry: None,
            forgotten: Forgotten::default(),
            lost_checkpoint: None,
            linger,
            max_lingering: usize::MAX,
            limit,
            cache_floor: cache_floor.min(limit),
            rings: 0,
            sampling: 0,
            buffers: 0,
            next_id: 1,
        }
    }

    /// Applies new limits (a configuration reload). Rings already reserved stay; a lower limit
    /// only refuses new rings until enough have gone. A shorter linger applies to the sessions
    /// lingering already, from when they were parked (found by a probe: they kept the old one,
    /// where the key is documented to apply at once); a longer one only to sessions parked from
    /// now on.
    pub fn set_limits(&mut self, limit: u64, cache_floor: u64, linger: Duration) {
        self.limit = limit;
        self.cache_floor = cache_floor.min(limit);
        // Each keeps the earlier of its own expiry and its parking plus the new linger (found by
        // a review: taking the difference of the lingers off every expiry cut sessions parked
        // under another, shorter linger still).
        if linger < self.linger {
            for l in self.lingering.values_mut() {
                l.expires = l.expires.min(l.parked + linger);
            }
            self.next_expiry = self.lingering.values().map(|l| l.expires).min();
        }
        self.linger = linger;
    }

    /// Keeps at most `n` lingering sessions (at least 1).
    pub fn set_max_lingering(&mut self, n: usize) {
        self.max_lingering = n.max(1);
        self.trim_lingering();
    }

    /// Drops lingering sessions until at most `max_lingering` are left: of the owner with the most
    /// lingering sessions, the one that would expire first. So a user who opens and ends sessions
    /// in a loop gives up its own, not everyone else's resumable sessions.
    ///
    /// Each owner's sessions are sorted once, so that a checkpoint of many more sessions than the
    /// limit (the limit lowered since) trims in O(n log n), not a pass over every session for
    /// each one dropped (30,000 took minutes, the socket closed meanwhile).
    fn trim_lingering(&mut self) {
        let excess = self.lingering.len().saturating_sub(self.max_lingering);
        if excess == 0 {
            return;
        }
        // Per owner, its sessions in the order they go: those of generated names first (only a
        // client that kept the random name resumes one: a user's unnamed sessions that failed
        // or were abandoned do not push out its named ones), then the one that would expire
        // first, then by name.
        let mut per_owner: HashMap<Option<u32>, Vec<(bool, Instant, &str)>> = HashMap::new();
        for (n, l) in &self.lingering {
            per_owner.entry(l.saved.owner).or_default().push((!l.generated, l.expires, n.as_str()));
        }
        for v in per_owner.values_mut() {
            v.sort_unstable_by(|a, b| b.cmp(a)); // the next to go last, popped
        }
        let mut dropped: Vec<String> = Vec::with_capacity(excess);
        for _ in 0..excess {
            // Of the owners with the most sessions left, the one whose next session goes first.
            let Some(v) = per_owner
                .values_mut()
                .filter(|v| !v.is_empty())
                .min_by_key(|v| (std::cmp::Reverse(v.len()), v[v.len() - 1]))
            else {
                break;
            };
            if let Some((_, _, n)) = v.pop() {
                dropped.push(n.to_owned());
            }
        }
        if dropped.len() > 16 {
            tracing::info!(
                count = dropped.len(),
                max = self.max_lingering,
                "lingering sessions were dropped to keep at most max_sessions lingering"
            );
        }
        for n in dropped {
            if self.lingering.len() <= self.max_lingering + 16 {
                tracing::info!(session = %n, max = self.max_lingering, "a lingering session was dropped to keep at most max_sessions lingering");
            }
            if let Some(l) = self.lingering.remove(&n) {
                if !l.generated {
                    self.forgotten.note(n, l.saved.owner, Gone::Pushed);
                }
            }
        }
    }

    /// Marks the connected session `name` as one whose name the daemon generated.
    pub fn mark_generated(&mut self, name: &str) {
        if let Some(e) = self.active.get_mut(name) {
            e.generated = true;
        }
    }

    /// A fresh session id.
    pub fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Whether a session of this name lingers, to be resumed by an `open` that names it.
    #[must_use]
    pub fn is_lingering(&self, name: &str) -> bool {
        self.lingering.contains_key(name)
    }

    /// Claims `name` for a new connection of peer uid `owner` at `now`: busy if connected, a
    /// resume if lingering (the entry is consumed), fresh otherwise.
    ///
    /// # Errors
    /// [`RegistryError::Busy`]; [`RegistryError::NotOwner`] for a lingering session another uid
    /// opened (it stays lingering).
    pub fn claim(&mut self, name: &str, id: u64, owner: u32, now: Instant) -> Result<Claim, RegistryError> {
        self.expire(now);
        if self.active.contains_key(name) {
            return Err(RegistryError::Busy(name.to_owned()));
        }
        if self.lingering.get(name).is_some_and(|l| l.saved.owner.is_some_and(|o| o != owner)) {
            return Err(RegistryError::NotOwner(name.to_owned()));
        }
        let (claim, lingered, generated) = match self.lingering.remove(name) {
            Some(l) => {
                let given_up_to = l.saved.given_up_to.unwrap_or(l.saved.state.minibatches);
                let kept = Kept { state: l.saved.state.clone(), origin: l.origin, given_up_to };
                (Claim::Resume(kept), Some(l.saved), l.generated)
            }
            None => (Claim::Fresh, None, false),
        };
        self.active.insert(name.to_owned(), ActiveEntry { id, owner, saved: lingered, generated });
        Ok(claim)
    }

    /// How many other workers of jobs like session `name`'s read `dataset` through this daemon
    /// now: connected sessions other than `name` of its order options (`options_hash`) whose
    /// workers are as many as `worker`'s — its job's other ranks, and those of another job with
    /// the same options (found by a probe: counted by rank, two such jobs counted as one). Their
    /// randomization windows are held here together (a `DataLoader`'s workers read in one
    /// process, or several ranks on one node), which a window's floor for one worker leaves out.
    #[must_use]
    pub fn other_workers_here(&self, name: &str, dataset: &str, options_hash: &str, worker: WorkerOf) -> u64 {
        let others = self
            .active
            .iter()
            .filter(|(n, _)| n.as_str() != name)
            .filter_map(|(_, e)| e.saved.as_ref())
            .filter(|s| s.state.dataset == dataset && s.state.options_hash == options_hash)
            // The state says its worker once the session took a minibatch; the options say it
            // from the `open` on.
            .filter_map(|s| {
                s.state
                    .worker
                    .or_else(|| WorkerOf::of_session(s.options.rank.unwrap_or(0), s.options.num_workers.unwrap_or(1)))
            })
            .filter(|w| w.of == worker.of)
            .count();
        others as u64
    }

    /// Records what a checkpoint saves of the connected session `name` (at open).
    pub fn record(&mut self, saved: SavedSession) {
        if let Some(e) = self.active.get_mut(&saved.name) {
            e.saved = Some(saved);
        }
    }

    /// The connected session `name` acknowledged minibatches: its state is now
    /// `state`, and its trainer may have been given `given_up_to` minibatches.
    pub fn update_state(&mut self, name: &str, state: &SessionState, given_up_to: u64) {
        if let Some(saved) = self.active.get_mut(name).and_then(|e| e.saved.as_mut()) {
            saved.state.clone_from(state);
            saved.given_up_to = Some(given_up_to);
        }
    }

    /// How far the trainer of active session `name` may have been given minibatches moved to
    /// `given_up_to` (its acknowledged state did not: [`Registry::update_state`]).
    pub fn update_given(&mut self, name: &str, given_up_to: u64) {
        if let Some(saved) = self.active.get_mut(name).and_then(|e| e.saved.as_mut()) {
            saved.given_up_to = Some(given_up_to);
        }
    }

    /// The connection of `name` ended with `state`, after which its trainer had nothing: keep it
    /// resumable for the linger time (exactly).
    pub fn park(&mut self, name: &str, state: SessionState, now: Instant) {
        let given_up_to = state.minibatches;
        self.park_given(name, state, given_up_to, now);
    }

    /// The connection of `name` ended with `state`, its trainer having been given up to
    /// `given_up_to` minibatches (announced ones it never reported count: it may hold them):
    /// keep it resumable for the linger time, exact only if that is not past the state.
    pub fn park_given(&mut self, name: &str, state: SessionState, given_up_to: u64, now: Instant) {
        let origin = lingered(given_up_to <= state.minibatches);
        self.park_kept(name, Kept { state, origin, given_up_to }, now);
    }

    /// [`Registry::park`] keeping where the state came from (a refused resume of a session
    /// restored from a checkpoint stays one, exact or not).
    pub fn park_kept(&mut self, name: &str, kept: Kept, now: Instant) {
        let Kept { state, origin, given_up_to } = kept;
        let entry = self.active.remove(name);
        if let Some(e) = &entry {
            tracing::debug!(session = name, id = e.id, position = state.position, given_up_to, "session parked");
        }
        if self.linger.is_zero() {
            // Found by a probe: with no linger a name opened again started afresh without a word.
            if let Some(e) = entry.as_ref().filter(|e| !e.generated) {
                self.forgotten.note(name.to_owned(), Some(e.owner), Gone::NotKept);
            }
        } else {
            let owner = entry.as_ref().map(|e| e.owner);
            let generated = entry.as_ref().is_some_and(|e| e.generated);
            let options = entry.and_then(|e| e.saved).map(|s| s.options).unwrap_or_default();
            let saved = SavedSession {
                name: name.to_owned(),
                options,
                state,
                owner,
                given_up_to: Some(given_up_to),
                generated,
            };
            let lingering = Lingering { saved, parked: now, expires: now + self.linger, origin, generated };
            self.lingering.insert(name.to_owned(), lingering);
            self.lingers_until(now + self.linger);
            self.trim_lingering();
        }
    }

    /// Drops lingering sessions whose time is up.
    pub fn expire(&mut self, now: Instant) {
        if self.next_expiry.is_some_and(|t| t > now) {
            return;
        }
        let forgotten = &mut self.forgotten;
        self.lingering.retain(|n, l| {
            let keep = l.expires > now;
            // A generated name is no one's to open again by name.
            if !keep && !l.generated {
                forgotten.note(n.clone(), l.saved.owner, Gone::Expired(l.expires));
            }
            keep
        });
        self.next_expiry = self.lingering.values().map(|l| l.expires).min();
    }

    /// Notes that a session lingering until `expires` was parked.
    fn lingers_until(&mut self, expires: Instant) {
        self.next_expiry = Some(self.next_expiry.map_or(expires, |t| t.min(expires)));
    }

    /// Every connected (opened) session and every lingering session the client named, by name,
    /// for a checkpoint. An ended session whose name the daemon generated is left out: nobody
    /// resumes it by a name after a restart (a client that kept its state resumes with it).
    pub fn snapshot(&mut self, now: Instant) -> Vec<SavedSession> {
        self.expire(now);
        let mut out: Vec<SavedSession> = self
            .active
            .values()
            .filter_map(|e| e.saved.clone().map(|saved| SavedSession { generated: e.generated, ..saved }))
            .chain(self.lingering.values().filter(|l| !l.generated).map(|l| l.saved.clone()))
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Connected sessions of peer uid `owner`.
    #[must_use]
    pub fn active_of(&self, owner: u32) -> usize {
        self.active.values().filter(|e| e.owner == owner).count()
    }

    /// Number of connected and lingering sessions.
    #[must_use]
    pub fn counts(&self) -> (usize, usize) {
        (self.active.len(), self.lingering.len())
    }

    /// Reserves `bytes` of ring memory.
    ///
    /// # Errors
    /// [`RegistryError::Memory`] when the rings would eat into the chunk cache's floor (what is
    /// left of the limit after the floor and the parser threads' read buffers).
    pub fn reserve(&mut self, bytes: u64) -> Result<(), RegistryError> {
        let available = self.free_for_sessions();
        if bytes > available {
            return Err(RegistryError::Memory { needed: bytes, available, limit: self.limit, outside: self.buffers });
        }
        self.rings += bytes;
        Ok(())
    }

    /// Whether [`Registry::reserve`] of `bytes` would succeed now.
    #[must_use]
    pub fn ring_fits(&self, bytes: u64) -> bool {
        bytes <= self.free_for_sessions()
    }

    /// Gives back ring memory.
    pub fn unreserve(&mut self, bytes: u64) {
        self.rings = self.rings.saturating_sub(bytes);
    }

    /// What sessions may still reserve: the limit less the chunk cache's floor, the read buffers
    /// and what rings and samplers hold.
    fn free_for_sessions(&self) -> u64 {
        let for_sessions = self.limit.saturating_sub(self.cache_floor).saturating_sub(self.buffers);
        for_sessions - self.rings.saturating_add(self.sampling).min(for_sessions)
    }

    /// Reserves `bytes` for a session's sampler (`per_sequence` of them per sequence of its
    /// dataset, for the message).
    ///
    /// # Errors
    /// [`RegistryError::SamplingMemory`] when they would eat into the chunk cache's floor.
    pub fn reserve_sampling(&mut self, bytes: u64, window_sequences: u64) -> Result<(), RegistryError> {
        let available = self.free_for_sessions();
        if bytes > available {
            return Err(RegistryError::SamplingMemory {
                needed: bytes,
                job: 0,
                window_sequences,
                gathering: (0, 0),
                available,
                limit: self.limit,
                outside: self.buffers,
            });
        }
        self.sampling += bytes;
        Ok(())
    }

    /// Gives back sampler memory.
    pub fn unreserve_sampling(&mut self, bytes: u64) {
        self.sampling = self.sampling.saturating_sub(bytes);
    }

    /// Bytes reserved by samplers.
    #[must_use]
    pub fn sampling_bytes(&self) -> u64 {
        self.sampling
    }

    /// Bytes the open sessions' rings and samplers reserve.
    #[must_use]
    pub fn reserved(&self) -> u64 {
        self.rings.saturating_add(self.sampling)
    }

    /// Sets the bytes held outside the cache and the rings (the parser threads' read buffers:
    /// threads × the largest chunk of the open datasets), which come out of the cache's budget.
    pub fn set_buffers(&mut self, bytes: u64) {
        self.buffers = bytes;
    }

    /// Bytes the chunk cache may hold now: the limit minus the rings, the samplers and the read
    /// buffers.
    #[must_use]
    pub fn cache_budget(&self) -> u64 {
        self.limit.saturating_sub(self.rings).saturating_sub(self.sampling).saturating_sub(self.buffers)
    }

    /// Bytes reserved by rings.
    #[must_use]
    pub fn rings_bytes(&self) -> u64 {
        self.rings
    }

    /// `memory_limit_bytes`.
    #[must_use]
    pub fn limit(&self) -> u64 {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DatasetConfig;
    use minibatchd_client::protocol::{hex64, MinibatchMeta, MixtureState};
    use minibatchd_engine::sampling::{EpochLimit, Tail};

    fn dataset() -> DatasetConfig {
        let text = "[datasets.t]\nformat = \"ctf\"\nfiles = [\"x.ctf\"]\n[datasets.t.streams.f]\ndim = 2\nformat = \"dense\"\n";
        crate::config::Config::from_toml_str(text, std::path::Path::new("/tmp")).expect("config").datasets["t"].clone()
    }

    #[test]
    fn options_resolve_with_dataset_defaults_and_report_every_problem() {
        let d = dataset();
        let o =
            SessionOptions { minibatch_size: Some(8), max_sweeps: Some(2), seed: Some(3), ..SessionOptions::default() };
        let r = resolve_options(&o, &d, 4, 1 << 20).expect("valid");
        assert_eq!(r.sampling.limit, EpochLimit::Sweeps(2));
        assert_eq!(r.sampling.window, d.sampling.window);
        assert_eq!((r.slots, r.sampling.seed, r.sampling.num_workers), (4, 3, 1));
        let bad = SessionOptions {
            max_sweeps: Some(1),
            full_sweep: true,
            rank: Some(2),
            num_workers: Some(2),
            prefetch: Some(1),
            ..SessionOptions::default()
        };
        let e = resolve_options(&bad, &d, 4, 1 << 20).expect_err("invalid");
        assert_eq!(e.0.len(), 4, "{e}");
        for part in ["minibatch_size is required", "at most one", "rank 2", "prefetch 1"] {
            assert!(e.to_string().contains(part), "{e}");
        }
        // Found by a probe: an epoch of 0 samples was an empty epoch without a word (CNTK 2.7:
        // "Epoch size cannot be 0"; a mixture's session refused it already).
        let none = SessionOptions { minibatch_size: Some(8), max_samples: Some(0), ..SessionOptions::default() };
        let e = resolve_options(&none, &d, 4, 1 << 20).expect_err("an epoch of 0 samples");
        assert!(e.to_string().contains("max_samples must be at least 1"), "{e}");
    }

    #[test]
    fn options_hash_ignores_minibatch_size_and_rank_but_not_seed() {
        let d = dataset();
        let a = resolve_options(&SessionOptions { minibatch_size: Some(8), ..SessionOptions::default() }, &d, 4, 4096)
            .expect("a");
        let b = resolve_options(
            &SessionOptions {
                minibatch_size: Some(3),
                num_workers: Some(2),
                rank: Some(1),
                ..SessionOptions::default()
            },
            &d,
            4,
            4096,
        )
        .expect("b");
        let c = resolve_options(
            &SessionOptions { minibatch_size: Some(8), seed: Some(1), ..SessionOptions::default() },
            &d,
            4,
            4096,
        )
        .expect("c");
        assert_eq!(options_hash(&a.sampling, false, Tail::Drop), options_hash(&b.sampling, false, Tail::Drop));
        assert_ne!(options_hash(&a.sampling, false, Tail::Drop), options_hash(&a.sampling, true, Tail::Drop));
        assert_ne!(options_hash(&a.sampling, true, Tail::Drop), options_hash(&a.sampling, true, Tail::Pad));
        assert_eq!(options_hash(&a.sampling, false, Tail::Drop), options_hash(&a.sampling, false, Tail::Pad));
        assert_ne!(options_hash(&a.sampling, false, Tail::Drop), options_hash(&c.sampling, false, Tail::Drop));
    }

    #[test]
    fn resume_checks_dataset_identity_and_options() {
        let s = SessionState {
            version: 1,
            dataset: "t".into(),
            position: 5,
            minibatches: 1,
            data_identity: hex64(7),
            options_hash: hex64(9),
            job: None,
            worker: None,
            mixture: None,
            equal_steps_minibatch: None,
            decode_digest: None,
        };
        assert!(check_resume(&s, "t", 7, 7, 9, None).is_ok());
        assert_eq!(
            check_resume(&s, "u", 7, 7, 9, None),
            Err(ResumeError::Dataset { saved: "t".into(), opened: "u".into() })
        );
        assert!(matches!(check_resume(&s, "t", 8, 8, 9, None), Err(ResumeError::Data { .. })));
        assert_eq!(check_resume(&s, "t", 7, 7, 1, None), Err(ResumeError::Options));
        assert!(check_resume(&s, "t", 8, 8, 9, None).expect_err("data").to_string().contains("other data"));
        assert!(check_resume(&s, "t", 8, 7, 9, None).is_ok(), "a state of the identity before contents counted");
        // A count no session reaches (found by a hostile probe: 2^64 - 1 was taken, and the
        // minibatch index stopped growing at u64::MAX).
        let far = SessionState { minibatches: u64::MAX, ..s.clone() };
        assert_eq!(check_resume(&far, "t", 7, 7, 9, None), Err(ResumeError::Minibatches(u64::MAX)));
        // With equal steps, the minibatch size the state's epoch was cut for (found by a hostile
        // probe: ranks resumed at another size got 90, 90 and 85 steps). A state without one (an
        // earlier build's) resumes at any size, as it did; a session without equal steps has
        // another options hash anyway.
        let cut = SessionState { equal_steps_minibatch: Some(9), ..s.clone() };
        assert!(check_resume(&cut, "t", 7, 7, 9, Some(9)).is_ok());
        let e = check_resume(&cut, "t", 7, 7, 9, Some(5)).expect_err("another size");
        assert_eq!(e, ResumeError::EqualStepsMinibatch { saved: 9, opened: 5 });
        assert!(e.to_string().contains("minibatch_size 9"), "{e}");
        assert!(check_resume(&s, "t", 7, 7, 9, Some(5)).is_ok(), "an earlier build's state");
        assert!(check_resume(&cut, "t", 7, 7, 9, None).is_ok(), "resume_job: any size");
    }

    #[test]
    fn slot_generations_make_stale_releases_harmless() {
        let mut t = SlotTable::new(2);
        let g = t.next_generation(0);
        assert_eq!(g, 1);
        t.announce(0, g, 0);
        assert_eq!(t.leased(), 1);
        assert_eq!(t.release(0, 0), Release::Stale);
        assert_eq!(t.release(1, 1), Release::Stale, "never announced");
        assert_eq!(t.release(9, 1), Release::Stale, "out of range");
        assert_eq!(t.release(0, 1), Release::Freed { minibatch: 0 });
        assert_eq!(t.release(0, 1), Release::Stale, "double release");
        assert_eq!(t.next_generation(0), 2);
        assert_eq!(t.leased(), 0);
    }

    /// A session's state at `position` after `minibatches`, nothing else set.
    fn started_at(position: u64, minibatches: u64) -> SessionState {
        SessionState {
            version: 1,
            dataset: "t".into(),
            position,
            minibatches,
            data_identity: String::new(),
            options_hash: String::new(),
            job: None,
            worker: None,
            mixture: None,
            equal_steps_minibatch: None,
            decode_digest: None,
        }
    }

    /// Found by a probe: the states of a job whose workers opened at `minibatch_size` 60 and 120
    /// (equal steps counted for each) were taken by `resume_job` as one run's.
    #[test]
    fn a_jobs_states_of_several_equal_steps_sizes_are_not_one_runs() {
        use minibatchd_client::protocol::WorkerOf;
        let worker = |rank, size| SessionState {
            worker: Some(WorkerOf { rank, of: 3 }),
            equal_steps_minibatch: size,
            ..started_at(0, 0)
        };
        assert!(check_job_order(&[worker(0, Some(60)), worker(1, Some(60)), worker(2, Some(60))]).is_ok());
        assert!(check_job_order(&[worker(0, None), worker(1, None), worker(2, None)]).is_ok());
        let e = check_job_order(&[worker(0, Some(60)), worker(1, Some(60)), worker(2, Some(120))]).expect_err("mixed");
        assert_eq!(e, ResumeError::JobMixedMinibatch { index: 2, size: 120, first: 60 });
        assert!(e.to_string().contains("give the states of one run"), "{e}");
    }

    #[test]
    fn position_counts_only_taken_minibatches() {
        let start = started_at(10, 2);
        let mut p = Progress::new(&start);
        for (i, pos) in [(2, 18), (3, 26), (4, 30)] {
            p.announced(MinibatchMeta { index: i, sweep: 0, end_of_sweep: false, position: pos }, None);
        }
        assert_eq!((p.taken_count(), p.position()), (2, 10), "prefetched minibatches do not count");
        p.taken(3);
        assert_eq!((p.taken_count(), p.position()), (3, 18));
        p.taken(1);
        assert_eq!(p.taken_count(), 3, "a smaller count changes nothing");
        p.taken(99);
        assert_eq!((p.taken_count(), p.position()), (5, 30), "clamped to what was announced");
    }

    #[test]
    fn a_release_counts_its_minibatch_taken_unless_the_client_says_less_within_a_bound() {
        let start = started_at(0, 0);
        let mut p = Progress::new(&start);
        let meta = |i: u64| MinibatchMeta { index: i, sweep: 0, end_of_sweep: false, position: 10 * (i + 1) };
        // A ring of 4 slots: a slot released is filled again and announced.
        for i in 0..4 {
            p.announced(meta(i), None);
        }
        assert_eq!(p.released(0, None, 4), 0);
        assert_eq!((p.taken_count(), p.position()), (1, 10), "a release without a count: taken");
        let bound = super::progress::RELEASED_UNTAKEN as u64;
        for i in 1..=bound + 1 {
            p.announced(meta(i + 3), None);
            p.taken(1);
            assert_eq!(p.released(i, Some(1), 4), 0, "within the slots and the bound: {i}");
        }
        assert_eq!((p.taken_count(), p.position()), (1, 10), "released, reported untaken: waiting for the count");
        p.announced(meta(bound + 5), None);
        assert_eq!(p.released(bound + 2, Some(1), 4), 1, "past the slots and the bound: counted");
        assert_eq!((p.taken_count(), p.position(), p.forced()), (2, 20, 1));
        p.taken(5);
        assert_eq!((p.taken_count(), p.position()), (5, 50), "the count catches up");
    }

    #[test]
    fn registry_lingers_claims_and_budgets_memory() {
        let t0 = Instant::now();
        let mut r = Registry::new(1000, 200, Duration::from_secs(10));
        r.set_buffers(50);
        assert_eq!(r.cache_budget(), 950, "the parser buffers come out of the cache's share");
        r.set_buffers(0);
        assert_eq!(r.claim("a", 1, 0, t0), Ok(Claim::Fresh));
        assert_eq!(r.claim("a", 2, 0, t0), Err(RegistryError::Busy("a".into())));
        let st = one_minibatch_in();
        r.park("a", st.clone(), t0);
        let kept = Kept { state: st.clone(), origin: lingered(true), given_up_to: 1 };
        assert_eq!(r.claim("a", 3, 0, t0 + Duration::from_secs(1)), Ok(Claim::Resume(kept)));
        r.park("a", st, t0);
        assert_eq!(r.claim("a", 4, 0, t0 + Duration::from_secs(11)), Ok(Claim::Fresh), "expired");
        assert!(r.reserve(700).is_ok());
        assert!(matches!(r.reserve(200), Err(RegistryError::Memory { available: 100, .. })));
        assert_eq!(r.cache_budget(), 300);
        r.unreserve(700);
        assert!(r.reserve(800).is_ok());
        r.unreserve(800);
        r.set_buffers(300);
        assert!(
            matches!(r.reserve(600), Err(RegistryError::Memory { available: 500, .. })),
            "read buffers come out of the rings' share too, so the cache keeps its floor"
        );
        assert!(r.reserve(500).is_ok());
        assert_eq!(r.cache_budget(), 200, "the floor survives buffers and rings together");
        r.unreserve(500);
        assert!(r.reserve_sampling(300, 26).is_ok());
        assert_eq!(r.cache_budget(), 400, "sweep orders come out of the cache's budget");
        assert!(
            matches!(r.reserve(300), Err(RegistryError::Memory { available: 200, .. })),
            "rings and sweep orders share what the floor leaves"
        );
        assert!(matches!(
            r.reserve_sampling(201, 26),
            Err(RegistryError::SamplingMemory { available: 200, window_sequences: 26, .. })
        ));
        r.unreserve_sampling(300);
        assert_eq!((r.sampling_bytes(), r.cache_budget()), (0, 700));
    }

    #[test]
    fn a_continued_jobs_refusal_names_its_delivered_sequences_not_the_window() {
        // Found by a probe: a `resume_job` refused for the memory of the sequences the job's
        // earlier workers delivered was told to narrow its window, which its options fix.
        let refusal = |job| {
            RegistryError::SamplingMemory {
                needed: 16_000_000,
                job,
                window_sequences: 1002,
                gathering: (0, 0),
                available: 9_000_000,
                limit: 10 << 20,
                outside: 0,
            }
            .to_string()
        };
        let plain = refusal(0);
        assert!(plain.contains("narrow the randomization window") && !plain.contains("earlier workers"), "{plain}");
        let job = refusal(15_000_000);
        assert!(job.contains("15000000 of them for the sequences the earlier workers of the job"), "{job}");
        assert!(job.contains("resume each worker by its own state") && !job.contains("narrow"), "{job}");
    }

    #[test]
    fn a_shorter_linger_applies_to_the_sessions_lingering_already() {
        let t0 = Instant::now();
        let mut r = Registry::new(1000, 200, Duration::from_secs(60));
        for name in ["a", "b"] {
            assert_eq!(r.claim(name, 1, 0, t0), Ok(Claim::Fresh));
        }
        r.park("a", one_minibatch_in(), t0);
        r.park("b", one_minibatch_in(), t0 + Duration::from_secs(5));
        r.set_limits(1000, 200, Duration::from_secs(10));
        // Parked at 0 s and 5 s: now kept until 10 s and 15 s, not 60 s and 65 s.
        assert!(matches!(r.claim("a", 2, 0, t0 + Duration::from_secs(11)), Ok(Claim::Fresh)));
        assert!(matches!(r.claim("b", 2, 0, t0 + Duration::from_secs(11)), Ok(Claim::Resume(_))));
        // A longer one leaves them as they are.
        r.park("b", one_minibatch_in(), t0 + Duration::from_secs(12));
        r.set_limits(1000, 200, Duration::from_secs(100));
        assert!(matches!(r.claim("b", 3, 0, t0 + Duration::from_secs(23)), Ok(Claim::Fresh)));
        // Parked under a short linger, lengthened, then shortened less: its own expiry stands
        // (parked at 30 s under 10 s: until 40 s, not 30 + 10 - 50 s).
        r.set_limits(1000, 200, Duration::from_secs(10));
        assert!(matches!(r.claim("c", 4, 0, t0), Ok(Claim::Fresh)));
        r.park("c", one_minibatch_in(), t0 + Duration::from_secs(30));
        r.set_limits(1000, 200, Duration::from_secs(60));
        r.set_limits(1000, 200, Duration::from_secs(20));
        assert!(matches!(r.claim("c", 5, 0, t0 + Duration::from_secs(35)), Ok(Claim::Resume(_))));
    }

    /// A state on dataset `t` after one minibatch of 4 samples.
    fn one_minibatch_in() -> SessionState {
        SessionState {
            version: 1,
            dataset: "t".into(),
            position: 4,
            minibatches: 1,
            data_identity: String::new(),
            options_hash: String::new(),
            job: None,
            worker: None,
            mixture: None,
            equal_steps_minibatch: None,
            decode_digest: None,
        }
    }

    #[test]
    fn ended_unnamed_sessions_stay_out_of_checkpoints_and_lingering_sessions_are_bounded() {
        let t0 = Instant::now();
        let mut r = Registry::new(1000, 200, Duration::from_secs(600));
        let st = one_minibatch_in();
        let saved = |name: &str| SavedSession {
            name: name.into(),
            options: SessionOptions::default(),
            state: st.clone(),
            owner: Some(0),
            given_up_to: None,
            generated: false,
        };
        // Connected, both are checkpointed; once ended, only the named one.
        for (i, name) in ["named", "t-0123456789abcdef"].into_iter().enumerate() {
            assert_eq!(r.claim(name, i as u64, 0, t0), Ok(Claim::Fresh));
            r.record(saved(name));
        }
        r.mark_generated("t-0123456789abcdef");
        let names = |r: &mut Registry| r.snapshot(t0).into_iter().map(|s| s.name).collect::<Vec<_>>();
        assert_eq!(names(&mut r), ["named", "t-0123456789abcdef"]);
        // A checkpoint taken now (the daemon then killed) restores the unnamed one as unnamed:
        // resumable by its name, but once it has ended (or never comes back) out of later
        // checkpoints (found by a probe: it came back as a named session, written at every stop).
        let crashed = r.snapshot(t0);
        assert_eq!(crashed.iter().map(|s| s.generated).collect::<Vec<_>>(), [false, true]);
        let mut after = Registry::new(1000, 200, Duration::from_secs(600));
        assert_eq!(after.restore(crashed, 1_700_000_000, false, t0), 2);
        assert_eq!(names(&mut after), ["named"]);
        assert!(matches!(after.claim("t-0123456789abcdef", 5, 0, t0), Ok(Claim::Resume(..))));
        assert_eq!(names(&mut after), ["named", "t-0123456789abcdef"], "connected again, it is checkpointed");
        after.park("t-0123456789abcdef", st.clone(), t0);
        assert_eq!(names(&mut after), ["named"]);
        r.park("named", st.clone(), t0);
        r.park("t-0123456789abcdef", st.clone(), t0);
        assert_eq!(names(&mut r), ["named"]);
        assert_eq!(r.counts(), (0, 2), "the unnamed one still lingers for a client that kept its name");
        // Resumed by its name, it is still an unnamed session.
        assert!(matches!(r.claim("t-0123456789abcdef", 9, 0, t0), Ok(Claim::Resume(..))));
        r.park("t-0123456789abcdef", st.clone(), t0);
        assert_eq!(names(&mut r), ["named"]);

        // At most max_lingering: the one that would expire first goes.
        r.set_max_lingering(3);
        for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
            let at = t0 + Duration::from_secs(1 + i as u64);
            assert_eq!(r.claim(name, 10 + i as u64, 0, at), Ok(Claim::Fresh));
            r.park(name, st.clone(), at);
        }
        assert_eq!(r.counts(), (0, 3));
        let mut left = names(&mut r);
        left.sort();
        assert_eq!(left, ["a", "b", "c"], "the two parked at t0 went first");

        // Another user's session outlives a user who opens and ends sessions in a loop: the owner
        // with the most lingering sessions gives up its own first.
        let at = t0 + Duration::from_secs(10);
        assert_eq!(r.claim("victim", 20, 7, at), Ok(Claim::Fresh));
        r.park("victim", st.clone(), at);
        for i in 0..10u64 {
            let name = format!("churn-{i}");
            let later = at + Duration::from_secs(1 + i);
            assert_eq!(r.claim(&name, 30 + i, 0, later), Ok(Claim::Fresh));
            r.park(&name, st.clone(), later);
        }
        let mut left = names(&mut r);
        left.sort();
        assert_eq!(left, ["churn-8", "churn-9", "victim"]);

        // Unnamed sessions go before named ones, however late they were parked (found by a
        // probe: a user's refused or failed unnamed opens pushed out its named session).
        let at = at + Duration::from_secs(60);
        for (i, name) in ["u-0000000000000001", "u-0000000000000002", "u-0000000000000003"].into_iter().enumerate() {
            assert_eq!(r.claim(name, 50 + i as u64, 0, at), Ok(Claim::Fresh));
            r.mark_generated(name);
            r.park(name, st.clone(), at);
        }
        let mut left = names(&mut r);
        left.sort();
        assert_eq!(left, ["churn-8", "churn-9", "victim"], "the named sessions stay");
        assert_eq!(r.counts(), (0, 3));
    }

    /// Found by a hostile probe: a checkpoint of 30,000 sessions read under `max_sessions` = 256
    /// trimmed one session per pass over all of them (minutes, the socket closed meanwhile). The
    /// trim is one sort: the same sessions go, the owner with the most first, each owner's that
    /// would expire first.
    #[test]
    fn many_more_lingering_sessions_than_the_limit_are_trimmed_in_one_pass() {
        let t0 = Instant::now();
        let st = one_minibatch_in();
        let mut r = Registry::new(1000, 200, Duration::from_secs(600));
        r.set_max_lingering(65_536);
        for i in 0..30_000u64 {
            let name = format!("s-{i:05}");
            let owner = u32::from(i % 3 == 0); // owner 1 has 10,000, owner 0 20,000
            let at = t0 + Duration::from_millis(i);
            assert_eq!(r.claim(&name, i, owner, at), Ok(Claim::Fresh));
            r.park(&name, st.clone(), at);
        }
        r.set_max_lingering(256);
        assert_eq!(r.counts(), (0, 256));
        // Owner 0 gives up sessions until it has as many as owner 1; then they take turns: 128
        // each are left, the latest of each.
        let mut left = r.lingering.keys().cloned().collect::<Vec<_>>();
        left.sort();
        let want = |owner: u64| (0..30_000u64).filter(move |i| u64::from(i % 3 == 0) == owner).rev().take(128);
        let mut expected: Vec<String> = want(0).chain(want(1)).map(|i| format!("s-{i:05}")).collect();
        expected.sort();
        assert_eq!(left, expected);
    }

    /// The exact flag never says more than the registry knows: a session parked with minibatches
    /// announced past its state is inexact, lingering or restored from a clean stop's checkpoint;
    /// an unclean stop's checkpoint is inexact whatever it says; a refused or withdrawn claim puts
    /// the inexactness back with the state; old checkpoints keep their meaning.
    #[test]
    fn resumes_are_exact_only_when_nothing_past_the_state_may_have_reached_the_trainer() {
        let t0 = Instant::now();
        let st = one_minibatch_in();
        let mut r = Registry::new(1000, 200, Duration::from_secs(600));
        assert_eq!(r.claim("gone", 1, 0, t0), Ok(Claim::Fresh));
        r.park_given("gone", st.clone(), 5, t0);
        let kept = Kept { state: st.clone(), origin: lingered(false), given_up_to: 5 };
        assert_eq!(r.claim("gone", 2, 0, t0), Ok(Claim::Resume(kept.clone())), "announced 1..5 were never reported");
        // Put back (a refused resume, a withdrawn open): still inexact, and so in a checkpoint.
        r.park_kept("gone", kept, t0);
        assert_eq!(r.claim("ok", 3, 0, t0), Ok(Claim::Fresh));
        r.park_given("ok", st.clone(), 1, t0);
        let snap = r.snapshot(t0);
        assert_eq!(
            snap.iter().map(|s| (s.name.as_str(), s.given_up_to, s.exact())).collect::<Vec<_>>(),
            [("gone", Some(5), false), ("ok", Some(1), true)]
        );
        let exact_after = |snap: &[SavedSession], clean: bool| {
            let mut fresh = Registry::new(1000, 200, Duration::from_secs(600));
            fresh.restore(snap.to_vec(), 1_700_000_000, clean, t0);
            ["gone", "ok"].map(|n| match fresh.claim(n, 9, 0, t0) {
                Ok(Claim::Resume(k)) => (k.origin.exact, k.given_up_to),
                other => panic!("{n}: {other:?}"),
            })
        };
        assert_eq!(exact_after(&snap, true), [(false, 5), (true, 1)], "a clean stop keeps each session's own flag");
        assert_eq!(
            exact_after(&snap, false),
            [(false, GIVEN_UNKNOWN), (false, GIVEN_UNKNOWN)],
            "after an unclean stop nobody knows how far a trainer got"
        );
        // Once resumed from an unknown point, a later clean park stays inexact: the trainer may
        // still hold minibatches from before the crash past any position the daemon knows of.
        let mut again = Registry::new(1000, 200, Duration::from_secs(600));
        again.restore(snap.clone(), 1_700_000_000, false, t0);
        assert!(matches!(again.claim("ok", 9, 0, t0), Ok(Claim::Resume(_))));
        again.park_given("ok", one_minibatch_in(), GIVEN_UNKNOWN, t0);
        assert!(matches!(again.claim("ok", 10, 0, t0), Ok(Claim::Resume(k)) if !k.origin.exact));
        // A checkpoint written before the field existed: exact at a clean stop only.
        let old: Vec<SavedSession> = snap.into_iter().map(|s| SavedSession { given_up_to: None, ..s }).collect();
        assert_eq!(exact_after(&old, true), [(true, 1), (true, 1)]);
        assert_eq!(exact_after(&old, false), [(false, GIVEN_UNKNOWN), (false, GIVEN_UNKNOWN)]);
        let json = serde_json::to_string(&old[0]).expect("json");
        assert!(!json.contains("given_up_to"), "absent, not null: {json}");
    }

    #[test]
    fn the_registry_snapshots_connected_and_lingering_sessions_and_restores_them() {
        let t0 = Instant::now();
        let mut r = Registry::new(1000, 200, Duration::from_secs(10));
        let st = |p| SessionState {
            version: 1,
            dataset: "t".into(),
            position: p,
            minibatches: p / 4,
            data_identity: "i".into(),
            options_hash: "o".into(),
            job: None,
            worker: None,
            mixture: None,
            equal_steps_minibatch: None,
            decode_digest: None,
        };
        let opts = SessionOptions { minibatch_size: Some(4), session: Some("a".into()), ..SessionOptions::default() };
        assert_eq!(r.claim("a", 1, 0, t0), Ok(Claim::Fresh));
        r.record(SavedSession {
            name: "a".into(),
            options: opts.clone(),
            state: st(0),
            owner: Some(0),
            given_up_to: None,
            generated: false,
        });
        r.update_state("a", &st(8), 2);
        assert_eq!(r.claim("b", 2, 0, t0), Ok(Claim::Fresh));
        r.park("b", st(4), t0);
        let snap = r.snapshot(t0);
        assert_eq!(
            snap.iter().map(|s| (s.name.as_str(), s.state.position)).collect::<Vec<_>>(),
            vec![("a", 8), ("b", 4)]
        );
        assert_eq!(snap[0].options, opts, "options are kept");
        let mut fresh = Registry::new(1000, 200, Duration::from_secs(10));
        assert_eq!(fresh.restore(snap.clone(), 1_700_000_000, true, t0), 2);
        assert_eq!(fresh.counts(), (0, 2));
        assert_eq!(
            fresh.claim("a", 1, 0, t0),
            Ok(Claim::Resume(Kept {
                state: st(8),
                origin: Resumed { from: "checkpoint".into(), checkpoint_unix_secs: Some(1_700_000_000), exact: true },
                given_up_to: 2,
            }))
        );
        fresh.park("a", st(12), t0);
        assert_eq!(
            fresh.snapshot(t0).iter().find(|s| s.name == "a").map(|s| s.options.clone()),
            Some(opts),
            "options survive a re-park"
        );
        // Under a smaller `max_sessions` the count is of the ones kept (found by a probe: the
        // log called those just dropped resumable too).
        let mut fewer = Registry::new(1000, 200, Duration::from_secs(10));
        fewer.set_max_lingering(1);
        assert_eq!(fewer.restore(snap.clone(), 1_700_000_000, true, t0), 1);
        assert_eq!(fewer.counts(), (0, 1));
        assert_eq!(
            Registry::new(1000, 200, Duration::ZERO).restore(snap, 0, true, t0),
            0,
            "no lingering: nothing to restore"
        );
    }

    #[test]
    fn epoch_starts_give_the_latest_known_epoch_and_stay_bounded() {
        let state = |step: u64| MixtureState { step, slots: 0, samples: 0, ended: false, sources: Vec::new() };
        let mut starts = EpochStarts::default();
        assert_eq!(starts.nearest(1, 5), None);
        starts.insert(1, 2, state(2));
        starts.insert(1, 4, state(4));
        assert_eq!(starts.nearest(1, 5), Some((4, state(4))));
        assert_eq!(starts.nearest(1, 3), Some((2, state(2))));
        assert_eq!(starts.nearest(1, 1), None);
        assert_eq!(starts.nearest(2, 5), None, "another key");
        for e in 0..100 {
            starts.insert(1, e, state(e));
        }
        assert_eq!(starts.nearest(1, 99), Some((99, state(99))));
        assert_eq!(starts.nearest(1, 50), None, "the earliest epochs went first");
        for key in 0..200 {
            starts.insert(key + 10, 1, state(1));
        }
        assert_eq!(starts.by_key.len(), EpochStarts::KEYS);
        assert_eq!(starts.nearest(1, 99), None, "the oldest keys went first");
    }
}
