//! Every metric of the daemon, defined in this one place (listed in `docs/metrics.md`), in one
//! [`prometheus::Registry`] served at `/metrics` by [`http`].
//!
//! Naming: prefix `minibatchd_`, base units (`_bytes`, `_seconds`), counters end in `_total`.
//! Labels are bounded: `dataset` (configured names), `stage` ([`Stage::name`]), `rank` (a session's
//! worker rank), `kind` ([`ERROR_KINDS`]), `state`/`part`/`result`/`code` (small fixed sets).
//! Never a file name, a session name or a sample id.
//!
//! Emission: the data plane counts per chunk (readahead, parsers, cache stage) and per minibatch
//! (producers, connections) through handles resolved once (a [`DatasetMetrics`] per dataset, a
//! [`SessionMetrics`] per session), never per sample. Gauges that mirror state owned elsewhere
//! (queue depths, cache size, session counts, checkpoint age) are set by the daemon's refresh
//! just before each scrape; process and host memory by the housekeeping thread.
//!
//! Series that dashboards and alert rules query are created before they have a value (every
//! dataset × error kind, every stage, every `state`/`result`), so a query never names a metric
//! that is missing from the scrape.

pub mod control;
pub mod data;
pub mod http;
pub mod ops;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Instant;

use prometheus::core::Collector;
use prometheus::{
    Counter, CounterVec, GaugeVec, Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use minibatchd_engine::format::errors::ErrorKind;

use crate::stage::Stage;

pub use control::ControlPlaneMetrics;
pub use data::DataPlaneMetrics;
pub use ops::OpsMetrics;

/// Every label name a metric may carry: bounded sets only (never a file, a session or a sample).
pub const LABEL_NAMES: [&str; 17] = [
    "dataset",
    // A configured mixture and one of its datasets (`minibatchd_mixture_*`): bounded by the
    // configuration.
    "mixture",
    "source",
    "tail",
    "outcome",
    "stage",
    "rank",
    "kind",
    "state",
    "part",
    // `index` or `inflated` (`minibatchd_state_dir_*`).
    "dir",
    "result",
    "code",
    "version",
    "protocol_version",
    "layout_version",
    // A histogram's bucket bound (`minibatchd_session_first_minibatch_seconds`): a fixed set.
    "le",
];

/// Why a connection is closed by the daemon's limits (`minibatchd_connections_refused_total{code}`).
pub const CONNECTION_REFUSALS: [&str; 3] = ["max_connections", "max_connections_per_uid", "handshake_timeout"];

/// Error codes an `open` can be refused with (`minibatchd_sessions_refused_total{code}`).
pub const REFUSAL_CODES: [&str; 9] = [
    "unknown_dataset",
    "dataset_indexing",
    "invalid_options",
    "resume_mismatch",
    "session_busy",
    "resource_exhausted",
    "shutting_down",
    "internal",
    // An `open` given up because its client went away (no reply is sent: not a protocol code).
    "client_gone",
];

/// Every parse-error kind, in [`kind_slot`] order.
pub const ERROR_KINDS: [ErrorKind; 13] = [
    ErrorKind::UnexpectedCharacter,
    ErrorKind::InvalidName,
    ErrorKind::DanglingName,
    ErrorKind::BadNumber,
    ErrorKind::DenseTooLong,
    ErrorKind::BadSparseEntry,
    ErrorKind::SparseIndexOutOfRange,
    ErrorKind::EmptyRow,
    ErrorKind::SequenceTooLong,
    ErrorKind::SequenceTooShort,
    ErrorKind::BadLine,
    ErrorKind::BadRecord,
    ErrorKind::BadExample,
];

/// Position of `k` in [`ERROR_KINDS`]. The match is exhaustive on purpose: a new kind does not
/// compile until it has a slot (and so a pre-created series).
#[must_use]
pub const fn kind_slot(k: ErrorKind) -> usize {
    match k {
        ErrorKind::UnexpectedCharacter => 0,
        ErrorKind::InvalidName => 1,
        ErrorKind::DanglingName => 2,
        ErrorKind::BadNumber => 3,
        ErrorKind::DenseTooLong => 4,
        ErrorKind::BadSparseEntry => 5,
        ErrorKind::SparseIndexOutOfRange => 6,
        ErrorKind::EmptyRow => 7,
        ErrorKind::SequenceTooLong => 8,
        ErrorKind::SequenceTooShort => 9,
        ErrorKind::BadLine => 10,
        ErrorKind::BadRecord => 11,
        ErrorKind::BadExample => 12,
    }
}

/// States of a ring slot, as the `state` label of `minibatchd_session_ring_slots`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// The producer's: free, or being filled.
    Free,
    /// Filled, its `ready` not sent yet.
    Filled,
    /// Announced to the client, not yet released.
    Leased,
}

