//! The persister: background work on parsed chunks, on one thread of its own at the lowest CPU
//! priority (nice 19), so that it stays off the path of the first minibatch: on a cold sweep both
//! cores parse, then deliver, and the persister takes what CPU they leave. Two jobs:
//!
//! * **Persist**: write a chunk the parser pool parsed to the persisted parsed-chunk cache
//!   (`minibatchd_engine::format::parsed_cache`). The dataset decides what is written
//!   ([`minibatchd_engine::dataset::Dataset::persist_later`]: chunks parsed without a malformed
//!   place, once).
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

use std::sync::{Arc, Weak};
use std::time::Duration;

use minibatchd_engine::format::chunk::ParsedChunk;

use super::chunk_cache::{ChunkKey, SharedCache};
use super::hub::DatasetRuntime;

/// Jobs waiting for the persister at most.
pub const QUEUE: usize = 4096;
/// How often an idle persister checks that the daemon still runs.
const POLL: Duration = Duration::from_millis(500);

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
/// sender is gone.
pub fn spawn(jobs: flume::Receiver<PersistJob>, cache: Weak<SharedCache>) {
    let spawned = std::thread::Builder::new().name("mbd-persist".into()).spawn(move || {
        // This thread only: on Linux a thread id names one thread to setpriority.
        let tid = rustix::thread::gettid();
        if let Err(e) = rustix::process::setpriority_process(Some(tid), 19) {
            tracing::debug!(error = %e, "cannot lower the persister's priority");
        }
        loop {
            match jobs.recv_timeout(POLL) {
                Ok(PersistJob::Persist { dataset, chunk }) => {
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
