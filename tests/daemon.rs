//! The daemon end to end: the real binary, a real socket, the Rust client (and the Python client
//! in `python_client_suite`). Every test starts its own daemon on a temp dir and stops it (SIGTERM,
//! then SIGKILL after a deadline) when the guard drops (`support::daemon`); every wait has a
//! deadline.

mod support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use minibatchd_client::protocol::{ErrorCode, SessionOptions, SessionState};
use minibatchd_client::{Client, ClientError};
use minibatchd_engine::minibatch::{MbData, Minibatch};
use support::daemon::{
    client_dir, drain, json, open_retrying, options, python, train_ctf, wide_ctf, Daemon, KillOnDrop, DEADLINE,
    TRAIN_STREAMS, TRAIN_STREAMS_TOML,
};
use support::{write, BIN};

/// Writes the data (`train`: [`train_ctf`]; `wide`: 20 sequences of 2000 entries, dim 5000, in
/// one chunk of ~270 KB) and the config the daemon runs with.
fn write_config(dir: &Path, memory_limit: u64) {
    let data = write(dir, "data.ctf", train_ctf());
    write(dir, "wide.ctf", wide_ctf(2000, 5000));
    let cfg = format!(
        r#"[daemon]
socket = "{dir}/mbd.sock"
metrics_listen = "127.0.0.1:0"
state_dir = "{dir}/state"
memory_limit_bytes = {memory_limit}
ring_slots = 3
slot_size_bytes = 65536
session_linger_secs = 60
# Fixed, so the read buffers' share of the limit (threads × the largest chunk: `wide`'s one
# chunk of ~270 KB) does not depend on the machine's core count.
parser_threads = 2

[datasets.train]
format = "ctf"
files = ["{data}"]
chunk_size_bytes = 300
{streams}
[datasets.train.sampling]
randomize = true
window_chunks = 4
seed = 0

[datasets.wide]
format = "ctf"
files = ["{dir}/wide.ctf"]

[datasets.wide.streams.words]
alias = "W"
dim = 5000
format = "sparse"
"#,
        dir = dir.display(),
        data = data.display(),
        streams = TRAIN_STREAMS_TOML,
    );
    write(dir, "minibatchd.toml", cfg);
}

/// A daemon on a temp dir of its own with [`write_config`]'s files.
fn start_with_limit(memory_limit: u64) -> Daemon {
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(dir.path(), memory_limit);
    Daemon::start_owning(dir)
}

/// [`start_with_limit`] 1 GiB: room for every session of a test.
fn start() -> Daemon {
    start_with_limit(1 << 30)
}

/// Sequence ids of a minibatch (first feature value of each sequence's first sample).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // the ids are small whole numbers written as values
fn sequence_ids(mb: &Minibatch) -> Vec<u32> {
    let s = &mb.streams[0];
    let MbData::Dense { values, .. } = &s.data else { panic!("dense features") };
    s.sequence_offsets[..s.sequence_offsets.len() - 1]
        .iter()
        .map(|&o| values.get_f64(usize::try_from(o).expect("offsets are non-negative") * 3) as u32)
        .collect()
}

#[test]
fn a_session_delivers_exactly_what_dump_prints() {
    let d = start();
    let cases: [(SessionOptions, Vec<&str>); 3] = [
        (
            SessionOptions { max_sweeps: Some(2), seed: Some(5), ..options(7) },
            vec!["--minibatch-size", "7", "--max-sweeps", "2", "--seed", "5"],
        ),
        (
            SessionOptions { full_sweep: true, randomize: Some(false), ..options(4) },
            vec!["--minibatch-size", "4", "--full-sweep", "--randomize", "false"],
        ),
        (
            SessionOptions {
                max_samples: Some(100),
                window_samples: Some(40),
                num_workers: Some(2),
                rank: Some(1),
                ..options(9)
            },
            vec![
                "--minibatch-size",
                "9",
                "--max-samples",
                "100",
                "--window-samples",
                "40",
                "--workers",
                "2",
                "--rank",
                "1",
            ],
        ),
    ];
    for (opts, args) in cases {
        let mut s = d.client().open("train", &opts).expect("open");
        let got = drain(&mut s, 10_000);
        let want = d.dump("train", &args);
        assert!(!want.is_empty());
        assert_eq!(got, want, "options {opts:?}");
        s.close().expect("close");
    }
}

#[test]
fn concurrent_ranks_get_disjoint_data_covering_the_sweep() {
    let d = start();
    let socket = d.socket.clone();
    let workers = 3u64;
    let handles: Vec<_> = (0..workers)
        .map(|rank| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let opts = SessionOptions {
                    full_sweep: true,
                    num_workers: Some(workers),
                    rank: Some(rank),
                    seed: Some(1),
                    ..options(6)
                };
                let mut s = Client::connect(&socket).expect("connect").open("train", &opts).expect("open");
                let mut ids = Vec::new();
                let mut lines = Vec::new();
                while let Some(mb) = s.next_owned().expect("next") {
                    ids.extend(sequence_ids(&mb));
                    lines.push(json(&mb, TRAIN_STREAMS));
                }
                (ids, lines)
            })
        })
        .collect();
    let mut all = BTreeSet::new();
    let mut total = 0;
    for (rank, h) in handles.into_iter().enumerate() {
        let (ids, lines) = h.join().expect("rank thread");
        let r = rank.to_string();
        assert_eq!(
            lines,
            d.dump("train", &["--minibatch-size", "6", "--full-sweep", "--seed", "1", "--workers", "3", "--rank", &r]),
            "rank {rank}"
        );
        assert!(!ids.is_empty(), "rank {rank} got no data");
        total += ids.len();
        all.extend(ids);
    }
    assert_eq!(total, all.len(), "a sequence went to two ranks");
    assert_eq!(all, (0..150).collect::<BTreeSet<u32>>(), "the sweep is covered");
}

