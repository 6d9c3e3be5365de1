//! Weighted mixtures served by the real daemon (issue 40) through the Rust client: every worker
//! of every world size gets exactly the minibatches `minibatchd dump --mixture` prints for it —
//! fingerprints, data and the state after each; a state taken at any minibatch resumes at another
//! world size; a session resumed by name continues across a daemon restart; weights given at
//! `open` replace the configured ones; what does not fit a mixture is refused; the per-source
//! metrics count what was delivered.

mod support;

use std::path::Path;

use minibatchd_client::protocol::{
    ErrorCode, MixtureSlot, MixtureSpec, SessionOptions, SessionState, WeightStageOption,
};
use minibatchd_client::{ClientError, Session};
use support::daemon::{json, options, write_config, Daemon};
use support::{parse_dump, write};

/// Datasets `a` (23 lines in chunks of a few lines, randomized), `b` (7 lines, file order), `d`
/// (b's file under other stream names) — a feature of each line holds its index and its file —
/// and the mixtures of them.
fn start(dir: &Path) -> Daemon {
    let a = (0..23).map(|i| format!("|F {i} 0 |L {}:1\n", i % 3)).collect::<Vec<_>>().concat();
    let b = (0..7).map(|i| format!("|F {i} 1 |L {}:1\n", i % 3)).collect::<Vec<_>>().concat();
    write(dir, "a.ctf", a);
    write(dir, "b.ctf", b);
    let d = dir.display();
    let streams = |n: &str, x: &str, y: &str| {
        format!(
            "[datasets.{n}.streams.{x}]\nalias = \"F\"\ndim = 2\nformat = \"dense\"\n\
             [datasets.{n}.streams.{y}]\nalias = \"L\"\ndim = 3\nformat = \"sparse\"\n"
        )
    };
    let datasets = format!(
        "[datasets.a]\nformat = \"ctf\"\nfiles = [\"{d}/a.ctf\"]\nchunk_size_bytes = 60\n{}\
         [datasets.a.sampling]\nwindow_chunks = 3\nseed = 5\n\
         [datasets.b]\nformat = \"ctf\"\nfiles = [\"{d}/b.ctf\"]\n{}\
         [datasets.b.sampling]\nrandomize = false\n\
         [datasets.d]\nformat = \"ctf\"\nfiles = [\"{d}/b.ctf\"]\n{}\
         [datasets.d.sampling]\nrandomize = false\n\
         [mixtures.ab]\ndatasets = [\"a\", \"b\"]\nweights = [2.5, 1]\nepoch = \"first_sweep_end\"\n\
         [[mixtures.ab.schedule]]\nfrom_step = 4\nweights = [1, 3]\n\
         [mixtures.even]\ndatasets = [\"a\", \"b\"]\nweights = [1, 1]\nepoch = \"first_sweep_end\"\n\
         [mixtures.ad]\ndatasets = [\"a\", \"d\"]\nweights = [1, 2]\nmax_samples = 40\n\
         [mixtures.ad.streams]\nvalues = [\"features\", \"x\"]\nclasses = [\"labels\", \"y\"]\n",
        streams("a", "features", "labels"),
        streams("b", "features", "labels"),
        streams("d", "x", "y"),
    );
    write_config(dir, "", &datasets);
    Daemon::start(dir, &[])
}

/// What the daemon delivered to one worker: per minibatch its dump-format line (fingerprint,
/// streams), what its slot carries of the mixture, and the session's state after it (the
/// daemon's).
struct Read {
    lines: Vec<serde_json::Value>,
    slots: Vec<MixtureSlot>,
    states: Vec<SessionState>,
}

fn read(mut s: Session, names: &[&str]) -> Read {
    let (mut lines, mut slots, mut states) = (Vec::new(), Vec::new(), Vec::new());
    while let Some(d) = s.next_minibatch().expect("next") {
        let mb = s.copy(&d).expect("copy");
        slots.push(*d.mixture.clone().expect("a mixture's minibatch carries the mixture's tensors"));
        s.release(d);
        lines.push(serde_json::from_str(&json(&mb, names)).expect("a JSON line"));
        states.push(s.state().expect("state"));
    }
    Read { lines, slots, states }
}

fn open(d: &Daemon, mixture: &str, o: &SessionOptions) -> Session {
    d.client().open(mixture, o).unwrap_or_else(|e| panic!("open {mixture}: {e}"))
}

