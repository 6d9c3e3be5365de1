//! Whether a saved state resumes the session being opened ([`check_resume`],
//! [`check_mixture_resume`]), and where mixtures' epochs start ([`EpochStarts`]).

use std::collections::VecDeque;

use minibatchd_client::protocol::{hex64, MixtureState, SessionState, WorkerOf, STATE_VERSION};

/// Why a saved state cannot resume the session being opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResumeError {
    /// With equal steps, the state's epoch was cut for minibatches of another size.
    #[error(
        "the state's epoch has equal steps counted for minibatch_size {saved}, not {opened}: resume it at minibatch_size {saved} (at another size the workers would get unequal step counts), or continue the run at the new size with resume_job"
    )]
    EqualStepsMinibatch {
        /// The state's minibatch size.
        saved: u64,
        /// The session's.
        opened: u64,
    },
    /// A state format this daemon does not read.
    #[error("state version {0} is not supported (expected {STATE_VERSION})")]
    Version(u32),
    /// The state is of another dataset.
    #[error("the state belongs to dataset '{saved}', not '{opened}'")]
    Dataset {
        /// The state's dataset.
        saved: String,
        /// The dataset being opened.
        opened: String,
    },
    /// The data changed since the state was saved.
    #[error("the state was saved on other data (identity {saved} vs {current}): the dataset's files, their contents, sizes, nominal sequence lengths or chunking differ — a file replaced or rewritten since, or other files")]
    Data {
        /// The state's data identity.
        saved: String,
        /// The dataset's identity now.
        current: String,
    },
    /// The order-shaping options differ.
    #[error(
        "the state was saved with other sampling options (randomize, window, seed, epoch limit, equal_steps or tail)"
    )]
    Options,
    /// A mixture's state given to a dataset's session, or the reverse.
    #[error("the state is of a {saved}'s session, and '{opened}' is a {kind}")]
    Kind {
        /// `mixture` or `dataset`: what the state is of.
        saved: &'static str,
        /// The name being opened.
        opened: String,
        /// What that name is.
        kind: &'static str,
    },
    /// A mixture's state of another number of sources.
    #[error("the state is of a mixture of {saved} sources, '{opened}' has {current}")]
    Sources {
        /// Sources in the state.
        saved: usize,
        /// Sources of the mixture now.
        current: usize,
        /// The mixture.
        opened: String,
    },
    /// The state of one of several workers, given to another worker or at another worker count.
    #[error(
        "the state is {saved}'s and this session is {}: a worker's position is its own (workers stop at \
         different places) — resume each worker from its own state at the same worker count, or give every \
         worker's state as resume_job to change the worker count",
        opened.map_or_else(|| "a session of one worker".to_owned(), |w| w.to_string())
    )]
    Worker {
        /// The state's worker.
        saved: WorkerOf,
        /// The session being opened (`None`: one worker).
        opened: Option<WorkerOf>,
    },
    /// A state's worker that no session writes: a rank past its count, or a count under 2 (a
    /// one-worker session's state has no worker).
    #[error(
        "the state's worker (rank {}, of {}) is not one a session writes: a state of one of several workers has \
         a rank below its count of at least 2 (an edited state?)",
        saved.rank,
        saved.of
    )]
    WorkerInvalid {
        /// The state's worker.
        saved: WorkerOf,
    },
    /// `resume_job`'s states had equal steps counted for different minibatch sizes: not one run.
    #[error(
        "resume_job's state {index} had equal steps counted for minibatch_size {size}, state 0 for {first}: the \
         workers of one run open with one minibatch_size — give the states of one run (a job whose workers \
         disagreed on it gave them unequal step counts)"
    )]
    JobMixedMinibatch {
        /// The first state that differs.
        index: usize,
        /// Its minibatch size.
        size: u64,
        /// State 0's.
        first: u64,
    },
    /// A `resume_job` state that names no worker among states that name theirs.
    #[error(
        "resume_job's state {index} of {count} names no worker (a one-worker session's, or saved by a build before \
         states named their worker) while others name theirs: give the state of every worker of one run, in rank \
         order, each saved by this build"
    )]
    JobUnnamed {
        /// Where the state is in the list.
        index: usize,
        /// How many states were given.
        count: usize,
    },
    /// `resume_job` states that are not every worker's of one run in rank order.
    #[error(
        "resume_job's state {index} of {count} is {saved}'s: give the state of every worker of one run, in rank order"
    )]
    JobOrder {
        /// Where the state is in the list.
        index: usize,
        /// How many states were given.
        count: usize,
        /// The state's worker.
        saved: WorkerOf,
    },
    /// A position past the last one a session with these options reaches.
    #[error(
        "the state's position {position} is past the last a session with these options reaches ({latest}): \
         not a state of such a session"
    )]
    PastEpoch {
        /// The state's position.
        position: u64,
        /// [`minibatchd_engine::sampling::Sampler::latest_position`].
        latest: u64,
    },
    /// A position (the state's, or a job worker's) before the epoch's first: a session opened
    /// with `sweep = k` never stands before sweep `k`'s start.
    #[error(
        "position {position} of the state is before the first a session with these options stands at ({earliest}, \
         the start of its sweep): not a state of such a session"
    )]
    BeforeEpoch {
        /// The earliest position in the state.
        position: u64,
        /// [`minibatchd_engine::sampling::Sampler::earliest_position`].
        earliest: u64,
    },
    /// A position (the state's, or a job worker's) inside a sequence: a session stops only where
    /// one starts (found by a probe: an edited state one sample on lost a sequence unsaid).
    #[error(
        "position {position} of the state is inside a sequence (the next starts at {next}): a session stops only \
         where a sequence starts, so not a state of such a session"
    )]
    InsideSequence {
        /// The position in the state.
        position: u64,
        /// Where the next sequence starts.
        next: u64,
    },
    /// A count of minibatches no session reaches.
    #[error("the state counts {0} minibatches taken, more than a session takes (2^62)")]
    Minibatches(u64),
    /// `resume_job` with states of a run that itself continued another one and is still within
    /// that run's ragged band.
    #[error("the states continue an earlier run and the earliest ({earliest}) is still before the end of its ragged band ({band_end}): resume at the same worker count until every worker is past {band_end}, or resume each worker by its own state")]
    JobBand {
        /// The earliest position of the states.
        earliest: u64,
        /// The latest position of the run they continue.
        band_end: u64,
    },
}

