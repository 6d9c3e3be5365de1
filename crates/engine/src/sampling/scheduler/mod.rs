//! Minibatch scheduling on the global timeline: CNTK's `GetNextSequenceDescriptions` fill rules,
//! sweep crossing, epoch limits, the local minibatch size and checkpoint positions
//! (CNTK 2.7's `ReaderShim` and `Packer`; `docs/parity.md`).
//!
//! All workers walk the same global timeline of nominal samples; a [`Sampler`] is one worker's
//! cursor on it. Each call to [`Sampler::next_minibatch`] walks sequence by sequence:
//! 1. a local sequence that would push the local count past the local minibatch size ends the
//!    minibatch — unless no local sequence has been taken yet (a sequence longer than the
//!    minibatch is returned alone); the fill is greedy and never skips;
//! 2. a sequence whose start is at or past the epoch end ends the epoch (the last started
//!    sequence is delivered in full, so an epoch can overshoot);
//! 3. otherwise the sequence is taken if local, or passed over (the global position still
//!    advances) if it belongs to another worker.
//!
//! With the block randomizer the walk stops at the sweep end and, as V2's
//! `allowMinibatchesToCrossSweepBoundaries=true` does, continues in the re-randomized next sweep
//! while the epoch is not over and the local size is not reached; after a sweep boundary the
//! first local sequence must fit too. Without randomization the walk is one continuous pass
//! (CNTK's `NoRandomizer` does not cut at the sweep end when crossing is allowed).
//!
//! The global minibatch limit of V2's local timeline is unbounded (`SIZE_MAX`), so only the local
//! size `mb / W + (mb % W > rank)` (at least 1) limits a fill.
//!
//! Fed by: the caller's minibatch requests. Feeds: [`MinibatchPlan`]s to the caller, which loads
//! the named chunks.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use super::plan::SweepPlan;
use super::randomizer::uses_block_randomizer;
use super::Timeline;
use crate::hash::ChunkSet;

mod memory;
mod next_sweep;
mod options;
mod validate;

pub use next_sweep::{BuiltSweep, NextSweepJob};
pub use options::{EpochLimit, SamplingError, SamplingOptions, Window, DEFAULT_WINDOW_CHUNKS};
use validate::{epoch_end, validate_options, validate_timeline};

/// One sequence of a minibatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqRef {
    /// Global sequence index in file order.
    pub seq: u32,
    /// Original (file-order) chunk index.
    pub chunk: u32,
}

/// What one minibatch of one worker consists of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MinibatchPlan {
    /// This worker's sequences in minibatch order. May be empty while the epoch goes on: CNTK
    /// then returns a minibatch without data for this worker.
    pub sequences: Vec<SeqRef>,
    /// Sweep index of the position at which this minibatch started.
    pub sweep: u64,
    /// CNTK `MinibatchData.sweep_end`: the minibatch ends at, or crosses, a sweep end. Never set
    /// on an empty minibatch (CNTK does not report it there either).
    pub end_of_sweep: bool,
    /// Global checkpoint position after this minibatch.
    pub position: u64,
    /// Original chunk ids whose last use by this worker in their sweep is in this minibatch (and
    /// that this minibatch does not use again later, in a following sweep): the caller may drop
    /// their parsed data once it has built this minibatch. A retired chunk can be needed again
    /// in a later sweep.
    pub retire: Vec<u32>,
    /// Nominal samples of `sequences` (the sum of their lengths).
    pub samples: u64,
    /// For a minibatch that crosses sweep ends: where in `sequences` each later sweep's begin
    /// (sweep `sweep + 1 + i` from `next_sweeps_at[i]`); empty for a minibatch within one sweep.
    /// Not part of the fingerprint (it follows from the order).
    pub next_sweeps_at: Vec<usize>,
}

impl MinibatchPlan {
    /// The data-order ledger's fingerprint: FNV-1a (64-bit) over the sweep and the global file-order
    /// index of each sequence, in order. It says which sequences a minibatch holds, in which order,
    /// from which sweep; the same on every run, delivery path and client (`dump` prints it, the
    /// daemon writes it into the slot header).
    #[must_use]
    pub fn fingerprint(&self) -> u64 {
        let mut h = crate::hash::Fnv1a::new();
        h.u64(self.sweep);
        for r in &self.sequences {
            h.u64(u64::from(r.seq));
        }
        h.finish()
    }
}

