//! A session's producer: turns the sampler's plans into minibatches in the session's ring. It
//! runs as a planner and [`FILLERS`] fillers, tasks of the delivery stage's [`Pool`], a fixed set
//! of threads shared by every session: a task runs while it has a free slot (back-pressure: every
//! slot leased means it is idle until the client gives one back) and may block on chunks being
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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::metrics::SessionMetrics;
use minibatchd_client::protocol::{ErrorCode, ErrorDetail, MinibatchMeta, MixtureState};
use minibatchd_engine::feed::Feeder;
use minibatchd_engine::format::errors::DataError;
use minibatchd_engine::minibatch::Gathered;
use minibatchd_engine::sampling::Sampler;
use minibatchd_shm::{LayoutError, SharedRing};
use minibatchd_sys::MemfdMemory;

mod filler;
mod planner;

use super::catalog::DatasetRuntime;
use super::chunk_cache::{Charged, SharedCache, LINE_PATIENCE};
use super::persister::DemandMark;
use super::pool::{Pool, Task, Turn};
use filler::{Announcer, Filling, Reorder};
use planner::Planner;

/// Chunks a producer asks the pipeline to load ahead of need (bounded further by the request
/// channel's capacity and the cache budget).
pub const PREFETCH_CHUNKS: usize = 8;

/// What [`Locate::locate`] found.
pub(super) enum Found {
    Minibatch(Located),
    End,
    /// Waiting for memory: yield the thread and call again.
    Wait,
    /// Behind other sessions waiting for memory: idle until woken (the cache wakes a producer
    /// when it comes first in line, [`SharedCache::leave_line`]).
    Queued,
}
/// How long every slot of a session must stay leased before its chunks go to the sessions that
/// wait for memory ([`Locate::idle`]): longer than a trainer's step, shorter than what a trainer
/// busy elsewhere (an evaluation) takes.
const IDLE_SHED_GRACE: Duration = Duration::from_secs(1);

/// Ids of producers, for the cache's list of idle ones.
static NEXT_PRODUCER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

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
        /// A mixture's minibatch: the mixture's state after it.
        mixture: Option<Box<MixtureState>>,
    },
    /// The epoch is over: the sampler's position and the next minibatch index at the end.
    End {
        /// Final position.
        position: u64,
        /// Minibatches produced in total (index of the next one).
        minibatches: u64,
        /// A mixture's state at the end.
        mixture: Option<MixtureState>,
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
        needed_bytes: None,
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
            // The bytes needed, for a client that reopens with a slot that holds them.
            &Self::Layout(LayoutError::TooLarge { needed_bytes, .. }) => Some(ErrorDetail {
                file: None,
                line: None,
                offset: None,
                kind: "slot".into(),
                needed_bytes: Some(needed_bytes),
            }),
            Self::Stopped | Self::Layout(_) => None,
        }
    }
}

/// One session's producer state: the planner and the ring its fillers write.
pub struct Producer {
    planner: Box<dyn Locate>,
    /// The session's dataset or mixture.
    name: String,
    /// Stream names, in tensor order.
    names: Arc<Vec<String>>,
    ring: SharedRing<MemfdMemory>,
    /// Its count in the daemon's demand, handed to the planner when it starts.
    working: Option<DemandMark>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer").field("session_of", &self.name).finish_non_exhaustive()
    }
}

/// A minibatch located in its chunks, to be copied into `slot` by a filler.
pub(super) struct Located {
    pub(super) slot: FreeSlot,
    pub(super) mb: Gathered,
    /// Nominal samples, for the metrics.
    pub(super) samples: u64,
    /// A minibatch gathered a chunk at a time: its copies, counted against the cache until the
    /// last minibatch gathered with it is copied into its slot.
    pub(super) charged: Option<Arc<Charged>>,
    /// A mixture's minibatch: the mixture's state after it (for the session's progress).
    pub(super) mixture: Option<Box<MixtureState>>,
}

