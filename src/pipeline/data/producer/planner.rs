//! A dataset's planner: the half of a producer that locates its minibatches — the engine's
//! `Feeder` (the sampler and the session's chunks) over the shared chunk cache — waiting in line
//! for memory other sessions hold, and gathering a minibatch a chunk at a time where its chunks
//! do not fit together. A mixture's is `data::mixing::MixturePlanner`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use minibatchd_engine::dataset::{charge_chunk, Dataset};
use minibatchd_engine::feed::Feeder;
use minibatchd_engine::format::chunk::ParsedChunk;
use minibatchd_engine::format::errors::{DataError, ErrorBudget};
use minibatchd_engine::minibatch::{memory_bound, Gathered, Parts};
use minibatchd_engine::sampling::{BuiltSweep, MinibatchPlan};

use super::{next_producer_id, Found, FreeSlot, Locate, Located, ProduceError, ProducerEvent, PREFETCH_CHUNKS};
use crate::metrics::SessionMetrics;
use crate::pipeline::data::catalog::DatasetRuntime;
use crate::pipeline::data::chunk_cache::{Charged, ChunkKey, FetchError, SharedCache};

/// How long a producer waiting for memory blocks its pool thread at a time: then it yields the
/// thread to the pool's other tasks — among them the sessions that can free the memory — and
/// looks again whether it is first in line (and logs, every [`MEMORY_WAIT_LOG`], that it still
/// waits).
const MEMORY_WAIT_SLICE: Duration = Duration::from_millis(20);

/// A minibatch planned but not gathered yet: it waits for memory other sessions hold.
struct Pending {
    slot: FreeSlot,
    plan: MinibatchPlan,
    wanted: Vec<u32>,
    started: Instant,
    cache_wait: Duration,
    /// It let go of the chunks it does not need.
    shed: bool,
    memory_wait: Duration,
    /// Its chunks do not fit in memory together: it is gathered a chunk at a time, with the
    /// minibatches after it.
    parts: Option<PartsAhead>,
    /// Since when it has waited behind other sessions in line for memory, without a thread.
    behind_since: Option<Instant>,
}

/// How often a session that still waits for memory says so in the log.
const MEMORY_WAIT_LOG: Duration = Duration::from_secs(60);

/// Most minibatches gathered a chunk at a time together ([`Parts`]).
const PARTS_AHEAD_MAX: usize = 256;

/// The copies that minibatches gathered a chunk at a time together may take: as many minibatches
/// are planned ahead as fit, going by the size of those gathered before (counted against the
/// cache while they wait for their slots).
const PARTS_AHEAD_BYTES: usize = 16 << 20;

/// Chunks let go of before their last use per minibatch gathered whole ([`Planner::shed_rate`]),
/// from which a minibatch refused a load is gathered a chunk at a time (a property test's case:
/// a libsvm window wider than the cache let go of and loaded 18 chunks a minibatch, 9
/// minibatches a second in a debug build).
const PARTS_SHED_RATE: f32 = 1.0;

/// Minibatches planned ahead and gathered a chunk at a time together.
struct PartsAhead {
    plans: Vec<MinibatchPlan>,
    parts: Parts,
}

