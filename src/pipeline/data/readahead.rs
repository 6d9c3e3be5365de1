//! Stage 1, readahead: takes chunk requests from the producers (`requests`, bounded) and
//! hands them to the parser pool (`to_parse`, bounded; a full queue holds further requests — the
//! back-pressure). It does not copy bytes: `Dataset::load_chunk` reads and decodes in one call on a
//! parser thread, so the readahead stage's job is I/O scheduling — it starts kernel readahead
//! (`posix_fadvise(WILLNEED)`) for the chunk's byte range, so the parser finds the bytes in the page
//! cache. Busy seconds go to `minibatchd_stage_busy_seconds_total{stage="readahead"}`.
//!
//! A chunk of an object in object storage is fetched into the object cache first (a ranged
//! GET, `object_fetches` at a time, on the blocking pool), then handed to the parsers: they
//! never wait on the network for a chunk the readahead stage saw coming. A fetch that fails is handed on
//! all the same: the parser gets the same error from the object cache at once (a failure is
//! held there a few seconds, so a stalled store is not waited for twice) and reports it with the
//! object's URL. While every fetch is taken the stage waits for one, but not once the daemon
//! stops: a stalled store would hold the stop for its whole deadline.

use std::time::{Duration, Instant};

use std::sync::Arc;

use actix::prelude::*;

use super::chunk_cache::ChunkRequest;
use super::DataPlane;
use crate::pipeline::lifecycle::{Phase, StageStopped, StopStage};
use crate::stage::Stage;

/// Stage 1: schedules reads.
pub struct Readahead {
    data: Arc<DataPlane>,
    supervisor: Recipient<StageStopped>,
    busy: prometheus::Counter,
    /// Object range fetches in flight at once.
    fetches: Arc<tokio::sync::Semaphore>,
}

impl Readahead {
    /// The readahead stage over the shared channels.
    #[must_use]
    pub fn new(data: Arc<DataPlane>, supervisor: Recipient<StageStopped>) -> Self {
        let busy = data.metrics.stage_busy(Stage::Readahead.name());
        let fetches = Arc::new(tokio::sync::Semaphore::new(data.object_fetches));
        Self { data, supervisor, busy, fetches }
    }

    /// Whether chunk `req` is a range of an object that is not in the object cache yet.
    fn needs_fetch(&self, req: ChunkRequest) -> bool {
        self.data.runtime(req.key.dataset).is_some_and(|rt| rt.dataset.object_range_missing(req.key.chunk as usize))
    }

    fn readahead(&self, req: ChunkRequest) {
        let Some(rt) = self.data.runtime(req.key.dataset) else { return };
        if let Some((path, start, end)) = rt.dataset.chunk_byte_range(req.key.chunk as usize) {
            // Advisory only: a failure just means the parser reads from disk itself.
            if let Ok(f) = std::fs::File::open(path) {
                let len = std::num::NonZeroU64::new(end.saturating_sub(start));
                let _ = rustix::fs::fadvise(&f, start, len, rustix::fs::Advice::WillNeed);
            }
        }
    }
}

/// Resolves once the daemon stops (the phase is looked at every 50 ms: this runs only while the
/// stage waits for a fetch, every one being taken, or for room in the parser queue).
async fn stopping(data: &DataPlane) {
    while data.health.phase() != Phase::Stopping {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Actor for Readahead {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.add_stream(self.data.channels.requests.1.clone().into_stream());
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.supervisor.do_send(StageStopped(Stage::Readahead));
    }
}

impl StreamHandler<ChunkRequest> for Readahead {
    fn handle(&mut self, req: ChunkRequest, ctx: &mut Self::Context) {
        if self.needs_fetch(req) {
            // Wait for a free fetch (holding further requests: back-pressure), then fetch on the
            // blocking pool and hand the chunk on when its bytes are on disk.
            let permits = self.fetches.clone();
            let data = self.data.clone();
            let health = self.data.clone();
            let permit = async move {
                tokio::select! {
                    permit = permits.acquire_owned() => permit.ok(),
                    () = stopping(&health) => None,
                }
            };
            ctx.wait(permit.into_actor(self).map(move |permit, _, _| {
                let Some(permit) = permit else { return };
                actix::spawn(async move {
                    let fetched = tokio::task::spawn_blocking({
                        let data = data.clone();
                        move || {
                            let rt = data.runtime(req.key.dataset)?;
                            rt.dataset.fetch_object_range(req.key.chunk as usize)
                        }
                    })
                    .await;
                    drop(permit);
                    if let Ok(Some(Err(e))) = fetched {
                        tracing::warn!(dataset = req.key.dataset, chunk = req.key.chunk, error = %e, "fetching a chunk ahead of the parsers failed");
                    }
                    let _ = data.channels.to_parse.0.send_async(req).await;
                });
            }));
            return;
        }
        let started = Instant::now();
        self.readahead(req);
        self.busy.inc_by(started.elapsed().as_secs_f64());
        let tx = self.data.channels.to_parse.0.clone();
        let data = self.data.clone();
        // `wait` holds further requests until the parser queue takes this one: back-pressure.
        // Not once the daemon stops: the parsers stop taking requests then, and a wait on their
        // full queue would hold this stage's mailbox, and with it the stop, for good.
        let sent = async move {
            tokio::select! {
                sent = tx.send_async(req) => Some(sent.is_ok()),
                () = stopping(&data) => None,
            }
        };
        ctx.wait(sent.into_actor(self).map(|sent, _, ctx| match sent {
            Some(true) => {}
            Some(false) => {
                tracing::error!("the parser queue is gone; the readahead stage stops");
                ctx.stop();
            }
            None => ctx.stop(),
        }));
    }
}

impl Handler<StopStage> for Readahead {
    type Result = ();
    fn handle(&mut self, _: StopStage, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
