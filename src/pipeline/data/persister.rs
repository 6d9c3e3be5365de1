//! The persister: writes the chunks the parser pool parsed to the persisted parsed-chunk cache
//! (`minibatchd_engine::format::parsed_cache`), on one thread of its own at the lowest CPU
//! priority (nice 19), so that the write — a copy of the parsed chunk through the page cache —
//! stays off the path of the first minibatch: on a cold sweep both cores parse, then deliver,
//! and the persister takes what CPU they leave.
//!
//! A parser sends `(dataset, chunk)` as weak references: the persister holds no memory of its
//! own (a chunk evicted from the cache and released by every session before the persister got
//! to it is skipped, and persisted when it is parsed again), and the queue is bounded
//! ([`QUEUE`]; a full queue drops the job the same way). The dataset decides what is written
//! ([`minibatchd_engine::dataset::Dataset::persist_later`]: chunks parsed without a malformed
//! place, once).

use std::sync::Weak;
use std::time::Duration;

use minibatchd_engine::format::chunk::ParsedChunk;

use super::hub::DatasetRuntime;

/// Jobs waiting for the persister at most.
pub const QUEUE: usize = 4096;
/// How often an idle persister checks that the daemon still runs.
const POLL: Duration = Duration::from_millis(500);

/// A parsed chunk to persist.
#[derive(Debug)]
pub struct PersistJob {
    /// Its dataset.
    pub dataset: Weak<DatasetRuntime>,
    /// The chunk as the parser made it.
    pub chunk: Weak<ParsedChunk>,
}

/// The channel to the persister.
#[must_use]
pub fn channel() -> (flume::Sender<PersistJob>, flume::Receiver<PersistJob>) {
    flume::bounded(QUEUE)
}

/// Starts the persister thread (`mbd-persist`); it ends when every sender is gone.
pub fn spawn(jobs: flume::Receiver<PersistJob>) {
    let spawned = std::thread::Builder::new().name("mbd-persist".into()).spawn(move || {
        // This thread only: on Linux a thread id names one thread to setpriority.
        let tid = rustix::thread::gettid();
        if let Err(e) = rustix::process::setpriority_process(Some(tid), 19) {
            tracing::debug!(error = %e, "cannot lower the persister's priority");
        }
        loop {
            match jobs.recv_timeout(POLL) {
                Ok(job) => {
                    if let (Some(rt), Some(chunk)) = (job.dataset.upgrade(), job.chunk.upgrade()) {
                        let _written = rt.dataset.persist_later(&chunk);
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
