//! A mixture's state, and what it can be: the relations every state a mixture writes keeps,
//! checked before a state is restored (a state is not signed; one that breaks them was edited or
//! is of another mixture, and is refused with what is wrong rather than served).

use super::{MixtureEpoch, MixtureError, WEIGHT_UNITS};

/// Where one source of a mixture stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceState {
    /// The source's position: nominal samples on its own timeline, over all its sweeps (a
    /// single-dataset checkpoint position of the source).
    pub position: u64,
    /// Sequences the mixture took from this source, in all.
    pub taken: u64,
    /// The source's credit in the round-robin (see the module's documentation).
    pub credit: i64,
    /// The weight parts the credit was built under.
    pub weight: u64,
}

/// A mixture's checkpoint: the same on every worker after the same minibatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MixtureState {
    /// Minibatches taken in this epoch (the next one's step).
    pub step: u64,
    /// Slots (sequences) taken in this epoch, by all workers.
    pub slots: u64,
    /// Nominal samples taken in this epoch, by all workers.
    pub samples: u64,
    /// The epoch has ended: the next minibatch is none.
    pub ended: bool,
    /// Each source.
    pub sources: Vec<SourceState>,
}

impl MixtureState {
    /// The state of a fresh mixture of `sources` sources.
    #[must_use]
    pub fn start(sources: usize) -> Self {
        Self {
            step: 0,
            slots: 0,
            samples: 0,
            ended: false,
            sources: vec![SourceState { position: 0, taken: 0, credit: 0, weight: 0 }; sources],
        }
    }

    /// The start of the next epoch after this one: the sources stay where they are (with their
    /// credits), the epoch's counts start again.
    #[must_use]
    pub fn next_epoch(&self) -> Self {
        Self { step: 0, slots: 0, samples: 0, ended: false, sources: self.sources.clone() }
    }
}

/// The credits a source can have in a state, `(lowest, highest)`, both excluded: a credit falls
/// only when its source is picked — with the largest credit, at least `W / sources` once the
/// weights (their sum `W` = [`WEIGHT_UNITS`]) are added — by `W`, so it stays above `-W`; the
/// credits sum to 0, so none reaches `(sources - 1) · W`. A state beyond them is not one of a
/// mixture's.
fn credit_bounds(sources: usize) -> (i64, i64) {
    let w = i64::try_from(WEIGHT_UNITS).unwrap_or(i64::MAX);
    let others = i64::try_from(sources.saturating_sub(1)).unwrap_or(i64::MAX).max(1);
    (-w, w.saturating_mul(others))
}

fn bad(what: String) -> MixtureError {
    MixtureError::BadState(what)
}

/// Checks `state` against a mixture whose sources' sequences are `lengths` (each source's
/// shortest and longest sequence in samples, and whether every one is a sample) and whose epoch
/// ends by `epoch`. Where a source stands inside its sweep is left to its sampler's restore.
///
/// # Errors
/// [`MixtureError::BadState`] naming the first relation the state breaks.
pub(super) fn check(
    state: &MixtureState,
    lengths: &[(u64, u64, bool)],
    epoch: MixtureEpoch,
) -> Result<(), MixtureError> {
    let n = lengths.len();
    if state.sources.len() != n {
        return Err(bad(format!("{} sources, this mixture has {n}", state.sources.len())));
    }
    let max = crate::sampling::scheduler::MAX_EPOCH_SAMPLES;
    if state.step > max || state.slots > max || state.samples > max {
        return Err(bad(format!(
            "step {}, slots {} or samples {} out of range",
            state.step, state.slots, state.samples
        )));
    }
    sources(state, lengths)?;
    epoch_counts(state, lengths, epoch)
}

