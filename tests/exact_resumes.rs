//! Issue 36, findings 2 and 3, against the real daemon: the `exact` of a resume by name never
//! lies, and a session is never opened that the daemon could not write to its checkpoint.
//!
//! A trainer that is given minibatches reports what it took only with its next request (the
//! clients batch their releases), so when its connection ends without `close{taken}` — a step
//! longer than `shutdown_grace_secs` at a stop, a trainer that does not ask again before a reload
//! removes its dataset — the daemon does not know how far it got, and a resume by name must say
//! `exact: false`. When the client does report (`close{taken}`, which the clients send on
//! `shutting_down` and `unknown_dataset`), the resume is exact and continues with the first
//! minibatch not taken.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use minibatchd_client::protocol::{ErrorCode, SessionOptions};
use minibatchd_client::{ClientError, Session};
use support::daemon::{options, train_ctf, write_config, Daemon, DEADLINE, TRAIN_STREAMS_TOML};
use support::disk::SmallDisk;
use support::write;

/// Writes the data file and returns the dataset's config.
fn dataset(dir: &Path) -> String {
    write(dir, "data.ctf", train_ctf().repeat(4));
    dataset_config(dir)
}

/// The dataset's config, over the data file `dataset` wrote (a reload does not write it again:
/// a rewrite while a session reads it is, rightly, a data error instead of the reload's effect).
fn dataset_config(dir: &Path) -> String {
    format!(
        "[datasets.train]\nformat = \"ctf\"\nfiles = [\"{}\"]\nchunk_size_bytes = 2000\n{TRAIN_STREAMS_TOML}",
        dir.join("data.ctf").display()
    )
}

/// `[daemon]` lines: a short grace, sessions that linger, no periodic checkpoint.
const DAEMON: &str =
    "ring_slots = 4\nslot_size_bytes = 65536\nshutdown_grace_secs = 1\nsession_linger_secs = 600\ncheckpoint_interval_secs = 3600\n";

fn start(dir: &Path) -> Daemon {
    let datasets = dataset(dir);
    write_config(dir, DAEMON, &datasets);
    Daemon::start(dir, &[])
}

fn named(name: &str) -> SessionOptions {
    SessionOptions { session: Some(name.into()), max_sweeps: Some(100), ..options(4) }
}

/// Takes `n` minibatches as a trainer does (each handed out, its slot given back, reported with
/// the client's next request); returns the index of the last.
fn take(s: &mut Session, n: usize) -> u64 {
    let mut last = 0;
    for _ in 0..n {
        let mb = s.next_minibatch().expect("next").expect("a minibatch");
        last = mb.meta.index;
        s.release(mb);
    }
    last
}

/// Takes minibatches until the daemon ends the session with `code`; the index of the last taken.
fn take_until(s: &mut Session, code: ErrorCode, mut last: u64) -> u64 {
    let start = Instant::now();
    loop {
        match s.next_minibatch() {
            Ok(Some(mb)) => {
                last = mb.meta.index;
                s.release(mb);
                std::thread::sleep(Duration::from_millis(5)); // a trainer's step
            }
            Err(ClientError::Daemon { code: c, .. }) if c == code => return last,
            other => panic!("expected {code:?}, got {other:?}"),
        }
        assert!(start.elapsed() < DEADLINE, "the daemon never ended the session");
    }
}

/// Opens `name` again and returns its `resumed` (from, exact) and the first minibatch's index.
fn resume(d: &Daemon, name: &str) -> ((String, bool), u64) {
    let mut s = d.client().open("train", &named(name)).expect("resume by name");
    let r = s.resumed.clone().expect("a session resumed by name says so");
    let first = s.next_minibatch().expect("next").expect("a minibatch").meta.index;
    ((r.from, r.exact), first)
}

#[test]
fn a_sigterm_during_a_step_longer_than_the_grace_is_not_resumed_as_exact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut d = start(dir.path());
    let mut s = d.client().open("train", &named("slow")).expect("open");
    let last = take(&mut s, 6);
    // The trainer is inside a long step: it asks for nothing while the daemon stops.
    assert_eq!(d.stop().code(), Some(0));
    drop(s);
    let d = Daemon::start(dir.path(), &[]);
    let ((from, exact), first) = resume(&d, "slow");
    assert_eq!(from, "checkpoint");
    assert!(first <= last, "nothing is skipped: resumed at {first}, the trainer took up to {last}");
    // Before: `exact: true`, resuming a few minibatches before where the trainer was.
    assert!(!exact, "minibatches {first}..={last} come again: the resume must not say exact");
}

