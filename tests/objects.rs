//! Issue #16: datasets in object storage, against a real S3 server on loopback (moto's server
//! mode, `support::s3`).
//!
//! * every golden fixture (CTF and the deepx formats, gzip objects, directories and globs)
//!   uploaded to a bucket and dumped from `s3://` prints exactly its golden output;
//! * bad credentials, a missing bucket and a missing key are clear errors naming the URL;
//! * an object overwritten after it was indexed is an error naming its URL, never read through
//!   the old index;
//! * four nodes indexing the same objects at once: one indexes, the others download its index;
//! * a server that answers 503, resets connections mid-body and trickles responses is survived:
//!   the dumps are still exactly the golden ones;
//! * the local index cache of an object that rotated out of a dataset's prefix is removed once
//!   unused past the grace; those of the objects the dataset reads are kept;
//! * a server that accepts connections and never answers (at start, or in the middle of a
//!   session) is an error naming the object and the endpoint within `object_retry_secs` +
//!   `object_request_timeout_secs`, a refused connection is "cannot reach", never "access
//!   denied", and a SIGTERM during such a stall ends the process within its stop bound.

mod support;

use std::fmt::Write as _;
use std::path::Path;
use std::process::Output;

use support::s3::{FaultProxy, S3Server};
use support::{package_root, write, BIN};

const BUCKET: &str = "train-data";

/// `minibatchd <args>` with `server`'s AWS environment.
fn minibatchd(server: &S3Server, args: &[&str], state: &Path) -> Output {
    minibatchd_through(server, &server.endpoint, args, state)
}

/// [`minibatchd`] with requests to `endpoint` (a fault proxy before `server`).
fn minibatchd_through(server: &S3Server, endpoint: &str, args: &[&str], state: &Path) -> Output {
    let mut c = std::process::Command::new(BIN);
    c.args(args).env("MINIBATCHD_LOG", "info").env("MINIBATCHD__DAEMON__STATE_DIR", state);
    for (k, v) in server.env() {
        c.env(k, v);
    }
    c.env("AWS_ENDPOINT_URL", endpoint).output().expect("run minibatchd")
}

/// `config.toml` of a fixture with every `files` entry rewritten to `s3://BUCKET/<case>/<entry>`.
fn to_objects(config: &str, case: &str) -> String {
    config
        .lines()
        .map(|line| match line.strip_prefix("files = ") {
            Some(list) => {
                let entries: Vec<String> = serde_json::from_str(list).expect("a files list on one line");
                let urls: Vec<String> = entries.iter().map(|e| format!("s3://{BUCKET}/{case}/{e}")).collect();
                format!("files = {}", serde_json::to_string(&urls).expect("json"))
            }
            None => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn case_args(dir: &Path) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(dir.join("case.toml")).ok()?;
    let exit_zero = text.lines().any(|l| l == "exit = 0");
    let args = text.lines().find_map(|l| l.strip_prefix("args = "))?;
    exit_zero.then(|| serde_json::from_str(args).expect("args"))
}

#[test]
fn dump_from_object_storage_prints_the_golden_output_of_every_fixture() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let work = tempfile::tempdir().expect("tempdir");
    let mut checked = 0;
    let mut failures = Vec::new();
    for suite in ["tests/fixtures", "tests/fixtures_deepx"] {
        let mut dirs: Vec<_> =
            std::fs::read_dir(package_root().join(suite)).expect("suite").flatten().map(|e| e.path()).collect();
        dirs.sort();
        for dir in dirs {
            let Some(args) = case_args(&dir) else { continue };
            let case = dir.file_name().expect("name").to_string_lossy().into_owned();
            let mut data = dir.clone();
            // Every file of the case but its own description is data.
            let tmp = work.path().join(&case);
            std::fs::create_dir_all(&tmp).expect("mkdir");
            copy_data(&dir, &tmp);
            server.put_tree(BUCKET, &case, &tmp);
            data.push("config.toml");
            let config = to_objects(&std::fs::read_to_string(&data).expect("config"), &case);
            let config_path = write(&tmp, "s3.toml", config);
            let state = work.path().join(format!("{case}.state"));
            let mut full: Vec<&str> = vec!["dump", "--config", config_path.to_str().expect("utf-8"), "--dataset", "d"];
            full.extend(args.iter().map(String::as_str));
            let out = minibatchd(&server, &full, &state);
            let expected = std::fs::read_to_string(dir.join("expected.jsonl")).expect("expected.jsonl");
            checked += 1;
            if !out.status.success() || out.stdout != expected.as_bytes() {
                failures.push(format!(
                    "== {case}: exit {:?}\n{}\n--- expected\n{expected}\n--- got\n{}",
                    out.status.code(),
                    String::from_utf8_lossy(&out.stderr),
                    String::from_utf8_lossy(&out.stdout)
                ));
            }
        }
    }
    println!("{checked} fixtures dumped from s3://, {} differ", failures.len());
    assert!(checked >= 50, "fixtures missing: {checked}");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Copies the data files of a fixture (not its `case.toml`, `config.toml`, `expected.jsonl`).
fn copy_data(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).expect("read_dir").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if ["case.toml", "config.toml", "expected.jsonl"].contains(&name.as_str()) {
            continue;
        }
        let p = e.path();
        if p.is_dir() {
            std::fs::create_dir_all(to.join(&name)).expect("mkdir");
            copy_data(&p, &to.join(&name));
        } else {
            std::fs::copy(&p, to.join(&name)).expect("copy");
        }
    }
}

/// 120,000 one-feature libsvm lines, about 1 MB: more than a small object cache holds.
fn megabyte_libsvm() -> String {
    let mut text = String::new();
    for i in 0..120_000 {
        let _ = writeln!(text, "1 {}:1", i % 1000 + 1);
    }
    text
}

fn libsvm_config(dir: &Path, files: &[&str]) -> std::path::PathBuf {
    let list = serde_json::to_string(files).expect("json");
    write(dir, "c.toml", format!("[datasets.d]\nformat = \"libsvm\"\nfiles = {list}\n"))
}

