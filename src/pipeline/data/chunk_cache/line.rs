//! The line for memory ([`MemoryLine`]): the producers waiting for memory other sessions hold,
//! the oldest first, and the turn of the one that left it last. Plain, for [`super::SharedCache`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a session that came first in line and got its memory may go on taking memory while
/// others wait ([`MemoryLine::behind`]): sessions that take turns at memory reload their chunks at
/// each turn, so a turn that ended at its first new chunk cost a window's loads for a few
/// minibatches (a property test's case: six sessions on a 18 MiB limit, 1.7 chunk loads a
/// minibatch). Shorter than [`super::LINE_PATIENCE`], so the first in line is not pushed to gather
/// a chunk at a time by a turn alone.
pub(super) const TURN: Duration = Duration::from_secs(1);

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The producers waiting for memory, by id, in the order they began; since when the first has
/// been first; and the turn of the last one that left the line first (it got its memory), with
/// when it began.
#[derive(Debug, Default)]
pub(super) struct MemoryLine {
    order: Mutex<Vec<u64>>,
    head_since: Mutex<Option<Instant>>,
    /// The length of `order`, read without its lock.
    queued: AtomicUsize,
    turn: Mutex<Option<(u64, Instant)>>,
}

impl MemoryLine {
    /// Whether anyone waits.
    pub(super) fn is_empty(&self) -> bool {
        self.queued.load(Ordering::SeqCst) == 0
    }

    /// `id` waits (from now, if it was not already waiting): its turn, if it had one, is over.
    pub(super) fn queue(&self, id: u64) {
        let mut order = locked(&self.order);
        if !order.contains(&id) {
            order.push(id);
            self.queued.store(order.len(), Ordering::SeqCst);
            if order.len() == 1 {
                *locked(&self.head_since) = Some(Instant::now());
            }
        }
        drop(order);
        let mut turn = locked(&self.turn);
        if turn.is_some_and(|(holder, _)| holder == id) {
            *turn = None;
        }
    }

    /// `id` waits no longer (it got its memory, or it ended); the new first, when it changed.
    /// The first that leaves has its turn ([`TURN`]).
    pub(super) fn leave(&self, id: u64) -> Option<u64> {
        let mut order = locked(&self.order);
        let first = order.first().copied();
        order.retain(|&i| i != id);
        self.queued.store(order.len(), Ordering::SeqCst);
        let head = order.first().copied();
        if head != first {
            // A new first (or none): its wait as first counts from now.
            *locked(&self.head_since) = head.map(|_| Instant::now());
        }
        drop(order);
        if first == Some(id) {
            *locked(&self.turn) = Some((id, Instant::now()));
        }
        head.filter(|_| head != first)
    }

    /// Whether `id` is first.
    pub(super) fn first(&self, id: u64) -> bool {
        locked(&self.order).first() == Some(&id)
    }

    /// Whether `by` (`None`: no session) is to take no memory: someone waits, and either another
    /// session is in its turn — the first in line too waits for it to end, else the memory the
    /// holder lets go of to fit its own minibatch went to the first, and two sessions took turns
    /// a minibatch at a time, each loading its chunks again (a property test's case) — or `by` is
    /// not first.
    pub(super) fn behind(&self, by: Option<u64>) -> bool {
        if self.is_empty() {
            return false;
        }
        if let Some((holder, since)) = *locked(&self.turn) {
            if since.elapsed() < TURN {
                return by != Some(holder);
            }
        }
        locked(&self.order).first().is_some_and(|&first| Some(first) != by)
    }

    /// `id` is over: out of the line, and its turn, if it had one, ended. The new first, when it
    /// changed.
    pub(super) fn forget(&self, id: u64) -> Option<u64> {
        let next = self.leave(id);
        self.end_turn(id);
        next
    }

    /// `id`'s turn, if it has it, is over; whether it had it.
    pub(super) fn end_turn(&self, id: u64) -> bool {
        let mut turn = locked(&self.turn);
        let had = turn.is_some_and(|(holder, _)| holder == id);
        if had {
            *turn = None;
        }
        had
    }

    /// How long the first has waited as first (zero when nobody waits).
    pub(super) fn head_waited(&self) -> Duration {
        locked(&self.head_since).map_or(Duration::ZERO, |t| t.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_to_leave_takes_memory_for_its_turn_and_queueing_again_ends_it() {
        let line = MemoryLine::default();
        line.queue(1);
        line.queue(2);
        assert!(!line.behind(Some(1)) && line.behind(Some(2)) && line.behind(Some(3)) && line.behind(None));
        assert_eq!(line.leave(1), Some(2), "2 comes first");
        // 1 got its memory: in its turn it takes memory, 2 (first) and a session that never
        // waited do not.
        assert!(!line.behind(Some(1)) && line.behind(Some(2)) && line.behind(Some(3)) && line.behind(None));
        // It asks for memory again: its turn is over, it waits behind 2.
        line.queue(1);
        assert!(line.behind(Some(1)) && line.first(2) && !line.behind(Some(2)));
        assert_eq!(line.leave(2), Some(1));
        assert!(!line.behind(Some(2)) && line.behind(Some(1)), "2's turn");
        // A session that leaves without being first (it ended) takes no turn.
        line.queue(3);
        assert_eq!(line.leave(3), None);
        assert!(line.behind(Some(3)) && line.first(1));
        // The holder ends: its turn with it.
        assert_eq!(line.forget(2), None);
        assert!(!line.behind(Some(1)) && line.behind(Some(3)));
        assert_eq!(line.leave(1), None, "nobody left");
        assert!(line.is_empty() && !line.behind(Some(7)) && line.head_waited() == Duration::ZERO);
    }

    #[test]
    fn a_holder_that_stops_taking_minibatches_ends_its_turn() {
        let line = MemoryLine::default();
        line.queue(1);
        line.queue(2);
        line.leave(1);
        assert!(line.behind(Some(2)), "1's turn");
        assert!(!line.end_turn(2), "2 has no turn to end");
        assert!(line.end_turn(1));
        assert!(!line.behind(Some(2)) && line.behind(Some(1)));
    }

    #[test]
    fn a_turn_ends_after_its_time() {
        let line = MemoryLine::default();
        line.queue(1);
        line.queue(2);
        line.leave(1);
        *locked(&line.turn) = Some((1, Instant::now().checked_sub(TURN).expect("an instant a second ago")));
        assert!(line.behind(Some(1)) && !line.behind(Some(2)), "past its turn, behind 2");
    }
}
