//! Opening a session on a connection, and the session's state there.
//!
//! [`open`] resolves the request against its dataset ([`fn@prepare`]: options, a `resume` state's fit,
//! the sampler, the ring's geometry), admits it ([`admission::admit`]: name, starting state, ring
//! memory, host guard — all or nothing), then creates the ring, starts the producer on the
//! delivery stage and builds the `opened` reply; a failure after admission withdraws it.
//! [`OpenSession`] is what the connection task keeps of the open session: its slot leases, progress,
//! the producer's channels and the metrics it reports.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::metrics::{Attached, SessionMetrics, SlotState};
use minibatchd_client::protocol::{
    hex64, JobBase, MixtureInfo, Resumed, RingInfo, ServerMessage, SessionOptions, SessionState, StreamInfo, WorkerOf,
    STATE_VERSION,
};
use minibatchd_engine::minibatch;
use minibatchd_engine::sampling::{window_sequences, Sampler, SamplingOptions, Timeline};
use minibatchd_shm::{Ring, RingGeometry, RingHeader, SharedRing, LAYOUT_VERSION};
use minibatchd_sys::{MemfdMemory, ShmError};

use super::admission::{self, Admitted, Refusal};
use super::peer::{ConnShared, Peer};
use super::session::{check_resume, check_worker, Progress, ResolvedOptions, SlotTable};
use super::ControlPlane;

mod prepare;

use crate::pipeline::data::catalog::DatasetRuntime;
use crate::pipeline::data::delivery::StartProducer;
use crate::pipeline::data::producer::{minibatches_in_flight, FreeSlot, Producer, ProducerEvent, ProducerHandle};
pub(super) use prepare::{chunks_fit, ring_for, unchanged_dataset};
use prepare::{equal_steps_minibatch, fresh_state, place_sampler, prepare, window_fits, Prepared};

/// A session open on this connection.
pub(super) struct OpenSession {
    pub(super) name: String,
    /// The dataset or mixture the session reads.
    pub(super) dataset: String,
    /// Its data identity.
    pub(super) identity: u64,
    /// The datasets it reads: the dataset, or the mixture's sources. The session ends when a
    /// reload removes one.
    pub(super) sources: Vec<String>,
    /// A configured mixture's name (`[mixtures.NAME]`): the session ends when a reload removes
    /// it, as for a dataset. `None` for a dataset's session or a mixture given at `open`.
    pub(super) configured_mixture: Option<String>,
    pub(super) options_hash: u64,
    pub(super) slots: SlotTable,
    pub(super) progress: Progress,
    /// Slots go back to the producer through it; dropping it stops the producer.
    pub(super) producer: ProducerHandle,
    pub(super) events: flume::Receiver<ProducerEvent>,
    pub(super) ring_bytes: u64,
    pub(super) producing: bool,
    /// The client said hello with version 2: `ready` goes out as a binary frame.
    pub(super) binary: bool,
    pub(super) metrics: SessionMetrics,
    /// Counted in `minibatchd_session_clients` while this lives.
    pub(super) _attached: Attached,
    pub(super) slot_count: usize,
    /// Slot counts last added to the gauges (free, filled, leased).
    pub(super) published: [i64; 3],
    /// The client's last cumulative `wait_ns`, and when the session opened on this connection
    /// (no client waits longer than that).
    pub(super) reported_wait_ns: u64,
    pub(super) opened: Instant,
    /// `taken` and `given_up_to` last written to the registry.
    pub(super) recorded: (u64, u64),
    /// How many minibatches the session's trainer may have been given before this connection
    /// (`SavedSession::given_up_to`).
    pub(super) given_before: u64,
    /// The client closed with `close{taken}`: it said exactly what it took, so the minibatches
    /// announced past that never reached its trainer.
    pub(super) closed: bool,
    /// The earlier run this session continues (`resume_job`), carried in every state.
    pub(super) job: Option<JobBase>,
    /// Which of several workers it is, carried in every state (`None`: one worker).
    pub(super) worker: Option<WorkerOf>,
    /// With equal steps, the minibatch size carried in every state
    /// ([`SessionState::equal_steps_minibatch`]).
    pub(super) equal_steps_minibatch: Option<u64>,
    /// [`SessionState::decode_digest`] (`None` for a mixture's session).
    pub(super) decode_digest: Option<String>,
    /// Its sampler's memory, reserved against `memory_limit_bytes` until the session ends.
    pub(super) _sampling: SamplingReservation,
}