fn worker(minibatch_size: u64, workers: u64, rank: u64) -> SessionOptions {
    SessionOptions { num_workers: Some(workers), rank: Some(rank), ..options(minibatch_size) }
}

/// `dump --mixture` of the daemon's config with `args`, as JSON values.
fn dump(d: &Daemon, args: &[&str]) -> Vec<serde_json::Value> {
    let out = std::process::Command::new(support::BIN)
        .arg("dump")
        .arg("--config")
        .arg(d.config())
        .args(args)
        .output()
        .expect("dump");
    assert!(out.status.success(), "dump {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    parse_dump(&String::from_utf8_lossy(&out.stdout)).expect("JSON lines")
}

/// Checks what the daemon gave one worker against what dump prints for it.
fn same_as_dump(got: &Read, want: &[serde_json::Value], what: &str) {
    assert_eq!(got.lines.len(), want.len(), "{what}: minibatches");
    for (k, ((line, state), w)) in got.lines.iter().zip(&got.states).zip(want).enumerate() {
        assert_eq!(line["fingerprint"], w["fingerprint"], "{what}, minibatch {k}");
        assert_eq!(line["streams"], w["streams"], "{what}, minibatch {k}: data");
        let mixture = serde_json::to_value(state.mixture.as_ref().expect("a mixture's state")).expect("JSON");
        assert_eq!(mixture, w["state"], "{what}, minibatch {k}: the state after it");
        let slot = &got.slots[k];
        assert_eq!(
            serde_json::to_value(&slot.state).expect("JSON"),
            w["state"],
            "{what}, minibatch {k}: the slot's state"
        );
        assert_eq!(serde_json::json!(slot.sources), w["sources"], "{what}, minibatch {k}: the sources");
        assert_eq!(serde_json::json!(slot.sweeps_ended), w["sweeps_ended"], "{what}, minibatch {k}");
        assert_eq!(state.position, w["state"]["slots"].as_u64().expect("slots"), "{what}: position = slots");
    }
}

#[test]
fn every_worker_gets_what_dump_prints_and_any_state_resumes_at_another_world_size() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = start(dir.path());
    for (mixture, names) in [("ab", ["features", "labels"]), ("ad", ["classes", "values"])] {
        let mut whole = None;
        for workers in [1u64, 2, 3] {
            for rank in 0..workers {
                let got = read(open(&d, mixture, &worker(3, workers, rank)), &names);
                let (w, r) = (workers.to_string(), rank.to_string());
                let want = dump(&d, &["--mixture", mixture, "--minibatch-size", "3", "--workers", &w, "--rank", &r]);
                same_as_dump(&got, &want, &format!("{mixture}, worker {rank} of {workers}"));
                if workers == 1 {
                    whole = Some(got);
                }
            }
        }
        // A state taken after any minibatch of one worker resumes two: each gets what dump
        // prints from that state, its minibatches numbered on.
        let whole = whole.expect("the one-worker run");
        assert!(whole.states.len() > 3, "{mixture}: {} minibatches", whole.states.len());
        for cut in [0, whole.states.len() / 2, whole.states.len() - 2] {
            let state = &whole.states[cut];
            let restore = serde_json::to_string(state.mixture.as_ref().expect("mixture")).expect("JSON");
            for rank in 0..2u64 {
                let o = SessionOptions { resume: Some(state.clone()), ..worker(3, 2, rank) };
                let got = read(open(&d, mixture, &o), &names);
                let r = rank.to_string();
                let want = dump(
                    &d,
                    &[
                        "--mixture",
                        mixture,
                        "--minibatch-size",
                        "3",
                        "--workers",
                        "2",
                        "--rank",
                        &r,
                        "--restore-state",
                        &restore,
                    ],
                );
                same_as_dump(&got, &want, &format!("{mixture} resumed after minibatch {cut}, worker {rank} of 2"));
                if let Some(first) = got.lines.first() {
                    assert_eq!(first["minibatch"].as_u64(), Some(cut as u64 + 1), "minibatches are numbered on");
                }
            }
        }
        // A session's position is its mixture's slots, and a resume takes it from there: a state
        // edited at the top level alone moves nothing (found by a probe: it was taken as given).
        let state = &whole.states[1];
        let slots = state.mixture.as_ref().expect("mixture").slots;
        assert_eq!(state.position, slots, "{mixture}: {state:?}");
        let edited = SessionState { position: slots + 7, ..state.clone() };
        let mut s = open(&d, mixture, &SessionOptions { resume: Some(edited), ..worker(3, 1, 0) });
        assert_eq!(s.state().expect("state").position, slots, "{mixture}: the resumed position");
        let got = read(s, &names);
        let restore = serde_json::to_string(state.mixture.as_ref().expect("mixture")).expect("JSON");
        let want = dump(&d, &["--mixture", mixture, "--minibatch-size", "3", "--restore-state", &restore]);
        same_as_dump(&got, &want, &format!("{mixture} resumed from a state edited at the top level"));
    }
}

