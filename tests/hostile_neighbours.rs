//! Hostile neighbours on the control socket (issue 15, items 4 and 5), against the real daemon:
//! idle connections are closed after the handshake timeout; connections beyond the per-uid limit
//! are refused while others keep working; sessions are limited per uid; generated session names
//! are unguessable; a session belongs to the uid that opened it; `unknown_dataset` does not list
//! the configured datasets; a stop whose checkpoint fails does not exit 0; a second daemon cannot
//! take the state directory; a repaired chunk is read again after a reload; a session resumed by
//! name after a crash says that minibatches come again, even one opened just before the crash;
//! the daemon's threads do not grow with its sessions, and the daemon-wide connection and
//! session limits hold.

mod support;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use minibatchd_client::protocol::ErrorCode;
use minibatchd_client::ClientError;
use support::daemon::{options, train_ctf, Daemon, DEADLINE, TRAIN_STREAMS_TOML};
use support::write;

fn start(dir: &Path, limits: &str) -> Daemon {
    let data = write(dir, "data.ctf", train_ctf());
    let cfg = format!(
        r#"[daemon]
socket = "{dir}/mbd.sock"
metrics_listen = "127.0.0.1:0"
state_dir = "{dir}/state"
ring_slots = 3
slot_size_bytes = 65536
session_linger_secs = 60
{limits}

[datasets.train]
format = "ctf"
files = ["{data}"]
{streams}"#,
        dir = dir.display(),
        data = data.display(),
        streams = TRAIN_STREAMS_TOML,
    );
    write(dir, "minibatchd.toml", &cfg);
    Daemon::start(dir, &[])
}

fn frame(body: &str) -> Vec<u8> {
    let mut v = u32::try_from(body.len()).expect("small").to_le_bytes().to_vec();
    v.extend_from_slice(body.as_bytes());
    v
}

/// The next JSON reply, or `None` once the daemon has closed the connection.
fn reply(s: &mut UnixStream) -> Option<serde_json::Value> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut body = vec![0u8; usize::try_from(u32::from_le_bytes(len)).expect("usize")];
    s.read_exact(&mut body).ok()?;
    serde_json::from_slice(&body).ok()
}

fn hello(socket: &Path) -> UnixStream {
    let mut s = UnixStream::connect(socket).expect("connect");
    s.set_read_timeout(Some(DEADLINE)).expect("timeout");
    s.write_all(&frame(r#"{"type":"hello","version":1}"#)).expect("hello");
    let r = reply(&mut s).expect("a reply");
    assert_eq!(r["type"], "hello", "{r}");
    s
}

fn closed(s: &mut UnixStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0))
}

#[test]
fn idle_connections_are_closed_after_the_handshake_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(dir.path(), "handshake_timeout_secs = 1");
    let started = Instant::now();
    // Silent from the start, and silent after hello: both are closed.
    let mut silent = UnixStream::connect(&d.socket).expect("connect");
    silent.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let mut greeted = hello(&d.socket);
    for s in [&mut silent, &mut greeted] {
        let r = reply(s).expect("an error before the close");
        assert_eq!(r["code"], "resource_exhausted", "{r}");
        assert!(r["message"].as_str().is_some_and(|m| m.contains("handshake_timeout_secs")), "{r}");
        assert!(closed(s), "the daemon closes the connection");
    }
    assert!(started.elapsed() < Duration::from_secs(30), "closed at the timeout, not at the test deadline");
    // A client that opens a session in time keeps it past the timeout.
    let mut session = d.client().open("train", &options(8)).expect("open");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(session.next_minibatch().expect("still served").is_some());
}

