//! Configuration: a TOML file plus `MINIBATCHD__SECTION__KEY` environment overrides, layered by
//! the `config` crate, then validated into the runtime structs below.
//!
//! Validation walks the merged tree itself instead of relying on serde's first-error-wins
//! behaviour: every unknown key, wrong type and out-of-range value is reported at once, each with
//! its key path (`datasets.train.streams.features.dim`). The runtime structs ([`Config`],
//! [`DatasetConfig`], …) are only built from a tree that passed, so code downstream can rely on
//! their invariants (a stream's `dim` ≥ 1, at most one `defines_mb_size` stream, …).
//!
//! Relative paths in the file (`files`, `socket`, `state_dir`) are resolved against the directory
//! of the config file, so a config can travel with its data.

mod csv;
mod dataset;
mod deepx;
mod fixed;
pub mod mixture;
mod paths;
mod tfrecord;
pub(crate) mod walk;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use walk::{Node, Walker};

pub use mixture::MixtureConfig;

pub use minibatchd_engine::options::*;

/// One validation problem, with the key path it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// Dotted key path, e.g. `datasets.train.streams.features.dim`.
    pub path: String,
    /// What is wrong and what was expected.
    pub message: String,
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Loading or validating the configuration failed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read or is not valid TOML.
    #[error("cannot load config {path}: {message}")]
    Load {
        /// The config file.
        path: PathBuf,
        /// The loader's message.
        message: String,
    },
    /// The file parsed, but its content is invalid; every problem found is listed.
    #[error("invalid config {path}: {} problem(s):\n{}", issues.len(), format_issues(issues))]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// Every problem, in key order.
        issues: Vec<ConfigIssue>,
    },
    /// A dataset name that is not in the configuration.
    #[error("no dataset '{name}' in the config (configured: {})", known.join(", "))]
    UnknownDataset {
        /// The name asked for.
        name: String,
        /// The configured names.
        known: Vec<String>,
    },
}

fn format_issues(issues: &[ConfigIssue]) -> String {
    issues.iter().map(|i| format!("  - {i}")).collect::<Vec<_>>().join("\n")
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The config file it was loaded from.
    pub path: PathBuf,
    /// `[daemon]`.
    pub daemon: DaemonConfig,
    /// `[datasets.NAME]`, by name.
    pub datasets: BTreeMap<String, DatasetConfig>,
    /// `[mixtures.NAME]`, by name (`docs/mixtures.md`).
    pub mixtures: BTreeMap<String, MixtureConfig>,
}

/// `[daemon]`: process-wide settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonConfig {
    /// Control socket path.
    pub socket: PathBuf,
    /// `host:port` of the metrics endpoint; port 0 picks a free port.
    pub metrics_listen: String,
    /// Directory for daemon checkpoints and index caches.
    pub state_dir: PathBuf,
    /// Budget for parsed chunks plus shared-memory rings, in bytes.
    pub memory_limit_bytes: u64,
    /// Capacity, in chunks, of the bounded channels from the sessions to the readahead stage and
    /// from it to the parser pool.
    pub read_queue_chunks: usize,
    /// Capacity of each bounded channel that carries parsed chunks, in chunks.
    pub parsed_queue_chunks: usize,
    /// Parser threads; 0 means one per core.
    pub parser_threads: usize,
    /// Threads that run every session's producer; 0 means one per core.
    pub producer_threads: usize,
    /// Default number of ring slots per session.
    pub ring_slots: usize,
    /// Default size of one ring slot, in bytes.
    pub slot_size_bytes: u64,
    /// How long a disconnected session stays resumable, in seconds.
    pub session_linger_secs: u64,
    /// On SIGTERM/SIGINT, how long connected clients get to report their last position before
    /// the checkpoint is written, in seconds.
    pub shutdown_grace_secs: u64,
    /// Interval between periodic daemon checkpoints, in seconds.
    pub checkpoint_interval_secs: u64,
    /// Host memory (`MemAvailable`) to leave free: below it the chunk cache shrinks, then new
    /// sessions are refused; 0 disables the guard. In bytes.
    pub host_memory_reserve_bytes: u64,
    /// Client connections at once, in all: more are answered `resource_exhausted` and closed.
    pub max_connections: usize,
    /// Client connections at once per peer uid (`SO_PEERCRED`).
    pub max_connections_per_uid: usize,
    /// Open sessions at once, in all (each holds a ring and two threads).
    pub max_sessions: usize,
    /// Open sessions at once per peer uid.
    pub max_sessions_per_uid: usize,
    /// Seconds a connection may stay without an open session (`hello`, then `open`) before it
    /// is closed.
    pub handshake_timeout_secs: u64,
    /// Object storage inputs (`s3://`): the object cache and shared indexes.
    pub objects: ObjectsConfig,
    /// Directory of the parsed cache (default `state_dir/parsed`).
    pub parsed_cache_dir: PathBuf,
    /// Its bound in bytes; 0 turns it off.
    pub parsed_cache_bytes: u64,
    /// Whether parsed chunks' large buffers are advised transparent huge pages.
    pub huge_pages: bool,
}