#[test]
fn weights_at_open_replace_the_configured_ones_and_the_metrics_count_each_source() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = start(dir.path());
    let names = ["features", "labels"];
    let o = SessionOptions { weights: Some(vec![1.0, 1.0]), ..options(4) };
    let got = read(open(&d, "ab", &o), &names);
    same_as_dump(&got, &dump(&d, &["--mixture", "even", "--minibatch-size", "4"]), "ab with weights 1:1");
    // A schedule at open: the configured one's stages, as `ab` has them.
    let stages = vec![
        WeightStageOption { from_step: 0, weights: vec![2.5, 1.0] },
        WeightStageOption { from_step: 4, weights: vec![1.0, 3.0] },
    ];
    let o = SessionOptions { weight_schedule: Some(stages), ..options(4) };
    let scheduled = read(open(&d, "ab", &o), &names);
    let configured = dump(&d, &["--mixture", "ab", "--minibatch-size", "4"]);
    same_as_dump(&scheduled, &configured, "ab with its schedule given at open");
    // The per-source samples of the three sessions of `ab`: both read by the first two; the
    // third (the configured weights) adds its own counts.
    let plain = read(open(&d, "ab", &options(4)), &names);
    same_as_dump(&plain, &configured, "ab");
    let mut from = [0u64; 2];
    for line in dump(&d, &["--mixture", "even", "--minibatch-size", "4"]).iter().chain(&configured).chain(&configured) {
        for s in line["sources"].as_array().expect("sources") {
            from[usize::try_from(s.as_u64().expect("source")).expect("index")] += 1;
        }
    }
    let metric =
        |source: &str| d.metric(&format!("minibatchd_mixture_samples_total{{mixture=\"ab\",source=\"{source}\"}}"));
    let count = |n: u64| f64::from(u32::try_from(n).expect("a small count"));
    assert_eq!((metric("a"), metric("b")), (count(from[0]), count(from[1])));
    // The weights in force at the last minibatch (the schedule's second stage): 1 : 3.
    let share = d.metric("minibatchd_mixture_target_share{mixture=\"ab\",source=\"b\"}");
    assert!((share - 0.75).abs() < 1e-6, "{share}");
    // A state taken under `ab`'s weights resumed under others (1 : 1, `even`'s), at 2 workers:
    // from there each worker gets what `even` gives from that state — nothing lost or repeated
    // within a source, the shares the new weights'.
    let under_ab = read(open(&d, "ab", &options(4)), &names);
    let cut = under_ab.states[2].clone();
    let restore = serde_json::to_string(cut.mixture.as_ref().expect("mixture")).expect("JSON");
    for rank in 0..2u64 {
        let o = SessionOptions { resume: Some(cut.clone()), weights: Some(vec![1.0, 1.0]), ..worker(4, 2, rank) };
        let got = read(open(&d, "ab", &o), &names);
        let r = rank.to_string();
        let want = dump(
            &d,
            &[
                "--mixture",
                "even",
                "--minibatch-size",
                "4",
                "--workers",
                "2",
                "--rank",
                &r,
                "--restore-state",
                &restore,
            ],
        );
        same_as_dump(&got, &want, &format!("ab resumed under other weights, worker {rank} of 2"));
    }
}