/// The half of a producer that locates minibatches: the engine's [`Feeder`] (the sampler and
/// the session's chunks) over the shared chunk cache.
pub(super) struct Planner {
    runtime: Arc<DatasetRuntime>,
    cache: Arc<SharedCache>,
    feeder: Feeder,
    minibatch_size: usize,
    metrics: SessionMetrics,
    /// Since when every slot has been leased (the time counts as producer-blocked).
    idle_since: Option<Instant>,
    /// The next sweep's order being built on a thread of its own ([`Planner::next_sweep`]).
    next_sweep: Option<flume::Receiver<BuiltSweep>>,
    /// This producer's id in the cache's list of idle producers.
    id: u64,
    /// The minibatch waiting for memory, if any.
    pending: Option<Pending>,
    /// It said in the log that a minibatch was gathered a chunk at a time.
    told_parts: bool,
    /// Minibatches gathered a chunk at a time with one before them, for the next slots.
    gathered_ahead: std::collections::VecDeque<(Gathered, u64, Arc<Charged>)>,
    /// How many minibatches to gather a chunk at a time together: [`PARTS_AHEAD_BYTES`] over the
    /// size of those gathered so before (1 before any was).
    parts_ahead: usize,
    /// Chunks it let go of before their last use (for other sessions, or to fit its
    /// minibatch), in all and as of the last minibatch gathered whole; and per minibatch gathered
    /// whole, a moving average over about the last eight.
    shed_total: u64,
    shed_counted: u64,
    shed_rate: f32,
    /// The session's own error budgets, one per source: the malformed places of the chunks it
    /// uses are charged to them as it loads each ([`charge_chunk`]), as `dump` does.
    budgets: Arc<[ErrorBudget]>,
}

impl Planner {
    /// A planner of `feeder`'s minibatches over `cache`, counting into `metrics`.
    pub(super) fn new(
        runtime: Arc<DatasetRuntime>,
        cache: Arc<SharedCache>,
        feeder: Feeder,
        minibatch_size: usize,
        metrics: SessionMetrics,
    ) -> Self {
        Self {
            cache,
            feeder,
            minibatch_size,
            metrics,
            idle_since: None,
            next_sweep: None,
            id: next_producer_id(),
            pending: None,
            told_parts: false,
            gathered_ahead: std::collections::VecDeque::new(),
            // None gathered so yet, so no size to go by: one (found by a probe: a first group of
            // eight minibatches of 8.6 MB each took five times a 28 MiB limit).
            parts_ahead: 1,
            shed_total: 0,
            shed_counted: 0,
            shed_rate: 0.0,
            budgets: runtime.dataset.reader_budgets().into(),
            runtime,
        }
    }

    /// Has the next sweep's order built on a thread of its own from the start of each sweep
    /// (shuffling a sweep of a large dataset takes tens of milliseconds: on the planner, near the
    /// sweep's end, it held every minibatch back that long), and installs it once built
    /// — waiting for it when the current sweep is about to end, so that it is never built twice.
    fn next_sweep(&mut self) {
        if let Some(building) = &self.next_sweep {
            let sampler = self.feeder.sampler();
            let left = sampler.left_in_sweep();
            let soon = left <= sampler.sweep_size() / 8 || left <= 4 * self.minibatch_size as u64;
            let built = if soon {
                building.recv().ok()
            } else {
                match building.try_recv() {
                    Ok(built) => Some(built),
                    Err(flume::TryRecvError::Empty) => return,
                    Err(flume::TryRecvError::Disconnected) => None,
                }
            };
            self.next_sweep = None;
            // A job that failed (its thread panicked): the sampler builds the sweep at its switch.
            if let Some(built) = built {
                let _ = sampler.install_next_sweep(built);
            }
        }
        let Some(job) = self.feeder.sampler().next_sweep_job() else { return };
        let (tx, rx) = flume::bounded(1);
        let spawned = std::thread::Builder::new().name("mbd-sweep".into()).spawn(move || {
            let _ = tx.send(job.build());
        });
        match spawned {
            Ok(_) => self.next_sweep = Some(rx),
            Err(e) => tracing::debug!(error = %e, "no thread for the next sweep's order; built at the switch"),
        }
    }