/// The default bound of the parsed cache (`parsed_cache_bytes`): 8 GiB.
pub const DEFAULT_PARSED_CACHE_BYTES: u64 = 8 << 30;

/// `[daemon]` keys for datasets in object storage (`docs/object-storage.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectsConfig {
    /// Directory of the on-disk cache of chunk byte ranges (default `state_dir/objects`).
    pub cache_dir: PathBuf,
    /// Its limit, in bytes.
    pub cache_bytes: u64,
    /// Where shared indexes go: `None` beside each object, else this `s3://` prefix.
    pub index_prefix: Option<String>,
    /// How long to wait for another node's index before indexing an object here too.
    pub index_wait_secs: u64,
    /// Chunk ranges the readahead stage fetches ahead of the parsers at once.
    pub fetches: usize,
    /// How long a failed request is retried (with backoff) before it is an error, in seconds.
    pub retry_secs: u64,
    /// How long one request waits for its answer, and a response body for its next bytes, in
    /// seconds; with `retry_secs`, the most any object-storage operation waits for a silent server.
    pub request_timeout_secs: u64,
}

/// The most bytes a configuration file may hold: a file of every dataset and key a node serves
/// is a few kilobytes; past this it is some other file.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// The text of configuration file `path`: a regular file (a FIFO or a device, `/dev/zero` behind
/// a link, would block the reload or grow the daemon's memory without end) of at most
/// [`MAX_CONFIG_BYTES`], in UTF-8.
fn read_config_file(path: &Path) -> Result<String, String> {
    use std::io::Read as _;
    let file = minibatchd_sys::files::open_regular(path).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(format!("larger than {MAX_CONFIG_BYTES} bytes: not a configuration file"));
    }
    String::from_utf8(bytes).map_err(|e| format!("not UTF-8 text: {e}"))
}

