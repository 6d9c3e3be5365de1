//! What a sampler is asked for — the randomization [`Window`], the [`EpochLimit`], the
//! [`SamplingOptions`] of one worker — and what a sampler refuses ([`SamplingError`]).

use super::{MAX_EPOCH_SAMPLES, MAX_WALK_SEQUENCES};

/// The randomization window (CNTK `randomization_window_in_chunks` / `_in_samples`).
///
/// A chunk window of 0 means "no randomization": CNTK's V2 API maps both windows being 0 to
/// `randomize = false`, so the sampler then uses file order like `randomize = false`. A sample
/// window of 0 is CNTK's "no sample window": the chunk window applies ([`Window::from_options`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// Window width in chunks (V2 default: 128).
    Chunks(usize),
    /// Window width in nominal samples.
    Samples(u64),
}

/// CNTK V2's `randomization_window_in_chunks` default: 4 GiB / 32 MiB.
pub const DEFAULT_WINDOW_CHUNKS: usize = 128;

impl Window {
    /// The window CNTK's `MinibatchSource` uses for the given windows (the caller has rejected
    /// both being set): `window_samples = N > 0` is a sample window; otherwise the chunk window
    /// applies — `window_chunks` if given, else `default` when that is a chunk window, else
    /// [`DEFAULT_WINDOW_CHUNKS`]. So `window_samples = 0` is not "no randomization" (only both
    /// windows 0 is, `window_chunks = 0`), as in `MinibatchSource.cpp`.
    #[must_use]
    pub fn from_options(chunks: Option<usize>, samples: Option<u64>, default: Window) -> Window {
        match (chunks, samples) {
            (Some(c), _) => Window::Chunks(c),
            (None, Some(n)) if n > 0 => Window::Samples(n),
            (None, Some(_)) => match default {
                Window::Chunks(_) => default,
                Window::Samples(_) => Window::Chunks(DEFAULT_WINDOW_CHUNKS),
            },
            (None, None) => default.normalized(),
        }
    }

    /// `Samples(0)` as the chunk window CNTK would use ([`DEFAULT_WINDOW_CHUNKS`]); any other
    /// window unchanged.
    #[must_use]
    pub fn normalized(self) -> Window {
        match self {
            Window::Samples(0) => Window::Chunks(DEFAULT_WINDOW_CHUNKS),
            w => w,
        }
    }
}

/// How long the (single, V2) epoch lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochLimit {
    /// `max_samples = INFINITELY_REPEAT`: an epoch of `u64::MAX / 2` samples, as CNTK.
    Infinite,
    /// `max_samples = FULL_DATA_SWEEP`: one sweep.
    FullSweep,
    /// `max_sweeps = k`: `k * sweep_size` samples.
    Sweeps(u64),
    /// `max_samples = n`: stops at the first sequence starting at or after sample `n`.
    Samples(u64),
    /// Exactly sweep `k` (0-based): the epoch starts at the first sample of sweep `k` and ends
    /// with it. Not a CNTK option: it is CNTK's `max_sweeps = k + 1` restored to position
    /// `k × sweep size`, which is what a trainer's epoch `k` is.
    Sweep(u64),
}

/// As the session options say it (an error's words, not Rust's).
impl std::fmt::Display for EpochLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Infinite => f.write_str("max_samples = INFINITELY_REPEAT"),
            Self::FullSweep => f.write_str("max_samples = FULL_DATA_SWEEP"),
            Self::Sweeps(k) => write!(f, "max_sweeps = {k}"),
            Self::Samples(n) => write!(f, "max_samples = {n}"),
            Self::Sweep(k) => write!(f, "sweep = {k}"),
        }
    }
}

/// Everything that decides the sampling order and this worker's share of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SamplingOptions {
    /// Block-randomize (`true`) or keep file order (`false`).
    pub randomize: bool,
    /// Randomization window; ignored unless `randomize`.
    pub window: Window,
    /// CNTK `randomization_seed`: sweep `k` is randomized with seed `seed + k`.
    pub seed: u64,
    /// Epoch length.
    pub limit: EpochLimit,
    /// Number of data-parallel workers (≥ 1).
    pub num_workers: usize,
    /// This worker's rank (`< num_workers`).
    pub rank: usize,
}

impl SamplingOptions {
    /// The sweep a fresh sampler with these options starts in: `k` for [`EpochLimit::Sweep`]`(k)`,
    /// else 0.
    #[must_use]
    pub fn first_sweep(&self) -> u64 {
        match self.limit {
            EpochLimit::Sweep(k) => k,
            _ => 0,
        }
    }
}

