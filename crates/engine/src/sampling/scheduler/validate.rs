//! The checks [`super::Sampler::new`] makes before it builds anything: the options, the
//! timeline's shape and the epoch's end.

use super::{EpochLimit, SamplingError, SamplingOptions, MAX_EPOCH_SAMPLES};
use crate::sampling::Timeline;

pub(super) fn validate_options(options: &SamplingOptions) -> Result<(), SamplingError> {
    if options.num_workers == 0 {
        return Err(SamplingError::NoWorkers);
    }
    if options.rank >= options.num_workers {
        return Err(SamplingError::RankOutOfRange { rank: options.rank, num_workers: options.num_workers });
    }
    Ok(())
}

/// Checks the timeline's shape and returns its sweep size in samples.
pub(super) fn validate_timeline(timeline: &Timeline) -> Result<u64, SamplingError> {
    let count = timeline.num_sequences();
    if count == 0 {
        return Err(SamplingError::EmptyTimeline);
    }
    if u32::try_from(count).is_err() {
        return Err(SamplingError::TooManySequences { count });
    }
    let starts = &timeline.chunk_start;
    if starts.first() != Some(&0) {
        return Err(SamplingError::MalformedChunks { reason: "chunk_start must begin with 0" });
    }
    if starts.last() != Some(&count) {
        return Err(SamplingError::MalformedChunks {
            reason: "the last chunk_start entry must equal the number of sequences",
        });
    }
    for (chunk, pair) in starts.windows(2).enumerate() {
        if pair[1] < pair[0] {
            return Err(SamplingError::MalformedChunks { reason: "chunk_start must not decrease" });
        }
        if pair[1] == pair[0] {
            return Err(SamplingError::EmptyChunk { chunk });
        }
    }
    if let Some(seq) = timeline.seq_len.first_zero() {
        return Err(SamplingError::ZeroLengthSequence { seq });
    }
    Ok(timeline.samples(..))
}

/// The epoch end position (CNTK `StartEpoch`; the V2 epoch always starts at 0).
pub(super) fn epoch_end(limit: EpochLimit, sweep_size: u64) -> Result<u64, SamplingError> {
    let samples = match limit {
        EpochLimit::Infinite => Some(MAX_EPOCH_SAMPLES),
        EpochLimit::FullSweep => Some(sweep_size),
        EpochLimit::Sweeps(k) => k.checked_mul(sweep_size),
        EpochLimit::Samples(n) => Some(n),
        EpochLimit::Sweep(k) => k.checked_add(1).and_then(|n| n.checked_mul(sweep_size)),
    };
    match samples {
        Some(samples) if samples <= MAX_EPOCH_SAMPLES => Ok(samples),
        _ => Err(SamplingError::EpochTooLarge { limit, sweep_size }),
    }
}