#[test]
fn connections_beyond_the_per_uid_limit_are_refused_and_the_others_keep_working() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(dir.path(), "max_connections_per_uid = 3\nmax_connections = 100");
    let held: Vec<UnixStream> = (0..3).map(|_| hello(&d.socket)).collect();
    let mut extra = UnixStream::connect(&d.socket).expect("connect");
    extra.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let r = reply(&mut extra).expect("refused with a reason");
    assert_eq!(r["code"], "resource_exhausted", "{r}");
    assert!(r["message"].as_str().is_some_and(|m| m.contains("max_connections_per_uid = 3")), "{r}");
    assert!(closed(&mut extra));
    drop(held);
    // The slots are given back as the connections close.
    let start = Instant::now();
    loop {
        match d.client().open("train", &options(8)) {
            Ok(mut s) => {
                assert!(s.next_minibatch().expect("served").is_some());
                break;
            }
            Err(e) => assert!(start.elapsed() < DEADLINE, "never accepted again: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sessions_beyond_the_per_uid_limit_are_refused_with_the_key_to_raise() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(dir.path(), "max_sessions_per_uid = 2");
    let _a = d.client().open("train", &options(8)).expect("first");
    let _b = d.client().open("train", &options(8)).expect("second");
    match d.client().open("train", &options(8)) {
        Err(ClientError::Daemon { code: ErrorCode::ResourceExhausted, message, .. }) => {
            assert!(message.contains("max_sessions_per_uid = 2"), "{message}");
        }
        other => panic!("expected resource_exhausted, got {other:?}"),
    }
}

/// The daemon's lasting threads now (`/proc/PID/task`), by name: not the short-lived ones that
/// build a session's next sweep order (`mbd-sweep`, one per session and sweep, done in
/// milliseconds here), which a loaded machine can catch alive.
fn threads(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("/proc task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.starts_with("mbd-sweep"))
        .collect();
    names.sort();
    names
}

#[test]
fn threads_do_not_grow_with_the_session_count_and_the_daemon_wide_limits_hold() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(
        dir.path(),
        "parser_threads = 1\nproducer_threads = 2\nmax_sessions = 40\nmax_sessions_per_uid = 100\n\
         max_connections = 45\nmax_connections_per_uid = 100",
    );
    let mut first = d.client().open("train", &options(8)).expect("open");
    assert!(first.next_owned().expect("served").is_some());
    let before = threads(d.pid());
    // 39 more sessions, every one served (before, each one started two threads of its own).
    let mut sessions: Vec<_> = (1..40).map(|_| d.client().open("train", &options(8)).expect("open")).collect();
    for s in &mut sessions {
        assert!(s.next_owned().expect("served").is_some());
    }
    let after = threads(d.pid());
    // tokio's blocking pool grows with the blocking work in flight at once (opens being prepared,
    // checkpoints written), not with the sessions, and no further than its bound (the object
    // fetches, 8 by default, and 8 opens): counted apart, since a loaded machine catches more of
    // its threads alive.
    let (pool, own): (Vec<String>, Vec<String>) = after.iter().cloned().partition(|n| n == "tokio-rt-worker");
    let own_before = before.iter().filter(|n| *n != "tokio-rt-worker").count();
    assert!(own.len() <= own_before + 2, "{before:?} with one session, {after:?} with 40");
    assert!(pool.len() <= 8 + minibatchd::pipeline::OPENS_PREPARED, "{after:?}");
    // The 41st session is refused by the daemon-wide limit, naming the key.
    match d.client().open("train", &options(8)) {
        Err(ClientError::Daemon { code: ErrorCode::ResourceExhausted, message, .. }) => {
            assert!(message.contains("max_sessions = 40"), "{message}");
        }
        other => panic!("expected resource_exhausted, got {other:?}"),
    }
    assert!(d.metric("minibatchd_sessions_refused_total{") >= 1.0);
    // 40 connections hold sessions; 5 more fit, the 46th is refused daemon-wide.
    let held: Vec<UnixStream> = (0..5).map(|_| hello(&d.socket)).collect();
    let mut extra = UnixStream::connect(&d.socket).expect("connect");
    extra.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let r = reply(&mut extra).expect("refused with a reason");
    assert_eq!(r["code"], "resource_exhausted", "{r}");
    assert!(r["message"].as_str().is_some_and(|m| m.contains("max_connections = 45")), "{r}");
    assert!(closed(&mut extra));
    assert!(d.metric("minibatchd_connections_refused_total{") >= 1.0);
    drop(held);
    // Every session goes on being served by the two producer threads.
    for s in sessions.iter_mut().chain(std::iter::once(&mut first)) {
        for _ in 0..5 {
            assert!(s.next_owned().expect("served").is_some());
        }
    }
}

#[test]
fn generated_session_names_are_unguessable_and_unknown_dataset_lists_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(dir.path(), "");
    let mut s = hello(&d.socket);
    s.write_all(&frame(r#"{"type":"open","dataset":"train","options":{"minibatch_size":8}}"#)).expect("open");
    let first = reply(&mut s).expect("opened");
    let mut t = hello(&d.socket);
    t.write_all(&frame(r#"{"type":"open","dataset":"train","options":{"minibatch_size":8}}"#)).expect("open");
    let second = reply(&mut t).expect("opened");
    let names: Vec<&str> = [&first, &second].iter().map(|r| r["session"].as_str().expect("a name")).collect();
    for n in &names {
        let random = n.strip_prefix("train-").expect("dataset prefix");
        assert_eq!(random.len(), 16, "{n}: 64 random bits");
        assert!(random.chars().all(|c| c.is_ascii_hexdigit()), "{n}");
    }
    assert_ne!(names[0], names[1]);
    let common = names[0].chars().zip(names[1].chars()).take_while(|(a, b)| a == b).count();
    assert!(common < "train-".len() + 6, "names share a long prefix: {names:?}");
    match d.client().open("nope", &options(8)) {
        Err(ClientError::Daemon { code: ErrorCode::UnknownDataset, message, .. }) => {
            assert!(!message.contains("train"), "the reply lists the configured datasets: {message}");
        }
        other => panic!("expected unknown_dataset, got {other:?}"),
    }
}

/// Runs a raw-protocol client as uid 65534 (`nobody`): hello, then `open` of dataset `train` as
/// session `name`; returns the reply to `open`.
fn open_as_nobody(socket: &Path, name: &str) -> serde_json::Value {
    let script = r#"
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
def send(m):
    b = json.dumps(m).encode(); s.sendall(struct.pack('<I', len(b)) + b)
def recv():
    n = struct.unpack('<I', s.recv(4, socket.MSG_WAITALL))[0]
    return json.loads(s.recv(n, socket.MSG_WAITALL))
send({"type": "hello", "version": 1}); recv()
send({"type": "open", "dataset": "train", "options": {"minibatch_size": 8, "session": sys.argv[2]}})
print(json.dumps(recv()))
"#;
    let out = std::os::unix::process::CommandExt::uid(Command::new("python3").args(["-c", script]), 65534)
        .arg(socket)
        .arg(name)
        .output()
        .expect("python3 as nobody");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("a JSON reply")
}

#[test]
fn a_session_belongs_to_the_uid_that_opened_it() {
    // Another uid needs privilege to become: the test runs as root (CI and the project's VM do).
    assert_eq!(rustix::process::geteuid().as_raw(), 0, "this test switches uid: run the suite as root");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let d = start(dir.path(), "");
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).expect("chmod socket");
    // Root opens "job", takes a minibatch, and its connection dies: the session lingers.
    {
        let mut opts = options(8);
        opts.session = Some("job".into());
        let mut s = d.client().open("train", &opts).expect("open");
        let mb = s.next_minibatch().expect("next").expect("a minibatch");
        s.release(mb);
        s.state().expect("state");
    }
    // nobody can neither resume it nor squat its name (while the daemon has not yet seen the
    // connection close, the name is busy for everyone; then it belongs to root).
    let start = Instant::now();
    loop {
        let r = open_as_nobody(&d.socket, "job");
        assert_eq!(r["code"], "session_busy", "{r}");
        if r["message"].as_str().is_some_and(|m| m.contains("belongs to another user")) {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "{r}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Its owner resumes it where it was.
    let mut opts = options(8);
    opts.session = Some("job".into());
    let s = d.client().open("train", &opts).expect("the owner resumes");
    drop(s);
    // nobody's own sessions work.
    let r = open_as_nobody(&d.socket, "nobodys");
    assert_eq!(r["type"], "opened", "{r}");
}

/// Found by a probe: sixteen costly opens of one client (equal steps over many sweeps and two
/// workers) took every thread that prepares opens, and every other user's plain `open` waited
/// for them. A user's opens are prepared at most `OPENS_PREPARED_PER_UID` at once: another
/// user's open is answered before any of the costly ones.
#[test]
fn one_users_costly_opens_do_not_hold_up_another_users_open() {
    assert_eq!(rustix::process::geteuid().as_raw(), 0, "this test switches uid: run the suite as root");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let d = start(dir.path(), "max_sessions_per_uid = 64");
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).expect("chmod socket");
    let costly = minibatchd_client::protocol::SessionOptions {
        equal_steps: true,
        max_sweeps: Some(10_000),
        num_workers: Some(2),
        rank: Some(1),
        ..options(1)
    };
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // More than the blocking pool's threads (`OPENS_PREPARED` + `object_fetches`, 16).
    let opens: Vec<_> = (0..17)
        .map(|_| {
            let (client, costly, done) = (d.client(), costly.clone(), done.clone());
            std::thread::spawn(move || {
                let opened = client.open("train", &costly);
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                opened.map(drop)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let r = open_as_nobody(&d.socket, "plain");
    let finished = done.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(r["type"], "opened", "{r}");
    assert_eq!(finished, 0, "another user's open waited for {finished} of the costly opens");
    for open in opens {
        open.join().expect("thread").expect("the costly opens are served in turn");
    }
}

#[test]
fn a_failed_shutdown_checkpoint_is_not_a_clean_exit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut d = start(dir.path(), "");
    let mut opts = options(8);
    opts.session = Some("job".into());
    let _s = d.client().open("train", &opts).expect("open");
    // The checkpoint's place is taken by a non-empty directory: the rename onto it fails.
    let ckpt = dir.path().join("state/checkpoint.json");
    let _ = std::fs::remove_file(&ckpt);
    std::fs::create_dir_all(ckpt.join("occupied")).expect("mkdir");
    let status = d.stop();
    assert_eq!(status.code(), Some(1), "the stop could not save the sessions' positions: {status:?}");
}

#[test]
fn a_second_daemon_on_the_same_state_dir_is_refused_and_the_first_keeps_its_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut first = start(dir.path(), "");
    let mut opts = options(8);
    opts.session = Some("job".into());
    let _s = first.client().open("train", &opts).expect("open");
    // Same state_dir, its own socket and port.
    let other = dir.path().join("other.toml");
    let text = std::fs::read_to_string(first.config()).expect("config").replace("mbd.sock", "other.sock");
    std::fs::write(&other, text).expect("write");
    let out = Command::new(support::BIN)
        .args(["run", "--config"])
        .arg(&other)
        .env_remove("NOTIFY_SOCKET")
        .output()
        .expect("second daemon");
    assert_eq!(out.status.code(), Some(1), "the second daemon must not run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("uses state_dir"), "{stderr}");
    assert!(first.running(), "the first daemon goes on");
    assert_eq!(first.stop().code(), Some(0));
    let ckpt = std::fs::read_to_string(dir.path().join("state/checkpoint.json")).expect("checkpoint");
    assert!(ckpt.contains("\"job\""), "the first daemon's sessions are in the checkpoint: {ckpt}");
}

#[test]
fn a_chunk_that_failed_is_read_again_after_a_reload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(dir.path(), "");
    let data = dir.path().join("data.ctf");
    let aside = dir.path().join("data.ctf.aside");
    std::fs::rename(&data, &aside).expect("move the data away");
    match d.client().open("train", &options(8)).and_then(|mut s| s.next_minibatch()) {
        Err(ClientError::Daemon { code: ErrorCode::DataError, .. }) => {}
        other => panic!("expected a data error while the file is gone, got {other:?}"),
    }
    std::fs::rename(&aside, &data).expect("restore the data");
    d.signal(rustix::process::Signal::HUP);
    let start = Instant::now();
    loop {
        match d.client().open("train", &options(8)).and_then(|mut s| s.next_minibatch()) {
            Ok(Some(_)) => break,
            other => assert!(start.elapsed() < DEADLINE, "the repaired chunk is never read again: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn take(s: &mut minibatchd_client::Session, n: usize) {
    for _ in 0..n {
        let mb = s.next_minibatch().expect("next").expect("a minibatch");
        s.release(mb);
    }
    s.state().expect("report what was taken");
}

#[test]
fn a_session_resumed_by_name_after_a_crash_says_minibatches_come_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut d = start(dir.path(), "checkpoint_interval_secs = 1");
    let mut opts = options(8);
    opts.session = Some("job".into());
    let mut s = d.client().open("train", &opts).expect("open");
    take(&mut s, 3);
    std::thread::sleep(Duration::from_millis(2500)); // a periodic checkpoint holds 3 minibatches
    take(&mut s, 5);
    let taken = s.state().expect("state");
    d.signal(rustix::process::Signal::KILL);
    let _ = d.wait();
    drop(s);
    let mut d = Daemon::start(dir.path(), &[]);
    let mut resumed = d.client().open("train", &opts).expect("resume by name");
    let r = resumed.resumed.clone().expect("a resumed session says so");
    assert_eq!((r.from.as_str(), r.exact), ("checkpoint", false), "{r:?}");
    assert!(r.checkpoint_unix_secs.is_some());
    let start_state = resumed.state().expect("state");
    assert!(start_state.minibatches >= 3 && start_state.minibatches <= taken.minibatches, "{start_state:?}");
    drop(resumed);
    // A session that closed after saying what it took, then a clean stop: exact, and says so.
    let mut clean = opts.clone();
    clean.session = Some("clean-job".into());
    let mut c = d.client().open("train", &clean).expect("open");
    take(&mut c, 2);
    c.close().expect("close");
    assert_eq!(d.stop().code(), Some(0));
    let d = Daemon::start(dir.path(), &[]);
    let again = d.client().open("train", &clean).expect("resume by name");
    let r = again.resumed.clone().expect("resumed");
    assert_eq!((r.from.as_str(), r.exact), ("checkpoint", true), "{r:?}");
    // The crashed one stays inexact: its trainer took up to minibatch 8 before the crash, past
    // anything the daemon has heard of since.
    let job = d.client().open("train", &opts).expect("resume by name");
    let r = job.resumed.clone().expect("resumed");
    assert_eq!((r.from.as_str(), r.exact), ("checkpoint", false), "{r:?}");
}

#[test]
fn a_session_opened_just_before_a_crash_is_resumed_by_name_and_its_replay_signalled() {
    let dir = tempfile::tempdir().expect("tempdir");
    // No periodic checkpoint comes before the crash: only the one written at open.
    let mut d = start(dir.path(), "checkpoint_interval_secs = 3600");
    let mut opts = options(8);
    opts.session = Some("fresh-job".into());
    let mut s = d.client().open("train", &opts).expect("open");
    take(&mut s, 4);
    d.signal(rustix::process::Signal::KILL);
    let _ = d.wait();
    drop(s);
    let d = Daemon::start(dir.path(), &[]);
    let mut resumed = d.client().open("train", &opts).expect("resume by name");
    // Before, the name was unknown and the session started again from minibatch 0 silently.
    let r = resumed.resumed.clone().expect("the replay of the 4 minibatches taken is signalled");
    assert_eq!((r.from.as_str(), r.exact), ("checkpoint", false), "{r:?}");
    assert_eq!(resumed.state().expect("state").minibatches, 0, "back to the position it was opened at");
}

/// An `open` whose sampler would walk without end (a job whose workers stand 2^64 samples apart;
/// equal steps over an epoch of 2^62 samples, or for 2^20 workers over 100 sweeps) is refused at
/// once with what to change, before its session name is taken; it hung the daemon's event loop,
/// every other client with it, until memory ran out. Meanwhile, and after, another session is
/// served.
#[test]
fn an_open_that_asks_for_an_endless_walk_is_refused_and_the_others_are_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(dir.path(), "");
    let mut other = d.client().open("train", &options(2)).expect("open");
    assert!(other.next_minibatch().expect("served").is_some());
    let state = other.state().expect("state");
    let refused = |o: &minibatchd_client::protocol::SessionOptions, expect: &str| {
        let started = Instant::now();
        match d.client().open("train", o) {
            Err(ClientError::Daemon { code: ErrorCode::InvalidOptions, message, .. }) => {
                assert!(message.contains(expect), "{message}");
            }
            Err(e) => panic!("expected invalid_options, got {e}"),
            Ok(_) => panic!("expected invalid_options, the session opened"),
        }
        assert!(started.elapsed() < Duration::from_secs(30), "refused at once, not after the walk");
    };
    let far = minibatchd_client::protocol::SessionState { position: u64::MAX, ..state.clone() };
    let job = minibatchd_client::protocol::SessionOptions { resume_job: Some(vec![state.clone(), far]), ..options(2) };
    refused(&job, "sequences to walk");
    let long = minibatchd_client::protocol::SessionOptions {
        equal_steps: true,
        max_samples: Some(1 << 62),
        session: Some("named".into()),
        ..options(1)
    };
    refused(&long, "use a shorter epoch");
    // Refused before the name was taken: the advice is followed under the same name at once.
    let short = minibatchd_client::protocol::SessionOptions { max_samples: None, full_sweep: true, ..long.clone() };
    let mut named = d.client().open("train", &short).expect("the same name with a shorter epoch");
    assert!(named.next_minibatch().expect("served").is_some());
    // 2^20 workers over 100 sweeps of 150 sequences: 1.7e10 sequences to walk.
    let wide = minibatchd_client::protocol::SessionOptions {
        equal_steps: true,
        max_sweeps: Some(100),
        num_workers: Some(1 << 20),
        rank: Some(7),
        ..options(1)
    };
    refused(&wide, "fewer workers");
    assert!(other.next_minibatch().expect("still served").is_some());
}

/// A client that sends and never reads (here: empty frames, each answered with `bad_message`)
/// fills its socket with replies; the daemon then stops waiting on it within its send timeout
/// (30 s) and closes the connection, instead of holding it, its descriptor and the daemon's stop
/// for ever. Meanwhile the other clients are served.
#[test]
fn a_client_that_never_reads_is_disconnected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(dir.path(), "handshake_timeout_secs = 2");
    let mut flood = UnixStream::connect(&d.socket).expect("connect");
    flood.set_write_timeout(Some(Duration::from_millis(200))).expect("timeout");
    let started = Instant::now();
    let empty = [0u8; 4 * 1024];
    let closed = loop {
        match flood.write(&empty) {
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break started.elapsed(),
        }
        assert!(started.elapsed() < Duration::from_secs(120), "the connection was never closed");
    };
    assert!(closed < Duration::from_secs(60), "closed after {closed:?}");
    let mut s = d.client().open("train", &options(8)).expect("open");
    assert!(s.next_minibatch().expect("served").is_some());
}

/// Found by a hostile probe: `max_errors` was one budget per dataset in the daemon, spent by every
/// session together — with `max_errors = 1` and a bad line in each rank's chunks, the second rank
/// failed at its first minibatch, where `dump` of each rank delivers its whole sweep; and once
/// spent, the chunk failed every later session until a restart. Each session now charges its own
/// budget, as `dump` of its options (or one CNTK process) does: each rank equals its dump, again
/// and again, and a session whose own budget runs out fails where its dump fails.
#[test]
fn each_session_has_its_own_error_budget_as_dump_does() {
    use minibatchd_client::protocol::SessionOptions;
    use std::fmt::Write as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    let mut text = String::new();
    for i in 1..=200u32 {
        let value = if i == 10 || i == 190 { "bad".to_owned() } else { "1".to_owned() };
        let _ = writeln!(text, "1 {i}:{value}");
    }
    let data = write(p, "two.svm", text);
    support::daemon::write_config(
        p,
        "ring_slots = 2\nslot_size_bytes = 65536\n",
        &format!(
            "[datasets.two]\nformat = \"libsvm\"\nfiles = [\"{}\"]\nmax_errors = 1\nchunk_size_bytes = 100\n\
             [datasets.strict]\nformat = \"libsvm\"\nfiles = [\"{}\"]\nmax_errors = 0\nchunk_size_bytes = 100\n",
            data.display(),
            data.display()
        ),
    );
    let d = Daemon::start(p, &[]);
    for round in 0..2 {
        for rank in 0..2u64 {
            let opts = SessionOptions {
                full_sweep: true,
                seed: Some(1),
                num_workers: Some(2),
                rank: Some(rank),
                ..options(8)
            };
            let r = rank.to_string();
            let want = d
                .dump("two", &["--minibatch-size", "8", "--full-sweep", "--seed", "1", "--workers", "2", "--rank", &r]);
            assert!(!want.is_empty());
            assert_eq!(d.read_all("two", &opts, &["__instX", "__instY"]), want, "round {round}, rank {rank}");
        }
    }
    // With no error allowed, a session fails at the minibatch its dump fails at, whatever the
    // sessions before it found.
    let out = Command::new(support::BIN)
        .args(["dump", "--config"])
        .arg(p.join("minibatchd.toml"))
        .args(["--dataset", "strict", "--minibatch-size", "8", "--full-sweep", "--seed", "1"])
        .output()
        .expect("dump");
    assert!(!out.status.success(), "the strict dump fails");
    let dumped = String::from_utf8_lossy(&out.stdout).lines().count();
    for _ in 0..2 {
        let opts = SessionOptions { full_sweep: true, seed: Some(1), ..options(8) };
        let mut s = d.client().open("strict", &opts).expect("open");
        let mut got = 0;
        let failure = loop {
            match s.next_minibatch() {
                Ok(Some(_)) => got += 1,
                Ok(None) => panic!("the strict session ended without its error"),
                Err(ClientError::Daemon { code, message, .. }) => break (code, message),
                Err(e) => panic!("{e}"),
            }
        };
        assert_eq!(failure.0, ErrorCode::DataError, "{failure:?}");
        assert!(failure.1.contains("two.svm"), "{failure:?}");
        assert_eq!(got, dumped, "fails where its dump fails");
    }
}
