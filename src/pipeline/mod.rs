//! The daemon (`minibatchd run`): an actix System of supervised stages around the pure engine,
//! in three planes that import only downward — operations → control → data — plus the leaf
//! [`lifecycle`] every stage answers to.
//!
//! ```text
//!  control socket ─► control::server ─► control::connection task per client (hello/open/ready/release/state/close)
//!                                            │  free slots ▲ │ events (bounded)
//!                                            ▼             │ ▼
//!                                  data::delivery: the producer pool (a Feeder + ring per session)
//!                                            │ misses/prefetch          ▲ Arc<ParsedChunk>
//!                                            ▼ (bounded)                │
//!   data::readahead ─to_parse─► data::parsers (SyncArbiter) ─parsed─► data::chunk_cache_stage ─► SharedCache
//! ```
//!
//! * [`data`] — the data plane: readahead, parser pool, chunk cache, producers ([`data::DataPlane`]).
//! * [`control`] — the control plane: socket, connections, sessions, admission
//!   ([`control::ControlPlane`], which holds the data plane).
//! * [`ops`] — operations: signals, the daemon checkpoint, reload, `sd_notify`, the host-memory guard,
//!   metric refresh and `/healthz`.
//! * [`supervisor`] starts the stages in [`crate::stage::Stage::ALL`] order, restarts stopped ones with backoff
//!   and a limit, and stops them in reverse order (after the connected clients had their grace).
//!
//! Memory: `memory_limit_bytes` bounds the rings (reserved at `open`, refused with
//! `resource_exhausted` when they would leave less than one [`control::CACHE_FLOOR_DIVISOR`]th of the
//! limit to the chunk cache) plus the chunk cache (its budget is the limit minus the rings, capped
//! further while the host is short of memory).

pub mod control;
pub mod data;
pub mod lifecycle;
pub mod ops;
pub mod state_lock;
pub use state_lock::LOCK_FILE;
pub mod supervisor;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::metrics::Metrics;

use control::checkpoint;
use control::ControlPlane;
use data::catalog::Catalog;
use lifecycle::Phase;
use ops::{notify, reload, signals};

/// File in `state_dir` holding the metrics endpoint's actual address (`host:port`), written at
/// start (useful with port 0) and removed at a clean stop.
pub const METRICS_ADDR_FILE: &str = "metrics.addr";
/// Time allowed, beyond `shutdown_grace_secs`, for the stages to stop.
pub const STOP_MARGIN: Duration = Duration::from_secs(20);

/// Opens prepared (and checkpoints written for them) at once on the event loop's blocking pool,
/// beside its object fetches: more wait for a thread.
pub const OPENS_PREPARED: usize = 8;

/// The daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// Setting up the runtime, signal handlers or an endpoint failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A stage could not be kept running, or the metrics could not be set up.
    #[error("{0}")]
    Fatal(String),
    /// The stop went through, but the shutdown checkpoint could not be written: the sessions'
    /// positions are only those of the last periodic checkpoint (the log says why).
    #[error(
        "the shutdown checkpoint could not be written into {0}; sessions resume from the last periodic checkpoint"
    )]
    Checkpoint(PathBuf),
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
    let path = metrics_addr_path(&d.state_dir);
    std::fs::create_dir_all(&d.state_dir)
        .and_then(|()| minibatchd_engine::state_file::write_atomic(&path, format!("{addr}\n").as_bytes()))
        .map_err(|e| PipelineError::Fatal(format!("cannot write {} (daemon.state_dir): {e}", path.display())))?;
    tracing::info!(addr = %addr, "metrics endpoint listening on http://{addr}/metrics");
    Ok(listener)
}