#[test]
fn refused_credentials_a_missing_bucket_key_or_server_are_errors_naming_the_url() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    server.put(BUCKET, "ok/data.txt", b"1 1:1\n0 2:1\n");
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    for (files, expected) in [
        (vec!["s3://no-such-bucket/data.txt"], "s3://no-such-bucket/data.txt: no such bucket"),
        (vec!["s3://train-data/ok/missing.txt"], "s3://train-data/ok/missing.txt: no object matches"),
        (vec!["s3://train-data/none-*.txt"], "s3://train-data/none-*.txt: no object matches"),
    ] {
        let config = libsvm_config(dir.path(), &files);
        for cmd in [
            vec!["validate", "--config"],
            vec!["dump", "--minibatch-size", "1", "--full-sweep", "--dataset", "d", "--config"],
        ] {
            let mut args = cmd.clone();
            args.push(config.to_str().expect("utf-8"));
            let out = minibatchd(&server, &args, &state);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
            assert!(stderr.contains(expected), "{args:?}: expected {expected:?} in\n{stderr}");
        }
    }
    let config = libsvm_config(dir.path(), &["s3://train-data/ok/data.txt"]);
    // Credentials the server refuses.
    let checking = S3Server::start_checking_credentials();
    let out = minibatchd(&checking, &["validate", "--config", config.to_str().expect("utf-8")], &state);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("s3://train-data/ok/data.txt: access denied") && stderr.contains("check the AWS credentials"),
        "{stderr}"
    );
    // No server where the endpoint points: a network error naming the URL, after the retries.
    let mut c = std::process::Command::new(BIN);
    c.args(["validate", "--config", config.to_str().expect("utf-8")]).env("MINIBATCHD__DAEMON__STATE_DIR", &state);
    for (k, v) in server.env() {
        c.env(k, v);
    }
    let dead = format!("http://127.0.0.1:{}", support::s3::free_port());
    // Retried for 2 s (object_retry_secs) before it is an error.
    let out =
        c.env("AWS_ENDPOINT_URL", &dead).env("MINIBATCHD__DAEMON__OBJECT_RETRY_SECS", "2").output().expect("validate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    // A refused connection is not a matter of credentials (the elapsed time in the message, say
    // 2.403 s, read as a 403 before).
    assert!(
        stderr.contains(&format!("s3://train-data/ok/data.txt: cannot reach the object store at {dead}")),
        "{stderr}"
    );
    assert!(!stderr.contains("access denied") && !stderr.contains("credentials"), "{stderr}");
}

/// A TCP server on loopback that accepts every connection and never sends a byte (nor reads
/// one): a stalled object store. Stops accepting when dropped.
struct Silent {
    endpoint: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    port: u16,
}

impl Silent {
    fn start() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for conn in listener.incoming() {
                if stopping.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                if let Ok(c) = conn {
                    held.push(c);
                }
            }
        });
        Self { endpoint: format!("http://127.0.0.1:{port}"), stop, port }
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Issue #36: an endpoint that accepts TCP and never answers made `validate` (and a daemon's
/// dataset opening, and a session's reads) wait 150-290 s with `object_retry_secs = 5`, then
/// report it as anything but a stall. Every request now has a deadline: the error comes within
/// `object_retry_secs` + `object_request_timeout_secs` and says which endpoint did not answer
/// what.
#[test]
fn a_silent_endpoint_is_an_error_within_the_retry_and_request_timeouts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = libsvm_config(dir.path(), &["s3://train-data/ok/data.txt"]);
    let silent = Silent::start();
    let mut c = std::process::Command::new(BIN);
    c.args(["validate", "--config", config.to_str().expect("utf-8")])
        .env("MINIBATCHD__DAEMON__STATE_DIR", dir.path().join("state"))
        .env("MINIBATCHD__DAEMON__OBJECT_RETRY_SECS", "1")
        .env("MINIBATCHD__DAEMON__OBJECT_REQUEST_TIMEOUT_SECS", "1");
    for (k, v) in [
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent"),
        ("AWS_CONFIG_FILE", "/nonexistent"),
    ] {
        c.env(k, v);
    }
    let started = std::time::Instant::now();
    let out = c.env("AWS_ENDPOINT_URL", &silent.endpoint).output().expect("validate");
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("a silent endpoint: an error after {took:.2?} (object_retry_secs 1 + object_request_timeout_secs 1)");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("s3://train-data/ok/data.txt: cannot reach the object store at {}", silent.endpoint)),
        "{stderr}"
    );
    assert!(stderr.contains("object_request_timeout_secs"), "what timed out is not said: {stderr}");
    assert!(!stderr.contains("access denied"), "{stderr}");
    // 2 s of deadline, and the process's own start and stop.
    assert!(took < std::time::Duration::from_secs(5), "the error came after {took:?}");
}

/// The server stops sending in the middle of the index pass's stream of a whole object (a proxy
/// goes silent after 300 kB of response bodies): `minibatchd index` fails within
/// `object_retry_secs` + `object_request_timeout_secs` of the stall, naming the object and the
/// endpoint. A streaming read had a connect timeout only, and a body that stopped was waited for.
#[test]
fn a_stream_that_stalls_midway_is_an_error_within_the_timeouts() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let text = megabyte_libsvm();
    server.put(BUCKET, "midway/data.txt", text.as_bytes());
    let dir = tempfile::tempdir().expect("tempdir");
    let config = libsvm_config(dir.path(), &["s3://train-data/midway/data.txt"]);
    let proxy = FaultProxy::start(&server, &["--stall-after-bytes", "300000"]);
    let mut c = std::process::Command::new(BIN);
    c.args(["index", "--config", config.to_str().expect("utf-8"), "--dataset", "d"])
        .env("MINIBATCHD__DAEMON__STATE_DIR", dir.path().join("state"))
        .env("MINIBATCHD__DAEMON__OBJECT_RETRY_SECS", "1")
        .env("MINIBATCHD__DAEMON__OBJECT_REQUEST_TIMEOUT_SECS", "1");
    for (k, v) in server.env() {
        c.env(k, v);
    }
    let started = std::time::Instant::now();
    let out = c.env("AWS_ENDPOINT_URL", &proxy.endpoint).output().expect("index");
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!(
        "a stream stalled midway: `index` failed after {took:.2?} in all (object_retry_secs 1 + object_request_timeout_secs 1): {}",
        stderr.trim_end().lines().last().unwrap_or("")
    );
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("s3://train-data/midway/data.txt")
            && stderr.contains(&format!("cannot reach the object store at {}", proxy.endpoint))
            && stderr.contains("object_request_timeout_secs"),
        "{stderr}"
    );
    assert!(proxy.stats().expect("stats")["stalled"].as_u64().is_some_and(|n| n > 0));
    // The listing, the shared index's lookup and lock, 300 kB, then 2 s of deadline.
    assert!(took < std::time::Duration::from_secs(6), "the error came after {took:?}");
}

