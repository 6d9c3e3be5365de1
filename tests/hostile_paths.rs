//! Hostile paths in a dataset's `files` (issue 15, item 2), through the real binary: symbolic
//! link loops, the same file twice, FIFOs, sockets, devices and dangling links. Before the fix, one
//! loop read the data 41 times with exit 0, two loops hung `validate`, `index`, `run` and a SIGHUP
//! reload (which then blocked every later reload and SIGTERM), and a FIFO was "no such file".
//!
//! Every command runs under a deadline: a hang fails the test, it does not hang it.

mod support;

use std::os::unix::fs::symlink;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use minibatchd_client::protocol::ErrorCode;
use minibatchd_client::{Client, ClientError};
use support::daemon::{options, train_ctf};
use support::{write, BIN};

/// How long a command or a daemon's answer may take. The fixed expansion takes milliseconds; the
/// old one never ended on two loops.
const DEADLINE: Duration = Duration::from_secs(30);

/// How long SIGTERM may take to stop the daemon.
const STOP_DEADLINE: Duration = Duration::from_secs(10);

/// Runs `cmd` to its end, or kills it and fails after [`DEADLINE`].
fn output_within(mut cmd: Command, what: &str) -> Output {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let start = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not end within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// `minibatchd validate --config CONFIG`'s exit status and stderr, within the deadline.
fn validate(config: &Path) -> (ExitStatus, String) {
    validate_with(config, None)
}

/// [`validate`] with an environment variable set to a value.
fn validate_with(config: &Path, env: Option<(&str, &str)>) -> (ExitStatus, String) {
    let mut cmd = Command::new(BIN);
    cmd.arg("validate").arg("--config").arg(config).envs(env);
    let out = output_within(cmd, "validate");
    (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `minibatchd index --config CONFIG --dataset DATASET`'s exit status and stderr.
fn index(config: &Path, dataset: &str) -> (ExitStatus, String) {
    let mut cmd = Command::new(BIN);
    cmd.arg("index").arg("--config").arg(config).args(["--dataset", dataset]);
    let out = output_within(cmd, "index");
    (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The `[daemon]` table of a daemon on `dir` (socket, state and log there; metrics on a free port).
/// #15 item 6: with every dataset failing to open, `run` printed the missing-file error twice.
/// Policy: the daemon keeps running — a reload may bring the files, and the
/// `MinibatchdDatasetFailed` alert fires meanwhile — logging each dataset's error once and, once,
/// that no dataset could be opened.
#[test]
fn run_with_no_dataset_that_opens_says_so_once_and_a_reload_brings_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let missing = tmp.path().join("later.ctf");
    let cfg = write(
        tmp.path(),
        "minibatchd.toml",
        format!("{}{}", daemon_table(tmp.path()), ctf_dataset("later", &[&missing])),
    );
    let mut d = Daemon::start(tmp.path(), &cfg);
    let log = d.wait_log("no dataset could be opened", 1);
    assert_eq!(log.matches("later.ctf: no such file or directory").count(), 1, "{log}");
    assert_eq!(log.matches("cannot open dataset").count(), 1, "{log}");
    write(tmp.path(), "later.ctf", "0 |F 1 2 3\n1 |F 4 5 6\n");
    d.signal(rustix::process::Signal::HUP);
    d.wait_log("configuration reloaded", 1);
    d.serves("later");
    let status = d.stop();
    assert!(status.success(), "{status:?}");
}

fn daemon_table(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "[daemon]\nsocket = \"{d}/mbd.sock\"\nmetrics_listen = \"127.0.0.1:0\"\nstate_dir = \"{d}/state\"\n\
         memory_limit_bytes = 1073741824\nring_slots = 3\nslot_size_bytes = 65536\nhost_memory_reserve_bytes = 0\n"
    )
}

/// A CTF dataset `name` of one dense stream `F` (dim 3) reading `files` (TOML strings).
fn ctf_dataset(name: &str, files: &[&Path]) -> String {
    let files: Vec<String> = files.iter().map(|f| format!("\"{}\"", f.display())).collect();
    format!(
        "[datasets.{name}]\nformat = \"ctf\"\nfiles = [{}]\nchunk_size_bytes = 300\n\
         [datasets.{name}.streams.features]\nalias = \"F\"\ndim = 3\nformat = \"dense\"\n",
        files.join(", ")
    )
}

/// A config in `dir` of dataset `train`, one line of CTF: its path and its text.
fn one_line_dataset(dir: &Path) -> (PathBuf, String) {
    let data = write(dir, "d.ctf", "0 |F 1 2 3\n");
    let text = format!("{}{}", daemon_table(dir), ctf_dataset("train", &[&data]));
    (write(dir, "minibatchd.toml", &text), text)
}

/// Found by a probe: `index`, whose purpose is the index cache, exited 0 when it could not write
/// it (a warning aside). It fails, saying how many files went uncached.
#[test]
fn index_fails_when_it_cannot_write_the_index_cache() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (cfg, _) = one_line_dataset(tmp.path());
    std::fs::create_dir_all(tmp.path().join("state")).expect("mkdir");
    write(&tmp.path().join("state"), "index", "a file where the index cache's directory goes");
    let (status, stderr) = index(&cfg, "train");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("1 file(s) of train were indexed but their index could not be written"), "{stderr}");
    std::fs::remove_file(tmp.path().join("state/index")).expect("rm");
    let (status, stderr) = index(&cfg, "train");
    assert!(status.success(), "{stderr}");
}

/// Found by a probe: an override of a path or name key that looks like a number or a boolean
/// (`FILES=2024`) arrived parsed as one and was refused ("expected a list of paths, found a
/// number"): it is the text it was.
#[test]
fn a_string_key_overridden_by_a_number_like_value_takes_its_text() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (cfg, _) = one_line_dataset(tmp.path());
    write(tmp.path(), "2024", "0 |F 4 5 6\n");
    let (status, stderr) = validate_with(&cfg, Some(("MINIBATCHD__DATASETS__TRAIN__FILES", "2024")));
    assert!(status.success(), "{stderr}");
    let (status, stderr) = validate_with(&cfg, Some(("MINIBATCHD__DATASETS__TRAIN__FILES", "1999")));
    assert!(!status.success() && stderr.contains("1999: no such file or directory"), "{stderr}");
}