    /// Gathers `plan`, loading the chunks it does not hold through the cache (asking for the
    /// `wanted` ones ahead, `cache_wait` counting the time it waits for them); with the chunk
    /// whose load was refused at the memory limit, the bytes sessions held then, and why.
    #[allow(clippy::type_complexity)] // one private caller
    fn gather(
        &mut self,
        plan: &MinibatchPlan,
        wanted: &[u32],
        stop: &AtomicBool,
        cache_wait: &mut Duration,
    ) -> (Result<Gathered, DataError>, Option<(u32, u64, FetchError)>) {
        let mut over_limit = None;
        let mut load = load_through(
            &self.cache,
            (self.id, &self.budgets, &self.runtime.dataset),
            self.runtime.index,
            wanted,
            stop,
            cache_wait,
            &mut over_limit,
        );
        let built = self.feeder.gather(plan, &mut load).map_err(|e| self.runtime.dataset.locate(e));
        drop(load);
        (built, over_limit)
    }

    /// [`Planner::gather`] a chunk at a time ([`Feeder::gather_parts`]): the chunks ready in the
    /// cache first, the others asked for ahead.
    #[allow(clippy::type_complexity)] // one private caller
    fn gather_parts(
        &mut self,
        ahead: &mut PartsAhead,
        stop: &AtomicBool,
        cache_wait: &mut Duration,
    ) -> (Result<(Gathered, Arc<Charged>), DataError>, Option<(u32, u64, FetchError)>) {
        let ds = self.runtime.index;
        let wanted: Vec<u32> = ahead.parts.missing().collect();
        let cache = self.cache.clone();
        let mut over_limit = None;
        let (budgets, runtime) = (self.budgets.clone(), self.runtime.clone());
        let mut load =
            load_through(&cache, (self.id, &budgets, &runtime.dataset), ds, &wanted, stop, cache_wait, &mut over_limit);
        let built = self.feeder.gather_parts(
            &ahead.plans,
            &mut ahead.parts,
            &|c| cache.is_ready(ChunkKey::new(ds, c)),
            &mut load,
        );
        drop(load);
        let built = built.map_err(|e| runtime.dataset.locate(e)).and_then(|gathered| {
            // The copies, and each minibatch's pieces that locate them until it is in its slot.
            let streams = runtime.streams.len();
            let bookkeeping = ahead.plans.iter().map(|p| memory_bound(p.sequences.len() as u64, streams, 1));
            let bytes = ahead
                .parts
                .size_bytes()
                .saturating_add(usize::try_from(bookkeeping.sum::<u64>()).unwrap_or(usize::MAX));
            let count = gathered.len();
            // At most an eighth of the cache's share too: the copies wait for the trainer's
            // slots, and while it holds them they are memory no other session can have.
            let room = PARTS_AHEAD_BYTES.min(usize::try_from(cache.ceiling() / 8).unwrap_or(usize::MAX));
            self.parts_ahead = (room * count.max(1) / bytes.max(1)).clamp(1, PARTS_AHEAD_MAX);
            let charged = Arc::new(cache.charge(bytes as u64));
            self.metrics.minibatches_in_parts.inc_by(count as u64);
            let mut gathered = gathered.into_iter();
            let first = gathered
                .next()
                .ok_or_else(|| DataError::Dataset("no minibatch was gathered a chunk at a time".into()))?;
            for (mb, plan) in gathered.zip(&ahead.plans[1..]) {
                self.gathered_ahead.push_back((mb, plan.samples, charged.clone()));
            }
            Ok((first, charged))
        });
        (built, over_limit)
    }

    /// Waits for the memory other sessions hold, for one slice: in line with the other waiting
    /// sessions, the oldest first — one that is not first lets go of every chunk it holds (its
    /// minibatch's too: it gathers them again when its turn comes), so that sessions waiting on
    /// each other cannot stall for good. Counted in `memory_wait`, and in the session's metrics;
    /// logged every [`MEMORY_WAIT_LOG`]. Whether there is room now.
    fn wait_for_memory(&mut self, stop: &AtomicBool, memory_wait: &mut Duration) -> bool {
        self.cache.queue_for_memory(self.id);
        if !self.cache.first_in_line(self.id) && self.feeder.held_chunks() > 0 {
            self.shed(None);
        }
        let since = Instant::now();
        let room = self.cache.wait_for_memory(self.id, stop, since + MEMORY_WAIT_SLICE);
        self.count_memory_wait(since.elapsed(), memory_wait);
        room
    }

