//! Every metric of the daemon, defined in this one place (listed in `docs/metrics.md`), in one
//! [`prometheus::Registry`] served at `/metrics` by [`http`].
//!
//! Naming: prefix `minibatchd_`, base units (`_bytes`, `_seconds`), counters end in `_total`.
//! Labels are bounded: `dataset` (configured names), `stage` ([`Stage::name`]), `rank` (a session's
//! worker rank), `kind` ([`ERROR_KINDS`]), `state`/`part`/`result`/`code` (small fixed sets).
//! Never a file name, a session name or a sample id.
//!
//! Emission: the data plane counts per chunk (reader, parsers, cache stage) and per minibatch
//! (producers, connections) through handles resolved once (a [`DatasetMetrics`] per dataset, a
//! [`SessionMetrics`] per session), never per sample. Gauges that mirror state owned elsewhere
//! (queue depths, cache size, session counts, checkpoint age) are set by the daemon's refresh
//! just before each scrape; process and host memory by the housekeeping thread.
//!
//! Series that dashboards and alert rules query are created before they have a value (every
//! dataset × error kind, every stage, every `state`/`result`), so a query never names a metric
//! that is missing from the scrape.

pub mod http;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Instant;

use prometheus::core::Collector;
use prometheus::{
    Counter, CounterVec, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

use minibatchd_engine::format::errors::ErrorKind;

use crate::stage::Stage;

/// Every label name a metric may carry: bounded sets only (never a file, a session or a sample).
pub const LABEL_NAMES: [&str; 15] = [
    "dataset",
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
pub const REFUSAL_CODES: [&str; 8] = [
    "unknown_dataset",
    "dataset_indexing",
    "invalid_options",
    "resume_mismatch",
    "session_busy",
    "resource_exhausted",
    "shutting_down",
    "internal",
];

/// Every parse-error kind, in [`kind_slot`] order.
pub const ERROR_KINDS: [ErrorKind; 11] = [
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

/// The registry and every metric handle.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// `minibatchd_read_bytes_total{dataset}`: bytes of data files read for parsed chunks.
    pub read_bytes: IntCounterVec,
    /// `minibatchd_chunks_parsed_total{dataset}`.
    pub chunks_parsed: IntCounterVec,
    /// `minibatchd_chunk_failures_total{dataset}`: chunks that failed (I/O, fatal data error,
    /// error budget spent).
    pub chunk_failures: IntCounterVec,
    /// `minibatchd_parse_errors_total{dataset,kind}`: malformed places charged to `max_errors`.
    pub parse_errors: IntCounterVec,
    /// `minibatchd_stage_queue_depth{stage}`: items waiting in the stage's input queue.
    pub stage_queue_depth: IntGaugeVec,
    /// `minibatchd_stage_queue_capacity{stage}`.
    pub stage_queue_capacity: IntGaugeVec,
    /// `minibatchd_stage_busy_seconds_total{stage}`: time spent working (summed over threads).
    pub stage_busy_seconds: CounterVec,
    /// `minibatchd_stage_restarts_total{stage}`.
    pub stage_restarts: IntCounterVec,
    /// `minibatchd_stage_up{stage}`: 1 while the stage runs.
    pub stage_up: IntGaugeVec,
    /// `minibatchd_cache_bytes`: parsed bytes in the chunk cache.
    pub cache_bytes: IntGauge,
    /// `minibatchd_object_cache_bytes`: bytes of object ranges in the on-disk chunk-range cache.
    pub object_cache_bytes: IntGauge,
    /// `minibatchd_object_cache_limit_bytes`: that cache's limit (`object_cache_bytes`).
    pub object_cache_limit_bytes: IntGauge,
    /// `minibatchd_object_cache_lookups{result}`: ranges found on disk (`hit`) or fetched
    /// (`miss`) since start (a gauge mirroring the engine's count: use it like a counter).
    pub object_cache_lookups: IntGaugeVec,
    /// `minibatchd_object_fetched_bytes`: bytes fetched from object storage into that cache since
    /// start (as above).
    pub object_fetched_bytes: IntGauge,
    /// `minibatchd_object_indexes{outcome}`: objects whose index came from the local cache
    /// (`local_cache`), was downloaded from object storage (`downloaded`), or was built here
    /// (`indexed`, `indexed_after_wait`), since start.
    pub object_indexes: IntGaugeVec,
    /// `minibatchd_cache_chunks`.
    pub cache_chunks: IntGauge,
    /// `minibatchd_cache_budget_bytes`: what the cache may hold now.
    pub cache_budget_bytes: IntGauge,
    /// `minibatchd_state_dir_bytes{dir}`: bytes of the files in `state_dir/index` and
    /// `state_dir/inflated` (index caches, decompressed gzip inputs).
    pub state_dir_bytes: IntGaugeVec,
    /// `minibatchd_state_dir_files{dir}`: their files.
    pub state_dir_files: IntGaugeVec,
    /// `minibatchd_parsed_cache_bytes`: bytes of entries in the persisted parsed-chunk cache.
    pub parsed_cache_bytes: IntGauge,
    /// `minibatchd_parsed_cache_limit_bytes`: its bound (`parsed_cache_bytes`; 0 when off).
    pub parsed_cache_limit_bytes: IntGauge,
    /// `minibatchd_parsed_cache_entries`: its entries (chunks).
    pub parsed_cache_entries: IntGauge,
    /// `minibatchd_parsed_cache_hits_total`: chunks read back instead of parsed.
    pub parsed_cache_hits: IntCounter,
    /// `minibatchd_parsed_cache_misses_total`: chunk loads that found no usable entry.
    pub parsed_cache_misses: IntCounter,
    /// `minibatchd_parsed_cache_rejected_total`: entries refused (corrupt, stale) and removed.
    pub parsed_cache_rejected: IntCounter,
    /// `minibatchd_parsed_cache_evictions_total`: entries removed to stay within the bound.
    pub parsed_cache_evictions: IntCounter,
    /// `minibatchd_parsed_cache_write_errors_total`: entries that could not be written.
    pub parsed_cache_write_errors: IntCounter,
    /// `minibatchd_parsed_cache_mapped_total`: of the hits, chunks served from the entry's mapping.
    pub parsed_cache_mapped: IntCounter,
    /// `minibatchd_parsed_cache_revoked_total`: mapped entries another process opened for writing
    /// or truncated, moved into the daemon's memory first.
    pub parsed_cache_revoked: IntCounter,
    /// `minibatchd_parsed_cache_read_bytes_total`: bytes read from entries.
    pub parsed_cache_read_bytes: IntCounter,
    /// `minibatchd_parsed_cache_written_bytes_total`: bytes written to entries.
    pub parsed_cache_written_bytes: IntCounter,
    /// `minibatchd_parsed_cache_deferred_seconds_total`: time the persister held back a chunk to
    /// write while a session's producer was working.
    pub parsed_cache_deferred_seconds: Counter,
    /// `minibatchd_sessions_wanting_data`: sessions whose producer is at work (a free slot to
    /// fill, or chunks to wait for): their trainers may be waiting for data.
    pub sessions_wanting_data: IntGauge,
    /// `minibatchd_cache_hits_total`.
    pub cache_hits: IntCounter,
    /// `minibatchd_cache_misses_total`.
    pub cache_misses: IntCounter,
    /// `minibatchd_cache_evictions_total`.
    pub cache_evictions: IntCounter,
    /// `minibatchd_cache_over_budget_loads_total`.
    pub cache_over_budget_loads: IntCounter,
    /// `minibatchd_cache_refused_loads_total`.
    pub cache_refused_loads: IntCounter,
    /// `minibatchd_cache_shed_chunks_total`: chunks sessions let go while they waited and memory
    /// was short.
    pub cache_shed_chunks: IntCounter,
    /// `minibatchd_cache_mapped_copies_total`.
    pub cache_mapped_copies: IntCounter,
    /// `minibatchd_session_minibatches_total{dataset,rank}`: minibatches delivered (announced).
    pub session_minibatches: IntCounterVec,
    /// `minibatchd_session_samples_total{dataset,rank}`: nominal samples delivered.
    pub session_samples: IntCounterVec,
    /// `minibatchd_session_consumer_wait_seconds_total{dataset,rank}`: time clients report
    /// having waited for minibatches; its rate is the input-bound fraction.
    pub session_consumer_wait_seconds: CounterVec,
    /// `minibatchd_session_producer_blocked_seconds_total{dataset,rank}`: producers waiting for a
    /// free slot (the client is the bottleneck).
    pub session_producer_blocked_seconds: CounterVec,
    /// `minibatchd_session_chunk_wait_seconds_total{dataset,rank}`: producers waiting for chunks
    /// to be read and parsed (the pipeline is the bottleneck).
    pub session_chunk_wait_seconds: CounterVec,
    /// `minibatchd_session_memory_wait_seconds_total{dataset,rank}`: producers waiting for memory
    /// that other sessions hold (the memory limit is the bottleneck).
    pub session_memory_wait_seconds: CounterVec,
    /// `minibatchd_session_minibatches_in_parts_total{dataset,rank}`: minibatches whose chunks
    /// did not fit in memory together, gathered a chunk at a time.
    pub session_minibatches_in_parts: IntCounterVec,
    /// `minibatchd_session_ring_slots{dataset,rank,state}`.
    pub session_ring_slots: IntGaugeVec,
    /// `minibatchd_session_sweep{dataset,rank}`: sweep of the last minibatch delivered.
    pub session_sweep: IntGaugeVec,
    /// `minibatchd_session_clients{dataset,rank}`: open sessions with their client attached; the
    /// denominator of the input-bound fraction when several sessions share a rank label.
    pub session_clients: IntGaugeVec,
    /// `minibatchd_session_first_minibatch_seconds{dataset,rank}`: from a session's `open` to its
    /// first minibatch in the ring (time to first minibatch).
    pub session_first_minibatch_seconds: HistogramVec,
    /// `minibatchd_sessions{state}`: `connected` and `lingering` sessions.
    pub sessions: IntGaugeVec,
    /// `minibatchd_sessions_opened_total{dataset}`.
    pub sessions_opened: IntCounterVec,
    /// `minibatchd_sessions_refused_total{code}`: `open`s refused, by protocol error code.
    pub sessions_refused: IntCounterVec,
    /// `minibatchd_equal_steps_minibatches_total{dataset,tail}`: minibatches that equal steps
    /// drop (`tail="drop"`) or add empty (`tail="pad"`), counted when a session opens for its
    /// whole epoch.
    pub equal_steps_minibatches: IntCounterVec,
    /// `minibatchd_connections_refused_total{code}`: connections closed by a limit
    /// ([`CONNECTION_REFUSALS`]: the config key, or `handshake_timeout`).
    pub connections_refused: IntCounterVec,
    /// `minibatchd_datasets{state}`: `indexing`, `ready` and `failed` datasets.
    pub datasets: IntGaugeVec,
    /// `minibatchd_dataset_index_scanned_bytes{dataset}`: bytes the index pass of the dataset's
    /// current opening has scanned (cached files count whole).
    pub dataset_index_scanned_bytes: IntGaugeVec,
    /// `minibatchd_dataset_index_total_bytes{dataset}`: the bytes that opening scans in all.
    pub dataset_index_total_bytes: IntGaugeVec,
    /// `minibatchd_dataset_ready_seconds{dataset}`: how long the dataset's last opening took,
    /// from the start of its index pass to ready (or failed).
    pub dataset_ready_seconds: GaugeVec,
    /// `minibatchd_dataset_index_memory_bytes{dataset}`: memory its index holds (counted under
    /// `memory_limit_bytes`).
    pub dataset_index_memory_bytes: IntGaugeVec,
    /// `minibatchd_process_resident_memory_bytes` (sysinfo).
    pub process_resident_memory_bytes: IntGauge,
    /// `minibatchd_process_virtual_memory_bytes` (sysinfo).
    pub process_virtual_memory_bytes: IntGauge,
    /// `minibatchd_host_memory_total_bytes` (sysinfo).
    pub host_memory_total_bytes: IntGauge,
    /// `minibatchd_host_memory_available_bytes` (sysinfo).
    pub host_memory_available_bytes: IntGauge,
    /// `minibatchd_host_memory_shortfall_bytes`: how far available memory is below
    /// `host_memory_reserve_bytes` (0 when it is not).
    pub host_memory_shortfall_bytes: IntGauge,
    /// `minibatchd_memory_limit_bytes`: `memory_limit_bytes`.
    pub memory_limit_bytes: IntGauge,
    /// `minibatchd_memory_used_bytes{part}`: `cache`, `rings`, `sampling` and `index`, all under
    /// the limit.
    pub memory_used_bytes: IntGaugeVec,
    /// `minibatchd_checkpoint_age_seconds`: since the last checkpoint written.
    pub checkpoint_age_seconds: Gauge,
    /// `minibatchd_checkpoint_writes_total{result}`.
    pub checkpoint_writes: IntCounterVec,
    /// `minibatchd_config_reloads_total{result}`.
    pub config_reloads: IntCounterVec,
    /// `minibatchd_config_last_reload_successful`.
    pub config_last_reload_successful: IntGauge,
    /// `minibatchd_build_info{version,protocol_version,layout_version}`: always 1.
    pub build_info: IntGaugeVec,
    /// `minibatchd_start_time_seconds`: Unix time of the daemon's start.
    pub start_time_seconds: Gauge,
    last_checkpoint: Mutex<Option<Instant>>,
    /// The ranks of each dataset that have series of their own (at most [`RANK_SERIES`]).
    ranks: Mutex<HashMap<String, HashSet<u64>>>,
}

/// Per-dataset counters of the reader and parser stages (resolved once per dataset).
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
    #[allow(clippy::too_many_lines)] // a table: one declaration (name, help, labels) per metric
    pub fn new() -> prometheus::Result<Self> {
        let r = Registry::new();
        let m = Self {
            read_bytes: counter_vec(
                &r,
                "minibatchd_read_bytes_total",
                "Bytes of data files read for parsed chunks.",
                &["dataset"],
            )?,
            chunks_parsed: counter_vec(
                &r,
                "minibatchd_chunks_parsed_total",
                "Chunks parsed by the parser pool.",
                &["dataset"],
            )?,
            chunk_failures: counter_vec(
                &r,
                "minibatchd_chunk_failures_total",
                "Chunks that could not be loaded (I/O, fatal data error, max_errors spent).",
                &["dataset"],
            )?,
            parse_errors: counter_vec(
                &r,
                "minibatchd_parse_errors_total",
                "Malformed places charged to max_errors, by kind.",
                &["dataset", "kind"],
            )?,
            stage_queue_depth: gauge_vec(
                &r,
                "minibatchd_stage_queue_depth",
                "Items waiting in the stage's bounded input queue.",
                &["stage"],
            )?,
            stage_queue_capacity: gauge_vec(
                &r,
                "minibatchd_stage_queue_capacity",
                "Capacity of the stage's bounded input queue.",
                &["stage"],
            )?,
            stage_busy_seconds: seconds_vec(
                &r,
                "minibatchd_stage_busy_seconds_total",
                "Time the stage spent working, summed over its threads.",
                &["stage"],
            )?,
            stage_restarts: counter_vec(
                &r,
                "minibatchd_stage_restarts_total",
                "Restarts of the stage by the supervisor.",
                &["stage"],
            )?,
            stage_up: gauge_vec(&r, "minibatchd_stage_up", "1 while the stage runs.", &["stage"])?,
            cache_bytes: gauge(&r, "minibatchd_cache_bytes", "Parsed bytes held by the chunk cache.")?,
            object_cache_bytes: gauge(
                &r,
                "minibatchd_object_cache_bytes",
                "Bytes of object ranges in the on-disk chunk-range cache.",
            )?,
            object_cache_limit_bytes: gauge(
                &r,
                "minibatchd_object_cache_limit_bytes",
                "Limit of the on-disk chunk-range cache (object_cache_bytes).",
            )?,
            object_cache_lookups: gauge_vec(
                &r,
                "minibatchd_object_cache_lookups",
                "Object ranges found in the on-disk cache (hit) or fetched (miss) since start.",
                &["result"],
            )?,
            object_fetched_bytes: gauge(
                &r,
                "minibatchd_object_fetched_bytes",
                "Bytes fetched from object storage into the chunk-range cache since start.",
            )?,
            object_indexes: gauge_vec(
                &r,
                "minibatchd_object_indexes",
                "Object indexes from the local cache, downloaded, or built here, since start.",
                &["outcome"],
            )?,
            cache_chunks: gauge(&r, "minibatchd_cache_chunks", "Parsed chunks held by the chunk cache.")?,
            cache_budget_bytes: gauge(
                &r,
                "minibatchd_cache_budget_bytes",
                "Bytes the chunk cache may hold now (limit minus rings, less any host-memory shrink).",
            )?,
            state_dir_bytes: gauge_vec(
                &r,
                "minibatchd_state_dir_bytes",
                "Bytes of the files in state_dir/index (index caches) and state_dir/inflated (decompressed gzip inputs).",
                &["dir"],
            )?,
            state_dir_files: gauge_vec(
                &r,
                "minibatchd_state_dir_files",
                "Files in state_dir/index and state_dir/inflated.",
                &["dir"],
            )?,
            parsed_cache_bytes: gauge(
                &r,
                "minibatchd_parsed_cache_bytes",
                "Bytes of entries in the persisted parsed-chunk cache.",
            )?,
            parsed_cache_limit_bytes: gauge(
                &r,
                "minibatchd_parsed_cache_limit_bytes",
                "Bound of the persisted parsed-chunk cache (parsed_cache_bytes; 0 when off).",
            )?,
            parsed_cache_entries: gauge(
                &r,
                "minibatchd_parsed_cache_entries",
                "Chunks in the persisted parsed-chunk cache.",
            )?,
            parsed_cache_hits: counter(
                &r,
                "minibatchd_parsed_cache_hits_total",
                "Chunks read back from the persisted parsed-chunk cache instead of parsed.",
            )?,
            parsed_cache_misses: counter(
                &r,
                "minibatchd_parsed_cache_misses_total",
                "Chunk loads that found no usable entry in the persisted parsed-chunk cache.",
            )?,
            parsed_cache_rejected: counter(
                &r,
                "minibatchd_parsed_cache_rejected_total",
                "Persisted parsed chunks refused (corrupt, truncated, stale, untrusted) and removed.",
            )?,
            parsed_cache_evictions: counter(
                &r,
                "minibatchd_parsed_cache_evictions_total",
                "Persisted parsed chunks removed to stay within parsed_cache_bytes.",
            )?,
            parsed_cache_write_errors: counter(
                &r,
                "minibatchd_parsed_cache_write_errors_total",
                "Parsed chunks that could not be persisted (disk full, permissions).",
            )?,
            parsed_cache_mapped: counter(
                &r,
                "minibatchd_parsed_cache_mapped_total",
                "Chunks read back from the persisted cache whose columns are the entry's mapped pages.",
            )?,
            parsed_cache_revoked: counter(
                &r,
                "minibatchd_parsed_cache_revoked_total",
                "Mapped persisted parsed chunks that another process opened for writing or truncated: their pages were moved into the daemon's memory before it could (the chunk is served unchanged).",
            )?,
            parsed_cache_read_bytes: counter(
                &r,
                "minibatchd_parsed_cache_read_bytes_total",
                "Bytes read from the persisted parsed-chunk cache.",
            )?,
            parsed_cache_written_bytes: counter(
                &r,
                "minibatchd_parsed_cache_written_bytes_total",
                "Bytes written to the persisted parsed-chunk cache.",
            )?,
            parsed_cache_deferred_seconds: seconds(
                &r,
                "minibatchd_parsed_cache_deferred_seconds_total",
                "Time the persister held back a parsed chunk to write while a session's producer was working.",
            )?,
            sessions_wanting_data: gauge(
                &r,
                "minibatchd_sessions_wanting_data",
                "Sessions whose producer is at work (a free slot to fill, or chunks to wait for): their trainers may wait for data.",
            )?,
            cache_hits: counter(&r, "minibatchd_cache_hits_total", "Chunk lookups answered by the cache.")?,
            cache_misses: counter(&r, "minibatchd_cache_misses_total", "Chunk lookups that had to load.")?,
            cache_evictions: counter(&r, "minibatchd_cache_evictions_total", "Chunks evicted from the cache.")?,
            cache_over_budget_loads: counter(
                &r,
                "minibatchd_cache_over_budget_loads_total",
                "Demand loads admitted over the cache budget.",
            )?,
            cache_refused_loads: counter(
                &r,
                "minibatchd_cache_refused_loads_total",
                "Demand loads refused at the memory limit: the chunks sessions hold filled the cache's share (the session then let go of the chunks it did not need and waited, or failed with resource_exhausted when its own minibatch could not fit).",
            )?,
            cache_shed_chunks: counter(
                &r,
                "minibatchd_cache_shed_chunks_total",
                "Parsed chunks that sessions let go while they waited (for a free slot, or for memory) and the chunks other sessions hold filled the cache's share of memory_limit_bytes; loaded again when next needed.",
            )?,
            cache_mapped_copies: counter(
                &r,
                "minibatchd_cache_mapped_copies_total",
                "Chunks mapped from the persisted cache replaced by a copy in the daemon's memory at their second use.",
            )?,
            session_minibatches: counter_vec(
                &r,
                "minibatchd_session_minibatches_total",
                "Minibatches delivered to sessions.",
                &["dataset", "rank"],
            )?,
            session_samples: counter_vec(
                &r,
                "minibatchd_session_samples_total",
                "Nominal samples delivered to sessions.",
                &["dataset", "rank"],
            )?,
            session_consumer_wait_seconds: seconds_vec(
                &r,
                "minibatchd_session_consumer_wait_seconds_total",
                "Time clients report having waited for minibatches (rate = input-bound fraction).",
                &["dataset", "rank"],
            )?,
            session_producer_blocked_seconds: seconds_vec(
                &r,
                "minibatchd_session_producer_blocked_seconds_total",
                "Time session producers waited for a free ring slot.",
                &["dataset", "rank"],
            )?,
            session_chunk_wait_seconds: seconds_vec(
                &r,
                "minibatchd_session_chunk_wait_seconds_total",
                "Time session producers waited for chunks to be read and parsed.",
                &["dataset", "rank"],
            )?,
            session_memory_wait_seconds: seconds_vec(
                &r,
                "minibatchd_session_memory_wait_seconds_total",
                "Time session producers waited for memory_limit_bytes to have room: parsed chunks other sessions hold filled the chunk cache's share.",
                &["dataset", "rank"],
            )?,
            session_minibatches_in_parts: counter_vec(
                &r,
                "minibatchd_session_minibatches_in_parts_total",
                "Minibatches whose chunks did not fit in the chunk cache's share of memory_limit_bytes together, gathered a chunk at a time (slower: a smaller randomization window avoids it).",
                &["dataset", "rank"],
            )?,
            session_ring_slots: gauge_vec(
                &r,
                "minibatchd_session_ring_slots",
                "Ring slots of open sessions, by state.",
                &["dataset", "rank", "state"],
            )?,
            session_sweep: gauge_vec(
                &r,
                "minibatchd_session_sweep",
                "Sweep of the last minibatch delivered.",
                &["dataset", "rank"],
            )?,
            session_first_minibatch_seconds: reg(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "minibatchd_session_first_minibatch_seconds",
                        "From a session's open to its first minibatch in the ring.",
                    )
                    .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0]),
                    &["dataset", "rank"],
                )?,
            )?,
            session_clients: gauge_vec(
                &r,
                "minibatchd_session_clients",
                "Open sessions with their client attached (divide consumer wait by it).",
                &["dataset", "rank"],
            )?,
            sessions: gauge_vec(
                &r,
                "minibatchd_sessions",
                "Sessions: connected, and lingering (resumable by name).",
                &["state"],
            )?,
            sessions_opened: counter_vec(&r, "minibatchd_sessions_opened_total", "Sessions opened.", &["dataset"])?,
            sessions_refused: counter_vec(
                &r,
                "minibatchd_sessions_refused_total",
                "Session opens refused, by error code.",
                &["code"],
            )?,
            equal_steps_minibatches: counter_vec(
                &r,
                "minibatchd_equal_steps_minibatches_total",
                "Minibatches equal steps dropped (tail=drop) or added empty (tail=pad), counted at open for the epoch.",
                &["dataset", "tail"],
            )?,
            connections_refused: counter_vec(
                &r,
                "minibatchd_connections_refused_total",
                "Client connections closed by a limit: max_connections, max_connections_per_uid or handshake_timeout.",
                &["code"],
            )?,
            datasets: gauge_vec(
                &r,
                "minibatchd_datasets",
                "Configured datasets: indexing, ready, or failed to open.",
                &["state"],
            )?,
            dataset_index_scanned_bytes: gauge_vec(
                &r,
                "minibatchd_dataset_index_scanned_bytes",
                "Bytes scanned so far by the dataset's index pass (cached files count whole).",
                &["dataset"],
            )?,
            dataset_index_total_bytes: gauge_vec(
                &r,
                "minibatchd_dataset_index_total_bytes",
                "Bytes the dataset's index pass scans in all.",
                &["dataset"],
            )?,
            dataset_ready_seconds: float_gauge_vec(
                &r,
                "minibatchd_dataset_ready_seconds",
                "Time the dataset's last opening took, from the start of its index pass to ready or failed.",
                &["dataset"],
            )?,
            dataset_index_memory_bytes: gauge_vec(
                &r,
                "minibatchd_dataset_index_memory_bytes",
                "Memory the dataset's index holds (counted under memory_limit_bytes).",
                &["dataset"],
            )?,
            process_resident_memory_bytes: gauge(
                &r,
                "minibatchd_process_resident_memory_bytes",
                "Resident memory of the daemon process.",
            )?,
            process_virtual_memory_bytes: gauge(
                &r,
                "minibatchd_process_virtual_memory_bytes",
                "Virtual memory of the daemon process.",
            )?,
            host_memory_total_bytes: gauge(&r, "minibatchd_host_memory_total_bytes", "Total memory of the host.")?,
            host_memory_available_bytes: gauge(
                &r,
                "minibatchd_host_memory_available_bytes",
                "Memory available on the host (MemAvailable).",
            )?,
            host_memory_shortfall_bytes: gauge(
                &r,
                "minibatchd_host_memory_shortfall_bytes",
                "How far available host memory is below host_memory_reserve_bytes.",
            )?,
            memory_limit_bytes: gauge(
                &r,
                "minibatchd_memory_limit_bytes",
                "memory_limit_bytes: budget of the chunk cache, the rings, the sessions' sweep orders, the indexes and the parser threads' read buffers.",
            )?,
            memory_used_bytes: gauge_vec(
                &r,
                "minibatchd_memory_used_bytes",
                "Memory used under memory_limit_bytes, by part (cache, rings, sampling, index).",
                &["part"],
            )?,
            checkpoint_age_seconds: reg(
                &r,
                Gauge::new(
                    "minibatchd_checkpoint_age_seconds",
                    "Seconds since the last daemon checkpoint was written.",
                )?,
            )?,
            checkpoint_writes: counter_vec(
                &r,
                "minibatchd_checkpoint_writes_total",
                "Daemon checkpoint writes, by result.",
                &["result"],
            )?,
            config_reloads: counter_vec(
                &r,
                "minibatchd_config_reloads_total",
                "Configuration reloads (SIGHUP), by result.",
                &["result"],
            )?,
            config_last_reload_successful: gauge(
                &r,
                "minibatchd_config_last_reload_successful",
                "1 if the last configuration reload was applied.",
            )?,
            build_info: gauge_vec(
                &r,
                "minibatchd_build_info",
                "Build information; always 1.",
                &["version", "protocol_version", "layout_version"],
            )?,
            start_time_seconds: reg(
                &r,
                Gauge::new("minibatchd_start_time_seconds", "Unix time at which the daemon started.")?,
            )?,
            last_checkpoint: Mutex::new(None),
            ranks: Mutex::new(HashMap::new()),
            registry: r,
        };
        for stage in Stage::ALL.map(Stage::name) {
            for v in [&m.stage_queue_depth, &m.stage_queue_capacity, &m.stage_up] {
                v.with_label_values(&[stage]);
            }
            m.stage_busy_seconds.with_label_values(&[stage]);
            m.stage_restarts.with_label_values(&[stage]);
        }
        for state in ["connected", "lingering"] {
            m.sessions.with_label_values(&[state]);
        }
        for state in ["indexing", "ready", "failed"] {
            m.datasets.with_label_values(&[state]);
        }
        for code in REFUSAL_CODES {
            m.sessions_refused.with_label_values(&[code]);
        }
        for code in CONNECTION_REFUSALS {
            m.connections_refused.with_label_values(&[code]);
        }
        for part in ["cache", "rings", "sampling", "index"] {
            m.memory_used_bytes.with_label_values(&[part]);
        }
        for dir in ["index", "inflated"] {
            m.state_dir_bytes.with_label_values(&[dir]);
            m.state_dir_files.with_label_values(&[dir]);
        }
        for result in ["success", "failure"] {
            m.checkpoint_writes.with_label_values(&[result]);
            m.config_reloads.with_label_values(&[result]);
        }
        m.config_last_reload_successful.set(1);
        let protocol = minibatchd_client::protocol::PROTOCOL_VERSION.to_string();
        let layout = minibatchd_shm::LAYOUT_VERSION.to_string();
        m.build_info.with_label_values(&[env!("CARGO_PKG_VERSION"), protocol.as_str(), layout.as_str()]).set(1);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        m.start_time_seconds.set(now.as_secs_f64());
        Ok(m)
    }

    /// The handles of dataset `name` (creates its series, every error kind included).
    #[must_use]
    pub fn dataset(&self, name: &str) -> DatasetMetrics {
        self.sessions_opened.with_label_values(&[name]);
        // Rank 0 is every non-distributed session's: its series exist before the first opens.
        self.session_first_minibatch_seconds.with_label_values(&[name, "0"]);
        self.session_clients.with_label_values(&[name, "0"]);
        // Present from the start (at 0), so the dashboard's equal-steps panel has a series.
        for tail in ["drop", "pad"] {
            self.equal_steps_minibatches.with_label_values(&[name, tail]);
        }
        DatasetMetrics {
            read_bytes: self.read_bytes.with_label_values(&[name]),
            chunks_parsed: self.chunks_parsed.with_label_values(&[name]),
            chunk_failures: self.chunk_failures.with_label_values(&[name]),
            parse_errors: ERROR_KINDS
                .iter()
                .map(|k| self.parse_errors.with_label_values(&[name, k.as_str()]))
                .collect(),
        }
    }

    /// The handles of a session on `dataset` with worker `rank`.
    #[must_use]
    pub fn session(&self, dataset: &str, rank: u64) -> SessionMetrics {
        let rank = self.rank_label(dataset, rank);
        let l = [dataset, rank.as_str()];
        let slot = |s: SlotState| self.session_ring_slots.with_label_values(&[dataset, rank.as_str(), s.as_str()]);
        SessionMetrics {
            minibatches: self.session_minibatches.with_label_values(&l),
            samples: self.session_samples.with_label_values(&l),
            consumer_wait_seconds: self.session_consumer_wait_seconds.with_label_values(&l),
            producer_blocked_seconds: self.session_producer_blocked_seconds.with_label_values(&l),
            chunk_wait_seconds: self.session_chunk_wait_seconds.with_label_values(&l),
            memory_wait_seconds: self.session_memory_wait_seconds.with_label_values(&l),
            minibatches_in_parts: self.session_minibatches_in_parts.with_label_values(&l),
            delivery_busy_seconds: self.stage_busy("delivery"),
            sweep: self.session_sweep.with_label_values(&l),
            first_minibatch_seconds: self.session_first_minibatch_seconds.with_label_values(&l),
            clients: self.session_clients.with_label_values(&l),
            slots: [slot(SlotState::Free), slot(SlotState::Filled), slot(SlotState::Leased)],
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
        self.stage_busy_seconds.with_label_values(&[stage])
    }

    /// Records a checkpoint write.
    pub fn checkpoint_written(&self, ok: bool) {
        self.checkpoint_writes.with_label_values(&[if ok { "success" } else { "failure" }]).inc();
        if ok {
            *self.last_checkpoint.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
            self.checkpoint_age_seconds.set(0.0);
        }
    }

    /// Sets the checkpoint age from the last successful write (before a scrape).
    pub fn refresh_checkpoint_age(&self) {
        if let Some(t) = *self.last_checkpoint.lock().unwrap_or_else(std::sync::PoisonError::into_inner) {
            self.checkpoint_age_seconds.set(t.elapsed().as_secs_f64());
        }
    }

    /// Advances an [`IntCounter`] that mirrors a cumulative count kept elsewhere.
    pub fn mirror(counter: &IntCounter, total: u64) {
        let now = counter.get();
        if total > now {
            counter.inc_by(total - now);
        }
    }

    /// The text exposition of every metric.
    #[must_use]
    pub fn render(&self) -> String {
        prometheus::TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|e| format!("# encoding the metrics failed: {e}\n"))
    }
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
