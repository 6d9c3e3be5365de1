//! The control plane's metrics ([`ControlPlaneMetrics`]).

use prometheus::{CounterVec, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use super::{counter_vec, gauge_vec, reg, seconds_vec};

/// The control plane's metrics: sessions, their minibatches and waits, refusals and connections.
#[derive(Debug)]
pub struct ControlPlaneMetrics {
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
    /// ([`super::CONNECTION_REFUSALS`]: the config key, or `handshake_timeout`).
    pub connections_refused: IntCounterVec,
    /// `minibatchd_mixture_samples_total{mixture,source}`: nominal samples a mixture's sessions
    /// delivered from each source (a dataset); over all of them, the realised shares.
    pub mixture_samples: IntCounterVec,
    /// `minibatchd_mixture_target_share{mixture,source}`: the share of each source under the
    /// weights in force (quantized, as the mixture follows them) at the last minibatch delivered.
    pub mixture_target_share: GaugeVec,
}

impl ControlPlaneMetrics {
    #[allow(clippy::too_many_lines)] // a table: one declaration (name, help, labels) per metric
    pub(super) fn new(r: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
                session_minibatches: counter_vec(
                    r,
                    "minibatchd_session_minibatches_total",
                    "Minibatches delivered to sessions.",
                    &["dataset", "rank"],
                )?,
                session_samples: counter_vec(
                    r,
                    "minibatchd_session_samples_total",
                    "Nominal samples delivered to sessions.",
                    &["dataset", "rank"],
                )?,
                session_consumer_wait_seconds: seconds_vec(
                    r,
                    "minibatchd_session_consumer_wait_seconds_total",
                    "Time clients report having waited for minibatches (rate = input-bound fraction).",
                    &["dataset", "rank"],
                )?,
                session_producer_blocked_seconds: seconds_vec(
                    r,
                    "minibatchd_session_producer_blocked_seconds_total",
                    "Time session producers waited for a free ring slot.",
                    &["dataset", "rank"],
                )?,
                session_chunk_wait_seconds: seconds_vec(
                    r,
                    "minibatchd_session_chunk_wait_seconds_total",
                    "Time session producers waited for chunks to be read and parsed.",
                    &["dataset", "rank"],
                )?,
                session_memory_wait_seconds: seconds_vec(
                    r,
                    "minibatchd_session_memory_wait_seconds_total",
                    "Time session producers waited for memory_limit_bytes to have room: parsed chunks other sessions hold filled the chunk cache's share.",
                    &["dataset", "rank"],
                )?,
                session_minibatches_in_parts: counter_vec(
                    r,
                    "minibatchd_session_minibatches_in_parts_total",
                    "Minibatches whose chunks did not fit in the chunk cache's share of memory_limit_bytes together, gathered a chunk at a time (slower: a smaller randomization window avoids it).",
                    &["dataset", "rank"],
                )?,
                session_ring_slots: gauge_vec(
                    r,
                    "minibatchd_session_ring_slots",
                    "Ring slots of open sessions, by state.",
                    &["dataset", "rank", "state"],
                )?,
                session_sweep: gauge_vec(
                    r,
                    "minibatchd_session_sweep",
                    "Sweep of the last minibatch delivered.",
                    &["dataset", "rank"],
                )?,
                session_clients: gauge_vec(
                    r,
                    "minibatchd_session_clients",
                    "Open sessions with their client attached (divide consumer wait by it).",
                    &["dataset", "rank"],
                )?,
                session_first_minibatch_seconds: reg(
                    r,
                    HistogramVec::new(
                        HistogramOpts::new(
                            "minibatchd_session_first_minibatch_seconds",
                            "From a session's open to its first minibatch in the ring.",
                        )
                        .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0]),
                        &["dataset", "rank"],
                    )?,
                )?,
                sessions: gauge_vec(
                    r,
                    "minibatchd_sessions",
                    "Sessions: connected, and lingering (resumable by name).",
                    &["state"],
                )?,
                sessions_opened: counter_vec(r, "minibatchd_sessions_opened_total", "Sessions opened.", &["dataset"])?,
                sessions_refused: counter_vec(
                    r,
                    "minibatchd_sessions_refused_total",
                    "Session opens refused, by error code.",
                    &["code"],
                )?,
                equal_steps_minibatches: counter_vec(
                    r,
                    "minibatchd_equal_steps_minibatches_total",
                    "Minibatches equal steps dropped (tail=drop) or added empty (tail=pad), counted at open for the epoch.",
                    &["dataset", "tail"],
                )?,
                connections_refused: counter_vec(
                    r,
                    "minibatchd_connections_refused_total",
                    "Client connections closed by a limit: max_connections, max_connections_per_uid or handshake_timeout.",
                    &["code"],
                )?,
                mixture_samples: counter_vec(
                    r,
                    "minibatchd_mixture_samples_total",
                    "Nominal samples mixtures delivered, by source dataset (their ratio is the realised share).",
                    &["mixture", "source"],
                )?,
                mixture_target_share: reg(
                    r,
                    GaugeVec::new(
                        Opts::new(
                            "minibatchd_mixture_target_share",
                            "Share of each source under the weights in force at a mixture's last minibatch.",
                        ),
                        &["mixture", "source"],
                    )?,
                )?,
        })
    }
}
