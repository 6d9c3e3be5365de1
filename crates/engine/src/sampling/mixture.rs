//! Weighted mixtures of datasets: which source fills each place of a minibatch, with an exact,
//! resumable order, also through a change of weights (`docs/mixtures.md`).
//!
//! A mixture draws from several sources, each a dataset with its own [`Timeline`] and CNTK
//! sampling (randomization, window, seed). Each source keeps its own timeline of sweeps, one
//! after the other, endlessly: over each of its sweeps every sequence comes exactly once, in the
//! order a single-dataset session with the source's options gets (one worker).
//!
//! **The schedule is over sequences.** The mixture's global stream is a sequence of *slots*;
//! slot `g` takes the next sequence of the source a smooth weighted round-robin picks: every
//! source's credit grows by its weight, the source with the largest credit (the lowest index on a
//! tie) is picked and its credit falls by the sum of the weights. A source's credit is `n·w − c·W`
//! after `n` slots of which it got `c` (weights `w`, their sum `W`), so the realised share of every
//! source stays within one sequence of its weight at every prefix (tested, `mixture/tests.rs`).
//! Sequences, not samples, because a source yields whole sequences: a schedule over samples would
//! owe a source the rest of a long sequence. For one-sample sequences (libsvm lines, CTF line
//! mode, `tf.Example` records) the two are the same.
//!
//! **Weights** are quantized to integer parts of [`WEIGHT_UNITS`] (2^30) by largest remainder; a
//! positive weight gets at least one part. A [`WeightSchedule`] changes them by step (minibatch
//! index): from the first minibatch whose weights differ from those the credits were built under,
//! every credit restarts at 0, so from the change on the shares follow the new weights; the
//! sources' positions do not move, so nothing is lost or repeated within any source.
//!
//! **Ranks and workers.** Minibatches are global: minibatch `k` is the slots that fit into the
//! global minibatch size (samples, at least one slot), and slot `g` belongs to worker
//! `g mod num_workers`. Every worker walks every slot (no data is read for that) and keeps its
//! own, so all workers take the same steps, each slot is delivered by exactly one worker, and the
//! state after a minibatch — [`MixtureState`], a few integers per source — is the same on every
//! worker: resuming from it at any world size continues the uninterrupted global stream.
//! (A single-dataset session follows CNTK's distributed rules instead, where workers keep
//! positions of their own; a mixture is not a CNTK feature.)

use std::sync::Arc;

use super::{EpochLimit, Sampler, SamplingError, SamplingOptions, SeqRef, Timeline, Window};

mod errors;
mod state;
#[cfg(test)]
mod tests;
mod weights;

pub use errors::MixtureError;
pub use state::{MixtureState, SourceState};
pub use weights::{WeightSchedule, WeightStage, Weights};

/// The integer parts that a mixture's weights are quantized to, in all.
pub const WEIGHT_UNITS: u64 = 1 << 30;

/// Most sources in one mixture.
pub const MAX_SOURCES: usize = 256;

/// Most slots [`Mixture::skip_epochs`] walks when a session of a later epoch opens (a bounded
/// wait, seconds to minutes on a blocking thread of the daemon, whatever a client asks).
pub const MAX_WALK_SLOTS: u64 = 1 << 30;

/// How often [`Mixture::skip_epochs_unless`] looks whether it was cancelled: every this many
/// minibatches walked, and every this many slots (found by a probe: minibatches of a million
/// slots took 40 ms each, so a walk looked every 40 s and went on half a minute after its
/// client had gone).
const CANCEL_EVERY_MINIBATCHES: u64 = 1024;
const CANCEL_EVERY_SLOTS: u64 = 1 << 16;

/// When a mixture's epoch ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MixtureEpoch {
    /// Never: each source starts its next sweep when it ends one.
    Endless,
    /// With the minibatch holding the slot that completes a sweep of any source (the first source
    /// to run out, as tf.data's `stop_on_empty_dataset`). The next epoch
    /// ([`MixtureState::next_epoch`]) goes on from there: that source starts its next sweep, the
    /// others go on in theirs.
    FirstSweepEnd,
    /// At the first slot that starts at or after this many global samples of the epoch (CNTK's
    /// `max_samples` rule).
    Samples(u64),
}

