//! Operations glue between the running pipeline and the outside: the metric gauges that mirror
//! pipeline state ([`refresh_metrics`], run before every scrape), `/healthz` ([`health`]), daemon
//! checkpoints (`ControlPlane::write_checkpoint`) and the housekeeping thread ([`Housekeeping`]: memory
//! samples and the host-memory guard every [`MEMORY_SAMPLE_INTERVAL`], the state directory's
//! disk use every [`STATE_DIR_USAGE_INTERVAL`], the index-cache tidy, a checkpoint every
//! `checkpoint_interval_secs`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod memory;
pub mod notify;
pub mod reload;
pub mod signals;

use crate::metrics::Metrics;
use crate::stage::Stage;

use super::control::{ControlPlane, SocketAt};
use super::lifecycle::Phase;
use memory::{HostGuard, Sampler, MEMORY_SAMPLE_INTERVAL};

/// Sets the gauges that mirror state owned by the pipeline (queues, cache, sessions, memory
/// budget, checkpoint age, datasets).
pub fn refresh_metrics(shared: &ControlPlane) {
    let m = &shared.data.metrics;
    let c = &shared.data.channels;
    for (stage, len, cap) in [
        ("readahead", c.requests.1.len(), c.requests.1.capacity()),
        ("parsers", c.to_parse.1.len(), c.to_parse.1.capacity()),
        ("cache", c.parsed.1.len(), c.parsed.1.capacity()),
    ] {
        m.data.stage_queue_depth.with_label_values(&[stage]).set(i64::try_from(len).unwrap_or(i64::MAX));
        m.data
            .stage_queue_capacity
            .with_label_values(&[stage])
            .set(cap.and_then(|c| i64::try_from(c).ok()).unwrap_or(0));
    }
    let catalog = shared.data.catalog();
    if let Some(r) = catalog.remote_cell().get() {
        let s = r.chunks.stats();
        m.data.object_cache_bytes.set(to_i64(s.bytes));
        m.data.object_cache_limit_bytes.set(to_i64(r.chunks.max_bytes()));
        m.data.object_cache_lookups.with_label_values(&["hit"]).set(to_i64(s.hits));
        m.data.object_cache_lookups.with_label_values(&["miss"]).set(to_i64(s.misses));
        m.data.object_fetched_bytes.set(to_i64(s.fetched_bytes));
        let counts = r.outcome_counts();
        for (o, n) in minibatchd_engine::remote::SharedIndexOutcome::ALL.iter().zip(counts) {
            m.data.object_indexes.with_label_values(&[o.name()]).set(to_i64(n));
        }
    }
    if let Some(p) = catalog.parsed_cache() {
        let s = p.stats();
        m.data.parsed_cache_bytes.set(to_i64(s.bytes));
        m.data.parsed_cache_limit_bytes.set(to_i64(p.limit()));
        m.data.parsed_cache_entries.set(to_i64(s.entries));
        Metrics::mirror(&m.data.parsed_cache_hits, s.hits);
        Metrics::mirror(&m.data.parsed_cache_misses, s.misses);
        Metrics::mirror(&m.data.parsed_cache_rejected, s.rejected);
        Metrics::mirror(&m.data.parsed_cache_evictions, s.evictions);
        Metrics::mirror(&m.data.parsed_cache_write_errors, s.write_errors);
        Metrics::mirror(&m.data.parsed_cache_mapped, s.mapped);
        Metrics::mirror(&m.data.parsed_cache_revoked, minibatchd_sys::lease::revoked());
        Metrics::mirror(&m.data.parsed_cache_read_bytes, s.bytes_read);
        Metrics::mirror(&m.data.parsed_cache_written_bytes, s.bytes_written);
    }
    let (stats, budget, _) = shared.data.cache.snapshot();
    m.data.cache_bytes.set(to_i64(stats.bytes));
    m.data.cache_chunks.set(to_i64(stats.chunks));
    m.data.cache_budget_bytes.set(to_i64(budget));
    Metrics::mirror(&m.data.cache_hits, stats.hits);
    Metrics::mirror(&m.data.cache_misses, stats.misses);
    Metrics::mirror(&m.data.cache_evictions, stats.evictions);
    Metrics::mirror(&m.data.cache_over_budget_loads, stats.over_budget_loads);
    Metrics::mirror(&m.data.cache_refused_loads, stats.refused_loads);
    Metrics::mirror(&m.data.cache_shed_chunks, stats.shed_chunks);
    Metrics::mirror(&m.data.cache_mapped_copies, stats.mapped_copies);
    let (connected, lingering, rings, sampling, limit) = {
        let mut reg = shared.registry();
        reg.expire(Instant::now());
        let (a, l) = reg.counts();
        (a, l, reg.rings_bytes(), reg.sampling_bytes(), reg.limit())
    };
    m.control.sessions.with_label_values(&["connected"]).set(to_i64(connected as u64));
    m.control.sessions.with_label_values(&["lingering"]).set(to_i64(lingering as u64));
    m.ops.memory_limit_bytes.set(to_i64(limit));
    m.ops.memory_used_bytes.with_label_values(&["cache"]).set(to_i64(stats.bytes));
    m.ops.memory_used_bytes.with_label_values(&["rings"]).set(to_i64(rings));
    m.ops.memory_used_bytes.with_label_values(&["sampling"]).set(to_i64(sampling));
    let catalog = shared.data.catalog();
    m.ops.memory_used_bytes.with_label_values(&["index"]).set(to_i64(catalog.index_bytes()));
    let (ready, failed) = catalog.counts();
    m.data.datasets.with_label_values(&["ready"]).set(to_i64(ready as u64));
    m.data.datasets.with_label_values(&["failed"]).set(to_i64(failed as u64));
    m.refresh_checkpoint_age();
}

