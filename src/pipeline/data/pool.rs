//! A fixed set of threads that runs every session's producer: the daemon's thread count does not
//! grow with its sessions (`producer_threads`, one per core by default).
//!
//! A [`Task`] is a piece of cooperative work — a closure that does a turn of work and says
//! whether it has more ([`Turn`]). A task is queued when something wakes it ([`Task::wake`]: a
//! slot given back, a minibatch handed on, a stop) and runs on one pool thread at a time; a wake
//! that comes while it runs makes it run once more, so no wake is lost. A turn may block (a
//! producer waits for a chunk being parsed, which the parser threads do whatever the pool does),
//! but never on another task of the pool.
//!
//! States: `IDLE` → (wake) `QUEUED` → (a thread takes it) `RUNNING` → `IDLE`, or `NOTIFIED` when
//! woken while running (→ `QUEUED` again), or `DONE` for good (its closure is dropped).

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;

/// What a task's turn ends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Nothing to do until the next wake.
    Idle,
    /// More to do: queue again (after the tasks already waiting, so that one session does not
    /// hold a thread while others wait).
    Again,
    /// Finished: never runs again; its closure (and what it owns) is dropped.
    Done,
}

const IDLE: u8 = 0;
const QUEUED: u8 = 1;
const RUNNING: u8 = 2;
const NOTIFIED: u8 = 3;
const DONE: u8 = 4;

type Work = Box<dyn FnMut() -> Turn + Send>;

struct TaskCore {
    name: String,
    state: AtomicU8,
    work: Mutex<Option<Work>>,
    /// The pool's queue; gone once the pool is shut down (a wake then does nothing).
    queue: Weak<flume::Sender<Arc<TaskCore>>>,
}

/// A handle on a task of a [`Pool`]: wake it, or see whether it is finished.
#[derive(Clone)]
pub struct Task(Arc<TaskCore>);

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task")
            .field("name", &self.0.name)
            .field("state", &self.0.state.load(Ordering::Relaxed))
            .finish()
    }
}

impl Task {
    /// Makes the task run (again) soon: queues it if idle; if it is running, it runs once more.
    pub fn wake(&self) {
        let core = &self.0;
        let mut s = core.state.load(Ordering::Acquire);
        loop {
            let next = match s {
                IDLE => QUEUED,
                RUNNING => NOTIFIED,
                _ => return, // queued or notified already, or done
            };
            match core.state.compare_exchange_weak(s, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) if next == QUEUED => return push(&self.0),
                Ok(_) => return,
                Err(actual) => s = actual,
            }
        }
    }

    /// The task's turns are over (it returned [`Turn::Done`] or panicked).
    #[must_use]
    pub fn is_done(&self) -> bool {
        self.0.state.load(Ordering::Acquire) == DONE
    }

    /// Gives the task its work: until then a wake queues it but its turn does nothing.
    pub fn set_work(&self, work: impl FnMut() -> Turn + Send + 'static) {
        *lock(&self.0.work) = Some(Box::new(work));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Queues `core` (its state is `QUEUED`); if the pool is gone the task simply never runs.
fn push(core: &Arc<TaskCore>) {
    if let Some(queue) = core.queue.upgrade() {
        let _ = queue.send(core.clone());
    }
}

/// One turn of `core` on a pool thread.
fn run(core: &Arc<TaskCore>) {
    core.state.store(RUNNING, Ordering::Release);
    let turn = {
        let mut work = lock(&core.work);
        match work.as_mut() {
            None => Turn::Idle,
            Some(f) => std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
                tracing::error!(task = %core.name, "a producer task panicked (a bug); its session ends");
                Turn::Done
            }),
        }
    };
    match turn {
        Turn::Done => {
            // Dropping the closure ends what it owns (channels, the ring): take it out first so
            // that its drop code runs without the lock.
            let work = lock(&core.work).take();
            core.state.store(DONE, Ordering::Release);
            drop(work);
        }
        Turn::Again => {
            core.state.store(QUEUED, Ordering::Release);
            push(core);
        }
        Turn::Idle => {
            if core.state.compare_exchange(RUNNING, IDLE, Ordering::AcqRel, Ordering::Acquire).is_err() {
                // Woken while it ran (NOTIFIED): it runs again.
                core.state.store(QUEUED, Ordering::Release);
                push(core);
            }
        }
    }
}

/// The pool: its threads and its queue of tasks to run.
pub struct Pool {
    queue: Option<Arc<flume::Sender<Arc<TaskCore>>>>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("threads", &self.threads.len()).finish_non_exhaustive()
    }
}

