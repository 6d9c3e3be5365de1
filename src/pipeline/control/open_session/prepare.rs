//! Preparing a dataset session's `open` off the event loop: the dataset in force, its options
//! resolved, the saved state checked, the sampler placed (a fresh start, a resume, or a job's
//! continuation), and the window and ring checked against the memory they need.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use minibatchd_client::protocol::{hex64, JobBase, SessionOptions, SessionState, STATE_VERSION};
use minibatchd_engine::sampling::{randomizer, EpochLimit, Sampler, SamplingError, SamplingOptions, Tail, Window};
use minibatchd_shm::RingGeometry;

use super::{off_the_event_loop, SamplingReservation};
use crate::pipeline::control::admission::Refusal;
use crate::pipeline::control::session::{
    check_job_order, check_resume, check_worker, options_hash, resolve_options, ResolvedOptions, ResumeError,
    MAX_SLOT_SIZE_BYTES,
};
use crate::pipeline::control::ControlPlane;
use crate::pipeline::data::catalog::{CatalogError, DatasetRuntime};
use crate::pipeline::data::chunk_cache::ChunkKey;
use crate::pipeline::data::persister::DemandMark;
use crate::pipeline::data::producer::PREFETCH_CHUNKS;

/// An `open` resolved against its dataset, before anything shared is touched.
pub(super) struct Prepared {
    pub(super) rt: Arc<DatasetRuntime>,
    pub(super) resolved: ResolvedOptions,
    pub(super) options_hash: u64,
    pub(super) sampler: Sampler,
    /// The sampler's memory, reserved before it was built.
    pub(super) sampling: SamplingReservation,
    pub(super) geometry: RingGeometry,
    /// With `resume_job`: the state this session starts from (the earliest position of the
    /// earlier run, and that run's positions).
    pub(super) job_start: Option<SessionState>,
    /// The session counts as a producer at work from here on (its first chunks are being parsed).
    pub(super) working: DemandMark,
}

/// [`prepare_now`] on a blocking thread: the sweep orders a session starts from, and a
/// `resume_job`'s walk, take time on a large dataset, and the connections of every other client
/// share the event loop.
pub(super) async fn prepare(
    dataset: &str,
    options: &SessionOptions,
    shared: &Arc<ControlPlane>,
    cancelled: &Arc<AtomicBool>,
) -> Result<Prepared, Refusal> {
    let (dataset, options, shared, cancelled) =
        (dataset.to_owned(), options.clone(), shared.clone(), cancelled.clone());
    off_the_event_loop(move || prepare_now(&dataset, &options, &shared, &cancelled)).await
}