/// An object of 120,000 lines (about 1 MB) at `s3://BUCKET/<key>`, and a daemon reading it
/// through a fault proxy (returned to stall it) with `daemon_extra` in `[daemon]`: 8 KiB chunks,
/// a 1 MiB object cache (the object is larger than half of it, so the index pass does not
/// keep it and every chunk is fetched by its range).
fn daemon_behind_a_proxy(
    server: &S3Server,
    dir: &Path,
    key: &str,
    daemon_extra: &str,
) -> (support::daemon::Daemon, FaultProxy) {
    let text = megabyte_libsvm();
    server.put(BUCKET, key, text.as_bytes());
    support::daemon::write_config(
        dir,
        &format!("ring_slots = 2\nobject_cache_bytes = 1048576\n{daemon_extra}\n"),
        &format!(
            "[datasets.d]\nformat = \"libsvm\"\nfiles = [\"s3://{BUCKET}/{key}\"]\nchunk_size_bytes = 8192\n\
             [datasets.d.sampling]\nrandomize = false\n"
        ),
    );
    let proxy = FaultProxy::start(server, &[]);
    let env: Vec<_> = server
        .env()
        .into_iter()
        .map(|(k, v)| if k == "AWS_ENDPOINT_URL" { (k, proxy.endpoint.clone()) } else { (k, v) })
        .collect();
    (support::daemon::Daemon::start(dir, &env), proxy)
}

/// The store stalls in the middle of a session (a proxy stops answering: requests, and the
/// responses being sent): the session ends with a `data_error` naming the object, the endpoint
/// and what timed out, within `object_retry_secs` + `object_request_timeout_secs` of the stall.
/// It waited minutes without an error before.
#[test]
fn a_store_that_stalls_mid_session_is_a_data_error_within_the_timeouts() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let dir = tempfile::tempdir().expect("tempdir");
    let (daemon, proxy) = daemon_behind_a_proxy(
        &server,
        dir.path(),
        "stalling/data.txt",
        "object_retry_secs = 1\nobject_request_timeout_secs = 1",
    );
    let mut opts = support::daemon::options(2048);
    opts.full_sweep = true;
    let mut s = daemon.client().open("d", &opts).expect("open");
    assert!(s.next_owned().expect("served before the stall").is_some());
    proxy.stall();
    let stalled = std::time::Instant::now();
    let error = loop {
        match s.next_owned() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the whole sweep was served through a stalled store"),
            Err(e) => break e.to_string(),
        }
    };
    let took = stalled.elapsed();
    println!("stalled mid-session: data_error after {took:.2?} (object_retry_secs 1 + object_request_timeout_secs 1): {error}");
    assert!(
        error.contains("s3://train-data/stalling/data.txt")
            && error.contains(&format!("cannot reach the object store at {}", proxy.endpoint))
            && error.contains("object_request_timeout_secs"),
        "{error}"
    );
    assert!(took < std::time::Duration::from_secs(4), "the error came {took:?} after the stall");
    assert!(proxy.stats().expect("stats")["stalled"].as_u64().is_some_and(|n| n > 0));
}

/// A SIGTERM while reads hang on a stalled store (deadlines far longer than the stop): the
/// daemon logged `stopped` within a second, then lived on for minutes holding `daemon.lock`,
/// its runtime waiting for the blocked fetches at exit, so neither systemd's restart nor a new
/// daemon could start. The process now ends within the stop's bound (twice
/// `shutdown_grace_secs` + 25 s), cleanly, and the lock is free.
#[test]
fn a_sigterm_during_a_stall_ends_the_process_within_the_stop_bound() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let dir = tempfile::tempdir().expect("tempdir");
    let grace = 1;
    let (mut daemon, proxy) = daemon_behind_a_proxy(
        &server,
        dir.path(),
        "stop/data.txt",
        &format!("object_retry_secs = 60\nobject_request_timeout_secs = 60\nshutdown_grace_secs = {grace}"),
    );
    let mut opts = support::daemon::options(2048);
    opts.full_sweep = true;
    let mut s = daemon.client().open("d", &opts).expect("open");
    assert!(s.next_owned().expect("served before the stall").is_some());
    proxy.stall();
    // The session goes on asking for chunks; its reads hang on the stalled store.
    let reader = std::thread::spawn(move || while let Ok(Some(_)) = s.next_owned() {});
    let start = std::time::Instant::now();
    while proxy.stats().expect("stats")["stalled"].as_u64().unwrap_or(0) == 0 {
        assert!(start.elapsed() < support::daemon::DEADLINE, "no request reached the stalled proxy");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    daemon.signal(rustix::process::Signal::TERM);
    let signalled = std::time::Instant::now();
    let bound = std::time::Duration::from_secs(2 * grace + 25);
    let status = loop {
        if !daemon.running() {
            break daemon.wait();
        }
        assert!(signalled.elapsed() < bound, "the daemon still runs {bound:?} after SIGTERM (the stop's bound)");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let took = signalled.elapsed();
    println!("SIGTERM during a stall: the process ended after {took:.2?} (bound {bound:?})");
    assert!(status.success(), "{status:?}");
    // Nor did a stage wait out the supervisor's margin (the readahead stage waiting for a fetch to free
    // while every one hung on the store took 20 s).
    assert!(took < std::time::Duration::from_secs(grace + 10), "the stop took {took:?}");
    let _ = reader.join();
    // The lock is free: another daemon could take the state directory.
    let lock = std::fs::File::open(dir.path().join("state/daemon.lock")).expect("the lock file");
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).expect("daemon.lock is free");
}

