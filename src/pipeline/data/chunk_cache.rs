//! The chunk cache: parsed chunks shared (`Arc`) by every session on the node, so a chunk is
//! parsed once while any session's window needs it.
//!
//! [`CacheCore`] is the plain logic: entries `Loading | Ready | Failed`, byte accounting against a
//! budget (`memory_limit_bytes` minus the rings), least-recently-used eviction of chunks no
//! session holds. A chunk a session holds (an `Arc` outside the cache, from first use until the
//! sampler retires it) is never evicted; prefetch stops at the budget; a demand load is admitted
//! even over budget when nothing is evictable (otherwise the session could never progress) and is
//! counted in [`CacheStats::over_budget_loads`] — but only below the ceiling: the cache's share of
//! `memory_limit_bytes` before the host-memory guard lowers the budget. Once the chunks sessions
//! hold reach the ceiling, a demand load is refused ([`Lookup::OverLimit`], counted in
//! [`CacheStats::refused_loads`]), so the chunks held never pass the ceiling by more than the
//! chunks being loaded when it was reached. The session that asked then lets go of the chunks it
//! holds beyond its current minibatch's and, if others hold the rest, waits for room
//! ([`SharedCache::wait_for_memory`], bounded): the producers of sessions whose clients are not
//! taking minibatches (every slot leased) let go of theirs when someone waits
//! ([`SharedCache::enlist`]), so idle sessions cannot starve moving ones. A session whose own
//! minibatch's chunks cannot fit together gathers it a chunk at a time (the producer, with
//! [`minibatchd_engine::minibatch::Parts`]): no session fails for memory once admitted.
//!
//! [`SharedCache`] wraps it for threads: session producers look chunks up and block until the
//! cache stage inserts them; misses become [`ChunkRequest`]s on the bounded request channel.
//! The cache is keyed by (dataset, chunk): one logical cache per dataset sharing one budget.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use minibatchd_engine::format::chunk::ParsedChunk;
use minibatchd_engine::format::errors::DataError;

use super::pool::Task;

mod line;
mod logic;

use line::MemoryLine;
use logic::{is, Entry};
pub use logic::{CacheCore, CacheStats, Lookup};

/// Bytes counted against the cache while it lives ([`SharedCache::charge`]).
#[derive(Debug)]
pub struct Charged {
    cache: Arc<SharedCache>,
    bytes: u64,
}

impl Drop for Charged {
    fn drop(&mut self) {
        self.cache.lock().discharge(self.bytes);
        self.cache.arrived.notify_all();
    }
}

/// A chunk of a dataset, as the daemon's caches and stages name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkKey {
    /// The dataset's index in the catalog ([`super::catalog::DatasetRuntime::index`]).
    pub dataset: u32,
    /// The chunk's index in the dataset.
    pub chunk: u32,
}

impl ChunkKey {
    /// Chunk `chunk` of the dataset with catalog index `dataset`.
    #[must_use]
    pub const fn new(dataset: u32, chunk: u32) -> Self {
        Self { dataset, chunk }
    }
}

/// Background work on a parsed chunk, for the persister ([`super::persister`]): what the cache
/// hands it, and the stop's drain ([`super::persister::drain`]).
#[derive(Debug)]
pub enum PersistJob {
    /// Write a chunk as the parser made it to the parsed cache; the chunk cache keeps it
    /// until then ([`SharedCache::written`]).
    Persist {
        /// Its dataset.
        dataset: Weak<super::catalog::DatasetRuntime>,
        /// The chunk.
        chunk: Weak<ParsedChunk>,
        /// Its place in the chunk cache.
        key: ChunkKey,
    },
    /// Copy a chunk mapped from the parsed cache into the daemon's memory, in the cache.
    Own {
        /// Its place in the chunk cache.
        key: ChunkKey,
        /// The mapped chunk.
        chunk: Weak<ParsedChunk>,
    },
    /// The daemon stops: write what waits, at full speed, starting no write after `until`; then
    /// say how many were written and how many were left.
    Drain {
        /// No write starts after this.
        until: Instant,
        /// Gets (written, left).
        done: flume::Sender<(usize, usize)>,
    },
}

/// A request to read and parse a chunk (session → readahead → parser pool).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRequest {
    /// Which chunk.
    pub key: ChunkKey,
}

/// A parsed chunk or why it failed (parser pool → cache stage).
#[derive(Debug)]
pub struct ParsedMsg {
    /// Which chunk.
    pub key: ChunkKey,
    /// The chunk, or why it could not be read or parsed.
    pub result: Result<Arc<ParsedChunk>, DataError>,
    /// The dataset whose parsed cache the chunk goes to (parsed from the text, not read back
    /// from an entry): the cache keeps the chunk from eviction until the persister has written
    /// it ([`SharedCache::written`]).
    pub persist: Option<Weak<super::catalog::DatasetRuntime>>,
}

/// How long a producer waits on a loading chunk before it asks again (a request can be lost when
/// a stage restarts; a duplicate parse is harmless).
pub const REQUEST_RETRY: Duration = Duration::from_secs(10);
/// How long the first in line for memory waits before sessions whose every slot is leased let
/// go of their chunks without their grace ([`SharedCache::head_waited`]).
pub const LINE_PATIENCE: Duration = Duration::from_secs(5);
/// How often a blocked producer wakes to check whether it should stop.
const WAIT_TICK: Duration = Duration::from_millis(50);

/// Why a producer could not get a chunk.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FetchError {
    /// The session is stopping.
    #[error("stopped")]
    Stopped,
    /// Loading the chunk failed: the data error, with its place and kind.
    #[error(transparent)]
    Failed(DataError),
    /// The pipeline's request channel is gone (the daemon is stopping).
    #[error("the readahead stage is gone")]
    Disconnected,
    /// Other sessions wait for memory first ([`Lookup::Behind`]).
    #[error("other sessions wait for memory first")]
    Behind,
    /// Loading the chunk would pass the memory limit ([`Lookup::OverLimit`]).
    #[error("the chunks that sessions hold ({} MiB) fill the chunk cache's share of memory_limit_bytes ({} MiB)", mib(*held), mib(*ceiling))]
    OverLimit {
        /// Parsed bytes held by sessions.
        held: u64,
        /// The ceiling in force.
        ceiling: u64,
    },
}

/// Bytes as MiB, rounded up (for messages).
fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

/// The cache shared by the producers and the cache stage.
#[derive(Debug)]
pub struct SharedCache {
    core: Mutex<CacheCore>,
    arrived: Condvar,
    /// Sessions waiting for memory other sessions hold ([`SharedCache::wait_for_memory`]).
    waiting: std::sync::atomic::AtomicUsize,
    /// The producers waiting for memory, in the order they began: the first goes first
    /// ([`SharedCache::first_in_line`]), then has its turn.
    line: MemoryLine,
    /// The producers, by id ([`SharedCache::enlist`]): their task, and whether they are idle for
    /// want of a free slot. The idle ones are woken when a session starts waiting for memory, so
    /// that they let go of their chunks.
    producers: Mutex<HashMap<u64, (Task, Arc<AtomicBool>)>>,
    requests: flume::Sender<ChunkRequest>,
    /// Where chunks to copy into the daemon's memory go (the persister), if anywhere.
    owner: Option<flume::Sender<PersistJob>>,
}

