//! Admitting a session: every decision of an `open` that touches shared state, as plain
//! functions over the [`Registry`], unit-tested without a socket or an actor.
//!
//! [`admit`] claims the session's name (busy if connected elsewhere; a lingering session of that
//! name resumes), picks the state it starts from (the client's `resume`, the lingering state —
//! checked against the dataset and options —, or a fresh one), reserves the ring's memory and
//! honours the host-memory guard. Either everything is taken or nothing is: a refusal leaves the
//! registry as it found it (a lingering session goes back to lingering). [`withdraw`] undoes an
//! admission whose later steps failed (creating the ring, starting the producer).
//!
//! [`Refusal`] is every reason an `open` is refused, typed, with the protocol's error code and —
//! for a dataset that failed to open — the data error's file, line, byte offset and kind.

use std::time::{Duration, Instant};

use minibatchd_client::protocol::{ErrorCode, ErrorDetail, Resumed, SessionOptions, SessionState};
use minibatchd_engine::sampling::SamplingError;
use minibatchd_shm::LayoutError;
use minibatchd_sys::ShmError;

use super::session::{
    Claim, InvalidOptions, Kept, Registry, RegistryError, ResumeError, SavedSession, MAX_SESSION_NAME,
};
use crate::pipeline::data::catalog::CatalogError;
use crate::pipeline::data::producer::error_detail;

/// Why an `open` is refused.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The dataset is unknown or failed to open.
    #[error(transparent)]
    Dataset(#[from] CatalogError),
    /// Invalid options.
    #[error(transparent)]
    Options(#[from] InvalidOptions),
    /// The sampler refuses the options (e.g. a position beyond the epoch).
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    /// The client's `resume` state does not fit this dataset or these options.
    #[error(transparent)]
    Resume(#[from] ResumeError),
    /// The lingering session of that name does not fit these options.
    #[error("session '{name}': {source}")]
    Lingering {
        /// The session.
        name: String,
        /// What differs.
        source: ResumeError,
    },
    /// The name is connected elsewhere, or the ring does not fit the memory limit.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The host is short of memory even after the chunk cache shrank.
    #[error("the host is short of memory: available memory is {shortfall} bytes below daemon.host_memory_reserve_bytes ({reserve}) even after the chunk cache was shrunk; new sessions are refused until memory is freed")]
    HostMemory {
        /// How far below the reserve.
        shortfall: u64,
        /// `host_memory_reserve_bytes`.
        reserve: u64,
    },
    /// The ring's shared memory could not be created.
    #[error("cannot create the ring: {0}")]
    Ring(#[from] ShmError),
    /// The ring is larger than the daemon's file-size limit (a memfd counts as a file).
    #[error("cannot create the session's ring of {0} bytes: it is larger than the daemon's file-size limit (RLIMIT_FSIZE: `ulimit -f`, systemd's LimitFSIZE=), which a ring's shared-memory file is held to; open the session with a smaller prefetch or slot_size_bytes, or raise the limit")]
    RingOverFileSizeLimit(u64),
    /// The ring's memfd could not be duplicated for the client.
    #[error("cannot pass the ring: {0}")]
    Descriptor(std::io::Error),
    /// The ring's header could not be written.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// The daemon, or this user, has as many sessions as it may.
    #[error("too many sessions: {count} open {scope} (daemon.{key} = {limit}); close one or raise the limit")]
    TooManySessions {
        /// `for this user` or `in the daemon`.
        scope: &'static str,
        /// The config key of the limit.
        key: &'static str,
        /// Sessions open.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// The delivery stage is gone (the daemon is stopping).
    #[error("delivery stage unavailable: {0}")]
    Delivery(String),
    /// A chunk of the dataset cannot be parsed within the memory limit.
    #[error(
        "chunk {chunk} of the dataset holds {sequences} sequences, whose dense values alone (one sample each, one dense stream) take {bytes} bytes, more than a parsed chunk may hold within daemon.memory_limit_bytes ({limit} bytes): every dense sample costs dim values however short its text; lower the dataset's chunk_size_bytes or raise memory_limit_bytes"
    )]
    ChunkTooLarge {
        /// The chunk.
        chunk: usize,
        /// Its sequences.
        sequences: u64,
        /// Their dense values' bytes at least.
        bytes: u64,
        /// What a parsed chunk may hold.
        limit: u64,
    },
    /// A file of the dataset changed since it was indexed: no session is opened on the old index.
    #[error("dataset '{name}' changed since it was indexed: {source}{}", reopen_failure.as_ref().map_or_else(String::new, |e| format!("; the last reload could not index it again: {e}")))]
    Changed {
        /// The dataset.
        name: String,
        /// The file and what changed.
        source: minibatchd_engine::format::errors::DataError,
        /// Why the last reload could not index its files again, if it tried.
        reopen_failure: Option<String>,
    },
    /// The session could not be written to the daemon checkpoint (a full or read-only
    /// `state_dir`): without it, a crash would lose the session's name and position silently.
    #[error("{0}; the session is refused, since after a crash it could not be resumed by name (daemon.state_dir must let the daemon write checkpoint.json there: a writable directory with room, the file a regular file)")]
    Checkpoint(String),
    /// The randomization window's parsed chunks cannot fit the memory limit
    /// ([`minibatchd_engine::feed::window_floor_bytes`] against the cache's share).
    #[error(
        "the randomization window needs at least {} MiB of parsed chunks (counting only the dense values of its {window_chunks} smallest chunks at their peak{}), more than the chunk cache's share of memory_limit_bytes ({} MiB, what the limit leaves after the sessions' rings and sweep orders and the parser threads' read buffers); {}",
        floor.div_ceil(1 << 20),
        if *workers_here > 1 { format!(", for the {workers_here} workers of this job (or of jobs of its options) that read through this daemon: their windows are held here together") } else { String::new() },
        share >> 20,
        window_advice(*largest, *workers_here, *largest_all)
    )]
    WindowTooLarge {
        /// The window in chunks.
        window_chunks: usize,
        /// The largest window in chunks that fits (0: none).
        largest: usize,
        /// The least the window holds, in bytes.
        floor: u64,
        /// The cache's share of the limit, in bytes.
        share: u64,
        /// Workers of the session's job reading through this daemon, the session's own included
        /// (their floors are held together).
        workers_here: u64,
        /// The job's worker count and the largest window that fits them all here, when the job
        /// has more workers than read here now.
        largest_all: Option<(u64, usize)>,
    },
    /// A mixture that cannot be served as configured or asked: its streams, weights or state.
    #[error("mixture '{name}': {message}")]
    Mixture {
        /// The mixture.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A mixture's sources' randomization windows cannot fit the memory limit together.
    #[error(
        "mixture '{name}': its sources' randomization windows need at least {} MiB of parsed chunks together ({sources}), more than the chunk cache's share of memory_limit_bytes ({} MiB); give those datasets smaller windows (their [sampling] window_chunks or window_samples) or raise memory_limit_bytes",
        floor.div_ceil(1 << 20),
        share >> 20
    )]
    MixtureTooLarge {
        /// The mixture.
        name: String,
        /// Each source's floor, for the message.
        sources: String,
        /// The least the windows hold together, in bytes.
        floor: u64,
        /// The cache's share of the limit, in bytes.
        share: u64,
    },
}

