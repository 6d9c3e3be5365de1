//! The supervisor: starts the stages in order, restarts a stage that stops while the daemon is
//! running (with exponential backoff, at most [`RestartPolicy::max_restarts`] times within
//! [`RestartPolicy::window`], each restart logged and counted), and stops them in reverse order.
//!
//! Start order: readahead → parser pool → chunk cache → delivery → session manager. The
//! session manager (which opens the control socket) comes last, after delivery, so no client can
//! open a session before every stage that serves it runs; it is also the first to stop, so no
//! session is opened during shutdown. A stage that cannot be kept running (restart limit
//! reached) is fatal: the daemon stops with an error.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::control::server::SessionManager;
use super::control::ControlPlane;
use super::data::chunk_cache_stage::CacheStage;
use super::data::delivery::Delivery;
use super::data::parsers::ParserPool;
use super::data::readahead::Readahead;
use super::lifecycle::{StageStopped, StopStage};
use crate::stage::Stage;

/// What to do about a stage that stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Restart it after this delay.
    Restart(Duration),
    /// Too many restarts: give up.
    GiveUp,
}

/// Restart backoff and limit of one stage (plain logic, tested without actors).
#[derive(Debug, Clone)]
pub struct RestartPolicy {
    /// Most restarts within `window`.
    pub max_restarts: usize,
    /// The window.
    pub window: Duration,
    /// First delay; doubled per recent restart, capped at `max_delay`.
    pub base_delay: Duration,
    /// Largest delay.
    pub max_delay: Duration,
    recent: VecDeque<Instant>,
    /// Restarts so far (for metrics).
    pub total: u64,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self {
            max_restarts: 5,
            window: Duration::from_secs(60),
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(5),
            recent: VecDeque::new(),
            total: 0,
        }
    }
}

impl RestartPolicy {
    /// The stage stopped at `now`.
    pub fn on_stop(&mut self, now: Instant) -> Decision {
        while self.recent.front().is_some_and(|&t| now.duration_since(t) > self.window) {
            self.recent.pop_front();
        }
        if self.recent.len() >= self.max_restarts {
            return Decision::GiveUp;
        }
        let factor = 1u32 << self.recent.len().min(16);
        self.recent.push_back(now);
        self.total += 1;
        Decision::Restart(self.base_delay.saturating_mul(factor).min(self.max_delay))
    }
}

/// Slack beyond `shutdown_grace_secs` for connections to finish their last replies.
const GRACE_MARGIN: Duration = Duration::from_secs(2);

/// Stop every stage in reverse order; replies when done.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Shutdown;

/// Stops a stage as if it had failed, so it goes through the restart policy (operators' and
/// tests' hook; a real failure takes the same path).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "bool")]
pub struct FailStage(pub Stage);

/// Restart counts per stage (a hook for metrics).
#[derive(Debug, Message)]
#[rtype(result = "Vec<(Stage, u64)>")]
pub struct RestartCounts;

#[derive(Default)]
struct Addrs {
    readahead: Option<Addr<Readahead>>,
    parsers: Option<Addr<ParserPool>>,
    cache: Option<Addr<CacheStage>>,
    delivery: Option<Addr<Delivery>>,
    sessions: Option<Addr<SessionManager>>,
}

/// The supervisor actor.
pub struct Supervisor {
    shared: Arc<ControlPlane>,
    addrs: Addrs,
    policies: HashMap<Stage, RestartPolicy>,
    shutting_down: bool,
    fatal: Option<tokio::sync::oneshot::Sender<String>>,
}

impl Supervisor {
    /// A supervisor; `fatal` receives a message if a stage cannot be kept running.
    #[must_use]
    pub fn new(shared: Arc<ControlPlane>, fatal: tokio::sync::oneshot::Sender<String>) -> Self {
        Self {
            shared,
            addrs: Addrs::default(),
            policies: Stage::ALL.iter().map(|&s| (s, RestartPolicy::default())).collect(),
            shutting_down: false,
            fatal: Some(fatal),
        }
    }

    fn set_up(&self, stage: Stage, up: bool) {
        self.shared.data.health.set_stage_up(&self.shared.data.metrics, stage, up);
    }

