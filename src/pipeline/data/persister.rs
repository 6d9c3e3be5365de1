//! The persister: background work on parsed chunks, on one thread of its own at the lowest CPU
//! priority (nice 19), so that it stays off the path of the first minibatch: on a cold sweep both
//! cores parse, then deliver, and the persister takes what CPU they leave. Two jobs:
//!
//! * **Persist**: write a chunk the parser pool parsed to the persisted parsed-chunk cache
//!   (`minibatchd_engine::format::parsed_cache`). The dataset decides what is written
//!   ([`minibatchd_engine::dataset::Dataset::persist_later`]: chunks parsed without a malformed
//!   place, once). A write waits while any session's producer is working ([`Demand`]): an entry
//!   serves a later start, and writing it competed with the sessions that wait for data now —
//!   nice 19 was not enough: the persister took a whole core through a cold sweep's delivery,
//!   whose hand-offs between the producer threads and the trainer then shared the other one, and
//!   that phase took twice as long (`docs/benchmarks.md`, "Persisted while no session waits"). A
//!   trainer that computes between minibatches leaves its producer waiting for free slots, and the
//!   entries are written then; a consumer that never waits has them written when it stops. A
//!   chunk the cache lets go while its write waits is skipped, as a full queue's.
//! * **Own**: copy a chunk read back from the persisted cache — its columns the entry's mapped
//!   page-cache pages — into the daemon's own memory and swap the copy into the chunk cache
//!   ([`super::chunk_cache::SharedCache::replace`]), unless the mapping is on huge pages. The
//!   mapping serves the first sweep without a copy or fresh memory to touch; where the kernel
//!   maps the entry with 4 KiB pages, the copy, on huge pages, serves the later sweeps, whose
//!   random reads then miss the TLB less (`docs/benchmarks.md`, "Persisted chunks mapped").
//!
//! The parsers send the persist jobs, the chunk cache the own jobs (at a mapped chunk's second
//! use: [`super::chunk_cache::CacheCore::take_to_own`]; its first use is typically the sweep
//! after a restart, which the mapping serves without a copy, and the copy would compete with it),
//! with weak references: the persister holds no memory of its own (a chunk evicted from the cache
//! and released by every session before the persister got to it is skipped), and the queue is
//! bounded ([`QUEUE`]; a full queue drops the job the same way).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use minibatchd_engine::format::chunk::ParsedChunk;

use super::chunk_cache::{ChunkKey, SharedCache};
use super::hub::DatasetRuntime;

/// Jobs waiting for the persister at most.
pub const QUEUE: usize = 4096;
/// How often an idle persister checks that the daemon still runs.
const POLL: Duration = Duration::from_millis(500);
/// How often a write that waits for the sessions' producers looks again.
const DEFER_POLL: Duration = Duration::from_millis(10);

/// How many sessions' producers are working now: they have a free slot to fill (or are filling
/// one, or wait for its chunks), so a trainer may be waiting for data. The persister writes only
/// while none is.
#[derive(Debug, Default)]
pub struct Demand(AtomicUsize);

impl Demand {
    /// No producer is working.
    #[must_use]
    pub fn is_idle(&self) -> bool {
        self.0.load(Ordering::Acquire) == 0
    }