/// A source of a mixture: its timeline and the CNTK sampling of its sequences.
#[derive(Debug, Clone)]
pub struct MixtureSource {
    /// The source's sequences and chunks.
    pub timeline: Arc<Timeline>,
    /// Randomize (block randomizer) or file order.
    pub randomize: bool,
    /// Randomization window.
    pub window: Window,
    /// Sweep `k` of this source is randomized with `seed + k`.
    pub seed: u64,
}

/// Everything that decides a mixture's order and this worker's share of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MixtureOptions {
    /// Weights by step.
    pub schedule: WeightSchedule,
    /// When the epoch ends.
    pub epoch: MixtureEpoch,
    /// Workers (ranks × `DataLoader` workers) sharing the mixture, ≥ 1.
    pub num_workers: usize,
    /// This worker, `< num_workers`.
    pub rank: usize,
}

/// One sequence of a mixture's minibatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MixRef {
    /// Index of its source.
    pub source: u32,
    /// The source's sweep it comes from.
    pub sweep: u64,
    /// Its sequence and chunk in the source.
    pub seq: SeqRef,
    /// Its nominal length.
    pub samples: u32,
}

/// What one minibatch of a mixture holds for this worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MixturePlan {
    /// The minibatch's index in the epoch.
    pub step: u64,
    /// This worker's sequences, in slot order. Empty when the minibatch has fewer slots than
    /// there are workers and none is this worker's.
    pub sequences: Vec<MixRef>,
    /// Nominal samples of `sequences`.
    pub samples: u64,
    /// Slots of the whole minibatch (all workers).
    pub slots: u64,
    /// Sources that completed a sweep within this minibatch (with any worker's slot).
    pub sweeps_ended: Vec<u32>,
    /// `(source, chunk)` whose last use in the source's sweep (by any worker) is in this
    /// minibatch: their parsed data may go once this minibatch is built.
    pub retire: Vec<(u32, u32)>,
    /// The state after this minibatch.
    pub state: MixtureState,
}

impl MixturePlan {
    /// The ledger fingerprint: FNV-1a (64-bit) over each sequence's source, sweep and index in
    /// its source, in order (a single dataset's fingerprint hashes the sweep once, then the
    /// indices; a mixture's names the source and sweep of each).
    #[must_use]
    pub fn fingerprint(&self) -> u64 {
        let mut h = crate::hash::Fnv1a::new();
        h.field(b"mixture");
        for r in &self.sequences {
            h.u64(u64::from(r.source));
            h.u64(r.sweep);
            h.u64(u64::from(r.seq.seq));
        }
        h.finish()
    }
}

/// A slot picked: its sequence taken from its source's sampler, not yet from the mixture's state
/// (a slot that does not fit into the minibatch that picked it waits for the next one).
#[derive(Debug, Clone)]
struct Pending {
    slot: MixRef,
    ended_sweep: bool,
    retire: Vec<u32>,
    /// The source's position after the slot.
    position: u64,
    /// The slot's nominal samples.
    samples: u64,
}

/// One worker's deterministic cursor over a mixture.
pub struct Mixture {
    samplers: Vec<Sampler>,
    /// Each source's shortest and longest sequence, in samples, and whether every one is a
    /// sample (what a restored position may be), found once: a restore per epoch walked will not
    /// walk them.
    longest: Vec<(u64, u64, bool)>,
    options: MixtureOptions,
    state: MixtureState,
    pending: Option<Pending>,
}

impl Mixture {
    /// A mixture at the start of its first epoch.
    ///
    /// # Errors
    /// The options and sources disagree on the number of sources, a bad worker count or rank, or
    /// a source's sampler refuses its timeline.
    pub fn new(sources: &[MixtureSource], options: MixtureOptions) -> Result<Self, MixtureError> {
        if sources.is_empty() {
            return Err(MixtureError::NoSources);
        }
        if sources.len() > MAX_SOURCES {
            return Err(MixtureError::TooManySources(sources.len()));
        }
        if options.schedule.sources() != sources.len() {
            return Err(MixtureError::WeightCount { given: options.schedule.sources(), sources: sources.len() });
        }
        if options.num_workers == 0 || options.rank >= options.num_workers {
            let error = if options.num_workers == 0 {
                SamplingError::NoWorkers
            } else {
                SamplingError::RankOutOfRange { rank: options.rank, num_workers: options.num_workers }
            };
            return Err(MixtureError::Workers(error.to_string()));
        }
        let mut samplers = Vec::with_capacity(sources.len());
        for (i, source) in sources.iter().enumerate() {
            let sampling = SamplingOptions {
                randomize: source.randomize,
                window: source.window,
                seed: source.seed,
                limit: EpochLimit::Infinite,
                num_workers: 1,
                rank: 0,
            };
            let sampler = Sampler::new(source.timeline.clone(), sampling)
                .map_err(|e| MixtureError::Source { source_index: i, error: e.to_string() })?;
            samplers.push(sampler);
        }
        let state = MixtureState::start(sources.len());
        let longest = samplers
            .iter()
            .map(|s| {
                let l = &s.timeline().seq_len;
                (u64::from(l.min()), u64::from(l.max()), l.all_ones())
            })
            .collect();
        Ok(Self { samplers, longest, options, state, pending: None })
    }