impl SharedCache {
    /// A cache with `budget` bytes that sends its misses to `requests`.
    #[must_use]
    pub fn new(budget: u64, requests: flume::Sender<ChunkRequest>) -> Self {
        Self {
            core: Mutex::new(CacheCore::new(budget)),
            arrived: Condvar::new(),
            waiting: std::sync::atomic::AtomicUsize::new(0),
            line: MemoryLine::default(),
            producers: Mutex::new(HashMap::new()),
            requests,
            owner: None,
        }
    }

    /// Sends the chunks mapped from the parsed cache that are used a second time to `owner`
    /// (the persister), which copies them into the daemon's memory ([`CacheCore::take_to_own`]).
    #[must_use]
    pub fn with_owner(mut self, owner: flume::Sender<PersistJob>) -> Self {
        self.owner = Some(owner);
        self
    }

    fn lock(&self) -> MutexGuard<'_, CacheCore> {
        // A panic while holding the lock cannot leave the core inconsistent in a way that matters
        // more than stopping the daemon would; keep serving.
        self.core.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a session waits for memory other sessions hold: an idle producer should let go of
    /// its chunks ([`minibatchd_engine::feed::Feeder::shed`]).
    #[must_use]
    pub fn short_of_memory(&self) -> bool {
        // The line, not the waits in progress: a waiting producer yields its thread between
        // slices, and the idle ones that run meanwhile must still see it waiting.
        self.waiting.load(Ordering::SeqCst) > 0 || !self.line.is_empty()
    }

