//! Opens prepared per user: one user's costly opens (equal steps over many sweeps and workers,
//! a job's walk, a mixture's walk to a later epoch) take at most [`OPENS_PREPARED_PER_UID`] of
//! the [`crate::pipeline::OPENS_PREPARED`] threads that prepare opens, so another user's open
//! finds one free (found by a probe: 16 such opens of one client held every other client's plain
//! `open` for 20 s, whatever its user).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Opens of one user prepared at once; its others wait their turn, in order.
pub const OPENS_PREPARED_PER_UID: usize = crate::pipeline::OPENS_PREPARED / 2;

/// A lane per user with opens being prepared or waiting.
#[derive(Debug, Default)]
pub struct OpenLanes {
    lanes: Mutex<HashMap<u32, Arc<Semaphore>>>,
}

impl OpenLanes {
    /// Waits for a turn of `uid`'s lane; the open is prepared while the permit lives. `None` only
    /// if the lane was closed, which nothing does.
    pub async fn enter(&self, uid: u32) -> Option<OwnedSemaphorePermit> {
        let lane = {
            let mut lanes = self.lanes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            // A lane nobody holds or waits for goes (a permit and a waiter each hold it).
            lanes.retain(|_, lane| Arc::strong_count(lane) > 1);
            lanes.entry(uid).or_insert_with(|| Arc::new(Semaphore::new(OPENS_PREPARED_PER_UID))).clone()
        };
        lane.acquire_owned().await.ok()
    }

    /// Users with a lane now (for tests).
    #[cfg(test)]
    fn users(&self) -> usize {
        self.lanes.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_users_opens_take_their_share_and_another_user_goes_on() {
        let lanes = Arc::new(OpenLanes::default());
        let mut held = Vec::new();
        for _ in 0..OPENS_PREPARED_PER_UID {
            held.push(lanes.enter(1000).await.expect("a turn"));
        }
        // The user's next open waits for one of its own to end.
        let waiting = tokio::spawn({
            let lanes = lanes.clone();
            async move { lanes.enter(1000).await.map(drop) }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a third open of the same user waits");
        // Another user's open does not.
        let other = tokio::time::timeout(std::time::Duration::from_secs(5), lanes.enter(2000)).await;
        assert!(other.expect("not held up").is_some());
        held.pop();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("its turn came")
            .expect("task")
            .expect("a turn");
        drop(held);
        // Lanes nobody uses are dropped at the next entry.
        drop(lanes.enter(3000).await);
        assert_eq!(lanes.users(), 1, "only the lane just entered is left until the next entry");
    }
}