#[test]
fn what_does_not_fit_a_mixture_is_refused_with_a_reason() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = start(dir.path());
    let refused = |name: &str, o: &SessionOptions| match d.client().open(name, o) {
        Err(ClientError::Daemon { code, message, .. }) => (code, message),
        Ok(_) => panic!("{name} {o:?} was opened"),
        Err(e) => panic!("{e}"),
    };
    let (code, message) = refused("ab", &SessionOptions { seed: Some(3), window_chunks: Some(2), ..options(4) });
    assert_eq!(code, ErrorCode::InvalidOptions);
    assert!(message.contains("window_chunks, seed") && message.contains("[sampling]"), "{message}");
    let (code, message) = refused("ab", &SessionOptions { weights: Some(vec![1.0]), ..options(4) });
    assert_eq!(code, ErrorCode::InvalidOptions);
    assert!(message.contains("1 weights for 2 sources"), "{message}");
    // resume_job is told what to use instead (found by a probe: it was told of [sampling] tables).
    let (code, message) = refused("ab", &SessionOptions { resume_job: Some(Vec::new()), ..options(4) });
    assert_eq!(code, ErrorCode::InvalidOptions);
    assert!(message.contains("resume_job does not apply") && message.contains("as resume"), "{message}");
    let (code, message) = refused("a", &SessionOptions { weights: Some(vec![1.0]), ..options(4) });
    assert_eq!(code, ErrorCode::InvalidOptions);
    assert!(message.contains("apply to a mixture's session"), "{message}");

    let mut s = open(&d, "a", &options(4));
    let _ = s.next_owned().expect("next");
    let dataset_state = s.state().expect("state");
    drop(s);
    let mut s = open(&d, "ab", &options(4));
    let _ = s.next_owned().expect("next");
    let mixture_state = s.state().expect("state");
    drop(s);
    let renamed = SessionState { dataset: "ab".into(), ..dataset_state.clone() };
    let mut fewer = mixture_state.clone();
    fewer.mixture.as_mut().expect("mixture").sources.pop();
    let mut unbalanced = mixture_state.clone();
    unbalanced.mixture.as_mut().expect("mixture").sources[0].credit += 1;
    for (name, state, code, text) in [
        ("ab", dataset_state.clone(), ErrorCode::ResumeMismatch, "belongs to dataset 'a'"),
        ("ab", renamed, ErrorCode::ResumeMismatch, "is of a dataset's session"),
        (
            "a",
            SessionState { dataset: "a".into(), ..mixture_state.clone() },
            ErrorCode::ResumeMismatch,
            "is of a mixture's session",
        ),
        ("ab", fewer, ErrorCode::ResumeMismatch, "a mixture of 1 sources"),
        ("ab", unbalanced, ErrorCode::InvalidOptions, "credits sum to 1"),
        ("even", mixture_state, ErrorCode::ResumeMismatch, "belongs to dataset 'ab'"),
    ] {
        let (code_got, message) = refused(name, &SessionOptions { resume: Some(state), ..options(4) });
        assert_eq!(code_got, code, "{name}: {message}");
        assert!(message.contains(text), "{name}: {message}");
    }
}

#[test]
fn a_session_resumed_by_name_continues_across_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut d = start(dir.path());
    let names = ["features", "labels"];
    let o = SessionOptions { session: Some("blend".into()), ..options(3) };
    let mut s = open(&d, "ab", &o);
    for _ in 0..2 {
        let _ = s.next_owned().expect("next").expect("a minibatch");
    }
    let taken = s.close().expect("close");
    assert_eq!(taken.minibatches, 2);
    d.stop();
    let d = Daemon::start(dir.path(), &[]);
    let s = open(&d, "ab", &o);
    let got = read(s, &names);
    let want = dump(&d, &["--mixture", "ab", "--minibatch-size", "3"]);
    let rest: Vec<serde_json::Value> = want[2..].to_vec();
    same_as_dump(&got, &rest, "ab resumed by name after a restart");
}