/// Found by a probe: an environment override that is no number was told to write numbers
/// without quotes, advice for the file; it is told which variable it came from.
#[test]
fn a_number_key_overridden_by_text_names_the_variable() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (cfg, text) = one_line_dataset(tmp.path());
    let (status, stderr) = validate_with(&cfg, Some(("MINIBATCHD__DATASETS__TRAIN__MAX_ERRORS", "abc")));
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("found the string 'abc' (from MINIBATCHD__DATASETS__TRAIN__MAX_ERRORS)"), "{stderr}");
    // A number past i64 arrives as a float: its own text is shown, not "1.8446744073709552e+19".
    let (status, stderr) =
        validate_with(&cfg, Some(("MINIBATCHD__DATASETS__TRAIN__MAX_ERRORS", "18446744073709551615")));
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("found 18446744073709551615 (from MINIBATCHD__DATASETS__TRAIN__MAX_ERRORS)"), "{stderr}");
    // Found by a probe: the bound said was u64::MAX, which no TOML integer reaches.
    assert!(stderr.contains("up to 9223372036854775807, found"), "{stderr}");
    let (status, stderr) = validate_with(&cfg, Some(("MINIBATCHD__DAEMON__MEMORY_LIMIT_BYTES", "9223372036854775807")));
    assert!(status.success(), "the largest TOML integer is taken: {stderr}");
    // In the file, quoted: the advice for the file.
    let quoted = write(tmp.path(), "quoted.toml", text.replace("chunk_size_bytes = 300", "chunk_size_bytes = \"300\""));
    let (status, stderr) = validate(&quoted);
    assert!(!status.success() && stderr.contains("(write numbers without quotes)"), "{stderr}");
}

