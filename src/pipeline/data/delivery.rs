//! Stage 4, delivery: owns the producer pool, `producer_threads` threads (`mbd-produce-N`) that
//! run every session's producer ([`Producer::start`]), so the daemon's threads do not grow with
//! its sessions; stopping the stage stops every producer and joins the threads.
//! A connection asks it to start its session's producer ([`StartProducer`]).

use actix::prelude::*;

use super::pool::Pool;
use super::producer::{FreeSlot, Producer, ProducerEvent, ProducerHandle, Stopper};
use crate::pipeline::lifecycle::{StageStopped, StopStage};
use crate::stage::Stage;

/// Starts a session's producer on the pool.
#[derive(Message)]
#[rtype(result = "ProducerHandle")]
pub struct StartProducer {
    /// The session name (for logs).
    pub name: String,
    /// The producer.
    pub producer: Producer,
    /// The slots it may fill at first (every slot of the ring, or those not leased).
    pub free: Vec<FreeSlot>,
    /// The ring's slot count (the most slots ever free at once).
    pub slot_count: usize,
    /// Events to the connection.
    pub events: flume::Sender<ProducerEvent>,
}

/// Stage 4: delivery — owns the pool that fills the sessions' rings; stopping it stops every
/// producer and joins the pool's threads.
pub struct Delivery {
    supervisor: Recipient<StageStopped>,
    pool: Pool,
    producers: Vec<Stopper>,
}

impl Delivery {
    /// The delivery stage, with a pool of `threads` threads.
    ///
    /// # Errors
    /// A thread could not be started.
    pub fn new(supervisor: Recipient<StageStopped>, threads: usize) -> std::io::Result<Self> {
        Ok(Self { supervisor, pool: Pool::new(threads, "mbd-produce")?, producers: Vec::new() })
    }
}

impl Actor for Delivery {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        for p in &self.producers {
            p.stop();
        }
        // Every producer is woken with its stop flag set: their last turns run, then the threads end.
        self.pool.shutdown();
        self.producers.clear();
        self.supervisor.do_send(StageStopped(Stage::Delivery));
    }
}

impl Handler<StartProducer> for Delivery {
    type Result = MessageResult<StartProducer>;
    fn handle(&mut self, m: StartProducer, _: &mut Self::Context) -> Self::Result {
        self.producers.retain(|p| !p.is_done());
        let handle = m.producer.start(&self.pool, &m.name, m.free, m.slot_count, m.events);
        self.producers.push(handle.stopper());
        MessageResult(handle)
    }
}

impl Handler<StopStage> for Delivery {
    type Result = ();
    fn handle(&mut self, _: StopStage, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
