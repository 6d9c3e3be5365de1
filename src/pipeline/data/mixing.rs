//! A mixture session's planner (`docs/mixtures.md`): the engine's [`Mixture`] over the shared
//! chunk cache, for the session's [`super::producer::Producer`] — which writes what it locates
//! into the ring as it does a dataset's minibatches.
//!
//! Each minibatch's chunks come from the cache under their own dataset's key (a mixture shares
//! the parsed chunks, the parser pool and the parsed cache with every session of its
//! datasets). A chunk stays held until its source's sweep is done with it (the plan's `retire`),
//! as a dataset's session holds its window. The next [`AHEAD`] minibatches are planned ahead and
//! their chunks asked for, so that the parser pool works while this one is gathered.
//!
//! Memory: at `open` the sources' windows must fit the chunk cache's share together
//! (`control::mixture`); during the run, when the chunks sessions hold fill it, the planner lets
//! go of what its minibatch does not need, then waits in line with the other sessions
//! (`minibatchd_session_memory_wait_seconds_total`). A minibatch whose own chunks cannot fit
//! together is gathered a chunk at a time, as a dataset's session does: each chunk loaded in turn,
//! the minibatch's sequences copied out of it and the chunk let go
//! (`minibatchd_session_minibatches_in_parts_total`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use minibatchd_client::protocol as wire;
use minibatchd_engine::dataset::charge_chunk;
use minibatchd_engine::format::chunk::ParsedChunk;
use minibatchd_engine::format::errors::{DataError, ErrorBudget};
use minibatchd_engine::minibatch::{gather_mixture, gather_mixture_copied, ChunkSource, Gathered, StreamShape};
use minibatchd_engine::sampling::mixture::{Mixture, MixturePlan, MixtureState, SourceState};
use minibatchd_engine::sampling::Timeline;
use prometheus::{Gauge, IntCounter};

use super::catalog::DatasetRuntime;
use super::chunk_cache::{Charged, ChunkKey, FetchError, SharedCache};
use super::producer::{next_producer_id, Found, FreeSlot, Locate, Located, ProduceError, Producer, ProducerEvent};
use crate::metrics::SessionMetrics;
use minibatchd_shm::SharedRing;
use minibatchd_sys::MemfdMemory;

/// Minibatches planned ahead of the one being gathered, whose chunks are asked for.
const AHEAD: usize = 2;

/// How long a planner waiting for memory blocks its pool thread at a time.
const MEMORY_WAIT_SLICE: Duration = Duration::from_millis(20);

/// The engine's mixture state as the protocol carries it.
#[must_use]
pub fn to_wire(s: &MixtureState) -> wire::MixtureState {
    wire::MixtureState {
        step: s.step,
        slots: s.slots,
        samples: s.samples,
        ended: s.ended,
        sources: s
            .sources
            .iter()
            .map(|x| wire::MixtureSourceState {
                position: x.position,
                taken: x.taken,
                credit: x.credit,
                weight: x.weight,
            })
            .collect(),
    }
}

/// A protocol mixture state as the engine's (checked by [`Mixture::restore`]).
#[must_use]
pub fn from_wire(s: &wire::MixtureState) -> MixtureState {
    MixtureState {
        step: s.step,
        slots: s.slots,
        samples: s.samples,
        ended: s.ended,
        sources: s
            .sources
            .iter()
            .map(|x| SourceState { position: x.position, taken: x.taken, credit: x.credit, weight: x.weight })
            .collect(),
    }
}

/// One source as the planner reads it.
pub struct PlannedSource {
    /// The source's dataset (the version the session opened on).
    pub runtime: Arc<DatasetRuntime>,
    /// The dataset's stream filling each of the mixture's streams.
    pub order: Vec<usize>,
    /// `minibatchd_mixture_samples_total{mixture, source}`.
    pub samples: IntCounter,
    /// `minibatchd_mixture_target_share{mixture, source}`.
    pub target_share: Gauge,
}

/// A minibatch planned, waiting for its chunks (or for memory).
struct Pending {
    slot: FreeSlot,
    plan: MixturePlan,
    started: Instant,
    cache_wait: Duration,
    memory_wait: Duration,
    /// It let go of the chunks it does not need.
    shed: bool,
    /// Gathered a chunk at a time (its chunks do not fit in memory together): the copies of its
    /// sequences made so far, by (source, chunk), and what they are charged against the cache.
    parts: Option<(Copies, Vec<Charged>)>,
    /// Since when it has waited behind other sessions in line for memory, without a thread.
    behind_since: Option<Instant>,
}