impl Config {
    /// Loads `path` and applies `MINIBATCHD__SECTION__KEY` environment overrides.
    ///
    /// # Errors
    /// [`ConfigError::Load`] if the file is unreadable or not TOML; [`ConfigError::Invalid`] with
    /// every problem found otherwise.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        // Read once here (the `config` crate would read it again): its keys are checked before
        // the crate, which reads `a[N]` in a key as an index and builds an N-element array.
        let text = read_config_file(path).map_err(|message| ConfigError::Load { path: path.to_owned(), message })?;
        check_keys(path, &text, std::env::vars_os().map(|(k, _)| k))?;
        let layered = ::config::Config::builder()
            .add_source(::config::File::from_str(&text, ::config::FileFormat::Toml))
            .add_source(
                ::config::Environment::with_prefix("MINIBATCHD")
                    .prefix_separator("__")
                    .separator("__")
                    .try_parsing(true),
            )
            .build()
            .map_err(|e| ConfigError::Load { path: path.to_owned(), message: e.to_string() })?;
        let tree: serde_json::Value = layered
            .try_deserialize()
            .map_err(|e| ConfigError::Load { path: path.to_owned(), message: e.to_string() })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        // Canonical, so that relative paths resolve to paths without `..` where that is exact.
        let dir = if base.as_os_str().is_empty() { Path::new(".") } else { base.as_path() };
        let base = std::fs::canonicalize(dir).unwrap_or(base);
        Self::from_tree(path, &base, &tree).map_err(|e| match e {
            ConfigError::Invalid { path, mut issues } => {
                let names: Vec<String> = std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()).collect();
                let file = toml_to_json(&text).ok();
                name_environment(&mut issues, &names, file.as_ref());
                ConfigError::Invalid { path, issues }
            }
            other => other,
        })
    }

    /// Parses a TOML string (tests, tools). Relative paths resolve against `base_dir`.
    ///
    /// # Errors
    /// As [`Config::load`].
    pub fn from_toml_str(text: &str, base_dir: &Path) -> Result<Self, ConfigError> {
        let pseudo = base_dir.join("<inline>");
        check_keys(&pseudo, text, std::iter::empty())?;
        let tree: serde_json::Value =
            toml_to_json(text).map_err(|e| ConfigError::Load { path: pseudo.clone(), message: e.to_string() })?;
        Self::from_tree(&pseudo, base_dir, &tree)
    }

    fn from_tree(path: &Path, base: &Path, tree: &serde_json::Value) -> Result<Self, ConfigError> {
        let mut w = Walker::new(base);
        let root = Node::root(tree);
        let parsed = parse_root(&mut w, &root);
        match (w.into_issues(), parsed) {
            (issues, Some((daemon, datasets, mixtures))) if issues.is_empty() => {
                Ok(Self { path: path.to_owned(), daemon, datasets, mixtures })
            }
            (mut issues, _) => {
                if issues.is_empty() {
                    issues.push(ConfigIssue { path: String::new(), message: "invalid".into() });
                }
                Err(ConfigError::Invalid { path: path.to_owned(), issues })
            }
        }
    }

    /// The dataset called `name`.
    ///
    /// # Errors
    /// [`ConfigError::UnknownDataset`], listing the configured datasets.
    pub fn dataset(&self, name: &str) -> Result<&DatasetConfig, ConfigError> {
        self.datasets.get(name).ok_or_else(|| ConfigError::UnknownDataset {
            name: name.to_owned(),
            known: self.datasets.keys().cloned().collect(),
        })
    }
}

/// Adds to each issue in a table that the file (`file`, its tree) does not hold and a
/// `MINIBATCHD__…` variable among `env` sets the variable's name. Found by a probe: with
/// `MINIBATCHD__DATASETS__TRAIN__SAMPLING__SEED` set, a file without `train` was refused for
/// `datasets.train.files: missing`, with no word of where the table came from.
fn name_environment(issues: &mut [ConfigIssue], env: &[String], file: Option<&serde_json::Value>) {
    let keys: Vec<(String, &String)> = env
        .iter()
        .filter_map(|name| {
            let rest = name.strip_prefix("MINIBATCHD__")?;
            Some((rest.split("__").map(str::to_lowercase).collect::<Vec<_>>().join("."), name))
        })
        .collect();
    for issue in issues {
        let Some((table, _)) = issue.path.rsplit_once('.') else { continue };
        // A table the file holds is the file's, whatever the environment adds to it.
        if file.is_some_and(|tree| table.split('.').try_fold(tree, |node, key| node.get(key)).is_some()) {
            continue;
        }
        let from_env: Vec<&str> = keys
            .iter()
            .filter(|(key, _)| key.strip_prefix(table).is_some_and(|rest| rest.starts_with('.')))
            .map(|(_, name)| name.as_str())
            .collect();
        if !from_env.is_empty() {
            let _ = std::fmt::Write::write_fmt(
                &mut issue.message,
                format_args!(
                    " (the table {table} is also set by the environment: {}; unset it to drop the table)",
                    from_env.join(", ")
                ),
            );
        }
    }
}

/// The characters a key may not hold: the `config` crate reads `.` as nesting and `[N]` as an
/// array index (a 17-byte file naming `t[055777777]` made it build a 56-million-element array:
/// 7 GB and 30 s, found by the `config_load` fuzz target).
const KEY_FORBIDDEN: [char; 3] = ['.', '[', ']'];