/// What a [`Refusal::WindowTooLarge`] advises: the largest window that fits (for the workers of
/// the job here, and for all of them when more may come), and that every worker of a job opens
/// with the same window.
fn window_advice(largest: usize, workers_here: u64, largest_all: Option<(u64, usize)>) -> String {
    use std::fmt::Write as _;
    if largest == 0 {
        return "no window fits: raise memory_limit_bytes".to_owned();
    }
    let mut out = format!("the largest window that can fit is {largest} chunk(s)");
    if workers_here > 1 {
        write!(out, " for the {workers_here} workers here").ok();
    }
    match largest_all {
        Some((all, 0)) => write!(out, " (none if all {all} of its job's workers read through this daemon)").ok(),
        Some((all, fits_all)) => write!(
            out,
            " ({fits_all} if all {all} of its job's workers read through this daemon, as a DataLoader's workers in one \
             process do)"
        )
        .ok(),
        None => None,
    };
    write!(
        out,
        " — the check counts only the dense values every window surely holds, so a window that wide may still be \
         gathered a chunk at a time, more slowly (minibatchd_session_minibatches_in_parts_total); a smaller one less \
         often: open the session with window_chunks = {largest} or fewer (or a window_samples as small)"
    )
    .ok();
    if workers_here > 1 || largest_all.is_some() {
        out.push_str(", every worker of the job with the same window (its workers share one order)");
    }
    out.push_str(", or raise memory_limit_bytes");
    out
}

