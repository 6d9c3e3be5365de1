//! Opening a mixture's session (`docs/mixtures.md`): a client's `open` of a `[mixtures.NAME]`.
//!
//! The same steps as a dataset's session ([`super::open_session::open`]) — options, a `resume` state's
//! fit, admission, the ring, the checkpoint, the producer — with the engine's
//! [`Mixture`] in place of a sampler, planned by [`MixturePlanner`]. What differs:
//! * **Options.** `minibatch_size`, `max_samples` (the epoch, instead of the mixture's own),
//!   `sweep` (epoch `k` of the mixture: the epochs before it walked, no data read),
//!   `weights` or `weight_schedule` (instead of the configured weights), `num_workers`, `rank`,
//!   `resume`, `prefetch`, `slot_size_bytes`, `session`; `equal_steps` and `tail` are accepted
//!   and change nothing (a mixture's workers always take equal steps). The options that shape a
//!   dataset's sampling do not apply: each source samples with its dataset's `[sampling]` table.
//! * **State.** `SessionState::mixture` carries the mixture's state after the last minibatch
//!   taken; it is the same on every worker, so any worker's state resumes any worker, at any
//!   worker count (there is no `resume_job`). The data identity covers every source's data in
//!   order; the options hash every source's randomization, window and seed, and the epoch — not
//!   the weights, which may change across a resume.
//! * **Memory.** The sources' sweep orders are reserved as a dataset session's are; the sources'
//!   randomization windows must fit the chunk cache's share together, or the `open` is refused.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Instant;

use minibatchd_client::protocol::{
    hex64, MixtureInfo, MixtureSourceInfo, ServerMessage, SessionOptions, SessionState, StreamInfo, STATE_VERSION,
};
use minibatchd_engine::feed::window_floor_bytes;
use minibatchd_engine::minibatch::StreamShape;
use minibatchd_engine::sampling::mixture::{
    Mixture, MixtureEpoch, MixtureOptions, WeightSchedule, WeightStage, Weights,
};
use minibatchd_engine::sampling::{window_sequences, EpochLimit, Sampler, SamplingOptions, Tail};
use minibatchd_shm::RingGeometry;

use super::admission::{self, Refusal};
use super::open_session::{
    checkpoint_opening, chunks_fit, host_shortfall, new_ring, off_the_event_loop, opened_message, ring_for,
    unchanged_dataset, warn_if_replaying, Described, Launch, OpenSession, SamplingReservation,
};
use super::peer::{ConnShared, Peer};
use super::session::{check_mixture_resume, options_hash, resolve_options};
use super::ControlPlane;

mod epochs;
use crate::config::mixture::{sources_of, stream_layout, MixtureConfig};
use crate::pipeline::data::catalog::DatasetRuntime;
use crate::pipeline::data::mixing::{from_wire, to_wire, MixturePlanner, PlannedSource};
use epochs::{epoch_key, no_data_warning, walk};

/// The `dataset` and `mixture` label of the sessions of mixtures given at `open`.
pub(super) const AT_OPEN: &str = "at_open";

/// A mixture's `open` resolved, before anything shared is touched.
struct Prepared {
    runtimes: Vec<Arc<DatasetRuntime>>,
    /// Per source, its dataset's stream filling each of the mixture's streams.
    orders: Vec<Vec<usize>>,
    streams: Vec<StreamInfo>,
    shapes: Vec<StreamShape>,
    names: Vec<String>,
    mixture: Mixture,
    minibatch_size: usize,
    rank: u64,
    slots: u64,
    geometry: RingGeometry,
    identity: u64,
    options_hash: u64,
    session: Option<String>,
    /// The sources' sweep orders, reserved.
    sampling: SamplingReservation,
    /// The least the sources' windows hold together, and each source's, for the check once the
    /// ring is reserved.
    floors: Vec<u64>,
    /// Its epochs' starts' key ([`epoch_key`]).
    walk_key: u64,
}

/// The mixture's data identity: its sources' data identities, in source order.
fn identity(runtimes: &[Arc<DatasetRuntime>]) -> u64 {
    let mut h = minibatchd_engine::hash::Fnv1a::new();
    h.field(b"mixture");
    for rt in runtimes {
        h.u64(rt.identity);
    }
    h.finish()
}