/// Found by a hostile probe: one flipped digit of a position in the checkpoint (60 → 61)
/// resumed the session a sample past where its trainer was, as exact; a checkpoint that could
/// not be read at all made a named session start afresh without a word. Now the checkpoint's
/// checksum sets the damaged file aside, and a named open is told its session may have been lost.
#[test]
fn a_checkpoint_damaged_on_disk_is_not_resumed_and_a_named_open_is_told() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut d = start(dir.path());
    let mut s = d.client().open("train", &named("flipped")).expect("open");
    take(&mut s, 3);
    s.close().expect("close");
    assert_eq!(d.stop().code(), Some(0));
    let ckpt = dir.path().join("state/checkpoint.json");
    let text = std::fs::read_to_string(&ckpt).expect("checkpoint");
    let at = text.find("\"minibatches\": 3").expect("the session's count") + "\"minibatches\": ".len();
    let mut bytes = text.into_bytes();
    bytes[at] = b'4';
    std::fs::write(&ckpt, &bytes).expect("flip a digit");
    let d = Daemon::start(dir.path(), &[]);
    let mut again = d.client().open("train", &named("flipped")).expect("open by name");
    assert_eq!(again.resumed, None, "not resumed from a damaged checkpoint");
    assert!(
        again.warnings.iter().any(|w| w.contains("checkpoint could not be read") && w.contains("flipped")),
        "{:?}",
        again.warnings
    );
    assert_eq!(again.next_minibatch().expect("next").expect("a minibatch").meta.index, 0);
    assert!(dir.path().join("state/checkpoint.json.unreadable").exists(), "the damaged file is kept aside");
}

/// Found by a probe: a checkpoint edited with its checksum taken out read as one of a build
/// before checksums, and an edited position resumed as exact. A checkpoint without a checksum
/// is still read (an older build's), but its resumes by name are not labelled exact.
#[test]
fn a_checkpoint_without_its_checksum_resumes_but_not_as_exact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut d = start(dir.path());
    let mut s = d.client().open("train", &named("edited")).expect("open");
    take(&mut s, 3);
    s.close().expect("close");
    assert_eq!(d.stop().code(), Some(0));
    let ckpt = dir.path().join("state/checkpoint.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&ckpt).expect("read")).expect("json");
    assert!(v.as_object_mut().expect("object").remove("checksum").is_some(), "{v}");
    std::fs::write(&ckpt, serde_json::to_vec_pretty(&v).expect("json")).expect("write");
    let d = Daemon::start(dir.path(), &[]);
    let again = d.client().open("train", &named("edited")).expect("open by name");
    let resumed = again.resumed.clone().expect("resumed from the checkpoint");
    assert!(!resumed.exact, "{resumed:?}");
}

/// Found by a hostile probe: a named session whose linger ran out, then a restart, started over
/// from minibatch 0 without a word (within one run the `open` is warned). The checkpoint now
/// carries the names let go, so the warning survives the restart — and the one after it.
#[test]
fn a_name_let_go_before_a_restart_is_still_told_it_starts_afresh() {
    let dir = tempfile::tempdir().expect("tempdir");
    let datasets = dataset(dir.path());
    let short = DAEMON.replace("session_linger_secs = 600", "session_linger_secs = 1");
    write_config(dir.path(), &short, &datasets);
    let mut d = Daemon::start(dir.path(), &[]);
    let mut s = d.client().open("train", &named("expired")).expect("open");
    take(&mut s, 3);
    s.close().expect("close");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(d.stop().code(), Some(0));
    let mut restarts = 0;
    while restarts < 2 {
        // A second restart before anyone opens the name: the note goes from checkpoint to checkpoint.
        let mut d = Daemon::start(dir.path(), &[]);
        restarts += 1;
        if restarts == 2 {
            let mut again = d.client().open("train", &named("expired")).expect("open by name");
            assert_eq!(again.resumed, None, "its linger ran out");
            assert!(
                again.warnings.iter().any(|w| w.contains("\"expired\"") && w.contains("starts afresh")),
                "{:?}",
                again.warnings
            );
            assert_eq!(again.next_minibatch().expect("next").expect("a minibatch").meta.index, 0);
        }
        assert_eq!(d.stop().code(), Some(0));
    }
    // Told once: the next open of the name is no news.
    let d = Daemon::start(dir.path(), &[]);
    let again = d.client().open("train", &named("expired")).expect("open by name");
    assert!(again.warnings.iter().all(|w| !w.contains("starts afresh")), "{:?}", again.warnings);
}