/// Found by a probe: an override of the wrong type or shape (a boolean for a number, a table
/// under a string key, a key that does not exist) was refused without naming the variable, as if
/// the file said it; every refusal of an override's value names it.
#[test]
fn every_refused_override_names_its_variable() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (cfg, _) = one_line_dataset(tmp.path());
    for (var, value, said) in [
        ("MINIBATCHD__DAEMON__HUGE_PAGES", "maybe", "daemon.huge_pages: expected true or false"),
        ("MINIBATCHD__DATASETS__TRAIN__CHUNK_SIZE_BYTES", "true", "expected a non-negative integer, found a boolean"),
        ("MINIBATCHD__DAEMON__SOCKET__X", "5", "daemon.socket: expected a string, found a table"),
        ("MINIBATCHD__DATASETS__TRAIN__RANDOMISE", "7", "datasets.train.randomise: unknown key"),
    ] {
        let (status, stderr) = validate_with(&cfg, Some((var, value)));
        assert!(!status.success(), "{var}={value}: {stderr}");
        assert!(stderr.contains(said) && stderr.contains(&format!("(from {var})")), "{var}: {stderr}");
    }
    // A problem of the file's own is not put on a variable of another key.
    let (_, text) = one_line_dataset(tmp.path());
    let bad = write(tmp.path(), "bad.toml", text.replace("chunk_size_bytes = 300", "chunk_size_bytes = true"));
    let (status, stderr) = validate_with(&bad, Some(("MINIBATCHD__DAEMON__RING_SLOTS", "8")));
    assert!(!status.success() && stderr.contains("found a boolean") && !stderr.contains("(from"), "{stderr}");
}

/// Found by a probe: `files = [""]` (an unset variable in an override) named the config's own
/// directory, and every file beside the config was read as data; it is refused, named.
#[test]
fn an_empty_path_in_files_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (cfg, text) = one_line_dataset(tmp.path());
    let (status, stderr) = validate_with(&cfg, Some(("MINIBATCHD__DATASETS__TRAIN__FILES", "")));
    assert!(!status.success() && stderr.contains("datasets.train.files: an empty path"), "{stderr}");
    let listed = write(tmp.path(), "listed.toml", text.replace("files = [", "files = [\"\", "));
    let (status, stderr) = validate(&listed);
    assert!(!status.success() && stderr.contains("datasets.train.files[0]: an empty path"), "{stderr}");
}

/// Found by a probe: `validate` and `index` panicked (exit 101) when their output could not be
/// written (`| head -0`, a full disk); they exit 1 naming the error, as `dump` does, and a closed
/// pipe is a success.
#[test]
fn validate_and_index_report_output_they_cannot_write() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (cfg, _) = one_line_dataset(tmp.path());
    for args in [&["validate"][..], &["index", "--dataset", "train"][..]] {
        let full = std::fs::File::options().write(true).open("/dev/full").expect("/dev/full");
        let mut cmd = Command::new(BIN);
        cmd.args(&args[..1]).arg("--config").arg(&cfg).args(&args[1..]);
        let out = cmd.stdin(Stdio::null()).stdout(full).stderr(Stdio::piped()).output().expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("writing output") && !stderr.contains("panicked"), "{args:?}: {stderr}");
        // A reader that went away: what it wanted was written.
        let mut child = Command::new(BIN)
            .args(&args[..1])
            .arg("--config")
            .arg(&cfg)
            .args(&args[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.code() == Some(0) && !stderr.contains("panicked"), "{args:?}: {:?} {stderr}", out.status);
    }
}

/// `dir/looping/` holding `part.ctf` and two symbolic links back to itself (`a` at the top,
/// `sub/b` below): the old walk went through 2^40 paths before `ELOOP` stopped it.
fn two_loops(dir: &Path) -> PathBuf {
    let looping = dir.join("looping");
    std::fs::create_dir_all(looping.join("sub")).expect("mkdir");
    write(&looping, "part.ctf", "0 |F 1 2 3\n1 |F 4 5 6\n");
    symlink(".", looping.join("a")).expect("symlink");
    symlink("..", looping.join("sub/b")).expect("symlink");
    looping
}

