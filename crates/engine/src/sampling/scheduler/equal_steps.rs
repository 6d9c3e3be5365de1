//! Equal step counts over the workers ([`Sampler::equalize_steps`]: counted where every sequence
//! is one sample, else walked) and continuing an earlier run of another size
//! ([`Sampler::resume_job`]): the parts of the sampler that look at every worker's epoch, not
//! only this one's.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{
    congruent_in, EpochLimit, EqualSteps, JobResume, Sampler, SamplingError, SamplingOptions, Tail, MAX_JOB_DELIVERED,
    MAX_WALK_SEQUENCES, PER_WORKER_SETUP,
};
use crate::sampling::plan::walk_owners;
use crate::sampling::randomizer::shuffle_chunks;

/// How often a walk of [`Sampler::equalize_steps_unless`] looks whether it was cancelled, in
/// minibatches walked (a few milliseconds of walking).
const CANCEL_CHECK_MINIBATCHES: u64 = 1024;

/// How often [`Sampler::resume_job_unless`] looks whether it was cancelled, in sequences walked.
const CANCEL_CHECK_SEQUENCES: u64 = 1 << 16;

impl EqualSteps {
    /// What equal steps with [`Tail::Drop`] cost when that is more than a ragged tail (more than
    /// 2 minibatches and 1 % of the worker that has the most), for every worker alike: how many are
    /// kept, the most any worker had, why, and what keeps every sample. `None` when they cost a
    /// tail or nothing, and when no worker keeps any (a warning of its own). Found by a probe: a
    /// `minibatch_size` of 7 over 5 workers gives shares of 2 and 1 samples, the workers of 1 need
    /// twice the steps, and equal steps cut them to half their data without a word.
    #[must_use]
    pub fn drop_warning(&self, sampler: &Sampler, minibatch_size: usize, tail: Tail) -> Option<String> {
        let spread = self.most - self.fewest;
        if tail != Tail::Drop || self.fewest == 0 || spread <= 2 || spread.saturating_mul(100) <= self.most {
            return None;
        }
        let workers = sampler.options.num_workers;
        let why = if !minibatch_size.is_multiple_of(workers) && minibatch_size > workers {
            format!(
                "minibatch_size {minibatch_size} over {workers} workers gives shares of {} and {} samples a \
                 minibatch, and the smaller shares need more steps (a multiple of {workers} gives equal shares)",
                minibatch_size / workers + 1,
                minibatch_size / workers
            )
        } else if sampler.block {
            format!(
                "randomized, the dataset's {} chunks go whole to the workers, so their shares differ by chunks (a \
                 smaller chunk_size_bytes evens them)",
                sampler.timeline.num_chunks()
            )
        } else {
            "the workers' shares of the epoch differ".to_owned()
        };
        let pct = spread.saturating_mul(100) / self.most.max(1);
        Some(format!(
            "equal steps keep {} minibatches a worker, the fewest any worker has, where the most is {}: up to \
             {spread} ({pct} %) of a worker's minibatches are dropped, {} of this worker's; {why}; tail = \"pad\" \
             keeps every sample, giving the workers with fewer empty minibatches instead",
            self.fewest, self.most, self.dropped
        ))
    }
}

impl Sampler {
    /// Equal step counts for data-parallel training (`DistributedDataParallel` hangs when ranks
    /// run different numbers of steps): every worker gets as many minibatches of
    /// `minibatch_size` in the epoch as the worker that gets the fewest ([`Tail::Drop`]: each
    /// worker's ragged tail is dropped) or the most ([`Tail::Pad`]: the others get empty
    /// minibatches at the end, which the caller delivers: [`EqualSteps::padding`]).
    ///
    /// Deterministic: the counts are computed from the epoch start (or from the job base of
    /// [`Sampler::resume_job`]), so a restore within the epoch keeps them. When every sequence is
    /// one sample and no job is continued, a worker's minibatches are its samples in the epoch
    /// divided by its local minibatch size, rounded up (each minibatch but the last takes exactly
    /// that many, across sweep ends too), and its samples are counted per chunk — the block
    /// randomizer deals whole chunks — or, in file order, by arithmetic; where this worker's
    /// epoch is cut is found from the position of its last sample kept: no sequence is walked
    /// but those of a sweep the epoch ends inside and those of the sweep the cut lies in (block
    /// randomizer). Otherwise every worker's plans are walked (no data is read). Both give the
    /// same counts and cut (a property test checks).
    ///
    /// # Errors
    /// [`SamplingError::EqualStepsNeedAFiniteEpoch`] for an infinite epoch.
    pub fn equalize_steps(&mut self, minibatch_size: usize, tail: Tail) -> Result<EqualSteps, SamplingError> {
        self.equalize_steps_unless(minibatch_size, tail, &AtomicBool::new(false))
    }