/// Found by a probe: with `session_linger_secs = 0` a restart dropped the checkpoint's named
/// sessions, and an open of one started again from minibatch 0 without a word; so did a name
/// opened again within one run. Both are now told they start afresh.
#[test]
fn with_no_linger_a_name_opened_again_is_told_it_starts_afresh() {
    let dir = tempfile::tempdir().expect("tempdir");
    let datasets = dataset(dir.path());
    write_config(dir.path(), DAEMON, &datasets);
    let mut d = Daemon::start(dir.path(), &[]);
    let mut s = d.client().open("train", &named("kept")).expect("open");
    take(&mut s, 5);
    s.close().expect("close");
    assert_eq!(d.stop().code(), Some(0));
    let none = DAEMON.replace("session_linger_secs = 600", "session_linger_secs = 0");
    write_config(dir.path(), &none, &datasets);
    let d = Daemon::start(dir.path(), &[]);
    let told = |s: &Session, name: &str| {
        s.warnings.iter().any(|w| w.contains(&format!("{name:?}")) && w.contains("session_linger_secs is 0"))
    };
    for name in ["kept", "in_run"] {
        if name == "in_run" {
            let mut s = d.client().open("train", &named(name)).expect("open");
            take(&mut s, 2);
            s.close().expect("close");
        }
        let mut again = d.client().open("train", &named(name)).expect("open by name");
        assert_eq!(again.resumed, None, "{name}: nothing is kept");
        assert!(told(&again, name), "{name}: {:?}", again.warnings);
        assert_eq!(again.next_minibatch().expect("next").expect("a minibatch").meta.index, 0);
    }
}

#[test]
fn a_sigterm_answered_within_the_grace_resumes_exactly_after_the_last_minibatch_taken() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut d = start(dir.path());
    let mut s = d.client().open("train", &named("prompt")).expect("open");
    let last = take(&mut s, 6);
    d.signal(rustix::process::Signal::TERM);
    // The trainer asks again: it gets what was announced, then `shutting_down`, and reports.
    let last = take_until(&mut s, ErrorCode::ShuttingDown, last);
    assert_eq!(d.wait().code(), Some(0));
    assert_eq!(s.state().expect("the final state, known locally").minibatches, last + 1);
    let d = Daemon::start(dir.path(), &[]);
    assert_eq!(resume(&d, "prompt"), (("checkpoint".to_owned(), true), last + 1));
}