/// Resolves an `open`: the dataset, the options, a `resume` state's fit, the sampler (equal steps
/// applied) and the ring's geometry (slots raised to fit a minibatch as far as the index bounds it).
pub(super) fn prepare_now(
    dataset: &str,
    options: &SessionOptions,
    shared: &Arc<ControlPlane>,
    cancelled: &AtomicBool,
) -> Result<Prepared, Refusal> {
    let rt = unchanged_dataset(shared, dataset)?;
    chunks_fit(&rt)?;
    let config = shared.config();
    let d = &config.daemon;
    let mut resolved = resolve_options(options, rt.dataset.config(), d.ring_slots as u64, d.slot_size_bytes)?;
    let ohash = options_hash(&resolved.sampling, resolved.equal_steps, resolved.tail);
    if let Some(s) = &options.resume {
        check_resume(s, dataset, rt.identity, rt.legacy_identity, ohash, equal_steps_minibatch(&resolved))?;
        check_worker(s, super::session_worker(&resolved))?;
    }
    // A minibatch holds no more samples than its epoch (found by a probe: a minibatch_size of
    // 2^31 - 1 over a full sweep of 353 samples asked for a ring of 206 GB, where dump gives one
    // minibatch); `slot_bound` adds room for the longest sequence.
    let sweep = rt.dataset.timeline().samples(..);
    let epoch = match resolved.sampling.limit {
        EpochLimit::FullSweep | EpochLimit::Sweep(_) => Some(sweep),
        EpochLimit::Sweeps(k) => k.checked_mul(sweep),
        EpochLimit::Samples(n) => Some(n),
        EpochLimit::Infinite => None,
    };
    let local = (resolved.minibatch_size as u64 / resolved.sampling.num_workers as u64 + 1)
        .min(epoch.map_or(u64::MAX, |e| e.saturating_add(1)));
    let bound = rt.slot_bound(local);
    let slot_size = ring_for(options, &mut resolved, bound);
    let geometry = RingGeometry::new(resolved.slots, slot_size);
    // The sweep orders, and the minibatches in flight: each of at most `local` sequences.
    let job = options.resume_job.is_some() || options.resume.as_ref().is_some_and(|s| s.job.is_some());
    let mut sampling = SamplingReservation::new(shared, local, rt.streams.len(), resolved.slots);
    sampling.opening(rt.dataset.timeline(), &resolved.sampling, job, resolved.equal_steps)?;
    // From here the session waits for data: the persister paces its writes.
    let working = shared.data.demand.working();
    let lingering = resolved.session.as_deref().is_some_and(|n| shared.registry().is_lingering(n));
    // An `open` whose ring cannot fit now is refused at admission: it asks for no chunk.
    let ring_fits = shared.registry().ring_fits(geometry.total_bytes());
    if options.resume.is_none() && options.resume_job.is_none() && !lingering && ring_fits {
        // Parsing starts now, while the sampler computes the sweep's sequence order (a tenth of a
        // second per million sequences, all of it before the first chunk was asked for): the
        // chunks this worker reads, in the order the sweep first needs them, as many as the
        // cache takes. Not for a session that starts elsewhere (a resumed one).
        let sweep = resolved.sampling.first_sweep();
        let order = randomizer::chunk_need_order(rt.dataset.timeline(), &resolved.sampling, sweep);
        shared.data.cache.prefetch(None, order.into_iter().take(PREFETCH_CHUNKS).map(|c| ChunkKey::new(rt.index, c)));
    }
    let sampler = Sampler::new(rt.dataset.timeline().clone(), resolved.sampling.clone())?;
    // The walks a `resume` state's job and equal steps will take, refused now if too long: after
    // admission a refusal would park the session's name with a state these options no longer fit.
    let resumed_job = options.resume.as_ref().and_then(|s| s.job.as_ref()).map(|j| j.positions.as_slice());
    if let Some(positions) = resumed_job {
        sampler.job_walk_fits(positions)?;
    }
    let job_from = match (&options.resume_job, resumed_job) {
        (Some(states), _) => Some(states.iter().map(|s| s.position).min().unwrap_or(0)),
        (None, Some(p)) => Some(p.iter().copied().min().unwrap_or(0)),
        (None, None) => None,
    };
    if resolved.equal_steps {
        sampler.equal_steps_walk_fits(job_from)?;
    }
    let job_start = match &options.resume_job {
        Some(states) => Some(job_start(
            states,
            dataset,
            &rt,
            ohash,
            Sampler::new(rt.dataset.timeline().clone(), resolved.sampling.clone())?,
            cancelled,
        )?),
        None => None,
    };
    Ok(Prepared { rt, resolved, options_hash: ohash, sampler, sampling, geometry, job_start, working })
}

/// The state a session that continues the earlier run of `states` (`resume_job`, rank order)
/// starts from: each state checked as a `resume` state is, then the earliest of their positions,
/// minibatch 0, and their positions as the job base. A state that continues a run itself
/// (`job`) is taken only when every position is past that run's ragged band: the band of two
/// earlier runs is not composed.
pub(super) fn job_start(
    states: &[SessionState],
    dataset: &str,
    rt: &DatasetRuntime,
    ohash: u64,
    fresh: Sampler,
    cancelled: &AtomicBool,
) -> Result<SessionState, Refusal> {
    check_job_order(states)?;
    for s in states {
        // Any minibatch size: equal steps are counted afresh from where the earlier run stood.
        check_resume(s, dataset, rt.identity, rt.legacy_identity, ohash, None)?;
    }
    let positions: Vec<u64> = states.iter().map(|s| s.position).collect();
    let earliest = positions.iter().copied().min().unwrap_or(0);
    for s in states {
        if let Some(base) = &s.job {
            let band_end = base.positions.iter().copied().max().unwrap_or(0);
            if earliest < band_end {
                return Err(Refusal::Resume(ResumeError::JobBand { earliest, band_end }));
            }
        }
    }
    // Before the walk (found by a review: the walk's restore told it invalid_options).
    within_epoch(&fresh, earliest)?;
    let mut probe = fresh;
    probe.resume_job_unless(&positions, cancelled).map_err(inside_sequence)?;
    Ok(SessionState {
        version: STATE_VERSION,
        dataset: dataset.to_owned(),
        position: probe.position(),
        minibatches: 0,
        data_identity: hex64(rt.identity),
        options_hash: hex64(ohash),
        job: Some(JobBase { positions }),
        worker: None,
        mixture: None,
        // Set by the session that starts from it (`open`).
        equal_steps_minibatch: None,
        // A worker's state written under other decoding, if any, for `open` to tell of (found
        // by a review: the job's start said none, so a resume_job after such a reload was not
        // told); `open` then puts the dataset's own.
        decode_digest: {
            let now = hex64(rt.decode_digest);
            states.iter().find_map(|s| s.decode_digest.clone().filter(|d| *d != now))
        },
    })
}