/// What plans a session's minibatches for its [`Producer`]: one dataset's sampler ([`Planner`])
/// or a mixture's (`mixing::MixturePlanner`). The planner task calls it; the fillers
/// copy what it located.
pub(super) trait Locate: Send {
    /// Locates the next minibatch for `slot` (or goes on with the one waiting for memory).
    fn locate(&mut self, slot: FreeSlot, stop: &AtomicBool) -> Result<Found, ProduceError>;
    /// The event that ends the epoch.
    fn end(&self) -> ProducerEvent;
    /// The slot of the minibatch waiting for memory, if any.
    fn waiting(&self) -> Option<FreeSlot>;
    /// Lets go of every chunk held (an idle session, when another waits for memory).
    fn shed_all(&mut self);
    /// Since when every slot has been leased.
    fn idle_since(&mut self) -> &mut Option<Instant>;
    /// Every slot is leased: back-pressure from the client, from now on until [`Locate::busy`].
    /// While it lasts, the chunks this session holds are of no use to it: when another session
    /// waits for memory, they go (and are loaded again when the client moves on).
    ///
    /// Only after [`IDLE_SHED_GRACE`]: a ring filled faster than the client empties it is full for
    /// a moment between two minibatches — shedding then made every session under memory pressure
    /// parse its window again for each ring's worth of minibatches (a hostile probe's sessions ran
    /// far slower together than one after another: `docs/daemon.md`, "Memory") — unless the first
    /// in line has waited
    /// [`LINE_PATIENCE`]: a trainer that keeps its ring full, its steps shorter than the grace,
    /// would otherwise keep its window while another session waits for as long as it needs no new
    /// chunk (up to a sweep). An idle producer is woken whenever a session waits for memory, and
    /// looks again.
    fn idle(&mut self) {
        let since = *self.idle_since().get_or_insert_with(Instant::now);
        let cache = self.cache();
        cache.end_turn(self.id());
        if cache.short_of_memory() && (since.elapsed() >= IDLE_SHED_GRACE || cache.head_waited() >= LINE_PATIENCE) {
            self.shed_all();
        }
    }
    /// A slot is free again: the time every slot was leased counts as producer-blocked.
    fn busy(&mut self) {
        if let Some(since) = self.idle_since().take() {
            self.metrics().producer_blocked_seconds.inc_by(since.elapsed().as_secs_f64());
        }
    }
    /// The shared chunk cache.
    fn cache(&self) -> &Arc<SharedCache>;
    /// The producer's id in the cache's lists.
    fn id(&self) -> u64;
    /// The session's metrics.
    fn metrics(&self) -> &SessionMetrics;
}

/// What the planner hands a filler, numbered in minibatch order.
enum Step {
    /// Copy a minibatch into its slot, then announce it.
    Fill(Box<Located>),
    /// Pass an event on once every minibatch before it is announced.
    Event(ProducerEvent),
}

impl Producer {
    /// A producer that continues `sampler` (already restored) with minibatch `next_index`,
    /// counting into `metrics`; with equal steps padded, empty minibatches after the epoch's last
    /// one until minibatch index `pad_to` ([`Feeder::pad_to`]).
    #[must_use]
    #[allow(clippy::too_many_arguments)] // one constructor call site, in `connection::open`
    pub fn new(
        runtime: Arc<DatasetRuntime>,
        cache: Arc<SharedCache>,
        sampler: Sampler,
        ring: SharedRing<MemfdMemory>,
        minibatch_size: usize,
        frame_mode: bool,
        next_index: u64,
        pad_to: Option<u64>,
        metrics: SessionMetrics,
    ) -> Self {
        let mut feeder =
            Feeder::new(sampler, runtime.dataset.timeline().clone(), runtime.shapes.clone(), frame_mode, next_index);
        if let Some(end) = pad_to {
            feeder.pad_to(end);
        }
        let (name, names) = (runtime.name.clone(), Arc::new(runtime.names.clone()));
        let planner = Planner::new(runtime, cache, feeder, minibatch_size, metrics);
        Self { planner: Box::new(planner), name, names, ring, working: None }
    }

    /// A producer of the minibatches `planner` plans (a mixture's: `name`, streams `names`).
    #[must_use]
    pub(super) fn planned(
        planner: Box<dyn Locate>,
        name: String,
        names: Vec<String>,
        ring: SharedRing<MemfdMemory>,
    ) -> Self {
        Self { planner, name, names: Arc::new(names), ring, working: None }
    }

    /// Counted by `working` (taken when the session's `open` began) while it works: from its
    /// start, and whenever it has a free slot, until it ends.
    #[must_use]
    pub fn counted(mut self, working: DemandMark) -> Self {
        self.working = Some(working);
        self
    }