    /// The state after the last minibatch (or the one restored).
    #[must_use]
    pub fn state(&self) -> &MixtureState {
        &self.state
    }

    /// The options.
    #[must_use]
    pub fn options(&self) -> &MixtureOptions {
        &self.options
    }

    /// Nominal samples per sweep of source `source`.
    #[must_use]
    pub fn sweep_size(&self, source: usize) -> u64 {
        self.samplers.get(source).map_or(0, Sampler::sweep_size)
    }

    /// Continues from `state`, which a mixture of the same sources produced — under any weights,
    /// worker count or rank: the next minibatch is the one the uninterrupted run (under these
    /// options' weights from that step on) would have produced.
    ///
    /// # Errors
    /// A state of another number of sources, or with values no mixture state has.
    pub fn restore(&mut self, state: &MixtureState) -> Result<(), MixtureError> {
        state::check(state, &self.longest, self.options.epoch)?;
        for (i, (sampler, s)) in self.samplers.iter_mut().zip(&state.sources).enumerate() {
            sampler.restore(s.position).map_err(|e| MixtureError::BadState(e.to_string()))?;
            // A source stops only where a sequence starts (found by a probe: a position inside a
            // sequence moved on to the next start, and the sequence was skipped).
            if sampler.position() != s.position {
                return Err(MixtureError::BadState(format!(
                    "source {i}: position {} is inside a sequence (the next starts at {}); a mixture's sources \
                     stand where sequences start",
                    s.position,
                    sampler.position()
                )));
            }
        }
        self.state = state.clone();
        self.pending = None;
        Ok(())
    }

    /// Moves to the start of epoch `epoch` (0-based, from this mixture's state at the start of
    /// an epoch: a fresh one, or one restored at an epoch's start) by walking the epochs before it
    /// with minibatches of `minibatch_size` — which the weight schedule's steps depend on — each
    /// next epoch continuing from the last one's final state ([`MixtureState::next_epoch`]). No
    /// data is read; the cost is one sampler step per slot walked, refused beyond `max_slots`.
    ///
    /// # Errors
    /// An endless mixture has one epoch; a walk longer than `max_slots` slots; a source's
    /// sampler ended.
    pub fn skip_epochs(&mut self, epoch: u64, minibatch_size: usize, max_slots: u64) -> Result<(), MixtureError> {
        self.skip_epochs_unless(epoch, minibatch_size, max_slots, &std::sync::atomic::AtomicBool::new(false))
    }