/// Refuses a state whose earliest position (`earliest`: its own, or a job worker's) stands before
/// the first that `sampler`'s epoch reaches, as a `resume` that does not fit (found by a probe: a
/// `sweep = 2` session resumed from an edited state at position 100 delivered sweeps 0 to 2).
fn within_epoch(sampler: &Sampler, earliest: u64) -> Result<(), Refusal> {
    let first = sampler.earliest_position();
    if earliest < first {
        return Err(Refusal::Resume(ResumeError::BeforeEpoch { position: earliest, earliest: first }));
    }
    Ok(())
}

/// A state's position inside a sequence is a `resume` that does not fit; other errors as they are.
fn inside_sequence(e: SamplingError) -> Refusal {
    match e {
        SamplingError::InsideSequence { position, next } => {
            Refusal::Resume(ResumeError::InsideSequence { position, next })
        }
        e => Refusal::Sampling(e),
    }
}

/// Puts `sampler` where the session starts (`start`: the earlier run it continues, its
/// position) and applies equal steps; the sampler and the minibatch index to pad the epoch to, if
/// padded.
pub(super) fn place_sampler(
    mut sampler: Sampler,
    start: &SessionState,
    resolved: &ResolvedOptions,
    dataset: &str,
    shared: &ControlPlane,
    rt: &DatasetRuntime,
    cancelled: &AtomicBool,
) -> Result<(Sampler, Option<u64>, Vec<String>), Refusal> {
    let job_positions = start.job.iter().flat_map(|j| j.positions.iter().copied());
    within_epoch(&sampler, job_positions.fold(start.position, u64::min))?;
    if let Some(job) = &start.job {
        sampler.resume_job_unless(&job.positions, cancelled).map_err(inside_sequence)?;
    }
    if start.position > sampler.latest_position(rt.max_seq_len) {
        // Found by a probe: a hand-edited state past the epoch's end was taken, and the session
        // ended at once having delivered nothing (an endless one, an epoch of 2^63 samples).
        let past = ResumeError::PastEpoch { position: start.position, latest: sampler.latest_position(rt.max_seq_len) };
        return Err(Refusal::Resume(past));
    }
    sampler.restore_exact(start.position).map_err(inside_sequence)?;
    if !resolved.equal_steps {
        let warnings = data_warnings(&sampler, rt, resolved, None);
        return Ok((sampler, None, warnings));
    }
    let equal = sampler.equalize_steps_unless(resolved.minibatch_size, resolved.tail, cancelled)?;
    let mut warnings = data_warnings(&sampler, rt, resolved, Some(equal.steps));
    warnings.extend(equal.drop_warning(&sampler, resolved.minibatch_size, resolved.tail));
    let m = &shared.data.metrics.control.equal_steps_minibatches;
    tracing::debug!(dataset, steps = equal.steps, dropped = equal.dropped, padding = equal.padding, "equal steps");
    if resolved.tail == Tail::Pad {
        m.with_label_values(&[dataset, "pad"]).inc_by(equal.padding);
        Ok((sampler, Some(equal.steps), warnings))
    } else {
        m.with_label_values(&[dataset, "drop"]).inc_by(equal.dropped);
        Ok((sampler, None, warnings))
    }
}

