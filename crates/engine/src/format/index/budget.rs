//! The index pass's budget: the check before each sequence is added, and its errors.

use super::{SequenceDesc, Sequences};
use crate::format::errors::DataError;
use crate::options::{IndexLimits, INDEX_SHARE_OF_MEMORY_LIMIT};

/// The index pass's check before it adds `next` to `sequences` (at `at`): an error when the
/// file's index would then pass `limits` — more than `limits.max_sequences` sequences, or more
/// than `limits.max_index_bytes` bytes, counting the columns `next` is the first to need for
/// every sequence before it.
pub(crate) fn room_for_one_more(
    sequences: &Sequences,
    next: &SequenceDesc,
    limits: &IndexLimits,
    at: impl FnOnce() -> crate::format::errors::Location,
) -> Result<(), DataError> {
    let n = sequences.len() as u64;
    // Well within both limits whatever columns `next` adds: the exact cost (a dozen branches per
    // sequence, a sixth of a pass over millions of short lines) only near the budget.
    let bound = sequences.footprint_bound() + (n + 1) * limits.bytes_per_sequence + limits.lengths_bytes(n + 1, true);
    if n < limits.max_sequences && bound <= limits.max_index_bytes {
        return Ok(());
    }
    let cost = sequences.footprint_after(next)
        + (n + 1) * limits.bytes_per_sequence
        + limits.lengths_bytes(n + 1, sequences.columns_after(next).samples);
    if n >= limits.max_sequences {
        return Err(too_many_sequences(at(), limits.max_sequences));
    }
    if cost > limits.max_index_bytes {
        return Err(DataError::Fatal {
            at: at(),
            message: format!(
                "the dataset's index would hold more than {} bytes with {} sequences{}",
                limits.max_index_bytes,
                n + 1,
                budget_advice()
            ),
        });
    }
    Ok(())
}

/// The end of a message about the index's budget.
fn budget_advice() -> String {
    format!(
        ", the most its index may hold within the memory limit (daemon.memory_limit_bytes / \
         {INDEX_SHARE_OF_MEMORY_LIMIT} for the indexes of all datasets; an index holds 1.25 to 37 bytes per \
         sequence of one source); raise daemon.memory_limit_bytes"
    )
}

/// The error of a sequence at `at` past the `max` sequences the index may count.
pub(crate) fn too_many_sequences(at: crate::format::errors::Location, max: u64) -> DataError {
    DataError::Fatal { at, message: format!("the dataset has more than {max} sequences{}", budget_advice()) }
}
