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

use crate::metrics::SessionMetrics;
use minibatchd_client::protocol::{ErrorCode, ErrorDetail, MinibatchMeta};
use minibatchd_engine::feed::Feeder;
use minibatchd_engine::format::errors::DataError;
use minibatchd_engine::minibatch::Gathered;
use minibatchd_engine::sampling::Sampler;
use minibatchd_shm::{LayoutError, Ring};
use minibatchd_sys::MemfdMemory;

use super::chunk_cache::{FetchError, SharedCache};
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
        /// A data error's file, line, byte offset and kind.
        detail: Option<ErrorDetail>,
    },
}

impl ProducerEvent {
    /// The failure event for `e`.
    fn failed(e: &ProduceError) -> Self {
        Self::Failed { code: e.code(), message: e.to_string(), detail: e.detail() }
    }
}

/// What a client's error reply says about a data error: the place and kind the log shows.
#[must_use]
pub fn error_detail(e: &DataError) -> ErrorDetail {
    let place = e.place();
    ErrorDetail {
        file: e.file().map(|f| f.display().to_string()),
        line: place.map(|l| l.line),
        offset: place.map(|l| l.offset),
        kind: e.kind_name().to_owned(),
    }
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

    fn detail(&self) -> Option<ErrorDetail> {
        match self {
            Self::Data(e) => Some(error_detail(e)),
            Self::Stopped | Self::Layout(_) => None,
        }
    }
}

/// One session's producer state: the planner and the ring its filler writes.
pub struct Producer {
    planner: Planner,
    ring: Ring<MemfdMemory>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("dataset", &self.planner.runtime.name)
            .field("next_index", &self.planner.feeder.next_index())
            .finish_non_exhaustive()
    }
}

/// A minibatch located in its chunks, to be copied into `slot` by the filler.
struct Located {
    slot: FreeSlot,
    mb: Gathered,
    /// Nominal samples, for the metrics.
    samples: u64,
}

/// What the planner hands the filler, in minibatch order.
enum Step {
    /// Copy a minibatch into its slot, then announce it.
    Fill(Box<Located>),
    /// Pass an event on once every minibatch before it is announced.
    Event(ProducerEvent),
}

/// The half of a producer that locates minibatches: the engine's [`Feeder`] (the sampler and
/// the session's chunks) over the shared chunk cache.
struct Planner {
    runtime: Arc<DatasetRuntime>,
    cache: Arc<SharedCache>,
    feeder: Feeder,
    minibatch_size: usize,
    metrics: SessionMetrics,
}

impl Producer {
    /// A producer that continues `sampler` (already restored) with minibatch `next_index`,
    /// counting into `metrics`.
    #[must_use]
    #[allow(clippy::too_many_arguments)] // one constructor call site, in `connection::open`
    pub fn new(
        runtime: Arc<DatasetRuntime>,
        cache: Arc<SharedCache>,
        sampler: Sampler,
        ring: Ring<MemfdMemory>,
        minibatch_size: usize,
        frame_mode: bool,
        next_index: u64,
        metrics: SessionMetrics,
    ) -> Self {
        let feeder =
            Feeder::new(sampler, runtime.dataset.timeline().clone(), runtime.shapes.clone(), frame_mode, next_index);
        Self { planner: Planner { runtime, cache, feeder, minibatch_size, metrics }, ring }
    }

    /// The thread body: fills free slots until the epoch ends, an error, or the connection goes
    /// (its end of `free` is dropped) or sets `stop`.
    ///
    /// Two stages, so that locating minibatch k + 1 (sampling, chunk lookups, waiting for chunks)
    /// overlaps copying minibatch k into its slot: this thread plans and locates; a scoped filler
    /// thread owns the ring, copies and announces, in order. Between them a queue of one
    /// minibatch; the ring's free slots bound how far the pair runs ahead of the client.
    pub fn run(self, free: &flume::Receiver<FreeSlot>, events: &flume::Sender<ProducerEvent>, stop: &AtomicBool) {
        let Self { mut planner, ring } = self;
        let filler_runtime = planner.runtime.clone();
        let filler_metrics = planner.metrics.clone();
        let (steps, located) = flume::bounded::<Step>(1);
        std::thread::scope(|scope| {
            let filler = std::thread::Builder::new().name(format!("mbd-fill-{}", filler_runtime.index)).spawn_scoped(
                scope,
                move || {
                    fill(ring, &filler_runtime.names, &filler_metrics, &located, events, stop);
                },
            );
            if let Err(e) = filler {
                let _ = events.send(ProducerEvent::Failed {
                    code: ErrorCode::Internal,
                    message: format!("cannot start the session's filler thread: {e}"),
                    detail: None,
                });
                return;
            }
            planner.run(free, &steps, stop);
            // The filler ends when the queue closes; the scope waits for it.
            drop(steps);
        });
    }
}

