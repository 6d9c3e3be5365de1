//! Where the daemon's life stands, and the messages every stage actor answers: the phase
//! (`/healthz`, `sd_notify`), which stages run, [`StopStage`] from the supervisor and
//! [`StageStopped`] back to it. A leaf of the pipeline: the stages of every plane import it, and it
//! imports none of them.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use actix::Message;

use crate::metrics::Metrics;
use crate::stage::Stage;

/// Where the daemon's life stands (for `/healthz`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Stages starting; not ready.
    Starting,
    /// Serving (`READY=1` sent).
    Serving,
    /// Stopping (`STOPPING=1` sent).
    Stopping,
}

/// Liveness of the daemon and its stages.
#[derive(Debug, Default)]
pub struct Health {
    phase: AtomicU8,
    stages: [AtomicBool; Stage::COUNT],
}

impl Health {
    /// The phase.
    #[must_use]
    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Relaxed) {
            0 => Phase::Starting,
            1 => Phase::Serving,
            _ => Phase::Stopping,
        }
    }

    /// Sets the phase.
    pub fn set_phase(&self, p: Phase) {
        self.phase.store(p as u8, Ordering::Relaxed);
    }

    /// Whether `stage` runs.
    #[must_use]
    pub fn stage_up(&self, stage: Stage) -> bool {
        self.stages[stage.index()].load(Ordering::Relaxed)
    }

    /// Whether every stage runs.
    #[must_use]
    pub fn all_up(&self) -> bool {
        Stage::ALL.iter().all(|&s| self.stage_up(s))
    }

    /// The stages that do not run, in start order.
    #[must_use]
    pub fn down(&self) -> Vec<Stage> {
        Stage::ALL.into_iter().filter(|&s| !self.stage_up(s)).collect()
    }

    /// Records whether `stage` runs, here and in `minibatchd_stage_up`.
    pub fn set_stage_up(&self, metrics: &Metrics, stage: Stage, up: bool) {
        self.stages[stage.index()].store(up, Ordering::Relaxed);
        metrics.data.stage_up.with_label_values(&[stage.name()]).set(i64::from(up));
    }
}

/// A stage's actor stopped (to the supervisor).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct StageStopped(pub Stage);

/// Asks a stage to stop (the supervisor's shutdown, in reverse start order).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct StopStage;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_tracks_phase_and_each_stage() {
        let metrics = Metrics::new().expect("metrics");
        let h = Health::default();
        assert_eq!(h.phase(), Phase::Starting);
        assert_eq!(h.down(), Stage::ALL.to_vec());
        for s in Stage::ALL {
            h.set_stage_up(&metrics, s, true);
        }
        assert!(h.all_up());
        h.set_stage_up(&metrics, Stage::Cache, false);
        assert_eq!(h.down(), vec![Stage::Cache]);
        assert_eq!(metrics.data.stage_up.with_label_values(&["cache"]).get(), 0);
        assert_eq!(metrics.data.stage_up.with_label_values(&["readahead"]).get(), 1);
        h.set_phase(Phase::Stopping);
        assert_eq!(h.phase(), Phase::Stopping);
    }
}
