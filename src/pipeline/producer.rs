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
//!
//! Metrics, per minibatch: minibatches and nominal samples delivered, the sweep, time blocked on
//! a free slot (the client is slower), time waiting for chunks (the pipeline is slower) and the
//! delivery stage's busy time (sampling, assembling, writing the slot).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::format::chunk::ParsedChunk;
use crate::format::errors::DataError;
use crate::metrics::SessionMetrics;
use crate::minibatch::{gather, ChunkMap, ChunkSource};
use crate::protocol::{ErrorCode, MinibatchMeta};
use crate::sampling::Sampler;
use crate::shm::{LayoutError, MemfdMemory, Ring};

use super::cache::{FetchError, SharedCache};
use super::hub::DatasetRuntime;

/// Chunks a producer asks the pipeline to load ahead of need (bounded further by the request
/// channel's capacity and the cache budget).
pub const PREFETCH_CHUNKS: usize = 8;
/// How often a producer waiting for a free slot checks whether it should stop.
const STOP_POLL: Duration = Duration::from_millis(100);

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
    held: ChunkMap<Arc<ParsedChunk>>,
    cache: &'a SharedCache,
    stop: &'a AtomicBool,
    /// Time spent in the cache (waiting for chunks to be read and parsed).
    waited: Duration,
    /// Chunks this minibatch (then the next ones) needs, in order of first need. Offered to the
    /// pipeline again before every wait: the request queue is short, so a one-shot prefetch of
    /// a minibatch spread over many chunks would leave the parser pool idle but for the chunk
    /// being waited for.
    wanted: Vec<u32>,
}

impl ChunkSource for SessionChunks<'_> {
    fn chunk(&mut self, chunk: u32) -> Result<Arc<ParsedChunk>, DataError> {
        if let Some(c) = self.held.get(&chunk) {
            return Ok(c.clone());
        }
        let started = Instant::now();
        let (ds, held) = (self.dataset, &self.held);
        self.cache.prefetch(self.wanted.iter().filter(|&&c| c != chunk && !held.contains_key(&c)).map(|&c| (ds, c)));
        let got = self.cache.get((self.dataset, chunk), self.stop);
        self.waited += started.elapsed();
        match got {
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
    held: ChunkMap<Arc<ParsedChunk>>,
    metrics: SessionMetrics,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer").field("dataset", &self.runtime.name).field("next_index", &self.next_index).finish_non_exhaustive()
    }
}

impl Producer {
    /// A producer that continues `sampler` (already restored) with minibatch `next_index`,
    /// counting into `metrics`.
    #[must_use]
    #[allow(clippy::too_many_arguments)] // one constructor call site, in `connection::open`
    pub fn new(runtime: Arc<DatasetRuntime>, cache: Arc<SharedCache>, sampler: Sampler, ring: Ring<MemfdMemory>, minibatch_size: usize, frame_mode: bool, next_index: u64, metrics: SessionMetrics) -> Self {
        Self { runtime, cache, sampler, ring, minibatch_size, frame_mode, next_index, held: ChunkMap::default(), metrics }
    }

    /// Fills `slot` with the next minibatch; `Ok(None)` at the end of the epoch.
    ///
    /// # Errors
    /// [`ProduceError`]; the session cannot go on after one.
    pub fn produce(&mut self, slot: FreeSlot, stop: &AtomicBool) -> Result<Option<MinibatchMeta>, ProduceError> {
        let started = Instant::now();
        let Some(plan) = self.sampler.next_minibatch(self.minibatch_size) else { return Ok(None) };
        let ds = self.runtime.index;
        // Ask for every chunk of this minibatch first (parsed in parallel by the pool), then for
        // the ones coming next.
        let mut wanted: Vec<u32> = Vec::new();
        for c in plan.sequences.iter().map(|r| r.chunk).chain(self.sampler.upcoming_chunks(PREFETCH_CHUNKS)) {
            if !self.held.contains_key(&c) && !wanted.contains(&c) {
                wanted.push(c);
            }
        }
        self.cache.prefetch(wanted.iter().map(|&c| (ds, c)));
        let mut source = SessionChunks { dataset: ds, held: std::mem::take(&mut self.held), cache: &self.cache, stop, waited: Duration::ZERO, wanted };
        let built = gather(self.next_index, &plan, self.runtime.dataset.timeline(), &self.runtime.shapes, self.frame_mode, &mut source);
        self.held = source.held;
        let waited = source.waited;
        self.metrics.chunk_wait_seconds.inc_by(waited.as_secs_f64());
        if stop.load(Ordering::Relaxed) {
            return Err(ProduceError::Stopped);
        }
        let mb = built?;
        for c in &plan.retire {
            self.held.remove(c);
        }
        self.ring.write_gathered(slot.slot, slot.generation, &mb, &self.runtime.names)?;
        self.next_index = self.next_index.saturating_add(1);
        let seq_len = &self.runtime.dataset.timeline().seq_len;
        let samples: u64 = plan.sequences.iter().map(|r| seq_len.get(r.seq as usize).map_or(0, |&l| u64::from(l))).sum();
        self.metrics.minibatches.inc();
        self.metrics.samples.inc_by(samples);
        self.metrics.sweep.set(i64::try_from(mb.sweep).unwrap_or(i64::MAX));
        self.metrics.delivery_busy_seconds.inc_by(started.elapsed().saturating_sub(waited).as_secs_f64());
        Ok(Some(MinibatchMeta { index: mb.index, sweep: mb.sweep, end_of_sweep: mb.end_of_sweep, position: mb.position }))
    }

    /// The thread body: fills free slots until the epoch ends, an error, or the connection goes
    /// (its end of `free` is dropped) or sets `stop`.
    pub fn run(mut self, free: &flume::Receiver<FreeSlot>, events: &flume::Sender<ProducerEvent>, stop: &AtomicBool) {
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let waiting = Instant::now();
            let slot = match free.recv_timeout(STOP_POLL) {
                Ok(slot) => slot,
                Err(flume::RecvTimeoutError::Timeout) => {
                    self.metrics.producer_blocked_seconds.inc_by(waiting.elapsed().as_secs_f64());
                    continue;
                }
                Err(flume::RecvTimeoutError::Disconnected) => return,
            };
            self.metrics.producer_blocked_seconds.inc_by(waiting.elapsed().as_secs_f64());
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