/// Runs the daemon until SIGTERM or SIGINT (clean stop: socket removed, checkpoint written,
/// `Ok`) or a fatal stage error. `signals` were caught from before the configuration was read
/// ([`signals::Caught::install`]); one that came early is acted on once the daemon runs.
///
/// # Errors
/// [`PipelineError`].
pub fn run(config: Config, signals: signals::Caught) -> Result<(), PipelineError> {
    let signals::Caught { listener: mut signal_thread, received: sig_rx } = signals;
    let notifier = Arc::new(notify::Notifier::from_env());
    let metrics = Metrics::new().map_err(|e| PipelineError::Fatal(format!("metric definitions: {e}")))?;
    // Held until the process ends: one daemon per state_dir.
    let lock = state_lock::StateLock::take(&config.daemon.state_dir)?;
    control::server::check_bindable(&config.daemon.socket)
        .map_err(|e| PipelineError::Fatal(format!("daemon.socket {}: {e}", config.daemon.socket.display())))?;
    raise_descriptor_limit(&config);
    let metrics_listener = bind_metrics(&config)?;
    let metrics_record = metrics_listener.local_addr().map(|a| format!("{a}\n")).ok();
    // The datasets open after the socket is up (`reload::open_at_start`): until then, sessions on
    // them get `dataset_indexing` with the progress.
    let catalog = Catalog::default();
    ops::reload::apply_huge_pages(catalog.huge_pages(), config.daemon.huge_pages);
    crate::objects::ensure(catalog.remote_cell(), &config)
        .map_err(|e| PipelineError::Fatal(format!("object storage: {e}")))?;
    let shared = Arc::new(ControlPlane::new(config, catalog, metrics));
    shared.hold_state_lock(lock);
    for name in shared.config().datasets.keys() {
        shared.data.indexing.begin(name, &shared.data.metrics);
    }
    let state_dir = shared.config().daemon.state_dir.clone();
    let cap = checkpoint::max_bytes(shared.config().daemon.memory_limit_bytes, shared.config().daemon.max_sessions);
    let found = checkpoint::restore(&state_dir, cap);
    if let Some(aside) = &found.set_aside {
        shared.registry().checkpoint_lost(aside, Instant::now());
    }
    let restored = {
        let mut registry = shared.registry();
        registry.restore_forgotten(found.forgotten, Instant::now());
        registry.restore(found.sessions, found.written, found.clean, Instant::now())
    };
    if restored > 0 {
        tracing::info!(sessions = restored, "sessions restored from the checkpoint; resumable by name");
    }
    shared.checkpoints.store(true, std::sync::atomic::Ordering::Release);
    let _ = shared.write_checkpoint("start");
    let mut housekeeping = ops::Housekeeping::start(shared.clone())?;
    tracing::info!(daemon_id = %minibatchd_client::protocol::hex64(shared.daemon_id), parser_threads = shared.data.parser_threads, "starting");
    // The event loop's runtime (actix's own kind: one thread, every driver), held here as well so
    // that the exit can leave its blocking pool behind instead of waiting for it: a chunk fetch
    // ahead of the parsers (`data::readahead`) runs there, and on a stalled object store it waits
    // up to `object_retry_secs` + `object_request_timeout_secs`. Dropping the runtime waits for
    // such tasks whatever they wait for, with `daemon.lock` still held.
    // Its blocking pool is bounded: the object fetches in flight and OPENS_PREPARED at once of
    // the opens' preparations and checkpoint writes — tokio's default of 512 let a burst of costly
    // opens (equal steps over 2^20 workers) take a thread and a core each.
    let blocking = shared.data.object_fetches.saturating_add(OPENS_PREPARED);
    let runtime =
        Arc::new(tokio::runtime::Builder::new_current_thread().enable_all().max_blocking_threads(blocking).build()?);
    let system = actix::System::with_tokio_rt({
        let runtime = runtime.clone();
        move || runtime
    });
    let result = system.block_on(serve(shared.clone(), notifier.clone(), metrics_listener, sig_rx));
    actix::System::current().stop();
    housekeeping.stop();
    // Every connection has ended (or its grace is over): the registry holds each session's last
    // acknowledged position.
    let saved = shared.write_checkpoint("shutdown").is_ok();
    // The sessions are gone and the checkpoint is written: the parsed chunks whose writes their
    // demand put off are written now, within the grace period again.
    let _ = data::persister::drain(
        &shared.data.persist,
        std::time::Duration::from_secs(shared.config().daemon.shutdown_grace_secs),
    );
    // Only the address this daemon wrote: another daemon that took the state directory since (its
    // lock removed from under this one) wrote its own (found by a probe).
    let addr_path = metrics_addr_path(&state_dir);
    if metrics_record.is_some_and(|r| std::fs::read(&addr_path).is_ok_and(|now| now == r.as_bytes())) {
        let _ = std::fs::remove_file(addr_path);
    }
    signal_thread.close();
    // The checkpoint is written: nothing the runtime still runs is waited for (see above). The
    // process ends when `run` returns, and with it the threads still blocked and the lock.
    drop(system);
    if let Ok(runtime) = Arc::try_unwrap(runtime) {
        runtime.shutdown_background();
    }
    tracing::info!("stopped");
    // A clean stop promises a checkpoint: without one it is not clean (exit status 1).
    result.and(if saved { Ok(()) } else { Err(PipelineError::Checkpoint(state_dir.clone())) })
}

