//! The daemon under test: the real binary on a temp dir, stopped (SIGTERM, then SIGKILL after a
//! deadline) when its guard drops; sessions read through the Rust client and compared with
//! `minibatchd dump` as JSON lines; the Python client's interpreter; the data the daemon tests
//! serve. Every wait has a deadline.

use std::fmt::Write as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use minibatchd_client::protocol::{ErrorCode, SessionOptions};
use minibatchd_client::{Client, ClientError, Session};
use minibatchd_engine::minibatch::Minibatch;

use super::{command, package_root, BIN};

/// Writes `dir/minibatchd.toml` for a daemon living in `dir` (its socket `dir/mbd.sock`, its
/// state `dir/state`, metrics on a free port), with `daemon_extra` (lines of `[daemon]`) and then
/// `datasets` (tables); returns its path.
pub fn write_config(dir: &Path, daemon_extra: &str, datasets: &str) -> PathBuf {
    let d = dir.display();
    super::write(
        dir,
        "minibatchd.toml",
        format!(
            "[daemon]\nsocket = \"{d}/mbd.sock\"\nmetrics_listen = \"127.0.0.1:0\"\nstate_dir = \"{d}/state\"\n\
             {daemon_extra}\n{datasets}"
        ),
    )
}

/// GET `path` on the metrics endpoint of the daemon whose `state_dir` is `state` (its address in
/// `metrics.addr`): (status line, body); `None` while nothing answers there.
pub fn http_get(state: &Path, path: &str) -> Option<(String, String)> {
    use std::io::{Read as _, Write as _};
    let addr = std::fs::read_to_string(state.join("metrics.addr")).ok()?;
    let mut s = std::net::TcpStream::connect(addr.trim()).ok()?;
    s.set_read_timeout(Some(DEADLINE)).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    Some((head.lines().next().unwrap_or("").to_owned(), body.to_owned()))
}

/// Whether the daemon of `state` has opened (indexed, or failed to open) every dataset: its
/// `/metrics` shows none indexing. A daemon without a metrics endpoint counts as opened.
pub fn datasets_opened(state: &Path) -> bool {
    if !state.join("metrics.addr").exists() {
        return true;
    }
    http_get(state, "/metrics")
        .is_some_and(|(_, body)| body.lines().any(|l| l == "minibatchd_datasets{state=\"indexing\"} 0"))
}

/// How long any wait on the daemon or a client may take.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// The `streams` tables of [`train_ctf`]'s dataset, named `train` in a config.
pub const TRAIN_STREAMS_TOML: &str = r#"
[datasets.train.streams.features]
alias = "F"
dim = 3
format = "dense"

[datasets.train.streams.labels]
alias = "L"
dim = 5
format = "sparse"
"#;

/// The streams of [`train_ctf`]'s dataset, `train`, in the order of its config.
pub const TRAIN_STREAMS: &[&str] = &["features", "labels"];

/// 150 sequences of 1..=3 samples, ids in order: `F` (dense, dim 3; the first value of every
/// sample is the sequence id) on every line and `L` (sparse, dim 5) on each sequence's first.
pub fn train_ctf() -> String {
    let mut text = String::new();
    for id in 0..150u32 {
        for j in 0..=id % 3 {
            let _ = write!(text, "{id} |F {id} {}.5 -{j}e-3", j + 1);
            if j == 0 {
                let _ = write!(text, " |L {}:1 {}:0.25", id % 5, (id + 2) % 5);
            }
            text.push('\n');
        }
    }
    text
}

/// 20 one-line sequences of `entries` sparse entries `W` below `dim`.
pub fn wide_ctf(entries: u32, dim: u32) -> String {
    let mut wide = String::new();
    for id in 0..20u32 {
        let _ = write!(wide, "{id} |W");
        for k in 0..entries {
            let _ = write!(wide, " {}:{}", (k * 7 + id) % dim, k % 9);
        }
        wide.push('\n');
    }
    wide
}

/// A running daemon: `dir` holds its config (`minibatchd.toml`, written by the test), its
/// socket (`mbd.sock`) and its state (`state/`).
pub struct Daemon {
    child: Child,
    pub dir: PathBuf,
    pub socket: PathBuf,
    /// The temp dir the daemon owns, if any: removed after the daemon has stopped.
    owned: Option<tempfile::TempDir>,
}

