//! Stage 3, the cache stage: moves parsed chunks (or their errors) from the `parsed` channel
//! (bounded) into the [`SharedCache`](super::chunk_cache::SharedCache), which wakes the producers waiting
//! for them.

use std::time::Instant;

use std::sync::Arc;

use actix::prelude::*;

use super::chunk_cache::ParsedMsg;
use super::DataPlane;
use crate::pipeline::lifecycle::{StageStopped, StopStage};
use crate::stage::Stage;

/// Stage 3: the chunk cache — moves parsed chunks from the `parsed` channel into the
/// [`super::chunk_cache::SharedCache`] and wakes the producers waiting for them.
pub struct CacheStage {
    data: Arc<DataPlane>,
    supervisor: Recipient<StageStopped>,
    busy: prometheus::Counter,
}

impl CacheStage {
    /// The cache stage.
    #[must_use]
    pub fn new(data: Arc<DataPlane>, supervisor: Recipient<StageStopped>) -> Self {
        let busy = data.metrics.stage_busy(Stage::Cache.name());
        Self { data, supervisor, busy }
    }
}

impl Actor for CacheStage {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.add_stream(self.data.channels.parsed.1.clone().into_stream());
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.supervisor.do_send(StageStopped(Stage::Cache));
    }
}

impl StreamHandler<ParsedMsg> for CacheStage {
    fn handle(&mut self, msg: ParsedMsg, _: &mut Self::Context) {
        let started = Instant::now();
        self.data.cache.insert(msg);
        self.busy.inc_by(started.elapsed().as_secs_f64());
    }
}

impl Handler<StopStage> for CacheStage {
    type Result = ();
    fn handle(&mut self, _: StopStage, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