    /// [`Sampler::equalize_steps`], given up when `cancelled` turns true while the workers are
    /// walked (checked every [`CANCEL_CHECK_MINIBATCHES`] minibatches): a walk takes up to
    /// seconds, and its `open`'s client may have gone meanwhile.
    ///
    /// # Errors
    /// Those of [`Sampler::equalize_steps`]; [`SamplingError::Cancelled`].
    pub fn equalize_steps_unless(
        &mut self,
        minibatch_size: usize,
        tail: Tail,
        cancelled: &AtomicBool,
    ) -> Result<EqualSteps, SamplingError> {
        if self.options.limit == EpochLimit::Infinite {
            return Err(SamplingError::EqualStepsNeedAFiniteEpoch);
        }
        self.equal_steps_walk_fits(self.job.as_ref().map(|j| j.positions.iter().copied().min().unwrap_or(0)))?;
        if self.counts_steps() {
            return self.equalize_steps_counted(minibatch_size, tail, cancelled);
        }
        self.equalize_steps_walked(minibatch_size, tail, cancelled)
    }

    /// Whether [`Sampler::equalize_steps`] counts instead of walking.
    pub(super) fn counts_steps(&self) -> bool {
        self.unit_lengths && self.job.is_none()
    }

    /// [`Sampler::equalize_steps`] by counting each worker's samples in the epoch; with the block
    /// randomizer each sweep's chunk order is dealt, so the count, given up when `cancelled`
    /// turns true, takes seconds for millions of sweeps (found by a probe: the counted path never
    /// looked, and an `open` whose client had gone counted on for minutes).
    fn equalize_steps_counted(
        &mut self,
        minibatch_size: usize,
        tail: Tail,
        cancelled: &AtomicBool,
    ) -> Result<EqualSteps, SamplingError> {
        let workers = self.options.num_workers;
        let (from, until) = (self.epoch_start(), self.epoch_end);
        let dealt = self.block_samples_between(from, until, cancelled)?;
        let samples = |rank: usize| {
            if self.block {
                dealt.get(rank).copied().unwrap_or(0)
            } else {
                congruent_in(from, until, rank as u64, workers as u64)
            }
        };
        let steps = |rank: usize| samples(rank).div_ceil(self.local_limit_of(minibatch_size, rank));
        let (fewest, most) = (0..workers).map(steps).fold((u64::MAX, 0u64), |(lo, hi), n| (lo.min(n), hi.max(n)));
        let rank = self.options.rank;
        let (own, own_samples) = (steps(rank), samples(rank));
        Ok(match tail {
            Tail::Pad => EqualSteps { steps: most, dropped: 0, padding: most - own, fewest, most },
            Tail::Drop => {
                let limit = self.local_limit(minibatch_size);
                let kept = fewest.saturating_mul(limit).min(own_samples);
                // The last minibatch kept is a partial one: the walk after it goes on to the epoch
                // end, finding no more of this worker's sequences.
                let partial = kept == own_samples && kept % limit != 0;
                self.step_cutoff = Some(if fewest == 0 {
                    // Where the worker starts: the epoch start, or its end for a worker the block
                    // randomizer gives no chunk.
                    if self.block && rank >= self.timeline.num_chunks() {
                        self.epoch_end
                    } else {
                        self.epoch_start()
                    }
                } else if partial {
                    self.epoch_end
                } else {
                    self.end_after_local_sample(kept, kept == own_samples, cancelled)?
                });
                EqualSteps { steps: fewest, dropped: own - fewest, padding: 0, fewest, most }
            }
        })
    }