/// Copies of a minibatch's sequences, by (source, chunk).
type Copies = HashMap<(u32, u32), Arc<ParsedChunk>>;

/// Plans a mixture session's minibatches: see the module's documentation.
pub struct MixturePlanner {
    sources: Vec<PlannedSource>,
    /// The mixture's stream shapes (every source's mapped streams have them).
    shapes: Vec<StreamShape>,
    /// Per source, its dataset's stream filling each of the mixture's streams.
    orders: Vec<Vec<usize>>,
    cache: Arc<SharedCache>,
    mixture: Mixture,
    minibatch_size: usize,
    /// The next minibatch's index in the session.
    next_index: u64,
    /// Planned ahead, in order; `None` after them: the epoch ended.
    ahead: VecDeque<MixturePlan>,
    ended: bool,
    /// Per source, the chunks held.
    held: Vec<HashMap<u32, Arc<ParsedChunk>>>,
    pending: Option<Pending>,
    metrics: SessionMetrics,
    idle_since: Option<Instant>,
    id: u64,
    /// It said in the log that a minibatch was gathered a chunk at a time.
    told_parts: bool,
    /// Per source, the session's own error budgets (one per source of its dataset): the
    /// malformed places of the chunks it loads are charged to them, as `dump` does.
    budgets: Vec<Vec<ErrorBudget>>,
}

impl MixturePlanner {
    /// A planner that continues `mixture` (already restored) with minibatch `next_index`.
    #[must_use]
    pub fn new(
        sources: Vec<PlannedSource>,
        shapes: Vec<StreamShape>,
        cache: Arc<SharedCache>,
        mixture: Mixture,
        minibatch_size: usize,
        next_index: u64,
        metrics: SessionMetrics,
    ) -> Self {
        let held = vec![HashMap::new(); sources.len()];
        let orders = sources.iter().map(|s| s.order.clone()).collect();
        let budgets = sources.iter().map(|s| s.runtime.dataset.reader_budgets()).collect();
        Self {
            budgets,
            sources,
            shapes,
            orders,
            cache,
            mixture,
            minibatch_size,
            next_index,
            ahead: VecDeque::new(),
            ended: false,
            held,
            pending: None,
            metrics,
            idle_since: None,
            id: next_producer_id(),
            told_parts: false,
        }
    }

    /// The session's producer (of mixture `name`, streams `names`, into `ring`), planned by this.
    #[must_use]
    pub fn into_producer(self, name: String, names: Vec<String>, ring: SharedRing<MemfdMemory>) -> Producer {
        Producer::planned(Box::new(self), name, names, ring)
    }

    fn key(&self, source: u32, chunk: u32) -> ChunkKey {
        ChunkKey::new(self.sources[source as usize].runtime.index, chunk)
    }

    /// Plans up to [`AHEAD`] minibatches past the next one and asks for their chunks not held.
    fn plan_ahead(&mut self) -> Result<(), ProduceError> {
        while !self.ended && self.ahead.len() <= AHEAD {
            match self.mixture.next_minibatch(self.minibatch_size) {
                Ok(Some(plan)) => {
                    let keys: Vec<ChunkKey> = self.missing(&plan).into_iter().map(|(s, c)| self.key(s, c)).collect();
                    self.cache.prefetch(Some(self.id), keys);
                    self.ahead.push_back(plan);
                }
                Ok(None) => self.ended = true,
                Err(e) => return Err(ProduceError::Data(DataError::Dataset(format!("the mixture: {e}")))),
            }
        }
        Ok(())
    }

    /// The `(source, chunk)` of `plan` not held, in order of first need.
    fn missing(&self, plan: &MixturePlan) -> Vec<(u32, u32)> {
        let mut seen: HashSet<(u32, u32)> = HashSet::new();
        plan.sequences
            .iter()
            .map(|r| (r.source, r.seq.chunk))
            .filter(|&(s, c)| !self.held[s as usize].contains_key(&c) && seen.insert((s, c)))
            .collect()
    }

