//! The operations layer's metrics ([`OpsMetrics`]).

use prometheus::{Gauge, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::{counter_vec, gauge, gauge_vec, reg};

/// The operations layer's metrics: process and host memory, the memory budget, the state
/// directory, checkpoints, reloads and the build.
#[derive(Debug)]
pub struct OpsMetrics {
    /// `minibatchd_state_dir_bytes{dir}`: bytes of the files in `state_dir/index` and
    /// `state_dir/inflated` (index caches, decompressed gzip inputs).
    pub state_dir_bytes: IntGaugeVec,
    /// `minibatchd_state_dir_files{dir}`: their files.
    pub state_dir_files: IntGaugeVec,
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
}

impl OpsMetrics {
    #[allow(clippy::too_many_lines)] // a table: one declaration (name, help, labels) per metric
    pub(super) fn new(r: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
                state_dir_bytes: gauge_vec(
                    r,
                    "minibatchd_state_dir_bytes",
                    "Bytes of the files in state_dir/index (index caches) and state_dir/inflated (decompressed gzip inputs).",
                    &["dir"],
                )?,
                state_dir_files: gauge_vec(
                    r,
                    "minibatchd_state_dir_files",
                    "Files in state_dir/index and state_dir/inflated.",
                    &["dir"],
                )?,
                process_resident_memory_bytes: gauge(
                    r,
                    "minibatchd_process_resident_memory_bytes",
                    "Resident memory of the daemon process.",
                )?,
                process_virtual_memory_bytes: gauge(
                    r,
                    "minibatchd_process_virtual_memory_bytes",
                    "Virtual memory of the daemon process.",
                )?,
                host_memory_total_bytes: gauge(r, "minibatchd_host_memory_total_bytes", "Total memory of the host.")?,
                host_memory_available_bytes: gauge(
                    r,
                    "minibatchd_host_memory_available_bytes",
                    "Memory available on the host (MemAvailable).",
                )?,
                host_memory_shortfall_bytes: gauge(
                    r,
                    "minibatchd_host_memory_shortfall_bytes",
                    "How far available host memory is below host_memory_reserve_bytes.",
                )?,
                memory_limit_bytes: gauge(
                    r,
                    "minibatchd_memory_limit_bytes",
                    "memory_limit_bytes: budget of the chunk cache, the rings, the sessions' sweep orders, the indexes and the parser threads' read buffers.",
                )?,
                memory_used_bytes: gauge_vec(
                    r,
                    "minibatchd_memory_used_bytes",
                    "Memory used under memory_limit_bytes, by part (cache, rings, sampling, index).",
                    &["part"],
                )?,
                checkpoint_age_seconds: reg(
                    r,
                    Gauge::new(
                        "minibatchd_checkpoint_age_seconds",
                        "Seconds since the last daemon checkpoint was written.",
                    )?,
                )?,
                checkpoint_writes: counter_vec(
                    r,
                    "minibatchd_checkpoint_writes_total",
                    "Daemon checkpoint writes, by result.",
                    &["result"],
                )?,
                config_reloads: counter_vec(
                    r,
                    "minibatchd_config_reloads_total",
                    "Configuration reloads (SIGHUP), by result.",
                    &["result"],
                )?,
                config_last_reload_successful: gauge(
                    r,
                    "minibatchd_config_last_reload_successful",
                    "1 if the last configuration reload was applied.",
                )?,
                build_info: gauge_vec(
                    r,
                    "minibatchd_build_info",
                    "Build information; always 1.",
                    &["version", "protocol_version", "layout_version"],
                )?,
                start_time_seconds: reg(
                    r,
                    Gauge::new("minibatchd_start_time_seconds", "Unix time at which the daemon started.")?,
                )?,
        })
    }
}