/// Invalid sampler configuration or timeline.
#[derive(Debug, thiserror::Error)]
pub enum SamplingError {
    /// `num_workers` is 0.
    #[error("num_workers must be at least 1")]
    NoWorkers,
    /// `rank >= num_workers`.
    #[error("worker rank {rank} is out of range for {num_workers} worker(s)")]
    RankOutOfRange {
        /// The rank given.
        rank: usize,
        /// The number of workers given.
        num_workers: usize,
    },
    /// The timeline holds no sequence.
    #[error("the timeline holds no sequences")]
    EmptyTimeline,
    /// `chunk_start` does not describe contiguous chunks covering all sequences.
    #[error("malformed timeline: {reason}")]
    MalformedChunks {
        /// What is wrong with `chunk_start`.
        reason: &'static str,
    },
    /// A chunk without sequences (the index pass never produces one).
    #[error("chunk {chunk} holds no sequences")]
    EmptyChunk {
        /// Original chunk index.
        chunk: usize,
    },
    /// A sequence of nominal length 0 (fatal in CNTK's index pass too).
    #[error("sequence {seq} has a nominal length of 0 samples")]
    ZeroLengthSequence {
        /// Global sequence index.
        seq: usize,
    },
    /// More sequences than `u32` ids can name.
    #[error("the timeline holds {count} sequences; at most 4294967295 are supported")]
    TooManySequences {
        /// Number of sequences.
        count: usize,
    },
    /// Equal step counts were asked for an infinite epoch.
    #[error("equal step counts need a finite epoch (max_samples, max_sweeps, full_sweep or sweep)")]
    EqualStepsNeedAFiniteEpoch,
    /// Equal step counts would walk more sequences than [`MAX_WALK_SEQUENCES`]: every worker's
    /// epoch is walked once to count its minibatches.
    #[error(
        "equal step counts over this epoch would walk {walk} sequences ({workers} worker(s), each over an epoch of about {per_worker} sequences); at most {max} are walked: use a shorter epoch (max_sweeps, max_samples) or fewer workers",
        max = MAX_WALK_SEQUENCES
    )]
    EqualStepsTooCostly {
        /// Sequences the walk would visit (saturated).
        walk: u64,
        /// Workers walked.
        workers: usize,
        /// Sequences of one worker's walk (saturated).
        per_worker: u64,
    },
    /// The positions of a job's workers ([`super::Sampler::resume_job`]) lie so far apart that finding
    /// what they delivered would walk more than [`MAX_WALK_SEQUENCES`] sequences, or remember
    /// more than [`super::MAX_JOB_DELIVERED`]: not the state of one job's workers.
    #[error(
        "the workers' positions span {from}..{until}, {what}; the workers of one job stand a few minibatches apart"
    )]
    JobSpreadTooWide {
        /// The earliest position.
        from: u64,
        /// The latest position.
        until: u64,
        /// Which bound.
        what: String,
    },
    /// A position before the start of an epoch of exactly one sweep ([`EpochLimit::Sweep`]):
    /// restored there, the run would deliver the sweeps before it too (found by a probe: a
    /// `sweep = 2` session resumed from an edited state at position 100 delivered sweeps 0–2).
    #[error(
        "position {position} is before the epoch's start ({start}, the first sample of sweep {sweep}): a run of \
         exactly sweep {sweep} starts there and never stands before it"
    )]
    BeforeEpoch {
        /// The position asked for.
        position: u64,
        /// The epoch's first position.
        start: u64,
        /// The epoch's sweep.
        sweep: u64,
    },
    /// A position inside a sequence ([`super::Sampler::restore_exact`]): a run stands only where a
    /// sequence starts, so no session wrote it, and restored it would skip the rest of that
    /// sequence (found by a probe: an edited state one sample on lost a sequence unsaid).
    #[error(
        "position {position} is inside a sequence (the next starts at {next}): a session stops only where a \
         sequence starts"
    )]
    InsideSequence {
        /// The position asked for.
        position: u64,
        /// Where the next sequence starts.
        next: u64,
    },
    /// The walk was given up: whoever asked for it no longer waits
    /// ([`super::Sampler::equalize_steps_unless`]).
    #[error("the walk over the workers' epochs was cancelled: the client that opened the session went away")]
    Cancelled,
    /// The epoch would exceed `u64::MAX / 2` samples (CNTK: "Too big epoch size can cause bit
    /// overflow").
    #[error("epoch limit {limit} over a sweep of {sweep_size} samples exceeds {max} samples", max = MAX_EPOCH_SAMPLES)]
    EpochTooLarge {
        /// The limit requested.
        limit: EpochLimit,
        /// Samples per sweep.
        sweep_size: u64,
    },
}