impl Pool {
    /// A pool of `threads` threads named `{prefix}-N` (at least one).
    ///
    /// # Errors
    /// A thread could not be started.
    pub fn new(threads: usize, prefix: &str) -> std::io::Result<Self> {
        // Unbounded: each task is in the queue at most once (its state says so), so the queue
        // holds at most one entry per live task.
        let (tx, rx) = flume::unbounded::<Arc<TaskCore>>();
        let mut pool = Self { queue: Some(Arc::new(tx)), threads: Vec::new() };
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            let thread = std::thread::Builder::new().name(format!("{prefix}-{i}")).spawn(move || {
                for core in &rx {
                    run(&core);
                }
            });
            match thread {
                Ok(t) => pool.threads.push(t),
                Err(e) => {
                    pool.shutdown();
                    return Err(e);
                }
            }
        }
        Ok(pool)
    }

    /// The number of threads.
    #[must_use]
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// A new task, idle and without work ([`Task::set_work`], then [`Task::wake`]).
    #[must_use]
    pub fn task(&self, name: impl Into<String>) -> Task {
        let queue = self.queue.as_ref().map_or_else(Weak::new, Arc::downgrade);
        Task(Arc::new(TaskCore { name: name.into(), state: AtomicU8::new(IDLE), work: Mutex::new(None), queue }))
    }

    /// Runs what is queued, then stops the threads and waits for them. Tasks woken afterwards
    /// never run again (their work is dropped with the last handle).
    pub fn shutdown(&mut self) {
        // Dropping the one strong reference to the sender closes the queue once no `push` holds
        // an upgraded one; the threads drain what is queued and end.
        self.queue = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    use std::time::{Duration, Instant};

    use super::*;

    fn eventually(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn many_tasks_share_a_fixed_number_of_threads_and_every_wake_is_served() {
        let pool = Pool::new(2, "t").expect("pool");
        assert_eq!(pool.threads(), 2);
        // 200 "sessions", each consuming items given to it through a channel, as a producer
        // takes free slots: each must consume every item, whatever the interleaving of wakes.
        let mut sessions = Vec::new();
        for i in 0..200 {
            let (tx, rx) = flume::unbounded::<u32>();
            let got = Arc::new(AtomicUsize::new(0));
            let task = pool.task(format!("s{i}"));
            let g = got.clone();
            task.set_work(move || {
                for _ in 0..3 {
                    match rx.try_recv() {
                        Ok(_) => {
                            g.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(flume::TryRecvError::Empty) => return Turn::Idle,
                        Err(flume::TryRecvError::Disconnected) => return Turn::Done,
                    }
                }
                Turn::Again
            });
            sessions.push((tx, task, got));
        }
        // Items arrive from several threads at once, each followed by a wake.
        std::thread::scope(|s| {
            for part in sessions.chunks(50) {
                s.spawn(move || {
                    for k in 0..100u32 {
                        for (tx, task, _) in part {
                            tx.send(k).expect("send");
                            task.wake();
                        }
                    }
                });
            }
        });
        eventually("every item consumed", || sessions.iter().all(|(_, _, g)| g.load(Ordering::Relaxed) == 100));
        // Closing a channel and waking ends the task.
        for (tx, task, _) in sessions.drain(..) {
            drop(tx);
            task.wake();
            eventually("the task done", || task.is_done());
        }
    }

    #[test]
    fn a_wake_while_running_runs_the_task_again() {
        let pool = Pool::new(1, "t").expect("pool");
        let task = pool.task("t");
        let runs = Arc::new(AtomicUsize::new(0));
        let (entered_tx, entered_rx) = flume::bounded::<()>(1);
        let (go_tx, go_rx) = flume::bounded::<()>(1);
        let r = runs.clone();
        task.set_work(move || {
            if r.fetch_add(1, Ordering::SeqCst) == 0 {
                entered_tx.send(()).expect("entered");
                go_rx.recv().expect("go");
            }
            Turn::Idle
        });
        task.wake();
        entered_rx.recv().expect("first turn began");
        task.wake(); // while it runs
        go_tx.send(()).expect("go");
        eventually("a second turn", || runs.load(Ordering::SeqCst) == 2);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(runs.load(Ordering::SeqCst), 2, "exactly one more turn, then idle");
    }

    #[test]
    fn a_panicking_task_is_done_and_the_pool_goes_on() {
        let pool = Pool::new(1, "t").expect("pool");
        let bad = pool.task("bad");
        bad.set_work(|| panic!("a bug"));
        bad.wake();
        eventually("the panicking task done", || bad.is_done());
        let ok = pool.task("ok");
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        ok.set_work(move || {
            r.store(true, Ordering::SeqCst);
            Turn::Done
        });
        ok.wake();
        eventually("the next task ran", || ran.load(Ordering::SeqCst) && ok.is_done());
    }

    #[test]
    fn shutdown_runs_what_is_queued_and_later_wakes_do_nothing() {
        let mut pool = Pool::new(1, "t").expect("pool");
        let task = pool.task("t");
        let runs = Arc::new(AtomicUsize::new(0));
        let r = runs.clone();
        task.set_work(move || {
            r.fetch_add(1, Ordering::SeqCst);
            Turn::Idle
        });
        task.wake();
        pool.shutdown();
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        task.wake();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}