#[test]
fn epoch_k_continues_where_epoch_k_minus_1_ended_at_any_world_size() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = start(dir.path());
    let names = ["features", "labels"];
    for mixture in ["ab", "ad"] {
        let names = if mixture == "ab" { names } else { ["classes", "values"] };
        // Epoch k + 1 starts from epoch k's final state, its counts of the epoch at 0.
        let mut state = None::<serde_json::Value>;
        for k in 0..4u64 {
            let mut args = vec!["--mixture".to_owned(), mixture.to_owned(), "--minibatch-size".into(), "3".into()];
            if let Some(s) = &state {
                let mut next = s.clone();
                for key in ["step", "slots", "samples"] {
                    next[key] = serde_json::json!(0);
                }
                next["ended"] = serde_json::json!(false);
                args.extend(["--restore-state".to_owned(), next.to_string()]);
            }
            let previous = state.clone();
            for workers in [1u64, 2] {
                for rank in 0..workers {
                    let mut a = args.clone();
                    a.extend(["--workers".to_owned(), workers.to_string(), "--rank".into(), rank.to_string()]);
                    let a: Vec<&str> = a.iter().map(String::as_str).collect();
                    let want = dump(&d, &a);
                    let o = SessionOptions { sweep: Some(k), equal_steps: true, ..worker(3, workers, rank) };
                    let got = read(open(&d, mixture, &o), &names);
                    same_as_dump(&got, &want, &format!("{mixture}, epoch {k}, worker {rank} of {workers}"));
                    // The same epoch from the last one's final state, its counts restarted: a
                    // state of any epoch resumes a session opened for any.
                    if let Some(s) = &previous {
                        let mut next: minibatchd_client::protocol::MixtureState =
                            serde_json::from_value(s.clone()).expect("a mixture state");
                        (next.step, next.slots, next.samples, next.ended) = (0, 0, 0, false);
                        let resume =
                            SessionState { position: 0, minibatches: 0, mixture: Some(next), ..got.states[0].clone() };
                        let o = SessionOptions { sweep: Some(k), resume: Some(resume), ..worker(3, workers, rank) };
                        let again = read(open(&d, mixture, &o), &names);
                        same_as_dump(&again, &want, &format!("{mixture}, epoch {k} resumed, worker {rank}"));
                    }
                    if workers == 1 {
                        assert_eq!(got.states.last().and_then(|s| s.mixture.as_ref()).map(|m| m.ended), Some(true));
                        state = Some(want.last().expect("a minibatch")["state"].clone());
                    }
                }
            }
        }
    }
}

/// A daemon over `root` with datasets `p` and `q` (30,000 one-sample lines each, a feature of
/// each line holding its index and its file) and mixture `pq` of them with `options` (its
/// weights and epoch, TOML lines).
fn pq_daemon(root: &Path, options: &str) -> Daemon {
    for (name, mark) in [("p.ctf", 0), ("q.ctf", 1)] {
        write(root, name, (0..30_000).map(|i| format!("|F {i} {mark}\n")).collect::<Vec<_>>().concat());
    }
    let table = |n: &str| {
        format!(
            "[datasets.{n}]\nformat = \"ctf\"\nfiles = [\"{}/{n}.ctf\"]\n[datasets.{n}.streams.features]\nalias = \"F\"\ndim = 2\nformat = \"dense\"\n",
            root.display()
        )
    };
    let mixtures = format!("[mixtures.pq]\ndatasets = [\"p\", \"q\"]\n{options}\n");
    write_config(root, "", &format!("{}{}{mixtures}", table("p"), table("q")));
    Daemon::start(root, &[])
}

#[test]
fn a_minibatch_of_many_sequences_carries_every_source_in_its_slot() {
    // 30,000 one-sample lines in each of two files: a minibatch of 40,000 sequences, whose sources
    // are far more than a protocol message may carry (64 KiB), ride in the slot.
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    let d = pq_daemon(root, "weights = [1, 3]\nmax_samples = 50000");
    let got = read(open(&d, "pq", &options(40_000)), &["features"]);
    let want = dump(&d, &["--mixture", "pq", "--minibatch-size", "40000"]);
    assert_eq!(want.len(), 2);
    assert_eq!(got.slots[0].sources.len(), 40_000);
    same_as_dump(&got, &want, "pq, 40,000 sequences a minibatch");
}

/// A minibatch holds no more than its epoch: a `minibatch_size` of 2^31 - 1 over a mixture of 30
/// or 40 samples is one minibatch, as `dump` prints, not a refusal for a ring of hundreds of GB.
#[test]
fn a_huge_minibatch_over_a_finite_mixture_epoch_is_the_epoch_in_one_minibatch() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = start(dir.path());
    let size = (1u64 << 31) - 1;
    for (mixture, names) in [("ad", ["classes", "values"]), ("even", ["features", "labels"])] {
        let got = read(open(&d, mixture, &options(size)), &names);
        let want = dump(&d, &["--mixture", mixture, "--minibatch-size", &size.to_string()]);
        assert_eq!(want.len(), 1, "{mixture}: one minibatch");
        same_as_dump(&got, &want, mixture);
    }
}