    /// Where a minibatch that ends with this worker's `k`th sample of the epoch (`k >= 1`, every
    /// sequence one sample) leaves the cursor: in file order right after it when there are
    /// several workers (CNTK's `NoRandomizer` stops once full) and, with one, at the next
    /// sequence, which is the same place; the block randomizer passes over the other workers'
    /// sequences up to its next one, the end of the sweep, or the epoch end, whichever comes
    /// first. `last`: the `k`th is this worker's last sample of the epoch, so the place is the end
    /// of its sweep or the epoch end, found without walking the sweep.
    fn end_after_local_sample(&self, k: u64, last: bool, cancelled: &AtomicBool) -> Result<u64, SamplingError> {
        let rank = self.options.rank;
        if !self.block {
            // Sequence `g` of the timeline is worker `g % W`'s.
            let workers = self.options.num_workers as u64;
            let start = self.epoch_start();
            let first = start + (rank as u64 + workers - start % workers) % workers;
            return Ok((first + (k - 1) * workers + 1).min(self.epoch_end));
        }
        let size = self.sweep_size.max(1);
        let mut before = 0u64;
        let mut sweep = self.epoch_start() / size;
        let workers = self.options.num_workers.max(1);
        // The sweep holding the kth: whole sweeps before it are counted, not walked.
        loop {
            if cancelled.load(Ordering::Relaxed) {
                return Err(SamplingError::Cancelled);
            }
            let here: u64 = self.dealt_samples(sweep).into_iter().skip(rank).step_by(workers).sum();
            if before + here >= k || (sweep + 1) * size >= self.epoch_end {
                break;
            }
            before += here;
            sweep += 1;
        }
        let nth = k - before;
        let sweep_start = sweep * size;
        let sweep_end = (sweep_start + size).min(self.epoch_end);
        if last {
            return Ok(sweep_end);
        }
        let mut plan = self.build_plan(sweep);
        let mut seen = 0u64;
        let mut at = None;
        for index in 0..plan.len() {
            if plan.entry(&self.timeline, index).owner != rank as u64 {
                continue;
            }
            if at.is_some() {
                // The next sequence of this worker.
                return Ok((sweep_start + index as u64).min(sweep_end));
            }
            seen += 1;
            if seen == nth {
                at = Some(index);
            }
        }
        Ok(sweep_end)
    }

    /// Where the epoch starts: its sweep's start for [`EpochLimit::Sweep`], else 0.
    pub(super) fn epoch_start(&self) -> u64 {
        match self.options.limit {
            EpochLimit::Sweep(k) => k.saturating_mul(self.sweep_size),
            _ => 0,
        }
    }

    /// With the block randomizer, the samples of each worker that gets a chunk (ranks below
    /// the chunk count; the others get none) at positions `from..until`, `from` at a sweep start
    /// (every sequence one sample, so a position is a sequence): whole sweeps are counted per
    /// chunk (the chunk at randomized position `k` is worker `k % W`'s), and a sweep that `until`
    /// ends inside is walked up to it. Empty in file order, where sequence `g` of the timeline is
    /// worker `g % W`'s ([`congruent_in`]). Given up when `cancelled` turns true (looked at every
    /// sweep).
    fn block_samples_between(&self, from: u64, until: u64, cancelled: &AtomicBool) -> Result<Vec<u64>, SamplingError> {
        if !self.block {
            return Ok(Vec::new());
        }
        let workers = self.options.num_workers.max(1);
        let mut samples = vec![0u64; workers.min(self.timeline.num_chunks())];
        if until <= from {
            return Ok(samples);
        }
        let size = self.sweep_size.max(1);
        for sweep in from / size..until / size {
            if cancelled.load(Ordering::Relaxed) {
                return Err(SamplingError::Cancelled);
            }
            for (k, n) in self.dealt_samples(sweep).into_iter().enumerate() {
                samples[k % workers] += n;
            }
        }
        let rest = until % size;
        if rest > 0 && until / size >= from / size {
            let mut plan = self.build_plan(until / size);
            for index in 0..usize::try_from(rest).unwrap_or(usize::MAX).min(plan.len()) {
                let owner = plan.entry(&self.timeline, index).owner;
                samples[usize::try_from(owner).unwrap_or(0) % workers] += 1;
            }
        }
        Ok(samples)
    }