/// What shapes a mixture's order besides its weights: each source's sampling and the epoch. Not
/// which epoch (`sweep`): a mixture's state says where it stands, so a state of any epoch resumes
/// a session opened for any (the next epoch from the last one's final state).
fn mixture_options_hash(runtimes: &[Arc<DatasetRuntime>], epoch: MixtureEpoch) -> u64 {
    let mut h = minibatchd_engine::hash::Fnv1a::new();
    h.field(b"mixture");
    for rt in runtimes {
        h.u64(options_hash(&source_sampling(rt), false, Tail::Drop));
    }
    match epoch {
        MixtureEpoch::Endless => h.u64(1),
        MixtureEpoch::FirstSweepEnd => h.u64(2),
        MixtureEpoch::Samples(n) => {
            h.u64(3);
            h.u64(n);
        }
    }
    h.finish()
}

/// How a source samples: its dataset's `[sampling]`, one worker, endlessly.
fn source_sampling(rt: &DatasetRuntime) -> SamplingOptions {
    let s = &rt.dataset.config().sampling;
    SamplingOptions {
        randomize: s.randomize,
        window: s.window,
        seed: s.seed,
        limit: EpochLimit::Infinite,
        num_workers: 1,
        rank: 0,
    }
}

/// The options of a dataset's sampling that a mixture's session does not take.
fn refused_options(o: &SessionOptions) -> Vec<&'static str> {
    let given = [
        ("max_sweeps", o.max_sweeps.is_some()),
        ("full_sweep", o.full_sweep),
        ("randomize", o.randomize.is_some()),
        ("window_chunks", o.window_chunks.is_some()),
        ("window_samples", o.window_samples.is_some()),
        ("seed", o.seed.is_some()),
        ("frame_mode", o.frame_mode),
    ];
    given.iter().filter(|(_, on)| *on).map(|(k, _)| *k).collect()
}

/// The weights a session follows: the `open`'s, else the configured ones.
fn schedule_of(o: &SessionOptions, config: &MixtureConfig) -> Result<WeightSchedule, String> {
    let sources = config.datasets.len();
    let weights = |w: &[f64]| {
        if w.len() != sources {
            return Err(format!("{} weights for {sources} sources", w.len()));
        }
        Weights::new(w).map_err(|e| e.to_string())
    };
    match (&o.weights, &o.weight_schedule) {
        (Some(_), Some(_)) => Err("give weights or weight_schedule, not both".into()),
        (Some(w), None) => Ok(WeightSchedule::constant(weights(w).map_err(|e| format!("weights: {e}"))?)),
        (None, Some(stages)) => {
            let mut out = Vec::with_capacity(stages.len());
            for (i, s) in stages.iter().enumerate() {
                let w = weights(&s.weights).map_err(|e| format!("weight_schedule[{i}]: {e}"))?;
                out.push(WeightStage { from_step: s.from_step, weights: w });
            }
            WeightSchedule::new(out).map_err(|e| format!("weight_schedule: {e}"))
        }
        (None, None) => Ok(config.schedule.clone()),
    }
}