/// Largest epoch, in samples (CNTK's `SIZE_MAX / 2`); also the size of an infinite epoch.
pub const MAX_EPOCH_SAMPLES: u64 = u64::MAX / 2;

/// Most sequences the walks of [`Sampler::equalize_steps`] (every worker's epoch) and of
/// [`Sampler::resume_job`] (every sweep between the workers' positions) visit: they run when a
/// session opens, so their cost is bounded whatever a client asks (minutes at most, on a
/// blocking thread of the daemon).
pub const MAX_WALK_SEQUENCES: u64 = 1 << 32;

/// What a worker's sampler costs in [`Sampler::equalize_steps`] before its walk starts (set up,
/// its first sweep planned), counted as this many sequences walked, however short the dataset.
const PER_WORKER_SETUP: u64 = 1024;

/// Most sequences [`Sampler::resume_job`] remembers as delivered by the earlier workers past the
/// earliest of their positions (one entry each, ~25 MiB at most; a job's workers stand a few
/// minibatches apart).
pub const MAX_JOB_DELIVERED: usize = 1 << 20;

/// Largest local minibatch size honoured; larger requests are clamped (CNTK raises "Global and
/// local size of the minibatch cannot exceed max int" instead).
pub const MAX_LOCAL_MINIBATCH_SAMPLES: u64 = i32::MAX as u64;

/// One worker's deterministic cursor over the sampling timeline.
///
/// Restoring to any position that a previous minibatch reported continues exactly like the
/// uninterrupted run. **Deliberate difference from CNTK:** CNTK's `SequenceRandomizer::Seek`
/// re-seeds with the bare sweep index (without the seed offset) when it rewinds within the
/// current sweep to before its earliest still-randomized chunk, which changes the replayed order
/// when the seed is not 0. That bug is not reproduced: every sweep's order here depends only on
/// (timeline, window, seed, sweep). For the non-randomized split see [`super::plan`].
pub struct Sampler {
    timeline: Arc<Timeline>,
    options: SamplingOptions,
    block: bool,
    sweep_size: u64,
    /// Every sequence is one sample (the sweep size is the sequence count): the walk need not
    /// look lengths up, one random read per sequence.
    unit_lengths: bool,
    epoch_end: u64,
    /// Global position of the next sequence (`current.sweep * sweep_size + its start`).
    position: u64,
    /// Index in `current.order` of the sequence starting at `position` (`== len` at sweep end).
    index: usize,
    current: SweepPlan,
    /// The following sweep, computed early when `upcoming_chunks` looks past this one, or built
    /// elsewhere ([`Sampler::next_sweep_job`]) and installed ([`Sampler::install_next_sweep`]).
    next: OnceLock<SweepPlan>,
    /// With [`Sampler::equalize_steps`]: the epoch ends for this worker at this position, after
    /// as many minibatches as the worker with the fewest gets.
    step_cutoff: Option<u64>,
    /// With [`Sampler::resume_job`]: the positions the workers of the earlier run stood at, and
    /// the sequences they delivered past the earliest of them.
    job: Option<JobResume>,
}

/// A run continued at another worker count ([`Sampler::resume_job`]).
#[derive(Debug, Clone)]
struct JobResume {
    /// Where each worker of the earlier run stood, in rank order.
    positions: Vec<u64>,
    /// Positions from here on were delivered by no worker of the earlier run.
    until: u64,
    /// (sweep, sequence) of every sequence that starts in `[min(positions), until)` and that its
    /// owner in the earlier run delivered (it started before that owner's position).
    delivered: HashSet<(u64, u32)>,
}

/// What [`Sampler::equalize_steps`] does with the workers' ragged tails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tail {
    /// Every worker stops after as many minibatches as the worker with the fewest: the others'
    /// last minibatches are not delivered in this epoch.
    #[default]
    Drop,
    /// Every worker gets as many minibatches as the worker with the most: the others get empty
    /// minibatches (no sample) at the end of the epoch. Nothing is dropped or repeated.
    Pad,
}