#[test]
fn a_mixture_given_at_open_is_served_as_a_configured_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = start(dir.path());
    let names = ["features", "labels"];
    let spec = MixtureSpec {
        datasets: vec!["a".into(), "b".into()],
        epoch: Some("first_sweep_end".into()),
        streams: std::collections::BTreeMap::new(),
    };
    // `o`'s mixture, or `spec`; weights 1 : 1.
    let given = |o: SessionOptions| SessionOptions {
        mixture: o.mixture.clone().or_else(|| Some(spec.clone())),
        weights: Some(vec![1.0, 1.0]),
        ..o
    };
    // The same as the configured `even` (a and b at 1 : 1, first sweep end), at 1 and 2 workers.
    for workers in [1u64, 2] {
        for rank in 0..workers {
            let got = read(open(&d, "blend-at-open", &given(worker(4, workers, rank))), &names);
            let (w, r) = (workers.to_string(), rank.to_string());
            let want = dump(&d, &["--mixture", "even", "--minibatch-size", "4", "--workers", &w, "--rank", &r]);
            same_as_dump(&got, &want, &format!("a mixture given at open, worker {rank} of {workers}"));
        }
    }
    // Its state resumes it, given again.
    let whole = read(open(&d, "blend-at-open", &given(options(4))), &names);
    let cut = whole.states[2].clone();
    let rest =
        read(open(&d, "blend-at-open", &given(SessionOptions { resume: Some(cut.clone()), ..options(4) })), &names);
    assert_eq!(rest.lines, whole.lines[3..]);
    // Not given again: told so (found by a probe: told only that no dataset has that name).
    match d.client().open("blend-at-open", &SessionOptions { resume: Some(cut), ..options(4) }) {
        Err(ClientError::Daemon { code, message, .. }) => {
            assert_eq!(code, ErrorCode::InvalidOptions, "{message}");
            assert!(message.contains("given again (mixture=...)"), "{message}");
        }
        Ok(_) => panic!("a mixture's state opened a name nothing configures"),
        Err(e) => panic!("{e}"),
    }
    // Counted under one label, whatever the name.
    assert!(d.metric("minibatchd_mixture_samples_total{mixture=\"at_open\"") > 0.0);
    let refused = |name: &str, o: SessionOptions| match d.client().open(name, &o) {
        Err(ClientError::Daemon { code, message, .. }) => (code, message),
        Ok(_) => panic!("{name} {o:?} was opened"),
        Err(e) => panic!("{e}"),
    };
    for (name, o, text) in [
        ("a", given(options(4)), "a configured dataset's name"),
        ("even", given(options(4)), "a configured mixture's name"),
        ("x", SessionOptions { mixture: Some(spec.clone()), ..options(4) }, "needs weights"),
        (
            "x",
            given(SessionOptions {
                mixture: Some(MixtureSpec { datasets: vec!["a".into(), "a".into()], ..spec.clone() }),
                ..options(4)
            }),
            "listed twice",
        ),
        (
            "x",
            given(SessionOptions {
                mixture: Some(MixtureSpec { datasets: vec!["a".into(), "nope".into()], ..spec.clone() }),
                ..options(4)
            }),
            "no dataset 'nope'",
        ),
        (
            "x",
            given(SessionOptions {
                mixture: Some(MixtureSpec { epoch: Some("never".into()), ..spec.clone() }),
                ..options(4)
            }),
            "'never'",
        ),
    ] {
        let (code, message) = refused(name, o);
        assert_eq!(code, ErrorCode::InvalidOptions, "{name}: {message}");
        assert!(message.contains(text), "{name}: {message}");
    }
}