/// A worker that gets no data is told so at `open` (`opened.warnings`): randomized with more
/// workers than chunks, with the chunk size to set; with more workers than sequences, with the
/// most workers that get some; in file order likewise. One that gets data is not told anything.
#[test]
fn a_worker_that_gets_no_data_is_told_at_open() {
    let d = start();
    let out = support::command("index", &d.config(), "train").output().expect("index");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    // "train: S sequences, N samples, C chunks"
    let chunks: u64 =
        text.split(", ").last().and_then(|s| s.split(' ').next()).and_then(|n| n.parse().ok()).expect(&text);
    assert!(chunks > 1 && chunks < 100, "{text}");
    let open = |workers: u64, rank: u64, randomize: bool| {
        let opts = SessionOptions {
            full_sweep: true,
            num_workers: Some(workers),
            rank: Some(rank),
            randomize: Some(randomize),
            ..options(6)
        };
        Client::connect(&d.socket).expect("connect").open("train", &opts).expect("open")
    };
    let mut fine = open(3, 2, true);
    assert!(fine.warnings.is_empty(), "{:?}", fine.warnings);
    assert!(fine.next_owned().expect("next").is_some());
    let w = chunks + 1;
    let mut chunkless = open(w, chunks, true);
    assert_eq!(chunkless.warnings.len(), 1, "{:?}", chunkless.warnings);
    assert!(
        chunkless.warnings[0].contains(&format!("worker {chunks} of {w} gets no data")),
        "{}",
        chunkless.warnings[0]
    );
    assert!(chunkless.warnings[0].contains("chunk_size_bytes"), "{}", chunkless.warnings[0]);
    assert!(chunkless.next_owned().expect("next").is_none());
    for randomize in [true, false] {
        let mut empty = open(100_000, 99_999, randomize);
        assert_eq!(empty.warnings.len(), 1, "{:?}", empty.warnings);
        // Randomized, the chunks bound the workers that get data before the sequences do.
        let most = if randomize { chunks } else { 150 };
        assert!(
            empty.warnings[0].contains("gets no data")
                && empty.warnings[0].contains(&format!("use at most {most} workers")),
            "{}",
            empty.warnings[0]
        );
        assert!(empty.next_owned().expect("next").is_none());
    }
    // In file order a worker past the sequences' count but within the epoch gets data: no warning.
    let mut file_order = open(149, 148, false);
    assert!(file_order.warnings.is_empty(), "{:?}", file_order.warnings);
    assert!(file_order.next_owned().expect("next").is_some());
}

/// Found by a probe: with `minibatch_size` 7 over 5 workers the shares are 2, 2, 1, 1, 1 samples a
/// minibatch; the workers of 1 need about twice the steps, and equal steps cut them to the fewest
/// without a word — a third of the epoch dropped. Every worker is now told at `open` how many
/// minibatches are kept, the most any worker had, why, and what keeps every sample; each then
/// gets exactly the count it was told. With `tail = "pad"` nothing is dropped: no such warning.
#[test]
fn equal_steps_that_drop_more_than_a_tail_say_so_at_every_worker() {
    let d = start();
    let open = |rank: u64, tail: Option<&str>| {
        let opts = SessionOptions {
            max_sweeps: Some(2),
            num_workers: Some(5),
            rank: Some(rank),
            equal_steps: true,
            tail: tail.map(|t| serde_json::from_value(serde_json::Value::String(t.to_owned())).expect("tail")),
            ..options(7)
        };
        d.client().open("train", &opts).expect("open")
    };
    let mut kept = BTreeSet::new();
    for rank in 0..5 {
        let mut s = open(rank, None);
        let told: Vec<&String> = s.warnings.iter().filter(|w| w.contains("equal steps keep")).collect();
        assert_eq!(told.len(), 1, "rank {rank}: {:?}", s.warnings);
        let w = told[0].clone();
        assert!(w.contains("shares of 2 and 1 samples") && w.contains("tail = \"pad\""), "{w}");
        let said: u64 =
            w.split("keep ").nth(1).and_then(|t| t.split(' ').next()).and_then(|n| n.parse().ok()).expect(&w);
        assert_eq!(drain(&mut s, 100_000).len() as u64, said, "rank {rank} got what it was told: {w}");
        kept.insert(said);
    }
    assert_eq!(kept.len(), 1, "every worker keeps as many");
    for rank in 0..5 {
        let s = open(rank, Some("pad"));
        assert!(s.warnings.iter().all(|w| !w.contains("equal steps keep")), "{:?}", s.warnings);
    }
}

#[test]
fn resuming_with_a_saved_state_continues_exactly() {
    let d = start();
    let opts = SessionOptions { max_sweeps: Some(2), seed: Some(3), ..options(5) };
    let want = d.dump("train", &["--minibatch-size", "5", "--max-sweeps", "2", "--seed", "3"]);
    for cut in [0usize, 1, 13, 40] {
        let mut s = d.client().open("train", &opts).expect("open");
        let mut got = drain(&mut s, cut);
        let state = s.state().expect("state");
        assert_eq!(state.minibatches, cut as u64);
        drop(s); // no close: a dead connection, prefetched minibatches in flight
        let resume = SessionOptions { resume: Some(state), ..opts.clone() };
        let mut s = d.client().open("train", &resume).expect("resume");
        got.extend(drain(&mut s, 10_000));
        assert_eq!(got, want, "cut after {cut}");
    }
    // The minibatch size may change across a resume; other sampling options may not.
    let mut s = d.client().open("train", &opts).expect("open");
    drain(&mut s, 3);
    let state = s.close().expect("close");
    let other_seed = SessionOptions { resume: Some(state), seed: Some(4), ..opts };
    match d.client().open("train", &other_seed) {
        Err(ClientError::Daemon { code: ErrorCode::ResumeMismatch, .. }) => {}
        other => panic!("expected resume_mismatch, got {other:?}"),
    }
}

#[test]
fn a_named_session_is_resumable_after_its_connection_dies() {
    let d = start();
    let opts = SessionOptions { full_sweep: true, session: Some("trainer-0".into()), ..options(8) };
    let want = d.dump("train", &["--minibatch-size", "8", "--full-sweep"]);
    let mut s = d.client().open("train", &opts).expect("open");
    let mut got = drain(&mut s, 4);
    match d.client().open("train", &opts) {
        Err(ClientError::Daemon { code: ErrorCode::SessionBusy, .. }) => {}
        other => panic!("expected session_busy, got {other:?}"),
    }
    s.state().expect("report what was taken");
    // The connection dies just after the next open is sent (a trainer restarted at once after its
    // predecessor was killed): the open waits for its end instead of being refused (found by a
    // soak probe: 6 % of such opens were refused `session_busy`).
    let dying = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(s);
    });
    let mut s = d.client().open("train", &opts).expect("the open waits for the dying connection");
    dying.join().expect("the dying connection's thread");
    got.extend(drain(&mut s, 10_000));
    assert_eq!(got, want);
}