    /// Starts the producer on `pool` as a planner and [`FILLERS`] fillers: it fills the slots of
    /// `free` (every slot of the ring, at first) until the epoch ends, an error, or the
    /// connection stops it or drops the returned handle, announcing each filled slot on `events`.
    ///
    /// The planner locates minibatches (sampling, chunk lookups, waiting for chunks) and hands
    /// them to the fillers in turn, each through a queue of [`TURN_MINIBATCHES`]; a filler copies
    /// its minibatches into their slots (the ring is shared, one writer per slot), and the
    /// [`Announcer`] sends the events in minibatch order. The copy of a minibatch — 256 random
    /// rows out of the parsed chunks — waits on memory most of its time, so two copies on two
    /// cores overlap (measured with a standalone gather: `docs/benchmarks.md`, issue 17's cold
    /// first sweep). The ring's free slots bound how far the producer runs ahead of the client.
    #[must_use]
    pub fn start(
        self,
        pool: &Pool,
        name: &str,
        free: impl IntoIterator<Item = FreeSlot>,
        slot_count: usize,
        events: flume::Sender<ProducerEvent>,
    ) -> ProducerHandle {
        let Self { planner, name: _, names, ring, working } = self;
        let stop = Arc::new(AtomicBool::new(false));
        let (free_tx, free_rx) = flume::bounded(slot_count.max(1));
        for slot in free {
            let _ = free_tx.try_send(slot);
        }
        let queue_full = Arc::new(AtomicBool::new(false));
        let planner_task = pool.task(format!("plan {name}"));
        let ring = Arc::new(ring);
        let announcer = Arc::new(Mutex::new(Announcer {
            order: Reorder::default(),
            events,
            over: false,
            opened: Some(Instant::now()),
            metrics: planner.metrics().clone(),
        }));
        let mut queues = Vec::with_capacity(FILLERS);
        let mut fillers = Vec::with_capacity(FILLERS);
        for k in 0..FILLERS {
            let (steps_tx, steps_rx) = flume::bounded::<(u64, Step)>(TURN_MINIBATCHES);
            let task = pool.task(format!("fill {name} {k}"));
            let mut filling = Filling {
                names: names.clone(),
                metrics: planner.metrics().clone(),
                ring: ring.clone(),
                steps: Some(steps_rx),
                announcer: announcer.clone(),
                planner: planner_task.clone(),
                stop: stop.clone(),
                queue_full: queue_full.clone(),
            };
            task.set_work(move || filling.turn());
            queues.push(steps_tx);
            fillers.push(task);
        }
        let idle = planner.cache().enlist(planner.id(), &planner_task);
        let mut planning = Planning {
            planner,
            working,
            free: free_rx,
            steps: Some(queues),
            next: 0,
            fillers: fillers.clone(),
            stop: stop.clone(),
            queue_full,
            idle,
        };
        planner_task.set_work(move || planning.turn());
        planner_task.wake();
        ProducerHandle { free: Some(free_tx), stop, planner: planner_task, fillers }
    }
}

/// The connection's hold on its session's producer: slots go back through it, and dropping it
/// (or [`ProducerHandle::stop`]) ends the producer.
#[derive(Debug)]
pub struct ProducerHandle {
    free: Option<flume::Sender<FreeSlot>>,
    stop: Arc<AtomicBool>,
    planner: Task,
    fillers: Vec<Task>,
}

impl ProducerHandle {
    /// Gives a slot back to be filled.
    pub fn give(&self, slot: FreeSlot) {
        if let Some(free) = &self.free {
            // Capacity = slot count, so this never finds the channel full.
            let _ = free.try_send(slot);
        }
        self.planner.wake();
    }

    /// Stops producing (the slots being filled are abandoned; the ring goes with the session).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.planner.wake();
        for filler in &self.fillers {
            filler.wake();
        }
    }

    /// The stop flag and the tasks, for the delivery stage to stop at shutdown.
    #[must_use]
    pub fn stopper(&self) -> Stopper {
        let tasks = std::iter::once(self.planner.clone()).chain(self.fillers.iter().cloned()).collect();
        Stopper { stop: self.stop.clone(), tasks }
    }
}

impl Drop for ProducerHandle {
    fn drop(&mut self) {
        // Close the slot channel first, then wake: the planner's next turn sees it closed.
        self.free = None;
        self.stop();
    }
}

/// What the delivery stage keeps of a producer: enough to stop it and see that it ended.
#[derive(Debug, Clone)]
pub struct Stopper {
    stop: Arc<AtomicBool>,
    tasks: Vec<Task>,
}

impl Stopper {
    /// Stops the producer.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in &self.tasks {
            t.wake();
        }
    }

    /// All of its tasks are over.
    #[must_use]
    pub fn is_done(&self) -> bool {
        self.tasks.iter().all(Task::is_done)
    }
}

/// Minibatches a task handles in one turn before it lets other sessions' tasks run; also the
/// capacity of the queue from planner to each filler, so that each turn of one hands the other a
/// turn's worth of work: a queue of one made every minibatch a wake-up and a context switch
/// between the two (the A/B of a queue of one against four is in `docs/benchmarks.md`).
const TURN_MINIBATCHES: usize = 4;

/// Most minibatches of a session gathered and not yet in their slots, with a ring of `slots`:
/// each holds a free slot — one the planner gathers, and as many as the fillers' queues and the
/// fillers hold. (Minibatches gathered a chunk at a time, waiting for their slots, are counted
/// against the chunk cache as they are gathered.)
#[must_use]
pub fn minibatches_in_flight(slots: u64) -> u64 {
    slots.min((FILLERS * (TURN_MINIBATCHES + 1) + 1) as u64)
}