/// Checks a `resume` state against the session being opened.
///
/// # Errors
/// [`ResumeError`]: what differs.
///
/// `identity` is the dataset's ([`minibatchd_engine::dataset::Dataset::identity`]); `legacy` the
/// one states written before local files' contents were part of it carry
/// ([`minibatchd_engine::dataset::Dataset::legacy_identity`]), also accepted.
pub fn check_resume(
    state: &SessionState,
    dataset: &str,
    identity: u64,
    legacy: u64,
    options: u64,
    equal_steps_minibatch: Option<u64>,
) -> Result<(), ResumeError> {
    if state.version != STATE_VERSION {
        return Err(ResumeError::Version(state.version));
    }
    if state.dataset != dataset {
        return Err(ResumeError::Dataset { saved: state.dataset.clone(), opened: dataset.to_owned() });
    }
    if state.mixture.is_some() {
        return Err(ResumeError::Kind { saved: "mixture", opened: dataset.to_owned(), kind: "dataset" });
    }
    if state.data_identity == hex64(legacy) && legacy != identity {
        tracing::info!(dataset, identity = %state.data_identity, "a state written before file contents were part of the data identity: accepted by its earlier identity");
    } else if state.data_identity != hex64(identity) {
        return Err(ResumeError::Data { saved: state.data_identity.clone(), current: hex64(identity) });
    }
    if state.options_hash != hex64(options) {
        return Err(ResumeError::Options);
    }
    if state.minibatches > MAX_MINIBATCHES {
        return Err(ResumeError::Minibatches(state.minibatches));
    }
    if let (Some(saved), Some(opened)) = (state.equal_steps_minibatch, equal_steps_minibatch) {
        if saved != opened {
            return Err(ResumeError::EqualStepsMinibatch { saved, opened });
        }
    }
    Ok(())
}

/// Checks that a `resume` state (or a lingering session's) is of the worker being opened
/// (`opened`; `None`: a session of one worker): a state of one of several workers resumes only
/// that worker at that worker count, a one-worker session's state any.
///
/// # Errors
/// [`ResumeError::Worker`], or [`ResumeError::WorkerInvalid`] for a worker no session writes.
pub fn check_worker(state: &SessionState, opened: Option<WorkerOf>) -> Result<(), ResumeError> {
    match state.worker {
        Some(saved) if saved.of < 2 || saved.rank >= saved.of => Err(ResumeError::WorkerInvalid { saved }),
        Some(saved) if Some(saved) != opened => Err(ResumeError::Worker { saved, opened }),
        _ => Ok(()),
    }
}