/// Files and bytes in a directory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Usage {
    files: u64,
    bytes: u64,
}

/// How often the housekeeping thread measures the state directory's disk use (a `stat` per file:
/// not on the scrape's path, which a slow file system would stall).
const STATE_DIR_USAGE_INTERVAL: Duration = Duration::from_secs(10);

/// Sets `minibatchd_state_dir_{bytes,files}` from `state_dir/index` and `state_dir/inflated`.
fn measure_state_dir(shared: &ControlPlane) {
    use minibatchd_engine::format::{index_cache::INDEX_DIR, inflate::INFLATED_DIR};
    let m = &shared.data.metrics;
    let state_dir = shared.config().daemon.state_dir.clone();
    for dir in [INDEX_DIR, INFLATED_DIR] {
        let usage = dir_usage(&state_dir.join(dir));
        m.ops.state_dir_bytes.with_label_values(&[dir]).set(to_i64(usage.bytes));
        m.ops.state_dir_files.with_label_values(&[dir]).set(to_i64(usage.files));
    }
}

/// The regular files directly in `dir` (links not followed) and their bytes; nothing when it is
/// absent or unreadable.
fn dir_usage(dir: &std::path::Path) -> Usage {
    let mut usage = Usage::default();
    let Ok(entries) = std::fs::read_dir(dir) else { return usage };
    for e in entries.flatten() {
        if let Ok(meta) = e.metadata() {
            if meta.is_file() {
                usage.files += 1;
                usage.bytes += meta.len();
            }
        }
    }
    usage
}