#[test]
fn a_closed_session_reopens_by_name_at_once() {
    // Room for one ring only (as in `ring_memory_is_reserved_and_given_back`): the reopen right
    // after `closed` neither finds the name busy nor the memory held by the closed session.
    let d = start_with_limit(3 << 19);
    let opts = SessionOptions {
        full_sweep: true,
        session: Some("trainer-0".into()),
        prefetch: Some(3),
        slot_size_bytes: Some(128 << 10),
        ..options(4)
    };
    let want = d.dump("train", &["--minibatch-size", "4", "--full-sweep"]);
    let mut got = Vec::new();
    for cut in [1usize, 2, 5] {
        let mut s = d.client().open("train", &opts).expect("reopen by name right after close");
        if let Some(r) = &s.resumed {
            assert!(r.exact, "closed with what it took: exact ({r:?})");
        }
        got.extend(drain(&mut s, cut));
        s.close().expect("close");
    }
    let mut s = d.client().open("train", &opts).expect("reopen by name right after close");
    got.extend(drain(&mut s, 10_000));
    assert_eq!(got, want);
}

#[test]
fn a_state_past_the_end_of_its_epoch_is_refused() {
    // Found by a probe: a hand-edited position past the epoch's end was taken and the session
    // ended at once, having delivered nothing — an endless one too (its epoch is 2^63 samples).
    let d = start();
    let full = SessionOptions { full_sweep: true, ..options(5) };
    let mut s = d.client().open("train", &full).expect("open");
    drain(&mut s, 10_000);
    let at_end = s.close().expect("close");
    // A full sweep's end: the sweep's samples (a sweep past it is past the last position).
    let sweep = at_end.position;
    assert!(sweep > 0, "{at_end:?}");
    // The state at the end resumes, and ends at once.
    let mut again = d
        .client()
        .open("train", &SessionOptions { resume: Some(at_end.clone()), ..full.clone() })
        .expect("resume at the end");
    assert!(again.next_minibatch().expect("next").is_none(), "nothing after the end");
    let mut s = d.client().open("train", &options(5)).expect("open");
    drain(&mut s, 3);
    let endless = s.close().expect("close");
    for (opts, state) in [
        (&full, SessionState { position: sweep + sweep, ..at_end.clone() }),
        // Past the end by the longest sequence (3 samples): no session's last minibatch ends there.
        (&full, SessionState { position: sweep + 3, ..at_end.clone() }),
        (&full, SessionState { position: u64::MAX, ..at_end.clone() }),
        (&options(5), SessionState { position: 1 << 63, ..endless.clone() }),
        (&options(5), SessionState { position: u64::MAX / 2, ..endless.clone() }),
    ] {
        let position = state.position;
        match d.client().open("train", &SessionOptions { resume: Some(state), ..opts.clone() }) {
            Err(ClientError::Daemon { code: ErrorCode::ResumeMismatch, message, .. }) => {
                assert!(message.contains("past the last"), "{message}");
            }
            other => panic!("position {position}: expected resume_mismatch, got {other:?}"),
        }
    }
    // An endless session's state far on still resumes.
    let state = SessionState { position: 1 << 62, ..endless };
    let mut far = d.client().open("train", &SessionOptions { resume: Some(state), ..options(5) }).expect("far on");
    assert!(far.next_minibatch().expect("next").is_some());
    // Found by a probe: a fresh endless session of a worker the block randomizer gives no chunk
    // starts at the epoch's end, and was refused for it as a resume past the end.
    let idle = SessionOptions { num_workers: Some(1000), rank: Some(999), ..options(5) };
    let mut s = d.client().open("train", &idle).expect("a worker without data opens");
    assert!(s.warnings.iter().any(|w| w.contains("gets no data")), "{:?}", s.warnings);
    assert!(s.next_minibatch().expect("next").is_none(), "nothing for a worker without data");
}

#[test]
fn a_state_before_the_start_of_its_sweep_is_refused() {
    // Found by a probe: a `sweep = 2` session resumed from a state edited to stand before sweep 2
    // delivered sweeps 0, 1 and 2 as its one epoch.
    let d = start();
    let mut s = d.client().open("train", &SessionOptions { full_sweep: true, ..options(5) }).expect("open");
    drain(&mut s, 10_000);
    let sweep = s.close().expect("close").position;
    let second = SessionOptions { sweep: Some(2), ..options(5) };
    let mut s = d.client().open("train", &second).expect("open");
    let first = s.next_minibatch().expect("next").expect("a minibatch");
    assert_eq!(first.meta.sweep, 2);
    let state = s.close().expect("close");
    assert!(sweep > 1 && state.position > 2 * sweep, "{state:?}");
    for position in [0, 100.min(sweep - 1), 2 * sweep - 1] {
        let edited = SessionState { position, ..state.clone() };
        match d.client().open("train", &SessionOptions { resume: Some(edited), ..second.clone() }) {
            Err(ClientError::Daemon { code: ErrorCode::ResumeMismatch, message, .. }) => {
                assert!(message.contains("before the first"), "{message}");
            }
            other => panic!("position {position}: expected resume_mismatch, got {other:?}"),
        }
    }
    // So is a job's worker there (found by a review: resume_job told it invalid_options).
    let job = vec![SessionState { position: 2 * sweep - 1, ..state.clone() }];
    match d.client().open("train", &SessionOptions { resume_job: Some(job), ..second.clone() }) {
        Err(ClientError::Daemon { code: ErrorCode::ResumeMismatch, message, .. }) => {
            assert!(message.contains("before the first"), "{message}");
        }
        other => panic!("resume_job before the sweep: expected resume_mismatch, got {other:?}"),
    }
    // The sweep's own start resumes, and the session delivers that sweep alone.
    let at_start = SessionState { position: 2 * sweep, ..state };
    let mut again = d.client().open("train", &SessionOptions { resume: Some(at_start), ..second }).expect("resume");
    let mut sweeps = std::collections::BTreeSet::new();
    while let Some(mb) = again.next_minibatch().expect("next") {
        sweeps.insert(mb.meta.sweep);
        again.release(mb);
    }
    assert_eq!(sweeps.into_iter().collect::<Vec<_>>(), [2]);
}

