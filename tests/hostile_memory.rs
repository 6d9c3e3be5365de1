//! Issue #15, item 3 and acceptance 2: memory is bounded by the configuration for every input,
//! indexing and decompression included, and the socket opens before the datasets are indexed.
//! The real binary runs on hostile inputs; its peak resident memory (`VmHWM`, read from
//! `/proc` while it runs) must stay within `memory_limit_bytes` plus
//! `support::daemon::DAEMON_OVERHEAD_BYTES`.
//! Each test is named after the finding and failed on the code before the fix (2 GB of RSS
//! for 200 MB of short lines with a 64 MiB limit; the socket opened only after indexing).

mod support;

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::time::Instant;

use minibatchd_client::protocol::ErrorCode;
use minibatchd_client::protocol::SessionOptions;
use minibatchd_client::{Client, ClientError};
use support::daemon::{options, Daemon, DEADLINE};
use support::write;

const LIMIT: u64 = 64 << 20;

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(bytes).expect("compress");
    e.finish().expect("finish")
}

/// [`support::daemon::assert_within_limit`], printed for `case`.
fn assert_within_limit(d: &Daemon, limit: u64, case: &str) {
    let peak = support::daemon::assert_within_limit(d, limit, case);
    eprintln!("peak RSS with a {} MiB limit {case}: {} MiB", limit >> 20, peak >> 20);
}

fn dataset(name: &str, format: &str, file: &Path, dense: bool) -> String {
    let mut t =
        format!("[datasets.{name}]\nformat = \"{format}\"\nfiles = [\"{}\"]\ncache_index = false\n", file.display());
    if dense {
        let _ = write!(t, "[datasets.{name}.streams.a]\ndim = 1\nformat = \"dense\"\n");
    }
    t
}

fn config(dir: &Path, limit: u64, datasets: &str) {
    support::daemon::write_config(
        dir,
        &format!(
            "memory_limit_bytes = {limit}\nhost_memory_reserve_bytes = 0\nparser_threads = 1\nring_slots = 4\n\
             slot_size_bytes = 1048576"
        ),
        datasets,
    );
}

/// `lines` samples of 256 values (`|a I 1 1 …`, 0.5 KB of text, 1 KB parsed each) in
/// `dir/wide.ctf`.
fn wide_file(dir: &Path, lines: u32) -> std::path::PathBuf {
    let mut text = String::new();
    for i in 0..lines {
        let _ = writeln!(text, "|a {i} {}", "1 ".repeat(255));
    }
    write(dir, "wide.ctf", text)
}

/// A dataset per name on `file` ([`wide_file`]), in 1 MiB chunks, its index not cached.
fn wide_datasets(file: &Path, names: &[&str]) -> String {
    let mut datasets = String::new();
    for name in names {
        let _ = write!(
            datasets,
            "[datasets.{name}]\nformat = \"ctf\"\nfiles = [\"{}\"]\ncache_index = false\nchunk_size_bytes = 1048576\n\
             [datasets.{name}.streams.a]\ndim = 256\nformat = \"dense\"\n",
            file.display()
        );
    }
    datasets
}

/// The refusal an `open` of `dataset` gets.
fn refusal(d: &Daemon, dataset: &str) -> (ErrorCode, String) {
    match Client::connect(&d.socket).expect("connect").open(dataset, &options(4)) {
        Err(ClientError::Daemon { code, message, .. }) => (code, message),
        Ok(_) => panic!("{dataset} opened"),
        Err(e) => panic!("{dataset}: {e}"),
    }
}

/// #15 item 3: a 3 MB gzip bomb took 22 GB of RSS, and 200 MB of short libsvm lines 1.47 GB
/// (peak 2.1 GB) with `memory_limit_bytes` at 64 MiB; one endless line was held whole.
#[test]
fn memory_limit_bytes_bounds_the_daemon_on_hostile_inputs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    // 15 million instances of 6 bytes: 90 MB, indexed by its three chunks (the index of one
    // sequence a line was about 19 MB, over the quarter of the limit the indexes may hold, 16
    // MiB); a session's sweep orders over them (16 bytes a sequence of the window) do not fit.
    let short = write(p, "short.txt", "1 1:1\n".repeat(15_000_000));
    // A bomb: 60 MB of instances in about 100 KB of gzip.
    let bomb = write(p, "bomb.txt.gz", gz("0 7:1\n".repeat(10_000_000).as_bytes()));
    // One line of 24 MB without an end.
    let long = write(p, "long.ctf", format!("|a {}", "1 ".repeat(12_000_000)));
    let good = write(
        p,
        "good.ctf",
        (0..50).fold(String::new(), |mut t, i| {
            let _ = writeln!(t, "|a {i}");
            t
        }),
    );
    // Two symbolic link loops (they hung the daemon, its memory growing ~4.5 MB/s).
    let looping = p.join("looping");
    std::fs::create_dir_all(looping.join("sub")).expect("mkdir");
    write(&looping, "part.ctf", "|a 1\n");
    std::os::unix::fs::symlink(".", looping.join("a")).expect("symlink");
    std::os::unix::fs::symlink("..", looping.join("sub/b")).expect("symlink");
    let datasets = dataset("short", "libsvm", &short, false)
        + &dataset("bomb", "libsvm", &bomb, false)
        + &dataset("long", "ctf", &long, true)
        + &dataset("looping", "ctf", &looping, true)
        + &dataset("good", "ctf", &good, true);
    config(p, LIMIT, &datasets);
    let d = Daemon::start(p, &[]);
    let (code, message) = refusal(&d, "short");
    assert_eq!(code, ErrorCode::ResourceExhausted, "{message}");
    assert!(message.contains("sweep orders") && message.contains("raise memory_limit_bytes"), "{message}");
    let (code, message) = refusal(&d, "bomb");
    assert_eq!(code, ErrorCode::UnknownDataset, "{message}");
    assert!(message.contains("bomb.txt.gz") && message.contains("max_inflate_ratio"), "{message}");
    let (code, message) = refusal(&d, "long");
    assert_eq!(code, ErrorCode::UnknownDataset, "{message}");
    assert!(message.contains("long.ctf:1: byte offset 0") && message.contains("a line of more than"), "{message}");
    let (code, message) = refusal(&d, "looping");
    assert_eq!(code, ErrorCode::UnknownDataset, "{message}");
    assert!(message.contains("symbolic link loop"), "{message}");
    // The good dataset is served whole.
    let mut s = Client::connect(&d.socket).expect("connect").open("good", &options(10)).expect("open good");
    assert_eq!(support::daemon::drain(&mut s, 5).len(), 5);
    assert_within_limit(&d, LIMIT, "on hostile inputs");
}