/// What a trainer should be told at `open` about the data its session will get (logged too): a
/// worker that gets nothing ([`Sampler::gets_no_data`]), and equal steps that give every worker
/// nothing, with what to change.
fn data_warnings(
    sampler: &Sampler,
    rt: &DatasetRuntime,
    resolved: &ResolvedOptions,
    steps: Option<u64>,
) -> Vec<String> {
    let mut out = Vec::new();
    let none_here = sampler.gets_no_data();
    let none_anywhere = steps == Some(0) && sampler.sweep_size() > 0;
    if !none_here && !none_anywhere {
        return out;
    }
    let workers = resolved.sampling.num_workers;
    let chunks = rt.dataset.chunks();
    let sequences = rt.dataset.timeline().num_sequences();
    let bytes: u64 = chunks.iter().map(|c| c.end - c.start).sum();
    let advice = if sampler.deals_chunks() && chunks.len() < workers && sequences < workers {
        // Randomized, the chunks bound first (found by a probe: 36 chunks, 3,000 sequences, and
        // the advice was 3,000 workers).
        format!(
            "randomized, each of the dataset's {} chunk(s) goes whole to one worker: use at most {} workers (the \
             dataset has {sequences} sequence(s))",
            chunks.len(),
            chunks.len()
        )
    } else if sequences < workers {
        format!("the dataset has {sequences} sequence(s): use at most {sequences} workers")
    } else if sampler.deals_chunks() {
        format!(
            "randomized, each of the dataset's {} chunk(s) goes whole to one worker: set its chunk_size_bytes to at \
             most about {} (its {bytes} bytes over {workers} workers), or use fewer workers",
            chunks.len(),
            (bytes / workers.max(1) as u64).max(1),
        )
    } else {
        "in file order the epoch's sequences are dealt one by one: a longer epoch or fewer workers".to_owned()
    };
    if none_here {
        out.push(format!("worker {} of {workers} gets no data: {advice}", resolved.sampling.rank));
    }
    if none_anywhere {
        let short = sequences < workers || (sampler.deals_chunks() && chunks.len() < workers);
        out.push(format!(
            "equal steps give every worker 0 minibatches in this epoch, as the worker that gets the fewest gets none{}",
            if short { format!(" ({advice})") } else { String::new() }
        ));
    }
    out
}

/// Refuses a window that cannot fit the limit now rather than at its first minibatch (the
/// cache's ceiling would stop it there, after parsing the limit's worth of chunks). Called once
/// the session's ring is reserved: the cache's share is what the limit leaves beside it.
/// Refuses a dataset one of whose chunks cannot be parsed within the memory limit, whatever
/// the session's options: the dense values of its sequences, at one sample each, in one dense
/// stream alone, pass what a parsed chunk may hold ([`Refusal::ChunkTooLarge`]). Found by a
/// probe: a session in file order was admitted and failed at its first minibatch (a randomized
/// one was refused at `open` by its window's floor).
pub(in crate::pipeline::control) fn chunks_fit(rt: &DatasetRuntime) -> Result<(), Refusal> {
    let timeline = rt.dataset.timeline();
    let per_sequence = rt
        .shapes
        .iter()
        .filter(|s| s.kind == minibatchd_engine::format::chunk::StreamKind::Dense)
        .map(|s| s.dim as u64 * if s.float64 { 8 } else { 4 })
        .max()
        .unwrap_or(0);
    let limit = rt.dataset.max_parsed_chunk_bytes();
    if per_sequence == 0 {
        return Ok(());
    }
    let largest = timeline.chunk_start.windows(2).enumerate().max_by_key(|(_, w)| w[1] - w[0]);
    match largest {
        Some((chunk, w)) if ((w[1] - w[0]) as u64).saturating_mul(per_sequence) > limit => {
            let sequences = (w[1] - w[0]) as u64;
            Err(Refusal::ChunkTooLarge { chunk, sequences, bytes: sequences.saturating_mul(per_sequence), limit })
        }
        _ => Ok(()),
    }
}