#[test]
fn nodes_indexing_the_same_objects_at_once_index_them_once() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let mut text = String::new();
    for i in 0..20_000 {
        let _ = writeln!(text, "{} {}:1 {}:0.5", i % 2, i % 97, i % 13 + 100);
    }
    for part in 0..3 {
        server.put(BUCKET, &format!("shared/part-{part}.txt"), text.as_bytes());
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let config = libsvm_config(dir.path(), &["s3://train-data/shared/"]);
    // Four nodes: each its own state directory (its own local index cache), started together.
    let children: Vec<_> = (0..4)
        .map(|n| {
            let mut c = std::process::Command::new(BIN);
            c.args(["index", "--config", config.to_str().expect("utf-8"), "--dataset", "d"])
                .env("MINIBATCHD_LOG", "info")
                .env("MINIBATCHD__DAEMON__STATE_DIR", dir.path().join(format!("node-{n}")))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            for (k, v) in server.env() {
                c.env(k, v);
            }
            c.spawn().expect("spawn index")
        })
        .collect();
    let mut indexed = 0;
    let mut downloaded = 0;
    let mut summaries = Vec::new();
    for child in children {
        let out = child.wait_with_output().expect("index");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        indexed += stderr.matches("indexed the object").count();
        downloaded += stderr.matches("downloaded the shared index").count();
        summaries.push(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    assert_eq!((indexed, downloaded), (3, 9), "each of the 3 objects indexed by one node, downloaded by three");
    assert!(summaries.iter().all(|s| s == &summaries[0] && s.contains("60000 sequences")), "{summaries:?}");
    // A fifth node later finds every index there.
    let out = minibatchd(
        &server,
        &["index", "--config", config.to_str().expect("utf-8"), "--dataset", "d"],
        &dir.path().join("node-5"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("downloaded the shared index").count(), 3, "{stderr}");
}

/// Dumps `cases` (fixture directories of `tests/fixtures_deepx` and `tests/fixtures`) from
/// objects uploaded to `server`, through `endpoint`; the failures.
fn dump_cases(server: &S3Server, endpoint: &str, cases: &[&str], work: &Path) -> Vec<String> {
    let mut failures = Vec::new();
    for case in cases {
        let dir = ["tests/fixtures", "tests/fixtures_deepx"]
            .iter()
            .map(|s| package_root().join(s).join(case))
            .find(|d| d.is_dir())
            .expect("a fixture");
        let args = case_args(&dir).expect("a successful case");
        let tmp = work.join(case);
        std::fs::create_dir_all(&tmp).expect("mkdir");
        copy_data(&dir, &tmp);
        server.put_tree(BUCKET, case, &tmp);
        let config = to_objects(&std::fs::read_to_string(dir.join("config.toml")).expect("config"), case);
        let config_path = write(&tmp, "s3.toml", config);
        let mut c = std::process::Command::new(BIN);
        c.args(["dump", "--config", config_path.to_str().expect("utf-8"), "--dataset", "d"])
            .args(&args)
            .env("MINIBATCHD_LOG", "warn")
            .env("MINIBATCHD__DAEMON__STATE_DIR", work.join(format!("{case}.state")));
        for (k, v) in server.env() {
            c.env(k, v);
        }
        let out = c.env("AWS_ENDPOINT_URL", endpoint).output().expect("dump");
        let expected = std::fs::read_to_string(dir.join("expected.jsonl")).expect("expected");
        if !out.status.success() || out.stdout != expected.as_bytes() {
            failures.push(format!("== {case}: {}", String::from_utf8_lossy(&out.stderr)));
        }
    }
    failures
}

#[test]
fn a_server_that_fails_resets_and_stalls_is_survived_with_retries() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    // Every 3rd request a 503, every 4th GET cut off mid-body, every 5th trickled.
    let proxy = FaultProxy::start(&server, &["--fail-every", "3", "--reset-every", "4", "--slow-every", "5"]);
    let work = tempfile::tempdir().expect("tempdir");
    let cases = [
        "gzip_multi_member",
        "files_directories_and_globs",
        "libsvm_ex_groups",
        "cycled_minibatch_sizes_keep_the_order",
    ];
    let failures = dump_cases(&server, &proxy.endpoint, &cases, work.path());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let stats = proxy.stats().expect("stats");
    for fault in ["failed", "reset", "slowed"] {
        assert!(stats[fault].as_u64().is_some_and(|n| n > 0), "no {fault} request was injected: {stats}");
    }
    println!("survived: {stats}");
}

#[test]
fn an_object_overwritten_after_indexing_is_an_error_naming_it_not_the_old_index() {
    overwritten_after_indexing(&[]);
}

/// The same through a server that ignores `If-Match` (a proxy drops the header): the response's
/// own ETag and size are checked against the listing's, so the new version's bytes are never
/// joined to the old index (they were served, silently, before the check).
#[test]
fn an_object_overwritten_behind_a_server_that_ignores_if_match_is_still_an_error() {
    overwritten_after_indexing(&["--strip-if-match"]);
}

/// Found by a hostile probe: a server that ignores `If-Match` and sends no ETag had its
/// responses taken as the version indexed (an answer without an ETag passed the check), and a
/// same-size overwrite was served mixed with the old bytes, exit status 0. An answer without an
/// ETag for an object listed with one is now refused, naming the object.
#[test]
fn an_object_read_behind_a_server_that_drops_etags_is_refused_not_served_unproven() {
    overwritten_after_indexing(&["--strip-if-match", "--strip-etag"]);
}

fn overwritten_after_indexing(faults: &[&str]) {
    use support::daemon::{options, Daemon};
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    // 1 MB: more than half of the 1 MiB cache below, so the index pass does not keep the whole
    // object and every chunk is fetched by its range.
    let text = megabyte_libsvm();
    server.put(BUCKET, "changing/data.txt", text.as_bytes());
    let dir = tempfile::tempdir().expect("tempdir");
    support::daemon::write_config(
        dir.path(),
        "ring_slots = 2\nobject_cache_bytes = 1048576\n",
        &format!(
            "[datasets.d]\nformat = \"libsvm\"\nfiles = [\"s3://{BUCKET}/changing/data.txt\"]\nchunk_size_bytes = 8192\n\
             [datasets.d.sampling]\nrandomize = false\n"
        ),
    );
    let proxy = (!faults.is_empty()).then(|| FaultProxy::start(&server, faults));
    let no_etags = faults.contains(&"--strip-etag");
    let env: Vec<_> = server
        .env()
        .into_iter()
        .map(|(k, v)| match (&proxy, k) {
            (Some(p), "AWS_ENDPOINT_URL") => (k, p.endpoint.clone()),
            _ => (k, v),
        })
        .collect();
    let daemon = Daemon::start(dir.path(), &env);
    let mut opts = options(16);
    opts.full_sweep = true;
    if no_etags {
        // Nothing unproven is read: the index pass's first range is refused, and with it the
        // dataset, naming the object and why.
        let Err(error) = daemon.client().open("d", &opts) else { panic!("a dataset read without ETags opened") };
        let error = error.to_string();
        assert!(error.contains("s3://train-data/changing/data.txt") && error.contains("carries no ETag"), "{error}");
        let stats = proxy.as_ref().expect("a proxy").stats().expect("stats");
        assert!(stats["etag_stripped"].as_u64().is_some_and(|n| n > 0), "no ETag was dropped: {stats}");
        return;
    }
    let mut s = daemon.client().open("d", &opts).expect("open");
    for _ in 0..4 {
        assert!(s.next_owned().expect("served before the change").is_some());
    }
    // The same size, other bytes: a new ETag.
    server.put(BUCKET, "changing/data.txt", text.replace("1 ", "0 ").as_bytes());
    let error = loop {
        match s.next_owned() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the whole sweep was served from the old index"),
            Err(e) => break e.to_string(),
        }
    };
    assert!(
        error.contains("s3://train-data/changing/data.txt") && error.contains("changed since it was indexed"),
        "{error}"
    );
    if let Some(p) = proxy {
        let stats = p.stats().expect("stats");
        assert!(stats["stripped"].as_u64().is_some_and(|n| n > 0), "no If-Match was dropped: {stats}");
    }
}

/// `minibatchd index` of a libsvm dataset of `files` (URLs) after `objects` (keys and contents)
/// are put in the bucket, through a fault proxy started with `flags`: its output and stderr, how
/// long it took, and the proxy and server (for their stats and contents).
struct IndexedThrough {
    out: Output,
    stderr: String,
    took: std::time::Duration,
    proxy: FaultProxy,
    server: S3Server,
}

fn index_through(objects: &[(&str, &[u8])], files: &[&str], flags: &[&str]) -> IndexedThrough {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    for (key, bytes) in objects {
        server.put(BUCKET, key, bytes);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let config = libsvm_config(dir.path(), files);
    let proxy = FaultProxy::start(&server, flags);
    let args = ["index", "--config", config.to_str().expect("utf-8"), "--dataset", "d"];
    let started = std::time::Instant::now();
    let out = minibatchd_through(&server, &proxy.endpoint, &args, &dir.path().join("state"));
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    IndexedThrough { out, stderr, took, proxy, server }
}

/// Read-only credentials (a proxy answers every write 403): the index lock cannot be written, so
/// the node indexes the object itself and says it does not share the index; the dataset opens.
/// The lock's refusal failed the open before.
#[test]
fn read_only_credentials_index_the_object_here_without_sharing() {
    let part: &[u8] = b"1 1:1 2:1\n0 3:1\n1 4:0.5\n";
    let r = index_through(&[("readonly/part.txt", part)], &["s3://train-data/readonly/part.txt"], &["--deny-writes"]);
    assert!(r.out.status.success(), "{}", r.stderr);
    assert!(r.stderr.contains("without sharing their indexes"), "{}", r.stderr);
    assert!(String::from_utf8_lossy(&r.out.stdout).contains("3 sequences"));
    assert!(r.proxy.stats().expect("stats")["denied"].as_u64().is_some_and(|n| n > 0));
}

/// Found by a probe: a server without conditional writes (`501 NotImplemented` to `If-None-Match`
/// on a PUT, as older S3-compatible servers answer) made every object's index pass wait out
/// `object_retry_secs`, then fail, so the dataset could not be read at all. The lock is a
/// courtesy: the objects are indexed here without sharing, the refusal said once, and the lock
/// asked for once, not per object nor for the retry time.
#[test]
fn a_server_without_conditional_puts_has_its_objects_indexed_here_without_sharing() {
    let objects: [(&str, &[u8]); 2] = [("nocond/a.txt", b"1 1:1 2:1\n0 3:1\n"), ("nocond/b.txt", b"1 4:0.5\n")];
    let r = index_through(&objects, &["s3://train-data/nocond/"], &["--no-conditional-puts"]);
    assert!(r.out.status.success(), "{}", r.stderr);
    assert_eq!(r.stderr.matches("without sharing their indexes").count(), 1, "{}", r.stderr);
    assert!(String::from_utf8_lossy(&r.out.stdout).contains("3 sequences"), "{}", r.stderr);
    // One lock, tried three times (twice again within 2 s), for the first object only.
    assert_eq!(r.proxy.stats().expect("stats")["unconditional"].as_u64(), Some(3), "the lock asked for once");
    assert!(r.took < std::time::Duration::from_secs(20), "took {:?}", r.took);
}

/// Found by a probe: a lock put the store applied but whose answer was lost (a 500 after the
/// write, a reset) was retried, found "already there", and taken for another node's lock: the
/// node waited `object_index_wait_secs` for its own lock, and left it in the bucket. The lock's
/// content says it is this node's: indexed at once, and the lock removed.
#[test]
fn a_lock_whose_put_answer_was_lost_is_known_as_this_nodes_own() {
    use minibatchd_engine::remote::ObjectStore as _;
    let objects: [(&str, &[u8]); 1] = [("lost/a.txt", b"1 1:1 2:1\n0 3:1\n")];
    let r = index_through(&objects, &["s3://train-data/lost/a.txt"], &["--lose-first-answer-for", ".lock"]);
    assert!(r.out.status.success(), "{}", r.stderr);
    assert_eq!(r.proxy.stats().expect("stats")["lost"].as_u64(), Some(1), "the lock's answer was lost");
    assert!(!r.stderr.contains("another node is indexing"), "{}", r.stderr);
    assert!(r.stderr.contains("indexed the object and shared its index"), "{}", r.stderr);
    assert!(r.took < std::time::Duration::from_secs(20), "took {:?}", r.took);
    let keys = r.server.client().list("s3://train-data/lost/").expect("list");
    let lock = |url: &str| url.contains(".mbdidx.") && url.rsplit('.').next() == Some("lock");
    assert!(!keys.iter().any(|k| lock(&k.url)), "the lock was left: {keys:?}");
}

/// Found by a hostile probe: with the file system under `object_cache_dir` full, every read of a
/// chunk failed ("writing the range: No space left on device") on every run, the object
/// unreadable on that node until someone cleaned up. A range the cache cannot keep is now read
/// into memory and served, the disk's failure logged; the whole sweep is the file's.
#[test]
fn a_full_object_cache_disk_reads_ranges_into_memory_instead_of_failing() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let text = megabyte_libsvm();
    server.put(BUCKET, "full/data.txt", text.as_bytes());
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("objects");
    let disk = support::disk::SmallDisk::mount_sized(&cache, "256k");
    disk.fill();
    let list = serde_json::to_string(&["s3://train-data/full/data.txt"]).expect("json");
    let config = write(
        dir.path(),
        "c.toml",
        format!(
            "[daemon]\nobject_cache_dir = \"{}\"\nobject_cache_bytes = 1048576\n[datasets.d]\nformat = \"libsvm\"\n\
             files = {list}\nchunk_size_bytes = 65536\n[datasets.d.sampling]\nrandomize = false\n",
            cache.display()
        ),
    );
    let args = [
        "dump",
        "--config",
        config.to_str().expect("utf-8"),
        "--dataset",
        "d",
        "--minibatch-size",
        "4096",
        "--full-sweep",
    ];
    let out = minibatchd(&server, &args, &dir.path().join("state"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("cannot keep a range in the object cache"), "{stderr}");
    let mbs = support::parse_dump(&String::from_utf8_lossy(&out.stdout)).expect("dump output");
    let sequences: u64 =
        mbs.iter().filter_map(|m| m["streams"].as_object()?.values().next()?["num_sequences"].as_u64()).sum();
    assert_eq!(sequences, 120_000, "every line once");
}

/// A server whose response claims a body of 100 TB (a broken or hostile endpoint) for the shared
/// index: the download is streamed and counted against the most an index of the object can take,
/// so the node says so and indexes the object itself. Collecting the body reserved what the
/// header claimed, and the process aborted.
#[test]
fn a_shared_index_response_claiming_100_tb_is_refused_and_the_object_indexed_here() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let mut text = String::new();
    for i in 0..5_000 {
        let _ = writeln!(text, "{} {}:1", i % 2, i % 97 + 1);
    }
    server.put(BUCKET, "lying/part.txt", text.as_bytes());
    let dir = tempfile::tempdir().expect("tempdir");
    let config = libsvm_config(dir.path(), &["s3://train-data/lying/part.txt"]);
    let config = config.to_str().expect("utf-8");
    // The first node indexes the object and shares its index.
    let out = minibatchd(&server, &["index", "--config", config, "--dataset", "d"], &dir.path().join("node-1"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let proxy = FaultProxy::start(&server, &["--huge-length-for", ".mbdidx"]);
    let args = ["index", "--config", config, "--dataset", "d"];
    let out = minibatchd_through(&server, &proxy.endpoint, &args, &dir.path().join("node-2"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("larger than an index of this object can be"), "{stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("5000 sequences"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stats = proxy.stats().expect("stats");
    assert!(stats["lied"].as_u64().is_some_and(|n| n > 0), "no response lied: {stats}");
}

/// The same lie on a listing and on error answers (a broken or hostile endpoint): collecting
/// such a body reserved the 100 TB its header claimed and aborted the process. Responses other than
/// an object's data are now collected with at most a bounded reserve and refused past
/// [`minibatchd_remote`]'s cap, so the listing fails with an error and the process exits with it.
#[test]
fn a_listing_or_error_answer_claiming_100_tb_fails_without_aborting_the_process() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    server.put(BUCKET, "lying-list/a.txt", b"1 1:1\n0 2:1\n");
    let dir = tempfile::tempdir().expect("tempdir");
    for (lie, config) in [
        ("list-type", libsvm_config(dir.path(), &["s3://train-data/lying-list/"])),
        ("missing", libsvm_config(dir.path(), &["s3://train-data/lying-list/missing.txt"])),
    ] {
        let proxy = FaultProxy::start(&server, &["--huge-length-for", lie]);
        let config = config.to_str().expect("utf-8");
        let args = ["index", "--config", config, "--dataset", "d"];
        let out = minibatchd_through(&server, &proxy.endpoint, &args, &dir.path().join(lie));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.code().is_some(), "killed by a signal ({lie}): {:?}\n{stderr}", out.status);
        assert!(!out.status.success(), "{lie}: {stderr}");
        assert!(stderr.contains("lying-list"), "{lie}: {stderr}");
        let stats = proxy.stats().expect("stats");
        assert!(stats["lied"].as_u64().is_some_and(|n| n > 0), "no response lied ({lie}): {stats}");
    }
}

#[test]
fn the_index_caches_of_objects_that_rotate_out_of_a_dataset_are_removed() {
    use support::daemon::Daemon;
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    for day in ["day-1", "day-2"] {
        server.put(BUCKET, &format!("rotating/{day}.txt"), b"1 1:1 2:1\n0 3:1\n");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    support::daemon::write_config(
        dir.path(),
        "",
        &format!("[datasets.d]\nformat = \"libsvm\"\nfiles = [\"s3://{BUCKET}/rotating/\"]\n"),
    );
    let env: Vec<_> = server.env().into_iter().collect();
    let caches = || -> Vec<(String, std::path::PathBuf)> {
        let mut found: Vec<_> = std::fs::read_dir(dir.path().join("state/index"))
            .map(|rd| rd.flatten().map(|e| (e.file_name().to_string_lossy().into_owned(), e.path())).collect())
            .unwrap_or_default();
        found.sort();
        found
    };
    let mut daemon = Daemon::start(dir.path(), &env);
    daemon.stop();
    let names: Vec<String> = caches().into_iter().map(|(n, _)| n).collect();
    assert!(
        names.iter().any(|n| n.starts_with("day-1.txt.")) && names.iter().any(|n| n.starts_with("day-2.txt.")),
        "{names:?}"
    );
    // day-1 rotates out of the prefix, day-3 arrives; both older caches were last used two days
    // ago, past the grace.
    minibatchd_engine::remote::ObjectStore::delete(&server.client(), &format!("s3://{BUCKET}/rotating/day-1.txt"))
        .expect("delete");
    server.put(BUCKET, "rotating/day-3.txt", b"1 4:1\n");
    let long_ago = std::time::SystemTime::now() - 2 * minibatchd_engine::format::index_cache::OBJECT_CACHE_GRACE;
    for (_, path) in caches() {
        std::fs::File::options().write(true).open(&path).and_then(|f| f.set_modified(long_ago)).expect("set mtime");
    }
    let _daemon = Daemon::start(dir.path(), &env);
    let start = std::time::Instant::now();
    while caches().iter().any(|(n, _)| n.starts_with("day-1.txt.")) {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "the rotated object's cache stayed: {:?}",
            caches()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let names: Vec<String> = caches().into_iter().map(|(n, _)| n).collect();
    assert!(
        names.iter().any(|n| n.starts_with("day-2.txt.")) && names.iter().any(|n| n.starts_with("day-3.txt.")),
        "the cache of an object the dataset reads was removed: {names:?}"
    );
}

/// A further source of a joined dataset is read in its key order, a sequence at a time. Its
/// object was fetched whole into the object cache even when larger than the cache (written
/// past the bound, evicted, and fetched whole again for the next sequence); now a sequence's range
/// at a time straight from the store when the cache cannot hold it. This exercises that path: the
/// output is the local files' own, and nothing of the object is left in the cache (the transient
/// excess of the old path is not visible at the end).
#[test]
fn a_joined_source_larger_than_the_object_cache_is_read_by_range() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let dir = tempfile::tempdir().expect("tempdir");
    // 2,000 sequences; the labels' object (~1.3 MB, keys in reverse order) is larger than a 1 MiB
    // cache.
    let (mut f, mut l) = (String::new(), String::new());
    for k in 0..2_000u32 {
        let _ = writeln!(f, "{k} |f {}", k % 7);
    }
    for k in (0..2_000u32).rev() {
        let _ = writeln!(l, "{k} |l {}:1 |pad {}", k % 3, "x".repeat(640));
    }
    write(dir.path(), "f.ctf", &f);
    write(dir.path(), "l.ctf", &l);
    server.put(BUCKET, "joined/f.ctf", f.as_bytes());
    server.put(BUCKET, "joined/l.ctf", l.as_bytes());
    let config = |files: [&str; 2]| {
        format!(
            "[datasets.d]\nformat = \"ctf\"\n[datasets.d.sampling]\nrandomize = false\n\
             [[datasets.d.sources]]\nfiles = [\"{}\"]\n[datasets.d.sources.streams.f]\ndim = 1\nformat = \"dense\"\n\
             [[datasets.d.sources]]\nfiles = [\"{}\"]\n[datasets.d.sources.streams.l]\ndim = 3\nformat = \"sparse\"\n",
            files[0], files[1]
        )
    };
    let local = write(dir.path(), "local.toml", config(["f.ctf", "l.ctf"]));
    let remote = write(dir.path(), "s3.toml", config(["s3://train-data/joined/f.ctf", "s3://train-data/joined/l.ctf"]));
    let dump = |cfg: &Path, state: &str| {
        let mut c = std::process::Command::new(BIN);
        c.args([
            "dump",
            "--config",
            cfg.to_str().expect("utf-8"),
            "--dataset",
            "d",
            "--minibatch-size",
            "64",
            "--full-sweep",
        ])
        .env("MINIBATCHD_LOG", "warn")
        .env("MINIBATCHD__DAEMON__STATE_DIR", dir.path().join(state))
        .env("MINIBATCHD__DAEMON__OBJECT_CACHE_BYTES", (1u64 << 20).to_string());
        for (k, v) in server.env() {
            c.env(k, v);
        }
        let out = c.output().expect("dump");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    let expected = dump(&local, "local-state");
    assert_eq!(String::from_utf8_lossy(&expected).lines().count(), 2_000 / 64 + 1);
    assert_eq!(dump(&remote, "s3-state"), expected);
    let cached: u64 = walk_sizes(&dir.path().join("s3-state/objects"));
    assert!(cached < 64 << 10, "the object cache holds {cached} bytes: more than the features' object");
}

/// Total size of the regular files under `dir`.
fn walk_sizes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| match e.file_type() {
                Ok(t) if t.is_dir() => walk_sizes(&e.path()),
                Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
                _ => 0,
            })
            .sum()
    })
}

/// A reload that adds the first dataset in object storage sets object storage up with the running
/// daemon's `object_*` keys, which apply at a restart only: the new file's `object_cache_dir` was
/// used at once (a directory no lock protects), while the log said it waits for the restart.
#[test]
fn a_reload_adding_the_first_object_dataset_keeps_the_running_object_settings() {
    use support::daemon::{options, write_config, Daemon};
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    server.put(BUCKET, "later/part.txt", b"1 1:1 2:1\n0 3:1\n1 4:0.5\n");
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "local.txt", "1 1:1\n0 2:1\n");
    let local = "[datasets.local]\nformat = \"libsvm\"\nfiles = [\"local.txt\"]\n";
    write_config(dir.path(), "", local);
    let daemon = Daemon::start(dir.path(), &server.env().into_iter().collect::<Vec<_>>());
    let elsewhere = dir.path().join("elsewhere");
    write_config(
        dir.path(),
        &format!("object_cache_dir = \"{}\"", elsewhere.display()),
        &format!("{local}[datasets.d]\nformat = \"libsvm\"\nfiles = [\"s3://{BUCKET}/later/part.txt\"]\n"),
    );
    daemon.signal(rustix::process::Signal::HUP);
    daemon.wait_reloads(1);
    let state = dir.path().join("state");
    let mut opts = options(2);
    opts.full_sweep = true;
    let mut s = daemon.client().open("d", &opts).expect("open the object dataset");
    let mut position = 0;
    while let Some(mb) = s.next_owned().expect("next") {
        position = mb.position;
    }
    assert_eq!(position, 3, "the whole object, three lines");
    assert!(!elsewhere.exists(), "the reloaded file's object_cache_dir was used before a restart");
    assert!(state.join("objects").is_dir(), "the running daemon's cache directory holds the object");
}

