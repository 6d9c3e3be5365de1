//! Stage 4, delivery: owns the sessions' producer threads (one per session, named
//! `mbd-session-NAME`, plus its scoped filler thread); stopping the stage stops and joins them all.
//! A connection asks it to start its session's producer ([`StartProducer`]).

use std::sync::atomic::{AtomicBool, Ordering};

use std::sync::Arc;

use actix::prelude::*;

use super::producer::{FreeSlot, Producer, ProducerEvent};
use crate::pipeline::lifecycle::{StageStopped, StopStage};
use crate::stage::Stage;

/// Starts a session's producer thread.
#[derive(Message)]
#[rtype(result = "std::io::Result<()>")]
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

/// Stage 4: delivery — owns the producer threads that fill the sessions' rings; stopping it
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
    type Result = std::io::Result<()>;
    fn handle(&mut self, m: StartProducer, _: &mut Self::Context) -> Self::Result {
        self.threads.retain(|(t, _)| !t.is_finished());
        let stop = m.stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("mbd-session-{}", m.name))
            .spawn(move || m.producer.run(&m.free, &m.events, &m.stop))?;
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
