//! The registry's refusals ([`RegistryError`]) and the parts of their messages that say what
//! holds the memory and what to change.

/// Registry errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The name is connected elsewhere.
    #[error("session '{0}' is connected on another socket")]
    Busy(String),
    /// The name belongs to a session another user opened (lingering, resumable only by it).
    #[error("session '{0}' belongs to another user")]
    NotOwner(String),
    /// The ring does not fit.
    #[error("the session's ring needs {needed} bytes, but only {available} of memory_limit_bytes ({limit}) are free for rings (a quarter of the limit stays with the chunk cache{}); the ring is `prefetch` slots of `slot_size_bytes`, each raised to hold a minibatch of `minibatch_size` dense samples: a smaller prefetch or minibatch_size, or a larger memory_limit_bytes, fits it", outside_note(*outside))]
    Memory {
        /// Bytes asked.
        needed: u64,
        /// Bytes left.
        available: u64,
        /// The limit.
        limit: u64,
        /// What the read buffers and the indexes hold.
        outside: u64,
    },
    /// The sampler's sweep orders do not fit.
    #[error("the session's sweep orders and minibatches need {needed} bytes ({}), but only {available} of memory_limit_bytes ({limit}) are free for sessions (a quarter of the limit stays with the chunk cache{}): {}", sampling_parts(*window_sequences, *job, *gathering), outside_note(*outside), sampling_advice(*job, *needed, gathering.0))]
    SamplingMemory {
        /// Bytes asked.
        needed: u64,
        /// Of them, what a session that continues a job keeps of the sequences its earlier
        /// workers delivered, and the walk that finds them (0 for any other session).
        job: u64,
        /// Sequences of a randomization window the sweep orders keep at once.
        window_sequences: u64,
        /// Of `needed`, what the minibatches planned and gathered at once take until they are in
        /// their slots, and the sequences each may hold (`minibatch::memory_bound`).
        gathering: (u64, u64),
        /// Bytes left.
        available: u64,
        /// The limit.
        limit: u64,
        /// What the read buffers and the indexes hold.
        outside: u64,
    },
}

/// What a session's sweep orders and minibatches keep, for [`RegistryError::SamplingMemory`].
fn sampling_parts(window_sequences: u64, job: u64, (gathering, sequences): (u64, u64)) -> String {
    let mut parts = Vec::new();
    if gathering > 0 {
        // Found by a probe: a minibatch of 2^31 - 1 one-value samples was admitted for its slots,
        // then its plan alone grew past the host's memory, counted nowhere.
        parts.push(format!(
            "{gathering} of them for the minibatches planned and copied at once, up to {sequences} sequences each, \
             whose places are kept per sequence until they are in their slots"
        ));
    }
    if job > 0 {
        parts.push(format!(
            "{job} of them for the sequences the earlier workers of the job it continues delivered, which it keeps \
             while their positions differ, and the walk that finds them"
        ));
    }
    parts.push(format!("the sweep orders keep up to {window_sequences} sequences of a randomization window at once"));
    parts.join("; ")
}

/// What to change, for [`RegistryError::SamplingMemory`] (`needed` bytes, `gathering` of them
/// for the minibatches in flight, `job` for a continued job's delivered set): a session that
/// continues a job cannot narrow its window (part of the options its states were written with; found by a probe: the
/// refusal of a `resume_job` advised it, where the job's delivered sequences took the memory).
fn sampling_advice(job: u64, needed: u64, gathering: u64) -> &'static str {
    if gathering >= needed / 2 {
        "a smaller minibatch_size or prefetch (ring slots), a larger memory_limit_bytes, or fewer other sessions fits it"
    } else if job == 0 {
        "raise memory_limit_bytes, narrow the randomization window (window_chunks, window_samples) or close other sessions"
    } else {
        "raise memory_limit_bytes or close other sessions, or resume each worker by its own state (at the same \
         worker count), which keeps no such set"
    }
}

/// The part of a memory refusal that names what the parser threads' read buffers and the
/// datasets' indexes hold, where it is much (a probe: 16 MiB chunks' buffers took a 32 MiB
/// limit, and the refusal named only the window).
fn outside_note(outside: u64) -> String {
    if outside == 0 {
        return String::new();
    }
    format!(
        ", and {outside} are the parser threads' read buffers and the datasets' indexes: parser_threads × the largest \
         chunk, 64 MiB each at most — a smaller chunk_size_bytes or fewer parser_threads leaves more"
    )
}