    /// The samples of the chunk at each randomized position of sweep `sweep` (every sequence one
    /// sample): the block randomizer deals position `k` to worker `k % W`.
    fn dealt_samples(&self, sweep: u64) -> Vec<u64> {
        let starts = &self.timeline.chunk_start;
        shuffle_chunks(self.timeline.num_chunks(), self.options.seed.wrapping_add(sweep))
            .into_iter()
            .map(|c| (starts[c as usize + 1] - starts[c as usize]) as u64)
            .collect()
    }

    /// [`Sampler::equalize_steps`] by walking every worker's plans.
    pub(super) fn equalize_steps_walked(
        &mut self,
        minibatch_size: usize,
        tail: Tail,
        cancelled: &AtomicBool,
    ) -> Result<EqualSteps, SamplingError> {
        // Each worker walked from the start of the (resumed) epoch.
        let start = |rank: usize| -> Result<Sampler, SamplingError> {
            let options = SamplingOptions { rank, ..self.options.clone() };
            let mut s = Sampler::new(self.timeline.clone(), options)?;
            if let Some(job) = &self.job {
                s.resume_job(&job.positions)?;
            }
            Ok(s)
        };
        // Counts a worker's minibatches (no more than `stop`) and where the last one counted
        // ends: nothing is kept per minibatch, so the walk's memory does not grow with the epoch.
        let walk = |rank: usize, stop: u64| -> Result<(u64, u64), SamplingError> {
            let mut s = start(rank)?;
            let mut count = 0u64;
            while count < stop && s.next_minibatch(minibatch_size).is_some() {
                count += 1;
                if count.is_multiple_of(CANCEL_CHECK_MINIBATCHES) && cancelled.load(Ordering::Relaxed) {
                    return Err(SamplingError::Cancelled);
                }
            }
            Ok((count, s.position))
        };
        let (mut fewest, mut most) = (u64::MAX, 0u64);
        let mut own = 0;
        for rank in 0..self.options.num_workers {
            // Also at each worker: with many workers each walk is short, but each begins with
            // its sweep's order (found by a probe: 2^20 workers over 3,000 sequences walked for
            // 13 s after their client had gone, holding their rings' memory).
            if cancelled.load(Ordering::Relaxed) {
                return Err(SamplingError::Cancelled);
            }
            let (n, _) = walk(rank, u64::MAX)?;
            if rank == self.options.rank {
                own = n;
            }
            fewest = fewest.min(n);
            most = most.max(n);
        }
        match tail {
            Tail::Pad => Ok(EqualSteps { steps: most, dropped: 0, padding: most - own, fewest, most }),
            Tail::Drop => {
                // After `fewest` minibatches this worker stands where its `fewest`th ends; with
                // none at all it stops where it starts.
                let (_, cutoff) = walk(self.options.rank, fewest)?;
                self.step_cutoff = Some(cutoff);
                Ok(EqualSteps { steps: fewest, dropped: own - fewest, padding: 0, fewest, most })
            }
        }
    }

