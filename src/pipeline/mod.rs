//! The daemon (`minibatchd run`): an actix System of supervised stages around the pure engine.
//!
//! ```text
//!  control socket ─► SessionManager ─► connection task per client (hello/open/ready/release/state/close)
//!                                            │  free slots ▲ │ events (bounded)
//!                                            ▼             │ ▼
//!                                     Delivery: producer thread per session (Sampler + assemble + ring)
//!                                            │ misses/prefetch          ▲ Arc<ParsedChunk>
//!                                            ▼ (bounded)                │
//!   ChunkReader ─to_parse─► ParserPool (SyncArbiter) ─parsed─► CacheStage ─► SharedCache
//! ```
//!
//! * [`supervisor`] starts the stages in order, restarts stopped ones with backoff and a limit,
//!   and stops them in reverse order (after the connected clients had their grace period).
//! * [`stages`] are thin actors over the bounded flume [`Channels`]; [`cache`], [`session`] and
//!   [`producer`] hold the logic as plain structs, unit-tested without actors.
//! * [`connection`] speaks [`minibatchd_client::protocol`]; [`server`] owns the socket.
//! * Operations: [`signals`] (SIGTERM/SIGINT → shutdown, SIGHUP → [`reload`]), [`checkpoint`]
//!   (the versioned daemon checkpoint), [`notify`] (sd_notify), [`memory`] (sysinfo and the
//!   host-memory guard), [`ops`] (metric refresh, `/healthz`, housekeeping). Metrics are defined in
//!   [`crate::metrics`] and served on `metrics_listen`.
//!
//! Memory: `memory_limit_bytes` bounds the rings (reserved at `open`, refused with
//! `resource_exhausted` when they would leave less than [`CACHE_FLOOR_FRACTION`] of the limit to
//! the chunk cache) plus the chunk cache (its budget is the limit minus the rings, capped further
//! while the host is short of memory).

pub mod cache;
pub mod checkpoint;
pub mod connection;
pub mod hub;
pub mod memory;
pub mod notify;
pub mod ops;
pub mod preload;
pub mod producer;
pub mod reload;
pub mod server;
pub mod session;
pub mod signals;
pub mod stages;
pub mod supervisor;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::metrics::Metrics;

use cache::{ChunkRequest, ParsedMsg, SharedCache};
use hub::{DatasetRuntime, Hub};
use session::Registry;

/// Share of `memory_limit_bytes` that rings may never take from the chunk cache.
pub const CACHE_FLOOR_FRACTION: f64 = 0.25;
/// File in `state_dir` holding the metrics endpoint's actual address (`host:port`), written at
/// start (useful with port 0) and removed at a clean stop.
pub const METRICS_ADDR_FILE: &str = "metrics.addr";
/// Time allowed, beyond `shutdown_grace_secs`, for the stages to stop.
pub const STOP_MARGIN: Duration = Duration::from_secs(20);

/// The data-plane channels, created once and owned for the daemon's lifetime, so that a
/// restarted stage reattaches to the same queues. Every one is bounded.
#[derive(Debug)]
pub struct Channels {
    /// Producers → reader: chunk requests (`read_queue_chunks`).
    pub requests: (flume::Sender<ChunkRequest>, flume::Receiver<ChunkRequest>),
    /// Reader → parser pool (`read_queue_chunks`).
    pub to_parse: (flume::Sender<ChunkRequest>, flume::Receiver<ChunkRequest>),
    /// Parser pool → cache stage (`parsed_queue_chunks`).
    pub parsed: (flume::Sender<ParsedMsg>, flume::Receiver<ParsedMsg>),
}

/// Where the daemon's life stands (for `/healthz`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Stages starting; not ready.
    Starting,
    /// Serving (`READY=1` sent).
    Serving,
    /// Stopping (`STOPPING=1` sent).
    Stopping,
}

/// Liveness of the daemon and its stages.
#[derive(Debug, Default)]
pub struct Health {
    phase: AtomicU8,
    stages: [AtomicBool; 5],
}