/// The outcome of [`Sampler::equalize_steps`] for this worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EqualSteps {
    /// Minibatches every worker gets in the epoch (from the epoch start, or from a job resume).
    pub steps: u64,
    /// This worker's minibatches that are not delivered ([`Tail::Drop`]).
    pub dropped: u64,
    /// Empty minibatches this worker gets at the end ([`Tail::Pad`]).
    pub padding: u64,
    /// The fewest minibatches any worker has in the epoch, before equal steps.
    pub fewest: u64,
    /// The most any worker has.
    pub most: u64,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("options", &self.options)
            .field("sweep_size", &self.sweep_size)
            .field("epoch_end", &self.epoch_end)
            .field("position", &self.position)
            .field("sweep", &self.current.sweep)
            .finish_non_exhaustive()
    }
}

/// Why a walk through one sweep stopped.
enum Stop {
    /// A local sequence does not fit the local minibatch size.
    Full,
    /// The next sequence starts at or after the epoch end.
    EpochEnd,
    /// The sweep has no sequence left.
    SweepEnd,
}

/// The minibatch being filled.
struct Fill {
    limit: u64,
    local_samples: u64,
    at_least_one: bool,
    sequences: Vec<SeqRef>,
    last_use: Vec<bool>,
    /// Chunks whose last use was passed over ([`Sampler::resume_job`]).
    retire_extra: Vec<u32>,
}

impl Fill {
    /// Whether a local sequence of `len` samples ends the minibatch.
    fn is_full_for(&self, len: u64) -> bool {
        !self.at_least_one && self.local_samples + len > self.limit
    }

    fn take(&mut self, seq: SeqRef, len: u64, last_use: bool) {
        self.sequences.push(seq);
        self.last_use.push(last_use);
        self.local_samples += len;
        self.at_least_one = false;
    }

    /// Chunks whose final occurrence in this minibatch is a last use, in order of that occurrence.
    fn retired_chunks(&self) -> Vec<u32> {
        if let ([seq], [last], []) = (&self.sequences[..], &self.last_use[..], &self.retire_extra[..]) {
            // One sequence (a mixture takes its sources' sequences one at a time): no set.
            return if *last { vec![seq.chunk] } else { Vec::new() };
        }
        let mut seen = ChunkSet::default();
        let mut retire: Vec<u32> = Vec::new();
        for (seq, &last) in self.sequences.iter().zip(&self.last_use).rev() {
            if seen.insert(seq.chunk) && last {
                retire.push(seq.chunk);
            }
        }
        retire.reverse();
        for &c in &self.retire_extra {
            if !retire.contains(&c) {
                retire.push(c);
            }
        }
        retire
    }
}

impl Sampler {
    /// A sampler at position 0 of the epoch described by `options`.
    ///
    /// # Errors
    /// [`SamplingError`] if the options are inconsistent or the timeline is malformed.
    pub fn new(timeline: Arc<Timeline>, options: SamplingOptions) -> Result<Self, SamplingError> {
        validate_options(&options)?;
        let sweep_size = validate_timeline(&timeline)?;
        let epoch_end = epoch_end(options.limit, sweep_size)?;
        let current = SweepPlan::build(&timeline, &options, 0, sweep_size, epoch_end);
        let block = uses_block_randomizer(&options);
        let timeline_len = timeline.num_sequences() as u64;
        let mut sampler = Self {
            timeline,
            options,
            block,
            sweep_size,
            unit_lengths: sweep_size == timeline_len,
            epoch_end,
            position: 0,
            index: 0,
            current,
            next: OnceLock::new(),
            step_cutoff: None,
            job: None,
        };
        if let EpochLimit::Sweep(k) = sampler.options.limit {
            // `epoch_end` checked that (k + 1) sweeps fit, so k sweeps do too.
            sampler.restore(k * sweep_size)?;
        }
        sampler.park_if_without_data();
        Ok(sampler)
    }