    /// Lets go of the chunks held that `plan` does not need (all, without a plan); their count.
    fn shed(&mut self, plan: Option<&MixturePlan>) -> usize {
        let needed: HashSet<(u32, u32)> =
            plan.map(|p| p.sequences.iter().map(|r| (r.source, r.seq.chunk)).collect()).unwrap_or_default();
        let mut n = 0;
        for (s, held) in self.held.iter_mut().enumerate() {
            let before = held.len();
            let source = u32::try_from(s).unwrap_or(u32::MAX);
            held.retain(|&c, _| needed.contains(&(source, c)));
            n += before - held.len();
        }
        self.cache.shed(n);
        n
    }

    /// Loads the chunks of `plan` not held. `Ok(None)` when done; `Ok(Some(e))` when one was
    /// refused at the memory limit.
    fn load(
        &mut self,
        plan: &MixturePlan,
        stop: &AtomicBool,
        wait: &mut Duration,
    ) -> Result<Option<FetchError>, ProduceError> {
        let missing = self.missing(plan);
        self.cache.prefetch(Some(self.id), missing.iter().map(|&(s, c)| self.key(s, c)));
        for (s, c) in missing {
            let asked = Instant::now();
            let got = self.cache.get(self.key(s, c), stop, self.id);
            *wait += asked.elapsed();
            match got {
                Ok(chunk) => {
                    charge_chunk(&self.budgets[s as usize], &chunk)?;
                    self.held[s as usize].insert(c, chunk);
                }
                Err(e @ (FetchError::OverLimit { .. } | FetchError::Behind)) => return Ok(Some(e)),
                Err(FetchError::Stopped) => return Err(ProduceError::Stopped),
                Err(FetchError::Failed(e)) => {
                    let dataset = &self.sources[s as usize].runtime.dataset;
                    return Err(ProduceError::Data(dataset.charge_failed_chunk(
                        &self.budgets[s as usize],
                        c as usize,
                        e,
                    )));
                }
                Err(e) => {
                    let name = &self.sources[s as usize].runtime.name;
                    return Err(ProduceError::Data(DataError::Dataset(format!("dataset '{name}', chunk {c}: {e}"))));
                }
            }
        }
        Ok(None)
    }

    /// Waits behind the sessions waiting for memory ahead of it: in line, holding nothing, idle
    /// (no thread) until the cache wakes it as the first ([`SharedCache::leave_line`]).
    fn queue_behind(&mut self, mut p: Pending) -> Found {
        self.cache.queue_for_memory(self.id);
        self.shed(None);
        p.behind_since.get_or_insert_with(Instant::now);
        self.pending = Some(p);
        if self.cache.wait_out_turn(self.id, Instant::now() + MEMORY_WAIT_SLICE) {
            return Found::Wait;
        }
        Found::Queued
    }

    /// Waits for memory other sessions hold, one slice; whether there is room now.
    fn wait_for_memory(&mut self, stop: &AtomicBool, memory_wait: &mut Duration) -> bool {
        self.cache.queue_for_memory(self.id);
        if !self.cache.first_in_line(self.id) {
            self.shed(None);
        }
        let since = Instant::now();
        let room = self.cache.wait_for_memory(self.id, stop, since + MEMORY_WAIT_SLICE);
        let waited = since.elapsed();
        self.metrics.memory_wait_seconds.inc_by(waited.as_secs_f64());
        *memory_wait += waited;
        room
    }