/// The config of `dir` with `train` (a good dataset, `train.ctf`) and `extra` tables.
fn config(dir: &Path, extra: &str) -> PathBuf {
    write(dir, "train.ctf", train_ctf());
    let text = format!("{}{}{extra}", daemon_table(dir), ctf_dataset("train", &[&dir.join("train.ctf")]));
    write(dir, "minibatchd.toml", text)
}

#[test]
fn a_symlink_loop_in_a_dataset_directory_is_an_error_not_41_copies() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).expect("mkdir");
    write(&data, "part.ctf", "0 |F 1 2 3\n");
    symlink(".", data.join("again")).expect("symlink");
    let cfg = config(tmp.path(), &ctf_dataset("looping", &[&data]));
    let (status, stderr) = validate(&cfg);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("datasets.looping.files"), "{stderr}");
    assert!(stderr.contains(&format!("{}: a symbolic link loop", data.join("again").display())), "{stderr}");
    let (status, stderr) = index(&cfg, "looping");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("symbolic link loop"), "{stderr}");
    // `dump` reads the data: never 41 copies of it.
    let mut cmd = Command::new(BIN);
    cmd.arg("dump").arg("--config").arg(&cfg).args(["--dataset", "looping", "--minibatch-size", "1", "--full-sweep"]);
    let out = output_within(cmd, "dump");
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stdout));
}