/// Issue 39: a TFRecord dataset of Examples, plain and GZIP objects, dumped from `s3://` prints
/// exactly what the same files print locally (the reader streams the object once for its index;
/// the decoder reads chunks through the object cache).
#[test]
fn a_tfrecord_dataset_from_s3_dumps_as_the_local_one() {
    use minibatchd_engine::format::tfrecord::example::write::{example, Value};
    use minibatchd_engine::format::tfrecord::frame;
    use std::io::Write as _;
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let work = tempfile::tempdir().expect("tempdir");
    let records: Vec<u8> = (0..300u16)
        .flat_map(|i| {
            let x = [f32::from(i), -f32::from(i)];
            frame(&example(&[("x", Value::Floats(&x)), ("y", Value::Ints(&[i64::from(i % 7)]))]))
        })
        .collect();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&records).expect("gzip");
    let gz = gz.finish().expect("gzip");
    write(work.path(), "a.tfrecord", &records);
    write(work.path(), "b.tfrecord.gz", &gz);
    server.put(BUCKET, "tf/a.tfrecord", &records);
    server.put(BUCKET, "tf/b.tfrecord.gz", &gz);
    let streams = "chunk_size_bytes = 2000\n[datasets.d.streams.x]\nformat = \"dense\"\ndim = 2\n\
                   [datasets.d.streams.y]\ndtype = \"int64\"\nformat = \"dense\"\ndim = 1\n";
    let local = write(
        work.path(),
        "local.toml",
        format!("[datasets.d]\nformat = \"tfrecord\"\nfiles = [\"a.tfrecord\", \"b.tfrecord.gz\"]\n{streams}"),
    );
    let remote = write(
        work.path(),
        "s3.toml",
        format!(
            "[datasets.d]\nformat = \"tfrecord\"\nfiles = [\"s3://{BUCKET}/tf/a.tfrecord\", \"s3://{BUCKET}/tf/b.tfrecord.gz\"]\n{streams}"
        ),
    );
    let dump = |config: &Path, state: &str| {
        let args = ["dump", "--config", config.to_str().expect("utf-8"), "--dataset", "d", "--minibatch-size", "7"];
        let out =
            minibatchd(&server, &[&args[..], &["--max-sweeps", "2", "--seed", "3"]].concat(), &work.path().join(state));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    let from_local = dump(&local, "local.state");
    assert_eq!(String::from_utf8_lossy(&from_local).lines().count(), 600 * 2 / 7 + 1);
    assert!(from_local == dump(&remote, "s3.state"), "the dump from s3:// differs from the local one");
}

