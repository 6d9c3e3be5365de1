//! The data-plane stages as thin actors around bounded flume channels:
//!
//! ```text
//! producers ──requests──► ChunkReader ──to_parse──► ParserPool (SyncArbiter) ──parsed──► CacheStage
//!   (misses, prefetch)     (readahead)               (Dataset::load_chunk)               (SharedCache)
//! ```
//! Every channel is bounded (capacities from `[daemon]`, see [`super::Channels`]); a full
//! channel blocks its sender, which is the back-pressure. The channels belong to the supervisor,
//! so a restarted stage picks up where the stopped one left off. A stage that hits a fault it
//! cannot handle logs it and stops itself (never panics); the supervisor restarts it.
//!
//! Metrics, per chunk: busy seconds per stage; bytes read, chunks parsed, chunk failures and
//! parse errors by kind per dataset (`crate::metrics`).
//!
//! The reader does not copy the bytes: `Dataset::load_chunk` reads and decodes in one call, so
//! the reader's job is I/O scheduling — it starts kernel readahead (`posix_fadvise(WILLNEED)`)
//! for the chunk's byte range, so a parser thread finds the bytes in the page cache.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use minibatchd_engine::format::errors::DataError;

use super::cache::{ChunkRequest, ParsedMsg};
use super::producer::{FreeSlot, Producer, ProducerEvent};
use super::supervisor::{Stage, StageStopped};
use super::Shared;

/// How often a blocked parser thread checks whether the pool is stopping.
const PARSER_POLL: Duration = Duration::from_millis(100);

/// Asks a stage to stop (the supervisor's shutdown, in reverse start order).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct StopStage;

/// Stage 1: schedules reads.
pub struct ChunkReader {
    shared: Arc<Shared>,
    supervisor: Recipient<StageStopped>,
    busy: prometheus::Counter,
}

impl ChunkReader {
    /// A reader over the shared channels.
    #[must_use]
    pub fn new(shared: Arc<Shared>, supervisor: Recipient<StageStopped>) -> Self {
        let busy = shared.metrics.stage_busy(Stage::Reader.name());
        Self { shared, supervisor, busy }
    }

    fn readahead(&self, req: ChunkRequest) {
        let Some(rt) = self.shared.runtime(req.key.0) else { return };
        if let Some((path, start, end)) = rt.dataset.chunk_byte_range(req.key.1 as usize) {
            // Advisory only: a failure just means the parser reads from disk itself.
            if let Ok(f) = std::fs::File::open(path) {
                let len = std::num::NonZeroU64::new(end.saturating_sub(start));
                let _ = rustix::fs::fadvise(&f, start, len, rustix::fs::Advice::WillNeed);
            }
        }
    }
}

impl Actor for ChunkReader {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.add_stream(self.shared.channels.requests.1.clone().into_stream());
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.supervisor.do_send(StageStopped(Stage::Reader));
    }
}

impl StreamHandler<ChunkRequest> for ChunkReader {
    fn handle(&mut self, req: ChunkRequest, ctx: &mut Self::Context) {
        let started = Instant::now();
        self.readahead(req);
        self.busy.inc_by(started.elapsed().as_secs_f64());
        let tx = self.shared.channels.to_parse.0.clone();
        // `wait` holds further requests until the parser queue takes this one: back-pressure.
        ctx.wait(async move { tx.send_async(req).await }.into_actor(self).map(|sent, _, ctx| {
            if sent.is_err() {
                tracing::error!("the parser queue is gone; the reader stops");
                ctx.stop();
            }
        }));
    }
}