/// Memory reserved against `memory_limit_bytes` for a session's sampler (the sweep orders of its
/// dataset, [`Sampler::memory_bound`], and while the session opens the walks of equal steps or
/// of a job, [`Sampler::walk_memory_bound`]): taken before the sampler is built, so that no
/// number of sessions opening at once holds more than the limit allows, and given back when
/// dropped. It grows with the randomization window and the number of chunks, not with the
/// dataset: 16 bytes per sequence of the widest window, 128 per chunk.
pub(super) struct SamplingReservation {
    pub(super) shared: Arc<ControlPlane>,
    pub(super) bytes: u64,
    /// Of `bytes`, what the session's minibatches planned and gathered at once take until they
    /// are in their slots, and the sequences each may hold ([`minibatch::memory_bound`]).
    gathering: (u64, u64),
}

/// What a sampler over `timeline` may hold: with `job` (it continues a job), its delivered set;
/// with `walks`, the walks made while the session opens.
pub(super) fn sampling_bound(timeline: &Timeline, options: &SamplingOptions, job: bool, walks: bool) -> u64 {
    let walk = if walks { Sampler::walk_memory_bound(timeline, options, job) } else { 0 };
    Sampler::memory_bound(timeline, options, job).saturating_add(walk)
}

/// A refusal of sweep orders' memory with the share of it a continued job's delivered sequences
/// take (`job` bytes), for its message.
fn job_part(mut refusal: Refusal, job: u64) -> Refusal {
    use crate::pipeline::control::session::RegistryError;
    if let Refusal::Registry(RegistryError::SamplingMemory { needed, job: part, .. }) = &mut refusal {
        *part = job.min(*needed);
    }
    refusal
}

impl SamplingReservation {
    /// Nothing reserved yet, for a session whose minibatches hold up to `sequences` sequences of
    /// `streams` streams, [`minibatches_in_flight`] of them with a ring of `slots`: that much is
    /// reserved with the sweep orders.
    pub(super) fn new(shared: &Arc<ControlPlane>, sequences: u64, streams: usize, slots: u64) -> Self {
        let gathering = minibatch::memory_bound(sequences, streams, minibatches_in_flight(slots));
        Self { shared: shared.clone(), bytes: 0, gathering: (gathering, sequences) }
    }

    /// While a session with (`job`) or without a job, with equal steps or not, opens: its
    /// sampler and its walks.
    fn opening(
        &mut self,
        timeline: &Timeline,
        options: &SamplingOptions,
        job: bool,
        equal_steps: bool,
    ) -> Result<(), Refusal> {
        let bytes = sampling_bound(timeline, options, job, job || equal_steps);
        let without_job = if job { sampling_bound(timeline, options, false, equal_steps) } else { bytes };
        self.resize(timeline, options, bytes).map_err(|e| job_part(e, bytes.saturating_sub(without_job)))
    }

    /// Once the session is open (its walks done): what its sampler keeps.
    fn opened(&mut self, timeline: &Timeline, options: &SamplingOptions, job: bool) -> Result<(), Refusal> {
        let bytes = sampling_bound(timeline, options, job, false);
        let without_job = if job { sampling_bound(timeline, options, false, false) } else { bytes };
        self.resize(timeline, options, bytes).map_err(|e| job_part(e, bytes.saturating_sub(without_job)))
    }