    fn start_stage(&mut self, stage: Stage, ctx: &mut Context<Self>) {
        let me = ctx.address().recipient::<StageStopped>();
        let shared = self.shared.clone();
        // The session manager reports itself up once its socket is bound.
        if stage != Stage::Sessions {
            self.set_up(stage, true);
        }
        match stage {
            Stage::Readahead => self.addrs.readahead = Some(Readahead::new(shared.data.clone(), me).start()),
            Stage::Parsers => self.addrs.parsers = Some(ParserPool::new(shared.data.clone(), me).start()),
            Stage::Cache => self.addrs.cache = Some(CacheStage::new(shared.data.clone(), me).start()),
            Stage::Delivery => {
                let threads = crate::pipeline::data::producer_threads(&shared.config());
                match Delivery::new(me, threads) {
                    Ok(d) => self.addrs.delivery = Some(d.start()),
                    Err(e) => {
                        tracing::error!(error = %e, threads, "cannot start the producer threads");
                        self.set_up(stage, false);
                    }
                }
            }
            Stage::Sessions => {
                let Some(delivery) = self.addrs.delivery.clone() else {
                    tracing::error!("the session manager needs the delivery stage");
                    return;
                };
                self.addrs.sessions = Some(SessionManager::new(shared, delivery, me).start());
            }
        }
        tracing::debug!(stage = stage.name(), "stage started");
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        for stage in Stage::ALL {
            self.start_stage(stage, ctx);
        }
    }
}

impl Handler<StageStopped> for Supervisor {
    type Result = ();
    fn handle(&mut self, StageStopped(stage): StageStopped, ctx: &mut Self::Context) {
        self.set_up(stage, false);
        if self.shutting_down {
            return;
        }
        let policy = self.policies.entry(stage).or_default();
        match policy.on_stop(Instant::now()) {
            Decision::Restart(delay) => {
                self.shared.data.metrics.data.stage_restarts.with_label_values(&[stage.name()]).inc();
                tracing::warn!(
                    stage = stage.name(),
                    restarts = policy.total,
                    delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    "stage stopped; restarting"
                );
                ctx.run_later(delay, move |act, ctx| {
                    if !act.shutting_down {
                        act.start_stage(stage, ctx);
                    }
                });
            }
            Decision::GiveUp => {
                let msg = format!(
                    "stage '{}' stopped {} times within {:?}; giving up",
                    stage.name(),
                    policy.max_restarts + 1,
                    policy.window
                );
                tracing::error!("{msg}");
                if let Some(tx) = self.fatal.take() {
                    let _ = tx.send(msg);
                }
            }
        }
    }
}

impl Handler<FailStage> for Supervisor {
    type Result = bool;
    fn handle(&mut self, FailStage(stage): FailStage, _: &mut Self::Context) -> bool {
        match stage {
            Stage::Readahead => self.addrs.readahead.as_ref().map(|a| a.do_send(StopStage)).is_some(),
            Stage::Parsers => self.addrs.parsers.as_ref().map(|a| a.do_send(StopStage)).is_some(),
            Stage::Cache => self.addrs.cache.as_ref().map(|a| a.do_send(StopStage)).is_some(),
            Stage::Delivery => self.addrs.delivery.as_ref().map(|a| a.do_send(StopStage)).is_some(),
            Stage::Sessions => self.addrs.sessions.as_ref().map(|a| a.do_send(StopStage)).is_some(),
        }
    }
}

impl Handler<RestartCounts> for Supervisor {
    type Result = Vec<(Stage, u64)>;
    fn handle(&mut self, _: RestartCounts, _: &mut Self::Context) -> Self::Result {
        Stage::ALL.iter().map(|s| (*s, self.policies.get(s).map_or(0, |p| p.total))).collect()
    }
}

