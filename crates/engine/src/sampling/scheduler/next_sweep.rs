//! A sweep's order built away from its sampler ([`Sampler::next_sweep_job`], on another thread
//! while the sampler goes on) and installed in it ([`Sampler::install_next_sweep`]).

use std::sync::Arc;

use super::{Sampler, SamplingOptions};
use crate::sampling::plan::SweepPlan;
use crate::sampling::Timeline;

/// The building of a sweep's order away from its sampler ([`Sampler::next_sweep_job`]): owned,
/// `Send`, run anywhere.
#[derive(Debug)]
pub struct NextSweepJob {
    timeline: Arc<Timeline>,
    options: SamplingOptions,
    sweep: u64,
    sweep_size: u64,
    epoch_end: u64,
}

impl NextSweepJob {
    /// The sweep it builds.
    #[must_use]
    pub fn sweep(&self) -> u64 {
        self.sweep
    }

    /// Builds the order's first window (what the sampler would have built).
    #[must_use]
    pub fn build(self) -> BuiltSweep {
        BuiltSweep(SweepPlan::build(&self.timeline, &self.options, self.sweep, self.sweep_size, self.epoch_end))
    }
}

/// A sweep's order built by a [`NextSweepJob`], for [`Sampler::install_next_sweep`].
#[derive(Debug)]
pub struct BuiltSweep(SweepPlan);

impl Sampler {
    /// The work of building the next sweep's order, to run on another thread while this sampler
    /// goes on (a sweep of millions of sequences takes tens of milliseconds); `None` when it is
    /// built already or the epoch ends before it. Install the result with
    /// [`Sampler::install_next_sweep`]; the next sweep's order is then the same as if this
    /// sampler had built it itself.
    #[must_use]
    pub fn next_sweep_job(&self) -> Option<NextSweepJob> {
        let sweep = self.current.sweep + 1;
        if self.next.get().is_some() || sweep.saturating_mul(self.sweep_size) >= self.epoch_end {
            return None;
        }
        Some(NextSweepJob {
            timeline: self.timeline.clone(),
            options: self.options.clone(),
            sweep,
            sweep_size: self.sweep_size,
            epoch_end: self.epoch_end,
        })
    }

    /// Takes the order a [`NextSweepJob`] of this sampler built, if it is still the next sweep's
    /// and none is there yet; whether it was taken.
    pub fn install_next_sweep(&self, built: BuiltSweep) -> bool {
        built.0.sweep == self.current.sweep + 1 && self.next.set(built.0).is_ok()
    }
}