/// The `STATUS=` line for `sd_notify`.
pub fn status_line(shared: &ControlPlane) -> String {
    let (ready, failed) = shared.data.catalog().counts();
    let indexing = shared.data.indexing.count();
    // Found by a probe: after a refused reload, `systemctl status` said "serving" as after a
    // good one; the operator who ran `systemctl reload` is told until a reload succeeds.
    let reload = if shared.data.metrics.ops.config_last_reload_successful.get() == 0 {
        "; the last reload was refused or partial (the log says why)"
    } else {
        ""
    };
    format!(
        "serving {ready} dataset(s){}{}{reload}",
        if indexing > 0 { format!(", {indexing} indexing") } else { String::new() },
        if failed > 0 { format!(", {failed} failed to open") } else { String::new() }
    )
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Why the daemon is not serving.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unhealthy {
    /// Stages are starting.
    #[error("starting")]
    Starting,
    /// The daemon is stopping.
    #[error("stopping")]
    Stopping,
    /// Serving, but these stages do not run (the supervisor is restarting them).
    #[error("stage(s) not running: {}", .0.iter().map(|s| s.name()).collect::<Vec<_>>().join(", "))]
    StagesDown(Vec<Stage>),
    /// The last checkpoint write failed: every `open` is refused until one succeeds.
    #[error("{0}: sessions cannot be opened")]
    Checkpoint(String),
    /// The control socket's path no longer leads to the socket this daemon listens on: no
    /// client can connect.
    #[error("the control socket {0} is gone or replaced: no client can connect (restart the daemon)")]
    SocketGone(String),
}

/// `Ok` while the daemon serves with every stage running.
///
/// # Errors
/// [`Unhealthy`]: why not (the `/healthz` `503` body).
pub fn health(shared: &ControlPlane) -> Result<(), Unhealthy> {
    match shared.data.health.phase() {
        Phase::Starting => return Err(Unhealthy::Starting),
        Phase::Stopping => return Err(Unhealthy::Stopping),
        Phase::Serving => {}
    }
    let down = shared.data.health.down();
    if !down.is_empty() {
        return Err(Unhealthy::StagesDown(down));
    }
    // Found by a probe: `200 ok` while every open was refused for the checkpoint, or while the
    // socket had been removed from under the daemon.
    if let Some(e) = shared.checkpoint_failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone() {
        return Err(Unhealthy::Checkpoint(e));
    }
    let socket = shared.config().daemon.socket.clone();
    if matches!(shared.socket_at(&socket), SocketAt::Gone | SocketAt::Other) {
        return Err(Unhealthy::SocketGone(socket.display().to_string()));
    }
    Ok(())
}

/// Applies one memory sample: gauges, then the host guard (cache cap first, refusal only if the
/// cache cannot cover the shortfall).
fn sample_memory(shared: &ControlPlane, sampler: &mut Sampler, guard: &mut HostGuard) {
    let s = sampler.sample();
    let m = &shared.data.metrics;
    m.ops.process_resident_memory_bytes.set(to_i64(s.process_resident));
    m.ops.process_virtual_memory_bytes.set(to_i64(s.process_virtual));
    m.ops.host_memory_total_bytes.set(to_i64(s.host_total));
    m.ops.host_memory_available_bytes.set(to_i64(s.host_available));
    let reserve = shared.config().daemon.host_memory_reserve_bytes;
    let limit = shared.registry().limit();
    if guard.tell_limit_over_host(limit, s.host_total) {
        // Found by a probe: under a limit of 1 TB on a 23 GB host, a session admitted for what
        // the limit allows grew past the host's memory.
        tracing::warn!(
            memory_limit_bytes = limit,
            host_memory_bytes = s.host_total,
            "memory_limit_bytes is above the host's memory: sessions are admitted for memory the host does not have, \
             and the daemon may be killed for memory instead of refusing them; set it below the host's memory \
             (less what the trainers take)"
        );
    }
    // The chunks of dataset versions a reload replaced go once their last session has ended.
    shared.data.cache.forget_datasets(|i| shared.data.runtime(i).is_some());
    let (stats, _, evictable) = shared.data.cache.snapshot();
    let v = guard.judge(s.host_available, reserve, stats.bytes, evictable, limit);
    m.ops.host_memory_shortfall_bytes.set(to_i64(v.shortfall));
    let was_short = shared.host.shortfall.swap(v.shortfall, Ordering::Relaxed) > 0;
    if v.shortfall > 0 && !was_short {
        tracing::warn!(
            available = s.host_available,
            reserve,
            shortfall = v.shortfall,
            cache_cap = v.cache_cap,
            "the host is short of memory; shrinking the chunk cache"
        );
    } else if v.shortfall == 0 && was_short {
        tracing::info!(available = s.host_available, reserve, "host memory recovered");
    }
    shared.host.cap.store(v.cache_cap, Ordering::Relaxed);
    shared.host.refuse.store(v.refuse, Ordering::Relaxed);
    let reg = shared.registry();
    shared.rebudget(&reg);
    drop(reg);
    // The heaps' free pages (chunks freed by another thread than the one that parsed them) go
    // back to the kernel, so RSS stays near what the accounting counts.
    let _ = minibatchd_sys::memory::trim_heaps();
}

/// How often the housekeeping thread removes the index caches of data files that are gone and
/// of files and objects no dataset reads, and the decompressed copies no dataset reads (and once
/// soon after start).
const INDEX_TIDY_INTERVAL: Duration = Duration::from_secs(3600);
/// How soon a tidy that ran while datasets were being opened runs again (it kept the caches of
/// every existing file and object and every decompressed copy, see [`tidy_index_cache`]).
const INDEX_TIDY_RETRY: Duration = Duration::from_secs(60);

/// Removes the index caches that will not be used again
/// ([`minibatchd_engine::format::index_cache::remove_orphans`]) and the decompressed copies of
/// gzip inputs no dataset reads ([`minibatchd_engine::format::inflate::remove_unused`]): a dataset
/// whose files or objects rotate would otherwise leave one of each behind per file, for good.
/// Returns whether every configured dataset was open, so that what no dataset reads could be
/// judged too ([`Tidied`]).
///
/// `ours` collects the decompressed copies the daemon's datasets have read since it started: of
/// those that no dataset reads any more, the most recently used are kept for reuse within
/// `max_inflated_bytes` and the rest removed; the copies of other processes (a `dump` or `index`
/// on this host, which may be reading theirs) keep their day.
fn tidy_index_cache(shared: &ControlPlane, ours: &mut std::collections::HashSet<std::path::PathBuf>) -> Tidied {
    let opening = !shared.data.opened_at_start.load(Ordering::Acquire) || shared.data.indexing.count() > 0;
    let config = shared.config();
    let catalog = shared.data.catalog();
    // What the datasets read is known only once every configured dataset is open: until then
    // (datasets being indexed, or failed) no cache of an existing file or object and no
    // decompressed copy counts as unused. Replaced versions that sessions still read count as
    // open. The indexing table is read on both sides of taking the catalog, so that a reload swapping
    // catalogs in between is seen.
    let opening = opening || shared.data.indexing.count() > 0;
    let settled = !opening && config.datasets.keys().all(|name| catalog.get(name).is_ok());
    // (A path per input and its canonical form: only worth it when they decide something.)
    let inputs = if settled { catalog.inputs() } else { std::collections::HashSet::new() };
    // A reload that starts indexing while this runs makes everything count as in use again from
    // then on: the datasets it adds read files that `inputs` does not list.
    let in_use = |input: &std::path::Path| !settled || inputs.contains(input) || shared.data.indexing.count() > 0;
    let state_dir = &config.daemon.state_dir;
    let inflated = state_dir.join(minibatchd_engine::format::inflate::INFLATED_DIR);
    let inflated_canonical = inflated.canonicalize().unwrap_or_else(|_| inflated.clone());
    let is_copy = |p: &std::path::Path| p.starts_with(&inflated) || p.starts_with(&inflated_canonical);
    ours.extend(catalog.inputs().into_iter().filter(|p| is_copy(p)));
    ours.extend(catalog.copies());
    ours.retain(|p| p.exists());
    // `[daemon]`'s `max_inflated_bytes` (every dataset carries it): what the copies no dataset
    // reads may take together.
    let keep_inflated = config
        .datasets
        .values()
        .next()
        .map_or(minibatchd_engine::options::DEFAULT_MAX_INFLATED_BYTES, |d| d.inflate.max_bytes);
    let mut busy = false;
    for (removed, what) in [
        (
            minibatchd_engine::format::index_cache::remove_orphans(state_dir, &in_use),
            "removed the index caches of data files that are gone and of files and objects no dataset reads",
        ),
        (
            minibatchd_engine::format::inflate::remove_unused(
                state_dir,
                &in_use,
                &|p: &std::path::Path| ours.contains(p),
                keep_inflated,
            ),
            "removed the decompressed copies of gzip inputs no dataset reads",
        ),
    ] {
        if removed.files > 0 {
            tracing::info!(files = removed.files, bytes = removed.bytes, "{what}");
        }
        if removed.busy {
            tracing::debug!("{what}: deferred, a copy is being taken up or written");
        }
        busy |= removed.busy;
    }
    if settled && !busy {
        Tidied::Settled
    } else if opening || busy {
        Tidied::Opening
    } else {
        Tidied::Failed
    }
}

/// How a tidy went: which caches and copies are unused was known and acted on (`Settled`), or not
/// yet because datasets were being opened or a decompressed copy was being taken up (`Opening`:
/// try again soon), or not because one failed to open (`Failed`: its inputs stay unknown until a
/// reload; the usual interval).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tidied {
    Settled,
    Opening,
    Failed,
}

