//! Stage 2, the parser pool: a `SyncArbiter` of `parser_threads` threads (one per core by
//! default), each taking chunk requests from `to_parse` (bounded), parsing them with
//! `Dataset::load_chunk` and sending the result — the parsed chunk, or the [`DataError`] with its
//! file, line, byte offset and kind — on `parsed` (bounded). Per chunk: bytes read, chunks parsed,
//! chunk failures and parse errors by kind (`crate::metrics`); a decoder panic fails the chunk,
//! never the thread. A thread that finds its queue gone stops the pool, which the supervisor
//! restarts.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use minibatchd_engine::format::errors::DataError;

use std::sync::Arc;

use actix::prelude::*;

use super::chunk_cache::{ChunkRequest, ParsedMsg};
use super::DataPlane;
use crate::pipeline::lifecycle::{StageStopped, StopStage};
use crate::stage::Stage;

/// How often a blocked parser thread checks whether the pool is stopping.
const PARSER_POLL: Duration = Duration::from_millis(100);

/// Starts one parse loop on a parser thread.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct RunParser;

/// One thread of the parser pool.
struct ParserWorker {
    data: Arc<DataPlane>,
    stop: Arc<AtomicBool>,
    pool: Addr<ParserPool>,
    busy: prometheus::Counter,
}

impl Actor for ParserWorker {
    type Context = SyncContext<Self>;
}

impl ParserWorker {
    fn parse(&self, req: ChunkRequest) -> ParsedMsg {
        let Some(rt) = self.data.runtime(req.key.dataset) else {
            return ParsedMsg {
                key: req.key,
                result: Err(DataError::Dataset(format!(
                    "no dataset with index {} (removed by a reload)",
                    req.key.dataset
                ))),
                persist: None,
            };
        };
        let started = Instant::now();
        // A decoder bug must not take a parser thread (and so the daemon) down: the chunk fails.
        // Read back from the parsed cache, or parsed: only a parse counts as one, and its text
        // as read (a probe: a sweep served whole from the cache counted every chunk parsed).
        let loaded = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let c = req.key.chunk as usize;
            match rt.dataset.cached_chunk(c)? {
                Some(chunk) => Ok((chunk, Vec::new(), false)),
                None => rt.dataset.parse_chunk(c).map(|(chunk, fresh)| (chunk, fresh, true)),
            }
        }));
        let m = &rt.metrics;
        let mut persist = None;
        let result = match loaded {
            Ok(Ok((chunk, fresh, parsed))) => {
                if parsed {
                    rt.count_parse(req.key.chunk as usize);
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
                let chunk = Arc::new(chunk);
                persist = rt.persist_target(&chunk);
                Ok(chunk)
            }
            Ok(Err(e)) => {
                m.chunk_failures.inc();
                if let DataError::TooManyErrors { last, .. } = &e {
                    m.parse_error(last.kind).inc();
                }
                let place = e.place();
                tracing::error!(
                    dataset = %rt.name,
                    chunk = req.key.chunk,
                    file = ?e.file(),
                    line = place.map(|l| l.line),
                    offset = place.map(|l| l.offset),
                    kind = e.kind_name(),
                    error = %e,
                    "chunk failed"
                );
                Err(e)
            }
            Err(_) => {
                m.chunk_failures.inc();
                Err(DataError::Dataset(format!(
                    "internal error while parsing chunk {} of '{}'",
                    req.key.chunk, rt.name
                )))
            }
        };
        self.busy.inc_by(started.elapsed().as_secs_f64());
        ParsedMsg { key: req.key, result, persist }
    }
}

impl Handler<RunParser> for ParserWorker {
    type Result = ();
    fn handle(&mut self, _: RunParser, _: &mut Self::Context) {
        let rx = self.data.channels.to_parse.1.clone();
        let tx = self.data.channels.parsed.0.clone();
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
    data: Arc<DataPlane>,
    supervisor: Recipient<StageStopped>,
    stop: Arc<AtomicBool>,
    workers: Option<Addr<ParserWorker>>,
}

impl ParserPool {
    /// A pool over the shared channels.
    #[must_use]
    pub fn new(data: Arc<DataPlane>, supervisor: Recipient<StageStopped>) -> Self {
        Self { data, supervisor, stop: Arc::new(AtomicBool::new(false)), workers: None }
    }
}

impl Actor for ParserPool {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let threads = self.data.parser_threads;
        let (data, stop, pool) = (self.data.clone(), self.stop.clone(), ctx.address());
        let busy = data.metrics.stage_busy(Stage::Parsers.name());
        let workers = SyncArbiter::start(threads, move || ParserWorker {
            data: data.clone(),
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