async fn serve(
    shared: Arc<ControlPlane>,
    notifier: Arc<notify::Notifier>,
    metrics_listener: std::net::TcpListener,
    mut signals: tokio::sync::mpsc::Receiver<signals::Signal>,
) -> Result<(), PipelineError> {
    use actix::Actor;
    let listener = tokio::net::TcpListener::from_std(metrics_listener)?;
    let (s1, s2) = (shared.clone(), shared.clone());
    let render: crate::metrics::http::Render = Arc::new(move || {
        ops::refresh_metrics(&s1);
        s1.data.metrics.render()
    });
    let health: crate::metrics::http::Health =
        Arc::new(move || ops::health(&s2).map_err(|e| crate::metrics::http::NotServing(e.to_string())));
    let endpoint = tokio::spawn(crate::metrics::http::serve(listener, render, health));
    let (fatal_tx, mut fatal_rx) = tokio::sync::oneshot::channel();
    let supervisor = supervisor::Supervisor::new(shared.clone(), fatal_tx).start();
    let background = spawn_readiness_and_watchdog(shared.clone(), notifier.clone());
    // Opening the datasets is the first reload: a SIGHUP meanwhile waits for it.
    let mut reloading: Option<tokio::task::JoinHandle<()>> = Some(tokio::spawn(reload::open_at_start(shared.clone())));
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
            () = async { if let Some(r) = reloading.as_mut() { let _ = r.await; } }, if reloading.is_some() => {
                reloading = reload_again.then(|| tokio::spawn(reload::reload(shared.clone(), notifier.clone())));
                reload_again = false;
            }
            msg = &mut fatal_rx => break Err(PipelineError::Fatal(msg.unwrap_or_else(|_| "the supervisor stopped".into()))),
        }
    };
    shared.data.health.set_phase(Phase::Stopping);
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
fn spawn_readiness_and_watchdog(
    shared: Arc<ControlPlane>,
    notifier: Arc<notify::Notifier>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !shared.data.health.all_up() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if shared.data.health.phase() == Phase::Starting {
            shared.data.health.set_phase(Phase::Serving);
            notifier.ready(&ops::status_line(&shared));
            tracing::info!("{}", ops::status_line(&shared));
            // The datasets open after READY=1: tell systemd how that went, after it.
            let (s, n) = (shared.clone(), notifier.clone());
            tokio::spawn(async move {
                while !s.data.opened_at_start.load(std::sync::atomic::Ordering::Acquire) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                n.status(&ops::status_line(&s));
            });
        }
        let Some(every) = notifier.watchdog_interval() else { return };
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            notifier.watchdog();
        }
    })
}

/// Raises the soft limit on open descriptors to the hard one (a login shell's soft limit is often
/// 1024, below what `max_connections` and `max_sessions` allow), and warns when even the hard
/// limit is below what the daemon's own limits may need: then `EMFILE`, not a clear refusal,
/// would be the first limit a client meets.
fn raise_descriptor_limit(config: &Config) {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let d = &config.daemon;
    let mut limit = getrlimit(Resource::Nofile);
    if let Some(hard) = limit.maximum {
        if limit.current.is_some_and(|soft| soft < hard) {
            limit.current = Some(hard);
            if let Err(e) = setrlimit(Resource::Nofile, limit) {
                tracing::warn!(error = %e, "cannot raise the descriptor limit to its hard limit");
            }
        }
    }
    // A connection's socket, a session's memfd, and room for data files, listeners and state.
    let needed = (d.max_connections + d.max_sessions + 256) as u64;
    let now = getrlimit(Resource::Nofile).current;
    if let Some(soft) = now.filter(|&soft| soft < needed) {
        tracing::warn!(
            limit = soft,
            needed,
            "the descriptor limit (RLIMIT_NOFILE) is below max_connections + max_sessions + 256: raise it (LimitNOFILE= in the unit) or lower those keys"
        );
    }
}
