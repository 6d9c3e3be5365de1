//! Datasets being opened (indexed): their progress, for the `dataset_indexing` reply to an `open`,
//! the log (a line every [`LOG_EVERY`]) and `/metrics`
//! (`minibatchd_dataset_index_{scanned,total}_bytes`, `minibatchd_datasets{state="indexing"}`,
//! `minibatchd_dataset_ready_seconds`).
//!
//! The daemon opens its datasets after its socket is up (at start) or beside the running ones (a
//! reload), so a session may ask for a dataset that is still indexing: it gets a clear reply with
//! the progress instead of waiting blindly or being told the dataset is unknown.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use minibatchd_engine::dataset::IndexProgress;

use crate::metrics::Metrics;

/// How often the log reports the progress of a dataset's index pass.
pub const LOG_EVERY: Duration = Duration::from_secs(5);

/// Where a dataset's index pass is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Bytes scanned (cached files count whole).
    pub scanned: u64,
    /// Bytes to scan in all.
    pub total: u64,
    /// Since the pass began.
    pub elapsed: Duration,
    /// The pass is over: the dataset opens with the other datasets being opened now, this many
    /// of them still indexing.
    pub waiting_for: Option<usize>,
    /// The pass ended in failure (the dataset is refused, with the reason, from then on).
    pub failed: bool,
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let (Some(others), true) = (self.waiting_for, self.failed) {
            return write!(
                f,
                "its opening failed after {:.1} s; the reason comes with the other datasets being opened, {others} of \
                 them still indexing",
                self.elapsed.as_secs_f64()
            );
        }
        if let Some(others) = self.waiting_for {
            // Found by a probe: a finished pass read "100 %, 0 of 1 MB scanned in 2.0 s", its
            // seconds growing while it waited for the larger datasets opened with it.
            return write!(
                f,
                "indexed in {:.1} s; it opens with the other datasets being opened, {others} of them still indexing",
                self.elapsed.as_secs_f64()
            );
        }
        let percent = self.scanned.saturating_mul(100).checked_div(self.total).unwrap_or(0);
        write!(
            f,
            "{percent} %, {} of {} MB scanned in {:.1} s",
            self.scanned / 1_000_000,
            self.total.div_ceil(1_000_000),
            self.elapsed.as_secs_f64()
        )
    }
}

#[derive(Debug)]
struct Entry {
    started: Instant,
    logged: Instant,
    scanned: u64,
    total: u64,
    /// The pass is over (after this long), but the catalog that holds the result is not in
    /// force yet.
    finished: Option<Duration>,
    /// It opened (else it failed and is refused).
    opened: bool,
}

/// The datasets being opened now.
#[derive(Debug, Default)]
pub struct Indexing {
    entries: Mutex<BTreeMap<String, Entry>>,
}

