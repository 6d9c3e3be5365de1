//! The persister: background work on parsed chunks, on one thread of its own at the lowest CPU
//! priority (nice 19), so that it stays off the path of the first minibatch: on a cold sweep both
//! cores parse, then deliver, and the persister takes what CPU they leave. Two jobs:
//!
//! * **Persist**: write a chunk the parser pool parsed to the parsed cache
//!   (`minibatchd_engine::format::parsed_cache`). The dataset decides what is written
//!   ([`minibatchd_engine::dataset::Dataset::persist_later`]: chunks parsed without a malformed
//!   place, once). While any session's producer is at work ([`Demand`]) the writes are paced to a
//!   sixteenth of the time, or a quarter while the chunk cache evicts ([`Writes`]): an entry
//!   serves a later start, and writing it competed with the sessions that wait for data now —
//!   nice 19 was not enough: the persister took a whole core through a cold sweep's delivery,
//!   whose hand-offs between the producer threads and the trainer then shared the other one, and
//!   that phase took twice as long; a quarter of the time still cost a cold sweep a sixth
//!   (`docs/benchmarks.md`, "Persisted while no session waits"). A trainer that computes between minibatches leaves its
//!   producer waiting for free slots, and the entries are written at full speed then; a consumer
//!   that never waits still has them written, more slowly. The chunk cache keeps a chunk until
//!   its write is done ([`super::chunk_cache::SharedCache::written`]): when chunks waiting for
//!   their writes keep the cache from its budget (a dataset larger than the memory limit), the
//!   writes go at full speed, and the sessions that need room wait for them — so one sweep fills
//!   the parsed cache whatever the memory. A job dropped by a full queue lets its chunk go.
//! * **Own**: copy a chunk read back from the parsed cache — its columns the entry's mapped
//!   page-cache pages — into the daemon's own memory and swap the copy into the chunk cache
//!   ([`super::chunk_cache::SharedCache::replace`]), unless the mapping is on huge pages. The
//!   mapping serves the first sweep without a copy or fresh memory to touch; where the kernel
//!   maps the entry with 4 KiB pages, the copy, on huge pages, serves the later sweeps, whose
//!   random reads then miss the TLB less (`docs/benchmarks.md`, "Persisted chunks mapped").
//!
//! The chunk cache sends the persist jobs (as it inserts a chunk parsed from the text) and the
//! own jobs (at a mapped chunk's second
//! use: [`super::chunk_cache::CacheCore::take_to_own`]; its first use is typically the sweep
//! after a restart, which the mapping serves without a copy, and the copy would compete with it),
//! with weak references: the persister holds no memory of its own (the cache keeps a chunk to
//! write until the persister says it is done with it; a copy's chunk that left the cache is
//! skipped), and the queue is bounded ([`QUEUE`]; a dropped job lets its chunk go).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use minibatchd_engine::format::chunk::ParsedChunk;
use minibatchd_sys::HugePages;

use super::catalog::DatasetRuntime;
use super::chunk_cache::{ChunkKey, PersistJob, SharedCache};

/// Jobs waiting for the persister at most.
pub const QUEUE: usize = 4096;
/// How often an idle persister checks that the daemon still runs.
const POLL: Duration = Duration::from_millis(500);
/// How often the persister, with writes waiting for their turn, looks again.
const DEFER_POLL: Duration = Duration::from_millis(10);

/// How many sessions' producers are working now: from the session's `open` (its first chunks
/// being parsed) for as long as it has a free slot to fill (or is filling one, waits for its
/// chunks, or for its fillers), until every slot is leased or its epoch has ended — a trainer may
/// be waiting for data. The persister writes at full speed only once none has worked for
/// [`SETTLE`]: a client that takes minibatches as fast as they come leaves its producer without
/// a free slot for moments at a time, and those moments are not a pause in its demand.
#[derive(Debug)]
pub struct Demand {
    working: AtomicUsize,
    /// When a producer last stopped working, in nanoseconds from `base`.
    last_work: AtomicU64,
    base: Instant,
    /// The count, exported (`minibatchd_sessions_wanting_data`).
    gauge: Option<prometheus::IntGauge>,
}

/// How long no producer must have worked before the persister writes at full speed.
pub const SETTLE: Duration = Duration::from_millis(50);

impl Default for Demand {
    fn default() -> Self {
        Self { working: AtomicUsize::new(0), last_work: AtomicU64::new(0), base: Instant::now(), gauge: None }
    }
}

