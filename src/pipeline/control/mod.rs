//! The control plane: the Unix socket, one task per client connection speaking the protocol, the
//! session registry (names, lingering sessions, ring memory) and the admission of new sessions.
//!
//! Plain logic: [`session`] (options, resume checks, slot leases, positions, the registry) and
//! [`admission`] (the decision of `open`: name, starting state, memory — and its undo). Thin
//! adapters: [`server`] (the session-manager actor that owns the socket), [`connection`] (the
//! async task per client) and `active` (opening a session for a connection: ring, producer,
//! `opened`).
//!
//! [`ControlPlane`] is what they share: the configuration in force, the registry, the host-memory
//! guard's verdict, the live connections, and the [`DataPlane`] whose producers they start. It
//! imports the data plane, never the other way round; operations import both.

mod active;
pub mod admission;
pub mod connection;
pub mod server;
pub mod session;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use crate::config::Config;

use super::data::hub::Hub;
use super::data::{read_buffer_bytes, DataPlane};
use session::Registry;

/// Share of `memory_limit_bytes` that rings may never take from the chunk cache: one part in
/// this many (a quarter).
pub const CACHE_FLOOR_DIVISOR: u64 = 4;

/// The host-memory guard's current decision (set by the housekeeping thread).
#[derive(Debug)]
pub struct HostState {
    /// Cap on the chunk cache's budget (`u64::MAX`: none).
    pub cap: AtomicU64,
    /// How far the host is below `host_memory_reserve_bytes`.
    pub shortfall: AtomicU64,
    /// New sessions are refused: the cache cannot cover the shortfall.
    pub refuse: AtomicBool,
}

impl Default for HostState {
    fn default() -> Self {
        Self { cap: AtomicU64::new(u64::MAX), shortfall: AtomicU64::new(0), refuse: AtomicBool::new(false) }
    }
}

/// Counts live client connections, so a shutdown can wait for their grace period to end.
#[derive(Debug, Default)]
pub struct Connections {
    count: AtomicUsize,
    idle: tokio::sync::Notify,
}

/// Held by a connection task while it runs.
#[derive(Debug)]
pub struct ConnectionGuard<'a>(&'a Connections);

impl Drop for ConnectionGuard<'_> {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::AcqRel);
        self.0.idle.notify_one();
    }
}

impl Connections {
    /// A connection starts.
    pub fn enter(&self) -> ConnectionGuard<'_> {
        self.count.fetch_add(1, Ordering::AcqRel);
        ConnectionGuard(self)
    }

    /// Connections alive.
    #[must_use]
    pub fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Returns once no connection is left.
    pub async fn wait_idle(&self) {
        while self.count() > 0 {
            self.idle.notified().await;
        }
    }
}

/// Daemon-wide state of the control plane (and, through [`ControlPlane::data`], of the data plane).
#[derive(Debug)]
pub struct ControlPlane {
    config: RwLock<Arc<Config>>,
    /// Random id of this daemon start (in every ring header and `hello`).
    pub daemon_id: u64,
    /// The data plane.
    pub data: Arc<DataPlane>,
    registry: Mutex<Registry>,
    /// The host-memory guard's decision.
    pub host: HostState,
    /// Live connections.
    pub connections: Connections,
    /// Serializes checkpoint writers (periodic, on reload, at start and stop).
    pub checkpoint_lock: Mutex<()>,
}

impl ControlPlane {
    /// The control plane for `config` over the opened `hub`, counting into `metrics`.
    #[must_use]
    pub fn new(config: Config, hub: Hub, metrics: crate::metrics::Metrics) -> Self {
        let threads = super::data::parser_threads(&config);
        let mut registry = Registry::new(0, 0, Duration::ZERO);
        apply_memory_limits(&mut registry, &config, &hub, threads);
        let data = Arc::new(DataPlane::new(&config, hub, metrics, threads, registry.cache_budget()));
        Self {
            config: RwLock::new(Arc::new(config)),
            daemon_id: new_daemon_id(),
            data,
            registry: Mutex::new(registry),
            host: HostState::default(),
            connections: Connections::default(),
            checkpoint_lock: Mutex::new(()),
        }
    }

    /// The session registry.
    pub fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<Config> {
        self.config.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Swaps in a reloaded configuration and its datasets, and tells the connections.
    pub fn replace(&self, config: Config, hub: Hub) {
        self.data.replace_hub(hub);
        *self.config.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(config);
    }

    /// Sets the chunk cache's budget: the limit minus the rings of `reg`, capped by the
    /// host-memory guard.
    pub fn rebudget(&self, reg: &Registry) {
        self.data.cache.set_budget(reg.cache_budget().min(self.host.cap.load(Ordering::Relaxed)));
    }
}

/// Sets `registry`'s memory limits from `config` (at start and on a reload): the limit, the
/// chunk cache's floor (one [`CACHE_FLOOR_DIVISOR`]th of it), the linger time, and the parser threads'
/// read buffers over `hub`'s datasets.
pub fn apply_memory_limits(registry: &mut Registry, config: &Config, hub: &Hub, threads: usize) {
    let d = &config.daemon;
    let floor = d.memory_limit_bytes / CACHE_FLOOR_DIVISOR;
    registry.set_limits(d.memory_limit_bytes, floor, Duration::from_secs(d.session_linger_secs));
    registry.set_buffers(read_buffer_bytes(config, hub, threads));
}

/// A per-start id: FNV of the pid and the wall clock.
fn new_daemon_id() -> u64 {
    let mut h = minibatchd_engine::hash::Fnv1a::new();
    h.u64(u64::from(std::process::id()));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    h.u64(now.as_secs());
    h.u64(u64::from(now.subsec_nanos()));
    h.finish()
}