/// A mixture given at `open` ([`SessionOptions::mixture`]): its datasets (configured, each
/// once), its weights (`weights` or `weight_schedule`, required), its epoch and streams — checked
/// as a `[mixtures.NAME]` table is.
fn given_at_open(
    spec: &minibatchd_client::protocol::MixtureSpec,
    options: &SessionOptions,
    config: &crate::config::Config,
) -> Result<MixtureConfig, String> {
    if spec.datasets.is_empty() || spec.datasets.len() > minibatchd_engine::sampling::mixture::MAX_SOURCES {
        return Err(format!(
            "mixture.datasets: expected 1..={} dataset names, found {}",
            minibatchd_engine::sampling::mixture::MAX_SOURCES,
            spec.datasets.len()
        ));
    }
    for (i, d) in spec.datasets.iter().enumerate() {
        if !config.datasets.contains_key(d) {
            return Err(format!("mixture.datasets[{i}]: no dataset '{d}' is configured"));
        }
        if spec.datasets[..i].contains(d) {
            return Err(format!("mixture.datasets[{i}]: '{d}' is listed twice: a dataset is one source of a mixture"));
        }
    }
    if options.weights.is_none() && options.weight_schedule.is_none() {
        return Err("a mixture given at open needs weights (or weight_schedule): one weight per dataset".into());
    }
    let epoch = match spec.epoch.as_deref() {
        None | Some("endless") => MixtureEpoch::Endless,
        Some("first_sweep_end") => MixtureEpoch::FirstSweepEnd,
        Some(other) => return Err(format!("mixture.epoch '{other}': expected \"endless\" or \"first_sweep_end\"")),
    };
    for (stream, names) in &spec.streams {
        if names.len() != spec.datasets.len() {
            return Err(format!(
                "mixture.streams.{stream}: {} stream names for {} datasets",
                names.len(),
                spec.datasets.len()
            ));
        }
    }
    // A dataset's stream fills one stream of the mixture at most.
    for (source, dataset) in spec.datasets.iter().enumerate() {
        let mut used: Vec<&str> = spec.streams.values().map(|v| v[source].as_str()).collect();
        used.sort_unstable();
        if let Some(twice) = used.windows(2).find_map(|p| (p[0] == p[1]).then_some(p[0])) {
            return Err(format!(
                "mixture.streams: stream '{twice}' of dataset '{dataset}' fills two streams of the mixture"
            ));
        }
    }
    // The weights are the options' (`schedule_of`); a placeholder schedule of the right length.
    let even = Weights::new(&vec![1.0; spec.datasets.len()]).map_err(|e| e.to_string())?;
    Ok(MixtureConfig {
        datasets: spec.datasets.clone(),
        schedule: WeightSchedule::constant(even),
        epoch,
        streams: spec.streams.clone(),
    })
}