/// A running `minibatchd run`, its stderr in `dir/daemon.log` (at `info`), killed on drop.
struct Daemon {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Daemon {
    /// Starts `minibatchd run --config CONFIG` and waits for its socket.
    fn start(dir: &Path, config: &Path) -> Self {
        let log = dir.join("daemon.log");
        let child = Command::new(BIN)
            .arg("run")
            .arg("--config")
            .arg(config)
            .env("MINIBATCHD_LOG", "info")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn the daemon");
        let mut d = Self { child, socket: dir.join("mbd.sock"), log };
        let start = Instant::now();
        while UnixStream::connect(&d.socket).is_err() {
            assert!(d.child.try_wait().expect("try_wait").is_none(), "the daemon exited at start:\n{}", d.log_text());
            assert!(start.elapsed() < DEADLINE, "the daemon did not open its socket:\n{}", d.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log holds `what` `count` times; returns the log.
    fn wait_log(&self, what: &str, count: usize) -> String {
        let start = Instant::now();
        loop {
            let text = self.log_text();
            if text.matches(what).count() >= count {
                return text;
            }
            assert!(start.elapsed() < DEADLINE, "the daemon never logged {what:?} ({count}×):\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(i32::try_from(self.child.id()).expect("pid")).expect("pid");
        rustix::process::kill_process(pid, sig).expect("kill");
    }

    /// A session on `dataset` reads one minibatch.
    fn serves(&self, dataset: &str) {
        let mut s = Client::open_when_indexed(&self.socket, dataset, &options(4), Some(DEADLINE))
            .unwrap_or_else(|e| panic!("open {dataset}: {e}"));
        assert!(s.next_owned().expect("next").is_some(), "{dataset} served no minibatch");
    }

    /// SIGTERM, then the exit status within [`STOP_DEADLINE`].
    fn stop(&mut self) -> ExitStatus {
        self.signal(rustix::process::Signal::TERM);
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(start.elapsed() < STOP_DEADLINE, "SIGTERM did not stop the daemon:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn two_symlink_loops_do_not_hang_validate_index_or_run() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let looping = two_loops(tmp.path());
    let cfg = config(tmp.path(), &ctf_dataset("looping", &[&looping]));
    let (status, stderr) = validate(&cfg);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("{}: a symbolic link loop", looping.join("a").display())), "{stderr}");
    let (status, stderr) = index(&cfg, "looping");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("symbolic link loop"), "{stderr}");
    // `run` logs the dataset that cannot open, refuses it to clients and serves the others.
    let mut d = Daemon::start(tmp.path(), &cfg);
    let log = d.wait_log("symbolic link loop", 1);
    assert!(log.contains("looping"), "{log}");
    d.serves("train");
    let refused = Client::connect(&d.socket).expect("connect").open("looping", &options(4));
    assert!(matches!(refused, Err(ClientError::Daemon { code: ErrorCode::UnknownDataset, .. })), "{refused:?}");
    let status = d.stop();
    assert!(status.success(), "{status:?}");
}

#[test]
fn a_reload_adding_a_looping_directory_keeps_the_daemon_reloadable_and_stoppable() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = config(tmp.path(), "");
    let good = std::fs::read_to_string(&cfg).expect("config");
    let mut d = Daemon::start(tmp.path(), &cfg);
    d.serves("train");
    // A reload adding a dataset whose directory holds two loops: refused at once, logged.
    let looping = two_loops(tmp.path());
    write(tmp.path(), "minibatchd.toml", format!("{good}{}", ctf_dataset("looping", &[&looping])));
    d.signal(rustix::process::Signal::HUP);
    let log = d.wait_log("configuration reload refused", 1);
    assert!(log.contains("datasets.looping.files") && log.contains("symbolic link loop"), "{log}");
    d.serves("train");
    // A second, valid reload applies: the daemon was not left inside the first.
    write(tmp.path(), "extra.ctf", "0 |F 1 2 3\n1 |F 4 5 6\n");
    write(tmp.path(), "minibatchd.toml", format!("{good}{}", ctf_dataset("extra", &[&tmp.path().join("extra.ctf")])));
    d.signal(rustix::process::Signal::HUP);
    d.wait_log("configuration reloaded", 1);
    d.serves("extra");
    d.serves("train");
    let status = d.stop();
    assert!(status.success(), "{status:?}");
}

#[test]
fn fifos_devices_and_dangling_links_are_named_as_such() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let t = tmp.path();
    let ok = Command::new("mkfifo").arg(t.join("fifo")).status().expect("run mkfifo").success();
    assert!(ok, "mkfifo");
    let _socket = std::os::unix::net::UnixListener::bind(t.join("sock")).expect("bind");
    symlink(t.join("missing.ctf"), t.join("dangling")).expect("symlink");
    symlink("self", t.join("self")).expect("symlink");
    let data = t.join("data");
    std::fs::create_dir(&data).expect("mkdir");
    write(&data, "part.ctf", "0 |F 1 2 3\n");
    symlink("../fifo", data.join("pipe.ctf")).expect("symlink");
    let cases: [(PathBuf, String); 7] = [
        (t.join("fifo"), "a FIFO (named pipe), not a regular file; it is not opened".into()),
        (t.join("sock"), "a socket, not a regular file".into()),
        ("/dev/null".into(), "a character device, not a regular file".into()),
        (
            t.join("dangling"),
            format!("a dangling symbolic link: its target {} does not exist", t.join("missing.ctf").display()),
        ),
        (t.join("self"), "a symbolic link (to self) that cannot be followed: Too many levels of symbolic links".into()),
        // In a directory, and matched by a glob: reported, not skipped, and never opened.
        (data.clone(), format!("{} (a symbolic link to ../fifo): a FIFO", data.join("pipe.ctf").display())),
        (data.join("*.ctf"), format!("{} (a symbolic link to ../fifo): a FIFO", data.join("pipe.ctf").display())),
    ];
    for (path, what) in &cases {
        let cfg = config(t, &ctf_dataset("hostile", &[path]));
        let (status, stderr) = validate(&cfg);
        assert_eq!(status.code(), Some(1), "{}: {stderr}", path.display());
        assert!(
            stderr.contains("datasets.hostile.files") && stderr.contains(what.as_str()),
            "{}: {stderr}",
            path.display()
        );
        assert!(!stderr.contains("no such file"), "{stderr}");
    }
}

#[test]
fn the_same_file_through_two_symlinks_is_refused_naming_both_paths() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).expect("mkdir");
    write(&data, "part.ctf", "0 |F 1 2 3\n");
    symlink("part.ctf", data.join("copy.ctf")).expect("symlink");
    let cfg = config(tmp.path(), &ctf_dataset("twice", &[&data]));
    let (status, stderr) = validate(&cfg);
    assert_eq!(status.code(), Some(1), "{stderr}");
    let both = format!("{} and {} are the same file", data.join("copy.ctf").display(), data.join("part.ctf").display());
    assert!(stderr.contains(&both), "{stderr}");
}