/// Checks that `resume_job`'s states are those of every worker of one run, in rank order (where
/// they say which worker they are: states written before states said it are taken as given).
/// Where any state names its worker, one that names none — a one-worker session's, or an older
/// build's — is refused (found by a probe: a one-worker state was taken as a job's worker 0
/// beside workers 1 and 2 of 3).
///
/// # Errors
/// [`ResumeError::JobOrder`], [`ResumeError::JobUnnamed`].
pub fn check_job_order(states: &[SessionState]) -> Result<(), ResumeError> {
    let count = states.len();
    let named = states.iter().any(|s| s.worker.is_some());
    for (index, s) in states.iter().enumerate() {
        let saved = match s.worker {
            Some(saved) => saved,
            // Alone, a one-worker run's whole job (of one state).
            None if named && count > 1 => return Err(ResumeError::JobUnnamed { index, count }),
            None => continue,
        };
        if saved.rank != index as u64 || saved.of != count as u64 {
            return Err(ResumeError::JobOrder { index, count, saved });
        }
    }
    // One run's workers count equal steps for one minibatch size (found by a probe: states of
    // workers opened at 60 and at 120 were taken as one run's).
    let first = states.first().and_then(|s| s.equal_steps_minibatch);
    for (index, s) in states.iter().enumerate() {
        if let (Some(first), Some(size)) = (first, s.equal_steps_minibatch) {
            if size != first {
                return Err(ResumeError::JobMixedMinibatch { index, size, first });
            }
        }
    }
    Ok(())
}

/// Most minibatches a state may count (a session numbers its minibatches on from there).
pub const MAX_MINIBATCHES: u64 = 1 << 62;

/// Checks a `resume` state against the mixture session being opened: `identity` is the
/// mixture's ([`super::super::mixture`]: its sources' data identities in order), `options` the hash of
/// what shapes its order besides the weights (which may change across a resume), `sources` its
/// number of sources.
///
/// # Errors
/// [`ResumeError`]: what differs.
pub fn check_mixture_resume(
    state: &SessionState,
    mixture: &str,
    identity: u64,
    options: u64,
    sources: usize,
) -> Result<(), ResumeError> {
    if state.version != STATE_VERSION {
        return Err(ResumeError::Version(state.version));
    }
    if state.dataset != mixture {
        return Err(ResumeError::Dataset { saved: state.dataset.clone(), opened: mixture.to_owned() });
    }
    let Some(m) = &state.mixture else {
        return Err(ResumeError::Kind { saved: "dataset", opened: mixture.to_owned(), kind: "mixture" });
    };
    if state.job.is_some() {
        return Err(ResumeError::Kind { saved: "dataset", opened: mixture.to_owned(), kind: "mixture" });
    }
    if m.sources.len() != sources {
        return Err(ResumeError::Sources { saved: m.sources.len(), current: sources, opened: mixture.to_owned() });
    }
    if state.minibatches > MAX_MINIBATCHES {
        return Err(ResumeError::Minibatches(state.minibatches));
    }
    if state.data_identity != hex64(identity) {
        return Err(ResumeError::Data { saved: state.data_identity.clone(), current: hex64(identity) });
    }
    if state.options_hash != hex64(options) {
        return Err(ResumeError::Options);
    }
    Ok(())
}

/// Where epochs of mixtures start, as sessions opened with `sweep` walked to them
/// (`control::mixture`): each key (a mixture's data, order options, minibatch size and weights)
/// keeps the epochs found, so that the session of epoch `k + 1` walks one epoch from epoch `k`'s
/// start instead of every epoch from the first. Bounded: [`EpochStarts::KEYS`] keys of
/// [`EpochStarts::EPOCHS`] epochs each, the oldest going first.
#[derive(Debug, Default)]
pub struct EpochStarts {
    pub(super) by_key: VecDeque<(u64, std::collections::BTreeMap<u64, MixtureState>)>,
}

impl EpochStarts {
    /// Most keys kept.
    pub const KEYS: usize = 64;
    /// Most epochs kept per key.
    pub const EPOCHS: usize = 16;

    /// The latest epoch at or before `epoch` whose start is known for `key`, and its state.
    #[must_use]
    pub fn nearest(&self, key: u64, epoch: u64) -> Option<(u64, MixtureState)> {
        let (_, starts) = self.by_key.iter().find(|(k, _)| *k == key)?;
        starts.range(..=epoch).next_back().map(|(&e, s)| (e, s.clone()))
    }

    /// Epoch `epoch` of `key` starts at `state`.
    pub fn insert(&mut self, key: u64, epoch: u64, state: MixtureState) {
        let at = if let Some(at) = self.by_key.iter().position(|(k, _)| *k == key) {
            at
        } else {
            if self.by_key.len() >= Self::KEYS {
                self.by_key.pop_front();
            }
            self.by_key.push_back((key, std::collections::BTreeMap::new()));
            self.by_key.len() - 1
        };
        let starts = &mut self.by_key[at].1;
        starts.insert(epoch, state);
        while starts.len() > Self::EPOCHS {
            // The earliest go first: later sessions ask for later epochs.
            let first = *starts.keys().next().unwrap_or(&epoch);
            starts.remove(&first);
        }
    }
}