impl Demand {
    /// A demand whose count `gauge` shows.
    #[must_use]
    pub fn shown_by(gauge: prometheus::IntGauge) -> Self {
        gauge.set(0);
        Self { gauge: Some(gauge), ..Self::default() }
    }

    /// No producer has worked for [`SETTLE`].
    #[must_use]
    pub fn is_idle(&self) -> bool {
        self.is_idle_at(Instant::now())
    }

    /// No producer has worked for [`SETTLE`] before `now`.
    fn is_idle_at(&self, now: Instant) -> bool {
        if self.working.load(Ordering::Acquire) != 0 {
            return false;
        }
        let last = self.base + Duration::from_nanos(self.last_work.load(Ordering::Acquire));
        now.saturating_duration_since(last) >= SETTLE
    }

    /// A producer's mark, counted from now (it starts with free slots).
    #[must_use]
    pub fn working(self: &Arc<Self>) -> DemandMark {
        let mut mark = DemandMark { demand: self.clone(), counted: false };
        mark.set(true);
        mark
    }
}

/// One producer's share of [`Demand`]: counted while it works, until it is dropped.
#[derive(Debug)]
pub struct DemandMark {
    demand: Arc<Demand>,
    counted: bool,
}

impl DemandMark {
    /// Whether the producer is working now (false: every slot is leased, or it has finished).
    pub fn set(&mut self, working: bool) {
        if working != self.counted {
            self.counted = working;
            let demand = &self.demand;
            if working {
                demand.working.fetch_add(1, Ordering::AcqRel);
                if let Some(g) = &demand.gauge {
                    g.inc();
                }
            } else {
                // Before the count falls: a persister that finds it zero finds this time too.
                let since = u64::try_from(demand.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
                demand.last_work.fetch_max(since, Ordering::AcqRel);
                demand.working.fetch_sub(1, Ordering::AcqRel);
                if let Some(g) = &demand.gauge {
                    g.dec();
                }
            }
        }
    }
}

impl Drop for DemandMark {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// At shutdown, once no session is left: has the persister write the parsed chunks still waiting
/// (whose writes the sessions' demand put off), for at most `bound`, so that a restart does not
/// parse them again. Logs what it did; returns (written, left), `None` if the persister did not
/// answer in time (a write of its own still running, or no persister).
pub fn drain(persist: &flume::Sender<PersistJob>, bound: Duration) -> Option<(usize, usize)> {
    let (done, answer) = flume::bounded(1);
    let until = Instant::now() + bound;
    persist.send_timeout(PersistJob::Drain { until, done }, bound).ok()?;
    // A write that started before `until` may end after it.
    let answered = answer.recv_timeout(bound + DRAIN_MARGIN).ok();
    match answered {
        Some((0, 0)) => {}
        Some((written, 0)) => tracing::info!(written, "parsed chunks waiting to be persisted were written at shutdown"),
        Some((written, left)) => tracing::warn!(
            written,
            left,
            bound_secs = bound.as_secs_f64(),
            "parsed chunks still waiting to be persisted when the shutdown's bound passed; they are parsed again \
             after the restart"
        ),
        None => tracing::warn!("the persister did not finish its writes in time at shutdown"),
    }
    answered
}

/// How long past its bound [`drain`] waits for the write that was running at the bound.
const DRAIN_MARGIN: Duration = Duration::from_secs(5);

/// The channel to the persister.
#[must_use]
pub fn channel() -> (flume::Sender<PersistJob>, flume::Receiver<PersistJob>) {
    flume::bounded(QUEUE)
}

/// Starts the persister thread (`mbd-persist`) for the chunks of `cache`; it ends when every
/// sender is gone. Writes are paced by `demand` ([`Writes`]), the time they wait for it counted
/// in `deferred`; copies (`Own`) run as they come, while `huge` is on.
pub fn spawn(
    jobs: flume::Receiver<PersistJob>,
    cache: Weak<SharedCache>,
    demand: Arc<Demand>,
    deferred: prometheus::Counter,
    huge: HugePages,
) {
    let spawned = std::thread::Builder::new().name("mbd-persist".into()).spawn(move || {
        // This thread only: on Linux a thread id names one thread to setpriority.
        let tid = rustix::thread::gettid();
        if let Err(e) = rustix::process::setpriority_process(Some(tid), 19) {
            tracing::debug!(error = %e, "cannot lower the persister's priority");
        }
        let mut writes: Writes<WriteJob> = Writes::new(Instant::now());
        // The persister is done with a job's chunk (written, or let go): the cache may evict it.
        let done = |(_, chunk, key): &WriteJob| {
            if let Some(cache) = cache.upgrade() {
                cache.written(*key, chunk);
            }
        };
        let mut pressure = Pressure::new();
        let mut tick = Instant::now();
        loop {
            let now = Instant::now();
            let idle = demand.is_idle();
            if !writes.is_empty() && !idle {
                deferred.inc_by(now.duration_since(tick).as_secs_f64());
            }
            tick = now;
            writes.retain(|(_, chunk, _)| chunk.strong_count() > 0);
            let mut wrote = false;
            // Chunks waiting for their writes keep the cache from its budget: no pacing then
            // (asked only when it decides: the answer walks the cache under its lock).
            let wanted = !idle && !writes.is_empty() && cache.upgrade().is_some_and(|c| c.writes_wanted());
            if let Some(job) = writes.next(idle || wanted, now) {
                let started = Instant::now();
                let persisted = persist(&job);
                done(&job);
                if persisted.is_some() {
                    let pressed = cache.upgrade().is_some_and(|cache| {
                        let (stats, budget, _) = cache.snapshot();
                        pressure.update(stats.evictions, stats.bytes, budget, Instant::now())
                    });
                    writes.wrote(started.elapsed(), Instant::now(), pressed);
                    wrote = true;
                }
            }
            // After a write, what came meanwhile is taken without waiting.
            let wait = match (wrote, writes.is_empty()) {
                (true, _) => Duration::ZERO,
                (false, true) => POLL,
                (false, false) => DEFER_POLL,
            };
            let job = match jobs.recv_timeout(wait) {
                Ok(job) => Some(job),
                Err(flume::RecvTimeoutError::Timeout) => None,
                Err(flume::RecvTimeoutError::Disconnected) => return,
            };
            match job {
                Some(PersistJob::Persist { dataset, chunk, key }) => {
                    if let Some(dropped) = writes.push((dataset, chunk, key)) {
                        done(&dropped);
                    }
                }
                Some(PersistJob::Drain { until, done: answer }) => {
                    writes.retain(|(_, chunk, _)| chunk.strong_count() > 0);
                    let counts = writes.drain(until, Instant::now, |job| {
                        let persisted = persist(&job) == Some(true);
                        done(&job);
                        persisted
                    });
                    let _ = answer.send(counts);
                }
                Some(PersistJob::Own { key, chunk }) => {
                    if let Some(cache) = cache.upgrade() {
                        let copied =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| own(&cache, key, &chunk, &huge)));
                        if copied.is_err() {
                            tracing::error!(?key, "copying a mapped chunk panicked; it stays mapped");
                        }
                    }
                }
                None => {}
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the persister thread; parsed chunks are not persisted");
    }
}

/// A chunk to write: its dataset, the chunk, its place in the chunk cache.
type WriteJob = (Weak<DatasetRuntime>, Weak<ParsedChunk>, ChunkKey);

/// Writes the chunk of `job` to its dataset's parsed cache unless its dataset or chunk is gone
/// (`None`); whether it was written (false: written already, not to be persisted, or the write
/// panicked — logged: the persister goes on, and the chunk cache lets the chunk go).
fn persist(job: &WriteJob) -> Option<bool> {
    let (dataset, chunk, key) = job;
    let (rt, chunk) = (dataset.upgrade()?, chunk.upgrade()?);
    let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.dataset.persist_later(&chunk)));
    Some(written.unwrap_or_else(|_| {
        tracing::error!(?key, "persisting a parsed chunk panicked; it is served from memory and not persisted");
        false
    }))
}

/// While a producer is at work and the chunk cache is under pressure, a write starts only this
/// many times its predecessor's duration after that one ended: the persister writes at most a
/// quarter of the time.
const BUSY_PAUSE: u32 = 3;
/// The same while no pressure: at most a sixteenth of the time. The chunks waiting to be written
/// stay in memory, so their writes can wait for a pause in the sessions' demand.
const CALM_PAUSE: u32 = 15;
/// Pressure lasts this long after the cache last evicted a chunk.
const PRESSURE_FOR: Duration = Duration::from_secs(30);

/// Whether the chunk cache is under pressure (its chunks leave before they are written): it
/// evicted a chunk less than [`PRESSURE_FOR`] ago, or holds three quarters of its budget.
#[derive(Debug)]
struct Pressure {
    evictions: u64,
    until: Option<Instant>,
}

impl Pressure {
    fn new() -> Self {
        Self { evictions: 0, until: None }
    }