impl Refusal {
    /// The protocol's error code.
    #[must_use]
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Dataset(CatalogError::Indexing { .. }) => ErrorCode::DatasetIndexing,
            Self::Dataset(_) => ErrorCode::UnknownDataset,
            Self::Options(_) | Self::Sampling(_) | Self::Mixture { .. } => ErrorCode::InvalidOptions,
            Self::Resume(_) | Self::Lingering { .. } => ErrorCode::ResumeMismatch,
            Self::Registry(RegistryError::Busy(_) | RegistryError::NotOwner(_)) => ErrorCode::SessionBusy,
            Self::TooManySessions { .. }
            | Self::WindowTooLarge { .. }
            | Self::ChunkTooLarge { .. }
            | Self::MixtureTooLarge { .. }
            | Self::Registry(RegistryError::Memory { .. } | RegistryError::SamplingMemory { .. })
            | Self::HostMemory { .. }
            | Self::Ring(_)
            | Self::RingOverFileSizeLimit(_) => ErrorCode::ResourceExhausted,
            Self::Descriptor(_) | Self::Layout(_) | Self::Checkpoint(_) => ErrorCode::Internal,
            Self::Delivery(_) => ErrorCode::ShuttingDown,
            Self::Changed { .. } => ErrorCode::DataError,
        }
    }

    /// For a dataset that failed to open: its data error's place and kind.
    #[must_use]
    pub fn detail(&self) -> Option<ErrorDetail> {
        match self {
            Self::Dataset(CatalogError::Failed { source, .. }) | Self::Changed { source, .. } => {
                Some(error_detail(source))
            }
            _ => None,
        }
    }
}

/// What an `open` asks of the registry, everything about it already resolved.
#[derive(Clone)]
pub struct Request<'a> {
    /// The dataset.
    pub dataset: &'a str,
    /// The session name the client gave, if any.
    pub name: Option<&'a str>,
    /// The client's `resume` state, already checked against the dataset and options.
    pub resume: Option<&'a SessionState>,
    /// The state of a fresh session (position 0, or the first sample of the asked sweep).
    pub fresh: SessionState,
    /// Checks a lingering state against the dataset and options (`check_resume`, bound).
    pub fits: &'a dyn Fn(&SessionState) -> Result<(), ResumeError>,
    /// Bytes of the session's ring.
    pub ring_bytes: u64,
    /// The host-memory guard's verdict: `Some((shortfall, reserve))` when new sessions are refused.
    pub host_short: Option<(u64, u64)>,
    /// The peer uid of the connection (`SO_PEERCRED`): the session's owner.
    pub uid: u32,
    /// How many sessions may be open, in all and per uid.
    pub limits: SessionLimits,
    /// 64 random bits for a generated name (unguessable: the name is the key to resume).
    pub nonce: u64,
    /// The options to record for the checkpoint (`resume` is dropped, the name is set).
    pub options: &'a SessionOptions,
}

/// How many sessions may be open at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// In the daemon (`daemon.max_sessions`).
    pub total: usize,
    /// Per peer uid (`daemon.max_sessions_per_uid`).
    pub per_uid: usize,
}

/// An admitted session: its name and the state it starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// The session id (the ring header's `session_id`).
    pub id: u64,
    /// The session name, given or generated.
    pub name: String,
    /// The state the session starts from.
    pub start: SessionState,
    /// Where the state came from when the session resumed one the daemon kept by name
    /// (`opened.resumed`); `None` for a fresh session or the client's own `resume` state.
    pub resumed: Option<Resumed>,
    /// How many minibatches its trainer may have been given before this connection
    /// ([`SavedSession::given_up_to`]): a lingering session's, else the starting state's count
    /// (a client's own `resume` state says where that client is).
    pub given_up_to: u64,
    /// A warning for the client when a lingering session of this name was let go (its linger
    /// time ran out) and this one, named the same, starts afresh ([`Registry::take_forgotten`]).
    pub forgotten: Option<String>,
    /// A warning for the client when its `resume` (or `resume_job`) state is behind the session
    /// of this name that lingered: the minibatches between are delivered again
    /// ([`replay_note`]).
    pub replay: Option<String>,
    /// The lingering session it took over, if any (restored by [`withdraw`]).
    lingered: Option<Kept>,
    ring_bytes: u64,
}

impl Admitted {
    /// Bytes of ring memory reserved for it.
    #[must_use]
    pub fn ring_bytes(&self) -> u64 {
        self.ring_bytes
    }
}

