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
//!   and stops them in reverse order on SIGTERM/SIGINT.
//! * [`stages`] are thin actors over the bounded flume [`Channels`]; [`cache`], [`session`] and
//!   [`producer`] hold the logic as plain structs, unit-tested without actors.
//! * [`connection`] speaks [`crate::protocol`]; [`server`] owns the socket.
//!
//! Memory: `memory_limit_bytes` bounds the rings (reserved at `open`, refused with
//! `resource_exhausted` when they would leave less than [`CACHE_FLOOR_FRACTION`] of the limit to
//! the chunk cache) plus the chunk cache (its budget is the limit minus the rings).
//!
//! Metrics hooks (issue 5): [`cache::SharedCache::stats`], [`supervisor::RestartCounts`],
//! [`session::Registry::counts`] and the channel lengths in [`Channels`] are what the
//! Prometheus exporter will read.

pub mod cache;
pub mod connection;
pub mod hub;
pub mod producer;
pub mod server;
pub mod session;
pub mod stages;
pub mod supervisor;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::config::Config;

use cache::{ChunkRequest, ParsedMsg, SharedCache};
use hub::Hub;
use session::Registry;

/// Share of `memory_limit_bytes` that rings may never take from the chunk cache.
pub const CACHE_FLOOR_FRACTION: f64 = 0.25;

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

/// Daemon-wide state shared by the stages and connections.
#[derive(Debug)]
pub struct Shared {
    /// The configuration.
    pub config: Config,
    /// Random id of this daemon start (in every ring header and `hello`).
    pub daemon_id: u64,
    /// Opened datasets.
    pub hub: Hub,
    /// The chunk cache.
    pub cache: Arc<SharedCache>,
    /// Channels between the stages.
    pub channels: Channels,
    /// Parser threads.
    pub parser_threads: usize,
    registry: Mutex<Registry>,
}

impl Shared {
    /// Builds the shared state for `config` over the opened `hub`.
    #[must_use]
    pub fn new(config: Config, hub: Hub) -> Self {
        let d = &config.daemon;
        let requests = flume::bounded(d.read_queue_chunks);
        let to_parse = flume::bounded(d.read_queue_chunks);
        let parsed = flume::bounded(d.parsed_queue_chunks);
        let floor = (d.memory_limit_bytes as f64 * CACHE_FLOOR_FRACTION) as u64;
        let registry = Registry::new(d.memory_limit_bytes, floor, Duration::from_secs(d.session_linger_secs));
        let cache = Arc::new(SharedCache::new(registry.cache_budget(), requests.0.clone()));
        let parser_threads = if d.parser_threads == 0 { std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get) } else { d.parser_threads };
        Self { daemon_id: new_daemon_id(), hub, cache, channels: Channels { requests, to_parse, parsed }, parser_threads, registry: Mutex::new(registry), config }
    }

    /// The session registry.
    pub fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A per-start id: FNV of the pid and the wall clock.
fn new_daemon_id() -> u64 {
    let mut h = crate::dataset::Fnv::new();
    h.u64(u64::from(std::process::id()));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    h.u64(now.as_secs());
    h.u64(u64::from(now.subsec_nanos()));
    h.finish()
}

/// The daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// Setting up the runtime or signal handlers failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A stage could not be kept running.
    #[error("{0}")]
    Fatal(String),
}

/// Runs the daemon until SIGTERM or SIGINT (clean stop, socket removed) or a fatal stage error.
///
/// # Errors
/// [`PipelineError`].
pub fn run(config: Config) -> Result<(), PipelineError> {
    let hub = Hub::open(&config);
    let shared = Arc::new(Shared::new(config, hub));
    tracing::info!(daemon_id = %crate::protocol::hex64(shared.daemon_id), parser_threads = shared.parser_threads, "starting");
    let system = actix::System::new();
    let result = system.block_on(async move {
        use actix::Actor;
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let (fatal_tx, fatal_rx) = tokio::sync::oneshot::channel();
        let supervisor = supervisor::Supervisor::new(shared, fatal_tx).start();
        let outcome = tokio::select! {
            _ = term.recv() => { tracing::info!("SIGTERM: stopping"); Ok(()) }
            _ = int.recv() => { tracing::info!("SIGINT: stopping"); Ok(()) }
            msg = fatal_rx => Err(PipelineError::Fatal(msg.unwrap_or_else(|_| "the supervisor stopped".into()))),
        };
        let _ = supervisor.send(supervisor::Shutdown).await;
        outcome
    });
    actix::System::current().stop();
    result
}