    /// Looks at the cache's eviction count and fill (`bytes` of `budget`) at `now`; whether it is
    /// under pressure.
    fn update(&mut self, evictions: u64, bytes: u64, budget: u64, now: Instant) -> bool {
        if evictions > self.evictions {
            self.evictions = evictions;
            self.until = Some(now + PRESSURE_FOR);
        }
        bytes >= budget / 4 * 3 || self.until.is_some_and(|t| now < t)
    }
}

/// The persister's writes waiting their turn, oldest first, and their pace: at once while no
/// session's producer is at work; while one is, a sixteenth of the time ([`CALM_PAUSE`]), or a
/// quarter ([`BUSY_PAUSE`]) while the chunk cache is under pressure ([`Pressure`]) — little
/// competition for a sweep that waits for data (on a cold sweep both cores parse, then deliver),
/// and progress for a dataset larger than memory that sessions read without a pause, whose chunks
/// would otherwise be evicted before their writes, sweep after sweep. Holds what the persister
/// was handed (weak references); plain and clock-free (`now` is passed in).
struct Writes<J> {
    pending: std::collections::VecDeque<J>,
    /// While a producer is at work, no write starts before this.
    busy_from: Instant,
}

impl<J> Writes<J> {
    fn new(now: Instant) -> Self {
        Self { pending: std::collections::VecDeque::new(), busy_from: now }
    }

    fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Does the waiting writes at once, oldest first, starting none at or after `until` (`now`
    /// tells the time); (how many `write` says it wrote, how many are left).
    fn drain(
        &mut self,
        until: Instant,
        mut now: impl FnMut() -> Instant,
        mut write: impl FnMut(J) -> bool,
    ) -> (usize, usize) {
        let mut written = 0;
        while now() < until {
            let Some(job) = self.pending.pop_front() else { break };
            written += usize::from(write(job));
        }
        (written, self.pending.len())
    }

    /// Queues a write; when [`QUEUE`] are waiting it is dropped (as by a full channel), and
    /// handed back.
    fn push(&mut self, job: J) -> Option<J> {
        if self.pending.len() < QUEUE {
            self.pending.push_back(job);
            None
        } else {
            Some(job)
        }
    }

    /// Keeps the writes `alive` says are still wanted (their chunk still held).
    fn retain(&mut self, alive: impl FnMut(&J) -> bool) {
        self.pending.retain(alive);
    }

    /// The oldest write, if one may start at `now`: no producer at work (`idle`), or the pause
    /// after the last write has passed.
    fn next(&mut self, idle: bool, now: Instant) -> Option<J> {
        if idle || now >= self.busy_from {
            self.pending.pop_front()
        } else {
            None
        }
    }

    /// A write that took `took` ended at `now`, the cache under `pressure` or not.
    fn wrote(&mut self, took: Duration, now: Instant, pressure: bool) {
        self.busy_from = now + took * if pressure { BUSY_PAUSE } else { CALM_PAUSE };
    }
}

/// Copies the mapped chunk `chunk` into the daemon's memory and puts the copy in its place in
/// `cache` (unless the cache let it go meanwhile) — unless the mapping is on huge pages already
/// (the entry in 2 MiB page-cache folios), where the gather reads it as fast as a copy, or huge
/// pages are turned off (`huge`, `huge_pages = false`: a copy on 4 KiB pages would gain nothing). The
/// chunk is held only to take a clone of it (whose columns share the mapping), so that the copy,
/// at nice 19, does not keep it from eviction or count it as held by a session.
fn own(cache: &SharedCache, key: ChunkKey, chunk: &Weak<ParsedChunk>, huge: &HugePages) {
    if !huge.enabled() || !cache.holds(key, chunk) {
        return;
    }
    let Some(snapshot) = chunk.upgrade().map(|c| (*c).clone()) else { return };
    if snapshot.mapping().and_then(|m| m.huge_page_backed()) == Some(true) {
        tracing::trace!(?key, "a mapped chunk on huge pages stays mapped");
        return;
    }
    if !cache.replace(key, chunk, Arc::new(snapshot.into_owned_memory())) {
        tracing::trace!(?key, "a mapped chunk left the cache before its copy was made");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_counts_each_working_producer_once_and_settles() {
        let gauge = prometheus::IntGauge::new("wanting", "test").expect("gauge");
        let demand = Arc::new(Demand::shown_by(gauge.clone()));
        let later = || Instant::now() + SETTLE;
        assert!(demand.is_idle_at(later()));
        let mut a = demand.working();
        let mut b = demand.working();
        a.set(false);
        a.set(false);
        assert!(!demand.is_idle_at(later()), "b works");
        b.set(false);
        assert!(!demand.is_idle(), "none works, but not for long");
        assert!(demand.is_idle_at(later()), "none has worked for a while");
        b.set(true);
        b.set(true);
        assert!(!demand.is_idle_at(later()));
        assert_eq!(gauge.get(), 1, "b, counted once");
        drop(b);
        assert!(demand.is_idle_at(later()), "a dropped mark is not counted");
        a.set(true);
        assert_eq!(gauge.get(), 1);
        drop(a);
        assert!(demand.is_idle_at(later()));
        assert_eq!(gauge.get(), 0);
    }

    #[test]
    fn writes_start_at_once_while_idle_and_a_quarter_or_a_sixteenth_of_the_time_while_producers_work() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut w = Writes::new(t0);
        assert_eq!(w.next(true, t0), None, "nothing queued");
        for job in 1..=5 {
            w.push(job);
        }
        assert_eq!(w.next(true, t0), Some(1), "idle: at once");
        w.wrote(ms(20), t0 + ms(20), true);
        assert_eq!(w.next(true, t0 + ms(20)), Some(2), "idle: the next at once too");
        w.wrote(ms(20), t0 + ms(40), true);
        // Producers at work, the cache under pressure: the next waits three times the last write.
        assert_eq!(w.next(false, t0 + ms(40)), None);
        assert_eq!(w.next(false, t0 + ms(99)), None);
        assert_eq!(w.next(false, t0 + ms(100)), Some(3));
        // No pressure: fifteen times.
        w.wrote(ms(10), t0 + ms(110), false);
        assert_eq!(w.next(false, t0 + ms(259)), None);
        assert_eq!(w.next(false, t0 + ms(260)), Some(4));
        w.wrote(ms(10), t0 + ms(270), false);
        assert_eq!(w.next(false, t0 + ms(300)), None);
        assert_eq!(w.next(true, t0 + ms(271)), Some(5), "idle again: at once");
        assert!(w.is_empty());
    }

    #[test]
    fn pressure_comes_with_an_eviction_or_a_cache_three_quarters_full_and_goes_after_a_while() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut p = Pressure::new();
        assert!(!p.update(0, 0, 1000, t0), "an empty cache that never evicted");
        assert!(!p.update(0, 749, 1000, t0));
        assert!(p.update(0, 750, 1000, t0), "three quarters full");
        assert!(!p.update(0, 100, 1000, t0 + s(1)), "fill alone passes with it");
        assert!(p.update(2, 100, 1000, t0 + s(2)), "evicted since the last look");
        assert!(p.update(2, 100, 1000, t0 + s(1) + PRESSURE_FOR), "for a while after");
        assert!(!p.update(2, 100, 1000, t0 + s(2) + PRESSURE_FOR), "then not, without more evictions");
        assert!(p.update(3, 100, 1000, t0 + s(2) + PRESSURE_FOR), "another eviction");
    }