    /// Reserves `bytes` in all: more (refused when it does not fit; the reservation is then
    /// unchanged) or less (the rest given back to the chunk cache).
    fn resize(&mut self, timeline: &Timeline, options: &SamplingOptions, bytes: u64) -> Result<(), Refusal> {
        self.resize_to(bytes, window_sequences(timeline, options))
    }

    /// Reserves `bytes` in all, for sweep orders that keep up to `window_sequences` sequences at
    /// once (for the refusal's message).
    pub(super) fn resize_to(&mut self, bytes: u64, window_sequences: u64) -> Result<(), Refusal> {
        use crate::pipeline::control::session::RegistryError;
        let bytes = bytes.saturating_add(self.gathering.0);
        let mut reg = self.shared.registry();
        if bytes > self.bytes {
            reg.reserve_sampling(bytes - self.bytes, window_sequences).map_err(|mut e| {
                if let RegistryError::SamplingMemory { needed, gathering, .. } = &mut e {
                    *gathering = (self.gathering.0.min(*needed), self.gathering.1);
                }
                e
            })?;
        } else {
            reg.unreserve_sampling(self.bytes - bytes);
        }
        self.bytes = bytes;
        self.shared.rebudget(&reg);
        Ok(())
    }
}

impl Drop for SamplingReservation {
    fn drop(&mut self) {
        // Never dropped while the registry is locked: sessions end in `finish` after its lock is
        // released, and `open` drops a refused session's reservation after `undo` has returned.
        let mut reg = self.shared.registry();
        reg.unreserve_sampling(self.bytes);
        self.shared.rebudget(&reg);
    }
}

impl OpenSession {
    pub(super) fn state(&self) -> SessionState {
        SessionState {
            version: STATE_VERSION,
            dataset: self.dataset.clone(),
            position: self.progress.position(),
            minibatches: self.progress.taken_count(),
            data_identity: hex64(self.identity),
            options_hash: hex64(self.options_hash),
            job: self.job.clone(),
            worker: self.worker,
            mixture: self.progress.mixture().cloned(),
            equal_steps_minibatch: self.equal_steps_minibatch,
            decode_digest: self.decode_digest.clone(),
        }
    }

    pub(super) fn taken(&mut self, taken: Option<u64>) {
        if let Some(n) = taken {
            self.progress.taken(n);
        }
    }

    /// A client report: consumer wait (cumulative nanoseconds).
    pub(super) fn waited(&mut self, wait_ns: Option<u64>) {
        if let Some(w) = wait_ns {
            // At most the time since the session opened here (found by a probe: one report of
            // 2^64 − 1 ns added 584 years to a series every session of the rank shares).
            let w = w.min(u64::try_from(self.opened.elapsed().as_nanos()).unwrap_or(u64::MAX));
            if w > self.reported_wait_ns {
                self.metrics
                    .consumer_wait_seconds
                    .inc_by(std::time::Duration::from_nanos(w - self.reported_wait_ns).as_secs_f64());
                self.reported_wait_ns = w;
            }
        }
    }

    /// How many minibatches the trainer may have been given: every one announced, unless the
    /// client closed saying what it took; never less than before this connection.
    pub(super) fn given_up_to(&self) -> u64 {
        let here = if self.closed { self.progress.taken_count() } else { self.progress.announced_up_to() };
        here.max(self.given_before)
    }

    /// Writes the acknowledged state, and how far the trainer may have been given minibatches,
    /// to the registry when either moved (checkpoints read them there).
    pub(super) fn record(&mut self, shared: &ControlPlane) {
        let now = (self.progress.taken_count(), self.given_up_to());
        if now.0 != self.recorded.0 {
            shared.registry().update_state(&self.name, &self.state(), now.1);
        } else if now.1 != self.recorded.1 {
            // Only announced (every minibatch): the number alone, not the state rebuilt.
            shared.registry().update_given(&self.name, now.1);
        }
        self.recorded = now;
    }