/// Rewrites the config with the dataset `train` or with another in its place, reloads, and
/// waits until the reload is applied and the daemon serves `train` or refuses it as unknown. (It
/// once only opened `train` until it was refused: under load an open before the reload landed
/// left one more session lingering, and the test that counts lingering sessions waited for good.)
fn reload(d: &Daemon, with_train: bool) {
    let datasets = if with_train {
        dataset_config(&d.dir)
    } else {
        dataset_config(&d.dir).replace("datasets.train", "datasets.other")
    };
    let before = d.reloads();
    write_config(&d.dir, DAEMON, &datasets);
    d.signal(rustix::process::Signal::HUP);
    d.wait_reloads(before + 1);
    let start = Instant::now();
    loop {
        match d.client().open("train", &options(4)) {
            Ok(_) if with_train => return,
            Err(ClientError::Daemon { code: ErrorCode::UnknownDataset, .. }) if !with_train => return,
            _ => {}
        }
        assert!(start.elapsed() < DEADLINE, "the reload was never applied");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_reload_that_removes_and_re_adds_a_dataset_resumes_exactly_when_the_client_reports() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(dir.path());
    let mut s = d.client().open("train", &named("moved")).expect("open");
    let last = take(&mut s, 5);
    reload(&d, false);
    let last = take_until(&mut s, ErrorCode::UnknownDataset, last);
    drop(s);
    reload(&d, true);
    assert_eq!(resume(&d, "moved"), (("lingering".to_owned(), true), last + 1));
}

/// Found by a probe: a reload that swapped two streams' columns left positions and identity as
/// they were, and a session resumed by name went on `exact` with the other column in each stream,
/// told nothing. A resume under definitions that decode the values otherwise is now told so (the
/// position stays exact); one under the same definitions is not.
#[test]
fn a_resume_after_a_reload_that_decodes_otherwise_is_told_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(dir.path());
    let mut s = d.client().open("train", &named("decoded")).expect("open");
    let last = take(&mut s, 3);
    let saved = s.close().expect("close");
    assert!(saved.decode_digest.is_some(), "{saved:?}");
    let again = d.client().open("train", &named("decoded")).expect("resume, same definitions");
    assert!(again.warnings.is_empty(), "{:?}", again.warnings);
    let saved = again.close().expect("close");
    let before = d.reloads();
    let datasets = dataset_config(&d.dir)
        .replace("chunk_size_bytes = 2000\n", "chunk_size_bytes = 2000\nprecision = \"float64\"\n");
    write_config(&d.dir, DAEMON, &datasets);
    d.signal(rustix::process::Signal::HUP);
    d.wait_reloads(before + 1);
    let told = |s: &Session| s.warnings.iter().any(|w| w.contains("decodes its values otherwise"));
    let start = Instant::now();
    let mut again = loop {
        // The reload indexes the dataset again: until then the old version serves.
        let s = d.client().open("train", &named("decoded")).expect("resume by name");
        if told(&s) {
            break s;
        }
        let warnings = s.warnings.clone();
        s.close().expect("close");
        assert!(start.elapsed() < DEADLINE, "never told: {warnings:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(again.resumed.as_ref().map(|r| r.exact), Some(true), "the position is exact");
    assert_eq!(again.next_minibatch().expect("next").expect("a minibatch").meta.index, last + 1);
    drop(again);
    let by_state = d
        .client()
        .open("train", &SessionOptions { resume: Some(saved.clone()), ..named("by_state") })
        .expect("resume by state");
    assert!(told(&by_state), "{:?}", by_state.warnings);
    // A job continued from its workers' states is told too.
    let by_job = d
        .client()
        .open("train", &SessionOptions { resume_job: Some(vec![saved]), ..named("by_job") })
        .expect("resume_job");
    assert!(told(&by_job), "{:?}", by_job.warnings);
}

#[test]
fn a_reload_that_removes_and_re_adds_a_dataset_under_a_silent_trainer_is_not_resumed_as_exact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(dir.path());
    let mut s = d.client().open("train", &named("silent")).expect("open");
    let last = take(&mut s, 5);
    reload(&d, false);
    // The grace passes: the daemon parks the session without the trainer's report.
    let state = d.dir.join("state");
    let start = Instant::now();
    while !support::daemon::http_get(&state, "/metrics")
        .is_some_and(|(_, m)| m.contains("minibatchd_sessions{state=\"lingering\"} 1"))
    {
        assert!(start.elapsed() < DEADLINE, "the session was never parked");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(s);
    reload(&d, true);
    let ((from, exact), first) = resume(&d, "silent");
    assert_eq!(from, "lingering");
    assert!(first <= last, "nothing is skipped: resumed at {first}, the trainer took up to {last}");
    // Before: `{from: "lingering", exact: true}` with the unreported minibatches delivered again.
    assert!(!exact, "minibatches {first}..={last} come again: the resume must not say exact");
}

#[test]
fn an_open_whose_checkpoint_cannot_be_written_on_a_full_disk_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SmallDisk::mount(&dir.path().join("state"));
    let mut d = start(dir.path());
    let filler = disk.fill();
    match d.client().open("train", &named("full")) {
        Err(ClientError::Daemon { code: ErrorCode::Internal, message, .. }) => {
            assert!(message.contains("checkpoint.json") && message.contains("No space left"), "{message}");
        }
        Ok(_) => panic!(
            "a session its checkpoint does not hold was opened (before: after a kill -9 it silently restarted at 0)"
        ),
        Err(e) => panic!("expected an internal error naming the checkpoint, got {e}"),
    }
    // Space again: the session opens, and a crash after it is signalled on resume.
    std::fs::remove_file(filler).expect("free the disk");
    let mut s = d.client().open("train", &named("full")).expect("open once the disk has room");
    let last = take(&mut s, 3);
    d.signal(rustix::process::Signal::KILL);
    let _ = d.wait();
    drop(s);
    let d = Daemon::start(dir.path(), &[]);
    let ((from, exact), first) = resume(&d, "full");
    assert_eq!((from.as_str(), exact), ("checkpoint", false));
    assert!(first <= last);
    drop(d);
    drop(disk);
}

/// Issue 36, finding 6: a full `state_dir` at the daemon's first start printed "No space left on
/// device" twice and no path. It now says which file it could not write, once.
#[test]
fn a_full_state_dir_at_start_names_the_file_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = SmallDisk::mount(&dir.path().join("state"));
    let datasets = dataset(dir.path());
    write_config(dir.path(), DAEMON, &datasets);
    disk.fill();
    let mut run = support::daemon::KillOnDrop(
        std::process::Command::new(support::BIN)
            .args(["run", "--config"])
            .arg(dir.path().join("minibatchd.toml"))
            .env("MINIBATCHD_LOG", "error")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run"),
    );
    // A daemon that started regardless would never exit: wait with a deadline.
    let start = Instant::now();
    let status = loop {
        if let Some(status) = run.0.try_wait().expect("wait") {
            break status;
        }
        assert!(start.elapsed() < DEADLINE, "the daemon started on a full state_dir");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(1));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut run.0.stderr.take().expect("stderr"), &mut err).expect("stderr");
    assert_eq!(err.matches("No space left on device").count(), 1, "{err}");
    assert!(err.contains(&format!("{}/", dir.path().join("state").display())), "names the file: {err}");
    drop(disk);
}

