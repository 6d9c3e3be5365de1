//! A mixture's epochs at `open`: where epoch `k` starts (walked from the nearest start a session
//! walked to, and kept), and whether this worker's turn comes in the rest of the epoch.

use std::sync::Arc;

use minibatchd_engine::sampling::mixture::{Mixture, MixtureError, WeightSchedule, MAX_WALK_SLOTS};
use minibatchd_engine::sampling::SamplingError;

use super::super::admission::Refusal;
use super::super::open_session::off_the_event_loop;
use super::super::ControlPlane;
use crate::pipeline::data::mixing::{from_wire, to_wire};

/// What the start of a mixture's epoch depends on besides the epoch: its data and order options
/// (`identity`, `ohash`), the minibatch size and the weights by step (a schedule's steps are
/// minibatches). The key of [`super::super::session::EpochStarts`].
pub(super) fn epoch_key(identity: u64, ohash: u64, minibatch_size: usize, schedule: &WeightSchedule) -> u64 {
    let mut h = minibatchd_engine::hash::Fnv1a::new();
    h.u64(identity);
    h.u64(ohash);
    h.u64(minibatch_size as u64);
    for stage in schedule.stages() {
        h.u64(stage.from_step);
        for &p in stage.weights.parts() {
            h.u64(p);
        }
    }
    h.finish()
}

/// The state at the start of epoch `epoch` (`sweep`) of `mixture` (at the start of epoch 0):
/// from the latest epoch start before it that a session walked to (`starts`), the epochs between
/// walked ([`Mixture::skip_epochs`], bounded by [`MAX_WALK_SLOTS`] slots), and the result kept.
fn epoch_start(
    mixture: &mut Mixture,
    epoch: u64,
    minibatch_size: usize,
    key: u64,
    starts: &std::sync::Mutex<super::super::session::EpochStarts>,
    cancelled: &std::sync::atomic::AtomicBool,
) -> Result<minibatchd_client::protocol::MixtureState, MixtureError> {
    let lock = || starts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let known = lock().nearest(key, epoch);
    let from = match known {
        Some((e, state)) => {
            mixture.restore(&from_wire(&state))?;
            e
        }
        None => 0,
    };
    mixture.skip_epochs_unless(epoch - from, minibatch_size, MAX_WALK_SLOTS, cancelled)?;
    let state = to_wire(mixture.state());
    lock().insert(key, epoch, state.clone());
    Ok(state)
}

/// [`epoch_start`] on a blocking thread: `mixture` (at epoch 0's start) at the start of `epoch`,
/// and that state.
pub(super) async fn walk(
    name: &str,
    mut mixture: Mixture,
    epoch: u64,
    minibatch_size: usize,
    key: u64,
    shared: Arc<ControlPlane>,
    cancelled: Arc<std::sync::atomic::AtomicBool>,
) -> Result<(Mixture, minibatchd_client::protocol::MixtureState), Refusal> {
    let name = name.to_owned();
    off_the_event_loop(move || {
        let state = epoch_start(&mut mixture, epoch, minibatch_size, key, &shared.mixture_epochs, &cancelled);
        state.map(|s| (mixture, s)).map_err(|e| match e {
            // Counted and answered as any open its client gave up (`client_gone`).
            MixtureError::Cancelled => Refusal::Sampling(SamplingError::Cancelled),
            e => Refusal::Mixture { name, message: e.to_string() },
        })
    })
    .await
}

/// The warning of a worker that gets nothing more in this epoch: the slots left are fewer than
/// the workers, and they are dealt one a worker in turn (found by a probe: a mixture whose epoch
/// ends with a short source's sweep gave the last workers nothing in every epoch, without the
/// word a dataset's session gets). Walks at most as many slots as there are workers.
pub(super) fn no_data_warning(mixture: &mut Mixture, minibatch_size: usize) -> Result<Vec<String>, String> {
    let (workers, rank) = (mixture.options().num_workers as u64, mixture.options().rank as u64);
    if workers < 2 {
        return Ok(Vec::new());
    }
    let Some(left) = mixture.slots_left_below(minibatch_size, workers).map_err(|e| e.to_string())? else {
        return Ok(Vec::new());
    };
    let first = mixture.state().slots;
    if (0..left).any(|i| (first + i) % workers == rank) {
        return Ok(Vec::new());
    }
    Ok(vec![format!(
        "worker {rank} of {workers} gets no data in the rest of this epoch: it has {left} slot(s) left, dealt one a \
         worker in turn (slot g of an epoch to worker g mod {workers}); use fewer workers or a longer epoch \
         (max_samples, or weights that end the first sweep later)"
    )])
}
