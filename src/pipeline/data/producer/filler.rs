//! A producer's filler tasks ([`Filling`]): each copies the minibatches the planner task hands it
//! into their slots, and the [`Announcer`] they share sends the events to the connection in
//! minibatch order ([`Reorder`]). Kept apart from the planner task, which only hands them work.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use minibatchd_client::protocol::MinibatchMeta;
use minibatchd_shm::SharedRing;
use minibatchd_sys::MemfdMemory;

use super::{Located, ProduceError, ProducerEvent, Step, TURN_MINIBATCHES};
use crate::metrics::SessionMetrics;
use crate::pipeline::data::pool::{Task, Turn};

/// Items numbered 0, 1, 2, … that arrive in any order, handed back in their order: each once
/// every one before it has come. Plain, for the [`Announcer`].
#[derive(Debug)]
pub(super) struct Reorder<T> {
    next: u64,
    waiting: BTreeMap<u64, T>,
}

impl<T> Default for Reorder<T> {
    fn default() -> Self {
        Self { next: 0, waiting: BTreeMap::new() }
    }
}

impl<T> Reorder<T> {
    /// Item `n` came; `ready` gets every item now in order, in their order.
    fn put(&mut self, n: u64, item: T, mut ready: impl FnMut(T)) {
        self.waiting.insert(n, item);
        while let Some(item) = self.waiting.remove(&self.next) {
            self.next += 1;
            ready(item);
        }
    }
}

/// The fillers' events, sent to the connection in minibatch order (the session's metrics counted
/// as they go); nothing after the end, a failure, or the connection's going.
pub(super) struct Announcer {
    pub(super) order: Reorder<(ProducerEvent, u64)>,
    pub(super) events: flume::Sender<ProducerEvent>,
    /// The end or a failure was sent, or the connection is gone.
    pub(super) over: bool,
    /// When the session opened, until its first minibatch is announced.
    pub(super) opened: Option<Instant>,
    pub(super) metrics: SessionMetrics,
}

impl Announcer {
    /// Event `n` (with the nominal samples of its minibatch); false once the producer is over.
    fn put(&mut self, n: u64, event: ProducerEvent, samples: u64) -> bool {
        if self.over {
            return false;
        }
        let Self { order, events, over, opened, metrics } = self;
        order.put(n, (event, samples), |(event, samples)| {
            if *over {
                return;
            }
            if let ProducerEvent::Filled { meta, .. } = &event {
                if let Some(opened) = opened.take() {
                    metrics.first_minibatch_seconds.observe(opened.elapsed().as_secs_f64());
                }
                metrics.minibatches.inc();
                metrics.samples.inc_by(samples);
                metrics.sweep.set(i64::try_from(meta.sweep).unwrap_or(i64::MAX));
            }
            let last = !matches!(event, ProducerEvent::Filled { .. });
            // Bounded by the slot count + 2: the connection drains it as it announces, and at most
            // a slot count of minibatches is out at once.
            if events.send(event).is_err() || last {
                *over = true;
            }
        });
        if self.over {
            self.order.waiting.clear();
        }
        !self.over
    }
}

/// A filler task: copies each minibatch handed to it into its slot and announces it.
pub(super) struct Filling {
    /// Stream names, in tensor order.
    pub(super) names: Arc<Vec<String>>,
    pub(super) metrics: SessionMetrics,
    pub(super) ring: Arc<SharedRing<MemfdMemory>>,
    /// `None` once the filler is finished.
    pub(super) steps: Option<flume::Receiver<(u64, Step)>>,
    pub(super) announcer: Arc<Mutex<Announcer>>,
    pub(super) planner: Task,
    pub(super) stop: Arc<AtomicBool>,
    /// The planner waits for room in a queue (see [`Planning`](super::Planning)).
    pub(super) queue_full: Arc<AtomicBool>,
}

impl Filling {
    pub(super) fn turn(&mut self) -> Turn {
        for _ in 0..TURN_MINIBATCHES {
            let Some(steps) = &self.steps else { return Turn::Done };
            if self.stop.load(Ordering::Relaxed) {
                return self.finish();
            }
            let (n, step) = match steps.try_recv() {
                Ok(step) => step,
                Err(flume::TryRecvError::Empty) => return Turn::Idle,
                Err(flume::TryRecvError::Disconnected) => return self.finish(),
            };
            // The queue has room again: a planner that found it full is woken.
            if self.queue_full.swap(false, Ordering::SeqCst) {
                self.planner.wake();
            }
            let (event, samples) = match step {
                Step::Fill(job) => self.fill(*job),
                Step::Event(event) => (event, 0),
            };
            let going = self.announcer.lock().unwrap_or_else(std::sync::PoisonError::into_inner).put(n, event, samples);
            if !going {
                return self.finish();
            }
        }
        Turn::Again
    }

    /// Copies `job` into its slot: the event to announce and the minibatch's nominal samples.
    fn fill(&self, job: Located) -> (ProducerEvent, u64) {
        let started = Instant::now();
        // A minibatch gathered a chunk at a time: its copies stay counted until it is in its slot
        // (and the minibatches gathered with it in theirs), at the end of this call.
        let Located { slot, mb, samples, charged: _charged, mixture } = job;
        match self.ring.write(slot.slot, slot.generation, &mb, &self.names) {
            Ok(_) => {
                self.metrics.delivery_busy_seconds.inc_by(started.elapsed().as_secs_f64());
                let meta = MinibatchMeta {
                    index: mb.index,
                    sweep: mb.sweep,
                    end_of_sweep: mb.end_of_sweep,
                    position: mb.position,
                };
                (ProducerEvent::Filled { slot: slot.slot, generation: slot.generation, meta, mixture }, samples)
            }
            Err(e) => (ProducerEvent::failed(&ProduceError::from(e)), 0),
        }
    }

    /// Stops taking minibatches; a planner still running sees the queue closed.
    fn finish(&mut self) -> Turn {
        self.steps = None;
        self.planner.wake();
        Turn::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_from_two_fillers_leave_in_minibatch_order() {
        let mut order = Reorder::default();
        let mut out = Vec::new();
        // Filler 1 (odd numbers) runs ahead of filler 0 (even numbers).
        for n in [1u64, 3, 0, 5, 2, 4, 7, 6] {
            order.put(n, n, |x| out.push(x));
            assert!(out.windows(2).all(|w| w[1] == w[0] + 1), "{out:?}");
        }
        assert_eq!(out, (0..8).collect::<Vec<_>>());
        assert!(order.waiting.is_empty());
        let mut late = Vec::new();
        order.put(9, 9, |x| late.push(x));
        assert!(late.is_empty(), "9 waits for 8");
        order.put(8, 8, |x| late.push(x));
        assert_eq!(late, [8, 9]);
    }
}