/// Found by a probe: a session in file order on a dataset whose chunk cannot be parsed within the
/// limit (short lines of a wide dense stream: 6 bytes of text, 1 KB parsed each) was admitted and
/// failed at its first minibatch with `data_error`; a randomized one was refused at `open`. Both
/// are now refused at `open`, saying which chunk and what to change.
#[test]
fn a_chunk_that_cannot_be_parsed_within_the_limit_is_refused_at_open_in_any_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    let text = write(p, "short.ctf", "|a 1 2\n".repeat(200_000));
    let datasets = format!(
        "[datasets.w]\nformat = \"ctf\"\nfiles = [\"{}\"]\ncache_index = false\n\
         [datasets.w.streams.a]\ndim = 256\nformat = \"dense\"\n",
        text.display()
    );
    config(p, LIMIT, &datasets);
    let d = Daemon::start(p, &[]);
    for randomize in [false, true] {
        let opts = SessionOptions { randomize: Some(randomize), ..options(4) };
        match Client::connect(&d.socket).expect("connect").open("w", &opts) {
            Err(ClientError::Daemon { code, message, .. }) => {
                assert_eq!(code, ErrorCode::ResourceExhausted, "{message}");
                assert!(message.contains("chunk 0") && message.contains("chunk_size_bytes"), "{message}");
            }
            Ok(_) => panic!("randomize = {randomize}: opened"),
            Err(e) => panic!("{e}"),
        }
    }
}

/// #15 item 3: indexing ran before the socket opened, with no word to systemd or the trainers.
/// The socket now opens at once; an `open` on a dataset still indexing gets `dataset_indexing`
/// with the progress, and `open_when_indexed` waits for it.
#[test]
fn the_socket_opens_before_the_datasets_are_indexed_and_sessions_are_told_indexing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    // Opened in name order: `small` waits for `a_big`'s index pass (seconds in a debug build).
    let big = write(p, "big.txt", "1 1:1 2:0.5 3:0.25\n".repeat(4_000_000));
    let small = write(p, "small.txt", "1 1:1\n0 2:1\n".repeat(10));
    config(p, 4 << 30, &(dataset("a_big", "libsvm", &big, false) + &dataset("small", "libsvm", &small, false)));
    let started = Instant::now();
    let mut cmd = std::process::Command::new(support::BIN);
    cmd.args(["run", "--config"]).arg(p.join("minibatchd.toml")).env("MINIBATCHD_LOG", "info");
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped());
    let child = cmd.spawn().expect("spawn");
    let socket = p.join("mbd.sock");
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(started.elapsed() < DEADLINE, "no socket");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // The daemon holds an open while its dataset is indexed, a quarter of a second at most
    // (issue 38: clients then ask again at once instead of sleeping a poll interval).
    let asked = Instant::now();
    let first = Client::connect(&socket).expect("connect").open("small", &options(4));
    let held = asked.elapsed();
    let Err(ClientError::Daemon { code: ErrorCode::DatasetIndexing, message, .. }) = first else {
        panic!("the first open did not get dataset_indexing: {:?}", first.map(|_| ()))
    };
    assert!(held >= std::time::Duration::from_millis(200), "the open was answered after {held:?}, not held");
    assert!(message.contains("'small' is still being indexed") && message.contains(" %, "), "{message}");
    let metrics = support::daemon::http_get(&p.join("state"), "/metrics").expect("metrics while indexing").1;
    assert!(metrics.contains("minibatchd_datasets{state=\"indexing\"} 2"), "{metrics}");
    let mut s = Client::open_when_indexed(&socket, "small", &options(4), Some(DEADLINE)).expect("open once indexed");
    assert_eq!(support::daemon::drain(&mut s, 5).len(), 5);
    drop(s);
    let metrics = support::daemon::http_get(&p.join("state"), "/metrics").expect("metrics").1;
    assert!(metrics.contains("minibatchd_datasets{state=\"indexing\"} 0"), "{metrics}");
    assert!(metrics.contains("minibatchd_dataset_index_scanned_bytes{dataset=\"a_big\"} 76000000"), "{metrics}");
    assert!(metrics.contains("minibatchd_dataset_ready_seconds{dataset=\"a_big\"}"), "{metrics}");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(i32::try_from(child.id()).expect("pid")).expect("pid"),
        rustix::process::Signal::TERM,
    )
    .expect("SIGTERM");
    let out = child.wait_with_output().expect("wait");
    let log = String::from_utf8_lossy(&out.stderr);
    let listening = log.find("listening socket=").expect("listening logged");
    let ready = log.find("dataset ready dataset=a_big").expect("a_big ready logged");
    assert!(listening < ready, "the socket opened after indexing:\n{log}");
    assert!(log.contains("datasets opened ready=2 failed=0"), "{log}");
}

/// A SIGTERM while a dataset is being indexed stops the daemon without waiting for the index pass
/// (the runtime used to wait for its blocking pool: a long pass held the stop for its whole
/// length), and the stop is clean (exit 0, checkpoint written).
#[test]
fn sigterm_while_indexing_stops_without_waiting_for_the_index_pass() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    let big = write(p, "big.txt", "1 1:1 2:0.5 3:0.25\n".repeat(4_000_000));
    config(p, 4 << 30, &dataset("a_big", "libsvm", &big, false));
    let mut cmd = std::process::Command::new(support::BIN);
    cmd.args(["run", "--config"]).arg(p.join("minibatchd.toml")).env("MINIBATCHD_LOG", "info");
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped());
    let child = cmd.spawn().expect("spawn");
    let state = p.join("state");
    let started = Instant::now();
    loop {
        let indexing = support::daemon::http_get(&state, "/metrics")
            .is_some_and(|(_, m)| m.contains("minibatchd_datasets{state=\"indexing\"} 1"));
        if indexing {
            break;
        }
        assert!(started.elapsed() < DEADLINE, "never saw the dataset indexing");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(i32::try_from(child.id()).expect("pid")).expect("pid"),
        rustix::process::Signal::TERM,
    )
    .expect("SIGTERM");
    let out = child.wait_with_output().expect("wait");
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{log}");
    assert!(log.contains("stopped"), "{log}");
    assert!(!log.contains("dataset ready dataset=a_big"), "the stop waited for the index pass:\n{log}");
    assert!(state.join("checkpoint.json").exists(), "the shutdown checkpoint");
}

/// #15 item 4: 2,000 sessions made 4,005 threads and 551 MB; 22,000 idle connections filled the
/// descriptor table. Connections and sessions up to the limits, each session reading, keep the
/// daemon within `memory_limit_bytes` + the overhead: rings are reserved against the limit,
/// sessions share the producer threads, and a connection costs a socket and a small buffer.
#[test]
fn a_flood_of_connections_and_sessions_stays_within_the_memory_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    let good = write(
        p,
        "good.ctf",
        (0..2000).fold(String::new(), |mut t, i| {
            let _ = writeln!(t, "|a {i}");
            t
        }),
    );
    let d = p.display();
    write(
        p,
        "minibatchd.toml",
        format!(
            "[daemon]\nsocket = \"{d}/mbd.sock\"\nmetrics_listen = \"127.0.0.1:0\"\nstate_dir = \"{d}/state\"\n\
             memory_limit_bytes = {LIMIT}\nhost_memory_reserve_bytes = 0\nparser_threads = 1\nproducer_threads = 2\n\
             ring_slots = 2\nslot_size_bytes = 65536\nmax_connections = 1024\nmax_connections_per_uid = 1024\n\
             max_sessions = 256\nmax_sessions_per_uid = 256\n{}",
            dataset("good", "ctf", &good, true)
        ),
    );
    let d = Daemon::start(p, &[]);
    // 256 sessions (a 128 KiB ring each: 32 MiB of the 64 MiB limit), every one reading.
    let mut sessions: Vec<_> = (0..256)
        .map(|i| {
            Client::connect(&d.socket)
                .expect("connect")
                .open("good", &options(4))
                .unwrap_or_else(|e| panic!("{i}: {e}"))
        })
        .collect();
    for s in &mut sessions {
        assert!(s.next_owned().expect("served").is_some());
    }
    // And connections up to the daemon's limit, idle after hello.
    let mut idle = Vec::new();
    while idle.len() < 1024 - 256 {
        let c = Client::connect(&d.socket).expect("connect");
        idle.push(c);
    }
    for s in &mut sessions {
        assert!(s.next_owned().expect("still served").is_some());
    }
    assert_within_limit(&d, LIMIT, "with 256 sessions and 1024 connections");
}

