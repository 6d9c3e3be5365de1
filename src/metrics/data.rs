//! The data plane's metrics ([`DataPlaneMetrics`]).

use prometheus::{Counter, CounterVec, GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::{counter, counter_vec, float_gauge_vec, gauge, gauge_vec, seconds, seconds_vec};

/// The data plane's metrics: reading, parsing and the stages, the chunk cache, object storage,
/// the parsed cache and the datasets' index passes.
#[derive(Debug)]
pub struct DataPlaneMetrics {
    /// `minibatchd_read_bytes_total{dataset}`: bytes of data files read for parsed chunks.
    pub read_bytes: IntCounterVec,
    /// `minibatchd_chunks_parsed_total{dataset}`.
    pub chunks_parsed: IntCounterVec,
    /// `minibatchd_chunk_failures_total{dataset}`: chunks that failed (I/O, fatal data error).
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
    /// `minibatchd_chunk_cache_bytes`: parsed bytes in the chunk cache.
    pub cache_bytes: IntGauge,
    /// `minibatchd_object_cache_bytes`: bytes of object ranges in the on-disk object cache.
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
    /// `minibatchd_chunk_cache_chunks`.
    pub cache_chunks: IntGauge,
    /// `minibatchd_chunk_cache_budget_bytes`: what the cache may hold now.
    pub cache_budget_bytes: IntGauge,
    /// `minibatchd_parsed_cache_bytes`: bytes of entries in the parsed cache.
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
    /// `minibatchd_chunk_cache_hits_total`.
    pub cache_hits: IntCounter,
    /// `minibatchd_chunk_cache_misses_total`.
    pub cache_misses: IntCounter,
    /// `minibatchd_chunk_cache_evictions_total`.
    pub cache_evictions: IntCounter,
    /// `minibatchd_chunk_cache_over_budget_loads_total`.
    pub cache_over_budget_loads: IntCounter,
    /// `minibatchd_chunk_cache_refused_loads_total`.
    pub cache_refused_loads: IntCounter,
    /// `minibatchd_chunk_cache_shed_chunks_total`: chunks sessions let go while they waited and memory
    /// was short.
    pub cache_shed_chunks: IntCounter,
    /// `minibatchd_chunk_cache_mapped_copies_total`.
    pub cache_mapped_copies: IntCounter,
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
}

impl DataPlaneMetrics {
    /// Drops the series that describe dataset `name` as it is now (its index pass, its index's
    /// memory, how long it took to open), once a reload removed it: kept, they went on saying
    /// what a dataset no longer configured holds (found by a probe: the index memory gauges of
    /// removed datasets summed to 70 times what the daemon held), and a configuration that
    /// renames its datasets at every reload grew them without bound. Counters stay (a
    /// dataset's totals, as Prometheus keeps them), one series per name ever configured.
    pub fn forget_dataset(&self, name: &str) {
        for vec in
            [&self.dataset_index_scanned_bytes, &self.dataset_index_total_bytes, &self.dataset_index_memory_bytes]
        {
            let _ = vec.remove_label_values(&[name]);
        }
        let _ = self.dataset_ready_seconds.remove_label_values(&[name]);
    }

    #[allow(clippy::too_many_lines)] // a table: one declaration (name, help, labels) per metric
    pub(super) fn new(r: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
                read_bytes: counter_vec(
                    r,
                    "minibatchd_read_bytes_total",
                    "Bytes of data files read for parsed chunks.",
                    &["dataset"],
                )?,
                chunks_parsed: counter_vec(
                    r,
                    "minibatchd_chunks_parsed_total",
                    "Chunks parsed by the parser pool.",
                    &["dataset"],
                )?,
                chunk_failures: counter_vec(
                    r,
                    "minibatchd_chunk_failures_total",
                    "Chunks that could not be loaded (I/O, fatal data error).",
                    &["dataset"],
                )?,
                parse_errors: counter_vec(
                    r,
                    "minibatchd_parse_errors_total",
                    "Malformed places charged to max_errors, by kind.",
                    &["dataset", "kind"],
                )?,
                stage_queue_depth: gauge_vec(
                    r,
                    "minibatchd_stage_queue_depth",
                    "Items waiting in the stage's bounded input queue.",
                    &["stage"],
                )?,
                stage_queue_capacity: gauge_vec(
                    r,
                    "minibatchd_stage_queue_capacity",
                    "Capacity of the stage's bounded input queue.",
                    &["stage"],
                )?,
                stage_busy_seconds: seconds_vec(
                    r,
                    "minibatchd_stage_busy_seconds_total",
                    "Time the stage spent working, summed over its threads.",
                    &["stage"],
                )?,
                stage_restarts: counter_vec(
                    r,
                    "minibatchd_stage_restarts_total",
                    "Restarts of the stage by the supervisor.",
                    &["stage"],
                )?,
                stage_up: gauge_vec(r, "minibatchd_stage_up", "1 while the stage runs.", &["stage"])?,
                cache_bytes: gauge(r, "minibatchd_chunk_cache_bytes", "Parsed bytes held by the chunk cache.")?,
                object_cache_bytes: gauge(
                    r,
                    "minibatchd_object_cache_bytes",
                    "Bytes of object ranges in the on-disk object cache.",
                )?,
                object_cache_limit_bytes: gauge(
                    r,
                    "minibatchd_object_cache_limit_bytes",
                    "Limit of the on-disk object cache (object_cache_bytes).",
                )?,
                object_cache_lookups: gauge_vec(
                    r,
                    "minibatchd_object_cache_lookups",
                    "Object ranges found in the on-disk cache (hit) or fetched (miss) since start.",
                    &["result"],
                )?,
                object_fetched_bytes: gauge(
                    r,
                    "minibatchd_object_fetched_bytes",
                    "Bytes fetched from object storage into the object cache since start.",
                )?,
                object_indexes: gauge_vec(
                    r,
                    "minibatchd_object_indexes",
                    "Object indexes from the local cache, downloaded, or built here, since start.",
                    &["outcome"],
                )?,
                cache_chunks: gauge(r, "minibatchd_chunk_cache_chunks", "Parsed chunks held by the chunk cache.")?,
                cache_budget_bytes: gauge(
                    r,
                    "minibatchd_chunk_cache_budget_bytes",
                    "Bytes the chunk cache may hold now (limit minus rings, less any host-memory shrink).",
                )?,
                parsed_cache_bytes: gauge(
                    r,
                    "minibatchd_parsed_cache_bytes",
                    "Bytes of entries in the parsed cache.",
                )?,
                parsed_cache_limit_bytes: gauge(
                    r,
                    "minibatchd_parsed_cache_limit_bytes",
                    "Bound of the parsed cache (parsed_cache_bytes; 0 when off).",
                )?,
                parsed_cache_entries: gauge(
                    r,
                    "minibatchd_parsed_cache_entries",
                    "Chunks in the parsed cache.",
                )?,
                parsed_cache_hits: counter(
                    r,
                    "minibatchd_parsed_cache_hits_total",
                    "Chunks read back from the parsed cache instead of parsed.",
                )?,
                parsed_cache_misses: counter(
                    r,
                    "minibatchd_parsed_cache_misses_total",
                    "Chunk loads that found no usable entry in the parsed cache.",
                )?,
                parsed_cache_rejected: counter(
                    r,
                    "minibatchd_parsed_cache_rejected_total",
                    "Persisted parsed chunks refused (corrupt, truncated, stale, untrusted) and removed.",
                )?,
                parsed_cache_evictions: counter(
                    r,
                    "minibatchd_parsed_cache_evictions_total",
                    "Persisted parsed chunks removed to stay within parsed_cache_bytes.",
                )?,
                parsed_cache_write_errors: counter(
                    r,
                    "minibatchd_parsed_cache_write_errors_total",
                    "Parsed chunks that could not be persisted (disk full, permissions).",
                )?,
                parsed_cache_mapped: counter(
                    r,
                    "minibatchd_parsed_cache_mapped_total",
                    "Chunks read back from the parsed cache whose columns are the entry's mapped pages.",
                )?,
                parsed_cache_revoked: counter(
                    r,
                    "minibatchd_parsed_cache_revoked_total",
                    "Mapped persisted parsed chunks that another process opened for writing or truncated: their pages were moved into the daemon's memory before it could (the chunk is served unchanged).",
                )?,
                parsed_cache_read_bytes: counter(
                    r,
                    "minibatchd_parsed_cache_read_bytes_total",
                    "Bytes read from the parsed cache.",
                )?,
                parsed_cache_written_bytes: counter(
                    r,
                    "minibatchd_parsed_cache_written_bytes_total",
                    "Bytes written to the parsed cache.",
                )?,
                parsed_cache_deferred_seconds: seconds(
                    r,
                    "minibatchd_parsed_cache_deferred_seconds_total",
                    "Time the persister held back a parsed chunk to write while a session's producer was working.",
                )?,
                sessions_wanting_data: gauge(
                    r,
                    "minibatchd_sessions_wanting_data",
                    "Sessions whose producer is at work (a free slot to fill, or chunks to wait for): their trainers may wait for data.",
                )?,
                cache_hits: counter(r, "minibatchd_chunk_cache_hits_total", "Chunk lookups answered by the cache.")?,
                cache_misses: counter(r, "minibatchd_chunk_cache_misses_total", "Chunk lookups that had to load.")?,
                cache_evictions: counter(r, "minibatchd_chunk_cache_evictions_total", "Chunks evicted from the cache.")?,
                cache_over_budget_loads: counter(
                    r,
                    "minibatchd_chunk_cache_over_budget_loads_total",
                    "Demand loads admitted over the cache budget.",
                )?,
                cache_refused_loads: counter(
                    r,
                    "minibatchd_chunk_cache_refused_loads_total",
                    "Demand loads refused at the memory limit: the chunks sessions hold filled the cache's share (the session then let go of the chunks it did not need and waited, or failed with resource_exhausted when its own minibatch could not fit).",
                )?,
                cache_shed_chunks: counter(
                    r,
                    "minibatchd_chunk_cache_shed_chunks_total",
                    "Parsed chunks that sessions let go while they waited (for a free slot, or for memory) and the chunks other sessions hold filled the cache's share of memory_limit_bytes; loaded again when next needed.",
                )?,
                cache_mapped_copies: counter(
                    r,
                    "minibatchd_chunk_cache_mapped_copies_total",
                    "Chunks mapped from the parsed cache replaced by a copy in the daemon's memory at their second use.",
                )?,
                datasets: gauge_vec(
                    r,
                    "minibatchd_datasets",
                    "Configured datasets: indexing, ready, or failed to open.",
                    &["state"],
                )?,
                dataset_index_scanned_bytes: gauge_vec(
                    r,
                    "minibatchd_dataset_index_scanned_bytes",
                    "Bytes scanned so far by the dataset's index pass (cached files count whole).",
                    &["dataset"],
                )?,
                dataset_index_total_bytes: gauge_vec(
                    r,
                    "minibatchd_dataset_index_total_bytes",
                    "Bytes the dataset's index pass scans in all.",
                    &["dataset"],
                )?,
                dataset_ready_seconds: float_gauge_vec(
                    r,
                    "minibatchd_dataset_ready_seconds",
                    "Time the dataset's last opening took, from the start of its index pass to ready or failed.",
                    &["dataset"],
                )?,
                dataset_index_memory_bytes: gauge_vec(
                    r,
                    "minibatchd_dataset_index_memory_bytes",
                    "Memory the dataset's index holds (counted under memory_limit_bytes).",
                    &["dataset"],
                )?,
        })
    }
}