/// Issue 39: CSV (plain and gzip) and fixed-length record objects dumped from `s3://` print
/// exactly what the same files print locally.
#[test]
fn csv_and_fixed_length_datasets_from_s3_dump_as_the_local_ones() {
    use std::io::Write as _;
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let work = tempfile::tempdir().expect("tempdir");
    let csv: String =
        std::iter::once("a,b\n".to_owned()).chain((0..200).map(|i| format!("{i},\"{}.5\"\n", i * 3))).collect();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(csv.as_bytes()).expect("gzip");
    let gz = gz.finish().expect("gzip");
    let fixed: Vec<u8> = (0..150u16).flat_map(|i| [i.to_le_bytes(), (i * 7).to_be_bytes()].concat()).collect();
    for (name, bytes) in [("a.csv", csv.as_bytes()), ("b.csv.gz", &gz[..]), ("f.bin", &fixed[..])] {
        write(work.path(), name, bytes);
        server.put(BUCKET, &format!("tab/{name}"), bytes);
    }
    let formats = |prefix: &str| {
        format!(
            "[datasets.c]\nformat = \"csv\"\nfiles = [\"{prefix}a.csv\", \"{prefix}b.csv.gz\"]\ncolumns = 2\nskip_header_lines = 1\n\
             chunk_size_bytes = 500\n[datasets.c.streams.x]\ncolumns = [1, 0]\n\
             [datasets.f]\nformat = \"fixed_length\"\nfiles = [\"{prefix}f.bin\"]\nrecord_bytes = 4\nchunk_size_bytes = 100\n\
             [datasets.f.streams.i]\ndtype = \"uint16\"\n dim = 1\n[datasets.f.streams.j]\ndtype = \"uint16\"\noffset = 2\nlittle_endian = false\n"
        )
    };
    let local = write(work.path(), "local.toml", formats(""));
    let remote = write(work.path(), "s3.toml", formats(&format!("s3://{BUCKET}/tab/")));
    for dataset in ["c", "f"] {
        let dump = |config: &Path, state: &str| {
            let args =
                ["dump", "--config", config.to_str().expect("utf-8"), "--dataset", dataset, "--minibatch-size", "9"];
            let out = minibatchd(
                &server,
                &[&args[..], &["--max-sweeps", "2", "--seed", "5"]].concat(),
                &work.path().join(state),
            );
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            out.stdout
        };
        let from_local = dump(&local, "local.state");
        assert!(!from_local.is_empty());
        assert!(from_local == dump(&remote, "s3.state"), "{dataset}: the dump from s3:// differs from the local one");
    }
}