/// The `wide` dataset over `dir/wide.ctf`: 40,000 samples of 512 values (the line's number, then
/// ones), 41 MB of text in 40 chunks of 1 MiB, 82 MB parsed.
fn wide_dataset(dir: &Path) -> String {
    let ones = "1 ".repeat(511);
    let mut text = String::new();
    for i in 0..40_000 {
        writeln!(text, "|a {i} {ones}").expect("a String takes any write");
    }
    let file = write(dir, "wide.ctf", text);
    format!(
        "[datasets.wide]\nformat = \"ctf\"\nfiles = [\"{}\"]\ncache_index = false\nchunk_size_bytes = 1048576\n\
         [datasets.wide.streams.a]\ndim = 512\nformat = \"dense\"\n",
        file.display()
    )
}

/// #17 acceptance 4 (memory bounded at every size): a randomization window whose parsed chunks
/// exceed the limit was served over it (a 384 MiB limit peaked at 543–554 MiB in the benchmark:
/// a demand load was admitted whenever nothing was evictable). Now an `open` whose window's dense
/// values alone pass the cache's share of the limit is refused at once, and a session's demand
/// load is refused once the chunks sessions hold fill that share (what the estimate at `open`
/// does not see: here a sample window). Issue 37: that session no longer fails mid-run (it got
/// `resource_exhausted` after hours in the worst case): a minibatch whose chunks do not fit
/// together is gathered a chunk at a time, so the session delivers what `dump` prints, every
/// sample once, and the daemon stays within the limit.
#[test]
fn a_window_larger_than_the_memory_limit_is_refused_at_open_or_served_within_the_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    // 82 MB parsed: more than the 64 MiB limit.
    let datasets = wide_dataset(p);
    config(p, LIMIT, &datasets);
    let d = Daemon::start(p, &[("MINIBATCHD__DAEMON__PARSED_CACHE_BYTES", "0".to_owned())]);
    // CNTK's default window covers the file: its dense values alone pass the limit, so the open
    // is refused at once.
    let one_sweep = SessionOptions { max_sweeps: Some(1), ..options(256) };
    let refused = |opts: &SessionOptions| {
        let start = Instant::now();
        let (code, message) = loop {
            match Client::connect(&d.socket).expect("connect").open("wide", opts) {
                Err(ClientError::Daemon { code: ErrorCode::DatasetIndexing, .. }) if start.elapsed() < DEADLINE => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(ClientError::Daemon { code, message, .. }) => break (code, message),
                Ok(_) => panic!("a window of 82 MB of dense values was opened with a {} MiB limit", LIMIT >> 20),
                Err(e) => panic!("{e}"),
            }
        };
        assert_eq!(code, ErrorCode::ResourceExhausted, "{message}");
        let whole = ["randomization window needs at least 71 MiB", "its 40 smallest chunks at their peak"];
        let parts = if opts.window_chunks.is_none() { &whole[..] } else { &[] };
        for part in parts.iter().chain(&["the largest window that can fit is "]) {
            assert!(message.contains(part), "{part:?} missing from: {message}");
        }
        // Issue 37: the refusal names the largest window that fits; that one opens, one more does not.
        let largest: u64 = message
            .split("the largest window that can fit is ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no window named in: {message}"));
        assert!((1..40).contains(&largest), "{message}");
        let with = |w: u64| SessionOptions { window_chunks: Some(w), ..one_sweep.clone() };
        assert!(Client::connect(&d.socket).expect("connect").open("wide", &with(largest)).is_ok(), "{largest} chunks");
        assert!(
            matches!(
                Client::connect(&d.socket).expect("connect").open("wide", &with(largest + 1)),
                Err(ClientError::Daemon { code: ErrorCode::ResourceExhausted, .. })
            ),
            "{} chunks",
            largest + 1
        );
        largest
    };
    let largest = refused(&one_sweep);
    // So is a window in samples that spans the whole sweep on both sides of every chunk (CNTK's
    // windows in samples reach half the window each way): it shuffles as a window of every chunk.
    assert_eq!(refused(&SessionOptions { window_samples: Some(1_000_000), ..one_sweep.clone() }), largest);
    // Found by a probe: the window named depended on the window asked for (its sweep orders were
    // taken out of the share first). Any refused window names the same largest.
    let nearer = SessionOptions { window_chunks: Some(largest + 3), ..one_sweep.clone() };
    assert_eq!(refused(&nearer), largest);
    // Nor is any window for an epoch shorter than a sweep (it may end before the peak). A window
    // of every chunk meets the cache's ceiling at its first minibatch, which draws from every
    // chunk; the minibatches whose chunks do not fit together are gathered a chunk at a time
    // (three here: each parses again the chunks the cache could not keep, which is why it is
    // slow and warned about). Served whole, in dump's order, while a session with a window that
    // fits reads too.
    let by_samples = SessionOptions {
        window_samples: Some(1_000_000),
        max_sweeps: None,
        max_samples: Some(3 * 256),
        ..one_sweep.clone()
    };
    let mut s = open_when_ready(&d, &by_samples);
    let small = SessionOptions { window_chunks: Some(2), ..one_sweep };
    let mut next = open_when_ready(&d, &small);
    let (mut got, mut first_values) = (Vec::new(), Vec::new());
    while let Some(mb) = s.next_owned().expect("served, not failed") {
        got.push(support::daemon::json(&mb, &["a"]));
        if let Some(mb) = next.next_owned().expect("next") {
            first_values.extend(first_of_each_sample(&mb));
        }
    }
    while let Some(mb) = next.next_owned().expect("next") {
        first_values.extend(first_of_each_sample(&mb));
    }
    first_values.sort_unstable();
    assert_eq!(first_values, (0..40_000).collect::<Vec<u32>>(), "the small window's session: every sample once");
    let want = d.dump("wide", &["--minibatch-size", "256", "--max-samples", "768", "--window-samples", "1000000"]);
    assert_eq!(want.len(), 3);
    assert!(got == want, "the window of every chunk: {} minibatches, dump printed {}", got.len(), want.len());
    assert!(
        d.metric("minibatchd_session_minibatches_in_parts_total{") > 0.0,
        "no minibatch was gathered a chunk at a time"
    );
    assert!(d.metric("minibatchd_chunk_cache_refused_loads_total ") > 0.0, "no refused load counted");
    assert_within_limit(&d, LIMIT, "and an 82 MB window");
}

