//! The control plane: the Unix socket, one task per client connection speaking the protocol, the
//! session registry (names, lingering sessions, ring memory) and the admission of new sessions.
//!
//! Plain logic: [`session`] (options, resume checks, slot leases, positions, the registry) and
//! [`admission`] (the decision of `open`: name, starting state, memory — and its undo). Thin
//! adapters: [`server`] (the session-manager actor that owns the socket), [`connection`] (the
//! async task per client) and `open_session` (opening a session for a connection: ring, producer,
//! `opened`).
//!
//! [`ControlPlane`] is what they share: the configuration in force, the registry, the host-memory
//! guard's verdict, the live connections, and the [`DataPlane`] whose producers they start. It
//! imports the data plane, never the other way round; operations import both.

pub mod admission;
pub mod checkpoint;
pub mod connection;
pub mod lanes;
mod mixture;
mod open_session;
pub mod peer;
pub mod server;
pub mod session;

use std::collections::HashMap;
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use crate::config::Config;

use super::data::catalog::Catalog;
use super::data::{read_buffer_bytes, DataPlane};
use admission::SessionLimits;
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

/// The limits of the control plane (`[daemon]`: `max_connections`, `max_connections_per_uid`,
/// `max_sessions`, `max_sessions_per_uid`, `handshake_timeout_secs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Client connections at once, in all.
    pub connections: usize,
    /// Client connections at once, per peer uid.
    pub connections_per_uid: usize,
    /// Open sessions, in all and per uid (each session holds a ring and two threads).
    pub sessions: SessionLimits,
    /// How long a connection may stay without an open session (`hello` and `open` included).
    pub handshake_timeout: Duration,
}

impl Limits {
    /// The limits `config` sets.
    #[must_use]
    pub fn of(config: &Config) -> Self {
        let d = &config.daemon;
        Self {
            connections: d.max_connections,
            connections_per_uid: d.max_connections_per_uid,
            sessions: SessionLimits { total: d.max_sessions, per_uid: d.max_sessions_per_uid },
            handshake_timeout: Duration::from_secs(d.handshake_timeout_secs),
        }
    }
}

/// Why a connection is refused at once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("too many connections: {count} open {scope} (daemon.{key} = {limit})")]
pub struct TooManyConnections {
    /// `for this user` or `in the daemon`.
    pub scope: &'static str,
    /// The config key of the limit.
    pub key: &'static str,
    /// Connections open.
    pub count: usize,
    /// The limit.
    pub limit: usize,
}

/// Counts live client connections, in all and per peer uid, so that limits hold and a shutdown
/// can wait for their grace period to end.
#[derive(Debug, Default)]
pub struct Connections {
    count: AtomicUsize,
    per_uid: Mutex<HashMap<u32, usize>>,
    idle: tokio::sync::Notify,
}

/// Held by a connection task while it runs.
#[derive(Debug)]
pub struct ConnectionGuard<'a> {
    connections: &'a Connections,
    uid: u32,
}

impl Drop for ConnectionGuard<'_> {
    fn drop(&mut self) {
        let c = self.connections;
        {
            let mut per_uid = c.per_uid.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(n) = per_uid.get_mut(&self.uid) {
                *n -= 1;
                if *n == 0 {
                    per_uid.remove(&self.uid);
                }
            }
        }
        c.count.fetch_sub(1, Ordering::AcqRel);
        c.idle.notify_one();
    }
}

impl Connections {
    /// A connection of peer uid `uid` starts, if `limits` allow it.
    ///
    /// # Errors
    /// [`TooManyConnections`] when the daemon or this uid is at its limit.
    pub fn enter(&self, uid: u32, limits: &Limits) -> Result<ConnectionGuard<'_>, TooManyConnections> {
        let mut per_uid = self.per_uid.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let all = self.count.load(Ordering::Acquire);
        if all >= limits.connections {
            return Err(TooManyConnections {
                scope: "in the daemon",
                key: "max_connections",
                count: all,
                limit: limits.connections,
            });
        }
        let mine = per_uid.entry(uid).or_insert(0);
        if *mine >= limits.connections_per_uid {
            return Err(TooManyConnections {
                scope: "for this user",
                key: "max_connections_per_uid",
                count: *mine,
                limit: limits.connections_per_uid,
            });
        }
        *mine += 1;
        self.count.fetch_add(1, Ordering::AcqRel);
        Ok(ConnectionGuard { connections: self, uid })
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
    /// Connection and session limits (from the configuration at start).
    pub limits: Limits,
    /// Serializes checkpoint writers (periodic, on reload, at start and stop), and holds the
    /// lock on `state_dir` they look at first (`None` for a control plane made for a test).
    pub checkpoint_lock: Mutex<Option<crate::pipeline::state_lock::StateLock>>,
    /// Whether checkpoints are written (from start, once the saved sessions are restored; a
    /// control plane made for a test writes none): a new session is in a checkpoint before its
    /// client hears of it.
    pub checkpoints: AtomicBool,
    /// Where the epochs of mixtures start, as sessions walked to them.
    pub mixture_epochs: Mutex<session::EpochStarts>,
    /// Why the last checkpoint write failed (opens are refused meanwhile); `None` after one
    /// that succeeded. `/healthz` says it.
    pub checkpoint_failure: Mutex<Option<String>>,
    /// The inode of the control socket this daemon bound (0 before it has): `/healthz` checks
    /// that the path still leads to it.
    pub socket_inode: std::sync::atomic::AtomicU64,
    /// The device of that socket (an inode number alone may be reused).
    pub socket_device: std::sync::atomic::AtomicU64,
    /// Opens being prepared, per user ([`lanes::OpenLanes`]).
    pub open_lanes: lanes::OpenLanes,
}