impl Handler<Shutdown> for Supervisor {
    type Result = ResponseActFuture<Self, ()>;
    fn handle(&mut self, _: Shutdown, _: &mut Self::Context) -> Self::Result {
        self.shutting_down = true;
        let sessions = self.addrs.sessions.take();
        let delivery = self.addrs.delivery.take();
        let cache = self.addrs.cache.take();
        let parsers = self.addrs.parsers.take();
        let readahead = self.addrs.readahead.take();
        let shared = self.shared.clone();
        Box::pin(
            async move {
                // Reverse start order; each stage has finished its stop work when it replies.
                if let Some(a) = sessions {
                    let _ = a.send(StopStage).await;
                }
                // The socket is closed; connected clients get their grace period to report their
                // last position (the connections end by themselves when it is over).
                let grace = Duration::from_secs(shared.config().daemon.shutdown_grace_secs) + GRACE_MARGIN;
                if tokio::time::timeout(grace, shared.connections.wait_idle()).await.is_err() {
                    tracing::warn!(
                        connections = shared.connections.count(),
                        "connections still open after the grace period"
                    );
                }
                if let Some(a) = delivery {
                    let _ = a.send(StopStage).await;
                }
                if let Some(a) = cache {
                    let _ = a.send(StopStage).await;
                }
                if let Some(a) = parsers {
                    let _ = a.send(StopStage).await;
                }
                if let Some(a) = readahead {
                    let _ = a.send(StopStage).await;
                }
                tracing::info!("all stages stopped");
            }
            .into_actor(self),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_the_limit_applies_within_the_window() {
        let mut p = RestartPolicy { max_restarts: 3, ..RestartPolicy::default() };
        let t = Instant::now();
        assert_eq!(p.on_stop(t), Decision::Restart(Duration::from_millis(100)));
        assert_eq!(p.on_stop(t), Decision::Restart(Duration::from_millis(200)));
        assert_eq!(p.on_stop(t), Decision::Restart(Duration::from_millis(400)));
        assert_eq!(p.on_stop(t), Decision::GiveUp);
        assert_eq!(p.total, 3);
        // Once the window has passed, the stage gets a fresh allowance.
        assert_eq!(p.on_stop(t + Duration::from_secs(61)), Decision::Restart(Duration::from_millis(100)));
    }

    #[test]
    fn a_failed_stage_is_restarted_and_counted_and_shutdown_stops_all() {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = format!(
            "[daemon]\nsocket = \"{}/s.sock\"\nstate_dir = \"{}/state\"\n[datasets.t]\nformat = \"ctf\"\nfiles = [\"missing.ctf\"]\n[datasets.t.streams.f]\ndim = 1\nformat = \"dense\"\n",
            dir.path().display(),
            dir.path().display()
        );
        let config = crate::config::Config::from_toml_str(&text, dir.path()).expect("config");
        let metrics = crate::metrics::Metrics::new().expect("metrics");
        let catalog = crate::pipeline::data::catalog::Catalog::open(&config, &metrics);
        let shared = Arc::new(ControlPlane::new(config, catalog, metrics));
        let socket = dir.path().join("s.sock");
        let shared_probe = shared.clone();
        actix::System::new().block_on(async move {
            let (tx, _rx) = tokio::sync::oneshot::channel();
            let sup = Supervisor::new(shared, tx).start();
            let deadline = Instant::now() + Duration::from_secs(30);
            while !socket.exists() {
                assert!(Instant::now() < deadline, "the session manager did not bind");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            for stage in [Stage::Readahead, Stage::Sessions] {
                assert!(sup.send(FailStage(stage)).await.expect("send"));
            }
            loop {
                let counts = sup.send(RestartCounts).await.expect("counts");
                let restarted = |s: Stage| counts.iter().any(|&(st, n)| st == s && n == 1);
                if restarted(Stage::Readahead)
                    && restarted(Stage::Sessions)
                    && socket.exists()
                    && shared_probe.data.health.stage_up(Stage::Sessions)
                {
                    assert!(shared_probe
                        .data
                        .metrics
                        .render()
                        .contains("minibatchd_stage_restarts_total{stage=\"readahead\"} 1"));
                    assert!(
                        counts.iter().all(|&(st, n)| n == 0 || st == Stage::Readahead || st == Stage::Sessions),
                        "{counts:?}"
                    );
                    break;
                }
                assert!(Instant::now() < deadline, "not restarted: {counts:?}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            sup.send(Shutdown).await.expect("shutdown");
            assert!(!socket.exists(), "the socket is removed at shutdown");
            while Stage::ALL.iter().any(|&s| shared_probe.data.health.stage_up(s)) {
                assert!(Instant::now() < deadline, "a stage still reports up after shutdown");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
    }

    #[test]
    fn delays_are_capped() {
        let mut p = RestartPolicy { max_restarts: 100, ..RestartPolicy::default() };
        let t = Instant::now();
        let mut last = Duration::ZERO;
        for _ in 0..20 {
            if let Decision::Restart(d) = p.on_stop(t) {
                last = d;
            }
        }
        assert_eq!(last, Duration::from_secs(5));
    }
}
