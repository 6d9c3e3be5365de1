//! The error budgets (CNTK's `maxErrors`, one per source): shared by every reader of a dataset
//! (`dump`, one process), or — in the daemon — one per session, each charging the malformed
//! places the parse keeps with each chunk it loads ([`Dataset::charge_per_reader`]).

use super::Dataset;
use crate::format::chunk::ParsedChunk;
use crate::format::errors::{DataError, ErrorBudget, Malformed};
use crate::Result;

/// Charges `chunk`'s malformed places ([`ParsedChunk::malformed`]) to one reader's `budgets`
/// ([`Dataset::reader_budgets`]); a place charged before (the chunk loaded again) costs nothing.
///
/// # Errors
/// [`crate::format::errors::DataError::TooManyErrors`] with the first place past a budget.
pub fn charge_chunk(budgets: &[ErrorBudget], chunk: &ParsedChunk) -> Result<()> {
    for (budget, places) in budgets.iter().zip(&chunk.malformed) {
        budget.charge(places)?;
    }
    Ok(())
}

impl Dataset {
    /// The error budgets, one per source (each source is one CNTK deserializer, and
    /// `max_errors` is counted per deserializer), shared by every reader of this dataset — unless
    /// each reader has its own ([`Dataset::charge_per_reader`]): then these only say which places
    /// were found before (each is logged and counted once), and never run out.
    #[must_use]
    pub fn budgets(&self) -> &[ErrorBudget] {
        &self.budgets
    }

    /// Each reader of this dataset — a daemon's session — charges the malformed places of the
    /// chunks it uses to budgets of its own ([`Dataset::reader_budgets`], [`charge_chunk`]), as
    /// one `dump` (or one CNTK process) with its options would: a parse keeps the places with the
    /// chunk ([`ParsedChunk::malformed`]) instead of failing once the dataset's shared budget
    /// runs out. Found by a probe: with `max_errors = 1` and a bad line in each rank's chunks,
    /// the second rank failed at its first minibatch, its budget spent by the first rank's line,
    /// where `dump` of each rank delivers its sweep; and once spent, the chunk failed every later
    /// session until a restart.
    pub fn charge_per_reader(&mut self) {
        self.per_reader = true;
        self.budgets = self.budgets.iter().map(|_| ErrorBudget::new(u64::MAX)).collect();
    }

    /// `error`, the failure of chunk `chunk`, as one reader with `budgets` is told it: the places
    /// left out before a fatal error in the chunk are charged first, so a reader whose budget
    /// they spend gets [`DataError::TooManyErrors`] with the place past it — as `dump` does —
    /// and the fatal error otherwise. (Found by CI: with `max_errors = 0` a bad value that
    /// emptied a stream was reported as the stream's absence, not as the value.)
    #[must_use]
    pub fn charge_failed_chunk(&self, budgets: &[ErrorBudget], chunk: usize, error: DataError) -> DataError {
        let places = self.failed_places.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&chunk).cloned();
        for (budget, p) in budgets.iter().zip(places.iter().flatten()) {
            if let Err(too_many) = budget.charge(p) {
                return too_many;
            }
        }
        error
    }

    /// The malformed places a reader may be charged, per source: the first `max_errors + 1` of
    /// each (more cannot change where a budget runs out).
    pub(super) fn places_kept<'a>(&self, by_source: impl Iterator<Item = &'a [Malformed]>) -> Vec<Vec<Malformed>> {
        let keep = usize::try_from(self.config.max_errors.saturating_add(1)).unwrap_or(usize::MAX);
        by_source.map(|e| e[..e.len().min(keep)].to_vec()).collect()
    }

    /// Fresh budgets for one reader ([`Dataset::charge_per_reader`]): `max_errors` per source.
    #[must_use]
    pub fn reader_budgets(&self) -> Vec<ErrorBudget> {
        self.sources.iter().map(|_| ErrorBudget::new(self.config.max_errors)).collect()
    }

    /// Charges each source's errors (`by_source[s]`, in the order they were found) to source
    /// `s`'s budget; returns the newly charged ones.
    pub(super) fn charge(&self, by_source: &[Vec<Malformed>]) -> Result<Vec<Malformed>> {
        let mut fresh = Vec::new();
        for (budget, errors) in self.budgets.iter().zip(by_source) {
            fresh.extend(budget.charge(errors)?);
        }
        Ok(fresh)
    }

    /// CNTK charges each error as it occurs, so an error that exhausts a budget is reported
    /// before a fatal condition found later: charge what was found first (`by_source`: the
    /// sources decoded so far, then the current one's errors up to the fatal condition).
    pub(super) fn fatal_after(
        &self,
        chunk: usize,
        fatal: DataError,
        by_source: &[Vec<Malformed>],
        current: &[Malformed],
    ) -> DataError {
        if self.per_reader && matches!(fatal, DataError::Fatal { .. }) {
            // Each reader charges them before it is told the fatal error, as `dump` does here.
            let places = self.places_kept(by_source.iter().map(Vec::as_slice).chain(std::iter::once(current)));
            if places.iter().any(|p| !p.is_empty()) {
                self.failed_places.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(chunk, places);
            }
        }
        let result = self
            .charge(by_source)
            .and_then(|_| self.budgets.get(by_source.len()).map_or(Ok(Vec::new()), |b| b.charge(current)));
        match (result, fatal) {
            (Err(too_many), _) => too_many,
            // Found by a probe: a place left out as `max_errors` allows can be what makes the fatal
            // condition (a sparse index past the dimension drops a stream's only sample, and the
            // sequence then lacks the stream): the fatal error names the first of them, which the
            // log would not show (a failed chunk's warnings are not logged).
            (Ok(_), DataError::Fatal { at, message }) => {
                let tolerated: Vec<&Malformed> = by_source.iter().flatten().chain(current).collect();
                let message = match tolerated.first() {
                    Some(first) => format!(
                        "{message} (before it in this chunk, {} malformed place(s) left out as max_errors allows, the first: {first})",
                        tolerated.len()
                    ),
                    None => message,
                };
                DataError::Fatal { at, message }
            }
            (Ok(_), fatal) => fatal,
        }
    }
}