impl Planner {
    /// Locates the next minibatch for `slot`; `Ok(None)` at the end of the epoch.
    fn locate(&mut self, slot: FreeSlot, stop: &AtomicBool) -> Result<Option<Located>, ProduceError> {
        let started = Instant::now();
        let Some(plan) = self.feeder.plan(self.minibatch_size) else { return Ok(None) };
        let ds = self.runtime.index;
        // Ask for every chunk of this minibatch first (parsed in parallel by the pool), then for
        // the ones coming next. Offered again before every wait: the request queue is short, so a
        // one-shot prefetch of a minibatch spread over many chunks would leave the parser pool
        // idle but for the chunk being waited for.
        let wanted = self.feeder.missing(&plan, PREFETCH_CHUNKS);
        self.cache.prefetch(wanted.iter().map(|&c| (ds, c)));
        let cache = &self.cache;
        let mut loaded: Vec<u32> = Vec::new();
        let mut cache_wait = Duration::ZERO;
        let built = self.feeder.gather(&plan, &mut |chunk| {
            let asked = Instant::now();
            cache.prefetch(wanted.iter().filter(|&&c| c != chunk && !loaded.contains(&c)).map(|&c| (ds, c)));
            let got = cache.get((ds, chunk), stop);
            cache_wait += asked.elapsed();
            loaded.push(chunk);
            got.map_err(|e| match e {
                FetchError::Failed(e) => e,
                other => DataError::Dataset(format!("chunk {chunk}: {other}")),
            })
        });
        self.metrics.chunk_wait_seconds.inc_by(cache_wait.as_secs_f64());
        if stop.load(Ordering::Relaxed) {
            return Err(ProduceError::Stopped);
        }
        let mb = built?;
        let seq_len = &self.runtime.dataset.timeline().seq_len;
        let samples: u64 =
            plan.sequences.iter().map(|r| seq_len.get(r.seq as usize).map_or(0, |&l| u64::from(l))).sum();
        self.metrics.delivery_busy_seconds.inc_by(started.elapsed().saturating_sub(cache_wait).as_secs_f64());
        Ok(Some(Located { slot, mb, samples }))
    }

    /// Takes free slots and hands located minibatches (then the end, or a failure) to the filler.
    fn run(&mut self, free: &flume::Receiver<FreeSlot>, steps: &flume::Sender<Step>, stop: &AtomicBool) {
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
            let next = match self.locate(slot, stop) {
                Ok(Some(located)) => Step::Fill(Box::new(located)),
                Ok(None) => Step::Event(ProducerEvent::End {
                    position: self.feeder.position(),
                    minibatches: self.feeder.next_index(),
                }),
                Err(ProduceError::Stopped) => return,
                Err(e) => Step::Event(ProducerEvent::failed(&e)),
            };
            let last = matches!(next, Step::Event(_));
            // A failed send: the filler is gone (the connection closed, or a slot failed).
            if steps.send(next).is_err() || last {
                return;
            }
        }
    }
}

/// The filler thread: copies each located minibatch into its slot and announces it, in order.
fn fill(
    mut ring: Ring<MemfdMemory>,
    names: &[String],
    metrics: &SessionMetrics,
    steps: &flume::Receiver<Step>,
    events: &flume::Sender<ProducerEvent>,
    stop: &AtomicBool,
) {
    for step in steps {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let event = match step {
            Step::Fill(job) => {
                let started = Instant::now();
                let Located { slot, mb, samples } = *job;
                match ring.write(slot.slot, slot.generation, &mb, names) {
                    Ok(_) => {
                        metrics.minibatches.inc();
                        metrics.samples.inc_by(samples);
                        metrics.sweep.set(i64::try_from(mb.sweep).unwrap_or(i64::MAX));
                        metrics.delivery_busy_seconds.inc_by(started.elapsed().as_secs_f64());
                        let meta = MinibatchMeta {
                            index: mb.index,
                            sweep: mb.sweep,
                            end_of_sweep: mb.end_of_sweep,
                            position: mb.position,
                        };
                        ProducerEvent::Filled { slot: slot.slot, generation: slot.generation, meta }
                    }
                    Err(e) => ProducerEvent::failed(&ProduceError::from(e)),
                }
            }
            Step::Event(event) => event,
        };
        let last = !matches!(event, ProducerEvent::Filled { .. });
        if events.send(event).is_err() || last {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use minibatchd_engine::format::errors::{ErrorKind, Location, Malformed};

    use super::*;

    fn at(line: u64, offset: u64) -> Location {
        Location { file: Path::new("/data/train.ctf").into(), line, offset }
    }

    #[test]
    fn a_spent_budget_reaches_the_client_with_the_place_and_kind_of_the_last_error() {
        let last = Malformed { kind: ErrorKind::BadNumber, at: at(12, 345), message: "expected a number".into() };
        let e = ProduceError::Data(DataError::TooManyErrors { last, max_errors: 0 });
        let ProducerEvent::Failed { code, message, detail } = ProducerEvent::failed(&e) else {
            panic!("not a failure")
        };
        assert_eq!(code, ErrorCode::DataError);
        assert!(message.contains("/data/train.ctf:12: byte offset 345: expected a number"), "{message}");
        let d = detail.expect("a data error carries its place");
        assert_eq!(
            (d.file.as_deref(), d.line, d.offset, d.kind.as_str()),
            (Some("/data/train.ctf"), Some(12), Some(345), "bad_number")
        );
    }

    #[test]
    fn errors_without_a_place_say_what_they_are() {
        let io = error_detail(&DataError::io(Path::new("/data/gone.ctf"), std::io::ErrorKind::NotFound.into()));
        assert_eq!((io.file.as_deref(), io.line, io.kind.as_str()), (Some("/data/gone.ctf"), None, "io"));
        let fatal = error_detail(&DataError::Fatal { at: at(1, 0), message: "UTF-16 BOM".into() });
        assert_eq!((fatal.line, fatal.offset, fatal.kind.as_str()), (Some(1), Some(0), "fatal"));
        let too_large = ProduceError::Layout(LayoutError::TooLarge { needed_bytes: 10, slot_size_bytes: 4 });
        assert_eq!(too_large.code(), ErrorCode::MinibatchTooLarge);
        assert!(too_large.detail().is_none());
        assert_eq!(ProduceError::Stopped.code(), ErrorCode::ShuttingDown);
    }
}