/// Found by a probe: the ranks of one job that read through one daemon (a `DataLoader`'s splits
/// read in one process, or several ranks on one node) hold their windows here together, but each
/// `open` was checked for its own share of the window alone: eight splits were admitted with a
/// window the eight together could not hold, and then took turns for memory a hundred times
/// slower than one. The floor now counts the job's workers connected here.
#[test]
fn the_workers_of_one_job_on_one_daemon_are_admitted_for_their_windows_together() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    let datasets = wide_dataset(p);
    // Under 40 MiB one worker of two cannot hold the window of every chunk (36 MiB of floor).
    config(p, 40 << 20, &datasets);
    let d = Daemon::start(p, &[("MINIBATCHD__DAEMON__PARSED_CACHE_BYTES", "0".to_owned())]);
    let open = |window: u64, rank: u64| {
        let opts = SessionOptions {
            max_sweeps: Some(1),
            window_chunks: Some(window),
            num_workers: Some(2),
            rank: Some(rank),
            ..options(256)
        };
        let start = Instant::now();
        loop {
            match Client::connect(&d.socket).expect("connect").open("wide", &opts) {
                Err(ClientError::Daemon { code: ErrorCode::DatasetIndexing, .. }) if start.elapsed() < DEADLINE => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                other => break other,
            }
        }
    };
    // Rank 0 alone at the window of every chunk: refused, it names the window that fits both
    // workers too (found by a probe: each refusal named the window for the workers connected so
    // far, and a job of eight took four restarts), and both open at that one.
    match open(40, 0) {
        Err(ClientError::Daemon { code: ErrorCode::ResourceExhausted, message, .. }) => {
            let both: u64 = message
                .split(" if all 2 of its job's workers read through this daemon")
                .next()
                .and_then(|head| head.rsplit('(').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no window for both workers in: {message}"));
            let together = [open(both, 0).expect("rank 0 at the window named"), open(both, 1).expect("rank 1 too")];
            drop(together);
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("one of two workers held the window of every chunk under 40 MiB"),
    }
    // The widest window rank 0 of 2 opens alone; its floor is more than half the cache's share
    // (the chunks are all about 1 MiB, so one chunk more passes the share), so rank 1 beside it
    // is refused, naming both workers.
    let (window, rank0) = (2..=40)
        .rev()
        .find_map(|w| open(w, 0).ok().map(|s| (w, s)))
        .expect("some window of two chunks or more fits one of two workers");
    match open(window, 1) {
        Err(ClientError::Daemon { code: ErrorCode::ResourceExhausted, message, .. }) => {
            assert!(
                message.contains(
                    "for the 2 workers of this job (or of jobs of its options) that read through this daemon"
                ),
                "{message}"
            );
            assert!(message.contains("every worker of the job with the same window"), "{message}");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("two workers of a window of {window} chunks admitted together"),
    }
    // Alone again, rank 1 opens with that window.
    drop(rank0);
    let start = Instant::now();
    while open(window, 1).is_err() {
        assert!(start.elapsed() < DEADLINE, "rank 1 alone refused a window of {window} chunks");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Two jobs of the same options hold two windows too (found by a probe: counted by rank, their
    // two ranks 0 were one worker).
    let first = loop {
        match open(window, 0) {
            Ok(s) => break s,
            Err(e) => assert!(start.elapsed() < DEADLINE, "rank 0 alone refused: {e}"),
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(
        matches!(open(window, 0), Err(ClientError::Daemon { code: ErrorCode::ResourceExhausted, .. })),
        "another job's rank 0 admitted beside the first's"
    );
    drop(first);
}

/// The first value of every sample of a minibatch's dense stream `a` of 512 values.
fn first_of_each_sample(mb: &minibatchd_engine::minibatch::Minibatch) -> Vec<u32> {
    match &mb.streams[0].data {
        minibatchd_engine::minibatch::MbData::Dense {
            values: minibatchd_engine::minibatch::MbValues::F32(v), ..
        } => {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // line numbers below 40,000
            v.chunks(512).map(|s| s[0] as u32).collect()
        }
        other => panic!("not a dense float32 stream: {other:?}"),
    }
}

/// Opens `wide`, waiting while it is being indexed (the socket opens before).
fn open_when_ready(d: &Daemon, opts: &SessionOptions) -> minibatchd_client::Session {
    support::daemon::open_retrying(d, "wide", opts, ErrorCode::DatasetIndexing)
}

/// A probe: a minibatch of 2^31 - 1 one-value samples over an endless epoch, under a limit that
/// allowed its ring, was admitted; its plan alone then grew by 120 MB a second past the host's
/// memory, counted nowhere. The places of the minibatches in flight (about 160 bytes a sequence
/// here, against 12 in the slot) are now reserved at `open` with the sweep orders.
#[test]
fn a_minibatch_whose_places_do_not_fit_the_limit_is_refused_at_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    let file = write(p, "small.ctf", "|a 1\n".repeat(1000));
    config(p, LIMIT, &dataset("small", "ctf", &file, true));
    let d = Daemon::start(p, &[]);
    // A million samples a minibatch: a slot of ~12 MB fits the limit, the places (~160 MB) not.
    let huge = SessionOptions { max_samples: Some(10_000_000), prefetch: Some(2), ..options(1_000_000) };
    let _ = support::daemon::open_retrying(&d, "small", &options(16), ErrorCode::DatasetIndexing);
    let refused = Client::connect(&d.socket).expect("connect").open("small", &huge);
    let Err(ClientError::Daemon { code, message, .. }) = refused else { panic!("admitted: {refused:?}") };
    assert_eq!(code, ErrorCode::ResourceExhausted, "{message}");
    assert!(
        message.contains("for the minibatches planned and copied at once, up to 1000001 sequences each"),
        "{message}"
    );
    assert!(message.contains("a smaller minibatch_size or prefetch"), "{message}");
    // A tenth of it fits, and is served.
    let fits = SessionOptions { max_samples: Some(200_000), prefetch: Some(2), ..options(100_000) };
    let mut s = Client::connect(&d.socket).expect("connect").open("small", &fits).expect("a tenth fits");
    let mut samples = 0;
    while let Some(mb) = s.next_owned().expect("served") {
        samples += mb.streams[0].num_samples();
    }
    assert_eq!(samples, 200_000);
    assert_within_limit(&d, LIMIT, "with minibatches of 100,000 sequences");
}

/// #17 acceptance 4, found on a 26 GiB file of 22.5 M sequences with a 6 GiB limit: each
/// session's sweep orders (the current sweep's and the next one's, 13 bytes per sequence each)
/// were counted nowhere, and the daemon's RSS passed the limit by up to 487 MiB with one session.
/// They are now reserved at `open` against the limit, before the sampler is built (and since
/// bounded by the randomization window: two windows of 8 bytes per sequence, here the whole file,
/// which is one chunk): on 300,000 one-sample sequences (4.6 MiB of sweep orders per session)
/// with a 64 MiB limit, sessions are
/// admitted while what the cache's floor and the index leave holds their rings and orders (nine),
/// the next one is refused naming its sweep orders, and the daemon stays within the limit
/// (before: the rings alone limited them, to 200 sessions and ~3 GiB of orders).
#[test]
fn the_sessions_sweep_orders_are_reserved_against_the_memory_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    let file = write(p, "many.ctf", "|a 1\n".repeat(300_000));
    config(p, LIMIT, &dataset("many", "ctf", &file, true));
    let d = Daemon::start(p, &[("MINIBATCHD__DAEMON__PARSED_CACHE_BYTES", "0".to_owned())]);
    // Small rings (two slots of 64 KiB), so that the sweep orders are what runs out.
    let randomized = SessionOptions {
        randomize: Some(true),
        window_chunks: Some(4),
        prefetch: Some(2),
        slot_size_bytes: Some(65536),
        ..options(64)
    };
    // What `minibatchd_memory_used_bytes{part="sampling"}` says is reserved, and the bound per
    // session: 16 bytes per sequence of its widest window (the whole file), plus its fixed and
    // per-chunk tables.
    let reserved = || -> f64 {
        let (_, body) = support::daemon::http_get(&p.join("state"), "/metrics").expect("metrics");
        body.lines()
            .find_map(|l| l.strip_prefix("minibatchd_memory_used_bytes{part=\"sampling\"} "))
            .and_then(|v| v.trim().parse().ok())
            .expect("the sampling part")
    };
    let per_session = 16.0 * 300_000.0;
    let within = |sessions: u32, bytes: f64| {
        let n = f64::from(sessions);
        bytes >= n * per_session && bytes <= n * (per_session + 65536.0)
    };
    // Equal steps walk the epoch at `open` (another sampler beside this one): reserved while
    // they run, given back once the session is open.
    let equal = SessionOptions { equal_steps: true, max_sweeps: Some(1), ..randomized.clone() };
    let mut first = support::daemon::open_retrying(&d, "many", &equal, ErrorCode::DatasetIndexing);
    assert!(first.next_owned().expect("served").is_some());
    assert!(within(1, reserved()), "{} B reserved for one session", reserved());
    drop(first);
    let deadline = Instant::now() + DEADLINE;
    while reserved() > 0.0 {
        assert!(Instant::now() < deadline, "{} B still reserved after the session ended", reserved());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut open = Vec::new();
    let (code, message) = loop {
        let opened = Client::connect(&d.socket).expect("connect").open("many", &randomized);
        match opened {
            Ok(mut s) => {
                // Reading builds the sweep orders, and near the sweep's end the next one's.
                assert!(s.next_owned().expect("served").is_some());
                open.push(s);
                // About 9 fit (4.6 MiB each in what the floor and the index leave of 64 MiB);
                // uncounted, the rings alone would admit some 200.
                assert!(open.len() <= 12, "{} sessions admitted: their sweep orders are not counted", open.len());
            }
            Err(ClientError::Daemon { code, message, .. }) => break (code, message),
            Err(e) => panic!("{e}"),
        }
    };
    assert!(!open.is_empty(), "no session opened: {message}");
    assert_eq!(code, ErrorCode::ResourceExhausted, "{message}");
    assert!(message.contains("sweep orders and minibatches need"), "{message}");
    for s in &mut open {
        assert!(s.next_owned().expect("still served").is_some());
    }
    let sessions = u32::try_from(open.len()).expect("at most 12");
    assert!(within(sessions, reserved()), "{} B reserved for {sessions} sessions", reserved());
    eprintln!("{} sessions admitted; then: {message}", open.len());
    assert_within_limit(&d, LIMIT, "with sessions on 300,000 sequences");
}

/// Issue 36, finding 6: a few idle sessions (their trainers took a minibatch, then stopped
/// asking: every slot leased) held their randomization windows of parsed chunks, and a session
/// that read failed at its first minibatch with `resource_exhausted` — a neighbour could starve
/// others within its limits. Now the reading session lets go of what it does not need and waits,
/// the idle ones let go of their chunks when it does, and every session delivers exactly its
/// `dump`, within the limit.
#[test]
fn idle_sessions_holding_chunks_do_not_starve_a_session_that_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    // 20,000 samples of 256 values: 10 MB of text, 20 MB parsed per dataset; three datasets on it
    // hold 60 MB, more than what a 64 MiB limit leaves for chunks beside three rings.
    let file = wide_file(p, 20_000);
    config(p, LIMIT, &wide_datasets(&file, &["d0", "d1", "d2"]));
    // One producer thread: the waiting session must not hold it while the idle ones, which run on
    // the same pool, need it to let go of their chunks.
    let d = Daemon::start(
        p,
        &[
            ("MINIBATCHD__DAEMON__PARSED_CACHE_BYTES", "0".to_owned()),
            ("MINIBATCHD__DAEMON__PRODUCER_THREADS", "1".to_owned()),
        ],
    );
    let opts = SessionOptions { max_sweeps: Some(1), ..options(256) };
    let want = |name: &str| d.dump(name, &["--minibatch-size", "256", "--max-sweeps", "1"]);
    let line = |mb: &minibatchd_engine::minibatch::Minibatch| support::daemon::json(mb, &["a"]);
    // Two trainers take a minibatch each, then stop asking: their producers fill their rings and
    // wait, holding their windows.
    let mut idle: Vec<(&str, minibatchd_client::Session, Vec<String>)> = ["d0", "d1"]
        .into_iter()
        .map(|name| {
            let mut s = support::daemon::open_retrying(&d, name, &opts, ErrorCode::DatasetIndexing);
            let first = s.next_owned().expect("next").expect("a minibatch");
            (name, s, vec![line(&first)])
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_secs(1));
    // A third reads its whole sweep (before: resource_exhausted at its first minibatch).
    let mut s = support::daemon::open_retrying(&d, "d2", &opts, ErrorCode::DatasetIndexing);
    let mut got = Vec::new();
    loop {
        match s.next_owned() {
            Ok(Some(mb)) => got.push(line(&mb)),
            Ok(None) => break,
            Err(e) => panic!("the reading session failed beside idle ones: {e}"),
        }
    }
    assert_eq!(got, want("d2"));
    // The idle ones go on, from the chunks they let go of, with exactly their minibatches.
    for (name, s, got) in &mut idle {
        while let Some(mb) = s.next_owned().expect("next") {
            got.push(line(&mb));
        }
        assert_eq!(*got, want(name), "{name}");
    }
    assert_within_limit(&d, LIMIT, "with two idle sessions holding their windows");
    assert!(d.metric("minibatchd_chunk_cache_shed_chunks_total ") > 0.0, "the idle sessions let go of their chunks");
}

/// Issue 37: sessions that all read, whose windows together need more than the limit (on one
/// producer thread, so a session that waits must yield it to the others): none fails
/// (before: the one whose load met the full ceiling got `resource_exhausted`); they wait in line
/// for each other's chunks, the longest-waiting first, and each delivers exactly its `dump`
/// within the limit.
#[test]
fn sessions_that_read_at_once_past_the_limit_wait_for_each_other_instead_of_failing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    let file = wide_file(p, 6_000);
    let names = ["d0", "d1", "d2"];
    // 6 MB parsed per dataset, 18 MB for the three, under a 16 MiB limit (small rings: 12 MiB
    // left for chunks).
    let limit = 16u64 << 20;
    config(p, limit, &wide_datasets(&file, &names));
    // One producer thread for three waiting sessions: waits must yield it.
    let d = Daemon::start(
        p,
        &[
            ("MINIBATCHD__DAEMON__PARSED_CACHE_BYTES", "0".to_owned()),
            ("MINIBATCHD__DAEMON__PRODUCER_THREADS", "1".to_owned()),
        ],
    );
    let opts =
        SessionOptions { max_sweeps: Some(1), prefetch: Some(2), slot_size_bytes: Some(300_000), ..options(256) };
    let dumps: Vec<Vec<String>> =
        names.iter().map(|n| d.dump(n, &["--minibatch-size", "256", "--max-sweeps", "1"])).collect();
    let got: Vec<Result<Vec<String>, String>> = std::thread::scope(|scope| {
        let readers: Vec<_> = names
            .iter()
            .map(|name| {
                let (d, opts) = (&d, &opts);
                scope.spawn(move || {
                    let mut s = support::daemon::open_retrying(d, name, opts, ErrorCode::DatasetIndexing);
                    let mut got = Vec::new();
                    loop {
                        match s.next_owned() {
                            Ok(Some(mb)) => got.push(support::daemon::json(&mb, &["a"])),
                            Ok(None) => return Ok(got),
                            Err(e) => return Err(format!("{name}: {e}")),
                        }
                    }
                })
            })
            .collect();
        readers.into_iter().map(|r| r.join().expect("reader")).collect()
    });
    for ((name, got), want) in names.iter().zip(got).zip(&dumps) {
        assert_eq!(&got.unwrap_or_else(|e| panic!("a reading session failed: {e}")), want, "{name}");
    }
    assert_within_limit(&d, limit, "with three sessions reading past it");
    assert!(d.metric("minibatchd_chunk_cache_refused_loads_total ") > 0.0, "the sessions did meet the limit");
}

/// Issue 37: the parsed cache did not fill when memory was short — exactly when
/// it matters: chunks evicted before their paced write were lost (a 512 MiB file under a
/// 256 MiB limit: 107 of ~280 MB written after a sweep). A chunk is now kept until it is
/// written, so one sweep of a dataset twice the limit leaves every chunk persisted, within the
/// limit, and the sweep after a restart parses nothing.
#[test]
fn one_sweep_larger_than_the_memory_limit_persists_every_chunk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    // 64,000 samples of 256 values: 33 MB of text in 1 MiB chunks, 66 MB parsed — twice the
    // 32 MiB limit.
    let file = wide_file(p, 64_000);
    let limit = 32u64 << 20;
    let datasets = format!(
        "[datasets.wide]\nformat = \"ctf\"\nfiles = [\"{}\"]\nchunk_size_bytes = 1048576\n\
         [datasets.wide.streams.a]\ndim = 256\nformat = \"dense\"\n",
        file.display()
    );
    config(p, limit, &datasets);
    let mut d = Daemon::start(p, &[]);
    let opts = SessionOptions { max_sweeps: Some(1), window_chunks: Some(2), ..options(256) };
    let want = d.dump("wide", &["--minibatch-size", "256", "--max-sweeps", "1", "--window-chunks", "2"]);
    let sweep = |d: &Daemon| {
        let mut s = support::daemon::open_retrying(d, "wide", &opts, ErrorCode::DatasetIndexing);
        let mut got = Vec::new();
        while let Some(mb) = s.next_owned().expect("next") {
            got.push(support::daemon::json(&mb, &["a"]));
        }
        got
    };
    assert_eq!(sweep(&d), want);
    assert_within_limit(&d, limit, "over a sweep twice its size");
    assert_eq!(d.stop().code(), Some(0));
    let entries = std::fs::read_dir(p.join("state/parsed"))
        .expect("ls")
        .filter(|e| e.as_ref().is_ok_and(|e| e.path().extension().is_some_and(|x| x == "mbp")));
    let entries = entries.count();
    let out = support::command("index", &d.config(), "wide").output().expect("index");
    let printed = String::from_utf8_lossy(&out.stdout);
    let total: usize = printed
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .find_map(|w| (w[1].starts_with("chunk")).then(|| w[0].parse().ok()).flatten())
        .unwrap_or_else(|| panic!("no chunk count in: {printed}"));
    assert_eq!(entries, total, "every chunk persisted after one sweep under the limit");
    // After a restart the sweep reads them all back: no chunk is parsed from the text.
    let d = Daemon::start(p, &[]);
    assert_eq!(sweep(&d), want);
    // A counter: at most zero is zero.
    let misses = d.metric("minibatchd_parsed_cache_misses_total ");
    assert!(misses <= 0.0, "every chunk came from the parsed cache, but {misses} were parsed");
}

/// Found by a hostile probe: a dense TFRecord feature of 2^24 values with `default = 0.0` held
/// that default as 2^24 `f64`s, copied in every layer of the configuration (`dump` peaked at
/// 662 MB under a 256 MiB limit before its chunk was refused). One default for every value is now
/// kept as one; a chunk of records that lack the feature, whose defaults pass what a parsed chunk
/// may hold, is refused at `open` naming the chunk, and the daemon stays within the limit.
#[test]
fn a_dense_default_of_millions_of_values_costs_nothing_until_a_record_needs_it() {
    use minibatchd_engine::format::tfrecord::example::write::{example, Value};
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    // 2^22 values a record (16 MiB as float32): eight records in a chunk pass its share, a half
    // of the 128 MiB limit.
    let records: Vec<u8> = (0..8i64)
        .flat_map(|i| minibatchd_engine::format::tfrecord::frame(&example(&[("id", Value::Ints(&[i]))])))
        .collect();
    let file = write(p, "lacking.tfrecord", records);
    let datasets = format!(
        "[datasets.t]\nformat = \"tfrecord\"\nfiles = [\"{}\"]\ncache_index = false\n\
         [datasets.t.sampling]\nrandomize = false\n\
         [datasets.t.streams.big]\nformat = \"dense\"\ndim = 4194304\ndefault = 0.0\n\
         [datasets.t.streams.id]\ndtype = \"int64\"\nformat = \"dense\"\ndim = 1\n",
        file.display()
    );
    let limit = 128 << 20;
    config(p, limit, &datasets);
    let d = Daemon::start(p, &[]);
    // Eight records that lack the feature in one chunk: 128 MiB of defaults, more than a parsed
    // chunk may hold. Refused at `open` (a session in file order used to be admitted and fail at
    // its first minibatch, the chunk passing its share of the limit as it was parsed).
    match Client::connect(&d.socket).expect("connect").open("t", &SessionOptions { prefetch: Some(2), ..options(1) }) {
        Err(ClientError::Daemon { code, message, .. }) => {
            assert_eq!(code, ErrorCode::ResourceExhausted, "{message}");
            assert!(message.contains("chunk 0") && message.contains("chunk_size_bytes"), "{message}");
        }
        Ok(_) => panic!("a chunk of 128 MiB of defaults was admitted under a 128 MiB limit"),
        Err(e) => panic!("{e}"),
    }
    assert_within_limit(&d, limit, "with a default of 2^22 values");
}

/// A dense CTF dataset `d64` and a libsvm one `sp` in `p`: 48,000 samples of 64 values (6 MB of
/// text, 12 MB parsed) and 40,000 libsvm lines of 40 features (8 MB of text, 13 MB parsed), in
/// chunks of 256 and 512 KiB.
fn mixed_datasets(p: &Path) -> String {
    let mut dense = String::new();
    for i in 0..48_000 {
        let _ = writeln!(dense, "|a {i} {}", "1 ".repeat(63));
    }
    let dense = write(p, "d64.ctf", dense);
    let mut sparse = String::new();
    for i in 0..40_000 {
        let _ = write!(sparse, "{}", i % 2);
        for j in 0..40 {
            let _ = write!(sparse, " {}:{}", j * 7 + i % 7, (i + j) % 9 + 1);
        }
        sparse.push('\n');
    }
    let sparse = write(p, "sp.libsvm", sparse);
    format!(
        "[datasets.d64]\nformat = \"ctf\"\nfiles = [\"{}\"]\ncache_index = false\nchunk_size_bytes = 262144\n\
         [datasets.d64.streams.a]\ndim = 64\nformat = \"dense\"\n\
         [datasets.sp]\nformat = \"libsvm\"\nfiles = [\"{}\"]\ncache_index = false\nchunk_size_bytes = 524288\n",
        dense.display(),
        sparse.display()
    )
}

/// Found by a hostile probe: sessions of every shape reading at once under a small limit — windows
/// of 1 to 16 chunks, 1 to 4 workers, a dense CTF and a libsvm dataset — stalled for minutes: the
/// sessions behind the longest-waiting one loaded chunks with the room that was freed, were
/// refused the next, let go of them and asked again, so the parsers re-parsed chunks let go
/// before use and no session got all of its minibatch's chunks. Those behind now take no memory
/// (and no thread) until their turn. Every session delivers exactly its `dump`, within the limit.
#[test]
fn sessions_of_every_shape_reading_at_once_under_a_small_limit_each_get_their_turn() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    // 25 MB parsed: more than the chunk cache gets of a 24 MiB limit beside ten rings.
    let datasets = mixed_datasets(p);
    let limit = 24u64 << 20;
    config(p, limit, &datasets);
    let d = Daemon::start(
        p,
        &[
            ("MINIBATCHD__DAEMON__PARSED_CACHE_BYTES", "0".to_owned()),
            ("MINIBATCHD__DAEMON__PRODUCER_THREADS", "2".to_owned()),
            ("MINIBATCHD__DAEMON__PARSER_THREADS", "2".to_owned()),
            ("MINIBATCHD__DAEMON__MAX_SESSIONS_PER_UID", "64".to_owned()),
        ],
    );
    // (dataset, minibatch size, window in chunks, workers, rank, seed)
    let shapes: [(&str, u64, u64, u64, u64, u64); 10] = [
        ("sp", 64, 2, 4, 0, 0),
        ("d64", 256, 8, 4, 0, 1),
        ("d64", 512, 8, 2, 1, 2),
        ("sp", 256, 16, 1, 0, 3),
        ("d64", 64, 8, 4, 2, 4),
        ("d64", 512, 16, 2, 0, 5),
        ("sp", 64, 8, 2, 1, 6),
        ("d64", 256, 1, 4, 3, 7),
        ("d64", 512, 4, 1, 0, 8),
        ("sp", 256, 16, 2, 1, 9),
    ];
    let names = ["a"];
    let libsvm = ["__instX", "__instY"];
    let dumps: Vec<Vec<String>> = shapes
        .iter()
        .map(|&(ds, mb, window, workers, rank, seed)| {
            let [mb, window, workers, rank, seed] = [mb, window, workers, rank, seed].map(|v| v.to_string());
            d.dump(
                ds,
                &[
                    "--minibatch-size",
                    &mb,
                    "--max-sweeps",
                    "1",
                    "--window-chunks",
                    &window,
                    "--workers",
                    &workers,
                    "--rank",
                    &rank,
                    "--seed",
                    &seed,
                ],
            )
        })
        .collect();
    // A stall is a failure, not a hang: past four minutes (28 s measured in a debug build) the
    // daemon is killed and the readers fail.
    let stalled = std::sync::atomic::AtomicBool::new(false);
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let got: Vec<Result<Vec<String>, String>> = std::thread::scope(|scope| {
        let (d, stalled) = (&d, &stalled);
        scope.spawn(move || {
            if finished.recv_timeout(std::time::Duration::from_secs(240))
                == Err(std::sync::mpsc::RecvTimeoutError::Timeout)
            {
                stalled.store(true, std::sync::atomic::Ordering::SeqCst);
                d.signal(rustix::process::Signal::KILL);
            }
        });
        let readers: Vec<_> = shapes
            .iter()
            .map(|&(ds, mb, window, workers, rank, seed)| {
                let streams: &[&str] = if ds == "sp" { &libsvm } else { &names };
                scope.spawn(move || {
                    let opts = SessionOptions {
                        max_sweeps: Some(1),
                        window_chunks: Some(window),
                        num_workers: Some(workers),
                        rank: Some(rank),
                        seed: Some(seed),
                        slot_size_bytes: Some(150_000),
                        ..options(mb)
                    };
                    let mut s = support::daemon::open_retrying(d, ds, &opts, ErrorCode::DatasetIndexing);
                    let mut got = Vec::new();
                    loop {
                        match s.next_owned() {
                            Ok(Some(mb)) => got.push(support::daemon::json(&mb, streams)),
                            Ok(None) => return Ok(got),
                            Err(e) => return Err(format!("{ds} seed {seed}: {e}")),
                        }
                    }
                })
            })
            .collect();
        let got = readers.into_iter().map(|r| r.join().expect("reader")).collect();
        drop(done);
        got
    });
    assert!(!stalled.into_inner(), "the sessions stalled: no session finished in four minutes");
    for ((shape, got), want) in shapes.iter().zip(got).zip(&dumps) {
        let got = got.unwrap_or_else(|e| panic!("a reading session failed: {e}"));
        assert!(got == *want, "{shape:?}: {} minibatches, the dump has {}", got.len(), want.len());
    }
    assert_within_limit(&d, limit, "with ten sessions of every shape reading at once");
    assert!(d.metric("minibatchd_chunk_cache_refused_loads_total ") > 0.0, "the sessions did meet the limit");
}

/// Found by a hostile probe: under a limit that one session's window nearly fills, a session
/// whose every minibatch spans more chunks than the limit holds (a wide `window_samples`)
/// delivered 24 minibatches every 5 s while another session's trainer held all its slots. The
/// idle session let go of its chunks, but the copies it had gathered a chunk at a time for its
/// next minibatches stayed charged — memory only its trainer frees — and the waiting session
/// waited for them, holding its own minibatch's chunks, until its 5 s of patience ran out, for
/// each group of minibatches. It now waits only for what others can let go of, and gathers a
/// chunk at a time at once otherwise: it reads its whole sweep during the hold (in the probe's
/// release build, in about a second instead of 8 minutes), exactly its `dump`.
#[test]
fn a_session_reads_while_another_trainer_holds_its_slots_beside_its_charged_copies() {
    use std::time::Duration;
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    // The probe's data: 150,000 lines of a dim-1 id, 64 dense values and a sparse one, 22 MB of
    // text, 41 MB parsed, in 43 chunks of 512 KiB (about 1 MB parsed each).
    let mut text = String::with_capacity(23 << 20);
    for i in 0..150_000u32 {
        let _ = write!(text, "|id {i} |x");
        for k in 0..64 {
            let _ = write!(text, " {}", (i + k) % 10);
        }
        let _ = writeln!(text, " |s {}:1", i % 50);
    }
    let file = write(p, "a.ctf", text);
    support::daemon::write_config(
        p,
        "memory_limit_bytes = 10485760\nhost_memory_reserve_bytes = 0\nring_slots = 4\nslot_size_bytes = 65536\n\
         parser_threads = 2\nproducer_threads = 2",
        &format!(
            "[datasets.a]\nformat = \"ctf\"\nfiles = [\"{}\"]\nchunk_size_bytes = 524288\n\
             [datasets.a.streams.id]\ndim = 1\nformat = \"dense\"\n[datasets.a.streams.x]\ndim = 64\nformat = \"dense\"\n\
             [datasets.a.streams.s]\ndim = 50\nformat = \"sparse\"\n[datasets.a.sampling]\nrandomize = true\nseed = 3\n",
            file.display()
        ),
    );
    // The parsed cache filled first, as the probe's was by its earlier runs: chunks then come
    // back mapped, and at once.
    let filled = std::process::Command::new(support::BIN)
        .args(["index", "--config"])
        .arg(p.join("minibatchd.toml"))
        .args(["--dataset", "a", "--parsed"])
        .output()
        .expect("minibatchd index --parsed");
    assert!(filled.status.success(), "{}", String::from_utf8_lossy(&filled.stderr));
    let d = Daemon::start(p, &[]);
    // The holder: a window of 7 chunks (it fits alone), four slots, all of them held a while.
    let holder_opts = SessionOptions {
        window_chunks: Some(7),
        prefetch: Some(4),
        max_sweeps: Some(2),
        seed: Some(2),
        ..options(100)
    };
    let reader_opts =
        SessionOptions { window_samples: Some(60_000), max_sweeps: Some(1), seed: Some(5), ..options(128) };
    let line = |mb: &minibatchd_engine::minibatch::Minibatch| support::daemon::json(mb, &["id", "s", "x"]);
    let mut holder = support::daemon::open_retrying(&d, "a", &holder_opts, ErrorCode::DatasetIndexing);
    let mut reader = support::daemon::open_retrying(&d, "a", &reader_opts, ErrorCode::DatasetIndexing);
    let done = std::sync::atomic::AtomicBool::new(false);
    let (held_got, reader_got, read_during_hold) = std::thread::scope(|s| {
        let reading = s.spawn(|| {
            let mut got = Vec::new();
            while let Some(mb) = reader.next_owned().expect("the reader's next minibatch") {
                got.push(line(&mb));
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            got
        });
        // The holder's trainer takes 196 minibatches (reading beside the reader, it gathers
        // them a chunk at a time), then keeps the next four — every slot of its ring — until
        // the reader is done or a minute has passed.
        let mut got = Vec::new();
        for _ in 0..196 {
            got.push(line(&holder.next_owned().expect("next").expect("a minibatch")));
        }
        let kept: Vec<_> = (0..4).map(|_| holder.next_minibatch().expect("next").expect("a minibatch")).collect();
        let started = Instant::now();
        while !done.load(std::sync::atomic::Ordering::SeqCst) && started.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let read_during_hold = done.load(std::sync::atomic::Ordering::SeqCst);
        for mb in kept {
            got.push(line(&holder.copy(&mb).expect("copy")));
            holder.release(mb);
        }
        while let Some(mb) = holder.next_owned().expect("next") {
            got.push(line(&mb));
        }
        (got, reading.join().expect("the reader"), read_during_hold)
    });
    assert!(read_during_hold, "the reader did not finish its sweep within a minute of the holder holding its slots");
    // Compared whole, reported short (a minibatch is 20 KB of JSON).
    for (who, got, args) in [
        (
            "the reader",
            &reader_got,
            ["--minibatch-size", "128", "--max-sweeps", "1", "--window-samples", "60000", "--seed", "5"],
        ),
        (
            "the holder",
            &held_got,
            ["--minibatch-size", "100", "--max-sweeps", "2", "--window-chunks", "7", "--seed", "2"],
        ),
    ] {
        let want = d.dump("a", &args);
        assert!(
            *got == want,
            "{who}: {} minibatches against dump's {}, first difference at {:?}",
            got.len(),
            want.len(),
            got.iter().zip(&want).position(|(g, w)| g != w)
        );
    }
    assert_within_limit(&d, 10 << 20, "with a trainer holding its slots beside a wide window");
}

/// Found by a hostile probe: a session's first minibatches gathered a chunk at a time were eight
/// whatever their size — 8.6 MB each, 69 MB of copies in one go under a 28 MiB limit (peak RSS
/// 146 MB) — as no size of earlier ones said how many fit. The first such group is one minibatch;
/// later ones go by its size, so the daemon stays within the limit and the sweep is `dump`'s.
#[test]
fn large_minibatches_gathered_a_chunk_at_a_time_stay_within_the_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path();
    // 90,000 samples of 64 values (256 bytes parsed each, 23 MB in all) in 256 KiB chunks.
    let mut text = String::new();
    for i in 0..90_000 {
        let _ = writeln!(text, "|a {i} {}", "1 ".repeat(63));
    }
    let file = write(p, "wide64.ctf", text);
    // The ring (16 MiB) and the places of the minibatches in flight (7.6 MB, reserved with the
    // sweep orders) leave the chunk cache about 10 MB, well under the window's 15 MB (at 36 MiB,
    // 13 MB: a CI run gathered every minibatch whole).
    let limit = 34u64 << 20;
    support::daemon::write_config(
        p,
        &format!(
            "memory_limit_bytes = {limit}\nhost_memory_reserve_bytes = 0\nparser_threads = 2\nring_slots = 2\n\
             slot_size_bytes = 8388608"
        ),
        &format!(
            "[datasets.wide]\nformat = \"ctf\"\nfiles = [\"{}\"]\ncache_index = false\nchunk_size_bytes = 262144\n\
             [datasets.wide.streams.a]\ndim = 64\nformat = \"dense\"\n",
            file.display()
        ),
    );
    let d = Daemon::start(p, &[]);
    // Minibatches of 30,000 samples (7.7 MB) from a window of 60,000 samples: their chunks do not
    // fit together in the cache's share.
    let opts =
        SessionOptions { max_sweeps: Some(2), window_samples: Some(60_000), prefetch: Some(2), ..options(30_000) };
    let mut s = support::daemon::open_retrying(&d, "wide", &opts, ErrorCode::DatasetIndexing);
    let mut seen = vec![0u32; 90_000];
    while let Some(mb) = s.next_owned().expect("served, not failed") {
        let minibatchd_engine::minibatch::MbData::Dense {
            values: minibatchd_engine::minibatch::MbValues::F32(v), ..
        } = &mb.streams[0].data
        else {
            panic!("not a dense float32 stream")
        };
        for sample in v.chunks(64) {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // line numbers below 90,000
            let line = sample[0] as usize;
            seen[line] += 1;
        }
    }
    assert!(seen.iter().all(|&n| n == 2), "every sample once a sweep");
    assert!(
        d.metric("minibatchd_session_minibatches_in_parts_total{") > 0.0,
        "no minibatch was gathered a chunk at a time"
    );
    assert_within_limit(&d, limit, "with minibatches of 7.7 MB gathered a chunk at a time");
}