    /// The next minibatch of this worker, or `None` at the end of the epoch (and on every later
    /// call until [`Sampler::restore`]).
    ///
    /// `minibatch_size` is the global size in nominal samples; this worker fills
    /// `minibatch_size / W + (minibatch_size % W > rank)` samples of its own (at least 1, at most
    /// [`MAX_LOCAL_MINIBATCH_SAMPLES`]), as CNTK's `SequencePacker` with a local timeline.
    pub fn next_minibatch(&mut self, minibatch_size: usize) -> Option<MinibatchPlan> {
        if self.position >= self.epoch_end || self.step_cutoff.is_some_and(|c| self.position >= c) {
            return None;
        }
        let start = self.position;
        let mut fill = Fill {
            limit: self.local_limit(minibatch_size),
            local_samples: 0,
            at_least_one: true,
            sequences: Vec::new(),
            last_use: Vec::new(),
            retire_extra: Vec::new(),
        };
        // The minibatch's sweep: where it starts (a cursor at the end of the last one enters the
        // next before its first sequence).
        let first_sweep = start / self.sweep_size;
        let mut next_sweeps_at = Vec::new();
        loop {
            let before = self.current.sweep;
            self.enter_next_sweep_if_at_end();
            if self.current.sweep != before && self.current.sweep > first_sweep {
                next_sweeps_at.push(fill.sequences.len());
            }
            match self.walk_sweep(&mut fill) {
                Stop::Full | Stop::EpochEnd => break,
                Stop::SweepEnd if self.position >= self.epoch_end => break,
                Stop::SweepEnd if self.block => {
                    if fill.local_samples >= fill.limit {
                        break;
                    }
                    fill.at_least_one = false;
                }
                Stop::SweepEnd => {}
            }
        }
        if fill.sequences.is_empty() && self.position >= self.epoch_end {
            return None;
        }
        // A sweep entered with no sequence of this minibatch after it holds none of them.
        while next_sweeps_at.last() == Some(&fill.sequences.len()) {
            next_sweeps_at.pop();
        }
        let crossed = self.position / self.sweep_size != start / self.sweep_size;
        Some(MinibatchPlan {
            end_of_sweep: crossed && !fill.sequences.is_empty(),
            retire: fill.retired_chunks(),
            samples: fill.local_samples,
            sequences: fill.sequences,
            sweep: start / self.sweep_size,
            position: self.position,
            next_sweeps_at,
        })
    }

    /// The global checkpoint position: nominal samples consumed on the global timeline (all
    /// workers) up to the end of the last minibatch returned (CNTK `minibatchSourcePosition`).
    #[must_use]
    pub fn position(&self) -> u64 {
        self.position
    }

    /// The sequences before the current one in its sweep's order: what a [`Sampler::restore`]
    /// to this position walked.
    #[must_use]
    pub fn index_in_sweep(&self) -> u64 {
        self.index as u64
    }

    /// Whether this worker gets no data in the epoch: the block randomizer deals whole chunks,
    /// and there are fewer chunks than workers (CNTK parks such a worker at the epoch end); file
    /// order deals sequences one by one, and the epoch's sweeps (counted whole) hold fewer than
    /// this worker's turn. Never for an infinite epoch.
    #[must_use]
    pub fn gets_no_data(&self) -> bool {
        if self.block {
            return self.options.rank >= self.timeline.num_chunks();
        }
        if self.options.limit == EpochLimit::Infinite {
            return false;
        }
        let n = self.timeline.num_sequences() as u64;
        let size = self.sweep_size.max(1);
        let first = self.epoch_start() / size;
        let sweeps = self.sweeps_between(self.epoch_start(), self.epoch_end);
        let (from, until) = (first.saturating_mul(n), first.saturating_add(sweeps).saturating_mul(n));
        congruent_in(from, until, self.options.rank as u64, self.options.num_workers.max(1) as u64) == 0
    }

    /// Whether the block randomizer orders this sampler's sweeps (it deals whole chunks to
    /// workers); else file order (sequences one by one).
    #[must_use]
    pub fn deals_chunks(&self) -> bool {
        self.block
    }

