//! A session's `open` options resolved against its dataset's defaults ([`resolve_options`]),
//! every violation reported in one message, and the hash of what a resume must match besides
//! the data ([`options_hash`]).

use minibatchd_client::protocol::{SessionOptions, TailPolicy};
use minibatchd_engine::sampling::{EpochLimit, SamplingOptions, Tail, Window};

use crate::config::DatasetConfig;

/// Most slots a session may ask for.
pub const MAX_RING_SLOTS: u64 = 1024;
/// Largest slot a session may ask for (1 TiB, as the config's bound).
pub const MAX_SLOT_SIZE_BYTES: u64 = 1 << 40;
/// Largest minibatch a session (and `dump`) may ask for, in samples: 2^31 − 1.
pub const MAX_MINIBATCH_SIZE: u64 = i32::MAX.unsigned_abs() as u64;
/// Longest session name.
pub const MAX_SESSION_NAME: usize = 128;
/// Most workers of a session (and `dump --workers`): 2^20.
pub const MAX_WORKERS: u64 = 1 << 20;

/// `open` options resolved against the dataset's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedOptions {
    /// Sampling options for the [`minibatchd_engine::sampling::Sampler`].
    pub sampling: SamplingOptions,
    /// Global minibatch size in samples.
    pub minibatch_size: usize,
    /// CNTK frame mode.
    pub frame_mode: bool,
    /// Equal step counts over the workers ([`minibatchd_engine::sampling::Sampler::equalize_steps`]).
    pub equal_steps: bool,
    /// What equal steps do with the ragged tails.
    pub tail: Tail,
    /// Ring slots.
    pub slots: u64,
    /// Requested bytes per slot (before raising it to fit the minibatches the index can bound).
    pub slot_size_bytes: u64,
    /// Session name, if given.
    pub session: Option<String>,
}

/// Every invalid `open` option, each named with what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.join("; "))]
pub struct InvalidOptions(pub Vec<String>);

/// The epoch `o` asks for, with what is wrong with it in `problems`.
fn epoch_limit(o: &SessionOptions, problems: &mut Vec<String>) -> EpochLimit {
    let limits = [o.max_samples.is_some(), o.max_sweeps.is_some(), o.full_sweep, o.sweep.is_some()]
        .iter()
        .filter(|&&b| b)
        .count();
    if limits > 1 {
        problems.push("give at most one of max_samples, max_sweeps, full_sweep, sweep".to_owned());
    }
    // Found by a probe: an epoch of 0 samples was served as an empty one, without a word, where
    // CNTK 2.7 says "Epoch size cannot be 0" and a mixture's session refuses it.
    if o.max_samples == Some(0) {
        problems.push("max_samples must be at least 1 (an epoch of 0 samples would deliver nothing)".to_owned());
    }
    match (o.max_samples, o.max_sweeps, o.full_sweep, o.sweep) {
        (Some(n), ..) => EpochLimit::Samples(n),
        (_, Some(k), ..) => EpochLimit::Sweeps(k),
        (_, _, true, _) => EpochLimit::FullSweep,
        (.., Some(k)) => EpochLimit::Sweep(k),
        _ => EpochLimit::Infinite,
    }
}

