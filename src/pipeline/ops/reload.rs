//! Configuration reload (SIGHUP) and the validation shared with `minibatchd validate`.
//!
//! Order: `RELOADING=1` → read and validate the file exactly as `validate` does (a bad file is
//! logged, counted in `minibatchd_config_reloads_total{result="failure"}` and the running
//! configuration is kept) → open the added and changed datasets off the event loop (indexing can
//! take a while; sessions keep being served meanwhile) → swap the configuration and the dataset
//! catalog in one step → `READY=1`.
//!
//! What changes: datasets are added, removed or replaced; sessions on unchanged datasets never
//! notice. A session on a removed dataset, or on a removed configured mixture, ends with
//! `error{unknown_dataset}` (it stays resumable by name, should it come back). A session on a
//! changed dataset finishes on the version it opened (its state names that version's identity);
//! new sessions get the new version. A changed dataset whose new version fails to open keeps
//! serving the old one. Of `[daemon]`, [`hot_daemon_keys`] apply at once (memory limit, defaults
//! of new sessions, linger, grace, intervals, host reserve); the others (socket, listen address,
//! state directory, queue capacities, parser threads) are logged as needing a restart and keep
//! their running value.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::config::{Config, ConfigError, DaemonConfig};
use minibatchd_engine::dataset::resolve_files;
use minibatchd_engine::format::errors::DataError;

use super::notify::Notifier;
use crate::pipeline::control::ControlPlane;
use crate::pipeline::data::catalog::{Catalog, CatalogChanges};

/// Why a configuration file is not acceptable.
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    /// Unreadable, not TOML, or invalid (every problem listed).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Datasets whose `files` match nothing or cannot be listed: every entry of every dataset
    /// with its problem (in the message, not a `source`: printed once, not again as a cause).
    #[error("{}", .0.iter().map(|(d, e)| format!("datasets.{d}.files: {e}")).collect::<Vec<_>>().join("\n"))]
    Files(Vec<(String, DataError)>),
}

/// Loads `path` and checks it as `minibatchd validate` does: every config problem, then that
/// every dataset's files resolve.
///
/// # Errors
/// [`ValidateError`].
pub fn validate(path: &Path) -> Result<Config, ValidateError> {
    validate_in(path, None, &std::sync::OnceLock::new())
}