    /// Nominal samples per sweep.
    #[must_use]
    pub fn sweep_size(&self) -> u64 {
        self.sweep_size
    }

    /// The timeline it walks.
    #[must_use]
    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    /// The last position a session with these options can be at: its epoch's end, or past it by
    /// less than a sequence (the last minibatch takes the sequence it began whole); an endless
    /// epoch's end (`u64::MAX / 2` samples) is reached only by a worker that the block randomizer
    /// gives no chunk, which stands there from the start. A state past it was not written by such
    /// a session. `longest` is the timeline's longest sequence, in samples (the caller keeps it:
    /// finding it walks every sequence's length).
    #[must_use]
    pub fn latest_position(&self, longest: u64) -> u64 {
        if self.options.limit == EpochLimit::Infinite {
            // Found by a probe: a fresh endless session of a worker without data was refused
            // for the position it starts at.
            let without_data = self.block && self.options.rank >= self.timeline.num_chunks();
            self.epoch_end - u64::from(!without_data)
        } else {
            self.epoch_end.saturating_add(longest.max(1) - 1)
        }
    }

    /// CNTK `SetState`: moves to the first sequence whose start is at or after
    /// `position % sweep_size` in that sweep's order; the position becomes
    /// `sweep * sweep_size + that start`. The epoch keeps its end, and a worker that the block
    /// randomizer gives no chunk (`rank >= chunks`) is moved to the epoch end, as in CNTK.
    ///
    /// # Errors
    /// [`SamplingError::BeforeEpoch`]: with [`EpochLimit::Sweep`], a position before that
    /// sweep's start. Every later position is valid (past the epoch end the sampler just ends).
    pub fn restore(&mut self, position: u64) -> Result<(), SamplingError> {
        let start = self.epoch_start();
        if position < start {
            return Err(SamplingError::BeforeEpoch { position, start, sweep: start / self.sweep_size });
        }
        let sweep = position / self.sweep_size;
        self.switch_to_sweep(sweep);
        let (index, start) = self.current.seek(&self.timeline, position % self.sweep_size);
        self.index = index;
        self.position = (sweep * self.sweep_size).saturating_add(start);
        self.park_if_without_data();
        Ok(())
    }

    /// Original chunk ids in order of first need from the current position (this worker's
    /// sequences only, up to the epoch end), at most `max` distinct: a prefetch hint. Looks at most
    /// to the end of the following sweep (building its order when it must).
    #[must_use]
    pub fn upcoming_chunks(&self, max: usize) -> Vec<u32> {
        self.upcoming(max, |s| {
            let next_sweep = s.current.sweep + 1;
            (next_sweep.saturating_mul(s.sweep_size) < s.epoch_end)
                .then(|| s.next.get_or_init(|| s.build_plan(next_sweep)))
        })
    }

    /// The earliest position of the epoch: the start of its one sweep for [`EpochLimit::Sweep`],
    /// else 0. [`Sampler::restore`] refuses a position before it.
    #[must_use]
    pub fn earliest_position(&self) -> u64 {
        self.epoch_start()
    }

    /// [`Sampler::upcoming_chunks`] that looks past the current sweep only when the next sweep's
    /// order is there already (built by a [`NextSweepJob`], or earlier), never building it.
    #[must_use]
    pub fn upcoming_chunks_built(&self, max: usize) -> Vec<u32> {
        self.upcoming(max, |s| s.next.get())
    }

    /// The prefetch hint, looking into the next sweep's order that `next` gives (asked only when
    /// the current sweep's rest names fewer than `max` chunks).
    fn upcoming<'a>(&'a self, max: usize, next: impl FnOnce(&'a Self) -> Option<&'a SweepPlan>) -> Vec<u32> {
        let mut upcoming = Vec::new();
        if max == 0 || self.position >= self.epoch_end {
            return upcoming;
        }
        let mut seen = ChunkSet::default();
        self.current.upcoming_into(&self.timeline, self.index, max, &mut upcoming, &mut seen);
        if upcoming.len() < max {
            if let Some(next) = next(self).filter(|next| next.sweep == self.current.sweep + 1) {
                next.upcoming_into(&self.timeline, 0, max, &mut upcoming, &mut seen);
            }
        }
        upcoming
    }