    /// [`Mixture::skip_epochs`], given up when `cancelled` turns true (checked every 1,024
    /// minibatches walked): its `open`'s client may have gone meanwhile.
    ///
    /// # Errors
    /// Those of [`Mixture::skip_epochs`]; [`MixtureError::Cancelled`].
    pub fn skip_epochs_unless(
        &mut self,
        epoch: u64,
        minibatch_size: usize,
        max_slots: u64,
        cancelled: &std::sync::atomic::AtomicBool,
    ) -> Result<(), MixtureError> {
        if epoch == 0 {
            return Ok(());
        }
        if self.options.epoch == MixtureEpoch::Endless {
            return Err(MixtureError::BadState(format!(
                "epoch {epoch} of an endless mixture: it has one epoch (set `epoch = \"first_sweep_end\"` or \
                 `max_samples` to have epochs)"
            )));
        }
        let too_far = || {
            MixtureError::BadState(format!(
                "epoch {epoch} starts after more than {max_slots} slots, too many to walk at `open`: resume from \
                 the state at the previous epoch's end instead"
            ))
        };
        // Each epoch's restart counts as a slot per source besides its slots, and as the
        // sequences each source's restore walks to its position (found by a probe: a large
        // source's restore walked its sweep to where it stood at every epoch, 100 times the
        // slots' cost, so the bound took hours to reach): a walk of many short epochs is bounded
        // too. The budget is checked at every slot, and nothing is kept of the minibatches walked.
        let restart = self.samplers.len() as u64 + 1;
        let mut budget = max_slots;
        let mut walked = 0u64;
        let mut looked_at = budget;
        for _ in 0..epoch {
            while self.step(minibatch_size, false, &mut budget)?.is_some() {
                walked += 1;
                if walked.is_multiple_of(CANCEL_EVERY_MINIBATCHES)
                    || looked_at.saturating_sub(budget) >= CANCEL_EVERY_SLOTS
                {
                    looked_at = budget;
                    if cancelled.load(std::sync::atomic::Ordering::Relaxed) {
                        return Err(MixtureError::Cancelled);
                    }
                }
            }
            if budget == 0 {
                return Err(too_far());
            }
            budget = budget.checked_sub(restart).ok_or_else(too_far)?;
            let next = self.state.next_epoch();
            self.restore(&next)?;
            let sought: u64 = self.samplers.iter().map(Sampler::index_in_sweep).sum();
            budget = budget.checked_sub(sought).ok_or_else(too_far)?;
        }
        Ok(())
    }

    /// The slots left in this epoch when fewer than `most` (`None`: at least `most`, or an endless
    /// mixture): walked from the state, which is then restored. With fewer slots left than
    /// workers, the workers whose turn does not come get nothing more in the epoch.
    ///
    /// # Errors
    /// A source's sampler ended.
    pub fn slots_left_below(&mut self, minibatch_size: usize, most: u64) -> Result<Option<u64>, MixtureError> {
        if self.options.epoch == MixtureEpoch::Endless || most == 0 {
            return Ok(None);
        }
        let saved = self.state.clone();
        let mut budget = most;
        let mut left = 0u64;
        let walked = loop {
            match self.step(minibatch_size, false, &mut budget) {
                Ok(Some(plan)) => left += plan.slots,
                Ok(None) => break Ok((budget > 0).then_some(left)),
                Err(e) => break Err(e),
            }
        };
        self.restore(&saved)?;
        walked
    }

    /// The next minibatch of `minibatch_size` global samples (at least one slot), or `None` at the
    /// epoch's end (and on every later call until [`Mixture::restore`]).
    ///
    /// # Errors
    /// A source's sampler ended, which an endless source never does.
    pub fn next_minibatch(&mut self, minibatch_size: usize) -> Result<Option<MixturePlan>, MixtureError> {
        let mut unbounded = u64::MAX;
        self.step(minibatch_size, true, &mut unbounded)
    }

    /// [`Mixture::next_minibatch`]; with `collect` false the plan keeps no sequence, chunk or
    /// source (a walk). Each slot taken spends one of `budget`; at 0 the minibatch stops where it
    /// is and `None` comes back (the state is then of no use: the walk is refused).
    fn step(
        &mut self,
        minibatch_size: usize,
        collect: bool,
        budget: &mut u64,
    ) -> Result<Option<MixturePlan>, MixtureError> {
        if self.epoch_over() {
            return Ok(None);
        }
        let step = self.state.step;
        self.enter_stage(step)?;
        let size = (minibatch_size as u64).max(1);
        let workers = self.options.num_workers as u64;
        let rank = self.options.rank as u64;
        let mut plan = MixturePlan {
            step,
            sequences: Vec::new(),
            samples: 0,
            slots: 0,
            sweeps_ended: Vec::new(),
            retire: Vec::new(),
            state: MixtureState::start(0),
        };
        let mut global_samples = 0u64;
        loop {
            if self.slot_limit_reached() {
                break;
            }
            if *budget == 0 {
                return Ok(None);
            }
            let picked = match self.pending.take() {
                // Picked during the previous minibatch: the state has not moved since.
                Some(p) => p,
                None => self.pick()?,
            };
            let len = u64::from(picked.slot.samples);
            if plan.slots > 0 && global_samples + len > size {
                self.pending = Some(picked);
                break;
            }
            *budget -= 1;
            let slot_index = self.state.slots;
            self.take(&picked);
            global_samples += len;
            plan.slots += 1;
            if slot_index % workers == rank {
                plan.samples += len;
                if collect {
                    plan.sequences.push(picked.slot);
                }
            }
            let source = picked.slot.source;
            if collect {
                plan.retire.extend(picked.retire.iter().map(|&c| (source, c)));
            }
            if picked.ended_sweep {
                if collect && !plan.sweeps_ended.contains(&source) {
                    plan.sweeps_ended.push(source);
                }
                if self.options.epoch == MixtureEpoch::FirstSweepEnd {
                    self.state.ended = true;
                    break;
                }
            }
            if global_samples >= size {
                break;
            }
        }
        if plan.slots == 0 {
            // The sample limit was reached before this minibatch took anything.
            self.state.ended = true;
            return Ok(None);
        }
        self.state.step = self.state.step.saturating_add(1);
        if self.slot_limit_reached() {
            self.state.ended = true;
        }
        if collect {
            plan.state = self.state.clone();
        }
        Ok(Some(plan))
    }