    /// Counts `waited` for memory in `memory_wait` and the session's metrics; logs every
    /// [`MEMORY_WAIT_LOG`] of it.
    fn count_memory_wait(&self, waited: Duration, memory_wait: &mut Duration) {
        self.metrics.memory_wait_seconds.inc_by(waited.as_secs_f64());
        let before = *memory_wait;
        *memory_wait += waited;
        if before.as_secs() / MEMORY_WAIT_LOG.as_secs() != memory_wait.as_secs() / MEMORY_WAIT_LOG.as_secs() {
            tracing::warn!(
                dataset = %self.runtime.name,
                minibatch = self.feeder.next_index(),
                waited_secs = memory_wait.as_secs(),
                "a session still waits for memory that other sessions hold (memory_limit_bytes is short for the sessions open)"
            );
        }
    }

    /// Waits behind the sessions waiting for memory ahead of it: in line, holding nothing, idle
    /// (no thread) until its turn — the cache wakes it when it comes first
    /// ([`SharedCache::leave_line`]); a wake that came meanwhile runs it again.
    fn queue_behind(&mut self, mut p: Pending) -> Found {
        self.cache.queue_for_memory(self.id);
        if self.feeder.held_chunks() > 0 {
            self.shed(None);
        }
        p.behind_since.get_or_insert_with(Instant::now);
        self.pending = Some(p);
        if self.cache.wait_out_turn(self.id, Instant::now() + MEMORY_WAIT_SLICE) {
            return Found::Wait;
        }
        Found::Queued
    }

    /// Counts the chunks let go of since the last minibatch gathered whole into
    /// [`Planner::shed_rate`].
    fn count_shed(&mut self) {
        let shed = self.shed_total - std::mem::replace(&mut self.shed_counted, self.shed_total);
        self.shed_rate = self.shed_rate * 0.875 + f32::from(u16::try_from(shed).unwrap_or(u16::MAX)) * 0.125;
    }

    /// Says once per session that its minibatches are gathered a chunk at a time.
    fn tell_parts(&mut self, chunk: u32, e: &FetchError) {
        if !self.told_parts {
            self.told_parts = true;
            tracing::warn!(
                dataset = %self.runtime.name,
                minibatch = self.feeder.next_index(),
                held_mib = self.feeder.held_bytes().div_ceil(1 << 20),
                chunk,
                "a minibatch's chunks, or the randomization window they come from, do not fit in memory ({e}); such \
                 minibatches of this session are gathered a chunk at a time, which is slower \
                 (minibatchd_session_minibatches_in_parts_total): a smaller randomization window (window_chunks or \
                 window_samples) or a larger memory_limit_bytes avoids it"
            );
        }
    }

    /// Lets go of the chunks held that `plan` does not need ([`Feeder::shed`]), for the sessions
    /// waiting for memory.
    fn shed(&mut self, plan: Option<&MinibatchPlan>) {
        let before = self.feeder.held_chunks();
        self.feeder.shed(plan);
        let shed = before - self.feeder.held_chunks();
        self.shed_total += shed as u64;
        self.cache.shed(shed);
    }