    /// Lists producer `id`, run by `task`, until [`Self::dismiss`]. The flag returned says
    /// whether it is idle (every slot leased): set, it is woken when a session starts waiting for
    /// memory. Set it, then look at [`Self::short_of_memory`]: either the waiting session sees the
    /// flag or the producer sees the session.
    pub fn enlist(&self, id: u64, task: &Task) -> Arc<AtomicBool> {
        let idle = Arc::new(AtomicBool::new(false));
        self.producers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id, (task.clone(), idle.clone()));
        idle
    }

    /// Producer `id` is over: off the list, and out of the line for memory.
    pub fn dismiss(&self, id: u64) {
        self.producers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&id);
        let next = self.line.forget(id);
        self.woken(next);
    }

    /// Counts `bytes` of copies made from chunks (minibatches gathered a chunk at a time) against
    /// the cache's share of the memory limit, as chunks sessions hold are, until the guard
    /// returned is dropped.
    pub fn charge(self: &Arc<Self>, bytes: u64) -> Charged {
        self.lock().charge(bytes);
        Charged { cache: self.clone(), bytes }
    }

    /// A session let go of `chunks` chunks: counts them and wakes the sessions waiting for room.
    pub fn shed(&self, chunks: usize) {
        if chunks > 0 {
            self.lock().stats.shed_chunks += chunks as u64;
            self.arrived.notify_all();
        }
    }

    /// Producer `id` waits for memory (from now, if it was not already waiting): in line, the
    /// oldest first.
    pub fn queue_for_memory(&self, id: u64) {
        self.line.queue(id);
    }

    /// Whether producer `id` is first in line and has waited [`LINE_PATIENCE`] as first: it
    /// stops waiting for what others hold (which may never go while they are idle) and gathers
    /// its minibatch a chunk at a time.
    #[must_use]
    pub fn out_of_patience(&self, id: u64) -> bool {
        self.first_in_line(id) && self.head_waited() >= LINE_PATIENCE
    }

    /// How long the first in line has waited as first (zero when nobody waits): past
    /// [`LINE_PATIENCE`], sessions whose every slot is leased let go of their chunks at once,
    /// without their grace (`producer::Locate::idle`), so that a session never waits long for
    /// others whose trainers keep their rings full.
    #[must_use]
    pub fn head_waited(&self) -> Duration {
        self.line.head_waited()
    }

    /// Producer `id` waits for memory no longer (it got its chunks, or it ended); the one that
    /// comes first in line is woken (those behind it wait without a thread). One that got its
    /// chunks as the first has its turn ([`line::TURN`]).
    pub fn leave_line(&self, id: u64) {
        let next = self.line.leave(id);
        self.woken(next);
    }

    /// Wakes the waiters, and `next`, the new first in line, if any.
    fn woken(&self, next: Option<u64>) {
        self.arrived.notify_all();
        if let Some(next) = next {
            let producers = self.producers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some((task, _)) = producers.get(&next) {
                task.wake();
            }
        }
    }

    /// Whether producer `id` has waited for memory longest of those waiting: the others let go
    /// of every chunk they hold, so that sessions waiting on each other cannot stall for good —
    /// the first in line gets its minibatch's chunks, then the next.
    #[must_use]
    pub fn first_in_line(&self, id: u64) -> bool {
        self.line.first(id)
    }

    /// Whether producer `by` (`None`: the preload, an open's first requests) is to take no memory
    /// ([`CacheCore::lookup_for`], [`MemoryLine::behind`]): else those behind took the room
    /// freed, were refused the next chunk and let go, and none got all of its minibatch's chunks.
    #[must_use]
    pub fn behind(&self, by: Option<u64>) -> bool {
        self.line.behind(by)
    }

    /// Producer `id` takes no more minibatches for now (every slot leased): its turn, if it has
    /// it, goes (kept, the first in line waited it out while its trainer did not read).
    pub fn end_turn(&self, id: u64) {
        if self.line.end_turn(id) {
            self.arrived.notify_all();
        }
    }

    /// Whether `id` is first in line; if so, waits out another's turn (no wake comes), to `until`.
    pub fn wait_out_turn(&self, id: u64, until: Instant) -> bool {
        if !self.line.first(id) {
            return false;
        }
        let mut core = self.lock();
        while self.behind(Some(id)) && Instant::now() < until {
            core = self.arrived.wait_timeout(core, WAIT_TICK).map_or_else(|e| e.into_inner().0, |(g, _)| g);
        }
        true
    }

    /// Waits until producer `id` is first in line and the chunks sessions hold leave room below
    /// the ceiling, `stop` is set or `until` passes; wakes the idle producers first, so that they
    /// let go of theirs. `true` when there is room for it.
    pub fn wait_for_memory(&self, id: u64, stop: &AtomicBool, until: Instant) -> bool {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let idle: Vec<Task> = self
            .producers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .filter(|(_, idle)| idle.load(Ordering::SeqCst))
            .map(|(t, _)| t.clone())
            .collect();
        for t in idle {
            t.wake();
        }
        let mut core = self.lock();
        let room = loop {
            core.evict();
            // Under the cache's lock, the line's (the only order the two are taken in).
            if core.held_bytes() < core.ceiling && !self.behind(Some(id)) {
                break true;
            }
            if stop.load(Ordering::Relaxed) || Instant::now() >= until {
                break false;
            }
            core = self.arrived.wait_timeout(core, WAIT_TICK).map_or_else(|e| e.into_inner().0, |(g, _)| g);
        };
        drop(core);
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        room
    }

    /// Inserts a parsed chunk and wakes the producers waiting for it. A chunk to persist is
    /// handed to the persister and kept from eviction until it is written ([`Self::written`]);
    /// when the persister's queue is full it is not persisted this time, and evictable at once.
    pub fn insert(&self, msg: ParsedMsg) {
        let ParsedMsg { key, result, persist } = msg;
        let job = match (&result, persist, &self.owner) {
            (Ok(chunk), Some(dataset), Some(owner)) => Some((owner, dataset, Arc::downgrade(chunk))),
            _ => None,
        };
        self.lock().insert_with(key, result, job.is_some());
        if let Some((owner, dataset, chunk)) = job {
            if owner.try_send(PersistJob::Persist { dataset, chunk: chunk.clone(), key }).is_err() {
                self.written(key, &chunk);
            }
        }
        self.arrived.notify_all();
    }

    /// The persister is done with `chunk` of `key` ([`CacheCore::written`]): it may be evicted;
    /// the sessions waiting for room are woken.
    pub fn written(&self, key: ChunkKey, chunk: &Weak<ParsedChunk>) {
        self.lock().written(key, chunk);
        self.arrived.notify_all();
    }

    /// Whether chunks waiting for the persister keep the cache from its budget: the persister
    /// should write at once, without pacing.
    #[must_use]
    pub fn writes_wanted(&self) -> bool {
        let core = self.lock();
        core.stats.bytes >= core.budget && core.unwritten_bytes() > 0
    }

    /// [`CacheCore::replace`].
    pub fn replace(&self, key: ChunkKey, old: &Weak<ParsedChunk>, new: Arc<ParsedChunk>) -> bool {
        self.lock().replace(key, old, new)
    }

    /// Whether `key` is parsed and in the cache now (a lookup would not parse it).
    pub fn is_ready(&self, key: ChunkKey) -> bool {
        matches!(self.lock().entries.get(&key), Some(Entry::Ready { .. }))
    }

    /// Whether `key` still holds the chunk `chunk` points to.
    pub fn holds(&self, key: ChunkKey, chunk: &Weak<ParsedChunk>) -> bool {
        matches!(self.lock().entries.get(&key), Some(Entry::Ready { chunk: c, .. }) if is(c, chunk))
    }

    /// Sets the budget and the ceiling under one lock ([`CacheCore::set_ceiling`]).
    pub fn set_budget_and_ceiling(&self, budget: u64, ceiling: u64) {
        let mut core = self.lock();
        core.set_ceiling(ceiling);
        core.set_budget(budget);
    }

    /// The ceiling in force: what the chunks sessions hold may reach.
    #[must_use]
    pub fn ceiling(&self) -> u64 {
        self.lock().ceiling
    }

    /// [`CacheCore::forget_failures`].
    pub fn forget_failures(&self) -> usize {
        self.lock().forget_failures()
    }

    /// [`CacheCore::forget_datasets`] of the datasets in the cache that `live` says are gone
    /// (looked up outside the cache's lock). Found by a probe: the chunks of versions a reload
    /// replaced stayed until evicted — 4,021 chunks, 950 MB, after 40 reloads — and the new
    /// versions' preloads, which never evict, loaded nothing.
    pub fn forget_datasets(&self, live: impl Fn(u32) -> bool) -> usize {
        let cached: std::collections::HashSet<u32> = self.lock().entries.keys().map(|k| k.dataset).collect();
        let dead: std::collections::HashSet<u32> = cached.into_iter().filter(|&i| !live(i)).collect();
        if dead.is_empty() {
            return 0;
        }
        self.lock().forget_datasets(&dead)
    }

    /// The counters.
    #[must_use]
    pub fn stats(&self) -> CacheStats {
        self.lock().stats()
    }

    /// [`SharedCache::charge`] when `bytes` more stay within the budget (nothing is evicted for
    /// them); `None` otherwise. What an index pass keeps of the chunks it parsed is counted so
    /// until the cache takes them.
    pub fn try_charge(self: &Arc<Self>, bytes: u64) -> Option<Charged> {
        let mut core = self.lock();
        if core.stats().bytes.saturating_add(bytes) > core.budget() {
            return None;
        }
        core.charge(bytes);
        drop(core);
        Some(Charged { cache: self.clone(), bytes })
    }

    /// Bytes of copies charged now ([`SharedCache::charge`], [`SharedCache::try_charge`]): held
    /// memory that no session can let go of when another waits.
    #[must_use]
    pub fn charged_bytes(&self) -> u64 {
        self.lock().charged_bytes()
    }

    /// Whether, of the `held` bytes a refused load reported ([`FetchError::OverLimit`]), others
    /// than the session holding `own` of them hold chunks they can let go of: not the copies
    /// charged ([`SharedCache::charged_bytes`]), which go only as their trainers take them
    /// (found by a probe: a session waited 5 s for each 24 minibatches beside such copies).
    #[must_use]
    pub fn others_can_free(&self, held: u64, own: u64) -> bool {
        held.saturating_sub(own).saturating_sub(self.charged_bytes()) > 0
    }

    /// The counters, the budget in force and the evictable bytes, under one lock.
    #[must_use]
    pub fn snapshot(&self) -> (CacheStats, u64, u64) {
        let core = self.lock();
        (core.stats(), core.budget(), core.evictable_bytes())
    }

    /// Asks for `keys` to be loaded ahead of need for producer `by` (`None`: no session's), as
    /// far as the budget and the request channel allow, and not while it is behind sessions
    /// waiting for memory ([`Self::behind`]); never blocks.
    pub fn prefetch(&self, by: Option<u64>, keys: impl IntoIterator<Item = ChunkKey>) {
        if self.behind(by) {
            return;
        }
        for key in keys {
            if !self.lock().begin_prefetch(key, Instant::now()) {
                continue;
            }
            if self.requests.try_send(ChunkRequest { key }).is_err() {
                self.lock().abort(key);
                return;
            }
        }
    }

    fn send(&self, key: ChunkKey, stop: &AtomicBool) -> Result<(), FetchError> {
        let mut req = ChunkRequest { key };
        loop {
            match self.requests.send_timeout(req, WAIT_TICK) {
                Ok(()) => return Ok(()),
                Err(flume::SendTimeoutError::Timeout(r)) => req = r,
                Err(flume::SendTimeoutError::Disconnected(_)) => {
                    self.lock().abort(key);
                    return Err(FetchError::Disconnected);
                }
            }
            if stop.load(Ordering::Relaxed) {
                self.lock().abort(key);
                return Err(FetchError::Stopped);
            }
        }
    }

    /// The chunk `key` for producer `by`, loading it if needed; blocks until it is parsed, it
    /// fails, or `stop` is set — or, while `by` is behind sessions waiting for memory, refuses
    /// what would take memory ([`FetchError::Behind`]).
    ///
    /// # Errors
    /// [`FetchError`].
    pub fn get(&self, key: ChunkKey, stop: &AtomicBool, by: u64) -> Result<Arc<ParsedChunk>, FetchError> {
        self.get_for(key, stop, Some(by))
    }

    /// [`SharedCache::get`] for the preload: not a session's use of the chunk
    /// ([`CacheCore::lookup_for`]).
    ///
    /// # Errors
    /// [`FetchError`].
    pub fn get_for_preload(&self, key: ChunkKey, stop: &AtomicBool) -> Result<Arc<ParsedChunk>, FetchError> {
        self.get_for(key, stop, None)
    }

    fn get_for(&self, key: ChunkKey, stop: &AtomicBool, by: Option<u64>) -> Result<Arc<ParsedChunk>, FetchError> {
        let mut core = self.lock();
        let mut waited = false;
        loop {
            let now = Instant::now();
            // Under the cache's lock, the line's (the only order the two are taken in).
            let behind = self.behind(by);
            match core.lookup_for(key, now, by.is_some(), behind) {
                Lookup::Hit(c) => {
                    core.count_use(waited);
                    let to_own = core.take_to_own();
                    drop(core);
                    if let Some(owner) = &self.owner {
                        for (key, chunk) in to_own {
                            // A full queue drops the job: the chunk is served from its mapping.
                            let _ = owner.try_send(PersistJob::Own { key, chunk });
                        }
                    }
                    return Ok(c);
                }
                Lookup::Failed(m) => return Err(FetchError::Failed(m)),
                Lookup::Behind => return Err(FetchError::Behind),
                Lookup::OverLimit { held, ceiling } => return Err(FetchError::OverLimit { held, ceiling }),
                Lookup::Miss => {
                    waited = true;
                    drop(core);
                    self.send(key, stop)?;
                    core = self.lock();
                }
                Lookup::Pending(since) if now.duration_since(since) > REQUEST_RETRY => {
                    waited = true;
                    core.retried(key, now);
                    drop(core);
                    tracing::warn!(
                        dataset = key.dataset,
                        chunk = key.chunk,
                        "chunk still loading; requesting it again"
                    );
                    self.send(key, stop)?;
                    core = self.lock();
                }
                Lookup::Pending(_) | Lookup::Unsized => {
                    waited = true;
                    if stop.load(Ordering::Relaxed) {
                        return Err(FetchError::Stopped);
                    }
                    core = self.arrived.wait_timeout(core, WAIT_TICK).map_or_else(|e| e.into_inner().0, |(g, _)| g);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minibatchd_engine::format::errors::Location;
    use std::path::Path;

    fn chunk(n: usize) -> Arc<ParsedChunk> {
        use minibatchd_engine::format::chunk::{StreamData, StreamValues, Values};
        Arc::new(ParsedChunk {
            chunk: 0,
            num_sequences: 1,
            malformed: Vec::new(),
            streams: vec![StreamData::new(
                vec![0, 1],
                StreamValues::Dense { dim: n, values: Values::F32(vec![0.0; n].into()) },
            )],
        })
    }

    /// What an index pass keeps is charged only within the budget, and counted until let go.
    #[test]
    fn a_charge_is_taken_only_within_the_budget_and_held_until_dropped() {
        let (tx, _rx) = flume::bounded(4);
        let cache = Arc::new(SharedCache::new(100, tx));
        let first = cache.try_charge(60).expect("60 of 100");
        assert!(cache.try_charge(50).is_none(), "60 + 50 pass 100");
        assert_eq!(cache.stats().bytes, 60);
        // Copies charged: held memory no session can let go of (a waiting session does not
        // wait for it).
        let copies = cache.charge(30);
        assert_eq!((cache.charged_bytes(), cache.stats().bytes), (90, 90));
        drop(first);
        assert_eq!((cache.charged_bytes(), cache.stats().bytes), (30, 30));
        drop(copies);
        assert_eq!((cache.charged_bytes(), cache.stats().bytes), (0, 0));
        assert!(cache.try_charge(100).is_some(), "the whole budget once let go");
    }

    #[test]
    fn a_chunk_is_loaded_once_and_shared() {
        let mut c = CacheCore::new(1 << 20);
        let t = Instant::now();
        assert!(matches!(c.lookup(ChunkKey::new(0, 1), t), Lookup::Miss));
        assert!(
            matches!(c.lookup(ChunkKey::new(0, 1), t), Lookup::Pending(_)),
            "a second session waits, no second load"
        );
        c.insert(ChunkKey::new(0, 1), Ok(chunk(4)));
        let a = match c.lookup(ChunkKey::new(0, 1), t) {
            Lookup::Hit(a) => a,
            other => panic!("{other:?}"),
        };
        let b = match c.lookup(ChunkKey::new(0, 1), t) {
            Lookup::Hit(b) => b,
            other => panic!("{other:?}"),
        };
        assert!(Arc::ptr_eq(&a, &b));
    }

    /// A copy in other memory takes the cached chunk's place only while the cache still holds that
    /// chunk; a session holding the old one keeps it, and the bytes are counted once.
    #[test]
    fn a_copy_replaces_only_the_chunk_it_was_made_from() {
        let mut c = CacheCore::new(1 << 20);
        let t = Instant::now();
        assert!(matches!(c.lookup(ChunkKey::new(0, 1), t), Lookup::Miss));
        let first = chunk(4);
        c.insert(ChunkKey::new(0, 1), Ok(first.clone()));
        let held = match c.lookup(ChunkKey::new(0, 1), t) {
            Lookup::Hit(a) => a,
            other => panic!("{other:?}"),
        };
        let bytes = c.stats().bytes;
        let copy = Arc::new((*first).clone().into_owned_memory());
        let weak = Arc::downgrade(&first);
        let other = chunk(4);
        assert!(!c.replace(ChunkKey::new(0, 2), &weak, copy.clone()), "no such chunk cached");
        assert!(
            !c.replace(ChunkKey::new(0, 1), &Arc::downgrade(&other), copy.clone()),
            "another chunk than the one cached"
        );
        assert!(c.replace(ChunkKey::new(0, 1), &weak, copy.clone()));
        // The session still holds the old one: both are resident, both counted (and held).
        assert_eq!((c.stats().bytes, c.stats().chunks, c.stats().mapped_copies), (2 * bytes, 1, 1));
        assert_eq!(c.held_bytes(), 2 * bytes, "the old one, and the copy (this test holds it too)");
        assert!(Arc::ptr_eq(&held, &first), "the session's chunk is untouched");
        match c.lookup(ChunkKey::new(0, 1), t) {
            Lookup::Hit(now) => assert!(Arc::ptr_eq(&now, &copy)),
            other => panic!("{other:?}"),
        }
        assert!(
            !c.replace(ChunkKey::new(0, 1), &weak, Arc::new((*first).clone().into_owned_memory())),
            "replaced already"
        );
        // Once it is let go, only the copy is counted.
        drop((held, first));
        c.evict();
        assert_eq!(c.stats().bytes, bytes);
    }

    /// A chunk whose values are a mapped file's (as read back from the parsed cache).
    fn mapped_chunk(n: usize) -> Arc<ParsedChunk> {
        use minibatchd_engine::format::chunk::{Column, StreamData, StreamValues, Values};
        use std::io::Write as _;
        let mut f = tempfile::NamedTempFile::new().expect("tempfile");
        #[allow(clippy::cast_precision_loss)] // small integers
        let values: Vec<f32> = (0..n).map(|i| i as f32).collect();
        f.write_all(minibatchd_sys::as_bytes(&values)).expect("write");
        // Mapped under a read lease: through a read-only descriptor, the writer's closed.
        let (_, path) = f.keep().expect("keep");
        let map = minibatchd_sys::FileMapping::map(
            std::fs::File::open(&path).expect("open"),
            n * 4,
            &minibatchd_sys::HugePages::default(),
        )
        .expect("map");
        std::fs::remove_file(&path).expect("unlink");
        let column = Column::mapped(&map, 0, n).expect("in bounds");
        Arc::new(ParsedChunk {
            chunk: 0,
            num_sequences: 1,
            malformed: Vec::new(),
            streams: vec![StreamData::new(vec![0, 1], StreamValues::Dense { dim: n, values: Values::F32(column) })],
        })
    }

    /// A mapped chunk is handed out for copying at its second lookup, once; its first use (the
    /// sweep after a restart) reads the mapping alone.
    #[test]
    fn a_mapped_chunk_is_copied_at_its_second_use_once() {
        let mut c = CacheCore::new(1 << 20);
        let t = Instant::now();
        assert!(matches!(c.lookup(ChunkKey::new(0, 1), t), Lookup::Miss));
        let mapped = mapped_chunk(1024);
        assert!(mapped.is_mapped());
        c.insert(ChunkKey::new(0, 1), Ok(mapped.clone()));
        assert!(matches!(c.lookup_for(ChunkKey::new(0, 1), t, false, false), Lookup::Hit(_)));
        assert!(matches!(c.lookup_for(ChunkKey::new(0, 1), t, false, false), Lookup::Hit(_)));
        assert!(c.take_to_own().is_empty(), "the preload's lookups are no use");
        assert!(matches!(c.lookup(ChunkKey::new(0, 1), t), Lookup::Hit(_)));
        assert!(c.take_to_own().is_empty(), "first use");
        assert!(matches!(c.lookup(ChunkKey::new(0, 1), t), Lookup::Hit(_)));
        let to_own = c.take_to_own();
        assert_eq!(to_own.len(), 1);
        assert_eq!(to_own[0].0, ChunkKey::new(0, 1));
        assert!(Arc::ptr_eq(&to_own[0].1.upgrade().expect("cached"), &mapped));
        assert!(matches!(c.lookup(ChunkKey::new(0, 1), t), Lookup::Hit(_)));
        assert!(c.take_to_own().is_empty(), "handed out once");
        let copy = Arc::new((*mapped).clone().into_owned_memory());
        assert!(!copy.is_mapped());
        assert_eq!(*copy, *mapped);
        assert!(c.replace(ChunkKey::new(0, 1), &to_own[0].1, copy));
    }

    /// Found by a probe: a sequential reader under a tight limit parsed its chunks up to three
    /// times — each prefetch evicted the one before it, needed next, as the least recently used.
    /// Chunks a session used go first; of those loaded ahead and unused, the furthest ahead.
    #[test]
    fn eviction_takes_used_chunks_first_then_the_furthest_ahead_and_prefetch_keeps_what_it_loaded() {
        let size = chunk(1000).size_bytes() as u64;
        let t = Instant::now();
        let mut c = CacheCore::new(3 * size);
        let key = |k| ChunkKey::new(0, k);
        let use_once = |c: &mut CacheCore, k: u32| {
            assert!(matches!(c.lookup(key(k), t), Lookup::Miss));
            c.insert(key(k), Ok(chunk(1000)));
            assert!(matches!(c.lookup(key(k), t), Lookup::Hit(_)));
        };
        use_once(&mut c, 0);
        for k in [1, 2] {
            assert!(c.begin_prefetch(key(k), t));
            c.insert(key(k), Ok(chunk(1000)));
        }
        assert!(!c.begin_prefetch(key(5), t), "unused chunks loaded ahead are no room for more");
        // A demand load: the used chunk goes, not the ones loaded ahead.
        use_once(&mut c, 3);
        let present = |c: &CacheCore| {
            let mut v: Vec<u32> = c.entries.keys().map(|k| k.chunk).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(present(&c), [1, 2, 3]);
        // Another chunk over the budget, none used but 3: 3 goes; then, of the unused, the last.
        c.insert(key(4), Ok(chunk(1000)));
        assert_eq!(present(&c), [1, 2, 4]);
        c.insert(key(5), Ok(chunk(1000)));
        assert_eq!(present(&c), [1, 2, 4], "the furthest ahead went");
    }

    /// Found by a probe: four sessions opened at once on 66 MB chunks under a 256 MiB limit
    /// held 352 MiB of chunks — every session's first loads and the open's prefetches began
    /// before any chunk was there to size them (the prefetches' budget counts loads in flight at
    /// the mean size of the chunks in the cache: none).
    #[test]
    fn before_any_chunk_is_in_the_cache_two_load_at_once_under_a_ceiling() {
        let size = chunk(1000).size_bytes() as u64;
        let t = Instant::now();
        let mut c = CacheCore::new(3 * size);
        c.set_ceiling(3 * size);
        // Nothing in the cache: two loads start, a third (demand or prefetch) waits for one.
        assert!(c.begin_prefetch(ChunkKey::new(0, 0), t));
        assert!(matches!(c.lookup(ChunkKey::new(0, 1), t), Lookup::Miss));
        assert!(!c.begin_prefetch(ChunkKey::new(0, 2), t), "a third chunk of unknown size");
        assert!(matches!(c.lookup(ChunkKey::new(0, 2), t), Lookup::Unsized));
        c.insert(ChunkKey::new(0, 1), Ok(chunk(1000)));
        let held = match c.lookup(ChunkKey::new(0, 1), t) {
            Lookup::Hit(h) => h,
            other => panic!("{other:?}"),
        };
        // Sized now: loads start again.
        assert!(matches!(c.lookup(ChunkKey::new(0, 2), t), Lookup::Miss));
        assert!(matches!(c.lookup(ChunkKey::new(0, 3), t), Lookup::Miss));
        drop(held);
        let mut open = CacheCore::new(u64::MAX);
        for k in 0..4 {
            assert!(matches!(open.lookup(ChunkKey::new(0, k), t), Lookup::Miss), "no ceiling: chunk {k} loads");
        }
    }

    #[test]
    fn demand_loads_stop_at_the_ceiling_once_sessions_hold_it_and_evictable_chunks_make_room() {
        let size = chunk(1000).size_bytes() as u64;
        let mut c = CacheCore::new(2 * size);
        c.set_ceiling(2 * size);
        let t = Instant::now();
        let take = |c: &mut CacheCore, k: u32| {
            assert!(matches!(c.lookup(ChunkKey::new(0, k), t), Lookup::Miss), "chunk {k} is loaded");
            c.insert(ChunkKey::new(0, k), Ok(chunk(1000)));
            match c.lookup(ChunkKey::new(0, k), t) {
                Lookup::Hit(h) => h,
                other => panic!("{other:?}"),
            }
        };
        // A session holds two chunks: the ceiling is reached, a third is refused and not marked
        // loading (nothing was requested).
        let a = take(&mut c, 0);
        let b = take(&mut c, 1);
        match c.lookup(ChunkKey::new(0, 2), t) {
            Lookup::OverLimit { held, ceiling } => assert_eq!((held, ceiling), (2 * size, 2 * size)),
            other => panic!("{other:?}"),
        }
        assert_eq!((c.stats().refused_loads, c.stats().chunks), (1, 2));
        // Chunks already there are still served.
        assert!(matches!(c.lookup(ChunkKey::new(0, 1), t), Lookup::Hit(_)));
        // Once the session lets one go, the chunk is evicted for the load instead.
        drop(a);
        let _c2 = take(&mut c, 2);
        assert_eq!((c.stats().evictions, c.stats().chunks), (1, 2));
        drop(b);
        // The budget below the ceiling (a host short of memory) admits over budget, as before.
        c.set_budget(0);
        let over = c.stats().over_budget_loads;
        let _c3 = take(&mut c, 3);
        assert_eq!(c.stats().over_budget_loads, over + 1);
        assert_eq!(c.stats().refused_loads, 1, "a held chunk below the ceiling does not refuse");
        // Prefetches count the chunks in flight at the mean parsed size: with two chunks parsed
        // and one loading, a budget of three chunks has no room for another.
        // Chunks no session holds do not count: an arriving chunk evicts them.
        let mut p = CacheCore::new(3 * size);
        let mut held = Vec::new();
        for k in 0..2 {
            assert!(p.begin_prefetch(ChunkKey::new(1, k), t));
            p.insert(ChunkKey::new(1, k), Ok(chunk(1000)));
            match p.lookup(ChunkKey::new(1, k), t) {
                Lookup::Hit(h) => held.push(h),
                other => panic!("{other:?}"),
            }
        }
        assert!(p.begin_prefetch(ChunkKey::new(1, 2), t), "room for a third");
        assert!(!p.begin_prefetch(ChunkKey::new(1, 3), t), "the third, in flight, fills the budget");
        p.abort(ChunkKey::new(1, 2));
        assert!(p.begin_prefetch(ChunkKey::new(1, 3), t), "an aborted load frees its place");
        held.pop();
        assert!(p.begin_prefetch(ChunkKey::new(1, 4), t), "a chunk let go makes room: it is evicted when needed");
        // Nothing held: even a ceiling of 0 lets one chunk in (a session must be able to start).
        let mut empty = CacheCore::new(0);
        empty.set_ceiling(0);
        assert!(matches!(empty.lookup(ChunkKey::new(0, 0), t), Lookup::Miss));
    }

    #[test]
    fn eviction_spares_held_chunks_and_prefetch_respects_the_budget() {
        let size = chunk(1000).size_bytes() as u64;
        let mut c = CacheCore::new(2 * size);
        let t = Instant::now();
        for k in 0..2 {
            assert!(c.begin_prefetch(ChunkKey::new(0, k), t));
            c.insert(ChunkKey::new(0, k), Ok(chunk(1000)));
        }
        assert!(!c.begin_prefetch(ChunkKey::new(0, 2), t), "budget full");
        let held = match c.lookup(ChunkKey::new(0, 0), t) {
            Lookup::Hit(h) => h,
            other => panic!("{other:?}"),
        };
        assert!(matches!(c.lookup(ChunkKey::new(0, 2), t), Lookup::Miss), "demand loads are admitted");
        c.insert(ChunkKey::new(0, 2), Ok(chunk(1000)));
        assert_eq!(c.stats().chunks, 2, "chunk 1 (not held) was evicted");
        assert!(matches!(c.lookup(ChunkKey::new(0, 2), t), Lookup::Hit(_)), "its waiter takes it");
        assert!(matches!(c.lookup(ChunkKey::new(0, 0), t), Lookup::Hit(_)));
        assert!(matches!(c.lookup(ChunkKey::new(0, 1), t), Lookup::Miss));
        assert_eq!(c.evictable_bytes(), c.stats().bytes - size, "the held chunk is not evictable");
        drop(held);
        assert_eq!(c.evictable_bytes(), c.stats().bytes);
        c.set_budget(0);
        assert_eq!(c.stats().bytes, 0, "nothing held: everything evictable");
    }

    /// Issue 37: a parsed chunk waiting for the persister is not evicted before it is written,
    /// so one sweep fills the parsed cache whatever the memory limit; meanwhile it counts
    /// against the ceiling like a held chunk, and the persister is told to hurry.
    #[test]
    fn a_chunk_waiting_for_its_write_is_not_evicted_until_written() {
        let size = chunk(1000).size_bytes() as u64;
        let mut c = CacheCore::new(size);
        c.set_ceiling(2 * size);
        let t = Instant::now();
        let first = chunk(1000);
        let weak = Arc::downgrade(&first);
        assert!(matches!(c.lookup(ChunkKey::new(0, 0), t), Lookup::Miss));
        c.insert_with(ChunkKey::new(0, 0), Ok(first), true);
        assert!(matches!(c.lookup(ChunkKey::new(0, 1), t), Lookup::Miss));
        c.insert(ChunkKey::new(0, 1), Ok(chunk(1000)));
        assert_eq!(c.stats().chunks, 2, "over budget, but the unwritten chunk stays");
        assert_eq!(c.unwritten_bytes(), size);
        // Both fill the ceiling (the second held by its session): a third demand load is
        // refused, the unwritten chunk counted as if a session held it.
        let held = match c.lookup(ChunkKey::new(0, 1), t) {
            Lookup::Hit(h) => h,
            other => panic!("{other:?}"),
        };
        assert_eq!(c.evictable_bytes(), 0, "an unwritten chunk cannot be evicted");
        assert!(matches!(c.lookup(ChunkKey::new(0, 2), t), Lookup::OverLimit { .. }));
        drop(held);
        assert_eq!(c.evictable_bytes(), size, "the written one can");
        c.written(ChunkKey::new(0, 0), &Weak::new()); // another chunk's write: nothing changes
        assert_eq!(c.unwritten_bytes(), size);
        c.written(ChunkKey::new(0, 0), &weak);
        assert_eq!(c.unwritten_bytes(), 0);
        assert_eq!(c.stats().chunks, 1, "written: one evicted, down to the budget");
        assert!(matches!(c.lookup(ChunkKey::new(0, 2), t), Lookup::Miss));
    }

    #[test]
    fn a_demanded_chunk_survives_a_zero_budget_until_its_session_takes_it() {
        // Regression: with a budget below one chunk, a demand load was evicted on arrival and the
        // waiting session asked for it again forever.
        let mut c = CacheCore::new(0);
        let t = Instant::now();
        assert!(matches!(c.lookup(ChunkKey::new(0, 1), t), Lookup::Miss));
        c.insert(ChunkKey::new(0, 1), Ok(chunk(10)));
        assert_eq!(c.stats().chunks, 1, "pinned for its waiter");
        let held = match c.lookup(ChunkKey::new(0, 1), t) {
            Lookup::Hit(h) => h,
            other => panic!("{other:?}"),
        };
        drop(held);
        c.set_budget(0);
        assert_eq!(c.stats().chunks, 0, "taken once, then evictable");
        // A prefetch that a session starts waiting for is pinned too; a plain prefetch is not.
        c.set_budget(1 << 20);
        assert!(c.begin_prefetch(ChunkKey::new(0, 2), t) && c.begin_prefetch(ChunkKey::new(0, 3), t));
        assert!(matches!(c.lookup(ChunkKey::new(0, 2), t), Lookup::Pending(_)));
        c.set_budget(0);
        c.insert(ChunkKey::new(0, 2), Ok(chunk(10)));
        c.insert(ChunkKey::new(0, 3), Ok(chunk(10)));
        assert!(matches!(c.lookup(ChunkKey::new(0, 2), t), Lookup::Hit(_)));
        assert!(matches!(c.lookup(ChunkKey::new(0, 3), t), Lookup::Miss), "the unwatched prefetch was evicted");
    }

    #[test]
    fn failures_are_reported_to_every_waiter_with_their_place_and_kind() {
        let (tx, rx) = flume::bounded(4);
        let cache = Arc::new(SharedCache::new(1 << 20, tx));
        let stop = AtomicBool::new(false);
        let c2 = cache.clone();
        let waiter = std::thread::spawn(move || c2.get(ChunkKey::new(1, 2), &AtomicBool::new(false), 0));
        let req = rx.recv_timeout(Duration::from_secs(10)).expect("a request");
        assert_eq!(req.key, ChunkKey::new(1, 2));
        let at = Location { file: Path::new("/data/train.ctf").into(), line: 7, offset: 123 };
        cache.insert(ParsedMsg {
            key: ChunkKey::new(1, 2),
            result: Err(DataError::Fatal { at, message: "bad data".into() }),
            persist: None,
        });
        for got in [waiter.join().expect("joined"), cache.get(ChunkKey::new(1, 2), &stop, 0)] {
            let Err(FetchError::Failed(e)) = &got else { panic!("expected a data error, got {got:?}") };
            let place = e.place().expect("a place");
            assert_eq!((&*place.file, place.line, place.offset), (Path::new("/data/train.ctf"), 7, 123));
            assert_eq!(e.kind_name(), "fatal");
            assert_eq!(e.to_string(), "/data/train.ctf:7: byte offset 123: bad data");
        }
    }

    #[test]
    fn the_chunks_of_a_dataset_version_no_one_holds_are_forgotten() {
        let mut core = CacheCore::new(1 << 20);
        let now = Instant::now();
        for key in [ChunkKey::new(1, 0), ChunkKey::new(1, 1), ChunkKey::new(2, 0)] {
            assert!(matches!(core.lookup(key, now), Lookup::Miss));
            core.insert(key, Ok(chunk(100)));
        }
        assert!(matches!(core.lookup(ChunkKey::new(1, 2), now), Lookup::Miss));
        core.insert(ChunkKey::new(1, 2), Err(DataError::Dataset("unreadable".into())));
        let Lookup::Hit(held) = core.lookup(ChunkKey::new(1, 1), now) else { panic!("cached") };
        let one = core.stats().bytes / 3;
        // Dataset 1 is gone: its chunks that nobody holds go, and its failure; the one a
        // session still reads stays, and so does dataset 2.
        assert_eq!(core.forget_datasets(&[1].into_iter().collect()), 2);
        assert_eq!((core.stats().chunks, core.stats().bytes), (2, 2 * one));
        assert!(matches!(core.lookup(ChunkKey::new(2, 0), now), Lookup::Hit(_)));
        drop(held);
        assert_eq!(core.forget_datasets(&[1].into_iter().collect()), 1);
        assert_eq!((core.stats().chunks, core.stats().bytes), (1, one));
    }

    #[test]
    fn a_failed_chunk_is_read_again_after_its_failure_is_forgotten() {
        let mut core = CacheCore::new(1 << 20);
        let now = Instant::now();
        assert!(matches!(core.lookup(ChunkKey::new(0, 1), now), Lookup::Miss));
        core.insert(ChunkKey::new(0, 1), Err(DataError::Dataset("unreadable".into())));
        assert!(matches!(core.lookup(ChunkKey::new(0, 1), now), Lookup::Failed(_)), "a failure sticks");
        assert_eq!(core.forget_failures(), 1);
        assert!(matches!(core.lookup(ChunkKey::new(0, 1), now), Lookup::Miss), "asked again, it is loaded again");
        // An I/O failure (an object store that did not answer) is told for a while, then the
        // chunk is read again without a reload; bad data sticks (above).
        let key = ChunkKey::new(0, 2);
        assert!(matches!(core.lookup(key, now), Lookup::Miss));
        core.insert(key, Err(DataError::io(Path::new("s3://b/k"), std::io::Error::other("no answer within 2 s"))));
        assert!(matches!(core.lookup(key, Instant::now()), Lookup::Failed(_)), "told at first");
        let later = Instant::now() + std::time::Duration::from_secs(11);
        assert!(matches!(core.lookup(key, later), Lookup::Miss), "read again once the hold is over");
    }

    #[test]
    fn a_stopped_waiter_returns() {
        let (tx, _rx) = flume::bounded(4);
        let cache = SharedCache::new(1 << 20, tx);
        let stop = AtomicBool::new(true);
        assert!(matches!(cache.get(ChunkKey::new(0, 0), &stop, 0), Err(FetchError::Stopped)));
    }

    /// Found by a probe: a load was counted a miss when it started and its use a hit after, so a
    /// cold sweep read as a 50 % hit ratio. A use that waits for the chunk's load (its own, or a
    /// prefetch not done yet) is a miss, one that finds it ready a hit, and a prefetch no use
    /// waited for counts nothing until it is used: `hits / (hits + misses)` is the share of uses
    /// that did not wait.
    #[test]
    fn a_use_that_waits_for_a_load_is_a_miss_and_one_that_finds_it_ready_a_hit() {
        let (tx, rx) = flume::bounded(16);
        let cache = Arc::new(SharedCache::new(1 << 20, tx));
        let stop = AtomicBool::new(false);
        let counts = |c: &SharedCache| {
            let s = c.lock().stats;
            (s.hits, s.misses)
        };
        // A demand load: one miss, no hit for the lookup after it arrived.
        let c2 = cache.clone();
        let user = std::thread::spawn(move || c2.get(ChunkKey::new(0, 0), &AtomicBool::new(false), 0));
        let req = rx.recv_timeout(Duration::from_secs(10)).expect("a request");
        cache.insert(ParsedMsg { key: req.key, result: Ok(chunk(10)), persist: None });
        drop(user.join().expect("joined").expect("the chunk"));
        assert_eq!(counts(&cache), (0, 1));
        // Used again: a hit.
        drop(cache.get(ChunkKey::new(0, 0), &stop, 0).expect("cached"));
        assert_eq!(counts(&cache), (1, 1));
        // A prefetch that arrived before its use: nothing at the prefetch, a hit at the use.
        cache.prefetch(None, [ChunkKey::new(0, 1)]);
        let req = rx.recv_timeout(Duration::from_secs(10)).expect("the prefetch's request");
        cache.insert(ParsedMsg { key: req.key, result: Ok(chunk(10)), persist: None });
        assert_eq!(counts(&cache), (1, 1));
        drop(cache.get(ChunkKey::new(0, 1), &stop, 0).expect("prefetched"));
        assert_eq!(counts(&cache), (2, 1));
    }

    /// A session waiting for memory wakes the idle producers (which let go of their chunks) and
    /// returns once the chunks held leave room below the ceiling; without room it returns false
    /// at its deadline, and at once when stopped.
    #[test]
    fn a_wait_for_memory_wakes_the_idle_producers_and_ends_when_held_chunks_go() {
        let (tx, rx) = flume::bounded(16);
        let cache = Arc::new(SharedCache::new(1 << 20, tx));
        let size = chunk(1000).size_bytes() as u64;
        cache.set_budget_and_ceiling(2 * size, 2 * size);
        let stop = AtomicBool::new(false);
        // Two chunks held by an idle session fill the ceiling.
        let mut held = Vec::new();
        for k in 0..2 {
            let c2 = cache.clone();
            let t = std::thread::spawn(move || c2.get(ChunkKey::new(0, k), &AtomicBool::new(false), 0));
            let req = rx.recv_timeout(Duration::from_secs(10)).expect("a request");
            cache.insert(ParsedMsg { key: req.key, result: Ok(chunk(1000)), persist: None });
            held.push(t.join().expect("joined").expect("the chunk"));
        }
        assert!(!cache.short_of_memory());
        assert!(
            !cache.wait_for_memory(0, &stop, Instant::now() + Duration::from_millis(100)),
            "no room, no one lets go"
        );
        // Stopped: no room, and no wait for the deadline.
        let started = Instant::now();
        assert!(!cache.wait_for_memory(0, &AtomicBool::new(true), started + DEADLINE), "no room while stopped");
        assert!(started.elapsed() < DEADLINE, "a stopped wait returns at once");
        // The idle producer: woken when someone waits, it lets go of its chunks.
        let pool = crate::pipeline::data::pool::Pool::new(1, "test-idle").expect("pool");
        let task = pool.task("idle");
        let (woken_tx, woken_rx) = flume::bounded::<()>(4);
        task.set_work(move || {
            let _ = woken_tx.try_send(());
            crate::pipeline::data::pool::Turn::Idle
        });
        cache.enlist(7, &task).store(true, Ordering::SeqCst);
        let c2 = cache.clone();
        let waiter =
            std::thread::spawn(move || c2.wait_for_memory(0, &AtomicBool::new(false), Instant::now() + DEADLINE));
        woken_rx.recv_timeout(Duration::from_secs(10)).expect("the idle producer was woken");
        assert!(cache.short_of_memory());
        drop(held);
        cache.shed(2);
        assert!(waiter.join().expect("joined"), "room once the chunks were let go");
        assert!(!cache.short_of_memory());
        assert_eq!(cache.lock().stats.shed_chunks, 2);
        cache.dismiss(7);
        assert!(cache.wait_for_memory(0, &AtomicBool::new(true), Instant::now() + DEADLINE), "room now");
    }

    /// Sessions waiting for memory go in line, the longest-waiting first; leaving the line (its
    /// chunks gathered, or its session over) hands the first place on.
    #[test]
    fn waiting_sessions_go_in_line_the_longest_waiting_first() {
        let (tx, _rx) = flume::bounded(1);
        let cache = SharedCache::new(1 << 20, tx);
        assert!(!cache.first_in_line(1), "nobody waits");
        assert_eq!(cache.head_waited(), Duration::ZERO);
        cache.queue_for_memory(3);
        std::thread::sleep(Duration::from_millis(20));
        cache.queue_for_memory(1);
        cache.queue_for_memory(3); // again: keeps its place
        assert!(cache.first_in_line(3) && !cache.first_in_line(1));
        let waited = cache.head_waited();
        assert!(waited >= Duration::from_millis(20), "the first has waited since it came first");
        cache.leave_line(1);
        assert!(cache.head_waited() >= waited, "the first is the same");
        cache.queue_for_memory(1);
        cache.leave_line(3);
        assert!(cache.first_in_line(1));
        assert!(cache.head_waited() < waited, "the next first's wait counts from its turn");
        cache.leave_line(1);
        assert!(!cache.first_in_line(1));
        assert_eq!(cache.head_waited(), Duration::ZERO, "nobody waits");
    }

    /// Behind the first in line, a lookup takes no memory: it starts no load, waits for none and
    /// takes no chunk that no session holds; a chunk another session holds costs nothing.
    #[test]
    fn behind_the_line_a_lookup_takes_no_memory() {
        let mut c = CacheCore::new(1 << 20);
        let (t, key) = (Instant::now(), ChunkKey::new(0, 0));
        assert!(matches!(c.lookup_for(key, t, true, true), Lookup::Behind), "no load");
        assert!(c.begin_prefetch(key, t));
        assert!(matches!(c.lookup_for(key, t, true, true), Lookup::Behind), "no wait for a prefetch");
        c.insert(key, Ok(chunk(100)));
        assert!(matches!(c.lookup_for(key, t, true, true), Lookup::Behind), "no chunk eviction could free");
        let Lookup::Hit(held) = c.lookup(key, t) else { panic!("a session takes it") };
        assert!(matches!(c.lookup_for(key, t, true, true), Lookup::Hit(_)), "a chunk held elsewhere is shared");
        drop(held);
        // A load a session waits for is pinned when it arrives: waiting for it, and taking it,
        // cost nothing more (abandoned, it would stay pinned for REQUEST_RETRY).
        let other = ChunkKey::new(0, 1);
        assert!(matches!(c.lookup(other, t), Lookup::Miss));
        assert!(matches!(c.lookup_for(other, t, true, true), Lookup::Pending(_)), "its own load, waited for");
        c.insert(other, Ok(chunk(100)));
        assert!(matches!(c.lookup_for(other, Instant::now(), true, true), Lookup::Hit(_)), "and taken");
        assert_eq!(c.stats().refused_loads, 3);
    }

    /// While sessions wait for memory, the ones behind the first load nothing (not even ahead)
    /// and get no room; the first's leaving wakes the next, which then loads.
    #[test]
    fn the_first_in_line_gets_the_room_and_its_leaving_wakes_the_next() {
        let (tx, rx) = flume::bounded(16);
        let cache = Arc::new(SharedCache::new(1 << 20, tx));
        let stop = AtomicBool::new(false);
        let key = ChunkKey::new(0, 0);
        cache.queue_for_memory(3);
        cache.queue_for_memory(1);
        assert!(!cache.behind(Some(3)) && cache.behind(Some(1)) && cache.behind(Some(5)) && cache.behind(None));
        assert!(matches!(cache.get(key, &stop, 1), Err(FetchError::Behind)));
        cache.prefetch(Some(1), [ChunkKey::new(0, 1)]);
        cache.prefetch(None, [ChunkKey::new(0, 2)]);
        assert!(rx.is_empty(), "nothing is loaded for those behind");
        assert!(!cache.wait_for_memory(1, &stop, Instant::now() + Duration::from_millis(50)), "no turn, no room");
        assert!(cache.wait_for_memory(3, &stop, Instant::now() + DEADLINE), "room for the first");
        // Producer 1 waits without a thread: the first's leaving wakes it.
        let pool = crate::pipeline::data::pool::Pool::new(1, "test-line").expect("pool");
        let task = pool.task("behind");
        let (woken_tx, woken_rx) = flume::bounded::<()>(4);
        task.set_work(move || {
            let _ = woken_tx.try_send(());
            crate::pipeline::data::pool::Turn::Idle
        });
        let _ = cache.enlist(1, &task);
        cache.leave_line(3);
        woken_rx.recv_timeout(DEADLINE).expect("the next in line was woken");
        assert!(cache.behind(Some(1)) && !cache.behind(Some(3)), "3's turn: 1, first, waits for it to end");
        assert!(cache.wait_out_turn(1, Instant::now() + Duration::from_millis(50)), "1 is first");
        assert!(cache.behind(Some(1)), "a turn lasts a second");
        cache.dismiss(3);
        assert!(!cache.behind(Some(1)), "3 ended, and its turn");
        cache.prefetch(Some(1), [ChunkKey::new(0, 1)]);
        assert_eq!(rx.try_recv().map(|r| r.key), Ok(ChunkKey::new(0, 1)), "its turn: it loads");
        cache.dismiss(1);
        assert!(!cache.behind(None), "nobody waits");
    }

    const DEADLINE: Duration = Duration::from_secs(30);
}