    /// Whether [`Sampler::equalize_steps`] on this sampler, continuing a job whose earliest
    /// worker stands at `job_start` (`None` for no job), stays within [`MAX_WALK_SEQUENCES`]:
    /// counted, it visits each chunk once per sweep of the epoch and at most two sweeps' sequences
    /// (the one the epoch ends in, the one the cut lies in) with the block randomizer, and only a count
    /// per worker in file order; walked, each worker's walk visits
    /// every sequence of the epoch (a partial sweep counted whole), and the workers plus this one
    /// again are walked. Cheap, for a caller to refuse before committing to anything.
    ///
    /// # Errors
    /// [`SamplingError::EqualStepsTooCostly`].
    pub fn equal_steps_walk_fits(&self, job_start: Option<u64>) -> Result<(), SamplingError> {
        let sequences = self.timeline.num_sequences() as u64;
        let workers = self.options.num_workers;
        if self.unit_lengths && job_start.is_none() {
            // Counted: with the block randomizer each chunk twice per sweep (the counts, then the
            // sweep of the cut) and at most two sweeps' sequences walked; in file order,
            // arithmetic. A count per worker either way.
            let (per_worker, walked) = if self.block {
                let sweeps = self.sweeps_between(self.epoch_start(), self.epoch_end);
                (
                    sweeps.saturating_mul(self.timeline.num_chunks() as u64).saturating_mul(2),
                    sequences.saturating_mul(2),
                )
            } else {
                (0, 0)
            };
            let walk =
                per_worker.saturating_add(workers as u64).saturating_add(walked).saturating_add(PER_WORKER_SETUP);
            if walk > MAX_WALK_SEQUENCES {
                return Err(SamplingError::EqualStepsTooCostly { walk, workers, per_worker });
            }
            return Ok(());
        }
        let job_start = job_start.unwrap_or(0);
        let start = match self.options.limit {
            EpochLimit::Sweep(k) => job_start.max(k.saturating_mul(self.sweep_size)),
            _ => job_start,
        };
        let per_worker = self.sweeps_between(start, self.epoch_end).saturating_mul(sequences);
        let walk = per_worker.saturating_add(PER_WORKER_SETUP).saturating_mul(workers as u64 + 1);
        if walk > MAX_WALK_SEQUENCES {
            return Err(SamplingError::EqualStepsTooCostly { walk, workers, per_worker });
        }
        Ok(())
    }

    /// Sweeps that positions `from..until` touch (each walked whole).
    pub(super) fn sweeps_between(&self, from: u64, until: u64) -> u64 {
        let size = self.sweep_size.max(1);
        if until <= from {
            return 0;
        }
        until.div_ceil(size) - from / size
    }

    /// Continues a run of `positions.len()` workers (any count, not necessarily this sampler's)
    /// that stood at `positions` (rank order; each worker's [`Sampler::position`]) with this
    /// sampler's worker count: nothing the earlier workers delivered is delivered again, and
    /// nothing they did not deliver is lost.
    ///
    /// The earlier workers delivered every sequence before the earliest of their positions, and
    /// of the sequences between it and the latest one, those that their owner (in the earlier
    /// split) had passed. This sampler restarts at the earliest position and passes over the
    /// latter; every other sequence of the rest of the epoch is split among this sampler's
    /// workers as a fresh run of that count splits it, so the following sweeps are exactly a
    /// fresh run's. [`Sampler::restore`] afterwards (a later checkpoint of the continued run)
    /// keeps the passed-over set.
    ///
    /// # Errors
    /// [`SamplingError::NoWorkers`] for an empty `positions`.
    pub fn resume_job(&mut self, positions: &[u64]) -> Result<(), SamplingError> {
        self.resume_job_unless(positions, &AtomicBool::new(false))
    }