    /// Locates the next minibatch for `slot` (or goes on with the one waiting for memory):
    /// [`Found::End`] at the end of the epoch, [`Found::Wait`] while it waits for memory other
    /// sessions hold — the caller then yields its thread (the sessions that can free that memory
    /// run on the same pool) and calls again.
    fn locate(&mut self, slot: FreeSlot, stop: &AtomicBool) -> Result<Found, ProduceError> {
        if let Some((mb, samples, charged)) = self.gathered_ahead.pop_front() {
            return Ok(Found::Minibatch(Located { slot, mb, samples, charged: Some(charged), mixture: None }));
        }
        let mut p = if let Some(p) = self.pending.take() {
            p
        } else {
            let started = Instant::now();
            self.next_sweep();
            let Some(plan) = self.feeder.plan(self.minibatch_size) else { return Ok(Found::End) };
            // Ask for every chunk of this minibatch first (parsed in parallel by the pool), then
            // for the ones coming next. Offered again before every wait: the request queue is
            // short, so a one-shot prefetch of a minibatch spread over many chunks would leave the
            // parser pool idle but for the chunk being waited for.
            let wanted = self.feeder.missing(&plan, PREFETCH_CHUNKS);
            let ds = self.runtime.index;
            self.cache.prefetch(Some(self.id), wanted.iter().map(|&c| ChunkKey::new(ds, c)));
            Pending {
                slot,
                plan,
                wanted,
                started,
                cache_wait: Duration::ZERO,
                shed: false,
                memory_wait: Duration::ZERO,
                parts: None,
                behind_since: None,
            }
        };
        // Behind other sessions waiting for memory: it waits for its turn without a thread (it
        // is woken when it comes first; gathering now would take nothing but the lookups).
        if p.shed && self.cache.behind(Some(self.id)) {
            return Ok(self.queue_behind(p));
        }
        if let Some(since) = p.behind_since.take() {
            self.count_memory_wait(since.elapsed(), &mut p.memory_wait);
        }
        let built = loop {
            let (built, over_limit) = if let Some(ahead) = &mut p.parts {
                let (built, over_limit) = self.gather_parts(ahead, stop, &mut p.cache_wait);
                (built.map(|(mb, charged)| (mb, Some(charged))), over_limit)
            } else {
                let (built, over_limit) = self.gather(&p.plan, &p.wanted, stop, &mut p.cache_wait);
                (built.map(|mb| (mb, None)), over_limit)
            };
            if stop.load(Ordering::Relaxed) {
                self.cache.leave_line(self.id);
                return Err(ProduceError::Stopped);
            }
            let (Err(_), Some((chunk, held, e))) = (&built, over_limit) else { break built };
            // The chunks sessions hold fill the cache's share of the limit. First let go of what
            // this minibatch does not need, and try again; then, if others hold the rest, wait
            // for them (idle sessions let go of theirs at once), for as long as it takes.
            // Minibatches that let go of chunks they load again, one or more each: the window
            // does not fit the memory the session gets (or its turns at memory are short) —
            // gathered a chunk at a time, each chunk is loaded once for many minibatches.
            let mut too_wide = false;
            if !p.shed {
                p.shed = true;
                self.shed(Some(&p.plan));
                if self.shed_rate < PARTS_SHED_RATE {
                    continue;
                }
                too_wide = p.parts.is_none();
            }
            if matches!(e, FetchError::Behind) {
                return Ok(self.queue_behind(p));
            }
            // Others hold the rest: wait for it — but only for chunks they can let go of, and
            // not past the first in line's patience. The copies charged to the cache (minibatches
            // a session gathered a chunk at a time, waiting for its trainer's slots) go only as
            // that trainer takes them, and chunks may never go while their sessions are idle: a
            // hostile probe stalled six sessions behind one such for as long as its trainer held
            // its slots, and another found a session waiting 5 s for each 24 minibatches beside
            // such copies. Then this minibatch too is gathered a chunk at a time, which needs
            // room for one.
            let others_can_free = self.cache.others_can_free(held, self.feeder.held_bytes() as u64);
            if !too_wide && ((others_can_free && !self.cache.out_of_patience(self.id)) || p.parts.is_some()) {
                // Others hold the rest: wait for it, in line (idle sessions let go of theirs at
                // once; sessions waiting behind the first let go of everything) — a slice at a
                // time, then the thread goes to the pool's other tasks.
                if self.wait_for_memory(stop, &mut p.memory_wait) {
                    continue;
                }
                self.pending = Some(p);
                return Ok(Found::Wait);
            }
            // This minibatch's own chunks do not fit together: gather it a chunk at a time, which
            // holds one chunk and the minibatches' own data at once — with the next few, so that
            // each chunk the cache cannot keep is loaded once for all of them.
            self.tell_parts(chunk, &e);
            let mut plans = vec![p.plan.clone()];
            // Up to an empty plan: the padding after the epoch's end comes one at a time.
            while plans.len() < self.parts_ahead && !plans[plans.len() - 1].sequences.is_empty() {
                self.next_sweep();
                let Some(plan) = self.feeder.plan(self.minibatch_size) else { break };
                plans.push(plan);
            }
            let mut parts = Parts::new(&plans);
            match self.feeder.start_parts(&plans, &mut parts) {
                Ok(shed) => self.cache.shed(shed),
                Err(e) => break Err(e),
            }
            p.parts = Some(PartsAhead { plans, parts });
        };
        if p.shed {
            self.cache.leave_line(self.id);
        }
        if p.parts.is_none() {
            self.count_shed();
        }
        self.metrics.chunk_wait_seconds.inc_by(p.cache_wait.as_secs_f64());
        let (mb, charged) = built?;
        let samples = p.plan.samples;
        let busy = p.started.elapsed().saturating_sub(p.cache_wait).saturating_sub(p.memory_wait);
        self.metrics.delivery_busy_seconds.inc_by(busy.as_secs_f64());
        Ok(Found::Minibatch(Located { slot: p.slot, mb, samples, charged, mixture: None }))
    }
}