/// Each source's credit, weight, position and sequences taken; the credits' and weights' sums.
fn sources(state: &MixtureState, lengths: &[(u64, u64, bool)]) -> Result<(), MixtureError> {
    let max = crate::sampling::scheduler::MAX_EPOCH_SAMPLES;
    let (lowest, highest) = credit_bounds(lengths.len());
    let (mut credits, mut weights) = (0i64, 0u64);
    for (i, (s, &(shortest, longest, ones))) in state.sources.iter().zip(lengths).enumerate() {
        if s.credit <= lowest || s.credit >= highest || s.weight > WEIGHT_UNITS {
            return Err(bad(format!("source {i}: credit {} or weight {} out of range", s.credit, s.weight)));
        }
        if s.position > max || s.taken > max {
            return Err(bad(format!(
                "source {i}: position {} or sequences taken {} out of range",
                s.position, s.taken
            )));
        }
        // A source starts at 0 and moves by the samples of each sequence taken: one each
        // where every sequence is one sample, at least the shortest and at most the longest
        // otherwise (found by a probe: a position far below its sequences taken was served).
        let reachable = if ones {
            s.position == s.taken
        } else {
            (s.taken.saturating_mul(shortest)..=s.taken.saturating_mul(longest)).contains(&s.position)
        };
        if !reachable {
            return Err(bad(format!(
                "source {i}: position {} is not where {} sequences taken from its start lead",
                s.position, s.taken
            )));
        }
        credits += s.credit;
        weights += s.weight;
    }
    if credits != 0 {
        return Err(bad(format!("the credits sum to {credits}, not 0")));
    }
    // The weights the credits were built under are quantized ones, which sum to `W`; before the
    // first slot, none yet (all 0), and nothing is taken (found by a probe: parts summing to
    // anything were served).
    if weights == 0 {
        if let Some((i, s)) = state.sources.iter().enumerate().find(|(_, s)| s.taken > 0 || s.credit != 0) {
            return Err(bad(format!(
                "source {i}: {} sequences taken and credit {}, but no weights yet (every weight 0 is the state \
                 before the first slot)",
                s.taken, s.credit
            )));
        }
    } else if weights != WEIGHT_UNITS {
        return Err(bad(format!("the weights' parts sum to {weights}, not {WEIGHT_UNITS}")));
    }
    Ok(())
}

/// The epoch's step, slots and samples against each other, the sources and the epoch's end.
fn epoch_counts(state: &MixtureState, lengths: &[(u64, u64, bool)], epoch: MixtureEpoch) -> Result<(), MixtureError> {
    let taken = state.sources.iter().fold(0u64, |t, s| t.saturating_add(s.taken));
    let positions = state.sources.iter().fold(0u64, |t, s| t.saturating_add(s.position));
    // The epoch's slots are sequences taken from the sources (earlier epochs took more), and its
    // samples theirs.
    if state.slots > taken || state.samples > positions {
        return Err(bad(format!(
            "{} slots and {} samples in this epoch, but {taken} sequences of {positions} samples taken from the \
             sources in all",
            state.slots, state.samples
        )));
    }
    // Every minibatch takes at least one slot, and every slot is in a minibatch (found by a
    // probe: a step past the slots moved a weight schedule to a later stage).
    if state.step > state.slots || (state.slots > 0 && state.step == 0) {
        return Err(bad(format!(
            "step {} with {} slots: every minibatch takes at least one slot",
            state.step, state.slots
        )));
    }
    // Every slot is a sequence of at least the shortest and at most the longest any source has
    // (found by a probe: a state with fewer samples than slots lengthened a `max_samples` epoch).
    let shortest = lengths.iter().map(|&(s, _, _)| s).min().unwrap_or(0);
    let longest = lengths.iter().map(|&(_, l, _)| l).max().unwrap_or(0);
    if state.samples < state.slots.saturating_mul(shortest) || state.samples > state.slots.saturating_mul(longest) {
        return Err(bad(format!(
            "{} samples in {} slots of sequences of {shortest} to {longest} sample(s)",
            state.samples, state.slots
        )));
    }
    match epoch {
        // An endless mixture's epoch never ends (found by a probe: such a state, edited, was
        // served as an epoch with nothing left, and a trainer's loop ended without a word).
        MixtureEpoch::Endless if state.ended => {
            Err(bad("the epoch has ended, but this mixture's epoch is endless and never ends".into()))
        }
        // It ends with the first slot that reaches the limit, and only then (an epoch's start
        // before its first minibatch says not yet, whatever the limit); that slot starts before
        // the limit (found by a probe: a state past the limit, not ended, ended at once unsaid).
        MixtureEpoch::Samples(limit)
            if (state.ended || state.slots != 0) && state.ended != (state.samples >= limit) =>
        {
            Err(bad(format!(
                "{} samples of an epoch of {limit}, but the epoch {}",
                state.samples,
                if state.ended { "has ended" } else { "goes on" }
            )))
        }
        MixtureEpoch::Samples(limit) if state.samples >= limit.saturating_add(longest) => Err(bad(format!(
            "{} samples of an epoch of {limit}: its last slot, of at most {longest} sample(s), starts before it",
            state.samples
        ))),
        MixtureEpoch::FirstSweepEnd if state.ended && state.slots == 0 => {
            Err(bad("the epoch has ended before its first slot".into()))
        }
        _ => Ok(()),
    }
}