    /// [`Sampler::resume_job`], given up when `cancelled` turns true (checked every
    /// [`CANCEL_CHECK_SEQUENCES`] sequences walked): the walk takes up to minutes, and its
    /// `open`'s client may have gone meanwhile.
    ///
    /// # Errors
    /// Those of [`Sampler::resume_job`]; [`SamplingError::Cancelled`].
    pub fn resume_job_unless(&mut self, positions: &[u64], cancelled: &AtomicBool) -> Result<(), SamplingError> {
        let (Some(&from), Some(&until)) = (positions.iter().min(), positions.iter().max()) else {
            return Err(SamplingError::NoWorkers);
        };
        self.job_walk_fits(positions)?;
        let earlier = SamplingOptions { num_workers: positions.len(), rank: 0, ..self.options.clone() };
        let mut delivered = HashSet::new();
        // The workers' positions past the earliest that the walk has not stood at: a worker
        // stands where a sequence starts (or at the epoch's end, a worker without data), so
        // one left is inside a sequence (found by a probe: an edited worker's position one
        // sample on lost a sequence unsaid).
        let mut unmet: std::collections::BTreeSet<u64> =
            positions.iter().copied().filter(|&p| p > from && p < self.epoch_end).collect();
        if until > from {
            for sweep in from / self.sweep_size..=(until - 1) / self.sweep_size {
                let mut at = sweep * self.sweep_size;
                let (mut too_many, mut walked, mut gave_up) = (false, 0u64, false);
                walk_owners(&self.timeline, &earlier, sweep, self.sweep_size, |entry| {
                    unmet.remove(&at);
                    if at >= until {
                        return false;
                    }
                    walked += 1;
                    if walked.is_multiple_of(CANCEL_CHECK_SEQUENCES) && cancelled.load(Ordering::Relaxed) {
                        gave_up = true;
                        return false;
                    }
                    // The owner is below the earlier worker count, `positions.len()`.
                    let owner_position = positions[usize::try_from(entry.owner).unwrap_or(0)];
                    if at >= from && at < owner_position {
                        delivered.insert((sweep, entry.seq.seq));
                        if delivered.len() > MAX_JOB_DELIVERED {
                            too_many = true;
                            return false;
                        }
                    }
                    at = at.saturating_add(u64::from(self.timeline.seq_len[entry.seq.seq as usize]));
                    true
                });
                if gave_up {
                    return Err(SamplingError::Cancelled);
                }
                if too_many {
                    let what = format!("more than {MAX_JOB_DELIVERED} sequences delivered past the earliest");
                    return Err(SamplingError::JobSpreadTooWide { from, until, what });
                }
                unmet.remove(&at);
            }
        }
        if let Some(&position) = unmet.first() {
            self.restore(position)?;
            return Err(SamplingError::InsideSequence { position, next: self.position });
        }
        self.job = Some(JobResume { positions: positions.to_vec(), until, delivered });
        self.restore_exact(from)
    }

    /// [`Sampler::restore`] of a position a run stands at: where a sequence starts, or at or
    /// past the epoch's end (nothing left there to lose). No session stops inside a sequence;
    /// restored there, the rest of that sequence would be skipped unsaid.
    ///
    /// # Errors
    /// Those of [`Sampler::restore`]; [`SamplingError::InsideSequence`].
    pub fn restore_exact(&mut self, position: u64) -> Result<(), SamplingError> {
        self.restore(position)?;
        let parked = self.block && self.options.rank >= self.timeline.num_chunks();
        if position < self.epoch_end && !parked && self.position != position {
            return Err(SamplingError::InsideSequence { position, next: self.position });
        }
        Ok(())
    }

    /// Whether [`Sampler::resume_job`] of `positions` walks at most [`MAX_WALK_SEQUENCES`]
    /// sequences (every sweep between the earliest and the latest position): cheap, for a caller
    /// to refuse before committing to anything. (What the walk remembers is bounded as it goes.)
    ///
    /// # Errors
    /// [`SamplingError::JobSpreadTooWide`].
    pub fn job_walk_fits(&self, positions: &[u64]) -> Result<(), SamplingError> {
        let (Some(&from), Some(&until)) = (positions.iter().min(), positions.iter().max()) else {
            return Err(SamplingError::NoWorkers);
        };
        let walk = self.sweeps_between(from, until).saturating_mul(self.timeline.num_sequences() as u64);
        if walk > MAX_WALK_SEQUENCES {
            let what = format!("{walk} sequences to walk (at most {MAX_WALK_SEQUENCES})");
            return Err(SamplingError::JobSpreadTooWide { from, until, what });
        }
        Ok(())
    }

    /// The positions of the run this sampler continues ([`Sampler::resume_job`]), if any.
    #[must_use]
    pub fn job_positions(&self) -> Option<&[u64]> {
        self.job.as_ref().map(|j| j.positions.as_slice())
    }
}