/// Found by a probe: a state edited one sample on, inside a sequence, was taken (the sampler moves
/// to the next sequence start, as CNTK's restore does) and that sequence was never delivered,
/// unsaid — through `resume` and a job worker's position alike. No session stops inside a
/// sequence: such a state is refused; every sequence start still resumes.
#[test]
fn a_state_inside_a_sequence_is_refused() {
    let d = start();
    let args = ["--max-sweeps", "2", "--seed", "3"];
    // Where sequences start: the positions after each minibatch of one sequence.
    let starts: std::collections::HashSet<u64> = d
        .dump("train", &[&["--minibatch-size", "1"][..], &args].concat())
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON")["position"].as_u64().expect("position"))
        .collect();
    let opts = SessionOptions { max_sweeps: Some(2), seed: Some(3), ..options(5) };
    let mut s = d.client().open("train", &opts).expect("open");
    drain(&mut s, 4);
    let state = s.close().expect("close");
    let refused = |o: SessionOptions| match d.client().open("train", &o) {
        Err(ClientError::Daemon { code: ErrorCode::ResumeMismatch, message, .. }) => {
            assert!(message.contains("inside a sequence"), "{message}");
            true
        }
        Ok(_) => false,
        Err(e) => panic!("expected resume_mismatch or an open, got {e}"),
    };
    let mut inside = 0;
    for position in state.position + 1..state.position + 7 {
        let edited = SessionState { position, ..state.clone() };
        let is_start = starts.contains(&position);
        assert_eq!(refused(SessionOptions { resume: Some(edited), ..opts.clone() }), !is_start, "position {position}");
        inside += usize::from(!is_start);
    }
    assert!(inside > 0, "sequences of 2 and 3 samples follow position {}", state.position);
    // A job of two workers, one of them moved inside a sequence, resumed by one worker.
    let workers = |rank| SessionOptions { num_workers: Some(2), rank: Some(rank), ..opts.clone() };
    let job: Vec<SessionState> = (0..2)
        .map(|rank| {
            let mut s = d.client().open("train", &workers(rank)).expect("open a worker");
            drain(&mut s, 3);
            s.close().expect("close")
        })
        .collect();
    let resume_job = |job: Vec<SessionState>| SessionOptions { resume_job: Some(job), ..opts.clone() };
    assert!(!refused(resume_job(job.clone())), "the job's own states resume");
    let late = usize::from(job[1].position > job[0].position);
    let position = (job[late].position + 1..job[late].position + 100)
        .find(|p| !starts.contains(p))
        .expect("a position inside a sequence");
    let mut edited = job;
    edited[late].position = position;
    assert!(refused(resume_job(edited)), "a worker at {position}, inside a sequence");
}

/// Found by a probe: a `minibatch_size` far past a finite epoch sized the ring for it (206 GB for
/// 2^31 - 1) and the open was refused, where dump gives the epoch as one minibatch. A slot holds
/// no more than the epoch.
#[test]
fn a_minibatch_size_past_a_finite_epoch_is_served_as_dump_serves_it() {
    let d = start();
    let huge = (1u64 << 31) - 1;
    let opts = SessionOptions { full_sweep: true, ..options(huge) };
    let want = d.dump("train", &["--minibatch-size", &huge.to_string(), "--full-sweep"]);
    assert_eq!(want.len(), 1, "the sweep in one minibatch");
    let mut s = d.client().open("train", &opts).expect("open");
    assert_eq!(drain(&mut s, 10), want);
    // An endless epoch has no such bound: refused for memory, saying what sizes the ring.
    match d.client().open("train", &options(huge)) {
        Err(ClientError::Daemon { code: ErrorCode::ResourceExhausted, message, .. }) => {
            assert!(message.contains("minibatch_size"), "{message}");
        }
        other => panic!("expected resource_exhausted, got {other:?}"),
    }
}

/// A slot asked for at `open` smaller than a minibatch of the dataset: the daemon stops the
/// producer with `minibatch_too_large` (the bytes needed, nothing taken), and the client reopens
/// the session there with slots that hold it; the sweep is `dump`'s.
#[test]
fn a_minibatch_larger_than_a_slot_reopens_the_session_with_a_bigger_slot() {
    let d = start();
    let small = SessionOptions { full_sweep: true, slot_size_bytes: Some(4096), ..options(4) };
    let mut s = d.client().open("wide", &small).expect("open");
    let got: Vec<String> =
        std::iter::from_fn(|| s.next_owned().expect("next")).map(|mb| json(&mb, &["words"])).collect();
    assert_eq!(s.slot_regrowths, 1, "one reopen, with slots that hold every minibatch of the sweep");
    assert_eq!(got, d.dump("wide", &["--minibatch-size", "4", "--full-sweep"]));
}

/// Found by a probe: the slot size raised at `open` counted the dense streams alone, so a dense
/// stream with a one-hot sparse label (the commonest CTF shape) overflowed a slot sized for its
/// dense values (`minibatch_too_large`: 90,880 bytes needed, 90,112 in a slot). A sparse stream
/// counts its sample offsets and one entry per sample. The tensors' table is counted too: 40
/// streams with 103-character names needed 19,520 bytes where 16,384 were raised. And a `csv`
/// string stream of three columns has three strings a sample (found by a probe: 14,464 bytes
/// needed, 12,288 raised). A whole file's contents count in full: the largest files' sizes.
#[test]
fn a_one_hot_label_beside_dense_values_fits_the_slot_raised_at_open() {
    use std::fmt::Write as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut onehot, mut many, mut csv) = (String::new(), String::new(), String::new());
    for id in 0..600u32 {
        let _ = write!(onehot, "{id} |F");
        for k in 0..32 {
            let _ = write!(onehot, " {}", (id + k) % 10);
        }
        let _ = writeln!(onehot, " |L {}:1", id % 7);
        let _ = writeln!(csv, "{},b,c", id % 10);
        for k in 0..40 {
            let _ = write!(many, "|S{k} {}{}", id % 10, if k == 39 { "\n" } else { " " });
        }
    }
    let onehot = write(dir.path(), "onehot.ctf", onehot);
    let many = write(dir.path(), "many.ctf", many);
    let csv = write(dir.path(), "strings.csv", csv);
    // Files of 1 byte to 24 KB: whole files, whose contents a slot holds in full.
    std::fs::create_dir(dir.path().join("files")).expect("mkdir");
    for k in 0..30u32 {
        let size = (k as usize * 7919) % 24_000 + 1;
        std::fs::write(dir.path().join(format!("files/{k:02}.bin")), vec![b'a' + (k % 26) as u8; size]).expect("write");
    }
    let d = dir.path().display();
    let mut cfg = format!(
        "[daemon]\nsocket = \"{d}/mbd.sock\"\nmetrics_listen = \"127.0.0.1:0\"\nstate_dir = \"{d}/state\"\n\
         ring_slots = 3\nslot_size_bytes = 4096\nparser_threads = 2\n\n\
         [datasets.onehot]\nformat = \"ctf\"\nfiles = [\"{onehot}\"]\nchunk_size_bytes = 4096\n\
         [datasets.onehot.streams.features]\nalias = \"F\"\ndim = 32\nformat = \"dense\"\n\
         [datasets.onehot.streams.labels]\nalias = \"L\"\ndim = 7\nformat = \"sparse\"\n\
         [datasets.strings]\nformat = \"csv\"\nfiles = [\"{csv}\"]\ncolumns = 3\n\
         [datasets.strings.streams.s]\ncolumns = [0, 1, 2]\ndtype = \"string\"\n\
         [datasets.files]\nformat = \"whole_file\"\nfiles = [\"{d}/files/*.bin\"]\n\
         [datasets.many]\nformat = \"ctf\"\nfiles = [\"{many}\"]\n",
        onehot = onehot.display(),
        many = many.display(),
        csv = csv.display(),
    );
    let long: Vec<String> = (0..40).map(|k| format!("{}_{k:02}", "a_stream_with_a_long_name".repeat(4))).collect();
    for (k, name) in long.iter().enumerate() {
        let _ = write!(cfg, "[datasets.many.streams.{name}]\nalias = \"S{k}\"\ndim = 1\nformat = \"dense\"\n");
    }
    write(dir.path(), "minibatchd.toml", cfg);
    let d = Daemon::start_owning(dir);
    let long: Vec<&str> = long.iter().map(String::as_str).collect();
    let cases: [(&str, &[&str], &[u64]); 4] = [
        ("files", &["contents", "path"], &[1, 8, 30]),
        ("onehot", &["features", "labels"], &[1, 31, 64, 100, 256, 300, 600]),
        ("strings", &["s"], &[1, 100, 600]),
        ("many", &long, &[1, 7]),
    ];
    for (dataset, names, sizes) in cases {
        for &size in sizes {
            let opts = SessionOptions { full_sweep: true, ..options(size) };
            let mut s = d.client().open(dataset, &opts).expect("open");
            let mut got = Vec::new();
            loop {
                match s.next_owned() {
                    Ok(Some(mb)) => got.push(json(&mb, names)),
                    Ok(None) => break,
                    Err(e) => panic!("{dataset}, minibatch size {size}: {e}"),
                }
            }
            let want = d.dump(dataset, &["--minibatch-size", &size.to_string(), "--full-sweep"]);
            assert_eq!(got, want, "{dataset}, minibatch size {size}");
        }
    }
}