    /// Gathers `p` a chunk at a time, its own chunks not fitting in memory together: each chunk
    /// loaded in turn, the plan's sequences copied out of it ([`ParsedChunk::select`], charged
    /// against the cache until the minibatch is in its slot), the chunk let go. `Found::Wait`
    /// while a load waits for memory other sessions hold (the copies made are kept).
    fn gather_parts(&mut self, mut p: Pending, stop: &AtomicBool) -> Result<Found, ProduceError> {
        if !self.told_parts {
            self.told_parts = true;
            tracing::warn!(
                minibatch = self.next_index,
                "a mixture's minibatch's chunks do not fit in memory together; it and any other such minibatch of this \
                 session are gathered a chunk at a time, which is slower (minibatchd_session_minibatches_in_parts_total): \
                 smaller randomization windows for its datasets or a larger memory_limit_bytes avoid it"
            );
        }
        self.shed(None);
        let (mut copies, mut charges) = p.parts.take().unwrap_or_default();
        let mut wanted: Vec<(u32, u32)> = Vec::new();
        for r in &p.plan.sequences {
            let k = (r.source, r.seq.chunk);
            if !copies.contains_key(&k) && !wanted.contains(&k) {
                wanted.push(k);
            }
        }
        for (s, c) in wanted {
            let asked = Instant::now();
            let got = self.cache.get(self.key(s, c), stop, self.id);
            p.cache_wait += asked.elapsed();
            let chunk = match got {
                Ok(chunk) => {
                    charge_chunk(&self.budgets[s as usize], &chunk)?;
                    chunk
                }
                Err(FetchError::OverLimit { .. } | FetchError::Behind) => {
                    // Others hold the memory: wait in line, keeping the copies made.
                    self.wait_for_memory(stop, &mut p.memory_wait);
                    p.shed = true;
                    p.parts = Some((copies, charges));
                    if stop.load(Ordering::Relaxed) {
                        self.cache.leave_line(self.id);
                        return Err(ProduceError::Stopped);
                    }
                    self.pending = Some(p);
                    return Ok(Found::Wait);
                }
                Err(FetchError::Stopped) => {
                    self.cache.leave_line(self.id);
                    return Err(ProduceError::Stopped);
                }
                Err(FetchError::Failed(e)) => {
                    self.cache.leave_line(self.id);
                    let dataset = &self.sources[s as usize].runtime.dataset;
                    return Err(ProduceError::Data(dataset.charge_failed_chunk(
                        &self.budgets[s as usize],
                        c as usize,
                        e,
                    )));
                }
                Err(e) => {
                    self.cache.leave_line(self.id);
                    let name = &self.sources[s as usize].runtime.name;
                    return Err(ProduceError::Data(DataError::Dataset(format!("dataset '{name}', chunk {c}: {e}"))));
                }
            };
            let timeline = self.sources[s as usize].runtime.dataset.timeline();
            let start = timeline.chunk_start.get(c as usize).copied().unwrap_or(usize::MAX);
            let locals = p
                .plan
                .sequences
                .iter()
                .filter(|r| (r.source, r.seq.chunk) == (s, c))
                .map(|r| {
                    (r.seq.seq as usize).checked_sub(start).filter(|&l| l < chunk.num_sequences).ok_or_else(|| {
                        DataError::Dataset(format!("sequence {} is not in chunk {c} of source {s}", r.seq.seq))
                    })
                })
                .collect::<Result<Vec<usize>, DataError>>()?;
            let copy = chunk.select(&locals);
            drop(chunk);
            charges.push(self.cache.charge(copy.size_bytes() as u64));
            copies.insert((s, c), Arc::new(copy));
        }
        self.metrics.minibatches_in_parts.inc();
        let mb = gather_mixture_copied(self.next_index, &p.plan, &self.shapes, &self.orders, &copies)?;
        // The copies are the minibatch's now: charged, as one, until it is in its slot.
        let bytes: u64 = copies.values().map(|c| c.size_bytes() as u64).sum();
        drop(copies);
        let whole = Arc::new(self.cache.charge(bytes));
        drop(charges);
        p.parts = None;
        Ok(self.finish(p, mb, Some(whole)))
    }

    fn located(&mut self, p: Pending) -> Result<Found, ProduceError> {
        let timelines: Vec<&Timeline> = self.sources.iter().map(|s| s.runtime.dataset.timeline().as_ref()).collect();

        let mut chunks: Vec<&mut dyn ChunkSource> = self.held.iter_mut().map(|h| h as &mut dyn ChunkSource).collect();
        let mb = gather_mixture(self.next_index, &p.plan, &self.shapes, &timelines, &self.orders, &mut chunks)?;
        Ok(self.finish(p, mb, None))
    }