impl Locate for Planner {
    fn locate(&mut self, slot: FreeSlot, stop: &AtomicBool) -> Result<Found, ProduceError> {
        Planner::locate(self, slot, stop)
    }

    fn end(&self) -> ProducerEvent {
        ProducerEvent::End { position: self.feeder.position(), minibatches: self.feeder.next_index(), mixture: None }
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

/// The loader a producer gathers through: each chunk from the shared cache (asking for the
/// `wanted` ones not loaded yet ahead of it), its malformed places charged to the session's
/// `budgets`, the time it waits counted in `cache_wait`; a load refused at the memory limit is an
/// error, with the chunk, the bytes held and why in `over_limit`.
fn load_through<'a>(
    cache: &'a SharedCache,
    (by, budgets, dataset): (u64, &'a [ErrorBudget], &'a Dataset),
    ds: u32,
    wanted: &'a [u32],
    stop: &'a AtomicBool,
    cache_wait: &'a mut Duration,
    over_limit: &'a mut Option<(u32, u64, FetchError)>,
) -> impl FnMut(u32) -> Result<Arc<ParsedChunk>, DataError> + 'a {
    let mut loaded: Vec<u32> = Vec::new();
    move |chunk| {
        let asked = Instant::now();
        let ahead = wanted.iter().filter(|&&c| c != chunk && !loaded.contains(&c));
        cache.prefetch(Some(by), ahead.map(|&c| ChunkKey::new(ds, c)));
        let got = cache.get(ChunkKey::new(ds, chunk), stop, by);
        *cache_wait += asked.elapsed();
        loaded.push(chunk);
        if let Ok(c) = &got {
            charge_chunk(budgets, c)?;
        }
        got.map_err(|e| match e {
            FetchError::Failed(e) => dataset.charge_failed_chunk(budgets, chunk as usize, e),
            e @ (FetchError::OverLimit { .. } | FetchError::Behind) => {
                let message = format!("chunk {chunk}: {e}");
                let held = if let FetchError::OverLimit { held, .. } = e { held } else { 0 };
                *over_limit = Some((chunk, held, e));
                DataError::Dataset(message)
            }
            other => DataError::Dataset(format!("chunk {chunk}: {other}")),
        })
    }
}