/// Samples with more sparse entries than the daemon can bound at `open` (0 to 1,180 a sample
/// under 4 KiB slots): the Rust client reopens the session where it stands with larger slots, as
/// the Python client does — the sweeps equal `dump`, a minibatch held across the reopens stays
/// readable and unchanged, and a state taken after them resumes exactly.
#[test]
fn a_minibatch_too_large_for_the_slots_reopens_the_session_with_larger_ones() {
    use std::fmt::Write as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut text = String::new();
    for i in 0..60u32 {
        let _ = write!(text, "{i} |F {i} |W");
        for k in 0..(i * 37) % 60 * 20 {
            let _ = write!(text, " {}:{}", (k * 7 + i) % 5000, k % 9);
        }
        text.push('\n');
    }
    let data = write(dir.path(), "heavy.ctf", text);
    let d = dir.path().display();
    let cfg = format!(
        "[daemon]\nsocket = \"{d}/mbd.sock\"\nmetrics_listen = \"127.0.0.1:0\"\nstate_dir = \"{d}/state\"\n\
         ring_slots = 3\nslot_size_bytes = 4096\n\n\
         [datasets.train]\nformat = \"ctf\"\nfiles = [\"{}\"]\nchunk_size_bytes = 4096\n\
         [datasets.train.streams.id]\nalias = \"F\"\ndim = 1\nformat = \"dense\"\n\
         [datasets.train.streams.words]\nalias = \"W\"\ndim = 5000\nformat = \"sparse\"\n",
        data.display()
    );
    write(dir.path(), "minibatchd.toml", cfg);
    let d = Daemon::start_owning(dir);
    let names = ["id", "words"];
    let want = d.dump("train", &["--minibatch-size", "3", "--max-sweeps", "2", "--seed", "2"]);
    let opts = SessionOptions { max_sweeps: Some(2), seed: Some(2), ..options(3) };
    let mut s = d.client().open("train", &opts).expect("open");
    let held = s.next_minibatch().expect("next").expect("a minibatch");
    let held_json = json(&s.copy(&held).expect("copy"), &names);
    let (mut got, mut state) = (vec![held_json.clone()], None);
    while let Some(mb) = s.next_owned().expect("every minibatch, the slots regrown as needed") {
        got.push(json(&mb, &names));
        if got.len() == 12 {
            state = Some(s.state().expect("state"));
        }
    }
    assert!(s.slot_regrowths >= 1, "the data needs larger slots than open raised");
    let again = json(&s.copy(&held).expect("the held minibatch's ring stays mapped"), &names);
    assert_eq!(again, held_json, "a minibatch held across the reopens is unchanged");
    s.release(held);
    assert_eq!(got, want);
    let opts = SessionOptions { resume: state, ..opts };
    let mut resumed = d.client().open("train", &opts).expect("resume");
    let mut rest = Vec::new();
    while let Some(mb) = resumed.next_owned().expect("next") {
        rest.push(json(&mb, &names));
    }
    assert_eq!(rest, want[12..]);
}

fn raw(socket: &Path) -> UnixStream {
    let s = UnixStream::connect(socket).expect("connect");
    s.set_read_timeout(Some(DEADLINE)).expect("timeout");
    s
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut v = u32::try_from(body.len()).expect("a test frame is small").to_le_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

fn reply(s: &mut UnixStream) -> Option<serde_json::Value> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut body).ok()?;
    serde_json::from_slice(&body).ok()
}

/// One frame body, whatever it holds (binary frames included).
fn raw_frame(s: &mut UnixStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut body).ok()?;
    Some(body)
}