/// A state says which of several workers it is: workers stop at different places, so one
/// worker's state given to another worker (or at another worker count) would repeat and skip
/// sequences, and is refused; the same worker at the same count resumes exactly, and a
/// one-worker session's state resumes any worker of any count (found by a hostile probe: a
/// 3-worker run resumed at 2 from each rank's own state repeated two sequences and skipped two).
#[test]
fn a_worker_state_resumes_only_its_worker_at_its_worker_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(dir.path());
    let worker = |rank: u32, of: u32| SessionOptions {
        rank: Some(rank.into()),
        num_workers: Some(of.into()),
        randomize: Some(false),
        max_sweeps: Some(1),
        ..options(4)
    };
    let keys = |s: &mut Session, n: Option<usize>| -> Vec<u64> {
        let mut out = Vec::new();
        while n.is_none_or(|n| out.len() < n) {
            let Some(mb) = s.next_minibatch().expect("next") else { break };
            out.push(mb.meta.position);
            s.release(mb);
        }
        out
    };
    // Three workers, three minibatches each; their states.
    let mut states = Vec::new();
    for rank in 0..3 {
        let mut s = d.client().open("train", &worker(rank, 3)).expect("open");
        keys(&mut s, Some(3));
        let st = s.close().expect("close");
        assert_eq!(st.worker.map(|w| (w.rank, w.of)), Some((u64::from(rank), 3)), "{st:?}");
        states.push(st);
    }
    // Another worker's state, or the same worker at another count: refused, naming both.
    for (state, rank, of) in [(&states[0], 1, 3), (&states[1], 1, 2), (&states[2], 0, 1)] {
        let o = SessionOptions { resume: Some(state.clone()), ..worker(rank, of) };
        match d.client().open("train", &o) {
            Err(ClientError::Daemon { code: ErrorCode::ResumeMismatch, message, .. }) => {
                assert!(message.contains("worker's position is its own"), "{message}");
            }
            other => panic!("a foreign worker's state must be refused, got {:?}", other.map(|mut s| s.state())),
        }
    }
    // A worker no session writes (an edited state: a rank past its count, a count under 2) is
    // called that, not another worker's (a probe's `rank 0 of 1` read "worker 0 of 1's and this
    // session is a session of one worker").
    for (rank, of, session) in [(0, 1, worker(0, 1)), (3, 2, worker(1, 2)), (0, 0, worker(0, 1))] {
        let mut forged = states[0].clone();
        forged.worker = Some(minibatchd_client::protocol::WorkerOf { rank, of });
        match d.client().open("train", &SessionOptions { resume: Some(forged), ..session }) {
            Err(ClientError::Daemon { code: ErrorCode::ResumeMismatch, message, .. }) => {
                assert!(message.contains(&format!("(rank {rank}, of {of}) is not one a session writes")), "{message}");
            }
            other => panic!("a forged worker must be refused, got {:?}", other.map(|mut s| s.state())),
        }
    }
    // Its own worker at its count: exactly where it stopped.
    let o = SessionOptions { resume: Some(states[1].clone()), ..worker(1, 3) };
    let mut s = d.client().open("train", &o).expect("its own state");
    let next = keys(&mut s, Some(1));
    let mut fresh = d.client().open("train", &worker(1, 3)).expect("fresh");
    assert_eq!(next, keys(&mut fresh, Some(4))[3..].to_vec(), "the fourth minibatch of worker 1");
    // A one-worker session's state carries no worker and resumes a worker of any count.
    let mut one = d.client().open("train", &worker(0, 1)).expect("one worker");
    keys(&mut one, Some(2));
    let st = one.close().expect("close");
    assert_eq!(st.worker, None);
    let st_one = st.clone();
    let o = SessionOptions { resume: Some(st), ..worker(1, 2) };
    d.client().open("train", &o).expect("a one-worker state resumes worker 1 of 2");
    // resume_job takes every worker's state in rank order, and refuses them out of it.
    let o = SessionOptions { resume_job: Some(states.clone()), ..worker(0, 2) };
    d.client().open("train", &o).expect("every worker's state, in rank order");
    let swapped = vec![states[1].clone(), states[0].clone(), states[2].clone()];
    let o = SessionOptions { resume_job: Some(swapped), ..worker(0, 2) };
    match d.client().open("train", &o) {
        Err(ClientError::Daemon { code: ErrorCode::ResumeMismatch, message, .. }) => {
            assert!(message.contains("in rank order"), "{message}");
        }
        other => panic!("states out of rank order must be refused, got {:?}", other.map(|mut s| s.state())),
    }
    // Found by a probe: a one-worker session's state in place of worker 0 was taken with workers
    // 1 and 2 of 3 (it names no worker, and such states were taken as given).
    let mixed = vec![st_one.clone(), states[1].clone(), states[2].clone()];
    let o = SessionOptions { resume_job: Some(mixed), ..worker(0, 2) };
    match d.client().open("train", &o) {
        Err(ClientError::Daemon { code: ErrorCode::ResumeMismatch, message, .. }) => {
            assert!(message.contains("state 0 of 3 names no worker"), "{message}");
        }
        other => panic!("a one-worker state among a job's must be refused, got {:?}", other.map(|mut s| s.state())),
    }
    // Alone, it is a one-worker run's whole job.
    let o = SessionOptions { resume_job: Some(vec![st_one]), ..worker(0, 2) };
    d.client().open("train", &o).expect("a one-worker run continued on two workers");
}

