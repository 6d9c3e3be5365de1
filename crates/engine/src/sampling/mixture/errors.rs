//! Why a mixture cannot be built, restored or walked ([`MixtureError`]).

use super::MAX_SOURCES;

/// Why a mixture cannot be built or restored.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MixtureError {
    /// No source.
    #[error("a mixture needs at least one source")]
    NoSources,
    /// More than [`MAX_SOURCES`] sources.
    #[error("a mixture has at most {MAX_SOURCES} sources, not {0}")]
    TooManySources(usize),
    /// A weight that is negative, not finite, or that the schedule lists for another number of
    /// sources.
    #[error("weight {index} is {value}: weights are finite numbers ≥ 0")]
    BadWeight {
        /// Index of the weight (its source).
        index: usize,
        /// The weight given.
        value: f64,
    },
    /// Every weight is 0.
    #[error("at least one weight must be positive")]
    AllZero,
    /// The weights' sum is not a finite number.
    #[error("the weights' sum is too large: scale them down")]
    SumTooLarge,
    /// A stage of the schedule has another number of weights than the mixture has sources.
    #[error("a weight stage lists {given} weights for {sources} sources")]
    WeightCount {
        /// Weights given.
        given: usize,
        /// Sources of the mixture.
        sources: usize,
    },
    /// A weight schedule without a stage.
    #[error("a weight schedule needs at least one stage, the first from step 0")]
    NoStages,
    /// The schedule's stages do not start at step 0 with strictly increasing steps.
    #[error("the weight schedule must start at step 0 and its steps must increase strictly (stage {stage} starts at step {step})")]
    BadSchedule {
        /// Index of the offending stage.
        stage: usize,
        /// Its first step.
        step: u64,
    },
    /// A source's sampler refused its options or timeline.
    #[error("source {source_index}: {error}")]
    Source {
        /// Index of the source.
        source_index: usize,
        /// What its sampler said.
        error: String,
    },
    /// No worker, or a rank out of range: the mixture's own options, not a source's (found by a
    /// probe: it was told as source 0's).
    #[error("{0}")]
    Workers(String),
    /// A state that this mixture cannot have produced.
    #[error("not a state of this mixture: {0}")]
    BadState(String),
    /// The walk was given up: whoever asked for it no longer waits
    /// ([`super::Mixture::skip_epochs_unless`]).
    #[error("the walk to the epoch was cancelled: the client that opened the session went away")]
    Cancelled,
}