/// Admits the session of `req` at `now`: claims the name, picks the starting state, reserves the
/// ring's memory and records the session for checkpoints.
///
/// # Errors
/// [`Refusal::Registry`] (busy name, no memory), [`Refusal::Lingering`] (a lingering state that
/// does not fit), [`Refusal::HostMemory`]. On any refusal the registry is as before.
pub fn admit(reg: &mut Registry, req: &Request<'_>, now: Instant) -> Result<Admitted, Refusal> {
    let (open, mine) = (reg.counts().0, reg.active_of(req.uid));
    if open >= req.limits.total {
        return Err(Refusal::TooManySessions {
            scope: "in the daemon",
            key: "max_sessions",
            count: open,
            limit: req.limits.total,
        });
    }
    if mine >= req.limits.per_uid {
        return Err(Refusal::TooManySessions {
            scope: "for this user",
            key: "max_sessions_per_uid",
            count: mine,
            limit: req.limits.per_uid,
        });
    }
    let id = reg.next_id();
    // A generated name is random: knowing it is what lets a client resume a session by name, so
    // it must not be predictable from anything another client sees.
    let name = req.name.map_or_else(|| generated_name(req.dataset, req.nonce), str::to_owned);
    let lingered = match reg.claim(&name, id, req.uid, now)? {
        Claim::Resume(kept) => Some(kept),
        Claim::Fresh => None,
    };
    if req.name.is_none() {
        reg.mark_generated(&name);
    }
    // Taken for every named open, so a note outlives no later session of that name.
    let forgotten = req.name.and_then(|n| reg.take_forgotten(n, req.uid, now));
    let forgotten = forgotten.filter(|_| lingered.is_none() && req.resume.is_none());
    let replay = match (req.resume, &lingered) {
        (Some(s), Some(kept)) => replay_note(&name, s, kept),
        _ => None,
    };
    let (start, resumed, given_up_to) = match (req.resume, &lingered) {
        (Some(s), _) => (s.clone(), None, s.minibatches),
        (None, Some(kept)) => {
            if let Err(source) = (req.fits)(&kept.state) {
                reg.park_kept(&name, kept.clone(), now);
                return Err(Refusal::Lingering { name, source });
            }
            (kept.state.clone(), Some(kept.origin.clone()), kept.given_up_to)
        }
        (None, None) => (req.fresh.clone(), None, req.fresh.minibatches),
    };
    let back = |reg: &mut Registry| match &lingered {
        Some(kept) => reg.park_kept(&name, kept.clone(), now),
        None => reg.unclaim(&name, forgotten.clone()),
    };
    if let Err(e) = reg.reserve(req.ring_bytes) {
        back(reg);
        return Err(e.into());
    }
    if let Some((shortfall, reserve)) = req.host_short {
        reg.unreserve(req.ring_bytes);
        back(reg);
        return Err(Refusal::HostMemory { shortfall, reserve });
    }
    // Neither `resume` nor `resume_job` is kept: the position and the job it continues are in
    // the state (found by a probe: a 61 KB `resume_job` kept in every lingering session's record
    // made each later `open`'s checkpoint write about 30 MB).
    let options = SessionOptions { resume: None, resume_job: None, session: Some(name.clone()), ..req.options.clone() };
    reg.record(SavedSession {
        name: name.clone(),
        options,
        state: start.clone(),
        owner: Some(req.uid),
        given_up_to: Some(given_up_to),
        // Set by the checkpoint's snapshot, from the connected session's entry.
        generated: false,
    });
    Ok(Admitted { id, name, start, resumed, given_up_to, forgotten, replay, lingered, ring_bytes: req.ring_bytes })
}

/// The warning for an open of `name` whose client's state `resume` is behind the session of that
/// name the daemon kept (`kept`), if it is: the client's state is what the session continues (a
/// trainer restored from an earlier checkpoint of its own wants exactly the data it had then),
/// but the minibatches its trainer may have been given since come again, and the client is told
/// (found by a probe: a named session reopened with an older state repeated 188 sequences
/// without a word).
fn replay_note(name: &str, resume: &SessionState, kept: &Kept) -> Option<String> {
    // Counts compare only within one run: a `resume_job` start counts from 0 again, so a session
    // of that name from the run it continues is no replay (found by a review).
    if resume.job != kept.state.job {
        return None;
    }
    let given = if kept.given_up_to == super::session::GIVEN_UNKNOWN {
        kept.state.minibatches
    } else {
        kept.given_up_to.max(kept.state.minibatches)
    };
    (resume.minibatches < given).then(|| {
        format!(
            "the session {name:?} that the daemon kept had delivered {given} minibatches ({} reported taken, to \
             position {}); this open's resume state is at minibatch {} (position {}), so the minibatches after it are \
             delivered again — a trainer restored from an earlier checkpoint gets what it had then; to continue where \
             the session stopped, open it by its name without resume or resume_job",
            kept.state.minibatches, kept.state.position, resume.minibatches, resume.position
        )
    })
}

/// How long an `open` whose session name is connected (or that the session limits refuse) waits
/// for a connection to end before it is refused `session_busy` (`resource_exhausted`): a trainer
/// restarted right after its predecessor was killed opens before the daemon has read the dead
/// connection's end (found by a soak probe: 14 of 232 such opens were refused, within a
/// millisecond of the kill).
pub const BUSY_GRACE: Duration = Duration::from_millis(500);

