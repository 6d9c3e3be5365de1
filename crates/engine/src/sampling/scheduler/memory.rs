//! What a sampler costs in memory at most ([`Sampler::memory_bound`], and beside it while the
//! walks of equal steps or a job resume run): reserved by the daemon before a sampler is built,
//! so kept apart from the walk itself.

use super::{Sampler, SamplingOptions, MAX_JOB_DELIVERED};
use crate::sampling::plan::{window_sequences, PLAN_BYTES_PER_CHUNK, PLAN_FIXED_BYTES, SLOT_BYTES};
use crate::sampling::Timeline;

/// Heap bytes per chunk of one sweep plan at most: its tables ([`PLAN_BYTES_PER_CHUNK`]) and what
/// building it holds for a moment (chunk sizes, sample counts and window starts).
const PLAN_BOUND_BYTES_PER_CHUNK: u64 = PLAN_BYTES_PER_CHUNK + 24;

/// Heap bytes of a sampler whatever the timeline (its own fields, a walk's small vectors).
const SAMPLER_FIXED_BYTES: u64 = 4 << 10;

/// Heap bytes per sequence remembered by [`Sampler::resume_job`]: a `(u64, u32)` key of a hash
/// set, with its control byte, at the set's lowest load.
const DELIVERED_ENTRY_BYTES: u64 = 40;

impl Sampler {
    /// An upper bound on the heap a sampler over `timeline` with `options` holds: two sweep
    /// plans (the current one, and the next, which a prefetch looks into near a sweep's end and a
    /// sweep's switch builds while the current one lives), each keeping at most one randomization
    /// window's positions ([`window_sequences`], [`SLOT_BYTES`] each) and a few numbers per chunk;
    /// with `job` (it continues a job: [`Sampler::resume_job`]), the set of sequences the earlier
    /// workers delivered. It does not grow with the dataset beyond its chunk count and widest
    /// window. The minibatches it returns are the caller's.
    #[must_use]
    pub fn memory_bound(timeline: &Timeline, options: &SamplingOptions, job: bool) -> u64 {
        let plans = Self::plan_bound(timeline, options).saturating_mul(2).saturating_add(SAMPLER_FIXED_BYTES);
        if !job {
            return plans;
        }
        let num_sequences = timeline.num_sequences() as u64;
        let delivered = (MAX_JOB_DELIVERED as u64).min(num_sequences.saturating_mul(2)) * DELIVERED_ENTRY_BYTES;
        plans.saturating_add(delivered)
    }

    /// What one sweep plan holds at most, with what building it takes for a moment.
    fn plan_bound(timeline: &Timeline, options: &SamplingOptions) -> u64 {
        let chunks = (timeline.num_chunks() as u64).saturating_mul(PLAN_BOUND_BYTES_PER_CHUNK);
        window_sequences(timeline, options)
            .saturating_mul(SLOT_BYTES)
            .saturating_add(chunks)
            .saturating_add(PLAN_FIXED_BYTES)
    }

    /// What the walks of [`Sampler::resume_job`] and [`Sampler::equalize_steps`] hold beside
    /// [`Sampler::memory_bound`] while they run, at most: another worker's sampler (which, in a
    /// continued job, `job`, holds the set of sequences the earlier workers delivered too) and
    /// one sweep plan of the earlier run's workers.
    #[must_use]
    pub fn walk_memory_bound(timeline: &Timeline, options: &SamplingOptions, job: bool) -> u64 {
        Self::memory_bound(timeline, options, job).saturating_add(Self::plan_bound(timeline, options))
    }
}