/// Resolves a mixture's `open`: its sources (each indexed), options, streams, the mixture and the
/// ring's geometry, and reserves its sources' sweep orders.
fn prepare_now(name: &str, options: &SessionOptions, shared: &Arc<ControlPlane>) -> Result<Prepared, Refusal> {
    let config = shared.config();
    let refuse = |message: String| Refusal::Mixture { name: name.to_owned(), message };
    let m = match (&options.mixture, config.mixtures.get(name)) {
        (Some(_), None) if config.datasets.contains_key(name) => {
            return Err(refuse("a configured dataset's name: give the mixture at open under a name of its own".into()))
        }
        (Some(spec), None) => given_at_open(spec, options, &config).map_err(refuse)?,
        (Some(_), Some(_)) => {
            return Err(refuse("a configured mixture's name: give the mixture at open under a name of its own".into()))
        }
        (None, Some(m)) => m.clone(),
        (None, None) => return Err(refuse("no longer configured (a configuration reload removed it)".into())),
    };
    let runtimes = m.datasets.iter().map(|d| unchanged_dataset(shared, d)).collect::<Result<Vec<_>, _>>()?;
    runtimes.iter().try_for_each(|rt| chunks_fit(rt))?;
    if options.resume_job.is_some() {
        // Found by a probe: told that "each source samples with its dataset's [sampling] table",
        // which says nothing of what to do instead.
        return Err(refuse(
            "resume_job does not apply to a mixture's session: give any one worker's state() as resume, which \
             resumes a mixture at any worker count (docs/mixtures.md)"
                .into(),
        ));
    }
    let refused = refused_options(options);
    if !refused.is_empty() {
        return Err(refuse(format!(
            "{} do(es) not apply to a mixture's session: each source samples with its dataset's [sampling] table \
             (docs/mixtures.md)",
            refused.join(", ")
        )));
    }
    // The options a mixture shares with a dataset's session, checked the same way (the first
    // source stands in for the dataset; none of its defaults is used).
    let d = &config.daemon;
    // Equal steps are a mixture's own (every worker walks every slot), with or without them.
    let common = SessionOptions {
        weights: None,
        weight_schedule: None,
        max_samples: None,
        sweep: None,
        equal_steps: false,
        tail: None,
        resume: None,
        mixture: None,
        ..options.clone()
    };
    let mut resolved = resolve_options(&common, runtimes[0].dataset.config(), d.ring_slots as u64, d.slot_size_bytes)?;
    let schedule = schedule_of(options, &m).map_err(refuse)?;
    let epoch = match options.max_samples {
        Some(0) => return Err(refuse("max_samples must be at least 1".into())),
        Some(n) => MixtureEpoch::Samples(n),
        None => m.epoch,
    };
    let datasets: Vec<&minibatchd_engine::dataset::Dataset> = runtimes.iter().map(|rt| &rt.dataset).collect();
    let layout = stream_layout(&m.datasets, &datasets, &m.streams).map_err(refuse)?;
    let streams: Vec<StreamInfo> = layout
        .names
        .iter()
        .zip(&layout.order[0])
        .map(|(n, &i)| StreamInfo { name: n.clone(), ..runtimes[0].streams[i].clone() })
        .collect();
    // The ring; then the sources' sweep orders and the minibatches in flight, reserved before
    // they are built.
    let (slot_size, sequences) = ring_slots(options, &mut resolved, &runtimes, epoch);
    let mut sampling = SamplingReservation::new(shared, sequences, streams.len(), resolved.slots);
    let mut bytes = 0u64;
    let mut widest = 0u64;
    for rt in &runtimes {
        let o = source_sampling(rt);
        bytes = bytes.saturating_add(Sampler::memory_bound(rt.dataset.timeline(), &o, false));
        widest = widest.max(window_sequences(rt.dataset.timeline(), &o));
    }
    sampling.resize_to(bytes, widest)?;
    let floors: Vec<u64> = runtimes
        .iter()
        .map(|rt| {
            let timeline = rt.dataset.timeline();
            window_floor_bytes(timeline, timeline.samples(..), &rt.shapes, &source_sampling(rt))
        })
        .collect();
    let mixture_options =
        MixtureOptions { schedule, epoch, num_workers: resolved.sampling.num_workers, rank: resolved.sampling.rank };
    if options.sweep.is_some_and(|k| k > 0) && epoch == MixtureEpoch::Endless {
        return Err(refuse("an endless mixture has one epoch: sweep 0 only (set `epoch = \"first_sweep_end\"` or max_samples to have epochs)".into()));
    }
    let (identity, options_hash) = (identity(&runtimes), mixture_options_hash(&runtimes, epoch));
    let walk_key = epoch_key(identity, options_hash, resolved.minibatch_size, &mixture_options.schedule);
    let mixture = Mixture::new(&sources_of(&datasets), mixture_options).map_err(|e| refuse(e.to_string()))?;
    Ok(Prepared {
        identity,
        options_hash,
        walk_key,
        orders: layout.order,
        shapes: layout.shapes,
        names: layout.names,
        streams,
        runtimes,
        mixture,
        minibatch_size: resolved.minibatch_size,
        rank: resolved.sampling.rank as u64,
        slots: resolved.slots,
        geometry: RingGeometry::new(resolved.slots, slot_size),
        session: resolved.session,
        sampling,
        floors,
    })
}

/// A mixture's ring: its slots' size and (in `resolved`) their number, and the most sequences a
/// minibatch of this worker holds. A slot holds such a minibatch (as far as the index bounds it)
/// and the mixture's own tensors; the default ring comes in more, smaller slots where the
/// minibatches are small, as a dataset's (`open_session::ring_for`).
fn ring_slots(
    options: &SessionOptions,
    resolved: &mut super::session::ResolvedOptions,
    runtimes: &[Arc<DatasetRuntime>],
    epoch: MixtureEpoch,
) -> (u64, u64) {
    // A minibatch holds no more samples than its epoch (as a dataset's session, found by a probe:
    // a minibatch_size of 2^31 - 1 asked for a ring of hundreds of GB): an epoch of `max_samples`
    // ends at the first slot that starts at or past them; one that ends at the first sweep's end
    // holds less than a sweep of each source.
    let bound = match epoch {
        MixtureEpoch::Samples(n) => n,
        MixtureEpoch::FirstSweepEnd => {
            runtimes.iter().fold(0u64, |sum, rt| sum.saturating_add(rt.dataset.timeline().samples(..)))
        }
        MixtureEpoch::Endless => u64::MAX,
    };
    // A worker's share of a minibatch: the global slots are dealt round-robin, so a worker may
    // get the long sequences of one source and the others the short ones of another — up to
    // its count of slots times the longest sequence, and never more than the whole minibatch.
    let mbs = (resolved.minibatch_size as u64).min(bound);
    let longest = runtimes.iter().map(|rt| rt.max_seq_len).max().unwrap_or(1).max(1);
    let slots_here = mbs / resolved.sampling.num_workers as u64 + 1;
    let local = slots_here.saturating_mul(longest).min(mbs.saturating_add(longest));
    // The mixture's own tensors after the streams: a source per sequence, the sweeps ended, the
    // state (and their table entries and names).
    let sources = runtimes.len() as u64;
    let own = 1024 + 4 * slots_here + 4 * sources + 8 * (4 + 4 * sources);
    let need = runtimes.iter().map(|rt| rt.slot_bound(local)).max().unwrap_or(0).saturating_add(own);
    (ring_for(options, resolved, need), slots_here)
}