/// `attempt()` (an admission), tried again every few milliseconds while it is refused because its
/// name is connected or the session limits are reached, for up to [`BUSY_GRACE`]; the event loop
/// meanwhile handles the end of a connection that holds the name or counts against the limits.
///
/// # Errors
/// `attempt`'s refusal.
pub async fn retry_busy<T>(mut attempt: impl FnMut() -> Result<T, Refusal>) -> Result<T, Refusal> {
    let start = Instant::now();
    loop {
        match attempt() {
            // The dying connection's session still counts against the session limits too.
            Err(Refusal::Registry(RegistryError::Busy(_)) | Refusal::TooManySessions { .. })
                if start.elapsed() < BUSY_GRACE =>
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            other => return other,
        }
    }
}

/// Undoes `a` at `now`: the ring's memory goes back, and a lingering session it took over
/// lingers again as it was; a session that started afresh (or from the client's own state)
/// leaves nothing behind (its note, if it was told one, waits for the next `open`).
pub fn withdraw(reg: &mut Registry, a: &Admitted, now: Instant) {
    match &a.lingered {
        Some(kept) => reg.park_kept(&a.name, kept.clone(), now),
        None => reg.unclaim(&a.name, a.forgotten.clone()),
    }
    reg.unreserve(a.ring_bytes);
}