#[test]
fn a_mixture_of_an_object_store_dataset_and_a_local_one_is_read_again_from_the_persisted_cache() {
    // `a` lives in S3 (a real S3 server on loopback), `b` on disk; after a restart the chunks come
    // from the parsed cache, and the data is the same.
    let server = support::s3::S3Server::start();
    server.create_bucket("mixed");
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    server.put("mixed", "a.ctf", (0..23).map(|i| format!("|F {i} 0\n")).collect::<Vec<_>>().concat().as_bytes());
    write(root, "b.ctf", (0..7).map(|i| format!("|F {i} 1\n")).collect::<Vec<_>>().concat());
    let stream = |n: &str| format!("[datasets.{n}.streams.features]\nalias = \"F\"\ndim = 2\nformat = \"dense\"\n");
    let tables = format!(
        "[datasets.a]\nformat = \"ctf\"\nfiles = [\"s3://mixed/a.ctf\"]\nchunk_size_bytes = 40\n{}\
         [datasets.a.sampling]\nwindow_chunks = 2\nseed = 3\n\
         [datasets.b]\nformat = \"ctf\"\nfiles = [\"{}/b.ctf\"]\n{}\
         [mixtures.ab]\ndatasets = [\"a\", \"b\"]\nweights = [2, 1]\nepoch = \"first_sweep_end\"\n",
        stream("a"),
        root.display(),
        stream("b")
    );
    write_config(root, "", &tables);
    let env = server.env();
    let out = std::process::Command::new(support::BIN)
        .args(["dump", "--mixture", "ab", "--minibatch-size", "3", "--config"])
        .arg(root.join("minibatchd.toml"))
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("dump");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let want = parse_dump(&String::from_utf8_lossy(&out.stdout)).expect("JSON lines");
    let mut d = Daemon::start(root, &env);
    let first = read(open(&d, "ab", &options(3)), &["features"]);
    same_as_dump(&first, &want, "from S3 and disk");
    d.stop();
    let d = Daemon::start(root, &env);
    let again = read(open(&d, "ab", &options(3)), &["features"]);
    same_as_dump(&again, &want, "after a restart");
    assert!(d.metric("minibatchd_parsed_cache_hits_total") > 0.0, "the chunks were read back from the parsed cache");
}

#[test]
fn a_minibatch_whose_chunks_do_not_fit_together_is_gathered_a_chunk_at_a_time() {
    // Sparse-heavy lines (the windows' floor counts dense values only, so the open is admitted),
    // two sources whose parsed chunks together pass the cache's share of a small limit, and a
    // minibatch that draws from all of them: gathered a chunk at a time, the same as dump's.
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    for (name, mark) in [("p.ctf", 0u32), ("q.ctf", 1)] {
        let lines = (0..3000u32)
            .map(|i| {
                let entries: Vec<String> = (0..100).map(|k| format!("{}:{}", (i + k * 7) % 1000, mark + 1)).collect();
                format!("|D {i} {mark} |S {}\n", entries.join(" "))
            })
            .collect::<Vec<_>>()
            .concat();
        write(root, name, lines);
    }
    let table = |n: &str, f: &str| {
        format!(
            "[datasets.{n}]\nformat = \"ctf\"\nfiles = [\"{}/{f}\"]\nchunk_size_bytes = 65536\n\
             [datasets.{n}.streams.d]\nalias = \"D\"\ndim = 2\nformat = \"dense\"\n\
             [datasets.{n}.streams.s]\nalias = \"S\"\ndim = 1000\nformat = \"sparse\"\n",
            root.display()
        )
    };
    let mixtures = "[mixtures.pq]\ndatasets = [\"p\", \"q\"]\nweights = [1, 1]\nepoch = \"first_sweep_end\"\n";
    write_config(
        root,
        "memory_limit_bytes = 8388608\nhost_memory_reserve_bytes = 0\nparser_threads = 1\nring_slots = 2\nslot_size_bytes = 2097152\n",
        &format!("{}{}{mixtures}", table("p", "p.ctf"), table("q", "q.ctf")),
    );
    let d = Daemon::start(root, &[]);
    let got = read(open(&d, "pq", &options(1500)), &["d", "s"]);
    let want = dump(&d, &["--mixture", "pq", "--minibatch-size", "1500"]);
    same_as_dump(&got, &want, "pq, a chunk at a time");
    assert!(
        d.metric("minibatchd_session_minibatches_in_parts_total{dataset=\"pq\"") > 0.0,
        "no minibatch was gathered a chunk at a time"
    );
}

/// Found by a probe: an epoch of fewer slots than workers, dealt one a worker in turn, gave the
/// last workers nothing, in every epoch, without the warning a dataset's session gets.
#[test]
fn a_worker_whose_turn_does_not_come_in_the_epoch_is_warned_at_open() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = start(dir.path());
    // `even`'s epoch ends with b's sweep: 7 slots of b, about as many of a.
    let slots: usize = dump(&d, &["--mixture", "even", "--minibatch-size", "1", "--ledger"])
        .iter()
        .map(|l| l["sequences"].as_array().expect("sequences").len())
        .sum();
    assert!((8..20).contains(&slots), "{slots} slots");
    let workers = 20u64;
    for rank in [0, slots as u64 - 1, slots as u64, workers - 1] {
        let s = open(&d, "even", &worker(1, workers, rank));
        let warned = s.warnings.iter().any(|w| w.contains(&format!("worker {rank} of {workers} gets no data")));
        let got = read(s, &["features", "labels"]);
        let empty = got.slots.iter().all(|slot| slot.sources.is_empty());
        assert_eq!(warned, rank >= slots as u64, "rank {rank}");
        assert_eq!(empty, rank >= slots as u64, "rank {rank}: warned exactly when it gets nothing");
    }
}