/// Found by a probe: under a file-size limit (`ulimit -f`, systemd's `LimitFSIZE=`) a parsed-cache
/// entry or a gzip input's decompressed copy past it killed the daemon with SIGXFSZ, with no log
/// line, and every session with it. Such a write now fails with EFBIG: the chunks are served from
/// their parse, the gzip dataset's open names its file and the limit, and the daemon stays up.
#[test]
fn a_write_past_the_file_size_limit_is_an_error_not_the_daemons_end() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().expect("tempdir");
    // About 2 MB of CTF in chunks of 1 MiB: parsed entries past a limit of 400 KiB.
    let text = train_ctf().repeat(300);
    write(dir.path(), "big.ctf", text.clone());
    // A gzip input (deepx libsvm: CTF is read as text) of about 1 MB decompressed.
    let svm = (0..40_000).fold(String::new(), |mut svm, i| {
        use std::fmt::Write as _;
        let _ = writeln!(svm, "{} 1:{}.25 7:0.5", i % 2, i % 97);
        svm
    });
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(svm.as_bytes()).expect("gzip");
    std::fs::write(dir.path().join("big.svm.gz"), gz.finish().expect("gzip")).expect("write");
    let datasets = format!(
        "[datasets.plain]\nformat = \"ctf\"\nfiles = [\"{}\"]\nchunk_size_bytes = 1048576\n{}\
         [datasets.packed]\nformat = \"libsvm\"\nfiles = [\"{}\"]\n",
        dir.path().join("big.ctf").display(),
        TRAIN_STREAMS_TOML.replace("[datasets.train.", "[datasets.plain."),
        dir.path().join("big.svm.gz").display()
    );
    write_config(dir.path(), DAEMON, &datasets);
    let mut d = Daemon::start_with_file_size_limit(dir.path(), 800);
    let opts = SessionOptions { full_sweep: true, ..options(64) };
    let mut s = d.client().open("plain", &opts).expect("open");
    let mut got = Vec::new();
    while let Some(mb) = s.next_owned().expect("every minibatch, its chunks served from the parse") {
        got.push(support::daemon::json(&mb, &["features", "labels"]));
    }
    assert_eq!(got, d.dump("plain", &["--minibatch-size", "64", "--full-sweep"]));
    assert!(d.running(), "the daemon lives on");
    match d.client().open("packed", &opts) {
        Err(ClientError::Daemon { message, .. }) => {
            assert!(message.contains("big.svm.gz") && message.contains("file-size limit"), "{message}");
        }
        Ok(_) => panic!("a dataset whose decompressed copy could not be written was opened"),
        Err(e) => panic!("expected the daemon's error naming the file, got {e}"),
    }
    // A ring past the limit (its memfd is held to it too): refused, naming the limit and what to
    // change (found by a probe: the refusal said only "ftruncate: File too large").
    let big = SessionOptions { prefetch: Some(4), slot_size_bytes: Some(1 << 20), ..options(64) };
    match d.client().open("plain", &big) {
        Err(ClientError::Daemon { code: ErrorCode::ResourceExhausted, message, .. }) => {
            assert!(message.contains("file-size limit") && message.contains("slot_size_bytes"), "{message}");
        }
        Ok(_) => panic!("a ring past the file-size limit was opened"),
        Err(e) => panic!("expected resource_exhausted, got {e}"),
    }
    assert!(d.running(), "the daemon lives on");
}