impl Health {
    /// The phase.
    #[must_use]
    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Relaxed) {
            0 => Phase::Starting,
            1 => Phase::Serving,
            _ => Phase::Stopping,
        }
    }

    /// Sets the phase.
    pub fn set_phase(&self, p: Phase) {
        self.phase.store(p as u8, Ordering::Relaxed);
    }

    /// Whether stage `i` (in start order) runs.
    #[must_use]
    pub fn stage_up(&self, i: usize) -> bool {
        self.stages.get(i).is_some_and(|s| s.load(Ordering::Relaxed))
    }

    /// Records whether stage `i` runs.
    pub fn set_stage_up(&self, i: usize, up: bool) {
        if let Some(s) = self.stages.get(i) {
            s.store(up, Ordering::Relaxed);
        }
    }
}

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

/// Daemon-wide state shared by the stages and connections.
#[derive(Debug)]
pub struct Shared {
    config: RwLock<Arc<Config>>,
    /// Random id of this daemon start (in every ring header and `hello`).
    pub daemon_id: u64,
    hub: RwLock<Arc<Hub>>,
    hub_generation: tokio::sync::watch::Sender<u64>,
    /// The chunk cache.
    pub cache: Arc<SharedCache>,
    /// Channels between the stages.
    pub channels: Channels,
    /// Parser threads.
    pub parser_threads: usize,
    registry: Mutex<Registry>,
    /// Every metric.
    pub metrics: Metrics,
    /// Phase and stage liveness.
    pub health: Health,
    /// The host-memory guard's decision.
    pub host: HostState,
    /// Live connections.
    pub connections: Connections,
    checkpoint_lock: Mutex<()>,
    /// Hub indices of the datasets whose preload has been started (each dataset version once).
    preloaded: Mutex<std::collections::HashSet<u32>>,
}