    /// Moves the slot gauges to the ring's current state (by deltas: sessions of the same
    /// dataset and rank share the series). With `gone`, takes this session's share out.
    pub(super) fn publish_slots(&mut self, gone: bool) {
        let leased = self.slots.leased();
        let filled = if self.producing { self.events.len().min(self.slot_count - leased) } else { 0 };
        let free = self.slot_count - leased - filled;
        let now = if gone { [0; 3] } else { [free, filled, leased].map(|n| i64::try_from(n).unwrap_or(i64::MAX)) };
        for (i, state) in [SlotState::Free, SlotState::Filled, SlotState::Leased].into_iter().enumerate() {
            let delta = now[i] - self.published[i];
            if delta != 0 {
                self.metrics.slots(state).add(delta);
            }
        }
        self.published = now;
    }
}

/// What `opened` says of the data besides the ring and the state.
pub(super) struct Described {
    /// The dataset or mixture.
    pub(super) dataset: String,
    /// Streams in tensor order.
    pub(super) streams: Vec<StreamInfo>,
    /// Nominal samples per sweep (a mixture: of all its sources).
    pub(super) sweep_size: u64,
    /// A mixture's sources.
    pub(super) mixture: Option<MixtureInfo>,
}

/// The `opened` reply.
pub(super) fn opened_message(
    name: &str,
    header: &RingHeader,
    data: Described,
    start: &SessionState,
    admitted: &Admitted,
    data_warnings: Vec<String>,
) -> ServerMessage {
    // That a lingering session of its name was let go comes first: it says where it starts.
    let warnings: Vec<String> =
        admitted.forgotten.iter().chain(&admitted.replay).cloned().chain(data_warnings).collect();
    for w in &warnings {
        tracing::warn!(session = %name, dataset = %data.dataset, "{w}");
    }
    ServerMessage::Opened {
        session: name.to_owned(),
        ring: RingInfo {
            size_bytes: header.total_bytes,
            slot_count: header.slot_count,
            slot_size: header.slot_size,
            slots_offset: header.slots_offset,
            layout_version: LAYOUT_VERSION,
        },
        streams: data.streams,
        state: start.clone(),
        sweep_size: data.sweep_size,
        resumed: admitted.resumed.clone(),
        warnings,
        mixture: data.mixture,
    }
}

/// The host-memory guard's verdict for a new session: `Some((shortfall, reserve))` when it refuses.
pub(super) fn host_shortfall(shared: &ControlPlane) -> Option<(u64, u64)> {
    let reserve = shared.config().daemon.host_memory_reserve_bytes;
    shared.host.refuse.load(Ordering::Relaxed).then(|| (shared.host.shortfall.load(Ordering::Relaxed), reserve))
}

/// Logs that a session resumed by name may give its trainer minibatches again: from a
/// checkpoint written before an unclean stop, or after a connection that ended without saying
/// what its trainer took.
pub(super) fn warn_if_replaying(name: &str, start: &SessionState, resumed: Option<&Resumed>, given_up_to: u64) {
    let Some(r) = resumed.filter(|r| !r.exact) else { return };
    let known = (given_up_to != super::session::GIVEN_UNKNOWN).then_some(given_up_to);
    tracing::warn!(
        session = %name,
        from = %r.from,
        position = start.position,
        minibatches = start.minibatches,
        given_up_to = known,
        checkpoint_unix_secs = r.checkpoint_unix_secs,
        "resumed by name where the trainer may have taken more: minibatches it took after this position are delivered again (from a checkpoint without its checksum, some may be skipped instead; opened.resumed.exact is false)"
    );
}