/// Resolves `o` for dataset `d`; `default_slots` and `default_slot_size` come from `[daemon]`.
///
/// # Errors
/// [`InvalidOptions`], naming every invalid option.
pub fn resolve_options(
    o: &SessionOptions,
    d: &DatasetConfig,
    default_slots: u64,
    default_slot_size: u64,
) -> Result<ResolvedOptions, InvalidOptions> {
    let mut problems = Vec::new();
    let minibatch_size = match o.minibatch_size {
        Some(n) if (1..=MAX_MINIBATCH_SIZE).contains(&n) => usize::try_from(n).unwrap_or(1),
        Some(n) => {
            problems.push(format!("minibatch_size {n} is out of range 1..={MAX_MINIBATCH_SIZE}"));
            1
        }
        None => {
            problems.push("minibatch_size is required".to_owned());
            1
        }
    };
    let limit = epoch_limit(o, &mut problems);
    let window = match (o.window_chunks, o.window_samples) {
        (Some(_), Some(_)) => {
            problems.push("give window_chunks or window_samples, not both".to_owned());
            d.sampling.window
        }
        (c, s) => Window::from_options(c.map(|c| usize::try_from(c).unwrap_or(usize::MAX)), s, d.sampling.window),
    };
    let num_workers = o.num_workers.unwrap_or(1);
    let rank = o.rank.unwrap_or(0);
    if num_workers == 0 || num_workers > MAX_WORKERS {
        problems.push(format!("num_workers {num_workers} is out of range 1..={MAX_WORKERS}"));
    } else if rank >= num_workers {
        problems.push(format!("rank {rank} is out of range for {num_workers} worker(s)"));
    }
    let slots = o.prefetch.unwrap_or(default_slots);
    if !(2..=MAX_RING_SLOTS).contains(&slots) {
        problems.push(format!("prefetch {slots} is out of range 2..={MAX_RING_SLOTS} (ring slots)"));
    }
    let slot_size_bytes = o.slot_size_bytes.unwrap_or(default_slot_size);
    if !(4096..=MAX_SLOT_SIZE_BYTES).contains(&slot_size_bytes) {
        problems.push(format!("slot_size_bytes {slot_size_bytes} is out of range 4096..={MAX_SLOT_SIZE_BYTES}"));
    }
    if let Some(name) = &o.session {
        if name.is_empty()
            || name.len() > MAX_SESSION_NAME
            || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:@".contains(&b))
        {
            problems.push(format!("session name must be 1..={MAX_SESSION_NAME} characters of [A-Za-z0-9-_.:@]"));
        }
    }
    if o.tail.is_some() && !o.equal_steps {
        problems.push("tail applies to equal_steps: set equal_steps = true".to_owned());
    }
    if o.resume.is_some() && o.resume_job.is_some() {
        problems.push("give either resume (this worker's state) or resume_job (every worker's), not both".to_owned());
    }
    if o.resume_job.as_ref().is_some_and(|states| states.is_empty() || states.len() as u64 > MAX_WORKERS) {
        problems.push(format!("resume_job needs the states of 1..={MAX_WORKERS} workers"));
    }
    if o.equal_steps && limit == EpochLimit::Infinite {
        problems.push("equal_steps needs a finite epoch (max_samples, max_sweeps, full_sweep or sweep)".to_owned());
    }
    if o.weights.is_some() || o.weight_schedule.is_some() {
        problems.push("weights and weight_schedule apply to a mixture's session, not to a dataset's".to_owned());
    }
    if o.mixture.is_some() {
        problems.push(
            "mixture gives a mixture at open: the name opened must then be one no dataset of the configuration has"
                .to_owned(),
        );
    }
    if !problems.is_empty() {
        return Err(InvalidOptions(problems));
    }
    Ok(ResolvedOptions {
        sampling: SamplingOptions {
            randomize: o.randomize.unwrap_or(d.sampling.randomize),
            window,
            seed: o.seed.unwrap_or(d.sampling.seed),
            limit,
            // Both validated below 2^20 above (else the options are refused).
            num_workers: usize::try_from(num_workers).unwrap_or(1),
            rank: usize::try_from(rank).unwrap_or(0),
        },
        minibatch_size,
        frame_mode: o.frame_mode,
        equal_steps: o.equal_steps,
        tail: match o.tail {
            Some(TailPolicy::Pad) => Tail::Pad,
            Some(TailPolicy::Drop) | None => Tail::Drop,
        },
        slots,
        slot_size_bytes,
        session: o.session.clone(),
    })
}

/// Hash of the options that shape the global order and the epoch: randomize, window, seed,
/// epoch limit, and equal steps when on (so states saved without it keep their hash).
/// (Minibatch size, workers and rank may change across a resume, as in CNTK.)
#[must_use]
pub fn options_hash(s: &SamplingOptions, equal_steps: bool, tail: Tail) -> u64 {
    let mut h = minibatchd_engine::hash::Fnv1a::new();
    h.u64(u64::from(s.randomize));
    match s.window.normalized() {
        Window::Chunks(c) => {
            h.u64(1);
            h.u64(c as u64);
        }
        Window::Samples(n) => {
            h.u64(2);
            h.u64(n);
        }
    }
    h.u64(s.seed);
    match s.limit {
        EpochLimit::Infinite => h.u64(10),
        EpochLimit::FullSweep => h.u64(11),
        EpochLimit::Sweeps(k) => {
            h.u64(12);
            h.u64(k);
        }
        EpochLimit::Samples(n) => {
            h.u64(13);
            h.u64(n);
        }
        EpochLimit::Sweep(k) => {
            h.u64(14);
            h.u64(k);
        }
    }
    if equal_steps {
        h.u64(20);
        // Padding changes the epoch's length (states of dropping runs keep their hash).
        if tail == Tail::Pad {
            h.u64(21);
        }
    }
    h.finish()
}