/// The housekeeping thread (`mbd-housekeeping`).
#[derive(Debug)]
pub struct Housekeeping {
    stop: std::sync::mpsc::Sender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Housekeeping {
    /// Takes a first memory sample now, then starts the thread.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn start(shared: Arc<ControlPlane>) -> std::io::Result<Self> {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let mut sampler = Sampler::new();
        let mut guard = HostGuard::default();
        sample_memory(&shared, &mut sampler, &mut guard);
        let thread = std::thread::Builder::new().name("mbd-housekeeping".into()).spawn(move || {
            measure_state_dir(&shared);
            let mut last_checkpoint = Instant::now();
            let mut next_usage = Instant::now() + STATE_DIR_USAGE_INTERVAL;
            let mut next_tidy = Instant::now();
            // The decompressed copies the datasets have read since the start (tidy_index_cache).
            let mut copies_read = std::collections::HashSet::new();
            // A reload that swapped the datasets leaves older decompressed copies and caches
            // behind: tidy soon after it rather than within the hour.
            let mut catalog_changes = shared.data.catalog_changes();
            let mut next_sample = Instant::now() + MEMORY_SAMPLE_INTERVAL;
            loop {
                // Awake for the next sample and for the next checkpoint, whichever comes first
                // (found by a probe: with `checkpoint_interval_secs = 1` the loop's 2 s sleep made
                // the checkpoint every 2 s, and a crash's replay twice what the setting says).
                let interval = Duration::from_secs(shared.config().daemon.checkpoint_interval_secs);
                let wake = next_sample.min(last_checkpoint + interval);
                match stopped.recv_timeout(wake.saturating_duration_since(Instant::now())) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                if last_checkpoint.elapsed() >= interval {
                    let _ = shared.write_checkpoint("periodic");
                    last_checkpoint = Instant::now();
                }
                if Instant::now() < next_sample {
                    continue;
                }
                next_sample = Instant::now() + MEMORY_SAMPLE_INTERVAL;
                sample_memory(&shared, &mut sampler, &mut guard);
                if catalog_changes.has_changed().unwrap_or(false) {
                    catalog_changes.borrow_and_update();
                    next_tidy = Instant::now();
                }
                if Instant::now() >= next_tidy {
                    let retry = tidy_index_cache(&shared, &mut copies_read) == Tidied::Opening;
                    next_tidy = Instant::now() + if retry { INDEX_TIDY_RETRY } else { INDEX_TIDY_INTERVAL };
                    next_usage = Instant::now(); // measured again right after each tidy
                }
                if Instant::now() >= next_usage {
                    measure_state_dir(&shared);
                    next_usage = Instant::now() + STATE_DIR_USAGE_INTERVAL;
                }
            }
        })?;
        Ok(Self { stop, thread: Some(thread) })
    }

    /// Stops and joins the thread.
    pub fn stop(&mut self) {
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Housekeeping {
    fn drop(&mut self) {
        self.stop();
    }
}