/// What an opened session's [`OpenSession`] is made of, a dataset's or a mixture's.
pub(super) struct Launch {
    /// The session's name.
    pub(super) session: String,
    /// The dataset or mixture.
    pub(super) dataset: String,
    /// Its data identity.
    pub(super) identity: u64,
    /// The datasets it reads.
    pub(super) sources: Vec<String>,
    /// Its options hash.
    pub(super) options_hash: u64,
    /// The earlier run it continues (`resume_job`).
    pub(super) job: Option<JobBase>,
    /// Where it starts.
    pub(super) start: SessionState,
    /// How far its trainer may have been given minibatches before this connection.
    pub(super) given_up_to: u64,
    /// Bytes of its ring.
    pub(super) ring_bytes: u64,
    /// Slots of its ring.
    pub(super) slot_count: usize,
    /// Its metrics.
    pub(super) metrics: SessionMetrics,
    /// Its sweep orders' memory, reserved.
    pub(super) sampling: SamplingReservation,
}

impl Launch {
    /// Starts `producer` on the delivery stage (every slot free) and makes the session's
    /// [`OpenSession`].
    pub(super) async fn start(self, conn: &ConnShared, producer: Producer) -> Result<OpenSession, Refusal> {
        let slots = SlotTable::new(self.slot_count);
        let (events_tx, events_rx) = flume::bounded(self.slot_count + 2);
        let free = every_slot(&slots, self.slot_count as u64);
        let start = StartProducer {
            name: self.session.clone(),
            producer,
            free,
            slot_count: self.slot_count,
            events: events_tx,
        };
        let producer = conn.delivery.send(start).await.map_err(|e| Refusal::Delivery(e.to_string()))?;
        Ok(OpenSession {
            name: self.session,
            dataset: self.dataset,
            identity: self.identity,
            sources: self.sources,
            configured_mixture: None,
            options_hash: self.options_hash,
            slots,
            progress: Progress::new(&self.start),
            producer,
            events: events_rx,
            ring_bytes: self.ring_bytes,
            producing: true,
            binary: false,
            _attached: self.metrics.attached(),
            metrics: self.metrics,
            slot_count: self.slot_count,
            published: [0; 3],
            reported_wait_ns: 0,
            opened: Instant::now(),
            recorded: (self.start.minibatches, self.given_up_to),
            given_before: self.given_up_to,
            closed: false,
            job: self.job,
            worker: self.start.worker,
            equal_steps_minibatch: self.start.equal_steps_minibatch,
            decode_digest: self.start.decode_digest.clone(),
            _sampling: self.sampling,
        })
    }
}

/// Which of several workers a session of `resolved` is (`None`: one worker).
pub(super) fn session_worker(resolved: &ResolvedOptions) -> Option<WorkerOf> {
    WorkerOf::of_session(resolved.sampling.rank as u64, resolved.sampling.num_workers as u64)
}

/// A session's ring in a new memfd of `bytes`, for its fillers, and the memfd for its client.
pub(super) fn new_ring(
    name: &str,
    bytes: u64,
    geometry: RingGeometry,
    daemon_id: u64,
    session_id: u64,
) -> Result<(SharedRing<MemfdMemory>, OwnedFd), Refusal> {
    let memory = MemfdMemory::create(&format!("minibatchd-{name}"), bytes).map_err(|e| match e {
        // Found by a probe: under `ulimit -f` the refusal said only "ftruncate: File too large".
        ShmError::Sys { source, .. } if source.raw_os_error() == Some(rustix::io::Errno::FBIG.raw_os_error()) => {
            Refusal::RingOverFileSizeLimit(bytes)
        }
        e => Refusal::Ring(e),
    })?;
    let fd = memory.fd().try_clone_to_owned().map_err(Refusal::Descriptor)?;
    let ring = Ring::new(memory, geometry, daemon_id, session_id).and_then(Ring::into_shared)?;
    Ok((ring, fd))
}

/// The `count` slots of a new ring, each with its first generation: all free.
fn every_slot(slots: &SlotTable, count: u64) -> Vec<FreeSlot> {
    (0..count).zip(0..).map(|(s, i)| FreeSlot { slot: s, generation: slots.next_generation(i) }).collect()
}

