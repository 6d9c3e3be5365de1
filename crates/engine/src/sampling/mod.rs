//! Sampling: which sequences make up each minibatch, in which order — CNTK `MinibatchSource`
//! semantics, bit for bit (CNTK 2.7's `BlockRandomizer`, `NoRandomizer` and packers; `docs/parity.md`).
//!
//! Everything here is pure and deterministic. The input is a [`Timeline`]: the nominal length of
//! every sequence and the chunk each one belongs to, as the index pass produced them. The output
//! is a stream of [`MinibatchPlan`]s: lists of sequence references plus the checkpoint position.
//! Nothing here touches files or parsed data; the caller (the `dump` command, the daemon's
//! session actor) loads the chunks that the plans name.
//!
//! Invariants:
//! * the order of sequences is a function of (timeline, window, seed, sweep) only — never of the
//!   minibatch size, the number of minibatches taken or when a checkpoint was taken;
//! * a position is a count of nominal samples on the global timeline (all workers together);
//!   [`Sampler::restore`] to a position reproduces what an uninterrupted run delivers after it.

pub mod mt64;
mod plan;
pub mod randomizer;
pub mod scheduler;

#[cfg(test)]
mod proptests;

pub use plan::window_sequences;
pub use scheduler::{
    BuiltSweep, EpochLimit, EqualSteps, MinibatchPlan, NextSweepJob, Sampler, SamplingError, SamplingOptions, SeqRef,
    Tail, Window, DEFAULT_WINDOW_CHUNKS,
};

/// Narrows a sequence or chunk index to the `u32` of [`SeqRef`]. `Sampler::new` rejects
/// timelines whose counts do not fit (`SamplingError::TooManySequences`), so this cannot fail.
pub(crate) fn to_u32(index: usize) -> u32 {
    u32::try_from(index).expect("sequence and chunk counts are validated to fit in u32")
}

/// The shape of a dataset as the sampler sees it: sequences in file order, grouped into chunks.
///
/// Sequence `i` (global, 0-based, file order) has nominal length `seq_len[i]` (≥ 1). Chunk `c`
/// holds sequences `chunk_start[c] .. chunk_start[c + 1]`; chunks are contiguous and in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeline {
    /// Nominal length (samples) of each sequence, in file order.
    pub seq_len: Vec<u32>,
    /// Index of each chunk's first sequence; one more entry than there are chunks, the last equal
    /// to `seq_len.len()`.
    pub chunk_start: Vec<usize>,
}

impl Timeline {
    /// Number of chunks.
    #[must_use]
    pub fn num_chunks(&self) -> usize {
        self.chunk_start.len().saturating_sub(1)
    }

    /// Number of sequences.
    #[must_use]
    pub fn num_sequences(&self) -> usize {
        self.seq_len.len()
    }
}