/// What a path holds, against the control socket this daemon bound ([`ControlPlane::socket_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketAt {
    /// The daemon has bound no socket yet.
    Unbound,
    /// The socket it bound.
    Ours,
    /// Nothing.
    Gone,
    /// Another file (another daemon's socket, bound since ours was removed).
    Other,
}

/// The series of every configured mixture, before its first session (its sources' shares at
/// step 0).
fn announce_mixtures(config: &Config, metrics: &crate::metrics::Metrics) {
    for (name, m) in &config.mixtures {
        let weights = m.schedule.at(0);
        let sources: Vec<(&str, f64)> =
            m.datasets.iter().enumerate().map(|(i, d)| (d.as_str(), weights.share(i))).collect();
        metrics.mixture_series(name, &sources);
    }
}

impl ControlPlane {
    /// The control plane for `config` over the opened `catalog`, counting into `metrics`.
    #[must_use]
    pub fn new(config: Config, catalog: Catalog, metrics: crate::metrics::Metrics) -> Self {
        let threads = super::data::parser_threads(&config);
        let mut registry = Registry::new(0, 0, Duration::ZERO);
        apply_memory_limits(&mut registry, &config, &catalog, threads);
        let data = Arc::new(DataPlane::new(&config, catalog, metrics, threads, registry.cache_budget()));
        announce_mixtures(&config, &data.metrics);
        let limits = Limits::of(&config);
        Self {
            config: RwLock::new(Arc::new(config)),
            daemon_id: new_daemon_id(),
            data,
            registry: Mutex::new(registry),
            host: HostState::default(),
            connections: Connections::default(),
            limits,
            checkpoint_lock: Mutex::new(None),
            checkpoint_failure: Mutex::new(None),
            socket_inode: std::sync::atomic::AtomicU64::new(0),
            socket_device: std::sync::atomic::AtomicU64::new(0),
            open_lanes: lanes::OpenLanes::default(),
            checkpoints: AtomicBool::new(false),
            mixture_epochs: Mutex::new(session::EpochStarts::default()),
        }
    }

    /// What `path` holds now, against the socket this daemon bound (its device and inode).
    #[must_use]
    pub fn socket_at(&self, path: &std::path::Path) -> SocketAt {
        use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
        use std::sync::atomic::Ordering;
        let ino = self.socket_inode.load(Ordering::Relaxed);
        if ino == 0 {
            return SocketAt::Unbound;
        }
        let dev = self.socket_device.load(Ordering::Relaxed);
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.ino() == ino && m.dev() == dev && m.file_type().is_socket() => SocketAt::Ours,
            Ok(_) => SocketAt::Other,
            Err(_) => SocketAt::Gone,
        }
    }

    /// Writes the daemon checkpoint now (blocking: fsync): every session, ready or lingering,
    /// with its position, to `state_dir/checkpoint.json` (written aside, then renamed); nothing
    /// while [`Self::checkpoints`] is off.
    ///
    /// # Errors
    /// Why it was not written (the file and the system's error).
    pub fn write_checkpoint(&self, reason: &'static str) -> Result<(), String> {
        if !self.checkpoints.load(Ordering::Acquire) {
            return Ok(());
        }
        // One writer at a time: the temporary file's name is per process.
        let mut writing = self.checkpoint_lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (sessions, forgotten) = {
            let now = std::time::Instant::now();
            let mut registry = self.registry();
            (registry.snapshot(now), registry.forgotten_notes(now))
        };
        let n = sessions.len();
        let state_dir = self.config().daemon.state_dir.clone();
        let c = checkpoint::Checkpoint::new(self.daemon_id, reason, sessions, forgotten);
        // Only while state_dir is still this daemon's.
        let result = writing.as_mut().map_or(Ok(()), crate::pipeline::state_lock::StateLock::ensure);
        let result = result.and_then(|()| checkpoint::write(&state_dir, &c));
        self.data.metrics.checkpoint_written(result.is_ok());
        let result = match result {
            Ok(()) => {
                tracing::debug!(reason, sessions = n, "checkpoint written");
                Ok(())
            }
            Err(e) => {
                let path = checkpoint::path(&state_dir);
                tracing::error!(reason, error = %e, path = %path.display(), "cannot write the daemon checkpoint");
                Err(format!("cannot write the daemon checkpoint {}: {e}", path.display()))
            }
        };
        *self.checkpoint_failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = result.clone().err();
        result
    }

    /// Keeps `lock` (this daemon's on `state_dir`) for as long as the control plane lives, looked
    /// at before each checkpoint is written.
    pub fn hold_state_lock(&self, lock: crate::pipeline::state_lock::StateLock) {
        *self.checkpoint_lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(lock);
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
    pub fn replace(&self, config: Config, catalog: Catalog) {
        announce_mixtures(&config, &self.data.metrics);
        self.data.replace_catalog(catalog);
        *self.config.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(config);
    }

    /// Sets the chunk cache's budget: the limit minus the rings of `reg`, capped by the
    /// host-memory guard; and its ceiling, the same without the cap (what sessions may hold
    /// before their demand loads are refused: a host short of memory shrinks the cache, it does
    /// not fail sessions).
    pub fn rebudget(&self, reg: &Registry) {
        let share = reg.cache_budget();
        self.data.cache.set_budget_and_ceiling(share.min(self.host.cap.load(Ordering::Relaxed)), share);
    }
}