/// Found by a probe: a reload that removed a configured mixture went on serving its open
/// sessions (2.4 M minibatches of a mixture no longer configured), where a session on a removed
/// dataset ends. It ends now with `unknown_dataset` after what was announced, resumable by name
/// exactly once the mixture is back.
#[test]
fn a_reload_that_removes_a_configured_mixture_ends_its_sessions_resumable_by_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = start(dir.path());
    let config = dir.path().join("minibatchd.toml");
    let original = std::fs::read_to_string(&config).expect("config");
    let reload = |text: &str| {
        let before = d.reloads();
        std::fs::write(&config, text).expect("write config");
        d.signal(rustix::process::Signal::HUP);
        d.wait_reloads(before + 1);
    };
    let o = SessionOptions { session: Some("evenly".into()), prefetch: Some(2), ..options(1) };
    let mut s = open(&d, "even", &o);
    let mut taken = 0;
    for _ in 0..3 {
        let mb = s.next_owned().expect("next").expect("a minibatch");
        drop(mb);
        taken += 1;
    }
    let table = "[mixtures.even]\ndatasets = [\"a\", \"b\"]\nweights = [1, 1]\nepoch = \"first_sweep_end\"\n";
    assert!(original.contains(table), "the test removes the mixture's table");
    reload(&original.replace(table, ""));
    let ended = loop {
        match s.next_owned() {
            Ok(Some(_)) => taken += 1,
            Ok(None) => panic!("the epoch ended before the session did"),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(&ended, ClientError::Daemon { code: ErrorCode::UnknownDataset, message, .. } if message.contains("mixture 'even'")),
        "{ended}"
    );
    assert!(taken <= 3 + 2, "no more than the ring announced after the reload: {taken}");
    drop(s);
    reload(&original);
    let again = open(&d, "even", &o);
    let resumed = again.resumed.clone().expect("resumed by name");
    assert!(resumed.exact, "{resumed:?}");
    let got = read(again, &["features", "labels"]);
    let want = dump(&d, &["--mixture", "even", "--minibatch-size", "1"]);
    same_as_dump(&got, &want[taken..], "even resumed by name after the reload");
}

/// An `open` of a later epoch whose client goes away gives up its walk to that epoch and is
/// counted as given up (`client_gone`). Found by a probe: the walk looked at its client every
/// 1,024 minibatches only, so minibatches of a million slots walked on for half a minute after
/// the client had gone, then opened the session; and a walk it did give up was counted as
/// `invalid_options`. Here 900 epochs of one 60,000-slot minibatch each: fewer minibatches than
/// the old check's period, seconds of walking in a test build.
#[test]
fn a_walk_to_a_later_epoch_whose_client_went_away_is_given_up_and_counted_so() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    let d = pq_daemon(root, "weights = [1, 1]\nepoch = \"first_sweep_end\"");
    // Both sources indexed: a fresh session opens.
    read(open(&d, "pq", &options(1000)), &["features"]);
    let frame = |body: &[u8]| {
        let mut v = u32::try_from(body.len()).expect("small").to_le_bytes().to_vec();
        v.extend_from_slice(body);
        v
    };
    let mut s = std::os::unix::net::UnixStream::connect(&d.socket).expect("connect");
    s.write_all(&frame(br#"{"type":"hello","version":1}"#)).expect("hello");
    s.write_all(&frame(br#"{"type":"open","dataset":"pq","options":{"minibatch_size":1000000,"sweep":900}}"#))
        .expect("open");
    std::thread::sleep(std::time::Duration::from_millis(300));
    drop(s);
    let gone = r#"minibatchd_sessions_refused_total{code="client_gone"}"#;
    let started = std::time::Instant::now();
    while d.metric(gone) < 0.5 {
        assert!(started.elapsed() < support::daemon::DEADLINE, "the walk was not given up");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(d.metric(r#"minibatchd_sessions_refused_total{code="invalid_options"}"#) < 0.5);
    assert!(d.metric(r#"minibatchd_sessions_opened_total{dataset="pq"}"#) < 1.5, "the walk's session was not opened");
}