/// A session's generated name: `DATASET-` and the 16 hex digits of `nonce`, the dataset's name
/// cut to fit the 128 characters a session name may have and each character a session name may
/// not hold written `_` — so that a client can resume the session by the name it was given
/// (found by a probe: a dataset named with 217 characters gave a name that `open` refused).
fn generated_name(dataset: &str, nonce: u64) -> String {
    let room = MAX_SESSION_NAME - 17;
    let name: String = dataset
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "-_.:@".contains(c) { c } else { '_' })
        .take(room)
        .collect();
    format!("{name}-{nonce:016x}")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use minibatchd_client::protocol::STATE_VERSION;

    use super::*;

    /// A generated session name is one a client may open again: at most 128 characters of the
    /// set a session name allows, whatever the dataset's name.
    #[test]
    fn a_generated_name_is_a_valid_session_name() {
        for dataset in ["train", &"d".repeat(300), "my data/é", "a\u{7f}b"] {
            let name = generated_name(dataset, 0xfeed);
            assert!(name.len() <= MAX_SESSION_NAME, "{name}");
            assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:@".contains(&b)), "{name}");
            assert!(name.ends_with("-000000000000feed"), "{name}");
        }
        assert_eq!(generated_name("train", 1), "train-0000000000000001");
        assert_eq!(generated_name("my data/é", 1), "my_data__-0000000000000001");
    }

    fn state(position: u64, options_hash: &str) -> SessionState {
        SessionState {
            version: STATE_VERSION,
            dataset: "d".into(),
            position,
            minibatches: position / 10,
            data_identity: "id".into(),
            options_hash: options_hash.into(),
            job: None,
            worker: None,
            mixture: None,
            equal_steps_minibatch: None,
            decode_digest: None,
        }
    }

    fn fits(s: &SessionState) -> Result<(), ResumeError> {
        if s.options_hash == "opts" {
            Ok(())
        } else {
            Err(ResumeError::Options)
        }
    }

    fn request<'a>(name: Option<&'a str>, ring_bytes: u64, options: &'a SessionOptions) -> Request<'a> {
        Request {
            dataset: "d",
            name,
            resume: None,
            fresh: state(0, "opts"),
            fits: &fits,
            ring_bytes,
            host_short: None,
            uid: 1000,
            limits: SessionLimits { total: 100, per_uid: 10 },
            nonce: 0x0123_4567_89ab_cdef,
            options,
        }
    }

    fn registry() -> Registry {
        // 1000 bytes, 250 of them the cache's floor: 750 for rings.
        Registry::new(1000, 250, Duration::from_secs(60))
    }

    #[test]
    fn a_fresh_session_gets_a_generated_name_its_memory_and_a_checkpoint_record() {
        let mut reg = registry();
        let options = SessionOptions::default();
        let a = admit(&mut reg, &request(None, 400, &options), Instant::now()).expect("admitted");
        assert_eq!(a.name, "d-0123456789abcdef", "the nonce, not the daemon id or a counter");
        assert_eq!(a.start, state(0, "opts"));
        assert_eq!(reg.rings_bytes(), 400);
        let saved = reg.snapshot(Instant::now());
        assert_eq!(saved.len(), 1);
        assert_eq!(saved[0].options.session.as_deref(), Some(a.name.as_str()));
    }

    /// Found by a probe: the record kept an `open`'s `resume_job` (up to 61 KB), and 256 such
    /// lingering sessions made every later `open` write a checkpoint of about 30 MB. The state
    /// carries the job; the options keep neither `resume` nor `resume_job`.
    #[test]
    fn a_sessions_record_keeps_no_resume_states() {
        let mut reg = registry();
        let job = vec![state(0, "opts"); 50];
        let options =
            SessionOptions { resume_job: Some(job), resume: Some(state(0, "opts")), ..SessionOptions::default() };
        admit(&mut reg, &request(Some("s"), 100, &options), Instant::now()).expect("admitted");
        let saved = reg.snapshot(Instant::now());
        assert_eq!((saved[0].options.resume.as_ref(), saved[0].options.resume_job.as_ref()), (None, None));
        let bytes = serde_json::to_vec(&saved[0]).expect("json").len();
        assert!(bytes < 2_000, "{bytes} bytes");
    }

    #[test]
    fn a_lingering_session_resumes_by_name_and_withdraw_puts_it_back() {
        let mut reg = registry();
        let t0 = Instant::now();
        let options = SessionOptions::default();
        let first = admit(&mut reg, &request(Some("s"), 100, &options), t0).expect("first");
        reg.park("s", state(70, "opts"), t0);
        reg.unreserve(first.ring_bytes());
        let again = admit(&mut reg, &request(Some("s"), 100, &options), t0).expect("resumed");
        assert_eq!(again.start.position, 70);
        withdraw(&mut reg, &again, t0);
        assert_eq!(reg.rings_bytes(), 0);
        assert_eq!(reg.counts(), (0, 1), "lingering again");
        let third = admit(&mut reg, &request(Some("s"), 100, &options), t0).expect("resumed again");
        assert_eq!(third.start.position, 70, "withdraw kept the lingering state");
    }

    #[test]
    fn a_resume_state_behind_the_lingering_session_of_its_name_is_served_and_told() {
        let mut reg = registry();
        let t0 = Instant::now();
        let options = SessionOptions::default();
        let first = admit(&mut reg, &request(Some("s"), 100, &options), t0).expect("first");
        reg.park("s", state(100, "opts"), t0); // 10 minibatches
        reg.unreserve(first.ring_bytes());
        // The client's own older state wins (a trainer restored from its own checkpoint), and is
        // told that minibatches 5..10 come again (found by a probe: no word before).
        let older = state(50, "opts");
        let req = Request { resume: Some(&older), ..request(Some("s"), 100, &options) };
        let again = admit(&mut reg, &req, t0).expect("admitted");
        assert_eq!((again.start.position, again.resumed.clone()), (50, None));
        let note = again.replay.clone().expect("told");
        assert!(note.contains("delivered 10 minibatches") && note.contains("at minibatch 5"), "{note}");
        reg.park("s", state(100, "opts"), t0);
        reg.unreserve(again.ring_bytes());
        // A `resume_job` start counts from 0 in another run than the lingering session's: no
        // replay to tell (found by a review).
        let job = SessionState {
            job: Some(minibatchd_client::protocol::JobBase { positions: vec![40, 60] }),
            ..state(0, "opts")
        };
        let req = Request { resume: Some(&job), ..request(Some("s"), 100, &options) };
        let continued = admit(&mut reg, &req, t0).expect("admitted");
        assert_eq!(continued.replay, None);
        reg.park("s", state(100, "opts"), t0);
        reg.unreserve(continued.ring_bytes());
        // A state as far as the lingering one, or further (the daemon's checkpoint was older),
        // repeats nothing.
        for position in [100, 120] {
            let st = state(position, "opts");
            let req = Request { resume: Some(&st), ..request(Some("s"), 100, &options) };
            let same = admit(&mut reg, &req, t0).expect("admitted");
            assert_eq!(same.replay, None, "{position}");
            reg.park("s", state(100, "opts"), t0);
            reg.unreserve(same.ring_bytes());
        }
    }

    #[test]
    fn a_named_open_after_its_lingering_session_expired_is_warned_once() {
        let mut reg = registry(); // 60 s of linger
        let t0 = Instant::now();
        let options = SessionOptions::default();
        let first = admit(&mut reg, &request(Some("s"), 100, &options), t0).expect("first");
        assert_eq!(first.forgotten, None, "a first open by a name is no news");
        reg.park("s", state(70, "opts"), t0);
        reg.unreserve(first.ring_bytes());
        let later = t0 + Duration::from_secs(90);
        let again = admit(&mut reg, &request(Some("s"), 100, &options), later).expect("fresh");
        assert_eq!(again.start.position, 0, "the lingering state is gone");
        let note = again.forgotten.clone().expect("told that it starts afresh");
        assert!(note.contains("\"s\"") && note.contains("30 s ago") && note.contains("60 s"), "{note}");
        reg.park("s", state(5, "opts"), later);
        reg.unreserve(again.ring_bytes());
        let resumed = admit(&mut reg, &request(Some("s"), 100, &options), later).expect("resumed");
        assert_eq!(
            (resumed.start.position, resumed.forgotten.as_deref()),
            (5, None),
            "a resume by name is no news either"
        );
        // A generated name, or a resume the client brings, needs no warning.
        reg.park("s", state(5, "opts"), later);
        reg.unreserve(resumed.ring_bytes());
        let much_later = later + Duration::from_secs(120);
        let mut with_state = request(Some("s"), 100, &options);
        let saved = state(5, "opts");
        with_state.resume = Some(&saved);
        let own = admit(&mut reg, &with_state, much_later).expect("its own state");
        assert_eq!((own.start.position, own.forgotten), (5, None));
    }

    #[test]
    fn the_note_of_a_session_let_go_is_its_owners_and_outlives_a_refused_open() {
        let mut reg = registry(); // 60 s of linger, 750 bytes for rings
        let t0 = Instant::now();
        let options = SessionOptions::default();
        let first = admit(&mut reg, &request(Some("s"), 100, &options), t0).expect("first");
        reg.park("s", state(70, "opts"), t0);
        reg.unreserve(first.ring_bytes());
        let later = t0 + Duration::from_secs(90);
        // The owner's open is refused (its ring does not fit): the note is not used up, and
        // the name is not parked with a fresh start that a retry would resume untold.
        let too_big = admit(&mut reg, &request(Some("s"), 10_000, &options), later);
        assert!(too_big.is_err());
        assert_eq!(reg.counts(), (0, 0), "a refused open leaves no session behind, lingering or not");
        let retry = admit(&mut reg, &request(Some("s"), 100, &options), later).expect("retried");
        assert_eq!((retry.resumed.clone(), retry.start.position), (None, 0));
        assert!(retry.forgotten.as_deref().is_some_and(|n| n.contains("ran out")), "{:?}", retry.forgotten);
        // Withdrawn after admission (a ring or checkpoint failure): the same.
        withdraw(&mut reg, &retry, later);
        // Another user opening the name is not told of the owner's session, nor uses the note up.
        let other = Request { uid: 2000, ..request(Some("s"), 100, &options) };
        let theirs = admit(&mut reg, &other, later).expect("another user's fresh session");
        assert_eq!(theirs.forgotten, None);
        let note = reg.take_forgotten("s", 1000, later).expect("still the owner's to be told");
        assert!(note.contains("ran out"), "{note}");
    }

    #[test]
    fn a_named_open_after_the_checkpoint_was_lost_is_warned_for_a_linger_time() {
        let mut reg = registry(); // 60 s of linger
        let t0 = Instant::now();
        let options = SessionOptions::default();
        reg.checkpoint_lost(std::path::Path::new("/state/checkpoint.json.unreadable"), t0);
        let a = admit(&mut reg, &request(Some("s"), 100, &options), t0 + Duration::from_secs(5)).expect("fresh");
        let note = a.forgotten.clone().expect("told");
        assert!(note.contains("checkpoint.json.unreadable") && note.contains("\"s\""), "{note}");
        reg.unreserve(a.ring_bytes());
        let unnamed = admit(&mut reg, &request(None, 100, &options), t0).expect("unnamed");
        assert_eq!(unnamed.forgotten, None, "a generated name was in no checkpoint");
        reg.unreserve(unnamed.ring_bytes());
        let late = admit(&mut reg, &request(Some("t"), 100, &options), t0 + Duration::from_secs(61)).expect("late");
        assert_eq!(late.forgotten, None, "its sessions would have expired by now");
    }

    #[test]
    fn a_busy_name_is_refused_and_changes_nothing() {
        let mut reg = registry();
        let options = SessionOptions::default();
        let _held = admit(&mut reg, &request(Some("s"), 100, &options), Instant::now()).expect("first");
        let e = admit(&mut reg, &request(Some("s"), 100, &options), Instant::now()).expect_err("busy");
        assert_eq!(e.code(), ErrorCode::SessionBusy);
        assert_eq!(reg.rings_bytes(), 100);
    }

    #[test]
    fn a_lingering_state_of_other_options_is_refused_and_keeps_lingering() {
        let mut reg = registry();
        let t0 = Instant::now();
        let options = SessionOptions::default();
        let _ = admit(&mut reg, &request(Some("s"), 0, &options), t0).expect("first");
        reg.park("s", state(50, "other"), t0);
        let e = admit(&mut reg, &request(Some("s"), 100, &options), t0).expect_err("mismatch");
        assert_eq!(e.code(), ErrorCode::ResumeMismatch);
        assert_eq!(e.to_string(), format!("session 's': {}", ResumeError::Options));
        assert_eq!((reg.counts(), reg.rings_bytes()), ((0, 1), 0));
        let saved = reg.snapshot(t0);
        assert_eq!(saved[0].state.position, 50, "the lingering state is kept as it was");
    }

    #[test]
    fn no_memory_or_a_short_host_refuses_without_reserving() {
        let mut reg = registry();
        let options = SessionOptions::default();
        let e = admit(&mut reg, &request(Some("big"), 800, &options), Instant::now()).expect_err("too big");
        assert_eq!(e.code(), ErrorCode::ResourceExhausted);
        assert!(matches!(e, Refusal::Registry(RegistryError::Memory { available: 750, .. })), "{e}");
        let mut short = request(Some("s"), 100, &options);
        short.host_short = Some((5, 1 << 20));
        let e = admit(&mut reg, &short, Instant::now()).expect_err("host short");
        assert!(matches!(e, Refusal::HostMemory { shortfall: 5, .. }), "{e}");
        assert_eq!(reg.rings_bytes(), 0);
        assert_eq!(reg.counts().0, 0, "no session stays connected");
    }

    #[test]
    fn the_clients_resume_state_wins_over_a_lingering_one() {
        let mut reg = registry();
        let t0 = Instant::now();
        let options = SessionOptions::default();
        let _ = admit(&mut reg, &request(Some("s"), 0, &options), t0).expect("first");
        reg.park("s", state(50, "opts"), t0);
        let mine = state(90, "opts");
        let mut req = request(Some("s"), 0, &options);
        req.resume = Some(&mine);
        assert_eq!(admit(&mut reg, &req, t0).expect("admitted").start.position, 90);
    }

    #[test]
    fn another_uid_cannot_resume_take_over_or_squat_a_session() {
        let mut reg = registry();
        let t0 = Instant::now();
        let options = SessionOptions::default();
        let mine = admit(&mut reg, &request(Some("job"), 0, &options), t0).expect("mine");
        let mut theirs = request(Some("job"), 0, &options);
        theirs.uid = 2000;
        // Connected: busy for everyone.
        let e = admit(&mut reg, &theirs, t0).expect_err("connected");
        assert_eq!(e.code(), ErrorCode::SessionBusy);
        // The owner's job crashes: the session lingers, and only its owner may resume it.
        reg.park(&mine.name, state(40, "opts"), t0);
        let e = admit(&mut reg, &theirs, t0).expect_err("not theirs");
        assert!(matches!(e, Refusal::Registry(RegistryError::NotOwner(ref n)) if n == "job"), "{e}");
        assert_eq!(e.code(), ErrorCode::SessionBusy);
        assert_eq!(reg.counts(), (0, 1), "still lingering, untouched");
        let back = admit(&mut reg, &request(Some("job"), 0, &options), t0).expect("the owner resumes");
        assert_eq!(back.start.position, 40);
        let saved = reg.snapshot(t0);
        assert_eq!(saved[0].owner, Some(1000), "the checkpoint keeps the owner");
    }

    #[test]
    fn a_session_from_an_ownerless_checkpoint_is_bound_to_its_first_claimer() {
        let mut reg = registry();
        let t0 = Instant::now();
        let options = SessionOptions::default();
        let old = SavedSession {
            name: "old".into(),
            options: options.clone(),
            state: state(9, "opts"),
            owner: None,
            given_up_to: None,
            generated: false,
        };
        assert_eq!(reg.restore(vec![old], 1_700_000_000, false, t0), 1);
        let mut first = request(Some("old"), 0, &options);
        first.uid = 3000;
        let a = admit(&mut reg, &first, t0).expect("the first claimer resumes it");
        assert_eq!(a.start.position, 9);
        reg.park("old", state(11, "opts"), t0);
        let e = admit(&mut reg, &request(Some("old"), 0, &options), t0).expect_err("now bound to uid 3000");
        assert_eq!(e.code(), ErrorCode::SessionBusy);
    }

    #[test]
    fn sessions_are_limited_in_all_and_per_uid() {
        let mut reg = registry();
        let options = SessionOptions::default();
        let mut req = request(None, 0, &options);
        req.limits = SessionLimits { total: 3, per_uid: 2 };
        for nonce in 0..2 {
            req.nonce = nonce;
            admit(&mut reg, &req, Instant::now()).expect("within the per-uid limit");
        }
        req.nonce = 7;
        let e = admit(&mut reg, &req, Instant::now()).expect_err("per uid");
        assert!(matches!(e, Refusal::TooManySessions { key: "max_sessions_per_uid", count: 2, limit: 2, .. }), "{e}");
        assert_eq!(e.code(), ErrorCode::ResourceExhausted);
        req.uid = 2000;
        admit(&mut reg, &req, Instant::now()).expect("another uid");
        req.uid = 3000;
        req.nonce = 8;
        let e = admit(&mut reg, &req, Instant::now()).expect_err("in all");
        assert!(matches!(e, Refusal::TooManySessions { key: "max_sessions", count: 3, limit: 3, .. }), "{e}");
    }
}
