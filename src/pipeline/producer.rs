//! A session's producer: the plain loop that turns the sampler's plans into minibatches in the
//! session's ring. It runs on its own named thread (started by the delivery stage) because it
//! blocks — on free slots (back-pressure: every slot leased means it waits) and on chunks being
//! parsed.
//!
//! Fed by: free slots from the session's connection (a bounded channel of `slot_count`), parsed
//! chunks from the [`SharedCache`]. Feeds: [`ProducerEvent`]s to the connection (bounded channel
//! of `slot_count + 2`), which announces each filled slot with `ready`.
//!
//! The producer runs ahead of the client by at most the ring's slot count; its sampler position is
//! *not* the session's position (that counts only minibatches taken, see `session`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::format::chunk::ParsedChunk;
use crate::format::errors::DataError;
use crate::minibatch::{assemble, ChunkSource};
use crate::protocol::{ErrorCode, MinibatchMeta};
use crate::sampling::Sampler;
use crate::shm::{LayoutError, MemfdMemory, Ring};

use super::cache::{FetchError, SharedCache};
use super::hub::DatasetRuntime;

/// Chunks a producer asks the pipeline to load ahead of need (bounded further by the request
/// channel's capacity and the cache budget).
pub const PREFETCH_CHUNKS: usize = 8;
/// How often a producer waiting for a free slot checks whether it should stop.
const STOP_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// A slot the producer may fill, with the generation to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeSlot {
    /// Slot index.
    pub slot: u64,
    /// Generation to write.
    pub generation: u64,
}

/// What the producer tells the session's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProducerEvent {
    /// `slot` now holds the minibatch described by `meta`.
    Filled {
        /// The slot.
        slot: u64,
        /// Its generation.
        generation: u64,
        /// The minibatch.
        meta: MinibatchMeta,
    },
    /// The epoch is over: the sampler's position and the next minibatch index at the end.
    End {
        /// Final position.
        position: u64,
        /// Minibatches produced in total (index of the next one).
        minibatches: u64,
    },
    /// The session cannot go on.
    Failed {
        /// Error code for the client.
        code: ErrorCode,
        /// Message.
        message: String,
    },
}

/// Why producing a minibatch failed.
#[derive(Debug, thiserror::Error)]
pub enum ProduceError {
    /// Asked to stop.
    #[error("stopped")]
    Stopped,
    /// Data could not be read or violates the options (frame mode).
    #[error(transparent)]
    Data(#[from] DataError),
    /// The minibatch does not fit a slot (or another layout problem).
    #[error(transparent)]
    Layout(#[from] LayoutError),
}

impl ProduceError {
    fn code(&self) -> ErrorCode {
        match self {
            Self::Stopped => ErrorCode::ShuttingDown,
            Self::Data(_) => ErrorCode::DataError,
            Self::Layout(LayoutError::TooLarge { .. }) => ErrorCode::MinibatchTooLarge,
            Self::Layout(_) => ErrorCode::Internal,
        }
    }
}

/// The chunks one session holds: from first use until the sampler retires them.
struct SessionChunks<'a> {
    dataset: u32,
    held: HashMap<u32, Arc<ParsedChunk>>,
    cache: &'a SharedCache,
    stop: &'a AtomicBool,
}

impl ChunkSource for SessionChunks<'_> {
    fn chunk(&mut self, chunk: u32) -> Result<Arc<ParsedChunk>, DataError> {
        if let Some(c) = self.held.get(&chunk) {
            return Ok(c.clone());
        }
        match self.cache.get((self.dataset, chunk), self.stop) {
            Ok(c) => {
                self.held.insert(chunk, c.clone());
                Ok(c)
            }
            Err(FetchError::Failed(m)) => Err(DataError::Dataset(m)),
            Err(e) => Err(DataError::Dataset(format!("chunk {chunk}: {e}"))),
        }
    }
}

/// One session's producer state.
pub struct Producer {
    runtime: Arc<DatasetRuntime>,
    cache: Arc<SharedCache>,
    sampler: Sampler,
    ring: Ring<MemfdMemory>,
    minibatch_size: usize,
    frame_mode: bool,
    next_index: u64,
    held: HashMap<u32, Arc<ParsedChunk>>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer").field("dataset", &self.runtime.name).field("next_index", &self.next_index).finish_non_exhaustive()
    }
}

impl Producer {
    /// A producer that continues `sampler` (already restored) with minibatch `next_index`.
    #[must_use]
    pub fn new(runtime: Arc<DatasetRuntime>, cache: Arc<SharedCache>, sampler: Sampler, ring: Ring<MemfdMemory>, minibatch_size: usize, frame_mode: bool, next_index: u64) -> Self {
        Self { runtime, cache, sampler, ring, minibatch_size, frame_mode, next_index, held: HashMap::new() }
    }

    /// Fills `slot` with the next minibatch; `Ok(None)` at the end of the epoch.
    ///
    /// # Errors
    /// [`ProduceError`]; the session cannot go on after one.
    pub fn produce(&mut self, slot: FreeSlot, stop: &AtomicBool) -> Result<Option<MinibatchMeta>, ProduceError> {
        let Some(plan) = self.sampler.next_minibatch(self.minibatch_size) else { return Ok(None) };
        let ds = self.runtime.index;
        // Ask for every chunk of this minibatch first (parsed in parallel by the pool), then for
        // the ones coming next.
        let mut now: Vec<u32> = plan.sequences.iter().map(|r| r.chunk).filter(|c| !self.held.contains_key(c)).collect();
        now.dedup();
        self.cache.prefetch(now.iter().map(|&c| (ds, c)));
        self.cache.prefetch(self.sampler.upcoming_chunks(PREFETCH_CHUNKS).into_iter().filter(|c| !self.held.contains_key(c)).map(|c| (ds, c)));
        let mut source = SessionChunks { dataset: ds, held: std::mem::take(&mut self.held), cache: &self.cache, stop };
        let built = assemble(self.next_index, &plan, self.runtime.dataset.timeline(), &self.runtime.dims, self.frame_mode, &mut source);
        self.held = source.held;
        if stop.load(Ordering::Relaxed) {
            return Err(ProduceError::Stopped);
        }
        let mb = built?;
        for c in &plan.retire {
            self.held.remove(c);
        }
        self.ring.write(slot.slot, slot.generation, &mb, &self.runtime.names)?;
        self.next_index = self.next_index.saturating_add(1);
        Ok(Some(MinibatchMeta { index: mb.index, sweep: mb.sweep, end_of_sweep: mb.end_of_sweep, position: mb.position }))
    }

    /// The thread body: fills free slots until the epoch ends, an error, or the connection goes
    /// (its end of `free` is dropped) or sets `stop`.
    pub fn run(mut self, free: &flume::Receiver<FreeSlot>, events: &flume::Sender<ProducerEvent>, stop: &AtomicBool) {
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let slot = match free.recv_timeout(STOP_POLL) {
                Ok(slot) => slot,
                Err(flume::RecvTimeoutError::Timeout) => continue,
                Err(flume::RecvTimeoutError::Disconnected) => return,
            };
            let event = match self.produce(slot, stop) {
                Ok(Some(meta)) => ProducerEvent::Filled { slot: slot.slot, generation: slot.generation, meta },
                Ok(None) => ProducerEvent::End { position: self.sampler.position(), minibatches: self.next_index },
                Err(ProduceError::Stopped) => return,
                Err(e) => ProducerEvent::Failed { code: e.code(), message: e.to_string() },
            };
            let last = !matches!(event, ProducerEvent::Filled { .. });
            if events.send(event).is_err() || last {
                return;
            }
        }
    }
}