/// `ring_bytes`: the session's ring, which each worker of the job that is not here yet will
/// reserve too (for the window named for all of them).
/// `workers_here`: the workers of the session's job that read through this daemon, its own
/// included (one more than
/// [`Registry::other_workers_here`](crate::pipeline::control::session::Registry::other_workers_here)):
/// their floors are held together (found by a probe: eight `DataLoader` splits read in one
/// process were each admitted with a window whose floor, one eighth of it, fitted, and then took
/// turns for memory a hundred times slower than one split).
///
/// `reserved`: what this session's sweep orders hold reserved now (for the requested window),
/// which a smaller window would reserve less of: the largest window named is the largest whose
/// floor and sweep orders together fit (found by a probe: the share shrank with the window asked
/// for, so the window named depended on it, and windows above it were admitted).
pub(super) fn window_fits(
    rt: &DatasetRuntime,
    sweep_size: u64,
    resolved: &ResolvedOptions,
    shared: &ControlPlane,
    reserved: u64,
    (workers_here, ring_bytes): (u64, u64),
) -> Result<(), Refusal> {
    use minibatchd_engine::feed::{window_floor_bytes, window_in_chunks};
    let timeline = rt.dataset.timeline();
    let workers_here = workers_here.max(1);
    let floor = window_floor_bytes(timeline, sweep_size, &rt.shapes, &resolved.sampling).saturating_mul(workers_here);
    let share = shared.registry().cache_budget();
    if floor <= share {
        return Ok(());
    }
    let window_chunks = window_in_chunks(timeline, sweep_size, &resolved.sampling).min(timeline.num_chunks());
    // The floor grows with the window: the largest window in chunks under the share, by halving.
    let free = share.saturating_add(reserved);
    // The largest window whose floor for `workers` workers here fits, each worker that is not
    // here yet taking a ring and sweep orders like this session's out of the share when it comes
    // (found by a review: the orders were counted once).
    let largest_for = |workers: u64| {
        let coming = workers.saturating_sub(workers_here);
        let fits = |w: usize| {
            let options = SamplingOptions { window: Window::Chunks(w), ..resolved.sampling.clone() };
            let orders = super::sampling_bound(timeline, &options, false, resolved.equal_steps);
            let free = free.saturating_sub(coming.saturating_mul(ring_bytes.saturating_add(orders)));
            window_floor_bytes(timeline, sweep_size, &rt.shapes, &options)
                .saturating_mul(workers)
                .saturating_add(orders)
                <= free
        };
        let (mut lo, mut hi) = (0usize, window_chunks); // fits(lo) (0: nothing), !fits(hi)
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    };
    // Found by a probe: with the job's workers opening in turn, each refusal named the window for
    // the workers connected so far, and a job took four restarts to find one that fits all eight.
    // The window for every worker of the job here is named too.
    let all = resolved.sampling.num_workers as u64;
    let largest_all = (all > workers_here).then(|| (all, largest_for(all)));
    Err(Refusal::WindowTooLarge {
        window_chunks,
        largest: largest_for(workers_here),
        floor,
        share,
        workers_here,
        largest_all,
    })
}

/// The minibatch size a session's states carry when it has equal steps
/// ([`SessionState::equal_steps_minibatch`]).
pub(super) fn equal_steps_minibatch(resolved: &ResolvedOptions) -> Option<u64> {
    resolved.equal_steps.then_some(resolved.minibatch_size as u64)
}

/// The runtime of `name`, its files as it indexed them — or no session: one on changed files
/// would fail mid-run as chunks are read, or be served what the caches hold of files that no
/// longer hold it ([`Refusal::Changed`]). While a reload indexes it again the open waits for the
/// new version (`dataset_indexing`), and one the reload has just put in force is taken.
///
/// # Errors
/// The catalog's refusals; [`Refusal::Changed`].
pub(in crate::pipeline::control) fn unchanged_dataset(
    shared: &ControlPlane,
    name: &str,
) -> Result<Arc<DatasetRuntime>, Refusal> {
    let rt = shared.data.dataset(name)?;
    let Err(source) = rt.dataset.files_unchanged() else { return Ok(rt) };
    if let Some(progress) = shared.data.indexing.get(name) {
        return Err(Refusal::Dataset(CatalogError::Indexing { name: name.to_owned(), progress }));
    }
    let now = shared.data.dataset(name)?;
    if !Arc::ptr_eq(&now, &rt) && now.dataset.files_unchanged().is_ok() {
        return Ok(now);
    }
    let reopen_failure = rt.reopen_failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    Err(Refusal::Changed { name: name.to_owned(), source, reopen_failure })
}

