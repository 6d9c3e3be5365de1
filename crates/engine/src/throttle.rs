//! One log line a while for an event that repeats ([`LogThrottle`]): a client in a reconnect
//! loop, a full disk that fails every range — each would flood the journal.

/// At most one line a while (`every`) for a repeated event, saying how many were left out.
pub struct LogThrottle {
    every: std::time::Duration,
    /// When a line was last let through, and the events left out since.
    last: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
}

impl LogThrottle {
    /// A throttle of one line per `every`.
    #[must_use]
    pub const fn new(every: std::time::Duration) -> Self {
        Self { every, last: std::sync::Mutex::new((None, 0)) }
    }

    /// An event at `now`: `Some(events left out since the last line)` when a line may be logged.
    pub fn admit(&self, now: std::time::Instant) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match last.0 {
            Some(at) if now.duration_since(at) < self.every => {
                last.1 += 1;
                None
            }
            _ => {
                let left_out = std::mem::take(&mut last.1);
                last.0 = Some(now);
                Some(left_out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::LogThrottle;

    /// Found by a hostile probe: 1,044 refused connections logged 1,044 warnings. One line a
    /// while, counting what it left out.
    #[test]
    fn a_repeated_event_logs_one_line_a_while_with_the_count_left_out() {
        let t = LogThrottle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(t.admit(t0), Some(0));
        for k in 1..1000u64 {
            assert_eq!(t.admit(t0 + Duration::from_millis(k)), None);
        }
        assert_eq!(t.admit(t0 + Duration::from_secs(10)), Some(999));
        assert_eq!(t.admit(t0 + Duration::from_secs(11)), None);
        assert_eq!(t.admit(t0 + Duration::from_secs(20)), Some(1));
    }
}