impl Indexing {
    fn entries(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `name` is about to be opened (its sessions get `dataset_indexing` until [`Indexing::clear_finished`]).
    pub fn begin(&self, name: &str, metrics: &Metrics) {
        let now = Instant::now();
        self.entries().insert(
            name.to_owned(),
            Entry { started: now, logged: now, scanned: 0, total: 0, finished: None, opened: false },
        );
        metrics.data.dataset_index_scanned_bytes.with_label_values(&[name]).set(0);
        self.publish(metrics);
    }

    /// The index pass of `name` moved.
    pub fn advance(&self, name: &str, p: IndexProgress, metrics: &Metrics) {
        let mut entries = self.entries();
        let Some(e) = entries.get_mut(name) else { return };
        e.scanned = p.bytes_done;
        e.total = p.bytes_total;
        metrics.data.dataset_index_scanned_bytes.with_label_values(&[name]).set(to_i64(p.bytes_done));
        metrics.data.dataset_index_total_bytes.with_label_values(&[name]).set(to_i64(p.bytes_total));
        if e.logged.elapsed() >= LOG_EVERY {
            e.logged = Instant::now();
            let progress = Progress {
                scanned: e.scanned,
                total: e.total,
                elapsed: e.started.elapsed(),
                waiting_for: None,
                failed: false,
            };
            tracing::info!(dataset = %name, "indexing: {progress}");
        }
    }

    /// The index pass of `name` is over (open or failed): returns how long it took. Sessions keep
    /// being told `dataset_indexing` until [`Indexing::clear_finished`], once the catalog holding the
    /// result is in force — else an `open` between the two would find the dataset nowhere.
    pub fn finish(&self, name: &str, opened: bool) -> Duration {
        let mut entries = self.entries();
        let Some(e) = entries.get_mut(name) else { return Duration::ZERO };
        let elapsed = e.started.elapsed();
        e.finished = Some(elapsed);
        e.opened = opened;
        elapsed
    }

    /// Forgets the finished openings. `in_force`: their catalog is in force now, so each is
    /// ready from now on — logged as such, with `minibatchd_dataset_ready_seconds` the time from
    /// its pass's start to now (not to its pass's end: until now its sessions were told
    /// `dataset_indexing`). Otherwise (a reload refused) they were never served.
    pub fn clear_finished(&self, metrics: &Metrics, in_force: bool) {
        self.entries().retain(|name, e| {
            if e.finished.is_none() {
                return true;
            }
            if in_force {
                let ready = e.started.elapsed();
                metrics.data.dataset_ready_seconds.with_label_values(&[name]).set(ready.as_secs_f64());
                if e.opened {
                    let elapsed_ms = u64::try_from(ready.as_millis()).unwrap_or(u64::MAX);
                    tracing::info!(dataset = %name, elapsed_ms, "dataset ready");
                }
            }
            false
        });
        self.publish(metrics);
    }

    /// Forgets every opening (they were abandoned).
    pub fn clear_all(&self, metrics: &Metrics) {
        self.entries().clear();
        self.publish(metrics);
    }

    /// The progress of `name`, if it is being opened.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<Progress> {
        let entries = self.entries();
        let indexing = entries.values().filter(|e| e.finished.is_none()).count();
        entries.get(name).map(|e| Progress {
            scanned: e.scanned,
            total: e.total,
            elapsed: e.finished.unwrap_or_else(|| e.started.elapsed()),
            waiting_for: e.finished.map(|_| indexing),
            failed: e.finished.is_some() && !e.opened,
        })
    }

    /// Datasets being opened now (or opened, until their catalog is in force).
    #[must_use]
    pub fn count(&self) -> usize {
        self.entries().len()
    }

    fn publish(&self, metrics: &Metrics) {
        metrics.data.datasets.with_label_values(&["indexing"]).set(to_i64(self.count() as u64));
    }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dataset_is_indexing_from_begin_to_end() {
        let metrics = Metrics::new().expect("metrics");
        let board = Indexing::default();
        assert!(board.get("a").is_none());
        board.begin("a", &metrics);
        board.advance("a", IndexProgress { bytes_done: 50_000_000, bytes_total: 200_000_000 }, &metrics);
        let p = board.get("a").expect("indexing");
        assert_eq!((p.scanned, p.total), (50_000_000, 200_000_000));
        assert!(p.to_string().starts_with("25 %, 50 of 200 MB scanned"), "{p}");
        assert_eq!(metrics.data.datasets.with_label_values(&["indexing"]).get(), 1);
        board.begin("b", &metrics);
        board.finish("a", true);
        let told = board.get("a").expect("told indexing until its catalog is in force").to_string();
        assert!(told.starts_with("indexed in ") && told.ends_with("1 of them still indexing"), "{told}");
        board.finish("b", false);
        board.clear_finished(&metrics, true);
        assert!(metrics.data.dataset_ready_seconds.with_label_values(&["a"]).get() > 0.0);
        assert!(board.get("a").is_none());
        assert_eq!(metrics.data.datasets.with_label_values(&["indexing"]).get(), 0);
    }
}