/// Sets `registry`'s memory limits from `config` (at start and on a reload): the limit, the
/// chunk cache's floor (one [`CACHE_FLOOR_DIVISOR`]th of it), the linger time, and the parser threads'
/// read buffers over `catalog`'s datasets.
pub fn apply_memory_limits(registry: &mut Registry, config: &Config, catalog: &Catalog, threads: usize) {
    let d = &config.daemon;
    let floor = d.memory_limit_bytes / CACHE_FLOOR_DIVISOR;
    registry.set_limits(d.memory_limit_bytes, floor, Duration::from_secs(d.session_linger_secs));
    registry.set_max_lingering(d.max_sessions);
    catalog.set_memory_limit(d.memory_limit_bytes);
    // The parsers' read buffers and the datasets' indexes are held whatever the sessions do:
    // the chunk cache gets what they and the rings leave.
    let outside = held_outside_the_cache(config, catalog, threads);
    registry.set_buffers(outside);
    if outside.saturating_add(floor) >= d.memory_limit_bytes && !config.datasets.is_empty() {
        tracing::warn!(
            memory_limit_bytes = d.memory_limit_bytes,
            read_buffers_and_indexes = outside,
            "the parser threads' read buffers (parser_threads × the largest chunk, 64 MiB each at most) and the \
             datasets' indexes leave no memory for sessions beside the chunk cache's quarter of the limit: every open \
             will be refused; lower chunk_size_bytes or parser_threads, or raise memory_limit_bytes"
        );
    }
}

/// What the parsers' read buffers and the datasets' indexes hold, whatever the sessions do.
fn held_outside_the_cache(config: &Config, catalog: &Catalog, threads: usize) -> u64 {
    read_buffer_bytes(config, catalog, threads).saturating_add(catalog.index_bytes())
}

/// What a reload's `memory_limit_bytes` of `config` would need beside the open sessions'
/// reservations in `registry` and the parsed chunks they hold now (`held`): `Some(bytes)` when it
/// is lower than the rings, samplers, read buffers, indexes and those chunks (at least the chunk
/// cache's floor) take together — applied, it would leave the cache nothing and every open
/// session waiting for memory for good, or (found by a probe: a limit lowered from 256 to 12 MiB
/// under 82 MB of chunks a slow trainer's session held) be exceeded for as long as the sessions
/// keep their chunks.
#[must_use]
pub fn limit_short_of_sessions(
    registry: &Registry,
    config: &Config,
    catalog: &Catalog,
    threads: usize,
    held: u64,
) -> Option<u64> {
    let limit = config.daemon.memory_limit_bytes;
    let needed = registry
        .reserved()
        .saturating_add(held_outside_the_cache(config, catalog, threads))
        .saturating_add(held.max(limit / CACHE_FLOOR_DIVISOR));
    ((registry.reserved() > 0 || held > 0) && needed > limit).then_some(needed)
}

/// What `config`'s `memory_limit_bytes` would need for the read buffers, the indexes and the
/// chunk cache's floor alone: `Some(bytes)` when it is lower — every `open` would be refused.
#[must_use]
pub fn limit_short_of_data(config: &Config, catalog: &Catalog, threads: usize) -> Option<u64> {
    let limit = config.daemon.memory_limit_bytes;
    let needed = held_outside_the_cache(config, catalog, threads).saturating_add(limit / CACHE_FLOOR_DIVISOR);
    (needed > limit).then_some(needed)
}

/// 64 bits from the kernel's random source (`/dev/urandom`), for names nobody may guess; the
/// clock and the pid mixed by FNV where the source cannot be read (logged).
#[must_use]
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)) {
        Ok(()) => u64::from_ne_bytes(b),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read /dev/urandom; session names fall back to a clock-based id");
            new_daemon_id()
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