/// Runs `work` (a session's sweep orders, equal steps, a job's walk: bounded, but up to seconds on
/// a large dataset) on the runtime's blocking threads, so that the event loop goes on serving the
/// other connections meanwhile.
pub(super) async fn off_the_event_loop<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Refusal> + Send + 'static,
) -> Result<T, Refusal> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(Refusal::Delivery(format!("the session's preparation did not finish: {e}"))))
}

/// Writes the daemon checkpoint with the admitted session in it, before its client hears of it:
/// after a crash, a session the client knows is resumable by name, and its replay is signalled
/// (`resumed`). When it cannot be written, there is no session.
pub(super) async fn checkpoint_opening(shared: &Arc<ControlPlane>) -> Result<(), Refusal> {
    let shared = shared.clone();
    off_the_event_loop(move || shared.write_checkpoint("open").map_err(Refusal::Checkpoint)).await
}

/// What an `open` is told of the dataset's version: that it is the one before a reload whose
/// configuration failed to open, or that it decodes the values otherwise than the state it
/// resumes from was written under (`decoded_otherwise`).
fn version_warnings(dataset: &str, rt: &DatasetRuntime, decoded_otherwise: bool) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(e) = rt.reopen_failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner).as_ref() {
        // Found by a probe: new sessions got the version before a failed reload, told nothing.
        out.push(format!(
            "the configuration in force for dataset {dataset:?} could not be opened at the last reload ({e}): this session reads the version before that reload"
        ));
    }
    if decoded_otherwise {
        // Found by a probe: a reload swapped two streams' columns, and a session resumed by name
        // went on at the exact position with the other column in each stream, told nothing.
        out.push(format!(
            "dataset {dataset:?} decodes its values otherwise than when this state was written (its streams, format or precision options changed — or the state was written by another build of minibatchd, whose digest of those options may differ): the session goes on at the exact position, and the minibatches from here are decoded by the definitions in force now"
        ));
    }
    out
}