/// [`validate`] in a running daemon whose `[daemon]` is `running` and whose object storage is
/// kept in `objects`: object storage, when this is the first configuration that needs it, is set
/// up there with the running daemon's `object_*` keys and state directory (they apply at a
/// restart only; a reload's new ones are not used).
fn validate_in(
    path: &Path,
    running: Option<&crate::config::DaemonConfig>,
    objects: &std::sync::OnceLock<std::sync::Arc<minibatchd_engine::remote::Remote>>,
) -> Result<Config, ValidateError> {
    let c = Config::load(path)?;
    let mut for_store = None;
    if let Some(r) = running {
        let mut with_running = c.clone();
        with_running.daemon.objects = r.objects.clone();
        with_running.daemon.state_dir.clone_from(&r.state_dir);
        for_store = Some(with_running);
    }
    // Objects are listed like files: object storage must be there first.
    let remote = match crate::objects::ensure(objects, for_store.as_ref().unwrap_or(&c)) {
        Ok(r) => r,
        Err(e) => {
            return Err(ValidateError::Files(vec![(String::new(), DataError::Dataset(format!("object storage: {e}")))]))
        }
    };
    let mut problems = Vec::new();
    for d in c.datasets.values() {
        for s in &d.sources {
            // Each entry on its own first, so that every missing file is reported, not only the
            // first; then the whole list (its walk limits hold for all entries together).
            let before = problems.len();
            for entry in &s.files {
                if let Err(e) = resolve_files(std::slice::from_ref(entry), remote.as_deref()) {
                    problems.push((d.name.clone(), e));
                }
            }
            if problems.len() == before {
                if let Err(e) = resolve_files(&s.files, remote.as_deref()) {
                    problems.push((d.name.clone(), e));
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(c)
    } else {
        Err(ValidateError::Files(problems))
    }
}

/// The `[daemon]` keys a reload applies at once.
#[must_use]
pub fn hot_daemon_keys() -> &'static [&'static str] {
    &[
        "memory_limit_bytes",
        "ring_slots",
        "slot_size_bytes",
        "session_linger_secs",
        "shutdown_grace_secs",
        "checkpoint_interval_secs",
        "host_memory_reserve_bytes",
        "huge_pages",
    ]
}

/// The `[daemon]` section in force after a reload from `old` to `new`, and the keys that changed
/// but need a restart (they keep `old`'s value).
#[must_use]
pub fn merge_daemon(old: &DaemonConfig, new: &DaemonConfig) -> (DaemonConfig, Vec<&'static str>) {
    let mut out = new.clone();
    let mut restart = Vec::new();
    macro_rules! keep {
        ($($key:ident),*) => {$(
            if old.$key != new.$key {
                restart.push(stringify!($key));
                out.$key = old.$key.clone();
            }
        )*};
    }
    keep!(socket, metrics_listen, state_dir, read_queue_chunks, parsed_queue_chunks, parser_threads, producer_threads);
    // The connection and session limits are read once, at start.
    keep!(max_connections, max_connections_per_uid, max_sessions, max_sessions_per_uid, handshake_timeout_secs);
    // Object storage is set up once per process (its cache, shared indexes and fetches): named
    // by their keys (found by a probe: the warning named `daemon.objects`, which is no key).
    if old.objects != new.objects {
        let (o, n) = (&old.objects, &new.objects);
        for (changed, key) in [
            (o.cache_dir != n.cache_dir, "object_cache_dir"),
            (o.cache_bytes != n.cache_bytes, "object_cache_bytes"),
            (o.index_prefix != n.index_prefix, "object_index_prefix"),
            (o.index_wait_secs != n.index_wait_secs, "object_index_wait_secs"),
            (o.fetches != n.fetches, "object_fetches"),
            (o.retry_secs != n.retry_secs, "object_retry_secs"),
            (o.request_timeout_secs != n.request_timeout_secs, "object_request_timeout_secs"),
        ] {
            if changed {
                restart.push(key);
            }
        }
        out.objects = old.objects.clone();
    }
    // The parsed cache is opened once per process.
    keep!(parsed_cache_dir, parsed_cache_bytes);
    (out, restart)
}

/// A validated configuration with its datasets opened, ready to swap in.
struct Prepared {
    config: Config,
    catalog: Catalog,
    changes: CatalogChanges,
    restart: Vec<&'static str>,
    /// Set when a lower `memory_limit_bytes` was not applied ([`memory_refusal`]): the old limit
    /// stays, and the reload is partial.
    kept_limit: bool,
}

fn prepare(shared: &ControlPlane) -> Result<Prepared, ValidateError> {
    let old = shared.config();
    let running = shared.data.catalog();
    let mut config = validate_in(&old.path, Some(&old.daemon), running.remote_cell())?;
    let (daemon, restart) = merge_daemon(&old.daemon, &config.daemon);
    config.daemon = daemon;
    // `parser_threads` keeps its running value, so does what each dataset takes from it (found
    // by a probe: a reload that changed only that key reopened every dataset).
    if let Some(threads) = old.datasets.values().next().map(|d| d.index_threads) {
        config.datasets.values_mut().for_each(|d| d.index_threads = threads);
    }
    let (catalog, changes) =
        running.reopen(&config, &shared.data.metrics, &shared.data.indexing, Some(shared.data.parse_ahead_reserve()));
    Ok(Prepared { config, catalog, changes, restart, kept_limit: false })
}

/// Runs `work` (an index pass: seconds to minutes) on a thread of its own and waits for it without
/// blocking the event loop. Not tokio's blocking pool: the runtime waits for that pool's tasks
/// when it is dropped, so a SIGTERM during an index pass would wait for the whole pass; this
/// thread is simply abandoned when the daemon exits (a half-written index cache is a temporary
/// file under `state_dir/index/`, never the cache itself). An `Err` if the thread could not be
/// started or `work` panicked.
async fn off_the_loop<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("minibatchd-open".into())
        .spawn(move || {
            let _ = tx.send(work());
        })
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    rx.await.map_err(|_| "the thread opening the datasets panicked".to_owned())
}

/// The mixtures a reload adds, removes and changes, each named with a sign: `+new`, `-gone`,
/// `~changed`.
fn mixture_changes(
    old: &std::collections::BTreeMap<String, crate::config::MixtureConfig>,
    new: &std::collections::BTreeMap<String, crate::config::MixtureConfig>,
) -> Vec<String> {
    let gone = old.keys().filter(|k| !new.contains_key(*k)).map(|k| format!("-{k}"));
    let came = new.iter().filter_map(|(k, m)| match old.get(k) {
        None => Some(format!("+{k}")),
        Some(was) if was != m => Some(format!("~{k}")),
        Some(_) => None,
    });
    gone.chain(came).collect()
}

/// Reloads the configuration file (the SIGHUP path). Never fails: a bad file leaves everything
/// as it was.
pub async fn reload(shared: Arc<ControlPlane>, notifier: Arc<Notifier>) {
    notifier.reloading();
    let started = Instant::now();
    tracing::info!(config = %shared.config().path.display(), "SIGHUP: reloading the configuration");
    let s = shared.clone();
    let outcome = off_the_loop(move || prepare(&s)).await;
    let ok = match outcome {
        Ok(Ok(p)) => {
            let c = &p.changes;
            let (added, removed, changed) = (c.added.clone(), c.removed.clone(), c.changed.clone());
            // Found by a probe: the summary named datasets only, so a reload that changed a
            // mixture's weights logged `changed=[]`.
            let mixtures = mixture_changes(&shared.config().mixtures, &p.config.mixtures);
            let failed: Vec<String> = c.failed.iter().map(|(n, _)| n.clone()).collect();
            let applied = apply(&shared, p);
            if let Some(whole) = applied {
                let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                if whole && failed.is_empty() {
                    tracing::info!(?added, ?removed, ?changed, ?mixtures, elapsed_ms, "configuration reloaded");
                } else {
                    // Found by a probe: a reload whose lower memory limit was not applied logged
                    // `failed=[]` as if it were whole.
                    let memory_limit_kept = !whole;
                    tracing::warn!(
                        ?added,
                        ?removed,
                        ?changed,
                        ?mixtures,
                        ?failed,
                        memory_limit_kept,
                        elapsed_ms,
                        "configuration partially reloaded (counted as partial)"
                    );
                }
            }
            // Found by a probe: a reload whose changed dataset failed to open (its old version
            // serving on), or whose lower memory limit was not applied, was counted a success,
            // and the gauge an operator watches said 1.
            if applied == Some(false) || (applied.is_some() && !failed.is_empty()) {
                shared.data.metrics.ops.config_reloads.with_label_values(&["partial"]).inc();
                shared.data.metrics.ops.config_last_reload_successful.set(0);
                notifier.ready(&super::status_line(&shared));
                return;
            }
            applied.is_some()
        }
        Ok(Err(e)) => {
            tracing::error!("configuration reload refused; the running configuration is kept:\n{e}");
            false
        }
        Err(e) => {
            shared.data.indexing.clear_all(&shared.data.metrics);
            tracing::error!(error = %e, "configuration reload failed; the running configuration is kept");
            false
        }
    };
    shared.data.metrics.ops.config_reloads.with_label_values(&[if ok { "success" } else { "failure" }]).inc();
    shared.data.metrics.ops.config_last_reload_successful.set(i64::from(ok));
    notifier.ready(&super::status_line(&shared));
}

/// Opens (indexes) the configured datasets once the daemon serves: the socket is up and answers
/// `dataset_indexing` meanwhile, so neither systemd's start timeout nor a trainer's connect
/// waits for the index pass.
pub async fn open_at_start(shared: Arc<ControlPlane>) {
    let started = Instant::now();
    let s = shared.clone();
    let opened = off_the_loop(move || {
        let config = s.config();
        let (catalog, changes) =
            s.data.catalog().reopen(&config, &s.data.metrics, &s.data.indexing, Some(s.data.parse_ahead_reserve()));
        (Config::clone(&config), catalog, changes)
    })
    .await;
    match opened {
        Ok((config, catalog, changes)) => {
            let (ready, failed) = catalog.counts();
            // No session is open before the datasets are: nothing to refuse.
            let _ = apply(&shared, Prepared { config, catalog, changes, restart: Vec::new(), kept_limit: false });
            let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            tracing::info!(ready, failed, elapsed_ms, "datasets opened");
            if ready == 0 && failed > 0 {
                tracing::error!(
                    "no dataset could be opened: every session will be refused until a reload (SIGHUP) opens one"
                );
            }
        }
        Err(e) => {
            // The index pass panicked (a bug): no dataset is served; the rest of the daemon is.
            shared.data.indexing.clear_all(&shared.data.metrics);
            tracing::error!(error = %e, "opening the datasets failed");
        }
    }
    shared.data.opened_at_start.store(true, std::sync::atomic::Ordering::Release);
}

/// Sets whether chunks parsed from now on are advised huge pages (`[daemon] huge_pages`): `huge`
/// is the catalog's setting, which every dataset, the parsed cache and the persister share.
pub fn apply_huge_pages(huge: &minibatchd_sys::HugePages, enabled: bool) {
    huge.set(enabled);
    tracing::info!(huge_pages = enabled, "transparent huge pages for parsed chunks");
}

/// Swaps `p` in; `None` (nothing changed) where its datasets' indexes and read buffers would
/// leave the chunk cache less than its floor beside the open sessions ([`memory_refusal`]), else
/// whether it was applied whole (`false`: the old memory limit was kept).
fn apply(shared: &Arc<ControlPlane>, mut p: Prepared) -> Option<bool> {
    {
        let mut reg = shared.registry();
        let threads = shared.data.parser_threads;
        if let Some(refusal) = memory_refusal(shared, &reg, &mut p, threads) {
            for name in &p.changes.added {
                shared.data.metrics.data.forget_dataset(name);
            }
            drop(p);
            shared.data.indexing.clear_finished(&shared.data.metrics, false);
            tracing::error!("configuration reload refused; the running configuration is kept: {refusal}");
            return None;
        }
        crate::pipeline::control::apply_memory_limits(&mut reg, &p.config, &p.catalog, threads);
        shared.rebudget(&reg);
    }
    let kept_limit = p.kept_limit;
    for key in &p.restart {
        tracing::warn!(key = %format!("daemon.{key}"), "changed in the configuration file; takes effect at the next restart");
    }
    for name in &p.changes.kept_old {
        let error = p.changes.failed.iter().find(|(n, _)| n == name).map(|(_, e)| e.to_string()).unwrap_or_default();
        tracing::warn!(dataset = %name, %error, "the new version failed to open; the old version goes on serving its open sessions (new ones on changed files are refused, saying why)");
    }
    for (name, _) in p.changes.failed.iter().filter(|(n, _)| !p.changes.kept_old.contains(n)) {
        tracing::warn!(dataset = %name, "sessions on it are refused until a reload opens it");
    }
    for name in &p.changes.removed {
        shared.data.metrics.data.forget_dataset(name);
    }
    if p.config.daemon.huge_pages != shared.config().daemon.huge_pages {
        apply_huge_pages(p.catalog.huge_pages(), p.config.daemon.huge_pages);
    }
    // The parsed-cache entries of the versions that changed datasets replace, unless a dataset
    // in force still reads them (a configuration change that leaves the parse alone).
    let replaced: Vec<u64> = p
        .changes
        .changed
        .iter()
        .filter_map(|name| shared.data.dataset(name).ok())
        .map(|old| old.dataset.parse_identity())
        .collect();
    p.catalog.note_reopen_failures(&p.changes);
    shared.replace(p.config, p.catalog);
    forget_replaced_entries(shared, &replaced);
    shared.data.indexing.clear_finished(&shared.data.metrics, true);
    // A chunk that failed (a file that was unreadable or malformed) is read again when next
    // asked: the reload is how an operator says the data was repaired.
    let forgotten = shared.data.cache.forget_failures();
    if forgotten > 0 {
        tracing::info!(chunks = forgotten, "failed chunks will be read again");
    }
    // The chunks of the versions replaced or removed that no session reads any more go now (the
    // others once their sessions end: `ops::sample_memory`), before the new versions' preloads.
    shared.data.cache.forget_datasets(|i| shared.data.runtime(i).is_some());
    crate::pipeline::data::preload_datasets(&shared.data, &shared.config());
    Some(!kept_limit)
}

/// Removes the parsed-cache entries of the dataset versions with parse identities `replaced`
/// that no dataset now in force reads, and refuses their later writes; takes writes again for
/// every identity in force (a configuration that came back). Only once the reload is applied:
/// a reload refused after its datasets opened (found by a probe: refused for memory) revived a
/// forgotten version whose open session then wrote 10 entries nobody could read.
fn forget_replaced_entries(shared: &ControlPlane, replaced: &[u64]) {
    let catalog = shared.data.catalog();
    let Some(cache) = catalog.parsed_cache() else { return };
    let in_force: std::collections::HashSet<u64> = catalog.parse_identities();
    for &identity in &in_force {
        cache.revive(identity);
    }
    for &identity in replaced.iter().filter(|i| !in_force.contains(i)) {
        let removed = cache.forget_identity(identity);
        if removed > 0 {
            tracing::info!(entries = removed, identity = %format!("{identity:016x}"), "parsed-cache entries of a replaced dataset version removed");
        }
    }
}

/// Why `p` cannot be applied beside the sessions open in `reg`, if it cannot. A lowered
/// `memory_limit_bytes` that the open sessions' rings, sweep orders and held parsed chunks, the
/// read buffers, the indexes and the chunk cache's floor do not fit in is not applied (the old
/// limit stays, said in the log); a reload whose datasets alone would leave the cache less than its floor (added
/// datasets' indexes, at the limit that applies) is refused whole: applied, every open session
/// would wait for memory for good, or gather a chunk at a time.
fn memory_refusal(
    shared: &ControlPlane,
    reg: &crate::pipeline::control::session::Registry,
    p: &mut Prepared,
    threads: usize,
) -> Option<String> {
    use crate::pipeline::control::{limit_short_of_data, limit_short_of_sessions};
    let running = shared.config();
    let old = running.daemon.memory_limit_bytes;
    if p.config.daemon.memory_limit_bytes < old {
        // Without open sessions too (found by a probe: a limit of 2 MB under 122 MB of indexes
        // was applied while no session was open, the reload counted a success and every open
        // then refused).
        // The chunks sessions hold go only as they move on (a slow trainer's, not for minutes):
        // a limit below them would be exceeded until then.
        let (stats, _, evictable) = shared.data.cache.snapshot();
        let held = stats.bytes.saturating_sub(evictable);
        let short = limit_short_of_sessions(reg, &p.config, &p.catalog, threads, held)
            .or_else(|| limit_short_of_data(&p.config, &p.catalog, threads));
        if let Some(needed) = short {
            tracing::error!(
                new = p.config.daemon.memory_limit_bytes,
                kept = old,
                needed,
                "daemon.memory_limit_bytes lowered below what the open sessions' rings, sweep orders and parsed \
                 chunks held, the read buffers, the indexes and the chunk cache's floor need together; the old \
                 limit stays (reload again once sessions have ended, or lower it less)"
            );
            p.config.daemon.memory_limit_bytes = old;
            p.kept_limit = true;
        }
    }
    let needed = limit_short_of_sessions(reg, &p.config, &p.catalog, threads, 0)?;
    // Short already before (nothing this reload adds): applied as the limit rule above left it.
    if limit_short_of_sessions(reg, &running, &shared.data.catalog(), threads, 0).is_some_and(|before| needed <= before)
    {
        return None;
    }
    Some(format!(
        "the datasets' indexes and read buffers, the open sessions' rings and sweep orders and the chunk cache's \
         floor would need {needed} bytes together, more than daemon.memory_limit_bytes ({}); raise the limit, or \
         reload once sessions have ended",
        p.config.daemon.memory_limit_bytes
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn daemon(text: &str) -> DaemonConfig {
        Config::from_toml_str(&format!("{text}\n[datasets.t]\nformat = \"ctf\"\nfiles = [\"x\"]\n[datasets.t.streams.f]\ndim = 1\nformat = \"dense\"\n"), Path::new("/tmp")).expect("config").daemon
    }

    /// The reload's summary names the mixtures it added, removed and changed (found by a probe:
    /// a change of weights logged `changed=[]`).
    #[test]
    fn a_reload_names_the_mixtures_it_changed() {
        let mixtures = |text: &str| {
            let base = "[datasets.t]\nformat = \"ctf\"\nfiles = [\"x\"]\n[datasets.t.streams.f]\ndim = 1\nformat = \"dense\"\n\
                        [datasets.u]\nformat = \"ctf\"\nfiles = [\"y\"]\n[datasets.u.streams.f]\ndim = 1\nformat = \"dense\"\n";
            Config::from_toml_str(&format!("{base}{text}"), Path::new("/tmp")).expect("config").mixtures
        };
        let old = mixtures("[mixtures.a]\ndatasets = [\"t\", \"u\"]\nweights = [1, 1]\n[mixtures.b]\ndatasets = [\"t\", \"u\"]\nweights = [1, 2]\n");
        let new = mixtures("[mixtures.a]\ndatasets = [\"t\", \"u\"]\nweights = [3, 1]\n[mixtures.c]\ndatasets = [\"t\", \"u\"]\nweights = [1, 2]\n");
        assert_eq!(mixture_changes(&old, &new), vec!["-b", "~a", "+c"]);
        assert!(mixture_changes(&old, &old).is_empty());
    }

    #[test]
    fn hot_keys_apply_and_the_others_wait_for_a_restart() {
        let old = daemon("[daemon]\nsocket = \"/run/a.sock\"\nmemory_limit_bytes = 1048576\nparser_threads = 2");
        let new = daemon("[daemon]\nsocket = \"/run/b.sock\"\nmemory_limit_bytes = 2097152\nparser_threads = 3\nsession_linger_secs = 5");
        let (merged, restart) = merge_daemon(&old, &new);
        assert_eq!(restart, vec!["socket", "parser_threads"]);
        assert_eq!(merged.socket, old.socket);
        assert_eq!(merged.parser_threads, 2);
        assert_eq!((merged.memory_limit_bytes, merged.session_linger_secs), (2_097_152, 5));
        let (same, none) = merge_daemon(&old, &old);
        assert_eq!((same, none.len()), (old.clone(), 0));
        // Object storage's keys are named as the file spells them (not `objects`).
        let objects = daemon("[daemon]\nsocket = \"/run/a.sock\"\nmemory_limit_bytes = 1048576\nparser_threads = 2\nobject_fetches = 3\nobject_retry_secs = 9");
        let (merged, restart) = merge_daemon(&old, &objects);
        assert_eq!(restart, vec!["object_fetches", "object_retry_secs"]);
        assert_eq!(merged.objects, old.objects);
    }

    #[test]
    fn every_daemon_key_is_either_hot_or_restart_only() {
        // No `..`: a new [daemon] key does not compile until it is sorted here (and in
        // `merge_daemon` or `hot_daemon_keys`).
        let DaemonConfig {
            socket: _,
            metrics_listen: _,
            state_dir: _,
            read_queue_chunks: _,
            parsed_queue_chunks: _,
            parser_threads: _,
            producer_threads: _,
            memory_limit_bytes: _,
            ring_slots: _,
            slot_size_bytes: _,
            session_linger_secs: _,
            shutdown_grace_secs: _,
            checkpoint_interval_secs: _,
            host_memory_reserve_bytes: _,
            max_connections: _,
            max_connections_per_uid: _,
            max_sessions: _,
            max_sessions_per_uid: _,
            handshake_timeout_secs: _,
            objects: _,
            parsed_cache_dir: _,
            parsed_cache_bytes: _,
            huge_pages: _,
        } = daemon("");
        assert_eq!(hot_daemon_keys().len(), 8);
    }

    #[test]
    fn validate_reports_unresolvable_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "[datasets.t]\nformat = \"ctf\"\nfiles = [\"nothing-*.ctf\"]\n[datasets.t.streams.f]\ndim = 1\nformat = \"dense\"\n").expect("write");
        let e = validate(&p).expect_err("no files");
        assert!(e.to_string().starts_with("datasets.t.files"), "{e}");
        std::fs::write(&p, "[datasets.t]\nformat = \"ctf\"\nbogus = 1\n").expect("write");
        assert!(matches!(validate(&p), Err(ValidateError::Config(_))));
    }

    #[test]
    fn validate_reports_every_dataset_whose_files_are_missing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("c.toml");
        let table = |name: &str| {
            format!("[datasets.{name}]\nformat = \"ctf\"\nfiles = [\"{name}.ctf\"]\n[datasets.{name}.streams.f]\ndim = 1\nformat = \"dense\"\n")
        };
        std::fs::write(&p, table("a") + &table("b")).expect("write");
        let Err(ValidateError::Files(all)) = validate(&p) else { panic!("both datasets lack their file") };
        let names: Vec<&str> = all.iter().map(|(d, _)| d.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        // Every missing file of a dataset, not only its first.
        std::fs::write(dir.path().join("here.ctf"), "|f 1\n").expect("write");
        let three = "[datasets.c]\nformat = \"ctf\"\nfiles = [\"gone1.ctf\", \"here.ctf\", \"gone2.ctf\"]\n\
                     [datasets.c.streams.f]\ndim = 1\nformat = \"dense\"\n";
        std::fs::write(&p, three).expect("write");
        let Err(e @ ValidateError::Files(_)) = validate(&p) else { panic!("two files are missing") };
        let text = e.to_string();
        assert!(text.contains("gone1.ctf") && text.contains("gone2.ctf") && !text.contains("here.ctf"), "{text}");
    }
}