impl Handler<StopStage> for ChunkReader {
    type Result = ();
    fn handle(&mut self, _: StopStage, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// Starts one parse loop on a parser thread.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct RunParser;

/// One thread of the parser pool.
struct ParserWorker {
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    pool: Addr<ParserPool>,
    busy: prometheus::Counter,
}

impl Actor for ParserWorker {
    type Context = SyncContext<Self>;
}

impl ParserWorker {
    fn parse(&self, req: ChunkRequest) -> ParsedMsg {
        let Some(rt) = self.shared.runtime(req.key.0) else {
            return ParsedMsg {
                key: req.key,
                result: Err(format!("no dataset with index {} (removed by a reload)", req.key.0)),
            };
        };
        let started = Instant::now();
        // A decoder bug must not take a parser thread (and so the daemon) down: the chunk fails.
        let loaded = std::panic::catch_unwind(AssertUnwindSafe(|| rt.dataset.load_chunk(req.key.1 as usize)));
        let m = &rt.metrics;
        let result = match loaded {
            Ok(Ok((chunk, fresh))) => {
                m.chunks_parsed.inc();
                if let Some((_, start, end)) = rt.dataset.chunk_byte_range(req.key.1 as usize) {
                    m.read_bytes.inc_by(end.saturating_sub(start));
                }
                for e in &fresh {
                    m.parse_error(e.kind).inc();
                }
                for e in fresh.iter().take(10) {
                    tracing::warn!(dataset = %rt.name, "{e}");
                }
                if fresh.len() > 10 {
                    tracing::warn!(dataset = %rt.name, more = fresh.len() - 10, "more malformed input in this chunk");
                }
                Ok(Arc::new(chunk))
            }
            Ok(Err(e)) => {
                m.chunk_failures.inc();
                if let DataError::TooManyErrors { last, .. } = &e {
                    m.parse_error(last.kind).inc();
                }
                tracing::error!(dataset = %rt.name, chunk = req.key.1, error = %e, "chunk failed");
                Err(e.to_string())
            }
            Err(_) => {
                m.chunk_failures.inc();
                Err(format!("internal error while parsing chunk {} of '{}'", req.key.1, rt.name))
            }
        };
        self.busy.inc_by(started.elapsed().as_secs_f64());
        ParsedMsg { key: req.key, result }
    }
}

impl Handler<RunParser> for ParserWorker {
    type Result = ();
    fn handle(&mut self, _: RunParser, _: &mut Self::Context) {
        let rx = self.shared.channels.to_parse.1.clone();
        let tx = self.shared.channels.parsed.0.clone();
        while !self.stop.load(Ordering::Relaxed) {
            let req = match rx.recv_timeout(PARSER_POLL) {
                Ok(r) => r,
                Err(flume::RecvTimeoutError::Timeout) => continue,
                Err(flume::RecvTimeoutError::Disconnected) => break,
            };
            let mut msg = self.parse(req);
            loop {
                match tx.send_timeout(msg, PARSER_POLL) {
                    Ok(()) => break,
                    Err(flume::SendTimeoutError::Timeout(m)) if !self.stop.load(Ordering::Relaxed) => msg = m,
                    Err(_) => return,
                }
            }
        }
        if !self.stop.load(Ordering::Relaxed) {
            self.pool.do_send(StopStage);
        }
    }
}

/// Stage 2: the parser pool — a `SyncArbiter` of `parser_threads` threads (one per core by
/// default), each running a parse loop on the shared `to_parse` channel.
pub struct ParserPool {
    shared: Arc<Shared>,
    supervisor: Recipient<StageStopped>,
    stop: Arc<AtomicBool>,
    workers: Option<Addr<ParserWorker>>,
}

impl ParserPool {
    /// A pool over the shared channels.
    #[must_use]
    pub fn new(shared: Arc<Shared>, supervisor: Recipient<StageStopped>) -> Self {
        Self { shared, supervisor, stop: Arc::new(AtomicBool::new(false)), workers: None }
    }
}

impl Actor for ParserPool {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let threads = self.shared.parser_threads;
        let (shared, stop, pool) = (self.shared.clone(), self.stop.clone(), ctx.address());
        let busy = shared.metrics.stage_busy(Stage::Parsers.name());
        let workers = SyncArbiter::start(threads, move || ParserWorker {
            shared: shared.clone(),
            stop: stop.clone(),
            pool: pool.clone(),
            busy: busy.clone(),
        });
        for _ in 0..threads {
            workers.do_send(RunParser);
        }
        tracing::info!(threads, "parser pool started");
        self.workers = Some(workers);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.stop.store(true, Ordering::Relaxed);
        self.workers = None;
        self.supervisor.do_send(StageStopped(Stage::Parsers));
    }
}

impl Handler<StopStage> for ParserPool {
    type Result = ();
    fn handle(&mut self, _: StopStage, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// Stage 3: the chunk cache — moves parsed chunks from the `parsed` channel into the
/// [`super::cache::SharedCache`] and wakes the producers waiting for them.
pub struct CacheStage {
    shared: Arc<Shared>,
    supervisor: Recipient<StageStopped>,
    busy: prometheus::Counter,
}

impl CacheStage {
    /// The cache stage.
    #[must_use]
    pub fn new(shared: Arc<Shared>, supervisor: Recipient<StageStopped>) -> Self {
        let busy = shared.metrics.stage_busy(Stage::Cache.name());
        Self { shared, supervisor, busy }
    }
}

impl Actor for CacheStage {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.add_stream(self.shared.channels.parsed.1.clone().into_stream());
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.supervisor.do_send(StageStopped(Stage::Cache));
    }
}

impl StreamHandler<ParsedMsg> for CacheStage {
    fn handle(&mut self, msg: ParsedMsg, _: &mut Self::Context) {
        let started = Instant::now();
        self.shared.cache.insert(msg);
        self.busy.inc_by(started.elapsed().as_secs_f64());
    }
}

impl Handler<StopStage> for CacheStage {
    type Result = ();
    fn handle(&mut self, _: StopStage, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// Starts a session's producer thread.
#[derive(Message)]
#[rtype(result = "Result<(), String>")]
pub struct StartProducer {
    /// Thread name suffix (the session name).
    pub name: String,
    /// The producer.
    pub producer: Producer,
    /// Free slots from the connection.
    pub free: flume::Receiver<FreeSlot>,
    /// Events to the connection.
    pub events: flume::Sender<ProducerEvent>,
    /// Set by the connection (or at shutdown) to stop the producer.
    pub stop: Arc<AtomicBool>,
}

/// Stage 5: delivery — owns the producer threads that fill the sessions' rings; stopping it
/// stops and joins them all.
pub struct Delivery {
    supervisor: Recipient<StageStopped>,
    threads: Vec<(std::thread::JoinHandle<()>, Arc<AtomicBool>)>,
}

impl Delivery {
    /// The delivery stage.
    #[must_use]
    pub fn new(supervisor: Recipient<StageStopped>) -> Self {
        Self { supervisor, threads: Vec::new() }
    }
}

impl Actor for Delivery {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        for (_, stop) in &self.threads {
            stop.store(true, Ordering::Relaxed);
        }
        for (t, _) in self.threads.drain(..) {
            let _ = t.join();
        }
        self.supervisor.do_send(StageStopped(Stage::Delivery));
    }
}

impl Handler<StartProducer> for Delivery {
    type Result = Result<(), String>;
    fn handle(&mut self, m: StartProducer, _: &mut Self::Context) -> Self::Result {
        self.threads.retain(|(t, _)| !t.is_finished());
        let stop = m.stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("mbd-session-{}", m.name))
            .spawn(move || m.producer.run(&m.free, &m.events, &m.stop))
            .map_err(|e| format!("cannot start the session's producer thread: {e}"))?;
        self.threads.push((thread, stop));
        Ok(())
    }
}

impl Handler<StopStage> for Delivery {
    type Result = ();
    fn handle(&mut self, _: StopStage, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
