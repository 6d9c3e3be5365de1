//! A mixture's weights: quantized to integer parts of [`WEIGHT_UNITS`], and by step.

use super::{MixtureError, MAX_SOURCES, WEIGHT_UNITS};

/// A mixture's weights, quantized to integer parts summing to [`WEIGHT_UNITS`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Weights(Vec<u64>);

impl Weights {
    /// Quantizes `weights` (any positive scale; shares are `w / Σw`) by largest remainder; a
    /// positive weight gets at least one part.
    ///
    /// # Errors
    /// No weight, more than [`MAX_SOURCES`], a negative or non-finite weight, or all zero.
    pub fn new(weights: &[f64]) -> Result<Self, MixtureError> {
        if weights.is_empty() {
            return Err(MixtureError::NoSources);
        }
        if weights.len() > MAX_SOURCES {
            return Err(MixtureError::TooManySources(weights.len()));
        }
        if let Some((index, &value)) = weights.iter().enumerate().find(|(_, w)| !w.is_finite() || **w < 0.0) {
            return Err(MixtureError::BadWeight { index, value });
        }
        let total: f64 = weights.iter().sum();
        if !total.is_finite() {
            return Err(MixtureError::SumTooLarge);
        }
        if total <= 0.0 {
            return Err(MixtureError::AllZero);
        }
        #[allow(clippy::cast_precision_loss)]
        let units = WEIGHT_UNITS as f64;
        let exact: Vec<f64> = weights.iter().map(|w| w / total * units).collect();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let mut parts: Vec<u64> = exact.iter().map(|e| (e.floor() as u64).min(WEIGHT_UNITS)).collect();
        // Largest remainder: the parts still missing go to the largest fractions, lowest index
        // first on a tie.
        let mut by_fraction: Vec<usize> = (0..parts.len()).collect();
        by_fraction
            .sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())).then(a.cmp(&b)));
        let mut missing = WEIGHT_UNITS.saturating_sub(parts.iter().sum());
        for &i in by_fraction.iter().cycle() {
            if missing == 0 {
                break;
            }
            parts[i] += 1;
            missing -= 1;
        }
        // Rounding may leave one over (the floors of shares close to 1); take it from the largest.
        while parts.iter().sum::<u64>() > WEIGHT_UNITS {
            let largest = largest_index(&parts);
            parts[largest] -= 1;
        }
        // A positive weight is never rounded away.
        for i in 0..parts.len() {
            if weights[i] > 0.0 && parts[i] == 0 {
                let largest = largest_index(&parts);
                parts[largest] -= 1;
                parts[i] = 1;
            }
        }
        Ok(Self(parts))
    }

    /// The parts of each source; they sum to [`WEIGHT_UNITS`].
    #[must_use]
    pub fn parts(&self) -> &[u64] {
        &self.0
    }

    /// The share of source `source` (its parts over [`WEIGHT_UNITS`]).
    #[must_use]
    pub fn share(&self, source: usize) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let share = self.0.get(source).copied().unwrap_or(0) as f64 / WEIGHT_UNITS as f64;
        share
    }

    /// Number of sources.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never: [`Weights::new`] refuses an empty list.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn largest_index(parts: &[u64]) -> usize {
    let mut best = 0;
    for (i, &p) in parts.iter().enumerate() {
        if p > parts[best] {
            best = i;
        }
    }
    best
}

/// Weights in force from a step (minibatch index) on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightStage {
    /// The first minibatch that these weights fill.
    pub from_step: u64,
    /// The weights.
    pub weights: Weights,
}

/// The weights of a mixture by step: stages starting at step 0, their steps strictly increasing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightSchedule(Vec<WeightStage>);

impl WeightSchedule {
    /// One set of weights for the whole run.
    #[must_use]
    pub fn constant(weights: Weights) -> Self {
        Self(vec![WeightStage { from_step: 0, weights }])
    }

    /// A schedule of stages.
    ///
    /// # Errors
    /// No stage, a first stage after step 0, steps not strictly increasing, or stages of different
    /// source counts.
    pub fn new(stages: Vec<WeightStage>) -> Result<Self, MixtureError> {
        let Some(first) = stages.first() else { return Err(MixtureError::NoStages) };
        let sources = first.weights.len();
        for (i, stage) in stages.iter().enumerate() {
            let step_ok = if i == 0 { stage.from_step == 0 } else { stage.from_step > stages[i - 1].from_step };
            if !step_ok {
                return Err(MixtureError::BadSchedule { stage: i, step: stage.from_step });
            }
            if stage.weights.len() != sources {
                return Err(MixtureError::WeightCount { given: stage.weights.len(), sources });
            }
        }
        Ok(Self(stages))
    }

    /// The weights in force at `step`.
    #[must_use]
    pub fn at(&self, step: u64) -> &Weights {
        let after = self.0.partition_point(|s| s.from_step <= step);
        // The first stage starts at step 0, so `after ≥ 1`.
        &self.0[after.max(1) - 1].weights
    }

    /// The stages.
    #[must_use]
    pub fn stages(&self) -> &[WeightStage] {
        &self.0
    }

    /// Number of sources.
    #[must_use]
    pub fn sources(&self) -> usize {
        self.0[0].weights.len()
    }
}