    fn epoch_over(&self) -> bool {
        self.state.ended || self.slot_limit_reached()
    }

    /// With [`MixtureEpoch::Samples`], whether the next slot would start at or after the limit.
    fn slot_limit_reached(&self) -> bool {
        matches!(self.options.epoch, MixtureEpoch::Samples(n) if self.state.samples >= n)
    }

    /// Puts the weights in force at `step` into the state: when they differ from those the
    /// credits were built under, every credit restarts at 0 (and a slot picked ahead under the old
    /// weights is given back to its source).
    fn enter_stage(&mut self, step: u64) -> Result<(), MixtureError> {
        let weights = self.options.schedule.at(step).parts();
        if self.state.sources.iter().zip(weights).all(|(s, &w)| s.weight == w) {
            return Ok(());
        }
        if let Some(p) = self.pending.take() {
            let source = p.slot.source as usize;
            let back = self.state.sources[source].position;
            self.samplers[source]
                .restore(back)
                .map_err(|e| MixtureError::Source { source_index: source, error: e.to_string() })?;
        }
        for (s, &w) in self.state.sources.iter_mut().zip(weights) {
            s.credit = 0;
            s.weight = w;
        }
        Ok(())
    }

    /// Puts slot `p` into the state: every credit grows by its weight, the slot's source's falls
    /// by the weights' sum; its position and count, and the epoch's slots and samples, move.
    fn take(&mut self, p: &Pending) {
        let total = i64::try_from(WEIGHT_UNITS).unwrap_or(i64::MAX);
        for s in &mut self.state.sources {
            s.credit += i64::try_from(s.weight).unwrap_or(0);
        }
        let s = &mut self.state.sources[p.slot.source as usize];
        s.credit -= total;
        s.taken = s.taken.saturating_add(1);
        s.position = p.position;
        self.state.slots = self.state.slots.saturating_add(1);
        self.state.samples = self.state.samples.saturating_add(p.samples);
    }

    /// Picks the next slot's source — the largest credit once every credit has grown by its
    /// weight, the lowest index on a tie — and takes its next sequence; the state is unchanged
    /// ([`Mixture::take`] puts the slot into it).
    fn pick(&mut self) -> Result<Pending, MixtureError> {
        let grown = |s: &SourceState| s.credit + i64::try_from(s.weight).unwrap_or(0);
        let mut best = 0;
        for i in 1..self.state.sources.len() {
            if grown(&self.state.sources[i]) > grown(&self.state.sources[best]) {
                best = i;
            }
        }
        let source_sampler = &mut self.samplers[best];
        let mut taken = None;
        // An endless sampler gives an empty minibatch at most once in a row (at a sweep's start,
        // block randomizer, a first sequence longer than one sample); then it takes one.
        for _ in 0..3 {
            match source_sampler.next_minibatch(1) {
                Some(p) if !p.sequences.is_empty() => {
                    taken = Some(p);
                    break;
                }
                Some(_) => {}
                None => break,
            }
        }
        let Some(p) = taken else {
            return Err(MixtureError::Source { source_index: best, error: "the source's sampler ended".into() });
        };
        let seq = p.sequences[0];
        let samples = u32::try_from(p.samples).unwrap_or(u32::MAX);
        Ok(Pending {
            slot: MixRef { source: super::to_u32(best), sweep: p.sweep, seq, samples },
            ended_sweep: p.end_of_sweep,
            retire: p.retire,
            position: p.position,
            samples: p.samples,
        })
    }
}