impl Daemon {
    /// Starts the daemon on `dir` (config already written) with `env` added to its environment
    /// (systemd's variables removed), and waits for its socket.
    pub fn start(dir: &Path, env: &[(&str, String)]) -> Self {
        Self::spawn(dir, Command::new(BIN), env)
    }

    /// [`Daemon::start`] under a file-size limit of `blocks` blocks of 512 bytes (`ulimit -f`).
    pub fn start_with_file_size_limit(dir: &Path, blocks: u64) -> Self {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(format!("ulimit -f {blocks} && exec \"$0\" \"$@\"")).arg(BIN);
        Self::spawn(dir, cmd, &[])
    }

    /// Runs `cmd` (the binary, or what execs it with the arguments that follow) with `run
    /// --config` and waits as [`Daemon::start`] does.
    fn spawn(dir: &Path, mut cmd: Command, env: &[(&str, String)]) -> Self {
        cmd.args(["run", "--config"])
            .arg(dir.join("minibatchd.toml"))
            .env("MINIBATCHD_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        cmd.env_remove("NOTIFY_SOCKET").env_remove("WATCHDOG_USEC").env_remove("WATCHDOG_PID");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn daemon");
        let mut d = Self { child, dir: dir.to_owned(), socket: dir.join("mbd.sock"), owned: None };
        let start = Instant::now();
        while UnixStream::connect(&d.socket).is_err() {
            assert!(d.running(), "the daemon exited at start");
            assert!(start.elapsed() < DEADLINE, "the daemon did not open its socket");
            std::thread::sleep(Duration::from_millis(20));
        }
        // The socket opens before the datasets are indexed; the tests want them open.
        let state = dir.join("state");
        while !datasets_opened(&state) {
            assert!(d.running(), "the daemon exited while opening its datasets");
            assert!(start.elapsed() < DEADLINE, "the daemon did not open its datasets");
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// [`Daemon::start`] on `dir`, which the daemon keeps until it has stopped.
    pub fn start_owning(dir: tempfile::TempDir) -> Self {
        let mut d = Self::start(dir.path(), &[]);
        d.owned = Some(dir);
        d
    }

    /// The config file it runs with.
    pub fn config(&self) -> PathBuf {
        self.dir.join("minibatchd.toml")
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.socket).expect("connect")
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    pub fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(i32::try_from(self.child.id()).expect("pid")).expect("pid");
        rustix::process::kill_process(pid, sig).expect("kill");
    }

    /// Waits for the daemon to exit; SIGKILL and a failure after the deadline.
    pub fn wait(&mut self) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            if start.elapsed() > DEADLINE {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("the daemon did not exit within {DEADLINE:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then [`Daemon::wait`].
    pub fn stop(&mut self) -> ExitStatus {
        self.signal(rustix::process::Signal::TERM);
        self.wait()
    }

    /// A counter or gauge of its `/metrics`: the sum of the series whose line starts with
    /// `series` (`name ` for a plain metric, `name{` for every series of a vector). Panics when
    /// no line does.
    pub fn metric(&self, series: &str) -> f64 {
        let (_, body) = http_get(&self.dir.join("state"), "/metrics").expect("/metrics");
        let values: Vec<f64> =
            body.lines().filter(|l| l.starts_with(series)).filter_map(|l| l.rsplit(' ').next()?.parse().ok()).collect();
        assert!(!values.is_empty(), "no series {series} in /metrics:\n{body}");
        values.iter().sum()
    }

    /// A session of `dataset` with `opts` read to its end, as dump lines of its `streams`.
    pub fn read_all(&self, dataset: &str, opts: &SessionOptions, streams: &[&str]) -> Vec<String> {
        let mut s = self.client().open(dataset, opts).expect("open");
        std::iter::from_fn(|| s.next_owned().expect("next")).map(|mb| json(&mb, streams)).collect()
    }

    /// Configuration reloads applied so far (`success`, or `partial`: a dataset of the new
    /// configuration failed to open; none before the first).
    pub fn reloads(&self) -> u32 {
        let (_, body) = http_get(&self.dir.join("state"), "/metrics").expect("/metrics");
        ["success", "partial"]
            .iter()
            .filter_map(|r| {
                let series = format!("minibatchd_config_reloads_total{{result=\"{r}\"}} ");
                body.lines()
                    .find_map(|l| l.strip_prefix(series.as_str()).map(|v| v.trim().parse::<u32>().expect("a count")))
            })
            .sum()
    }

    /// Waits until the configuration has been reloaded (applied) `n` times.
    pub fn wait_reloads(&self, n: u32) {
        let start = Instant::now();
        while self.reloads() < n {
            assert!(start.elapsed() < DEADLINE, "no reload {n}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The lines `minibatchd dump` prints for `dataset` with `args`, on the daemon's config.
    pub fn dump(&self, dataset: &str, args: &[&str]) -> Vec<String> {
        let out = command("dump", &self.config(), dataset).args(args).output().expect("dump");
        assert!(out.status.success(), "dump failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).expect("utf8").lines().map(str::to_owned).collect()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.running() {
            self.signal(rustix::process::Signal::TERM);
            let start = Instant::now();
            while self.running() && start.elapsed() < DEADLINE {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Session options with `minibatch_size` and the defaults.
pub fn options(minibatch_size: u64) -> SessionOptions {
    SessionOptions { minibatch_size: Some(minibatch_size), ..SessionOptions::default() }
}

/// A minibatch as the dump JSON line of a dataset whose streams are `names`.
pub fn json(mb: &Minibatch, names: &[&str]) -> String {
    let names: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
    let mut s = String::new();
    minibatchd::dump::write_json(&mut s, mb, &names);
    s
}

/// Up to `max` minibatches of a `train` session as dump lines (fewer at the end of the epoch).
pub fn drain(s: &mut Session, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    while out.len() < max {
        match s.next_owned().expect("next") {
            Some(mb) => out.push(json(&mb, TRAIN_STREAMS)),
            None => break,
        }
    }
    out
}

/// Opens a session on a new connection, retrying while the daemon answers `retry_on` (a
/// session still held, memory still reserved, a dataset a reload has not added yet) or
/// `dataset_indexing` (as the clients do) until the deadline.
pub fn open_retrying(d: &Daemon, dataset: &str, opts: &SessionOptions, retry_on: ErrorCode) -> Session {
    let start = Instant::now();
    loop {
        match Client::connect(&d.socket).and_then(|c| c.open(dataset, opts)) {
            Ok(s) => return s,
            Err(ClientError::Daemon { code, .. })
                if (code == retry_on || code == ErrorCode::DatasetIndexing) && start.elapsed() < DEADLINE =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("open {dataset}: {e}"),
        }
    }
}

/// The interpreter for the Python client tests: `$MINIBATCHD_PYTHON`, else the project's `.venv`
/// (made by `scripts/setup.sh`), else `python3`. It must have `NumPy`: a missing test dependency
/// fails the test with the command that installs it, never skips it.
pub fn python() -> String {
    let venv = package_root().join(".venv/bin/python");
    let py = std::env::var("MINIBATCHD_PYTHON").unwrap_or_else(|_| {
        if venv.exists() {
            venv.display().to_string()
        } else {
            "python3".into()
        }
    });
    let ok = Command::new(&py)
        .args(["-c", "import numpy"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{py} cannot import numpy: run scripts/setup.sh (it installs the client's test dependencies into .venv)"
    );
    py
}

/// The Python client's package directory (its `PYTHONPATH`).
pub fn client_dir() -> PathBuf {
    package_root().join("clients/python")
}

/// A child process killed (and reaped) if the test ends early.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Peak resident memory (`VmHWM`) of process `pid`, in bytes.
pub fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kb * 1024
}

/// What the daemon may hold beyond `memory_limit_bytes`: its code, runtime and thread stacks
/// (about 30 MB measured, `docs/daemon.md`, "Memory"), with room for the allocator. The same
/// constant is documented for operators.
pub const DAEMON_OVERHEAD_BYTES: u64 = 64 << 20;

/// Checks `d`'s peak RSS against `memory_limit_bytes` (`limit`) + [`DAEMON_OVERHEAD_BYTES`],
/// naming `case` when it is above; the peak.
pub fn assert_within_limit(d: &Daemon, limit: u64, case: &str) -> u64 {
    let peak = peak_rss(d.pid());
    assert!(
        peak <= limit + DAEMON_OVERHEAD_BYTES,
        "{case}: peak RSS {} MiB > memory_limit_bytes {} MiB + {} MiB",
        peak >> 20,
        limit >> 20,
        DAEMON_OVERHEAD_BYTES >> 20
    );
    peak
}