/// Refuses, before the `config` crate sees them, TOML keys (at any depth) and `MINIBATCHD__…`
/// environment variable names holding a character of [`KEY_FORBIDDEN`]. Text that is not TOML is
/// left to the crate, which reports it with its place.
fn check_keys(path: &Path, text: &str, env: impl Iterator<Item = std::ffi::OsString>) -> Result<(), ConfigError> {
    fn walk(prefix: &str, table: &toml::Table, issues: &mut Vec<ConfigIssue>) {
        for (key, value) in table {
            let at = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
            if key.contains(KEY_FORBIDDEN) {
                issues.push(ConfigIssue {
                    path: at.clone(),
                    message: format!("a key may not contain '.', '[' or ']' (found {key:?})"),
                });
                continue;
            }
            // A dataset, mixture or stream name is said in logs, metrics labels and replies:
            // found by a probe, `[datasets.""]` and a name holding a newline were served.
            if key.is_empty() || key.contains(char::is_control) {
                issues.push(ConfigIssue {
                    path: at.escape_debug().to_string(),
                    message: format!("a key may not be empty or hold control characters (found {key:?})"),
                });
                continue;
            }
            match value {
                toml::Value::Table(t) => walk(&at, t, issues),
                toml::Value::Array(items) => {
                    for item in items {
                        if let toml::Value::Table(t) = item {
                            walk(&at, t, issues);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let mut issues = Vec::new();
    // Not TOML: said here with the line, column and byte offset (the `config` crate's message
    // for the same error names no place).
    let table = text
        .parse::<toml::Table>()
        .map_err(|e| ConfigError::Load { path: path.to_owned(), message: toml_error(text, &e) })?;
    walk("", &table, &mut issues);
    for os_name in env {
        let name = os_name.to_string_lossy();
        let Some(rest) = name.strip_prefix("MINIBATCHD__") else { continue };
        // Found by a probe: `MINIBATCHD__=5` was "- unknown key" (no path, no variable), a name
        // with an empty part a key named "", and a name that is no UTF-8 was ignored unsaid.
        let message = if name.contains(KEY_FORBIDDEN) {
            "an override's name may not contain '.', '[' or ']'"
        } else if os_name.to_str().is_none() {
            "an override's name must be UTF-8"
        } else if rest.split("__").any(str::is_empty) {
            "an override's name is MINIBATCHD__ and the key's path, its parts joined by __, none of them empty"
        } else {
            continue;
        };
        issues.push(ConfigIssue { path: format!("${name}"), message: message.into() });
    }
    if issues.is_empty() {
        Ok(())
    } else {
        Err(ConfigError::Invalid { path: path.to_owned(), issues })
    }
}

/// A TOML syntax error as one line: where (line, column, byte offset) and what.
fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let what = e.message().trim();
    let Some(span) = e.span() else { return format!("not valid TOML: {what}") };
    let offset = span.start.min(text.len());
    let before = text.get(..offset).unwrap_or("");
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("line {line}, column {column} (byte offset {offset}): not valid TOML: {what}")
}

fn toml_to_json(text: &str) -> Result<serde_json::Value, ::config::ConfigError> {
    ::config::Config::builder()
        .add_source(::config::File::from_str(text, ::config::FileFormat::Toml))
        .build()?
        .try_deserialize()
}

/// What [`parse_root`] reads: `[daemon]`, the datasets and the mixtures.
type Sections = (DaemonConfig, BTreeMap<String, DatasetConfig>, BTreeMap<String, MixtureConfig>);

fn parse_root(w: &mut Walker, root: &Node<'_>) -> Option<Sections> {
    let mut t = w.table(root)?;
    let daemon = match t.take("daemon") {
        Some(n) => parse_daemon(w, &n),
        None => parse_daemon(w, &Node::empty_table(root, "daemon")),
    };
    // `[daemon]`'s limits on `.gz` inputs travel with each dataset: the engine takes them from
    // its `DatasetConfig` and knows nothing of the daemon's section.
    let inflate = daemon.as_ref().map(|(_, limits)| *limits).unwrap_or_default();
    // So do the threads of an index pass: the daemon's parser threads (one per core when 0).
    let index_threads = match daemon.as_ref().map_or(0, |(d, _)| d.parser_threads) {
        0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        n => n,
    };
    let mut datasets = BTreeMap::new();
    let mut dataset_names = Vec::new();
    match t.take("datasets") {
        Some(n) => {
            if let Some(mut dt) = w.table(&n) {
                for (name, node) in dt.drain() {
                    dataset_names.push(name.clone());
                    if let Some(d) = dataset::parse_dataset(w, &name, &node, inflate, index_threads) {
                        datasets.insert(name, d);
                    }
                }
                w.finish(dt);
            }
        }
        None => w.issue(root.path(), "no [datasets.NAME] table: at least one dataset is required"),
    }
    let mixtures = match t.take("mixtures") {
        Some(n) => mixture::parse_mixtures(w, &n, &datasets, &dataset_names),
        None => BTreeMap::new(),
    };
    w.finish(t);
    if let Some((d, _)) = &daemon {
        paths::state_dir_outside_datasets(w, &d.state_dir, &datasets);
    }
    Some((daemon?.0, datasets, mixtures))
}

/// `[daemon]`, and its limits on decompressing `.gz` inputs (`max_inflated_bytes`,
/// `max_inflate_ratio`), which are handed to every dataset rather than kept in [`DaemonConfig`].
fn parse_daemon(w: &mut Walker, node: &Node<'_>) -> Option<(DaemonConfig, InflateLimits)> {
    let mut t = w.table(node)?;
    let d = DaemonConfig {
        socket: t.path(w, "socket").unwrap_or_else(|| PathBuf::from("/run/minibatchd/minibatchd.sock")),
        metrics_listen: t.string(w, "metrics_listen").unwrap_or_else(|| "127.0.0.1:9464".into()),
        state_dir: t.path(w, "state_dir").unwrap_or_else(|| PathBuf::from("/var/lib/minibatchd")),
        memory_limit_bytes: t.uint(w, "memory_limit_bytes", 1 << 20, u64::MAX).unwrap_or(8 << 30),
        read_queue_chunks: t.usize(w, "read_queue_chunks", 1, 1 << 16).unwrap_or(4),
        parsed_queue_chunks: t.usize(w, "parsed_queue_chunks", 1, 1 << 16).unwrap_or(4),
        parser_threads: t.usize(w, "parser_threads", 0, 1024).unwrap_or(0),
        producer_threads: t.usize(w, "producer_threads", 0, 1024).unwrap_or(0),
        ring_slots: t.usize(w, "ring_slots", 2, 1024).unwrap_or(16),
        slot_size_bytes: t.uint(w, "slot_size_bytes", 4096, 1 << 40).unwrap_or(4 << 20),
        session_linger_secs: t.uint(w, "session_linger_secs", 0, 7 * 86_400).unwrap_or(600),
        shutdown_grace_secs: t.uint(w, "shutdown_grace_secs", 0, 600).unwrap_or(5),
        checkpoint_interval_secs: t.uint(w, "checkpoint_interval_secs", 1, 86_400).unwrap_or(30),
        host_memory_reserve_bytes: t.uint(w, "host_memory_reserve_bytes", 0, u64::MAX).unwrap_or(256 << 20),
        max_connections: t.usize(w, "max_connections", 1, 1 << 20).unwrap_or(1024),
        max_connections_per_uid: t.usize(w, "max_connections_per_uid", 1, 1 << 20).unwrap_or(256),
        max_sessions: t.usize(w, "max_sessions", 1, 1 << 16).unwrap_or(256),
        max_sessions_per_uid: t.usize(w, "max_sessions_per_uid", 1, 1 << 16).unwrap_or(64),
        handshake_timeout_secs: t.uint(w, "handshake_timeout_secs", 1, 3600).unwrap_or(10),
        objects: ObjectsConfig {
            cache_dir: PathBuf::new(),
            cache_bytes: t.uint(w, "object_cache_bytes", 1 << 20, u64::MAX).unwrap_or(16 << 30),
            index_prefix: t.string(w, "object_index_prefix"),
            index_wait_secs: t.uint(w, "object_index_wait_secs", 0, 86_400).unwrap_or(600),
            fetches: t.usize(w, "object_fetches", 1, 256).unwrap_or(8),
            retry_secs: t.uint(w, "object_retry_secs", 0, 3600).unwrap_or(180),
            request_timeout_secs: t.uint(w, "object_request_timeout_secs", 1, 3600).unwrap_or(30),
        },
        parsed_cache_dir: PathBuf::new(),
        parsed_cache_bytes: t.uint(w, "parsed_cache_bytes", 0, u64::MAX).unwrap_or(DEFAULT_PARSED_CACHE_BYTES),
        huge_pages: t.boolean(w, "huge_pages").unwrap_or(true),
    };
    let mut d = d;
    d.objects.cache_dir = t.path(w, "object_cache_dir").unwrap_or_else(|| d.state_dir.join("objects"));
    d.parsed_cache_dir = t
        .path(w, "parsed_cache_dir")
        .unwrap_or_else(|| d.state_dir.join(minibatchd_engine::format::parsed_cache::PARSED_DIR));
    if let Some(prefix) = &d.objects.index_prefix {
        if !prefix.starts_with(minibatchd_engine::remote::SCHEME)
            || prefix.len() <= minibatchd_engine::remote::SCHEME.len()
        {
            w.issue(&format!("{}.object_index_prefix", node.path()), "expected an s3://BUCKET/PREFIX/ URL");
        }
    }
    let inflate = InflateLimits {
        max_bytes: t.uint(w, "max_inflated_bytes", 1, u64::MAX).unwrap_or(DEFAULT_MAX_INFLATED_BYTES),
        max_ratio: t.uint(w, "max_inflate_ratio", 1, 1_000_000).unwrap_or(DEFAULT_MAX_INFLATE_RATIO),
    };
    // What `run` would refuse later, refused now (`minibatchd validate` runs these checks).
    let socket_len = d.socket.as_os_str().len();
    if socket_len >= 108 {
        w.issue(
            &format!("{}.socket", node.path()),
            &format!("{} is {socket_len} bytes long: a Unix socket path must be under 108 bytes", d.socket.display()),
        );
    }
    for (key, dir) in [("state_dir", Some(d.state_dir.as_path())), ("socket", d.socket.parent())] {
        // The nearest part of the path that exists must be a directory, or the directory cannot
        // be made (found by a probe: a state_dir under a file passed validate, and run refused it).
        let Some(dir) = dir else { continue };
        let Some(existing) = dir.ancestors().find(|p| p.exists()) else { continue };
        if existing.is_dir() {
            continue;
        }
        let message = if existing == dir {
            format!("{} exists and is not a directory", dir.display())
        } else {
            format!("{} cannot be made: {} is not a directory", dir.display(), existing.display())
        };
        w.issue(&format!("{}.{key}", node.path()), &message);
    }
    if let Ok(meta) = std::fs::symlink_metadata(&d.socket) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            w.issue(
                &format!("{}.socket", node.path()),
                &format!("{} exists and is not a socket: the daemon never replaces it", d.socket.display()),
            );
        }
    }
    if let Err(e) = d.metrics_listen.parse::<std::net::SocketAddr>() {
        w.issue(
            &format!("{}.metrics_listen", node.path()),
            &format!("expected an IP address and a port (host names are not looked up), e.g. 127.0.0.1:9464 ({e})"),
        );
    }
    w.finish(t);
    Some((d, inflate))
}

/// A format's `streams` table of dense streams (fixed-length slices, CSV columns): each entry
/// read by `stream` into its options and `dim`; the stream configs and the options, in name
/// order. `missing` says what a dataset without the table lacks. `None` after an issue.
pub(crate) fn dense_streams<S>(
    w: &mut Walker,
    t: &mut walk::Table<'_>,
    missing: &str,
    mut stream: impl FnMut(&mut Walker, &str, &Node<'_>) -> Option<(S, usize)>,
) -> Option<(Vec<StreamConfig>, Vec<S>)> {
    let Some(node) = t.take("streams") else {
        w.issue(&t.key_path("streams"), missing);
        return None;
    };
    let mut st = w.table(&node)?;
    let (mut configs, mut streams) = (Vec::new(), Vec::new());
    let mut ok = true;
    for (name, n) in st.drain() {
        if let Some((s, dim)) = stream(w, &name, &n) {
            configs.push(StreamConfig {
                name: name.clone(),
                alias: name,
                dim,
                format: StreamFormat::Dense,
                defines_mb_size: false,
            });
            streams.push(s);
        } else {
            ok = false;
        }
    }
    w.finish(st);
    if streams.is_empty() && ok {
        w.issue(node.path(), "expected at least one stream");
        return None;
    }
    ok.then_some((configs, streams))
}

#[cfg(test)]
mod tests;