/// Refuses sources whose windows cannot fit the cache's share together (once the ring is
/// reserved).
fn windows_fit(name: &str, p: &Prepared, shared: &ControlPlane) -> Result<(), Refusal> {
    let floor = p.floors.iter().fold(0u64, |a, &b| a.saturating_add(b));
    let share = shared.registry().cache_budget();
    if floor <= share {
        return Ok(());
    }
    let sources = p
        .runtimes
        .iter()
        .zip(&p.floors)
        .map(|(rt, f)| format!("'{}' {} MiB", rt.name, f.div_ceil(1 << 20)))
        .collect::<Vec<_>>()
        .join(", ");
    Err(Refusal::MixtureTooLarge { name: name.to_owned(), sources, floor, share })
}

/// Admits a mixture's session ([`admission::admit`]): its name, its starting state (fresh, the
/// client's `resume`, or a lingering session's) and its ring's memory.
fn admit(
    name: &str,
    options: &SessionOptions,
    prepared: &Prepared,
    shared: &Arc<ControlPlane>,
    peer: &Peer,
) -> Result<admission::Admitted, Refusal> {
    let sources = prepared.runtimes.len();
    let (identity, ohash) = (prepared.identity, prepared.options_hash);
    let fresh = SessionState {
        version: STATE_VERSION,
        dataset: name.to_owned(),
        position: 0,
        minibatches: 0,
        data_identity: hex64(identity),
        options_hash: hex64(ohash),
        job: None,
        worker: None,
        mixture: Some(to_wire(prepared.mixture.state())),
        equal_steps_minibatch: None,
        decode_digest: None,
    };
    if let Some(s) = &options.resume {
        check_mixture_resume(s, name, identity, ohash, sources)?;
    }
    // A mixture's position is its epoch's slots: a resume state's own `position` follows its
    // `mixture` (found by a probe: an edited one was taken as given).
    let resume = options.resume.clone().map(|mut s| {
        s.position = s.mixture.as_ref().map_or(s.position, |m| m.slots);
        s
    });
    let request = admission::Request {
        dataset: name,
        name: prepared.session.as_deref(),
        resume: resume.as_ref(),
        fresh,
        fits: &|s: &SessionState| check_mixture_resume(s, name, identity, ohash, sources),
        ring_bytes: prepared.geometry.total_bytes(),
        host_short: host_shortfall(shared),
        uid: peer.uid,
        limits: shared.limits.sessions,
        nonce: super::random_u64(),
        options,
    };
    let mut reg = shared.registry();
    let admitted = admission::admit(&mut reg, &request, Instant::now())?;
    shared.rebudget(&reg);
    Ok(admitted)
}

/// What `opened` says of a mixture's sources.
fn mixture_info(runtimes: &[Arc<DatasetRuntime>]) -> MixtureInfo {
    MixtureInfo {
        sources: runtimes
            .iter()
            .map(|rt| MixtureSourceInfo { dataset: rt.name.clone(), sweep_size: rt.dataset.timeline().samples(..) })
            .collect(),
    }
}