/// Issue 39: whole-file objects (`format = "whole_file"`) from `s3://` give each object's bytes
/// exactly, named by its URL — binary, empty and larger than a range request's block alike.
#[test]
fn whole_file_objects_from_s3_are_their_exact_bytes_named_by_url() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let work = tempfile::tempdir().expect("tempdir");
    let objects: Vec<(String, Vec<u8>)> = vec![
        ("img/a.jpg".into(), vec![0xff, 0xd8, 0xff, 0xe0, 0x00]),
        ("img/b.jpg".into(), Vec::new()),
        ("img/c.jpg".into(), (0..3_000_000u32).map(|k| (k.wrapping_mul(2_654_435_761) >> 24) as u8).collect()),
        ("img/d.jpg".into(), b"plain text".to_vec()),
    ];
    for (key, bytes) in &objects {
        server.put(BUCKET, key, bytes);
    }
    let config = write(
        work.path(),
        "s3.toml",
        format!("[datasets.w]\nformat = \"whole_file\"\nfiles = [\"s3://{BUCKET}/img/\"]\n"),
    );
    let args = ["dump", "--config", config.to_str().expect("utf-8"), "--dataset", "w", "--minibatch-size", "3"];
    let out =
        minibatchd(&server, &[&args[..], &["--full-sweep", "--randomize", "false"]].concat(), &work.path().join("st"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mbs = support::parse_dump(&String::from_utf8_lossy(&out.stdout)).expect("dump");
    let mut got = Vec::new();
    for m in &mbs {
        let paths = m["streams"]["path"]["sequences"].as_array().expect("paths");
        let contents = m["streams"]["contents"]["sequences"].as_array().expect("contents");
        for (p, c) in paths.iter().zip(contents) {
            got.push((String::from_utf8(support::dump_bytes(&p[0])).expect("url"), support::dump_bytes(&c[0])));
        }
    }
    let want: Vec<(String, Vec<u8>)> = objects.iter().map(|(k, b)| (format!("s3://{BUCKET}/{k}"), b.clone())).collect();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert!(g == w, "{}: {} bytes, want {} bytes of {}", g.0, g.1.len(), w.1.len(), w.0);
    }
}