impl SlotState {
    /// Label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Free => "free",
            Self::Filled => "filled",
            Self::Leased => "leased",
        }
    }
}

/// Distinct ranks of one dataset with series of their own; the sessions of later ranks count under
/// `rank="other"`. A node serves its own workers: 8 GPUs with 32 `DataLoader` workers each fit.
pub const RANK_SERIES: usize = 256;

/// The `rank` label value of the ranks past [`RANK_SERIES`].
pub const OTHER_RANKS: &str = "other";

/// The registry and every metric handle, by plane: [`DataPlaneMetrics`], [`ControlPlaneMetrics`]
/// and [`OpsMetrics`].
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Reading, parsing, the stages, the caches, object storage and the datasets.
    pub data: DataPlaneMetrics,
    /// Sessions and connections.
    pub control: ControlPlaneMetrics,
    /// Memory, the state directory, checkpoints, reloads and the build.
    pub ops: OpsMetrics,
    last_checkpoint: Mutex<Option<Instant>>,
    /// The ranks of each dataset that have series of their own (at most [`RANK_SERIES`]).
    ranks: Mutex<HashMap<String, HashSet<u64>>>,
}

/// Per-dataset counters of the readahead and parser stages (resolved once per dataset).
#[derive(Debug, Clone)]
pub struct DatasetMetrics {
    /// Bytes read.
    pub read_bytes: IntCounter,
    /// Chunks parsed.
    pub chunks_parsed: IntCounter,
    /// Chunks that failed.
    pub chunk_failures: IntCounter,
    parse_errors: Vec<IntCounter>,
}

impl DatasetMetrics {
    /// The parse-error counter of `kind`.
    #[must_use]
    pub fn parse_error(&self, kind: ErrorKind) -> &IntCounter {
        &self.parse_errors[kind_slot(kind)]
    }
}

/// Per-session handles (resolved once at `open`). Several sessions with the same dataset and rank
/// share series: counters add up and slot gauges are moved by deltas, so they add up too.
#[derive(Debug, Clone)]
pub struct SessionMetrics {
    /// Minibatches delivered.
    pub minibatches: IntCounter,
    /// Nominal samples delivered.
    pub samples: IntCounter,
    /// Consumer wait reported by the client.
    pub consumer_wait_seconds: Counter,
    /// Producer waiting for a free slot.
    pub producer_blocked_seconds: Counter,
    /// Producer waiting for chunks.
    pub chunk_wait_seconds: Counter,
    /// Producer waiting for memory other sessions hold.
    pub memory_wait_seconds: Counter,
    /// Minibatches gathered a chunk at a time.
    pub minibatches_in_parts: IntCounter,
    /// Delivery stage busy time (shared by every session).
    pub delivery_busy_seconds: Counter,
    /// Sweep of the last minibatch.
    pub sweep: IntGauge,
    /// Time from open to the first minibatch.
    pub first_minibatch_seconds: Histogram,
    /// Sessions of this dataset and rank with a client attached (see [`Attached`]).
    clients: IntGauge,
    slots: [IntGauge; 3],
}

impl SessionMetrics {
    /// Counts the session in `minibatchd_session_clients` until the returned guard drops.
    #[must_use]
    pub fn attached(&self) -> Attached {
        self.clients.inc();
        Attached(self.clients.clone())
    }