/// Opens a mixture's session: see the module's documentation.
pub(super) async fn open_mixture(
    name: &str,
    options: &SessionOptions,
    conn: &ConnShared,
    peer: &Peer,
    cancelled: &Arc<std::sync::atomic::AtomicBool>,
) -> Result<(OpenSession, ServerMessage, OwnedFd), Refusal> {
    let shared = &conn.shared;
    let prepared = {
        let (name, options, shared) = (name.to_owned(), options.clone(), shared.clone());
        off_the_event_loop(move || prepare_now(&name, &options, &shared)).await?
    };
    let (identity, ohash) = (prepared.identity, prepared.options_hash);
    let admitted = admission::retry_busy(|| admit(name, options, &prepared, shared, peer)).await?;
    let undo = |refusal: Refusal| {
        let mut reg = shared.registry();
        admission::withdraw(&mut reg, &admitted, Instant::now());
        shared.rebudget(&reg);
        refusal
    };
    windows_fit(name, &prepared, shared).map_err(undo)?;
    let Prepared {
        runtimes,
        orders,
        streams,
        shapes,
        names,
        mut mixture,
        minibatch_size,
        rank,
        slots,
        geometry,
        sampling,
        walk_key,
        ..
    } = prepared;
    let (id, session, mut start, ring_bytes) =
        (admitted.id, admitted.name.clone(), admitted.start.clone(), admitted.ring_bytes());
    // A fresh session of a later epoch: walked to it now that it is admitted (a resumed one
    // starts from its state), the daemon's checkpoint told where it starts.
    let fresh = options.resume.is_none() && admitted.resumed.is_none();
    if let Some(epoch) = options.sweep.filter(|&k| k > 0 && fresh) {
        let walking = walk(name, mixture, epoch, minibatch_size, walk_key, shared.clone(), cancelled.clone());
        let (walked, state) = walking.await.map_err(undo)?;
        mixture = walked;
        start.mixture = Some(state);
        shared.registry().update_state(&session, &start, admitted.given_up_to);
    }
    if let Some(state) = &start.mixture {
        mixture
            .restore(&from_wire(state))
            .map_err(|e| undo(Refusal::Mixture { name: name.to_owned(), message: e.to_string() }))?;
    }
    let warnings = no_data_warning(&mut mixture, minibatch_size)
        .map_err(|message| undo(Refusal::Mixture { name: name.to_owned(), message }))?;
    let (ring, fd) = new_ring(&session, ring_bytes, geometry, shared.daemon_id, id).map_err(undo)?;
    let header = *ring.header();
    checkpoint_opening(shared).await.map_err(undo)?;

    let slot_count = usize::try_from(slots).unwrap_or(usize::MAX);
    // A mixture given at open is counted under one label whatever its name: names a client
    // chooses would make series without bound.
    let label = if options.mixture.is_some() { AT_OPEN } else { name };
    let metrics = shared.data.metrics.session(label, rank);
    let info = mixture_info(&runtimes);
    let producer = {
        let control = &shared.data.metrics.control;
        let sources = runtimes
            .iter()
            .zip(orders)
            .map(|(rt, order)| PlannedSource {
                runtime: rt.clone(),
                order,
                samples: control.mixture_samples.with_label_values(&[label, rt.name.as_str()]),
                target_share: control.mixture_target_share.with_label_values(&[label, rt.name.as_str()]),
            })
            .collect();
        let cache = shared.data.cache.clone();
        let plans =
            MixturePlanner::new(sources, shapes, cache, mixture, minibatch_size, start.minibatches, metrics.clone());
        // The tensor names: the streams', then `mixture` for the mixture's own.
        let names = names.into_iter().chain(std::iter::once("mixture".to_owned())).collect();
        plans.into_producer(name.to_owned(), names, ring).counted(shared.data.demand.working())
    };
    warn_if_replaying(&session, &start, admitted.resumed.as_ref(), admitted.given_up_to);
    let described = Described {
        dataset: name.to_owned(),
        streams,
        sweep_size: info.sources.iter().map(|s| s.sweep_size).sum(),
        mixture: Some(info),
    };
    let opened = opened_message(&session, &header, described, &start, &admitted, warnings);
    let launch = Launch {
        session,
        dataset: name.to_owned(),
        identity,
        sources: runtimes.iter().map(|rt| rt.name.clone()).collect(),
        options_hash: ohash,
        job: None,
        start,
        given_up_to: admitted.given_up_to,
        ring_bytes,
        slot_count,
        metrics,
        sampling,
    };
    let mut active = launch.start(conn, producer).await.map_err(undo)?;
    active.configured_mixture = options.mixture.is_none().then(|| name.to_owned());
    Ok((active, opened, fd))
}