    /// A minibatch gathered: the chunks its sources' sweeps are done with go, the metrics count
    /// it, and it goes to a filler.
    fn finish(&mut self, p: Pending, mb: Gathered, charged: Option<Arc<Charged>>) -> Found {
        let Pending { slot, plan, started, cache_wait, memory_wait, shed, .. } = p;
        if shed {
            self.cache.leave_line(self.id);
        }
        self.next_index = self.next_index.saturating_add(1);
        for &(s, c) in &plan.retire {
            if let Some(h) = self.held.get_mut(s as usize) {
                h.remove(&c);
            }
        }
        let weights = self.mixture.options().schedule.at(plan.step);
        for (i, source) in self.sources.iter().enumerate() {
            source.target_share.set(weights.share(i));
        }
        for r in &plan.sequences {
            self.sources[r.source as usize].samples.inc_by(u64::from(r.samples));
        }
        self.metrics.chunk_wait_seconds.inc_by(cache_wait.as_secs_f64());
        let busy = started.elapsed().saturating_sub(cache_wait).saturating_sub(memory_wait);
        self.metrics.delivery_busy_seconds.inc_by(busy.as_secs_f64());
        // The slot carries the sources, the sweeps ended and the state too (`MixtureTensors`); the
        // state goes with the event for the session's progress.
        let mixture = Some(Box::new(to_wire(&plan.state)));
        Found::Minibatch(Located { slot, mb, samples: plan.samples, charged, mixture })
    }
}

impl Locate for MixturePlanner {
    fn locate(&mut self, slot: FreeSlot, stop: &AtomicBool) -> Result<Found, ProduceError> {
        let mut p = if let Some(p) = self.pending.take() {
            p
        } else {
            let started = Instant::now();
            self.plan_ahead()?;
            let Some(plan) = self.ahead.pop_front() else { return Ok(Found::End) };
            Pending {
                slot,
                plan,
                started,
                cache_wait: Duration::ZERO,
                memory_wait: Duration::ZERO,
                shed: false,
                parts: None,
                behind_since: None,
            }
        };
        // Behind other sessions waiting for memory: it waits for its turn without a thread (it
        // is woken when it comes first).
        if p.shed && self.cache.behind(Some(self.id)) {
            return Ok(self.queue_behind(p));
        }
        if let Some(since) = p.behind_since.take() {
            let waited = since.elapsed();
            self.metrics.memory_wait_seconds.inc_by(waited.as_secs_f64());
            p.memory_wait += waited;
        }
        if p.parts.is_some() {
            return self.gather_parts(p, stop);
        }
        loop {
            let refused = match self.load(&p.plan, stop, &mut p.cache_wait) {
                Ok(refused) => refused,
                Err(e) => {
                    self.cache.leave_line(self.id);
                    return Err(e);
                }
            };
            if stop.load(Ordering::Relaxed) {
                self.cache.leave_line(self.id);
                return Err(ProduceError::Stopped);
            }
            let Some(e) = refused else { break };
            // The chunks sessions hold fill the cache's share: first let go of what this
            // minibatch does not need; then wait, in line, for what others hold.
            if !p.shed {
                p.shed = true;
                self.shed(Some(&p.plan));
                continue;
            }
            let own: u64 = self.held.iter().flat_map(HashMap::values).map(|c| c.size_bytes() as u64).sum();
            let held = match e {
                FetchError::OverLimit { held, .. } => held,
                FetchError::Behind => return Ok(self.queue_behind(p)),
                e => {
                    self.cache.leave_line(self.id);
                    return Err(ProduceError::Data(DataError::Dataset(format!("the mixture's chunks: {e}"))));
                }
            };
            // Only for chunks others can let go of, and not past the first in line's patience:
            // what others hold may never go while they are idle (see the planner); then a chunk
            // at a time, which needs room for one.
            if self.cache.others_can_free(held, own) && !self.cache.out_of_patience(self.id) {
                if self.wait_for_memory(stop, &mut p.memory_wait) {
                    continue;
                }
                self.pending = Some(p);
                return Ok(Found::Wait);
            }
            // This minibatch's own chunks do not fit together: a chunk at a time.
            return self.gather_parts(p, stop);
        }
        self.located(p)
    }

    fn end(&self) -> ProducerEvent {
        let state = self.mixture.state();
        ProducerEvent::End { position: state.slots, minibatches: self.next_index, mixture: Some(to_wire(state)) }
    }

    fn waiting(&self) -> Option<FreeSlot> {
        self.pending.as_ref().map(|p| p.slot)
    }

    fn shed_all(&mut self) {
        self.shed(None);
    }

    fn idle_since(&mut self) -> &mut Option<Instant> {
        &mut self.idle_since
    }

    fn cache(&self) -> &Arc<SharedCache> {
        &self.cache
    }

    fn id(&self) -> u64 {
        self.id
    }

    fn metrics(&self) -> &SessionMetrics {
        &self.metrics
    }
}