impl Shared {
    /// Builds the shared state for `config` over the opened `hub`.
    #[must_use]
    pub fn new(config: Config, hub: Hub, metrics: Metrics) -> Self {
        let d = &config.daemon;
        let requests = flume::bounded(d.read_queue_chunks);
        let to_parse = flume::bounded(d.read_queue_chunks);
        let parsed = flume::bounded(d.parsed_queue_chunks);
        let mut registry = Registry::new(0, 0, Duration::ZERO);
        let parser_threads = if d.parser_threads == 0 {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        } else {
            d.parser_threads
        };
        apply_memory_limits(&mut registry, &config, &hub, parser_threads);
        let cache = Arc::new(SharedCache::new(registry.cache_budget(), requests.0.clone()));
        Self {
            daemon_id: new_daemon_id(),
            hub: RwLock::new(Arc::new(hub)),
            hub_generation: tokio::sync::watch::channel(0).0,
            cache,
            channels: Channels { requests, to_parse, parsed },
            parser_threads,
            registry: Mutex::new(registry),
            config: RwLock::new(Arc::new(config)),
            metrics,
            health: Health::default(),
            host: HostState::default(),
            connections: Connections::default(),
            checkpoint_lock: Mutex::new(()),
            preloaded: Mutex::new(std::collections::HashSet::new()),
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

    /// The datasets in force.
    pub fn hub(&self) -> Arc<Hub> {
        self.hub.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The runtime with hub index `index` (current, or a replaced version a session still reads).
    #[must_use]
    pub fn runtime(&self, index: u32) -> Option<Arc<DatasetRuntime>> {
        self.hub().by_index(index)
    }

    /// Swaps in a reloaded configuration and its datasets, and tells the connections.
    pub fn replace(&self, config: Config, hub: Hub) {
        *self.hub.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(hub);
        *self.config.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(config);
        self.hub_generation.send_modify(|g| *g += 1);
    }

    /// Notified after every [`Shared::replace`].
    #[must_use]
    pub fn hub_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.hub_generation.subscribe()
    }

    /// Sets the chunk cache's budget: the limit minus the rings of `reg`, capped by the
    /// host-memory guard.
    pub fn rebudget(&self, reg: &Registry) {
        self.cache.set_budget(reg.cache_budget().min(self.host.cap.load(Ordering::Relaxed)));
    }
}

/// Sets `registry`'s memory limits from `config` (at start and on a reload): the limit, the
/// chunk cache's floor ([`CACHE_FLOOR_FRACTION`] of it), the linger time, and the parser threads'
/// read buffers over `hub`'s datasets.
pub fn apply_memory_limits(registry: &mut Registry, config: &Config, hub: &Hub, threads: usize) {
    let d = &config.daemon;
    let floor = (d.memory_limit_bytes as f64 * CACHE_FLOOR_FRACTION) as u64;
    registry.set_limits(d.memory_limit_bytes, floor, Duration::from_secs(d.session_linger_secs));
    registry.set_buffers(read_buffer_bytes(config, hub, threads));
}

/// Memory the parser threads keep between chunks: each reuses one read buffer, a 256 KiB window
/// that grows to the longest sequence it has read; counted as `threads` × the largest chunk of
/// the open datasets, a bound that holds whatever the sequences.
#[must_use]
pub fn read_buffer_bytes(config: &Config, hub: &Hub, threads: usize) -> u64 {
    let largest = config
        .datasets
        .keys()
        .filter_map(|name| hub.get(name).ok())
        .flat_map(|rt| rt.dataset.chunks().iter().map(|c| c.end.saturating_sub(c.start)).max())
        .max()
        .unwrap_or(0);
    // A thread keeps its buffer between chunks only up to `MAX_REUSED_READ_BUFFER`; a larger
    // one is freed after each chunk, so at most that much stays held per thread.
    largest.min(minibatchd_engine::dataset::MAX_REUSED_READ_BUFFER).saturating_mul(threads as u64)
}

/// Starts [`preload`] for each configured dataset that is open, has `preload = true`, and has not
/// been preloaded in this version yet: at start, and after a reload for the datasets it added or
/// changed and for those that failed to open before and open now.
pub fn preload_datasets(shared: &Arc<Shared>) {
    let hub = shared.hub();
    let config = shared.config();
    let mut started = shared.preloaded.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for name in config.datasets.keys() {
        if let Ok(rt) = hub.get(name) {
            if rt.dataset.config().preload && started.insert(rt.index) {
                preload::spawn(shared.clone(), rt);
            }
        }
    }
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

/// The daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// Setting up the runtime, signal handlers or an endpoint failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A stage could not be kept running, or the metrics could not be set up.
    #[error("{0}")]
    Fatal(String),
}

/// The `STATUS=` line for sd_notify.
fn status_line(shared: &Shared) -> String {
    let (ready, failed) = shared.hub().counts();
    format!(
        "serving {ready} dataset(s){}",
        if failed > 0 { format!(", {failed} failed to open") } else { String::new() }
    )
}

fn metrics_addr_path(state_dir: &Path) -> PathBuf {
    state_dir.join(METRICS_ADDR_FILE)
}

/// Binds `metrics_listen` and records the actual address in `state_dir`.
fn bind_metrics(config: &Config) -> Result<std::net::TcpListener, PipelineError> {
    let d = &config.daemon;
    let listener = std::net::TcpListener::bind(&d.metrics_listen).map_err(|e| {
        PipelineError::Fatal(format!("cannot listen on daemon.metrics_listen {}: {e}", d.metrics_listen))
    })?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    std::fs::create_dir_all(&d.state_dir)?;
    minibatchd_engine::persist::write_atomic(&metrics_addr_path(&d.state_dir), format!("{addr}\n").as_bytes())?;
    tracing::info!(addr = %addr, "metrics endpoint listening on http://{addr}/metrics");
    Ok(listener)
}

/// Runs the daemon until SIGTERM or SIGINT (clean stop: socket removed, checkpoint written,
/// `Ok`) or a fatal stage error.
///
/// # Errors
/// [`PipelineError`].
pub fn run(config: Config) -> Result<(), PipelineError> {
    let notifier = Arc::new(notify::Notifier::from_env());
    let metrics = Metrics::new().map_err(|e| PipelineError::Fatal(format!("metric definitions: {e}")))?;
    let metrics_listener = bind_metrics(&config)?;
    let hub = Hub::open(&config, &metrics);
    let shared = Arc::new(Shared::new(config, hub, metrics));
    let state_dir = shared.config().daemon.state_dir.clone();
    let restored = shared.registry().restore(checkpoint::restore(&state_dir), Instant::now());
    if restored > 0 {
        tracing::info!(sessions = restored, "sessions restored from the checkpoint; resumable by name");
    }
    ops::write_checkpoint(&shared, "start");
    preload_datasets(&shared);
    let (sig_tx, sig_rx) = tokio::sync::mpsc::channel(signals::SIGNAL_QUEUE);
    let mut signal_thread = signals::Listener::start(sig_tx)?;
    let mut housekeeping = ops::Housekeeping::start(shared.clone())?;
    tracing::info!(daemon_id = %minibatchd_client::protocol::hex64(shared.daemon_id), parser_threads = shared.parser_threads, "starting");
    let system = actix::System::new();
    let result = system.block_on(serve(shared.clone(), notifier.clone(), metrics_listener, sig_rx));
    actix::System::current().stop();
    housekeeping.stop();
    // Every connection has ended (or its grace is over): the registry holds each session's last
    // acknowledged position.
    ops::write_checkpoint(&shared, "shutdown");
    let _ = std::fs::remove_file(metrics_addr_path(&state_dir));
    signal_thread.close();
    tracing::info!("stopped");
    result
}

async fn serve(
    shared: Arc<Shared>,
    notifier: Arc<notify::Notifier>,
    metrics_listener: std::net::TcpListener,
    mut signals: tokio::sync::mpsc::Receiver<signals::Signal>,
) -> Result<(), PipelineError> {
    use actix::Actor;
    let listener = tokio::net::TcpListener::from_std(metrics_listener)?;
    let (s1, s2) = (shared.clone(), shared.clone());
    let render: crate::metrics::http::Render = Arc::new(move || {
        ops::refresh_metrics(&s1);
        s1.metrics.render()
    });
    let health: crate::metrics::http::Health = Arc::new(move || ops::health(&s2));
    let endpoint = tokio::spawn(crate::metrics::http::serve(listener, render, health));
    let (fatal_tx, mut fatal_rx) = tokio::sync::oneshot::channel();
    let supervisor = supervisor::Supervisor::new(shared.clone(), fatal_tx).start();
    let background = spawn_readiness_and_watchdog(shared.clone(), notifier.clone());
    let mut reloading: Option<tokio::task::JoinHandle<()>> = None;
    let mut reload_again = false;
    let outcome = loop {
        tokio::select! {
            signal = signals.recv() => match signal {
                Some(signals::Signal::Reload) if reloading.is_some() => reload_again = true,
                Some(signals::Signal::Reload) => reloading = Some(tokio::spawn(reload::reload(shared.clone(), notifier.clone()))),
                Some(signals::Signal::Shutdown(name)) => {
                    tracing::info!("{name}: stopping");
                    break Ok(());
                }
                None => break Ok(()),
            },
            _ = async { if let Some(r) = reloading.as_mut() { let _ = r.await; } }, if reloading.is_some() => {
                reloading = reload_again.then(|| tokio::spawn(reload::reload(shared.clone(), notifier.clone())));
                reload_again = false;
            }
            msg = &mut fatal_rx => break Err(PipelineError::Fatal(msg.unwrap_or_else(|_| "the supervisor stopped".into()))),
        }
    };
    shared.health.set_phase(Phase::Stopping);
    notifier.stopping();
    if let Some(r) = reloading {
        r.abort();
    }
    let bound = Duration::from_secs(shared.config().daemon.shutdown_grace_secs) + STOP_MARGIN;
    if tokio::time::timeout(bound, supervisor.send(supervisor::Shutdown)).await.is_err() {
        tracing::error!(seconds = bound.as_secs(), "the stages did not stop in time; exiting anyway");
    }
    background.abort();
    endpoint.abort();
    outcome
}

/// Sends `READY=1` once every stage runs, then `WATCHDOG=1` every half watchdog period for as
/// long as the event loop turns.
fn spawn_readiness_and_watchdog(shared: Arc<Shared>, notifier: Arc<notify::Notifier>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !(0..crate::metrics::STAGES.len()).all(|i| shared.health.stage_up(i)) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if shared.health.phase() == Phase::Starting {
            shared.health.set_phase(Phase::Serving);
            notifier.ready(&status_line(&shared));
            tracing::info!("{}", status_line(&shared));
        }
        let Some(every) = notifier.watchdog_interval() else { return };
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            notifier.watchdog();
        }
    })
}