/// Found by a probe: `state_dir` wiped while the daemon ran took its lock file with it; a second
/// daemon then started on the same directory, its checkpoints overwrote the first one's, and a
/// resume by name after a restart began again at minibatch 0, unsaid. The daemon looks at its
/// lock before each checkpoint: removed, it is taken again; held by another process, nothing is
/// written and the `open` is refused, naming it.
#[test]
fn a_lock_file_removed_under_the_daemon_is_taken_again_before_its_next_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = start(dir.path());
    let lock = dir.path().join("state/daemon.lock");
    let _a = d.client().open("train", &named("a")).expect("open");
    std::fs::remove_file(&lock).expect("remove the lock file");
    let _b = d.client().open("train", &named("b")).expect("open, the lock taken again");
    assert_eq!(std::fs::read_to_string(&lock).expect("the lock file again").trim(), d.pid().to_string());
    // Another process holds a new lock file: no checkpoint is written over its directory.
    std::fs::remove_file(&lock).expect("remove the lock file");
    let other = std::fs::File::create(&lock).expect("another lock file");
    rustix::fs::flock(&other, rustix::fs::FlockOperation::NonBlockingLockExclusive).expect("flock");
    match d.client().open("train", &named("c")) {
        Err(ClientError::Daemon { code: ErrorCode::Internal, message, .. }) => {
            assert!(message.contains("another minibatchd") && message.contains("checkpoint"), "{message}");
        }
        Ok(_) => panic!("a session was opened whose checkpoint would be written into another daemon's state_dir"),
        Err(e) => panic!("expected internal, got {e}"),
    }
    drop(other);
    let _d = d.client().open("train", &named("d")).expect("open once the other process let go");
}