    #[test]
    fn a_drain_writes_what_waits_until_its_bound() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut w = Writes::new(t0);
        for job in 1..=5 {
            w.push(job);
        }
        // Each write takes 10 ms of a clock that starts at t0; none starts at or after 25 ms.
        let clock = std::cell::Cell::new(t0);
        let mut done = Vec::new();
        let counts = w.drain(
            t0 + ms(25),
            || clock.get(),
            |job| {
                done.push(job);
                clock.set(clock.get() + ms(10));
                job != 2
            },
        );
        assert_eq!(done, [1, 2, 3], "started at 0, 10 and 20 ms");
        assert_eq!(counts, (2, 2), "job 2 was not written (already persisted); two left");
        assert_eq!(w.drain(t0 + ms(1000), || t0, |_| true), (2, 0), "the rest, with time");
        assert_eq!(w.drain(t0 + ms(1000), || t0, |_| true), (0, 0), "nothing left");
    }

    #[test]
    fn writes_of_chunks_let_go_are_dropped_and_the_queue_is_bounded() {
        let mut w = Writes::new(Instant::now());
        let kept = Arc::new(1usize);
        let gone = Arc::new(2usize);
        w.push(Arc::downgrade(&gone));
        w.push(Arc::downgrade(&kept));
        drop(gone);
        w.retain(|c| c.strong_count() > 0);
        let next = w.next(true, Instant::now()).expect("the kept one");
        assert_eq!(next.upgrade().as_deref(), Some(&1));
        assert!(w.is_empty());
        let many: Vec<Arc<usize>> = (0..QUEUE + 10).map(Arc::new).collect();
        for job in &many {
            w.push(Arc::downgrade(job));
        }
        assert_eq!(w.pending.len(), QUEUE);
    }
}