/// The state of a fresh session of `dataset` (identity `identity`, options hash `ohash`) at
/// `position`; with equal steps, cut for `equal_steps_minibatch`.
pub(super) fn fresh_state(
    dataset: &str,
    position: u64,
    identity: u64,
    ohash: u64,
    equal_steps_minibatch: Option<u64>,
) -> SessionState {
    SessionState {
        version: STATE_VERSION,
        dataset: dataset.to_owned(),
        position,
        minibatches: 0,
        data_identity: hex64(identity),
        options_hash: hex64(ohash),
        job: None,
        worker: None,
        mixture: None,
        equal_steps_minibatch,
        // Set by the session that starts from it (`open`).
        decode_digest: None,
    }
}

/// The slot size of a session's ring for minibatches of at most `bound` bytes as far as the
/// index bounds them, its slot count set in `resolved`: the ring `options` ask for, each slot
/// raised to `bound`, or where they ask for neither slots nor their size, the default ring made
/// deeper for small minibatches ([`deeper_ring`]).
pub(in crate::pipeline::control) fn ring_for(
    options: &SessionOptions,
    resolved: &mut ResolvedOptions,
    bound: u64,
) -> u64 {
    let size = if options.prefetch.is_none() && options.slot_size_bytes.is_none() {
        let (slots, size) = deeper_ring(resolved.slots, resolved.slot_size_bytes, bound);
        resolved.slots = slots;
        size
    } else {
        resolved.slot_size_bytes.max(bound)
    };
    size.min(MAX_SLOT_SIZE_BYTES)
}

/// Most slots a session's ring gets by default ([`deeper_ring`]).
pub(super) const DEEP_RING_SLOTS: u64 = 64;

/// The default ring (`slots` of `slot_size` bytes, the daemon's `ring_slots` and
/// `slot_size_bytes`) for minibatches of at most `bound` bytes as far as the index bounds them:
/// where eight times that is less than a slot (but at least a quarter of one), the same bytes cut
/// into more, smaller slots, up to [`DEEP_RING_SLOTS`]; else `slots` raised to `bound`. On two
/// cores the consumer, the event loop and the producers take turns, and a deeper ring rides out
/// the consumer's (16 slots of 4 MiB against 64 of 1 MiB for 128 KiB minibatches: 15–20 % more
/// samples a second, `docs/benchmarks.md`). The eightfold room is for sparse samples with more
/// entries than the bound's one; a minibatch that still does not fit makes the client reopen
/// with larger slots, as ever. Never more bytes than the configured default ring.
fn deeper_ring(slots: u64, slot_size: u64, bound: u64) -> (u64, u64) {
    let room = bound.saturating_mul(8).max(slot_size / 4).div_ceil(4096).saturating_mul(4096);
    if room >= slot_size || slots >= DEEP_RING_SLOTS {
        return (slots, slot_size.max(bound));
    }
    let deeper = (slots.saturating_mul(slot_size) / room).clamp(slots, DEEP_RING_SLOTS);
    (deeper, room)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// Small minibatches get more, smaller slots in the default ring's bytes; large ones, a
    /// configured ring of 64 slots or more, and slots too small to split keep the ring as it was.
    #[test]
    fn a_default_ring_is_deeper_for_small_minibatches_in_the_same_bytes() {
        assert_eq!(deeper_ring(16, 4 * MIB, 133_000), (63, 1_064_960));
        assert_eq!(deeper_ring(16, 4 * MIB, 20_000), (64, MIB));
        assert_eq!(deeper_ring(16, 4 * MIB, 600 * 1024), (16, 4 * MIB));
        assert_eq!(deeper_ring(16, 4 * MIB, 9 * MIB), (16, 9 * MIB));
        assert_eq!(deeper_ring(64, 4 * MIB, 20_000), (64, 4 * MIB));
        assert_eq!(deeper_ring(2, 4096, 100), (2, 4096));
        for (slots, size, bound) in [(16, 4 * MIB, 1), (3, 8 * MIB, 70_000), (16, 64 * MIB, 5 * MIB)] {
            let (n, s) = deeper_ring(slots, size, bound);
            assert!(
                n >= slots && n * s <= slots * size && s >= bound && s % 4096 == 0,
                "{slots} {size} {bound}: {n} {s}"
            );
        }
    }
}