    /// The ring-slot gauge of `state`.
    #[must_use]
    pub fn slots(&self, state: SlotState) -> &IntGauge {
        &self.slots[state as usize]
    }
}

/// One attached session in `minibatchd_session_clients`; dropping it takes the session out, on
/// every way a session ends.
#[derive(Debug)]
pub struct Attached(IntGauge);

impl Drop for Attached {
    fn drop(&mut self) {
        self.0.dec();
    }
}

fn reg<T: Collector + Clone + 'static>(r: &Registry, c: T) -> prometheus::Result<T> {
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

fn counter_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntCounterVec> {
    reg(r, IntCounterVec::new(Opts::new(name, help), labels)?)
}

fn seconds(r: &Registry, name: &str, help: &str) -> prometheus::Result<Counter> {
    reg(r, Counter::new(name, help)?)
}

fn seconds_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> prometheus::Result<CounterVec> {
    reg(r, CounterVec::new(Opts::new(name, help), labels)?)
}

fn gauge_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntGaugeVec> {
    reg(r, IntGaugeVec::new(Opts::new(name, help), labels)?)
}

fn float_gauge_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> prometheus::Result<GaugeVec> {
    reg(r, GaugeVec::new(Opts::new(name, help), labels)?)
}

fn gauge(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntGauge> {
    reg(r, IntGauge::new(name, help)?)
}

fn counter(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntCounter> {
    reg(r, IntCounter::new(name, help)?)
}

impl Metrics {
    /// Creates and registers every metric.
    ///
    /// # Errors
    /// Only on an invalid or duplicate definition (a bug, caught by the unit tests).
    pub fn new() -> prometheus::Result<Self> {
        let r = Registry::new();
        let m = Self {
            data: DataPlaneMetrics::new(&r)?,
            control: ControlPlaneMetrics::new(&r)?,
            ops: OpsMetrics::new(&r)?,
            last_checkpoint: Mutex::new(None),
            ranks: Mutex::new(HashMap::new()),
            registry: r,
        };
        for stage in Stage::ALL.map(Stage::name) {
            for v in [&m.data.stage_queue_depth, &m.data.stage_queue_capacity, &m.data.stage_up] {
                v.with_label_values(&[stage]);
            }
            m.data.stage_busy_seconds.with_label_values(&[stage]);
            m.data.stage_restarts.with_label_values(&[stage]);
        }
        for state in ["connected", "lingering"] {
            m.control.sessions.with_label_values(&[state]);
        }
        for state in ["indexing", "ready", "failed"] {
            m.data.datasets.with_label_values(&[state]);
        }
        for code in REFUSAL_CODES {
            m.control.sessions_refused.with_label_values(&[code]);
        }
        for code in CONNECTION_REFUSALS {
            m.control.connections_refused.with_label_values(&[code]);
        }
        for part in ["cache", "rings", "sampling", "index"] {
            m.ops.memory_used_bytes.with_label_values(&[part]);
        }
        for dir in ["index", "inflated"] {
            m.ops.state_dir_bytes.with_label_values(&[dir]);
            m.ops.state_dir_files.with_label_values(&[dir]);
        }
        for result in ["success", "failure"] {
            m.ops.checkpoint_writes.with_label_values(&[result]);
        }
        // Found by a probe: `partial`, `client_gone` and the object series first appeared at 1,
        // so an `increase()` over them missed their first event.
        for result in ["success", "failure", "partial"] {
            m.ops.config_reloads.with_label_values(&[result]);
        }
        for result in ["hit", "miss"] {
            m.data.object_cache_lookups.with_label_values(&[result]);
        }
        for outcome in minibatchd_engine::remote::SharedIndexOutcome::ALL {
            m.data.object_indexes.with_label_values(&[outcome.name()]);
        }
        m.ops.config_last_reload_successful.set(1);
        let protocol = minibatchd_client::protocol::PROTOCOL_VERSION.to_string();
        let layout = minibatchd_shm::LAYOUT_VERSION.to_string();
        m.ops.build_info.with_label_values(&[env!("CARGO_PKG_VERSION"), protocol.as_str(), layout.as_str()]).set(1);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        m.ops.start_time_seconds.set(now.as_secs_f64());
        Ok(m)
    }

    /// The handles of dataset `name` (creates its series, every error kind included).
    #[must_use]
    pub fn dataset(&self, name: &str) -> DatasetMetrics {
        self.control.sessions_opened.with_label_values(&[name]);
        // Rank 0 is every non-distributed session's: its series exist before the first opens.
        self.control.session_first_minibatch_seconds.with_label_values(&[name, "0"]);
        self.control.session_clients.with_label_values(&[name, "0"]);
        // Present from the start (at 0), so the dashboard's equal-steps panel has a series.
        for tail in ["drop", "pad"] {
            self.control.equal_steps_minibatches.with_label_values(&[name, tail]);
        }
        DatasetMetrics {
            read_bytes: self.data.read_bytes.with_label_values(&[name]),
            chunks_parsed: self.data.chunks_parsed.with_label_values(&[name]),
            chunk_failures: self.data.chunk_failures.with_label_values(&[name]),
            parse_errors: ERROR_KINDS
                .iter()
                .map(|k| self.data.parse_errors.with_label_values(&[name, k.as_str()]))
                .collect(),
        }
    }

    /// The handles of a session on `dataset` with worker `rank`.
    #[must_use]
    pub fn session(&self, dataset: &str, rank: u64) -> SessionMetrics {
        let rank = self.rank_label(dataset, rank);
        let l = [dataset, rank.as_str()];
        let slot =
            |s: SlotState| self.control.session_ring_slots.with_label_values(&[dataset, rank.as_str(), s.as_str()]);
        SessionMetrics {
            minibatches: self.control.session_minibatches.with_label_values(&l),
            samples: self.control.session_samples.with_label_values(&l),
            consumer_wait_seconds: self.control.session_consumer_wait_seconds.with_label_values(&l),
            producer_blocked_seconds: self.control.session_producer_blocked_seconds.with_label_values(&l),
            chunk_wait_seconds: self.control.session_chunk_wait_seconds.with_label_values(&l),
            memory_wait_seconds: self.control.session_memory_wait_seconds.with_label_values(&l),
            minibatches_in_parts: self.control.session_minibatches_in_parts.with_label_values(&l),
            delivery_busy_seconds: self.stage_busy("delivery"),
            sweep: self.control.session_sweep.with_label_values(&l),
            first_minibatch_seconds: self.control.session_first_minibatch_seconds.with_label_values(&l),
            clients: self.control.session_clients.with_label_values(&l),
            slots: [slot(SlotState::Free), slot(SlotState::Filled), slot(SlotState::Leased)],
        }
    }

    /// Makes the series of mixture `mixture` exist before its first session: each source's
    /// samples (0) and its share at step 0 (`sources`: dataset name, share), so that a dashboard
    /// shows every configured mixture.
    pub fn mixture_series(&self, mixture: &str, sources: &[(&str, f64)]) {
        for &(source, share) in sources {
            let _ = self.control.mixture_samples.with_label_values(&[mixture, source]);
            self.control.mixture_target_share.with_label_values(&[mixture, source]).set(share);
        }
    }

    /// The `rank` label of a session of `dataset` at `rank`: the rank itself for the first
    /// [`RANK_SERIES`] distinct ranks of the dataset, `other` for the rest — a client may name any
    /// rank below 2^20, and each would otherwise add a dozen series for good.
    fn rank_label(&self, dataset: &str, rank: u64) -> String {
        let mut ranks = self.ranks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let seen = ranks.entry(dataset.to_owned()).or_default();
        if seen.contains(&rank) || seen.len() < RANK_SERIES {
            seen.insert(rank);
            rank.to_string()
        } else {
            OTHER_RANKS.to_owned()
        }
    }

    /// The busy-seconds counter of `stage`.
    #[must_use]
    pub fn stage_busy(&self, stage: &str) -> Counter {
        self.data.stage_busy_seconds.with_label_values(&[stage])
    }

    /// Records a checkpoint write.
    pub fn checkpoint_written(&self, ok: bool) {
        self.ops.checkpoint_writes.with_label_values(&[if ok { "success" } else { "failure" }]).inc();
        if ok {
            *self.last_checkpoint.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
            self.ops.checkpoint_age_seconds.set(0.0);
        }
    }

    /// Sets the checkpoint age from the last successful write (before a scrape).
    pub fn refresh_checkpoint_age(&self) {
        if let Some(t) = *self.last_checkpoint.lock().unwrap_or_else(std::sync::PoisonError::into_inner) {
            self.ops.checkpoint_age_seconds.set(t.elapsed().as_secs_f64());
        }
    }

    /// Advances an [`IntCounter`] that mirrors a cumulative count kept elsewhere.
    pub fn mirror(counter: &IntCounter, total: u64) {
        let now = counter.get();
        if total > now {
            counter.inc_by(total - now);
        }
    }

    /// The text exposition of every metric, with the old names of renamed ones ([`RENAMED`]).
    #[must_use]
    pub fn render(&self) -> String {
        prometheus::TextEncoder::new()
            .encode_to_string(&with_old_names(self.registry.gather()))
            .unwrap_or_else(|e| format!("# encoding the metrics failed: {e}\n"))
    }
}

/// Metrics renamed in this release, `(name now, name before)`: each is served under its old
/// name too, as a copy whose help names the new one, until the next release drops the old names
/// (`docs/metrics.md`, "Renamed"). The chunk cache's series were `minibatchd_cache_*`, which read
/// as any of the daemon's caches (the parsed cache and the object cache are on disk).
pub const RENAMED: [(&str, &str); 10] = [
    ("minibatchd_chunk_cache_bytes", "minibatchd_cache_bytes"),
    ("minibatchd_chunk_cache_chunks", "minibatchd_cache_chunks"),
    ("minibatchd_chunk_cache_budget_bytes", "minibatchd_cache_budget_bytes"),
    ("minibatchd_chunk_cache_hits_total", "minibatchd_cache_hits_total"),
    ("minibatchd_chunk_cache_misses_total", "minibatchd_cache_misses_total"),
    ("minibatchd_chunk_cache_evictions_total", "minibatchd_cache_evictions_total"),
    ("minibatchd_chunk_cache_over_budget_loads_total", "minibatchd_cache_over_budget_loads_total"),
    ("minibatchd_chunk_cache_refused_loads_total", "minibatchd_cache_refused_loads_total"),
    ("minibatchd_chunk_cache_shed_chunks_total", "minibatchd_cache_shed_chunks_total"),
    ("minibatchd_chunk_cache_mapped_copies_total", "minibatchd_cache_mapped_copies_total"),
];

/// `families` and, after them, a copy of each family [`RENAMED`] renamed, under its old name.
fn with_old_names(mut families: Vec<prometheus::proto::MetricFamily>) -> Vec<prometheus::proto::MetricFamily> {
    let mut old = Vec::new();
    for f in &families {
        for (now, before) in RENAMED {
            if f.name() == now {
                let mut copy = f.clone();
                copy.set_name(before.to_owned());
                copy.set_help(format!("Deprecated: the old name of {}, served until the next release.", f.name()));
                old.push(copy);
            }
        }
    }
    families.extend(old);
    families
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_conventions_and_labels_stay_bounded() {
        let m = Metrics::new().expect("metrics");
        let d = m.dataset("train");
        d.parse_error(ErrorKind::BadNumber).inc();
        let s = m.session("train", 3);
        s.minibatches.inc();
        let families = m.registry.gather();
        assert!(families.len() >= 35, "{}", families.len());
        for f in &families {
            let name = f.name();
            assert!(name.starts_with("minibatchd_"), "{name}");
            let is_counter = f.get_field_type() == prometheus::proto::MetricType::COUNTER;
            assert_eq!(is_counter, name.ends_with("_total"), "{name}: counters and only counters end in _total");
            for metric in f.get_metric() {
                for l in metric.get_label() {
                    assert!(LABEL_NAMES.contains(&l.name()), "{name}: label {}", l.name());
                }
            }
        }
        let text = m.render();
        assert!(text.contains("minibatchd_parse_errors_total{dataset=\"train\",kind=\"bad_number\"} 1"), "{text}");
        assert!(
            text.contains("minibatchd_parse_errors_total{dataset=\"train\",kind=\"bad_line\"} 0"),
            "every kind exists before its first error"
        );
        assert!(text.contains("minibatchd_session_minibatches_total{dataset=\"train\",rank=\"3\"} 1"));
        assert!(text.contains("minibatchd_stage_queue_capacity{stage=\"parsers\"} 0"));
    }

    /// Ranks a client names (any below 2^20) add series for the first `RANK_SERIES` distinct ones
    /// of a dataset only; the rest count under rank="other", and a rank seen before keeps its own.
    #[test]
    fn session_series_per_rank_are_bounded() {
        let m = Metrics::new().expect("metrics");
        let series = |m: &Metrics| {
            m.registry
                .gather()
                .iter()
                .filter(|f| f.name() == "minibatchd_session_minibatches_total")
                .map(|f| f.get_metric().len())
                .sum::<usize>()
        };
        for rank in 0..5000u64 {
            m.session("train", rank * 97).minibatches.inc();
        }
        assert_eq!(series(&m), RANK_SERIES + 1);
        m.session("train", 0).minibatches.inc();
        let text = m.render();
        assert!(text.contains("minibatchd_session_minibatches_total{dataset=\"train\",rank=\"0\"} 2"), "{text}");
        let others = 5000 - RANK_SERIES;
        assert!(
            text.contains(&format!(
                "minibatchd_session_minibatches_total{{dataset=\"train\",rank=\"other\"}} {others}"
            )),
            "{text}"
        );
        // Another dataset has its own allowance.
        m.session("test", 4242).minibatches.inc();
        assert!(m.render().contains("minibatchd_session_minibatches_total{dataset=\"test\",rank=\"4242\"} 1"));
    }

    /// A renamed metric is scraped under both names with the same value; the old name's help
    /// says which metric replaces it.
    #[test]
    fn renamed_metrics_keep_their_old_names_for_a_release() {
        let m = Metrics::new().expect("metrics");
        m.data.cache_hits.inc_by(7);
        m.data.cache_bytes.set(4096);
        let text = m.render();
        for (now, before) in [
            ("minibatchd_chunk_cache_hits_total", "minibatchd_cache_hits_total"),
            ("minibatchd_chunk_cache_bytes", "minibatchd_cache_bytes"),
        ] {
            let value = |name: &str| {
                text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' '))).map(str::to_owned)
            };
            assert!(value(now).is_some(), "{now} missing:\n{text}");
            assert_eq!(value(now), value(before), "{before} mirrors {now}");
            assert!(text.contains(&format!("# HELP {before} Deprecated: the old name of {now}")), "{text}");
        }
        let families = with_old_names(m.registry.gather());
        let names: HashSet<&str> = families.iter().map(prometheus::proto::MetricFamily::name).collect();
        assert_eq!(names.len(), families.len(), "no name served twice");
        for (now, before) in RENAMED {
            assert!(names.contains(now) && names.contains(before), "{now} is served under both names");
        }
    }

    #[test]
    fn every_error_kind_has_its_slot() {
        for (i, k) in ERROR_KINDS.iter().enumerate() {
            assert_eq!(kind_slot(*k), i, "{k:?}");
        }
    }

    #[test]
    fn mirrored_counters_only_move_forward() {
        let c = IntCounter::new("minibatchd_x_total", "x").expect("counter");
        Metrics::mirror(&c, 5);
        Metrics::mirror(&c, 3);
        Metrics::mirror(&c, 7);
        assert_eq!(c.get(), 7);
    }
}