/// Found by a probe: keys with `%`, `#`, `?`, `~` or any non-ASCII character were asked for
/// percent-encoded twice ("no such object"). Listed under a prefix or named alone, they are read.
#[test]
fn keys_with_characters_a_url_encodes_are_read_as_named() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let keys = ["odd/uni-\u{fc}.svm", "odd/hash#x.svm", "odd/pct%41.svm", "odd/tilde~q.svm"];
    // Uploaded by plain HTTP, the key encoded once as any S3 client does (not through the
    // daemon's own client, which would agree with itself whatever it sent).
    let encoded = |key: &str| -> String {
        key.bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'/' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect()
    };
    for (label, key) in keys.iter().enumerate() {
        let path = format!("/{BUCKET}/{}", encoded(key));
        assert_eq!(server.request("PUT", &path, format!("{label} 1:1\n").as_bytes()), Some(200), "{path}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let labels = |files: &[&str]| -> Vec<f64> {
        let config = libsvm_config(dir.path(), files);
        let c = config.to_str().expect("utf-8");
        let out = minibatchd(
            &server,
            &[
                "dump",
                "--config",
                c,
                "--dataset",
                "d",
                "--minibatch-size",
                "10",
                "--full-sweep",
                "--randomize",
                "false",
            ],
            &state,
        );
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let line: serde_json::Value =
            serde_json::from_slice(String::from_utf8_lossy(&out.stdout).lines().next().expect("a line").as_bytes())
                .expect("json");
        let values = line["streams"]["__instY"]["sequences"].as_array().expect("labels").clone();
        values.iter().map(|s| s[0][0].as_f64().expect("a label")).collect()
    };
    // Listed by key bytes: `#` < `%` < `t` < `u`.
    assert_eq!(labels(&[&format!("s3://{BUCKET}/odd/")]), vec![1.0, 2.0, 3.0, 0.0]);
    assert_eq!(labels(&[&format!("s3://{BUCKET}/odd/uni-\u{fc}.svm")]), vec![0.0]);
}