    /// A producer's mark, counted from now (it starts with free slots).
    #[must_use]
    pub fn working(self: &Arc<Self>) -> DemandMark {
        self.0.fetch_add(1, Ordering::AcqRel);
        DemandMark { demand: self.clone(), counted: true }
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
            if working {
                self.demand.0.fetch_add(1, Ordering::AcqRel);
            } else {
                self.demand.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

impl Drop for DemandMark {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// Background work on a parsed chunk.
#[derive(Debug)]
pub enum PersistJob {
    /// Write a chunk as the parser made it to the persisted cache.
    Persist {
        /// Its dataset.
        dataset: Weak<DatasetRuntime>,
        /// The chunk.
        chunk: Weak<ParsedChunk>,
    },
    /// Copy a chunk mapped from the persisted cache into the daemon's memory, in the cache.
    Own {
        /// Its place in the chunk cache.
        key: ChunkKey,
        /// The mapped chunk.
        chunk: Weak<ParsedChunk>,
    },
}

/// The channel to the persister.
#[must_use]
pub fn channel() -> (flume::Sender<PersistJob>, flume::Receiver<PersistJob>) {
    flume::bounded(QUEUE)
}

/// Starts the persister thread (`mbd-persist`) for the chunks of `cache`; it ends when every
/// sender is gone. Writes wait while `demand` is not idle, the time counted in `deferred`.
pub fn spawn(
    jobs: flume::Receiver<PersistJob>,
    cache: Weak<SharedCache>,
    demand: Arc<Demand>,
    deferred: prometheus::Counter,
) {
    let spawned = std::thread::Builder::new().name("mbd-persist".into()).spawn(move || {
        // This thread only: on Linux a thread id names one thread to setpriority.
        let tid = rustix::thread::gettid();
        if let Err(e) = rustix::process::setpriority_process(Some(tid), 19) {
            tracing::debug!(error = %e, "cannot lower the persister's priority");
        }
        loop {
            match jobs.recv_timeout(POLL) {
                Ok(PersistJob::Persist { dataset, chunk }) => {
                    if !wait_for_idle(&demand, &chunk, &deferred) {
                        continue;
                    }
                    if let (Some(rt), Some(chunk)) = (dataset.upgrade(), chunk.upgrade()) {
                        let _written = rt.dataset.persist_later(&chunk);
                    }
                }
                Ok(PersistJob::Own { key, chunk }) => {
                    if let Some(cache) = cache.upgrade() {
                        own(&cache, key, &chunk);
                    }
                }
                Err(flume::RecvTimeoutError::Timeout) => {}
                Err(flume::RecvTimeoutError::Disconnected) => return,
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the persister thread; parsed chunks are not persisted");
    }
}

/// Waits until no producer works (`demand` idle), counting the time in `deferred`; false if the
/// chunk is let go meanwhile (nothing holds it but weak references: it is skipped).
fn wait_for_idle<T>(demand: &Demand, chunk: &Weak<T>, deferred: &prometheus::Counter) -> bool {
    if demand.is_idle() {
        return true;
    }
    let since = Instant::now();
    let alive = loop {
        if chunk.strong_count() == 0 {
            break false;
        }
        if demand.is_idle() {
            break true;
        }
        std::thread::sleep(DEFER_POLL);
    };
    deferred.inc_by(since.elapsed().as_secs_f64());
    alive
}

/// Copies the mapped chunk `chunk` into the daemon's memory and puts the copy in its place in
/// `cache` (unless the cache let it go meanwhile) — unless the mapping is on huge pages already
/// (the entry in 2 MiB page-cache folios), where the gather reads it as fast as a copy, or huge
/// pages are turned off (`huge_pages = false`: a copy on 4 KiB pages would gain nothing). The
/// chunk is held only to take a clone of it (whose columns share the mapping), so that the copy,
/// at nice 19, does not keep it from eviction or count it as held by a session.
fn own(cache: &SharedCache, key: ChunkKey, chunk: &Weak<ParsedChunk>) {
    if !minibatchd_sys::huge::huge_pages() || !cache.holds(key, chunk) {
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
    fn demand_counts_each_working_producer_once() {
        let demand = Arc::new(Demand::default());
        assert!(demand.is_idle());
        let mut a = demand.working();
        let mut b = demand.working();
        a.set(false);
        a.set(false);
        assert!(!demand.is_idle(), "b works");
        b.set(false);
        assert!(demand.is_idle());
        b.set(true);
        b.set(true);
        assert!(!demand.is_idle());
        drop(b);
        assert!(demand.is_idle(), "a dropped mark is not counted");
        a.set(true);
        drop(a);
        assert!(demand.is_idle());
    }

    #[test]
    fn a_write_waits_until_no_producer_works_or_its_chunk_is_gone() {
        let deferred = prometheus::Counter::new("deferred", "deferred").expect("counter");
        let demand = Arc::new(Demand::default());
        let chunk = Arc::new(7u32);
        assert!(wait_for_idle(&demand, &Arc::downgrade(&chunk), &deferred));
        assert!(deferred.get() == 0.0, "no wait while idle");

        let mark = demand.working();
        let released = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(60));
            drop(mark);
        });
        assert!(wait_for_idle(&demand, &Arc::downgrade(&chunk), &deferred));
        released.join().expect("thread");
        assert!(deferred.get() >= 0.05, "waited {} s", deferred.get());

        let _mark = demand.working();
        let weak = Arc::downgrade(&chunk);
        let gone = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            drop(chunk);
        });
        assert!(!wait_for_idle(&demand, &weak, &deferred), "the chunk went while the write waited");
        gone.join().expect("thread");
    }
}