/// Opens a session: [`fn@prepare`], [`admission::admit`], then the ring, the checkpoint and the
/// producer (undoing the admission when any fails). The walk for equal steps gives up when
/// `cancelled` turns true (its client went away), and the admission is undone as for any refusal.
pub(super) async fn open(
    dataset: &str,
    options: &SessionOptions,
    conn: &ConnShared,
    peer: &Peer,
    cancelled: &Arc<AtomicBool>,
) -> Result<(OpenSession, ServerMessage, OwnedFd), Refusal> {
    let shared = &conn.shared;
    let Prepared { rt, resolved, options_hash: ohash, sampler, mut sampling, geometry, job_start, working } =
        prepare(dataset, options, shared, cancelled).await?;
    let worker = session_worker(&resolved);
    // A fresh session starts where its sampler does: 0, or the first sample of `sweep`.
    let fresh_position = sampler.position();
    let request = admission::Request {
        dataset,
        name: resolved.session.as_deref(),
        resume: options.resume.as_ref().or(job_start.as_ref()),
        fresh: fresh_state(dataset, fresh_position, rt.identity, ohash, equal_steps_minibatch(&resolved)),
        fits: &|s: &SessionState| {
            check_resume(s, dataset, rt.identity, rt.legacy_identity, ohash, equal_steps_minibatch(&resolved))?;
            check_worker(s, worker)
        },
        ring_bytes: geometry.total_bytes(),
        host_short: host_shortfall(shared),
        uid: peer.uid,
        limits: shared.limits.sessions,
        nonce: super::random_u64(),
        options,
    };
    let admitted = admission::retry_busy(|| {
        let mut reg = shared.registry();
        let admitted = admission::admit(&mut reg, &request, Instant::now())?;
        shared.rebudget(&reg);
        Ok(admitted)
    })
    .await?;
    // Any later failure gives the name and the memory back.
    let undo = |refusal: Refusal| {
        let mut reg = shared.registry();
        admission::withdraw(&mut reg, &admitted, Instant::now());
        shared.rebudget(&reg);
        refusal
    };
    // The floor is what a whole sweep holds at its peak: a session that resumes (perhaps near the
    // end of its last sweep) may hold much less, so only fresh sessions are checked at `open`; the
    // cache's ceiling holds the others.
    if admitted.start.job.is_none() && admitted.start.position == fresh_position {
        let workers_here =
            worker.map_or(1, |w| 1 + shared.registry().other_workers_here(&admitted.name, dataset, &hex64(ohash), w));
        let here = (workers_here, geometry.total_bytes());
        window_fits(&rt, sampler.sweep_size(), &resolved, shared, sampling.bytes, here).map_err(undo)?;
    }
    // A lingering session's state may continue a job, which `prepare` could not know.
    sampling
        .opening(rt.dataset.timeline(), &resolved.sampling, admitted.start.job.is_some(), resolved.equal_steps)
        .map_err(undo)?;
    // Its every state says which worker it is (a state it resumed from may be a one-worker
    // session's, or a job's start) and, with equal steps, the minibatch size it cuts for (a state
    // of an earlier build says none).
    let equal_steps_minibatch = equal_steps_minibatch(&resolved);
    let decode_digest = Some(hex64(rt.decode_digest));
    let decoded_otherwise = admitted.start.decode_digest.as_ref().is_some_and(|d| Some(d) != decode_digest.as_ref());
    let start = SessionState { worker, equal_steps_minibatch, decode_digest, ..admitted.start.clone() };
    let (id, name, ring_bytes) = (admitted.id, admitted.name.clone(), admitted.ring_bytes());
    let (sampler, pad_to, mut warnings) = {
        let (start, resolved, dataset, shared, rt, cancelled) =
            (start.clone(), resolved.clone(), dataset.to_owned(), shared.clone(), rt.clone(), cancelled.clone());
        off_the_event_loop(move || place_sampler(sampler, &start, &resolved, &dataset, &shared, &rt, &cancelled))
            .await
            .map_err(undo)?
    };
    warnings.extend(version_warnings(dataset, &rt, decoded_otherwise));
    sampling.opened(rt.dataset.timeline(), &resolved.sampling, start.job.is_some()).map_err(undo)?;
    let (ring, fd) = new_ring(&name, ring_bytes, geometry, shared.daemon_id, id).map_err(undo)?;
    let header = *ring.header();
    checkpoint_opening(shared).await.map_err(undo)?;

    // At most MAX_RING_SLOTS (validated in resolve_options).
    let slot_count = usize::try_from(resolved.slots).unwrap_or(usize::MAX);
    let metrics = shared.data.metrics.session(dataset, resolved.sampling.rank as u64);
    let producer = Producer::new(
        rt.clone(),
        shared.data.cache.clone(),
        sampler,
        ring,
        resolved.minibatch_size,
        resolved.frame_mode,
        start.minibatches,
        pad_to,
        metrics.clone(),
    )
    .counted(working);
    warn_if_replaying(&name, &start, admitted.resumed.as_ref(), admitted.given_up_to);
    let described = Described {
        dataset: rt.name.clone(),
        streams: rt.streams.clone(),
        sweep_size: rt.dataset.timeline().samples(..),
        mixture: None,
    };
    let opened = opened_message(&name, &header, described, &start, &admitted, warnings);
    let launch = Launch {
        session: name,
        dataset: rt.name.clone(),
        identity: rt.identity,
        sources: vec![rt.name.clone()],
        options_hash: ohash,
        job: start.job.clone(),
        start,
        given_up_to: admitted.given_up_to,
        ring_bytes,
        slot_count,
        metrics,
        sampling,
    };
    let active = launch.start(conn, producer).await.map_err(undo)?;
    Ok((active, opened, fd))
}