/// A raw protocol-1 connection with the session of `open` (an `open` message) opened.
fn raw_opened(socket: &Path, open: &[u8]) -> UnixStream {
    let mut s = raw(socket);
    s.write_all(&frame(br#"{"type":"hello","version":1}"#)).expect("write");
    assert_eq!(reply(&mut s).expect("hello")["type"], "hello");
    s.write_all(&frame(open)).expect("write");
    assert_eq!(reply(&mut s).expect("opened")["type"], "opened");
    s
}

/// Sends `close` (a close message) on `s` and returns the `closed` reply, past any `ready`.
fn closed(s: &mut UnixStream, close: &[u8]) -> serde_json::Value {
    s.write_all(&frame(close)).expect("write");
    loop {
        let m = reply(s).expect("closed");
        if m["type"] == "closed" {
            return m;
        }
    }
}

fn code(v: Option<&serde_json::Value>) -> String {
    v.and_then(|v| v["code"].as_str()).unwrap_or("<none>").to_owned()
}

/// An `open` whose client goes away before its answer gives up its walk for equal steps (found by
/// a probe: such a walk kept a core busy for 65 s after its client had gone) and gives back what
/// it reserved: the name opens again at once. Without the cancellation the walk (3,000
/// minibatches a worker, checked every 1,024) ends and the session is opened and parked instead.
#[test]
fn an_open_whose_client_went_away_is_given_up() {
    let d = start();
    let mut s = raw(&d.socket);
    s.write_all(&frame(br#"{"type":"hello","version":1}"#)).expect("write");
    assert_eq!(reply(&mut s).expect("hello")["type"], "hello");
    let open = br#"{"type":"open","dataset":"train","options":{"minibatch_size":1,"session":"gone","max_sweeps":40,"equal_steps":true,"num_workers":2,"rank":0}}"#;
    s.write_all(&frame(open)).expect("write");
    drop(s);
    // The series exists from the start, at 0: wait for the refusal to be counted.
    let series = r#"minibatchd_sessions_refused_total{code="client_gone"}"#;
    let started = Instant::now();
    while d.metric(series) < 0.5 {
        assert!(started.elapsed() < DEADLINE, "the open was not given up");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!((d.metric(series) - 1.0).abs() < 0.5, "one open given up");
    let again = SessionOptions {
        session: Some("gone".into()),
        equal_steps: true,
        num_workers: Some(2),
        rank: Some(0),
        max_sweeps: Some(1),
        ..options(1)
    };
    // A client that only shuts its writing side still reads its answer (found by a review): the
    // cancelled walk's refusal, or a quick open's `opened`.
    let half_closed = |open: &[u8]| {
        let mut s = raw(&d.socket);
        s.write_all(&frame(br#"{"type":"hello","version":1}"#)).expect("write");
        assert_eq!(reply(&mut s).expect("hello")["type"], "hello");
        s.write_all(&frame(open)).expect("write");
        s.shutdown(std::net::Shutdown::Write).expect("shutdown");
        reply(&mut s).expect("an answer")
    };
    let answer = half_closed(open);
    assert!(answer["message"].as_str().is_some_and(|m| m.contains("cancelled")), "{answer}");
    let answer = half_closed(br#"{"type":"open","dataset":"train","options":{"minibatch_size":1,"full_sweep":true}}"#);
    assert_eq!(answer["type"], "opened", "{answer}");
    let got = d.read_all("train", &again, TRAIN_STREAMS);
    assert_eq!(
        got,
        d.dump(
            "train",
            &["--minibatch-size", "1", "--max-sweeps", "1", "--equal-steps", "--workers", "2", "--rank", "0"]
        )
    );
}

#[test]
fn an_equal_steps_state_resumes_only_at_its_minibatch_size() {
    let d = start();
    let equal = |mb: u64| SessionOptions {
        equal_steps: true,
        max_sweeps: Some(2),
        num_workers: Some(2),
        rank: Some(1),
        ..options(mb)
    };
    let state_after_two = |rank: u64| {
        let mut s = d.client().open("train", &SessionOptions { rank: Some(rank), ..equal(3) }).expect("open");
        for _ in 0..2 {
            let mb = s.next_minibatch().expect("next").expect("a minibatch");
            s.release(mb);
        }
        s.state().expect("state")
    };
    let first = state_after_two(0);
    let saved = state_after_two(1);
    assert_eq!(saved.equal_steps_minibatch, Some(3), "the state says the size it was cut for");
    // The cut that equal steps made is a count of minibatches of this size: at another size the
    // ranks would get unequal step counts.
    let at = |mb: u64| SessionOptions { resume: Some(saved.clone()), ..equal(mb) };
    match d.client().open("train", &at(5)) {
        Err(ClientError::Daemon { code, message, .. }) => {
            assert_eq!(code, ErrorCode::ResumeMismatch);
            assert!(message.contains("minibatch_size 3, not 5"), "{message}");
        }
        Ok(_) => panic!("a resume at another minibatch size under equal_steps was accepted"),
        Err(e) => panic!("{e}"),
    }
    let mut same = d.client().open("train", &at(3)).expect("the same size resumes");
    assert_eq!(same.next_minibatch().expect("next").expect("a minibatch").meta.index, 2);
    drop(same);
    // A state of an earlier build (no size recorded) resumes at any size, as it did.
    let earlier = SessionState { equal_steps_minibatch: None, ..saved.clone() };
    let old = SessionOptions { resume: Some(earlier), ..equal(5) };
    d.client().open("train", &old).expect("an earlier build's state");
    // resume_job counts equal steps afresh from where the run stood: any size.
    let job = SessionOptions { resume_job: Some(vec![first, saved]), rank: Some(0), ..equal(4) };
    d.client().open("train", &job).expect("resume_job at another size");
}

#[test]
fn a_close_that_does_not_say_what_was_taken_is_not_resumed_as_exact() {
    let d = start();
    // A raw client of its own (the clients always say): three minibatches announced, none
    // released, then `close` without `taken`.
    let open = br#"{"type":"open","dataset":"train","options":{"minibatch_size":4,"session":"quiet","max_sweeps":10}}"#;
    let mut s = raw_opened(&d.socket, open);
    let mut announced = 0;
    while announced < 3 {
        let m = reply(&mut s).expect("a ready");
        assert_eq!(m["type"], "ready", "{m}");
        announced += 1;
    }
    let m = closed(&mut s, br#"{"type":"close"}"#);
    assert_eq!(m["state"]["minibatches"], 0, "nothing reported taken: {m}");
    drop(s);
    // Its trainer may hold all three: a resume by name starts over them and must say so.
    let named = SessionOptions { session: Some("quiet".into()), max_sweeps: Some(10), ..options(4) };
    let mut again = open_retrying(&d, "train", &named, ErrorCode::SessionBusy);
    let resumed = again.resumed.clone().expect("resumed by name");
    assert_eq!(resumed.from, "lingering");
    assert!(!resumed.exact, "minibatches 0..3 come again: not exact ({resumed:?})");
    assert_eq!(again.next_minibatch().expect("next").expect("a minibatch").meta.index, 0);
}

#[test]
fn released_minibatches_a_client_reports_untaken_are_resumed_by_name() {
    let d = start();
    // A client that releases slots of minibatches it has not handed on (the Python adapters
    // during a DataLoader step: a batch of more minibatches than half the ring), then gives
    // them back: `close{taken: 1}` after releasing minibatches 0..4 with `taken: 0`. Before, a
    // release counted its minibatch taken whatever the client said, and a resume by name skipped
    // minibatches 1..4 while saying it was exact.
    let open = br#"{"type":"open","dataset":"train","options":{"minibatch_size":4,"session":"held","max_sweeps":10,"prefetch":2}}"#;
    let mut s = raw_opened(&d.socket, open);
    for index in 0..4 {
        let m = reply(&mut s).expect("a ready");
        assert_eq!((m["type"].as_str(), m["minibatch"]["index"].as_u64()), (Some("ready"), Some(index)), "{m}");
        let release =
            format!(r#"{{"type":"release","slot":{},"generation":{},"taken":0}}"#, m["slot"], m["generation"]);
        s.write_all(&frame(release.as_bytes())).expect("write");
    }
    let m = closed(&mut s, br#"{"type":"close","taken":1}"#);
    assert_eq!(m["state"]["minibatches"], 1, "the client took one: {m}");
    drop(s);
    let named = SessionOptions { session: Some("held".into()), max_sweeps: Some(10), ..options(4) };
    let mut again = open_retrying(&d, "train", &named, ErrorCode::SessionBusy);
    let resumed = again.resumed.clone().expect("resumed by name");
    assert!(resumed.exact, "the client said what it took: {resumed:?}");
    let want = d.dump("train", &["--minibatch-size", "4", "--max-sweeps", "10"]);
    assert_eq!(drain(&mut again, 2), want[1..3], "minibatches 1 and 2 come next");
}

#[test]
fn garbage_oversized_and_wrong_version_messages_leave_the_daemon_serving() {
    use std::os::unix::fs::PermissionsExt;
    let mut d = start();
    let mode = std::fs::metadata(&d.socket).expect("socket").permissions().mode() & 0o777;
    assert_eq!(mode, 0o660, "socket mode {mode:o}");
    // Garbage in a valid frame: an error reply, and the connection goes on.
    let mut s = raw(&d.socket);
    s.write_all(&frame(b"\xff\xfe not json")).expect("write");
    assert_eq!(code(reply(&mut s).as_ref()), "bad_message");
    s.write_all(&frame(br#"{"type":"hello","version":1}"#)).expect("write");
    assert_eq!(reply(&mut s).expect("hello")["type"], "hello");
    s.write_all(&frame(br#"{"type":"release","slot":0,"generation":1}"#)).expect("write");
    assert_eq!(code(reply(&mut s).as_ref()), "unexpected_message");
    s.write_all(&frame(br#"{"type":"open","dataset":"train","options":{"minibatch_size":0}}"#)).expect("write");
    assert_eq!(code(reply(&mut s).as_ref()), "invalid_options");
    s.write_all(&frame(br#"{"type":"open","dataset":"nope","options":{"minibatch_size":1}}"#)).expect("write");
    assert_eq!(code(reply(&mut s).as_ref()), "unknown_dataset");
    // A close with no session open is answered before the connection ends.
    s.write_all(&frame(br#"{"type":"close"}"#)).expect("write");
    assert_eq!(code(reply(&mut s).as_ref()), "unexpected_message");
    assert!(reply(&mut s).is_none(), "the connection is closed after a close");
    // Oversized: an error reply and a disconnect.
    let mut s = raw(&d.socket);
    s.write_all(&u32::MAX.to_le_bytes()).expect("write");
    assert_eq!(code(reply(&mut s).as_ref()), "message_too_large");
    assert!(reply(&mut s).is_none(), "the connection is closed");
    // Wrong version: an error reply and a disconnect.
    for bad in [br#"{"type":"hello","version":3}"#.as_slice(), br#"{"type":"hello","version":0}"#] {
        let mut s = raw(&d.socket);
        s.write_all(&frame(bad)).expect("write");
        assert_eq!(code(reply(&mut s).as_ref()), "version_mismatch");
        assert!(reply(&mut s).is_none());
    }
    // Version 1 still gets JSON `ready`; version 2 gets the 40-byte binary one, and a malformed
    // binary release is a bad message that leaves the session serving.
    for version in [1u32, 2] {
        let mut s = raw(&d.socket);
        s.write_all(&frame(format!(r#"{{"type":"hello","version":{version}}}"#).as_bytes())).expect("write");
        assert_eq!(reply(&mut s).expect("hello")["version"], version);
        s.write_all(&frame(br#"{"type":"open","dataset":"train","options":{"minibatch_size":4,"prefetch":2}}"#))
            .expect("write");
        assert_eq!(reply(&mut s).expect("opened")["type"], "opened");
        let ready = raw_frame(&mut s).expect("a ready");
        if version == 1 {
            let m: serde_json::Value = serde_json::from_slice(&ready).expect("JSON ready");
            assert_eq!(m["type"], "ready");
        } else {
            assert_eq!((ready.len(), ready[0]), (40, 1), "binary ready");
            let mut bad = vec![2u8; 31];
            bad[1] = 0;
            s.write_all(&frame(&bad)).expect("write");
            s.write_all(&frame(&[0x7f, 1, 2])).expect("write");
            // Both are refused with bad_message (ready frames for the second slot may come between).
            let mut codes = Vec::new();
            while codes.len() < 2 {
                let body = raw_frame(&mut s).expect("a reply");
                if body[0] == b'{' {
                    codes.push(
                        serde_json::from_slice::<serde_json::Value>(&body).expect("JSON")["code"]
                            .as_str()
                            .unwrap_or("")
                            .to_owned(),
                    );
                }
            }
            assert_eq!(codes, ["bad_message", "bad_message"]);
            // A well-formed binary release of the announced slot is accepted: its next ready follows.
            let slot = u64::from(u32::from_le_bytes([ready[4], ready[5], ready[6], ready[7]]));
            let generation = u64::from_le_bytes(ready[8..16].try_into().expect("8 bytes"));
            s.write_all(&minibatchd_client::protocol::encode_release_binary(slot, generation, 1, None)).expect("write");
            s.write_all(&frame(br#"{"type":"state"}"#)).expect("write");
            loop {
                let body = raw_frame(&mut s).expect("a reply");
                if body[0] == b'{' {
                    let m: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
                    assert_eq!(m["type"], "state", "{m}");
                    assert_eq!(m["state"]["minibatches"], 1, "the release reported one minibatch taken: {m}");
                    break;
                }
            }
        }
    }
    // No hello first.
    let mut s = raw(&d.socket);
    s.write_all(&frame(br#"{"type":"state"}"#)).expect("write");
    assert_eq!(code(reply(&mut s).as_ref()), "hello_required");
    // Random bytes, a truncated frame, then a hang-up.
    let mut s = raw(&d.socket);
    s.write_all(&[7, 0, 0, 0, b'{', b'"']).expect("write");
    drop(s);
    // Still serving.
    let mut session =
        d.client().open("train", &SessionOptions { full_sweep: true, ..options(50) }).expect("open after abuse");
    assert!(!drain(&mut session, 10_000).is_empty());
    assert!(d.running());
    // SIGTERM stops it cleanly and removes the socket.
    assert!(d.dir.join("state/metrics.addr").exists(), "the metrics endpoint's address is recorded");
    assert!(d.stop().success(), "clean exit on SIGTERM");
    assert!(!d.socket.exists(), "socket removed");
    assert!(!d.dir.join("state/metrics.addr").exists(), "metrics.addr removed");
}

#[test]
fn ring_memory_is_reserved_and_given_back() {
    // Rings of 3 × 128 KiB + header (397 312 bytes): of 1.5 MiB, a quarter stays with the chunk
    // cache and 2 × ~270 KB go to the parser threads' read buffers, which leaves room for one.
    let d = start_with_limit(3 << 19);
    let opts = SessionOptions { full_sweep: true, prefetch: Some(3), slot_size_bytes: Some(128 << 10), ..options(4) };
    let mut first = d.client().open("train", &opts).expect("first");
    match d.client().open("train", &opts) {
        Err(ClientError::Daemon { code: ErrorCode::ResourceExhausted, .. }) => {}
        other => panic!("expected resource_exhausted, got {other:?}"),
    }
    drain(&mut first, 2);
    drop(first);
    open_retrying(&d, "train", &opts, ErrorCode::ResourceExhausted);
}

#[test]
fn a_killed_python_client_gets_its_slots_reclaimed_while_others_go_on() {
    let py = python();
    // Room for two rings of 3 × 128 KiB only, the victim's and the survivor's: of 2 MiB, a
    // quarter stays with the cache and 2 × ~270 KB go to the read buffers.
    let d = start_with_limit(2 << 20);
    let opts = SessionOptions { full_sweep: true, prefetch: Some(3), slot_size_bytes: Some(128 << 10), ..options(3) };
    let mut survivor = d.client().open("train", &opts).expect("survivor");
    let mut survived = drain(&mut survivor, 5);
    let script = format!(
        "import sys, time, minibatchd\n\
         s = minibatchd.connect({sock:?}).open('train', minibatch_size=3, full_sweep=True, prefetch=3, slot_size_bytes=131072, session='victim')\n\
         held = [next(s)]\n\
         for _ in range(4): next(s)\n\
         print('READY', flush=True)\n\
         time.sleep(120)\n",
        sock = d.socket.display().to_string()
    );
    let mut victim = KillOnDrop(
        Command::new(&py)
            .args(["-c", &script])
            .env("PYTHONPATH", client_dir())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python"),
    );
    let victim = &mut victim.0;
    let mut line = String::new();
    BufReader::new(victim.stdout.take().expect("stdout")).read_line(&mut line).expect("read");
    assert_eq!(line.trim(), "READY", "the victim did not start");
    // Both rings are in use: a third session does not fit.
    assert!(matches!(
        d.client().open("train", &opts),
        Err(ClientError::Daemon { code: ErrorCode::ResourceExhausted, .. })
    ));
    victim.kill().expect("SIGKILL");
    victim.wait().expect("reap");
    // The victim's ring comes back at once; meanwhile the survivor goes on.
    survived.extend(drain(&mut survivor, 3));
    let mut third = open_retrying(&d, "train", &opts, ErrorCode::ResourceExhausted);
    assert!(!drain(&mut third, 2).is_empty());
    drop(third);
    survived.extend(drain(&mut survivor, 10_000));
    assert_eq!(survived, d.dump("train", &["--minibatch-size", "3", "--full-sweep"]), "the survivor was not disturbed");
    // The victim's session is resumable by name, after the minibatches it had taken.
    let victim_opts = SessionOptions { session: Some("victim".into()), ..opts.clone() };
    let mut again = open_retrying(&d, "train", &victim_opts, ErrorCode::SessionBusy);
    let state = again.state().expect("state");
    assert!(state.minibatches >= 1 && state.minibatches <= 5, "{state:?}");
    let mb = again.next_owned().expect("next").expect("a minibatch");
    assert_eq!(mb.index, state.minibatches);
}

#[test]
fn python_client_suite() {
    let py = python();
    let has_pytest = Command::new(&py)
        .args(["-c", "import pytest"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(has_pytest, "{py} cannot import pytest: run scripts/setup.sh (it installs the client's test dependencies)");
    let out = Command::new(&py)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .current_dir(client_dir())
        .env("MINIBATCHD_BIN", BIN)
        .env("PYTHONPATH", client_dir())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run pytest");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(out.status.success(), "the Python client tests failed:\n{text}");
}

/// Found by a probe: `minibatchd_session_consumer_wait_seconds_total` took a client's cumulative
/// `wait_ns` as it came — one release saying 2^64 − 1 ns added 584 years to a series every
/// session of the (dataset, rank) shares, pinning others' input-bound alerts. A report counts at
/// most the time since the session opened on that connection.
#[test]
fn a_consumer_wait_report_counts_no_more_than_the_session_has_lasted() {
    let d = start();
    let series = r#"minibatchd_session_consumer_wait_seconds_total{dataset="train",rank="0"}"#;
    let mut s = raw(&d.socket);
    s.write_all(&frame(br#"{"type":"hello","version":1}"#)).expect("write");
    assert_eq!(reply(&mut s).expect("hello")["type"], "hello");
    let started = Instant::now();
    s.write_all(&frame(br#"{"type":"open","dataset":"train","options":{"minibatch_size":2,"full_sweep":true}}"#))
        .expect("write");
    assert_eq!(reply(&mut s).expect("opened")["type"], "opened");
    let ready = reply(&mut s).expect("ready");
    assert_eq!(ready["type"], "ready", "{ready}");
    let release = format!(
        r#"{{"type":"release","slot":{},"generation":{},"taken":1,"wait_ns":{}}}"#,
        ready["slot"],
        ready["generation"],
        u64::MAX
    );
    s.write_all(&frame(release.as_bytes())).expect("write");
    let deadline = Instant::now();
    while d.metric(series) == 0.0 {
        assert!(deadline.elapsed() < DEADLINE, "the report was not counted");
        std::thread::sleep(Duration::from_millis(20));
    }
    let counted = d.metric(series);
    assert!(counted <= started.elapsed().as_secs_f64(), "{counted} s counted in {:?}", started.elapsed());
}