    fn build_plan(&self, sweep: u64) -> SweepPlan {
        SweepPlan::build(&self.timeline, &self.options, sweep, self.sweep_size, self.epoch_end)
    }

    /// Samples (positions) left in the current sweep before the next one starts.
    #[must_use]
    pub fn left_in_sweep(&self) -> u64 {
        (self.current.sweep + 1).saturating_mul(self.sweep_size).saturating_sub(self.position)
    }

    fn local_limit(&self, minibatch_size: usize) -> u64 {
        self.local_limit_of(minibatch_size, self.options.rank)
    }

    /// The local minibatch size of worker `rank`.
    fn local_limit_of(&self, minibatch_size: usize, rank: usize) -> u64 {
        let workers = self.options.num_workers;
        let share = minibatch_size / workers + usize::from(minibatch_size % workers > rank);
        (share as u64).clamp(1, MAX_LOCAL_MINIBATCH_SAMPLES)
    }

    /// Walks the current sweep from the cursor until the fill or the epoch ends or the sweep is
    /// exhausted.
    fn walk_sweep(&mut self, fill: &mut Fill) -> Stop {
        // CNTK's `NoRandomizer` fills `while localSampleCount > numLocalSamplesLoaded`: once the
        // local size is reached it stops at once, without passing over the other workers'
        // sequences that follow. The block randomizer passes over them up to the next local
        // sequence, which then does not fit. (With one worker both rules stop at the same place.)
        let stop_once_full = !self.block && self.options.num_workers > 1;
        let rank = self.options.rank as u64;
        while self.index < self.current.len() {
            let entry = self.current.entry(&self.timeline, self.index);
            let r = entry.seq;
            let len = if self.unit_lengths { 1 } else { u64::from(self.timeline.seq_len[r.seq as usize]) };
            let mut local = entry.owner == rank;
            if local {
                if let Some(job) = &self.job {
                    if self.position < job.until && job.delivered.contains(&(self.current.sweep, r.seq)) {
                        // Delivered by the earlier run: passed over like another worker's. Its
                        // chunk is retired if this was its last use.
                        local = false;
                        if entry.last_use {
                            fill.retire_extra.push(r.chunk);
                        }
                    }
                }
            }
            if local && fill.is_full_for(len) {
                return Stop::Full;
            }
            if self.position >= self.epoch_end {
                return Stop::EpochEnd;
            }
            if local {
                fill.take(r, len, entry.last_use);
            }
            self.position += len;
            self.index += 1;
            if stop_once_full && local && fill.local_samples >= fill.limit {
                return Stop::Full;
            }
        }
        Stop::SweepEnd
    }

    /// Moves the cursor into the next sweep once the current one is exhausted.
    fn enter_next_sweep_if_at_end(&mut self) {
        if self.index >= self.current.len() {
            self.switch_to_sweep(self.current.sweep + 1);
            self.index = 0;
        }
    }

    /// Makes `sweep` the current sweep, reusing the cached next sweep when it is the one.
    fn switch_to_sweep(&mut self, sweep: u64) {
        if self.current.sweep == sweep {
            return;
        }
        self.current = match self.next.take() {
            Some(plan) if plan.sweep == sweep => plan,
            other => {
                // A next sweep that is not the one goes before the new one is built.
                drop(other);
                self.build_plan(sweep)
            }
        };
    }

    /// CNTK's `BlockRandomizer::SetState`: a rank without any chunk goes to the epoch end.
    fn park_if_without_data(&mut self) {
        if self.block && self.options.rank >= self.timeline.num_chunks() {
            self.position = self.epoch_end;
        }
    }
}

/// How many `g` in `from..until` have `g % workers == rank`.
fn congruent_in(from: u64, until: u64, rank: u64, workers: u64) -> u64 {
    // Below `x`: those in `0..x`.
    let below = |x: u64| x / workers + u64::from(x % workers > rank);
    below(until) - below(from)
}

mod equal_steps;

#[cfg(test)]
mod tests;