/// Fillers per producer: minibatch `k` is copied by filler `k % FILLERS`.
pub const FILLERS: usize = 2;

/// The planner task: takes free slots and hands located minibatches (then the end, or a failure)
/// to the fillers, numbered, in turn.
struct Planning {
    planner: Box<dyn Locate>,
    /// Counted in the daemon's demand while this producer works, until the task ends (its closure,
    /// and this with it, is dropped at `Turn::Done`).
    working: Option<DemandMark>,
    free: flume::Receiver<FreeSlot>,
    /// One queue per filler; `None` once the planner is finished (closing them ends the fillers).
    steps: Option<Vec<flume::Sender<(u64, Step)>>>,
    /// The number of the next step (minibatch, end or failure).
    next: u64,
    fillers: Vec<Task>,
    stop: Arc<AtomicBool>,
    /// Set while the planner is idle because the next filler's queue is full.
    queue_full: Arc<AtomicBool>,
    /// Set while every slot is leased ([`SharedCache::enlist`]).
    idle: Arc<AtomicBool>,
}

impl Planning {
    fn turn(&mut self) -> Turn {
        for _ in 0..TURN_MINIBATCHES {
            let Some(steps) = &self.steps else { return Turn::Done };
            let k = usize::try_from(self.next % steps.len() as u64).unwrap_or(0);
            let to = &steps[k];
            if self.stop.load(Ordering::Relaxed) || to.is_disconnected() {
                return self.finish();
            }
            if to.is_full() {
                // Say so before looking again: a filler wakes the planner only when it finds the
                // flag, and either it sees the flag or the planner sees the room.
                self.queue_full.store(true, Ordering::SeqCst);
                if to.is_full() {
                    return Turn::Idle;
                }
                self.queue_full.store(false, Ordering::SeqCst);
            }
            // A minibatch waiting for memory has its slot already.
            let waiting = self.planner.waiting();
            let slot = match waiting.map_or_else(|| self.free.try_recv(), Ok) {
                Ok(slot) => slot,
                Err(flume::TryRecvError::Empty) => {
                    // Every slot is leased: back-pressure from the client. While it lasts, the
                    // chunks this session holds are of no use to it: when another session waits
                    // for memory, they go (and are loaded again when the client moves on).
                    self.planner.idle();
                    set_working(&mut self.working, false);
                    self.idle.store(true, Ordering::SeqCst);
                    return Turn::Idle;
                }
                Err(flume::TryRecvError::Disconnected) => return self.finish(),
            };
            self.idle.store(false, Ordering::Relaxed);
            set_working(&mut self.working, true);
            self.planner.busy();
            let next = match self.planner.locate(slot, &self.stop) {
                Ok(Found::Minibatch(located)) => Step::Fill(Box::new(located)),
                // Waiting for memory that tasks of this pool may free: let them run.
                Ok(Found::Wait) => return Turn::Again,
                Ok(Found::Queued) => {
                    set_working(&mut self.working, false);
                    return Turn::Idle;
                }
                Ok(Found::End) => Step::Event(self.planner.end()),
                Err(ProduceError::Stopped) => return self.finish(),
                Err(e) => Step::Event(ProducerEvent::failed(&e)),
            };
            let last = matches!(next, Step::Event(_));
            // Not full (checked above, and only this task sends); an error: the filler is gone.
            let sent = to.try_send((self.next, next)).is_ok();
            self.next += 1;
            self.fillers[k].wake();
            if !sent || last {
                return self.finish();
            }
        }
        Turn::Again
    }

    /// Closes the queues to the fillers (each ends once it has handled what is queued).
    fn finish(&mut self) -> Turn {
        self.steps = None;
        for filler in &self.fillers {
            filler.wake();
        }
        Turn::Done
    }
}

impl Drop for Planning {
    fn drop(&mut self) {
        // However the task ends (its work done, stopped, or a panic the pool caught): out of the
        // cache's lists, so that no session waits behind it for good.
        self.planner.cache().dismiss(self.planner.id());
    }
}

/// Counts the producer of `mark` as working or not (no mark: not counted anywhere).
fn set_working(mark: &mut Option<DemandMark>, working: bool) {
    if let Some(mark) = mark {
        mark.set(working);
    }
}

/// A new producer's id, for the cache's lists of idle and waiting producers.
pub(super) fn next_producer_id() -> u64 {
    NEXT_PRODUCER.fetch_add(1, Ordering::Relaxed)
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
        let e = ProduceError::Data(DataError::TooManyErrors { last: Box::new(last), max_errors: 0, tolerated: None });
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
        let d = too_large.detail().expect("the bytes needed");
        assert_eq!((d.kind.as_str(), d.needed_bytes, d.file), ("slot", Some(10), None));
        assert_eq!(ProduceError::Stopped.code(), ErrorCode::ShuttingDown);
    }
}
